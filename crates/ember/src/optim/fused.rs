//! The fused optimizer steps: one pass over each parameter and its state, run by
//! the parameter's device (the backend chooses the kernel).

pub(crate) use crate::backend::op::AdamStep;
use crate::backend::Storage;
use crate::{DType, Result, Tensor};

/// Whether one fused step can update `p`, `m`, `v` from `g`: all four contiguous,
/// of one float dtype (f32/f64) and size, on one device, with separate storage.
fn fusable(p: &Tensor, g: &Tensor, m: &Tensor, v: &Tensor) -> bool {
    let dt = p.dtype();
    matches!(dt, DType::F32 | DType::F64)
        && [p, g, m, v].iter().all(|t| {
            t.dtype() == dt
                && t.is_contiguous()
                && t.numel() == p.numel()
                && t.device() == p.device()
        })
        && !p.same_storage(m)
        && !p.same_storage(v)
        && !m.same_storage(v)
        && ![p, m, v].iter().any(|t| t.same_storage(g))
}

/// Applies one Adam step to `p` with gradient `g` and moments `m`, `v` in place, in
/// one pass on their device. Returns `Ok(false)` (and changes nothing) when the
/// tensors do not qualify (see [`fusable`]): the caller then uses tensor ops.
pub(crate) fn adam(p: &Tensor, g: &Tensor, m: &Tensor, v: &Tensor, h: AdamStep) -> Result<bool> {
    if !fusable(p, g, m, v) {
        return Ok(false);
    }
    let (mut ps, mut ms, mut vs) = (p.write(), m.write(), v.write());
    let gs = g.read();
    let off = |t: &Tensor| t.layout().offset();
    Storage::adam(
        (&mut ps, off(p)),
        (&gs, off(g)),
        (&mut ms, off(m)),
        (&mut vs, off(v)),
        p.numel(),
        &h,
    )?;
    Ok(true)
}
