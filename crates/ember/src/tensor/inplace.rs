//! In-place ops: the checks PyTorch makes before writing into a tensor (a leaf
//! that requires grad, a view whose base others read, a dtype the result cannot
//! be cast to), their autograd history, and `copy_`.

use super::elementwise::{can_cast, torch_dtype_name};
use super::{grad, Operand, Tensor};
use crate::autograd::Inputs;
use crate::backend::op::{BinaryCode, BinaryOp, UnaryOp};
use crate::layout::broadcast_shapes;
use crate::{
    device::Device,
    dtype::DType,
    error::{Error, Result},
};

impl Tensor {
    /// In place: `self = self op rhs`, where `rhs` broadcasts to `self`'s shape and the
    /// result dtype can be cast to `self`'s. Recorded when a gradient is tracked (see
    /// [`check_inplace_target`](Self::check_inplace_target)).
    pub(super) fn binary_inplace<O: BinaryOp>(
        &self,
        name: &'static str,
        rhs: Operand,
        op: &O,
        float_only: bool,
    ) -> Result<()> {
        self.check_bool_sub::<O>(name, rhs)?;
        self.check_division::<O>(name, rhs, float_only)?;
        let rhs_grad = matches!(rhs, Operand::Tensor(t) if t.requires_grad());
        let recorded = self.check_inplace_target(name, rhs_grad)?;
        // a scalar of this tensor's dtype goes to the kernel by value (one pass
        // over the elements, no 0-d tensor to broadcast), and so does a CPU
        // scalar that no gradient flows to (PyTorch's kernels take its value: a
        // float16 product by a float32 one uses it in float32)
        let by_value = match rhs {
            Operand::Scalar(s) if self.scalar_dtype(s, float_only) == self.dtype() => Some(s),
            Operand::Tensor(t)
                if super::elementwise::is_cpu_scalar(t)
                    && !crate::autograd::needs_grad(&[t])
                    && !t.same_storage(self)
                    && self.result_dtype(t, float_only) == self.dtype() =>
            {
                Some(t.scalar_value()?)
            }
            _ => None,
        };
        if let (Some(s), false) = (by_value, recorded) {
            self.check_writable(name)?;
            return self.write().binary_scalar_inplace(self.layout(), s, op);
        }
        let (b, mut dt) = self.promote_with(name, rhs)?;
        if float_only && !dt.is_float() {
            dt = DType::F32;
        }
        if !can_cast(dt, self.dtype()) {
            return Err(Error::invalid(
                name,
                format!(
                    "result type {} can't be cast to the desired output type {}",
                    torch_dtype_name(dt),
                    torch_dtype_name(self.dtype())
                ),
            ));
        }
        self.check_writable(name)?;
        let shape = broadcast_shapes(name, self.shape(), b.shape())?;
        if shape.as_slice() != self.shape() {
            return Err(Error::shape(
                name,
                self.shape(),
                b.shape(),
                format!(
                    "output with shape {:?} doesn't match the broadcast shape {:?}",
                    self.shape(),
                    shape.as_slice()
                ),
            ));
        }
        let keep = grad::binary_reads(O::CODE, self.requires_grad(), b.requires_grad());
        // (an operand the rule reads that shares this storage is overwritten by the
        // write: the old path keeps PyTorch's version error for it)
        let reads_alias = keep[1] && b.same_storage(self);
        if recorded && !keep[0] && !reads_alias && dt == self.dtype() {
            // the rule does not read the old values: written in place, and the
            // node (which keeps `rhs` where the rule reads it) becomes this
            // tensor's history; `self` is the node's first input as it was
            let b = b.to_dtype(dt)?;
            let b = if b.same_storage(self) { b.copy()? } else { b };
            // (the node keeps a scalar's 0-d tensor where the rule reads it)
            if let Some(s) = by_value {
                self.write().binary_scalar_inplace(self.layout(), s, op)?;
                if matches!(O::CODE, BinaryCode::Mul | BinaryCode::Div) {
                    // the number itself in the rule, as out of place
                    let div = O::CODE == BinaryCode::Div;
                    let out = Tensor::record_twice(self.detach(), name, &[self], |_| {
                        grad::by_number(div, s)
                    });
                    self.take_history(&out);
                    return Ok(());
                }
            } else {
                let lb = b.layout().broadcast_to(name, self.shape())?;
                let src = b.read();
                self.write().binary_inplace(self.layout(), &src, &lb, op)?
            }
            let out = Tensor::record_keeping_twice(self.detach(), name, &[self, &b], &keep, |_| {
                |g: &Tensor, ab: &Inputs| grad::binary(O::CODE, ab, None, g)
            });
            self.take_history(&out);
            return Ok(());
        }
        if recorded {
            // out of place on the old values (a copy of them where the rule reads
            // them, since they are about to be overwritten), then written back
            let reads_self = match O::CODE {
                BinaryCode::Mul | BinaryCode::Div => b.requires_grad(),
                BinaryCode::Maximum | BinaryCode::Minimum | BinaryCode::Atan2 => true,
                BinaryCode::Remainder | BinaryCode::Fmod => b.requires_grad(),
                _ => false,
            };
            let a = if reads_self {
                self.copy()?
            } else {
                self.clone()
            };
            // (a CPU scalar as it is: the out-of-place op takes its value)
            let rhs = match rhs {
                Operand::Tensor(t) if super::elementwise::is_cpu_scalar(t) => rhs,
                _ => Operand::Tensor(&b),
            };
            let out = a.binary_op(name, rhs, op, float_only)?;
            return self.write_history(&out.to_dtype(self.dtype())?);
        }
        if dt != self.dtype() {
            let out = self.binary_op(name, Operand::Tensor(&b), op, float_only)?;
            return self.copy_(&out);
        }
        // in the result dtype; a snapshot when reading and writing the same storage
        let b = b.to_dtype(dt)?;
        let b = if b.same_storage(self) { b.copy()? } else { b };
        let lb = b.layout().broadcast_to(name, self.shape())?;
        let src = b.read();
        self.write().binary_inplace(self.layout(), &src, &lb, op)
    }

    /// In place: `self = op(self)`, with the out-of-place op's dtype refusals, and
    /// PyTorch's where the result's dtype (float for a float-only op) cannot be
    /// written back. Recorded when a gradient flows through this tensor: the
    /// kernel writes in place and the rule keeps the result where it reads it
    /// (relu, sigmoid, tanh, exp, ...: no buffer added), or a copy of the old
    /// values where it reads the input (as PyTorch keeps `original_self`).
    pub(super) fn unary_inplace<O: UnaryOp>(
        &self,
        name: &'static str,
        op: &O,
        rule: grad::Unary,
    ) -> Result<()> {
        self.check_unary_dtype::<O>(name)?;
        if O::FLOAT_ONLY && !self.dtype().is_float() {
            return Err(Error::invalid(
                name,
                format!(
                    "result type {} can't be cast to the desired output type {}",
                    torch_dtype_name(DType::F32),
                    torch_dtype_name(self.dtype())
                ),
            ));
        }
        let recorded = self.check_inplace_target(name, false)?;
        self.check_writable(name)?;
        if !recorded {
            return self.write().unary_inplace(self.layout(), op);
        }
        let (reads_x, reads_y) = rule.saves();
        let x = if reads_x {
            Some(crate::autograd::no_grad(|| self.copy())?.save())
        } else {
            None
        };
        self.write().unary_inplace(self.layout(), op)?;
        // the input's copy is a constant to a gradient of the gradient: a rule
        // that reads it is not twice differentiable in place
        let out = if reads_x {
            Tensor::record(self.detach(), name, &[self], |y| {
                rule.recorded(x, reads_y.then(|| y.save()))
            })
        } else {
            Tensor::record_twice(self.detach(), name, &[self], |y| {
                rule.recorded(x, reads_y.then(|| y.save()))
            })
        };
        self.take_history(&out);
        Ok(())
    }

    /// Writes `out`'s values (this tensor's shape and dtype) into this tensor and
    /// makes `out`'s node its history: the end of a recorded in-place op.
    pub(crate) fn write_history(&self, out: &Tensor) -> Result<()> {
        // reading and writing one storage (`h.copy_(&h)`): a snapshot first, so
        // that one lock is taken at a time
        let values = if out.same_storage(self) {
            crate::autograd::no_grad(|| out.copy())?
        } else {
            out.clone()
        };
        {
            let from = values.read();
            from.copy_into(values.layout(), &mut self.write(), self.layout())?;
        }
        self.take_history(out);
        Ok(())
    }

    /// Whether an in-place op on this tensor must be recorded (a gradient is
    /// tracked through it), and an error where PyTorch refuses it or ember cannot
    /// record it:
    /// - a leaf that requires a gradient (PyTorch's error; update it inside
    ///   [`no_grad`](crate::no_grad), as optimizers do);
    /// - a view, or a tensor with live views, while recording: PyTorch rewrites the
    ///   history of the view's base and of its other views, which ember does not
    ///   do yet.
    pub(crate) fn check_inplace_target(&self, op: &'static str, rhs_grad: bool) -> Result<bool> {
        if !self.inplace_records(rhs_grad) {
            return Ok(false);
        }
        if self.requires_grad() && self.is_leaf() {
            return Err(Error::invalid(
                op,
                "a leaf Variable that requires grad is being used in an in-place operation. Update it inside ember::no_grad(|| ...) (as optimizers do) or use the out-of-place op",
            ));
        }
        if self.is_view() && crate::autograd::made_from_grad_leaf(self) {
            return Err(Error::invalid(
                op,
                "a view of a leaf Variable that requires grad is being used in an in-place operation. Update the leaf inside ember::no_grad(|| ...) (as optimizers and initialisers do)",
            ));
        }
        if self.has_views() {
            let which = if self.is_view() {
                "this tensor is a view"
            } else {
                "views of this tensor are alive (yours, or ones a recorded op keeps as its input)"
            };
            return Err(Error::invalid(
                op,
                format!("an in-place op while autograd records, and {which}: ember does not rewrite a view's history after an in-place op (PyTorch does); use the out-of-place op, or make the views after the in-place op"),
            ));
        }
        Ok(true)
    }

    /// Whether an in-place op on this tensor is refused only because autograd
    /// records through a view, or a tensor with live views, which ember does not
    /// rewrite yet (see [`check_inplace_target`](Self::check_inplace_target));
    /// PyTorch writes such a tensor in place. The in-place activation modules then
    /// return a new tensor instead of failing.
    pub(crate) fn inplace_blocked_by_views(&self) -> bool {
        self.inplace_records(false)
            && !(self.requires_grad() && self.is_leaf())
            && self.has_views()
            && !(self.is_view() && crate::autograd::made_from_grad_leaf(self))
    }

    /// Whether autograd records an in-place op on this tensor (with an operand
    /// that requires grad or not): grad mode on, a gradient tracked through it,
    /// and a float dtype (an integer or bool tensor never carries a gradient: it
    /// is written, not recorded, and a float operand is then refused by the cast
    /// check, as in PyTorch).
    fn inplace_records(&self, rhs_grad: bool) -> bool {
        crate::autograd::is_grad_enabled()
            && (self.requires_grad() || rhs_grad)
            && self.dtype().is_float()
    }

    /// A view, or a tensor with live views.
    fn has_views(&self) -> bool {
        self.is_view() || self.live_views() > 0
    }

    pub(crate) fn check_writable(&self, op: &'static str) -> Result<()> {
        if self.layout().is_overlapping() {
            return Err(Error::invalid(
                op,
                "more than one element of the written-to tensor refers to a single memory location (an expanded view); call .contiguous() first",
            ));
        }
        Ok(())
    }

    /// Copies `src` (broadcast to this shape, converted to this dtype) into this
    /// tensor's elements, through views too (`Tensor.copy_`). `src` may be on
    /// another device, as in PyTorch (a batch on the CPU into a GPU tensor, a
    /// GPU result into a CPU buffer): it is moved as [`to`](Self::to) moves it,
    /// then copied. Recorded by autograd when `src` or this tensor requires
    /// grad: `src` gets the gradient (on its own device), the old values a zero
    /// one (PyTorch's rule); while recording, a view or a tensor with live views
    /// is refused.
    pub fn copy_(&self, src: &Tensor) -> Result<()> {
        if src.device() != self.device() {
            // (refused before anything moves: no transfer for a write that
            // cannot happen)
            self.check_inplace_target("copy_", src.requires_grad())?;
            self.check_writable("copy_")?;
            src.layout().broadcast_to("copy_", self.shape())?;
            if src.device() == Device::Meta {
                return Err(Error::MetaNoData {
                    op: "copy_",
                    hint: "there is nothing to copy out of a meta tensor (PyTorch: \"Cannot copy out of meta tensor; no data!\")",
                });
            }
            // converted on the side where it is smaller (a float64 batch for a
            // float16 GPU tensor moves as float16)
            let src = if self.dtype().size_in_bytes() < src.dtype().size_in_bytes() {
                src.to_dtype(self.dtype())?
            } else {
                src.clone()
            };
            return self.copy_(&src.to(&self.device())?);
        }
        let recorded = self.check_inplace_target("copy_", src.requires_grad())?;
        self.check_writable("copy_")?;
        if recorded {
            return self.copy_recorded(src);
        }
        let src = src.to_dtype(self.dtype())?;
        let src = if src.same_storage(self) {
            src.copy()?
        } else {
            src
        };
        let ls = src.layout().broadcast_to("copy_", self.shape())?;
        let from = src.read();
        from.copy_into(&ls, &mut self.write(), self.layout())
    }

    /// `copy_` while autograd records: the old values get a zero gradient and
    /// `src` the gradient summed to its shape (PyTorch's rule).
    fn copy_recorded(&self, src: &Tensor) -> Result<()> {
        src.layout().broadcast_to("copy_", self.shape())?;
        let values = crate::autograd::no_grad(|| src.to_dtype(self.dtype())?.expand(self.shape()))?;
        let values = Tensor::record_twice(values, "copy_", &[self, src], |_| {
            let (dst_shape, src_shape) = (self.shape().to_vec(), src.shape().to_vec());
            let (dst_needs, dst_dt, dst_dev) = (self.requires_grad(), self.dtype(), self.device());
            move |g: &Tensor| {
                let gd = dst_needs
                    .then(|| Tensor::zeros(&dst_shape, dst_dt, &dst_dev))
                    .transpose()?;
                Ok(vec![gd, Some(crate::autograd::sum_to(g, &src_shape)?)])
            }
        });
        self.write_history(&values)
    }
}
