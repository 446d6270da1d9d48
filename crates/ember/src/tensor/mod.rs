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

mod arith;
mod conv_cuda;
pub(crate) mod create;
mod display;
mod elementwise;
mod grad;
mod index;
mod linalg;
mod logical;
mod reduce;
pub(crate) mod shape;
mod views;

pub use crate::backend::cpu::random::with_global_rng;
pub use crate::backend::manual_seed;
pub use create::NdArray;
pub use display::{set_print_options, PrintOptions};
pub use elementwise::{Operand, Scalar};
pub use index::{Idx, IndexArg};
pub use linalg::{Conv2dOptions, Pool2dOptions};
pub use shape::{IntoDims, IntoShape};

use crate::autograd::Node;
use crate::backend::cpu::CpuStorage;
use crate::backend::cuda::CudaStorage;
use crate::backend::Storage;
use crate::dtype::CpuData;
use crate::layout::Layout;
use crate::{DType, Device, Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// An n-dimensional array of one dtype on one device.
///
/// Cloning is cheap (a reference count). Views (`reshape` of contiguous data,
/// `transpose`, `narrow`, `expand`, ...) share the storage and only change the layout.
#[derive(Clone)]
pub struct Tensor(Arc<Inner>);

struct Inner {
    storage: Arc<RwLock<Storage>>,
    layout: Layout,
    dtype: DType,
    device: Device,
    /// Set on leaves by `requires_grad_`, and on every recorded op output.
    requires_grad: AtomicBool,
    /// The accumulated gradient of a leaf.
    grad: Mutex<Option<Tensor>>,
    /// How this tensor was computed, when it was recorded.
    node: Option<Node>,
}

impl Tensor {
    pub(crate) fn from_storage(storage: Storage, layout: Layout, device: Device) -> Tensor {
        let dtype = storage.dtype();
        Tensor(Arc::new(Inner {
            storage: Arc::new(RwLock::new(storage)),
            layout,
            dtype,
            device,
            requires_grad: AtomicBool::new(false),
            grad: Mutex::new(None),
            node: None,
        }))
    }

    /// A contiguous CPU tensor over `data` with `shape`.
    pub(crate) fn from_cpu(data: CpuData, shape: &[usize]) -> Tensor {
        debug_assert_eq!(data.len(), shape.iter().product::<usize>());
        Tensor::from_storage(
            Storage::Cpu(CpuStorage::new(data)),
            Layout::contiguous(shape),
            Device::Cpu,
        )
    }

    /// A view of the same storage with another layout (no autograd history: view
    /// ops record their own node).
    pub(crate) fn with_layout(&self, layout: Layout) -> Tensor {
        Tensor(Arc::new(Inner {
            storage: self.0.storage.clone(),
            layout,
            dtype: self.0.dtype,
            device: self.0.device,
            requires_grad: AtomicBool::new(false),
            grad: Mutex::new(None),
            node: None,
        }))
    }

    /// This tensor's values with `node` as their history.
    pub(crate) fn with_node(&self, node: Node) -> Tensor {
        Tensor(Arc::new(Inner {
            storage: self.0.storage.clone(),
            layout: self.0.layout.clone(),
            dtype: self.0.dtype,
            device: self.0.device,
            requires_grad: AtomicBool::new(true),
            grad: Mutex::new(None),
            node: Some(node),
        }))
    }

    /// Identity of this tensor (not of its storage) for the autograd walk.
    pub(crate) fn id(&self) -> usize {
        Arc::as_ptr(&self.0) as usize
    }

    /// Attaches `node` to this tensor itself when no other handle shares it
    /// (`Err(node)` otherwise).
    pub(crate) fn set_node(&mut self, node: Node) -> std::result::Result<(), Node> {
        match Arc::get_mut(&mut self.0) {
            Some(inner) => {
                inner.node = Some(node);
                *inner.requires_grad.get_mut() = true;
                Ok(())
            }
            None => Err(node),
        }
    }

    pub(crate) fn node(&self) -> Option<&Node> {
        self.0.node.as_ref()
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
        if !on && self.node().is_some() {
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
        self.node().is_none()
    }

    /// The gradient accumulated by `backward` (leaves only).
    pub fn grad(&self) -> Option<Tensor> {
        self.grad_slot().clone()
    }

    /// Replaces the accumulated gradient (`None` clears it, like `zero_grad`).
    pub fn set_grad(&self, grad: Option<Tensor>) {
        *self.grad_slot() = grad;
    }

    /// Clears the accumulated gradient.
    pub fn zero_grad(&self) {
        self.set_grad(None);
    }

    /// The same values, sharing storage, outside the graph (`tensor.detach()`): a
    /// new tensor whose `requires_grad` flag and gradient are its own, so that
    /// `x.detach().requires_grad_(true)` leaves `x` as it was.
    pub fn detach(&self) -> Tensor {
        self.with_layout(self.0.layout.clone())
    }

    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Storage> {
        self.0.storage.read().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, Storage> {
        self.0.storage.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the host data and layout. For a CUDA tensor this is the host
    /// fallback of an op without a CUDA kernel: the storage is copied to the host
    /// (waiting for queued work) and counted in
    /// [`cuda::host_fallback_count`](crate::cuda::host_fallback_count).
    pub(crate) fn with_cpu<R>(&self, f: impl FnOnce(&CpuData, &Layout) -> R) -> Result<R> {
        let guard = self.read();
        match &*guard {
            Storage::Cpu(s) => Ok(f(s.data(), &self.0.layout)),
            Storage::Cuda(s) => {
                let data = s.to_cpu()?;
                drop(guard);
                crate::backend::cuda::count_host_fallback();
                Ok(f(&data, &self.0.layout))
            }
        }
    }

    /// The CUDA storage of this tensor, when it has one (read-locked).
    pub(crate) fn cuda_storage(&self) -> Option<CudaRead<'_>> {
        let guard = self.read();
        match &*guard {
            Storage::Cuda(_) => Some(CudaRead(guard)),
            Storage::Cpu(_) => None,
        }
    }

    /// A contiguous tensor of host values on `device` (uploaded for a GPU).
    pub(crate) fn from_host(data: CpuData, shape: &[usize], device: Device) -> Result<Tensor> {
        match device {
            Device::Cpu => Ok(Tensor::from_cpu(data, shape)),
            Device::Cuda(i) => {
                let dev = crate::backend::cuda::dev(i)?;
                let s = CudaStorage::from_cpu(&dev, &data)?;
                Ok(Tensor::from_cuda(s, shape))
            }
            Device::Meta => Err(Error::invalid("meta", "not yet")),
        }
    }

    /// A contiguous tensor over CUDA storage of `shape`'s size.
    pub(crate) fn from_cuda(s: CudaStorage, shape: &[usize]) -> Tensor {
        debug_assert_eq!(s.len(), shape.iter().product::<usize>());
        let device = s.dev().device();
        Tensor::from_storage(Storage::Cuda(s), Layout::contiguous(shape), device)
    }

    /// `true` when both tensors view the same storage.
    pub(crate) fn same_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.0.storage, &other.0.storage)
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

    /// `true` when the elements are dense and row-major.
    pub fn is_contiguous(&self) -> bool {
        self.0.layout.is_contiguous()
    }

    /// This tensor on `device`: the same tensor when already there, else a copy
    /// (contiguous). Gradients flow back to the source device.
    ///
    /// A copy to a GPU returns once the values are staged in pinned host memory; it
    /// does not wait for the GPU (the copy runs in order with the device's other
    /// work). A copy from a GPU waits for the work queued before it, since the values
    /// are then read.
    pub fn to(&self, device: &Device) -> Result<Tensor> {
        if *device == self.device() {
            return Ok(self.clone());
        }
        crate::backend::cuda::discover::check_device(*device)?;
        let out = {
            let _ng = crate::no_grad_guard();
            self.copy_to(*device)?
        };
        let from = self.device();
        Ok(Tensor::record(out, "to", &[self], |_| {
            move |g: &Tensor| Ok(vec![Some(g.to(&from)?)])
        }))
    }

    /// A contiguous copy on `device` (no autograd record).
    fn copy_to(&self, device: Device) -> Result<Tensor> {
        let src = self.contiguous()?;
        let guard = src.read();
        let data = match &*guard {
            Storage::Cpu(s) => {
                let range = src.layout().offset()..src.layout().offset() + src.numel();
                match device {
                    Device::Cuda(i) => {
                        let dev = crate::backend::cuda::dev(i)?;
                        let st = CudaStorage::from_cpu_range(&dev, s.data(), range)?;
                        return Ok(Tensor::from_cuda(st, self.shape()));
                    }
                    Device::Cpu => unreachable!("same device handled by the caller"),
                    Device::Meta => return Err(Error::invalid("meta", "not yet")),
                }
            }
            Storage::Cuda(s) => s.to_cpu_range(src.layout().offset(), src.numel())?,
        };
        drop(guard);
        Tensor::from_host(data, self.shape(), device)
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
        let out = match self.cuda_storage() {
            Some(s) => Tensor::from_cuda(
                crate::backend::cuda::ops::cast(&s, self.layout(), dtype)?,
                self.shape(),
            ),
            None => {
                let data =
                    self.with_cpu(|d, l| crate::backend::cpu::elementwise::cast(d, l, dtype))??;
                Tensor::from_cpu(data, self.shape())
            }
        };
        if !dtype.is_float() {
            return Ok(out);
        }
        let from = self.dtype();
        Ok(Tensor::record(out, "to_dtype", &[self], |_| {
            move |g: &Tensor| Ok(vec![Some(g.to_dtype(from)?)])
        }))
    }

    /// A contiguous tensor with the same values (this tensor when already contiguous).
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        self.copy()
    }

    /// A contiguous copy that owns new storage (`torch.clone`).
    pub fn copy(&self) -> Result<Tensor> {
        let out = match self.cuda_storage() {
            Some(s) => Tensor::from_cuda(
                crate::backend::cuda::ops::contiguous(&s, self.layout())?,
                self.shape(),
            ),
            None => Tensor::from_cpu(
                self.with_cpu(crate::backend::cpu::elementwise::contiguous_copy)??,
                self.shape(),
            ),
        };
        Ok(Tensor::record(out, "copy", &[self], |_| {
            |g: &Tensor| Ok(vec![Some(g.clone())])
        }))
    }
}

/// A read lock on a tensor's storage known to be CUDA storage.
pub(crate) struct CudaRead<'a>(RwLockReadGuard<'a, Storage>);

impl std::ops::Deref for CudaRead<'_> {
    type Target = CudaStorage;
    fn deref(&self) -> &CudaStorage {
        match &*self.0 {
            Storage::Cuda(s) => s,
            Storage::Cpu(_) => unreachable!("CudaRead holds CUDA storage"),
        }
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
}
