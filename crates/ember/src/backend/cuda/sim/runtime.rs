//! The simulator's side of the runtime seam: simulated GPUs whose memory is host
//! memory, whose kernels are the same `.cu` sources compiled by the host's C++
//! compiler, and whose cuBLAS and cuDNN are references with the libraries'
//! contracts. Work is checked when it is queued (as the driver and the libraries
//! refuse bad calls) and runs later on its stream's thread ([`Queue`]), so the
//! host's waits, events, pinned copies and the ordering of streams by events are
//! exercised as on a GPU. Copies follow the driver's rules for host memory: from pageable
//! memory the source is taken at once, to pageable memory the copy is waited
//! for; to and from pinned blocks ([`alloc_host`](Runtime::alloc_host)) they run
//! in the stream's order.

use super::queue::Queue;
use super::{
    compile, conv_job, gemm_job, memcpy, properties, Job, SimFunc, SimMemory, SimModule, Work,
};
use crate::backend::cuda::calls::{ConvCall, GemmCall};
use crate::backend::cuda::runtime::{
    DeviceProperties, Func, FuncAttributes, LoadedModule, MallocError, Opaque, RtEvent, RtGraph,
    Runtime, StreamId, System, Workspaces, MAX_STREAMS,
};
use crate::backend::op::collective::{Collective, HostCollectives};
use crate::dtype::CpuData;
use crate::error::{Error, Result};
use std::collections::HashMap;
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
            ordinal,
            sm_count: properties(ordinal).multiprocessor_count,
            memory: Mutex::new(SimMemory::new()),
            streams: Mutex::new(vec![Queue::start(format!("ember-sim-cuda:{ordinal}"))?]),
            pinned: Mutex::new(Vec::new()),
            captures: Mutex::new(HashMap::new()),
        }))
    }
}

/// One simulated GPU.
struct Sim {
    ordinal: usize,
    sm_count: u32,
    memory: Mutex<SimMemory>,
    /// The device's streams (`StreamId` indexes them): the work queued on each
    /// runs on a thread of its own.
    streams: Mutex<Vec<Arc<Queue>>>,
    /// The host blocks of `alloc_host` (address, bytes): copies to and from them
    /// are queued like kernels; other host memory is copied at the call.
    pinned: Mutex<Vec<(usize, usize)>>,
    /// The streams being captured, by which thread, and the work captured so far
    /// on each.
    captures: Mutex<HashMap<StreamId, (std::thread::ThreadId, Vec<Work>)>>,
}

/// A captured graph: its work, in the order it was queued.
struct SimGraph(Vec<Work>);

/// The driver's refusal of an operation that a stream under capture cannot hold.
fn not_capturable(op: &'static str, what: &str) -> Error {
    Error::Cuda {
        op,
        msg: format!(
            "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: {what} cannot be captured (the capture \
             is invalidated)"
        ),
    }
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

    /// The queue of stream `s`.
    fn stream(&self, s: StreamId) -> Result<Arc<Queue>> {
        self.streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(s.0 as usize)
            .cloned()
            .ok_or_else(|| Error::Cuda {
                op: "selecting a stream",
                msg: format!("stream {} was never created on this device", s.0),
            })
    }

    /// Every stream, in the order they were made.
    fn all_streams(&self) -> Vec<Arc<Queue>> {
        self.streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Waits for the work of every stream, without reporting its errors (as
    /// cuMemFree waits for the device; the next wait reports them).
    fn drain_all(&self) {
        for q in self.all_streams() {
            q.drain();
        }
    }

    fn captures(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<StreamId, (std::thread::ThreadId, Vec<Work>)>> {
        self.captures.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An error when `s` is being captured: `op` (a host copy, an event, a wait)
    /// is not something a graph holds.
    fn not_capturing(&self, s: StreamId, op: &'static str, what: &str) -> Result<()> {
        if self.captures().contains_key(&s) {
            return Err(not_capturable(op, what));
        }
        Ok(())
    }

    /// Queues a job that runs once (a copy from or to the host, an event).
    fn queue(&self, s: StreamId, job: Job) -> Result<(Arc<Queue>, u64)> {
        let q = self.stream(s)?;
        let k = q.push(job);
        Ok((q, k))
    }

    /// Queues work that a graph may hold: captured when `s` is being captured.
    fn queue_work(&self, s: StreamId, work: Work) -> Result<()> {
        if let Some((_, captured)) = self.captures().get_mut(&s) {
            captured.push(work);
            return Ok(());
        }
        self.queue(s, Box::new(move || work())).map(|_| ())
    }
}

/// A simulated event: the stream and job that recorded it last (none before its
/// first record), and the host clock when that job ran (`None` until then).
struct SimEvent {
    queue: Option<Arc<Queue>>,
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
        self.0.function(name).map(|f| Func::new(name, f))
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
        self.drain_all();
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
        self.drain_all();
        self.pinned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|&(a, _)| a != ptr as usize);
        let layout = std::alloc::Layout::from_size_align(bytes, HOST_ALIGN)
            .expect("the layout it was allocated with");
        std::alloc::dealloc(ptr, layout);
    }

    fn stream_create(&self) -> Result<StreamId> {
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        if streams.len() == MAX_STREAMS {
            return Err(Error::Cuda {
                op: "cuStreamCreate",
                msg: format!("a device has at most {MAX_STREAMS} of ember's streams"),
            });
        }
        let id = streams.len();
        streams.push(Queue::start(format!(
            "ember-sim-cuda:{}-s{id}",
            self.ordinal
        ))?);
        Ok(StreamId(id as u32))
    }

    fn stream_wait(&self, s: StreamId, e: &RtEvent) -> Result<()> {
        self.not_capturing(s, "cuStreamWaitEvent", "a wait for another stream's event")?;
        let e = e.get::<SimEvent>();
        // waiting for an event never recorded waits for nothing (as on a GPU)
        if let Some(q) = e.queue.clone() {
            let k = e.job;
            self.queue(s, Box::new(move || q.wait_for(k)))?;
        }
        Ok(())
    }

    fn stream_synchronize(&self, s: StreamId) -> Result<()> {
        self.not_capturing(s, "cuStreamSynchronize", "a host wait")?;
        self.stream(s)?.wait_all()
    }

    fn stream_query(&self, s: StreamId) -> Result<bool> {
        let q = self.stream(s)?;
        q.check()?;
        let last = q.last();
        let done = q.is_done(last);
        // time passes: what was not done is let run, for the next query
        q.release(last);
        Ok(done)
    }

    unsafe fn htod(&self, s: StreamId, dst: u64, src: *const u8, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.not_capturing(s, "cuMemcpyHtoDAsync", "a copy from host memory")?;
        if self.is_pinned(src as usize, bytes) {
            let src = src as u64;
            // SAFETY: the caller keeps the pinned source untouched until the copy has
            // run, and `dst` holds `bytes`.
            self.queue(
                s,
                Box::new(move || {
                    unsafe { memcpy(dst, src, bytes) };
                    Ok(())
                }),
            )?;
        } else {
            // the driver stages pageable memory before the call returns
            let staged = std::slice::from_raw_parts(src, bytes).to_vec();
            self.queue(
                s,
                Box::new(move || {
                    // SAFETY: `dst` holds `bytes`; `staged` is this job's own.
                    unsafe { memcpy(dst, staged.as_ptr() as u64, bytes) };
                    Ok(())
                }),
            )?;
        }
        Ok(())
    }

    unsafe fn dtoh(&self, s: StreamId, dst: *mut u8, src: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.not_capturing(s, "cuMemcpyDtoHAsync", "a copy to host memory")?;
        let pinned = self.is_pinned(dst as usize, bytes);
        let dst = dst as u64;
        // SAFETY: `src` holds `bytes`; `dst` is not read before the copy has run
        // (for pageable memory, this call waits for it as the driver's does).
        let (q, k) = self.queue(
            s,
            Box::new(move || {
                unsafe { memcpy(dst, src, bytes) };
                Ok(())
            }),
        )?;
        if pinned {
            Ok(())
        } else {
            q.wait_for(k)
        }
    }

    unsafe fn dtod(&self, s: StreamId, dst: u64, src: u64, bytes: usize) -> Result<()> {
        if bytes > 0 {
            // SAFETY: both ranges lie in live device blocks (the caller's contract).
            self.queue_work(
                s,
                Arc::new(move || {
                    unsafe { memcpy(dst, src, bytes) };
                    Ok(())
                }),
            )?;
        }
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        let me = std::thread::current().id();
        if self.captures().values().any(|(t, _)| *t == me) {
            return Err(not_capturable(
                "cuCtxSynchronize",
                "a wait for the whole device by a thread capturing a stream",
            ));
        }
        // every stream, in the order they were made; the first error is returned
        let mut first = Ok(());
        for q in self.all_streams() {
            let r = q.wait_all();
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    fn event_create(&self, timing: bool) -> Result<RtEvent> {
        Ok(RtEvent::new(SimEvent {
            queue: None,
            job: 0,
            at: Arc::new(Mutex::new(None)),
            timing,
        }))
    }

    fn event_record(&self, e: &mut RtEvent, s: StreamId) -> Result<()> {
        self.not_capturing(s, "cuEventRecord", "an event (ember captures one stream)")?;
        let at = Arc::new(Mutex::new(None));
        let mark = at.clone();
        let (q, job) = self.queue(
            s,
            Box::new(move || {
                *mark.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
                Ok(())
            }),
        )?;
        let e = e.get_mut::<SimEvent>();
        e.queue = Some(q);
        e.job = job;
        e.at = at;
        Ok(())
    }

    fn event_query(&self, e: &RtEvent) -> Result<bool> {
        let e = e.get::<SimEvent>();
        let Some(q) = &e.queue else {
            return Ok(true);
        };
        q.check()?;
        let done = q.is_done(e.job);
        // time passes: the event's work is let run, for the next query
        q.release(e.job);
        Ok(done)
    }

    fn event_synchronize(&self, e: &RtEvent) -> Result<()> {
        let e = e.get::<SimEvent>();
        match &e.queue {
            Some(q) => q.wait_for(e.job),
            None => Ok(()),
        }
    }

    fn event_elapsed_ms(&self, start: &RtEvent, end: &RtEvent) -> Result<f32> {
        if !(start.get::<SimEvent>().timing && end.get::<SimEvent>().timing) {
            return Err(Error::Cuda {
                op: "cuEventElapsedTime",
                msg: "CUDA_ERROR_INVALID_HANDLE: an event was created without timing".into(),
            });
        }
        match (start.get::<SimEvent>().time(), end.get::<SimEvent>().time()) {
            (Some(a), Some(b)) => Ok(b.saturating_duration_since(a).as_secs_f32() * 1e3),
            _ => Err(Error::Cuda {
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
        s: StreamId,
        f: &Func,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared_mem: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let job = f
            .get::<SimFunc>()
            .launch_job(grid, block, shared_mem, params)?;
        self.queue_work(s, job)
    }

    fn capture_begin(&self, s: StreamId) -> Result<()> {
        self.stream(s)?;
        let mut c = self.captures();
        if c.contains_key(&s) {
            return Err(Error::Cuda {
                op: "cuStreamBeginCapture",
                msg: "CUDA_ERROR_ILLEGAL_STATE: the stream is already being captured".into(),
            });
        }
        c.insert(s, (std::thread::current().id(), Vec::new()));
        Ok(())
    }

    fn capture_end(&self, s: StreamId) -> Result<RtGraph> {
        match self.captures().remove(&s) {
            Some((_, work)) => Ok(RtGraph::new(SimGraph(work))),
            None => Err(Error::Cuda {
                op: "cuStreamEndCapture",
                msg: "CUDA_ERROR_ILLEGAL_STATE: the stream is not being captured".into(),
            }),
        }
    }

    fn graph_launch(&self, g: &RtGraph, s: StreamId) -> Result<()> {
        self.not_capturing(
            s,
            "cuGraphLaunch",
            "a graph launch (graphs do not nest here)",
        )?;
        let q = self.stream(s)?;
        for w in &g.get::<SimGraph>().0 {
            let w = w.clone();
            q.push(Box::new(move || w()));
        }
        Ok(())
    }

    fn graph_destroy(&self, _g: RtGraph) {}

    unsafe fn gemm(&self, s: StreamId, g: &GemmCall, _ws: &dyn Workspaces) -> Result<()> {
        let job = gemm_job(g)?;
        self.queue_work(s, job)
    }

    unsafe fn conv(&self, s: StreamId, c: &ConvCall) -> Result<()> {
        let job = conv_job(c)?;
        self.queue_work(s, job)
    }

    unsafe fn sdpa(
        &self,
        s: StreamId,
        c: &crate::backend::cuda::dnn::sdpa::SdpaCall,
    ) -> Result<()> {
        let job = super::sdpa::sdpa_job(c)?;
        self.queue_work(s, job)
    }

    fn comm_unique_id(&self) -> Result<[u8; 128]> {
        // the host side connects the ranks; the id only tells communicators apart
        let mut id = [0u8; 128];
        id.iter_mut().for_each(|b| *b = rand::random());
        Ok(id)
    }

    fn comm_init(
        &self,
        _id: [u8; 128],
        _world: usize,
        _rank: usize,
        host: Arc<dyn HostCollectives>,
    ) -> Result<Opaque> {
        Ok(Opaque::new(SimComm {
            host,
            failed: Arc::new(Mutex::new(None)),
        }))
    }

    unsafe fn collective(&self, s: StreamId, comm: &Opaque, c: &Collective) -> Result<()> {
        self.not_capturing(s, c.kind.name(), "a collective between processes")?;
        let host = comm.get::<SimComm>().host.clone();
        let failed = comm.get::<SimComm>().failed.clone();
        let c = *c;
        let (n_in, n_out) = c.sizes(host.world());
        let job: Job = Box::new(move || {
            let mut input = CpuData::zeros(c.dtype, n_in);
            // SAFETY: `c.src` holds `n_in` elements of the dtype (the caller's
            // contract), whose bytes are valid values of it
            unsafe {
                let bytes = input.as_bytes_mut();
                memcpy(bytes.as_mut_ptr() as u64, c.src, bytes.len());
            }
            // the exchange runs without the simulator's lock: the other ranks'
            // streams (threads of this process, in tests) run meanwhile. Its
            // failure is the communicator's (as NCCL reports it), not the device's
            let out = match host.run(c.kind, input) {
                Ok(out) => out,
                Err(e) => {
                    let mut f = failed.lock().unwrap_or_else(|p| p.into_inner());
                    f.get_or_insert(e.to_string());
                    return Ok(());
                }
            };
            if out.len() != n_out || out.dtype() != c.dtype {
                return Err(Error::Cuda {
                    op: c.kind.name(),
                    msg: format!(
                        "the host side returned {} {} elements, {n_out} {} were due",
                        out.len(),
                        out.dtype(),
                        c.dtype
                    ),
                });
            }
            let bytes = out.as_bytes();
            // SAFETY: `c.dst` holds `n_out` elements (the caller's contract)
            unsafe { memcpy(c.dst, bytes.as_ptr() as u64, bytes.len()) };
            Ok(())
        });
        // a GPU runs NCCL's kernels as soon as their turn comes, not when the host
        // waits: the other ranks may be waiting for this one
        let (q, k) = self.queue(s, job)?;
        q.release(k);
        Ok(())
    }

    fn comm_check(&self, comm: &Opaque) -> Result<()> {
        match comm
            .get::<SimComm>()
            .failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            Some(why) => Err(Error::Cuda {
                op: "an NCCL call queued before",
                msg: why.clone(),
            }),
            None => Ok(()),
        }
    }

    fn comm_destroy(&self, _comm: Opaque, _abort: bool) {}
}

/// A simulated communicator: its calls go through the host's collectives, and
/// the first failure among them is kept for [`Runtime::comm_check`].
struct SimComm {
    host: Arc<dyn HostCollectives>,
    failed: Arc<Mutex<Option<String>>>,
}
