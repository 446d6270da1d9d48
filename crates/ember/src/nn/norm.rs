//! Batch normalisation (`nn.BatchNorm1d`, `nn.BatchNorm2d`, `nn.BatchNorm3d`).

use super::{assign, cast_state, empty_parameter, fresh_parameter, move_parameter, Module};
use crate::tensor::BatchStats;
use crate::tensor::{update_running_stats, Momentum, RunningUpdate};
use crate::{
    device::Device,
    dtype::DType,
    error::{Error, Result},
    tensor::Tensor,
};

/// Batch normalisation over the channel dim 1 of inputs of rank `D + 1` or `D + 2`
/// (`BatchNorm1d`: `[N, C]` or `[N, C, L]`; `BatchNorm2d`: `[N, C, H, W]`;
/// `BatchNorm3d`: `[N, C, D, H, W]`).
///
/// In training, each channel is normalised with the batch's mean and biased
/// variance, and the running statistics move towards the batch's (unbiased)
/// statistics by `momentum`; in evaluation the running statistics are used.
/// Buffers `running_mean`, `running_var` and `num_batches_tracked` are saved with
/// the parameters (`weight`, `bias`), under PyTorch's names.
pub struct BatchNorm<const D: usize> {
    pub weight: Option<Tensor>,
    pub bias: Option<Tensor>,
    pub running_mean: Option<Tensor>,
    pub running_var: Option<Tensor>,
    pub num_batches_tracked: Option<Tensor>,
    /// Added to the variance before the square root (default `1e-5`).
    pub eps: f64,
    /// The running-average factor (default `0.1`); `None` gives a cumulative average.
    pub momentum: Option<f64>,
    training: bool,
    features: usize,
}

/// `nn.BatchNorm1d`: inputs `[N, C]` or `[N, C, L]`.
pub type BatchNorm1d = BatchNorm<1>;
/// `nn.BatchNorm2d`: inputs `[N, C, H, W]`.
pub type BatchNorm2d = BatchNorm<2>;
/// `nn.BatchNorm3d`: inputs `[N, C, D, H, W]`.
pub type BatchNorm3d = BatchNorm<3>;

impl<const D: usize> BatchNorm<D> {
    /// A layer with PyTorch's defaults: affine (weight 1, bias 0), running statistics
    /// tracked, `eps = 1e-5`, `momentum = 0.1`.
    pub fn new(num_features: usize, device: &Device) -> Result<Self> {
        Self::with_options(num_features, true, true, device)
    }

    /// A layer with or without the affine parameters and running statistics.
    pub fn with_options(
        num_features: usize,
        affine: bool,
        track_running_stats: bool,
        device: &Device,
    ) -> Result<Self> {
        if num_features == 0 {
            return Err(Error::invalid("BatchNorm", "num_features must be positive"));
        }
        let [weight, bias, running_mean, running_var, num_batches_tracked] =
            running_norm_state(num_features, affine, track_running_stats, device)?;
        Ok(BatchNorm {
            weight,
            bias,
            running_mean,
            running_var,
            num_batches_tracked,
            eps: 1e-5,
            momentum: Some(0.1),
            training: true,
            features: num_features,
        })
    }

    /// Whether the layer is in training mode.
    pub fn is_training(&self) -> bool {
        self.training
    }

    fn check_input(&self, x: &Tensor) -> Result<()> {
        let ok_rank = if D == 1 {
            x.rank() == 2 || x.rank() == 3
        } else {
            x.rank() == D + 2
        };
        if !ok_rank {
            let want = if D == 1 {
                "2D or 3D".to_string()
            } else {
                format!("{}D", D + 2)
            };
            return Err(Error::invalid(
                "BatchNorm",
                format!(
                    "BatchNorm{D}d expected {want} input, got {}D input of shape {:?}",
                    x.rank(),
                    x.shape()
                ),
            ));
        }
        if x.shape()[1] != self.features {
            return Err(Error::shape(
                "BatchNorm",
                x.shape(),
                &[self.features],
                format!(
                    "the input has {} channels (dim 1) but the layer was built for {}",
                    x.shape()[1],
                    self.features
                ),
            ));
        }
        Ok(())
    }
}

impl<const D: usize> BatchNorm<D> {
    /// `relu(self.forward(x))` in one op (ember's fusion, not a PyTorch method):
    /// the ReLU applied in the normalisation's pass, and its gradient folded into
    /// the batch norm's backward passes, where `forward` then `relu_` make a pass
    /// each way more. The model zoo's ResNets use it for their batch norms
    /// followed by a ReLU (the same parameters, buffers and results).
    ///
    /// ```
    /// # use ember::prelude::*;
    /// # use ember::nn::{self, Module};
    /// let bn = nn::BatchNorm2d::new(3, &Device::Cpu)?;
    /// let x = Tensor::randn([2, 3, 4, 4], &Device::Cpu)?;
    /// let fused = bn.forward_relu(&x)?;
    /// assert!(fused.allclose(&bn.forward(&x)?.relu()?, 1e-6, 1e-6)?);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn forward_relu(&self, x: &Tensor) -> Result<Tensor> {
        self.run(x, true, None)
    }

    /// `relu(self.forward(x) + residual)` in one op (ember's fusion, as
    /// [`forward_relu`](Self::forward_relu)): the end of a ResNet block, where
    /// `forward`, an in-place add and an in-place ReLU make two passes more
    /// forward. `residual` gets the ReLU's gradient. A residual of another shape
    /// or dtype is added by the separate ops (broadcast and promoted as `add`
    /// does).
    ///
    /// ```
    /// # use ember::prelude::*;
    /// # use ember::nn::{self, Module};
    /// let bn = nn::BatchNorm2d::new(3, &Device::Cpu)?;
    /// let (x, r) = (Tensor::randn([2, 3, 4, 4], &Device::Cpu)?, Tensor::randn([2, 3, 4, 4], &Device::Cpu)?);
    /// let fused = bn.forward_add_relu(&x, &r)?;
    /// assert!(fused.allclose(&bn.forward(&x)?.add(&r)?.relu()?, 1e-6, 1e-6)?);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn forward_add_relu(&self, x: &Tensor, residual: &Tensor) -> Result<Tensor> {
        if residual.shape() != x.shape() || residual.dtype() != x.dtype() {
            return self.forward(x)?.add(residual)?.relu();
        }
        self.run(x, true, Some(residual))
    }

    fn run(&self, x: &Tensor, relu: bool, residual: Option<&Tensor>) -> Result<Tensor> {
        let _record = crate::profiler::function("batch_norm");
        self.check_input(x)?;
        let c = self.features;
        let use_batch = self.training || self.running_mean.is_none();
        let stats = match (&self.running_mean, &self.running_var) {
            (Some(mean), Some(var)) if !use_batch => BatchStats::Running { mean, var },
            _ => BatchStats::Batch,
        };
        let n = x.numel() / c;
        // (PyTorch refuses one value a channel where the batch's statistics are
        // used, in evaluation too without running statistics, and takes none: an
        // empty output, the batch counted, the running statistics kept)
        if use_batch && n == 1 {
            return Err(Error::invalid(
                "BatchNorm",
                format!(
                    "expected more than 1 value per channel when training, got input of shape {:?}",
                    x.shape()
                ),
            ));
        }
        let running = match (
            &self.running_mean,
            &self.running_var,
            &self.num_batches_tracked,
        ) {
            (Some(rm), Some(rv), Some(_)) if self.training => Some((rm, rv)),
            _ => None,
        };
        // a fixed momentum moves the running statistics in the op's coefficient
        // step; a cumulative average's 1 / batches after it
        let update = match (running, self.momentum) {
            (Some((rm, rv)), Some(m)) => Some(RunningUpdate {
                mean: Some(rm),
                var: Some(rv),
                momentum: m,
            }),
            _ => None,
        };
        let (y, mean, var) = x.batch_norm_op(
            self.weight.as_ref(),
            self.bias.as_ref(),
            (stats, update),
            (self.eps, relu, residual),
        )?;
        let counted = !crate::autograd::is_recomputing();
        if let (Some((rm, rv)), Some(nb), true) = (running, &self.num_batches_tracked, counted) {
            crate::autograd::no_grad(|| nb.add_(1i64))?;
            if n > 0 && self.momentum.is_none() {
                // a cumulative average's m = 1 / batches in f64, rounded once as
                // a fixed momentum is
                let batches = crate::autograd::no_grad(|| nb.to_dtype(DType::F64)?.recip())?;
                let m = Momentum::Cumulative(&batches);
                update_running_stats((Some(rm), Some(rv)), (&mean, &var), n, m)?;
            }
        }
        Ok(y)
    }
}

impl<const D: usize> Module for BatchNorm<D> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.run(x, false, None)
    }

    running_norm_methods!();
}

/// A batch or instance norm's `[weight, bias, running_mean, running_var,
/// num_batches_tracked]` for `num_features` channels: with `affine` a weight
/// of ones and a bias of zeros, with `track_running_stats` a running mean of
/// zeros, a running variance of ones and no batches tracked.
pub(super) fn running_norm_state(
    num_features: usize,
    affine: bool,
    track_running_stats: bool,
    device: &Device,
) -> Result<[Option<Tensor>; 5]> {
    let c = [num_features];
    let (weight, bias) = if affine {
        (
            Some(fresh_parameter(Tensor::ones(c, DType::F32, device)?)?),
            Some(fresh_parameter(Tensor::zeros(c, DType::F32, device)?)?),
        )
    } else {
        (None, None)
    };
    let (running_mean, running_var, num_batches_tracked) = if track_running_stats {
        (
            Some(Tensor::zeros(c, DType::F32, device)?),
            Some(Tensor::ones(c, DType::F32, device)?),
            Some(Tensor::zeros([0usize; 0], DType::I64, device)?),
        )
    } else {
        (None, None, None)
    };
    Ok([weight, bias, running_mean, running_var, num_batches_tracked])
}

/// The named present tensors of `slots`.
pub(super) fn named<const N: usize>(slots: [(&str, &Option<Tensor>); N]) -> Vec<(String, Tensor)> {
    slots
        .into_iter()
        .filter_map(|(n, t)| t.as_ref().map(|t| (n.to_string(), t.clone())))
        .collect()
}

/// Replaces a norm's present weight and bias (the first two of `state`) with
/// `param` of them and its other present tensors (the running statistics and
/// batch count) with `buffer` of them (moving the layer, making it anew
/// uninitialised, or casting it).
pub(super) fn replace_norm_state(
    state: [&mut Option<Tensor>; 5],
    param: impl Fn(&Tensor) -> Result<Tensor>,
    buffer: impl Fn(&Tensor) -> Result<Tensor>,
) -> Result<()> {
    let [weight, bias, buffers @ ..] = state;
    for t in [weight, bias].into_iter().flatten() {
        *t = param(t)?;
    }
    for t in buffers.into_iter().flatten() {
        *t = buffer(t)?;
    }
    Ok(())
}

/// The `Module` methods but `forward` of a norm with an optional affine
/// `weight` and `bias` and optional running statistics `running_mean`,
/// `running_var` and `num_batches_tracked` (`BatchNorm`, `InstanceNorm`),
/// under PyTorch's state-dict names.
macro_rules! running_norm_methods {
    () => {
        fn named_parameters(&self) -> Vec<(String, Tensor)> {
            super::norm::named([("weight", &self.weight), ("bias", &self.bias)])
        }

        fn named_buffers(&self) -> Vec<(String, Tensor)> {
            super::norm::named([
                ("running_mean", &self.running_mean),
                ("running_var", &self.running_var),
                ("num_batches_tracked", &self.num_batches_tracked),
            ])
        }

        fn to_device(&mut self, device: &Device) -> Result<()> {
            running_norm_methods!(@replace self, |p| move_parameter(p, device), |b| b.to(device))
        }

        fn to_empty(&mut self, device: &Device) -> Result<()> {
            running_norm_methods!(
                @replace self,
                |p| empty_parameter(p, device),
                |b| Tensor::empty(b.shape(), b.dtype(), device)
            )
        }

        fn to_dtype(&mut self, dtype: DType) -> Result<()> {
            let cast = |t: &Tensor| cast_state(t, dtype);
            running_norm_methods!(@replace self, cast, cast)
        }

        fn reset_parameters(&mut self) -> Result<()> {
            // weight 1, bias 0; running mean 0, variance 1, no batches tracked
            let ones = [&self.weight, &self.running_var];
            let zeros = [&self.bias, &self.running_mean, &self.num_batches_tracked];
            for (ts, v) in [(&ones[..], 1.0), (&zeros[..], 0.0)] {
                for t in ts.iter().copied().flatten() {
                    assign(t, &t.full_like(v)?)?;
                }
            }
            Ok(())
        }

        fn set_training(&mut self, training: bool) {
            self.training = training;
        }
    };
    (@replace $self:tt, $param:expr, $buffer:expr) => {
        super::norm::replace_norm_state(
            [
                &mut $self.weight,
                &mut $self.bias,
                &mut $self.running_mean,
                &mut $self.running_var,
                &mut $self.num_batches_tracked,
            ],
            $param,
            $buffer,
        )
    };
}
pub(super) use running_norm_methods;
