//! Kernels of `kernels/nn.cu`: the index ops, integer matrix products and the
//! fused Adam step.

use super::{base_ptr, fill, launch_lists, launch_n, new_out, suffix, KLayout, ListTensor};
use crate::backend::cuda::CudaStorage;
use crate::backend::op::Scalar;
use crate::layout::Layout;
use crate::{dtype::DType, error::Result};
use std::ffi::c_void;

/// `index_select(src, dim, idx)`: `idx` is a contiguous i64 storage of `n_idx`
/// valid indices.
pub(crate) fn index_select(
    src: &CudaStorage,
    l: &Layout,
    dim: usize,
    idx: &CudaStorage,
    n_idx: usize,
) -> Result<CudaStorage> {
    let mut shape = l.shape().to_vec();
    shape[dim] = n_idx;
    let mut strides = l.strides().to_vec();
    let dim_stride = strides[dim] as i64;
    strides[dim] = 0;
    let n: usize = shape.iter().product();
    let kl = KLayout::from_parts("index_select", &shape, &strides, l.offset(), false)?;
    let out = new_out(src.dev(), src.dtype(), n)?;
    let (ps, pi, po, n64, d) = (src.ptr(), idx.ptr(), out.ptr(), n as i64, dim as i32);
    let name = format!("index_select_{}", suffix(src.dtype()));
    launch_n(
        src.dev(),
        "nn",
        src.dtype(),
        &name,
        n,
        &mut args![ps, kl, dim_stride, d, pi, po, n64],
    )?;
    Ok(out)
}

/// `idx`'s values, contiguous, checked to lie in `[-size, size)` (`[0, size)`
/// without `negative`) and wrapped to `[0, size)`, on the device: a bad index is
/// reported as `op`'s error at the device's next synchronisation (the way
/// PyTorch's device-side asserts surface), not by a copy to the host now.
pub(crate) fn check_indices(
    idx: &CudaStorage,
    l: &Layout,
    op: &'static str,
    dim: usize,
    size: usize,
    negative: bool,
) -> Result<CudaStorage> {
    let n = l.numel();
    let out = new_out(idx.dev(), DType::I64, n)?;
    if n == 0 {
        return Ok(out);
    }
    let kl = KLayout::new(op, l)?;
    let (pi, po, sz, neg, n64) = (idx.ptr(), out.ptr(), size as i64, negative as i32, n as i64);
    idx.dev().index_check(op, dim, size, |flag| {
        launch_n(
            idx.dev(),
            "nn",
            DType::I64,
            "check_indices",
            n,
            &mut args![pi, kl, po, sz, neg, flag, n64],
        )
    })?;
    Ok(out)
}

/// `gather(src, dim, idx)` with `idx` contiguous of shape `ishape`.
pub(crate) fn gather(
    src: &CudaStorage,
    l: &Layout,
    dim: usize,
    idx: &CudaStorage,
    ishape: &[usize],
) -> Result<CudaStorage> {
    let mut strides = l.strides()[..ishape.len()].to_vec();
    let dim_stride = strides[dim] as i64;
    strides[dim] = 0;
    let n: usize = ishape.iter().product();
    let kl = KLayout::from_parts("gather", ishape, &strides, l.offset(), false)?;
    let out = new_out(src.dev(), src.dtype(), n)?;
    let (ps, pi, po, n64) = (src.ptr(), idx.ptr(), out.ptr(), n as i64);
    let name = format!("gather_{}", suffix(src.dtype()));
    launch_n(
        src.dev(),
        "nn",
        src.dtype(),
        &name,
        n,
        &mut args![ps, kl, dim_stride, pi, po, n64],
    )?;
    Ok(out)
}

/// In place on the contiguous `dst` of shape `dshape`:
/// `dst[p with dim replaced by idx[p]] += src[p]` over idx's shape.
pub(crate) fn scatter_add(
    dst: &CudaStorage,
    dshape: &[usize],
    dim: usize,
    idx: &CudaStorage,
    ishape: &[usize],
    src: &CudaStorage,
    ls: &Layout,
) -> Result<()> {
    let mut ds = crate::layout::contiguous_strides(dshape).to_vec();
    let dim_stride = ds[dim] as i64;
    ds[dim] = 0;
    let n: usize = ishape.iter().product();
    let kd = KLayout::from_parts("scatter_add", ishape, &ds, 0, false)?;
    let ks = KLayout::from_parts(
        "scatter_add",
        ishape,
        &ls.strides()[..ishape.len()],
        ls.offset(),
        false,
    )?;
    let (pd, pi, ps, n64) = (dst.ptr(), idx.ptr(), src.ptr(), n as i64);
    let name = format!("scatter_add_{}", suffix(dst.dtype()));
    launch_n(
        dst.dev(),
        "nn",
        dst.dtype(),
        &name,
        n,
        &mut args![pd, kd, dim_stride, pi, ps, ks, n64],
    )
}

/// `dst[.., idx[j], ..] += src[.., j, ..]` along `dim` of the contiguous `dst`
/// from the contiguous view `ls` of `src` (one thread per source element,
/// atomic adds: indices may repeat).
pub(crate) fn index_add(
    dst: &CudaStorage,
    dshape: &[usize],
    dim: usize,
    idx: &CudaStorage,
    src: &CudaStorage,
    ls: &Layout,
) -> Result<()> {
    let n = ls.numel();
    if n == 0 {
        return Ok(());
    }
    let mut ds = crate::layout::contiguous_strides(dshape).to_vec();
    let dim_stride = ds[dim] as i64;
    ds[dim] = 0;
    let kd = KLayout::from_parts("index_add", ls.shape(), &ds, 0, false)?;
    let src_at = base_ptr(src, ls.offset());
    let (pd, pi, n64, d) = (dst.ptr(), idx.ptr(), n as i64, dim as i32);
    let name = format!("index_add_{}", suffix(dst.dtype()));
    launch_n(
        dst.dev(),
        "nn",
        dst.dtype(),
        &name,
        n,
        &mut args![pd, kd, dim_stride, pi, d, src_at, n64],
    )
}

/// One Adam step on contiguous f32/f64 storages (offsets in elements).
#[allow(clippy::too_many_arguments)]
pub(crate) fn adam(
    p: (&CudaStorage, usize),
    g: (&CudaStorage, usize),
    m: (&CudaStorage, usize),
    v: (&CudaStorage, usize),
    n: usize,
    h: &crate::backend::op::AdamStep,
) -> Result<()> {
    let sz = p.0.dtype().size_in_bytes() as u64;
    let at = |s: (&CudaStorage, usize)| s.0.ptr() + s.1 as u64 * sz;
    let (pp, pg, pm, pv) = (at(p), at(g), at(m), at(v));
    let n64 = n as i64;
    let dec = h.decoupled as i32;
    let name = format!("adam_{}", suffix(p.0.dtype()));
    launch_n(
        p.0.dev(),
        "nn",
        p.0.dtype(),
        &name,
        n,
        &mut args![
            pp,
            pg,
            pm,
            pv,
            n64,
            h.lr,
            h.b1,
            h.b2,
            h.eps,
            h.bc1,
            h.bc2,
            h.weight_decay,
            dec
        ],
    )
}

/// One Adam step over many tensors of one dtype on `dev` (each a [`ListTensor`]
/// with its parameter, gradient and two moments), in launches of up to 48
/// tensors (PyTorch's `foreach`/multi-tensor form): the same arithmetic, element
/// by element, as [`adam`], so the results are the same bits.
pub(crate) fn adam_multi(
    dev: &std::sync::Arc<crate::backend::cuda::CudaDev>,
    dtype: DType,
    tensors: &[ListTensor],
    h: &crate::backend::op::AdamStep,
    step: Option<&CudaStorage>,
) -> Result<()> {
    let name = format!("adam_multi_{}", suffix(dtype));
    let dec = h.decoupled as i32;
    let (lr, b1, b2, eps, bc1, bc2, wd) = (h.lr, h.b1, h.b2, h.eps, h.bc1, h.bc2, h.weight_decay);
    // the capturable form's step count (a float64 scalar), or null
    let step = step.map_or(0u64, |s| s.ptr());
    launch_lists(
        dev,
        ("nn", dtype, &name),
        tensors,
        &args![step, lr, b1, b2, eps, bc1, bc2, wd, dec],
    )
}

/// One SGD step over many tensors of one dtype on `dev` (each a [`ListTensor`]
/// with its parameter, gradient and momentum buffer, flagged at the buffer's
/// first step), in launches of up to 48 tensors.
pub(crate) fn sgd_multi(
    dev: &std::sync::Arc<crate::backend::cuda::CudaDev>,
    dtype: DType,
    tensors: &[ListTensor],
    h: &crate::backend::op::SgdStep,
) -> Result<()> {
    let name = format!("sgd_multi_{}", suffix(dtype));
    let nesterov = h.nesterov as i32;
    let (lr, momentum, dampening, wd) = (h.lr, h.momentum, h.dampening, h.weight_decay);
    launch_lists(
        dev,
        ("nn", dtype, &name),
        tensors,
        &args![lr, momentum, dampening, wd, nesterov],
    )
}

/// `a · b` for integer dtypes with ember's kernel: `(batch, m, k, n)` sizes over the
/// broadcast layouts `la` (batch + [m, k]) and `lb` (batch + [k, n]).
pub(crate) fn matmul_int(
    a: &CudaStorage,
    la: &Layout,
    b: &CudaStorage,
    lb: &Layout,
    (batch, m, k, n): (usize, usize, usize, usize),
) -> Result<CudaStorage> {
    let total = batch * m * n;
    if k == 0 {
        return fill(a.dev(), a.dtype(), total, Scalar::Int(0));
    }
    let out = new_out(a.dev(), a.dtype(), total)?;
    let (ka, kb) = (KLayout::new("matmul", la)?, KLayout::new("matmul", lb)?);
    let (pa, pb, po) = (a.ptr(), b.ptr(), out.ptr());
    let (m64, k64, n64, t64) = (m as i64, k as i64, n as i64, total as i64);
    let name = format!("matmul_int_{}", suffix(a.dtype()));
    launch_n(
        a.dev(),
        "nn",
        a.dtype(),
        &name,
        total,
        &mut args![pa, ka, pb, kb, po, m64, k64, n64, t64],
    )?;
    Ok(out)
}
