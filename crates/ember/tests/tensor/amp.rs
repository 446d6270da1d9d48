//! Mixed precision against PyTorch's CPU autocast (tests/golden/amp_cases.json, made
//! by tests/golden/gen_amp.py): the dtype each op gives inside autocast, a small
//! MLP's and CNN's outputs and gradients in bfloat16, and GradScaler's scale over a
//! scripted run with infinities; on `cuda:0` too, with CUDA's own float32 list.

use super::assert_close;
use ember::amp::{autocast_guard_for, DeviceType, GradScaler};
use ember::nn::functional::{interpolate, InterpolateMode, InterpolateOptions};
use ember::nn::{self, Module};
use ember::optim::{Adam, Optimizer, Sgd};
use ember::prelude::*;
use ember::PadMode;
use serde_json::Value;

fn cases() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/amp_cases.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("amp_cases.json"))
        .expect("valid JSON")
}

fn dtype_named(s: &str) -> DType {
    match s {
        "float32" => DType::F32,
        "float64" => DType::F64,
        "bfloat16" => DType::BF16,
        "float16" => DType::F16,
        "int64" => DType::I64,
        other => panic!("dtype {other}"),
    }
}

fn tensor(v: &Value, dev: &Device) -> Result<Tensor> {
    let shape: Vec<usize> = v["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect();
    Tensor::from_vec(numbers(&v["values"]), shape, dev)?
        .to_dtype(dtype_named(v["dtype"].as_str().unwrap()))
}

/// A JSON list of numbers.
fn numbers(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// A JSON list of numbers written as text ("inf" and "nan" included).
fn numbers_in_text(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().parse().unwrap())
        .collect()
}

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap()
}

fn device_type(dev: &Device) -> DeviceType {
    // (meta follows CUDA's autocast)
    if dev.is_cuda() || *dev == Device::Meta {
        DeviceType::Cuda
    } else {
        DeviceType::Cpu
    }
}

/// PyTorch's CPU autocast runs these in float32 where its CUDA autocast keeps
/// the input's dtype.
const CPU_ONLY_F32: &[&str] = &[
    "pad_reflect_bf16",
    "pad_replicate_bf16",
    "interpolate_area3d_bf16",
];

/// PyTorch's CUDA autocast runs these in float32 where its CPU autocast keeps the
/// input's dtype (`softmax`, `log_softmax` and `sum` with a lower-precision input
/// give float32; `layer_norm`, `rms_norm` and `exp` are on its float32 list).
const CUDA_IN_F32: &[&str] = &[
    "softmax_bf16",
    "log_softmax_bf16",
    "layer_norm_bf16",
    "rms_norm_bf16",
    "sum_bf16",
    "exp_bf16",
    "pow_bf16",
    "pow_tensor_bf16",
    "cumsum_bf16",
    "cumprod_bf16",
    "logsumexp_bf16",
    "vector_norm_bf16",
    "reciprocal_bf16",
    "rsqrt_bf16",
    "rdiv_bf16",
    "log10_bf16",
    "cosine_similarity_bf16",
    "group_norm_bf16",
    "interpolate_nearest_bf16",
    "interpolate_bilinear_bf16",
];

pub(crate) fn dtypes_follow_pytorchs_lists(dev: &Device) -> Result<()> {
    let _rng = super::rng_lock();
    let all = cases();
    let mut checked = 0;
    for c in all["dtypes"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        let ins: Vec<DType> = c["inputs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| dtype_named(d.as_str().unwrap()))
            .collect();
        // inputs of the case's dtypes; values that every op accepts
        let make = |shape: &[usize], dt: DType| -> Result<Tensor> {
            Tensor::rand(shape.to_vec(), dev)?.to_dtype(dt)
        };
        let [a, b, c3] = [
            ins[0],
            *ins.get(1).unwrap_or(&DType::F32),
            *ins.get(2).unwrap_or(&DType::F32),
        ];
        let _ac = autocast_guard_for(device_type(dev), Some(DType::BF16))?;
        let out = match name {
            "matmul" | "matmul_f64" => make(&[3, 4], a)?.matmul(&make(&[4, 5], b)?)?,
            "bmm" => make(&[2, 3, 4], a)?.bmm(&make(&[2, 4, 5], b)?)?,
            "linear" => {
                let lin = nn::Linear::from_weights(&make(&[5, 4], b)?, Some(&make(&[5], c3)?))?;
                lin.forward(&make(&[3, 4], a)?)?
            }
            "conv2d" => make(&[1, 2, 5, 5], a)?.conv2d(
                &make(&[3, 2, 3, 3], b)?,
                Some(&make(&[3], c3)?),
                Conv2dOptions::default(),
            )?,
            "sdpa" => {
                let q = make(&[1, 2, 3, 4], a)?;
                nn::functional::scaled_dot_product_attention(&q, &q, &q, None, 0.0, false, None)?
            }
            "softmax_f32" | "softmax_bf16" => make(&[3, 4], a)?.softmax(-1)?,
            "log_softmax_bf16" => make(&[3, 4], a)?.log_softmax(-1)?,
            "layer_norm_bf16" => nn::functional::layer_norm(
                &make(&[3, 4], a)?,
                &[4],
                Some(&make(&[4], b)?),
                Some(&make(&[4], c3)?),
                1e-5,
            )?,
            "rms_norm_bf16" => {
                nn::functional::rms_norm(&make(&[3, 4], a)?, &[4], Some(&make(&[4], b)?), None)?
            }
            "cross_entropy_bf16" | "nll_loss_bf16" => {
                let t = Tensor::new(vec![0i64, 3, 1], dev)?;
                let x = make(&[3, 4], a)?;
                if name == "nll_loss_bf16" {
                    nn::nll_loss(&x, &t, nn::Reduction::Mean)?
                } else {
                    nn::cross_entropy(&x, &t)?
                }
            }
            "mse_loss_bf16" => {
                nn::mse_loss(&make(&[3, 4], a)?, &make(&[3, 4], b)?, nn::Reduction::Mean)?
            }
            "bce_with_logits_bf16" => {
                nn::bce_with_logits(&make(&[3, 4], a)?, &make(&[3, 4], b)?, nn::Reduction::Mean)?
            }
            "add_bf16_f32" => make(&[3, 4], a)?.add(&make(&[3, 4], b)?)?,
            "relu_bf16" | "relu_f32" => make(&[3, 4], a)?.relu()?,
            "sum_bf16" => make(&[3, 4], a)?.sum_all()?,
            "exp_bf16" => make(&[3, 4], a)?.exp()?,
            "max_pool2d_bf16" => make(&[1, 2, 4, 4], a)?.max_pool2d(Pool2dOptions::new(2))?,
            "pow_bf16" => make(&[3, 4], a)?.pow(2.0)?,
            "pow_tensor_bf16" => make(&[3, 4], a)?.pow(&make(&[3, 4], b)?)?,
            "cumsum_bf16" => make(&[3, 4], a)?.cumsum(1)?,
            "cumprod_bf16" => make(&[3, 4], a)?.cumprod(1)?,
            "prod_bf16" => make(&[3, 4], a)?.prod(1, false)?,
            "logsumexp_bf16" => make(&[3, 4], a)?.logsumexp(1, false)?,
            "vector_norm_bf16" => make(&[3, 4], a)?.vector_norm(2.0, Vec::<i64>::new(), false)?,
            "pad_reflect_bf16" => make(&[1, 2, 4], a)?.pad(&[1, 1], PadMode::Reflect)?,
            "pad_replicate_bf16" => {
                make(&[1, 2, 4, 4], a)?.pad(&[1, 1, 1, 1], PadMode::Replicate)?
            }
            "pad_constant_bf16" => make(&[1, 2, 4], a)?.pad(&[1, 1], PadMode::Constant(0.0))?,
            "pad_circular_bf16" => make(&[1, 2, 4], a)?.pad(&[1, 1], PadMode::Circular)?,
            "pad_reflect3d_bf16" => {
                make(&[1, 2, 4, 4, 4], a)?.pad(&[1, 1, 1, 1, 1, 1], PadMode::Reflect)?
            }
            "reciprocal_bf16" => make(&[3, 4], a)?.recip()?,
            "rsqrt_bf16" => make(&[3, 4], a)?.rsqrt()?,
            "rdiv_bf16" => make(&[3, 4], a)?.rdiv(2.0)?,
            "l1_loss_bf16" => {
                nn::l1_loss(&make(&[3, 4], a)?, &make(&[3, 4], b)?, nn::Reduction::Mean)?
            }
            "smooth_l1_loss_bf16" => nn::smooth_l1_loss(
                &make(&[3, 4], a)?,
                &make(&[3, 4], b)?,
                nn::Reduction::Mean,
                1.0,
            )?,
            "huber_loss_bf16" => nn::huber_loss(
                &make(&[3, 4], a)?,
                &make(&[3, 4], b)?,
                nn::Reduction::Mean,
                1.0,
            )?,
            "kl_div_bf16" => nn::kl_div_batchmean(&make(&[3, 4], a)?, &make(&[3, 4], b)?, false)?,
            "binary_cross_entropy_bf16" => {
                let (x, y) = (make(&[3, 4], a)?, make(&[3, 4], b)?);
                let out = nn::binary_cross_entropy(&x, &y, None, nn::Reduction::Mean);
                if dev.is_cuda() || *dev == Device::Meta {
                    // unsafe to autocast: CUDA's autocast refuses it
                    let e = out.expect_err("binary_cross_entropy under CUDA autocast");
                    assert!(e.to_string().contains("bce_with_logits"), "{e}");
                    checked += 1;
                    continue;
                }
                out?
            }
            "log10_bf16" => make(&[3, 4], a)?.log10()?,
            "cosine_similarity_bf16" => {
                nn::functional::cosine_similarity(&make(&[3, 4], a)?, &make(&[3, 4], b)?, 1, 1e-8)?
            }
            "addcmul_bf16_f32" => {
                make(&[3, 4], a)?.addcmul(&make(&[3, 4], b)?, &make(&[3, 4], c3)?, 1.0)?
            }
            "addcdiv_bf16" => {
                make(&[3, 4], a)?.addcdiv(&make(&[3, 4], b)?, &make(&[3, 4], c3)?, 1.0)?
            }
            "group_norm_bf16" => nn::functional::group_norm(
                &make(&[2, 4, 3], a)?,
                2,
                Some(&make(&[4], b)?),
                Some(&make(&[4], c3)?),
                1e-5,
            )?,
            "instance_norm_bf16" => nn::functional::instance_norm(
                &make(&[2, 4, 3], a)?,
                Some(&make(&[4], b)?),
                Some(&make(&[4], c3)?),
                Default::default(),
            )?,
            "instance_norm_running_bf16" => {
                let (mean, var) = (make(&[4], b)?, make(&[4], c3)?);
                let opts = nn::functional::InstanceNormOptions {
                    running_mean: Some(&mean),
                    running_var: Some(&var),
                    ..Default::default()
                };
                let y = nn::functional::instance_norm(&make(&[2, 4, 3], a)?, None, None, opts)?;
                assert_eq!((mean.dtype(), var.dtype()), (DType::F32, DType::F32));
                y
            }
            "interpolate_nearest_bf16" => {
                interpolate(&make(&[1, 2, 4, 4], a)?, &InterpolateOptions::size([3, 5]))?
            }
            "interpolate_bilinear_bf16" => interpolate(
                &make(&[1, 2, 4, 4], a)?,
                &InterpolateOptions::size([3, 5]).mode(InterpolateMode::Bilinear),
            )?,
            "interpolate_area_bf16" => interpolate(
                &make(&[1, 2, 4, 4], a)?,
                &InterpolateOptions::size([3, 5]).mode(InterpolateMode::Area),
            )?,
            "interpolate_area3d_bf16" => interpolate(
                &make(&[1, 2, 4, 4, 4], a)?,
                &InterpolateOptions::size([3, 2, 3]).mode(InterpolateMode::Area),
            )?,
            other => panic!("no ember op for the case {other}"),
        };
        let mut want = dtype_named(c["out"].as_str().unwrap());
        // (meta follows CUDA's lists, as the estimates of a CUDA step need)
        let cuda_lists = dev.is_cuda() || *dev == Device::Meta;
        if cuda_lists && CUDA_IN_F32.contains(&name) {
            want = DType::F32;
        }
        if cuda_lists && CPU_ONLY_F32.contains(&name) {
            want = a;
        }
        assert_eq!(out.dtype(), want, "{name} on {dev}");
        checked += 1;
    }
    assert_eq!(checked, 52);
    Ok(())
}

/// The dtypes on `meta`, which takes CUDA autocast's lists.
#[test]
fn dtypes_follow_cudas_lists_on_meta() -> Result<()> {
    dtypes_follow_pytorchs_lists(&Device::Meta)
}

/// The golden model's parameters copied into ember's, by PyTorch's names.
fn load(model: &dyn Module, params: &Value, dev: &Device) -> Result<()> {
    let _ng = ember::no_grad_guard();
    let named = model.named_parameters();
    let want = params.as_array().unwrap();
    assert_eq!(named.len(), want.len());
    for ((n, p), w) in named.iter().zip(want) {
        assert_eq!(n, w[0].as_str().unwrap());
        p.copy_(&tensor(&w[1], dev)?)?;
    }
    Ok(())
}

pub(crate) fn models_match_pytorch_in_bf16(dev: &Device) -> Result<()> {
    let _rng = super::rng_lock();
    let all = cases();
    for case in all["models"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let model: Box<dyn Module> = match name {
            "mlp" => Box::new(
                nn::Sequential::new()
                    .add(nn::Linear::new(4, 8, dev)?)
                    .add(nn::ReLU)
                    .add(nn::Linear::new(8, 3, dev)?),
            ),
            "transformer" => {
                let opts = nn::TransformerOptions {
                    dim_feedforward: 16,
                    dropout: 0.0,
                    batch_first: true,
                    ..Default::default()
                };
                Box::new(
                    nn::Sequential::new()
                        .add(nn::TransformerEncoderLayer::new(8, 2, opts, dev)?)
                        .add(nn::Flatten::default())
                        .add(nn::Linear::new(32, 3, dev)?),
                )
            }
            _ => Box::new(
                nn::Sequential::new()
                    .add(nn::Conv2d::new(1, 4, 3, Conv2dOptions::default(), dev)?)
                    .add(nn::ReLU)
                    .add(nn::MaxPool2d(Pool2dOptions::new(2)))
                    .add(nn::Flatten::default())
                    .add(nn::Linear::new(36, 3, dev)?),
            ),
        };
        load(model.as_ref(), &case["params"], dev)?;
        let x = tensor(&case["x"], dev)?;
        let target: Vec<i64> = case["target"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_i64().unwrap())
            .collect();
        let target = Tensor::new(target, dev)?;
        let (out, loss) = {
            let _ac = autocast_guard_for(device_type(dev), Some(DType::BF16))?;
            let out = model.forward(&x)?;
            let loss = nn::cross_entropy(&out, &target)?;
            (out, loss)
        };
        loss.backward()?;
        assert_eq!(
            (out.dtype(), loss.dtype()),
            (DType::BF16, DType::F32),
            "{name}"
        );
        // bfloat16 keeps 8 bits: values agree to a few of its units in the last place
        assert_close(&vals(&out), &vals(&tensor(&case["out"], dev)?), 2e-2, 2e-2);
        assert_close(
            &vals(&loss),
            &vals(&tensor(&case["loss"], dev)?),
            1e-2,
            1e-3,
        );
        for ((n, p), g) in model
            .named_parameters()
            .iter()
            .zip(case["grads"].as_array().unwrap())
        {
            let got = p.grad().expect("a gradient");
            assert_eq!(
                got.dtype(),
                DType::F32,
                "{name}.{n}: master weights keep float32"
            );
            let want = tensor(&g[1], dev)?;
            let scale = vals(&want).iter().fold(0f64, |m, v| m.max(v.abs()));
            assert_close(&vals(&got), &vals(&want), 3e-2, 2e-2 * scale.max(1e-3));
        }
    }
    Ok(())
}

/// A scripted run of `case` (tests/golden/gen_amp.py's `scaler_case`) with `w`'s two
/// elements as `parts` (one tensor of both, or one per element, on any devices):
/// the scale after every update, which steps were taken, the final parameters and
/// the state dict must be PyTorch's.
fn run_scaler_case(case: &Value, parts: &[Tensor]) -> Result<GradScaler> {
    let o = &case["options"];
    let opt_f = |k: &str| o[k].as_f64().unwrap();
    let mut opt = Sgd::new(parts.to_vec(), 0.1)?;
    let mut scaler = GradScaler::with_options(
        opt_f("init_scale"),
        opt_f("growth_factor"),
        opt_f("backoff_factor"),
        o["growth_interval"].as_u64().unwrap(),
    )?;
    let unscale_only: Vec<u64> = case["unscale_only"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap())
        .collect();
    let (mut scales, mut stepped) = (vec![], vec![]);
    for (i, c) in case["grads"].as_array().unwrap().iter().enumerate() {
        let c = numbers_in_text(c);
        opt.zero_grad();
        // the loss is sum(w * c) whichever way w is split
        let mut loss: Option<Tensor> = None;
        let mut at = 0;
        for p in parts {
            let n = p.numel();
            let term = p
                .mul(&Tensor::new(c[at..at + n].to_vec(), &p.device())?)?
                .sum_all()?
                .to(&parts[0].device())?;
            at += n;
            loss = Some(match loss {
                None => term,
                Some(l) => l.add(&term)?,
            });
        }
        scaler.scale(&loss.unwrap())?.backward()?;
        if unscale_only.contains(&(i as u64)) {
            scaler.unscale_(&opt)?;
            stepped.push(false);
        } else {
            stepped.push(scaler.step(&mut opt)?);
        }
        scaler.update()?;
        scales.push(scaler.get_scale());
    }
    let want_stepped: Vec<bool> = case["stepped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_bool().unwrap())
        .collect();
    assert_eq!(scales, numbers(&case["scales"]), "scale after each update");
    assert_eq!(stepped, want_stepped, "steps taken");
    let mut w = vec![];
    for p in parts {
        w.extend(vals(p));
    }
    assert_close(&w, &numbers(&case["w"]), 1e-6, 1e-6);
    for (k, v) in scaler.state_dict() {
        assert_eq!(case["state"][&k].as_f64(), Some(v), "state_dict {k}");
    }
    Ok(scaler)
}

pub(crate) fn grad_scaler_matches_pytorch(dev: &Device) -> Result<()> {
    let all = cases();
    for name in ["scaler", "scaler_custom"] {
        let w = Tensor::new(vec![1f32, -2.], dev)?.requires_grad_(true)?;
        let scaler = run_scaler_case(&all[name], &[w])?;
        // a new scaler resumes from the state
        let mut again = GradScaler::new();
        again.load_state_dict(&scaler.state_dict())?;
        assert_eq!(again.state_dict(), scaler.state_dict());
    }
    Ok(())
}

/// Gradients on two devices under one scaler (PyTorch keeps a flag per device and
/// gathers them in `update`): `w`'s first element on the CPU, its second (which
/// holds the scripted infinities) on `cuda:0`; the run must be the one-device run.
#[test]
fn grad_scaler_gathers_flags_from_two_devices() -> Result<()> {
    let Some(gpu) = super::gpu("amp::grad_scaler_gathers_flags_from_two_devices") else {
        return Ok(());
    };
    let all = cases();
    for name in ["scaler", "scaler_custom"] {
        for devs in [[Device::Cpu, gpu], [gpu, Device::Cpu]] {
            let parts = [
                Tensor::new(vec![1f32], &devs[0])?.requires_grad_(true)?,
                Tensor::new(vec![-2f32], &devs[1])?.requires_grad_(true)?,
            ];
            run_scaler_case(&all[name], &parts)?;
        }
    }
    Ok(())
}

/// One scaler for two optimizers (PyTorch's per-optimizer state): each skips its
/// own bad step, the scale backs off after either, and the unscale/step order is
/// free.
pub(crate) fn grad_scaler_serves_two_optimizers(dev: &Device) -> Result<()> {
    let all = cases();
    let s = &all["scaler_two_optimizers"];
    let w1 = Tensor::new(vec![1f32, -2.], dev)?.requires_grad_(true)?;
    let w2 = Tensor::new(vec![0.5f32, 3.], dev)?.requires_grad_(true)?;
    let mut o1 = Sgd::new(vec![w1.clone()], 0.1)?;
    let mut o2 = Adam::new(vec![w2.clone()], 0.1)?;
    let mut scaler = GradScaler::with_options(4.0, 2.0, 0.5, 2)?;
    let (mut scales, mut stepped) = (vec![], vec![]);
    for cs in s["grads"].as_array().unwrap() {
        let (c1, c2) = (numbers_in_text(&cs[0]), numbers_in_text(&cs[1]));
        o1.zero_grad();
        o2.zero_grad();
        let loss = w1
            .mul(&Tensor::new(c1, dev)?)?
            .sum_all()?
            .add(&w2.mul(&Tensor::new(c2, dev)?)?.sum_all()?)?;
        scaler.scale(&loss)?.backward()?;
        scaler.unscale_(&o2)?;
        let s1 = scaler.step(&mut o1)?;
        let s2 = scaler.step(&mut o2)?;
        stepped.push(vec![s1, s2]);
        scaler.update()?;
        scales.push(scaler.get_scale());
    }
    assert_eq!(scales, numbers(&s["scales"]));
    let want: Vec<Vec<bool>> = s["stepped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            p.as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_bool().unwrap())
                .collect()
        })
        .collect();
    assert_eq!(stepped, want);
    for (w, k) in [(&w1, "w1"), (&w2, "w2")] {
        assert_close(&vals(w), &numbers(&s[k]), 1e-5, 1e-6);
    }
    // a second step of one optimizer before the update is still refused
    let loss = w1.sum_all()?.add(&w2.sum_all()?)?;
    scaler.scale(&loss)?.backward()?;
    scaler.step(&mut o1)?;
    let e = scaler.step(&mut o1).unwrap_err().to_string();
    assert!(e.contains("step() has already been called"), "{e}");
    scaler.step(&mut o2)?;
    scaler.update()?;
    // an optimizer moved between unscale_ and step is still the one unscaled:
    // its gradients are divided by the scale once
    let w = Tensor::new(vec![1f32, 2.], dev)?.requires_grad_(true)?;
    let o = Sgd::new(vec![w.clone()], 0.5)?;
    let mut scaler = GradScaler::with_options(8.0, 2.0, 0.5, 2)?;
    scaler
        .scale(&w.mul(&Tensor::new(vec![2f32, -4.], dev)?)?.sum_all()?)?
        .backward()?;
    scaler.unscale_(&o)?;
    let mut moved = Box::new(o);
    assert!(scaler.step(moved.as_mut())?);
    assert_eq!(vals(&w), [0.0, 4.0]);
    scaler.update()?;
    // two optimizers over the same parameter are two optimizers (PyTorch's
    // `id`): each steps once before the update
    let (mut a, mut b) = (
        Sgd::new(vec![w.clone()], 0.5)?,
        Sgd::new(vec![w.clone()], 0.5)?,
    );
    scaler.scale(&w.sum_all()?)?.backward()?;
    assert!(scaler.step(&mut a)?);
    assert!(scaler.step(&mut b)?);
    scaler.update()?;
    Ok(())
}

pub(crate) fn grad_scaler_refuses_like_pytorch(dev: &Device) -> Result<()> {
    let w = Tensor::new(vec![1f32, -2.], dev)?.requires_grad_(true)?;
    let mut opt = Sgd::new(vec![w.clone()], 0.1)?;
    let mut scaler = GradScaler::new();
    let msg = |r: Result<()>| r.unwrap_err().to_string();
    scaler.scale(&w.sum_all()?)?.backward()?;
    scaler.unscale_(&opt)?;
    assert!(msg(scaler.unscale_(&opt)).contains("unscale_() has already been called"));
    assert!(scaler.step(&mut opt)?);
    assert!(scaler
        .step(&mut opt)
        .unwrap_err()
        .to_string()
        .contains("step() has already been called"));
    assert!(msg(scaler.unscale_(&opt)).contains("unscale_() is being called after step()"));
    scaler.update()?;
    assert!(msg(scaler.update()).contains("No inf checks were recorded prior to update."));
    // float16 gradients: the master weights must be float32
    let h = Tensor::new(vec![1f32], dev)?
        .to_dtype(DType::F16)?
        .requires_grad_(true)?;
    let opt16 = Sgd::new(vec![h.clone()], 0.1)?;
    h.sum_all()?.backward()?;
    assert!(msg(scaler.unscale_(&opt16)).contains("Attempting to unscale FP16 gradients."));
    for (g, b) in [(1.0, 0.5), (2.0, 1.0), (f64::NAN, 0.5)] {
        let e = GradScaler::with_options(8.0, g, b, 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("must be"), "{e}");
    }
    // the scale is a float32: one past its range is refused, and growth that
    // would overflow it leaves it where it is (PyTorch's kernels)
    for s in [1e39, 1e-50] {
        let e = GradScaler::with_options(s, 2.0, 0.5, 1).unwrap_err();
        assert!(e.to_string().contains("finite in float32"), "{e}");
    }
    let top = 2f64.powi(127);
    let mut high = GradScaler::with_options(top, 2.0, 0.5, 1)?;
    let tiny = Tensor::new(vec![1e-30f32, 0.0], dev)?.requires_grad_(true)?;
    let opt0 = Sgd::new(vec![tiny.clone()], 0.0)?;
    high.scale(&tiny.sum_all()?)?.backward()?;
    high.unscale_(&opt0)?;
    high.update()?;
    assert_eq!(high.get_scale(), top);
    // disabled: everything passes through (bfloat16 or float32 training)
    let mut off = GradScaler::new().enabled(false);
    let loss = w.square()?.sum_all()?;
    assert_eq!(vals(&off.scale(&loss)?), vals(&loss));
    opt.zero_grad();
    off.scale(&loss)?.backward()?;
    let before = vals(&w);
    assert!(off.step(&mut opt)?);
    off.update()?;
    assert_ne!(vals(&w), before);
    assert_eq!(off.get_scale(), 1.0);
    Ok(())
}

/// The sequence layers under autocast: attention (also on its memory-saving
/// path, whose backward recomputes products outside autocast), a transformer
/// encoder layer and an LSTM run forward and backward, their parameters get
/// float32 gradients close to float32 training's, and the LSTM's products and
/// state stay in bfloat16.
pub(crate) fn sequence_layers_train_under_autocast(dev: &Device) -> Result<()> {
    use nn::functional::{with_attention_path, AttentionPath};
    let _g = super::rng_lock();
    ember::manual_seed(0);
    let opts = nn::TransformerOptions {
        dim_feedforward: 32,
        dropout: 0.0,
        batch_first: true,
        ..Default::default()
    };
    let layer = nn::TransformerEncoderLayer::new(16, 2, opts, dev)?;
    let lstm = nn::LSTM::new(16, 8, dev)?;
    let x = Tensor::randn([2, 5, 16], dev)?;
    let (r_layer, r_lstm) = (
        Tensor::randn([2, 5, 16], dev)?,
        Tensor::randn([2, 5, 8], dev)?,
    );
    let grads = |m: &dyn Module| -> Vec<Vec<f64>> {
        m.parameters()
            .iter()
            .map(|p| {
                let g = p.grad().expect("a gradient");
                assert_eq!(g.dtype(), DType::F32);
                vals(&g)
            })
            .collect()
    };
    // each parameter's gradient by its relative norm error against float32's:
    // bfloat16 products land near 1e-2, but with 10 rows a few ReLU inputs near
    // zero change sign in bfloat16 and move the first feed-forward layer's
    // gradients by up to ~8% (seen on the simulator's data); a wrong cast, a
    // missing gradient or a float16 overflow is off by the whole norm
    // (on the CPU's data every parameter is within 0.1-0.7%)
    let close = |got: &[Vec<f64>], want: &[Vec<f64>], what: &str| {
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(g.iter().all(|v| v.is_finite()), "{what}: {g:?}");
            let diff: f64 = g
                .iter()
                .zip(w)
                .map(|(a, b)| (a - b).powi(2))
                .sum::<f64>()
                .sqrt();
            let norm: f64 = w.iter().map(|b| b * b).sum::<f64>().sqrt();
            assert!(
                diff <= 0.15 * norm,
                "{what}: parameter {i}: relative error {} (norm {norm})",
                diff / norm
            );
        }
    };
    let run_layer = |amp: bool, path: AttentionPath| -> Result<Vec<Vec<f64>>> {
        layer.parameters().iter().for_each(|p| p.zero_grad());
        let loss = with_attention_path(path, || -> Result<Tensor> {
            let _ac = autocast_guard_for(device_type(dev), amp.then_some(DType::BF16))?;
            // a fixed random projection: the mean square of a layer-normed output
            // is nearly constant, and its gradients nearly nothing
            layer.forward(&x)?.mul(&r_layer)?.sum_all()
        })?;
        loss.backward()?;
        Ok(grads(&layer))
    };
    let want = run_layer(false, AttentionPath::Math)?;
    for path in [AttentionPath::Math, AttentionPath::MemoryEfficient] {
        close(
            &run_layer(true, path)?,
            &want,
            &format!("encoder layer, {path:?}"),
        );
    }
    let run_lstm = |amp: bool| -> Result<(DType, Vec<Vec<f64>>)> {
        lstm.parameters().iter().for_each(|p| p.zero_grad());
        let _ac = autocast_guard_for(device_type(dev), amp.then_some(DType::BF16))?;
        let (out, _) = lstm.forward_state(&x, None)?;
        let loss = out.to_dtype(DType::F32)?.mul(&r_lstm)?.sum_all()?;
        drop(_ac);
        loss.backward()?;
        Ok((out.dtype(), grads(&lstm)))
    };
    let (_, want) = run_lstm(false)?;
    let (dt, got) = run_lstm(true)?;
    assert_eq!(dt, DType::BF16, "the LSTM's output under autocast");
    close(&got, &want, "lstm");
    Ok(())
}

/// A region's cast cache serves a forward run without gradients (evaluation)
/// and the training forwards after it (PyTorch's fix for its issue 112583: a
/// cast cached under `no_grad` has no history and is made again), and two
/// forwards in one region each backpropagate through the shared casts: the
/// gradients add up to twice one step's, bit for bit.
pub(crate) fn autocast_cache_serves_evaluation_and_two_backwards(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    ember::manual_seed(0);
    let lin = nn::Linear::new(3, 2, dev)?;
    let x = Tensor::randn([4, 3], dev)?;
    let dt = DType::BF16;
    let loss = || -> Result<Tensor> { lin.forward(&x)?.to_dtype(DType::F32)?.sum_all() };
    let grads = || -> Vec<Vec<f64>> {
        lin.parameters()
            .iter()
            .map(|p| vals(&p.grad().expect("a gradient")))
            .collect()
    };
    let one = {
        let _ac = autocast_guard_for(device_type(dev), Some(dt))?;
        loss()?
    };
    one.backward()?;
    let once = grads();
    lin.parameters().iter().for_each(|p| p.zero_grad());
    {
        let _ac = autocast_guard_for(device_type(dev), Some(dt))?;
        let eval = ember::no_grad(loss)?;
        assert!(!eval.requires_grad());
        let first = loss()?;
        assert!(first.requires_grad(), "the evaluation's casts were reused");
        first.backward()?;
        assert_eq!(grads(), once, "one backward after an evaluation");
        loss()?.backward()?;
    }
    let twice: Vec<Vec<f64>> = once
        .iter()
        .map(|g| g.iter().map(|v| 2.0 * v).collect())
        .collect();
    assert_eq!(grads(), twice, "two backwards in one region");
    Ok(())
}

#[test]
fn autocast_to_an_integer_or_wide_dtype_is_an_error() {
    for dt in [DType::I64, DType::F64] {
        let e = ember::autocast(dt, || ()).unwrap_err().to_string();
        assert!(
            e.contains("autocast only supports bfloat16 and float16"),
            "{e}"
        );
    }
}

device_test!(
    dtypes_follow_pytorchs_lists,
    models_match_pytorch_in_bf16,
    grad_scaler_matches_pytorch,
    grad_scaler_refuses_like_pytorch,
    grad_scaler_serves_two_optimizers,
    sequence_layers_train_under_autocast,
    autocast_cache_serves_evaluation_and_two_backwards,
);

/// A disabled scaler's empty state is refused by an enabled one with
/// PyTorch's reason.
#[test]
fn an_empty_scaler_state_says_why() {
    let empty = GradScaler::new().enabled(false).state_dict();
    let e = GradScaler::new()
        .load_state_dict(&empty)
        .unwrap_err()
        .to_string();
    assert!(e.contains("disabled instance of GradScaler"), "{e}");
}

/// The recurrent layers' output dtypes under autocast, as PyTorch 2.15 gives
/// them: CPU autocast lowers LSTM only (GRU and the cells stay float32), CUDA's
/// (and so meta's) lowers them all.
#[test]
fn recurrent_layers_follow_each_devices_list() -> Result<()> {
    for (dev, gru, cells) in [
        (Device::Cpu, DType::F32, DType::F32),
        (Device::Meta, DType::BF16, DType::BF16),
    ] {
        let x = Tensor::zeros([2, 5, 3], DType::F32, &dev)?;
        let _ac = autocast_guard_for(device_type(&dev), Some(DType::BF16))?;
        let lstm = nn::LSTM::new(3, 4, &dev)?.forward(&x)?;
        assert_eq!(lstm.dtype(), DType::BF16, "LSTM on {dev}");
        assert_eq!(
            nn::GRU::new(3, 4, &dev)?.forward(&x)?.dtype(),
            gru,
            "GRU on {dev}"
        );
        let step = x.select(1, 0)?;
        let lc = nn::LSTMCell::new(3, 4, &dev)?.forward(&step)?;
        let gc = nn::GRUCell::new(3, 4, &dev)?.forward(&step)?;
        assert_eq!((lc.dtype(), gc.dtype()), (cells, cells), "cells on {dev}");
    }
    // on the CPU a float32 GRU still multiplies in bfloat16 (PyTorch's linear
    // layers inside it are on the list): near float32's answer, not equal
    let _g = super::rng_lock();
    ember::manual_seed(0);
    let gru = nn::GRU::new(3, 4, &Device::Cpu)?;
    let x = Tensor::randn([2, 5, 3], &Device::Cpu)?;
    let exact = vals(&gru.forward(&x)?);
    let _ac = autocast_guard_for(DeviceType::Cpu, Some(DType::BF16))?;
    let low = vals(&gru.forward(&x)?);
    let worst = exact
        .iter()
        .zip(&low)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    assert!(worst > 1e-5 && worst < 5e-2, "{worst}");
    Ok(())
}
