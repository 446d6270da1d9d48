//! The simulator's side of the runtime seam: simulated GPUs whose memory is host
//! memory, whose kernels are the same `.cu` sources compiled by the host's C++
//! compiler, and whose cuBLAS and cuDNN are references with the libraries'
//! contracts. Work is checked when it is queued (as the driver and the libraries
//! refuse bad calls) and runs later on the device's stream thread
//! ([`Queue`]), so the host's waits, events and pinned copies are exercised as
//! on a GPU. Copies follow the driver's rules for host memory: from pageable
//! memory the source is taken at once, to pageable memory the copy is waited
//! for; to and from pinned blocks ([`alloc_host`](Runtime::alloc_host)) they run
//! in the stream's order.

use super::queue::Queue;
use super::{compile, conv_job, gemm_job, memcpy, properties, Job, SimFunc, SimMemory, SimModule};
use crate::backend::cuda::calls::{ConvCall, GemmCall};
use crate::backend::cuda::runtime::{
    DeviceProperties, Func, FuncAttributes, LoadedModule, MallocError, RtEvent, Runtime, System,
    Workspaces,
};
use crate::Result;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// `n` simulated GPUs.
pub(crate) struct SimSystem {
    n: usize,
}

impl SimSystem {
    pub(crate) fn new(n: usize) -> SimSystem {
        SimSystem { n }
    }
}

impl System for SimSystem {
    fn discover(&self) -> std::result::Result<usize, String> {
        Ok(self.n)
    }

    fn properties(&self, i: usize) -> Result<DeviceProperties> {
        Ok(properties(i))
    }

    fn driver_version(&self) -> Option<(u32, u32)> {
        None
    }

    fn is_simulated(&self) -> bool {
        true
    }

    fn dnn(&self) -> std::result::Result<(), String> {
        // the simulator's reference stands in for cuDNN
        Ok(())
    }

    fn open(&self, ordinal: usize) -> Result<Arc<dyn Runtime>> {
        Ok(Arc::new(Sim {
            sm_count: properties(ordinal).multiprocessor_count,
            memory: Mutex::new(SimMemory::new()),
            stream: Queue::start(format!("ember-sim-cuda:{ordinal}"))?,
            pinned: Mutex::new(Vec::new()),
        }))
    }
}

/// One simulated GPU.
struct Sim {
    sm_count: u32,
    memory: Mutex<SimMemory>,
    /// The device's stream: work queued here runs on a thread of its own.
    stream: Arc<Queue>,
    /// The host blocks of `alloc_host` (address, bytes): copies to and from them
    /// are queued like kernels; other host memory is copied at the call.
    pinned: Mutex<Vec<(usize, usize)>>,
}

impl Sim {
    /// `true` when `[ptr, ptr + bytes)` lies in one pinned block.
    fn is_pinned(&self, ptr: usize, bytes: usize) -> bool {
        self.pinned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|&(a, n)| ptr >= a && ptr + bytes <= a + n)
    }

    fn queue(&self, job: Job) -> u64 {
        self.stream.push(job)
    }
}

/// A simulated event: the job that records it, and the host clock when that job
/// ran (`None` until then).
struct SimEvent {
    job: u64,
    at: Arc<Mutex<Option<Instant>>>,
    /// Created for timing (`cuEventElapsedTime` refuses other events).
    timing: bool,
}

impl SimEvent {
    fn time(&self) -> Option<Instant> {
        *self.at.lock().unwrap_or_else(|p| p.into_inner())
    }
}

struct SimModuleHandle(Arc<SimModule>);

impl LoadedModule for SimModuleHandle {
    fn function(&self, name: &str) -> Result<Func> {
        self.0.function(name).map(Func::new)
    }
}

/// The alignment of simulated pinned blocks.
const HOST_ALIGN: usize = 4096;

impl Runtime for Sim {
    fn sm_count(&self) -> u32 {
        self.sm_count
    }

    fn bind(&self) -> Result<()> {
        Ok(())
    }

    fn malloc(&self, bytes: usize) -> std::result::Result<u64, MallocError> {
        let mut m = self.memory.lock().unwrap_or_else(|p| p.into_inner());
        m.malloc(bytes).map_err(|_| MallocError {
            out_of_memory: true,
            msg: String::new(),
        })
    }

    fn free(&self, ptr: u64) {
        // cuMemFree waits for the device first (errors stay for the next wait)
        self.stream.drain();
        self.memory
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .free(ptr)
    }

    fn mem_info(&self) -> Result<(usize, usize)> {
        Ok(self
            .memory
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .mem_info())
    }

    fn alloc_host(&self, bytes: usize) -> std::result::Result<*mut u8, String> {
        let layout =
            std::alloc::Layout::from_size_align(bytes, HOST_ALIGN).map_err(|e| e.to_string())?;
        // SAFETY: a non-zero size (pinned blocks are at least 64 KiB) and a valid
        // alignment.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return Err("out of host memory".into());
        }
        self.pinned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((ptr as usize, bytes));
        Ok(ptr)
    }

    unsafe fn free_host(&self, ptr: *mut u8, bytes: usize) {
        // cuMemFreeHost waits for the device first
        self.stream.drain();
        self.pinned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|&(a, _)| a != ptr as usize);
        let layout = std::alloc::Layout::from_size_align(bytes, HOST_ALIGN)
            .expect("the layout it was allocated with");
        std::alloc::dealloc(ptr, layout);
    }

    unsafe fn htod(&self, dst: u64, src: *const u8, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        if self.is_pinned(src as usize, bytes) {
            let src = src as u64;
            // SAFETY: the caller keeps the pinned source untouched until the copy has
            // run, and `dst` holds `bytes`.
            self.queue(Box::new(move || {
                unsafe { memcpy(dst, src, bytes) };
                Ok(())
            }));
        } else {
            // the driver stages pageable memory before the call returns
            let staged = std::slice::from_raw_parts(src, bytes).to_vec();
            self.queue(Box::new(move || {
                // SAFETY: `dst` holds `bytes`; `staged` is this job's own.
                unsafe { memcpy(dst, staged.as_ptr() as u64, bytes) };
                Ok(())
            }));
        }
        Ok(())
    }

    unsafe fn dtoh(&self, dst: *mut u8, src: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let pinned = self.is_pinned(dst as usize, bytes);
        let dst = dst as u64;
        // SAFETY: `src` holds `bytes`; `dst` is not read before the copy has run
        // (for pageable memory, this call waits for it as the driver's does).
        let k = self.queue(Box::new(move || {
            unsafe { memcpy(dst, src, bytes) };
            Ok(())
        }));
        if pinned {
            Ok(())
        } else {
            self.stream.wait_for(k)
        }
    }

    unsafe fn dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        if bytes > 0 {
            // SAFETY: both ranges lie in live device blocks (the caller's contract).
            self.queue(Box::new(move || {
                unsafe { memcpy(dst, src, bytes) };
                Ok(())
            }));
        }
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        self.stream.wait_all()
    }

    fn event_create(&self, timing: bool) -> Result<RtEvent> {
        Ok(RtEvent::new(SimEvent {
            job: 0,
            at: Arc::new(Mutex::new(None)),
            timing,
        }))
    }

    fn event_record(&self, e: &mut RtEvent) -> Result<()> {
        let at = Arc::new(Mutex::new(None));
        let mark = at.clone();
        let job = self.queue(Box::new(move || {
            *mark.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
            Ok(())
        }));
        let e = e.get_mut::<SimEvent>();
        e.job = job;
        e.at = at;
        Ok(())
    }

    fn event_query(&self, e: &RtEvent) -> Result<bool> {
        self.stream.check()?;
        Ok(self.stream.is_done(e.get::<SimEvent>().job))
    }

    fn event_synchronize(&self, e: &RtEvent) -> Result<()> {
        self.stream.wait_for(e.get::<SimEvent>().job)
    }

    fn event_elapsed_ms(&self, start: &RtEvent, end: &RtEvent) -> Result<f32> {
        if !(start.get::<SimEvent>().timing && end.get::<SimEvent>().timing) {
            return Err(crate::Error::Cuda {
                op: "cuEventElapsedTime",
                msg: "CUDA_ERROR_INVALID_HANDLE: an event was created without timing".into(),
            });
        }
        match (start.get::<SimEvent>().time(), end.get::<SimEvent>().time()) {
            (Some(a), Some(b)) => Ok(b.saturating_duration_since(a).as_secs_f32() * 1e3),
            _ => Err(crate::Error::Cuda {
                op: "cuEventElapsedTime",
                msg: "CUDA_ERROR_NOT_READY: an event has not been recorded or has not \
                      completed"
                    .into(),
            }),
        }
    }

    fn event_destroy(&self, _e: RtEvent) {}

    fn load_module(
        &self,
        name: &str,
        source: &str,
        options: &[String],
    ) -> Result<Box<dyn LoadedModule>> {
        Ok(Box::new(SimModuleHandle(compile(name, source, options)?)))
    }

    fn param_sizes(&self, f: &Func) -> Result<Vec<usize>> {
        Ok(f.get::<SimFunc>().param_sizes())
    }

    fn func_attributes(&self, f: &Func) -> Result<FuncAttributes> {
        // no registers here; static __shared__ arrays are not measured either
        Ok(FuncAttributes {
            max_threads_per_block: f.get::<SimFunc>().max_threads,
            registers: 0,
            static_shared_bytes: 0,
        })
    }

    fn set_max_dynamic_shared(&self, f: &Func, bytes: u32) -> Result<()> {
        f.get::<SimFunc>().set_max_dynamic_shared(bytes)
    }

    unsafe fn launch(
        &self,
        f: &Func,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared_mem: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let job = f
            .get::<SimFunc>()
            .launch_job(grid, block, shared_mem, params)?;
        self.queue(job);
        Ok(())
    }

    unsafe fn gemm(&self, g: &GemmCall, _ws: &dyn Workspaces) -> Result<()> {
        let job = gemm_job(g)?;
        self.queue(job);
        Ok(())
    }

    unsafe fn conv(&self, c: &ConvCall, _ws: &dyn Workspaces) -> Result<()> {
        let job = conv_job(c)?;
        self.queue(job);
        Ok(())
    }
}
