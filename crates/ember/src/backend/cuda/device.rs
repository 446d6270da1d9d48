//! One GPU as ember uses it: its runtime (driver or simulator), the caching
//! allocator over its memory, the kernels loaded on it and the pinned blocks that
//! stage its copies. Created at first use of `cuda:N` and kept for the process.

use super::calls::{ConvCall, GemmCall};
use super::pinned::{Pinned, PinnedPool};
use super::runtime::{Func, LoadedModule, Runtime, Workspaces};
use super::{discover, nvrtc, ops};
use crate::backend::alloc::{self, fmt_bytes, AllocError, Allocator, MemoryStats, RawMemory};
use crate::{DType, Device, Error, Result};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
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
}

/// One of ember's kernel files compiled for one dtype.
type ModuleKey = (&'static str, DType);

/// The runtime of one GPU.
pub(crate) struct CudaDev {
    pub ordinal: usize,
    rt: Arc<dyn Runtime>,
    pub sm_count: u32,
    alloc: Mutex<Allocator<RtMemory>>,
    modules: Mutex<HashMap<ModuleKey, Box<dyn LoadedModule>>>,
    functions: Mutex<HashMap<String, Func>>,
    pinned: Mutex<PinnedPool>,
    /// Times the host waited for this device: copies to the host and
    /// `synchronize` calls ([`CudaDev::host_syncs`]).
    syncs: AtomicU64,
    index_checks: Mutex<IndexChecks>,
}

/// The index checks queued on a device since its last synchronisation. Each has
/// a slot of two words in `flags` (0 while it found nothing; else 1 and the bad
/// index) and remembers the thread that queued it: a bad index is that thread's
/// error, returned by its next wait for the device (another thread's wait keeps
/// it for that thread), so threads sharing a GPU do not get each other's errors.
#[derive(Default)]
struct IndexChecks {
    flags: Option<u64>,
    pending: Vec<IndexCheck>,
    /// Errors found at another thread's wait, each for its thread's next one.
    found: Vec<(std::thread::ThreadId, Error)>,
}

struct IndexCheck {
    op: &'static str,
    dim: usize,
    size: usize,
    thread: std::thread::ThreadId,
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
        let raw = RtMemory {
            rt: rt.clone(),
            last_error: String::new(),
        };
        Ok(CudaDev {
            ordinal,
            sm_count: rt.sm_count(),
            rt,
            alloc: Mutex::new(if alloc::caching_from_env() {
                Allocator::new(raw)
            } else {
                Allocator::without_cache(raw)
            }),
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
            pinned: Mutex::new(PinnedPool::default()),
            syncs: AtomicU64::new(0),
            index_checks: Mutex::new(IndexChecks::default()),
        })
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
        self.pinned().release_cache();
    }

    /// Copies through this device's pinned blocks.
    fn pinned(&self) -> Pinned<'_> {
        Pinned {
            rt: self.rt.as_ref(),
            pool: &self.pinned,
        }
    }

    /// Queues a copy of `src` to device address `dst` and returns once `src` may be
    /// dropped (the values wait in pinned blocks until the device has copied them).
    pub(crate) fn htod<T>(&self, dst: u64, src: &[T]) -> Result<()> {
        self.pinned().htod(dst, src)
    }

    /// Copies device address `src` into `dst`, waiting for the work queued before;
    /// an error when an index check queued before failed.
    pub(crate) fn dtoh<T>(&self, dst: &mut [T], src: u64) -> Result<()> {
        self.pinned().dtoh(dst, src)?;
        self.synced()
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
        let mut c = self.index_checks.lock().unwrap_or_else(|p| p.into_inner());
        if c.pending.len() == INDEX_CHECK_SLOTS {
            // every slot in use since the last wait: wait now, to free them
            drop(c);
            self.rt.synchronize()?;
            self.synced()?;
            c = self.index_checks.lock().unwrap_or_else(|p| p.into_inner());
        }
        let flags = match c.flags {
            Some(f) => f,
            None => {
                // outside the caching allocator: kept for the process, and not
                // counted in the memory statistics of tensors
                let f = self
                    .rt
                    .malloc(INDEX_CHECK_SLOTS * 16)
                    .map_err(|e| Error::Cuda {
                        op: "cuMemAlloc",
                        msg: e.msg,
                    })?;
                self.pinned().htod(f, &vec![0u64; 2 * INDEX_CHECK_SLOTS])?;
                *c.flags.insert(f)
            }
        };
        launch(flags + 16 * c.pending.len() as u64)?;
        c.pending.push(IndexCheck {
            op,
            dim,
            size,
            thread: std::thread::current().id(),
        });
        Ok(())
    }

    /// After the host waited for the device: counts the wait, and returns the
    /// first bad index this thread's checks found (PyTorch reports its
    /// device-side asserts at the next synchronisation too).
    fn synced(&self) -> Result<()> {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        let me = std::thread::current().id();
        let mut c = self.index_checks.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(flags) = c.flags.filter(|_| !c.pending.is_empty()) {
            let pending = std::mem::take(&mut c.pending);
            let mut words = vec![0u64; 2 * pending.len()];
            self.pinned().dtoh(&mut words, flags)?;
            if words.iter().any(|&w| w != 0) {
                self.pinned().htod(flags, &vec![0u64; words.len()])?;
            }
            for (check, w) in pending.iter().zip(words.chunks_exact(2)) {
                if w[0] != 0 && !c.found.iter().any(|(t, _)| *t == check.thread) {
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

    pub fn synchronize(&self) -> Result<()> {
        self.rt.synchronize()?;
        self.synced()
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

    /// Compiles and loads a user's kernel `name` from `source`.
    pub(crate) fn load_user_function(
        &self,
        source: &str,
        name: &str,
        options: &[String],
    ) -> Result<Func> {
        // the module stays loaded as long as the process runs
        self.rt.load_module(name, source, options)?.function(name)
    }

    /// The byte sizes of a kernel's parameters, in order.
    pub(crate) fn param_sizes(&self, f: &Func) -> Result<Vec<usize>> {
        self.rt.param_sizes(f)
    }

    /// Launches `f` on the device's stream.
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
        self.rt.launch(f, grid, block, shared_mem, params)
    }

    /// A grid for `n` elements in blocks of `threads`, capped so that grid-stride
    /// loops keep every multiprocessor busy without a huge grid.
    pub(crate) fn grid_for(&self, n: usize, threads: u32) -> u32 {
        let blocks = n.div_ceil(threads as usize).max(1);
        blocks
            .min(self.sm_count as usize * 32)
            .min(u32::MAX as usize) as u32
    }

    /// Queues `g` on the device's stream.
    ///
    /// # Safety
    /// As [`Runtime::gemm`].
    pub(crate) unsafe fn gemm(&self, g: &GemmCall) -> Result<()> {
        self.rt.gemm(g, self)
    }

    /// Queues `c` on the device's stream.
    ///
    /// # Safety
    /// As [`Runtime::conv`].
    pub(crate) unsafe fn conv(&self, c: &ConvCall) -> Result<()> {
        self.rt.conv(c, self)
    }

    pub(crate) fn dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: both ranges lie within live allocations of at least `bytes`.
        unsafe { self.rt.dtod(dst, src, bytes) }
    }
}

impl Workspaces for CudaDev {
    fn alloc(&self, bytes: usize) -> Result<u64> {
        self.malloc(bytes)
    }
    fn free(&self, ptr: u64) {
        CudaDev::free(self, ptr)
    }
    fn release_cached(&self) {
        self.allocator().release_cached();
    }
}
