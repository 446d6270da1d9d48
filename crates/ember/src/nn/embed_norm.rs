//! `nn.Embedding`, `nn.LayerNorm`, `nn.GroupNorm` and `nn.RMSNorm`, with PyTorch's parameter
//! names, shapes and initial values.

use super::functional::{embedding, group_norm, layer_norm, rms_norm};
use super::layers::weight_bias_methods;
use super::norm::named;
use super::{assign, cast_state, empty_parameter, fresh_parameter, move_parameter, Module};
use crate::{
    device::Device,
    dtype::DType,
    error::{Error, Result},
    tensor::Tensor,
};

/// Runs `f` on each present parameter slot.
fn each(slots: [&mut Option<Tensor>; 2], f: impl Fn(&Tensor) -> Result<Tensor>) -> Result<()> {
    for t in slots.into_iter().flatten() {
        *t = f(t)?;
    }
    Ok(())
}

/// The [`Module`] methods of a norm with an optional affine `weight` (ones) and
/// `bias` (zeros): LayerNorm's and GroupNorm's state is handled alike.
macro_rules! affine_state_methods {
    () => {
        fn named_parameters(&self) -> Vec<(String, Tensor)> {
            named([("weight", &self.weight), ("bias", &self.bias)])
        }

        fn to_device(&mut self, device: &Device) -> Result<()> {
            each([&mut self.weight, &mut self.bias], |t| {
                move_parameter(t, device)
            })
        }

        fn to_empty(&mut self, device: &Device) -> Result<()> {
            each([&mut self.weight, &mut self.bias], |t| {
                empty_parameter(t, device)
            })
        }

        fn to_dtype(&mut self, dtype: DType) -> Result<()> {
            each([&mut self.weight, &mut self.bias], |t| cast_state(t, dtype))
        }

        fn reset_parameters(&mut self) -> Result<()> {
            for (t, v) in [(&self.weight, 1.0), (&self.bias, 0.0)] {
                if let Some(t) = t {
                    assign(t, &t.full_like(v)?)?;
                }
            }
            Ok(())
        }
    };
}

/// A lookup table of `num_embeddings` vectors of size `embedding_dim`
/// (`nn.Embedding`): the input is int64 indices of any shape, the output has one
/// more dim. `weight` starts standard normal, with the `padding_idx` row zero (and
/// that row gets no gradient).
pub struct Embedding {
    pub weight: Tensor,
    pub padding_idx: Option<i64>,
}

impl Embedding {
    pub fn new(num_embeddings: usize, embedding_dim: usize, device: &Device) -> Result<Embedding> {
        Embedding::with_padding(num_embeddings, embedding_dim, None, device)
    }

    /// A table holding a copy of `embeddings` `[num, dim]`
    /// (`nn.Embedding.from_pretrained`), on their device and in their dtype:
    /// `freeze` (PyTorch's default) keeps it out of training (no gradient).
    /// A padding row keeps its values; it gets no gradient.
    ///
    /// ```
    /// use ember::nn::{Embedding, Module};
    /// use ember::prelude::*;
    /// let vectors = Tensor::new(&[[0.5f32, 1.0], [2.0, 3.0]], &Device::Cpu)?;
    /// let table = Embedding::from_pretrained(&vectors, true, None)?;
    /// let rows = table.forward(&Tensor::new(&[1i64, 1, 0], &Device::Cpu)?)?;
    /// assert_eq!(rows.to_vec2::<f32>()?, [[2.0, 3.0], [2.0, 3.0], [0.5, 1.0]]);
    /// assert!(!table.weight.requires_grad());
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn from_pretrained(
        embeddings: &Tensor,
        freeze: bool,
        padding_idx: Option<i64>,
    ) -> Result<Embedding> {
        let (weight, padding_idx) = pretrained_table("Embedding", embeddings, freeze, padding_idx)?;
        Ok(Embedding {
            weight,
            padding_idx,
        })
    }

    /// With a padding row (negative counts from the end, as in PyTorch).
    pub fn with_padding(
        num_embeddings: usize,
        embedding_dim: usize,
        padding_idx: Option<i64>,
        device: &Device,
    ) -> Result<Embedding> {
        let (weight, padding_idx) = normal_table(
            "Embedding",
            (num_embeddings, embedding_dim),
            padding_idx,
            device,
        )?;
        Ok(Embedding {
            weight,
            padding_idx,
        })
    }
}

/// A lookup table's parameter `[num, dim]`, standard normal with the padding
/// row zero (PyTorch's start), and the padding index in `[0, num)` (a negative
/// one counts from the end; `op` names a refused one).
pub(super) fn normal_table(
    op: &'static str,
    (num, dim): (usize, usize),
    padding_idx: Option<i64>,
    device: &Device,
) -> Result<(Tensor, Option<i64>)> {
    let padding_idx = padding_index(op, num, padding_idx)?;
    let weight = fresh_parameter(Tensor::randn([num, dim], device)?)?;
    reset_table(&weight, padding_idx, false)?;
    Ok((weight, padding_idx))
}

/// A padding index in `[0, num)` (a negative one counts from the end; `op`
/// names a refused one).
fn padding_index(op: &'static str, num: usize, padding_idx: Option<i64>) -> Result<Option<i64>> {
    let n = num as i64;
    match padding_idx {
        Some(p) if !(-n..n).contains(&p) => Err(Error::invalid(
            op,
            "Padding_idx must be within num_embeddings",
        )),
        p => Ok(p.map(|p| if p < 0 { p + n } else { p })),
    }
}

/// A copy of `embeddings` `[num, dim]` as a table's parameter
/// (`from_pretrained`): frozen (no gradient) or trained; the padding row
/// keeps its values, as in PyTorch (it gets no gradient).
pub(super) fn pretrained_table(
    op: &'static str,
    embeddings: &Tensor,
    freeze: bool,
    padding_idx: Option<i64>,
) -> Result<(Tensor, Option<i64>)> {
    if embeddings.rank() != 2 {
        return Err(Error::invalid(
            op,
            format!(
                "Embeddings parameter is expected to be 2-dimensional, got shape {:?}",
                embeddings.shape()
            ),
        ));
    }
    let padding_idx = padding_index(op, embeddings.shape()[0], padding_idx)?;
    let copy = crate::autograd::no_grad(|| embeddings.detach().copy())?;
    Ok((copy.requires_grad_(!freeze)?, padding_idx))
}

/// A lookup table's parameter drawn again (`redraw`) and its padding row
/// zeroed.
pub(super) fn reset_table(weight: &Tensor, padding_idx: Option<i64>, redraw: bool) -> Result<()> {
    if redraw {
        let normal = Tensor::normal(0.0, 1.0, weight.shape(), weight.dtype(), &weight.device())?;
        assign(weight, &normal)?;
    }
    if let Some(p) = padding_idx {
        crate::autograd::no_grad(|| weight.narrow(0, p, 1)?.zero_())?;
    }
    Ok(())
}

impl Module for Embedding {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        embedding(x, &self.weight, self.padding_idx)
    }

    weight_bias_methods!(weight only);

    fn reset_parameters(&mut self) -> Result<()> {
        reset_table(&self.weight, self.padding_idx, true)
    }
}

/// Layer normalisation over the trailing dims `normalized_shape` (`nn.LayerNorm`):
/// `weight` ones and `bias` zeros of that shape (either may be left out), `eps`
/// `1e-5`.
pub struct LayerNorm {
    pub weight: Option<Tensor>,
    pub bias: Option<Tensor>,
    pub normalized_shape: Vec<usize>,
    pub eps: f64,
}

impl LayerNorm {
    /// With PyTorch's defaults: affine weight and bias, `eps = 1e-5`.
    pub fn new(normalized_shape: &[usize], device: &Device) -> Result<LayerNorm> {
        LayerNorm::with_options(normalized_shape, 1e-5, true, true, device)
    }

    /// `elementwise_affine = false` leaves out both parameters, `bias = false` the
    /// bias only.
    pub fn with_options(
        normalized_shape: &[usize],
        eps: f64,
        elementwise_affine: bool,
        bias: bool,
        device: &Device,
    ) -> Result<LayerNorm> {
        let ones = || -> Result<Tensor> {
            fresh_parameter(Tensor::ones(normalized_shape, DType::F32, device)?)
        };
        let zeros = || -> Result<Tensor> {
            fresh_parameter(Tensor::zeros(normalized_shape, DType::F32, device)?)
        };
        Ok(LayerNorm {
            weight: elementwise_affine.then(ones).transpose()?,
            bias: (elementwise_affine && bias).then(zeros).transpose()?,
            normalized_shape: normalized_shape.to_vec(),
            eps,
        })
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        layer_norm(
            x,
            &self.normalized_shape,
            self.weight.as_ref(),
            self.bias.as_ref(),
            self.eps,
        )
    }

    affine_state_methods!();
}

/// Group normalisation (`nn.GroupNorm`): [`group_norm`] of the input's
/// `num_channels` channels in `num_groups` groups, with a per-channel affine
/// `weight` (ones) and `bias` (zeros), the state-dict names PyTorch uses, unless
/// `affine` is off; `eps` `1e-5`. `num_channels` must be divisible by
/// `num_groups`.
///
/// ```
/// # use ember::{Device, Tensor};
/// use ember::nn::{GroupNorm, Module};
/// let dev = Device::Cpu;
/// let gn = GroupNorm::new(2, 4, &dev)?;
/// let x = Tensor::randn([3, 4, 5, 5], &dev)?;
/// assert_eq!(gn.forward(&x)?.shape(), &[3, 4, 5, 5]);
/// let names: Vec<String> = gn.named_parameters().into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, ["weight", "bias"]);
/// # Ok::<(), ember::Error>(())
/// ```
pub struct GroupNorm {
    pub weight: Option<Tensor>,
    pub bias: Option<Tensor>,
    pub num_groups: usize,
    pub num_channels: usize,
    pub eps: f64,
}

impl GroupNorm {
    /// With PyTorch's defaults: affine weight and bias, `eps = 1e-5`.
    pub fn new(num_groups: usize, num_channels: usize, device: &Device) -> Result<GroupNorm> {
        GroupNorm::with_options(num_groups, num_channels, 1e-5, true, device)
    }

    /// `affine = false` leaves out both parameters.
    pub fn with_options(
        num_groups: usize,
        num_channels: usize,
        eps: f64,
        affine: bool,
        device: &Device,
    ) -> Result<GroupNorm> {
        if num_groups == 0 || !num_channels.is_multiple_of(num_groups) {
            return Err(Error::invalid(
                "GroupNorm",
                format!(
                    "num_channels ({num_channels}) must be divisible by num_groups ({num_groups})"
                ),
            ));
        }
        let param = |v: f64| -> Result<Tensor> {
            fresh_parameter(Tensor::full([num_channels], v, DType::F32, device)?)
        };
        Ok(GroupNorm {
            weight: affine.then(|| param(1.0)).transpose()?,
            bias: affine.then(|| param(0.0)).transpose()?,
            num_groups,
            num_channels,
            eps,
        })
    }
}

impl Module for GroupNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        group_norm(
            x,
            self.num_groups,
            self.weight.as_ref(),
            self.bias.as_ref(),
            self.eps,
        )
    }

    affine_state_methods!();
}

/// Root-mean-square normalisation over the trailing dims (`nn.RMSNorm`): `weight`
/// ones (unless left out); `eps` `None` uses the machine epsilon, as PyTorch.
pub struct RMSNorm {
    pub weight: Option<Tensor>,
    pub normalized_shape: Vec<usize>,
    pub eps: Option<f64>,
}

impl RMSNorm {
    pub fn new(normalized_shape: &[usize], device: &Device) -> Result<RMSNorm> {
        RMSNorm::with_options(normalized_shape, None, true, device)
    }

    pub fn with_options(
        normalized_shape: &[usize],
        eps: Option<f64>,
        elementwise_affine: bool,
        device: &Device,
    ) -> Result<RMSNorm> {
        let weight = elementwise_affine
            .then(|| fresh_parameter(Tensor::ones(normalized_shape, DType::F32, device)?))
            .transpose()?;
        Ok(RMSNorm {
            weight,
            normalized_shape: normalized_shape.to_vec(),
            eps,
        })
    }
}

impl Module for RMSNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        rms_norm(x, &self.normalized_shape, self.weight.as_ref(), self.eps)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        named([("weight", &self.weight), ("bias", &None)])
    }

    fn to_device(&mut self, device: &Device) -> Result<()> {
        each([&mut self.weight, &mut None], |t| move_parameter(t, device))
    }

    fn to_empty(&mut self, device: &Device) -> Result<()> {
        each([&mut self.weight, &mut None], |t| {
            empty_parameter(t, device)
        })
    }

    fn to_dtype(&mut self, dtype: DType) -> Result<()> {
        each([&mut self.weight, &mut None], |t| cast_state(t, dtype))
    }

    fn reset_parameters(&mut self) -> Result<()> {
        if let Some(w) = &self.weight {
            assign(w, &w.ones_like()?)?;
        }
        Ok(())
    }
}
