//! A CUDA convolution whose patches exceed the budget runs in passes over the
//! batch (`EMBER_CONV_PATCH_BYTES`, 64 MiB by default; set small here): its
//! output and gradients equal the CPU's, and the memory estimate, whose meta
//! mirror follows the same passes, still equals the allocator's peak.
//!
//! These are ember's own im2col convolutions: cuDNN, which GPUs use by default, is
//! switched off here. Its own test binary, because the budget is read once per
//! process and the switch is global.

mod common;

use ember::memory::Estimator;
use ember::nn::{self, Module};
use ember::optim::{Optimizer, Sgd};
use ember::prelude::*;
use ember::{cuda, Conv2dOptions};

/// Small enough that every convolution below runs in passes of 1 to 3 samples.
const BUDGET: &str = "3000";

/// Sets the budget; the guard keeps the tests one at a time (the second measures
/// the device's memory).
fn budget() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let guard = ONE.lock().unwrap_or_else(|e| e.into_inner());
    std::env::set_var("EMBER_CONV_PATCH_BYTES", BUDGET);
    ember::cuda::cudnn::set_enabled(false);
    guard
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    let (a, b) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn convolutions_in_passes_equal_the_cpus() -> Result<()> {
    let _one = budget();
    let Some(dev) = common::gpu("convolutions_in_passes_equal_the_cpus") else {
        return Ok(());
    };
    ember::manual_seed(3);
    // (batch, in channels, size, out channels, kernel, options)
    let cases = [
        (5, 3, 9, 4, 3, Conv2dOptions::default().padding(1)),
        (7, 4, 8, 6, 3, Conv2dOptions::default().stride(2).groups(2)),
        (
            4,
            2,
            10,
            3,
            3,
            Conv2dOptions::default().dilation(2).padding(2),
        ),
        (3, 3, 6, 5, 1, Conv2dOptions::default()),
    ];
    for (n, c, hw, o, k, opts) in cases {
        let x = Tensor::randn([n, c, hw, hw], &Device::Cpu)?;
        let w = Tensor::randn([o, c / opts.groups, k, k], &Device::Cpu)?;
        let b = Tensor::randn([o], &Device::Cpu)?;
        let run = |d: &Device| -> Result<Vec<Tensor>> {
            let x = x.to(d)?.detach().requires_grad_(true)?;
            let w = w.to(d)?.detach().requires_grad_(true)?;
            let b = b.to(d)?.detach().requires_grad_(true)?;
            let y = x.conv2d(&w, Some(&b), opts)?;
            // a weighted sum, so that every output has its own gradient
            let weights = Tensor::arange(0f32, y.numel() as f32, d)?
                .reshape(y.shape())?
                .div(y.numel() as f64)?;
            y.mul(&weights)?.sum_all()?.backward()?;
            Ok(vec![
                y.to(&Device::Cpu)?,
                x.grad().unwrap().to(&Device::Cpu)?,
                w.grad().unwrap().to(&Device::Cpu)?,
                b.grad().unwrap().to(&Device::Cpu)?,
            ])
        };
        let (want, got) = (run(&Device::Cpu)?, run(&dev)?);
        for (name, (a, b)) in ["output", "input grad", "weight grad", "bias grad"]
            .iter()
            .zip(want.iter().zip(&got))
        {
            let d = max_diff(a, b);
            assert!(
                d <= 1e-4,
                "n={n} c={c} {hw}x{hw} o={o} k={k}: {name} differs by {d}"
            );
        }
    }
    Ok(())
}

fn cnn(dev: &Device) -> Result<nn::Sequential> {
    let same = Conv2dOptions::default().padding(1);
    Ok(nn::Sequential::new()
        .add(nn::Conv2d::new(3, 8, 3, same, dev)?)
        .add(nn::ReLU)
        .add(nn::Conv2d::new(8, 8, 3, same.stride(2), dev)?)
        .add(nn::ReLU)
        .add(nn::Flatten::default())
        .add(nn::Linear::new(8 * 4 * 4, 10, dev)?))
}

#[test]
fn the_estimate_follows_the_passes() -> Result<()> {
    let _one = budget();
    let Some(dev) = common::gpu("the_estimate_follows_the_passes") else {
        return Ok(());
    };
    if std::env::var_os("EMBER_CUDA_NO_CACHING").is_some() {
        eprintln!(
            "skipped the_estimate_follows_the_passes: EMBER_CUDA_NO_CACHING is set, and \
             the estimate is of the caching allocator"
        );
        return Ok(());
    }
    let sgd = |p: Vec<Tensor>| -> Result<Box<dyn Optimizer>> {
        Ok(Box::new(Sgd::new(p, 0.01)?.momentum(0.9)?))
    };
    let batch = 9;
    // one sample's patches: 3·3·3·64·4 = 6,912 bytes in the first convolution,
    // 8·3·3·16·4 = 4,608 in the second: both above the budget, one sample a pass
    let est = Estimator::new(cnn)
        .multiprocessors(common::multiprocessors(&dev))
        .cudnn(ember::cuda::cudnn::is_available())
        .input([3, 8, 8])
        .optimizer(sgd)
        .estimate(batch)?;

    cuda::synchronize(&dev)?;
    cuda::empty_cache(&dev)?;
    let base = cuda::memory_allocated(&dev)?;
    cuda::reset_peak_memory_stats(&dev)?;
    let xs = Tensor::randn([batch, 3, 8, 8], &Device::Cpu)?;
    let ys = Tensor::randint(0, 10, [batch], &Device::Cpu)?;
    {
        let mut model = cnn(&Device::Cpu)?;
        model.to_device(&dev)?;
        let mut opt = sgd(model.parameters())?;
        for _ in 0..est.steps {
            let (x, y) = (xs.to(&dev)?, ys.to(&dev)?);
            let out = model.forward(&x)?;
            let loss = nn::cross_entropy(&out, &y)?;
            loss.backward()?;
            drop((loss, out));
            opt.step()?;
            opt.zero_grad();
        }
    }
    cuda::synchronize(&dev)?;
    let measured = cuda::max_memory_allocated(&dev)? - base;
    eprintln!(
        "estimated {} bytes, measured {measured}",
        est.peak_allocated
    );
    assert_eq!(est.peak_allocated, measured, "{est}");
    Ok(())
}
