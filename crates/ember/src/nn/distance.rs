//! Similarities and distances between batches of vectors:
//! `cosine_similarity`, `pairwise_distance` and `normalize`
//! (`torch.nn.functional`'s), and the modules of the first two. Composites of
//! tensor ops, so they run on every device and autograd needs no rule of their
//! own.

use crate::{
    dtype::DType,
    error::{Error, Result},
    layout::broadcast_shapes,
    tensor::{IntoDims, Tensor},
};

/// The cosine of the angle between `x1` and `x2` along `dim`
/// (`torch.nn.functional.cosine_similarity`), by PyTorch 2's formula: each
/// operand divided by its 2-norm along `dim`, the norm clamped below at `eps`
/// (PyTorch's default is `1e-8`), then the products summed along `dim`. The
/// operands broadcast together; `dim` is a dim of their broadcast shape, which
/// the result loses. An integer (or bool) operand is first converted to the
/// pair's result dtype, which must be a floating-point one; float operands
/// keep their dtypes until the product (a float16 `x1` beside a float32 `x2`
/// is normalised in float16). As in PyTorch, the clamp does not stop the
/// gradient: the norm's gradient flows as if unclamped (and is 0 at a zero
/// vector). On CUDA's autocast float32 list.
///
/// ```
/// # use ember::{Device, Tensor};
/// use ember::nn::functional::cosine_similarity;
/// let dev = Device::Cpu;
/// let a = Tensor::from_vec(vec![1.0f32, 0.0, 1.0, 1.0], [2, 2], &dev)?;
/// let b = Tensor::from_vec(vec![0.0f32, 2.0], [2], &dev)?;
/// let c = cosine_similarity(&a, &b, 1, 1e-8)?.to_vec::<f32>()?;
/// assert!(c[0].abs() < 1e-6 && (c[1] - 0.5f32.sqrt()).abs() < 1e-6);
/// # Ok::<(), ember::Error>(())
/// ```
pub fn cosine_similarity(x1: &Tensor, x2: &Tensor, dim: i64, eps: f64) -> Result<Tensor> {
    const OP: &str = "cosine_similarity";
    let _record = crate::profiler::function(OP);
    if let Some(c) = crate::tensor::autocast::to_f32_cuda(&[x1, x2])? {
        return cosine_similarity(&c[0], &c[1], dim, eps);
    }
    let dt = DType::result_type(x1.dtype(), x1.rank() == 0, x2.dtype(), x2.rank() == 0);
    if !dt.is_float() {
        return Err(Error::dtype(
            OP,
            dt,
            format!(
                "expected common dtype to be floating point, yet common dtype is {}",
                crate::tensor::torch_dtype_name(dt)
            ),
        ));
    }
    let as_float = |t: &Tensor| {
        if t.dtype().is_float() {
            Ok(t.clone())
        } else {
            t.to_dtype(dt)
        }
    };
    let shape = broadcast_shapes(OP, x1.shape(), x2.shape())?;
    let x1 = as_float(x1)?.broadcast_to(&shape[..])?;
    let x2 = as_float(x2)?.broadcast_to(&shape[..])?;
    let n1 = clamped_norm(&x1, dim, eps)?;
    let n2 = clamped_norm(&x2, dim, eps)?;
    x1.div(&n1)?.mul(&x2.div(&n2)?)?.sum([dim], false)
}

/// `x`'s 2-norm along `dim` (kept), its values clamped below at `eps` without
/// recording the clamp: PyTorch clamps in place under `no_grad`, so the
/// gradient is the norm's.
fn clamped_norm(x: &Tensor, dim: i64, eps: f64) -> Result<Tensor> {
    let n = x.vector_norm(2.0, [dim], true)?;
    let clamped = crate::autograd::no_grad(|| n.clamp_min(eps))?;
    Ok(Tensor::record_twice(clamped, "clamp_min_", &[&n], |_| {
        |g: &Tensor| Ok(vec![Some(g.clone())])
    }))
}

/// The `p`-norm of `x1 - x2 + eps` along the last dim of their broadcast
/// shape (`torch.nn.functional.pairwise_distance`; PyTorch's defaults are
/// `p = 2`, `eps = 1e-6`, `keepdim = false`): the distance between each pair
/// of rows, `eps` keeping the gradient finite where two rows are equal.
/// Integer operands give float32 (the `eps` added), as in PyTorch.
pub fn pairwise_distance(
    x1: &Tensor,
    x2: &Tensor,
    p: f64,
    eps: f64,
    keepdim: bool,
) -> Result<Tensor> {
    let _record = crate::profiler::function("pairwise_distance");
    x1.sub(x2)?.add(eps)?.vector_norm(p, [-1], keepdim)
}

/// `input` divided by its `p`-norm over `dim` (`F.normalize`; PyTorch's
/// defaults are `p = 2`, `dim = 1`, `eps = 1e-12`), the norm clamped below at
/// `eps`: `v / max(‖v‖_p, eps)` for each vector along `dim` (one dim, or
/// several together). The norm is [`Tensor::vector_norm`]'s (floating-point
/// input only; float16 and bfloat16 accumulate in float32), and the clamp is
/// recorded: where the norm is at or below `eps` its gradient is 0, as in
/// PyTorch.
///
/// ```
/// # use ember::{Device, Tensor};
/// use ember::nn::functional::normalize;
/// let x = Tensor::from_vec(vec![3.0f32, 4.0, 0.0, 0.0], [2, 2], &Device::Cpu)?;
/// let y = normalize(&x, 2.0, 1, 1e-12)?;
/// assert_eq!(y.to_vec2::<f32>()?, [[0.6, 0.8], [0.0, 0.0]]);
/// # Ok::<(), ember::Error>(())
/// ```
pub fn normalize(input: &Tensor, p: f64, dim: impl IntoDims, eps: f64) -> Result<Tensor> {
    let _record = crate::profiler::function("normalize");
    let denom = input.vector_norm(p, dim, true)?.clamp_min(eps)?;
    input.div(&denom)
}

/// [`cosine_similarity`] as a module (`nn.CosineSimilarity`; defaults `dim =
/// 1`, `eps = 1e-8`). It takes two inputs, so it is not a
/// [`Module`](super::Module) (whose `forward` takes one): call its own
/// [`forward`](Self::forward).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CosineSimilarity {
    /// The dim the vectors lie along.
    pub dim: i64,
    /// The smallest norm divided by.
    pub eps: f64,
}

impl Default for CosineSimilarity {
    fn default() -> Self {
        CosineSimilarity { dim: 1, eps: 1e-8 }
    }
}

impl CosineSimilarity {
    /// The cosine similarity of `x1` and `x2` along `dim`.
    pub fn forward(&self, x1: &Tensor, x2: &Tensor) -> Result<Tensor> {
        cosine_similarity(x1, x2, self.dim, self.eps)
    }
}

/// [`pairwise_distance`] as a module (`nn.PairwiseDistance`; defaults `p = 2`,
/// `eps = 1e-6`, `keepdim = false`), with its own two-input
/// [`forward`](Self::forward).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PairwiseDistance {
    /// The norm's order.
    pub p: f64,
    /// Added to the difference.
    pub eps: f64,
    /// Whether the result keeps the last dim (of size 1).
    pub keepdim: bool,
}

impl Default for PairwiseDistance {
    fn default() -> Self {
        PairwiseDistance {
            p: 2.0,
            eps: 1e-6,
            keepdim: false,
        }
    }
}

impl PairwiseDistance {
    /// The distances between the rows of `x1` and `x2`.
    pub fn forward(&self, x1: &Tensor, x2: &Tensor) -> Result<Tensor> {
        pairwise_distance(x1, x2, self.p, self.eps, self.keepdim)
    }
}
