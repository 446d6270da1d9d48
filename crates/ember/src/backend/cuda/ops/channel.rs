//! Batch normalisation's kernels of `kernels/reduce.cu`: the per-channel sums
//! (statistics forward, the two sums backward), the per-channel coefficient
//! steps, and the per-channel affine map.

use super::{base_ptr, launch_kernel, launch_n, new_out, suffix, FastDiv, THREADS};
use crate::backend::cuda::CudaStorage;
use crate::backend::op::{
    channel_chunks, channel_columns, stat_dtype, BnGradIn, BnParams, BnRunning,
};
use crate::layout::Layout;
use crate::{dtype::DType, error::Result};
use std::ffi::c_void;

/// Threads per block of the plane-wise per-channel sums: a block takes at most a
/// chunk of a channel (16 Ki elements, 64 a thread, unless a channel has more
/// than 65535 chunks of them; down to 4 Ki where few channels would leave
/// multiprocessors idle), and a channel of many elements is cut into chunks
/// (`channel_chunks`).
const CHANNEL_THREADS: u32 = 256;

// a block of them needs registers × threads of a multiprocessor's 64 Ki, and
// ptxas may give a thread up to 255
const _: () = assert!(CHANNEL_THREADS * 255 <= 65536);

/// Each channel's mean and biased variance of the contiguous `[n, c, s]` elements
/// from `offset`: `[2, c]` in the statistics dtype.
pub(crate) fn channel_stats(
    x: &CudaStorage,
    offset: usize,
    (n, c, s): (usize, usize, usize),
) -> Result<CudaStorage> {
    if let Some(cols) = channel_columns((n, c, s), x.dev().sm_count as usize) {
        return channel_columns_sums((None, None), (x, offset), None, (n, c), cols);
    }
    channel_plane_sums((None, None), (x, offset), None, (n, c, s))
}

/// Per channel, `Σ g` and `Σ g · (x - mean)` of `[n, c, s]` gradients and inputs:
/// `[2, c]` in the statistics dtype; with `mask` (a batch norm's output through
/// its ReLU, of the same shape) `g` counts where the mask is above 0.
pub(crate) fn channel_dot(
    (g, mask): ((&CudaStorage, usize), Option<(&CudaStorage, usize)>),
    x: (&CudaStorage, usize),
    mean: (&CudaStorage, usize),
    (n, c, s): (usize, usize, usize),
) -> Result<CudaStorage> {
    if let Some(cols) = channel_columns((n, c, s), x.0.dev().sm_count as usize) {
        return channel_columns_sums((Some(g), mask), x, Some(mean), (n, c), cols);
    }
    channel_plane_sums((Some(g), mask), x, Some(mean), (n, c, s))
}

/// A gradient and its ReLU mask, each at an element offset of its storage.
type MaskedGrad<'a> = (
    Option<(&'a CudaStorage, usize)>,
    Option<(&'a CudaStorage, usize)>,
);

/// [`channel_stats`] (without `g`) or [`channel_dot`] (with `g` and the mean)
/// over planes of `s > 1` elements: a block per channel, or per chunk of a
/// channel ([`channel_chunks`]) whose partial sums a second kernel adds in
/// chunk order.
fn channel_plane_sums(
    (g, y): MaskedGrad,
    (x, x_off): (&CudaStorage, usize),
    mean: Option<(&CudaStorage, usize)>,
    (n, c, s): (usize, usize, usize),
) -> Result<CudaStorage> {
    let dev = x.dev();
    let out = new_out(dev, stat_dtype(x.dtype()), 2 * c)?;
    if c == 0 {
        return Ok(out);
    }
    let chunks = channel_chunks((n, c, s), dev.sm_count as usize);
    let part = match chunks {
        Some((_, k)) => Some(new_out(dev, DType::F64, 2 * k * c)?),
        None => None,
    };
    let (per, k) = chunks.unwrap_or((n * s, 1));
    let at = |t: Option<(&CudaStorage, usize)>| t.map_or(0, |(t, o)| base_ptr(t, o));
    let pp = part.as_ref().map_or(0, |p| p.ptr());
    let (pg, py, px, pm, po) = (at(g), at(y), base_ptr(x, x_off), at(mean), out.ptr());
    let (n_, c_, s_, per_) = (n as i64, c as i64, s as i64, per as i64);
    let dot = g.is_some() as i32;
    let sfx = suffix(x.dtype());
    launch_kernel(
        dev,
        ("reduce", x.dtype(), &format!("channel_sums_{sfx}")),
        (c.min(65535 * 32) as u32, k as u32, 1),
        ((CHANNEL_THREADS, 1, 1), 0),
        &mut args![pg, py, px, pm, po, pp, n_, c_, s_, per_, dot],
    )?;
    if let Some(part) = &part {
        channel_sums_finish(x, (part, px), &out, (k, n * s, c, s), dot)?;
    }
    Ok(out)
}

/// Adds the `chunks` chunks' partial sums in `part` per channel, in chunk order,
/// into `out`: the mean and biased variance over `m` elements a channel (`dot`
/// 0; each channel's shift is its element `ch · s` of `x`, at `px`), or the two
/// sums.
fn channel_sums_finish(
    x: &CudaStorage,
    (part, px): (&CudaStorage, u64),
    out: &CudaStorage,
    (chunks, m, c, s): (usize, usize, usize, usize),
    dot: i32,
) -> Result<()> {
    let dev = x.dev();
    let (pp, po) = (part.ptr(), out.ptr());
    let (chunks, m, c_, s) = (chunks as i64, m as i64, c as i64, s as i64);
    launch_kernel(
        dev,
        (
            "reduce",
            x.dtype(),
            &format!("channel_sums_finish_{}", suffix(x.dtype())),
        ),
        (dev.grid_for(c, THREADS), 1, 1),
        ((THREADS, 1, 1), 0),
        &mut args![pp, px, po, chunks, m, c_, s, dot],
    )
}

/// [`channel_stats`] (without `g`) or [`channel_dot`] (with `g` and the mean) of
/// `[m, c]` rows, a channel a column: blocks of 32 channels by a chunk of `rows`
/// rows write their partial sums to a float64 workspace of `2 · chunks · c`,
/// which a second kernel adds up per channel in chunk order. A thread loads 16
/// bytes of a row's channels at a time where `c` and the arrays' addresses
/// allow (`channel_cols_vec`), else one element.
fn channel_columns_sums(
    (g, y): MaskedGrad,
    (x, x_off): (&CudaStorage, usize),
    mean: Option<(&CudaStorage, usize)>,
    (m, c): (usize, usize),
    (rows, chunks): (usize, usize),
) -> Result<CudaStorage> {
    let dev = x.dev();
    let out = new_out(dev, stat_dtype(x.dtype()), 2 * c)?;
    let part = new_out(dev, DType::F64, 2 * chunks * c)?;
    let at = |t: Option<(&CudaStorage, usize)>| t.map_or(0, |(t, o)| base_ptr(t, o));
    let (pg, py, px, pm, pp) = (at(g), at(y), base_ptr(x, x_off), at(mean), part.ptr());
    let (m_, c_, rows_) = (m as i64, c as i64, rows as i64);
    let dot = g.is_some() as i32;
    let sfx = suffix(x.dtype());
    // 16 bytes of channels a thread where every row's are aligned to that
    let vec = 16 / x.dtype().size_in_bytes();
    let wide = c.is_multiple_of(vec) && [pg, py, px].iter().all(|a| a.is_multiple_of(16));
    let (name, block) = match wide {
        true => (format!("channel_cols_vec_{sfx}"), (256, 1, 1)),
        false => (format!("channel_cols_{sfx}"), (32, 8, 1)),
    };
    launch_kernel(
        dev,
        ("reduce", x.dtype(), &name),
        (c.div_ceil(32) as u32, chunks as u32, 1),
        (block, 0),
        &mut args![pg, py, px, pm, pp, m_, c_, rows_, dot],
    )?;
    channel_sums_finish(x, (&part, px), &out, (chunks, m, c, 1), dot)?;
    Ok(out)
}

/// `p · a[ch] + d[ch]` (or `+ q · b[ch]` too) over `[n, c, s]` elements, with `k`
/// rows of `c` coefficients: a grid-stride loop over vectors of up to 16 bytes
/// (within a plane, or across channels where planes are single elements) where
/// the sizes and the arrays' alignment allow, else over elements. Across
/// channels, a grid whose threads are a multiple of the vectors a row
/// ([`affine_grid`]) lets each thread read its channels' coefficients once
/// (`channel_affine_lanes` kernels). With `relu`
/// the results go through a ReLU; with `mask` (a batch norm's output through its
/// ReLU, of the same shape) `p` counts where the mask is above 0.
pub(crate) fn channel_affine(
    (p, mask): ((&CudaStorage, usize), Option<(&CudaStorage, usize)>),
    q: Option<(&CudaStorage, usize)>,
    coefs: (&CudaStorage, usize),
    (k, relu): (usize, bool),
    (n, c, s): (usize, usize, usize),
) -> Result<CudaStorage> {
    let dev = p.0.dev();
    let out = new_out(dev, p.0.dtype(), n * c * s)?;
    let total = n * c * s;
    if total == 0 {
        return Ok(out);
    }
    let (pp, pq, py, pc, po) = (
        base_ptr(p.0, p.1),
        q.map_or(0, |(q, o)| base_ptr(q, o)),
        mask.map_or(0, |(y, o)| base_ptr(y, o)),
        base_ptr(coefs.0, coefs.1),
        out.ptr(),
    );
    let size = p.0.dtype().size_in_bytes();
    let lanes = s == 1;
    // the widest vector that divides the plane (or the channels) and to which
    // every array is aligned
    let along = if lanes { c } else { s };
    let vec = [8usize, 4, 2]
        .into_iter()
        .find(|&v| {
            let bytes = (v * size) as u64;
            v * size <= 16
                && along.is_multiple_of(v)
                && [pp, po]
                    .iter()
                    .chain(q.as_ref().map(|_| &pq))
                    .chain(mask.as_ref().map(|_| &py))
                    .all(|a| a % bytes == 0)
        })
        .unwrap_or(1);
    // (the kernel takes no wider vector of this dtype)
    debug_assert!(vec * size <= 16);
    let nv = total / vec;
    let relu_ = relu as i32;
    let (k_, vec_) = (k as i32, vec as i32);
    let grid = dev.grid_for(nv, THREADS);
    // vectors a row (of one channel each for planes)
    let (vs, vc) = if lanes { (1, c / vec) } else { (s / vec, c) };
    if let (grid, true) = affine_grid(grid, lanes.then_some(vc), dev.sm_count) {
        let (nv_, c_, vc_) = (nv as i64, c as i64, vc as i64);
        let (sfx, at) = (suffix(p.0.dtype()), ((grid, 1, 1), (THREADS, 1, 1)));
        let mut with_q = args![pp, pq, py, pc, po, nv_, c_, vc_, k_, relu_, vec_];
        let mut without = args![pp, py, pc, po, nv_, c_, vc_, k_, relu_, vec_];
        let (name, args): (_, &mut [_]) = match q {
            Some(_) => (format!("channel_affine_lanes_q_{sfx}"), &mut with_q),
            None => (format!("channel_affine_lanes_{sfx}"), &mut without),
        };
        launch_kernel(dev, ("reduce", p.0.dtype(), &name), at.0, (at.1, 0), args)?;
        return Ok(out);
    }
    // (vs and vc are at most nv)
    let small = nv < 1 << 31;
    let (d1, d2) = if small {
        (FastDiv::new(vs as u32), FastDiv::new(vc as u32))
    } else {
        (FastDiv::new(1), FastDiv::new(1))
    };
    let (nv_, c_, vs_, vc_) = (nv as i64, c as i64, vs as i64, vc as i64);
    let (sh1, sh2) = (d1.shift as i32, d2.shift as i32);
    let (small_, lanes_) = (small as i32, lanes as i32);
    let name = format!("channel_affine_{}", suffix(p.0.dtype()));
    launch_kernel(
        dev,
        ("reduce", p.0.dtype(), &name),
        (grid, 1, 1),
        ((THREADS, 1, 1), 0),
        &mut args![
            pp, pq, py, pc, po, nv_, c_, vs_, vc_, d1.magic, d2.magic, sh1, sh2, small_, lanes_,
            k_, relu_, vec_
        ],
    )?;
    Ok(out)
}

/// The grid of [`channel_affine`]'s kernel and whether its threads hold their
/// channels fixed: from `grid` blocks (of `THREADS`), where vectors of
/// channels-last channels come `vc` to a row (`Some(vc)`), the fewest blocks
/// at least `grid` whose threads are a multiple of `vc`, so that each thread's
/// grid-stride vectors hold the same channels. That adds fewer blocks than
/// such grids lie apart; not where they lie more than `sm_count · 32` blocks
/// apart (rows of many thousand vectors), nor for planes (`None`): a vector
/// there is one channel's.
fn affine_grid(grid: u32, vc: Option<usize>, sm_count: u32) -> (u32, bool) {
    let Some(vc) = vc.filter(|&v| v > 0) else {
        return (grid, false);
    };
    let threads = THREADS as usize;
    // blocks a multiple of `step` make the threads a multiple of vc
    let step = vc / gcd(vc, threads);
    if step > sm_count.max(1) as usize * 32 {
        return (grid, false);
    }
    ((grid as usize).div_ceil(step) as u32 * step as u32, true)
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Batch normalisation's `[3, c]` coefficients (`a`, `d`, the inverse standard
/// deviation) in the statistics dtype, the running statistics updated in the same
/// launch: a thread a channel.
pub(crate) fn batch_norm_coefs(
    p: BnParams<'_, CudaStorage>,
    running: BnRunning<'_, CudaStorage>,
    eps: f64,
) -> Result<CudaStorage> {
    let (dev, dtype) = (p.mean.0.dev(), p.mean.0.dtype());
    let c = p.mean.1.numel();
    let out = new_out(dev, dtype, 3 * c)?;
    if c == 0 {
        return Ok(out);
    }
    let at = |v: (&CudaStorage, &Layout)| base_ptr(v.0, v.1.offset());
    let opt = |v: Option<(&CudaStorage, &Layout)>| v.map_or(0, at);
    let run =
        |r: &Option<(&mut CudaStorage, usize)>| r.as_ref().map_or(0, |(s, o)| base_ptr(s, *o));
    let (pm, pv, pw, pb) = (at(p.mean), at(p.var), opt(p.weight), opt(p.bias));
    let (prm, prv, po) = (run(&running.mean), run(&running.var), out.ptr());
    let (c_, m, u) = (c as i64, running.momentum, running.unbiased);
    let name = format!("batch_norm_coefs_{}", suffix(dtype));
    launch_n(
        dev,
        "reduce",
        dtype,
        &name,
        c,
        &mut args![pm, pv, pw, pb, prm, prv, po, c_, eps, m, u],
    )?;
    Ok(out)
}

/// Batch normalisation's `[3, c]` backward coefficients (`k`, `b`, `d`) in the
/// statistics dtype, and with `weight_grad` the weight's gradient `[c]`: a thread a
/// channel.
pub(crate) fn batch_norm_grad_coefs(
    p: BnGradIn<'_, CudaStorage>,
    weight_grad: bool,
) -> Result<(CudaStorage, Option<CudaStorage>)> {
    let (dev, dtype) = (p.mean.0.dev(), p.mean.0.dtype());
    let c = p.mean.1.numel();
    let out = new_out(dev, dtype, 3 * c)?;
    let gw = weight_grad.then(|| new_out(dev, dtype, c)).transpose()?;
    if c == 0 {
        return Ok((out, gw));
    }
    let at = |v: (&CudaStorage, &Layout)| base_ptr(v.0, v.1.offset());
    let (ps, pm, pi) = (at(p.sums), at(p.mean), at(p.invstd));
    let pw = p.weight.map_or(0, at);
    let (po, pgw) = (out.ptr(), gw.as_ref().map_or(0, |g| g.ptr()));
    // (a count of 0: running statistics, whose gradient does not flow)
    let (c_, count) = (c as i64, p.count.unwrap_or(0.0));
    let name = format!("batch_norm_grad_coefs_{}", suffix(dtype));
    launch_n(
        dev,
        "reduce",
        dtype,
        &name,
        c,
        &mut args![ps, pm, pi, pw, po, pgw, c_, count],
    )?;
    Ok((out, gw))
}

#[cfg(test)]
mod tests {
    use super::{affine_grid, THREADS};

    #[test]
    fn affine_grids_hold_each_threads_channels() {
        // planes, and an empty row: the grid as given
        assert_eq!(affine_grid(7, None, 132), (7, false));
        assert_eq!(affine_grid(7, Some(0), 132), (7, false));
        for vc in [1, 5, 8, 33, 35, 125, 256, 512, 1000, 4096] {
            for grid in [1, 2, 35, 4224] {
                let (g, fixed) = affine_grid(grid, Some(vc), 132);
                assert!(fixed, "{vc} vectors a row");
                // at least the grid asked for, the threads a multiple of vc, and
                // no block more than that takes
                assert!(g >= grid);
                let threads = |blocks: u32| blocks as usize * THREADS as usize;
                assert!(threads(g).is_multiple_of(vc), "{vc}, {grid}");
                assert!((grid..g).all(|fewer| !threads(fewer).is_multiple_of(vc)));
            }
        }
        // odd rows: grids vc blocks apart, at most 132 · 32 = 4224
        assert_eq!(affine_grid(4224, Some(4223), 132), (2 * 4223, true));
        assert_eq!(affine_grid(9, Some(4225), 132), (9, false));
        assert_eq!(
            affine_grid(9, Some(4225 * THREADS as usize), 132),
            (9, false)
        );
    }
}
