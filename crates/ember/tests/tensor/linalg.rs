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

device_test!(
    matmul_shapes,
    matmul_large_parallel,
    conv2d_matches_reference,
    pooling
);
