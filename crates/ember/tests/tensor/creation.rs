use super::{assert_close, vals};
use ember::prelude::*;
use half::{bf16, f16};

fn zeros_ones_full(dev: &Device) -> Result<()> {
    for dt in DType::ALL {
        let z = Tensor::zeros([2, 3], dt, dev)?;
        assert_eq!(
            (z.shape(), z.dtype(), z.device()),
            (&[2usize, 3][..], dt, *dev)
        );
        assert_eq!(z.is_cuda(), dev.is_cuda());
        assert_eq!(vals(&z), vec![0.0; 6]);
        assert_eq!(vals(&Tensor::ones([4], dt, dev)?), vec![1.0; 4]);
    }
    assert_eq!(
        vals(&Tensor::full([2, 2], 2.5, DType::F32, dev)?),
        vec![2.5; 4]
    );
    assert_eq!(
        vals(&Tensor::full([2], 2.7, DType::I64, dev)?),
        vec![2.0; 2]
    );
    assert_eq!(vals(&Tensor::full((), 7.0, DType::F64, dev)?), vec![7.0]);
    let e = Tensor::zeros([0, 4], DType::F32, dev)?;
    assert_eq!((e.numel(), e.shape()), (0, &[0usize, 4][..]));
    let a = Tensor::new([[1i64, 2], [3, 4]], dev)?;
    assert_eq!(a.zeros_like()?.dtype(), DType::I64);
    assert_eq!(vals(&a.ones_like()?), vec![1.0; 4]);
    assert_eq!(vals(&a.full_like(9.0)?), vec![9.0; 4]);
    Ok(())
}

fn arange_linspace_eye(dev: &Device) -> Result<()> {
    let a = Tensor::arange(0i64, 5, dev)?;
    assert_eq!(
        (a.dtype(), a.to_vec1::<i64>()?),
        (DType::I64, vec![0, 1, 2, 3, 4])
    );
    let f = Tensor::arange_step(0.0, 1.0, 0.25, DType::F32, dev)?;
    assert_eq!(f.to_vec1::<f32>()?, vec![0.0, 0.25, 0.5, 0.75]);
    let d = Tensor::arange_step(5.0, 0.0, -2.0, DType::I64, dev)?;
    assert_eq!(d.to_vec1::<i64>()?, vec![5, 3, 1]);
    assert_eq!(Tensor::arange(3i64, 3, dev)?.numel(), 0);
    let l = Tensor::linspace(0.0, 1.0, 5, DType::F32, dev)?;
    assert_eq!(l.to_vec1::<f32>()?, vec![0.0, 0.25, 0.5, 0.75, 1.0]);
    assert_eq!(
        Tensor::linspace(3.0, 9.0, 1, DType::F64, dev)?.to_vec1::<f64>()?,
        vec![3.0]
    );
    assert_eq!(Tensor::linspace(0.0, 1.0, 0, DType::F64, dev)?.numel(), 0);
    let e = Tensor::eye(3, DType::F32, dev)?;
    assert_eq!(
        e.to_vec2::<f32>()?,
        vec![vec![1., 0., 0.], vec![0., 1., 0.], vec![0., 0., 1.]]
    );
    assert_eq!(
        vals(&Tensor::eye_rect(2, 3, DType::U8, dev)?),
        vec![1., 0., 0., 0., 1., 0.]
    );
    Ok(())
}

fn random_is_seeded(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    ember::manual_seed(42);
    let a = Tensor::rand([1000], dev)?;
    let b = Tensor::randn([1000], dev)?;
    ember::manual_seed(42);
    assert_eq!(vals(&a), vals(&Tensor::rand([1000], dev)?));
    assert_eq!(vals(&b), vals(&Tensor::randn([1000], dev)?));
    let c = Tensor::rand([1000], dev)?;
    assert_ne!(vals(&a), vals(&c), "the generator must advance");
    let av = vals(&a);
    assert!(av.iter().all(|&x| (0.0..1.0).contains(&x)));
    let mean = av.iter().sum::<f64>() / 1000.0;
    assert!((mean - 0.5).abs() < 0.05, "uniform mean {mean}");
    let bv = vals(&b);
    let m = bv.iter().sum::<f64>() / 1000.0;
    let var = bv.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / 999.0;
    assert!(
        m.abs() < 0.1 && (var - 1.0).abs() < 0.15,
        "normal mean {m} var {var}"
    );
    let u = Tensor::uniform(-2.0, -1.0, [500], DType::F64, dev)?;
    assert!(vals(&u).iter().all(|&x| (-2.0..-1.0).contains(&x)));
    // draws that round up to `hi` in a narrow dtype (about 1 in 2048 for f16 on
    // [1, 2), 1 in 256 for bf16) become `lo`: the interval stays half-open
    for dtype in [DType::F16, DType::BF16] {
        let u = vals(&Tensor::uniform(1.0, 2.0, [100_000], dtype, dev)?);
        assert!(u.iter().all(|&x| (1.0..2.0).contains(&x)), "{dtype}");
    }
    let r = Tensor::randint(3, 6, [501], dev)?.to_vec1::<i64>()?;
    assert!(r.iter().all(|x| (3..6).contains(x)));
    // each value about as often (167 of 501, a binomial sd of 10.5)
    for k in 3..6 {
        let c = r.iter().filter(|&&x| x == k).count();
        assert!((115..=220).contains(&c), "{k} drawn {c} times of 501");
    }
    // the widest range, and a range of one value
    let wide = Tensor::randint(i64::MIN, i64::MAX, [64], dev)?.to_vec1::<i64>()?;
    assert!(wide.iter().any(|&x| x < 0) && wide.iter().any(|&x| x > 0));
    assert_eq!(
        Tensor::randint(-9, -8, [3], dev)?.to_vec1::<i64>()?,
        [-9; 3]
    );
    let p = Tensor::randperm(50, dev)?;
    let mut pv = p.to_vec1::<i64>()?;
    pv.sort();
    assert_eq!(pv, (0..50).collect::<Vec<_>>());
    assert_eq!(a.rand_like()?.shape(), a.shape());
    assert_eq!(
        Tensor::zeros([3], DType::F64, dev)?.randn_like()?.dtype(),
        DType::F64
    );
    assert!(Tensor::uniform(0.0, 1.0, [2], DType::I64, dev).is_err());
    Ok(())
}

fn from_rust_data(dev: &Device) -> Result<()> {
    let t = Tensor::new([[[1f64, 2.], [3., 4.]], [[5., 6.], [7., 8.]]], dev)?;
    assert_eq!(t.shape(), &[2, 2, 2]);
    assert_eq!(t.to_vec3::<f64>()?[1][0], vec![5.0, 6.0]);
    let i = Tensor::new([1, 2, 3], dev)?;
    assert_eq!(i.dtype(), DType::I64, "integer literals become int64");
    let v = Tensor::new(vec![vec![true, false], vec![false, true]], dev)?;
    assert_eq!((v.dtype(), v.shape()), (DType::Bool, &[2usize, 2][..]));
    assert!(
        Tensor::new(vec![vec![1f32, 2.], vec![3.]], dev).is_err(),
        "ragged data"
    );
    let s = Tensor::new(3.5f32, dev)?;
    assert_eq!((s.rank(), s.item::<f32>()?), (0, 3.5));
    let h = Tensor::new([f16::from_f32(1.5), f16::from_f32(-2.0)], dev)?;
    assert_eq!(h.dtype(), DType::F16);
    let b = Tensor::new([bf16::from_f32(0.5)], dev)?;
    assert_eq!(b.item::<f32>()?, 0.5);
    let fv = Tensor::from_vec(vec![1u8, 2, 3, 4, 5, 6], [2, 3], dev)?;
    assert_eq!(fv.to_vec2::<u8>()?, vec![vec![1, 2, 3], vec![4, 5, 6]]);
    assert!(Tensor::from_vec(vec![1f32; 5], [2, 3], dev).is_err());
    assert!(Tensor::from_vec(vec![1f32; 5], [-1, 5], dev).is_err());
    assert_eq!(
        Tensor::from_slice(&[1i64, 2], [2, 1], dev)?.shape(),
        &[2, 1]
    );
    assert_eq!(Tensor::scalar(7i64, dev)?.item::<f64>()?, 7.0);
    assert_eq!(Tensor::new([0f32; 0], dev)?.shape(), &[0]);
    // reading back checks the rank, and item needs exactly one element
    assert!(t.to_vec1::<f64>().is_err() && t.to_vec2::<f64>().is_err());
    assert!(t.item::<f64>().is_err());
    Ok(())
}

/// Doubles become float16 and bfloat16 through float32, as in PyTorch (two
/// roundings), and float32's subnormals round to the nearest bfloat16 (values from
/// PyTorch 2.15: `torch.tensor([x], dtype=torch.float64).to(torch.bfloat16)`).
fn half_types_round_like_pytorch(dev: &Device) -> Result<()> {
    let x = 1.0 + 2f64.powi(-8) + 2f64.powi(-30);
    let y = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
    let t = Tensor::new([x, y], dev)?;
    assert_eq!(
        t.to_dtype(DType::BF16)?.to_vec1::<half::bf16>()?[0].to_f64(),
        1.0
    );
    assert_eq!(
        t.to_dtype(DType::F16)?.to_vec1::<half::f16>()?[1].to_f64(),
        1.0
    );
    assert_eq!(
        Tensor::full([1], x, DType::BF16, dev)?.to_vec1::<half::bf16>()?[0].to_f64(),
        1.0
    );
    let sub: Vec<f32> = [0x0020_7fffu32, 0x0020_8000, 0x0020_8001]
        .iter()
        .map(|&b| f32::from_bits(b))
        .collect();
    for src in [DType::F32, DType::F64] {
        let t = Tensor::new(sub.clone(), dev)?.to_dtype(src)?;
        let bits: Vec<u16> = t
            .to_dtype(DType::BF16)?
            .to_vec1::<half::bf16>()?
            .iter()
            .map(|v| v.to_bits())
            .collect();
        assert_eq!(bits, vec![0x20, 0x20, 0x21], "from {src:?} on {dev}");
    }
    Ok(())
}

fn dtype_conversions(dev: &Device) -> Result<()> {
    let src = Tensor::new([-2.7f64, -0.5, 0.0, 1.5, 2.5, 300.0], dev)?;
    let expect = |dt: DType| -> Vec<f64> {
        match dt {
            DType::Bool => vec![1., 1., 0., 1., 1., 1.],
            // float -> int truncates toward zero; uint8 wraps like C: -2 -> 254, 300 -> 44
            DType::U8 => vec![254., 0., 0., 1., 2., 44.],
            DType::I64 => vec![-2., 0., 0., 1., 2., 300.],
            _ => vec![-2.7, -0.5, 0.0, 1.5, 2.5, 300.0],
        }
    };
    for dt in DType::ALL {
        let c = src.to_dtype(dt)?;
        assert_eq!(c.dtype(), dt);
        let tol = match dt {
            DType::F16 => 2e-3,
            DType::BF16 => 1e-2,
            DType::F32 => 1e-6,
            _ => 0.0,
        };
        assert_close(&vals(&c), &expect(dt), tol, 0.0);
        // and back from every dtype to every dtype
        for dt2 in DType::ALL {
            let back = c.to_dtype(dt2)?;
            assert_eq!((back.dtype(), back.shape()), (dt2, c.shape()));
        }
    }
    // large int64 values survive a round trip exactly
    let big = Tensor::new([i64::MAX, i64::MIN + 1, 9007199254740993], dev)?;
    assert_eq!(
        big.to_dtype(DType::I64)?.to_vec1::<i64>()?,
        vec![i64::MAX, i64::MIN + 1, 9007199254740993]
    );
    assert_eq!(big.contiguous()?.to_vec1::<i64>()?[2], 9007199254740993);
    assert_eq!(big.t()?.copy()?.to_vec1::<i64>()?[2], 9007199254740993);
    let same = src.to_dtype(DType::F64)?;
    assert_eq!(vals(&same), vals(&src));
    Ok(())
}

/// `multinomial` draws each category with its weight's share: frequencies of
/// 40 000 draws within 5 standard deviations of `n·p`; without replacement every
/// row holds distinct categories, never one of weight 0, and the first draw has
/// the same distribution; a seed repeats the draws.
fn multinomial_draws_by_weight(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    ember::manual_seed(11);
    let w = Tensor::new([[1.0f32, 2.0, 0.0, 7.0], [5.0, 0.0, 5.0, 0.0]], dev)?;
    let n = 20_000;
    let draws = w.multinomial(n, true)?;
    assert_eq!(draws.shape(), &[2, n]);
    for (row, p) in draws
        .to_vec2::<i64>()?
        .iter()
        .zip([[0.1, 0.2, 0.0, 0.7], [0.5, 0.0, 0.5, 0.0]])
    {
        for (c, &pc) in p.iter().enumerate() {
            let count = row.iter().filter(|&&x| x == c as i64).count() as f64;
            let (mean, sd) = (n as f64 * pc, (n as f64 * pc * (1.0 - pc)).sqrt());
            assert!(
                (count - mean).abs() <= 5.0 * sd + 1e-9,
                "category {c}: {count} of {n}, expected {mean}"
            );
        }
    }
    // without replacement: distinct, weight-0 categories last or never
    let picks = w
        .repeat(&[500, 1])?
        .multinomial(2, false)?
        .to_vec2::<i64>()?;
    let mut first = [0usize; 4];
    for (r, p) in picks.iter().enumerate() {
        assert_ne!(p[0], p[1], "row {r}: {p:?}");
        if r % 2 == 1 {
            assert!(p.iter().all(|&c| c == 0 || c == 2), "row {r}: {p:?}");
        } else {
            assert!(p.iter().all(|&c| c != 2), "row {r}: {p:?}");
            first[p[0] as usize] += 1;
        }
    }
    // the first pick of the even rows is a draw with the weights 0.1, 0.2, 0, 0.7
    for (c, pc) in [0.1f64, 0.2, 0.0, 0.7].iter().enumerate() {
        let (mean, sd) = (500.0 * pc, (500.0 * pc * (1.0 - pc)).sqrt());
        assert!(
            (first[c] as f64 - mean).abs() <= 5.0 * sd + 1e-9,
            "first pick {c}: {}",
            first[c]
        );
    }
    // all categories without replacement: a permutation of the nonzero ones first
    let all = Tensor::new([3.0f64, 1.0, 2.0], dev)?
        .multinomial(3, false)?
        .to_vec1::<i64>()?;
    let mut sorted = all.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, [0, 1, 2]);
    ember::manual_seed(5);
    let a = w.multinomial(8, true)?.to_vec2::<i64>()?;
    ember::manual_seed(5);
    assert_eq!(w.multinomial(8, true)?.to_vec2::<i64>()?, a);
    // float64 weights are drawn in float64: weights below float32's range, and
    // above it, are still a distribution (the second: category 0 but for 1e-39)
    let tiny = Tensor::new([1e-50f64, 3e-50], dev)?.multinomial(400, true)?;
    let ones = tiny.to_vec1::<i64>()?.iter().filter(|&&i| i == 1).count();
    assert!(
        (250..=350).contains(&ones),
        "{ones} of 400 drew the 3e-50 weight"
    );
    let huge = Tensor::new([1e39f64, 1.0], dev)?.multinomial(50, true)?;
    assert_eq!(huge.to_vec1::<i64>()?, vec![0i64; 50]);
    // a weight of 0 beside a subnormal one is never drawn
    let sub = Tensor::new([0.0f32, 1e-45], dev)?.multinomial(200, true)?;
    assert!(sub.to_vec1::<i64>()?.iter().all(|&i| i == 1));
    // as many draws as categories (WeightedRandomSampler's use), in memory of
    // their size: a dataset's length of each
    let k = 200_000;
    let big = Tensor::ones([k], DType::F32, dev)?.multinomial(k, true)?;
    let seen = big.to_vec1::<i64>()?;
    assert!(seen.iter().all(|&i| (0..k as i64).contains(&i)));
    let distinct: std::collections::HashSet<_> = seen.iter().collect();
    // (1 - 1/e of the categories, within a few standard deviations)
    let expect = k as f64 * (1.0 - (-1.0f64).exp());
    assert!(
        (distinct.len() as f64 - expect).abs() < 2000.0,
        "{}",
        distinct.len()
    );
    Ok(())
}

/// Ranges and masks are computed on the tensor's device (so that a CUDA graph
/// capture holds them), to the bit what the host computes: linspace's fused
/// multiply-adds from both ends, arange's `start + i · step`, long ranges, the
/// identity and the triangles.
fn ranges_are_the_hosts_to_the_bit(dev: &Device) -> Result<()> {
    // the host's formula, as torch's vectorised CPU kernel computes it
    let want = |a: f64, b: f64, n: usize| -> Vec<f64> {
        let step = if n > 1 { (b - a) / (n - 1) as f64 } else { 0.0 };
        (0..n)
            .map(|i| {
                if i < n / 2 || n == 1 {
                    step.mul_add(i as f64, a)
                } else {
                    (-step).mul_add((n - 1 - i) as f64, b)
                }
            })
            .collect()
    };
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let mut cases: Vec<(f64, f64, usize)> = vec![
        (-3.0, 1.0, 7),
        (-3.0, 11.0, 7),
        (-3.0, 9.0, 10),
        (0.0, 1.0, 100),
        (0.1, 0.7, 4),
        (5.0, 5.0, 3),
        (1e-300, 3e-300, 5),
        (-1e300, 1e300, 9),
        (1e6, 1e6 + 1e-6, 11),
        (0.0, 1.0, 5000),
        (-0.0, -1.0, 3),
        (1.0, f64::INFINITY, 3),
        (2.5, 2.5, 1),
        (0.0, 1.0, 0),
    ];
    let mut r = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..200 {
        r = r
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let a = ((r >> 40) % 61) as f64 - 30.0;
        let b = ((r >> 20) % 61) as f64 - 30.0 + ((r >> 8) % 8) as f64 / 8.0;
        cases.push((a, b, (r % 50) as usize + 1));
    }
    for &(a, b, n) in &cases {
        let got = Tensor::linspace(a, b, n, DType::F64, dev)?.to_vec::<f64>()?;
        assert_eq!(bits(&got), bits(&want(a, b, n)), "linspace({a}, {b}, {n})");
        if a.is_finite() && b.is_finite() && a.abs() < 1e15 && b.abs() < 1e15 {
            let (ta, tb) = (a.trunc(), b.trunc());
            let ints = Tensor::linspace(a, b, n, DType::I64, dev)?.to_vec::<i64>()?;
            let host: Vec<i64> = want(ta, tb, n).iter().map(|&x| x as i64).collect();
            assert_eq!(ints, host, "int64 linspace({a}, {b}, {n})");
        }
        if a.abs() < 1e38 && b.abs() < 1e38 {
            let f = Tensor::linspace(a, b, n, DType::F32, dev)?.to_vec::<f32>()?;
            let host: Vec<f32> = want(a, b, n).iter().map(|&x| x as f32).collect();
            assert_eq!(f, host, "float32 linspace({a}, {b}, {n})");
        }
    }
    for (s, e, st) in [
        (0.0, 1.0, 0.1),
        (-2.5, 7.0, 0.3),
        (10.0, -3.0, -0.7),
        (0.0, 3000.0, 1.5),
    ] {
        let got = Tensor::arange_step(s, e, st, DType::F64, dev)?.to_vec::<f64>()?;
        let n = ((e - s) / st).ceil() as usize;
        let host: Vec<f64> = (0..n).map(|i| s + i as f64 * st).collect();
        assert_eq!(bits(&got), bits(&host), "arange({s}, {e}, {st})");
    }
    // past one row of counts, and past one row of rows
    for (s, n) in [
        (-7i64, 1024usize),
        (5, 1025),
        (-3, 4097),
        (1 << 40, 1_100_000),
    ] {
        let got = Tensor::arange(s, s + n as i64, dev)?;
        assert!(got.is_contiguous());
        let host: Vec<i64> = (s..s + n as i64).collect();
        assert_eq!(got.to_vec::<i64>()?, host);
    }
    let wide = Tensor::arange_step(
        i64::MIN as f64,
        3.0 * 2f64.powi(61), // i · step wraps around, the sum does not
        2f64.powi(62),
        DType::I64,
        dev,
    )?;
    assert_eq!(
        wide.to_vec::<i64>()?,
        vec![i64::MIN, -(1 << 62), 0, 1 << 62]
    );
    let e = Tensor::eye_rect(3, 1500, DType::F32, dev)?.to_vec2::<f32>()?;
    for (i, row) in e.iter().enumerate() {
        assert!(row
            .iter()
            .enumerate()
            .all(|(j, &x)| x == (i == j) as u8 as f32));
    }
    let x = Tensor::arange(1i64, 13, dev)?.reshape([3, 4])?;
    for k in [-4i64, -1, 0, 2, 5, i64::MAX, i64::MIN] {
        let (lo, up) = (x.tril(k)?.to_vec2::<i64>()?, x.triu(k)?.to_vec2::<i64>()?);
        for i in 0..3 {
            for j in 0..4 {
                let v = (4 * i + j + 1) as i64;
                let d = j as i64 - i as i64;
                assert_eq!(lo[i][j], if d <= k { v } else { 0 }, "tril({k})");
                assert_eq!(up[i][j], if d >= k { v } else { 0 }, "triu({k})");
            }
        }
    }
    Ok(())
}

device_test!(
    ranges_are_the_hosts_to_the_bit,
    multinomial_draws_by_weight,
    zeros_ones_full,
    arange_linspace_eye,
    random_is_seeded,
    from_rust_data,
    dtype_conversions,
    half_types_round_like_pytorch
);

#[test]
fn cuda_tensors_need_a_gpu() {
    let _g = super::rng_lock();
    if ember::cuda::is_available() {
        return;
    }
    let e = Tensor::zeros([2], DType::F32, &Device::Cuda(0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("CUDA is not available"), "{e}");
    let t = Tensor::zeros([2], DType::F32, &Device::Cpu).unwrap();
    assert!(t.to(&Device::Cuda(0)).is_err() && t.cuda(1).is_err());
    assert!(Tensor::randn([2], &"cuda:0".parse().unwrap()).is_err());
    assert_eq!(t.cpu().unwrap().device(), Device::Cpu);
}

// ---- PyTorch parity: integer linspace, std of huge float32, pooling ---------------

/// Integer linspace: the endpoints truncated to the dtype first, the values in f64
/// truncated back (values from torch).
fn linspace_in_integers(dev: &Device) -> Result<()> {
    let ints = |s: f64, e: f64, n: usize| -> Result<Vec<i64>> {
        Tensor::linspace(s, e, n, DType::I64, dev)?.to_vec::<i64>()
    };
    assert_eq!(ints(0.0, 10.0, 4)?, vec![0, 3, 6, 10]);
    assert_eq!(ints(0.0, 10.0, 5)?, vec![0, 2, 5, 7, 10]);
    assert_eq!(ints(-5.0, 5.0, 4)?, vec![-5, -1, 1, 5]);
    assert_eq!(ints(0.5, 9.7, 4)?, vec![0, 3, 6, 9]);
    assert_eq!(ints(-2.7, 3.9, 5)?, vec![-2, 0, 0, 1, 3]);
    assert_eq!(ints(5.0, 0.0, 7)?, vec![5, 4, 3, 2, 1, 0, 0]);
    assert_eq!(ints(-7.9, -0.5, 6)?, vec![-7, -5, -4, -2, -1, 0]);
    let u = Tensor::linspace(-5, 5, 4, DType::U8, dev)?;
    assert_eq!(u.to_vec::<u8>()?, vec![251, 169, 87, 5]);
    assert!(Tensor::linspace(0, 300, 4, DType::U8, dev).is_err());
    assert!(Tensor::linspace(0.0, 1e20, 4, DType::I64, dev).is_err());
    assert!(Tensor::linspace(0, 1, 5, DType::Bool, dev).is_err());
    Ok(())
}

/// float32 values near 1e30: the variance overflows (1e60, as in PyTorch), the
/// standard deviation does not; over a long lane (split across blocks on a GPU)
/// too, where each square overflows float32 but the variance does not.
fn std_of_huge_float32(dev: &Device) -> Result<()> {
    let x = Tensor::from_slice(&[1e30f32, 2e30, 3e30], [3], dev)?;
    assert!(x.var_all()?.item::<f32>()?.is_infinite());
    assert_close(&vals(&x.std_all()?), &[1e30], 1e-6, 0.0);
    assert_close(
        &vals(&x.std_correction(0, 0.0, false)?),
        &[8.164966e29],
        1e-6,
        0.0,
    );
    let n = 4096;
    let v: Vec<f32> = (0..n).map(|i| (1e19 + i as f64 * 1e16) as f32).collect();
    let long = Tensor::from_vec(v, [n], dev)?;
    // variance of an arithmetic progression: step^2 * n (n + 1) / 12
    let want = 1e32 * (n * (n + 1)) as f64 / 12.0;
    assert_close(&vals(&long.var(0, false)?), &[want], 1e-4, 0.0);
    assert_close(&vals(&long.std_all()?), &[want.sqrt()], 1e-4, 0.0);
    let h = Tensor::from_slice(&[1e4f32, 2e4, 3e4], [3], dev)?.to_dtype(DType::F16)?;
    assert_eq!(vals(&h.std_all()?), vec![10000.0]);
    assert!(vals(&h.var_all()?)[0].is_infinite());
    Ok(())
}

/// Ceil-mode windows wider than the input, and int64 / uint8 pooling (values from
/// torch).
fn pooling_accepted_like_pytorch(dev: &Device) -> Result<()> {
    let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], [1, 1, 2, 2], dev)?;
    let o = Pool2dOptions::new(3).stride(2).ceil_mode(true);
    let m = x.max_pool2d(o)?;
    assert_eq!((m.shape(), vals(&m)), (&[1usize, 1, 1, 1][..], vec![4.0]));
    assert_eq!(vals(&x.avg_pool2d(o)?), vec![2.5]);
    let a = x.avg_pool2d(o.padding(1))?;
    assert_close(&vals(&a), &[1.1111111, 1.0, 1.1666666, 1.0], 1e-6, 1e-7);
    assert!(x
        .max_pool2d(Pool2dOptions::new(3).stride(1).ceil_mode(true))
        .is_err());

    let xi = Tensor::arange(0i64, 16, dev)?.reshape([1, 1, 4, 4])?;
    let m = xi.max_pool2d(Pool2dOptions::new(2))?;
    assert_eq!(
        (m.dtype(), m.to_vec::<i64>()?),
        (DType::I64, vec![5, 7, 13, 15])
    );
    assert_eq!(
        xi.avg_pool2d(Pool2dOptions::new(2))?.to_vec::<i64>()?,
        vec![2, 4, 10, 12]
    );
    assert_eq!(
        xi.neg()?
            .avg_pool2d(Pool2dOptions::new(2))?
            .to_vec::<i64>()?,
        vec![-2, -4, -10, -12]
    );
    let o = Pool2dOptions::new(3)
        .stride(2)
        .padding(1)
        .count_include_pad(false);
    assert_eq!(xi.avg_pool2d(o)?.to_vec::<i64>()?, vec![2, 4, 8, 10]);
    let u = xi.to_dtype(DType::U8)?;
    assert_eq!(
        u.max_pool2d(Pool2dOptions::new(2))?.to_vec::<u8>()?,
        vec![5, 7, 13, 15]
    );
    assert!(u.avg_pool2d(Pool2dOptions::new(2)).is_err());
    assert!(xi.gt(3)?.max_pool2d(Pool2dOptions::new(2)).is_err());
    // a dilated window past the padding holds no element: -inf, or the integer
    // dtype's lowest value (values from torch)
    let empty = Pool2dOptions::new(2).padding(1).dilation(2);
    let one = Tensor::full([1, 1, 1, 1], 5.0, DType::F32, dev)?;
    assert_eq!(vals(&one.max_pool2d(empty)?), vec![f64::NEG_INFINITY]);
    let one_i = one.to_dtype(DType::I64)?.max_pool2d(empty)?;
    assert_eq!(one_i.to_vec::<i64>()?, vec![i64::MIN]);
    let one_u = one.to_dtype(DType::U8)?.max_pool2d(empty)?;
    assert_eq!(one_u.to_vec::<u8>()?, vec![0]);
    // only the batch dim may be empty
    for shape in [
        &[1usize, 0, 4, 4][..],
        &[0, 4, 4],
        &[2, 0, 3],
        &[1, 1, 0, 3],
    ] {
        let e = Tensor::zeros(shape, DType::F32, dev)?.max_pool2d(Pool2dOptions::new(2));
        let msg = e.unwrap_err().to_string();
        assert!(
            msg.contains("optional 0 dim batch size"),
            "{shape:?}: {msg}"
        );
        let e = Tensor::zeros(shape, DType::I64, dev)?.avg_pool2d(Pool2dOptions::new(2));
        assert!(e.is_err(), "{shape:?}");
    }
    let none = Tensor::zeros([0, 1, 4, 4], DType::F32, dev)?.max_pool2d(Pool2dOptions::new(2))?;
    assert_eq!(none.shape(), &[0, 1, 2, 2]);
    Ok(())
}

device_test!(
    linspace_in_integers,
    std_of_huge_float32,
    pooling_accepted_like_pytorch
);

/// `uniform` refuses bounds its dtype cannot hold, and a width past its
/// largest value, with PyTorch's errors (the draws rounded to infinities).
#[test]
fn uniform_refuses_bounds_its_dtype_cannot_hold() {
    let dev = Device::Cpu;
    for (lo, hi, dt, want) in [
        (0.0, 1e6, DType::F16, "to is out of bounds for c10::Half"),
        (-1e300, 1e300, DType::F32, "from is out of bounds for float"),
        (
            0.0,
            1e39,
            DType::BF16,
            "to is out of bounds for c10::BFloat16",
        ),
        (
            -6e4,
            6e4,
            DType::F16,
            "to-from <= std::numeric_limits<Half>::max()",
        ),
        (
            0.0,
            3.39e38,
            DType::BF16,
            "to is out of bounds for c10::BFloat16",
        ),
        (
            0.0,
            f64::INFINITY,
            DType::F32,
            "to is out of bounds for float",
        ),
    ] {
        let e = Tensor::uniform(lo, hi, [4], dt, &dev)
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{lo}, {hi}, {dt}: {e}");
    }
    let ok = Tensor::uniform(-3e4, 3e4, [64], DType::F16, &dev).unwrap();
    assert!(vals(&ok).iter().all(|v| v.is_finite() && v.abs() <= 3e4));
}
