//! conv2d on a GPU: ember's im2col + cuBLAS path, and cuDNN's where it is
//! switched on (`ember::cuda::cudnn`).

use super::Tensor;
use crate::backend::cuda::dnn::{self, ConvGeom, ConvPass};
use crate::backend::cuda::ops as cuda_ops;
use crate::backend::op::ConvShape;
use crate::{DType, Result};

impl Tensor {
    /// conv2d on a GPU: the input's patches (im2col) times the weight matrix through
    /// cuBLAS, one batched product over the groups (group `gi` owns patch rows
    /// `gi·K/g ..`, so the patches view as `[n, g, K/g, p]` and the weight as
    /// `[g, o/g, K/g]`); the backward pass multiplies back and folds the patches'
    /// gradient into the input's (col2im). `x`, `wt`, `b` are contiguous in the
    /// `work` dtype (f32 or f64).
    pub(super) fn conv2d_cuda(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        (x, wt, b): (Tensor, Tensor, Option<Tensor>),
        s: ConvShape,
        work: DType,
    ) -> Result<Tensor> {
        // cuDNN where switched on and able to take the shapes (not empty tensors)
        if let Some(geom) = dnn::in_use().then(|| ConvGeom::new(work, &s)).flatten() {
            return self.conv2d_cudnn(weight, bias, (x, wt, b), s, geom, work);
        }
        let (n, c, h, w, o, oh, ow, g) = (s.n, s.c, s.h, s.w, s.o, s.oh, s.ow, s.groups);
        let (kh, kw) = s.win.kernel;
        let (k, p) = (c * kh * kw, oh * ow);
        let (kg, og) = (k / g, o / g);
        let kc = cuda_ops::KConv::new((n, c), (h, w), (oh, ow), &s.win);
        let ng = crate::no_grad_guard();
        let col = {
            let xs = x.cuda_storage().expect("on the GPU");
            Tensor::from_cuda(cuda_ops::im2col(&xs, x.layout().offset(), &kc)?, &[n, k, p])
        }
        .reshape([n, g, kg, p])?;
        let wm = wt.reshape([g, og, kg])?;
        let mut y = wm.matmul(&col)?.reshape([n, o, p])?;
        if let Some(b) = &b {
            y = y.add(&b.reshape([1, o, 1])?)?;
        }
        let out = y.reshape([n, o, oh, ow])?.to_dtype(self.dtype())?;
        drop(ng);
        Ok(
            self.record_conv2d(weight, bias, out, work, move |gc, need| {
                let gc = gc.reshape([n, g, og, p])?;
                let gx = if need.0 {
                    // [g, kg, og] · [n, g, og, p] = [n, g, kg, p], i.e. [n, k, p]
                    let gcol = wm.transpose(-1, -2)?.matmul(&gc)?.contiguous()?;
                    let st = gcol.cuda_storage().expect("on the GPU");
                    let gx = cuda_ops::col2im(&st, gcol.layout().offset(), &kc)?;
                    Some(Tensor::from_cuda(gx, &[n, c, h, w]))
                } else {
                    None
                };
                // [n, g, og, p] · [n, g, p, kg] summed over n = [g, og, kg]
                let gw = need
                    .1
                    .then(|| gc.matmul(&col.transpose(-1, -2)?)?.sum(0, false))
                    .transpose()?;
                Ok((gx, gw))
            }),
        )
    }

    /// conv2d through cuDNN: the forward pass and both gradients are cuDNN's
    /// convolutions on the same contiguous `work`-dtype operands; the bias is added
    /// (and its gradient summed) by ember as on the im2col path.
    fn conv2d_cudnn(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        (x, wt, b): (Tensor, Tensor, Option<Tensor>),
        s: ConvShape,
        geom: ConvGeom,
        work: DType,
    ) -> Result<Tensor> {
        let (n, c, h, w, o, oh, ow) = (s.n, s.c, s.h, s.w, s.o, s.oh, s.ow);
        let ng = crate::no_grad_guard();
        let y = {
            let (xs, ws) = (x.cuda_storage(), wt.cuda_storage());
            let (xs, ws) = (xs.expect("on the GPU"), ws.expect("on the GPU"));
            let y = dnn::conv_pass(
                ConvPass::Forward,
                &geom,
                (&xs, x.layout().offset()),
                (&ws, wt.layout().offset()),
            )?;
            Tensor::from_cuda(y, &[n, o, oh, ow])
        };
        let y = match &b {
            Some(b) => y.add(&b.reshape([1, o, 1, 1])?)?,
            None => y,
        };
        let out = y.to_dtype(self.dtype())?;
        drop(ng);
        Ok(
            self.record_conv2d(weight, bias, out, work, move |gc, need| {
                let gs = gc.cuda_storage();
                let gs = (gs.as_deref().expect("on the GPU"), gc.layout().offset());
                let gx = if need.0 {
                    let ws = wt.cuda_storage();
                    let ws = (ws.as_deref().expect("on the GPU"), wt.layout().offset());
                    let gx = dnn::conv_pass(ConvPass::BackwardData, &geom, ws, gs)?;
                    Some(Tensor::from_cuda(gx, &[n, c, h, w]))
                } else {
                    None
                };
                let gw = if need.1 {
                    let xs = x.cuda_storage();
                    let xs = (xs.as_deref().expect("on the GPU"), x.layout().offset());
                    let gw = dnn::conv_pass(ConvPass::BackwardFilter, &geom, xs, gs)?;
                    Some(Tensor::from_cuda(gw, &[ConvGeom::numel(geom.w)]))
                } else {
                    None
                };
                Ok((gx, gw))
            }),
        )
    }
}
