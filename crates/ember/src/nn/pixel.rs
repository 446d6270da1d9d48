//! Rearranging layers, as in `torch.nn.functional`: pixel shuffle and unshuffle,
//! channel shuffle (reshapes and permutes of any dtype), and `unfold`/`fold`
//! (im2col and its adjoint, col2im), with their layers.
//!
//! `unfold` picks every window's elements out of the zero-padded planes with
//! one `index_select` of precomputed positions, and `fold` adds them back with
//! `index_add` at the same positions: each is the other's gradient, so both
//! differentiate (twice, too) on every device, meta included.

use super::Module;
use crate::tensor::{not_implemented_for, PadMode, Tensor};
use crate::{
    dtype::DType,
    error::{Error, Result},
};

/// The leading (batch) dims of `x` and its last three.
fn split_chw(x: &Tensor) -> (Vec<usize>, [usize; 3]) {
    let r = x.rank();
    let s = x.shape();
    (s[..r - 3].to_vec(), [s[r - 3], s[r - 2], s[r - 1]])
}

/// `[.., C·r², H, W]` to `[.., C, H·r, W·r]` (`F.pixel_shuffle`): each group of
/// `r²` channels becomes an `r × r` block of pixels. Any dtype; a rank of at
/// least 3, PyTorch's checks and messages. A channels-last input gives a
/// channels-last output, as PyTorch's (so do the other shuffles).
///
/// ```
/// use ember::nn::functional::{pixel_shuffle, pixel_unshuffle};
/// use ember::prelude::*;
/// let x = Tensor::arange(0f32, 8.0, &Device::Cpu)?.reshape([1, 8, 1, 1])?;
/// let y = pixel_shuffle(&x, 2)?;
/// assert_eq!(y.shape(), &[1, 2, 2, 2]);
/// assert_eq!(pixel_unshuffle(&y, 2)?.to_vec::<f32>()?, x.to_vec::<f32>()?);
/// # Ok::<(), ember::Error>(())
/// ```
pub fn pixel_shuffle(x: &Tensor, upscale_factor: usize) -> Result<Tensor> {
    const OP: &str = "pixel_shuffle";
    if x.rank() < 3 {
        return Err(Error::invalid(
            OP,
            format!(
                "pixel_shuffle expects input to have at least 3 dimensions, but got input with {} dimension(s)",
                x.rank()
            ),
        ));
    }
    let r = upscale_factor;
    if r == 0 {
        return Err(Error::invalid(
            OP,
            "pixel_shuffle expects a positive upscale_factor, but got 0",
        ));
    }
    let (lead, [c, h, w]) = split_chw(x);
    if !c.is_multiple_of(r * r) {
        return Err(Error::invalid(
            OP,
            format!("pixel_shuffle expects its input's 'channel' dimension to be divisible by the square of upscale_factor, but input.size(-3)={c} is not divisible by {}", r * r),
        ));
    }
    let n = lead.len();
    let mut split = lead.clone();
    split.extend([c / (r * r), r, r, h, w]);
    let mut perm: Vec<usize> = (0..n).collect();
    perm.extend([n, n + 3, n + 1, n + 4, n + 2]);
    let mut out = lead;
    out.extend([c / (r * r), h * r, w * r]);
    x.reshape(split)?
        .permute(perm)?
        .reshape(out)?
        .laid_out(x.suggest_memory_format())
}

/// The inverse of [`pixel_shuffle`] (`F.pixel_unshuffle`): `[.., C, H·r, W·r]`
/// to `[.., C·r², H, W]`.
pub fn pixel_unshuffle(x: &Tensor, downscale_factor: usize) -> Result<Tensor> {
    const OP: &str = "pixel_unshuffle";
    if x.rank() < 3 {
        return Err(Error::invalid(
            OP,
            format!(
                "pixel_unshuffle expects input to have at least 3 dimensions, but got input with {} dimension(s)",
                x.rank()
            ),
        ));
    }
    let r = downscale_factor;
    if r == 0 {
        return Err(Error::invalid(
            OP,
            "pixel_unshuffle expects a positive downscale_factor, but got 0",
        ));
    }
    let (lead, [c, h, w]) = split_chw(x);
    for (what, size, dim) in [("height", h, -2), ("width", w, -1)] {
        if !size.is_multiple_of(r) {
            return Err(Error::invalid(
                OP,
                format!("pixel_unshuffle expects {what} to be divisible by downscale_factor, but input.size({dim})={size} is not divisible by {r}"),
            ));
        }
    }
    let n = lead.len();
    let mut split = lead.clone();
    split.extend([c, h / r, r, w / r, r]);
    let mut perm: Vec<usize> = (0..n).collect();
    perm.extend([n, n + 2, n + 4, n + 1, n + 3]);
    let mut out = lead;
    out.extend([c * r * r, h / r, w / r]);
    x.reshape(split)?
        .permute(perm)?
        .reshape(out)?
        .laid_out(x.suggest_memory_format())
}

/// Interleaves the channels (dim 1) of `[N, C, ..]` across `groups`
/// (`F.channel_shuffle`, ShuffleNet's): channel `g·(C/groups) + i` goes to
/// `i·groups + g`. Any dtype; at least 3 dims.
///
/// ```
/// use ember::nn::functional::channel_shuffle;
/// use ember::prelude::*;
/// let x = Tensor::arange(0i64, 6, &Device::Cpu)?.reshape([1, 6, 1])?;
/// assert_eq!(channel_shuffle(&x, 2)?.to_vec::<i64>()?, [0, 3, 1, 4, 2, 5]);
/// # Ok::<(), ember::Error>(())
/// ```
pub fn channel_shuffle(x: &Tensor, groups: usize) -> Result<Tensor> {
    const OP: &str = "channel_shuffle";
    if x.rank() <= 2 {
        return Err(Error::invalid(
            OP,
            format!(
                "channel_shuffle expects input with > 2 dims, but got input with sizes {:?}",
                x.shape()
            ),
        ));
    }
    if groups == 0 {
        return Err(Error::invalid(
            OP,
            "Number of groups to divide channels in must be positive. Value of groups:0",
        ));
    }
    let c = x.shape()[1];
    if !c.is_multiple_of(groups) {
        return Err(Error::invalid(
            OP,
            format!("Number of channels must be divisible by groups. Got {c} channels and {groups} groups."),
        ));
    }
    let mut split = vec![x.shape()[0], groups, c / groups];
    split.extend(&x.shape()[2..]);
    x.reshape(split)?
        .transpose(1, 2)?
        .reshape(x.shape())?
        .laid_out(x.suggest_memory_format())
}

/// The sliding window of [`unfold`] and [`fold`]: kernel, dilation, padding
/// and stride, each `(height, width)` (PyTorch's defaults: dilation 1, padding
/// 0, stride 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FoldOptions {
    pub kernel_size: (usize, usize),
    pub dilation: (usize, usize),
    pub padding: (usize, usize),
    pub stride: (usize, usize),
}

impl FoldOptions {
    /// A `k × k` kernel, dilation 1, no padding, stride 1.
    pub fn new(k: usize) -> FoldOptions {
        FoldOptions::rect(k, k)
    }
    /// A `kh × kw` kernel.
    pub fn rect(kh: usize, kw: usize) -> FoldOptions {
        FoldOptions {
            kernel_size: (kh, kw),
            dilation: (1, 1),
            padding: (0, 0),
            stride: (1, 1),
        }
    }
    pub fn dilation(mut self, d: usize) -> Self {
        self.dilation = (d, d);
        self
    }
    pub fn padding(mut self, p: usize) -> Self {
        self.padding = (p, p);
        self
    }
    pub fn stride(mut self, s: usize) -> Self {
        self.stride = (s, s);
        self
    }

    /// PyTorch's checks of the window, in its order.
    fn check(&self, op: &'static str) -> Result<()> {
        let positive = |what: &str, (a, b): (usize, usize), names: (&str, &str)| -> Result<()> {
            if a == 0 || b == 0 {
                return Err(Error::invalid(
                    op,
                    format!(
                        "{what} should be greater than zero, but got {}: {a} {}: {b}",
                        names.0, names.1
                    ),
                ));
            }
            Ok(())
        };
        positive(
            "kernel size",
            self.kernel_size,
            ("kernel_height", "kernel_width"),
        )?;
        positive("stride", self.stride, ("stride_height", "stride_width"))?;
        positive(
            "dilation",
            self.dilation,
            ("dilation_height", "dilation_width"),
        )
    }

    /// The number of windows along a dim of `size` (possibly not positive).
    fn blocks(&self, (h, w): (usize, usize)) -> (i64, i64) {
        let along = |n: usize, k: usize, d: usize, p: usize, s: usize| {
            (n as i64 + 2 * p as i64 - d as i64 * (k as i64 - 1) - 1).div_euclid(s as i64) + 1
        };
        let (k, d, p, s) = (self.kernel_size, self.dilation, self.padding, self.stride);
        (along(h, k.0, d.0, p.0, s.0), along(w, k.1, d.1, p.1, s.1))
    }

    /// Each window element's position in a padded plane `w` wide, flattened,
    /// ordered (kernel row, kernel column, window row, window column): int64
    /// `[kh·kw·bh·bw]` on `dev`.
    fn positions(
        &self,
        w: usize,
        (bh, bw): (usize, usize),
        dev: &crate::device::Device,
    ) -> Result<Tensor> {
        let (kh, kw) = self.kernel_size;
        let wp = w + 2 * self.padding.1;
        let mut pos = Vec::with_capacity(kh * kw * bh * bw);
        for ki in 0..kh {
            for kj in 0..kw {
                for oy in 0..bh {
                    for ox in 0..bw {
                        let y = oy * self.stride.0 + ki * self.dilation.0;
                        let x = ox * self.stride.1 + kj * self.dilation.1;
                        pos.push((y * wp + x) as i64);
                    }
                }
            }
        }
        Tensor::from_vec(pos, [kh * kw * bh * bw], dev)
    }
}

/// The dtypes PyTorch's im2col and col2im take: floating point and bool.
fn check_fold_dtype(op: &'static str, kernel: &str, x: &Tensor) -> Result<()> {
    if x.dtype().is_float() || x.dtype() == DType::Bool {
        return Ok(());
    }
    Err(not_implemented_for(op, kernel, x.dtype()))
}

/// The sliding windows of `[N, C, H, W]` (or `[C, H, W]`) as columns
/// (`F.unfold`, im2col): `[N, C·kh·kw, L]`, `L` the number of windows, each
/// column a window's elements channel by channel (the zero padding included).
///
/// ```
/// use ember::nn::functional::unfold;
/// use ember::nn::FoldOptions;
/// use ember::prelude::*;
/// let x = Tensor::arange(0f32, 9.0, &Device::Cpu)?.reshape([1, 1, 3, 3])?;
/// let cols = unfold(&x, FoldOptions::new(2))?;
/// assert_eq!(cols.shape(), &[1, 4, 4]);
/// // the first window's elements, then the second's, ...
/// assert_eq!(cols.narrow(2, 0, 1)?.to_vec::<f32>()?, [0.0, 1.0, 3.0, 4.0]);
/// # Ok::<(), ember::Error>(())
/// ```
pub fn unfold(x: &Tensor, opts: FoldOptions) -> Result<Tensor> {
    const OP: &str = "unfold";
    opts.check(OP)?;
    let r = x.rank();
    if (r != 3 && r != 4) || x.shape()[r - 3..].contains(&0) {
        return Err(Error::invalid(
            OP,
            format!(
                "Expected 3D or 4D (batch mode) tensor with possibly 0 batch size and other non-zero dimensions for input, but got: {:?}",
                x.shape()
            ),
        ));
    }
    let (c, h, w) = (x.shape()[r - 3], x.shape()[r - 2], x.shape()[r - 1]);
    let (bh, bw) = opts.blocks((h, w));
    if bh < 1 || bw < 1 {
        let FoldOptions {
            kernel_size: k,
            dilation: d,
            padding: p,
            ..
        } = opts;
        return Err(Error::invalid(
            OP,
            format!("Given input with spatial size ({h}, {w}), kernel_size=({}, {}), dilation=({}, {}), padding=({}, {}), calculated shape of the array of sliding blocks as ({bh}, {bw}), but its components must be at least one.", k.0, k.1, d.0, d.1, p.0, p.1),
        ));
    }
    check_fold_dtype(OP, "im2col_out_cpu", x)?;
    if r == 3 {
        return unfold(&x.unsqueeze(0)?, opts)?.squeeze(0);
    }
    let (bh, bw) = (bh as usize, bw as usize);
    let (p, n) = (opts.padding, x.shape()[0]);
    let padded = if p == (0, 0) {
        x.clone()
    } else {
        let (ph, pw) = (p.0 as i64, p.1 as i64);
        x.pad(&[pw, pw, ph, ph], PadMode::Constant(0.0))?
    };
    let (hp, wp) = (h + 2 * p.0, w + 2 * p.1);
    let kk = opts.kernel_size.0 * opts.kernel_size.1;
    let pos = opts.positions(w, (bh, bw), &x.device())?;
    padded
        .reshape([n, c, hp * wp])?
        .index_select(2, &pos)?
        .reshape([n, c * kk, bh * bw])
}

/// Sums columns back into `[N, C, H, W]` planes (`F.fold`, col2im), the
/// adjoint of [`unfold`]: `x` is `[N, C·kh·kw, L]` (or `[C·kh·kw, L]`), `L`
/// the number of windows over an `output_size` plane; where windows overlap,
/// their values add up (bool inputs: any true makes true).
///
/// ```
/// use ember::nn::functional::{fold, unfold};
/// use ember::nn::FoldOptions;
/// use ember::prelude::*;
/// let ones = Tensor::ones([1, 1, 3, 3], DType::F32, &Device::Cpu)?;
/// let opts = FoldOptions::new(2);
/// // how many windows cover each element
/// let counts = fold(&unfold(&ones, opts)?, (3, 3), opts)?;
/// assert_eq!(counts.to_vec::<f32>()?, [1.0, 2.0, 1.0, 2.0, 4.0, 2.0, 1.0, 2.0, 1.0]);
/// # Ok::<(), ember::Error>(())
/// ```
pub fn fold(x: &Tensor, output_size: (usize, usize), opts: FoldOptions) -> Result<Tensor> {
    const OP: &str = "fold";
    opts.check(OP)?;
    let r = x.rank();
    if (r != 2 && r != 3) || x.shape()[r - 2..].contains(&0) {
        return Err(Error::invalid(
            OP,
            format!(
                "Expected 2D or 3D (batch mode) tensor for input with possibly 0 batch size and non-zero dimensions for input, but got: {:?}",
                x.shape()
            ),
        ));
    }
    let (rows, l) = (x.shape()[r - 2], x.shape()[r - 1]);
    let (kh, kw) = opts.kernel_size;
    if !rows.is_multiple_of(kh * kw) {
        return Err(Error::invalid(
            OP,
            format!("Expected size of input's dimension 1 to be divisible by the product of kernel_size, but got input.size(1)={rows} and kernel_size=({kh}, {kw})."),
        ));
    }
    let (oh, ow) = output_size;
    let (bh, bw) = opts.blocks(output_size);
    if bh * bw != l as i64 || bh < 1 || bw < 1 {
        let FoldOptions {
            dilation: d,
            padding: p,
            stride: s,
            ..
        } = opts;
        return Err(Error::invalid(
            OP,
            format!("Given output_size=({oh}, {ow}), kernel_size=({kh}, {kw}), dilation=({}, {}), padding=({}, {}), stride=({}, {}), expected size of input's dimension 2 to match the calculated number of sliding blocks {bh} * {bw} = {}, but got input.size(2)={l}.", d.0, d.1, p.0, p.1, s.0, s.1, bh * bw),
        ));
    }
    check_fold_dtype(OP, "col2im_out_cpu", x)?;
    if r == 2 {
        return fold(&x.unsqueeze(0)?, output_size, opts)?.squeeze(0);
    }
    if x.dtype() == DType::Bool {
        // col2im's `+=` on bools: true where any window holds true
        return col2im(&x.to_dtype(DType::I64)?, output_size, opts, (bh, bw))?.ne(0);
    }
    col2im(x, output_size, opts, (bh, bw))
}

/// [`fold`] of a checked `[N, C·kh·kw, L]`, `(bh, bw)` its windows.
fn col2im(
    x: &Tensor,
    (oh, ow): (usize, usize),
    opts: FoldOptions,
    (bh, bw): (i64, i64),
) -> Result<Tensor> {
    let (kh, kw) = opts.kernel_size;
    let (n, rows, l) = (x.shape()[0], x.shape()[1], x.shape()[2]);
    let c = rows / (kh * kw);
    let p = opts.padding;
    let (hp, wp) = (oh + 2 * p.0, ow + 2 * p.1);
    let pos = opts.positions(ow, (bh as usize, bw as usize), &x.device())?;
    let planes = Tensor::zeros([n, c, hp * wp], x.dtype(), &x.device())?
        .index_add(2, &pos, &x.reshape([n, c, kh * kw * l])?, 1.0)?
        .reshape([n, c, hp, wp])?;
    if p == (0, 0) {
        return Ok(planes);
    }
    planes
        .narrow(2, p.0 as i64, oh)?
        .narrow(3, p.1 as i64, ow)?
        .contiguous()
}

/// Pixel shuffle layer (`nn.PixelShuffle(upscale_factor)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PixelShuffle {
    pub upscale_factor: usize,
}

impl PixelShuffle {
    pub fn new(upscale_factor: usize) -> PixelShuffle {
        PixelShuffle { upscale_factor }
    }
}

impl Module for PixelShuffle {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        pixel_shuffle(x, self.upscale_factor)
    }
}

/// Pixel unshuffle layer (`nn.PixelUnshuffle(downscale_factor)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PixelUnshuffle {
    pub downscale_factor: usize,
}

impl PixelUnshuffle {
    pub fn new(downscale_factor: usize) -> PixelUnshuffle {
        PixelUnshuffle { downscale_factor }
    }
}

impl Module for PixelUnshuffle {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        pixel_unshuffle(x, self.downscale_factor)
    }
}

/// Channel shuffle layer (`nn.ChannelShuffle(groups)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelShuffle {
    pub groups: usize,
}

impl ChannelShuffle {
    pub fn new(groups: usize) -> ChannelShuffle {
        ChannelShuffle { groups }
    }
}

impl Module for ChannelShuffle {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        channel_shuffle(x, self.groups)
    }
}

/// im2col layer (`nn.Unfold(kernel_size, dilation, padding, stride)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unfold(pub FoldOptions);

impl Module for Unfold {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        unfold(x, self.0)
    }
}

/// col2im layer (`nn.Fold(output_size, kernel_size, dilation, padding,
/// stride)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fold {
    /// The planes' `(height, width)`.
    pub output_size: (usize, usize),
    pub options: FoldOptions,
}

impl Fold {
    pub fn new(output_size: (usize, usize), options: FoldOptions) -> Fold {
        Fold {
            output_size,
            options,
        }
    }
}

impl Module for Fold {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        fold(x, self.output_size, self.options)
    }
}
