//! `std::ops` operators for notebook-style code: `&a + &b`, `&a * 2.0`, `1.0 - &a`,
//! `-&a`.
//!
//! # Panics
//!
//! Operators cannot return `Result`, so they **panic** with ember's error message
//! when the operation fails (shapes that do not broadcast, tensors on two devices,
//! ...). Use the methods (`a.add(&b)?`) wherever failure must be handled. Owned
//! left operands (`a + &b`) reuse `a`'s buffer when nothing else holds it.

use super::elementwise::Operand;
use super::Tensor;
use std::ops::{Add, Div, Mul, Neg, Sub};

fn ok(r: crate::Result<Tensor>, op: &str) -> Tensor {
    r.unwrap_or_else(|e| panic!("ember: `{op}` operator failed: {e}"))
}

macro_rules! tensor_op {
    ($tr:ident, $m:ident, $inplace:ident, $sym:literal) => {
        impl<'a> $tr<&'a Tensor> for &Tensor {
            type Output = Tensor;
            fn $m(self, rhs: &'a Tensor) -> Tensor {
                ok(Tensor::$m(self, rhs), $sym)
            }
        }
        impl<'a> $tr<&'a Tensor> for Tensor {
            type Output = Tensor;
            fn $m(self, rhs: &'a Tensor) -> Tensor {
                reuse_or(
                    self,
                    Operand::Tensor(rhs),
                    |t, r| t.$inplace(r),
                    |t, r| t.$m(r),
                    $sym,
                )
            }
        }
        impl $tr<Tensor> for Tensor {
            type Output = Tensor;
            fn $m(self, rhs: Tensor) -> Tensor {
                $tr::$m(self, &rhs)
            }
        }
        impl $tr<Tensor> for &Tensor {
            type Output = Tensor;
            fn $m(self, rhs: Tensor) -> Tensor {
                $tr::$m(self, &rhs)
            }
        }
        impl $tr<f64> for &Tensor {
            type Output = Tensor;
            fn $m(self, rhs: f64) -> Tensor {
                ok(Tensor::$m(self, rhs), $sym)
            }
        }
        impl $tr<f64> for Tensor {
            type Output = Tensor;
            fn $m(self, rhs: f64) -> Tensor {
                reuse_or(
                    self,
                    Operand::from(rhs),
                    |t, r| t.$inplace(r),
                    |t, r| t.$m(r),
                    $sym,
                )
            }
        }
    };
}
tensor_op!(Add, add, add_, "+");
tensor_op!(Sub, sub, sub_, "-");
tensor_op!(Mul, mul, mul_, "*");
tensor_op!(Div, div, div_, "/");

/// Computes in place when `t` owns its storage outright, has the result's shape and
/// dtype, and is contiguous; otherwise out of place.
fn reuse_or(
    t: Tensor,
    rhs: Operand,
    inplace: impl Fn(&Tensor, Operand) -> crate::Result<()>,
    fresh: impl Fn(&Tensor, Operand) -> crate::Result<Tensor>,
    sym: &str,
) -> Tensor {
    let same_shape_dtype = match rhs {
        Operand::Tensor(r) => {
            !r.same_storage(&t)
                && crate::layout::broadcast_shapes("op", t.shape(), r.shape())
                    .is_ok_and(|s| s.as_slice() == t.shape())
                && crate::DType::result_type(t.dtype(), t.rank() == 0, r.dtype(), r.rank() == 0)
                    == t.dtype()
        }
        Operand::Scalar(_) => t.dtype().is_float(),
    };
    // in-place updates are not recorded: only when no gradient is being tracked
    let tracked = crate::autograd::is_grad_enabled()
        && (t.requires_grad() || matches!(rhs, Operand::Tensor(r) if r.requires_grad()));
    if !tracked
        && same_shape_dtype
        && t.storage_is_unique()
        && t.is_contiguous()
        && t.dtype().is_float()
    {
        ok(inplace(&t, rhs).map(|_| t), sym)
    } else {
        ok(fresh(&t, rhs), sym)
    }
}

// scalar on the left: 2.0 * &t, 1.0 - &t, 1.0 / &t
impl Add<&Tensor> for f64 {
    type Output = Tensor;
    fn add(self, rhs: &Tensor) -> Tensor {
        ok(rhs.add(self), "+")
    }
}
impl Mul<&Tensor> for f64 {
    type Output = Tensor;
    fn mul(self, rhs: &Tensor) -> Tensor {
        ok(rhs.mul(self), "*")
    }
}
impl Sub<&Tensor> for f64 {
    type Output = Tensor;
    fn sub(self, rhs: &Tensor) -> Tensor {
        ok(Tensor::neg(rhs).and_then(|n| Tensor::add(&n, self)), "-")
    }
}
impl Div<&Tensor> for f64 {
    type Output = Tensor;
    fn div(self, rhs: &Tensor) -> Tensor {
        ok(rhs.recip().and_then(|r| Tensor::mul(&r, self)), "/")
    }
}

impl Neg for &Tensor {
    type Output = Tensor;
    fn neg(self) -> Tensor {
        ok(Tensor::neg(self), "neg")
    }
}
impl Neg for Tensor {
    type Output = Tensor;
    fn neg(self) -> Tensor {
        ok(Tensor::neg(&self), "neg")
    }
}
