//! safetensors files, state dicts and checkpoints.

use super::vals;
use ember::nn::{self, Module};
use ember::optim::{Adam, Optimizer};
use ember::prelude::*;

fn tmp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("ember-test-{}-{name}", std::process::id()))
}

fn round_trip_and_errors(dev: &Device) -> Result<()> {
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
    let path = tmp("all.safetensors");
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
    let cut = tmp("cut.safetensors");
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
    let p = tmp("model.safetensors");
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
    let mut opt = Adam::new(full.parameters(), 0.01);
    let uninterrupted = train(&full, &mut opt, 40)?;
    let first = make()?;
    let mut opt1 = Adam::new(first.parameters(), 0.01);
    train(&first, &mut opt1, 20)?;
    let path = tmp("ckpt.safetensors");
    ember::io::save_checkpoint(&first, &opt1, &path)?;
    // a fresh model and optimizer continue from the file
    let resumed = nn::Sequential::new()
        .add(nn::Linear::new(4, 8, dev)?)
        .add(nn::ReLU)
        .add(nn::Linear::new(8, 3, dev)?);
    let mut opt2 = Adam::new(resumed.parameters(), 0.5);
    ember::io::load_checkpoint(&resumed, &mut opt2, &path)?;
    assert_eq!((opt2.lr(), opt2.steps()), (0.01, 20));
    let last = train(&resumed, &mut opt2, 20)?;
    assert_eq!(
        last, uninterrupted,
        "resumed training must match the uninterrupted run"
    );
    // another optimizer's state is refused
    let mut sgd = ember::optim::Sgd::new(resumed.parameters(), 0.1);
    assert!(ember::io::load_checkpoint(&resumed, &mut sgd, &path).is_err());
    std::fs::remove_file(&path).ok();
    Ok(())
}

device_test!(round_trip_and_errors, checkpoint_resumes_training);
