//! The float types arithmetic is carried out in, and e^x written so that loops
//! over it vectorize.
//!
//! libm's `expf` is a call per element with branches inside; softmax, `exp`,
//! `sigmoid` and the losses spend most of their time there. [`exp_f32`] has no
//! branches and no calls, so a loop over a slice compiles to SIMD code; it is within
//! 1 ulp of the correctly rounded result on every 97th f32 of its range (the test).

use super::WithDType;
use half::{bf16, f16};
use std::fmt;

/// The float types arithmetic is carried out in (f32 and f64).
pub trait Real: num_traits::Float + Send + Sync + 'static + fmt::Debug + Default {
    /// The error function.
    fn erf(self) -> Self;
    /// A constant.
    fn c(v: f64) -> Self;
    /// e^x, written so that loops over it vectorize (f32: within 1 ulp; f64: libm).
    fn vexp(self) -> Self;
    /// erf(x) within 5e-7 of the true value, written so that loops over it
    /// vectorize (f32: [`erf_f32`]; f64: libm). For GELU, where erf is added to 1
    /// and an absolute error is what counts; `erf` itself stays exact.
    fn verf(self) -> Self;
    /// tanh(x) within 3e-7 of the true value, written so that loops over it
    /// vectorize (f32: [`tanh_f32`]; f64: the standard library's). For tanh-GELU,
    /// as `verf` for GELU; `tanh` itself stays exact.
    fn vtanh(self) -> Self;
}

impl Real for f32 {
    #[inline(always)]
    fn erf(self) -> Self {
        libm::erff(self)
    }
    #[inline(always)]
    fn c(v: f64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn vexp(self) -> Self {
        exp_f32(self)
    }
    #[inline(always)]
    fn verf(self) -> Self {
        erf_f32(self)
    }
    #[inline(always)]
    fn vtanh(self) -> Self {
        tanh_f32(self)
    }
}

impl Real for f64 {
    #[inline(always)]
    fn erf(self) -> Self {
        libm::erf(self)
    }
    #[inline(always)]
    fn c(v: f64) -> Self {
        v
    }
    #[inline(always)]
    fn vexp(self) -> Self {
        self.exp()
    }
    #[inline(always)]
    fn verf(self) -> Self {
        libm::erf(self)
    }
    #[inline(always)]
    fn vtanh(self) -> Self {
        self.tanh()
    }
}

/// Element types on which floating-point math runs. f16 and bf16 compute in f32.
pub trait FloatDType: WithDType {
    /// The type arithmetic is carried out in.
    type Acc: Real + WithDType;
    fn to_acc(self) -> Self::Acc;
    fn from_acc(v: Self::Acc) -> Self;
}

macro_rules! float_dtype {
    ($t:ty, $acc:ty, $to:expr, $from:expr) => {
        impl FloatDType for $t {
            type Acc = $acc;
            #[inline(always)]
            fn to_acc(self) -> $acc {
                $to(self)
            }
            #[inline(always)]
            fn from_acc(v: $acc) -> Self {
                $from(v)
            }
        }
    };
}
impl FloatDType for f32 {
    type Acc = f32;
    #[inline(always)]
    fn to_acc(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_acc(v: f32) -> Self {
        v
    }
}
float_dtype!(f64, f64, |x| x, |v| v);
float_dtype!(f16, f32, |x: f16| x.to_f32(), f16::from_f32);
float_dtype!(bf16, f32, |x: bf16| x.to_f32(), bf16::from_f32);

/// e^x in f32 without branches: range reduction x = n·ln2 + r with |r| ≤ ln2/2, a
/// degree-7 polynomial for e^r, and 2^n applied as two exact power-of-two factors so
/// that subnormal results are rounded once and large inputs overflow to infinity.
/// exp(NaN) is NaN, exp(-inf) is 0 and exp(inf) is inf.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    // beyond these, e^x is 0 or inf in f32 anyway (e^-104 < half the smallest
    // subnormal; e^89 > f32::MAX); NaN passes through clamp
    let x = x.clamp(-104.0, 89.0);
    // adding 1.5·2^23 rounds to the nearest integer, whose bits are then the low bits
    // of the sum: n without a float-to-int conversion
    const SHIFT: f32 = 12_582_912.0;
    let k = x * std::f32::consts::LOG2_E + SHIFT;
    let n = k - SHIFT;
    let ni = (k.to_bits() as i32).wrapping_sub(SHIFT.to_bits() as i32);
    // ln 2 split in two: n·LN2_HI is exact for |n| < 2^15
    const LN2_HI: f32 = 0.693_359_4; // 0.693359375
    const LN2_LO: f32 = -2.121_944_4e-4;
    let r = x - n * LN2_HI - n * LN2_LO;
    // e^r = 1 + r + r²·p(r), p fitted on [-ln2/2, ln2/2]
    let p = 1.987_569_1e-4;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let y = p * (r * r) + r + 1.0;
    // 2^n = 2^(n/2) · 2^(n - n/2): both factors are normal for n in [-150, 129]
    let n1 = ni >> 1;
    let n2 = ni.wrapping_sub(n1);
    let s1 = f32::from_bits((n1.wrapping_add(127) << 23) as u32);
    let s2 = f32::from_bits((n2.wrapping_add(127) << 23) as u32);
    y * s1 * s2
}

/// erf(x) in f32 without branches, to an absolute error below 5e-7 (the formula's
/// 1.5e-7 and f32 rounding; PyTorch's CPU GELU is off by up to 1e-6): Abramowitz
/// and Stegun's formula 7.1.26, `1 - t·p(t)·e^(-x²)` with `t = 1 / (1 + 0.3275911·|x|)`,
/// the form PyTorch's vectorised CPU kernels use for GELU. Its relative error is
/// large near 0 (the 1 cancels), so it serves where erf is added to 1.
#[inline(always)]
pub(crate) fn erf_f32(x: f32) -> f32 {
    // plain multiply-adds: `mul_add` is a library call where the build has no FMA
    let a = x.abs();
    let t = 1.0 / (0.327_591_1 * a + 1.0);
    let p = 1.061_405_4 * t - 1.453_152;
    let p = p * t + 1.421_413_8;
    let p = p * t - 0.284_496_73;
    let p = p * t + 0.254_829_6;
    let e = exp_f32(-(x * x));
    // 1 - p·t·e^(-x²), with x's sign (NaN stays NaN through the product)
    (-(p * t) * e + 1.0).copysign(x)
}

/// tanh(x) in f32 without branches, as 1 - 2/(e^(2|x|) + 1) with x's sign: within
/// 3e-7 of tanh(x) absolutely (relatively much worse near 0, where the
/// subtraction cancels: what tanh-GELU adds it to 1 for does not see that).
/// NaN stays NaN, ±inf gives ±1.
#[inline(always)]
pub(crate) fn tanh_f32(x: f32) -> f32 {
    let e = exp_f32(2.0 * x.abs());
    (1.0 - 2.0 / (e + 1.0)).copysign(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tanh_f32_is_within_3e7_of_tanh() {
        let mut worst = 0f64;
        let mut x = -12.0f32;
        while x <= 12.0 {
            let err = (tanh_f32(x) as f64 - (x as f64).tanh()).abs();
            worst = worst.max(err);
            x += 1.0 / 4096.0;
        }
        assert!(worst < 3e-7, "worst absolute error {worst:e}");
        assert!(tanh_f32(f32::NAN).is_nan());
        assert_eq!(tanh_f32(f32::INFINITY), 1.0);
        assert_eq!(tanh_f32(f32::NEG_INFINITY), -1.0);
        assert_eq!(tanh_f32(0.0), 0.0);
    }

    /// Distance in units in the last place between two finite f32 of one sign.
    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn erf_f32_is_within_5e7_of_erf() {
        let mut worst = 0f64;
        let mut x = -8.0f32;
        while x <= 8.0 {
            let err = (erf_f32(x) as f64 - libm::erf(x as f64)).abs();
            worst = worst.max(err);
            x += 1.0 / 4096.0;
        }
        assert!(worst < 5e-7, "worst absolute error {worst:e}");
        assert!(erf_f32(f32::NAN).is_nan());
        assert_eq!(erf_f32(f32::INFINITY), 1.0);
        assert_eq!(erf_f32(f32::NEG_INFINITY), -1.0);
    }

    #[test]
    fn exp_is_within_one_ulp_across_the_range() {
        // every 97th f32 between -104 and 89 (about 22 million values), against f64
        let mut worst = (0u32, 0f32);
        let mut checked = 0u64;
        for sign in [0u32, 1u32] {
            let top = if sign == 0 { 89f32 } else { 104f32 };
            let mut b = 0u32;
            while b <= top.to_bits() {
                let x = f32::from_bits(b | (sign << 31));
                let want = (x as f64).exp() as f32;
                let got = exp_f32(x);
                let e = ulps(got, want);
                if e > worst.0 {
                    worst = (e, x);
                }
                checked += 1;
                b += 97;
            }
        }
        assert!(checked > 20_000_000);
        assert!(worst.0 <= 1, "{} ulp at x = {:e}", worst.0, worst.1);
    }

    #[test]
    fn exp_edges() {
        assert!(exp_f32(f32::NAN).is_nan());
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(-104.0), 0.0);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_f32(88.8), f32::INFINITY);
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(-0.0), 1.0);
        // the largest finite result and the subnormal range, against f64
        for x in [88.72f32, 88.7228, -87.0, -88.0, -95.5, -100.0, -103.2] {
            let want = (x as f64).exp() as f32;
            assert!(ulps(exp_f32(x), want) <= 1, "{x}: {} vs {want}", exp_f32(x));
        }
    }
}
