//! The seam between ember's CUDA code and what executes it: the NVIDIA driver
//! (with cuBLAS and cuDNN) or ember's simulator, chosen once per process by
//! [`system`](super::discover::system). Everything above this file (the device, the caching allocator, the
//! pinned copies, the kernel launches of `ops`) talks to a [`Runtime`] and never
//! asks which one it is.
//!
//! A runtime hands out opaque handles (loaded modules, kernel functions, events)
//! and is the only code that looks inside them.

use super::calls::{ConvCall, GemmCall};
use crate::backend::op::collective::{Collective, HostCollectives};
use crate::error::Result;
use std::any::Any;
use std::ffi::c_void;
use std::sync::Arc;

/// What `torch.cuda.get_device_properties(i)` reports, and a little more.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceProperties {
    pub ordinal: usize,
    pub name: String,
    /// Compute capability (major, minor), e.g. (9, 0) for an H100.
    pub compute_capability: (u32, u32),
    pub multiprocessor_count: u32,
    pub max_threads_per_block: u32,
    /// Shared memory a block may use without asking (48 KiB on every GPU since Volta).
    pub max_shared_memory_per_block: usize,
    /// Shared memory a block may use once a kernel opts in (`cudaFuncSetAttribute`
    /// with the maximum dynamic size): 227 KiB on Hopper, 163 KiB on an A100.
    pub max_shared_memory_per_block_optin: usize,
    pub warp_size: u32,
    pub total_memory: usize,
    pub l2_cache_size: usize,
    pub clock_rate_khz: u32,
    pub memory_bus_width_bits: u32,
}

/// How GPUs are found and opened: the driver's way or the simulator's.
pub(crate) trait System: Send + Sync {
    /// The number of usable GPUs, or why there is none.
    fn discover(&self) -> std::result::Result<usize, String>;
    /// What `torch.cuda.get_device_properties(i)` reports (`i` exists).
    fn properties(&self, i: usize) -> Result<DeviceProperties>;
    /// The CUDA version the driver supports; `None` without one (or simulated).
    fn driver_version(&self) -> Option<(u32, u32)>;
    /// `true` for the simulator (reported to users; nothing in ember branches on it).
    fn is_simulated(&self) -> bool;
    /// Whether convolutions can go to cuDNN (or the simulator's stand-in for it),
    /// or why not.
    fn dnn(&self) -> std::result::Result<(), String>;
    /// The runtime of GPU `ordinal` (one context; its default stream made).
    fn open(&self, ordinal: usize) -> Result<Arc<dyn Runtime>>;
}

/// A device allocation that failed: out of memory (the caching allocator then
/// frees its cache and retries) or another error of the runtime's.
#[derive(Debug)]
pub(crate) struct MallocError {
    pub out_of_memory: bool,
    pub msg: String,
}

/// Device memory for library calls' own workspaces (cuBLAS's per stream), and a
/// way to make room for them in ember's caching allocator.
pub(crate) trait Workspaces {
    /// Returns the allocator's cached blocks to the runtime, for a library whose own
    /// allocation failed.
    fn release_cached(&self);
    /// Device memory outside the caching allocator, kept for the process (a
    /// library's per-stream workspace).
    fn device_alloc(&self, bytes: usize) -> Result<u64>;
}

/// A stream of one device: work queued on it runs in order; work on two streams
/// may overlap unless an event orders it ([`Runtime::stream_wait`]). Stream 0 is
/// the device's default (ember's own stream, not the driver's legacy NULL
/// stream, which would serialise with every other); others come from
/// [`Runtime::stream_create`] and live as long as the process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct StreamId(pub u32);

/// The most streams one device has: the default, a pool of 32 for users (PyTorch
/// keeps 32 per priority and hands them out in turn), the copy stream and the
/// capture stream.
pub(crate) const MAX_STREAMS: usize = 35;

/// One GPU: its context, its streams, and what runs there. Work is queued in order
/// on a stream; copies to pageable host memory and the synchronisations wait for it.
pub(crate) trait Runtime: Send + Sync {
    /// The number of multiprocessors.
    fn sm_count(&self) -> u32;
    /// Makes the device's context current on the calling thread (cheap when it is).
    fn bind(&self) -> Result<()>;

    /// A new device allocation of `bytes`.
    fn malloc(&self, bytes: usize) -> std::result::Result<u64, MallocError>;
    /// Frees an allocation of [`malloc`](Self::malloc) no queued work uses.
    fn free(&self, ptr: u64);
    /// (free, total) bytes of device memory.
    fn mem_info(&self) -> Result<(usize, usize)>;
    /// Page-locked host memory of `bytes` for staging copies.
    fn alloc_host(&self, bytes: usize) -> std::result::Result<*mut u8, String>;
    /// Frees a block of [`alloc_host`](Self::alloc_host) no queued copy uses.
    ///
    /// # Safety
    /// `ptr` came from `alloc_host(bytes)` and is freed once.
    unsafe fn free_host(&self, ptr: *mut u8, bytes: usize);

    /// A new stream (non-blocking: it never waits for the legacy NULL stream).
    fn stream_create(&self) -> Result<StreamId>;
    /// Makes work queued on `s` from now on wait until `e`'s work has finished,
    /// without making the host wait.
    fn stream_wait(&self, s: StreamId, e: &RtEvent) -> Result<()>;
    /// Waits until the work queued on `s` has finished.
    fn stream_synchronize(&self, s: StreamId) -> Result<()>;
    /// `true` when the work queued on `s` has finished, without waiting.
    fn stream_query(&self, s: StreamId) -> Result<bool>;

    /// Queues a copy of `bytes` from host `src` to device `dst` on `s`.
    ///
    /// # Safety
    /// `src` holds `bytes` (pinned, or the driver stages it) and stays untouched
    /// until the copy has run; `dst` holds `bytes`.
    unsafe fn htod(&self, s: StreamId, dst: u64, src: *const u8, bytes: usize) -> Result<()>;
    /// Queues a copy of `bytes` from device `src` to host `dst` on `s`.
    ///
    /// # Safety
    /// `dst` holds `bytes` and is not read before the copy has run; `src` holds
    /// `bytes`.
    unsafe fn dtoh(&self, s: StreamId, dst: *mut u8, src: u64, bytes: usize) -> Result<()>;
    /// Queues a copy between two device ranges on `s`.
    ///
    /// # Safety
    /// Both ranges lie within live allocations of at least `bytes`.
    unsafe fn dtod(&self, s: StreamId, dst: u64, src: u64, bytes: usize) -> Result<()>;
    /// Waits until all work queued on every stream of the device has finished.
    fn synchronize(&self) -> Result<()>;

    /// A new event (`timing` for elapsed-time queries).
    fn event_create(&self, timing: bool) -> Result<RtEvent>;
    /// Records `e` on stream `s` now.
    fn event_record(&self, e: &mut RtEvent, s: StreamId) -> Result<()>;
    /// `true` once the work queued before the last record of `e` has finished,
    /// `false` while it runs; an error of that work (the context's sticky error
    /// on a GPU) as an error.
    fn event_query(&self, e: &RtEvent) -> Result<bool>;
    /// Waits for the work queued before the last record of `e`.
    fn event_synchronize(&self, e: &RtEvent) -> Result<()>;
    /// Milliseconds of device time from `start` to `end` (both recorded, done).
    fn event_elapsed_ms(&self, start: &RtEvent, end: &RtEvent) -> Result<f32>;
    /// Destroys an event (the runtime defers it while the event is pending).
    fn event_destroy(&self, e: RtEvent);

    /// Compiles `source` for this device (through the caches) and loads it; `name`
    /// names the module in messages and cache files.
    fn load_module(
        &self,
        name: &str,
        source: &str,
        options: &[String],
    ) -> Result<Box<dyn LoadedModule>>;
    /// The byte sizes of a kernel's parameters, in order.
    fn param_sizes(&self, f: &Func) -> Result<Vec<usize>>;
    /// What `f`'s compiled code allows.
    fn func_attributes(&self, f: &Func) -> Result<FuncAttributes>;
    /// Lets `f` use up to `bytes` of dynamic shared memory per block (the opt-in
    /// beyond 48 KiB; `bytes` plus its static shared memory within the device's
    /// opt-in limit).
    fn set_max_dynamic_shared(&self, f: &Func, bytes: u32) -> Result<()>;
    /// Queues `f` on stream `s`.
    ///
    /// # Safety
    /// `params` point at values matching the kernel's parameter list, and every
    /// device pointer among them is valid for what the kernel accesses.
    unsafe fn launch(
        &self,
        s: StreamId,
        f: &Func,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared_mem: u32,
        params: &mut [*mut c_void],
    ) -> Result<()>;

    /// Starts capturing the work queued on `s` into a graph instead of running it
    /// (`cuStreamBeginCapture`); only this thread's calls may capture.
    fn capture_begin(&self, s: StreamId) -> Result<()>;
    /// Ends the capture on `s` and returns its work as a graph ready to launch.
    fn capture_end(&self, s: StreamId) -> Result<RtGraph>;
    /// Queues the work of `g` on `s` (`cuGraphLaunch`).
    fn graph_launch(&self, g: &RtGraph, s: StreamId) -> Result<()>;
    /// Destroys a graph whose launches have finished.
    fn graph_destroy(&self, g: RtGraph);

    /// Queues a strided-batched GEMM (cuBLAS's contract) on `s`.
    ///
    /// # Safety
    /// The pointers, leading dimensions and strides of `g` describe live device
    /// memory holding every element they address.
    unsafe fn gemm(&self, s: StreamId, g: &GemmCall, ws: &dyn Workspaces) -> Result<()>;
    /// Queues a convolution pass (cuDNN's contract) on `s`.
    ///
    /// # Safety
    /// `c.x`, `c.w` and `c.y` address dense device arrays of the sizes of
    /// `c.geom`, and `c.workspace` one of `c.workspace_bytes` (the pass's scratch
    /// memory, taken from the caching allocator by the caller).
    unsafe fn conv(&self, s: StreamId, c: &ConvCall) -> Result<()>;
    /// Queues an attention pass through cuDNN's fused engines on `s` (on the
    /// simulator, a reference with the same contract); an error where there is
    /// no engine for it (the caller runs ember's kernels).
    ///
    /// # Safety
    /// `c`'s addresses hold its geometry's operands and results, and its
    /// workspace `c.workspace_bytes` bytes.
    unsafe fn sdpa(&self, s: StreamId, c: &super::dnn::sdpa::SdpaCall) -> Result<()>;

    /// A new communicator's id (NCCL's `ncclGetUniqueId`), made by rank 0 and
    /// shared with the other ranks.
    fn comm_unique_id(&self) -> Result<[u8; 128]>;
    /// Joins communicator `id` as `rank` of `world` on this device
    /// (`ncclCommInitRank`; blocks until every rank has joined). A simulator serves
    /// the communicator's calls through `host`; the driver does not use it.
    fn comm_init(
        &self,
        id: [u8; 128],
        world: usize,
        rank: usize,
        host: Arc<dyn HostCollectives>,
    ) -> Result<Opaque>;
    /// Queues collective `c` of communicator `comm` on `s`.
    ///
    /// # Safety
    /// `c.src` and `c.dst` address device arrays of this device holding the
    /// elements `c.sizes` gives, alive until `s` has run the call.
    unsafe fn collective(&self, s: StreamId, comm: &Opaque, c: &Collective) -> Result<()>;
    /// The first failure of the communicator's calls run so far
    /// (`ncclCommGetAsyncError`): a communicator's failure is its own, not the
    /// device's.
    fn comm_check(&self, comm: &Opaque) -> Result<()>;
    /// Frees a communicator (`abort`: stopping its calls in flight first).
    fn comm_destroy(&self, comm: Opaque, abort: bool);
}

/// What the compiled code of one kernel allows (`cuFuncGetAttribute`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FuncAttributes {
    /// The most threads a block of this kernel may have: the device's limit, or
    /// less where its register use (or `__launch_bounds__`) does not allow more.
    pub max_threads_per_block: u32,
    /// Registers per thread.
    pub registers: u32,
    /// Bytes of statically declared `__shared__` memory per block.
    pub static_shared_bytes: usize,
}

/// A compiled module loaded on one device.
pub(crate) trait LoadedModule: Send {
    /// The kernel `name` (an `extern "C" __global__` function).
    fn function(&self, name: &str) -> Result<Func>;
}

/// A kernel function of one runtime (opaque outside it), with its name (what the
/// profiler's records list).
#[derive(Clone)]
pub(crate) struct Func(Arc<dyn Any + Send + Sync>, Arc<str>);

impl Func {
    pub(crate) fn new<T: Any + Send + Sync>(name: &str, f: T) -> Func {
        Func(Arc::new(f), Arc::from(name))
    }

    /// The kernel's name in its module.
    pub(crate) fn name(&self) -> &Arc<str> {
        &self.1
    }

    /// The runtime's own view of the function.
    pub(crate) fn get<T: Any>(&self) -> &T {
        self.0
            .downcast_ref()
            .expect("a kernel function of the runtime that loaded it")
    }
}

/// A handle of one runtime (an event, a graph), opaque outside it.
pub(crate) struct Opaque(Box<dyn Any + Send + Sync>);

/// An event of one runtime.
pub(crate) type RtEvent = Opaque;
/// A captured graph of one runtime, ready to launch.
pub(crate) type RtGraph = Opaque;

impl Opaque {
    pub(crate) fn new<T: Any + Send + Sync>(e: T) -> Opaque {
        Opaque(Box::new(e))
    }

    pub(crate) fn get<T: Any>(&self) -> &T {
        self.0
            .downcast_ref()
            .expect("a handle of the runtime that made it")
    }

    pub(crate) fn get_mut<T: Any>(&mut self) -> &mut T {
        self.0
            .downcast_mut()
            .expect("a handle of the runtime that made it")
    }

    pub(crate) fn into_inner<T: Any>(self) -> T {
        match self.0.downcast() {
            Ok(e) => *e,
            Err(_) => panic!("a handle of the runtime that made it"),
        }
    }
}
