//! Accounting for meta allocations: a hook that sees every allocation and free of
//! meta storage, and the phase of training and the module that asked for it.
//!
//! Meta tensors hold no memory, but they know how much they would: a hook installed
//! on a thread ([`set_hook`]) receives a [`MetaEvent`] for each meta storage made
//! on that thread and for its release (on whatever thread drops it). The event
//! carries the bytes, the dtype and element count, the training [`Phase`] (forward
//! unless inside `backward` or an optimizer's `step`) and the dotted path of the
//! module running (`"features.3"`, as `named_parameters` names them): what an
//! estimate of a step's memory needs, before anything runs on a GPU.
//!
//! ```
//! use ember::meta::{AllocHook, MetaEvent};
//! use ember::prelude::*;
//! use std::sync::{atomic::{AtomicUsize, Ordering}, Arc};
//!
//! #[derive(Default)]
//! struct Live(AtomicUsize);
//! impl AllocHook for Live {
//!     fn alloc(&self, e: &MetaEvent) { self.0.fetch_add(e.bytes, Ordering::Relaxed); }
//!     fn free(&self, e: &MetaEvent) { self.0.fetch_sub(e.bytes, Ordering::Relaxed); }
//! }
//! let live = Arc::new(Live::default());
//! ember::meta::with_hook(live.clone(), || -> ember::Result<()> {
//!     let x = Tensor::zeros([256, 1024], DType::F32, &Device::Meta)?;
//!     assert_eq!(live.0.load(Ordering::Relaxed), 1 << 20);
//!     drop(x);
//!     Ok(())
//! })?;
//! assert_eq!(live.0.load(Ordering::Relaxed), 0);
//! # Ok::<(), ember::Error>(())
//! ```

use crate::backend::profile::{self, EventKind};
use crate::dtype::DType;
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Where in a training step an allocation happens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Phase {
    /// The forward pass (and anything outside backward and optimizer steps).
    #[default]
    Forward,
    /// Inside `backward`.
    Backward,
    /// Inside an optimizer's `step`.
    Optimizer,
}

/// One allocation or free of meta storage.
#[derive(Clone, Copy, Debug)]
pub struct MetaEvent<'a> {
    /// Identifies the storage: its allocation and its free carry the same id.
    pub id: u64,
    /// The bytes the storage would take (element count × element size).
    pub bytes: usize,
    pub dtype: DType,
    pub numel: usize,
    /// The phase when the event happened.
    pub phase: Phase,
    /// The dotted path of the module running when the event happened (`""` outside
    /// any `Sequential`).
    pub module: &'a str,
    /// A buffer a CUDA op uses inside itself and frees before it returns (a
    /// convolution's patch matrix), not a tensor: reported so that an estimate of
    /// device memory sees it; its free follows before the op returns.
    pub workspace: bool,
}

/// Receives the meta allocations of the threads it is installed on.
pub trait AllocHook: Send + Sync {
    /// A meta storage was made.
    fn alloc(&self, event: &MetaEvent);
    /// A meta storage was dropped (its last tensor went away).
    fn free(&self, event: &MetaEvent);
    /// A module finished its forward pass with an output of `shape` and `dtype`
    /// (`module` is its dotted path). Reported by `Sequential` for each child, on
    /// every device; by default ignored.
    fn module_output(&self, _module: &str, _shape: &[usize], _dtype: DType) {}
}

thread_local! {
    static HOOK: RefCell<Option<Arc<dyn AllocHook>>> = const { RefCell::new(None) };
    static PHASE: Cell<Phase> = const { Cell::new(Phase::Forward) };
    static MODULE: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Installs `hook` for meta allocations made on this thread (`None` removes it);
/// returns the previous one.
pub fn set_hook(hook: Option<Arc<dyn AllocHook>>) -> Option<Arc<dyn AllocHook>> {
    HOOK.with(|h| std::mem::replace(&mut *h.borrow_mut(), hook))
}

thread_local! {
    /// The compute capability of the GPU meta models on this thread.
    static ARCH: Cell<u32> = const { Cell::new(90) };
}

/// The compute capability (`major * 10 + minor`) of the GPU the meta device models
/// on this thread, which decides the kernels a step would run (the fused attention
/// needs 80 or more): 90 (Hopper) unless [`with_arch`] says otherwise.
pub fn modelled_arch() -> u32 {
    ARCH.with(|a| a.get())
}

/// Runs `f` with the meta device modelling a GPU of compute capability `arch`
/// (`major * 10 + minor`) on this thread, then restores the previous one.
pub fn with_arch<R>(arch: u32, f: impl FnOnce() -> R) -> R {
    with_value(&ARCH, arch, f)
}

/// Runs `f` with `cell` (a thread-local setting) holding `value`, then restores
/// the previous value, also when `f` panics.
fn with_value<T: Copy + 'static, R>(
    cell: &'static std::thread::LocalKey<Cell<T>>,
    value: T,
    f: impl FnOnce() -> R,
) -> R {
    struct Restore<T: Copy + 'static>(&'static std::thread::LocalKey<Cell<T>>, T);
    impl<T: Copy + 'static> Drop for Restore<T> {
        fn drop(&mut self) {
            self.0.with(|c| c.set(self.1));
        }
    }
    let _restore = Restore(cell, cell.with(|c| c.replace(value)));
    f()
}

thread_local! {
    /// The multiprocessors of the GPU meta models on this thread.
    static MULTIPROCESSORS: Cell<usize> = const { Cell::new(132) };
}

/// The multiprocessor count of the GPU the meta device models on this thread,
/// which decides how a GPU splits a long reduction (and so the partial sums it
/// allocates): 132 (an H100 or H200) unless [`with_multiprocessors`] says otherwise.
pub fn modelled_multiprocessors() -> usize {
    MULTIPROCESSORS.with(|m| m.get())
}

/// Runs `f` with the meta device modelling a GPU of `count` multiprocessors on
/// this thread, then restores the previous count.
pub fn with_multiprocessors<R>(count: usize, f: impl FnOnce() -> R) -> R {
    with_value(&MULTIPROCESSORS, count.max(1), f)
}

thread_local! {
    /// Whether the GPU meta models on this thread has cuDNN.
    static CUDNN: Cell<bool> = const { Cell::new(true) };
}

/// Whether the GPU the meta device models on this thread convolves through cuDNN
/// where `ember::cuda::cudnn` is switched on: yes unless [`with_cudnn`] says it
/// has no cuDNN (then ember's im2col path, as with the switch off).
pub fn modelled_cudnn() -> bool {
    CUDNN.with(|c| c.get())
}

/// Runs `f` with the meta device modelling a GPU with (`true`) or without cuDNN
/// on this thread, then restores the previous setting.
pub fn with_cudnn<R>(available: bool, f: impl FnOnce() -> R) -> R {
    with_value(&CUDNN, available, f)
}

/// Runs `f` with `hook` installed on this thread, then restores the previous hook.
pub fn with_hook<R>(hook: Arc<dyn AllocHook>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Arc<dyn AllocHook>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            set_hook(self.0.take());
        }
    }
    let _restore = Restore(set_hook(Some(hook)));
    f()
}

/// The phase this thread is in.
pub fn phase() -> Phase {
    PHASE.with(|p| p.get())
}

/// Restores the previous phase when dropped.
pub struct PhaseGuard {
    previous: Phase,
    /// The profiler's range of the phase (`backward`, `optimizer.step`).
    _record: Option<profile::Scope>,
}

impl Drop for PhaseGuard {
    fn drop(&mut self) {
        PHASE.with(|p| p.set(self.previous));
    }
}

/// Marks this thread as in `phase` until the guard drops (autograd's `backward`
/// and the optimizers' `step` do this).
pub fn enter_phase(phase: Phase) -> PhaseGuard {
    let name = match phase {
        Phase::Forward => None,
        Phase::Backward => Some("backward"),
        Phase::Optimizer => Some("optimizer.step"),
    };
    PhaseGuard {
        previous: PHASE.with(|p| p.replace(phase)),
        _record: name.and_then(|n| profile::range(profile::Name::Static(n), EventKind::Function)),
    }
}

/// Restores the previous module path when dropped.
pub struct ModuleGuard {
    len: usize,
    /// The profiler's range of the module's forward, named by its path.
    record: Option<profile::Scope>,
}

impl Drop for ModuleGuard {
    fn drop(&mut self) {
        // the profiler's range closes first, as it opened last
        drop(self.record.take());
        MODULE.with(|m| m.borrow_mut().truncate(self.len));
    }
}

/// Appends `name` to this thread's module path until the guard drops
/// (`Sequential::forward` does this for each child, so paths read like
/// `named_parameters`' names).
pub fn enter_module(name: impl std::fmt::Display) -> ModuleGuard {
    use std::fmt::Write;
    MODULE.with(|m| {
        let mut m = m.borrow_mut();
        let len = m.len();
        if !m.is_empty() {
            m.push('.');
        }
        // into the thread's own buffer: no allocation once it has grown
        let _ = write!(m, "{name}");
        let record = profile::range_with(EventKind::Module, || {
            profile::Name::Shared(Arc::from(m.as_str()))
        });
        ModuleGuard { len, record }
    })
}

/// The dotted path of the module running on this thread.
pub fn module_path() -> String {
    MODULE.with(|m| m.borrow().clone())
}

/// Reports the output of the module running on this thread (its path is the
/// current [`module_path()`]) to this thread's hook, if any. Modules that run
/// children call it after each child's forward, inside the child's scope.
pub fn module_output(shape: &[usize], dtype: DType) {
    let Some(hook) = HOOK.try_with(|h| h.borrow().clone()).ok().flatten() else {
        return;
    };
    let module = MODULE
        .try_with(|m| m.try_borrow().map(|m| m.clone()).unwrap_or_default())
        .unwrap_or_default();
    hook.module_output(&module, shape, dtype);
}

/// The hook of this thread, for a new storage to report to.
pub(super) fn current_hook() -> Option<Arc<dyn AllocHook>> {
    HOOK.with(|h| h.borrow().clone())
}

/// A new storage id.
pub(super) fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Calls `f` with an event for the storage `id` as of now on this thread. Safe in
/// a `Drop` at any time: while the thread's locals are torn down, or from a hook
/// that itself enters a module, the event carries the default phase or no module.
pub(super) fn report(
    id: u64,
    dtype: DType,
    numel: usize,
    workspace: bool,
    f: impl FnOnce(&MetaEvent),
) {
    let phase = PHASE.try_with(|p| p.get()).unwrap_or_default();
    let module = MODULE
        .try_with(|m| m.try_borrow().map(|m| m.clone()).unwrap_or_default())
        .unwrap_or_default();
    f(&MetaEvent {
        id,
        bytes: numel.saturating_mul(dtype.size_in_bytes()),
        dtype,
        numel,
        phase,
        module: &module,
        workspace,
    })
}
