//! Gradient rules of the elementwise ops, in terms of tensor ops. Each takes the
//! saved inputs `x` (and `a`, `b`), the saved output `y` and the output's gradient `g`.

use super::Tensor;
use crate::autograd::{sum_to, Grads, Inputs, Saved};
use crate::backend::op::{self as ops, BinaryCode};
use crate::{dtype::DType, error::Result};

/// The derivative of each one-input elementwise op.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Unary {
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Tanh,
    Sin,
    Cos,
    Recip,
    Square,
    Relu,
    Sigmoid,
    Erf,
    Gelu,
    GeluTanh,
    Pow(f64),
    Clamp(Option<f64>, Option<f64>),
    Silu,
    Softplus(f64, f64),
    /// `α` and the input's scale `s` (`F.celu`: `1/α`).
    Elu(f64, f64),
    LeakyRelu(f64),
    Log1p,
    Expm1,
    Rsqrt,
    Log2,
    Tan,
    Atan,
    Hardsigmoid,
    Hardswish,
    Log10,
    Selu,
    Mish,
    /// `hardtanh(min, max)`: the gradient passes where `min < x < max` (and at
    /// NaN), as PyTorch's `hardtanh_backward`.
    Hardtanh(f64, f64),
    /// Rounding and sign: a zero gradient, as in PyTorch.
    Zero,
    Sinh,
    Cosh,
    Asin,
    Acos,
    Asinh,
    Acosh,
    Atanh,
    Erfc,
    Erfinv,
    Lgamma,
    Digamma,
    /// `polygamma(n, x)`: its gradient is `polygamma(n + 1, x)`.
    Polygamma(u32),
}

impl Unary {
    /// Which values the rule reads: (the input, the output). Only those are saved,
    /// so an in-place change to the other is no error (PyTorch's rule).
    pub fn saves(self) -> (bool, bool) {
        use Unary::*;
        match self {
            Neg | Zero => (false, false),
            Exp | Sqrt | Tanh | Recip | Sigmoid | Relu | Expm1 | Rsqrt | Tan | Erfinv => {
                (false, true)
            }
            _ => (true, false),
        }
    }

    /// Whether the rule is one elementwise kernel of the gradient and one saved
    /// value. The kernels widen half-precision operands to float32 and round the
    /// result once, so such a rule runs in the half dtype with the same result as
    /// through float32 copies, without them (they would cost three times the
    /// gradient's memory).
    fn one_kernel(self) -> bool {
        use Unary::*;
        matches!(self, Neg | Exp | Log | Relu | Gelu | GeluTanh | Zero)
    }

    /// The backward closure of a recorded op: `x` and `y` its input and output as
    /// kept where [`saves`](Self::saves) says the rule reads them.
    pub fn recorded(
        self,
        x: Option<Saved>,
        y: Option<Saved>,
    ) -> impl Fn(&Tensor) -> Result<Grads> + Send + Sync + 'static {
        move |g: &Tensor| {
            let x = x.as_ref().map(Saved::value).transpose()?;
            let y = y.as_ref().map(Saved::value).transpose()?;
            Ok(vec![Some(self.backward(x.as_ref(), y.as_ref(), g)?)])
        }
    }

    /// The input's gradient; `x` and `y` are the saved input and output (`None`
    /// where [`saves`](Self::saves) says the rule does not read them).
    pub fn backward(self, x: Option<&Tensor>, y: Option<&Tensor>, g: &Tensor) -> Result<Tensor> {
        let dt = g.dtype();
        // the reciprocal's rule is PyTorch's composite, `-grad * (result *
        // result)`, which rounds at each step in the half dtypes: computed in the
        // dtype, in that order, it gives PyTorch's bits
        let in_dtype = self.one_kernel() || matches!(self, Unary::Recip);
        let gx = if matches!(dt, DType::F16 | DType::BF16) && !in_dtype {
            // computed in float32 and rounded once, as PyTorch's fused backward
            // kernels do for the half dtypes (a composite in f16/bf16 would round
            // at every step)
            let up = |t: Option<&Tensor>| t.map(|t| t.to_dtype(DType::F32)).transpose();
            let (x, y) = (up(x)?, up(y)?);
            self.backward_in(x.as_ref(), y.as_ref(), &g.to_dtype(DType::F32)?)?
                .to_dtype(dt)?
        } else {
            self.backward_in(x, y, g)?
        };
        // the rules whose PyTorch backward op takes the input but reads only a
        // mask of it: tied to it, so that its gradient of the gradient is zeros
        let name = match self {
            Unary::Abs => "sgn",
            Unary::LeakyRelu(_) => "leaky_relu_backward",
            Unary::Hardtanh(..) => "hardtanh_backward",
            Unary::Hardsigmoid => "hardsigmoid_backward",
            _ => return Ok(gx),
        };
        Ok(match x {
            Some(x) => gx.tied_to(x, name),
            None => gx,
        })
    }

    fn backward_in(self, x: Option<&Tensor>, y: Option<&Tensor>, g: &Tensor) -> Result<Tensor> {
        use Unary::*;
        let missing =
            || crate::error::Error::invalid("backward", format!("{self:?}: a value was not saved"));
        let (x, y) = match self.saves() {
            (true, _) => (x.ok_or_else(missing)?, g),
            (false, true) => (g, y.ok_or_else(missing)?),
            (false, false) => (g, g),
        };
        match self {
            Neg => g.neg(),
            // sign(x), with 0 at 0 as in PyTorch
            Abs => g.mul(
                &x.gt(0.0)?
                    .to_dtype(x.dtype())?
                    .sub(&x.lt(0.0)?.to_dtype(x.dtype())?)?,
            ),
            Exp => g.mul(y),
            Log => g.div(x),
            Sqrt => g.div(&y.mul(2.0)?),
            Tanh => g.mul(&y.square()?.neg()?.add(1.0)?),
            Sin => g.mul(&x.cos()?),
            Cos => g.mul(&x.sin()?.neg()?),
            Recip => g.mul(&y.square()?.neg()?),
            Square => g.mul(&x.mul(2.0)?),
            // y > 0 exactly where x > 0 (NaN in both), and PyTorch saves the output
            Relu => g.relu_backward(y),
            Sigmoid => g.mul(&y.mul(&y.neg()?.add(1.0)?)?),
            Erf => g.mul(
                &x.square()?
                    .neg()?
                    .exp()?
                    .mul(2.0 / std::f64::consts::PI.sqrt())?,
            ),
            // Φ(x) + x φ(x), in one pass
            Gelu => g.gelu_backward(x),
            // its derivative in one pass, as PyTorch's kernel
            GeluTanh => g.gelu_tanh_backward(x),
            Pow(e) => {
                if e == 0.0 {
                    g.zeros_like()
                } else {
                    g.mul(&x.pow(e - 1.0)?.mul(e)?)
                }
            }
            Silu => {
                // s (1 + x (1 - s)) with s = sigmoid(x)
                let s = x.sigmoid()?;
                g.mul(&s.mul(&x.mul(&s.neg()?.add(1.0)?)?.add(1.0)?)?)
            }
            Softplus(beta, threshold) => {
                // sigmoid(βx) below the threshold, 1 above it
                let bx = x.mul(beta)?;
                let above = bx.gt(threshold)?;
                g.mul(&above.where_(1.0, &bx.sigmoid()?)?)
            }
            // α s e^(s x) at and below 0 (PyTorch's product of the two), else 1
            Elu(alpha, s) => {
                let e = match s == 1.0 {
                    true => x.exp()?,
                    false => x.mul(s)?.exp()?,
                };
                g.mul(&x.le(0.0)?.where_(&e.mul(alpha * s)?, 1.0)?)
            }
            LeakyRelu(slope) => g.mul(
                &x.gt(0.0)?
                    .to_dtype(x.dtype())?
                    .mul(1.0 - slope)?
                    .add(slope)?,
            ),
            Log1p => g.div(&x.add(1.0)?),
            Expm1 => g.mul(&y.add(1.0)?),
            // -1/2 · y^3
            Rsqrt => g.mul(&y.pow(3.0)?.mul(-0.5)?),
            Log2 => g.div(&x.mul(std::f64::consts::LN_2)?),
            Log10 => g.div(&x.mul(std::f64::consts::LN_10)?),
            // PyTorch's ELU backward on the input: λ above 0, λ α e^x at and
            // below it (NaN: λ)
            Selu => {
                let (alpha, scale) = (ops::SELU_ALPHA, ops::SELU_SCALE);
                let neg = x.exp()?.mul(alpha * scale)?;
                g.mul(&x.le(0.0)?.where_(&neg, scale)?)
            }
            // t + x σ(x) (1 - t²) with t = tanh(softplus(x)), as PyTorch's kernel
            Mish => {
                let t = x.exp()?.log1p()?.tanh()?;
                let d = t.square()?.neg()?.add(1.0)?.mul(&x.sigmoid()?)?.mul(x)?;
                g.mul(&t.add(&d)?)
            }
            Hardtanh(lo, hi) => {
                let out = x.le(lo)?.logical_or(&x.ge(hi)?)?;
                out.where_(0.0, g)
            }
            Tan => g.mul(&y.square()?.add(1.0)?),
            Atan => g.div(&x.square()?.add(1.0)?),
            // 1/6 strictly inside (-3, 3), else 0 (NaN: 0), as PyTorch's kernel,
            // whose 1/6 is a float32 constant in every dtype
            Hardsigmoid => g.mul(
                &x.gt(-3.0)?
                    .logical_and(&x.lt(3.0)?)?
                    .where_((1.0f32 / 6.0) as f64, 0.0)?,
            ),
            // 0 up to -3, x/3 + 1/2 below 3, then 1 (NaN: 1), as PyTorch 2.15 gives on
            // the CPU (the goldens); its older CUDA source reads -0.5 at -3 and 1.5 at 3
            Hardswish => g.mul(
                &x.le(-3.0)?
                    .where_(0.0, &x.lt(3.0)?.where_(&x.div(3.0)?.add(0.5)?, 1.0)?)?,
            ),
            Zero => g.zeros_like(),
            Sinh => g.mul(&x.cosh()?),
            Cosh => g.mul(&x.sinh()?),
            // ±1/√(1 - x²), PyTorch's `(1 - x²).rsqrt()`
            Asin => g.mul(&x.square()?.neg()?.add(1.0)?.rsqrt()?),
            Acos => g.mul(&x.square()?.neg()?.add(1.0)?.rsqrt()?.neg()?),
            Asinh => g.mul(&x.square()?.add(1.0)?.rsqrt()?),
            Acosh => g.mul(&x.square()?.sub(1.0)?.rsqrt()?),
            Atanh => g.div(&x.square()?.neg()?.add(1.0)?),
            // -2/√π e^(-x²)
            Erfc => g.mul(
                &x.square()?
                    .neg()?
                    .exp()?
                    .mul(-2.0 / std::f64::consts::PI.sqrt())?,
            ),
            // √π/2 e^(y²), y = erfinv(x) the saved output
            Erfinv => g.mul(&y.square()?.exp()?.mul(std::f64::consts::PI.sqrt() / 2.0)?),
            Lgamma => g.mul(&x.digamma()?),
            Digamma => g.mul(&x.polygamma(1)?),
            Polygamma(n) => g.mul(&x.polygamma(n as i64 + 1)?),
            Clamp(lo, hi) => {
                // PyTorch's rule: the gradient passes strictly inside the bounds
                // (`min < x < max`); at a bound, outside, at NaN (or a NaN bound) 0
                let mut keep = x.eq(x)?; // true except at NaN
                if let Some(lo) = lo {
                    keep = keep.mul(&x.gt(lo)?)?;
                }
                if let Some(hi) = hi {
                    keep = keep.mul(&x.lt(hi)?)?;
                }
                g.mul(&keep.to_dtype(g.dtype())?)
            }
        }
    }
}

/// Which operands' values [`binary`]'s rule for `op` reads, given which need a
/// gradient (PyTorch's `derivatives.yaml` choices): a sum reads neither, a
/// product the other operand of each that needs one, a quotient the divisor for
/// either and the dividend for the divisor's gradient; the others read both.
pub(crate) fn binary_reads(op: BinaryCode, needs_a: bool, needs_b: bool) -> [bool; 2] {
    match op {
        BinaryCode::Add | BinaryCode::Sub => [false, false],
        BinaryCode::Mul => [needs_b, needs_a],
        BinaryCode::Div => [needs_b, needs_a || needs_b],
        _ => [true, true],
    }
}

/// The rule of `x * s` or `x / s` for a number `s` (`div` says which): `g * s`
/// or `g / s` with the number itself, by value, so that in float16 and
/// bfloat16 it is used in float32 as in the forward (PyTorch's opmath).
pub(crate) fn by_number(
    div: bool,
    s: crate::backend::op::Scalar,
) -> impl Fn(&Tensor) -> Result<Grads> + Send + Sync + 'static {
    move |g: &Tensor| Ok(vec![Some(if div { g.div(s)? } else { g.mul(s)? })])
}

/// Gradients of a broadcasting binary op for its inputs `a` and `b` (only those
/// that need one). `y`, the output, is saved by the op whose rule uses it
/// (pow). Each rule reads only the values it needs, so an in-place change to a
/// value it does not read is no error (PyTorch's rule).
pub(crate) fn binary(op: BinaryCode, ins: &Inputs, y: Option<&Saved>, g: &Tensor) -> Result<Grads> {
    let (na, nb) = (ins.needs(0), ins.needs(1));
    let a = || ins.get(0);
    let b = || ins.get(1);
    let y = || match y {
        Some(y) => y.value(),
        None => Err(crate::error::Error::invalid(
            "backward",
            format!("{op:?}: the output was not saved"),
        )),
    };
    let to = |t: Tensor, i: usize, need: bool| -> Result<Option<Tensor>> {
        if need {
            sum_to(&t, ins.shape(i)).map(Some)
        } else {
            Ok(None)
        }
    };
    let (ga, gb) = match op {
        BinaryCode::Add => (g.clone(), g.clone()),
        BinaryCode::Sub => (g.clone(), if nb { g.neg()? } else { g.clone() }),
        BinaryCode::Mul => (
            if na { g.mul(b()?)? } else { g.clone() },
            if nb { g.mul(a()?)? } else { g.clone() },
        ),
        BinaryCode::Div => (
            if na { g.div(b()?)? } else { g.clone() },
            // -g · (a / b) / b, reading a and b as PyTorch's rule does
            if nb {
                let b = b()?;
                g.mul(&a()?.div(b)?.div(b)?)?.neg()?
            } else {
                g.clone()
            },
        ),
        BinaryCode::Maximum | BinaryCode::Minimum => {
            // PyTorch's rule: ties split the gradient evenly, and an input gets
            // nothing only where it lost the comparison, so that where either
            // is NaN (no comparison holds) both get the whole gradient
            let (a, b) = (a()?, b()?);
            let (lost_a, lost_b) = if op == BinaryCode::Maximum {
                (a.lt(b)?, a.gt(b)?)
            } else {
                (a.gt(b)?, a.lt(b)?)
            };
            let shared = a.eq(b)?.where_(&g.mul(0.5)?, g)?;
            (lost_a.where_(0.0, &shared)?, lost_b.where_(0.0, &shared)?)
        }
        // as PyTorch's rules: nothing flows where the exponent is 0 (b·a^(b-1)
        // would be 0·∞ at a = 0), nor to the exponent where a = 0 and b ≥ 0
        // (y·ln a would be 0·-∞)
        BinaryCode::Pow => (
            if na {
                let (a, b) = (a()?, b()?);
                b.eq(0.0)?
                    .where_(0.0, &g.mul(&b.mul(&a.pow(&b.sub(1.0)?)?)?)?)?
            } else {
                g.clone()
            },
            if nb {
                let (a, b) = (a()?, b()?);
                a.eq(0.0)?
                    .logical_and(&b.ge(0.0)?)?
                    .where_(0.0, &g.mul(&y()?.mul(&a.log()?)?)?)?
            } else {
                g.clone()
            },
        ),
        BinaryCode::Atan2 => {
            // (b, -a) / (a² + b²)
            let (a, b) = (a()?, b()?);
            let r = a.square()?.add(&b.square()?)?.recip()?;
            (
                if na { g.mul(&b.mul(&r)?)? } else { g.clone() },
                if nb {
                    g.mul(&a.mul(&r)?)?.neg()?
                } else {
                    g.clone()
                },
            )
        }
        // a - b·q with q = floor(a / b) (remainder) or trunc(a / b) (fmod), flat
        // in q: the gradients are g and -g·q, as PyTorch's rules
        BinaryCode::Remainder | BinaryCode::Fmod => (
            g.clone(),
            if nb {
                let (a, b) = (a()?, b()?);
                let q = if op == BinaryCode::Remainder {
                    a.floor_divide(b)?
                } else {
                    a.div(b)?.trunc()?
                };
                g.mul(&q)?.neg()?
            } else {
                g.clone()
            },
        ),
        BinaryCode::FloorDivide => {
            return Err(crate::error::Error::invalid(
                "backward",
                "the derivative for floor_divide is not implemented (as in PyTorch)",
            ))
        }
        // GELU's backwards `a · G'(b)` (a gradient `a`, GELU's input `b`): linear in
        // `a` (the same kernel), and `a · G''(b)` in `b`
        BinaryCode::GeluBackward | BinaryCode::GeluTanhBackward => (
            if na && op == BinaryCode::GeluBackward {
                g.gelu_backward(b()?)?
            } else if na {
                g.gelu_tanh_backward(b()?)?
            } else {
                g.clone()
            },
            if nb {
                g.mul(a()?)?.mul(&gelu_second_derivative(op, b()?)?)?
            } else {
                g.clone()
            },
        ),
        // relu's backward `a · [b > 0]` (a gradient `a`, relu's input `b`): linear
        // in `a`, flat in `b` wherever it is differentiable
        BinaryCode::ReluBackward => (
            if na {
                g.mul(&b()?.gt(0.0)?.to_dtype(g.dtype())?)?
            } else {
                g.clone()
            },
            if nb { g.zeros_like()? } else { g.clone() },
        ),
    };
    Ok(vec![to(ga, 0, na)?, to(gb, 1, nb)?])
}

/// G''(x) of erf GELU (`GeluBackward`: φ(x)·(2 − x²)) or of its tanh form
/// (`GeluTanhBackward`: with t = tanh(u), u = β(x + κx³), u' = β(1 + 3κx²),
/// u'' = 6βκx, G'' = (1 − t²)(u' + x(u'' − 2t·u'²)/2)).
fn gelu_second_derivative(op: BinaryCode, x: &Tensor) -> Result<Tensor> {
    if op == BinaryCode::GeluBackward {
        let pdf = x
            .square()?
            .mul(-0.5)?
            .exp()?
            .mul(1.0 / (2.0 * std::f64::consts::PI).sqrt())?;
        return pdf.mul(&x.square()?.neg()?.add(2.0)?);
    }
    let (beta, kappa) = ((2.0 / std::f64::consts::PI).sqrt(), 0.044715);
    let t = x.add(&x.pow(3.0)?.mul(kappa)?)?.mul(beta)?.tanh()?;
    let du = x.square()?.mul(3.0 * kappa)?.add(1.0)?.mul(beta)?;
    let ddu = x.mul(6.0 * beta * kappa)?;
    let inner = ddu
        .sub(&t.mul(&du.square()?)?.mul(2.0)?)?
        .mul(x)?
        .mul(0.5)?;
    t.square()?.neg()?.add(1.0)?.mul(&du.add(&inner)?)
}

#[cfg(test)]
mod tests {
    use crate::device::Device;
    use crate::error::Result;
    use crate::tensor::Tensor;

    /// The fused GELU backward kernels' own gradients (recorded when they run with
    /// gradients on): in the gradient, the derivative itself; in the input, the
    /// second derivative, against central differences of the kernel in float64.
    #[test]
    fn gelu_backward_kernels_have_their_derivatives() -> Result<()> {
        let xs = [-3.0, -1.2, -0.3, 0.0, 0.4, 1.1, 2.5];
        type Kernel = fn(&Tensor, &Tensor) -> Result<Tensor>;
        let kernels: [(&str, Kernel); 2] = [
            ("gelu_backward", Tensor::gelu_backward),
            ("gelu_tanh_backward", Tensor::gelu_tanh_backward),
        ];
        for (name, f) in kernels {
            let dev = Device::Cpu;
            let x = Tensor::new(&xs[..], &dev)?.requires_grad_(true)?;
            let g = Tensor::new(&[0.7f64; 7][..], &dev)?.requires_grad_(true)?;
            f(&g, &x)?.sum_all()?.backward()?;
            let (gx, gg) = (x.grad().expect("x"), g.grad().expect("g"));
            let (gx, gg) = (gx.to_vec::<f64>()?, gg.to_vec::<f64>()?);
            let h = 1e-5;
            for (i, &v) in xs.iter().enumerate() {
                let at = |v: f64| -> Result<f64> {
                    let one = Tensor::new(&[1.0f64][..], &dev)?;
                    f(&one, &Tensor::new(&[v][..], &dev)?)?
                        .to_vec::<f64>()
                        .map(|r| r[0])
                };
                let d1 = at(v)?;
                let d2 = (at(v + h)? - at(v - h)?) / (2.0 * h);
                assert!(
                    (gg[i] - d1).abs() < 1e-12,
                    "{name} at {v}: {} vs {d1}",
                    gg[i]
                );
                assert!(
                    (gx[i] - 0.7 * d2).abs() < 1e-6,
                    "{name} at {v}: {} vs {}",
                    gx[i],
                    0.7 * d2
                );
            }
        }
        Ok(())
    }
}
