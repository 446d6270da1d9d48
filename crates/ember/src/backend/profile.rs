//! The profiler's recorder (what [`crate::profiler`] reads): while a profiling
//! session is on, every primitive's dispatch, every range an upper layer opens
//! (a module's forward, a backward rule, an optimizer step, a user's
//! `record_function`), the kernels each one launches and the bytes it allocates
//! and frees are written to a log of the thread that ran them.
//!
//! Off, the cost is one relaxed atomic load per op ([`active`]). On, each record
//! takes the thread's own log lock (uncontended) twice; a GPU op also records two
//! timing events on its stream, read only after the session ends ([`DeviceSpan`]),
//! so recording adds no host wait.
//!
//! Each thread keeps its own stack of open records, so ranges of two threads never
//! nest into each other.

use crate::{device::Device, dtype::DType};
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// What a record stands for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventKind {
    /// A primitive dispatched to a device (the work of one or a few kernels).
    #[default]
    Op,
    /// An operation of the tensor or nn layer made of several primitives
    /// (`layer_norm`, `cross_entropy`, `linear`), a whole `backward` pass or an
    /// optimizer's step.
    Function,
    /// The backward rule of one recorded op, named after that op.
    Backward,
    /// A module's forward pass, named by its dotted path (`layer1.0.conv1`).
    Module,
    /// A range the user opened (`record_function`).
    User,
}

/// A record's name: a literal, a vocabulary code (shown in lower case, `GELU_TANH`
/// as `gelu_tanh`; in place with PyTorch's trailing underscore, `add_`), or a
/// string made at run time.
#[derive(Clone, Debug)]
pub(crate) enum Name {
    Static(&'static str),
    Code(&'static str),
    Inplace(&'static str),
    Shared(Arc<str>),
}

impl Name {
    pub(crate) fn text(&self) -> String {
        match self {
            Name::Static(s) => (*s).to_string(),
            Name::Code(s) => s.to_ascii_lowercase(),
            Name::Inplace(s) => s.to_ascii_lowercase() + "_",
            Name::Shared(s) => s.to_string(),
        }
    }
}

/// The device side of one op: timing events recorded on its stream around its
/// work.
pub(crate) trait DeviceSpan: Send {
    /// Records the end of the op's work (when the op returns on the host). Called
    /// with the thread's log locked: it must not record anything itself (no
    /// allocation through ember's allocators, no kernel launch).
    fn end(&mut self);
    /// The op's start and end on its device, in microseconds after the host
    /// instant returned with them (the device clock's origin in this session,
    /// placed on the host's timeline); waits for the work if it has not finished.
    /// `None` when the device could not time it.
    fn times(&self) -> Option<(Instant, f64, f64)>;
}

/// One record as the recorder keeps it.
pub(crate) struct RawEvent {
    pub name: Name,
    pub kind: EventKind,
    /// The index of the enclosing record in the same thread's log.
    pub parent: Option<usize>,
    pub device: Option<Device>,
    pub dtype: Option<DType>,
    pub shapes: Vec<Vec<usize>>,
    /// For a backward rule: the module path its forward op ran in.
    pub module: Option<Arc<str>>,
    pub start: Instant,
    /// `None` while open (a record still open when the session stops ends there).
    pub end: Option<Instant>,
    pub span: Option<Box<dyn DeviceSpan>>,
    pub kernels: Vec<Name>,
    pub alloc_bytes: u64,
    pub freed_bytes: u64,
}

/// The records one thread made in one session.
pub(crate) struct ThreadLog {
    session: u64,
    pub thread: u64,
    pub thread_name: String,
    pub events: Vec<RawEvent>,
    stack: Vec<usize>,
    /// Bytes allocated and freed outside every record (a tensor dropped between
    /// ops).
    pub loose_alloc: u64,
    pub loose_freed: u64,
}

static ACTIVE: AtomicBool = AtomicBool::new(false);
/// The session being recorded (or the last one); each start and stop moves it on,
/// so a record of an old session is never mixed into a new one.
static SESSION: AtomicU64 = AtomicU64::new(0);
/// Every thread's log (a thread's entry goes away after its thread has ended and
/// a session has been read).
static REGISTRY: Mutex<Vec<Arc<Mutex<ThreadLog>>>> = Mutex::new(Vec::new());
static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static LOG: RefCell<Option<Arc<Mutex<ThreadLog>>>> = const { RefCell::new(None) };
}

/// `true` while a profiling session records (the one check an op makes when
/// profiling is off).
#[inline]
pub(crate) fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// The session being recorded.
pub(crate) fn session() -> u64 {
    SESSION.load(Ordering::Acquire)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `f` on this thread's log for the current session (emptied first if it
/// holds an older session's records); `None` during thread teardown.
fn with_log<R>(f: impl FnOnce(&mut ThreadLog) -> R) -> Option<R> {
    let s = session();
    LOG.try_with(|slot| {
        let log = {
            let mut slot = slot.try_borrow_mut().ok()?;
            slot.get_or_insert_with(|| {
                let log = Arc::new(Mutex::new(ThreadLog {
                    session: s,
                    thread: NEXT_THREAD.fetch_add(1, Ordering::Relaxed),
                    thread_name: std::thread::current()
                        .name()
                        .unwrap_or("unnamed")
                        .to_string(),
                    events: Vec::new(),
                    stack: Vec::new(),
                    loose_alloc: 0,
                    loose_freed: 0,
                }));
                lock(&REGISTRY).push(log.clone());
                log
            })
            .clone()
        };
        let mut log = lock(&log);
        if log.session != s {
            log.session = s;
            log.events.clear();
            log.stack.clear();
            log.loose_alloc = 0;
            log.loose_freed = 0;
        }
        Some(f(&mut log))
    })
    .ok()
    .flatten()
}

/// An open record; closing it (drop) writes its end.
#[must_use = "a record ends when its scope is dropped"]
pub(crate) struct Scope {
    session: u64,
    index: usize,
    /// The record is in this thread's log: the scope ends on this thread.
    _this_thread: std::marker::PhantomData<*const ()>,
}

impl Drop for Scope {
    #[inline]
    fn drop(&mut self) {
        close(self.session, self.index);
    }
}

/// Ends the record `index` of `session` on this thread (kept out of line: ops
/// drop an `Option<Scope>` that is `None` while nothing records).
#[cold]
#[inline(never)]
fn close(session: u64, index: usize) {
    let now = Instant::now();
    {
        with_log(|log| {
            if log.session != session || index >= log.events.len() {
                return;
            }
            let e = &mut log.events[index];
            e.end = Some(now);
            if let Some(span) = e.span.as_mut() {
                span.end();
            }
            // scopes close in order; one dropped out of order leaves those
            // opened inside it open (a struct's guards drop first field first)
            if let Some(at) = log.stack.iter().rposition(|&i| i == index) {
                log.stack.remove(at);
            }
        });
    }
}

/// What a new record is.
pub(crate) struct Begin<'a> {
    pub name: Name,
    pub kind: EventKind,
    pub device: Option<Device>,
    pub dtype: Option<DType>,
    pub shapes: &'a [&'a [usize]],
    pub module: Option<Arc<str>>,
}

/// Opens a record on this thread (call only when [`active`]); `span` times its
/// device work.
#[inline(never)]
pub(crate) fn begin(b: Begin<'_>, span: Option<Box<dyn DeviceSpan>>) -> Option<Scope> {
    let start = Instant::now();
    with_log(|log| {
        let index = log.events.len();
        log.events.push(RawEvent {
            name: b.name,
            kind: b.kind,
            parent: log.stack.last().copied(),
            device: b.device,
            dtype: b.dtype,
            shapes: b.shapes.iter().map(|s| s.to_vec()).collect(),
            module: b.module,
            start,
            end: None,
            span,
            kernels: Vec::new(),
            alloc_bytes: 0,
            freed_bytes: 0,
        });
        log.stack.push(index);
        Scope {
            session: log.session,
            index,
            _this_thread: std::marker::PhantomData,
        }
    })
}

/// Opens a range of `kind` (nothing when no session records).
#[inline]
pub(crate) fn range(name: Name, kind: EventKind) -> Option<Scope> {
    if !active() {
        return None;
    }
    open_range(name, kind)
}

#[cold]
#[inline(never)]
fn open_range(name: Name, kind: EventKind) -> Option<Scope> {
    begin(
        Begin {
            name,
            kind,
            device: None,
            dtype: None,
            shapes: &[],
            module: None,
        },
        None,
    )
}

/// [`range`] with a name made only when a session records.
#[inline]
pub(crate) fn range_with(kind: EventKind, name: impl FnOnce() -> Name) -> Option<Scope> {
    if !active() {
        return None;
    }
    range(name(), kind)
}

/// A [`EventKind::Function`] range named `name`, unless the innermost open record
/// is already that range (an op that calls itself again with its inputs cast,
/// as autocast does, stays one record).
#[inline]
pub(crate) fn function(name: &'static str) -> Option<Scope> {
    if !active() {
        return None;
    }
    open_function(name)
}

#[cold]
#[inline(never)]
fn open_function(name: &'static str) -> Option<Scope> {
    let again = with_log(|log| {
        log.stack.last().is_some_and(|&top| {
            let e = &log.events[top];
            e.kind == EventKind::Function && matches!(e.name, Name::Static(n) if n == name)
        })
    });
    if again != Some(false) {
        return None;
    }
    range(Name::Static(name), EventKind::Function)
}

/// Notes a kernel (or library call) launched by the innermost open record.
#[inline]
pub(crate) fn kernel(name: impl FnOnce() -> Name) {
    if active() {
        kernel_slow(name());
    }
}

#[cold]
#[inline(never)]
fn kernel_slow(name: Name) {
    with_log(|log| {
        if let Some(&top) = log.stack.last() {
            log.events[top].kernels.push(name);
        }
    });
}

/// Notes `bytes` allocated (or freed, when `alloc` is false) on this thread:
/// counted to the innermost open record.
#[inline]
pub(crate) fn memory(bytes: usize, alloc: bool) {
    if active() && bytes > 0 {
        memory_slow(bytes, alloc);
    }
}

#[cold]
#[inline(never)]
fn memory_slow(bytes: usize, alloc: bool) {
    with_log(|log| {
        let b = bytes as u64;
        match (log.stack.last().copied(), alloc) {
            (Some(top), true) => log.events[top].alloc_bytes += b,
            (Some(top), false) => log.events[top].freed_bytes += b,
            (None, true) => log.loose_alloc += b,
            (None, false) => log.loose_freed += b,
        }
    });
}

/// Starts a session; `false` when one is already on.
pub(crate) fn start() -> bool {
    if ACTIVE
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return false;
    }
    SESSION.fetch_add(1, Ordering::AcqRel);
    true
}

/// Ends the session and takes every thread's records (open ones end `now`).
pub(crate) fn stop() -> Vec<ThreadLog> {
    let s = session();
    ACTIVE.store(false, Ordering::Release);
    SESSION.fetch_add(1, Ordering::AcqRel);
    let now = Instant::now();
    let mut registry = lock(&REGISTRY);
    let mut out = Vec::new();
    for log in registry.iter() {
        let mut log = lock(log);
        if log.session != s
            || (log.events.is_empty() && log.loose_alloc == 0 && log.loose_freed == 0)
        {
            continue;
        }
        let open = std::mem::take(&mut log.stack);
        for &i in &open {
            let e = &mut log.events[i];
            if e.end.is_none() {
                e.end = Some(now);
                if let Some(span) = e.span.as_mut() {
                    span.end();
                }
            }
        }
        out.push(ThreadLog {
            session: s,
            thread: log.thread,
            thread_name: log.thread_name.clone(),
            events: std::mem::take(&mut log.events),
            stack: Vec::new(),
            loose_alloc: std::mem::take(&mut log.loose_alloc),
            loose_freed: std::mem::take(&mut log.loose_freed),
        });
        log.stack.clear();
    }
    // the logs of threads that have ended
    registry.retain(|l| Arc::strong_count(l) > 1);
    out
}
