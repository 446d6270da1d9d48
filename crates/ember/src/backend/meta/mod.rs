//! The `meta` backend: storage with a dtype and an element count but no values.
//!
//! Every primitive gives a storage of its output's dtype and size and computes
//! nothing, so the tensor layer's validation, shape arithmetic and autograd run
//! unchanged: a model's forward and backward pass and an optimizer step on meta
//! tensors take microseconds per op and allocate only metadata. Reading values is
//! [`Error::MetaNoData`]. Each storage reports its allocation and its release to
//! the accounting hook of the thread that made it ([`account`]).

pub mod account;

use crate::backend::op::{
    attn_library_refuses, attn_library_workspace, channel_chunks, channel_columns, channel_shape,
    foreach_chunks, norm_affine_chunks, row_split, scan_chunks, scan_shape, stat_dtype, AdamStep,
    AttnGrads, AttnOperands, AttnSaved, AttnShape, AttnViews, BinaryOp, BnGradIn, BnParams,
    BnRunning, CmpOp, ConvShape, NormAffine, NormSaved, Pool, PoolShape, ReduceCode, ReduceOp,
    ReduceRoute, RowNorm, Scalar, ScanOp, UnaryOp, ARGSORT_COUNT_MAX,
};
use crate::backend::primitives::{BackendStorage, ConvGrads};
use crate::dtype::CpuData;
use crate::layout::Layout;
use crate::{
    device::Device,
    dtype::DType,
    error::{Error, Result},
};
use account::AllocHook;
use std::sync::Arc;

/// A storage that would hold `len` elements of `dtype`.
pub(crate) struct MetaStorage {
    dtype: DType,
    len: usize,
    id: u64,
    /// A CUDA op's internal buffer rather than a tensor (see [`MetaStorage::workspace`]).
    workspace: bool,
    /// The hook that saw the allocation sees the release.
    hook: Option<Arc<dyn AllocHook>>,
}

impl std::fmt::Debug for MetaStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MetaStorage({} x {})", self.len, self.dtype)
    }
}

impl MetaStorage {
    /// What CUDA's multi-tensor norms allocate for tensors of `lengths` in `dtype`:
    /// the norms (returned) and, per launch, the chunks' partial sums, freed at
    /// once.
    pub(crate) fn foreach_norms(dtype: DType, lengths: &[usize]) -> Result<MetaStorage> {
        let acc = stat_dtype(dtype);
        let norms = MetaStorage::new(acc, lengths.len())?;
        for chunks in foreach_chunks(lengths) {
            MetaStorage::workspace(acc, chunks)?;
        }
        Ok(norms)
    }

    /// A storage of `len` elements of `dtype` (reported to this thread's hook).
    pub fn new(dtype: DType, len: usize) -> Result<MetaStorage> {
        MetaStorage::reported(dtype, len, false)
    }

    /// A buffer that ember's CUDA backend allocates inside an op and frees before
    /// the op returns (a convolution's patch matrix): reported as a workspace, so
    /// that an estimate of device memory sees it at the moment it would exist.
    fn workspace(dtype: DType, len: usize) -> Result<MetaStorage> {
        MetaStorage::reported(dtype, len, true)
    }

    fn reported(dtype: DType, len: usize, workspace: bool) -> Result<MetaStorage> {
        crate::backend::profile::memory(len.saturating_mul(dtype.size_in_bytes()), true);
        let hook = account::current_hook();
        let id = account::next_id();
        if let Some(h) = &hook {
            account::report(id, dtype, len, workspace, |e| h.alloc(e));
        }
        Ok(MetaStorage {
            dtype,
            len,
            id,
            workspace,
            hook,
        })
    }

    fn like(&self, len: usize) -> Result<MetaStorage> {
        MetaStorage::new(self.dtype, len)
    }

    /// Whether a convolution of `s` goes to cuDNN on the modelled GPU: switched
    /// on, a shape and dtype it takes, and the GPU has it
    /// ([`account::modelled_cudnn`]).
    fn via_cudnn(&self, s: &ConvShape) -> bool {
        s.through_library(self.dtype) && account::modelled_cudnn()
    }

    /// As CUDA: f16/bf16 convolutions of `s` run in their own dtype where they go
    /// to cuDNN (meta models a GPU where it loads, with the switch as set).
    pub(crate) fn conv_takes_half(&self, s: &ConvShape) -> bool {
        s.library_takes_half(self.dtype) && account::modelled_cudnn()
    }

    /// As CUDA: channels-last convolutions of `s` run as they lie where they go
    /// to cuDNN (float64 excepted, as PyTorch's).
    pub(crate) fn conv_takes_channels_last(&self, s: &ConvShape) -> bool {
        s.library_takes_channels_last(self.dtype) && account::modelled_cudnn()
    }

    /// Batch norm's per-channel sums as CUDA makes them: the `[2, c]` result, then
    /// the chunks' partial sums for single-element planes (`channel_columns`) or
    /// for channels of many elements (`channel_chunks`).
    fn channel_sums(&self, l: &Layout) -> Result<MetaStorage> {
        let shape = channel_shape(l.shape());
        let out = MetaStorage::new(stat_dtype(self.dtype), 2 * shape.1)?;
        let sms = account::modelled_multiprocessors();
        if let Some((_, chunks)) = channel_columns(shape, sms).or(channel_chunks(shape, sms)) {
            let _part = MetaStorage::workspace(DType::F64, 2 * chunks * shape.1)?;
        }
        Ok(out)
    }

    /// One cuDNN pass's buffers as ember's CUDA path makes them
    /// (`backend/cuda/ops/convolution.rs`): the result of `len` elements, then
    /// the pass's workspace of a fixed size, freed when the pass is queued.
    fn library_pass(&self, s: &ConvShape, len: usize) -> Result<MetaStorage> {
        let out = self.like(len)?;
        let _workspace =
            MetaStorage::workspace(DType::U8, s.library_workspace(self.dtype.size_in_bytes()))?;
        Ok(out)
    }
}

impl Drop for MetaStorage {
    fn drop(&mut self) {
        crate::backend::profile::memory(self.len.saturating_mul(self.dtype.size_in_bytes()), false);
        if let Some(h) = &self.hook {
            account::report(self.id, self.dtype, self.len, self.workspace, |e| h.free(e));
        }
    }
}

/// The elements of a convolution's patch matrix (im2col): `[n, c·kh·kw, oh·ow]`.
impl BackendStorage for MetaStorage {
    fn dtype(&self) -> DType {
        self.dtype
    }

    fn device(&self) -> Device {
        Device::Meta
    }

    fn to_dtype(&self, l: &Layout, dtype: DType) -> Result<Self> {
        MetaStorage::new(dtype, l.numel())
    }

    fn copy(&self, l: &Layout) -> Result<Self> {
        self.like(l.numel())
    }

    fn copy_into(&self, _l: &Layout, _dst: &mut Self, _ld: &Layout) -> Result<()> {
        Ok(())
    }

    fn to_host(&self, _l: &Layout, op: &'static str) -> Result<CpuData> {
        Err(Error::MetaNoData {
            op,
            hint: "build the tensor on a real device to read values",
        })
    }

    fn unary<O: UnaryOp>(&self, l: &Layout, _op: &O) -> Result<Self> {
        self.like(l.numel())
    }

    fn unary_inplace<O: UnaryOp>(&mut self, _l: &Layout, _op: &O) -> Result<()> {
        Ok(())
    }

    fn binary<O: BinaryOp>(&self, l: &Layout, _rhs: &Self, _lr: &Layout, _op: &O) -> Result<Self> {
        self.like(l.numel())
    }

    fn binary_scalar<O: BinaryOp>(&self, l: &Layout, _s: Scalar, _op: &O) -> Result<Self> {
        self.like(l.numel())
    }

    fn binary_inplace<O: BinaryOp>(
        &mut self,
        _l: &Layout,
        _rhs: &Self,
        _lr: &Layout,
        _op: &O,
    ) -> Result<()> {
        Ok(())
    }

    fn binary_scalar_inplace<O: BinaryOp>(
        &mut self,
        _l: &Layout,
        _s: Scalar,
        _op: &O,
    ) -> Result<()> {
        Ok(())
    }

    fn compare(&self, l: &Layout, _rhs: &Self, _lr: &Layout, _op: CmpOp) -> Result<Self> {
        MetaStorage::new(DType::Bool, l.numel())
    }

    fn compare_scalar(&self, l: &Layout, _s: Scalar, _op: CmpOp) -> Result<Self> {
        MetaStorage::new(DType::Bool, l.numel())
    }

    fn where_(&self, l: &Layout, a: &Self, _la: &Layout, _b: &Self, _lb: &Layout) -> Result<Self> {
        a.like(l.numel())
    }

    fn reduce(&self, l: &Layout, dims: &[usize], op: ReduceOp) -> Result<Self> {
        let kept: usize = (0..l.rank())
            .filter(|d| !dims.contains(d))
            .map(|d| l.shape()[d])
            .product();
        // as CUDA: the output, then the partial sums its route takes for a long
        // reduction on the modelled GPU
        let out = MetaStorage::new(op.out_dtype(self.dtype), kept)?;
        if kept > 0 {
            let sms = account::modelled_multiprocessors();
            let route = ReduceRoute::of(op.code().0, l, dims, sms);
            let partials = route.partials(kept);
            if partials > 0 {
                let _partials = MetaStorage::workspace(DType::I64, partials)?;
            }
        }
        Ok(out)
    }

    fn softmax(&self, l: &Layout, _log: bool) -> Result<Self> {
        self.like(l.numel())
    }

    fn softmax_backward(&self, l: &Layout, _y: &Self, _ly: &Layout, _log: bool) -> Result<Self> {
        self.like(l.numel())
    }

    fn norm_rows(&self, l: &Layout, _n: RowNorm, _a: NormAffine<'_, Self>) -> Result<(Self, Self)> {
        let rows = row_split(l).0;
        Ok((
            self.like(l.numel())?,
            MetaStorage::new(stat_dtype(self.dtype), 2 * rows)?,
        ))
    }

    fn norm_rows_backward(&self, l: &Layout, _s: NormSaved<'_, Self>, _rms: bool) -> Result<Self> {
        self.like(l.numel())
    }

    fn norm_affine_backward(&self, l: &Layout, _s: NormSaved<'_, Self>) -> Result<(Self, Self)> {
        // as the CUDA launcher: the outputs, then the partials' workspace
        let (rows, row) = row_split(l);
        let out = (self.like(row)?, self.like(row)?);
        if row > 0 {
            let chunks = norm_affine_chunks(rows).0;
            let _partial = MetaStorage::workspace(stat_dtype(self.dtype), 2 * chunks * row)?;
        }
        Ok(out)
    }

    fn attention(x: AttnOperands<'_, Self>, sh: AttnShape) -> Result<(Self, Self)> {
        let (q, n) = (x.q.0, sh.batch * sh.heads);
        let res = (
            q.like(n * sh.l * sh.d)?,
            MetaStorage::new(stat_dtype(q.dtype), n * sh.l)?,
        );
        // as the CUDA launcher: cuDNN's attention takes a workspace after them
        if library_attention_takes(&x, &sh, None) {
            let _ws = MetaStorage::workspace(DType::U8, attn_library_workspace(&sh, false))?;
        }
        Ok(res)
    }

    fn attention_backward(
        x: AttnOperands<'_, Self>,
        saved: AttnSaved<'_, Self>,
        sh: AttnShape,
    ) -> Result<AttnGrads<Self>> {
        let q = x.q.0;
        if library_attention_takes(&x, &sh, Some(saved.g.1)) {
            // as the CUDA launcher: the gradients, then cuDNN's workspace
            let grads = AttnGrads::alloc(&sh, |len| q.like(len))?;
            let _ws = MetaStorage::workspace(DType::U8, attn_library_workspace(&sh, true))?;
            return Ok(grads);
        }
        // as the CUDA launcher: each row's Σ g · out first, freed on return
        let n = sh.batch * sh.heads;
        let _dsum = MetaStorage::workspace(stat_dtype(q.dtype), n * sh.l)?;
        AttnGrads::alloc(&sh, |len| q.like(len))
    }

    fn cross_entropy_rows(
        &self,
        l: &Layout,
        _target: (&Self, &Layout),
        _opts: crate::backend::op::CeOpts,
    ) -> Result<(Self, Self)> {
        // every dim but the last: rows of no classes still count
        let rows: usize = l.shape()[..l.rank().saturating_sub(1)].iter().product();
        let acc = stat_dtype(self.dtype);
        Ok((
            MetaStorage::new(acc, rows)?,
            MetaStorage::new(acc, 2 * rows)?,
        ))
    }

    fn cross_entropy_rows_backward(
        &self,
        l: &Layout,
        _target: (&Self, &Layout),
        _lse: (&Self, &Layout),
        _g: (&Self, &Layout),
        _opts: crate::backend::op::CeOpts,
    ) -> Result<Self> {
        self.like(l.numel())
    }

    fn channel_stats(&self, l: &Layout) -> Result<Self> {
        self.channel_sums(l)
    }

    fn channel_dot(
        &self,
        l: &Layout,
        _x: (&Self, &Layout),
        _mean: (&Self, &Layout),
        _mask: Option<(&Self, &Layout)>,
    ) -> Result<Self> {
        self.channel_sums(l)
    }

    fn channel_affine(
        &self,
        l: &Layout,
        _q: Option<(&Self, &Layout)>,
        _coefs: (&Self, &Layout),
        _act: (bool, Option<(&Self, &Layout)>),
    ) -> Result<Self> {
        self.like(l.numel())
    }

    fn batch_norm_coefs(
        p: BnParams<'_, Self>,
        _running: BnRunning<'_, Self>,
        _eps: f64,
    ) -> Result<Self> {
        p.mean.0.like(3 * p.mean.1.numel())
    }

    fn batch_norm_grad_coefs(
        p: BnGradIn<'_, Self>,
        weight_grad: bool,
    ) -> Result<(Self, Option<Self>)> {
        let c = p.mean.1.numel();
        let coefs = p.mean.0.like(3 * c)?;
        let gw = weight_grad.then(|| p.mean.0.like(c)).transpose()?;
        Ok((coefs, gw))
    }

    fn cumulative(&self, l: &Layout, dim: usize, _op: ScanOp) -> Result<Self> {
        let out = self.like(l.numel())?;
        // as the CUDA launcher: long lines keep their chunks' carries
        let (outer, n, inner) = scan_shape(l.shape(), dim);
        if let Some((_, chunks)) = scan_chunks(outer * inner, n).filter(|_| l.numel() > 0) {
            let _carries = MetaStorage::workspace(DType::I64, outer * inner * chunks)?;
        }
        Ok(out)
    }

    fn argsort(&self, l: &Layout, dim: usize, _descending: bool) -> Result<Self> {
        let out = MetaStorage::new(DType::I64, l.numel())?;
        // as the CUDA launcher: long lines merge between the output and a
        // second index buffer of its size
        if l.shape().get(dim).copied().unwrap_or(1) > ARGSORT_COUNT_MAX && l.numel() > 0 {
            let _other = MetaStorage::workspace(DType::I64, l.numel())?;
        }
        Ok(out)
    }

    fn searchsorted(
        &self,
        _ls: &Layout,
        _values: &Self,
        lv: &Layout,
        _m_per: (usize, usize),
        _right: bool,
    ) -> Result<Self> {
        MetaStorage::new(DType::I64, lv.numel())
    }

    fn matmul(
        &self,
        l: &Layout,
        _rhs: &Self,
        _lr: &Layout,
        (m, _k, n): (usize, usize, usize),
        _bias: Option<(&Self, &Layout)>,
    ) -> Result<Self> {
        // the bias is added into the output (no second array on any device)
        let batch: usize = l.shape()[..l.rank() - 2].iter().product();
        self.like(batch * m * n)
    }

    fn conv2d(
        &self,
        _l: &Layout,
        _w: (&Self, &Layout),
        b: Option<(&Self, &Layout)>,
        s: &ConvShape,
    ) -> Result<Self> {
        // as ember's CUDA path (backend/cuda/ops/convolution.rs): through cuDNN,
        // the output and the pass's workspace; else the patches and their product
        // with the weight, in one pass or in passes of `chunk` samples copied into
        // the output; with a bias, the sum written to a new output
        let y = s.n * s.o * s.oh * s.ow;
        if self.via_cudnn(s) {
            let product = self.library_pass(s, y)?;
            return match b {
                Some(_) => {
                    let out = self.like(y);
                    drop(product);
                    out
                }
                None => Ok(product),
            };
        }
        let chunk = s.samples_per_pass(self.dtype.size_in_bytes());
        // one pass: the patches live until the op returns (through the bias add)
        let mut _patches = None;
        let product = if chunk >= s.n {
            _patches = Some(MetaStorage::workspace(
                self.dtype,
                s.n * s.patches_per_sample(),
            )?);
            self.like(y)?
        } else {
            let out = self.like(y)?;
            for n0 in (0..s.n).step_by(chunk) {
                let n = chunk.min(s.n - n0);
                let patches = MetaStorage::workspace(self.dtype, n * s.patches_per_sample())?;
                let _part = MetaStorage::workspace(self.dtype, n * s.o * s.oh * s.ow)?;
                drop(patches);
            }
            out
        };
        match b {
            Some(_) => {
                let out = self.like(y);
                drop(product);
                out
            }
            None => Ok(product),
        }
    }

    fn conv2d_backward(
        &self,
        _l: &Layout,
        _w: (&Self, &Layout),
        _gy: (&Self, &Layout),
        s: &ConvShape,
        need: (bool, bool),
    ) -> Result<ConvGrads<Self>> {
        // as ember's CUDA path: the input's gradient folds the patches' gradient
        // back; the weight's sums a per-sample product of the output's gradient and
        // the patches over the batch; in passes of `chunk` samples when the
        // patches of the batch exceed the budget
        let dt = self.dtype;
        let weight = s.weight_numel();
        if self.via_cudnn(s) {
            // cuDNN: the input's gradient, then the weight's, each with its pass's
            // workspace
            let gx = need
                .0
                .then(|| self.library_pass(s, s.n * s.c * s.h * s.w))
                .transpose()?;
            let gw = need.1.then(|| self.library_pass(s, weight)).transpose()?;
            return Ok((gx, gw));
        }
        let chunk = s.samples_per_pass(dt.size_in_bytes());
        // one pass's buffers; the result as `result` makes it
        let input_grad = |n: usize, result: fn(DType, usize) -> Result<MetaStorage>| {
            let _gpatches = MetaStorage::workspace(dt, n * s.patches_per_sample())?;
            result(dt, n * s.c * s.h * s.w)
        };
        let weight_part = |n: usize, result: fn(DType, usize) -> Result<MetaStorage>| {
            let patches = MetaStorage::workspace(dt, n * s.patches_per_sample())?;
            let _products = MetaStorage::workspace(dt, n * weight)?;
            drop(patches);
            // the products summed over the samples: the sum, then the partial
            // sums of its route on the modelled GPU
            let sum = result(dt, weight)?;
            let products = Layout::contiguous(&[n, weight]);
            let sms = account::modelled_multiprocessors();
            let route = ReduceRoute::of(ReduceCode::Sum, &products, &[0], sms);
            let partials = route.partials(weight);
            if partials > 0 {
                let _partials = MetaStorage::workspace(DType::I64, partials)?;
            }
            Ok(sum)
        };
        if chunk >= s.n {
            let gx = need
                .0
                .then(|| input_grad(s.n, MetaStorage::new))
                .transpose()?;
            let gw = need
                .1
                .then(|| weight_part(s.n, MetaStorage::new))
                .transpose()?;
            return Ok((gx, gw));
        }
        let passes: Vec<usize> = (0..s.n)
            .step_by(chunk)
            .map(|n0| chunk.min(s.n - n0))
            .collect();
        let gx = need
            .0
            .then(|| -> Result<MetaStorage> {
                let gx = self.like(s.n * s.c * s.h * s.w)?;
                for &n in &passes {
                    input_grad(n, MetaStorage::workspace)?;
                }
                Ok(gx)
            })
            .transpose()?;
        let gw = need
            .1
            .then(|| -> Result<MetaStorage> {
                let mut sum = weight_part(passes[0], MetaStorage::workspace)?;
                for (i, &n) in passes.iter().enumerate().skip(1) {
                    let part = weight_part(n, MetaStorage::workspace)?;
                    // the running sum: a workspace until the last, which is returned
                    let last = i + 1 == passes.len();
                    sum = MetaStorage::reported(dt, weight, !last)?;
                    drop(part);
                }
                Ok(sum)
            })
            .transpose()?;
        Ok((gx, gw))
    }

    fn pool2d(
        &self,
        _l: &Layout,
        s: &PoolShape,
        _kind: Pool,
        want_index: bool,
    ) -> Result<(Self, Option<Self>)> {
        let n = s.planes * s.oh * s.ow;
        let index = want_index
            .then(|| MetaStorage::new(s.index_dtype(), n))
            .transpose()?;
        Ok((self.like(n)?, index))
    }

    fn pool2d_backward(
        &self,
        _l: &Layout,
        _index: Option<&Self>,
        s: &PoolShape,
        _kind: Pool,
    ) -> Result<Self> {
        self.like(s.planes * s.h * s.w)
    }

    fn indices(
        &self,
        l: &Layout,
        _op: &'static str,
        _dim: usize,
        _size: usize,
        _negative: bool,
    ) -> Result<Self> {
        // values unknown: nothing to check, as on PyTorch's meta device
        MetaStorage::new(DType::I64, l.numel())
    }

    fn index_select(&self, l: &Layout, dim: usize, _idx: &Self, n: usize) -> Result<Self> {
        let rest: usize = (0..l.rank())
            .filter(|&d| d != dim)
            .map(|d| l.shape()[d])
            .product();
        self.like(rest * n)
    }

    fn gather(&self, _l: &Layout, _dim: usize, _idx: &Self, ishape: &[usize]) -> Result<Self> {
        self.like(ishape.iter().product())
    }

    fn index_add(
        &mut self,
        _shape: &[usize],
        _dim: usize,
        _idx: &Self,
        _src: (&Self, &Layout),
    ) -> Result<()> {
        Ok(())
    }

    fn scatter_add(
        &mut self,
        _shape: &[usize],
        _dim: usize,
        _idx: &Self,
        _ishape: &[usize],
        _src: (&Self, &Layout),
    ) -> Result<()> {
        Ok(())
    }

    fn adam(
        _p: (&mut Self, usize),
        _g: (&Self, usize),
        _m: (&mut Self, usize),
        _v: (&mut Self, usize),
        _n: usize,
        _h: &AdamStep,
    ) -> Result<()> {
        Ok(())
    }
}

/// Whether the modelled GPU sends this attention call to cuDNN, as the CUDA
/// launcher decides ([`attn_library_refuses`]; a GPU with cuDNN, sm_80 or later
/// for ember's kernels the same).
fn library_attention_takes(
    x: &AttnOperands<'_, MetaStorage>,
    sh: &AttnShape,
    grads: Option<&Layout>,
) -> bool {
    if !crate::backend::op::library_attention() {
        return false;
    }
    let layouts = [x.q.1, x.k.1, x.v.1];
    let views = AttnViews::of(&[&layouts[..], grads.as_slice()].concat());
    account::modelled_cudnn()
        && attn_library_refuses(x.q.0.dtype, sh, &views, x.bias.is_some()).is_none()
}
