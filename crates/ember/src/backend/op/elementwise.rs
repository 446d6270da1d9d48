//! The elementwise operations: one-operand ([`UnaryOp`]), two-operand
//! ([`BinaryOp`]) and comparisons ([`CmpOp`]). Each op is a zero-sized struct whose
//! scalar functions are the CPU's definition of the op (f16/bf16 compute in f32,
//! integers wrap, bools act as `or`/`and`), and whose code names the same op in the
//! CUDA kernels (`U_*`, `B_*`, `C_*`, generated into their source from these
//! tables).

use super::special;
use crate::dtype::{FloatDType, Real, WithDType};
use half::{bf16, f16};

codes! {
    /// Unary operation codes (`U_*` in the kernels).
    pub(crate) enum UnaryCode prefix "U_" {
        Neg = 0 => "NEG",
        Abs = 1 => "ABS",
        Exp = 2 => "EXP",
        Log = 3 => "LOG",
        Sqrt = 4 => "SQRT",
        Tanh = 5 => "TANH",
        Sin = 6 => "SIN",
        Cos = 7 => "COS",
        Recip = 8 => "RECIP",
        Square = 9 => "SQUARE",
        Relu = 10 => "RELU",
        Sigmoid = 11 => "SIGMOID",
        Erf = 12 => "ERF",
        Gelu = 13 => "GELU",
        GeluTanh = 14 => "GELU_TANH",
        PowScalar = 15 => "POW_SCALAR",
        Clamp = 16 => "CLAMP",
        Silu = 17 => "SILU",
        Softplus = 18 => "SOFTPLUS",
        Elu = 19 => "ELU",
        LeakyRelu = 20 => "LEAKY_RELU",
        Log1p = 21 => "LOG1P",
        Expm1 = 22 => "EXPM1",
        Floor = 23 => "FLOOR",
        Ceil = 24 => "CEIL",
        Round = 25 => "ROUND",
        Trunc = 26 => "TRUNC",
        Sign = 27 => "SIGN",
        Rsqrt = 28 => "RSQRT",
        Log2 = 29 => "LOG2",
        Tan = 30 => "TAN",
        Atan = 31 => "ATAN",
        Hardsigmoid = 32 => "HARDSIGMOID",
        Hardswish = 33 => "HARDSWISH",
        Log10 = 34 => "LOG10",
        Selu = 35 => "SELU",
        Mish = 37 => "MISH",
        Sinh = 38 => "SINH",
        Cosh = 39 => "COSH",
        Asin = 40 => "ASIN",
        Acos = 41 => "ACOS",
        Asinh = 42 => "ASINH",
        Acosh = 43 => "ACOSH",
        Atanh = 44 => "ATANH",
        Erfc = 45 => "ERFC",
        Erfinv = 46 => "ERFINV",
        Lgamma = 47 => "LGAMMA",
        Digamma = 48 => "DIGAMMA",
        Polygamma = 49 => "POLYGAMMA",
    }
}

codes! {
    /// Binary operation codes (`B_*` in the kernels).
    pub(crate) enum BinaryCode prefix "B_" {
        Add = 0 => "ADD",
        Sub = 1 => "SUB",
        Mul = 2 => "MUL",
        Div = 3 => "DIV",
        Maximum = 4 => "MAXIMUM",
        Minimum = 5 => "MINIMUM",
        Pow = 6 => "POW",
        ReluBackward = 7 => "RELU_BACKWARD",
        Atan2 = 8 => "ATAN2",
        Remainder = 9 => "REMAINDER",
        Fmod = 10 => "FMOD",
        FloorDivide = 11 => "FLOOR_DIVIDE",
        GeluBackward = 12 => "GELU_BACKWARD",
        GeluTanhBackward = 13 => "GELU_TANH_BACKWARD",
    }
}

codes! {
    /// The six comparisons (`C_*` in the kernels).
    pub(crate) enum CmpOp prefix "C_" {
        Eq = 0 => "EQ",
        Ne = 1 => "NE",
        Lt = 2 => "LT",
        Le = 3 => "LE",
        Gt = 4 => "GT",
        Ge = 5 => "GE",
    }
}

/// A one-operand elementwise operation.
pub(crate) trait UnaryOp: Sync {
    /// Integer and bool inputs are converted to float32 first (exp, log, ...).
    const FLOAT_ONLY: bool;
    /// For ops PyTorch implements for floating-point dtypes only (activations such
    /// as GELU and SiLU), the name of its CPU kernel, which its error for an
    /// integer or bool input names.
    const FLOAT_KERNEL: Option<&'static str> = None;
    fn f<F: Real>(&self, x: F) -> F;
    fn i(&self, x: i64) -> i64 {
        self.f(x as f64) as i64
    }
    /// f16/bf16 slices are widened into float32 blocks first (see `num_float!`):
    /// for the float-only ops, whose bodies the compiler vectorises only in a
    /// loop of their own; a cheap op (relu, abs) runs faster converting as it
    /// goes.
    const WIDEN_IN_BLOCKS: bool = Self::FLOAT_ONLY || Self::FLOAT_KERNEL.is_some();
    /// The kernels' operation code and its two parameters.
    fn code(&self) -> (UnaryCode, f64, f64);
}

/// A two-operand elementwise operation on one dtype.
pub(crate) trait BinaryOp: Sync {
    fn f<F: Real>(&self, a: F, b: F) -> F;
    fn i(&self, a: i64, b: i64) -> i64;
    /// The kernels' operation code (also what selects the gradient rule).
    const CODE: BinaryCode;
    /// As `UnaryOp::WIDEN_IN_BLOCKS`: the GELU gradients (erf, e^x, tanh).
    const WIDEN_IN_BLOCKS: bool = matches!(
        Self::CODE,
        BinaryCode::GeluBackward | BinaryCode::GeluTanhBackward
    );
}

/// Element types that the arithmetic ops run on.
pub(crate) trait NumElem: WithDType {
    fn unary<O: UnaryOp>(op: &O, x: Self) -> Self;
    fn binary<O: BinaryOp>(op: &O, a: Self, b: Self) -> Self;
    /// `x ↦ op(x, s)` for a scalar `s`, which is converted to this dtype once.
    #[inline(always)]
    fn with_scalar<O: BinaryOp>(op: &O, s: super::Scalar) -> impl Fn(Self) -> Self + Sync {
        let y: Self = s.to();
        move |x| Self::binary(op, x, y)
    }
    /// `dst[i] = unary(op, src[i])` over slices of one length.
    #[inline(always)]
    fn unary_slice<O: UnaryOp>(op: &O, src: &[Self], dst: &mut [Self]) {
        each_unary(op, src, dst)
    }
    /// `dst[i] = binary(op, a[i], b[i])` over slices of one length.
    #[inline(always)]
    fn binary_slice<O: BinaryOp>(op: &O, a: &[Self], b: &[Self], dst: &mut [Self]) {
        each_binary(op, a, b, dst)
    }
}

/// `NumElem::unary_slice` element by element.
#[inline(always)]
fn each_unary<T: NumElem, O: UnaryOp>(op: &O, src: &[T], dst: &mut [T]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = T::unary(op, x);
    }
}

/// `NumElem::binary_slice` element by element.
#[inline(always)]
fn each_binary<T: NumElem, O: BinaryOp>(op: &O, a: &[T], b: &[T], dst: &mut [T]) {
    for ((d, &x), &y) in dst.iter_mut().zip(a).zip(b) {
        *d = T::binary(op, x, y);
    }
}

/// Elements of f16/bf16 widened at a time by the half types' slice maps (2 KiB
/// of float32 an operand: in L1).
const HALF_BLOCK: usize = 512;

/// A float type's element ops: in its accumulation type, rounded once.
macro_rules! float_elem_ops {
    ($t:ty) => {
        #[inline(always)]
        fn unary<O: UnaryOp>(op: &O, x: Self) -> Self {
            <$t>::from_acc(op.f(x.to_acc()))
        }
        #[inline(always)]
        fn binary<O: BinaryOp>(op: &O, a: Self, b: Self) -> Self {
            <$t>::from_acc(op.f(a.to_acc(), b.to_acc()))
        }
    };
}

macro_rules! num_float {
    ($t:ty) => {
        impl NumElem for $t {
            float_elem_ops!($t);
        }
    };
    // f16 and bf16 compute in f32; for the ops that ask (WIDEN_IN_BLOCKS) their
    // slice maps widen a block into f32, run the op over it as float32's loop
    // runs (the compiler vectorises that loop where it gives up on one that also
    // converts: GELU in bf16 was 11 times slower than in f32), then narrow it.
    // The same arithmetic, so the same bits.
    ($t:ty, half) => {
        impl NumElem for $t {
            float_elem_ops!($t);
            /// As PyTorch's kernels take a scalar: a product or quotient uses it
            /// in float32 (its opmath type), not first rounded to this dtype, so
            /// that `x * 1e-8` or `x / 1e5` is not 0; the other ops round it.
            #[inline(always)]
            fn with_scalar<O: BinaryOp>(op: &O, s: super::Scalar) -> impl Fn(Self) -> Self + Sync {
                let y: f32 = match O::CODE {
                    BinaryCode::Mul | BinaryCode::Div => s.to(),
                    _ => s.to::<$t>().to_acc(),
                };
                move |x| <$t>::from_acc(op.f(x.to_acc(), y))
            }
            #[inline(always)]
            fn unary_slice<O: UnaryOp>(op: &O, src: &[Self], dst: &mut [Self]) {
                if !O::WIDEN_IN_BLOCKS {
                    return each_unary(op, src, dst);
                }
                let mut buf = [0f32; HALF_BLOCK];
                for (s, d) in src.chunks(HALF_BLOCK).zip(dst.chunks_mut(HALF_BLOCK)) {
                    let buf = &mut buf[..s.len()];
                    for (w, x) in buf.iter_mut().zip(s) {
                        *w = x.to_acc();
                    }
                    for w in buf.iter_mut() {
                        *w = op.f(*w);
                    }
                    for (o, &w) in d.iter_mut().zip(buf.iter()) {
                        *o = <$t>::from_acc(w);
                    }
                }
            }
            #[inline(always)]
            fn binary_slice<O: BinaryOp>(op: &O, a: &[Self], b: &[Self], dst: &mut [Self]) {
                if !O::WIDEN_IN_BLOCKS {
                    return each_binary(op, a, b, dst);
                }
                let (mut wa, mut wb) = ([0f32; HALF_BLOCK], [0f32; HALF_BLOCK]);
                let blocks = a.chunks(HALF_BLOCK).zip(b.chunks(HALF_BLOCK));
                for ((x, y), d) in blocks.zip(dst.chunks_mut(HALF_BLOCK)) {
                    let (wa, wb) = (&mut wa[..x.len()], &mut wb[..x.len()]);
                    for ((p, q), (u, v)) in wa.iter_mut().zip(wb.iter_mut()).zip(x.iter().zip(y)) {
                        *p = u.to_acc();
                        *q = v.to_acc();
                    }
                    for (p, &q) in wa.iter_mut().zip(wb.iter()) {
                        *p = op.f(*p, q);
                    }
                    for (o, &w) in d.iter_mut().zip(wa.iter()) {
                        *o = <$t>::from_acc(w);
                    }
                }
            }
        }
    };
}
num_float!(f32);
num_float!(f64);
num_float!(f16, half);
num_float!(bf16, half);

impl NumElem for i64 {
    #[inline(always)]
    fn unary<O: UnaryOp>(op: &O, x: Self) -> Self {
        op.i(x)
    }
    #[inline(always)]
    fn binary<O: BinaryOp>(op: &O, a: Self, b: Self) -> Self {
        op.i(a, b)
    }
}

// u8 arithmetic wraps modulo 256, like PyTorch's.
impl NumElem for u8 {
    #[inline(always)]
    fn unary<O: UnaryOp>(op: &O, x: Self) -> Self {
        op.i(x as i64) as u8
    }
    #[inline(always)]
    fn binary<O: BinaryOp>(op: &O, a: Self, b: Self) -> Self {
        op.i(a as i64, b as i64) as u8
    }
}

// bool arithmetic: add is `or`, mul is `and`, maximum/minimum likewise (PyTorch's).
impl NumElem for bool {
    #[inline(always)]
    fn unary<O: UnaryOp>(op: &O, x: Self) -> Self {
        op.i(x as i64) != 0
    }
    #[inline(always)]
    fn binary<O: BinaryOp>(op: &O, a: Self, b: Self) -> Self {
        op.i(a as i64, b as i64) != 0
    }
}

macro_rules! binop {
    ($name:ident, |$a:ident, $b:ident| $f:expr, |$ia:ident, $ib:ident| $i:expr) => {
        pub(crate) struct $name;
        impl BinaryOp for $name {
            const CODE: BinaryCode = BinaryCode::$name;
            #[inline(always)]
            fn f<F: Real>(&self, $a: F, $b: F) -> F {
                $f
            }
            #[inline(always)]
            fn i(&self, $ia: i64, $ib: i64) -> i64 {
                $i
            }
        }
    };
}
binop!(Add, |a, b| a + b, |a, b| a.wrapping_add(b));
binop!(Sub, |a, b| a - b, |a, b| a.wrapping_sub(b));
binop!(Mul, |a, b| a * b, |a, b| a.wrapping_mul(b));
// Division promotes integers to float before reaching a kernel; the integer body
// (truncating, 0 on division by zero) exists only to complete the trait.
binop!(Div, |a, b| a / b, |a, b| a.checked_div(b).unwrap_or(0));
binop!(
    Maximum,
    |a, b| if a.is_nan() || b.is_nan() {
        F::nan()
    } else {
        a.max(b)
    },
    |a, b| a.max(b)
);
binop!(
    Minimum,
    |a, b| if a.is_nan() || b.is_nan() {
        F::nan()
    } else {
        a.min(b)
    },
    |a, b| a.min(b)
);
binop!(Pow, |a, b| a.powf(b), |a, b| int_pow(a, b));
// The gradient of relu in one pass: `g` where `x > 0`, else 0.
binop!(
    ReluBackward,
    |g, x| if x > F::zero() { g } else { F::zero() },
    |g, x| if x > 0 { g } else { 0 }
);

// The gradient of (erf) GELU in one pass: `g · (Φ(x) + x·φ(x))` (floats only).
binop!(GeluBackward, |g, x| g * gelu_derivative(x), |g, _x| g);

/// d/dx of x·Φ(x): Φ(x) + x·φ(x), with the vectorisable erf and e^x.
#[inline(always)]
fn gelu_derivative<F: Real>(x: F) -> F {
    let cdf = F::c(0.5) * (F::one() + (x * F::c(std::f64::consts::FRAC_1_SQRT_2)).verf());
    let pdf = (F::c(-0.5) * x * x).vexp() * F::c(0.398_942_280_401_432_7);
    cdf + x * pdf
}

// The gradient of tanh-approximated GELU in one pass, as PyTorch's kernel writes
// it (the same terms in the same order, so the same NaN at ±inf).
binop!(
    GeluTanhBackward,
    |g, x| g * gelu_tanh_derivative(x),
    |g, _x| g
);

/// d/dx of x·(1 + tanh(β(x + κx³)))/2: the left factor's derivative plus the
/// right's, β = √(2/π), κ = 0.044715.
#[inline(always)]
fn gelu_tanh_derivative<F: Real>(x: F) -> F {
    let beta = F::c(0.797_884_560_802_865_4);
    let kappa = F::c(0.044715);
    let x_sq = x * x;
    let inner = beta * (x + kappa * (x_sq * x));
    let t = inner.vtanh();
    let left_derivative = F::c(0.5) * (F::one() + t);
    let tanh_derivative = F::one() - t * t;
    let inner_derivative = beta * (F::one() + F::c(3.0) * kappa * x_sq);
    left_derivative + F::c(0.5) * x * tanh_derivative * inner_derivative
}

binop!(Atan2, |a, b| a.atan2(b), |a, b| (a as f64).atan2(b as f64)
    as i64);
// Python's modulo: the result takes the divisor's sign. Integer division by zero
// is refused before a kernel runs (PyTorch's ZeroDivisionError).
binop!(
    Remainder,
    |a, b| {
        let m = a % b;
        if m != F::zero() && (b < F::zero()) != (m < F::zero()) {
            m + b
        } else {
            m
        }
    },
    |a, b| {
        let m = a.checked_rem(b).unwrap_or(0);
        if m != 0 && (b < 0) != (m < 0) {
            m.wrapping_add(b)
        } else {
            m
        }
    }
);
// C's fmod: the result takes the dividend's sign.
binop!(Fmod, |a, b| a % b, |a, b| a.checked_rem(b).unwrap_or(0));
binop!(FloorDivide, |a, b| floor_div(a, b), |a, b| {
    let q = a.wrapping_div(if b == 0 { 1 } else { b });
    if b != 0 && a.wrapping_rem(b) != 0 && (a < 0) != (b < 0) {
        q - 1
    } else {
        q
    }
});

/// `floor(a / b)` computed from `fmod` as PyTorch does, so that a quotient just
/// below an integer is not rounded up to it by the division.
#[inline(always)]
fn floor_div<F: Real>(a: F, b: F) -> F {
    if b == F::zero() {
        return a / b;
    }
    let m = a % b;
    let mut div = (a - m) / b;
    if m != F::zero() && (b < F::zero()) != (m < F::zero()) {
        div = div - F::one();
    }
    if div == F::zero() {
        return F::zero().copysign(a / b);
    }
    let mut q = div.floor();
    if div - q > F::c(0.5) {
        q = q + F::one();
    }
    q
}

fn int_pow(a: i64, b: i64) -> i64 {
    if b >= 0 {
        a.wrapping_pow(b.min(u32::MAX as i64) as u32)
    } else {
        // the integer part of a^b for negative b
        match a {
            1 => 1,
            -1 => {
                if b % 2 == 0 {
                    1
                } else {
                    -1
                }
            }
            _ => 0,
        }
    }
}

macro_rules! unop {
    ($name:ident, $float_only:expr, |$x:ident| $f:expr) => {
        pub(crate) struct $name;
        impl UnaryOp for $name {
            const FLOAT_ONLY: bool = $float_only;
            #[inline(always)]
            fn f<F: Real>(&self, $x: F) -> F {
                $f
            }
            fn code(&self) -> (UnaryCode, f64, f64) {
                (UnaryCode::$name, 0.0, 0.0)
            }
        }
    };
    ($name:ident, kernel $kernel:literal, |$x:ident| $f:expr) => {
        pub(crate) struct $name;
        impl UnaryOp for $name {
            const FLOAT_ONLY: bool = false;
            const FLOAT_KERNEL: Option<&'static str> = Some($kernel);
            #[inline(always)]
            fn f<F: Real>(&self, $x: F) -> F {
                $f
            }
            fn code(&self) -> (UnaryCode, f64, f64) {
                (UnaryCode::$name, 0.0, 0.0)
            }
        }
    };
    ($name:ident, $float_only:expr, |$x:ident| $f:expr, |$ix:ident| $i:expr) => {
        pub(crate) struct $name;
        impl UnaryOp for $name {
            const FLOAT_ONLY: bool = $float_only;
            #[inline(always)]
            fn f<F: Real>(&self, $x: F) -> F {
                $f
            }
            #[inline(always)]
            fn i(&self, $ix: i64) -> i64 {
                $i
            }
            fn code(&self) -> (UnaryCode, f64, f64) {
                (UnaryCode::$name, 0.0, 0.0)
            }
        }
    };
}
unop!(Neg, false, |x| -x, |x| x.wrapping_neg());
unop!(Abs, false, |x| x.abs(), |x| x.wrapping_abs());
unop!(Exp, true, |x| x.vexp());
unop!(Log, true, |x| x.ln());
unop!(Sqrt, true, |x| x.sqrt());
unop!(Tanh, true, |x| x.tanh());
unop!(Sin, true, |x| x.sin());
unop!(Cos, true, |x| x.cos());
unop!(Recip, true, |x| x.recip());
unop!(Square, false, |x| x * x, |x| x.wrapping_mul(x));
unop!(
    Relu,
    false,
    |x| if x > F::zero() || x.is_nan() {
        x
    } else {
        F::zero()
    },
    |x| x.max(0)
);
unop!(Sigmoid, true, |x| F::one() / (F::one() + (-x).vexp()));
unop!(Erf, true, |x| x.erf());
unop!(Log1p, true, |x| x.ln_1p());
unop!(Expm1, true, |x| x.exp_m1());
unop!(Rsqrt, true, |x| x.sqrt().recip());
unop!(Log2, true, |x| x.log2());
unop!(Log10, true, |x| x.log10());
unop!(Tan, true, |x| x.tan());
unop!(Atan, true, |x| x.atan());
unop!(Sinh, true, |x| x.sinh());
unop!(Cosh, true, |x| x.cosh());
unop!(Asin, true, |x| x.asin());
unop!(Acos, true, |x| x.acos());
unop!(Asinh, true, |x| x.asinh());
unop!(Acosh, true, |x| x.acosh());
unop!(Atanh, true, |x| x.atanh());
// float32 through libm's float32 functions (PyTorch's CPU calls the C
// library's `erfcf` and `lgammaf`), float64 through the double ones
unop!(Erfc, true, |x| match in_f32(x) {
    Some(v) => F::c(libm::erfcf(v) as f64),
    None => F::c(libm::erfc(to_f64(x))),
});
unop!(Lgamma, true, |x| match in_f32(x) {
    Some(v) => F::c(libm::lgammaf(v) as f64),
    None => F::c(libm::lgamma(to_f64(x))),
});
// computed in f64 (backend/op/special.rs) and rounded once
unop!(Erfinv, true, |x| F::c(special::erfinv(to_f64(x))));
unop!(Digamma, true, |x| F::c(special::digamma(to_f64(x))));

/// `x` as f64 (exact for both float types).
#[inline(always)]
fn to_f64<F: Real>(x: F) -> f64 {
    x.to_f64().unwrap_or(f64::NAN)
}

/// `x` as f32 where `F` is f32, else `None`.
#[inline(always)]
fn in_f32<F: Real>(x: F) -> Option<f32> {
    (std::mem::size_of::<F>() == 4).then(|| x.to_f32().unwrap_or(f32::NAN))
}

/// The n-th derivative of digamma, `ψ⁽ⁿ⁾(x)` (`torch.polygamma`; `n = 0` is
/// digamma), computed in f64 (backend/op/special.rs) and rounded once.
pub(crate) struct Polygamma(pub u32);
impl UnaryOp for Polygamma {
    const FLOAT_ONLY: bool = true;
    #[inline(always)]
    fn f<F: Real>(&self, x: F) -> F {
        F::c(special::polygamma(self.0, to_f64(x)))
    }
    fn code(&self) -> (UnaryCode, f64, f64) {
        (UnaryCode::Polygamma, self.0 as f64, 0.0)
    }
}
// rounding leaves integers as they are (PyTorch returns a copy)
unop!(Floor, false, |x| x.floor(), |x| x);
unop!(Ceil, false, |x| x.ceil(), |x| x);
unop!(Trunc, false, |x| x.trunc(), |x| x);
// halves to even, as PyTorch's (and IEEE's default) rounding
unop!(
    Round,
    false,
    |x| {
        let r = x.round();
        if (r - x).abs() == F::c(0.5) {
            (x * F::c(0.5)).round() * F::c(2.0)
        } else {
            r
        }
    },
    |x| x
);
// -1, 0 or 1; NaN gives 0, as in PyTorch
unop!(
    Sign,
    false,
    |x| if x > F::zero() {
        F::one()
    } else if x < F::zero() {
        -F::one()
    } else {
        F::zero()
    },
    |x| x.signum()
);
unop!(Silu, kernel "silu_cpu", |x| x / (F::one() + (-x).vexp()));
// relu6(x + 3) / 6 and x · relu6(x + 3) / 6 (`F.hardsigmoid`, `F.hardswish`), in
// PyTorch's order of operations; NaN stays NaN
unop!(Hardsigmoid, kernel "hardsigmoid_cpu", |x| relu6(x + F::c(3.0)) / F::c(6.0));
unop!(Hardswish, kernel "hardswish_cpu", |x| x * relu6(x + F::c(3.0)) / F::c(6.0));

// SELU: `λ x` where `x > 0`, else `λ α (e^x - 1)`, as PyTorch's ELU kernel
// computes it (the constants rounded to the dtype, multiplied in it)
unop!(Selu, kernel "elu_cpu", |x| {
    let scale = F::c(SELU_SCALE);
    if x > F::zero() {
        x * scale
    } else {
        x.exp_m1() * (F::c(SELU_ALPHA) * scale)
    }
});
// Mish: `x · tanh(ln(1 + e^x))`, as PyTorch's kernel (no threshold: e^x = ∞
// gives x)
unop!(Mish, kernel "mish_cpu", |x| x * x.vexp().ln_1p().tanh());

/// SELU's `α`.
pub(crate) const SELU_ALPHA: f64 = 1.673_263_242_354_377_3;
/// SELU's `λ` (`scale`).
pub(crate) const SELU_SCALE: f64 = 1.050_700_987_355_480_5;

/// `min(max(x, 0), 6)`, NaN kept.
#[inline(always)]
fn relu6<F: Real>(x: F) -> F {
    if x < F::zero() {
        F::zero()
    } else if x > F::c(6.0) {
        F::c(6.0)
    } else {
        x
    }
}
unop!(Gelu, kernel "GeluKernelImpl", |x| F::c(0.5)
    * x
    * (F::one()
        + (x * F::c(std::f64::consts::FRAC_1_SQRT_2)).verf()));
unop!(GeluTanh, kernel "GeluKernelImpl", |x| {
    let k = F::c((2.0 / std::f64::consts::PI).sqrt());
    F::c(0.5) * x * (F::one() + (k * (x + F::c(0.044715) * x * x * x)).vtanh())
});

/// `x^e` for a scalar exponent, with fast paths for the common exponents. The
/// flag keeps `powf` for ±0.5 (PyTorch's CPU kernel for float16, whose
/// `std::pow` gives inf at -inf for 0.5, and inf at -0 and 0 at -inf for -0.5).
pub(crate) struct PowScalar(pub f64, pub bool);
impl UnaryOp for PowScalar {
    const FLOAT_ONLY: bool = false;
    #[inline(always)]
    fn f<F: Real>(&self, x: F) -> F {
        match self.0 {
            2.0 => x * x,
            0.5 if !self.1 => x.sqrt(),
            // PyTorch's rsqrt path: -0 gives -inf and -inf NaN (powf gives inf
            // and 0)
            -0.5 if !self.1 => F::one() / x.sqrt(),
            1.0 => x,
            e => x.powf(F::c(e)),
        }
    }
    fn i(&self, x: i64) -> i64 {
        int_pow(x, self.0 as i64)
    }
    fn code(&self) -> (UnaryCode, f64, f64) {
        (UnaryCode::PowScalar, self.0, 0.0)
    }
}

/// Clamps into `[lo, hi]`; NaN stays NaN.
pub(crate) struct Clamp(pub Option<f64>, pub Option<f64>);
impl UnaryOp for Clamp {
    const FLOAT_ONLY: bool = false;
    #[inline(always)]
    fn f<F: Real>(&self, x: F) -> F {
        let mut y = x;
        if let Some(lo) = self.0 {
            if y < F::c(lo) {
                y = F::c(lo);
            }
        }
        if let Some(hi) = self.1 {
            if y > F::c(hi) {
                y = F::c(hi);
            }
        }
        y
    }
    fn i(&self, x: i64) -> i64 {
        let mut y = x;
        if let Some(lo) = self.0 {
            y = y.max(lo.ceil() as i64);
        }
        if let Some(hi) = self.1 {
            y = y.min(hi.floor() as i64);
        }
        y
    }
    fn code(&self) -> (UnaryCode, f64, f64) {
        (
            UnaryCode::Clamp,
            self.0.unwrap_or(f64::NAN),
            self.1.unwrap_or(f64::NAN),
        )
    }
}

/// `log(1 + e^(βx)) / β`, and `x` itself where `βx > threshold` (`F.softplus`).
pub(crate) struct Softplus {
    pub beta: f64,
    pub threshold: f64,
}
impl UnaryOp for Softplus {
    const FLOAT_ONLY: bool = false;
    const FLOAT_KERNEL: Option<&'static str> = Some("softplus_cpu");
    #[inline(always)]
    fn f<F: Real>(&self, x: F) -> F {
        let bx = x * F::c(self.beta);
        if bx > F::c(self.threshold) {
            x
        } else {
            bx.vexp().ln_1p() / F::c(self.beta)
        }
    }
    fn code(&self) -> (UnaryCode, f64, f64) {
        (UnaryCode::Softplus, self.beta, self.threshold)
    }
}

/// `x` where `x > 0`, else `α (e^(s·x) - 1)`, as PyTorch's ELU kernel: `F.elu`
/// with `s = 1` (exact: `x · 1 = x`), `F.celu` with `s = 1/α` (the quotient
/// taken in double and rounded to the dtype).
pub(crate) struct Elu {
    pub alpha: f64,
    pub input_scale: f64,
}
impl UnaryOp for Elu {
    const FLOAT_ONLY: bool = false;
    const FLOAT_KERNEL: Option<&'static str> = Some("elu_cpu");
    #[inline(always)]
    fn f<F: Real>(&self, x: F) -> F {
        if x > F::zero() {
            x
        } else {
            (x * F::c(self.input_scale)).exp_m1() * F::c(self.alpha)
        }
    }
    fn code(&self) -> (UnaryCode, f64, f64) {
        (UnaryCode::Elu, self.alpha, self.input_scale)
    }
}

/// `x` where `x > 0`, else `slope · x` (`F.leaky_relu`).
pub(crate) struct LeakyRelu(pub f64);
impl UnaryOp for LeakyRelu {
    const FLOAT_ONLY: bool = false;
    const FLOAT_KERNEL: Option<&'static str> = Some("leaky_relu_cpu");
    #[inline(always)]
    fn f<F: Real>(&self, x: F) -> F {
        if x > F::zero() {
            x
        } else {
            x * F::c(self.0)
        }
    }
    fn code(&self) -> (UnaryCode, f64, f64) {
        (UnaryCode::LeakyRelu, self.0, 0.0)
    }
}
