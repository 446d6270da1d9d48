//! 3-D transposed convolution (`F.conv_transpose3d`) as a composite of 2-D
//! ones: each kernel-depth tap is a `conv_transpose2d` of every input depth
//! slice (depth folded into the batch), whose outputs land `stride` apart from
//! the tap's offset along the output's depth, added into the output. It runs
//! wherever `conv_transpose2d` runs. Autograd sees one op that keeps the input
//! and the weight, as PyTorch's does: the input's gradient is the 3-D
//! convolution of the output's, the weight's each tap's 2-D weight gradient.

use super::conv::{check_operands, conv2d_grads, conv2d_weight_grad_recorded, Conv2dOptions};
use super::conv3d::{bias_filled, check_rank_3d, list, record_conv3d, Conv3dOptions, Run};
use super::conv_transpose::ConvTranspose2dOptions;
use super::{PadMode, Tensor};
use crate::backend::op::Window;
use crate::error::{Error, Result};

/// Stride, padding, output padding, dilation (each `(depth, height, width)`)
/// and groups of a 3-D transposed convolution (PyTorch's defaults: 1, 0, 0,
/// 1, 1). `output_padding` adds positions at the end of each dim (it must be
/// smaller than the stride or the dilation, as in PyTorch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvTranspose3dOptions {
    pub stride: (usize, usize, usize),
    pub padding: (usize, usize, usize),
    pub output_padding: (usize, usize, usize),
    pub dilation: (usize, usize, usize),
    pub groups: usize,
}

impl Default for ConvTranspose3dOptions {
    fn default() -> Self {
        ConvTranspose3dOptions {
            stride: (1, 1, 1),
            padding: (0, 0, 0),
            output_padding: (0, 0, 0),
            dilation: (1, 1, 1),
            groups: 1,
        }
    }
}

impl ConvTranspose3dOptions {
    /// The same stride along the three axes.
    pub fn stride(mut self, s: usize) -> Self {
        self.stride = (s, s, s);
        self
    }
    /// The same padding on the three axes.
    pub fn padding(mut self, p: usize) -> Self {
        self.padding = (p, p, p);
        self
    }
    /// The same output padding on the three axes.
    pub fn output_padding(mut self, p: usize) -> Self {
        self.output_padding = (p, p, p);
        self
    }
    /// The same dilation on the three axes.
    pub fn dilation(mut self, d: usize) -> Self {
        self.dilation = (d, d, d);
        self
    }
    /// Channel groups.
    pub fn groups(mut self, g: usize) -> Self {
        self.groups = g;
        self
    }
}

/// PyTorch's checks of a 3-D transposed convolution (`x` batched by now), and
/// the output's `(depth, height, width)`.
fn check_conv_transpose3d(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    o: &ConvTranspose3dOptions,
) -> Result<[usize; 3]> {
    const OP: &str = "conv_transpose3d";
    let shape_err = |msg: String| Error::shape(OP, x.shape(), weight.shape(), msg);
    if weight.rank() != 5 {
        return Err(shape_err(format!(
            "expected a 5-D weight [in, out / groups, kD, kH, kW] for conv_transpose3d, but got weight of size {:?}",
            weight.shape()
        )));
    }
    let (cin, wi, og) = (x.shape()[1], weight.shape()[0], weight.shape()[1]);
    let g = o.groups;
    if g == 0 {
        return Err(Error::invalid(OP, "non-positive groups is not supported"));
    }
    if !wi.is_multiple_of(g) {
        return Err(shape_err(format!(
            "Given groups={g}, expected weight to be divisible by {g} at dimension 0, but got weight of size {:?} instead",
            weight.shape()
        )));
    }
    if wi != cin {
        return Err(shape_err(format!(
            "Given transposed=1, weight of size {:?}, expected input{:?} to have {wi} channels, but got {cin} channels instead",
            weight.shape(),
            x.shape()
        )));
    }
    let cout = og * g;
    if let Some(b) = bias {
        if b.shape() != [cout] {
            return Err(Error::shape(
                OP,
                b.shape(),
                &[cout],
                format!(
                    "Given transposed=1, weight of size {:?}, expected bias to be 1-dimensional with {cout} elements, but got bias of size {:?} instead",
                    weight.shape(),
                    b.shape()
                ),
            ));
        }
    }
    let (s, p, d, op) = (
        list(o.stride),
        list(o.padding),
        list(o.dilation),
        list(o.output_padding),
    );
    if s.contains(&0) {
        return Err(Error::invalid(OP, "non-positive stride is not supported"));
    }
    if d.contains(&0) {
        return Err(Error::invalid(
            OP,
            format!("dilation should be greater than zero, but got {d:?}"),
        ));
    }
    if (0..3).any(|i| op[i] >= s[i] && op[i] >= d[i]) {
        return Err(Error::invalid(
            OP,
            format!(
                "output padding must be smaller than either stride or dilation, but got output_padding_depth: {} output_padding_height: {} output_padding_width: {} stride_depth: {} stride_height: {} stride_width: {} dilation_depth: {} dilation_height: {} dilation_width: {}",
                op[0], op[1], op[2], s[0], s[1], s[2], d[0], d[1], d[2]
            ),
        ));
    }
    let input = [x.shape()[2], x.shape()[3], x.shape()[4]];
    let k = [weight.shape()[2], weight.shape()[3], weight.shape()[4]];
    let out: [i128; 3] = std::array::from_fn(|i| {
        let [n, k, s, p, d, op] = [input[i], k[i], s[i], p[i], d[i], op[i]].map(|v| v as i128);
        (n - 1) * s - 2 * p + d * (k - 1) + op + 1
    });
    if k.contains(&0) || input.contains(&0) || out.iter().any(|&n| n < 1) {
        return Err(shape_err(format!(
            "Given input size per channel: ({} x {} x {}). Calculated output size per channel: ({} x {} x {}). Output size is too small",
            input[0], input[1], input[2], out[0], out[1], out[2]
        )));
    }
    Ok(out.map(|n| n as usize))
}

impl Tensor {
    /// 3-D transposed convolution (`F.conv_transpose3d`): input `[N, C_in, D,
    /// H, W]` (or `[C_in, D, H, W]`), weight `[C_in, C_out / groups, kD, kH,
    /// kW]` (PyTorch's layout), optional bias `[C_out]`; each output size is
    /// `(in − 1)·stride − 2·padding + dilation·(k − 1) + output_padding + 1`.
    ///
    /// Built of 2-D transposed convolutions: for each of the kernel's `kD`
    /// depth taps, every input depth slice (depth folded into the batch) is
    /// transposed-convolved with that tap's kernel, and the results are laid
    /// `stride` apart from the tap's offset `tap · dilation` along the
    /// output's depth (cropped by the padding) and summed. For backward it
    /// keeps the input and the weight only, as PyTorch does; the input's
    /// gradient is [`conv3d`](Self::conv3d) of the output's.
    ///
    /// ```
    /// # use ember::{DType, Device, Tensor};
    /// # use ember::nn::ConvTranspose3dOptions;
    /// let x = Tensor::ones([1, 2, 3, 3, 3], DType::F32, &Device::Cpu)?;
    /// let w = Tensor::ones([2, 4, 3, 3, 3], DType::F32, &Device::Cpu)?;
    /// let opts = ConvTranspose3dOptions::default().stride(2).padding(1).output_padding(1);
    /// assert_eq!(x.conv_transpose3d(&w, None, opts)?.shape(), &[1, 4, 6, 6, 6]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn conv_transpose3d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: ConvTranspose3dOptions,
    ) -> Result<Tensor> {
        const OP: &str = "conv_transpose3d";
        let mut ts = vec![self, weight];
        ts.extend(bias);
        if let Some(c) = crate::tensor::autocast::lower(&ts)? {
            return c[0].conv_transpose3d(&c[1], c.get(2), opts);
        }
        check_operands(OP, &ts)?;
        check_rank_3d(OP, self, weight)?;
        if self.rank() == 4 {
            return self
                .unsqueeze(0)?
                .conv_transpose3d(weight, bias, opts)?
                .squeeze(0);
        }
        let [od, oh, ow] = check_conv_transpose3d(self, weight, bias, &opts)?;
        let taps = TransposedTaps {
            n: self.shape()[0],
            cin: self.shape()[1],
            cout: weight.shape()[1] * opts.groups,
            kd: weight.shape()[2],
            d: self.shape()[2],
            hw: [self.shape()[3], self.shape()[4]],
            out: [od, oh, ow],
            opts,
        };
        let y = {
            let _ng = crate::autograd::no_grad_guard();
            taps.forward(self, weight, bias)?
        };
        Ok(record_conv3d(
            y,
            OP,
            self,
            weight,
            bias,
            move |x, w, gy, need, creating| {
                let gx = need.0.then(|| taps.input_grad(w, gy)).transpose()?;
                let gw = need
                    .1
                    .then(|| taps.weight_grad(x, w, gy, creating))
                    .transpose()?;
                Ok((gx, gw))
            },
        ))
    }
}

/// The geometry of a 3-D transposed convolution as `kD` 2-D ones, one per
/// depth tap of the kernel: every input depth slice (depth-major, folded into
/// the batch) is transposed-convolved with the tap's kernel and lands `stride`
/// apart from the tap's offset along the output's depth; the slices whose
/// landing place the padding crops are left out.
#[derive(Clone, Copy)]
struct TransposedTaps {
    n: usize,
    cin: usize,
    cout: usize,
    kd: usize,
    /// The input's depth, height and width; the output's.
    d: usize,
    hw: [usize; 2],
    out: [usize; 3],
    opts: ConvTranspose3dOptions,
}

impl TransposedTaps {
    /// Where tap `i`'s slices land (input depth `j` on output depth `j · sd +
    /// i · dd − pd`); `None` where the padding crops them all.
    fn landing(&self, i: usize) -> Option<Run> {
        let offset = (i * self.opts.dilation.0) as i64 - self.opts.padding.0 as i64;
        Run::of(offset, self.opts.stride.0, self.out[0], self.d)
    }

    /// Each tap's 2-D transposed convolution.
    fn plane(&self) -> ConvTranspose2dOptions {
        let o = self.opts;
        ConvTranspose2dOptions {
            stride: (o.stride.1, o.stride.2),
            padding: (o.padding.1, o.padding.2),
            output_padding: (o.output_padding.1, o.output_padding.2),
            dilation: (o.dilation.1, o.dilation.2),
            groups: o.groups,
        }
    }

    /// The 2-D convolution whose input gradient [`plane`](Self::plane) is.
    fn plane_conv(&self) -> Conv2dOptions {
        let o = self.opts;
        Conv2dOptions {
            stride: (o.stride.1, o.stride.2),
            padding: (o.padding.1, o.padding.2),
            dilation: (o.dilation.1, o.dilation.2),
            groups: o.groups,
        }
    }

    /// The transposed convolution (not recorded): the input's depth slices
    /// made depth-major once, each tap's 2-D transposed convolution of those
    /// that land added into the output through its depth-major view.
    fn forward(&self, x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        let (n, cout, [od, oh, ow]) = (self.n, self.cout, self.out);
        let shape = [n, cout, od, oh, ow];
        // (new storage: the taps are added into it in place, and a contiguous
        // view of the bias, as a one-position output's is, would be the bias)
        let y = bias_filled(shape, bias, x)?;
        let yt = y.permute([2, 0, 1, 3, 4])?;
        // [D, N, C_in, H, W]: a run of depths is one block of samples
        let xt = x.permute([2, 0, 1, 3, 4])?.contiguous()?;
        let [h, w] = self.hw;
        for i in 0..self.kd {
            let Some(l) = self.landing(i) else { continue };
            let slices =
                xt.narrow(0, l.first as i64, l.count)?
                    .reshape([l.count * n, self.cin, h, w])?;
            let part = slices.conv_transpose2d(&weight.select(2, i as i64)?, None, self.plane())?;
            l.partners(&yt, self.opts.stride.0)?
                .add_(&part.reshape([l.count, n, cout, oh, ow])?)?;
        }
        Ok(y)
    }

    /// The input's gradient: the 3-D convolution of the output's (recorded
    /// when a walk creates a graph, as every op here), cut to the input's size
    /// where an output padding of a stride or more makes it larger.
    fn input_grad(&self, weight: &Tensor, gy: &Tensor) -> Result<Tensor> {
        let o = self.opts;
        let conv = Conv3dOptions {
            stride: o.stride,
            padding: o.padding,
            dilation: o.dilation,
            groups: o.groups,
        };
        let mut gx = gy.conv3d(weight, None, conv)?;
        let size = [self.d, self.hw[0], self.hw[1]];
        for (i, &len) in size.iter().enumerate() {
            if gx.shape()[2 + i] != len {
                gx = gx.narrow(2 + i as i64, 0, len)?;
            }
        }
        gx.contiguous()
    }

    /// The weight's gradient: per tap, the weight gradient of the 2-D
    /// convolution whose input gradient the tap is, with the output gradient's
    /// landed depths as that convolution's input and the input's slices as its
    /// output's gradient (in recorded ops where `recorded`).
    fn weight_grad(
        &self,
        x: &Tensor,
        weight: &Tensor,
        gy: &Tensor,
        recorded: bool,
    ) -> Result<Tensor> {
        let (n, [h, w], [_, oh, ow]) = (self.n, self.hw, self.out);
        let k = (weight.shape()[3], weight.shape()[4]);
        if x.numel() == 0 || gy.numel() == 0 {
            // nothing to convolve (no device is asked to)
            return weight.zeros_like();
        }
        let xt = x.permute([2, 0, 1, 3, 4])?;
        let gyt = gy.permute([2, 0, 1, 3, 4])?;
        let mut taps = Vec::with_capacity(self.kd);
        for i in 0..self.kd {
            let tap = weight.select(2, i as i64)?;
            let Some(l) = self.landing(i) else {
                taps.push(tap.zeros_like()?);
                continue;
            };
            let g =
                l.partners(&gyt, self.opts.stride.0)?
                    .reshape([l.count * n, self.cout, oh, ow])?;
            let xs =
                xt.narrow(0, l.first as i64, l.count)?
                    .reshape([l.count * n, self.cin, h, w])?;
            let gt = if recorded {
                conv2d_weight_grad_recorded(&g, &xs, k, self.plane_conv())?
            } else {
                // the convolution of `g` may reach past the input (an output
                // padding of a stride or more): no gradient flows from there
                let o = self.plane_conv();
                let reach = |n, k, i: usize| {
                    let [s, p, d] = [o.stride, o.padding, o.dilation].map(|t| [t.0, t.1][i]);
                    Window::out_size(n, k, s, p, d, false).unwrap_or(0)
                };
                let (ch, cw) = (reach(oh, k.0, 0), reach(ow, k.1, 1));
                let xs = if (ch, cw) != (h, w) {
                    xs.pad(
                        &[0, (cw - w) as i64, 0, (ch - h) as i64],
                        PadMode::Constant(0.0),
                    )?
                } else {
                    xs
                };
                let (_, gt) = conv2d_grads(&g, &tap, &xs, self.plane_conv(), (false, true))?;
                gt.ok_or_else(|| Error::invalid("conv_transpose3d backward", "no weight gradient"))?
                    .to_dtype(weight.dtype())?
            };
            taps.push(gt);
        }
        let taps: Vec<&Tensor> = taps.iter().collect();
        Tensor::stack(&taps, 2)
    }
}
