//! `conv2d`: validation, shapes and the gradient's bookkeeping; each device's
//! backend computes.

use super::{Storages, Tensor};
use crate::backend::op::{ConvShape, Window};
use crate::backend::Storage;
use crate::layout::{checked_numel, MemoryFormat};
use crate::{
    dtype::DType,
    error::{Error, Result},
};

/// The input and weight gradients of a convolution, each where it is needed.
pub(crate) type ConvGrads = (Option<Tensor>, Option<Tensor>);

impl Tensor {
    /// Records `out` as `conv2d(self, weight, bias)` (every device's path shares
    /// this). At backward time `grads` gets the output gradient and which of the
    /// input and weight gradients are needed, and returns those (in the dtype it
    /// computed in) with the operands' numbers of elements; they are given the
    /// operands' shapes and dtypes here, and the bias gradient is the output
    /// gradient summed over batch and positions.
    fn record_conv2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        out: Tensor,
        grads: impl Fn(&Tensor, (bool, bool)) -> Result<ConvGrads> + Send + Sync + 'static,
    ) -> Tensor {
        let mut inputs = vec![self, weight];
        inputs.extend(bias);
        Tensor::record_twice(out, "conv2d", &inputs, |_| {
            let (xshape, xdt) = (self.shape().to_vec(), self.dtype());
            let (wshape, wdt) = (weight.shape().to_vec(), weight.dtype());
            let need = (self.requires_grad(), weight.requires_grad());
            let bias_grad = bias.map(|b| b.requires_grad());
            move |gy: &Tensor| {
                let (gx, gw) = grads(gy, need)?;
                let back = |g: Option<Tensor>, shape: &[usize], dt: DType| {
                    g.map(|g| g.reshape(shape)?.to_dtype(dt)).transpose()
                };
                let mut out = vec![back(gx, &xshape, xdt)?, back(gw, &wshape, wdt)?];
                if let Some(needed) = bias_grad {
                    out.push(needed.then(|| gy.sum([0, 2, 3], false)).transpose()?);
                }
                Ok(out)
            }
        })
    }

    /// 2-D convolution with `padding="same"` (`F.conv2d(x, w, padding="same")`):
    /// stride 1, and the output keeps the input's height and width. Where the
    /// padding a dim needs is odd, the extra row or column goes after the input
    /// (bottom, right), as in PyTorch.
    pub fn conv2d_same(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        dilation: (usize, usize),
        groups: usize,
    ) -> Result<Tensor> {
        if weight.rank() != 4 {
            return Err(Error::invalid(
                "conv2d",
                format!("expected a 4-D weight, got {:?}", weight.shape()),
            ));
        }
        let (kh, kw) = (weight.shape()[2], weight.shape()[3]);
        let total = (
            dilation.0 * kh.saturating_sub(1),
            dilation.1 * kw.saturating_sub(1),
        );
        let (ph, pw) = (total.0 / 2, total.1 / 2);
        let extra = (total.0 - 2 * ph, total.1 - 2 * pw);
        let x = if extra != (0, 0) {
            self.pad(
                &[0, extra.1 as i64, 0, extra.0 as i64],
                super::PadMode::Constant(0.0),
            )?
        } else {
            self.clone()
        };
        let opts = Conv2dOptions {
            stride: (1, 1),
            padding: (ph, pw),
            dilation,
            groups,
        };
        x.conv2d(weight, bias, opts)
    }

    /// [`conv2d_same`](Self::conv2d_same) with the stride, dilation and groups of
    /// `opts` (`F.conv2d(x, w, b, stride, padding="same", dilation, groups)`; the
    /// padding of `opts` is not used): a stride other than 1 is refused, as
    /// PyTorch refuses it.
    ///
    /// ```
    /// # use ember::{Conv2dOptions, DType, Device, Tensor};
    /// let dev = Device::Cpu;
    /// let x = Tensor::ones([1, 2, 5, 5], DType::F32, &dev)?;
    /// let w = Tensor::ones([3, 2, 3, 3], DType::F32, &dev)?;
    /// let y = x.conv2d_same_opts(&w, None, Conv2dOptions::default())?;
    /// assert_eq!(y.shape(), &[1, 3, 5, 5]);
    /// assert!(x.conv2d_same_opts(&w, None, Conv2dOptions::default().stride(2)).is_err());
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn conv2d_same_opts(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: Conv2dOptions,
    ) -> Result<Tensor> {
        if opts.stride != (1, 1) {
            return Err(Error::invalid(
                "conv2d",
                "padding='same' is not supported for strided convolutions",
            ));
        }
        self.conv2d_same(weight, bias, opts.dilation, opts.groups)
    }

    /// 2-D convolution (`F.conv2d`): input `[N, C, H, W]` (or `[C, H, W]`), weight
    /// `[O, C / groups, kH, kW]`, optional bias `[O]`.
    pub fn conv2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: Conv2dOptions,
    ) -> Result<Tensor> {
        const OP: &str = "conv2d";
        let mut ts = vec![self, weight];
        ts.extend(bias);
        if let Some(c) = crate::tensor::autocast::lower(&ts)? {
            return c[0].conv2d(&c[1], c.get(2), opts);
        }
        check_operands(OP, &ts)?;
        if self.rank() == 3 {
            return self.unsqueeze(0)?.conv2d(weight, bias, opts)?.squeeze(0);
        }
        let plan = Plan::new(self, weight, bias, opts)?;
        let ConvShape { n, o, oh, ow, .. } = plan.shape;
        let ng = crate::autograd::no_grad_guard();
        // kept for backward in their own dtype (a half-precision input costs half
        // the memory of its float32 copy, which lives only while it is used)
        let nhwc = plan.paths.nhwc;
        let (xk, wk) = (self.in_order(nhwc)?, weight.in_order(nhwc)?);
        let forward = |work: DType, cl: bool| -> Result<Tensor> {
            let (x, wt) = (
                xk.to_dtype(work)?.in_order(cl)?,
                wk.to_dtype(work)?.in_order(cl)?,
            );
            let b = bias.map(|b| b.to_dtype(work)?.contiguous()).transpose()?;
            let mut ts = vec![&x, &wt];
            ts.extend(&b);
            let st = Storages::read(&ts);
            let b = b.as_ref().map(|b| (st.get(2), b.layout()));
            let s = ConvShape {
                nhwc: cl,
                ..plan.shape
            };
            let y = st
                .get(0)
                .conv2d(x.layout(), (st.get(1), wt.layout()), b, &s)?;
            Ok(Tensor::from_storage_in(y, &[n, o, oh, ow], cl))
        };
        let y = plan.paths.run("forward", forward)?;
        let out = y.to_dtype(plan.paths.dtype)?.laid_out(plan.format)?;
        drop(ng);
        // both are saved, as PyTorch's convolution saves its input and weight
        let (x, wt) = (xk.save_as(self), wk.save_as(weight));
        Ok(self.record_conv2d(weight, bias, out, move |gy, need| {
            if crate::autograd::creating_graph() {
                // a walk that creates a graph: the gradients in recorded ops
                let (x, wt) = (x.value()?, wt.value()?);
                return conv2d_grads_recorded(&x, &wt, gy, opts, need);
            }
            plan.backward(x.get()?, wt.get()?, gy, need)
        }))
    }
}

/// How one convolution runs: its shapes, the paths its passes may take and the
/// memory formats of the results.
#[derive(Clone, Copy)]
struct Plan {
    shape: ConvShape,
    paths: Paths,
    /// The output's and the input gradient's format.
    format: MemoryFormat,
    /// The weight gradient's format (the weight's own).
    wformat: MemoryFormat,
    /// The weight's in-channels per group.
    cg: usize,
}

impl Plan {
    /// PyTorch's checks of a batched convolution's operands, and how it runs.
    fn new(
        x: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: Conv2dOptions,
    ) -> Result<Plan> {
        const OP: &str = "conv2d";
        check_ranks(OP, x, weight)?;
        let [n, c, h, w] = [x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]];
        let [o, cg, kh, kw] = [
            weight.shape()[0],
            weight.shape()[1],
            weight.shape()[2],
            weight.shape()[3],
        ];
        let g = opts.groups;
        if g == 0 || c % g != 0 || o % g != 0 || cg * g != c {
            return Err(Error::shape(
                OP,
                x.shape(),
                weight.shape(),
                format!("expected input with {} channels (weight's in-channels × groups = {cg} × {g}) and out-channels divisible by groups", cg * g),
            ));
        }
        check_bias(OP, bias, o)?;
        check_stride_dilation(OP, opts.stride, opts.dilation)?;
        let win = Window {
            kernel: (kh, kw),
            stride: opts.stride,
            padding: opts.padding,
            dilation: opts.dilation,
        };
        let out_hw =
            Window::out_size(h, kh, win.stride.0, win.padding.0, win.dilation.0, false).zip(
                Window::out_size(w, kw, win.stride.1, win.padding.1, win.dilation.1, false),
            );
        let Some((oh, ow)) = out_hw else {
            return Err(Error::shape(
                OP,
                x.shape(),
                weight.shape(),
                "kernel size (with dilation) can't be greater than the padded input size",
            ));
        };
        // the output, and one sample's im2col columns
        checked_numel(OP, &[n, o, oh, ow])?;
        checked_numel(OP, &[c / g * kh * kw, oh * ow])?;
        let shape = ConvShape {
            n,
            c,
            h,
            w,
            o,
            groups: g,
            oh,
            ow,
            win,
            nhwc: false,
        };
        // channels-last when the input or the weight is, as PyTorch's convolutions
        // (its CUDA convolutions keep float64 row-major)
        let format = conv_memory_format(x, weight);
        let wformat = weight.suggest_memory_format();
        // f16/bf16 convolve in their own dtype where the device can (cuDNN's half
        // kernels, float32 accumulation), otherwise in f32
        let dtype = x.dtype();
        let half = matches!(dtype, DType::F16 | DType::BF16);
        let native = half && weight.read().conv_takes_half(&shape);
        // channels-last operands are convolved as they lie where the device can
        // (cuDNN's NHWC kernels); elsewhere row-major, the result laid out again
        let nhwc = format == MemoryFormat::ChannelsLast
            && (!half || native)
            && weight.read().conv_takes_channels_last(&ConvShape {
                nhwc: true,
                ..shape
            });
        let paths = Paths {
            dtype,
            half,
            native,
            nhwc,
        };
        Ok(Plan {
            shape,
            paths,
            format,
            wformat,
            cg,
        })
    }

    /// The input and weight gradients, as `need` asks, for the output gradient
    /// `gy` (in the dtype they were computed in). `x` is read only for the
    /// weight's gradient.
    fn backward(
        &self,
        x: &Tensor,
        wt: &Tensor,
        gy: &Tensor,
        need: (bool, bool),
    ) -> Result<ConvGrads> {
        let ConvShape {
            n, c, h, w, o, win, ..
        } = self.shape;
        let (kh, kw) = win.kernel;
        let pass = |work: DType, cl: bool| -> Result<ConvGrads> {
            let wt = wt.to_dtype(work)?.in_order(cl)?;
            // the input's values only where the weight's gradient reads them;
            // otherwise the weight stands in for its storage (not read)
            let x = match need.1 {
                true => x.to_dtype(work)?.in_order(cl)?,
                false => wt.clone(),
            };
            let gc = gy.to_dtype(work)?.in_order(cl)?;
            let st = Storages::read(&[&x, &wt, &gc]);
            let (gx, gw) = st.get(0).conv2d_backward(
                x.layout(),
                (st.get(1), wt.layout()),
                (st.get(2), gc.layout()),
                &ConvShape {
                    nhwc: cl,
                    ..self.shape
                },
                need,
            )?;
            Ok((
                gx.map(|s| Tensor::from_storage_in(s, &[n, c, h, w], cl).laid_out(self.format))
                    .transpose()?,
                // in the weight's own format, whichever order the pass ran in
                gw.map(|s| {
                    Tensor::from_storage_in(s, &[o, self.cg, kh, kw], cl).laid_out(self.wformat)
                })
                .transpose()?,
            ))
        };
        self.paths.run("backward", pass)
    }
}

/// The input and weight gradients of the batched `x.conv2d(w, None, opts)` for
/// the output gradient `gy`, as `need` asks, by the paths the convolution's own
/// backward takes (no recording; in the dtype they were computed in: float32 for
/// half types a device convolves in float32). `x`'s values are read only for
/// the weight's gradient: for the input's alone, any tensor of its shape, dtype
/// and device will do (an expanded scalar), though its memory format still
/// chooses the input gradient's, as `x`'s would.
pub(crate) fn conv2d_grads(
    x: &Tensor,
    w: &Tensor,
    gy: &Tensor,
    opts: Conv2dOptions,
    need: (bool, bool),
) -> Result<ConvGrads> {
    let _ng = crate::autograd::no_grad_guard();
    Plan::new(x, w, None, opts)?.backward(x, w, gy, need)
}

/// Which paths a convolution's passes may take, most wanted first: channels-last
/// operands as they lie (`nhwc`: the device takes them), f16/bf16 in their own
/// dtype (`native`), else row-major and (for half types) in float32.
#[derive(Clone, Copy)]
struct Paths {
    dtype: DType,
    half: bool,
    native: bool,
    nhwc: bool,
}

impl Paths {
    /// `pass(work dtype, channels-last)` on the first path that runs, each
    /// refusal logged (`EMBER_CUDNN_LOG`) before the next is tried.
    fn run<T>(self, name: &str, pass: impl Fn(DType, bool) -> Result<T>) -> Result<T> {
        let Paths {
            dtype,
            half,
            native,
            nhwc,
        } = self;
        let in_order = |cl: bool| match (half, native) {
            (false, _) => pass(dtype, cl),
            (true, false) => pass(DType::F32, false),
            (true, true) => pass(dtype, cl).or_else(|e| {
                Storage::log_conv_fallback(name, dtype, &e, "computed in float32");
                pass(DType::F32, false)
            }),
        };
        match nhwc {
            true => in_order(true).or_else(|e| {
                Storage::log_conv_fallback(name, dtype, &e, "computed row-major");
                in_order(false)
            }),
            false => in_order(false),
        }
    }
}

/// The memory format of a convolution's output and input gradient: PyTorch's
/// choice, channels-last where the input or the weight suggests it, except for
/// float64 on a GPU (cuDNN has no NHWC float64 kernels, so PyTorch keeps those
/// row-major).
fn conv_memory_format(x: &Tensor, weight: &Tensor) -> MemoryFormat {
    let cl = MemoryFormat::ChannelsLast;
    if x.device().is_cuda() && (x.dtype() == DType::F64 || weight.dtype() == DType::F64) {
        return MemoryFormat::Contiguous;
    }
    if x.suggest_memory_format() == cl || weight.suggest_memory_format() == cl {
        cl
    } else {
        MemoryFormat::Contiguous
    }
}

/// Stride, padding, dilation and groups of a convolution (PyTorch's defaults:
/// 1, 0, 1, 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dOptions {
    pub stride: (usize, usize),
    pub padding: (usize, usize),
    pub dilation: (usize, usize),
    pub groups: usize,
}

impl Default for Conv2dOptions {
    fn default() -> Self {
        Conv2dOptions {
            stride: (1, 1),
            padding: (0, 0),
            dilation: (1, 1),
            groups: 1,
        }
    }
}

impl Conv2dOptions {
    /// The same stride along both axes.
    pub fn stride(mut self, s: usize) -> Self {
        self.stride = (s, s);
        self
    }
    /// The same zero padding on both axes.
    pub fn padding(mut self, p: usize) -> Self {
        self.padding = (p, p);
        self
    }
    /// The same dilation on both axes.
    pub fn dilation(mut self, d: usize) -> Self {
        self.dilation = (d, d);
        self
    }
    /// Channel groups (`groups = C` is a depthwise convolution).
    pub fn groups(mut self, g: usize) -> Self {
        self.groups = g;
        self
    }
}

/// The checks of a convolution's operands (`[input, weight, bias?]`) that
/// come before their shapes: one device, one dtype, and that a floating-point
/// one.
pub(super) fn check_operands(op: &'static str, ts: &[&Tensor]) -> Result<()> {
    super::same_device(op, ts)?;
    let dtype = ts[0].dtype();
    for t in &ts[1..] {
        if t.dtype() != dtype {
            return Err(Error::DTypeMismatch {
                op,
                lhs: dtype,
                rhs: t.dtype(),
            });
        }
    }
    if !dtype.is_float() {
        return Err(Error::dtype(
            op,
            dtype,
            "convolution needs a floating-point input",
        ));
    }
    Ok(())
}

/// Refuses an input that is not batched `[N, C, H, W]` (a lone sample has
/// been given its batch dim by now) or a weight that is not 4-D.
pub(super) fn check_ranks(op: &'static str, x: &Tensor, weight: &Tensor) -> Result<()> {
    if x.rank() != 4 || weight.rank() != 4 {
        return Err(Error::shape(
            op,
            x.shape(),
            weight.shape(),
            "expected a 3-D or 4-D input and a 4-D weight",
        ));
    }
    Ok(())
}

/// Refuses a bias that is not one value per output channel (`out` of them).
pub(super) fn check_bias(op: &'static str, bias: Option<&Tensor>, out: usize) -> Result<()> {
    if let Some(b) = bias {
        if b.shape() != [out] {
            return Err(Error::shape(
                op,
                b.shape(),
                &[out],
                "bias must have one value per output channel",
            ));
        }
    }
    Ok(())
}

/// Refuses a zero stride or dilation.
pub(super) fn check_stride_dilation(
    op: &'static str,
    stride: (usize, usize),
    dilation: (usize, usize),
) -> Result<()> {
    if stride.0 == 0 || stride.1 == 0 || dilation.0 == 0 || dilation.1 == 0 {
        return Err(Error::invalid(
            op,
            "stride and dilation must be greater than zero",
        ));
    }
    Ok(())
}

/// The input and weight gradients of `conv2d(x, w)` for the output gradient
/// `gy` in recorded ops, so that they are differentiable again (the rule a walk
/// that creates a graph runs): the input's is the transposed convolution of
/// `gy`, the weight's [`conv2d_weight_grad_recorded`].
pub(crate) fn conv2d_grads_recorded(
    x: &Tensor,
    w: &Tensor,
    gy: &Tensor,
    opts: Conv2dOptions,
    need: (bool, bool),
) -> Result<ConvGrads> {
    let gx = need
        .0
        .then(|| {
            // the output padding that gives back the input's height and width
            let pad = |d: usize| -> usize {
                let (s, p, dil) = match d {
                    0 => (opts.stride.0, opts.padding.0, opts.dilation.0),
                    _ => (opts.stride.1, opts.padding.1, opts.dilation.1),
                };
                let (size, k, out) = (x.shape()[2 + d], w.shape()[2 + d], gy.shape()[2 + d]);
                size + 2 * p - ((out - 1) * s + dil * (k - 1) + 1)
            };
            let t = crate::tensor::ConvTranspose2dOptions {
                stride: opts.stride,
                padding: opts.padding,
                output_padding: (pad(0), pad(1)),
                dilation: opts.dilation,
                groups: opts.groups,
            };
            gy.conv_transpose2d(w, None, t)
        })
        .transpose()?;
    let kernel = (w.shape()[2], w.shape()[3]);
    let gw = need
        .1
        .then(|| conv2d_weight_grad_recorded(x, gy, kernel, opts))
        .transpose()?;
    Ok((gx, gw))
}

/// The weight gradient of `conv2d(x, w)` (a `kernel`-sized `w`) for the output
/// gradient `gy`, in recorded ops: per group, the convolution of the input's
/// channels (the batch as their channels) with the output gradient's as the
/// kernel, stride and dilation swapped, cut to the kernel's size.
pub(crate) fn conv2d_weight_grad_recorded(
    x: &Tensor,
    gy: &Tensor,
    kernel: (usize, usize),
    opts: Conv2dOptions,
) -> Result<Tensor> {
    let g = opts.groups;
    let (cg, og) = (x.shape()[1] / g, gy.shape()[1] / g);
    let swapped = Conv2dOptions {
        stride: opts.dilation,
        padding: opts.padding,
        dilation: opts.stride,
        groups: 1,
    };
    let mut parts = Vec::with_capacity(g);
    for i in 0..g {
        let xi = x.narrow(1, (i * cg) as i64, cg)?.transpose(0, 1)?;
        let gi = gy.narrow(1, (i * og) as i64, og)?.transpose(0, 1)?;
        let r = xi.conv2d(&gi, None, swapped)?;
        let r = r.narrow(2, 0, kernel.0)?.narrow(3, 0, kernel.1)?;
        parts.push(r.transpose(0, 1)?);
    }
    let parts: Vec<&Tensor> = parts.iter().collect();
    match parts.len() {
        1 => Ok(parts[0].clone()),
        _ => Tensor::cat(&parts, 0),
    }
}
