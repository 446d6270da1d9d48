//! The functions behind the layers, as in `torch.nn.functional`: `linear`,
//! `embedding`, `layer_norm`, `rms_norm`, `dropout` and
//! `scaled_dot_product_attention`. Each is a composite of tensor ops, so it runs
//! on every device and autograd needs no rule of its own.

use crate::{DType, Error, Result, Tensor};

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
    // an index out of range is reported as embedding's (size: num_embeddings)
    let rows = weight.index_select(0, &flat).map_err(|e| match e {
        Error::IndexOutOfRange { index, size, .. } => Error::IndexOutOfRange {
            op: OP,
            index,
            dim: 0,
            size,
        },
        e => e,
    })?;
    let rows = match pad {
        // the padding rows' values, taken outside the graph
        Some(p) if weight.requires_grad() && crate::is_grad_enabled() => {
            let at_pad = flat.eq(p)?.unsqueeze(1)?;
            let fixed = crate::no_grad(|| weight.detach().index_select(0, &flat))?;
            at_pad.where_(&fixed, &rows)?
        }
        _ => rows,
    };
    rows.reshape(shape)
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
        d => Err(Error::dtype(
            op,
            d,
            format!(
                "\"{kernel}\" not implemented for '{}'",
                crate::tensor::torch_dtype_name(d)
            ),
        )),
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
    let n = x.numel().checked_div(c).unwrap_or(0);
    if opts.training && n <= 1 {
        return Err(Error::invalid(
            OP,
            format!(
                "Expected more than 1 value per channel when training, got input size {:?}",
                x.shape()
            ),
        ));
    }
    let (y, mean, var) = x.batch_norm_op(weight, bias, stats, opts.eps)?;
    if opts.training {
        update_running_stats(
            (opts.running_mean, opts.running_var),
            (&mean, &var),
            n,
            Momentum::Fixed(opts.momentum),
        )?;
    }
    Ok(y)
}

/// How far running statistics move towards a batch's: a fixed factor, or a
/// cumulative average's `1 / batches` as a float64 scalar tensor (computed on the
/// device rather than read back).
pub(crate) enum Momentum<'a> {
    Fixed(f64),
    Cumulative(&'a Tensor),
}

/// In place, `running = (1 - m) · running + m · batch` for the mean and, with the
/// batch's biased variance over `n` values made unbiased (`n / (n - 1)`), for the
/// variance; the batch's statistics are first rounded to the running ones' dtype.
pub(crate) fn update_running_stats(
    (running_mean, running_var): (Option<&Tensor>, Option<&Tensor>),
    (mean, var): (&Tensor, &Tensor),
    n: usize,
    m: Momentum,
) -> Result<()> {
    let unbiased = n as f64 / (n - 1) as f64;
    crate::no_grad(|| -> Result<()> {
        for (running, batch, scale) in [(running_mean, mean, 1.0), (running_var, var, unbiased)] {
            let Some(r) = running else { continue };
            let b = batch.to_dtype(r.dtype())?;
            match m {
                Momentum::Fixed(m) => {
                    r.mul_(1.0 - m)?;
                    r.add_(&b.mul(m * scale)?)?;
                }
                Momentum::Cumulative(m) => {
                    r.mul_(&m.neg()?.add(1.0)?.to_dtype(r.dtype())?)?;
                    r.add_(&b.mul(&m.mul(scale)?.to_dtype(r.dtype())?)?)?;
                }
            }
        }
        Ok(())
    })
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
    let mut ts = vec![x];
    ts.extend(weight);
    ts.extend(bias);
    if let Some(c) = crate::tensor::autocast::to_f32_cuda(&ts)? {
        let (w, b) = (weight.map(|_| &c[1]), bias.map(|_| &c[ts.len() - 1]));
        return layer_norm(&c[0], normalized_shape, w, b, eps);
    }
    let dims = norm_dims(OP, x, normalized_shape, &[weight, bias])?;
    for p in [weight, bias].into_iter().flatten() {
        // the parameters share the input's dtype, or are float32 for a half input
        let half = matches!(x.dtype(), DType::F16 | DType::BF16);
        if p.dtype() != x.dtype() && !(half && p.dtype() == DType::F32) {
            return Err(Error::DTypeMismatch {
                op: OP,
                lhs: x.dtype(),
                rhs: p.dtype(),
            });
        }
    }
    let xf = upcast(OP, "LayerNormKernelImpl", x)?;
    let mut y = normalize(OP, &xf, &dims, eps, false)?;
    if let Some(w) = weight {
        y = y.mul(&w.to_dtype(y.dtype())?)?;
    }
    if let Some(b) = bias {
        y = y.add(&b.to_dtype(y.dtype())?)?;
    }
    y.to_dtype(x.dtype())
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
    const OP: &str = "group_norm";
    let mut ts = vec![x];
    ts.extend(weight);
    ts.extend(bias);
    if let Some(c) = crate::tensor::autocast::to_f32_cuda(&ts)? {
        let (w, b) = (weight.map(|_| &c[1]), bias.map(|_| &c[ts.len() - 1]));
        return group_norm(&c[0], num_groups, w, b, eps);
    }
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
    for p in [weight, bias].into_iter().flatten() {
        // the parameters share the input's dtype, or are float32 for a half input
        let half = matches!(x.dtype(), DType::F16 | DType::BF16);
        if p.dtype() != x.dtype() && !(half && p.dtype() == DType::F32) {
            return Err(Error::DTypeMismatch {
                op: OP,
                lhs: x.dtype(),
                rhs: p.dtype(),
            });
        }
    }
    let xf = upcast(OP, "GroupNormKernelImpl", x)?;
    let groups = xf.reshape([n, num_groups, c / num_groups * hw])?;
    let mut y = normalize(OP, &groups, &[2], eps, false)?.reshape(x.shape())?;
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

/// `x` normalised over its trailing `dims` (centred unless `rms`): rows of the
/// normalised size go through the fused primitive; an empty tensor is computed
/// from the definition (its statistics are NaN, as PyTorch's).
fn normalize(op: &'static str, x: &Tensor, dims: &[i64], eps: f64, rms: bool) -> Result<Tensor> {
    // the trailing dims, as `norm_dims` gives them
    let n: usize = dims.iter().map(|&d| x.shape()[d as usize]).product();
    if x.numel() > 0 {
        let rows = x.numel() / n;
        return x
            .reshape([rows, n])?
            .normalize_rows(op, eps, rms)?
            .reshape(x.shape());
    }
    let centred = if rms {
        x.clone()
    } else {
        x.sub(&x.mean(dims, true)?)?
    };
    let var = centred.square()?.mean(dims, true)?;
    centred.mul(&var.add(eps)?.rsqrt()?)
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
    let dims = norm_dims(OP, x, normalized_shape, &[weight])?;
    let xf = upcast(OP, "rms_norm", x)?;
    let eps = eps.unwrap_or(if x.dtype() == DType::F64 {
        f64::EPSILON
    } else {
        f32::EPSILON as f64
    });
    let y = normalize(OP, &xf, &dims, eps, true)?.to_dtype(x.dtype())?;
    match weight {
        Some(w) => y.mul(w),
        None => Ok(y),
    }
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
    if p == 1.0 {
        return x.mul(0.0);
    }
    let keep = Tensor::uniform(0.0, 1.0, x.shape(), DType::F32, &x.device())?.ge(p)?;
    x.mul(&keep.to_dtype(x.dtype())?.mul(1.0 / (1.0 - p))?)
}

/// Attention `softmax(q kᵀ · scale + mask) v` over the last two dims
/// (`F.scaled_dot_product_attention`): `q` is `[..., L, E]`, `k` `[..., S, E]`,
/// `v` `[..., S, Ev]`, the leading dims broadcast. `attn_mask` broadcasts to
/// `[..., L, S]`: a bool mask says which keys each query may attend to, a float
/// mask is added to the scores. `is_causal` lets query `i` attend to keys `0..=i`
/// (the mask's top-left triangle; not together with `attn_mask`). `scale`
/// defaults to `1/sqrt(E)`. A query that may attend to no key gets zeros, as in
/// PyTorch. `dropout_p` drops attention weights (always: pass 0 in evaluation).
pub fn scaled_dot_product_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    attn_mask: Option<&Tensor>,
    dropout_p: f64,
    is_causal: bool,
    scale: Option<f64>,
) -> Result<Tensor> {
    let _record = crate::profiler::function("scaled_dot_product_attention");
    const OP: &str = "scaled_dot_product_attention";
    let mut ts = vec![q, k, v];
    ts.extend(attn_mask.filter(|m| m.dtype().is_float()));
    if let Some(c) = crate::tensor::autocast::lower(&ts)? {
        let mask = match attn_mask {
            Some(m) if m.dtype().is_float() => Some(&c[3]),
            m => m,
        };
        return scaled_dot_product_attention(
            &c[0], &c[1], &c[2], mask, dropout_p, is_causal, scale,
        );
    }
    if q.rank() < 2 || k.rank() < 2 || v.rank() < 2 {
        return Err(Error::invalid(
            OP,
            format!(
                "Expected query, key, and value to all be at least 2 dimensional, but got query.dim: {} key.dim: {} and value.dim: {} instead.",
                q.rank(),
                k.rank(),
                v.rank()
            ),
        ));
    }
    if q.dtype() != k.dtype() || q.dtype() != v.dtype() {
        return Err(Error::DTypeMismatch {
            op: OP,
            lhs: q.dtype(),
            rhs: if q.dtype() != k.dtype() {
                k.dtype()
            } else {
                v.dtype()
            },
        });
    }
    if is_causal && attn_mask.is_some() {
        return Err(Error::invalid(
            OP,
            "_scaled_dot_product_attention: Explicit attn_mask should not be set when is_causal=True",
        ));
    }
    if let Some(m) = attn_mask {
        if m.dtype() != DType::Bool && m.dtype() != q.dtype() {
            return Err(Error::dtype(
                OP,
                m.dtype(),
                format!(
                    "Expected attn_mask dtype to be bool or float or to match query dtype, but got attn_mask.dtype: {} and query.dtype: {}",
                    m.dtype(),
                    q.dtype()
                ),
            ));
        }
    }
    let e = q.shape()[q.rank() - 1];
    let (l, s) = (q.shape()[q.rank() - 2], k.shape()[k.rank() - 2]);
    let scale = scale.unwrap_or(1.0 / (e as f64).sqrt());
    if let Some(m) = attn_mask {
        // the mask broadcasts to the scores (PyTorch adds it to them)
        let mut sshape = q.shape()[..q.rank() - 1].to_vec();
        sshape.push(s);
        crate::layout::broadcast_shapes(OP, m.shape(), &sshape)?;
    }
    if attn_mask.is_none() && fused_attention_applies(q, k, v, dropout_p) {
        return q.fused_attention(k, v, scale, is_causal);
    }
    // which keys each query may attend to (None: all)
    let allowed = match attn_mask {
        Some(m) if m.dtype() == DType::Bool => Some(m.clone()),
        _ if is_causal => Some(Tensor::ones([l, s], DType::Bool, &q.device())?.tril(0)?),
        _ => None,
    };
    // the path that keeps no [L, S] weights for backward, where it applies
    let biases = || -> Result<Vec<Tensor>> {
        Ok(match (attn_mask, &allowed) {
            (Some(m), _) if m.dtype() != DType::Bool => vec![m.clone()],
            (_, Some(a)) => vec![mask_bias(a, false, q.dtype())?],
            _ => Vec::new(),
        })
    };
    if let Some(out) = attention_saving_memory(q, k, v, biases, scale, true, dropout_p)? {
        return Ok(out);
    }
    // scaling the queries ([.., L, E]) costs less than scaling the scores ([.., L, S])
    let scores = q.mul(scale)?.matmul(&k.transpose(-2, -1)?)?;
    // rows a float mask leaves with no finite score: zeros, as PyTorch's safe
    // softmax gives (the scores are read back on the CPU to skip this pass where
    // every row has one); their scores are set to 0 before the softmax so that
    // no NaN reaches the gradient either
    let (scores, no_key) = match attn_mask {
        Some(m) if m.dtype() != DType::Bool => {
            let scores = scores.add(m)?;
            let none = scores.eq(f64::NEG_INFINITY)?.all(-1, true)?;
            if !none.device().is_cpu() || none.any_all()?.item::<bool>()? {
                (scores.masked_fill(&none, 0.0)?, Some(none))
            } else {
                (scores, None)
            }
        }
        _ => (scores, None),
    };
    let weights = match &allowed {
        Some(a) => {
            let blocked = a.logical_not()?;
            let w = scores
                .masked_fill(&blocked, f64::NEG_INFINITY)?
                .softmax(-1)?;
            // a query with no key to attend to: zeros, not NaN (a mask in host
            // memory is read to skip this pass where every query has a key)
            let none = blocked.all(-1, true)?;
            let any_empty = !none.device().is_cpu() || none.any_all()?.item::<bool>()?;
            if any_empty {
                w.masked_fill(&none, 0.0)?
            } else {
                w
            }
        }
        None => {
            let w = scores.softmax(-1)?;
            match &no_key {
                Some(none) => w.masked_fill(none, 0.0)?,
                None => w,
            }
        }
    };
    let weights = dropout(&weights, dropout_p, dropout_p > 0.0)?;
    weights.matmul(v)
}

/// An attention mask as the additive bias the memory-saving path takes: a float
/// mask as it is; a bool mask as 0 and `-inf`, `-inf` where it is `true` when
/// `true_masks` (MultiheadAttention's convention) or where it is `false`
/// (SDPA's: `true` allows).
pub(crate) fn mask_bias(m: &Tensor, true_masks: bool, dtype: DType) -> Result<Tensor> {
    if m.dtype() != DType::Bool {
        return Ok(m.clone());
    }
    let masked = if true_masks {
        m.clone()
    } else {
        m.logical_not()?
    };
    Tensor::zeros(m.shape(), dtype, &m.device())?.masked_fill(&masked, f64::NEG_INFINITY)
}

/// Which computation `scaled_dot_product_attention` and `MultiheadAttention`
/// (without weights asked for) use, chosen per thread like PyTorch's
/// `torch.nn.attention.sdpa_kernel` switches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttentionPath {
    /// The fused kernel on GPUs where it applies (FlashAttention's algorithm on
    /// tensor cores: f16/bf16 on compute capability 8.0 or later, head dims that
    /// are multiples of 8 up to 128, no mask but the causal one, no dropout; `meta`
    /// estimates as such a GPU). Elsewhere the memory-saving path where the scores
    /// of one call exceed 2²² elements (16 MiB in f32) or no gradient is recorded,
    /// and the plain path otherwise, whose backward is faster because it keeps the
    /// weights (default).
    #[default]
    Auto,
    /// The fused op wherever it applies, the CPU and float32/float64 included (on
    /// the CPU it computes a query row at a time; on CUDA only the f16/bf16
    /// kernels exist, so other dtypes there go as [`Auto`](Self::Auto)); elsewhere
    /// as `Auto`.
    Fused,
    /// The memory-saving path wherever it applies: no `[L, S]` weights are kept
    /// for backward, which recomputes them a group of heads at a time.
    MemoryEfficient,
    /// The plain path: the weights are materialised and kept for backward.
    Math,
}

thread_local! {
    static ATTENTION_PATH: std::cell::Cell<AttentionPath> =
        const { std::cell::Cell::new(AttentionPath::Auto) };
    static GROUP_SCORES: std::cell::Cell<usize> = const { std::cell::Cell::new(1 << 22) };
}

/// Runs `f` with the memory-saving attention computing at most `scores` scores at
/// once on this thread (at least one head's `[L, S]`; restored after). The default,
/// 2²² (16 MiB of float32 scores, a few such buffers live at a time), balances
/// memory against the number of products; less saves memory, more saves launches.
pub fn with_attention_group_scores<R>(scores: usize, f: impl FnOnce() -> R) -> R {
    with_setting(&GROUP_SCORES, scores, f)
}

/// Runs `f` with the thread-local `setting` holding `value`, restored after (also
/// when `f` panics).
fn with_setting<T: Copy + 'static, R>(
    setting: &'static std::thread::LocalKey<std::cell::Cell<T>>,
    value: T,
    f: impl FnOnce() -> R,
) -> R {
    struct Restore<T: Copy + 'static>(&'static std::thread::LocalKey<std::cell::Cell<T>>, T);
    impl<T: Copy + 'static> Drop for Restore<T> {
        fn drop(&mut self) {
            self.0.with(|c| c.set(self.1));
        }
    }
    let _restore = Restore(setting, setting.with(|c| c.replace(value)));
    f()
}

/// Whether attention of `q` over `k`/`v` without a mask but the causal one and
/// with dropout `dropout_p` takes the fused op on this thread's
/// [`attention_path`]: one float dtype outside autocast's casts, the same batch
/// dims, one head dim for q, k and v, no empty operand, no dropout, and a device
/// that runs it.
pub(crate) fn fused_attention_applies(q: &Tensor, k: &Tensor, v: &Tensor, dropout_p: f64) -> bool {
    let r = q.rank();
    let path = attention_path();
    if matches!(path, AttentionPath::Math | AttentionPath::MemoryEfficient)
        || r < 2
        || k.rank() != r
        || v.rank() != r
        || dropout_p != 0.0
        || !q.dtype().is_float()
        || k.dtype() != q.dtype()
        || v.dtype() != q.dtype()
        || crate::tensor::autocast::would_lower(&[q, k, v])
        || q.shape()[..r - 2] != k.shape()[..r - 2]
        || q.shape()[..r - 2] != v.shape()[..r - 2]
        || k.shape()[r - 2] != v.shape()[r - 2]
        || k.shape()[r - 1] != q.shape()[r - 1]
        || v.shape()[r - 1] != q.shape()[r - 1]
        || q.numel() == 0
        || k.numel() == 0
        || q.device() != k.device()
        || q.device() != v.device()
    {
        return false;
    }
    (path == AttentionPath::Fused || !q.device().is_cpu())
        && q.runs_fused_attention(k.shape()[r - 2])
}

/// This thread's attention path.
pub fn attention_path() -> AttentionPath {
    ATTENTION_PATH.with(|p| p.get())
}

/// Runs `f` with this thread's attention path set to `path` (restored after).
pub fn with_attention_path<R>(path: AttentionPath, f: impl FnOnce() -> R) -> R {
    with_setting(&ATTENTION_PATH, path, f)
}

/// Attention that keeps no `[L, S]` matrix for backward (where
/// [`attention_path`] asks for it): `softmax(q·kᵀ·scale + biases)·v` computed a
/// group of heads at a time (at most about 4M scores at once by default; a head
/// whose `L·S` scores exceed that, a block of its queries at a time, so that
/// memory grows linearly with the length), saving only the inputs, the output
/// and each row's log-sum-exp; the backward recomputes each group's weights from
/// them (the memory-efficient attention of the GPU libraries, written with tensor
/// ops so that every device runs it), summing the keys' and values' gradients
/// over a head's query blocks as they come. Each group's results are copied to
/// their place as it finishes. The group size is
/// [`with_attention_group_scores`]'s.
///
/// Each of `biases` is additive (`-inf` where a key is masked), without a gradient,
/// in the inputs' dtype, and broadcasts to the batch + `[L, S]` (a key padding
/// mask's `[N, 1, 1, S]` is added to each group's scores without being expanded).
/// A row with every key masked gives zeros (`empty_rows_zero`, SDPA's convention)
/// or NaN (softmax's, MultiheadAttention's). `dropout_p` in `[0, 1)` drops weights
/// after the softmax; the backward draws the same masks again from a seed kept
/// per group. Float16 and bfloat16 inputs are computed in float32, a group at a
/// time, and the results rounded once.
///
/// `None` where it does not apply (dtypes other than the floats, batch dims that
/// differ between q, k and v, a bias that does not fit): the caller computes it
/// plainly.
pub(crate) fn attention_saving_memory(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    biases: impl FnOnce() -> Result<Vec<Tensor>>,
    scale: f64,
    empty_rows_zero: bool,
    dropout_p: f64,
) -> Result<Option<Tensor>> {
    let r = q.rank();
    let dt = q.dtype();
    // (autocast's casts are made by the caller: inputs it would still cast take the
    // plain path, whose ops autocast handles one by one)
    if r < 2
        || crate::tensor::autocast::would_lower(&[q, k, v])
        || k.rank() != r
        || v.rank() != r
        || !dt.is_float()
        || k.dtype() != dt
        || v.dtype() != dt
        || q.shape()[..r - 2] != k.shape()[..r - 2]
        || q.shape()[..r - 2] != v.shape()[..r - 2]
        || k.shape()[r - 2] != v.shape()[r - 2]
        || k.shape()[r - 1] != q.shape()[r - 1]
        || !(0.0..1.0).contains(&dropout_p)
    {
        return Ok(None);
    }
    let batch = &q.shape()[..r - 2];
    let n: usize = batch.iter().product();
    let (l, e) = (q.shape()[r - 2], q.shape()[r - 1]);
    let (s, ev) = (k.shape()[r - 2], v.shape()[r - 1]);
    if n * l * s == 0 {
        return Ok(None);
    }
    match attention_path() {
        AttentionPath::Math => return Ok(None),
        AttentionPath::Auto | AttentionPath::Fused
            if crate::is_grad_enabled() && n * l * s <= 1 << 22 =>
        {
            return Ok(None)
        }
        _ => {}
    }
    // the groups cut a batch of at least one dim
    let dims: Vec<usize> = if batch.is_empty() {
        vec![1]
    } else {
        batch.to_vec()
    };
    let mut full = dims.clone();
    full.extend([l, s]);
    // the biases are built only once this path is taken, then padded to the
    // scores' rank (views)
    let mut padded = Vec::new();
    for b in biases()? {
        if b.requires_grad() || b.dtype() != dt || b.rank() > full.len() {
            return Ok(None);
        }
        let fits = b
            .shape()
            .iter()
            .rev()
            .zip(full.iter().rev())
            .all(|(&have, &want)| have == 1 || have == want);
        if !fits {
            return Ok(None);
        }
        let mut b = b;
        while b.rank() < full.len() {
            b = b.unsqueeze(0)?;
        }
        padded.push(b);
    }
    let dev = q.device();
    let seed = if dropout_p > 0.0 {
        crate::backend::fork_seed(&dev)
    } else {
        0
    };
    let budget = GROUP_SCORES.with(|p| p.get());
    let per = (budget / (l * s)).max(1);
    // a row of the batch whose scores exceed the budget is cut along its queries
    // too, so that memory grows linearly with the length
    let block = if l * s > budget {
        (budget / s).clamp(1, l)
    } else {
        l
    };
    let groups = plan_groups(&dims, (l, block), s, per, &padded, seed)?;
    // half types are computed in float32, a group at a time
    let cdt = if dt == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let dropout = (dropout_p > 0.0).then_some(dropout_p);
    let (q3, k3, v3) = (
        q.reshape([n, l, e])?,
        k.reshape([n, s, e])?,
        v.reshape([n, s, ev])?,
    );
    let (out, lse) = crate::no_grad(|| {
        crate::tensor::autocast::without(|| -> Result<(Tensor, Tensor)> {
            let (mut outs, mut lses) = (Assembled::new(n, l), Assembled::new(n, l));
            for g in &groups {
                let qc = g.query_rows(&q3)?.to_dtype(cdt)?;
                let kc = g.rows(&k3)?.to_dtype(cdt)?;
                let (w, m) = group_weights(&qc, &kc, g, None, scale, empty_rows_zero)?;
                let w = match dropout {
                    Some(p) => w.mul(&g.keep(p, cdt, &dev)?)?,
                    None => w,
                };
                outs.put(g, &w.matmul(&g.rows(&v3)?.to_dtype(cdt)?)?)?;
                lses.put(g, &m)?;
            }
            Ok((outs.take()?.to_dtype(dt)?, lses.take()?))
        })
    })?;
    let mut shape = batch.to_vec();
    shape.extend([l, ev]);
    let out = out.reshape(&shape)?;
    let (qs, ks, vs) = (q.shape().to_vec(), k.shape().to_vec(), v.shape().to_vec());
    Ok(Some(Tensor::record(
        out,
        "scaled_dot_product_attention",
        &[q, k, v],
        |y| {
            let (y, qsv, ksv, vsv) = (y.save(), q.save(), k.save(), v.save());
            move |g: &Tensor| {
                crate::tensor::autocast::without(|| {
                    let q3 = qsv.get()?.reshape([n, l, e])?;
                    let k3 = ksv.get()?.reshape([n, s, e])?;
                    let v3 = vsv.get()?.reshape([n, s, ev])?;
                    let g = g.reshape([n, l, ev])?;
                    let o = y.get()?.reshape([n, l, ev])?;
                    let mut dqs = Assembled::new(n, l);
                    let (mut dks, mut dvs): (Vec<Tensor>, Vec<Tensor>) = (Vec::new(), Vec::new());
                    for grp in &groups {
                        let qc = grp.query_rows(&q3)?.to_dtype(cdt)?;
                        let kc = grp.rows(&k3)?.to_dtype(cdt)?;
                        let vc = grp.rows(&v3)?.to_dtype(cdt)?;
                        let gc = grp.query_rows(&g)?.to_dtype(cdt)?;
                        // D = rowsum(dO ∘ O): the softmax backward's row term (also
                        // with dropout, O being the dropped weights' product)
                        let dc = gc.mul(&grp.query_rows(&o)?.to_dtype(cdt)?)?.sum(-1, true)?;
                        let (w, _) =
                            group_weights(&qc, &kc, grp, Some(&lse), scale, empty_rows_zero)?;
                        let dwd = gc.matmul(&vc.transpose(1, 2)?)?;
                        let (wd, dw) = match dropout {
                            Some(p) => {
                                let keep = grp.keep(p, cdt, &dev)?;
                                (w.mul(&keep)?, dwd.mul(&keep)?)
                            }
                            None => (w.clone(), dwd),
                        };
                        let dv = wd.transpose(1, 2)?.matmul(&gc)?;
                        let ds = w.mul(&dw.sub(&dc)?)?.mul(scale)?;
                        dqs.put(grp, &ds.matmul(&kc)?)?;
                        let dk = ds.transpose(1, 2)?.matmul(&qc)?;
                        // the keys' and values' gradients summed over a row's
                        // query blocks as they come (each block's is whole)
                        match (dks.last(), dvs.last()) {
                            (Some(k), Some(v)) if grp.q0 > 0 => {
                                k.add_(&dk)?;
                                v.add_(&dv)?;
                            }
                            _ => {
                                dks.push(dk);
                                dvs.push(dv);
                            }
                        }
                    }
                    let rows = |parts: Vec<Tensor>, shape: &[usize]| -> Result<Tensor> {
                        let refs: Vec<&Tensor> = parts.iter().collect();
                        Tensor::cat(&refs, 0)?.to_dtype(dt)?.reshape(shape)
                    };
                    Ok(vec![
                        Some(dqs.take()?.to_dtype(dt)?.reshape(&qs)?),
                        Some(rows(dks, &ks)?),
                        Some(rows(dvs, &vs)?),
                    ])
                })
            }
        },
    )))
}

/// One group of the memory-saving attention: rows `[start, start + len)` of the
/// flattened batch, and of their queries `[q0, q0 + qlen)` (all of them unless a
/// row's scores exceed the budget). The rows are rectangular in the batch dims,
/// so that the scores viewed as `view` (`[1, .., c, the dims after, .., qlen, S]`)
/// take each bias's slice (a view) by broadcasting.
struct Group {
    start: usize,
    len: usize,
    q0: usize,
    qlen: usize,
    view: Vec<usize>,
    biases: Vec<Tensor>,
    /// The seed of this group's dropout masks.
    seed: u64,
}

impl Group {
    /// This group's rows of a `[n, .., ..]` tensor (the keys and values).
    fn rows(&self, t: &Tensor) -> Result<Tensor> {
        t.narrow(0, self.start as i64, self.len)
    }

    /// This group's rows and queries of a `[n, L, ..]` tensor (the queries, the
    /// output, its gradient, the log-sum-exps).
    fn query_rows(&self, t: &Tensor) -> Result<Tensor> {
        self.rows(t)?.narrow(1, self.q0 as i64, self.qlen)
    }

    /// The kept weights' multiplier (`1/(1 - p)` or 0), drawn from this group's
    /// seed: the same tensor in forward and backward.
    fn keep(&self, p: f64, dtype: DType, device: &crate::Device) -> Result<Tensor> {
        let shape = [
            self.len,
            self.view[self.view.len() - 2],
            self.view[self.view.len() - 1],
        ];
        let u = crate::Generator::new(self.seed)
            .scope(|| Tensor::uniform(0.0, 1.0, shape, DType::F32, device))?;
        u.ge(p)?.to_dtype(dtype)?.mul(1.0 / (1.0 - p))
    }
}

/// A `[n, L, ..]` result written a group's part at a time (each part is freed
/// once copied, so that the parts never all live at once).
struct Assembled {
    n: usize,
    l: usize,
    into: Option<Tensor>,
}

impl Assembled {
    fn new(n: usize, l: usize) -> Assembled {
        Assembled { n, l, into: None }
    }

    /// Copies `g`'s part (`[len, qlen, d]`) to its place.
    fn put(&mut self, g: &Group, part: &Tensor) -> Result<()> {
        let into = match &self.into {
            Some(t) => t,
            None => self.into.insert(Tensor::empty(
                [self.n, self.l, part.shape()[2]],
                part.dtype(),
                &part.device(),
            )?),
        };
        into.narrow(0, g.start as i64, g.len)?
            .narrow(1, g.q0 as i64, g.qlen)?
            .copy_(part)
    }

    /// The whole result (every row and query was put).
    fn take(self) -> Result<Tensor> {
        self.into
            .ok_or_else(|| Error::invalid("attention", "no group to assemble (a bug in ember)"))
    }
}

/// Cuts a batch of `dims` into groups of about `per` rows each (at least one)
/// that are rectangular: a range of one dim, whole in the dims after it, one
/// index in the dims before; each group's `l` queries in blocks of `block`.
/// `biases` are padded to `dims + [L, S]` and broadcast to it.
fn plan_groups(
    dims: &[usize],
    (l, block): (usize, usize),
    s: usize,
    per: usize,
    biases: &[Tensor],
    seed: u64,
) -> Result<Vec<Group>> {
    let k = dims.len();
    let after = |j: usize| -> usize { dims[j + 1..].iter().product() };
    // the first dim whose following dims fit in one group (the last one always does)
    let j = (0..k).find(|&j| after(j) <= per).unwrap_or(k - 1);
    let inner = after(j);
    let step = (per / inner).clamp(1, dims[j]);
    let outer: usize = dims[..j].iter().product();
    let mut groups = Vec::new();
    for o in 0..outer {
        let mut index = vec![0; j];
        let mut rest = o;
        for d in (0..j).rev() {
            index[d] = rest % dims[d];
            rest /= dims[d];
        }
        for at in (0..dims[j]).step_by(step) {
            let c = step.min(dims[j] - at);
            for q0 in (0..l).step_by(block) {
                let qlen = block.min(l - q0);
                let mut view = vec![1; j];
                view.push(c);
                view.extend(&dims[j + 1..]);
                view.extend([qlen, s]);
                let sliced = biases
                    .iter()
                    .map(|b| {
                        let mut b = b.clone();
                        for (d, &i) in index.iter().enumerate() {
                            if b.shape()[d] != 1 {
                                b = b.narrow(d as i64, i as i64, 1)?;
                            }
                        }
                        if b.shape()[j] != 1 {
                            b = b.narrow(j as i64, at as i64, c)?;
                        }
                        // the queries' axis, right after the batch dims
                        let qa = dims.len();
                        if b.shape()[qa] != 1 {
                            b = b.narrow(qa as i64, q0 as i64, qlen)?;
                        }
                        Ok(b)
                    })
                    .collect::<Result<Vec<_>>>()?;
                let number = groups.len() as u64;
                groups.push(Group {
                    start: (o * dims[j] + at) * inner,
                    len: c * inner,
                    q0,
                    qlen,
                    view,
                    biases: sliced,
                    seed: split_mix(seed ^ number.wrapping_mul(0xD1B5_4A32_D192_ED03)),
                });
            }
        }
    }
    Ok(groups)
}

/// SplitMix64's finaliser: nearby inputs give unrelated seeds.
fn split_mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The attention weights of one group from its queries and keys (in the compute
/// dtype): `exp(scores - lse)` with `lse` computed here when not given; a fully
/// masked row's `-inf` is shifted by 0 (its weights become 0) when
/// `empty_rows_zero`, otherwise it gives NaN as softmax does.
fn group_weights(
    qc: &Tensor,
    kc: &Tensor,
    g: &Group,
    lse: Option<&Tensor>,
    scale: f64,
    empty_rows_zero: bool,
) -> Result<(Tensor, Tensor)> {
    let mut sc = qc.mul(scale)?.matmul(&kc.transpose(1, 2)?)?;
    if !g.biases.is_empty() {
        let shape = sc.shape().to_vec();
        let mut viewed = sc.reshape(&g.view)?;
        for b in &g.biases {
            viewed = viewed.add(&b.to_dtype(sc.dtype())?)?;
        }
        sc = viewed.reshape(&shape)?;
    }
    let m = match lse {
        Some(m) => g.query_rows(m)?,
        None => sc.logsumexp(-1, true)?,
    };
    let shift = if empty_rows_zero {
        m.isinf()?.where_(0.0, &m)?
    } else {
        m.clone()
    };
    Ok((sc.sub(&shift)?.exp()?, m))
}
