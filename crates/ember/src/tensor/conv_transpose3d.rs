//! 3-D transposed convolution (`F.conv_transpose3d`) as a composite of 2-D
//! ones: each kernel-depth tap is a `conv_transpose2d` of every input depth
//! slice (depth folded into the batch), whose outputs land `stride` apart from
//! the tap's offset along the output's depth; the taps are summed. It runs
//! wherever `conv_transpose2d` runs, and autograd follows the ops.

use super::conv::check_operands;
use super::conv3d::{check_rank_3d, list};
use super::conv_transpose::ConvTranspose2dOptions;
use super::{PadMode, Tensor};
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
    /// output's depth (cropped by the padding) and summed. Its gradients are
    /// those of the ops it is made of.
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
        let [n, cin, d, h, w] = [0, 1, 2, 3, 4].map(|i| self.shape()[i]);
        let cout = weight.shape()[1] * opts.groups;
        let kd = weight.shape()[2];
        let (sd, pd, dd) = (opts.stride.0, opts.padding.0, opts.dilation.0);
        let plane = ConvTranspose2dOptions {
            stride: (opts.stride.1, opts.stride.2),
            padding: (opts.padding.1, opts.padding.2),
            output_padding: (opts.output_padding.1, opts.output_padding.2),
            dilation: (opts.dilation.1, opts.dilation.2),
            groups: opts.groups,
        };
        // every depth slice a sample of the batch: [N·D, C_in, H, W]
        let slices = self.permute([0, 2, 1, 3, 4])?.reshape([n * d, cin, h, w])?;
        // each tap's slices cover `span` full-output positions, `sd` apart
        let span = (d - 1) * sd + 1;
        let mut sum: Option<Tensor> = None;
        for i in 0..kd {
            // the part of [i·dd, i·dd + span) inside the output's [pd, pd + od)
            let start = i * dd;
            let (lo, hi) = (start.max(pd), (start + span).min(pd + od));
            if lo >= hi {
                continue;
            }
            let y = slices
                .conv_transpose2d(&weight.select(2, i as i64)?, None, plane)?
                .reshape([n, d, cout, oh, ow])?;
            // zeros between the slices: [N, D, sd, ...] read as [N, D·sd, ...]
            let spread = if sd > 1 {
                y.unsqueeze(2)?
                    .pad(
                        &[0, 0, 0, 0, 0, 0, 0, sd as i64 - 1],
                        PadMode::Constant(0.0),
                    )?
                    .reshape([n, d * sd, cout, oh, ow])?
            } else {
                y
            };
            let placed = spread.narrow(1, (lo - start) as i64, hi - lo)?.pad(
                &[0, 0, 0, 0, 0, 0, (lo - pd) as i64, (pd + od - hi) as i64],
                PadMode::Constant(0.0),
            )?;
            sum = Some(match sum {
                None => placed,
                Some(s) => s.add(&placed)?,
            });
        }
        let y = match sum {
            Some(y) => y,
            // no tap reaches the output (the padding crops them all)
            None => Tensor::zeros([n, od, cout, oh, ow], self.dtype(), &self.device())?,
        };
        let y = match bias {
            Some(b) => y.add(&b.reshape([1, 1, cout, 1, 1])?)?,
            None => y,
        };
        y.permute([0, 2, 1, 3, 4])?.contiguous()
    }
}
