//! Instance normalisation (`nn.InstanceNorm1d`, `nn.InstanceNorm2d`,
//! `F.instance_norm`).

use super::norm::{running_norm_methods, running_norm_state};
use super::{assign, cast_state, empty_parameter, move_parameter, Module};
use crate::tensor::{update_running_stats, Momentum};
use crate::{
    device::Device,
    dtype::DType,
    error::{Error, Result},
    tensor::Tensor,
};

/// The statistics of an instance normalisation (`F.instance_norm`'s arguments
/// beside the input and the affine parameters).
#[derive(Clone, Copy, Debug)]
pub struct InstanceNormOptions<'a> {
    pub running_mean: Option<&'a Tensor>,
    pub running_var: Option<&'a Tensor>,
    /// Normalise with each sample's own statistics (default), and move the
    /// running ones (when given) towards their average over the batch;
    /// otherwise normalise with the running ones.
    pub use_input_stats: bool,
    /// `running = (1 - momentum) · running + momentum · batch` (default 0.1).
    pub momentum: f64,
    /// Added to the variance (default 1e-5).
    pub eps: f64,
}

impl Default for InstanceNormOptions<'_> {
    fn default() -> Self {
        InstanceNormOptions {
            running_mean: None,
            running_var: None,
            use_input_stats: true,
            momentum: 0.1,
            eps: 1e-5,
        }
    }
}

/// Instance normalisation of `x` `[N, C, *]` (`F.instance_norm`): each sample's
/// channel is normalised over its positions with their mean and biased
/// variance, then `weight` and `bias` (`[C]`) applied per channel. With
/// running statistics and `use_input_stats`, they move towards the batch's
/// average of each sample's mean and unbiased variance (PyTorch's update);
/// without `use_input_stats` the running statistics normalise (a batch norm
/// in evaluation). Errors as PyTorch's: one position per channel with the
/// input's statistics, no running statistics without them.
///
/// It is a group normalisation with one channel per group (one fused pass
/// each way), or a batch normalisation in evaluation.
///
/// ```
/// use ember::nn::functional::{instance_norm, InstanceNormOptions};
/// use ember::prelude::*;
/// let x = Tensor::new(&[[[1f32, 3.0], [10.0, 30.0]]], &Device::Cpu)?;
/// let y = instance_norm(&x, None, None, InstanceNormOptions::default())?;
/// assert!(y.allclose(&Tensor::new(&[[[-1f32, 1.0], [-1.0, 1.0]]], &Device::Cpu)?, 1e-4, 1e-4)?);
/// # Ok::<(), ember::Error>(())
/// ```
pub fn instance_norm(
    x: &Tensor,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    opts: InstanceNormOptions,
) -> Result<Tensor> {
    let _record = crate::profiler::function("instance_norm");
    const OP: &str = "instance_norm";
    if x.rank() < 2 {
        return Err(Error::invalid(
            OP,
            format!(
                "expected an input [N, C, *] of at least 2 dimensions, got {:?}",
                x.shape()
            ),
        ));
    }
    let (n, c) = (x.shape()[0], x.shape()[1]);
    let positions: usize = x.shape()[2..].iter().product();
    for (p, name) in [
        (weight, "weight"),
        (bias, "bias"),
        (opts.running_mean, "running_mean"),
        (opts.running_var, "running_var"),
    ] {
        if let Some(p) = p.filter(|p| p.numel() != c) {
            return Err(Error::shape(
                OP,
                p.shape(),
                x.shape(),
                format!("{name} should contain {c} elements not {}", p.numel()),
            ));
        }
    }
    if !opts.use_input_stats {
        let (Some(mean), Some(var)) = (opts.running_mean, opts.running_var) else {
            return Err(Error::invalid(
                OP,
                "Expected running_mean and running_var to be defined when use_input_stats is false",
            ));
        };
        let bn = super::functional::BatchNormOptions {
            running_mean: Some(mean),
            running_var: Some(var),
            training: false,
            momentum: opts.momentum,
            eps: opts.eps,
        };
        return super::functional::batch_norm(x, weight, bias, bn);
    }
    if positions == 1 {
        return Err(Error::invalid(
            OP,
            format!(
                "Expected more than 1 spatial element when training, got input size {:?}",
                x.shape()
            ),
        ));
    }
    // not on autocast's lists: the input's dtype (PyTorch runs a batch norm,
    // which takes float32 parameters beside a half-precision input)
    let y = super::functional::group_norm_in(x, c.max(1), weight, bias, opts.eps)?;
    if (opts.running_mean.is_some() || opts.running_var.is_some()) && n > 0 {
        // each sample's statistics averaged over the batch, in float32 at
        // least (float64 for float64), as the batch norm PyTorch runs
        // computes them
        let (mean, var) = crate::autograd::no_grad(|| -> Result<(Tensor, Tensor)> {
            let xs = x.detach();
            let xs = match xs.dtype() {
                DType::F64 => xs,
                _ => xs.to_dtype(DType::F32)?,
            };
            let rows = xs.reshape([n, c, positions])?;
            let mean = rows.mean([2], false)?;
            let var = rows.var_correction([2], 0.0, false)?;
            Ok((mean.mean([0], false)?, var.mean([0], false)?))
        })?;
        let running = (opts.running_mean, opts.running_var);
        update_running_stats(
            running,
            (&mean, &var),
            positions,
            Momentum::Fixed(opts.momentum),
        )?;
    }
    Ok(y)
}

/// Instance normalisation over the channel dim of inputs of rank `D + 2`
/// (batched) or `D + 1` (one sample): `InstanceNorm1d` takes `[N, C, L]` or
/// `[C, L]`, `InstanceNorm2d` `[N, C, H, W]` or `[C, H, W]`. PyTorch's
/// defaults: no affine parameters, no running statistics, `eps = 1e-5`,
/// `momentum = 0.1`. With `affine`, `weight` (ones) and `bias` (zeros); with
/// `track_running_stats`, the buffers `running_mean`, `running_var` and
/// `num_batches_tracked` (which, as PyTorch's, instance norm never counts),
/// used in evaluation and moved in training. State-dict names as PyTorch's.
///
/// ```
/// use ember::nn::{self, Module};
/// use ember::prelude::*;
/// let norm = nn::InstanceNorm2d::new(3, &Device::Cpu)?;
/// assert!(norm.state_dict().is_empty());
/// let y = norm.forward(&Tensor::randn([2, 3, 4, 4], &Device::Cpu)?)?;
/// assert!(y.mean([2, 3], false)?.abs()?.max_all()?.item::<f32>()? < 1e-5);
/// # Ok::<(), ember::Error>(())
/// ```
pub struct InstanceNorm<const D: usize> {
    pub weight: Option<Tensor>,
    pub bias: Option<Tensor>,
    pub running_mean: Option<Tensor>,
    pub running_var: Option<Tensor>,
    pub num_batches_tracked: Option<Tensor>,
    /// Added to the variance before the square root (default `1e-5`).
    pub eps: f64,
    /// The running-average factor (default `0.1`; PyTorch's `None` is 0 here).
    pub momentum: f64,
    training: bool,
    features: usize,
}

/// `nn.InstanceNorm1d`: inputs `[N, C, L]` or `[C, L]`.
pub type InstanceNorm1d = InstanceNorm<1>;
/// `nn.InstanceNorm2d`: inputs `[N, C, H, W]` or `[C, H, W]`.
pub type InstanceNorm2d = InstanceNorm<2>;
/// `nn.InstanceNorm3d`: inputs `[N, C, D, H, W]` or `[C, D, H, W]`.
pub type InstanceNorm3d = InstanceNorm<3>;

impl<const D: usize> InstanceNorm<D> {
    /// A layer with PyTorch's defaults (`affine=False`,
    /// `track_running_stats=False`).
    pub fn new(num_features: usize, device: &Device) -> Result<Self> {
        Self::with_options(num_features, false, false, device)
    }

    /// A layer with or without the affine parameters and running statistics.
    pub fn with_options(
        num_features: usize,
        affine: bool,
        track_running_stats: bool,
        device: &Device,
    ) -> Result<Self> {
        let [weight, bias, running_mean, running_var, num_batches_tracked] =
            running_norm_state(num_features, affine, track_running_stats, device)?;
        Ok(InstanceNorm {
            weight,
            bias,
            running_mean,
            running_var,
            num_batches_tracked,
            eps: 1e-5,
            momentum: 0.1,
            training: true,
            features: num_features,
        })
    }

    /// Whether the layer is in training mode.
    pub fn is_training(&self) -> bool {
        self.training
    }
}

impl<const D: usize> Module for InstanceNorm<D> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let op = match D {
            1 => "InstanceNorm1d",
            2 => "InstanceNorm2d",
            _ => "InstanceNorm3d",
        };
        let r = x.rank();
        if r != D + 1 && r != D + 2 {
            return Err(Error::invalid(
                op,
                format!("expected {}D or {}D input (got {r}D input)", D + 1, D + 2),
            ));
        }
        if r == D + 1 {
            return self.forward(&x.unsqueeze(0)?)?.squeeze(0);
        }
        // (PyTorch only warns of another channel count without the affine
        // parameters; the running statistics then refuse it)
        if self.weight.is_some() && x.shape()[1] != self.features {
            return Err(Error::shape(
                op,
                x.shape(),
                &[self.features],
                format!(
                    "expected input's size at dim=1 to match num_features ({}), but got: {}.",
                    self.features,
                    x.shape()[1]
                ),
            ));
        }
        let opts = InstanceNormOptions {
            running_mean: self.running_mean.as_ref(),
            running_var: self.running_var.as_ref(),
            use_input_stats: self.training || self.running_mean.is_none(),
            momentum: self.momentum,
            eps: self.eps,
        };
        instance_norm(x, self.weight.as_ref(), self.bias.as_ref(), opts)
    }

    running_norm_methods!();
}
