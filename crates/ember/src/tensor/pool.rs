//! 2-D max and average pooling: validation, shapes and the gradient's
//! bookkeeping; each device's backend computes.

use super::Tensor;
use crate::backend::op::{Pool, PoolShape, Window};
use crate::layout::{checked_numel, MemoryFormat};
use crate::{
    dtype::DType,
    error::{Error, Result},
};

/// Each output's element as an offset in its plane, `[planes, oh · ow]` int64, from
/// its position `k` in its window (the index max pooling keeps): `(oy·sh − ph +
/// (k / kw)·dh)·w + ox·sw − pw + (k % kw)·dw`.
fn plane_offsets(index: &Tensor, ps: &PoolShape) -> Result<Tensor> {
    plane_offsets_valid(index, ps).map(|(at, _)| at)
}

/// [`plane_offsets`], and whether each window has its element in the input
/// (`[planes, oh · ow]` bool: false for a dilated window past the padding,
/// whose offset is clamped into the plane).
fn plane_offsets_valid(index: &Tensor, ps: &PoolShape) -> Result<(Tensor, Tensor)> {
    let Window {
        kernel: (_, kw),
        stride: (sh, sw),
        padding: (ph, pw),
        dilation: (dh, dw),
    } = ps.win;
    let dev = index.device();
    let k = index
        .to_dtype(DType::I64)?
        .reshape([ps.planes, ps.oh, ps.ow])?;
    let (ki, kj) = (k.floor_divide(kw as i64)?, k.remainder(kw as i64)?);
    let oy = Tensor::arange(0i64, ps.oh as i64, &dev)?.reshape([ps.oh, 1])?;
    let ox = Tensor::arange(0i64, ps.ow as i64, &dev)?.reshape([1, ps.ow])?;
    let iy = oy
        .mul(sh as i64)?
        .sub(ph as i64)?
        .add(&ki.mul(dh as i64)?)?;
    let ix = ox
        .mul(sw as i64)?
        .sub(pw as i64)?
        .add(&kj.mul(dw as i64)?)?;
    // a window with no element in the input (dilated, past the padding) points
    // outside the plane: the caller replaces its value, the clamp keeps the
    // gather in the plane (never empty: the caller refuses empty planes)
    let last = (ps.h * ps.w).saturating_sub(1) as i64;
    let inside =
        |t: &Tensor, n: usize| -> Result<Tensor> { t.ge(0i64)?.logical_and(&t.lt(n as i64)?) };
    let valid = inside(&iy, ps.h)?
        .logical_and(&inside(&ix, ps.w)?)?
        .reshape([ps.planes, ps.oh * ps.ow])?;
    let at = iy
        .mul(ps.w as i64)?
        .add(&ix)?
        .maximum(0i64)?
        .minimum(last)?
        .reshape([ps.planes, ps.oh * ps.ow])?
        .contiguous()?;
    Ok((at, valid))
}

/// The pooling's gradient `gx` (of the output's gradient `g`) as a function of
/// `g`, for a walk that creates a graph: the gradient is linear in `g`, so its
/// own gradient is the pooling of the incoming one, PyTorch's
/// `avg_pool2d(gg)` or, for max pooling, `gg` gathered at each window's
/// maximum. (PyTorch's gradient of it with respect to the input is zeros; here
/// the input is not reached: keeping the input for that would hold it for
/// every first-order backward too.)
fn pool_backward_recorded(
    gx: Tensor,
    g: &Tensor,
    (opts, kind): (&Pool2dOptions, Pool),
    index: Option<&Tensor>,
    ps: &PoolShape,
) -> Result<Tensor> {
    let offsets = match (kind, index) {
        (Pool::Max, Some(index)) => {
            let _ng = crate::autograd::no_grad_guard();
            Some(plane_offsets_valid(index, ps)?)
        }
        (Pool::Max, None) => {
            return Err(Error::invalid(
                "max_pool2d",
                "the pooling kept no indices for its gradient",
            ))
        }
        _ => None,
    };
    let (opts, out_shape) = (*opts, g.shape().to_vec());
    let name = match kind {
        Pool::Max => "max_pool2d_backward",
        Pool::Avg { .. } => "avg_pool2d_backward",
    };
    Ok(Tensor::record_twice(gx, name, &[g], |_| {
        let (planes, hw) = (ps.planes, ps.h * ps.w);
        move |gg: &Tensor| {
            let pooled = match &offsets {
                // a window with no element in the input got nothing, and gives nothing
                Some((at, valid)) => valid
                    .where_(&gg.reshape([planes, hw])?.gather(1, at)?, 0.0)?
                    .reshape(&out_shape[..])?,
                None => gg.avg_pool2d(opts)?,
            };
            Ok(vec![Some(pooled)])
        }
    }))
}

/// The kept offsets as the caller sees them: `[.., oh, ow]` in the output's
/// memory format, when asked for.
fn offsets_out(
    offsets: Option<Tensor>,
    keep: bool,
    shape: &[usize],
    format: MemoryFormat,
) -> Result<Option<Tensor>> {
    if !keep {
        return Ok(None);
    }
    let _ng = crate::autograd::no_grad_guard();
    offsets
        .map(|o| o.reshape(shape)?.laid_out(format))
        .transpose()
}

impl Tensor {
    fn pool2d(&self, op: &'static str, opts: &Pool2dOptions, kind: Pool) -> Result<Tensor> {
        self.pool2d_indexed(op, opts, kind, false).map(|(y, _)| y)
    }

    /// The pooling, and with `keep_index` each maximum's offset in its input
    /// plane (int64, shaped and laid out as the output), from the same kernel
    /// run as the values.
    fn pool2d_indexed(
        &self,
        op: &'static str,
        opts: &Pool2dOptions,
        kind: Pool,
        keep_index: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        // PyTorch pools int64 (max and average) and uint8 (max only), not bools
        let int = !self.dtype().is_float();
        let int_ok = match self.dtype() {
            DType::I64 => true,
            DType::U8 => kind == Pool::Max,
            _ => !int,
        };
        if !int_ok {
            return Err(super::elementwise::not_implemented_for(
                op,
                op,
                self.dtype(),
            ));
        }
        if self.rank() != 3 && self.rank() != 4 {
            return Err(Error::invalid(
                op,
                format!("expected a 3-D or 4-D input, got shape {:?}", self.shape()),
            ));
        }
        let r = self.rank();
        // only a batch dim may be empty (PyTorch's rule)
        if self.shape()[r - 3..].contains(&0) {
            return Err(Error::invalid(
                op,
                format!(
                    "Expected 3D or 4D (batch mode) tensor with optional 0 dim batch size for input, but got:{:?}",
                    self.shape()
                ),
            ));
        }
        let (h, w) = (self.shape()[r - 2], self.shape()[r - 1]);
        let win = opts.window();
        let (kh, kw) = win.kernel;
        if kh == 0
            || kw == 0
            || win.stride.0 == 0
            || win.stride.1 == 0
            || win.dilation.0 == 0
            || win.dilation.1 == 0
        {
            return Err(Error::invalid(
                op,
                "kernel size, stride and dilation must be greater than zero",
            ));
        }
        if win.padding.0 > kh / 2 || win.padding.1 > kw / 2 {
            return Err(Error::invalid(op, format!("pad should be at most half of effective kernel size, but got pad={:?} and kernel_size={:?}", win.padding, win.kernel)));
        }
        let oh = Window::out_size(
            h,
            kh,
            win.stride.0,
            win.padding.0,
            win.dilation.0,
            opts.ceil_mode,
        );
        let ow = Window::out_size(
            w,
            kw,
            win.stride.1,
            win.padding.1,
            win.dilation.1,
            opts.ceil_mode,
        );
        let (Some(oh), Some(ow)) = (oh, ow) else {
            return Err(Error::invalid(
                op,
                format!("output size is too small for input {:?}", self.shape()),
            ));
        };
        let planes = self.shape()[..r - 2].iter().product();
        checked_numel(op, &[planes, oh, ow])?;
        // integers pool through f64: max pooling picks each maximum's position
        // there and reads the integer back (exact), average pooling truncates the
        // mean toward zero as PyTorch's integer division does (exact while the
        // window sums stay below 2^53)
        let work = if int {
            DType::F64
        } else if matches!(self.dtype(), DType::F16 | DType::BF16) && !self.read().pools_half() {
            DType::F32
        } else {
            self.dtype()
        };
        // max pooling keeps the position of each maximum for the backward pass
        let want_index =
            keep_index || crate::autograd::needs_grad(&[self]) || (int && kind == Pool::Max);
        // the output and the input's gradient keep the input's memory format; a
        // dense channels-last float input is pooled as it lies where the device
        // can (the GPU's kernels), else row-major and laid out again
        let format = self.suggest_memory_format();
        let cl = !int
            && r == 4
            && !self.is_contiguous()
            && self.is_contiguous_in(MemoryFormat::ChannelsLast)
            && self.read().pools_channels_last();
        let ps = PoolShape {
            planes,
            h,
            w,
            oh,
            ow,
            win,
            nhwc: cl.then(|| self.shape()[1]),
        };
        let mut shape = self.shape()[..r - 2].to_vec();
        shape.extend([oh, ow]);
        let (pooled, index) = {
            let _ng = crate::autograd::no_grad_guard();
            let x = self.to_dtype(work)?.in_order(cl)?;
            let (out, index) = x.read().pool2d(x.layout(), &ps, kind, want_index)?;
            // the index lies as the output does (the backward pass reads it so)
            (
                Tensor::from_storage_in(out, &shape, cl),
                index.map(|i| Tensor::from_storage_in(i, &shape, cl)),
            )
        };
        let offsets = match &index {
            Some(index) if keep_index || int => {
                let _ng = crate::autograd::no_grad_guard();
                Some(plane_offsets(index, &ps)?)
            }
            _ => None,
        };
        if int {
            // integers have no gradient
            let _ng = crate::autograd::no_grad_guard();
            let out = match (kind, &offsets) {
                (Pool::Max, Some(offsets)) => {
                    let planes_x = self.contiguous()?.reshape([planes, h * w])?;
                    let got = planes_x.gather_valid(1, offsets.clone())?.reshape(&shape)?;
                    // a window with no element in the input (a dilated one past
                    // the padding): the dtype's lowest value, as PyTorch gives
                    let lowest = if self.dtype() == DType::U8 {
                        0
                    } else {
                        i64::MIN
                    };
                    pooled.eq(f64::NEG_INFINITY)?.where_(lowest, &got)
                }
                _ => pooled.to_dtype(self.dtype()),
            }
            .and_then(|t| t.laid_out(format))?;
            return Ok((out, offsets_out(offsets, keep_index, &shape, format)?));
        }
        let offsets = offsets_out(offsets, keep_index, &shape, format)?;
        let out = pooled.to_dtype(self.dtype())?.laid_out(format)?;
        let opts = *opts;
        let out = Tensor::record_twice(out, op, &[self], |_| {
            let (xdt, xshape) = (self.dtype(), self.shape().to_vec());
            move |g: &Tensor| {
                let gc = g.to_dtype(work)?.in_order(cl)?;
                let gx = {
                    let idx = index.as_ref().map(|i| i.read());
                    gc.read()
                        .pool2d_backward(gc.layout(), idx.as_deref(), &ps, kind)?
                };
                let gx = Tensor::from_storage_in(gx, &xshape, cl);
                let gx = if crate::autograd::creating_graph() {
                    pool_backward_recorded(gx, &gc, (&opts, kind), index.as_ref(), &ps)?
                } else {
                    gx
                };
                Ok(vec![Some(gx.to_dtype(xdt)?.laid_out(format)?)])
            }
        });
        Ok((out, offsets))
    }

    /// 2-D max pooling over `[N, C, H, W]` or `[C, H, W]` (`F.max_pool2d`); padded
    /// positions never win, NaN does. Float, int64 and uint8 inputs, as in PyTorch.
    pub fn max_pool2d(&self, opts: Pool2dOptions) -> Result<Tensor> {
        self.pool2d("max_pool2d", &opts, Pool::Max)
    }

    /// 2-D average pooling (`F.avg_pool2d`); `count_include_pad` as in PyTorch.
    /// Float and int64 inputs; int64 means are truncated toward zero, as PyTorch's.
    pub fn avg_pool2d(&self, opts: Pool2dOptions) -> Result<Tensor> {
        if opts.dilation != (1, 1) {
            return Err(Error::invalid("avg_pool2d", "avg_pool2d has no dilation"));
        }
        if let Some(div) = opts.divisor_override {
            return self.avg_pool2d_divided(opts, div);
        }
        self.pool2d(
            "avg_pool2d",
            &opts,
            Pool::Avg {
                count_include_pad: opts.count_include_pad,
            },
        )
    }
}

impl Tensor {
    /// [`max_pool2d`](Self::max_pool2d) with the position of each maximum
    /// (`F.max_pool2d(..., return_indices=True)`): int64 indices into each
    /// flattened `H·W` plane, the form [`max_unpool2d`] reads. The values and
    /// their gradient are `max_pool2d`'s; the indices come from the same kernel
    /// run, which keeps them for the gradient anyway (a maximum that ties keeps
    /// the first position in the window, a NaN wins, as in PyTorch).
    ///
    /// [`max_unpool2d`]: crate::nn::functional::max_unpool2d
    ///
    /// ```
    /// # use ember::{Device, Pool2dOptions, Tensor};
    /// let x = Tensor::new([[[[1f32, 5.0], [7.0, 2.0]]]], &Device::Cpu)?;
    /// let (y, i) = x.max_pool2d_with_indices(Pool2dOptions::new(2))?;
    /// assert_eq!((y.to_vec::<f32>()?, i.to_vec::<i64>()?), (vec![7.0], vec![2]));
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn max_pool2d_with_indices(&self, opts: Pool2dOptions) -> Result<(Tensor, Tensor)> {
        let (values, index) = self.pool2d_indexed("max_pool2d", &opts, Pool::Max, true)?;
        let index = index
            .ok_or_else(|| Error::invalid("max_pool2d", "the pooling kernel kept no indices"))?;
        Ok((values, index))
    }
}

impl Tensor {
    /// Average pooling with PyTorch's `divisor_override`: each window's sum
    /// divided by `div` (`count_include_pad` then plays no part). The sum is the
    /// padded-window mean times the window's size there (as the pooling kernel
    /// counts it), so the gradient is the pooling's, scaled.
    fn avg_pool2d_divided(&self, opts: Pool2dOptions, div: usize) -> Result<Tensor> {
        const OP: &str = "avg_pool2d";
        if div == 0 {
            return Err(Error::invalid(OP, "divisor must be not zero"));
        }
        let plain = Pool2dOptions {
            divisor_override: None,
            count_include_pad: true,
            ..opts
        };
        let int = !self.dtype().is_float();
        // integers sum exactly in f64; half types in float32, rounded once
        let work = match self.dtype() {
            d if !d.is_float() => DType::F64,
            DType::F16 | DType::BF16 => DType::F32,
            d => d,
        };
        if int {
            // the refusals of integer dtypes other than int64 are the pooling's own
            self.pool2d_check_dtype(OP)?;
        }
        let mean = self.to_dtype(work)?.avg_pool2d(plain)?;
        let r = self.rank();
        let (h, w) = (self.shape()[r - 2], self.shape()[r - 1]);
        let (oh, ow) = (mean.shape()[r - 2], mean.shape()[r - 1]);
        let win = plain.window();
        // the window's extent clipped to the padded input, as the kernel counts it
        let extent = |o: usize, k: usize, s: usize, p: usize, n: usize| {
            let start = (o * s) as isize - p as isize;
            let end = (start + k as isize).min((n + p) as isize);
            (end - start) as f64
        };
        let sizes: Vec<f64> = (0..oh)
            .flat_map(|i| {
                (0..ow).map(move |j| {
                    extent(i, win.kernel.0, win.stride.0, win.padding.0, h)
                        * extent(j, win.kernel.1, win.stride.1, win.padding.1, w)
                })
            })
            .collect();
        let dev = self.device();
        if int {
            let sizes = Tensor::from_vec(sizes, [oh, ow], &dev)?;
            // exact sums, then PyTorch's integer division (truncated toward zero)
            let sums = mean.mul(&sizes)?.round()?;
            return sums.div(div as f64)?.trunc()?.to_dtype(self.dtype());
        }
        let factor: Vec<f64> = sizes.iter().map(|s| s / div as f64).collect();
        let factor = Tensor::from_vec(factor, [oh, ow], &dev)?.to_dtype(work)?;
        mean.mul(&factor)?.to_dtype(self.dtype())
    }

    fn pool2d_check_dtype(&self, op: &'static str) -> Result<()> {
        if self.dtype() != DType::I64 {
            return Err(super::elementwise::not_implemented_for(
                op,
                op,
                self.dtype(),
            ));
        }
        Ok(())
    }
}

/// Window of a 2-D pooling: kernel, stride (defaults to the kernel), padding,
/// dilation (max pooling only), ceil mode, `count_include_pad` (average only,
/// default true as in PyTorch) and `divisor_override` (average only: each
/// window's sum is divided by it instead of the window's size).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool2dOptions {
    pub kernel: (usize, usize),
    pub stride: Option<(usize, usize)>,
    pub padding: (usize, usize),
    pub dilation: (usize, usize),
    pub ceil_mode: bool,
    pub count_include_pad: bool,
    pub divisor_override: Option<usize>,
}

impl Pool2dOptions {
    /// A square `k × k` window with stride `k`.
    pub fn new(k: usize) -> Self {
        Pool2dOptions::rect(k, k)
    }
    /// A `kh × kw` window with stride equal to the window.
    pub fn rect(kh: usize, kw: usize) -> Self {
        Pool2dOptions {
            kernel: (kh, kw),
            stride: None,
            padding: (0, 0),
            dilation: (1, 1),
            ceil_mode: false,
            count_include_pad: true,
            divisor_override: None,
        }
    }
    pub fn stride(mut self, s: usize) -> Self {
        self.stride = Some((s, s));
        self
    }
    pub fn padding(mut self, p: usize) -> Self {
        self.padding = (p, p);
        self
    }
    pub fn dilation(mut self, d: usize) -> Self {
        self.dilation = (d, d);
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
    /// Average pooling divides each window's sum by `d` (`divisor_override`; 0
    /// is refused, as in PyTorch).
    ///
    /// ```
    /// # use ember::{DType, Device, Pool2dOptions, Tensor};
    /// let x = Tensor::ones([1, 1, 4, 4], DType::F32, &Device::Cpu)?;
    /// let y = x.avg_pool2d(Pool2dOptions::new(2).divisor_override(3))?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![4.0 / 3.0; 4]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn divisor_override(mut self, d: usize) -> Self {
        self.divisor_override = Some(d);
        self
    }
    fn window(&self) -> Window {
        Window {
            kernel: self.kernel,
            stride: self.stride.unwrap_or(self.kernel),
            padding: self.padding,
            dilation: self.dilation,
        }
    }
}
