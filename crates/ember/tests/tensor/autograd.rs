//! Gradient checks: every backward rule against central finite differences in f64,
//! plus the graph mechanics (accumulation, no_grad, detach, freeing).

use super::{assert_close, vals};
use ember::prelude::*;

/// Checks d(sum(f(x) * w))/dx by finite differences for each input, where `w` is a
/// fixed random weight so every output element matters.
fn grad_check(
    dev: &Device,
    inputs: &[Tensor],
    f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
) -> Result<()> {
    let xs: Vec<Tensor> = inputs
        .iter()
        .map(|t| {
            t.to_dtype(DType::F64)
                .and_then(|t| t.copy()?.requires_grad_(true))
        })
        .collect::<Result<_>>()?;
    let out = f(&xs)?;
    let w = Tensor::linspace(-1.0, 1.3, out.numel(), DType::F64, dev)?.reshape(out.shape())?;
    out.mul(&w)?.sum_all()?.backward()?;
    let eps = 1e-6;
    for (k, x) in xs.iter().enumerate() {
        let analytic = vals(&x.grad().expect("input has a gradient"));
        let base = vals(x);
        let mut numeric = vec![0.0; base.len()];
        for i in 0..base.len() {
            let eval = |delta: f64| -> Result<f64> {
                let mut v = base.clone();
                v[i] += delta;
                let mut args: Vec<Tensor> = xs.iter().map(|t| t.detach()).collect();
                args[k] = Tensor::from_vec(v, x.shape(), dev)?;
                ember::no_grad(|| f(&args)?.mul(&w)?.sum_all()?.item::<f64>())
            };
            numeric[i] = (eval(eps)? - eval(-eps)?) / (2.0 * eps);
        }
        assert_close(&analytic, &numeric, 1e-5, 1e-6);
    }
    Ok(())
}

fn rn(dev: &Device, shape: &[usize]) -> Tensor {
    Tensor::randn(shape, dev)
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
}

/// Positive inputs for log/sqrt/pow.
fn pos(dev: &Device, shape: &[usize]) -> Tensor {
    rn(dev, shape).abs().unwrap().add(0.5).unwrap()
}

fn elementwise_rules(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    ember::manual_seed(10);
    let (a, b) = (rn(dev, &[3, 4]), rn(dev, &[4]));
    let (p, q) = (pos(dev, &[3, 4]), pos(dev, &[3, 1]));
    grad_check(dev, &[a.clone(), b.clone()], &|x| x[0].add(&x[1]))?;
    grad_check(dev, &[a.clone(), b.clone()], &|x| x[0].sub(&x[1]))?;
    grad_check(dev, &[a.clone(), b.clone()], &|x| x[0].mul(&x[1]))?;
    grad_check(dev, &[a.clone(), q.clone()], &|x| x[0].div(&x[1]))?;
    grad_check(dev, &[a.clone(), b.clone()], &|x| x[0].maximum(&x[1]))?;
    grad_check(dev, &[a.clone(), b.clone()], &|x| x[0].minimum(&x[1]))?;
    grad_check(dev, &[p.clone(), q.clone()], &|x| x[0].pow(&x[1]))?;
    grad_check(dev, &[a.clone()], &|x| {
        x[0].add(2.0)?.mul(3.0)?.sub(1.0)?.div(4.0)
    })?;
    for f in [
        Tensor::neg,
        Tensor::exp,
        Tensor::tanh,
        Tensor::sin,
        Tensor::cos,
        Tensor::square,
        Tensor::sigmoid,
        Tensor::gelu,
        Tensor::gelu_tanh,
        Tensor::erf,
    ] {
        grad_check(dev, &[a.clone()], &|x| f(&x[0]))?;
    }
    for f in [
        Tensor::log,
        Tensor::sqrt,
        Tensor::recip,
        Tensor::abs,
        Tensor::relu,
    ] {
        grad_check(dev, &[p.clone()], &|x| f(&x[0]))?;
    }
    // relu and abs away from their kink
    let away = a.add(&a.gt(0.0)?.to_dtype(DType::F64)?.mul(0.2)?.sub(0.1)?)?;
    grad_check(dev, &[away.clone()], &|x| x[0].relu())?;
    grad_check(dev, &[away.clone()], &|x| x[0].abs())?;
    grad_check(dev, &[p.clone()], &|x| x[0].pow(2.5))?;
    grad_check(dev, &[away.clone()], &|x| x[0].clamp(Some(-0.5), Some(0.5)))?;
    let cond = a.gt(0.2)?;
    grad_check(dev, &[a.clone(), b.clone()], &|x| cond.where_(&x[0], &x[1]))?;
    grad_check(dev, &[a.clone()], &|x| x[0].masked_fill(&cond, 0.0))?;
    Ok(())
}

fn reduction_rules(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    ember::manual_seed(11);
    let a = rn(dev, &[3, 4, 5]);
    grad_check(dev, &[a.clone()], &|x| x[0].sum_all())?;
    grad_check(dev, &[a.clone()], &|x| x[0].sum([0, 2], false))?;
    grad_check(dev, &[a.clone()], &|x| x[0].mean(1, true))?;
    grad_check(dev, &[a.clone()], &|x| x[0].mean_all())?;
    grad_check(dev, &[a.clone()], &|x| x[0].max(-1, false))?;
    grad_check(dev, &[a.clone()], &|x| x[0].min(0, true))?;
    grad_check(dev, &[a.clone()], &|x| x[0].max_all())?;
    grad_check(dev, &[a.clone()], &|x| x[0].var(1, false))?;
    grad_check(dev, &[a.clone()], &|x| x[0].std_correction(2, 0.0, true))?;
    grad_check(dev, &[a.clone()], &|x| x[0].softmax(-1))?;
    grad_check(dev, &[a.clone()], &|x| x[0].softmax(1))?;
    grad_check(dev, &[a.clone()], &|x| x[0].log_softmax(0))?;
    grad_check(dev, &[a.clone()], &|x| x[0].log_softmax(-1))?;
    Ok(())
}

fn matmul_and_view_rules(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    ember::manual_seed(12);
    let (m, n) = (rn(dev, &[3, 4]), rn(dev, &[4, 2]));
    grad_check(dev, &[m.clone(), n.clone()], &|x| x[0].matmul(&x[1]))?;
    grad_check(dev, &[rn(dev, &[4]), n.clone()], &|x| x[0].matmul(&x[1]))?;
    grad_check(dev, &[m.clone(), rn(dev, &[4])], &|x| x[0].matmul(&x[1]))?;
    grad_check(dev, &[rn(dev, &[4]), rn(dev, &[4])], &|x| {
        x[0].matmul(&x[1])
    })?;
    grad_check(dev, &[rn(dev, &[2, 1, 3, 4]), rn(dev, &[5, 4, 2])], &|x| {
        x[0].matmul(&x[1])
    })?;
    grad_check(dev, &[m.clone(), rn(dev, &[2, 4])], &|x| {
        x[0].matmul(&x[1].t()?)
    })?;
    let a = rn(dev, &[2, 3, 4]);
    grad_check(dev, &[a.clone()], &|x| x[0].reshape([4, 6]))?;
    grad_check(dev, &[a.clone()], &|x| {
        x[0].transpose(0, 2)?.reshape([4, 6])
    })?;
    grad_check(dev, &[a.clone()], &|x| x[0].permute([2, 0, 1]))?;
    grad_check(dev, &[a.clone()], &|x| x[0].narrow(1, 1, 2))?;
    grad_check(dev, &[a.clone()], &|x| x[0].slice(2, Some(0), None, 2))?;
    grad_check(dev, &[a.clone()], &|x| x[0].select(0, 1))?;
    grad_check(dev, &[a.clone()], &|x| x[0].i((.., 1..3, 2)))?;
    grad_check(dev, &[a.clone()], &|x| {
        x[0].unsqueeze(1)?.squeeze(1)?.flatten(0, 1)
    })?;
    grad_check(dev, &[rn(dev, &[3, 1])], &|x| x[0].expand([2, 3, 4]))?;
    grad_check(dev, &[a.clone()], &|x| {
        x[0].t().or_else(|_| x[0].transpose(0, 1))?.contiguous()
    })?;
    grad_check(dev, &[a.clone(), rn(dev, &[2, 1, 4])], &|x| {
        Tensor::cat(&[&x[0], &x[1]], 1)
    })?;
    grad_check(dev, &[m.clone(), m.clone()], &|x| {
        Tensor::stack(&[&x[0], &x[1]], 0)
    })?;
    grad_check(dev, &[m.clone()], &|x| Ok(x[0].chunk(2, 1)?[1].clone()))?;
    // a cast passes the gradient through, converted back to the input's dtype
    let c = m.copy()?.requires_grad_(true)?;
    c.to_dtype(DType::F32)?.mul(3.0)?.sum_all()?.backward()?;
    let gc = c.grad().unwrap();
    assert_eq!((gc.dtype(), vals(&gc)), (DType::F64, vec![3.0; 12]));
    let idx = Tensor::new([2i64, 0, 2], dev)?;
    grad_check(dev, &[m.clone()], &|x| x[0].index_select(0, &idx))?;
    grad_check(dev, &[m.clone()], &|x| x[0].index_select(1, &idx))?;
    let gi = Tensor::new([[0i64, 3], [1, 1], [2, 0]], dev)?;
    grad_check(dev, &[m.clone()], &|x| x[0].gather(1, &gi))?;
    let src = rn(dev, &[3, 2]);
    grad_check(dev, &[m.clone(), src.clone()], &|x| {
        x[0].scatter_add(1, &gi, &x[1])
    })?;
    Ok(())
}

fn graph_mechanics(dev: &Device) -> Result<()> {
    let x = Tensor::new([1f32, 2., 3.], dev)?.requires_grad_(true)?;
    assert!(x.is_leaf() && x.requires_grad());
    // a value used twice accumulates both paths
    let y = x.mul(&x)?.add(&x)?.sum_all()?;
    assert!(!y.is_leaf() && y.requires_grad());
    y.backward()?;
    assert_eq!(vals(&x.grad().unwrap()), vec![3., 5., 7.]);
    // a second backward through the same graph is refused; a new graph
    // accumulates, in place (PyTorch's `grad += new`: a gradient taken before
    // sees the sum)
    assert!(y.backward().is_err());
    let held = x.grad().unwrap();
    x.mul(2.0)?.sum_all()?.backward()?;
    assert_eq!(vals(&x.grad().unwrap()), vec![5., 7., 9.]);
    assert_eq!(vals(&held), vec![5., 7., 9.]);
    // a gradient set by hand must fit the tensor (PyTorch's errors), and one
    // refused leaves the gradient as it was
    for (bad, what) in [
        (Tensor::new([1f32, 2.], dev)?, "of a different size"),
        (Tensor::new([1f64, 2., 3.], dev)?, "of a different type"),
        (
            Tensor::zeros([3], DType::F32, &Device::Meta)?,
            "located on a different device",
        ),
    ] {
        let e = x.set_grad(Some(bad)).unwrap_err().to_string();
        assert!(e.contains(&format!("assigned grad has data {what}")), "{e}");
    }
    assert_eq!(vals(&x.grad().unwrap()), vec![5., 7., 9.]);
    // backward's own gradient must be on the output's device
    let e = x
        .mul(2.0)?
        .backward_with(&Tensor::zeros([3], DType::F32, &Device::Meta)?)
        .unwrap_err()
        .to_string();
    assert!(e.contains("expected device"), "{e}");
    x.zero_grad();
    assert!(x.grad().is_none());
    // no_grad records nothing; detach cuts the graph but shares storage
    let z = ember::no_grad(|| x.mul(2.0))?;
    assert!(!z.requires_grad());
    {
        let _guard = ember::no_grad_guard();
        assert!(!ember::is_grad_enabled());
        assert!(!x.exp()?.requires_grad());
    }
    assert!(ember::is_grad_enabled());
    // guards dropped out of order (a new one made before the old is dropped):
    // off while any lives, on once all are gone
    let first = ember::no_grad_guard();
    let second = ember::no_grad_guard();
    drop(first);
    assert!(!ember::is_grad_enabled());
    drop(second);
    assert!(ember::is_grad_enabled());
    let d = x.detach();
    assert!(!d.requires_grad() && d.is_leaf());
    assert!(x.mul(&d)?.requires_grad());
    // ops on tensors that need no gradient record nothing
    assert!(!d.add(1.0)?.requires_grad());
    // a detached tensor's flag is its own, also when the original needs no gradient
    let c = d.mul(1.0)?;
    let e = c.detach().requires_grad_(true)?;
    assert!(e.requires_grad() && !c.requires_grad());
    d.detach().requires_grad_(true)?;
    assert!(!d.requires_grad());
    // backward needs a scalar (or an explicit gradient) and a graph
    assert!(x.mul(2.0)?.backward().is_err());
    x.mul(2.0)?
        .backward_with(&Tensor::new([1f32, 0., 1.], dev)?)?;
    assert_eq!(vals(&x.grad().unwrap()), vec![2., 0., 2.]);
    assert!(d.sum_all()?.backward().is_err());
    // only float tensors can require grad; a leaf that does is not updated in place
    // while recording (PyTorch's error)
    assert!(Tensor::new([1i64], dev)?.requires_grad_(true).is_err());
    let e = x.add_(1.0).unwrap_err().to_string();
    assert!(e.contains("a leaf Variable that requires grad"), "{e}");
    ember::no_grad(|| x.add_(1.0))?;
    assert_eq!(vals(&x), vec![2., 3., 4.]);
    // operators on owned tensors that are tracked compute out of place
    let w = x.mul(1.0)?;
    let v = w + &x;
    v.sum_all()?.backward()?;
    Ok(())
}

fn conv_and_pool_rules(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    ember::manual_seed(13);
    let cases = [
        // (n, c, h, w, o, k, stride, pad, dil, groups)
        (2, 3, 6, 6, 4, 3, 1, 1, 1, 1),
        (1, 4, 7, 5, 6, 2, 2, 0, 1, 2),
        (2, 4, 6, 6, 4, 3, 1, 2, 2, 4),
    ];
    for (n, c, h, w, o, k, stride, pad, dil, groups) in cases {
        let opts = Conv2dOptions::default()
            .stride(stride)
            .padding(pad)
            .dilation(dil)
            .groups(groups);
        let (x, wt, b) = (
            rn(dev, &[n, c, h, w]),
            rn(dev, &[o, c / groups, k, k]),
            rn(dev, &[o]),
        );
        grad_check(dev, &[x.clone(), wt.clone(), b.clone()], &|t| {
            t[0].conv2d(&t[1], Some(&t[2]), opts)
        })?;
        grad_check(dev, &[x.clone(), wt.clone()], &|t| {
            t[0].conv2d(&t[1], None, opts)
        })?;
    }
    // unbatched input
    grad_check(dev, &[rn(dev, &[2, 5, 5]), rn(dev, &[3, 2, 3, 3])], &|t| {
        t[0].conv2d(&t[1], None, Conv2dOptions::default())
    })?;
    // pooling: distinct values so every window has a unique max
    let x = Tensor::randperm(2 * 3 * 7 * 7, dev)?
        .to_dtype(DType::F64)?
        .mul(0.01)?
        .reshape([2, 3, 7, 7])?;
    for opts in [
        Pool2dOptions::new(2),
        Pool2dOptions::new(3).stride(2).padding(1),
        Pool2dOptions::new(2).stride(1).dilation(2),
        Pool2dOptions::new(2).ceil_mode(true),
    ] {
        grad_check(dev, &[x.clone()], &|t| t[0].max_pool2d(opts))?;
    }
    for opts in [
        Pool2dOptions::new(2),
        Pool2dOptions::new(3).stride(2).padding(1),
        Pool2dOptions::new(3)
            .stride(2)
            .padding(1)
            .count_include_pad(false),
        Pool2dOptions::new(2).ceil_mode(true),
    ] {
        grad_check(dev, &[x.clone()], &|t| t[0].avg_pool2d(opts))?;
    }
    // adaptive average pooling: global, divisible, overlapping windows, upsampling
    for output in [(1, 1), (7, 1), (3, 4), (9, 8)] {
        let pool = ember::nn::AdaptiveAvgPool2d::new(output);
        grad_check(dev, &[x.clone()], &|t| {
            ember::nn::Module::forward(&pool, &t[0])
        })?;
    }
    Ok(())
}

device_test!(
    elementwise_rules,
    reduction_rules,
    matmul_and_view_rules,
    conv_and_pool_rules,
    graph_mechanics
);

// ---- PyTorch's gradients at ties, at clamp's bounds and at infinite logits -------

/// `max(dim)` / `min(dim)` give the whole gradient to the returned index (the
/// first among ties); `amax`/`amin` (`max`/`min` over dims) keep sharing it.
fn max_min_dim_grad_goes_to_the_index(dev: &Device) -> Result<()> {
    let data = [1.0f32, 3.0, 3.0, 2.0, 2.0, 2.0];
    let x = Tensor::from_slice(&data, [2, 3], dev)?.requires_grad_(true)?;
    let (v, i) = x.max_dim(1, false)?;
    assert_eq!(i.to_vec::<i64>()?, vec![1, 0]);
    v.sum_all()?.backward()?;
    assert_eq!(vals(&x.grad().unwrap()), vec![0.0, 1.0, 0.0, 1.0, 0.0, 0.0]);

    let x = Tensor::from_slice(&data, [2, 3], dev)?.requires_grad_(true)?;
    let (v, i) = x.min_dim(-1, true)?;
    assert_eq!(v.shape(), &[2, 1]);
    assert_eq!(i.to_vec::<i64>()?, vec![0, 0]);
    v.mul(&Tensor::from_slice(&[2.0f32, 5.0], [2, 1], dev)?)?
        .sum_all()?
        .backward()?;
    assert_eq!(vals(&x.grad().unwrap()), vec![2.0, 0.0, 0.0, 5.0, 0.0, 0.0]);

    // amax keeps splitting ties evenly, as torch.amax does
    let x = Tensor::from_slice(&data, [2, 3], dev)?.requires_grad_(true)?;
    x.max(1, false)?.sum_all()?.backward()?;
    assert_close(
        &vals(&x.grad().unwrap()),
        &[0.0, 0.5, 0.5, 1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0],
        1e-6,
        1e-7,
    );
    Ok(())
}

/// clamp passes the gradient only strictly inside the bounds (PyTorch 2.x):
/// values from torch.
fn clamp_grad_at_the_bounds(dev: &Device) -> Result<()> {
    let xs = [
        -1.0f64,
        -0.5,
        0.0,
        0.5,
        1.0,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
    ];
    let grad = |min: Option<f64>, max: Option<f64>| -> Result<Vec<f64>> {
        let x = Tensor::from_slice(&xs, [8], dev)?.requires_grad_(true)?;
        x.clamp(min, max)?.sum_all()?.backward()?;
        Ok(vals(&x.grad().unwrap()))
    };
    let both = [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0];
    assert_eq!(grad(Some(-0.5), Some(0.5))?, both);
    assert_eq!(
        grad(Some(-0.5), None)?,
        [0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0]
    );
    assert_eq!(
        grad(None, Some(0.5))?,
        [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    );
    assert_eq!(grad(Some(0.5), Some(0.5))?, [0.0; 8]);
    assert_eq!(grad(Some(0.5), Some(-0.5))?, [0.0; 8]);
    assert_eq!(
        grad(Some(f64::NEG_INFINITY), Some(f64::INFINITY))?,
        [1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    );
    Ok(())
}

/// binary_cross_entropy_with_logits at ±inf: PyTorch's values (inf, NaN) and a
/// finite gradient `sigmoid(x) - y`.
fn bce_with_logits_at_infinite_logits(dev: &Device) -> Result<()> {
    let inf = f64::INFINITY;
    let x = Tensor::from_slice(&[inf, -inf, inf, -inf, inf, -inf, 0.0f32 as f64], [7], dev)?
        .to_dtype(DType::F32)?
        .requires_grad_(true)?;
    let y = Tensor::from_slice(&[0.0f32, 0.0, 1.0, 1.0, 0.5, 0.5, 0.5], [7], dev)?;
    let l = ember::nn::bce_with_logits(&x, &y, ember::nn::Reduction::None)?;
    let nan = f64::NAN;
    assert_close(
        &vals(&l),
        &[inf, nan, nan, nan, inf, nan, std::f64::consts::LN_2],
        1e-6,
        1e-7,
    );
    l.sum_all()?.backward()?;
    assert_eq!(
        vals(&x.grad().unwrap()),
        vec![1.0, 0.0, 0.0, -1.0, 0.5, -0.5, 0.0]
    );
    Ok(())
}

/// std's gradient (its own reduction now) against finite differences.
fn std_grad_matches_finite_differences(dev: &Device) -> Result<()> {
    let x = Tensor::from_slice(&[0.3f64, -1.2, 2.5, 0.7, 1.1, -0.4], [2, 3], dev)?;
    grad_check(dev, &[x.clone()], &|t| t[0].std(1, true))?;
    grad_check(dev, &[x.clone()], &|t| t[0].std_correction(0, 0.0, false))?;
    grad_check(dev, &[x], &|t| t[0].std_all())
}

/// Batch normalisation's fused rule (input, weight and bias) against finite
/// differences, with the batch's statistics and with running ones, over
/// `[N, C]`, `[N, C, L]` and `[N, C, H, W]`, and without the affine parameters.
fn batch_norm_grads_match_finite_differences(dev: &Device) -> Result<()> {
    use ember::nn::functional::{batch_norm, BatchNormOptions};
    let _g = super::rng_lock();
    ember::manual_seed(12);
    let (w, b) = (pos(dev, &[3]), rn(dev, &[3]));
    let (rm, rv) = (rn(dev, &[3]), pos(dev, &[3]));
    for shape in [&[5, 3][..], &[4, 3, 5], &[2, 3, 3, 2]] {
        let x = rn(dev, shape).mul(2.0)?.add(0.5)?;
        let train = BatchNormOptions {
            training: true,
            ..Default::default()
        };
        grad_check(dev, &[x.clone(), w.clone(), b.clone()], &|t| {
            batch_norm(&t[0], Some(&t[1]), Some(&t[2]), train)
        })?;
        grad_check(dev, &[x.clone()], &|t| batch_norm(&t[0], None, None, train))?;
        let eval = BatchNormOptions {
            running_mean: Some(&rm),
            running_var: Some(&rv),
            ..Default::default()
        };
        grad_check(dev, &[x.clone(), w.clone(), b.clone()], &|t| {
            batch_norm(&t[0], Some(&t[1]), Some(&t[2]), eval)
        })?;
    }
    Ok(())
}

/// The composites of issue 43 (17) against finite differences: group norm
/// (input, weight, bias), index_add (input, source), clamp by tensors away from
/// ties, avg_pool2d with a divisor, cumsum/prod with a dtype.
fn issue43_composites_match_finite_differences(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    ember::manual_seed(14);
    let (x, w, b) = (rn(dev, &[2, 4, 3]), pos(dev, &[4]), rn(dev, &[4]));
    grad_check(dev, &[x.clone(), w, b], &|t| {
        ember::nn::group_norm(&t[0], 2, Some(&t[1]), Some(&t[2]), 1e-5)
    })?;
    grad_check(dev, &[rn(dev, &[2, 6, 2, 2])], &|t| {
        ember::nn::group_norm(&t[0], 3, None, None, 1e-5)
    })?;
    let idx = Tensor::from_vec(vec![2i64, 0, 2], [3], dev)?;
    grad_check(dev, &[rn(dev, &[2, 3]), rn(dev, &[2, 3])], &|t| {
        t[0].index_add(1, &idx, &t[1], -1.5)
    })?;
    // bounds well apart from the input: no ties for the differences to cross
    let x = Tensor::from_slice(&[-2.0f64, -0.2, 0.4, 1.9, 3.0, 0.1], [2, 3], dev)?;
    let lo = Tensor::from_slice(&[-1.0f64, 0.0, 0.6], [3], dev)?;
    let hi = Tensor::from_slice(&[1.0f64, 2.5], [2, 1], dev)?;
    grad_check(dev, &[x.clone(), lo, hi], &|t| {
        t[0].clamp_tensor(Some(&t[1]), Some(&t[2]))
    })?;
    let opts = Pool2dOptions::new(2)
        .stride(1)
        .padding(1)
        .divisor_override(3);
    grad_check(dev, &[rn(dev, &[1, 2, 3, 3])], &|t| t[0].avg_pool2d(opts))?;
    grad_check(dev, &[x.clone()], &|t| t[0].cumsum_dtype(1, DType::F64))?;
    grad_check(dev, &[x], &|t| t[0].prod_dtype(0, false, DType::F64))
}

/// A float16 or bfloat16 tensor times or divided by a number uses the number in
/// float32, not rounded to the dtype first (PyTorch's opmath), forward and
/// backward, out of place and in place while recorded: `x / 1e5` in float16 is
/// `[1.0002e-02, 2.9981e-05]` with gradient `1.0014e-05` in PyTorch 2.15, where
/// 1e5 rounded to float16 (inf) would give zeros.
fn half_products_by_a_number_keep_it_in_float32(dev: &Device) -> Result<()> {
    for dt in [DType::F16, DType::BF16] {
        let round = |v: f32| {
            Tensor::new([v], &Device::Cpu)?
                .to_dtype(dt)?
                .to_dtype(DType::F32)
        };
        let bits = |t: &Tensor| {
            t.to_dtype(DType::F32)?
                .to_device(&Device::Cpu)?
                .to_vec1::<f32>()
        };
        for in_place in [false, true] {
            let x = Tensor::new([1000f32, 3.0], dev)?
                .to_dtype(dt)?
                .requires_grad_(true)?;
            let y = if in_place {
                // a non-leaf written in place, recorded
                let y = x.mul(1.0)?;
                y.div_(1e5)?;
                y
            } else {
                x.div(1e5)?
            };
            let x32 = bits(&x.detach())?;
            let want: Vec<f32> = x32
                .iter()
                .map(|&v| round(v / 1e5f32)?.to_vec1::<f32>().map(|w| w[0]))
                .collect::<Result<_>>()?;
            assert_eq!(bits(&y.detach())?, want, "{dt} in place {in_place}");
            assert!(want.iter().all(|&w| w > 0.0));
            y.sum_all()?.backward()?;
            let g = round(1.0 / 1e5f32)?.to_vec1::<f32>()?[0];
            assert!(g > 0.0);
            assert_eq!(
                bits(&x.grad().unwrap())?,
                vec![g, g],
                "{dt} in place {in_place}"
            );
            // and a product: 1e-8 is 0 in float16, not in float32
            let x = Tensor::new([1000f32, 3.0], dev)?.to_dtype(dt)?;
            let want: Vec<f32> = x32
                .iter()
                .map(|&v| round(v * 1e-8f32)?.to_vec1::<f32>().map(|w| w[0]))
                .collect::<Result<_>>()?;
            assert_eq!(bits(&x.mul(1e-8)?)?, want, "{dt}");
            assert!(want[0] > 0.0);
        }
    }
    Ok(())
}

device_test!(
    half_products_by_a_number_keep_it_in_float32,
    issue43_composites_match_finite_differences,
    batch_norm_grads_match_finite_differences,
    max_min_dim_grad_goes_to_the_index,
    clamp_grad_at_the_bounds,
    bce_with_logits_at_infinite_logits,
    std_grad_matches_finite_differences,
);

fn graphs_sharing_a_view_each_backpropagate(dev: &Device) -> Result<()> {
    // PyTorch keeps nodes that saved no tensors (views), so each of two graphs
    // built on one view can run backward through it
    let x = Tensor::new([1f32, 2., 3., 4.], dev)?.requires_grad_(true)?;
    let v = x.reshape([2, 2])?;
    v.mul(2.0)?.sum_all()?.backward()?;
    v.mul(3.0)?.sum_all()?.backward()?;
    assert_eq!(x.grad().unwrap().to_vec::<f32>()?, [5.0; 4]);
    // a chain of views (transpose, then a region)
    let t = x.reshape([2, 2])?.t()?.narrow(0, 0, 1)?;
    t.sum_all()?.backward()?;
    t.mul(2.0)?.sum_all()?.backward()?;
    assert_eq!(x.grad().unwrap().to_vec::<f32>()?, [8.0, 5.0, 8.0, 5.0]);
    // a node that saved tensors is still used up by its backward
    let h = x.mul(&x)?;
    let hv = h.reshape([4])?;
    hv.sum_all()?.backward()?;
    let e = hv.sum_all()?.backward().unwrap_err().to_string();
    assert!(e.contains("second time"), "{e}");
    Ok(())
}

device_test!(graphs_sharing_a_view_each_backpropagate);

fn inplace_ops_and_views(dev: &Device) -> Result<()> {
    // the version counter counts writes, shared by views and detached aliases
    let x = Tensor::new([1f32, 2., 3., 4.], dev)?;
    let (v, d) = (x.narrow(0, 1, 2)?, x.detach());
    assert_eq!(x.version(), 0);
    v.add_(1.0)?;
    d.mul_(2.0)?;
    x.copy_(&x.mul(1.0)?)?;
    assert_eq!((x.version(), v.version(), d.version()), (3, 3, 3));
    assert_eq!(vals(&x), vec![2., 6., 8., 8.]);
    // while autograd records, a view is not written in place, nor a tensor that
    // has live views (ember does not rewrite a view's history as PyTorch does)
    let w = Tensor::new([1f32, 2., 3., 4.], dev)?.requires_grad_(true)?;
    let h = w.mul(2.0)?;
    let e = h.narrow(0, 0, 2)?.mul_(3.0).unwrap_err().to_string();
    assert!(e.contains("this tensor is a view"), "{e}");
    let t = h.reshape([2, 2])?;
    let e = h.add_(1.0).unwrap_err().to_string();
    assert!(e.contains("views of this tensor are alive"), "{e}");
    drop(t);
    h.add_(1.0)?;
    h.sum_all()?.backward()?;
    assert_eq!(vals(&w.grad().unwrap()), vec![2.; 4]);
    // a buffer that needs no gradient, written from one that does: views refused
    let buf = Tensor::zeros([4], DType::F32, dev)?;
    let e = buf.narrow(0, 0, 2)?.copy_(&w.narrow(0, 0, 2)?).unwrap_err();
    assert!(e.to_string().contains("this tensor is a view"), "{e}");
    // ... and allowed outside the graph
    ember::no_grad(|| buf.narrow(0, 0, 2)?.copy_(&w.narrow(0, 0, 2)?))?;
    assert_eq!(vals(&buf), vec![1., 2., 0., 0.]);
    // an in-place op gives the tensor a new history; earlier consumers keep the old
    w.zero_grad();
    let h = w.mul(2.0)?;
    let before = h.mul(3.0)?; // 6 w
    h.mul_(&w)?; // 2 w²
    assert!(!h.is_leaf() && h.requires_grad());
    before.add(&h)?.sum_all()?.backward()?;
    assert_eq!(vals(&w.grad().unwrap()), vec![10., 14., 18., 22.]);
    // maximum_ reads the old values (a copy of them is kept); ties split
    w.zero_grad();
    let m = Tensor::new([2f32, 2., 2., 2.], dev)?.requires_grad_(true)?;
    let h = w.mul(1.0)?;
    h.maximum_(&m)?;
    h.sum_all()?.backward()?;
    assert_eq!(vals(&w.grad().unwrap()), vec![0., 0.5, 1., 1.]);
    assert_eq!(vals(&m.grad().unwrap()), vec![1., 0.5, 0., 0.]);
    // an operand that is the tensor itself, and copies from its own storage
    for (case, want) in [
        ("h += h", 4.),
        ("copy of itself", 2.),
        ("copy of its alias", 0.),
    ] {
        w.zero_grad();
        let h = w.mul(2.0)?;
        match case {
            "h += h" => h.add_(&h)?,
            "copy of itself" => h.copy_(&h)?,
            _ => h.copy_(&h.detach())?,
        }
        h.sum_all()?.backward()?;
        assert_eq!(vals(&w.grad().unwrap()), vec![want; 4], "{case}");
    }
    // an integer tensor is written, never recorded (it cannot carry a gradient)
    let t = Tensor::zeros([4], DType::I64, dev)?;
    t.copy_(&w.mul(1.5)?)?;
    assert!(!t.requires_grad() && t.is_leaf());
    assert_eq!(t.to_vec::<i64>()?, vec![1, 3, 4, 6]);
    assert!(t.add_(&w).is_err());
    // neg saves nothing (PyTorch's rule), so its input may change afterwards
    w.zero_grad();
    let h = w.mul(2.0)?;
    let y = h.neg()?;
    h.add_(1.0)?;
    y.sum_all()?.backward()?;
    assert_eq!(vals(&w.grad().unwrap()), vec![-2.; 4]);
    // a float scalar into an integer tensor: refused, recording or not (PyTorch)
    let e = t.add_(2.5).unwrap_err().to_string();
    assert!(
        e.contains("can't be cast to the desired output type"),
        "{e}"
    );
    // a second backward through the in-place node is the usual error
    let h = w.mul(2.0)?;
    h.sub_(1.0)?;
    let l = h.square()?.sum_all()?;
    l.backward()?;
    assert!(l
        .backward()
        .unwrap_err()
        .to_string()
        .contains("second time"));
    Ok(())
}

device_test!(inplace_ops_and_views);

#[test]
fn post_accumulate_grad_hooks_see_the_accumulated_gradient() -> Result<()> {
    use std::sync::{Arc, Mutex};
    let w = Tensor::new([1f32, 2.], &Device::Cpu)?.requires_grad_(true)?;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let h = w.register_post_accumulate_grad_hook(move |t| {
        s.lock().unwrap().push(t.grad().unwrap().to_vec1::<f32>()?);
        Ok(())
    })?;
    // used twice in one graph: the hook runs once, after the sum
    w.mul(&w)?.add(&w)?.sum_all()?.backward()?;
    w.mul(3.0)?.sum_all()?.backward()?;
    assert_eq!(*seen.lock().unwrap(), vec![vec![3., 5.], vec![6., 8.]]);
    h.remove();
    w.sum_all()?.backward()?;
    assert_eq!(seen.lock().unwrap().len(), 2);
    // only leaves that require grad
    let y = w.mul(2.0)?;
    assert!(y.register_post_accumulate_grad_hook(|_| Ok(())).is_err());
    let c = Tensor::new([1f32], &Device::Cpu)?;
    assert!(c.register_post_accumulate_grad_hook(|_| Ok(())).is_err());
    // a hook's error is backward's
    let h = w.register_post_accumulate_grad_hook(|_| {
        Err(Error::InvalidArgument {
            op: "hook",
            msg: "stop".into(),
        })
    })?;
    assert!(w
        .sum_all()?
        .backward()
        .unwrap_err()
        .to_string()
        .contains("stop"));
    h.remove();
    Ok(())
}

#[test]
fn queued_callbacks_run_when_backward_ends() -> Result<()> {
    use std::sync::{Arc, Mutex};
    assert!(ember::autograd::queue_callback(|| Ok(())).is_err());
    let w = Tensor::new([1f32, 2.], &Device::Cpu)?.requires_grad_(true)?;
    let log = Arc::new(Mutex::new(Vec::<String>::new()));
    let (l, w2) = (log.clone(), w.clone());
    let h = w.register_post_accumulate_grad_hook(move |_| {
        l.lock().unwrap().push("hook".into());
        let (l, w2) = (l.clone(), w2.clone());
        ember::autograd::queue_callback(move || {
            // every gradient is in place when it runs
            l.lock().unwrap().push(format!(
                "callback {:?}",
                w2.grad().unwrap().to_vec1::<f32>()?
            ));
            Ok(())
        })
    })?;
    w.square()?.sum_all()?.backward()?;
    assert_eq!(
        *log.lock().unwrap(),
        vec!["hook".to_string(), "callback [2.0, 4.0]".into()]
    );
    h.remove();
    Ok(())
}

/// A leaf whose requires_grad is turned off after an op recorded it gets no
/// gradient from that graph, as PyTorch's accumulation skips it.
#[test]
fn a_leaf_turned_off_after_recording_gets_no_gradient() -> Result<()> {
    let dev = Device::Cpu;
    let x = Tensor::new([1f32, 2.], &dev)?.requires_grad_(true)?;
    let w = Tensor::new([3f32, 4.], &dev)?.requires_grad_(true)?;
    let y = x.mul(&w)?.sum_all()?;
    let x = x.requires_grad_(false)?;
    y.backward()?;
    assert!(x.grad().is_none());
    assert_eq!(vals(&w.grad().expect("w still requires grad")), [1.0, 2.0]);
    Ok(())
}

/// An in-place op on a view of a leaf that requires grad is refused with
/// PyTorch's reason (and nothing written); inside no_grad it writes the leaf.
#[test]
fn an_in_place_op_on_a_view_of_a_parameter_names_the_leaf() -> Result<()> {
    let dev = Device::Cpu;
    let x = Tensor::new([1f32, -2., 3.], &dev)?.requires_grad_(true)?;
    for e in [
        x.narrow(0, 0, 2)?.fill_(0.0).unwrap_err(),
        x.narrow(0, 1, 2)?.add_(1.0).unwrap_err(),
        x.narrow(0, 0, 2)?.narrow(0, 0, 1)?.add_(1.0).unwrap_err(),
        x.unsqueeze(0)?.select(0, 0)?.relu_().unwrap_err(),
    ] {
        let e = e.to_string();
        assert!(
            e.contains("a view of a leaf Variable that requires grad"),
            "{e}"
        );
    }
    // an in-place module too (PyTorch's ReLU(inplace=True) refuses it)
    use ember::nn::Module;
    let e = ember::nn::ReLU::inplace()
        .forward(&x.narrow(0, 0, 2)?)
        .unwrap_err();
    assert!(e.to_string().contains("a view of a leaf Variable"), "{e}");
    assert_eq!(vals(&x), [1.0, -2.0, 3.0]);
    // a view of a computed tensor is not a view of the leaf
    let y = x.mul(1.0)?;
    let e = y.narrow(0, 0, 2)?.fill_(0.0).unwrap_err().to_string();
    assert!(!e.contains("a view of a leaf"), "{e}");
    ember::no_grad(|| x.narrow(0, 0, 2)?.fill_(0.0))?;
    assert_eq!(vals(&x), [0.0, 0.0, 3.0]);
    Ok(())
}

// ---- lerp, addcmul/addcdiv, hardtanh/relu6/selu/celu/mish, cosine similarity,
// median: their own rules against finite differences ----------------------------

fn pointwise_ops_rules_match_finite_differences(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    ember::manual_seed(48);
    let (a, b) = (rn(dev, &[3, 4]), rn(dev, &[4]));
    let (p, q) = (pos(dev, &[3, 4]), pos(dev, &[3, 1]));
    let w = Tensor::linspace(-0.9, 1.4, 12, DType::F64, dev)?.reshape([3, 4])?;
    grad_check(dev, &[a.clone(), b.clone()], &|x| x[0].lerp(&x[1], 0.3))?;
    grad_check(dev, &[a.clone(), b.clone()], &|x| x[0].lerp(&x[1], -0.8))?;
    grad_check(dev, &[a.clone(), b.clone(), w.clone()], &|x| {
        x[0].lerp(&x[1], &x[2])
    })?;
    grad_check(dev, &[a.clone(), b.clone(), q.clone()], &|x| {
        x[0].addcmul(&x[1], &x[2], 0.7)
    })?;
    grad_check(dev, &[a.clone(), b.clone(), q.clone()], &|x| {
        x[0].addcdiv(&x[1], &x[2], -1.5)
    })?;
    grad_check(dev, &[p.clone()], &|x| x[0].log10())?;
    // away from the kinks at 0 and at the bounds
    let away = a.add(&a.gt(0.0)?.to_dtype(DType::F64)?.mul(0.2)?.sub(0.1)?)?;
    for f in [Tensor::selu, Tensor::mish, Tensor::relu6] {
        grad_check(dev, &[away.mul(4.0)?], &|x| f(&x[0]))?;
    }
    grad_check(dev, &[away.clone()], &|x| x[0].celu(0.6))?;
    grad_check(dev, &[away.clone()], &|x| x[0].hardtanh(-0.35, 0.45))?;
    grad_check(dev, &[a.clone(), rn(dev, &[3, 4])], &|x| {
        ember::nn::functional::cosine_similarity(&x[0], &x[1], 1, 1e-8)
    })?;
    grad_check(dev, &[a.clone(), b.clone()], &|x| {
        ember::nn::functional::pairwise_distance(&x[0], &x[1], 2.0, 1e-6, false)
    })?;
    grad_check(dev, &[a.clone()], &|x| x[0].median())?;
    grad_check(dev, &[a.clone()], &|x| Ok(x[0].median_dim(1, false)?.0))?;
    grad_check(dev, &[a.clone()], &|x| {
        let u = x[0].unbind(0)?;
        u[0].mul(&u[2])?.add(&u[1])
    })?;
    Ok(())
}

device_test!(pointwise_ops_rules_match_finite_differences);
