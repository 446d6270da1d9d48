//! The lessons' hand-written matrix-vector kernel: y = M·x for a 100000×100 matrix,
//! one thread per row, checked against the CPU and timed against the CPU and
//! ember's built-in `matmul` (cuBLAS).
//!
//! Run: `cargo run --release -p ember --example cu_mv_product` (needs a GPU; without one it
//! says so and exits).

use ember::kernel::{Arg, Kernel, LaunchConfig};
use ember::prelude::*;
use std::time::Instant;

/// The kernel, CUDA C compiled by NVRTC at run time (no nvcc, no build script).
const SRC: &str = include_str!("kernels/cu_mv_product.cu");

fn median(mut t: Vec<f64>) -> f64 {
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
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
    let (rows, cols) = (100_000, 100);
    ember::manual_seed(0);
    let m_cpu = Tensor::randn([rows, cols], &Device::Cpu)?;
    let x_cpu = Tensor::randn([cols], &Device::Cpu)?;
    let (m, x) = (m_cpu.to(&dev)?, x_cpu.to(&dev)?);
    let y = Tensor::zeros([rows], DType::F32, &dev)?;

    let kernel = Kernel::compile(SRC, "cu_mv_product", &dev)?;
    let config = LaunchConfig::for_elements(rows, 256);
    let args = [
        Arg::input(&m, DType::F32),
        Arg::input(&x, DType::F32),
        Arg::output(&y, DType::F32),
        Arg::I32(rows as i32),
        Arg::I32(cols as i32),
    ];
    kernel.launch(config, &args)?;
    let want = m_cpu.matmul(&x_cpu)?;
    y.cpu()?.assert_close(&want, 1e-4, 1e-4)?;
    println!("kernel result matches the CPU (allclose, rtol 1e-4)");

    let time_gpu = |f: &dyn Fn() -> Result<()>| -> Result<f64> {
        for _ in 0..5 {
            f()?;
        }
        let mut t = Vec::new();
        for _ in 0..50 {
            let s = ember::cuda::Event::record(&dev)?;
            f()?;
            let e = ember::cuda::Event::record(&dev)?;
            t.push(s.elapsed_ms(&e)? as f64);
        }
        Ok(median(t))
    };
    let k_ms = time_gpu(&|| kernel.launch(config, &args))?;
    let mm_ms = time_gpu(&|| m.matmul(&x).map(drop))?;
    let mut t = Vec::new();
    for _ in 0..20 {
        let s = Instant::now();
        m_cpu.matmul(&x_cpu)?;
        t.push(s.elapsed().as_secs_f64() * 1e3);
    }
    let cpu_ms = median(t);
    let bytes = (rows * cols * 4) as f64;
    for (what, ms) in [
        ("hand-written kernel", k_ms),
        ("ember matmul (cuBLAS)", mm_ms),
        ("ember matmul on the CPU", cpu_ms),
    ] {
        println!(
            "{what:<24}: {ms:.4} ms ({:.0} GB/s of matrix read)",
            bytes / ms / 1e6
        );
    }
    Ok(())
}
