//! CPU storage: a [`CpuData`] buffer, and the CPU's answer to every primitive.

use super::{attention, channel, conv, elementwise as ew, index, matmul, optim, random, reduce};
use crate::backend::host::{alloc_filled, alloc_uninit, recycle_data, try_collect};
use crate::backend::op::{
    channel_shape, scan_shape, stat_dtype, wrap_indices, AdamStep, AttnGrads, AttnOperands,
    AttnSaved, AttnShape, BinaryOp, BnGradIn, BnParams, BnRunning, CmpOp, ConvShape, NormAffine,
    NormSaved, Pool, PoolShape, ReduceOp, RowNorm, Scalar, ScanOp, UnaryOp,
};
use crate::backend::primitives::{BackendStorage, ConvGrads, Dist};
use crate::dtype::{CpuData, CpuElem, Real};
use crate::layout::Layout;
use crate::{
    device::Device,
    dtype::{DType, WithDType},
    error::{Error, Result},
};

/// Runs `$body` with `$t` the Rust type of the dtype `$dt`.
macro_rules! with_dtype {
    ($dt:expr, $t:ident => $body:expr) => {
        match $dt {
            DType::Bool => {
                type $t = bool;
                $body
            }
            DType::U8 => {
                type $t = u8;
                $body
            }
            DType::I64 => {
                type $t = i64;
                $body
            }
            DType::F16 => {
                type $t = half::f16;
                $body
            }
            DType::BF16 => {
                type $t = half::bf16;
                $body
            }
            DType::F32 => {
                type $t = f32;
                $body
            }
            DType::F64 => {
                type $t = f64;
                $body
            }
        }
    };
}

/// Runs `$body` with `$t` as f32 or f64 for the work dtype of convolutions and
/// pooling; other dtypes are an error (the tensor layer converts first).
macro_rules! with_float {
    ($op:expr, $dt:expr, $t:ident => $body:expr) => {
        match $dt {
            DType::F32 => {
                type $t = f32;
                $body
            }
            DType::F64 => {
                type $t = f64;
                $body
            }
            dt => Err(Error::dtype($op, dt, "computed in float32 or float64")),
        }
    };
}

/// The elements of the contiguous view `l`.
fn range_of(l: &Layout) -> std::ops::Range<usize> {
    l.offset()..l.offset() + l.numel()
}

/// A cross-entropy's class indices: the int64 values of `t`'s contiguous view `l`.
fn class_targets<'a>(t: &'a CpuStorage, l: &Layout) -> Result<&'a [i64]> {
    match &t.data {
        CpuData::I64(v) => Ok(&v[range_of(l)]),
        _ => Err(Error::dtype(
            "cross_entropy",
            t.dtype(),
            "targets must be int64",
        )),
    }
}

/// Host storage: a [`CpuData`] that returns its buffer to the pool when dropped.
#[derive(Debug)]
pub(crate) struct CpuStorage {
    data: CpuData,
}

impl Drop for CpuStorage {
    fn drop(&mut self) {
        if crate::backend::profile::active() {
            crate::backend::profile::memory(self.data.bytes(), false);
        }
        recycle_data(std::mem::replace(&mut self.data, CpuData::U8(Vec::new())));
    }
}

impl CpuStorage {
    pub fn new(data: CpuData) -> Self {
        if crate::backend::profile::active() {
            crate::backend::profile::memory(data.bytes(), true);
        }
        CpuStorage { data }
    }

    pub fn data(&self) -> &CpuData {
        &self.data
    }

    /// The values, to change in place.
    pub fn data_mut(&mut self) -> &mut CpuData {
        &mut self.data
    }

    /// `n` copies of `value` converted to `dtype`.
    pub fn full(dtype: DType, n: usize, value: Scalar) -> Result<Self> {
        fn go<T: WithDType>(n: usize, value: Scalar) -> Result<CpuData> {
            alloc_filled(n, value.to::<T>()).map(T::wrap)
        }
        Ok(CpuStorage::new(with_dtype!(dtype, T => go::<T>(n, value))?))
    }

    /// `first + step · i` for `i` in `0..n`, int64, wrapping around on overflow.
    pub fn iota(n: usize, first: i64, step: i64) -> Result<Self> {
        let v = (0..n as i64).map(|i| first.wrapping_add(step.wrapping_mul(i)));
        Ok(CpuStorage::new(CpuData::I64(try_collect(n, v)?)))
    }

    /// `linspace`'s `n` values in float64: the first `half` are
    /// `fma(step, i, start)`, the others `fma(-step, n - 1 - i, end)`.
    pub fn linspace(n: usize, (start, end, step): (f64, f64, f64), half: usize) -> Result<Self> {
        let v = (0..n).map(|i| {
            if i < half {
                step.mul_add(i as f64, start)
            } else {
                (-step).mul_add((n - 1 - i) as f64, end)
            }
        });
        Ok(CpuStorage::new(CpuData::F64(try_collect(n, v)?)))
    }

    /// `n` elements whose values are unspecified.
    pub fn empty(dtype: DType, n: usize) -> Result<Self> {
        fn go<T: WithDType>(n: usize) -> Result<CpuData> {
            alloc_uninit::<T>(n).map(T::wrap)
        }
        Ok(CpuStorage::new(with_dtype!(dtype, T => go::<T>(n))?))
    }

    /// `n` draws of `dist` from the CPU's generator.
    pub fn random(dtype: DType, n: usize, dist: Dist) -> Result<Self> {
        random::draw(dtype, n, dist).map(CpuStorage::new)
    }

    /// The `T` elements of this storage from `l`'s offset on (a float dtype the
    /// tensor layer chose).
    fn floats<T: WithDType>(&self, l: &Layout) -> &[T] {
        &T::slice(&self.data).expect("operands converted to the work dtype")[l.offset()..]
    }
}

impl BackendStorage for CpuStorage {
    fn dtype(&self) -> DType {
        self.data.dtype()
    }

    fn device(&self) -> Device {
        Device::Cpu
    }

    fn to_dtype(&self, l: &Layout, dtype: DType) -> Result<Self> {
        ew::cast(&self.data, l, dtype).map(CpuStorage::new)
    }

    fn copy(&self, l: &Layout) -> Result<Self> {
        ew::contiguous_copy(&self.data, l).map(CpuStorage::new)
    }

    fn copy_into(&self, l: &Layout, dst: &mut Self, ld: &Layout) -> Result<()> {
        ew::copy_strided(&mut dst.data, ld, &self.data, l);
        Ok(())
    }

    fn to_host(&self, l: &Layout, _op: &'static str) -> Result<CpuData> {
        ew::contiguous_copy(&self.data, l)
    }

    fn unary<O: UnaryOp>(&self, l: &Layout, op: &O) -> Result<Self> {
        ew::unary(&self.data, l, op).map(CpuStorage::new)
    }

    fn unary_inplace<O: UnaryOp>(&mut self, l: &Layout, op: &O) -> Result<()> {
        ew::unary_inplace(&mut self.data, l, op);
        Ok(())
    }

    fn binary<O: BinaryOp>(&self, l: &Layout, rhs: &Self, lr: &Layout, op: &O) -> Result<Self> {
        ew::binary(&self.data, l, &rhs.data, lr, op).map(CpuStorage::new)
    }

    fn binary_scalar<O: BinaryOp>(&self, l: &Layout, s: Scalar, op: &O) -> Result<Self> {
        ew::binary_scalar(&self.data, l, s, op).map(CpuStorage::new)
    }

    fn binary_inplace<O: BinaryOp>(
        &mut self,
        l: &Layout,
        rhs: &Self,
        lr: &Layout,
        op: &O,
    ) -> Result<()> {
        ew::binary_inplace(&mut self.data, l, &rhs.data, lr, op);
        Ok(())
    }

    fn binary_scalar_inplace<O: BinaryOp>(&mut self, l: &Layout, s: Scalar, op: &O) -> Result<()> {
        ew::binary_scalar_inplace(&mut self.data, l, s, op);
        Ok(())
    }

    fn compare(&self, l: &Layout, rhs: &Self, lr: &Layout, op: CmpOp) -> Result<Self> {
        ew::compare(&self.data, l, &rhs.data, lr, op).map(CpuStorage::new)
    }

    fn compare_scalar(&self, l: &Layout, s: Scalar, op: CmpOp) -> Result<Self> {
        ew::compare_scalar(&self.data, l, s, op).map(CpuStorage::new)
    }

    fn where_(&self, l: &Layout, a: &Self, la: &Layout, b: &Self, lb: &Layout) -> Result<Self> {
        let cond = bool::slice(&self.data).expect("the condition is a bool tensor");
        ew::where_(cond, l, &a.data, la, &b.data, lb).map(CpuStorage::new)
    }

    fn reduce(&self, l: &Layout, dims: &[usize], op: ReduceOp) -> Result<Self> {
        reduce::reduce(&self.data, l, dims, op).map(CpuStorage::new)
    }

    fn argsort(&self, l: &Layout, dim: usize, descending: bool) -> Result<Self> {
        let range = l.offset()..l.offset() + l.numel();
        reduce::argsort(&self.data, range, scan_shape(l.shape(), dim), descending)
            .map(CpuStorage::new)
    }

    fn searchsorted(
        &self,
        ls: &Layout,
        values: &Self,
        lv: &Layout,
        m_per: (usize, usize),
        right: bool,
    ) -> Result<Self> {
        let seq = ls.offset()..ls.offset() + ls.numel();
        let vals = lv.offset()..lv.offset() + lv.numel();
        reduce::searchsorted(&self.data, seq, &values.data, vals, m_per, right).map(CpuStorage::new)
    }

    fn cumulative(&self, l: &Layout, dim: usize, op: ScanOp) -> Result<Self> {
        let range = l.offset()..l.offset() + l.numel();
        reduce::cumulative(&self.data, range, scan_shape(l.shape(), dim), op).map(CpuStorage::new)
    }

    fn softmax(&self, l: &Layout, log: bool) -> Result<Self> {
        let row = l.shape().last().copied().unwrap_or(1);
        let range = l.offset()..l.offset() + l.numel();
        reduce::softmax_rows(&self.data, range, row, log)
            .ok_or_else(|| Error::dtype("softmax", self.dtype(), "needs a floating-point tensor"))?
            .map(CpuStorage::new)
    }

    fn softmax_backward(&self, l: &Layout, y: &Self, ly: &Layout, log: bool) -> Result<Self> {
        let row = l.shape().last().copied().unwrap_or(1);
        reduce::softmax_backward_rows(
            (&self.data, l.offset()..l.offset() + l.numel()),
            (&y.data, ly.offset()..ly.offset() + ly.numel()),
            row,
            log,
        )
        .ok_or_else(|| {
            Error::dtype(
                "softmax",
                self.dtype(),
                "the gradient and the output must share one float dtype",
            )
        })?
        .map(CpuStorage::new)
    }

    fn norm_rows(&self, l: &Layout, n: RowNorm, a: NormAffine<'_, Self>) -> Result<(Self, Self)> {
        let row = l.shape().last().copied().unwrap_or(1);
        let a = a.try_map(|s| Ok(&s.data))?;
        let parts = (
            a.weight.map(|(d, l)| (d, range_of(l))),
            a.bias.map(|(d, l)| (d, range_of(l))),
        );
        let (y, stats) = reduce::norm_rows((&self.data, range_of(l)), row, (n.eps, n.rms), parts)
            .ok_or_else(|| {
                Error::dtype(
                    "layer_norm",
                    self.dtype(),
                    "needs a floating-point tensor, and a weight and bias of its dtype",
                )
            })??;
        Ok((CpuStorage::new(y), CpuStorage::new(stats)))
    }

    fn channel_stats(&self, l: &Layout) -> Result<Self> {
        let out = stat_dtype(self.dtype());
        channel::stats((&self.data, range_of(l)), channel_shape(l.shape()), out)
            .map(CpuStorage::new)
    }

    fn channel_dot(
        &self,
        l: &Layout,
        x: (&Self, &Layout),
        mean: (&Self, &Layout),
        mask: Option<(&Self, &Layout)>,
    ) -> Result<Self> {
        channel::dot(
            ((&self.data, range_of(l)), mask.map(data_range)),
            (&x.0.data, range_of(x.1)),
            (&mean.0.data, range_of(mean.1)),
            channel_shape(l.shape()),
            stat_dtype(self.dtype()),
        )
        .map(CpuStorage::new)
    }

    fn channel_affine(
        &self,
        l: &Layout,
        q: Option<(&Self, &Layout)>,
        coefs: (&Self, &Layout),
        (relu, mask): (bool, Option<(&Self, &Layout)>),
    ) -> Result<Self> {
        let (_, c, s) = channel_shape(l.shape());
        channel::affine(
            ((&self.data, range_of(l)), mask.map(data_range)),
            q.map(|(q, lq)| (&q.data, range_of(lq))),
            (&coefs.0.data, range_of(coefs.1)),
            (c, s),
            relu,
        )
        .map(CpuStorage::new)
    }

    fn batch_norm_coefs(
        p: BnParams<'_, Self>,
        running: BnRunning<'_, Self>,
        eps: f64,
    ) -> Result<Self> {
        let at = data_range;
        let dtype = p.mean.0.dtype();
        channel::coefs(
            (at(p.mean), at(p.var)),
            (p.weight.map(at), p.bias.map(at)),
            (
                running.mean.map(|(s, o)| (&mut s.data, o)),
                running.var.map(|(s, o)| (&mut s.data, o)),
            ),
            (eps, running.momentum, running.unbiased),
            dtype,
        )
        .map(CpuStorage::new)
    }

    fn batch_norm_grad_coefs(
        p: BnGradIn<'_, Self>,
        weight_grad: bool,
    ) -> Result<(Self, Option<Self>)> {
        let at = data_range;
        let dtype = p.mean.0.dtype();
        let (coefs, gw) = channel::grad_coefs(
            (at(p.sums), at(p.mean), at(p.invstd)),
            p.weight.map(at),
            (p.count, weight_grad),
            dtype,
        )?;
        Ok((CpuStorage::new(coefs), gw.map(CpuStorage::new)))
    }

    fn attention(x: AttnOperands<'_, Self>, shape: AttnShape) -> Result<(Self, Self)> {
        let (o, l) = attention::attention(x.try_map(|s| Ok(&s.data))?, shape)?;
        Ok((CpuStorage::new(o), CpuStorage::new(l)))
    }

    fn attention_backward(
        x: AttnOperands<'_, Self>,
        saved: AttnSaved<'_, Self>,
        shape: AttnShape,
    ) -> Result<AttnGrads<Self>> {
        Ok(attention::attention_backward(
            x.try_map(|s| Ok(&s.data))?,
            saved.try_map(|s| Ok(&s.data))?,
            shape,
        )?
        .map(CpuStorage::new))
    }

    fn cross_entropy_rows(
        &self,
        l: &Layout,
        (t, lt): (&Self, &Layout),
        opts: crate::backend::op::CeOpts,
    ) -> Result<(Self, Self)> {
        let row = l.shape().last().copied().unwrap_or(1);
        let target = class_targets(t, lt)?;
        let (loss, lse) = reduce::cross_entropy_rows(&self.data, range_of(l), row, target, opts)
            .ok_or_else(|| {
            Error::dtype("cross_entropy", self.dtype(), "needs floating-point logits")
        })??;
        Ok((CpuStorage::new(loss), CpuStorage::new(lse)))
    }

    fn cross_entropy_rows_backward(
        &self,
        l: &Layout,
        (t, lt): (&Self, &Layout),
        (lse, ls): (&Self, &Layout),
        (g, lg): (&Self, &Layout),
        opts: crate::backend::op::CeOpts,
    ) -> Result<Self> {
        let row = l.shape().last().copied().unwrap_or(1);
        let target = class_targets(t, lt)?;
        let stats = ((&lse.data, range_of(ls)), (&g.data, range_of(lg)));
        reduce::cross_entropy_rows_backward((&self.data, range_of(l)), row, target, stats, opts)
            .ok_or_else(|| {
                Error::dtype(
                    "cross_entropy",
                    self.dtype(),
                    "the statistics must be in the logits' accumulator dtype",
                )
            })?
            .map(CpuStorage::new)
    }

    fn norm_rows_backward(
        &self,
        l: &Layout,
        saved: NormSaved<'_, Self>,
        rms: bool,
    ) -> Result<Self> {
        let row = l.shape().last().copied().unwrap_or(1);
        let ops = norm_operands((&self.data, l), saved);
        reduce::norm_rows_backward(ops, row, rms)
            .ok_or_else(|| norm_dtypes(self.dtype()))?
            .map(CpuStorage::new)
    }

    fn norm_affine_backward(&self, l: &Layout, saved: NormSaved<'_, Self>) -> Result<(Self, Self)> {
        let row = l.shape().last().copied().unwrap_or(1);
        let (g, x, stats, _) = norm_operands((&self.data, l), saved);
        let (dw, db) = reduce::norm_affine_backward((g, x, stats), row)
            .ok_or_else(|| norm_dtypes(self.dtype()))??;
        Ok((CpuStorage::new(dw), CpuStorage::new(db)))
    }

    fn matmul(
        &self,
        l: &Layout,
        rhs: &Self,
        lr: &Layout,
        (m, k, n): (usize, usize, usize),
        bias: Option<(&Self, &Layout)>,
    ) -> Result<Self> {
        matmul::matmul(&matmul::MatmulArgs {
            a: (&self.data, l),
            b: (&rhs.data, lr),
            m,
            k,
            n,
            bias: bias.map(|(b, lb)| (&b.data, lb)),
        })
        .map(CpuStorage::new)
    }

    fn conv2d(
        &self,
        l: &Layout,
        (w, lw): (&Self, &Layout),
        b: Option<(&Self, &Layout)>,
        s: &ConvShape,
    ) -> Result<Self> {
        fn go<T: WithDType + Real>(
            (x, lx): (&CpuStorage, &Layout),
            (w, lw): (&CpuStorage, &Layout),
            b: Option<(&CpuStorage, &Layout)>,
            s: &ConvShape,
        ) -> Result<CpuData> {
            let bias = b.map(|(b, lb)| b.floats::<T>(lb));
            conv::conv2d(x.floats::<T>(lx), w.floats::<T>(lw), bias, s).map(T::wrap)
        }
        with_float!("conv2d", self.dtype(), T => go::<T>((self, l), (w, lw), b, s))
            .map(CpuStorage::new)
    }

    fn conv2d_backward(
        &self,
        l: &Layout,
        (w, lw): (&Self, &Layout),
        (gy, lg): (&Self, &Layout),
        s: &ConvShape,
        need: (bool, bool),
    ) -> Result<ConvGrads<Self>> {
        fn go<T: WithDType + Real + std::ops::AddAssign>(
            x: &[T],
            w: &[T],
            g: &[T],
            s: &ConvShape,
            need: (bool, bool),
        ) -> Result<ConvGrads<CpuStorage>> {
            let (gx, gw) = conv::conv2d_backward(x, w, g, s, need)?;
            let wrap = |v: Vec<T>| CpuStorage::new(T::wrap(v));
            Ok((gx.map(wrap), gw.map(wrap)))
        }
        with_float!("conv2d", self.dtype(), T => go::<T>(
            self.floats(l),
            w.floats(lw),
            gy.floats(lg),
            s,
            need
        ))
    }

    fn pool2d(
        &self,
        l: &Layout,
        s: &PoolShape,
        kind: Pool,
        want_index: bool,
    ) -> Result<(Self, Option<Self>)> {
        fn go<T: WithDType + Real>(
            x: &[T],
            s: &PoolShape,
            kind: Pool,
            want_index: bool,
        ) -> Result<(CpuStorage, Option<CpuStorage>)> {
            let (planes, hw, ohw, win) = (s.planes, (s.h, s.w), (s.oh, s.ow), s.win);
            let (out, index) = if s.index_dtype() == DType::U8 {
                let (out, i) = conv::pool2d::<T, u8>(x, planes, hw, ohw, win, kind, want_index)?;
                (out, i.map(CpuData::U8))
            } else {
                let (out, i) = conv::pool2d::<T, i64>(x, planes, hw, ohw, win, kind, want_index)?;
                (out, i.map(CpuData::I64))
            };
            Ok((CpuStorage::new(T::wrap(out)), index.map(CpuStorage::new)))
        }
        with_float!("pool2d", self.dtype(), T => go::<T>(self.floats(l), s, kind, want_index))
    }

    fn pool2d_backward(
        &self,
        l: &Layout,
        index: Option<&Self>,
        s: &PoolShape,
        kind: Pool,
    ) -> Result<Self> {
        fn go<T: WithDType + Real + std::ops::AddAssign>(
            g: &[T],
            index: Option<&CpuData>,
            s: &PoolShape,
            kind: Pool,
        ) -> Result<CpuData> {
            let (planes, hw, ohw, win) = (s.planes, (s.h, s.w), (s.oh, s.ow), s.win);
            match index {
                Some(CpuData::I64(i)) => {
                    conv::pool2d_backward(g, Some(&i[..]), planes, hw, ohw, win, kind)
                }
                Some(CpuData::U8(i)) => {
                    conv::pool2d_backward(g, Some(&i[..]), planes, hw, ohw, win, kind)
                }
                Some(_) => Err(Error::invalid(
                    "max_pool2d backward",
                    "the index is a window position in uint8 or int64",
                )),
                None => conv::pool2d_backward::<T, u8>(g, None, planes, hw, ohw, win, kind),
            }
            .map(T::wrap)
        }
        if kind == Pool::Max && index.is_none() {
            return Err(Error::invalid(
                "max_pool2d backward",
                "the forward pass kept no indices",
            ));
        }
        let index = index.map(|i| &i.data);
        with_float!("pool2d", self.dtype(), T => go::<T>(self.floats(l), index, s, kind))
            .map(CpuStorage::new)
    }

    fn indices(
        &self,
        l: &Layout,
        op: &'static str,
        dim: usize,
        size: usize,
        negative: bool,
    ) -> Result<Self> {
        let data = ew::contiguous_copy(&self.data, l)?;
        let CpuData::I64(mut v) = data else {
            return Err(Error::dtype(
                op,
                self.dtype(),
                "indices must be an int64 tensor",
            ));
        };
        wrap_indices(&mut v, op, dim, size, negative)?;
        Ok(CpuStorage::new(CpuData::I64(v)))
    }

    fn index_select(&self, l: &Layout, dim: usize, idx: &Self, _n: usize) -> Result<Self> {
        index::index_select(&self.data, l, dim, idx.int64()).map(CpuStorage::new)
    }

    fn gather(&self, l: &Layout, dim: usize, idx: &Self, ishape: &[usize]) -> Result<Self> {
        index::gather(&self.data, l, dim, idx.int64(), ishape).map(CpuStorage::new)
    }

    fn index_add(
        &mut self,
        shape: &[usize],
        dim: usize,
        idx: &Self,
        (src, ls): (&Self, &Layout),
    ) -> Result<()> {
        index::index_add(&mut self.data, shape, dim, idx.int64(), &src.data, ls);
        Ok(())
    }

    fn scatter_add(
        &mut self,
        shape: &[usize],
        dim: usize,
        idx: &Self,
        ishape: &[usize],
        (src, ls): (&Self, &Layout),
    ) -> Result<()> {
        index::scatter_add(
            &mut self.data,
            shape,
            dim,
            idx.int64(),
            ishape,
            &src.data,
            ls,
        );
        Ok(())
    }

    fn adam(
        (p, po): (&mut Self, usize),
        (g, go): (&Self, usize),
        (m, mo): (&mut Self, usize),
        (v, vo): (&mut Self, usize),
        n: usize,
        h: &AdamStep,
    ) -> Result<()> {
        optim::adam(
            (&mut p.data, po),
            (&g.data, go),
            (&mut m.data, mo),
            (&mut v.data, vo),
            n,
            h,
        )
    }
}

/// A view's values and the range of them it covers (a contiguous view).
fn data_range<'a>((s, l): (&'a CpuStorage, &Layout)) -> (&'a CpuData, std::ops::Range<usize>) {
    (&s.data, range_of(l))
}

impl CpuStorage {
    /// The values of a storage of validated indices.
    fn int64(&self) -> &[i64] {
        i64::slice(&self.data).expect("indices are int64")
    }
}

/// A norm backward's operands as the CPU's row kernels take them: the gradient,
/// the input, the statistics (whole) and the weight, each with its range.
type NormRanges<'a> = (
    reduce::Stat<'a>,
    reduce::Stat<'a>,
    reduce::Stat<'a>,
    Option<reduce::Stat<'a>>,
);

fn norm_operands<'a>(
    (g, l): (&'a CpuData, &Layout),
    s: NormSaved<'a, CpuStorage>,
) -> NormRanges<'a> {
    (
        (g, range_of(l)),
        (&s.x.0.data, range_of(s.x.1)),
        (&s.stats.data, 0..s.stats.data.len()),
        s.weight.map(|(w, lw)| (&w.data, range_of(lw))),
    )
}

/// The error of a norm's backward whose operands are not of one float dtype
/// (with the statistics in its accumulator dtype).
fn norm_dtypes(dtype: DType) -> Error {
    Error::dtype(
        "layer_norm",
        dtype,
        "the gradient, input and weight must share one float dtype, the statistics its accumulator dtype",
    )
}
