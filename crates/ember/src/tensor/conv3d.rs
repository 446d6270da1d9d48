//! 3-D convolution (`F.conv3d`) as a composite of 2-D ones: each kernel-depth
//! tap is a `conv2d` over the input's depth slices it meets, depth folded into
//! the batch, and the taps are summed. It runs wherever `conv2d` runs (cuDNN on
//! a GPU, shapes only on meta), and autograd follows the ops it is built of.

use super::conv::{check_operands, Conv2dOptions};
use super::{PadMode, Tensor};
use crate::error::{Error, Result};

/// Stride, zero padding, dilation (each `(depth, height, width)`) and groups of
/// a 3-D convolution (PyTorch's defaults: 1, 0, 1, 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv3dOptions {
    pub stride: (usize, usize, usize),
    pub padding: (usize, usize, usize),
    pub dilation: (usize, usize, usize),
    pub groups: usize,
}

impl Default for Conv3dOptions {
    fn default() -> Self {
        Conv3dOptions {
            stride: (1, 1, 1),
            padding: (0, 0, 0),
            dilation: (1, 1, 1),
            groups: 1,
        }
    }
}

impl Conv3dOptions {
    /// The same stride along the three axes.
    pub fn stride(mut self, s: usize) -> Self {
        self.stride = (s, s, s);
        self
    }
    /// The same zero padding on the three axes.
    pub fn padding(mut self, p: usize) -> Self {
        self.padding = (p, p, p);
        self
    }
    /// The same dilation on the three axes.
    pub fn dilation(mut self, d: usize) -> Self {
        self.dilation = (d, d, d);
        self
    }
    /// Channel groups (`groups = C` is a depthwise convolution).
    pub fn groups(mut self, g: usize) -> Self {
        self.groups = g;
        self
    }
}

/// A triple as a list, for messages and loops.
pub(super) fn list(t: (usize, usize, usize)) -> [usize; 3] {
    [t.0, t.1, t.2]
}

/// PyTorch's checks of a 3-D convolution's operands (`x` batched by now, or
/// refused for its rank); `pads` is each spatial dim's `(before, after)`
/// padding, whose sum the kernel must fit in.
fn check_conv3d(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    opts: &Conv3dOptions,
    pads: [(usize, usize); 3],
) -> Result<()> {
    const OP: &str = "conv3d";
    if weight.rank() != 5 {
        return Err(Error::shape(
            OP,
            x.shape(),
            weight.shape(),
            format!(
                "expected a 5-D weight [out, in / groups, kD, kH, kW] for conv3d, but got weight of size {:?}",
                weight.shape()
            ),
        ));
    }
    let c = x.shape()[1];
    let [o, cg] = [weight.shape()[0], weight.shape()[1]];
    let g = opts.groups;
    if g == 0 {
        return Err(Error::invalid(OP, "non-positive groups is not supported"));
    }
    if list(opts.stride).contains(&0) {
        return Err(Error::invalid(OP, "non-positive stride is not supported"));
    }
    if list(opts.dilation).contains(&0) {
        return Err(Error::invalid(
            OP,
            format!(
                "dilation should be greater than zero, but got {:?}",
                list(opts.dilation)
            ),
        ));
    }
    if cg * g != c {
        return Err(Error::shape(
            OP,
            x.shape(),
            weight.shape(),
            format!(
                "Given groups={g}, weight of size {:?}, expected input{:?} to have {} channels, but got {c} channels instead",
                weight.shape(),
                x.shape(),
                cg * g
            ),
        ));
    }
    if !o.is_multiple_of(g) {
        return Err(Error::shape(
            OP,
            x.shape(),
            weight.shape(),
            format!(
                "Given groups={g}, expected weight to be divisible by {g} at dimension 0, but got weight of size {:?} instead",
                weight.shape()
            ),
        ));
    }
    if let Some(b) = bias {
        if b.shape() != [o] {
            return Err(Error::shape(
                OP,
                b.shape(),
                &[o],
                format!(
                    "Given weight of size {:?}, expected bias to be 1-dimensional with {o} elements, but got bias of size {:?} instead",
                    weight.shape(),
                    b.shape()
                ),
            ));
        }
    }
    let dil = list(opts.dilation);
    let padded: Vec<usize> = (0..3)
        .map(|i| x.shape()[2 + i] + pads[i].0 + pads[i].1)
        .collect();
    let reach: Vec<usize> = (0..3)
        .map(|i| dil[i].saturating_mul(weight.shape()[2 + i].saturating_sub(1)) + 1)
        .collect();
    let zero_kernel = weight.shape()[2..].contains(&0);
    if zero_kernel || (0..3).any(|i| reach[i] > padded[i]) {
        let show = |v: &[usize]| format!("{} x {} x {}", v[0], v[1], v[2]);
        return Err(Error::shape(
            OP,
            x.shape(),
            weight.shape(),
            format!(
                "Calculated padded input size per channel: ({}). Kernel size: ({}). Kernel size can't be greater than actual input size",
                show(&padded),
                show(&reach)
            ),
        ));
    }
    Ok(())
}

/// PyTorch's refusal of an input that is neither `[C, D, H, W]` nor `[N, C, D,
/// H, W]`.
pub(super) fn check_rank_3d(op: &'static str, x: &Tensor, weight: &Tensor) -> Result<()> {
    if x.rank() == 4 || x.rank() == 5 {
        return Ok(());
    }
    Err(Error::shape(
        op,
        x.shape(),
        weight.shape(),
        format!(
            "Expected 4D (unbatched) or 5D (batched) input to {op}, but got input of size: {:?}",
            x.shape()
        ),
    ))
}

impl Tensor {
    /// 3-D convolution (`F.conv3d`): input `[N, C, D, H, W]` (or `[C, D, H,
    /// W]`), weight `[O, C / groups, kD, kH, kW]`, optional bias `[O]`; each
    /// output size is `(in + 2·padding − dilation·(k − 1) − 1) / stride + 1`.
    ///
    /// It is built of 2-D convolutions: for each of the kernel's `kD` depth
    /// taps, the input's depth slices that tap meets (a strided view, depth
    /// folded into the batch) are convolved with that tap's `[O, C / groups,
    /// kH, kW]` kernel, and the taps' outputs are summed. So it runs on every
    /// device through `conv2d` (cuDNN on a GPU; shapes only on meta), and its
    /// gradients are those of the ops it is made of. Only depth padding is
    /// copied into the input; height and width padding is `conv2d`'s own.
    ///
    /// ```
    /// # use ember::{Conv3dOptions, DType, Device, Tensor};
    /// let dev = Device::Cpu;
    /// let x = Tensor::ones([2, 4, 6, 8, 8], DType::F32, &dev)?;
    /// let w = Tensor::ones([3, 4, 3, 3, 3], DType::F32, &dev)?;
    /// let y = x.conv3d(&w, None, Conv3dOptions::default().padding(1).stride(2))?;
    /// assert_eq!(y.shape(), &[2, 3, 3, 4, 4]);
    /// // position (1, 1, 1) lies inside: its window sums 4 · 3 · 3 · 3 ones
    /// assert_eq!(y.to_vec::<f32>()?[16 + 4 + 1], 108.0);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn conv3d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: Conv3dOptions,
    ) -> Result<Tensor> {
        let p = list(opts.padding);
        self.conv3d_padded(
            weight,
            bias,
            opts,
            [(p[0], p[0]), (p[1], p[1]), (p[2], p[2])],
        )
    }

    /// 3-D convolution with `padding="same"` (`F.conv3d(x, w, padding="same")`):
    /// stride 1, and the output keeps the input's depth, height and width.
    /// Where the padding a dim needs is odd, the extra zero goes after the
    /// input, as in PyTorch.
    pub fn conv3d_same(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        dilation: (usize, usize, usize),
        groups: usize,
    ) -> Result<Tensor> {
        let opts = Conv3dOptions {
            dilation,
            groups,
            ..Conv3dOptions::default()
        };
        self.conv3d_same_opts(weight, bias, opts)
    }

    /// [`conv3d_same`](Self::conv3d_same) with the stride, dilation and groups
    /// of `opts` (`F.conv3d(x, w, b, stride, padding="same", dilation,
    /// groups)`; the padding of `opts` is not used): a stride other than 1 is
    /// refused, as PyTorch refuses it.
    ///
    /// ```
    /// # use ember::{Conv3dOptions, DType, Device, Tensor};
    /// let dev = Device::Cpu;
    /// let x = Tensor::ones([1, 2, 5, 4, 6], DType::F32, &dev)?;
    /// let w = Tensor::ones([3, 2, 2, 3, 3], DType::F32, &dev)?;
    /// let y = x.conv3d_same_opts(&w, None, Conv3dOptions::default())?;
    /// assert_eq!(y.shape(), &[1, 3, 5, 4, 6]);
    /// assert!(x.conv3d_same_opts(&w, None, Conv3dOptions::default().stride(2)).is_err());
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn conv3d_same_opts(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: Conv3dOptions,
    ) -> Result<Tensor> {
        if opts.stride != (1, 1, 1) {
            return Err(Error::invalid(
                "conv3d",
                "padding='same' is not supported for strided convolutions",
            ));
        }
        let mut pads = [(0, 0); 3];
        if weight.rank() == 5 {
            let dil = list(opts.dilation);
            for (i, pad) in pads.iter_mut().enumerate() {
                let total = dil[i] * weight.shape()[2 + i].saturating_sub(1);
                *pad = (total / 2, total - total / 2);
            }
        }
        self.conv3d_padded(weight, bias, opts, pads)
    }

    /// The convolution with each spatial dim's `(before, after)` zero padding
    /// (the padding of `opts` is not used).
    fn conv3d_padded(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: Conv3dOptions,
        pads: [(usize, usize); 3],
    ) -> Result<Tensor> {
        const OP: &str = "conv3d";
        let mut ts = vec![self, weight];
        ts.extend(bias);
        if let Some(c) = crate::tensor::autocast::lower(&ts)? {
            return c[0].conv3d_padded(&c[1], c.get(2), opts, pads);
        }
        check_operands(OP, &ts)?;
        check_rank_3d(OP, self, weight)?;
        if self.rank() == 4 {
            return self
                .unsqueeze(0)?
                .conv3d_padded(weight, bias, opts, pads)?
                .squeeze(0);
        }
        check_conv3d(self, weight, bias, &opts, pads)?;
        let [n, c] = [self.shape()[0], self.shape()[1]];
        let [o, kd] = [weight.shape()[0], weight.shape()[2]];
        let (sd, dd) = (opts.stride.0, opts.dilation.0);
        // height and width: the padding both sides share is conv2d's, any
        // extra on one side (padding="same") is copied in with depth's
        let (ph, pw) = (pads[1].0.min(pads[1].1), pads[2].0.min(pads[2].1));
        let explicit = [
            pads[2].0 - pw,
            pads[2].1 - pw,
            pads[1].0 - ph,
            pads[1].1 - ph,
            pads[0].0,
            pads[0].1,
        ];
        let x = if explicit.iter().any(|&p| p > 0) {
            let p: Vec<i64> = explicit.iter().map(|&p| p as i64).collect();
            self.pad(&p, PadMode::Constant(0.0))?
        } else {
            self.clone()
        };
        let [dp, hp, wp] = [x.shape()[2], x.shape()[3], x.shape()[4]];
        let od = (dp - dd * (kd - 1) - 1) / sd + 1;
        // depth beside the batch: [N, D, C, H, W] (a view)
        let xt = x.permute([0, 2, 1, 3, 4])?;
        let plane = Conv2dOptions {
            stride: (opts.stride.1, opts.stride.2),
            padding: (ph, pw),
            dilation: (opts.dilation.1, opts.dilation.2),
            groups: opts.groups,
        };
        let mut sum: Option<Tensor> = None;
        for i in 0..kd {
            let start = i * dd;
            let end = start + (od - 1) * sd + 1;
            // the od depth slices tap i meets, each a sample of the batch
            let slices = xt
                .slice(1, Some(start as i64), Some(end as i64), sd)?
                .reshape([n * od, c, hp, wp])?;
            let tap = weight.select(2, i as i64)?;
            let y = slices.conv2d(&tap, if i == 0 { bias } else { None }, plane)?;
            sum = Some(match sum {
                None => y,
                Some(s) => s.add(&y)?,
            });
        }
        let y = sum.ok_or_else(|| Error::invalid(OP, "a kernel of zero depth"))?;
        let (oh, ow) = (y.shape()[2], y.shape()[3]);
        y.reshape([n, od, o, oh, ow])?
            .permute([0, 2, 1, 3, 4])?
            .contiguous()
    }
}
