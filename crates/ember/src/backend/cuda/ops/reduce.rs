//! Kernels of `kernels/reduce.cu`: reductions over dims (a warp, a block or
//! several blocks per output), column sums, the softmax family, the row norms,
//! scans and sorts, cross-entropy and the optimizers' norms (batch norm's are in
//! `channel.rs`).

use super::{
    base_ptr, launch_chunks, launch_kernel, launch_lists, launch_n, launch_rows,
    launch_rows_shared, new_out, suffix, tensor_lists, KLayout, ListTensor, THREADS,
};
use crate::backend::cuda::CudaStorage;
use crate::backend::op::{
    norm_affine_chunks, row_split, scan_chunks, stat_dtype, NormSaved, ReduceCode, ReduceRoute,
    ScanOp, ARGSORT_COUNT_MAX,
};
use crate::layout::Layout;
use crate::{
    dtype::DType,
    error::{Error, Result},
};
use std::ffi::c_void;

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
    let route = ReduceRoute::of(op, l, dims, dev.sm_count as usize);
    // sums and means over the leading dims of a contiguous array: by columns
    if let ReduceRoute::Columns { splits } = route {
        let divisor = if op == ReduceCode::Mean {
            lane as f64
        } else {
            1.0
        };
        col_sum(
            x,
            l.offset(),
            (lane, n_out, splits),
            divisor,
            out_dtype,
            &out,
        )?;
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
    match route {
        ReduceRoute::WarpPerOutput => {
            let mut p = args![px, kl, po, no, ln, code, correction];
            let grid = cap(n_out.div_ceil(THREADS as usize / 32));
            // `reduce_warp_<T>[_i64]`
            launch_kernel(
                dev,
                ("reduce", x.dtype(), &name("_warp")),
                (grid, 1, 1),
                ((THREADS, 1, 1), 0),
                &mut p,
            )?;
        }
        ReduceRoute::BlockPerOutput | ReduceRoute::Columns { .. } => {
            let mut p = args![px, kl, po, no, ln, code, correction];
            // `reduce_<T>[_i64]`
            launch_kernel(
                dev,
                ("reduce", x.dtype(), &name("")),
                (cap(n_out), 1, 1),
                ((THREADS, 1, 1), 0),
                &mut p,
            )?;
        }
        ReduceRoute::Split(splits) => {
            let slots = n_out * splits;
            // three arrays of `slots` 8-byte entries: values (the accumulator type,
            // at most 8 bytes), indices or counts, and the variance's M2
            let partials = CudaStorage::alloc(dev, DType::I64, 3 * slots)?;
            let pv = partials.ptr();
            let (pi, pm) = (pv + 8 * slots as u64, pv + 16 * slots as u64);
            let sp = splits as i64;
            let partial = out_kernel("reduce_partial", x.dtype(), false);
            let mut p = args![px, kl, no, ln, sp, code, pv, pi, pm];
            // `reduce_partial_<T>`: the partial arrays hold `slots` entries each
            launch_kernel(
                dev,
                ("reduce", x.dtype(), &partial),
                (cap(slots), 1, 1),
                ((THREADS, 1, 1), 0),
                &mut p,
            )?;
            let mut p = args![pv, pi, pm, po, no, ln, sp, code, correction];
            // `reduce_finish_<T>[_i64]`: `partials` is freed after both launches,
            // in stream order
            launch_kernel(
                dev,
                ("reduce", x.dtype(), &name("_finish")),
                (cap(n_out), 1, 1),
                ((THREADS, 1, 1), 0),
                &mut p,
            )?;
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
    (rows, cols, splits): (usize, usize, usize),
    divisor: f64,
    out_dtype: DType,
    out: &CudaStorage,
) -> Result<()> {
    // (COL_H: at most reduce.cu's COL_H, the rows of col_sum's shared `part`,
    // whose loops run to blockDim.y)
    const COL_W: usize = 32;
    const COL_H: u32 = 8;
    let dev = x.dev();
    let (dt, i64_out) = (x.dtype(), out_dtype != x.dtype());
    let px = x.ptr() + (offset * x.dtype().size_in_bytes()) as u64;
    let tiles = cols.div_ceil(COL_W);
    // gridDim.x is at most 2^31 - 1
    let grid_x = i32::try_from(tiles)
        .map(|t| t as u32)
        .map_err(|_| Error::invalid("sum", format!("{cols} columns exceed the GPU's grid")))?;
    let (r, c) = (rows as i64, cols as i64);
    // COL_H row slices a block, or one a row where there are fewer rows (the
    // others would only add zeros): a few samples' per-sample weight gradients
    // are millions of columns of 2 to 4 rows
    let slices = |rows: usize| (COL_W as u32, rows.clamp(1, COL_H as usize) as u32, 1);
    let block = slices(rows);
    if splits == 1 {
        let po = out.ptr();
        let mut p = args![px, po, r, c, divisor];
        // `col_sum_<T>[_i64]`: `x` holds rows * cols elements from `offset`, `out`
        // holds cols
        let name = out_kernel("col_sum", dt, i64_out);
        return launch_kernel(
            dev,
            ("reduce", dt, &name),
            (grid_x, 1, 1),
            (block, 0),
            &mut p,
        );
    }
    // partials: `splits` rows of `cols` values in the accumulation type (at most
    // 8 bytes each)
    let partials = CudaStorage::alloc(dev, DType::I64, splits * cols)?;
    let pp = partials.ptr();
    let one = 1.0f64;
    let mut p = args![px, pp, r, c, one];
    // `col_sum_<T>_acc`: the partials hold splits * cols
    let name = format!("col_sum_{}_acc", suffix(dt));
    launch_kernel(
        dev,
        ("reduce", dt, &name),
        (grid_x, splits as u32, 1),
        (block, 0),
        &mut p,
    )?;
    let (po, sr) = (out.ptr(), splits as i64);
    let mut p = args![pp, po, sr, c, divisor];
    // `col_sum_acc_<T>[_i64]`: `partials` is freed after both launches, in stream
    // order
    let name = out_kernel("col_sum_acc", dt, i64_out);
    launch_kernel(
        dev,
        ("reduce", dt, &name),
        (grid_x, 1, 1),
        (slices(splits), 0),
        &mut p,
    )
}

/// The name of kernel `base` for input `dtype`: `{base}_{suffix}`, with `_i64` for
/// the instance that writes int64 (integer sums, arg-reductions).
fn out_kernel(base: &str, dtype: DType, i64_out: bool) -> String {
    let tail = if i64_out { "_i64" } else { "" };
    format!("{base}_{}{tail}", suffix(dtype))
}

/// The longest row (in bytes of accumulator values) that softmax keeps in shared
/// memory: 32 KiB leaves room for six blocks of 256 threads on a multiprocessor.
const SOFTMAX_ROW_BYTES: usize = 32 << 10;

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
    if cols == 0 {
        return Ok(out);
    }
    let (px, po) = (base_ptr(x, offset), out.ptr());
    // a row of accumulator values (double for f64, float otherwise) in shared
    // memory, so that the input is read once, where it fits in SOFTMAX_ROW_BYTES
    let acc = if x.dtype() == DType::F64 { 8 } else { 4 };
    let cached = cols * acc <= SOFTMAX_ROW_BYTES;
    let shared = if cached { (cols * acc) as u32 } else { 0 };
    let (r, c, lg, ca) = (rows as i64, cols as i64, log as i32, cached as i32);
    let name = format!("softmax_{}", suffix(x.dtype()));
    launch_rows_shared(
        dev,
        "reduce",
        x.dtype(),
        &name,
        rows,
        shared,
        &mut args![px, po, r, c, lg, ca],
    )?;
    Ok(out)
}

/// The input gradient of softmax (or log-softmax) over rows from the output's
/// gradient `g` and the output `y` (each from its offset; one block per row).
pub(crate) fn softmax_backward_rows(
    g: &CudaStorage,
    offset: usize,
    (y, y_offset): (&CudaStorage, usize),
    rows: usize,
    cols: usize,
    log: bool,
) -> Result<CudaStorage> {
    let dev = g.dev();
    let out = new_out(dev, g.dtype(), rows * cols)?;
    if cols == 0 {
        return Ok(out);
    }
    let (pg, py, po) = (base_ptr(g, offset), base_ptr(y, y_offset), out.ptr());
    let (r, c, lg) = (rows as i64, cols as i64, log as i32);
    let name = format!("softmax_backward_{}", suffix(g.dtype()));
    launch_rows(
        dev,
        "reduce",
        g.dtype(),
        &name,
        rows,
        &mut args![pg, py, po, r, c, lg],
    )?;
    Ok(out)
}

/// Normalised rows, with the affine part where given, and each row's mean and
/// rstd (one block per row; see `BackendStorage::norm_rows`). `w` and `b` are
/// `[cols]` from their offsets.
pub(crate) fn norm_rows(
    (x, offset): (&CudaStorage, usize),
    (w, b): (Operand, Operand),
    rows: usize,
    cols: usize,
    (eps, rms): (f64, bool),
) -> Result<(CudaStorage, CudaStorage)> {
    let dev = x.dev();
    let out = new_out(dev, x.dtype(), rows * cols)?;
    let stats = new_out(dev, stat_dtype(x.dtype()), 2 * rows)?;
    if cols == 0 {
        return Ok((out, stats));
    }
    let (px, po, ps) = (base_ptr(x, offset), out.ptr(), stats.ptr());
    // absent parts: null pointers, which the kernel tests
    let (pw, pb) = (opt_ptr(w), opt_ptr(b));
    let (r, c, rm) = (rows as i64, cols as i64, rms as i32);
    // the plain instance reads no weight or bias, and keeps its registers
    let kind = if w.is_some() || b.is_some() {
        "_affine"
    } else {
        ""
    };
    let name = format!("norm_rows{kind}_{}", suffix(x.dtype()));
    launch_rows(
        dev,
        "reduce",
        x.dtype(),
        &name,
        rows,
        &mut args![px, pw, pb, po, ps, r, c, eps, rm],
    )?;
    Ok((out, stats))
}

/// An optional operand and the element it starts at.
type Operand<'a> = Option<(&'a CudaStorage, usize)>;

/// The address of element `offset` of an optional operand, 0 where absent.
fn opt_ptr(s: Operand) -> u64 {
    s.map_or(0, |(s, off)| base_ptr(s, off))
}

/// The input gradient of [`norm_rows`] from the output's gradient `g` and what
/// the forward left (one block per row).
pub(crate) fn norm_rows_backward(
    (g, l): (&CudaStorage, &Layout),
    saved: NormSaved<'_, CudaStorage>,
    rms: bool,
) -> Result<CudaStorage> {
    let dev = g.dev();
    let (rows, cols) = row_split(l);
    let out = new_out(dev, g.dtype(), rows * cols)?;
    if cols == 0 {
        return Ok(out);
    }
    let (x, lx) = saved.x;
    let (pg, px, ps) = (
        base_ptr(g, l.offset()),
        base_ptr(x, lx.offset()),
        saved.stats.ptr(),
    );
    let (pw, po) = (
        opt_ptr(saved.weight.map(|(w, lw)| (w, lw.offset()))),
        out.ptr(),
    );
    let (r, c, rm) = (rows as i64, cols as i64, rms as i32);
    let name = format!("norm_rows_backward_{}", suffix(g.dtype()));
    launch_rows(
        dev,
        "reduce",
        g.dtype(),
        &name,
        rows,
        &mut args![pg, px, ps, pw, po, r, c, rm],
    )?;
    Ok(out)
}

/// The weight and bias gradients of [`norm_rows`], `[cols]` each: column sums of
/// `g · xhat` and `g` per chunk of rows into a workspace of partials, then the
/// partials summed in chunk order (`norm_affine_chunks`; no atomics).
pub(crate) fn norm_affine_backward(
    (g, l): (&CudaStorage, &Layout),
    saved: NormSaved<'_, CudaStorage>,
) -> Result<(CudaStorage, CudaStorage)> {
    const COL_W: usize = 32;
    const COL_H: u32 = 8;
    let dev = g.dev();
    let dt = g.dtype();
    let (rows, cols) = row_split(l);
    let (dw, db) = (new_out(dev, dt, cols)?, new_out(dev, dt, cols)?);
    if cols == 0 {
        return Ok((dw, db));
    }
    let (chunks, per_chunk) = norm_affine_chunks(rows);
    // freed once both launches are queued (the allocator keeps it from reuse
    // until they ran)
    let partial = new_out(dev, stat_dtype(dt), 2 * chunks * cols)?;
    let grid_x = u32::try_from(cols.div_ceil(COL_W))
        .ok()
        .filter(|&t| t < 1 << 31)
        .ok_or_else(|| {
            Error::invalid(
                "layer_norm",
                format!("{cols} columns exceed the GPU's grid"),
            )
        })?;
    let (pg, pp) = (base_ptr(g, l.offset()), partial.ptr());
    let (px, ps) = (base_ptr(saved.x.0, saved.x.1.offset()), saved.stats.ptr());
    let (r, c, pc) = (rows as i64, cols as i64, per_chunk as i64);
    launch_kernel(
        dev,
        ("reduce", dt, &format!("norm_affine_partial_{}", suffix(dt))),
        (grid_x, chunks as u32, 1),
        ((COL_W as u32, COL_H, 1), 0),
        &mut args![pg, px, ps, pp, r, c, pc],
    )?;
    let (pw, pb, ch) = (dw.ptr(), db.ptr(), chunks as i64);
    launch_n(
        dev,
        "reduce",
        dt,
        &format!("norm_affine_sum_{}", suffix(dt)),
        2 * cols,
        &mut args![pp, pw, pb, ch, c],
    )?;
    drop(partial);
    Ok((dw, db))
}

/// Cumulative sum or product along the middle axis of `(outer, n, inner)`
/// contiguous elements from `offset`: one thread per `(outer, inner)` line,
/// stepping along it (neighbouring threads read neighbouring elements when
/// `inner > 1`).
pub(crate) fn cumulative(
    x: &CudaStorage,
    offset: usize,
    (outer, n, inner): (usize, usize, usize),
    op: ScanOp,
) -> Result<CudaStorage> {
    let dev = x.dev();
    let total = outer * n * inner;
    let out = new_out(dev, x.dtype(), total)?;
    if total == 0 {
        return Ok(out);
    }
    let sfx = suffix(x.dtype());
    let px = base_ptr(x, offset);
    let (po, o, len, i, code) = (out.ptr(), outer as i64, n as i64, inner as i64, op as i32);
    let lines = outer * inner;
    let Some((chunk, chunks)) = scan_chunks(lines, n) else {
        // a thread per line (the kernel loops over the lines past the grid)
        let mut p = args![px, po, o, len, i, code];
        launch_n(
            dev,
            "reduce",
            x.dtype(),
            &format!("cumulative_{sfx}"),
            lines,
            &mut p,
        )?;
        return Ok(out);
    };
    // chunk totals, the carries into each chunk, then the chunks from them
    let acc = new_out(dev, DType::I64, lines * chunks)?;
    let (pa, c, cs, l) = (acc.ptr(), chunk as i64, chunks as i64, lines as i64);
    let threads = lines * chunks;
    let mut p = args![px, pa, o, len, i, c, cs, code];
    launch_n(
        dev,
        "reduce",
        x.dtype(),
        &format!("cumulative_totals_{sfx}"),
        threads,
        &mut p,
    )?;
    let mut p = args![pa, l, cs, code];
    launch_n(
        dev,
        "reduce",
        x.dtype(),
        &format!("cumulative_carries_{sfx}"),
        lines,
        &mut p,
    )?;
    let mut p = args![px, po, pa, o, len, i, c, cs, code];
    launch_n(
        dev,
        "reduce",
        x.dtype(),
        &format!("cumulative_chunks_{sfx}"),
        threads,
        &mut p,
    )?;
    Ok(out)
}

/// The indices that sort each `(outer, inner)` line along the middle axis of
/// contiguous elements from `offset`: each thread ranks one element against its
/// line (stable, NaN last ascending), so a line of `n` costs `n²` comparisons
/// spread over `n` threads, for lines up to [`ARGSORT_COUNT_MAX`]; longer lines
/// are merge-sorted (log2(n) launches of a binary search per element).
pub(crate) fn argsort(
    x: &CudaStorage,
    offset: usize,
    (outer, n, inner): (usize, usize, usize),
    descending: bool,
) -> Result<CudaStorage> {
    let dev = x.dev();
    let total = outer * n * inner;
    let out = new_out(dev, DType::I64, total)?;
    if total == 0 {
        return Ok(out);
    }
    let px = base_ptr(x, offset);
    let (len, i, desc, t) = (n as i64, inner as i64, descending as i32, total as i64);
    if n <= ARGSORT_COUNT_MAX {
        // a thread per element counts what sorts before it: one launch
        let name = format!("argsort_{}", suffix(x.dtype()));
        let po = out.ptr();
        let mut p = args![px, po, t, len, i, desc];
        launch_n(dev, "reduce", x.dtype(), &name, total, &mut p)?;
        return Ok(out);
    }
    // merge passes between two index buffers, the last one written returned
    let name = format!("argsort_merge_{}", suffix(x.dtype()));
    let other = new_out(dev, DType::I64, total)?;
    let (mut src, mut dst) = (&other, &out);
    let mut width = 1usize;
    let mut first = 1i32;
    while width < n {
        let (pi, po, w) = (src.ptr(), dst.ptr(), width as i64);
        let mut p = args![px, pi, po, t, len, i, w, first, desc];
        launch_n(dev, "reduce", x.dtype(), &name, total, &mut p)?;
        (src, dst) = (dst, src);
        (width, first) = (width * 2, 0);
    }
    Ok(if std::ptr::eq(src, &out) { out } else { other })
}

/// Where each of the values `val` (contiguous from `lv`, `per` of them to each
/// row) goes in its row of the contiguous sequences `seq` (from `ls`, rows of `m`):
/// a binary search per value, a thread each.
pub(crate) fn searchsorted(
    seq: &CudaStorage,
    ls: &Layout,
    val: &CudaStorage,
    lv: &Layout,
    (m, per): (usize, usize),
    right: bool,
) -> Result<CudaStorage> {
    let dev = seq.dev();
    let n = lv.numel();
    let out = new_out(dev, DType::I64, n)?;
    if n == 0 {
        return Ok(out);
    }
    let name = format!("searchsorted_{}", suffix(seq.dtype()));
    let (ps, pv, po) = (
        base_ptr(seq, ls.offset()),
        base_ptr(val, lv.offset()),
        out.ptr(),
    );
    let (m, per, right, n64) = (m as i64, per.max(1) as i64, right as i32, n as i64);
    let mut p = args![ps, pv, po, m, per, right, n64];
    launch_n(dev, "reduce", seq.dtype(), &name, n, &mut p)?;
    Ok(out)
}

/// Each row's cross-entropy and (max, log-sum) pair (in [`stat_dtype`]) of the contiguous
/// rows of `x` against `target` (int64, one per row, contiguous from its offset);
/// one block per row (see `BackendStorage::cross_entropy_rows`).
pub(crate) fn cross_entropy_rows(
    (x, offset): (&CudaStorage, usize),
    (target, t_offset): (&CudaStorage, usize),
    (rows, cols): (usize, usize),
    opts: crate::backend::op::CeOpts,
) -> Result<(CudaStorage, CudaStorage)> {
    let dev = x.dev();
    let acc = stat_dtype(x.dtype());
    let loss = new_out(dev, acc, rows)?;
    let lse = new_out(dev, acc, 2 * rows)?;
    let (px, pt) = (base_ptr(x, offset), base_ptr(target, t_offset));
    let (pl, ps) = (loss.ptr(), lse.ptr());
    let (r, c) = (rows as i64, cols as i64);
    let (ignore, smoothing, steps) = (opts.ignore, opts.smoothing, opts.half_steps as i32);
    let name = format!("cross_entropy_{}", suffix(x.dtype()));
    launch_rows(
        dev,
        "reduce",
        x.dtype(),
        &name,
        rows,
        &mut args![px, pt, pl, ps, r, c, ignore, smoothing, steps],
    )?;
    Ok((loss, lse))
}

/// The logits' gradient of [`cross_entropy_rows`] from each row's loss gradient
/// `g` and its (max, log-sum) pair (both contiguous in [`stat_dtype`], from their
/// offsets).
pub(crate) fn cross_entropy_rows_backward(
    (x, offset): (&CudaStorage, usize),
    (target, t_offset): (&CudaStorage, usize),
    (lse, lse_offset): (&CudaStorage, usize),
    (g, g_offset): (&CudaStorage, usize),
    (rows, cols): (usize, usize),
    opts: crate::backend::op::CeOpts,
) -> Result<CudaStorage> {
    let dev = x.dev();
    let gx = new_out(dev, x.dtype(), rows * cols)?;
    if cols == 0 {
        return Ok(gx);
    }
    let (px, pt) = (base_ptr(x, offset), base_ptr(target, t_offset));
    let (ps, pg, po) = (base_ptr(lse, lse_offset), base_ptr(g, g_offset), gx.ptr());
    let (r, c) = (rows as i64, cols as i64);
    let (ignore, smoothing, steps) = (opts.ignore, opts.smoothing, opts.half_steps as i32);
    let name = format!("cross_entropy_back_{}", suffix(x.dtype()));
    launch_rows(
        dev,
        "reduce",
        x.dtype(),
        &name,
        rows,
        &mut args![px, pt, ps, pg, po, r, c, ignore, smoothing, steps],
    )?;
    Ok(gx)
}

/// The 2-norm of each of `tensors` (device addresses of contiguous `dtype`
/// arrays, and their lengths) on `dev`, as a new array in [`stat_dtype`]: two
/// launches per 48 tensors, the chunks' partial sums in a buffer freed after.
pub(crate) fn foreach_norms(
    dev: &std::sync::Arc<crate::backend::cuda::CudaDev>,
    dtype: DType,
    tensors: &[(u64, usize)],
) -> Result<CudaStorage> {
    let acc = stat_dtype(dtype);
    let norms = new_out(dev, acc, tensors.len())?;
    let sfx = suffix(dtype);
    let mut done = 0usize;
    for (l, chunks) in tensor_lists(&list_of(tensors)) {
        let partial = new_out(dev, acc, chunks)?;
        let (pp, pn) = (
            partial.ptr(),
            norms.ptr() + (done * acc.size_in_bytes()) as u64,
        );
        launch_chunks(
            dev,
            "reduce",
            dtype,
            &format!("clip_sumsq_{sfx}"),
            chunks,
            &mut args![l, pp],
        )?;
        launch_n(
            dev,
            "reduce",
            dtype,
            &format!("clip_norms_{sfx}"),
            l.count as usize,
            &mut args![l, pp, pn],
        )?;
        done += l.count as usize;
    }
    Ok(norms)
}

/// Multiplies each of `tensors` (as in [`foreach_norms`]) in place by
/// `min(1, max_norm / (total + 1e-6))`, `total` being a one-element array in
/// [`stat_dtype`] on the device (read there: no host wait).
pub(crate) fn foreach_clip_scale(
    dev: &std::sync::Arc<crate::backend::cuda::CudaDev>,
    dtype: DType,
    tensors: &[(u64, usize)],
    (total, total_offset): (&CudaStorage, usize),
    max_norm: f64,
) -> Result<()> {
    let pt = base_ptr(total, total_offset);
    let name = format!("clip_scale_{}", suffix(dtype));
    launch_lists(
        dev,
        ("reduce", dtype, &name),
        &list_of(tensors),
        &args![pt, max_norm],
    )
}

/// The tensors of a clipping launch: each gradient as the list's array 0.
fn list_of(tensors: &[(u64, usize)]) -> Vec<ListTensor> {
    tensors
        .iter()
        .map(|&(ptr, n)| ListTensor {
            arrays: [ptr, 0, 0, 0],
            n,
            flag: false,
        })
        .collect()
}
