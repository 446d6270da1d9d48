//! The losses of `nn/loss_more.rs`, `F.normalize` and the loss modules
//! against PyTorch (tests/golden/gen_nn.py, `losses2`): each case's value and
//! the gradient of every input PyTorch differentiates, on every device, by the
//! function and by its module; the same cases on meta (shapes and dtypes);
//! float16 and bfloat16 inputs; PyTorch's refusals; the modules' tensors
//! moving with `to_device` and `to_dtype`.

use super::cases;
use ember::nn::functional as F;
use ember::nn::{self, Reduction};
use ember::prelude::*;
use serde_json::Value;
use std::collections::BTreeMap;

/// A number of the golden file: a JSON number, or "nan", "inf", "-inf".
fn num(v: &Value) -> f64 {
    match v.as_str() {
        Some("nan") => f64::NAN,
        Some("inf") => f64::INFINITY,
        Some("-inf") => f64::NEG_INFINITY,
        Some(s) => panic!("number {s:?}"),
        None => v.as_f64().unwrap(),
    }
}

fn shape_of(v: &Value) -> Vec<usize> {
    let s = v["shape"].as_array().unwrap();
    s.iter().map(|d| d.as_u64().unwrap() as usize).collect()
}

fn values(v: &Value) -> Vec<f64> {
    v["values"].as_array().unwrap().iter().map(num).collect()
}

/// A golden tensor in float64 on `dev`.
fn tensor(v: &Value, dev: &Device) -> Result<Tensor> {
    Tensor::from_vec(values(v), shape_of(v), dev)
}

fn dtype(name: &str) -> DType {
    match name {
        "float64" => DType::F64,
        "float32" => DType::F32,
        "float16" => DType::F16,
        "bfloat16" => DType::BF16,
        other => panic!("dtype {other}"),
    }
}

fn reduction(args: &Value) -> Reduction {
    match args["reduction"].as_str() {
        Some("sum") => Reduction::Sum,
        Some("none") => Reduction::None,
        _ => Reduction::Mean,
    }
}

/// A case's tensors by argument name, in the case's dtype (int64 class
/// indices as int64), those PyTorch differentiates requiring a gradient.
fn case_tensors(case: &Value, dt: DType, dev: &Device) -> Result<BTreeMap<String, Tensor>> {
    let mut out = BTreeMap::new();
    for (k, t) in case["tensors"].as_object().unwrap() {
        let v = tensor(&t["t"], dev)?;
        let v = if t["int"].as_bool().unwrap() {
            v.to_dtype(DType::I64)?
        } else {
            v.to_dtype(dt)?
                .requires_grad_(t["grad"].as_bool().unwrap())?
        };
        out.insert(k.clone(), v);
    }
    Ok(out)
}

/// A case's call: by the functional loss (`module` false) or by its module,
/// built from the case's options.
fn call(case: &Value, ts: &BTreeMap<String, Tensor>, module: bool) -> Result<Tensor> {
    let a = &case["args"];
    let f = |k: &str, d: f64| a.get(k).map(num).unwrap_or(d);
    let b = |k: &str| a[k].as_bool().unwrap_or(false);
    let t = |k: &str| ts.get(k).unwrap_or_else(|| panic!("tensor {k}"));
    let opt = |k: &str| ts.get(k);
    let red = reduction(a);
    let with_weights = |w: Option<&Tensor>, pw: Option<&Tensor>| (w.cloned(), pw.cloned());
    let (weight, pos_weight) = with_weights(opt("weight"), opt("pos_weight"));
    macro_rules! weighted {
        ($m:expr) => {{
            let m = $m;
            let m = match &weight {
                Some(w) => m.weight(w),
                None => m,
            };
            m
        }};
    }
    let fun = case["fn"].as_str().unwrap();
    match (fun, module) {
        ("margin_ranking", false) => {
            F::margin_ranking_loss(t("input1"), t("input2"), t("target"), f("margin", 0.0), red)
        }
        ("margin_ranking", true) => nn::MarginRankingLoss::new()
            .margin(f("margin", 0.0))
            .reduction(red)
            .forward(t("input1"), t("input2"), t("target")),
        ("hinge_embedding", false) => {
            F::hinge_embedding_loss(t("input"), t("target"), f("margin", 1.0), red)
        }
        ("hinge_embedding", true) => nn::HingeEmbeddingLoss::new()
            .margin(f("margin", 1.0))
            .reduction(red)
            .forward(t("input"), t("target")),
        ("soft_margin", false) => F::soft_margin_loss(t("input"), t("target"), red),
        ("soft_margin", true) => nn::SoftMarginLoss::new()
            .reduction(red)
            .forward(t("input"), t("target")),
        ("multilabel_soft_margin", false) => {
            F::multilabel_soft_margin_loss(t("input"), t("target"), opt("weight"), red)
        }
        ("multilabel_soft_margin", true) | ("MultiLabelSoftMarginLoss", _) => {
            weighted!(nn::MultiLabelSoftMarginLoss::new().reduction(red))
                .forward(t("input"), t("target"))
        }
        ("cosine_embedding", false) => {
            F::cosine_embedding_loss(t("input1"), t("input2"), t("target"), f("margin", 0.0), red)
        }
        ("cosine_embedding", true) => nn::CosineEmbeddingLoss::new()
            .margin(f("margin", 0.0))
            .reduction(red)
            .forward(t("input1"), t("input2"), t("target")),
        ("triplet_margin", false) => F::triplet_margin_loss(
            t("anchor"),
            t("positive"),
            t("negative"),
            f("margin", 1.0),
            f("p", 2.0),
            f("eps", 1e-6),
            b("swap"),
            red,
        ),
        ("triplet_margin", true) | ("TripletMarginLoss", _) => nn::TripletMarginLoss::new()
            .margin(f("margin", 1.0))
            .p(f("p", 2.0))
            .eps(f("eps", 1e-6))
            .swap(b("swap"))
            .reduction(red)
            .forward(t("anchor"), t("positive"), t("negative")),
        ("poisson_nll", false) => F::poisson_nll_loss(
            t("input"),
            t("target"),
            a["log_input"].as_bool().unwrap_or(true),
            b("full"),
            f("eps", 1e-8),
            red,
        ),
        ("poisson_nll", true) => nn::PoissonNLLLoss::new()
            .log_input(a["log_input"].as_bool().unwrap_or(true))
            .full(b("full"))
            .eps(f("eps", 1e-8))
            .reduction(red)
            .forward(t("input"), t("target")),
        ("gaussian_nll", m) => {
            let var: ember::Operand = match opt("var") {
                Some(v) => v.into(),
                None => f("var_scalar", f64::NAN).into(),
            };
            if m {
                nn::GaussianNLLLoss::new()
                    .full(b("full"))
                    .eps(f("eps", 1e-6))
                    .reduction(red)
                    .forward(t("input"), t("target"), var)
            } else {
                F::gaussian_nll_loss(t("input"), t("target"), var, b("full"), f("eps", 1e-6), red)
            }
        }
        ("multi_margin", false) => F::multi_margin_loss(
            t("input"),
            t("target"),
            a["p"].as_i64().unwrap_or(1),
            f("margin", 1.0),
            opt("weight"),
            red,
        ),
        ("multi_margin", true) | ("MultiMarginLoss", _) => weighted!(nn::MultiMarginLoss::new()
            .p(a["p"].as_i64().unwrap_or(1))
            .margin(f("margin", 1.0))
            .reduction(red))
        .forward(t("input"), t("target")),
        ("multilabel_margin", false) => F::multilabel_margin_loss(t("input"), t("target"), red),
        ("multilabel_margin", true) => nn::MultiLabelMarginLoss::new()
            .reduction(red)
            .forward(t("input"), t("target")),
        ("normalize", _) => {
            let dims: Vec<i64> = a["dim"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_i64().unwrap())
                .collect();
            F::normalize(t("input"), f("p", 2.0), dims, f("eps", 1e-12))
        }
        ("CrossEntropyLoss", _) => weighted!(nn::CrossEntropyLoss::new()
            .ignore_index(a["ignore_index"].as_i64().unwrap_or(-100))
            .label_smoothing(f("label_smoothing", 0.0))
            .reduction(red))
        .forward(t("input"), t("target")),
        ("NLLLoss", _) => weighted!(nn::NLLLoss::new()
            .ignore_index(a["ignore_index"].as_i64().unwrap_or(-100))
            .reduction(red))
        .forward(t("input"), t("target")),
        ("BCELoss", _) => {
            weighted!(nn::BCELoss::new().reduction(red)).forward(t("input"), t("target"))
        }
        ("BCEWithLogitsLoss", _) => {
            let m = weighted!(nn::BCEWithLogitsLoss::new().reduction(red));
            let m = match &pos_weight {
                Some(p) => m.pos_weight(p),
                None => m,
            };
            m.forward(t("input"), t("target"))
        }
        ("KLDivLoss", _) => {
            let m = nn::KLDivLoss::new()
                .reduction(red)
                .log_target(b("log_target"));
            let m = if b("batchmean") { m.batchmean() } else { m };
            m.forward(t("input"), t("target"))
        }
        ("SmoothL1Loss", _) => nn::SmoothL1Loss::new()
            .beta(f("beta", 1.0))
            .reduction(red)
            .forward(t("input"), t("target")),
        ("HuberLoss", _) => nn::HuberLoss::new()
            .delta(f("delta", 1.0))
            .reduction(red)
            .forward(t("input"), t("target")),
        ("L1Loss", _) => nn::L1Loss::new()
            .reduction(red)
            .forward(t("input"), t("target")),
        ("MSELoss", _) => nn::MSELoss::new()
            .reduction(red)
            .forward(t("input"), t("target")),
        (other, _) => panic!("unknown loss {other}"),
    }
}

/// Whether the case's function has a module form besides (its module is
/// called too, and must give the function's value).
fn has_module(case: &Value) -> bool {
    let f = case["fn"].as_str().unwrap();
    f.starts_with(char::is_lowercase) && f != "normalize"
}

/// Asserts `got` is `want` within `atol + rtol·|want|` (NaN matching NaN, an
/// infinity the same infinity).
#[track_caller]
fn close(what: &str, got: &Tensor, want: &Value, (rtol, atol): (f64, f64)) -> Result<()> {
    assert_eq!(got.shape(), &shape_of(want)[..], "{what}: shape");
    let g = got.to_dtype(DType::F64)?.to_vec::<f64>()?;
    for (i, (a, b)) in g.iter().zip(values(want)).enumerate() {
        let same = a == &b || (a.is_nan() && b.is_nan()) || (a - b).abs() <= atol + rtol * b.abs();
        assert!(same, "{what} [{i}]: {a} vs {b}");
    }
    Ok(())
}

/// The output gradient of the golden cases: 1 for a reduced loss, else
/// `linspace(-1, 1.3)` over its elements.
fn backward(l: &Tensor) -> Result<()> {
    if l.rank() == 0 {
        l.backward()
    } else {
        let dev = l.device();
        let g = Tensor::linspace(-1.0, 1.3, l.numel(), l.dtype(), &dev)?.reshape(l.shape())?;
        l.backward_with(&g)
    }
}

fn all_cases(all: &Value) -> &Vec<Value> {
    let cases = all["losses2"]["cases"].as_array().unwrap();
    assert!(cases.len() >= 100, "{} cases", cases.len());
    cases
}

/// Every case's value and gradients against PyTorch's on `dev`; the module
/// form of each function gives the function's value and gradients.
fn losses2_match_pytorch(dev: &Device) -> Result<()> {
    let all = cases();
    for case in all_cases(&all) {
        let name = case["name"].as_str().unwrap();
        let dt = dtype(case["dtype"].as_str().unwrap());
        let tol = if dt == DType::F64 {
            (1e-10, 1e-12)
        } else {
            (2e-5, 2e-5)
        };
        let forms: &[bool] = if has_module(case) {
            &[false, true]
        } else {
            &[false]
        };
        for &module in forms {
            let what = format!("{name}{}", if module { " (module)" } else { "" });
            let ts = case_tensors(case, dt, dev)?;
            let l = call(case, &ts, module)?;
            assert_eq!(
                l.dtype(),
                dtype(case["value_dtype"].as_str().unwrap()),
                "{what}"
            );
            assert_eq!(l.device(), *dev, "{what}");
            close(&format!("{what} value"), &l, &case["value"], tol)?;
            backward(&l)?;
            for (k, want) in case["grads"].as_object().unwrap() {
                let got = ts[k].grad();
                match (got, want.is_null()) {
                    (Some(g), false) => close(&format!("{what} grad of {k}"), &g, want, tol)?,
                    (None, true) => {}
                    (g, _) => panic!("{what}: gradient of {k}: {g:?} where PyTorch has {want}"),
                }
            }
        }
    }
    Ok(())
}

/// The same cases on meta: the CPU's shapes and dtypes, forward and backward.
#[test]
fn losses2_run_on_meta_with_the_cpus_shapes() -> Result<()> {
    let all = cases();
    for case in all_cases(&all) {
        let name = case["name"].as_str().unwrap();
        let dt = dtype(case["dtype"].as_str().unwrap());
        let ts: BTreeMap<String, Tensor> = case_tensors(case, dt, &Device::Cpu)?
            .into_iter()
            .map(|(k, t)| {
                let m = Tensor::zeros(t.shape(), t.dtype(), &Device::Meta)?;
                Ok((k, m.requires_grad_(t.requires_grad())?))
            })
            .collect::<Result<_>>()?;
        let l = call(case, &ts, false)?;
        let want = &case["value"];
        assert_eq!(l.shape(), &shape_of(want)[..], "{name}");
        assert_eq!(
            l.dtype(),
            dtype(case["value_dtype"].as_str().unwrap()),
            "{name}"
        );
        assert_eq!(l.device(), Device::Meta, "{name}");
        backward(&l)?;
        for (k, want) in case["grads"].as_object().unwrap() {
            if !want.is_null() {
                let g = ts[k]
                    .grad()
                    .unwrap_or_else(|| panic!("{name}: grad of {k}"));
                assert_eq!(g.shape(), ts[k].shape(), "{name} grad of {k}");
            }
        }
    }
    Ok(())
}

/// float16 and bfloat16 inputs: the dtype kept, the value and gradients within
/// the dtype's rounding of PyTorch CPU's (or, where its CPU kernel refuses the
/// dtype, of float64's on the same values), measured against the largest
/// magnitude of each result.
fn losses2_take_half_inputs(dev: &Device) -> Result<()> {
    let all = cases();
    let halves = all["losses2"]["half"].as_array().unwrap();
    assert!(halves.len() >= 20);
    for case in halves {
        let name = case["name"].as_str().unwrap();
        let dt = dtype(case["dtype"].as_str().unwrap());
        let ts = case_tensors(case, dt, dev)?;
        let l = call(case, &ts, false)?;
        assert_eq!(l.dtype(), dt, "{name}");
        let rel = if dt == DType::BF16 { 3e-2 } else { 4e-3 };
        let near = |what: &str, got: &Tensor, want: &Value| -> Result<()> {
            let scale = values(want)
                .iter()
                .filter(|v| v.is_finite())
                .fold(1e-3f64, |m, v| m.max(v.abs()));
            close(&format!("{name} {what}"), got, want, (rel, rel * scale))
        };
        near("value", &l, &case["value"])?;
        backward(&l)?;
        for (k, want) in case["grads"].as_object().unwrap() {
            match (ts[k].grad(), want.is_null()) {
                (Some(g), false) => {
                    assert_eq!(g.dtype(), dt, "{name} grad of {k}");
                    near(&format!("grad of {k}"), &g, want)?;
                }
                (None, true) => {}
                (g, _) => panic!("{name}: gradient of {k}: {g:?} where PyTorch has {want}"),
            }
        }
    }
    Ok(())
}

/// PyTorch's refusals (tests/golden/gen_nn.py records a phrase of each
/// message, which ember's contains), as errors on every device. A class index
/// out of range is checked on the CPU at once, on a GPU at the next wait: the
/// GPU's check has a test of its own.
fn losses2_refuse_as_pytorch(dev: &Device) -> Result<()> {
    let all = cases();
    let errors = all["losses2"]["errors"].as_array().unwrap();
    assert!(errors.len() >= 50);
    let z = |s: &[usize]| Tensor::zeros(s, DType::F64, dev);
    let zi = |s: &[usize]| Tensor::zeros(s, DType::I64, dev);
    let ints = |v: &[i64], s: &[usize]| Tensor::from_vec(v.to_vec(), s, dev);
    let v4 = Tensor::new([0.5f64, -1.0, 2.0, 0.25], dev)?;
    let (v3, m43) = (z(&[3])?, Tensor::randn([4, 3], dev)?.to_dtype(DType::F64)?);
    let tg4 = ints(&[0, 2, 1, 2], &[4])?;
    let mt4 = ints(&[0, 2, -1, 1, -1, 0, 2, 1, 0, -1, 0, 0], &[4, 3])?;
    let red = Reduction::Mean;
    let ones = |s: &[usize]| Tensor::ones(s, DType::F64, dev);
    for e in errors {
        let name = e["name"].as_str().unwrap();
        let phrase = e["phrase"].as_str().unwrap();
        let got = match name {
            "mrl_dims" => F::margin_ranking_loss(&v4, &v4, &v4.unsqueeze(0)?, 0.0, red),
            "mrl_broadcast" => F::margin_ranking_loss(&v4, &v3, &v4, 0.0, red),
            "mrl_bool_target" => F::margin_ranking_loss(&v4, &v4, &v4.gt(0.0)?, 0.0, red),
            "hinge_broadcast" => F::hinge_embedding_loss(&v4, &v3, 1.0, red),
            "hinge_int_mean" => F::hinge_embedding_loss(&zi(&[4])?, &v4, 1.0, red),
            "soft_target_grad" => F::soft_margin_loss(&v4, &v4.detach().requires_grad_(true)?, red),
            "soft_int_input" => F::soft_margin_loss(&zi(&[4])?, &v4, red),
            "soft_target_bigger" => F::soft_margin_loss(&v4, &z(&[3, 4])?, red),
            "soft_broadcast" => F::soft_margin_loss(&v4, &v3, red),
            "mlsm_0d" => {
                let s = v4.select(0, 0)?;
                F::multilabel_soft_margin_loss(&s, &s, None, red)
            }
            "mlsm_int" => F::multilabel_soft_margin_loss(&zi(&[3, 4])?, &z(&[3, 4])?, None, red),
            "mlsm_broadcast" => {
                F::multilabel_soft_margin_loss(&z(&[3, 4])?, &z(&[3, 3])?, None, red)
            }
            "cos_target_2d" => F::cosine_embedding_loss(&m43, &m43, &z(&[4, 1])?, 0.0, red),
            "cos_1d_target" => F::cosine_embedding_loss(&m43, &v3, &z(&[4])?, 0.0, red),
            "cos_0d_target" => F::cosine_embedding_loss(&m43, &m43, &z(&[])?, 0.0, red),
            "cos_size" => F::cosine_embedding_loss(&m43, &z(&[4, 2])?, &z(&[4])?, 0.0, red),
            "cos_target_size" => F::cosine_embedding_loss(&m43, &m43, &z(&[5])?, 0.0, red),
            "trip_margin" => F::triplet_margin_loss(&m43, &m43, &m43, 0.0, 2.0, 1e-6, false, red),
            "trip_margin_negative" => {
                F::triplet_margin_loss(&m43, &m43, &m43, -1.5, 2.0, 1e-6, false, red)
            }
            "trip_dims" => F::triplet_margin_loss(&m43, &v3, &m43, 1.0, 2.0, 1e-6, false, red),
            "trip_size" => {
                F::triplet_margin_loss(&m43, &z(&[4, 2])?, &m43, 1.0, 2.0, 1e-6, false, red)
            }
            "pois_size" => F::poisson_nll_loss(&v4, &v3, true, false, 1e-8, red),
            "gauss_negative" => {
                let var = Tensor::new([1.0f64, -1.0, 1.0, 1.0], dev)?;
                F::gaussian_nll_loss(&v4, &v4, &var, false, 1e-6, red)
            }
            "gauss_negative_number" => F::gaussian_nll_loss(&v4, &v4, -0.5, false, 1e-6, red),
            "gauss_var_bigger" => F::gaussian_nll_loss(&v4, &v4, &ones(&[2, 4])?, false, 1e-6, red),
            "gauss_var_two_ones" => {
                let x = z(&[4, 3, 2])?;
                F::gaussian_nll_loss(&x, &x, &ones(&[4, 1, 1])?, false, 1e-6, red)
            }
            "gauss_var_empty" => {
                F::gaussian_nll_loss(&m43, &m43, &ones(&[4, 0])?, false, 1e-6, red)
            }
            "gauss_int_var" => {
                let var = Tensor::ones([4, 3], DType::I64, dev)?;
                F::gaussian_nll_loss(&m43, &m43, &var, false, 1e-6, red)
            }
            "mm_p" => F::multi_margin_loss(&m43, &tg4, 3, 1.0, None, red),
            "mm_weight_dim" => F::multi_margin_loss(&m43, &tg4, 1, 1.0, Some(&ones(&[1, 3])?), red),
            "mm_weight_size" => F::multi_margin_loss(&m43, &tg4, 1, 1.0, Some(&ones(&[4])?), red),
            "mm_weight_dtype" => {
                let w = Tensor::ones([3], DType::F32, dev)?;
                F::multi_margin_loss(&m43, &tg4, 1, 1.0, Some(&w), red)
            }
            "mm_target_dtype" => {
                F::multi_margin_loss(&m43, &tg4.to_dtype(DType::F64)?, 1, 1.0, None, red)
            }
            "mm_target_size" => {
                F::multi_margin_loss(&m43, &tg4.narrow(0, 0, 3)?, 1, 1.0, None, red)
            }
            "mm_target_2d" => F::multi_margin_loss(&m43, &tg4.unsqueeze(0)?, 1, 1.0, None, red),
            "mm_target_1d_input" => {
                F::multi_margin_loss(&v3, &tg4.narrow(0, 0, 2)?, 1, 1.0, None, red)
            }
            "mm_3d" => F::multi_margin_loss(&z(&[2, 4, 3])?, &tg4, 1, 1.0, None, red),
            "mm_no_classes" => F::multi_margin_loss(&z(&[4, 0])?, &tg4, 1, 1.0, None, red),
            "mm_int" => F::multi_margin_loss(&zi(&[4, 3])?, &tg4, 1, 1.0, None, red),
            "mm_range" | "mm_range_negative" if dev.is_cuda() => continue,
            "mm_range" => F::multi_margin_loss(&m43, &tg4.add(1i64)?, 1, 1.0, None, red),
            "mm_range_negative" => F::multi_margin_loss(&m43, &tg4.sub(1i64)?, 1, 1.0, None, red),
            "mm_weight_grad" => {
                let w = ones(&[3])?.requires_grad_(true)?;
                F::multi_margin_loss(&m43, &tg4, 1, 1.0, Some(&w), red)
            }
            "mml_target_size" => F::multilabel_margin_loss(&m43, &mt4.narrow(0, 0, 3)?, red),
            "mml_1d_size" => {
                F::multilabel_margin_loss(&v3, &mt4.select(0, 0)?.narrow(0, 0, 2)?, red)
            }
            "mml_1d_target_2d" => F::multilabel_margin_loss(&v3, &mt4.narrow(0, 0, 1)?, red),
            "mml_3d" => F::multilabel_margin_loss(&z(&[2, 4, 3])?, &mt4, red),
            "mml_int" => F::multilabel_margin_loss(&zi(&[4, 3])?, &mt4, red),
            "mml_target_dtype" => {
                F::multilabel_margin_loss(&m43, &mt4.clamp_min(0i64)?.to_dtype(DType::F64)?, red)
            }
            "mml_range" | "mml_range_negative" if dev.is_cuda() => continue,
            "mml_range" => F::multilabel_margin_loss(&m43, &mt4.add(1i64)?, red),
            "mml_range_negative" => F::multilabel_margin_loss(&m43, &mt4.sub(1i64)?, red),
            "normalize_int" => F::normalize(&zi(&[3, 4])?, 2.0, 1, 1e-12),
            "normalize_dim" => F::normalize(&v3, 2.0, 1, 1e-12),
            other => panic!("unknown error case {other}"),
        };
        let msg = got.expect_err(name).to_string();
        assert!(msg.contains(phrase), "{name}: {msg:?} lacks {phrase:?}");
    }
    Ok(())
}

/// The tensors a loss holds are its buffers (PyTorch's names), and move with
/// `to_dtype` and `to_device` as a model's do: a weight made on the CPU in
/// float32 weighs a float64 loss on `dev` after the moves. Losses without
/// tensors take the same calls.
fn loss_modules_move_their_tensors(dev: &Device) -> Result<()> {
    let cpu = Device::Cpu;
    let w = Tensor::new([0.5f32, 2.0, 1.0], &cpu)?;
    let mut ce = nn::CrossEntropyLoss::new()
        .weight(&w)
        .reduction(Reduction::Sum);
    let names: Vec<String> = ce.named_buffers().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["weight"]);
    assert!(
        ce.to_dtype(DType::I64).is_err(),
        "a module casts to floats only"
    );
    ce.to_dtype(DType::F64)?;
    ce.to_device(dev)?;
    let weight = ce.weight.as_ref().unwrap();
    assert_eq!((weight.dtype(), weight.device()), (DType::F64, *dev));
    // the caller's tensor is untouched
    assert_eq!((w.dtype(), w.device()), (DType::F32, cpu));
    let x = Tensor::new([[1.0f64, 2.0, 3.0], [0.5, -1.0, 0.0]], dev)?;
    let y = Tensor::new([2i64, 0], dev)?;
    let got = ce.forward(&x, &y)?.item::<f64>()?;
    let lse = |r: [f64; 3]| r.iter().map(|v| v.exp()).sum::<f64>().ln();
    let want = 1.0 * (lse([1.0, 2.0, 3.0]) - 3.0) + 0.5 * (lse([0.5, -1.0, 0.0]) - 0.5);
    assert!((got - want).abs() < 1e-12, "{got} vs {want}");

    let pw = Tensor::new([2.0f32, 0.5], &cpu)?;
    let mut bce = nn::BCEWithLogitsLoss::new()
        .weight(&Tensor::new([1.0f32, 3.0], &cpu)?)
        .pos_weight(&pw);
    let names: Vec<String> = bce.named_buffers().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["weight", "pos_weight"]);
    bce.to_device(dev)?;
    let x = Tensor::new([[0.3f32, -1.2]], dev)?;
    let t = Tensor::new([[1.0f32, 0.0]], dev)?;
    let got = bce.forward(&x, &t)?.item::<f64>()?;
    let softplus = |v: f64| (1.0 + v.exp()).ln();
    // w · [(1 - y)·x + (1 + (p - 1)·y)·softplus(-x)], averaged
    let want = (1.0 * (2.0 * softplus(-0.3)) + 3.0 * (-1.2 + softplus(1.2))) / 2.0;
    assert!((got - want).abs() < 1e-6, "{got} vs {want}");
    for m in [
        bce.weight.as_ref().unwrap(),
        bce.pos_weight.as_ref().unwrap(),
    ] {
        assert_eq!((m.device(), m.dtype()), (*dev, DType::F32));
    }

    let mut mm = nn::MultiMarginLoss::new()
        .p(2)
        .weight(&Tensor::new([1.0f32, 2.0], &cpu)?);
    mm.to_device(dev)?;
    mm.to_dtype(DType::F64)?;
    let got = mm.forward(
        &Tensor::new([[0.2f64, 0.5]], dev)?,
        &Tensor::new([0i64], dev)?,
    )?;
    // (1 - 0.2 + 0.5)² · weight[0] / 2 classes
    assert!((got.item::<f64>()? - 1.3f64.powi(2) / 2.0).abs() < 1e-12);

    let mut mse = nn::MSELoss::new();
    assert!(mse.named_buffers().is_empty());
    mse.to_device(dev)?;
    mse.to_dtype(DType::F16)?;
    let mut trip = nn::TripletMarginLoss::new();
    trip.to_device(dev)?;
    assert!(trip.to_dtype(DType::Bool).is_err());
    Ok(())
}

/// Each module starts from PyTorch's defaults.
#[test]
fn loss_modules_start_from_pytorchs_defaults() {
    let ce = nn::CrossEntropyLoss::new();
    assert_eq!(
        (ce.ignore_index, ce.reduction, ce.label_smoothing),
        (-100, Reduction::Mean, 0.0)
    );
    assert!(ce.weight.is_none());
    assert_eq!(nn::NLLLoss::new().ignore_index, -100);
    assert_eq!(nn::SmoothL1Loss::new().beta, 1.0);
    assert_eq!(nn::HuberLoss::new().delta, 1.0);
    let kl = nn::KLDivLoss::new();
    assert!(!kl.batchmean && !kl.log_target && kl.reduction == Reduction::Mean);
    assert!(!kl.batchmean().reduction(Reduction::Sum).batchmean);
    assert_eq!(nn::MarginRankingLoss::new().margin, 0.0);
    assert_eq!(nn::HingeEmbeddingLoss::new().margin, 1.0);
    assert_eq!(nn::CosineEmbeddingLoss::new().margin, 0.0);
    let t = nn::TripletMarginLoss::new();
    assert_eq!((t.margin, t.p, t.eps, t.swap), (1.0, 2.0, 1e-6, false));
    let p = nn::PoissonNLLLoss::new();
    assert_eq!((p.log_input, p.full, p.eps), (true, false, 1e-8));
    let g = nn::GaussianNLLLoss::new();
    assert_eq!((g.full, g.eps), (false, 1e-6));
    let m = nn::MultiMarginLoss::new();
    assert_eq!((m.p, m.margin), (1, 1.0));
    assert_eq!(nn::SoftMarginLoss::new().reduction, Reduction::Mean);
    assert_eq!(nn::MultiLabelMarginLoss::new().reduction, Reduction::Mean);
    assert!(nn::MultiLabelSoftMarginLoss::new().weight.is_none());
    assert!(nn::BCELoss::new().weight.is_none());
    assert_eq!(nn::L1Loss::new().reduction, Reduction::Mean);
}

/// A class index out of range on a GPU is found where the indices are and
/// reported at the next wait (ember's index checks do not stop the host), as
/// an error, not a wrong loss.
fn margin_targets_out_of_range_are_reported(dev: &Device) -> Result<()> {
    let x = Tensor::randn([3, 4], dev)?;
    let bad = Tensor::new([0i64, 4, 1], dev)?;
    let r =
        F::multi_margin_loss(&x, &bad, 1, 1.0, None, Reduction::Mean).and_then(|l| l.item::<f32>());
    assert!(r.is_err(), "{r:?}");
    let bad = Tensor::from_vec(vec![0i64, -2, 1, -1, 1, 2, 3, 0, 1, 2, 3, 9], [3, 4], dev)?;
    let r = F::multilabel_margin_loss(&x, &bad, Reduction::Sum).and_then(|l| l.item::<f32>());
    assert!(r.is_err(), "{r:?}");
    Ok(())
}

/// Integer operands as PyTorch 2.15 takes them: margin ranking, cosine
/// embedding and the Poisson and Gaussian losses of int64 inputs (beside
/// float32 ones) give float32; the hinge loss of an int64 input keeps int64 (its margin
/// truncated, as PyTorch fills it) and refuses a mean; the soft margin loss
/// takes an int64 target.
#[test]
fn losses2_keep_pytorchs_dtypes_for_integers() -> Result<()> {
    let dev = Device::Cpu;
    let i = Tensor::new([1i64, 3, -2, 0], &dev)?;
    let y = Tensor::new([1i64, -1, -1, 1], &dev)?;
    let (none, sum) = (Reduction::None, Reduction::Sum);
    let l = F::margin_ranking_loss(&i, &i.flip([0])?, &y, 0.5, none)?;
    assert_eq!(l.dtype(), DType::F32);
    // max(0, -y·(x1 - x2) + 0.5) with x2 = [0, -2, 3, 1]
    assert_eq!(l.to_vec::<f32>()?, [0.0, 5.5, 0.0, 1.5]);
    let h = F::hinge_embedding_loss(&i, &y, 1.5, none)?;
    assert_eq!(h.dtype(), DType::I64);
    // x where y = 1, max(0, 1 - x) where y = -1 (1.5 truncated to 1)
    assert_eq!(h.to_vec::<i64>()?, [1, 0, 3, 0]);
    assert_eq!(F::hinge_embedding_loss(&i, &y, 1.0, sum)?.item::<i64>()?, 4);
    assert!(F::hinge_embedding_loss(&i, &y, 1.0, Reduction::Mean).is_err());
    let m = i.reshape([2, 2])?;
    let c = F::cosine_embedding_loss(&m, &m, &Tensor::new([1i64, -1], &dev)?, 0.0, none)?;
    assert_eq!(c.dtype(), DType::F32);
    let x = Tensor::new([0.5f64, -1.0, 2.0, 0.0], &dev)?;
    let s = F::soft_margin_loss(&x, &y, none)?;
    assert_eq!(s.dtype(), DType::F64);
    let p = F::poisson_nll_loss(&i, &x.to_dtype(DType::F32)?, true, false, 1e-8, none)?;
    assert_eq!(p.dtype(), DType::F32);
    let var = Tensor::ones([4], DType::F32, &dev)?;
    let g = F::gaussian_nll_loss(&i, &i, &var, false, 1e-6, none)?;
    assert_eq!((g.dtype(), g.to_vec::<f32>()?), (DType::F32, vec![0.0; 4]));
    Ok(())
}

/// The losses on PyTorch's autocast float32 lists run in float32 under
/// autocast; the Gaussian and multi-label soft margin losses, Python
/// composites in PyTorch, keep bfloat16 under the CPU's.
#[test]
fn losses2_under_cpu_autocast() -> Result<()> {
    let dev = Device::Cpu;
    let h = |s: &[usize]| -> Result<Tensor> { Tensor::randn(s, &dev)?.to_dtype(DType::BF16) };
    let (a, b, y) = (
        h(&[3, 4])?,
        h(&[3, 4])?,
        Tensor::ones([3, 4], DType::BF16, &dev)?,
    );
    let red = Reduction::Mean;
    ember::autocast(DType::BF16, || -> Result<()> {
        let f32s = [
            F::margin_ranking_loss(&a, &b, &y, 0.0, red)?,
            F::hinge_embedding_loss(&a, &y, 1.0, red)?,
            F::soft_margin_loss(&a, &y, red)?,
            F::cosine_embedding_loss(&a, &b, &y.select(1, 0)?, 0.0, red)?,
            F::triplet_margin_loss(&a, &b, &y, 1.0, 2.0, 1e-6, false, red)?,
            F::poisson_nll_loss(&a, &y, true, false, 1e-8, red)?,
            F::multi_margin_loss(&a, &Tensor::new([0i64, 1, 2], &dev)?, 1, 1.0, None, red)?,
        ];
        for l in f32s {
            assert_eq!(l.dtype(), DType::F32);
        }
        assert_eq!(
            F::gaussian_nll_loss(&a, &b, &y, false, 1e-6, red)?.dtype(),
            DType::BF16
        );
        assert_eq!(
            F::multilabel_soft_margin_loss(&a, &y, None, red)?.dtype(),
            DType::BF16
        );
        Ok(())
    })??;
    Ok(())
}

device_test!(
    losses2_match_pytorch,
    losses2_take_half_inputs,
    losses2_refuse_as_pytorch,
    loss_modules_move_their_tensors,
    margin_targets_out_of_range_are_reported,
);
