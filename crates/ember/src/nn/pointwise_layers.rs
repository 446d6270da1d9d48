//! The smaller activations of `torch.nn` that the tensor layer has no method
//! for (`logsigmoid`, `softsign`, `tanhshrink`, `softshrink`, `hardshrink`,
//! `threshold`, `glu`, `softmin`), channel dropout (`dropout1d`, `dropout2d`,
//! `dropout3d`), and their modules, with `LogSoftmax` and `Unflatten`.
//!
//! Each function is a composite of tensor ops, so it runs on every device
//! (meta included) and autograd derives its gradient; where a composite would
//! give another gradient than PyTorch's at a kink, the composite is chosen so
//! that it does not (see [`logsigmoid`]).

use super::Module;
use crate::backend::generator::Generator;
use crate::{
    dtype::DType,
    error::{Error, Result},
    layout::normalize_dim,
    tensor::{Scalar, Tensor},
};

/// `Ok` for a floating-point `x`, else PyTorch's error naming `kernel`.
fn float_only(op: &'static str, kernel: &str, x: &Tensor) -> Result<()> {
    if x.dtype().is_float() {
        Ok(())
    } else {
        Err(crate::tensor::not_implemented_for(op, kernel, x.dtype()))
    }
}

/// `x` with float16 and bfloat16 computed in float32 and rounded once at the
/// end, as PyTorch's kernels compute them; other dtypes as they are.
fn in_opmath(x: &Tensor, f: impl FnOnce(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
    match x.dtype() {
        DType::F16 | DType::BF16 => f(&x.to_dtype(DType::F32)?)?.to_dtype(x.dtype()),
        _ => f(x),
    }
}

/// `log(sigmoid(x))` (`F.logsigmoid`), computed as PyTorch's kernel computes
/// it, `min(x, 0) - log(1 + e^-|x|)`, so that it neither overflows nor loses
/// the small term for large `|x|`: `logsigmoid(-800)` is -800 and
/// `logsigmoid(30)` about `-9.4e-14`. The gradient is PyTorch's,
/// `sigmoid(-x)`, 0.5 at 0 (the kinks of `min` and `|x|` cancel there: a
/// tie of `minimum` splits the gradient, and `|x|`'s gradient at 0 is 0).
/// Floating-point only; float16 and bfloat16 compute in float32.
///
/// ```
/// use ember::nn::functional::logsigmoid;
/// # use ember::{Device, Tensor};
/// let x = Tensor::new(&[-800.0f64, 0.0, 30.0], &Device::Cpu)?;
/// let y = logsigmoid(&x)?.to_vec::<f64>()?;
/// assert_eq!(y[0], -800.0);
/// assert!((y[1] + std::f64::consts::LN_2).abs() < 1e-15);
/// assert!(y[2] < 0.0 && y[2] > -1e-13);
/// # Ok::<(), ember::Error>(())
/// ```
pub fn logsigmoid(x: &Tensor) -> Result<Tensor> {
    float_only("logsigmoid", "log_sigmoid_cpu", x)?;
    in_opmath(x, |x| {
        let tail = x.abs()?.neg()?.exp()?.log1p()?;
        x.minimum(0.0)?.sub(&tail)
    })
}

/// `x / (1 + |x|)` (`F.softsign`), as PyTorch writes it (an integer input
/// gives float32, as true division does).
pub fn softsign(x: &Tensor) -> Result<Tensor> {
    x.div(&x.abs()?.add(1.0)?)
}

/// `x - tanh(x)` (`F.tanhshrink`), as PyTorch writes it.
pub fn tanhshrink(x: &Tensor) -> Result<Tensor> {
    x.sub(&x.tanh()?)
}

/// The largest finite value of a floating-point dtype, as PyTorch's C++
/// messages print it.
fn printed_max(dt: DType) -> &'static str {
    match dt {
        DType::F64 => "1.79769e+308",
        DType::F16 => "65504",
        DType::BF16 => "3.38953e+38",
        _ => "3.40282e+38",
    }
}

/// `v` as C++'s default stream formatting prints a double (`%g`: six
/// significant digits, the exponent form outside `[1e-4, 1e6)`).
fn printed(v: f64) -> String {
    if !v.is_finite() || v == 0.0 {
        return format!("{v}").replace("NaN", "nan");
    }
    let exp = v.abs().log10().floor() as i32;
    if (-4..6).contains(&exp) {
        let digits = (5 - exp).max(0) as usize;
        let s = format!("{v:.digits$}");
        let s = if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.')
        } else {
            &s
        };
        s.to_string()
    } else {
        let s = format!("{v:.5e}");
        let (mantissa, e) = s.split_once('e').unwrap_or((&s, "0"));
        let mantissa = if mantissa.contains('.') {
            mantissa.trim_end_matches('0').trim_end_matches('.')
        } else {
            mantissa
        };
        let e: i32 = e.parse().unwrap_or(0);
        format!("{mantissa}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs())
    }
}

/// `x - λ` above `λ`, `x + λ` below `-λ`, and `0` between, bounds included
/// (`F.softshrink`; PyTorch's default `λ` is 0.5). As PyTorch's kernel: the
/// middle is `x · 0` (a NaN stays NaN, a negative input gives -0), and the
/// gradient is 0 on `[-λ, λ]`, the bounds included. Floating-point only; `λ`
/// must lie in `[0, max]` of the dtype (PyTorch's error otherwise).
pub fn softshrink(x: &Tensor, lambd: f64) -> Result<Tensor> {
    float_only("softshrink", "softshrink_check", x)?;
    let max = match x.dtype() {
        DType::F64 => f64::MAX,
        DType::F16 => 65504.0,
        DType::BF16 => half::bf16::MAX.to_f64(),
        _ => f32::MAX as f64,
    };
    if !(0.0..=max).contains(&lambd) {
        return Err(Error::invalid(
            "softshrink",
            format!(
                "lambda must be in range [0, {}] for input dtype {}, but found {}",
                printed_max(x.dtype()),
                crate::tensor::torch_dtype_name(x.dtype()),
                printed(lambd)
            ),
        ));
    }
    let (above, below) = (x.gt(lambd)?, x.lt(-lambd)?);
    // inside: x · 0 (a signed zero); a NaN is in neither interval and passes
    // its gradient through, as PyTorch's backward zeroes only [-λ, λ]
    let inside = x.isnan()?.where_(x, &x.mul(0.0)?)?;
    let middle = below.where_(&x.add(lambd)?, &inside)?;
    above.where_(&x.sub(lambd)?, &middle)
}

/// `0` on `[-λ, λ]` (the bounds included), `x` elsewhere (`F.hardshrink`;
/// PyTorch's default `λ` is 0.5), with the gradient 0 on that interval. A
/// NaN stays NaN; a negative `λ` leaves every value. Floating-point only.
pub fn hardshrink(x: &Tensor, lambd: f64) -> Result<Tensor> {
    float_only("hardshrink", "hardshrink_cpu", x)?;
    let inside = x.ge(-lambd)?.logical_and(&x.le(lambd)?)?;
    inside.where_(0.0, x)
}

/// `value` where `x <= threshold`, `x` elsewhere (`F.threshold(x, threshold,
/// value, inplace)`), with the gradient 0 where the value replaced `x`. As
/// PyTorch: an integer tensor stays integer, both numbers truncated to
/// integers; float16 and bfloat16 compare in float32. Bool is refused.
/// `inplace` writes into `x` and returns it, as the in-place activations do
/// (a new tensor where autograd records through a view, which ember cannot
/// yet write in place).
pub fn threshold(x: &Tensor, threshold: f64, value: f64, inplace: bool) -> Result<Tensor> {
    const OP: &str = "threshold";
    let (at, value) = match x.dtype() {
        DType::Bool => {
            return Err(crate::tensor::not_implemented_for(
                OP,
                "threshold_cpu",
                DType::Bool,
            ))
        }
        dt if dt.is_float() => (Scalar::Float(threshold), Scalar::Float(value)),
        _ => (Scalar::Int(threshold as i64), Scalar::Int(value as i64)),
    };
    let replaced = match x.dtype() {
        DType::F16 | DType::BF16 => x.to_dtype(DType::F32)?.le(at)?,
        _ => x.le(at)?,
    };
    if inplace && !x.inplace_blocked_by_views() {
        x.masked_fill_(&replaced, value)?;
        Ok(x.clone())
    } else {
        x.masked_fill(&replaced, value)
    }
}

/// The gated linear unit (`F.glu(x, dim)`; PyTorch's default `dim` is -1):
/// `x` split in two halves along `dim`, `a · sigmoid(b)`. The dim's size must
/// be even; a 0-d tensor and integer dtypes are refused, as in PyTorch.
pub fn glu(x: &Tensor, dim: i64) -> Result<Tensor> {
    const OP: &str = "glu";
    if x.rank() == 0 {
        return Err(Error::invalid(
            OP,
            "glu does not support scalars because halving size must be even",
        ));
    }
    let d = normalize_dim(OP, dim, x.rank())?;
    let n = x.shape()[d];
    if !n.is_multiple_of(2) {
        return Err(Error::invalid(
            OP,
            format!("Halving dimension must be even, but dimension {d} is size {n}"),
        ));
    }
    float_only(OP, "glu_cpu", x)?;
    let half = n / 2;
    let a = x.narrow(d as i64, 0, half)?;
    let b = x.narrow(d as i64, half as i64, half)?;
    a.mul(&b.sigmoid()?)
}

/// `softmax(-x)` along `dim` (`F.softmin(x, dim)`), as PyTorch writes it.
pub fn softmin(x: &Tensor, dim: i64) -> Result<Tensor> {
    x.neg()?.softmax(dim)
}

/// Where channel dropout finds the channels of an input of `rank` dims: `Batched`
/// reads `[N, C, ...]` (a mask of `[N, C, 1, ...]`), `Unbatched` `[C, ...]`
/// (PyTorch adds a batch dim of 1 first).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Channels {
    Batched,
    Unbatched,
}

/// Checks `p` (PyTorch's message, for every channel dropout).
fn check_p(op: &'static str, p: f64) -> Result<()> {
    if (0.0..=1.0).contains(&p) {
        Ok(())
    } else {
        Err(Error::invalid(
            op,
            format!("dropout probability has to be between 0 and 1, but got {p}"),
        ))
    }
}

/// PyTorch's `feature_dropout`: each channel of `x` zeroed with probability
/// `p` (one draw per channel from the generator in scope, or `generator`),
/// the others scaled by `1 / (1 - p)`; `x` itself when not `training` or at
/// `p = 0`. With `inplace` the result is written into `x` (see
/// [`threshold`] for when it cannot be).
fn feature_dropout(
    x: &Tensor,
    p: f64,
    training: bool,
    inplace: bool,
    channels: Channels,
    generator: Option<&Generator>,
) -> Result<Tensor> {
    let _record = crate::profiler::function("feature_dropout");
    if !training || p == 0.0 {
        return Ok(x.clone());
    }
    let write = inplace && !x.inplace_blocked_by_views();
    if p == 1.0 && write {
        // (PyTorch multiplies by zero: a NaN stays NaN)
        if x.dtype().is_float() {
            x.mul_(0.0)?;
        } else {
            x.zero_()?;
        }
        return Ok(x.clone());
    }
    if let Some(y) = super::functional::dropout_corner(x, p)? {
        return Ok(y);
    }
    // (the rank as PyTorch sees it: an unbatched input gains a batch dim)
    let lead = usize::from(channels == Channels::Batched) + 1;
    if x.rank() + 2 - lead < 2 {
        return Err(Error::invalid(
            "feature_dropout",
            "Feature dropout requires at least 2 dimensions in the input",
        ));
    }
    let mut mask = x.shape().to_vec();
    mask[lead..].iter_mut().for_each(|n| *n = 1);
    let draw = || Tensor::uniform(0.0, 1.0, &mask[..], DType::F32, &x.device());
    let u = match generator {
        Some(g) => g.scope(draw)?,
        None => draw()?,
    };
    let noise = u.ge(p)?.to_dtype(x.dtype())?.mul(1.0 / (1.0 - p))?;
    if write {
        x.mul_(&noise)?;
        Ok(x.clone())
    } else {
        x.mul(&noise)
    }
}

/// `dropout1d`'s rank rule: 2-D `[C, L]` or 3-D `[N, C, L]` only.
fn channels_1d(x: &Tensor) -> Result<Channels> {
    match x.rank() {
        2 => Ok(Channels::Unbatched),
        3 => Ok(Channels::Batched),
        r => Err(Error::invalid(
            "dropout1d",
            format!(
                "dropout1d: Expected 2D or 3D input, but received a {r}D input. Note that dropout1d exists to provide channel-wise dropout on inputs with 1 spatial dimension, a channel dimension, and an optional batch dimension (i.e. 2D or 3D inputs)."
            ),
        )),
    }
}

/// `dropout3d`'s rank rule: 5-D is batched, any other rank is read as one
/// sample (PyTorch warns below or above 4-D, and reads it so).
fn channels_3d(x: &Tensor) -> Channels {
    if x.rank() == 5 {
        Channels::Batched
    } else {
        Channels::Unbatched
    }
}

/// Zeroes whole channels of `[N, C, L]` (or unbatched `[C, L]`) with
/// probability `p` when `training`, scaling the rest by `1 / (1 - p)`
/// (`F.dropout1d`; PyTorch's defaults are `p = 0.5`, training). Other ranks are
/// refused, as in PyTorch.
pub fn dropout1d(x: &Tensor, p: f64, training: bool, inplace: bool) -> Result<Tensor> {
    check_p("dropout1d", p)?;
    let channels = channels_1d(x)?;
    feature_dropout(x, p, training, inplace, channels, None)
}

/// Zeroes whole channels of `[N, C, H, W]` with probability `p` when
/// `training`, scaling the rest by `1 / (1 - p)` (`F.dropout2d`). As PyTorch
/// 2.x: the second dim is always the channel, so a 3-D input is read as `[N,
/// C, L]` (PyTorch warns that this will change to an unbatched `[C, H, W]`),
/// a 2-D one as `[N, C]` (each element a channel), and an input of another
/// rank as `[N, C, ...]` too; 0-d and 1-D inputs are refused when a mask is
/// drawn.
pub fn dropout2d(x: &Tensor, p: f64, training: bool, inplace: bool) -> Result<Tensor> {
    check_p("dropout2d", p)?;
    feature_dropout(x, p, training, inplace, Channels::Batched, None)
}

/// Zeroes whole channels of `[N, C, D, H, W]` (or unbatched `[C, D, H, W]`)
/// with probability `p` when `training`, scaling the rest by `1 / (1 - p)`
/// (`F.dropout3d`). As PyTorch: any rank but 5 is read as one sample whose
/// first dim is the channel.
pub fn dropout3d(x: &Tensor, p: f64, training: bool, inplace: bool) -> Result<Tensor> {
    check_p("dropout3d", p)?;
    feature_dropout(x, p, training, inplace, channels_3d(x), None)
}

macro_rules! plain_activation {
    ($(#[$doc:meta])* $name:ident, $f:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct $name;

        impl Module for $name {
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                $f(x)
            }
        }
    };
}
plain_activation!(/// `log(sigmoid(x))`, computed stably (`nn.LogSigmoid`; see [`logsigmoid`]).
    LogSigmoid, logsigmoid);
plain_activation!(/// `x / (1 + |x|)` (`nn.Softsign`).
    Softsign, softsign);
plain_activation!(/// `x - tanh(x)` (`nn.Tanhshrink`).
    Tanhshrink, tanhshrink);

macro_rules! shrink {
    ($(#[$doc:meta])* $name:ident, $f:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq)]
        pub struct $name {
            /// The half-width of the interval around 0 (PyTorch's `lambd`).
            pub lambd: f64,
        }

        impl $name {
            #[doc = concat!("The module with half-width `lambd` (`nn.", stringify!($name), "(lambd)`).")]
            pub fn new(lambd: f64) -> $name {
                $name { lambd }
            }
        }

        impl Default for $name {
            fn default() -> Self {
                $name { lambd: 0.5 }
            }
        }

        impl Module for $name {
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                $f(x, self.lambd)
            }
        }
    };
}
shrink!(/// `x ∓ λ` outside `[-λ, λ]`, 0 inside (`nn.Softshrink`; default `λ = 0.5`;
    /// see [`softshrink`]).
    Softshrink, softshrink);
shrink!(/// `x` outside `[-λ, λ]`, 0 inside (`nn.Hardshrink`; default `λ = 0.5`;
    /// see [`hardshrink`]).
    Hardshrink, hardshrink);

/// `value` where `x <= threshold`, else `x` (`nn.Threshold(threshold,
/// value)`; see [`threshold`]); `inplace` writes into the input.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Threshold {
    /// The value at or below which an element is replaced.
    pub threshold: f64,
    /// What replaces it.
    pub value: f64,
    /// Whether `forward` writes into its input.
    pub inplace: bool,
}

impl Threshold {
    /// The module that returns a new tensor (`nn.Threshold(threshold, value)`).
    pub fn new(threshold: f64, value: f64) -> Threshold {
        Threshold {
            threshold,
            value,
            inplace: false,
        }
    }
}

impl Module for Threshold {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        threshold(x, self.threshold, self.value, self.inplace)
    }
}

/// The gated linear unit along `dim` (`nn.GLU`; default `dim = -1`; see [`glu`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GLU {
    /// The dim split in halves.
    pub dim: i64,
}

impl GLU {
    /// The unit that splits `dim` (`nn.GLU(dim)`).
    pub fn new(dim: i64) -> GLU {
        GLU { dim }
    }
}

impl Default for GLU {
    fn default() -> Self {
        GLU { dim: -1 }
    }
}

impl Module for GLU {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        glu(x, self.dim)
    }
}

/// Softmin along a dim (`nn.Softmin(dim)`): `softmax(-x)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Softmin(pub i64);

impl Module for Softmin {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        softmin(x, self.0)
    }
}

/// Log-softmax along a dim (`nn.LogSoftmax(dim)`; [`Tensor::log_softmax`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogSoftmax(pub i64);

impl Module for LogSoftmax {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.log_softmax(self.0)
    }
}

/// Splits one dim into several (`nn.Unflatten(dim, unflattened_size)`, the
/// inverse of [`Flatten`](super::Flatten)): `[2, 50]` with `dim = 1` and
/// sizes `[2, 5, 5]` becomes `[2, 2, 5, 5]`. One size may be -1, inferred
/// from the others. The result is a view where the input's strides allow.
///
/// ```
/// use ember::nn::{self, Module};
/// # use ember::{Device, DType, Tensor};
/// let x = Tensor::zeros([2, 50], DType::F32, &Device::Cpu)?;
/// let y = nn::Unflatten::new(1, [2, -1, 5]).forward(&x)?;
/// assert_eq!(y.shape(), &[2, 2, 5, 5]);
/// # Ok::<(), ember::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unflatten {
    /// The dim split (negative counts from the end).
    pub dim: i64,
    /// The sizes it is split into (one may be -1).
    pub sizes: Vec<i64>,
}

impl Unflatten {
    /// The module splitting `dim` into `sizes`.
    pub fn new(dim: i64, sizes: impl Into<Vec<i64>>) -> Unflatten {
        Unflatten {
            dim,
            sizes: sizes.into(),
        }
    }
}

impl Module for Unflatten {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.unflatten(self.dim, &self.sizes)
    }
}

macro_rules! channel_dropout {
    ($(#[$doc:meta])* $name:ident, $op:literal, $channels:expr) => {
        $(#[$doc])*
        #[derive(Clone, Debug)]
        pub struct $name {
            p: f64,
            inplace: bool,
            training: bool,
            generator: Option<Generator>,
        }

        impl $name {
            #[doc = concat!("The layer that zeroes a channel with probability `p` (`nn.", stringify!($name), "(p)`); `p` outside `[0, 1]` is refused.")]
            pub fn new(p: f64) -> Result<$name> {
                check_p($op, p)?;
                Ok($name {
                    p,
                    inplace: false,
                    training: true,
                    generator: None,
                })
            }

            /// The probability of zeroing a channel.
            pub fn p(&self) -> f64 {
                self.p
            }

            /// Writes the result into the input (PyTorch's `inplace=True`).
            pub fn inplace(mut self, inplace: bool) -> $name {
                self.inplace = inplace;
                self
            }

            /// Draws the masks from `generator` instead of the global stream.
            pub fn generator(mut self, generator: &Generator) -> $name {
                self.generator = Some(generator.clone());
                self
            }
        }

        impl Default for $name {
            fn default() -> Self {
                $name {
                    p: 0.5,
                    inplace: false,
                    training: true,
                    generator: None,
                }
            }
        }

        impl Module for $name {
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                let channels: fn(&Tensor) -> Result<Channels> = $channels;
                let channels = channels(x)?;
                feature_dropout(
                    x,
                    self.p,
                    self.training,
                    self.inplace,
                    channels,
                    self.generator.as_ref(),
                )
            }

            fn set_training(&mut self, training: bool) {
                self.training = training;
            }
        }
    };
}
channel_dropout!(/// Zeroes whole channels of `[N, C, L]` or `[C, L]` in training, scaling
    /// the rest by `1 / (1 - p)`; the identity in evaluation (`nn.Dropout1d`;
    /// default `p = 0.5`; see [`dropout1d`]).
    Dropout1d, "Dropout1d", channels_1d);
channel_dropout!(/// Zeroes whole channels of `[N, C, H, W]` in training, scaling the rest
    /// by `1 / (1 - p)`; the identity in evaluation (`nn.Dropout2d`; default
    /// `p = 0.5`). A 3-D input is read as `[N, C, L]`, as PyTorch 2.x reads it
    /// (see [`dropout2d`]).
    Dropout2d, "Dropout2d", |_| Ok(Channels::Batched));
channel_dropout!(/// Zeroes whole channels of `[N, C, D, H, W]` or `[C, D, H, W]` in
    /// training, scaling the rest by `1 / (1 - p)`; the identity in evaluation
    /// (`nn.Dropout3d`; default `p = 0.5`; see [`dropout3d`]).
    Dropout3d, "Dropout3d", |x| Ok(channels_3d(x)));

#[cfg(test)]
mod tests {
    use super::printed;

    #[test]
    fn numbers_print_as_cpp_streams_print_them() {
        let cases = [
            (-0.5, "-0.5"),
            (-1.0, "-1"),
            (1e6, "1e+06"),
            (123456.0, "123456"),
            (1234567.0, "1.23457e+06"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (f64::NAN, "nan"),
            (f64::INFINITY, "inf"),
            (-2.5e-300, "-2.5e-300"),
        ];
        for (v, want) in cases {
            assert_eq!(printed(v), want, "{v}");
        }
    }
}
