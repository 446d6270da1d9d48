//! nn, losses and optimizers against PyTorch (tests/golden/nn_cases.json, made by
//! tests/golden/gen_nn.py), and the Iris lesson trained to PyTorch's loss curve.

use super::{assert_close, synced, vals};
use ember::nn::{self, Module, Reduction};
use ember::optim::{Adam, Optimizer, Sgd};
use ember::prelude::*;
use serde_json::Value;

// the layers added with `layers2`'s golden cases (Upsample, ConvTranspose2d, ...)
mod layers2;
// the activations, Unflatten, channel dropout and padding modules of `layers3`
mod layers3;
// EmbeddingBag against `embedding_bag`'s golden cases
mod bags;
// pixel and channel shuffle, 1-D and adaptive pooling, unpooling, unfold and
// fold (`layers4`'s golden cases)
mod layers4;
// nn::RNN and nn::RNNCell against `rnn`'s golden cases
mod rnn;
// TransformerDecoder and the full Transformer (`transformer2`'s golden cases)
mod transformer2;
// pad_sequence and unpad_sequence (`rnn_utils`'s golden cases)
mod rnn_utils;
// the losses of loss_more.rs, F.normalize and the loss modules (`losses2`'s
// golden cases)
mod losses2;
// NAdam, RAdam, Adamax, Adadelta and the further schedules (`optimizers2`
// and `schedulers2`'s golden cases)
mod optim2;

fn cases() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/nn_cases.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("nn_cases.json"))
        .expect("valid JSON")
}

fn tensor(v: &Value, dev: &Device) -> Result<Tensor> {
    let shape: Vec<usize> = v["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect();
    let values: Vec<f64> = v["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| match x.as_str() {
            Some("-inf") => f64::NEG_INFINITY,
            _ => x.as_f64().unwrap(),
        })
        .collect();
    Tensor::from_vec(values, shape, dev)
}

/// Asserts that `got` matches PyTorch's recorded `want`: the same shape, and
/// each value equal or within `atol + rtol·|want|` (in float64), `what`
/// named in a failure.
fn assert_matches(what: &str, got: &Tensor, want: &Value, (rtol, atol): (f64, f64)) -> Result<()> {
    let want = tensor(want, &Device::Cpu)?;
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let (g, w) = (
        got.to_dtype(DType::F64)?.to_vec::<f64>()?,
        want.to_vec::<f64>()?,
    );
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!(
            a == b || (a - b).abs() <= atol + rtol * b.abs(),
            "{what} [{i}]: {a} vs {b}"
        );
    }
    Ok(())
}

fn reduction(v: &Value) -> Reduction {
    match v["reduction"].as_str() {
        Some("sum") => Reduction::Sum,
        Some("none") => Reduction::None,
        _ => Reduction::Mean,
    }
}

fn losses_match_pytorch(dev: &Device) -> Result<()> {
    for case in cases()["losses"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let inputs: Vec<Tensor> = case["inputs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| tensor(t, dev).and_then(|t| t.requires_grad_(true)))
            .collect::<Result<_>>()?;
        let extra = &case["extra"];
        let target = || -> Result<Tensor> {
            let t: Vec<i64> = extra["target"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_i64().unwrap())
                .collect();
            Tensor::new(t, dev)
        };
        let out = match name {
            n if n.starts_with("cross_entropy") => nn::cross_entropy_with(
                &inputs[0],
                &target()?,
                reduction(extra),
                extra["label_smoothing"].as_f64().unwrap(),
            )?,
            "nll" => nn::nll_loss(&inputs[0].log_softmax(-1)?, &target()?, reduction(extra))?,
            n if n.starts_with("mse") => nn::mse_loss(&inputs[0], &inputs[1], reduction(extra))?,
            "bce_with_logits" => nn::bce_with_logits(&inputs[0], &inputs[1], reduction(extra))?,
            other => panic!("unknown loss case {other}"),
        };
        let want = tensor(&case["value"], dev)?;
        assert_eq!(out.shape(), want.shape(), "{name}");
        assert_close(&vals(&out), &vals(&want), 1e-10, 1e-12);
        if out.rank() == 0 {
            out.backward()?;
        } else {
            let w = Tensor::linspace(-1.0, 1.3, out.numel(), DType::F64, dev)?;
            out.backward_with(&w)?;
        }
        for (i, g) in case["grads"].as_array().unwrap().iter().enumerate() {
            let got = inputs[i].grad().expect("gradient");
            assert_close(&vals(&got), &vals(&tensor(g, dev)?), 1e-9, 1e-12);
        }
    }
    Ok(())
}

/// Every optimizer follows PyTorch's trajectory; Adam and AdamW also in their
/// capturable form (PyTorch's `capturable=True`: the step count and bias
/// corrections on the device). A second parameter has no gradient at the first
/// two steps: its step count, and so its bias corrections (Adam) or decayed rate
/// (Adagrad), starts at its own first step, as PyTorch's per-parameter `step`.
fn optimizers_match_pytorch(dev: &Device) -> Result<()> {
    let all = cases()["optimizers"].as_array().unwrap().clone();
    let adams = all
        .iter()
        .filter(|c| c["name"].as_str().unwrap().starts_with("adam"))
        .map(|c| (c, true));
    for (case, capturable) in all.iter().map(|c| (c, false)).chain(adams) {
        let name = case["name"].as_str().unwrap();
        let cfg = &case["config"];
        let f = |k: &str, d: f64| cfg[k].as_f64().unwrap_or(d);
        let init: Vec<f64> = case["init"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        let w = Tensor::new(init, dev)?.requires_grad_(true)?;
        let late: Vec<f64> = case["late_init"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        let late = Tensor::new(late, dev)?.requires_grad_(true)?;
        let params = vec![w.clone(), late.clone()];
        let flag = |k: &str| cfg[k].as_bool().unwrap_or(false);
        let maximize = flag("maximize");
        let mut opt: Box<dyn Optimizer> = match name {
            n if n.starts_with("sgd") => Box::new(
                Sgd::new(params, f("lr", 0.0))?
                    .momentum(f("momentum", 0.0))?
                    .dampening(f("dampening", 0.0))?
                    .weight_decay(f("weight_decay", 0.0))?
                    .nesterov(flag("nesterov"))?
                    .maximize(maximize),
            ),
            n if n.starts_with("rmsprop") => Box::new(
                ember::optim::RmsProp::new(params, f("lr", 0.0))?
                    .alpha(f("alpha", 0.99))?
                    .eps(f("eps", 1e-8))?
                    .weight_decay(f("weight_decay", 0.0))?
                    .momentum(f("momentum", 0.0))?
                    .centered(flag("centered"))
                    .maximize(maximize),
            ),
            n if n.starts_with("adagrad") => Box::new(
                ember::optim::Adagrad::new(params, f("lr", 0.0))?
                    .lr_decay(f("lr_decay", 0.0))?
                    .weight_decay(f("weight_decay", 0.0))?
                    .initial_accumulator_value(f("initial_accumulator_value", 0.0))?
                    .eps(f("eps", 1e-10))?
                    .maximize(maximize),
            ),
            n => {
                assert!(n.starts_with("adam"), "{n}");
                let b = cfg["betas"]
                    .as_array()
                    .map(|b| (b[0].as_f64().unwrap(), b[1].as_f64().unwrap()));
                let (b1, b2) = b.unwrap_or((0.9, 0.999));
                let lr = f("lr", 0.0);
                let base = if n.starts_with("adamw") {
                    Adam::adamw(params, lr)?
                } else {
                    Adam::new(params, lr)?
                };
                // AdamW's default decay is 0.01: set only where the case sets it
                let base = match cfg["weight_decay"].as_f64() {
                    Some(wd) => base.weight_decay(wd)?,
                    None => base,
                };
                Box::new(
                    base.betas(b1, b2)?
                        .eps(f("eps", 1e-8))?
                        .amsgrad(flag("amsgrad"))
                        .maximize(maximize),
                )
            }
        };
        if capturable {
            assert!(opt.make_capturable()?, "{name}");
        }
        let name = format!("{name}{}", if capturable { " (capturable)" } else { "" });
        let c = Tensor::new([1f64, 2., -1., 0.5], dev)?;
        let c_late = Tensor::new([-1f64, 0.5], dev)?;
        let wants = case["trajectory"]
            .as_array()
            .unwrap()
            .iter()
            .zip(case["late_trajectory"].as_array().unwrap());
        for (step, (want, want_late)) in wants.enumerate() {
            opt.zero_grad();
            let mut loss = w
                .pow(4.0)?
                .sum_all()?
                .mul(0.1)?
                .add(&w.mul(&c)?.sum_all()?)?;
            if step >= 2 {
                let l = late.pow(4.0)?.sum_all()?.mul(0.2)?;
                loss = loss.add(&l)?.add(&late.mul(&c_late)?.sum_all()?)?;
            }
            loss.backward()?;
            opt.step()?;
            for (t, want) in [(&w, want), (&late, want_late)] {
                let want: Vec<f64> = want
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap())
                    .collect();
                let got = vals(t);
                assert_eq!(got.len(), want.len());
                for (g, e) in got.iter().zip(&want) {
                    assert!(
                        (g - e).abs() <= 1e-12 + 1e-10 * e.abs(),
                        "{name} step {step}: got {got:?}, want {want:?}"
                    );
                }
            }
        }
    }
    Ok(())
}

fn iris_lesson_matches_pytorch(dev: &Device) -> Result<()> {
    let c = cases();
    let iris = &c["iris"];
    // the data shipped in data/, split as PyTorch split it
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../data/iris.csv"))
        .expect("iris.csv");
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    for line in text.lines().skip(1) {
        let cells: Vec<&str> = line.split(',').collect();
        xs.extend(cells[..4].iter().map(|v| v.parse::<f32>().unwrap()));
        ys.push(cells[4].parse::<i64>().unwrap());
    }
    let x = Tensor::from_vec(xs, [150, 4], dev)?;
    let y = Tensor::new(ys, dev)?;
    let perm: Vec<i64> = iris["perm"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    let (tr, te) = (
        Tensor::new(perm[..120].to_vec(), dev)?,
        Tensor::new(perm[120..].to_vec(), dev)?,
    );
    let (x_tr, y_tr) = (x.index_select(0, &tr)?, y.index_select(0, &tr)?);
    let (x_te, y_te) = (x.index_select(0, &te)?, y.index_select(0, &te)?);
    // PyTorch's initial weights
    let init = &iris["init"];
    let lin = |i: usize| -> Result<nn::Linear> {
        let w = tensor(&init[format!("{i}.weight")], dev)?.to_dtype(DType::F32)?;
        let b = tensor(&init[format!("{i}.bias")], dev)?.to_dtype(DType::F32)?;
        nn::Linear::from_weights(&w, Some(&b))
    };
    let model = nn::Sequential::new()
        .add(lin(0)?)
        .add(nn::ReLU)
        .add(lin(2)?)
        .add(nn::ReLU)
        .add(lin(4)?);
    let mut opt = Adam::new(model.parameters(), 0.01)?;
    let want: Vec<f64> = iris["losses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let mut got = Vec::new();
    for _ in 0..100 {
        let loss = nn::cross_entropy(&model.forward(&x_tr)?, &y_tr)?;
        got.push(loss.item::<f64>()?);
        opt.zero_grad();
        loss.backward()?;
        opt.step()?;
    }
    // float32 arithmetic in a different order: the curves agree to ~1e-4 relative
    assert_close(&got, &want, 2e-3, 1e-4);
    let acc = ember::no_grad(|| -> Result<f64> {
        let pred = model.forward(&x_te)?.argmax(1, false)?;
        pred.eq(&y_te)?
            .to_dtype(DType::F32)?
            .mean_all()?
            .item::<f64>()
    })?;
    let want = iris["test_accuracy"].as_f64().unwrap();
    if dev.is_cuda() {
        // cuBLAS sums in its own order: one of the 30 test flowers close to a
        // class boundary may go the other way
        assert!((acc - want).abs() <= 1.0 / 30.0 + 1e-9, "{acc} vs {want}");
    } else {
        assert_eq!(acc, want);
    }
    Ok(())
}

fn modules_and_errors(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    ember::manual_seed(5);
    let lin = nn::Linear::new(100, 50, dev)?;
    let w = vals(&lin.weight);
    let bound = 0.1;
    assert!(
        w.iter().all(|v| v.abs() <= bound),
        "weights within ±1/sqrt(in)"
    );
    let var = w.iter().map(|v| v * v).sum::<f64>() / w.len() as f64;
    assert!(
        (var - bound * bound / 3.0).abs() < 0.0008,
        "uniform variance {var}"
    );
    assert!(lin.weight.requires_grad() && lin.weight.is_leaf());
    let model = nn::Sequential::new()
        .add(lin)
        .add(nn::GELU)
        .add(nn::Dropout::new(0.5)?)
        .add(nn::Linear::with_bias(50, 2, false, dev)?);
    let names: Vec<String> = model
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, vec!["0.weight", "0.bias", "3.weight"]);
    assert_eq!(model.num_parameters(), 100 * 50 + 50 + 100);
    assert!(model.parameters().iter().all(|p| p.device() == *dev));
    let x = Tensor::randn([8, 100], dev)?;
    let mut model = model;
    model.eval();
    let a = model.forward(&x)?;
    assert_eq!(
        vals(&a),
        vals(&model.forward(&x)?),
        "eval mode is deterministic"
    );
    model.train();
    assert_ne!(
        vals(&model.forward(&x)?),
        vals(&a),
        "dropout is active in training"
    );
    // dropout keeps the expectation
    let d = nn::Dropout::new(0.3)?;
    let big = d.forward(&Tensor::ones([100_000], DType::F32, dev)?)?;
    assert!((big.mean_all()?.item::<f64>()? - 1.0).abs() < 0.02);
    assert!(nn::Dropout::new(1.5).is_err());
    assert!(
        model.forward(&Tensor::randn([8, 99], dev)?).is_err(),
        "wrong in_features"
    );
    assert_eq!(
        nn::Flatten::default()
            .forward(&Tensor::zeros([2, 3, 4], DType::F32, dev)?)?
            .shape(),
        &[2, 12]
    );
    // loss input errors
    let logits = Tensor::randn([4, 3], dev)?;
    assert!(
        nn::cross_entropy(&logits, &Tensor::new([0f32, 1., 2., 0.], dev)?).is_err(),
        "float targets"
    );
    assert!(
        nn::cross_entropy(&logits, &Tensor::new([0i64, 1, 2], dev)?).is_err(),
        "wrong batch size"
    );
    assert!(
        synced(nn::cross_entropy(
            &logits,
            &Tensor::new([0i64, 1, 3, 0], dev)?
        ))
        .is_err(),
        "class out of range"
    );
    assert!(nn::cross_entropy_with(
        &logits,
        &Tensor::new([0i64, 1, 2, 0], dev)?,
        Reduction::Mean,
        1.5
    )
    .is_err());
    assert!(nn::mse_loss(
        &logits,
        &Tensor::zeros([4], DType::F32, dev)?,
        Reduction::Mean
    )
    .is_err());
    assert!(
        Sgd::new(vec![], 0.1)?.nesterov(true)?.step().is_err(),
        "nesterov needs momentum"
    );
    Ok(())
}

/// A small CNN learns to tell two synthetic image classes apart: conv, pooling and
/// their gradients working together through the optimizer.
fn small_cnn_learns(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    ember::manual_seed(21);
    // class 0: a bright vertical bar, class 1: a bright horizontal bar, plus noise
    let n = 64;
    let noise = Tensor::randn([n, 1, 8, 8], dev)?.mul(0.3)?;
    let labels: Vec<i64> = (0..n as i64).map(|i| i % 2).collect();
    let mut bars = vec![0f32; n * 64];
    for (i, &l) in labels.iter().enumerate() {
        for j in 0..8 {
            let at = if l == 0 { j * 8 + 3 } else { 3 * 8 + j };
            bars[i * 64 + at] = 1.0;
        }
    }
    let x = Tensor::from_vec(bars, [n, 1, 8, 8], dev)?.add(&noise)?;
    let y = Tensor::new(labels, dev)?;
    let opts = Conv2dOptions::default().padding(1);
    let model = nn::Sequential::new()
        .add(nn::Conv2d::new(1, 4, 3, opts, dev)?)
        .add(nn::ReLU)
        .add(nn::MaxPool2d(Pool2dOptions::new(2)))
        .add(nn::AvgPool2d(Pool2dOptions::new(2)))
        .add(nn::Flatten::default())
        .add(nn::Linear::new(16, 2, dev)?);
    assert_eq!(model.num_parameters(), 4 * 9 + 4 + 16 * 2 + 2);
    let mut opt = Adam::new(model.parameters(), 0.05)?;
    let first = nn::cross_entropy(&model.forward(&x)?, &y)?.item::<f64>()?;
    let mut last = first;
    for _ in 0..60 {
        let loss = nn::cross_entropy(&model.forward(&x)?, &y)?;
        opt.zero_grad();
        loss.backward()?;
        opt.step()?;
        last = loss.item::<f64>()?;
    }
    assert!(last < 0.1 * first, "loss went from {first} to {last}");
    let acc = ember::no_grad(|| {
        let pred = model.forward(&x)?.argmax(1, false)?;
        pred.eq(&y)?.to_dtype(DType::F32)?.mean_all()?.item::<f64>()
    })?;
    assert_eq!(acc, 1.0);
    assert!(nn::Conv2d::new(3, 4, 3, Conv2dOptions::default().groups(2), dev).is_err());
    Ok(())
}

fn schedulers_match_pytorch(dev: &Device) -> Result<()> {
    use ember::optim::{
        Anneal, CosineAnnealingLr, Groups, LambdaLr, LinearLr, LrScheduler, OneCycleLr,
        OneCycleOptions, ReduceLrOnPlateau, SequentialLr, StepLr,
    };
    let cases = cases();
    let cases = cases["schedulers"].as_array().unwrap();
    assert!(cases.len() >= 10);
    let f64s = |v: &Value| -> Vec<f64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    };
    for case in cases {
        let name = case["name"].as_str().unwrap();
        // two parameter groups (lr 0.1 and 0.02), as the PyTorch optimizer has
        let p = || Tensor::zeros([1], DType::F32, dev);
        let mut opt = if name.contains("adam") {
            Groups::new(vec![
                Box::new(Adam::new(vec![p()?], 0.1)?),
                Box::new(Adam::new(vec![p()?], 0.02)?),
            ])?
        } else {
            Groups::new(vec![
                Box::new(Sgd::new(vec![p()?], 0.1)?.momentum(0.9)?),
                Box::new(Sgd::new(vec![p()?], 0.02)?.momentum(0.9)?),
            ])?
        };
        let close = |got: f64, want: f64, what: &str| {
            assert!((got - want).abs() < 1e-12, "{name} {what}: {got} vs {want}");
        };
        let close_all = |got: Vec<f64>, want: Vec<f64>, what: &str| {
            assert_eq!(got.len(), want.len(), "{name} {what}");
            for (g, w) in got.into_iter().zip(want) {
                close(g, w, what);
            }
        };
        let group_lrs = case["group_lrs"].as_array().unwrap();
        if name.starts_with("plateau") {
            let mut p = match name {
                "plateau" => {
                    let mut p = ReduceLrOnPlateau::new(0.5, 2)?;
                    p.cooldown = 1;
                    p
                }
                "plateau_threshold" => {
                    let mut p = ReduceLrOnPlateau::new(0.5, 1)?;
                    p.threshold = 0.1;
                    p
                }
                "plateau_max" => {
                    let mut p = ReduceLrOnPlateau::new(0.5, 1)?.maximize();
                    p.threshold = 0.05;
                    p
                }
                "plateau_max_rising" => {
                    // the mode set by its field, as a user may
                    let mut p = ReduceLrOnPlateau::new(0.5, 1)?;
                    p.maximize = true;
                    p.threshold = 0.05;
                    p
                }
                other => panic!("unknown plateau case {other}"),
            };
            let metrics = f64s(&case["metrics"]);
            assert_eq!(metrics.len(), group_lrs.len(), "{name}: a metric per step");
            assert!(!metrics.is_empty(), "{name}: no steps");
            for (k, (m, want)) in metrics.iter().zip(group_lrs).enumerate() {
                p.step_metric(&mut opt, *m);
                close_all(opt.group_lrs(), f64s(want), &format!("step {k}"));
            }
            continue;
        }
        let mut sched: Box<dyn LrScheduler> = match name {
            "step" => Box::new(StepLr::new(&opt, 3, 0.5)?),
            "cosine" => Box::new(CosineAnnealingLr::new(&opt, 10, 0.001)?),
            "linear_warmup" => Box::new(LinearLr::new(&mut opt, 0.1, 1.0, 4)?),
            "linear_decay" => Box::new(LinearLr::new(&mut opt, 1.0, 0.2, 5)?),
            "linear_none" => Box::new(LinearLr::new(&mut opt, 0.5, 1.0, 0)?),
            "lambda" => Box::new(LambdaLr::new(&mut opt, |e| 0.95f64.powi(e as i32))),
            "sequential" => {
                // built in the natural order: the warm-up sets the rates to a
                // quarter, and the cosine still starts from the initial rates
                // (PyTorch's `initial_lr`)
                let warm: Box<dyn LrScheduler> = Box::new(LinearLr::new(&mut opt, 0.25, 1.0, 3)?);
                let cos: Box<dyn LrScheduler> = Box::new(CosineAnnealingLr::new(&opt, 8, 0.001)?);
                Box::new(SequentialLr::new(&mut opt, vec![warm, cos], vec![3])?)
            }
            "warmup_cosine" => Box::new(SequentialLr::warmup_cosine(&mut opt, 3, 10, 0.001)?),
            "onecycle" => Box::new(OneCycleLr::with_options(
                &mut opt,
                0.5,
                12,
                OneCycleOptions {
                    cycle_momentum: false,
                    ..Default::default()
                },
            )?),
            "onecycle_momentum" => Box::new(OneCycleLr::new(&mut opt, 0.5, 12)?),
            "onecycle_adam_three_phase_linear" => Box::new(OneCycleLr::with_options(
                &mut opt,
                0.3,
                15,
                OneCycleOptions {
                    pct_start: 0.25,
                    anneal: Anneal::Linear,
                    three_phase: true,
                    base_momentum: 0.8,
                    max_momentum: 0.9,
                    div_factor: 10.0,
                    final_div_factor: 100.0,
                    ..Default::default()
                },
            )?),
            other => panic!("unknown schedule {other}"),
        };
        close_all(opt.group_lrs(), f64s(&case["initial_groups"]), "initial");
        close(
            opt.cycled_momentum().unwrap(),
            case["initial_momentum"].as_f64().unwrap(),
            "initial momentum",
        );
        let momenta = f64s(&case["momenta"]);
        for (k, want) in group_lrs.iter().enumerate() {
            sched.step(&mut opt);
            close_all(opt.group_lrs(), f64s(want), &format!("step {k}"));
            // the count a checkpoint records to resume the schedule
            assert_eq!(sched.epoch(), k + 1, "{name}: epoch after step {k}");
            assert_eq!(sched.last_lrs(), opt.group_lrs());
            assert_eq!(sched.last_lr(), opt.lr());
            close(
                opt.cycled_momentum().unwrap(),
                momenta[k],
                &format!("momentum at step {k}"),
            );
        }
    }
    assert!(StepLr::new(&Sgd::new(vec![], 0.1)?, 0, 0.5).is_err());
    let mut opt = Sgd::new(vec![], 0.1)?;
    assert!(LinearLr::new(&mut opt, 0.0, 1.0, 3).is_err());
    assert!(OneCycleLr::new(&mut opt, 0.1, 0).is_err());
    // Adagrad has no momentum to cycle (PyTorch's error), unless asked not to
    let mut ada = ember::optim::Adagrad::new(vec![], 0.1)?;
    let e = OneCycleLr::new(&mut ada, 0.1, 10).err().unwrap();
    assert!(
        e.to_string().contains("must support momentum or beta1"),
        "{e}"
    );
    let no_cycle = OneCycleOptions {
        cycle_momentum: false,
        ..Default::default()
    };
    OneCycleLr::with_options(&mut ada, 0.1, 10, no_cycle)?;
    // a momentum Adam cannot take as its first beta is refused before any step
    let mut adam = Adam::new(vec![], 0.1)?;
    let bad = OneCycleOptions {
        max_momentum: 1.0,
        ..Default::default()
    };
    assert!(OneCycleLr::with_options(&mut adam, 0.1, 10, bad).is_err());
    assert!(ReduceLrOnPlateau::new(1.5, 2).is_err());
    Ok(())
}

/// One of gen_nn.py's in-place programs on leaves `x` and `b` (float64 [3]).
fn inplace_program(name: &str, x: &Tensor, b: &Tensor) -> Result<Tensor> {
    let dev = &x.device();
    match name {
        "add" => {
            let h = x.mul(2.0)?;
            h.add_(b)?;
            h.mul(&h)?.sum_all()
        }
        "mul" => {
            let h = x.mul(2.0)?;
            h.mul_(b)?;
            h.sum_all()
        }
        "div" => {
            let h = x.mul(2.0)?;
            h.div_(b)?;
            h.sum_all()
        }
        "sub_chain" => {
            let h = x.mul(2.0)?;
            h.add_(b)?;
            h.mul_(3.0)?;
            h.sub_(x)?;
            h.mul(b)?.sum_all()
        }
        "scalar_ops" => {
            let h = x.mul(b)?;
            h.mul_(2.5)?;
            h.sub_(1)?;
            h.div_(4)?;
            h.mul(&h)?.sum_all()
        }
        "saved_output" => {
            let y = x.exp()?;
            y.add_(1)?;
            y.sum_all()
        }
        "saved_input" => {
            let h = x.mul(2.0)?;
            let z = h.mul(&h)?;
            h.add_(1)?;
            z.sum_all()
        }
        "unsaved_input" => {
            let h = x.mul(2.0)?;
            let z = h.sigmoid()?;
            h.add_(b)?;
            z.add(&h)?.sum_all()
        }
        "mul_self" => {
            let h = x.mul(2.0)?;
            h.mul_(&h)?;
            h.sum_all()
        }
        "leaf" => {
            x.add_(1)?;
            x.sum_all()
        }
        "buffer" => {
            let buf = Tensor::zeros([3], DType::F64, dev)?;
            buf.add_(x)?;
            buf.mul(b)?.sum_all()
        }
        "copy" => {
            let h = x.mul(2.0)?;
            h.copy_(b)?;
            h.mul(&h)?.sum_all()
        }
        "copy_broadcast" => {
            let h = x.mul(2.0)?;
            h.copy_(&b.narrow(0, 1, 1)?.detach().mul(0.0)?.add(&b.sum_all()?)?)?;
            h.mul(x)?.sum_all()
        }
        "detached_alias" => {
            let h = x.mul(2.0)?;
            let d = h.detach();
            let z = h.mul(&h)?;
            d.add_(1)?;
            z.sum_all()
        }
        "no_grad_update" => {
            let h = x.mul(2.0)?;
            ember::no_grad(|| h.add_(1))?;
            h.mul(b)?.sum_all()
        }
        "matmul_saved" => {
            let w = b.mul(1.0)?;
            let z = x.matmul(&w)?;
            w.add_(1)?;
            Ok(z)
        }
        "matmul_unsaved" => {
            let w = b.mul(1.0)?;
            let z = w.matmul(&x.detach())?;
            w.add_(1)?;
            z.add(&w.sum_all()?)
        }
        "dtype" => {
            let h = x.mul(2.0)?.to_dtype(DType::F32)?;
            h.add_(b)?;
            assert_eq!(h.dtype(), DType::F32);
            h.mul(&h)?.sum_all()
        }
        "int_target" => {
            let t = Tensor::new([1i64, 2, 3], dev)?;
            t.add_(b)?;
            t.sum_all()
        }
        "sum_then_modify" => {
            let h = x.mul(3.0)?;
            let s = h.sum_all()?;
            h.mul_(b)?;
            s.add(&h.sum_all()?)
        }
        "relu" => {
            let h = x.mul(b)?.sub(0.3)?;
            h.relu_()?;
            h.mul(&h)?.sum_all()
        }
        "add_then_relu" => {
            let h = x.mul(2.0)?;
            h.add_(b)?;
            h.relu_()?;
            h.mul(b)?.sum_all()
        }
        "sigmoid" => {
            let h = x.mul(b)?;
            h.sigmoid_()?;
            h.mul(b)?.sum_all()
        }
        "tanh_exp" => {
            let h = x.mul(b)?;
            h.tanh_()?;
            h.exp_()?;
            h.sum_all()
        }
        "sin" => {
            let h = x.mul(b)?;
            h.sin_()?;
            h.mul(x)?.sum_all()
        }
        "silu" => {
            let h = x.mul(2.0)?;
            nn::SiLU::inplace().forward(&h)?;
            h.mul(b)?.sum_all()
        }
        "floor" => {
            let h = x.mul(3.0)?;
            h.floor_()?;
            h.mul(b)?.sum_all()
        }
        "relu_then_modified" => {
            let h = x.mul(b)?;
            h.relu_()?;
            h.add_(1)?;
            h.mul(&h)?.sum_all()
        }
        "relu_of_saved_output" => {
            let y = x.exp()?;
            y.relu_()?;
            y.sum_all()
        }
        "relu_leaf" => {
            x.relu_()?;
            x.sum_all()
        }
        "mul_by_alias" => {
            let h = x.mul(2.0)?;
            h.mul_(&h.detach())?;
            h.sum_all()
        }
        "div_by_alias" => {
            let h = x.mul(2.0)?.add(3.0)?;
            h.div_(&h.detach())?;
            h.mul(b)?.sum_all()
        }
        "sigmoid_int_target" => {
            let t = Tensor::new([1i64, 2, 3], dev)?;
            t.sigmoid_()?;
            t.mul(b)?.sum_all()
        }
        other => panic!("no in-place program {other} (gen_nn.py and nn.rs disagree)"),
    }
}

fn inplace_ops_in_a_graph_match_pytorch(dev: &Device) -> Result<()> {
    let all = cases();
    let cases = all["inplace"].as_array().unwrap();
    assert!(cases.len() >= 20);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let x = tensor(&case["inputs"][0], dev)?.requires_grad_(true)?;
        let b = tensor(&case["inputs"][1], dev)?.requires_grad_(true)?;
        let got = inplace_program(name, &x, &b).and_then(|l| l.backward());
        if let Some(want) = case["error"].as_str() {
            let e = got.expect_err(name);
            assert!(
                matches!(e, ember::Error::InvalidArgument { .. }),
                "{name}: {e:?}"
            );
            let phrase = case["phrase"].as_str().unwrap();
            assert!(
                e.to_string().contains(phrase),
                "{name}: {e} (PyTorch: {want})"
            );
            continue;
        }
        got.unwrap_or_else(|e| panic!("{name}: {e}"));
        for (t, g) in [&x, &b].into_iter().zip(case["grads"].as_array().unwrap()) {
            match (t.grad(), g.is_null()) {
                (None, true) => {}
                (Some(got), false) => {
                    assert_close(&vals(&got), &vals(&tensor(g, dev)?), 1e-6, 1e-9)
                }
                (got, _) => panic!("{name}: gradient {got:?}, PyTorch's {g}"),
            }
        }
    }
    Ok(())
}

/// The activation modules apply their function with PyTorch's default arguments
/// (values as `torch.nn` gives them for the same input).
fn activation_modules_use_pytorchs_defaults(dev: &Device) -> Result<()> {
    use ember::nn::{Identity, LeakyReLU, Module, SiLU, Softplus, ELU};
    let x = Tensor::new([-2.0f64, 0.0, 1.0, 25.0], dev)?;
    let close = |m: &dyn Module, want: [f64; 4]| -> Result<()> {
        let got = m.forward(&x)?.to_vec::<f64>()?;
        for (g, w) in got.iter().zip(want) {
            assert!(
                (g - w).abs() <= 1e-12 * w.abs().max(1.0),
                "{m:?}: {got:?} vs {want:?}",
                m = std::any::type_name_of_val(m)
            );
        }
        Ok(())
    };
    // torch.nn.LeakyReLU()(x), Softplus()(x) (linear above 20), ELU()(x), SiLU()(x)
    close(&LeakyReLU::default(), [-0.02, 0.0, 1.0, 25.0])?;
    close(
        &Softplus::default(),
        [
            0.1269280110429725,
            std::f64::consts::LN_2,
            1.3132616875182228,
            25.0,
        ],
    )?;
    close(&ELU::default(), [-0.8646647167633873, 0.0, 1.0, 25.0])?;
    close(
        &SiLU,
        [
            -0.2384058440442351,
            0.0,
            0.7310585786300049,
            24.9999999996528,
        ],
    )?;
    close(&Identity, [-2.0, 0.0, 1.0, 25.0])?;
    close(
        &LeakyReLU {
            negative_slope: 0.5,
        },
        [-1.0, 0.0, 1.0, 25.0],
    )?;
    Ok(())
}

/// Embedding, LayerNorm and RMSNorm have PyTorch's parameter names, shapes and
/// initial values, apply their functions (golden-tested against PyTorch), keep
/// the padding row at zero without a gradient, and convert like other modules.
fn embedding_and_norm_modules(dev: &Device) -> Result<()> {
    use ember::nn::{self, Embedding, LayerNorm, Module, RMSNorm};
    let _g = super::rng_lock();
    ember::manual_seed(3);
    let names = |m: &dyn Module| -> Vec<(String, Vec<usize>)> {
        m.named_parameters()
            .into_iter()
            .map(|(n, t)| (n, t.shape().to_vec()))
            .collect()
    };
    // Embedding(1000, 16, padding_idx=-1): N(0, 1) weights, the last row zero
    let e = Embedding::with_padding(1000, 16, Some(-1), dev)?;
    assert_eq!(names(&e), [("weight".to_string(), vec![1000, 16])]);
    assert_eq!(e.padding_idx, Some(999));
    let w = e.weight.to_vec2::<f32>()?;
    assert!(w[999].iter().all(|&v| v == 0.0));
    let all: Vec<f64> = w[..999].iter().flatten().map(|&v| v as f64).collect();
    let mean = all.iter().sum::<f64>() / all.len() as f64;
    let sd = (all.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / all.len() as f64).sqrt();
    assert!(
        mean.abs() < 0.03 && (sd - 1.0).abs() < 0.03,
        "mean {mean}, sd {sd}"
    );
    let idx = Tensor::new([[3i64, 999], [999, 5]], dev)?;
    let y = e.forward(&idx)?;
    assert_eq!(y.shape(), &[2, 2, 16]);
    y.sum_all()?.backward()?;
    let g = e.weight.grad().expect("a gradient").to_vec2::<f32>()?;
    assert!(
        g[999].iter().all(|&v| v == 0.0),
        "the padding row gets no gradient"
    );
    assert!(g[3].iter().all(|&v| v == 1.0) && g[5].iter().all(|&v| v == 1.0));
    assert!(Embedding::with_padding(4, 2, Some(4), dev).is_err());
    assert!(synced(e.forward(&Tensor::new([1000i64], dev)?)).is_err());
    if !dev.is_cuda() {
        // the GPU checks indices on the device and reports at the next wait
        let m = e
            .forward(&Tensor::new([1000i64], dev)?)
            .unwrap_err()
            .to_string();
        assert_eq!(
            m,
            "embedding: index 1000 is out of bounds for dimension 0 with size 1000"
        );
    }

    // LayerNorm([2, 3]): weight ones, bias zeros; without bias; without affine
    let ln = LayerNorm::new(&[2, 3], dev)?;
    assert_eq!(
        names(&ln),
        [
            ("weight".to_string(), vec![2, 3]),
            ("bias".to_string(), vec![2, 3])
        ]
    );
    assert_eq!(ln.weight.as_ref().unwrap().to_vec2::<f32>()?, [[1.0; 3]; 2]);
    assert_eq!(ln.bias.as_ref().unwrap().to_vec2::<f32>()?, [[0.0; 3]; 2]);
    assert_eq!(ln.eps, 1e-5);
    let no_bias = LayerNorm::with_options(&[3], 1e-6, true, false, dev)?;
    assert_eq!(names(&no_bias), [("weight".to_string(), vec![3])]);
    assert!(LayerNorm::with_options(&[3], 1e-5, false, true, dev)?
        .named_parameters()
        .is_empty());
    let x = Tensor::randn([4, 2, 3], dev)?;
    let want = nn::layer_norm(&x, &[2, 3], ln.weight.as_ref(), ln.bias.as_ref(), 1e-5)?;
    assert_eq!(ln.forward(&x)?.to_vec3::<f32>()?, want.to_vec3::<f32>()?);
    // each normalised sample has mean 0 and (biased) variance 1
    let s = ln.forward(&x)?.flatten(1, -1)?;
    assert!(s.mean(1, false)?.abs()?.max_all()?.item::<f32>()? < 1e-6);
    assert!(
        (s.var_correction(1, 0.0, false)?
            .sub(1.0)?
            .abs()?
            .max_all()?
            .item::<f32>()?)
            < 1e-4
    );

    // RMSNorm([3]): weight ones, eps None (the machine epsilon)
    let mut rms = RMSNorm::new(&[3], dev)?;
    assert_eq!(names(&rms), [("weight".to_string(), vec![3])]);
    assert_eq!(rms.eps, None);
    let x = Tensor::new([[3.0f32, 4.0, 0.0]], dev)?;
    // x / sqrt(mean(x²)) = x / sqrt(25/3)
    let got = rms.forward(&x)?.to_vec2::<f32>()?;
    let r = (25.0f32 / 3.0).sqrt();
    for (g, w) in got[0].iter().zip([3.0 / r, 4.0 / r, 0.0]) {
        assert!((g - w).abs() < 1e-6, "{got:?}");
    }
    rms.to_dtype(DType::F64)?;
    assert_eq!(rms.weight.as_ref().unwrap().dtype(), DType::F64);
    assert!(rms.weight.as_ref().unwrap().requires_grad());
    let mut ln2 = LayerNorm::new(&[3], dev)?;
    ln2.to_empty(&Device::Meta)?;
    assert_eq!(ln2.weight.as_ref().unwrap().device(), Device::Meta);
    ln2.to_empty(dev)?;
    ln2.reset_parameters()?;
    assert_eq!(ln2.weight.as_ref().unwrap().to_vec1::<f32>()?, [1.0; 3]);
    Ok(())
}

/// MultiheadAttention (masks, attention weights), transformer encoder and decoder
/// layers (post- and pre-norm, ReLU and GELU) and an encoder stack, in float64
/// with PyTorch's parameters: outputs, attention weights and the gradients of
/// every input and every parameter (tests/golden/gen_nn.py, `seq_modules`).
/// The sequence modules against PyTorch with each attention path: the one that
/// keeps the weights (the default at these sizes) and the memory-saving one.
fn seq_modules_match_pytorch(dev: &Device) -> Result<()> {
    use ember::nn::functional::{with_attention_path, AttentionPath};
    for path in [AttentionPath::Auto, AttentionPath::MemoryEfficient] {
        with_attention_path(path, || seq_modules_match_pytorch_with(dev))?;
    }
    Ok(())
}

fn seq_modules_match_pytorch_with(dev: &Device) -> Result<()> {
    use nn::{
        Activation, AttentionOptions, DecoderMasks, LayerNorm, MultiheadAttention,
        TransformerDecoderLayer, TransformerEncoder, TransformerEncoderLayer, TransformerOptions,
    };
    let all = cases();
    let close = |what: &str, got: &Tensor, want: &Value| -> Result<()> {
        let want = tensor(want, dev)?;
        assert_eq!(got.shape(), want.shape(), "{what}: shape");
        let (g, w) = (vals(got), vals(&want));
        for (i, (a, b)) in g.iter().zip(&w).enumerate() {
            assert!(
                (a - b).abs() <= 1e-9 + 1e-7 * b.abs(),
                "{what} [{i}]: {a} vs {b}"
            );
        }
        Ok(())
    };
    let cases = all["seq_modules"].as_array().unwrap();
    assert!(cases.len() >= 17, "{} sequence-module cases", cases.len());
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let c = &case["config"];
        let u = |k: &str| c[k].as_u64().unwrap() as usize;
        let options = || TransformerOptions {
            dim_feedforward: u("dim_feedforward"),
            dropout: 0.0,
            activation: if c["activation"] == "gelu" {
                Activation::Gelu
            } else {
                Activation::Relu
            },
            batch_first: true,
            norm_first: c["norm_first"].as_bool().unwrap(),
            ..Default::default()
        };
        let ins: Vec<(String, Tensor)> = case["inputs"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| Ok((k.clone(), tensor(v, dev)?.requires_grad_(true)?)))
            .collect::<Result<_>>()?;
        let input = |k: &str| ins.iter().find(|(n, _)| n == k).map(|(_, t)| t);
        let masks: Vec<(String, Tensor)> = case["masks"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| {
                let t = tensor(v, dev)?;
                Ok((k.clone(), if v["bool"] == true { t.ne(0.0)? } else { t }))
            })
            .collect::<Result<_>>()?;
        let mask = |k: &str| masks.iter().find(|(n, _)| n == k).map(|(_, t)| t);
        let module: Box<dyn Module>;
        let (y, w) = match case["kind"].as_str().unwrap() {
            "mha" => {
                let mut m = MultiheadAttention::with_options(
                    u("embed_dim"),
                    u("num_heads"),
                    0.0,
                    c["bias"].as_bool().unwrap(),
                    c["batch_first"].as_bool().unwrap(),
                    dev,
                )?;
                m.to_dtype(DType::F64)?;
                ember::io::load_state_into(&m, &state_of(&case["state"], dev)?, name)?;
                m.set_training(false);
                let q = input("query").unwrap();
                let k = input("key").unwrap_or(q);
                let v = input("value").unwrap_or(k);
                let need_weights = c["need_weights"].as_bool().unwrap_or(true);
                let opts = AttentionOptions {
                    key_padding_mask: mask("key_padding_mask"),
                    attn_mask: mask("attn_mask"),
                    need_weights,
                    average_attn_weights: name != "mha_cross_masks",
                    ..Default::default()
                };
                let (y, w) = m.attend(q, k, v, opts)?;
                assert_eq!(w.is_some(), need_weights, "{name}: weights returned");
                module = Box::new(m);
                (y, w)
            }
            "encoder_layer" => {
                let mut m = TransformerEncoderLayer::new(u("d_model"), u("nhead"), options(), dev)?;
                m.to_dtype(DType::F64)?;
                ember::io::load_state_into(&m, &state_of(&case["state"], dev)?, name)?;
                m.set_training(false);
                let y = m.forward_masked(
                    input("src").unwrap(),
                    mask("mask"),
                    mask("src_key_padding_mask"),
                )?;
                module = Box::new(m);
                (y, None)
            }
            "encoder" => {
                let layer = TransformerEncoderLayer::new(u("d_model"), u("nhead"), options(), dev)?;
                let norm = LayerNorm::new(&[u("d_model")], dev)?;
                let mut m = TransformerEncoder::new(layer, u("num_layers"), Some(norm))?;
                m.to_dtype(DType::F64)?;
                ember::io::load_state_into(&m, &state_of(&case["state"], dev)?, name)?;
                m.set_training(false);
                let y = m.forward_masked(input("src").unwrap(), mask("mask"), None)?;
                module = Box::new(m);
                (y, None)
            }
            "decoder_layer" => {
                let mut m = TransformerDecoderLayer::new(u("d_model"), u("nhead"), options(), dev)?;
                m.to_dtype(DType::F64)?;
                ember::io::load_state_into(&m, &state_of(&case["state"], dev)?, name)?;
                m.set_training(false);
                let masks = DecoderMasks {
                    tgt_mask: mask("tgt_mask"),
                    memory_key_padding_mask: mask("memory_key_padding_mask"),
                    ..Default::default()
                };
                let y = m.decode(input("tgt").unwrap(), input("memory").unwrap(), masks)?;
                module = Box::new(m);
                (y, None)
            }
            "lstm" | "gru" => {
                let options = nn::RnnOptions {
                    num_layers: u("num_layers"),
                    bias: c["bias"].as_bool().unwrap(),
                    batch_first: c["batch_first"].as_bool().unwrap(),
                    dropout: 0.0,
                    bidirectional: c["bidirectional"].as_bool().unwrap(),
                };
                let x = input("x").unwrap();
                let flat = |ts: &[&Tensor]| -> Result<Tensor> {
                    let v: Vec<Tensor> =
                        ts.iter().map(|t| t.flatten_all()).collect::<Result<_>>()?;
                    Tensor::cat(&v.iter().collect::<Vec<_>>(), 0)
                };
                if case["kind"] == "lstm" {
                    let mut m =
                        nn::LSTM::with_options(u("input_size"), u("hidden_size"), options, dev)?;
                    m.to_dtype(DType::F64)?;
                    ember::io::load_state_into(&m, &state_of(&case["state"], dev)?, name)?;
                    let state = input("h0").map(|h| (h, input("c0").unwrap()));
                    let (y, (h, c)) = m.forward_state(x, state)?;
                    module = Box::new(m);
                    (flat(&[&y, &h, &c])?, None)
                } else {
                    let mut m =
                        nn::GRU::with_options(u("input_size"), u("hidden_size"), options, dev)?;
                    m.to_dtype(DType::F64)?;
                    ember::io::load_state_into(&m, &state_of(&case["state"], dev)?, name)?;
                    let (y, h) = m.forward_state(x, input("h0"))?;
                    module = Box::new(m);
                    (flat(&[&y, &h])?, None)
                }
            }
            "lstm_cell" => {
                let mut m = nn::LSTMCell::new(u("input_size"), u("hidden_size"), dev)?;
                m.to_dtype(DType::F64)?;
                ember::io::load_state_into(&m, &state_of(&case["state"], dev)?, name)?;
                let (h, c) = m.step(
                    input("x").unwrap(),
                    Some((input("h0").unwrap(), input("c0").unwrap())),
                )?;
                module = Box::new(m);
                (
                    Tensor::cat(&[&h.flatten_all()?, &c.flatten_all()?], 0)?,
                    None,
                )
            }
            "gru_cell" => {
                let mut m = nn::GRUCell::new(u("input_size"), u("hidden_size"), dev)?;
                m.to_dtype(DType::F64)?;
                ember::io::load_state_into(&m, &state_of(&case["state"], dev)?, name)?;
                let h = m.step(input("x").unwrap(), input("h0"))?;
                module = Box::new(m);
                (h.flatten_all()?, None)
            }
            other => panic!("unknown kind {other}"),
        };
        close(&format!("{name}: output"), &y, &case["output"])?;
        let ramp = |t: &Tensor, a: f64, b: f64| -> Result<Tensor> {
            Tensor::linspace(a, b, t.numel(), DType::F64, dev)?.reshape(t.shape())
        };
        let mut loss = y.mul(&ramp(&y, -1.0, 1.0)?)?.sum_all()?;
        if let Some(w) = &w {
            close(&format!("{name}: weights"), w, &case["weights"])?;
            loss = loss.add(&w.mul(&ramp(w, 0.5, -0.5)?)?.sum_all()?)?;
        }
        loss.backward()?;
        for (k, t) in &ins {
            let g = t
                .grad()
                .unwrap_or_else(|| panic!("{name}: no gradient for {k}"));
            close(
                &format!("{name}: gradient of {k}"),
                &g,
                &case["input_grads"][k],
            )?;
        }
        let params = module.named_parameters();
        let want = case["param_grads"].as_object().unwrap();
        assert_eq!(
            params.len(),
            want.len(),
            "{name}: parameters {:?}",
            params.iter().map(|p| &p.0).collect::<Vec<_>>()
        );
        for (k, p) in &params {
            let g = p
                .grad()
                .unwrap_or_else(|| panic!("{name}: no gradient for {k}"));
            close(&format!("{name}: gradient of {k}"), &g, &want[k])?;
        }
    }
    Ok(())
}

/// Bad input to the attention modules is an error naming the module and shapes;
/// the encoder stack's layers start as copies under PyTorch's names; dropout acts
/// in training only.
fn attention_modules_refuse_bad_input(dev: &Device) -> Result<()> {
    use nn::{
        AttentionOptions, MultiheadAttention, TransformerEncoder, TransformerEncoderLayer,
        TransformerOptions,
    };
    let _g = super::rng_lock();
    let msg = |r: Result<(Tensor, Option<Tensor>)>| r.map(drop).unwrap_err().to_string();
    let e = MultiheadAttention::new(10, 3, dev)
        .map(drop)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("embed_dim must be divisible by num_heads"),
        "{e}"
    );
    let m = MultiheadAttention::new(8, 2, dev)?;
    let x = Tensor::randn([3, 2, 8], dev)?; // [L, N, E]
    let bad_mask = Tensor::zeros([2, 2], DType::Bool, dev)?;
    let o = AttentionOptions {
        attn_mask: Some(&bad_mask),
        ..Default::default()
    };
    assert!(msg(m.attend(&x, &x, &x, o)).contains("attn_mask"));
    let bad_kpm = Tensor::zeros([3, 3], DType::Bool, dev)?;
    let o = AttentionOptions {
        key_padding_mask: Some(&bad_kpm),
        ..Default::default()
    };
    assert!(msg(m.attend(&x, &x, &x, o)).contains("key_padding_mask"));
    let o = AttentionOptions {
        is_causal: true,
        ..Default::default()
    };
    assert!(msg(m.attend(&x, &x, &x, o)).contains("Need attn_mask"));
    let x4 = Tensor::randn([1, 3, 2, 8], dev)?;
    assert!(msg(m.attend(&x4, &x4, &x4, AttentionOptions::default())).contains("3-D"));
    let x6 = Tensor::randn([3, 2, 6], dev)?;
    assert!(msg(m.attend(&x6, &x6, &x6, AttentionOptions::default()))
        .contains("embedding dimension of 8"));
    // unbatched [L, E] works and gives [L, E] and weights [L, S]
    let (y, w) = m.attend(
        &x.select(1, 0)?,
        &x.select(1, 0)?,
        &x.select(1, 0)?,
        AttentionOptions::default(),
    )?;
    assert_eq!((y.shape(), w.unwrap().shape()), (&[3, 8][..], &[3, 3][..]));
    // an unbatched input's key padding mask is 1-D, [S] ([1, S] is PyTorch's error)
    let x1 = x.select(1, 0)?;
    let pad = Tensor::new([false, false, true], dev)?;
    let o = AttentionOptions {
        key_padding_mask: Some(&pad),
        ..Default::default()
    };
    let (_, w1) = m.attend(&x1, &x1, &x1, o)?;
    let w1 = w1.expect("weights");
    assert_eq!(vals(&w1.select(1, 2)?), vec![0.0; 3], "the padded key");
    let pad2 = pad.reshape([1, 3])?;
    let o = AttentionOptions {
        key_padding_mask: Some(&pad2),
        ..Default::default()
    };
    assert!(msg(m.attend(&x1, &x1, &x1, o)).contains("key_padding_mask"));
    // masks are bool or float: an integer mask is not added to the scores
    let byte_pad = Tensor::zeros([2, 3], DType::U8, dev)?;
    let o = AttentionOptions {
        key_padding_mask: Some(&byte_pad),
        ..Default::default()
    };
    assert!(msg(m.attend(&x, &x, &x, o)).contains("only bool and floating types"));
    let int_mask = Tensor::zeros([3, 3], DType::I64, dev)?;
    let o = AttentionOptions {
        attn_mask: Some(&int_mask),
        ..Default::default()
    };
    assert!(msg(m.attend(&x, &x, &x, o)).contains("only bool and floating types of attn_mask"));
    // in training the weights returned are the ones applied, after dropout
    // (zeros, and the rest scaled by 1 / (1 - p))
    let dropping = nn::MultiheadAttention::with_options(8, 2, 0.5, true, true, dev)?;
    let xb = Tensor::randn([2, 6, 8], dev)?;
    let o = AttentionOptions {
        average_attn_weights: false,
        ..Default::default()
    };
    let (_, wd) = dropping.attend(&xb, &xb, &xb, o)?;
    let wd = vals(&wd.expect("weights"));
    assert!(wd.contains(&0.0), "dropped weights are zeros");
    let sums: Vec<f64> = wd.chunks(6).map(|r| r.iter().sum()).collect();
    assert!(
        sums.iter().any(|s| (s - 1.0).abs() > 1e-3),
        "rows after dropout do not sum to 1: {sums:?}"
    );

    let opts = TransformerOptions {
        dim_feedforward: 16,
        dropout: 0.5,
        batch_first: true,
        ..Default::default()
    };
    let mut enc = TransformerEncoder::new(TransformerEncoderLayer::new(8, 2, opts, dev)?, 2, None)?;
    let p = enc.named_parameters();
    assert_eq!(p.len(), 2 * 12);
    assert_eq!(p[0].0, "layers.0.self_attn.in_proj_weight");
    assert_eq!(p[12].0, "layers.1.self_attn.in_proj_weight");
    assert_eq!(vals(&p[0].1), vals(&p[12].1), "the layers start as copies");
    assert!(p.iter().any(|(n, _)| n == "layers.1.norm2.bias"));
    let src = Tensor::randn([2, 4, 8], dev)?;
    ember::manual_seed(1);
    let a = enc.forward(&src)?;
    ember::manual_seed(2);
    let b = enc.forward(&src)?;
    assert_ne!(vals(&a), vals(&b), "dropout in training");
    enc.eval();
    assert_eq!(
        vals(&enc.forward(&src)?),
        vals(&enc.forward(&src)?),
        "no dropout in evaluation"
    );

    // the copies keep the layer's dtype and its training flags (a deep copy)
    let mut layer = TransformerEncoderLayer::new(8, 2, opts, dev)?;
    layer.to_dtype(DType::F64)?;
    layer.eval();
    let enc = TransformerEncoder::new(layer, 2, None)?;
    assert!(enc.parameters().iter().all(|p| p.dtype() == DType::F64));
    let src = src.to_dtype(DType::F64)?;
    assert_eq!(
        vals(&enc.forward(&src)?),
        vals(&enc.forward(&src)?),
        "the copied layers do not drop out either"
    );
    // each parameter keeps its own dtype (norms kept in float32 in a float64
    // layer), its values and its requires_grad; making the copies draws no
    // random number
    let mut layer = TransformerEncoderLayer::new(8, 2, opts, dev)?;
    layer.to_dtype(DType::F64)?;
    layer.norm1.to_dtype(DType::F32)?;
    layer.linear2.bias = Some(layer.linear2.bias.take().unwrap().detach());
    let want: Vec<(String, DType, bool, Vec<f64>)> = layer
        .named_parameters()
        .into_iter()
        .map(|(n, p)| (n, p.dtype(), p.requires_grad(), vals(&p)))
        .collect();
    ember::manual_seed(3);
    let enc = TransformerEncoder::new(layer, 3, None)?;
    let next = Tensor::rand([4], &Device::Cpu)?;
    ember::manual_seed(3);
    assert_eq!(vals(&next), vals(&Tensor::rand([4], &Device::Cpu)?));
    for i in 0..3 {
        let got: Vec<(String, DType, bool, Vec<f64>)> = enc.layers[i]
            .named_parameters()
            .into_iter()
            .map(|(n, p)| (n, p.dtype(), p.requires_grad(), vals(&p)))
            .collect();
        assert_eq!(got, want, "layer {i}");
    }
    // casting a model whose layer mixes dtypes (norms kept in float32 in a
    // bfloat16 layer) leaves the float32 values exact: no child is cast to
    // another dtype on the way
    let mut mixed = TransformerEncoderLayer::new(8, 2, opts, dev)?;
    mixed.to_dtype(DType::BF16)?;
    mixed.norm1.to_dtype(DType::F32)?;
    let fine = Tensor::full([8], 1.001, DType::F32, dev)?;
    ember::no_grad(|| mixed.norm1.weight.as_ref().unwrap().copy_(&fine))?;
    let mut model = TransformerEncoder::new(mixed, 1, None)?;
    model.to_dtype(DType::F32)?;
    assert_eq!(
        vals(model.layers[0].norm1.weight.as_ref().unwrap()),
        vals(&fine)
    );
    // the copies are the layers' own
    ember::no_grad(|| enc.layers[0].linear1.weight.add_(1.0))?;
    assert_eq!(want[4].0, "linear1.weight");
    assert_eq!(vals(&enc.layers[1].linear1.weight), want[4].3);

    // recurrent layers: ranks, sizes and states are checked, with PyTorch's names
    let opts = nn::RnnOptions {
        num_layers: 2,
        dropout: 0.5,
        bidirectional: true,
        ..Default::default()
    };
    let mut lstm = nn::LSTM::with_options(3, 4, opts, dev)?;
    let names: Vec<String> = lstm
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names.len(), 16);
    assert_eq!(
        &names[..5],
        [
            "weight_ih_l0",
            "weight_hh_l0",
            "bias_ih_l0",
            "bias_hh_l0",
            "weight_ih_l0_reverse"
        ]
    );
    assert_eq!(
        lstm.named_parameters()[8].1.shape(),
        &[16, 8],
        "layer 1 reads both directions"
    );
    let e = lstm
        .forward(&Tensor::randn([2, 3, 4, 3], dev)?)
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "LSTM: Expected input to be 2D or 3D, got 4D instead (input of shape [2, 3, 4, 3])"
    );
    let e = lstm
        .forward(&Tensor::randn([5, 2, 4], dev)?)
        .unwrap_err()
        .to_string();
    assert!(e.contains("input_size. Expected 3, got 4"), "{e}");
    let x = Tensor::randn([5, 2, 3], dev)?;
    let h = Tensor::zeros([2, 2, 4], DType::F32, dev)?;
    let e = lstm
        .forward_state(&x, Some((&h, &h)))
        .map(drop)
        .unwrap_err()
        .to_string();
    assert!(e.contains("Expected hidden size (4, 2, 4)"), "{e}");
    let (y, (hn, cn)) = lstm.forward_state(&x, None)?;
    assert_eq!(
        (y.shape(), hn.shape(), cn.shape()),
        (&[5, 2, 8][..], &[4, 2, 4][..], &[4, 2, 4][..])
    );
    ember::manual_seed(1);
    let a = lstm.forward(&x)?;
    ember::manual_seed(2);
    assert_ne!(
        vals(&a),
        vals(&lstm.forward(&x)?),
        "dropout between layers in training"
    );
    lstm.eval();
    assert_eq!(vals(&lstm.forward(&x)?), vals(&lstm.forward(&x)?));
    let cell = nn::GRUCell::new(3, 4, dev)?;
    let e = cell
        .step(&Tensor::randn([2, 5], dev)?, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("inconsistent input_size"), "{e}");
    assert_eq!(cell.step(&Tensor::randn([3], dev)?, None)?.shape(), &[4]);
    assert!(nn::GRU::with_options(3, 0, nn::RnnOptions::default(), dev).is_err());
    // a sequence of no steps (PyTorch's error, batched or not)
    for x in [
        Tensor::zeros([0, 2, 3], DType::F32, dev)?,
        Tensor::zeros([0, 3], DType::F32, dev)?,
    ] {
        let e = nn::GRU::new(3, 4, dev)?
            .forward(&x)
            .unwrap_err()
            .to_string();
        assert!(e.contains("sequence length to be larger than 0"), "{e}");
        assert!(nn::LSTM::new(3, 4, dev)?.forward(&x).is_err());
    }
    Ok(())
}

/// clip_grad_norm_ (norm types 2, 1, ∞, 3) and clip_grad_value_ give PyTorch's
/// total norm and clipped gradients.
fn gradient_clipping_matches_pytorch(dev: &Device) -> Result<()> {
    let all = cases();
    let cases = all["clip"].as_array().unwrap();
    assert_eq!(cases.len(), 9);
    // a gradient in the dtype the case names (float32 where it names none)
    let dtype_of = |v: &Value| match v["dtype"].as_str() {
        Some("float32") => DType::F32,
        Some("float64") => DType::F64,
        Some("bfloat16") => DType::BF16,
        Some(other) => panic!("{other}"),
        None => DType::F32,
    };
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let params: Vec<Tensor> = case["grads"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| {
                let g = tensor(g, dev)?.to_dtype(dtype_of(g))?;
                let p = g.zeros_like()?.requires_grad_(true)?;
                p.set_grad(Some(g))?;
                Ok(p)
            })
            .collect::<Result<_>>()?;
        let arg = case["arg"].as_f64().unwrap();
        if case["kind"] == "norm" {
            let norm_type = match &case["norm_type"] {
                Value::String(_) => f64::INFINITY,
                v => v.as_f64().unwrap(),
            };
            let total = nn::clip_grad_norm_(&params, arg, norm_type, false)?;
            if case.get("total_dtype").is_some() {
                // the dtype the gradients' dtypes promote to
                assert_eq!(total.dtype(), DType::F64, "{name}");
            }
            let total = total.to_dtype(DType::F64)?.item::<f64>()?;
            let want = case["total"].as_f64().unwrap();
            assert!(
                (total - want).abs() <= 1e-5 * want,
                "{name}: total {total} vs {want}"
            );
        } else {
            nn::clip_grad_value_(&params, arg)?;
        }
        for (p, want) in params.iter().zip(case["clipped"].as_array().unwrap()) {
            let g = p.grad().unwrap();
            assert_eq!(g.dtype(), dtype_of(want), "{name}");
            if g.dtype() == DType::BF16 {
                // scaled in float32 and rounded once: PyTorch's bits
                assert_eq!(vals(&g), vals(&tensor(want, dev)?), "{name}");
            } else {
                assert_close(&vals(&g), &vals(&tensor(want, dev)?), 1e-5, 1e-6);
            }
        }
    }
    // no gradients: a zero norm; a non-finite norm refused on request
    let p = Tensor::zeros([2], DType::F32, dev)?.requires_grad_(true)?;
    assert_eq!(
        nn::clip_grad_norm_(&[p.clone()], 1.0, 2.0, false)?.item::<f32>()?,
        0.0
    );
    p.set_grad(Some(Tensor::new([f32::NAN, 1.0], dev)?))?;
    assert!(nn::clip_grad_norm_(&[p], 1.0, 2.0, true).is_err());
    Ok(())
}

/// nn::init draws from the distributions PyTorch documents: Kaiming and Xavier
/// bounds and standard deviations from the fans, a truncated normal inside its
/// bounds with the truncated distribution's spread, orthogonal matrices.
fn init_functions_draw_pytorchs_distributions(dev: &Device) -> Result<()> {
    use nn::init::{self, FanMode, Nonlinearity};
    let _g = super::rng_lock();
    ember::manual_seed(9);
    let stats = |t: &Tensor| -> Result<(f64, f64, f64)> {
        let v = vals(t);
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        let sd = (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt();
        Ok((mean, sd, v.iter().fold(0.0f64, |m, x| m.max(x.abs()))))
    };
    // [256, 64, 3, 3]: fan_in 576, fan_out 2304
    let w = Tensor::zeros([256, 64, 3, 3], DType::F32, dev)?.requires_grad_(true)?;
    assert_eq!(init::fans(&w)?, (576, 2304));
    init::kaiming_uniform_(&w, FanMode::FanIn, Nonlinearity::Relu)?;
    let bound = 2f64.sqrt() * (3.0 / 576.0f64).sqrt();
    let (m, sd, max) = stats(&w)?;
    assert!(
        max <= bound && max > 0.99 * bound && m.abs() < 2e-3,
        "{m} {sd} {max} {bound}"
    );
    assert!((sd - bound / 3f64.sqrt()).abs() < 0.01 * sd);
    assert!(w.requires_grad() && w.is_leaf());
    init::kaiming_normal_(&w, FanMode::FanOut, Nonlinearity::Relu)?;
    let (_, sd, _) = stats(&w)?;
    assert!((sd - (2.0 / 2304.0f64).sqrt()).abs() < 0.01 * sd, "{sd}");
    init::xavier_uniform_(&w, 1.0)?;
    let (_, _, max) = stats(&w)?;
    assert!(max <= (6.0 / 2880.0f64).sqrt() && max > 0.99 * (6.0 / 2880.0f64).sqrt());
    init::xavier_normal_(&w, 2.0)?;
    let (_, sd, _) = stats(&w)?;
    assert!((sd - 2.0 * (2.0 / 2880.0f64).sqrt()).abs() < 0.01 * sd);
    // the normal truncated to [-2, 2] has standard deviation 0.8796
    init::trunc_normal_(&w, 0.0, 1.0, -2.0, 2.0)?;
    let (m, sd, max) = stats(&w)?;
    assert!(
        max <= 2.0 && m.abs() < 5e-3 && (sd - 0.8796).abs() < 5e-3,
        "{m} {sd} {max}"
    );
    // bounds far in a tail draw at once, inside them (the normal over [8, 9]
    // has mean 8.1212; drawn on the lower side and mirrored), either tail;
    // a == b fills with a, as PyTorch's
    let t = std::time::Instant::now();
    init::trunc_normal_(&w, 0.0, 1.0, 8.0, 9.0)?;
    let v = vals(&w);
    let m = v.iter().sum::<f64>() / v.len() as f64;
    assert!(v.iter().all(|&x| (8.0..=9.0).contains(&x)), "{m}");
    assert!((m - 8.1212).abs() < 0.01, "{m}");
    init::trunc_normal_(&w, 10.0, 2.0, -8.0, -2.0)?;
    let v = vals(&w);
    let m = v.iter().sum::<f64>() / v.len() as f64;
    // (standardised [-9, -6], the lower tail: mean 10 - 2 · 6.1585)
    assert!(
        v.iter().all(|&x| (-8.0..=-2.0).contains(&x)) && (m + 2.3170).abs() < 0.02,
        "{m}"
    );
    assert!(t.elapsed().as_secs_f64() < 5.0, "{:?}", t.elapsed());
    // one-sided: [-1, inf) of the standard normal has mean 0.2828
    init::trunc_normal_(&w, 0.0, 1.0, -1.0, f64::INFINITY)?;
    let v = vals(&w);
    let m = v.iter().sum::<f64>() / v.len() as f64;
    assert!(
        v.iter().all(|&x| x >= -1.0 && x.is_finite()) && (m - 0.2828).abs() < 0.01,
        "{m}"
    );
    init::trunc_normal_(&w, 0.0, 1.0, 1.0, 1.0)?;
    assert!(vals(&w).iter().all(|&x| x == 1.0));
    for (mean, std, a, b) in [
        (0.0, 1.0, 2.0, 1.0),
        (0.0, 0.0, -1.0, 1.0),
        (0.0, -1.0, -1.0, 1.0),
        (f64::NAN, 1.0, -1.0, 1.0),
        (0.0, 1.0, f64::NAN, 1.0),
    ] {
        assert!(
            init::trunc_normal_(&w, mean, std, a, b).is_err(),
            "{mean} {std} {a} {b}"
        );
    }
    // initialising no elements does nothing (PyTorch warns so)
    let empty = Tensor::zeros([8, 0], DType::F32, dev)?;
    for mode in [FanMode::FanIn, FanMode::FanOut] {
        init::kaiming_uniform_(&empty, mode, Nonlinearity::Relu)?;
        init::kaiming_normal_(&empty, mode, Nonlinearity::Relu)?;
    }
    for v in [0.0, 1.0, 0.5] {
        init::constant_(&w, v)?;
        assert!(vals(&w).iter().all(|&x| x == v));
    }
    init::zeros_(&w)?;
    init::ones_(&w)?;
    assert!(vals(&w).iter().all(|&x| x == 1.0));
    assert!(init::fans(&Tensor::zeros([3], DType::F32, dev)?).is_err());
    assert!(
        (init::calculate_gain(Nonlinearity::LeakyRelu(0.2)) - (2.0 / 1.04f64).sqrt()).abs() < 1e-12
    );
    assert_eq!(init::calculate_gain(Nonlinearity::Tanh), 5.0 / 3.0);
    // orthogonal: rows orthonormal for a wide matrix, columns for a tall one
    for shape in [[3usize, 5], [6, 4]] {
        let q = Tensor::zeros(shape, DType::F64, dev)?;
        init::orthogonal_(&q, 2.0)?;
        let g = if shape[0] <= shape[1] {
            q.matmul(&q.t()?)?
        } else {
            q.t()?.matmul(&q)?
        };
        let k = shape[0].min(shape[1]);
        let eye = Tensor::eye(k, DType::F64, dev)?.mul(4.0)?;
        assert_close(&vals(&g), &vals(&eye), 1e-10, 1e-10);
    }
    Ok(())
}

/// AdamW and SGD over two parameter groups with their own learning rate, weight
/// decay and momentum follow PyTorch's trajectories; the groups' state and
/// configuration stay apart, and a parameter in two groups is refused.
fn parameter_groups_match_pytorch(dev: &Device) -> Result<()> {
    use ember::optim::{split_for_weight_decay, Groups};
    let cases = cases();
    for case in cases["groups"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let v = |k: &str| -> Vec<f64> {
            case[k]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        };
        let w = Tensor::from_vec(v("init_w"), [2, 2], dev)?.requires_grad_(true)?;
        let b = Tensor::new(v("init_b"), dev)?.requires_grad_(true)?;
        let x = Tensor::from_vec(v("x"), [3, 2], dev)?;
        // the split puts the matrix in the first group and the bias in the second
        let (decay, no_decay) = split_for_weight_decay(vec![b.clone(), w.clone()]);
        assert_eq!((decay.len(), no_decay.len()), (1, 1));
        let mut opt = match name {
            "adamw" => Groups::new(vec![
                Box::new(Adam::adamw(decay, 0.01)?.weight_decay(0.1)?),
                Box::new(Adam::adamw(no_decay, 0.05)?.weight_decay(0.0)?),
            ])?,
            "sgd" => Groups::new(vec![
                Box::new(Sgd::new(decay, 0.05)?.momentum(0.9)?.weight_decay(0.01)?),
                Box::new(Sgd::new(no_decay, 0.2)?),
            ])?,
            other => panic!("unknown case {other}"),
        };
        for want in case["trajectory"].as_array().unwrap() {
            opt.zero_grad();
            let y = x.matmul(&w)?.add(&b)?.square()?.tanh()?.sum_all()?;
            let loss = y.add(&w.pow(4.0)?.sum_all()?.mul(0.05)?)?;
            loss.backward()?;
            opt.step()?;
            for (t, key) in [(&w, "w"), (&b, "b")] {
                let want: Vec<f64> = want[key]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap())
                    .collect();
                assert_close(&vals(t), &want, 1e-5, 1e-5);
            }
        }
        // state and configuration are per group, and load back into the groups
        let state = opt.state()?;
        assert!(state.iter().any(|(k, _)| k.starts_with("group0.")));
        assert!(state.iter().all(|(k, _)| k.starts_with("group")));
        let config = opt.config();
        assert!(
            config.iter().any(|(k, _)| k == "group1.weight_decay"),
            "{config:?}"
        );
        opt.load_state(&state)?;
        let mut foreign = state.clone();
        foreign.push(("group7.lr".into(), Tensor::scalar(0.1, &Device::Cpu)?));
        let e = opt.load_state(&foreign).err().unwrap();
        assert!(e.to_string().contains("group7.lr"), "{e}");
        assert_eq!(opt.group_lrs().len(), 2);
    }
    let w = Tensor::zeros([2], DType::F32, dev)?.requires_grad_(true)?;
    let twice = Groups::new(vec![
        Box::new(Sgd::new(vec![w.clone()], 0.1)?),
        Box::new(Sgd::new(vec![w.clone()], 0.2)?),
    ]);
    let e = twice.err().unwrap();
    assert!(
        e.to_string().contains("more than one parameter group"),
        "{e}"
    );
    assert!(Groups::new(vec![]).is_err());
    // each group read and changed on its own
    let mut two = Groups::new(vec![
        Box::new(Sgd::new(vec![Tensor::zeros([1], DType::F32, dev)?], 0.1)?),
        Box::new(Sgd::new(vec![Tensor::zeros([1], DType::F32, dev)?], 0.2)?),
    ])?;
    assert_eq!((two.len(), two.is_empty()), (2, false));
    assert_eq!(two.group(1).map(|g| g.lr()), Some(0.2));
    assert!(two.group(2).is_none() && two.group_mut(2).is_none());
    two.group_mut(0).expect("group 0").set_lr(0.05);
    assert_eq!(two.group_lrs(), vec![0.05, 0.2]);
    Ok(())
}

/// A half-precision input to batch norm with float32 parameters keeps its dtype
/// (PyTorch's mixed batch norm), normalised in float32 and rounded once; its
/// gradients come back in each input's dtype.
fn batch_norm_keeps_a_half_input_dtype(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    ember::manual_seed(21);
    let bn = nn::BatchNorm2d::new(3, dev)?;
    let x = Tensor::randn([4, 3, 5, 5], dev)?.mul(3.0)?.add(1.0)?;
    let want = bn.forward(&x)?;
    for dt in [DType::BF16, DType::F16] {
        let xh = x.to_dtype(dt)?.requires_grad_(true)?;
        let y = bn.forward(&xh)?;
        assert_eq!(y.dtype(), dt);
        let d = y.to_dtype(DType::F32)?.max_abs_diff(&want)?;
        assert!(d < 0.05, "{dt}: max difference {d}");
        y.to_dtype(DType::F32)?.square()?.sum_all()?.backward()?;
        assert_eq!(xh.grad().expect("a gradient").dtype(), dt);
        assert_eq!(
            bn.weight.as_ref().unwrap().grad().unwrap().dtype(),
            DType::F32
        );
    }
    Ok(())
}

/// Batch norm of an empty batch as PyTorch's (2.15): an empty output of the
/// input's shape, zero gradients for the weight and bias, the running statistics
/// kept (the module still counts the batch); one value a channel is refused.
fn batch_norm_of_an_empty_batch_is_pytorchs(dev: &Device) -> Result<()> {
    use ember::nn::functional::{batch_norm, BatchNormOptions};
    let x = Tensor::zeros([2, 3, 0, 4], DType::F32, dev)?.requires_grad_(true)?;
    let w = Tensor::ones([3], DType::F32, dev)?.requires_grad_(true)?;
    let b = Tensor::zeros([3], DType::F32, dev)?.requires_grad_(true)?;
    let (rm, rv) = (
        Tensor::full([3], 0.5, DType::F32, dev)?,
        Tensor::full([3], 2.0, DType::F32, dev)?,
    );
    let opts = BatchNormOptions {
        running_mean: Some(&rm),
        running_var: Some(&rv),
        training: true,
        ..Default::default()
    };
    let y = batch_norm(&x, Some(&w), Some(&b), opts)?;
    assert_eq!(y.shape(), [2, 3, 0, 4]);
    y.sum_all()?.backward()?;
    assert_eq!(x.grad().expect("x's gradient").shape(), [2, 3, 0, 4]);
    assert_eq!(w.grad().expect("w's gradient").to_vec::<f32>()?, [0.0; 3]);
    assert_eq!(b.grad().expect("b's gradient").to_vec::<f32>()?, [0.0; 3]);
    assert_eq!(rm.to_vec::<f32>()?, [0.5; 3]);
    assert_eq!(rv.to_vec::<f32>()?, [2.0; 3]);
    // no channels, and no parameters
    let none = Tensor::zeros([4, 0], DType::F32, dev)?;
    let opts = BatchNormOptions {
        training: true,
        ..Default::default()
    };
    assert_eq!(batch_norm(&none, None, None, opts)?.shape(), [4, 0]);
    // the module: the batch counted, its statistics kept
    let bn = nn::BatchNorm2d::new(3, dev)?;
    let y = bn.forward(&Tensor::zeros([0, 3, 4, 4], DType::F32, dev)?)?;
    assert_eq!(y.shape(), [0, 3, 4, 4]);
    let count = bn.num_batches_tracked.as_ref().expect("a count");
    assert_eq!(count.to_vec::<i64>()?, [1]);
    let mean = bn.running_mean.as_ref().expect("a running mean");
    assert_eq!(mean.to_vec::<f32>()?, [0.0; 3]);
    let var = bn.running_var.as_ref().expect("a running variance");
    assert_eq!(var.to_vec::<f32>()?, [1.0; 3]);
    // one value a channel: no variance to make unbiased
    let one = Tensor::zeros([1, 3], DType::F32, dev)?;
    assert!(batch_norm(&one, None, None, opts).is_err());
    Ok(())
}

/// Training batch norm moves the running statistics as PyTorch does (`0.9 ·
/// running + 0.1 · batch`, the variance unbiased) wherever they lie: float32
/// arrays of their own (moved in the coefficients' launch), the two rows of one
/// tensor, float64 arrays for a float32 input, strided views (moved by tensor ops).
fn batch_norm_running_statistics_move_wherever_they_lie(dev: &Device) -> Result<()> {
    use ember::nn::functional::{batch_norm, BatchNormOptions};
    let _g = super::rng_lock();
    ember::manual_seed(5);
    let x = Tensor::randn([4, 3, 2, 2], dev)?.mul(2.0)?.add(0.5)?;
    // the batch's mean and unbiased variance per channel, on the host
    let v = x.permute([1, 0, 2, 3])?.contiguous()?.to_vec::<f32>()?;
    let (r0m, r0v) = ([0.5f64, -1.0, 2.0], [1.5f64, 0.25, 4.0]);
    let mut want = Vec::new();
    for (ch, vals) in v.chunks(16).enumerate() {
        let mean = vals.iter().map(|&a| a as f64).sum::<f64>() / 16.0;
        let var = vals.iter().map(|&a| (a as f64 - mean).powi(2)).sum::<f64>() / 15.0;
        want.push((0.9 * r0m[ch] + 0.1 * mean, 0.9 * r0v[ch] + 0.1 * var));
    }
    let start = |dt: DType| -> Result<(Tensor, Tensor)> {
        Ok((
            Tensor::new(r0m, dev)?.to_dtype(dt)?,
            Tensor::new(r0v, dev)?.to_dtype(dt)?,
        ))
    };
    let (fm, fv) = start(DType::F32)?;
    let (dm, dv) = start(DType::F64)?;
    let rows = Tensor::stack(&[&fm, &fv], 0)?;
    let (rows_m, rows_v) = (rows.select(0, 0)?, rows.select(0, 1)?);
    let strided = Tensor::zeros([3, 2], DType::F32, dev)?;
    let (sm, sv) = (strided.select(1, 0)?, strided.select(1, 1)?);
    sm.copy_(&fm)?;
    sv.copy_(&fv)?;
    let w = Tensor::new([1.0f32, 2.0, 0.5], dev)?;
    let mut ys = Vec::new();
    for (what, m, var) in [
        ("own arrays", &fm, &fv),
        ("rows of one tensor", &rows_m, &rows_v),
        ("float64", &dm, &dv),
        ("strided views", &sm, &sv),
    ] {
        let opts = BatchNormOptions {
            running_mean: Some(m),
            running_var: Some(var),
            training: true,
            ..Default::default()
        };
        ys.push(batch_norm(&x, Some(&w), None, opts)?);
        let f64s = |t: &Tensor| t.to_dtype(DType::F64)?.to_vec::<f64>();
        let (gm, gv) = (f64s(m)?, f64s(var)?);
        for ch in 0..3 {
            let (em, ev) = want[ch];
            assert!(
                (gm[ch] - em).abs() < 1e-5,
                "{what}: mean {ch}: {} against {em}",
                gm[ch]
            );
            assert!(
                (gv[ch] - ev).abs() < 1e-5,
                "{what}: variance {ch}: {} against {ev}",
                gv[ch]
            );
        }
    }
    for y in &ys[1..] {
        assert_eq!(y.to_vec::<f32>()?, ys[0].to_vec::<f32>()?);
    }
    Ok(())
}

/// `BatchNorm2d::forward_relu` (the ReLU in the batch norm's passes, its gradient
/// folded into the backward's) gives what `forward` then `relu` give: the
/// output, the input's, weight's and bias's gradients and the running
/// statistics, in training and evaluation, row-major and channels-last, in
/// float32 and bfloat16.
fn batch_norm_with_its_relu_is_the_two_ops(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    for (dt, channels_last, training) in [
        (DType::F32, false, true),
        (DType::F32, true, true),
        (DType::F32, false, false),
        (DType::BF16, false, true),
        (DType::BF16, true, true),
    ] {
        let what = format!("{dt}, channels-last {channels_last}, training {training}");
        ember::manual_seed(9);
        // (2,304 rows channels-last: a GPU's chunks of them long enough for its
        // column sums' loads of several rows at a time)
        let x = Tensor::randn([4, 8, 24, 24], dev)?.to_dtype(dt)?;
        let x = if channels_last {
            x.to_memory_format(ember::MemoryFormat::ChannelsLast)?
        } else {
            x
        };
        // (the upstream gradient reaches both sides of 0)
        let up = Tensor::randn([4, 8, 24, 24], dev)?.to_dtype(dt)?;
        let run = |fused: bool| -> Result<Vec<Vec<f32>>> {
            ember::manual_seed(3);
            let mut bn = nn::BatchNorm2d::new(8, dev)?;
            let w = bn.weight.as_ref().expect("a weight");
            ember::no_grad(|| w.copy_(&Tensor::randn([8], dev)?))?;
            if !training {
                bn.eval();
            }
            let xi = x.detach().requires_grad_(true)?;
            let y = if fused {
                bn.forward_relu(&xi)?
            } else {
                bn.forward(&xi)?.relu()?
            };
            y.mul(&up)?.sum_all()?.backward()?;
            let f = |t: &Tensor| t.to_dtype(DType::F32)?.contiguous()?.to_vec::<f32>();
            let param_grad = |p: &Option<Tensor>| {
                f(&p.as_ref().expect("a parameter").grad().expect("a gradient"))
            };
            Ok(vec![
                f(&y)?,
                f(&xi.grad().expect("x's gradient"))?,
                param_grad(&bn.weight)?,
                param_grad(&bn.bias)?,
                f(bn.running_mean.as_ref().expect("a running mean"))?,
                f(bn.running_var.as_ref().expect("a running variance"))?,
            ])
        };
        let (two, one) = (run(false)?, run(true)?);
        let names = [
            "output",
            "x's gradient",
            "weight's gradient",
            "bias's gradient",
            "running mean",
            "running variance",
        ];
        fused_matches(&what, &names, (&two, "two ops"), &one, dt);
    }
    Ok(())
}

/// Each of `names`' lists of `one` (the fused op's) within tolerance of
/// `many`'s (the separate ops', `label`), element by element, of the same
/// lengths; and some of the first list's (the output's) values clamped to 0 and
/// some not.
fn fused_matches(
    what: &str,
    names: &[&str],
    (many, label): (&[Vec<f32>], &str),
    one: &[Vec<f32>],
    dt: DType,
) {
    let tol = if dt == DType::F32 { 1e-5 } else { 2e-2 };
    for (i, name) in names.iter().enumerate() {
        assert_eq!(many[i].len(), one[i].len(), "{what}: {name}");
        for (j, (a, b)) in many[i].iter().zip(&one[i]).enumerate() {
            let scale = 1f32.max(a.abs());
            assert!(
                (a - b).abs() <= tol * scale,
                "{what}: {name}[{j}]: {a} ({label}) against {b} (fused)"
            );
        }
    }
    let zeros = one[0].iter().filter(|&&v| v == 0.0).count();
    assert!(zeros > 0 && zeros < one[0].len(), "{what}: {zeros} zeros");
}

/// `BatchNorm2d::forward_add_relu` (a ResNet block's end: the sum and the ReLU in
/// the batch norm's pass) gives what `forward`, `add` and `relu` give: the output
/// and the gradients of the input, the residual, the weight and the bias, in
/// float32 and bfloat16, row-major and channels-last (the residual in the other
/// layout too); a residual of another dtype takes the separate ops.
fn batch_norm_with_a_residual_and_relu_is_the_three_ops(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    for (dt, x_cl, r_cl) in [
        (DType::F32, false, false),
        (DType::F32, true, true),
        (DType::F32, true, false),
        (DType::BF16, false, false),
        (DType::BF16, true, true),
    ] {
        let what = format!("{dt}, channels-last input {x_cl}, residual {r_cl}");
        ember::manual_seed(11);
        let lay = |t: Tensor, cl: bool| -> Result<Tensor> {
            if cl {
                t.to_memory_format(ember::MemoryFormat::ChannelsLast)
            } else {
                Ok(t)
            }
        };
        let x = lay(Tensor::randn([4, 8, 5, 5], dev)?.to_dtype(dt)?, x_cl)?;
        let r = lay(Tensor::randn([4, 8, 5, 5], dev)?.to_dtype(dt)?, r_cl)?;
        let up = Tensor::randn([4, 8, 5, 5], dev)?.to_dtype(dt)?;
        let run = |fused: bool| -> Result<Vec<Vec<f32>>> {
            ember::manual_seed(3);
            let bn = nn::BatchNorm2d::new(8, dev)?;
            let (xi, ri) = (
                x.detach().requires_grad_(true)?,
                r.detach().requires_grad_(true)?,
            );
            let y = if fused {
                bn.forward_add_relu(&xi, &ri)?
            } else {
                bn.forward(&xi)?.add(&ri)?.relu()?
            };
            y.mul(&up)?.sum_all()?.backward()?;
            let f = |t: &Tensor| t.to_dtype(DType::F32)?.contiguous()?.to_vec::<f32>();
            let grad = |t: &Tensor| f(&t.grad().expect("a gradient"));
            Ok(vec![
                f(&y)?,
                grad(&xi)?,
                grad(&ri)?,
                grad(bn.weight.as_ref().expect("a weight"))?,
                grad(bn.bias.as_ref().expect("a bias"))?,
            ])
        };
        let (three, one) = (run(false)?, run(true)?);
        let names = [
            "output",
            "x's gradient",
            "the residual's gradient",
            "weight's gradient",
            "bias's gradient",
        ];
        fused_matches(&what, &names, (&three, "three ops"), &one, dt);
    }
    // an empty batch: an empty output, and empty gradients for the input and the
    // residual (zeros for the parameters), as the three ops give
    let bn = nn::BatchNorm2d::new(2, dev)?;
    let x = Tensor::zeros([0, 2, 3, 3], DType::F32, dev)?.requires_grad_(true)?;
    let r = Tensor::zeros([0, 2, 3, 3], DType::F32, dev)?.requires_grad_(true)?;
    let y = bn.forward_add_relu(&x, &r)?;
    assert_eq!(y.shape(), [0, 2, 3, 3]);
    y.sum_all()?.backward()?;
    assert_eq!(
        r.grad().expect("the residual's gradient").shape(),
        [0, 2, 3, 3]
    );
    assert_eq!(x.grad().expect("x's gradient").shape(), [0, 2, 3, 3]);
    let gw = bn
        .weight
        .as_ref()
        .expect("a weight")
        .grad()
        .expect("a gradient");
    assert_eq!(gw.to_vec::<f32>()?, [0.0; 2]);
    // a float32 residual for a bfloat16 input: promoted, as `add` does
    let bn = nn::BatchNorm2d::new(2, dev)?;
    let x = Tensor::randn([2, 2, 3, 3], dev)?.to_dtype(DType::BF16)?;
    let r = Tensor::randn([2, 2, 3, 3], dev)?;
    assert_eq!(bn.forward_add_relu(&x, &r)?.dtype(), DType::F32);
    Ok(())
}

/// `nn.GroupNorm`: PyTorch's parameters (ones, zeros, named weight and bias), no
/// parameters without `affine`, the functional's result, its refusal of
/// channels that groups do not divide; and `index_add_` in place, recorded.
fn group_norm_module_and_index_add_inplace(dev: &Device) -> Result<()> {
    let _rng = super::rng_lock();
    let gn = nn::GroupNorm::new(2, 4, dev)?;
    let names: Vec<String> = gn.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["weight", "bias"]);
    assert_eq!(gn.weight.as_ref().unwrap().to_vec::<f32>()?, [1.0; 4]);
    assert_eq!(gn.bias.as_ref().unwrap().to_vec::<f32>()?, [0.0; 4]);
    assert_eq!(gn.eps, 1e-5);
    let plain = nn::GroupNorm::with_options(2, 4, 1e-3, false, dev)?;
    assert!(plain.named_parameters().is_empty());
    let e = nn::GroupNorm::new(4, 6, dev)
        .err()
        .expect("6 channels in 4 groups");
    assert!(matches!(e, ember::Error::InvalidArgument { .. }), "{e}");
    let x = Tensor::randn([3, 4, 5], dev)?;
    let y = gn.forward(&x)?;
    let want = nn::group_norm(&x, 2, None, None, 1e-5)?;
    assert_close(&vals(&y), &vals(&want), 1e-6, 1e-6);
    y.sum_all()?.backward()?;
    assert_eq!(gn.weight.as_ref().unwrap().grad().unwrap().shape(), &[4]);
    // index_add_: written in place, and recorded on a non-leaf
    let idx = Tensor::new([1i64, 1, 0], dev)?;
    let dst = Tensor::zeros([2, 2], DType::F32, dev)?;
    dst.index_add_(0, &idx, &Tensor::ones([3, 2], DType::F32, dev)?, 2)?;
    assert_eq!(dst.to_vec::<f32>()?, [2.0, 2.0, 4.0, 4.0]);
    let a = Tensor::ones([2, 2], DType::F32, dev)?.requires_grad_(true)?;
    let s = Tensor::ones([3, 2], DType::F32, dev)?.requires_grad_(true)?;
    let h = a.mul(3.0)?;
    h.index_add_(0, &idx, &s, -1.0)?;
    assert_eq!(h.to_vec::<f32>()?, [2.0, 2.0, 1.0, 1.0]);
    h.sum_all()?.backward()?;
    assert_eq!(a.grad().unwrap().to_vec::<f32>()?, [3.0; 4]);
    assert_eq!(s.grad().unwrap().to_vec::<f32>()?, [-1.0; 6]);
    // a leaf that requires grad is refused, as in PyTorch
    assert!(a.index_add_(0, &idx, &s, 1).is_err());
    Ok(())
}

/// Loss options PyTorch refuses: an ignore_index with probability targets, and
/// BCE weights that would widen the loss past the logits' shape (applied in
/// place there); the weights that broadcast into it still work.
fn loss_options_refused_as_pytorch_refuses_them(dev: &Device) -> Result<()> {
    let x = Tensor::randn([2, 3], dev)?;
    let probs = x.softmax(1)?;
    let o = nn::LossOptions {
        ignore_index: 1,
        ..Default::default()
    };
    let e = nn::cross_entropy_opts(&x, &probs, o)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("ignore_index is not supported for floating point target"),
        "{e}"
    );
    // the default (-100) and other negative values are taken
    let o = nn::LossOptions {
        ignore_index: -1,
        ..Default::default()
    };
    nn::cross_entropy_opts(&x, &probs, o)?;
    let (l, y) = (
        Tensor::randn([3], dev)?,
        Tensor::zeros([3], DType::F32, dev)?,
    );
    let wide = Tensor::ones([2, 3], DType::F32, dev)?;
    for (w, pw) in [(Some(&wide), None), (None, Some(&wide))] {
        let e = nn::bce_with_logits_opts(&l, &y, w, pw, nn::Reduction::None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("doesn't match the broadcast shape"), "{e}");
    }
    let row = Tensor::ones([1], DType::F32, dev)?.mul(2.0)?;
    let got = nn::bce_with_logits_opts(&l, &y, Some(&row), None, nn::Reduction::None)?;
    let want = nn::bce_with_logits(&l, &y, nn::Reduction::None)?.mul(2.0)?;
    assert_eq!((got.shape(), vals(&got)), (want.shape(), vals(&want)));
    Ok(())
}

device_test!(
    group_norm_module_and_index_add_inplace,
    loss_options_refused_as_pytorch_refuses_them,
    batch_norm_keeps_a_half_input_dtype,
    batch_norm_of_an_empty_batch_is_pytorchs,
    batch_norm_running_statistics_move_wherever_they_lie,
    batch_norm_with_its_relu_is_the_two_ops,
    batch_norm_with_a_residual_and_relu_is_the_three_ops,
    memory_saving_attention_matches_across_groups,
    float_mask_blocking_a_whole_row_gives_zeros,
    memory_saving_attention_dropout_redraws_its_masks,
    memory_saving_attention_cuts_long_rows_into_query_blocks,
    fused_attention_matches_the_plain_path,
    half_cross_entropy_runs_fused_as_the_composite_rounds,
    half_weighted_cross_entropy_sums_in_float32,
    half_norms_give_the_float32_routes_bits,
    fused_attention_takes_the_causal_hint_of_an_encoder,
    fused_attention_drops_the_same_weights_forward_and_backward,
    fused_attention_takes_masks,
    fused_attention_serves_multihead_attention_with_masks,
    fused_attention_keeps_the_corners_of_masks,
    multihead_self_attention_projects_once,
    multihead_cross_attention_projects_keys_and_values_once,
    attention_dropout_draws_new_masks_in_each_graph_replay,
    parameter_groups_match_pytorch,
    gradient_clipping_matches_pytorch,
    init_functions_draw_pytorchs_distributions,
    attention_modules_refuse_bad_input,
    seq_modules_match_pytorch,
    embedding_and_norm_modules,
    activation_modules_use_pytorchs_defaults,
    losses_match_pytorch,
    inplace_ops_in_a_graph_match_pytorch,
    optimizers_match_pytorch,
    iris_lesson_matches_pytorch,
    modules_and_errors,
    small_cnn_learns,
    schedulers_match_pytorch,
    init_matches_pytorch,
    modules_match_pytorch,
    batchnorm_and_lazy_linear,
    named_children_and_layers_for_models,
    modules_convert_to_another_dtype,
);

/// PyTorch's default initial parameters (Kaiming-uniform weights, bias bounds,
/// batch-norm ones/zeros): ember's layers of the same sizes draw from the same
/// distributions (same range and moments within sampling error).
fn init_matches_pytorch(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    ember::manual_seed(11);
    type Make<'a> = Box<dyn Fn() -> Result<Box<dyn Module>> + 'a>;
    let layers: Vec<(&str, Make)> = vec![
        (
            "linear_784_128",
            Box::new(|| Ok(Box::new(nn::Linear::new(784, 128, dev)?) as _)),
        ),
        (
            "conv_64_128_3",
            Box::new(|| {
                Ok(Box::new(nn::Conv2d::new(64, 128, 3, Conv2dOptions::default(), dev)?) as _)
            }),
        ),
        (
            "conv_8_32_5_g4",
            Box::new(|| {
                Ok(Box::new(nn::Conv2d::new(
                    8,
                    32,
                    5,
                    Conv2dOptions::default().groups(4),
                    dev,
                )?) as _)
            }),
        ),
        (
            "bn2d_16",
            Box::new(|| Ok(Box::new(nn::BatchNorm2d::new(16, dev)?) as _)),
        ),
    ];
    let all = cases();
    let cases = all["init"].as_array().unwrap();
    let mut checked = 0;
    for (name, make) in &layers {
        let want: Vec<&Value> = cases.iter().filter(|c| c["layer"] == *name).collect();
        let repeats = want[0]["repeats"].as_u64().unwrap();
        let draws: Vec<Vec<(String, Tensor)>> = (0..repeats)
            .map(|_| Ok(make()?.state_dict()))
            .collect::<Result<_>>()?;
        assert_eq!(draws[0].len(), want.len(), "{name}: number of entries");
        for c in want {
            let pname = c["param"].as_str().unwrap();
            let pick =
                |d: &Vec<(String, Tensor)>| d.iter().find(|(n, _)| n == pname).unwrap().1.clone();
            let shape: Vec<usize> = serde_json::from_value(c["shape"].clone()).unwrap();
            assert_eq!(pick(&draws[0]).shape(), shape.as_slice(), "{name}.{pname}");
            let v: Vec<f64> = draws.iter().flat_map(|d| vals(&pick(d))).collect();
            let n = v.len() as f64;
            let mean = v.iter().sum::<f64>() / n;
            let std =
                (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0)).sqrt();
            let (lo, hi) = v
                .iter()
                .fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
            let f = |k: &str| c[k].as_f64().unwrap();
            let tol_range = 0.01 * f("max").abs().max(f("min").abs()) + 1e-12;
            assert!(
                (lo - f("min")).abs() <= tol_range,
                "{name}.{pname} min {lo} vs {}",
                f("min")
            );
            assert!(
                (hi - f("max")).abs() <= tol_range,
                "{name}.{pname} max {hi} vs {}",
                f("max")
            );
            // the std of >= 10000 uniform draws is within ~1% of the distribution's
            assert!(
                (std - f("std")).abs() <= 0.05 * f("std") + 1e-12,
                "{name}.{pname} std {std} vs {}",
                f("std")
            );
            assert!(
                (mean - f("mean")).abs() <= 5.0 * f("std") / n.sqrt() + 1e-12,
                "{name}.{pname} mean {mean} vs {}",
                f("mean")
            );
            checked += 1;
        }
    }
    assert_eq!(checked, cases.len());
    Ok(())
}

fn golden_module(name: &str, dev: &Device) -> Result<Box<dyn Module>> {
    Ok(match name {
        "linear" => Box::new(nn::Linear::new(5, 3, dev)?),
        "conv2d_s2_p1" => Box::new(nn::Conv2d::new(
            3,
            4,
            3,
            Conv2dOptions::default().stride(2).padding(1),
            dev,
        )?),
        "bn1d" | "bn1d_3d" => Box::new(nn::BatchNorm1d::new(3, dev)?),
        "bn2d" => Box::new(nn::BatchNorm2d::new(4, dev)?),
        "bn2d_cumulative" => {
            let mut bn = nn::BatchNorm2d::new(2, dev)?;
            bn.momentum = None;
            Box::new(bn)
        }
        "bn2d_no_affine" => Box::new(nn::BatchNorm2d::with_options(3, false, true, dev)?),
        "cnn" => {
            let model = nn::Sequential::new()
                .add(nn::Conv2d::new(
                    1,
                    4,
                    3,
                    Conv2dOptions::default().padding(1),
                    dev,
                )?)
                .add(nn::BatchNorm2d::new(4, dev)?)
                .add(nn::ReLU)
                .add(nn::MaxPool2d(Pool2dOptions::new(2)))
                .add(nn::Flatten::default())
                .add(nn::LazyLinear::new(10, dev));
            // a dry run materialises the lazy layer; the loaded state replaces all
            model.forward(&Tensor::zeros([2, 1, 8, 8], DType::F32, dev)?)?;
            Box::new(model)
        }
        other => panic!("no module for golden case {other}"),
    })
}

fn state_of(v: &Value, dev: &Device) -> Result<Vec<(String, Tensor)>> {
    v.as_object()
        .unwrap()
        .iter()
        .map(|(k, t)| Ok((k.clone(), tensor(t, dev)?)))
        .collect()
}

/// Module outputs, input gradients and batch-norm running statistics with
/// PyTorch's parameters, in training and evaluation mode.
fn modules_match_pytorch(dev: &Device) -> Result<()> {
    let _rng = super::rng_lock();
    let all = cases();
    for case in all["modules"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let mut m = golden_module(name, dev)?;
        ember::io::load_state_into(m.as_ref(), &state_of(&case["state"], dev)?, name)?;
        for (i, step) in case["steps"].as_array().unwrap().iter().enumerate() {
            m.set_training(step["mode"] == "train");
            let x = tensor(&step["x"], dev)?
                .to_dtype(DType::F32)?
                .requires_grad_(true)?;
            let y = m.forward(&x)?;
            let want = tensor(&step["y"], dev)?;
            assert_eq!(y.shape(), want.shape(), "{name} step {i}");
            assert_close(&vals(&y), &vals(&want), 1e-4, 1e-5);
            let n = y.numel();
            let g = Tensor::linspace(-1.0, 1.0, n, DType::F32, dev)?.reshape(y.shape())?;
            y.backward_with(&g)?;
            let gx = x.grad().expect("input gradient");
            assert_close(
                &vals(&gx),
                &vals(&tensor(&step["x_grad"], dev)?),
                1e-3,
                1e-5,
            );
        }
        let final_state = m.state_dict();
        let want = state_of(&case["final_state"], dev)?;
        assert_eq!(final_state.len(), want.len(), "{name}: state entries");
        for (k, t) in want {
            let got = &final_state.iter().find(|(n, _)| *n == k).unwrap().1;
            assert_close(&vals(got), &vals(&t), 1e-5, 1e-6);
        }
    }
    Ok(())
}

fn batchnorm_and_lazy_linear(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    ember::manual_seed(3);
    let bn = nn::BatchNorm2d::new(3, dev)?;
    let names: Vec<String> = bn.state_dict().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "weight",
            "bias",
            "running_mean",
            "running_var",
            "num_batches_tracked"
        ]
    );
    assert_eq!(bn.parameters().len(), 2, "buffers are not parameters");
    let err = bn
        .forward(&Tensor::zeros([2, 3, 4], DType::F32, dev)?)
        .unwrap_err();
    assert!(err.to_string().contains("expected 4D input"), "{err}");
    let err = bn
        .forward(&Tensor::zeros([2, 5, 4, 4], DType::F32, dev)?)
        .unwrap_err();
    assert!(err.to_string().contains("5 channels"), "{err}");
    let bn1 = nn::BatchNorm1d::new(3, dev)?;
    let err = bn1
        .forward(&Tensor::zeros([1, 3], DType::F32, dev)?)
        .unwrap_err();
    assert!(
        err.to_string().contains("more than 1 value per channel"),
        "{err}"
    );
    // a failed forward changed nothing
    assert_eq!(vals(&bn1.named_buffers()[2].1), [0.0]);
    // without running statistics evaluation uses the batch's too, and refuses
    // one value a channel as training does
    let mut untracked = nn::BatchNorm1d::with_options(3, true, false, dev)?;
    untracked.eval();
    let err = untracked.forward(&Tensor::randn([1, 3], dev)?).unwrap_err();
    assert!(
        err.to_string().contains("more than 1 value per channel"),
        "{err}"
    );
    // the functional form checks the running statistics' size before it
    // updates either
    let x = Tensor::randn([4, 3], dev)?;
    let (rm, rv) = (
        Tensor::ones([2], DType::F32, dev)?,
        Tensor::ones([3], DType::F32, dev)?,
    );
    let o = nn::functional::BatchNormOptions {
        running_mean: Some(&rm),
        running_var: Some(&rv),
        training: true,
        ..Default::default()
    };
    let err = nn::functional::batch_norm(&x, None, None, o).unwrap_err();
    assert!(
        err.to_string()
            .contains("running_mean should contain 3 elements not 2"),
        "{err}"
    );
    assert_eq!((vals(&rm), vals(&rv)), (vec![1.0; 2], vec![1.0; 3]));

    let lazy = nn::LazyLinear::new(4, dev);
    assert!(lazy.parameters().is_empty() && lazy.in_features().is_none());
    let y = lazy.forward(&Tensor::randn([2, 7], dev)?)?;
    assert_eq!(y.shape(), &[2, 4]);
    assert_eq!(lazy.in_features(), Some(7));
    let shapes: Vec<Vec<usize>> = lazy
        .parameters()
        .iter()
        .map(|p| p.shape().to_vec())
        .collect();
    assert_eq!(shapes, [vec![4, 7], vec![4]]);
    let w = vals(&lazy.parameters()[0]);
    assert!(w.iter().all(|v| v.abs() <= 1.0 / 7f64.sqrt()));
    assert!(
        lazy.forward(&Tensor::randn([2, 6], dev)?).is_err(),
        "in_features is fixed now"
    );

    // buffers go through state-dict files too
    let dir = std::env::temp_dir().join(format!("ember-bn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("bn-{}.safetensors", dev));
    let mut a = nn::BatchNorm2d::new(3, dev)?;
    a.forward(&Tensor::randn([4, 3, 2, 2], dev)?)?;
    ember::io::save_state_dict(&a, &path)?;
    let b = nn::BatchNorm2d::new(3, dev)?;
    ember::io::load_state_dict(&b, &path)?;
    for ((n, x), (_, y)) in a.state_dict().iter().zip(b.state_dict().iter()) {
        assert_eq!(vals(x), vals(y), "{n}");
    }
    assert_eq!(vals(&b.named_buffers()[2].1), [1.0]);
    a.eval();
    let x = Tensor::randn([2, 3, 2, 2], dev)?;
    assert_eq!(
        vals(&a.forward(&x)?),
        vals(&a.forward(&x)?),
        "eval is deterministic"
    );
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}

/// `Sequential::add_named`, `Conv2d` without bias and `AdaptiveAvgPool2d`'s errors
/// (its values are golden cases, `adaptive_pool/` in tests/golden/cases.json).
fn named_children_and_layers_for_models(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    ember::manual_seed(11);
    let names =
        |m: &dyn Module| -> Vec<String> { m.state_dict().into_iter().map(|(n, _)| n).collect() };
    // index names for `add`, given names for `add_named`, nested
    let block = nn::Sequential::new()
        .add(nn::Linear::new(3, 4, dev)?)
        .add(nn::ReLU)
        .add_named("2", nn::BatchNorm1d::new(4, dev)?)?;
    let mut model = nn::Sequential::new()
        .add_named("stem", nn::Linear::new(2, 3, dev)?)?
        .add_named("body", block)?
        .add(nn::Linear::new(4, 1, dev)?);
    assert_eq!(model.names().collect::<Vec<_>>(), ["stem", "body", "2"]);
    assert!(model.get("body").is_some() && model.get("0").is_none());
    assert_eq!(
        names(&model),
        [
            "stem.weight",
            "stem.bias",
            "body.0.weight",
            "body.0.bias",
            "body.2.weight",
            "body.2.bias",
            "2.weight",
            "2.bias",
            "body.2.running_mean",
            "body.2.running_var",
            "body.2.num_batches_tracked"
        ]
    );
    assert_eq!(
        model.forward(&Tensor::randn([5, 2], dev)?)?.shape(),
        &[5, 1]
    );
    model.to_empty(dev)?;
    model.reset_parameters()?;
    assert_eq!(vals(&model.named_buffers()[1].1), [1.0; 4]);
    for bad in ["", "a.b", "stem", "7"] {
        let err = nn::Sequential::new()
            .add_named("stem", nn::ReLU)?
            .add_named(bad, nn::ReLU)
            .err()
            .unwrap_or_else(|| panic!("{bad:?} was accepted"));
        assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
    }

    // Conv2d without bias: the weight is drawn as with a bias
    ember::manual_seed(12);
    let with = nn::Conv2d::new(3, 4, 3, Conv2dOptions::default(), dev)?;
    ember::manual_seed(12);
    let mut without = nn::Conv2d::with_bias(3, 4, 3, false, Conv2dOptions::default(), dev)?;
    assert_eq!(vals(&with.weight), vals(&without.weight));
    assert_eq!(names(&without), ["weight"]);
    let x = Tensor::randn([2, 3, 5, 5], dev)?;
    let want = x.conv2d(&without.weight, None, Conv2dOptions::default())?;
    assert_eq!(vals(&without.forward(&x)?), vals(&want));
    without.to_empty(&Device::Meta)?;
    assert!(without.bias.is_none() && without.weight.device() == Device::Meta);
    without.to_empty(dev)?;
    without.reset_parameters()?;
    assert!(vals(&without.weight)
        .iter()
        .all(|v| v.abs() <= 1.0 / 27f64.sqrt()));
    assert!(without.weight.requires_grad());

    // AdaptiveAvgPool2d: errors rather than panics
    let pool = |o| nn::AdaptiveAvgPool2d::new(o);
    let x = Tensor::randn([1, 2, 4, 4], dev)?;
    for (o, what) in [((0, 2), "must be positive"), ((2, 0), "must be positive")] {
        let err = pool(o).forward(&x).unwrap_err();
        assert!(err.to_string().contains(what), "{err}");
    }
    let err = pool((2, 2))
        .forward(&Tensor::randn([4, 4], dev)?)
        .unwrap_err();
    assert!(err.to_string().contains("3-D or 4-D"), "{err}");
    let err = pool((1, 1))
        .forward(&Tensor::zeros([1, 2, 3, 0], DType::F32, dev)?)
        .unwrap_err();
    assert!(err.to_string().contains("[1, 2, 3, 0]"), "{err}");
    // the gradient of a global pool spreads evenly
    let x = Tensor::randn([2, 3, 5, 5], dev)?.requires_grad_(true)?;
    pool((1, 1)).forward(&x)?.sum_all()?.backward()?;
    assert_close(&vals(&x.grad().unwrap()), &[1.0 / 25.0; 150], 1e-6, 1e-7);
    Ok(())
}

/// `Module::to_dtype` (`module.to(dtype)`): floating-point parameters and buffers
/// convert, integer buffers stay, parameters stay leaves; the model then trains in
/// that dtype; integer targets are refused.
fn modules_convert_to_another_dtype(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    ember::manual_seed(5);
    let mut model = nn::Sequential::new()
        .add(nn::Conv2d::new(1, 2, 3, Conv2dOptions::default(), dev)?)
        .add(nn::BatchNorm2d::new(2, dev)?)
        .add(nn::ReLU)
        .add(nn::Flatten::default())
        .add(nn::LazyLinear::new(3, dev));
    let before = model.state_dict();
    model.to_dtype(DType::BF16)?;
    for ((name, old), (_, new)) in before.iter().zip(model.state_dict().iter()) {
        let want = if name.ends_with("num_batches_tracked") {
            DType::I64
        } else {
            DType::BF16
        };
        assert_eq!(new.dtype(), want, "{name}");
        assert_eq!(vals(new), vals(&old.to_dtype(want)?), "{name}");
        assert_eq!(new.requires_grad(), old.requires_grad(), "{name}");
        assert_eq!(new.device(), *dev, "{name}");
    }
    // the lazy layer, made at the first forward, is made in bfloat16
    let x = Tensor::randn([4, 1, 5, 5], dev)?.to_dtype(DType::BF16)?;
    let y = Tensor::from_slice(&[0i64, 1, 2, 1], [4], dev)?;
    let loss = nn::cross_entropy(&model.forward(&x)?, &y)?;
    assert_eq!(loss.dtype(), DType::BF16);
    loss.backward()?;
    for (name, p) in model.named_parameters() {
        assert_eq!(p.dtype(), DType::BF16, "{name}");
        assert_eq!(p.grad().map(|g| g.dtype()), Some(DType::BF16), "{name}");
    }
    // back to float32 (the values bfloat16 kept), and refusals
    model.to_dtype(DType::F32)?;
    assert!(model.parameters().iter().all(|p| p.dtype() == DType::F32));
    for bad in [DType::I64, DType::U8, DType::Bool] {
        let err = model.to_dtype(bad).unwrap_err();
        assert!(err.to_string().contains("floating-point"), "{err}");
        let mut relu = nn::ReLU;
        assert!(relu.to_dtype(bad).is_err());
    }
    assert!(model.parameters().iter().all(|p| p.dtype() == DType::F32));
    Ok(())
}

/// The character corpus encodes, splits and batches a text (targets are the
/// next characters), its unigram baseline is the cross-entropy of the validation
/// text under the training text's frequencies; the character GPT gives logits of
/// the right shape, refuses over-long inputs, learns a repetitive text, and
/// generates deterministically at temperature 0.
#[test]
fn char_corpus_and_gpt() -> Result<()> {
    use ember::data::{CharCorpus, Split};
    use ember::models::{CharGpt, GptConfig};
    let _g = super::rng_lock();
    ember::manual_seed(4);
    let dev = Device::Cpu;
    let text = "abcab".repeat(40);
    let c = CharCorpus::new(&text, 0.25)?;
    assert_eq!(c.vocab(), ['a', 'b', 'c']);
    assert_eq!(
        (c.ids(Split::Train).len(), c.ids(Split::Val).len()),
        (150, 50)
    );
    assert_eq!(c.decode(&c.encode("cab")?)?, "cab");
    assert!(c.encode("d").is_err() && c.decode(&[3]).is_err());
    let (x, y) = c.batch(Split::Train, 5, 7, &dev)?;
    assert_eq!((x.shape(), y.shape()), (&[5, 7][..], &[5, 7][..]));
    let (xv, yv) = (x.to_vec2::<i64>()?, y.to_vec2::<i64>()?);
    for (a, b) in xv.iter().zip(&yv) {
        assert_eq!(&a[1..], &b[..6], "targets are the next characters");
    }
    // frequencies 2/5, 2/5, 1/5 (add-one smoothing changes them slightly)
    let p: [f64; 3] = [61.0 / 153.0, 61.0 / 153.0, 31.0 / 153.0];
    let want = -(20.0 * p[0].ln() + 20.0 * p[1].ln() + 10.0 * p[2].ln()) / 50.0;
    assert!((c.unigram_loss() - want).abs() < 1e-12);
    assert!(c.batch(Split::Val, 1, 50, &dev).is_err());
    assert!(CharCorpus::new("x", 1.0).is_err());

    let config = GptConfig {
        vocab_size: 3,
        context: 8,
        layers: 1,
        heads: 2,
        width: 16,
        dropout: 0.0,
    };
    let mut m = CharGpt::new(config, &dev)?;
    assert_eq!(m.logits(&x)?.shape(), &[5, 7, 3]);
    assert!(m.logits(&Tensor::zeros([1, 9], DType::I64, &dev)?).is_err());
    let params = m.parameters();
    let mut opt = ember::optim::Adam::adamw(params, 1e-2)?;
    let first = m.loss(&x, &y)?.item::<f32>()?;
    for _ in 0..60 {
        let (x, y) = c.batch(Split::Train, 8, 8, &dev)?;
        let loss = m.loss(&x, &y)?;
        opt.zero_grad();
        loss.backward()?;
        opt.step()?;
    }
    let last = m.loss(&x, &y)?.item::<f32>()?;
    assert!(
        last < 0.3 * first,
        "the period-5 text is learned: {first} -> {last}"
    );
    m.eval();
    // "bcab" occurs once in the period "abcab": what follows is determined
    let a = m.generate(&c.encode("bcab")?, 10, 0.0, None)?;
    assert_eq!(c.decode(&a)?, "abcababcab", "the most likely continuation");
    assert_eq!(m.generate(&c.encode("bcab")?, 10, 0.0, Some(1))?, a);
    // a temperature so small that the logits over it overflow is greedy too,
    // not NaN probabilities
    for t in [1e-40, 5e-324] {
        assert_eq!(m.generate(&c.encode("bcab")?, 10, t, None)?, a, "{t}");
    }
    assert_eq!(m.generate(&c.encode("ab")?, 12, 1.0, Some(2))?.len(), 12);
    assert!(m.generate(&[], 3, 1.0, None).is_err());
    Ok(())
}

/// ModuleList and ModuleDict name their children's parameters as PyTorch's do,
/// move and convert them, switch them to evaluation, and have no forward.
#[test]
fn module_list_and_dict() -> Result<()> {
    let _rng = super::rng_lock();
    let dev = Device::Cpu;
    let mut list: nn::ModuleList = (0..3)
        .map(|_| nn::Linear::new(4, 4, &dev))
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .collect();
    list.push(nn::Dropout::new(0.5)?);
    assert_eq!(list.len(), 4);
    let names: Vec<String> = list
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        names,
        ["0.weight", "0.bias", "1.weight", "1.bias", "2.weight", "2.bias"]
    );
    let x = Tensor::randn([2, 4], &dev)?;
    let mut h = x.clone();
    for m in list.iter() {
        h = m.forward(&h)?;
    }
    assert_eq!(h.shape(), &[2, 4]);
    assert_eq!(list[1].forward(&x)?.shape(), &[2, 4]);
    assert!(list
        .forward(&x)
        .unwrap_err()
        .to_string()
        .contains("no forward"));
    list.eval();
    assert_eq!(
        vals(&list[3].forward(&x)?),
        vals(&x),
        "dropout off in evaluation"
    );
    list.to_dtype(DType::F64)?;
    assert!(list
        .parameters()
        .iter()
        .all(|p| p.dtype() == DType::F64 && p.requires_grad()));

    let mut dict = nn::ModuleDict::new();
    dict.insert("encoder", nn::Linear::new(4, 8, &dev)?)?;
    dict.insert("norm", nn::LayerNorm::new(&[8], &dev)?)?;
    assert!(dict.insert("a.b", nn::ReLU).is_err() && dict.insert("", nn::ReLU).is_err());
    let keys: Vec<&str> = dict.keys().collect();
    assert_eq!(keys, ["encoder", "norm"]);
    let names: Vec<String> = dict
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        names,
        ["encoder.weight", "encoder.bias", "norm.weight", "norm.bias"]
    );
    dict.insert("encoder", nn::Linear::with_bias(4, 8, false, &dev)?)?;
    assert_eq!(dict.len(), 2);
    assert_eq!(dict.named_parameters().len(), 3, "replaced in place");
    let y = dict
        .get("norm")
        .unwrap()
        .forward(&dict.get("encoder").unwrap().forward(&x)?)?;
    assert_eq!(y.shape(), &[2, 8]);
    assert!(dict.get("decoder").is_none());
    assert!(dict.forward(&x).is_err());
    dict.to_empty(&Device::Meta)?;
    assert!(dict.parameters().iter().all(|p| p.device() == Device::Meta));
    Ok(())
}

/// The sequence modules' default initialisation is PyTorch's: attention's packed
/// input projection Xavier-uniform over `[3E, E]` with zero biases, its output
/// projection `Linear`'s Kaiming-uniform bound `1/sqrt(E)` with a zero bias, and
/// every LSTM/GRU parameter uniform in `±1/sqrt(hidden)`. Checked by the bound
/// (no value past it, the largest near it) and the variance of a uniform
/// (`bound²/3`, within 10% where there are thousands of draws).
#[test]
fn sequence_modules_initialise_like_pytorch() -> Result<()> {
    let _g = super::rng_lock();
    ember::manual_seed(7);
    let dev = Device::Cpu;
    let uniform = |what: &str, t: &Tensor, bound: f64| {
        let v = vals(t);
        let max = v.iter().fold(0f64, |m, x| m.max(x.abs()));
        assert!(
            max <= bound && max > 0.95 * bound,
            "{what}: max |w| {max}, bound {bound}"
        );
        // the variance where there are enough draws to pin it (not the biases' 128)
        if v.len() >= 1000 {
            let var = v.iter().map(|x| x * x).sum::<f64>() / v.len() as f64;
            let want = bound * bound / 3.0;
            assert!(
                (var / want - 1.0).abs() < 0.1,
                "{what}: variance {var}, want {want}"
            );
        }
    };
    let zeros = |what: &str, t: &Tensor| assert!(vals(t).iter().all(|&x| x == 0.0), "{what}");
    let (e, h) = (64usize, 32usize);
    let m = nn::MultiheadAttention::new(e, 4, &dev)?;
    assert_eq!(m.in_proj_weight.shape(), &[3 * e, e]);
    uniform(
        "in_proj_weight",
        &m.in_proj_weight,
        (6.0 / (4 * e) as f64).sqrt(),
    );
    zeros("in_proj_bias", m.in_proj_bias.as_ref().expect("a bias"));
    uniform(
        "out_proj.weight",
        &m.out_proj.weight,
        1.0 / (e as f64).sqrt(),
    );
    zeros("out_proj.bias", m.out_proj.bias.as_ref().expect("a bias"));
    let bound = 1.0 / (h as f64).sqrt();
    for (kind, params) in [
        ("LSTM", nn::LSTM::new(16, h, &dev)?.named_parameters()),
        ("GRU", nn::GRU::new(16, h, &dev)?.named_parameters()),
    ] {
        assert_eq!(params.len(), 4, "{kind}");
        for (name, p) in params {
            uniform(&format!("{kind}.{name}"), &p, bound);
        }
    }
    Ok(())
}

/// `scaled_dot_product_attention` on one path: the output and the gradients of
/// q, k and v for the upstream gradient `up`, the memory-saving path in groups of
/// at most 1000 scores.
fn attention_on(
    path: ember::nn::functional::AttentionPath,
    qkv: &[Tensor; 3],
    mask: Option<&Tensor>,
    dropout_p: f64,
    up: &Tensor,
) -> Result<Vec<Tensor>> {
    attention_in_groups_of(1000, path, qkv, mask, dropout_p, up)
}

/// [`attention_on`] with groups of at most `scores` scores.
fn attention_in_groups_of(
    scores: usize,
    path: ember::nn::functional::AttentionPath,
    qkv: &[Tensor; 3],
    mask: Option<&Tensor>,
    dropout_p: f64,
    up: &Tensor,
) -> Result<Vec<Tensor>> {
    let leaves: Vec<Tensor> = qkv
        .iter()
        .map(|t| t.detach().requires_grad_(true))
        .collect::<Result<_>>()?;
    use ember::nn::functional::{with_attention_group_scores, with_attention_path};
    let out = with_attention_group_scores(scores, || {
        with_attention_path(path, || {
            nn::scaled_dot_product_attention(
                &leaves[0], &leaves[1], &leaves[2], mask, dropout_p, false, None,
            )
        })
    })?;
    out.mul(up)?.sum_all()?.backward()?;
    let mut v = vec![out.detach()];
    v.extend(leaves.iter().map(|t| t.grad().expect("a gradient")));
    Ok(v)
}

/// The memory-saving attention against the plain path where it cuts the batch
/// into several groups (length 8 by 16 makes 128 scores a head: 7 heads in a
/// group of 1000 scores), across the second batch dim and unevenly (2 × 12
/// heads: groups of 7 and 5): broadcast bool and float masks are sliced per group, a mask that
/// blocks whole rows gives zeros, and bfloat16 inputs (computed in float32)
/// land within bfloat16's rounding of float32's result.
fn memory_saving_attention_matches_across_groups(dev: &Device) -> Result<()> {
    use ember::nn::functional::AttentionPath;
    let _g = super::rng_lock();
    ember::manual_seed(3);
    let (l, s) = (8, 16);
    let qkv = [
        Tensor::randn([2, 12, l, 3], dev)?,
        Tensor::randn([2, 12, s, 3], dev)?,
        Tensor::randn([2, 12, s, 2], dev)?,
    ];
    let up = Tensor::randn([2, 12, l, 2], dev)?;
    // keys allowed per sample; a float bias per head (broadcast over the batch
    // and the queries); rows blocked whole in some heads
    let keys = Tensor::rand([2, 1, 1, s], dev)?.ge(0.3)?;
    let per_head = Tensor::randn([12, 1, s], dev)?;
    let rows = Tensor::rand([2, 12, l, 1], dev)?.ge(0.1)?;
    for (what, mask) in [
        ("no mask", None),
        ("keys [2, 1, 1, S]", Some(keys)),
        ("float [12, 1, S]", Some(per_head)),
        ("rows [2, 12, L, 1]", Some(rows.clone())),
    ] {
        let want = attention_on(AttentionPath::Math, &qkv, mask.as_ref(), 0.0, &up)?;
        let got = attention_on(
            AttentionPath::MemoryEfficient,
            &qkv,
            mask.as_ref(),
            0.0,
            &up,
        )?;
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let (g, w) = (vals(g), vals(w));
            assert!(
                g.iter().all(|x| x.is_finite()),
                "{what}: output {i} not finite"
            );
            assert_close(&g, &w, 1e-4, 1e-5);
        }
    }
    // a blocked row's output is zeros on both paths
    let out = attention_on(AttentionPath::MemoryEfficient, &qkv, Some(&rows), 0.0, &up)?;
    let blocked = rows
        .logical_not()?
        .expand([2, 12, l, 2])?
        .to_dtype(DType::F32)?;
    assert!(vals(&blocked).contains(&1.0));
    assert_eq!(vals(&out[0].mul(&blocked)?.abs()?.sum_all()?), [0.0]);
    // bfloat16: the saving path computes in float32 and rounds once
    let half: Vec<Tensor> = qkv
        .iter()
        .map(|t| t.to_dtype(DType::BF16))
        .collect::<Result<_>>()?;
    let half = [half[0].clone(), half[1].clone(), half[2].clone()];
    let exact: Vec<Tensor> = half
        .iter()
        .map(|t| t.to_dtype(DType::F32))
        .collect::<Result<_>>()?;
    let exact = [exact[0].clone(), exact[1].clone(), exact[2].clone()];
    let keys = Tensor::rand([2, 1, 1, s], dev)?.ge(0.3)?;
    let want = attention_on(AttentionPath::Math, &exact, Some(&keys), 0.0, &up)?;
    let got = attention_on(
        AttentionPath::MemoryEfficient,
        &half,
        Some(&keys),
        0.0,
        &up.to_dtype(DType::BF16)?,
    )?;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.dtype(), DType::BF16, "result {i}");
        assert_close(&vals(g), &vals(w), 2e-2, 2e-2);
    }
    Ok(())
}

/// Dropout on the memory-saving path: with `v` extended by the identity the
/// output's last `S` columns are the dropped weights themselves, which shows the
/// mask drawn; the output and every gradient match plain attention with that
/// mask (so the backward draws the same masks again, group by group: 2 × 6 heads
/// of 20 × 20 make groups of 2 in 1000 scores), about `p` of the weights are dropped,
/// a second call draws other masks, and the same seed the same ones.
fn memory_saving_attention_dropout_redraws_its_masks(dev: &Device) -> Result<()> {
    use ember::nn::functional::AttentionPath;
    let _g = super::rng_lock();
    ember::manual_seed(4);
    let (n, h, l, ev, p) = (2, 6, 20, 2, 0.25);
    let eye = Tensor::eye(l, DType::F32, dev)?.expand([n, h, l, l])?;
    let v = Tensor::cat(&[&Tensor::randn([n, h, l, ev], dev)?, &eye], 3)?;
    let qkv = [
        Tensor::randn([n, h, l, 4], dev)?,
        Tensor::randn([n, h, l, 4], dev)?,
        v,
    ];
    // only the first `ev` columns carry a gradient
    let up = Tensor::cat(
        &[
            &Tensor::randn([n, h, l, ev], dev)?,
            &Tensor::zeros([n, h, l, l], DType::F32, dev)?,
        ],
        3,
    )?;
    // groups of whole rows (1000 scores), then rows cut into blocks of 5 queries
    // (100 scores), whose masks are drawn block by block
    for scores in [1000, 100] {
        ember::manual_seed(40);
        let got =
            attention_in_groups_of(scores, AttentionPath::MemoryEfficient, &qkv, None, p, &up)?;
        let dropped = got[0].narrow(3, ev as i64, l)?;
        let kept = dropped.ne(0.0)?;
        let frac = 1.0 - vals(&kept.to_dtype(DType::F64)?.mean_all()?)[0];
        // 4800 weights: the fraction's deviation is 0.006
        assert!(
            (frac - p).abs() < 0.03,
            "dropped {frac} of the weights, p = {p}"
        );
        // each group draws its own masks (heads 0 and 2 are in different groups)
        assert_ne!(
            vals(&kept.narrow(1, 0, 1)?.to_dtype(DType::F32)?),
            vals(&kept.narrow(1, 2, 1)?.to_dtype(DType::F32)?)
        );
        // the plain computation with that mask
        let leaves: Vec<Tensor> = qkv
            .iter()
            .map(|t| t.detach().requires_grad_(true))
            .collect::<Result<_>>()?;
        let w = leaves[0]
            .mul(0.5)?
            .matmul(&leaves[1].transpose(2, 3)?)?
            .softmax(-1)?;
        let wd = w.mul(&kept.to_dtype(DType::F32)?.mul(1.0 / (1.0 - p))?)?;
        let out = wd.matmul(&leaves[2])?;
        out.mul(&up)?.sum_all()?.backward()?;
        let mut want = vec![out.detach()];
        want.extend(leaves.iter().map(|t| t.grad().expect("a gradient")));
        for (g, w) in got.iter().zip(&want) {
            assert_close(&vals(g), &vals(w), 1e-4, 1e-5);
        }
        // a second call draws other masks; the same seed the same ones
        let again =
            attention_in_groups_of(scores, AttentionPath::MemoryEfficient, &qkv, None, p, &up)?;
        assert_ne!(vals(&again[0]), vals(&got[0]));
        ember::manual_seed(40);
        let same =
            attention_in_groups_of(scores, AttentionPath::MemoryEfficient, &qkv, None, p, &up)?;
        for (a, b) in same.iter().zip(&got) {
            assert_eq!(vals(a), vals(b));
        }
    }
    Ok(())
}

/// Rows whose scores exceed the group budget are cut into blocks of queries (so
/// that memory grows linearly with the length): 8 queries by 16 keys a head, in
/// groups of 40 scores (blocks of 2 queries) and 48 (blocks of 3, 3 and 2). The
/// output and every gradient match the plain path, with masks that vary along the
/// queries (a causal mask, rows blocked whole) or not (keys per sample), and the
/// keys' and values' gradients summed over the blocks.
fn memory_saving_attention_cuts_long_rows_into_query_blocks(dev: &Device) -> Result<()> {
    use ember::nn::functional::AttentionPath;
    let _g = super::rng_lock();
    ember::manual_seed(9);
    let (l, s) = (8, 16);
    let qkv = [
        Tensor::randn([2, 3, l, 4], dev)?,
        Tensor::randn([2, 3, s, 4], dev)?,
        Tensor::randn([2, 3, s, 2], dev)?,
    ];
    let up = Tensor::randn([2, 3, l, 2], dev)?;
    let keys = Tensor::rand([2, 1, 1, s], dev)?.ge(0.3)?;
    let rows = Tensor::rand([2, 3, l, 1], dev)?.ge(0.2)?;
    // query i sees keys up to i + 8 (a causal mask over a cache of 8 earlier keys)
    let causal = Tensor::ones([l, s], DType::Bool, dev)?.tril(8)?;
    for scores in [40, 48] {
        for (what, mask) in [
            ("no mask", None),
            ("keys [2, 1, 1, S]", Some(&keys)),
            ("rows [2, 3, L, 1]", Some(&rows)),
            ("causal [L, S]", Some(&causal)),
        ] {
            let want = attention_on(AttentionPath::Math, &qkv, mask, 0.0, &up)?;
            let got = attention_in_groups_of(
                scores,
                AttentionPath::MemoryEfficient,
                &qkv,
                mask,
                0.0,
                &up,
            )?;
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.shape(), w.shape(), "{what}: result {i}");
                let (g, w) = (vals(g), vals(w));
                assert!(
                    g.iter().all(|x| x.is_finite()),
                    "{what}: result {i} not finite"
                );
                assert_close(&g, &w, 1e-4, 1e-5);
            }
        }
    }
    Ok(())
}

/// A float mask that is -inf over a whole row of scores: that query's output and
/// the gradients it sends are zeros on both paths, as PyTorch 2.15 gives on the
/// CPU (its safe softmax), not NaN. The mask needs no gradient here, so that the
/// memory-saving path takes it (the golden cases give it one, which sends them
/// down the plain path).
fn float_mask_blocking_a_whole_row_gives_zeros(dev: &Device) -> Result<()> {
    use ember::nn::functional::AttentionPath;
    let _g = super::rng_lock();
    ember::manual_seed(5);
    let qkv = [
        Tensor::randn([2, 3, 4], dev)?,
        Tensor::randn([2, 5, 4], dev)?,
        Tensor::randn([2, 5, 2], dev)?,
    ];
    let up = Tensor::randn([2, 3, 2], dev)?;
    let mut m = vec![0f32; 2 * 3 * 5];
    m[5..10].fill(f32::NEG_INFINITY); // batch 0, query 1
    m[15 + 2] = f32::NEG_INFINITY; // one key of batch 1, query 0
    let mask = Tensor::from_vec(m, [2, 3, 5], dev)?;
    let plain = attention_on(AttentionPath::Math, &qkv, Some(&mask), 0.0, &up)?;
    let saving = attention_on(AttentionPath::MemoryEfficient, &qkv, Some(&mask), 0.0, &up)?;
    for (what, p, s) in [
        ("out", &plain[0], &saving[0]),
        ("dq", &plain[1], &saving[1]),
    ] {
        let (p, s) = (vals(p), vals(s));
        assert!(p.iter().chain(&s).all(|x| x.is_finite()), "{what}: no NaN");
        // query 1 of batch 0: zeros
        let width = p.len() / 6;
        assert!(
            p[width..2 * width].iter().all(|&x| x == 0.0),
            "{what} plain: {p:?}"
        );
        assert!(
            s[width..2 * width].iter().all(|&x| x == 0.0),
            "{what} saving: {s:?}"
        );
        assert_close(&s, &p, 1e-4, 1e-5);
    }
    for i in [2, 3] {
        assert_close(&vals(&saving[i]), &vals(&plain[i]), 1e-4, 1e-5);
    }
    Ok(())
}

/// Whether `dev` runs the fused attention kernels in f16/bf16 (CUDA: compute
/// capability 8.0 or later, the simulator's 9.0 included; the CPU only when
/// `AttentionPath::Fused` asks for it).
fn runs_fused_kernels(dev: &Device) -> bool {
    match dev {
        Device::Cuda(i) => ember::cuda::device_properties(*i)
            .map(|p| p.compute_capability.0 >= 8)
            .unwrap_or(false),
        _ => false,
    }
}

/// The attention path a fused test asks for: the fused op on the CPU (whose
/// default is the plain path), the device's own choice on a GPU.
fn fused_path(dev: &Device) -> ember::nn::functional::AttentionPath {
    use ember::nn::functional::AttentionPath;
    if dev.is_cpu() {
        AttentionPath::Fused
    } else {
        AttentionPath::Auto
    }
}

/// Whether the fused op runs for head dim `d` in `dt` on `dev` on the path the
/// tests ask for (`Fused` on the CPU, `Auto` on GPUs: kernels for f16/bf16 and
/// float32 at the head dims the tests use, multiples of 8 up to 128).
fn fused_expected(dev: &Device, dt: DType, d: usize) -> bool {
    let kernels_take =
        matches!(dt, DType::F16 | DType::BF16 | DType::F32) && d.is_multiple_of(8) && d <= 128;
    dev.is_cpu() || (runs_fused_kernels(dev) && kernels_take)
}

/// The fused op's error against the float32 plain path, relative to the values'
/// scale: half precision rounds the weights and the scores' gradient once.
fn fused_tolerance(dt: DType) -> f64 {
    match dt {
        DType::BF16 => 2e-2,
        DType::F16 => 4e-3,
        _ => 1e-5,
    }
}

/// Asserts that the fused op ran where [`fused_expected`] says it does, and
/// that its results `got` (output and gradients, in `dt`) agree with `want`
/// (the plain path in float32) within [`fused_tolerance`].
#[track_caller]
fn assert_fused_results(
    what: &str,
    (got, fused): (&[Tensor], bool),
    want: &[Tensor],
    (dev, dt, d): (&Device, DType, usize),
) {
    assert_eq!(
        fused,
        fused_expected(dev, dt, d),
        "{what}: whether the fused op ran"
    );
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.shape(), w.shape(), "{what}: result {i}");
        assert_eq!(g.dtype(), dt, "{what}: result {i}");
        within_scale(g, w, fused_tolerance(dt), &format!("{what}: result {i}"));
    }
}

/// Asserts that `got` differs from `want` by at most `tol` times `want`'s largest
/// magnitude anywhere (half-precision attention rounds its weights once, so
/// errors scale with the values, not elementwise), with NaN in the same places.
#[track_caller]
fn within_scale(got: &Tensor, want: &Tensor, tol: f64, what: &str) {
    let (g, w) = (vals(got), vals(want));
    assert_eq!(g.len(), w.len(), "{what}: sizes");
    if let Some(i) = (0..g.len()).find(|&i| g[i].is_nan() != w[i].is_nan()) {
        panic!("{what}: element {i} is {} where {} is expected", g[i], w[i]);
    }
    let scale = w.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let err = g
        .iter()
        .zip(&w)
        .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        err <= tol * scale,
        "{what} differs by {err} (largest value {scale})"
    );
}

/// `(out, dq, dk, dv)` of attention over `qkv` (fresh leaves) on `path`, with the
/// output's gradient `up` (`[B, L, H, d]` when `transposed`: the gradient then
/// reaches attention as a transposed view), and whether the fused primitive ran.
fn attention_grads(
    path: ember::nn::functional::AttentionPath,
    qkv: &[Tensor; 3],
    causal: bool,
    (up, transposed): (&Tensor, bool),
) -> Result<(Vec<Tensor>, bool)> {
    let leaves: Vec<Tensor> = qkv
        .iter()
        .map(|t| t.detach().requires_grad_(true))
        .collect::<Result<_>>()?;
    let (out, prof) = ember::profiler::profile(|| {
        let out = ember::nn::functional::with_attention_path(path, || {
            nn::scaled_dot_product_attention(
                &leaves[0], &leaves[1], &leaves[2], None, 0.0, causal, None,
            )
        })?;
        let seen = if transposed {
            out.transpose(1, 2)?
        } else {
            out.clone()
        };
        seen.mul(up)?.sum_all()?.backward()?;
        Ok(out)
    })?;
    let fused = super::this_threads_count(&prof, "attention") > 0;
    let mut v = vec![out.detach()];
    v.extend(leaves.iter().map(|t| t.grad().expect("a gradient")));
    Ok((v, fused))
}

/// q, k and v `[B, H, T, d]` with `l` queries and `s` keys: transposed views of
/// `[B, T, H, d]` tensors, as attention modules make them, or (`packed`, where
/// `l == s`) slices of one `[B, T, 3, H, d]` projection, which start at an
/// offset; made from `base` (the same, in float32) in `dtype`.
fn attention_operands(base: &[Tensor; 3], packed: bool, dtype: DType) -> Result<[Tensor; 3]> {
    if packed {
        let all = Tensor::stack(&[&base[0], &base[1], &base[2]], 0)?;
        // [3, B, H, T, d] -> [B, T, 3, H, d], contiguous in the dtype
        let p = all
            .permute([1, 3, 0, 2, 4])?
            .to_dtype(dtype)?
            .contiguous()?;
        let part = |i: i64| p.select(2, i)?.transpose(1, 2);
        Ok([part(0)?, part(1)?, part(2)?])
    } else {
        let cast = |t: &Tensor| -> Result<Tensor> {
            t.transpose(1, 2)?
                .to_dtype(dtype)?
                .contiguous()?
                .transpose(1, 2)
        };
        Ok([cast(&base[0])?, cast(&base[1])?, cast(&base[2])?])
    }
}

/// The fused attention (FlashAttention's algorithm: tensor-core kernels for
/// f16/bf16 on CUDA, a row at a time on the CPU) against the plain path in
/// float32 on the same values: causal or not, queries longer or shorter than the
/// keys, lengths that end mid-tile, tiles all of whose pairs are visible (which
/// skip the test per score), head dims of both kernels (40 and 64 on the
/// 64-wide one, 96 and 128 on the 128-wide one), operands that are transposed
/// views or slices of one packed projection (read in place, at an offset), and
/// an output gradient that arrives as a transposed view. Output and the three
/// gradients agree within the dtype's rounding (float32's too: its kernels split
/// each product into three tf32 ones); `Auto` takes the fused op for f16/bf16
/// and float32 on GPUs of compute capability 8.0 or later,
/// and `Fused` on the CPU for every float dtype.
fn fused_attention_matches_the_plain_path(dev: &Device) -> Result<()> {
    use ember::nn::functional::AttentionPath;
    let (_turn, _g) = (super::profile_turn(), super::rng_lock());
    ember::manual_seed(21);
    let dtypes: &[DType] = if dev.is_cpu() {
        &[DType::F32, DType::BF16]
    } else {
        &[DType::BF16, DType::F16, DType::F32]
    };
    let path = fused_path(dev);
    let cases = [
        (2, 3, 70, 70, 64, false),
        // causal tiles every pair of which is visible (from 64 queries on)
        (1, 1, 150, 150, 64, false),
        (1, 2, 45, 77, 40, false),
        (2, 1, 80, 33, 96, false),
        (1, 2, 66, 66, 128, true),
    ];
    for &(b, h, l, s, d, packed) in &cases {
        for causal in [false, true] {
            let base = [
                Tensor::randn([b, h, l, d], dev)?,
                Tensor::randn([b, h, s, d], dev)?,
                Tensor::randn([b, h, s, d], dev)?,
            ];
            let up = if packed {
                Tensor::randn([b, l, h, d], dev)?
            } else {
                Tensor::randn([b, h, l, d], dev)?
            };
            for &dt in dtypes {
                let what = format!(
                    "{dt} [{b}, {h}, {l}, {d}] x {s} keys, causal {causal}, packed {packed}"
                );
                let qkv = attention_operands(&base, packed, dt)?;
                // the plain path in float32 on the same (rounded) values
                let exact = attention_operands(&base, packed, DType::F32)?;
                let exact = [
                    exact[0].to_dtype(DType::F32)?,
                    exact[1].to_dtype(DType::F32)?,
                    exact[2].to_dtype(DType::F32)?,
                ];
                let exact = if dt == DType::F32 {
                    exact
                } else {
                    [
                        qkv[0].to_dtype(DType::F32)?,
                        qkv[1].to_dtype(DType::F32)?,
                        qkv[2].to_dtype(DType::F32)?,
                    ]
                };
                let want = attention_grads(AttentionPath::Math, &exact, causal, (&up, packed))?.0;
                let (got, fused) =
                    attention_grads(path, &qkv, causal, (&up.to_dtype(dt)?, packed))?;
                assert_fused_results(&what, (&got, fused), &want, (dev, dt, d));
            }
        }
    }
    Ok(())
}

/// Cross-entropy on f16/bf16 logits outside autocast (no class weights, no
/// smoothing) runs the fused op: one pass over the logits each way, no
/// `log_softmax` and no log-probabilities of the logits' size. It gives what
/// PyTorch's half-precision `log_softmax` and `nll_loss` give (written out here
/// op by op): each row's log-probabilities rounded to the dtype, the target's
/// picked and negated, a mean summed in float32 and rounded once; the logits'
/// gradient that of `log_softmax`'s backward from the rounded log-probabilities.
/// The two may sum a row's exponentials in different orders (the CPU's do not),
/// so a log-probability near a tie may round the other way in either: every
/// gradient within 8 units in the last place of the dtype, and at most 1% of
/// them different at all (leaving the log-probabilities unrounded changes most
/// of them). Rows wider than a
/// block, an ignored target, every reduction; and a float16 mean whose sum
/// passes float16's largest value (4096 rows of loss 31: PyTorch's 31.1, where
/// a sum in float16 would be inf).
fn half_cross_entropy_runs_fused_as_the_composite_rounds(dev: &Device) -> Result<()> {
    let (_turn, _g) = (super::profile_turn(), super::rng_lock());
    ember::manual_seed(3);
    let base = Tensor::randn([7, 1500], dev)?.mul(3.0)?;
    let t = Tensor::new([4i64, 1499, -100, 0, 750, 3, 1], dev)?;
    let up_rows = Tensor::randn([7], dev)?;
    for dt in [DType::BF16, DType::F16] {
        // a unit in the last place, relative
        let ulp = if dt == DType::BF16 {
            1.0 / 128.0
        } else {
            1.0 / 1024.0
        };
        for red in [Reduction::Mean, Reduction::Sum, Reduction::None] {
            let what = format!("{dt} {red:?}");
            let up = if red == Reduction::None {
                up_rows.to_dtype(dt)?
            } else {
                Tensor::ones(Vec::<usize>::new(), dt, dev)?
            };
            let opts = nn::LossOptions {
                reduction: red,
                ..nn::LossOptions::default()
            };
            let x = base.to_dtype(dt)?.requires_grad_(true)?;
            let (loss, prof) = ember::profiler::profile(|| {
                let loss = nn::cross_entropy_opts(&x, &t, opts)?;
                loss.backward_with(&up)?;
                Ok(loss)
            })?;
            assert!(
                super::this_threads_count(&prof, "cross_entropy") > 0,
                "{what}: fused"
            );
            assert_eq!(super::this_threads_count(&prof, "log_softmax"), 0, "{what}");
            assert_eq!(loss.dtype(), dt, "{what}");
            // PyTorch's half kernels, op by op
            let xr = base.to_dtype(dt)?.requires_grad_(true)?;
            let logp = xr.log_softmax(-1)?;
            let valid = t.ne(-100)?;
            let picked = logp
                .gather(1, &valid.where_(&t, 0i64)?.unsqueeze(1)?)?
                .squeeze(1)?
                .neg()?
                .masked_fill(&valid.logical_not()?, 0.0)?;
            let want = match red {
                Reduction::Mean => picked
                    .to_dtype(DType::F32)?
                    .sum_all()?
                    .div(&valid.to_dtype(DType::F32)?.sum_all()?)?
                    .to_dtype(dt)?,
                Reduction::Sum => picked.sum_all()?,
                Reduction::None => picked,
            };
            want.backward_with(&up)?;
            assert_close(&vals(&loss), &vals(&want), 2.0 * ulp, 1e-6);
            let (g, w) = (
                vals(&x.grad().expect("a gradient")),
                vals(&xr.grad().expect("a gradient")),
            );
            // a gradient of about 1/1500 beside one of about -1 in each row: ulps
            // of each element's own size, and of the row's largest
            let beyond = |k: f64| {
                g.iter()
                    .zip(&w)
                    .filter(|(a, b)| (*a - *b).abs() > k * ulp * (b.abs() + 2e-3))
                    .count()
            };
            assert_eq!(beyond(8.0), 0, "{what}: gradients beyond 8 ulps");
            let differ = g.iter().zip(&w).filter(|(a, b)| a != b).count();
            assert!(
                differ * 100 <= g.len(),
                "{what}: {differ} of {} gradients differ",
                g.len()
            );
        }
    }
    // float16's mean over rows whose losses sum past 65504
    let rows = 4096;
    let wide: Vec<f32> = (0..rows * 4)
        .map(|i| if i % 4 == 0 { -30.0 } else { 0.0 })
        .collect();
    let x = Tensor::new(wide, dev)?.reshape([rows, 4])?;
    let y = Tensor::zeros([rows], DType::I64, dev)?;
    let got = nn::cross_entropy(&x.to_dtype(DType::F16)?, &y)?;
    let want = nn::cross_entropy(&x, &y)?.item::<f32>()?;
    assert!((31.0..31.2).contains(&want), "{want}");
    let got = got.to_dtype(DType::F32)?.item::<f32>()?;
    assert!(
        (got - want).abs() <= want / 1024.0,
        "float16 mean {got}, want {want}"
    );
    // the same rows as [1, 4, 4096]: PyTorch's half nll_loss2d sums in the
    // dtype, inf past 65504
    let spatial = x.to_dtype(DType::F16)?.t()?.unsqueeze(0)?;
    let got = nn::cross_entropy(&spatial, &y.unsqueeze(0)?)?;
    assert!(got.item::<f32>()?.is_infinite(), "{got:?}");
    Ok(())
}

/// Cross-entropy and `nll_loss` on half inputs with class weights or label
/// smoothing (the composite path) sum a mean's or sum's losses and weights in
/// float32 and round once, as PyTorch's CUDA `nll_loss` does (its CPU kernel
/// sums in the dtype: float16 is inf past 65504 there): 2048 rows of loss about
/// 13.3 at a class weight of 3 sum to about 82000, and their mean is the float32
/// loss of the same half values within two roundings. A sum past 65504 is inf,
/// as is label smoothing's term, which PyTorch sums in the dtype, and a mean
/// over `[N, C, d]`, which PyTorch's `nll_loss2d` sums in the dtype.
fn half_weighted_cross_entropy_sums_in_float32(dev: &Device) -> Result<()> {
    let rows = 2048;
    let wide: Vec<f32> = (0..rows * 4)
        .map(|i| match i % 4 {
            0 => -12.0,
            1 => 0.5,
            _ => 0.0,
        })
        .collect();
    let x = Tensor::new(wide, dev)?.reshape([rows, 4])?;
    let y = Tensor::zeros([rows], DType::I64, dev)?;
    let w = Tensor::new([3.0f32, 1.0, 2.0, 0.5], dev)?;
    let ulp = 1.0 / 1024.0;
    for (red, smoothing) in [
        (Reduction::Mean, 0.0),
        (Reduction::Mean, 0.1),
        (Reduction::Sum, 0.0),
    ] {
        let what = format!("{red:?} smoothing {smoothing}");
        let opts = |weight| nn::LossOptions {
            weight,
            reduction: red,
            label_smoothing: smoothing,
            ..nn::LossOptions::default()
        };
        let xh = x.to_dtype(DType::F16)?;
        let wh = w.to_dtype(DType::F16)?;
        let got = nn::cross_entropy_opts(&xh, &y, opts(Some(&wh)))?;
        assert_eq!(got.dtype(), DType::F16, "{what}");
        let got = got.to_dtype(DType::F32)?.item::<f32>()? as f64;
        let want = nn::cross_entropy_opts(&xh.to_dtype(DType::F32)?, &y, opts(Some(&w)))?
            .item::<f32>()? as f64;
        if red == Reduction::Sum || smoothing > 0.0 {
            // float16's largest is 65504: a sum past it is inf in PyTorch too,
            // and so is smoothing's, which PyTorch sums in the dtype (each row's
            // term holds the row's loss: it passes 65504 where theirs does)
            let total = if red == Reduction::Sum {
                want
            } else {
                // smoothing's sum over rows and classes of the weighted
                // negated log-probabilities
                let lp = xh.to_dtype(DType::F32)?.log_softmax(-1)?;
                lp.mul(&w)?.sum_all()?.neg()?.item::<f32>()? as f64
            };
            assert!(
                got.is_infinite() && total > 65504.0,
                "{what}: {got}, {want}"
            );
            continue;
        }
        assert!((13.0..13.6).contains(&want), "{what}: {want}");
        assert!(
            (got - want).abs() <= 2.0 * ulp * want,
            "{what}: float16 {got}, float32 {want}"
        );
        // nll_loss on the same log-probabilities; as [1, 4, 2048], summed in
        // the dtype as PyTorch's nll_loss2d: inf
        if smoothing == 0.0 {
            let spatial = xh.t()?.unsqueeze(0)?;
            let s = nn::cross_entropy_opts(&spatial, &y.unsqueeze(0)?, opts(Some(&wh)))?;
            assert!(s.item::<f32>()?.is_infinite(), "{what} spatial: {s:?}");
            let lp = xh.log_softmax(-1)?;
            let lw = nn::LossOptions {
                weight: Some(&wh),
                ..nn::LossOptions::default()
            };
            let got = nn::nll_loss_opts(&lp, &y, lw)?
                .to_dtype(DType::F32)?
                .item::<f32>()? as f64;
            assert!(
                (got - want).abs() <= 2.0 * ulp * want,
                "nll_loss: float16 {got}, float32 {want}"
            );
        }
    }
    Ok(())
}

/// Layer norm and RMS norm on f16/bf16 rows with parameters of their dtype run
/// the half kernels (no cast of the rows), and give the float32 route's bits:
/// the rows and parameters cast to float32, normalised and weighted there and
/// the result cast back once, in the output and in every gradient (input,
/// weight, bias). Rows wider than a CUDA block's register cache, rows whose
/// length is not a multiple of the CPU's 8 lanes, and tensors large enough for
/// the CPU's parallel paths are normalised the same way.
fn half_norms_give_the_float32_routes_bits(dev: &Device) -> Result<()> {
    let (_turn, _g) = (super::profile_turn(), super::rng_lock());
    ember::manual_seed(11);
    for (rows, cols) in [(5, 96), (5, 77), (5, 3000), (40, 2000)] {
        let x = Tensor::randn([rows, cols], dev)?.mul(2.0)?.add(0.5)?;
        let w = Tensor::randn([cols], dev)?;
        let b = Tensor::randn([cols], dev)?;
        let up = Tensor::randn([rows, cols], dev)?;
        for dt in [DType::BF16, DType::F16] {
            for rms in [false, true] {
                let what = format!("{dt} rms {rms} cols {cols}");
                let leaf = |t: &Tensor| t.to_dtype(dt)?.requires_grad_(true);
                let (xh, wh, bh) = (leaf(&x)?, leaf(&w)?, leaf(&b)?);
                let (xr, wr, br) = (leaf(&x)?, leaf(&w)?, leaf(&b)?);
                let f32_ = |t: &Tensor| t.to_dtype(DType::F32);
                let uph = up.to_dtype(dt)?;
                let (got, prof) = ember::profiler::profile(|| {
                    let y = if rms {
                        nn::rms_norm(&xh, &[cols], Some(&wh), None)?
                    } else {
                        nn::layer_norm(&xh, &[cols], Some(&wh), Some(&bh), 1e-5)?
                    };
                    y.backward_with(&uph)?;
                    Ok(y)
                })?;
                // the rows are never cast
                assert_eq!(super::this_threads_count(&prof, "to_dtype"), 0, "{what}");
                let want = if rms {
                    nn::rms_norm(&f32_(&xr)?, &[cols], Some(&f32_(&wr)?), None)?.to_dtype(dt)?
                } else {
                    nn::layer_norm(
                        &f32_(&xr)?,
                        &[cols],
                        Some(&f32_(&wr)?),
                        Some(&f32_(&br)?),
                        1e-5,
                    )?
                    .to_dtype(dt)?
                };
                want.backward_with(&uph)?;
                assert_eq!(got.dtype(), dt, "{what}");
                assert_eq!(super::bits(&got)?, super::bits(&want)?, "{what}: output");
                let grads = if rms {
                    vec![(&xh, &xr), (&wh, &wr)]
                } else {
                    vec![(&xh, &xr), (&wh, &wr), (&bh, &br)]
                };
                for (i, (a, b)) in grads.into_iter().enumerate() {
                    let (a, b) = (a.grad().expect("a gradient"), b.grad().expect("a gradient"));
                    assert_eq!(a.dtype(), dt, "{what}: gradient {i}");
                    assert_eq!(super::bits(&a)?, super::bits(&b)?, "{what}: gradient {i}");
                }
            }
        }
    }
    Ok(())
}

/// A GPT-style encoder given the causal mask with the `is_causal` hint gives what
/// it gives reading the mask. On GPUs of compute capability 8.0 or later both
/// run the fused op (with the hint its causal form, which skips the hidden key
/// tiles; without it the mask as an additive bias); on the CPU both take the
/// plain path.
fn fused_attention_takes_the_causal_hint_of_an_encoder(dev: &Device) -> Result<()> {
    let (_turn, _g) = (super::profile_turn(), super::rng_lock());
    ember::manual_seed(5);
    let opts = nn::TransformerOptions {
        dim_feedforward: 64,
        dropout: 0.0,
        batch_first: true,
        norm_first: true,
        ..Default::default()
    };
    let layer = nn::TransformerEncoderLayer::new(32, 2, opts, dev)?;
    let mut enc = nn::TransformerEncoder::new(layer, 2, None)?;
    let dt = if dev.is_cpu() {
        DType::F32
    } else {
        DType::BF16
    };
    enc.to_dtype(dt)?;
    let x = Tensor::randn([2, 24, 32], dev)?.to_dtype(dt)?;
    let mask = Tensor::ones([24, 24], DType::Bool, dev)?.triu(1)?;
    let (masked, p1) = ember::profiler::profile(|| enc.forward_masked(&x, Some(&mask), None))?;
    let (hinted, p2) = ember::profiler::profile(|| enc.forward_with(&x, Some(&mask), None, true))?;
    for p in [p1, p2] {
        assert_eq!(
            super::this_threads_count(&p, "attention") > 0,
            runs_fused_kernels(dev)
        );
    }
    let tol = if dt == DType::BF16 { 3e-2 } else { 1e-5 };
    assert_close(&vals(&hinted), &vals(&masked), tol, tol);
    // the hint needs the mask, as in PyTorch
    assert!(enc.forward_with(&x, None, None, true).is_err());
    Ok(())
}

/// The fused op's dropout (`dropout_p` > 0): with the identity as `v` its output
/// is the kept weights themselves (`w · z`, z 0 or `1 / (1 - p)`), which gives the
/// mask a seed draws; with that mask, the plain computation `(w ∘ z) · v` in
/// float32 has the fused op's output and gradients (forward and backward drop
/// the same weights), about `1 - p` of the weights are kept, and another seed
/// drops others. Without a mask, causal, and with a bool mask (the bias and the
/// dropout together).
/// On the CPU in float32 (`AttentionPath::Fused`), on GPUs in bf16 and float32.
fn fused_attention_drops_the_same_weights_forward_and_backward(dev: &Device) -> Result<()> {
    use ember::nn::functional::AttentionPath;
    let _g = super::rng_lock();
    if dev.is_cpu() {
        return dropout_matches_its_mask(dev, DType::F32, AttentionPath::Fused);
    }
    if !runs_fused_kernels(dev) {
        eprintln!("skipped: this GPU does not run the fused kernels");
        return Ok(());
    }
    dropout_matches_its_mask(dev, DType::BF16, AttentionPath::Auto)?;
    dropout_matches_its_mask(dev, DType::F32, AttentionPath::Auto)
}

/// [`fused_attention_drops_the_same_weights_forward_and_backward`] in `dt` on
/// `path`.
fn dropout_matches_its_mask(
    dev: &Device,
    dt: DType,
    path: ember::nn::functional::AttentionPath,
) -> Result<()> {
    use ember::nn::functional::with_attention_path;
    let (b, h, l, s, d, p) = (1, 2, 24, 40, 64, 0.3);
    ember::manual_seed(4);
    let q = Tensor::randn([b, h, l, d], dev)?.to_dtype(dt)?;
    let k = Tensor::randn([b, h, s, d], dev)?.to_dtype(dt)?;
    let v = Tensor::randn([b, h, s, d], dev)?.to_dtype(dt)?;
    let up = Tensor::randn([b, h, l, d], dev)?;
    // v = the identity (s rows of d columns): the output's row i is weight row i
    let eye = Tensor::eye(d, DType::F32, dev)?
        .narrow(0, 0, s)?
        .expand([b, h, s, d])?
        .to_dtype(dt)?
        .contiguous()?;
    // a bool mask (true allows) that leaves every query some keys
    let allow: Vec<bool> = (0..l * s)
        .map(|n| ((n / s) * 7 + (n % s) * 3) % 5 != 0)
        .collect();
    let allow = Tensor::from_vec(allow, [l, s], dev)?;
    let fused = |v: &Tensor, p: f64, seed: u64, (causal, masked): (bool, bool)| -> Result<Tensor> {
        ember::manual_seed(seed);
        let mask = masked.then_some(&allow);
        with_attention_path(path, || {
            nn::scaled_dot_product_attention(&q, &k, v, mask, p, causal, None)
        })
    };
    for (causal, masked) in [(false, false), (true, false), (false, true)] {
        let what = format!("{dt}, causal {causal}, masked {masked}");
        let causal = (causal, masked);
        let weights = fused(&eye, 0.0, 0, causal)?
            .narrow(3, 0, s)?
            .to_dtype(DType::F32)?;
        let kept = fused(&eye, p, 77, causal)?
            .narrow(3, 0, s)?
            .to_dtype(DType::F32)?;
        // z where a weight is positive (all of them but the causal mask's)
        let seen = weights.gt(0.0)?;
        let z = kept.gt(0.0)?.to_dtype(DType::F32)?.mul(1.0 / (1.0 - p))?;
        let n_seen = seen.to_dtype(DType::F32)?.sum_all()?.item::<f32>()? as f64;
        let n_kept = kept
            .gt(0.0)?
            .to_dtype(DType::F32)?
            .sum_all()?
            .item::<f32>()? as f64;
        assert!(
            (n_kept / n_seen - (1.0 - p)).abs() < 0.05,
            "{what}: kept {n_kept} of {n_seen}"
        );
        // the kept weights are the weights times 1 / (1 - p)
        let want_kept = vals(&weights.mul(&z)?);
        let tol = if dt == DType::BF16 { 2e-2 } else { 1e-5 };
        assert_close(&vals(&kept), &want_kept, tol, tol * 0.1);
        // another seed drops other weights
        let other = fused(&eye, p, 78, causal)?.narrow(3, 0, s)?.gt(0.0)?;
        assert!(
            other.ne(&kept.gt(0.0)?)?.any_all()?.item::<bool>()?,
            "{what}: same mask"
        );
        // the plain (w ∘ z) · v with that mask against the fused op, gradients too
        // fresh float32 leaves (a float32 input's to_dtype is the input itself)
        let leaves: Vec<Tensor> = [&q, &k, &v]
            .iter()
            .map(|t| t.to_dtype(DType::F32)?.detach().requires_grad_(true))
            .collect::<Result<_>>()?;
        let scores = leaves[0]
            .matmul(&leaves[1].transpose(-2, -1)?)?
            .mul(1.0 / (d as f64).sqrt())?;
        let scores = match causal {
            (true, _) => {
                let blocked = Tensor::ones([l, s], DType::Bool, dev)?.triu(1)?;
                scores.masked_fill(&blocked, f64::NEG_INFINITY)?
            }
            (_, true) => scores.masked_fill(&allow.logical_not()?, f64::NEG_INFINITY)?,
            _ => scores,
        };
        let want = scores.softmax(-1)?.mul(&z)?.matmul(&leaves[2])?;
        want.mul(&up)?.sum_all()?.backward()?;
        let got_leaves: Vec<Tensor> = [&q, &k, &v]
            .iter()
            .map(|t| t.detach().requires_grad_(true))
            .collect::<Result<_>>()?;
        ember::manual_seed(77);
        let got = with_attention_path(path, || {
            nn::scaled_dot_product_attention(
                &got_leaves[0],
                &got_leaves[1],
                &got_leaves[2],
                causal.1.then_some(&allow),
                p,
                causal.0,
                None,
            )
        })?;
        got.mul(&up.to_dtype(dt)?)?.sum_all()?.backward()?;
        let pairs = [
            (got.detach(), want.detach()),
            (got_leaves[0].grad().unwrap(), leaves[0].grad().unwrap()),
            (got_leaves[1].grad().unwrap(), leaves[1].grad().unwrap()),
            (got_leaves[2].grad().unwrap(), leaves[2].grad().unwrap()),
        ];
        for (i, (g, w)) in pairs.iter().enumerate() {
            within_scale(g, w, 2.0 * tol, &format!("{what}: result {i}"));
        }
    }
    Ok(())
}

/// SDPA's masks in the fused op (an additive bias read where it lies, broadcast
/// dims included): a bool `[L, S]` mask (`true` allows) with a query that may
/// see no key, a float `[B, 1, L, S]` mask with `-inf` and finite entries, and a
/// key-padding bool `[B, 1, 1, S]` mask; against the plain path in float32 on
/// the same values, output and the gradients of q, k and v within the dtype's
/// rounding, and zeros (output and dq) for the query that sees no key. Lengths
/// end mid-tile. `Auto` takes the fused op on GPUs of compute capability 8.0 or
/// later in f16/bf16/f32, `Fused` on the CPU.
fn fused_attention_takes_masks(dev: &Device) -> Result<()> {
    use ember::nn::functional::{with_attention_path, AttentionPath};
    let (_turn, _g) = (super::profile_turn(), super::rng_lock());
    ember::manual_seed(31);
    let (dtypes, path): (&[DType], _) = if dev.is_cpu() {
        (&[DType::F32, DType::BF16], AttentionPath::Fused)
    } else {
        (&[DType::BF16, DType::F16, DType::F32], AttentionPath::Auto)
    };
    let (b, h, l, s) = (2, 2, 37, 70);
    let blocked_row = 5;
    let allow: Vec<bool> = (0..l * s)
        .map(|n| (n / s) != blocked_row && ((n / s) * 7 + (n % s) * 3) % 5 != 0)
        .collect();
    let allow = Tensor::from_vec(allow, [l, s], dev)?;
    let additive: Vec<f32> = (0..b * l * s)
        .map(|n| match n % 11 {
            0 => f32::NEG_INFINITY,
            k => k as f32 * 0.1 - 0.5,
        })
        .collect();
    let additive = Tensor::from_vec(additive, [b, 1, l, s], dev)?;
    let padding: Vec<bool> = (0..b * s).map(|n| n % s < s - 9 * (n / s + 1)).collect();
    let padding = Tensor::from_vec(padding, [b, 1, 1, s], dev)?;
    let run = |path: AttentionPath, qkv: &[Tensor], mask: &Tensor, up: &Tensor| {
        let leaves: Vec<Tensor> = qkv
            .iter()
            .map(|t| t.detach().requires_grad_(true))
            .collect::<Result<_>>()?;
        let (out, prof) = ember::profiler::profile(|| {
            let out = with_attention_path(path, || {
                nn::scaled_dot_product_attention(
                    &leaves[0],
                    &leaves[1],
                    &leaves[2],
                    Some(mask),
                    0.0,
                    false,
                    None,
                )
            })?;
            out.mul(up)?.sum_all()?.backward()?;
            Ok(out)
        })?;
        let fused = super::this_threads_count(&prof, "attention") > 0;
        let mut v = vec![out.detach()];
        v.extend(leaves.iter().map(|t| t.grad().expect("a gradient")));
        Ok::<_, ember::Error>((v, fused))
    };
    // head dims of both kernel widths
    for (d, &dt) in [32, 128]
        .into_iter()
        .flat_map(|d| dtypes.iter().map(move |t| (d, t)))
    {
        let base = [
            Tensor::randn([b, h, l, d], dev)?,
            Tensor::randn([b, h, s, d], dev)?,
            Tensor::randn([b, h, s, d], dev)?,
        ];
        let up = Tensor::randn([b, h, l, d], dev)?;
        let qkv: Vec<Tensor> = base.iter().map(|t| t.to_dtype(dt)).collect::<Result<_>>()?;
        let exact: Vec<Tensor> = qkv
            .iter()
            .map(|t| t.to_dtype(DType::F32))
            .collect::<Result<_>>()?;
        for (name, mask) in [
            ("bool", &allow),
            ("float", &additive),
            ("padding", &padding),
        ] {
            let what = format!("{dt}, d {d}, {name} mask");
            let m = if mask.dtype() == DType::Bool {
                mask.clone()
            } else {
                mask.to_dtype(dt)?
            };
            let (want, _) = run(AttentionPath::Math, &exact, mask, &up)?;
            let (got, fused) = run(path, &qkv, &m, &up.to_dtype(dt)?)?;
            assert_fused_results(&what, (&got, fused), &want, (dev, dt, d));
            for (i, g) in got.iter().enumerate() {
                assert!(
                    vals(g).iter().all(|x| x.is_finite()),
                    "{what}: result {i} finite"
                );
            }
            if name == "bool" {
                // the query that sees no key: zeros out, no gradient
                for (i, t) in [(0, &got[0]), (1, &got[1])] {
                    let row = t.narrow(2, blocked_row as i64, 1)?;
                    assert!(
                        vals(&row).iter().all(|&x| x == 0.0),
                        "{what}: result {i} of the blocked query"
                    );
                }
            }
        }
    }
    Ok(())
}

/// The fused op's masks at the corners, against the plain path (`Math`) on the
/// same values: queries of rank 2, 3 and 5 (the bias folded with them), a float
/// mask whose every entry for one query is its dtype's lowest value (uniform
/// weights there, as PyTorch's, not zeros), a NaN in one query (NaN in its row
/// of the output, not zeros), and a mask that would widen the scores (not fused,
/// computed as the plain path does).
fn fused_attention_keeps_the_corners_of_masks(dev: &Device) -> Result<()> {
    use ember::nn::functional::{with_attention_path, AttentionPath};
    let (_turn, _g) = (super::profile_turn(), super::rng_lock());
    ember::manual_seed(12);
    let path = fused_path(dev);
    let (l, s, d) = (9, 13, 16);
    let allow: Vec<bool> = (0..l * s).map(|n| (n / s + 2 * (n % s)) % 3 != 0).collect();
    let allow = Tensor::from_vec(allow, [l, s], dev)?;
    let sdpa = |path: AttentionPath, qkv: &[Tensor; 3], mask: &Tensor| -> Result<(Tensor, bool)> {
        let (out, prof) = ember::profiler::profile(|| {
            with_attention_path(path, || {
                nn::scaled_dot_product_attention(
                    &qkv[0],
                    &qkv[1],
                    &qkv[2],
                    Some(mask),
                    0.0,
                    false,
                    None,
                )
            })
        })?;
        Ok((out, super::this_threads_count(&prof, "attention") > 0))
    };
    let fused_runs = dev.is_cpu() || runs_fused_kernels(dev);
    let check = |what: &str,
                 qkv: [Tensor; 3],
                 mask: &Tensor,
                 fused_expected: bool,
                 tol: f64|
     -> Result<Tensor> {
        let (got, fused) = sdpa(path, &qkv, mask)?;
        let (want, _) = sdpa(AttentionPath::Math, &qkv, mask)?;
        assert_eq!(fused, fused_expected, "{what}: whether the fused op ran");
        within_scale(&got, &want, tol, what);
        Ok(got)
    };
    let qkv = |batch: &[usize], dt: DType| -> Result<[Tensor; 3]> {
        let shape = |rows: usize| [batch, &[rows, d][..]].concat();
        Ok([
            Tensor::randn(&shape(l)[..], dev)?.to_dtype(dt)?,
            Tensor::randn(&shape(s)[..], dev)?.to_dtype(dt)?,
            Tensor::randn(&shape(s)[..], dev)?.to_dtype(dt)?,
        ])
    };
    // ranks 2, 3 and 5, the mask broadcast over the batch dims
    check("rank 2", qkv(&[], DType::F32)?, &allow, fused_runs, 1e-5)?;
    check("rank 3", qkv(&[3], DType::F32)?, &allow, fused_runs, 1e-5)?;
    let padding: Vec<bool> = (0..2 * s).map(|n| n % s < s - 4 * (n / s + 1)).collect();
    let padding = Tensor::from_vec(padding, [2, 1, 1, 1, s], dev)?;
    check(
        "rank 5",
        qkv(&[2, 3, 2], DType::F32)?,
        &padding,
        fused_runs,
        1e-5,
    )?;
    // a query whose keys all carry the dtype's lowest value: uniform weights
    for (dt, tol) in [(DType::F32, 1e-5), (DType::BF16, 2e-2)] {
        let lowest = if dt == DType::F32 {
            f32::MIN as f64
        } else {
            -3.3895313892515355e38
        };
        let mut m = vec![0f32; l * s];
        m[2 * s..3 * s].fill(lowest as f32);
        m[5 * s + 1] = f32::NEG_INFINITY;
        let m = Tensor::from_vec(m, [l, s], dev)?.to_dtype(dt)?;
        let got = check(
            &format!("{dt} lowest values"),
            qkv(&[2, 2], dt)?,
            &m,
            fused_runs,
            tol,
        )?;
        assert!(
            vals(&got.narrow(2, 2, 1)?).iter().any(|&x| x != 0.0),
            "{dt}: the query of lowest values gets uniform weights, not zeros"
        );
    }
    // a NaN in one query: its output row is NaN (within_scale checks the places)
    let [q, k, v] = qkv(&[2], DType::F32)?;
    let mut qv = q.to_vec::<f32>()?;
    qv[4 * d] = f32::NAN;
    let q = Tensor::from_vec(qv, [2, l, d], dev)?;
    let got = check("a NaN query", [q, k, v], &allow, fused_runs, 1e-5)?;
    assert!(vals(&got.narrow(1, 4, 1)?.narrow(0, 0, 1)?)
        .iter()
        .all(|x| x.is_nan()));
    // a mask with more batch than the queries: the plain path's broadcast
    let wide = allow.unsqueeze(0)?.expand([2, l, s])?.contiguous()?;
    check(
        "a widening mask",
        qkv(&[1], DType::F32)?,
        &wide,
        false,
        1e-5,
    )?;
    Ok(())
}

/// `MultiheadAttention` with a key padding mask and a bool attention mask, or
/// the causal mask with the `is_causal` hint (no weights asked for), takes the
/// fused op where it runs and gives what its computation written out with
/// tensor ops gives (PyTorch's conventions: true hides a key) and what the
/// plain and the memory-saving paths give, its input's gradient too; a query
/// that the masks leave with no key gets the output projection's bias (zeros
/// from attention), as PyTorch's module does without weights (checked there by
/// hand: PyTorch 2.15 gives the bias in training mode, NaN with weights).
fn fused_attention_serves_multihead_attention_with_masks(dev: &Device) -> Result<()> {
    use ember::nn::functional::{with_attention_path, AttentionPath};
    let (_turn, _g) = (super::profile_turn(), super::rng_lock());
    ember::manual_seed(8);
    let (n, t, e, heads) = (2, 21, 32, 4);
    let mha = nn::MultiheadAttention::with_options(e, heads, 0.0, true, true, dev)?;
    // an output bias that is not zero, so that the query with no key shows it
    let out_bias = mha.out_proj.bias.as_ref().expect("a bias");
    ember::no_grad(|| out_bias.copy_(&Tensor::randn([e], dev)?))?;
    let x = Tensor::randn([n, t, e], dev)?;
    // batch 1 pads its last 6 positions; query 3 is allowed no key
    let kpm: Vec<bool> = (0..n * t).map(|i| i / t == 1 && i % t >= t - 6).collect();
    let kpm = Tensor::from_vec(kpm, [n, t], dev)?;
    let am: Vec<bool> = (0..t * t)
        .map(|i| i / t == 3 || (i % t) > (i / t) + 4)
        .collect();
    let am = Tensor::from_vec(am, [t, t], dev)?;
    let causal = Tensor::ones([t, t], DType::Bool, dev)?.triu(1)?;
    let run = |path: AttentionPath, mask: &Tensor, is_causal: bool| {
        let x = x.detach().requires_grad_(true)?;
        let (out, prof) = ember::profiler::profile(|| {
            let opts = nn::AttentionOptions {
                key_padding_mask: Some(&kpm),
                attn_mask: Some(mask),
                need_weights: false,
                is_causal,
                ..Default::default()
            };
            let out = with_attention_path(path, || mha.attend(&x, &x, &x, opts))?.0;
            out.sum_all()?.backward()?;
            Ok(out)
        })?;
        let fused = super::this_threads_count(&prof, "attention") > 0;
        Ok::<_, ember::Error>((out, x.grad().expect("a gradient"), fused))
    };
    // the module's computation written out with tensor ops: PyTorch's masks
    // (true hides a key), a query with no key zeros before the output projection
    let reference = |mask: &Tensor| -> Result<Tensor> {
        let d = e / heads;
        let w = &mha.in_proj_weight;
        let bi = mha.in_proj_bias.as_ref().expect("an input bias");
        let proj = |i: i64| -> Result<Tensor> {
            let (at, len) = (i * e as i64, e);
            x.matmul(&w.narrow(0, at, len)?.t()?)?
                .add(&bi.narrow(0, at, len)?)?
                .reshape([n, t, heads, d])?
                .transpose(1, 2)
        };
        let (q, k, v) = (proj(0)?, proj(1)?, proj(2)?);
        let hidden = mask.logical_or(&kpm.reshape([n, 1, 1, t])?)?;
        let w = q
            .matmul(&k.transpose(-2, -1)?)?
            .mul(1.0 / (d as f64).sqrt())?
            .masked_fill(&hidden, f64::NEG_INFINITY)?
            .softmax(-1)?;
        let w = w.masked_fill(&w.isnan()?, 0.0)?;
        let heads_out = w.matmul(&v)?.transpose(1, 2)?.reshape([n, t, e])?;
        mha.out_proj.forward(&heads_out)
    };
    let path = fused_path(dev);
    for (mask, is_causal) in [(&am, false), (&causal, true)] {
        let what = if is_causal {
            "causal hint"
        } else {
            "attention mask"
        };
        let (out, dx, fused) = run(path, mask, is_causal)?;
        assert_eq!(fused, dev.is_cpu() || runs_fused_kernels(dev), "{what}");
        let want = ember::no_grad(|| reference(mask))?;
        within_scale(
            &out,
            &want,
            1e-5,
            &format!("{what}: output against the reference"),
        );
        for other in [AttentionPath::Math, AttentionPath::MemoryEfficient] {
            let (want, want_dx, _) = run(other, mask, is_causal)?;
            within_scale(
                &out,
                &want,
                1e-5,
                &format!("{what}: output against {other:?}"),
            );
            within_scale(
                &dx,
                &want_dx,
                1e-5,
                &format!("{what}: the input's gradient against {other:?}"),
            );
        }
        if !is_causal {
            // the query with no key: its heads are zeros, so the output is the bias
            for i in 0..n as i64 {
                let row = out.narrow(0, i, 1)?.narrow(1, 3, 1)?.reshape([e])?;
                within_scale(&row, out_bias, 1e-6, "the query with no key");
            }
        }
    }
    Ok(())
}

/// `MultiheadAttention` over one input (`attend(x, x, x)`, no weights asked
/// for, as the transformer layers call it) projects it once with the packed
/// weight, as PyTorch's module does, and its fused op writes the three
/// gradients into the projection's one gradient: no zeros to fill, no slices to
/// copy. It gives what three projections give (an input passed as three
/// handles): the output and the gradients of the input and the parameters, in
/// float32 and bfloat16, batch first or not, with the causal hint (not with
/// dropout: two runs draw the same masks only if no other test draws from the
/// global generator between them, and the unseeded tests do; the packed
/// gradients' places are the same with dropout); the fused output lies with
/// its heads inside its rows, as PyTorch's fused kernels return it.
fn multihead_self_attention_projects_once(dev: &Device) -> Result<()> {
    use ember::nn::functional::{with_attention_path, AttentionPath};
    let _turn = super::profile_turn();
    let _rng = super::rng_lock();
    let path = fused_path(dev);
    let (n, t, heads) = (2, 19, 4);
    // (dtype, batch first, causal, unbatched, head dim)
    for (dt, batch_first, causal, unbatched, d) in [
        (DType::F32, true, false, false, 8),
        (DType::F32, false, true, false, 8),
        (DType::BF16, true, true, false, 8),
        (DType::F32, false, false, true, 8),
        // a head dim the CUDA kernels do not take (the CPU's fused op does)
        (DType::F32, true, false, false, 6),
    ] {
        let what = format!(
            "{dt}, batch first {batch_first}, causal {causal}, unbatched {unbatched}, head dim {d}"
        );
        if !fused_expected(dev, dt, d) {
            eprintln!("skipped on {dev}: {what}: the fused op does not run there");
            continue;
        }
        let e = heads * d;
        let mut mha = nn::MultiheadAttention::with_options(e, heads, 0.0, true, batch_first, dev)?;
        mha.to_dtype(dt)?;
        let shape = match (unbatched, batch_first) {
            (true, _) => vec![t, e],
            (false, true) => vec![n, t, e],
            (false, false) => vec![t, n, e],
        };
        let shape = &shape[..];
        let x0 = Tensor::randn(shape, dev)?.to_dtype(dt)?;
        let up = Tensor::randn(shape, dev)?.to_dtype(dt)?;
        let mask = Tensor::ones([t, t], DType::Bool, dev)?.triu(1)?;
        // `packed`: one handle three times; else three handles on the input
        let run_on = |packed: bool, path| -> Result<(Vec<Tensor>, ember::profiler::Profile)> {
            for p in mha.parameters() {
                p.zero_grad();
            }
            let x = x0.detach().requires_grad_(true)?;
            let (k, v) = if packed {
                (x.clone(), x.clone())
            } else {
                (x.view(shape)?, x.view(shape)?)
            };
            let opts = nn::AttentionOptions {
                attn_mask: causal.then_some(&mask),
                is_causal: causal,
                ..Default::default()
            };
            attend_grads(&mha, [&x, &k, &v], &[&x], (&up, opts, path))
        };
        let run = |packed: bool| run_on(packed, path);
        let (got, prof) = run(true)?;
        let (want, want_prof) = run(false)?;
        let count = |prof: &ember::profiler::Profile, op: &str| super::this_threads_count(prof, op);
        assert!(count(&prof, "attention") > 0, "{what}: the fused op ran");
        // one product forward for the in-projection and the out-projection each
        assert_eq!(
            count(&prof, "addmm") + count(&prof, "mm"),
            2 + 4,
            "{what}: products"
        );
        // the narrowed weight's and bias's gradients fill zeros and copy into
        // them, three times each; the packed projection's do not (the fill
        // left is the backward's seed)
        assert_eq!(
            count(&prof, "fill") + 6,
            count(&want_prof, "fill"),
            "{what}: fills"
        );
        assert_eq!(count(&prof, "copy_"), 0, "{what}: copies into slices");
        // the heads come out in place and the projection's gradient comes
        // back laid out as the projection, batch first or sequence first; a
        // sequence-first output's gradient reaches the output projection
        // transposed, and is copied there (PyTorch copies the heads forward).
        // (Parts of a projection whose head dim is not whole 16 bytes are
        // copied for the kernels' loads, on the CPU too: not counted.)
        if d % 8 == 0 {
            let copies = if batch_first || unbatched { 0 } else { 1 };
            assert_eq!(count(&prof, "copy"), copies, "{what}: copies");
        }
        // where the fused op does not run, the projections stay apart: a
        // packed projection's parts would each fill a zero gradient of it
        let (_, other) = run_on(true, AttentionPath::MemoryEfficient)?;
        let (_, want_other) = run_on(false, AttentionPath::MemoryEfficient)?;
        assert_eq!(
            count(&other, "attention"),
            0,
            "{what}: the memory-saving path"
        );
        for op in ["fill", "copy_", "addmm", "mm"] {
            let (a, b) = (count(&other, op), count(&want_other, op));
            assert_eq!(a, b, "{what}: {op} on the memory-saving path");
        }
        let names = ["output", "input's gradient", "in_proj_weight's gradient"];
        same_results(&got, &want, &names, dt, &what);
    }
    // the fused op's output lies as [N, L, H, d]: its heads joined back are a view
    let q = Tensor::randn([2, 4, 16, 8], dev)?;
    let out = with_attention_path(path, || {
        nn::scaled_dot_product_attention(&q, &q, &q, None, 0.0, false, None)
    })?;
    assert!(
        out.transpose(1, 2)?.is_contiguous(),
        "the heads inside the rows"
    );
    Ok(())
}

/// `MultiheadAttention` whose key and value are one input (`attend(x, m, m)`,
/// as a decoder layer attends to its memory; PyTorch's `key is value`)
/// projects the keys and values in one product with their part of the packed
/// weight, and its fused op writes their gradients into that projection's one
/// gradient. It gives what three projections give (the memory passed as two
/// handles): the output and the gradients of both inputs and the parameters,
/// in float32 and bfloat16, batch first or not, with more queries than keys.
fn multihead_cross_attention_projects_keys_and_values_once(dev: &Device) -> Result<()> {
    let _turn = super::profile_turn();
    let _rng = super::rng_lock();
    let path = fused_path(dev);
    let (n, t, s, heads, d) = (2, 19, 11, 4, 8);
    let e = heads * d;
    for (dt, batch_first) in [(DType::F32, true), (DType::F32, false), (DType::BF16, true)] {
        let what = format!("{dt}, batch first {batch_first}");
        if !fused_expected(dev, dt, d) {
            eprintln!("skipped on {dev}: {what}: the fused op does not run there");
            continue;
        }
        let mut mha = nn::MultiheadAttention::with_options(e, heads, 0.0, true, batch_first, dev)?;
        mha.to_dtype(dt)?;
        let (xs, ms) = if batch_first {
            ([n, t, e], [n, s, e])
        } else {
            ([t, n, e], [s, n, e])
        };
        let x0 = Tensor::randn(xs, dev)?.to_dtype(dt)?;
        let m0 = Tensor::randn(ms, dev)?.to_dtype(dt)?;
        let up = Tensor::randn(xs, dev)?.to_dtype(dt)?;
        // `packed`: the memory's one handle as key and value; else two handles
        let run = |packed: bool| -> Result<(Vec<Tensor>, ember::profiler::Profile)> {
            for p in mha.parameters() {
                p.zero_grad();
            }
            let x = x0.detach().requires_grad_(true)?;
            let m = m0.detach().requires_grad_(true)?;
            let v = if packed { m.clone() } else { m.view(ms)? };
            let opts = nn::AttentionOptions::default();
            attend_grads(&mha, [&x, &m, &v], &[&x, &m], (&up, opts, path))
        };
        let (got, prof) = run(true)?;
        let (want, want_prof) = run(false)?;
        let count = |prof: &ember::profiler::Profile, op: &str| super::this_threads_count(prof, op);
        assert!(count(&prof, "attention") > 0, "{what}: the fused op ran");
        // forward: the queries', the keys' and values', the output's products;
        // two each backward (three projections: four, and eight backward)
        let products = |p| count(p, "addmm") + count(p, "mm");
        assert_eq!(products(&prof), 3 + 6, "{what}: products");
        assert_eq!(
            products(&want_prof),
            4 + 8,
            "{what}: three projections' products"
        );
        // the weight and the bias in two parts fill and copy twice each, in
        // three parts three times each
        assert_eq!(
            count(&prof, "fill") + 2,
            count(&want_prof, "fill"),
            "{what}: fills"
        );
        assert_eq!(
            count(&prof, "copy_") + 2,
            count(&want_prof, "copy_"),
            "{what}: copies"
        );
        // the keys' and values' gradient comes back laid out as their
        // projection; sequence first, the output's and the queries' gradients
        // (batch first) reach their projections transposed, each copied once
        let copies = if batch_first { 0 } else { 2 };
        assert_eq!(
            count(&prof, "copy"),
            copies,
            "{what}: copies of activations"
        );
        let names = ["output", "query's gradient", "memory's gradient"];
        same_results(&got, &want, &names, dt, &what);
    }
    Ok(())
}

/// `mha.attend(q, k, v, opts)` without weights on `path`, backward from the
/// output's gradient `up` (the parameters' gradients zeroed first), profiled:
/// the output, the gradients of `leaves` and of the parameters, and the profile.
fn attend_grads(
    mha: &nn::MultiheadAttention,
    [q, k, v]: [&Tensor; 3],
    leaves: &[&Tensor],
    (up, opts, path): (
        &Tensor,
        nn::AttentionOptions,
        ember::nn::functional::AttentionPath,
    ),
) -> Result<(Vec<Tensor>, ember::profiler::Profile)> {
    for p in mha.parameters() {
        p.zero_grad();
    }
    let opts = nn::AttentionOptions {
        need_weights: false,
        ..opts
    };
    let (out, prof) = ember::profiler::profile(|| {
        let out = ember::nn::functional::with_attention_path(path, || mha.attend(q, k, v, opts))?.0;
        out.mul(up)?.sum_all()?.backward()?;
        Ok(out)
    })?;
    let mut got = vec![out.detach()];
    got.extend(
        leaves
            .iter()
            .map(|t| t.grad().expect("an input's gradient")),
    );
    got.extend(
        mha.parameters()
            .iter()
            .map(|p| p.grad().expect("a parameter's gradient")),
    );
    Ok((got, prof))
}

/// Asserts that the results of two ways to the same attention agree (within
/// float32's or bfloat16's rounding), naming the first ones by `names`.
#[track_caller]
fn same_results(got: &[Tensor], want: &[Tensor], names: &[&str], dt: DType, what: &str) {
    let tol = if dt == DType::BF16 { 3e-2 } else { 1e-5 };
    assert_eq!(got.len(), want.len(), "{what}: results");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.shape(), w.shape(), "{what}: result {i}");
        let name = names.get(i).copied().unwrap_or("a parameter's gradient");
        within_scale(g, w, tol, &format!("{what}: {name}"));
    }
}

/// Attention with dropout captured in a CUDA graph draws new masks at each
/// replay, as eager steps do (the fused kernels take their seed by value, so a
/// capture takes the composite path, whose draws follow the graph's generator).
fn attention_dropout_draws_new_masks_in_each_graph_replay(dev: &Device) -> Result<()> {
    if !dev.is_cuda() {
        return Ok(());
    }
    let _g = super::rng_lock();
    ember::manual_seed(6);
    let make = || -> Result<Tensor> { Tensor::randn([1, 2, 16, 64], dev)?.to_dtype(DType::BF16) };
    let (q, k, v) = (make()?, make()?, make()?);
    let (graph, y) = ember::cuda::Graph::capture(dev, || {
        nn::scaled_dot_product_attention(&q, &k, &v, None, 0.5, false, None)
    })?;
    graph.replay()?;
    let first = vals(&y);
    graph.replay()?;
    let second = vals(&y);
    assert!(first.iter().any(|x| *x != 0.0));
    assert_ne!(first, second, "two replays dropped the same weights");
    Ok(())
}

/// A weight two layers share (tied as PyTorch's `head.weight = emb.weight`) is
/// one parameter: listed once and stepped once with the gradient of both uses
/// (it was stepped twice); a cast, a move or `to_empty` keeps it one, as
/// PyTorch's `model.to()` does.
#[test]
fn a_tied_weight_is_one_parameter() -> Result<()> {
    let dev = Device::Cpu;
    ember::manual_seed(0);
    let emb = nn::Embedding::new(4, 4, &dev)?;
    let mut head = nn::Linear::with_bias(4, 4, false, &dev)?;
    head.weight = emb.weight.clone();
    let mut model = nn::Sequential::new().add(emb).add(head);
    assert_eq!(model.parameters().len(), 1);
    assert_eq!(model.num_parameters(), 16);
    // the state dict keeps both names, as PyTorch's; its named_parameters()
    // names the first
    assert_eq!(model.state_dict().len(), 2);
    let names: Vec<String> = nn::unique_named_parameters(&model)
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["0.weight"]);
    let w0 = vals(&model.parameters()[0]);
    let mut opt = Sgd::new(model.parameters(), 0.1)?;
    model
        .forward(&Tensor::new([0i64, 1], &dev)?)?
        .sum_all()?
        .backward()?;
    let g = vals(&model.parameters()[0].grad().expect("a gradient"));
    opt.step()?;
    let want: Vec<f64> = w0.iter().zip(&g).map(|(w, g)| w - 0.1 * g).collect();
    assert_close(&vals(&model.parameters()[0]), &want, 1e-6, 1e-7);
    let w1 = vals(&model.parameters()[0]);
    model.to_dtype(DType::F64)?;
    let state = model.state_dict();
    // (parameters() lists a tensor once: one entry is still one tensor)
    assert_eq!(model.parameters().len(), 1, "still one tensor");
    assert_eq!((state[0].1.dtype(), vals(&state[1].1)), (DType::F64, w1));
    model.to_device(&Device::Meta)?;
    model.to_empty(&Device::Cpu)?;
    assert_eq!(model.parameters().len(), 1, "still one tensor");
    // a tie inside a nested container stays one too
    let mut again = nn::Sequential::new().add(model);
    again.to_dtype(DType::F32)?;
    assert_eq!(again.parameters().len(), 1);
    assert_eq!(again.parameters()[0].dtype(), DType::F32);
    Ok(())
}

/// Corners a PyTorch user meets, as PyTorch has them: a batch norm state saved
/// before `num_batches_tracked` existed loads strictly (the count is kept); a
/// loss weight that requires grad is refused while recording (its losses have
/// no derivative for it); a plateau factor of 0 drops the rate to `min_lr`.
#[test]
fn loading_old_batch_norm_states_and_loss_weight_refusals() -> Result<()> {
    use ember::optim::ReduceLrOnPlateau;
    let dev = Device::Cpu;
    let src = nn::BatchNorm2d::new(3, &dev)?;
    let mean = src.running_mean.as_ref().expect("running statistics");
    mean.copy_(&Tensor::new([1f32, 2., 3.], &dev)?)?;
    let old: Vec<(String, Tensor)> = src
        .state_dict()
        .into_iter()
        .filter(|(k, _)| k != "num_batches_tracked")
        .collect();
    let bn = nn::BatchNorm2d::new(3, &dev)?;
    let r = bn.load_state_dict(&old, true)?;
    assert!(r.is_empty(), "{r:?}");
    assert_eq!(vals(bn.running_mean.as_ref().unwrap()), [1., 2., 3.]);
    let model = nn::Sequential::new().add(nn::BatchNorm2d::new(3, &dev)?);
    let prefixed: Vec<(String, Tensor)> = old
        .iter()
        .map(|(k, t)| (format!("0.{k}"), t.clone()))
        .collect();
    assert!(model.load_state_dict(&prefixed, true)?.is_empty());

    let x = Tensor::randn([4, 3], &dev)?.requires_grad_(true)?;
    let y = Tensor::rand([4, 3], &dev)?;
    let w = Tensor::ones([3], DType::F32, &dev)?.requires_grad_(true)?;
    for r in [
        nn::bce_with_logits_opts(&x, &y, Some(&w), None, Reduction::Mean),
        nn::bce_with_logits_opts(&x, &y, None, Some(&w), Reduction::Mean),
        nn::cross_entropy_opts(
            &x,
            &Tensor::new([0i64, 1, 2, 1], &dev)?,
            nn::LossOptions {
                weight: Some(&w),
                ..Default::default()
            },
        ),
    ] {
        let e = r.unwrap_err().to_string();
        assert!(
            e.contains("is not differentiable with respect to argument"),
            "{e}"
        );
    }
    // without recording, the weight is a weight
    ember::no_grad(|| nn::bce_with_logits_opts(&x, &y, None, Some(&w), Reduction::Mean))?;
    // with class probabilities the weight scales the terms and has a gradient
    // (PyTorch's too): -(1/N) sum over rows of p * log_softmax(x), per class
    let probs = Tensor::rand([4, 3], &dev)?.softmax(1)?;
    let opts = nn::LossOptions {
        weight: Some(&w),
        ..Default::default()
    };
    nn::cross_entropy_opts(&x, &probs, opts)?.backward()?;
    let want = ember::no_grad(|| {
        probs
            .mul(&x.log_softmax(1)?)?
            .sum(0, false)?
            .mul(-1.0 / 4.0)
    })?;
    assert_close(
        &vals(&w.grad().expect("a gradient")),
        &vals(&want),
        1e-5,
        1e-6,
    );

    let p = Tensor::zeros([1], DType::F32, &dev)?.requires_grad_(true)?;
    let mut opt = Sgd::new(vec![p], 0.1)?;
    let mut plateau = ReduceLrOnPlateau::new(0.0, 0)?;
    plateau.step_metric(&mut opt, 1.0);
    plateau.step_metric(&mut opt, 2.0);
    assert_eq!(opt.lr(), 0.0);
    assert!(ReduceLrOnPlateau::new(1.0, 0).is_err());
    assert!(ReduceLrOnPlateau::new(f64::NAN, 0).is_err());
    Ok(())
}

/// Dropout refuses integer and bool inputs in training as PyTorch does (its
/// scaled mask is float), and drops them all at p = 1; the initialisers that
/// draw on the host give a meta tensor back without drawing.
#[test]
fn dropout_of_integers_and_meta_initialisers() -> Result<()> {
    let dev = Device::Cpu;
    let ints = Tensor::new([1i64, 2, 3, 4], &dev)?;
    let e = nn::functional::dropout(&ints, 0.5, true)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("can't be cast to the desired output type Long"),
        "{e}"
    );
    let bools = Tensor::new([true, false], &dev)?;
    let mut layer = nn::Dropout::new(0.5)?;
    layer.train();
    let e = layer.forward(&bools).unwrap_err().to_string();
    assert!(e.contains("output type Bool"), "{e}");
    let all = nn::functional::dropout(&ints, 1.0, true)?;
    assert_eq!(
        (all.dtype(), all.to_vec1::<i64>()?),
        (DType::I64, vec![0; 4])
    );
    assert_eq!(
        nn::functional::dropout(&ints, 0.0, true)?.to_vec1::<i64>()?,
        [1, 2, 3, 4]
    );
    let none = Tensor::zeros([0], DType::I64, &dev)?;
    assert_eq!(nn::functional::dropout(&none, 0.5, true)?.shape(), &[0]);
    // meta: nothing drawn, the generator where it was
    let _g = super::rng_lock();
    let meta = Tensor::empty([400, 300], DType::F32, &Device::Meta)?;
    ember::manual_seed(3);
    nn::init::trunc_normal_(&meta, 0.0, 0.02, -0.04, 0.04)?;
    nn::init::orthogonal_(&meta, 1.0)?;
    let after = Tensor::rand([4], &dev)?.to_vec1::<f32>()?;
    ember::manual_seed(3);
    assert_eq!(Tensor::rand([4], &dev)?.to_vec1::<f32>()?, after);
    Ok(())
}
