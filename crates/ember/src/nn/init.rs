//! Parameter initialisation in place (`torch.nn.init`): each function overwrites
//! the tensor's values outside the graph (a parameter stays a leaf), drawing from
//! the generator in scope, and returns the tensor for chaining.

use super::assign;
use crate::{
    device::Device,
    dtype::DType,
    error::{Error, Result},
    tensor::Tensor,
};

/// How a weight's fans are chosen for Kaiming initialisation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FanMode {
    /// Preserves the forward pass's variance (PyTorch's default).
    #[default]
    FanIn,
    /// Preserves the backward pass's variance.
    FanOut,
}

/// The activation after a layer, for [`calculate_gain`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Nonlinearity {
    Linear,
    Sigmoid,
    Tanh,
    Relu,
    /// With its negative slope.
    LeakyRelu(f64),
    Selu,
}

/// The recommended gain for an activation (`nn.init.calculate_gain`): 1 for
/// linear and sigmoid, 5/3 for tanh, √2 for ReLU, `sqrt(2 / (1 + slope²))` for
/// leaky ReLU, 3/4 for SELU.
pub fn calculate_gain(n: Nonlinearity) -> f64 {
    match n {
        Nonlinearity::Linear | Nonlinearity::Sigmoid => 1.0,
        Nonlinearity::Tanh => 5.0 / 3.0,
        Nonlinearity::Relu => 2f64.sqrt(),
        Nonlinearity::LeakyRelu(a) => (2.0 / (1.0 + a * a)).sqrt(),
        Nonlinearity::Selu => 0.75,
    }
}

/// `(fan_in, fan_out)` of a weight: `shape[1]` and `shape[0]` times the product of
/// the remaining (receptive-field) dims; at least 2-D, as in PyTorch.
pub fn fans(t: &Tensor) -> Result<(usize, usize)> {
    if t.rank() < 2 {
        return Err(Error::invalid(
            "init",
            "Fan in and fan out can not be computed for tensor with fewer than 2 dimensions",
        ));
    }
    let receptive: usize = t.shape()[2..].iter().product();
    Ok((t.shape()[1] * receptive, t.shape()[0] * receptive))
}

fn float(op: &'static str, t: &Tensor) -> Result<()> {
    if t.dtype().is_float() {
        Ok(())
    } else {
        Err(Error::dtype(
            op,
            t.dtype(),
            "initialises floating-point tensors",
        ))
    }
}

fn fill_from(t: &Tensor, values: Tensor) -> Result<Tensor> {
    assign(t, &values.to_dtype(t.dtype())?.to(&t.device())?)?;
    Ok(t.clone())
}

/// Uniform in `[low, high)` (`nn.init.uniform_`).
pub fn uniform_(t: &Tensor, low: f64, high: f64) -> Result<Tensor> {
    float("uniform_", t)?;
    fill_from(
        t,
        Tensor::uniform(low, high, t.shape(), t.dtype(), &t.device())?,
    )
}

/// Normal with `mean` and `std` (`nn.init.normal_`).
pub fn normal_(t: &Tensor, mean: f64, std: f64) -> Result<Tensor> {
    float("normal_", t)?;
    fill_from(
        t,
        Tensor::normal(mean, std, t.shape(), t.dtype(), &t.device())?,
    )
}

/// Every element `value` (`nn.init.constant_`).
pub fn constant_(t: &Tensor, value: f64) -> Result<Tensor> {
    fill_from(t, t.full_like(value)?)
}

/// Zeros (`nn.init.zeros_`).
pub fn zeros_(t: &Tensor) -> Result<Tensor> {
    constant_(t, 0.0)
}

/// Ones (`nn.init.ones_`).
pub fn ones_(t: &Tensor) -> Result<Tensor> {
    constant_(t, 1.0)
}

/// The standard deviation of Kaiming initialisation.
fn kaiming_std(t: &Tensor, mode: FanMode, n: Nonlinearity) -> Result<f64> {
    let (fan_in, fan_out) = fans(t)?;
    let fan = match mode {
        FanMode::FanIn => fan_in,
        FanMode::FanOut => fan_out,
    };
    Ok(calculate_gain(n) / (fan as f64).sqrt())
}

/// He initialisation, uniform in `±gain·sqrt(3 / fan)` (`nn.init.kaiming_uniform_`;
/// PyTorch's defaults are `FanIn` and `LeakyRelu(0.0)`). A tensor without
/// elements is returned as it is (PyTorch warns that this does nothing).
pub fn kaiming_uniform_(t: &Tensor, mode: FanMode, n: Nonlinearity) -> Result<Tensor> {
    float("kaiming_uniform_", t)?;
    if t.numel() == 0 {
        return Ok(t.clone());
    }
    let bound = 3f64.sqrt() * kaiming_std(t, mode, n)?;
    uniform_(t, -bound, bound)
}

/// He initialisation, normal with std `gain / sqrt(fan)` (`nn.init.kaiming_normal_`).
/// A tensor without elements is returned as it is, as by `kaiming_uniform_`.
pub fn kaiming_normal_(t: &Tensor, mode: FanMode, n: Nonlinearity) -> Result<Tensor> {
    float("kaiming_normal_", t)?;
    if t.numel() == 0 {
        return Ok(t.clone());
    }
    let std = kaiming_std(t, mode, n)?;
    normal_(t, 0.0, std)
}

/// Glorot initialisation, uniform in `±gain·sqrt(6 / (fan_in + fan_out))`
/// (`nn.init.xavier_uniform_`).
pub fn xavier_uniform_(t: &Tensor, gain: f64) -> Result<Tensor> {
    float("xavier_uniform_", t)?;
    let (fi, fo) = fans(t)?;
    let bound = gain * (6.0 / (fi + fo).max(1) as f64).sqrt();
    uniform_(t, -bound, bound)
}

/// Glorot initialisation, normal with std `gain·sqrt(2 / (fan_in + fan_out))`
/// (`nn.init.xavier_normal_`).
pub fn xavier_normal_(t: &Tensor, gain: f64) -> Result<Tensor> {
    float("xavier_normal_", t)?;
    let (fi, fo) = fans(t)?;
    normal_(t, 0.0, gain * (2.0 / (fi + fo).max(1) as f64).sqrt())
}

/// A normal distribution with `mean` and `std` truncated to `[a, b]`
/// (`nn.init.trunc_normal_`; PyTorch's defaults `0, 1, -2, 2`), drawn as
/// PyTorch draws it: a uniform value between the bounds' cumulative
/// probabilities mapped through the normal's inverse distribution function, in
/// float64 on the host (the tail nearer the bounds taken from its own side, so
/// that bounds far out keep their digits), clamped to `[a, b]` and copied to
/// the tensor's device. Bounds where the distribution has almost no mass still
/// give values in `[a, b]`, at once; `a == b` fills with `a`; either bound may
/// be infinite. `a > b` (or a NaN bound), a `std` not above 0, or a mean or std
/// that is not finite are refused.
pub fn trunc_normal_(t: &Tensor, mean: f64, std: f64, a: f64, b: f64) -> Result<Tensor> {
    float("trunc_normal_", t)?;
    if a.is_nan() || b.is_nan() || a > b {
        return Err(Error::invalid(
            "trunc_normal_",
            format!("the bounds must satisfy a <= b, got a = {a}, b = {b}"),
        ));
    }
    if !(std > 0.0 && std.is_finite() && mean.is_finite()) {
        return Err(Error::invalid(
            "trunc_normal_",
            format!("needs a finite mean and a finite std above 0, got mean = {mean}, std = {std}"),
        ));
    }
    if !t.holds_values() {
        // (meta: nothing to draw, and the generator does not move)
        return Ok(t.clone());
    }
    // the standardised bounds; above the mean, drawn on the lower side and mirrored
    let (lo, hi) = ((a - mean) / std, (b - mean) / std);
    let mirror = lo > 0.0;
    let (lo, hi) = if mirror { (-hi, -lo) } else { (lo, hi) };
    let (plo, phi) = (normal_cdf(lo), normal_cdf(hi));
    let u = Tensor::uniform(0.0, 1.0, [t.numel()], DType::F64, &Device::Cpu)?.to_vec::<f64>()?;
    let out: Vec<f64> = u
        .into_iter()
        .map(|u| {
            // (kept off 0 and 1, whose quantiles are infinite)
            let q = (plo + (phi - plo) * u).clamp(f64::MIN_POSITIVE, 1.0 - f64::EPSILON / 2.0);
            let z = normal_quantile(q);
            let z = if mirror { -z } else { z };
            (mean + std * z).clamp(a, b)
        })
        .collect();
    fill_from(t, Tensor::from_vec(out, t.shape(), &Device::Cpu)?)
}

/// The standard normal's distribution function, `P(Z <= x)`.
fn normal_cdf(x: f64) -> f64 {
    0.5 * libm::erfc(-x / std::f64::consts::SQRT_2)
}

/// The standard normal's inverse distribution function: the `x` with
/// `P(Z <= x) = p` (`-inf` at 0, `inf` at 1), found in the lower half (the
/// upper by symmetry) from the Abramowitz and Stegun approximation 26.2.23
/// (within 5e-4) refined by Halley's steps on `normal_cdf`, to float64's
/// precision.
fn normal_quantile(p: f64) -> f64 {
    if p <= 0.0 {
        return f64::NEG_INFINITY;
    }
    if p >= 1.0 {
        return f64::INFINITY;
    }
    let (q, sign) = if p < 0.5 { (p, -1.0) } else { (1.0 - p, 1.0) };
    let t = (-2.0 * q.ln()).sqrt();
    let num = 2.515517 + t * (0.802853 + t * 0.010328);
    let den = 1.0 + t * (1.432788 + t * (0.189269 + t * 0.001308));
    // y <= 0 with P(Z <= y) = q
    let mut y = -(t - num / den);
    for _ in 0..8 {
        let density = (-0.5 * y * y).exp() / (2.0 * std::f64::consts::PI).sqrt();
        if density == 0.0 {
            break;
        }
        let step = (normal_cdf(y) - q) / density;
        // Halley's correction: the density's slope is -y·density
        let step = step / (1.0 + 0.5 * y * step);
        y -= step;
        if step.abs() <= 1e-15 * y.abs().max(1.0) {
            break;
        }
    }
    -sign * y
}

/// A (semi-)orthogonal matrix times `gain` (`nn.init.orthogonal_`): the Q of the
/// QR decomposition of a standard normal matrix, its columns' signs fixed by R's
/// diagonal, as PyTorch does; a tensor of more than 2 dims is seen as
/// `[shape[0], rest]`. Computed on the host.
pub fn orthogonal_(t: &Tensor, gain: f64) -> Result<Tensor> {
    float("orthogonal_", t)?;
    if t.rank() < 2 {
        return Err(Error::invalid(
            "orthogonal_",
            "Only tensors with 2 or more dimensions are supported",
        ));
    }
    let rows = t.shape()[0];
    let cols = t.numel() / rows.max(1);
    if rows == 0 || cols == 0 || !t.holds_values() {
        // (meta: nothing to draw, and the generator does not move)
        return Ok(t.clone());
    }
    // QR of the tall orientation: m × k with m >= k
    let (m, k) = (rows.max(cols), rows.min(cols));
    let a = Tensor::normal(0.0, 1.0, [m, k], DType::F64, &Device::Cpu)?.to_vec2::<f64>()?;
    // modified Gram-Schmidt on the columns, twice for orthogonality in floating
    // point; R's diagonal (the norms) comes out positive, which is the sign
    // convention PyTorch imposes on its QR
    let mut q: Vec<Vec<f64>> = (0..k).map(|j| (0..m).map(|i| a[i][j]).collect()).collect();
    for j in 0..k {
        let (done, rest) = q.split_at_mut(j);
        let col = &mut rest[0];
        for _pass in 0..2 {
            for prev in done.iter() {
                let dot: f64 = prev.iter().zip(col.iter()).map(|(a, b)| a * b).sum();
                for (c, p) in col.iter_mut().zip(prev) {
                    *c -= dot * p;
                }
            }
        }
        let norm = col.iter().map(|v| v * v).sum::<f64>().sqrt();
        for v in col.iter_mut() {
            *v /= norm;
        }
    }
    let mut flat = vec![0.0; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            // Q is m × k (columns q[j]); the result is Q or its transpose
            flat[r * cols + c] = gain * if rows >= cols { q[c][r] } else { q[r][c] };
        }
    }
    fill_from(t, Tensor::from_vec(flat, t.shape(), &Device::Cpu)?)
}
