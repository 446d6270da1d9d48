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

mod dnn;
mod gemm;
mod queue;
mod runtime;

pub(crate) use dnn::conv_job;
pub(crate) use gemm::gemm_job;
pub(crate) use runtime::SimSystem;

/// Work queued on a simulated GPU, run later by its stream's thread.
pub(crate) type Job = Box<dyn FnOnce() -> Result<()> + Send>;

/// Work that can run again (a launch, a library call, a device copy): what a
/// graph captures and replays.
pub(crate) type Work = Arc<dyn Fn() -> Result<()> + Send + Sync>;

use crate::{Error, Result};
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

// ---------------------------------------------------------------------------------
// Memory

/// A simulated GPU's memory: host allocations (aligned like cudaMalloc's) counted
/// against the device's capacity. New memory is filled with 0xFF bytes, so a kernel
/// that reads what nothing wrote sees NaNs and -1s rather than zeros.
pub(crate) struct SimMemory {
    live: HashMap<u64, std::alloc::Layout>,
    used: usize,
    capacity: usize,
}

impl SimMemory {
    pub fn new() -> SimMemory {
        SimMemory {
            live: HashMap::new(),
            used: 0,
            capacity: capacity(),
        }
    }

    /// A new allocation, or `Err(true)` when it does not fit in the device.
    pub fn malloc(&mut self, bytes: usize) -> std::result::Result<u64, bool> {
        if bytes > self.capacity - self.used {
            return Err(true);
        }
        let layout = std::alloc::Layout::from_size_align(bytes.max(1), 256).map_err(|_| true)?;
        // SAFETY: a non-zero size with a valid alignment.
        let p = unsafe { std::alloc::alloc(layout) };
        if p.is_null() {
            return Err(true);
        }
        // SAFETY: `p` holds `layout.size()` bytes.
        unsafe { std::ptr::write_bytes(p, 0xff, layout.size()) };
        self.used += bytes;
        self.live.insert(p as u64, layout);
        Ok(p as u64)
    }

    pub fn free(&mut self, ptr: u64) {
        if let Some(layout) = self.live.remove(&ptr) {
            self.used -= layout.size().min(self.used);
            // SAFETY: allocated above with this layout and not freed before.
            unsafe { std::alloc::dealloc(ptr as *mut u8, layout) };
        }
    }

    pub fn mem_info(&self) -> (usize, usize) {
        (self.capacity - self.used, self.capacity)
    }
}

type Poisoned = unsafe extern "C" fn(*const c_void, usize) -> *const c_void;

/// The sanitizer's `__asan_region_is_poisoned`, when its runtime is loaded.
fn region_checker() -> Option<Poisoned> {
    static CHECK: OnceLock<Option<Poisoned>> = OnceLock::new();
    *CHECK.get_or_init(|| {
        let this = libloading::os::unix::Library::this();
        // SAFETY: the sanitizer's documented interface function, when present.
        unsafe { this.get::<Poisoned>(b"__asan_region_is_poisoned\0") }
            .ok()
            .map(|f| *f)
    })
}

/// Whether memory checks run (the sanitizer's runtime is loaded, as under
/// `.ci/memcheck`).
#[cfg(test)]
pub(crate) fn memory_checker_active() -> bool {
    region_checker().is_some()
}

/// With the sanitizer's runtime loaded (`.ci/memcheck`): an error when any of the
/// bytes `[addr, addr + len)` lies outside live memory. The kernels are checked by
/// the sanitizer itself; this gives the same check to the simulator's own cuBLAS and
/// cuDNN (Rust code the sanitizer does not see), so an operand that a wrong leading
/// dimension or batch stride stretches past its tensor is reported. Without the
/// runtime it checks nothing.
pub(crate) fn check_region(op: &'static str, what: &str, addr: u64, len: u64) -> Result<()> {
    let Some(check) = region_checker() else {
        return Ok(());
    };
    if len == 0 {
        return Ok(());
    }
    // SAFETY: the function only reads the sanitizer's shadow memory for the range.
    let bad = unsafe { check(addr as *const c_void, len as usize) };
    if bad.is_null() {
        return Ok(());
    }
    Err(Error::Cuda {
        op,
        msg: format!(
            "simulator memory check: {what} spans bytes {addr:#x}..{:#x}, and {:#x} is \
             outside live memory (past its tensor, or freed)",
            addr + len,
            bad as u64
        ),
    })
}

/// Copies `bytes` between two simulated-device or host addresses.
///
/// # Safety
/// Both ranges must be valid for `bytes` bytes (device ranges lie in live blocks).
pub(crate) unsafe fn memcpy(dst: u64, src: u64, bytes: usize) {
    let _g = exec_lock();
    // device ranges of different tensors never overlap; one copy within a tensor may
    std::ptr::copy(src as *const u8, dst as *mut u8, bytes);
}

// ---------------------------------------------------------------------------------
// Compiling and launching

/// The launch configuration handed to a module's entry (mirrors `ember_sim::Launch`
/// in prelude.h).
#[repr(C)]
struct SimLaunch {
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem: u32,
    fibers: i32,
}

type Entry = unsafe extern "C" fn(*mut *mut c_void, *const SimLaunch) -> i32;
type ParamsFn = unsafe extern "C" fn(*mut u64, i32) -> i32;
type ErrorFn = unsafe extern "C" fn() -> *const c_char;

/// A loaded kernel of a simulated module.
#[derive(Clone)]
pub(crate) struct SimFunc {
    entry: Entry,
    error: ErrorFn,
    /// The byte sizes of the kernel's parameters, read from the module once.
    params: Arc<[usize]>,
    /// The module waits at barriers (`__syncthreads`, warp shuffles): its threads
    /// need fibers.
    fibers: bool,
    /// The most threads a block may have: the first value of the kernel's
    /// `__launch_bounds__`, which is what a GPU's compiler also caps it at
    /// (register use has no meaning here).
    pub(crate) max_threads: u32,
    /// The dynamic shared memory a launch may ask for: 48 KiB until the kernel
    /// opts in to more (`cuFuncSetAttribute`), as on a GPU.
    dyn_limit: Arc<std::sync::atomic::AtomicU32>,
}

/// The byte sizes of a kernel's parameters, in order, from its module's table.
///
/// # Safety
/// `f` is a module's `__ember_sim_params_<name>` (prelude.h).
unsafe fn param_sizes(f: ParamsFn) -> Vec<usize> {
    let mut out = vec![0u64; 64];
    // `f` writes at most `cap` entries and returns the count
    let n = f(out.as_mut_ptr(), out.len() as i32).max(0) as usize;
    if n > out.len() {
        out = vec![0u64; n];
        f(out.as_mut_ptr(), n as i32);
    }
    out.truncate(n);
    out.into_iter().map(|s| s as usize).collect()
}

impl SimFunc {
    /// The byte sizes of the kernel's parameters, in order.
    pub(crate) fn param_sizes(&self) -> Vec<usize> {
        self.params.to_vec()
    }

    /// Raises the dynamic shared memory a launch may ask for, refusing what a GPU
    /// with the simulator's properties refuses.
    pub(crate) fn set_max_dynamic_shared(&self, bytes: u32) -> Result<()> {
        if bytes as usize > SIM_SHARED_OPTIN {
            return Err(Error::Cuda {
                op: "cuFuncSetAttribute",
                msg: format!(
                    "CUDA_ERROR_INVALID_VALUE: {bytes} bytes of dynamic shared memory exceed \
                     the device's opt-in limit of {SIM_SHARED_OPTIN}"
                ),
            });
        }
        self.dyn_limit
            .store(bytes, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Refuses a block larger than the kernel's `__launch_bounds__`, or more
    /// dynamic shared memory than the kernel was allowed, as the driver refuses
    /// such a launch (at the call, not when it runs).
    pub(crate) fn check_launch(&self, block: (u32, u32, u32), shared_mem: u32) -> Result<()> {
        let threads = block.0 as u64 * block.1 as u64 * block.2 as u64;
        let refuse = |msg: String| {
            Err(Error::Cuda {
                op: "cuLaunchKernel",
                msg,
            })
        };
        if threads > self.max_threads as u64 {
            return refuse(format!(
                "CUDA_ERROR_INVALID_VALUE: a block of {threads} threads; the kernel allows {}",
                self.max_threads
            ));
        }
        let limit = self.dyn_limit.load(std::sync::atomic::Ordering::Relaxed);
        if shared_mem > limit {
            return refuse(format!(
                "CUDA_ERROR_INVALID_VALUE: {shared_mem} bytes of dynamic shared memory; the \
                 kernel may use {limit} (more needs cuFuncSetAttribute's \
                 MAX_DYNAMIC_SHARED_SIZE_BYTES)"
            ));
        }
        Ok(())
    }

    /// Copies the values `params` point at (the driver copies a launch's
    /// parameters when it is queued) and returns the work that runs the kernel
    /// with them, after checking the launch ([`check_launch`](Self::check_launch)).
    ///
    /// # Safety
    /// `params` must point at values of the kernel's parameter types, and every
    /// device pointer among them must be valid for what the kernel accesses when
    /// the work runs.
    pub(crate) unsafe fn launch_job(
        &self,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared_mem: u32,
        params: &[*mut c_void],
    ) -> Result<Work> {
        self.check_launch(block, shared_mem)?;
        let sizes = &self.params;
        if sizes.len() != params.len() {
            return Err(Error::Cuda {
                op: "cuLaunchKernel",
                msg: format!(
                    "CUDA_ERROR_INVALID_VALUE: {} parameters given, the kernel takes {}",
                    params.len(),
                    sizes.len()
                ),
            });
        }
        // each value in 16-byte-aligned words of its own
        let values: Vec<Vec<u128>> = sizes
            .iter()
            .zip(params)
            .map(|(&size, &p)| {
                let mut v = vec![0u128; size.div_ceil(16).max(1)];
                std::ptr::copy_nonoverlapping(p as *const u8, v.as_mut_ptr().cast::<u8>(), size);
                v
            })
            .collect();
        let f = self.clone();
        Ok(Arc::new(move || {
            // a kernel may change its parameters: each run gets copies of its own
            let mut values = values.clone();
            let mut ptrs: Vec<*mut c_void> = values
                .iter_mut()
                .map(|v| v.as_mut_ptr().cast::<c_void>())
                .collect();
            // SAFETY: the pointers address copies of values of the kernel's
            // parameter types; the device pointers among them are the caller's.
            unsafe { f.run(grid, block, shared_mem, &mut ptrs) }
        }))
    }

    /// Runs the kernel over the whole grid before returning, after
    /// [`check_launch`](Self::check_launch).
    ///
    /// # Safety
    /// As [`run`](Self::run).
    #[cfg(test)]
    pub(crate) unsafe fn launch(
        &self,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared_mem: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        self.check_launch(block, shared_mem)?;
        self.run(grid, block, shared_mem, params)
    }

    /// Runs the kernel over the whole grid (a launch already checked).
    ///
    /// # Safety
    /// `params` must point at values of the kernel's parameter types, and every
    /// pointer among them must be valid for what the kernel accesses.
    unsafe fn run(
        &self,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared_mem: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let l = SimLaunch {
            grid: [grid.0, grid.1, grid.2],
            block: [block.0, block.1, block.2],
            shared_mem,
            fibers: self.fibers as i32,
        };
        let _g = exec_lock();
        if (self.entry)(params.as_mut_ptr(), &l) != 0 {
            let msg = CStr::from_ptr((self.error)())
                .to_string_lossy()
                .into_owned();
            return Err(Error::Cuda {
                op: "simulated kernel launch",
                msg,
            });
        }
        Ok(())
    }
}

/// A compiled module: a shared library with one entry per `extern "C"` kernel.
pub(crate) struct SimModule {
    lib: libloading::Library,
    fibers: bool,
}

impl SimModule {
    pub fn function(&self, name: &str) -> Result<SimFunc> {
        let sym = format!("__ember_sim_entry_{name}\0");
        let missing = |e: libloading::Error| Error::Cuda {
            op: "cuModuleGetFunction",
            msg: format!("{name}: no extern \"C\" __global__ function of that name ({e})"),
        };
        // SAFETY: the entry and error symbols have these signatures (prelude.h).
        unsafe {
            let entry = *self.lib.get::<Entry>(sym.as_bytes()).map_err(missing)?;
            let params_sym = format!("__ember_sim_params_{name}\0");
            let params_fn = *self
                .lib
                .get::<ParamsFn>(params_sym.as_bytes())
                .map_err(missing)?;
            let params = param_sizes(params_fn).into();
            let error = *self
                .lib
                .get::<ErrorFn>(b"__ember_sim_error\0")
                .map_err(missing)?;
            let bounds_sym = format!("__ember_sim_maxthreads_{name}\0");
            // SAFETY: a `const int` (EMBER_SIM_MAX_THREADS in prelude.h), present for
            // kernels declared with __launch_bounds__.
            let max_threads = match self.lib.get::<*const i32>(bounds_sym.as_bytes()) {
                Ok(p) => (**p).clamp(1, SIM_MAX_THREADS as i32) as u32,
                Err(_) => SIM_MAX_THREADS,
            };
            Ok(SimFunc {
                entry,
                error,
                params,
                fibers: self.fibers,
                max_threads,
                dyn_limit: Arc::new(std::sync::atomic::AtomicU32::new(48 << 10)),
            })
        }
    }
}

/// The host compiler and its version line (part of the cache key).
fn compiler() -> Result<&'static (String, String)> {
    static CXX: OnceLock<std::result::Result<(String, String), String>> = OnceLock::new();
    CXX.get_or_init(|| {
        let cxx = std::env::var("EMBER_SIM_CXX").unwrap_or_else(|_| "c++".into());
        let out = std::process::Command::new(&cxx)
            .arg("--version")
            .output()
            .map_err(|e| {
                format!(
                    "the CUDA simulator compiles kernels with a C++ compiler, and `{cxx}` \
                     could not be run ({e}); install g++ or clang++, or name one in EMBER_SIM_CXX"
                )
            })?;
        let version = String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or("")
            .to_string();
        Ok((cxx, version))
    })
    .as_ref()
    .map_err(|msg| Error::CudaUnavailable {
        reason: msg.clone(),
    })
}

/// The compiler flags `EMBER_SIM_SANITIZE` asks for (empty without it).
fn sanitize_flags() -> Result<&'static [&'static str]> {
    static FLAGS: OnceLock<std::result::Result<&'static [&'static str], String>> = OnceLock::new();
    FLAGS
        .get_or_init(|| {
            let v = std::env::var("EMBER_SIM_SANITIZE").unwrap_or_default();
            match v.trim() {
                "" | "0" => Ok(&[][..]),
                // the fibers' stacks are switched by hand: stack checks would
                // misread them, so only heap (device memory) and globals (shared
                // memory) are checked
                "address" | "1" => Ok(&[
                    "-fsanitize=address",
                    "-fno-omit-frame-pointer",
                    "-fno-sanitize-address-use-after-scope",
                    "--param=asan-stack=0",
                ][..]),
                other => Err(format!(
                    "EMBER_SIM_SANITIZE={other}: the simulator knows `address` only"
                )),
            }
        })
        .as_ref()
        .map(|f| *f)
        .map_err(|msg| Error::CudaUnavailable {
            reason: msg.clone(),
        })
}

/// Rewrites `extern __shared__ T name[];` (dynamic shared memory) as a pointer to
/// the simulator's dynamic shared buffer.
fn rewrite_dynamic_shared(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(at) = rest.find("extern __shared__") {
        let (before, decl) = rest.split_at(at);
        out.push_str(before);
        let Some(end) = decl.find(';') else {
            out.push_str(decl);
            return out;
        };
        let body = decl["extern __shared__".len()..end].trim();
        let body = body.trim_end_matches(|c: char| c == ']' || c == '[' || c.is_whitespace());
        let split = body
            .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
            .map_or(0, |i| i + 1);
        let (ty, name) = body.split_at(split);
        let ty = ty.trim();
        let ty = match ty.strip_prefix("__align__") {
            // drop `__align__(n)`: the buffer is aligned to 256 bytes
            Some(t) => t.split_once(')').map_or(ty, |(_, t)| t.trim()),
            None => ty,
        };
        out.push_str(&format!(
            "{ty}* const {name} = ({ty}*)::ember_sim::dyn_smem;"
        ));
        rest = &decl[end + 1..];
    }
    out.push_str(rest);
    out
}

/// What `__launch_bounds__(...)` becomes in the pass that finds the kernels.
const BOUNDS_MARK: &str = "__ember_sim_launch_bounds__";

/// A kernel of a module: its name and the text of its `__launch_bounds__`'
/// first argument (the most threads per block), if it has one.
#[derive(Debug, PartialEq)]
struct KernelDecl {
    name: String,
    max_threads: Option<String>,
}

/// Strips a `BOUNDS_MARK(args)` from the front of `t`, returning the first
/// argument's text and the rest.
fn strip_bounds(t: &str) -> Option<(String, &str)> {
    let t = t.trim_start().strip_prefix(BOUNDS_MARK)?.trim_start();
    let t = t.strip_prefix('(')?;
    let (mut depth, mut end) = (1, None);
    for (i, c) in t.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    end = Some(i);
                    break;
                }
            }
            _ => {}
        }
    }
    let end = end?;
    let args = &t[..end];
    let mut depth = 0;
    let first_end = args
        .char_indices()
        .find(|&(_, c)| {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ => {}
            }
            c == ',' && depth == 0
        })
        .map_or(args.len(), |(i, _)| i);
    Some((args[..first_end].trim().to_string(), &t[end + 1..]))
}

/// The `extern "C"` kernels of a preprocessed source where `__global__` was defined
/// as the marker and `__launch_bounds__` as [`BOUNDS_MARK`].
fn kernel_decls(preprocessed: &str, marker: &str) -> Vec<KernelDecl> {
    let mut decls: Vec<KernelDecl> = Vec::new();
    let mut rest = preprocessed;
    while let Some(at) = rest.find(marker) {
        let before = rest[..at].trim_end();
        rest = &rest[at + marker.len()..];
        if !before.ends_with("extern \"C\"") {
            continue;
        }
        // `__launch_bounds__` stands before or after the return type
        let mut t = rest;
        let mut bounds = None;
        if let Some((b, after)) = strip_bounds(t) {
            bounds = Some(b);
            t = after;
        }
        let Some(after_void) = t.trim_start().strip_prefix("void") else {
            continue;
        };
        t = after_void;
        if let Some((b, after)) = strip_bounds(t) {
            bounds = Some(b);
            t = after;
        }
        let name: String = t
            .trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() && !decls.iter().any(|d| d.name == name) {
            decls.push(KernelDecl {
                name,
                max_threads: bounds,
            });
        }
    }
    decls
}

fn run_compiler(args: &[&str], name: &str) -> Result<String> {
    let (cxx, _) = compiler()?;
    let out = std::process::Command::new(cxx)
        .args(args)
        .output()
        .map_err(|e| Error::Cuda {
            op: "simulator: running the C++ compiler",
            msg: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(Error::KernelCompile {
            name: name.to_string(),
            arch: "the CUDA simulator (host C++)".into(),
            log: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Compiles CUDA C `source` (file name `name`.cu in messages) for the simulator,
/// through an in-memory and an on-disk cache. `options` may hold `-D` and `-I`
/// options; other NVRTC options mean nothing here and are ignored.
pub(crate) fn compile(name: &str, source: &str, options: &[String]) -> Result<Arc<SimModule>> {
    type Cache = Mutex<HashMap<u64, Arc<SimModule>>>;
    static MODULES: OnceLock<Cache> = OnceLock::new();
    let (_, version) = compiler()?;
    let opts: Vec<&str> = options
        .iter()
        .map(|s| s.as_str())
        .filter(|o| o.starts_with("-D") || o.starts_with("-I"))
        .collect();
    let sanitize = sanitize_flags()?;
    let mut parts: Vec<&[u8]> = vec![PRELUDE.as_bytes(), source.as_bytes(), version.as_bytes()];
    parts.extend(opts.iter().map(|o| o.as_bytes()));
    parts.extend(sanitize.iter().map(|o| o.as_bytes()));
    let key = super::nvrtc::fnv1a(&parts);
    let modules = MODULES.get_or_init(|| Mutex::new(HashMap::new()));
    let mut cache = modules.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(m) = cache.get(&key) {
        return Ok(m.clone());
    }
    let dir = super::nvrtc::cache_dir()
        .unwrap_or_else(|| std::env::temp_dir().join("ember-sim"))
        .join("sim");
    std::fs::create_dir_all(&dir).map_err(|e| Error::Cuda {
        op: "simulator: creating the module cache",
        msg: format!("{}: {e}", dir.display()),
    })?;
    let lib_path = dir.join(format!("{name}-{key:016x}.so"));
    if !lib_path.is_file() {
        build(name, source, &opts, &dir, &lib_path, key)?;
    }
    use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
    // SAFETY: a library built above from ember's prelude and the given source; its
    // initialisers only set up static data.
    let lib = unsafe { Library::open(Some(&lib_path), RTLD_NOW | RTLD_LOCAL) }.map_err(|e| {
        let hint = if sanitize.is_empty() {
            ""
        } else {
            " (kernels built for EMBER_SIM_SANITIZE need the sanitizer's runtime loaded \
             first: LD_PRELOAD=$(c++ -print-file-name=libasan.so), as .ci/memcheck does)"
        };
        Error::Cuda {
            op: "simulator: loading a module",
            msg: format!("{e}{hint}"),
        }
    })?;
    // SAFETY: a `const int` the module defines (EMBER_SIM_FIBERS in prelude.h).
    let fibers = unsafe { lib.get::<*const i32>(b"__ember_sim_fibers\0") }
        .map(|p| unsafe { **p } != 0)
        .map_err(|e| Error::Cuda {
            op: "simulator: loading a module",
            msg: e.to_string(),
        })?;
    let m = Arc::new(SimModule {
        lib: lib.into(),
        fibers,
    });
    cache.insert(key, m.clone());
    Ok(m)
}

fn build(
    name: &str,
    source: &str,
    opts: &[&str],
    dir: &std::path::Path,
    lib_path: &std::path::Path,
    key: u64,
) -> Result<()> {
    // unique per process and thread, renamed into place when complete
    let tag = format!("{}-{:?}", std::process::id(), std::thread::current().id())
        .replace(|c: char| !c.is_alphanumeric() && c != '-', "");
    let cpp = dir.join(format!("{name}-{key:016x}.{tag}.cpp"));
    let so = dir.join(format!("{name}-{key:016x}.{tag}.so"));
    let body = rewrite_dynamic_shared(source);
    const USER: &str = "#pragma ember_sim_user_source";
    let text = format!("{PRELUDE}\n{USER}\n#line 1 \"{name}.cu\"\n{body}\n");
    let write = |p: &std::path::Path, s: &str| {
        std::fs::write(p, s).map_err(|e| Error::Cuda {
            op: "simulator: writing a source file",
            msg: format!("{}: {e}", p.display()),
        })
    };
    write(&cpp, &text)?;
    let cpp_s = cpp.to_string_lossy().into_owned();
    const MARK: &str = "__ember_sim_kernel_marker__";
    let mut pre_args = vec!["-std=c++17", "-E", "-P", "-w", "-x", "c++"];
    let mark_def = format!("-D__global__={MARK}");
    pre_args.push(&mark_def);
    let bounds_def = format!("-D__launch_bounds__(...)={BOUNDS_MARK}(__VA_ARGS__)");
    pre_args.push(&bounds_def);
    pre_args.extend(opts);
    pre_args.push(&cpp_s);
    let pre = run_compiler(&pre_args, name);
    let pre = match pre {
        Ok(p) => p,
        Err(e) => {
            let _ = std::fs::remove_file(&cpp);
            return Err(e);
        }
    };
    let decls = kernel_decls(&pre, MARK);
    // threads that may wait at a barrier or a shuffle need fibers; the macros and
    // headers of the source are expanded here, the prelude's own uses left out
    let user = pre.split_once(USER).map_or(pre.as_str(), |(_, u)| u);
    let fibers = ["__syncthreads", "__syncwarp", "__shfl"]
        .iter()
        .any(|w| user.contains(w));
    let mut full = text;
    full.push_str(&format!("EMBER_SIM_FIBERS({})\n", fibers as i32));
    for d in &decls {
        full.push_str(&format!("EMBER_SIM_ENTRY({})\n", d.name));
        if let Some(t) = &d.max_threads {
            full.push_str(&format!("EMBER_SIM_MAX_THREADS({}, ({t}))\n", d.name));
        }
    }
    write(&cpp, &full)?;
    let so_s = so.to_string_lossy().into_owned();
    let mut args = vec![
        "-std=c++17",
        "-O1",
        "-fPIC",
        "-shared",
        "-fvisibility=hidden",
        "-Wl,-Bsymbolic",
        "-w",
        "-x",
        "c++",
    ];
    args.extend(opts);
    args.extend(sanitize_flags()?);
    args.extend([cpp_s.as_str(), "-o", so_s.as_str()]);
    let built = run_compiler(&args, name);
    let _ = std::fs::remove_file(&cpp);
    built?;
    std::fs::rename(&so, lib_path).map_err(|e| Error::Cuda {
        op: "simulator: storing a module",
        msg: format!("{}: {e}", lib_path.display()),
    })
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

    #[test]
    fn dynamic_shared_memory_becomes_a_pointer() {
        let s = "extern __shared__ float tile[];\n__global__ void k() { extern __shared__ __align__(16) double d[ ]; }";
        let r = rewrite_dynamic_shared(s);
        assert!(
            r.contains("float* const tile = (float*)::ember_sim::dyn_smem;"),
            "{r}"
        );
        assert!(
            r.contains("double* const d = (double*)::ember_sim::dyn_smem;"),
            "{r}"
        );
    }

    #[test]
    fn kernel_names_are_the_extern_c_ones() {
        let m = "__ember_sim_kernel_marker__";
        let pre = format!(
            "extern \"C\" {m} void add_f32(float* x) {{}}\nstatic {m} void helper() {{}}\n\
             extern \"C\"   {m}\n void  mv (const float* a) {{}}"
        );
        let names: Vec<String> = kernel_decls(&pre, m).into_iter().map(|d| d.name).collect();
        assert_eq!(names, ["add_f32", "mv"]);
    }

    #[test]
    fn launch_bounds_are_read_before_or_after_the_return_type() {
        let m = "__ember_sim_kernel_marker__";
        let b = BOUNDS_MARK;
        let pre = format!(
            "extern \"C\" {m} void {b}(256) k1(float* x) {{}}\n\
             extern \"C\" {m} {b}( 2 * 64 , 4) void k2() {{}}\n\
             extern \"C\" {m} void k3() {{}}"
        );
        let decls = kernel_decls(&pre, m);
        let got: Vec<(&str, Option<&str>)> = decls
            .iter()
            .map(|d| (d.name.as_str(), d.max_threads.as_deref()))
            .collect();
        assert_eq!(
            got,
            [("k1", Some("256")), ("k2", Some("2 * 64")), ("k3", None)]
        );
    }
}
