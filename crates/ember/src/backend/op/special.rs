//! Special functions of the unary ops that neither the standard library nor
//! `libm` provides: the inverse error function, digamma and polygamma (through
//! the Hurwitz zeta function). Each is computed in f64 (float32 results are
//! rounded once); `kernels/elementwise.cu` computes the same formulas in double.

use std::f64::consts::PI;

/// erf⁻¹(y): NaN outside [-1, 1], ±inf at ±1, and the sign of `y` kept at ±0.
///
/// Method: Winitzki's closed-form approximation (relative error about 2e-3) as
/// the start, then three Halley steps on `erf(x) - y`, which converge
/// cubically to within an ulp or two of f64. Above |y| = 0.5 the residual is
/// taken as `(1 - |y|) - erfc(x)` (`1 - |y|` is exact there), so that the tails
/// keep their relative accuracy up to the largest f64 below 1.
pub(crate) fn erfinv(y: f64) -> f64 {
    if y.is_nan() || y.abs() > 1.0 {
        return f64::NAN;
    }
    if y.abs() == 1.0 {
        return f64::INFINITY.copysign(y);
    }
    if y == 0.0 {
        return y;
    }
    let a = y.abs();
    let mut x = if a < 1e-3 {
        // the series' first two terms: √π/2 (y + π y³/12)
        0.886_226_925_452_758 * (a + PI / 12.0 * a * a * a)
    } else {
        const W: f64 = 0.147;
        let l = (-a * a).ln_1p();
        let c = 2.0 / (PI * W) + 0.5 * l;
        ((c * c - l / W).sqrt() - c).sqrt()
    };
    // d/dx erf(x) = 2/√π e^{-x²}
    const TWO_OVER_SQRT_PI: f64 = std::f64::consts::FRAC_2_SQRT_PI;
    for _ in 0..3 {
        let f = if a > 0.5 {
            (1.0 - a) - libm::erfc(x)
        } else {
            libm::erf(x) - a
        };
        let d = TWO_OVER_SQRT_PI * (-x * x).exp();
        if d == 0.0 || f == 0.0 {
            break;
        }
        // Halley's step for erf: f'' = -2x f', so x -= f / (f' + x f)
        x -= f / (d + x * f);
    }
    x.copysign(y)
}

/// ψ(x), the logarithmic derivative of Γ, as PyTorch defines it at the poles:
/// -inf at +0, inf at -0, NaN at the negative integers and at -inf.
///
/// Method: the reflection ψ(x) = ψ(1 - x) - π / tan(πx) below 0, the recurrence
/// ψ(x) = ψ(x + 1) - 1/x up to x ≥ 10, then the asymptotic series
/// ln x - 1/(2x) - Σ B₂ₖ / (2k x²ᵏ) to k = 7, whose first omitted term is
/// below 1e-17 relative there.
pub(crate) fn digamma(x: f64) -> f64 {
    if x == 0.0 {
        return f64::INFINITY.copysign(-x);
    }
    if x.is_nan() || x == f64::NEG_INFINITY {
        return f64::NAN;
    }
    if x < 0.0 {
        if x == x.floor() {
            return f64::NAN;
        }
        // tan has period π: reduce πx exactly through the fractional part
        let frac = x - x.floor();
        return digamma(1.0 - x) - PI / (PI * frac).tan();
    }
    let mut x = x;
    let mut shift = 0.0;
    while x < 10.0 {
        shift -= 1.0 / x;
        x += 1.0;
    }
    // B₂ₖ / 2k for k = 1..=7
    const C: [f64; 7] = [
        1.0 / 12.0,
        -1.0 / 120.0,
        1.0 / 252.0,
        -1.0 / 240.0,
        1.0 / 132.0,
        -691.0 / 32760.0,
        1.0 / 12.0,
    ];
    let z = 1.0 / (x * x);
    let mut series = 0.0;
    for c in C.iter().rev() {
        series = series * z + c;
    }
    shift + x.ln() - 0.5 / x - series * z
}

/// ψ⁽ⁿ⁾(x), the n-th derivative of digamma (n ≥ 0; [`digamma`] for 0), as
/// `(-1)ⁿ⁺¹ n! ζ(n + 1, x)`.
pub(crate) fn polygamma(n: u32, x: f64) -> f64 {
    if n == 0 {
        return digamma(x);
    }
    let mut factorial = 1.0;
    for k in 2..=n {
        factorial *= k as f64;
    }
    let sign = if n % 2 == 1 { 1.0 } else { -1.0 };
    sign * factorial * hurwitz_zeta((n + 1) as f64, x)
}

/// The Hurwitz zeta function ζ(s, q) = Σₖ (q + k)⁻ˢ for s > 1: inf at the
/// poles q = 0, -1, -2, ...; NaN at q = -inf or NaN, and for q below -2²⁰,
/// where the direct terms below would number over a million.
///
/// Method: Euler–Maclaurin summation. The terms are added directly until
/// `q + k ≥ 10 + s`, then the tail is `a¹⁻ˢ/(s-1) + a⁻ˢ/2 + Σⱼ B₂ⱼ/(2j)!
/// s(s+1)…(s+2j-2) a⁻ˢ⁻²ʲ⁺¹` with ten Bernoulli terms, which at that `a`
/// decrease fast enough for f64 accuracy.
pub(crate) fn hurwitz_zeta(s: f64, q: f64) -> f64 {
    if q.is_nan() || q == f64::NEG_INFINITY || q < -1_048_576.0 {
        return f64::NAN;
    }
    if q <= 0.0 && q == q.floor() {
        return f64::INFINITY;
    }
    let mut a = q;
    let mut sum = 0.0;
    while a < 10.0 + s {
        sum += a.powf(-s);
        a += 1.0;
    }
    // B₂ⱼ / (2j)! for j = 1..=10
    const B: [f64; 10] = [
        1.0 / 12.0,
        -1.0 / 720.0,
        1.0 / 30240.0,
        -1.0 / 1209600.0,
        1.0 / 47900160.0,
        -691.0 / 1307674368000.0,
        1.0 / 74724249600.0,
        -3617.0 / 10670622842880000.0,
        43867.0 / 5109094217170944000.0,
        -174611.0 / 802857662698291200000.0,
    ];
    let a_s = a.powf(-s);
    let mut tail = a * a_s / (s - 1.0) + 0.5 * a_s;
    // s(s+1)…(s+2j-2) a^(-s-2j+1), built up term by term
    let mut rising = s * a_s / a;
    for (j, b) in B.iter().enumerate() {
        tail += b * rising;
        let k = 2.0 * (j as f64 + 1.0);
        rising *= (s + k - 1.0) * (s + k) / (a * a);
    }
    sum + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(got: f64, want: f64, rtol: f64) {
        assert!(
            (got - want).abs() <= rtol * want.abs(),
            "got {got:e}, want {want:e}"
        );
    }

    #[test]
    fn erfinv_inverts_erf() {
        for i in -999..=999 {
            let y = i as f64 / 1000.0;
            let x = erfinv(y);
            close(libm::erf(x), y, 4e-16);
        }
        // deep in the tails, through erfc: `1 - y` is exact there, and erfc
        // of the result gives it back
        for x in [3.0f64, 4.5, 5.8] {
            let y = 1.0 - libm::erfc(x);
            close(libm::erfc(erfinv(y)), 1.0 - y, 1e-13);
        }
        close(erfinv(1e-300), 0.886_226_925_452_758e-300, 1e-15);
        assert_eq!(erfinv(1.0), f64::INFINITY);
        assert!(erfinv(1.0 + 1e-15).is_nan());
        assert!(erfinv(-0.0).is_sign_negative());
    }

    #[test]
    fn digamma_and_polygamma_at_known_values() {
        let euler = 0.577_215_664_901_532_9;
        close(digamma(1.0), -euler, 1e-15);
        close(digamma(0.5), -euler - 2.0 * 2f64.ln(), 1e-15);
        // (the expected value cancels to 0.036 from terms near 2)
        close(digamma(-0.5), -euler - 2.0 * 2f64.ln() + 2.0, 1e-12);
        close(polygamma(1, 1.0), PI * PI / 6.0, 1e-15);
        close(polygamma(1, 0.5), PI * PI / 2.0, 1e-15);
        // ψ''(1) = -2 ζ(3)
        close(polygamma(2, 1.0), -2.0 * 1.202_056_903_159_594_3, 1e-15);
        // ψ'''(1) = 6 ζ(4) = π⁴/15
        close(polygamma(3, 1.0), PI.powi(4) / 15.0, 1e-15);
        // the recurrence across 0: ψ'(x) = ψ'(x + 1) + 1/x²
        close(polygamma(1, -0.3), polygamma(1, 0.7) + 1.0 / 0.09, 1e-14);
        assert_eq!(digamma(0.0), f64::NEG_INFINITY);
        assert!(digamma(-2.0).is_nan());
        assert_eq!(polygamma(1, -1.0), f64::INFINITY);
        assert_eq!(polygamma(2, 0.0), f64::NEG_INFINITY);
    }
}
