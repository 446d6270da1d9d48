//! Elementwise math with PyTorch's broadcasting and type promotion: operands and
//! dtype promotion, the binary, unary and comparison machinery and the method
//! tables built on it, `where_`, `masked_fill`. In-place ops are in `inplace.rs`,
//! functions composed from these in `math.rs`.

use super::{grad, with_storages2, Storages, Tensor};
use crate::autograd::Inputs;
pub use crate::backend::op::Scalar;
use crate::backend::op::{self as ops, BinaryCode, BinaryOp, CmpOp, UnaryCode, UnaryOp};
use crate::backend::Storage;
use crate::layout::{broadcast_shapes, Layout};
use crate::{
    device::Device,
    dtype::DType,
    error::{Error, Result},
};
use std::borrow::Cow;

macro_rules! scalar_from {
    ($($t:ty => $v:ident $(as $c:ty)?),*) => {$(
        impl From<$t> for Scalar {
            fn from(x: $t) -> Scalar { Scalar::$v(x $(as $c)?) }
        }
        impl From<$t> for Operand<'_> {
            fn from(x: $t) -> Self { Operand::Scalar(Scalar::$v(x $(as $c)?)) }
        }
    )*};
}
scalar_from!(f64 => Float, f32 => Float as f64, i64 => Int, i32 => Int as i64, usize => Int as i64, bool => Bool);

/// The right-hand side of a binary op: a tensor or a scalar.
///
/// A 0-d tensor on the CPU (what PyTorch calls a CPU scalar) may be the operand
/// of a tensor on any device, on either side, as in PyTorch's arithmetic and
/// comparisons (and `where`, and the logical ops): its value goes to the
/// other's device, its dtype promotes as a 0-d tensor's (a float64 one leaves
/// float16 float16, makes int64 float64), and a gradient that flows to it comes
/// back to the CPU. Its value is used as PyTorch's CPU kernels use it on every
/// device (in a float16 or bfloat16 product or quotient, on the right, in
/// float32; otherwise rounded to the dtype first). Any other CPU tensor beside a
/// GPU tensor is a [`DeviceMismatch`](crate::Error::DeviceMismatch), and so is a
/// CPU scalar as `clamp`'s bound (PyTorch's CUDA clamp refuses it).
#[derive(Clone, Copy)]
pub enum Operand<'a> {
    Tensor(&'a Tensor),
    Scalar(Scalar),
}

impl<'a> From<&'a Tensor> for Operand<'a> {
    fn from(t: &'a Tensor) -> Self {
        Operand::Tensor(t)
    }
}

impl From<Scalar> for Operand<'_> {
    fn from(s: Scalar) -> Self {
        Operand::Scalar(s)
    }
}

/// A 0-d tensor on `device` holding `s` converted to `dtype`.
pub(super) fn scalar_tensor(s: Scalar, dtype: DType, device: Device) -> Result<Tensor> {
    Tensor::full_scalar(&[], s, dtype, device)
}

/// PyTorch's error for a dtype its kernel `kernel` has no instance for, as op
/// `op`'s: `"kernel" not implemented for 'Float'`.
pub(crate) fn not_implemented_for(op: &'static str, kernel: &str, dt: DType) -> Error {
    Error::dtype(
        op,
        dt,
        format!(
            "\"{kernel}\" not implemented for '{}'",
            torch_dtype_name(dt)
        ),
    )
}

/// The name PyTorch's C++ kernels give a dtype in their "not implemented for"
/// errors.
pub(crate) fn torch_dtype_name(dt: DType) -> &'static str {
    match dt {
        DType::Bool => "Bool",
        DType::U8 => "Byte",
        DType::I64 => "Long",
        DType::F16 => "Half",
        DType::BF16 => "BFloat16",
        DType::F32 => "Float",
        DType::F64 => "Double",
    }
}

/// Whether `t` is what PyTorch calls a CPU scalar: a 0-d tensor on the CPU, which
/// its elementwise ops take beside tensors on any device, as a number (where any
/// other CPU tensor is a device mismatch).
pub(crate) fn is_cpu_scalar(t: &Tensor) -> bool {
    t.rank() == 0 && t.device() == Device::Cpu
}

/// The device an elementwise op over `ts` runs on: that of the tensors that are
/// not CPU scalars, which must agree (PyTorch's message otherwise), or the CPU
/// when all are.
pub(crate) fn elementwise_device(op: &'static str, ts: &[&Tensor]) -> Result<Device> {
    let on: smallvec::SmallVec<[&Tensor; 4]> =
        ts.iter().copied().filter(|t| !is_cpu_scalar(t)).collect();
    if on.is_empty() {
        Ok(Device::Cpu)
    } else {
        super::same_device(op, &on)
    }
}

/// `out = a op b` recorded with the op's own rule, which reads the inputs from
/// the node (backward runs without recording). Only pow keeps the output, and a
/// rule that captures nothing is boxed without an allocation. (A CPU scalar's
/// gradient, computed beside a tensor on another device, is moved back by the
/// engine.)
fn record_binary<O: BinaryOp>(out: Tensor, name: &'static str, a: &Tensor, b: &Tensor) -> Tensor {
    let keep = grad::binary_reads(O::CODE, a.requires_grad(), b.requires_grad());
    if O::CODE == BinaryCode::Pow {
        Tensor::record_keeping_twice(out, name, &[a, b], &keep, |y| {
            let y = y.save();
            move |g: &Tensor, ab: &Inputs| grad::binary(O::CODE, ab, Some(&y), g)
        })
    } else {
        Tensor::record_keeping_twice(out, name, &[a, b], &keep, |_| {
            |g: &Tensor, ab: &Inputs| grad::binary(O::CODE, ab, None, g)
        })
    }
}

/// Whether an operand is a bool tensor or a bool scalar.
pub(super) fn operand_is_bool(o: Operand) -> bool {
    match o {
        Operand::Tensor(t) => t.dtype() == DType::Bool,
        Operand::Scalar(s) => matches!(s, Scalar::Bool(_)),
    }
}

/// PyTorch refuses `a - b` when either operand is a bool (tensor or scalar), with
/// these two reasons.
pub(super) fn check_bool_sub(name: &'static str, a_bool: bool, b_bool: bool) -> Result<()> {
    let hint = match (a_bool, b_bool) {
        (true, true) => {
            "Subtraction, the `-` operator, with two bool tensors is not supported. \
             Use the `^` or `logical_xor()` operator instead."
        }
        (true, false) | (false, true) => {
            "Subtraction, the `-` operator, with a bool tensor is not supported. \
             If you are trying to invert a mask, use the `~` or `logical_not()` operator instead."
        }
        (false, false) => return Ok(()),
    };
    Err(Error::dtype(name, DType::Bool, hint))
}

/// PyTorch's `can_cast`: floats do not go into ints or bools, ints not into bools.
pub(super) fn can_cast(from: DType, to: DType) -> bool {
    !(from.is_float() && !to.is_float() || from.is_int() && to == DType::Bool)
}

impl Tensor {
    /// This tensor on `device` where it is a CPU scalar and `device` another: a
    /// 0-d tensor filled there with its value (a kernel writes it, nothing is
    /// copied from host memory, so a CUDA graph captures it), or, where a
    /// gradient flows to it, a recorded copy, whose gradient comes back to the
    /// CPU. Any other tensor as it is.
    pub(crate) fn lifted_to(&self, device: Device) -> Result<Cow<'_, Tensor>> {
        if !is_cpu_scalar(self) || device == Device::Cpu {
            return Ok(Cow::Borrowed(self));
        }
        if crate::autograd::needs_grad(&[self]) {
            return Ok(Cow::Owned(self.to(&device)?));
        }
        Ok(Cow::Owned(scalar_tensor(
            self.scalar_value()?,
            self.dtype(),
            device,
        )?))
    }

    /// The value of a one-element tensor as a number of its kind (read without
    /// recording anything).
    pub(crate) fn scalar_value(&self) -> Result<Scalar> {
        crate::autograd::no_grad(|| {
            Ok(match self.dtype() {
                DType::Bool => Scalar::Bool(self.item::<bool>()?),
                d if d.is_float() => Scalar::Float(self.item::<f64>()?),
                _ => Scalar::Int(self.item::<i64>()?),
            })
        })
    }

    /// The other operand as a tensor, and the dtype PyTorch computes `self op rhs` in.
    pub(super) fn promote_with<'a>(
        &self,
        op: &'static str,
        rhs: Operand<'a>,
    ) -> Result<(Cow<'a, Tensor>, DType)> {
        match rhs {
            Operand::Tensor(t) => {
                // (a CPU scalar beside a tensor on another device goes there)
                let t = t.lifted_to(self.device())?;
                super::same_device(op, &[self, &t])?;
                let dt =
                    DType::result_type(self.dtype(), self.rank() == 0, t.dtype(), t.rank() == 0);
                Ok((t, dt))
            }
            Operand::Scalar(s) => {
                let dt = self.scalar_dtype(s, false);
                Ok((Cow::Owned(scalar_tensor(s, dt, self.device())?), dt))
            }
        }
    }

    /// The dtype PyTorch computes `self op s` in, for a Python-style scalar `s`
    /// (float32 at least when the op is `float_only`, like true division).
    pub(super) fn scalar_dtype(&self, s: Scalar, float_only: bool) -> DType {
        let dt = DType::result_type(self.dtype(), false, s.dtype(), true);
        // Python scalars never widen within a category: int tensor + int stays the
        // tensor's dtype; int tensor + float is the default float32
        let dt = match s {
            Scalar::Float(_) => DType::with_scalar(self.dtype(), true),
            _ if self.dtype() == DType::Bool => dt,
            _ => self.dtype(),
        };
        if float_only && !dt.is_float() {
            DType::F32
        } else {
            dt
        }
    }

    /// `self op s` with the scalar passed to the kernel by value (no one-element
    /// tensor), computed by `f` in the dtype PyTorch computes it in.
    pub(super) fn scalar_op(
        &self,
        s: Scalar,
        float_only: bool,
        f: impl FnOnce(&Storage, &Layout, Scalar) -> Result<Storage>,
    ) -> Result<Tensor> {
        let a = self.to_dtype(self.scalar_dtype(s, float_only))?;
        // the scalar is a 0-d operand to PyTorch, not one of the same shape
        a.map_storage_elementwise(false, |st, l| f(st, l, s))
    }

    /// The tensor `f(a, b)` computes after promotion to `dt` and broadcasting: of
    /// the broadcast shape, laid out as PyTorch lays out an elementwise result
    /// (row-major unless the operands' strides say otherwise, as channels-last
    /// operands do). `f` writes its output row-major over the layouts it is given.
    pub(super) fn broadcast2(
        &self,
        op: &'static str,
        b: &Tensor,
        dt: DType,
        f: impl FnOnce(&Storage, &Layout, &Storage, &Layout) -> Result<Storage>,
    ) -> Result<Tensor> {
        let (a, b) = (self.as_dtype(dt)?, b.as_dtype(dt)?);
        let same = a.shape() == b.shape();
        if same && a.shape().iter().all(|&n| n > 1) && a.is_contiguous() {
            // the common case: nothing to broadcast, and a row-major first operand
            // without size-1 (or empty) dims orders the result row-major whatever
            // the other's layout (it tells every two dims apart)
            let out = with_storages2(&a, &b, |sa, sb| f(sa, a.layout(), sb, b.layout()))?;
            let layout = match a.layout().offset() {
                0 => a.layout().clone(),
                _ => Layout::contiguous(a.shape()),
            };
            return Ok(Tensor::with_storage(out, layout));
        }
        let shape = broadcast_shapes(op, a.shape(), b.shape())?;
        let (la, lb) = (a.layout_as(op, &shape)?, b.layout_as(op, &shape)?);
        match Layout::elementwise_strides(&[&la, &lb], same) {
            None => {
                let out = with_storages2(&a, &b, |sa, sb| f(sa, &la, sb, &lb))?;
                Ok(Tensor::from_storage(out, &shape))
            }
            Some(strides) => {
                let perm = Layout::dense_order(&strides);
                let (pa, pb) = (la.permute(&perm), lb.permute(&perm));
                let out = with_storages2(&a, &b, |sa, sb| f(sa, &pa, sb, &pb))?;
                Ok(Tensor::with_storage(
                    out,
                    Layout::with_strides(&shape, strides),
                ))
            }
        }
    }

    pub(super) fn binary_op<O: BinaryOp>(
        &self,
        name: &'static str,
        rhs: Operand,
        op: &O,
        float_only: bool,
    ) -> Result<Tensor> {
        if let Operand::Tensor(t) = rhs {
            if is_cpu_scalar(self) && t.device() != Device::Cpu {
                // a CPU scalar on the left: its value on the other operand's
                // device (rounded to the dtype, as PyTorch's CPU kernels take a
                // 0-d operand on the left), recorded with the scalar itself as
                // the input, so that the other's gradient is the gradient times
                // the scalar as PyTorch's rule computes it (on the right)
                let value = scalar_tensor(self.scalar_value()?, self.dtype(), t.device())?;
                let out = crate::autograd::no_grad(|| value.binary_op(name, rhs, op, float_only))?;
                return Ok(record_binary::<O>(out, name, self, t));
            }
        }
        self.check_bool_sub::<O>(name, rhs)?;
        self.check_division::<O>(name, rhs, float_only)?;
        if let Operand::Scalar(s) = rhs {
            if !crate::autograd::needs_grad(&[self]) {
                return self.scalar_op(s, float_only, |st, l, s| st.binary_scalar(l, s, op));
            }
            // a product or quotient by a number goes to the kernel by value with
            // and without a gradient: in float16 and bfloat16 it is used in
            // float32, not rounded to the dtype first (PyTorch's opmath), and so is
            // it in the gradient, `g * s` or `g / s`
            if matches!(O::CODE, BinaryCode::Mul | BinaryCode::Div) && self.dtype().is_float() {
                let out = self.scalar_op(s, float_only, |st, l, s| st.binary_scalar(l, s, op))?;
                let div = O::CODE == BinaryCode::Div;
                return Ok(Tensor::record_twice(out, name, &[self], |_| {
                    grad::by_number(div, s)
                }));
            }
        }
        if let Operand::Tensor(t) = rhs {
            if is_cpu_scalar(t) && !is_cpu_scalar(self) {
                if let Some(out) = self.binary_by_value(name, t, op, float_only)? {
                    return Ok(out);
                }
            }
        }
        let (b, mut dt) = self.promote_with(name, rhs)?;
        if float_only && !dt.is_float() {
            dt = DType::F32;
        }
        let out = self.broadcast2(name, &b, dt, |x, lx, y, ly| x.binary(lx, y, ly, op))?;
        Ok(record_binary::<O>(out, name, self, &b))
    }

    /// The dtype `self op t` computes in (float32 at least for a `float_only` op).
    pub(super) fn result_dtype(&self, t: &Tensor, float_only: bool) -> DType {
        let dt = DType::result_type(self.dtype(), self.rank() == 0, t.dtype(), t.rank() == 0);
        if float_only && !dt.is_float() {
            DType::F32
        } else {
            dt
        }
    }

    /// `self op t` for a CPU scalar `t` (on the right), with its value passed to
    /// the kernel as a number, as PyTorch's kernels take it: beside a tensor on
    /// another device, and in a float16 or bfloat16 product or quotient by a
    /// scalar of another dtype (whose value is used in float32, not first
    /// rounded to the half dtype: PyTorch's CPU kernels read the operand's
    /// original value). The dtype is the tensors' promotion (a 0-d float64
    /// leaves a float16 tensor float16), not a Python number's. `None` where the
    /// tensor path computes the same.
    fn binary_by_value<O: BinaryOp>(
        &self,
        name: &'static str,
        t: &Tensor,
        op: &O,
        float_only: bool,
    ) -> Result<Option<Tensor>> {
        let dt = self.result_dtype(t, float_only);
        let half_opmath = matches!(O::CODE, BinaryCode::Mul | BinaryCode::Div)
            && matches!(dt, DType::F16 | DType::BF16)
            && t.dtype() != dt;
        if self.device() == Device::Cpu && !half_opmath {
            return Ok(None);
        }
        let s = t.scalar_value()?;
        let out = self
            .to_dtype(dt)?
            .map_storage_elementwise(false, |st, l| st.binary_scalar(l, s, op))?;
        Ok(Some(record_binary::<O>(out, name, self, t)))
    }

    /// PyTorch's rule: `-` with a bool operand (tensor or scalar) on either side is
    /// an error, with PyTorch's reason.
    pub(super) fn check_bool_sub<O: BinaryOp>(
        &self,
        name: &'static str,
        rhs: Operand,
    ) -> Result<()> {
        if O::CODE == BinaryCode::Sub {
            check_bool_sub(name, self.dtype() == DType::Bool, operand_is_bool(rhs))?;
        }
        Ok(())
    }

    /// PyTorch's refusals for `remainder`, `fmod` and `floor_divide`: bool operands
    /// (in the dtype they compute in) and an integer division by zero (its
    /// `ZeroDivisionError`). A tensor divisor's zeros are counted on its device,
    /// which waits for it; a meta tensor has no values to check.
    pub(super) fn check_division<O: BinaryOp>(
        &self,
        name: &'static str,
        rhs: Operand,
        float_only: bool,
    ) -> Result<()> {
        let kernel = match O::CODE {
            BinaryCode::Remainder => "remainder_cpu",
            BinaryCode::Fmod => "fmod_cpu",
            BinaryCode::FloorDivide => "div_floor_cpu",
            _ => return Ok(()),
        };
        let dt = match rhs {
            Operand::Tensor(t) => {
                DType::result_type(self.dtype(), self.rank() == 0, t.dtype(), t.rank() == 0)
            }
            Operand::Scalar(s) => self.scalar_dtype(s, float_only),
        };
        if dt == DType::Bool {
            return Err(Error::dtype(
                name,
                DType::Bool,
                format!("\"{kernel}\" not implemented for 'Bool'"),
            ));
        }
        if dt.is_float() {
            return Ok(());
        }
        let zero = match rhs {
            Operand::Scalar(s) => s.to_f64() == 0.0,
            Operand::Tensor(t) if !t.holds_values() => false,
            Operand::Tensor(t) => {
                crate::autograd::no_grad(|| {
                    t.eq(0)?.to_dtype(DType::I64)?.sum_all()?.item::<i64>()
                })? > 0
            }
        };
        if zero {
            return Err(Error::invalid(
                name,
                "ZeroDivisionError: integer division by zero",
            ));
        }
        Ok(())
    }

    /// `self` (a gradient) times GELU's derivative at `x`, in one pass.
    pub(crate) fn gelu_backward(&self, x: &Tensor) -> Result<Tensor> {
        self.binary_op(
            "gelu_backward",
            Operand::Tensor(x),
            &ops::GeluBackward,
            false,
        )
    }

    /// `self` (a gradient) times tanh-approximated GELU's derivative at `x`, in one
    /// pass.
    pub(crate) fn gelu_tanh_backward(&self, x: &Tensor) -> Result<Tensor> {
        self.binary_op(
            "gelu_tanh_backward",
            Operand::Tensor(x),
            &ops::GeluTanhBackward,
            false,
        )
    }

    /// `self` (a gradient) where `x > 0`, else 0: relu's backward in one pass.
    pub(crate) fn relu_backward(&self, x: &Tensor) -> Result<Tensor> {
        self.binary_op(
            "relu_backward",
            Operand::Tensor(x),
            &ops::ReluBackward,
            false,
        )
    }

    pub(super) fn unary_op<O: UnaryOp>(
        &self,
        name: &'static str,
        op: &O,
        rule: grad::Unary,
    ) -> Result<Tensor> {
        if crate::tensor::autocast::cuda_runs_in_f32(name) {
            if let Some(c) = crate::tensor::autocast::to_f32_cuda(&[self])? {
                return c[0].unary_op(name, op, rule);
            }
        }
        if self.dtype() == DType::Bool && op.code().0 == UnaryCode::Square {
            // PyTorch squares a bool tensor as int64 (pow(x, 2)'s promotion)
            return self.to_dtype(DType::I64)?.unary_op(name, op, rule);
        }
        self.check_unary_dtype::<O>(name)?;
        let t = if O::FLOAT_ONLY && !self.dtype().is_float() {
            self.to_dtype(DType::F32)?
        } else {
            self.clone()
        };
        let out = t.map_storage_elementwise(true, |s, l| s.unary(l, op))?;
        Ok(Tensor::record_twice(out, name, &[self], |y| {
            let (sx, sy) = rule.saves();
            rule.recorded(sx.then(|| t.save()), sy.then(|| y.save()))
        }))
    }

    /// PyTorch's refusals of a one-input op's operand dtype: the ops whose kernels
    /// exist for floating-point dtypes only, and bools where the op does not turn
    /// them into floats.
    pub(super) fn check_unary_dtype<O: UnaryOp>(&self, name: &'static str) -> Result<()> {
        if let (Some(kernel), false) = (O::FLOAT_KERNEL, self.dtype().is_float()) {
            // PyTorch's kernels for these exist for floating-point dtypes only
            return Err(Error::dtype(
                name,
                self.dtype(),
                format!(
                    "\"{kernel}\" not implemented for '{}'; convert with .to_dtype() first",
                    torch_dtype_name(self.dtype())
                ),
            ));
        }
        if self.dtype() == DType::Bool && !O::FLOAT_ONLY {
            return Err(Error::dtype(
                name,
                DType::Bool,
                "convert with .to_dtype() first",
            ));
        }
        Ok(())
    }

    pub(super) fn compare(&self, name: &'static str, rhs: Operand, cmp: CmpOp) -> Result<Tensor> {
        // comparisons have no gradient: a scalar always goes to the kernel by value
        if let Operand::Scalar(s) = rhs {
            return self.scalar_op(s, false, |st, l, s| st.compare_scalar(l, s, cmp));
        }
        if let Operand::Tensor(t) = rhs {
            if is_cpu_scalar(self) && t.device() != Device::Cpu {
                // a CPU scalar on the left: on the other operand's device
                // (filled in there: a comparison has no gradient)
                let lhs = crate::autograd::no_grad(|| self.lifted_to(t.device()))?;
                return lhs.compare(name, rhs, cmp);
            }
        }
        // (no gradient: a CPU scalar is filled in on the device, not copied)
        let (b, dt) = crate::autograd::no_grad(|| self.promote_with(name, rhs))?;
        self.broadcast2(name, &b, dt, |a, la, b, lb| a.compare(la, b, lb, cmp))
    }
}

macro_rules! binary_methods {
    ($($(#[$doc:meta])* $name:ident, $inplace:ident, $op:expr, $float_only:expr;)*) => {$(
        impl Tensor {
            $(#[$doc])*
            pub fn $name<'a>(&self, rhs: impl Into<Operand<'a>>) -> Result<Tensor> {
                self.binary_op(stringify!($name), rhs.into(), &$op, $float_only)
            }
            #[doc = concat!("In-place `", stringify!($name), "`: writes the result into this tensor's elements. Recorded by autograd when a gradient flows through it, as in PyTorch (a leaf that requires grad is refused; so is a view, or a tensor with live views, while recording).")]
            pub fn $inplace<'a>(&self, rhs: impl Into<Operand<'a>>) -> Result<()> {
                self.binary_inplace(stringify!($inplace), rhs.into(), &$op, $float_only)
            }
        }
    )*};
}
binary_methods! {
    /// `self + rhs` with broadcasting (`torch.add`).
    add, add_, ops::Add, false;
    /// `self - rhs` with broadcasting.
    sub, sub_, ops::Sub, false;
    /// `self * rhs` with broadcasting.
    mul, mul_, ops::Mul, false;
    /// True division `self / rhs` (integers give float32, as in PyTorch).
    div, div_, ops::Div, true;
    /// Elementwise maximum; NaN wins.
    maximum, maximum_, ops::Maximum, false;
    /// Elementwise minimum; NaN wins.
    minimum, minimum_, ops::Minimum, false;
    /// `atan2(self, rhs)`: the angle of the point `(rhs, self)` (integers give
    /// float32).
    atan2, atan2_, ops::Atan2, true;
    /// Python's modulo `self % rhs` (`torch.remainder`): the result has the
    /// divisor's sign. Integer division by zero is an error, as in PyTorch.
    remainder, remainder_, ops::Remainder, false;
    /// C's `fmod(self, rhs)` (`torch.fmod`): the result has the dividend's sign.
    fmod, fmod_, ops::Fmod, false;
    /// `floor(self / rhs)` (`torch.floor_divide`, Python's `//`); integers stay
    /// integers. Not differentiable: backward through it is an error, as in PyTorch.
    floor_divide, floor_divide_, ops::FloorDivide, false;
}

macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident $(/ $inplace:ident)?, $op:expr, $rule:ident;)*) => {$(
        impl Tensor {
            $(#[$doc])*
            pub fn $name(&self) -> Result<Tensor> {
                self.unary_op(stringify!($name), &$op, grad::Unary::$rule)
            }
            $(
            #[doc = concat!("In-place [`", stringify!($name), "`](Self::", stringify!($name), "): writes the result into this tensor's elements and returns nothing (PyTorch's `", stringify!($inplace), "`). Recorded by autograd when a gradient flows through it; the rule keeps the result where it reads it, so no buffer is added (a copy of the old values where the rule reads the input, as PyTorch keeps one). Refused for a leaf that requires grad, for a view or a tensor with live views while recording, for an expanded view, and where the result's dtype cannot be written back (an integer tensor of a float-only op).")]
            pub fn $inplace(&self) -> Result<()> {
                self.unary_inplace(stringify!($inplace), &$op, grad::Unary::$rule)
            }
            )?
        }
    )*};
}
unary_methods! {
    /// `-x`.
    neg / neg_, ops::Neg, Neg;
    /// `|x|`.
    abs / abs_, ops::Abs, Abs;
    /// `e^x` (integers give float32).
    exp / exp_, ops::Exp, Exp;
    /// Natural logarithm.
    log / log_, ops::Log, Log;
    /// Square root.
    sqrt / sqrt_, ops::Sqrt, Sqrt;
    /// Hyperbolic tangent.
    tanh / tanh_, ops::Tanh, Tanh;
    /// Sine.
    sin / sin_, ops::Sin, Sin;
    /// Cosine.
    cos / cos_, ops::Cos, Cos;
    /// `1 / x`.
    recip / recip_, ops::Recip, Recip;
    /// `x * x`.
    square / square_, ops::Square, Square;
    /// `max(x, 0)`; NaN stays NaN.
    relu / relu_, ops::Relu, Relu;
    /// `1 / (1 + e^-x)`.
    sigmoid / sigmoid_, ops::Sigmoid, Sigmoid;
    /// The error function.
    erf / erf_, ops::Erf, Erf;
    /// GELU with the exact erf form (`nn.GELU()`).
    gelu, ops::Gelu, Gelu;
    /// GELU with the tanh approximation (`nn.GELU(approximate='tanh')`).
    gelu_tanh, ops::GeluTanh, GeluTanh;
    /// SiLU (swish): `x · sigmoid(x)` (`F.silu`); floating-point dtypes only.
    silu / silu_, ops::Silu, Silu;
    /// `relu6(x + 3) / 6` (`F.hardsigmoid`); floating-point dtypes only.
    hardsigmoid / hardsigmoid_, ops::Hardsigmoid, Hardsigmoid;
    /// `x · relu6(x + 3) / 6` (`F.hardswish`, MobileNetV3's activation);
    /// floating-point dtypes only.
    hardswish / hardswish_, ops::Hardswish, Hardswish;
    /// SELU: `λ x` where `x > 0`, else `λ α (e^x - 1)`, with α ≈ 1.6733 and
    /// λ ≈ 1.0507 (`F.selu`, the self-normalising networks' activation);
    /// floating-point dtypes only.
    selu / selu_, ops::Selu, Selu;
    /// Mish: `x · tanh(softplus(x))` (`F.mish`); floating-point dtypes only.
    mish / mish_, ops::Mish, Mish;
    /// `ln(1 + x)`, accurate near 0.
    log1p / log1p_, ops::Log1p, Log1p;
    /// `e^x - 1`, accurate near 0.
    expm1 / expm1_, ops::Expm1, Expm1;
    /// `1 / sqrt(x)`.
    rsqrt / rsqrt_, ops::Rsqrt, Rsqrt;
    /// Base-2 logarithm.
    log2 / log2_, ops::Log2, Log2;
    /// Base-10 logarithm (integers and bools give float32).
    log10 / log10_, ops::Log10, Log10;
    /// Tangent.
    tan / tan_, ops::Tan, Tan;
    /// Arctangent.
    atan / atan_, ops::Atan, Atan;
    /// Rounds down; integers are returned as they are (a copy), bools refused, as in
    /// PyTorch. The gradient is 0.
    floor / floor_, ops::Floor, Zero;
    /// Rounds up (integers unchanged; gradient 0).
    ceil / ceil_, ops::Ceil, Zero;
    /// Rounds toward zero (integers unchanged; gradient 0).
    trunc / trunc_, ops::Trunc, Zero;
    /// Rounds to the nearest integer, halves to even as in PyTorch (`round(2.5)` is
    /// 2); integers unchanged; gradient 0.
    round / round_, ops::Round, Zero;
}

macro_rules! compare_methods {
    ($($name:ident, $op:ident, $sym:literal;)*) => {$(
        impl Tensor {
            #[doc = concat!("`self ", $sym, " rhs` elementwise, as a bool tensor.")]
            pub fn $name<'a>(&self, rhs: impl Into<Operand<'a>>) -> Result<Tensor> {
                self.compare(stringify!($name), rhs.into(), CmpOp::$op)
            }
        }
    )*};
}
compare_methods! {
    eq, Eq, "==";
    ne, Ne, "!=";
    lt, Lt, "<";
    le, Le, "<=";
    gt, Gt, ">";
    ge, Ge, ">=";
}

impl Tensor {
    /// `torch.where(self, on_true, on_false)`: `self` is the bool condition; all three
    /// broadcast together.
    pub fn where_<'a, 'b>(
        &self,
        on_true: impl Into<Operand<'a>>,
        on_false: impl Into<Operand<'b>>,
    ) -> Result<Tensor> {
        const OP: &str = "where";
        if self.dtype() != DType::Bool {
            return Err(Error::dtype(
                OP,
                self.dtype(),
                "the condition must be a bool tensor",
            ));
        }
        let (x, y) = (on_true.into(), on_false.into());
        // CPU scalars (the condition too) go to the others' device
        let tensors: Vec<&Tensor> = [x, y]
            .into_iter()
            .filter_map(|o| match o {
                Operand::Tensor(t) => Some(t),
                Operand::Scalar(_) => None,
            })
            .chain([self])
            .collect();
        let dev = elementwise_device(OP, &tensors)?;
        let cond = self.lifted_to(dev)?;
        let dt = match (x, y) {
            (Operand::Tensor(a), Operand::Tensor(b)) => {
                DType::result_type(a.dtype(), a.rank() == 0, b.dtype(), b.rank() == 0)
            }
            (Operand::Tensor(a), Operand::Scalar(s)) | (Operand::Scalar(s), Operand::Tensor(a)) => {
                a.promote_with(OP, Operand::Scalar(s))?.1
            }
            (Operand::Scalar(a), Operand::Scalar(b)) => DType::promote(a.dtype(), b.dtype()),
        };
        let as_tensor = |o: Operand| match o {
            Operand::Tensor(t) => t.lifted_to(dev)?.to_dtype(dt),
            Operand::Scalar(s) => scalar_tensor(s, dt, dev),
        };
        let (x, y) = (as_tensor(x)?, as_tensor(y)?);
        let shape = broadcast_shapes(OP, cond.shape(), x.shape())?;
        let shape = broadcast_shapes(OP, &shape, y.shape())?;
        let (lc, lx, ly) = (
            cond.layout().broadcast_to(OP, &shape)?,
            x.layout().broadcast_to(OP, &shape)?,
            y.layout().broadcast_to(OP, &shape)?,
        );
        let st = Storages::read(&[&cond, &x, &y]);
        let out = st.get(0).where_(&lc, st.get(1), &lx, st.get(2), &ly)?;
        drop(st);
        let out = Tensor::from_storage(out, &shape);
        Ok(Tensor::record_twice(out, OP, &[&x, &y], |_| {
            let cond = cond.save();
            let (sx, sy) = (x.shape().to_vec(), y.shape().to_vec());
            move |g: &Tensor| {
                let cond = cond.value()?;
                let gx = crate::autograd::sum_to(&cond.where_(g, 0.0)?, &sx)?;
                let gy = crate::autograd::sum_to(&cond.where_(0.0, g)?, &sy)?;
                Ok(vec![Some(gx), Some(gy)])
            }
        }))
    }
}
