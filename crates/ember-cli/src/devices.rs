//! `ember devices`.

use ember::{cuda, Device};

pub fn run() -> ember::Result<()> {
    let cpu = ember::cpu::cpu_info();
    println!(
        "cpu: {} ({} logical cores, {} worker threads)",
        cpu.model, cpu.logical_cores, cpu.threads
    );
    match cuda::unavailable_reason() {
        Some(reason) => println!("cuda: not available: {reason}"),
        None => {
            for i in 0..cuda::device_count() {
                let p = cuda::device_properties(i)?;
                println!(
                    "{}: {} (compute capability {}.{}, {} multiprocessors, {:.1} GiB, L2 {} MiB, max {} threads/block)",
                    Device::Cuda(i),
                    p.name,
                    p.compute_capability.0,
                    p.compute_capability.1,
                    p.multiprocessor_count,
                    p.total_memory as f64 / (1u64 << 30) as f64,
                    p.l2_cache_size >> 20,
                    p.max_threads_per_block,
                );
            }
        }
    }
    println!("best available device: {}", Device::cuda_if_available(0));
    Ok(())
}
