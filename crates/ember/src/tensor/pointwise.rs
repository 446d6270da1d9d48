//! Three-operand pointwise ops: `lerp`, `addcmul` and `addcdiv`, and their
//! in-place forms. Each is a composite of the elementwise ops computed without
//! recording (float16 and bfloat16 in float32, rounded once, as PyTorch's
//! kernels compute them in their opmath type), recorded as one node with
//! PyTorch's rule (`derivatives.yaml`), so that a gradient costs what
//! PyTorch's does and reads what it saves.

use super::elementwise::{elementwise_device, not_implemented_for};
use super::{Operand, Scalar, Tensor};
use crate::autograd::{no_grad, sum_to};
use crate::layout::broadcast_shapes;
use crate::{
    dtype::DType,
    error::{Error, Result},
};

/// The dtype a half dtype computes in (float32, PyTorch's opmath), else itself.
fn opmath(dt: DType) -> DType {
    match dt {
        DType::F16 | DType::BF16 => DType::F32,
        d => d,
    }
}

/// `g` summed to an input's shape and converted to its dtype: its gradient.
fn grad_for(g: Tensor, shape: &[usize], dt: DType) -> Result<Option<Tensor>> {
    Ok(Some(sum_to(&g, shape)?.to_dtype(dt)?))
}

/// [`grad_for`] of `g()` where the input needs a gradient, else none (and `g`
/// is not computed).
fn grad_if(
    needs: bool,
    g: impl FnOnce() -> Result<Tensor>,
    shape: &[usize],
    dt: DType,
) -> Result<Option<Tensor>> {
    if needs {
        grad_for(g()?, shape, dt)
    } else {
        Ok(None)
    }
}

/// PyTorch's result dtype of several tensors: the dimensioned ones' promotion,
/// unless a 0-d one is of a higher category.
fn result_dtype(ts: &[&Tensor]) -> DType {
    let fold = |zero: bool| {
        ts.iter()
            .filter(|t| (t.rank() == 0) == zero)
            .map(|t| t.dtype())
            .reduce(DType::promote)
    };
    match (fold(false), fold(true)) {
        (Some(d), Some(z)) => DType::result_type(d, false, z, true),
        (Some(d), None) | (None, Some(d)) => d,
        (None, None) => DType::F32,
    }
}

/// The broadcast shape of `ts`.
fn broadcast_all(op: &'static str, ts: &[&Tensor]) -> Result<Vec<usize>> {
    let mut shape = ts[0].shape().to_vec();
    for t in &ts[1..] {
        shape = broadcast_shapes(op, &shape, t.shape())?.to_vec();
    }
    Ok(shape)
}

impl Tensor {
    /// Linear interpolation `self + weight · (end - self)` (`torch.lerp`), with
    /// `weight` a tensor or a number. As PyTorch computes it: where `|weight| <
    /// 0.5` as written, elsewhere `end - (end - self) · (1 - weight)`, so that
    /// `weight = 1` gives `end` exactly; float16 and bfloat16 in float32,
    /// rounded once. The three operands broadcast together.
    ///
    /// `self` and `end` must have one floating-point dtype, and so must a
    /// tensor `weight` unless it is 0-d (PyTorch's checks: a float64 `end` for
    /// a float32 `self` is a [`DTypeMismatch`](crate::Error::DTypeMismatch),
    /// integers are refused). Gradients are PyTorch's: `g · (1 - weight)` for
    /// `self`, `g · weight` for `end`, `g · (end - self)` for `weight`.
    ///
    /// ```
    /// # use ember::{Device, Tensor};
    /// let dev = Device::Cpu;
    /// let a = Tensor::new(&[0.0f32, 10.0], &dev)?;
    /// let b = Tensor::new(&[1.0f32, 20.0], &dev)?;
    /// assert_eq!(a.lerp(&b, 0.25)?.to_vec::<f32>()?, vec![0.25, 12.5]);
    /// let w = Tensor::new(&[1.0f32, 0.5], &dev)?;
    /// assert_eq!(a.lerp(&b, &w)?.to_vec::<f32>()?, vec![1.0, 15.0]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn lerp<'a>(&self, end: &Tensor, weight: impl Into<Operand<'a>>) -> Result<Tensor> {
        self.lerp_named("lerp", end, weight.into())
    }

    /// In-place [`lerp`](Self::lerp) (`Tensor.lerp_`): `end` and `weight` must
    /// broadcast to this tensor's shape. Recorded by autograd as the other
    /// in-place ops are (the rule reads a copy of the old values).
    pub fn lerp_<'a>(&self, end: &Tensor, weight: impl Into<Operand<'a>>) -> Result<()> {
        let weight = weight.into();
        let rhs_grad =
            end.requires_grad() || matches!(weight, Operand::Tensor(w) if w.requires_grad());
        self.write_from("lerp_", rhs_grad, true, |t| {
            t.lerp_named("lerp_", end, weight)
        })
    }

    fn lerp_named(&self, op: &'static str, end: &Tensor, weight: Operand) -> Result<Tensor> {
        let dt = self.dtype();
        if end.dtype() != dt {
            return Err(lerp_dtype_error(op, dt, end.dtype()));
        }
        if !dt.is_float() {
            let kernel = match weight {
                Operand::Scalar(_) => "lerp_kernel_scalar",
                Operand::Tensor(_) => "lerp_kernel_tensor",
            };
            return Err(not_implemented_for(op, kernel, dt));
        }
        match weight {
            Operand::Scalar(s) => {
                let dev = elementwise_device(op, &[self, end])?;
                let (a, b) = (self.lifted_to(dev)?, end.lifted_to(dev)?);
                broadcast_shapes(op, a.shape(), b.shape())?;
                let w = s.to_f64();
                let out = no_grad(|| -> Result<Tensor> {
                    let (x, e) = (a.to_dtype(opmath(dt))?, b.to_dtype(opmath(dt))?);
                    let y = if w.abs() < 0.5 {
                        x.add(&e.sub(&x)?.mul(w)?)?
                    } else {
                        e.sub(&e.sub(&x)?.mul(1.0 - w)?)?
                    };
                    y.to_dtype(dt)
                })?;
                let (a, b) = (a.as_ref(), b.as_ref());
                Ok(Tensor::record_twice(out, op, &[a, b], |_| {
                    let (sa, sb) = (a.shape().to_vec(), b.shape().to_vec());
                    let needs = [a.requires_grad(), b.requires_grad()];
                    move |g: &Tensor| {
                        Ok(vec![
                            grad_if(needs[0], || g.mul(1.0 - w), &sa, dt)?,
                            grad_if(needs[1], || g.mul(w), &sb, dt)?,
                        ])
                    }
                }))
            }
            Operand::Tensor(w) => {
                if w.dtype() != dt && w.rank() > 0 {
                    return Err(lerp_dtype_error(op, dt, w.dtype()));
                }
                let dev = elementwise_device(op, &[self, end, w])?;
                let (a, b, w) = (self.lifted_to(dev)?, end.lifted_to(dev)?, w.lifted_to(dev)?);
                // a 0-d weight of another dtype is taken as a number of this one
                let w = if w.dtype() != dt {
                    std::borrow::Cow::Owned(w.to_dtype(dt)?)
                } else {
                    w
                };
                let (a, b, w) = (a.as_ref(), b.as_ref(), w.as_ref());
                broadcast_all(op, &[a, b, w])?;
                let out = no_grad(|| -> Result<Tensor> {
                    let [x, e, v] = [a, b, w].map(|t| t.to_dtype(opmath(dt)));
                    let (x, e, v) = (x?, e?, v?);
                    let small = v.abs()?.lt(0.5)?;
                    let coeff = small.where_(&v, &v.sub(1.0)?)?;
                    let base = small.where_(&x, &e)?;
                    base.add(&coeff.mul(&e.sub(&x)?)?)?.to_dtype(dt)
                })?;
                Ok(Tensor::record_twice(out, op, &[a, b, w], |_| {
                    let shapes = [a, b, w].map(|t| t.shape().to_vec());
                    let needs = [a, b, w].map(Tensor::requires_grad);
                    // (the weight's gradient reads the ends, the ends' the weight)
                    let ends = needs[2].then(|| (a.save(), b.save()));
                    let sw = (needs[0] || needs[1]).then(|| w.save());
                    move |g: &Tensor| {
                        let missing = || Error::invalid("backward", "lerp: a value was not saved");
                        let v = sw.as_ref().map(|w| w.value()).transpose()?;
                        let v = v.as_ref();
                        let v = || v.ok_or_else(missing);
                        let gw = || {
                            let (x, e) = ends.as_ref().ok_or_else(missing)?;
                            g.mul(&e.value()?.sub(&x.value()?)?)
                        };
                        Ok(vec![
                            grad_if(needs[0], || g.mul(&v()?.rsub(1.0)?), &shapes[0], dt)?,
                            grad_if(needs[1], || g.mul(v()?), &shapes[1], dt)?,
                            grad_if(needs[2], gw, &shapes[2], dt)?,
                        ])
                    }
                }))
            }
        }
    }

    /// `self + value · tensor1 · tensor2` (`torch.addcmul`): the three operands
    /// broadcast together and promote as one elementwise op; an integer result
    /// takes `value` converted to its dtype (truncated, as PyTorch converts it),
    /// a float16 or bfloat16 one is computed in float32 and rounded once. Bool
    /// results are refused, as in PyTorch. Gradients are PyTorch's: `g` for
    /// `self`, `g · tensor2 · value` for `tensor1`, `g · tensor1 · value` for
    /// `tensor2`, each summed to its operand's shape.
    ///
    /// ```
    /// # use ember::{Device, Tensor};
    /// let dev = Device::Cpu;
    /// let x = Tensor::new(&[1.0f32, 2.0], &dev)?;
    /// let (a, b) = (Tensor::new(&[3.0f32, 4.0], &dev)?, Tensor::new(&[0.5f32], &dev)?);
    /// assert_eq!(x.addcmul(&a, &b, 2.0)?.to_vec::<f32>()?, vec![4.0, 6.0]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn addcmul(
        &self,
        tensor1: &Tensor,
        tensor2: &Tensor,
        value: impl Into<Scalar>,
    ) -> Result<Tensor> {
        self.addc("addcmul", tensor1, tensor2, value.into(), false)
    }

    /// `self + value · tensor1 / tensor2` (`torch.addcdiv`, Adam's update): as
    /// [`addcmul`](Self::addcmul) with a true division. Integer (or bool)
    /// `tensor1` and `tensor2` together are refused, as in PyTorch, which no
    /// longer divides them as integers; an integer `self` beside float ones
    /// gives a float result. Gradients are PyTorch's: `g` for `self`,
    /// `g · value / tensor2` for `tensor1`, `-g · value · tensor1 / tensor2²`
    /// for `tensor2`.
    pub fn addcdiv(
        &self,
        tensor1: &Tensor,
        tensor2: &Tensor,
        value: impl Into<Scalar>,
    ) -> Result<Tensor> {
        self.addc("addcdiv", tensor1, tensor2, value.into(), true)
    }

    /// In-place [`addcmul`](Self::addcmul) (`Tensor.addcmul_`): the operands
    /// must broadcast to this tensor's shape, and the result's dtype must be
    /// one it can take. Recorded by autograd as the other in-place ops are.
    pub fn addcmul_(
        &self,
        tensor1: &Tensor,
        tensor2: &Tensor,
        value: impl Into<Scalar>,
    ) -> Result<()> {
        self.addc_in_place("addcmul_", tensor1, tensor2, value.into(), false)
    }

    /// In-place [`addcdiv`](Self::addcdiv) (`Tensor.addcdiv_`), as
    /// [`addcmul_`](Self::addcmul_).
    pub fn addcdiv_(
        &self,
        tensor1: &Tensor,
        tensor2: &Tensor,
        value: impl Into<Scalar>,
    ) -> Result<()> {
        self.addc_in_place("addcdiv_", tensor1, tensor2, value.into(), true)
    }

    /// `addcmul_` (or with `div`, `addcdiv_`): [`addc`](Self::addc) written
    /// into this tensor.
    fn addc_in_place(
        &self,
        op: &'static str,
        t1: &Tensor,
        t2: &Tensor,
        value: Scalar,
        div: bool,
    ) -> Result<()> {
        let rhs_grad = t1.requires_grad() || t2.requires_grad();
        self.write_from(op, rhs_grad, false, |t| t.addc(op, t1, t2, value, div))
    }

    fn addc(
        &self,
        op: &'static str,
        t1: &Tensor,
        t2: &Tensor,
        value: Scalar,
        div: bool,
    ) -> Result<Tensor> {
        if div && !t1.dtype().is_float() && !t2.dtype().is_float() {
            return Err(Error::dtype(
                op,
                t2.dtype(),
                "Integer division with addcdiv is no longer supported, and in a future release addcdiv will perform a true division of tensor1 and tensor2 (convert them to a float dtype; the old behaviour is input + value * trunc(tensor1 / tensor2) in input's dtype)",
            ));
        }
        let dev = elementwise_device(op, &[self, t1, t2])?;
        let (x, a, b) = (self.lifted_to(dev)?, t1.lifted_to(dev)?, t2.lifted_to(dev)?);
        let (x, a, b) = (x.as_ref(), a.as_ref(), b.as_ref());
        let dt = result_dtype(&[x, a, b]);
        if dt == DType::Bool {
            let kernel = if div {
                "addcdiv_cpu_out"
            } else {
                "addcmul_cpu_out"
            };
            return Err(not_implemented_for(op, kernel, dt));
        }
        broadcast_all(op, &[x, a, b])?;
        // an integer result takes the value in its dtype (truncated)
        let value = if dt.is_float() {
            value
        } else {
            match value {
                Scalar::Float(v) => Scalar::Int(v.trunc() as i64),
                Scalar::Bool(v) => Scalar::Int(v as i64),
                s => s,
            }
        };
        let out = no_grad(|| -> Result<Tensor> {
            let work = opmath(dt);
            let [x, a, b] = [x, a, b].map(|t| t.to_dtype(work));
            let (x, a, b) = (x?, a?, b?);
            let p = a.mul(value)?;
            let p = if div { p.div(&b)? } else { p.mul(&b)? };
            x.add(&p)?.to_dtype(dt)
        })?;
        Ok(Tensor::record_twice(out, op, &[x, a, b], |_| {
            let shapes = [x, a, b].map(|t| (t.shape().to_vec(), t.dtype()));
            let [needs_x, needs_a, needs_b] = [x, a, b].map(Tensor::requires_grad);
            // each multiplier's gradient reads the other, and a divisor's reads
            // itself too (PyTorch's saved values)
            let sa = needs_b.then(|| a.save());
            let sb = (needs_a || (div && needs_b)).then(|| b.save());
            move |g: &Tensor| {
                let missing = || Error::invalid("backward", format!("{op}: a value was not saved"));
                let get = |s: &Option<crate::autograd::Saved>| {
                    s.as_ref()
                        .map(|s| s.value().and_then(|t| t.to_dtype(dt)))
                        .transpose()
                };
                let (a, b) = (get(&sa)?, get(&sb)?);
                let ga = match (&b, needs_a) {
                    // `value / tensor2` as PyTorch's operator: the value filled
                    // in the dtype, then divided
                    (Some(b), true) if div => Some(g.mul(&b.full_like(value)?.div(b)?)?),
                    (Some(b), true) => Some(g.mul(&b.mul(value)?)?),
                    (None, true) => return Err(missing()),
                    _ => None,
                };
                let gb = match (&a, &b, needs_b) {
                    (Some(a), Some(b), true) if div => {
                        Some(g.neg()?.mul(&a.mul(value)?.div(&b.mul(b)?)?)?)
                    }
                    (Some(a), _, true) if !div => Some(g.mul(&a.mul(value)?)?),
                    (_, _, true) => return Err(missing()),
                    _ => None,
                };
                let to = |g: Option<Tensor>, k: usize| -> Result<Option<Tensor>> {
                    match g {
                        Some(g) => grad_for(g, &shapes[k].0, shapes[k].1),
                        None => Ok(None),
                    }
                };
                Ok(vec![
                    grad_if(needs_x, || Ok(g.clone()), &shapes[0].0, shapes[0].1)?,
                    to(ga, 1)?,
                    to(gb, 2)?,
                ])
            }
        }))
    }
}

/// PyTorch's refusal of a `lerp` operand (`end`, or a weight that is not 0-d)
/// of another dtype than `self`'s.
fn lerp_dtype_error(op: &'static str, want: DType, got: DType) -> Error {
    Error::DTypeMismatch {
        op,
        lhs: want,
        rhs: got,
    }
}
