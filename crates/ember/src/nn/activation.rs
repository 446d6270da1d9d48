//! The activations' functional forms that take PyTorch's `inplace` flag
//! (`torch.nn.functional.hardtanh`, `relu6`, `selu`, `celu`, `mish`): the
//! tensor methods, or their in-place forms.

use crate::{error::Result, tensor::Tensor};

/// `f_` applied to `x` (the in-place form), returning `x`, where `inplace` asks
/// for it and autograd can record it; else `f` (a new tensor). As the
/// in-place activation modules do: where autograd records through a view or
/// a tensor with live views, which ember cannot yet write in place, the result
/// is a new tensor.
fn apply(
    x: &Tensor,
    inplace: bool,
    f: impl FnOnce(&Tensor) -> Result<Tensor>,
    f_: impl FnOnce(&Tensor) -> Result<()>,
) -> Result<Tensor> {
    if inplace && !x.inplace_blocked_by_views() {
        f_(x)?;
        Ok(x.clone())
    } else {
        f(x)
    }
}

/// [`Tensor::hardtanh`]: `x` clamped to `[min_val, max_val]`
/// (`F.hardtanh(x, min_val, max_val, inplace)`; PyTorch's defaults are -1 and
/// 1), with PyTorch's gradient (0 at the bounds).
pub fn hardtanh(x: &Tensor, min_val: f64, max_val: f64, inplace: bool) -> Result<Tensor> {
    apply(
        x,
        inplace,
        |x| x.hardtanh(min_val, max_val),
        |x| x.hardtanh_(min_val, max_val),
    )
}

/// [`Tensor::relu6`]: `min(max(x, 0), 6)` (`F.relu6(x, inplace)`).
pub fn relu6(x: &Tensor, inplace: bool) -> Result<Tensor> {
    apply(x, inplace, Tensor::relu6, Tensor::relu6_)
}

/// [`Tensor::selu`] (`F.selu(x, inplace)`).
pub fn selu(x: &Tensor, inplace: bool) -> Result<Tensor> {
    apply(x, inplace, Tensor::selu, Tensor::selu_)
}

/// [`Tensor::celu`] (`F.celu(x, alpha, inplace)`; PyTorch's default `alpha`
/// is 1).
pub fn celu(x: &Tensor, alpha: f64, inplace: bool) -> Result<Tensor> {
    apply(x, inplace, |x| x.celu(alpha), |x| x.celu_(alpha))
}

/// [`Tensor::mish`]: `x · tanh(softplus(x))` (`F.mish(x, inplace)`).
pub fn mish(x: &Tensor, inplace: bool) -> Result<Tensor> {
    apply(x, inplace, Tensor::mish, Tensor::mish_)
}
