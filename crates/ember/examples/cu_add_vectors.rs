//! The lessons' hand-written vector-add kernel: `c[i] = a[i] + b[i]` for N = 100000,
//! launched with `ceil(N / 1024)` blocks of 1024 threads, checked against the CPU,
//! and timed (device events, warm-up, median) against the CPU and against ember's
//! built-in `add`.
//!
//! Run: `cargo run --release -p ember --example cu_add_vectors` (needs a GPU; without one it
//! says so and exits).

use ember::kernel::{Arg, Kernel, LaunchConfig};
use ember::prelude::*;
use std::time::Instant;

/// The kernel, CUDA C compiled by NVRTC at run time (no nvcc, no build script).
const SRC: &str = include_str!("kernels/cu_add_vectors.cu");

/// Median GPU milliseconds per call of `f` over 50 calls, after 5 warm-up calls.
fn gpu_ms(dev: &Device, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..5 {
        f()?;
    }
    let mut t = Vec::new();
    for _ in 0..50 {
        let start = ember::cuda::Event::record(dev)?;
        f()?;
        let end = ember::cuda::Event::record(dev)?;
        t.push(start.elapsed_ms(&end)? as f64);
    }
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

fn cpu_ms(mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..5 {
        f()?;
    }
    let mut t = Vec::new();
    for _ in 0..50 {
        let s = Instant::now();
        f()?;
        t.push(s.elapsed().as_secs_f64() * 1e3);
    }
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

fn main() -> Result<()> {
    if let Some(why) = ember::cuda::unavailable_reason() {
        println!("this example needs a GPU: {why}");
        return Ok(());
    }
    if ember::cuda::is_simulated() {
        println!(
            "note: cuda:0 is ember's CUDA simulator (EMBER_CUDA_SIMULATOR): results are \
             checked, but its times are CPU emulation and say nothing of a GPU's speed"
        );
    }
    let dev = Device::Cuda(0);
    let n = 100_000;
    ember::manual_seed(0);
    let a_cpu = Tensor::rand([n], &Device::Cpu)?;
    let b_cpu = Tensor::rand([n], &Device::Cpu)?;
    // data goes to the device once
    let (a, b) = (a_cpu.to(&dev)?, b_cpu.to(&dev)?);
    let c = Tensor::zeros([n], DType::F32, &dev)?;

    let kernel = Kernel::compile(SRC, "cu_add_vectors", &dev)?;
    let config = LaunchConfig::for_elements(n, 1024);
    println!("grid {:?}, block {:?}", config.grid, config.block);
    let args = [
        Arg::input(&a, DType::F32),
        Arg::input(&b, DType::F32),
        Arg::output(&c, DType::F32),
        Arg::I32(n as i32),
    ];
    kernel.launch(config, &args)?;
    let want = a_cpu.add(&b_cpu)?;
    c.cpu()?.assert_close(&want, 1e-6, 1e-6)?;
    println!("kernel result matches the CPU (allclose, rtol 1e-6)");

    let k_ms = gpu_ms(&dev, || kernel.launch(config, &args))?;
    let add_ms = gpu_ms(&dev, || a.add(&b).map(drop))?;
    let cpu = cpu_ms(|| a_cpu.add(&b_cpu).map(drop))?;
    println!("hand-written kernel : {:.4} ms (GPU time, events)", k_ms);
    println!("ember add on the GPU: {:.4} ms", add_ms);
    println!("ember add on the CPU: {:.4} ms", cpu);
    let speedup = cpu / k_ms;
    println!("the kernel ran {speedup:.1}x as fast as the CPU's add");
    if speedup < 3.0 {
        println!(
            "{n} additions are too little work to keep a GPU busy: most of the kernel's time is \
             its launch, so it gains little over the CPU here (the lessons saw the same against \
             NumPy)"
        );
    }
    Ok(())
}
