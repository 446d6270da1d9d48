//! The functions behind the sequence-model layers, as in `torch.nn.functional`:
//! `embedding`, `layer_norm`, `rms_norm`, `dropout` and
//! `scaled_dot_product_attention`. Each is a composite of tensor ops, so it runs
//! on every device and autograd needs no rule of its own.

use crate::{DType, Error, Result, Tensor};

/// Rows of `weight` `[num_embeddings, dim]` picked by the int64 `indices` (any
/// shape): the output is `indices.shape + [dim]` (`F.embedding`). Indices out of
/// `[0, num_embeddings)` are an error, as in PyTorch. The row `padding_idx`
/// (negative counts from the end) gets no gradient.
pub fn embedding(indices: &Tensor, weight: &Tensor, padding_idx: Option<i64>) -> Result<Tensor> {
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
    let rows = weight.index_select(0, &flat)?;
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
    const OP: &str = "layer_norm";
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
    const OP: &str = "scaled_dot_product_attention";
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
    // scaling the queries ([.., L, E]) costs less than scaling the scores ([.., L, S])
    let scores = q.mul(scale)?.matmul(&k.transpose(-2, -1)?)?;
    if let Some(m) = attn_mask {
        // the mask broadcasts to the scores (PyTorch adds it to them)
        crate::layout::broadcast_shapes(OP, m.shape(), scores.shape())?;
    }
    // which keys each query may attend to (None: all)
    let allowed = match attn_mask {
        Some(m) if m.dtype() == DType::Bool => Some(m.clone()),
        _ if is_causal => Some(Tensor::ones([l, s], DType::Bool, &q.device())?.tril(0)?),
        _ => None,
    };
    let scores = match attn_mask {
        Some(m) if m.dtype() != DType::Bool => scores.add(m)?,
        _ => scores,
    };
    let weights = match &allowed {
        Some(a) => {
            let masked = scores.masked_fill(&a.logical_not()?, f64::NEG_INFINITY)?;
            let w = masked.softmax(-1)?;
            // a query with no key to attend to: zeros, not NaN (a mask in host
            // memory is read to skip this pass where every query has a key)
            let none = a.logical_not()?.all(-1, true)?;
            let any_empty = !none.device().is_cpu() || none.any_all()?.item::<bool>()?;
            if any_empty {
                w.masked_fill(&none, 0.0)?
            } else {
                w
            }
        }
        None => scores.softmax(-1)?,
    };
    let weights = dropout(&weights, dropout_p, dropout_p > 0.0)?;
    weights.matmul(v)
}
