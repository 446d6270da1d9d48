//! Gradient rules of the elementwise ops, in terms of tensor ops. Each takes the
//! saved inputs `x` (and `a`, `b`), the saved output `y` and the output's gradient `g`.

use super::Tensor;
use crate::autograd::{sum_to, Grads, Inputs, Saved};
use crate::backend::op::BinaryCode;
use crate::Result;

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
}

impl Unary {
    /// Which values the rule reads: (the input, the output). Only those are saved,
    /// so an in-place change to the other is no error (PyTorch's rule).
    pub fn saves(self) -> (bool, bool) {
        use Unary::*;
        match self {
            Neg => (false, false),
            Exp | Sqrt | Tanh | Recip | Sigmoid | Relu => (false, true),
            _ => (true, false),
        }
    }

    /// The input's gradient; `x` and `y` are the saved input and output (`None`
    /// where [`saves`](Self::saves) says the rule does not read them).
    pub fn backward(self, x: Option<&Tensor>, y: Option<&Tensor>, g: &Tensor) -> Result<Tensor> {
        use Unary::*;
        let missing =
            || crate::Error::invalid("backward", format!("{self:?}: a value was not saved"));
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
            Gelu => {
                // Φ(x) + x φ(x)
                let phi_cdf = x
                    .mul(std::f64::consts::FRAC_1_SQRT_2)?
                    .erf()?
                    .add(1.0)?
                    .mul(0.5)?;
                let pdf = x
                    .square()?
                    .mul(-0.5)?
                    .exp()?
                    .mul(1.0 / (2.0 * std::f64::consts::PI).sqrt())?;
                g.mul(&phi_cdf.add(&x.mul(&pdf)?)?)
            }
            GeluTanh => {
                let k = (2.0 / std::f64::consts::PI).sqrt();
                let inner = x.add(&x.pow(3.0)?.mul(0.044715)?)?.mul(k)?;
                let t = inner.tanh()?;
                let dinner = x.square()?.mul(3.0 * 0.044715)?.add(1.0)?.mul(k)?;
                let d = t.add(1.0)?.mul(0.5)?.add(
                    &x.mul(0.5)?
                        .mul(&t.square()?.neg()?.add(1.0)?)?
                        .mul(&dinner)?,
                )?;
                g.mul(&d)
            }
            Pow(e) => {
                if e == 0.0 {
                    g.zeros_like()
                } else {
                    g.mul(&x.pow(e - 1.0)?.mul(e)?)
                }
            }
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

/// Gradients of a broadcasting binary op for its inputs `a` and `b` (only those
/// that need one). `y`, the output, is saved by the op whose rule uses it (pow). Each rule reads only the values it needs, so an in-place change to a value
/// it does not read is no error (PyTorch's rule).
pub(crate) fn binary(op: BinaryCode, ins: &Inputs, y: Option<&Saved>, g: &Tensor) -> Result<Grads> {
    let (na, nb) = (ins.needs(0), ins.needs(1));
    let a = || ins.get(0);
    let b = || ins.get(1);
    let y = || match y {
        Some(y) => y.get(),
        None => Err(crate::Error::invalid(
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
            // the larger (smaller) input gets the gradient; ties split it evenly
            let (a, b) = (a()?, b()?);
            let (win_a, win_b) = if op == BinaryCode::Maximum {
                (a.gt(b)?, a.lt(b)?)
            } else {
                (a.lt(b)?, a.gt(b)?)
            };
            let tie = a.eq(b)?.to_dtype(g.dtype())?.mul(0.5)?;
            (
                g.mul(&win_a.to_dtype(g.dtype())?.add(&tie)?)?,
                g.mul(&win_b.to_dtype(g.dtype())?.add(&tie)?)?,
            )
        }
        BinaryCode::Pow => (
            if na {
                let (a, b) = (a()?, b()?);
                g.mul(&b.mul(&a.pow(&b.sub(1.0)?)?)?)?
            } else {
                g.clone()
            },
            if nb {
                g.mul(&y()?.mul(&a()?.log()?)?)?
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
