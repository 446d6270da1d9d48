//! 3-D convolution (`F.conv3d`) as a composite of 2-D ones: each kernel-depth
//! tap is a `conv2d` over the input's depth slices it meets, depth folded into
//! the batch, and the taps are added into the output. It runs wherever `conv2d`
//! runs (cuDNN on a GPU, shapes only on meta). Autograd sees one op that keeps
//! the input and the weight, as PyTorch's does; backward makes each tap's
//! slices again and runs its `conv2d`'s gradients.

use super::conv::{check_operands, conv2d_grads, conv2d_weight_grad_recorded, Conv2dOptions};
use super::{ConvTranspose3dOptions, PadMode, Tensor};
use crate::dtype::DType;
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
    /// taps, the input's depth slices that tap meets (depth folded into the
    /// batch) are convolved with that tap's `[O, C / groups, kH, kW]` kernel,
    /// and the taps' outputs are summed. So it runs on every device through
    /// `conv2d` (cuDNN on a GPU; shapes only on meta). For backward it keeps
    /// the input and the weight only, as PyTorch does (a tap's slices live
    /// only while the tap runs), and its gradients are each tap's `conv2d`
    /// gradients. No padding is copied into the input but the one-sided extra
    /// of `padding="same"` with an even kernel: a tap skips the output depths
    /// where it would read depth padding, and height and width padding is
    /// `conv2d`'s own.
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
        let taps = Taps::new(self, weight, opts, pads);
        let y = {
            let _ng = crate::autograd::no_grad_guard();
            taps.forward(self, weight, bias)?
        };
        // (the depth slices each tap convolves are made again in backward)
        Ok(record_conv3d(
            y,
            OP,
            self,
            weight,
            bias,
            move |x, w, gy, need, creating| match creating {
                true => taps.grads_recorded(x, w, gy, need),
                false => taps.grads(x, w, gy, need),
            },
        ))
    }
}

/// Records `y` as the 3-D convolution `op` (or its transpose) of `x`,
/// `weight` and `bias` in one node that keeps the input and the weight, as
/// PyTorch's convolutions do. `grads(x, w, gy, need, creating)` gives the
/// input's and weight's gradients as `need` asks (never called with neither
/// asked for), in recorded ops where `creating` (the values it is given then
/// carry their history); the bias's is `gy` summed per channel.
pub(super) fn record_conv3d<G>(
    y: Tensor,
    op: &'static str,
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    grads: G,
) -> Tensor
where
    G: Fn(
            &Tensor,
            &Tensor,
            &Tensor,
            (bool, bool),
            bool,
        ) -> Result<(Option<Tensor>, Option<Tensor>)>
        + Send
        + Sync
        + 'static,
{
    let mut inputs = vec![x, weight];
    inputs.extend(bias);
    let (xs, ws) = (x.save(), weight.save());
    let need = (x.requires_grad(), weight.requires_grad());
    let bias_grad = bias.map(|b| b.requires_grad());
    Tensor::record_twice(y, op, &inputs, |_| {
        move |gy: &Tensor| {
            let creating = crate::autograd::creating_graph();
            let (gx, gw) = match (need, creating) {
                // the bias's gradient alone
                ((false, false), _) => (None, None),
                (_, true) => grads(&xs.value()?, &ws.value()?, gy, need, true)?,
                (_, false) => grads(xs.get()?, ws.get()?, gy, need, false)?,
            };
            let mut out = vec![gx, gw];
            if let Some(needed) = bias_grad {
                out.push(needed.then(|| gy.sum([0, 2, 3, 4], false)).transpose()?);
            }
            Ok(out)
        }
    })
}

/// A new `shape` (`[N, C, D, H, W]`) tensor holding `bias` per channel, or
/// zeros: the output the taps of a 3-D convolution are added into (new
/// storage: a contiguous view of the bias, as a one-position output's is,
/// would take the adds itself).
pub(super) fn bias_filled(
    shape: [usize; 5],
    bias: Option<&Tensor>,
    like: &Tensor,
) -> Result<Tensor> {
    match bias {
        Some(b) => b.reshape([1, shape[1], 1, 1, 1])?.expand(shape)?.copy(),
        None => Tensor::zeros(shape, like.dtype(), &like.device()),
    }
}

/// A run of a depth tap's positions `j` in `first .. first + count`, those
/// whose partner depth `j · stride + offset` lies inside its dim; `start` is
/// the first's partner.
#[derive(Clone, Copy)]
pub(super) struct Run {
    pub first: usize,
    pub count: usize,
    pub start: usize,
}

impl Run {
    /// The `j` in `0..positions` with `j · stride + offset` in `0..size`;
    /// `None` where there are none.
    pub fn of(offset: i64, stride: usize, size: usize, positions: usize) -> Option<Run> {
        let sd = stride as i64;
        let first = if offset >= 0 {
            0
        } else {
            (-offset + sd - 1) / sd
        };
        let last = size as i64 - 1 - offset;
        if last < 0 {
            return None;
        }
        let end = (last / sd + 1).min(positions as i64);
        (end > first).then(|| Run {
            first: first as usize,
            count: (end - first) as usize,
            start: (first * sd + offset) as usize,
        })
    }

    /// The partner depths, `start` on by `stride`, of a depth-major view.
    pub fn partners(&self, t: &Tensor, stride: usize) -> Result<Tensor> {
        let end = self.start + (self.count - 1) * stride + 1;
        t.slice(0, Some(self.start as i64), Some(end as i64), stride)
    }
}

/// The geometry of a 3-D convolution as `kD` 2-D ones, one per depth tap of the
/// kernel, each over the input's depth slices it meets (depth folded into the
/// batch, depth-major: `[D, N, C, H, W]`, so that a run of slices or of output
/// depths is one block). Depth padding is not copied in: a tap skips the
/// output depths where it would read padding.
#[derive(Clone, Copy)]
struct Taps {
    n: usize,
    c: usize,
    o: usize,
    kd: usize,
    /// Depth stride and dilation.
    sd: usize,
    dd: usize,
    /// The input's depth, and the depth padding before and after it.
    d: usize,
    pd: (usize, usize),
    /// The output's depth, height and width.
    out: [usize; 3],
    /// The input's height and width once `extra` pads them.
    hw: [usize; 2],
    /// The height's and width's padding that is not on both sides
    /// (`padding="same"`), copied into the input (`pad`'s order: width before
    /// and after, height before and after); the rest is `conv2d`'s.
    extra: [usize; 4],
    /// Each tap's 2-D convolution (the height's and width's stride, padding
    /// and dilation, the groups).
    plane: Conv2dOptions,
}

impl Taps {
    fn new(x: &Tensor, weight: &Tensor, opts: Conv3dOptions, pads: [(usize, usize); 3]) -> Taps {
        let (ph, pw) = (pads[1].0.min(pads[1].1), pads[2].0.min(pads[2].1));
        let extra = [
            pads[2].0 - pw,
            pads[2].1 - pw,
            pads[1].0 - ph,
            pads[1].1 - ph,
        ];
        let s = x.shape();
        let hw = [s[3] + extra[2] + extra[3], s[4] + extra[0] + extra[1]];
        let k = &weight.shape()[2..];
        let (st, dil) = (list(opts.stride), list(opts.dilation));
        // (the checks made sure each kernel fits its padded dim)
        let out_size =
            |i: usize, size: usize, p: usize| (size + p - dil[i] * (k[i] - 1) - 1) / st[i] + 1;
        Taps {
            n: s[0],
            c: s[1],
            o: weight.shape()[0],
            kd: k[0],
            sd: st[0],
            dd: dil[0],
            d: s[2],
            pd: pads[0],
            out: [
                out_size(0, s[2], pads[0].0 + pads[0].1),
                out_size(1, hw[0], 2 * ph),
                out_size(2, hw[1], 2 * pw),
            ],
            hw,
            extra,
            plane: Conv2dOptions {
                stride: (st[1], st[2]),
                padding: (ph, pw),
                dilation: (dil[1], dil[2]),
                groups: opts.groups,
            },
        }
    }

    /// The output depths tap `i` computes from the input (at output depth `j`
    /// it reads input depth `j · sd + i · dd − pd`); `None` where it reads only
    /// padding.
    fn reach(&self, i: usize) -> Option<Run> {
        let offset = (i * self.dd) as i64 - self.pd.0 as i64;
        Run::of(offset, self.sd, self.d, self.out[0])
    }

    /// `x` with the `extra` padding, depth-major: `[D, N, C, H, W]` (a view).
    fn depth_major(&self, x: &Tensor) -> Result<Tensor> {
        let x = if self.extra.iter().any(|&p| p > 0) {
            let mut p: Vec<i64> = self.extra.iter().map(|&p| p as i64).collect();
            p.extend([0, 0]);
            x.pad(&p, PadMode::Constant(0.0))?
        } else {
            x.clone()
        };
        x.permute([2, 0, 1, 3, 4])
    }

    /// The depth slices a tap reads, each a sample of the batch: `[count · N,
    /// C, H, W]` (a copy, unless they already are one block, as for a batch of
    /// one at depth stride 1), from [`depth_major`](Self::depth_major)'s view.
    fn slices(&self, xt: &Tensor, r: Run) -> Result<Tensor> {
        let [h, w] = self.hw;
        r.partners(xt, self.sd)?
            .reshape([r.count * self.n, self.c, h, w])
    }

    /// The output gradient's depths a tap reached, from its depth-major copy:
    /// `[count · N, O, oH, oW]` (a view).
    fn out_grad(&self, gyt: &Tensor, r: Run) -> Result<Tensor> {
        let [_, oh, ow] = self.out;
        gyt.narrow(0, r.first as i64, r.count)?
            .reshape([r.count * self.n, self.o, oh, ow])
    }

    /// The convolution (not recorded): each tap's 2-D convolution added into
    /// the output's depths it reached, through the output's depth-major view,
    /// so that no tap's slices outlive its own convolution.
    fn forward(&self, x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        let (n, o, [od, oh, ow]) = (self.n, self.o, self.out);
        let shape = [n, o, od, oh, ow];
        let y = bias_filled(shape, bias, x)?;
        let yt = y.permute([2, 0, 1, 3, 4])?;
        let xt = self.depth_major(x)?;
        for i in 0..self.kd {
            let Some(r) = self.reach(i) else { continue };
            let tap = weight.select(2, i as i64)?;
            let part = self.slices(&xt, r)?.conv2d(&tap, None, self.plane)?;
            yt.narrow(0, r.first as i64, r.count)?
                .add_(&part.reshape([r.count, n, o, oh, ow])?)?;
        }
        Ok(y)
    }

    /// The input and weight gradients as `need` asks, not recorded: each tap's
    /// 2-D convolution's gradients (cuDNN's on a GPU), the input's added into
    /// the depth slices the tap read (in float32 for half types, rounded once).
    fn grads(
        &self,
        x: &Tensor,
        weight: &Tensor,
        gy: &Tensor,
        need: (bool, bool),
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (n, c, [h, w]) = (self.n, self.c, self.hw);
        if x.numel() == 0 || gy.numel() == 0 {
            // nothing to convolve (no device is asked to): zero gradients
            let zeros = |need: bool, t: &Tensor| need.then(|| t.zeros_like()).transpose();
            return Ok((zeros(need.0, x)?, zeros(need.1, weight)?));
        }
        let gyt = gy.permute([2, 0, 1, 3, 4])?.contiguous()?;
        let xt = need.1.then(|| self.depth_major(x)).transpose()?;
        let sum_dtype = match x.dtype() {
            DType::F16 | DType::BF16 => DType::F32,
            dt => dt,
        };
        // the input's gradient (with the extra padding) and its depth-major view
        let gx = need
            .0
            .then(|| Tensor::zeros([n, c, self.d, h, w], sum_dtype, &x.device()))
            .transpose()?;
        let gxt = gx
            .as_ref()
            .map(|g| g.permute([2, 0, 1, 3, 4]))
            .transpose()?;
        let mut gw = Vec::with_capacity(self.kd);
        for i in 0..self.kd {
            let tap = weight.select(2, i as i64)?;
            let Some(r) = self.reach(i) else {
                // a tap that reads only padding: no gradient
                if need.1 {
                    gw.push(tap.zeros_like()?);
                }
                continue;
            };
            let xs = match &xt {
                Some(xt) => self.slices(xt, r)?,
                // (not read: the input's gradient alone)
                None => Tensor::zeros([0usize; 0], x.dtype(), &x.device())?.expand([
                    r.count * n,
                    c,
                    h,
                    w,
                ])?,
            };
            let (gs, gt) = conv2d_grads(&xs, &tap, &self.out_grad(&gyt, r)?, self.plane, need)?;
            if let (Some(gxt), Some(gs)) = (&gxt, gs) {
                r.partners(gxt, self.sd)?
                    .add_(&gs.reshape([r.count, n, c, h, w])?)?;
            }
            gw.extend(gt);
        }
        let gx = gx
            .map(|g| self.unpad(g, 0)?.to_dtype(x.dtype()))
            .transpose()?;
        let gw = need
            .1
            .then(|| {
                let taps: Vec<&Tensor> = gw.iter().collect();
                Tensor::stack(&taps, 2)?.to_dtype(weight.dtype())
            })
            .transpose()?;
        Ok((gx, gw))
    }

    /// The input and weight gradients as `need` asks in recorded ops, so that
    /// they are differentiable again (the rule a walk that creates a graph
    /// runs): the input's is the transposed convolution of `gy`, the weight's
    /// each tap's 2-D weight gradient in recorded ops.
    fn grads_recorded(
        &self,
        x: &Tensor,
        weight: &Tensor,
        gy: &Tensor,
        need: (bool, bool),
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let gx = need
            .0
            .then(|| {
                // all padding but conv2d's own is in the result, cut off after:
                // the output padding that gives back the padded input's size
                let k = &weight.shape()[2..];
                let st = [self.sd, self.plane.stride.0, self.plane.stride.1];
                let dil = [self.dd, self.plane.dilation.0, self.plane.dilation.1];
                let pad = [0, self.plane.padding.0, self.plane.padding.1];
                let size = [self.d + self.pd.0 + self.pd.1, self.hw[0], self.hw[1]];
                let rest = |i: usize| {
                    size[i] + 2 * pad[i] - ((self.out[i] - 1) * st[i] + dil[i] * (k[i] - 1) + 1)
                };
                let t = ConvTranspose3dOptions {
                    stride: (st[0], st[1], st[2]),
                    padding: (pad[0], pad[1], pad[2]),
                    output_padding: (rest(0), rest(1), rest(2)),
                    dilation: (dil[0], dil[1], dil[2]),
                    groups: self.plane.groups,
                };
                self.unpad(gy.conv_transpose3d(weight, None, t)?, self.pd.0)
            })
            .transpose()?;
        let gw = need
            .1
            .then(|| {
                let xt = self.depth_major(x)?;
                let gyt = gy.permute([2, 0, 1, 3, 4])?;
                let k = (weight.shape()[3], weight.shape()[4]);
                let taps = (0..self.kd)
                    .map(|i| match self.reach(i) {
                        Some(r) => conv2d_weight_grad_recorded(
                            &self.slices(&xt, r)?,
                            &self.out_grad(&gyt, r)?,
                            k,
                            self.plane,
                        ),
                        None => weight.select(2, i as i64)?.zeros_like(),
                    })
                    .collect::<Result<Vec<_>>>()?;
                let taps: Vec<&Tensor> = taps.iter().collect();
                Tensor::stack(&taps, 2)
            })
            .transpose()?;
        Ok((gx, gw))
    }

    /// An input gradient `[N, C, D', H', W']` without the padding it carries:
    /// `depth_before` depths first, and the height's and width's `extra`.
    fn unpad(&self, g: Tensor, depth_before: usize) -> Result<Tensor> {
        let e = self.extra;
        let cut = [
            (2, depth_before, self.d),
            (3, e[2], self.hw[0] - e[2] - e[3]),
            (4, e[0], self.hw[1] - e[0] - e[1]),
        ];
        if cut
            .iter()
            .all(|&(dim, before, len)| before == 0 && g.shape()[dim] == len)
        {
            return Ok(g);
        }
        let mut g = g;
        for (dim, before, len) in cut {
            g = g.narrow(dim as i64, before as i64, len)?;
        }
        g.contiguous()
    }
}
