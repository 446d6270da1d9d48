//! The caching allocator's statistics and out-of-memory recovery on `cuda:0`, and
//! streams: the order of work across them and the reuse of memory they share.
//!
//! These tests read the device's process-wide memory counters, or depend on which
//! block the allocator hands out next, so they live in a test binary of their own
//! (no other test allocates on the device meanwhile) and take turns. Each skips,
//! saying why, where no GPU is present.
//!
//! On the simulator a stream's work runs only when something waits for it, so a
//! missing wait or a block reused too early gives wrong values every time; the
//! tests named `the_simulator_shows_*` check that it does (on a GPU the same
//! mistakes are races whose outcome depends on timing, so they run there only as
//! their correct counterparts).

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
    // nothing cached: what is reserved holds live tensors only
    cuda::empty_cache(&dev)?;
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
    // emptied again, the cache gives back all it took since (the same tensors
    // live as at the start)
    cuda::empty_cache(&dev)?;
    assert_eq!(cuda::memory_reserved(&dev)?, base.reserved);
    assert!(base.reserved < s2.reserved, "the 4 MiB block was cached");
    // a GPU that is not there is an error, not nothing to do
    let absent = Device::Cuda(cuda::device_count());
    assert!(cuda::empty_cache(&absent).is_err());
    assert!(cuda::reset_peak_memory_stats(&absent).is_err());
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
    // no pinned blocks cached by the tests before
    cuda::empty_cache(&dev)?;
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
    // (how many new blocks that takes depends on how soon the copies run: the
    // values below are the check)
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

/// The profiler reads its timing events only after the session: a profiled step
/// waits for the GPU no more often than an unprofiled one (never), and its ops
/// have device times and kernels.
#[test]
fn a_profiled_step_waits_no_more_than_an_unprofiled_one() -> Result<()> {
    let Some((dev, _turn)) = gpu("a_profiled_step_waits_no_more_than_an_unprofiled_one") else {
        return Ok(());
    };
    use ember::nn::{self, Module};
    use ember::optim::{Adam, Optimizer};
    use ember::profiler::{EventKind, Profiler};
    ember::manual_seed(0);
    let model = ember::models::digits_cnn(&dev)?;
    let x = Tensor::randn([16, 1, 8, 8], &dev)?;
    let y = Tensor::randint(0, 10, [16], &dev)?;
    let mut opt = Adam::new(model.parameters(), 1e-3)?;
    let mut step = || -> Result<()> {
        let loss = nn::cross_entropy(&model.forward(&x)?, &y)?;
        opt.zero_grad();
        loss.backward()?;
        opt.step()
    };
    let plain = syncs_in(&dev, 3, &mut step)?;
    let prof = Profiler::start()?;
    let profiled = syncs_in(&dev, 3, &mut step)?;
    let p = prof.stop()?;
    assert_eq!((plain, profiled), (0, 0));
    let me = std::thread::current().name().unwrap_or("").to_string();
    let p = p.filter_threads(|_, n| n == me);
    let convs: Vec<_> = p
        .events()
        .iter()
        .filter(|e| e.name == "conv2d" && e.kind == EventKind::Op)
        .collect();
    assert_eq!(convs.len(), 8, "2 convolutions x 4 steps");
    for c in convs {
        let (a, b) = c.device_span_us.expect("a GPU op has device times");
        assert!(b >= a && c.device_total_us == b - a);
        assert!(!c.kernels.is_empty());
    }
    Ok(())
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

// ---------------------------------------------------------------------------------
// Streams

/// `n` values of `v` made on the current stream (a fill kernel, queued).
fn filled(n: usize, v: f64, dev: &Device) -> Result<Tensor> {
    Tensor::full([n], v, DType::F32, dev)
}

#[test]
fn streams_are_ordered_by_events_and_waits() -> Result<()> {
    let Some((dev, _turn)) = gpu("streams_are_ordered_by_events_and_waits") else {
        return Ok(());
    };
    let main = cuda::current_stream(&dev)?;
    assert_eq!(main, cuda::default_stream(&dev)?);
    let side = cuda::Stream::new(&dev)?;
    assert_ne!(side, main);
    assert_eq!(side.device(), dev);
    let x = filled(1000, 3.25, &dev)?;
    // the side stream starts after the fill
    side.wait_stream(&main)?;
    let y = cuda::with_stream(&side, || {
        assert_eq!(cuda::current_stream(&dev).unwrap(), side);
        x.mul(2.0)
    })?;
    x.record_stream(&side)?;
    // back on the default stream, which waits for the product through an event
    assert_eq!(cuda::current_stream(&dev)?, main);
    let done = side.record_event()?;
    main.wait_event(&done)?;
    let z = y.add(1.0)?;
    assert_eq!(z.to_vec::<f32>()?, vec![7.5; 1000]);
    // reading on the side stream itself waits for that stream alone
    let w = cuda::with_stream(&side, || y.sub(0.5)?.to_vec::<f32>())?;
    assert_eq!(w, vec![6.0; 1000]);
    // Event::wait is Stream::wait_event the other way round
    let e = cuda::Event::record(&dev)?;
    e.wait(&side)?;
    side.synchronize()?;
    assert!(side.query()? && e.query()?);
    Ok(())
}

#[test]
fn the_simulator_shows_a_missing_stream_wait() -> Result<()> {
    let Some((dev, _turn)) = gpu("the_simulator_shows_a_missing_stream_wait") else {
        return Ok(());
    };
    if !cuda::is_simulated() {
        println!("the_simulator_shows_a_missing_stream_wait: skipped (a race on a GPU)");
        return Ok(());
    }
    let side = cuda::Stream::new(&dev)?;
    // (a value no other test writes, so a reused block cannot hold it by chance)
    let x = filled(1000, 5.125, &dev)?;
    // no wait: the side stream reads x before the default stream has filled it
    let y = cuda::with_stream(&side, || x.mul(2.0)?.to_vec::<f32>())?;
    x.record_stream(&side)?;
    assert!(
        y.iter().any(|&v| v != 10.25),
        "the side stream saw the fill it never waited for"
    );
    cuda::synchronize(&dev)?;
    Ok(())
}

/// A block freed after work on another stream used it goes to new tensors only
/// once that work has finished: `record_stream` (PyTorch's).
#[test]
fn a_block_used_on_another_stream_waits_for_it_before_reuse() -> Result<()> {
    let Some((dev, _turn)) = gpu("a_block_used_on_another_stream_waits_for_it_before_reuse") else {
        return Ok(());
    };
    let main = cuda::current_stream(&dev)?;
    let side = cuda::Stream::new(&dev)?;
    let caching = !std::env::var("EMBER_CUDA_NO_CACHING").is_ok_and(|v| v != "0");
    // sizes of 10 MiB and more get segments of their own, so the block freed is
    // the best fit for the next request of its size
    let (with_record, without) = ((14 << 20) / 4, (10 << 20) / 4);
    for (record, n) in [(true, with_record), (false, without)] {
        let shows_mistakes = cuda::is_simulated() && caching;
        if !record && !shows_mistakes {
            // without record_stream the outcome is a race on a GPU (and without a
            // cache nothing is reused)
            continue;
        }
        let x = filled(n, 1.0, &dev)?;
        side.wait_stream(&main)?;
        let y = cuda::with_stream(&side, || x.mul(2.0))?;
        if record {
            x.record_stream(&side)?;
        }
        drop(x);
        // a tensor of the same size on the default stream, written at once
        let w = filled(n, 7.0, &dev)?;
        main.wait_stream(&side)?;
        let got = y.to_vec::<f32>()?;
        if record {
            assert!(
                got.iter().all(|&v| v == 2.0),
                "the side stream's input was reused early"
            );
        } else {
            // the simulator shows the mistake: the block went to `w`, whose fill ran
            // before the side stream read it
            assert!(
                got.iter().all(|&v| v == 14.0),
                "the simulator missed an early reuse"
            );
        }
        assert!(w.to_vec::<f32>()?.iter().all(|&v| v == 7.0));
    }
    // once the side stream's work is done the block is reused as before
    let x = filled(without, 1.0, &dev)?;
    let y = cuda::with_stream(&side, || {
        side.wait_stream(&main)?;
        x.mul(2.0)
    })?;
    x.record_stream(&side)?;
    drop(x);
    side.synchronize()?;
    let before = cuda::memory_stats(&dev)?.num_device_mallocs;
    let w = filled(without, 7.0, &dev)?;
    if caching {
        assert_eq!(cuda::memory_stats(&dev)?.num_device_mallocs, before);
    }
    drop((w, y));
    Ok(())
}

#[test]
fn streams_come_from_a_pool_and_each_thread_has_its_own_current_stream() -> Result<()> {
    let Some((dev, _turn)) = gpu("streams_come_from_a_pool") else {
        return Ok(());
    };
    let first = cuda::Stream::new(&dev)?;
    let more: Vec<cuda::Stream> = (0..40)
        .map(|_| cuda::Stream::new(&dev))
        .collect::<Result<_>>()?;
    // 32 streams, handed out in turn
    let distinct: std::collections::BTreeSet<String> = std::iter::once(&first)
        .chain(&more)
        .map(|s| format!("{s:?}"))
        .collect();
    assert_eq!(distinct.len(), 32, "{distinct:?}");
    assert!(more
        .iter()
        .all(|s| *s != cuda::default_stream(&dev).unwrap()));
    // nested choices, restored in order, also after a panic
    let (a, b) = (&more[0], &more[1]);
    cuda::with_stream(a, || {
        cuda::with_stream(b, || assert_eq!(cuda::current_stream(&dev).unwrap(), *b));
        assert_eq!(cuda::current_stream(&dev).unwrap(), *a);
        // another thread starts on the default stream
        std::thread::scope(|s| {
            s.spawn(|| {
                assert_eq!(
                    cuda::current_stream(&dev).unwrap(),
                    cuda::default_stream(&dev).unwrap()
                )
            });
        });
    });
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        cuda::with_stream(a, || panic!("inside"))
    }));
    assert!(caught.is_err());
    assert_eq!(cuda::current_stream(&dev)?, cuda::default_stream(&dev)?);
    // a stream's wait counts as a host wait
    let before = cuda::host_syncs(&dev)?;
    a.synchronize()?;
    assert_eq!(cuda::host_syncs(&dev)?, before + 1);
    // streams are of CUDA devices only; tensors record streams of their device
    assert!(cuda::Stream::new(&Device::Cpu).is_err());
    assert!(cuda::current_stream(&Device::Meta).is_err());
    let cpu = Tensor::zeros([2], DType::F32, &Device::Cpu)?;
    assert!(matches!(
        cpu.record_stream(a),
        Err(Error::DeviceMismatch { .. })
    ));
    // with the pool handed out, ember's own streams are still there
    let x = Tensor::ones([4], DType::F32, &dev)?;
    let (g, y) = cuda::Graph::capture(&dev, || x.add(1.0))?;
    g.replay()?;
    assert_eq!(y.to_vec::<f32>()?, vec![2.0; 4]);
    let data = ember::data::TensorDataset::new(
        Tensor::ones([4, 2], DType::F32, &Device::Cpu)?,
        Tensor::zeros([4], DType::I64, &Device::Cpu)?,
    )?;
    let l = ember::data::DataLoader::new(data, 2)?.device(&dev);
    assert_eq!(l.iter().count(), 2);
    Ok(())
}

/// A 0-d CPU tensor (a CPU scalar) beside GPU tensors is captured in a CUDA
/// graph as its value when captured, as PyTorch's kernels take it: arithmetic,
/// in place, comparisons and `where` all run in the capture (nothing is copied
/// from host memory, which a capture refuses), and a replay recomputes them
/// from the GPU tensors' new values.
#[test]
fn cpu_scalars_are_captured_by_value() -> Result<()> {
    let Some((dev, _turn)) = gpu("cpu_scalars_are_captured_by_value") else {
        return Ok(());
    };
    let x = Tensor::zeros([4], DType::F32, &dev)?;
    let (two, half) = (
        Tensor::scalar(2f32, &Device::Cpu)?,
        Tensor::scalar(0.5f64, &Device::Cpu)?,
    );
    let f = |x: &Tensor| -> Result<(Tensor, Tensor)> {
        let y = x.mul(&two)?;
        y.add_(&half)?;
        let big = x.gt(&two)?;
        Ok((big.where_(&two, &y)?, two.sub(x)?))
    };
    f(&x)?; // warm-up: kernels compiled before the capture
    let (graph, (picked, left)) = cuda::Graph::capture(&dev, || f(&x))?;
    // the graph holds the values the scalars had when captured
    two.copy_(&Tensor::scalar(9f32, &Device::Cpu)?)?;
    for v in [[1f32, 3., -1., 2.5], [0., 5., 1., 2.]] {
        x.copy_(&Tensor::new(v, &dev)?)?;
        graph.replay()?;
        let want: Vec<f32> = v
            .iter()
            .map(|&a| if a > 2.0 { 2.0 } else { a * 2.0 + 0.5 })
            .collect();
        assert_eq!(picked.to_vec::<f32>()?, want);
        assert_eq!(
            left.to_vec::<f32>()?,
            v.iter().map(|&a| 2.0 - a).collect::<Vec<_>>()
        );
    }
    Ok(())
}

/// The in-place fills inside a capture take a CPU scalar's value when captured
/// (filled in on the device, not copied from the host), and replay.
#[test]
fn in_place_fills_are_captured_by_value() -> Result<()> {
    let Some((dev, _turn)) = gpu("in_place_fills_are_captured_by_value") else {
        return Ok(());
    };
    let x = Tensor::zeros([4], DType::F32, &dev)?;
    let z = Tensor::zeros([4], DType::F32, &dev)?;
    let (two, half) = (
        Tensor::scalar(2f32, &Device::Cpu)?,
        Tensor::scalar(0.5f64, &Device::Cpu)?,
    );
    let f = || -> Result<()> {
        z.fill_(&two)?;
        z.masked_fill_(&x.gt(1.0)?, &half)?;
        z.clamp_(Some(0.0), Some(1.5))?;
        Ok(())
    };
    f()?; // warm-up: kernels compiled before the capture
    let (graph, ()) = cuda::Graph::capture(&dev, f)?;
    two.copy_(&Tensor::scalar(9f32, &Device::Cpu)?)?;
    half.copy_(&Tensor::scalar(-4f64, &Device::Cpu)?)?;
    for v in [[0f32, 3., 1., 2.], [5., 0., 0., 5.]] {
        x.copy_(&Tensor::new(v, &dev)?)?;
        z.zero_()?;
        graph.replay()?;
        let want: Vec<f32> = v.iter().map(|&a| if a > 1.0 { 0.5 } else { 1.5 }).collect();
        assert_eq!(z.to_vec::<f32>()?, want);
    }
    Ok(())
}

/// A bad index found by a check queued on a side stream is reported by the wait
/// for that stream (or the device), not lost.
#[test]
fn an_index_error_on_a_side_stream_is_reported_by_its_wait() -> Result<()> {
    let Some((dev, _turn)) = gpu("an_index_error_on_a_side_stream") else {
        return Ok(());
    };
    let side = cuda::Stream::new(&dev)?;
    let t = Tensor::arange(0f32, 4f32, &dev)?;
    let bad = Tensor::new([0i64, 9], &dev)?;
    side.wait_stream(&cuda::current_stream(&dev)?)?;
    let _ = cuda::with_stream(&side, || t.index_select(0, &bad))?;
    // a wait for the default stream does not see it...
    assert_eq!(t.to_vec::<f32>()?, vec![0.0, 1.0, 2.0, 3.0]);
    // ...the side stream's does
    match side.synchronize() {
        Err(Error::IndexOutOfRange { index: 9, .. }) => {}
        other => panic!("expected the bad index, got {other:?}"),
    }
    // and it is reported once
    side.synchronize()?;
    let _ = cuda::with_stream(&side, || t.index_select(0, &bad))?;
    assert!(matches!(
        cuda::synchronize(&dev),
        Err(Error::IndexOutOfRange { index: 9, .. })
    ));
    cuda::synchronize(&dev)?;
    Ok(())
}

// ---------------------------------------------------------------------------------
// CUDA graphs

#[test]
fn a_graph_replay_writes_what_eager_work_writes() -> Result<()> {
    let Some((dev, _turn)) = gpu("a_graph_replay_writes_what_eager_work_writes") else {
        return Ok(());
    };
    ember::manual_seed(3);
    let w = Tensor::randn([32, 16], &dev)?;
    let pick = Tensor::new([2i64, 0, 5], &dev)?; // static index input
    let x = Tensor::zeros([8, 32], DType::F32, &dev)?; // static input
    let f = |x: &Tensor, pick: &Tensor| -> Result<(Tensor, Tensor)> {
        let h = x.matmul(&w)?.relu()?;
        let rows = h.index_select(0, pick)?;
        Ok((h.sum(1, false)?, rows.mul(0.5)?.add(1.0)?))
    };
    f(&x, &pick)?; // warm-up: kernels compiled before the capture
    let (graph, (sums, rows)) = cuda::Graph::capture(&dev, || f(&x, &pick))?;
    assert_eq!(graph.device(), dev);
    // an eager tensor made after the capture never shares the graph's memory
    let other = Tensor::full([8, 16], 7.0, DType::F32, &dev)?;
    for step in 0..4 {
        let input = Tensor::randn([8, 32], &dev)?;
        let idx = Tensor::new([step as i64, 7 - step as i64, 3], &dev)?;
        x.copy_(&input)?;
        pick.copy_(&idx)?;
        graph.replay()?;
        let (want_sums, want_rows) = f(&input, &idx)?;
        assert_eq!(
            sums.to_vec::<f32>()?,
            want_sums.to_vec::<f32>()?,
            "step {step}"
        );
        assert_eq!(
            rows.to_vec::<f32>()?,
            want_rows.to_vec::<f32>()?,
            "step {step}"
        );
    }
    assert!(other.to_vec::<f32>()?.iter().all(|&v| v == 7.0));
    // a bad index in a replay is reported by the next wait, as outside graphs
    pick.copy_(&Tensor::new([0i64, 8, 1], &dev)?)?;
    graph.replay()?;
    match cuda::synchronize(&dev) {
        Err(Error::IndexOutOfRange { index: 8, op, .. }) => assert_eq!(op, "index_select"),
        other => panic!("expected the bad index at the next wait, got {other:?}"),
    }
    pick.copy_(&Tensor::new([1i64, 1, 1], &dev)?)?;
    graph.replay()?;
    cuda::synchronize(&dev)?;
    Ok(())
}

#[test]
fn a_captured_training_step_trains_as_eager_steps_do() -> Result<()> {
    let Some((dev, _turn)) = gpu("a_captured_training_step_trains_as_eager_steps_do") else {
        return Ok(());
    };
    use ember::nn::{self, Module};
    use ember::optim::{Optimizer, Sgd};
    ember::manual_seed(5);
    let graphed = ember::models::mlp(&[12, 24, 4], &dev)?;
    let eager = ember::models::mlp(&[12, 24, 4], &dev)?;
    ember::no_grad(|| -> Result<()> {
        for (a, b) in graphed.parameters().iter().zip(eager.parameters()) {
            b.copy_(a)?;
        }
        Ok(())
    })?;
    let mut opt_g = Sgd::new(graphed.parameters(), 0.1)?.momentum(0.9)?;
    let mut opt_e = Sgd::new(eager.parameters(), 0.1)?.momentum(0.9)?;
    let batches: Vec<(Tensor, Tensor)> = (0..5)
        .map(|_| {
            Ok((
                Tensor::randn([6, 12], &dev)?,
                Tensor::randint(0, 4, [6], &dev)?,
            ))
        })
        .collect::<Result<_>>()?;
    let step = |model: &dyn Module, opt: &mut Sgd, x: &Tensor, y: &Tensor| -> Result<Tensor> {
        opt.zero_grad();
        let loss = nn::cross_entropy(&model.forward(x)?, y)?;
        loss.backward()?;
        opt.step()?;
        Ok(loss.detach())
    };
    // step 1 eager on both (the momentum buffers are made), then the graph
    let (xs, ys) = (batches[0].0.copy()?, batches[0].1.copy()?);
    step(&graphed, &mut opt_g, &xs, &ys)?;
    step(&eager, &mut opt_e, &batches[0].0, &batches[0].1)?;
    let (graph, loss) = cuda::Graph::capture(&dev, || step(&graphed, &mut opt_g, &xs, &ys))?;
    for (i, (x, y)) in batches.iter().enumerate().skip(1) {
        xs.copy_(x)?;
        ys.copy_(y)?;
        graph.replay()?;
        let want = step(&eager, &mut opt_e, x, y)?;
        assert_eq!(loss.item::<f32>()?, want.item::<f32>()?, "step {i}");
    }
    for (a, b) in graphed.parameters().iter().zip(eager.parameters()) {
        assert_eq!(a.to_vec::<f32>()?, b.to_vec::<f32>()?);
    }
    // Adam in its capturable form counts its steps on the device: the replays
    // count, the capture does not; and each replay takes its bias corrections
    // from the count (the multi-tensor kernel reads it), so the replayed steps
    // give the eager steps' parameters, bit for bit
    let mut adam = ember::optim::Adam::new(graphed.parameters(), 1e-3)?;
    let mut adam_e = ember::optim::Adam::new(eager.parameters(), 1e-3)?;
    assert!(!adam.capturable() && adam.make_capturable()?);
    assert!(adam_e.make_capturable()?);
    let adam_step = |model: &dyn Module, opt: &mut ember::optim::Adam| -> Result<Tensor> {
        opt.zero_grad();
        let loss = nn::cross_entropy(&model.forward(&xs)?, &ys)?;
        loss.backward()?;
        opt.step()?;
        Ok(loss.detach())
    };
    adam_step(&graphed, &mut adam)?;
    let (graph, _) = cuda::Graph::capture(&dev, || adam_step(&graphed, &mut adam))?;
    for _ in 0..3 {
        graph.replay()?;
    }
    for _ in 0..4 {
        adam_step(&eager, &mut adam_e)?;
    }
    for (a, b) in graphed.parameters().iter().zip(eager.parameters()) {
        assert_eq!(
            a.to_vec::<f32>()?,
            b.to_vec::<f32>()?,
            "after replayed Adam steps"
        );
    }
    assert_eq!(adam.steps(), 4);
    let step = adam
        .state()?
        .into_iter()
        .find(|(n, _)| n == "step")
        .unwrap()
        .1;
    // (one count per parameter: each had a gradient at every step)
    assert_eq!(step.to_vec::<i64>()?, vec![4; graphed.parameters().len()]);
    // an eager step in which some parameters have no gradient would give those
    // that step a count of their own, which the graph's replays would not
    // advance: refused, nothing changed
    adam.zero_grad();
    nn::cross_entropy(&graphed.forward(&xs)?, &ys)?.backward()?;
    graphed.parameters()[0].zero_grad();
    let before: Vec<Vec<f32>> = graphed
        .parameters()
        .iter()
        .map(|p| p.to_vec::<f32>())
        .collect::<Result<_>>()?;
    let e = adam.step().unwrap_err().to_string();
    assert!(e.contains("captured this optimizer's step"), "{e}");
    for (p, b) in graphed.parameters().iter().zip(&before) {
        assert_eq!(&p.to_vec::<f32>()?, b);
    }
    graph.replay()?;
    assert_eq!(adam.steps(), 5, "the graph goes on counting");
    // once the graph is gone, the same step splits the counts
    drop(graph);
    adam.zero_grad();
    nn::cross_entropy(&graphed.forward(&xs)?, &ys)?.backward()?;
    graphed.parameters()[0].zero_grad();
    adam.step()?;
    let steps = adam.param_steps();
    assert_eq!((steps[0], steps[1]), (5, 6));
    Ok(())
}

#[test]
fn what_a_graph_cannot_hold_is_an_error_and_the_gpu_goes_on() -> Result<()> {
    let Some((dev, _turn)) = gpu("what_a_graph_cannot_hold") else {
        return Ok(());
    };
    let x = Tensor::ones([4], DType::F32, &dev)?;
    x.add(1.0)?; // warm-up
    let refused = |what: &str, r: Result<()>| match r {
        Err(Error::InvalidArgument {
            op: "cuda::Graph",
            msg,
        }) => {
            assert!(msg.contains(what), "{msg}")
        }
        other => panic!("{what}: expected an error, got {other:?}"),
    };
    refused(
        "copying values from the host",
        cuda::Graph::capture(&dev, || Tensor::new([1f32], &dev).map(|_| ())).map(|_| ()),
    );
    refused(
        "reading values",
        cuda::Graph::capture(&dev, || x.add(1.0)?.to_vec::<f32>().map(|_| ())).map(|_| ()),
    );
    refused(
        "waiting for the GPU",
        cuda::Graph::capture(&dev, || cuda::synchronize(&dev)).map(|_| ()),
    );
    refused(
        "graphs do not nest",
        cuda::Graph::capture(&dev, || cuda::Graph::capture(&dev, || Ok(())).map(|_| ()))
            .map(|_| ()),
    );
    assert!(cuda::Graph::capture(&Device::Cpu, || Ok(())).is_err());
    // events recorded before: neither waited for nor queried inside
    let (start, end) = (cuda::Event::record(&dev)?, cuda::Event::record(&dev)?);
    refused(
        "waiting for an event",
        cuda::Graph::capture(&dev, || end.synchronize()).map(|_| ()),
    );
    refused(
        "querying an event",
        cuda::Graph::capture(&dev, || end.query().map(|_| ())).map(|_| ()),
    );
    refused(
        "waiting for an event",
        cuda::Graph::capture(&dev, || start.elapsed_ms(&end).map(|_| ())).map(|_| ()),
    );
    assert!(start.elapsed_ms(&end)? >= 0.0);
    let side = cuda::Stream::new(&dev)?;
    refused(
        "querying a stream",
        cuda::Graph::capture(&dev, || side.query().map(|_| ())).map(|_| ()),
    );
    refused(
        "another stream",
        cuda::Graph::capture(&dev, || cuda::with_stream(&side, || x.add(1.0)).map(|_| ()))
            .map(|_| ()),
    );
    // a panic inside a capture ends it
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        cuda::Graph::capture(&dev, || -> Result<()> {
            x.add(1.0)?;
            panic!("inside a capture")
        })
    }));
    assert!(caught.is_err());
    // the device works on, and captures again
    assert_eq!(x.add(2.0)?.to_vec::<f32>()?, vec![3.0; 4]);
    let (g, y) = cuda::Graph::capture(&dev, || x.mul(4.0))?;
    g.replay()?;
    assert_eq!(y.to_vec::<f32>()?, vec![4.0; 4]);
    Ok(())
}

/// A captured random draw draws new numbers at each replay: the numbers the same
/// draws made eagerly would give, from the same seed.
#[test]
fn a_graph_draws_new_random_numbers_at_each_replay() -> Result<()> {
    let Some((dev, _turn)) = gpu("a_graph_draws_new_random_numbers") else {
        return Ok(());
    };
    Tensor::rand([8], &dev)?; // warm-up
    let draw = || -> Result<(Tensor, Tensor)> {
        Ok((
            Tensor::rand([1000], &dev)?,
            Tensor::randn([333], &dev)?.mul(2.0)?,
        ))
    };
    ember::manual_seed(11);
    let eager: Vec<(Tensor, Tensor)> = (0..3).map(|_| draw()).collect::<Result<_>>()?;
    ember::manual_seed(11);
    let (g, (u, n)) = cuda::Graph::capture(&dev, draw)?;
    for (i, (eu, en)) in eager.iter().enumerate() {
        g.replay()?;
        assert_eq!(u.to_vec::<f32>()?, eu.to_vec::<f32>()?, "replay {i}");
        assert_eq!(n.to_vec::<f32>()?, en.to_vec::<f32>()?, "replay {i}");
    }
    assert_ne!(eager[0].0.to_vec::<f32>()?, eager[1].0.to_vec::<f32>()?);
    Ok(())
}

/// Host copies, waits and replays made by the capturing thread are refused on
/// every stream, as PyTorch's default ("global") capture mode refuses them: one
/// under `with_stream` on another stream would run at once, before the captured
/// work it reads has run.
#[test]
fn host_work_on_another_stream_is_refused_in_a_capture() -> Result<()> {
    let Some((dev, _turn)) = gpu("host_work_on_another_stream") else {
        return Ok(());
    };
    let x = Tensor::full([4], 5.0, DType::F32, &dev)?;
    x.add(1.0)?; // warm-up
    let side = cuda::Stream::new(&dev)?;
    let (g, _) = cuda::Graph::capture(&dev, || x.mul(2.0))?;
    let on_side = |what: &str, f: &dyn Fn() -> Result<()>| {
        let r = cuda::Graph::capture(&dev, || {
            let y = x.add(1.0)?;
            cuda::with_stream(&side, f)?;
            Ok(y)
        });
        match r {
            Err(Error::InvalidArgument {
                op: "cuda::Graph",
                msg,
            }) => assert!(msg.contains(what), "{msg}"),
            other => panic!("{what}: expected an error, got {:?}", other.map(|_| ())),
        }
    };
    on_side("reading values", &|| x.to_vec::<f32>().map(|_| ()));
    on_side("copying values from the host", &|| {
        Tensor::new([1f32, 2.], &dev).map(|_| ())
    });
    on_side("waiting for the GPU", &|| cuda::synchronize(&dev));
    on_side("waiting for a stream", &|| side.synchronize());
    on_side("replaying a graph", &|| g.replay());
    // the device works on, on both streams
    assert_eq!(x.add(1.0)?.to_vec::<f32>()?, vec![6.0; 4]);
    let y = cuda::with_stream(&side, || {
        cuda::current_stream(&dev)?.wait_stream(&cuda::default_stream(&dev)?)?;
        x.mul(3.0)
    })?;
    cuda::default_stream(&dev)?.wait_stream(&side)?;
    assert_eq!(y.to_vec::<f32>()?, vec![15.0; 4]);
    Ok(())
}

/// Draws captured inside a [`Generator`](ember::Generator)'s scope replay from
/// that generator, wherever the replays are made: each replay gives its next
/// numbers (those of eager draws from a generator of the same seed), and the
/// global stream stays where it was; draws from the global stream in the same
/// capture go on drawing from it.
#[test]
fn a_graph_draws_from_the_generator_it_was_captured_with() -> Result<()> {
    let Some((dev, _turn)) = gpu("a_graph_draws_from_the_generator") else {
        return Ok(());
    };
    Tensor::rand([4], &dev)?; // warm-up
    let eager_gen = ember::Generator::new(7);
    let eager: Vec<Vec<f32>> = (0..3)
        .map(|_| eager_gen.scope(|| Tensor::rand([6], &dev))?.to_vec::<f32>())
        .collect::<Result<_>>()?;
    ember::manual_seed(1);
    let global: Vec<Vec<f32>> = (0..4)
        .map(|_| Tensor::randn([5], &dev)?.to_vec::<f32>())
        .collect::<Result<_>>()?;
    ember::manual_seed(1);
    let gen = ember::Generator::new(7);
    let (g, (scoped, plain)) = cuda::Graph::capture(&dev, || {
        let scoped = gen.scope(|| Tensor::rand([6], &dev))?;
        Ok((scoped, Tensor::randn([5], &dev)?))
    })?;
    let other = ember::Generator::new(99);
    for (i, want) in eager.iter().enumerate() {
        // (a replay inside another generator's scope draws from the graph's too)
        if i == 1 {
            other.scope(|| g.replay())?;
        } else {
            g.replay()?;
        }
        assert_eq!(&scoped.to_vec::<f32>()?, want, "replay {i}");
        assert_eq!(plain.to_vec::<f32>()?, global[i], "replay {i}");
    }
    // the global stream moved by the plain draws only; `other` did not move
    assert_eq!(Tensor::randn([5], &dev)?.to_vec::<f32>()?, global[3]);
    let fresh = ember::Generator::new(99).scope(|| Tensor::rand([3], &dev))?;
    let drawn = other.scope(|| Tensor::rand([3], &dev))?;
    assert_eq!(drawn.to_vec::<f32>()?, fresh.to_vec::<f32>()?);
    // the generator advanced by the replays: its next draw is its fourth
    let fourth = eager_gen.scope(|| Tensor::rand([6], &dev))?;
    let next = gen.scope(|| Tensor::rand([6], &dev))?;
    assert_eq!(next.to_vec::<f32>()?, fourth.to_vec::<f32>()?);
    Ok(())
}

/// Ops that build index, mask or range tensors compute them on the device, so a
/// graph holds them: tril/triu, flip, reflection/replication/circular padding,
/// arange, linspace, eye, one_hot, and causal attention on the composite path
/// with dropout (its mask from tril). The replays give what eager calls give from
/// the same seed, randint's draws too. What is drawn on the host (randperm) is
/// refused by name.
#[test]
fn ranges_masks_and_causal_attention_are_captured() -> Result<()> {
    let Some((dev, _turn)) = gpu("ranges_masks_and_causal_attention") else {
        return Ok(());
    };
    use ember::nn::functional::scaled_dot_product_attention as sdpa;
    use ember::PadMode;
    let x = Tensor::randn([3, 5], &dev)?;
    let img = Tensor::randn([1, 2, 4, 5], &dev)?;
    // a head size the fused kernels do not take: the composite path, eager too
    let q = Tensor::randn([1, 2, 6, 5], &dev)?;
    let labels = Tensor::new([2i64, 0, 3], &Device::Cpu)?.to(&dev)?;
    let f = || -> Result<Vec<Tensor>> {
        Ok(vec![
            x.tril(0)?,
            x.triu(1)?,
            x.flip(&[0i64, 1][..])?,
            img.pad(&[2, 1, 1, 3], PadMode::Reflect)?,
            img.pad(&[1, 2, 0, 2], PadMode::Replicate)?,
            img.pad(&[1, 2, 2, 1], PadMode::Circular)?,
            Tensor::arange(3i64, 2000, &dev)?.to_dtype(DType::F64)?,
            Tensor::arange_step(-1.0, 2.0, 0.3, DType::F32, &dev)?,
            Tensor::linspace(-3, 11, 7, DType::I64, &dev)?,
            Tensor::linspace(0.0, 1.0, 100, DType::F32, &dev)?,
            Tensor::linspace(-0.0, 1.0 / 3.0, 5000, DType::F64, &dev)?,
            Tensor::eye_rect(3, 4, DType::F32, &dev)?,
            labels.one_hot(4)?,
            sdpa(&q, &q, &q, None, 0.2, true, None)?,
            sdpa(&q, &q, &q, None, 0.0, true, None)?,
            Tensor::randint(-5, 1 << 40, [7], &dev)?,
            Tensor::randint(0, 3, [5], &dev)?,
        ])
    };
    let vals =
        |ts: &[Tensor]| -> Result<Vec<Vec<f64>>> { ts.iter().map(|t| t.to_vec::<f64>()).collect() };
    ember::manual_seed(5);
    let eager = [vals(&f()?)?, vals(&f()?)?];
    // the dropout masks differ between calls
    assert_ne!(eager[0][13], eager[1][13]);
    ember::manual_seed(5);
    let (g, ys) = cuda::Graph::capture(&dev, f)?;
    for (i, want) in eager.iter().enumerate() {
        g.replay()?;
        assert_eq!(&vals(&ys)?, want, "replay {i}");
    }
    // values drawn on the host are refused, naming the op
    let e = cuda::Graph::capture(&dev, || Tensor::randperm(10, &dev))
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("randperm") && e.contains("before the capture"),
        "{e}"
    );
    Ok(())
}

/// The memory-saving attention path inside a graph: each replay draws new
/// dropout masks, and its backward redraws the masks its forward used (with the
/// identity as values, the output is the dropped-out weights and the values'
/// gradient of its sum is their column sums).
#[test]
fn memory_saving_attention_redraws_its_dropout_masks_in_a_graph() -> Result<()> {
    let Some((dev, _turn)) = gpu("memory_saving_attention_redraws_its_dropout_masks") else {
        return Ok(());
    };
    use ember::nn::functional::{
        scaled_dot_product_attention as sdpa, with_attention_path, AttentionPath,
    };
    let s = 6;
    let q = Tensor::randn([2, 3, s, 4], &dev)?;
    let k = Tensor::randn([2, 3, s, 4], &dev)?;
    let v = Tensor::eye(s, DType::F32, &dev)?
        .expand([2, 3, s, s])?
        .contiguous()?
        .requires_grad_(true)?;
    let step = || -> Result<Tensor> {
        with_attention_path(AttentionPath::MemoryEfficient, || {
            let out = sdpa(&q, &k, &v, None, 0.5, false, None)?;
            out.sum_all()?.backward()?;
            Ok(out.detach())
        })
    };
    // the masks of one step, and whether its backward used them
    let check = |out: &Tensor, what: &str| -> Result<Vec<f32>> {
        let cols = out.sum(&[2i64][..], false)?.to_vec::<f32>()?;
        let grad = v
            .grad()
            .expect("a gradient")
            .select(3, 0)?
            .to_vec::<f32>()?;
        for (c, g) in cols.iter().zip(&grad) {
            assert!(
                (c - g).abs() <= 1e-5 * c.abs().max(1.0),
                "{what}: {cols:?} {grad:?}"
            );
        }
        let o = out.to_vec::<f32>()?;
        assert!(o.contains(&0.0) && o.iter().any(|&x| x > 0.0), "{what}");
        Ok(o)
    };
    let eager = step()?;
    check(&eager, "eager")?;
    v.set_grad(None)?;
    let (g, out) = cuda::Graph::capture(&dev, step)?;
    let mut seen = Vec::new();
    for i in 0..3 {
        g.replay()?;
        let o = check(&out, &format!("replay {i}"))?;
        assert!(!seen.contains(&o), "replay {i} repeats a mask");
        seen.push(o);
    }
    Ok(())
}

#[test]
fn a_graphs_memory_is_its_own_until_it_is_dropped() -> Result<()> {
    let Some((dev, _turn)) = gpu("a_graphs_memory_is_its_own") else {
        return Ok(());
    };
    let x = Tensor::full([1 << 16], 2.0, DType::F32, &dev)?;
    x.mul(3.0)?.add(1.0)?; // warm-up
    cuda::synchronize(&dev)?;
    cuda::empty_cache(&dev)?;
    let reserved = cuda::memory_reserved(&dev)?;
    let allocated = cuda::memory_allocated(&dev)? - (1 << 18);
    let (g, y) = cuda::Graph::capture(&dev, move || {
        // a temporary freed inside the capture, and the input, made before it,
        // freed there too: the replays read both
        let t = x.mul(3.0)?;
        drop(x);
        t.add(1.0)
    })?;
    // eager tensors of their size made now take other memory
    let eager: Vec<Tensor> = (0..4)
        .map(|i| Tensor::full([1 << 16], i as f64, DType::F32, &dev))
        .collect::<Result<_>>()?;
    g.replay()?;
    assert!(y.to_vec::<f32>()?.iter().all(|&v| v == 7.0));
    for (i, e) in eager.iter().enumerate() {
        assert!(
            e.to_vec::<f32>()?.iter().all(|&v| v == i as f32),
            "tensor {i}"
        );
    }
    // emptying the cache keeps the graph's pool
    cuda::empty_cache(&dev)?;
    g.replay()?;
    assert!(y.to_vec::<f32>()?.iter().all(|&v| v == 7.0));
    drop((g, y, eager));
    cuda::empty_cache(&dev)?;
    assert_eq!(cuda::memory_allocated(&dev)?, allocated);
    assert!(
        cuda::memory_reserved(&dev)? <= reserved,
        "the graph's pool was kept"
    );
    // a dropped graph's memory goes back to the driver without emptying the
    // cache: at once, or when its last output is dropped
    let reserved = cuda::memory_reserved(&dev)?;
    let x = Tensor::full([1 << 18], 2.0, DType::F32, &dev)?;
    for outputs_first in [true, false] {
        let (g, y) = cuda::Graph::capture(&dev, || x.mul(3.0)?.add(1.0))?;
        g.replay()?;
        assert!(y.to_vec::<f32>()?.iter().all(|&v| v == 7.0));
        assert!(cuda::memory_reserved(&dev)? > reserved);
        if outputs_first {
            drop(y);
            drop(g);
        } else {
            drop(g);
            assert!(cuda::memory_reserved(&dev)? > reserved, "y is still alive");
            drop(y);
        }
        let now = cuda::memory_reserved(&dev)?;
        // (x's own segment on top)
        assert!(now <= reserved + (2 << 20), "{now} > {reserved}");
    }
    Ok(())
}

/// The meta device makes the allocations a GPU makes for batch norm over
/// single-element planes (a `[n, c]` batch: its per-channel sums go column by
/// column, in chunks of rows whose partial sums take a workspace), over planes
/// of many elements (`[5, 8, 64, 64]`: 20,480 elements a channel, summed in two
/// chunks with a workspace of partial sums) and for the long sums around them
/// (the weight's gradient over 1,500 rows, the loss over all elements: a GPU
/// splits them by its multiprocessor count, which meta is told): as many
/// blocks, forward and backward, so the memory estimate follows the kernels.
#[test]
fn meta_allocates_as_the_gpu_for_batch_norm_over_columns() -> Result<()> {
    use ember::nn::functional::{batch_norm, BatchNormOptions};
    let Some((dev, _turn)) = gpu("meta_allocates_as_the_gpu_for_batch_norm_over_columns") else {
        return Ok(());
    };
    // 1,500 rows of 256 channels (two chunks of rows), and 8 channels of 5
    // planes of 64 x 64
    for shape in [&[1500, 256][..], &[5, 8, 64, 64]] {
        let c = shape[1];
        let step = |d: &Device| -> Result<Box<dyn FnOnce() -> Result<()>>> {
            let x = Tensor::randn(shape, d)?.requires_grad_(true)?;
            let w = Tensor::ones([c], DType::F32, d)?.requires_grad_(true)?;
            let mean = Tensor::zeros([c], DType::F32, d)?;
            let var = Tensor::ones([c], DType::F32, d)?;
            Ok(Box::new(move || {
                let opts = BatchNormOptions {
                    running_mean: Some(&mean),
                    running_var: Some(&var),
                    training: true,
                    ..Default::default()
                };
                batch_norm(&x, Some(&w), None, opts)?.sum_all()?.backward()
            }))
        };
        allocations_agree(&dev, &format!("batch norm {shape:?}"), step)?;
    }
    Ok(())
}

/// The meta device makes the allocations a GPU makes for a convolution's forward
/// and backward passes, through cuDNN (its workspaces) and through ember's own
/// im2col path (the patches, the per-sample products, and the partial sums of
/// the weight gradient's sum over 128 samples, split by the multiprocessor count).
#[test]
fn meta_allocates_as_the_gpu_for_convolutions_on_both_paths() -> Result<()> {
    let Some((dev, _turn)) = gpu("meta_allocates_as_the_gpu_for_convolutions_on_both_paths") else {
        return Ok(());
    };
    let was = cuda::cudnn::enabled();
    let step = |d: &Device| -> Result<Box<dyn FnOnce() -> Result<()>>> {
        let x = Tensor::randn([128, 3, 8, 8], d)?.requires_grad_(true)?;
        let w = Tensor::randn([8, 3, 3, 3], d)?.requires_grad_(true)?;
        let up = Tensor::randn([128, 8, 6, 6], d)?;
        Ok(Box::new(move || {
            x.conv2d(&w, None, ember::Conv2dOptions::default())?
                .backward_with(&up)
        }))
    };
    for cudnn in [true, false] {
        cuda::cudnn::set_enabled(cudnn);
        let agree = allocations_agree(&dev, &format!("cuDNN {cudnn}"), step);
        cuda::cudnn::set_enabled(was);
        agree?;
    }
    Ok(())
}

/// The meta device makes the allocations a GPU makes for a 3-D convolution's
/// forward and backward passes (each depth tap's slices, 2-D convolution and
/// gradients, the gradients' depth-major sums), with depth padding and a
/// stride, and with `padding="same"` and an even kernel (padding copied in on
/// one side); and of a strided, padded 3-D transposed convolution.
#[test]
fn meta_allocates_as_the_gpu_for_conv3d() -> Result<()> {
    let Some((dev, _turn)) = gpu("meta_allocates_as_the_gpu_for_conv3d") else {
        return Ok(());
    };
    for same in [false, true] {
        let step = |d: &Device| -> Result<Box<dyn FnOnce() -> Result<()>>> {
            let x = Tensor::randn([2, 3, 5, 6, 6], d)?.requires_grad_(true)?;
            let k = if same { 2 } else { 3 };
            let w = Tensor::randn([4, 3, k, k, k], d)?.requires_grad_(true)?;
            let b = Tensor::randn([4], d)?.requires_grad_(true)?;
            Ok(Box::new(move || {
                let y = match same {
                    true => x.conv3d_same(&w, Some(&b), (1, 1, 1), 1)?,
                    false => {
                        let opts = ember::Conv3dOptions::default().padding(1).stride(2);
                        x.conv3d(&w, Some(&b), opts)?
                    }
                };
                y.backward_with(&y.ones_like()?)?;
                // and a transposed one back (its weight [in, out, ...])
                let t = ember::nn::ConvTranspose3dOptions::default()
                    .stride(2)
                    .padding(1);
                let wt = w
                    .detach()
                    .transpose(0, 1)?
                    .contiguous()?
                    .requires_grad_(true)?;
                let z = x.conv_transpose3d(&wt, None, t)?;
                z.backward_with(&z.ones_like()?)
            }))
        };
        allocations_agree(&dev, &format!("conv3d, same {same}"), step)?;
    }
    Ok(())
}

/// The meta device makes the allocations a GPU makes for an argsort and a
/// cumulative sum: the output alone for short lines, and for long ones (3,000
/// elements along a middle dimension) the argsort's second index buffer for its
/// merge passes and the cumulative sum's carries between chunks.
#[test]
fn meta_allocates_as_the_gpu_for_argsort_and_cumsum_of_short_and_long_lines() -> Result<()> {
    let name = "meta_allocates_as_the_gpu_for_argsort_and_cumsum_of_short_and_long_lines";
    let Some((dev, _turn)) = gpu(name) else {
        return Ok(());
    };
    type Op = fn(&Tensor) -> Result<Tensor>;
    let ops: [(&str, Op); 2] = [
        ("argsort", |x| x.argsort(1, true)),
        ("cumsum", |x| x.cumsum(1)),
    ];
    for (what, op) in ops {
        for shape in [[2, 100, 3], [2, 3000, 3]] {
            let step = |d: &Device| -> Result<Box<dyn FnOnce() -> Result<()>>> {
                let x = Tensor::randn(shape, d)?;
                Ok(Box::new(move || op(&x).map(drop)))
            };
            allocations_agree(&dev, &format!("{what} {shape:?}"), step)?;
        }
    }
    Ok(())
}

/// Runs what `step` makes on meta (modelling `dev`'s multiprocessors) and on
/// `dev`, and asserts that both allocate as many blocks.
fn allocations_agree(
    dev: &Device,
    what: &str,
    step: impl Fn(&Device) -> Result<Box<dyn FnOnce() -> Result<()>>>,
) -> Result<()> {
    let count = std::sync::Arc::new(AllocCount::default());
    let on_meta = step(&Device::Meta)?;
    let sms = cuda::device_properties(0)?.multiprocessor_count as usize;
    ember::meta::with_multiprocessors(sms, || ember::meta::with_hook(count.clone(), on_meta))?;
    let on_gpu = step(dev)?;
    cuda::synchronize(dev)?;
    let before = cuda::memory_stats(dev)?.num_allocs;
    on_gpu()?;
    cuda::synchronize(dev)?;
    let made = cuda::memory_stats(dev)?.num_allocs - before;
    let counted = count.0.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        counted, made,
        "{what}: meta allocated {counted} blocks, the GPU {made}"
    );
    Ok(())
}

/// Counts meta allocations while it is the hook.
#[derive(Default)]
struct AllocCount(std::sync::atomic::AtomicU64);

impl ember::meta::AllocHook for AllocCount {
    fn alloc(&self, _: &ember::meta::MetaEvent) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    fn free(&self, _: &ember::meta::MetaEvent) {}
}
