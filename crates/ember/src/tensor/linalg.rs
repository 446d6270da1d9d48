//! `matmul` with `torch.matmul` semantics, `conv2d`, and 2-D max / average pooling.

use super::Tensor;
use crate::backend::cpu::conv;
use crate::backend::cpu::matmul::{matmul, MatmulArgs};
use crate::backend::cuda::ops as cuda_ops;
use crate::backend::op::{ConvShape, Pool, Window};
use crate::dtype::CpuData;
use crate::dtype::Real;
use crate::layout::{broadcast_shapes, checked_numel, Dims};
use crate::WithDType;
use crate::{DType, Error, Result};

/// The input and weight gradients of a convolution, each where it is needed.
pub(super) type ConvGrads = (Option<Tensor>, Option<Tensor>);

impl Tensor {
    /// Records `out` as `conv2d(self, weight, bias)` (every device's path shares
    /// this). At backward time `grads` gets the output gradient, contiguous in the
    /// `work` dtype, and which of the input and weight gradients are needed, and
    /// returns those in `work` with the operands' numbers of elements; they are
    /// given the operands' shapes and dtypes here, and the bias gradient is the
    /// output gradient summed over batch and positions.
    pub(super) fn record_conv2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        out: Tensor,
        work: DType,
        grads: impl FnOnce(&Tensor, (bool, bool)) -> Result<ConvGrads> + Send + Sync + 'static,
    ) -> Tensor {
        let mut inputs = vec![self, weight];
        inputs.extend(bias);
        Tensor::record(out, "conv2d", &inputs, |_| {
            let (xshape, xdt) = (self.shape().to_vec(), self.dtype());
            let (wshape, wdt) = (weight.shape().to_vec(), weight.dtype());
            let need = (self.requires_grad(), weight.requires_grad());
            let bias_grad = bias.map(|b| b.requires_grad());
            move |gy: &Tensor| {
                let gc = gy.to_dtype(work)?.contiguous()?;
                let (gx, gw) = grads(&gc, need)?;
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

    /// Matrix product with `torch.matmul` semantics: 1-D·1-D is a dot product, 2-D·2-D
    /// a matrix product, and higher ranks are batches of matrices whose batch dims
    /// broadcast. A 1-D operand gets a dim prepended (left) or appended (right) that
    /// is removed from the result. f16/bf16 accumulate in f32.
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        /// Whether the last two dims are stored column-major (a transposed view).
        fn is_transposed(t: &Tensor) -> bool {
            let (r, st) = (t.rank(), t.stride());
            r >= 2 && st[r - 2] == 1 && st[r - 1] != 1 && t.shape()[r - 2] > 1
        }
        const OP: &str = "matmul";
        super::same_device(OP, &[self, rhs])?;
        if self.dtype() != rhs.dtype() {
            return Err(Error::DTypeMismatch {
                op: OP,
                lhs: self.dtype(),
                rhs: rhs.dtype(),
            });
        }
        if self.dtype() == DType::Bool {
            return Err(Error::dtype(
                OP,
                DType::Bool,
                "convert to an integer or float dtype first",
            ));
        }
        if self.rank() == 0 || rhs.rank() == 0 {
            return Err(Error::invalid(
                OP,
                format!(
                    "both arguments to matmul need to be at least 1D, but they are {}D and {}D",
                    self.rank(),
                    rhs.rank()
                ),
            ));
        }
        let _ng = crate::no_grad_guard();
        let a = if self.rank() == 1 {
            self.unsqueeze(0)?
        } else {
            self.clone()
        };
        let b = if rhs.rank() == 1 {
            rhs.unsqueeze(1)?
        } else {
            rhs.clone()
        };
        let (ra, rb) = (a.rank(), b.rank());
        let (m, ka) = (a.shape()[ra - 2], a.shape()[ra - 1]);
        let (kb, n) = (b.shape()[rb - 2], b.shape()[rb - 1]);
        if ka != kb {
            return Err(Error::shape(
                OP,
                self.shape(),
                rhs.shape(),
                format!("mat1 and mat2 shapes cannot be multiplied ({m}x{ka} and {kb}x{n})"),
            ));
        }
        let batch = broadcast_shapes(OP, &a.shape()[..ra - 2], &b.shape()[..rb - 2])?;
        let with = |x: usize, y: usize| -> Dims {
            let mut s = batch.clone();
            s.push(x);
            s.push(y);
            s
        };
        checked_numel(OP, &with(m, n))?;
        let la = a.layout().broadcast_to(OP, &with(m, ka))?;
        let lb = b.layout().broadcast_to(OP, &with(ka, n))?;
        let on_gpu = match (a.cuda_storage(), b.cuda_storage()) {
            (Some(sa), Some(sb)) => cuda_ops::matmul(&sa, &la, &sb, &lb, m, ka, n)?,
            _ => None,
        };
        let data = match on_gpu {
            Some(_) => None,
            None => Some(a.with_cpu(|da, _| {
                b.with_cpu(|db, _| {
                    matmul(&MatmulArgs {
                        a: (da, &la),
                        b: (db, &lb),
                        m,
                        k: ka,
                        n,
                    })
                })
            })???),
        };
        // drop the dims that 1-D operands gained
        let mut shape = with(m, n);
        if rhs.rank() == 1 {
            shape.pop();
        }
        if self.rank() == 1 {
            let r = shape.len() - if rhs.rank() == 1 { 1 } else { 2 };
            shape.remove(r);
        }
        drop(_ng);
        let out = match (on_gpu, data) {
            (Some(st), _) => Tensor::from_cuda(st, &shape),
            (None, Some(d)) => Tensor::from_host(d, &shape, self.device())?,
            (None, None) => unreachable!("one of the two paths ran"),
        };
        let full = with(m, n).to_vec();
        Ok(Tensor::record(out, OP, &[self, rhs], |_| {
            let (na, nb) = (self.requires_grad(), rhs.requires_grad());
            let (a, b) = (a.detach(), b.detach());
            let (sa, sb) = (self.shape().to_vec(), rhs.shape().to_vec());
            move |g: &Tensor| {
                // in the 2-D-or-more domain: dA = dC·Bᵀ, dB = Aᵀ·dC, summed over broadcast batch dims
                let g = g.reshape(&full)?;
                // An operand stored transposed (`x.matmul(&w.t())`) gets its gradient
                // computed transposed too, (Xᵀ)ᵀ, so that it comes out with the
                // operand's own memory order and the gradient of the transpose view
                // is contiguous again (no transposing copy).
                let ga = if na {
                    let t = if is_transposed(&a) {
                        b.matmul(&g.transpose(-1, -2)?)?.transpose(-1, -2)?
                    } else {
                        g.matmul(&b.transpose(-1, -2)?)?
                    };
                    Some(crate::autograd::sum_to(&t, a.shape())?.reshape(&sa)?)
                } else {
                    None
                };
                let gb = if nb {
                    let t = if is_transposed(&b) {
                        g.transpose(-1, -2)?.matmul(&a)?.transpose(-1, -2)?
                    } else {
                        a.transpose(-1, -2)?.matmul(&g)?
                    };
                    Some(crate::autograd::sum_to(&t, b.shape())?.reshape(&sb)?)
                } else {
                    None
                };
                Ok(vec![ga, gb])
            }
        }))
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
        super::same_device(OP, &ts)?;
        for t in &ts[1..] {
            if t.dtype() != self.dtype() {
                return Err(Error::DTypeMismatch {
                    op: OP,
                    lhs: self.dtype(),
                    rhs: t.dtype(),
                });
            }
        }
        if !self.dtype().is_float() {
            return Err(Error::dtype(
                OP,
                self.dtype(),
                "convolution needs a floating-point input",
            ));
        }
        if self.rank() == 3 {
            return self.unsqueeze(0)?.conv2d(weight, bias, opts)?.squeeze(0);
        }
        if self.rank() != 4 || weight.rank() != 4 {
            return Err(Error::shape(
                OP,
                self.shape(),
                weight.shape(),
                "expected a 3-D or 4-D input and a 4-D weight",
            ));
        }
        let [n, c, h, w] = [
            self.shape()[0],
            self.shape()[1],
            self.shape()[2],
            self.shape()[3],
        ];
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
                self.shape(),
                weight.shape(),
                format!("expected input with {} channels (weight's in-channels × groups = {cg} × {g}) and out-channels divisible by groups", cg * g),
            ));
        }
        if let Some(b) = bias {
            if b.shape() != [o] {
                return Err(Error::shape(
                    OP,
                    b.shape(),
                    &[o],
                    "bias must have one value per output channel",
                ));
            }
        }
        opts.check(OP)?;
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
                self.shape(),
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
        };
        // f16/bf16 convolve in f32
        let work = if matches!(self.dtype(), DType::F16 | DType::BF16) {
            DType::F32
        } else {
            self.dtype()
        };
        let ng = crate::no_grad_guard();
        let (x, wt) = (
            self.to_dtype(work)?.contiguous()?,
            weight.to_dtype(work)?.contiguous()?,
        );
        let b = bias.map(|b| b.to_dtype(work)?.contiguous()).transpose()?;
        if x.is_cuda() {
            drop(ng);
            return self.conv2d_cuda(weight, bias, (x, wt, b), shape, work);
        }
        fn run<T: WithDType + Real>(
            x: &Tensor,
            w: &Tensor,
            b: Option<&Tensor>,
            s: &ConvShape,
        ) -> Result<crate::dtype::CpuData> {
            x.with_cpu(|xd, xl| {
                w.with_cpu(|wd, wl| {
                    let xs = &T::slice(xd).expect("conv2d: dtype checked")[xl.offset()..];
                    let ws = &T::slice(wd).expect("conv2d: dtype checked")[wl.offset()..];
                    let out = match b {
                        Some(b) => b.with_cpu(|bd, bl| {
                            conv::conv2d(
                                xs,
                                ws,
                                Some(&T::slice(bd).expect("conv2d: dtype checked")[bl.offset()..]),
                                s,
                            )
                        })??,
                        None => conv::conv2d(xs, ws, None, s)?,
                    };
                    Ok(T::wrap(out))
                })?
            })?
        }
        let data = match work {
            DType::F64 => run::<f64>(&x, &wt, b.as_ref(), &shape)?,
            _ => run::<f32>(&x, &wt, b.as_ref(), &shape)?,
        };
        let out =
            Tensor::from_host(data, &[n, o, oh, ow], self.device())?.to_dtype(self.dtype())?;
        drop(ng);
        let (x, wt) = (x.detach(), wt.detach());
        Ok(
            self.record_conv2d(weight, bias, out, work, move |gc, need| {
                type Grads2 = (Option<CpuData>, Option<CpuData>);
                fn back<T: WithDType + Real + std::ops::AddAssign>(
                    x: &Tensor,
                    w: &Tensor,
                    g: &Tensor,
                    s: &ConvShape,
                    need: (bool, bool),
                ) -> Result<Grads2> {
                    let ok = "conv2d: dtype checked";
                    x.with_cpu(|xd, xl| {
                        w.with_cpu(|wd, wl| {
                            g.with_cpu(|gd, gl| {
                                let xs = &T::slice(xd).expect(ok)[xl.offset()..];
                                let ws = &T::slice(wd).expect(ok)[wl.offset()..];
                                let gs = &T::slice(gd).expect(ok)[gl.offset()..];
                                let (gx, gw) = conv::conv2d_backward(xs, ws, gs, s, need)?;
                                Ok((gx.map(T::wrap), gw.map(T::wrap)))
                            })
                        })?
                    })??
                }
                let (gx, gw) = match work {
                    DType::F64 => back::<f64>(&x, &wt, gc, &shape, need)?,
                    _ => back::<f32>(&x, &wt, gc, &shape, need)?,
                };
                let dev = gc.device();
                Ok((
                    gx.map(|d| Tensor::from_host(d, &[n, c, h, w], dev))
                        .transpose()?,
                    gw.map(|d| Tensor::from_host(d, &[o, cg, kh, kw], dev))
                        .transpose()?,
                ))
            }),
        )
    }

    fn pool2d(&self, op: &'static str, opts: &Pool2dOptions, kind: Pool) -> Result<Tensor> {
        if !self.dtype().is_float() {
            return Err(Error::dtype(
                op,
                self.dtype(),
                "pooling needs a floating-point input",
            ));
        }
        if self.rank() != 3 && self.rank() != 4 {
            return Err(Error::invalid(
                op,
                format!("expected a 3-D or 4-D input, got shape {:?}", self.shape()),
            ));
        }
        let r = self.rank();
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
        let work = if matches!(self.dtype(), DType::F16 | DType::BF16) {
            DType::F32
        } else {
            self.dtype()
        };
        // max pooling keeps the position of each maximum for the backward pass
        let want_index = crate::autograd::needs_grad(&[self]);
        let ng = crate::no_grad_guard();
        let x = self.to_dtype(work)?.contiguous()?;
        if x.is_cuda() {
            drop(ng);
            let kc = cuda_ops::KConv::new((planes, 1), (h, w), (oh, ow), &win);
            let avg = match kind {
                Pool::Max => None,
                Pool::Avg { count_include_pad } => Some(count_include_pad),
            };
            let mut shape = self.shape()[..r - 2].to_vec();
            shape.extend([oh, ow]);
            let (out, index) = {
                let xs = x.cuda_storage().expect("on the GPU");
                cuda_ops::pool2d(&xs, x.layout().offset(), &kc, avg, want_index)?
            };
            let index = index.map(|i| Tensor::from_cuda(i, &shape));
            let out = {
                let _ng = crate::no_grad_guard();
                Tensor::from_cuda(out, &shape).to_dtype(self.dtype())?
            };
            return Ok(Tensor::record(out, op, &[self], |_| {
                let (xdt, xshape) = (self.dtype(), self.shape().to_vec());
                move |g: &Tensor| {
                    let gc = g.to_dtype(work)?.contiguous()?;
                    let gs = gc.cuda_storage().expect("on the GPU");
                    let is = index
                        .as_ref()
                        .map(|i| i.cuda_storage().expect("on the GPU"));
                    let gx = cuda_ops::pool2d_backward(
                        &gs,
                        gc.layout().offset(),
                        is.as_deref(),
                        &kc,
                        avg,
                    )?;
                    Ok(vec![Some(Tensor::from_cuda(gx, &xshape).to_dtype(xdt)?)])
                }
            }));
        }
        type Pooled = (crate::dtype::CpuData, Option<Vec<u32>>);
        fn run<T: WithDType + Real>(
            x: &Tensor,
            planes: usize,
            hw: (usize, usize),
            o: (usize, usize),
            (win, kind, want_index): (Window, Pool, bool),
        ) -> Result<Pooled> {
            x.with_cpu(|d, l| {
                let (out, index) = conv::pool2d(
                    &T::slice(d).expect("pool2d: dtype checked")[l.offset()..],
                    planes,
                    hw,
                    o,
                    win,
                    kind,
                    want_index,
                )?;
                Ok((T::wrap(out), index))
            })?
        }
        let how = (win, kind, want_index);
        let (data, index) = match work {
            DType::F64 => run::<f64>(&x, planes, (h, w), (oh, ow), how)?,
            _ => run::<f32>(&x, planes, (h, w), (oh, ow), how)?,
        };
        let mut shape = self.shape()[..r - 2].to_vec();
        shape.extend([oh, ow]);
        let out = Tensor::from_host(data, &shape, self.device())?.to_dtype(self.dtype())?;
        drop(ng);
        Ok(Tensor::record(out, op, &[self], |_| {
            let (xdt, xshape) = (self.dtype(), self.shape().to_vec());
            move |g: &Tensor| {
                let gc = g.to_dtype(work)?.contiguous()?;
                fn back<T: WithDType + Real + std::ops::AddAssign>(
                    g: &Tensor,
                    index: Option<&[u32]>,
                    planes: usize,
                    hw: (usize, usize),
                    o: (usize, usize),
                    (win, kind): (Window, Pool),
                ) -> Result<CpuData> {
                    g.with_cpu(|gd, gl| {
                        conv::pool2d_backward(
                            &T::slice(gd).expect("pool2d: dtype checked")[gl.offset()..],
                            index,
                            planes,
                            hw,
                            o,
                            win,
                            kind,
                        )
                        .map(T::wrap)
                    })?
                }
                let (idx, wk) = (index.as_deref(), (win, kind));
                let gx = match work {
                    DType::F64 => back::<f64>(&gc, idx, planes, (h, w), (oh, ow), wk)?,
                    _ => back::<f32>(&gc, idx, planes, (h, w), (oh, ow), wk)?,
                };
                Ok(vec![Some(
                    Tensor::from_host(gx, &xshape, g.device())?.to_dtype(xdt)?,
                )])
            }
        }))
    }

    /// 2-D max pooling over `[N, C, H, W]` or `[C, H, W]` (`F.max_pool2d`); padded
    /// positions never win, NaN does.
    pub fn max_pool2d(&self, opts: Pool2dOptions) -> Result<Tensor> {
        self.pool2d("max_pool2d", &opts, Pool::Max)
    }

    /// 2-D average pooling (`F.avg_pool2d`); `count_include_pad` as in PyTorch.
    pub fn avg_pool2d(&self, opts: Pool2dOptions) -> Result<Tensor> {
        if opts.dilation != (1, 1) {
            return Err(Error::invalid("avg_pool2d", "avg_pool2d has no dilation"));
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
    fn check(&self, op: &'static str) -> Result<()> {
        if self.stride.0 == 0 || self.stride.1 == 0 || self.dilation.0 == 0 || self.dilation.1 == 0
        {
            return Err(Error::invalid(
                op,
                "stride and dilation must be greater than zero",
            ));
        }
        Ok(())
    }
}

/// Window of a 2-D pooling: kernel, stride (defaults to the kernel), padding,
/// dilation (max pooling only), ceil mode, and `count_include_pad` (average only,
/// default true as in PyTorch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool2dOptions {
    pub kernel: (usize, usize),
    pub stride: Option<(usize, usize)>,
    pub padding: (usize, usize),
    pub dilation: (usize, usize),
    pub ceil_mode: bool,
    pub count_include_pad: bool,
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
    fn window(&self) -> Window {
        Window {
            kernel: self.kernel,
            stride: self.stride.unwrap_or(self.kernel),
            padding: self.padding,
            dilation: self.dilation,
        }
    }
}
