//! The [`Tensor`] type: a cheap handle to values on one device.
//!
//! ```
//! use ember::{Device, DType, Tensor};
//! let dev = Device::Cpu;
//! let a = Tensor::new(&[[1f32, 2.], [3., 4.]], &dev)?;
//! let b = Tensor::ones([2, 2], DType::F32, &dev)?;
//! let c = a.matmul(&b)?.add(1.0)?;
//! assert_eq!(c.to_vec2::<f32>()?, vec![vec![4., 4.], vec![8., 8.]]);
//! println!("{c}");
//! # Ok::<(), ember::Error>(())
//! ```

mod advanced_index;
mod arith;
mod attention;
pub(crate) mod autocast;
mod batch_norm;
mod comm;
mod conv;
mod conv3d;
mod conv_transpose;
mod conv_transpose3d;
mod counting;
pub(crate) mod create;
mod cumulative;
mod diagonals;
mod display;
mod einsum;
mod elementwise;
mod fill;
mod format;
pub(crate) use elementwise::{not_implemented_for, torch_dtype_name};
mod grad;
mod index;
mod index_more;
mod inplace;
mod logical;
mod math;
mod math_more;
mod matmul;
mod more_ops;
mod more_products;
mod pointwise;
mod pool;
mod random_fill;
mod rearrange;
mod reduce;
mod reduce_more;
mod reshaping;
pub(crate) mod shape;
mod sort;
mod special;
mod views;

pub use crate::backend::{initial_seed, manual_seed, with_global_rng};
pub use advanced_index::{IntoTensorIndex, TensorIndex};
pub(crate) use batch_norm::{update_running_stats, BatchStats, Momentum, RunningUpdate};
pub use conv::Conv2dOptions;
pub use conv3d::Conv3dOptions;
pub use conv_transpose::ConvTranspose2dOptions;
pub use conv_transpose3d::ConvTranspose3dOptions;
pub use create::NdArray;
pub use display::{set_print_options, PrintOptions};
pub use elementwise::{Operand, Scalar};
pub use index::{Idx, IndexArg};
pub use pool::Pool2dOptions;
pub use rearrange::PadMode;
pub use reshaping::Sections;
pub use shape::{IntoDims, IntoShape};

use crate::autograd::Node;
use crate::backend::Storage;
use crate::dtype::CpuData;
use crate::layout::Layout;
use crate::{
    device::Device,
    dtype::DType,
    error::{Error, Result},
};
use smallvec::SmallVec;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// An n-dimensional array of one dtype on one device.
///
/// Cloning is cheap (a reference count). Views (`reshape` of contiguous data,
/// `transpose`, `narrow`, `expand`, ...) share the storage and only change the layout.
#[derive(Clone)]
pub struct Tensor(Arc<Inner>);

struct Inner {
    storage: Arc<Shared>,
    layout: Layout,
    dtype: DType,
    device: Device,
    /// Set on leaves by `requires_grad_`, and on every recorded op output.
    requires_grad: AtomicBool,
    /// The accumulated gradient of a leaf.
    grad: Mutex<Option<Tensor>>,
    /// Called after `backward` accumulates into `grad`
    /// (`register_post_accumulate_grad_hook`); empty, and unallocated, on most tensors.
    hooks: Mutex<Vec<crate::autograd::GradHook>>,
    /// How this tensor was computed, when it was recorded. A recorded in-place op
    /// replaces it (the consumers of the old values keep the old node).
    node: Mutex<Option<Arc<Node>>>,
    /// Made by a view op (reshape, transpose, narrow, ...): counted in the
    /// storage's live views while it exists.
    is_view: bool,
}

/// What every tensor over one storage shares: the values, and PyTorch's version
/// counter (bumped by every write, checked by the tensors autograd saved).
struct Shared {
    data: RwLock<Storage>,
    version: AtomicU64,
    /// How many view tensors over this storage exist (a recorded in-place op is
    /// refused while any does: ember does not rebase a view's history).
    views: AtomicUsize,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if self.is_view {
            self.storage.views.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Tensor {
    /// A tensor over `storage` with `layout`.
    pub(crate) fn with_storage(storage: Storage, layout: Layout) -> Tensor {
        Tensor(Arc::new(Inner {
            dtype: storage.dtype(),
            device: storage.device(),
            storage: Arc::new(Shared {
                data: RwLock::new(storage),
                version: AtomicU64::new(0),
                views: AtomicUsize::new(0),
            }),
            layout,
            requires_grad: AtomicBool::new(false),
            grad: Mutex::new(None),
            hooks: Mutex::new(Vec::new()),
            node: Mutex::new(None),
            is_view: false,
        }))
    }

    /// A contiguous tensor of `shape` over `storage` (of that many elements).
    pub(crate) fn from_storage(storage: Storage, shape: &[usize]) -> Tensor {
        Tensor::with_storage(storage, Layout::contiguous(shape))
    }

    /// [`from_storage`](Self::from_storage) with `like`'s shape (its layout
    /// reused where it is contiguous from offset 0 without size-1 or empty dims,
    /// whose strides could be other than row-major's).
    pub(crate) fn from_storage_like(storage: Storage, like: &Layout) -> Tensor {
        let plain = like.shape().iter().all(|&n| n > 1);
        let layout = if like.offset() == 0 && plain && like.is_contiguous() {
            like.clone()
        } else {
            Layout::contiguous(like.shape())
        };
        Tensor::with_storage(storage, layout)
    }

    /// A view of the same storage with another layout (no autograd history: view
    /// ops record their own node).
    pub(crate) fn with_layout(&self, layout: Layout) -> Tensor {
        self.alias(layout, true, None)
    }

    /// Another handle on this storage: a view or not, with `node` as its history.
    fn alias(&self, mut layout: Layout, is_view: bool, node: Option<Arc<Node>>) -> Tensor {
        if layout.offset != 0 && layout.shape.contains(&0) {
            // an empty view touches no element: its offset (which may lie past the
            // end of an empty storage, as in `zeros([2, 0, 3]).narrow(0, 1, 1)`) is
            // never used, and backends slice from it
            layout.offset = 0;
        }
        if is_view {
            self.0.storage.views.fetch_add(1, Ordering::Relaxed);
        }
        Tensor(Arc::new(Inner {
            storage: self.0.storage.clone(),
            layout,
            dtype: self.0.dtype,
            device: self.0.device,
            requires_grad: AtomicBool::new(node.is_some()),
            grad: Mutex::new(None),
            hooks: Mutex::new(Vec::new()),
            node: Mutex::new(node),
            is_view,
        }))
    }

    /// A handle on these values with another layout that is not counted as a view
    /// (for a fresh copy that no other handle sees).
    pub(crate) fn with_layout_owned(&self, layout: Layout) -> Tensor {
        self.alias(layout, false, None)
    }

    /// This tensor's values with `node` as their history.
    pub(crate) fn with_node(&self, node: Arc<Node>) -> Tensor {
        self.alias(self.0.layout.clone(), self.0.is_view, Some(node))
    }

    /// The storage's version: how many writes it has seen (`tensor._version`).
    pub fn version(&self) -> u64 {
        self.0.storage.version.load(Ordering::Acquire)
    }

    /// `true` for a tensor made by a view op.
    pub(crate) fn is_view(&self) -> bool {
        self.0.is_view
    }

    /// How many view tensors over this tensor's storage exist.
    pub(crate) fn live_views(&self) -> usize {
        self.0.storage.views.load(Ordering::Relaxed)
    }

    /// Identity of this tensor (not of its storage) for the autograd walk.
    pub(crate) fn id(&self) -> usize {
        Arc::as_ptr(&self.0) as usize
    }

    /// Makes `node` this tensor's history (every handle on it sees the change).
    pub(crate) fn set_node(&self, node: Arc<Node>) {
        *self.0.node.lock().unwrap_or_else(|p| p.into_inner()) = Some(node);
        self.0.requires_grad.store(true, Ordering::Relaxed);
    }

    /// `true` when no other handle shares this tensor (its `Inner`).
    pub(crate) fn is_unique_handle(&mut self) -> bool {
        Arc::get_mut(&mut self.0).is_some()
    }

    pub(crate) fn node(&self) -> Option<Arc<Node>> {
        self.0
            .node
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn has_node(&self) -> bool {
        self.0
            .node
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    pub(crate) fn hook_slot(&self) -> MutexGuard<'_, Vec<crate::autograd::GradHook>> {
        self.0.hooks.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn grad_slot(&self) -> MutexGuard<'_, Option<Tensor>> {
        self.0.grad.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `true` when gradients flow to or through this tensor.
    pub fn requires_grad(&self) -> bool {
        self.0.requires_grad.load(Ordering::Relaxed)
    }

    /// Marks a leaf as needing a gradient (`tensor.requires_grad_()`); returns the
    /// tensor itself for chaining. Only floating-point tensors can require gradients.
    pub fn requires_grad_(self, on: bool) -> Result<Tensor> {
        if on && !self.dtype().is_float() {
            return Err(Error::dtype(
                "requires_grad_",
                self.dtype(),
                "only tensors of floating point dtype can require gradients",
            ));
        }
        if !on && self.has_node() {
            return Err(Error::invalid(
                "requires_grad_",
                "you can only change requires_grad flags of leaf variables; use .detach()",
            ));
        }
        self.0.requires_grad.store(on, Ordering::Relaxed);
        Ok(self)
    }

    /// `true` for tensors not produced by a recorded op (parameters, inputs).
    pub fn is_leaf(&self) -> bool {
        !self.has_node()
    }

    /// The gradient accumulated by `backward` (leaves only).
    pub fn grad(&self) -> Option<Tensor> {
        self.grad_slot().clone()
    }

    /// Replaces the accumulated gradient (`tensor.grad = g`; `None` clears it,
    /// like [`zero_grad`](Self::zero_grad)). As PyTorch, a gradient of another
    /// shape, dtype or device than the tensor's is an error (the gradient is
    /// left as it was).
    pub fn set_grad(&self, grad: Option<Tensor>) -> Result<()> {
        if let Some(g) = &grad {
            let differs = if g.shape() != self.shape() {
                Some(format!(
                    "of a different size ({:?}; the tensor's is {:?})",
                    g.shape(),
                    self.shape()
                ))
            } else if g.dtype() != self.dtype() {
                Some(format!(
                    "of a different type ({}; the tensor's is {})",
                    g.dtype(),
                    self.dtype()
                ))
            } else if g.device() != self.device() {
                Some(format!(
                    "located on a different device ({}; the tensor is on {})",
                    g.device(),
                    self.device()
                ))
            } else {
                None
            };
            if let Some(what) = differs {
                return Err(Error::invalid(
                    "set_grad",
                    format!("assigned grad has data {what}"),
                ));
            }
        }
        *self.grad_slot() = grad;
        Ok(())
    }

    /// Clears the accumulated gradient.
    pub fn zero_grad(&self) {
        *self.grad_slot() = None;
    }

    /// The same values, sharing storage, outside the graph (`tensor.detach()`): a
    /// new tensor whose `requires_grad` flag and gradient are its own, so that
    /// `x.detach().requires_grad_(true)` leaves `x` as it was.
    pub fn detach(&self) -> Tensor {
        self.alias(self.0.layout.clone(), false, None)
    }

    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Storage> {
        self.0
            .storage
            .data
            .read()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a write made outside [`write`](Self::write) (a user's kernel,
    /// which writes through a pointer while the storage is read-locked).
    pub(crate) fn bump_version(&self) {
        self.0.storage.version.fetch_add(1, Ordering::AcqRel);
    }

    /// The storage for writing; counts as a write for the version counter.
    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, Storage> {
        self.bump_version();
        self.0
            .storage
            .data
            .write()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// A new tensor of this tensor's shape from what `f` computes of its storage
    /// and layout.
    pub(crate) fn map_storage_same(
        &self,
        f: impl FnOnce(&Storage, &Layout) -> Result<Storage>,
    ) -> Result<Tensor> {
        let out = f(&self.read(), self.layout())?;
        Ok(Tensor::from_storage_like(out, self.layout()))
    }

    /// A new tensor of `shape` from what `f` computes of this tensor's storage and
    /// layout.
    pub(crate) fn map_storage(
        &self,
        shape: &[usize],
        f: impl FnOnce(&Storage, &Layout) -> Result<Storage>,
    ) -> Result<Tensor> {
        let out = f(&self.read(), self.layout())?;
        Ok(Tensor::from_storage(out, shape))
    }

    /// A contiguous tensor of host values on `device` (uploaded for a GPU).
    pub(crate) fn from_host(data: CpuData, shape: &[usize], device: Device) -> Result<Tensor> {
        debug_assert_eq!(data.len(), shape.iter().product::<usize>());
        Ok(Tensor::from_storage(
            Storage::from_host(device, data)?,
            shape,
        ))
    }

    /// [`from_host`](Self::from_host) of the values `make` computes, which the
    /// `meta` device never asks for.
    pub(crate) fn from_host_with(
        shape: &[usize],
        dtype: DType,
        device: Device,
        make: impl FnOnce() -> Result<CpuData>,
    ) -> Result<Tensor> {
        let n = shape.iter().product();
        Ok(Tensor::from_storage(
            Storage::from_host_with(device, dtype, n, make)?,
            shape,
        ))
    }

    /// `true` when both are handles on one tensor (Python's `a is b`).
    pub(crate) fn is(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// `true` when both tensors view the same storage.
    pub(crate) fn same_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.0.storage, &other.0.storage)
    }

    /// Whether this tensor has values to read (every device but `meta`).
    pub(crate) fn holds_values(&self) -> bool {
        self.read().holds_values()
    }

    /// A number that identifies this tensor's storage while it lives (tensors
    /// sharing a storage have the same).
    pub(crate) fn storage_key(&self) -> usize {
        Arc::as_ptr(&self.0.storage) as *const () as usize
    }

    /// `true` when nothing else holds this tensor's storage (safe to overwrite).
    pub(crate) fn storage_is_unique(&self) -> bool {
        Arc::strong_count(&self.0.storage) == 1 && Arc::strong_count(&self.0) == 1
    }

    /// The sizes of each dimension (`torch.Tensor.shape`).
    pub fn shape(&self) -> &[usize] {
        self.0.layout.shape()
    }

    /// Alias of [`shape`](Self::shape).
    pub fn dims(&self) -> &[usize] {
        self.shape()
    }

    /// The size of dimension `dim` (negative counts from the end).
    pub fn size(&self, dim: i64) -> Result<usize> {
        // (no wrap for a 0-d tensor here: it has no dimension to give)
        if self.rank() == 0 {
            return Err(Error::invalid(
                "size",
                format!("Dimension specified as {dim} but tensor has no dimensions"),
            ));
        }
        let d = crate::layout::normalize_dim("size", dim, self.rank())?;
        Ok(self.shape()[d])
    }

    /// Strides in elements.
    pub fn stride(&self) -> &[usize] {
        self.0.layout.strides()
    }

    /// The number of dimensions (`dim()` in PyTorch).
    pub fn rank(&self) -> usize {
        self.0.layout.rank()
    }

    /// Alias of [`rank`](Self::rank), PyTorch's name.
    pub fn dim(&self) -> usize {
        self.rank()
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.0.layout.numel()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.0.dtype
    }

    /// Where the values live.
    pub fn device(&self) -> Device {
        self.0.device
    }

    /// `true` when on a GPU.
    pub fn is_cuda(&self) -> bool {
        self.0.device.is_cuda()
    }

    /// The layout (shape, strides, offset) over the storage.
    pub fn layout(&self) -> &Layout {
        &self.0.layout
    }

    /// This tensor's layout broadcast to `shape` (borrowed when it has that shape).
    pub(crate) fn layout_as(
        &self,
        op: &'static str,
        shape: &[usize],
    ) -> Result<std::borrow::Cow<'_, Layout>> {
        if self.shape() == shape {
            Ok(std::borrow::Cow::Borrowed(self.layout()))
        } else {
            self.layout()
                .broadcast_to(op, shape)
                .map(std::borrow::Cow::Owned)
        }
    }

    /// `true` when the elements are dense and row-major.
    pub fn is_contiguous(&self) -> bool {
        self.0.layout.is_contiguous()
    }

    /// This tensor on `device`: the same tensor when already there, else a copy
    /// laid out as PyTorch's `preserve_format` lays it (a dense layout keeps its
    /// strides: a channels-last tensor stays channels-last). Gradients flow back
    /// to the source device.
    ///
    /// A copy to a GPU returns once the values are staged in pinned host memory; it
    /// does not wait for the GPU (the copy runs in order with the device's other
    /// work). A copy from a GPU waits for the work queued before it, since the values
    /// are then read.
    pub fn to(&self, device: &Device) -> Result<Tensor> {
        if *device == self.device() {
            return Ok(self.clone());
        }
        let out = self.map_storage_preserving(|s, l| s.to_device(l, *device))?;
        let from = self.device();
        Ok(Tensor::record_twice(out, "to", &[self], |_| {
            move |g: &Tensor| Ok(vec![Some(g.to(&from)?)])
        }))
    }

    /// Alias of [`to`](Self::to).
    pub fn to_device(&self, device: &Device) -> Result<Tensor> {
        self.to(device)
    }

    /// PyTorch's `.to(device, non_blocking=True)`, for data loaders: a copy from the
    /// host to a GPU returns without waiting for the GPU. In ember every upload
    /// behaves so (it is staged through pinned memory, see [`to`](Self::to)), so
    /// this is [`to`](Self::to) under the name PyTorch users look for; a copy from a
    /// GPU still waits, because its values are read on return.
    pub fn to_device_non_blocking(&self, device: &Device) -> Result<Tensor> {
        self.to(device)
    }

    /// Tells the caching allocator that work queued on `stream` uses this tensor's
    /// memory (`Tensor.record_stream`): when the tensor is freed, its block goes to
    /// new tensors only after the work queued on `stream` by then has finished.
    /// Needed when a tensor made on one stream is used on another and may be
    /// dropped before that stream's work has run (the allocator otherwise hands
    /// its block to the next tensor of the stream that made it at once). An error
    /// for a tensor that is not on the stream's device.
    pub fn record_stream(&self, stream: &crate::backend::Stream) -> Result<()> {
        self.read().record_stream(stream)
    }

    /// A copy on the CPU (this tensor when already there).
    pub fn cpu(&self) -> Result<Tensor> {
        self.to(&Device::Cpu)
    }

    /// This tensor on `cuda:i`.
    pub fn cuda(&self, i: usize) -> Result<Tensor> {
        self.to(&Device::Cuda(i))
    }

    /// The values converted to `dtype` (this tensor when it already has it).
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        let out = self.map_storage_preserving(|s, l| s.to_dtype(l, dtype))?;
        if !dtype.is_float() {
            return Ok(out);
        }
        let from = self.dtype();
        // the rule saves nothing: a cast that autocast caches for a region serves
        // every forward in it, and each backward goes through it
        Ok(Tensor::record_reusable(out, "to_dtype", &[self], |_| {
            move |g: &Tensor| Ok(vec![Some(g.to_dtype(from)?)])
        }))
    }

    /// This tensor in `dtype`: borrowed when it has that dtype, else converted.
    pub(crate) fn as_dtype(&self, dtype: DType) -> Result<std::borrow::Cow<'_, Tensor>> {
        if dtype == self.dtype() {
            Ok(std::borrow::Cow::Borrowed(self))
        } else {
            self.to_dtype(dtype).map(std::borrow::Cow::Owned)
        }
    }

    /// A contiguous tensor with the same values (this tensor when already contiguous).
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        self.copy()
    }

    /// A contiguous (row-major) copy that owns new storage: `torch.clone`, except
    /// that PyTorch's clone keeps a dense tensor's strides (a transposed or
    /// channels-last tensor's clone is laid out as it was); for that, follow with
    /// [`Tensor::to_memory_format`] or copy into a tensor of the layout wanted.
    pub fn copy(&self) -> Result<Tensor> {
        let out = self.map_storage_same(|s, l| s.copy(l))?;
        Ok(Tensor::record_twice(out, "copy", &[self], |_| {
            |g: &Tensor| Ok(vec![Some(g.clone())])
        }))
    }
}

/// Runs `f` on the storages of `a` and `b`, locking a shared storage once (see
/// [`Storages`]).
pub(crate) fn with_storages2<R>(
    a: &Tensor,
    b: &Tensor,
    f: impl FnOnce(&Storage, &Storage) -> R,
) -> R {
    let ga = a.read();
    if a.same_storage(b) {
        f(&ga, &ga)
    } else {
        f(&ga, &b.read())
    }
}

/// Read locks on the storages of several tensors, each storage locked once even
/// when tensors share it (a second read lock of one `RwLock` on a thread can
/// deadlock against a waiting writer).
pub(crate) struct Storages<'a> {
    guards: SmallVec<[RwLockReadGuard<'a, Storage>; 4]>,
    which: SmallVec<[usize; 4]>,
}

impl<'a> Storages<'a> {
    pub(crate) fn read(ts: &[&'a Tensor]) -> Storages<'a> {
        let mut guards: SmallVec<[RwLockReadGuard<'a, Storage>; 4]> = SmallVec::new();
        let mut owners: SmallVec<[&Tensor; 4]> = SmallVec::new();
        let mut which = SmallVec::new();
        for t in ts {
            match owners.iter().position(|o| o.same_storage(t)) {
                Some(i) => which.push(i),
                None => {
                    which.push(guards.len());
                    owners.push(t);
                    guards.push(t.read());
                }
            }
        }
        Storages { guards, which }
    }

    /// The storage of the `i`-th tensor.
    pub(crate) fn get(&self, i: usize) -> &Storage {
        &self.guards[self.which[i]]
    }
}

/// Errors unless every tensor is on the same device (PyTorch's message).
pub(crate) fn same_device(op: &'static str, ts: &[&Tensor]) -> Result<Device> {
    let d = ts[0].device();
    for t in &ts[1..] {
        if t.device() != d {
            let (a, b) = t.device().gpu_first(d);
            return Err(Error::DeviceMismatch { op, a, b });
        }
    }
    Ok(d)
}

impl Device {
    /// PyTorch names the GPU first in its device-mismatch message.
    fn gpu_first(self, other: Device) -> (Device, Device) {
        if self.is_cuda() {
            (self, other)
        } else {
            (other, self)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_mismatch_message_matches_pytorch() {
        let (a, b) = Device::Cuda(0).gpu_first(Device::Cpu);
        let e = Error::DeviceMismatch { op: "add", a, b };
        assert!(e.to_string().starts_with(
            "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"
        ));
        let (a, b) = Device::Cpu.gpu_first(Device::Cuda(1));
        assert_eq!((a, b), (Device::Cuda(1), Device::Cpu));
    }

    /// A tensor that took a node in place is freed with its graph when dropped
    /// (its node's edges hold aliases, not the tensor: no cycle).
    #[test]
    fn inplace_history_does_not_keep_the_tensor_alive() -> Result<()> {
        let x = Tensor::new([1f32, 2., 3.], &Device::Cpu)?.requires_grad_(true)?;
        let b = Tensor::new([1f32, 1., 1.], &Device::Cpu)?;
        for op in 0..4 {
            let h = x.mul(2.0)?;
            match op {
                0 => h.add_(1.0)?,
                1 => h.mul_(&x.mul(1.0)?)?,
                2 => h.copy_(&b)?,
                _ => h.add_(&h.detach())?,
            }
            let (inner, storage) = (Arc::downgrade(&h.0), Arc::downgrade(&h.0.storage));
            drop(h);
            assert!(
                inner.upgrade().is_none(),
                "op {op}: the tensor outlived its handles"
            );
            assert!(
                storage.upgrade().is_none(),
                "op {op}: the storage outlived its tensors"
            );
        }
        // a graph that still uses the old values keeps only the storage it needs
        let h = x.mul(2.0)?;
        let z = h.mul(&h)?;
        h.add_(1.0)?;
        let inner = Arc::downgrade(&h.0);
        drop(h);
        assert!(inner.upgrade().is_none());
        drop(z);
        Ok(())
    }
}
