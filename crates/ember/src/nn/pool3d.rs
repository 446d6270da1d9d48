//! 3-D pooling as in `torch.nn.functional` (`max_pool3d`, `avg_pool3d`,
//! `adaptive_avg_pool3d`, `adaptive_max_pool3d`), with their layers.
//!
//! Each is separable, so each is two 2-D poolings: first over every `H × W`
//! plane (depth folded into the batch), then along depth (each `(h, w)`
//! position a `1 × D` row). A box window's maximum is the maximum of its
//! planes' maxima, and the first maximum in its scan order (depth, then row,
//! then column) is the earliest plane's first, which is what the two stages
//! pick; an average's divisor is a product of one factor per dim, with or
//! without the padding, in ceil mode too, and `divisor_override` divides the
//! window's sum (each stage summing). Everything is a composite of tensor ops,
//! so it runs on every device (meta included) and autograd follows.

use super::functional::{adaptive_avg_pool2d, adaptive_max_pool2d_with_indices};
use super::Module;
use crate::tensor::{not_implemented_for, Pool2dOptions, Tensor};
use crate::{
    dtype::DType,
    error::{Error, Result},
};

/// A `(depth, height, width)` triple.
type Triple = (usize, usize, usize);

fn list(t: Triple) -> [usize; 3] {
    [t.0, t.1, t.2]
}

/// The window of a 3-D pooling: kernel, stride (the kernel's by default),
/// padding, dilation (max pooling only), ceil mode, and for average pooling
/// `count_include_pad` (on by default, as in PyTorch) and `divisor_override`
/// (each window's sum divided by it instead). Each triple is `(depth, height,
/// width)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool3dOptions {
    pub kernel: Triple,
    pub stride: Option<Triple>,
    pub padding: Triple,
    pub dilation: Triple,
    pub ceil_mode: bool,
    pub count_include_pad: bool,
    pub divisor_override: Option<usize>,
}

impl Pool3dOptions {
    /// A cubic `k × k × k` window with stride `k`.
    pub fn new(k: usize) -> Pool3dOptions {
        Pool3dOptions::cuboid(k, k, k)
    }
    /// A `kd × kh × kw` window with stride equal to the window.
    pub fn cuboid(kd: usize, kh: usize, kw: usize) -> Pool3dOptions {
        Pool3dOptions {
            kernel: (kd, kh, kw),
            stride: None,
            padding: (0, 0, 0),
            dilation: (1, 1, 1),
            ceil_mode: false,
            count_include_pad: true,
            divisor_override: None,
        }
    }
    /// The same stride along the three axes.
    pub fn stride(mut self, s: usize) -> Self {
        self.stride = Some((s, s, s));
        self
    }
    /// The same padding on the three axes.
    pub fn padding(mut self, p: usize) -> Self {
        self.padding = (p, p, p);
        self
    }
    /// The same dilation on the three axes.
    pub fn dilation(mut self, d: usize) -> Self {
        self.dilation = (d, d, d);
        self
    }
    pub fn ceil_mode(mut self, on: bool) -> Self {
        self.ceil_mode = on;
        self
    }
    pub fn count_include_pad(mut self, on: bool) -> Self {
        self.count_include_pad = on;
        self
    }
    pub fn divisor_override(mut self, div: usize) -> Self {
        self.divisor_override = Some(div);
        self
    }

    fn stride_or_kernel(&self) -> Triple {
        self.stride.unwrap_or(self.kernel)
    }

    /// The 2-D window over each `H × W` plane (a sum where a divisor
    /// overrides).
    fn plane(&self) -> Pool2dOptions {
        let s = self.stride_or_kernel();
        Pool2dOptions {
            kernel: (self.kernel.1, self.kernel.2),
            stride: Some((s.1, s.2)),
            padding: (self.padding.1, self.padding.2),
            dilation: (self.dilation.1, self.dilation.2),
            ceil_mode: self.ceil_mode,
            count_include_pad: self.count_include_pad,
            divisor_override: self.divisor_override.map(|_| 1),
        }
    }

    /// The 2-D window along depth, over `[.., 1, 1, D]` rows.
    fn depth(&self) -> Pool2dOptions {
        Pool2dOptions {
            kernel: (1, self.kernel.0),
            stride: Some((1, self.stride_or_kernel().0)),
            padding: (0, self.padding.0),
            dilation: (1, self.dilation.0),
            ..self.plane()
        }
    }

    /// PyTorch's output size along each dim (zero or negative where the input
    /// is too small: the callers refuse it).
    fn out_sizes(&self, input: [usize; 3]) -> [i64; 3] {
        let (k, s, p, d) = (
            list(self.kernel),
            list(self.stride_or_kernel()),
            list(self.padding),
            list(self.dilation),
        );
        std::array::from_fn(|i| {
            let (k, s, p, d) = (k[i] as i64, s[i] as i64, p[i] as i64, d[i] as i64);
            let span = input[i] as i64 + 2 * p - d * (k - 1) - 1;
            let mut out = match self.ceil_mode {
                true => (span + s - 1).div_euclid(s) + 1,
                false => span.div_euclid(s) + 1,
            };
            // the last window starts inside the input or its left padding
            if self.ceil_mode && (out - 1) * s >= input[i] as i64 + p {
                out -= 1;
            }
            out
        })
    }
}

/// The checks 3-D max and average pooling share, in PyTorch's words: a
/// non-empty `[C, D, H, W]` or `[N, C, D, H, W]` input, positive sizes, padding
/// at most half the kernel, and an output with elements. `avg` adds average
/// pooling's own (no dilation; the input at least the kernel).
fn check_pool3d(op: &'static str, x: &Tensor, o: &Pool3dOptions, avg: bool) -> Result<()> {
    let (k, s, p, d) = (
        list(o.kernel),
        list(o.stride_or_kernel()),
        list(o.padding),
        list(o.dilation),
    );
    if s.contains(&0) {
        return Err(Error::invalid(op, "stride should not be zero"));
    }
    if k.contains(&0) {
        return Err(Error::invalid(
            op,
            format!(
                "kernel size should be greater than zero, but got kT: {} kH: {} kW: {}",
                k[0], k[1], k[2]
            ),
        ));
    }
    if d.contains(&0) {
        return Err(Error::invalid(
            op,
            format!(
                "dilation should be greater than zero, but got dilationT: {} dilationH: {} dilationW: {}",
                d[0], d[1], d[2]
            ),
        ));
    }
    if avg && d != [1, 1, 1] {
        return Err(Error::invalid(op, "avg_pool3d has no dilation"));
    }
    if avg && o.divisor_override == Some(0) {
        return Err(Error::invalid(op, "divisor must be not zero"));
    }
    let r = x.rank();
    if (r != 4 && r != 5) || x.shape()[r - 4..].contains(&0) {
        return Err(Error::invalid(
            op,
            "non-empty 4D or 5D (batch mode) tensor expected for input",
        ));
    }
    if let Some(i) = (0..3).find(|&i| p[i] > ((k[i] - 1) * d[i]).div_ceil(2)) {
        return Err(Error::invalid(
            op,
            format!(
                "pad should be at most half of effective kernel size, but got pad={}, kernel_size={} and dilation={}",
                p[i], k[i], d[i]
            ),
        ));
    }
    if (0..3).any(|i| p[i] > k[i] / 2) {
        return Err(Error::invalid(
            op,
            format!(
                "pad should be smaller than or equal to half of kernel size, but got kT: {} kW: {} kH: {} padT: {} padW: {} padH: {}",
                k[0], k[2], k[1], p[0], p[2], p[1]
            ),
        ));
    }
    let input = [x.shape()[r - 3], x.shape()[r - 2], x.shape()[r - 1]];
    if avg && (0..3).any(|i| input[i] < k[i]) {
        return Err(Error::invalid(
            op,
            format!(
                "input image (T: {} H: {} W: {}) smaller than kernel size (kT: {} kH: {} kW: {})",
                input[0], input[1], input[2], k[0], k[1], k[2]
            ),
        ));
    }
    let out = o.out_sizes(input);
    if out.iter().any(|&n| n < 1) {
        let c = x.shape()[r - 4];
        return Err(Error::invalid(
            op,
            format!(
                "Given input size: ({c}x{}x{}x{}). Calculated output size: ({c}x{}x{}x{}). Output size is too small",
                input[0], input[1], input[2], out[0], out[1], out[2]
            ),
        ));
    }
    Ok(())
}

/// `x` (`[N, C, D, H, W]` or `[C, D, H, W]`) with its leading dims folded into
/// one: `[B, D, H, W]`, and those leading dims.
fn fold(x: &Tensor) -> Result<(Tensor, Vec<usize>)> {
    let r = x.rank();
    let lead = x.shape()[..r - 3].to_vec();
    let b = lead.iter().product();
    let s = &x.shape()[r - 3..];
    Ok((x.reshape([b, s[0], s[1], s[2]])?, lead))
}

/// Both stages of a separable pooling of `[B, D, H, W]`: `plane` maps `[B·D,
/// 1, H, W]` planes to `[B·D, 1, oh, ow]`, `row` maps `[B·oh·ow, 1, 1, D]`
/// rows to `[.., 1, 1, od]`; each may also give int64 positions (in its
/// plane, along its row). The result is `[B, od, oh, ow]`, with the
/// positions (`d·H·W + h·W + w`) when both stages gave theirs.
fn separable(
    x: &Tensor,
    plane: impl FnOnce(&Tensor) -> Result<(Tensor, Option<Tensor>)>,
    row: impl FnOnce(&Tensor) -> Result<(Tensor, Option<Tensor>)>,
) -> Result<(Tensor, Option<Tensor>)> {
    let [b, d, h, w] = [x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]];
    // (a unit channel dim after the folded one, which may then be empty)
    let (y, at_plane) = plane(&x.reshape([b * d, 1, h, w])?)?;
    let (oh, ow) = (y.shape()[2], y.shape()[3]);
    // depth last: one row per (b, h, w) position
    let rows = y.reshape([b, d, oh * ow])?.transpose(1, 2)?;
    let (z, at_row) = row(&rows.reshape([b * oh * ow, 1, 1, d])?)?;
    let od = z.shape()[3];
    let out = z
        .reshape([b, oh, ow, od])?
        .permute([0, 3, 1, 2])?
        .contiguous()?;
    let index = match (at_plane, at_row) {
        (Some(ip), Some(ir)) => {
            let _ng = crate::autograd::no_grad_guard();
            let depth = ir.reshape([b, oh * ow, od])?;
            let ip = ip.reshape([b, d, oh * ow])?.transpose(1, 2)?;
            // each maximum's position in the plane its depth stage chose
            let in_plane = ip.gather(2, &depth)?;
            let flat = depth.mul((h * w) as i64)?.add(&in_plane)?;
            Some(
                flat.reshape([b, oh, ow, od])?
                    .permute([0, 3, 1, 2])?
                    .contiguous()?,
            )
        }
        _ => None,
    };
    Ok((out, index))
}

/// `t` (`[B, od, oh, ow]`) given back `lead` dims before its last three.
fn unfold(t: Tensor, lead: &[usize]) -> Result<Tensor> {
    let mut shape = lead.to_vec();
    shape.extend_from_slice(&t.shape()[1..]);
    t.reshape(shape)
}

/// 3-D max pooling over `[N, C, D, H, W]` or `[C, D, H, W]`
/// (`F.max_pool3d`): padding never wins, NaN does. Floating-point, int64 and
/// uint8 inputs.
///
/// ```
/// use ember::nn::functional::max_pool3d;
/// use ember::nn::Pool3dOptions;
/// use ember::prelude::*;
/// let x = Tensor::arange(0f32, 64.0, &Device::Cpu)?.reshape([1, 4, 4, 4])?;
/// let y = max_pool3d(&x, Pool3dOptions::new(2))?;
/// assert_eq!(y.shape(), &[1, 2, 2, 2]);
/// assert_eq!(y.to_vec::<f32>()?, [21.0, 23.0, 29.0, 31.0, 53.0, 55.0, 61.0, 63.0]);
/// # Ok::<(), ember::Error>(())
/// ```
pub fn max_pool3d(x: &Tensor, opts: Pool3dOptions) -> Result<Tensor> {
    check_pool3d("max_pool3d", x, &opts, false)?;
    let (xs, lead) = fold(x)?;
    let (y, _) = separable(
        &xs,
        |t| Ok((t.max_pool2d(opts.plane())?, None)),
        |t| Ok((t.max_pool2d(opts.depth())?, None)),
    )?;
    unfold(y, &lead)
}

/// [`max_pool3d`] with each maximum's position in its flattened `D·H·W`
/// volume (int64), as `F.max_pool3d(..., return_indices=True)` gives; of
/// maxima that tie, the first in depth, row, column order.
pub fn max_pool3d_with_indices(x: &Tensor, opts: Pool3dOptions) -> Result<(Tensor, Tensor)> {
    check_pool3d("max_pool3d", x, &opts, false)?;
    let (xs, lead) = fold(x)?;
    let (y, i) = separable(
        &xs,
        |t| {
            let (v, i) = t.max_pool2d_with_indices(opts.plane())?;
            Ok((v, Some(i)))
        },
        |t| {
            let (v, i) = t.max_pool2d_with_indices(opts.depth())?;
            Ok((v, Some(i)))
        },
    )?;
    let i = i.ok_or_else(|| Error::invalid("max_pool3d", "the pooling kept no indices"))?;
    Ok((unfold(y, &lead)?, unfold(i, &lead)?))
}

/// 3-D average pooling over `[N, C, D, H, W]` or `[C, D, H, W]`
/// (`F.avg_pool3d`), with `count_include_pad`, ceil mode and
/// `divisor_override` as in PyTorch (dilation is refused: average pooling has
/// none). Floating-point and int64 inputs (int64 means truncated toward
/// zero), as PyTorch's.
///
/// ```
/// use ember::nn::functional::avg_pool3d;
/// use ember::nn::Pool3dOptions;
/// use ember::prelude::*;
/// let x = Tensor::ones([1, 1, 2, 2, 2], DType::F32, &Device::Cpu)?;
/// let y = avg_pool3d(&x, Pool3dOptions::new(2).padding(1).count_include_pad(false))?;
/// assert_eq!(y.shape(), &[1, 1, 2, 2, 2]);
/// assert_eq!(y.to_vec::<f32>()?, [1.0; 8]);
/// let y = avg_pool3d(&x, Pool3dOptions::new(2).divisor_override(2))?;
/// assert_eq!(y.to_vec::<f32>()?, [4.0]);
/// # Ok::<(), ember::Error>(())
/// ```
pub fn avg_pool3d(x: &Tensor, opts: Pool3dOptions) -> Result<Tensor> {
    const OP: &str = "avg_pool3d";
    check_pool3d(OP, x, &opts, true)?;
    match x.dtype() {
        DType::I64 => return avg_pool3d_int(x, &opts),
        d if !d.is_float() => return Err(not_implemented_for(OP, "avg_pool3d_out_frame", d)),
        _ => {}
    }
    let (xs, lead) = fold(x)?;
    let (y, _) = separable(
        &xs,
        |t| Ok((t.avg_pool2d(opts.plane())?, None)),
        |t| Ok((t.avg_pool2d(opts.depth())?, None)),
    )?;
    let y = match opts.divisor_override {
        Some(div) => y.div(div as f64)?,
        None => y,
    };
    unfold(y, &lead)
}

/// [`avg_pool3d`] of int64 values, as PyTorch's: each window's exact sum (in
/// float64, exact below 2^53) divided by its divisor and truncated toward
/// zero.
fn avg_pool3d_int(x: &Tensor, opts: &Pool3dOptions) -> Result<Tensor> {
    let sums = Pool3dOptions {
        divisor_override: Some(1),
        ..*opts
    };
    let (xs, lead) = fold(&x.to_dtype(DType::F64)?)?;
    // each stage's sums are whole numbers: rounding drops the mean's error
    let (y, _) = separable(
        &xs,
        |t| Ok((t.avg_pool2d(sums.plane())?.round()?, None)),
        |t| Ok((t.avg_pool2d(sums.depth())?.round()?, None)),
    )?;
    let [od, oh, ow] = [1, 2, 3].map(|d| y.shape()[d]);
    let divisor = match opts.divisor_override {
        Some(div) => Tensor::full([1, 1, 1], div as f64, DType::F64, &x.device())?,
        None => {
            let r = x.rank();
            let input = [x.shape()[r - 3], x.shape()[r - 2], x.shape()[r - 1]];
            let (k, s, p) = (
                list(opts.kernel),
                list(opts.stride_or_kernel()),
                list(opts.padding),
            );
            // each dim's window sizes: clipped to the padded input, and with
            // count_include_pad off to the input itself
            let sizes = |i: usize, out: usize| -> Vec<f64> {
                (0..out as i64)
                    .map(|o| {
                        let start = o * s[i] as i64 - p[i] as i64;
                        let end = (start + k[i] as i64).min((input[i] + p[i]) as i64);
                        match opts.count_include_pad {
                            true => (end - start) as f64,
                            false => (end.min(input[i] as i64) - start.max(0)) as f64,
                        }
                    })
                    .collect()
            };
            let (a, b, c) = (sizes(0, od), sizes(1, oh), sizes(2, ow));
            let mut cells = Vec::with_capacity(od * oh * ow);
            for a in &a {
                for b in &b {
                    cells.extend(c.iter().map(|c| a * b * c));
                }
            }
            Tensor::from_vec(cells, [od, oh, ow], &x.device())?
        }
    };
    unfold(y.div(&divisor)?.trunc()?.to_dtype(DType::I64)?, &lead)
}

/// The checks of 3-D adaptive pooling: a `[C, D, H, W]` or `[N, C, D, H, W]`
/// input with elements in every dim but the batch's, of a floating-point dtype.
fn check_adaptive_3d(op: &'static str, x: &Tensor) -> Result<()> {
    let sep = if op == "adaptive_max_pool3d" { ":" } else { "" };
    if x.rank() != 4 && x.rank() != 5 {
        return Err(Error::invalid(
            op,
            format!(
                "{op}(): Expected 4D or 5D tensor, but got{sep} {:?}",
                x.shape()
            ),
        ));
    }
    if let Some(d) = (1..x.rank()).find(|&d| x.shape()[d] == 0) {
        return Err(Error::invalid(
            op,
            format!(
                "{op}(): Expected input to have non-zero size for non-batch dimensions, but input has sizes {:?} with dimension {d} being empty",
                x.shape()
            ),
        ));
    }
    if !x.dtype().is_float() {
        return Err(not_implemented_for(op, &format!("{op}_cpu"), x.dtype()));
    }
    Ok(())
}

/// 3-D average pooling to an `(od, oh, ow)` output over `[N, C, D, H, W]` or
/// `[C, D, H, W]` (`F.adaptive_avg_pool3d`): PyTorch's windows, `floor(i·D/od)
/// .. ceil((i+1)·D/od)` along depth and likewise along height and width.
///
/// ```
/// use ember::nn::functional::adaptive_avg_pool3d;
/// use ember::prelude::*;
/// let x = Tensor::arange(0f32, 8.0, &Device::Cpu)?.reshape([1, 2, 2, 2])?;
/// assert_eq!(adaptive_avg_pool3d(&x, (1, 1, 1))?.to_vec::<f32>()?, [3.5]);
/// # Ok::<(), ember::Error>(())
/// ```
pub fn adaptive_avg_pool3d(x: &Tensor, output: Triple) -> Result<Tensor> {
    check_adaptive_3d("adaptive_avg_pool3d", x)?;
    let (xs, lead) = fold(x)?;
    let (y, _) = separable(
        &xs,
        |t| Ok((adaptive_avg_pool2d(t, (output.1, output.2))?, None)),
        |t| Ok((adaptive_avg_pool2d(t, (1, output.0))?, None)),
    )?;
    unfold(y, &lead)
}

/// 3-D max pooling to an `(od, oh, ow)` output over `[N, C, D, H, W]` or `[C,
/// D, H, W]` (`F.adaptive_max_pool3d`), with PyTorch's windows (as
/// [`adaptive_avg_pool3d`]); the gradient goes to each window's maximum.
pub fn adaptive_max_pool3d(x: &Tensor, output: Triple) -> Result<Tensor> {
    adaptive_max_pool3d_with_indices(x, output).map(|(y, _)| y)
}

/// [`adaptive_max_pool3d`] with each maximum's position in its flattened
/// `D·H·W` volume (int64), as `return_indices=True` gives.
pub fn adaptive_max_pool3d_with_indices(x: &Tensor, output: Triple) -> Result<(Tensor, Tensor)> {
    const OP: &str = "adaptive_max_pool3d";
    check_adaptive_3d(OP, x)?;
    let (xs, lead) = fold(x)?;
    let (y, i) = separable(
        &xs,
        |t| {
            let (v, i) = adaptive_max_pool2d_with_indices(t, (output.1, output.2))?;
            Ok((v, Some(i)))
        },
        |t| {
            let (v, i) = adaptive_max_pool2d_with_indices(t, (1, output.0))?;
            Ok((v, Some(i)))
        },
    )?;
    let i = i.ok_or_else(|| Error::invalid(OP, "the pooling kept no indices"))?;
    Ok((unfold(y, &lead)?, unfold(i, &lead)?))
}

/// 3-D max pooling layer (`nn.MaxPool3d`).
#[derive(Clone, Copy, Debug)]
pub struct MaxPool3d(pub Pool3dOptions);

impl MaxPool3d {
    /// The pooled values and each maximum's position (`return_indices=True`).
    pub fn forward_with_indices(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        max_pool3d_with_indices(x, self.0)
    }
}

impl Module for MaxPool3d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        max_pool3d(x, self.0)
    }
}

/// 3-D average pooling layer (`nn.AvgPool3d`).
#[derive(Clone, Copy, Debug)]
pub struct AvgPool3d(pub Pool3dOptions);

impl Module for AvgPool3d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        avg_pool3d(x, self.0)
    }
}

/// 3-D average pooling to a fixed size (`nn.AdaptiveAvgPool3d((od, oh, ow))`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdaptiveAvgPool3d {
    /// The output's `(depth, height, width)`.
    pub output: Triple,
}

impl AdaptiveAvgPool3d {
    pub fn new(output: (usize, usize, usize)) -> AdaptiveAvgPool3d {
        AdaptiveAvgPool3d { output }
    }
}

impl Module for AdaptiveAvgPool3d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        adaptive_avg_pool3d(x, self.output)
    }
}

/// 3-D max pooling to a fixed size (`nn.AdaptiveMaxPool3d((od, oh, ow))`);
/// [`forward_with_indices`](Self::forward_with_indices) is its
/// `return_indices=True`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdaptiveMaxPool3d {
    /// The output's `(depth, height, width)`.
    pub output: Triple,
}

impl AdaptiveMaxPool3d {
    pub fn new(output: (usize, usize, usize)) -> AdaptiveMaxPool3d {
        AdaptiveMaxPool3d { output }
    }

    /// The pooled values and each maximum's position in its flattened volume.
    pub fn forward_with_indices(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        adaptive_max_pool3d_with_indices(x, self.output)
    }
}

impl Module for AdaptiveMaxPool3d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        adaptive_max_pool3d(x, self.output)
    }
}
