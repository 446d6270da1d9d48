//! Where the time goes: a profiler in the shape of `torch.profiler`.
//!
//! While a [`Profiler`] is on, ember records every primitive it dispatches to a
//! device (its name, input shapes, dtype and device; the host time of its dispatch;
//! on a GPU the device time between two events on its stream; the kernels and
//! library calls it queued; the bytes it allocated and freed), and the ranges
//! around them: module forwards (by dotted path, `layer1.0.conv1`), the backward
//! rule of each recorded op (named after the forward op, with the module it ran
//! in), the backward pass and the optimizer's step, operations built of several
//! primitives (`layer_norm`, `cross_entropy`, `linear`, attention), and the user's
//! own [`record_function`] ranges. Ranges nest per thread: two threads' ranges
//! never mix.
//!
//! [`Profiler::stop`] returns a [`Profile`]: [`Profile::key_averages`] is the
//! per-op table (count, self and total device time, host time, memory), sorted
//! by device time; [`Profile::export_chrome_trace`] writes a Chrome trace-event
//! file that Perfetto (ui.perfetto.dev) and `chrome://tracing` open, with a host
//! track per thread and a device track per GPU.
//!
//! ```
//! use ember::prelude::*;
//! use ember::profiler::{self, Profiler, SortBy};
//!
//! let dev = Device::Cpu;
//! let x = Tensor::randn([64, 128], &dev)?;
//! let w = Tensor::randn([128, 32], &dev)?.requires_grad_(true)?;
//! let prof = Profiler::start()?;
//! profiler::record_function("step", || -> ember::Result<()> {
//!     let loss = x.matmul(&w)?.relu()?.sum_all()?;
//!     loss.backward()
//! })?;
//! let profile = prof.stop()?;
//! let ops = profile.key_averages();
//! assert_eq!(ops.get("mm").unwrap().count, 2); // forward, and w's gradient
//! println!("{}", ops.table(SortBy::SelfDevice, 10));
//! # Ok::<(), ember::Error>(())
//! ```
//!
//! Device time on a GPU is the time between an event recorded on the op's stream
//! before its work and one after: when the GPU runs ahead of the host, that is
//! the op's kernels; when the GPU waits for the host (a small, launch-bound
//! workload), the wait counts too, and device time approaches host time. On the
//! CPU an op's device time is its host time. `meta` ops have no device time.
//!
//! Off (the default), profiling costs each op one relaxed atomic load.

mod report;
mod trace;

pub use crate::backend::profile::EventKind;
pub use report::{Event, KeyAverages, OpStats, Profile, SortBy};

use crate::backend::profile as rec;
use crate::error::{Error, Result};
use std::sync::Arc;
use std::time::Instant;

/// A profiling session: on from [`start`](Profiler::start) to
/// [`stop`](Profiler::stop) (or drop, which discards what it recorded).
#[must_use = "profiling stops when the Profiler is dropped"]
pub struct Profiler {
    start: Instant,
    done: bool,
}

impl Profiler {
    /// Starts recording, on every thread. One session at a time: an error while
    /// another is on.
    pub fn start() -> Result<Profiler> {
        if !rec::start() {
            return Err(Error::invalid(
                "profiler",
                "a profiling session is already on: stop it before starting another",
            ));
        }
        Ok(Profiler {
            start: Instant::now(),
            done: false,
        })
    }

    /// Stops recording and reads the records: a GPU's timing events are read now
    /// (this waits for the work queued while profiling, once per GPU), and the
    /// device times placed on the host's timeline.
    pub fn stop(mut self) -> Result<Profile> {
        self.done = true;
        let logs = rec::stop();
        Ok(Profile::from_logs(self.start, Instant::now(), logs))
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        if !self.done {
            drop(rec::stop());
        }
    }
}

/// Runs `f` under a new [`Profiler`] and returns its result with the profile.
/// An error of `f` is returned as is (the records are discarded).
pub fn profile<R>(f: impl FnOnce() -> Result<R>) -> Result<(R, Profile)> {
    let p = Profiler::start()?;
    let r = f()?;
    Ok((r, p.stop()?))
}

/// Profiles a few steps of a loop after a warm-up (PyTorch's
/// `schedule(warmup=..., active=...)` with `prof.step()`): call
/// [`step`](StepProfiler::step) after each step; the session starts after the
/// `warmup`-th and ends after `warmup + active` steps.
///
/// ```
/// use ember::prelude::*;
/// let x = Tensor::randn([32, 32], &Device::Cpu)?;
/// let mut prof = ember::profiler::StepProfiler::new(2, 3)?;
/// for _ in 0..10 {
///     x.matmul(&x)?;
///     prof.step()?;
/// }
/// let profile = prof.take().expect("steps 3 to 5 were profiled");
/// assert_eq!(profile.key_averages().get("mm").unwrap().count, 3);
/// # Ok::<(), ember::Error>(())
/// ```
pub struct StepProfiler {
    warmup: usize,
    active: usize,
    seen: usize,
    on: Option<Profiler>,
    done: Option<Profile>,
    /// [`stop`](Self::stop) was called: no session starts after it.
    stopped: bool,
}

impl StepProfiler {
    /// Profiles steps `warmup + 1` to `warmup + active`; with a warm-up of 0 the
    /// session starts now. `active` of 0 is refused.
    pub fn new(warmup: usize, active: usize) -> Result<StepProfiler> {
        if active == 0 {
            return Err(Error::invalid(
                "profiler::StepProfiler",
                "profile at least one step (active must be 1 or more)",
            ));
        }
        let mut p = StepProfiler {
            warmup,
            active,
            seen: 0,
            on: None,
            done: None,
            stopped: false,
        };
        p.advance()?;
        Ok(p)
    }

    /// Marks the end of a step.
    pub fn step(&mut self) -> Result<()> {
        self.seen += 1;
        self.advance()
    }

    fn advance(&mut self) -> Result<()> {
        if self.seen == self.warmup && self.on.is_none() && self.done.is_none() && !self.stopped {
            self.on = Some(Profiler::start()?);
        } else if self.seen >= self.warmup + self.active {
            self.stop()?;
        }
        Ok(())
    }

    /// `true` while the profiled steps run.
    pub fn is_recording(&self) -> bool {
        self.on.is_some()
    }

    /// Ends the session now (a loop that ended before its last profiled step).
    pub fn stop(&mut self) -> Result<()> {
        self.stopped = true;
        if let Some(p) = self.on.take() {
            self.done = Some(p.stop()?);
        }
        Ok(())
    }

    /// The profile, once the profiled steps have run (or [`stop`](Self::stop));
    /// `None` before, and after it was taken.
    pub fn take(&mut self) -> Option<Profile> {
        self.done.take()
    }
}

/// `true` while a profiling session records.
pub fn is_enabled() -> bool {
    rec::active()
}

/// A user range (PyTorch's `with record_function(name):`): everything recorded on
/// this thread until the guard drops nests inside it. Nothing when no session
/// records.
#[must_use = "the range ends when the guard is dropped"]
pub struct RecordFunction {
    _scope: Option<rec::Scope>,
}

/// Opens a user range named `name` until the returned guard drops.
pub fn range(name: impl AsRef<str>) -> RecordFunction {
    RecordFunction {
        _scope: rec::range_with(EventKind::User, || {
            rec::Name::Shared(Arc::from(name.as_ref()))
        }),
    }
}

/// Runs `f` inside a user range named `name` (PyTorch's `record_function`).
pub fn record_function<R>(name: impl AsRef<str>, f: impl FnOnce() -> R) -> R {
    let _r = range(name);
    f()
}

/// A range of ember's own (an operation of the tensor or nn layer made of several
/// primitives); nothing when no session records.
#[inline]
pub(crate) fn function(name: &'static str) -> Option<rec::Scope> {
    rec::function(name)
}

/// The range of one backward rule, named after its forward op, with the module
/// path the forward ran in.
#[inline]
pub(crate) fn backward_rule(name: &'static str, module: Option<&Arc<str>>) -> Option<rec::Scope> {
    if !rec::active() {
        return None;
    }
    rec::begin(
        rec::Begin {
            name: rec::Name::Static(name),
            kind: EventKind::Backward,
            device: None,
            dtype: None,
            shapes: &[],
            module: module.cloned(),
        },
        None,
    )
}

/// The module path to keep with a recorded op (for its backward rule's range),
/// only while a session records.
#[inline]
pub(crate) fn forward_module() -> Option<Arc<str>> {
    if !rec::active() {
        return None;
    }
    Some(Arc::from(crate::backend::meta::account::module_path()))
}
