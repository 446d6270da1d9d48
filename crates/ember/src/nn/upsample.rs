//! Resampling (`F.interpolate`, `nn.Upsample`): nearest, nearest-exact,
//! linear, bicubic and area modes over 1, 2 or 3 spatial dims, and
//! antialiased bilinear and bicubic: the options, PyTorch's checks and output
//! sizes here, the arithmetic in `resample.rs`.

use super::resample::resample;
use super::Module;
use crate::{
    error::{Error, Result},
    layout::MemoryFormat,
    tensor::{autocast, Tensor},
};

/// How [`interpolate`] computes an output element (`mode=` of `F.interpolate`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InterpolateMode {
    /// PyTorch's legacy `"nearest"`: source index `floor(dst · scale)`.
    #[default]
    Nearest,
    /// `"nearest-exact"`: source index `floor((dst + 0.5) · scale)`, which
    /// matches image libraries' nearest resampling.
    NearestExact,
    /// `"linear"`: 3-D input `[N, C, W]`.
    Linear,
    /// `"bilinear"`: 4-D input `[N, C, H, W]`.
    Bilinear,
    /// `"trilinear"`: 5-D input `[N, C, D, H, W]`.
    Trilinear,
    /// `"bicubic"`: 4-D input; Keys' cubic convolution (`a = -0.75`) over the
    /// 4 × 4 nearest sources, edges repeated. It overshoots: the output can
    /// leave the input's range.
    Bicubic,
    /// `"area"`: each output is the mean of the input cells its window covers
    /// (adaptive average pooling: `F.adaptive_avg_pool1d/2d/3d`).
    Area,
}

impl InterpolateMode {
    /// PyTorch's name of the mode.
    pub fn name(self) -> &'static str {
        match self {
            InterpolateMode::Nearest => "nearest",
            InterpolateMode::NearestExact => "nearest-exact",
            InterpolateMode::Linear => "linear",
            InterpolateMode::Bilinear => "bilinear",
            InterpolateMode::Trilinear => "trilinear",
            InterpolateMode::Bicubic => "bicubic",
            InterpolateMode::Area => "area",
        }
    }

    /// The modes that take `align_corners` (they interpolate between
    /// sources).
    fn interpolates(self) -> bool {
        matches!(
            self,
            InterpolateMode::Linear
                | InterpolateMode::Bilinear
                | InterpolateMode::Trilinear
                | InterpolateMode::Bicubic
        )
    }
}

/// The arguments of [`interpolate`] (and [`Upsample`]) beside the input:
/// PyTorch's `size`, `scale_factor`, `mode`, `align_corners` and
/// `recompute_scale_factor`, `antialias`. A `size` or `scale_factor` of one value stands
/// for every spatial dim (PyTorch's plain `int` or `float`); otherwise it has
/// one value per spatial dim.
///
/// ```
/// use ember::nn::functional::{interpolate, InterpolateMode, InterpolateOptions};
/// use ember::prelude::*;
/// let x = Tensor::arange(0f32, 4.0, &Device::Cpu)?.reshape([1, 1, 2, 2])?;
/// let y = interpolate(&x, &InterpolateOptions::scale_factor(2.0))?;
/// assert_eq!(y.to_vec::<f32>()?[..4], [0.0, 0.0, 1.0, 1.0]);
/// let opts = InterpolateOptions::size([3, 3])
///     .mode(InterpolateMode::Bilinear)
///     .align_corners(true);
/// assert_eq!(interpolate(&x, &opts)?.to_vec::<f32>()?[..3], [0.0, 0.5, 1.0]);
/// # Ok::<(), ember::Error>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InterpolateOptions {
    /// The output's spatial size.
    pub size: Option<Vec<usize>>,
    /// The multiplier of the input's spatial size (the output's is rounded down).
    pub scale_factor: Option<Vec<f64>>,
    pub mode: InterpolateMode,
    /// Linear and bicubic modes only: whether the corner pixels' centres of the
    /// input and output are aligned (`None`: `false`, PyTorch's default).
    pub align_corners: Option<bool>,
    /// With `scale_factor`: compute the output size, then interpolate as if
    /// it had been given as `size` (`true`), or use the factor itself in the
    /// index arithmetic (`false`, `None`: PyTorch's default).
    pub recompute_scale_factor: Option<bool>,
    /// Bilinear and bicubic modes on 4-D inputs: where a dim shrinks, widen
    /// the filter by the factor so that every input cell contributes (a
    /// low-pass filter before sampling, as image libraries resize; bicubic
    /// then uses `a = -0.5`). torchvision's `Resize` does this on tensors.
    pub antialias: bool,
}

impl InterpolateOptions {
    /// Options with the output's spatial `size` (one value for every dim, or
    /// one per dim) and the default mode (nearest).
    pub fn size(size: impl Into<Vec<usize>>) -> InterpolateOptions {
        InterpolateOptions {
            size: Some(size.into()),
            ..Default::default()
        }
    }

    /// Options with one scale factor for every spatial dim.
    pub fn scale_factor(factor: f64) -> InterpolateOptions {
        InterpolateOptions::scale_factors([factor])
    }

    /// Options with a scale factor per spatial dim.
    pub fn scale_factors(factors: impl Into<Vec<f64>>) -> InterpolateOptions {
        InterpolateOptions {
            scale_factor: Some(factors.into()),
            ..Default::default()
        }
    }

    /// These options with `mode`.
    pub fn mode(mut self, mode: InterpolateMode) -> InterpolateOptions {
        self.mode = mode;
        self
    }

    /// These options with `align_corners` set (linear modes only).
    pub fn align_corners(mut self, align: bool) -> InterpolateOptions {
        self.align_corners = Some(align);
        self
    }

    /// These options with `recompute_scale_factor` set.
    pub fn recompute_scale_factor(mut self, recompute: bool) -> InterpolateOptions {
        self.recompute_scale_factor = Some(recompute);
        self
    }

    /// These options with `antialias` set (bilinear and bicubic on 4-D inputs).
    pub fn antialias(mut self, antialias: bool) -> InterpolateOptions {
        self.antialias = antialias;
        self
    }
}

pub(super) const OP: &str = "interpolate";

/// `values` as one value per spatial dim: a single value is repeated; another
/// count is PyTorch's error, naming the argument `what` and its `form`.
fn per_dim<T: Copy + std::fmt::Debug>(
    values: &[T],
    spatial: &[usize],
    (what, label, form): (&str, &str, &str),
) -> Result<Vec<T>> {
    match values.len() {
        1 => Ok(vec![values[0]; spatial.len()]),
        n if n == spatial.len() => Ok(values.to_vec()),
        _ => Err(Error::invalid(
            OP,
            format!(
                "Input and {what} must have the same number of spatial dimensions, but got input with spatial dimensions of {spatial:?} and {label} {values:?}. Please provide input tensor in (N, C, d1, d2, ...,dK) format and {form} format."
            ),
        )),
    }
}

/// Resamples the spatial dims of `x` (`[N, C, W]`, `[N, C, H, W]` or `[N, C, D,
/// H, W]`) to a given size or by a scale factor (`F.interpolate`), with
/// PyTorch's index arithmetic and errors (see [`InterpolateOptions`]). The
/// linear modes need as many spatial dims as their name says (`bilinear`: 2),
/// bicubic 2. Floating-point inputs work in every mode (with gradients);
/// uint8 images in the nearest modes and in bilinear and bicubic, with
/// PyTorch's CPU fixed-point arithmetic, value for value, on every device
/// (PyTorch's CUDA kernels refuse uint8 there). A 4-D channels-last input
/// gives a channels-last output, as in PyTorch. Under autocast a
/// half-precision input is resampled in float32 where PyTorch's lists say so
/// (CUDA's: every mode but area; the CPU's: 3-d area). A composite of index
/// ops (see `resample.rs` for its memory), so it runs and differentiates on
/// every device.
pub fn interpolate(x: &Tensor, opts: &InterpolateOptions) -> Result<Tensor> {
    let _record = crate::profiler::function("interpolate");
    // autocast's float32 lists: CUDA's hold every upsampling (not area, an
    // adaptive average pool); the CPU's the 3-d adaptive average pool only
    let in_f32 = match (opts.mode, x.rank()) {
        (InterpolateMode::Area, 5) => autocast::to_f32_cpu(&[x])?,
        (InterpolateMode::Area, _) => None,
        _ => autocast::to_f32_cuda(&[x])?,
    };
    if let Some(x) = in_f32 {
        return interpolate(&x[0], opts);
    }
    let mode = opts.mode;
    let rank = x.rank();
    if !(3..=5).contains(&rank) || (mode == InterpolateMode::Bicubic && rank != 4) {
        return Err(Error::invalid(
            OP,
            format!(
                "Input Error: Only 3D, 4D and 5D input Tensors supported (got {rank}D) for the modes: nearest | linear | bilinear | bicubic | trilinear | area | nearest-exact (got {})",
                mode.name()
            ),
        ));
    }
    let align = match (mode.interpolates(), opts.align_corners) {
        (false, Some(_)) => {
            return Err(Error::invalid(
                OP,
                "align_corners option can only be set with the interpolating modes: linear | bilinear | bicubic | trilinear",
            ))
        }
        (_, a) => a.unwrap_or(false),
    };
    if opts.antialias
        && !(matches!(mode, InterpolateMode::Bilinear | InterpolateMode::Bicubic) && rank == 4)
    {
        return Err(Error::invalid(
            OP,
            "Anti-alias option is restricted to bilinear and bicubic modes and requires a 4-D tensor as input",
        ));
    }
    let spatial = &x.shape()[2..];
    let (out, scales) = match (&opts.size, &opts.scale_factor) {
        (Some(_), Some(_)) => {
            return Err(Error::invalid(
                OP,
                "only one of size or scale_factor should be defined",
            ))
        }
        (None, None) => {
            return Err(Error::invalid(
                OP,
                "either size or scale_factor should be defined",
            ))
        }
        (Some(size), None) => {
            if opts.recompute_scale_factor == Some(true) {
                return Err(Error::invalid(
                    OP,
                    "recompute_scale_factor is not meaningful with an explicit size.",
                ));
            }
            let size = per_dim(
                size,
                spatial,
                (
                    "output",
                    "output size of",
                    "output size in (o1, o2, ...,oK)",
                ),
            )?;
            (size, None)
        }
        (None, Some(factors)) => {
            let form = (
                "scale_factor",
                "scale_factor of shape",
                "scale_factor in (s1, s2, ...,sK)",
            );
            let factors = per_dim(factors, spatial, form)?;
            // PyTorch's floor(float(in) · scale), negative sizes refused below
            let out: Vec<i128> = spatial
                .iter()
                .zip(&factors)
                .map(|(&i, &s)| {
                    let v = (i as f64 * s).floor();
                    // PyTorch converts the size to int64 first
                    if !(-9.223_372_036_854_776e18..9.223_372_036_854_776e18).contains(&v) {
                        return Err(Error::invalid(
                            "interpolate",
                            format!(
                                "value cannot be converted to type int64_t without overflow \
                                 (input size {i} times scale factor {s})"
                            ),
                        ));
                    }
                    Ok(v as i128)
                })
                .collect::<Result<_>>()?;
            if out.iter().any(|&o| o < 1) || spatial.contains(&0) {
                return Err(sizes_error(spatial, &out));
            }
            let out: Vec<usize> = out.iter().map(|&o| o as usize).collect();
            let keep = opts.recompute_scale_factor != Some(true);
            (out, keep.then_some(factors))
        }
    };
    let dims = spatial.len();
    let wanted = match mode {
        InterpolateMode::Linear => Some(1),
        InterpolateMode::Bilinear => Some(2),
        InterpolateMode::Trilinear => Some(3),
        _ => None,
    };
    if let Some(w) = wanted.filter(|&w| w != dims) {
        return Err(Error::invalid(
            OP,
            format!(
                "Got {rank}D input, but {} mode needs {}D input",
                mode.name(),
                w + 2
            ),
        ));
    }
    if out.contains(&0) || spatial.contains(&0) {
        let out: Vec<i128> = out.iter().map(|&o| o as i128).collect();
        return Err(sizes_error(spatial, &out));
    }
    if x.shape()[1] == 0 {
        return Err(Error::invalid(
            OP,
            format!(
                "Non-empty {rank}D data tensor expected but got a tensor with sizes {:?}",
                x.shape()
            ),
        ));
    }
    crate::layout::checked_numel(OP, &[&x.shape()[..2], &out[..]].concat())?;
    let y = resample(
        x,
        mode,
        (spatial, &out),
        scales.as_deref(),
        (align, opts.antialias),
    )?;
    // PyTorch's output takes the input's suggested memory format
    match x.rank() == 4 && x.suggest_memory_format() == MemoryFormat::ChannelsLast {
        true => y.to_memory_format(MemoryFormat::ChannelsLast),
        false => Ok(y),
    }
}

/// PyTorch's error for an empty input or output size.
fn sizes_error(input: &[usize], out: &[i128]) -> Error {
    let names = &["D", "H", "W"][3 - input.len()..];
    let list = |v: Vec<String>| {
        names
            .iter()
            .zip(v)
            .map(|(n, v)| format!("{n}: {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Error::invalid(
        OP,
        format!(
            "Input and output sizes should be greater than 0, but got input ({}) output ({})",
            list(input.iter().map(|v| v.to_string()).collect()),
            list(out.iter().map(|v| v.to_string()).collect())
        ),
    )
}

/// Resampling as a layer (`nn.Upsample`): [`interpolate`] with its options.
///
/// ```
/// use ember::nn::{self, functional::{InterpolateMode, InterpolateOptions}, Module};
/// use ember::prelude::*;
/// let up = nn::Upsample::new(InterpolateOptions::scale_factor(2.0).mode(InterpolateMode::Bilinear));
/// let y = up.forward(&Tensor::zeros([1, 3, 5, 7], DType::F32, &Device::Meta)?)?;
/// assert_eq!(y.shape(), &[1, 3, 10, 14]);
/// # Ok::<(), ember::Error>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Upsample {
    pub options: InterpolateOptions,
}

impl Upsample {
    /// The layer with these options (`nn.Upsample(size, scale_factor, mode,
    /// align_corners, recompute_scale_factor)`).
    pub fn new(options: InterpolateOptions) -> Upsample {
        Upsample { options }
    }

    /// `nn.UpsamplingNearest2d`: nearest, for 4-D inputs.
    pub fn nearest_2d(options: InterpolateOptions) -> Upsample {
        Upsample::new(options.mode(InterpolateMode::Nearest))
    }

    /// `nn.UpsamplingBilinear2d`: bilinear with `align_corners=True`.
    pub fn bilinear_2d(options: InterpolateOptions) -> Upsample {
        Upsample::new(options.mode(InterpolateMode::Bilinear).align_corners(true))
    }
}

impl Module for Upsample {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        interpolate(x, &self.options)
    }
}
