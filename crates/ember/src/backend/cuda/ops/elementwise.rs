//! Kernels of `kernels/elementwise.cu`: fill, copies and casts, unary and binary
//! maps (in place too, and with a scalar by value), comparisons and `where`.

use super::{launch_n, new_out, suffix, KLayout};
use crate::backend::cuda::{CudaDev, CudaStorage};
use crate::backend::op::{BinaryCode, Scalar, UnaryCode};
use crate::layout::Layout;
use crate::{dtype::DType, error::Result};
use std::ffi::c_void;
use std::sync::Arc;

/// A contiguous storage of `n` copies of `value`, converted to `dtype` as a cast
/// converts it (integers exactly, out-of-range integers wrapping like the CPU's).
pub(crate) fn fill(
    dev: &Arc<CudaDev>,
    dtype: DType,
    n: usize,
    value: Scalar,
) -> Result<CudaStorage> {
    let out = new_out(dev, dtype, n)?;
    let name = format!("fill_{}", suffix(dtype));
    let (p, n64) = (out.ptr(), n as i64);
    macro_rules! go {
        ($v:expr) => {{
            let v = $v;
            launch_n(dev, "elementwise", dtype, &name, n, &mut args![p, n64, v])
        }};
    }
    match dtype {
        DType::Bool => go!(value.to::<bool>() as u8),
        DType::U8 => go!(value.to::<u8>()),
        DType::I64 => go!(value.to::<i64>()),
        DType::F16 => go!(value.to::<half::f16>().to_bits()),
        DType::BF16 => go!(value.to::<half::bf16>().to_bits()),
        DType::F32 => go!(value.to::<f32>()),
        DType::F64 => go!(value.to::<f64>()),
    }?;
    Ok(out)
}

/// `first + step · i` for `i` in `0..n`, int64, wrapping around on overflow.
pub(crate) fn iota(dev: &Arc<CudaDev>, n: usize, first: i64, step: i64) -> Result<CudaStorage> {
    let out = new_out(dev, DType::I64, n)?;
    let (p, n64) = (out.ptr(), n as i64);
    launch_n(
        dev,
        "elementwise",
        DType::I64,
        "iota_i64",
        n,
        &mut args![p, n64, first, step],
    )?;
    Ok(out)
}

/// `linspace(start, end, n)` in float64: the first `half` values
/// `fma(step, i, start)`, the others `fma(-step, n - 1 - i, end)`.
pub(crate) fn linspace(
    dev: &Arc<CudaDev>,
    n: usize,
    (start, end, step): (f64, f64, f64),
    half: usize,
) -> Result<CudaStorage> {
    let out = new_out(dev, DType::F64, n)?;
    let (p, n64, h64) = (out.ptr(), n as i64, half as i64);
    launch_n(
        dev,
        "elementwise",
        DType::F64,
        "linspace_f64",
        n,
        &mut args![p, n64, start, end, step, h64],
    )?;
    Ok(out)
}

/// `dst[ld] = src[ls]` for two views of the same shape and dtype.
pub(crate) fn copy(src: &CudaStorage, ls: &Layout, dst: &CudaStorage, ld: &Layout) -> Result<()> {
    let dev = src.dev();
    let n = ls.numel();
    if ls.is_contiguous() && ld.is_contiguous() {
        let sz = src.dtype().size_in_bytes();
        return dev.dtod(
            dst.ptr() + (ld.offset() * sz) as u64,
            src.ptr() + (ls.offset() * sz) as u64,
            n * sz,
        );
    }
    let (kl_s, kl_d) = (
        KLayout::coalesced("copy", ls)?,
        KLayout::coalesced("copy", ld)?,
    );
    let (ps, pd, n64) = (src.ptr(), dst.ptr(), n as i64);
    let name = format!("copy_{}", suffix(src.dtype()));
    launch_n(
        dev,
        "elementwise",
        src.dtype(),
        &name,
        n,
        &mut args![ps, kl_s, pd, kl_d, n64],
    )
}

/// A contiguous copy of the view `l`.
pub(crate) fn contiguous(src: &CudaStorage, l: &Layout) -> Result<CudaStorage> {
    let out = new_out(src.dev(), src.dtype(), l.numel())?;
    copy(src, l, &out, &Layout::contiguous(l.shape()))?;
    Ok(out)
}

/// The view `l` converted to `to`, contiguous.
pub(crate) fn cast(src: &CudaStorage, l: &Layout, to: DType) -> Result<CudaStorage> {
    if to == src.dtype() {
        return contiguous(src, l);
    }
    let n = l.numel();
    let out = new_out(src.dev(), to, n)?;
    let kl = KLayout::coalesced("to_dtype", l)?;
    let (ps, pd, n64) = (src.ptr(), out.ptr(), n as i64);
    let name = format!("cast_{}_{}", suffix(src.dtype()), suffix(to));
    launch_n(
        src.dev(),
        "elementwise",
        src.dtype(),
        &name,
        n,
        &mut args![ps, kl, pd, n64],
    )?;
    Ok(out)
}

/// `op(x)` elementwise into a new contiguous storage.
pub(crate) fn unary(
    x: &CudaStorage,
    l: &Layout,
    op: UnaryCode,
    p0: f64,
    p1: f64,
) -> Result<CudaStorage> {
    let n = l.numel();
    let out = new_out(x.dev(), x.dtype(), n)?;
    let kl = KLayout::coalesced("unary", l)?;
    let (px, po, n64, code) = (x.ptr(), out.ptr(), n as i64, op as i32);
    let name = format!("unary_{}", suffix(x.dtype()));
    launch_n(
        x.dev(),
        "elementwise",
        x.dtype(),
        &name,
        n,
        &mut args![px, kl, po, n64, code, p0, p1],
    )?;
    Ok(out)
}

/// In place: `x[l] = op(x[l])` (`l` does not overlap itself).
pub(crate) fn unary_inplace(
    x: &CudaStorage,
    l: &Layout,
    op: UnaryCode,
    p0: f64,
    p1: f64,
) -> Result<()> {
    let n = l.numel();
    let kl = KLayout::coalesced("unary_", l)?;
    let (px, n64, code) = (x.ptr(), n as i64, op as i32);
    let name = format!("unary_inplace_{}", suffix(x.dtype()));
    launch_n(
        x.dev(),
        "elementwise",
        x.dtype(),
        &name,
        n,
        &mut args![px, kl, n64, code, p0, p1],
    )
}

/// `op(a, b)` over two broadcast views of one shape into a new contiguous storage.
pub(crate) fn binary(
    a: &CudaStorage,
    la: &Layout,
    b: &CudaStorage,
    lb: &Layout,
    op: BinaryCode,
) -> Result<CudaStorage> {
    let n = la.numel();
    let out = new_out(a.dev(), a.dtype(), n)?;
    let (ka, kb) = (
        KLayout::coalesced("binary", la)?,
        KLayout::coalesced("binary", lb)?,
    );
    let (pa, pb, po, n64, code) = (a.ptr(), b.ptr(), out.ptr(), n as i64, op as i32);
    let name = format!("binary_{}", suffix(a.dtype()));
    launch_n(
        a.dev(),
        "elementwise",
        a.dtype(),
        &name,
        n,
        &mut args![pa, ka, pb, kb, po, n64, code],
    )?;
    Ok(out)
}

/// `op(a, s)` elementwise for a scalar `s` passed by value (`sf` for float dtypes,
/// `si` for integers and bools), into a new contiguous storage.
pub(crate) fn binary_scalar(
    a: &CudaStorage,
    la: &Layout,
    op: BinaryCode,
    (sf, si): (f64, i64),
) -> Result<CudaStorage> {
    let n = la.numel();
    let out = new_out(a.dev(), a.dtype(), n)?;
    let ka = KLayout::coalesced("binary", la)?;
    let (pa, po, n64, code) = (a.ptr(), out.ptr(), n as i64, op as i32);
    let name = format!("binary_scalar_{}", suffix(a.dtype()));
    launch_n(
        a.dev(),
        "elementwise",
        a.dtype(),
        &name,
        n,
        &mut args![pa, ka, po, n64, code, sf, si],
    )?;
    Ok(out)
}

/// `a[la] = op(a[la], s)` in place for a scalar `s` (as in [`binary_scalar`]).
pub(crate) fn binary_scalar_inplace(
    a: &CudaStorage,
    la: &Layout,
    op: BinaryCode,
    (sf, si): (f64, i64),
) -> Result<()> {
    let n = la.numel();
    let ka = KLayout::coalesced("binary_", la)?;
    let (pa, n64, code) = (a.ptr(), n as i64, op as i32);
    let name = format!("binary_scalar_inplace_{}", suffix(a.dtype()));
    launch_n(
        a.dev(),
        "elementwise",
        a.dtype(),
        &name,
        n,
        &mut args![pa, ka, n64, code, sf, si],
    )
}

/// A bool storage of `cmp(a, s)` for a scalar `s` (as in [`binary_scalar`]).
pub(crate) fn compare_scalar(
    a: &CudaStorage,
    la: &Layout,
    cmp: i32,
    (sf, si): (f64, i64),
) -> Result<CudaStorage> {
    let n = la.numel();
    let out = new_out(a.dev(), DType::Bool, n)?;
    let ka = KLayout::coalesced("compare", la)?;
    let (pa, po, n64) = (a.ptr(), out.ptr(), n as i64);
    let name = format!("compare_scalar_{}", suffix(a.dtype()));
    launch_n(
        a.dev(),
        "elementwise",
        a.dtype(),
        &name,
        n,
        &mut args![pa, ka, po, n64, cmp, sf, si],
    )?;
    Ok(out)
}

/// `a[la] = op(a[la], b[lb])` in place.
pub(crate) fn binary_inplace(
    a: &CudaStorage,
    la: &Layout,
    b: &CudaStorage,
    lb: &Layout,
    op: BinaryCode,
) -> Result<()> {
    let n = la.numel();
    let (ka, kb) = (
        KLayout::coalesced("binary_", la)?,
        KLayout::coalesced("binary_", lb)?,
    );
    let (pa, pb, n64, code) = (a.ptr(), b.ptr(), n as i64, op as i32);
    let name = format!("binary_inplace_{}", suffix(a.dtype()));
    launch_n(
        a.dev(),
        "elementwise",
        a.dtype(),
        &name,
        n,
        &mut args![pa, ka, pb, kb, n64, code],
    )
}

/// A bool storage of `cmp(a, b)`; `cmp` is `CmpOp as i32` (0 = eq .. 5 = ge).
pub(crate) fn compare(
    a: &CudaStorage,
    la: &Layout,
    b: &CudaStorage,
    lb: &Layout,
    cmp: i32,
) -> Result<CudaStorage> {
    let n = la.numel();
    let out = new_out(a.dev(), DType::Bool, n)?;
    let (ka, kb) = (
        KLayout::coalesced("compare", la)?,
        KLayout::coalesced("compare", lb)?,
    );
    let (pa, pb, po, n64) = (a.ptr(), b.ptr(), out.ptr(), n as i64);
    let name = format!("compare_{}", suffix(a.dtype()));
    launch_n(
        a.dev(),
        "elementwise",
        a.dtype(),
        &name,
        n,
        &mut args![pa, ka, pb, kb, po, n64, cmp],
    )?;
    Ok(out)
}

/// `c ? a : b` over three broadcast views.
pub(crate) fn where_(
    c: &CudaStorage,
    lc: &Layout,
    a: &CudaStorage,
    la: &Layout,
    b: &CudaStorage,
    lb: &Layout,
) -> Result<CudaStorage> {
    let n = la.numel();
    let out = new_out(a.dev(), a.dtype(), n)?;
    let (kc, ka, kb) = (
        KLayout::coalesced("where", lc)?,
        KLayout::coalesced("where", la)?,
        KLayout::coalesced("where", lb)?,
    );
    let (pc, pa, pb, po, n64) = (c.ptr(), a.ptr(), b.ptr(), out.ptr(), n as i64);
    let name = format!("where_{}", suffix(a.dtype()));
    launch_n(
        a.dev(),
        "elementwise",
        a.dtype(),
        &name,
        n,
        &mut args![pc, kc, pa, ka, pb, kb, po, n64],
    )?;
    Ok(out)
}
