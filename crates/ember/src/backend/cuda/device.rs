// Over 800 lines: one GPU's state behind its locks (streams, allocator, modules, staging, capture), which its methods use together.
//! One GPU as ember uses it: its runtime (driver or simulator), its streams, the
//! caching allocator over its memory, the kernels loaded on it and the pinned
//! blocks that stage its copies. Created at first use of `cuda:N` and kept for the
//! process.
//!
//! Work goes to the calling thread's current stream of the device: the default
//! stream unless [`with_current_stream`] chose another (PyTorch's current stream
//! is per thread and device too).

use super::calls::{ConvCall, GemmCall};
use super::pinned::{Pinned, PinnedPool};
use super::runtime::{Func, LoadedModule, RtEvent, RtGraph, Runtime, StreamId, Workspaces};
use super::{discover, nvrtc, ops};
use crate::backend::alloc::{self, fmt_bytes, AllocError, Allocator, MemoryStats, RawMemory};
use crate::backend::generator::{self, Generator};
use crate::backend::profile;
use crate::{
    device::Device,
    dtype::DType,
    error::{Error, Result},
};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// A device's memory as the caching allocator sees it.
pub(crate) struct RtMemory {
    rt: Arc<dyn Runtime>,
    last_error: String,
}

impl RawMemory for RtMemory {
    fn malloc(&mut self, bytes: usize) -> std::result::Result<u64, bool> {
        self.rt.malloc(bytes).map_err(|e| {
            self.last_error = e.msg;
            e.out_of_memory
        })
    }
    fn free(&mut self, ptr: u64) {
        self.rt.free(ptr)
    }
    fn mem_info(&self) -> (usize, usize) {
        self.rt.mem_info().unwrap_or((0, 0))
    }
    fn synchronize(&self) {
        let _ = self.rt.synchronize();
    }
    fn last_error(&self) -> String {
        self.last_error.clone()
    }
    type Event = RtEvent;
    fn record(&mut self, s: StreamId) -> Option<RtEvent> {
        let mut e = self.rt.event_create(false).ok()?;
        match self.rt.event_record(&mut e, s) {
            Ok(()) => Some(e),
            Err(_) => {
                self.rt.event_destroy(e);
                None
            }
        }
    }
    fn passed(&self, e: &RtEvent) -> bool {
        self.rt.event_query(e).unwrap_or(false)
    }
    fn destroy(&mut self, e: RtEvent) {
        self.rt.event_destroy(e)
    }
}

thread_local! {
    /// This thread's current stream of each device that has one other than its
    /// default: (ordinal, stream), innermost last.
    static CURRENT: RefCell<Vec<(usize, StreamId)>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with `s` as this thread's current stream of `cuda:ordinal` (the one
/// before is current again afterwards, also when `f` panics).
pub(crate) fn with_current_stream<R>(ordinal: usize, s: StreamId, f: impl FnOnce() -> R) -> R {
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|c| c.borrow_mut().pop());
        }
    }
    CURRENT.with(|c| c.borrow_mut().push((ordinal, s)));
    let _restore = Restore;
    f()
}

/// This thread's current stream of `cuda:ordinal`.
pub(crate) fn current_stream(ordinal: usize) -> StreamId {
    CURRENT.with(|c| {
        c.borrow()
            .iter()
            .rev()
            .find(|(o, _)| *o == ordinal)
            .map_or(StreamId(0), |(_, s)| *s)
    })
}

/// Streams handed to users: up to this many are made per device, then they are
/// handed out again in turn (PyTorch's stream pool).
const USER_STREAMS: usize = 32;

/// One of ember's kernel files compiled for one dtype.
type ModuleKey = (&'static str, DType);

/// A user's kernel: its source, its name and the NVRTC options.
type UserKernelKey = (String, String, Vec<String>);

/// The runtime of one GPU.
pub(crate) struct CudaDev {
    pub ordinal: usize,
    rt: Arc<dyn Runtime>,
    pub sm_count: u32,
    /// Compute capability as `major * 10 + minor` (90 for an H100).
    arch: u32,
    alloc: Mutex<Allocator<RtMemory>>,
    modules: Mutex<HashMap<ModuleKey, Box<dyn LoadedModule>>>,
    functions: Mutex<HashMap<String, Func>>,
    /// Users' kernels by (source, name, options): a module stays loaded while
    /// the process runs, so compiling the same kernel again reuses it.
    user_functions: Mutex<HashMap<UserKernelKey, Func>>,
    /// The dynamic shared memory ember's kernels have been opted in to, by name
    /// ([`CudaDev::allow_dynamic_shared`]).
    dynamic_shared: Mutex<HashMap<String, u32>>,
    pinned: Mutex<PinnedPool>,
    /// Times the host waited for this device: copies to the host and
    /// `synchronize` calls ([`CudaDev::host_syncs`]).
    syncs: AtomicU64,
    index_checks: Mutex<IndexChecks>,
    /// The stream that ember's background uploads use (made at first use).
    copy_stream: Mutex<Option<StreamId>>,
    /// The streams made for users, and how many have been handed out.
    user_streams: Mutex<(Vec<StreamId>, usize)>,
    /// The stream graphs are captured on (made at first use).
    capture_stream: Mutex<Option<StreamId>>,
    /// The capture under way, if any (one per device at a time).
    capture: Mutex<Option<Capture>>,
    /// Whether `capture` holds one (read without the lock on every copy).
    capturing: AtomicBool,
}

/// A graph's capture under way.
struct Capture {
    stream: StreamId,
    pool: StreamId,
    thread: std::thread::ThreadId,
    /// The index checks captured (their slots belong to the graph).
    checks: Vec<GraphCheck>,
    /// The random draws captured, one record per generator they drew from.
    random: Vec<GraphRandom>,
}

/// A graph's random draws from one generator: before each replay, `counters`
/// Philox counters are reserved from that generator and written, with its
/// seed, at `state` (two device words), where the draws read them.
#[derive(Clone, Debug)]
pub(crate) struct GraphRandom {
    pub state: u64,
    pub counters: u64,
    /// The generator of the scope the draws were captured in (`None`: the
    /// global one). Replays draw from it, wherever they are made, as PyTorch's
    /// graphs advance the generator registered at their capture.
    pub generator: Option<Generator>,
}

/// An index check inside a graph: armed again at each replay.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GraphCheck {
    op: &'static str,
    dim: usize,
    size: usize,
    slot: usize,
}

/// What a capture leaves for its graph.
pub(crate) struct Captured {
    pub graph: RtGraph,
    pub pool: StreamId,
    pub checks: Vec<GraphCheck>,
    pub random: Vec<GraphRandom>,
}

/// The index checks queued on a device and not yet read. Each has a slot of two
/// words in `flags` (0 while it found nothing; else 1 and the bad index) and
/// remembers the stream it was queued on and the thread that queued it: a wait
/// for that stream (or the device) reads it, and a bad index is that thread's
/// error, returned by its next wait (another thread's wait keeps it for that
/// thread), so threads sharing a GPU do not get each other's errors.
struct IndexChecks {
    flags: Option<u64>,
    pending: Vec<IndexCheck>,
    /// Slots no check holds.
    free: Vec<usize>,
    /// Slots that found a bad index and were cleared by a copy on their stream:
    /// free again after the next wait for the whole device.
    cleared: Vec<usize>,
    /// Errors found at another thread's wait, each for its thread's next one.
    found: Vec<(std::thread::ThreadId, Error)>,
}

impl Default for IndexChecks {
    fn default() -> Self {
        IndexChecks {
            flags: None,
            pending: Vec::new(),
            free: (0..INDEX_CHECK_SLOTS).rev().collect(),
            cleared: Vec::new(),
            found: Vec::new(),
        }
    }
}

struct IndexCheck {
    op: &'static str,
    dim: usize,
    size: usize,
    slot: usize,
    stream: StreamId,
    thread: std::thread::ThreadId,
    /// The slot belongs to a graph (it is not freed when the check is read).
    graph: bool,
}

/// Index checks a device holds between two waits; one more waits first.
const INDEX_CHECK_SLOTS: usize = 4096;

type Slot = OnceLock<std::result::Result<Arc<CudaDev>, String>>;

fn slots() -> &'static [Slot] {
    static SLOTS: OnceLock<Vec<Slot>> = OnceLock::new();
    SLOTS.get_or_init(|| {
        (0..discover::device_count())
            .map(|_| OnceLock::new())
            .collect()
    })
}

/// The runtime of `cuda:ordinal`, created at first use.
pub(crate) fn dev(ordinal: usize) -> Result<Arc<CudaDev>> {
    discover::check_device(Device::Cuda(ordinal))?;
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

/// The runtime of `cuda:ordinal` if it was created already (statistics of a device
/// never used are all zero).
pub(crate) fn existing(ordinal: usize) -> Option<Arc<CudaDev>> {
    match slots().get(ordinal)?.get()? {
        Ok(d) => Some(d.clone()),
        Err(_) => None,
    }
}

impl CudaDev {
    fn new(ordinal: usize) -> Result<CudaDev> {
        let rt = discover::system().open(ordinal)?;
        let (major, minor) = discover::system().properties(ordinal)?.compute_capability;
        let raw = RtMemory {
            rt: rt.clone(),
            last_error: String::new(),
        };
        Ok(CudaDev {
            ordinal,
            sm_count: rt.sm_count(),
            arch: major * 10 + minor,
            rt,
            alloc: Mutex::new(if alloc::caching_from_env() {
                Allocator::new(raw)
            } else {
                Allocator::without_cache(raw)
            }),
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
            user_functions: Mutex::new(HashMap::new()),
            dynamic_shared: Mutex::new(HashMap::new()),
            pinned: Mutex::new(PinnedPool::default()),
            syncs: AtomicU64::new(0),
            index_checks: Mutex::new(IndexChecks::default()),
            copy_stream: Mutex::new(None),
            user_streams: Mutex::new((Vec::new(), 0)),
            capture_stream: Mutex::new(None),
            capture: Mutex::new(None),
            capturing: AtomicBool::new(false),
        })
    }

    /// The memory pool of the capture under way (its graph's name).
    pub(crate) fn capture_pool(&self) -> Option<StreamId> {
        self.capture_state().as_ref().map(|c| c.pool)
    }

    /// Whether the graph whose pool is `pool.0` was captured and is not
    /// dropped yet (a capture that failed left none).
    pub(crate) fn graph_alive(&self, pool: u32) -> bool {
        self.capture_pool().is_none_or(|p| p.0 != pool)
            && self.allocator().graph_pool_alive(StreamId(pool))
    }

    fn capture_state(&self) -> MutexGuard<'_, Option<Capture>> {
        self.capture.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `true` when the calling thread is capturing a graph on its current stream
    /// (work it queues now goes into the graph).
    pub(crate) fn is_capturing(&self) -> bool {
        let s = self.stream();
        self.thread_capture(|c| c.stream == s)
    }

    /// `true` when the calling thread has begun a capture on this device that is
    /// still under way, whichever stream is current now.
    fn thread_captures(&self) -> bool {
        self.thread_capture(|_| true)
    }

    /// Whether the calling thread's capture under way, if any, passes `f`.
    fn thread_capture(&self, f: impl FnOnce(&Capture) -> bool) -> bool {
        if !self.capturing.load(Ordering::Acquire) {
            return false;
        }
        let me = std::thread::current().id();
        self.capture_state()
            .as_ref()
            .is_some_and(|c| c.thread == me && f(c))
    }

    /// Why a capture refuses to read or wait for results
    /// ([`refuse_in_capture`](Self::refuse_in_capture)'s `why`).
    pub(crate) const NOT_RUN_YET: &'static str =
        "captured work does not run until the graph is replayed";

    /// An error naming `what` when the calling thread is capturing a graph: work
    /// that a graph cannot hold (a host copy, a wait, fresh random numbers). On
    /// any of its streams, as PyTorch's default ("global") capture mode refuses
    /// them: a copy or wait under `with_stream` on another stream would run at
    /// once, before the captured work it reads has ever run.
    pub(crate) fn refuse_in_capture(&self, what: &str, why: &str) -> Result<()> {
        if self.thread_captures() {
            return Err(Error::invalid(
                "cuda::Graph",
                format!(
                    "{what} while a CUDA graph is captured on {}: {why}",
                    self.device()
                ),
            ));
        }
        Ok(())
    }

    /// The stream graphs are captured on: a stream of its own, so that no other
    /// thread's work lands in a capture.
    pub(crate) fn capture_stream(&self) -> Result<StreamId> {
        self.own_stream(&self.capture_stream)
    }

    /// The stream in `slot`, made at first use (a failure is returned, and the
    /// next call tries again).
    fn own_stream(&self, slot: &Mutex<Option<StreamId>>) -> Result<StreamId> {
        let mut s = slot.lock().unwrap_or_else(|p| p.into_inner());
        match *s {
            Some(id) => Ok(id),
            None => Ok(*s.insert(self.rt.stream_create()?)),
        }
    }

    /// An error when the calling thread captures a graph and `s` is not the
    /// stream it captures: work there would run at once, outside the graph, and
    /// any order between the two would break the capture.
    fn check_capture_stream(&self, s: StreamId) -> Result<()> {
        if !self.capturing.load(Ordering::Acquire) {
            return Ok(());
        }
        let me = std::thread::current().id();
        match self.capture_state().as_ref() {
            Some(c) if c.thread == me && c.stream != s => Err(Error::invalid(
                "cuda::Graph",
                format!(
                    "queueing work on another stream of {} while a CUDA graph is captured: \
                     a capture holds one stream's work",
                    self.device()
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Starts capturing the work the calling thread queues on `s` into a graph,
    /// its memory from a private pool.
    pub(crate) fn begin_capture(&self, s: StreamId) -> Result<()> {
        // the index-check flags are made (a copy and a wait) before, not inside
        self.index_flags()?;
        let mut c = self.capture_state();
        if c.is_some() {
            return Err(Error::invalid(
                "cuda::Graph",
                format!(
                    "another graph is being captured on {} (one at a time per GPU)",
                    self.device()
                ),
            ));
        }
        let pool = self
            .allocator()
            .begin_capture(s)
            .expect("no capture under way");
        if let Err(e) = self.rt.capture_begin(s) {
            self.allocator().release_graph(pool);
            return Err(e);
        }
        *c = Some(Capture {
            stream: s,
            pool,
            thread: std::thread::current().id(),
            checks: Vec::new(),
            random: Vec::new(),
        });
        self.capturing.store(true, Ordering::Release);
        Ok(())
    }

    /// Ends the capture under way and returns its graph.
    pub(crate) fn end_capture(&self) -> Result<Captured> {
        let c = self
            .capture_state()
            .take()
            .expect("a capture under way, begun by this thread");
        self.capturing.store(false, Ordering::Release);
        self.allocator().end_capture();
        match self.rt.capture_end(c.stream) {
            Ok(graph) => Ok(Captured {
                graph,
                pool: c.pool,
                checks: c.checks,
                random: c.random,
            }),
            Err(e) => {
                // nothing captured ever ran; blocks held for the graph may still
                // be read by other streams' work queued before
                let _ = self.rt.synchronize();
                self.forget_graph(c.pool, &c.checks, &c.random);
                Err(e)
            }
        }
    }

    /// Inside a capture by the calling thread: a random draw of `counters`
    /// Philox counters joins the graph's draws from the generator it would draw
    /// from now (the scope's, or the global one); returns the address of that
    /// generator's (seed, first counter) words in the graph and the draw's place
    /// after that counter. `None` outside a capture.
    pub(crate) fn graph_random(&self, counters: u64) -> Result<Option<(u64, u64)>> {
        if !self.is_capturing() {
            return Ok(None);
        }
        let generator = generator::current();
        let mut c = self.capture_state();
        let Some(cap) = c.as_mut() else {
            return Ok(None);
        };
        let same = |r: &GraphRandom| {
            r.generator.as_ref().map(Generator::addr) == generator.as_ref().map(Generator::addr)
        };
        let r = match cap.random.iter().position(same) {
            Some(i) => &mut cap.random[i],
            None => {
                // outside the caching allocator, freed with the graph
                let state = self.rt.malloc(16).map_err(|e| Error::Cuda {
                    op: "cuMemAlloc",
                    msg: e.msg,
                })?;
                cap.random.push(GraphRandom {
                    state,
                    counters: 0,
                    generator,
                });
                cap.random.last_mut().expect("just pushed")
            }
        };
        let intra = r.counters;
        r.counters += counters;
        Ok(Some((r.state, intra)))
    }

    /// Queues `g` on the current stream and arms its index checks there; the
    /// counters of its random draws are reserved first from the generators they
    /// were captured with, and written (with the seeds) where the draws read them.
    pub(crate) fn launch_graph(
        &self,
        g: &RtGraph,
        checks: &[GraphCheck],
        random: &[GraphRandom],
    ) -> Result<()> {
        let s = self.stream();
        self.refuse_in_capture("replaying a graph", "graphs do not nest")?;
        for r in random {
            let (seed, offset) = super::random::reserve_from(r.generator.as_ref(), r.counters)?;
            self.htod(r.state, &[seed, offset])?;
        }
        let mut c = self.index_checks.lock().unwrap_or_else(|p| p.into_inner());
        self.rt.graph_launch(g, s)?;
        let me = std::thread::current().id();
        for k in checks {
            if !c.pending.iter().any(|p| p.slot == k.slot) {
                c.pending.push(IndexCheck {
                    op: k.op,
                    dim: k.dim,
                    size: k.size,
                    slot: k.slot,
                    stream: s,
                    thread: me,
                    graph: true,
                });
            }
        }
        Ok(())
    }

    /// After a graph is dropped: waits for its launches, then gives its memory
    /// and its index-check slots back.
    pub(crate) fn drop_graph(
        &self,
        g: RtGraph,
        pool: StreamId,
        checks: &[GraphCheck],
        random: &[GraphRandom],
    ) {
        // its launches may still run (errors stay for the next wait)
        let _ = self.rt.synchronize();
        self.rt.graph_destroy(g);
        self.forget_graph(pool, checks, random);
    }

    fn forget_graph(&self, pool: StreamId, checks: &[GraphCheck], random: &[GraphRandom]) {
        for r in random {
            self.rt.free(r.state);
        }
        self.allocator().release_graph(pool);
        let mut c = self.index_checks.lock().unwrap_or_else(|p| p.into_inner());
        for k in checks {
            // a check still to be read frees its slot when it is read
            match c.pending.iter_mut().find(|p| p.slot == k.slot) {
                Some(p) => p.graph = false,
                None => c.free.push(k.slot),
            }
        }
    }

    /// The calling thread's current stream of this device.
    pub(crate) fn stream(&self) -> StreamId {
        current_stream(self.ordinal)
    }

    /// The stream ember's background uploads use (the DataLoader's), made at first
    /// use.
    pub(crate) fn copy_stream(&self) -> Result<StreamId> {
        self.own_stream(&self.copy_stream)
    }

    /// A stream for a user: a new one until [`USER_STREAMS`] exist, then the
    /// existing ones in turn.
    pub(crate) fn user_stream(&self) -> Result<StreamId> {
        let mut g = self.user_streams.lock().unwrap_or_else(|p| p.into_inner());
        let (made, handed) = &mut *g;
        let s = if made.len() < USER_STREAMS {
            let s = self.rt.stream_create()?;
            made.push(s);
            s
        } else {
            made[*handed % USER_STREAMS]
        };
        *handed += 1;
        Ok(s)
    }

    /// Makes work queued on `s` from now on wait for `e`'s work.
    pub(crate) fn stream_wait(&self, s: StreamId, e: &RtEvent) -> Result<()> {
        self.rt.stream_wait(s, e)
    }

    /// Waits for the work queued on `s` (a host wait, counted); an error when an
    /// index check queued there failed.
    pub(crate) fn stream_synchronize(&self, s: StreamId) -> Result<()> {
        self.refuse_in_capture("waiting for a stream", "a capture runs nothing to wait for")?;
        self.rt.stream_synchronize(s)?;
        self.synced(Some(s))
    }

    /// Marks the block at `ptr` as used by work on `s` (see
    /// [`Allocator::record_stream`]).
    pub(crate) fn record_stream(&self, ptr: u64, s: StreamId) {
        self.allocator().record_stream(ptr, s);
    }

    /// What executes this device's work.
    pub(crate) fn rt(&self) -> &dyn Runtime {
        self.rt.as_ref()
    }

    /// Makes the device's context current on this thread.
    pub(crate) fn bind(&self) -> Result<()> {
        self.rt.bind()
    }

    pub fn device(&self) -> Device {
        Device::Cuda(self.ordinal)
    }

    fn allocator(&self) -> MutexGuard<'_, Allocator<RtMemory>> {
        self.alloc.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A device block of at least `bytes`, for work on the current stream.
    pub fn malloc(&self, bytes: usize) -> Result<u64> {
        let s = self.stream();
        let ptr = self.allocator().alloc(bytes, s);
        if profile::active() {
            if let Ok(p) = &ptr {
                let size = self.allocator().block_size(*p).unwrap_or(bytes);
                profile::memory(size, true);
            }
        }
        ptr.map_err(|e| match e {
            AllocError::OutOfMemory {
                requested,
                free,
                total,
                allocated,
                reserved,
                retried,
            } => Error::OutOfMemory {
                device: self.device(),
                requested,
                msg: format!(
                    "GPU {} has a total capacity of {} of which {} is free; ember has {} \
                     allocated to tensors and {} reserved in total ({})",
                    self.ordinal,
                    fmt_bytes(total),
                    fmt_bytes(free),
                    fmt_bytes(allocated),
                    fmt_bytes(reserved),
                    if retried {
                        "the cache was emptied and the allocation retried"
                    } else {
                        "during a graph capture, which cannot empty the cache: not retried"
                    }
                ),
            },
            AllocError::Driver(msg) => Error::Cuda {
                op: "cuMemAlloc",
                msg,
            },
        })
    }

    pub fn free(&self, ptr: u64) {
        let mut a = self.allocator();
        if profile::active() {
            profile::memory(a.block_size(ptr).unwrap_or(0), false);
        }
        a.free(ptr);
    }

    pub fn memory_stats(&self) -> MemoryStats {
        self.allocator().stats()
    }

    pub fn reset_peak(&self) {
        self.allocator().reset_peak();
    }

    pub fn empty_cache(&self) {
        self.allocator().release_cached();
        self.pinned().release_cache();
    }

    /// Copies through this device's pinned blocks, on the current stream.
    fn pinned(&self) -> Pinned<'_> {
        self.pinned_on(self.stream())
    }

    fn pinned_on(&self, stream: StreamId) -> Pinned<'_> {
        Pinned {
            rt: self.rt.as_ref(),
            pool: &self.pinned,
            stream,
            syncs: &self.syncs,
        }
    }

    /// Queues a copy of `src` to device address `dst` and returns once `src` may be
    /// dropped (the values wait in pinned blocks until the device has copied them).
    pub(crate) fn htod<T>(&self, dst: u64, src: &[T]) -> Result<()> {
        self.refuse_in_capture(
            "copying values from the host",
            "each replay would copy again, from a staging buffer reused since; make \
             the tensor before the capture and copy into it before each replay",
        )?;
        profile::kernel(|| profile::Name::Static("memcpy host to device"));
        self.pinned().htod(dst, src)
    }

    /// Copies device address `src` into `dst`, waiting for the work queued before
    /// on the current stream; an error when an index check queued there failed.
    pub(crate) fn dtoh<T>(&self, dst: &mut [T], src: u64) -> Result<()> {
        self.refuse_in_capture("reading values", Self::NOT_RUN_YET)?;
        let s = self.stream();
        profile::kernel(|| profile::Name::Static("memcpy device to host (a host wait)"));
        self.pinned_on(s).dtoh(dst, src)?;
        self.synced(Some(s))
    }

    /// Counts a wait of the host for this device outside [`synced`](Self::synced)
    /// (an event's).
    pub(crate) fn count_sync(&self) {
        self.syncs.fetch_add(1, Ordering::Relaxed);
    }

    /// How many times the host has waited for this device so far: copies of values
    /// to the host (`to_vec`, `item`, printing, a CPU copy) and `synchronize`.
    pub(crate) fn host_syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// Queues an index check of `op` (along `dim` of size `size`): `launch` gets
    /// the address of its two flag words and queues the kernel, under the lock
    /// that a wait takes to read the flags (so no wait reads a slot whose kernel
    /// is not queued yet).
    pub(crate) fn index_check(
        &self,
        op: &'static str,
        dim: usize,
        size: usize,
        launch: impl FnOnce(u64) -> Result<()>,
    ) -> Result<()> {
        let flags = self.index_flags()?;
        let mut c = self.index_checks.lock().unwrap_or_else(|p| p.into_inner());
        if c.free.is_empty() {
            if self.is_capturing() {
                return Err(Error::invalid(
                    "cuda::Graph",
                    format!(
                        "more than {INDEX_CHECK_SLOTS} index checks in one capture on {}",
                        self.device()
                    ),
                ));
            }
            // every slot in use since the last wait: wait now, to free them
            drop(c);
            self.rt.synchronize()?;
            self.synced(None)?;
            c = self.index_checks.lock().unwrap_or_else(|p| p.into_inner());
        }
        let slot = *c.free.last().expect("a free slot");
        launch(flags + 16 * slot as u64)?;
        c.free.pop();
        if self.is_capturing() {
            // the graph's: armed at each replay
            if let Some(cap) = self.capture_state().as_mut() {
                cap.checks.push(GraphCheck {
                    op,
                    dim,
                    size,
                    slot,
                });
            }
            return Ok(());
        }
        c.pending.push(IndexCheck {
            op,
            dim,
            size,
            slot,
            stream: self.stream(),
            thread: std::thread::current().id(),
            graph: false,
        });
        Ok(())
    }

    /// The device words the index checks write, made and zeroed at first use
    /// (outside the caching allocator: kept for the process, and not counted in
    /// the memory statistics of tensors).
    fn index_flags(&self) -> Result<u64> {
        let mut c = self.index_checks.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = c.flags {
            return Ok(f);
        }
        let f = self
            .rt
            .malloc(INDEX_CHECK_SLOTS * 16)
            .map_err(|e| Error::Cuda {
                op: "cuMemAlloc",
                msg: e.msg,
            })?;
        // zeroed before any stream's check may write a slot
        let s = self.stream();
        let zeroed = self
            .pinned_on(s)
            .htod(f, &vec![0u64; 2 * INDEX_CHECK_SLOTS])
            .and_then(|()| self.rt.stream_synchronize(s));
        if let Err(e) = zeroed {
            self.rt.free(f);
            return Err(e);
        }
        Ok(*c.flags.insert(f))
    }

    /// After the host waited for stream `waited` (`None`: the whole device):
    /// counts the wait, reads the index checks queued there, and returns the first
    /// bad index this thread's checks found (PyTorch reports its device-side
    /// asserts at the next synchronisation too).
    fn synced(&self, waited: Option<StreamId>) -> Result<()> {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        let me = std::thread::current().id();
        let mut c = self.index_checks.lock().unwrap_or_else(|p| p.into_inner());
        if waited.is_none() {
            let cleared = std::mem::take(&mut c.cleared);
            c.free.extend(cleared);
        }
        let (done, rest): (Vec<IndexCheck>, Vec<IndexCheck>) = std::mem::take(&mut c.pending)
            .into_iter()
            .partition(|k| waited.is_none_or(|s| k.stream == s));
        c.pending = rest;
        if let (Some(flags), false) = (c.flags, done.is_empty()) {
            // the slots from the lowest to the highest read, in one copy on a
            // stream the wait covered
            let s = waited.unwrap_or(done[0].stream);
            let lo = done.iter().map(|k| k.slot).min().expect("a check");
            let hi = done.iter().map(|k| k.slot).max().expect("a check");
            let mut words = vec![0u64; 2 * (hi - lo + 1)];
            self.pinned_on(s).dtoh(&mut words, flags + 16 * lo as u64)?;
            for check in &done {
                let w = &words[2 * (check.slot - lo)..2 * (check.slot - lo) + 2];
                if w[0] == 0 {
                    if !check.graph {
                        c.free.push(check.slot);
                    }
                    continue;
                }
                // cleared by a copy queued on the check's stream; the slot is
                // reused only after a wait for the whole device has seen it run
                // (a graph's slot stays the graph's)
                self.pinned_on(check.stream)
                    .htod(flags + 16 * check.slot as u64, &[0u64, 0])?;
                if !check.graph {
                    c.cleared.push(check.slot);
                }
                if !c.found.iter().any(|(t, _)| *t == check.thread) {
                    let e = Error::IndexOutOfRange {
                        op: check.op,
                        index: w[1] as i64,
                        dim: check.dim,
                        size: check.size,
                    };
                    c.found.push((check.thread, e));
                }
            }
        }
        match c.found.iter().position(|(t, _)| *t == me) {
            Some(i) => Err(c.found.remove(i).1),
            None => Ok(()),
        }
    }

    /// Statistics of the pinned blocks: (bytes held, blocks handed out so far).
    pub(crate) fn pinned_stats(&self) -> (usize, u64) {
        self.pinned().stats()
    }

    /// (free, total) bytes of the device's memory.
    pub fn mem_get_info(&self) -> Result<(usize, usize)> {
        self.rt.mem_info()
    }

    /// Waits for every stream of the device.
    pub fn synchronize(&self) -> Result<()> {
        self.refuse_in_capture("waiting for the GPU", "a capture runs nothing to wait for")?;
        self.rt.synchronize()?;
        self.synced(None)
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
            return Ok(f.clone());
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
                e.insert(
                    self.rt
                        .load_module(&format!("{module}_{suffix}"), &src, &[])?,
                )
            }
        };
        let f = m.function(name)?;
        self.functions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string(), f.clone());
        Ok(f)
    }

    /// Opts ember's kernel `name` (of kernel file `module`, compiled for
    /// `dtype`) in to `bytes` of dynamic shared memory, which a launch of more
    /// than 48 KiB needs; once per kernel and size.
    pub(crate) fn allow_dynamic_shared(
        &self,
        (module, dtype, name): (&'static str, DType, &str),
        bytes: u32,
    ) -> Result<()> {
        let mut allowed = self
            .dynamic_shared
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if allowed.get(name).is_some_and(|&b| b >= bytes) {
            return Ok(());
        }
        let f = self.func(module, dtype, name)?;
        self.rt.set_max_dynamic_shared(&f, bytes)?;
        allowed.insert(name.to_string(), bytes);
        Ok(())
    }

    /// Compiles and loads a user's kernel `name` from `source`.
    pub(crate) fn load_user_function(
        &self,
        source: &str,
        name: &str,
        options: &[String],
    ) -> Result<Func> {
        let key = (source.to_string(), name.to_string(), options.to_vec());
        let cached = |k: &UserKernelKey| {
            self.user_functions
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(k)
                .cloned()
        };
        if let Some(f) = cached(&key) {
            return Ok(f);
        }
        // compiled and loaded without the lock (other kernels' compiles go on);
        // the module stays loaded as long as the process runs, once per kernel
        // (two threads loading the same one at once keep the first)
        let f = self
            .rt
            .load_module(name, source, options)?
            .function(name)
            .map_err(|e| match e {
                Error::Cuda {
                    op: "cuModuleGetFunction",
                    msg,
                } if !source.contains("extern \"C\"") => Error::Cuda {
                    op: "cuModuleGetFunction",
                    msg: format!(
                        "{msg} (a kernel is found by its name only when declared \
                         `extern \"C\" __global__`: C++ names are mangled)"
                    ),
                },
                e => e,
            })?;
        Ok(self
            .user_functions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key)
            .or_insert(f)
            .clone())
    }

    /// The byte sizes of a kernel's parameters, in order.
    pub(crate) fn param_sizes(&self, f: &Func) -> Result<Vec<usize>> {
        self.rt.param_sizes(f)
    }

    /// Launches `f` on the current stream.
    ///
    /// # Safety
    /// `params` must point at values matching the kernel's parameter list, and
    /// every device pointer among them must be valid for what the kernel accesses.
    pub(crate) unsafe fn launch(
        &self,
        f: &Func,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared_mem: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let s = self.stream();
        self.check_capture_stream(s)?;
        profile::kernel(|| profile::Name::Shared(f.name().clone()));
        self.rt.launch(s, f, grid, block, shared_mem, params)
    }

    /// Compute capability as `major * 10 + minor` (90 for an H100).
    pub(crate) fn arch(&self) -> u32 {
        self.arch
    }

    /// A grid for `n` elements in blocks of `threads`, capped so that grid-stride
    /// loops keep every multiprocessor busy without a huge grid.
    pub(crate) fn grid_for(&self, n: usize, threads: u32) -> u32 {
        let blocks = n.div_ceil(threads as usize).max(1);
        blocks
            .min(self.sm_count as usize * 32)
            .min(u32::MAX as usize) as u32
    }

    /// Queues `g` on the current stream.
    ///
    /// # Safety
    /// As [`Runtime::gemm`].
    pub(crate) unsafe fn gemm(&self, g: &GemmCall) -> Result<()> {
        let s = self.stream();
        self.check_capture_stream(s)?;
        profile::kernel(|| profile::Name::Static(g.library_name()));
        self.rt.gemm(s, g, self)
    }

    /// Queues `c` on the current stream.
    ///
    /// # Safety
    /// As [`Runtime::conv`].
    pub(crate) unsafe fn conv(&self, c: &ConvCall) -> Result<()> {
        let s = self.stream();
        self.check_capture_stream(s)?;
        profile::kernel(|| profile::Name::Static(c.library_name()));
        self.rt.conv(s, c)
    }

    /// As [`Runtime::sdpa`].
    ///
    /// # Safety
    /// As [`Runtime::sdpa`].
    pub(crate) unsafe fn sdpa(&self, c: &super::dnn::sdpa::SdpaCall) -> Result<()> {
        let s = self.stream();
        self.check_capture_stream(s)?;
        self.rt.sdpa(s, c)?;
        profile::kernel(|| profile::Name::Static("cudnn_sdpa"));
        Ok(())
    }

    /// A new communicator id ([`Runtime::comm_unique_id`]).
    pub(crate) fn comm_unique_id(&self) -> Result<[u8; 128]> {
        self.rt.comm_unique_id()
    }

    /// Joins a communicator ([`Runtime::comm_init`]).
    pub(crate) fn comm_init(
        &self,
        id: [u8; 128],
        world: usize,
        rank: usize,
        host: Arc<dyn crate::backend::op::collective::HostCollectives>,
    ) -> Result<super::runtime::Opaque> {
        self.rt.comm_init(id, world, rank, host)
    }

    /// A communicator's failure so far ([`Runtime::comm_check`]).
    pub(crate) fn comm_check(&self, comm: &super::runtime::Opaque) -> Result<()> {
        self.rt.comm_check(comm)
    }

    /// Frees a communicator ([`Runtime::comm_destroy`]).
    pub(crate) fn comm_destroy(&self, comm: super::runtime::Opaque, abort: bool) {
        self.rt.comm_destroy(comm, abort)
    }

    /// Queues collective `c` of `comm` on the current stream.
    ///
    /// # Safety
    /// As [`Runtime::collective`].
    pub(crate) unsafe fn collective(
        &self,
        comm: &super::runtime::Opaque,
        c: &crate::backend::op::collective::Collective,
    ) -> Result<()> {
        let s = self.stream();
        self.check_capture_stream(s)?;
        profile::kernel(|| profile::Name::Static(c.kind.name()));
        self.rt.collective(s, comm, c)
    }

    pub(crate) fn dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: both ranges lie within live allocations of at least `bytes`.
        let s = self.stream();
        self.check_capture_stream(s)?;
        profile::kernel(|| profile::Name::Static("memcpy device to device"));
        // SAFETY: as above.
        unsafe { self.rt.dtod(s, dst, src, bytes) }
    }
}

impl Workspaces for CudaDev {
    fn release_cached(&self) {
        self.allocator().release_cached();
    }
    fn device_alloc(&self, bytes: usize) -> Result<u64> {
        self.rt.malloc(bytes).map_err(|e| Error::Cuda {
            op: "cuMemAlloc",
            msg: e.msg,
        })
    }
}
