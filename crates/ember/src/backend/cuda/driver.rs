//! The NVIDIA driver's side of the runtime seam: discovery through the driver API,
//! and one context and stream per GPU, with kernels compiled by NVRTC, GEMMs by
//! cuBLAS (`blas.rs`) and convolutions by cuDNN (`dnn.rs`).
//!
//! Nothing here panics or aborts on a machine without CUDA: the driver library is
//! located (see [`libs`](super::libs)) before the first driver call (cudarc itself
//! panics when a library is missing), and every failure becomes a reason string
//! that [`Error::CudaUnavailable`] carries to the user.

use super::blas::Blas;
use super::calls::{ConvCall, GemmCall};
use super::dnn::Cudnn;
use super::libs::{self, CudaLib};
use super::nvrtc;
use super::runtime::{
    DeviceProperties, Func, FuncAttributes, LoadedModule, MallocError, Opaque, RtEvent, RtGraph,
    Runtime, StreamId, System, Workspaces, MAX_STREAMS,
};
use crate::backend::op::collective::{Collective, HostCollectives};
use crate::error::{Error, Result};
use cudarc::driver::{result as drv, sys, CudaContext, CudaStream};
use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

pub(crate) fn cuda_err(op: &'static str) -> impl Fn(drv::DriverError) -> Error {
    move |e| Error::Cuda {
        op,
        msg: e.to_string(),
    }
}

/// The oldest CUDA version whose driver ember runs on (the driver API it binds and
/// the NVRTC that compiles its kernels are CUDA 13.0's).
const MIN_DRIVER: (u32, u32) = (13, 0);

fn read_driver_version() -> std::result::Result<(u32, u32), String> {
    let mut v = 0i32;
    // SAFETY: the driver library is loaded (checked by the caller) and `v` is a
    // valid out-pointer.
    unsafe { sys::cuDriverGetVersion(&mut v) }
        .result()
        .map_err(|e| format!("cuDriverGetVersion failed: {e}"))?;
    Ok(((v / 1000) as u32, ((v % 1000) / 10) as u32))
}

/// Whether ember can run on the driver's `n` GPUs: NVRTC and cuBLAS load, and
/// NVRTC compiles for every GPU's architecture. Without this a machine with the
/// driver alone would pick `cuda:0` and fail at the first op instead of using
/// the CPU; with it, discovery says what is missing.
fn usable(n: usize) -> std::result::Result<(), String> {
    let cannot = |what: &str, why: String| {
        format!("the NVIDIA driver reports {n} GPU(s), but ember cannot {what}: {why}")
    };
    let compile = "compile its kernels for them";
    libs::ensure(CudaLib::Nvrtc).map_err(|e| cannot(compile, e))?;
    libs::ensure(CudaLib::Cublas).map_err(|e| cannot("multiply matrices on them (cuBLAS)", e))?;
    let supported = nvrtc::supported_archs().map_err(|e| cannot(compile, e.to_string()))?;
    let version = nvrtc::version().map_err(|e| cannot(compile, e.to_string()))?;
    for i in 0..n {
        let (major, minor) = DriverSystem
            .properties(i)
            .map_err(|e| cannot("read their properties", e.to_string()))?
            .compute_capability;
        nvrtc::target_arch(major * 10 + minor, &supported, version)
            .map_err(|e| cannot(compile, format!("cuda:{i}: {e}")))?;
    }
    Ok(())
}

/// GPUs as the driver finds them.
pub(crate) struct DriverSystem;

impl System for DriverSystem {
    fn discover(&self) -> std::result::Result<usize, String> {
        libs::ensure(CudaLib::Driver)?;
        drv::init().map_err(|e| {
            if e.0 == sys::CUresult::CUDA_ERROR_STUB_LIBRARY {
                // seen on a GPU machine whose LD_LIBRARY_PATH named the toolkit's
                // lib/stubs folder ahead of the driver's
                "cuInit failed: the libcuda.so.1 that was loaded is the CUDA toolkit's stub \
                 (from a folder named stubs), not the NVIDIA driver's; take that folder out of \
                 LD_LIBRARY_PATH, or point EMBER_CUDA_LIB_DIR at the driver's folder"
                    .to_string()
            } else {
                format!("cuInit failed: {e}")
            }
        })?;
        let (major, minor) = read_driver_version()?;
        if (major, minor) < MIN_DRIVER {
            return Err(format!(
                "the NVIDIA driver supports CUDA {major}.{minor}; ember needs a driver for CUDA \
                 {}.{} or newer (R580 or later): it loads CUDA {}.{} driver functions and \
                 runs kernels compiled by NVRTC {}.{}. Update the NVIDIA driver",
                MIN_DRIVER.0, MIN_DRIVER.1, MIN_DRIVER.0, MIN_DRIVER.1, MIN_DRIVER.0, MIN_DRIVER.1
            ));
        }
        let n = drv::device::get_count().map_err(|e| format!("cuDeviceGetCount failed: {e}"))?;
        if n <= 0 {
            return Err("the NVIDIA driver is installed but reports no GPU".into());
        }
        usable(n as usize)?;
        Ok(n as usize)
    }

    fn properties(&self, i: usize) -> Result<DeviceProperties> {
        let dev = drv::device::get(i as i32).map_err(cuda_err("cuDeviceGet"))?;
        let attr = |a: sys::CUdevice_attribute| -> Result<u32> {
            // SAFETY: `dev` is a valid device handle from cuDeviceGet.
            unsafe { drv::device::get_attribute(dev, a) }
                .map(|v| v as u32)
                .map_err(cuda_err("cuDeviceGetAttribute"))
        };
        use sys::CUdevice_attribute::*;
        Ok(DeviceProperties {
            ordinal: i,
            name: drv::device::get_name(dev).map_err(cuda_err("cuDeviceGetName"))?,
            compute_capability: (
                attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            ),
            multiprocessor_count: attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            max_threads_per_block: attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
            max_shared_memory_per_block: attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK)?
                as usize,
            max_shared_memory_per_block_optin: attr(
                CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )? as usize,
            warp_size: attr(CU_DEVICE_ATTRIBUTE_WARP_SIZE)?,
            // SAFETY: as above.
            total_memory: unsafe { drv::device::total_mem(dev) }
                .map_err(cuda_err("cuDeviceTotalMem"))?,
            l2_cache_size: attr(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as usize,
            clock_rate_khz: attr(CU_DEVICE_ATTRIBUTE_CLOCK_RATE)?,
            memory_bus_width_bits: attr(CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)?,
        })
    }

    fn driver_version(&self) -> Option<(u32, u32)> {
        libs::ensure(CudaLib::Driver).ok()?;
        drv::init().ok()?;
        read_driver_version().ok()
    }

    fn is_simulated(&self) -> bool {
        false
    }

    fn dnn(&self) -> std::result::Result<(), String> {
        super::dnn::library()
            .as_ref()
            .map(|_| ())
            .map_err(|e| e.clone())
    }

    fn open(&self, ordinal: usize) -> Result<Arc<dyn Runtime>> {
        Ok(Arc::new(Driver::new(ordinal)?))
    }
}

/// One GPU through the driver: its context and ember's streams on it.
pub(crate) struct Driver {
    ctx: Arc<CudaContext>,
    /// The streams made so far (`StreamId` indexes them), read without a lock
    /// at every launch.
    streams: Vec<AtomicPtr<sys::CUstream_st>>,
    /// The same streams, owned (created under this lock).
    owned: Mutex<Vec<Arc<CudaStream>>>,
    arch: u32,
    sm_count: u32,
    blas: Blas,
    dnn: Cudnn,
    /// The architecture NVRTC compiles for, decided once.
    compile_arch: OnceLock<std::result::Result<u32, String>>,
}

impl Driver {
    fn new(ordinal: usize) -> Result<Driver> {
        let ctx = CudaContext::new(ordinal).map_err(cuda_err("cuCtxCreate"))?;
        // ember orders its streams itself: the per-allocation events cudarc can
        // record are pure overhead here
        // SAFETY: no CudaSlice of cudarc's is used with this context.
        unsafe { ctx.disable_event_tracking() };
        // the default stream is a stream of ember's own, not the legacy NULL
        // stream (which would wait for, and hold up, every other stream)
        let stream = ctx.new_stream().map_err(cuda_err("cuStreamCreate"))?;
        let streams: Vec<AtomicPtr<sys::CUstream_st>> = (0..MAX_STREAMS)
            .map(|_| AtomicPtr::new(std::ptr::null_mut()))
            .collect();
        streams[0].store(stream.cu_stream(), Ordering::Release);
        let (major, minor) = ctx
            .compute_capability()
            .map_err(cuda_err("cuDeviceGetAttribute"))?;
        let sm_count = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(cuda_err("cuDeviceGetAttribute"))? as u32;
        Ok(Driver {
            ctx,
            streams,
            owned: Mutex::new(vec![stream]),
            arch: (major * 10 + minor) as u32,
            sm_count,
            blas: Blas::new(major as u32),
            dnn: Cudnn::default(),
            compile_arch: OnceLock::new(),
        })
    }

    /// The driver's handle of stream `s`. Every driver, cuBLAS and cuDNN call
    /// needs the context current on the calling thread ([`bind`]): a tensor may
    /// be used from a thread that never made it current (or that made another
    /// GPU's current since).
    ///
    /// [`bind`]: Runtime::bind
    fn cu_stream(&self, s: StreamId) -> Result<sys::CUstream> {
        let p = self
            .streams
            .get(s.0 as usize)
            .map_or(std::ptr::null_mut(), |p| p.load(Ordering::Acquire));
        if p.is_null() {
            return Err(Error::Cuda {
                op: "selecting a stream",
                msg: format!("stream {} was never created on this device", s.0),
            });
        }
        Ok(p)
    }

    /// The architecture NVRTC compiles this device's kernels for (its own where
    /// NVRTC supports it).
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
}

/// A driver event.
struct DriverEvent(sys::CUevent);
// SAFETY: a CUevent may be recorded, queried and destroyed from any thread.
unsafe impl Send for DriverEvent {}
// SAFETY: as above.
unsafe impl Sync for DriverEvent {}

/// An executable graph.
struct DriverGraph(sys::CUgraphExec);
// SAFETY: an executable graph may be launched and destroyed from any thread.
unsafe impl Send for DriverGraph {}
// SAFETY: as above.
unsafe impl Sync for DriverGraph {}

/// A loaded kernel: valid while its module stays loaded, which is for the life of
/// the process.
struct DriverFunc(sys::CUfunction);
// SAFETY: CUfunction handles may be used from any thread once the context is
// current; launching does not mutate the handle.
unsafe impl Send for DriverFunc {}
// SAFETY: as above.
unsafe impl Sync for DriverFunc {}

/// A loaded module (never unloaded).
struct DriverModule(sys::CUmodule);
// SAFETY: a module handle is only used under the device's module lock.
unsafe impl Send for DriverModule {}

impl LoadedModule for DriverModule {
    fn function(&self, name: &str) -> Result<Func> {
        let cname =
            CString::new(name).map_err(|_| Error::invalid("kernel", "NUL in kernel name"))?;
        // SAFETY: a loaded module that is never unloaded.
        unsafe { drv::module::get_function(self.0, cname) }
            .map(|f| Func::new(name, DriverFunc(f)))
            .map_err(|e| Error::Cuda {
                op: "cuModuleGetFunction",
                msg: format!("{name}: {e}"),
            })
    }
}

impl Runtime for Driver {
    fn sm_count(&self) -> u32 {
        self.sm_count
    }

    fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(cuda_err("cuCtxSetCurrent"))
    }

    fn malloc(&self, bytes: usize) -> std::result::Result<u64, MallocError> {
        let _ = self.ctx.bind_to_thread();
        // the caching allocator takes new segments while a graph is captured (its
        // private pool): cuMemAlloc is not stream work, and the relaxed mode lets
        // this thread call it without invalidating the capture (PyTorch's
        // allocator does the same)
        let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: swaps this thread's mode; restored below.
        let swapped = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }.result();
        // SAFETY: a plain allocation in the current context.
        let r = unsafe { drv::malloc_sync(bytes) }.map_err(|e| MallocError {
            out_of_memory: e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY,
            msg: e.to_string(),
        });
        if swapped.is_ok() {
            // SAFETY: puts back the mode swapped out above.
            let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
        }
        r
    }

    fn free(&self, ptr: u64) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: `ptr` came from malloc_sync and no queued work uses it.
        let _ = unsafe { drv::free_sync(ptr) };
    }

    fn mem_info(&self) -> Result<(usize, usize)> {
        self.ctx.mem_get_info().map_err(cuda_err("cuMemGetInfo"))
    }

    fn alloc_host(&self, bytes: usize) -> std::result::Result<*mut u8, String> {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: a plain allocation in the current context.
        unsafe { drv::malloc_host(bytes, 0) }
            .map(|p| p.cast())
            .map_err(|e| e.to_string())
    }

    unsafe fn free_host(&self, ptr: *mut u8, _bytes: usize) {
        let _ = self.ctx.bind_to_thread();
        let _ = drv::free_host(ptr.cast());
    }

    fn stream_create(&self) -> Result<StreamId> {
        let mut owned = self.owned.lock().unwrap_or_else(|p| p.into_inner());
        if owned.len() == MAX_STREAMS {
            return Err(Error::Cuda {
                op: "cuStreamCreate",
                msg: format!("a device has at most {MAX_STREAMS} of ember's streams"),
            });
        }
        let s = self.ctx.new_stream().map_err(cuda_err("cuStreamCreate"))?;
        let id = owned.len();
        self.streams[id].store(s.cu_stream(), Ordering::Release);
        owned.push(s);
        Ok(StreamId(id as u32))
    }

    fn stream_wait(&self, s: StreamId, e: &RtEvent) -> Result<()> {
        self.bind()?;
        // SAFETY: a live stream and a live event of this context.
        unsafe {
            drv::stream::wait_event(
                self.cu_stream(s)?,
                e.get::<DriverEvent>().0,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(cuda_err("cuStreamWaitEvent"))
    }

    fn stream_synchronize(&self, s: StreamId) -> Result<()> {
        let st = self.cu_stream(s)?;
        self.bind()?;
        // SAFETY: a live stream.
        unsafe { drv::stream::synchronize(st) }.map_err(cuda_err("cuStreamSynchronize"))
    }

    fn stream_query(&self, s: StreamId) -> Result<bool> {
        let st = self.cu_stream(s)?;
        self.bind()?;
        // SAFETY: a live stream.
        match unsafe { sys::cuStreamQuery(st) } {
            sys::cudaError_enum::CUDA_SUCCESS => Ok(true),
            sys::cudaError_enum::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(cuda_err("cuStreamQuery")(drv::DriverError(e))),
        }
    }

    unsafe fn htod(&self, s: StreamId, dst: u64, src: *const u8, bytes: usize) -> Result<()> {
        self.bind()?;
        sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), bytes, self.cu_stream(s)?)
            .result()
            .map_err(cuda_err("cuMemcpyHtoDAsync"))
    }

    unsafe fn dtoh(&self, s: StreamId, dst: *mut u8, src: u64, bytes: usize) -> Result<()> {
        self.bind()?;
        sys::cuMemcpyDtoHAsync_v2(dst.cast(), src, bytes, self.cu_stream(s)?)
            .result()
            .map_err(cuda_err("cuMemcpyDtoHAsync"))
    }

    unsafe fn dtod(&self, s: StreamId, dst: u64, src: u64, bytes: usize) -> Result<()> {
        self.bind()?;
        drv::memcpy_dtod_async(dst, src, bytes, self.cu_stream(s)?)
            .map_err(cuda_err("cuMemcpyDtoDAsync"))
    }

    fn synchronize(&self) -> Result<()> {
        // every stream of ember's in turn rather than cuCtxSynchronize, which is
        // not allowed while any stream of the context is captured (by any
        // thread); a stream under capture runs nothing to wait for
        self.bind()?;
        let n = self.owned.lock().unwrap_or_else(|p| p.into_inner()).len();
        for i in 0..n {
            let st = self.cu_stream(StreamId(i as u32))?;
            let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
            // SAFETY: a live stream and an out-parameter.
            unsafe { sys::cuStreamIsCapturing(st, &mut status) }
                .result()
                .map_err(cuda_err("cuStreamIsCapturing"))?;
            if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
                continue;
            }
            // SAFETY: a live stream.
            unsafe { drv::stream::synchronize(st) }.map_err(cuda_err("cuStreamSynchronize"))?;
        }
        Ok(())
    }

    fn event_create(&self, timing: bool) -> Result<RtEvent> {
        self.bind()?;
        let flags = if timing {
            sys::CUevent_flags::CU_EVENT_DEFAULT
        } else {
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        let ev = drv::event::create(flags).map_err(cuda_err("cuEventCreate"))?;
        Ok(RtEvent::new(DriverEvent(ev)))
    }

    fn event_record(&self, e: &mut RtEvent, s: StreamId) -> Result<()> {
        self.bind()?;
        // SAFETY: a live event and a live stream of the device.
        unsafe { drv::event::record(e.get::<DriverEvent>().0, self.cu_stream(s)?) }
            .map_err(cuda_err("cuEventRecord"))
    }

    fn event_query(&self, e: &RtEvent) -> Result<bool> {
        // SAFETY: a live event.
        match unsafe { drv::event::query(e.get::<DriverEvent>().0) } {
            Ok(()) => Ok(true),
            Err(drv::DriverError(sys::cudaError_enum::CUDA_ERROR_NOT_READY)) => Ok(false),
            Err(e) => Err(cuda_err("cuEventQuery")(e)),
        }
    }

    fn event_synchronize(&self, e: &RtEvent) -> Result<()> {
        // SAFETY: a live event.
        unsafe { drv::event::synchronize(e.get::<DriverEvent>().0) }
            .map_err(cuda_err("cuEventSynchronize"))
    }

    fn event_elapsed_ms(&self, start: &RtEvent, end: &RtEvent) -> Result<f32> {
        let (a, b) = (start.get::<DriverEvent>().0, end.get::<DriverEvent>().0);
        // SAFETY: both events are live and recorded.
        unsafe { drv::event::elapsed(a, b) }.map_err(cuda_err("cuEventElapsedTime"))
    }

    fn event_destroy(&self, e: RtEvent) {
        let _ = self.bind();
        // SAFETY: destroyed once; the driver defers destruction of pending events.
        let _ = unsafe { drv::event::destroy(e.into_inner::<DriverEvent>().0) };
    }

    fn load_module(
        &self,
        name: &str,
        source: &str,
        options: &[String],
    ) -> Result<Box<dyn LoadedModule>> {
        let (cubin, _) = nvrtc::cubin(name, source, self.compile_arch()?, options)?;
        self.bind()?;
        // SAFETY: `cubin` is a complete ELF image produced by NVRTC for this device.
        unsafe { drv::module::load_data(cubin.as_ptr().cast()) }
            .map(|m| Box::new(DriverModule(m)) as Box<dyn LoadedModule>)
            .map_err(cuda_err("cuModuleLoadData"))
    }

    fn param_sizes(&self, f: &Func) -> Result<Vec<usize>> {
        let f = f.get::<DriverFunc>().0;
        let mut sizes = Vec::new();
        loop {
            let (mut offset, mut size) = (0usize, 0usize);
            // SAFETY: a loaded function and two out-parameters.
            let r = unsafe { sys::cuFuncGetParamInfo(f, sizes.len(), &mut offset, &mut size) };
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

    fn func_attributes(&self, f: &Func) -> Result<FuncAttributes> {
        let f = f.get::<DriverFunc>().0;
        use sys::CUfunction_attribute_enum::*;
        let attr = |a| {
            // SAFETY: a loaded function; the attribute is read only.
            unsafe { drv::function::get_function_attribute(f, a) }
                .map(|v| v.max(0) as u32)
                .map_err(cuda_err("cuFuncGetAttribute"))
        };
        Ok(FuncAttributes {
            max_threads_per_block: attr(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
            registers: attr(CU_FUNC_ATTRIBUTE_NUM_REGS)?,
            static_shared_bytes: attr(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)? as usize,
        })
    }

    fn set_max_dynamic_shared(&self, f: &Func, bytes: u32) -> Result<()> {
        self.bind()?;
        let f = f.get::<DriverFunc>().0;
        // SAFETY: a loaded function; the driver checks the value against the device.
        unsafe {
            drv::function::set_function_attribute(
                f,
                sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
        }
        .map_err(cuda_err("cuFuncSetAttribute"))
    }

    unsafe fn launch(
        &self,
        s: StreamId,
        f: &Func,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared_mem: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        self.bind()?;
        let f = f.get::<DriverFunc>().0;
        drv::launch_kernel(f, grid, block, shared_mem, self.cu_stream(s)?, params)
            .map_err(cuda_err("cuLaunchKernel"))
    }

    fn capture_begin(&self, s: StreamId) -> Result<()> {
        let st = self.cu_stream(s)?;
        self.bind()?;
        // thread-local: other threads' work on other streams goes on meanwhile
        // SAFETY: a live stream of this context, not under capture (ember checks).
        unsafe {
            sys::cuStreamBeginCapture_v2(
                st,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        }
        .result()
        .map_err(cuda_err("cuStreamBeginCapture"))
    }

    fn capture_end(&self, s: StreamId) -> Result<RtGraph> {
        let st = self.cu_stream(s)?;
        self.bind()?;
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: the stream's capture was begun by this thread.
        unsafe { sys::cuStreamEndCapture(st, &mut graph) }
            .result()
            .map_err(cuda_err("cuStreamEndCapture"))?;
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: a graph just captured; it is not needed once instantiated.
        let made = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) }.result();
        // SAFETY: as above.
        let _ = unsafe { sys::cuGraphDestroy(graph) };
        made.map_err(cuda_err("cuGraphInstantiate"))?;
        Ok(RtGraph::new(DriverGraph(exec)))
    }

    fn graph_launch(&self, g: &RtGraph, s: StreamId) -> Result<()> {
        let st = self.cu_stream(s)?;
        self.bind()?;
        // SAFETY: a live executable graph of this context and a live stream.
        unsafe { sys::cuGraphLaunch(g.get::<DriverGraph>().0, st) }
            .result()
            .map_err(cuda_err("cuGraphLaunch"))
    }

    fn graph_destroy(&self, g: RtGraph) {
        let _ = self.bind();
        // SAFETY: destroyed once, after its launches (the caller waited for them).
        let _ = unsafe { sys::cuGraphExecDestroy(g.into_inner::<DriverGraph>().0) };
    }

    unsafe fn gemm(&self, s: StreamId, g: &GemmCall, ws: &dyn Workspaces) -> Result<()> {
        self.bind()?;
        self.blas.gemm(self.cu_stream(s)?, g, ws)
    }

    unsafe fn conv(&self, s: StreamId, c: &ConvCall) -> Result<()> {
        self.bind()?;
        self.dnn.conv(self.cu_stream(s)?, c)
    }

    unsafe fn sdpa(&self, s: StreamId, c: &super::dnn::sdpa::SdpaCall) -> Result<()> {
        self.bind()?;
        self.dnn.sdpa(self.cu_stream(s)?, c)
    }

    fn comm_unique_id(&self) -> Result<[u8; 128]> {
        // NCCL's first call initialises it on the current device: this one
        self.bind()?;
        let id = nccl_lib()?.unique_id()?;
        Ok(id.internal.map(|c| c as u8))
    }

    fn comm_init(
        &self,
        id: [u8; 128],
        world: usize,
        rank: usize,
        _host: Arc<dyn HostCollectives>,
    ) -> Result<Opaque> {
        self.bind()?;
        let id = super::nccl::UniqueId {
            internal: id.map(|b| b as std::ffi::c_char),
        };
        let comm = nccl_lib()?.init_rank(id, world, rank)?;
        Ok(Opaque::new(comm))
    }

    unsafe fn collective(&self, s: StreamId, comm: &Opaque, c: &Collective) -> Result<()> {
        self.bind()?;
        let stream = self.cu_stream(s)? as *mut std::ffi::c_void;
        nccl_lib()?.run(*comm.get::<usize>(), stream, c)
    }

    fn comm_check(&self, comm: &Opaque) -> Result<()> {
        nccl_lib()?.async_error(*comm.get::<usize>())
    }

    fn comm_destroy(&self, comm: Opaque, abort: bool) {
        if let (Ok(lib), Ok(())) = (nccl_lib(), self.bind()) {
            lib.destroy(comm.into_inner::<usize>(), abort);
        }
    }
}

/// NCCL, or an error that says where ember looked for it.
fn nccl_lib() -> Result<&'static super::nccl::Nccl> {
    super::nccl::library().as_ref().map_err(|why| Error::Cuda {
        op: "NCCL",
        msg: why.clone(),
    })
}
