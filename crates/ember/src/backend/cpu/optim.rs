//! The fused optimizer steps on the CPU: Adam reads and writes each element of the
//! parameter and its two moments once, instead of once per tensor op.

use crate::backend::op::AdamStep;
use crate::dtype::{CpuData, Real};
use crate::{
    dtype::{DType, WithDType},
    error::{Error, Result},
};
use rayon::prelude::*;

/// One Adam step on `n` elements of each buffer from its offset, in place on the
/// parameter `p` and the moments `m`, `v`, for the float dtypes f32 and f64.
pub(crate) fn adam(
    (pd, po): (&mut CpuData, usize),
    (gd, go): (&CpuData, usize),
    (md, mo): (&mut CpuData, usize),
    (vd, vo): (&mut CpuData, usize),
    n: usize,
    h: &AdamStep,
) -> Result<()> {
    let dt = pd.dtype();
    let done = match dt {
        DType::F32 => run::<f32>((pd, md, vd, gd), [po, go, mo, vo], n, h),
        DType::F64 => run::<f64>((pd, md, vd, gd), [po, go, mo, vo], n, h),
        _ => false,
    };
    if !done {
        return Err(Error::dtype(
            "Adam step",
            dt,
            "the fused step takes float32 or float64 operands of one dtype",
        ));
    }
    Ok(())
}

type Datas<'a> = (
    &'a mut CpuData,
    &'a mut CpuData,
    &'a mut CpuData,
    &'a CpuData,
);

fn run<T: WithDType + Real>(
    (pd, md, vd, gd): Datas,
    [po, go, mo, vo]: [usize; 4],
    n: usize,
    h: &AdamStep,
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
    let k = Consts::<T>::new(h);
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
