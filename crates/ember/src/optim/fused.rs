//! The fused optimizer steps: one pass over each parameter and its state, run by
//! the parameter's device (the backend chooses the kernel).

pub(crate) use crate::backend::op::{AdamStep, SgdStep};
use crate::backend::{AdamOperands, SgdOperands, Storage};
use crate::{device::Device, dtype::DType, error::Result, tensor::Tensor};

/// Whether one fused step can update `p`, `m`, `v` from `g`: all four dense with
/// one set of strides (row-major, or channels-last parameters and their state), of
/// one float dtype (f32/f64) and size, on one device, with separate storage.
fn fusable(p: &Tensor, g: &Tensor, m: &Tensor, v: &Tensor) -> bool {
    let dt = p.dtype();
    let dense = p.is_contiguous() || p.layout().is_non_overlapping_and_dense();
    matches!(dt, DType::F32 | DType::F64)
        && dense
        && [p, g, m, v].iter().all(|t| {
            t.dtype() == dt
                && (t.is_contiguous() && p.is_contiguous() || t.stride() == p.stride())
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

/// Adam steps for many parameters at once on a GPU (PyTorch's `foreach` form, its
/// default on CUDA): the `(p, g, m, v)` of `items` that qualify (see [`fusable`];
/// each storage in one item only) are updated by one launch per 48 tensors of a
/// device and dtype, with the arithmetic of [`adam`] (the same bits). With `step`
/// (the capturable form's count: a float64 scalar on the GPU, advanced by the
/// caller) the kernels take the bias corrections from it, so that a captured
/// step replays right. Returns which items were updated; the caller steps the
/// others one by one.
pub(crate) fn adam_foreach(
    items: &[[&Tensor; 4]],
    h: AdamStep,
    step: Option<&Tensor>,
) -> Result<Vec<bool>> {
    let mut done = vec![false; items.len()];
    // a storage locked twice would deadlock: each may appear once
    let mut seen = std::collections::HashSet::new();
    let mut groups: Vec<((Device, DType), Vec<usize>)> = Vec::new();
    for (i, &[p, g, m, v]) in items.iter().enumerate() {
        if !matches!(p.device(), Device::Cuda(_)) || !fusable(p, g, m, v) {
            continue;
        }
        let keys = [p, g, m, v].map(Tensor::storage_key);
        if keys.iter().any(|k| seen.contains(k)) {
            continue;
        }
        seen.extend(keys);
        let key = (p.device(), p.dtype());
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, members)) => members.push(i),
            None => groups.push((key, vec![i])),
        }
    }
    let step = match step {
        // the kernel reads the count at the start of its storage
        Some(t) if t.dtype() == DType::F64 && t.numel() == 1 && t.layout().offset() == 0 => {
            // a count that shares a storage with an item would be locked twice
            if seen.contains(&t.storage_key()) {
                return Ok(done);
            }
            let dev = t.device();
            groups.retain(|((d, _), _)| *d == dev);
            Some(t)
        }
        Some(_) => return Ok(done),
        None => None,
    };
    let step_guard = step.map(|t| t.read());
    for (_, members) in groups {
        let write = |k: usize| -> Vec<_> { members.iter().map(|&i| items[i][k].write()).collect() };
        let (mut ps, mut ms, mut vs) = (write(0), write(2), write(3));
        let gs: Vec<_> = members.iter().map(|&i| items[i][1].read()).collect();
        let off = |t: &Tensor| t.layout().offset();
        let mut ops: Vec<AdamOperands<'_>> = ps
            .iter_mut()
            .zip(gs.iter())
            .zip(ms.iter_mut().zip(vs.iter_mut()))
            .zip(&members)
            .map(|(((p, g), (m, v)), &i)| {
                let [tp, tg, tm, tv] = items[i];
                AdamOperands {
                    p: (&mut **p, off(tp)),
                    g: (&**g, off(tg)),
                    m: (&mut **m, off(tm)),
                    v: (&mut **v, off(tv)),
                    n: tp.numel(),
                }
            })
            .collect();
        if Storage::adam_foreach(&mut ops, &h, step_guard.as_deref())? {
            for &i in &members {
                done[i] = true;
            }
        }
    }
    Ok(done)
}

/// One parameter of [`sgd_foreach`]: the parameter, its gradient, and its momentum
/// buffer (without momentum, none) with whether this is the buffer's first step.
pub(crate) type SgdItem<'a> = (&'a Tensor, &'a Tensor, Option<(&'a Tensor, bool)>);

/// Whether [`sgd_foreach`] can step all of `items`: on one GPU (or `meta`, which
/// stands for one), f32 or f64, every tensor dense, of its parameter's dtype and
/// size and in its parameter's order (all row-major, or one set of strides: a
/// channels-last weight with its gradient and momentum), and every storage in one
/// place only.
pub(crate) fn sgd_fusable(items: &[SgdItem<'_>]) -> bool {
    let tensors = items
        .iter()
        .flat_map(|&(p, g, buf)| [Some(p), Some(g), buf.map(|b| b.0)])
        .flatten();
    let alike = |p: &Tensor, t: &Tensor| {
        t.numel() == p.numel()
            && (p.is_contiguous() && t.is_contiguous() || t.stride() == p.stride())
    };
    Tensor::foreach_ready(tensors)
        && items
            .iter()
            .all(|&(p, g, buf)| alike(p, g) && buf.is_none_or(|(b, _)| alike(p, b)))
}

/// One SGD step over `items` (checked by [`sgd_fusable`]) in multi-tensor launches
/// of up to 48 parameters each; on `meta`, nothing to do but record it.
pub(crate) fn sgd_foreach(items: &[SgdItem<'_>], h: SgdStep) -> Result<()> {
    let mut ps: Vec<_> = items.iter().map(|(p, ..)| p.write()).collect();
    let gs: Vec<_> = items.iter().map(|(_, g, _)| g.read()).collect();
    let mut bufs: Vec<_> = items
        .iter()
        .map(|(.., b)| b.map(|(b, first)| (b.write(), b.layout().offset(), first)))
        .collect();
    let mut ops: Vec<SgdOperands<'_>> = ps
        .iter_mut()
        .zip(gs.iter())
        .zip(bufs.iter_mut())
        .zip(items)
        .map(|(((p, g), b), &(tp, tg, _))| SgdOperands {
            p: (&mut **p, tp.layout().offset()),
            g: (&**g, tg.layout().offset()),
            buf: b.as_mut().map(|(b, off, first)| (&mut **b, *off, *first)),
            n: tp.numel(),
        })
        .collect();
    Storage::sgd_foreach(&mut ops, &h)
}
