//! The in-place random fills (`uniform_`, `normal_`, `exponential_`,
//! `geometric_`, `log_normal_`, `cauchy_`, `bernoulli_`, `random_`),
//! `bernoulli` and `randint_like`: each sample's statistics against the
//! distribution's (a seeded generator, so a run repeats exactly; the bounds
//! are several standard errors wide), dtypes, views filled in place, autograd's
//! rules, and PyTorch's refusals in its words.

use ember::prelude::*;
use ember::Generator;

const N: usize = 40_000;

/// The values of `t` as f64.
fn values(t: &Tensor) -> Result<Vec<f64>> {
    t.to_dtype(DType::F64)?.to_vec::<f64>()
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

fn std(v: &[f64]) -> f64 {
    let m = mean(v);
    (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() - 1) as f64).sqrt()
}

/// The `q` quantile of `v` (nearest rank).
fn quantile(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s[((s.len() - 1) as f64 * q).round() as usize]
}

fn near(what: &str, got: f64, want: f64, tol: f64) {
    assert!(
        (got - want).abs() <= tol,
        "{what}: {got} vs {want} (± {tol})"
    );
}

fn random_fills_follow_their_distributions(dev: &Device) -> Result<()> {
    Generator::new(5).scope(|| -> Result<()> {
        let t = Tensor::zeros([N], DType::F32, dev)?;
        t.uniform_(2.0, 5.0)?;
        let v = values(&t)?;
        assert!(v.iter().all(|x| (2.0..5.0).contains(x)));
        near("uniform mean", mean(&v), 3.5, 0.03);
        near("uniform std", std(&v), 3.0 / 12f64.sqrt(), 0.02);

        t.normal_(1.0, 2.0)?;
        let v = values(&t)?;
        near("normal mean", mean(&v), 1.0, 0.05);
        near("normal std", std(&v), 2.0, 0.05);

        t.exponential_(2.0)?;
        let v = values(&t)?;
        assert!(v.iter().all(|&x| x >= 0.0));
        near("exponential mean", mean(&v), 0.5, 0.015);
        near(
            "exponential median",
            quantile(&v, 0.5),
            2f64.ln() / 2.0,
            0.015,
        );

        t.log_normal_(0.0, 0.5)?;
        let v = values(&t)?;
        assert!(v.iter().all(|&x| x > 0.0));
        near("log-normal median", quantile(&v, 0.5), 1.0, 0.02);
        near("log-normal mean", mean(&v), 0.125f64.exp(), 0.02);

        t.cauchy_(1.0, 2.0)?;
        let v = values(&t)?;
        near("cauchy median", quantile(&v, 0.5), 1.0, 0.06);
        near("cauchy lower quartile", quantile(&v, 0.25), -1.0, 0.08);
        near("cauchy upper quartile", quantile(&v, 0.75), 3.0, 0.08);

        let counts = Tensor::zeros([N], DType::I64, dev)?;
        counts.geometric_(0.25)?;
        let v = values(&counts)?;
        assert!(v.iter().all(|&x| x >= 1.0));
        near("geometric mean", mean(&v), 4.0, 0.1);
        near(
            "geometric P(1)",
            mean(
                &v.iter()
                    .map(|&x| (x == 1.0) as u8 as f64)
                    .collect::<Vec<_>>(),
            ),
            0.25,
            0.01,
        );

        for dt in [DType::F32, DType::F16, DType::I64, DType::U8, DType::Bool] {
            let b = Tensor::zeros([N], dt, dev)?;
            b.bernoulli_(0.3)?;
            assert_eq!(b.dtype(), dt);
            let v = values(&b)?;
            assert!(v.iter().all(|&x| x == 0.0 || x == 1.0), "{dt:?}");
            near(&format!("bernoulli_ {dt:?}"), mean(&v), 0.3, 0.015);
        }

        let ints = Tensor::zeros([N], DType::U8, dev)?;
        ints.random_(3, 7)?;
        let v = values(&ints)?;
        for k in 3..7 {
            let share = v.iter().filter(|&&x| x == k as f64).count() as f64 / N as f64;
            near(&format!("random_ share of {k}"), share, 0.25, 0.015);
        }
        assert_eq!(v.iter().filter(|&&x| !(3.0..7.0).contains(&x)).count(), 0);

        let like = Tensor::zeros([N], DType::F32, dev)?.randint_like(-2, 3)?;
        assert_eq!((like.dtype(), like.shape()), (DType::F32, &[N][..]));
        let v = values(&like)?;
        assert!(v.iter().all(|x| [-2.0, -1.0, 0.0, 1.0, 2.0].contains(x)));
        near("randint_like mean", mean(&v), 0.0, 0.03);
        Ok(())
    })
}

/// `bernoulli` draws each element with its own probability: 0 and 1 are
/// certain, the rest follow theirs.
fn bernoulli_takes_each_probability(dev: &Device) -> Result<()> {
    Generator::new(9).scope(|| -> Result<()> {
        for dt in [DType::F64, DType::F32, DType::BF16] {
            let p = Tensor::new([0.0f64, 1.0, 0.2, 0.7], dev)?
                .to_dtype(dt)?
                .reshape([1, 4])?
                .expand([N / 4, 4])?;
            let b = p.bernoulli()?;
            assert_eq!((b.dtype(), b.shape()), (dt, &[N / 4, 4][..]));
            let cols = b.to_dtype(DType::F64)?.mean(0, false)?.to_vec::<f64>()?;
            assert_eq!((cols[0], cols[1]), (0.0, 1.0), "{dt:?}");
            near("p = 0.2", cols[2], 0.2, 0.025);
            near("p = 0.7", cols[3], 0.7, 0.025);
        }
        Ok(())
    })
}

/// A seed repeats a fill; a view is filled in place, leaving the rest.
fn random_fills_repeat_and_fill_views(dev: &Device) -> Result<()> {
    let fill = |seed| {
        Generator::new(seed).scope(|| -> Result<Vec<f64>> {
            let t = Tensor::zeros([6], DType::F64, dev)?;
            t.normal_(0.0, 1.0)?;
            values(&t)
        })
    };
    assert_eq!(fill(3)?, fill(3)?);
    assert_ne!(fill(3)?, fill(4)?);
    let t = Tensor::zeros([4, 5], DType::F32, dev)?;
    t.narrow(1, 1, 2)?.uniform_(1.0, 2.0)?;
    let rows = t.to_vec2::<f32>()?;
    for row in rows {
        assert_eq!((row[0], row[3], row[4]), (0.0, 0.0, 0.0));
        assert!((1.0..2.0).contains(&row[1]) && (1.0..2.0).contains(&row[2]));
    }
    Ok(())
}

/// As PyTorch: a leaf that requires a gradient is refused (allowed under
/// `no_grad`); a fill inside a graph cuts the gradient of the old values.
fn random_fills_follow_autograd(dev: &Device) -> Result<()> {
    let w = Tensor::zeros([3], DType::F32, dev)?.requires_grad_(true)?;
    let msg = w.uniform_(0.0, 1.0).expect_err("leaf").to_string();
    assert!(msg.contains("a leaf Variable that requires grad"), "{msg}");
    ember::autograd::no_grad(|| w.normal_(0.0, 1.0))?;
    assert!(values(&w)?.iter().any(|&x| x != 0.0));
    let x = Tensor::ones([3], DType::F32, dev)?.requires_grad_(true)?;
    let y = x.mul(2.0)?;
    y.bernoulli_(0.5)?;
    y.add(&x)?.sum_all()?.backward()?;
    assert_eq!(values(&x.grad().unwrap())?, [1.0, 1.0, 1.0]);
    Ok(())
}

/// PyTorch's refusals, in its words.
fn random_fills_refuse_as_pytorch(dev: &Device) -> Result<()> {
    let f = Tensor::zeros([3], DType::F32, dev)?;
    let i = Tensor::zeros([3], DType::I64, dev)?;
    let u8s = Tensor::zeros([3], DType::U8, dev)?;
    let cases: Vec<(Result<()>, &str)> = vec![
        (f.exponential_(-1.0), "exponential_ expects lambda > 0.0, but found lambda=-1"),
        (f.exponential_(0.0), "exponential_ expects lambda > 0.0, but found lambda=0"),
        (f.geometric_(1.5), "geometric_ expects p to be in (0, 1), but got p=1.5"),
        (f.geometric_(1.0), "geometric_ expects p to be in (0, 1), but got p=1"),
        (f.bernoulli_(1.5), "bernoulli_ expects p to be in [0, 1], but got p=1.5"),
        (f.log_normal_(0.0, -1.0), "log_normal_ expects std > 0.0, but found std=-1"),
        (f.log_normal_(0.0, 0.0), "log_normal_ expects std > 0.0, but found std=0"),
        (f.cauchy_(0.0, -1.0), "cauchy_ expects sigma > 0.0, but found sigma=-1"),
        (f.random_(5, 2), "random_ expects 'from' to be less than 'to', but got from=5 >= to=2"),
        (u8s.random_(0, 300), "to - 1 is out of bounds for unsigned char"),
        (i.uniform_(2.0, 5.0), "\"check_uniform_bounds\" not implemented for 'Long'"),
        (i.normal_(0.0, 1.0), "\"normal_kernel_cpu\" not implemented for 'Long'"),
        (i.exponential_(1.0), "Exponential distribution is a continuous probability distribution. dtype must be a floating point but you specified Long"),
        (f.normal_(0.0, -1.0), "expects std >= 0.0, but found std -1"),
        (f.uniform_(3.0, 1.0), "found from=3, to=1"),
    ];
    for (got, phrase) in cases {
        let msg = got.expect_err(phrase).to_string();
        assert!(msg.contains(phrase), "{phrase}: {msg}");
    }
    let outside = "Expected p_in >= 0 && p_in <= 1 to be true, but got false.";
    for p in [[0.5f32, 1.5], [0.5, f32::NAN], [-0.1, 0.2]] {
        let msg = Tensor::new(p, dev)?.bernoulli().expect_err("p").to_string();
        assert!(msg.contains(outside), "{p:?}: {msg}");
    }
    let msg = i.bernoulli().expect_err("int").to_string();
    assert!(
        msg.contains("\"bernoulli_tensor_cpu_p_\" not implemented for 'Long'"),
        "{msg}"
    );
    // nothing was written by a refused fill
    assert_eq!(values(&f)?, [0.0; 3]);
    Ok(())
}

device_test!(
    random_fills_follow_their_distributions,
    bernoulli_takes_each_probability,
    random_fills_repeat_and_fill_views,
    random_fills_follow_autograd,
    random_fills_refuse_as_pytorch,
);
