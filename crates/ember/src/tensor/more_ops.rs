//! Running extremes and bit ops: `cummax`/`cummin`, `logcumsumexp`, `hypot`,
//! `heaviside` and the `bitwise_*` family, composites of existing ops (a
//! doubling scan, byte lookup tables), so they run on every device, meta
//! included.

use super::{Operand, Tensor};
use crate::layout::{broadcast_shapes, normalize_dim};
use crate::{
    autograd::no_grad,
    dtype::DType,
    error::{Error, Result},
    tensor::elementwise::not_implemented_for,
};

/// An inclusive scan along `d` of the tuple `parts` (equal shapes), by
/// doubling: after the step of width `s` each position holds the combination
/// of the `2s` positions ending at it. `combine(left, right)` must be
/// associative; it is called `log2(n)` times on whole tensors.
fn doubling_scan(
    parts: Vec<Tensor>,
    d: usize,
    combine: impl Fn(&[Tensor], &[Tensor]) -> Result<Vec<Tensor>>,
) -> Result<Vec<Tensor>> {
    let n = parts[0].shape()[d];
    let dim = d as i64;
    let mut cur = parts;
    let mut s = 1;
    while s < n {
        let part = |start: usize, len: usize| -> Result<Vec<Tensor>> {
            cur.iter()
                .map(|t| t.narrow(dim, start as i64, len))
                .collect()
        };
        let (head, left, right) = (part(0, s)?, part(0, n - s)?, part(s, n - s)?);
        let tail = combine(&left, &right)?;
        cur = head
            .iter()
            .zip(&tail)
            .map(|(h, t)| Tensor::cat(&[h, t], dim))
            .collect::<Result<_>>()?;
        s *= 2;
    }
    Ok(cur)
}

/// The bit operation a byte table or a shift stands for.
#[derive(Clone, Copy)]
enum Bits {
    And,
    Or,
    Xor,
}

impl Bits {
    fn name(self) -> (&'static str, &'static str) {
        match self {
            Bits::And => ("bitwise_and", "bitwise_and_cpu"),
            Bits::Or => ("bitwise_or", "bitwise_or_cpu"),
            Bits::Xor => ("bitwise_xor", "bitwise_xor_cpu"),
        }
    }

    /// The op on every pair of bytes, at `a * 256 + b`.
    fn table(self) -> Vec<u8> {
        (0..=u16::MAX)
            .map(|i| {
                let (a, b) = ((i >> 8) as u8, i as u8);
                match self {
                    Bits::And => a & b,
                    Bits::Or => a | b,
                    Bits::Xor => a ^ b,
                }
            })
            .collect()
    }
}

impl Tensor {
    /// The running maximum along `dim` and where it was found
    /// (`torch.cummax(t, dim)`): values and int64 indices of this tensor's
    /// shape. Among equal values the later index is taken, as PyTorch's; a NaN
    /// stays the maximum from where it appears (the index then follows the last
    /// NaN). The gradient flows to the element each index names.
    ///
    /// ```
    /// # use ember::{Device, Tensor};
    /// let t = Tensor::from_slice(&[1.0f32, 3.0, 3.0, 2.0], &[4], &Device::Cpu)?;
    /// let (v, i) = t.cummax(0)?;
    /// assert_eq!(v.to_vec::<f32>()?, [1.0, 3.0, 3.0, 3.0]);
    /// assert_eq!(i.to_vec::<i64>()?, [0, 1, 2, 2]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn cummax(&self, dim: i64) -> Result<(Tensor, Tensor)> {
        self.cum_extreme("cummax", dim, true)
    }

    /// The running minimum along `dim` and where it was found
    /// (`torch.cummin(t, dim)`), as [`cummax`](Self::cummax): ties take the
    /// later index and NaN propagates.
    pub fn cummin(&self, dim: i64) -> Result<(Tensor, Tensor)> {
        self.cum_extreme("cummin", dim, false)
    }

    fn cum_extreme(&self, op: &'static str, dim: i64, max: bool) -> Result<(Tensor, Tensor)> {
        let d = normalize_dim(op, dim, self.rank().max(1))?;
        let dev = self.device();
        if self.rank() == 0 {
            return Ok((self.copy()?, Tensor::zeros((), DType::I64, &dev)?));
        }
        let n = self.shape()[d];
        let float = self.dtype().is_float();
        let idx = no_grad(|| {
            let mut at = vec![1; self.rank()];
            at[d] = n;
            let pos = Tensor::arange(0i64, n as i64, &dev)?
                .reshape(at)?
                .expand(self.shape())?
                .contiguous()?;
            let x = self.detach();
            let scanned = doubling_scan(vec![x, pos], d, |l, r| {
                let (vl, vr) = (&l[0], &r[0]);
                let mut right = if max { vr.ge(vl)? } else { vr.le(vl)? };
                if float {
                    // a NaN on the right wins; one on the left wins over numbers
                    let keep_left = vl.isnan()?.logical_and(&vr.isnan()?.logical_not()?)?;
                    right = right.logical_and(&keep_left.logical_not()?)?;
                    right = right.logical_or(&vr.isnan()?)?;
                }
                Ok(vec![right.where_(vr, vl)?, right.where_(&r[1], &l[1])?])
            })?;
            Ok(scanned[1].clone())
        })?;
        Ok((self.gather_valid(d, idx.clone())?, idx))
    }

    /// `log(cumsum(exp(x)))` along `dim` without overflow
    /// (`torch.logcumsumexp(t, dim)`), for float dtypes: each step adds with
    /// `logaddexp`, so large values and -∞ are exact. The gradient is
    /// PyTorch's formula (NaN where the input and its running result are
    /// both -∞, as there).
    pub fn logcumsumexp(&self, dim: i64) -> Result<Tensor> {
        const OP: &str = "logcumsumexp";
        if !self.dtype().is_float() {
            return Err(not_implemented_for(
                OP,
                "logcumsumexp_out_cpu",
                self.dtype(),
            ));
        }
        let d = normalize_dim(OP, dim, self.rank().max(1))?;
        let out = no_grad(|| {
            if self.rank() == 0 {
                return self.copy();
            }
            let x = self.detach().contiguous()?;
            let r = doubling_scan(vec![x], d, |l, r| Ok(vec![l[0].logaddexp(&r[0])?]))?;
            Ok(r[0].clone())
        })?;
        Ok(Tensor::record_twice(out, OP, &[self], |y| {
            let (x, y) = (self.save(), y.save());
            move |g: &Tensor| {
                let (x, y) = (&x.value()?, &y.value()?);
                Ok(vec![Some(logcumsumexp_backward(x, y, g, d)?)])
            }
        }))
    }

    /// `sqrt(self² + other²)` without overflow (`torch.hypot`), broadcasting;
    /// float dtypes only, as PyTorch's. An infinite side gives +∞ even beside
    /// a NaN, as C's `hypot`. The gradient is `g · self / result` (and the
    /// same for `other`).
    pub fn hypot(&self, other: &Tensor) -> Result<Tensor> {
        const OP: &str = "hypot";
        for t in [self, other] {
            if !t.dtype().is_float() {
                return Err(not_implemented_for(OP, "hypot_cpu", t.dtype()));
            }
        }
        let dt = DType::result_type(
            self.dtype(),
            self.rank() == 0,
            other.dtype(),
            other.rank() == 0,
        );
        let (a, b) = (self.to_dtype(dt)?, other.to_dtype(dt)?);
        let out = no_grad(|| {
            let (x, y) = (a.abs()?, b.abs()?);
            let big = x.maximum(&y)?;
            let ratio = x.minimum(&y)?.div(&big)?;
            let h = big.mul(&ratio.square()?.add(1.0)?.sqrt()?)?;
            let h = big.eq(0.0)?.where_(0.0, &h)?;
            let inf = x.isinf()?.logical_or(&y.isinf()?)?;
            inf.where_(f64::INFINITY, &h)
        })?;
        let (sa, sb) = (a.shape().to_vec(), b.shape().to_vec());
        Ok(Tensor::record_twice(out, OP, &[&a, &b], |h| {
            let (a, b, h) = (a.save(), b.save(), h.save());
            move |g: &Tensor| {
                let (a, b, h) = (&a.value()?, &b.value()?, &h.value()?);
                let part = |x: &Tensor, s: &[usize]| -> Result<Tensor> {
                    crate::autograd::sum_to(&g.mul(x)?.div(h)?, s)
                };
                Ok(vec![Some(part(a, &sa)?), Some(part(b, &sb)?)])
            }
        }))
    }

    /// The Heaviside step (`torch.heaviside(self, values)`): 0 where `self` is
    /// negative (or NaN), 1 where positive, and `values` where it is 0,
    /// broadcasting. Both must have one dtype, as PyTorch requires. Not
    /// differentiable: a backward pass through it is refused, as PyTorch's.
    pub fn heaviside(&self, values: &Tensor) -> Result<Tensor> {
        const OP: &str = "heaviside";
        if self.dtype() != values.dtype() {
            return Err(Error::invalid(
                OP,
                "heaviside is not yet implemented for tensors with different dtypes.",
            ));
        }
        let out = no_grad(|| {
            let step = self.gt(0)?.to_dtype(self.dtype())?;
            self.eq(0)?.where_(values, &step)
        })?;
        Ok(no_derivative(out, OP, &[self, values]))
    }

    /// Bitwise AND (`torch.bitwise_and`, `&`) of bool, uint8 or int64 tensors,
    /// broadcasting, in their promoted dtype; floats are refused as PyTorch
    /// refuses them.
    pub fn bitwise_and<'a>(&self, other: impl Into<Operand<'a>>) -> Result<Tensor> {
        self.bitwise(other.into(), Bits::And)
    }

    /// Bitwise OR (`torch.bitwise_or`, `|`), as [`bitwise_and`](Self::bitwise_and).
    pub fn bitwise_or<'a>(&self, other: impl Into<Operand<'a>>) -> Result<Tensor> {
        self.bitwise(other.into(), Bits::Or)
    }

    /// Bitwise XOR (`torch.bitwise_xor`, `^`), as [`bitwise_and`](Self::bitwise_and).
    pub fn bitwise_xor<'a>(&self, other: impl Into<Operand<'a>>) -> Result<Tensor> {
        self.bitwise(other.into(), Bits::Xor)
    }

    /// Bitwise NOT (`torch.bitwise_not`, `~`): logical NOT for bool, `255 - x`
    /// for uint8, `-1 - x` for int64; floats refused.
    pub fn bitwise_not(&self) -> Result<Tensor> {
        const OP: &str = "bitwise_not";
        no_grad(|| match self.dtype() {
            DType::Bool => self.logical_not(),
            DType::U8 => self.rsub(255),
            DType::I64 => self.rsub(-1),
            dt => Err(not_implemented_for(OP, "bitwise_not_cpu", dt)),
        })
    }

    /// `self << other` (`torch.bitwise_left_shift`) for uint8 and int64,
    /// wrapping as the machine shift does; a shift below 0 or of the width or
    /// more gives 0, as PyTorch's. Bool and floats are refused.
    pub fn bitwise_left_shift<'a>(&self, other: impl Into<Operand<'a>>) -> Result<Tensor> {
        self.shift(other.into(), true)
    }

    /// `self >> other` (`torch.bitwise_right_shift`), arithmetic for int64: a
    /// shift below 0 or of the width or more gives the sign (0 or -1), as
    /// PyTorch's. Bool and floats are refused.
    pub fn bitwise_right_shift<'a>(&self, other: impl Into<Operand<'a>>) -> Result<Tensor> {
        self.shift(other.into(), false)
    }

    /// Both operands of a bit op in their promoted dtype, broadcast to one
    /// shape, after PyTorch's refusal of floats (and, for shifts, bools).
    fn bit_operands(
        &self,
        other: Operand,
        op: &'static str,
        kernel: &str,
        bool_ok: bool,
    ) -> Result<(Tensor, Tensor)> {
        let b = match other {
            Operand::Tensor(t) => t.clone(),
            Operand::Scalar(s) => {
                let dt = match s.dtype() {
                    DType::I64 if self.dtype() == DType::Bool => DType::I64,
                    d if d.is_float() => d,
                    _ => self.dtype(),
                };
                Tensor::full_scalar(&[], s, dt, self.device())?
            }
        };
        let dt = DType::result_type(self.dtype(), self.rank() == 0, b.dtype(), b.rank() == 0);
        for t in [self.dtype(), b.dtype(), dt] {
            if t.is_float() || (!bool_ok && t == DType::Bool) {
                return Err(not_implemented_for(op, kernel, t));
            }
        }
        super::same_device(op, &[self, &b])?;
        let shape = broadcast_shapes(op, self.shape(), b.shape())?;
        Ok((
            self.to_dtype(dt)?.expand(&shape[..])?,
            b.to_dtype(dt)?.expand(&shape[..])?,
        ))
    }

    fn bitwise(&self, other: Operand, bits: Bits) -> Result<Tensor> {
        let (op, kernel) = bits.name();
        let (a, b) = self.bit_operands(other, op, kernel, true)?;
        no_grad(|| {
            if a.dtype() == DType::Bool {
                return match bits {
                    Bits::And => a.logical_and(&b),
                    Bits::Or => a.logical_or(&b),
                    Bits::Xor => a.logical_xor(&b),
                };
            }
            let table = Tensor::from_vec(bits.table(), [1 << 16], &a.device())?;
            let byte = |x: &Tensor, k: u32| -> Result<Tensor> {
                let x = x.to_dtype(DType::I64)?;
                if k == 0 && a.dtype() == DType::U8 {
                    return Ok(x);
                }
                x.floor_divide(1i64 << (8 * k))?.remainder(256i64)
            };
            let pair = |k: u32| -> Result<Tensor> {
                let i = byte(&a, k)?.mul(256i64)?.add(&byte(&b, k)?)?;
                table.take(&i)?.to_dtype(DType::I64)
            };
            if a.dtype() == DType::U8 {
                return pair(0)?.to_dtype(DType::U8);
            }
            // int64, a byte at a time; the top byte carries the sign
            let mut acc = Tensor::zeros(a.shape(), DType::I64, &a.device())?;
            for k in 0..8u32 {
                let mut r = pair(k)?;
                if k == 7 {
                    r = r.sub(&r.ge(128i64)?.to_dtype(DType::I64)?.mul(256i64)?)?;
                }
                acc = acc.add(&r.mul(1i64 << (8 * k))?)?;
            }
            Ok(acc)
        })
    }

    fn shift(&self, other: Operand, left: bool) -> Result<Tensor> {
        let (op, kernel) = if left {
            ("bitwise_left_shift", "lshift_cpu")
        } else {
            ("bitwise_right_shift", "rshift_cpu")
        };
        let (a, b) = self.bit_operands(other, op, kernel, false)?;
        no_grad(|| {
            let dev = a.device();
            let width: i64 = if a.dtype() == DType::U8 { 8 } else { 64 };
            // powers of two in the operands' dtype (2^63 wraps to i64::MIN, which
            // multiplies as 2^63 does modulo 2^64)
            let pow = if a.dtype() == DType::U8 {
                Tensor::from_vec((0..8).map(|k| 1u8 << k).collect::<Vec<_>>(), [8], &dev)?
            } else {
                let p: Vec<i64> = (0..64).map(|k| 1i64.wrapping_shl(k)).collect();
                Tensor::from_vec(p, [64], &dev)?
            };
            let n = b.to_dtype(DType::I64)?;
            // a full shift of the sign bit is not a division by a power of two
            let limit = if left || width == 8 { width } else { 63 };
            let ok = n.ge(0i64)?.logical_and(&n.lt(limit)?)?;
            let p = pow.take(&ok.where_(&n, 0i64)?)?;
            if left {
                ok.where_(&a.mul(&p)?, 0i64)
            } else {
                let fill = if width == 8 {
                    a.zeros_like()?
                } else {
                    a.lt(0i64)?.where_(-1i64, 0i64)?
                };
                ok.where_(&a.floor_divide(&p)?, &fill)
            }
        })
    }
}

/// `out` with a node that refuses the backward pass, as PyTorch's ops without
/// a derivative do, where one of `inputs` requires a gradient.
pub(super) fn no_derivative(out: Tensor, op: &'static str, inputs: &[&Tensor]) -> Tensor {
    Tensor::record(out, op, inputs, |_| {
        move |_: &Tensor| -> Result<crate::autograd::Grads> {
            Err(Error::invalid(
                "backward",
                format!("derivative for aten::{op} is not implemented"),
            ))
        }
    })
}

/// PyTorch's gradient of `logcumsumexp` along `d` for output `y`: the
/// positive and negative parts of `g` summed as reversed log-cumsum-exps.
fn logcumsumexp_backward(x: &Tensor, y: &Tensor, g: &Tensor, d: usize) -> Result<Tensor> {
    if x.rank() == 0 {
        return Ok(g.clone());
    }
    let lowest = match x.dtype() {
        DType::F64 => f64::MIN,
        DType::F32 => f32::MIN as f64,
        DType::F16 => -65504.0,
        _ => -3.3895313892515355e38,
    };
    let dim = d as i64;
    let rev = |t: &Tensor| -> Result<Tensor> { t.flip([dim])?.logcumsumexp(dim)?.flip([dim]) };
    let pos = g.gt(0.0)?.where_(&g.log()?, lowest)?;
    let neg = g.lt(0.0)?.where_(&g.neg()?.log()?, lowest)?;
    let out_pos = rev(&pos.sub(y)?)?.add(x)?.exp()?;
    let out_neg = rev(&neg.sub(y)?)?.add(x)?.exp()?;
    out_pos.sub(&out_neg)
}
