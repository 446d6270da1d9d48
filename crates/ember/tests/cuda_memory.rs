//! The caching allocator's statistics and out-of-memory recovery on `cuda:0`.
//!
//! These tests read the device's process-wide memory counters, so they live in a
//! test binary of their own (no other test allocates on the device meanwhile) and
//! take turns. Each skips, saying why, where no GPU is present.

mod common;

use ember::prelude::*;
use ember::{cuda, Error};

/// The first GPU and this binary's turn on it, or `None` (with a message).
fn gpu(test: &str) -> Option<(Device, std::sync::MutexGuard<'static, ()>)> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let dev = common::gpu(test)?;
    Some((dev, TURN.lock().unwrap_or_else(|p| p.into_inner())))
}

#[test]
fn allocator_statistics_and_reuse() -> Result<()> {
    let Some((dev, _turn)) = gpu("allocator_statistics_and_reuse") else {
        return Ok(());
    };
    cuda::synchronize(&dev)?;
    let base = cuda::memory_stats(&dev)?;
    let a = Tensor::zeros([1024, 1024], DType::F32, &dev)?; // 4 MiB
    let s1 = cuda::memory_stats(&dev)?;
    assert_eq!(s1.allocated, base.allocated + (4 << 20));
    assert!(s1.reserved >= s1.allocated);
    assert!(cuda::max_memory_allocated(&dev)? >= s1.allocated);
    drop(a);
    let s2 = cuda::memory_stats(&dev)?;
    assert_eq!(s2.allocated, base.allocated);
    if std::env::var("EMBER_CUDA_NO_CACHING").is_ok_and(|v| v != "0") {
        // no cache (a memory-checker run): each tensor is one driver allocation,
        // returned when it is dropped
        assert_eq!(s2.reserved, base.reserved, "the freed block went back");
        let t = Tensor::ones([1024, 1024], DType::F32, &dev)?;
        drop(t);
        let s3 = cuda::memory_stats(&dev)?;
        assert_eq!(s3.num_device_mallocs, s2.num_device_mallocs + 1);
        assert_eq!(s3.num_device_frees, s2.num_device_frees + 1);
        return Ok(());
    }
    assert_eq!(s2.reserved, s1.reserved, "the freed block stays cached");
    // the same size again comes from the cache, not the driver
    let mallocs = s2.num_device_mallocs;
    for _ in 0..10 {
        let t = Tensor::ones([1024, 1024], DType::F32, &dev)?;
        drop(t);
    }
    assert_eq!(cuda::memory_stats(&dev)?.num_device_mallocs, mallocs);
    cuda::reset_peak_memory_stats(&dev)?;
    assert_eq!(
        cuda::max_memory_allocated(&dev)?,
        cuda::memory_allocated(&dev)?
    );
    cuda::empty_cache(&dev)?;
    assert!(cuda::memory_reserved(&dev)? <= s2.reserved);
    Ok(())
}

#[test]
fn out_of_memory_is_an_error_and_the_device_keeps_working() -> Result<()> {
    let Some((dev, _turn)) = gpu("out_of_memory") else {
        return Ok(());
    };
    let total = cuda::device_properties(0)?.total_memory;
    // twice the device's memory cannot be allocated
    let n = total / 2; // f32 elements: 2 × total bytes
    match Tensor::zeros([n, 4], DType::F32, &dev) {
        Err(Error::OutOfMemory {
            device, requested, ..
        }) => {
            assert_eq!(device, dev);
            assert!(requested >= total * 2);
        }
        Err(e) => panic!("expected OutOfMemory, got {e}"),
        Ok(_) => panic!("allocating {} bytes succeeded", total * 8),
    }
    let t = Tensor::ones([256], DType::F32, &dev)?;
    assert_eq!(t.sum_all()?.item::<f32>()?, 256.0);
    Ok(())
}

/// Uploads and downloads go through pinned blocks that are reused, in chunks for
/// large transfers, with the values intact.
#[test]
fn copies_are_staged_through_reused_pinned_blocks() -> Result<()> {
    let Some((dev, _turn)) = gpu("copies_are_staged") else {
        return Ok(());
    };
    // 20 MiB: three chunks each way
    let n = 5 << 20;
    let host: Vec<f32> = (0..n).map(|i| (i % 1000) as f32 * 0.5 - 7.0).collect();
    let before = cuda::host_memory_stats(&dev)?;
    let t = Tensor::from_vec(host.clone(), [n], &Device::Cpu)?.to(&dev)?;
    let back = t.to_vec::<f32>()?;
    assert!(back == host, "values changed on the way");
    let after = cuda::host_memory_stats(&dev)?;
    assert!(after.staged_copies >= before.staged_copies + 6, "{after:?}");
    assert!(
        after.reserved > 0 && after.reserved <= 256 << 20,
        "{after:?}"
    );
    // small uploads reuse one small block once its copy has run, instead of
    // pinning more
    let up = |i: usize| Tensor::new([i as f32; 16], &Device::Cpu)?.to_device_non_blocking(&dev);
    let mut small = vec![up(0)?];
    let reserved = cuda::host_memory_stats(&dev)?.reserved;
    assert_eq!(reserved, after.reserved + (64 << 10));
    for i in 1..100 {
        cuda::synchronize(&dev)?;
        small.push(up(i)?);
    }
    assert_eq!(
        cuda::host_memory_stats(&dev)?.reserved,
        reserved,
        "blocks pinned although the last copy had run"
    );
    // without waiting, a block whose copy is still queued is not reused (the
    // stream runs later, on the simulator as on a GPU): a new one is pinned
    // instead, and every value arrives intact
    for i in 100..300 {
        small.push(up(i)?);
    }
    let grown = (cuda::host_memory_stats(&dev)?.reserved - reserved) / (64 << 10);
    assert!(
        grown <= 200,
        "{grown} more blocks pinned for 200 small copies"
    );
    for (i, s) in small.iter().enumerate() {
        assert_eq!(s.to_vec::<f32>()?, vec![i as f32; 16]);
    }
    cuda::empty_cache(&dev)?;
    assert_eq!(cuda::host_memory_stats(&dev)?.reserved, 0);
    Ok(())
}

/// Host waits during `steps` calls of `step` after one warm-up call.
fn syncs_in(dev: &Device, steps: usize, step: &mut dyn FnMut() -> Result<()>) -> Result<u64> {
    step()?;
    let before = cuda::host_syncs(dev)?;
    for _ in 0..steps {
        step()?;
    }
    Ok(cuda::host_syncs(dev)? - before)
}

#[test]
fn training_steps_never_wait_for_the_gpu() -> Result<()> {
    let Some((dev, _turn)) = gpu("training_steps_never_wait_for_the_gpu") else {
        return Ok(());
    };
    use ember::nn::{self, Module};
    use ember::optim::{Adam, Optimizer};
    // reading values waits, and is counted
    let t = Tensor::ones([3], DType::F32, &dev)?;
    let before = cuda::host_syncs(&dev)?;
    t.to_vec::<f32>()?;
    cuda::synchronize(&dev)?;
    assert_eq!(cuda::host_syncs(&dev)? - before, 2);

    // the MLP and the digits CNN: forward, cross-entropy, backward, Adam
    ember::manual_seed(0);
    let mut models: Vec<(&str, Box<dyn Module>, Tensor)> = vec![
        (
            "mlp",
            Box::new(ember::models::mlp(&[64, 32, 10], &dev)?),
            Tensor::randn([16, 64], &dev)?,
        ),
        (
            "digits cnn",
            Box::new(ember::models::digits_cnn(&dev)?),
            Tensor::randn([16, 1, 8, 8], &dev)?,
        ),
    ];
    let y = Tensor::randint(0, 10, [16], &dev)?;
    for (name, model, x) in &mut models {
        let mut opt = Adam::new(model.parameters(), 1e-3)?;
        let n = syncs_in(&dev, 3, &mut || {
            let loss = nn::cross_entropy(&model.forward(x)?, &y)?;
            opt.zero_grad();
            loss.backward()?;
            nn::clip_grad_norm_(&model.parameters(), 1.0, 2.0, false)?;
            opt.step()
        })?;
        assert_eq!(n, 0, "{name}: {n} host waits in 3 training steps");
    }
    // the character GPT, AdamW over two parameter groups, clipping
    let config = ember::models::GptConfig {
        vocab_size: 20,
        context: 16,
        layers: 2,
        heads: 2,
        width: 16,
        dropout: 0.1,
    };
    let gpt = ember::models::CharGpt::new(config, &dev)?;
    let params = gpt.parameters();
    let (decay, no_decay) = ember::optim::split_for_weight_decay(params.clone());
    let mut opt = ember::optim::Groups::new(vec![
        Box::new(Adam::adamw(decay, 1e-3)?),
        Box::new(Adam::new(no_decay, 1e-3)?),
    ])?;
    let xi = Tensor::randint(0, 20, [4, 16], &dev)?;
    let yi = Tensor::randint(0, 20, [4, 16], &dev)?;
    let n = syncs_in(&dev, 3, &mut || {
        let loss = gpt.loss(&xi, &yi)?;
        opt.zero_grad();
        loss.backward()?;
        nn::clip_grad_norm_(&params, 1.0, 2.0, false)?;
        opt.step()
    })?;
    assert_eq!(n, 0, "char GPT: {n} host waits in 3 training steps");

    // a bad target is found on the device and reported, with the loss's name, at
    // the next wait; once
    let logits = Tensor::randn([2, 10], &dev)?;
    let bad = Tensor::from_slice(&[3i64, 12], [2], &dev)?;
    let loss = nn::cross_entropy(&logits, &bad)?;
    match loss.item::<f32>() {
        Err(Error::IndexOutOfRange {
            op,
            index: 12,
            dim: 1,
            size: 10,
        }) => assert_eq!(op, "cross_entropy"),
        other => panic!("expected the bad target at the next wait, got {other:?}"),
    }
    cuda::synchronize(&dev)?;
    // a bad index queued by another thread is that thread's error, not this one's
    let other = std::thread::spawn(move || nn::cross_entropy(&logits, &bad).map(|_| ()));
    other.join().expect("the other thread")?;
    cuda::synchronize(&dev)?;
    Ok(())
}
