//! SIMD helpers for hot CPU loops: an AVX2 wrapper for loops LLVM vectorizes, and
//! sums and maxima of f32 slices written with intrinsics. (The branch-free e^x lives
//! with the float math traits in `dtype`.)

/// Runs `f` compiled for AVX-512 or AVX2, whichever the CPU has (and plainly
/// otherwise): the loops LLVM vectorizes inside `f` then use 512- or 256-bit
/// registers instead of the baseline's 128-bit SSE2. Meant for hot loops over
/// slices; `f` is inlined into each copy, so keep it small. The results are the
/// same in every copy: LLVM does not reorder float arithmetic or fuse
/// multiply-adds on its own, so only the width of the vectors changes.
#[inline(always)]
pub(crate) fn simd<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2")]
        unsafe fn wide<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        #[target_feature(enable = "avx2")]
        unsafe fn avx2<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        if avx512() {
            // SAFETY: the CPU supports these features, checked just above.
            return unsafe { wide(f) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { avx2(f) };
        }
    }
    f()
}

/// `true` when the CPU has the AVX-512 subsets [`simd`] compiles for.
#[cfg(target_arch = "x86_64")]
#[inline]
fn avx512() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512dq")
        && std::arch::is_x86_feature_detected!("avx512vl")
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
