//! Neural-network building blocks: the [`Module`] trait, layers, activations and
//! losses, with PyTorch's default initialisation.
//!
//! ```
//! use ember::nn::{self, Module};
//! use ember::prelude::*;
//! let dev = Device::Cpu;
//! let model = nn::Sequential::new()
//!     .add(nn::Linear::new(4, 8, &dev)?)
//!     .add(nn::ReLU)
//!     .add(nn::Linear::new(8, 3, &dev)?);
//! let x = Tensor::randn([5, 4], &dev)?;
//! assert_eq!(model.forward(&x)?.shape(), &[5, 3]);
//! assert_eq!(model.num_parameters(), 4 * 8 + 8 + 8 * 3 + 3);
//! # Ok::<(), ember::Error>(())
//! ```

mod layers;
mod loss;
mod norm;

pub use layers::{
    AvgPool2d, Conv2d, Dropout, Flatten, LazyLinear, Linear, MaxPool2d, ReLU, Sequential, Sigmoid,
    Softmax, Tanh, GELU,
};
pub use loss::{bce_with_logits, cross_entropy, cross_entropy_with, mse_loss, nll_loss, Reduction};
pub use norm::{BatchNorm, BatchNorm1d, BatchNorm2d};

use crate::{Device, Result, Tensor};

/// A layer or model: a forward function over parameters it owns.
pub trait Module: Send + Sync {
    /// Computes the output for `x`.
    fn forward(&self, x: &Tensor) -> Result<Tensor>;

    /// The parameters with dotted names (`"0.weight"`), in a stable order.
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }

    /// The buffers: state that is saved with the model but not trained (batch
    /// norm's running statistics), named like the parameters.
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }

    /// Parameters then buffers: what `state_dict` files hold.
    fn state_dict(&self) -> Vec<(String, Tensor)> {
        let mut all = self.named_parameters();
        all.extend(self.named_buffers());
        all
    }

    /// Moves every parameter (and buffer) to `device`.
    fn to_device(&mut self, _device: &Device) -> Result<()> {
        Ok(())
    }

    /// Switches between training (`true`) and evaluation behaviour (dropout, batch norm).
    fn set_training(&mut self, _training: bool) {}

    /// The parameters, in the order of [`named_parameters`](Self::named_parameters).
    fn parameters(&self) -> Vec<Tensor> {
        self.named_parameters()
            .into_iter()
            .map(|(_, p)| p)
            .collect()
    }

    /// The number of scalar parameters.
    fn num_parameters(&self) -> usize {
        self.parameters().iter().map(|p| p.numel()).sum()
    }

    /// `model.train()`.
    fn train(&mut self) {
        self.set_training(true)
    }

    /// `model.eval()`.
    fn eval(&mut self) {
        self.set_training(false)
    }
}

/// A fresh leaf that requires a gradient, holding `t`'s values.
pub(crate) fn parameter(t: Tensor) -> Result<Tensor> {
    crate::no_grad(|| t.detach().copy())?.requires_grad_(true)
}

/// A parameter moved to `device` (still a leaf that requires a gradient).
pub(crate) fn move_parameter(p: &Tensor, device: &Device) -> Result<Tensor> {
    if p.device() == *device {
        return Ok(p.clone());
    }
    crate::no_grad(|| p.detach().to(device))?.requires_grad_(p.requires_grad())
}
