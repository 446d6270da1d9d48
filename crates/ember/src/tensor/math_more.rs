//! Elementwise functions composed from the primitives (autograd follows from
//! theirs): `logit`, `logaddexp`, `logaddexp2`, `exp2`, `frac`, `fmax`/`fmin`,
//! `copysign`, `float_power`, `deg2rad`/`rad2deg`, `sinc`, `isclose` and
//! `equal`, and PyTorch's alias names of existing ops (`clip`, `absolute`,
//! `multiply`, `greater`, ...).

use super::elementwise::{not_implemented_for, torch_dtype_name};
use super::{Operand, Scalar, Tensor};
use crate::{
    dtype::DType,
    error::{Error, Result},
};

impl Tensor {
    /// This tensor, with integers and bools converted to float32 (PyTorch's
    /// promotion of a unary float op).
    fn float_promoted(&self) -> Result<Tensor> {
        if self.dtype().is_float() {
            Ok(self.clone())
        } else {
            self.to_dtype(DType::F32)
        }
    }

    /// `other` as a tensor on this tensor's device, in this tensor's dtype
    /// where it is a number.
    fn operand_tensor(&self, other: Operand) -> Result<Tensor> {
        match other {
            Operand::Tensor(t) => Ok(t.clone()),
            Operand::Scalar(s) => Tensor::full_scalar(&[], s, self.dtype(), self.device()),
        }
    }

    /// `log(x / (1 - x))` (`torch.logit`), with `x` first clamped into
    /// `[eps, 1 - eps]` when `eps` is given (the gradient is then 0 outside
    /// that range). Integers and bools give float32.
    ///
    /// ```
    /// # use ember::{Device, Tensor};
    /// let p = Tensor::new(&[0.5f64, 0.0], &Device::Cpu)?;
    /// assert_eq!(p.logit(None)?.to_vec::<f64>()?, vec![0.0, f64::NEG_INFINITY]);
    /// let l = p.logit(Some(1e-6))?.to_vec::<f64>()?;
    /// assert!((l[1] - (1e-6f64 / (1.0 - 1e-6)).ln()).abs() < 1e-9);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn logit(&self, eps: Option<f64>) -> Result<Tensor> {
        let x = self.float_promoted()?;
        let x = match eps {
            Some(e) => x.clamp(Some(e), Some(1.0 - e))?,
            None => x,
        };
        x.div(&x.rsub(1.0)?)?.log()
    }

    /// `log(e^self + e^other)` without overflow (`torch.logaddexp`): the
    /// larger plus `log1p(e^-|self - other|)`; equal infinities give
    /// themselves. Floating-point operands only, as in PyTorch.
    ///
    /// ```
    /// # use ember::{Device, Tensor};
    /// let a = Tensor::new(&[1000.0f64, f64::NEG_INFINITY], &Device::Cpu)?;
    /// let y = a.logaddexp(&a)?.to_vec::<f64>()?;
    /// assert_eq!(y, vec![1000.0 + 2f64.ln(), f64::NEG_INFINITY]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn logaddexp<'a>(&self, other: impl Into<Operand<'a>>) -> Result<Tensor> {
        self.log_add("logaddexp", other.into(), false)
    }

    /// `log2(2^self + 2^other)` without overflow (`torch.logaddexp2`).
    pub fn logaddexp2<'a>(&self, other: impl Into<Operand<'a>>) -> Result<Tensor> {
        self.log_add("logaddexp2", other.into(), true)
    }

    fn log_add(&self, op: &'static str, other: Operand, base2: bool) -> Result<Tensor> {
        let b = self.operand_tensor(other)?;
        for t in [self, &b] {
            if !t.dtype().is_float() {
                let kernel = if base2 {
                    "logaddexp2_cpu"
                } else {
                    "logaddexp_cpu"
                };
                return Err(not_implemented_for(op, kernel, t.dtype()));
            }
        }
        let m = self.maximum(&b)?;
        let d = self.sub(&b)?.abs()?.neg()?;
        let tail = if base2 {
            d.exp2()?.log1p()?.div(std::f64::consts::LN_2)?
        } else {
            d.exp()?.log1p()?
        };
        // inf - inf is NaN in `d`: equal infinities are their own result
        let same_inf = self.eq(&b)?.logical_and(&self.isinf()?)?;
        same_inf.where_(self, &m.add(&tail)?)
    }

    /// `2^x` (`torch.exp2`); integers and bools give float32.
    pub fn exp2(&self) -> Result<Tensor> {
        let x = self.float_promoted()?;
        x.full_like(2.0)?.pow(&x)
    }

    /// The fractional part `x - trunc(x)`, with `x`'s sign (`torch.frac`);
    /// floating-point dtypes only, as in PyTorch. The gradient is 1.
    pub fn frac(&self) -> Result<Tensor> {
        if !self.dtype().is_float() {
            return Err(not_implemented_for("frac", "frac_cpu", self.dtype()));
        }
        self.sub(&self.trunc()?)
    }

    /// The elementwise maximum where a NaN loses to a number (`torch.fmax`;
    /// [`maximum`](Self::maximum) propagates NaN). Ties share the gradient,
    /// as in PyTorch.
    pub fn fmax<'a>(&self, other: impl Into<Operand<'a>>) -> Result<Tensor> {
        let b = self.operand_tensor(other.into())?;
        self.nan_ignoring(&b, &self.maximum(&b)?)
    }

    /// `both` (the NaN-propagating result) where neither is NaN, else the
    /// operand that is not NaN (`self` where both are).
    fn nan_ignoring(&self, b: &Tensor, both: &Tensor) -> Result<Tensor> {
        let inner = self.isnan()?.where_(b, both)?;
        b.isnan()?.where_(self, &inner)
    }

    /// The elementwise minimum where a NaN loses to a number (`torch.fmin`).
    pub fn fmin<'a>(&self, other: impl Into<Operand<'a>>) -> Result<Tensor> {
        let b = self.operand_tensor(other.into())?;
        self.nan_ignoring(&b, &self.minimum(&b)?)
    }

    /// `|self|` with the sign of `other` (`torch.copysign`), -0 counting as
    /// negative; integers and bools give float32. The gradient of `self` is
    /// `±1` (0 at 0), that of `other` 0, as in PyTorch.
    pub fn copysign<'a>(&self, other: impl Into<Operand<'a>>) -> Result<Tensor> {
        let a = self.float_promoted()?;
        let b = self.operand_tensor(other.into())?;
        // -0 is told from 0 by its reciprocal, -inf
        let negative = b.lt(0.0)?.logical_or(
            &b.eq(0.0)?
                .logical_and(&b.to_dtype(DType::F64)?.recip()?.lt(0.0)?)?,
        )?;
        let mag = a.abs()?;
        negative.where_(&mag.neg()?, &mag)
    }

    /// `self ^ exponent` in float64 whatever the dtypes (`torch.float_power`).
    pub fn float_power<'a>(&self, exponent: impl Into<Operand<'a>>) -> Result<Tensor> {
        let x = self.to_dtype(DType::F64)?;
        match exponent.into() {
            Operand::Tensor(e) => x.pow(&e.to_dtype(DType::F64)?),
            Operand::Scalar(s) => x.pow(s.to_f64()),
        }
    }

    /// Degrees to radians, `x · π/180` (`torch.deg2rad`); integers give
    /// float32.
    pub fn deg2rad(&self) -> Result<Tensor> {
        self.float_promoted()?.mul(std::f64::consts::PI / 180.0)
    }

    /// Radians to degrees, `x · 180/π` (`torch.rad2deg`); integers give
    /// float32.
    pub fn rad2deg(&self) -> Result<Tensor> {
        self.float_promoted()?.mul(180.0 / std::f64::consts::PI)
    }

    /// The normalised sinc, `sin(πx) / (πx)` and 1 at 0 (`torch.sinc`);
    /// integers give float32. The gradient at 0 is 0.
    pub fn sinc(&self) -> Result<Tensor> {
        let x = self.float_promoted()?;
        let zero = x.eq(0.0)?;
        // 1 in place of 0 inside, so that the unused branch's gradient is
        // finite there
        let px = zero.where_(1.0, &x.mul(std::f64::consts::PI)?)?;
        zero.where_(1.0, &px.sin()?.div(&px)?)
    }

    /// Whether each `|self - other| <= atol + rtol · |other|`, or the two are
    /// equal (infinities only to the same one; NaN to NaN when `equal_nan`),
    /// as a bool tensor (`torch.isclose`). The dtypes must match, as in
    /// PyTorch; negative tolerances are an error. [`allclose`](Self::allclose)
    /// is this over every element.
    ///
    /// ```
    /// # use ember::{Device, Tensor};
    /// let a = Tensor::new(&[1.0f32, f32::NAN, 2.0], &Device::Cpu)?;
    /// let b = Tensor::new(&[1.0f32 + 1e-7, f32::NAN, 2.1], &Device::Cpu)?;
    /// let c = a.isclose(&b, 1e-5, 1e-8, true)?;
    /// assert_eq!(c.to_vec::<bool>()?, vec![true, true, false]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn isclose(&self, other: &Tensor, rtol: f64, atol: f64, equal_nan: bool) -> Result<Tensor> {
        if self.dtype() != other.dtype() {
            return Err(Error::dtype(
                "isclose",
                other.dtype(),
                format!(
                    "{} did not match {}",
                    torch_dtype_name(self.dtype()),
                    torch_dtype_name(other.dtype())
                ),
            ));
        }
        check_tolerances("isclose", rtol, atol)?;
        let _ng = crate::autograd::no_grad_guard();
        // integers are compared in float64, where their differences are exact
        // enough and cannot wrap
        let (a, b) = match self.dtype().is_float() {
            true => (self.clone(), other.clone()),
            false => (self.to_dtype(DType::F64)?, other.to_dtype(DType::F64)?),
        };
        close_mask(&a, &b, rtol, atol, equal_nan)
    }

    /// Whether the two tensors have one shape and equal elements
    /// (`torch.equal`; NaN is not equal to itself). Values of different
    /// dtypes are compared after promotion, as PyTorch does.
    pub fn equal(&self, other: &Tensor) -> Result<bool> {
        if self.shape() != other.shape() {
            return Ok(false);
        }
        let _ng = crate::autograd::no_grad_guard();
        let same = self
            .eq(other)?
            .logical_not()?
            .to_dtype(DType::I64)?
            .sum_all()?;
        Ok(same.item::<i64>()? == 0)
    }
}

/// PyTorch's check of `isclose`'s and `allclose`'s tolerances.
pub(super) fn check_tolerances(op: &'static str, rtol: f64, atol: f64) -> Result<()> {
    for (name, v) in [("rtol", rtol), ("atol", atol)] {
        if v.is_nan() || v < 0.0 {
            return Err(Error::invalid(
                op,
                format!("{name} must be greater than or equal to zero, but got {v}"),
            ));
        }
    }
    Ok(())
}

/// Where `a` and `b` (one float dtype) are close: `|a - b| <= atol + rtol ·
/// |b|` with a finite difference (1 and ∞, or ∞ and -∞, are not close), or
/// equal, or both NaN when `equal_nan`.
pub(super) fn close_mask(
    a: &Tensor,
    b: &Tensor,
    rtol: f64,
    atol: f64,
    equal_nan: bool,
) -> Result<Tensor> {
    let diff = a.sub(b)?.abs()?;
    let tol = b.abs()?.mul(rtol)?.add(atol)?;
    let close = diff
        .le(&tol)?
        .logical_and(&diff.isfinite()?)?
        .logical_or(&a.eq(b)?)?;
    if equal_nan {
        close.logical_or(&a.isnan()?.logical_and(&b.isnan()?)?)
    } else {
        Ok(close)
    }
}

macro_rules! aliases {
    ($($(#[$doc:meta])* $alias:ident => $name:ident;)*) => {$(
        impl Tensor {
            $(#[$doc])*
            pub fn $alias<'a>(&self, other: impl Into<Operand<'a>>) -> Result<Tensor> {
                self.$name(other)
            }
        }
    )*};
}

aliases! {
    /// [`mul`](Self::mul) by PyTorch's other name (`torch.multiply`).
    multiply => mul;
    /// [`sub`](Self::sub) by PyTorch's other name (`torch.subtract`).
    subtract => sub;
    /// [`div`](Self::div) by PyTorch's other name (`torch.divide`).
    divide => div;
    /// [`div`](Self::div) by PyTorch's other name (`torch.true_divide`).
    true_divide => div;
    /// [`gt`](Self::gt) by PyTorch's other name (`torch.greater`).
    greater => gt;
    /// [`ge`](Self::ge) by PyTorch's other name (`torch.greater_equal`).
    greater_equal => ge;
    /// [`lt`](Self::lt) by PyTorch's other name (`torch.less`).
    less => lt;
    /// [`le`](Self::le) by PyTorch's other name (`torch.less_equal`).
    less_equal => le;
    /// [`ne`](Self::ne) by PyTorch's other name (`torch.not_equal`).
    not_equal => ne;
}

impl Tensor {
    /// [`abs`](Self::abs) by PyTorch's other name (`torch.absolute`).
    pub fn absolute(&self) -> Result<Tensor> {
        self.abs()
    }

    /// [`neg`](Self::neg) by PyTorch's other name (`torch.negative`).
    pub fn negative(&self) -> Result<Tensor> {
        self.neg()
    }

    /// [`clamp`](Self::clamp) by PyTorch's other name (`torch.clip`).
    pub fn clip<S: Into<Scalar>>(&self, min: Option<S>, max: Option<S>) -> Result<Tensor> {
        self.clamp(min, max)
    }
}
