//! The simulator's side of the runtime seam: simulated GPUs whose memory is host
//! memory, whose kernels are the same `.cu` sources compiled by the host's C++
//! compiler, and whose cuBLAS and cuDNN are references with the libraries'
//! contracts. Work runs before the call that queues it returns, under one lock, so
//! every event is done as soon as it is recorded.

use super::{compile, conv, gemm, memcpy, properties, SimFunc, SimMemory, SimModule};
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
        }))
    }
}

/// One simulated GPU.
struct Sim {
    sm_count: u32,
    memory: Mutex<SimMemory>,
}

/// A simulated event: the host clock when it was last recorded (the work queued
/// before it was done by then).
struct SimEvent(Instant);

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
        Ok(ptr)
    }

    unsafe fn free_host(&self, ptr: *mut u8, bytes: usize) {
        let layout = std::alloc::Layout::from_size_align(bytes, HOST_ALIGN)
            .expect("the layout it was allocated with");
        std::alloc::dealloc(ptr, layout);
    }

    unsafe fn htod(&self, dst: u64, src: *const u8, bytes: usize) -> Result<()> {
        memcpy(dst, src as u64, bytes);
        Ok(())
    }

    unsafe fn dtoh(&self, dst: *mut u8, src: u64, bytes: usize) -> Result<()> {
        memcpy(dst as u64, src, bytes);
        Ok(())
    }

    unsafe fn dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        if bytes > 0 {
            memcpy(dst, src, bytes);
        }
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        // simulated work is done when its call returns
        Ok(())
    }

    fn event_create(&self, _timing: bool) -> Result<RtEvent> {
        Ok(RtEvent::new(SimEvent(Instant::now())))
    }

    fn event_record(&self, e: &mut RtEvent) -> Result<()> {
        e.get_mut::<SimEvent>().0 = Instant::now();
        Ok(())
    }

    fn event_done(&self, _e: &RtEvent) -> bool {
        true
    }

    fn event_synchronize(&self, _e: &RtEvent) -> Result<()> {
        Ok(())
    }

    fn event_elapsed_ms(&self, start: &RtEvent, end: &RtEvent) -> Result<f32> {
        let (a, b) = (start.get::<SimEvent>().0, end.get::<SimEvent>().0);
        Ok(b.saturating_duration_since(a).as_secs_f32() * 1e3)
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
        f.get::<SimFunc>().launch(grid, block, shared_mem, params)
    }

    unsafe fn gemm(&self, g: &GemmCall, _ws: &dyn Workspaces) -> Result<()> {
        gemm(g)
    }

    unsafe fn conv(&self, c: &ConvCall, _ws: &dyn Workspaces) -> Result<()> {
        conv(c)
    }
}
