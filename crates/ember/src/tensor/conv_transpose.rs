//! `conv_transpose2d`: the input gradient of a convolution, run forward. No
//! convolution of its own: the forward is the `conv2d_backward` primitive asked
//! for the input's gradient alone, the input's gradient a `conv2d`, and the
//! weight's gradient `conv2d_backward` asked for the weight's.

use super::conv::{check_bias, check_operands, check_ranks, check_stride_dilation};
use super::{Storages, Tensor};
use crate::backend::op::{ConvShape, Window};
use crate::backend::Storage;
use crate::layout::{checked_numel, MemoryFormat};
use crate::{
    dtype::DType,
    error::{Error, Result},
};

/// Stride, padding, output padding, dilation and groups of a transposed
/// convolution (PyTorch's defaults: 1, 0, 0, 1, 1). `padding` takes
/// `dilation · (kernel - 1) - padding` zeros off each side of the full
/// output; `output_padding` adds rows and columns at the bottom and right
/// (it must be smaller than the stride or the dilation, as in PyTorch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvTranspose2dOptions {
    pub stride: (usize, usize),
    pub padding: (usize, usize),
    pub output_padding: (usize, usize),
    pub dilation: (usize, usize),
    pub groups: usize,
}

impl Default for ConvTranspose2dOptions {
    fn default() -> Self {
        ConvTranspose2dOptions {
            stride: (1, 1),
            padding: (0, 0),
            output_padding: (0, 0),
            dilation: (1, 1),
            groups: 1,
        }
    }
}

impl ConvTranspose2dOptions {
    /// The same stride along both axes.
    pub fn stride(mut self, s: usize) -> Self {
        self.stride = (s, s);
        self
    }
    /// The same padding on both axes.
    pub fn padding(mut self, p: usize) -> Self {
        self.padding = (p, p);
        self
    }
    /// The same output padding on both axes.
    pub fn output_padding(mut self, p: usize) -> Self {
        self.output_padding = (p, p);
        self
    }
    /// The same dilation on both axes.
    pub fn dilation(mut self, d: usize) -> Self {
        self.dilation = (d, d);
        self
    }
    /// Channel groups.
    pub fn groups(mut self, g: usize) -> Self {
        self.groups = g;
        self
    }
}

/// The output size of a transposed convolution along one axis, PyTorch's
/// `(in - 1)·stride - 2·padding + dilation·(kernel - 1) + output_padding + 1`,
/// as a signed number (PyTorch's error prints a negative one).
fn transposed_size(input: usize, k: usize, s: usize, p: usize, d: usize, op: usize) -> i128 {
    let [input, k, s, p, d, op] = [input, k, s, p, d, op].map(|v| v as i128);
    (input - 1) * s - 2 * p + d * (k - 1) + op + 1
}

impl Tensor {
    /// 2-D transposed convolution (`F.conv_transpose2d`): input `[N, C_in, H, W]`
    /// (or `[C_in, H, W]`), weight `[C_in, C_out / groups, kH, kW]` (PyTorch's
    /// layout), optional bias `[C_out]`. The output is `[N, C_out, H_out, W_out]`
    /// with `H_out = (H - 1)·stride - 2·padding + dilation·(kH - 1) +
    /// output_padding + 1`. It is the gradient of `conv2d` with this weight
    /// with respect to its input, computed by the convolution's own backward
    /// (cuDNN's backward-data pass on a GPU), and its gradients are the
    /// convolution's forward and weight gradient.
    ///
    /// ```
    /// # use ember::{DType, Device, Tensor};
    /// # use ember::nn::ConvTranspose2dOptions;
    /// let x = Tensor::ones([1, 2, 3, 3], DType::F32, &Device::Cpu)?;
    /// let w = Tensor::ones([2, 4, 3, 3], DType::F32, &Device::Cpu)?;
    /// let opts = ConvTranspose2dOptions::default().stride(2).padding(1).output_padding(1);
    /// assert_eq!(x.conv_transpose2d(&w, None, opts)?.shape(), &[1, 4, 6, 6]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn conv_transpose2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: ConvTranspose2dOptions,
    ) -> Result<Tensor> {
        const OP: &str = "conv_transpose2d";
        let mut ts = vec![self, weight];
        ts.extend(bias);
        if let Some(c) = crate::tensor::autocast::lower(&ts)? {
            return c[0].conv_transpose2d(&c[1], c.get(2), opts);
        }
        check_operands(OP, &ts)?;
        if self.rank() == 3 && weight.rank() == 4 {
            return self
                .unsqueeze(0)?
                .conv_transpose2d(weight, bias, opts)?
                .squeeze(0);
        }
        check_ranks(OP, self, weight)?;
        let [n, cin, h, w] = [0, 1, 2, 3].map(|d| self.shape()[d]);
        let [wi, og, kh, kw] = [0, 1, 2, 3].map(|d| weight.shape()[d]);
        let g = opts.groups;
        if g == 0 {
            return Err(Error::invalid(OP, "non-positive groups is not supported"));
        }
        if wi == 0 {
            return Err(Error::shape(
                OP,
                self.shape(),
                weight.shape(),
                format!(
                    "Given groups={g}, expected weight to be at least {g} at dimension 0, but got weight of size {:?} instead",
                    weight.shape()
                ),
            ));
        }
        if weight.numel() == 0 {
            return Err(Error::shape(
                OP,
                self.shape(),
                weight.shape(),
                format!(
                    "non-empty 2D or 4D weight tensor expected, but got: {:?}",
                    weight.shape()
                ),
            ));
        }
        if !wi.is_multiple_of(g) {
            return Err(Error::shape(
                OP,
                self.shape(),
                weight.shape(),
                format!(
                    "Given groups={g}, expected weight to be divisible by {g} at dimension 0, but got weight of size {:?} instead",
                    weight.shape()
                ),
            ));
        }
        if wi != cin {
            return Err(Error::shape(
                OP,
                self.shape(),
                weight.shape(),
                format!(
                    "Given transposed=1, weight of size {:?}, expected input{:?} to have {wi} channels, but got {cin} channels instead",
                    weight.shape(),
                    self.shape()
                ),
            ));
        }
        let cout = og * g;
        check_bias(OP, bias, cout)?;
        let (s, p, d, op) = (
            opts.stride,
            opts.padding,
            opts.dilation,
            opts.output_padding,
        );
        check_stride_dilation(OP, s, d)?;
        if (op.0 >= s.0 && op.0 >= d.0) || (op.1 >= s.1 && op.1 >= d.1) {
            return Err(Error::invalid(
                OP,
                format!(
                    "output padding must be smaller than either stride or dilation, but got output_padding_height: {} output_padding_width: {} stride_height: {} stride_width: {} dilation_height: {} dilation_width: {}",
                    op.0, op.1, s.0, s.1, d.0, d.1
                ),
            ));
        }
        if kh == 0 || kw == 0 {
            return Err(Error::shape(
                OP,
                self.shape(),
                weight.shape(),
                "the kernel can't be empty",
            ));
        }
        let out = (
            transposed_size(h, kh, s.0, p.0, d.0, op.0),
            transposed_size(w, kw, s.1, p.1, d.1, op.1),
        );
        if h == 0 || w == 0 || out.0 < 1 || out.1 < 1 {
            return Err(Error::shape(
                OP,
                self.shape(),
                weight.shape(),
                format!(
                    "Given input size per channel: ({h} x {w}). Calculated output size per channel: ({} x {}). Output size is too small",
                    out.0, out.1
                ),
            ));
        }
        let (ho, wo) = (out.0 as usize, out.1 as usize);
        checked_numel(OP, &[n, cout, ho, wo])?;
        // the convolution whose input gradient this is: its input is the output
        // here, its output this input (an output padding at least the stride
        // gives that convolution more output rows than the input has: the input
        // is padded with zeros to them, which add nothing)
        let win = Window {
            kernel: (kh, kw),
            stride: s,
            padding: p,
            dilation: d,
        };
        let conv_out = Window::out_size(ho, kh, s.0, p.0, d.0, false)
            .zip(Window::out_size(wo, kw, s.1, p.1, d.1, false));
        let Some((ch, cw)) = conv_out.filter(|&(a, b)| a >= h && b >= w) else {
            return Err(Error::shape(
                OP,
                self.shape(),
                weight.shape(),
                "the output size does not fit the convolution",
            ));
        };
        if (ch, cw) != (h, w) {
            let pad = [0, (cw - w) as i64, 0, (ch - h) as i64];
            let x = self.pad(&pad, super::PadMode::Constant(0.0))?;
            return x.transposed_conv(weight, bias, opts, (ho, wo));
        }
        let shape = ConvShape {
            n,
            c: cout,
            h: ho,
            w: wo,
            o: cin,
            groups: g,
            oh: h,
            ow: w,
            win,
            nhwc: false,
        };
        checked_numel(OP, &[cout / g * kh * kw, h * w])?;
        self.transposed_conv_of(weight, bias, shape)
    }

    /// [`conv_transpose2d`](Self::conv_transpose2d) of an input already padded
    /// to the convolution's output size (`out`: the transposed output's).
    fn transposed_conv(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: ConvTranspose2dOptions,
        (ho, wo): (usize, usize),
    ) -> Result<Tensor> {
        let [n, cin, h, w] = [0, 1, 2, 3].map(|d| self.shape()[d]);
        let [_, og, kh, kw] = [0, 1, 2, 3].map(|d| weight.shape()[d]);
        let shape = ConvShape {
            n,
            c: og * opts.groups,
            h: ho,
            w: wo,
            o: cin,
            groups: opts.groups,
            oh: h,
            ow: w,
            win: Window {
                kernel: (kh, kw),
                stride: opts.stride,
                padding: opts.padding,
                dilation: opts.dilation,
            },
            nhwc: false,
        };
        self.transposed_conv_of(weight, bias, shape)
    }

    /// The transposed convolution of checked operands: `shape` is the
    /// convolution whose input gradient it is (its `[n, o, oh, ow]` output is
    /// this input, its `[n, c, h, w]` input the result).
    fn transposed_conv_of(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        shape: ConvShape,
    ) -> Result<Tensor> {
        let dtype = self.dtype();
        let (n, c, h, w) = (shape.n, shape.c, shape.h, shape.w);
        if self.numel() == 0 || n * c * h * w == 0 {
            return self.empty_transposed_conv(weight, bias, [n, c, h, w]);
        }
        let [wi, og, kh, kw] = [0, 1, 2, 3].map(|d| weight.shape()[d]);
        // channels-last where the input or the weight is, as PyTorch's (float64
        // on a GPU stays row-major); computed row-major and laid out again
        let cl = MemoryFormat::ChannelsLast;
        let format = if (self.device().is_cuda() && dtype == DType::F64)
            || (self.suggest_memory_format() != cl && weight.suggest_memory_format() != cl)
        {
            MemoryFormat::Contiguous
        } else {
            cl
        };
        let wformat = weight.suggest_memory_format();
        let native =
            matches!(dtype, DType::F16 | DType::BF16) && self.read().conv_takes_half(&shape);
        let ng = crate::autograd::no_grad_guard();
        let forward = |work: DType| -> Result<Tensor> {
            let x = self.to_dtype(work)?.contiguous()?;
            let wt = weight.to_dtype(work)?.contiguous()?;
            let st = Storages::read(&[&x, &wt]);
            // (the convolution's input is not read for its input gradient: the
            // weight stands for it)
            let (y, _) = st.get(1).conv2d_backward(
                wt.layout(),
                (st.get(1), wt.layout()),
                (st.get(0), x.layout()),
                &shape,
                (true, false),
            )?;
            let y = Tensor::from_storage(
                y.ok_or_else(|| missing("the input gradient"))?,
                &[n, c, h, w],
            );
            match bias {
                Some(b) => y.add(&b.to_dtype(work)?.reshape([1, c, 1, 1])?),
                None => Ok(y),
            }
        };
        let y = in_work_dtype("forward", dtype, native, forward)?;
        let out = y.to_dtype(dtype)?.laid_out(format)?;
        drop(ng);
        let mut inputs = vec![self, weight];
        inputs.extend(bias);
        let (x, wt) = (self.save(), weight.save());
        let (xshape, wshape) = (self.shape().to_vec(), weight.shape().to_vec());
        let need = (self.requires_grad(), weight.requires_grad());
        let bias_grad = bias.map(|b| b.requires_grad());
        let opts = crate::tensor::Conv2dOptions {
            stride: shape.win.stride,
            padding: shape.win.padding,
            dilation: shape.win.dilation,
            groups: shape.groups,
        };
        Ok(Tensor::record_twice(
            out,
            "conv_transpose2d",
            &inputs,
            |_| {
                move |gy: &Tensor| {
                    let (gx, gw) = if crate::autograd::creating_graph() {
                        // a walk that creates a graph: the gradients in recorded
                        // ops (the input's is a convolution of the output's)
                        let (x, wt) = (x.value()?, wt.value()?);
                        let gx = need.0.then(|| gy.conv2d(&wt, None, opts)).transpose()?;
                        let gw = need
                            .1
                            .then(|| {
                                super::conv::conv2d_weight_grad_recorded(gy, &x, (kh, kw), opts)
                            })
                            .transpose()?;
                        (gx, gw)
                    } else {
                        let (x, wt) = (x.get()?, wt.get()?);
                        // the input's gradient: the convolution of the output's gradient
                        let gx = match need.0 {
                            true => {
                                let gx = gy.conv2d(wt, None, opts)?;
                                if gx.shape() != xshape.as_slice() {
                                    return Err(Error::shape(
                                        "conv_transpose2d backward",
                                        gx.shape(),
                                        &xshape,
                                        "the input gradient's shape",
                                    ));
                                }
                                Some(gx)
                            }
                            false => None,
                        };
                        // the weight's: the convolution's weight gradient, with the
                        // output's gradient as its input and this input as its output's
                        let gw = match need.1 {
                            true => {
                                let weight_grad = |work: DType| -> Result<Tensor> {
                                    let g = gy.to_dtype(work)?.contiguous()?;
                                    let xw = x.to_dtype(work)?.contiguous()?;
                                    let ww = wt.to_dtype(work)?.contiguous()?;
                                    let st = Storages::read(&[&g, &ww, &xw]);
                                    let (_, gw) = st.get(0).conv2d_backward(
                                        g.layout(),
                                        (st.get(1), ww.layout()),
                                        (st.get(2), xw.layout()),
                                        &shape,
                                        (false, true),
                                    )?;
                                    let gw = gw.ok_or_else(|| missing("the weight gradient"))?;
                                    Ok(Tensor::from_storage(gw, &[wi, og, kh, kw]))
                                };
                                let gw = in_work_dtype("backward", dtype, native, weight_grad)?;
                                Some(
                                    gw.reshape(wshape.as_slice())?
                                        .to_dtype(dtype)?
                                        .laid_out(wformat)?,
                                )
                            }
                            false => None,
                        };
                        (gx, gw)
                    };
                    let mut grads = vec![gx, gw];
                    if let Some(needed) = bias_grad {
                        grads.push(needed.then(|| gy.sum([0, 2, 3], false)).transpose()?);
                    }
                    Ok(grads)
                }
            },
        ))
    }
}

impl Tensor {
    /// A transposed convolution with nothing to sum (an empty batch, no
    /// channels): the bias where the output has elements, zeros elsewhere;
    /// the weight's gradient is zero, the bias's the output's gradient summed
    /// per channel. No device is asked to convolve an empty operand.
    fn empty_transposed_conv(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        dims: [usize; 4],
    ) -> Result<Tensor> {
        let y = crate::autograd::no_grad(|| {
            let y = Tensor::zeros(dims, self.dtype(), &self.device())?;
            match bias {
                Some(b) => y.add(&b.reshape([1, dims[1], 1, 1])?),
                None => Ok(y),
            }
        })?;
        let mut inputs = vec![self, weight];
        inputs.extend(bias);
        let (dtype, device) = (self.dtype(), self.device());
        let (xshape, wshape) = (self.shape().to_vec(), weight.shape().to_vec());
        let need = (self.requires_grad(), weight.requires_grad());
        let bias_grad = bias.map(|b| b.requires_grad());
        Ok(Tensor::record_twice(y, "conv_transpose2d", &inputs, |_| {
            move |gy: &Tensor| {
                let zeros = |needed: bool, shape: &[usize]| {
                    needed
                        .then(|| Tensor::zeros(shape, dtype, &device))
                        .transpose()
                };
                let mut grads = vec![zeros(need.0, &xshape)?, zeros(need.1, &wshape)?];
                if let Some(needed) = bias_grad {
                    grads.push(needed.then(|| gy.sum([0, 2, 3], false)).transpose()?);
                }
                Ok(grads)
            }
        }))
    }
}

/// `pass` in the dtype it computes in: f32/f64 in their own; f16/bf16 in
/// theirs where the device convolves them (`native`: cuDNN's half kernels),
/// in float32 where it does not or refuses this shape (logged as the
/// convolution's fallbacks are).
fn in_work_dtype(
    name: &str,
    dtype: DType,
    native: bool,
    pass: impl Fn(DType) -> Result<Tensor>,
) -> Result<Tensor> {
    match (matches!(dtype, DType::F16 | DType::BF16), native) {
        (false, _) => pass(dtype),
        (true, false) => pass(DType::F32),
        (true, true) => pass(dtype).or_else(|e| {
            Storage::log_conv_fallback(name, dtype, &e, "computed in float32");
            pass(DType::F32)
        }),
    }
}

/// The error for a gradient the convolution's backward primitive was asked for
/// and did not return (a backend's defect, reported instead of a panic).
fn missing(what: &str) -> Error {
    Error::invalid(
        "conv_transpose2d",
        format!("the convolution's backward returned no {what}"),
    )
}
