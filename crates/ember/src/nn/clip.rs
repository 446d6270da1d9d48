//! Gradient clipping (`torch.nn.utils.clip_grad_norm_`, `clip_grad_value_`).

use crate::{
    dtype::DType,
    error::{Error, Result},
    tensor::Tensor,
};

/// Scales the gradients of `params` together so that their joint `norm_type`-norm
/// is at most `max_norm` (`clip_grad_norm_`): each gradient is multiplied by
/// `min(1, max_norm / (total + 1e-6))`, on its device, with no host
/// synchronisation. Returns the total norm before clipping (a 0-d tensor).
/// Parameters without a gradient are skipped; with none at all the norm is 0.
/// `error_if_nonfinite` refuses a NaN or infinite total (reading it back).
pub fn clip_grad_norm_(
    params: &[Tensor],
    max_norm: f64,
    norm_type: f64,
    error_if_nonfinite: bool,
) -> Result<Tensor> {
    let _record = crate::profiler::function("clip_grad_norm_");
    crate::autograd::no_grad(|| {
        let grads: Vec<Tensor> = params.iter().filter_map(Tensor::grad).collect();
        let Some(first) = grads.first() else {
            let dev = params
                .first()
                .map(Tensor::device)
                .unwrap_or(crate::device::Device::Cpu);
            return Tensor::zeros((), DType::F32, &dev);
        };
        // on a GPU, for the 2-norm, in a few launches for all the gradients
        // (PyTorch's foreach form): each gradient's norm, their norm, the scaling
        if norm_type == 2.0 {
            if let Some(norms) = Tensor::foreach_norms(&grads)? {
                let total = norms.vector_norm(2.0, Vec::<i64>::new(), false)?;
                check_finite(&total, norm_type, error_if_nonfinite)?;
                if Tensor::foreach_clip_(&grads, &total, max_norm)? {
                    return Ok(total);
                }
                scale(&grads, &total, max_norm)?;
                return Ok(total);
            }
        }
        // the norm of the per-gradient norms is the norm of all their elements;
        // each norm is in its gradient's dtype, and they stack in the dtype
        // they promote to (PyTorch's torch.stack): float64 when a gradient is,
        // bfloat16 when all are
        let dt = grads
            .iter()
            .fold(first.dtype(), |d, g| DType::promote(d, g.dtype()));
        let norms: Vec<Tensor> = grads
            .iter()
            .map(|g| {
                g.vector_norm(norm_type, Vec::<i64>::new(), false)?
                    .to_dtype(dt)?
                    .to(&first.device())
            })
            .collect::<Result<_>>()?;
        let refs: Vec<&Tensor> = norms.iter().collect();
        let total = Tensor::stack(&refs, 0)?.vector_norm(norm_type, Vec::<i64>::new(), false)?;
        check_finite(&total, norm_type, error_if_nonfinite)?;
        scale(&grads, &total, max_norm)?;
        Ok(total)
    })
}

/// With `error_if_nonfinite`, refuses a NaN or infinite `total` (reading it back).
fn check_finite(total: &Tensor, norm_type: f64, error_if_nonfinite: bool) -> Result<()> {
    if error_if_nonfinite && !total.isfinite()?.item::<bool>()? {
        return Err(Error::invalid(
            "clip_grad_norm_",
            format!(
                "The total norm of order {norm_type} for gradients from `parameters` is non-finite, so it cannot be clipped. To disable this error and scale the gradients by the non-finite norm anyway, set `error_if_nonfinite=False`"
            ),
        ));
    }
    Ok(())
}

/// Multiplies each of `grads` in place by `min(1, max_norm / (total + 1e-6))`, one
/// by one, the coefficient in the gradient's dtype; a float16 or bfloat16
/// gradient takes it in float32, as PyTorch's product with a 0-d tensor does
/// (through a float32 copy of the gradient, one at a time, scaled in place).
fn scale(grads: &[Tensor], total: &Tensor, max_norm: f64) -> Result<()> {
    let coef = total.add(1e-6)?.recip()?.mul(max_norm)?.clamp_max(1.0)?;
    for g in grads {
        if matches!(g.dtype(), DType::F16 | DType::BF16) {
            let c = coef.to_dtype(DType::F32)?.to(&g.device())?;
            let wide = g.to_dtype(DType::F32)?;
            wide.mul_(&c)?;
            g.copy_(&wide)?;
        } else {
            g.mul_(&coef.to_dtype(g.dtype())?.to(&g.device())?)?;
        }
    }
    Ok(())
}

/// Clamps every gradient of `params` into `[-clip_value, clip_value]` in place
/// (`clip_grad_value_`).
pub fn clip_grad_value_(params: &[Tensor], clip_value: f64) -> Result<()> {
    crate::autograd::no_grad(|| {
        for g in params.iter().filter_map(Tensor::grad) {
            g.copy_(&g.clamp(Some(-clip_value), Some(clip_value))?)?;
        }
        Ok(())
    })
}
