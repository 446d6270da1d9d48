//! One-pass parameter updates for CPU tensors: Adam reads and writes each element
//! of the parameter and its two moments once, instead of once per tensor op.

pub(crate) use crate::backend::op::AdamStep;
use crate::backend::Storage;
use crate::dtype::Real;
use crate::{DType, Tensor, WithDType};
use rayon::prelude::*;

/// Whether one fused kernel can update `p`, `m`, `v` from `g`: all four contiguous,
/// of one float dtype (f32/f64) and size, on `device`, with separate storage.
fn fusable(p: &Tensor, g: &Tensor, m: &Tensor, v: &Tensor, device: crate::Device) -> bool {
    let dt = p.dtype();
    matches!(dt, DType::F32 | DType::F64)
        && [p, g, m, v].iter().all(|t| {
            t.dtype() == dt && t.is_contiguous() && t.numel() == p.numel() && t.device() == device
        })
        && !p.same_storage(m)
        && !p.same_storage(v)
        && !m.same_storage(v)
        && ![p, m, v].iter().any(|t| t.same_storage(g))
}

/// Applies one Adam step to `p` with gradient `g` and moments `m`, `v` in place,
/// when all four are contiguous CPU tensors of one float dtype (f32/f64) with
/// separate storage. Returns `false` (and changes nothing) otherwise.
pub(crate) fn adam_cpu(p: &Tensor, g: &Tensor, m: &Tensor, v: &Tensor, h: AdamStep) -> bool {
    if !fusable(p, g, m, v, crate::Device::Cpu) {
        return false;
    }
    let (mut pg, mut mg, mut vg) = (p.write(), m.write(), v.write());
    let gg = g.read();
    let (Storage::Cpu(ps), Storage::Cpu(ms), Storage::Cpu(vs), Storage::Cpu(gs)) =
        (&mut *pg, &mut *mg, &mut *vg, &*gg)
    else {
        return false;
    };
    let n = p.numel();
    let offs = [p, g, m, v].map(|t| t.layout().offset());
    match p.dtype() {
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

/// [`adam_cpu`] for CUDA tensors: one kernel updates the parameter and both
/// moments. Returns `Ok(false)` (and changes nothing) when the tensors do not
/// qualify.
pub(crate) fn adam_cuda(
    p: &Tensor,
    g: &Tensor,
    m: &Tensor,
    v: &Tensor,
    h: AdamStep,
) -> crate::Result<bool> {
    if !p.is_cuda() || !fusable(p, g, m, v, p.device()) {
        return Ok(false);
    }
    // the kernel writes p, m and v through the device pointers; read locks keep the
    // storages alive, and nothing else writes them during the step
    let (ps, gs, ms, vs) = (
        p.cuda_storage(),
        g.cuda_storage(),
        m.cuda_storage(),
        v.cuda_storage(),
    );
    let (Some(ps), Some(gs), Some(ms), Some(vs)) = (ps, gs, ms, vs) else {
        return Ok(false);
    };
    let off = |t: &Tensor| t.layout().offset();
    crate::backend::cuda::ops::adam(
        (&ps, off(p)),
        (&gs, off(g)),
        (&ms, off(m)),
        (&vs, off(v)),
        p.numel(),
        &h,
    )?;
    Ok(true)
}

type Datas<'a> = (
    &'a mut crate::dtype::CpuData,
    &'a mut crate::dtype::CpuData,
    &'a mut crate::dtype::CpuData,
    &'a crate::dtype::CpuData,
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
    let k = Consts::<T>::new(&h);
    let chunk: ChunkFn<T> = match (h.weight_decay != 0.0, h.decoupled) {
        (false, _) => adam_chunk::<T, false, false>,
        (true, false) => adam_chunk::<T, true, false>,
        (true, true) => adam_chunk::<T, true, true>,
    };
    const CHUNK: usize = 1 << 15;
    if n >= 4 * CHUNK {
        p.par_chunks_mut(CHUNK)
            .zip(m.par_chunks_mut(CHUNK))
            .zip(v.par_chunks_mut(CHUNK))
            .zip(g.par_chunks(CHUNK))
            .for_each(|(((p, m), v), g)| chunk(p, m, v, g, &k));
    } else {
        chunk(p, m, v, g, &k);
    }
    true
}

/// Updates one chunk of (parameter, first moment, second moment, gradient).
type ChunkFn<T> = fn(&mut [T], &mut [T], &mut [T], &[T], &Consts<T>);

/// The step's constants in the element type.
struct Consts<T> {
    b1: T,
    b2: T,
    one_b1: T,
    one_b2: T,
    wd: T,
    decay: T,
    sqrt_bc2: T,
    eps: T,
    step: T,
}

impl<T: Real> Consts<T> {
    fn new(h: &AdamStep) -> Consts<T> {
        let c = |x: f64| T::c(x);
        Consts {
            b1: c(h.b1),
            b2: c(h.b2),
            one_b1: c(1.0 - h.b1),
            one_b2: c(1.0 - h.b2),
            wd: c(h.weight_decay),
            decay: c(1.0 - h.lr * h.weight_decay),
            sqrt_bc2: c(h.bc2.sqrt()),
            eps: c(h.eps),
            step: c(h.lr / h.bc1),
        }
    }
}

/// One chunk, with the weight-decay variant fixed at compile time so that the
/// loop has no branches (and vectorises). The operations and their order are
/// those of the tensor-op form of `Adam::step`.
fn adam_chunk<T: Real, const WD: bool, const DECOUPLED: bool>(
    p: &mut [T],
    m: &mut [T],
    v: &mut [T],
    g: &[T],
    k: &Consts<T>,
) {
    let n = p.len();
    let (m, v, g) = (&mut m[..n], &mut v[..n], &g[..n]);
    for i in 0..n {
        let mut gi = g[i];
        let mut pi = p[i];
        if WD {
            if DECOUPLED {
                pi = pi * k.decay;
            } else {
                gi = gi + pi * k.wd;
            }
        }
        let mi = m[i] * k.b1 + gi * k.one_b1;
        let vi = v[i] * k.b2 + gi * gi * k.one_b2;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi - mi / (vi.sqrt() / k.sqrt_bc2 + k.eps) * k.step;
    }
}
