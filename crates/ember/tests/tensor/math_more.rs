//! The hyperbolic, inverse trigonometric and special functions, the
//! elementwise composites and the added reductions against PyTorch
//! (tests/golden/gen_math.py, `math_cases.json`): values, dtypes and input
//! gradients on every device; the same calls on meta (shapes and dtypes);
//! PyTorch's refusals.

use ember::prelude::*;
use serde_json::Value;

fn cases() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/math_cases.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("math_cases.json"))
        .expect("valid JSON")
}

fn dtype_named(name: &str) -> DType {
    match name {
        "float32" => DType::F32,
        "float64" => DType::F64,
        "float16" => DType::F16,
        "bfloat16" => DType::BF16,
        "int64" => DType::I64,
        "uint8" => DType::U8,
        "bool" => DType::Bool,
        d => panic!("dtype {d}"),
    }
}

fn number(v: &Value) -> f64 {
    match v.as_str() {
        Some("nan") => f64::NAN,
        Some("inf") => f64::INFINITY,
        Some("-inf") => f64::NEG_INFINITY,
        _ => v.as_f64().unwrap(),
    }
}

/// A recorded tensor (`{dtype, shape, values}`) on `dev`, exactly: integers
/// from int64, floats through float64 (every half value is a double).
fn tensor(v: &Value, dev: &Device) -> Result<Tensor> {
    let shape: Vec<usize> = v["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect();
    let dt = dtype_named(v["dtype"].as_str().unwrap());
    let values = v["values"].as_array().unwrap();
    let t = if dt.is_float() {
        Tensor::from_vec(values.iter().map(number).collect::<Vec<f64>>(), shape, dev)?
    } else {
        let ints: Vec<i64> = values.iter().map(|x| x.as_i64().unwrap()).collect();
        Tensor::from_vec(ints, shape, dev)?
    };
    t.to_dtype(dt)
}

/// The tolerance `(rtol, atol)` of a comparison in `dt`: a few ulps of float32
/// and float64 (the C libraries differ in the last digits), a rounding step of
/// the half types (float32 results a hair apart round apart), and `loose`
/// more for gradients, which PyTorch composes in the half dtype itself, and for
/// trigamma (`polygamma(1, x)`, digamma's gradient), whose float64 values
/// PyTorch's short series gives to about 5e-10 (ember's are within 1e-15 of
/// the direct sum of the series, checked in backend/op/special.rs).
fn tolerance(dt: DType, loose: bool) -> (f64, f64) {
    let k = if loose { 4.0 } else { 1.0 };
    match dt {
        DType::F64 if loose => (1e-9, 1e-12),
        DType::F64 => (1e-12, 1e-13),
        DType::F16 => (2e-3 * k, 1e-3 * k),
        DType::BF16 => (8e-3 * k, 4e-3 * k),
        _ => (1e-5, 2e-6),
    }
}

/// Asserts `got` has `want`'s dtype and shape, and each value equal to it
/// (NaN to NaN, an infinity to the same one) or within the dtype's tolerance.
#[track_caller]
fn assert_matches(what: &str, got: &Tensor, want: &Value, loose: bool) -> Result<()> {
    let want = tensor(want, &Device::Cpu)?;
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let (rtol, atol) = tolerance(want.dtype(), loose);
    let g = got.to_dtype(DType::F64)?.to_vec::<f64>()?;
    let w = want.to_dtype(DType::F64)?.to_vec::<f64>()?;
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let ok = (a.is_nan() && b.is_nan())
            || a == b
            || (b.is_finite() && (a - b).abs() <= atol + rtol * b.abs());
        assert!(
            ok,
            "{what} [{i}]: got {a}, want {b}\n got {g:?}\nwant {w:?}"
        );
    }
    Ok(())
}

/// The unary op named `op` (PyTorch's name; `polygammaN` is `polygamma(N, x)`).
fn unary(op: &str, x: &Tensor) -> Result<Tensor> {
    match op {
        "sinh" => x.sinh(),
        "cosh" => x.cosh(),
        "asin" => x.asin(),
        "acos" => x.acos(),
        "asinh" => x.asinh(),
        "acosh" => x.acosh(),
        "atanh" => x.atanh(),
        "erfc" => x.erfc(),
        "erfinv" => x.erfinv(),
        "lgamma" => x.lgamma(),
        "digamma" => x.digamma(),
        "polygamma1" => x.polygamma(1),
        "polygamma2" => x.polygamma(2),
        "polygamma3" => x.polygamma(3),
        o => panic!("op {o}"),
    }
}

/// The in-place form of [`unary`]'s op.
fn unary_inplace(op: &str, x: &Tensor) -> Result<()> {
    match op {
        "sinh" => x.sinh_(),
        "cosh" => x.cosh_(),
        "asin" => x.asin_(),
        "acos" => x.acos_(),
        "asinh" => x.asinh_(),
        "acosh" => x.acosh_(),
        "atanh" => x.atanh_(),
        "erfc" => x.erfc_(),
        "erfinv" => x.erfinv_(),
        "lgamma" => x.lgamma_(),
        "digamma" => x.digamma_(),
        "polygamma1" => x.polygamma_(1),
        "polygamma2" => x.polygamma_(2),
        "polygamma3" => x.polygamma_(3),
        o => panic!("op {o}"),
    }
}

fn unary_cases(all: &Value) -> &Vec<Value> {
    let cases = all["unary"]["cases"].as_array().unwrap();
    assert!(cases.len() >= 120, "{} cases", cases.len());
    cases
}

/// Every unary case's value and dtype, and the input gradient where PyTorch
/// recorded one; the in-place form gives the same values.
fn unary_math_matches_pytorch(dev: &Device) -> Result<()> {
    let all = cases();
    for case in unary_cases(&all) {
        let (name, op) = (case["name"].as_str().unwrap(), case["op"].as_str().unwrap());
        let x = tensor(&case["x"], dev)?;
        let y = unary(op, &x)?;
        assert_eq!(y.device(), *dev, "{name}");
        let trigamma = op == "polygamma1";
        assert_matches(name, &y, &case["y"], trigamma)?;
        if x.dtype().is_float() {
            let t = x.copy()?;
            unary_inplace(op, &t)?;
            assert_matches(&format!("{name} in place"), &t, &case["y"], trigamma)?;
        }
        if let Some(g) = case.get("grad") {
            let x = x.requires_grad_(true)?;
            unary(op, &x)?.backward_with(&tensor(&case["grad_out"], dev)?)?;
            assert_matches(&format!("{name} grad"), &x.grad().unwrap(), g, true)?;
        }
    }
    Ok(())
}

/// Each gradient is the next function of the family at known points:
/// lgamma' = ψ (ψ(1) = -γ), ψ' = ψ⁽¹⁾ (ψ⁽¹⁾(1) = π²/6), ψ⁽¹⁾' = ψ⁽²⁾
/// (ψ⁽²⁾(1) = -2ζ(3)), ψ⁽²⁾' = ψ⁽³⁾ (ψ⁽³⁾(1) = π⁴/15).
fn special_gradients_chain(dev: &Device) -> Result<()> {
    let pi = std::f64::consts::PI;
    let want = [
        -0.577_215_664_901_532_9,
        pi * pi / 6.0,
        -2.0 * 1.202_056_903_159_594_3,
        pi.powi(4) / 15.0,
    ];
    for (k, want) in want.into_iter().enumerate() {
        let x = Tensor::new([1.0f64], dev)?.requires_grad_(true)?;
        let y = match k {
            0 => x.lgamma()?,
            n => x.polygamma(n as i64 - 1)?,
        };
        y.sum_all()?.backward()?;
        let got = x.grad().unwrap().to_vec::<f64>()?[0];
        assert!(
            (got - want).abs() <= 1e-14 * want.abs(),
            "{k}: {got} vs {want}"
        );
    }
    Ok(())
}

/// The same calls on meta: the CPU's dtypes and shapes, forward and backward.
#[test]
fn unary_math_runs_on_meta() -> Result<()> {
    let all = cases();
    for case in unary_cases(&all) {
        let (name, op) = (case["name"].as_str().unwrap(), case["op"].as_str().unwrap());
        let cpu = tensor(&case["x"], &Device::Cpu)?;
        let x = Tensor::zeros(cpu.shape(), cpu.dtype(), &Device::Meta)?;
        let want = tensor(&case["y"], &Device::Cpu)?;
        let x = if x.dtype().is_float() {
            x.requires_grad_(true)?
        } else {
            x
        };
        let y = unary(op, &x)?;
        assert_eq!(
            (y.shape(), y.dtype()),
            (want.shape(), want.dtype()),
            "{name}"
        );
        assert_eq!(y.device(), Device::Meta);
        if x.requires_grad() {
            y.sum_all()?.backward()?;
            assert_eq!(x.grad().unwrap().shape(), x.shape(), "{name}");
        }
    }
    Ok(())
}

/// PyTorch's refusals, as errors on every device (the recorded phrase is part
/// of ember's message).
fn unary_math_refuses_as_pytorch(dev: &Device) -> Result<()> {
    let all = cases();
    for e in all["unary"]["errors"].as_array().unwrap() {
        let (name, phrase) = (e["name"].as_str().unwrap(), e["phrase"].as_str().unwrap());
        let got = match name {
            "polygamma_negative" => Tensor::ones([2], DType::F32, dev)?.polygamma(-1).map(drop),
            "sinh_inplace_int" => Tensor::ones([2], DType::I64, dev)?.sinh_(),
            "digamma_inplace_bool" => Tensor::ones([2], DType::Bool, dev)?.digamma_(),
            n => panic!("error case {n}"),
        };
        let msg = got.expect_err(name).to_string();
        assert!(msg.contains(phrase), "{name}: {msg:?} lacks {phrase:?}");
    }
    Ok(())
}

fn args_f64(case: &Value, key: &str) -> Option<f64> {
    case["args"].get(key).and_then(Value::as_f64)
}

fn arg_dim(case: &Value) -> i64 {
    case["args"]["dim"].as_i64().unwrap()
}

/// The composite or reduction named `op` on `x` (the case's inputs and
/// arguments): its outputs.
fn composite(case: &Value, x: &[Tensor]) -> Result<Vec<Tensor>> {
    let one = |t: Result<Tensor>| t.map(|t| vec![t]);
    let two = |t: Result<(Tensor, Tensor)>| t.map(|(a, b)| vec![a, b]);
    let keepdim = case["args"]["keepdim"].as_bool().unwrap_or(false);
    match case["op"].as_str().unwrap() {
        "logit" => one(x[0].logit(args_f64(case, "eps"))),
        "logaddexp" => one(x[0].logaddexp(&x[1])),
        "logaddexp2" => one(x[0].logaddexp2(&x[1])),
        "exp2" => one(x[0].exp2()),
        "frac" => one(x[0].frac()),
        "deg2rad" => one(x[0].deg2rad()),
        "rad2deg" => one(x[0].rad2deg()),
        "sinc" => one(x[0].sinc()),
        "fmax" => one(x[0].fmax(&x[1])),
        "fmin" => one(x[0].fmin(&x[1])),
        "copysign" => one(x[0].copysign(&x[1])),
        "float_power" => match args_f64(case, "exponent") {
            Some(e) => one(x[0].float_power(e)),
            None => one(x[0].float_power(&x[1])),
        },
        "nansum" => match case["args"].get("dim") {
            Some(_) => one(x[0].nansum(arg_dim(case), false)),
            None => one(x[0].nansum_all()),
        },
        "nanmean" => one(x[0].nanmean(arg_dim(case), keepdim)),
        "var_mean" => {
            two(x[0].var_mean(arg_dim(case), args_f64(case, "correction").unwrap(), false))
        }
        "std_mean" => {
            two(x[0].std_mean(arg_dim(case), args_f64(case, "correction").unwrap(), false))
        }
        "count_nonzero" => match case["args"].get("dim") {
            Some(_) => one(x[0].count_nonzero(arg_dim(case))),
            None => one(x[0].count_nonzero_all()),
        },
        "aminmax" => two(x[0].aminmax(case["args"]["dim"].as_i64(), keepdim)),
        "diff" => {
            let n = case["args"]["n"].as_u64().unwrap() as usize;
            one(x[0].diff(n, arg_dim(case), x.get(1), x.get(2)))
        }
        "isin" => one(x[0].isin(&x[1], case["args"]["invert"].as_bool().unwrap())),
        "isclose" => one(x[0].isclose(
            &x[1],
            args_f64(case, "rtol").unwrap(),
            args_f64(case, "atol").unwrap(),
            case["args"]["equal_nan"].as_bool().unwrap(),
        )),
        o => panic!("op {o}"),
    }
}

/// Every composite and reduction case of `section`: outputs (dtype, shape,
/// values) and the float inputs' gradients where PyTorch recorded them.
fn composites_match(section: &str, dev: &Device) -> Result<()> {
    let all = cases();
    let list = all[section]["cases"].as_array().unwrap();
    assert!(list.len() >= 40, "{section}: {} cases", list.len());
    for case in list {
        let name = case["name"].as_str().unwrap();
        let x: Vec<Tensor> = case["inputs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                let t = tensor(v, dev)?;
                match t.dtype().is_float() && case.get("grads").is_some() {
                    true => t.requires_grad_(true),
                    false => Ok(t),
                }
            })
            .collect::<Result<_>>()?;
        let want = case["outputs"].as_array().unwrap();
        if case["op"] == "equal" {
            assert_eq!(Value::Bool(x[0].equal(&x[1])?), want[0], "{name}");
            continue;
        }
        let got = composite(case, &x)?;
        assert_eq!(got.len(), want.len(), "{name}");
        for (k, (g, w)) in got.iter().zip(want).enumerate() {
            assert_eq!(g.device(), *dev, "{name}");
            assert_matches(&format!("{name} output {k}"), g, w, false)?;
        }
        if let Some(grads) = case.get("grads") {
            got[0].backward_with(&tensor(&case["grad_out"], dev)?)?;
            for (k, (t, w)) in x.iter().zip(grads.as_array().unwrap()).enumerate() {
                match (t.grad(), w.is_null()) {
                    (Some(g), false) => assert_matches(&format!("{name} grad {k}"), &g, w, true)?,
                    (None, true) => {}
                    // PyTorch gives no gradient to an input the result does
                    // not depend on; ember may give zeros
                    (Some(g), true) => assert_eq!(g.abs()?.sum_all()?.to_vec::<f64>()?, vec![0.0]),
                    // and the reverse: PyTorch's rule may give zeros (copysign's
                    // `other`) where ember's graph has no path
                    (None, false) => {
                        let w = tensor(w, &Device::Cpu)?.to_dtype(DType::F64)?;
                        assert!(
                            w.to_vec::<f64>()?.iter().all(|&v| v == 0.0),
                            "{name}: grad {k}"
                        );
                    }
                }
            }
        }
    }
    Ok(())
}

fn composite_math_matches_pytorch(dev: &Device) -> Result<()> {
    composites_match("composite", dev)
}

fn reductions_match_pytorch(dev: &Device) -> Result<()> {
    composites_match("reductions", dev)
}

/// The composites' and reductions' refusals, with PyTorch's messages.
fn composites_refuse_as_pytorch(dev: &Device) -> Result<()> {
    let all = cases();
    let i = Tensor::new([1i64, 2], dev)?;
    let f = Tensor::new([1f32, 2.0], dev)?;
    for section in ["composite", "reductions"] {
        for e in all[section]["errors"].as_array().unwrap() {
            let (name, phrase) = (e["name"].as_str().unwrap(), e["phrase"].as_str().unwrap());
            let got = match name {
                "frac_int" => i.frac().map(drop),
                "logaddexp_int" => i.logaddexp(&i).map(drop),
                "nanmean_int" => i.nanmean_all().map(drop),
                "var_mean_int" => i.var_mean(0, 1.0, false).map(drop),
                "isclose_dtypes" => f.isclose(&i, 1e-5, 1e-8, false).map(drop),
                "isclose_rtol" => f.isclose(&f, -1.0, 1e-8, false).map(drop),
                "diff_0d" => Tensor::new(1f32, dev)?.diff(1, -1, None, None).map(drop),
                n => panic!("error case {n}"),
            };
            let msg = got.expect_err(name).to_string();
            assert!(msg.contains(phrase), "{name}: {msg:?} lacks {phrase:?}");
        }
    }
    Ok(())
}

/// The aliases are the ops they name, and `allclose` is `isclose` over all
/// elements.
fn aliases_and_allclose(dev: &Device) -> Result<()> {
    let a = Tensor::new([1.5f32, -2.0, 3.0], dev)?;
    let b = Tensor::new([0.5f32, -2.0, 4.0], dev)?;
    let same = |x: Tensor, y: Tensor| -> Result<()> {
        assert_eq!(x.dtype(), y.dtype());
        assert_eq!(
            x.to_dtype(DType::F64)?.to_vec::<f64>()?,
            y.to_dtype(DType::F64)?.to_vec::<f64>()?
        );
        Ok(())
    };
    same(a.multiply(&b)?, a.mul(&b)?)?;
    same(a.subtract(&b)?, a.sub(&b)?)?;
    same(a.divide(&b)?, a.div(&b)?)?;
    same(a.true_divide(2.0)?, a.div(2.0)?)?;
    same(a.greater(&b)?, a.gt(&b)?)?;
    same(a.greater_equal(&b)?, a.ge(&b)?)?;
    same(a.less(&b)?, a.lt(&b)?)?;
    same(a.less_equal(&b)?, a.le(&b)?)?;
    same(a.not_equal(&b)?, a.ne(&b)?)?;
    same(a.absolute()?, a.abs()?)?;
    same(a.negative()?, a.neg()?)?;
    same(
        a.clip(Some(-1.0), Some(2.0))?,
        a.clamp(Some(-1.0), Some(2.0))?,
    )?;
    let c = a.add(1e-6)?;
    assert!(a.allclose(&c, 1e-5, 0.0)?);
    assert_eq!(
        a.isclose(&c, 1e-5, 0.0, false)?.to_vec::<bool>()?,
        vec![true; 3]
    );
    assert!(!a.allclose(&b, 1e-5, 0.0)?);
    Ok(())
}

device_test!(
    unary_math_matches_pytorch,
    special_gradients_chain,
    unary_math_refuses_as_pytorch,
    composite_math_matches_pytorch,
    reductions_match_pytorch,
    composites_refuse_as_pytorch,
    aliases_and_allclose,
);
