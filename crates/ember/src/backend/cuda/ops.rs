//! Launching ember's kernels on CUDA storage. Each function validates nothing the
//! tensor layer has already checked (shapes, dtypes, devices); it only builds the
//! by-value layout structs and the launch configuration.

use super::{CudaDev, CudaStorage};
use crate::backend::op::{BinaryCode, ReduceCode, UnaryCode};
use crate::layout::Layout;
use crate::{DType, Error, Result};
use std::ffi::c_void;
use std::sync::Arc;

/// Most dimensions a layout passed to a kernel may have (`EMBER_MAX_RANK`).
pub(crate) const MAX_RANK: usize = 8;

/// A strided view passed to kernels by value; mirrors `struct Layout` in
/// kernels/common.cuh.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct KLayout {
    rank: i32,
    contiguous: i32,
    offset: i64,
    shape: [i64; MAX_RANK],
    strides: [i64; MAX_RANK],
}

impl KLayout {
    pub fn new(op: &'static str, l: &Layout) -> Result<KLayout> {
        KLayout::from_parts(op, l.shape(), l.strides(), l.offset(), l.is_contiguous())
    }

    pub fn from_parts(
        op: &'static str,
        shape: &[usize],
        strides: &[usize],
        offset: usize,
        contiguous: bool,
    ) -> Result<KLayout> {
        if shape.len() > MAX_RANK {
            return Err(Error::invalid(
                op,
                format!(
                    "tensors of more than {MAX_RANK} dimensions are not supported on CUDA (got {})",
                    shape.len()
                ),
            ));
        }
        let mut k = KLayout {
            rank: shape.len() as i32,
            contiguous: contiguous as i32,
            offset: offset as i64,
            shape: [1; MAX_RANK],
            strides: [0; MAX_RANK],
        };
        for (i, (&n, &s)) in shape.iter().zip(strides).enumerate() {
            k.shape[i] = n as i64;
            k.strides[i] = s as i64;
        }
        Ok(k)
    }
}

/// The kernel-name suffix of a dtype.
pub(crate) fn suffix(dt: DType) -> &'static str {
    match dt {
        DType::Bool => "bool",
        DType::U8 => "u8",
        DType::I64 => "i64",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::F32 => "f32",
        DType::F64 => "f64",
    }
}

const THREADS: u32 = 256;

/// A kernel argument: a pointer to the value, as cuLaunchKernel wants.
macro_rules! args {
    ($($x:expr),* $(,)?) => {
        [$(&$x as *const _ as *mut c_void),*]
    };
}

/// Launches `module::name` over `n` elements (1-D grid-stride).
fn launch_n(
    dev: &CudaDev,
    module: &'static str,
    dtype: DType,
    name: &str,
    n: usize,
    params: &mut [*mut c_void],
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let f = dev.func(module, dtype, name)?;
    let grid = dev.grid_for(n, THREADS);
    // SAFETY: the callers pass parameters matching the kernel signatures in
    // kernels/*.cu, with device pointers to storage that holds the addressed elements.
    unsafe { dev.launch(f, (grid, 1, 1), (THREADS, 1, 1), 0, params) }
}

fn new_out(dev: &Arc<CudaDev>, dtype: DType, n: usize) -> Result<CudaStorage> {
    CudaStorage::alloc(dev, dtype, n)
}

/// A contiguous storage of `n` copies of `value` (given as the dtype's bits).
pub(crate) fn fill(dev: &Arc<CudaDev>, dtype: DType, n: usize, value: f64) -> Result<CudaStorage> {
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
        DType::Bool => go!((value != 0.0) as u8),
        DType::U8 => go!(value as u8),
        DType::I64 => go!(value as i64),
        DType::F16 => go!(half::f16::from_f64(value).to_bits()),
        DType::BF16 => go!(half::bf16::from_f64(value).to_bits()),
        DType::F32 => go!(value as f32),
        DType::F64 => go!(value),
    }?;
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
    let (kl_s, kl_d) = (KLayout::new("copy", ls)?, KLayout::new("copy", ld)?);
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
    let kl = KLayout::new("to_dtype", l)?;
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
    let kl = KLayout::new("unary", l)?;
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
    let (ka, kb) = (KLayout::new("binary", la)?, KLayout::new("binary", lb)?);
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
    let ka = KLayout::new("binary", la)?;
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
    let ka = KLayout::new("binary_", la)?;
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
    let ka = KLayout::new("compare", la)?;
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
    let (ka, kb) = (KLayout::new("binary_", la)?, KLayout::new("binary_", lb)?);
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
    let (ka, kb) = (KLayout::new("compare", la)?, KLayout::new("compare", lb)?);
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
        KLayout::new("where", lc)?,
        KLayout::new("where", la)?,
        KLayout::new("where", lb)?,
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

/// Reduces the view `l` over `dims` (sorted, unique) with `op`; `out_dtype` is the
/// dtype itself or i64 (integer sums, arg-reductions). The output is contiguous over
/// the kept dims.
pub(crate) fn reduce(
    x: &CudaStorage,
    l: &Layout,
    dims: &[usize],
    op: ReduceCode,
    correction: f64,
    out_dtype: DType,
) -> Result<CudaStorage> {
    let rank = l.rank();
    let n_out: usize = (0..rank)
        .filter(|d| !dims.contains(d))
        .map(|d| l.shape()[d])
        .product();
    let lane: usize = dims.iter().map(|&d| l.shape()[d]).product();
    let dev = x.dev();
    let out = new_out(dev, out_dtype, n_out)?;
    if n_out == 0 {
        return Ok(out);
    }
    // sums and means over the leading dims of a contiguous array: by columns
    if matches!(op, ReduceCode::Sum | ReduceCode::Mean)
        && l.is_contiguous()
        && crate::layout::are_leading(dims)
        && dims.len() < rank
        && lane > 0
    {
        let divisor = if op == ReduceCode::Mean {
            lane as f64
        } else {
            1.0
        };
        col_sum(x, l.offset(), lane, n_out, divisor, out_dtype, &out)?;
        return Ok(out);
    }
    // permute the reduced dims to the end: output o reduces the lane o*lane..
    let perm: Vec<usize> = (0..rank)
        .filter(|d| !dims.contains(d))
        .chain(dims.iter().copied())
        .collect();
    let shape: Vec<usize> = perm.iter().map(|&d| l.shape()[d]).collect();
    let strides: Vec<usize> = perm.iter().map(|&d| l.strides()[d]).collect();
    let contiguous = l.is_contiguous() && perm.iter().enumerate().all(|(i, &d)| i == d);
    let kl = KLayout::from_parts("reduce", &shape, &strides, l.offset(), contiguous)?;
    let i64_out = out_dtype != x.dtype();
    let name = |kind: &str| out_kernel(&format!("reduce{kind}"), x.dtype(), i64_out);
    let (px, po, no, ln, code) = (x.ptr(), out.ptr(), n_out as i64, lane as i64, op as i32);
    let cap = |blocks: usize| blocks.clamp(1, 65535 * 32) as u32;
    match reduce_plan(n_out, lane, dev.sm_count as usize) {
        ReducePlan::WarpPerOutput => {
            let f = dev.func("reduce", x.dtype(), &name("_warp"))?;
            let mut p = args![px, kl, po, no, ln, code, correction];
            let grid = cap(n_out.div_ceil(THREADS as usize / 32));
            // SAFETY: parameters match `reduce_warp_<T>[_i64]` in kernels/reduce.cu.
            unsafe { dev.launch(f, (grid, 1, 1), (THREADS, 1, 1), 0, &mut p) }?;
        }
        ReducePlan::BlockPerOutput => {
            let f = dev.func("reduce", x.dtype(), &name(""))?;
            let mut p = args![px, kl, po, no, ln, code, correction];
            // SAFETY: parameters match `reduce_<T>[_i64]` in kernels/reduce.cu.
            unsafe { dev.launch(f, (cap(n_out), 1, 1), (THREADS, 1, 1), 0, &mut p) }?;
        }
        ReducePlan::Split(splits) => {
            let slots = n_out * splits;
            // three arrays of `slots` 8-byte entries: values (the accumulator type,
            // at most 8 bytes), indices or counts, and the variance's M2
            let partials = CudaStorage::alloc(dev, DType::I64, 3 * slots)?;
            let pv = partials.ptr();
            let (pi, pm) = (pv + 8 * slots as u64, pv + 16 * slots as u64);
            let sp = splits as i64;
            let f = dev.func(
                "reduce",
                x.dtype(),
                &out_kernel("reduce_partial", x.dtype(), false),
            )?;
            let mut p = args![px, kl, no, ln, sp, code, pv, pi, pm];
            // SAFETY: parameters match `reduce_partial_<T>`; the partial arrays hold
            // `slots` entries each.
            unsafe { dev.launch(f, (cap(slots), 1, 1), (THREADS, 1, 1), 0, &mut p) }?;
            let f = dev.func("reduce", x.dtype(), &name("_finish"))?;
            let mut p = args![pv, pi, pm, po, no, ln, sp, code, correction];
            // SAFETY: parameters match `reduce_finish_<T>[_i64]`; `partials` is
            // freed after both launches, in stream order.
            unsafe { dev.launch(f, (cap(n_out), 1, 1), (THREADS, 1, 1), 0, &mut p) }?;
        }
    }
    Ok(out)
}

/// `out[c] = sum over r of x[r * cols + c] / divisor` for the contiguous
/// `[rows, cols]` array at element `offset` of `x` (`col_sum_<T>` in reduce.cu).
/// When the column tiles alone would leave the GPU idle, the rows are split over
/// several block rows whose partials (in the accumulation type) a second launch
/// sums.
fn col_sum(
    x: &CudaStorage,
    offset: usize,
    rows: usize,
    cols: usize,
    divisor: f64,
    out_dtype: DType,
    out: &CudaStorage,
) -> Result<()> {
    const COL_W: usize = 32;
    const COL_H: u32 = 8;
    let dev = x.dev();
    let (dt, i64_out) = (x.dtype(), out_dtype != x.dtype());
    let px = x.ptr() + (offset * x.dtype().size_in_bytes()) as u64;
    let tiles = cols.div_ceil(COL_W);
    let busy = dev.sm_count.max(1) as usize * 4;
    // each block row takes at least 64 rows
    let splits = busy.div_ceil(tiles).min(rows.div_ceil(64)).clamp(1, 65535);
    // gridDim.x is at most 2^31 - 1
    let grid_x = i32::try_from(tiles)
        .map(|t| t as u32)
        .map_err(|_| Error::invalid("sum", format!("{cols} columns exceed the GPU's grid")))?;
    let (r, c) = (rows as i64, cols as i64);
    let block = (COL_W as u32, COL_H, 1);
    if splits == 1 {
        let f = dev.func("reduce", dt, &out_kernel("col_sum", dt, i64_out))?;
        let po = out.ptr();
        let mut p = args![px, po, r, c, divisor];
        // SAFETY: parameters match `col_sum_<T>[_i64]`; `x` holds rows * cols
        // elements from `offset`, `out` holds cols.
        return unsafe { dev.launch(f, (grid_x, 1, 1), block, 0, &mut p) };
    }
    // partials: `splits` rows of `cols` values in the accumulation type (at most
    // 8 bytes each)
    let partials = CudaStorage::alloc(dev, DType::I64, splits * cols)?;
    let pp = partials.ptr();
    let one = 1.0f64;
    let f = dev.func("reduce", dt, &format!("col_sum_{}_acc", suffix(dt)))?;
    let mut p = args![px, pp, r, c, one];
    // SAFETY: parameters match `col_sum_<T>_acc`; the partials hold splits * cols.
    unsafe { dev.launch(f, (grid_x, splits as u32, 1), block, 0, &mut p) }?;
    let f = dev.func("reduce", dt, &out_kernel("col_sum_acc", dt, i64_out))?;
    let (po, sr) = (out.ptr(), splits as i64);
    let mut p = args![pp, po, sr, c, divisor];
    // SAFETY: parameters match `col_sum_acc_<T>[_i64]`; `partials` is freed after
    // both launches, in stream order.
    unsafe { dev.launch(f, (grid_x, 1, 1), block, 0, &mut p) }
}

/// The name of kernel `base` for input `dtype`: `{base}_{suffix}`, with `_i64` for
/// the instance that writes int64 (integer sums, arg-reductions).
fn out_kernel(base: &str, dtype: DType, i64_out: bool) -> String {
    let tail = if i64_out { "_i64" } else { "" };
    format!("{base}_{}{tail}", suffix(dtype))
}

/// How a reduction of `n_out` outputs over lanes of `lane` elements is spread over
/// a GPU with `sm_count` multiprocessors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReducePlan {
    /// Short lanes, enough of them: a warp per output (a block would leave most of
    /// its threads idle).
    WarpPerOutput,
    /// A block per output.
    BlockPerOutput,
    /// Few outputs over long lanes (a full sum): each lane in this many chunks,
    /// reduced by separate blocks and then combined.
    Split(usize),
}

fn reduce_plan(n_out: usize, lane: usize, sm_count: usize) -> ReducePlan {
    /// Lanes up to this long go a warp per output.
    const WARP_LANE: usize = 512;
    /// The fewest elements a chunk of a split lane holds.
    const MIN_CHUNK: usize = 8192;
    // blocks that keep every multiprocessor busy
    let busy = sm_count.max(1) * 4;
    if lane <= WARP_LANE && n_out >= sm_count {
        ReducePlan::WarpPerOutput
    } else if n_out < busy && lane >= 2 * MIN_CHUNK {
        ReducePlan::Split(busy.div_ceil(n_out).min(lane / MIN_CHUNK))
    } else {
        ReducePlan::BlockPerOutput
    }
}

/// Softmax or log-softmax over the rows of a contiguous view of `rows * cols`
/// elements starting at `offset`.
pub(crate) fn softmax_rows(
    x: &CudaStorage,
    offset: usize,
    rows: usize,
    cols: usize,
    log: bool,
) -> Result<CudaStorage> {
    let dev = x.dev();
    let out = new_out(dev, x.dtype(), rows * cols)?;
    if rows * cols == 0 {
        return Ok(out);
    }
    let f = dev.func(
        "reduce",
        x.dtype(),
        &format!("softmax_{}", suffix(x.dtype())),
    )?;
    let px = x.ptr() + (offset * x.dtype().size_in_bytes()) as u64;
    let (po, r, c, lg) = (out.ptr(), rows as i64, cols as i64, log as i32);
    let mut p = args![px, po, r, c, lg];
    let grid = rows.min(65535 * 32) as u32;
    // SAFETY: parameters match `softmax_<T>`.
    unsafe { dev.launch(f, (grid, 1, 1), (THREADS, 1, 1), 0, &mut p) }?;
    Ok(out)
}

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

/// `n` random values of the float `dtype` drawn on the device from the global
/// Philox stream: uniform in `[p0, p1)`, or normal with mean `p0` and standard
/// deviation `p1` when `normal`.
pub(crate) fn random(
    dev: &Arc<CudaDev>,
    dtype: DType,
    n: usize,
    normal: bool,
    p0: f64,
    p1: f64,
) -> Result<CudaStorage> {
    let out = new_out(dev, dtype, n)?;
    let per = if dtype == DType::F64 { 2 } else { 4 };
    let counters = n.div_ceil(per);
    let (seed, offset) = super::random::reserve_counters(counters as u64);
    let (po, n64, nrm) = (out.ptr(), n as i64, normal as i32);
    let name = format!("random_{}", suffix(dtype));
    launch_n(
        dev,
        "random",
        dtype,
        &name,
        counters,
        &mut args![po, n64, seed, offset, nrm, p0, p1],
    )?;
    Ok(out)
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
        }
    }
}

fn base_ptr(s: &CudaStorage, offset: usize) -> u64 {
    s.ptr() + (offset * s.dtype().size_in_bytes()) as u64
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

/// Max pooling (with the argmax index per output when `want_index`) or average
/// pooling of a contiguous input; returns (output, index).
pub(crate) fn pool2d(
    x: &CudaStorage,
    offset: usize,
    g: &KConv,
    avg: Option<bool>,
    want_index: bool,
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
            let index = if want_index {
                Some(new_out(dev, DType::I64, n)?)
            } else {
                None
            };
            let pi: u64 = index.as_ref().map_or(0, |s| s.ptr());
            let name = format!("max_pool_{sfx}");
            launch_n(dev, "conv", x.dtype(), &name, n, &mut args![px, gg, po, pi])?;
            Ok((out, index))
        }
    }
}

/// The input gradient of [`pool2d`] from the output gradient `gout` (contiguous).
pub(crate) fn pool2d_backward(
    gout: &CudaStorage,
    offset: usize,
    index: Option<&CudaStorage>,
    g: &KConv,
    avg: Option<bool>,
) -> Result<CudaStorage> {
    let dev = gout.dev();
    let n_in = (g.n * g.c * g.h * g.w) as usize;
    let n_out = (g.n * g.c * g.oh * g.ow) as usize;
    let gx = fill(dev, gout.dtype(), n_in, 0.0)?;
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
                n_out,
                &mut args![pg, gg, px, ip],
            )?;
        }
        (None, Some(idx)) => {
            let pi = idx.ptr();
            let name = format!("max_pool_back_{sfx}");
            launch_n(
                dev,
                "conv",
                gout.dtype(),
                &name,
                n_out,
                &mut args![pg, pi, gg, px],
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

/// Batched matrix product through cuBLAS: `a` is `batch + [m, k]`, `b` is
/// `batch + [k, n]` (broadcast batch dims, any strides). Each operand's last two
/// dims must be row- or column-major with a constant batch stride; otherwise it is
/// copied contiguous first. f16/bf16 accumulate in f32; f32 uses TF32 only when
/// [`allow_tf32`](super::allow_tf32) is on. Integers (u8, i64) go through ember's
/// own kernel (cuBLAS multiplies floats only); `None` for bool, which has no product.
pub(crate) fn matmul(
    a: &CudaStorage,
    la: &Layout,
    b: &CudaStorage,
    lb: &Layout,
    m: usize,
    k: usize,
    n: usize,
) -> Result<Option<CudaStorage>> {
    let dt = a.dtype();
    let rank = la.rank();
    let batch: usize = la.shape()[..rank - 2].iter().product();
    match dt {
        DType::I64 | DType::U8 => return matmul_int(a, la, b, lb, (batch, m, k, n)).map(Some),
        DType::Bool => return Ok(None),
        _ => {}
    }
    // cuBLAS takes 32-bit sizes, leading dimensions and batch counts
    let limit = i32::MAX as usize;
    if [m, n, k, batch].iter().any(|&d| d > limit)
        || la.strides()[rank - 2..]
            .iter()
            .chain(&lb.strides()[rank - 2..])
            .any(|&s| s > limit)
    {
        return Err(Error::invalid(
            "matmul",
            format!(
                "a {batch} x {m}x{k} by {k}x{n} product exceeds cuBLAS's 32-bit sizes and \
                 leading dimensions on CUDA; split it into smaller products"
            ),
        ));
    }
    let dev = a.dev().clone();
    let out = new_out(&dev, dt, batch * m * n)?;
    if batch * m * n == 0 {
        return Ok(Some(out));
    }
    if k == 0 {
        let z = fill(&dev, dt, batch * m * n, 0.0)?;
        return Ok(Some(z));
    }
    // Each operand as (storage, offset, transposed?, leading dim, batch stride).
    struct Op {
        _keep: Option<CudaStorage>,
        ptr: u64,
        trans: bool,
        ld: i64,
        stride: i64,
    }
    let prep = |s: &CudaStorage, l: &Layout, rows: usize, cols: usize| -> Result<Op> {
        let st = l.strides();
        let (rs, cs) = (st[rank - 2], st[rank - 1]);
        let bstride = batch_stride(l);
        let sz = s.dtype().size_in_bytes() as u64;
        let base = s.ptr() + l.offset() as u64 * sz;
        if let Some(bs) = bstride {
            if cs == 1 && (rs >= cols.max(1) || rows == 1) {
                return Ok(Op {
                    _keep: None,
                    ptr: base,
                    trans: false,
                    ld: rs.max(cols.max(1)) as i64,
                    stride: bs as i64,
                });
            }
            if rs == 1 && (cs >= rows.max(1) || cols == 1) {
                return Ok(Op {
                    _keep: None,
                    ptr: base,
                    trans: true,
                    ld: cs.max(rows.max(1)) as i64,
                    stride: bs as i64,
                });
            }
        }
        let c = contiguous(s, l)?;
        let ptr = c.ptr();
        Ok(Op {
            _keep: Some(c),
            ptr,
            trans: false,
            ld: cols.max(1) as i64,
            stride: (rows * cols) as i64,
        })
    };
    let oa = prep(a, la, m, k)?;
    let ob = prep(b, lb, k, n)?;
    // Row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ: cuBLAS's "A" is our b.
    let call = super::blas::GemmCall {
        dtype: dt,
        trans_a: ob.trans,
        trans_b: oa.trans,
        m: n as i32,
        n: m as i32,
        k: k as i32,
        a: ob.ptr,
        lda: ob.ld as i32,
        stride_a: ob.stride,
        b: oa.ptr,
        ldb: oa.ld as i32,
        stride_b: oa.stride,
        c: out.ptr(),
        ldc: n as i32,
        stride_c: (m * n) as i64,
        batch: batch as i32,
    };
    // SAFETY: pointers, leading dims and strides describe the operands' storage.
    unsafe { dev.gemm(&call) }?;
    // the operands' temporary copies (if any) are freed after the queued GEMM: the
    // allocator hands their blocks only to later work on the same stream
    drop((oa, ob));
    Ok(Some(out))
}

/// `a · b` for integer dtypes with ember's kernel: `(batch, m, k, n)` sizes over the
/// broadcast layouts `la` (batch + [m, k]) and `lb` (batch + [k, n]).
fn matmul_int(
    a: &CudaStorage,
    la: &Layout,
    b: &CudaStorage,
    lb: &Layout,
    (batch, m, k, n): (usize, usize, usize, usize),
) -> Result<CudaStorage> {
    let total = batch * m * n;
    if k == 0 {
        return fill(a.dev(), a.dtype(), total, 0.0);
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

/// The stride between consecutive matrices when the batch dims of `l` collapse
/// to one (a single matrix has stride 0); `None` when they do not.
fn batch_stride(l: &Layout) -> Option<usize> {
    let r = l.rank();
    let (shape, strides) = (&l.shape()[..r - 2], &l.strides()[..r - 2]);
    let dims: Vec<(usize, usize)> = shape
        .iter()
        .zip(strides)
        .filter(|(&n, _)| n != 1)
        .map(|(&n, &s)| (n, s))
        .collect();
    match dims.as_slice() {
        [] => Some(0),
        [(_, s)] => Some(*s),
        _ => {
            // collapsible when each outer stride is the inner stride times the inner size
            for w in dims.windows(2) {
                if w[0].1 != w[1].1 * w[1].0 {
                    return None;
                }
            }
            Some(dims.last().map_or(0, |d| d.1))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reduction_plans() {
        use ReducePlan::*;
        // an H100: 132 multiprocessors, 528 blocks keep it busy
        assert_eq!(reduce_plan(1, 1 << 24, 132), Split(528));
        assert_eq!(reduce_plan(1, 100_000, 132), Split(12));
        assert_eq!(reduce_plan(64, 1 << 20, 132), Split(9));
        assert_eq!(reduce_plan(1, 16_383, 132), BlockPerOutput);
        assert_eq!(reduce_plan(600, 1 << 20, 132), BlockPerOutput);
        assert_eq!(reduce_plan(1 << 20, 10, 132), WarpPerOutput);
        assert_eq!(reduce_plan(132, 512, 132), WarpPerOutput);
        assert_eq!(reduce_plan(131, 512, 132), BlockPerOutput);
        assert_eq!(reduce_plan(1 << 20, 513, 132), BlockPerOutput);
    }

    /// `static_assert`s that the kernel structs have Rust's sizes and (with
    /// `offsets`) field offsets.
    fn struct_checks(offsets: bool) -> String {
        use std::mem::{offset_of, size_of};
        let mut checks = vec![
            format!(
                "static_assert(sizeof(Layout) == {}, \"Layout size\");",
                size_of::<KLayout>()
            ),
            format!(
                "static_assert(sizeof(Conv) == {}, \"Conv size\");",
                size_of::<KConv>()
            ),
        ];
        if offsets {
            let fields = [
                ("Layout", "rank", offset_of!(KLayout, rank)),
                ("Layout", "contiguous", offset_of!(KLayout, contiguous)),
                ("Layout", "offset", offset_of!(KLayout, offset)),
                ("Layout", "shape", offset_of!(KLayout, shape)),
                ("Layout", "strides", offset_of!(KLayout, strides)),
                ("Conv", "n", offset_of!(KConv, n)),
                ("Conv", "w", offset_of!(KConv, w)),
                ("Conv", "oh", offset_of!(KConv, oh)),
                ("Conv", "kh", offset_of!(KConv, kh)),
                ("Conv", "sh", offset_of!(KConv, sh)),
                ("Conv", "ph", offset_of!(KConv, ph)),
                ("Conv", "dw", offset_of!(KConv, dw)),
            ];
            for (ty, field, off) in fields {
                checks.push(format!(
                    "static_assert(__builtin_offsetof({ty}, {field}) == {off}, \"{ty}.{field}\");"
                ));
            }
        }
        super::super::nvrtc::ember_source("conv", "f32").unwrap() + &checks.join("\n")
    }

    /// The structs passed to kernels by value have Rust's sizes in NVRTC's compiler
    /// (which has no `offsetof`; CUDA lays kernel parameters out like the host ABI).
    /// Skips without NVRTC unless `EMBER_REQUIRE_NVRTC` is set.
    #[test]
    fn by_value_structs_match_under_nvrtc() {
        let nv = super::super::nvrtc::ensure_nvrtc();
        if let Err(e) = nv {
            assert!(
                std::env::var_os("EMBER_REQUIRE_NVRTC").is_none_or(|v| v == "0"),
                "EMBER_REQUIRE_NVRTC is set but NVRTC is missing: {e}"
            );
            eprintln!("skipped: {e}");
            return;
        }
        let compile = |name, src: &str| super::super::nvrtc::compile(name, src, 80, &[]);
        if let Err(e) = compile("abi_check", &struct_checks(false)) {
            panic!("the kernel structs differ from Rust's: {e}");
        }
        // the check can fail: a wrong size does not compile
        let bad = struct_checks(false).replace("sizeof(Layout) ==", "sizeof(Layout) + 8 ==");
        assert!(compile("abi_check_bad", &bad).is_err());
    }

    /// Every field offset of the by-value structs matches Rust's, under the host C++
    /// compiler of the CUDA simulator (skipped without one).
    #[test]
    fn by_value_structs_match_under_the_host_compiler() {
        let src = struct_checks(true);
        match super::super::sim::compile("abi_check", &src, &[]) {
            Ok(_) => {}
            Err(Error::CudaUnavailable { reason }) => eprintln!("skipped: {reason}"),
            Err(e) => panic!("the kernel structs differ from Rust's: {e}"),
        }
        let bad = src.replace("(Conv, oh) ==", "(Conv, oh) + 8 ==");
        assert!(super::super::sim::compile("abi_check_bad", &bad, &[]).is_err());
    }

    /// Philox4x32-10 on a full 128-bit counter and 64-bit key: the reference for
    /// kernels/random.cu.
    fn philox4x32_10(mut c: [u32; 4], mut k: [u32; 2]) -> [u32; 4] {
        let mulhilo = |a: u32, b: u32| {
            let p = a as u64 * b as u64;
            ((p >> 32) as u32, p as u32)
        };
        for _ in 0..10 {
            let (h0, l0) = mulhilo(0xD251_1F53, c[0]);
            let (h1, l1) = mulhilo(0xCD9E_8D57, c[2]);
            c = [h1 ^ c[1] ^ k[0], l1, h0 ^ c[3] ^ k[1], l0];
            k = [
                k[0].wrapping_add(0x9E37_79B9),
                k[1].wrapping_add(0xBB67_AE85),
            ];
        }
        c
    }

    /// The known-answer vectors published with Random123 (kat_vectors).
    #[test]
    fn philox_reference_matches_the_published_vectors() {
        assert_eq!(
            philox4x32_10([0; 4], [0; 2]),
            [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
                [0xa4093822, 0x299f31d0]
            ),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    /// The device generator gives the reference's words, and its uniform floats are
    /// the words' top 24 bits (on a GPU or the simulator; skipped without either).
    #[test]
    fn device_philox_matches_the_reference() {
        if let Some(reason) = crate::cuda::unavailable_reason() {
            eprintln!("skipped: {reason}");
            return;
        }
        let dev = super::super::dev(0).unwrap();
        let counters = 1000usize;
        let (seed, offset) = (0x0123_4567_89ab_cdefu64, (1u64 << 32) - 3);
        let out = new_out(&dev, DType::I64, counters * 2).unwrap(); // 4 u32 per counter
        let (po, c64) = (out.ptr(), counters as i64);
        let f = dev.func("random", DType::F32, "philox_raw").unwrap();
        let mut p = args![po, c64, seed, offset];
        unsafe { dev.launch(f, (4, 1, 1), (THREADS, 1, 1), 0, &mut p) }.unwrap();
        let words: Vec<u32> = match out.to_cpu().unwrap() {
            crate::dtype::CpuData::I64(v) => v
                .iter()
                .flat_map(|&x| [x as u64 as u32, (x as u64 >> 32) as u32])
                .collect(),
            _ => unreachable!(),
        };
        for c in 0..counters {
            let ctr = offset + c as u64;
            let want = philox4x32_10(
                [ctr as u32, (ctr >> 32) as u32, 0, 0],
                [seed as u32, (seed >> 32) as u32],
            );
            assert_eq!(&words[4 * c..4 * c + 4], &want, "counter {ctr}");
        }
    }

    #[test]
    fn klayout_matches_the_kernel_struct_size() {
        // int rank, int contiguous, i64 offset, i64 shape[8], i64 strides[8]
        assert_eq!(std::mem::size_of::<KLayout>(), 4 + 4 + 8 + 64 + 64);
        assert!(KLayout::from_parts("t", &[1; 9], &[1; 9], 0, true).is_err());
    }

    #[test]
    fn batch_strides_collapse() {
        let l = Layout::contiguous(&[2, 3, 4, 5]);
        assert_eq!(batch_stride(&l), Some(20));
        let l = Layout::contiguous(&[4, 5]);
        assert_eq!(batch_stride(&l), Some(0));
        // a transposed batch order does not collapse
        let l = Layout::contiguous(&[2, 3, 4, 5]).permute(&[1, 0, 2, 3]);
        assert_eq!(batch_stride(&l), None);
        // broadcast batch (stride 0)
        let l = Layout::contiguous(&[1, 4, 5])
            .broadcast_to("t", &[3, 4, 5])
            .unwrap();
        assert_eq!(batch_stride(&l), Some(0));
    }
}
