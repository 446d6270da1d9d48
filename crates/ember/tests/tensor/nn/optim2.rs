//! NAdam, RAdam, Adamax and Adadelta against PyTorch's trajectories
//! (tests/golden/gen_nn.py, `optimizers2`), also resumed from a saved state
//! half-way; the further schedules against PyTorch's rates (`schedulers2`),
//! stepped and at closed-form epochs; PyTorch's refusals of bad settings.

use super::{cases, vals};
use ember::optim::{
    Adadelta, Adagrad, Adam, Adamax, Asgd, ChainedScheduler, ConstantLr,
    CosineAnnealingWarmRestarts, CyclicLr, CyclicMode, CyclicOptions, ExponentialLr, Groups,
    LinearLr, LrScheduler, MultiStepLr, MultiplicativeLr, NAdam, Optimizer, PolynomialLr, RAdam,
    Rprop, SequentialLr, Sgd,
};
use ember::prelude::*;
use serde_json::Value;

fn f64s(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// The optimizer of an `optimizers2` case over `params`, with the case's
/// settings (PyTorch's defaults where the case sets none).
fn optimizer(name: &str, cfg: &Value, params: Vec<Tensor>) -> Result<Box<dyn Optimizer>> {
    let f = |k: &str, d: f64| cfg[k].as_f64().unwrap_or(d);
    let flag = |k: &str| cfg[k].as_bool().unwrap_or(false);
    let (b1, b2) = cfg["betas"].as_array().map_or((0.9, 0.999), |b| {
        (b[0].as_f64().unwrap(), b[1].as_f64().unwrap())
    });
    let lr = f("lr", 0.0);
    Ok(match name.split('_').next().unwrap() {
        "nadam" => Box::new(
            NAdam::new(params, lr)?
                .betas(b1, b2)?
                .eps(f("eps", 1e-8))?
                .weight_decay(f("weight_decay", 0.0))?
                .momentum_decay(f("momentum_decay", 4e-3))?
                .decoupled_weight_decay(flag("decoupled_weight_decay"))
                .maximize(flag("maximize")),
        ),
        "radam" => Box::new(
            RAdam::new(params, lr)?
                .betas(b1, b2)?
                .eps(f("eps", 1e-8))?
                .weight_decay(f("weight_decay", 0.0))?
                .decoupled_weight_decay(flag("decoupled_weight_decay"))
                .maximize(flag("maximize")),
        ),
        "adamax" => Box::new(
            Adamax::new(params, lr)?
                .betas(b1, b2)?
                .eps(f("eps", 1e-8))?
                .weight_decay(f("weight_decay", 0.0))?
                .maximize(flag("maximize")),
        ),
        "adadelta" => Box::new(
            Adadelta::new(params, lr)?
                .rho(f("rho", 0.9))?
                .eps(f("eps", 1e-6))?
                .weight_decay(f("weight_decay", 0.0))?
                .maximize(flag("maximize")),
        ),
        "rprop" => {
            let pair = |k: &str, d: (f64, f64)| {
                cfg[k]
                    .as_array()
                    .map_or(d, |v| (v[0].as_f64().unwrap(), v[1].as_f64().unwrap()))
            };
            let (minus, plus) = pair("etas", (0.5, 1.2));
            let (lo, hi) = pair("step_sizes", (1e-6, 50.0));
            Box::new(
                Rprop::new(params, lr)?
                    .etas(minus, plus)?
                    .step_sizes(lo, hi)?
                    .maximize(flag("maximize")),
            )
        }
        "asgd" => Box::new(
            Asgd::new(params, lr)?
                .lambd(f("lambd", 1e-4))?
                .alpha(f("alpha", 0.75))?
                .t0(f("t0", 1e6))?
                .weight_decay(f("weight_decay", 0.0))?
                .maximize(flag("maximize")),
        ),
        other => panic!("unknown optimizer case {other}"),
    })
}

/// The golden objective at step `step`: `late` joins from the third step on.
fn objective(w: &Tensor, late: &Tensor, step: usize) -> Result<Tensor> {
    let dev = &w.device();
    let c = Tensor::new([1f64, 2., -1., 0.5], dev)?;
    let mut loss = w
        .pow(4.0)?
        .sum_all()?
        .mul(0.1)?
        .add(&w.mul(&c)?.sum_all()?)?;
    if step >= 2 {
        let c_late = Tensor::new([-1f64, 0.5], dev)?;
        let l = late.pow(4.0)?.sum_all()?.mul(0.2)?;
        loss = loss.add(&l)?.add(&late.mul(&c_late)?.sum_all()?)?;
    }
    Ok(loss)
}

/// Every case follows PyTorch's trajectory on `dev`, straight through and
/// with the optimizer replaced after three steps by a new one that loaded
/// the first one's state (the step counts, moments and NAdam's momentum
/// product carry over; the late parameter has state then, the other not yet
/// at the first save of the run).
fn optimizers2_match_pytorch(dev: &Device) -> Result<()> {
    let all = cases()["optimizers2"].as_array().unwrap().clone();
    assert!(all.len() >= 16);
    for case in &all {
        let name = case["name"].as_str().unwrap();
        for resume_at in [None, Some(1), Some(3)] {
            let w = Tensor::new(f64s(&case["init"]), dev)?.requires_grad_(true)?;
            let late = Tensor::new(f64s(&case["late_init"]), dev)?.requires_grad_(true)?;
            let params = vec![w.clone(), late.clone()];
            let mut opt = optimizer(name, &case["config"], params.clone())?;
            let wants = case["trajectory"]
                .as_array()
                .unwrap()
                .iter()
                .zip(case["late_trajectory"].as_array().unwrap());
            for (step, (want, want_late)) in wants.enumerate() {
                if resume_at == Some(step) {
                    let saved = opt.state()?;
                    opt = optimizer(name, &case["config"], params.clone())?;
                    opt.load_state(&saved)?;
                }
                opt.zero_grad();
                objective(&w, &late, step)?.backward()?;
                opt.step()?;
                for (t, want) in [(&w, want), (&late, want_late)] {
                    let (got, want) = (vals(t), f64s(want));
                    assert_eq!(got.len(), want.len());
                    for (g, e) in got.iter().zip(&want) {
                        assert!(
                            (g - e).abs() <= 1e-12 + 1e-10 * e.abs(),
                            "{name} step {step} (resumed at {resume_at:?}): got {got:?}, want {want:?}"
                        );
                    }
                }
            }
            if let Some(ax) = case.get("ax") {
                // ASGD's averages, as PyTorch's `ax`, in the saved state
                let state = opt.state()?;
                for (i, want) in ax.as_array().unwrap().iter().enumerate() {
                    let got = &state
                        .iter()
                        .find(|(k, _)| *k == format!("ax.{i}"))
                        .unwrap()
                        .1;
                    let (got, want) = (vals(got), f64s(want));
                    for (g, e) in got.iter().zip(&want) {
                        assert!(
                            (g - e).abs() <= 1e-12 + 1e-10 * e.abs(),
                            "{name} ax.{i}: {got:?} vs {want:?}"
                        );
                    }
                }
            }
        }
    }
    Ok(())
}

/// The saved states use PyTorch's names for each buffer, and a state is
/// refused by another kind of optimizer or with a broken entry.
fn optimizer2_states(dev: &Device) -> Result<()> {
    let w = Tensor::new([1f64, -2.], dev)?.requires_grad_(true)?;
    let other = Tensor::new([0.5f64], dev)?.requires_grad_(true)?;
    let params = vec![w.clone(), other.clone()];
    let step = |opt: &mut dyn Optimizer| -> Result<()> {
        opt.zero_grad();
        w.square()?.sum_all()?.backward()?;
        opt.step()
    };
    let mut nadam = NAdam::new(params.clone(), 0.1)?;
    step(&mut nadam)?;
    step(&mut nadam)?;
    assert_eq!(nadam.param_steps(), vec![2, 0]);
    let names =
        |s: &[(String, Tensor)]| -> Vec<String> { s.iter().map(|(k, _)| k.clone()).collect() };
    let s = nadam.state()?;
    for key in [
        "exp_avg.0",
        "exp_avg_sq.0",
        "has_state",
        "step",
        "mu_product",
        "lr",
    ] {
        assert!(
            names(&s).iter().any(|k| k == key),
            "NAdam state lacks {key}: {:?}",
            names(&s)
        );
    }
    // the product of the two momentum factors (steps 1 and 2), 1 without steps
    let mu = s
        .iter()
        .find(|(k, _)| k == "mu_product")
        .unwrap()
        .1
        .to_vec::<f64>()?;
    let factor = |t: f64| 0.9 * (1.0 - 0.5 * 0.96f64.powf(t * 4e-3));
    assert!((mu[0] - factor(1.0) * factor(2.0)).abs() < 1e-15, "{mu:?}");
    assert_eq!(mu[1], 1.0);
    // a NAdam state is not Adamax's nor RAdam's (exp_avg_sq, mu_product)
    let e = Adamax::new(params.clone(), 0.1)?
        .load_state(&s)
        .unwrap_err();
    assert!(e.to_string().contains("exp_avg_sq"), "{e}");
    let e = RAdam::new(params.clone(), 0.1)?.load_state(&s).unwrap_err();
    assert!(e.to_string().contains("mu_product"), "{e}");
    // a momentum product per parameter
    let mut bad = s.clone();
    for (k, t) in bad.iter_mut() {
        if k == "mu_product" {
            *t = Tensor::new([0.5f64], &Device::Cpu)?;
        }
    }
    let e = NAdam::new(params.clone(), 0.1)?
        .load_state(&bad)
        .unwrap_err();
    assert!(e.to_string().contains("mu_product"), "{e}");
    let no_mu: Vec<_> = s
        .iter()
        .filter(|(k, _)| k != "mu_product")
        .cloned()
        .collect();
    assert!(NAdam::new(params.clone(), 0.1)?.load_state(&no_mu).is_err());

    let mut adamax = Adamax::new(params.clone(), 0.1)?;
    step(&mut adamax)?;
    let s = adamax.state()?;
    assert!(
        names(&s).iter().any(|k| k == "exp_inf.0"),
        "{:?}",
        names(&s)
    );
    let mut adadelta = Adadelta::new(params.clone(), 1.0)?;
    step(&mut adadelta)?;
    let s = adadelta.state()?;
    for key in ["square_avg.0", "acc_delta.0", "step"] {
        assert!(names(&s).iter().any(|k| k == key), "{:?}", names(&s));
    }
    assert!(
        !names(&s).iter().any(|k| k.ends_with(".1")),
        "no state for the parameter without a gradient"
    );
    let e = Adam::new(params.clone(), 0.1)?.load_state(&s).unwrap_err();
    assert!(e.to_string().contains("square_avg"), "{e}");
    // the round trip of a loaded state, and a missing buffer refused
    let mut again = Adadelta::new(params.clone(), 0.5)?;
    again.load_state(&s)?;
    assert_eq!(again.lr(), 1.0);
    assert_eq!(again.param_steps(), vec![1, 0]);
    let partial: Vec<_> = s
        .iter()
        .filter(|(k, _)| k != "acc_delta.0")
        .cloned()
        .collect();
    assert!(Adadelta::new(params.clone(), 1.0)?
        .load_state(&partial)
        .is_err());
    // the parameters move and keep their state
    let moved: Vec<Tensor> = params.iter().map(|p| p.copy()).collect::<Result<_>>()?;
    again.set_parameters(moved)?;
    assert!(again.set_parameters(vec![w.clone()]).is_err());
    let mut rprop = Rprop::new(params.clone(), 0.1)?;
    step(&mut rprop)?;
    let s = rprop.state()?;
    for key in ["prev.0", "step_size.0", "step"] {
        assert!(names(&s).iter().any(|k| k == key), "{:?}", names(&s));
    }
    // its first step size is the rate: a later rate changes nothing for it
    rprop.set_lr(100.0);
    step(&mut rprop)?;
    let size = &rprop
        .state()?
        .into_iter()
        .find(|(k, _)| k == "step_size.0")
        .unwrap()
        .1;
    assert_eq!(vals(size), vec![0.12, 0.12]);
    let mut asgd = Asgd::new(params.clone(), 0.1)?;
    step(&mut asgd)?;
    let s = asgd.state()?;
    for key in ["ax.0", "eta", "mu", "step"] {
        assert!(names(&s).iter().any(|k| k == key), "{:?}", names(&s));
    }
    assert_eq!(vals(&asgd.averages()[0].clone().unwrap()), vals(&w));
    assert!(asgd.averages()[1].is_none());
    let no_eta: Vec<_> = s.iter().filter(|(k, _)| k != "eta").cloned().collect();
    assert!(Asgd::new(params.clone(), 0.1)?.load_state(&no_eta).is_err());
    // the kind and settings a checkpoint records
    let cfg = NAdam::new(params.clone(), 0.1)?
        .momentum_decay(0.01)?
        .decoupled_weight_decay(true)
        .config();
    assert!(cfg.contains(&("optimizer".into(), "NAdam".into())));
    assert!(cfg.contains(&("momentum_decay".into(), "0.01".into())));
    assert!(cfg.contains(&("decoupled_weight_decay".into(), "true".into())));
    Ok(())
}

/// PyTorch's refusals of bad settings, with its messages.
fn optimizer2_refusals(dev: &Device) -> Result<()> {
    let p = || -> Result<Vec<Tensor>> { Ok(vec![Tensor::zeros([2], DType::F32, dev)?]) };
    fn says<O: Optimizer>(r: Result<O>, want: &str) {
        let e = r.err().expect(want).to_string();
        assert!(e.contains(want), "{e:?} does not say {want:?}");
    }
    says(NAdam::new(p()?, -1.0), "Invalid learning rate: -1");
    says(RAdam::new(p()?, -1.0), "Invalid learning rate: -1");
    says(Adamax::new(p()?, f64::NAN), "Invalid learning rate: NaN");
    says(Adadelta::new(p()?, -1.0), "Invalid learning rate: -1");
    says(
        NAdam::new(p()?, 0.1)?.betas(1.0, 0.999),
        "Invalid beta parameter at index 0: 1",
    );
    says(
        RAdam::new(p()?, 0.1)?.betas(0.9, -0.1),
        "Invalid beta parameter at index 1: -0.1",
    );
    says(
        Adamax::new(p()?, 0.1)?.betas(0.9, 1.0),
        "Invalid beta parameter at index 1: 1",
    );
    says(
        Adamax::new(p()?, 0.1)?.eps(-1.0),
        "Invalid epsilon value: -1",
    );
    says(
        NAdam::new(p()?, 0.1)?.weight_decay(-1.0),
        "Invalid weight_decay value: -1",
    );
    says(
        NAdam::new(p()?, 0.1)?.momentum_decay(-1.0),
        "Invalid momentum_decay value: -1",
    );
    says(
        RAdam::new(p()?, 0.1)?.weight_decay(f64::INFINITY),
        "Invalid weight_decay value: inf",
    );
    says(Adadelta::new(p()?, 1.0)?.rho(1.5), "Invalid rho value: 1.5");
    says(
        Adadelta::new(p()?, 1.0)?.eps(-1.0),
        "Invalid epsilon value: -1",
    );
    says(
        Adadelta::new(p()?, 1.0)?.weight_decay(-0.5),
        "Invalid weight_decay value: -0.5",
    );
    says(
        Rprop::new(p()?, 0.1)?.etas(1.5, 1.2),
        "Invalid eta values: 1.5, 1.2",
    );
    says(
        Rprop::new(p()?, 0.1)?.etas(0.5, 1.0),
        "Invalid eta values: 0.5, 1",
    );
    says(Rprop::new(p()?, -1.0), "Invalid learning rate: -1");
    assert!(Rprop::new(p()?, 0.1)?.step_sizes(1.0, 0.5).is_err());
    says(Asgd::new(p()?, -1.0), "Invalid learning rate: -1");
    says(Asgd::new(p()?, 0.1)?.lambd(-1.0), "Invalid lambd value: -1");
    says(Asgd::new(p()?, 0.1)?.alpha(-1.0), "Invalid alpha value: -1");
    says(
        Asgd::new(p()?, 0.1)?.weight_decay(-1.0),
        "Invalid weight_decay value: -1",
    );
    assert!(Asgd::new(p()?, 0.1)?.t0(f64::NAN).is_err());
    assert_eq!(Rprop::new(p()?, 0.1)?.cycled_momentum(), None);
    // the edges PyTorch accepts
    Adadelta::new(p()?, 0.0)?.rho(0.0)?.rho(1.0)?;
    NAdam::new(p()?, 0.0)?
        .betas(0.0, 0.0)?
        .momentum_decay(0.0)?;
    // a first beta a schedule would set is checked the same way
    let mut n = RAdam::new(p()?, 0.1)?;
    let e = n.set_cycled_momentum(1.2).unwrap_err().to_string();
    assert!(e.contains("Invalid beta parameter at index 0: 1.2"), "{e}");
    assert_eq!(n.cycled_momentum(), Some(0.9));
    assert_eq!(Adadelta::new(p()?, 1.0)?.cycled_momentum(), None);
    Ok(())
}

/// The schedule of a `schedulers2` case on `opt`.
fn schedule(name: &str, opt: &mut Groups) -> Result<Box<dyn LrScheduler>> {
    let cyclic = |up, down, mode, gamma, momenta: Option<(f64, f64)>| {
        let (base_momentum, max_momentum) = momenta.unwrap_or((0.8, 0.9));
        CyclicOptions {
            step_size_up: up,
            step_size_down: down,
            mode,
            gamma,
            cycle_momentum: momenta.is_some() || name != "cyclic_no_momentum",
            base_momentum,
            max_momentum,
        }
    };
    Ok(match name {
        "multistep" => Box::new(MultiStepLr::new(opt, vec![2, 5, 5, 9], 0.5)?),
        "multistep_zero" => Box::new(MultiStepLr::new(opt, vec![3, 0], 0.1)?),
        "exponential" => Box::new(ExponentialLr::new(opt, 0.8)?),
        "constant" => Box::new(ConstantLr::new(opt, 0.25, 4)?),
        "constant_default" => Box::new(ConstantLr::new(opt, 1.0 / 3.0, 5)?),
        "polynomial" => Box::new(PolynomialLr::new(opt, 6, 2.0)?),
        "polynomial_default" => Box::new(PolynomialLr::new(opt, 5, 1.0)?),
        "multiplicative" => Box::new(MultiplicativeLr::new(opt, |e| {
            if e % 2 == 1 {
                0.9
            } else {
                0.7
            }
        })),
        "warm_restarts" | "warm_restarts_fractional" => {
            Box::new(CosineAnnealingWarmRestarts::new(opt, 3, 2, 0.001)?)
        }
        "warm_restarts_mult1" => Box::new(CosineAnnealingWarmRestarts::new(opt, 4, 1, 0.0)?),
        "cyclic_triangular" => Box::new(CyclicLr::new(
            opt,
            0.01,
            0.1,
            cyclic(3, None, CyclicMode::Triangular, 1.0, None),
        )?),
        "cyclic_triangular2" => Box::new(CyclicLr::new(
            opt,
            0.01,
            0.1,
            cyclic(2, Some(4), CyclicMode::Triangular2, 1.0, None),
        )?),
        "cyclic_exp_range_adam" => Box::new(CyclicLr::new(
            opt,
            0.01,
            0.1,
            cyclic(3, None, CyclicMode::ExpRange, 0.9, Some((0.85, 0.95))),
        )?),
        "cyclic_no_momentum" => Box::new(CyclicLr::new(
            opt,
            0.02,
            0.2,
            cyclic(2, None, CyclicMode::Triangular, 1.0, None),
        )?),
        "chained" => {
            let a: Box<dyn LrScheduler> = Box::new(ConstantLr::new(opt, 0.5, 3)?);
            let b: Box<dyn LrScheduler> = Box::new(ExponentialLr::new(opt, 0.9)?);
            Box::new(ChainedScheduler::new(opt, vec![a, b])?)
        }
        "chained_linear_multistep" => {
            let a: Box<dyn LrScheduler> = Box::new(LinearLr::new(opt, 0.2, 1.0, 3)?);
            let b: Box<dyn LrScheduler> = Box::new(MultiStepLr::new(opt, vec![4, 6], 0.5)?);
            Box::new(ChainedScheduler::new(opt, vec![a, b])?)
        }
        "sequential_constant_exponential" => {
            let a: Box<dyn LrScheduler> = Box::new(ConstantLr::new(opt, 0.5, 2)?);
            let b: Box<dyn LrScheduler> = Box::new(ExponentialLr::new(opt, 0.9)?);
            Box::new(SequentialLr::new(opt, vec![a, b], vec![3])?)
        }
        other => panic!("unknown schedule {other}"),
    })
}

/// Two parameter groups (lr 0.1 and 0.02) as the PyTorch optimizer of a case.
fn two_groups(name: &str, dev: &Device) -> Result<Groups> {
    let p = || Tensor::zeros([1], DType::F32, dev);
    if name.contains("adam") {
        Groups::new(vec![
            Box::new(Adam::new(vec![p()?], 0.1)?),
            Box::new(Adam::new(vec![p()?], 0.02)?),
        ])
    } else {
        Groups::new(vec![
            Box::new(Sgd::new(vec![p()?], 0.1)?.momentum(0.9)?),
            Box::new(Sgd::new(vec![p()?], 0.02)?.momentum(0.9)?),
        ])
    }
}

fn schedulers2_match_pytorch(dev: &Device) -> Result<()> {
    let cases = cases();
    let cases = cases["schedulers2"].as_array().unwrap();
    assert!(cases.len() >= 15);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let close_all = |got: &[f64], want: &[f64], what: &str| {
            assert_eq!(got.len(), want.len(), "{name} {what}");
            for (g, w) in got.iter().zip(want) {
                assert!((g - w).abs() < 1e-12, "{name} {what}: {got:?} vs {want:?}");
            }
        };
        let mut opt = two_groups(name, dev)?;
        let mut sched = schedule(name, &mut opt)?;
        close_all(&opt.group_lrs(), &f64s(&case["initial_groups"]), "initial");
        let m0 = case["initial_momentum"].as_f64().unwrap();
        close_all(&[opt.cycled_momentum().unwrap()], &[m0], "initial momentum");
        let epochs = f64s(&case["epochs"]);
        let momenta = f64s(&case["momenta"]);
        let mut warm = None;
        if !epochs.is_empty() {
            // fractional epochs: the concrete schedule's own step
            warm = Some(CosineAnnealingWarmRestarts::new(&mut opt, 3, 2, 0.001)?);
        }
        for (k, want) in case["group_lrs"].as_array().unwrap().iter().enumerate() {
            let last = match warm.as_mut() {
                Some(w) => {
                    w.step_at(&mut opt, epochs[k])?;
                    assert_eq!(w.epoch(), epochs[k].floor() as usize);
                    w.last_lrs()
                }
                None => {
                    sched.step(&mut opt);
                    assert_eq!(sched.epoch(), k + 1, "{name}");
                    sched.last_lrs()
                }
            };
            let what = format!("step {k}");
            close_all(&opt.group_lrs(), &f64s(want), &what);
            close_all(&last, &f64s(want), &what);
            close_all(
                &[opt.cycled_momentum().unwrap()],
                &[momenta[k]],
                &format!("momentum at {what}"),
            );
        }
        // PyTorch's `step(epoch)` on a fresh schedule: the closed form
        for (k, want) in case["closed"].as_array().unwrap().iter().enumerate() {
            let mut opt = two_groups(name, dev)?;
            let mut s = schedule(name, &mut opt)?;
            s.step_to(&mut opt, k);
            let what = format!("closed form at {k}");
            close_all(&opt.group_lrs(), &f64s(want), &what);
            close_all(&s.last_lrs(), &f64s(want), &what);
            assert_eq!(s.epoch(), k);
        }
    }
    Ok(())
}

/// Resuming and the cases PyTorch gets wrong or refuses.
fn schedulers2_edges(dev: &Device) -> Result<()> {
    let p = || -> Result<Vec<Tensor>> { Ok(vec![Tensor::zeros([1], DType::F32, dev)?]) };
    let says = |e: ember::Error, want: &str| {
        let e = e.to_string();
        assert!(e.contains(want), "{e:?} does not say {want:?}");
    };
    let mut opt = Sgd::new(p()?, 0.1)?.momentum(0.9)?;
    says(
        ConstantLr::new(&mut opt, 1.5, 3).err().unwrap(),
        "Constant multiplicative factor expected to be between 0 and 1.",
    );
    says(
        CosineAnnealingWarmRestarts::new(&mut opt, 0, 1, 0.0)
            .err()
            .unwrap(),
        "Expected positive integer T_0, but got 0",
    );
    says(
        CosineAnnealingWarmRestarts::new(&mut opt, 2, 0, 0.0)
            .err()
            .unwrap(),
        "Expected integer T_mult >= 1, but got 0",
    );
    assert!(CosineAnnealingWarmRestarts::new(&mut opt, 2, 1, f64::NAN).is_err());
    let mut w = CosineAnnealingWarmRestarts::new(&mut opt, 2, 1, 0.0)?;
    says(
        w.step_at(&mut opt, -1.0).unwrap_err(),
        "Expected non-negative epoch, but got -1",
    );
    assert!(MultiStepLr::new(&mut opt, vec![1], f64::NAN).is_err());
    assert!(ExponentialLr::new(&opt, f64::INFINITY).is_err());
    assert!(PolynomialLr::new(&opt, 3, f64::NAN).is_err());
    says(
        ChainedScheduler::new(&opt, vec![]).err().unwrap(),
        "expects at least one scheduler to be chained",
    );
    // CyclicLR needs a momentum to cycle (Adagrad and Adadelta have none)
    for mut o in [
        Box::new(Adagrad::new(p()?, 0.1)?) as Box<dyn Optimizer>,
        Box::new(Adadelta::new(p()?, 1.0)?),
    ] {
        says(
            CyclicLr::new(&mut o, 0.01, 0.1, CyclicOptions::default())
                .err()
                .unwrap(),
            "optimizer must support momentum or beta1 with `cycle_momentum` option enabled",
        );
        let no = CyclicOptions {
            cycle_momentum: false,
            ..Default::default()
        };
        CyclicLr::new(&mut o, 0.01, 0.1, no)?;
    }
    // one rate per group
    let mut groups = two_groups("sgd", dev)?;
    says(
        CyclicLr::with_group_lrs(&mut groups, &[0.01], &[0.1, 0.2], CyclicOptions::default())
            .err()
            .unwrap(),
        "base_lr must have the same length as optimizer.param_groups. base_lr has 1 values, param_groups has 2.",
    );
    let zero = CyclicOptions {
        step_size_up: 0,
        ..Default::default()
    };
    assert!(CyclicLr::new(&mut groups, 0.01, 0.1, zero).is_err());
    assert!(CyclicLr::new(&mut groups, -0.01, 0.1, CyclicOptions::default()).is_err());
    // a momentum the optimizer refuses leaves its own momentum
    let mut adam = Adam::new(p()?, 0.1)?;
    let bad = CyclicOptions {
        max_momentum: 1.0,
        ..Default::default()
    };
    assert!(CyclicLr::new(&mut adam, 0.01, 0.1, bad).is_err());
    assert_eq!(adam.cycled_momentum(), Some(0.9));
    // NAdam's first beta cycles, from the peak momentum at the base rate
    let mut nadam = NAdam::new(p()?, 0.1)?;
    let mut c = CyclicLr::new(
        &mut nadam,
        0.01,
        0.1,
        CyclicOptions {
            step_size_up: 2,
            ..Default::default()
        },
    )?;
    assert_eq!(nadam.cycled_momentum(), Some(0.9));
    c.step(&mut nadam);
    assert!((nadam.cycled_momentum().unwrap() - 0.85).abs() < 1e-15);
    assert!((nadam.lr() - 0.055).abs() < 1e-15);
    assert_eq!(c.last_momentum(), nadam.cycled_momentum());

    // ConstantLR with a factor of 0 comes back to the initial rate at
    // total_iters (PyTorch divides by zero there)
    let mut opt = Sgd::new(p()?, 0.1)?;
    let mut s = ConstantLr::new(&mut opt, 0.0, 2)?;
    assert_eq!(opt.lr(), 0.0);
    s.step(&mut opt);
    assert_eq!(opt.lr(), 0.0);
    s.step(&mut opt);
    assert_eq!(opt.lr(), 0.1);

    // warm restarts: stepping 111 times and jumping to 111 agree at a restart
    // (T_0 1, T_mult 10: cycles end at 1, 11, 111), where PyTorch's
    // floating-point logarithm counts one cycle too few and gives eta_min
    let mut a = Sgd::new(p()?, 0.1)?;
    let mut sa = CosineAnnealingWarmRestarts::new(&mut a, 1, 10, 0.0)?;
    for _ in 0..111 {
        sa.step(&mut a);
    }
    assert_eq!((sa.t_cur(), sa.t_i()), (0.0, 1000.0));
    assert_eq!(a.lr(), 0.1);
    let mut b = Sgd::new(p()?, 0.1)?;
    let mut sb = CosineAnnealingWarmRestarts::new(&mut b, 1, 10, 0.0)?;
    sb.step_to(&mut b, 111);
    assert_eq!((sb.t_cur(), sb.t_i()), (0.0, 1000.0));
    assert_eq!(b.lr(), 0.1);
    // ... and a step after a jump goes on from there
    sb.step(&mut b);
    sa.step(&mut a);
    assert_eq!(a.lr(), b.lr());
    assert_eq!(sb.epoch(), 112);

    // resuming: a schedule set to the epoch a checkpoint recorded, on an
    // optimizer whose rates were restored, steps on as the original
    for name in [
        "multistep",
        "exponential",
        "polynomial",
        "constant",
        "warm_restarts",
        "cyclic_triangular2",
    ] {
        let mut o1 = two_groups(name, dev)?;
        let mut s1 = schedule(name, &mut o1)?;
        for _ in 0..4 {
            s1.step(&mut o1);
        }
        let saved = o1.state()?;
        let mut o2 = two_groups(name, dev)?;
        let mut s2 = schedule(name, &mut o2)?;
        o2.load_state(&saved)?;
        s2.set_epoch(s1.epoch());
        for k in 0..6 {
            s1.step(&mut o1);
            s2.step(&mut o2);
            let (g1, g2) = (o1.group_lrs(), o2.group_lrs());
            for (x, y) in g1.iter().zip(&g2) {
                assert!(
                    (x - y).abs() < 1e-15,
                    "{name} after resume, step {k}: {g1:?} vs {g2:?}"
                );
            }
        }
    }
    Ok(())
}

device_test!(
    optimizers2_match_pytorch,
    optimizer2_states,
    optimizer2_refusals,
    schedulers2_match_pytorch,
    schedulers2_edges,
);
