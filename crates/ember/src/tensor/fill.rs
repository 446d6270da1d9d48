//! Writing values into a tensor: `fill_` and `zero_`, `masked_fill` (a number
//! or a 0-d tensor as the value, out of place and in place), and `clamp_` with
//! scalar or tensor bounds. Each checks what PyTorch checks before anything is
//! written, and records a gradient as PyTorch's rules do.

use super::elementwise::{can_cast, is_cpu_scalar, scalar_tensor, torch_dtype_name};
use super::{grad, Operand, Tensor};
use crate::backend::op::{self as ops, Scalar};
use crate::layout::{broadcast_shapes, Layout};
use crate::{
    dtype::DType,
    error::{Error, Result},
};

impl Tensor {
    /// Writes `value` into every element (`Tensor.fill_`). The value is a
    /// number, or a 0-d tensor (anything else is PyTorch's error). A number, or
    /// a tensor on another device (a CPU scalar beside a GPU tensor), is checked
    /// as [`Tensor::full`] checks it: a value the dtype cannot hold (300 for
    /// uint8) is an error. A 0-d tensor on this tensor's device is copied as
    /// [`copy_`](Self::copy_) copies (converted, unchecked; no read on the
    /// host), as in PyTorch.
    ///
    /// Autograd: the old values get a zero gradient and a value tensor the sum
    /// of the gradient (PyTorch's rules). A leaf that requires grad is refused,
    /// as for every in-place op. An expanded view is filled by a number or a
    /// value on another device (each of its elements takes the value), as
    /// PyTorch fills one; by a 0-d tensor on its device it is refused, as
    /// `copy_` refuses it (PyTorch's too).
    ///
    /// ```
    /// # use ember::{Device, Tensor};
    /// let x = Tensor::zeros([2, 3], ember::DType::I64, &Device::Cpu)?;
    /// x.fill_(2.7)?; // truncated, as PyTorch does
    /// assert_eq!(x.to_vec::<i64>()?, vec![2; 6]);
    /// x.zero_()?;
    /// assert_eq!(x.sum_all()?.item::<i64>()?, 0);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn fill_<'a>(&self, value: impl Into<Operand<'a>>) -> Result<()> {
        const OP: &str = "fill_";
        let s = match value.into() {
            Operand::Scalar(s) => s,
            Operand::Tensor(v) => {
                if v.rank() != 0 {
                    return Err(Error::invalid(
                        OP,
                        format!(
                            "fill_ only supports 0-dimension value tensor but got tensor with {} dimensions.",
                            v.rank()
                        ),
                    ));
                }
                if v.device() == self.device() || crate::autograd::needs_grad(&[v]) {
                    // PyTorch's copy_ (its gradient goes back to v's device)
                    return self.copy_(v);
                }
                // read as a number, as PyTorch's `value.item()`
                v.scalar_value()?
            }
        };
        super::create::check_fill_value(OP, s, self.dtype())?;
        if self.check_inplace_target(OP, false)? {
            let out = crate::autograd::no_grad(|| {
                Tensor::full_scalar(self.shape(), s, self.dtype(), self.device())
            })?;
            let out = Tensor::record_twice(out, OP, &[self], |_| {
                |g: &Tensor| Ok(vec![Some(g.zeros_like()?)])
            });
            return self.write_history(&out);
        }
        // each element once: an expanded dim (stride 0) is one element, so an
        // expanded view is written through its base's elements
        let l = self.layout();
        let shape: smallvec::SmallVec<[usize; 6]> = l
            .shape()
            .iter()
            .zip(l.strides())
            .map(|(&n, &st)| if st == 0 { n.min(1) } else { n })
            .collect();
        let target = Layout::strided(&shape, l.strides(), l.offset());
        if target.is_overlapping() {
            return self.check_writable(OP);
        }
        let v = scalar_tensor(s, self.dtype(), self.device())?;
        let lv = v.layout().broadcast_to(OP, &shape)?;
        let from = v.read();
        from.copy_into(&lv, &mut self.write(), &target)
    }

    /// Zeros every element (`Tensor.zero_`): [`fill_`](Self::fill_) with 0.
    pub fn zero_(&self) -> Result<()> {
        self.fill_(0)
    }

    /// `value` where `mask` is true, else this tensor's elements
    /// (`Tensor.masked_fill`). The mask is a bool tensor on this tensor's
    /// device; it and this tensor broadcast together. The dtype stays this
    /// tensor's. The value is a number, or a 0-d tensor (PyTorch's error
    /// otherwise) on this tensor's device or on the CPU (a CPU scalar beside a
    /// GPU tensor). A number, or a value on the CPU, that the dtype cannot hold
    /// is an error, as in [`Tensor::full`]; a value on a GPU is converted as
    /// [`to_dtype`](Self::to_dtype) converts, not read on the host (PyTorch's
    /// CUDA kernel reads it, and refuses 300 for uint8 where ember writes 44).
    ///
    /// Autograd: this tensor gets the gradient where the mask is false, a value
    /// tensor the sum of the gradient where it is true.
    pub fn masked_fill<'a>(&self, mask: &Tensor, value: impl Into<Operand<'a>>) -> Result<Tensor> {
        self.masked_fill_as("masked_fill", mask, value.into())
    }

    /// In-place [`masked_fill`](Self::masked_fill) (`Tensor.masked_fill_`): the
    /// mask broadcasts to this tensor's shape (not the other way round). While
    /// autograd records, a leaf that requires grad, a view and a tensor with live
    /// views are refused, as for every in-place op. An expanded view is refused
    /// (PyTorch writes one with a deprecation warning).
    ///
    /// ```
    /// # use ember::{Device, Tensor};
    /// let scores = Tensor::new(&[[0.5f32, 1.0], [2.0, 3.0]], &Device::Cpu)?;
    /// let future = Tensor::new(&[[false, true], [false, false]], &Device::Cpu)?;
    /// scores.masked_fill_(&future, f64::NEG_INFINITY)?;
    /// assert_eq!(scores.to_vec::<f32>()?, vec![0.5, f32::NEG_INFINITY, 2.0, 3.0]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn masked_fill_<'a>(&self, mask: &Tensor, value: impl Into<Operand<'a>>) -> Result<()> {
        const OP: &str = "masked_fill_";
        let value = value.into();
        let shape = broadcast_shapes(OP, self.shape(), mask.shape())?;
        if shape.as_slice() != self.shape() {
            return Err(broadcast_error(OP, self.shape(), &shape));
        }
        let rhs_grad = matches!(value, Operand::Tensor(t) if t.requires_grad());
        // (the rule reads only the mask: the old values need no copy)
        self.write_from(OP, rhs_grad, false, |t| t.masked_fill_as(OP, mask, value))
    }

    fn masked_fill_as(&self, op: &'static str, mask: &Tensor, value: Operand) -> Result<Tensor> {
        if mask.dtype() != DType::Bool {
            return Err(Error::dtype(
                op,
                mask.dtype(),
                format!(
                    "masked_fill_ only supports boolean masks, but got mask with dtype {}",
                    torch_dtype_name(mask.dtype())
                ),
            ));
        }
        super::same_device(op, &[self, mask])?;
        broadcast_shapes(op, self.shape(), mask.shape())?;
        let (dt, dev) = (self.dtype(), self.device());
        let v = match value {
            Operand::Scalar(s) => {
                super::create::check_fill_value(op, s, dt)?;
                scalar_tensor(s, dt, dev)?
            }
            Operand::Tensor(v) => {
                if v.rank() != 0 {
                    return Err(Error::invalid(
                        op,
                        format!(
                            "masked_fill_ only supports a 0-dimensional value tensor, but got tensor with {} dimension(s).",
                            v.rank()
                        ),
                    ));
                }
                if v.device() != dev && !is_cpu_scalar(v) {
                    // PyTorch's masked_fill takes a value on the tensor's device,
                    // or a CPU scalar
                    super::same_device(op, &[self, v])?;
                }
                if is_cpu_scalar(v) {
                    super::create::check_fill_value(op, v.scalar_value()?, dt)?;
                }
                if v.device() != dev && !crate::autograd::needs_grad(&[v]) {
                    // its value, filled in on this device (no host copy)
                    scalar_tensor(v.scalar_value()?, dt, dev)?
                } else {
                    v.to(&dev)?.to_dtype(dt)?
                }
            }
        };
        mask.where_(&v, self)
    }

    /// In-place [`clamp`](Self::clamp) (`Tensor.clamp_`): the same bounds and
    /// refusals, and PyTorch's where the result's dtype cannot be written back
    /// (float bounds on an integer tensor). Recorded by autograd as the other
    /// in-place ops are.
    ///
    /// ```
    /// # use ember::{Device, Tensor};
    /// let x = Tensor::new(&[-2.0f32, 0.5, 3.0], &Device::Cpu)?;
    /// x.clamp_(Some(-1.0), Some(1.0))?;
    /// assert_eq!(x.to_vec::<f32>()?, vec![-1.0, 0.5, 1.0]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn clamp_<S: Into<Scalar>>(&self, min: Option<S>, max: Option<S>) -> Result<()> {
        const OP: &str = "clamp_";
        let (min, max) = (min.map(Into::into), max.map(Into::into));
        let dt = self.clamp_dtype(OP, min, max)?;
        if !can_cast(dt, self.dtype()) {
            return Err(cast_error(OP, dt, self.dtype()));
        }
        let nan = [min, max]
            .iter()
            .flatten()
            .any(|b| matches!(b, Scalar::Float(v) if v.is_nan()));
        if nan || dt != self.dtype() || super::math::wide_int_bound(dt, &[min, max]) {
            return self.write_from(OP, false, false, |t| t.clamp(min, max));
        }
        let f = |b: Option<Scalar>| b.map(|b| b.by_value().0);
        let (min, max) = (f(min), f(max));
        self.unary_inplace(OP, &ops::Clamp(min, max), grad::Unary::Clamp(min, max))
    }

    /// `clamp_(Some(min), None)`.
    pub fn clamp_min_(&self, min: impl Into<Scalar>) -> Result<()> {
        self.clamp_(Some(min.into()), None)
    }

    /// `clamp_(None, Some(max))`.
    pub fn clamp_max_(&self, max: impl Into<Scalar>) -> Result<()> {
        self.clamp_(None, Some(max.into()))
    }

    /// In-place [`clamp_tensor`](Self::clamp_tensor): the bounds broadcast to
    /// this tensor's shape, and the three operands' result dtype must be one
    /// that can be written back (PyTorch's errors otherwise). Gradients flow to
    /// the bounds as out of place.
    pub fn clamp_tensor_(&self, min: Option<&Tensor>, max: Option<&Tensor>) -> Result<()> {
        const OP: &str = "clamp_";
        let mut shape = smallvec::SmallVec::<[usize; 6]>::from_slice(self.shape());
        for b in min.iter().chain(max.iter()) {
            shape = broadcast_shapes(OP, &shape, b.shape())?;
        }
        if shape.as_slice() != self.shape() {
            return Err(broadcast_error(OP, self.shape(), &shape));
        }
        let rhs_grad = min.iter().chain(max.iter()).any(|b| b.requires_grad());
        // (the rule compares the old values with the bounds: a copy of them)
        self.write_from(OP, rhs_grad, true, |t| t.clamp_tensor(min, max))
    }

    /// In place from an out-of-place op: `f` of this tensor (of a copy of its
    /// old values where autograd records and `f`'s rule reads them), checked
    /// (its dtype castable to this one, its shape this one) before anything is
    /// written, then written and, while recording, made this tensor's history.
    pub(super) fn write_from(
        &self,
        op: &'static str,
        rhs_grad: bool,
        reads_self: bool,
        f: impl FnOnce(&Tensor) -> Result<Tensor>,
    ) -> Result<()> {
        let recorded = self.check_inplace_target(op, rhs_grad)?;
        self.check_writable(op)?;
        let out = if recorded && reads_self {
            f(&self.copy()?)?
        } else if recorded {
            f(self)?
        } else {
            crate::autograd::no_grad(|| f(self))?
        };
        if !can_cast(out.dtype(), self.dtype()) {
            return Err(cast_error(op, out.dtype(), self.dtype()));
        }
        if out.shape() != self.shape() {
            return Err(broadcast_error(op, self.shape(), out.shape()));
        }
        let out = out.to_dtype(self.dtype())?;
        if recorded {
            return self.write_history(&out);
        }
        let out = if out.same_storage(self) {
            crate::autograd::no_grad(|| out.copy())?
        } else {
            out
        };
        let from = out.read();
        from.copy_into(out.layout(), &mut self.write(), self.layout())
    }
}

/// PyTorch's error for an in-place result of a dtype the tensor cannot take.
fn cast_error(op: &'static str, from: DType, to: DType) -> Error {
    Error::invalid(
        op,
        format!(
            "result type {} can't be cast to the desired output type {}",
            torch_dtype_name(from),
            torch_dtype_name(to)
        ),
    )
}

/// PyTorch's error for an in-place op whose operands broadcast past the
/// written tensor's shape.
fn broadcast_error(op: &'static str, own: &[usize], broadcast: &[usize]) -> Error {
    Error::shape(
        op,
        own,
        broadcast,
        format!("output with shape {own:?} doesn't match the broadcast shape {broadcast:?}"),
    )
}
