//! The functions behind the layers, as in `torch.nn.functional`: `linear`,
//! `embedding`, the norms, `dropout`, and (from `nn/sdpa.rs`)
//! `scaled_dot_product_attention` with its paths, (from `nn/activation.rs`) the
//! activations that take an `inplace` flag, (from `nn/distance.rs`)
//! `cosine_similarity`, `pairwise_distance` and `normalize`, and the losses
//! (from `nn/loss.rs`, `nn/loss_pointwise.rs` and `nn/loss_more.rs`; the
//! first two's are also at `nn::`). Most are composites of tensor
//! ops, so they run on every device and autograd needs no rule of its own.

use crate::{
    dtype::DType,
    error::{Error, Result},
    tensor::Tensor,
};

pub use super::activation::{celu, hardtanh, mish, relu6, selu};
pub use super::conv_layers::{conv1d, conv3d, conv_transpose2d, conv_transpose3d};
pub use super::distance::{cosine_similarity, normalize, pairwise_distance};
pub use super::embedding_bag::{embedding_bag, BagMode, EmbeddingBagOptions};
pub use super::instance_norm::{instance_norm, InstanceNormOptions};
pub use super::loss::{
    bce_with_logits, bce_with_logits_opts, cross_entropy, cross_entropy_opts, cross_entropy_with,
    mse_loss, nll_loss, nll_loss_opts, LossOptions, Reduction,
};
pub use super::loss_more::{
    cosine_embedding_loss, gaussian_nll_loss, hinge_embedding_loss, margin_ranking_loss,
    multi_margin_loss, multilabel_margin_loss, multilabel_soft_margin_loss, poisson_nll_loss,
    soft_margin_loss, triplet_margin_loss,
};
pub use super::loss_pointwise::{
    binary_cross_entropy, huber_loss, kl_div, kl_div_batchmean, l1_loss, smooth_l1_loss,
};
pub use super::pixel::{channel_shuffle, fold, pixel_shuffle, pixel_unshuffle, unfold};
pub use super::pointwise_layers::{
    dropout1d, dropout2d, dropout3d, glu, hardshrink, logsigmoid, softmin, softshrink, softsign,
    tanhshrink, threshold,
};
pub use super::pool3d::{
    adaptive_avg_pool3d, adaptive_max_pool3d, adaptive_max_pool3d_with_indices, avg_pool3d,
    max_pool3d, max_pool3d_with_indices, Pool3dOptions,
};
pub use super::pooling::{
    adaptive_avg_pool1d, adaptive_avg_pool2d, adaptive_max_pool1d,
    adaptive_max_pool1d_with_indices, adaptive_max_pool2d, adaptive_max_pool2d_with_indices,
    avg_pool1d, max_pool1d, max_pool1d_with_indices, max_pool2d_with_indices, max_unpool2d,
};
pub use super::prelu::prelu;
pub use super::sdpa::{
    attention_path, scaled_dot_product_attention, with_attention_group_scores, with_attention_path,
    AttentionPath,
};
pub(crate) use super::sdpa::{
    fused_attention_refusal, fused_mask_fits, log_attention_path, mask_bias,
};
pub(crate) use super::sdpa_saving::attention_saving_memory;
pub use super::upsample::{interpolate, InterpolateMode, InterpolateOptions};

/// `input · weightᵀ + bias` (`torch.nn.functional.linear`): `input` is `[..., in]`,
/// `weight` `[out, in]` (or `[in]`), `bias` broadcasts to the output. As in
/// PyTorch, a 2-D input, or a contiguous one with a bias that is one row (its
/// elements all in its last dim), goes through [`Tensor::addmm`], where the
/// product adds the bias itself (cublasLt's bias epilogue on a GPU; f16/bf16 round
/// once); otherwise it is a product and an add. Under autocast it runs in the
/// lower precision, the parameters' casts cached.
pub fn linear(input: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let _record = crate::profiler::function("linear");
    let mut args = vec![input, weight];
    args.extend(bias);
    if let Some(c) = crate::tensor::autocast::lower(&args)? {
        return linear(&c[0], &c[1], c.get(2));
    }
    if input.rank() == 0 || weight.rank() == 0 {
        return Err(Error::invalid(
            "linear",
            format!(
                "both arguments to linear need to be at least 1D, but they are {}D and {}D",
                input.rank(),
                weight.rank()
            ),
        ));
    }
    let wt = weight.t()?;
    match bias {
        Some(b) if input.rank() == 2 => b.addmm(input, &wt),
        Some(b)
            if input.is_contiguous() && b.rank() >= 1 && b.numel() == b.shape()[b.rank() - 1] =>
        {
            let r = input.rank();
            let k = input.shape()[r - 1];
            let rows: usize = input.shape()[..r - 1].iter().product();
            let y = b.addmm(&input.reshape([rows, k])?, &wt)?;
            let mut shape = input.shape()[..r - 1].to_vec();
            shape.push(y.shape()[1]);
            y.reshape(shape)
        }
        Some(b) => {
            let y = input.matmul(&wt)?;
            // PyTorch adds the bias in place: it may not grow the output
            let both = crate::layout::broadcast_shapes("linear", y.shape(), b.shape())?;
            if both.as_slice() != y.shape() {
                return Err(Error::shape(
                    "linear",
                    y.shape(),
                    b.shape(),
                    format!(
                        "output with shape {:?} doesn't match the broadcast shape {:?}",
                        y.shape(),
                        both.as_slice()
                    ),
                ));
            }
            y.add(b)
        }
        None => input.matmul(&wt),
    }
}

/// Rows of `weight` `[num_embeddings, dim]` picked by the int64 `indices` (any
/// shape): the output is `indices.shape + [dim]` (`F.embedding`). Indices out of
/// `[0, num_embeddings)` are an error, as in PyTorch. The row `padding_idx`
/// (negative counts from the end) gets no gradient.
pub fn embedding(indices: &Tensor, weight: &Tensor, padding_idx: Option<i64>) -> Result<Tensor> {
    let _record = crate::profiler::function("embedding");
    const OP: &str = "embedding";
    if weight.rank() != 2 {
        return Err(Error::invalid(OP, "'weight' must be 2-D"));
    }
    if indices.dtype() != DType::I64 {
        return Err(Error::dtype(
            OP,
            indices.dtype(),
            "Expected tensor for argument #1 'indices' to have one of the following scalar types: Long",
        ));
    }
    let (n, dim) = (weight.shape()[0], weight.shape()[1]);
    let pad = padding_idx
        .map(|p| {
            let q = if p < 0 { p + n as i64 } else { p };
            if (0..n as i64).contains(&q) {
                Ok(q)
            } else {
                Err(Error::invalid(
                    OP,
                    "Padding_idx must be within num_embeddings",
                ))
            }
        })
        .transpose()?;
    let flat = indices.reshape([indices.numel()])?;
    let mut shape = indices.shape().to_vec();
    shape.push(dim);
    let rows = table_rows(OP, weight, &flat)?;
    let rows = match pad {
        // the padding rows' values, taken outside the graph
        Some(p) if weight.requires_grad() && crate::autograd::is_grad_enabled() => {
            let at_pad = flat.eq(p)?.unsqueeze(1)?;
            let fixed = crate::autograd::no_grad(|| weight.detach().index_select(0, &flat))?;
            at_pad.where_(&fixed, &rows)?
        }
        _ => rows,
    };
    rows.reshape(shape)
}

/// The rows `indices` (1-D int64) of a lookup table, an index out of range
/// reported as `op`'s (size: the table's rows).
pub(super) fn table_rows(op: &'static str, weight: &Tensor, indices: &Tensor) -> Result<Tensor> {
    weight.index_select(0, indices).map_err(|e| match e {
        Error::IndexOutOfRange { index, size, .. } => Error::IndexOutOfRange {
            op,
            index,
            dim: 0,
            size,
        },
        e => e,
    })
}

/// Checks `normalized_shape` against `x`'s trailing dims and the affine
/// parameters' shapes; returns the dims normalised over.
fn norm_dims(
    op: &'static str,
    x: &Tensor,
    normalized_shape: &[usize],
    params: &[Option<&Tensor>],
) -> Result<Vec<i64>> {
    let k = normalized_shape.len();
    let r = x.rank();
    if k == 0 || k > r || x.shape()[r - k..] != *normalized_shape {
        return Err(Error::shape(
            op,
            x.shape(),
            normalized_shape,
            format!(
                "Given normalized_shape={normalized_shape:?}, expected input with shape [*, {}], but got input of size{:?}",
                normalized_shape
                    .iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                x.shape()
            ),
        ));
    }
    for p in params.iter().flatten() {
        if p.shape() != normalized_shape {
            return Err(Error::shape(
                op,
                p.shape(),
                normalized_shape,
                format!(
                    "Expected weight to be of same shape as normalized_shape, but got weight of shape {:?} and normalized_shape = {normalized_shape:?}",
                    p.shape()
                ),
            ));
        }
    }
    Ok((r - k..r).map(|d| d as i64).collect())
}

/// `x` in float32 when it is f16 or bf16 (the statistics of PyTorch's kernels are
/// computed in float32); floating-point dtypes only.
fn upcast(op: &'static str, kernel: &str, x: &Tensor) -> Result<Tensor> {
    match x.dtype() {
        DType::F16 | DType::BF16 => x.to_dtype(DType::F32),
        d if d.is_float() => Ok(x.clone()),
        d => Err(crate::tensor::not_implemented_for(op, kernel, d)),
    }
}

/// The statistics of a batch normalisation (`F.batch_norm`'s arguments):
/// running estimates to use (evaluation) or to update (training), the running
/// average factor and `eps`; by default evaluation, as PyTorch's
/// (`training=False`), which needs the running estimates.
#[derive(Clone, Copy, Debug)]
pub struct BatchNormOptions<'a> {
    pub running_mean: Option<&'a Tensor>,
    pub running_var: Option<&'a Tensor>,
    /// Normalise with the batch's statistics (and update the running ones, when
    /// given); otherwise with the running ones.
    pub training: bool,
    /// `running = (1 - momentum) · running + momentum · batch` (default 0.1).
    pub momentum: f64,
    /// Added to the variance (default 1e-5).
    pub eps: f64,
}

impl Default for BatchNormOptions<'_> {
    fn default() -> Self {
        BatchNormOptions {
            running_mean: None,
            running_var: None,
            training: false,
            momentum: 0.1,
            eps: 1e-5,
        }
    }
}

/// Batch normalisation of `x` `[N, C, ...]` over every dim but the channels
/// (`F.batch_norm`): `(x - mean) / sqrt(var + eps) · weight + bias` per channel,
/// with the batch's mean and biased variance in training (the running
/// estimates, when given, move towards the batch's mean and unbiased variance)
/// and the running estimates in evaluation. One fused op each way: two passes
/// over `x` forward, two backward; the output has `x`'s dtype, the statistics
/// float32 (float64 for a float64 input).
///
/// ```
/// use ember::nn::functional::{batch_norm, BatchNormOptions};
/// use ember::prelude::*;
/// let x = Tensor::new(&[[1f32, 10.], [3., 30.]], &Device::Cpu)?;
/// let (rm, rv) = (Tensor::zeros([2], DType::F32, &Device::Cpu)?, Tensor::ones([2], DType::F32, &Device::Cpu)?);
/// let opts = BatchNormOptions {
///     running_mean: Some(&rm),
///     running_var: Some(&rv),
///     training: true,
///     ..Default::default()
/// };
/// let y = batch_norm(&x, None, None, opts)?;
/// assert!(y.allclose(&Tensor::new(&[[-1f32, -1.], [1., 1.]], &Device::Cpu)?, 1e-4, 1e-4)?);
/// assert!(rm.allclose(&Tensor::new(&[0.2f32, 2.0], &Device::Cpu)?, 1e-6, 1e-6)?);
/// # Ok::<(), ember::Error>(())
/// ```
pub fn batch_norm(
    x: &Tensor,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    opts: BatchNormOptions,
) -> Result<Tensor> {
    let _record = crate::profiler::function("batch_norm");
    const OP: &str = "batch_norm";
    let stats = match (opts.training, opts.running_mean, opts.running_var) {
        (true, _, _) => crate::tensor::BatchStats::Batch,
        (false, Some(mean), Some(var)) => crate::tensor::BatchStats::Running { mean, var },
        (false, _, _) => {
            return Err(Error::invalid(
                OP,
                "running_mean and running_var must be defined in evaluation mode",
            ))
        }
    };
    let c = x.shape().get(1).copied().unwrap_or(0);
    // checked before any is updated
    for (t, what) in [
        (opts.running_mean, "running_mean"),
        (opts.running_var, "running_var"),
    ] {
        if let Some(t) = t.filter(|t| t.numel() != c) {
            return Err(Error::invalid(
                OP,
                format!("{what} should contain {c} elements not {}", t.numel()),
            ));
        }
    }
    let n = x.numel().checked_div(c).unwrap_or(0);
    // (PyTorch refuses one value a channel, and takes none: an empty output)
    if opts.training && n == 1 {
        return Err(Error::invalid(
            OP,
            format!(
                "Expected more than 1 value per channel when training, got input size {:?}",
                x.shape()
            ),
        ));
    }
    // (an empty batch keeps the running statistics as they are)
    let update = opts.training.then_some(crate::tensor::RunningUpdate {
        mean: opts.running_mean,
        var: opts.running_var,
        momentum: opts.momentum,
    });
    let (y, _, _) = x.batch_norm_op(weight, bias, (stats, update), (opts.eps, false, None))?;
    Ok(y)
}

/// The error of a norm's weight or bias `params` in another dtype than the
/// input `x` (float32 parameters go with a half input).
fn norm_params_dtype(op: &'static str, x: &Tensor, params: &[Option<&Tensor>]) -> Result<()> {
    let half = matches!(x.dtype(), DType::F16 | DType::BF16);
    for p in params.iter().flatten() {
        if p.dtype() != x.dtype() && !(half && p.dtype() == DType::F32) {
            return Err(Error::DTypeMismatch {
                op,
                lhs: x.dtype(),
                rhs: p.dtype(),
            });
        }
    }
    Ok(())
}

/// A normalisation `norm` of `x` with its optional weight and bias, again in
/// float32 where CUDA autocast casts them (the norms are on its float32 list);
/// `None` where it does not.
fn in_f32_under_autocast(
    (x, weight, bias): (&Tensor, Option<&Tensor>, Option<&Tensor>),
    norm: impl FnOnce(&Tensor, Option<&Tensor>, Option<&Tensor>) -> Result<Tensor>,
) -> Result<Option<Tensor>> {
    let mut ts = vec![x];
    ts.extend(weight);
    ts.extend(bias);
    let Some(c) = crate::tensor::autocast::to_f32_cuda(&ts)? else {
        return Ok(None);
    };
    let (w, b) = (weight.map(|_| &c[1]), bias.map(|_| &c[ts.len() - 1]));
    norm(&c[0], w, b).map(Some)
}

/// Layer normalisation over the trailing dims `normalized_shape` (`F.layer_norm`):
/// `(x - mean) / sqrt(var + eps) · weight + bias`, with the biased variance. f16
/// and bf16 inputs are normalised in float32 and the result rounded once.
pub fn layer_norm(
    x: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    let _record = crate::profiler::function("layer_norm");
    const OP: &str = "layer_norm";
    if let Some(y) = in_f32_under_autocast((x, weight, bias), |x, w, b| {
        layer_norm(x, normalized_shape, w, b, eps)
    })? {
        return Ok(y);
    }
    let dims = norm_dims(OP, x, normalized_shape, &[weight, bias])?;
    norm_params_dtype(OP, x, &[weight, bias])?;
    // half inputs with parameters of their dtype (or none) are normalised by the
    // half kernels, which read and write the dtype, compute in float32 and round
    // once: the float32 route's bits (on CUDA from one kernel template, on the
    // CPU from the float32 code run on each row widened), without its casts
    // each way and its float32 copy of x kept for the backward. float32
    // parameters take that route
    let native = [weight, bias]
        .into_iter()
        .flatten()
        .all(|p| p.dtype() == x.dtype());
    let xf = if native && x.dtype().is_float() {
        x.clone()
    } else {
        upcast(OP, "LayerNormKernelImpl", x)?
    };
    // the affine part inside the normalisation's one pass, in its dtype
    let part = |p: Option<&Tensor>| p.map(|p| p.to_dtype(xf.dtype())).transpose();
    let (w, b) = (part(weight)?, part(bias)?);
    normalize_trailing(OP, &xf, &dims, (eps, false), (w.as_ref(), b.as_ref()))?.to_dtype(x.dtype())
}

/// Group normalisation (`F.group_norm`): the channels of `x` (`[N, C, *]`) are
/// split into `num_groups` groups, each sample's group normalised over its
/// channels and positions with the biased variance, then `weight` and `bias`
/// (`[C]`) applied per channel. f16 and bf16 inputs are normalised in float32
/// (their parameters may be float32), the result rounded once. Errors as
/// PyTorch's: fewer than 2 dims, `C` not divisible by `num_groups`, parameters
/// not of shape `[C]`, no positions, and a single value per group.
///
/// ```
/// # use ember::{DType, Device, Tensor};
/// let x = Tensor::arange_step(0.0, 8.0, 1.0, DType::F32, &Device::Cpu)?.reshape([1, 4, 2])?;
/// let y = ember::nn::group_norm(&x, 2, None, None, 1e-5)?;
/// assert_eq!(y.shape(), &[1, 4, 2]);
/// // each group of 2 channels has mean 0
/// assert!(y.narrow(1, 0, 2)?.sum_all()?.item::<f32>()?.abs() < 1e-5);
/// # Ok::<(), ember::Error>(())
/// ```
pub fn group_norm(
    x: &Tensor,
    num_groups: usize,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    let _record = crate::profiler::function("group_norm");
    if let Some(y) = in_f32_under_autocast((x, weight, bias), |x, w, b| {
        group_norm_in(x, num_groups, w, b, eps)
    })? {
        return Ok(y);
    }
    group_norm_in(x, num_groups, weight, bias, eps)
}

/// [`group_norm`] in the operands' dtypes, whatever autocast says: instance
/// normalisation (not on autocast's lists) runs it directly.
pub(super) fn group_norm_in(
    x: &Tensor,
    num_groups: usize,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    const OP: &str = "group_norm";
    let mut ts = vec![x];
    ts.extend(weight);
    ts.extend(bias);
    crate::tensor::same_device(OP, &ts)?;
    if x.rank() < 2 {
        return Err(Error::invalid(
            OP,
            format!(
                "Expected at least 2 dimensions for input tensor but received {}",
                x.rank()
            ),
        ));
    }
    if num_groups == 0 {
        return Err(Error::invalid(OP, "integer division or modulo by zero"));
    }
    let (n, c) = (x.shape()[0], x.shape()[1]);
    let hw: usize = x.shape()[2..].iter().product();
    // PyTorch's training-mode check: more than one value per group
    if n * c / num_groups * hw == 1 {
        return Err(Error::invalid(
            OP,
            format!(
                "Expected more than 1 value per channel when training, got input size {:?}",
                x.shape()
            ),
        ));
    }
    if !c.is_multiple_of(num_groups) {
        return Err(Error::invalid(
            OP,
            format!(
                "Expected number of channels in input to be divisible by num_groups, but got input of shape {:?} and num_groups={num_groups}",
                x.shape()
            ),
        ));
    }
    for (p, name) in [(weight, "weight"), (bias, "bias")] {
        let Some(p) = p else { continue };
        if p.rank() != 1 || p.numel() != c {
            return Err(Error::shape(
                OP,
                p.shape(),
                x.shape(),
                format!(
                    "Expected {name} to be a vector of size equal to the number of channels in input, but got {name} of shape {:?} and input of shape {:?}",
                    p.shape(),
                    x.shape()
                ),
            ));
        }
    }
    if c == 0 {
        return Err(Error::invalid(
            OP,
            "Expected number of channels to be greater than 0, got 0",
        ));
    }
    if hw == 0 {
        return Err(Error::invalid(
            OP,
            "Expected HxW to be greater than 0, got 0",
        ));
    }
    norm_params_dtype(OP, x, &[weight, bias])?;
    let xf = upcast(OP, "GroupNormKernelImpl", x)?;
    let groups = xf.reshape([n, num_groups, c / num_groups * hw])?;
    let mut y =
        normalize_trailing(OP, &groups, &[2], (eps, false), (None, None))?.reshape(x.shape())?;
    // the parameters along dim 1
    let mut per_channel = vec![c];
    per_channel.extend(std::iter::repeat_n(1, x.rank() - 2));
    if let Some(w) = weight {
        y = y.mul(&w.to_dtype(y.dtype())?.reshape(&per_channel[..])?)?;
    }
    if let Some(b) = bias {
        y = y.add(&b.to_dtype(y.dtype())?.reshape(&per_channel[..])?)?;
    }
    y.to_dtype(x.dtype())
}

/// `x` normalised over its trailing `dims` (centred unless `rms`), times `w` and
/// plus `b` where given (each of the trailing dims' shape, in `x`'s dtype): rows of
/// the normalised size go through the fused primitive; an empty tensor is computed
/// from the definition (its statistics are NaN, as PyTorch's).
fn normalize_trailing(
    op: &'static str,
    x: &Tensor,
    dims: &[i64],
    (eps, rms): (f64, bool),
    (w, b): (Option<&Tensor>, Option<&Tensor>),
) -> Result<Tensor> {
    // the trailing dims, as `norm_dims` gives them
    let n: usize = dims.iter().map(|&d| x.shape()[d as usize]).product();
    if x.numel() > 0 {
        let rows = x.numel() / n;
        let flat = |p: Option<&Tensor>| p.map(|p| p.reshape([n])).transpose();
        let (w, b) = (flat(w)?, flat(b)?);
        return x
            .reshape([rows, n])?
            .normalize_rows(op, (eps, rms), (w.as_ref(), b.as_ref()))?
            .reshape(x.shape());
    }
    let centred = if rms {
        x.clone()
    } else {
        x.sub(&x.mean(dims, true)?)?
    };
    let var = centred.square()?.mean(dims, true)?;
    let mut y = centred.mul(&var.add(eps)?.rsqrt()?)?;
    if let Some(w) = w {
        y = y.mul(w)?;
    }
    if let Some(b) = b {
        y = y.add(b)?;
    }
    Ok(y)
}

/// Root-mean-square normalisation over the trailing dims (`F.rms_norm`):
/// `x / sqrt(mean(x²) + eps) · weight`; `eps` defaults to float32's machine
/// epsilon (PyTorch's for every float dtype up to float32), and float64's for
/// float64. f16 and bf16 are computed in float32.
pub fn rms_norm(
    x: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    eps: Option<f64>,
) -> Result<Tensor> {
    let _record = crate::profiler::function("rms_norm");
    const OP: &str = "rms_norm";
    if let Some(y) = in_f32_under_autocast((x, weight, None), |x, w, _| {
        rms_norm(x, normalized_shape, w, eps)
    })? {
        return Ok(y);
    }
    let dims = norm_dims(OP, x, normalized_shape, &[weight])?;
    // others than floats are refused
    if !x.dtype().is_float() {
        upcast(OP, "rms_norm", x)?;
    }
    let eps = eps.unwrap_or(if x.dtype() == DType::F64 {
        f64::EPSILON
    } else {
        f32::EPSILON as f64
    });
    // half rows are normalised and weighted in float32 and rounded once to
    // their dtype, as PyTorch's rms_norm (float32 and float64 rows round the
    // normalised rows and then the product, as PyTorch's two multiplications
    // do): a weight of the input's dtype (or none) inside the kernel's pass; another
    // weight (float32 on half rows) multiplies the float32 rows, and the product
    // is cast back as PyTorch's `type_as`
    match weight {
        Some(w) if w.dtype() != x.dtype() => {
            let xf = upcast(OP, "rms_norm", x)?;
            normalize_trailing(OP, &xf, &dims, (eps, true), (None, None))?
                .mul(w)?
                .to_dtype(x.dtype())
        }
        w => normalize_trailing(OP, x, &dims, (eps, true), (w, None)),
    }
}

/// Dropout's answer in training where no mask is drawn: all dropped at `p`
/// 1 (zeros, through the graph for a float input), and PyTorch's refusal of an
/// integer or bool input at 0 < `p` < 1 (the scaled mask is float); `None`
/// otherwise.
pub(crate) fn dropout_corner(x: &Tensor, p: f64) -> Result<Option<Tensor>> {
    if x.numel() == 0 && !x.dtype().is_float() {
        // (nothing to drop: PyTorch returns it)
        return Ok(Some(x.clone()));
    }
    if p == 1.0 {
        return if x.dtype().is_float() {
            x.mul(0.0).map(Some)
        } else {
            x.zeros_like().map(Some)
        };
    }
    if x.dtype().is_float() {
        return Ok(None);
    }
    Err(Error::dtype(
        "dropout",
        x.dtype(),
        format!(
            "result type Float can't be cast to the desired output type {}",
            match x.dtype() {
                DType::Bool => "Bool",
                DType::U8 => "Byte",
                _ => "Long",
            }
        ),
    ))
}

/// Zeroes each element with probability `p` and scales the others by `1 / (1 -
/// p)` when `training`; `x` itself otherwise (`F.dropout`). Draws from the
/// generator in scope.
pub fn dropout(x: &Tensor, p: f64, training: bool) -> Result<Tensor> {
    let _record = crate::profiler::function("dropout");
    if !(0.0..=1.0).contains(&p) {
        return Err(Error::invalid(
            "dropout",
            format!("dropout probability has to be between 0 and 1, but got {p}"),
        ));
    }
    if !training || p == 0.0 {
        return Ok(x.clone());
    }
    if let Some(y) = dropout_corner(x, p)? {
        return Ok(y);
    }
    let keep = Tensor::uniform(0.0, 1.0, x.shape(), DType::F32, &x.device())?.ge(p)?;
    x.mul(&keep.to_dtype(x.dtype())?.mul(1.0 / (1.0 - p))?)
}
