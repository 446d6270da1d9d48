//! Resampling (`F.interpolate`, `nn.Upsample`): nearest, nearest-exact and
//! linear modes over 1, 2 or 3 spatial dims, as composites of index ops.
//!
//! Each spatial dim is resampled in turn, from the last to the first, which is
//! the order of PyTorch's own arithmetic (bilinear is
//! `h0λ·(w0λ·x00 + w1λ·x01) + h1λ·(w0λ·x10 + w1λ·x11)`): nearest modes gather
//! the source rows along the dim (`index_select`), linear modes gather the two
//! neighbours and blend them. The source indices and weights are computed on
//! the device from an iota (no host copy, so a CUDA graph can capture them)
//! with PyTorch's CPU arithmetic (see `nearest_index` and `linear_along`).
//!
//! Memory: per dim, int64 index vectors (and weight vectors) of the output's
//! length; forward, the gathered tensors of the dim's result size (for linear
//! modes two gathers and their two products, about four results' worth at
//! once, all freed but the sum); autograd keeps only the indices and weights
//! (not the gathered values), and backward adds each gradient back with
//! `index_add` into a zero tensor of the dim's input size per gather.

use super::Module;
use crate::{
    dtype::DType,
    error::{Error, Result},
    tensor::Tensor,
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
        }
    }

    fn is_linear(self) -> bool {
        matches!(
            self,
            InterpolateMode::Linear | InterpolateMode::Bilinear | InterpolateMode::Trilinear
        )
    }
}

/// The arguments of [`interpolate`] (and [`Upsample`]) beside the input:
/// PyTorch's `size`, `scale_factor`, `mode`, `align_corners` and
/// `recompute_scale_factor`. A `size` or `scale_factor` of one value stands
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
    /// Linear modes only: whether the corner pixels' centres of the input and
    /// output are aligned (`None`: `false`, PyTorch's default).
    pub align_corners: Option<bool>,
    /// With `scale_factor`: compute the output size, then interpolate as if
    /// it had been given as `size` (`true`), or use the factor itself in the
    /// index arithmetic (`false`, `None`: PyTorch's default).
    pub recompute_scale_factor: Option<bool>,
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
}

const OP: &str = "interpolate";

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
/// linear modes need as many spatial dims as their name says (`bilinear`: 2)
/// and a floating-point input; nearest modes take floating-point and uint8
/// inputs (gradients for floating point). A composite of index ops (see the module's notes for its
/// memory), so it runs and differentiates on every device.
pub fn interpolate(x: &Tensor, opts: &InterpolateOptions) -> Result<Tensor> {
    let _record = crate::profiler::function("interpolate");
    let mode = opts.mode;
    let rank = x.rank();
    if !(3..=5).contains(&rank) {
        return Err(Error::invalid(
            OP,
            format!(
                "Input Error: Only 3D, 4D and 5D input Tensors supported (got {rank}D) for the modes: nearest | linear | bilinear | bicubic | trilinear | area | nearest-exact (got {})",
                mode.name()
            ),
        ));
    }
    let align = match (mode.is_linear(), opts.align_corners) {
        (false, Some(_)) => {
            return Err(Error::invalid(
                OP,
                "align_corners option can only be set with the interpolating modes: linear | bilinear | bicubic | trilinear",
            ))
        }
        (_, a) => a.unwrap_or(false),
    };
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
    if mode.is_linear() {
        if !x.dtype().is_float() {
            return Err(Error::dtype(
                OP,
                x.dtype(),
                format!(
                    "\"upsample_{}{}d\" not implemented for '{}'",
                    mode.name(),
                    dims,
                    crate::tensor::torch_dtype_name(x.dtype())
                ),
            ));
        }
        // f16/bf16 blended in float32 and rounded once, as PyTorch's GPU
        // kernels (its accumulation type)
        let work = match x.dtype() {
            DType::F64 => DType::F64,
            _ => DType::F32,
        };
        let mut y = x.to_dtype(work)?;
        for d in (0..dims).rev() {
            let scale = scales.as_ref().map(|s| s[d]);
            y = linear_along(&y, d + 2, (spatial[d], out[d]), scale, align)?;
        }
        return y.to_dtype(x.dtype());
    }
    if !x.dtype().is_float() && x.dtype() != DType::U8 {
        return Err(Error::dtype(
            OP,
            x.dtype(),
            format!(
                "\"compute_indices_weights_nearest\" not implemented for '{}'",
                crate::tensor::torch_dtype_name(x.dtype())
            ),
        ));
    }
    let mut y = x.clone();
    for d in (0..dims).rev() {
        let scale = scales.as_ref().map(|s| s[d]);
        let how = (x.dtype(), dims == 2);
        let idx = nearest_index(mode, (spatial[d], out[d]), scale, how, &x.device())?;
        y = y.index_select_valid(d + 2, idx)?;
    }
    Ok(y)
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

/// PyTorch's `compute_scales_value`: `1 / scale` where a positive factor was
/// given, else `input / output`, in float32 (nearest modes) or `work`.
fn scale_value(scale: Option<f64>, (input, out): (usize, usize), f32_math: bool) -> f64 {
    match scale {
        Some(s) if s > 0.0 => match f32_math {
            true => (1.0 / s) as f32 as f64,
            false => 1.0 / s,
        },
        _ => match f32_math {
            true => (input as f32 / out as f32) as f64,
            false => input as f64 / out as f64,
        },
    }
}

/// The int64 source index of each of the `out` positions along a dim of
/// `input` positions, at most `input - 1`, as PyTorch's CPU kernels compute
/// it. Those differ by rank: for 4-D inputs (`planar`) legacy nearest copies
/// where the sizes are equal and halves where the output is twice the input
/// (whatever the factor), else takes `floor(dst · scale)` in float32, and
/// nearest-exact `floor((dst + 0.5) · scale)` (the product in float64,
/// rounded to float32); for 3-D and 5-D inputs both compute in the
/// accumulation type (float64 for float64 input, else float32), round the
/// position to float32 and floor it: `dst · scale`, and for nearest-exact
/// `max(scale · (dst + 0.5) - 0.5, 0) + 0.5`.
fn nearest_index(
    mode: InterpolateMode,
    (input, out): (usize, usize),
    scale: Option<f64>,
    (dtype, planar): (DType, bool),
    device: &crate::device::Device,
) -> Result<Tensor> {
    let exact = mode == InterpolateMode::NearestExact;
    let iota = Tensor::affine_iota(out, 0, 1, device)?;
    if planar && !exact && out == input {
        return Ok(iota);
    }
    let work = match dtype {
        DType::F64 if !planar => DType::F64,
        _ if planar && exact => DType::F64,
        _ => DType::F32,
    };
    let scale = match planar && !exact && out == 2 * input {
        true => 0.5,
        false => scale_value(scale, (input, out), planar || work == DType::F32),
    };
    let dst = iota.to_dtype(work)?;
    let src = match (exact, planar) {
        (false, _) => dst.mul(scale)?,
        (true, true) => dst.add(0.5)?.mul(scale)?,
        (true, false) => dst
            .add(0.5)?
            .mul(scale)?
            .sub(0.5)?
            .clamp_min(0.0)?
            .add(0.5)?,
    };
    src.to_dtype(DType::F32)?
        .floor()?
        .to_dtype(DType::I64)?
        .clamp_max(input as i64 - 1)
}

/// `y` resampled linearly along `dim` from `input` to `out` positions,
/// PyTorch's `area_pixel_compute_source_index` and weights in `y`'s dtype
/// (float32 or float64): the two neighbours gathered and blended. A dim
/// that keeps its size is copied, whatever the scale factor, as PyTorch's
/// kernels copy it.
fn linear_along(
    y: &Tensor,
    dim: usize,
    (input, out): (usize, usize),
    scale: Option<f64>,
    align: bool,
) -> Result<Tensor> {
    let iota = Tensor::affine_iota(out, 0, 1, &y.device())?;
    if input == out {
        return y.index_select_valid(dim, iota);
    }
    let work = y.dtype();
    let f32_math = work == DType::F32;
    let round = |v: f64| if f32_math { v as f32 as f64 } else { v };
    let scale = match align {
        true if out > 1 => round((input - 1) as f64 / (out - 1) as f64),
        true => 0.0,
        false => scale_value(scale, (input, out), f32_math),
    };
    let dst = iota.to_dtype(work)?;
    let src = match align {
        true => dst.mul(scale)?,
        false => dst.add(0.5)?.mul(scale)?.sub(0.5)?.clamp_min(0.0)?,
    };
    let last = input as i64 - 1;
    // (the source is not negative: truncation is the floor)
    let i0 = src.floor()?.to_dtype(DType::I64)?.clamp_max(last)?;
    let l1 = src.sub(&i0.to_dtype(work)?)?.clamp(Some(0.0), Some(1.0))?;
    let l0 = l1.rsub(1.0)?;
    let i1 = i0.add(1i64)?.clamp_max(last)?;
    // the weights along `dim`, broadcast over the dims after it
    let mut wshape = vec![out];
    wshape.extend(std::iter::repeat_n(1, y.rank() - dim - 1));
    let (l0, l1) = (l0.reshape(&wshape[..])?, l1.reshape(&wshape[..])?);
    let a = y.index_select_valid(dim, i0)?.mul(&l0)?;
    let b = y.index_select_valid(dim, i1)?.mul(&l1)?;
    a.add(&b)
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
