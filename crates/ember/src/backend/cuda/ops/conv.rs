//! Kernels of `kernels/conv.cu`: im2col and its adjoint, max and average pooling
//! (forward and backward).

use super::{base_ptr, launch_n, new_out, suffix};
use crate::backend::cuda::CudaStorage;
use crate::{
    dtype::DType,
    error::{Error, Result},
};
use std::ffi::c_void;

/// Geometry of one conv2d or pooling call; mirrors `struct Conv` in kernels/conv.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct KConv {
    pub n: i64,
    pub c: i64,
    pub h: i64,
    pub w: i64,
    pub oh: i64,
    pub ow: i64,
    pub kh: i64,
    pub kw: i64,
    pub sh: i64,
    pub sw: i64,
    pub ph: i64,
    pub pw: i64,
    pub dh: i64,
    pub dw: i64,
    /// Pooling: 1 where the input and output are channels-last (NHWC), else 0.
    pub nhwc: i64,
}

impl KConv {
    /// `planes` (n·c) planes of `hw` pooled or convolved into `o` with window `win`.
    pub fn new(
        (n, c): (usize, usize),
        (h, w): (usize, usize),
        (oh, ow): (usize, usize),
        win: &crate::backend::op::Window,
    ) -> KConv {
        let i = |x: usize| x as i64;
        KConv {
            n: i(n),
            c: i(c),
            h: i(h),
            w: i(w),
            oh: i(oh),
            ow: i(ow),
            kh: i(win.kernel.0),
            kw: i(win.kernel.1),
            sh: i(win.stride.0),
            sw: i(win.stride.1),
            ph: i(win.padding.0),
            pw: i(win.padding.1),
            dh: i(win.dilation.0),
            dw: i(win.dilation.1),
            nhwc: 0,
        }
    }
}

/// The patches of a contiguous `[n, c, h, w]` input (from element `offset`) as
/// `[n, c·kh·kw, oh·ow]` (f32/f64).
pub(crate) fn im2col(x: &CudaStorage, offset: usize, g: &KConv) -> Result<CudaStorage> {
    let n = (g.n * g.c * g.kh * g.kw * g.oh * g.ow) as usize;
    let out = new_out(x.dev(), x.dtype(), n)?;
    let (px, po, gg) = (base_ptr(x, offset), out.ptr(), *g);
    let name = format!("im2col_{}", suffix(x.dtype()));
    launch_n(x.dev(), "conv", x.dtype(), &name, n, &mut args![px, gg, po])?;
    Ok(out)
}

/// The adjoint of [`im2col`]: `[n, c·kh·kw, oh·ow]` patches summed back into
/// `[n, c, h, w]`.
pub(crate) fn col2im(col: &CudaStorage, offset: usize, g: &KConv) -> Result<CudaStorage> {
    let n = (g.n * g.c * g.h * g.w) as usize;
    let out = new_out(col.dev(), col.dtype(), n)?;
    let (pc, po, gg) = (base_ptr(col, offset), out.ptr(), *g);
    let name = format!("col2im_{}", suffix(col.dtype()));
    launch_n(
        col.dev(),
        "conv",
        col.dtype(),
        &name,
        n,
        &mut args![pc, gg, po],
    )?;
    Ok(out)
}

/// Max pooling (with each output's position in its window when `want_index`: u8,
/// or int64 for windows of more than 256 positions, as `index_dtype`) or average
/// pooling of a dense input of any float dtype, row-major or (`g.nhwc`)
/// channels-last; returns (output, index) in the input's order.
pub(crate) fn pool2d(
    x: &CudaStorage,
    offset: usize,
    g: &KConv,
    avg: Option<bool>,
    index_dtype: Option<DType>,
) -> Result<(CudaStorage, Option<CudaStorage>)> {
    let n = (g.n * g.c * g.oh * g.ow) as usize;
    let dev = x.dev();
    let out = new_out(dev, x.dtype(), n)?;
    let (px, po, gg) = (base_ptr(x, offset), out.ptr(), *g);
    let sfx = suffix(x.dtype());
    match avg {
        Some(include_pad) => {
            let ip = include_pad as i32;
            let name = format!("avg_pool_{sfx}");
            launch_n(dev, "conv", x.dtype(), &name, n, &mut args![px, gg, po, ip])?;
            Ok((out, None))
        }
        None => {
            let index = index_dtype.map(|dt| new_out(dev, dt, n)).transpose()?;
            let pi: u64 = index.as_ref().map_or(0, |s| s.ptr());
            let wide = (index_dtype == Some(DType::I64)) as i32;
            let name = format!("max_pool_{sfx}");
            launch_n(
                dev,
                "conv",
                x.dtype(),
                &name,
                n,
                &mut args![px, gg, po, pi, wide],
            )?;
            Ok((out, index))
        }
    }
}

/// The input gradient of [`pool2d`] from the output gradient `gout` (dense, in the
/// input's order):
/// one thread per input element sums the outputs whose windows hold it (no atomics,
/// no zero fill).
pub(crate) fn pool2d_backward(
    gout: &CudaStorage,
    offset: usize,
    index: Option<&CudaStorage>,
    g: &KConv,
    avg: Option<bool>,
) -> Result<CudaStorage> {
    let dev = gout.dev();
    let n_in = (g.n * g.c * g.h * g.w) as usize;
    let gx = new_out(dev, gout.dtype(), n_in)?;
    let (pg, px, gg) = (base_ptr(gout, offset), gx.ptr(), *g);
    let sfx = suffix(gout.dtype());
    match (avg, index) {
        (Some(include_pad), _) => {
            let ip = include_pad as i32;
            let name = format!("avg_pool_back_{sfx}");
            launch_n(
                dev,
                "conv",
                gout.dtype(),
                &name,
                n_in,
                &mut args![pg, gg, px, ip],
            )?;
        }
        (None, Some(idx)) => {
            let (pi, wide) = (idx.ptr(), (idx.dtype() == DType::I64) as i32);
            let name = format!("max_pool_back_{sfx}");
            launch_n(
                dev,
                "conv",
                gout.dtype(),
                &name,
                n_in,
                &mut args![pg, pi, wide, gg, px],
            )?;
        }
        (None, None) => {
            return Err(Error::invalid(
                "max_pool2d backward",
                "the forward pass kept no indices",
            ))
        }
    }
    Ok(gx)
}
