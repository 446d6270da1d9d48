//! The convolution layers' `padding_mode`: zeros (the convolution's own
//! padding), or the input padded first by reflection, edge replication or
//! wrap-around, then convolved without padding, as PyTorch's layers do.

use crate::error::{Error, Result};
use crate::tensor::{PadMode, Tensor};

/// How a convolution layer pads its input (`padding_mode=` of `nn.Conv1d`,
/// `nn.Conv2d` and `nn.Conv3d`). Other than [`Zeros`](Self::Zeros) the layer
/// pads its input with [`Tensor::pad`] in that mode (by its padding, or for
/// `padding="same"` by `dilation · (k − 1)` per dim, the odd one after) and
/// convolves the result unpadded.
///
/// ```
/// use ember::nn::{self, Conv1dOptions, Module, PaddingMode};
/// use ember::prelude::*;
/// let dev = Device::Cpu;
/// let mut conv = nn::Conv1d::with_bias(1, 1, 3, false, Conv1dOptions::default().padding(1), &dev)?
///     .padding_mode(PaddingMode::Circular);
/// conv.weight = Tensor::new([[[1f32, 0.0, 0.0]]], &dev)?; // picks each left neighbour
/// let y = conv.forward(&Tensor::new([[[1f32, 2.0, 3.0]]], &dev)?)?;
/// assert_eq!(y.to_vec::<f32>()?, [3.0, 1.0, 2.0]); // the first wraps around
/// assert_eq!(PaddingMode::from_name("reflect")?, PaddingMode::Reflect);
/// # Ok::<(), ember::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PaddingMode {
    /// Zeros (`"zeros"`, the default).
    #[default]
    Zeros,
    /// The mirror image without the edge element (`"reflect"`).
    Reflect,
    /// The edge element repeated (`"replicate"`).
    Replicate,
    /// The other end's elements, as if each dim were a ring (`"circular"`).
    Circular,
}

impl PaddingMode {
    /// The mode PyTorch calls `name`: `"zeros"`, `"reflect"`, `"replicate"` or
    /// `"circular"`; PyTorch's error for any other.
    pub fn from_name(name: &str) -> Result<PaddingMode> {
        Ok(match name {
            "zeros" => PaddingMode::Zeros,
            "reflect" => PaddingMode::Reflect,
            "replicate" => PaddingMode::Replicate,
            "circular" => PaddingMode::Circular,
            _ => {
                return Err(Error::invalid(
                    "padding_mode",
                    format!(
                        "padding_mode must be one of {{'zeros', 'reflect', 'replicate', 'circular'}}, but got padding_mode='{name}'"
                    ),
                ))
            }
        })
    }

    /// PyTorch's name of the mode.
    pub fn name(self) -> &'static str {
        match self {
            PaddingMode::Zeros => "zeros",
            PaddingMode::Reflect => "reflect",
            PaddingMode::Replicate => "replicate",
            PaddingMode::Circular => "circular",
        }
    }

    /// The padding [`Tensor::pad`] does for this mode; `None` for zeros (the
    /// convolution's own).
    fn pad_mode(self) -> Option<PadMode> {
        match self {
            PaddingMode::Zeros => None,
            PaddingMode::Reflect => Some(PadMode::Reflect),
            PaddingMode::Replicate => Some(PadMode::Replicate),
            PaddingMode::Circular => Some(PadMode::Circular),
        }
    }

    /// `x` padded as this mode pads a convolution's input, `None` for zeros:
    /// each spatial dim (the last `kernel.len()`) by its `padding` on both
    /// sides, or with `same` by `dilation · (k − 1)`, the larger half after
    /// (PyTorch's `_reversed_padding_repeated_twice`).
    pub(crate) fn pad_input(
        self,
        x: &Tensor,
        kernel: &[usize],
        dilation: &[usize],
        padding: &[usize],
        same: bool,
    ) -> Result<Option<Tensor>> {
        let Some(mode) = self.pad_mode() else {
            return Ok(None);
        };
        // `pad` lists the last dim first
        let mut pads = Vec::with_capacity(2 * kernel.len());
        for i in (0..kernel.len()).rev() {
            let (before, after) = if same {
                let total = dilation[i] * kernel[i].saturating_sub(1);
                (total / 2, total - total / 2)
            } else {
                (padding[i], padding[i])
            };
            pads.extend([before as i64, after as i64]);
        }
        x.pad(&pads, mode).map(Some)
    }
}
