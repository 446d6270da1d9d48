//! The lessons' CPU-versus-GPU timing: the same matrix product on each device,
//! warmed up first, timed over several runs (median), with the GPU's queued work
//! finished before the clock is read (reading the result back to the host waits
//! for it).
//!
//! Run: `cargo run --release -p ember --example cpu_vs_gpu`

use ember::prelude::*;
use std::time::Instant;

fn median_secs(mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..3 {
        f()?; // warm-up: first-use costs (kernel compilation, allocation) stay out
    }
    let mut t = Vec::new();
    for _ in 0..10 {
        let start = Instant::now();
        f()?;
        t.push(start.elapsed().as_secs_f64());
    }
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

fn main() -> Result<()> {
    let n = 1024;
    let mut devices = vec![Device::Cpu];
    if ember::cuda::is_available() {
        devices.push(Device::Cuda(0));
        if ember::cuda::is_simulated() {
            println!(
                "note: cuda:0 is ember's CUDA simulator (EMBER_CUDA_SIMULATOR): its times are \
                 CPU emulation and say nothing of a GPU's speed"
            );
        }
    } else {
        println!(
            "no GPU ({}): timing the CPU only",
            ember::cuda::unavailable_reason().unwrap_or_default()
        );
    }
    for dev in devices {
        ember::manual_seed(0);
        let a = Tensor::randn([n, n], &dev)?;
        let b = Tensor::randn([n, n], &dev)?;
        let secs = median_secs(|| {
            let c = a.matmul(&b)?;
            // one element back to the host: waits until the product is done
            c.i((0, 0))?.item::<f32>()?;
            Ok(())
        })?;
        let gflops = 2.0 * (n as f64).powi(3) / secs / 1e9;
        println!(
            "{dev}: {n}x{n} matmul in {:.3} ms ({gflops:.0} GFLOP/s)",
            secs * 1e3
        );
    }
    Ok(())
}
