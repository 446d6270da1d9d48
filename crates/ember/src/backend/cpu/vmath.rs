//! Math functions written so that loops over them vectorize.
//!
//! libm's `expf` is a call per element with branches inside; softmax, `exp`,
//! `sigmoid` and the losses spend most of their time there. [`exp_f32`] has no
//! branches and no calls, so a loop over a slice compiles to SIMD code; it is within
//! 1 ulp of the correctly rounded result on every 97th f32 of its range (the test).

/// Runs `f` compiled for AVX2 when the CPU has it (and plainly otherwise): the
/// loops LLVM vectorizes inside `f` then use 256-bit registers instead of the
/// baseline's 128-bit SSE2. Meant for hot loops over slices; `f` is inlined into
/// the AVX2 copy, so keep it small.
#[inline(always)]
pub(crate) fn simd<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2")]
        unsafe fn avx2<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { avx2(f) };
        }
    }
    f()
}

/// Sum of an f32 slice in 32 independent lanes, combined pairwise (the same order
/// with and without AVX). LLVM turns a generic many-lane loop into interleaved
/// scalar reductions instead of vector adds, so the AVX path is written with
/// intrinsics.
pub(crate) fn sum_f32(x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: the CPU supports AVX, checked just above.
        return unsafe { x86::sum_f32_avx(x) };
    }
    let mut lanes = [0f32; 32];
    let chunks = x.chunks_exact(32);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, &v) in lanes.iter_mut().zip(c) {
            *a += v;
        }
    }
    // fold the four groups of 8 as the AVX registers are folded
    let mut l8 = [0f32; 8];
    for (j, l) in l8.iter_mut().enumerate() {
        *l = (lanes[j] + lanes[8 + j]) + (lanes[16 + j] + lanes[24 + j]);
    }
    fold8(l8) + rest.iter().sum::<f32>()
}

/// The largest element of an f32 slice, NaN if it holds one, -inf if empty.
pub(crate) fn max_f32(x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: the CPU supports AVX, checked just above.
        return unsafe { x86::max_f32_avx(x) };
    }
    x.iter().fold(
        f32::NEG_INFINITY,
        |a, &b| {
            if b > a || b.is_nan() {
                b
            } else {
                a
            }
        },
    )
}

#[inline(always)]
fn fold8(l: [f32; 8]) -> f32 {
    ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]))
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx")]
    pub(super) unsafe fn sum_f32_avx(x: &[f32]) -> f32 {
        let mut acc = [_mm256_setzero_ps(); 4];
        let chunks = x.chunks_exact(32);
        let rest = chunks.remainder();
        for c in chunks {
            for (k, a) in acc.iter_mut().enumerate() {
                // SAFETY: `c` holds 32 floats; 8 are read from 8·k (k < 4).
                *a = _mm256_add_ps(*a, unsafe { _mm256_loadu_ps(c.as_ptr().add(8 * k)) });
            }
        }
        let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let mut l = [0f32; 8];
        // SAFETY: `l` has room for 8 floats.
        unsafe { _mm256_storeu_ps(l.as_mut_ptr(), v) };
        super::fold8(l) + rest.iter().sum::<f32>()
    }

    #[target_feature(enable = "avx")]
    pub(super) unsafe fn max_f32_avx(x: &[f32]) -> f32 {
        let mut best = [_mm256_set1_ps(f32::NEG_INFINITY); 4];
        // lanes that have met NaN (all bits set)
        let mut nan = _mm256_setzero_ps();
        let chunks = x.chunks_exact(32);
        let rest = chunks.remainder();
        for c in chunks {
            for (k, b) in best.iter_mut().enumerate() {
                // SAFETY: `c` holds 32 floats; 8 are read from 8·k (k < 4).
                let v = unsafe { _mm256_loadu_ps(c.as_ptr().add(8 * k)) };
                nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
                *b = _mm256_max_ps(*b, v);
            }
        }
        if _mm256_movemask_ps(nan) != 0 || rest.iter().any(|v| v.is_nan()) {
            return f32::NAN;
        }
        let v = _mm256_max_ps(
            _mm256_max_ps(best[0], best[1]),
            _mm256_max_ps(best[2], best[3]),
        );
        let mut l = [0f32; 8];
        // SAFETY: `l` has room for 8 floats.
        unsafe { _mm256_storeu_ps(l.as_mut_ptr(), v) };
        l.into_iter()
            .chain(rest.iter().copied())
            .fold(f32::NEG_INFINITY, f32::max)
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance in units in the last place between two finite f32 of one sign.
    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
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
    fn sum_and_max_match_a_plain_loop() {
        // lengths around the 32-lane blocks, values with NaN and infinities mixed in
        for n in [0usize, 1, 7, 31, 32, 33, 64, 100, 1000, 4099] {
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.25)
                .collect();
            let want: f64 = x.iter().map(|&v| v as f64).sum();
            assert!((sum_f32(&x) as f64 - want).abs() <= 1e-3, "sum of {n}");
            let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(max_f32(&x), m, "max of {n}");
            if n > 0 {
                for at in [0, n / 2, n - 1] {
                    let mut y = x.clone();
                    y[at] = f32::NAN;
                    assert!(max_f32(&y).is_nan(), "NaN at {at} of {n}");
                    assert!(sum_f32(&y).is_nan());
                    y[at] = f32::INFINITY;
                    assert_eq!(max_f32(&y), f32::INFINITY);
                }
            }
        }
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
