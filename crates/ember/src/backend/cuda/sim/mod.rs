//! ember's CUDA simulator: `cuda:N` devices that run on the CPU, for testing GPU
//! code on machines without a GPU (what `NUMBA_ENABLE_CUDASIM` is to numba.cuda).
//!
//! Set `EMBER_CUDA_SIMULATOR=1` (or `=N` for N devices) and every CUDA code path of
//! ember runs: the caching allocator, the kernels (the same `.cu` sources, compiled
//! at first use by the host's C++ compiler instead of NVRTC, with
//! [`prelude.h`](prelude.h) standing in for the CUDA runtime), the launch
//! parameters built by `ops/`, user kernels from [`Kernel`](crate::kernel::Kernel),
//! matrix products through a reference GEMM that follows cuBLAS's column-major
//! contract, argument checks included, and convolutions through a reference that
//! follows cuDNN's (when `ember::cuda::cudnn` is switched on).
//!
//! What it checks: the logic of kernels and of the host code that drives them
//! (indexing, layouts passed by value, reductions across warps and blocks, launch
//! configurations, the row-/column-major mapping of GEMM calls), and the host's
//! side of asynchronous execution: each stream of a simulated GPU runs on a thread
//! of its own ([`queue`]), and only when something waits for its work, so a read
//! before a wait, a pinned buffer reused while its copy is queued, an event
//! trusted too early, a stream that uses another's results without waiting for
//! them, or a block reused while another stream still reads it (no
//! `record_stream`) shows up as wrong values.
//! What it does not: timing, concurrency between threads of a block (they run one
//! at a time, so atomics and races behave), work of two streams running at the
//! same time (one job runs at a time, so a race between streams shows only as the
//! order the waits choose), the GPU's floating-point details (fast-math, fused
//! multiply-adds), or the driver's other behaviour. Results that pass here still have to be confirmed on
//! a GPU.
//!
//! Environment: `EMBER_SIM_CXX` (the compiler, default `c++`), `EMBER_SIM_MEMORY_MB`
//! (device memory per simulated GPU, default 4096), `EMBER_SIM_SANITIZE=address`
//! (kernels built with the compiler's AddressSanitizer: with
//! `EMBER_CUDA_NO_CACHING=1` and the sanitizer's runtime preloaded, a kernel that
//! reads or writes outside a tensor, or outside its shared memory, stops the process
//! with a report, like compute-sanitizer's memcheck; `.ci/memcheck` runs the tests
//! this way), `EMBER_SIM_ORDER=reverse` (blocks, and threads between barriers, run
//! last to first, which fails kernels that depend on their order). Compiled
//! modules are cached next to NVRTC's cubins.

mod compile;
mod dnn;
mod gemm;
mod launch;
mod memory;
mod queue;
mod runtime;
mod sdpa;

pub(crate) use compile::compile;
#[cfg(test)]
use compile::compiler;
pub(crate) use dnn::conv_job;
pub(crate) use gemm::gemm_job;
pub(crate) use launch::{SimFunc, SimModule};
#[cfg(test)]
pub(crate) use memory::memory_checker_active;
pub(crate) use memory::{check_region, memcpy, SimMemory};
pub(crate) use runtime::SimSystem;

/// Work queued on a simulated GPU, run later by its stream's thread.
pub(crate) type Job = Box<dyn FnOnce() -> Result<()> + Send>;

/// Work that can run again (a launch, a library call, a device copy): what a
/// graph captures and replays.
pub(crate) type Work = Arc<dyn Fn() -> Result<()> + Send + Sync>;

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// The runtime the simulated kernels are compiled against.
const PRELUDE: &str = include_str!("prelude.h");

/// The number of simulated GPUs asked for by `EMBER_CUDA_SIMULATOR`, if any.
pub(crate) fn enabled() -> Option<usize> {
    static N: OnceLock<Option<usize>> = OnceLock::new();
    *N.get_or_init(|| {
        let v = std::env::var("EMBER_CUDA_SIMULATOR").ok()?;
        match v.trim() {
            "" | "0" => None,
            s => Some(s.parse::<usize>().unwrap_or(1).clamp(1, 16)),
        }
    })
}

/// Bytes of device memory each simulated GPU has.
fn capacity() -> usize {
    std::env::var("EMBER_SIM_MEMORY_MB")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(4096)
        << 20
}

/// The shared memory a simulated block may use once its kernel opts in: an H100's
/// 227 KiB.
pub(crate) const SIM_SHARED_OPTIN: usize = 227 << 10;

/// A block's threads without `__launch_bounds__`: every GPU's limit.
const SIM_MAX_THREADS: u32 = 1024;

/// What a simulated GPU reports as its properties.
pub(crate) fn properties(ordinal: usize) -> crate::backend::cuda::runtime::DeviceProperties {
    crate::backend::cuda::runtime::DeviceProperties {
        ordinal,
        name: "ember CUDA simulator (runs on the CPU)".into(),
        compute_capability: (9, 0),
        multiprocessor_count: 4,
        max_threads_per_block: 1024,
        max_shared_memory_per_block: 48 << 10,
        // Hopper's opt-in limit (the simulator's dynamic shared buffer holds it)
        max_shared_memory_per_block_optin: SIM_SHARED_OPTIN,
        warp_size: 32,
        total_memory: capacity(),
        l2_cache_size: 0,
        clock_rate_khz: 0,
        memory_bus_width_bits: 0,
    }
}

/// Every launch and copy of every simulated GPU runs under this lock: a device
/// executes one thing at a time, in the order it was queued, like a stream.
fn exec_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Compiles `src` for the simulator, or `None` (saying why) without a compiler.
    fn compiled(name: &str, src: &str) -> Option<Arc<SimModule>> {
        if let Err(e) = compiler() {
            eprintln!("skipped: {e}");
            return None;
        }
        Some(compile(name, src, &[]).unwrap())
    }

    /// A block-wide tree reduction in dynamic shared memory, with a barrier per
    /// level, over several blocks: what the fibers exist for.
    #[test]
    fn barriers_and_shared_memory_reduce_like_a_gpu() {
        let src = r#"
extern "C" __global__ void block_sums(const float* x, float* out, int n) {
    extern __shared__ float part[];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    part[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = part[0];
}
extern "C" __global__ void warp_sums(const int* x, int* out) {
    int v = x[threadIdx.x];
    for (int d = 16; d > 0; d >>= 1) v += __shfl_down_sync(0xffffffffu, v, d);
    if (threadIdx.x % 32 == 0) out[threadIdx.x / 32] = v;
}"#;
        let Some(m) = compiled("sim_test_reduce", src) else {
            return;
        };
        let n = 1000i32;
        let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let mut out = vec![0f32; 4];
        let (px, po) = (x.as_ptr() as u64, out.as_mut_ptr() as u64);
        let f = m.function("block_sums").unwrap();
        let mut p = [
            &px as *const _ as *mut c_void,
            &po as *const _ as *mut c_void,
            &n as *const _ as *mut c_void,
        ];
        unsafe { f.launch((4, 1, 1), (256, 1, 1), 256 * 4, &mut p) }.unwrap();
        let want: Vec<f32> = (0..4)
            .map(|b| ((b * 256)..((b + 1) * 256).min(1000)).sum::<i32>() as f32)
            .collect();
        assert_eq!(out, want);

        let xi: Vec<i32> = (0..64).collect();
        let mut oi = vec![0i32; 2];
        let (pxi, poi) = (xi.as_ptr() as u64, oi.as_mut_ptr() as u64);
        let g = m.function("warp_sums").unwrap();
        let mut p = [
            &pxi as *const _ as *mut c_void,
            &poi as *const _ as *mut c_void,
        ];
        unsafe { g.launch((1, 1, 1), (64, 1, 1), 0, &mut p) }.unwrap();
        assert_eq!(oi, [(0..32).sum::<i32>(), (32..64).sum::<i32>()]);
    }

    /// A barrier that only some threads reach hangs a GPU; the simulator says so.
    #[test]
    fn a_divergent_barrier_is_reported_not_hung() {
        let src = r#"
extern "C" __global__ void bad(int* x) {
    if (threadIdx.x < 16) __syncthreads();
    else x[threadIdx.x] = __shfl_down_sync(0xffffffffu, x[threadIdx.x], 1);
}"#;
        let Some(m) = compiled("sim_test_deadlock", src) else {
            return;
        };
        let mut x = vec![0i32; 32];
        let px = x.as_mut_ptr() as u64;
        let mut p = [&px as *const _ as *mut c_void];
        let f = m.function("bad").unwrap();
        let e = unsafe { f.launch((1, 1, 1), (32, 1, 1), 0, &mut p) }
            .unwrap_err()
            .to_string();
        assert!(e.contains("deadlock"), "{e}");
    }

    #[test]
    fn compile_errors_carry_the_compilers_log() {
        if compiler().is_err() {
            eprintln!("skipped: no C++ compiler");
            return;
        }
        let src = "extern \"C\" __global__ void k(float* x) {\n  x[0] = undefined_thing;\n}\n";
        match compile("sim_broken", src, &[]) {
            Err(Error::KernelCompile { name, log, .. }) => {
                assert_eq!(name, "sim_broken");
                assert!(
                    log.contains("sim_broken.cu:2") && log.contains("undefined_thing"),
                    "{log}"
                );
            }
            Err(e) => panic!("expected a compile error, got {e}"),
            Ok(_) => panic!("a broken kernel compiled"),
        }
        let m = compile(
            "sim_ok",
            "extern \"C\" __global__ void k(float* x) { x[0] = 1.0f; }",
            &[],
        )
        .unwrap();
        let e = m.function("nope").err().unwrap().to_string();
        assert!(e.contains("nope"), "{e}");
    }

    #[test]
    fn memory_is_bounded_and_poisoned() {
        let mut mem = SimMemory::new();
        let cap = mem.mem_info().1;
        assert_eq!(mem.malloc(cap + 1), Err(true));
        let p = mem.malloc(16).unwrap();
        assert_eq!(p % 256, 0);
        // fresh memory reads as NaN, not as zeros
        assert!(unsafe { *(p as *const f32) }.is_nan());
        assert_eq!(mem.mem_info().0, cap - 16);
        mem.free(p);
        assert_eq!(mem.mem_info().0, cap);
    }
}
