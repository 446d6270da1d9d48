//! `std::ops` operators for notebook-style code: `&a + &b`, `&a * 2.0`, `&a - 1`,
//! `1.0 - &a`, `2 / &a`, `-&a`.
//!
//! # Panics
//!
//! Operators cannot return `Result`, so they **panic** with ember's error message
//! when the operation fails (shapes that do not broadcast, tensors on two devices,
//! a bool in a subtraction, ...). Every operator has a method that returns the
//! error instead, to use wherever failure must be handled:
//!
//! | operator | method |
//! |---|---|
//! | `&a + &b`, `&a + 2.0`, `2.0 + &a` | `a.add(&b)?`, `a.add(2.0)?` |
//! | `&a - &b`, `&a - 2.0` | `a.sub(&b)?`, `a.sub(2.0)?` |
//! | `2.0 - &a`, `2 - &a` | `a.rsub(2.0)?`, `a.rsub(2)?` |
//! | `&a * &b`, `&a * 2.0`, `2.0 * &a` | `a.mul(&b)?`, `a.mul(2.0)?` |
//! | `&a / &b`, `&a / 2.0` | `a.div(&b)?`, `a.div(2.0)?` |
//! | `2.0 / &a`, `2 / &a` | `a.rdiv(2.0)?`, `a.rdiv(2)?` |
//! | `-&a` | `a.neg()?` |
//!
//! Owned left operands (`a + &b`) reuse `a`'s buffer when nothing else holds it.

use super::elementwise::Operand;
use super::Tensor;
use std::ops::{Add, Div, Mul, Neg, Sub};

fn ok(r: crate::error::Result<Tensor>, op: &str) -> Tensor {
    r.unwrap_or_else(|e| panic!("ember: `{op}` operator failed: {e}"))
}

macro_rules! tensor_op {
    ($tr:ident, $m:ident, $inplace:ident, $sym:literal) => {
        #[doc = concat!("`&a ", $sym, " &b`; panics on failure, use [`Tensor::", stringify!($m), "`] to get the error.")]
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
        #[doc = concat!("`&a ", $sym, " 2.0`; panics on failure, use [`Tensor::", stringify!($m), "`] to get the error.")]
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
    inplace: impl Fn(&Tensor, Operand) -> crate::error::Result<()>,
    fresh: impl Fn(&Tensor, Operand) -> crate::error::Result<Tensor>,
    sym: &str,
) -> Tensor {
    let same_shape_dtype = match rhs {
        Operand::Tensor(r) => {
            !r.same_storage(&t)
                && crate::layout::broadcast_shapes("op", t.shape(), r.shape())
                    .is_ok_and(|s| s.as_slice() == t.shape())
                && crate::dtype::DType::result_type(
                    t.dtype(),
                    t.rank() == 0,
                    r.dtype(),
                    r.rank() == 0,
                ) == t.dtype()
        }
        Operand::Scalar(_) => t.dtype().is_float(),
    };
    // an owned operand is reused only when no gradient is being tracked
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

// scalar on the left: 2.0 * &t, 1.0 - &t, 1.0 / &t, and the same with integers
// (`2 - &t`); each panics where its method returns the error:
// `2.0 + &t` is `t.add(2.0)?`, `2.0 * &t` is `t.mul(2.0)?`, `2.0 - &t` is
// `t.rsub(2.0)?` and `2.0 / &t` is `t.rdiv(2.0)?`.
macro_rules! scalar_lhs {
    ($($s:ty),*) => {$(
        #[doc = concat!("`", stringify!($s), " + &t`; panics on failure, use [`Tensor::add`] to get the error.")]
        impl Add<&Tensor> for $s {
            type Output = Tensor;
            fn add(self, rhs: &Tensor) -> Tensor {
                ok(rhs.add(self), "+")
            }
        }
        #[doc = concat!("`", stringify!($s), " * &t`; panics on failure, use [`Tensor::mul`] to get the error.")]
        impl Mul<&Tensor> for $s {
            type Output = Tensor;
            fn mul(self, rhs: &Tensor) -> Tensor {
                ok(rhs.mul(self), "*")
            }
        }
        #[doc = concat!("`", stringify!($s), " - &t`; panics on failure (a bool tensor, ...), use [`Tensor::rsub`] to get the error.")]
        impl Sub<&Tensor> for $s {
            type Output = Tensor;
            fn sub(self, rhs: &Tensor) -> Tensor {
                ok(rhs.rsub(self), "-")
            }
        }
        #[doc = concat!("`", stringify!($s), " / &t` (true division); panics on failure, use [`Tensor::rdiv`] to get the error.")]
        impl Div<&Tensor> for $s {
            type Output = Tensor;
            fn div(self, rhs: &Tensor) -> Tensor {
                ok(rhs.rdiv(self), "/")
            }
        }
        impl Add<Tensor> for $s {
            type Output = Tensor;
            fn add(self, rhs: Tensor) -> Tensor {
                self + &rhs
            }
        }
        impl Mul<Tensor> for $s {
            type Output = Tensor;
            fn mul(self, rhs: Tensor) -> Tensor {
                self * &rhs
            }
        }
        impl Sub<Tensor> for $s {
            type Output = Tensor;
            fn sub(self, rhs: Tensor) -> Tensor {
                self - &rhs
            }
        }
        impl Div<Tensor> for $s {
            type Output = Tensor;
            fn div(self, rhs: Tensor) -> Tensor {
                self / &rhs
            }
        }
    )*};
}
scalar_lhs!(f64, i64);

// an integer on the right: &t + 2, &t - 2, &t * 2, &t / 2 (the methods with an int)
macro_rules! int_rhs {
    ($($s:ty),*) => {$(
        #[doc = concat!("`&t + ", stringify!($s), "`; panics on failure, use [`Tensor::add`] to get the error.")]
        impl Add<$s> for &Tensor {
            type Output = Tensor;
            fn add(self, rhs: $s) -> Tensor {
                ok(Tensor::add(self, rhs), "+")
            }
        }
        #[doc = concat!("`&t - ", stringify!($s), "`; panics on failure, use [`Tensor::sub`] to get the error.")]
        impl Sub<$s> for &Tensor {
            type Output = Tensor;
            fn sub(self, rhs: $s) -> Tensor {
                ok(Tensor::sub(self, rhs), "-")
            }
        }
        #[doc = concat!("`&t * ", stringify!($s), "`; panics on failure, use [`Tensor::mul`] to get the error.")]
        impl Mul<$s> for &Tensor {
            type Output = Tensor;
            fn mul(self, rhs: $s) -> Tensor {
                ok(Tensor::mul(self, rhs), "*")
            }
        }
        #[doc = concat!("`&t / ", stringify!($s), "` (true division); panics on failure, use [`Tensor::div`] to get the error.")]
        impl Div<$s> for &Tensor {
            type Output = Tensor;
            fn div(self, rhs: $s) -> Tensor {
                ok(Tensor::div(self, rhs), "/")
            }
        }
    )*};
}
int_rhs!(i64);

/// `-&a`; panics on failure (a bool tensor), use [`Tensor::neg`] to get the error.
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
