//! 2-D convolution (im2col + gemm per sample and group) and 2-D pooling, for
//! contiguous NCHW f32/f64 inputs.

use crate::backend::host::{alloc_filled, alloc_uninit, host_oom, try_resize};
use crate::backend::op::{ConvShape, Pool, Window};
use crate::dtype::Real;
use crate::{dtype::WithDType, error::Result};
use gemm::Parallelism;
use rayon::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};

/// The range of `o` in `0..count` for which `o * stride + offset` lies in `0..size`.
#[inline]
fn span(offset: isize, stride: usize, size: usize, count: usize) -> (usize, usize) {
    let st = stride as isize;
    let lo = if offset >= 0 {
        0
    } else {
        ((-offset + st - 1) / st) as usize
    };
    let end = size as isize - offset; // o * stride < end
    let hi = if end <= 0 {
        0
    } else {
        ((end + st - 1) / st) as usize
    };
    (lo.min(count), hi.min(count).max(lo.min(count)))
}

/// One kernel tap (`ki`, `kj`) of one channel `ci` of a group, as im2col lays it
/// out: row `row` of the columns (`[cg*kh*kw, oh*ow]`); the output rows `ys` and
/// columns `xs` whose input lies inside the image (the rest is padding); the
/// input row of output row `oy` in `ys` ([`Tap::iy`]) and the input column of
/// output column `xs.start` (`ix0`, where `xs` is not empty).
struct Tap {
    ci: usize,
    row: usize,
    ys: std::ops::Range<usize>,
    xs: std::ops::Range<usize>,
    /// `oy * stride + yoff` is output row `oy`'s input row
    yoff: isize,
    stride: usize,
    ix0: usize,
}

impl Tap {
    /// The input row of output row `oy` (one of `ys`).
    fn iy(&self, oy: usize) -> usize {
        ((oy * self.stride) as isize + self.yoff) as usize
    }
}

/// Every tap of channels `0..cg` of a group, in im2col's row order.
fn conv_taps(s: &ConvShape, cg: usize) -> impl Iterator<Item = Tap> + '_ {
    let Window {
        kernel: (kh, kw),
        stride: (sh, sw),
        padding: (ph, pw),
        dilation: (dh, dw),
    } = s.win;
    (0..cg * kh * kw).map(move |row| {
        let (ci, ki, kj) = (row / (kh * kw), row / kw % kh, row % kw);
        let yoff = (ki * dh) as isize - ph as isize;
        let (y_lo, y_hi) = span(yoff, sh, s.h, s.oh);
        let xoff = (kj * dw) as isize - pw as isize;
        let (x_lo, x_hi) = span(xoff, sw, s.w, s.ow);
        Tap {
            ci,
            row,
            ys: y_lo..y_hi,
            xs: x_lo..x_hi,
            yoff,
            stride: sh,
            // in the image wherever `xs` is not empty
            ix0: (x_lo as isize * sw as isize + xoff).max(0) as usize,
        }
    })
}

/// Fills `col` ([cg*kh*kw, oh*ow]) with the input patches of channels `c0..c0+cg`.
fn im2col<T: Copy + Default>(x: &[T], s: &ConvShape, c0: usize, cg: usize, col: &mut [T]) {
    let (p, sw) = (s.oh * s.ow, s.win.stride.1);
    for t in conv_taps(s, cg) {
        let plane = &x[(c0 + t.ci) * s.h * s.w..(c0 + t.ci + 1) * s.h * s.w];
        let row = &mut col[t.row * p..][..p];
        row[..t.ys.start * s.ow].fill(T::default());
        row[t.ys.end * s.ow..].fill(T::default());
        for oy in t.ys.clone() {
            let iy = t.iy(oy);
            let src = &plane[iy * s.w..(iy + 1) * s.w];
            let dst = &mut row[oy * s.ow..(oy + 1) * s.ow];
            dst[..t.xs.start].fill(T::default());
            dst[t.xs.end..].fill(T::default());
            if t.xs.is_empty() {
                continue;
            }
            if sw == 1 {
                dst[t.xs.clone()].copy_from_slice(&src[t.ix0..t.ix0 + t.xs.len()]);
            } else {
                for (d, v) in dst[t.xs.clone()]
                    .iter_mut()
                    .zip(src[t.ix0..].iter().step_by(sw))
                {
                    *d = *v;
                }
            }
        }
    }
}

/// `out = conv2d(x, weight) + bias`, x: [n,c,h,w], weight: [o, c/groups, kh, kw].
pub(crate) fn conv2d<T>(x: &[T], weight: &[T], bias: Option<&[T]>, s: &ConvShape) -> Result<Vec<T>>
where
    T: WithDType + Real,
{
    let (kh, kw) = s.win.kernel;
    let (cg, og) = (s.c / s.groups, s.o / s.groups);
    let kk = cg * kh * kw;
    let p = s.oh * s.ow;
    let mut out = alloc_uninit::<T>(s.n * s.o * p)?;
    if p == 0 || s.n == 0 {
        return Ok(out);
    }
    // set when a thread cannot get memory for its columns; the samples left are skipped
    let no_memory = AtomicBool::new(false);
    let direct = kh == 1 && kw == 1 && s.win.stride == (1, 1) && s.win.padding == (0, 0);
    let big = og * kk * p >= 64 * 64 * 64;
    // one sample: im2col + gemm per group, then bias
    let sample = |ni: usize, dst: &mut [T], col: &mut Vec<T>, par: Parallelism| {
        let xs = &x[ni * s.c * s.h * s.w..(ni + 1) * s.c * s.h * s.w];
        for g in 0..s.groups {
            let rhs: &[T] = if direct {
                &xs[g * cg * p..(g + 1) * cg * p]
            } else {
                if no_memory.load(Ordering::Relaxed)
                    || try_resize(col, kk * p, T::default()).is_err()
                {
                    no_memory.store(true, Ordering::Relaxed);
                    return;
                }
                im2col(xs, s, g * cg, cg, col);
                col
            };
            let w = &weight[g * og * kk..(g + 1) * og * kk];
            let d = &mut dst[g * og * p..(g + 1) * og * p];
            if kk == 0 {
                d.fill(T::zero());
                continue;
            }
            // SAFETY: w is [og, kk], rhs is [kk, p], d is [og, p], all row-major.
            unsafe {
                gemm::gemm(
                    og,
                    p,
                    kk,
                    d.as_mut_ptr(),
                    1,
                    p as isize,
                    false,
                    w.as_ptr(),
                    1,
                    kk as isize,
                    rhs.as_ptr(),
                    1,
                    p as isize,
                    T::zero(),
                    T::one(),
                    false,
                    false,
                    false,
                    par,
                )
            }
        }
        if let Some(b) = bias {
            for (oc, plane) in dst.chunks_mut(p).enumerate() {
                let v = b[oc];
                plane.iter_mut().for_each(|y| *y = *y + v);
            }
        }
    };
    if s.n > 1 && (!big || s.n >= rayon::current_num_threads()) {
        out.par_chunks_mut(s.o * p)
            .enumerate()
            .for_each_init(Vec::new, |col, (ni, dst)| {
                sample(ni, dst, col, Parallelism::None)
            });
    } else {
        let mut col = Vec::new();
        let par = if big {
            Parallelism::Rayon(0)
        } else {
            Parallelism::None
        };
        for (ni, dst) in out.chunks_mut(s.o * p).enumerate() {
            sample(ni, dst, &mut col, par);
        }
    }
    if no_memory.into_inner() {
        return Err(host_oom((kk * p).saturating_mul(std::mem::size_of::<T>())));
    }
    Ok(out)
}

/// The window positions `k` in `0..kernel` with `start + k * dilation` in `0..size`.
#[inline]
fn taps(start: isize, kernel: usize, dilation: usize, size: usize) -> std::ops::Range<usize> {
    let (lo, hi) = span(start, dilation, size, kernel);
    lo..hi
}

/// Pools each of `planes` planes of size h×w into oh×ow. For max pooling with
/// `want_index`, also returns the position in its window of each output's
/// element (the first largest, or the first NaN), for the backward pass.
#[allow(clippy::too_many_arguments)]
/// The index's element type `I` is u8 or int64 (a window's positions as
/// [`PoolShape::index_dtype`](crate::backend::op::PoolShape::index_dtype) picks).
pub(crate) fn pool2d<T: WithDType + Real, I: WithDType>(
    x: &[T],
    planes: usize,
    (h, w): (usize, usize),
    (oh, ow): (usize, usize),
    win: Window,
    kind: Pool,
    want_index: bool,
) -> Result<(Vec<T>, Option<Vec<I>>)> {
    let Window {
        kernel: (kh, kw),
        stride: (sh, sw),
        padding: (ph, pw),
        dilation: (dh, dw),
    } = win;
    let want_index = want_index && kind == Pool::Max;
    let mut out = alloc_uninit::<T>(planes * oh * ow)?;
    // from the pool, as the next step's index is the same size: the index goes
    // back to the pool with its tensor
    let mut index = if want_index {
        alloc_filled(planes * oh * ow, I::from_f64(0.0))?
    } else {
        Vec::new()
    };
    if oh * ow == 0 {
        return Ok((out, want_index.then_some(index)));
    }
    let plane_out = |pi: usize, dst: &mut [T], idx: &mut [I]| {
        let plane = &x[pi * h * w..(pi + 1) * h * w];
        for oy in 0..oh {
            let y0 = (oy * sh) as isize - ph as isize;
            let ky = taps(y0, kh, dh, h);
            for ox in 0..ow {
                let x0 = (ox * sw) as isize - pw as isize;
                let kx = taps(x0, kw, dw, w);
                let at = |ki: usize, kj: usize| {
                    (y0 + (ki * dh) as isize) as usize * w + (x0 + (kj * dw) as isize) as usize
                };
                let o = oy * ow + ox;
                match kind {
                    Pool::Max if ky.is_empty() || kx.is_empty() => {
                        dst[o] = T::neg_infinity();
                    }
                    Pool::Max => {
                        let mut m = T::neg_infinity();
                        let mut best = ky.start * kw + kx.start;
                        'win: for ki in ky.clone() {
                            for kj in kx.clone() {
                                let v = plane[at(ki, kj)];
                                if v > m || v.is_nan() {
                                    m = v;
                                    best = ki * kw + kj;
                                    if v.is_nan() {
                                        break 'win;
                                    }
                                }
                            }
                        }
                        dst[o] = m;
                        if want_index {
                            idx[o] = I::from_f64(best as f64);
                        }
                    }
                    Pool::Avg { count_include_pad } => {
                        let mut sum = T::zero();
                        for ki in ky.clone() {
                            for kj in kx.clone() {
                                sum = sum + plane[at(ki, kj)];
                            }
                        }
                        let div = if count_include_pad {
                            let ye = (y0 + kh as isize).min((h + ph) as isize);
                            let xe = (x0 + kw as isize).min((w + pw) as isize);
                            (ye - y0) * (xe - x0)
                        } else {
                            (ky.len() * kx.len()) as isize
                        };
                        dst[o] = sum / T::c(div as f64);
                    }
                }
            }
        }
    };
    if want_index {
        out.par_chunks_mut(oh * ow)
            .zip(index.par_chunks_mut(oh * ow))
            .enumerate()
            .for_each(|(pi, (dst, idx))| plane_out(pi, dst, idx));
    } else {
        out.par_chunks_mut(oh * ow)
            .enumerate()
            .for_each(|(pi, dst)| plane_out(pi, dst, &mut []));
    }
    Ok((out, want_index.then_some(index)))
}

/// The gradient of [`pool2d`] with respect to its input: max pooling sends each
/// output's gradient to the element of its window `index` recorded in the forward
/// pass, average pooling spreads it over the window with the forward pass's
/// divisor; each element sums its shares in the order of the outputs.
#[allow(clippy::too_many_arguments)]
pub(crate) fn pool2d_backward<T: WithDType + Real + std::ops::AddAssign, I: WithDType>(
    g: &[T],
    index: Option<&[I]>,
    planes: usize,
    (h, w): (usize, usize),
    (oh, ow): (usize, usize),
    win: Window,
    kind: Pool,
) -> Result<Vec<T>> {
    let Window {
        kernel: (kh, kw),
        stride: (sh, sw),
        padding: (ph, pw),
        dilation: (dh, dw),
    } = win;
    let mut gx = alloc_filled(planes * h * w, T::zero())?;
    if oh * ow == 0 || h * w == 0 {
        return Ok(gx);
    }
    gx.par_chunks_mut(h * w)
        .enumerate()
        .for_each(|(pi, gplane)| {
            let gout = &g[pi * oh * ow..(pi + 1) * oh * ow];
            match (kind, index) {
                (Pool::Max, Some(index)) => {
                    let idx = &index[pi * oh * ow..(pi + 1) * oh * ow];
                    for oy in 0..oh {
                        let y0 = (oy * sh) as isize - ph as isize;
                        for ox in 0..ow {
                            let x0 = (ox * sw) as isize - pw as isize;
                            let k = idx[oy * ow + ox].to_f64() as usize;
                            let iy = y0 + ((k / kw) * dh) as isize;
                            let ix = x0 + ((k % kw) * dw) as isize;
                            // a window with no element in the input (a dilated
                            // one past the padding) sends nothing
                            if (0..h as isize).contains(&iy) && (0..w as isize).contains(&ix) {
                                gplane[iy as usize * w + ix as usize] += gout[oy * ow + ox];
                            }
                        }
                    }
                }
                (Pool::Max, None) => {} // the caller always passes the index
                (Pool::Avg { count_include_pad }, _) => {
                    for oy in 0..oh {
                        let y0 = (oy * sh) as isize - ph as isize;
                        let ky = taps(y0, kh, dh, h);
                        for ox in 0..ow {
                            let x0 = (ox * sw) as isize - pw as isize;
                            let kx = taps(x0, kw, dw, w);
                            let div = if count_include_pad {
                                let ye = (y0 + kh as isize).min((h + ph) as isize);
                                let xe = (x0 + kw as isize).min((w + pw) as isize);
                                (ye - y0) * (xe - x0)
                            } else {
                                (ky.len() * kx.len()) as isize
                            };
                            let share = gout[oy * ow + ox] / T::c(div as f64);
                            for ki in ky.clone() {
                                let iy = (y0 + (ki * dh) as isize) as usize;
                                for kj in kx.clone() {
                                    let ix = (x0 + (kj * dw) as isize) as usize;
                                    gplane[iy * w + ix] += share;
                                }
                            }
                        }
                    }
                }
            }
        });
    Ok(gx)
}

/// Adds the columns of `col` ([cg*kh*kw, oh*ow]) back into the image planes of
/// channels `0..cg` of `gx` (the adjoint of [`im2col`]).
fn col2im<T: Copy + std::ops::AddAssign>(col: &[T], s: &ConvShape, cg: usize, gx: &mut [T]) {
    let (p, sw) = (s.oh * s.ow, s.win.stride.1);
    for t in conv_taps(s, cg) {
        if t.xs.is_empty() {
            continue;
        }
        let plane = &mut gx[t.ci * s.h * s.w..(t.ci + 1) * s.h * s.w];
        let row = &col[t.row * p..][..p];
        for oy in t.ys.clone() {
            let iy = t.iy(oy);
            let dst = &mut plane[iy * s.w..(iy + 1) * s.w];
            let src = &row[oy * s.ow + t.xs.start..oy * s.ow + t.xs.end];
            if sw == 1 {
                for (d, v) in dst[t.ix0..t.ix0 + src.len()].iter_mut().zip(src) {
                    *d += *v;
                }
            } else {
                for (d, v) in dst[t.ix0..].iter_mut().step_by(sw).zip(src) {
                    *d += *v;
                }
            }
        }
    }
}

/// The gradients of conv2d's input and weight (each when asked for).
pub(crate) type InputAndWeightGrads<T> = (Option<Vec<T>>, Option<Vec<T>>);

/// Gradients of conv2d with respect to its input and weight (each only when
/// asked for), given the output gradient `g` ([n, o, oh, ow]); all contiguous.
///
/// The batch is split into one chunk of samples per thread: each chunk writes its
/// own samples' input gradient and sums its own weight gradient, and the partial
/// weight gradients are added at the end.
pub(crate) fn conv2d_backward<T>(
    x: &[T],
    weight: &[T],
    g: &[T],
    s: &ConvShape,
    (need_x, need_w): (bool, bool),
) -> Result<InputAndWeightGrads<T>>
where
    T: WithDType + Real + std::ops::AddAssign,
{
    let (kh, kw) = s.win.kernel;
    let (cg, og) = (s.c / s.groups, s.o / s.groups);
    let kk = cg * kh * kw;
    let p = s.oh * s.ow;
    let chw = s.c * s.h * s.w;
    let zeros = |n: usize| alloc_filled(n, T::zero());
    let mut gx = need_x.then(|| zeros(s.n * chw)).transpose()?;
    if p == 0 || kk == 0 || s.n == 0 || !(need_x || need_w) {
        return Ok((gx, need_w.then(|| zeros(s.o * kk)).transpose()?));
    }
    let chunks = rayon::current_num_threads().clamp(1, s.n);
    let per = s.n.div_ceil(chunks);
    // one chunk of samples: its input gradient (into `gxc`) and its weight gradient
    let chunk = |first: usize, gxc: Option<&mut [T]>| -> Result<Option<Vec<T>>> {
        let last = (first + per).min(s.n);
        let mut gw = need_w.then(|| zeros(s.o * kk)).transpose()?;
        let mut col = zeros(if need_w { kk * p } else { 0 })?;
        let mut col_grad = zeros(if need_x { kk * p } else { 0 })?;
        let mut gxc = gxc;
        for ni in first..last {
            // (x is read only for the weight's gradient: the transposed
            // convolution, which asks for the input's alone, passes no input)
            let xs = if need_w {
                &x[ni * chw..(ni + 1) * chw]
            } else {
                &[]
            };
            let gs = &g[ni * s.o * p..(ni + 1) * s.o * p];
            for grp in 0..s.groups {
                let gout = &gs[grp * og * p..(grp + 1) * og * p];
                if let Some(gw) = gw.as_mut() {
                    im2col(xs, s, grp * cg, cg, &mut col);
                    let gwg = &mut gw[grp * og * kk..(grp + 1) * og * kk];
                    // SAFETY: gwg is [og, kk], gout [og, p], col [kk, p] read
                    // transposed as [p, kk]; row-major and in bounds.
                    unsafe {
                        // gw += gout · colᵀ
                        gemm::gemm(
                            og,
                            kk,
                            p,
                            gwg.as_mut_ptr(),
                            1,
                            kk as isize,
                            true,
                            gout.as_ptr(),
                            1,
                            p as isize,
                            col.as_ptr(),
                            p as isize,
                            1,
                            T::one(),
                            T::one(),
                            false,
                            false,
                            false,
                            Parallelism::None,
                        );
                    }
                }
                if let Some(gxc) = gxc.as_deref_mut() {
                    let w = &weight[grp * og * kk..(grp + 1) * og * kk];
                    // SAFETY: w [og, kk] read transposed as [kk, og]; gout [og, p];
                    // col_grad [kk, p]; row-major and in bounds.
                    unsafe {
                        // col_grad = wᵀ · gout
                        gemm::gemm(
                            kk,
                            p,
                            og,
                            col_grad.as_mut_ptr(),
                            1,
                            p as isize,
                            false,
                            w.as_ptr(),
                            kk as isize,
                            1,
                            gout.as_ptr(),
                            1,
                            p as isize,
                            T::zero(),
                            T::one(),
                            false,
                            false,
                            false,
                            Parallelism::None,
                        );
                    }
                    let off = (ni - first) * chw + grp * cg * s.h * s.w;
                    col2im(&col_grad, s, cg, &mut gxc[off..off + cg * s.h * s.w]);
                }
            }
        }
        Ok(gw)
    };
    let add = |a: Option<Vec<T>>, b: Option<Vec<T>>| match (a, b) {
        (Some(mut a), Some(b)) => {
            a.iter_mut().zip(&b).for_each(|(x, y)| *x += *y);
            Some(a)
        }
        (a, b) => a.or(b),
    };
    let gw = match gx.as_mut() {
        Some(gx) => gx
            .par_chunks_mut(per * chw)
            .enumerate()
            .map(|(ci, gxc)| chunk(ci * per, Some(gxc)))
            .try_reduce(|| None, |a, b| Ok(add(a, b)))?,
        None => (0..chunks)
            .into_par_iter()
            .map(|ci| chunk(ci * per, None))
            .try_reduce(|| None, |a, b| Ok(add(a, b)))?,
    };
    let gw = match (need_w, gw) {
        (true, None) => Some(zeros(s.o * kk)?),
        (true, gw) => gw,
        (false, _) => None,
    };
    Ok((gx, gw))
}
