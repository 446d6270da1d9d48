//! CUDA-only behaviour: copies between devices, events, and CUDA results against
//! the CPU's on random inputs (the allocator's statistics are tested in their own
//! process, in tests/cuda_memory.rs). Every test skips (saying why) where no GPU is present; the
//! no-GPU behaviour is tested at the end.

use super::{assert_close, bits, gpu, rng_lock, this_threads_count, vals};
use ember::prelude::*;
use ember::{cuda, Error};

#[test]
fn copies_between_devices_keep_values_and_dtype() -> Result<()> {
    let Some(dev) = gpu("copies_between_devices") else {
        return Ok(());
    };
    for dt in [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I64,
        DType::U8,
        DType::Bool,
    ] {
        let a = Tensor::arange_step(0.0, 24.0, 1.0, DType::F64, &Device::Cpu)?
            .to_dtype(dt)?
            .reshape([2, 3, 4])?;
        let g = a.to(&dev)?;
        assert_eq!(g.device(), dev);
        assert!(g.is_cuda());
        assert_eq!((g.shape(), g.dtype()), (a.shape(), dt));
        // a non-contiguous view goes over as its own values
        let t = g.transpose(0, 2)?;
        let back = t.cpu()?;
        assert_eq!(back.device(), Device::Cpu);
        assert_eq!(vals(&back), vals(&a.transpose(0, 2)?), "{dt}");
        assert_eq!(vals(&g.cuda(0)?), vals(&a));
    }
    Ok(())
}

#[test]
fn printing_names_the_device() -> Result<()> {
    let Some(dev) = gpu("printing_names_the_device") else {
        return Ok(());
    };
    let t = Tensor::new([1.5f32, -2.0], &dev)?;
    assert_eq!(t.to_string(), "tensor([ 1.5000, -2.0000], device='cuda:0')");
    Ok(())
}

/// Fills convert their value as the CPU does (a negative integer wraps into uint8;
/// a large int64 stays exact), and a bool tensor reads back as bools even when its
/// bytes were never written.
#[test]
fn fills_convert_as_the_cpu_does() -> Result<()> {
    let Some(dev) = gpu("fills_convert_as_the_cpu_does") else {
        return Ok(());
    };
    let u = Tensor::full([3], -2, DType::U8, &dev)?; // an int wraps; -2.0 is refused, as in PyTorch
    assert_eq!(u.to_vec::<u8>()?, vec![254; 3]);
    let big = (1i64 << 53) + 1; // not a float64
    let i = Tensor::zeros([2], DType::I64, &dev)?;
    let mask = Tensor::new([true, false], &dev)?;
    assert_eq!(i.masked_fill(&mask, big)?.to_vec::<i64>()?, vec![big, 0]);
    let m = Tensor::zeros([2], DType::U8, &dev)?.masked_fill(&mask, -2i64)?;
    assert_eq!(m.to_vec::<u8>()?, vec![254, 0]);
    let ones = Tensor::ones([2, 2], DType::Bool, &dev)?;
    assert_eq!(ones.to_vec::<bool>()?, vec![true; 4]);
    let e = Tensor::empty([5], DType::Bool, &dev)?;
    assert_eq!(e.to_vec::<bool>()?.len(), 5);
    Ok(())
}

#[test]
fn mixed_devices_are_an_error() -> Result<()> {
    let Some(dev) = gpu("mixed_devices_are_an_error") else {
        return Ok(());
    };
    let a = Tensor::ones([2], DType::F32, &dev)?;
    let b = Tensor::ones([2], DType::F32, &Device::Cpu)?;
    let e = a.add(&b).unwrap_err().to_string();
    assert!(
        e.starts_with("Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"),
        "{e}"
    );
    assert!(a.matmul(&b.reshape([2, 1])?).is_err());
    Ok(())
}

/// The op results of the GPU against the CPU's on the same random inputs.
#[test]
fn gpu_matches_cpu_on_random_inputs() -> Result<()> {
    let Some(dev) = gpu("gpu_matches_cpu_on_random_inputs") else {
        return Ok(());
    };
    let _g = rng_lock();
    ember::manual_seed(11);
    let cpu = Device::Cpu;
    let x = Tensor::randn([37, 53], &cpu)?;
    let y = Tensor::randn([53], &cpu)?;
    let w = Tensor::randn([53, 29], &cpu)?;
    let (xg, yg, wg) = (x.to(&dev)?, y.to(&dev)?, w.to(&dev)?);
    type Op = fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>;
    let ops: Vec<(&str, Op, f64)> = vec![
        ("add", |x, y, _| x.add(y), 1e-6),
        ("mul scalar", |x, _, _| x.mul(2.5), 1e-6),
        ("div", |x, y, _| x.div(&y.abs()?.add(1.0)?), 1e-5),
        ("exp", |x, _, _| x.exp(), 1e-5),
        ("gelu", |x, _, _| x.gelu(), 1e-5),
        ("relu t", |x, _, _| x.t()?.relu(), 0.0),
        ("sum dim 0", |x, _, _| x.sum(0, false), 1e-4),
        ("mean dim 1 keep", |x, _, _| x.mean(1, true), 1e-5),
        ("max all", |x, _, _| x.max_all(), 0.0),
        ("argmax 1", |x, _, _| x.argmax(1, false), 0.0),
        ("var 1", |x, _, _| x.var(1, false), 1e-4),
        ("softmax", |x, _, _| x.softmax(-1), 1e-5),
        ("log_softmax 0", |x, _, _| x.log_softmax(0), 1e-5),
        ("matmul", |x, _, w| x.matmul(w), 1e-4),
        ("matmul tt", |x, _, w| w.t()?.matmul(&x.t()?), 1e-4),
        ("lt + where", |x, y, _| x.lt(y)?.where_(x, 0.0), 0.0),
        (
            "to f16 and back",
            |x, _, _| x.to_dtype(DType::F16)?.to_dtype(DType::F32),
            0.0,
        ),
        ("cat", |x, _, _| Tensor::cat(&[x, &x.mul(2.0)?], 1), 0.0),
        (
            "index_select",
            |x, _, _| {
                let last = x.shape()[0] as i64 - 1; // negative indices are refused, as in PyTorch
                let i = Tensor::new([3i64, 0, last], &x.device())?;
                x.index_select(0, &i)
            },
            0.0,
        ),
    ];
    for (name, f, tol) in ops {
        let want = f(&x, &y, &w)?;
        let got = f(&xg, &yg, &wg)?;
        assert!(got.is_cuda(), "{name} left the GPU");
        assert_eq!(got.shape(), want.shape(), "{name}");
        assert_eq!(got.dtype(), want.dtype(), "{name}");
        assert_close(&vals(&got), &vals(&want), tol, tol);
    }
    Ok(())
}

#[test]
fn training_step_matches_cpu() -> Result<()> {
    use ember::nn::{self, Module};
    use ember::optim::{Adam, Optimizer};
    let Some(dev) = gpu("training_step_matches_cpu") else {
        return Ok(());
    };
    let _g = rng_lock();
    let run = |device: &Device| -> Result<Vec<f64>> {
        ember::manual_seed(3);
        let mut model = nn::Sequential::new()
            .add(nn::Linear::new(4, 16, &Device::Cpu)?)
            .add(nn::ReLU)
            .add(nn::Linear::new(16, 3, &Device::Cpu)?);
        model.to_device(device)?;
        let mut opt = Adam::new(model.parameters(), 0.01)?;
        let x = Tensor::randn([32, 4], &Device::Cpu)?.to(device)?;
        let y = Tensor::randint(0, 3, [32], &Device::Cpu)?.to(device)?;
        let mut losses = Vec::new();
        for _ in 0..5 {
            let loss = nn::cross_entropy(&model.forward(&x)?, &y)?;
            opt.zero_grad();
            loss.backward()?;
            opt.step()?;
            losses.push(loss.item::<f64>()?);
        }
        assert!(model.parameters().iter().all(|p| p.device() == *device));
        Ok(losses)
    };
    let want = run(&Device::Cpu)?;
    let got = run(&dev)?;
    assert_close(&got, &want, 1e-4, 1e-5);
    Ok(())
}

#[test]
fn events_time_queued_work() -> Result<()> {
    let _g = super::rng_lock();
    let Some(dev) = gpu("events_time_queued_work") else {
        return Ok(());
    };
    let a = Tensor::randn([512, 512], &dev)?;
    let start = cuda::Event::record(&dev)?;
    let mut c = a.clone();
    for _ in 0..10 {
        c = c.matmul(&a)?.mul(1e-3)?;
    }
    let end = cuda::Event::record(&dev)?;
    let ms = start.elapsed_ms(&end)?;
    assert!(ms > 0.0 && ms.is_finite(), "{ms}");
    cuda::synchronize(&dev)?;
    Ok(())
}

#[test]
fn without_a_gpu_cuda_requests_are_errors() -> Result<()> {
    if cuda::is_available() {
        eprintln!("skipped without_a_gpu: a GPU is present");
        return Ok(());
    }
    let dev = Device::Cuda(0);
    for r in [
        Tensor::zeros([2], DType::F32, &dev),
        Tensor::new([1f32], &dev),
        Tensor::ones([2], DType::F32, &Device::Cpu)?.to(&dev),
    ] {
        let e = r.unwrap_err();
        assert!(matches!(e, Error::CudaUnavailable { .. }), "{e}");
        assert!(e.to_string().contains("CUDA is not available"), "{e}");
    }
    assert!(cuda::synchronize(&dev).is_err());
    assert!(cuda::memory_allocated(&dev).is_err());
    assert!(cuda::Event::record(&dev).is_err());
    assert_eq!(cuda::synchronize(&Device::Cpu).ok(), Some(()));
    // a GPU never used holds no cache and no peak: nothing to do (PyTorch's
    // empty_cache without CUDA); a device that is not CUDA is still an error
    cuda::empty_cache(&dev)?;
    cuda::reset_peak_memory_stats(&dev)?;
    assert!(cuda::empty_cache(&Device::Cpu).is_err());
    assert!(cuda::reset_peak_memory_stats(&Device::Meta).is_err());
    Ok(())
}

/// Every op family on every dtype, on strided views, against the CPU: the same
/// values (within the dtype's precision), shape and dtype, or an error on both; and
/// every op runs on the GPU (no host fallback).
#[test]
fn every_dtype_matches_cpu_on_strided_views() -> Result<()> {
    let Some(dev) = gpu("every_dtype_matches_cpu") else {
        return Ok(());
    };
    let _g = rng_lock();
    ember::manual_seed(5);
    let cpu = Device::Cpu;
    let base = Tensor::randn([7, 5], &cpu)?
        .mul(3.0)?
        .to_dtype(DType::F64)?;
    let row = Tensor::randn([7], &cpu)?.mul(2.0)?.to_dtype(DType::F64)?;
    let dtypes = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I64,
        DType::U8,
        DType::Bool,
    ];
    let make = |t: &Tensor, dt: DType| -> Result<Tensor> {
        match dt {
            DType::Bool => t.gt(0.0),
            DType::U8 => t.abs()?.mul(4.0)?.to_dtype(dt),
            _ => t.to_dtype(dt),
        }
    };
    type Op = fn(&Tensor, &Tensor) -> Result<Tensor>;
    let ops: Vec<(&str, Op)> = vec![
        ("neg", |x, _| x.neg()),
        ("abs", |x, _| x.abs()),
        ("exp", |x, _| x.exp()),
        ("log|x|+1", |x, _| x.abs()?.add(1)?.log()),
        ("sqrt|x|", |x, _| x.abs()?.sqrt()),
        ("tanh", |x, _| x.tanh()),
        ("sin", |x, _| x.sin()),
        ("cos", |x, _| x.cos()),
        ("recip", |x, _| x.recip()),
        ("square", |x, _| x.square()),
        ("relu", |x, _| x.relu()),
        ("sigmoid", |x, _| x.sigmoid()),
        ("erf", |x, _| x.erf()),
        ("gelu", |x, _| x.gelu()),
        ("gelu_tanh", |x, _| x.gelu_tanh()),
        ("pow 2", |x, _| x.pow(2)),
        ("pow 0.5 of |x|", |x, _| x.abs()?.pow(0.5)),
        ("clamp", |x, _| x.clamp(Some(-1.0), Some(2.0))),
        ("add", |x, y| x.add(y)),
        ("sub", |x, y| x.sub(y)),
        ("mul", |x, y| x.mul(y)),
        ("div", |x, y| x.div(&y.abs()?.add(1)?)),
        ("maximum", |x, y| x.maximum(y)),
        ("minimum", |x, y| x.minimum(y)),
        ("pow tensor", |x, y| x.abs()?.pow(&y.abs()?)),
        ("add scalar", |x, _| x.add(2)),
        ("mul float scalar", |x, _| x.mul(2.5)),
        ("div int scalar", |x, _| x.div(3)),
        ("maximum bool scalar", |x, _| x.maximum(true)),
        ("lt float scalar", |x, _| x.lt(0.5)),
        ("ne int scalar", |x, _| x.ne(1)),
        ("sub_ int scalar in place", |x, _| {
            let t = x.copy()?;
            t.sub_(1)?;
            Ok(t)
        }),
        ("mul_ float scalar in place, strided", |x, _| {
            let t = x.zeros_like()?.add(x)?.t()?;
            t.mul_(-1.5)?;
            Ok(t)
        }),
        ("eq", |x, y| x.eq(y)),
        ("lt", |x, y| x.lt(y)),
        ("ge scalar", |x, _| x.ge(1)),
        ("where", |x, y| x.gt(y)?.where_(x, y)),
        ("masked_fill", |x, y| x.masked_fill(&y.gt(0)?, 1)),
        ("sum 0", |x, _| x.sum(0, false)),
        ("sum all", |x, _| x.sum_all()),
        ("mean 1", |x, _| x.mean(1, true)),
        ("max 1", |x, _| x.max(1, false)),
        ("min all", |x, _| x.min_all()),
        ("argmax 1", |x, _| x.argmax(1, false)),
        ("argmin 0", |x, _| x.argmin(0, true)),
        ("var 1", |x, _| x.var(1, false)),
        ("std all", |x, _| x.std_all()),
        ("softmax", |x, _| x.softmax(-1)),
        ("log_softmax 0", |x, _| x.log_softmax(0)),
        ("matmul", |x, y| x.matmul(&y.unsqueeze(1)?)),
        ("batched matmul", |x, _| {
            let b = x.reshape([1, 5, 7])?.expand([3, 5, 7])?;
            b.matmul(&x.t()?)
        }),
        ("cat", |x, y| Tensor::cat(&[x, &y.unsqueeze(0)?], 0)),
        ("index_select", |x, _| {
            x.index_select(1, &Tensor::new([6i64, 0, 2, 2], &x.device())?)
        }),
        ("gather", |x, _| {
            let i = Tensor::new([[0i64, 4], [3, 3], [1, 0], [2, 1], [4, 4]], &x.device())?;
            x.gather(1, &i)
        }),
        ("scatter_add", |x, _| {
            let i = Tensor::new([[0i64, 1, 0, 2, 1, 0, 2]], &x.device())?.expand([5, 7])?;
            // whole numbers: their sums are exact in every dtype, so the order in
            // which the GPU's atomics add them does not show in f16/bf16
            let src = x.to_dtype(DType::I64)?.to_dtype(x.dtype())?;
            x.zeros_like()?.narrow(1, 0, 3)?.scatter_add(1, &i, &src)
        }),
        ("contiguous", |x, _| x.contiguous()),
        ("depthwise conv2d", |x, _| {
            let w = x.narrow(1, 0, 2)?.reshape([5, 1, 2, 1])?;
            let opts = ember::Conv2dOptions::default().groups(5).padding(1);
            x.reshape([1, 5, 7, 1])?
                .conv2d(&w, Some(&x.select(1, 0)?), opts)
        }),
        ("conv2d", |x, _| {
            let w = x.narrow(0, 0, 2)?.reshape([2, 1, 7, 1])?;
            x.reshape([1, 1, 5, 7])?.conv2d(
                &w.narrow(2, 0, 3)?,
                None,
                ember::Conv2dOptions::default(),
            )
        }),
        ("max_pool2d", |x, _| {
            x.reshape([1, 1, 5, 7])?
                .max_pool2d(ember::Pool2dOptions::new(2).stride(1))
        }),
        ("avg_pool2d", |x, _| {
            x.reshape([1, 5, 7])?
                .avg_pool2d(ember::Pool2dOptions::new(2))
        }),
    ];
    for dt in dtypes {
        let mut refused = 0;
        // x: a transposed (non-contiguous) 5x7 view; y: a row that broadcasts
        let (xc, yc) = (make(&base, dt)?.t()?, make(&row, dt)?);
        let (xg, yg) = (make(&base.to(&dev)?, dt)?.t()?, make(&row.to(&dev)?, dt)?);
        assert_eq!(vals(&xg), vals(&xc), "{dt}: inputs differ");
        // by the result's dtype: exp of an int64 tensor is float32, and the GPU's
        // expf is not the CPU's (CUDA documents up to 2 ulp)
        let tol = |out: DType| match out {
            DType::F16 => 2e-3,
            DType::BF16 => 1.6e-2,
            DType::F32 => 2e-5,
            _ => 1e-9,
        };
        for (name, f) in &ops {
            let want = f(&xc, &yc);
            let got = f(&xg, &yg);
            match (want, got) {
                (Ok(want), Ok(got)) => {
                    assert!(got.is_cuda(), "{name} ({dt}) left the GPU");
                    assert_eq!(got.shape(), want.shape(), "{name} ({dt})");
                    assert_eq!(got.dtype(), want.dtype(), "{name} ({dt})");
                    let (g, w, tol) = (vals(&got), vals(&want), tol(want.dtype()));
                    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
                        let ok = a == b
                            || (a.is_nan() && b.is_nan())
                            || (a - b).abs() <= tol * (1.0 + b.abs());
                        assert!(ok, "{name} ({dt}) element {i}: cuda {a}, cpu {b}\n cuda {g:?}\n  cpu {w:?}");
                    }
                }
                (Err(e), Err(_)) => {
                    // every op here is defined for the float dtypes: an error there
                    // is a broken case, not an unsupported dtype
                    assert!(!matches!(dt, DType::F32 | DType::F64), "{name} ({dt}): {e}");
                    refused += 1;
                }
                (Ok(_), Err(e)) => panic!("{name} ({dt}): the CPU computes it, CUDA fails: {e}"),
                (Err(e), Ok(_)) => panic!("{name} ({dt}): CUDA computes it, the CPU fails: {e}"),
            }
        }
        // integers refuse the float-only reductions, softmax, convolution and
        // pooling; bools also refuse arithmetic (neg, abs, sub, ...), as in PyTorch
        let limit = if dt == DType::Bool {
            ops.len() / 2
        } else {
            ops.len() / 5
        };
        assert!(
            refused <= limit,
            "{dt}: {refused} of {} ops refused",
            ops.len()
        );
    }
    Ok(())
}

/// `rand`/`randn` draw on the device: the moments of each distribution, values in
/// range, the same values again after the same seed, and new values on each call.
#[test]
fn random_tensors_are_drawn_on_the_device() -> Result<()> {
    let Some(dev) = gpu("random_tensors_are_drawn_on_the_device") else {
        return Ok(());
    };
    let _g = rng_lock();
    let n = 200_001; // not a multiple of the values per counter
    for dt in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        ember::manual_seed(7);
        let z = Tensor::normal(1.0, 2.0, [n], dt, &dev)?;
        let u = Tensor::uniform(-3.0, 5.0, [n], dt, &dev)?;
        assert!(z.is_cuda() && z.dtype() == dt && u.dtype() == dt);
        let z = vals(&z);
        let mean = z.iter().sum::<f64>() / n as f64;
        let sd = (z.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64).sqrt();
        assert!(
            (mean - 1.0).abs() < 0.02 && (sd - 2.0).abs() < 0.02,
            "{dt}: {mean} {sd}"
        );
        // the normal's tails: P(|z| > 3 sd) = 0.0027
        let tail = z.iter().filter(|x| (*x - 1.0).abs() > 6.0).count() as f64 / n as f64;
        assert!((tail - 0.0027).abs() < 0.0008, "{dt}: tail {tail}");
        let u = vals(&u);
        assert!(
            u.iter().all(|&x| (-3.0..=5.0).contains(&x)),
            "{dt}: out of range"
        );
        let um = u.iter().sum::<f64>() / n as f64;
        let uv = u.iter().map(|x| (x - um).powi(2)).sum::<f64>() / n as f64;
        assert!(
            (um - 1.0).abs() < 0.03 && (uv - 64.0 / 12.0).abs() < 0.05,
            "{dt}: {um} {uv}"
        );
    }
    ember::manual_seed(11);
    let a = vals(&Tensor::randn([37], &dev)?);
    let b = vals(&Tensor::randn([37], &dev)?);
    ember::manual_seed(11);
    assert_eq!(
        vals(&Tensor::randn([37], &dev)?),
        a,
        "same seed, same values"
    );
    assert_ne!(a, b, "each draw continues the stream");
    Ok(())
}

/// Adam's multi-tensor step on a GPU (`foreach`, the default: up to 48 tensors per
/// launch, each cut into chunks of 65536 elements) gives the same bits as one launch
/// per parameter, for Adam and AdamW, in f32 and f64: 71 parameters (two
/// launches a step) of sizes from 1 to past two chunks, one without a gradient,
/// over three steps. Each step's launches are one `adam_foreach` record of the
/// profiler (recorded only where they run). The capturable form (the step count on the
/// device, the kernel taking the bias corrections from it) runs the same
/// launches and agrees with them to the bias corrections' rounding (`pow` on the
/// device against the host's).
#[test]
fn foreach_adam_matches_one_launch_per_parameter() -> Result<()> {
    use ember::optim::{Adam, Optimizer};
    let Some(dev) = gpu("foreach_adam_matches_one_launch_per_parameter") else {
        return Ok(());
    };
    let (_turn, _g) = (super::profile_turn(), rng_lock());
    for dtype in [DType::F32, DType::F64] {
        for adamw in [false, true] {
            ember::manual_seed(3);
            let sizes = foreach_sizes(70, 977, 3000, 140_000);
            let init = randn_each(&sizes, dtype)?;
            let grads: Vec<Vec<Tensor>> = (0..3)
                .map(|_| randn_each(&sizes, dtype))
                .collect::<Result<_>>()?;
            let run = |foreach: bool, capturable: bool| -> Result<Vec<Vec<f64>>> {
                let params: Vec<Tensor> = init
                    .iter()
                    .map(|t| t.to(&dev)?.requires_grad_(true))
                    .collect::<Result<_>>()?;
                let make = if adamw { Adam::adamw } else { Adam::new };
                let mut opt = make(params.clone(), 0.01)?.foreach(foreach);
                if capturable {
                    assert!(opt.make_capturable()?);
                }
                for step in &grads {
                    for (i, (p, g)) in params.iter().zip(step).enumerate() {
                        // parameter 5 never has a gradient
                        if i != 5 {
                            p.set_grad(Some(g.to(&dev)?))?;
                        }
                    }
                    opt.step()?;
                }
                params
                    .iter()
                    .map(|p| p.to_dtype(DType::F64)?.to_vec::<f64>())
                    .collect()
            };
            let (many, profile) = ember::profiler::profile(|| run(true, false))?;
            let one_each = run(false, false)?;
            for (i, (a, b)) in many.iter().zip(&one_each).enumerate() {
                let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "{dtype} adamw={adamw}: parameter {i} differs");
            }
            assert_ne!(many[0], init[0].to_dtype(DType::F64)?.to_vec::<f64>()?);
            assert_eq!(many[5], init[5].to_dtype(DType::F64)?.to_vec::<f64>()?);
            let launches = this_threads_count(&profile, "adam_foreach");
            assert_eq!(launches, 3, "{dtype}: one record per step");
            let (captured, profile) = ember::profiler::profile(|| run(true, true))?;
            let tol = if dtype == DType::F32 { 1e-6 } else { 1e-13 };
            for (i, (a, b)) in captured.iter().zip(&many).enumerate() {
                for (x, y) in a.iter().zip(b) {
                    assert!(
                        (x - y).abs() <= tol * y.abs().max(1e-3),
                        "{dtype} adamw={adamw} capturable: parameter {i}: {x} against {y}"
                    );
                }
            }
            assert_eq!(captured[5], many[5]);
            let launches = this_threads_count(&profile, "adam_foreach");
            assert_eq!(launches, 3, "{dtype}: the capturable form's launches");
        }
    }
    Ok(())
}

/// SGD's multi-tensor step on a GPU (`foreach`, the default: weight decay,
/// momentum and the update in one kernel, up to 48 parameters per launch) against
/// the same steps on the CPU, made of tensor operations: plain, with momentum,
/// dampening and weight decay, and Nesterov; 61 parameters (two launches) of sizes
/// from 1 to past two chunks, one without a gradient in the first step (its buffer
/// starts later, from its gradient, as PyTorch's does), over three steps.
#[test]
fn foreach_sgd_matches_the_cpu() -> Result<()> {
    use ember::optim::{Optimizer, Sgd};
    let Some(dev) = gpu("foreach_sgd_matches_the_cpu") else {
        return Ok(());
    };
    let (_turn, _g) = (super::profile_turn(), rng_lock());
    // (momentum, dampening, weight decay, nesterov)
    let configs = [
        (0.0, 0.0, 0.0, false),
        (0.9, 0.1, 1e-2, false),
        (0.8, 0.0, 5e-3, true),
    ];
    for dtype in [DType::F32, DType::F64] {
        for (momentum, dampening, wd, nesterov) in configs {
            ember::manual_seed(4);
            let sizes = foreach_sizes(60, 613, 2500, 150_000);
            let init = randn_each(&sizes, dtype)?;
            let grads: Vec<Vec<Tensor>> = (0..3)
                .map(|_| randn_each(&sizes, dtype))
                .collect::<Result<_>>()?;
            let run = |on: &Device| -> Result<(Vec<Vec<f64>>, u64)> {
                let params: Vec<Tensor> = init
                    .iter()
                    .map(|t| t.to(on)?.requires_grad_(true))
                    .collect::<Result<_>>()?;
                let mut opt = Sgd::new(params.clone(), 0.05)?
                    .momentum(momentum)?
                    .dampening(dampening)?
                    .weight_decay(wd)?
                    .nesterov(nesterov)?;
                let ((), profile) = ember::profiler::profile(|| {
                    for (s, step) in grads.iter().enumerate() {
                        for (i, (p, g)) in params.iter().zip(step).enumerate() {
                            // parameter 7 has no gradient in the first step
                            p.set_grad((s > 0 || i != 7).then(|| g.to(on)).transpose()?)?;
                        }
                        opt.step()?;
                    }
                    Ok(())
                })?;
                let fused = this_threads_count(&profile, "sgd_foreach");
                let values = params
                    .iter()
                    .map(|p| p.to_dtype(DType::F64)?.to_vec::<f64>())
                    .collect::<Result<_>>()?;
                Ok((values, fused as u64))
            };
            let (gpu_values, fused) = run(&dev)?;
            let (cpu_values, cpu_fused) = run(&Device::Cpu)?;
            assert_eq!(
                (fused, cpu_fused),
                (3, 0),
                "one multi-tensor step each time on the GPU only"
            );
            let tol = if dtype == DType::F32 { 1e-5 } else { 1e-12 };
            for (i, (a, b)) in gpu_values.iter().zip(&cpu_values).enumerate() {
                for (x, y) in a.iter().zip(b) {
                    assert!(
                        (x - y).abs() <= tol * (1.0 + y.abs()),
                        "{dtype} momentum {momentum} nesterov {nesterov}: parameter {i}: {x} against {y}"
                    );
                }
            }
        }
    }
    Ok(())
}

/// Gradient clipping by the 2-norm on a GPU takes the multi-tensor form (each
/// gradient's norm and the scaling in launches of 48 tensors; PyTorch's foreach):
/// against the CPU's one-by-one clipping over 61 gradients of sizes from 1 to
/// past two chunks, clipped (max norm below the total) and not.
#[test]
fn foreach_clipping_matches_the_cpu() -> Result<()> {
    let Some(dev) = gpu("foreach_clipping_matches_the_cpu") else {
        return Ok(());
    };
    let (_turn, _g) = (super::profile_turn(), rng_lock());
    for dtype in [DType::F32, DType::F64] {
        for max_norm in [1.0, 1e6] {
            ember::manual_seed(6);
            let grads = randn_each(&foreach_sizes(60, 733, 2600, 140_000), dtype)?;
            let run = |on: &Device| -> Result<(f64, Vec<Vec<f64>>, usize)> {
                let params: Vec<Tensor> = grads
                    .iter()
                    .map(|g| {
                        let p = g.zeros_like()?.to(on)?.requires_grad_(true)?;
                        p.set_grad(Some(g.to(on)?))?;
                        Ok(p)
                    })
                    .collect::<Result<_>>()?;
                let (total, profile) = ember::profiler::profile(|| {
                    ember::nn::clip_grad_norm_(&params, max_norm, 2.0, false)
                })?;
                let fused = this_threads_count(&profile, "foreach_clip");
                let clipped = params
                    .iter()
                    .map(|p| p.grad().unwrap().to_dtype(DType::F64)?.to_vec::<f64>())
                    .collect::<Result<_>>()?;
                Ok((total.to_dtype(DType::F64)?.item::<f64>()?, clipped, fused))
            };
            let (total, clipped, fused) = run(&dev)?;
            let (cpu_total, cpu_clipped, cpu_fused) = run(&Device::Cpu)?;
            assert_eq!(
                (fused, cpu_fused),
                (1, 0),
                "the multi-tensor form on the GPU only"
            );
            let tol = if dtype == DType::F32 { 1e-5 } else { 1e-12 };
            assert!(
                (total - cpu_total).abs() <= tol * cpu_total,
                "{dtype}: total {total} against {cpu_total}"
            );
            for (i, (a, b)) in clipped.iter().zip(&cpu_clipped).enumerate() {
                for (x, y) in a.iter().zip(b) {
                    assert!(
                        (x - y).abs() <= tol * (1.0 + y.abs()),
                        "{dtype} max_norm {max_norm}: gradient {i}: {x} against {y}"
                    );
                }
            }
        }
    }
    Ok(())
}

/// `count` sizes from 1 to `modulus` (`1 + i·step mod modulus`), then `big`: past
/// the chunks of 65536 elements of the multi-tensor launches.
fn foreach_sizes(count: usize, step: usize, modulus: usize, big: usize) -> Vec<usize> {
    (0..count)
        .map(|i| 1 + (i * step) % modulus)
        .chain([big])
        .collect()
}

/// A standard-normal tensor of each of `sizes`, drawn on the CPU, in `dtype`.
fn randn_each(sizes: &[usize], dtype: DType) -> Result<Vec<Tensor>> {
    sizes
        .iter()
        .map(|&n| Tensor::randn([n], &Device::Cpu)?.to_dtype(dtype))
        .collect()
}

/// Layer and RMS normalisation on a GPU against the CPU, forward and the input's
/// gradient, for rows the kernels keep in registers (up to 8 elements a thread)
/// and rows they read again for each pass (past 2048 elements), f32 and f64.
#[test]
fn normalisation_matches_the_cpu_short_and_long_rows() -> Result<()> {
    let Some(dev) = gpu("normalisation_matches_the_cpu_short_and_long_rows") else {
        return Ok(());
    };
    let _g = rng_lock();
    ember::manual_seed(17);
    for (rows, cols) in [
        (5, 100),
        (4, 1000),
        (3, 2047),
        (3, 2048),
        (2, 2049),
        (2, 9000),
    ] {
        for dtype in [DType::F32, DType::F64] {
            let x = Tensor::randn([rows, cols], &Device::Cpu)?.to_dtype(dtype)?;
            let up = Tensor::randn([rows, cols], &Device::Cpu)?.to_dtype(dtype)?;
            for rms in [false, true] {
                let run = |d: &Device| -> Result<(Vec<f64>, Vec<f64>)> {
                    let x = x.to(d)?.detach().requires_grad_(true)?;
                    let y = if rms {
                        ember::nn::rms_norm(&x, &[cols], None, Some(1e-5))?
                    } else {
                        ember::nn::layer_norm(&x, &[cols], None, None, 1e-5)?
                    };
                    y.mul(&up.to(d)?)?.sum_all()?.backward()?;
                    Ok((vals(&y), vals(&x.grad().expect("a gradient"))))
                };
                let (y_cpu, g_cpu) = run(&Device::Cpu)?;
                let (y_gpu, g_gpu) = run(&dev)?;
                let what = format!("{rows}x{cols} {dtype} rms={rms}");
                let tol = if dtype == DType::F32 { 1e-4 } else { 1e-10 };
                assert_close(&y_gpu, &y_cpu, tol, tol);
                assert_close(&g_gpu, &g_cpu, tol, tol);
                assert!(y_gpu.iter().all(|v| v.is_finite()), "{what}");
            }
        }
    }
    Ok(())
}

/// Batch norm in training over single-element planes (a channels-last
/// `[n, c, h, w]`, a `[n, c]` batch), whose per-channel sums a GPU takes column
/// by column in chunks of rows: against the CPU (the output, the running
/// statistics, the three gradients) for rows across several chunks, channels
/// past a 32-channel tile, a mean far from zero (the sums' shift), and float32,
/// float64 and bfloat16.
#[test]
fn batch_norm_over_channel_columns_matches_the_cpu() -> Result<()> {
    let Some(dev) = gpu("batch_norm_over_channel_columns_matches_the_cpu") else {
        return Ok(());
    };
    // [n, c, h, w] laid out channels-last ([n·h·w, c] rows: 2,312 and 35,
    // one channel a load), a [2100, 40] batch (the affine map and the sums 4
    // or 8 channels a vector), 6,400 rows of 64 channels (16-byte loads, four
    // rows in flight: 800 rows a chunk on the simulator), and fewer rows than
    // a block's 8 row lanes
    let shapes: [&[usize]; 4] = [
        &[8, 35, 17, 17],
        &[2100, 40],
        &[16, 64, 20, 20],
        &[3, 33, 1, 1],
    ];
    for shape in shapes {
        batch_norm_matches_the_cpu(&dev, shape, shape.len() == 4, 0)?;
    }
    Ok(())
}

/// Batch norm in training over planes of many elements (row-major `[n, c, h,
/// w]`): channels whose sums a GPU cuts into chunks added in a second kernel
/// (of 4 to 16 Ki elements: on the simulator's 4 multiprocessors 5, 8 and 4
/// chunks, boundaries inside planes),
/// planes whose sizes let the affine map take vectors of 8 (bf16), 4, 2 and 1
/// elements, inputs that start 1 or 4 elements into their storage (the vectors
/// narrow to what the address allows: to 1, and bf16's 8 to 4), and an empty
/// plane (the output empty, the running statistics kept, as PyTorch's):
/// against the CPU as above.
#[test]
fn batch_norm_over_planes_matches_the_cpu() -> Result<()> {
    let Some(dev) = gpu("batch_norm_over_planes_matches_the_cpu") else {
        return Ok(());
    };
    // 20,000, 34,680 and 16,384 elements a channel (chunks of 4,096, 4,335
    // and 4,096 on the simulator: the first two end inside a plane), the rest
    // a block a channel; planes of 2,500, 1,156, 1,024, 50, 49, 8 and 0
    // elements
    let shapes: [(&[usize], usize); 7] = [
        (&[8, 3, 50, 50], 0),
        (&[30, 2, 34, 34], 1),
        (&[16, 2, 32, 32], 0),
        (&[40, 5, 5, 10], 0),
        (&[9, 3, 7, 7], 0),
        (&[2, 4, 8, 1], 4),
        (&[2, 3, 0, 4], 0),
    ];
    for (shape, skip) in shapes {
        batch_norm_matches_the_cpu(&dev, shape, false, skip)?;
    }
    Ok(())
}

/// Batch norm in training on `dev` against the CPU in float32, float64 and
/// bfloat16 (values of mean 100: the sums' shift), `shape` channels-last or
/// row-major from `skip` elements into its storage (0 for channels-last).
fn batch_norm_matches_the_cpu(
    dev: &Device,
    shape: &[usize],
    channels_last: bool,
    skip: usize,
) -> Result<()> {
    use ember::nn::functional::{batch_norm, BatchNormOptions};
    use ember::MemoryFormat::ChannelsLast;
    let _g = rng_lock();
    ember::manual_seed(23);
    let (c, numel) = (shape[1], shape.iter().product::<usize>());
    for (dtype, tol) in [(DType::F32, 1e-4), (DType::F64, 1e-10), (DType::BF16, 2e-2)] {
        let whole = Tensor::randn([skip + numel], &Device::Cpu)?
            .add(100.0)?
            .to_dtype(dtype)?;
        let w = Tensor::randn([c], &Device::Cpu)?.to_dtype(dtype)?;
        let b = Tensor::randn([c], &Device::Cpu)?.to_dtype(dtype)?;
        let up = Tensor::randn(shape, &Device::Cpu)?.to_dtype(dtype)?;
        let run = |d: &Device| -> Result<Vec<Vec<f64>>> {
            let leaf = |t: &Tensor| t.to(d)?.detach().requires_grad_(true);
            // the leaf: the whole storage, or the channels-last tensor itself
            let (leaf_x, x) = if channels_last {
                let x = leaf(&whole.reshape(shape)?.to_memory_format(ChannelsLast)?)?;
                (x.clone(), x)
            } else {
                let all = leaf(&whole)?;
                let x = all.narrow(0, skip as i64, numel)?.reshape(shape)?;
                (all, x)
            };
            let (w, b) = (leaf(&w)?, leaf(&b)?);
            let mean = Tensor::zeros([c], dtype, d)?;
            let var = Tensor::ones([c], dtype, d)?;
            let opts = BatchNormOptions {
                running_mean: Some(&mean),
                running_var: Some(&var),
                training: true,
                ..Default::default()
            };
            let y = batch_norm(&x, Some(&w), Some(&b), opts)?;
            y.mul(&up.to(d)?)?.sum_all()?.backward()?;
            let g = |t: &Tensor| vals(&t.grad().expect("a gradient"));
            Ok(vec![
                vals(&y),
                vals(&mean),
                vals(&var),
                g(&leaf_x),
                g(&w),
                g(&b),
            ])
        };
        let (want, got) = (run(&Device::Cpu)?, run(dev)?);
        for (g, e) in got.iter().zip(&want) {
            assert_close(g, e, tol, tol);
        }
    }
    Ok(())
}

/// Max and average pooling with overlapping, dilated and padded windows, and a
/// window of more than 256 positions (whose index is int64 rather than one byte),
/// give the CPU's values bit for bit in every float dtype, forward and backward
/// (a GPU pools f16/bf16 in their own dtype; each input element sums its
/// gradient in the order of the outputs, as the CPU does); ties and NaN pick the
/// first position, as PyTorch.
#[test]
fn pooling_matches_the_cpu_in_every_float_dtype() -> Result<()> {
    let Some(dev) = gpu("pooling_matches_the_cpu_in_every_float_dtype") else {
        return Ok(());
    };
    let _g = rng_lock();
    let opts = [
        Pool2dOptions::new(3).stride(2).padding(1),
        Pool2dOptions::rect(2, 3)
            .stride(1)
            .dilation(2)
            .ceil_mode(true),
        Pool2dOptions::new(17).stride(3),
        Pool2dOptions::new(3)
            .stride(2)
            .padding(1)
            .count_include_pad(false),
        Pool2dOptions::new(3).stride(1).padding(1).dilation(2),
    ];
    ember::manual_seed(5);
    // values rounded to quarters: many ties; one NaN
    let base = Tensor::randn([2, 3, 19, 21], &Device::Cpu)?
        .mul(4.0)?
        .round()?
        .div(4.0)?;
    let base = base.ne(1.25)?.where_(&base, f64::NAN)?;
    for dt in [DType::F32, DType::F64, DType::BF16, DType::F16] {
        for (i, o) in opts.iter().enumerate() {
            // average pooling has no dilation (PyTorch's avg_pool2d)
            let kinds: &[bool] = if i == 1 || i == 4 {
                &[true]
            } else {
                &[true, false]
            };
            // row-major and channels-last inputs (the GPU pools the latter as they
            // lie, the CPU in row-major planes)
            for (&max, cl) in kinds.iter().flat_map(|m| [(m, false), (m, true)]) {
                let run = |d: &Device| -> Result<(Tensor, Tensor)> {
                    let mut x = base.to_dtype(dt)?;
                    if cl {
                        x = x.to_memory_format(ember::MemoryFormat::ChannelsLast)?;
                    }
                    let x = x.to_device(d)?.detach().requires_grad_(true)?;
                    let y = if max {
                        x.max_pool2d(*o)?
                    } else {
                        x.avg_pool2d(*o)?
                    };
                    // a gradient with distinct values per output, made on the CPU
                    // for both (a GPU's float64 sine may differ in the last bit)
                    let g = Tensor::arange(0.0f64, y.numel() as f64, &Device::Cpu)?
                        .mul(0.37)?
                        .sin()?
                        .reshape(y.shape())?
                        .to_dtype(dt)?
                        .to_device(d)?;
                    y.backward_with(&g)?;
                    Ok((y.detach(), x.grad().expect("a gradient")))
                };
                let what = format!("{dt} options {i} max {max} channels-last {cl}");
                let (want_y, want_g) = run(&Device::Cpu)?;
                let (y, g) = run(&dev)?;
                assert_eq!(y.stride(), want_y.stride(), "{what}: output's strides");
                assert_eq!(g.stride(), want_g.stride(), "{what}: gradient's strides");
                assert_eq!(bits(&y)?, bits(&want_y)?, "{what}: output");
                assert_eq!(bits(&g)?, bits(&want_g)?, "{what}: gradient");
            }
        }
    }
    Ok(())
}

/// Layer norm's affine part fused into the normalisation on a GPU against the
/// CPU: the output and the gradients of the input, the weight and the bias, for
/// rows in one chunk and in several (the weight and bias gradients are summed in
/// chunks of rows, then the chunks in order), rows cached in registers and not,
/// and each combination of operands that need a gradient (a frozen input, a
/// frozen weight).
#[test]
fn layer_norm_affine_matches_the_cpu() -> Result<()> {
    let Some(dev) = gpu("layer_norm_affine_matches_the_cpu") else {
        return Ok(());
    };
    let _g = rng_lock();
    ember::manual_seed(23);
    for (rows, cols) in [(3, 40), (200, 100), (70, 2049), (1, 1)] {
        for dtype in [DType::F32, DType::F64] {
            let rand = |s: &[usize]| Tensor::randn(s, &Device::Cpu)?.to_dtype(dtype);
            let (x, up) = (rand(&[rows, cols])?, rand(&[rows, cols])?);
            let (w, b) = (rand(&[cols])?, rand(&[cols])?);
            for need in [
                (true, true, true),
                (false, true, true),
                (true, false, true),
                (true, true, false),
            ] {
                let run = |d: &Device| -> Result<Vec<Vec<f64>>> {
                    let leaf = |t: &Tensor, g: bool| t.to(d)?.detach().requires_grad_(g);
                    let (x, w, b) = (leaf(&x, need.0)?, leaf(&w, need.1)?, leaf(&b, need.2)?);
                    let y = ember::nn::layer_norm(&x, &[cols], Some(&w), Some(&b), 1e-5)?;
                    y.mul(&up.to(d)?)?.sum_all()?.backward()?;
                    let mut out = vec![vals(&y)];
                    for (t, g) in [(&x, need.0), (&w, need.1), (&b, need.2)] {
                        match t.grad() {
                            Some(gr) => out.push(vals(&gr)),
                            None => assert!(!g, "a gradient missing"),
                        }
                    }
                    Ok(out)
                };
                let (cpu, gpu) = (run(&Device::Cpu)?, run(&dev)?);
                let what = format!("{rows}x{cols} {dtype} need {need:?}");
                assert_eq!(cpu.len(), gpu.len(), "{what}");
                let tol = if dtype == DType::F32 { 2e-4 } else { 1e-10 };
                for (c, g) in cpu.iter().zip(&gpu) {
                    assert_close(g, c, tol, tol);
                }
            }
        }
    }
    Ok(())
}

/// A layer norm whose weight or bias is on another GPU than its input is
/// refused with PyTorch's device-mismatch error, forward and before any kernel
/// runs, as a primitive with operands on two GPUs is (a kernel reads one GPU's
/// memory). Needs two GPUs: run with `EMBER_CUDA_SIMULATOR=2` where there are
/// none (CI's simulator passes have one, and this test says it skipped there).
#[test]
fn layer_norm_refuses_parameters_on_another_gpu() -> Result<()> {
    let _rng = super::rng_lock();
    let Some(dev) = super::gpu_unless("layer_norm_refuses_parameters_on_another_gpu", || {
        (ember::cuda::device_count() < 2).then(|| "needs two GPUs".to_string())
    }) else {
        return Ok(());
    };
    let x = Tensor::randn([4, 8], &dev)?;
    let (w, b) = (
        Tensor::ones([8], DType::F32, &dev)?,
        Tensor::zeros([8], DType::F32, &dev)?,
    );
    let other = Device::Cuda(1);
    for (w, b) in [(w.to(&other)?, b.clone()), (w.clone(), b.to(&other)?)] {
        let err = match ember::nn::layer_norm(&x, &[8], Some(&w), Some(&b), 1e-5) {
            Ok(_) => panic!("parameters on another GPU were taken"),
            Err(e) => e,
        };
        assert!(
            matches!(err, Error::DeviceMismatch { a, b, .. } if a == dev && b == other),
            "{err}"
        );
    }
    // and on one GPU it runs
    ember::nn::layer_norm(&x, &[8], Some(&w), Some(&b), 1e-5)?;
    Ok(())
}

/// Casts on a GPU against the CPU, between every pair of dtypes, from
/// contiguous sources of lengths around the vector width that start at offsets
/// 0 to 3 (aligned: 16-byte steps and a tail; unaligned: element by element)
/// and from a transposed (strided) source.
#[test]
fn casts_match_the_cpu_at_every_alignment() -> Result<()> {
    let Some(dev) = gpu("casts_match_the_cpu_at_every_alignment") else {
        return Ok(());
    };
    let _g = rng_lock();
    ember::manual_seed(23);
    let all = DType::ALL;
    let base = Tensor::randn([80], &Device::Cpu)?.mul(40.0)?;
    for &from in &all {
        let src_cpu = base.to_dtype(from)?;
        let src_gpu = src_cpu.to(&dev)?;
        for &to in &all {
            for (start, len) in [(0, 37), (1, 36), (2, 17), (3, 8), (0, 64), (5, 1)] {
                let want = src_cpu.narrow(0, start, len)?.to_dtype(to)?;
                let got = src_gpu.narrow(0, start, len)?.to_dtype(to)?;
                assert_eq!(
                    vals(&got),
                    vals(&want),
                    "{from} -> {to}, {len} elements from {start}"
                );
            }
            let t_cpu = src_cpu.reshape([8, 10])?.t()?;
            let t_gpu = src_gpu.reshape([8, 10])?.t()?;
            assert_eq!(
                vals(&t_gpu.to_dtype(to)?),
                vals(&t_cpu.to_dtype(to)?),
                "{from} -> {to}, transposed"
            );
        }
    }
    Ok(())
}
