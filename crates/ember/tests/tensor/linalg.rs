use super::{assert_close, vals};
use ember::prelude::*;

/// Reference matmul in f64 over row-major `[b, m, k] x [b, k, n]`.
fn ref_mm(a: &[f64], b: &[f64], batch: usize, m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0; batch * m * n];
    for bi in 0..batch {
        for i in 0..m {
            for j in 0..n {
                out[(bi * m + i) * n + j] = (0..k)
                    .map(|p| a[(bi * m + i) * k + p] * b[(bi * k + p) * n + j])
                    .sum();
            }
        }
    }
    out
}

fn matmul_shapes(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    ember::manual_seed(1);
    let v = Tensor::new([1f32, 2., 3.], dev)?;
    assert_eq!(v.matmul(&v)?.rank(), 0);
    assert_eq!(v.matmul(&v)?.item::<f32>()?, 14.0);
    let m = Tensor::arange(0f32, 6., dev)?.reshape([3, 2])?;
    assert_eq!(vals(&v.matmul(&m)?), vec![16., 22.]);
    assert_eq!(vals(&m.t()?.matmul(&v)?), vec![16., 22.]);
    for (m_, k, n) in [(1, 1, 1), (7, 5, 3), (64, 33, 17), (130, 70, 90)] {
        let a = Tensor::randn([m_, k], dev)?;
        let b = Tensor::randn([k, n], dev)?;
        let want = ref_mm(&vals(&a), &vals(&b), 1, m_, k, n);
        assert_close(&vals(&a.matmul(&b)?), &want, 1e-4, 1e-4);
        // transposed operands, no copies
        let at = a.t()?.contiguous()?.t()?;
        let bt = b.t()?.contiguous()?.t()?;
        assert!(!at.is_contiguous() || m_ == 1 || k == 1);
        assert_close(&vals(&at.matmul(&bt)?), &want, 1e-4, 1e-4);
        // f64 exact-ish, f16/bf16 within their precision
        let a64 = a.to_dtype(DType::F64)?;
        let b64 = b.to_dtype(DType::F64)?;
        assert_close(&vals(&a64.matmul(&b64)?), &want, 1e-12, 1e-12);
        for (dt, tol) in [(DType::F16, 2e-2), (DType::BF16, 6e-2)] {
            let h = a.to_dtype(dt)?.matmul(&b.to_dtype(dt)?)?;
            assert_eq!(h.dtype(), dt);
            assert_close(&vals(&h), &want, tol, tol * (k as f64).sqrt());
        }
    }
    // batched with broadcasting: [2,1,3,4] x [5,4,2] -> [2,5,3,2]
    let a = Tensor::randn([2, 1, 3, 4], dev)?;
    let b = Tensor::randn([5, 4, 2], dev)?;
    let c = a.matmul(&b)?;
    assert_eq!(c.shape(), &[2, 5, 3, 2]);
    let a11 = a.i((1, 0))?.contiguous()?;
    let b3 = b.i(3)?.contiguous()?;
    assert_close(
        &vals(&c.i((1, 3))?),
        &ref_mm(&vals(&a11), &vals(&b3), 1, 3, 4, 2),
        1e-5,
        1e-5,
    );
    // batch x 1-D
    let bv = Tensor::randn([4], dev)?;
    assert_eq!(a.matmul(&bv)?.shape(), &[2, 1, 3]);
    assert_eq!(bv.matmul(&b)?.shape(), &[5, 2]);
    // many small matrices in parallel
    let x = Tensor::randn([64, 8, 8], dev)?;
    let y = x.matmul(&x)?;
    let x5 = x.i(5)?.contiguous()?;
    assert_close(
        &vals(&y.i(5)?),
        &ref_mm(&vals(&x5), &vals(&x5), 1, 8, 8, 8),
        1e-5,
        1e-5,
    );
    // integers are exact
    let i = Tensor::arange(0i64, 6, dev)?.reshape([2, 3])?;
    assert_eq!(
        i.matmul(&i.t()?)?.to_vec2::<i64>()?,
        vec![vec![5, 14], vec![14, 50]]
    );
    // k = 0 gives zeros, m = 0 gives an empty result
    let z =
        Tensor::zeros([3, 0], DType::F32, dev)?.matmul(&Tensor::zeros([0, 2], DType::F32, dev)?)?;
    assert_eq!(vals(&z), vec![0.; 6]);
    assert_eq!(
        Tensor::zeros([0, 4], DType::F32, dev)?
            .matmul(&Tensor::zeros([4, 2], DType::F32, dev)?)?
            .shape(),
        &[0, 2]
    );
    Ok(())
}

fn matmul_large_parallel(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    ember::manual_seed(2);
    let a = Tensor::randn([256, 300], dev)?;
    let b = Tensor::randn([300, 200], dev)?;
    assert_close(
        &vals(&a.matmul(&b)?),
        &ref_mm(&vals(&a), &vals(&b), 1, 256, 300, 200),
        1e-4,
        1e-3,
    );
    Ok(())
}

/// Reference conv2d in f64 (NCHW, OIHW).
#[allow(clippy::too_many_arguments)]
fn ref_conv(
    x: &[f64],
    xs: [usize; 4],
    w: &[f64],
    ws: [usize; 4],
    bias: Option<&[f64]>,
    stride: usize,
    pad: usize,
    dil: usize,
    groups: usize,
) -> (Vec<f64>, [usize; 4]) {
    let [n, c, h, wd] = xs;
    let [o, cg, kh, kw] = ws;
    let oh = (h + 2 * pad - dil * (kh - 1) - 1) / stride + 1;
    let ow = (wd + 2 * pad - dil * (kw - 1) - 1) / stride + 1;
    let og = o / groups;
    let mut out = vec![0.0; n * o * oh * ow];
    for ni in 0..n {
        for oc in 0..o {
            let g = oc / og;
            for y in 0..oh {
                for xx in 0..ow {
                    let mut s = bias.map_or(0.0, |b| b[oc]);
                    for ci in 0..cg {
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let iy = (y * stride + ky * dil) as isize - pad as isize;
                                let ix = (xx * stride + kx * dil) as isize - pad as isize;
                                if iy >= 0 && ix >= 0 && (iy as usize) < h && (ix as usize) < wd {
                                    let cin = g * cg + ci;
                                    s += x[((ni * c + cin) * h + iy as usize) * wd + ix as usize]
                                        * w[((oc * cg + ci) * kh + ky) * kw + kx];
                                }
                            }
                        }
                    }
                    out[((ni * o + oc) * oh + y) * ow + xx] = s;
                }
            }
        }
    }
    (out, [n, o, oh, ow])
}

fn conv2d_matches_reference(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    ember::manual_seed(3);
    let cases = [
        // (n, c, h, w, o, kh, kw, stride, pad, dil, groups, bias)
        (2, 3, 8, 8, 4, 3, 3, 1, 1, 1, 1, true),
        (1, 4, 7, 9, 6, 2, 3, 2, 0, 1, 2, false),
        (3, 4, 10, 10, 4, 3, 3, 1, 2, 2, 4, true),
        (2, 5, 6, 6, 3, 1, 1, 1, 0, 1, 1, true),
        (1, 1, 5, 5, 1, 5, 5, 1, 0, 1, 1, false),
        (4, 2, 28, 28, 8, 3, 3, 1, 1, 1, 1, true),
    ];
    for (n, c, h, w, o, kh, kw, stride, pad, dil, groups, with_bias) in cases {
        let x = Tensor::randn([n, c, h, w], dev)?;
        let wt = Tensor::randn([o, c / groups, kh, kw], dev)?;
        let b = Tensor::randn([o], dev)?;
        let bias = with_bias.then_some(&b);
        let opts = Conv2dOptions::default()
            .stride(stride)
            .padding(pad)
            .dilation(dil)
            .groups(groups);
        let y = x.conv2d(&wt, bias, opts)?;
        let bv = vals(&b);
        let (want, shape) = ref_conv(
            &vals(&x),
            [n, c, h, w],
            &vals(&wt),
            [o, c / groups, kh, kw],
            with_bias.then_some(&bv[..]),
            stride,
            pad,
            dil,
            groups,
        );
        assert_eq!(y.shape(), &shape);
        assert_close(&vals(&y), &want, 1e-4, 1e-4);
        // f64 and unbatched input
        let y64 = x
            .to_dtype(DType::F64)?
            .conv2d(&wt.to_dtype(DType::F64)?, None, opts)?;
        assert_eq!(y64.dtype(), DType::F64);
        let y3 = x.i(0)?.conv2d(&wt, bias, opts)?;
        // cuBLAS may pick another kernel (and summation order) for one image
        assert_close(&vals(&y3), &vals(&y.i(0)?), 1e-5, 1e-5);
    }
    // bf16 computes in f32
    let x = Tensor::randn([1, 2, 5, 5], dev)?;
    let w = Tensor::randn([3, 2, 3, 3], dev)?;
    let y = x.conv2d(&w, None, Conv2dOptions::default())?;
    let yb = x.to_dtype(DType::BF16)?.conv2d(
        &w.to_dtype(DType::BF16)?,
        None,
        Conv2dOptions::default(),
    )?;
    assert_eq!(yb.dtype(), DType::BF16);
    assert_close(&vals(&yb), &vals(&y), 5e-2, 1e-1);
    Ok(())
}

fn pooling(dev: &Device) -> Result<()> {
    let x = Tensor::arange(0f32, 16., dev)?.reshape([1, 1, 4, 4])?;
    let m = x.max_pool2d(Pool2dOptions::new(2))?;
    assert_eq!(
        (m.shape(), vals(&m)),
        (&[1usize, 1, 2, 2][..], vec![5., 7., 13., 15.])
    );
    let a = x.avg_pool2d(Pool2dOptions::new(2))?;
    assert_eq!(vals(&a), vec![2.5, 4.5, 10.5, 12.5]);
    // stride 1, padding 1: padded positions never win a max
    let neg = x.neg()?;
    let mp = neg.max_pool2d(Pool2dOptions::new(3).stride(1).padding(1))?;
    assert_eq!(mp.shape(), &[1, 1, 4, 4]);
    assert_eq!(vals(&mp)[0], 0.0);
    assert_eq!(vals(&mp)[15], -10.0);
    // count_include_pad decides the divisor at the borders
    let ones = Tensor::ones([1, 1, 3, 3], DType::F32, dev)?;
    let inc = ones.avg_pool2d(Pool2dOptions::new(3).stride(1).padding(1))?;
    assert_close(&vals(&inc)[..1], &[4.0 / 9.0], 1e-6, 0.0);
    let exc = ones.avg_pool2d(
        Pool2dOptions::new(3)
            .stride(1)
            .padding(1)
            .count_include_pad(false),
    )?;
    assert_eq!(vals(&exc), vec![1.0; 9]);
    // ceil mode keeps a partial last window
    let y = Tensor::arange(0f32, 25., dev)?.reshape([1, 5, 5])?;
    assert_eq!(y.max_pool2d(Pool2dOptions::new(2))?.shape(), &[1, 2, 2]);
    let c = y.max_pool2d(Pool2dOptions::new(2).ceil_mode(true))?;
    assert_eq!(
        (c.shape(), vals(&c)),
        (
            &[1usize, 3, 3][..],
            vec![6., 8., 9., 16., 18., 19., 21., 23., 24.]
        )
    );
    // dilation
    let d = x.max_pool2d(Pool2dOptions::new(2).stride(1).dilation(2))?;
    assert_eq!(vals(&d), vec![10., 11., 14., 15.]);
    // NaN wins a max window
    let n = Tensor::new([[[1f32, f32::NAN], [3., 4.]]], dev)?;
    assert!(vals(&n.max_pool2d(Pool2dOptions::new(2))?)[0].is_nan());
    assert!(
        x.max_pool2d(Pool2dOptions::new(2).padding(2)).is_err(),
        "pad at most half the kernel"
    );
    assert!(x.avg_pool2d(Pool2dOptions::new(2).dilation(2)).is_err());
    assert!(x.max_pool2d(Pool2dOptions::new(5)).is_err());
    Ok(())
}

/// `[rows, cols]` taken from the row-major `[prows, pcols]` parent `data` at
/// `(r0, c0)`, transposed when `t`: the values of
/// `parent.narrow(0, r0, ..).narrow(1, c0, ..)` (then `.t()`), by hand.
fn block(
    data: &[f64],
    pcols: usize,
    (r0, c0): (usize, usize),
    rows: usize,
    cols: usize,
    t: bool,
) -> Vec<f64> {
    let mut out = Vec::with_capacity(rows * cols);
    for i in 0..rows {
        for j in 0..cols {
            let (r, c) = if t {
                (r0 + j, c0 + i)
            } else {
                (r0 + i, c0 + j)
            };
            out.push(data[r * pcols + c]);
        }
    }
    out
}

/// Products whose operands are views of narrowed matrices, transposed or not, left,
/// right and both: a transposed operand's leading dimension is its parent's row
/// length, not its own size, and it starts at an offset into the parent. Against a
/// naive triple loop, with the gradients of the parents.
fn matmul_of_transposed_narrowed_views(dev: &Device) -> Result<()> {
    for (m, k, n) in [
        (5, 3, 4),
        (17, 9, 6),
        (1, 4, 3),
        (6, 1, 2),
        (4, 7, 1),
        (33, 20, 40),
    ] {
        // parents with spare rows and columns on every side of the operands
        let (apr, apc) = (m.max(k) + 3, m.max(k) + 5);
        let (bpr, bpc) = (k.max(n) + 2, k.max(n) + 4);
        let apd: Vec<f64> = (0..apr * apc)
            .map(|i| ((i * 13 + 5) % 17) as f64 - 8.0)
            .collect();
        let bpd: Vec<f64> = (0..bpr * bpc)
            .map(|i| ((i * 7 + 3) % 19) as f64 - 9.0)
            .collect();
        for dt in [DType::F32, DType::F64, DType::I64] {
            let ap = Tensor::from_vec(apd.clone(), [apr, apc], dev)?.to_dtype(dt)?;
            let bp = Tensor::from_vec(bpd.clone(), [bpr, bpc], dev)?.to_dtype(dt)?;
            // (description, operand, its values)
            let lefts = [
                (
                    "a.narrow.t",
                    ap.narrow(0, 1, k)?.narrow(1, 2, m)?.t()?,
                    block(&apd, apc, (1, 2), m, k, true),
                ),
                (
                    "a.narrow",
                    ap.narrow(0, 2, m)?.narrow(1, 1, k)?,
                    block(&apd, apc, (2, 1), m, k, false),
                ),
            ];
            let rights = [
                (
                    "b.narrow.t",
                    bp.narrow(0, 2, n)?.narrow(1, 1, k)?.t()?,
                    block(&bpd, bpc, (2, 1), k, n, true),
                ),
                (
                    "b.narrow",
                    bp.narrow(0, 1, k)?.narrow(1, 3, n)?,
                    block(&bpd, bpc, (1, 3), k, n, false),
                ),
            ];
            for (an, a, av) in &lefts {
                for (bn, b, bv) in &rights {
                    let want = ref_mm(av, bv, 1, m, k, n);
                    let c = a.matmul(b)?;
                    assert_eq!((c.shape(), c.dtype()), (&[m, n][..], dt));
                    assert_eq!(vals(&c), want, "{an} x {bn}, {m}x{k}x{n} {dt}");
                }
            }
            if dt == DType::I64 {
                continue;
            }
            // gradients reach the parents' narrowed blocks (and nothing else): dA =
            // R·Bᵀ, dB = Aᵀ·R for the loss sum(A·B * R)
            let r: Vec<f64> = (0..m * n).map(|i| ((i * 5 + 1) % 7) as f64 - 3.0).collect();
            let rt = Tensor::from_vec(r.clone(), [m, n], dev)?.to_dtype(dt)?;
            for (ai, bi) in [(0, 0), (0, 1), (1, 0)] {
                let apg = ap.detach().requires_grad_(true)?;
                let bpg = bp.detach().requires_grad_(true)?;
                let (a, av) = if ai == 0 {
                    (apg.narrow(0, 1, k)?.narrow(1, 2, m)?.t()?, &lefts[0].2)
                } else {
                    (apg.narrow(0, 2, m)?.narrow(1, 1, k)?, &lefts[1].2)
                };
                let (b, bv) = if bi == 0 {
                    (bpg.narrow(0, 2, n)?.narrow(1, 1, k)?.t()?, &rights[0].2)
                } else {
                    (bpg.narrow(0, 1, k)?.narrow(1, 3, n)?, &rights[1].2)
                };
                a.matmul(&b)?.mul(&rt)?.sum_all()?.backward()?;
                let mut want_a = vec![0.0; apr * apc];
                for i in 0..m {
                    for p in 0..k {
                        let g: f64 = (0..n).map(|j| r[i * n + j] * bv[p * n + j]).sum();
                        let (pr, pc) = if ai == 0 {
                            (1 + p, 2 + i)
                        } else {
                            (2 + i, 1 + p)
                        };
                        want_a[pr * apc + pc] = g;
                    }
                }
                let mut want_b = vec![0.0; bpr * bpc];
                for p in 0..k {
                    for j in 0..n {
                        let g: f64 = (0..m).map(|i| av[i * k + p] * r[i * n + j]).sum();
                        let (pr, pc) = if bi == 0 {
                            (2 + j, 1 + p)
                        } else {
                            (1 + p, 3 + j)
                        };
                        want_b[pr * bpc + pc] = g;
                    }
                }
                let what = format!("{m}x{k}x{n} {dt}, operands {ai} {bi}");
                let ga = apg.grad().expect("a's parent has a gradient");
                let gb = bpg.grad().expect("b's parent has a gradient");
                assert_eq!(vals(&ga), want_a, "dA of {what}");
                assert_eq!(vals(&gb), want_b, "dB of {what}");
            }
        }
    }
    // batched: a batch of transposed narrowed matrices (constant batch stride)
    let (bt, m, k, n) = (3, 5, 4, 6);
    let apd: Vec<f64> = (0..bt * 6 * 9)
        .map(|i| ((i * 11 + 2) % 13) as f64 - 6.0)
        .collect();
    let bpd: Vec<f64> = (0..bt * 7 * 8)
        .map(|i| ((i * 3 + 1) % 11) as f64 - 5.0)
        .collect();
    let ap = Tensor::from_vec(apd.clone(), [bt, 6, 9], dev)?;
    let bp = Tensor::from_vec(bpd.clone(), [bt, 7, 8], dev)?;
    // a[b] = ap[b, 1..1+k, 2..2+m]ᵀ, b[b] = bp[b, 1..1+n, 3..3+k]ᵀ
    let a = ap.narrow(1, 1, k)?.narrow(2, 2, m)?.transpose(1, 2)?;
    let b = bp.narrow(1, 1, n)?.narrow(2, 3, k)?.transpose(1, 2)?;
    let mut av = Vec::new();
    let mut bv = Vec::new();
    for i in 0..bt {
        av.extend(block(&apd[i * 54..(i + 1) * 54], 9, (1, 2), m, k, true));
        bv.extend(block(&bpd[i * 56..(i + 1) * 56], 8, (1, 3), k, n, true));
    }
    let want = ref_mm(&av, &bv, bt, m, k, n);
    assert_close(&vals(&a.matmul(&b)?), &want, 1e-6, 1e-5);
    Ok(())
}

/// Reference gradients of `sum(conv2d(x, w, b) * r)` in f64 by direct loops:
/// (input, weight, bias).
#[allow(clippy::too_many_arguments)]
fn ref_conv_grads(
    x: &[f64],
    xs: [usize; 4],
    w: &[f64],
    ws: [usize; 4],
    r: &[f64],
    stride: usize,
    pad: usize,
    groups: usize,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let [n, c, h, wd] = xs;
    let [o, cg, kh, kw] = ws;
    let oh = (h + 2 * pad - kh) / stride + 1;
    let ow = (wd + 2 * pad - kw) / stride + 1;
    let og = o / groups;
    let (mut gx, mut gw, mut gb) = (vec![0.0; x.len()], vec![0.0; w.len()], vec![0.0; o]);
    for ni in 0..n {
        for oc in 0..o {
            for y in 0..oh {
                for xx in 0..ow {
                    let g = r[((ni * o + oc) * oh + y) * ow + xx];
                    gb[oc] += g;
                    for ci in 0..cg {
                        let cin = (oc / og) * cg + ci;
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let iy = (y * stride + ky) as isize - pad as isize;
                                let ix = (xx * stride + kx) as isize - pad as isize;
                                if iy < 0 || ix < 0 || iy as usize >= h || ix as usize >= wd {
                                    continue;
                                }
                                let xi = ((ni * c + cin) * h + iy as usize) * wd + ix as usize;
                                let wi = ((oc * cg + ci) * kh + ky) * kw + kx;
                                gw[wi] += g * x[xi];
                                gx[xi] += g * w[wi];
                            }
                        }
                    }
                }
            }
        }
    }
    (gx, gw, gb)
}

/// Asserts `got` is within `tol * (1 + |want|)` of `want` elementwise.
#[track_caller]
fn close(got: &Tensor, want: &[f64], tol: f64, what: &str) {
    let got = vals(got);
    let ok = got.len() == want.len()
        && got
            .iter()
            .zip(want)
            .all(|(g, w)| (g - w).abs() <= tol * (1.0 + w.abs()));
    assert!(ok, "{what}:\n got {got:?}\nwant {want:?}");
}

/// conv2d's weight and bias gradients when the input needs none (a network's first
/// layer), at batch sizes that do not divide among the threads, and with the input
/// gradient too; against direct loops.
fn conv2d_weight_gradient_without_an_input_gradient(dev: &Device) -> Result<()> {
    // (c, h, w, o, k, stride, pad, groups)
    let shapes = [
        (3, 6, 5, 4, 3, 1, 1, 1),
        (4, 7, 7, 6, 3, 2, 0, 2),
        (1, 5, 5, 2, 2, 1, 0, 1),
    ];
    for (c, h, wd, o, k, stride, pad, groups) in shapes {
        for n in [1, 2, 3, 5, 7, 9, 17] {
            let xs = [n, c, h, wd];
            let ws = [o, c / groups, k, k];
            let xd: Vec<f64> = (0..n * c * h * wd)
                .map(|i| ((i * 7 + 3) % 11) as f64 / 4.0 - 1.25)
                .collect();
            let wdv: Vec<f64> = (0..ws.iter().product::<usize>())
                .map(|i| ((i * 5 + 2) % 9) as f64 / 4.0 - 1.0)
                .collect();
            let bd: Vec<f64> = (0..o).map(|i| i as f64 - 1.5).collect();
            let opts = Conv2dOptions::default()
                .stride(stride)
                .padding(pad)
                .groups(groups);
            let oh = (h + 2 * pad - k) / stride + 1;
            let ow = (wd + 2 * pad - k) / stride + 1;
            let rd: Vec<f64> = (0..n * o * oh * ow)
                .map(|i| ((i * 3 + 1) % 7) as f64 - 3.0)
                .collect();
            let (gx_want, gw_want, gb_want) =
                ref_conv_grads(&xd, xs, &wdv, ws, &rd, stride, pad, groups);
            for dt in [DType::F32, DType::F64] {
                let tol = if dt == DType::F32 { 1e-4 } else { 1e-10 };
                let what = format!("batch {n}, {xs:?} by {ws:?}, {opts:?} {dt}");
                let r = Tensor::from_vec(rd.clone(), [n, o, oh, ow], dev)?.to_dtype(dt)?;
                for input_grad in [false, true] {
                    let x = Tensor::from_vec(xd.clone(), xs, dev)?
                        .to_dtype(dt)?
                        .requires_grad_(input_grad)?;
                    let w = Tensor::from_vec(wdv.clone(), ws, dev)?
                        .to_dtype(dt)?
                        .requires_grad_(true)?;
                    let b = Tensor::from_vec(bd.clone(), [o], dev)?
                        .to_dtype(dt)?
                        .requires_grad_(true)?;
                    x.conv2d(&w, Some(&b), opts)?
                        .mul(&r)?
                        .sum_all()?
                        .backward()?;
                    let gw = w.grad().expect("the weight's gradient");
                    assert_eq!(gw.shape(), &ws[..]);
                    close(&gw, &gw_want, tol, &format!("weight gradient, {what}"));
                    let gb = b.grad().expect("the bias's gradient");
                    close(&gb, &gb_want, tol, &format!("bias gradient, {what}"));
                    if input_grad {
                        let gx = x.grad().expect("the input's gradient");
                        close(&gx, &gx_want, tol, &format!("input gradient, {what}"));
                    } else {
                        assert!(x.grad().is_none(), "{what}");
                    }
                }
            }
        }
    }
    Ok(())
}

/// `Linear`, `F.linear` and `addmm` with one bias row: the product adds the bias
/// (on a GPU through cublasLt's epilogue, counted, where the shapes allow it: not
/// for one row, f64 or an empty depth), so f16/bf16 round once: on the CPU the
/// result is exactly the f32 product plus the bias rounded once. Values and
/// gradients match f64 references; a full-matrix `self` takes the product-and-add
/// path and no epilogue.
fn linear_adds_its_bias_in_the_product(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    ember::manual_seed(7);
    let f64s = |t: &Tensor| t.to_dtype(DType::F64);
    for dt in [DType::F32, DType::BF16, DType::F16, DType::F64] {
        // (rows, depth, outputs): the epilogue's shapes, one row, no depth
        for (n, k, o) in [(37, 70, 33), (1, 5, 4), (6, 0, 3)] {
            let what = format!("{dt} [{n}, {k}] x [{o}, {k}]ᵀ on {dev}");
            let x = Tensor::randn([n, k], dev)?
                .to_dtype(dt)?
                .requires_grad_(true)?;
            let w = Tensor::randn([o, k], dev)?
                .to_dtype(dt)?
                .requires_grad_(true)?;
            let b = Tensor::randn([o], dev)?
                .to_dtype(dt)?
                .requires_grad_(true)?;
            let before = ember::cuda::bias_epilogue_products();
            let y = ember::nn::functional::linear(&x, &w, Some(&b))?;
            let lt = ember::cuda::bias_epilogue_products() - before;
            let fused = dev.is_cuda() && dt != DType::F64 && n > 1 && k > 0;
            assert_eq!(lt, fused as u64, "epilogue products, {what}");
            assert_eq!((y.dtype(), y.shape()), (dt, &[n, o][..]), "{what}");
            let (rtol, atol) = match dt {
                DType::F64 => (1e-12, 1e-12),
                DType::F32 => (1e-5, 1e-5),
                // one rounding: within one unit in the last place of the f64 value
                DType::BF16 => (1.0 / 128.0, 1e-6),
                _ => (1.0 / 1024.0, 1e-6),
            };
            let (xd, wd, bd) = (f64s(&x)?.detach(), f64s(&w)?.detach(), f64s(&b)?.detach());
            let want = xd.matmul(&wd.t()?)?.add(&bd)?;
            // a GPU's half product may reduce split partial sums in the half type:
            // bounded by the terms' magnitudes (common::assert_within_terms)
            let gpu_half = dev.is_cuda() && matches!(dt, DType::BF16 | DType::F16);
            let unit = if dt == DType::BF16 {
                1.0 / 256.0
            } else {
                1.0 / 2048.0
            };
            let near = |got: &Tensor, want: &Tensor, terms: Tensor, name: &str| {
                let what = format!("{name}, {what}");
                crate::common::assert_within_terms(
                    &vals(got),
                    &vals(want),
                    &vals(&terms),
                    unit,
                    &what,
                );
            };
            if gpu_half {
                near(
                    &y,
                    &want,
                    xd.abs()?.matmul(&wd.abs()?.t()?)?.add(&bd.abs()?)?,
                    "output",
                );
            } else {
                assert_close(&vals(&y), &vals(&want), rtol, atol);
            }
            if !dev.is_cuda() && matches!(dt, DType::BF16 | DType::F16) {
                // exactly the f32 product plus the bias, rounded once
                let f32s = |t: &Tensor| t.detach().to_dtype(DType::F32);
                let once = f32s(&x)?
                    .matmul(&f32s(&w)?.t()?)?
                    .add(&f32s(&b)?)?
                    .to_dtype(dt)?;
                assert_eq!(vals(&y), vals(&once), "one rounding, {what}");
            }
            // gradients of sum(y · c) against f64 references
            let c = Tensor::randn([n, o], dev)?.to_dtype(dt)?;
            y.mul(&c)?.sum_all()?.backward()?;
            let cd = f64s(&c)?;
            let grads = [
                (x.grad(), cd.matmul(&wd)?, "input"),
                (w.grad(), cd.t()?.matmul(&xd)?, "weight"),
                (b.grad(), cd.sum(0, false)?, "bias"),
            ];
            let ca = cd.abs()?;
            let terms = [
                ca.matmul(&wd.abs()?)?,
                ca.t()?.matmul(&xd.abs()?)?,
                ca.sum(0, false)?,
            ];
            for ((got, want, name), terms) in grads.into_iter().zip(terms) {
                let got = got.unwrap_or_else(|| panic!("the {name} gradient, {what}"));
                if gpu_half {
                    near(&got, &want, terms, name);
                } else {
                    let scale = 1.0 + (k.max(n) as f64).sqrt();
                    assert_close(&vals(&got), &vals(&want), rtol * scale, atol * scale);
                }
            }
        }
    }
    // a bias that is not one row: a product and an add, no epilogue
    let (x, w) = (Tensor::randn([5, 3], dev)?, Tensor::randn([3, 4], dev)?);
    let full = Tensor::randn([5, 4], dev)?;
    let before = ember::cuda::bias_epilogue_products();
    let y = full.addmm(&x, &w)?;
    assert_eq!(ember::cuda::bias_epilogue_products(), before);
    assert_close(&vals(&y), &vals(&x.matmul(&w)?.add(&full)?), 1e-6, 1e-6);
    Ok(())
}

device_test!(
    linear_adds_its_bias_in_the_product,
    matmul_of_transposed_narrowed_views,
    conv2d_weight_gradient_without_an_input_gradient,
    matmul_shapes,
    matmul_large_parallel,
    conv2d_matches_reference,
    pooling
);
