//! Hyperbolic and inverse trigonometric functions and the special functions
//! (`erfc`, `erfinv`, `lgamma`, `digamma`, `polygamma`): one-input ops of the
//! kernels' vocabulary, with their in-place forms. Integer and bool inputs give
//! float32, float16 and bfloat16 compute in float32 and round once, as
//! PyTorch's unary float ops do.

use super::{grad, Tensor};
use crate::backend::op as ops;
use crate::error::{Error, Result};

macro_rules! special_methods {
    ($($(#[$doc:meta])* $name:ident / $inplace:ident, $op:expr, $rule:ident;)*) => {$(
        impl Tensor {
            $(#[$doc])*
            pub fn $name(&self) -> Result<Tensor> {
                self.unary_op(stringify!($name), &$op, grad::Unary::$rule)
            }
            #[doc = concat!("In-place [`", stringify!($name), "`](Self::", stringify!($name), ") (`Tensor.", stringify!($inplace), "`): float tensors only, since the result is a float; recorded by autograd as the other in-place ops are.")]
            pub fn $inplace(&self) -> Result<()> {
                self.unary_inplace(stringify!($inplace), &$op, grad::Unary::$rule)
            }
        }
    )*};
}

special_methods! {
    /// Hyperbolic sine (`torch.sinh`). Integers and bools give float32.
    ///
    /// ```
    /// # use ember::{Device, Tensor};
    /// let x = Tensor::new(&[0.0f64, 1.0], &Device::Cpu)?;
    /// assert_eq!(x.sinh()?.to_vec::<f64>()?, vec![0.0, 1f64.sinh()]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    sinh / sinh_, ops::Sinh, Sinh;
    /// Hyperbolic cosine (`torch.cosh`).
    cosh / cosh_, ops::Cosh, Cosh;
    /// Arcsine (`torch.asin`): NaN outside [-1, 1]; the gradient is
    /// `1/√(1 - x²)` (inf at ±1).
    asin / asin_, ops::Asin, Asin;
    /// Arccosine (`torch.acos`): NaN outside [-1, 1].
    acos / acos_, ops::Acos, Acos;
    /// Inverse hyperbolic sine (`torch.asinh`).
    asinh / asinh_, ops::Asinh, Asinh;
    /// Inverse hyperbolic cosine (`torch.acosh`): NaN below 1.
    acosh / acosh_, ops::Acosh, Acosh;
    /// Inverse hyperbolic tangent (`torch.atanh`): ±inf at ±1, NaN beyond.
    ///
    /// ```
    /// # use ember::{Device, Tensor};
    /// let x = Tensor::new(&[-1.0f32, 0.0, 1.0, 2.0], &Device::Cpu)?;
    /// let y = x.atanh()?.to_vec::<f32>()?;
    /// assert_eq!(&y[..3], &[f32::NEG_INFINITY, 0.0, f32::INFINITY]);
    /// assert!(y[3].is_nan());
    /// # Ok::<(), ember::Error>(())
    /// ```
    atanh / atanh_, ops::Atanh, Atanh;
    /// The complementary error function `1 - erf(x)` (`torch.erfc`), accurate
    /// where erf is near 1.
    erfc / erfc_, ops::Erfc, Erfc;
    /// The inverse error function (`torch.erfinv`): ±inf at ±1, NaN outside
    /// [-1, 1]. Its gradient is `√π/2 · e^(erfinv(x)²)`.
    ///
    /// ```
    /// # use ember::{Device, Tensor};
    /// let x = Tensor::new(&[0.5f64], &Device::Cpu)?;
    /// let back = x.erfinv()?.erf()?.to_vec::<f64>()?;
    /// assert!((back[0] - 0.5).abs() < 1e-15);
    /// # Ok::<(), ember::Error>(())
    /// ```
    erfinv / erfinv_, ops::Erfinv, Erfinv;
    /// `ln|Γ(x)|` (`torch.lgamma`): inf at 0 and the negative integers. Its
    /// gradient is [`digamma`](Self::digamma).
    lgamma / lgamma_, ops::Lgamma, Lgamma;
    /// ψ(x), the derivative of `lgamma` (`torch.digamma`): -inf at 0 (inf at
    /// -0), NaN at the negative integers, as in PyTorch. Its gradient is
    /// `polygamma(1, x)`.
    ///
    /// ```
    /// # use ember::{Device, Tensor};
    /// let x = Tensor::new(&[1.0f64], &Device::Cpu)?;
    /// let euler = 0.5772156649015329;
    /// assert!((x.digamma()?.to_vec::<f64>()?[0] + euler).abs() < 1e-15);
    /// # Ok::<(), ember::Error>(())
    /// ```
    digamma / digamma_, ops::Digamma, Digamma;
}

impl Tensor {
    /// ψ⁽ⁿ⁾(x), the n-th derivative of [`digamma`](Self::digamma)
    /// (`torch.polygamma(n, x)`; n = 0 is digamma). A negative `n` is an
    /// error, as in PyTorch. Its gradient is `polygamma(n + 1, x)`. At the
    /// poles (0, -1, -2, ...) the value is inf for odd n and -inf for even n
    /// (PyTorch gives a large finite value there for n = 1).
    ///
    /// ```
    /// # use ember::{Device, Tensor};
    /// let x = Tensor::new(&[1.0f64], &Device::Cpu)?;
    /// let trigamma = x.polygamma(1)?.to_vec::<f64>()?[0];
    /// assert!((trigamma - std::f64::consts::PI.powi(2) / 6.0).abs() < 1e-14);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn polygamma(&self, n: i64) -> Result<Tensor> {
        let n = polygamma_order("polygamma", n)?;
        if n == 0 {
            return self.digamma();
        }
        self.unary_op("polygamma", &ops::Polygamma(n), grad::Unary::Polygamma(n))
    }

    /// In-place [`polygamma`](Self::polygamma) (`Tensor.polygamma_(n)`).
    pub fn polygamma_(&self, n: i64) -> Result<()> {
        let n = polygamma_order("polygamma_", n)?;
        if n == 0 {
            return self.digamma_();
        }
        self.unary_inplace("polygamma_", &ops::Polygamma(n), grad::Unary::Polygamma(n))
    }
}

/// PyTorch's check of polygamma's order; beyond 170, `n!` overflows f64 and
/// every value would be infinite or NaN.
fn polygamma_order(op: &'static str, n: i64) -> Result<u32> {
    if n < 0 {
        return Err(Error::invalid(
            op,
            "polygamma(n, x) does not support negative n.",
        ));
    }
    u32::try_from(n.min(171)).map_err(|_| Error::invalid(op, "n is too large"))
}
