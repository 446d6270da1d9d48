//! Values on one GPU.

use super::device::CudaDev;
use super::ops;
use crate::backend::op::{
    channel_shape, row_split, scan_shape, AdamStep, AttnGrads, AttnOperands, AttnSaved, AttnShape,
    BinaryOp, BnGradIn, BnParams, BnRunning, CmpOp, ConvShape, NormAffine, NormSaved, Pool,
    PoolShape, ReduceOp, RowNorm, Scalar, ScanOp, SgdStep, UnaryOp,
};
use crate::backend::primitives::{BackendStorage, ConvGrads, Dist};
use crate::dtype::CpuData;
use crate::layout::Layout;
use crate::{
    device::Device,
    dtype::DType,
    error::{Error, Result},
};
use std::sync::Arc;

/// Values on one GPU: a block from the caching allocator holding `len` elements of
/// `dtype`, returned to the allocator when dropped.
pub(crate) struct CudaStorage {
    ptr: u64,
    len: usize,
    dtype: DType,
    dev: Arc<CudaDev>,
}

impl std::fmt::Debug for CudaStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CudaStorage(cuda:{}, {} x {})",
            self.dev.ordinal, self.len, self.dtype
        )
    }
}

impl Drop for CudaStorage {
    fn drop(&mut self) {
        self.dev.free(self.ptr);
    }
}

impl CudaStorage {
    /// Uninitialised storage for `len` elements.
    pub fn alloc(dev: &Arc<CudaDev>, dtype: DType, len: usize) -> Result<CudaStorage> {
        let bytes = len
            .checked_mul(dtype.size_in_bytes())
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| Error::OutOfMemory {
                device: dev.device(),
                requested: len.saturating_mul(dtype.size_in_bytes()),
                msg: "more than an address can count".into(),
            })?;
        let ptr = dev.malloc(bytes)?;
        Ok(CudaStorage {
            ptr,
            len,
            dtype,
            dev: dev.clone(),
        })
    }

    /// A copy of host data.
    pub fn from_cpu(dev: &Arc<CudaDev>, data: &CpuData) -> Result<CudaStorage> {
        CudaStorage::from_cpu_range(dev, data, 0..data.len())
    }

    /// A copy of the elements `range` of host data.
    pub fn from_cpu_range(
        dev: &Arc<CudaDev>,
        data: &CpuData,
        range: std::ops::Range<usize>,
    ) -> Result<CudaStorage> {
        let s = CudaStorage::alloc(dev, data.dtype(), range.len())?;
        crate::dtype::dispatch!(data, v => dev.htod(s.ptr, &v[range]))?;
        Ok(s)
    }

    /// The whole storage copied to the host (waits for queued work).
    pub fn to_cpu(&self) -> Result<CpuData> {
        self.to_cpu_range(0, self.len)
    }

    /// `n` elements from `offset` copied to the host (waits for queued work).
    pub fn to_cpu_range(&self, offset: usize, n: usize) -> Result<CpuData> {
        fn go<T: crate::dtype::WithDType>(
            s: &CudaStorage,
            offset: usize,
            n: usize,
        ) -> Result<CpuData> {
            let mut v = crate::backend::host::alloc_uninit::<T>(n)?;
            let at = s.ptr + (offset * std::mem::size_of::<T>()) as u64;
            s.dev.dtoh(&mut v, at)?;
            Ok(T::wrap(v))
        }
        debug_assert!(offset + n <= self.len);
        match self.dtype {
            // as bytes, then to bools: a byte other than 0 or 1 (a user kernel's, or
            // memory never written) is `true`, never an invalid `bool`
            DType::Bool => match go::<u8>(self, offset, n)? {
                CpuData::U8(v) => {
                    let b = crate::backend::host::try_collect(n, v.iter().map(|&x| x != 0));
                    crate::backend::host::recycle(v);
                    Ok(CpuData::Bool(b?))
                }
                _ => unreachable!("downloaded as u8"),
            },
            DType::U8 => go::<u8>(self, offset, n),
            DType::I64 => go::<i64>(self, offset, n),
            DType::F16 => go::<half::f16>(self, offset, n),
            DType::BF16 => go::<half::bf16>(self, offset, n),
            DType::F32 => go::<f32>(self, offset, n),
            DType::F64 => go::<f64>(self, offset, n),
        }
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    pub fn dev(&self) -> &Arc<CudaDev> {
        &self.dev
    }
}

/// One parameter of [`CudaStorage::adam_foreach`]: parameter, gradient and
/// moments with the element each starts at, and their length.
pub(crate) type AdamOnGpu<'a> = (
    (&'a CudaStorage, usize),
    (&'a CudaStorage, usize),
    (&'a CudaStorage, usize),
    (&'a CudaStorage, usize),
    usize,
);

/// One parameter of [`CudaStorage::sgd_foreach`]: parameter and gradient with the
/// element each starts at, the momentum buffer (with its first element and
/// whether this is its first step), and their length.
pub(crate) type SgdOnGpu<'a> = (
    (&'a CudaStorage, usize),
    (&'a CudaStorage, usize),
    Option<(&'a CudaStorage, usize, bool)>,
    usize,
);

impl CudaStorage {
    /// Whether [`adam_foreach`](Self::adam_foreach) runs `list`: every operand on
    /// one GPU in one float dtype (f32/f64), and `step` (the capturable form's
    /// count) a float64 on that GPU.
    pub(crate) fn adam_foreach_fits(list: &[AdamOnGpu<'_>], step: Option<&CudaStorage>) -> bool {
        let Some(((first, _), ..)) = list.first() else {
            return true;
        };
        let (dev, dt) = (first.dev(), first.dtype());
        let same = |s: &CudaStorage| Arc::ptr_eq(s.dev(), dev) && s.dtype() == dt;
        matches!(dt, DType::F32 | DType::F64)
            && step.is_none_or(|s| Arc::ptr_eq(s.dev(), dev) && s.dtype() == DType::F64)
            && list
                .iter()
                .all(|(p, g, m, v, _)| [p.0, g.0, m.0, v.0].into_iter().all(same))
    }

    /// One Adam step over `list` in multi-tensor launches, where
    /// [`adam_foreach_fits`](Self::adam_foreach_fits) (`Ok(false)`, nothing done,
    /// elsewhere); with `step` (the capturable form's count, at offset 0 of its
    /// storage) the bias corrections are the kernel's, from it, not `h`'s.
    pub(crate) fn adam_foreach(
        list: &[AdamOnGpu<'_>],
        h: &AdamStep,
        step: Option<&CudaStorage>,
    ) -> Result<bool> {
        let Some(((first, _), ..)) = list.first() else {
            return Ok(true);
        };
        if !Self::adam_foreach_fits(list, step) {
            return Ok(false);
        }
        let (dev, dt) = (first.dev(), first.dtype());
        let sz = dt.size_in_bytes() as u64;
        let at = |(s, off): (&CudaStorage, usize)| s.ptr() + off as u64 * sz;
        let tensors: Vec<ops::ListTensor> = list
            .iter()
            .map(|&(p, g, m, v, n)| ops::ListTensor {
                arrays: [at(p), at(g), at(m), at(v)],
                n,
                flag: false,
            })
            .collect();
        ops::adam_multi(dev, dt, &tensors, h, step)?;
        Ok(true)
    }

    /// One SGD step over `list` in multi-tensor launches, when every operand is on
    /// one GPU in one float dtype (f32/f64); `Ok(false)` (nothing done) otherwise.
    pub(crate) fn sgd_foreach(list: &[SgdOnGpu<'_>], h: &SgdStep) -> Result<bool> {
        let Some(((first, _), ..)) = list.first() else {
            return Ok(true);
        };
        let (dev, dt) = (first.dev(), first.dtype());
        let same = |s: &CudaStorage| Arc::ptr_eq(s.dev(), dev) && s.dtype() == dt;
        let ok = list
            .iter()
            .all(|(p, g, buf, _)| same(p.0) && same(g.0) && buf.is_none_or(|(b, _, _)| same(b)));
        if !matches!(dt, DType::F32 | DType::F64) || !ok {
            return Ok(false);
        }
        let sz = dt.size_in_bytes() as u64;
        let at = |s: &CudaStorage, off: usize| s.ptr() + off as u64 * sz;
        let tensors: Vec<ops::ListTensor> = list
            .iter()
            .map(|&(p, g, buf, n)| ops::ListTensor {
                arrays: [
                    at(p.0, p.1),
                    at(g.0, g.1),
                    buf.map_or(0, |(b, off, _)| at(b, off)),
                    0,
                ],
                n,
                flag: buf.is_some_and(|(_, _, first)| first),
            })
            .collect();
        ops::sgd_multi(dev, dt, &tensors, h)?;
        Ok(true)
    }

    /// The 2-norm of each of `list` (storage, first element, length), when all are
    /// on one GPU in one float dtype (f32/f64), in [`stat_dtype`]; `None`
    /// otherwise.
    pub(crate) fn foreach_norms(
        list: &[(&CudaStorage, usize, usize)],
    ) -> Result<Option<CudaStorage>> {
        let Some((dev, dt, tensors)) = foreach_addresses(list) else {
            return Ok(None);
        };
        ops::foreach_norms(dev, dt, &tensors).map(Some)
    }

    /// Multiplies each of `list` in place by `min(1, max_norm / (total + 1e-6))`
    /// (`total`: one element in [`stat_dtype`] on the device); `Ok(false)`
    /// (nothing done) unless all are on one GPU in one float dtype (f32/f64).
    pub(crate) fn foreach_clip_scale(
        list: &[(&CudaStorage, usize, usize)],
        total: (&CudaStorage, usize),
        max_norm: f64,
    ) -> Result<bool> {
        let Some((dev, dt, tensors)) = foreach_addresses(list) else {
            return Ok(false);
        };
        ops::foreach_clip_scale(dev, dt, &tensors, total, max_norm)?;
        Ok(true)
    }

    /// Whether f16/bf16 convolutions of `s` run in this storage's dtype (through
    /// cuDNN) rather than in float32.
    pub(crate) fn conv_takes_half(&self, s: &ConvShape) -> bool {
        ops::conv_takes_half(self.dtype(), s)
    }

    pub(crate) fn conv_takes_channels_last(&self, s: &ConvShape) -> bool {
        ops::conv_takes_channels_last(self.dtype(), s)
    }

    /// `n` copies of `value` converted to `dtype` as a cast converts it.
    pub fn full(dev: &Arc<CudaDev>, dtype: DType, n: usize, value: Scalar) -> Result<CudaStorage> {
        ops::fill(dev, dtype, n, value)
    }

    /// `first + step · i` for `i` in `0..n` (int64, wrapping).
    pub fn iota(dev: &Arc<CudaDev>, n: usize, first: i64, step: i64) -> Result<CudaStorage> {
        ops::iota(dev, n, first, step)
    }

    /// `linspace`'s `n` values in float64: the first `half` are
    /// `fma(step, i, start)`, the others `fma(-step, n - 1 - i, end)`.
    pub fn linspace(
        dev: &Arc<CudaDev>,
        n: usize,
        line: (f64, f64, f64),
        half: usize,
    ) -> Result<CudaStorage> {
        ops::linspace(dev, n, line, half)
    }

    /// `n` draws of `dist` from the GPUs' Philox stream.
    pub fn random(dev: &Arc<CudaDev>, dtype: DType, n: usize, dist: Dist) -> Result<CudaStorage> {
        match dist {
            Dist::Uniform(lo, hi) => ops::random(dev, dtype, n, false, lo, hi),
            Dist::Normal(mean, std) => ops::random(dev, dtype, n, true, mean, std),
            Dist::Integers(low, high) => {
                ops::randint(dev, n, low, (high as u64).wrapping_sub(low as u64))
            }
        }
    }

    fn pool_geometry(s: &PoolShape, kind: Pool) -> (ops::KConv, Option<bool>) {
        let kc = match s.nhwc {
            Some(c) => ops::KConv {
                nhwc: 1,
                ..ops::KConv::new((s.planes / c.max(1), c), (s.h, s.w), (s.oh, s.ow), &s.win)
            },
            None => ops::KConv::new((s.planes, 1), (s.h, s.w), (s.oh, s.ow), &s.win),
        };
        let avg = match kind {
            Pool::Max => None,
            Pool::Avg { count_include_pad } => Some(count_include_pad),
        };
        (kc, avg)
    }
}

impl BackendStorage for CudaStorage {
    fn dtype(&self) -> DType {
        self.dtype
    }

    fn device(&self) -> Device {
        self.dev.device()
    }

    fn to_dtype(&self, l: &Layout, dtype: DType) -> Result<Self> {
        ops::cast(self, l, dtype)
    }

    fn copy(&self, l: &Layout) -> Result<Self> {
        ops::contiguous(self, l)
    }

    fn copy_into(&self, l: &Layout, dst: &mut Self, ld: &Layout) -> Result<()> {
        ops::copy(self, l, dst, ld)
    }

    fn to_host(&self, l: &Layout, _op: &'static str) -> Result<CpuData> {
        // reading values waits for the GPU; a contiguous range comes back as is
        match l.contiguous_range() {
            Some(r) => self.to_cpu_range(r.start, r.len()),
            None => ops::contiguous(self, l)?.to_cpu(),
        }
    }

    fn unary<O: UnaryOp>(&self, l: &Layout, op: &O) -> Result<Self> {
        let (code, p0, p1) = op.code();
        ops::unary(self, l, code, p0, p1)
    }

    fn unary_inplace<O: UnaryOp>(&mut self, l: &Layout, op: &O) -> Result<()> {
        let (code, p0, p1) = op.code();
        ops::unary_inplace(self, l, code, p0, p1)
    }

    fn binary<O: BinaryOp>(&self, l: &Layout, rhs: &Self, lr: &Layout, _op: &O) -> Result<Self> {
        ops::binary(self, l, rhs, lr, O::CODE)
    }

    fn binary_scalar<O: BinaryOp>(&self, l: &Layout, s: Scalar, _op: &O) -> Result<Self> {
        ops::binary_scalar(self, l, O::CODE, s.by_value())
    }

    fn binary_inplace<O: BinaryOp>(
        &mut self,
        l: &Layout,
        rhs: &Self,
        lr: &Layout,
        _op: &O,
    ) -> Result<()> {
        ops::binary_inplace(self, l, rhs, lr, O::CODE)
    }

    fn binary_scalar_inplace<O: BinaryOp>(&mut self, l: &Layout, s: Scalar, _op: &O) -> Result<()> {
        ops::binary_scalar_inplace(self, l, O::CODE, s.by_value())
    }

    fn compare(&self, l: &Layout, rhs: &Self, lr: &Layout, op: CmpOp) -> Result<Self> {
        ops::compare(self, l, rhs, lr, op as i32)
    }

    fn compare_scalar(&self, l: &Layout, s: Scalar, op: CmpOp) -> Result<Self> {
        ops::compare_scalar(self, l, op as i32, s.by_value())
    }

    fn where_(&self, l: &Layout, a: &Self, la: &Layout, b: &Self, lb: &Layout) -> Result<Self> {
        ops::where_(self, l, a, la, b, lb)
    }

    fn reduce(&self, l: &Layout, dims: &[usize], op: ReduceOp) -> Result<Self> {
        let (code, correction) = op.code();
        ops::reduce(self, l, dims, code, correction, op.out_dtype(self.dtype))
    }

    fn argsort(&self, l: &Layout, dim: usize, descending: bool) -> Result<Self> {
        ops::argsort(self, l.offset(), scan_shape(l.shape(), dim), descending)
    }

    fn searchsorted(
        &self,
        ls: &Layout,
        values: &Self,
        lv: &Layout,
        m_per: (usize, usize),
        right: bool,
    ) -> Result<Self> {
        ops::searchsorted(self, ls, values, lv, m_per, right)
    }

    fn cumulative(&self, l: &Layout, dim: usize, op: ScanOp) -> Result<Self> {
        let (outer, n, inner) = scan_shape(l.shape(), dim);
        ops::cumulative(self, l.offset(), (outer, n, inner), op)
    }

    fn softmax(&self, l: &Layout, log: bool) -> Result<Self> {
        let (rows, row) = row_split(l);
        ops::softmax_rows(self, l.offset(), rows, row, log)
    }

    fn softmax_backward(&self, l: &Layout, y: &Self, ly: &Layout, log: bool) -> Result<Self> {
        let (rows, row) = row_split(l);
        ops::softmax_backward_rows(self, l.offset(), (y, ly.offset()), rows, row, log)
    }

    fn norm_rows(&self, l: &Layout, n: RowNorm, a: NormAffine<'_, Self>) -> Result<(Self, Self)> {
        let (rows, row) = row_split(l);
        let w = a.weight.map(|(w, l)| (w, l.offset()));
        let b = a.bias.map(|(b, l)| (b, l.offset()));
        ops::norm_rows((self, l.offset()), (w, b), rows, row, (n.eps, n.rms))
    }

    fn attention(x: AttnOperands<'_, Self>, shape: AttnShape) -> Result<(Self, Self)> {
        ops::attention(x, shape)
    }

    fn attention_backward(
        x: AttnOperands<'_, Self>,
        saved: AttnSaved<'_, Self>,
        shape: AttnShape,
    ) -> Result<AttnGrads<Self>> {
        ops::attention_backward(x, saved, shape)
    }

    fn cross_entropy_rows(
        &self,
        l: &Layout,
        (t, lt): (&Self, &Layout),
        opts: crate::backend::op::CeOpts,
    ) -> Result<(Self, Self)> {
        let (rows, row) = row_counts(l);
        ops::cross_entropy_rows((self, l.offset()), (t, lt.offset()), (rows, row), opts)
    }

    fn cross_entropy_rows_backward(
        &self,
        l: &Layout,
        (t, lt): (&Self, &Layout),
        (lse, ls): (&Self, &Layout),
        (g, lg): (&Self, &Layout),
        opts: crate::backend::op::CeOpts,
    ) -> Result<Self> {
        let (rows, row) = row_counts(l);
        ops::cross_entropy_rows_backward(
            (self, l.offset()),
            (t, lt.offset()),
            (lse, ls.offset()),
            (g, lg.offset()),
            (rows, row),
            opts,
        )
    }

    fn norm_rows_backward(
        &self,
        l: &Layout,
        saved: NormSaved<'_, Self>,
        rms: bool,
    ) -> Result<Self> {
        ops::norm_rows_backward((self, l), saved, rms)
    }

    fn norm_affine_backward(&self, l: &Layout, saved: NormSaved<'_, Self>) -> Result<(Self, Self)> {
        ops::norm_affine_backward((self, l), saved)
    }

    fn channel_stats(&self, l: &Layout) -> Result<Self> {
        ops::channel_stats(self, l.offset(), channel_shape(l.shape()))
    }

    fn channel_dot(
        &self,
        l: &Layout,
        x: (&Self, &Layout),
        mean: (&Self, &Layout),
        mask: Option<(&Self, &Layout)>,
    ) -> Result<Self> {
        ops::channel_dot(
            ((self, l.offset()), mask.map(|(y, ly)| (y, ly.offset()))),
            (x.0, x.1.offset()),
            (mean.0, mean.1.offset()),
            channel_shape(l.shape()),
        )
    }

    fn channel_affine(
        &self,
        l: &Layout,
        q: Option<(&Self, &Layout)>,
        coefs: (&Self, &Layout),
        (relu, mask): (bool, Option<(&Self, &Layout)>),
    ) -> Result<Self> {
        ops::channel_affine(
            ((self, l.offset()), mask.map(|(y, ly)| (y, ly.offset()))),
            q.map(|(q, lq)| (q, lq.offset())),
            (coefs.0, coefs.1.offset()),
            (coefs.1.numel() / channel_shape(l.shape()).1.max(1), relu),
            channel_shape(l.shape()),
        )
    }

    fn batch_norm_coefs(
        p: BnParams<'_, Self>,
        running: BnRunning<'_, Self>,
        eps: f64,
    ) -> Result<Self> {
        ops::batch_norm_coefs(p, running, eps)
    }

    fn batch_norm_grad_coefs(
        p: BnGradIn<'_, Self>,
        weight_grad: bool,
    ) -> Result<(Self, Option<Self>)> {
        ops::batch_norm_grad_coefs(p, weight_grad)
    }

    fn matmul(
        &self,
        l: &Layout,
        rhs: &Self,
        lr: &Layout,
        (m, k, n): (usize, usize, usize),
        bias: Option<(&Self, &Layout)>,
    ) -> Result<Self> {
        ops::matmul(self, l, rhs, lr, (m, k, n), bias)?
            .ok_or_else(|| Error::dtype("matmul", self.dtype, "no product of bools"))
    }

    fn conv2d(
        &self,
        l: &Layout,
        w: (&Self, &Layout),
        b: Option<(&Self, &Layout)>,
        s: &ConvShape,
    ) -> Result<Self> {
        ops::conv2d((self, l), w, b, s)
    }

    fn conv2d_backward(
        &self,
        l: &Layout,
        w: (&Self, &Layout),
        gy: (&Self, &Layout),
        s: &ConvShape,
        need: (bool, bool),
    ) -> Result<ConvGrads<Self>> {
        ops::conv2d_backward((self, l), w, gy, s, need)
    }

    fn pool2d(
        &self,
        l: &Layout,
        s: &PoolShape,
        kind: Pool,
        want_index: bool,
    ) -> Result<(Self, Option<Self>)> {
        let (kc, avg) = CudaStorage::pool_geometry(s, kind);
        let index = want_index.then(|| s.index_dtype());
        ops::pool2d(self, l.offset(), &kc, avg, index)
    }

    fn pool2d_backward(
        &self,
        l: &Layout,
        index: Option<&Self>,
        s: &PoolShape,
        kind: Pool,
    ) -> Result<Self> {
        let (kc, avg) = CudaStorage::pool_geometry(s, kind);
        ops::pool2d_backward(self, l.offset(), index, &kc, avg)
    }

    fn indices(
        &self,
        l: &Layout,
        op: &'static str,
        dim: usize,
        size: usize,
        negative: bool,
    ) -> Result<Self> {
        if self.dtype != DType::I64 {
            return Err(Error::dtype(
                op,
                self.dtype,
                "indices must be an int64 tensor",
            ));
        }
        ops::check_indices(self, l, op, dim, size, negative)
    }

    fn index_select(&self, l: &Layout, dim: usize, idx: &Self, n: usize) -> Result<Self> {
        ops::index_select(self, l, dim, idx, n)
    }

    fn gather(&self, l: &Layout, dim: usize, idx: &Self, ishape: &[usize]) -> Result<Self> {
        ops::gather(self, l, dim, idx, ishape)
    }

    fn index_add(
        &mut self,
        shape: &[usize],
        dim: usize,
        idx: &Self,
        (src, ls): (&Self, &Layout),
    ) -> Result<()> {
        ops::index_add(self, shape, dim, idx, src, ls)
    }

    fn scatter_add(
        &mut self,
        shape: &[usize],
        dim: usize,
        idx: &Self,
        ishape: &[usize],
        (src, ls): (&Self, &Layout),
    ) -> Result<()> {
        ops::scatter_add(self, shape, dim, idx, ishape, src, ls)
    }

    fn adam(
        (p, po): (&mut Self, usize),
        g: (&Self, usize),
        (m, mo): (&mut Self, usize),
        (v, vo): (&mut Self, usize),
        n: usize,
        h: &AdamStep,
    ) -> Result<()> {
        ops::adam((&*p, po), g, (&*m, mo), (&*v, vo), n, h)
    }
}

/// The rows (every dim but the last, so that rows of no classes still count) and
/// the row length of `l`.
fn row_counts(l: &Layout) -> (usize, usize) {
    let (rows, row) = l.shape().split_at(l.rank().saturating_sub(1));
    (rows.iter().product(), row.first().copied().unwrap_or(1))
}

/// A device, a dtype, and the (address, length) of tensors there.
type Addresses<'a> = (&'a Arc<CudaDev>, DType, Vec<(u64, usize)>);

/// The device, dtype and (address, length) of each of `list`, when all share one
/// GPU and one dtype, f32 or f64.
fn foreach_addresses<'a>(list: &[(&'a CudaStorage, usize, usize)]) -> Option<Addresses<'a>> {
    let (first, ..) = list.first()?;
    let (dev, dt) = (first.dev(), first.dtype());
    let same = list
        .iter()
        .all(|(s, ..)| Arc::ptr_eq(s.dev(), dev) && s.dtype() == dt);
    if !same || !matches!(dt, DType::F32 | DType::F64) {
        return None;
    }
    let sz = dt.size_in_bytes() as u64;
    Some((
        dev,
        dt,
        list.iter()
            .map(|&(s, off, n)| (s.ptr() + off as u64 * sz, n))
            .collect(),
    ))
}
