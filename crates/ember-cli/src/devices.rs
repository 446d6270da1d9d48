//! `ember devices`.

use ember::{cuda, Device};

pub fn run() -> ember::Result<()> {
    let cpu = ember::cpu::cpu_info();
    let threads = match (cpu.threads, cpu.caller_in_pool) {
        (1, _) => "1 worker thread".to_string(),
        (n, true) => format!("{n} worker threads, the main thread one of them"),
        (n, false) => format!("{n} worker threads"),
    };
    println!(
        "cpu: {} ({} logical cores, {threads})",
        cpu.model, cpu.logical_cores
    );
    match cuda::unavailable_reason() {
        Some(reason) => println!("cuda: not available: {reason}"),
        None => {
            if cuda::is_simulated() {
                println!(
                    "cuda: simulated on the CPU (EMBER_CUDA_SIMULATOR is set): ember's GPU code \
                     runs and its results are checked, but nothing here is a GPU"
                );
            }
            if let Some((major, minor)) = cuda::driver_version() {
                println!("cuda: driver for CUDA {major}.{minor}");
            }
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
                let (free, total) = cuda::mem_get_info(&Device::Cuda(i))?;
                println!(
                    "  memory: {:.1} GiB free of {:.1} GiB",
                    free as f64 / (1u64 << 30) as f64,
                    total as f64 / (1u64 << 30) as f64
                );
            }
        }
    }
    println!("cuda libraries:");
    for lib in cuda::CudaLib::ALL {
        let optional = lib.is_optional();
        match cuda::find_library(lib) {
            Ok(src) if lib == cuda::CudaLib::Cudnn => match cuda::cudnn::version() {
                Some(v) => println!("  {}: {src} (version {v})", lib.name()),
                None => println!(
                    "  {}: {src}, unusable: {}",
                    lib.name(),
                    cuda::cudnn::unavailable_reason().unwrap_or_default()
                ),
            },
            Ok(src) => match cuda::library_version(lib) {
                Some(v) => println!("  {}: {src} (version {v})", lib.name()),
                None => println!("  {}: {src}", lib.name()),
            },
            Err(why) if optional => println!("  {}: not found (optional): {why}", lib.name()),
            Err(why) => println!("  {}: not found: {why}", lib.name()),
        }
    }
    let state = match (cuda::cudnn::enabled(), cuda::cudnn::in_use()) {
        (_, true) => "on",
        (true, false) => "switched on, but cuDNN is not available",
        (false, _) => "off",
    };
    println!(
        "  convolutions through cuDNN: {state} (on by default where cuDNN is found; EMBER_CUDNN=0 \
         or ember::cuda::cudnn::set_enabled(false) sends them to ember's own im2col path)"
    );
    if cuda::cudnn::in_use() {
        println!(
            "  cuDNN's settings: {} (EMBER_CUDNN_TF32, EMBER_CUDNN_BENCHMARK, \
             EMBER_CUDNN_DETERMINISTIC or ember::cuda::cudnn's setters change them)",
            cudnn_settings()
        );
    }
    match cuda::include_dirs().first() {
        Some(d) => println!("  headers (cuda_fp16.h): {}", d.display()),
        None => println!(
            "  headers (cuda_fp16.h): not found (only user kernels that include them need them)"
        ),
    }
    println!("best available device: {}", Device::cuda_if_available(0));
    Ok(())
}

/// cuDNN's switches that change a convolution's speed or bits, as the header of a
/// benchmark and `ember devices` print them: TF32 math for float32, algorithms
/// timed or from the heuristic (benchmark rows that set it themselves say so in
/// their names), deterministic algorithms only.
pub(crate) fn cudnn_settings() -> String {
    let mut s = vec![
        if cuda::cudnn::allow_tf32() {
            "float32 in TF32"
        } else {
            "float32 exact (TF32 off)"
        },
        if cuda::cudnn::benchmark() {
            "timed algorithms"
        } else {
            "heuristic algorithms"
        },
    ];
    if cuda::cudnn::deterministic() {
        s.push("deterministic only");
    }
    s.join(", ")
}
