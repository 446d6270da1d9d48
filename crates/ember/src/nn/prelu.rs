//! The parametric ReLU (`nn.PReLU`, `F.prelu`).

use super::layers::weight_bias_methods;
use super::{assign, cast_state, empty_parameter, fresh_parameter, move_parameter, Module};
use crate::{
    device::Device,
    dtype::DType,
    error::{Error, Result},
    tensor::Tensor,
};

/// `max(0, x) + weight · min(0, x)` (`F.prelu`), `weight` a learned slope of
/// one element, or one per channel (dim 1 of `x`; an input of rank 0 or 1 has
/// one channel). Written as `where(x > 0, x, weight · x)`, so the gradients
/// are PyTorch's: at `x = 0` the input gets `weight ·` its gradient and the
/// weight `x ·` it (zero).
///
/// ```
/// use ember::nn::functional::prelu;
/// use ember::prelude::*;
/// let x = Tensor::new(&[[-2f32, 3.0], [4.0, -1.0]], &Device::Cpu)?;
/// let w = Tensor::new(&[0.5f32, 0.25], &Device::Cpu)?;
/// assert_eq!(prelu(&x, &w)?.to_vec2::<f32>()?, [[-1.0, 3.0], [4.0, -0.25]]);
/// # Ok::<(), ember::Error>(())
/// ```
pub fn prelu(x: &Tensor, weight: &Tensor) -> Result<Tensor> {
    let _record = crate::profiler::function("prelu");
    const OP: &str = "prelu";
    crate::tensor::same_device(OP, &[x, weight])?;
    // a lower-precision op under autocast, as PyTorch lists it
    if let Some(c) = crate::tensor::autocast::lower(&[x, weight])? {
        return prelu(&c[0], &c[1]);
    }
    if weight.rank() > 1 {
        return Err(Error::shape(
            OP,
            x.shape(),
            weight.shape(),
            format!(
                "prelu: Expected `weight` to be a scalar or 1D tensor, but got: ndim = {}",
                weight.rank()
            ),
        ));
    }
    if !x.dtype().is_float() {
        return Err(crate::tensor::not_implemented_for(
            OP,
            "prelu_cpu",
            x.dtype(),
        ));
    }
    if weight.dtype() != x.dtype() {
        return Err(Error::DTypeMismatch {
            op: OP,
            lhs: x.dtype(),
            rhs: weight.dtype(),
        });
    }
    let n = weight.numel();
    let slope = if n == 1 {
        weight.reshape(Vec::<usize>::new())?
    } else {
        let channels = if x.rank() > 1 { x.shape()[1] } else { 1 };
        if channels != n {
            return Err(Error::shape(
                OP,
                x.shape(),
                weight.shape(),
                format!(
                    "Mismatch of parameter numbers and input channel size. Found parameter numbers = {n} and channel size = {channels}."
                ),
            ));
        }
        let mut shape = vec![n];
        shape.extend(std::iter::repeat_n(1, x.rank() - 2));
        weight.reshape(shape)?
    };
    x.gt(0.0)?.where_(x, &x.mul(&slope)?)
}

/// The parametric ReLU layer (`nn.PReLU(num_parameters, init)`): a learned
/// slope for negative inputs, one for all channels or one per channel,
/// starting at `init` (PyTorch's default 0.25). State-dict name `weight`.
///
/// ```
/// use ember::nn::{self, Module};
/// use ember::prelude::*;
/// let act = nn::PReLU::new(1, &Device::Cpu)?;
/// let y = act.forward(&Tensor::new(&[-4f32, 2.0], &Device::Cpu)?)?;
/// assert_eq!(y.to_vec::<f32>()?, [-1.0, 2.0]);
/// # Ok::<(), ember::Error>(())
/// ```
pub struct PReLU {
    pub weight: Tensor,
    init: f64,
}

impl PReLU {
    /// `num_parameters` slopes (1, or the number of channels) of 0.25.
    pub fn new(num_parameters: usize, device: &Device) -> Result<PReLU> {
        PReLU::with_init(num_parameters, 0.25, device)
    }

    /// `num_parameters` slopes of `init`.
    pub fn with_init(num_parameters: usize, init: f64, device: &Device) -> Result<PReLU> {
        let weight = Tensor::full([num_parameters], init, DType::F32, device)?;
        Ok(PReLU {
            weight: fresh_parameter(weight)?,
            init,
        })
    }
}

impl Module for PReLU {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        prelu(x, &self.weight)
    }

    weight_bias_methods!(weight only);

    fn reset_parameters(&mut self) -> Result<()> {
        assign(&self.weight, &self.weight.full_like(self.init)?)
    }
}
