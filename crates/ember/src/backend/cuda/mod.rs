//! CUDA storage and the per-device runtime: one context and one stream per GPU,
//! the caching allocator, ember's kernels (compiled by NVRTC at first use) and
//! cuBLAS.
//!
//! Work is queued on the device's stream and returns at once; reading values back
//! (`to_vec`, `item`, printing) waits for the stream. A kernel launch that fails
//! reports the driver's error; nothing here panics when CUDA is missing, since
//! every entry goes through [`dev`], which checks the device first.

pub(crate) mod alloc;
pub(crate) mod blas;
pub mod discover;
pub(crate) mod dnn;
pub mod libs;
pub(crate) mod nvrtc;
pub(crate) mod ops;
pub(crate) mod pinned;
pub(crate) mod random;
pub(crate) mod sim;

use crate::dtype::CpuData;
use crate::{DType, Device, Error, Result};
use alloc::{AllocError, Allocator, RawMemory};
use cudarc::driver::{result as drv, sys, CudaContext, CudaStream};
use libs::CudaLib;
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

pub use alloc::MemoryStats;

/// A loaded kernel: a `CUfunction` handle (valid while its module stays loaded,
/// which is for the life of the process) or a simulated kernel.
#[derive(Clone, Copy)]
pub(crate) enum Func {
    Driver(sys::CUfunction),
    Sim(sim::SimFunc),
}
// SAFETY: CUfunction handles may be used from any thread once the context is
// current; simulated kernels are plain function pointers.
unsafe impl Send for Func {}
// SAFETY: as above; launching does not mutate the handle.
unsafe impl Sync for Func {}

impl Func {
    /// The byte sizes of the kernel's parameters, in order (from the driver's
    /// cuFuncGetParamInfo, or the simulator's compiled signature).
    pub(crate) fn param_sizes(&self) -> Result<Vec<usize>> {
        match self {
            Func::Driver(f) => {
                let mut sizes = Vec::new();
                loop {
                    let (mut offset, mut size) = (0usize, 0usize);
                    // SAFETY: a loaded function and two out-parameters.
                    let r =
                        unsafe { sys::cuFuncGetParamInfo(*f, sizes.len(), &mut offset, &mut size) };
                    match r {
                        sys::cudaError_enum::CUDA_SUCCESS => sizes.push(size),
                        // past the last parameter
                        sys::cudaError_enum::CUDA_ERROR_INVALID_VALUE => return Ok(sizes),
                        e => {
                            return Err(Error::Cuda {
                                op: "cuFuncGetParamInfo",
                                msg: format!("{e:?}"),
                            })
                        }
                    }
                }
            }
            Func::Sim(f) => Ok(f.param_sizes()),
        }
    }
}

enum Module {
    Driver(sys::CUmodule),
    Sim(Arc<sim::SimModule>),
}
// SAFETY: a module handle is only used under the device's module lock.
unsafe impl Send for Module {}

impl Module {
    fn function(&self, name: &str) -> Result<Func> {
        match self {
            Module::Driver(m) => get_function(*m, name),
            Module::Sim(m) => m.function(name).map(Func::Sim),
        }
    }
}

/// A cuBLAS handle bound to the device's stream.
pub(crate) struct Blas(pub(crate) cudarc::cublas::sys::cublasHandle_t);
// SAFETY: ember uses the handle under the device's blas mutex only.
unsafe impl Send for Blas {}

/// Device memory through the driver, for the caching allocator.
pub(crate) struct DriverMemory {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    last_error: String,
}

/// A device's memory as the caching allocator sees it: the driver's, or the
/// simulator's.
pub(crate) enum DeviceMemory {
    Driver(DriverMemory),
    Sim(sim::SimMemory),
}

impl RawMemory for DeviceMemory {
    fn malloc(&mut self, bytes: usize) -> std::result::Result<u64, bool> {
        match self {
            DeviceMemory::Driver(d) => {
                let _ = d.ctx.bind_to_thread();
                // SAFETY: a plain allocation in the current context.
                match unsafe { drv::malloc_sync(bytes) } {
                    Ok(p) => Ok(p),
                    Err(e) => {
                        d.last_error = e.to_string();
                        Err(e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY)
                    }
                }
            }
            DeviceMemory::Sim(s) => s.malloc(bytes),
        }
    }
    fn free(&mut self, ptr: u64) {
        match self {
            DeviceMemory::Driver(d) => {
                let _ = d.ctx.bind_to_thread();
                // SAFETY: `ptr` came from malloc_sync and no block of it is in use.
                let _ = unsafe { drv::free_sync(ptr) };
            }
            DeviceMemory::Sim(s) => s.free(ptr),
        }
    }
    fn mem_info(&self) -> (usize, usize) {
        match self {
            DeviceMemory::Driver(d) => {
                let _ = d.ctx.bind_to_thread();
                drv::mem_get_info().unwrap_or((0, 0))
            }
            DeviceMemory::Sim(s) => s.mem_info(),
        }
    }
    fn synchronize(&self) {
        if let DeviceMemory::Driver(d) = self {
            let _ = d.stream.synchronize();
        }
    }
    fn last_error(&self) -> String {
        match self {
            DeviceMemory::Driver(d) => d.last_error.clone(),
            DeviceMemory::Sim(_) => String::new(),
        }
    }
}

/// What executes a device's work: the CUDA driver (one context and one stream) or
/// the simulator (see [`sim`]), which runs everything on the CPU before returning.
enum Runtime {
    Driver {
        ctx: Arc<CudaContext>,
        stream: Arc<CudaStream>,
    },
    Sim,
}

/// The runtime of one GPU.
pub(crate) struct CudaDev {
    pub ordinal: usize,
    rt: Runtime,
    /// Compute capability as `major * 10 + minor` (90 for an H100).
    pub arch: u32,
    pub sm_count: u32,
    alloc: Mutex<Allocator<DeviceMemory>>,
    modules: Mutex<HashMap<(&'static str, DType), Module>>,
    functions: Mutex<HashMap<String, Func>>,
    blas: Mutex<Option<Blas>>,
    dnn: Mutex<Option<dnn::Dnn>>,
    pinned: Mutex<pinned::PinnedPool>,
    compile_arch: OnceLock<std::result::Result<u32, String>>,
}

fn cuda_err(op: &'static str) -> impl Fn(drv::DriverError) -> Error {
    move |e| Error::Cuda {
        op,
        msg: e.to_string(),
    }
}

type Slot = OnceLock<std::result::Result<Arc<CudaDev>, String>>;

fn slots() -> &'static [Slot] {
    static SLOTS: OnceLock<Vec<Slot>> = OnceLock::new();
    SLOTS.get_or_init(|| {
        (0..crate::backend::cuda::discover::device_count())
            .map(|_| OnceLock::new())
            .collect()
    })
}

/// The runtime of `cuda:ordinal`, created at first use.
pub(crate) fn dev(ordinal: usize) -> Result<Arc<CudaDev>> {
    crate::backend::cuda::discover::check_device(Device::Cuda(ordinal))?;
    let slot = slots().get(ordinal).ok_or_else(|| Error::CudaUnavailable {
        reason: format!("no GPU cuda:{ordinal}"),
    })?;
    let d = slot
        .get_or_init(|| {
            CudaDev::new(ordinal)
                .map(Arc::new)
                .map_err(|e| e.to_string())
        })
        .clone()
        .map_err(|msg| Error::Cuda {
            op: "initialising the device",
            msg,
        })?;
    d.bind()?;
    Ok(d)
}

impl CudaDev {
    fn new(ordinal: usize) -> Result<CudaDev> {
        if sim::enabled().is_some() {
            return Ok(CudaDev::with_runtime(
                ordinal,
                Runtime::Sim,
                90,
                sim::properties(ordinal).multiprocessor_count,
                DeviceMemory::Sim(sim::SimMemory::new()),
            ));
        }
        let ctx = CudaContext::new(ordinal).map_err(cuda_err("cuCtxCreate"))?;
        // one stream per device: the per-allocation events cudarc can record are
        // pure overhead here
        // SAFETY: no CudaSlice of cudarc's is used with this context.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.default_stream();
        let (major, minor) = ctx
            .compute_capability()
            .map_err(cuda_err("cuDeviceGetAttribute"))?;
        let sm_count = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(cuda_err("cuDeviceGetAttribute"))? as u32;
        let raw = DeviceMemory::Driver(DriverMemory {
            ctx: ctx.clone(),
            stream: stream.clone(),
            last_error: String::new(),
        });
        Ok(CudaDev::with_runtime(
            ordinal,
            Runtime::Driver { ctx, stream },
            (major * 10 + minor) as u32,
            sm_count,
            raw,
        ))
    }

    fn with_runtime(
        ordinal: usize,
        rt: Runtime,
        arch: u32,
        sm_count: u32,
        raw: DeviceMemory,
    ) -> CudaDev {
        CudaDev {
            ordinal,
            rt,
            arch,
            sm_count,
            alloc: Mutex::new(if alloc::caching_from_env() {
                Allocator::new(raw)
            } else {
                Allocator::without_cache(raw)
            }),
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
            blas: Mutex::new(None),
            dnn: Mutex::new(None),
            pinned: Mutex::new(pinned::PinnedPool::default()),
            compile_arch: OnceLock::new(),
        }
    }

    /// Makes the device's context current on this thread. Every driver, cuBLAS and
    /// cuDNN call needs it: the device's stream is its context's NULL stream, which
    /// the driver finds through the calling thread's current context, and a tensor
    /// may be used from a thread that never made it current (or that made another
    /// GPU's current since). Cheap when it already is (one driver TLS read).
    pub(crate) fn bind(&self) -> Result<()> {
        match &self.rt {
            Runtime::Driver { ctx, .. } => {
                ctx.bind_to_thread().map_err(cuda_err("cuCtxSetCurrent"))
            }
            Runtime::Sim => Ok(()),
        }
    }

    pub fn device(&self) -> Device {
        Device::Cuda(self.ordinal)
    }

    /// `true` for a simulated GPU.
    pub(crate) fn is_simulated(&self) -> bool {
        matches!(self.rt, Runtime::Sim)
    }

    /// The device's stream (the null stream for a simulated device).
    pub(crate) fn cu_stream(&self) -> sys::CUstream {
        match &self.rt {
            Runtime::Driver { stream, .. } => stream.cu_stream(),
            Runtime::Sim => std::ptr::null_mut(),
        }
    }

    fn allocator(&self) -> MutexGuard<'_, Allocator<DeviceMemory>> {
        self.alloc.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A device block of at least `bytes`.
    pub fn malloc(&self, bytes: usize) -> Result<u64> {
        self.allocator().alloc(bytes).map_err(|e| match e {
            AllocError::OutOfMemory {
                requested,
                free,
                total,
                allocated,
                reserved,
            } => Error::OutOfMemory {
                device: self.device(),
                requested,
                msg: format!(
                    "GPU {} has a total capacity of {} of which {} is free; ember has {} \
                     allocated to tensors and {} reserved in total (the cache was emptied \
                     and the allocation retried)",
                    self.ordinal,
                    fmt_bytes(total),
                    fmt_bytes(free),
                    fmt_bytes(allocated),
                    fmt_bytes(reserved)
                ),
            },
            AllocError::Driver(msg) => Error::Cuda {
                op: "cuMemAlloc",
                msg,
            },
        })
    }

    pub fn free(&self, ptr: u64) {
        self.allocator().free(ptr);
    }

    pub fn memory_stats(&self) -> MemoryStats {
        self.allocator().stats()
    }

    pub fn reset_peak(&self) {
        self.allocator().reset_peak();
    }

    pub fn empty_cache(&self) {
        self.allocator().release_cached();
        self.release_pinned_cache();
    }

    /// (free, total) bytes of the device's memory.
    pub fn mem_get_info(&self) -> Result<(usize, usize)> {
        match &self.rt {
            Runtime::Driver { ctx, .. } => ctx.mem_get_info().map_err(cuda_err("cuMemGetInfo")),
            Runtime::Sim => Ok(self.allocator().raw_mem_info()),
        }
    }

    pub fn synchronize(&self) -> Result<()> {
        match &self.rt {
            Runtime::Driver { stream, .. } => stream
                .synchronize()
                .map_err(cuda_err("cuStreamSynchronize")),
            // simulated work is done when its call returns
            Runtime::Sim => Ok(()),
        }
    }

    /// The kernel `name` of ember's kernel file `module`, from the module compiled
    /// for `dtype` (the dtype in the kernel's name suffix).
    pub(crate) fn func(&self, module: &'static str, dtype: DType, name: &str) -> Result<Func> {
        if let Some(f) = self
            .functions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
        {
            return Ok(*f);
        }
        let key = (module, dtype);
        let mut modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        let m = match modules.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let suffix = ops::suffix(dtype);
                let src = nvrtc::ember_source(module, suffix).ok_or_else(|| Error::Cuda {
                    op: "loading kernels",
                    msg: format!("no kernel file {module}"),
                })?;
                e.insert(self.load_module(&format!("{module}_{suffix}"), &src, &[])?)
            }
        };
        let f = m.function(name)?;
        self.functions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string(), f);
        Ok(f)
    }

    /// Compiles `source` for this device (through the caches) and loads it.
    fn load_module(&self, name: &str, source: &str, options: &[String]) -> Result<Module> {
        match &self.rt {
            Runtime::Sim => Ok(Module::Sim(sim::compile(name, source, options)?)),
            Runtime::Driver { .. } => {
                let (cubin, _) = nvrtc::cubin(name, source, self.compile_arch()?, options)?;
                self.bind()?;
                // SAFETY: `cubin` is a complete ELF image produced by NVRTC for this device.
                unsafe { drv::module::load_data(cubin.as_ptr().cast()) }
                    .map(Module::Driver)
                    .map_err(cuda_err("cuModuleLoadData"))
            }
        }
    }

    /// The architecture NVRTC compiles this device's kernels for (its own where
    /// NVRTC supports it), decided once.
    fn compile_arch(&self) -> Result<u32> {
        self.compile_arch
            .get_or_init(|| {
                let supported = nvrtc::supported_archs().map_err(|e| e.to_string())?;
                let version = nvrtc::version().map_err(|e| e.to_string())?;
                nvrtc::target_arch(self.arch, &supported, version)
            })
            .clone()
            .map_err(|reason| Error::CudaUnavailable { reason })
    }

    /// Compiles and loads a user's kernel `name` from `source`.
    pub(crate) fn load_user_function(
        &self,
        source: &str,
        name: &str,
        options: &[String],
    ) -> Result<Func> {
        // the module stays loaded as long as the process runs (Module has no Drop)
        self.load_module(name, source, options)?.function(name)
    }

    /// Launches `f` on the device's stream.
    ///
    /// # Safety
    /// `params` must point at values matching the kernel's parameter list, and
    /// every device pointer among them must be valid for what the kernel accesses.
    pub(crate) unsafe fn launch(
        &self,
        f: Func,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared_mem: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        match f {
            Func::Driver(cf) => {
                self.bind()?;
                drv::launch_kernel(cf, grid, block, shared_mem, self.cu_stream(), params)
                    .map_err(cuda_err("cuLaunchKernel"))
            }
            Func::Sim(sf) => sf.launch(grid, block, shared_mem, params),
        }
    }

    /// A grid for `n` elements in blocks of `threads`, capped so that grid-stride
    /// loops keep every multiprocessor busy without a huge grid.
    pub(crate) fn grid_for(&self, n: usize, threads: u32) -> u32 {
        let blocks = n.div_ceil(threads as usize).max(1);
        blocks
            .min(self.sm_count as usize * 32)
            .min(u32::MAX as usize) as u32
    }

    /// The cuBLAS handle, created at first use.
    pub(crate) fn blas(&self) -> Result<MutexGuard<'_, Option<Blas>>> {
        self.bind()?;
        let mut g = self.blas.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            libs::ensure(CudaLib::Cublas).map_err(|reason| Error::CudaUnavailable { reason })?;
            let h = cudarc::cublas::result::create_handle().map_err(|e| Error::Cuda {
                op: "cublasCreate",
                msg: e.to_string(),
            })?;
            // SAFETY: a fresh handle and this device's live stream.
            unsafe { cudarc::cublas::result::set_stream(h, self.cu_stream() as _) }.map_err(
                |e| Error::Cuda {
                    op: "cublasSetStream",
                    msg: e.to_string(),
                },
            )?;
            *g = Some(Blas(h));
        }
        Ok(g)
    }

    pub(crate) fn dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        if self.is_simulated() {
            // SAFETY: both ranges lie within live allocations of at least `bytes`.
            unsafe { sim::memcpy(dst, src, bytes) };
            return Ok(());
        }
        self.bind()?;
        // SAFETY: both ranges lie within live allocations of at least `bytes`.
        unsafe { drv::memcpy_dtod_async(dst, src, bytes, self.cu_stream()) }
            .map_err(cuda_err("cuMemcpyDtoDAsync"))
    }
}

fn get_function(m: sys::CUmodule, name: &str) -> Result<Func> {
    let cname = CString::new(name).map_err(|_| Error::invalid("kernel", "NUL in kernel name"))?;
    // SAFETY: `m` is a loaded module that is never unloaded.
    unsafe { drv::module::get_function(m, cname) }
        .map(Func::Driver)
        .map_err(|e| Error::Cuda {
            op: "cuModuleGetFunction",
            msg: format!("{name}: {e}"),
        })
}

pub(crate) fn fmt_bytes(n: usize) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    const MIB: f64 = (1u64 << 20) as f64;
    let x = n as f64;
    if x >= GIB {
        format!("{:.2} GiB", x / GIB)
    } else if x >= MIB {
        format!("{:.2} MiB", x / MIB)
    } else {
        format!("{n} bytes")
    }
}

/// Values on one GPU: a block from the caching allocator holding `len` elements of
/// `dtype`, returned to the allocator when dropped.
pub(crate) struct CudaStorage {
    ptr: u64,
    len: usize,
    dtype: DType,
    dev: Arc<CudaDev>,
}

impl std::fmt::Debug for CudaStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CudaStorage(cuda:{}, {} x {})",
            self.dev.ordinal, self.len, self.dtype
        )
    }
}

impl Drop for CudaStorage {
    fn drop(&mut self) {
        self.dev.free(self.ptr);
    }
}

impl CudaStorage {
    /// Uninitialised storage for `len` elements.
    pub fn alloc(dev: &Arc<CudaDev>, dtype: DType, len: usize) -> Result<CudaStorage> {
        let bytes = len
            .checked_mul(dtype.size_in_bytes())
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| Error::OutOfMemory {
                device: dev.device(),
                requested: len.saturating_mul(dtype.size_in_bytes()),
                msg: "more than an address can count".into(),
            })?;
        let ptr = dev.malloc(bytes)?;
        Ok(CudaStorage {
            ptr,
            len,
            dtype,
            dev: dev.clone(),
        })
    }

    /// A copy of host data.
    pub fn from_cpu(dev: &Arc<CudaDev>, data: &CpuData) -> Result<CudaStorage> {
        CudaStorage::from_cpu_range(dev, data, 0..data.len())
    }

    /// A copy of the elements `range` of host data.
    pub fn from_cpu_range(
        dev: &Arc<CudaDev>,
        data: &CpuData,
        range: std::ops::Range<usize>,
    ) -> Result<CudaStorage> {
        let s = CudaStorage::alloc(dev, data.dtype(), range.len())?;
        crate::dtype::dispatch!(data, v => dev.htod(s.ptr, &v[range]))?;
        Ok(s)
    }

    /// The whole storage copied to the host (waits for queued work).
    pub fn to_cpu(&self) -> Result<CpuData> {
        self.to_cpu_range(0, self.len)
    }

    /// `n` elements from `offset` copied to the host (waits for queued work).
    pub fn to_cpu_range(&self, offset: usize, n: usize) -> Result<CpuData> {
        fn go<T: crate::WithDType>(s: &CudaStorage, offset: usize, n: usize) -> Result<CpuData> {
            let mut v = crate::backend::host::alloc_uninit::<T>(n)?;
            let at = s.ptr + (offset * std::mem::size_of::<T>()) as u64;
            s.dev.dtoh(&mut v, at)?;
            Ok(T::wrap(v))
        }
        debug_assert!(offset + n <= self.len);
        match self.dtype {
            DType::Bool => go::<bool>(self, offset, n),
            DType::U8 => go::<u8>(self, offset, n),
            DType::I64 => go::<i64>(self, offset, n),
            DType::F16 => go::<half::f16>(self, offset, n),
            DType::BF16 => go::<half::bf16>(self, offset, n),
            DType::F32 => go::<f32>(self, offset, n),
            DType::F64 => go::<f64>(self, offset, n),
        }
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    pub fn dev(&self) -> &Arc<CudaDev> {
        &self.dev
    }
}

// ---------------------------------------------------------------------------------
// Public runtime functions (re-exported as `ember::cuda::*`)

fn cuda_index(device: Device) -> Result<usize> {
    match device {
        Device::Cuda(i) => Ok(i),
        Device::Cpu => Err(Error::invalid(
            "cuda",
            "expected a CUDA device (cuda:N), got cpu",
        )),
    }
}

/// Waits until all work queued on `device` has finished
/// (`torch.cuda.synchronize(device)`). A no-op for the CPU.
pub fn synchronize(device: &Device) -> Result<()> {
    match device {
        Device::Cpu => Ok(()),
        Device::Cuda(i) => dev(*i)?.synchronize(),
    }
}

/// The caching allocator's statistics for `device` (all zero before its first use).
pub fn memory_stats(device: &Device) -> Result<MemoryStats> {
    let i = cuda_index(*device)?;
    crate::backend::cuda::discover::check_device(*device)?;
    Ok(match slots().get(i).and_then(|s| s.get()) {
        Some(Ok(d)) => d.memory_stats(),
        _ => MemoryStats::default(),
    })
}

/// Bytes held by tensors on `device` (`torch.cuda.memory_allocated`).
pub fn memory_allocated(device: &Device) -> Result<usize> {
    Ok(memory_stats(device)?.allocated)
}

/// Bytes taken from the driver, cached blocks included (`torch.cuda.memory_reserved`).
pub fn memory_reserved(device: &Device) -> Result<usize> {
    Ok(memory_stats(device)?.reserved)
}

/// The most bytes held by tensors since the start or the last
/// [`reset_peak_memory_stats`] (`torch.cuda.max_memory_allocated`).
pub fn max_memory_allocated(device: &Device) -> Result<usize> {
    Ok(memory_stats(device)?.peak_allocated)
}

/// Starts peak tracking again from the current usage.
pub fn reset_peak_memory_stats(device: &Device) -> Result<()> {
    dev(cuda_index(*device)?)?.reset_peak();
    Ok(())
}

/// Returns cached, unused device memory to the driver (`torch.cuda.empty_cache`),
/// and the idle pinned host blocks that stage copies.
pub fn empty_cache(device: &Device) -> Result<()> {
    dev(cuda_index(*device)?)?.empty_cache();
    Ok(())
}

/// What ember's pinned host memory for copies to and from one GPU holds
/// (`torch.cuda.host_memory_stats`' core).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostMemoryStats {
    /// Bytes of page-locked host memory kept for staging copies.
    pub reserved: usize,
    /// Copies (or chunks of large copies) staged through it since the start.
    pub staged_copies: u64,
}

/// Statistics of the pinned host memory that stages `device`'s copies (zero before
/// its first copy). [`empty_cache`] returns the idle blocks.
pub fn host_memory_stats(device: &Device) -> Result<HostMemoryStats> {
    let i = cuda_index(*device)?;
    crate::backend::cuda::discover::check_device(*device)?;
    Ok(match slots().get(i).and_then(|s| s.get()) {
        Some(Ok(d)) => {
            let (reserved, staged_copies) = d.pinned_stats();
            HostMemoryStats {
                reserved,
                staged_copies,
            }
        }
        _ => HostMemoryStats::default(),
    })
}

/// (free, total) bytes of device memory as the driver sees them
/// (`torch.cuda.mem_get_info`); creates the device's context.
pub fn mem_get_info(device: &Device) -> Result<(usize, usize)> {
    dev(cuda_index(*device)?)?.mem_get_info()
}

static ALLOW_TF32: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Lets f32 matrix products use TF32 tensor cores (10-bit mantissa inputs, f32
/// accumulate), like `torch.backends.cuda.matmul.allow_tf32 = True`. Off by default.
pub fn set_allow_tf32(on: bool) {
    ALLOW_TF32.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Whether f32 matrix products may use TF32.
pub fn allow_tf32() -> bool {
    ALLOW_TF32.load(std::sync::atomic::Ordering::Relaxed)
}

/// A point in a device's stream, for timing GPU work (`torch.cuda.Event(enable_timing=True)`).
///
/// ```no_run
/// # use ember::prelude::*;
/// let dev = Device::Cuda(0);
/// let a = Tensor::randn([4096, 4096], &dev)?;
/// let start = ember::cuda::Event::record(&dev)?;
/// let c = a.matmul(&a)?;
/// let end = ember::cuda::Event::record(&dev)?;
/// println!("{:.3} ms", start.elapsed_ms(&end)?); // waits for `end`
/// # Ok::<(), ember::Error>(())
/// ```
pub struct Event {
    ev: EventKind,
    dev: Arc<CudaDev>,
}

enum EventKind {
    Driver(sys::CUevent),
    /// A simulated device has finished its work when the call that queued it
    /// returns: the host clock at recording is the event's time.
    Sim(std::time::Instant),
}

// SAFETY: a CUevent may be queried and destroyed from any thread.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl Event {
    /// Records an event on `device`'s stream now.
    pub fn record(device: &Device) -> Result<Event> {
        let d = dev(cuda_index(*device)?)?;
        if d.is_simulated() {
            return Ok(Event {
                ev: EventKind::Sim(std::time::Instant::now()),
                dev: d,
            });
        }
        d.bind()?;
        let ev = drv::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            .map_err(cuda_err("cuEventCreate"))?;
        // SAFETY: a live event and the device's live stream.
        unsafe { drv::event::record(ev, d.cu_stream()) }.map_err(cuda_err("cuEventRecord"))?;
        Ok(Event {
            ev: EventKind::Driver(ev),
            dev: d,
        })
    }

    /// Waits until the work queued before this event has finished.
    pub fn synchronize(&self) -> Result<()> {
        match self.ev {
            // SAFETY: a live, recorded event.
            EventKind::Driver(ev) => {
                unsafe { drv::event::synchronize(ev) }.map_err(cuda_err("cuEventSynchronize"))
            }
            EventKind::Sim(_) => Ok(()),
        }
    }

    /// Milliseconds of GPU time from this event to `end` (waits for `end`).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        end.synchronize()?;
        match (&self.ev, &end.ev) {
            // SAFETY: both events are live and recorded.
            (EventKind::Driver(a), EventKind::Driver(b)) => {
                unsafe { drv::event::elapsed(*a, *b) }.map_err(cuda_err("cuEventElapsedTime"))
            }
            (EventKind::Sim(a), EventKind::Sim(b)) => {
                Ok(b.saturating_duration_since(*a).as_secs_f32() * 1e3)
            }
            _ => Err(Error::invalid(
                "Event::elapsed_ms",
                "the two events belong to different kinds of device",
            )),
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let EventKind::Driver(ev) = self.ev {
            let _ = self.dev.bind();
            // SAFETY: destroyed once; the driver defers destruction of pending events.
            let _ = unsafe { drv::event::destroy(ev) };
        }
    }
}

thread_local! {
    static HOST_FALLBACKS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

pub(crate) fn count_host_fallback() {
    HOST_FALLBACKS.with(|c| c.set(c.get() + 1));
}

/// How many times an operation on a CUDA tensor ran on the host, on the calling
/// thread, because ember has no CUDA kernel for it (the values are copied to the
/// host, computed there and copied back: correct, but slow). Per thread, so that a
/// loop can check its own operations while other threads work; benchmarks and tests
/// read it to see which ops stay on the GPU.
pub fn host_fallback_count() -> u64 {
    HOST_FALLBACKS.with(|c| c.get())
}
