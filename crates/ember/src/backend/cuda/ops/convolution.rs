//! conv2d on a GPU from the kernels: the input's patches (im2col) times the weight
//! matrix through cuBLAS, one batched product over the groups (group `gi` owns
//! patch rows `gi·K/g ..`, so the patches view as `[n, g, K/g, p]` and the weight
//! as `[g, o/g, K/g]`); the backward pass multiplies back and folds the patches'
//! gradient into the input's (col2im). Where cuDNN is switched on and can take the
//! shapes, its convolutions run instead. The bias is added (and, by the tensor
//! layer, its gradient summed) the same way on both paths.

use super::{binary, col2im, im2col, matmul, reduce, KConv};
use crate::backend::cuda::calls::{ConvCall, ConvGeom, ConvPass};
use crate::backend::cuda::cudnn as dnn;
use crate::backend::cuda::CudaStorage;
use crate::backend::op::{BinaryCode, ConvShape, ReduceCode};
use crate::layout::Layout;
use crate::Result;

/// `[o]` bias added along the channels of the contiguous `[n, o, p]` output.
fn add_bias(
    y: CudaStorage,
    (b, lb): (&CudaStorage, &Layout),
    s: &ConvShape,
) -> Result<CudaStorage> {
    let p = s.oh * s.ow;
    let ly = Layout::contiguous(&[s.n, s.o, p]);
    let lb = Layout {
        shape: smallvec::smallvec![s.n, s.o, p],
        strides: smallvec::smallvec![0, lb.strides()[0], 0],
        offset: lb.offset(),
    };
    binary(&y, &ly, b, &lb, BinaryCode::Add)
}

/// `conv2d(x, w) + b` for contiguous views of one float dtype; the output is
/// `[n, o, oh, ow]`.
pub(crate) fn conv2d(
    (x, lx): (&CudaStorage, &Layout),
    (w, lw): (&CudaStorage, &Layout),
    b: Option<(&CudaStorage, &Layout)>,
    s: &ConvShape,
) -> Result<CudaStorage> {
    // cuDNN where switched on and able to take the shapes (not empty tensors)
    if let Some(geom) = dnn::in_use().then(|| ConvGeom::new(x.dtype(), s)).flatten() {
        let y = conv_pass(ConvPass::Forward, &geom, (x, lx.offset()), (w, lw.offset()))?;
        return match b {
            Some(b) => add_bias(y, b, s),
            None => Ok(y),
        };
    }
    let (g, og, kg, p) = dims(s);
    let kc = KConv::new((s.n, s.c), (s.h, s.w), (s.oh, s.ow), &s.win);
    let col = im2col(x, lx.offset(), &kc)?;
    // [g, og, kg] (the same weight for every sample) · [n, g, kg, p] = [n, g, og, p]
    let lwm = weight_layout(lw, s, false)?;
    let lcol = Layout::contiguous(&[s.n, g, kg, p]);
    let y = matmul(w, &lwm, &col, &lcol, og, kg, p)?.expect("a float product");
    match b {
        Some(b) => add_bias(y, b, s),
        None => Ok(y),
    }
}

/// The input and weight gradients of [`conv2d`] from the output's gradient `gy`
/// (contiguous `[n, o, oh, ow]`), each where `need` asks for it.
pub(crate) fn conv2d_backward(
    (x, lx): (&CudaStorage, &Layout),
    (w, lw): (&CudaStorage, &Layout),
    (gy, lg): (&CudaStorage, &Layout),
    s: &ConvShape,
    need: (bool, bool),
) -> Result<(Option<CudaStorage>, Option<CudaStorage>)> {
    if let Some(geom) = dnn::in_use().then(|| ConvGeom::new(x.dtype(), s)).flatten() {
        let gyo = (gy, lg.offset());
        let gx = need
            .0
            .then(|| conv_pass(ConvPass::BackwardData, &geom, (w, lw.offset()), gyo))
            .transpose()?;
        let gw = need
            .1
            .then(|| conv_pass(ConvPass::BackwardFilter, &geom, (x, lx.offset()), gyo))
            .transpose()?;
        return Ok((gx, gw));
    }
    let (g, og, kg, p) = dims(s);
    let kc = KConv::new((s.n, s.c), (s.h, s.w), (s.oh, s.ow), &s.win);
    let lgc = Layout {
        offset: lg.offset(),
        ..Layout::contiguous(&[s.n, g, og, p])
    };
    let gx = if need.0 {
        // [g, kg, og] · [n, g, og, p] = [n, g, kg, p], i.e. [n, k, p]
        let lwt = weight_layout(lw, s, true)?;
        let gcol = matmul(w, &lwt, gy, &lgc, kg, og, p)?.expect("a float product");
        Some(col2im(&gcol, 0, &kc)?)
    } else {
        None
    };
    let gw = if need.1 {
        // [n, g, og, p] · [n, g, p, kg] summed over n = [g, og, kg]
        let col = im2col(x, lx.offset(), &kc)?;
        let lcolt = Layout::contiguous(&[s.n, g, kg, p]).permute(&[0, 1, 3, 2]);
        let t = matmul(gy, &lgc, &col, &lcolt, og, p, kg)?.expect("a float product");
        let lt = Layout::contiguous(&[s.n, g, og, kg]);
        Some(reduce(&t, &lt, &[0], ReduceCode::Sum, 0.0, t.dtype())?)
    } else {
        None
    };
    Ok((gx, gw))
}

/// (groups, out-channels per group, patch rows per group, output positions).
fn dims(s: &ConvShape) -> (usize, usize, usize, usize) {
    let (kh, kw) = s.win.kernel;
    let g = s.groups;
    (g, s.o / g, s.c * kh * kw / g, s.oh * s.ow)
}

/// The weight `[o, c/g, kh, kw]` viewed as `[g, og, kg]` (or transposed,
/// `[g, kg, og]`), broadcast over the batch: `[n, g, .., ..]`.
fn weight_layout(lw: &Layout, s: &ConvShape, transposed: bool) -> Result<Layout> {
    let (g, og, kg, _) = dims(s);
    let mut l = Layout {
        offset: lw.offset(),
        ..Layout::contiguous(&[g, og, kg])
    };
    if transposed {
        l = l.permute(&[0, 2, 1]);
    }
    let mut shape = vec![s.n];
    shape.extend_from_slice(l.shape());
    l.broadcast_to("conv2d", &shape)
}

/// Runs `pass` on two operands (contiguous from their element offsets: `(x, w)`
/// forward, `(w, dy)` for the input gradient, `(x, dy)` for the weight gradient)
/// and returns the third, newly allocated.
pub(crate) fn conv_pass(
    pass: ConvPass,
    geom: &ConvGeom,
    (a, a_off): (&CudaStorage, usize),
    (b, b_off): (&CudaStorage, usize),
) -> Result<CudaStorage> {
    let dev = a.dev();
    let at = |s: &CudaStorage, off: usize| s.ptr() + (off * s.dtype().size_in_bytes()) as u64;
    let (pa, pb) = (at(a, a_off), at(b, b_off));
    let out = CudaStorage::alloc(dev, geom.dtype, ConvGeom::numel(geom.written(pass)))?;
    let po = out.ptr();
    let (x, w, y) = match pass {
        ConvPass::Forward => (pa, pb, po),
        ConvPass::BackwardData => (po, pa, pb),
        ConvPass::BackwardFilter => (pa, po, pb),
    };
    let call = ConvCall {
        geom: *geom,
        pass,
        x,
        w,
        y,
    };
    // SAFETY: each pointer addresses a contiguous array of its operand's size: the
    // inputs are contiguous tensors of these shapes (checked by conv2d) and the
    // output was just allocated.
    unsafe { dev.conv(&call)? };
    dnn::count_pass();
    Ok(out)
}
