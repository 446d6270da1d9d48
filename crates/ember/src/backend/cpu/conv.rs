//! 2-D convolution (im2col + gemm per sample and group) and 2-D pooling, for
//! contiguous NCHW f32/f64 inputs.

use super::{alloc_filled, alloc_uninit};
use crate::dtype::Real;
use crate::WithDType;
use gemm::Parallelism;
use rayon::prelude::*;

/// Geometry of a 2-D convolution or pooling window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Window {
    pub kernel: (usize, usize),
    pub stride: (usize, usize),
    pub padding: (usize, usize),
    pub dilation: (usize, usize),
}

impl Window {
    /// Output size along one axis (PyTorch's formula, with ceil mode for pooling).
    pub fn out_size(
        input: usize,
        k: usize,
        s: usize,
        p: usize,
        d: usize,
        ceil: bool,
    ) -> Option<usize> {
        let eff = d * (k - 1) + 1;
        if input + 2 * p < eff {
            return None;
        }
        let span = input + 2 * p - eff;
        let mut out = if ceil { span.div_ceil(s) } else { span / s } + 1;
        // the last window must start inside the input or the left padding
        if ceil && (out - 1) * s >= input + p {
            out -= 1;
        }
        Some(out)
    }
}

/// Shapes of one conv2d call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConvShape {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub o: usize,
    pub groups: usize,
    pub oh: usize,
    pub ow: usize,
    pub win: Window,
}

/// Fills `col` ([cg*kh*kw, oh*ow]) with the input patches of channels `c0..c0+cg`.
fn im2col<T: Copy + Default>(x: &[T], s: &ConvShape, c0: usize, cg: usize, col: &mut [T]) {
    let Window {
        kernel: (kh, kw),
        stride: (sh, sw),
        padding: (ph, pw),
        dilation: (dh, dw),
    } = s.win;
    let p = s.oh * s.ow;
    for ci in 0..cg {
        let plane = &x[(c0 + ci) * s.h * s.w..(c0 + ci + 1) * s.h * s.w];
        for ki in 0..kh {
            for kj in 0..kw {
                let row = &mut col[((ci * kh + ki) * kw + kj) * p..][..p];
                for oy in 0..s.oh {
                    let iy = (oy * sh + ki * dh) as isize - ph as isize;
                    let dst = &mut row[oy * s.ow..(oy + 1) * s.ow];
                    if iy < 0 || iy >= s.h as isize {
                        dst.fill(T::default());
                        continue;
                    }
                    let src = &plane[iy as usize * s.w..(iy as usize + 1) * s.w];
                    for (ox, d) in dst.iter_mut().enumerate() {
                        let ix = (ox * sw + kj * dw) as isize - pw as isize;
                        *d = if ix >= 0 && (ix as usize) < s.w {
                            src[ix as usize]
                        } else {
                            T::default()
                        };
                    }
                }
            }
        }
    }
}

/// `out = conv2d(x, weight) + bias`, x: [n,c,h,w], weight: [o, c/groups, kh, kw].
pub(crate) fn conv2d<T>(x: &[T], weight: &[T], bias: Option<&[T]>, s: &ConvShape) -> Vec<T>
where
    T: WithDType + Real,
{
    let (kh, kw) = s.win.kernel;
    let (cg, og) = (s.c / s.groups, s.o / s.groups);
    let kk = cg * kh * kw;
    let p = s.oh * s.ow;
    let mut out = alloc_uninit::<T>(s.n * s.o * p);
    if p == 0 || s.n == 0 {
        return out;
    }
    let direct = kh == 1 && kw == 1 && s.win.stride == (1, 1) && s.win.padding == (0, 0);
    let big = og * kk * p >= 64 * 64 * 64;
    // one sample: im2col + gemm per group, then bias
    let sample = |ni: usize, dst: &mut [T], col: &mut Vec<T>, par: Parallelism| {
        let xs = &x[ni * s.c * s.h * s.w..(ni + 1) * s.c * s.h * s.w];
        for g in 0..s.groups {
            let rhs: &[T] = if direct {
                &xs[g * cg * p..(g + 1) * cg * p]
            } else {
                col.resize(kk * p, T::default());
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
    out
}

/// Pooling flavour.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Pool {
    Max,
    /// Average; `count_include_pad` counts padded positions in the divisor.
    Avg {
        count_include_pad: bool,
    },
}

/// Pools each of `planes` planes of size h×w into oh×ow.
#[allow(clippy::too_many_arguments)]
pub(crate) fn pool2d<T: WithDType + Real>(
    x: &[T],
    planes: usize,
    (h, w): (usize, usize),
    (oh, ow): (usize, usize),
    win: Window,
    kind: Pool,
) -> Vec<T> {
    let Window {
        kernel: (kh, kw),
        stride: (sh, sw),
        padding: (ph, pw),
        dilation: (dh, dw),
    } = win;
    let mut out = alloc_filled(planes * oh * ow, T::zero());
    if oh * ow == 0 {
        return out;
    }
    out.par_chunks_mut(oh * ow)
        .enumerate()
        .for_each(|(pi, dst)| {
            let plane = &x[pi * h * w..(pi + 1) * h * w];
            for oy in 0..oh {
                for ox in 0..ow {
                    let y0 = (oy * sh) as isize - ph as isize;
                    let x0 = (ox * sw) as isize - pw as isize;
                    let v = match kind {
                        Pool::Max => {
                            let mut m = T::neg_infinity();
                            for ki in 0..kh {
                                let iy = y0 + (ki * dh) as isize;
                                if iy < 0 || iy >= h as isize {
                                    continue;
                                }
                                for kj in 0..kw {
                                    let ix = x0 + (kj * dw) as isize;
                                    if ix < 0 || ix >= w as isize {
                                        continue;
                                    }
                                    let v = plane[iy as usize * w + ix as usize];
                                    if v > m || v.is_nan() {
                                        m = v;
                                    }
                                    if m.is_nan() {
                                        break;
                                    }
                                }
                            }
                            m
                        }
                        Pool::Avg { count_include_pad } => {
                            let ye = (y0 + kh as isize).min((h + ph) as isize);
                            let xe = (x0 + kw as isize).min((w + pw) as isize);
                            let pool_size = (ye - y0) * (xe - x0);
                            let (ys, xs) = (y0.max(0), x0.max(0));
                            let (ye, xe) = (ye.min(h as isize), xe.min(w as isize));
                            let mut sum = T::zero();
                            for iy in ys..ye {
                                for ix in xs..xe {
                                    sum = sum + plane[iy as usize * w + ix as usize];
                                }
                            }
                            let div = if count_include_pad {
                                pool_size
                            } else {
                                (ye - ys) * (xe - xs)
                            };
                            sum / T::c(div as f64)
                        }
                    };
                    dst[oy * ow + ox] = v;
                }
            }
        });
    out
}

/// Adds the columns of `col` ([cg*kh*kw, oh*ow]) back into the image planes of
/// channels `0..cg` of `gx` (the adjoint of [`im2col`]).
fn col2im<T: Copy + std::ops::AddAssign>(col: &[T], s: &ConvShape, cg: usize, gx: &mut [T]) {
    let Window {
        kernel: (kh, kw),
        stride: (sh, sw),
        padding: (ph, pw),
        dilation: (dh, dw),
    } = s.win;
    let p = s.oh * s.ow;
    for ci in 0..cg {
        let plane = &mut gx[ci * s.h * s.w..(ci + 1) * s.h * s.w];
        for ki in 0..kh {
            for kj in 0..kw {
                let row = &col[((ci * kh + ki) * kw + kj) * p..][..p];
                for oy in 0..s.oh {
                    let iy = (oy * sh + ki * dh) as isize - ph as isize;
                    if iy < 0 || iy >= s.h as isize {
                        continue;
                    }
                    for ox in 0..s.ow {
                        let ix = (ox * sw + kj * dw) as isize - pw as isize;
                        if ix >= 0 && (ix as usize) < s.w {
                            plane[iy as usize * s.w + ix as usize] += row[oy * s.ow + ox];
                        }
                    }
                }
            }
        }
    }
}

/// Gradients of conv2d with respect to its input and weight, given the output
/// gradient `g` ([n, o, oh, ow]); all contiguous.
pub(crate) fn conv2d_backward<T>(x: &[T], weight: &[T], g: &[T], s: &ConvShape) -> (Vec<T>, Vec<T>)
where
    T: WithDType + Real + std::ops::AddAssign,
{
    let (kh, kw) = s.win.kernel;
    let (cg, og) = (s.c / s.groups, s.o / s.groups);
    let kk = cg * kh * kw;
    let p = s.oh * s.ow;
    let mut gx = alloc_filled(s.n * s.c * s.h * s.w, T::zero());
    let mut gw = alloc_filled(s.o * kk, T::zero());
    if p == 0 || kk == 0 {
        return (gx, gw);
    }
    let par = if og * kk * p >= 64 * 64 * 64 {
        Parallelism::Rayon(0)
    } else {
        Parallelism::None
    };
    let mut col = vec![T::zero(); kk * p];
    let mut col_grad = vec![T::zero(); kk * p];
    for ni in 0..s.n {
        let xs = &x[ni * s.c * s.h * s.w..(ni + 1) * s.c * s.h * s.w];
        let gs = &g[ni * s.o * p..(ni + 1) * s.o * p];
        let gxs = &mut gx[ni * s.c * s.h * s.w..(ni + 1) * s.c * s.h * s.w];
        for grp in 0..s.groups {
            im2col(xs, s, grp * cg, cg, &mut col);
            let gout = &gs[grp * og * p..(grp + 1) * og * p];
            let w = &weight[grp * og * kk..(grp + 1) * og * kk];
            let gwg = &mut gw[grp * og * kk..(grp + 1) * og * kk];
            // SAFETY: gwg is [og, kk], gout [og, p], col [kk, p] read transposed as
            // [p, kk]; w [og, kk] read transposed as [kk, og]; col_grad [kk, p]; all
            // row-major and in bounds.
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
                    par,
                );
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
                    par,
                );
            }
            col2im(
                &col_grad,
                s,
                cg,
                &mut gxs[grp * cg * s.h * s.w..(grp + 1) * cg * s.h * s.w],
            );
        }
    }
    (gx, gw)
}

/// The gradient of [`pool2d`] with respect to its input: max pooling sends each
/// output's gradient to the (first) largest element of its window, average pooling
/// spreads it over the window with the forward pass's divisor.
#[allow(clippy::too_many_arguments)]
pub(crate) fn pool2d_backward<T: WithDType + Real + std::ops::AddAssign>(
    x: &[T],
    g: &[T],
    planes: usize,
    (h, w): (usize, usize),
    (oh, ow): (usize, usize),
    win: Window,
    kind: Pool,
) -> Vec<T> {
    let Window {
        kernel: (kh, kw),
        stride: (sh, sw),
        padding: (ph, pw),
        dilation: (dh, dw),
    } = win;
    let mut gx = alloc_filled(planes * h * w, T::zero());
    if oh * ow == 0 || h * w == 0 {
        return gx;
    }
    gx.par_chunks_mut(h * w)
        .enumerate()
        .for_each(|(pi, gplane)| {
            let plane = &x[pi * h * w..(pi + 1) * h * w];
            let gout = &g[pi * oh * ow..(pi + 1) * oh * ow];
            for oy in 0..oh {
                for ox in 0..ow {
                    let gv = gout[oy * ow + ox];
                    let y0 = (oy * sh) as isize - ph as isize;
                    let x0 = (ox * sw) as isize - pw as isize;
                    match kind {
                        Pool::Max => {
                            let mut best: Option<(usize, T)> = None;
                            'win: for ki in 0..kh {
                                let iy = y0 + (ki * dh) as isize;
                                if iy < 0 || iy >= h as isize {
                                    continue;
                                }
                                for kj in 0..kw {
                                    let ix = x0 + (kj * dw) as isize;
                                    if ix < 0 || ix >= w as isize {
                                        continue;
                                    }
                                    let at = iy as usize * w + ix as usize;
                                    let v = plane[at];
                                    if v.is_nan() {
                                        best = Some((at, v));
                                        break 'win;
                                    }
                                    if best.is_none_or(|(_, b)| v > b) {
                                        best = Some((at, v));
                                    }
                                }
                            }
                            if let Some((at, _)) = best {
                                gplane[at] += gv;
                            }
                        }
                        Pool::Avg { count_include_pad } => {
                            let ye = (y0 + kh as isize).min((h + ph) as isize);
                            let xe = (x0 + kw as isize).min((w + pw) as isize);
                            let pool_size = (ye - y0) * (xe - x0);
                            let (ys, xs) = (y0.max(0), x0.max(0));
                            let (ye, xe) = (ye.min(h as isize), xe.min(w as isize));
                            let div = if count_include_pad {
                                pool_size
                            } else {
                                (ye - ys) * (xe - xs)
                            };
                            let share = gv / T::c(div as f64);
                            for iy in ys..ye {
                                for ix in xs..xe {
                                    gplane[iy as usize * w + ix as usize] += share;
                                }
                            }
                        }
                    }
                }
            }
        });
    gx
}
