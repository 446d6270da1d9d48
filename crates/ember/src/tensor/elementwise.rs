//! Elementwise math with PyTorch's broadcasting and type promotion: arithmetic
//! (out of place and in place), activations, comparisons, `where_`, `masked_fill`.

use super::{grad, Tensor};
use crate::backend::cpu::elementwise as k;
use crate::backend::cuda::{ops as cuda_ops, CudaStorage};
pub use crate::backend::op::Scalar;
use crate::backend::op::{self as ops, BinaryOp, CmpOp, UnaryOp};
use crate::backend::Storage;
use crate::dtype::CpuData;
use crate::layout::{broadcast_shapes, Layout};
use crate::{DType, Device, Error, Result};

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
    if let Device::Cuda(i) = device {
        let dev = crate::backend::cuda::dev(i)?;
        let v = match s {
            Scalar::Bool(b) => b as u8 as f64,
            other => other.to_f64(),
        };
        return Ok(Tensor::from_cuda(cuda_ops::fill(&dev, dtype, 1, v)?, &[]));
    }
    let data = match s {
        Scalar::Int(i) => CpuData::I64(vec![i]),
        other => CpuData::F64(vec![other.to_f64()]),
    };
    let t = Tensor::from_cpu(data, &[]);
    if t.dtype() == dtype {
        Ok(t)
    } else {
        let data = t.with_cpu(|d, l| k::cast(d, l, dtype))??;
        Ok(Tensor::from_cpu(data, &[]))
    }
}

/// PyTorch's `can_cast`: floats do not go into ints or bools, ints not into bools.
fn can_cast(from: DType, to: DType) -> bool {
    !(from.is_float() && !to.is_float() || from.is_int() && to == DType::Bool)
}

impl Tensor {
    /// The other operand as a tensor, and the dtype PyTorch computes `self op rhs` in.
    fn promote_with(&self, op: &'static str, rhs: Operand) -> Result<(Tensor, DType)> {
        match rhs {
            Operand::Tensor(t) => {
                super::same_device(op, &[self, t])?;
                let dt =
                    DType::result_type(self.dtype(), self.rank() == 0, t.dtype(), t.rank() == 0);
                Ok((t.clone(), dt))
            }
            Operand::Scalar(s) => {
                let dt = self.scalar_dtype(s, false);
                Ok((scalar_tensor(s, dt, self.device())?, dt))
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

    /// `self op s` on a GPU with the scalar passed to the kernel by value (no
    /// one-element tensor, one launch), when no gradient is recorded; `None` where
    /// that does not apply.
    fn scalar_op_cuda(
        &self,
        rhs: Operand,
        float_only: bool,
        kernel: impl FnOnce(&CudaStorage, &Layout, (f64, i64)) -> Result<CudaStorage>,
    ) -> Result<Option<Tensor>> {
        let Operand::Scalar(s) = rhs else {
            return Ok(None);
        };
        if !self.is_cuda() || crate::autograd::needs_grad(&[self]) {
            return Ok(None);
        }
        let a = self.to_dtype(self.scalar_dtype(s, float_only))?;
        let st = a.cuda_storage().expect("on the GPU");
        let out = kernel(&st, a.layout(), s.by_value())?;
        Ok(Some(Tensor::from_cuda(out, a.shape())))
    }

    /// The tensor `cpu(a, b)` or `cuda(a, b)` computes after promotion and
    /// broadcasting (contiguous, of the broadcast shape).
    fn broadcast2(
        &self,
        op: &'static str,
        b: &Tensor,
        dt: DType,
        cpu: impl FnOnce(&CpuData, &Layout, &CpuData, &Layout) -> Result<CpuData>,
        cuda: impl FnOnce(&CudaStorage, &Layout, &CudaStorage, &Layout) -> Result<CudaStorage>,
    ) -> Result<Tensor> {
        let shape = broadcast_shapes(op, self.shape(), b.shape())?;
        let a = self.to_dtype(dt)?;
        let b = b.to_dtype(dt)?;
        let la = a.layout().broadcast_to(op, &shape)?;
        let lb = b.layout().broadcast_to(op, &shape)?;
        if let Some(sa) = a.cuda_storage() {
            let out = if a.same_storage(&b) {
                cuda(&sa, &la, &sa, &lb)?
            } else {
                let sb = b.cuda_storage().expect("same device checked");
                cuda(&sa, &la, &sb, &lb)?
            };
            return Ok(Tensor::from_cuda(out, &shape));
        }
        let data = a.with_cpu(|da, _| {
            if a.same_storage(&b) {
                cpu(da, &la, da, &lb)
            } else {
                b.with_cpu(|db, _| cpu(da, &la, db, &lb))?
            }
        })??;
        Ok(Tensor::from_cpu(data, &shape))
    }

    fn binary_op<O: BinaryOp>(
        &self,
        name: &'static str,
        rhs: Operand,
        op: &O,
        float_only: bool,
    ) -> Result<Tensor> {
        self.check_bool_sub::<O>(name, rhs)?;
        if let Some(out) = self.scalar_op_cuda(rhs, float_only, |a, la, s| {
            cuda_ops::binary_scalar(a, la, O::CODE, s)
        })? {
            return Ok(out);
        }
        let (b, mut dt) = self.promote_with(name, rhs)?;
        if float_only && !dt.is_float() {
            dt = DType::F32;
        }
        let out = self.broadcast2(
            name,
            &b,
            dt,
            |x, lx, y, ly| k::binary(x, lx, y, ly, op),
            |x, lx, y, ly| cuda_ops::binary(x, lx, y, ly, O::CODE),
        )?;
        // the rules read the inputs from the node (backward runs without recording);
        // only div and pow keep the output
        if matches!(name, "div" | "pow") {
            Ok(Tensor::record_inputs(out, name, &[self, &b], |y| {
                let y = y.clone();
                move |g: &Tensor, ab: &[Tensor]| grad::binary(name, &ab[0], &ab[1], Some(&y), g)
            }))
        } else {
            // a rule that captures nothing is boxed without an allocation
            macro_rules! rule {
                ($op:literal) => {
                    Tensor::record_inputs(out, name, &[self, &b], |_| {
                        |g: &Tensor, ab: &[Tensor]| grad::binary($op, &ab[0], &ab[1], None, g)
                    })
                };
            }
            Ok(match name {
                "add" => rule!("add"),
                "sub" => rule!("sub"),
                "mul" => rule!("mul"),
                _ => Tensor::record_inputs(out, name, &[self, &b], |_| {
                    move |g: &Tensor, ab: &[Tensor]| grad::binary(name, &ab[0], &ab[1], None, g)
                }),
            })
        }
    }

    /// PyTorch's rule: `-` between two bools (tensors or a scalar) is an error.
    fn check_bool_sub<O: BinaryOp>(&self, name: &'static str, rhs: Operand) -> Result<()> {
        let rhs_bool = match rhs {
            Operand::Tensor(t) => t.dtype() == DType::Bool,
            Operand::Scalar(s) => matches!(s, Scalar::Bool(_)),
        };
        if O::CODE == ops::BinaryCode::Sub && self.dtype() == DType::Bool && rhs_bool {
            return Err(Error::dtype(
                name,
                DType::Bool,
                "subtracting bools is not supported: to invert a mask use logical_not(), \
                 for where two masks differ logical_xor()",
            ));
        }
        Ok(())
    }

    /// In place: `self = self op rhs`, where `rhs` broadcasts to `self`'s shape and the
    /// result dtype can be cast to `self`'s.
    fn binary_inplace<O: BinaryOp>(
        &self,
        name: &'static str,
        rhs: Operand,
        op: &O,
        float_only: bool,
    ) -> Result<()> {
        self.check_inplace_grad(name, rhs)?;
        self.check_bool_sub::<O>(name, rhs)?;
        if let (Operand::Scalar(s), true) = (rhs, self.is_cuda()) {
            if self.scalar_dtype(s, float_only) == self.dtype() {
                // the scalar goes to the kernel by value: one launch, no 0-d tensor
                self.check_writable(name)?;
                let guard = self.write();
                let Storage::Cuda(dst) = &*guard else {
                    unreachable!("a CUDA tensor")
                };
                return cuda_ops::binary_scalar_inplace(dst, self.layout(), O::CODE, s.by_value());
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
        if dt != self.dtype() {
            let out = self.binary_op(name, Operand::Tensor(&b), op, float_only)?;
            return self.copy_(&out);
        }
        // in the result dtype; a snapshot when reading and writing the same storage
        let b = b.to_dtype(dt)?;
        let b = if b.same_storage(self) { b.copy()? } else { b };
        let lb = b.layout().broadcast_to(name, self.shape())?;
        if let Some(sb) = b.cuda_storage() {
            let guard = self.write();
            let Storage::Cuda(dst) = &*guard else {
                unreachable!("same device checked")
            };
            return cuda_ops::binary_inplace(dst, self.layout(), &sb, &lb, O::CODE);
        }
        let mut guard = self.write();
        let Storage::Cpu(dst) = &mut *guard else {
            unreachable!("same device checked")
        };
        b.with_cpu(|db, _| k::binary_inplace(dst.data_mut(), self.layout(), db, &lb, op))
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

    /// In-place ops are not recorded: refuse them where a gradient would be lost.
    pub(crate) fn check_inplace_grad(&self, op: &'static str, rhs: Operand) -> Result<()> {
        let rhs_grad = matches!(rhs, Operand::Tensor(t) if t.requires_grad());
        if crate::autograd::is_grad_enabled() && (self.requires_grad() || rhs_grad) {
            return Err(Error::invalid(
                op,
                "a tensor that requires grad is being used in an in-place operation; wrap the update in ember::no_grad(|| ...) or use the out-of-place op",
            ));
        }
        Ok(())
    }

    pub(crate) fn check_writable(&self, op: &'static str) -> Result<()> {
        if k::is_overlapping(self.layout()) {
            return Err(Error::invalid(
                op,
                "more than one element of the written-to tensor refers to a single memory location (an expanded view); call .contiguous() first",
            ));
        }
        Ok(())
    }

    /// Copies `src` (broadcast to this shape, converted to this dtype) into this
    /// tensor's elements, through views too (`Tensor.copy_`).
    pub fn copy_(&self, src: &Tensor) -> Result<()> {
        super::same_device("copy_", &[self, src])?;
        self.check_inplace_grad("copy_", Operand::Tensor(src))?;
        self.check_writable("copy_")?;
        let src = src.to_dtype(self.dtype())?;
        let src = if src.same_storage(self) {
            src.copy()?
        } else {
            src
        };
        let ls = src.layout().broadcast_to("copy_", self.shape())?;
        if let Some(ss) = src.cuda_storage() {
            let guard = self.write();
            let Storage::Cuda(dst) = &*guard else {
                unreachable!("same device checked")
            };
            return cuda_ops::copy(&ss, &ls, dst, self.layout());
        }
        let mut guard = self.write();
        let Storage::Cpu(dst) = &mut *guard else {
            unreachable!("same device checked")
        };
        src.with_cpu(|ds, _| k::copy_strided(dst.data_mut(), self.layout(), ds, &ls))
    }

    fn unary_op<O: UnaryOp>(
        &self,
        name: &'static str,
        op: &O,
        rule: grad::Unary,
    ) -> Result<Tensor> {
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
        let out = match t.cuda_storage() {
            Some(st) => {
                let (code, p0, p1) = op.code();
                Tensor::from_cuda(cuda_ops::unary(&st, t.layout(), code, p0, p1)?, t.shape())
            }
            None => Tensor::from_cpu(t.with_cpu(|d, l| k::unary(d, l, op))??, t.shape()),
        };
        Ok(Tensor::record(out, name, &[self], |y| {
            let (x, y) = (t.detach(), y.clone());
            move |g: &Tensor| Ok(vec![Some(rule.backward(&x, &y, g)?)])
        }))
    }

    fn compare(&self, name: &'static str, rhs: Operand, cmp: CmpOp) -> Result<Tensor> {
        let code = cmp as i32;
        if let Some(out) = self.scalar_op_cuda(rhs, false, |a, la, s| {
            cuda_ops::compare_scalar(a, la, code, s)
        })? {
            return Ok(out);
        }
        let (b, dt) = self.promote_with(name, rhs)?;
        self.broadcast2(
            name,
            &b,
            dt,
            |a, la, b, lb| k::compare(a, la, b, lb, cmp),
            |a, la, b, lb| cuda_ops::compare(a, la, b, lb, cmp as i32),
        )
    }
}

macro_rules! binary_methods {
    ($($(#[$doc:meta])* $name:ident, $inplace:ident, $op:expr, $float_only:expr;)*) => {$(
        impl Tensor {
            $(#[$doc])*
            pub fn $name<'a>(&self, rhs: impl Into<Operand<'a>>) -> Result<Tensor> {
                self.binary_op(stringify!($name), rhs.into(), &$op, $float_only)
            }
            #[doc = concat!("In-place `", stringify!($name), "`: writes the result into this tensor's elements.")]
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
    /// `self ^ exponent` for a tensor or scalar exponent (`torch.pow`).
    pub fn pow<'a>(&self, exponent: impl Into<Operand<'a>>) -> Result<Tensor> {
        match exponent.into() {
            Operand::Scalar(s) => {
                if let (Scalar::Int(e), false) = (s, self.dtype().is_float()) {
                    if e < 0 {
                        return Err(Error::invalid(
                            "pow",
                            "integers to negative integer powers are not allowed",
                        ));
                    }
                }
                let t = if matches!(s, Scalar::Float(_)) && !self.dtype().is_float() {
                    self.to_dtype(DType::F32)?
                } else {
                    self.clone()
                };
                t.unary_op(
                    "pow",
                    &ops::PowScalar(s.to_f64()),
                    grad::Unary::Pow(s.to_f64()),
                )
            }
            rhs => self.binary_op("pow", rhs, &ops::Pow, false),
        }
    }

    /// Clamps into `[min, max]` (either bound optional); NaN stays NaN. A fractional
    /// bound on an integer tensor gives float32, as in PyTorch.
    pub fn clamp(&self, min: Option<f64>, max: Option<f64>) -> Result<Tensor> {
        if min.is_none() && max.is_none() {
            return Err(Error::invalid(
                "clamp",
                "at least one of 'min' or 'max' must not be None",
            ));
        }
        let fractional = [min, max].iter().flatten().any(|b| b.fract() != 0.0);
        let t = if fractional && !self.dtype().is_float() {
            self.to_dtype(DType::F32)?
        } else {
            self.clone()
        };
        t.unary_op("clamp", &ops::Clamp(min, max), grad::Unary::Clamp(min, max))
    }

    /// `clamp(min, None)`.
    pub fn clamp_min(&self, min: f64) -> Result<Tensor> {
        self.clamp(Some(min), None)
    }

    /// `clamp(None, max)`.
    pub fn clamp_max(&self, max: f64) -> Result<Tensor> {
        self.clamp(None, Some(max))
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
        let out = if let Some(sc) = self.cuda_storage() {
            let (sx, sy) = (x.cuda_storage(), y.cuda_storage());
            let (sx, sy) = (sx.expect("same device"), sy.expect("same device"));
            Tensor::from_cuda(cuda_ops::where_(&sc, &lc, &sx, &lx, &sy, &ly)?, &shape)
        } else {
            let data = self.with_cpu(|c, _| {
                let CpuData::Bool(c) = c else {
                    unreachable!("checked bool above")
                };
                x.with_cpu(|dx, _| y.with_cpu(|dy, _| k::where_(c, &lc, dx, &lx, dy, &ly)))
            })????;
            Tensor::from_cpu(data, &shape)
        };
        Ok(Tensor::record(out, OP, &[&x, &y], |_| {
            let cond = self.detach();
            let (sx, sy) = (x.shape().to_vec(), y.shape().to_vec());
            move |g: &Tensor| {
                let gx = crate::autograd::sum_to(&cond.where_(g, 0.0)?, &sx)?;
                let gy = crate::autograd::sum_to(&cond.where_(0.0, g)?, &sy)?;
                Ok(vec![Some(gx), Some(gy)])
            }
        }))
    }

    /// `value` where `mask` is true, else this tensor's elements (`masked_fill`).
    /// The mask broadcasts to this tensor's shape; the dtype stays this tensor's.
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
        mask.layout().broadcast_to("masked_fill", self.shape())?;
        let v = scalar_tensor(value, self.dtype(), self.device())?;
        let out = mask.where_(&v, self)?;
        Ok(out)
    }
}
