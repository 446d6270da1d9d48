//! Elementwise math with PyTorch's broadcasting and type promotion: arithmetic
//! (out of place and in place), activations, comparisons, `where_`, `masked_fill`.

use super::{grad, with_storages2, Storages, Tensor};
use crate::autograd::{Inputs, Saved};
pub use crate::backend::op::Scalar;
use crate::backend::op::{self as ops, BinaryCode, BinaryOp, CmpOp, UnaryOp};
use crate::backend::Storage;
use crate::layout::{broadcast_shapes, Layout};
use crate::{DType, Device, Error, Result};
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
fn scalar_tensor(s: Scalar, dtype: DType, device: Device) -> Result<Tensor> {
    Tensor::full_scalar(&[], s, dtype, device)
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

/// Whether an operand is a bool tensor or a bool scalar.
fn operand_is_bool(o: Operand) -> bool {
    match o {
        Operand::Tensor(t) => t.dtype() == DType::Bool,
        Operand::Scalar(s) => matches!(s, Scalar::Bool(_)),
    }
}

/// PyTorch refuses `a - b` when either operand is a bool (tensor or scalar), with
/// these two reasons.
fn check_bool_sub(name: &'static str, a_bool: bool, b_bool: bool) -> Result<()> {
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
fn can_cast(from: DType, to: DType) -> bool {
    !(from.is_float() && !to.is_float() || from.is_int() && to == DType::Bool)
}

impl Tensor {
    /// The other operand as a tensor, and the dtype PyTorch computes `self op rhs` in.
    fn promote_with<'a>(
        &self,
        op: &'static str,
        rhs: Operand<'a>,
    ) -> Result<(Cow<'a, Tensor>, DType)> {
        match rhs {
            Operand::Tensor(t) => {
                super::same_device(op, &[self, t])?;
                let dt =
                    DType::result_type(self.dtype(), self.rank() == 0, t.dtype(), t.rank() == 0);
                Ok((Cow::Borrowed(t), dt))
            }
            Operand::Scalar(s) => {
                let dt = self.scalar_dtype(s, false);
                Ok((Cow::Owned(scalar_tensor(s, dt, self.device())?), dt))
            }
        }
    }

    /// The dtype PyTorch computes `self op s` in, for a Python-style scalar `s`
    /// (float32 at least when the op is `float_only`, like true division).
    fn scalar_dtype(&self, s: Scalar, float_only: bool) -> DType {
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
    fn scalar_op(
        &self,
        s: Scalar,
        float_only: bool,
        f: impl FnOnce(&Storage, &Layout, Scalar) -> Result<Storage>,
    ) -> Result<Tensor> {
        let a = self.to_dtype(self.scalar_dtype(s, float_only))?;
        a.map_storage_same(|st, l| f(st, l, s))
    }

    /// The tensor `f(a, b)` computes after promotion to `dt` and broadcasting
    /// (contiguous, of the broadcast shape).
    fn broadcast2(
        &self,
        op: &'static str,
        b: &Tensor,
        dt: DType,
        f: impl FnOnce(&Storage, &Layout, &Storage, &Layout) -> Result<Storage>,
    ) -> Result<Tensor> {
        let (a, b) = (self.as_dtype(dt)?, b.as_dtype(dt)?);
        if a.shape() == b.shape() {
            // the common case: nothing to broadcast
            let out = with_storages2(&a, &b, |sa, sb| f(sa, a.layout(), sb, b.layout()))?;
            return Ok(Tensor::from_storage_like(out, a.layout()));
        }
        let shape = broadcast_shapes(op, a.shape(), b.shape())?;
        let (la, lb) = (a.layout_as(op, &shape)?, b.layout_as(op, &shape)?);
        let out = with_storages2(&a, &b, |sa, sb| f(sa, &la, sb, &lb))?;
        Ok(Tensor::from_storage(out, &shape))
    }

    fn binary_op<O: BinaryOp>(
        &self,
        name: &'static str,
        rhs: Operand,
        op: &O,
        float_only: bool,
    ) -> Result<Tensor> {
        self.check_bool_sub::<O>(name, rhs)?;
        self.check_division::<O>(name, rhs, float_only)?;
        if let Operand::Scalar(s) = rhs {
            if !crate::autograd::needs_grad(&[self]) {
                return self.scalar_op(s, float_only, |st, l, s| st.binary_scalar(l, s, op));
            }
        }
        let (b, mut dt) = self.promote_with(name, rhs)?;
        if float_only && !dt.is_float() {
            dt = DType::F32;
        }
        let out = self.broadcast2(name, &b, dt, |x, lx, y, ly| x.binary(lx, y, ly, op))?;
        // the rules read the inputs from the node (backward runs without recording);
        // only pow keeps the output, and a rule that captures nothing is boxed
        // without an allocation
        let keep = grad::binary_reads(O::CODE, self.requires_grad(), b.requires_grad());
        if O::CODE == BinaryCode::Pow {
            Ok(Tensor::record_keeping(out, name, &[self, &b], &keep, |y| {
                let y = y.save();
                move |g: &Tensor, ab: &Inputs| grad::binary(O::CODE, ab, Some(&y), g)
            }))
        } else {
            Ok(Tensor::record_keeping(
                out,
                name,
                &[self, &b],
                &keep,
                |_| |g: &Tensor, ab: &Inputs| grad::binary(O::CODE, ab, None, g),
            ))
        }
    }

    /// PyTorch's rule: `-` with a bool operand (tensor or scalar) on either side is
    /// an error, with PyTorch's reason.
    fn check_bool_sub<O: BinaryOp>(&self, name: &'static str, rhs: Operand) -> Result<()> {
        if O::CODE == BinaryCode::Sub {
            check_bool_sub(name, self.dtype() == DType::Bool, operand_is_bool(rhs))?;
        }
        Ok(())
    }

    /// PyTorch's refusals for `remainder`, `fmod` and `floor_divide`: bool operands
    /// (in the dtype they compute in) and an integer division by zero (its
    /// `ZeroDivisionError`). A tensor divisor's zeros are counted on its device,
    /// which waits for it; a meta tensor has no values to check.
    fn check_division<O: BinaryOp>(
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
            Operand::Tensor(t) if t.device() == Device::Meta => false,
            Operand::Tensor(t) => {
                crate::no_grad(|| t.eq(0)?.to_dtype(DType::I64)?.sum_all()?.item::<i64>())? > 0
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

    /// In place: `self = self op rhs`, where `rhs` broadcasts to `self`'s shape and the
    /// result dtype can be cast to `self`'s. Recorded when a gradient is tracked (see
    /// [`check_inplace_target`](Self::check_inplace_target)).
    fn binary_inplace<O: BinaryOp>(
        &self,
        name: &'static str,
        rhs: Operand,
        op: &O,
        float_only: bool,
    ) -> Result<()> {
        self.check_bool_sub::<O>(name, rhs)?;
        self.check_division::<O>(name, rhs, float_only)?;
        let recorded = self.check_inplace_target(name, rhs)?;
        if let Operand::Scalar(s) = rhs {
            if !recorded && self.scalar_dtype(s, float_only) == self.dtype() {
                // the scalar goes to the kernel by value: one pass, no 0-d tensor
                self.check_writable(name)?;
                return self.write().binary_scalar_inplace(self.layout(), s, op);
            }
        }
        let (b, mut dt) = self.promote_with(name, rhs)?;
        if float_only && !dt.is_float() {
            dt = DType::F32;
        }
        if !can_cast(dt, self.dtype()) {
            return Err(Error::invalid(
                name,
                format!(
                    "result type {dt} can't be cast to the desired output type {}",
                    self.dtype()
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
            let out = a.binary_op(name, Operand::Tensor(&b), op, float_only)?;
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

    /// Writes `out`'s values (this tensor's shape and dtype) into this tensor and
    /// makes `out`'s node its history: the end of a recorded in-place op.
    pub(crate) fn write_history(&self, out: &Tensor) -> Result<()> {
        // reading and writing one storage (`h.copy_(&h)`): a snapshot first, so
        // that one lock is taken at a time
        let values = if out.same_storage(self) {
            crate::no_grad(|| out.copy())?
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
    /// `self` (a gradient) times GELU's derivative at `x`, in one pass.
    pub(crate) fn gelu_backward(&self, x: &Tensor) -> Result<Tensor> {
        self.binary_op(
            "gelu_backward",
            Operand::Tensor(x),
            &ops::GeluBackward,
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

    /// Whether an in-place op on this tensor must be recorded (a gradient is
    /// tracked through it), and an error where PyTorch refuses it or ember cannot
    /// record it:
    /// - a leaf that requires a gradient (PyTorch's error; update it inside
    ///   [`no_grad`](crate::no_grad), as optimizers do);
    /// - a view, or a tensor with live views, while recording: PyTorch rewrites the
    ///   history of the view's base and of its other views, which ember does not
    ///   do yet.
    pub(crate) fn check_inplace_target(&self, op: &'static str, rhs: Operand) -> Result<bool> {
        let rhs_grad = matches!(rhs, Operand::Tensor(t) if t.requires_grad());
        // an integer or bool tensor never carries a gradient: written, not recorded
        // (a float operand is then refused by the cast check, as in PyTorch)
        if !crate::autograd::is_grad_enabled()
            || !(self.requires_grad() || rhs_grad)
            || !self.dtype().is_float()
        {
            return Ok(false);
        }
        if self.requires_grad() && self.is_leaf() {
            return Err(Error::invalid(
                op,
                "a leaf Variable that requires grad is being used in an in-place operation. Update it inside ember::no_grad(|| ...) (as optimizers do) or use the out-of-place op",
            ));
        }
        if self.is_view() || self.live_views() > 0 {
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
    /// tensor's elements, through views too (`Tensor.copy_`). Recorded by autograd
    /// when `src` or this tensor requires grad: `src` gets the gradient, the old
    /// values a zero one (PyTorch's rule); while recording, a view or a tensor with
    /// live views is refused.
    pub fn copy_(&self, src: &Tensor) -> Result<()> {
        super::same_device("copy_", &[self, src])?;
        let recorded = self.check_inplace_target("copy_", Operand::Tensor(src))?;
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
        let values = crate::no_grad(|| src.to_dtype(self.dtype())?.expand(self.shape()))?;
        let values = Tensor::record(values, "copy_", &[self, src], |_| {
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

    fn unary_op<O: UnaryOp>(
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
        let t = if O::FLOAT_ONLY && !self.dtype().is_float() {
            self.to_dtype(DType::F32)?
        } else {
            self.clone()
        };
        let out = t.map_storage_same(|s, l| s.unary(l, op))?;
        Ok(Tensor::record(out, name, &[self], |y| {
            let (sx, sy) = rule.saves();
            let (x, y) = (sx.then(|| t.save()), sy.then(|| y.save()));
            move |g: &Tensor| {
                let x = x.as_ref().map(Saved::get).transpose()?;
                let y = y.as_ref().map(Saved::get).transpose()?;
                Ok(vec![Some(rule.backward(x, y, g)?)])
            }
        }))
    }

    fn compare(&self, name: &'static str, rhs: Operand, cmp: CmpOp) -> Result<Tensor> {
        // comparisons have no gradient: a scalar always goes to the kernel by value
        if let Operand::Scalar(s) = rhs {
            return self.scalar_op(s, false, |st, l, s| st.compare_scalar(l, s, cmp));
        }
        let (b, dt) = self.promote_with(name, rhs)?;
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
    ($($(#[$doc:meta])* $name:ident, $op:expr, $rule:ident;)*) => {$(
        impl Tensor {
            $(#[$doc])*
            pub fn $name(&self) -> Result<Tensor> {
                self.unary_op(stringify!($name), &$op, grad::Unary::$rule)
            }
        }
    )*};
}
unary_methods! {
    /// `-x`.
    neg, ops::Neg, Neg;
    /// `|x|`.
    abs, ops::Abs, Abs;
    /// `e^x` (integers give float32).
    exp, ops::Exp, Exp;
    /// Natural logarithm.
    log, ops::Log, Log;
    /// Square root.
    sqrt, ops::Sqrt, Sqrt;
    /// Hyperbolic tangent.
    tanh, ops::Tanh, Tanh;
    /// Sine.
    sin, ops::Sin, Sin;
    /// Cosine.
    cos, ops::Cos, Cos;
    /// `1 / x`.
    recip, ops::Recip, Recip;
    /// `x * x`.
    square, ops::Square, Square;
    /// `max(x, 0)`; NaN stays NaN.
    relu, ops::Relu, Relu;
    /// `1 / (1 + e^-x)`.
    sigmoid, ops::Sigmoid, Sigmoid;
    /// The error function.
    erf, ops::Erf, Erf;
    /// GELU with the exact erf form (`nn.GELU()`).
    gelu, ops::Gelu, Gelu;
    /// GELU with the tanh approximation (`nn.GELU(approximate='tanh')`).
    gelu_tanh, ops::GeluTanh, GeluTanh;
    /// SiLU (swish): `x · sigmoid(x)` (`F.silu`); floating-point dtypes only.
    silu, ops::Silu, Silu;
    /// `ln(1 + x)`, accurate near 0.
    log1p, ops::Log1p, Log1p;
    /// `e^x - 1`, accurate near 0.
    expm1, ops::Expm1, Expm1;
    /// `1 / sqrt(x)`.
    rsqrt, ops::Rsqrt, Rsqrt;
    /// Base-2 logarithm.
    log2, ops::Log2, Log2;
    /// Tangent.
    tan, ops::Tan, Tan;
    /// Arctangent.
    atan, ops::Atan, Atan;
    /// Rounds down; integers are returned as they are (a copy), bools refused, as in
    /// PyTorch. The gradient is 0.
    floor, ops::Floor, Zero;
    /// Rounds up (integers unchanged; gradient 0).
    ceil, ops::Ceil, Zero;
    /// Rounds toward zero (integers unchanged; gradient 0).
    trunc, ops::Trunc, Zero;
    /// Rounds to the nearest integer, halves to even as in PyTorch (`round(2.5)` is
    /// 2); integers unchanged; gradient 0.
    round, ops::Round, Zero;
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
    /// Rounds to `decimals` decimal places (`torch.round(x, decimals=d)`): halves
    /// to even, as `round`; a negative `decimals` rounds to tens, hundreds, ... .
    /// Computed as PyTorch's kernel does, `round(x · 10^d) / 10^d` (or
    /// `round(x / 10^-d) · 10^-d`), in float32 for f16/bf16. Float dtypes only
    /// (PyTorch refuses integers here, even with `decimals = 0`). Gradient 0.
    pub fn round_decimals(&self, decimals: i64) -> Result<Tensor> {
        let dt = self.dtype();
        if !dt.is_float() {
            let kernel = if decimals == 0 {
                "round_vml_cpu"
            } else {
                "round_cpu"
            };
            return Err(Error::dtype(
                "round",
                dt,
                format!(
                    "\"{kernel}\" not implemented for '{}'",
                    torch_dtype_name(dt)
                ),
            ));
        }
        if decimals == 0 {
            return self.round();
        }
        let x = match dt {
            DType::F16 | DType::BF16 => self.to_dtype(DType::F32)?,
            _ => self.clone(),
        };
        let ten = 10f64.powi(decimals.unsigned_abs().min(i32::MAX as u64) as i32);
        let y = if decimals > 0 {
            x.mul(ten)?.round()?.div(ten)?
        } else {
            x.div(ten)?.round()?.mul(ten)?
        };
        y.to_dtype(dt)
    }

    /// -1, 0 or 1 by the sign of each element (`torch.sign`): NaN gives 0, a bool
    /// tensor is returned as it is (a copy), integers keep their dtype. The gradient
    /// is 0.
    pub fn sign(&self) -> Result<Tensor> {
        if self.dtype() == DType::Bool {
            return crate::no_grad(|| self.copy());
        }
        self.unary_op("sign", &ops::Sign, grad::Unary::Zero)
    }

    /// Whether each element is NaN (`torch.isnan`); false for integers and bools.
    pub fn isnan(&self) -> Result<Tensor> {
        if self.dtype().is_float() {
            self.ne(self)
        } else {
            self.full_like_bool(false)
        }
    }

    /// Whether each element is +∞ or -∞ (`torch.isinf`).
    pub fn isinf(&self) -> Result<Tensor> {
        if self.dtype().is_float() {
            self.abs()?.eq(f64::INFINITY)
        } else {
            self.full_like_bool(false)
        }
    }

    /// Whether each element is finite: neither NaN nor infinite (`torch.isfinite`).
    pub fn isfinite(&self) -> Result<Tensor> {
        if self.dtype().is_float() {
            // false for NaN (every comparison with it is) and for ±∞
            self.abs()?.lt(f64::INFINITY)
        } else {
            self.full_like_bool(true)
        }
    }

    fn full_like_bool(&self, v: bool) -> Result<Tensor> {
        Tensor::full(self.shape(), v, DType::Bool, &self.device())
    }

    /// NaN replaced by `nan`, +∞ by `posinf` and -∞ by `neginf`, which default
    /// to the dtype's largest and lowest finite values (`torch.nan_to_num`).
    /// Integers and bools are returned as they are (a copy). The gradient passes
    /// where the element was finite.
    pub fn nan_to_num(&self, nan: f64, posinf: Option<f64>, neginf: Option<f64>) -> Result<Tensor> {
        if !self.dtype().is_float() {
            return self.copy();
        }
        let max = match self.dtype() {
            DType::F16 => half::f16::MAX.to_f64(),
            DType::BF16 => half::bf16::MAX.to_f64(),
            DType::F32 => f32::MAX as f64,
            _ => f64::MAX,
        };
        let y = self.isnan()?.where_(nan, self)?;
        let y = self.eq(f64::INFINITY)?.where_(posinf.unwrap_or(max), &y)?;
        self.eq(f64::NEG_INFINITY)?
            .where_(neginf.unwrap_or(-max), &y)
    }

    /// `log(1 + e^(βx)) / β`, and `x` itself where `βx > threshold` (`F.softplus`;
    /// PyTorch's defaults are `beta = 1`, `threshold = 20`). Floating-point only.
    pub fn softplus(&self, beta: f64, threshold: f64) -> Result<Tensor> {
        self.unary_op(
            "softplus",
            &ops::Softplus { beta, threshold },
            grad::Unary::Softplus(beta, threshold),
        )
    }

    /// ELU: `x` where `x > 0`, else `alpha · (e^x - 1)` (`F.elu`, default
    /// `alpha = 1`). Floating-point only.
    pub fn elu(&self, alpha: f64) -> Result<Tensor> {
        self.unary_op("elu", &ops::Elu(alpha), grad::Unary::Elu(alpha))
    }

    /// `x` where `x > 0`, else `negative_slope · x` (`F.leaky_relu`, default
    /// slope 0.01). Floating-point only.
    pub fn leaky_relu(&self, negative_slope: f64) -> Result<Tensor> {
        self.unary_op(
            "leaky_relu",
            &ops::LeakyRelu(negative_slope),
            grad::Unary::LeakyRelu(negative_slope),
        )
    }

    /// `scalar - self` (`torch.rsub(self, scalar)`, Python's `2 - t`), with the
    /// type promotion of a Python number: an int scalar keeps an integer tensor's
    /// dtype, a float one makes it float32. A bool on either side is an error, as in
    /// PyTorch. The operators `1.0 - &t` and `2 - &t` panic where this returns the
    /// error.
    pub fn rsub(&self, scalar: impl Into<Scalar>) -> Result<Tensor> {
        let s = scalar.into();
        check_bool_sub(
            "rsub",
            matches!(s, Scalar::Bool(_)),
            self.dtype() == DType::Bool,
        )?;
        let dt = self.scalar_dtype(s, false);
        self.scalar_lhs(s, dt, |a, b| a.sub(b))
    }

    /// `f(scalar, self)` in `dt`; f16 and bf16 compute in float32 (the scalar is
    /// not rounded to the half dtype first, as in PyTorch) and round once.
    fn scalar_lhs(
        &self,
        s: Scalar,
        dt: DType,
        f: impl FnOnce(&Tensor, &Tensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        if matches!(dt, DType::F16 | DType::BF16) {
            let lhs = scalar_tensor(s, DType::F32, self.device())?;
            return f(&lhs, &self.to_dtype(DType::F32)?)?.to_dtype(dt);
        }
        f(&scalar_tensor(s, dt, self.device())?, self)
    }

    /// `scalar / self`, true division (`torch.div(scalar, self)`, Python's
    /// `2 / t`): integers and bools give float32, as in PyTorch. The operators
    /// `1.0 / &t` and `2 / &t` panic where this returns the error.
    pub fn rdiv(&self, scalar: impl Into<Scalar>) -> Result<Tensor> {
        let s = scalar.into();
        let dt = self.scalar_dtype(s, true);
        self.scalar_lhs(s, dt, |a, b| a.div(b))
    }

    /// `self ^ exponent` for a tensor or scalar exponent (`torch.pow`).
    pub fn pow<'a>(&self, exponent: impl Into<Operand<'a>>) -> Result<Tensor> {
        let exponent = exponent.into();
        // on CUDA's autocast float32 list (base and exponent)
        let cast = match exponent {
            Operand::Tensor(e) => crate::tensor::autocast::to_f32_cuda(&[self, e])?,
            _ => crate::tensor::autocast::to_f32_cuda(&[self])?,
        };
        if let Some(c) = cast {
            return match exponent {
                Operand::Tensor(_) => c[0].pow(&c[1]),
                other => c[0].pow(other),
            };
        }
        match exponent {
            Operand::Scalar(s) => {
                if let (Scalar::Int(e), false) = (s, self.dtype().is_float()) {
                    if e < 0 {
                        return Err(Error::invalid(
                            "pow",
                            "integers to negative integer powers are not allowed",
                        ));
                    }
                }
                if let (DType::Bool, Scalar::Bool(e)) = (self.dtype(), s) {
                    // bool ** bool stays bool: x ** True is x, x ** False is 1
                    return if e {
                        Ok(self.clone())
                    } else {
                        self.ones_like()
                    };
                }
                // the dtype PyTorch computes in: bool ** int is int64, ints ** float
                // are float32
                let t = self.to_dtype(self.scalar_dtype(s, false))?;
                t.unary_op(
                    "pow",
                    &ops::PowScalar(s.to_f64()),
                    grad::Unary::Pow(s.to_f64()),
                )
            }
            rhs => {
                if let Operand::Tensor(e) = rhs {
                    if self.dtype() == DType::Bool && e.dtype() == DType::Bool {
                        return Err(Error::dtype(
                            "pow",
                            DType::Bool,
                            "\"pow\" not implemented for 'Bool'",
                        ));
                    }
                }
                self.binary_op("pow", rhs, &ops::Pow, false)
            }
        }
    }

    /// Limits every element to `[min, max]` (`torch.clamp`); NaN stays NaN. The
    /// bounds are Python-style scalars: an integer tensor clamped by float bounds
    /// (`Some(3.0)`) is computed in float32, by integer bounds (`Some(3)`) in its
    /// own dtype, as in PyTorch. A uint8 `min` above 255 or `max` below 0 is an
    /// error. Give `None` a type when both are `None`: `clamp::<f64>(None, None)`
    /// (an error, as in PyTorch).
    pub fn clamp<S: Into<Scalar>>(&self, min: Option<S>, max: Option<S>) -> Result<Tensor> {
        let (min, max) = (min.map(Into::into), max.map(Into::into));
        if min.is_none() && max.is_none() {
            return Err(Error::invalid(
                "clamp",
                "at least one of 'min' or 'max' must not be None",
            ));
        }
        let bounds = [min, max];
        let float = bounds
            .iter()
            .flatten()
            .any(|b| matches!(b, Scalar::Float(_)));
        let dt = match self.dtype() {
            d if float => DType::with_scalar(d, true),
            DType::Bool => DType::I64,
            d => d,
        };
        if dt == DType::U8 {
            for (which, b, bad) in [("min", min, 255i64), ("max", max, 0)] {
                if let Some(Scalar::Int(v)) = b {
                    if (which == "min" && v > bad) || (which == "max" && v < bad) {
                        return Err(Error::invalid(
                            "clamp",
                            format!("Clamp {which} value {v} is outside the representable range of Byte"),
                        ));
                    }
                }
            }
        }
        let t = if dt == self.dtype() {
            self.clone()
        } else {
            self.to_dtype(dt)?
        };
        let f = |b: Option<Scalar>| b.map(|b| b.by_value().0);
        let (min, max) = (f(min), f(max));
        t.unary_op("clamp", &ops::Clamp(min, max), grad::Unary::Clamp(min, max))
    }

    /// `clamp(min, None)`.
    pub fn clamp_min(&self, min: impl Into<Scalar>) -> Result<Tensor> {
        self.clamp(Some(min.into()), None)
    }

    /// `clamp(None, max)`.
    pub fn clamp_max(&self, max: impl Into<Scalar>) -> Result<Tensor> {
        self.clamp(None, Some(max.into()))
    }

    /// Limits every element to `[min, max]` given as tensors that broadcast with
    /// this one (`torch.clamp(t, min=tensor, max=tensor)`); either bound may be
    /// `None`, not both. The result is `minimum(maximum(t, min), max)` (NaN in any
    /// operand gives NaN; a `min` above `max` gives `max`) in the three operands'
    /// result dtype, of their broadcast shape. Gradients are PyTorch's: `t` gets
    /// the gradient where it lies within the bounds, `min` where `t` is below it,
    /// `max` where `t` is above it or `min > max`; a tie of `t` with a bound splits
    /// the gradient between them (as `maximum`'s does), each share summed to its
    /// operand's shape.
    ///
    /// ```
    /// # use ember::{Device, Tensor};
    /// let dev = Device::Cpu;
    /// let x = Tensor::from_vec(vec![-2.0f32, 0.5, 3.0], [3], &dev)?;
    /// let lo = Tensor::from_vec(vec![-1.0f32, 1.0, 0.0], [3], &dev)?;
    /// let hi = Tensor::from_vec(vec![2.0f32], [1], &dev)?;
    /// let y = x.clamp_tensor(Some(&lo), Some(&hi))?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![-1.0, 1.0, 2.0]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn clamp_tensor(&self, min: Option<&Tensor>, max: Option<&Tensor>) -> Result<Tensor> {
        const OP: &str = "clamp";
        if min.is_none() && max.is_none() {
            return Err(Error::invalid(
                OP,
                "torch.clamp: At least one of 'min' or 'max' must not be None",
            ));
        }
        let mut all = vec![self];
        all.extend(min);
        all.extend(max);
        super::same_device(OP, &all)?;
        // PyTorch's result type of the three: the dimensioned operands' promotion,
        // unless a 0-d one is of a higher category
        let fold = |zero: bool| {
            all.iter()
                .filter(|t| (t.rank() == 0) == zero)
                .map(|t| t.dtype())
                .reduce(DType::promote)
        };
        let dt = match (fold(false), fold(true)) {
            (Some(d), Some(z)) => DType::result_type(d, false, z, true),
            (Some(d), None) | (None, Some(d)) => d,
            (None, None) => unreachable!("at least the input"),
        };
        let mut shape = self.shape().to_vec();
        for b in all[1..].iter() {
            shape = broadcast_shapes(OP, &shape, b.shape())?.to_vec();
        }
        let x = self.to_dtype(dt)?;
        let lo = min.map(|t| t.to_dtype(dt)).transpose()?;
        let hi = max.map(|t| t.to_dtype(dt)).transpose()?;
        let out = crate::no_grad(|| -> Result<Tensor> {
            let mut y = x.expand(&shape[..])?;
            if let Some(lo) = &lo {
                y = y.maximum(lo)?;
            }
            if let Some(hi) = &hi {
                y = y.minimum(hi)?;
            }
            if y.same_storage(&x) {
                y = y.copy()?;
            }
            Ok(y)
        })?;
        let mut inputs = vec![&x];
        inputs.extend(lo.as_ref());
        inputs.extend(hi.as_ref());
        let (has_lo, has_hi) = (lo.is_some(), hi.is_some());
        Ok(Tensor::record(out, OP, &inputs, |_| {
            let wants: Vec<bool> = inputs.iter().map(|t| t.requires_grad()).collect();
            let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
            let saved: Vec<_> = inputs.iter().map(|t| t.save()).collect();
            move |g: &Tensor| {
                let x = saved[0].get()?;
                let lo = has_lo.then(|| saved[1].get()).transpose()?;
                let hi = has_hi.then(|| saved[saved.len() - 1].get()).transpose()?;
                // each operand's share of the gradient, as a weight in g's dtype
                let pick = |w: Tensor, k: usize| -> Result<Option<Tensor>> {
                    if !wants[k] {
                        return Ok(None);
                    }
                    let gw = w.ne(0.0)?.where_(&g.mul(&w)?, 0.0)?;
                    crate::autograd::sum_to(&gw, &shapes[k]).map(Some)
                };
                let f = |b: Tensor| b.to_dtype(g.dtype());
                let half = |b: Tensor| -> Result<Tensor> { f(b)?.mul(0.5) };
                let mut grads = Vec::new();
                match (lo, hi) {
                    (Some(lo), Some(hi)) => {
                        // PyTorch's shares (checked against it over every order
                        // of x, min, max and NaN): ties with an ordered pair of
                        // bounds split the gradient, min > max sends it to max
                        let ordered = lo.lt(hi)?;
                        let at_lo = f(x.eq(lo)?.logical_and(&ordered)?)?;
                        let at_hi = f(x.eq(hi)?.logical_and(&ordered)?)?;
                        let inside = x.lt(lo)?.logical_or(&x.gt(hi)?)?.logical_not()?;
                        let wx = f(inside)?.mul(&at_lo.add(&at_hi)?.mul(-0.5)?.add(1.0)?)?;
                        let not_crossed = lo.le(hi)?;
                        let wl = f(x.lt(lo)?.logical_and(&not_crossed)?)?.add(&at_lo.mul(0.5)?)?;
                        let wh = f(x.gt(hi)?.logical_and(&not_crossed)?)?
                            .add(&at_hi.mul(0.5)?)?
                            .add(&f(lo.gt(hi)?)?)?;
                        grads.push(pick(wx, 0)?);
                        grads.push(pick(wl, 1)?);
                        grads.push(pick(wh, 2)?);
                    }
                    // one bound: maximum's (minimum's) shares, a tie split evenly
                    (Some(b), None) | (None, Some(b)) => {
                        let tie = half(x.eq(b)?)?.mul(-1.0)?.add(1.0)?;
                        let (x_out, b_out) = if has_lo {
                            (x.lt(b)?, b.lt(x)?)
                        } else {
                            (x.gt(b)?, b.gt(x)?)
                        };
                        grads.push(pick(f(x_out.logical_not()?)?.mul(&tie)?, 0)?);
                        grads.push(pick(f(b_out.logical_not()?)?.mul(&tie)?, 1)?);
                    }
                    (None, None) => unreachable!("a bound"),
                }
                Ok(grads)
            }
        }))
    }

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
        let dt = match (x, y) {
            (Operand::Tensor(a), Operand::Tensor(b)) => {
                super::same_device(OP, &[self, a, b])?;
                DType::result_type(a.dtype(), a.rank() == 0, b.dtype(), b.rank() == 0)
            }
            (Operand::Tensor(a), Operand::Scalar(s)) | (Operand::Scalar(s), Operand::Tensor(a)) => {
                super::same_device(OP, &[self, a])?;
                a.promote_with(OP, Operand::Scalar(s))?.1
            }
            (Operand::Scalar(a), Operand::Scalar(b)) => DType::promote(a.dtype(), b.dtype()),
        };
        let as_tensor = |o: Operand| match o {
            Operand::Tensor(t) => t.to_dtype(dt),
            Operand::Scalar(s) => scalar_tensor(s, dt, self.device()),
        };
        let (x, y) = (as_tensor(x)?, as_tensor(y)?);
        let shape = broadcast_shapes(OP, self.shape(), x.shape())?;
        let shape = broadcast_shapes(OP, &shape, y.shape())?;
        let (lc, lx, ly) = (
            self.layout().broadcast_to(OP, &shape)?,
            x.layout().broadcast_to(OP, &shape)?,
            y.layout().broadcast_to(OP, &shape)?,
        );
        let st = Storages::read(&[self, &x, &y]);
        let out = st.get(0).where_(&lc, st.get(1), &lx, st.get(2), &ly)?;
        drop(st);
        let out = Tensor::from_storage(out, &shape);
        Ok(Tensor::record(out, OP, &[&x, &y], |_| {
            let cond = self.save();
            let (sx, sy) = (x.shape().to_vec(), y.shape().to_vec());
            move |g: &Tensor| {
                let cond = cond.get()?;
                let gx = crate::autograd::sum_to(&cond.where_(g, 0.0)?, &sx)?;
                let gy = crate::autograd::sum_to(&cond.where_(0.0, g)?, &sy)?;
                Ok(vec![Some(gx), Some(gy)])
            }
        }))
    }

    /// `value` where `mask` is true, else this tensor's elements (`masked_fill`).
    /// The mask broadcasts to this tensor's shape; the dtype stays this tensor's. A
    /// value the dtype cannot hold is an error, as in [`Tensor::full`].
    pub fn masked_fill(&self, mask: &Tensor, value: impl Into<Scalar>) -> Result<Tensor> {
        if mask.dtype() != DType::Bool {
            return Err(Error::dtype(
                "masked_fill",
                mask.dtype(),
                "the mask must be a bool tensor",
            ));
        }
        super::same_device("masked_fill", &[self, mask])?;
        let value = value.into();
        // a value the dtype cannot hold is an error, as in PyTorch (see `full`)
        super::create::check_fill_value("masked_fill", value, self.dtype())?;
        // the mask and this tensor broadcast together, as in PyTorch's
        // out-of-place masked_fill
        crate::layout::broadcast_shapes("masked_fill", self.shape(), mask.shape())?;
        let v = scalar_tensor(value, self.dtype(), self.device())?;
        let out = mask.where_(&v, self)?;
        Ok(out)
    }
}
