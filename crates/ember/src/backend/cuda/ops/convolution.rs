//! conv2d on a GPU from the kernels: the input's patches (im2col) times the weight
//! matrix through cuBLAS, strided-batched products over the samples and groups
//! (group `gi` owns patch rows `gi·K/g ..`, so the patches view as `[n, g, K/g, p]`
//! and the weight as `[g, o/g, K/g]`, shared by the samples without a copy); the
//! backward pass multiplies back and folds the patches' gradient into the input's
//! (col2im). The patches of a large batch would not fit
//! (VGG-16's second convolution at batch 128 makes 14.8 GB of them), so the batch
//! goes through in passes whose patches stay within a budget
//! ([`ConvShape::samples_per_pass`]), each writing its part of the output. Where
//! cuDNN loads and can take the shapes, its convolutions run instead (the
//! default; ember::cuda::cudnn::set_enabled(false) keeps them here), each pass
//! with a workspace of [`ConvShape::library_workspace`] bytes. The bias is added (and, by the tensor
//! layer, its gradient summed) the same way on both paths.

use super::{binary, col2im, fill, im2col, matmul, new_out, reduce, KConv};
use crate::backend::cuda::calls::GemmCall;
use crate::backend::cuda::calls::{ConvCall, ConvGeom, ConvPass};
use crate::backend::cuda::cudnn as dnn;
use crate::backend::cuda::CudaStorage;
use crate::backend::op::{BinaryCode, ConvShape, ReduceCode, Scalar};
use crate::layout::Layout;
use crate::{
    dtype::DType,
    error::{Error, Result},
};

/// `[o]` bias added along the channels of the dense output: `[n, o, p]`, or
/// `[n · p, o]` in channels-last order.
fn add_bias(
    y: CudaStorage,
    (b, lb): (&CudaStorage, &Layout),
    s: &ConvShape,
) -> Result<CudaStorage> {
    let p = s.oh * s.ow;
    let along = lb.strides()[0];
    let (ly, lb) = if s.nhwc {
        let shape: smallvec::SmallVec<[usize; 6]> = smallvec::smallvec![s.n * p, s.o];
        let lb = Layout {
            shape: shape.clone(),
            strides: smallvec::smallvec![0, along],
            offset: lb.offset(),
        };
        (Layout::contiguous(&shape), lb)
    } else {
        let lb = Layout {
            shape: smallvec::smallvec![s.n, s.o, p],
            strides: smallvec::smallvec![0, along, 0],
            offset: lb.offset(),
        };
        (Layout::contiguous(&[s.n, s.o, p]), lb)
    };
    binary(&y, &ly, b, &lb, BinaryCode::Add)
}

/// Whether convolutions of `s` in `dtype` can take channels-last operands here
/// and give a channels-last result without copies: through cuDNN's NHWC
/// descriptors (switched on, and able to take the shapes); ember's own kernels
/// are row-major.
pub(crate) fn conv_takes_channels_last(dtype: DType, s: &ConvShape) -> bool {
    s.library_takes_channels_last(dtype) && dnn::is_available()
}

/// cuDNN's geometry of `s` in `dtype` where the convolution goes to cuDNN
/// (switched on, able to take the shapes, and loaded).
fn cudnn_geom(dtype: DType, s: &ConvShape) -> Option<ConvGeom> {
    (s.through_library(dtype) && dnn::is_available())
        .then(|| ConvGeom::new(dtype, s))
        .flatten()
}

/// The refusal of a channels-last convolution cuDNN does not run.
fn nhwc_needs_cudnn() -> Error {
    Error::invalid(
        "conv2d",
        "channels-last operands go through cuDNN only (switched off, or the shapes are past its limits)",
    )
}

/// Whether f16/bf16 convolutions of `s` run in their own dtype here: through
/// cuDNN (switched on, and able to take the shapes), whose half kernels
/// accumulate in float32; ember's own kernels take float32 and float64 only.
pub(crate) fn conv_takes_half(dtype: DType, s: &ConvShape) -> bool {
    s.library_takes_half(dtype) && dnn::is_available()
}

/// `conv2d(x, w) + b` for contiguous views of one float dtype (dense in
/// channels-last order where `s.nhwc`); the output is `[n, o, oh, ow]`, in the
/// operands' order.
pub(crate) fn conv2d(
    (x, lx): (&CudaStorage, &Layout),
    (w, lw): (&CudaStorage, &Layout),
    b: Option<(&CudaStorage, &Layout)>,
    s: &ConvShape,
) -> Result<CudaStorage> {
    // cuDNN where switched on and able to take the shapes (not empty tensors)
    if let Some(geom) = cudnn_geom(x.dtype(), s) {
        let y = conv_pass(
            ConvPass::Forward,
            (&geom, s),
            (x, lx.offset()),
            (w, lw.offset()),
        )?;
        return match b {
            Some(b) => add_bias(y, b, s),
            None => Ok(y),
        };
    }
    if s.nhwc {
        return Err(nhwc_needs_cudnn());
    }
    let p = s.oh * s.ow;
    let chunk = s.samples_per_pass(x.dtype().size_in_bytes());
    if chunk >= s.n {
        let kc = kconv(s);
        let col = im2col(x, lx.offset(), &kc)?;
        let y = weight_product((w, lw.offset()), false, (&col, 0), s)?;
        return match b {
            Some(b) => add_bias(y, b, s),
            None => Ok(y),
        };
    }
    // in passes of `chunk` samples, each product copied to its place in y
    let dev = x.dev();
    let sz = x.dtype().size_in_bytes();
    let y = new_out(dev, x.dtype(), s.n * s.o * p)?;
    for n0 in (0..s.n).step_by(chunk) {
        let sc = s.with_batch(chunk.min(s.n - n0));
        let col = im2col(x, lx.offset() + n0 * s.c * s.h * s.w, &kconv(&sc))?;
        let part = weight_product((w, lw.offset()), false, (&col, 0), &sc)?;
        drop(col);
        dev.dtod(
            y.ptr() + (n0 * s.o * p * sz) as u64,
            part.ptr(),
            sc.n * s.o * p * sz,
        )?;
    }
    match b {
        Some(b) => add_bias(y, b, s),
        None => Ok(y),
    }
}

/// The im2col geometry of `s`.
fn kconv(s: &ConvShape) -> KConv {
    KConv::new((s.n, s.c), (s.h, s.w), (s.oh, s.ow), &s.win)
}

/// The input and weight gradients of [`conv2d`] from the output's gradient `gy`
/// (dense `[n, o, oh, ow]` in the operands' order), each where `need` asks for it.
pub(crate) fn conv2d_backward(
    (x, lx): (&CudaStorage, &Layout),
    (w, lw): (&CudaStorage, &Layout),
    (gy, lg): (&CudaStorage, &Layout),
    s: &ConvShape,
    need: (bool, bool),
) -> Result<(Option<CudaStorage>, Option<CudaStorage>)> {
    if let Some(geom) = cudnn_geom(x.dtype(), s) {
        let gyo = (gy, lg.offset());
        let gx = need
            .0
            .then(|| conv_pass(ConvPass::BackwardData, (&geom, s), (w, lw.offset()), gyo))
            .transpose()?;
        let gw = need
            .1
            .then(|| conv_pass(ConvPass::BackwardFilter, (&geom, s), (x, lx.offset()), gyo))
            .transpose()?;
        return Ok((gx, gw));
    }
    if s.nhwc {
        return Err(nhwc_needs_cudnn());
    }
    let (g, og, kg, p) = dims(s);
    let chunk = s.samples_per_pass(x.dtype().size_in_bytes());
    if chunk >= s.n {
        let gx = need
            .0
            .then(|| input_grad(w, lw, (gy, lg.offset()), s))
            .transpose()?;
        let gw = need
            .1
            .then(|| weight_grad_part((x, lx.offset()), (gy, lg.offset()), s))
            .transpose()?;
        return Ok((gx, gw));
    }
    // in passes of `chunk` samples: each pass's input gradient copied to its place,
    // the weight gradient summed over the passes
    let dev = x.dev();
    let sz = x.dtype().size_in_bytes();
    let gx = need
        .0
        .then(|| -> Result<CudaStorage> {
            let gx = new_out(dev, x.dtype(), s.n * s.c * s.h * s.w)?;
            for n0 in (0..s.n).step_by(chunk) {
                let sc = s.with_batch(chunk.min(s.n - n0));
                let part = input_grad(w, lw, (gy, lg.offset() + n0 * s.o * p), &sc)?;
                let len = s.c * s.h * s.w;
                dev.dtod(
                    gx.ptr() + (n0 * len * sz) as u64,
                    part.ptr(),
                    sc.n * len * sz,
                )?;
            }
            Ok(gx)
        })
        .transpose()?;
    let gw = need
        .1
        .then(|| -> Result<CudaStorage> {
            let lw = Layout::contiguous(&[g, og, kg]);
            let mut sum: Option<CudaStorage> = None;
            for n0 in (0..s.n).step_by(chunk) {
                let sc = s.with_batch(chunk.min(s.n - n0));
                let xs = (x, lx.offset() + n0 * s.c * s.h * s.w);
                let part = weight_grad_part(xs, (gy, lg.offset() + n0 * s.o * p), &sc)?;
                sum = Some(match sum {
                    None => part,
                    Some(acc) => binary(&acc, &lw, &part, &lw, BinaryCode::Add)?,
                });
            }
            Ok(sum.expect("at least one sample"))
        })
        .transpose()?;
    Ok((gx, gw))
}

/// The input gradient `[n, c, h, w]` of `s`'s samples from their output gradient
/// (contiguous `[n, o, oh, ow]` from element `gy.1`).
fn input_grad(
    w: &CudaStorage,
    lw: &Layout,
    (gy, off): (&CudaStorage, usize),
    s: &ConvShape,
) -> Result<CudaStorage> {
    // [g, kg, og] · [n, g, og, p] = [n, g, kg, p], i.e. [n, k, p]
    let gcol = weight_product((w, lw.offset()), true, (gy, off), s)?;
    col2im(&gcol, 0, &kconv(s))
}

/// The weight gradient `[g, og, kg]` from `s`'s samples: their input (contiguous
/// `[n, c, h, w]` from element `x.1`) and output gradient (from `gy.1`).
fn weight_grad_part(
    (x, xoff): (&CudaStorage, usize),
    (gy, gyoff): (&CudaStorage, usize),
    s: &ConvShape,
) -> Result<CudaStorage> {
    let (g, og, kg, p) = dims(s);
    let lgc = Layout {
        offset: gyoff,
        ..Layout::contiguous(&[s.n, g, og, p])
    };
    // [n, g, og, p] · [n, g, p, kg] summed over n = [g, og, kg]
    let col = im2col(x, xoff, &kconv(s))?;
    let lcolt = Layout::contiguous(&[s.n, g, kg, p]).permute(&[0, 1, 3, 2]);
    let t = matmul(gy, &lgc, &col, &lcolt, (og, p, kg), None)?.expect("a float product");
    drop(col);
    let lt = Layout::contiguous(&[s.n, g, og, kg]);
    reduce(&t, &lt, &[0], ReduceCode::Sum, 0.0, t.dtype())
}

/// (groups, out-channels per group, patch rows per group, output positions).
fn dims(s: &ConvShape) -> (usize, usize, usize, usize) {
    let (kh, kw) = s.win.kernel;
    let g = s.groups;
    (g, s.o / g, s.c * kh * kw / g, s.oh * s.ow)
}

/// The weight `[o, c/g, kh, kw]` (contiguous from element `w.1`), viewed as `[g,
/// og, kg]` (or transposed, `[g, kg, og]`), times every sample's `[g, rows, p]`
/// block of `r` (contiguous `[n, g, rows, p]` from element `r.1`; `rows` is `kg`,
/// or `og` transposed): a new contiguous `[n, g, og, p]` (or `[n, g, kg, p]`).
///
/// The weight is shared by the samples, so the `n · g` products cannot be one
/// strided batch (the weight's offset repeats every `g` products) unless `g` is 1.
/// Rather than copying the weight once per sample, this queues one strided-batched
/// GEMM per group (batched over the samples, the weight's batch stride 0) or one
/// per sample (batched over the groups), whichever makes fewer calls: a single
/// call without groups.
fn weight_product(
    (w, w_off): (&CudaStorage, usize),
    transposed: bool,
    (r, r_off): (&CudaStorage, usize),
    s: &ConvShape,
) -> Result<CudaStorage> {
    let (g, og, kg, p) = dims(s);
    // out[M, p] = W'[M, K] · r[K, p] for each (sample, group)
    let (m, k) = if transposed { (kg, og) } else { (og, kg) };
    let dev = r.dev();
    let dt = r.dtype();
    let sz = dt.size_in_bytes() as u64;
    let len = s.n * g * m * p;
    // cuBLAS takes 32-bit sizes and batch counts
    if [m, k, p, s.n, g].iter().any(|&d| d > i32::MAX as usize) {
        return Err(Error::invalid(
            "conv2d",
            format!(
                "a {m}x{k} by {k}x{p} product per sample and group exceeds cuBLAS's 32-bit \
                 sizes on CUDA; split the input into smaller images"
            ),
        ));
    }
    if k == 0 {
        // no output channels: the input's gradient is zero
        return fill(dev, dt, len, Scalar::Int(0));
    }
    let out = new_out(dev, dt, len)?;
    if len == 0 {
        return Ok(out);
    }
    let w_at = |gi: usize| w.ptr() + (w_off + gi * og * kg) as u64 * sz;
    let r_at = |ni: usize, gi: usize| r.ptr() + (r_off + (ni * g + gi) * k * p) as u64 * sz;
    let out_at = |ni: usize, gi: usize| out.ptr() + ((ni * g + gi) * m * p) as u64 * sz;
    // strides between consecutive products, in elements: (weight, r, out)
    let (per_group, count) = if g <= s.n { (true, g) } else { (false, s.n) };
    let (batch, strides) = if per_group {
        (s.n, (0, g * k * p, g * m * p))
    } else {
        (g, (og * kg, k * p, m * p))
    };
    for i in 0..count {
        let (ni, gi) = if per_group { (0, i) } else { (i, 0) };
        // row-major out = W'·r is column-major outᵀ = rᵀ·W'ᵀ: cuBLAS's A is r
        let call = GemmCall {
            dtype: dt,
            trans_a: false,
            trans_b: transposed,
            m: p as i32,
            n: m as i32,
            k: k as i32,
            a: r_at(ni, gi),
            lda: p as i32,
            stride_a: strides.1 as i64,
            b: w_at(gi),
            // W' is W ([og, kg] row-major) or its transpose: leading dim kg either way
            ldb: kg as i32,
            stride_b: strides.0 as i64,
            c: out_at(ni, gi),
            ldc: p as i32,
            stride_c: strides.2 as i64,
            batch: batch as i32,
            bias: 0,
            accumulate: false,
        };
        // SAFETY: every product's operands lie within `w`'s weight, `r`'s `n · g`
        // blocks of `k · p` and the new `out`, as the offsets and strides above
        // address them (the shapes come from the validated ConvShape).
        unsafe { dev.gemm(&call) }?;
    }
    Ok(out)
}

/// Runs `pass` on two operands (dense from their element offsets, in the
/// geometry's order: `(x, w)`
/// forward, `(w, dy)` for the input gradient, `(x, dy)` for the weight gradient)
/// and returns the third, newly allocated.
pub(crate) fn conv_pass(
    pass: ConvPass,
    (geom, s): (&ConvGeom, &ConvShape),
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
    // the pass's scratch memory, of a size the chosen algorithm does not change
    // (the meta device allocates the same, after the output)
    let bytes = s.library_workspace(geom.dtype.size_in_bytes());
    let workspace = CudaStorage::alloc(dev, DType::U8, bytes)?;
    let call = ConvCall {
        geom: *geom,
        pass,
        x,
        w,
        y,
        workspace: workspace.ptr(),
        workspace_bytes: bytes,
        tf32: dnn::allow_tf32(),
    };
    // SAFETY: each pointer addresses a dense array of its operand's size in the
    // geometry's order: the tensor layer's conv2d checks the shapes and lays the
    // operands out (row-major, or channels-last where `geom.nhwc`); the output
    // and the workspace were just allocated (the workspace goes back to the cache
    // when dropped, to later work on this stream only).
    unsafe { dev.conv(&call)? };
    drop(workspace);
    dnn::count_pass(geom.nhwc);
    Ok(out)
}
