//! Filling a tensor with random draws in place (`Tensor.uniform_`,
//! `normal_`, `bernoulli_`, `exponential_`, `geometric_`, `log_normal_`,
//! `cauchy_`, `random_`), sampling Bernoulli trials from probabilities
//! (`torch.bernoulli`) and `torch.randint_like`. Each draws from the device's
//! generator (uniform or normal numbers, then transformed on the device) and
//! writes through [`copy_`](Tensor::copy_), so views are filled in place and
//! autograd treats the fill as PyTorch does (the old values get no gradient;
//! a leaf that requires a gradient is refused outside `no_grad`).

use super::{not_implemented_for, torch_dtype_name, Tensor};
use crate::{
    dtype::DType,
    error::{Error, Result},
};

/// The dtype random numbers are drawn in for a tensor of `dtype`: float64's
/// own, float32 for everything else (half types round once, at the end).
fn draw_dtype(dtype: DType) -> DType {
    if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

impl Tensor {
    /// Uniform samples from `[0, 1)` in the dtype draws are made in.
    fn unit_draws(&self) -> Result<Tensor> {
        Tensor::uniform(
            0.0,
            1.0,
            self.shape(),
            draw_dtype(self.dtype()),
            &self.device(),
        )
    }

    /// Writes `values` (converted to this dtype) into this tensor.
    fn fill_with(&self, values: &Tensor) -> Result<()> {
        self.copy_(&values.to_dtype(self.dtype())?)
    }

    /// Refuses integer and bool tensors for a continuous distribution in
    /// PyTorch's CPU wording (`kernel` names the refusing kernel).
    fn continuous(&self, op: &'static str, kernel: &'static str) -> Result<()> {
        if self.dtype().is_float() {
            Ok(())
        } else {
            Err(not_implemented_for(op, kernel, self.dtype()))
        }
    }

    /// Fills the tensor with samples uniform in `[from, to)` (`tensor.uniform_`).
    /// Float dtypes only; `from > to` and bounds the dtype cannot hold are
    /// refused, as PyTorch's checks refuse them.
    ///
    /// ```
    /// use ember::prelude::*;
    /// let w = Tensor::zeros([3, 4], DType::F32, &Device::Cpu)?;
    /// w.uniform_(-0.5, 0.5)?;
    /// assert!(w.to_vec::<f32>()?.iter().all(|v| (-0.5..0.5).contains(v)));
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn uniform_(&self, from: f64, to: f64) -> Result<()> {
        self.continuous("uniform_", "check_uniform_bounds")?;
        let draws = Tensor::uniform(from, to, self.shape(), self.dtype(), &self.device())
            .map_err(|e| rename(e, "uniform", "uniform_"))?;
        self.copy_(&draws)
    }

    /// Fills the tensor with normal samples of `mean` and `std`
    /// (`tensor.normal_`). Float dtypes only; `std < 0` is refused.
    pub fn normal_(&self, mean: f64, std: f64) -> Result<()> {
        self.continuous("normal_", "normal_kernel_cpu")?;
        let draws = Tensor::normal(mean, std, self.shape(), self.dtype(), &self.device())
            .map_err(|e| rename(e, "normal", "normal_"))?;
        self.copy_(&draws)
    }

    /// Fills the tensor with samples of the exponential distribution of rate
    /// `lambd` (`tensor.exponential_`): `-ln(1 - u) / lambd` for `u` uniform in
    /// `[0, 1)`, so never negative. Float dtypes only; `lambd <= 0` is refused.
    pub fn exponential_(&self, lambd: f64) -> Result<()> {
        const OP: &str = "exponential_";
        if !self.dtype().is_float() {
            return Err(Error::dtype(
                OP,
                self.dtype(),
                format!(
                    "Exponential distribution is a continuous probability distribution. dtype must be a floating point but you specified {}",
                    torch_dtype_name(self.dtype())
                ),
            ));
        }
        if lambd.is_nan() || lambd <= 0.0 {
            return Err(Error::invalid(
                OP,
                format!("exponential_ expects lambda > 0.0, but found lambda={lambd}"),
            ));
        }
        let u = self.unit_draws()?;
        self.fill_with(&u.neg()?.log1p()?.div(-lambd)?)
    }

    /// Fills the tensor with the number of Bernoulli trials of success
    /// probability `p` up to the first success (`tensor.geometric_`): values
    /// 1, 2, …, drawn as `ceil(ln(1 - u) / ln(1 - p))`. Any dtype (integers
    /// hold the counts exactly); `p` outside `(0, 1)` is refused.
    pub fn geometric_(&self, p: f64) -> Result<()> {
        if !(p > 0.0 && p < 1.0) {
            return Err(Error::invalid(
                "geometric_",
                format!("geometric_ expects p to be in (0, 1), but got p={p}"),
            ));
        }
        let u = self.unit_draws()?;
        let trials = u
            .neg()?
            .log1p()?
            .div((-p).ln_1p())?
            .ceil()?
            .clamp_min(1.0)?;
        self.fill_with(&trials)
    }

    /// Fills the tensor with `exp(x)` for `x` normal of `mean` and `std`
    /// (`tensor.log_normal_`). Float dtypes only; `std <= 0` is refused.
    pub fn log_normal_(&self, mean: f64, std: f64) -> Result<()> {
        self.continuous("log_normal_", "log_normal_cpu")?;
        if std.is_nan() || std <= 0.0 {
            return Err(Error::invalid(
                "log_normal_",
                format!("log_normal_ expects std > 0.0, but found std={std}"),
            ));
        }
        let x = Tensor::normal(
            mean,
            std,
            self.shape(),
            draw_dtype(self.dtype()),
            &self.device(),
        )?;
        self.fill_with(&x.exp()?)
    }

    /// Fills the tensor with samples of the Cauchy distribution of `median`
    /// and scale `sigma` (`tensor.cauchy_`): `median + sigma · tan(π(u − ½))`.
    /// Float dtypes only; `sigma <= 0` is refused.
    pub fn cauchy_(&self, median: f64, sigma: f64) -> Result<()> {
        self.continuous("cauchy_", "cauchy_cpu")?;
        if sigma.is_nan() || sigma <= 0.0 {
            return Err(Error::invalid(
                "cauchy_",
                format!("cauchy_ expects sigma > 0.0, but found sigma={sigma}"),
            ));
        }
        let u = self.unit_draws()?;
        let x = u.sub(0.5)?.mul(std::f64::consts::PI)?.tan()?;
        self.fill_with(&x.mul(sigma)?.add(median)?)
    }

    /// Fills the tensor with Bernoulli trials of success probability `p`: 1
    /// with probability `p`, else 0 (`tensor.bernoulli_(p)`). Any dtype (bool:
    /// `true`/`false`); `p` outside `[0, 1]` is refused.
    ///
    /// ```
    /// use ember::prelude::*;
    /// ember::manual_seed(0);
    /// let mask = Tensor::zeros([10_000], DType::Bool, &Device::Cpu)?;
    /// mask.bernoulli_(0.25)?;
    /// let kept = mask.to_dtype(DType::F64)?.mean_all()?.item::<f64>()?;
    /// assert!((kept - 0.25).abs() < 0.02);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn bernoulli_(&self, p: f64) -> Result<()> {
        if !(0.0..=1.0).contains(&p) {
            return Err(Error::invalid(
                "bernoulli_",
                format!("bernoulli_ expects p to be in [0, 1], but got p={p}"),
            ));
        }
        let u = self.unit_draws()?;
        self.fill_with(&u.lt(p)?)
    }

    /// Bernoulli trials with each element's probability (`torch.bernoulli`):
    /// a tensor of this shape and dtype holding 1 where a draw fell below the
    /// element, else 0. Float dtypes only; a probability outside `[0, 1]` (or
    /// NaN) is refused, which reads one flag back from the device (PyTorch's
    /// check, made before any draw). The result has no gradient.
    pub fn bernoulli(&self) -> Result<Tensor> {
        const OP: &str = "bernoulli";
        self.continuous(OP, "bernoulli_tensor_cpu_p_")?;
        let _ng = crate::autograd::no_grad_guard();
        if self.device() != crate::device::Device::Meta && self.numel() > 0 {
            let inside = self.ge(0.0)?.logical_and(&self.le(1.0)?)?;
            if !inside.all_all()?.item::<bool>()? {
                return Err(Error::invalid(
                    OP,
                    "Expected p_in >= 0 && p_in <= 1 to be true, but got false.",
                ));
            }
        }
        let u = self.unit_draws()?;
        u.lt(&self.to_dtype(u.dtype())?)?.to_dtype(self.dtype())
    }

    /// Fills the tensor with integers uniform in `[from, to)`
    /// (`tensor.random_(from, to)`), in any dtype; `from >= to` is refused, and
    /// so is a `to - 1` a uint8 or bool tensor cannot hold (PyTorch's checks).
    pub fn random_(&self, from: i64, to: i64) -> Result<()> {
        const OP: &str = "random_";
        if from >= to {
            return Err(Error::invalid(
                OP,
                format!(
                    "random_ expects 'from' to be less than 'to', but got from={from} >= to={to}"
                ),
            ));
        }
        let bounds = match self.dtype() {
            DType::U8 => Some(("unsigned char", 0, 255)),
            DType::Bool => Some(("bool", 0, 1)),
            _ => None,
        };
        if let Some((name, lo, hi)) = bounds {
            if !(lo..=hi).contains(&from) {
                return Err(Error::invalid(
                    OP,
                    format!("from is out of bounds for {name}"),
                ));
            }
            if !(lo..=hi).contains(&(to - 1)) {
                return Err(Error::invalid(
                    OP,
                    format!("to - 1 is out of bounds for {name}"),
                ));
            }
        }
        let draws = Tensor::randint(from, to, self.shape(), &self.device())?;
        self.fill_with(&draws)
    }

    /// Integers uniform in `[low, high)` with this tensor's shape, dtype and
    /// device (`torch.randint_like`).
    pub fn randint_like(&self, low: i64, high: i64) -> Result<Tensor> {
        if low >= high {
            return Err(Error::invalid(
                "randint_like",
                format!(
                    "random_ expects 'from' to be less than 'to', but got from={low} >= to={high}"
                ),
            ));
        }
        Tensor::randint(low, high, self.shape(), &self.device())?.to_dtype(self.dtype())
    }
}

/// An error of the out-of-place draw reported under the in-place op's name.
fn rename(e: Error, from: &'static str, to: &'static str) -> Error {
    match e {
        Error::InvalidArgument { op, msg } if op == from => Error::InvalidArgument { op: to, msg },
        e => e,
    }
}
