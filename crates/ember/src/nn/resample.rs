//! The arithmetic of [`interpolate`](super::functional::interpolate): each
//! mode's source indices and weights along one spatial dim.
//!
//! Each spatial dim is resampled in turn, from the last to the first, which is
//! the order of PyTorch's own arithmetic (bilinear is
//! `h0λ·(w0λ·x00 + w1λ·x01) + h1λ·(w0λ·x10 + w1λ·x11)`): nearest modes gather
//! the source rows along the dim (`index_select`); the others gather a few
//! sources per output ("taps": linear 2, bicubic 4, area the widest window,
//! antialiased the filter's support) and sum their weighted rows. The source
//! indices and weights of floating-point inputs are computed on the device from
//! an iota (no host copy, so a CUDA graph can capture them) with PyTorch's CPU
//! arithmetic (see `nearest_index` and the `*_taps` functions); uint8 images'
//! fixed-point weights are computed on the host.
//!
//! Memory: per dim, int64 index vectors (and weight vectors) of the output's
//! length per tap; forward, each tap's gathered tensor of the dim's result
//! size and its product, freed as they are summed; autograd keeps only the
//! indices and weights (not the gathered values), and backward adds each
//! gradient back with `index_add` into a zero tensor of the dim's input size
//! per tap.

use super::upsample::{InterpolateMode, OP};
use crate::{
    device::Device,
    dtype::DType,
    error::{Error, Result},
    tensor::Tensor,
};

/// [`interpolate`](super::functional::interpolate) after its checks: each
/// spatial dim of `x` from its `input` size to its `out` size, the last first.
pub(super) fn resample(
    x: &Tensor,
    mode: InterpolateMode,
    (input, out): (&[usize], &[usize]),
    scales: Option<&[f64]>,
    (align, antialias): (bool, bool),
) -> Result<Tensor> {
    let dims = input.len();
    if matches!(
        mode,
        InterpolateMode::Nearest | InterpolateMode::NearestExact
    ) {
        if !x.dtype().is_float() && x.dtype() != DType::U8 {
            let kernel = "compute_indices_weights_nearest";
            return Err(crate::tensor::not_implemented_for(OP, kernel, x.dtype()));
        }
        let mut y = x.clone();
        for d in (0..dims).rev() {
            let scale = scales.map(|s| s[d]);
            let how = (x.dtype(), dims == 2);
            let idx = nearest_index(mode, (input[d], out[d]), scale, how, &x.device())?;
            y = y.index_select_valid(d + 2, idx)?;
        }
        return Ok(y);
    }
    if x.dtype() == DType::U8
        && matches!(mode, InterpolateMode::Bilinear | InterpolateMode::Bicubic)
    {
        return resample_u8(x, mode, (input, out), scales, (align, antialias));
    }
    if !x.dtype().is_float() {
        // (the kernels PyTorch names: a 1-d pool is a 2-d one)
        let kernel = match mode {
            InterpolateMode::Area => format!("adaptive_avg_pool{}d", dims.max(2)),
            InterpolateMode::Bicubic => "compute_indices_weights_cubic".into(),
            _ => format!("upsample_{}{dims}d", mode.name()),
        };
        return Err(crate::tensor::not_implemented_for(OP, &kernel, x.dtype()));
    }
    // f16/bf16 blended in float32 and rounded once, as PyTorch's kernels (their
    // accumulation type)
    let work = match x.dtype() {
        DType::F64 => DType::F64,
        _ => DType::F32,
    };
    let mut y = x.to_dtype(work)?;
    for d in (0..dims).rev() {
        let scale = scales.map(|s| s[d]);
        let sizes = (input[d], out[d]);
        let taps = match mode {
            InterpolateMode::Area => area_taps(sizes, &x.device(), work)?,
            _ if antialias => antialias_taps(sizes, scale, align, mode, (&x.device(), work))?,
            InterpolateMode::Bicubic => cubic_taps(sizes, scale, align, (&x.device(), work))?,
            _ => linear_taps(sizes, scale, align, (&x.device(), work))?,
        };
        if let Some(taps) = taps {
            y = taps_along(&y, d + 2, taps)?;
        }
    }
    y.to_dtype(x.dtype())
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

/// The source index of each of the `out` positions along a dim (`[out]`
/// int64, in bounds) and its weight (`[out]`, the working dtype).
/// With `within` (bool `[out]`) where the outputs have fewer sources than
/// taps: the term is left out (not multiplied by 0, which would turn an
/// infinite source into NaN) where it is false.
struct Tap {
    index: Tensor,
    weight: Tensor,
    within: Option<Tensor>,
}

impl From<(Tensor, Tensor)> for Tap {
    fn from((index, weight): (Tensor, Tensor)) -> Tap {
        Tap {
            index,
            weight,
            within: None,
        }
    }
}

/// `y` resampled along `dim` by `taps`: `Σ_k y[index_k] · weight_k` over the
/// dim, summed in the taps' order (PyTorch's).
fn taps_along(y: &Tensor, dim: usize, taps: Vec<Tap>) -> Result<Tensor> {
    let mut sum: Option<Tensor> = None;
    for tap in taps {
        // the weights along `dim`, broadcast over the dims after it
        let mut wshape = vec![tap.weight.numel()];
        wshape.extend(std::iter::repeat_n(1, y.rank() - dim - 1));
        let mut term = y
            .index_select_valid(dim, tap.index)?
            .mul(&tap.weight.reshape(&wshape[..])?)?;
        if let Some(within) = tap.within {
            term = within.reshape(&wshape[..])?.where_(&term, 0.0)?;
        }
        sum = Some(match sum {
            None => term,
            Some(s) => s.add(&term)?,
        });
    }
    sum.ok_or_else(|| Error::invalid(OP, "a resampling without taps"))
}

/// PyTorch's `area_pixel_compute_scale`: the source step per output position
/// in the working dtype's precision.
fn pixel_scale(scale: Option<f64>, (input, out): (usize, usize), align: bool, work: DType) -> f64 {
    let f32_math = work == DType::F32;
    let round = |v: f64| if f32_math { v as f32 as f64 } else { v };
    match align {
        true if out > 1 => round((input - 1) as f64 / (out - 1) as f64),
        true => 0.0,
        false => scale_value(scale, (input, out), f32_math),
    }
}

/// The source position of each output position: `scale · dst` (aligned
/// corners) or `scale · (dst + 0.5) - 0.5`, in `work`.
fn source_positions(
    out: usize,
    scale: f64,
    align: bool,
    device: &Device,
    work: DType,
) -> Result<Tensor> {
    let dst = Tensor::affine_iota(out, 0, 1, device)?.to_dtype(work)?;
    match align {
        true => dst.mul(scale),
        false => dst.add(0.5)?.mul(scale)?.sub(0.5),
    }
}

/// Linear resampling along a dim from `input` to `out` positions: PyTorch's
/// `area_pixel_compute_source_index` and weights in `work` (float32 or
/// float64), the two neighbours. `None` where the dim keeps its size, which
/// PyTorch's kernels copy whatever the scale factor.
fn linear_taps(
    (input, out): (usize, usize),
    scale: Option<f64>,
    align: bool,
    (device, work): (&Device, DType),
) -> Result<Option<Vec<Tap>>> {
    if input == out {
        return Ok(None);
    }
    let scale = pixel_scale(scale, (input, out), align, work);
    let src = source_positions(out, scale, align, device, work)?.clamp_min(0.0)?;
    let last = input as i64 - 1;
    // (the source is not negative: truncation is the floor)
    let i0 = src.floor()?.to_dtype(DType::I64)?.clamp_max(last)?;
    let l1 = src.sub(&i0.to_dtype(work)?)?.clamp(Some(0.0), Some(1.0))?;
    let l0 = l1.rsub(1.0)?;
    let i1 = i0.add(1i64)?.clamp_max(last)?;
    Ok(Some(vec![(i0, l0).into(), (i1, l1).into()]))
}

/// Keys' cubic convolution kernel with parameter `a`, on `|x| < 1` (`near`)
/// or `1 ≤ |x| < 2`, in PyTorch's operation order.
fn cubic_convolution(x: &Tensor, a: f64, near: bool) -> Result<Tensor> {
    match near {
        // ((a + 2) x - (a + 3)) x x + 1
        true => x.mul(a + 2.0)?.sub(a + 3.0)?.mul(x)?.mul(x)?.add(1.0),
        // ((a x - 5a) x + 8a) x - 4a
        false => x
            .mul(a)?
            .sub(5.0 * a)?
            .mul(x)?
            .add(8.0 * a)?
            .mul(x)?
            .sub(4.0 * a),
    }
}

/// Bicubic resampling along a dim: the source position's floor `i` (at most
/// `input - 1`) and its fraction `t` (clamped to [0, 1]), sources `i - 1 ..= i
/// + 2` clamped into the dim, weights Keys' kernel with `a = -0.75` at `t + 1`,
/// `t`, `1 - t` and `(1 - t) + 1` (PyTorch's `get_cubic_upsample_coefficients`).
fn cubic_taps(
    (input, out): (usize, usize),
    scale: Option<f64>,
    align: bool,
    (device, work): (&Device, DType),
) -> Result<Option<Vec<Tap>>> {
    const A: f64 = -0.75;
    let scale = pixel_scale(scale, (input, out), align, work);
    let src = source_positions(out, scale, align, device, work)?;
    let last = input as i64 - 1;
    let i = src.floor()?.to_dtype(DType::I64)?.clamp_max(last)?;
    let t = src.sub(&i.to_dtype(work)?)?.clamp(Some(0.0), Some(1.0))?;
    let u = t.rsub(1.0)?;
    let weights = [
        cubic_convolution(&t.add(1.0)?, A, false)?,
        cubic_convolution(&t, A, true)?,
        cubic_convolution(&u, A, true)?,
        cubic_convolution(&u.add(1.0)?, A, false)?,
    ];
    let taps = weights
        .into_iter()
        .enumerate()
        .map(|(k, w)| Ok((i.add(k as i64 - 1)?.clamp(Some(0i64), Some(last))?, w).into()))
        .collect::<Result<_>>()?;
    Ok(Some(taps))
}

/// Antialiased bilinear or bicubic resampling along a dim (PyTorch's
/// separable `_upsample_*_aa` kernels, as PIL resizes): output `i` is centred
/// at `scale · (i + 0.5)`; where the dim shrinks (`scale > 1`) the filter
/// (triangle, or Keys' cubic with `a = -0.5`) is stretched by `scale`. The
/// sources within its support are weighted by the filter and the weights
/// normalised to sum to 1, which also handles the edges. The arithmetic
/// mixes float32 and float64 where PyTorch's does (for float32 work).
/// `None` where the dim keeps its size (PyTorch skips it).
fn antialias_taps(
    (input, out): (usize, usize),
    scale: Option<f64>,
    align: bool,
    mode: InterpolateMode,
    (device, work): (&Device, DType),
) -> Result<Option<Vec<Tap>>> {
    if input == out {
        return Ok(None);
    }
    let f32_math = work == DType::F32;
    let round = |v: f64| if f32_math { v as f32 as f64 } else { v };
    let cubic = mode == InterpolateMode::Bicubic;
    let scale = pixel_scale(scale, (input, out), align, work);
    let half_width = if cubic { 2.0 } else { 1.0 };
    let (support, invscale) = match scale >= 1.0 {
        true => (round(half_width * scale), round(1.0 / scale)),
        false => (half_width, 1.0),
    };
    let k = support.ceil() as usize * 2 + 1;
    // the centre: `scale · (i + 0.5)` in float64, stored in the working dtype
    let center = Tensor::affine_iota(out, 0, 1, device)?
        .to_dtype(DType::F64)?
        .add(0.5)?
        .mul(scale)?
        .to_dtype(work)?;
    // `(int64)(centre ∓ support + 0.5)`: the sum in the working dtype, the
    // half added in float64
    let bound = |sign: f64| -> Result<Tensor> {
        center
            .add(sign * support)?
            .to_dtype(DType::F64)?
            .add(0.5)?
            .trunc()?
            .to_dtype(DType::I64)
    };
    let xmin = bound(-1.0)?.clamp_min(0i64)?;
    let xsize = bound(1.0)?
        .clamp_max(input as i64)?
        .sub(&xmin)?
        .clamp(Some(0i64), Some(k as i64))?;
    let j = Tensor::affine_iota(k, 0, 1, device)?;
    let pos = xmin.unsqueeze(1)?.add(&j)?;
    // the filter at `((j + xmin) - centre + 0.5) · invscale`
    let at = pos
        .to_dtype(work)?
        .sub(&center.unsqueeze(1)?)?
        .to_dtype(DType::F64)?
        .add(0.5)?
        .mul(invscale)?
        .to_dtype(work)?
        .abs()?;
    let w = match cubic {
        true => at.lt(1.0)?.where_(
            &cubic_convolution(&at, -0.5, true)?,
            &at.lt(2.0)?
                .where_(&cubic_convolution(&at, -0.5, false)?, 0.0)?,
        )?,
        false => at.rsub(1.0)?.clamp_min(0.0)?,
    };
    let within = j.lt(&xsize.unsqueeze(1)?)?;
    let w = within.where_(&w, 0.0)?;
    let total = w.sum(1, true)?;
    let w = total.ne(0.0)?.where_(&w.div(&total)?, &w)?;
    let index = pos.clamp_max(input as i64 - 1)?;
    // each tap's column in storage of its own (the index a gather reads whole)
    let column = |t: &Tensor, c: i64| t.select(1, c)?.copy();
    let taps = (0..k as i64)
        .map(|c| {
            Ok(Tap {
                index: column(&index, c)?,
                weight: column(&w, c)?,
                within: Some(column(&within, c)?),
            })
        })
        .collect::<Result<_>>()?;
    Ok(Some(taps))
}

/// Area resampling along a dim (adaptive average pooling): output `i` is the
/// mean of sources `floor(i · input / out) .. ceil((i + 1) · input / out)`.
/// The windows' starts and ends come from float64 quotients of integers,
/// exact for any size a tensor can have.
fn area_taps(
    (input, out): (usize, usize),
    device: &Device,
    work: DType,
) -> Result<Option<Vec<Tap>>> {
    if input == out {
        return Ok(None);
    }
    // the widest window
    let k = input.div_ceil(out) + usize::from(!input.is_multiple_of(out));
    let i = Tensor::affine_iota(out, 0, 1, device)?.to_dtype(DType::F64)?;
    let start = i.mul(input as f64)?.div(out as f64)?.floor()?;
    let end = i.add(1.0)?.mul(input as f64)?.div(out as f64)?.ceil()?;
    let count = end.sub(&start)?;
    let start = start.to_dtype(DType::I64)?;
    let share = count.recip()?.to_dtype(work)?;
    let taps = (0..k)
        .map(|j| {
            let index = start.add(j as i64)?.clamp_max(input as i64 - 1)?;
            let within = count.gt(j as f64)?;
            let weight = within.where_(&share, 0.0)?;
            // (windows of one size fill every tap)
            let within = (!input.is_multiple_of(out)).then_some(within);
            Ok(Tap {
                index,
                weight,
                within,
            })
        })
        .collect::<Result<_>>()?;
    Ok(Some(taps))
}

/// Bilinear and bicubic resampling of uint8 images, as PyTorch's CPU kernels
/// (and PIL) compute it: per dim, the last first, each output is
/// `clamp((Σ x · w + 2^(p-1)) >> p, 0, 255)` with the weights in `p`-bit
/// fixed point ([`fixed_point_taps`]), rounded to uint8 between the dims. The
/// weights are computed on the host (they depend on the sizes only).
fn resample_u8(
    x: &Tensor,
    mode: InterpolateMode,
    (input, out): (&[usize], &[usize]),
    scales: Option<&[f64]>,
    (align, antialias): (bool, bool),
) -> Result<Tensor> {
    let device = x.device();
    let cubic = mode == InterpolateMode::Bicubic;
    let mut y = x.clone();
    for d in (0..input.len()).rev() {
        if input[d] == out[d] {
            continue;
        }
        let scale = scales.map(|s| s[d]);
        let (taps, precision) =
            fixed_point_taps((input[d], out[d]), scale, align, (cubic, antialias));
        let wide = y.to_dtype(DType::I64)?;
        let mut wshape = vec![out[d]];
        wshape.extend(std::iter::repeat_n(1, y.rank() - d - 3));
        let mut sum = Tensor::scalar(1i64 << (precision - 1), &device)?;
        for (index, weight) in taps {
            let index = Tensor::from_vec(index, [out[d]], &device)?;
            let weight = Tensor::from_vec(weight, &wshape[..], &device)?;
            sum = sum.add(&wide.index_select_valid(d + 2, index)?.mul(&weight)?)?;
        }
        y = sum
            .floor_divide(1i64 << precision)?
            .clamp(Some(0i64), Some(255i64))?
            .to_dtype(DType::U8)?;
    }
    Ok(y)
}

/// A tap's source indices and fixed-point weights, on the host.
type HostTap = (Vec<i64>, Vec<i64>);

/// The taps of a uint8 resampling along a dim from `input` to `out` positions
/// (each tap's source indices and int16 weights, `[out]` each) and their
/// precision `p`, as PyTorch's `_compute_index_ranges_int16_weights`: float64
/// weights, antialiased as in [`antialias_taps`] (with `a = -0.5` for
/// bicubic), or else the 2 (4) neighbours of the source position with the
/// triangle's (Keys' `a = -0.75`) weights, those of sources beyond an edge
/// added to the edge's; then `p` the largest precision below 22 bits at
/// which the largest weight stays below 2^15, and each weight `w · 2^p`
/// rounded half away from zero.
fn fixed_point_taps(
    (input, out): (usize, usize),
    scale: Option<f64>,
    align: bool,
    (cubic, antialias): (bool, bool),
) -> (Vec<HostTap>, u32) {
    let scale = match align {
        true if out > 1 => (input - 1) as f64 / (out - 1) as f64,
        true => 0.0,
        false => match scale {
            Some(s) if s > 0.0 => 1.0 / s,
            _ => input as f64 / out as f64,
        },
    };
    let a = if antialias { -0.5 } else { -0.75 };
    let filter = |x: f64| -> f64 {
        let x = x.abs();
        match cubic {
            true if x < 1.0 => ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0,
            true if x < 2.0 => ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a,
            false if x < 1.0 => 1.0 - x,
            _ => 0.0,
        }
    };
    let half_width = if cubic { 2.0 } else { 1.0 };
    let (support, k) = match antialias {
        true => {
            let support = if scale >= 1.0 {
                half_width * scale
            } else {
                half_width
            };
            (support, support.ceil() as usize * 2 + 1)
        }
        false => (half_width, 2 * half_width as usize),
    };
    let last = input as i64 - 1;
    let mut starts = vec![0i64; out];
    let mut w = vec![0f64; out * k];
    let mut largest = 0f64;
    for (i, start) in starts.iter_mut().enumerate() {
        let row = &mut w[i * k..(i + 1) * k];
        if antialias {
            let center = scale * (i as f64 + 0.5);
            let invscale = if scale >= 1.0 { 1.0 / scale } else { 1.0 };
            let xmin = ((center - support + 0.5) as i64).max(0);
            let xmax = ((center + support + 0.5) as i64).min(input as i64);
            let size = (xmax - xmin).clamp(0, k as i64) as usize;
            for (j, v) in row[..size].iter_mut().enumerate() {
                *v = filter(((j as i64 + xmin) as f64 - center + 0.5) * invscale);
            }
            let total: f64 = row[..size].iter().sum();
            if total != 0.0 {
                for v in &mut row[..size] {
                    *v /= total;
                    largest = largest.max(*v);
                }
            }
            *start = xmin;
        } else {
            let real = match align {
                true => scale * i as f64,
                false => {
                    let s = scale * (i as f64 + 0.5) - 0.5;
                    if !cubic && s < 0.0 {
                        0.0
                    } else {
                        s
                    }
                }
            };
            // (PyTorch floors the position in float32)
            let index = ((real as f32).floor() as i64).min(last);
            let lambda = (real - index as f64).clamp(0.0, 1.0);
            let reach = k as i64 / 2;
            let first = index - reach + 1;
            let xmin = first.max(0);
            let size = ((index + reach + 1).min(input as i64) - xmin).clamp(0, k as i64);
            // the weights of sources beyond an edge go to the edge's
            let mut slot = 0i64;
            for j in 0..k as i64 {
                let v = filter((j + 1 - reach) as f64 - lambda);
                if first + j <= 0 {
                    slot = 0;
                } else if first + j >= last {
                    slot = size - 1;
                }
                let s = slot.clamp(0, k as i64 - 1) as usize;
                row[s] += v;
                largest = largest.max(row[s]);
                slot += 1;
            }
            *start = xmin;
        }
    }
    let mut precision = 0;
    while precision < 22 && ((0.5 + largest * (1u64 << (precision + 1)) as f64) as i64) < 1 << 15 {
        precision += 1;
    }
    let precision = precision.max(1);
    let taps = (0..k)
        .map(|t| {
            let index = starts.iter().map(|&s| (s + t as i64).min(last)).collect();
            let weight = (0..out)
                .map(|i| {
                    let v = w[i * k + t] * (1u64 << precision) as f64;
                    (if v < 0.0 { v - 0.5 } else { v + 0.5 }) as i64
                })
                .collect();
            (index, weight)
        })
        .collect();
    (taps, precision)
}
