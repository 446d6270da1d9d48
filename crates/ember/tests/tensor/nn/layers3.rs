//! LogSigmoid, Softsign, Tanhshrink, Softshrink, Hardshrink, Threshold, GLU,
//! Softmin, LogSoftmax, Unflatten and the padding modules against PyTorch
//! (tests/golden/gen_nn.py, `layers3`): each case's output and input gradient
//! on every device, the same cases on meta (shapes and dtypes), PyTorch's
//! refusals; channel dropout's masks (PyTorch's shapes for each rank) and
//! statistics, which cannot match PyTorch's draws value for value.

use super::{cases, tensor};
use ember::nn::functional as F;
use ember::nn::{self, Module};
use ember::prelude::*;
use serde_json::Value;

fn dtype_named(s: &str) -> DType {
    match s {
        "float64" => DType::F64,
        "float32" => DType::F32,
        "int64" => DType::I64,
        d => panic!("dtype {d}"),
    }
}

/// The case's padding: one amount, or each side's.
fn sides<const N: usize>(v: &Value) -> nn::Padding<N> {
    match v {
        Value::Array(a) => {
            let s: Vec<i64> = a.iter().map(|x| x.as_i64().unwrap()).collect();
            nn::Padding(s.try_into().unwrap())
        }
        v => nn::Padding::from(v.as_i64().unwrap()),
    }
}

/// The module a case names, with its keyword arguments.
fn module(case: &Value) -> Box<dyn Module> {
    let a = &case["args"];
    let f = |k: &str, d: f64| a[k].as_f64().unwrap_or(d);
    let p = &a["padding"];
    let value = f("value", 0.0);
    let name = case["module"].as_str().unwrap();
    match name {
        "LogSigmoid" => Box::new(nn::LogSigmoid),
        "Softsign" => Box::new(nn::Softsign),
        "Tanhshrink" => Box::new(nn::Tanhshrink),
        "Softshrink" if a["lambd"].is_null() => Box::new(nn::Softshrink::default()),
        "Softshrink" => Box::new(nn::Softshrink::new(f("lambd", 0.5))),
        "Hardshrink" if a["lambd"].is_null() => Box::new(nn::Hardshrink::default()),
        "Hardshrink" => Box::new(nn::Hardshrink::new(f("lambd", 0.5))),
        "Threshold" => Box::new(nn::Threshold::new(f("threshold", 0.0), value)),
        "GLU" if a["dim"].is_null() => Box::new(nn::GLU::default()),
        "GLU" => Box::new(nn::GLU::new(a["dim"].as_i64().unwrap())),
        "Softmin" => Box::new(nn::Softmin(a["dim"].as_i64().unwrap())),
        "LogSoftmax" => Box::new(nn::LogSoftmax(a["dim"].as_i64().unwrap())),
        "Unflatten" => {
            let sizes: Vec<i64> = a["unflattened_size"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_i64().unwrap())
                .collect();
            Box::new(nn::Unflatten::new(a["dim"].as_i64().unwrap(), sizes))
        }
        "ZeroPad1d" => Box::new(nn::ZeroPad1d::new(sides(p))),
        "ZeroPad2d" => Box::new(nn::ZeroPad2d::new(sides(p))),
        "ZeroPad3d" => Box::new(nn::ZeroPad3d::new(sides(p))),
        "ConstantPad1d" => Box::new(nn::ConstantPad1d::new(sides(p), value)),
        "ConstantPad2d" => Box::new(nn::ConstantPad2d::new(sides(p), value)),
        "ConstantPad3d" => Box::new(nn::ConstantPad3d::new(sides(p), value)),
        "ReflectionPad1d" => Box::new(nn::ReflectionPad1d::new(sides(p))),
        "ReflectionPad2d" => Box::new(nn::ReflectionPad2d::new(sides(p))),
        "ReflectionPad3d" => Box::new(nn::ReflectionPad3d::new(sides(p))),
        "ReplicationPad1d" => Box::new(nn::ReplicationPad1d::new(sides(p))),
        "ReplicationPad2d" => Box::new(nn::ReplicationPad2d::new(sides(p))),
        "ReplicationPad3d" => Box::new(nn::ReplicationPad3d::new(sides(p))),
        "CircularPad1d" => Box::new(nn::CircularPad1d::new(sides(p))),
        "CircularPad2d" => Box::new(nn::CircularPad2d::new(sides(p))),
        "CircularPad3d" => Box::new(nn::CircularPad3d::new(sides(p))),
        m => panic!("module {m}"),
    }
}

fn all_cases(all: &Value) -> &Vec<Value> {
    let cases = all["layers3"]["cases"].as_array().unwrap();
    assert!(cases.len() >= 70, "{} cases", cases.len());
    cases
}

/// Every case's output and input gradient against PyTorch's on `dev`.
fn layers3_match_pytorch(dev: &Device) -> Result<()> {
    let all = cases();
    for case in all_cases(&all) {
        let name = case["name"].as_str().unwrap();
        let dt = dtype_named(case["dtype"].as_str().unwrap());
        let (rtol, atol) = match dt {
            DType::F64 => (1e-12, 1e-14),
            DType::F32 => (2e-6, 1e-7),
            _ => (0.0, 0.0),
        };
        let close = |what: &str, got: &Tensor, want: &Value| -> Result<()> {
            super::assert_matches(&format!("{name} {what}"), got, want, (rtol, atol))
        };
        let m = module(case);
        let x = tensor(&case["x"], dev)?.to_dtype(dt)?;
        let x = if dt.is_float() {
            x.requires_grad_(true)?
        } else {
            x
        };
        let y = m.forward(&x)?;
        let want_dt = dtype_named(case["y_dtype"].as_str().unwrap());
        assert_eq!((y.dtype(), y.device()), (want_dt, *dev), "{name}");
        close("output", &y, &case["y"])?;
        if dt.is_float() {
            let gy = Tensor::linspace(-1.0, 1.0, y.numel(), dt, dev)?.reshape(y.shape())?;
            y.backward_with(&gy)?;
            close("input grad", &x.grad().unwrap(), &case["x_grad"])?;
        }
    }
    Ok(())
}

/// The same cases on meta: PyTorch's shapes and dtypes forward and backward.
#[test]
fn layers3_run_on_meta_with_pytorchs_shapes() -> Result<()> {
    let all = cases();
    let meta = Device::Meta;
    for case in all_cases(&all) {
        let name = case["name"].as_str().unwrap();
        let dt = dtype_named(case["dtype"].as_str().unwrap());
        let shape = tensor(&case["x"], &Device::Cpu)?.shape().to_vec();
        let x = Tensor::zeros(&shape[..], dt, &meta)?;
        let x = if dt.is_float() {
            x.requires_grad_(true)?
        } else {
            x
        };
        let y = module(case).forward(&x)?;
        let want = tensor(&case["y"], &Device::Cpu)?;
        let want_dt = dtype_named(case["y_dtype"].as_str().unwrap());
        assert_eq!((y.shape(), y.dtype()), (want.shape(), want_dt), "{name}");
        assert_eq!(y.device(), meta);
        if dt.is_float() {
            y.sum_all()?.backward()?;
            assert_eq!(x.grad().unwrap().shape(), &shape[..], "{name}");
        }
    }
    // channel dropout draws its mask on meta too
    let x = Tensor::zeros([2, 3, 4, 4], DType::F32, &meta)?.requires_grad_(true)?;
    let y = nn::Dropout2d::new(0.5)?.forward(&x)?;
    assert_eq!((y.shape(), y.device()), (&[2, 3, 4, 4][..], meta));
    y.sum_all()?.backward()?;
    assert_eq!(x.grad().unwrap().shape(), &[2, 3, 4, 4]);
    Ok(())
}

/// PyTorch's refusals (gen_nn.py records a phrase of each message, which
/// ember's contains), on every device.
fn layers3_refuse_as_pytorch(dev: &Device) -> Result<()> {
    let all = cases();
    let z = |s: &[usize]| Tensor::zeros(s, DType::F32, dev);
    let zt = |s: &[usize], dt| Tensor::zeros(s, dt, dev);
    let ints = zt(&[2, 4], DType::I64)?;
    let errors = all["layers3"]["errors"].as_array().unwrap();
    assert!(errors.len() >= 30);
    for e in errors {
        let name = e["name"].as_str().unwrap();
        let phrase = e["phrase"].as_str().unwrap();
        let unflatten = |sizes: &[i64], x: &Tensor| nn::Unflatten::new(1, sizes).forward(x);
        let got = match name {
            "logsigmoid_int" => F::logsigmoid(&ints),
            "softshrink_int" => F::softshrink(&ints, 0.5),
            "softshrink_negative" => F::softshrink(&z(&[2])?, -0.5),
            "softshrink_negative_f64" => nn::Softshrink::new(-1.0).forward(&zt(&[2], DType::F64)?),
            "hardshrink_int" => F::hardshrink(&ints, 0.5),
            "threshold_bool" => F::threshold(&zt(&[2], DType::Bool)?, 0.0, 1.0, false),
            "glu_odd" => F::glu(&z(&[2, 3])?, 1),
            "glu_scalar" => F::glu(&z(&[])?, 0),
            "glu_int" => F::glu(&ints, -1),
            "glu_dim" => nn::GLU::new(2).forward(&z(&[2, 4])?),
            "softmin_dim" => nn::Softmin(2).forward(&z(&[2, 4])?),
            "log_softmax_dim" => nn::LogSoftmax(-3).forward(&z(&[2, 4])?),
            "unflatten_sizes" => unflatten(&[2, 3], &z(&[2, 7])?),
            "unflatten_inferred_sizes" => unflatten(&[-1, 4], &z(&[2, 6])?),
            "unflatten_empty" => unflatten(&[], &z(&[2, 6])?),
            "unflatten_two_inferred" => unflatten(&[-1, -1], &z(&[2, 6])?),
            "unflatten_negative" => unflatten(&[-2, 3], &z(&[2, 6])?),
            "unflatten_ambiguous" => unflatten(&[0, -1], &z(&[2, 0])?),
            "unflatten_dim" => nn::Unflatten::new(2, [2, 3]).forward(&z(&[2, 6])?),
            "unflatten_scalar" => nn::Unflatten::new(0, [1]).forward(&z(&[])?),
            "dropout2d_p" => nn::Dropout2d::new(1.5).and_then(|_| z(&[1])),
            "dropout1d_p" => F::dropout1d(&z(&[2, 3])?, -0.25, false, false),
            "dropout1d_rank" => {
                let mut m = nn::Dropout1d::default();
                m.eval();
                m.forward(&z(&[1, 2, 3, 4])?)
            }
            "dropout2d_scalar" => F::dropout2d(&z(&[])?, 0.5, true, false),
            "dropout3d_int" => F::dropout3d(&zt(&[2, 3, 2, 2], DType::I64)?, 0.5, true, false),
            "reflection_pad2d_rank" => nn::ReflectionPad2d::new(1).forward(&z(&[3, 4])?),
            "replication_pad3d_rank" => {
                nn::ReplicationPad3d::new(1).forward(&z(&[1, 1, 1, 2, 3, 4])?)
            }
            "reflection_pad1d_too_big" => nn::ReflectionPad1d::new(4).forward(&z(&[2, 3, 4])?),
            "reflection_pad1d_bool" => {
                nn::ReflectionPad1d::new(1).forward(&zt(&[2, 3], DType::Bool)?)
            }
            "circular_pad1d_rank" => nn::CircularPad1d::new(1).forward(&z(&[1, 2, 3, 4])?),
            "circular_pad3d_rank" => nn::CircularPad3d::new(1).forward(&z(&[2, 3, 4])?),
            "circular_pad1d_wrap" => nn::CircularPad1d::new(5).forward(&z(&[2, 3, 4])?),
            other => panic!("unknown error case {other}"),
        };
        let msg = got.expect_err(name).to_string();
        assert!(msg.contains(phrase), "{name}: {msg:?} lacks {phrase:?}");
    }
    Ok(())
}

/// For each call of the `dropout` list: the dims along which the output of a
/// tensor of ones varies over 20 draws are those of PyTorch's mask (its rank
/// rules: unbatched inputs, dropout2d's 3-D and 2-D readings), the survivors
/// are `1 / (1 - p)`, and a module does the same as its function.
fn channel_dropout_masks_have_pytorchs_shapes(dev: &Device) -> Result<()> {
    let _rng = crate::rng_lock();
    let all = cases();
    let calls = all["layers3"]["dropout"].as_array().unwrap();
    assert!(calls.len() >= 10);
    for c in calls {
        let name = c["name"].as_str().unwrap();
        let shape: Vec<usize> = c["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect();
        let want: Vec<usize> = c["mask_shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect();
        let fname = c["fn"].as_str().unwrap();
        let mut varies = vec![false; shape.len()];
        for draw in 0..20 {
            let x = Tensor::ones(&shape[..], DType::F32, dev)?;
            let y = match (fname, draw % 2) {
                ("dropout1d", 0) => F::dropout1d(&x, 0.5, true, false)?,
                ("dropout1d", _) => nn::Dropout1d::new(0.5)?.forward(&x)?,
                ("dropout2d", 0) => F::dropout2d(&x, 0.5, true, false)?,
                ("dropout2d", _) => nn::Dropout2d::new(0.5)?.forward(&x)?,
                ("dropout3d", 0) => F::dropout3d(&x, 0.5, true, false)?,
                ("dropout3d", _) => nn::Dropout3d::new(0.5)?.forward(&x)?,
                (f, _) => panic!("{f}"),
            };
            assert_eq!(y.shape(), &shape[..]);
            let v = y.to_vec::<f32>()?;
            assert!(v.iter().all(|&e| e == 0.0 || e == 2.0), "{name}: {v:?}");
            for (d, &n) in shape.iter().enumerate() {
                if n > 1
                    && !y
                        .eq(&y.narrow(d as i64, 0, 1)?)?
                        .all_all()?
                        .item::<bool>()?
                {
                    varies[d] = true;
                }
            }
        }
        let got: Vec<usize> = shape
            .iter()
            .zip(&varies)
            .map(|(&n, &v)| if v { n } else { 1 })
            .collect();
        assert_eq!(got, want, "{name}: the dims of the mask");
    }
    Ok(())
}

/// Channel dropout's statistics and edges: about `p` of the channels zeroed,
/// the rest scaled by `1 / (1 - p)`, gradients zero on dropped channels and the
/// scale on kept ones; evaluation and `p = 0` the identity, `p = 1` all zeros
/// (a NaN stays NaN, as PyTorch multiplies by 0); in place writes the input;
/// a generator gives the same masks again.
fn channel_dropout_statistics(dev: &Device) -> Result<()> {
    let _rng = crate::rng_lock();
    let p = 0.3;
    let scale = 1.0 / (1.0 - p);
    let x = Tensor::uniform(1.0, 2.0, [64, 256, 4], DType::F32, dev)?.requires_grad_(true)?;
    let y = F::dropout1d(&x, p, true, false)?;
    let (xv, yv) = (x.to_vec::<f32>()?, y.to_vec::<f32>()?);
    let mut dropped = 0;
    for (xc, yc) in xv.chunks(4).zip(yv.chunks(4)) {
        if yc[0] == 0.0 {
            dropped += 1;
            assert!(yc.iter().all(|&v| v == 0.0), "whole channels");
        } else {
            for (a, b) in xc.iter().zip(yc) {
                assert!(((a * scale as f32) - b).abs() <= 1e-6 * b.abs());
            }
        }
    }
    // 16384 channels: 4 standard deviations of the dropped fraction is 0.014
    let frac = dropped as f64 / (64.0 * 256.0);
    assert!((frac - p).abs() < 0.015, "dropped {frac}");
    y.backward_with(&Tensor::ones([64, 256, 4], DType::F32, dev)?)?;
    let g = x.grad().unwrap().to_vec::<f32>()?;
    for (gv, yv) in g.iter().zip(&yv) {
        let want = if *yv == 0.0 { 0.0 } else { scale as f32 };
        assert!((gv - want).abs() <= 1e-6, "{gv} vs {want}");
    }

    let x = Tensor::randn([2, 3, 4, 4], dev)?;
    let mut m = nn::Dropout2d::default();
    assert_eq!(m.p(), 0.5);
    m.eval();
    assert_eq!(m.forward(&x)?.to_vec::<f32>()?, x.to_vec::<f32>()?);
    for f in [F::dropout1d, F::dropout2d, F::dropout3d] {
        let x3 = Tensor::randn([2, 3, 4], dev)?;
        assert_eq!(
            f(&x3, 0.5, false, false)?.to_vec::<f32>()?,
            x3.to_vec::<f32>()?
        );
        assert_eq!(
            f(&x3, 0.0, true, false)?.to_vec::<f32>()?,
            x3.to_vec::<f32>()?
        );
        let nan = x3.masked_fill(&x3.gt(1.0)?, f64::NAN)?;
        let zeros = f(&nan, 1.0, true, false)?.to_vec::<f32>()?;
        for (z, v) in zeros.iter().zip(nan.to_vec::<f32>()?) {
            assert!(if v.is_nan() { z.is_nan() } else { *z == 0.0 });
        }
    }
    // p = 1 zeroes an integer input; p = 0 returns it
    let ints = Tensor::new([[1i64, 2], [3, 4]], dev)?;
    assert_eq!(
        F::dropout2d(&ints, 1.0, true, false)?.to_vec::<i64>()?,
        [0; 4]
    );
    assert_eq!(
        F::dropout2d(&ints, 0.0, true, false)?.to_vec::<i64>()?,
        [1, 2, 3, 4]
    );
    // 1-D: p = 0 and p = 1 need no mask, so no rank check (PyTorch's order);
    // a mask needs a batch and a channel dim
    let one = Tensor::ones([5], DType::F32, dev)?;
    assert_eq!(
        F::dropout2d(&one, 1.0, true, false)?.to_vec::<f32>()?,
        [0.0; 5]
    );
    assert!(F::dropout2d(&one, 0.5, true, false).is_err());
    // (dropout3d reads it as one sample whose elements are channels)
    assert!(F::dropout3d(&one, 0.5, true, false).is_ok());
    // a half input keeps its dtype
    let h = Tensor::ones([2, 8, 3], DType::F16, dev)?;
    let yh = F::dropout1d(&h, 0.5, true, false)?;
    assert_eq!(yh.dtype(), DType::F16);
    assert!(yh.to_vec::<f32>()?.iter().all(|&v| v == 0.0 || v == 2.0));

    // in place: the input holds the result
    let x = Tensor::ones([4, 8, 3], DType::F32, dev)?;
    let y = nn::Dropout1d::new(0.5)?.inplace(true).forward(&x)?;
    assert_eq!(x.to_vec::<f32>()?, y.to_vec::<f32>()?);
    assert!(x.to_vec::<f32>()?.contains(&0.0));
    let leaf = Tensor::ones([4, 8, 3], DType::F32, dev)?.requires_grad_(true)?;
    assert!(F::dropout1d(&leaf, 0.5, true, true).is_err());

    // a generator's masks repeat from its seed
    let x = Tensor::ones([8, 16, 2, 2], DType::F32, dev)?;
    let draw = || -> Result<Vec<f32>> {
        let g = ember::Generator::new(11);
        nn::Dropout2d::new(0.5)?
            .generator(&g)
            .forward(&x)?
            .to_vec::<f32>()
    };
    assert_eq!(draw()?, draw()?);
    Ok(())
}

/// In-place `threshold`, the activations in half precision, and the modules'
/// defaults and constructors (PyTorch's).
fn layers3_inplace_half_and_defaults(dev: &Device) -> Result<()> {
    let x = Tensor::new([-1.0f32, 0.5, 0.7, 2.0], dev)?;
    let y = F::threshold(&x, 0.5, -2.0, true)?;
    assert_eq!(x.to_vec::<f32>()?, [-2.0, -2.0, 0.7, 2.0]);
    assert_eq!(y.to_vec::<f32>()?, x.to_vec::<f32>()?);
    let leaf = Tensor::new([1.0f32], dev)?.requires_grad_(true)?;
    let mut t = nn::Threshold::new(0.0, 1.0);
    t.inplace = true;
    assert!(t.forward(&leaf).is_err());
    // float16 and bfloat16: the float32 result, rounded
    let xs = Tensor::new([-30.0f32, -2.5, -0.5, 0.0, 0.5, 0.75, 3.0, 20.0], dev)?;
    type Unary = fn(&Tensor) -> Result<Tensor>;
    let unary: [(&str, Unary); 6] = [
        ("logsigmoid", F::logsigmoid),
        ("softsign", F::softsign),
        ("tanhshrink", F::tanhshrink),
        ("softshrink", |x| F::softshrink(x, 0.5)),
        ("hardshrink", |x| F::hardshrink(x, 0.5)),
        ("glu", |x| F::glu(x, 0)),
    ];
    for dt in [DType::F16, DType::BF16] {
        for (name, f) in unary {
            let want = f(&xs)?.to_dtype(dt)?.to_dtype(DType::F32)?;
            let got = f(&xs.to_dtype(dt)?)?;
            assert_eq!(got.dtype(), dt, "{name}");
            let tol = if dt == DType::BF16 { 1e-2 } else { 2e-3 };
            assert!(
                got.to_dtype(DType::F32)?.allclose(&want, tol, tol)?,
                "{name} {dt:?}: {:?} vs {:?}",
                got.to_dtype(DType::F32)?.to_vec::<f32>()?,
                want.to_vec::<f32>()?
            );
        }
    }
    assert_eq!(nn::Softshrink::default().lambd, 0.5);
    assert_eq!(nn::Hardshrink::default().lambd, 0.5);
    assert_eq!(nn::GLU::default().dim, -1);
    assert!(!nn::Threshold::new(0.1, 20.0).inplace);
    assert_eq!(nn::ReflectionPad2d::new(2).padding, [2; 4]);
    assert_eq!(nn::ZeroPad1d::new([1, 3]).padding, [1, 3]);
    let c = nn::ConstantPad3d::new([1, 2, 3, 4, 5, 6], 0.5);
    assert_eq!((c.padding, c.value), ([1, 2, 3, 4, 5, 6], 0.5));
    assert!(nn::CircularPad1d::new(1usize).state_dict().is_empty());
    Ok(())
}

/// A NaN is inside no shrink interval: softshrink passes its gradient through
/// (PyTorch's backward zeroes only `[-λ, λ]`), and keeps the NaN.
fn softshrink_passes_a_nans_gradient(dev: &Device) -> Result<()> {
    let x = Tensor::new([f32::NAN, 0.1, -2.0], dev)?.requires_grad_(true)?;
    let y = ember::nn::functional::softshrink(&x, 0.5)?;
    let v = y.to_vec::<f32>()?;
    assert!(v[0].is_nan() && v[1] == 0.0 && v[2] == -1.5, "{v:?}");
    y.sum_all()?.backward()?;
    assert_eq!(x.grad().unwrap().to_vec::<f32>()?, [1.0, 0.0, 1.0]);
    Ok(())
}

device_test!(
    softshrink_passes_a_nans_gradient,
    layers3_match_pytorch,
    layers3_refuse_as_pytorch,
    channel_dropout_masks_have_pytorchs_shapes,
    channel_dropout_statistics,
    layers3_inplace_half_and_defaults,
);
