//! `Estimator::max_batch` against the real thing: on a simulated GPU of 5 MiB, the
//! largest batch the estimate says fits is the largest batch whose training steps
//! run without running out of memory, found by bisecting real runs.
//!
//! Its own test binary, because the simulated device's size is fixed for the
//! process when the device first starts.

use ember::memory::Estimator;
use ember::nn::{self, Module};
use ember::optim::{Adam, Optimizer};
use ember::prelude::*;
use ember::{cuda, models};

const MEMORY_MB: usize = 5;

fn mlp(dev: &Device) -> Result<nn::Sequential> {
    models::mlp(&[64, 128, 10], dev)
}

fn adam(p: Vec<Tensor>) -> Result<Box<dyn Optimizer>> {
    Ok(Box::new(Adam::new(p, 1e-3)?))
}

/// Whether two training steps at `batch` run on `dev` without running out of
/// memory (any other error fails the test).
fn runs(dev: &Device, batch: usize) -> bool {
    let attempt = || -> Result<()> {
        let mut model = mlp(&Device::Cpu)?;
        model.to_device(dev)?;
        let mut opt = adam(model.parameters())?;
        let xs = Tensor::randn([batch, 64], &Device::Cpu)?;
        let ys = Tensor::randint(0, 10, [batch], &Device::Cpu)?;
        for _ in 0..2 {
            let (x, y) = (xs.to(dev)?, ys.to(dev)?);
            let out = model.forward(&x)?;
            let loss = nn::cross_entropy(&out, &y)?;
            loss.backward()?;
            drop((loss, out));
            opt.step()?;
            opt.zero_grad();
        }
        cuda::synchronize(dev)
    };
    let result = attempt();
    cuda::empty_cache(dev).unwrap();
    assert_eq!(cuda::memory_reserved(dev).unwrap(), 0);
    match result {
        Ok(()) => true,
        Err(Error::OutOfMemory { .. }) => false,
        Err(e) => panic!("batch {batch}: {e}"),
    }
}

#[test]
fn max_batch_agrees_with_a_bisection_of_real_runs() -> Result<()> {
    if std::env::var_os("EMBER_CUDA_SIMULATOR").is_none() {
        eprintln!(
            "skipped max_batch_agrees_with_a_bisection_of_real_runs: it needs the CUDA \
             simulator (EMBER_CUDA_SIMULATOR=1), whose device size it sets"
        );
        return Ok(());
    }
    if std::env::var_os("EMBER_CUDA_NO_CACHING").is_some() {
        eprintln!(
            "skipped max_batch_agrees_with_a_bisection_of_real_runs: EMBER_CUDA_NO_CACHING \
             is set, and the estimate is of the caching allocator"
        );
        return Ok(());
    }
    std::env::set_var("EMBER_SIM_MEMORY_MB", MEMORY_MB.to_string());
    let dev = Device::Cuda(0);
    let (free, total) = cuda::mem_get_info(&dev)?;
    assert_eq!((free, total), (MEMORY_MB << 20, MEMORY_MB << 20));
    // the simulator has no cuBLAS workspace: no compute capability is set
    let est = Estimator::new(mlp)
        .input([64])
        .optimizer(adam)
        .multiprocessors(cuda::device_properties(0)?.multiprocessor_count as usize);
    let predicted = est
        .max_batch(64, free, 1 << 20)?
        .expect("a batch of one fits");

    // bisect real runs: lo runs, hi does not
    let (mut lo, mut hi) = (1, 64);
    assert!(runs(&dev, lo));
    while runs(&dev, hi) {
        lo = hi;
        hi *= 2;
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if runs(&dev, mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    eprintln!(
        "largest batch on a {MEMORY_MB} MiB device: estimated {predicted}, by bisection {lo}"
    );
    assert_eq!(predicted, lo);
    // and the estimate at that batch fits, one more does not
    assert!(est.estimate(lo)?.fits(free) && !est.estimate(lo + 1)?.fits(free));
    Ok(())
}
