//! The Trial training loop: history, metrics, callbacks, schedulers, checkpoints
//! and resuming.

use super::vals;
use ember::amp::GradScaler;
use ember::data::{DataLoader, TensorDataset};
use ember::nn::{self, Module};
use ember::optim::{Adam, Optimizer, Sgd, StepLr};
use ember::prelude::*;
use ember::train::{Checkpoint, EarlyStopping, History, Metric, Progress, TopKAccuracy, Trial};

/// Two Gaussian blobs, 4 units apart along both axes, labels 0/1.
fn blobs(n: usize, seed: u64) -> Result<(Tensor, Tensor)> {
    ember::manual_seed(seed);
    let labels: Vec<i64> = (0..n as i64).map(|i| i % 2).collect();
    let y = Tensor::from_vec(labels, [n], &Device::Cpu)?;
    let x = Tensor::randn([n, 2], &Device::Cpu)?
        .add(&y.to_dtype(DType::F32)?.unsqueeze(1)?.mul(4.0)?)?;
    Ok((x, y))
}

fn loaders(seed: u64) -> Result<(DataLoader, DataLoader)> {
    let (x, y) = blobs(96, seed)?;
    let (xv, yv) = blobs(32, seed + 1)?;
    Ok((
        DataLoader::new(TensorDataset::new(x, y)?, 16)?.shuffle(seed),
        DataLoader::new(TensorDataset::new(xv, yv)?, 32)?,
    ))
}

fn model(seed: u64, dev: &Device) -> Result<nn::Sequential> {
    ember::manual_seed(seed);
    Ok(nn::Sequential::new()
        .add(nn::Linear::new(2, 8, dev)?)
        .add(nn::Tanh)
        .add(nn::Linear::new(8, 2, dev)?))
}

fn trial_learns_and_records_history(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    let (train, val) = loaders(1)?;
    let m = model(2, &Device::Cpu)?;
    let opt = Adam::new(m.parameters(), 0.05)?;
    let mut trial = Trial::new(m, opt, nn::cross_entropy)
        .metrics(&["loss", "acc", "top_2_acc"])?
        .progress(Progress::Quiet)
        .to(dev)?
        .with_generators(Some(train), Some(val), None);
    assert!(trial
        .model()
        .parameters()
        .iter()
        .all(|p| p.device() == *dev));
    let h = trial.run(6)?.clone();
    assert_eq!(h.len(), 6);
    assert_eq!(
        h.metric_names(),
        [
            "loss",
            "acc",
            "top_2_acc",
            "val_loss",
            "val_acc",
            "val_top_2_acc"
        ]
    );
    let loss = h.series("loss");
    assert!(loss[5] < loss[0] * 0.5, "loss falls: {loss:?}");
    let last = h.last().unwrap();
    assert!(last.get("val_acc").unwrap() > 0.9, "{last:?}");
    // with two classes the top-2 accuracy is 1 by definition
    assert_eq!(last.get("top_2_acc"), Some(1.0));
    assert!(last.seconds > 0.0 && last.samples_per_sec > 0.0);
    assert_eq!(
        h.records.iter().map(|r| r.epoch).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5, 6]
    );
    // run(n) continues to n epochs in total
    assert_eq!(trial.run(8)?.len(), 8);
    // evaluate falls back to the validation loader; predict batches the input
    let eval = trial.evaluate()?;
    assert_eq!(
        eval.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["loss", "acc", "top_2_acc"]
    );
    let (xv, _) = blobs(10, 9)?;
    let out = trial.predict(&xv, 3)?;
    assert_eq!(out.shape(), &[10, 2]);
    assert_eq!(out.device(), *dev);
    assert!(!out.requires_grad());
    Ok(())
}

fn trial_resume_matches_uninterrupted(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    let base = std::env::temp_dir().join(format!("ember-trial-{}-{dev}", std::process::id()));
    let (dir_a, dir_b) = (base.join("a"), base.join("b"));
    let make = |seed: u64, dir: &std::path::Path| -> Result<Trial> {
        let (train, val) = loaders(3)?;
        let m = model(seed, &Device::Cpu)?;
        let opt = Sgd::new(m.parameters(), 0.1)?.momentum(0.9)?;
        let sched = StepLr::new(&opt, 2, 0.5)?;
        Ok(Trial::new(m, opt, nn::cross_entropy)
            .metrics(&["loss", "acc"])?
            .progress(Progress::Quiet)
            .scheduler(sched)
            .callback(Checkpoint::new(dir))
            .to(dev)?
            .with_generators(Some(train), Some(val), None))
    };
    // uninterrupted: 5 epochs
    let mut a = make(4, &dir_a)?;
    let ha = a.run(5)?.clone();
    // interrupted after 3 epochs, then a fresh trial (other initial weights) resumes
    let mut b = make(4, &dir_b)?;
    b.run(3)?;
    drop(b);
    let mut c = make(99, &dir_b)?.resume(&dir_b)?;
    assert_eq!(c.history().len(), 3);
    let hc = c.run(5)?.clone();
    for ((n, pa), (_, pc)) in a
        .model()
        .state_dict()
        .iter()
        .zip(c.model().state_dict().iter())
    {
        assert_eq!(vals(pa), vals(pc), "{n} after resuming");
    }
    assert_eq!(ha.series("loss"), hc.series("loss"));
    assert_eq!(ha.series("val_acc"), hc.series("val_acc"));
    let lrs: Vec<f64> = hc.records.iter().map(|r| r.lr).collect();
    assert_eq!(
        lrs,
        [0.1, 0.1, 0.05, 0.05, 0.025],
        "the scheduler resumed too"
    );
    assert_eq!(c.optimizer().lr(), a.optimizer().lr());
    // a resume from a folder without a checkpoint is an error that names the file
    let err = make(4, &base.join("none"))?
        .resume(base.join("none"))
        .err()
        .unwrap();
    assert!(
        err.to_string()
            .contains("there is no checkpoint to resume from in"),
        "{err}"
    );
    std::fs::remove_dir_all(&base).ok();
    Ok(())
}

#[test]
fn resume_refuses_a_checkpoint_of_other_settings() -> Result<()> {
    let _g = super::rng_lock();
    let dir = std::env::temp_dir().join(format!("ember-trial-cfg-{}", std::process::id()));
    let make = |batch: usize, momentum: f64, data: &str| -> Result<Trial> {
        let (x, y) = blobs(96, 3)?;
        let train = DataLoader::new(TensorDataset::new(x, y)?, batch)?.shuffle(3);
        let m = model(4, &Device::Cpu)?;
        let opt = Sgd::new(m.parameters(), 0.1)?.momentum(momentum)?;
        Ok(Trial::new(m, opt, nn::cross_entropy)
            .config([("data", data), ("seed", "3")])
            .progress(Progress::Quiet)
            .callback(Checkpoint::new(&dir))
            .with_generators(Some(train), None, None))
    };
    let mut t = make(16, 0.9, "blobs")?;
    t.run(2)?;
    let cfg = t.run_config();
    let get = |k: &str| cfg.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    assert_eq!(
        (
            get("data"),
            get("optimizer"),
            get("optimizer.momentum"),
            get("batch_size")
        ),
        (Some("blobs"), Some("SGD"), Some("0.9"), Some("16"))
    );
    // the same settings resume
    assert_eq!(make(16, 0.9, "blobs")?.resume(&dir)?.history().len(), 2);
    // each setting that changes the result is named when it differs
    for (trial, want) in [
        (make(8, 0.9, "blobs")?, "batch_size is 16 there and 8 here"),
        (
            make(16, 0.5, "blobs")?,
            "optimizer.momentum is 0.9 there and 0.5 here",
        ),
        (
            make(16, 0.9, "rings")?,
            "data is blobs there and rings here",
        ),
        (
            make(16, 0.9, "blobs")?.config([("model", "mlp")]),
            "model is not set there and is mlp here",
        ),
    ] {
        let e = trial.resume(&dir).err().expect("refused").to_string();
        assert!(e.contains(want) && e.contains("other settings"), "{e}");
    }
    // another optimizer
    let (x, y) = blobs(96, 3)?;
    let train = DataLoader::new(TensorDataset::new(x, y)?, 16)?.shuffle(3);
    let m = model(4, &Device::Cpu)?;
    let adam = Adam::new(m.parameters(), 0.1)?;
    let e = Trial::new(m, adam, nn::cross_entropy)
        .config([("data", "blobs"), ("seed", "3")])
        .with_generators(Some(train), None, None)
        .resume(&dir)
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("optimizer is SGD there and Adam here"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}

/// With `cuda_graphs`, a trial's steps are replays of one captured step (on a
/// GPU; elsewhere the option changes nothing) and train exactly as eager steps
/// (with SGD, and with Adam in its capturable form): the partial last batch runs
/// eagerly, and a learning rate changed by a scheduler is captured again.
fn trial_with_cuda_graphs_trains_as_without(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    type MakeOpt = fn(Vec<Tensor>) -> Result<Box<dyn Optimizer>>;
    let sgd: MakeOpt = |p| Ok(Box::new(Sgd::new(p, 0.2)?.momentum(0.9)?));
    let adam: MakeOpt = |p| {
        let mut o = Adam::new(p, 0.05)?;
        // the form the graphed trial switches to, for the eager one too
        assert!(o.make_capturable()?);
        Ok(Box::new(o))
    };
    let run = |make: MakeOpt, graphs: bool| -> Result<(Vec<f64>, Vec<Vec<f32>>, u64)> {
        let (x, y) = blobs(96, 4)?;
        // 96 = 4 x 20 + 16: a partial batch per epoch
        let train = DataLoader::new(TensorDataset::new(x, y)?, 20)?.shuffle(4);
        let m = model(5, dev)?;
        let opt = make(m.parameters())?;
        let sched = StepLr::new(opt.as_ref(), 2, 0.5)?;
        let mut trial = Trial::new(m, opt, nn::cross_entropy)
            .progress(Progress::Quiet)
            .scheduler(sched)
            .cuda_graphs(graphs)
            .with_generators(Some(train), None, None);
        let h = trial.run(4)?.series("loss");
        let params = trial
            .model()
            .parameters()
            .iter()
            .map(|p| p.to_vec::<f32>())
            .collect::<Result<_>>()?;
        Ok((h, params, trial.graph_replays()))
    };
    for (name, make) in [("sgd", sgd), ("adam", adam)] {
        let (eager_loss, eager_params, none) = run(make, false)?;
        let (graph_loss, graph_params, replays) = run(make, true)?;
        assert_eq!(none, 0);
        if dev.is_cuda() {
            // 4 full batches an epoch, the first step eager
            assert_eq!(replays, 4 * 4 - 1, "{name}: steps replayed");
        } else {
            assert_eq!(replays, 0);
        }
        assert_eq!(graph_loss, eager_loss, "{name}");
        assert_eq!(graph_params, eager_params, "{name}");
        assert!(graph_loss[3] < graph_loss[0], "{name}: {graph_loss:?}");
    }
    // dropout draws the same numbers from a graph as eagerly
    let dropout = |graphs: bool| -> Result<(Vec<f64>, u64)> {
        let (x, y) = blobs(96, 4)?;
        let train = DataLoader::new(TensorDataset::new(x, y)?, 16)?.shuffle(4);
        ember::manual_seed(5);
        let m = nn::Sequential::new()
            .add(nn::Linear::new(2, 16, dev)?)
            .add(nn::Tanh)
            .add(nn::Dropout::new(0.3)?)
            .add(nn::Linear::new(16, 2, dev)?);
        let opt = Sgd::new(m.parameters(), 0.1)?;
        let mut trial = Trial::new(m, opt, nn::cross_entropy)
            .progress(Progress::Quiet)
            .cuda_graphs(graphs)
            .with_generators(Some(train), None, None);
        Ok((trial.run(3)?.series("loss"), trial.graph_replays()))
    };
    let ((graphed, replays), (eager, _)) = (dropout(true)?, dropout(false)?);
    assert_eq!(graphed, eager);
    // 6 batches an epoch, the first step eager
    assert_eq!(replays, if dev.is_cuda() { 3 * 6 - 1 } else { 0 });
    if dev.is_cuda() {
        // RMSprop's step is not capturable
        let (x, y) = blobs(32, 1)?;
        let loader = || DataLoader::new(TensorDataset::new(x.clone(), y.clone())?, 8);
        let m = model(5, dev)?;
        let opt = ember::optim::RmsProp::new(m.parameters(), 0.01)?;
        let e = Trial::new(m, opt, nn::cross_entropy)
            .progress(Progress::Quiet)
            .cuda_graphs(true)
            .with_generators(Some(loader()?), None, None)
            .run(1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("RMSprop's step cannot be captured"), "{e}");
    }
    Ok(())
}

/// `Trial::amp`: bfloat16 and float16 autocast train as float32 does (within
/// noise), with the parameters kept in float32; float16's loss scaler runs and is
/// refused together with CUDA graphs; the setting is part of the run's config.
fn trial_with_amp_trains_as_f32_does(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    let run = |amp: Option<DType>| -> Result<(Vec<f64>, f64, Trial)> {
        let (train, val) = loaders(1)?;
        let m = model(2, &Device::Cpu)?;
        let opt = Adam::new(m.parameters(), 0.05)?;
        let mut trial = Trial::new(m, opt, nn::cross_entropy)
            .metrics(&["loss", "acc"])?
            .progress(Progress::Quiet)
            .amp(amp)?
            .to(dev)?
            .with_generators(Some(train), Some(val), None);
        let h = trial.run(6)?.clone();
        let acc = h.last().unwrap().get("val_acc").unwrap();
        Ok((h.series("loss"), acc, trial))
    };
    let (f32_loss, f32_acc, _) = run(None)?;
    for dt in [DType::BF16, DType::F16] {
        let (loss, acc, trial) = run(Some(dt))?;
        assert!(loss[5] < loss[0] * 0.5, "{dt}: the loss falls: {loss:?}");
        assert!(
            (loss[5] - f32_loss[5]).abs() < 0.05 + 0.2 * f32_loss[5],
            "{dt}: final loss {} against float32's {}",
            loss[5],
            f32_loss[5]
        );
        assert!(
            acc >= f32_acc - 0.07,
            "{dt}: accuracy {acc} against {f32_acc}"
        );
        assert!(trial
            .model()
            .parameters()
            .iter()
            .all(|p| p.dtype() == DType::F32));
        let amp = trial.run_config().into_iter().find(|(k, _)| k == "amp");
        assert_eq!(amp.map(|(_, v)| v), Some(dt.to_string()));
        // float16 scales the loss; after 6 clean epochs of 3 steps the scale stays
        // at PyTorch's initial 65536 (it grows only after 2000 good steps)
        let scale = trial.grad_scaler().map(|s| s.get_scale());
        assert_eq!(scale, (dt == DType::F16).then_some(65536.0), "{dt}");
    }
    // float16 with a scaler that grows every 2 steps: interrupted after 2 epochs
    // and resumed, it ends as the uninterrupted run (the scale is in the checkpoint)
    let base = std::env::temp_dir().join(format!("ember-amp-{}-{dev}", std::process::id()));
    let make = |seed: u64, dir: &std::path::Path| -> Result<Trial> {
        let (train, val) = loaders(3)?;
        let m = model(seed, &Device::Cpu)?;
        let opt = Sgd::new(m.parameters(), 0.1)?.momentum(0.9)?;
        Ok(Trial::new(m, opt, nn::cross_entropy)
            .progress(Progress::Quiet)
            .amp(Some(DType::F16))?
            .grad_scaler_with(GradScaler::with_options(8.0, 2.0, 0.5, 2)?)
            .callback(Checkpoint::new(dir))
            .to(dev)?
            .with_generators(Some(train), Some(val), None))
    };
    let mut a = make(4, &base.join("a"))?;
    a.run(4)?;
    let mut b = make(4, &base.join("b"))?;
    b.run(2)?;
    let mid = b.grad_scaler().unwrap().get_scale();
    assert!(mid > 8.0, "the scale grew: {mid}");
    drop(b);
    let mut c = make(99, &base.join("b"))?.resume(base.join("b"))?;
    assert_eq!(c.grad_scaler().unwrap().get_scale(), mid);
    c.run(4)?;
    assert_eq!(
        a.grad_scaler().unwrap().state_dict(),
        c.grad_scaler().unwrap().state_dict()
    );
    for ((n, pa), (_, pc)) in a
        .model()
        .state_dict()
        .iter()
        .zip(c.model().state_dict().iter())
    {
        assert_eq!(vals(pa), vals(pc), "{n} after resuming");
    }
    std::fs::remove_dir_all(&base).ok();
    let m = model(2, &Device::Cpu)?;
    let opt = Adam::new(m.parameters(), 0.05)?;
    let e = Trial::new(m, opt, nn::cross_entropy)
        .amp(Some(DType::I64))
        .err()
        .expect("an integer autocast dtype is refused")
        .to_string();
    assert!(e.contains("only supports bfloat16 and float16"), "{e}");
    if dev.is_cuda() {
        let (train, _) = loaders(1)?;
        let m = model(2, &Device::Cpu)?;
        let opt = Adam::new(m.parameters(), 0.05)?;
        let mut trial = Trial::new(m, opt, nn::cross_entropy)
            .progress(Progress::Quiet)
            .amp(Some(DType::F16))?
            .cuda_graphs(true)
            .to(dev)?
            .with_generators(Some(train), None, None);
        let e = trial.run(1).unwrap_err().to_string();
        assert!(e.contains("GradScaler"), "{e}");
    }
    Ok(())
}

device_test!(
    trial_with_amp_trains_as_f32_does,
    trial_learns_and_records_history,
    trial_resume_matches_uninterrupted,
    trial_with_cuda_graphs_trains_as_without
);

#[test]
fn early_stopping_and_errors() -> Result<()> {
    // the direction from the name, as Keras' and torchbearer's mode "auto":
    // larger is better for a name with "acc" in it
    use ember::train::Mode;
    for (name, mode) in [
        ("val_loss", Mode::Min),
        ("val_acc", Mode::Max),
        ("val_accuracy", Mode::Max),
        ("top_5_acc", Mode::Max),
        ("running_loss", Mode::Min),
    ] {
        assert_eq!(EarlyStopping::new(name, 2).direction(), mode, "{name}");
    }
    assert_eq!(
        EarlyStopping::new("val_accuracy", 2)
            .mode(Mode::Min)
            .direction(),
        Mode::Min
    );
    let _g = super::rng_lock();
    let (train, val) = loaders(5)?;
    let m = model(6, &Device::Cpu)?;
    // lr 0: nothing improves after the first epoch
    let opt = Sgd::new(m.parameters(), 0.0)?;
    let mut trial = Trial::new(m, opt, nn::cross_entropy)
        .progress(Progress::Quiet)
        .callback(EarlyStopping::new("val_loss", 2))
        .with_generators(Some(train.clone()), Some(val), None);
    assert_eq!(
        trial.run(10)?.len(),
        3,
        "best at epoch 1, two epochs without improvement"
    );

    let m = model(6, &Device::Cpu)?;
    let opt = Sgd::new(m.parameters(), 0.1)?;
    let mut trial = Trial::new(m, opt, nn::cross_entropy)
        .progress(Progress::Quiet)
        .callback(EarlyStopping::new("val_acc", 2))
        .with_generators(Some(train.clone()), None, None);
    let err = trial.run(3).unwrap_err();
    assert!(
        err.to_string().contains("\"val_acc\" is not recorded"),
        "{err}"
    );
    assert!(
        err.to_string().contains("needs a validation loader"),
        "{err}"
    );
    assert_eq!(trial.history().len(), 0, "refused before the first epoch");

    let m = model(6, &Device::Cpu)?;
    let opt = Sgd::new(m.parameters(), 0.1)?;
    assert!(Trial::new(m, opt, nn::cross_entropy)
        .metrics(&["f1"])
        .is_err());
    let m = model(6, &Device::Cpu)?;
    let opt = Sgd::new(m.parameters(), 0.1)?;
    let mut no_data = Trial::new(m, opt, nn::cross_entropy).progress(Progress::Quiet);
    assert!(no_data.run(1).is_err());
    assert!(no_data.evaluate().is_err());
    Ok(())
}

/// A resumed run stops early where an uninterrupted one does (the best value
/// and the epochs waited come from the restored history), and a scheduler on one
/// side of a resume only is refused.
#[test]
fn resuming_keeps_early_stopping_and_the_schedule() -> Result<()> {
    let _g = super::rng_lock();
    let dir = std::env::temp_dir().join(format!("ember-trial-stop-{}", std::process::id()));
    let make = |sched: bool| -> Result<Trial> {
        let (train, val) = loaders(5)?;
        let m = model(6, &Device::Cpu)?;
        // lr 0: nothing improves after the first epoch
        let opt = Sgd::new(m.parameters(), 0.0)?;
        let mut t = Trial::new(m, opt, nn::cross_entropy)
            .progress(Progress::Quiet)
            .callback(Checkpoint::new(&dir))
            .callback(EarlyStopping::new("val_loss", 3))
            .with_generators(Some(train), Some(val), None);
        if sched {
            let s = StepLr::new(t.optimizer(), 1, 0.5)?;
            t = t.scheduler(s);
        }
        Ok(t)
    };
    assert_eq!(make(false)?.run(10)?.len(), 4, "uninterrupted");
    let mut first = make(false)?;
    first.run(2)?;
    drop(first);
    let mut resumed = make(false)?.resume(&dir)?;
    assert_eq!(resumed.run(10)?.len(), 4, "resumed after two epochs");
    // a checkpoint without a scheduler, a trial with one
    let e = make(true)?.resume(&dir).err().expect("refused").to_string();
    assert!(e.contains("saved without a learning-rate scheduler"), "{e}");
    let mut with = make(true)?;
    with.run(1)?;
    drop(with);
    // refused before anything is loaded: parameters held elsewhere (here, by
    // this test) keep their values, not the checkpoint's
    let t = make(false)?;
    let held = t.model().parameters();
    // (moved off the checkpoint's values, which a new model shares: the same seed)
    ember::no_grad(|| held.iter().try_for_each(|p| p.add_(1.0).map(|_| ())))?;
    let before: Vec<Vec<f64>> = held.iter().map(vals).collect();
    let e = t.resume(&dir).err().expect("refused").to_string();
    assert!(e.contains("set the same scheduler before resume()"), "{e}");
    assert_eq!(held.iter().map(vals).collect::<Vec<_>>(), before);
    let saved = make(true)?.resume(&dir)?;
    let saved: Vec<Vec<f64>> = saved.model().parameters().iter().map(vals).collect();
    assert_ne!(
        saved, before,
        "the checkpoint's values differ from the moved ones"
    );
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}

/// A plateau scheduler lowers the rate after each epoch from the watched metric
/// as PyTorch's `ReduceLROnPlateau` stepped with it; a resumed run counts its
/// patience and cooldown from the restored history, so it ends as an
/// uninterrupted one; a metric no epoch records is refused before training.
#[test]
fn a_plateau_scheduler_follows_its_metric_and_resumes() -> Result<()> {
    use ember::optim::ReduceLrOnPlateau;
    let _g = super::rng_lock();
    let dir = std::env::temp_dir().join(format!("ember-trial-plateau-{}", std::process::id()));
    // a 30% improvement to count, a reduction at the first bad epoch, one
    // epoch of cooldown after each
    let plateau = || -> Result<ReduceLrOnPlateau> {
        let mut p = ReduceLrOnPlateau::new(0.5, 0)?;
        p.threshold = 0.3;
        p.cooldown = 1;
        Ok(p)
    };
    let make = |seed: u64, monitor: &str| -> Result<Trial> {
        let (train, val) = loaders(7)?;
        let m = model(seed, &Device::Cpu)?;
        let opt = Sgd::new(m.parameters(), 0.2)?.momentum(0.9)?;
        Ok(Trial::new(m, opt, nn::cross_entropy)
            .progress(Progress::Quiet)
            .plateau_scheduler(plateau()?, monitor)
            .callback(Checkpoint::new(&dir))
            .with_generators(Some(train), Some(val), None))
    };
    let mut a = make(8, "val_loss")?;
    let ha = a.run(7)?.clone();
    // the rates PyTorch's rule gives for these metrics
    let metric = ha.series("val_loss");
    let p = ember::Tensor::zeros([1], DType::F32, &Device::Cpu)?.requires_grad_(true)?;
    let mut opt = Sgd::new(vec![p], 0.2)?;
    let mut want_sched = plateau()?;
    let mut want = Vec::new();
    for &m in &metric {
        want.push(opt.lr());
        want_sched.step_metric(&mut opt, m);
    }
    let lrs: Vec<f64> = ha.records.iter().map(|r| r.lr).collect();
    assert_eq!(lrs, want, "{metric:?}");
    assert!(
        lrs.iter().any(|&l| l < 0.2),
        "the test lowers the rate: {lrs:?} for {metric:?}"
    );
    // interrupted after 3 epochs; a fresh trial resumes
    std::fs::remove_dir_all(&dir).ok();
    make(8, "val_loss")?.run(3)?;
    let mut c = make(99, "val_loss")?.resume(&dir)?;
    let hc = c.run(7)?.clone();
    assert_eq!(hc.records.iter().map(|r| r.lr).collect::<Vec<_>>(), lrs);
    assert_eq!(hc.series("val_loss"), metric);
    for (pa, pc) in a.model().parameters().iter().zip(c.model().parameters()) {
        assert_eq!(vals(pa), vals(&pc));
    }
    // a metric that no epoch records: refused before the first epoch
    let mut t = make(8, "val_acc")?;
    let e = t.run(2).expect_err("refused").to_string();
    assert!(e.contains("\"val_acc\" is not recorded"), "{e}");
    assert_eq!(t.history().len(), 0);
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}

/// A checkpoint that would not load is not written over the last good one:
/// gradients past float32's range make Adam's second moment infinite while the
/// parameters stay finite, and the run stops with an error naming the entry.
#[test]
fn a_checkpoint_of_an_infinite_optimizer_state_is_refused() -> Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let _g = super::rng_lock();
    let dir = std::env::temp_dir().join(format!("ember-trial-inf-{}", std::process::id()));
    let (train, _) = loaders(7)?;
    let m = model(8, &Device::Cpu)?;
    let opt = Adam::new(m.parameters(), 0.01)?;
    let huge = Arc::new(AtomicBool::new(false));
    let h = Arc::clone(&huge);
    let loss = move |out: &Tensor, y: &Tensor| -> Result<Tensor> {
        let l = nn::cross_entropy(out, y)?;
        if h.load(Ordering::SeqCst) {
            l.mul(1e30)
        } else {
            Ok(l)
        }
    };
    let mut t = Trial::new(m, opt, loss)
        .progress(Progress::Quiet)
        .callback(Checkpoint::new(&dir))
        .with_generators(Some(train), None, None);
    t.run(1)?;
    let before = std::fs::read(Checkpoint::file(&dir)).unwrap();
    huge.store(true, Ordering::SeqCst);
    let e = t.run(2).unwrap_err().to_string();
    assert!(
        e.contains("the optimizer's exp_avg_sq") && e.contains("nothing was saved"),
        "{e}"
    );
    assert_eq!(ember::io::first_non_finite(t.model())?, None);
    assert_eq!(std::fs::read(Checkpoint::file(&dir)).unwrap(), before);
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}

#[test]
fn top_k_accuracy_counts_the_target_among_the_k_best() -> Result<()> {
    let out = Tensor::new(
        [[0.1f32, 0.5, 0.4], [0.7, 0.2, 0.1], [0.2, 0.3, 0.5]],
        &Device::Cpu,
    )?;
    let target = Tensor::new([2i64, 0, 0], &Device::Cpu)?;
    let mut top1 = TopKAccuracy::new(1)?;
    let mut top2 = TopKAccuracy::new(2)?;
    let loss = Tensor::zeros([0usize; 0], DType::F32, &Device::Cpu)?;
    top1.update(&out, &target, &loss)?;
    top2.update(&out, &target, &loss)?;
    assert!((top1.value()? - 1.0 / 3.0).abs() < 1e-12);
    assert!((top2.value()? - 2.0 / 3.0).abs() < 1e-12);
    assert_eq!(top2.name(), "top_2_acc");
    assert!(TopKAccuracy::new(0).is_err());
    let bad = Tensor::new([0i64, 1], &Device::Cpu)?;
    assert!(top1.update(&out, &bad, &loss).is_err());
    Ok(())
}

#[test]
fn top_k_accuracy_takes_topk_s_picks_and_refuses_k_past_the_classes() -> Result<()> {
    // all scores equal: torch.topk picks the first k classes, so half of the
    // four targets are among the top 2 (not all four)
    let out = Tensor::zeros([4, 4], DType::F32, &Device::Cpu)?;
    let target = Tensor::new([0i64, 1, 2, 3], &Device::Cpu)?;
    let loss = Tensor::zeros([0usize; 0], DType::F32, &Device::Cpu)?;
    let mut top2 = TopKAccuracy::new(2)?;
    assert!(top2.value()?.is_nan(), "no value before any batch");
    top2.update(&out, &target, &loss)?;
    assert_eq!(top2.value()?, 0.5);
    let mut top5 = TopKAccuracy::new(5)?;
    let e = top5.update(&out, &target, &loss).unwrap_err();
    assert!(e.to_string().contains("k must be at most"), "{e}");
    Ok(())
}

/// What would waste a run is refused before its first step: a loader that
/// gives no batch (its epoch's metrics would be made up) and an early-stopping
/// metric no epoch records.
#[test]
fn a_run_that_cannot_work_is_refused_before_training() -> Result<()> {
    let _g = super::rng_lock();
    let (x, y) = blobs(10, 3)?;
    let few = DataLoader::new(TensorDataset::new(x, y)?, 16)?.drop_last(true);
    let (train, val) = loaders(3)?;
    let fresh = || -> Result<Trial> {
        let m = model(4, &Device::Cpu)?;
        let opt = Sgd::new(m.parameters(), 0.1)?;
        Ok(Trial::new(m, opt, nn::cross_entropy)
            .metrics(&["loss", "accuracy"])?
            .progress(Progress::Quiet))
    };
    let mut t = fresh()?.with_generators(Some(few.clone()), None, None);
    let e = t.run(2).unwrap_err().to_string();
    assert!(
        e.contains("training loader gives no batch") && e.contains("10 samples"),
        "{e}"
    );
    assert_eq!(t.history().len(), 0);
    let mut t = fresh()?.with_generators(Some(train.clone()), Some(few.clone()), None);
    let e = t.run(2).unwrap_err().to_string();
    assert!(e.contains("validation loader gives no batch"), "{e}");
    assert_eq!(t.history().len(), 0);
    let e = t.evaluate().unwrap_err().to_string();
    assert!(e.contains("validation loader gives no batch"), "{e}");
    // the accuracy metric is recorded as acc
    let mut t = fresh()?
        .callback(EarlyStopping::new("val_accuracy", 2))
        .with_generators(Some(train.clone()), Some(val.clone()), None);
    let e = t.run(2).unwrap_err().to_string();
    assert!(
        e.contains("\"val_accuracy\" is not recorded") && e.contains("\"val_acc\""),
        "{e}"
    );
    assert_eq!(t.history().len(), 0);
    let mut t = fresh()?
        .callback(EarlyStopping::new("val_acc", 2))
        .with_generators(Some(train), Some(val), None);
    assert_eq!(t.run(1)?.len(), 1);
    Ok(())
}

#[test]
fn history_csv_round_trip_and_svg_plot() -> Result<()> {
    let _g = super::rng_lock();
    let (train, val) = loaders(7)?;
    let m = model(8, &Device::Cpu)?;
    let opt = Adam::new(m.parameters(), 0.05)?;
    let mut trial = Trial::new(m, opt, nn::cross_entropy)
        .metrics(&["loss", "accuracy"])?
        .progress(Progress::Quiet)
        .with_generators(Some(train), Some(val), None);
    let h = trial.run(3)?.clone();
    let back = History::from_csv(&h.to_csv(), "test")?;
    assert_eq!(back, h);
    assert!(History::from_csv("a,b\n1,2\n", "x.csv").is_err());
    let dir = std::env::temp_dir().join(format!("ember-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("curves.svg");
    h.write_svg(&svg)?;
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg") && text.contains("val_loss") && text.contains("acc"));
    assert!(History::default().write_svg(dir.join("empty.svg")).is_err());
    // the same plot as a PNG: a valid image of the expected size, not blank
    let png_path = dir.join("curves.png");
    h.write_plot(&png_path)?;
    let bytes = std::fs::read(&png_path).unwrap();
    let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    let mut reader = decoder.read_info().unwrap();
    let mut img = vec![0u8; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut img).unwrap();
    assert_eq!((info.width, info.height), (960, 360));
    let dark = img.chunks(3).filter(|p| p.iter().all(|&c| c < 64)).count();
    assert!(
        dark > 1000,
        "the axes, labels and text draw dark pixels ({dark})"
    );
    let e = h
        .write_plot(dir.join("curves.jpg"))
        .unwrap_err()
        .to_string();
    assert!(e.contains(".svg or .png"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}

fn generators_give_each_thread_its_own_stream(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    let draw = |g: &ember::Generator| -> Result<Vec<f32>> {
        g.scope(|| Tensor::randn([64], dev)?.to_vec::<f32>())
    };
    // the same seed, the same values; another seed, others
    let a = draw(&ember::Generator::new(3))?;
    assert_eq!(a, draw(&ember::Generator::new(3))?);
    assert_ne!(a, draw(&ember::Generator::new(4))?);
    // a clone shares the stream: two draws continue each other
    let g = ember::Generator::new(3);
    let (h, first) = (g.clone(), draw(&g)?);
    assert_eq!(first, a);
    assert_ne!(draw(&h)?, a);
    h.manual_seed(3);
    assert_eq!(draw(&g)?, a);
    assert_eq!(g.initial_seed(), 3);
    // the global stream does not move inside a scope
    ember::manual_seed(11);
    let g1 = Tensor::rand([8], dev)?.to_vec::<f32>()?;
    let g2 = Tensor::rand([8], dev)?.to_vec::<f32>()?;
    ember::manual_seed(11);
    assert_eq!(Tensor::rand([8], dev)?.to_vec::<f32>()?, g1);
    draw(&ember::Generator::new(5))?;
    assert_eq!(Tensor::rand([8], dev)?.to_vec::<f32>()?, g2);
    // threads with generators of their own get the values they get alone, while
    // this thread draws from the global stream all along
    let alone: Vec<Vec<f32>> = (0..3)
        .map(|i| draw(&ember::Generator::new(100 + i)))
        .collect::<Result<_>>()?;
    let dev = *dev;
    let handles: Vec<_> = (0..3)
        .map(|i| {
            std::thread::spawn(move || -> Result<Vec<f32>> {
                let g = ember::Generator::new(100 + i);
                let mut last = Vec::new();
                for _ in 0..20 {
                    g.manual_seed(100 + i);
                    last = g.scope(|| Tensor::randn([64], &dev)?.to_vec::<f32>())?;
                }
                Ok(last)
            })
        })
        .collect();
    for _ in 0..50 {
        Tensor::randn([64], &dev)?;
    }
    for (h, want) in handles.into_iter().zip(&alone) {
        assert_eq!(&h.join().unwrap()?, want);
    }
    // dropout masks and shuffling from generators
    let x = Tensor::ones([4, 32], DType::F32, &dev)?;
    let mask = |seed: u64| -> Result<Vec<f32>> {
        let d = nn::Dropout::new(0.5)?.generator(&ember::Generator::new(seed));
        d.forward(&x)?.to_vec::<f32>()
    };
    assert_eq!(mask(1)?, mask(1)?);
    assert_ne!(mask(1)?, mask(2)?);
    let (x, y) = blobs(32, 1)?;
    let order = |seed: u64| -> Result<Vec<usize>> {
        let l = DataLoader::new(TensorDataset::new(x.clone(), y.clone())?, 8)?
            .generator(&ember::Generator::new(seed));
        Ok(l.sample_order(0))
    };
    assert_eq!(order(9)?, order(9)?);
    assert_ne!(order(9)?, order(10)?);
    Ok(())
}

device_test!(generators_give_each_thread_its_own_stream);

#[test]
fn a_trial_can_move_to_another_thread() -> Result<()> {
    let _g = super::rng_lock();
    fn send<T: Send>(t: T) -> T {
        t
    }
    let (train, _) = loaders(2)?;
    let m = model(2, &Device::Cpu)?;
    let opt = Adam::new(m.parameters(), 0.05)?;
    let trial = send(
        Trial::new(m, opt, nn::cross_entropy)
            .progress(Progress::Quiet)
            .with_generators(Some(train), None, None),
    );
    let epochs = std::thread::spawn(move || -> Result<usize> {
        let mut trial = trial;
        Ok(trial.run(2)?.len())
    })
    .join()
    .unwrap()?;
    assert_eq!(epochs, 2);
    Ok(())
}

/// An optimizer of a user's that says nothing of its settings (the trait's
/// default `config`).
struct Quiet(Sgd);

impl ember::optim::Optimizer for Quiet {
    fn step(&mut self) -> Result<()> {
        self.0.step()
    }
    fn zero_grad(&self) {
        self.0.zero_grad()
    }
    fn lr(&self) -> f64 {
        self.0.lr()
    }
    fn set_lr(&mut self, lr: f64) {
        self.0.set_lr(lr)
    }
    fn state(&self) -> Result<Vec<(String, Tensor)>> {
        self.0.state()
    }
    fn load_state(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        self.0.load_state(state)
    }
    fn parameters(&self) -> &[Tensor] {
        self.0.parameters()
    }
    fn set_parameters(&mut self, params: Vec<Tensor>) -> Result<()> {
        self.0.set_parameters(params)
    }
}

#[test]
fn an_optimizer_without_a_config_records_none() -> Result<()> {
    let _g = super::rng_lock();
    let m = model(1, &Device::Cpu)?;
    let opt = Quiet(Sgd::new(m.parameters(), 0.1)?);
    assert!(ember::optim::Optimizer::config(&opt).is_empty());
    let trial = Trial::new(m, opt, nn::cross_entropy).config([("seed", 1)]);
    assert_eq!(trial.run_config(), [("seed".to_string(), "1".to_string())]);
    Ok(())
}

/// Two SGD groups at rates 0.1 and 0.02, as the PyTorch optimizer the values
/// below came from.
fn two_groups() -> Result<ember::optim::Groups> {
    let p = || Tensor::zeros([1], DType::F32, &Device::Cpu)?.requires_grad_(true);
    ember::optim::Groups::new(vec![
        Box::new(Sgd::new(vec![p()?], 0.1)?.momentum(0.9)?),
        Box::new(Sgd::new(vec![p()?], 0.02)?.momentum(0.9)?),
    ])
}

/// Schedules build on each group's current rate, as PyTorch's `step()` does:
/// every rate below is PyTorch 2.15's, bit for bit (Python's `repr`), for
/// two schedules stepped together, a rate set by hand between steps, each
/// schedule over its epochs (the cosine past its period), the closed form of
/// `step(epoch)`, and a schedule resumed from an optimizer's saved state.
#[test]
fn schedules_chain_on_the_current_rate_as_pytorch_s() -> Result<()> {
    use ember::optim::{CosineAnnealingLr, Groups, LinearLr, LrScheduler, SequentialLr};
    // StepLR(2, 0.5) and CosineAnnealingLR(4) stepped together
    let mut opt = two_groups()?;
    let mut a = StepLr::new(&opt, 2, 0.5)?;
    let mut b = CosineAnnealingLr::new(&opt, 4, 0.0)?;
    let mut got = Vec::new();
    for _ in 0..5 {
        a.step(&mut opt);
        b.step(&mut opt);
        got.push(opt.group_lrs());
    }
    let want: &[[f64; 2]] = &[
        [0.08535533905932738, 0.017071067811865476],
        [0.025, 0.005],
        [0.0073223304703363135, 0.0014644660940672626],
        [0.0, 0.0],
        [0.014644660940672622, 0.0029289321881345244],
    ];
    assert_eq!(got, want, "StepLR + CosineAnnealingLR");
    assert_eq!(b.last_lrs(), opt.group_lrs());
    // a rate set by hand after the first epoch is the one decayed
    let mut opt = two_groups()?;
    let mut s = StepLr::new(&opt, 2, 0.5)?;
    let mut got = Vec::new();
    for i in 0..5 {
        if i == 1 {
            opt.set_lr(0.01);
        }
        s.step(&mut opt);
        got.push(opt.lr());
    }
    assert_eq!(
        got,
        [0.1, 0.005, 0.005, 0.0025, 0.0025],
        "set_lr, then StepLR"
    );
    // each schedule alone: the rates after building it, then after each step
    type Build = fn(&mut Groups) -> Result<Box<dyn LrScheduler>>;
    let cases: [(&str, Build, &[[f64; 2]]); 8] = [
        (
            "step",
            |o| Ok(Box::new(StepLr::new(o, 3, 0.5)?)),
            &[
                [0.1, 0.02],
                [0.1, 0.02],
                [0.1, 0.02],
                [0.05, 0.01],
                [0.05, 0.01],
                [0.05, 0.01],
                [0.025, 0.005],
                [0.025, 0.005],
            ],
        ),
        (
            "cos",
            |o| Ok(Box::new(CosineAnnealingLr::new(o, 4, 0.01)?)),
            &[
                [0.1, 0.02],
                [0.08681980515339464, 0.01853553390593274],
                [0.05500000000000001, 0.015],
                [0.023180194846605363, 0.011464466094067262],
                [0.01, 0.01],
                [0.023180194846605363, 0.011464466094067262],
                [0.05500000000000002, 0.015],
                [0.08681980515339469, 0.01853553390593274],
                [0.10000000000000006, 0.02],
                [0.0868198051533947, 0.01853553390593274],
                [0.05500000000000005, 0.015000000000000003],
                [0.023180194846605412, 0.011464466094067267],
                [0.01, 0.01],
                [0.023180194846605363, 0.011464466094067262],
            ],
        ),
        (
            "linear",
            |o| Ok(Box::new(LinearLr::new(o, 0.25, 1.0, 4)?)),
            &[
                [0.025, 0.005],
                [0.043750000000000004, 0.00875],
                [0.06250000000000001, 0.0125],
                [0.08125000000000002, 0.01625],
                [0.10000000000000002, 0.02],
                [0.10000000000000002, 0.02],
                [0.10000000000000002, 0.02],
            ],
        ),
        (
            "linear_decay",
            |o| Ok(Box::new(LinearLr::new(o, 1.0, 0.2, 5)?)),
            &[
                [0.1, 0.02],
                [0.084, 0.0168],
                [0.068, 0.0136],
                [0.052, 0.0104],
                [0.036, 0.0072],
                [0.019999999999999997, 0.003999999999999999],
                [0.019999999999999997, 0.003999999999999999],
            ],
        ),
        (
            "sequential",
            |o| {
                let warm: Box<dyn LrScheduler> = Box::new(LinearLr::new(o, 0.25, 1.0, 3)?);
                let cos: Box<dyn LrScheduler> = Box::new(CosineAnnealingLr::new(o, 8, 0.001)?);
                Ok(Box::new(SequentialLr::new(o, vec![warm, cos], vec![3])?))
            },
            &[
                [0.025, 0.005],
                [0.05, 0.01],
                [0.07500000000000001, 0.015],
                [0.1, 0.02],
                [0.0962320368593087, 0.019276855558857223],
                [0.0855017856687341, 0.0172175144212722],
                [0.06944282990207196, 0.014135492607468353],
                [0.0505, 0.010499999999999999],
                [0.03155717009792806, 0.006864507392531647],
                [0.0154982143312659, 0.0037824855787277987],
                [0.004767963140691306, 0.001723144441142776],
                [0.001, 0.001],
                [0.004767963140691307, 0.001723144441142776],
                [0.01549821433126591, 0.003782485578727801],
            ],
        ),
        (
            "warmup_cosine",
            |o| Ok(Box::new(SequentialLr::warmup_cosine(o, 3, 10, 0.001)?)),
            &[
                [0.001, 0.0002],
                [0.034, 0.0068000000000000005],
                [0.067, 0.013400000000000002],
                [0.1, 0.02],
                [0.09509795896116975, 0.019059204245072982],
                [0.08136274519200731, 0.01642315311765797],
                [0.061514786230837566, 0.012613948872584987],
                [0.03948521376916245, 0.008386051127415015],
                [0.019637254807992697, 0.004576846882342032],
                [0.005902041038830259, 0.001940795754927019],
                [0.001, 0.001],
                [0.005902041038830253, 0.001940795754927018],
            ],
        ),
        (
            // (`powf`: Python's `0.95 ** e` is C's `pow`)
            "lambda",
            |o| {
                Ok(Box::new(ember::optim::LambdaLr::new(o, |e| {
                    0.95f64.powf(e as f64)
                })))
            },
            &[
                [0.1, 0.02],
                [0.095, 0.019],
                [0.09025, 0.01805],
                [0.0857375, 0.0171475],
                [0.081450625, 0.016290125],
                [0.07737809374999999, 0.015475618749999996],
                [0.07350918906249998, 0.014701837812499997],
            ],
        ),
        (
            // the last step PyTorch allows (12) goes past the minimum: not here
            "onecycle_three_phase",
            |o| {
                let three = ember::optim::OneCycleOptions {
                    three_phase: true,
                    ..Default::default()
                };
                Ok(Box::new(ember::optim::OneCycleLr::with_options(
                    o, 0.5, 12, three,
                )?))
            },
            &[
                [0.020000000000000018, 0.020000000000000018],
                [0.17489482710979154, 0.17489482710979154],
                [0.43964257956106434, 0.43964257956106434],
                [0.4725094461567704, 0.4725094461567704],
                [0.2310711967387223, 0.2310711967387223],
                [0.02697396381774749, 0.02697396381774749],
                [0.0190758466212899, 0.0190758466212899],
                [0.015612309466558462, 0.015612309466558462],
                [0.01054233494694559, 0.01054233494694559],
                [0.005317384001442797, 0.005317384001442797],
                [0.0014332850955002772, 0.0014332850955002772],
                [2e-06, 2e-06],
            ],
        ),
    ];
    for (name, build, want) in cases {
        let mut opt = two_groups()?;
        let mut s = build(&mut opt)?;
        let mut got = vec![opt.group_lrs()];
        assert_eq!(s.last_lrs(), got[0], "{name}: the rates it starts with");
        for _ in 1..want.len() {
            s.step(&mut opt);
            assert_eq!(s.last_lrs(), opt.group_lrs(), "{name}");
            got.push(opt.group_lrs());
        }
        assert_eq!(got, want, "{name}");
        // resumed from the optimizer's state after 5 epochs: the same rates on
        let mut opt = two_groups()?;
        let mut s = build(&mut opt)?;
        for _ in 0..5 {
            s.step(&mut opt);
        }
        let state = opt.state()?;
        let mut again = two_groups()?;
        let mut resumed = build(&mut again)?;
        again.load_state(&state)?;
        resumed.set_epoch(5);
        for (k, want) in want.iter().enumerate().skip(6) {
            resumed.step(&mut again);
            assert_eq!(again.group_lrs(), want, "{name} resumed, epoch {k}");
        }
    }
    // PyTorch's `step(epoch)`: the closed form from the initial rates
    type Closed = fn(&Groups) -> Result<Box<dyn LrScheduler>>;
    let closed: [(&str, Closed, &[[f64; 2]]); 2] = [
        (
            "step",
            |o| Ok(Box::new(StepLr::new(o, 3, 0.5)?)),
            &[
                [0.1, 0.02],
                [0.1, 0.02],
                [0.1, 0.02],
                [0.05, 0.01],
                [0.05, 0.01],
                [0.05, 0.01],
                [0.025, 0.005],
                [0.025, 0.005],
                [0.025, 0.005],
            ],
        ),
        (
            "cos",
            |o| Ok(Box::new(CosineAnnealingLr::new(o, 4, 0.01)?)),
            &[
                [0.1, 0.02],
                [0.08681980515339464, 0.01853553390593274],
                [0.05500000000000001, 0.015],
                [0.023180194846605363, 0.011464466094067262],
                [0.01, 0.01],
                [0.023180194846605356, 0.011464466094067262],
                [0.055, 0.015],
                [0.08681980515339464, 0.01853553390593274],
                [0.1, 0.02],
            ],
        ),
    ];
    for (name, build, want) in closed {
        for (e, want) in want.iter().enumerate() {
            let mut opt = two_groups()?;
            let mut s = build(&opt)?;
            s.step(&mut opt);
            s.step_to(&mut opt, e);
            assert_eq!(opt.group_lrs(), want, "{name} step({e})");
            assert_eq!((s.epoch(), s.last_lrs()), (e, want.to_vec()));
        }
    }
    let want = [
        [0.025, 0.005],
        [0.043750000000000004, 0.00875],
        [0.0625, 0.0125],
        [0.08125, 0.01625],
        [0.1, 0.02],
        [0.1, 0.02],
    ];
    for (e, want) in want.iter().enumerate() {
        let mut opt = two_groups()?;
        let mut s = LinearLr::new(&mut opt, 0.25, 1.0, 4)?;
        s.step_to(&mut opt, e);
        assert_eq!(opt.group_lrs(), want, "linear step({e})");
    }
    Ok(())
}

/// A checkpoint folder that cannot be made is refused before the first epoch
/// (not after it), with the folder named and what to do; a missing one is
/// made then.
#[test]
fn a_checkpoint_folder_is_checked_before_training() -> Result<()> {
    let _g = super::rng_lock();
    let base = std::env::temp_dir().join(format!("ember-trial-ckdir-{}", std::process::id()));
    std::fs::create_dir_all(&base).ok();
    let file = base.join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let (train, _) = loaders(3)?;
    let fresh = |dir: &std::path::Path| -> Result<Trial> {
        let m = model(4, &Device::Cpu)?;
        let opt = Sgd::new(m.parameters(), 0.1)?;
        Ok(Trial::new(m, opt, nn::cross_entropy)
            .progress(Progress::Quiet)
            .callback(Checkpoint::new(dir))
            .with_generators(Some(train.clone()), None, None))
    };
    let under_a_file = file.join("ck");
    let mut t = fresh(&under_a_file)?;
    let e = t.run(2).unwrap_err().to_string();
    assert!(
        e.contains(&under_a_file.display().to_string())
            && e.contains("checked before training")
            && e.contains("choose a folder that can be written"),
        "{e}"
    );
    assert_eq!(t.history().len(), 0, "refused before the first epoch");
    let e = fresh(&file)?.run(1).unwrap_err().to_string();
    assert!(e.contains("this is a file, and a folder is needed"), "{e}");
    // a missing folder (and its parents) is made before training
    let deep = base.join("new").join("ck");
    let mut t = fresh(&deep)?;
    t.run(1)?;
    assert!(Checkpoint::file(&deep).is_file());
    let leftovers: Vec<_> = std::fs::read_dir(&deep)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(".ember-write-check")
        })
        .collect();
    assert!(leftovers.is_empty(), "the probe file is removed");
    std::fs::remove_dir_all(&base).ok();
    Ok(())
}

/// A NaN as the first value is no best that nothing beats: early stopping
/// starts from the mode's worst value (±inf, as torchbearer's), so the values
/// after it improve.
#[test]
fn early_stopping_after_a_nan_first_value_still_sees_improvements() -> Result<()> {
    use ember::train::{Callback, Control, EpochEnd, EpochRecord, Mode};
    let m = nn::Linear::new(1, 1, &Device::Cpu)?;
    let opt = Sgd::new(m.parameters(), 0.1)?;
    for (mode, values, best) in [
        (Mode::Min, [f64::NAN, 1.0, 0.5, 0.25, 0.1], 0.1),
        (Mode::Max, [f64::NAN, 0.1, 0.2, 0.3, 0.4], 0.4),
    ] {
        let mut stop = EarlyStopping::new("loss", 2).mode(mode);
        let mut h = History::default();
        for (i, &v) in values.iter().enumerate() {
            h.records.push(EpochRecord {
                epoch: i + 1,
                metrics: vec![("loss".into(), v)],
                lr: 0.1,
                seconds: 0.0,
                samples_per_sec: 0.0,
            });
            let ctx = EpochEnd {
                epoch: i + 1,
                history: &h,
                model: &m,
                optimizer: &opt,
                scheduler: None,
                config: &[],
                grad_scaler: None,
            };
            assert_eq!(stop.on_epoch_end(&ctx)?, Control::Continue, "{mode:?} {i}");
            if i == 0 {
                assert_eq!(stop.best(), None, "a NaN is no best");
            }
        }
        assert_eq!(stop.best(), Some(best), "{mode:?}");
    }
    // NaN after a best is no improvement either: two of them stop the run
    let mut stop = EarlyStopping::new("loss", 2);
    let mut h = History::default();
    let mut last = Control::Continue;
    for (i, v) in [1.0, f64::NAN, f64::NAN].into_iter().enumerate() {
        h.records.push(EpochRecord {
            epoch: i + 1,
            metrics: vec![("loss".into(), v)],
            lr: 0.1,
            seconds: 0.0,
            samples_per_sec: 0.0,
        });
        let ctx = EpochEnd {
            epoch: i + 1,
            history: &h,
            model: &m,
            optimizer: &opt,
            scheduler: None,
            config: &[],
            grad_scaler: None,
        };
        last = stop.on_epoch_end(&ctx)?;
    }
    assert_eq!((last, stop.best()), (Control::Stop, Some(1.0)));
    Ok(())
}

/// Targets that are no class (the -100 of padding) are an error naming the
/// metric and the values, not a gather's index error or a silent miss;
/// `ignore_index` skips them; no sample gives NaN, not 0.
#[test]
fn accuracy_refuses_targets_outside_the_classes_unless_ignored() -> Result<()> {
    let dev = Device::Cpu;
    let out = Tensor::new(
        [
            [0.1f32, 0.5, 0.4],
            [0.7, 0.2, 0.1],
            [0.2, 0.3, 0.5],
            [0.3, 0.3, 0.4],
        ],
        &dev,
    )?;
    let loss = Tensor::zeros([0usize; 0], DType::F32, &dev)?;
    let padded = Tensor::new([2i64, -100, 0, 2], &dev)?;
    for k in [1, 2] {
        let mut acc = TopKAccuracy::new(k)?;
        acc.update(&out, &padded, &loss)?;
        acc.update(&out, &Tensor::new([3i64, 0, 0, 2], &dev)?, &loss)?;
        let e = acc.value().unwrap_err().to_string();
        assert!(
            e.contains(&format!("metric {}", acc.name()))
                && e.contains("2 targets are not classes of the 3 scores (0 to 2)")
                && e.contains("from -100 to 3")
                && e.contains(&format!("TopKAccuracy::new({k})?.ignore_index")),
            "{e}"
        );
        // a new phase starts clean
        acc.reset();
        acc.update(&out, &Tensor::new([2i64, 0, 0, 1], &dev)?, &loss)?;
        assert!(acc.value().is_ok());
    }
    // ignored: neither a hit nor a sample (the three others: 1 of 3 top-1
    // hits, 2 of 3 top-2)
    let mut top1 = TopKAccuracy::new(1)?.ignore_index(-100);
    let mut top2 = TopKAccuracy::new(2)?.ignore_index(-100);
    for m in [&mut top1, &mut top2] {
        m.update(&out, &padded, &loss)?;
    }
    assert_eq!((top1.value()?, top2.value()?), (1.0 / 3.0, 2.0 / 3.0));
    // an ignore_index inside the classes skips that class
    let mut skip0 = TopKAccuracy::new(1)?.ignore_index(0);
    skip0.update(&out, &Tensor::new([2i64, 0, 0, 2], &dev)?, &loss)?;
    assert_eq!(skip0.value()?, 0.5);
    // no sample: NaN (an empty batch, or every target ignored), also for the loss
    let empty = Tensor::zeros([0, 3], DType::F32, &dev)?;
    let none = Tensor::zeros([0], DType::I64, &dev)?;
    let mut acc = TopKAccuracy::new(1)?;
    acc.update(&empty, &none, &loss)?;
    assert!(acc.value()?.is_nan());
    let mut all_ignored = TopKAccuracy::new(1)?.ignore_index(-100);
    all_ignored.update(&out, &Tensor::new([-100i64; 4], &dev)?, &loss)?;
    assert!(all_ignored.value()?.is_nan());
    let mut l = ember::train::Loss::default();
    l.update(&empty, &none, &Tensor::scalar(f32::NAN, &dev)?)?;
    assert!(l.value()?.is_nan());
    Ok(())
}

/// Two metrics of one history column are refused, by name or added one by one.
#[test]
fn a_metric_twice_is_refused() -> Result<()> {
    let _g = super::rng_lock();
    let (train, _) = loaders(3)?;
    let fresh = || -> Result<Trial> {
        let m = model(4, &Device::Cpu)?;
        let opt = Sgd::new(m.parameters(), 0.1)?;
        Ok(Trial::new(m, opt, nn::cross_entropy).progress(Progress::Quiet))
    };
    for names in [["acc", "top_1_acc"], ["accuracy", "acc"]] {
        let e = fresh()?.metrics(&names).err().expect("refused").to_string();
        assert!(
            e.contains(&format!(
                "{:?} and {:?} are both recorded as \"acc\"",
                names[0], names[1]
            )),
            "{e}"
        );
    }
    let mut t = fresh()?
        .metrics(&["loss", "acc"])?
        .metric(TopKAccuracy::new(1)?)
        .with_generators(Some(train), None, None);
    let e = t.run(1).unwrap_err().to_string();
    assert!(e.contains("two metrics are recorded as \"acc\""), "{e}");
    assert_eq!(t.history().len(), 0);
    Ok(())
}
