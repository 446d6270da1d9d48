//! safetensors files, state dicts and checkpoints.

use super::{assert_close, vals};
use ember::nn::{self, Module};
use ember::optim::{Adam, Optimizer};
use ember::prelude::*;

fn tmp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("ember-test-{}-{name}", std::process::id()))
}

fn round_trip_and_errors(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    let ts: Vec<(String, Tensor)> = DType::ALL
        .iter()
        .map(|&d| {
            Ok((
                format!("t_{d}"),
                Tensor::arange(0f64, 6., dev)?
                    .reshape([2, 3])?
                    .to_dtype(d)?,
            ))
        })
        .collect::<Result<_>>()?;
    let path = tmp(&format!("all-{dev}.safetensors"));
    ember::io::save(&ts, &path)?;
    let back = ember::io::load(&path, dev)?;
    assert_eq!(back.len(), ts.len());
    for (name, t) in &ts {
        let (_, b) = back
            .iter()
            .find(|(n, _)| n == name)
            .expect("every tensor comes back");
        assert_eq!(
            (b.dtype(), b.shape(), vals(b)),
            (t.dtype(), t.shape(), vals(t))
        );
    }
    // a truncated file and a missing file are errors
    let bytes = std::fs::read(&path).unwrap();
    let cut = tmp(&format!("cut-{dev}.safetensors"));
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let e = ember::io::load(&cut, dev).unwrap_err().to_string();
    assert!(e.contains("not a valid safetensors file"), "{e}");
    assert!(ember::io::load(tmp("missing"), dev).is_err());
    std::fs::remove_file(&path).ok();
    std::fs::remove_file(&cut).ok();
    // state dicts check names and shapes
    let model = nn::Sequential::new()
        .add(nn::Linear::new(3, 4, dev)?)
        .add(nn::ReLU)
        .add(nn::Linear::new(4, 2, dev)?);
    let p = tmp(&format!("model-{dev}.safetensors"));
    ember::io::save_state_dict(&model, &p)?;
    let other = nn::Sequential::new()
        .add(nn::Linear::new(3, 5, dev)?)
        .add(nn::ReLU)
        .add(nn::Linear::new(5, 2, dev)?);
    let e = ember::io::load_state_dict(&other, &p)
        .unwrap_err()
        .to_string();
    assert!(e.contains("size mismatch for 0.weight"), "{e}");
    let fewer = nn::Sequential::new().add(nn::Linear::new(3, 4, dev)?);
    let e = ember::io::load_state_dict(&fewer, &p)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("unexpected keys") && e.contains("2.weight"),
        "{e}"
    );
    std::fs::remove_file(&p).ok();
    Ok(())
}

fn checkpoint_resumes_training(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    let make = || -> Result<nn::Sequential> {
        ember::manual_seed(7);
        Ok(nn::Sequential::new()
            .add(nn::Linear::new(4, 8, dev)?)
            .add(nn::ReLU)
            .add(nn::Linear::new(8, 3, dev)?))
    };
    ember::manual_seed(8);
    let x = Tensor::randn([32, 4], dev)?;
    let y = Tensor::randint(0, 3, [32], dev)?;
    let train = |model: &nn::Sequential, opt: &mut Adam, epochs: usize| -> Result<f64> {
        let mut last = 0.0;
        for _ in 0..epochs {
            let loss = nn::cross_entropy(&model.forward(&x)?, &y)?;
            opt.zero_grad();
            loss.backward()?;
            opt.step()?;
            last = loss.item::<f64>()?;
        }
        Ok(last)
    };
    let full = make()?;
    let mut opt = Adam::new(full.parameters(), 0.01)?;
    let uninterrupted = train(&full, &mut opt, 40)?;
    let first = make()?;
    let mut opt1 = Adam::new(first.parameters(), 0.01)?;
    train(&first, &mut opt1, 20)?;
    let path = tmp(&format!("ckpt-{dev}.safetensors"));
    ember::io::save_checkpoint(&first, &opt1, &path)?;
    // a fresh model and optimizer continue from the file
    let resumed = nn::Sequential::new()
        .add(nn::Linear::new(4, 8, dev)?)
        .add(nn::ReLU)
        .add(nn::Linear::new(8, 3, dev)?);
    let mut opt2 = Adam::new(resumed.parameters(), 0.5)?;
    ember::io::load_checkpoint(&resumed, &mut opt2, &path)?;
    assert_eq!((opt2.lr(), opt2.steps()), (0.01, 20));
    let last = train(&resumed, &mut opt2, 20)?;
    assert_eq!(
        last, uninterrupted,
        "resumed training must match the uninterrupted run"
    );
    // another optimizer's state is refused
    let mut sgd = ember::optim::Sgd::new(resumed.parameters(), 0.1)?;
    assert!(ember::io::load_checkpoint(&resumed, &mut sgd, &path).is_err());
    std::fs::remove_file(&path).ok();
    Ok(())
}

/// The name of the tensor whose bytes end last in a safetensors file (the one a
/// flip of the file's last byte lands in).
fn last_tensor(bytes: &[u8]) -> String {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data_len = bytes.len() - 8 - n;
    header
        .as_object()
        .unwrap()
        .iter()
        .find(|(k, v)| {
            *k != "__metadata__" && v["data_offsets"][1].as_u64() == Some(data_len as u64)
        })
        .map(|(k, _)| k.clone())
        .expect("a tensor ends at the end of the file")
}

fn checksums_catch_damage(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    let model = nn::Sequential::new()
        .add(nn::Linear::new(3, 4, dev)?)
        .add(nn::ReLU)
        .add(nn::Linear::new(4, 2, dev)?);
    let p = tmp(&format!("crc-{dev}.safetensors"));
    ember::io::save_state_dict(&model, &p)?;
    let mut bytes = std::fs::read(&p).unwrap();
    let last = last_tensor(&bytes);
    // one flipped bit in the data: an error naming the tensor, for both readers
    let end = bytes.len() - 1;
    bytes[end] ^= 0x10;
    std::fs::write(&p, &bytes).unwrap();
    for e in [
        ember::io::load(&p, dev).unwrap_err(),
        ember::io::load_state_dict(&model, &p).unwrap_err(),
    ] {
        let e = e.to_string();
        assert!(e.contains(&format!("tensor {last:?} is damaged")), "{e}");
    }
    // flipped back, it loads
    bytes[end] ^= 0x10;
    std::fs::write(&p, &bytes).unwrap();
    ember::io::load_state_dict(&model, &p)?;

    // a file without checksums (as PyTorch's safetensors writes them) loads, and
    // its own metadata is kept
    let header =
        br#"{"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    let mut plain = (header.len() as u64).to_le_bytes().to_vec();
    plain.extend_from_slice(header);
    plain.extend_from_slice(bytemuck_f32(&[1.5, -2.0]));
    std::fs::write(&p, &plain).unwrap();
    let back = ember::io::load(&p, dev)?;
    assert_eq!(back[0].0, "w");
    assert_eq!(back[0].1.to_vec::<f32>()?, [1.5, -2.0]);
    assert_eq!(
        ember::io::metadata(&p)?,
        [("format".to_string(), "pt".to_string())]
    );

    // metadata of the caller's round-trips; ember's checksum keys are reserved
    let t = vec![("a".to_string(), Tensor::ones([2], DType::F32, dev)?)];
    let meta = vec![("run".to_string(), "7".to_string())];
    ember::io::save_with_metadata(&t, &meta, &p)?;
    // (and the format Hugging Face's loaders look for, unless given)
    let pt = ("format".to_string(), "pt".to_string());
    assert_eq!(ember::io::metadata(&p)?, [pt, meta[0].clone()]);
    let mut flax = meta.clone();
    flax.push(("format".to_string(), "flax".to_string()));
    ember::io::save_with_metadata(&t, &flax, &p)?;
    flax.sort();
    assert_eq!(ember::io::metadata(&p)?, flax);
    let unnamed = vec![(String::new(), Tensor::ones([2], DType::F32, dev)?)];
    assert!(ember::io::save(&unnamed, &p).is_err());
    let bad = vec![("crc32.a".to_string(), "0".to_string())];
    assert!(ember::io::save_with_metadata(&t, &bad, &p).is_err());
    // the header's metadata entry is no tensor name: refused before anything
    // is written (the file from before stays)
    let before = std::fs::read(&p).unwrap();
    let named = vec![(
        "__metadata__".to_string(),
        Tensor::ones([1], DType::F32, dev)?,
    )];
    let e = ember::io::save(&named, &p).unwrap_err().to_string();
    assert!(e.contains("__metadata__"), "{e}");
    assert_eq!(std::fs::read(&p).unwrap(), before);
    std::fs::remove_file(&p).ok();
    Ok(())
}

fn bytemuck_f32(v: &[f32]) -> &[u8] {
    // the test's own little-endian view (x86 and ARM Linux are little-endian)
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

fn non_finite_values_are_refused(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    let model = nn::Linear::new(3, 2, dev)?;
    let mut w = model.weight.to_vec::<f32>()?;
    w[4] = f32::NAN;
    w[5] = f32::INFINITY;
    ember::no_grad(|| model.weight.copy_(&Tensor::from_vec(w, [2, 3], dev)?))?;
    let p = tmp(&format!("nan-{dev}.safetensors"));
    ember::io::save_state_dict(&model, &p)?;
    let fresh = nn::Linear::new(3, 2, dev)?;
    let before = fresh.weight.to_vec::<f32>()?;
    let e = ember::io::load_state_dict(&fresh, &p)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("tensor \"weight\" holds 2 NaN or infinite values of 6")
            && e.contains("allow_non_finite"),
        "{e}"
    );
    assert_eq!(fresh.weight.to_vec::<f32>()?, before, "nothing is loaded");
    // allowed on request, and the plain reader does not judge values
    let opts = ember::io::LoadOptions::new().allow_non_finite(true);
    ember::io::load_state_dict_with(&fresh, &p, opts)?;
    assert!(fresh.weight.to_vec::<f32>()?[4].is_nan());
    assert_eq!(ember::io::load(&p, dev)?.len(), 2);
    // checkpoints too, in every float dtype
    for dt in [DType::F64, DType::F16, DType::BF16] {
        let t = vec![(
            "model.weight".to_string(),
            Tensor::from_vec(vec![1.0f64, f64::NEG_INFINITY], [2], dev)?.to_dtype(dt)?,
        )];
        ember::io::save(&t, &p)?;
        let m = nn::Linear::new(1, 2, dev)?;
        let mut opt = Adam::new(m.parameters(), 0.1)?;
        let e = ember::io::load_checkpoint(&m, &mut opt, &p)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"model.weight\" holds 1 NaN or infinite value of 2"),
            "{dt}: {e}"
        );
    }
    std::fs::remove_file(&p).ok();
    Ok(())
}

fn missing_optimizer_state_is_an_error(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    let model = nn::Sequential::new()
        .add(nn::Linear::new(2, 3, dev)?)
        .add(nn::Linear::new(3, 1, dev)?);
    let mut opt = Adam::new(model.parameters(), 0.1)?;
    let x = Tensor::ones([4, 2], DType::F32, dev)?;
    // only the second layer learns: the first layer's parameters have no state
    model.forward(&x)?.sum_all()?.backward()?;
    model.parameters()[0].zero_grad();
    model.parameters()[1].zero_grad();
    opt.step()?;
    let state = opt.state()?;
    let names: Vec<&str> = state.iter().map(|(n, _)| n.as_str()).collect();
    assert!(
        names.contains(&"exp_avg.2") && !names.contains(&"exp_avg.0"),
        "{names:?}"
    );
    // the complete state loads; with an entry gone it is an error naming it
    let mut fresh = Adam::new(model.parameters(), 0.1)?;
    fresh.load_state(&state)?;
    for gone in ["exp_avg_sq.3", "exp_avg.2"] {
        let cut: Vec<(String, Tensor)> = state.iter().filter(|(n, _)| n != gone).cloned().collect();
        let e = fresh.load_state(&cut).unwrap_err().to_string();
        assert!(e.contains(&format!("no {gone} entry")), "{e}");
    }
    // an entry for a parameter that had none is refused too
    let mut extra = state.clone();
    extra.push(("exp_avg.0".into(), Tensor::zeros([3, 2], DType::F32, dev)?));
    assert!(fresh.load_state(&extra).is_err());
    // and through a checkpoint file, leaving model and optimizer as they were
    let p = tmp(&format!("partial-{dev}.safetensors"));
    let mut all: Vec<(String, Tensor)> = model
        .state_dict()
        .into_iter()
        .map(|(n, t)| (format!("model.{n}"), t))
        .collect();
    all.extend(
        state
            .iter()
            .filter(|(n, _)| n != "exp_avg.3")
            .map(|(n, t)| (format!("optim.{n}"), t.clone())),
    );
    ember::io::save(&all, &p)?;
    let mut opt3 = Adam::new(model.parameters(), 0.5)?;
    let e = ember::io::load_checkpoint(&model, &mut opt3, &p)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no exp_avg.3 entry"), "{e}");
    assert_eq!((opt3.lr(), opt3.steps()), (0.5, 0));
    std::fs::remove_file(&p).ok();
    Ok(())
}

/// Every optimizer resumes exactly: trained three steps, its state loaded into a
/// fresh one of the same settings over copies of the parameters, the two then
/// take the same next steps bit for bit (the moments, sums and step counts all
/// carried). A state with a fractional or negative step count is refused.
fn every_optimizer_resumes_exactly(dev: &Device) -> Result<()> {
    use ember::optim::{Adagrad, RmsProp, Sgd};
    type Make = fn(Vec<Tensor>) -> Result<Box<dyn Optimizer>>;
    let makers: [(&str, Make); 8] = [
        ("sgd", |p| {
            Ok(Box::new(Sgd::new(p, 0.05)?.momentum(0.9)?.nesterov(true)?))
        }),
        ("sgd_maximize", |p| {
            Ok(Box::new(Sgd::new(p, 0.05)?.momentum(0.9)?.maximize(true)))
        }),
        ("adam", |p| Ok(Box::new(Adam::new(p, 0.05)?))),
        // a fast-forgetting second moment: AMSGrad's maximum departs from it
        ("adam_amsgrad", |p| {
            Ok(Box::new(Adam::new(p, 0.05)?.betas(0.9, 0.5)?.amsgrad(true)))
        }),
        ("adamw", |p| {
            Ok(Box::new(Adam::adamw(p, 0.05)?.betas(0.8, 0.99)?))
        }),
        ("rmsprop", |p| {
            Ok(Box::new(
                RmsProp::new(p, 0.01)?.momentum(0.5)?.centered(true),
            ))
        }),
        ("rmsprop_plain", |p| Ok(Box::new(RmsProp::new(p, 0.01)?))),
        ("adagrad", |p| {
            Ok(Box::new(
                Adagrad::new(p, 0.1)?
                    .lr_decay(0.01)?
                    .initial_accumulator_value(0.1)?,
            ))
        }),
    ];
    let x = Tensor::new(vec![0.5f32, -1.0, 2.0, 0.25, 1.5, -0.5], dev)?.reshape([3, 2])?;
    let loss = |w: &Tensor| -> Result<Tensor> { x.matmul(w)?.tanh()?.square()?.sum_all() };
    let mut counted = vec![];
    for (name, make) in makers {
        let w = Tensor::new(vec![0.3f32, -0.2, 0.1, 0.4], dev)?
            .reshape([2, 2])?
            .requires_grad_(true)?;
        let mut opt = make(vec![w.clone()])?;
        let step = |opt: &mut Box<dyn Optimizer>, w: &Tensor| -> Result<()> {
            opt.zero_grad();
            loss(w)?.backward()?;
            opt.step()
        };
        for _ in 0..3 {
            step(&mut opt, &w)?;
        }
        let state = opt.state()?;
        let w2 = w.detach().copy()?.requires_grad_(true)?;
        let mut resumed = make(vec![w2.clone()])?;
        resumed.load_state(&state)?;
        for k in 0..2 {
            step(&mut opt, &w)?;
            step(&mut resumed, &w2)?;
            assert_eq!(vals(&w), vals(&w2), "{name}: step {k} after resuming");
        }
        // a step count that is not a whole number of steps
        if let Some(i) = state.iter().position(|(k, _)| k == "step") {
            counted.push(name);
            for bad in [2.5, -1.0] {
                let mut st = state.clone();
                st[i].1 = Tensor::scalar(bad, &Device::Cpu)?;
                let e = make(vec![w2.clone()])?
                    .load_state(&st)
                    .unwrap_err()
                    .to_string();
                assert!(e.contains("step"), "{name}: {e}");
            }
            // one count per parameter (a file from before they were kept per
            // parameter has one count for all, which loads)
            let mut st = state.clone();
            st[i].1 = Tensor::zeros([2], DType::I64, &Device::Cpu)?;
            let e = make(vec![w2.clone()])?
                .load_state(&st)
                .unwrap_err()
                .to_string();
            assert!(e.contains("one count per parameter"), "{name}: {e}");
            st[i].1 = Tensor::scalar(3i64, &Device::Cpu)?;
            make(vec![w2.clone()])?.load_state(&st)?;
            st[i].1 = Tensor::scalar(0i64, &Device::Cpu)?;
            let e = make(vec![w2.clone()])?
                .load_state(&st)
                .unwrap_err()
                .to_string();
            assert!(e.contains("do not belong together"), "{name}: {e}");
            // a count with no moments, or moments with no count, do not go
            // together (the bias corrections would be wrong)
            st[i].1 = Tensor::zeros([1], DType::I64, &Device::Cpu)?;
            let e = make(vec![w2.clone()])?
                .load_state(&st)
                .unwrap_err()
                .to_string();
            assert!(e.contains("do not belong together"), "{name}: {e}");
            let fresh = make(vec![w2.clone()])?.state()?;
            let mut st = fresh.clone();
            let j = st.iter().position(|(k, _)| k == "step").unwrap();
            st[j].1 = Tensor::new(vec![3i64], &Device::Cpu)?;
            let e = make(vec![w2.clone()])?
                .load_state(&st)
                .unwrap_err()
                .to_string();
            assert!(e.contains("do not belong together"), "{name}: {e}");
            make(vec![w2.clone()])?.load_state(&fresh)?;
        }
    }
    assert!(
        counted.contains(&"adagrad") && counted.contains(&"adam"),
        "{counted:?}"
    );
    // AMSGrad's running maximum is part of the state: a state saved with it
    // loads only into an Adam with amsgrad on, and one saved without it (with
    // moments) only into one with it off
    let w = Tensor::new(vec![0.3f32, -0.2, 0.1, 0.4], dev)?.requires_grad_(true)?;
    let with_max = |on: bool| -> Result<Vec<(String, Tensor)>> {
        let mut opt = Adam::new(vec![w.clone()], 0.05)?.amsgrad(on);
        w.square()?.sum_all()?.backward()?;
        opt.step()?;
        opt.zero_grad();
        opt.state()
    };
    let (ams, plain) = (with_max(true)?, with_max(false)?);
    assert!(ams.iter().any(|(k, _)| k == "max_exp_avg_sq.0"));
    assert!(!plain.iter().any(|(k, _)| k.starts_with("max_exp_avg_sq")));
    for (st, on) in [(&ams, false), (&plain, true)] {
        let mut opt = Adam::new(vec![w.clone()], 0.05)?.amsgrad(on);
        let e = opt.load_state(st).unwrap_err().to_string();
        assert!(e.contains("amsgrad"), "amsgrad {on}: {e}");
        assert_eq!(opt.steps(), 0, "nothing loaded");
    }
    Ok(())
}

device_test!(
    round_trip_and_errors,
    checkpoint_resumes_training,
    checksums_catch_damage,
    non_finite_values_are_refused,
    missing_optimizer_state_is_an_error,
    every_optimizer_resumes_exactly,
    a_lazy_model_loads_before_its_first_forward
);

/// A lazy model loads a state before its first forward (PyTorch's lazy
/// modules do): its lazy layers take their input size from the entries,
/// through containers and from a file; a weight of another output size is
/// refused and leaves the layer lazy.
fn a_lazy_model_loads_before_its_first_forward(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    let known = nn::Sequential::new()
        .add(nn::Linear::new(3, 4, dev)?)
        .add(nn::ReLU)
        .add(nn::Linear::new(4, 2, dev)?);
    let lazy = || {
        let mut list = nn::ModuleList::new();
        list.push(nn::LazyLinear::new(2, dev));
        nn::Sequential::new()
            .add(nn::LazyLinear::new(4, dev))
            .add(nn::ReLU)
            .add(list)
    };
    let state: Vec<(String, Tensor)> = known
        .state_dict()
        .into_iter()
        .map(|(n, t)| (n.replace("2.", "2.0."), t))
        .collect();
    let x = Tensor::randn([5, 3], dev)?;
    let want = vals(&known.forward(&x)?);
    let model = lazy();
    // (loading draws nothing: the generator stays where it was)
    ember::manual_seed(4);
    assert!(model.load_state_dict(&state, true)?.is_empty());
    let next = Tensor::rand([3], dev)?.to_vec1::<f32>()?;
    ember::manual_seed(4);
    assert_eq!(Tensor::rand([3], dev)?.to_vec1::<f32>()?, next);
    let list = model.get("2").unwrap();
    let h = model.get("0").unwrap().forward(&x)?.relu()?;
    assert_eq!(vals(&list.parameters()[0]), vals(&known.parameters()[2]));
    assert_close(&vals(&list_forward(list, &h)?), &want, 1e-5, 1e-6);
    // from a file, checked from its header first
    let path = tmp(&format!("lazy-{dev}.safetensors"));
    ember::io::save(&state, &path)?;
    let from_file = lazy();
    ember::io::load_state_dict(&from_file, &path)?;
    assert_eq!(from_file.parameters().len(), 4);
    std::fs::remove_file(&path).ok();
    // a weight for another output size: refused, the layer still lazy
    let other = nn::LazyLinear::new(3, dev);
    let err = other
        .load_state_dict(&known.get("0").unwrap().state_dict(), true)
        .unwrap_err()
        .to_string();
    assert!(err.contains("weight"), "{err}");
    assert!(other.in_features().is_none());
    Ok(())
}

/// The list's one layer on `h`.
fn list_forward(list: &dyn Module, h: &Tensor) -> Result<Tensor> {
    let w = &list.parameters()[0];
    let b = &list.parameters()[1];
    h.matmul(&w.t()?)?.add(b)
}

/// A schedule built after a resume starts from the rate the first schedule
/// started from (saved as PyTorch saves `initial_lr`), not from the decayed rate
/// in the checkpoint: resuming a step decay does not decay twice.
#[test]
fn a_schedule_built_after_a_resume_starts_from_the_initial_rate() -> Result<()> {
    use ember::optim::{Adam, Groups, LrScheduler, Sgd, StepLr};
    let dev = Device::Cpu;
    let p = || Tensor::zeros([2], DType::F32, &dev)?.requires_grad_(true);
    let (a, b) = (p()?, p()?);
    let groups = |lr: f64| -> Result<Groups> {
        Groups::new(vec![
            Box::new(Sgd::new(vec![a.clone()], lr)?),
            Box::new(Adam::new(vec![b.clone()], lr / 10.0)?),
        ])
    };
    let mut opt = groups(0.1)?;
    let mut sched = StepLr::new(&opt, 2, 0.5)?;
    for _ in 0..5 {
        sched.step(&mut opt);
    }
    assert_eq!(opt.group_lrs(), vec![0.025, 0.0025]);
    let state = opt.state()?;
    // the user's script builds the same optimizer, loads, then schedules
    let mut again = groups(0.1)?;
    again.load_state(&state)?;
    assert_eq!(again.group_lrs(), vec![0.025, 0.0025]);
    let mut resumed = StepLr::new(&again, 2, 0.5)?;
    resumed.set_epoch(5);
    assert_eq!(resumed.last_lrs(), vec![0.025, 0.0025]);
    resumed.step(&mut again);
    assert_eq!(again.group_lrs(), vec![0.0125, 0.00125]);
    // a state from before any schedule (or an older ember) has no initial
    // rate: the current one is the start, and a wrong one is refused
    let mut plain = Sgd::new(vec![a.clone()], 0.1)?;
    let mut without = Sgd::new(vec![a.clone()], 0.1)?;
    StepLr::new(&without, 2, 0.5)?;
    without.set_lr(0.05);
    without.load_state(&plain.state()?)?;
    assert_eq!(StepLr::new(&without, 2, 0.5)?.last_lr(), 0.1);
    let mut bad = plain.state()?;
    bad.push(("initial_lr".into(), Tensor::scalar(-1.0, &dev)?));
    let err = plain.load_state(&bad).unwrap_err().to_string();
    assert!(err.contains("-1"), "{err}");
    assert_eq!(plain.lr(), 0.1);
    Ok(())
}

#[test]
fn optimizer_hyper_parameters_are_checked_at_construction() -> Result<()> {
    use ember::optim::Sgd;
    let p = || vec![Tensor::zeros([2], DType::F32, &Device::Cpu).unwrap()];
    for lr in [-1.0, f64::NAN, f64::INFINITY] {
        let e = Sgd::new(p(), lr).err().expect("refused").to_string();
        assert!(e.contains("Invalid learning rate"), "{e}");
        assert!(Adam::new(p(), lr).is_err());
        assert!(Adam::adamw(p(), lr).is_err());
    }
    assert!(Sgd::new(p(), 0.0).is_ok(), "PyTorch allows lr 0");
    for lr in [-1.0, f64::NAN] {
        assert!(ember::optim::RmsProp::new(p(), lr).is_err());
        assert!(ember::optim::Adagrad::new(p(), lr).is_err());
    }
    let rms = || ember::optim::RmsProp::new(p(), 0.01).unwrap();
    for e in [
        rms().alpha(-0.5).err(),
        rms().eps(-1.0).err(),
        rms().momentum(f64::NAN).err(),
        rms().weight_decay(-1.0).err(),
    ] {
        assert!(e.expect("refused").to_string().contains("Invalid"));
    }
    let ada = || ember::optim::Adagrad::new(p(), 0.01).unwrap();
    for e in [
        ada().lr_decay(-1.0).err(),
        ada().initial_accumulator_value(-1.0).err(),
        ada().eps(f64::INFINITY).err(),
    ] {
        assert!(e.expect("refused").to_string().contains("Invalid"));
    }
    let e = Adam::new(p(), 1e-3)?
        .betas(1.0, 0.999)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("Invalid beta parameter at index 0"), "{e}");
    let e = Adam::new(p(), 1e-3)?
        .betas(0.9, -0.1)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("Invalid beta parameter at index 1"), "{e}");
    assert!(Adam::new(p(), 1e-3)?.betas(0.0, 0.0).is_ok());
    assert!(Adam::new(p(), 1e-3)?.betas(0.9, f64::NAN).is_err());
    let e = Adam::new(p(), 1e-3)?.eps(-1e-8).err().unwrap().to_string();
    assert!(e.contains("Invalid epsilon value"), "{e}");
    let e = Adam::new(p(), 1e-3)?
        .weight_decay(-0.1)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("Invalid weight_decay value"), "{e}");
    let e = Sgd::new(p(), 0.1)?
        .weight_decay(-0.1)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("Invalid weight_decay value"), "{e}");
    let e = Sgd::new(p(), 0.1)?
        .momentum(-0.5)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("Invalid momentum value"), "{e}");
    // Nesterov needs momentum and no dampening: checked together by the first
    // step, before anything changes, so the builder calls come in any order
    // (PyTorch's keyword arguments have none)
    let w = Tensor::ones([2], DType::F32, &Device::Cpu)?.requires_grad_(true)?;
    w.mul(3.0)?.sum_all()?.backward()?;
    let sgd = || Sgd::new(vec![w.clone()], 0.1);
    for mut bad in [
        sgd()?.nesterov(true)?,
        sgd()?.momentum(0.9)?.nesterov(true)?.dampening(0.1)?,
        sgd()?.nesterov(true)?.momentum(0.9)?.momentum(0.0)?,
    ] {
        let e = bad.step().unwrap_err().to_string();
        assert!(e.contains("Nesterov momentum requires"), "{e}");
        assert_eq!(vals(&w), [1.0, 1.0], "nothing stepped");
    }
    sgd()?.nesterov(true)?.momentum(0.9)?.step()?;
    // PyTorch: buf = g = 3, the step takes g + 0.9 buf = 5.7
    assert_close(&vals(&w), &[0.43, 0.43], 1e-6, 0.0);
    // PyTorch's own optimizer state_dict layout is named as such
    let pytorch = vec![(
        "state.0.step".to_string(),
        Tensor::scalar(2f32, &Device::Cpu)?,
    )];
    let e = Adam::new(p(), 1e-3)?
        .load_state(&pytorch)
        .unwrap_err()
        .to_string();
    assert!(e.contains("PyTorch's optimizer state_dict() layout"), "{e}");
    // a loaded state with a bad learning rate is refused
    let mut opt = Sgd::new(p(), 0.1)?;
    let mut state = opt.state()?;
    state.retain(|(n, _)| n != "lr");
    state.push(("lr".into(), Tensor::scalar(f64::NAN, &Device::Cpu)?));
    assert!(opt.load_state(&state).is_err());
    assert_eq!(opt.lr(), 0.1);
    Ok(())
}
