//! One-pass parameter updates for CPU tensors: Adam reads and writes each element
//! of the parameter and its two moments once, instead of once per tensor op.

use crate::backend::Storage;
use crate::dtype::Real;
use crate::{DType, Tensor, WithDType};
use rayon::prelude::*;

/// Adam's constants for one step.
#[derive(Clone, Copy)]
pub(crate) struct AdamStep {
    pub lr: f64,
    pub b1: f64,
    pub b2: f64,
    pub eps: f64,
    /// Bias corrections `1 - b1^t`, `1 - b2^t`.
    pub bc1: f64,
    pub bc2: f64,
    pub weight_decay: f64,
    pub decoupled: bool,
}

/// Applies one Adam step to `p` with gradient `g` and moments `m`, `v` in place,
/// when all four are contiguous CPU tensors of one float dtype (f32/f64) with
/// separate storage. Returns `false` (and changes nothing) otherwise.
pub(crate) fn adam_cpu(p: &Tensor, g: &Tensor, m: &Tensor, v: &Tensor, h: AdamStep) -> bool {
    let all = [p, g, m, v];
    let dt = p.dtype();
    let eligible = matches!(dt, DType::F32 | DType::F64)
        && all.iter().all(|t| {
            t.dtype() == dt && t.is_contiguous() && t.numel() == p.numel() && !t.is_cuda()
        })
        && !p.same_storage(m)
        && !p.same_storage(v)
        && !m.same_storage(v)
        && ![p, m, v].iter().any(|t| t.same_storage(g));
    if !eligible {
        return false;
    }
    let (mut pg, mut mg, mut vg) = (p.write(), m.write(), v.write());
    let gg = g.read();
    let (Storage::Cpu(ps), Storage::Cpu(ms), Storage::Cpu(vs), Storage::Cpu(gs)) =
        (&mut *pg, &mut *mg, &mut *vg, &*gg);
    let n = p.numel();
    let offs = [p, g, m, v].map(|t| t.layout().offset());
    match dt {
        DType::F32 => run::<f32>(
            (ps.data_mut(), ms.data_mut(), vs.data_mut(), gs.data()),
            offs,
            n,
            h,
        ),
        _ => run::<f64>(
            (ps.data_mut(), ms.data_mut(), vs.data_mut(), gs.data()),
            offs,
            n,
            h,
        ),
    }
}

type Datas<'a> = (
    &'a mut crate::backend::cpu::CpuData,
    &'a mut crate::backend::cpu::CpuData,
    &'a mut crate::backend::cpu::CpuData,
    &'a crate::backend::cpu::CpuData,
);

fn run<T: WithDType + Real>(
    (pd, md, vd, gd): Datas,
    [po, go, mo, vo]: [usize; 4],
    n: usize,
    h: AdamStep,
) -> bool {
    let (Some(p), Some(m), Some(v), Some(g)) = (
        T::slice_mut(pd),
        T::slice_mut(md),
        T::slice_mut(vd),
        T::slice(gd),
    ) else {
        return false;
    };
    let (p, m, v, g) = (
        &mut p[po..po + n],
        &mut m[mo..mo + n],
        &mut v[vo..vo + n],
        &g[go..go + n],
    );
    let c = |x: f64| T::c(x);
    let (b1, b2, one_b1, one_b2) = (c(h.b1), c(h.b2), c(1.0 - h.b1), c(1.0 - h.b2));
    let (wd, decay) = (c(h.weight_decay), c(1.0 - h.lr * h.weight_decay));
    let (sqrt_bc2, eps, step) = (c(h.bc2.sqrt()), c(h.eps), c(h.lr / h.bc1));
    let (use_wd, decoupled) = (h.weight_decay != 0.0, h.decoupled);
    // the same operations, in the same order, as the tensor-op form of Adam::step
    let update = |(((p, m), v), &g): (((&mut T, &mut T), &mut T), &T)| {
        let mut g = g;
        if use_wd {
            if decoupled {
                *p = *p * decay;
            } else {
                g = g + *p * wd;
            }
        }
        *m = *m * b1 + g * one_b1;
        *v = *v * b2 + g * g * one_b2;
        let denom = v.sqrt() / sqrt_bc2 + eps;
        *p = *p - *m / denom * step;
    };
    const CHUNK: usize = 1 << 15;
    if n >= 4 * CHUNK {
        p.par_chunks_mut(CHUNK)
            .zip(m.par_chunks_mut(CHUNK))
            .zip(v.par_chunks_mut(CHUNK))
            .zip(g.par_chunks(CHUNK))
            .for_each(|(((p, m), v), g)| {
                p.iter_mut()
                    .zip(m.iter_mut())
                    .zip(v.iter_mut())
                    .zip(g)
                    .for_each(update)
            });
    } else {
        p.iter_mut()
            .zip(m.iter_mut())
            .zip(v.iter_mut())
            .zip(g)
            .for_each(update);
    }
    true
}
