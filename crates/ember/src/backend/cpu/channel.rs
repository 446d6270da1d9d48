//! Batch normalisation's per-channel work on the CPU: statistics, the backward
//! pass's two sums, and the per-channel affine map (see `BackendStorage`'s
//! `channel_stats`, `channel_dot` and `channel_affine`). Arrays are contiguous
//! `[n, c, s]`; statistics are summed in f64 and stored in the statistics dtype.

use super::vmath::simd;
use crate::backend::host::{alloc_uninit, PAR_MIN};
use crate::dtype::{CpuData, FloatDType, Real, WithDType};
use crate::{
    dtype::DType,
    error::{Error, Result},
};
use rayon::prelude::*;

type Range = std::ops::Range<usize>;

/// A contiguous view's values: the storage's array and the view's range of it.
type Values<'a> = (&'a CpuData, Range);

/// A running statistic updated in place: its array and the element offset of
/// its `[c]` values.
type RunningArray<'a> = Option<(&'a mut CpuData, usize)>;

/// `f(ch)` for every channel, in parallel when the work is large.
fn per_channel(
    c: usize,
    work: usize,
    f: impl Fn(usize) -> (f64, f64) + Sync + Send,
) -> Vec<(f64, f64)> {
    if work >= PAR_MIN && c > 1 {
        (0..c).into_par_iter().map(f).collect()
    } else {
        (0..c).map(f).collect()
    }
}

/// `[2, c]` values (the first of each pair, then the second) in `dtype`.
fn pairs(v: Vec<(f64, f64)>, dtype: DType) -> Result<CpuData> {
    let c = v.len();
    let mut out = alloc_uninit::<f64>(2 * c)?;
    for (ch, (a, b)) in v.into_iter().enumerate() {
        out[ch] = a;
        out[c + ch] = b;
    }
    Ok(stat_values(out, dtype))
}

/// `d`'s values when they are of `_like`'s element type, else the error that an
/// operand must have the dtype `of` names.
fn same_as<'a, T: crate::dtype::CpuElem>(_like: &[T], d: &'a CpuData, of: &str) -> Result<&'a [T]> {
    T::slice(d).ok_or_else(|| {
        Error::dtype(
            "batch_norm",
            d.dtype(),
            format!("must have the {of}'s dtype"),
        )
    })
}

/// A float storage's values as f64.
fn floats(d: &CpuData, r: Range, op: &'static str) -> Result<Vec<f64>> {
    crate::dtype::dispatch_float!(d, v => Ok(v[r].iter().map(|x| x.to_f64()).collect()),
        other => Err(Error::dtype(op, other.dtype(), "needs a floating-point tensor")))
}

/// Lanes of independent float64 partial sums in the per-channel loops: a chain
/// of dependent additions would wait on each one's latency, and eight lanes fill
/// an AVX-512 register of f64.
const LANES: usize = 8;

/// `(Σ f(i).0, Σ f(i).1)` over `0..len`: in [`LANES`] interleaved lanes (element
/// `i` into lane `i % LANES`) added lane by lane at the end, with the CPU's
/// vector instructions, or for fewer than `4 · LANES` elements (short planes,
/// single elements where a tensor is channels-last: lanes would cost more than
/// they save) in order. The same order on every run.
#[inline(always)]
fn plane_sums(len: usize, f: impl Fn(usize) -> (f64, f64)) -> (f64, f64) {
    if len < 4 * LANES {
        let (mut a, mut b) = (0.0, 0.0);
        for i in 0..len {
            let (u, v) = f(i);
            a += u;
            b += v;
        }
        return (a, b);
    }
    simd(
        #[inline(always)]
        || {
            let (mut a, mut b) = ([0f64; LANES], [0f64; LANES]);
            let full = len / LANES * LANES;
            for i in (0..full).step_by(LANES) {
                for l in 0..LANES {
                    let (u, v) = f(i + l);
                    a[l] += u;
                    b[l] += v;
                }
            }
            for (l, i) in (full..len).enumerate() {
                let (u, v) = f(i);
                a[l] += u;
                b[l] += v;
            }
            (a.iter().sum(), b.iter().sum())
        },
    )
}

/// Each channel's mean and biased variance.
pub(crate) fn stats(
    x: (&CpuData, Range),
    (n, c, s): (usize, usize, usize),
    out: DType,
) -> Result<CpuData> {
    fn go<T: FloatDType>(x: &[T], (n, c, s): (usize, usize, usize)) -> Vec<(f64, f64)> {
        let count = (n * s) as f64;
        per_channel(c, x.len(), |ch| {
            if n * s == 0 {
                return (f64::NAN, f64::NAN);
            }
            // sums of the values less the channel's first: the variance's
            // subtraction keeps its digits
            let k = x[ch * s].to_acc().to_f64();
            let (mut s1, mut s2) = (0.0, 0.0);
            for b in 0..n {
                let plane = &x[(b * c + ch) * s..][..s];
                let (p1, p2) = plane_sums(s, |i| {
                    let d = plane[i].to_acc().to_f64() - k;
                    (d, d * d)
                });
                s1 += p1;
                s2 += p2;
            }
            (k + s1 / count, (s2 - s1 * s1 / count) / count)
        })
    }
    let v = crate::dtype::dispatch_float!(x.0, v => go(&v[x.1], (n, c, s)),
        other => return Err(Error::dtype("batch_norm", other.dtype(), "needs a floating-point tensor")));
    pairs(v, out)
}

/// Per channel, `Σ g` and `Σ g · (x - mean)`; with `mask` (a batch norm's output
/// through its ReLU), `g` only where the mask is above 0.
pub(crate) fn dot(
    (g, mask): (Values, Option<Values>),
    x: Values,
    mean: Values,
    (n, c, s): (usize, usize, usize),
    out: DType,
) -> Result<CpuData> {
    fn go<T: FloatDType>(
        (g, y): (&[T], Option<&[T]>),
        x: &[T],
        mean: &[f64],
        (n, c, s): (usize, usize, usize),
    ) -> Vec<(f64, f64)> {
        per_channel(c, g.len(), |ch| {
            let m = mean[ch];
            let (mut s1, mut s2) = (0.0, 0.0);
            for b in 0..n {
                let at = (b * c + ch) * s;
                let (gp, xp) = (&g[at..at + s], &x[at..at + s]);
                let (p1, p2) = match y {
                    None => plane_sums(s, |i| {
                        let gv = gp[i].to_acc().to_f64();
                        (gv, gv * (xp[i].to_acc().to_f64() - m))
                    }),
                    Some(y) => {
                        let yp = &y[at..at + s];
                        plane_sums(s, |i| {
                            let gv = if yp[i].to_acc().to_f64() > 0.0 {
                                gp[i].to_acc().to_f64()
                            } else {
                                0.0
                            };
                            (gv, gv * (xp[i].to_acc().to_f64() - m))
                        })
                    }
                };
                s1 += p1;
                s2 += p2;
            }
            (s1, s2)
        })
    }
    let mean = floats(mean.0, mean.1, "batch_norm")?;
    let v = crate::dtype::dispatch_float!(g.0, gv => {
        let xv = same_as(gv, x.0, "gradient")?;
        let yv = mask.map(|(d, r)| Ok::<_, Error>(&same_as(gv, d, "gradient")?[r])).transpose()?;
        go((&gv[g.1], yv), &xv[x.1], &mean, (n, c, s))
    }, other => return Err(Error::dtype("batch_norm", other.dtype(), "needs a floating-point tensor")));
    pairs(v, out)
}

/// `dst = p · a + d` (with `q`: `p · a + d + q · b`) over a run of elements,
/// each with its `(a, d, b)` from `coefs`, in the accumulation type; with `mask`
/// `p` counts where the mask is above 0, and with `relu` what is not above 0
/// becomes 0 (NaN stays).
#[inline(always)]
fn affine_run<T: FloatDType>(
    dst: &mut [T],
    (p, mask): (&[T], Option<&[T]>),
    (q, relu): (Option<&[T]>, bool),
    coefs: impl Iterator<Item = (T::Acc, T::Acc, T::Acc)>,
) {
    let z = <T::Acc as Real>::c(0.0);
    let act = |v: T::Acc| if relu && v <= z { z } else { v };
    match (q, mask) {
        (Some(q), None) => {
            for (((o, x), y), (a, d, b)) in dst.iter_mut().zip(p).zip(q).zip(coefs) {
                *o = T::from_acc(act(x.to_acc() * a + d + y.to_acc() * b));
            }
        }
        (None, None) => {
            for ((o, x), (a, d, _)) in dst.iter_mut().zip(p).zip(coefs) {
                *o = T::from_acc(act(x.to_acc() * a + d));
            }
        }
        (q, Some(m)) => {
            for (i, (o, (a, d, b))) in dst.iter_mut().zip(coefs).enumerate() {
                let x = if m[i].to_acc() > z { p[i].to_acc() } else { z };
                let v = match q {
                    Some(q) => x * a + d + q[i].to_acc() * b,
                    None => x * a + d,
                };
                *o = T::from_acc(act(v));
            }
        }
    }
}

/// `p · a + d` (with `q`: `p · a + q · b + d`, or with two rows of coefficients
/// `p · a + d + q`) per channel, computed in f32 (f64 when `stat` is f64), the
/// output in `p`'s dtype; with `relu` through a ReLU,
/// and with `mask` (a batch norm's output through its ReLU) `p` only where the
/// mask is above 0.
pub(crate) fn affine(
    (p, mask): (Values, Option<Values>),
    q: Option<Values>,
    coefs: Values,
    (c, s): (usize, usize),
    relu: bool,
) -> Result<CpuData> {
    fn go<T: FloatDType>(
        (p, mask): (&[T], Option<&[T]>),
        q: Option<&[T]>,
        coefs: &[f64],
        (c, s): (usize, usize),
        relu: bool,
    ) -> Result<CpuData> {
        // the GPU's arithmetic: in f32 (f64 for f64), the statistics dtype
        let k = coefs.len() / c.max(1);
        let mut out = alloc_uninit::<T>(p.len())?;
        if s == 0 || c == 0 {
            return Ok(T::wrap(out));
        }
        let acc = <T::Acc as Real>::c;
        let row = |r: usize| -> Vec<T::Acc> { (0..c).map(|ch| acc(coefs[r * c + ch])).collect() };
        let (a, d) = (row(0), row(k - 1));
        // (with `q` and two rows, `q` is a residual added as it is)
        let b = match (k, q) {
            (3, _) => row(1),
            (_, Some(_)) => vec![acc(1.0); c],
            _ => vec![acc(0.0); c],
        };
        // runs of elements: a plane (one channel's coefficients), or where planes
        // are single elements a row across the channels (each its own)
        let span = if s == 1 { c } else { s };
        let spans = (16384 / span).max(1);
        let run = |(i, dst): (usize, &mut [T])| {
            for (j, seg) in dst.chunks_mut(span).enumerate() {
                let at = (i * spans + j) * span;
                let src = &p[at..at + seg.len()];
                let ms = mask.map(|m| &m[at..at + seg.len()]);
                let qs = q.map(|q| &q[at..at + seg.len()]);
                simd(
                    #[inline(always)]
                    || {
                        if s == 1 {
                            let per_channel =
                                a.iter().zip(&d).zip(&b).map(|((a, d), b)| (*a, *d, *b));
                            affine_run(seg, (src, ms), (qs, relu), per_channel);
                        } else {
                            let ch = (at / s) % c;
                            let per_channel = std::iter::repeat((a[ch], d[ch], b[ch]));
                            affine_run(seg, (src, ms), (qs, relu), per_channel);
                        }
                    },
                )
            }
        };
        if p.len() >= PAR_MIN {
            out.par_chunks_mut(span * spans).enumerate().for_each(run);
        } else {
            out.chunks_mut(span * spans).enumerate().for_each(run);
        }
        Ok(T::wrap(out))
    }
    let coefs = floats(coefs.0, coefs.1, "batch_norm")?;
    crate::dtype::dispatch_float!(p.0, pv => {
        let qv = q.map(|(qd, qr)| Ok::<_, Error>(&same_as(pv, qd, "input")?[qr])).transpose()?;
        let mv = mask.map(|(yd, yr)| Ok::<_, Error>(&same_as(pv, yd, "input")?[yr])).transpose()?;
        go((&pv[p.1], mv), qv, &coefs, (c, s), relu)
    }, other => Err(Error::dtype("batch_norm", other.dtype(), "needs a floating-point tensor")))
}

/// `v` in `dtype` (the statistics dtype: float32 or float64), rounded once.
fn stat_values(v: Vec<f64>, dtype: DType) -> CpuData {
    match dtype {
        DType::F64 => CpuData::F64(v),
        _ => CpuData::F32(v.into_iter().map(|x| x as f32).collect()),
    }
}

/// A per-channel operand: `[c]` values as f64, or `missing` for each channel
/// where it is absent.
fn channel_values(v: Option<Values>, c: usize, missing: f64) -> Result<Vec<f64>> {
    match v {
        Some((d, r)) => floats(d, r, "batch_norm"),
        None => Ok(vec![missing; c]),
    }
}

/// `running[at..at + new.len()] = (1 - m) · running + m · new`, in f64 and rounded
/// once to the running array's float dtype.
fn move_towards(running: &mut CpuData, at: usize, new: &[f64], m: f64) -> Result<()> {
    fn go<T: FloatDType>(r: &mut [T], new: &[f64], m: f64) {
        for (r, &x) in r.iter_mut().zip(new) {
            *r = T::from_f64((1.0 - m) * r.to_f64() + m * x);
        }
    }
    let n = new.len();
    match running {
        CpuData::F32(r) => go(&mut r[at..at + n], new, m),
        CpuData::F64(r) => go(&mut r[at..at + n], new, m),
        other => {
            return Err(Error::dtype(
                "batch_norm",
                other.dtype(),
                "running statistics updated with the coefficients must be in the statistics dtype",
            ))
        }
    }
    Ok(())
}

/// Batch normalisation's forward coefficients (`BackendStorage::batch_norm_coefs`):
/// `[3, c]` rows `a`, `d` and the inverse standard deviation in `dtype`, and the
/// running statistics moved towards `mean` and `var` (`unbiased` times it), each
/// `(array, offset)` where given.
pub(crate) fn coefs(
    (mean, var): (Values, Values),
    (weight, bias): (Option<Values>, Option<Values>),
    running: (RunningArray, RunningArray),
    (eps, momentum, unbiased): (f64, f64, f64),
    dtype: DType,
) -> Result<CpuData> {
    let c = mean.1.len();
    let (mean, var) = (
        floats(mean.0, mean.1, "batch_norm")?,
        floats(var.0, var.1, "batch_norm")?,
    );
    let (w, b) = (
        channel_values(weight, c, 1.0)?,
        channel_values(bias, c, 0.0)?,
    );
    let mut out = vec![0f64; 3 * c];
    for ch in 0..c {
        let invstd = 1.0 / (var[ch] + eps).sqrt();
        let a = w[ch] * invstd;
        out[ch] = a;
        out[c + ch] = b[ch] - mean[ch] * a;
        out[2 * c + ch] = invstd;
    }
    if let Some((r, at)) = running.0 {
        move_towards(r, at, &mean, momentum)?;
    }
    if let Some((r, at)) = running.1 {
        let var: Vec<f64> = var.iter().map(|v| v * unbiased).collect();
        move_towards(r, at, &var, momentum)?;
    }
    Ok(stat_values(out, dtype))
}

/// Batch normalisation's backward coefficients
/// (`BackendStorage::batch_norm_grad_coefs`): `[3, c]` rows `k`, `b`, `d` in
/// `dtype`, and with `weight_grad` the weight's gradient `[c]`.
pub(crate) fn grad_coefs(
    (sums, mean, invstd): (Values, Values, Values),
    weight: Option<Values>,
    (count, weight_grad): (Option<f64>, bool),
    dtype: DType,
) -> Result<(CpuData, Option<CpuData>)> {
    let c = mean.1.len();
    let sums = floats(sums.0, sums.1, "batch_norm")?;
    let (mean, iv) = (
        floats(mean.0, mean.1, "batch_norm")?,
        floats(invstd.0, invstd.1, "batch_norm")?,
    );
    let w = channel_values(weight, c, 1.0)?;
    let (sum_g, sum_gx) = sums.split_at(c);
    let mut out = vec![0f64; 3 * c];
    for ch in 0..c {
        let k = w[ch] * iv[ch];
        out[ch] = k;
        if let Some(m) = count {
            // dx = k (g - Σg/m - (x - mean) invstd² Σg(x - mean)/m)
            let b = -k * iv[ch] * iv[ch] * sum_gx[ch] / m;
            out[c + ch] = b;
            out[2 * c + ch] = -k * sum_g[ch] / m - mean[ch] * b;
        }
    }
    let gw = weight_grad.then(|| {
        let gw = sum_gx.iter().zip(&iv).map(|(s, iv)| s * iv).collect();
        stat_values(gw, dtype)
    });
    Ok((stat_values(out, dtype), gw))
}
