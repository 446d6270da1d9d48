use super::{assert_close, vals};
use ember::prelude::*;

fn sums_and_means(dev: &Device) -> Result<()> {
    let a = Tensor::arange(0f32, 24., dev)?.reshape([2, 3, 4])?;
    assert_eq!(a.sum_all()?.item::<f32>()?, 276.0);
    assert_eq!(a.sum_all()?.rank(), 0);
    let s1 = a.sum(1, false)?;
    assert_eq!(s1.shape(), &[2, 4]);
    assert_eq!(vals(&s1), vec![12., 15., 18., 21., 48., 51., 54., 57.]);
    let s = a.sum([0, 2], true)?;
    assert_eq!(
        (s.shape(), vals(&s)),
        (&[1usize, 3, 1][..], vec![60., 92., 124.])
    );
    assert_eq!(vals(&a.sum(-1, false)?)[..3], [6., 22., 38.]);
    assert_eq!(vals(&a.mean(-1, false)?)[..3], [1.5, 5.5, 9.5]);
    assert_eq!(a.mean_all()?.item::<f64>()?, 11.5);
    // over a transposed (non-contiguous) input
    let t = a.transpose(0, 2)?;
    assert_eq!(vals(&t.sum(2, false)?), vals(&a.sum(0, false)?.t()?));
    // integer and bool sums are int64
    let i = Tensor::new([[1u8, 2], [3, 250]], dev)?;
    assert_eq!(i.sum_all()?.dtype(), DType::I64);
    assert_eq!(i.sum_all()?.item::<i64>()?, 256);
    assert_eq!(
        Tensor::new([true, true, false], dev)?
            .sum_all()?
            .item::<i64>()?,
        2
    );
    assert!(
        i.mean_all().is_err(),
        "mean of integers needs a float dtype"
    );
    // empty reductions: sum is 0, mean is NaN, max has no identity
    let e = Tensor::zeros([0, 3], DType::F32, dev)?;
    assert_eq!(vals(&e.sum(0, false)?), vec![0.; 3]);
    assert!(vals(&e.mean(0, false)?)[0].is_nan());
    assert!(e.max(0, false).is_err());
    assert_eq!(e.max(1, false)?.shape(), &[0]);
    // a long sum in parallel chunks stays accurate
    let ones = Tensor::ones([3_000_000], DType::F32, dev)?;
    assert_eq!(ones.sum_all()?.item::<f32>()?, 3_000_000.0);
    // f16 sums accumulate in f32
    let h = Tensor::full([4096], 0.1, DType::F16, dev)?;
    assert!((h.sum_all()?.item::<f64>()? - 409.5).abs() < 0.5);
    Ok(())
}

fn max_min_arg(dev: &Device) -> Result<()> {
    let a = Tensor::new([[3f32, 7., 7.], [9., -1., 2.]], dev)?;
    assert_eq!(a.max_all()?.item::<f32>()?, 9.0);
    assert_eq!(a.min_all()?.item::<f32>()?, -1.0);
    assert_eq!(vals(&a.max(1, false)?), vec![7., 9.]);
    assert_eq!(vals(&a.min(0, true)?), vec![3., -1., 2.]);
    assert_eq!(
        a.argmax(1, false)?.to_vec1::<i64>()?,
        vec![1, 0],
        "first of equal maxima"
    );
    assert_eq!(a.argmin(0, false)?.to_vec1::<i64>()?, vec![0, 1, 1]);
    assert_eq!(a.argmax_all()?.item::<i64>()?, 3);
    assert_eq!(a.argmin_all()?.item::<i64>()?, 4);
    assert_eq!(a.argmax(-1, true)?.shape(), &[2, 1]);
    let (v, i) = a.max_dim(0, false)?;
    assert_eq!(
        (vals(&v), i.to_vec1::<i64>()?),
        (vec![9., 7., 7.], vec![1, 0, 0])
    );
    // NaN is the max and the min
    let n = Tensor::new([1f32, f32::NAN, 3.], dev)?;
    assert!(n.max_all()?.item::<f32>()?.is_nan());
    assert!(n.min_all()?.item::<f32>()?.is_nan());
    assert_eq!(n.argmax_all()?.item::<i64>()?, 1);
    assert_eq!(n.argmin_all()?.item::<i64>()?, 1);
    // integer max keeps the dtype
    let i = Tensor::new([4i64, -9, 2], dev)?;
    assert_eq!(
        (i.max_all()?.dtype(), i.max_all()?.item::<i64>()?),
        (DType::I64, 4)
    );
    assert_eq!(Tensor::new([5u8, 9], dev)?.min_all()?.item::<u8>()?, 5);
    Ok(())
}

fn var_std(dev: &Device) -> Result<()> {
    let a = Tensor::new([[1f64, 2., 3., 4.], [2., 4., 6., 8.]], dev)?;
    assert_close(
        &vals(&a.var(1, false)?),
        &[5.0 / 3.0, 20.0 / 3.0],
        1e-12,
        0.0,
    );
    assert_close(
        &vals(&a.var_correction(1, 0.0, false)?),
        &[1.25, 5.0],
        1e-12,
        0.0,
    );
    assert_close(
        &vals(&a.std(1, true)?),
        &[(5.0f64 / 3.0).sqrt(), (20.0f64 / 3.0).sqrt()],
        1e-12,
        0.0,
    );
    assert_close(&vals(&a.var(0, false)?), &[0.5, 2.0, 4.5, 8.0], 1e-12, 0.0);
    let all = a.var_all()?.item::<f64>()?;
    let v: Vec<f64> = vals(&a);
    let m = v.iter().sum::<f64>() / 8.0;
    assert!((all - v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / 7.0).abs() < 1e-12);
    assert!((a.std_all()?.item::<f64>()? - all.sqrt()).abs() < 1e-12);
    // one sample: unbiased variance is NaN (PyTorch gives nan with a warning)
    assert!(Tensor::new([1f32], dev)?.var_all()?.item::<f32>()?.is_nan());
    assert!(Tensor::new([1i64, 2], dev)?.var_all().is_err());
    Ok(())
}

fn softmax_family(dev: &Device) -> Result<()> {
    let x = Tensor::new([[1f32, 2., 3.], [1000., 1001., 1002.]], dev)?;
    let s = x.softmax(-1)?;
    let e = [1f64.exp(), 2f64.exp(), 3f64.exp()];
    let z: f64 = e.iter().sum();
    let want: Vec<f64> = e.iter().map(|v| v / z).collect();
    // CUDA's expf is within 2 ulp
    assert_close(&vals(&s)[..3], &want, 2e-6, 0.0);
    assert_close(&vals(&s)[3..], &want, 2e-6, 0.0);
    let ls = x.log_softmax(1)?;
    assert_close(
        &vals(&ls)[3..],
        &want.iter().map(|v| v.ln()).collect::<Vec<_>>(),
        1e-6,
        1e-6,
    );
    // along dim 0 (not the last): columns sum to one
    let c = x.softmax(0)?;
    assert_close(&vals(&c.sum(0, false)?), &[1.0; 3], 1e-6, 0.0);
    assert_close(&vals(&c.i(1)?), &[1.0; 3], 1e-6, 0.0);
    // -inf entries get probability 0; a transposed input works
    let m = Tensor::new([0f32, f32::NEG_INFINITY], dev)?;
    assert_eq!(vals(&m.softmax(0)?), vec![1.0, 0.0]);
    let t = x.t()?.softmax(0)?;
    assert_close(&vals(&t.t()?), &vals(&s), 1e-6, 0.0);
    assert!(Tensor::new([1i64], dev)?.softmax(0).is_err());
    assert!(x.softmax(2).is_err());
    let h = x.to_dtype(DType::BF16)?.softmax(-1)?;
    assert_eq!(h.dtype(), DType::BF16);
    assert_close(&vals(&h)[..3], &vals(&s)[..3], 1e-2, 1e-3);
    // bf16 cannot tell 1000, 1001 and 1002 apart (spacing 4 there): equal shares
    assert_close(&vals(&h)[3..], &[1.0 / 3.0; 3], 1e-2, 0.0);
    Ok(())
}

/// Softmax and log-softmax over rows of every length class against the CPU's: rows
/// the GPU keeps in shared memory (up to 8192 floats, 4096 doubles), longer ones it
/// reads three times, widths that are not multiples of the block's unrolled loads;
/// a row holding a NaN, a row of -inf and a row holding +inf are NaN throughout
/// (PyTorch's results).
fn softmax_rows_of_every_length(dev: &Device) -> Result<()> {
    let _rng = super::rng_lock();
    for (cols, dt) in [
        (1usize, DType::F32),
        (7, DType::F32),
        (1023, DType::F32),
        (1029, DType::BF16),
        (8192, DType::F32),
        (8193, DType::F32),
        (4097, DType::F64),
        (20000, DType::F32),
    ] {
        let cpu = Tensor::randn([3, cols], &Device::Cpu)?
            .mul(4.0)?
            .to_dtype(dt)?;
        let x = cpu.to(dev)?;
        for log in [false, true] {
            let (got, want) = if log {
                (x.log_softmax(-1)?, cpu.log_softmax(-1)?)
            } else {
                (x.softmax(-1)?, cpu.softmax(-1)?)
            };
            assert_eq!(got.dtype(), dt);
            let tol = if dt == DType::BF16 { 1e-2 } else { 1e-5 };
            assert_close(&vals(&got), &vals(&want), tol, 1e-6);
        }
    }
    let (nan, inf) = (f32::NAN, f32::INFINITY);
    for cols in [5usize, 9000] {
        let mut rows = vec![0f32; 4 * cols];
        rows[2] = nan; // row 0: a NaN
        rows[cols..2 * cols].fill(-inf); // row 1: all -inf
        rows[2 * cols + cols - 1] = inf; // row 2: one +inf
        let x = Tensor::from_vec(rows, [4, cols], dev)?;
        for log in [false, true] {
            let s = vals(&if log {
                x.log_softmax(1)?
            } else {
                x.softmax(1)?
            });
            assert!(s[..3 * cols].iter().all(|v| v.is_nan()), "{cols} {log}");
            let uniform = if log {
                -(cols as f64).ln()
            } else {
                1.0 / cols as f64
            };
            assert!(s[3 * cols..].iter().all(|&v| (v - uniform).abs() < 1e-6));
        }
    }
    Ok(())
}

fn allclose_and_assert_close(dev: &Device) -> Result<()> {
    let a = Tensor::new([1.0f32, 2.0, 3.0], dev)?;
    let b = Tensor::new([1.0f32, 2.0001, 3.0], dev)?;
    assert!(a.allclose(&b, 1e-3, 0.0)?);
    assert!(!a.allclose(&b, 1e-6, 1e-6)?);
    assert!((a.max_abs_diff(&b)? - 1e-4).abs() < 1e-6);
    // broadcasting, and NaN is never close
    assert!(a.allclose(&Tensor::new([[1.0f32, 2.0, 3.0]], dev)?, 0.0, 0.0)?);
    let n = Tensor::new([f32::NAN], dev)?;
    assert!(!n.allclose(&n, 1.0, 1.0)?);
    let e = a.assert_close(&b, 1e-6, 1e-6).unwrap_err().to_string();
    assert!(
        e.contains("max |a - b| = 0.0000998") && e.contains("rtol 0.000001"),
        "{e}"
    );
    a.assert_close(&b, 1e-3, 0.0)?;
    Ok(())
}

/// Every reduction against the CPU's, in the shapes that take the GPU's three
/// kernels: long lanes over few outputs (split into chunks and combined), short
/// lanes over many outputs (a warp each), and the rest (a block each).
fn reductions_of_every_shape(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    ember::manual_seed(7);
    for shape in [[3usize, 40_000], [1, 70_001], [2_000, 7], [40, 600], [5, 1]] {
        // a mean far from zero tests the variance's joining of chunks
        let x = Tensor::randn(shape, &Device::Cpu)? + 100.0;
        let xd = x.to(dev)?;
        let close = |got: &Tensor, want: &Tensor, tol: f64| {
            assert_close(&vals(got), &vals(want), tol, tol);
        };
        close(&xd.sum(1, false)?, &x.sum(1, false)?, 1e-5);
        close(&xd.mean(1, false)?, &x.mean(1, false)?, 1e-5);
        // the same through the general path (a transposed view)
        close(&xd.sum(1, false)?, &xd.t()?.sum(0, false)?, 1e-5);
        close(&xd.mean(1, false)?, &xd.t()?.mean(0, false)?, 1e-5);
        close(&xd.var(1, false)?, &x.var(1, false)?, 1e-3);
        close(&xd.max(1, false)?, &x.max(1, false)?, 0.0);
        close(&xd.min(1, false)?, &x.min(1, false)?, 0.0);
        for (got, want) in [
            (xd.argmax(1, false)?, x.argmax(1, false)?),
            (xd.argmin(1, false)?, x.argmin(1, false)?),
        ] {
            assert_eq!(got.to_vec1::<i64>()?, want.to_vec1::<i64>()?, "{shape:?}");
        }
        close(&xd.sum_all()?, &x.sum_all()?, 1e-5);
        close(&xd.var_all()?, &x.var_all()?, 1e-3);
        // f64 sums agree to rounding
        let x64 = x.to_dtype(DType::F64)?;
        close(&x64.to(dev)?.sum(1, false)?, &x64.sum(1, false)?, 1e-12);
        close(&x64.to(dev)?.var(1, false)?, &x64.var(1, false)?, 1e-9);
    }
    // sums and means over leading dims (read by columns on the GPU, with the rows
    // split in block rows when the columns are few)
    for shape in [[40_000usize, 3], [7, 2_000], [5_000, 70], [1, 9]] {
        let x = Tensor::randn(shape, &Device::Cpu)?;
        let xd = x.to(dev)?;
        for (got, want) in [
            (xd.sum(0, false)?, x.sum(0, false)?),
            (xd.mean(0, true)?, x.mean(0, true)?),
            (
                xd.to_dtype(DType::F64)?.sum(0, false)?,
                x.to_dtype(DType::F64)?.sum(0, false)?,
            ),
        ] {
            assert_eq!(got.shape(), want.shape());
            assert_close(&vals(&got), &vals(&want), 1e-4, 1e-4);
        }
        // the same sums through the general path (the last dim of a transposed view)
        assert_close(
            &vals(&xd.sum(0, false)?),
            &vals(&xd.t()?.sum(1, false)?),
            1e-4,
            1e-4,
        );
        // f16 columns accumulate in f32 through the partials
        let h = Tensor::full(shape, 0.5, DType::F16, dev)?;
        assert_eq!(vals(&h.mean(0, false)?), vec![0.5; shape[1]]);
        // integer and bool column sums are exact int64
        let i = Tensor::ones(shape, DType::U8, dev)?.mul(3)?;
        assert_eq!(
            i.sum(0, false)?.to_vec1::<i64>()?,
            vec![3 * shape[0] as i64; shape[1]]
        );
        let b = Tensor::ones(shape, DType::Bool, dev)?;
        assert_eq!(
            b.sum(0, false)?.to_vec1::<i64>()?,
            vec![shape[0] as i64; shape[1]]
        );
    }
    // a long column in f32 is not summed one row after another (that drifts by
    // about 1%: 100958 for a million 0.1s)
    let tall = Tensor::full([1_000_000, 2], 0.1, DType::F32, dev)?;
    let s = vals(&tall.sum(0, false)?);
    eprintln!("column sums of a million 0.1s on {dev}: {s:?}");
    assert!(s.iter().all(|v| (v - 100_000.0).abs() < 20.0), "{s:?}");
    let x = Tensor::randn([30, 40, 5], &Device::Cpu)?;
    let got = x.to(dev)?.sum([0, 1], false)?;
    assert_close(&vals(&got), &vals(&x.sum([0, 1], false)?), 1e-4, 1e-4);
    let got = x.to(dev)?.narrow(0, 3, 20)?.mean(0, false)?;
    assert_close(
        &vals(&got),
        &vals(&x.narrow(0, 3, 20)?.mean(0, false)?),
        1e-5,
        1e-5,
    );
    // ties go to the first index and NaN wins, across chunks of a long lane
    let mut v = vec![0f32; 100_000];
    v[70_000] = 5.0;
    v[20_000] = 5.0;
    v[99_999] = -5.0;
    v[50_000] = -5.0;
    let t = Tensor::from_vec(v.clone(), [100_000], dev)?;
    assert_eq!(t.argmax_all()?.item::<i64>()?, 20_000);
    assert_eq!(t.argmin_all()?.item::<i64>()?, 50_000);
    assert_eq!(t.max_all()?.item::<f32>()?, 5.0);
    v[90_000] = f32::NAN;
    v[60_000] = f32::NAN;
    let t = Tensor::from_vec(v, [100_000], dev)?;
    assert_eq!(t.argmax_all()?.item::<i64>()?, 60_000);
    assert_eq!(t.argmin_all()?.item::<i64>()?, 60_000);
    assert!(t.min_all()?.item::<f32>()?.is_nan());
    // integer sums stay exact in int64, f16 means accumulate in f32
    let i = Tensor::arange(0i64, 200_000, dev)?;
    assert_eq!(i.sum_all()?.item::<i64>()?, 199_999 * 200_000 / 2);
    let b = Tensor::ones([100_000], DType::Bool, dev)?;
    assert_eq!(b.sum_all()?.item::<i64>()?, 100_000);
    let h = Tensor::full([3, 50_000], 0.25, DType::F16, dev)?;
    assert_eq!(vals(&h.mean(1, false)?), vec![0.25; 3]);
    // a lane of one: variance NaN, correction 0 gives 0
    let one = Tensor::ones([4, 1], DType::F32, dev)?;
    assert!(vals(&one.var(1, false)?).iter().all(|v| v.is_nan()));
    assert_eq!(vals(&one.var_correction(1, 0.0, false)?), vec![0.0; 4]);
    Ok(())
}

/// The elements of each output of a reduction over `dims` of the row-major `data`
/// of `shape`, by plain loops: outputs in row-major order of the kept dims, each
/// lane's elements in row-major order of the reduced dims.
fn lanes_by_hand(data: &[f64], shape: &[usize], dims: &[usize]) -> Vec<Vec<f64>> {
    let kept: Vec<usize> = (0..shape.len()).filter(|d| !dims.contains(d)).collect();
    let outputs: usize = kept.iter().map(|&d| shape[d]).product();
    let mut lanes = vec![Vec::new(); outputs];
    for (flat, &v) in data.iter().enumerate() {
        let mut index = vec![0; shape.len()];
        let mut rest = flat;
        for d in (0..shape.len()).rev() {
            index[d] = rest % shape[d];
            rest /= shape[d];
        }
        let mut out = 0;
        for &d in &kept {
            out = out * shape[d] + index[d];
        }
        lanes[out].push(v);
    }
    lanes
}

/// Reductions over several dims of contiguous tensors (the fast paths: by columns
/// over leading dims, short and long contiguous trailing lanes, on the CPU and the
/// GPU), of a contiguous view at an offset, and of a non-contiguous view with the
/// same values, against sums, means, maxima, minima and variances by hand.
fn reductions_over_several_dims(dev: &Device) -> Result<()> {
    // (shape, the dim lists reduced over)
    let cases: [(&[usize], &[&[usize]]); 9] = [
        (
            &[2, 3, 4],
            &[&[0, 1], &[1, 2], &[0, 2], &[0], &[1], &[2], &[0, 1, 2]],
        ),
        // trailing lanes of 16 (the last summed in one plain loop) and of 17
        (&[4, 4, 4], &[&[1, 2], &[0, 1]]),
        (&[3, 1, 17], &[&[1, 2], &[0, 1]]),
        (&[5, 7, 40], &[&[0, 1], &[1, 2], &[0, 2]]),
        (
            &[3, 2, 5, 4],
            &[&[0, 1, 2], &[1, 2, 3], &[0, 1], &[2, 3], &[0, 3]],
        ),
        // many rows over few columns: the GPU splits the rows in block rows
        (&[130, 3, 5], &[&[0, 1], &[1, 2], &[0, 2]]),
        // more rows than one block of the CPU's column sums (halved and added)
        (&[550, 2, 3], &[&[0, 1]]),
        // few rows, wide: the CPU splits the columns over threads (CPU only)
        (&[2, 4, 8192], &[&[0, 1], &[1, 2]]),
        (&[1, 1, 6], &[&[0, 1], &[1, 2]]),
    ];
    for (shape, dim_lists) in cases {
        let n: usize = shape.iter().product();
        if n >= 1 << 16 && matches!(dev, Device::Cuda(_)) {
            // a CPU path; slow on the simulator
            continue;
        }
        // small integers (sums exact in f32), not symmetric, with repeats
        let data: Vec<f64> = (0..n).map(|i| ((i * 37 + 11) % 29) as f64 - 13.0).collect();
        // the same values one row further into a larger contiguous array
        let row: usize = shape[1..].iter().product();
        let mut padded = vec![1e6; row];
        padded.extend(&data);
        padded.extend(vec![-1e6; row]);
        let mut big_shape = shape.to_vec();
        big_shape[0] += 2;
        for dt in [DType::F32, DType::F64] {
            let a = Tensor::from_vec(data.clone(), shape, dev)?.to_dtype(dt)?;
            let at_offset = Tensor::from_vec(padded.clone(), big_shape.as_slice(), dev)?
                .to_dtype(dt)?
                .narrow(0, 1, shape[0])?;
            // the same values in a transposed memory order
            let rev: Vec<usize> = (0..shape.len()).rev().collect();
            let strided = a.permute(rev.clone())?.contiguous()?.permute(rev)?;
            assert!(a.is_contiguous() && at_offset.is_contiguous());
            assert!(!strided.is_contiguous() || shape.iter().filter(|&&s| s > 1).count() < 2);
            for &dims in dim_lists {
                let lanes = lanes_by_hand(&data, shape, dims);
                let sums: Vec<f64> = lanes.iter().map(|l| l.iter().sum()).collect();
                let means: Vec<f64> = lanes
                    .iter()
                    .zip(&sums)
                    .map(|(l, s)| s / l.len() as f64)
                    .collect();
                let maxima: Vec<f64> = lanes
                    .iter()
                    .map(|l| l.iter().copied().fold(f64::NEG_INFINITY, f64::max))
                    .collect();
                let minima: Vec<f64> = lanes
                    .iter()
                    .map(|l| l.iter().copied().fold(f64::INFINITY, f64::min))
                    .collect();
                let variances: Vec<f64> = lanes
                    .iter()
                    .zip(&means)
                    .map(|(l, m)| {
                        l.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / (l.len() - 1) as f64
                    })
                    .collect();
                let lane = lanes[0].len();
                for keepdim in [false, true] {
                    let want_shape: Vec<usize> = (0..shape.len())
                        .filter_map(|d| match (dims.contains(&d), keepdim) {
                            (false, _) => Some(shape[d]),
                            (true, true) => Some(1),
                            (true, false) => None,
                        })
                        .collect();
                    let dl = dims.to_vec();
                    for (name, t) in [
                        ("contiguous", &a),
                        ("contiguous at an offset", &at_offset),
                        ("strided", &strided),
                    ] {
                        let what = format!("{name} {dt} {shape:?} over {dims:?} keepdim {keepdim}");
                        let mut results = vec![
                            ("sum", t.sum(dl.clone(), keepdim)?, &sums),
                            ("mean", t.mean(dl.clone(), keepdim)?, &means),
                            ("max", t.max(dl.clone(), keepdim)?, &maxima),
                            ("min", t.min(dl.clone(), keepdim)?, &minima),
                        ];
                        if lane > 1 {
                            results.push(("var", t.var(dl.clone(), keepdim)?, &variances));
                        }
                        for (op, got, want) in results {
                            assert_eq!(got.shape(), want_shape.as_slice(), "{op} of {what}");
                            assert_eq!(got.dtype(), dt, "{op} of {what}");
                            let got = vals(&got);
                            let ok = got.len() == want.len()
                                && got
                                    .iter()
                                    .zip(want.iter())
                                    .all(|(g, w)| (g - w).abs() <= 1e-5 * (1.0 + w.abs()));
                            assert!(ok, "{op} of {what}:\n got {got:?}\nwant {want:?}");
                        }
                    }
                }
            }
            // the arg-reductions over each single dim, first index of a tie
            for d in 0..shape.len() {
                let lanes = lanes_by_hand(&data, shape, &[d]);
                let first = |better: fn(f64, f64) -> bool| -> Vec<i64> {
                    lanes
                        .iter()
                        .map(|l| {
                            let mut best = 0;
                            for (i, &v) in l.iter().enumerate() {
                                if better(v, l[best]) {
                                    best = i;
                                }
                            }
                            best as i64
                        })
                        .collect()
                };
                let (amax, amin) = (first(|a, b| a > b), first(|a, b| a < b));
                for t in [&a, &at_offset, &strided] {
                    let what = format!("{dt} {shape:?} over {d}, strides {:?}", t.stride());
                    let got = t.argmax(d as i64, false)?.flatten_all()?;
                    assert_eq!(got.to_vec1::<i64>()?, amax, "argmax of {what}");
                    let got = t.argmin(d as i64, false)?.flatten_all()?;
                    assert_eq!(got.to_vec1::<i64>()?, amin, "argmin of {what}");
                }
            }
        }
    }
    Ok(())
}

/// Cumulative sums and products over lines long enough that a GPU scans them in
/// chunks (a line of 70,000, lines of 5,000 with a stride, a line of 513 just
/// past the serial length), against a serial scan on the host: float dtypes
/// within their rounding, int64 exactly with its wraparound, and a product
/// whose zero and infinity sit in different chunks giving NaN only from the
/// infinity on, as a serial product does.
fn long_scans_match_a_serial_scan(dev: &Device) -> Result<()> {
    for (shape, dim) in [
        (vec![70_000usize], 0usize),
        (vec![3, 5000, 2], 1),
        (vec![5000, 4], 0),
        (vec![2, 513], 1),
    ] {
        let (outer, n, inner) = (
            shape[..dim].iter().product::<usize>(),
            shape[dim],
            shape[dim + 1..].iter().product::<usize>(),
        );
        let at = |o: usize, j: usize, i: usize| (o * n + j) * inner + i;
        let len = outer * n * inner;
        let serial = |x: &[f64], prod: bool| -> Vec<f64> {
            let mut y = vec![0.0; len];
            for o in 0..outer {
                for i in 0..inner {
                    let mut a = if prod { 1.0 } else { 0.0 };
                    for j in 0..n {
                        a = if prod {
                            a * x[at(o, j, i)]
                        } else {
                            a + x[at(o, j, i)]
                        };
                        y[at(o, j, i)] = a;
                    }
                }
            }
            y
        };
        let what = format!("{shape:?} along {dim}");
        // sums: values of both signs, so the running sum wanders
        let x: Vec<f64> = (0..len)
            .map(|k| ((k * 7919) % 1001) as f64 / 100.0 - 5.0)
            .collect();
        let want = serial(&x, false);
        let t = Tensor::from_vec(x.clone(), shape.clone(), dev)?;
        for (dtype, tol) in [(DType::F64, 1e-9), (DType::F32, 1e-3), (DType::BF16, 2.0)] {
            let got = t
                .to_dtype(dtype)?
                .cumsum(dim as i64)?
                .to_dtype(DType::F64)?;
            let got = got.to_vec::<f64>()?;
            // bf16 rounds each input and output to 8 bits: a running sum of up
            // to 70,000 terms of magnitude 5 is within a few units of its scale
            let scale = |k: usize| {
                if dtype == DType::BF16 {
                    want[k].abs() / 64.0
                } else {
                    0.0
                }
            };
            for k in 0..len {
                assert!(
                    (got[k] - want[k]).abs() <= tol + scale(k),
                    "cumsum {dtype:?} {what} at {k}: {} vs {}",
                    got[k],
                    want[k]
                );
            }
        }
        // int64: large values, so the sum wraps as two's complement
        let ints: Vec<i64> = (0..len as i64)
            .map(|k| (k % 7 - 3) * (i64::MAX / 5))
            .collect();
        let got = Tensor::from_vec(ints.clone(), shape.clone(), dev)?.cumsum(dim as i64)?;
        let mut want_i = vec![0i64; len];
        for o in 0..outer {
            for i in 0..inner {
                let mut a = 0i64;
                for j in 0..n {
                    a = a.wrapping_add(ints[at(o, j, i)]);
                    want_i[at(o, j, i)] = a;
                }
            }
        }
        assert_eq!(got.to_vec::<i64>()?, want_i, "cumsum int64 {what}");
        // products near 1 (they stay finite), a zero early and an infinity late
        let mut p: Vec<f64> = (0..len)
            .map(|k| 1.0 + ((k % 13) as f64 - 6.0) / 1000.0)
            .collect();
        for o in 0..outer {
            for i in 0..inner {
                p[at(o, n / 5, i)] = 0.0;
                p[at(o, n - 3, i)] = f64::INFINITY;
            }
        }
        let want = serial(&p, true);
        let got = Tensor::from_vec(p, shape.clone(), dev)?.cumprod(dim as i64)?;
        let got = got.to_vec::<f64>()?;
        for k in 0..len {
            let close = (got[k] - want[k]).abs() <= 1e-9 * want[k].abs().max(1.0);
            assert!(
                close || (got[k].is_nan() && want[k].is_nan()),
                "cumprod {what} at {k}: {} vs {}",
                got[k],
                want[k]
            );
        }
    }
    Ok(())
}

device_test!(
    reductions_over_several_dims,
    long_scans_match_a_serial_scan,
    reductions_of_every_shape,
    sums_and_means,
    max_min_arg,
    var_std,
    softmax_family,
    softmax_rows_of_every_length,
    allclose_and_assert_close
);
