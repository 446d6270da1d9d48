//! The simulator's cuDNN: reference convolutions with cuDNN's contract (NCHW
//! tensors and KCRS filters, or NHWC and KRSC, cross-correlation, groups, the output size cuDNN
//! computes), refusing what cuDNN refuses, so that the calls ember builds for cuDNN
//! are tested and not only the numbers.

use super::gemm::{load_operand, write};
use crate::backend::cuda::calls::{ConvCall, ConvGeom, ConvPass};
use crate::{
    dtype::DType,
    error::{Error, Result},
};
use rayon::prelude::*;

fn status(name: &str, why: String) -> Error {
    Error::Cuda {
        op: "cudnnConvolution",
        msg: format!("{name} (simulator: {why})"),
    }
}

/// cuDNN's output size along one axis.
fn out_len(input: i32, pad: i32, filter: i32, stride: i32, dilation: i32) -> i64 {
    let eff = (filter as i64 - 1) * dilation as i64 + 1;
    let span = input as i64 + 2 * pad as i64 - eff;
    if span < 0 {
        return 0;
    }
    span / stride as i64 + 1
}

/// Checks `c` as cuDNN does (at the call) and returns the work that runs it
/// (alpha 1, beta 0), accumulating in f64 and rounding once to the operands'
/// dtype (half operands as cuDNN's float32 accumulation would, to within its
/// rounding). Float32 operands are rounded to TF32 first where the call allows
/// TF32 ([`ConvCall::tf32`]): a GPU's cuDNN may then choose tensor-core kernels,
/// and results must be checked to TF32's tolerance.
///
/// # Safety
/// `c.x`, `c.w` and `c.y` must address contiguous arrays with the sizes of `c.geom`.
pub(crate) unsafe fn conv_job(c: &ConvCall) -> Result<super::Work> {
    let c = *c;
    let g: ConvGeom = c.geom;
    let bad = |why: String| status("CUDNN_STATUS_BAD_PARAM", why);
    if !matches!(g.dtype, DType::F32 | DType::F64 | DType::F16 | DType::BF16) {
        return Err(status(
            "CUDNN_STATUS_NOT_SUPPORTED",
            format!("ember's cuDNN path has no {} convolution", g.dtype),
        ));
    }
    let positive =
        g.x.iter()
            .chain(&g.w)
            .chain(&g.y)
            .chain(&g.stride)
            .chain(&g.dilation)
            .all(|&v| v > 0);
    if !positive || g.groups <= 0 || g.pad.iter().any(|&p| p < 0) {
        return Err(bad(format!("sizes must be positive: {g:?}")));
    }
    let [n, cin, h, w] = g.x.map(|v| v as i64);
    let [k, cg, r, s] = g.w.map(|v| v as i64);
    let groups = g.groups as i64;
    if cg * groups != cin || k % groups != 0 {
        return Err(bad(format!(
            "filter {:?} with {groups} groups does not fit input {:?}",
            g.w, g.x
        )));
    }
    let want = [
        n,
        k,
        out_len(g.x[2], g.pad[0], g.w[2], g.stride[0], g.dilation[0]),
        out_len(g.x[3], g.pad[1], g.w[3], g.stride[1], g.dilation[1]),
    ];
    if g.y.map(|v| v as i64) != want {
        return Err(bad(format!("output {:?}, cuDNN computes {want:?}", g.y)));
    }
    let (p, q) = (want[2], want[3]);
    let (u, v) = (g.stride[0] as i64, g.stride[1] as i64);
    let (ph, pw) = (g.pad[0] as i64, g.pad[1] as i64);
    let (dh, dw) = (g.dilation[0] as i64, g.dilation[1] as i64);
    let kg = k / groups;
    let (out_dims, out_ptr) = c.output();
    let esz = g.dtype.size_in_bytes() as u64;
    for (what, ptr, dims) in [("x", c.x, g.x), ("w", c.w, g.w), ("y", c.y, g.y)] {
        let len = ConvGeom::numel(dims) as u64 * esz;
        super::check_region("cudnnConvolution", what, ptr, len)?;
    }
    // the scratch memory handed to the library must be there too
    if c.workspace_bytes > 0 {
        super::check_region(
            "cudnnConvolution",
            "workspace",
            c.workspace,
            c.workspace_bytes as u64,
        )?;
    }
    Ok(std::sync::Arc::new(move || {
        let _lock = super::exec_lock();
        let (dt, nhwc, tf32) = (g.dtype, g.nhwc, c.tf32);
        // the two operands of the pass, read once (as the call's math reads them)
        let load = |ptr: u64, dims: [i32; 4]| load_operand(dt, ptr, ConvGeom::numel(dims), tf32);
        let x_at = |ni: i64, ch: i64, ih: i64, iw: i64| {
            (if nhwc {
                ((ni * h + ih) * w + iw) * cin + ch
            } else {
                ((ni * cin + ch) * h + ih) * w + iw
            }) as usize
        };
        let w_at = |ki: i64, ci: i64, ri: i64, si: i64| {
            (if nhwc {
                ((ki * r + ri) * s + si) * cg + ci
            } else {
                ((ki * cg + ci) * r + ri) * s + si
            }) as usize
        };
        let y_at = |ni: i64, ki: i64, pi: i64, qi: i64| {
            (if nhwc {
                ((ni * p + pi) * q + qi) * k + ki
            } else {
                ((ni * k + ki) * p + pi) * q + qi
            }) as usize
        };
        // an element's coordinates from its index in a tensor of `d` (NCHW order
        // of the dims; channels last where `nhwc`)
        let coords = |i: usize, d: [i64; 4]| {
            let i = i as i64;
            if nhwc {
                let (ch, rest) = (i % d[1], i / d[1]);
                [rest / (d[2] * d[3]), ch, rest / d[3] % d[2], rest % d[3]]
            } else {
                [
                    i / (d[1] * d[2] * d[3]),
                    i / (d[2] * d[3]) % d[1],
                    i / d[3] % d[2],
                    i % d[3],
                ]
            }
        };
        let mut acc = vec![0f64; ConvGeom::numel(out_dims)];
        // each output element is summed on its own, its terms in the order of the
        // loops over (n, k, p, q, c, r, s) that define the convolution, so that
        // the result does not depend on how the elements are shared out
        match c.pass {
            ConvPass::Forward => {
                let (xs, ws) = (load(c.x, g.x), load(c.w, g.w));
                acc.par_iter_mut()
                    .enumerate()
                    .with_min_len(64)
                    .for_each(|(i, a)| {
                        let [ni, ki, pi, qi] = coords(i, [n, k, p, q]);
                        let c0 = (ki / kg) * cg;
                        for ci in 0..cg {
                            for ri in 0..r {
                                let ih = pi * u - ph + ri * dh;
                                if !(0..h).contains(&ih) {
                                    continue;
                                }
                                for si in 0..s {
                                    let iw = qi * v - pw + si * dw;
                                    if (0..w).contains(&iw) {
                                        *a += xs[x_at(ni, c0 + ci, ih, iw)]
                                            * ws[w_at(ki, ci, ri, si)];
                                    }
                                }
                            }
                        }
                    });
            }
            ConvPass::BackwardData => {
                let (ys, ws) = (load(c.y, g.y), load(c.w, g.w));
                // the output positions and filter taps that meet input row (or
                // column) `i`, in the order of the output positions
                let taps = |i: i64, len: i64, stride: i64, pad: i64, dil: i64, f: i64| {
                    (0..len)
                        .filter_map(|o| {
                            let d = i + pad - o * stride;
                            (d >= 0 && d % dil == 0 && d / dil < f).then_some((o, d / dil))
                        })
                        .collect::<Vec<_>>()
                };
                // once per input row and column, not per element
                let rows: Vec<_> = (0..h).map(|ih| taps(ih, p, u, ph, dh, r)).collect();
                let cols: Vec<_> = (0..w).map(|iw| taps(iw, q, v, pw, dw, s)).collect();
                acc.par_iter_mut()
                    .enumerate()
                    .with_min_len(64)
                    .for_each(|(i, a)| {
                        let [ni, ch, ih, iw] = coords(i, [n, cin, h, w]);
                        let (gi, ci) = (ch / cg, ch % cg);
                        for ki in gi * kg..(gi + 1) * kg {
                            for &(pi, ri) in &rows[ih as usize] {
                                for &(qi, si) in &cols[iw as usize] {
                                    *a += ys[y_at(ni, ki, pi, qi)] * ws[w_at(ki, ci, ri, si)];
                                }
                            }
                        }
                    });
            }
            ConvPass::BackwardFilter => {
                let (xs, ys) = (load(c.x, g.x), load(c.y, g.y));
                acc.par_iter_mut()
                    .enumerate()
                    .with_min_len(16)
                    .for_each(|(i, a)| {
                        let [ki, ci, ri, si] = coords(i, [k, cg, r, s]);
                        let ch = (ki / kg) * cg + ci;
                        for ni in 0..n {
                            for pi in 0..p {
                                let ih = pi * u - ph + ri * dh;
                                if !(0..h).contains(&ih) {
                                    continue;
                                }
                                for qi in 0..q {
                                    let iw = qi * v - pw + si * dw;
                                    if (0..w).contains(&iw) {
                                        *a += xs[x_at(ni, ch, ih, iw)] * ys[y_at(ni, ki, pi, qi)];
                                    }
                                }
                            }
                        }
                    });
            }
        }
        for (i, &a) in acc.iter().enumerate() {
            write(dt, out_ptr, i as i64, a);
        }
        Ok(())
    }))
}

/// Runs `c` now: [`conv_job`]'s checks and its convolution.
///
/// # Safety
/// As [`conv_job`].
#[cfg(test)]
unsafe fn conv(c: &ConvCall) -> Result<()> {
    conv_job(c)?()
}

#[cfg(test)]
mod tests {
    use super::super::gemm::to_tf32;
    use super::*;

    fn geom(x: [i32; 4], w: [i32; 4], y: [i32; 4], groups: i32) -> ConvGeom {
        ConvGeom {
            dtype: DType::F32,
            x,
            w,
            y,
            pad: [0, 0],
            stride: [1, 1],
            dilation: [1, 1],
            groups,
            nhwc: false,
        }
    }

    fn run(g: ConvGeom, pass: ConvPass, x: &mut [f32], w: &mut [f32], y: &mut [f32]) -> Result<()> {
        run_math(g, pass, (x, w, y), false)
    }

    fn run_math(
        g: ConvGeom,
        pass: ConvPass,
        (x, w, y): (&mut [f32], &mut [f32], &mut [f32]),
        tf32: bool,
    ) -> Result<()> {
        let c = ConvCall {
            geom: g,
            pass,
            x: x.as_mut_ptr() as u64,
            w: w.as_mut_ptr() as u64,
            y: y.as_mut_ptr() as u64,
            workspace: 0,
            workspace_bytes: 0,
            tf32,
        };
        // SAFETY: the slices have the sizes of `g`.
        unsafe { conv(&c) }
    }

    #[test]
    fn hand_worked_passes() {
        // x = [[1 2 3] [4 5 6] [7 8 9]], w = [[1 0] [0 -1]]: y[i][j] = x[i][j] - x[i+1][j+1]
        let g = geom([1, 1, 3, 3], [1, 1, 2, 2], [1, 1, 2, 2], 1);
        let mut x: Vec<f32> = (1..=9).map(|v| v as f32).collect();
        let mut w = vec![1.0, 0.0, 0.0, -1.0];
        let mut y = vec![f32::NAN; 4];
        run(g, ConvPass::Forward, &mut x, &mut w, &mut y).unwrap();
        assert_eq!(y, [-4.0; 4]);
        // dx for dy = 1: each x gets +1 where it meets w's corner 1, -1 where it meets -1
        let mut dy = vec![1.0; 4];
        let mut dx = vec![f32::NAN; 9];
        run(g, ConvPass::BackwardData, &mut dx, &mut w, &mut dy).unwrap();
        assert_eq!(dx, [1.0, 1.0, 0.0, 1.0, 0.0, -1.0, 0.0, -1.0, -1.0]);
        // dw[r][s] = sum of the 2x2 window of x starting at (r, s)
        let mut dw = vec![f32::NAN; 4];
        run(g, ConvPass::BackwardFilter, &mut x, &mut dw, &mut dy).unwrap();
        assert_eq!(dw, [12.0, 16.0, 24.0, 28.0]);
    }

    #[test]
    fn refuses_what_cudnn_refuses() {
        let mut buf = vec![0f32; 64];
        let mut w = vec![0f32; 64];
        let mut y = vec![0f32; 64];
        let mut check = |g: ConvGeom, what: &str| {
            let e = run(g, ConvPass::Forward, &mut buf, &mut w, &mut y).unwrap_err();
            let msg = e.to_string();
            assert!(
                msg.contains("CUDNN_STATUS_BAD_PARAM") && msg.contains(what),
                "{msg}"
            );
        };
        // an output size that is not cuDNN's
        check(
            geom([1, 1, 3, 3], [1, 1, 2, 2], [1, 1, 3, 3], 1),
            "cuDNN computes",
        );
        // channels that the groups do not split
        check(geom([1, 4, 3, 3], [2, 3, 2, 2], [1, 2, 2, 2], 1), "groups");
        check(geom([1, 4, 3, 3], [3, 2, 2, 2], [1, 3, 2, 2], 2), "groups");
        // empty tensors
        check(
            geom([0, 1, 3, 3], [1, 1, 2, 2], [0, 1, 2, 2], 1),
            "positive",
        );
        // a dtype cuDNN has no convolution for
        let mut int_geom = geom([1, 1, 3, 3], [1, 1, 2, 2], [1, 1, 2, 2], 1);
        int_geom.dtype = DType::I64;
        let e = run(int_geom, ConvPass::Forward, &mut buf, &mut w, &mut y).unwrap_err();
        assert!(e.to_string().contains("NOT_SUPPORTED"), "{e}");
    }

    #[test]
    fn tf32_rounds_float32_operands() {
        let (one, ulp) = (1.0f32, f32::EPSILON);
        // 10 bits of mantissa: 1 + 2^-10 stays, 1 + 2^-12 and even 1 + 2^-10 -
        // 2^-20 go down, negatives toward zero alike; infinities and NaNs stay
        let tenth = 2f64.powi(-10);
        assert_eq!(to_tf32(1.0 + tenth), 1.0 + tenth);
        assert_eq!(to_tf32(1.0 + 2f64.powi(-12)), 1.0);
        assert_eq!(to_tf32(1.0 + tenth - 2f64.powi(-20)), 1.0);
        assert_eq!(to_tf32(-(1.0 + 3.0 * 2f64.powi(-11))), -(1.0 + tenth));
        assert_eq!(to_tf32(3.0), 3.0);
        assert_eq!(to_tf32(f64::INFINITY), f64::INFINITY);
        assert!(to_tf32(f64::NAN).is_nan());
        // a 1 x 1 convolution: with TF32 the operands are rounded before the
        // product, without it they are not
        let g = geom([1, 1, 1, 2], [1, 1, 1, 1], [1, 1, 1, 2], 1);
        let x0 = [one + 8.0 * ulp, 3.0];
        for (tf32, want) in [(false, one + 8.0 * ulp), (true, one)] {
            let (mut x, mut w, mut y) = (x0, [1.0f32], [f32::NAN; 2]);
            run_math(g, ConvPass::Forward, (&mut x, &mut w, &mut y), tf32).unwrap();
            assert_eq!(y, [want, 3.0], "tf32 {tf32}");
        }
        // float64 is never rounded
        let mut g64 = g;
        g64.dtype = DType::F64;
        let (mut x, mut w, mut y) = ([1.0 + 2f64.powi(-20)], [1.0f64], [f64::NAN]);
        let c = ConvCall {
            geom: ConvGeom {
                x: [1, 1, 1, 1],
                y: [1, 1, 1, 1],
                ..g64
            },
            pass: ConvPass::Forward,
            x: x.as_mut_ptr() as u64,
            w: w.as_mut_ptr() as u64,
            y: y.as_mut_ptr() as u64,
            workspace: 0,
            workspace_bytes: 0,
            tf32: true,
        };
        // SAFETY: one-element arrays, as the geometry says.
        unsafe { conv(&c) }.unwrap();
        assert_eq!(y, [1.0 + 2f64.powi(-20)]);
    }
}
