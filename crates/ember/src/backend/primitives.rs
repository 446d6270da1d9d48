//! The primitives every device's storage computes: the [`BackendStorage`] trait
//! that the CPU, CUDA and `meta` backends implement and [`Storage`] dispatches
//! to. The tensor layer has already validated the operands (same device, dtypes,
//! broadcast shapes) and computed the output's shape and dtype when it calls in;
//! a backend only computes. Outputs are new contiguous storages.
//!
//! [`Storage`]: super::Storage

use super::op::{
    AdamStep, AttnGrads, AttnOperands, AttnSaved, AttnShape, BinaryOp, BnGradIn, BnParams,
    BnRunning, CmpOp, ConvShape, NormAffine, NormSaved, Pool, PoolShape, ReduceOp, RowNorm, Scalar,
    ScanOp, UnaryOp,
};
use crate::dtype::CpuData;
use crate::layout::Layout;
use crate::{device::Device, dtype::DType, error::Result};

/// A random distribution for [`Storage::random`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Dist {
    /// Uniform in `[lo, hi)`.
    Uniform(f64, f64),
    /// Normal with mean and standard deviation.
    Normal(f64, f64),
    /// int64 integers uniform in `[low, high)` (`low < high`).
    Integers(i64, i64),
}

/// The input and weight gradients of a convolution, each where it was asked for.
pub(crate) type ConvGrads<S> = (Option<S>, Option<S>);

/// What every device's storage computes. Layouts are in elements of the storage;
/// outputs are contiguous.
pub(crate) trait BackendStorage: Sized {
    fn dtype(&self) -> DType;
    fn device(&self) -> Device;

    // ---- copies and casts
    /// The elements of `l` converted to `dtype`.
    fn to_dtype(&self, l: &Layout, dtype: DType) -> Result<Self>;
    /// The elements of `l`, copied.
    fn copy(&self, l: &Layout) -> Result<Self>;
    /// `dst[ld] = self[l]` for views of one shape and dtype (`ld` does not overlap
    /// itself).
    fn copy_into(&self, l: &Layout, dst: &mut Self, ld: &Layout) -> Result<()>;
    /// The elements of `l` in host memory, row-major (`op` names the caller in
    /// errors). Waits for queued work.
    fn to_host(&self, l: &Layout, op: &'static str) -> Result<CpuData>;

    // ---- elementwise
    fn unary<O: UnaryOp>(&self, l: &Layout, op: &O) -> Result<Self>;
    /// `self[l] = op(self[l])` (`l` does not overlap itself).
    fn unary_inplace<O: UnaryOp>(&mut self, l: &Layout, op: &O) -> Result<()>;
    /// `op(self[l], rhs[lr])` over two views broadcast to one shape, one dtype.
    fn binary<O: BinaryOp>(&self, l: &Layout, rhs: &Self, lr: &Layout, op: &O) -> Result<Self>;
    /// `op(self[l], s)` with `s` converted to the dtype as a cast converts it.
    fn binary_scalar<O: BinaryOp>(&self, l: &Layout, s: Scalar, op: &O) -> Result<Self>;
    /// `self[l] = op(self[l], rhs[lr])`.
    fn binary_inplace<O: BinaryOp>(
        &mut self,
        l: &Layout,
        rhs: &Self,
        lr: &Layout,
        op: &O,
    ) -> Result<()>;
    /// `self[l] = op(self[l], s)`.
    fn binary_scalar_inplace<O: BinaryOp>(&mut self, l: &Layout, s: Scalar, op: &O) -> Result<()>;
    /// A bool storage of `op(self[l], rhs[lr])`.
    fn compare(&self, l: &Layout, rhs: &Self, lr: &Layout, op: CmpOp) -> Result<Self>;
    /// A bool storage of `op(self[l], s)`.
    fn compare_scalar(&self, l: &Layout, s: Scalar, op: CmpOp) -> Result<Self>;
    /// `self[l] ? a[la] : b[lb]` where `self` is bool and `a`, `b` share a dtype.
    fn where_(&self, l: &Layout, a: &Self, la: &Layout, b: &Self, lb: &Layout) -> Result<Self>;

    // ---- reductions
    /// Reduces the view `l` over `dims` (sorted, unique, each of size > 0 unless
    /// the op has an identity); the output holds the kept dims, in
    /// `op.out_dtype(dtype)`.
    fn reduce(&self, l: &Layout, dims: &[usize], op: ReduceOp) -> Result<Self>;
    /// Softmax or log-softmax of each row (the last dim) of the contiguous view `l`
    /// of a float dtype.
    fn softmax(&self, l: &Layout, log: bool) -> Result<Self>;
    /// The input gradient of [`softmax`](Self::softmax) over each row from the
    /// output's gradient (`self`, contiguous view `l`) and the output `y`
    /// (contiguous view `ly`, same shape and dtype): `y · (g - Σ g·y)`, or for
    /// log-softmax `g - exp(y) · Σ g`.
    fn softmax_backward(&self, l: &Layout, y: &Self, ly: &Layout, log: bool) -> Result<Self>;
    /// Normalises each row (the last dim) of the contiguous view `l` of a float
    /// dtype as `n` says: `xhat = (x - mean) · rstd` (`rms`: `x · rstd`, the mean
    /// taken as 0), `rstd = 1 / sqrt(var + eps)` with the biased variance (`rms`:
    /// the mean square), then `xhat · weight + bias` with the parts `a` has. Returns
    /// the rows (in `l`'s dtype) and each row's mean and rstd side by side
    /// (`[rows, 2]` in [`stat_dtype`](super::op::stat_dtype)), which with `x` are
    /// what the backward reads: `xhat` itself is not kept.
    fn norm_rows(&self, l: &Layout, n: RowNorm, a: NormAffine<'_, Self>) -> Result<(Self, Self)>;
    /// The input gradient of [`norm_rows`](Self::norm_rows) from its output's
    /// gradient (`self`, contiguous view `l`) and what its forward left
    /// ([`NormSaved`]; the input a contiguous view of `l`'s shape and dtype): with
    /// `gw = g · weight`, `rstd · (gw - mean(gw) - xhat · mean(gw · xhat))` per row
    /// (`rms`: without `mean(gw)`), in `l`'s dtype.
    fn norm_rows_backward(&self, l: &Layout, saved: NormSaved<'_, Self>, rms: bool)
        -> Result<Self>;
    /// The weight and bias gradients of [`norm_rows`](Self::norm_rows) from its
    /// output's gradient (`self`, contiguous view `l`) and its input and
    /// statistics (`saved`, whose weight it does not read): the sums over rows of
    /// `g · xhat` and of `g`, `[cols]` each in `l`'s dtype, summed in the
    /// accumulator type in the row chunks of
    /// [`norm_affine_chunks`](super::op::norm_affine_chunks), in order (the
    /// statistics' mean is 0 for RMS normalisation, so one rule serves both).
    fn norm_affine_backward(&self, l: &Layout, saved: NormSaved<'_, Self>) -> Result<(Self, Self)>;
    /// Cross-entropy of each row (the last dim, `C` classes) of the contiguous view
    /// `l` of a float dtype against one class index per row (`target`: int64, one
    /// per row, contiguous): `(1 - ε)(lse - x[t]) + ε (lse - mean(x))` with
    /// `lse = log Σ exp(x)` and `ε` the label smoothing; 0 where the target is
    /// `ignore` (with `half_steps`, `-round(x[t] - lse)` in the logits' dtype;
    /// see [`CeOpts`](super::op::CeOpts)). Returns each row's loss (`[rows]`) and its maximum and
    /// `log Σ exp(x - max)` side by side (`[rows, 2]`: `lse` in two parts, so that
    /// `x - lse` loses nothing to rounding where the logits are large), in
    /// [`stat_dtype`](super::op::stat_dtype) (float32 for the half dtypes, whose
    /// values are widened as they are read: no float32 copy of the rows is made).
    /// The tensor layer checks the targets first; one out of range gives NaN here.
    fn cross_entropy_rows(
        &self,
        l: &Layout,
        target: (&Self, &Layout),
        opts: super::op::CeOpts,
    ) -> Result<(Self, Self)>;
    /// The gradient of [`cross_entropy_rows`](Self::cross_entropy_rows)'s rows
    /// `self[l]` from each row's (max, log-sum) pair and loss gradient `g`
    /// (contiguous, in the
    /// statistics dtype): `g · (exp(x - lse) - (1 - ε)[c = t] - ε / C)`, 0 in
    /// ignored rows (with `half_steps`, `g · exp(round(x - lse)) - g [c = t]`);
    /// in `l`'s dtype.
    fn cross_entropy_rows_backward(
        &self,
        l: &Layout,
        target: (&Self, &Layout),
        lse: (&Self, &Layout),
        g: (&Self, &Layout),
        opts: super::op::CeOpts,
    ) -> Result<Self>;
    /// Fused attention (`shape`, see [`AttnShape`](super::op::AttnShape)) of the
    /// queries `x.q` against the keys `x.k` and values `x.v`, each a rank-4 view
    /// `[batch, heads, rows, d]` of one float dtype whose last dim is contiguous,
    /// none of them empty (the tensor layer checks the shapes and takes another
    /// path for empty operands; a device that cannot run it returns an error, see
    /// [`attn_kernel_refuses`](super::op::attn_kernel_refuses)). Returns the output
    /// `[batch, heads, l, d]` in the inputs' dtype, and each query row's
    /// log-sum-exp of its scaled scores over the keys it sees (contiguous
    /// `[batch · heads · l]`, natural log) in [`stat_dtype`](super::op::stat_dtype). No `[l, s]`
    /// matrix is written (the output lies where
    /// [`AttnShape::out_place`](super::op::AttnShape::out_place) says). `x.bias`, a rank-4 view `[batch, heads, l, s]` in the
    /// inputs' dtype with any strides (0 where a mask broadcasts), is added to the
    /// scaled scores (`-inf` masks a key); a query row that sees no key (all
    /// masked) gets zeros and a log-sum-exp of `-inf`.
    fn attention(x: AttnOperands<'_, Self>, shape: AttnShape) -> Result<(Self, Self)>;
    /// The gradients of [`attention`](Self::attention) for `q`, `k` and `v` (the
    /// same operands), from what the forward returned and the output's gradient
    /// ([`AttnSaved`]): each `[batch, heads, rows, d]` in the inputs' dtype,
    /// in buffers of their own or, with `shape.packed`, packed as it says, where
    /// [`AttnShape::grad_places`](super::op::AttnShape::grad_places) says. The
    /// weights are recomputed from the log-sum-exps (and the forward's bias; it
    /// gets no gradient).
    fn attention_backward(
        x: AttnOperands<'_, Self>,
        saved: AttnSaved<'_, Self>,
        shape: AttnShape,
    ) -> Result<AttnGrads<Self>>;
    /// Batch normalisation's statistics of the contiguous view `l` of a float dtype
    /// seen as `[n, c, s]` ([`channel_shape`](super::op::channel_shape)): each
    /// channel's mean and biased variance over its `n · s` elements, accumulated in
    /// float64 from the channel's first value. Returns `[2, c]` (means, then
    /// variances) in [`stat_dtype`](super::op::stat_dtype).
    fn channel_stats(&self, l: &Layout) -> Result<Self>;
    /// Per channel of the gradient `self` (contiguous view `l`, seen as
    /// `[n, c, s]`) and the input `x` (contiguous view `lx` of the same shape and
    /// dtype): `Σ dy` and `Σ dy · (x - mean)`, with `mean` the contiguous `[c]` view
    /// `lm` in the statistics dtype. Returns `[2, c]` in the statistics dtype,
    /// accumulated in float64. With `mask` (a contiguous view of the same shape
    /// and dtype: a batch norm's output through its ReLU) `dy` counts only where
    /// the mask is above 0, as the ReLU's gradient passes it.
    fn channel_dot(
        &self,
        l: &Layout,
        x: (&Self, &Layout),
        mean: (&Self, &Layout),
        mask: Option<(&Self, &Layout)>,
    ) -> Result<Self>;
    /// Elementwise over the contiguous view `l` seen as `[n, c, s]`:
    /// `p · a[ch] + d[ch]`, or with `q` (a contiguous view of the same shape and
    /// dtype) `p · a[ch] + q · b[ch] + d[ch]`. `coefs` is a contiguous view of
    /// `[2, c]` (`a`, `d`) or `[3, c]` (`a`, `b`, `d`) in the statistics dtype, in
    /// which the sum is computed; with `q` and `[2, c]`, `q` is a residual:
    /// `p · a[ch] + d[ch] + q`. The output has `l`'s dtype and shape. `act`:
    /// with its `relu` the results go through a ReLU (a batch norm with its ReLU,
    /// forward), with its mask (as [`channel_dot`](Self::channel_dot)'s) `p`
    /// counts only where the mask is above 0 (their backward).
    fn channel_affine(
        &self,
        l: &Layout,
        q: Option<(&Self, &Layout)>,
        coefs: (&Self, &Layout),
        act: (bool, Option<(&Self, &Layout)>),
    ) -> Result<Self>;
    /// Batch normalisation's per-channel coefficients from its statistics and
    /// parameters `p`, computed in float64 and rounded once: `[3, c]` in the
    /// statistics dtype, the rows `a = weight / sqrt(var + eps)`, `d = bias - mean · a`
    /// (so that the output is `x · a + d`, [`channel_affine`](Self::channel_affine)'s
    /// `[2, c]`) and the inverse standard deviation `1 / sqrt(var + eps)`. The
    /// running statistics in `running` move towards `p`'s mean and variance in the
    /// same launch.
    fn batch_norm_coefs(
        p: BnParams<'_, Self>,
        running: BnRunning<'_, Self>,
        eps: f64,
    ) -> Result<Self>;
    /// Batch normalisation's per-channel backward coefficients, computed in
    /// float64 and rounded once: `[3, c]` in the statistics dtype, the rows
    /// `k = weight · invstd`, `b` and `d` such that the input's gradient is
    /// `g · k + x · b + d` ([`channel_affine`](Self::channel_affine)'s `[3, c]`
    /// with `q = x`); with running statistics (`count` absent) `b` and `d` are 0,
    /// so that the first two rows are the map `g · k + 0`. With `weight_grad`,
    /// also the weight's gradient `Σ g · (x - mean) · invstd` (`[c]`).
    fn batch_norm_grad_coefs(
        p: BnGradIn<'_, Self>,
        weight_grad: bool,
    ) -> Result<(Self, Option<Self>)>;
    /// Cumulative sum or product along `dim` of the contiguous view `l`, in its
    /// dtype (int64 or a float dtype: the tensor layer converts the others);
    /// float32 and float64 accumulate in float64, f16 and bf16 in float32, as
    /// PyTorch's CPU kernels do. The output is contiguous, of `l`'s shape.
    fn cumulative(&self, l: &Layout, dim: usize, op: ScanOp) -> Result<Self>;
    /// The int64 indices that sort each line along `dim` of the contiguous view
    /// `l`, ascending or descending, stable (equal elements keep their order); NaN
    /// sorts above every number, as in PyTorch.
    fn argsort(&self, l: &Layout, dim: usize, descending: bool) -> Result<Self>;
    /// Where each value of the contiguous view `lv` of `values` (of this
    /// storage's dtype, `per` to each row) goes in its row of the contiguous
    /// sorted sequences `ls` (rows of `m`) to keep it sorted: int64, the first
    /// such place or with `right` the last, by PyTorch's binary search (the same
    /// midpoints, so NaNs in a sequence give its answers).
    fn searchsorted(
        &self,
        ls: &Layout,
        values: &Self,
        lv: &Layout,
        m_per: (usize, usize),
        right: bool,
    ) -> Result<Self>;

    // ---- linear algebra
    /// Batched `self[l] · rhs[lr] + bias`: `l` is `batch + [m, k]`, `lr` is
    /// `batch + [k, n]` (batch dims broadcast); the output is `batch + [m, n]`. The
    /// bias, where given, is an `[n]` vector of the same dtype added to every row
    /// before the result is rounded to the dtype (PyTorch's `addmm`: f16/bf16 round
    /// once, not after the product and again after the sum).
    fn matmul(
        &self,
        l: &Layout,
        rhs: &Self,
        lr: &Layout,
        mkn: (usize, usize, usize),
        bias: Option<(&Self, &Layout)>,
    ) -> Result<Self>;
    /// `conv2d(x, w) + b` of contiguous f32/f64 views (`self` is `x`).
    fn conv2d(
        &self,
        l: &Layout,
        w: (&Self, &Layout),
        b: Option<(&Self, &Layout)>,
        s: &ConvShape,
    ) -> Result<Self>;
    /// The gradients of `conv2d(x, w)` from the output's gradient `gy`, for the
    /// input and the weight as `need` asks (`self` is `x`; all contiguous). `x`
    /// is read only for the weight's gradient: where the input's alone is asked
    /// for, `self` may be any storage of the operands' dtype and device (the
    /// transposed convolution, whose forward is this input gradient, passes
    /// the weight) and `l` is not read.
    fn conv2d_backward(
        &self,
        l: &Layout,
        w: (&Self, &Layout),
        gy: (&Self, &Layout),
        s: &ConvShape,
        need: (bool, bool),
    ) -> Result<ConvGrads<Self>>;
    /// Max or average pooling of the contiguous view `l` of a float dtype (f16/bf16
    /// where [`Storage::pools_half`](crate::backend::Storage::pools_half) says so);
    /// with `want_index`, max pooling also returns each output's position in its
    /// window (`ki · kw + kj`, of the first largest element or the first NaN) in
    /// [`PoolShape::index_dtype`].
    fn pool2d(
        &self,
        l: &Layout,
        s: &PoolShape,
        kind: Pool,
        want_index: bool,
    ) -> Result<(Self, Option<Self>)>;
    /// The input gradient of [`pool2d`](Self::pool2d) from the output's gradient
    /// (`self`, contiguous view `l`).
    fn pool2d_backward(
        &self,
        l: &Layout,
        index: Option<&Self>,
        s: &PoolShape,
        kind: Pool,
    ) -> Result<Self>;

    // ---- indexing
    /// The int64 indices of the view `l`, each checked to lie in `[-size, size)`
    /// and wrapped to `[0, size)` (in `[0, size)` without `negative`; `op` and
    /// `dim` name them in errors), contiguous. A GPU checks them on the device and
    /// reports a bad one at its next synchronisation (the index becomes 0).
    fn indices(
        &self,
        l: &Layout,
        op: &'static str,
        dim: usize,
        size: usize,
        negative: bool,
    ) -> Result<Self>;
    /// Entries `idx` (from [`indices`](Self::indices), `n` of them) along `dim`.
    fn index_select(&self, l: &Layout, dim: usize, idx: &Self, n: usize) -> Result<Self>;
    /// `torch.gather` along `dim` with valid contiguous indices of shape `ishape`.
    fn gather(&self, l: &Layout, dim: usize, idx: &Self, ishape: &[usize]) -> Result<Self>;
    /// In place on this contiguous storage of `shape`: `self[.. idx[p] ..] += src[p]`
    /// along `dim` for every position `p` of `ishape`.
    fn scatter_add(
        &mut self,
        shape: &[usize],
        dim: usize,
        idx: &Self,
        ishape: &[usize],
        src: (&Self, &Layout),
    ) -> Result<()>;

    /// In place on this contiguous storage of `shape`: `self[.., idx[j], ..] +=
    /// src[.., j, ..]` along `dim` for each of the 1-D indices `idx` (valid); `src`
    /// is a contiguous view of `shape` with `idx.len()` entries along `dim`
    /// (`torch.index_add_`, index_select's backward).
    fn index_add(
        &mut self,
        shape: &[usize],
        dim: usize,
        idx: &Self,
        src: (&Self, &Layout),
    ) -> Result<()>;

    // ---- fused optimizer steps
    /// One Adam step on `n` contiguous f32/f64 elements from each offset: the
    /// parameter `p` and the moments `m`, `v` are updated in place from `g`.
    fn adam(
        p: (&mut Self, usize),
        g: (&Self, usize),
        m: (&mut Self, usize),
        v: (&mut Self, usize),
        n: usize,
        h: &AdamStep,
    ) -> Result<()>;
}
