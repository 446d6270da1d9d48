//! Launching a compiled kernel on the simulator: the launch configuration, the
//! entry of a module, and a module's kernels by name.

use super::*;

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
    pub(super) lib: libloading::Library,
    pub(super) fibers: bool,
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
