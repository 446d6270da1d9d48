//! 1-D pooling, adaptive max pooling (1-D and 2-D), adaptive average pooling
//! as functions, and max unpooling, as in `torch.nn.functional`, with their
//! layers.
//!
//! Everything here is a composite of tensor ops, so it runs on every device
//! (meta included) and autograd needs no rule of its own, except max
//! unpooling, whose gradient is a gather at the indices. The 1-D pools are the
//! 2-D ones over a `[.., 1, L]` view; adaptive max pooling gathers every
//! window (padded to the longest by repeating its last row and column, which
//! changes neither its maximum nor the first position of it), picks each
//! window's maximum, and reads the values back by gather, so that the
//! gradient goes to the maxima alone.

use super::layers::AdaptiveAvgPool2d;
use super::Module;
use crate::tensor::{not_implemented_for, Pool2dOptions, Tensor};
use crate::{
    dtype::DType,
    error::{Error, Result},
};

/// The rank check of PyTorch's 1-D pools: two or three dims.
fn check_rank_1d(op: &'static str, x: &Tensor) -> Result<()> {
    if x.rank() == 2 || x.rank() == 3 {
        return Ok(());
    }
    Err(Error::invalid(
        op,
        format!(
            "Expected 2 to 3 dimensions, but got {}-dimensional tensor for argument #1 'self' (while checking arguments for {op})",
            x.rank()
        ),
    ))
}

/// PyTorch's check that every dim from `first` on has elements.
fn check_nonempty(op: &'static str, label: &str, x: &Tensor, first: usize) -> Result<()> {
    match (first..x.rank()).find(|&d| x.shape()[d] == 0) {
        None => Ok(()),
        Some(d) => Err(Error::invalid(
            op,
            format!(
                "{label}: Expected input to have non-zero size for non-batch dimensions, but input has sizes {:?} with dimension {d} being empty",
                x.shape()
            ),
        )),
    }
}

/// The window of a 1-D pooling: kernel, stride (the kernel's by default),
/// padding, dilation (max pooling only), ceil mode and `count_include_pad`
/// (average pooling only; on by default, as in PyTorch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool1dOptions {
    pub kernel: usize,
    pub stride: Option<usize>,
    pub padding: usize,
    pub dilation: usize,
    pub ceil_mode: bool,
    pub count_include_pad: bool,
}

impl Pool1dOptions {
    /// A window of `k` with stride `k`.
    pub fn new(k: usize) -> Pool1dOptions {
        Pool1dOptions {
            kernel: k,
            stride: None,
            padding: 0,
            dilation: 1,
            ceil_mode: false,
            count_include_pad: true,
        }
    }
    pub fn stride(mut self, s: usize) -> Self {
        self.stride = Some(s);
        self
    }
    pub fn padding(mut self, p: usize) -> Self {
        self.padding = p;
        self
    }
    pub fn dilation(mut self, d: usize) -> Self {
        self.dilation = d;
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

    fn stride_or_kernel(&self) -> usize {
        self.stride.unwrap_or(self.kernel)
    }

    /// The 2-D window over `[.., 1, L]`: one row, this window along it.
    fn as_2d(&self) -> Pool2dOptions {
        Pool2dOptions {
            kernel: (1, self.kernel),
            stride: Some((1, self.stride_or_kernel())),
            padding: (0, self.padding),
            dilation: (1, self.dilation),
            ceil_mode: self.ceil_mode,
            count_include_pad: self.count_include_pad,
            divisor_override: None,
        }
    }

    /// PyTorch's output length (it may be zero or negative: the callers refuse it).
    fn out_len(&self, len: usize) -> i64 {
        let (k, s, p, d) = (
            self.kernel as i64,
            self.stride_or_kernel() as i64,
            self.padding as i64,
            self.dilation as i64,
        );
        let span = len as i64 + 2 * p - d * (k - 1) - 1;
        let mut out = if self.ceil_mode {
            (span + s - 1).div_euclid(s) + 1
        } else {
            span.div_euclid(s) + 1
        };
        // the last window starts inside the input or its left padding
        if self.ceil_mode && (out - 1) * s >= len as i64 + p {
            out -= 1;
        }
        out
    }
}

/// The checks of `F.max_pool1d` (its own messages: PyTorch's 1-D kernel's).
/// Its kernel takes floating point only; with `ints`, int64 and uint8 pass too
/// (PyTorch's pooling with indices, the 2-D kernel's, takes them).
fn check_max_pool1d(x: &Tensor, o: &Pool1dOptions, ints: bool) -> Result<()> {
    const OP: &str = "max_pool1d";
    let r = x.rank();
    if (r != 2 && r != 3) || x.shape()[r - 2..].contains(&0) {
        return Err(Error::invalid(
            OP,
            format!(
                "max_pool1d: Expected 2D or 3D (batch mode) tensor with optional 0 dim batch size for input, but got:{:?}",
                x.shape()
            ),
        ));
    }
    let positive = |what: &str, v: usize| -> Result<()> {
        match v {
            0 => Err(Error::invalid(
                OP,
                format!("max_pool1d() {what} must be greater than zero, but got 0"),
            )),
            _ => Ok(()),
        }
    };
    positive("kernel_size", o.kernel)?;
    positive("stride", o.stride_or_kernel())?;
    if o.padding > o.kernel / 2 {
        return Err(Error::invalid(
            OP,
            format!(
                "max_pool1d() padding should be at most half of kernel size, but got padding={} and kernel_size={}",
                o.padding, o.kernel
            ),
        ));
    }
    positive("dilation", o.dilation)?;
    let out = o.out_len(x.shape()[r - 1]);
    if out <= 0 {
        return Err(Error::invalid(
            OP,
            format!("max_pool1d() Invalid computed output size: {out}"),
        ));
    }
    let int_ok = ints && matches!(x.dtype(), DType::I64 | DType::U8);
    if !x.dtype().is_float() && !int_ok {
        return Err(not_implemented_for(OP, "max_pool1d_impl", x.dtype()));
    }
    Ok(())
}

/// 1-D max pooling over `[N, C, L]` or `[C, L]` (`F.max_pool1d`): the 2-D
/// pooling over one row, so padding never wins and NaN does. Floating-point
/// inputs only, as PyTorch's 1-D kernel.
///
/// ```
/// use ember::nn::functional::max_pool1d;
/// use ember::nn::Pool1dOptions;
/// use ember::prelude::*;
/// let x = Tensor::new([[1f32, 3.0, 2.0, 5.0, 4.0]], &Device::Cpu)?;
/// let y = max_pool1d(&x, Pool1dOptions::new(2).stride(1))?;
/// assert_eq!(y.to_vec::<f32>()?, [3.0, 3.0, 5.0, 5.0]);
/// # Ok::<(), ember::Error>(())
/// ```
pub fn max_pool1d(x: &Tensor, opts: Pool1dOptions) -> Result<Tensor> {
    check_max_pool1d(x, &opts, false)?;
    x.unsqueeze(-2)?.max_pool2d(opts.as_2d())?.squeeze(-2)
}

/// [`max_pool1d`] with the position of each maximum along `L` (int64), as
/// `F.max_pool1d(..., return_indices=True)` gives; int64 and uint8 inputs
/// too, as there.
pub fn max_pool1d_with_indices(x: &Tensor, opts: Pool1dOptions) -> Result<(Tensor, Tensor)> {
    check_max_pool1d(x, &opts, true)?;
    let (y, i) = x.unsqueeze(-2)?.max_pool2d_with_indices(opts.as_2d())?;
    Ok((y.squeeze(-2)?, i.squeeze(-2)?))
}

/// 2-D max pooling with each maximum's position in its flattened `H·W` plane
/// (`F.max_pool2d(..., return_indices=True)`):
/// [`Tensor::max_pool2d_with_indices`].
pub fn max_pool2d_with_indices(x: &Tensor, opts: Pool2dOptions) -> Result<(Tensor, Tensor)> {
    x.max_pool2d_with_indices(opts)
}

/// 1-D average pooling over `[N, C, L]` or `[C, L]` (`F.avg_pool1d`), with
/// `count_include_pad` and ceil mode as in PyTorch (dilation is refused: average
/// pooling has none). Floating-point and int64 inputs (int64 means truncated
/// toward zero), as PyTorch's.
pub fn avg_pool1d(x: &Tensor, opts: Pool1dOptions) -> Result<Tensor> {
    const OP: &str = "avg_pool1d";
    check_rank_1d(OP, x)?;
    if opts.dilation != 1 {
        return Err(Error::invalid(OP, "avg_pool1d has no dilation"));
    }
    if opts.stride_or_kernel() == 0 {
        return Err(Error::invalid(OP, "stride should not be zero"));
    }
    if opts.kernel == 0 {
        return Err(Error::invalid(
            OP,
            "kernel_size must be greater than zero, but got 0",
        ));
    }
    if opts.padding > opts.kernel / 2 {
        return Err(Error::invalid(
            OP,
            format!(
                "pad should be at most half of effective kernel size, but got pad={}, kernel_size={} and dilation=1",
                opts.padding, opts.kernel
            ),
        ));
    }
    let r = x.rank();
    let len = x.shape()[r - 1];
    let out = opts.out_len(len);
    if out <= 0 && !x.shape()[r - 2..].contains(&0) {
        return Err(Error::invalid(
            OP,
            format!(
                "Given input size: ({}x1x{len}). Calculated output size: ({}x1x{out}). Output size is too small",
                x.shape()[r - 2],
                x.shape()[r - 2]
            ),
        ));
    }
    x.unsqueeze(-2)?.avg_pool2d(opts.as_2d())?.squeeze(-2)
}

/// The checks of 2-D adaptive pooling shared by the average and the max:
/// a 3-D or 4-D input with elements in its last two dims (`first_nonempty`
/// from there on), and a floating-point dtype.
fn check_adaptive_2d(op: &'static str, x: &Tensor, first_nonempty: usize) -> Result<()> {
    let sep = if op == "adaptive_max_pool2d" { ":" } else { "" };
    if x.rank() != 3 && x.rank() != 4 {
        return Err(Error::invalid(
            op,
            format!(
                "{op}(): Expected 3D or 4D tensor, but got{sep} {:?}",
                x.shape()
            ),
        ));
    }
    check_nonempty(op, &format!("{op}()"), x, first_nonempty)?;
    if !x.dtype().is_float() {
        return Err(not_implemented_for(op, op, x.dtype()));
    }
    Ok(())
}

/// An empty `[.., oh, ow]` output (an output size of zero), still a function
/// of `x` for autograd (its gradient is zeros).
fn empty_output(x: &Tensor, (oh, ow): (usize, usize)) -> Result<Tensor> {
    let r = x.rank();
    let mut shape = x.shape()[..r - 2].to_vec();
    shape.extend([oh, ow]);
    x.flatten_all()?.narrow(0, 0, 0)?.reshape(shape)
}

/// 2-D average pooling to an `(oh, ow)` output over `[N, C, H, W]` or `[C, H,
/// W]` (`F.adaptive_avg_pool2d`): PyTorch's overlapping windows, as
/// [`AdaptiveAvgPool2d`] computes them; an output size of zero gives an empty
/// output. PyTorch's checks and messages.
pub fn adaptive_avg_pool2d(x: &Tensor, output: (usize, usize)) -> Result<Tensor> {
    const OP: &str = "adaptive_avg_pool2d";
    check_adaptive_2d(OP, x, x.rank() - 2)?;
    if output.0 == 0 || output.1 == 0 {
        return empty_output(x, output);
    }
    AdaptiveAvgPool2d::new(output).forward(x)
}

/// 1-D average pooling to `output` positions over `[N, C, L]` or `[C, L]`
/// (`F.adaptive_avg_pool1d`): position `i` averages `floor(i·L/out) ..
/// ceil((i+1)·L/out)`.
///
/// ```
/// use ember::nn::functional::adaptive_avg_pool1d;
/// use ember::prelude::*;
/// let x = Tensor::arange(0f32, 5.0, &Device::Cpu)?.reshape([1, 5])?;
/// // windows 0..3 and 2..5
/// assert_eq!(adaptive_avg_pool1d(&x, 2)?.to_vec::<f32>()?, [1.0, 3.0]);
/// # Ok::<(), ember::Error>(())
/// ```
pub fn adaptive_avg_pool1d(x: &Tensor, output: usize) -> Result<Tensor> {
    check_rank_1d("adaptive_avg_pool1d", x)?;
    adaptive_avg_pool2d(&x.unsqueeze(-2)?, (1, output))?.squeeze(-2)
}

/// The windows of adaptive pooling of `size` into `out`: each `(start, len)`.
fn windows(size: usize, out: usize) -> Vec<(usize, usize)> {
    (0..out)
        .map(|i| {
            let start = i * size / out;
            let end = ((i + 1) * size).div_ceil(out);
            (start, end - start)
        })
        .collect()
}

/// Adaptive max pooling of the last two dims of `x` (checked) to `(oh, ow)`:
/// the values (differentiable, by gather) and the int64 positions in each
/// flattened plane.
fn adaptive_max(x: &Tensor, (oh, ow): (usize, usize)) -> Result<(Tensor, Tensor)> {
    let r = x.rank();
    let (h, w) = (x.shape()[r - 2], x.shape()[r - 1]);
    let mut shape = x.shape()[..r - 2].to_vec();
    shape.extend([oh, ow]);
    let dev = x.device();
    if oh == 0 || ow == 0 {
        let index = Tensor::zeros(&shape[..], DType::I64, &dev)?;
        return Ok((empty_output(x, (oh, ow))?, index));
    }
    let (rows, cols) = (windows(h, oh), windows(w, ow));
    let kh = rows.iter().map(|r| r.1).max().unwrap_or(1);
    let kw = cols.iter().map(|c| c.1).max().unwrap_or(1);
    let k = kh * kw;
    // each window's positions in scan order, shorter windows padded with their
    // last row and column again
    let mut table = Vec::with_capacity(oh * ow * k);
    for &(r0, rl) in &rows {
        for &(c0, cl) in &cols {
            for a in 0..kh {
                for b in 0..kw {
                    table.push(((r0 + a.min(rl - 1)) * w + c0 + b.min(cl - 1)) as i64);
                }
            }
        }
    }
    let planes: usize = x.shape()[..r - 2].iter().product();
    let flat = x.reshape([planes, h * w])?;
    let index = {
        let _ng = crate::autograd::no_grad_guard();
        let table = Tensor::from_vec(table, [oh * ow, k], &dev)?;
        let cells = flat
            .index_select(1, &table.reshape([oh * ow * k])?)?
            .reshape([planes, oh * ow, k])?;
        let pos = Tensor::arange(0i64, k as i64, &dev)?;
        // the first maximum; where a window holds NaN, its last NaN (PyTorch's
        // scan takes every NaN it meets)
        let best = cells.max(-1, true)?;
        let first = cells.eq(&best)?.where_(&pos, k as i64)?.min(-1, true)?;
        let last_nan = cells.isnan()?.where_(&pos, -1i64)?.max(-1, true)?;
        let at = last_nan.ge(0i64)?.where_(&last_nan, &first)?;
        table
            .expand([planes, oh * ow, k])?
            .gather(2, &at)?
            .reshape([planes, oh * ow])?
    };
    let values = flat.gather(1, &index)?.reshape(&shape[..])?;
    let format = x.suggest_memory_format();
    Ok((
        values.laid_out(format)?,
        index.reshape(&shape[..])?.laid_out(format)?,
    ))
}

/// 2-D max pooling to an `(oh, ow)` output over `[N, C, H, W]` or `[C, H, W]`
/// (`F.adaptive_max_pool2d`), PyTorch's windows (`floor(i·H/oh) ..
/// ceil((i+1)·H/oh)`, likewise along `W`); the gradient goes to each window's
/// maximum (the first in scan order where several tie).
pub fn adaptive_max_pool2d(x: &Tensor, output: (usize, usize)) -> Result<Tensor> {
    adaptive_max_pool2d_with_indices(x, output).map(|(y, _)| y)
}

/// [`adaptive_max_pool2d`] with each maximum's position in its flattened
/// `H·W` plane (int64), as `return_indices=True` gives.
pub fn adaptive_max_pool2d_with_indices(
    x: &Tensor,
    output: (usize, usize),
) -> Result<(Tensor, Tensor)> {
    check_adaptive_2d("adaptive_max_pool2d", x, 1)?;
    adaptive_max(x, output)
}

/// 1-D max pooling to `output` positions over `[N, C, L]` or `[C, L]`
/// (`F.adaptive_max_pool1d`).
///
/// ```
/// use ember::nn::functional::adaptive_max_pool1d_with_indices;
/// use ember::prelude::*;
/// let x = Tensor::new([[4f32, 1.0, 4.0, 0.0, 9.0]], &Device::Cpu)?;
/// let (y, i) = adaptive_max_pool1d_with_indices(&x, 2)?;
/// // windows 0..3 and 2..5; the first of two equal maxima
/// assert_eq!((y.to_vec::<f32>()?, i.to_vec::<i64>()?), (vec![4.0, 9.0], vec![0, 4]));
/// # Ok::<(), ember::Error>(())
/// ```
pub fn adaptive_max_pool1d(x: &Tensor, output: usize) -> Result<Tensor> {
    adaptive_max_pool1d_with_indices(x, output).map(|(y, _)| y)
}

/// [`adaptive_max_pool1d`] with each maximum's position along `L` (int64).
pub fn adaptive_max_pool1d_with_indices(x: &Tensor, output: usize) -> Result<(Tensor, Tensor)> {
    const OP: &str = "adaptive_max_pool1d";
    check_rank_1d(OP, x)?;
    check_nonempty(OP, "adaptive_max_pool1d()", x, 1)?;
    if !x.dtype().is_float() {
        return Err(not_implemented_for(OP, "adaptive_max_pool2d", x.dtype()));
    }
    let (y, i) = adaptive_max(&x.unsqueeze(-2)?, (1, output))?;
    Ok((y.squeeze(-2)?, i.squeeze(-2)?))
}

/// The output's `(H, W)` of max unpooling: PyTorch's default `(in − 1)·stride −
/// 2·padding + kernel`, or `output_size` (the last two of four, or two), which
/// must lie strictly within a stride of the default.
fn unpool_size(x: &Tensor, o: &Pool2dOptions, output: Option<&[usize]>) -> Result<(usize, usize)> {
    const OP: &str = "max_unpool2d";
    let r = x.rank();
    let stride = o.stride.unwrap_or(o.kernel);
    let default = [
        (x.shape()[r - 2] as i64 - 1) * stride.0 as i64 + o.kernel.0 as i64
            - 2 * o.padding.0 as i64,
        (x.shape()[r - 1] as i64 - 1) * stride.1 as i64 + o.kernel.1 as i64
            - 2 * o.padding.1 as i64,
    ];
    let size = match output {
        None => default,
        Some(s) => {
            let s = if s.len() == 4 { &s[2..] } else { s };
            if s.len() != 2 {
                return Err(Error::invalid(
                    OP,
                    format!("output_size should be a sequence containing 2 or 4 elements, but it has a length of '{}'", s.len()),
                ));
            }
            let strides = [stride.0 as i64, stride.1 as i64];
            for d in 0..2 {
                let (lo, hi) = (default[d] - strides[d], default[d] + strides[d]);
                if !(lo < s[d] as i64 && (s[d] as i64) < hi) {
                    return Err(Error::invalid(
                        OP,
                        format!(
                            "invalid output_size \"({}, {})\" (dim {d} must be between {lo} and {hi})",
                            s[0], s[1]
                        ),
                    ));
                }
            }
            [s[0] as i64, s[1] as i64]
        }
    };
    for (d, &n) in size.iter().enumerate() {
        if n < 0 {
            return Err(Error::invalid(
                OP,
                format!("max_unpooling: output_size must contain non-negative spatial dimensions, but got output_size[{d}]={n}"),
            ));
        }
    }
    Ok((size[0] as usize, size[1] as usize))
}

/// The partial inverse of 2-D max pooling (`F.max_unpool2d`): each value of
/// `x` (`[N, C, H, W]` or `[C, H, W]`) put at its index (`indices`, int64 of
/// `x`'s shape, as [`Tensor::max_pool2d_with_indices`] gives) in a zero
/// output plane. `opts` are the pooling's kernel, stride and padding (its
/// dilation and ceil mode play no part), which give the output's size unless
/// `output_size` names it (two, or four of which the last two count; within a
/// stride of the default, as PyTorch requires). Where two values share an
/// index, the later one stays, as PyTorch's CPU kernel writes; each value's
/// gradient is the output gradient at its index.
///
/// ```
/// use ember::nn::functional::max_unpool2d;
/// use ember::prelude::*;
/// let x = Tensor::new([[[[1f32, 5.0], [7.0, 2.0]]]], &Device::Cpu)?;
/// let (y, i) = x.max_pool2d_with_indices(Pool2dOptions::new(2))?;
/// let back = max_unpool2d(&y, &i, Pool2dOptions::new(2), None)?;
/// assert_eq!(back.to_vec::<f32>()?, [0.0, 0.0, 7.0, 0.0]);
/// # Ok::<(), ember::Error>(())
/// ```
pub fn max_unpool2d(
    x: &Tensor,
    indices: &Tensor,
    opts: Pool2dOptions,
    output_size: Option<&[usize]>,
) -> Result<Tensor> {
    const OP: &str = "max_unpool2d";
    let r = x.rank();
    if r < 2 {
        return Err(Error::invalid(
            OP,
            format!("Input to max_unpooling2d should be a 3d or 4d Tensor, but got a tensor with {r} dimensions."),
        ));
    }
    let (oh, ow) = unpool_size(x, &opts, output_size)?;
    if indices.dtype() != DType::I64 {
        return Err(Error::dtype(
            OP,
            indices.dtype(),
            format!(
                "elements in indices should be type int64 but got: {}",
                crate::tensor::torch_dtype_name(indices.dtype())
            ),
        ));
    }
    if r != 3 && r != 4 {
        return Err(Error::invalid(
            OP,
            format!("Input to max_unpooling2d should be a 3d or 4d Tensor, but got a tensor with {r} dimensions."),
        ));
    }
    if indices.shape() != x.shape() {
        return Err(Error::shape(
            OP,
            x.shape(),
            indices.shape(),
            format!(
                "Expected shape of indices to be same as that of the input tensor ({:?}) but got indices tensor with shape: {:?}",
                x.shape(),
                indices.shape()
            ),
        ));
    }
    check_nonempty(OP, "max_unpooling2d_forward_out_cpu()", x, 1)?;
    if !x.dtype().is_float() {
        return Err(not_implemented_for(OP, OP, x.dtype()));
    }
    crate::tensor::same_device(OP, &[x, indices])?;
    let mut shape = x.shape()[..r - 2].to_vec();
    shape.extend([oh, ow]);
    let planes: usize = x.shape()[..r - 2].iter().product();
    let n = x.shape()[r - 2] * x.shape()[r - 1];
    let flat = x.reshape([planes, n])?;
    if planes == 0 || oh * ow == 0 {
        return flat.narrow(1, 0, 0)?.reshape(&shape[..]);
    }
    let idx = Tensor::index_values(OP, &indices.reshape([planes, n])?, 1, oh * ow, false).map_err(
        |e| match e {
            Error::IndexOutOfRange { index, .. } => Error::invalid(
                OP,
                format!(
                    "Found an invalid max index: {index} (output volumes are of size {oh}x{ow})"
                ),
            ),
            e => e,
        },
    )?;
    // the output and the values' gradient keep the input's memory format
    let format = x.suggest_memory_format();
    let out = {
        let _ng = crate::autograd::no_grad_guard();
        // the last value at each index: sorted stably by index, each run's last
        let order = idx.argsort(1, false)?;
        let sorted = idx.gather(1, &order)?;
        let next = Tensor::cat(
            &[
                &sorted.narrow(1, 1, n - 1)?,
                &Tensor::full([planes, 1], -1i64, DType::I64, &x.device())?,
            ],
            1,
        )?;
        let vals = flat.detach().gather(1, &order)?;
        let kept = sorted.ne(&next)?.where_(&vals, 0.0)?;
        Tensor::zeros([planes, oh * ow], x.dtype(), &x.device())?
            .scatter_add(1, &sorted, &kept)?
            .reshape(&shape[..])?
            .laid_out(format)?
    };
    Ok(Tensor::record_twice(out, OP, &[x], |_| {
        let xshape = x.shape().to_vec();
        move |g: &Tensor| {
            let gx = g.reshape([planes, oh * ow])?.gather(1, &idx)?;
            Ok(vec![Some(gx.reshape(&xshape[..])?.laid_out(format)?)])
        }
    }))
}

/// 1-D max pooling layer (`nn.MaxPool1d`).
#[derive(Clone, Copy, Debug)]
pub struct MaxPool1d(pub Pool1dOptions);

impl MaxPool1d {
    /// The pooled values and each maximum's position (`return_indices=True`).
    pub fn forward_with_indices(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        max_pool1d_with_indices(x, self.0)
    }
}

impl Module for MaxPool1d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        max_pool1d(x, self.0)
    }
}

/// 1-D average pooling layer (`nn.AvgPool1d`).
#[derive(Clone, Copy, Debug)]
pub struct AvgPool1d(pub Pool1dOptions);

impl Module for AvgPool1d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        avg_pool1d(x, self.0)
    }
}

/// 1-D average pooling to a fixed length (`nn.AdaptiveAvgPool1d(out)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdaptiveAvgPool1d {
    pub output: usize,
}

impl AdaptiveAvgPool1d {
    pub fn new(output: usize) -> AdaptiveAvgPool1d {
        AdaptiveAvgPool1d { output }
    }
}

impl Module for AdaptiveAvgPool1d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        adaptive_avg_pool1d(x, self.output)
    }
}

/// 1-D max pooling to a fixed length (`nn.AdaptiveMaxPool1d(out)`);
/// [`forward_with_indices`](Self::forward_with_indices) is its
/// `return_indices=True`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdaptiveMaxPool1d {
    pub output: usize,
}

impl AdaptiveMaxPool1d {
    pub fn new(output: usize) -> AdaptiveMaxPool1d {
        AdaptiveMaxPool1d { output }
    }

    /// The pooled values and each maximum's position along `L`.
    pub fn forward_with_indices(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        adaptive_max_pool1d_with_indices(x, self.output)
    }
}

impl Module for AdaptiveMaxPool1d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        adaptive_max_pool1d(x, self.output)
    }
}

/// 2-D max pooling to a fixed size (`nn.AdaptiveMaxPool2d((oh, ow))`);
/// [`forward_with_indices`](Self::forward_with_indices) is its
/// `return_indices=True`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdaptiveMaxPool2d {
    /// The output's `(height, width)`.
    pub output: (usize, usize),
}

impl AdaptiveMaxPool2d {
    pub fn new(output: (usize, usize)) -> AdaptiveMaxPool2d {
        AdaptiveMaxPool2d { output }
    }

    /// The pooled values and each maximum's position in its flattened plane.
    pub fn forward_with_indices(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        adaptive_max_pool2d_with_indices(x, self.output)
    }
}

impl Module for AdaptiveMaxPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        adaptive_max_pool2d(x, self.output)
    }
}

/// 2-D max unpooling layer (`nn.MaxUnpool2d`): the kernel, stride (the
/// kernel's by default) and padding of the max pooling it undoes. It takes the
/// pooling's indices, so it is called through [`forward`](Self::forward)
/// rather than [`Module`].
#[derive(Clone, Copy, Debug)]
pub struct MaxUnpool2d(pub Pool2dOptions);

impl MaxUnpool2d {
    /// [`max_unpool2d`] of `x` at `indices`, to `output_size` when given.
    pub fn forward(
        &self,
        x: &Tensor,
        indices: &Tensor,
        output_size: Option<&[usize]>,
    ) -> Result<Tensor> {
        max_unpool2d(x, indices, self.0, output_size)
    }
}
