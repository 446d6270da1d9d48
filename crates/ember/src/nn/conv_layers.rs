//! Convolutions beside `Conv2d`: `ConvTranspose2d` (the convolution's input
//! gradient run forward), `Conv1d` (a `conv2d` over a unit height) and
//! `Conv3d` and `ConvTranspose3d` (the tensor layer's composites of the 2-D
//! ones), with their functions.

use super::layers::{draw, reset_conv, weight_bias_methods};
use super::{cast_state, empty_parameter, move_parameter, parameter, Module};
use crate::tensor::{Conv2dOptions, Conv3dOptions, ConvTranspose2dOptions, ConvTranspose3dOptions};
use crate::{
    device::Device,
    dtype::DType,
    error::{Error, Result},
    tensor::Tensor,
};
pub use padding_mode::PaddingMode;

mod padding_mode;

/// PyTorch's refusal of channel counts that groups do not divide.
pub(super) fn check_groups(
    op: &'static str,
    in_channels: usize,
    out_channels: usize,
    g: usize,
) -> Result<()> {
    let problem = if g == 0 {
        "groups must be a positive integer"
    } else if !in_channels.is_multiple_of(g) {
        "in_channels must be divisible by groups"
    } else if !out_channels.is_multiple_of(g) {
        "out_channels must be divisible by groups"
    } else {
        return Ok(());
    };
    Err(Error::invalid(
        op,
        format!("{problem} (in_channels {in_channels}, out_channels {out_channels}, groups {g})"),
    ))
}

/// 2-D transposed convolution (`F.conv_transpose2d`); see
/// [`Tensor::conv_transpose2d`].
pub fn conv_transpose2d(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    options: ConvTranspose2dOptions,
) -> Result<Tensor> {
    let _record = crate::profiler::function("conv_transpose2d");
    x.conv_transpose2d(weight, bias, options)
}

/// 2-D transposed convolution layer (`nn.ConvTranspose2d`): weight `[in, out /
/// groups, kH, kW]` (PyTorch's layout) and an optional bias `[out]`, uniform in
/// `±1/sqrt(fan_in)` with `fan_in = out / groups · kH · kW` (PyTorch's fan of
/// that layout). State-dict names `weight` and `bias`.
///
/// ```
/// use ember::nn::{self, ConvTranspose2dOptions, Module};
/// use ember::prelude::*;
/// let opts = ConvTranspose2dOptions::default().stride(2).padding(1).output_padding(1);
/// let up = nn::ConvTranspose2d::new(8, 4, 3, opts, &Device::Meta)?;
/// assert_eq!(up.weight.shape(), &[8, 4, 3, 3]);
/// let y = up.forward(&Tensor::zeros([2, 8, 5, 5], DType::F32, &Device::Meta)?)?;
/// assert_eq!(y.shape(), &[2, 4, 10, 10]);
/// # Ok::<(), ember::Error>(())
/// ```
pub struct ConvTranspose2d {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub options: ConvTranspose2dOptions,
}

impl ConvTranspose2d {
    /// A square `kernel × kernel` layer with bias.
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        options: ConvTranspose2dOptions,
        device: &Device,
    ) -> Result<ConvTranspose2d> {
        ConvTranspose2d::with_kernel(
            in_channels,
            out_channels,
            (kernel, kernel),
            true,
            options,
            device,
        )
    }

    /// A `kH × kW` layer with or without bias (`nn.ConvTranspose2d(in, out,
    /// (kH, kW), bias=...)`).
    pub fn with_kernel(
        in_channels: usize,
        out_channels: usize,
        (kh, kw): (usize, usize),
        bias: bool,
        options: ConvTranspose2dOptions,
        device: &Device,
    ) -> Result<ConvTranspose2d> {
        const OP: &str = "ConvTranspose2d";
        let g = options.groups;
        check_groups(OP, in_channels, out_channels, g)?;
        let shape = [in_channels, out_channels / g, kh, kw];
        let (weight, bias) = draw(OP, &shape, out_channels, bias, device)?;
        Ok(ConvTranspose2d {
            weight,
            bias,
            options,
        })
    }

    /// A layer with the given weight `[in, out / groups, kH, kW]` and bias
    /// `[out]` (copied into fresh parameters).
    pub fn from_weights(
        weight: &Tensor,
        bias: Option<&Tensor>,
        options: ConvTranspose2dOptions,
    ) -> Result<ConvTranspose2d> {
        let out = weight.shape().get(1).map(|o| o * options.groups);
        let bias_fits = |b: &Tensor| out.is_some_and(|o| b.shape() == [o]);
        if weight.rank() != 4 || bias.is_some_and(|b| !bias_fits(b)) {
            return Err(Error::invalid(
                "ConvTranspose2d",
                format!(
                    "expected weight [in, out / groups, kH, kW] and bias [out], got {:?} and {:?}",
                    weight.shape(),
                    bias.map(|b| b.shape().to_vec())
                ),
            ));
        }
        Ok(ConvTranspose2d {
            weight: parameter(weight.clone())?,
            bias: bias.map(|b| parameter(b.clone())).transpose()?,
            options,
        })
    }

    /// `forward` with the output's height and width given (`module(x,
    /// output_size=...)`): the output padding that gives them, which must lie
    /// within a stride of the smallest output, as PyTorch requires.
    pub fn forward_with_output_size(&self, x: &Tensor, size: (usize, usize)) -> Result<Tensor> {
        let o = self.options;
        let r = x.rank();
        if !(r == 3 || r == 4) || self.weight.rank() != 4 {
            return x.conv_transpose2d(&self.weight, self.bias.as_ref(), o);
        }
        let k = (self.weight.shape()[2], self.weight.shape()[3]);
        let input = (x.shape()[r - 2], x.shape()[r - 1]);
        let axis = |i: usize, k: usize, s: usize, p: usize, d: usize, want: usize| {
            let min =
                (i as i128 - 1) * s as i128 - 2 * p as i128 + (d * k.saturating_sub(1)) as i128 + 1;
            let max = min + s as i128 - 1;
            if (min..=max).contains(&(want as i128)) {
                Ok((want as i128 - min) as usize)
            } else {
                Err(Error::invalid(
                    "ConvTranspose2d",
                    format!(
                        "requested an output size of {size:?}, but valid sizes range from {min} to {max} (for an input of {input:?})"
                    ),
                ))
            }
        };
        let ph = axis(input.0, k.0, o.stride.0, o.padding.0, o.dilation.0, size.0)?;
        let pw = axis(input.1, k.1, o.stride.1, o.padding.1, o.dilation.1, size.1)?;
        let opts = ConvTranspose2dOptions {
            output_padding: (ph, pw),
            ..o
        };
        x.conv_transpose2d(&self.weight, self.bias.as_ref(), opts)
    }
}

impl Module for ConvTranspose2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.conv_transpose2d(&self.weight, self.bias.as_ref(), self.options)
    }

    weight_bias_methods!();

    fn reset_parameters(&mut self) -> Result<()> {
        reset_conv(&self.weight, self.bias.as_ref())
    }
}

/// Stride, zero padding, dilation and groups of a 1-D convolution (PyTorch's
/// defaults: 1, 0, 1, 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv1dOptions {
    pub stride: usize,
    pub padding: usize,
    pub dilation: usize,
    pub groups: usize,
}

impl Default for Conv1dOptions {
    fn default() -> Self {
        Conv1dOptions {
            stride: 1,
            padding: 0,
            dilation: 1,
            groups: 1,
        }
    }
}

impl Conv1dOptions {
    /// The stride.
    pub fn stride(mut self, s: usize) -> Self {
        self.stride = s;
        self
    }
    /// The zero padding on each side.
    pub fn padding(mut self, p: usize) -> Self {
        self.padding = p;
        self
    }
    /// The dilation.
    pub fn dilation(mut self, d: usize) -> Self {
        self.dilation = d;
        self
    }
    /// Channel groups (`groups = C` is a depthwise convolution).
    pub fn groups(mut self, g: usize) -> Self {
        self.groups = g;
        self
    }

    fn as_2d(self) -> Conv2dOptions {
        Conv2dOptions {
            stride: (1, self.stride),
            padding: (0, self.padding),
            dilation: (1, self.dilation),
            groups: self.groups,
        }
    }
}

/// 1-D convolution (`F.conv1d`): input `[N, C, L]` (or `[C, L]`), weight `[O, C
/// / groups, K]`, optional bias `[O]`; the output is `[N, O, L_out]` with
/// `L_out = (L + 2·padding - dilation·(K - 1) - 1) / stride + 1`. It is
/// `conv2d` over a unit height (the same kernels, cuDNN on a GPU), with
/// PyTorch's errors for 1-D shapes.
///
/// ```
/// use ember::nn::functional::conv1d;
/// use ember::nn::Conv1dOptions;
/// use ember::prelude::*;
/// let x = Tensor::ones([2, 3, 10], DType::F32, &Device::Cpu)?;
/// let w = Tensor::ones([4, 3, 3], DType::F32, &Device::Cpu)?;
/// let y = conv1d(&x, &w, None, Conv1dOptions::default().padding(1).stride(2))?;
/// assert_eq!(y.shape(), &[2, 4, 5]);
/// # Ok::<(), ember::Error>(())
/// ```
pub fn conv1d(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    options: Conv1dOptions,
) -> Result<Tensor> {
    let _record = crate::profiler::function("conv1d");
    conv1d_with(x, weight, bias, options, false)
}

/// [`conv1d`], or with `same` its `padding="same"` (stride 1; the output keeps
/// the input's length, an odd total padding's extra zero at the end).
fn conv1d_with(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    options: Conv1dOptions,
    same: bool,
) -> Result<Tensor> {
    const OP: &str = "conv1d";
    if !(x.rank() == 2 || x.rank() == 3) {
        return Err(Error::shape(
            OP,
            x.shape(),
            weight.shape(),
            format!(
                "Expected 2D (unbatched) or 3D (batched) input to conv1d, but got input of size: {:?}",
                x.shape()
            ),
        ));
    }
    if weight.rank() != 3 {
        return Err(Error::shape(
            OP,
            x.shape(),
            weight.shape(),
            format!(
                "weight should have at least three dimensions, and exactly three for conv1d; got weight of size {:?}",
                weight.shape()
            ),
        ));
    }
    if x.rank() == 2 {
        return conv1d_with(&x.unsqueeze(0)?, weight, bias, options, same)?.squeeze(0);
    }
    let (c, l) = (x.shape()[1], x.shape()[2]);
    let [o, cg, k] = [0, 1, 2].map(|d| weight.shape()[d]);
    let g = options.groups;
    if g == 0 {
        return Err(Error::invalid(OP, "non-positive groups is not supported"));
    }
    if cg * g != c {
        return Err(Error::shape(
            OP,
            x.shape(),
            weight.shape(),
            format!(
                "Given groups={g}, weight of size {:?}, expected input{:?} to have {} channels, but got {c} channels instead",
                weight.shape(),
                x.shape(),
                cg * g
            ),
        ));
    }
    if !o.is_multiple_of(g) {
        return Err(Error::shape(
            OP,
            x.shape(),
            weight.shape(),
            format!(
                "Given groups={g}, expected weight to be divisible by {g} at dimension 0, but got weight of size {:?} instead",
                weight.shape()
            ),
        ));
    }
    let reach = options.dilation.saturating_mul(k.saturating_sub(1)) + 1;
    let padded = l + 2 * if same { 0 } else { options.padding };
    if !same && k > 0 && reach > padded {
        return Err(Error::shape(
            OP,
            x.shape(),
            weight.shape(),
            format!(
                "Calculated padded input size per channel: ({padded}). Kernel size: ({reach}). Kernel size can't be greater than actual input size"
            ),
        ));
    }
    let (x2, w2) = (x.unsqueeze(2)?, weight.unsqueeze(2)?);
    let y = match same {
        true => x2.conv2d_same_opts(&w2, bias, options.as_2d())?,
        false => x2.conv2d(&w2, bias, options.as_2d())?,
    };
    y.squeeze(2)
}

/// 1-D convolution layer (`nn.Conv1d`): weight `[out, in / groups, k]` and an
/// optional bias `[out]`, uniform in `±1/sqrt(fan_in)` with `fan_in = in /
/// groups · k`, PyTorch's default. State-dict names `weight` and `bias`.
///
/// ```
/// use ember::nn::{self, Conv1dOptions, Module};
/// use ember::prelude::*;
/// let conv = nn::Conv1d::new(3, 8, 5, Conv1dOptions::default().padding(2), &Device::Cpu)?;
/// let y = conv.forward(&Tensor::zeros([4, 3, 16], DType::F32, &Device::Cpu)?)?;
/// assert_eq!(y.shape(), &[4, 8, 16]);
/// # Ok::<(), ember::Error>(())
/// ```
pub struct Conv1d {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub options: Conv1dOptions,
    /// `padding="same"`: the output keeps the input's length (stride 1; the
    /// padding of `options` is then not used). See [`Conv1d::padding_same`].
    pub same: bool,
    /// How the input is padded (`padding_mode=`; zeros by default).
    pub padding_mode: PaddingMode,
}

impl Conv1d {
    /// A layer with bias.
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        options: Conv1dOptions,
        device: &Device,
    ) -> Result<Conv1d> {
        Conv1d::with_bias(in_channels, out_channels, kernel, true, options, device)
    }

    /// A layer with or without bias (`nn.Conv1d(..., bias=False)`).
    pub fn with_bias(
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        bias: bool,
        options: Conv1dOptions,
        device: &Device,
    ) -> Result<Conv1d> {
        const OP: &str = "Conv1d";
        let g = options.groups;
        check_groups(OP, in_channels, out_channels, g)?;
        let shape = [out_channels, in_channels / g, kernel];
        let (weight, bias) = draw(OP, &shape, out_channels, bias, device)?;
        Ok(Conv1d {
            weight,
            bias,
            options,
            same: false,
            padding_mode: PaddingMode::Zeros,
        })
    }

    /// The layer padding its input in `mode` (`nn.Conv1d(...,
    /// padding_mode=...)`); see [`PaddingMode`].
    pub fn padding_mode(mut self, mode: PaddingMode) -> Conv1d {
        self.padding_mode = mode;
        self
    }

    /// The layer with `padding="same"` (`nn.Conv1d(..., padding="same")`):
    /// refused for a stride other than 1, as in PyTorch.
    pub fn padding_same(mut self) -> Result<Conv1d> {
        if self.options.stride != 1 {
            return Err(Error::invalid(
                "Conv1d",
                "padding='same' is not supported for strided convolutions",
            ));
        }
        self.same = true;
        Ok(self)
    }
}

impl Module for Conv1d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if self.same && self.options.stride != 1 {
            return Err(Error::invalid(
                "Conv1d",
                "padding='same' is not supported for strided convolutions",
            ));
        }
        let o = self.options;
        let k = &self.weight.shape()[self.weight.rank().saturating_sub(1)..];
        if let Some(xp) =
            self.padding_mode
                .pad_input(x, k, &[o.dilation], &[o.padding], self.same)?
        {
            let unpadded = Conv1dOptions { padding: 0, ..o };
            return conv1d_with(&xp, &self.weight, self.bias.as_ref(), unpadded, false);
        }
        conv1d_with(x, &self.weight, self.bias.as_ref(), o, self.same)
    }

    weight_bias_methods!(no to_memory_format);

    fn reset_parameters(&mut self) -> Result<()> {
        reset_conv(&self.weight, self.bias.as_ref())
    }
}

/// 3-D convolution (`F.conv3d`): input `[N, C, D, H, W]` (or `[C, D, H, W]`),
/// weight `[O, C / groups, kD, kH, kW]`, optional bias `[O]`; see
/// [`Tensor::conv3d`] (and [`Tensor::conv3d_same_opts`] for
/// `padding="same"`).
///
/// ```
/// use ember::nn::functional::conv3d;
/// use ember::prelude::*;
/// let x = Tensor::ones([1, 2, 4, 5, 5], DType::F32, &Device::Cpu)?;
/// let w = Tensor::ones([6, 1, 3, 3, 3], DType::F32, &Device::Cpu)?;
/// let b = Tensor::zeros([6], DType::F32, &Device::Cpu)?;
/// let y = conv3d(&x, &w, Some(&b), Conv3dOptions::default().groups(2).padding(1))?;
/// assert_eq!(y.shape(), &[1, 6, 4, 5, 5]);
/// # Ok::<(), ember::Error>(())
/// ```
pub fn conv3d(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    options: Conv3dOptions,
) -> Result<Tensor> {
    let _record = crate::profiler::function("conv3d");
    x.conv3d(weight, bias, options)
}

/// 3-D convolution layer (`nn.Conv3d`): weight `[out, in / groups, kD, kH,
/// kW]` and an optional bias `[out]`, uniform in `±1/sqrt(fan_in)` with
/// `fan_in = in / groups · kD · kH · kW`, PyTorch's default. State-dict names
/// `weight` and `bias`, so a PyTorch `Conv3d`'s state dict loads.
///
/// ```
/// use ember::nn::{self, Module};
/// use ember::prelude::*;
/// let conv = nn::Conv3d::new(3, 8, 3, Conv3dOptions::default().padding(1), &Device::Cpu)?;
/// assert_eq!(conv.weight.shape(), &[8, 3, 3, 3, 3]);
/// let y = conv.forward(&Tensor::zeros([2, 3, 4, 6, 6], DType::F32, &Device::Cpu)?)?;
/// assert_eq!(y.shape(), &[2, 8, 4, 6, 6]);
/// # Ok::<(), ember::Error>(())
/// ```
pub struct Conv3d {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub options: Conv3dOptions,
    /// `padding="same"`: the output keeps the input's size (stride 1; the
    /// padding of `options` is then not used). See [`Conv3d::padding_same`].
    pub same: bool,
    /// How the input is padded (`padding_mode=`; zeros by default).
    pub padding_mode: PaddingMode,
}

impl Conv3d {
    /// A cubic `kernel × kernel × kernel` layer with bias.
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        options: Conv3dOptions,
        device: &Device,
    ) -> Result<Conv3d> {
        let k = (kernel, kernel, kernel);
        Conv3d::with_kernel(in_channels, out_channels, k, true, options, device)
    }

    /// A `kD × kH × kW` layer with or without bias (`nn.Conv3d(in, out, (kD,
    /// kH, kW), bias=...)`). The weight is drawn first, then the bias, as
    /// PyTorch does.
    pub fn with_kernel(
        in_channels: usize,
        out_channels: usize,
        (kd, kh, kw): (usize, usize, usize),
        bias: bool,
        options: Conv3dOptions,
        device: &Device,
    ) -> Result<Conv3d> {
        const OP: &str = "Conv3d";
        let g = options.groups;
        check_groups(OP, in_channels, out_channels, g)?;
        let shape = [out_channels, in_channels / g, kd, kh, kw];
        let (weight, bias) = draw(OP, &shape, out_channels, bias, device)?;
        Ok(Conv3d {
            weight,
            bias,
            options,
            same: false,
            padding_mode: PaddingMode::Zeros,
        })
    }

    /// The layer padding its input in `mode` (`nn.Conv3d(...,
    /// padding_mode=...)`); see [`PaddingMode`].
    pub fn padding_mode(mut self, mode: PaddingMode) -> Conv3d {
        self.padding_mode = mode;
        self
    }

    /// The layer with `padding="same"` (`nn.Conv3d(..., padding="same")`):
    /// refused for a stride other than 1, as in PyTorch.
    pub fn padding_same(mut self) -> Result<Conv3d> {
        if self.options.stride != (1, 1, 1) {
            return Err(Error::invalid(
                "Conv3d",
                "padding='same' is not supported for strided convolutions",
            ));
        }
        self.same = true;
        Ok(self)
    }
}

impl Module for Conv3d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let b = self.bias.as_ref();
        let o = self.options;
        if self.same && o.stride != (1, 1, 1) {
            return Err(Error::invalid(
                "conv3d",
                "padding='same' is not supported for strided convolutions",
            ));
        }
        let k = &self.weight.shape()[self.weight.rank().saturating_sub(3)..];
        let (dil, pad) = (
            [o.dilation.0, o.dilation.1, o.dilation.2],
            [o.padding.0, o.padding.1, o.padding.2],
        );
        if let Some(xp) = self.padding_mode.pad_input(x, k, &dil, &pad, self.same)? {
            let unpadded = Conv3dOptions {
                padding: (0, 0, 0),
                ..o
            };
            return xp.conv3d(&self.weight, b, unpadded);
        }
        match self.same {
            true => x.conv3d_same_opts(&self.weight, b, self.options),
            false => x.conv3d(&self.weight, b, self.options),
        }
    }

    weight_bias_methods!(no to_memory_format);

    fn reset_parameters(&mut self) -> Result<()> {
        reset_conv(&self.weight, self.bias.as_ref())
    }
}

/// 3-D transposed convolution (`F.conv_transpose3d`); see
/// [`Tensor::conv_transpose3d`].
pub fn conv_transpose3d(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    options: ConvTranspose3dOptions,
) -> Result<Tensor> {
    let _record = crate::profiler::function("conv_transpose3d");
    x.conv_transpose3d(weight, bias, options)
}

/// 3-D transposed convolution layer (`nn.ConvTranspose3d`): weight `[in, out
/// / groups, kD, kH, kW]` (PyTorch's layout) and an optional bias `[out]`,
/// uniform in `±1/sqrt(fan_in)` with `fan_in = out / groups · kD · kH · kW`
/// (PyTorch's fan of that layout). State-dict names `weight` and `bias`.
///
/// ```
/// use ember::nn::{self, ConvTranspose3dOptions, Module};
/// use ember::prelude::*;
/// let opts = ConvTranspose3dOptions::default().stride(2);
/// let up = nn::ConvTranspose3d::new(8, 4, 2, opts, &Device::Meta)?;
/// assert_eq!(up.weight.shape(), &[8, 4, 2, 2, 2]);
/// let y = up.forward(&Tensor::zeros([2, 8, 3, 5, 5], DType::F32, &Device::Meta)?)?;
/// assert_eq!(y.shape(), &[2, 4, 6, 10, 10]);
/// # Ok::<(), ember::Error>(())
/// ```
pub struct ConvTranspose3d {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub options: ConvTranspose3dOptions,
}

impl ConvTranspose3d {
    /// A cubic `kernel × kernel × kernel` layer with bias.
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        options: ConvTranspose3dOptions,
        device: &Device,
    ) -> Result<ConvTranspose3d> {
        let k = (kernel, kernel, kernel);
        ConvTranspose3d::with_kernel(in_channels, out_channels, k, true, options, device)
    }

    /// A `kD × kH × kW` layer with or without bias.
    pub fn with_kernel(
        in_channels: usize,
        out_channels: usize,
        (kd, kh, kw): (usize, usize, usize),
        bias: bool,
        options: ConvTranspose3dOptions,
        device: &Device,
    ) -> Result<ConvTranspose3d> {
        const OP: &str = "ConvTranspose3d";
        let g = options.groups;
        check_groups(OP, in_channels, out_channels, g)?;
        let shape = [in_channels, out_channels / g, kd, kh, kw];
        let (weight, bias) = draw(OP, &shape, out_channels, bias, device)?;
        Ok(ConvTranspose3d {
            weight,
            bias,
            options,
        })
    }

    /// `forward` with the output's depth, height and width given
    /// (`module(x, output_size=...)`): the output padding that gives them,
    /// which must lie within a stride of the smallest output, as PyTorch
    /// requires.
    pub fn forward_with_output_size(
        &self,
        x: &Tensor,
        size: (usize, usize, usize),
    ) -> Result<Tensor> {
        let o = self.options;
        let r = x.rank();
        if !(r == 4 || r == 5) || self.weight.rank() != 5 {
            return x.conv_transpose3d(&self.weight, self.bias.as_ref(), o);
        }
        let want = [size.0, size.1, size.2];
        let input: [usize; 3] = std::array::from_fn(|i| x.shape()[r - 3 + i]);
        let (s, p, d) = (
            [o.stride.0, o.stride.1, o.stride.2],
            [o.padding.0, o.padding.1, o.padding.2],
            [o.dilation.0, o.dilation.1, o.dilation.2],
        );
        let mut pads = [0usize; 3];
        for i in 0..3 {
            let k = self.weight.shape()[2 + i];
            let min = (input[i] as i128 - 1) * s[i] as i128 - 2 * p[i] as i128
                + (d[i] * k.saturating_sub(1)) as i128
                + 1;
            let max = min + s[i] as i128 - 1;
            if !(min..=max).contains(&(want[i] as i128)) {
                return Err(Error::invalid(
                    "ConvTranspose3d",
                    format!(
                        "requested an output size of {size:?}, but valid sizes range from {min} to {max} (for an input of {input:?})"
                    ),
                ));
            }
            pads[i] = (want[i] as i128 - min) as usize;
        }
        let opts = ConvTranspose3dOptions {
            output_padding: (pads[0], pads[1], pads[2]),
            ..o
        };
        x.conv_transpose3d(&self.weight, self.bias.as_ref(), opts)
    }
}

impl Module for ConvTranspose3d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.conv_transpose3d(&self.weight, self.bias.as_ref(), self.options)
    }

    weight_bias_methods!(no to_memory_format);

    fn reset_parameters(&mut self) -> Result<()> {
        reset_conv(&self.weight, self.bias.as_ref())
    }
}
