//! Elementwise functions built from the primitives and the method tables:
//! rounding to decimals, sign and classification (`isnan`, `isinf`,
//! `isfinite`), `nan_to_num`, softplus, ELU, CELU, leaky ReLU and hardtanh
//! (relu6), reversed scalar ops, `pow`, and `clamp` with scalar or tensor bounds.

use super::elementwise::{check_bool_sub, not_implemented_for, scalar_tensor};
use super::{grad, Operand, Tensor};
use crate::backend::op::{self as ops, Scalar};
use crate::layout::broadcast_shapes;
use crate::{
    dtype::DType,
    error::{Error, Result},
};

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
            return Err(not_implemented_for("round", kernel, dt));
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
            return crate::autograd::no_grad(|| self.copy());
        }
        self.unary_op("sign", &ops::Sign, grad::Unary::Zero)
    }

    /// `self · log(other)`, and 0 where `self` is 0 (`torch.xlogy`, the
    /// `x log x` of entropies and of `kl_div`): NaN where `other` is NaN, else 0
    /// where `self` is 0 (even at `other` 0 or negative), else `self ·
    /// log(other)`. The operands broadcast and promote as for a binary op
    /// (`other` a tensor, a CPU scalar, or a number); integers and bools give
    /// float32. Float16 and bfloat16 are computed in float32 and rounded once, as
    /// PyTorch's kernel computes them.
    ///
    /// Autograd: PyTorch's rules, `g · xlogy(self ≠ 0, other)` for `self`
    /// (0 where `self` is 0) and `g · self / other` for `other` (NaN at `self` =
    /// `other` = 0).
    ///
    /// ```
    /// # use ember::{Device, Tensor};
    /// let p = Tensor::new(&[0.0f32, 0.5, 1.0], &Device::Cpu)?;
    /// let h = p.xlogy(&p)?.neg()?; // -p log p, 0 at p = 0
    /// assert_eq!(h.to_vec::<f32>()?, vec![0.0, 0.5 * 2f32.ln(), 0.0]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn xlogy<'a>(&self, other: impl Into<Operand<'a>>) -> Result<Tensor> {
        const OP: &str = "xlogy";
        let y = match other.into() {
            Operand::Tensor(t) => t.clone(),
            Operand::Scalar(s) => scalar_tensor(s, self.scalar_dtype(s, true), self.device())?,
        };
        let dev = super::elementwise::elementwise_device(OP, &[self, &y])?;
        broadcast_shapes(OP, self.shape(), y.shape())?;
        let dt = self.result_dtype(&y, true);
        let work = if matches!(dt, DType::F16 | DType::BF16) {
            DType::F32
        } else {
            dt
        };
        let out = crate::autograd::no_grad(|| {
            let x = self.to(&dev)?.to_dtype(work)?;
            let v = y.to(&dev)?.to_dtype(work)?;
            let zero = x.eq(0.0)?.logical_and(&v.isnan()?.logical_not()?)?;
            zero.where_(0.0, &x.mul(&v.log()?)?)?.to_dtype(dt)
        })?;
        Ok(Tensor::record_twice(out, OP, &[self, &y], |_| {
            let (x, v) = (self.save(), y.save());
            move |g: &Tensor| {
                let (x, v) = (x.value()?, v.value()?);
                let (xd, vd) = (x.to(&g.device())?, v.to(&g.device())?);
                let keep = xd.ne(0.0)?.logical_or(&vd.isnan()?)?;
                let gx = g.mul(&keep.where_(&vd.log()?, 0.0)?)?;
                let gy = g.mul(&xd)?.div(&vd)?;
                let to = |g: Tensor, t: &Tensor| -> Result<Option<Tensor>> {
                    Ok(Some(
                        crate::autograd::sum_to(&g, t.shape())?.to_dtype(t.dtype())?,
                    ))
                };
                Ok(vec![to(gx, &x)?, to(gy, &v)?])
            }
        }))
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
        let op = ops::Elu {
            alpha,
            input_scale: 1.0,
        };
        self.unary_op("elu", &op, grad::Unary::Elu(alpha, 1.0))
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

    /// CELU: `x` where `x > 0`, else `alpha · (e^(x/alpha) - 1)` (`F.celu`,
    /// default `alpha = 1`). Floating-point only; `alpha = 0` is refused, as in
    /// PyTorch.
    pub fn celu(&self, alpha: f64) -> Result<Tensor> {
        check_celu_alpha("celu", alpha)?;
        let (op, rule) = celu_op(alpha);
        self.unary_op("celu", &op, rule)
    }

    /// In-place [`celu`](Self::celu) (`F.celu(x, alpha, inplace=True)`), recorded
    /// as the other in-place activations are (a copy of the old values kept for
    /// the rule).
    pub fn celu_(&self, alpha: f64) -> Result<()> {
        check_celu_alpha("celu_", alpha)?;
        let (op, rule) = celu_op(alpha);
        self.unary_inplace("celu_", &op, rule)
    }

    /// `min` below `min`, `max` above `max`, `x` between (`F.hardtanh`;
    /// PyTorch's defaults are -1 and 1). The values are `clamp`'s, in the
    /// input's dtype: an integer tensor stays integer, its bounds truncated
    /// toward zero as PyTorch converts them; a NaN bound makes every element
    /// NaN. The gradient is PyTorch's `hardtanh_backward`: it passes strictly
    /// inside `(min, max)` and at NaN, and is 0 at and beyond the bounds. A
    /// bool tensor and `min > max` are refused, as in PyTorch.
    ///
    /// ```
    /// # use ember::{Device, Tensor};
    /// let x = Tensor::new(&[-2.0f32, -0.5, 0.5, 3.0], &Device::Cpu)?;
    /// assert_eq!(x.hardtanh(-1.0, 1.0)?.to_vec::<f32>()?, vec![-1.0, -0.5, 0.5, 1.0]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn hardtanh(&self, min: f64, max: f64) -> Result<Tensor> {
        self.hardtanh_named("hardtanh", min, max)
    }

    /// In-place [`hardtanh`](Self::hardtanh) (`F.hardtanh(x, min, max,
    /// inplace=True)`); the rule reads a copy of the old values.
    pub fn hardtanh_(&self, min: f64, max: f64) -> Result<()> {
        let (op, rule) = self.hardtanh_op("hardtanh_", min, max)?;
        if min.is_nan() || max.is_nan() {
            // (clamp's kernel reads a NaN bound as no bound)
            return self.write_from("hardtanh_", false, true, |t| {
                t.hardtanh_named("hardtanh_", min, max)
            });
        }
        self.unary_inplace("hardtanh_", &op, rule)
    }

    /// `min(max(x, 0), 6)` (`F.relu6`, MobileNetV2's activation): `hardtanh(0,
    /// 6)`, with its gradient (0 at 0 and at 6) and its dtypes.
    pub fn relu6(&self) -> Result<Tensor> {
        self.hardtanh_named("relu6", 0.0, 6.0)
    }

    /// In-place [`relu6`](Self::relu6) (`F.relu6(x, inplace=True)`).
    pub fn relu6_(&self) -> Result<()> {
        let (op, rule) = self.hardtanh_op("relu6_", 0.0, 6.0)?;
        self.unary_inplace("relu6_", &op, rule)
    }

    fn hardtanh_named(&self, name: &'static str, min: f64, max: f64) -> Result<Tensor> {
        let (op, rule) = self.hardtanh_op(name, min, max)?;
        if min.is_nan() || max.is_nan() {
            // every element NaN (clamp's kernel reads a NaN bound as no bound);
            // the gradient is the rule's, which passes everywhere
            let out = crate::autograd::no_grad(|| self.full_like(f64::NAN))?;
            return Ok(Tensor::record_twice(out, name, &[self], |_| {
                let x = self.save();
                move |g: &Tensor| Ok(vec![Some(rule.backward(Some(&x.value()?), None, g)?)])
            }));
        }
        self.unary_op(name, &op, rule)
    }

    /// hardtanh's clamp and rule in this tensor's dtype, after PyTorch's
    /// refusals (bool, `min > max`).
    fn hardtanh_op(
        &self,
        name: &'static str,
        min: f64,
        max: f64,
    ) -> Result<(ops::Clamp, grad::Unary)> {
        if self.dtype() == DType::Bool {
            return Err(Error::dtype(
                name,
                DType::Bool,
                "Bool inputs not supported for hardtanh",
            ));
        }
        if min > max {
            return Err(Error::invalid(
                name,
                format!("min_val cannot be greater than max_val (got {min} and {max})"),
            ));
        }
        // an integer tensor's bounds are converted to its dtype (truncated)
        let (lo, hi) = if self.dtype().is_float() {
            (min, max)
        } else {
            (min.trunc(), max.trunc())
        };
        Ok((
            ops::Clamp(Some(lo), Some(hi)),
            grad::Unary::Hardtanh(min, max),
        ))
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
        // the scalar in the result's dtype (PyTorch rounds it to float16 or
        // bfloat16 there too), then a tensor subtraction
        scalar_tensor(s, dt, self.device())?.sub(self)
    }

    /// `scalar / self`, true division (Python's `2 / t`), as PyTorch's operator
    /// computes it: `self.recip() * scalar`, so the quotient is rounded
    /// twice and can differ from a correctly rounded quotient in the last bit. Integers and bools give float32, as in PyTorch. The operators
    /// `1.0 / &t` and `2 / &t` panic where this returns the error.
    pub fn rdiv(&self, scalar: impl Into<Scalar>) -> Result<Tensor> {
        self.recip()?.mul(scalar.into())
    }

    /// `self ^ exponent` for a tensor or scalar exponent (`torch.pow`). A scalar
    /// exponent of 0.5 or -0.5 is `sqrt` or `1 / sqrt`, as PyTorch's kernels
    /// compute it (so `(-0.0).pow(-0.5)` is -inf), but for float16 on the CPU,
    /// where PyTorch's kernel uses `pow` (`(-0.0).pow(-0.5)` is inf there, and
    /// `(-inf).pow(0.5)` inf).
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
                let plain = t.dtype() == DType::F16 && t.device().is_cpu();
                t.unary_op(
                    "pow",
                    &ops::PowScalar(s.to_f64(), plain),
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

    /// Limits every element to `[min, max]` (`torch.clamp`); NaN stays NaN, and
    /// a NaN bound makes every element NaN. The
    /// bounds are Python-style scalars: an integer tensor clamped by float bounds
    /// (`Some(3.0)`) is computed in float32, by integer bounds (`Some(3)`) in its
    /// own dtype, as in PyTorch. A uint8 `min` above 255 or `max` below 0 is an
    /// error. Give `None` a type when both are `None`: `clamp::<f64>(None, None)`
    /// (an error, as in PyTorch).
    pub fn clamp<S: Into<Scalar>>(&self, min: Option<S>, max: Option<S>) -> Result<Tensor> {
        let (min, max) = (min.map(Into::into), max.map(Into::into));
        let dt = self.clamp_dtype("clamp", min, max)?;
        let bounds = [min, max];
        let t = if dt == self.dtype() {
            self.clone()
        } else {
            self.to_dtype(dt)?
        };
        // a NaN bound makes every element NaN (PyTorch's), and the gradient 0
        // (not 0·g, which is NaN where g is infinite)
        if bounds
            .iter()
            .flatten()
            .any(|b| matches!(b, Scalar::Float(v) if v.is_nan()))
        {
            let out = crate::autograd::no_grad(|| t.full_like(f64::NAN))?;
            return Ok(Tensor::record_twice(out, "clamp", &[&t], |_| {
                |g: &Tensor| Ok(vec![Some(g.zeros_like()?)])
            }));
        }
        if wide_int_bound(dt, &bounds) {
            // exact int64 bounds: the kernel's f64 would round them
            let dev = t.device();
            let s = |b: Option<Scalar>| b.map(|b| Tensor::scalar(b.by_value().1, &dev)).transpose();
            return t.clamp_tensor(s(min)?.as_ref(), s(max)?.as_ref());
        }
        let f = |b: Option<Scalar>| b.map(|b| b.by_value().0);
        let (min, max) = (f(min), f(max));
        t.unary_op("clamp", &ops::Clamp(min, max), grad::Unary::Clamp(min, max))
    }

    /// The dtype `clamp` computes in with these scalar bounds (float bounds make
    /// an integer tensor float32, a bool one is clamped as int64), after
    /// PyTorch's refusals: no bound at all, or a uint8 bound no uint8 reaches.
    pub(super) fn clamp_dtype(
        &self,
        op: &'static str,
        min: Option<Scalar>,
        max: Option<Scalar>,
    ) -> Result<DType> {
        if min.is_none() && max.is_none() {
            return Err(Error::invalid(
                op,
                "at least one of 'min' or 'max' must not be None",
            ));
        }
        let float = [min, max]
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
                            op,
                            format!("Clamp {which} value {v} is outside the representable range of Byte"),
                        ));
                    }
                }
            }
        }
        Ok(dt)
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
        // (a CPU scalar is a device mismatch here, as in PyTorch's CUDA clamp)
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
        let out = crate::autograd::no_grad(|| -> Result<Tensor> {
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
        Ok(Tensor::record_twice(out, OP, &inputs, |_| {
            let wants: Vec<bool> = inputs.iter().map(|t| t.requires_grad()).collect();
            let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
            let saved: Vec<_> = inputs.iter().map(|t| t.save()).collect();
            move |g: &Tensor| {
                let x = &saved[0].value()?;
                let lo = has_lo.then(|| saved[1].value()).transpose()?;
                let hi = has_hi.then(|| saved[saved.len() - 1].value()).transpose()?;
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
                match (lo.as_ref(), hi.as_ref()) {
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
}

/// Whether clamping in `dt` by `bounds` needs them exact as int64: an integer
/// bound of an int64 clamp past 2^53, which f64 (the elementwise kernel's
/// parameter) does not hold exactly.
pub(super) fn wide_int_bound(dt: DType, bounds: &[Option<Scalar>]) -> bool {
    dt == DType::I64
        && bounds
            .iter()
            .flatten()
            .any(|b| matches!(b, Scalar::Int(v) if v.unsigned_abs() > 1 << 53))
}

/// PyTorch's refusal of CELU's `alpha = 0` (its `1/alpha` would divide by 0).
/// CELU as PyTorch runs it: ELU with the input scaled by `1/α`.
fn celu_op(alpha: f64) -> (ops::Elu, grad::Unary) {
    let s = 1.0 / alpha;
    let op = ops::Elu {
        alpha,
        input_scale: s,
    };
    (op, grad::Unary::Elu(alpha, s))
}

fn check_celu_alpha(op: &'static str, alpha: f64) -> Result<()> {
    if alpha == 0.0 {
        return Err(Error::invalid(
            op,
            "ZeroDivisionError: alpha cannot be 0 for CELU",
        ));
    }
    Ok(())
}
