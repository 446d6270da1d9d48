// Over 800 lines: the CPU's reductions and row ops (softmax, norms, cross-entropy) share their accumulation helpers (SliceMath) and row walkers.
//! Reductions over some dims (sum, mean, max, min, argmax, argmin, var) and the
//! row-wise softmax family.
//!
//! A reduction sees each output's input elements as one "lane" slice: a direct
//! sub-slice when the reduced dims are contiguous (the common last-dim case),
//! otherwise gathered into a scratch buffer.

use super::walk::Walk;
use crate::backend::host::{alloc_filled, alloc_uninit, recycle, PAR_CHUNK, PAR_MIN};
use crate::backend::op::{norm_affine_chunks, CeOpts, ReduceOp, ScanOp};
use crate::dtype::WithDType;
use crate::dtype::{CpuData, CpuElem};
use crate::dtype::{FloatDType, Real};
use crate::error::Result;
use crate::layout::{are_leading, are_trailing, Dims, Layout};
use num_traits::{Float, Zero};
use rayon::prelude::*;

/// Lanes longer than this are themselves reduced in parallel chunks.
const PAR_LANE: usize = 1 << 18;

/// Sums and maxima of whole slices in the accumulator type, the inner loops of the
/// float reductions (f32 overrides both with SIMD code that adds in the same order).
pub(crate) trait SliceMath: FloatDType {
    /// Blocks of up to 2048 elements summed in eight lanes and combined pairwise.
    fn sum_slice(x: &[Self]) -> Self::Acc {
        sum_acc(x, Self::to_acc)
    }
    /// The largest value, NaN if the slice holds one, -inf if it is empty.
    fn max_slice(x: &[Self]) -> Self::Acc {
        max_lanes(x)
    }
}

impl SliceMath for f64 {}
impl SliceMath for half::f16 {}
impl SliceMath for half::bf16 {}
impl SliceMath for f32 {
    fn sum_slice(x: &[f32]) -> f32 {
        sum_blocks(x, &super::vmath::sum_f32)
    }
    fn max_slice(x: &[f32]) -> f32 {
        super::vmath::max_f32(x)
    }
}

/// The values a norm computes on, row by row: the elements themselves for f32 and
/// f64, and for f16/bf16 the row widened into a float32 scratch row, so that the
/// half types run the float32 code (its vector loops, its order of summation:
/// the float32 route's bits, without its casts of whole tensors).
pub(crate) trait NormRow: SliceMath {
    type C: SliceMath<Acc = Self::Acc>;
    fn row<'a>(x: &'a [Self], scratch: &'a mut Vec<Self::C>) -> &'a [Self::C];
}
impl NormRow for f32 {
    type C = f32;
    fn row<'a>(x: &'a [f32], _: &'a mut Vec<f32>) -> &'a [f32] {
        x
    }
}
impl NormRow for f64 {
    type C = f64;
    fn row<'a>(x: &'a [f64], _: &'a mut Vec<f64>) -> &'a [f64] {
        x
    }
}
macro_rules! half_norm_row {
    ($t:ty) => {
        impl NormRow for $t {
            type C = f32;
            #[inline(always)]
            fn row<'a>(x: &'a [$t], scratch: &'a mut Vec<f32>) -> &'a [f32] {
                scratch.resize(x.len(), 0.0);
                for (d, v) in scratch.iter_mut().zip(x) {
                    *d = v.to_f32();
                }
                scratch
            }
        }
    };
}
half_norm_row!(half::f16);
half_norm_row!(half::bf16);

/// A norm part (`[row]`) in the type its norm computes in.
fn norm_part<T: NormRow>(p: Option<&[T]>) -> Option<Vec<T::C>> {
    p.map(|p| T::row(p, &mut Vec::new()).to_vec())
}

/// Calls `f` on each output's lane (the elements over the reduced `dims`, in row-major
/// order) and collects the results in the row-major order of the kept dims.
pub(crate) fn reduce_lanes<T, U>(
    data: &[T],
    l: &Layout,
    dims: &[usize],
    f: impl Fn(&[T]) -> U + Sync,
) -> Result<Vec<U>>
where
    T: Copy + Send + Sync,
    U: WithDType,
{
    let (mut ks, mut kst, mut rs, mut rst) = (Dims::new(), Dims::new(), Dims::new(), Dims::new());
    for d in 0..l.rank() {
        if dims.contains(&d) {
            rs.push(l.shape()[d]);
            rst.push(l.strides()[d]);
        } else {
            ks.push(l.shape()[d]);
            kst.push(l.strides()[d]);
        }
    }
    let out_n: usize = ks.iter().product();
    let lane_n: usize = rs.iter().product();
    let kept = Walk::new(&ks, [&kst]);
    let red = Walk::new(&rs, [&rst]);
    let contiguous_lane = red.shape.len() <= 1 && red.strides[0].first().is_none_or(|&s| s == 1);
    let mut out = alloc_uninit::<U>(out_n)?;
    let work = |start: usize, chunk: &mut [U]| {
        let mut scratch: Vec<T> = Vec::new();
        kept.for_each_run(
            [l.offset()],
            start,
            start + chunk.len(),
            |pos, len, [o], [s]| {
                for i in 0..len {
                    let base = o + i * s;
                    let lane: &[T] = if lane_n == 0 {
                        &[]
                    } else if contiguous_lane {
                        &data[base..base + lane_n]
                    } else {
                        scratch.clear();
                        red.for_each_run([base], 0, lane_n, |_, n, [ro], [rs]| {
                            scratch.extend((0..n).map(|j| data[ro + j * rs]));
                        });
                        &scratch
                    };
                    chunk[pos - start + i] = f(lane);
                }
            },
        );
    };
    if out_n > 1 && out_n * lane_n >= PAR_MIN {
        // enough outputs per task to amortise the lane setup
        let per = (PAR_CHUNK / lane_n.max(1)).max(1);
        let work: &(dyn Fn(usize, &mut [U]) + Sync) = &work;
        out.par_chunks_mut(per)
            .enumerate()
            .for_each(|(i, c)| work(i * per, c));
    } else {
        work(0, &mut out);
    }
    Ok(out)
}

/// Sums a slice: blocks of up to 2048 elements in 8 independent lanes (vectorisable),
/// combined pairwise, so the rounding error grows with log(n) rather than n; very
/// long slices are split across threads.
pub(crate) fn sum_acc<A, T>(x: &[T], to: impl Fn(T) -> A + Sync + Copy) -> A
where
    A: Copy + Send + Sync + Zero,
    T: Copy + Sync,
{
    sum_blocks(x, &|b: &[T]| {
        let mut acc = [A::zero(); 8];
        let chunks = b.chunks_exact(8);
        let rest = chunks.remainder();
        for c in chunks {
            for j in 0..8 {
                acc[j] = acc[j] + to(c[j]);
            }
        }
        let mut tail = A::zero();
        for &v in rest {
            tail = tail + to(v);
        }
        ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
    })
}

/// Splits `x` in halves down to blocks of at most 2048 elements (across threads for
/// very long slices), sums each with `leaf` and adds the halves.
pub(crate) fn sum_blocks<T: Sync, A: Copy + Send + std::ops::Add<Output = A>>(
    x: &[T],
    leaf: &(dyn Fn(&[T]) -> A + Sync),
) -> A {
    if x.len() >= PAR_LANE {
        let (l, r) = x.split_at(x.len() / 2);
        let (a, b) = rayon::join(|| sum_blocks(l, leaf), || sum_blocks(r, leaf));
        return a + b;
    }
    if x.len() > 2048 {
        let (l, r) = x.split_at(x.len() / 2);
        return sum_blocks(l, leaf) + sum_blocks(r, leaf);
    }
    leaf(x)
}

/// Cumulative sum or product of the contiguous elements `range` of `data`, seen
/// as `(outer, n, inner)` (see [`scan_shape`](crate::backend::op::scan_shape)),
/// along the middle axis. Floats accumulate in `A` (f64 for f32 and f64, f32 for
/// the half types); int64 wraps.
pub(crate) fn cumulative(
    data: &CpuData,
    range: std::ops::Range<usize>,
    (outer, n, inner): (usize, usize, usize),
    op: ScanOp,
) -> Result<CpuData> {
    fn go<T: Copy + Send + Sync + WithDType, A: Copy + Send + Sync>(
        x: &[T],
        (outer, n, inner): (usize, usize, usize),
        init: A,
        step: impl Fn(A, T) -> A + Sync,
        out: impl Fn(A) -> T + Sync,
    ) -> Result<Vec<T>> {
        let mut y = alloc_uninit::<T>(x.len())?;
        let block = n * inner;
        if block == 0 {
            return Ok(y);
        }
        let scan = |(xb, yb): (&[T], &mut [T])| {
            for i in 0..inner {
                let mut acc = init;
                for j in 0..n {
                    acc = step(acc, xb[j * inner + i]);
                    yb[j * inner + i] = out(acc);
                }
            }
        };
        if x.len() >= PAR_MIN && outer > 1 {
            x.par_chunks(block)
                .zip(y.par_chunks_mut(block))
                .for_each(scan);
        } else {
            x.chunks(block).zip(y.chunks_mut(block)).for_each(scan);
        }
        debug_assert_eq!(x.len(), outer * block);
        Ok(y)
    }
    let sum = op == ScanOp::Sum;
    let g = (outer, n, inner);
    macro_rules! float {
        ($v:expr, $acc:ty, $to:expr, $from:expr) => {
            if sum {
                go(&$v[range], g, 0 as $acc, |a, x| a + $to(x), $from)?
            } else {
                go(&$v[range], g, 1 as $acc, |a, x| a * $to(x), $from)?
            }
        };
    }
    Ok(match data {
        CpuData::F32(v) => CpuData::F32(float!(v, f64, |x: f32| x as f64, |a: f64| a as f32)),
        CpuData::F64(v) => CpuData::F64(float!(v, f64, |x: f64| x, |a: f64| a)),
        CpuData::F16(v) => CpuData::F16(float!(
            v,
            f32,
            |x: half::f16| x.to_f32(),
            half::f16::from_f32
        )),
        CpuData::BF16(v) => CpuData::BF16(float!(
            v,
            f32,
            |x: half::bf16| x.to_f32(),
            half::bf16::from_f32
        )),
        CpuData::I64(v) => CpuData::I64(if sum {
            go(&v[range], g, 0i64, |a, x| a.wrapping_add(x), |a| a)?
        } else {
            go(&v[range], g, 1i64, |a, x| a.wrapping_mul(x), |a| a)?
        }),
        other => {
            return Err(crate::error::Error::dtype(
                "cumulative",
                other.dtype(),
                "the tensor layer converts to int64 first",
            ))
        }
    })
}

/// The int64 indices that sort each `(outer, inner)` line of the contiguous
/// elements `range` of `data` along the middle axis (see
/// [`scan_shape`](crate::backend::op::scan_shape)); stable; NaN above every number.
pub(crate) fn argsort(
    data: &CpuData,
    range: std::ops::Range<usize>,
    (outer, n, inner): (usize, usize, usize),
    descending: bool,
) -> Result<CpuData> {
    fn go<T: Copy + Send + Sync, K: PartialOrd + Copy>(
        x: &[T],
        (outer, n, inner): (usize, usize, usize),
        descending: bool,
        key: impl Fn(T) -> K + Sync,
        is_nan: impl Fn(K) -> bool + Sync,
    ) -> Result<Vec<i64>> {
        let mut out = alloc_uninit::<i64>(x.len())?;
        let block = n * inner;
        if block == 0 {
            return Ok(out);
        }
        // NaN above every number; equal keys keep their order (a stable sort)
        let order = |a: K, b: K| -> std::cmp::Ordering {
            use std::cmp::Ordering::*;
            let o = match (is_nan(a), is_nan(b)) {
                (true, true) => Equal,
                (true, false) => Greater,
                (false, true) => Less,
                _ => a.partial_cmp(&b).unwrap_or(Equal),
            };
            if descending {
                o.reverse()
            } else {
                o
            }
        };
        let sort_block = |(xb, ob): (&[T], &mut [i64])| {
            let mut line: Vec<(K, i64)> = Vec::with_capacity(n);
            for i in 0..inner {
                line.clear();
                line.extend((0..n).map(|j| (key(xb[j * inner + i]), j as i64)));
                line.sort_by(|a, b| order(a.0, b.0));
                for (j, &(_, idx)) in line.iter().enumerate() {
                    ob[j * inner + i] = idx;
                }
            }
        };
        if outer > 1 && x.len() >= PAR_MIN {
            x.par_chunks(block)
                .zip(out.par_chunks_mut(block))
                .for_each(sort_block);
        } else {
            x.chunks(block)
                .zip(out.chunks_mut(block))
                .for_each(sort_block);
        }
        Ok(out)
    }
    let g = (outer, n, inner);
    let d = descending;
    let no_nan = |_: i64| false;
    Ok(CpuData::I64(match data {
        CpuData::F32(v) => go(&v[range], g, d, |x| x, f32::is_nan)?,
        CpuData::F64(v) => go(&v[range], g, d, |x| x, f64::is_nan)?,
        CpuData::F16(v) => go(&v[range], g, d, |x| x.to_f32(), f32::is_nan)?,
        CpuData::BF16(v) => go(&v[range], g, d, |x| x.to_f32(), f32::is_nan)?,
        CpuData::I64(v) => go(&v[range], g, d, |x| x, no_nan)?,
        CpuData::U8(v) => go(&v[range], g, d, |x| x as i64, no_nan)?,
        CpuData::Bool(v) => go(&v[range], g, d, |x| x as i64, no_nan)?,
    }))
}

/// Where each of the contiguous `vals` of `values` (`per` to each row) goes in its
/// row (of `m`) of the contiguous sorted sequences `seq` of `data`, by PyTorch's
/// binary search: the same midpoints, and an element goes before the value
/// unless it is at or above it (above it, with `right`), so NaNs in a sequence
/// give PyTorch's answers and a NaN value goes after every element. int64.
pub(crate) fn searchsorted(
    data: &CpuData,
    seq: std::ops::Range<usize>,
    values: &CpuData,
    vals: std::ops::Range<usize>,
    (m, per): (usize, usize),
    right: bool,
) -> Result<CpuData> {
    fn go<T: Copy + Send + Sync, K: PartialOrd + Copy>(
        s: &[T],
        v: &[T],
        (m, per): (usize, usize),
        right: bool,
        key: impl Fn(T) -> K + Sync,
    ) -> Result<Vec<i64>> {
        let mut out = alloc_uninit::<i64>(v.len())?;
        if m == 0 {
            out.fill(0);
            return Ok(out);
        }
        let per = per.max(1);
        let find = |i: usize| -> i64 {
            let row = &s[(i / per) * m..][..m];
            let x = key(v[i]);
            let (mut lo, mut hi) = (0usize, m);
            while lo < hi {
                let mid = lo + ((hi - lo) >> 1);
                let e = key(row[mid]);
                // the element goes before the value unless this holds (false
                // for a NaN on either side)
                let at_or_above = if right { e > x } else { e >= x };
                hi = if at_or_above { mid } else { hi };
                lo = if at_or_above { lo } else { mid + 1 };
            }
            lo as i64
        };
        const CHUNK: usize = 4096;
        let fill = |(c, o): (usize, &mut [i64])| {
            for (j, r) in o.iter_mut().enumerate() {
                *r = find(c * CHUNK + j);
            }
        };
        if v.len() * (usize::BITS - m.leading_zeros()) as usize >= PAR_MIN {
            out.par_chunks_mut(CHUNK).enumerate().for_each(fill);
        } else {
            out.chunks_mut(CHUNK).enumerate().for_each(fill);
        }
        Ok(out)
    }
    let g = (m, per);
    Ok(CpuData::I64(match (data, values) {
        (CpuData::F32(s), CpuData::F32(v)) => go(&s[seq], &v[vals], g, right, |x| x)?,
        (CpuData::F64(s), CpuData::F64(v)) => go(&s[seq], &v[vals], g, right, |x| x)?,
        (CpuData::F16(s), CpuData::F16(v)) => go(&s[seq], &v[vals], g, right, |x| x.to_f32())?,
        (CpuData::BF16(s), CpuData::BF16(v)) => go(&s[seq], &v[vals], g, right, |x| x.to_f32())?,
        (CpuData::I64(s), CpuData::I64(v)) => go(&s[seq], &v[vals], g, right, |x| x)?,
        (CpuData::U8(s), CpuData::U8(v)) => go(&s[seq], &v[vals], g, right, |x| x)?,
        (CpuData::Bool(s), CpuData::Bool(v)) => go(&s[seq], &v[vals], g, right, |x| x)?,
        _ => {
            return Err(crate::error::Error::invalid(
                "searchsorted",
                "the sequence and the values must have one dtype",
            ))
        }
    }))
}

/// Runs `op` over `dims`. Sums of integers and bools give i64; arg-reductions give
/// i64 indices into the lane; everything else keeps the dtype.
pub(crate) fn reduce(data: &CpuData, l: &Layout, dims: &[usize], op: ReduceOp) -> Result<CpuData> {
    use ReduceOp::*;
    Ok(match data {
        CpuData::F32(v) => reduce_float(v, l, dims, op)?,
        CpuData::F64(v) => reduce_float(v, l, dims, op)?,
        CpuData::F16(v) => reduce_float(v, l, dims, op)?,
        CpuData::BF16(v) => reduce_float(v, l, dims, op)?,
        CpuData::I64(v) => reduce_int(v, l, dims, op, |x| x)?,
        CpuData::U8(v) => match op {
            Sum | ArgMax | ArgMin => reduce_int(v, l, dims, op, |x| x as i64)?,
            _ => CpuData::U8(reduce_lanes(v, l, dims, |s| match op {
                Max => s.iter().copied().max().unwrap_or(0),
                _ => s.iter().copied().min().unwrap_or(0),
            })?),
        },
        CpuData::Bool(v) => match op {
            Sum | ArgMax | ArgMin => reduce_int(v, l, dims, op, |x| x as i64)?,
            _ => CpuData::Bool(reduce_lanes(v, l, dims, |s| match op {
                Max => s.iter().any(|&b| b),
                _ => s.iter().all(|&b| b),
            })?),
        },
    })
}

fn reduce_int<T: Copy + Send + Sync>(
    v: &[T],
    l: &Layout,
    dims: &[usize],
    op: ReduceOp,
    to: impl Fn(T) -> i64 + Sync + Copy,
) -> Result<CpuData> {
    use ReduceOp::*;
    reduce_lanes(v, l, dims, |s| match op {
        Sum => s.iter().fold(0i64, |a, &x| a.wrapping_add(to(x))),
        Max => s.iter().map(|&x| to(x)).max().unwrap_or(0),
        Min => s.iter().map(|&x| to(x)).min().unwrap_or(0),
        ArgMax => arg_best(s.iter().map(|&x| to(x)), |a, b| a > b),
        ArgMin => arg_best(s.iter().map(|&x| to(x)), |a, b| a < b),
        // mean and var of integers are rejected before reaching the kernel
        Mean | Var(_) | Std(_) => 0,
    })
    .map(CpuData::I64)
}

/// Index of the first element that no later element beats.
fn arg_best<A: Copy>(it: impl Iterator<Item = A>, better: impl Fn(A, A) -> bool) -> i64 {
    let mut best: Option<(usize, A)> = None;
    for (i, x) in it.enumerate() {
        match best {
            Some((_, b)) if !better(x, b) => {}
            _ => best = Some((i, x)),
        }
    }
    best.map_or(0, |(i, _)| i as i64)
}

fn reduce_float<T: SliceMath>(
    v: &[T],
    l: &Layout,
    dims: &[usize],
    op: ReduceOp,
) -> Result<CpuData> {
    use ReduceOp::*;
    let nan = T::Acc::nan();
    if let Some(out) = contiguous_sum(v, l, dims, op) {
        return out;
    }
    Ok(match op {
        Sum => T::wrap(reduce_lanes(v, l, dims, |s| T::from_acc(T::sum_slice(s)))?),
        Mean => T::wrap(reduce_lanes(v, l, dims, |s| {
            T::from_acc(T::sum_slice(s) / T::Acc::c(s.len() as f64))
        })?),
        // empty lanes were refused before reaching here (no identity)
        Max => T::wrap(reduce_lanes(v, l, dims, |s| T::from_acc(T::max_slice(s)))?),
        Min => T::wrap(reduce_lanes(v, l, dims, |s| {
            let mut best: Option<T::Acc> = None;
            for &x in s {
                let x = x.to_acc();
                if x.is_nan() {
                    return T::from_acc(nan);
                }
                best = Some(match best {
                    Some(b) if b <= x => b,
                    _ => x,
                });
            }
            T::from_acc(best.unwrap_or(nan))
        })?),
        // NaN counts as the largest and the smallest value, as in PyTorch
        ArgMax => CpuData::I64(reduce_lanes(v, l, dims, |s| {
            arg_best(s.iter().map(|x| x.to_acc()), |a, b| {
                !b.is_nan() && (a.is_nan() || a > b)
            })
        })?),
        ArgMin => CpuData::I64(reduce_lanes(v, l, dims, |s| {
            arg_best(s.iter().map(|x| x.to_acc()), |a, b| {
                !b.is_nan() && (a.is_nan() || a < b)
            })
        })?),
        Var(correction) | Std(correction) => T::wrap(reduce_lanes(v, l, dims, |s| {
            // two passes in f64: PyTorch-level accuracy for f32 inputs, and no
            // overflow of the squares of f32 values (the standard deviation of
            // values near 1e30 is finite even where their variance is not)
            let n = s.len() as f64;
            let mean = sum_acc(s, |x: T| x.to_f64()) / n;
            let ss = sum_acc(s, |x: T| {
                let d = x.to_f64() - mean;
                d * d
            });
            let var = ss / (n - correction).max(0.0);
            T::from_f64(if matches!(op, Std(_)) {
                var.sqrt()
            } else {
                var
            })
        })?),
    })
}

/// Sums and means of a contiguous array over its leading dims (by rows, see
/// [`column_sums`]) or over a short last lane (a row of class scores: one plain loop
/// per output instead of the blocked sum); `None` for every other reduction.
fn contiguous_sum<T: SliceMath>(
    v: &[T],
    l: &Layout,
    dims: &[usize],
    op: ReduceOp,
) -> Option<Result<CpuData>> {
    let lane: usize = dims.iter().map(|&d| l.shape()[d]).product();
    if !matches!(op, ReduceOp::Sum | ReduceOp::Mean)
        || !l.is_contiguous()
        || dims.len() >= l.rank()
        || lane == 0
    {
        return None;
    }
    let x = &v[l.offset()..l.offset() + l.numel()];
    let n = T::Acc::c(lane as f64);
    let finish = |s: T::Acc| T::from_acc(if op == ReduceOp::Mean { s / n } else { s });
    if are_leading(dims) {
        return Some(leading_sums(x, lane, finish));
    }
    if !are_trailing(dims, l.rank()) || lane > SHORT_LANE {
        return None;
    }
    Some(short_lane_sums(x, lane, finish))
}

/// `finish` of each column's sum of the contiguous `[rows, len / rows]` array `x`.
fn leading_sums<T: SliceMath>(
    x: &[T],
    rows: usize,
    finish: impl Fn(T::Acc) -> T,
) -> Result<CpuData> {
    let sums = column_sums(x, rows, x.len() / rows)?;
    let mut out = alloc_uninit::<T>(sums.len())?;
    for (o, &s) in out.iter_mut().zip(&sums) {
        *o = finish(s);
    }
    recycle(sums);
    Ok(T::wrap(out))
}

/// `finish` of the sum of each run of `lane` values of `x`, one plain loop each.
fn short_lane_sums<T: SliceMath>(
    x: &[T],
    lane: usize,
    finish: impl Fn(T::Acc) -> T + Sync,
) -> Result<CpuData> {
    let mut out = alloc_uninit::<T>(x.len() / lane)?;
    let body = |(o, s): (&mut T, &[T])| {
        *o = finish(s.iter().fold(T::Acc::zero(), |a, &b| a + b.to_acc()));
    };
    if x.len() >= PAR_MIN {
        out.par_iter_mut()
            .zip(x.par_chunks_exact(lane))
            .for_each(body);
    } else {
        out.iter_mut().zip(x.chunks_exact(lane)).for_each(body);
    }
    Ok(T::wrap(out))
}

/// Contiguous last lanes up to this long are summed in one plain loop each.
const SHORT_LANE: usize = 16;

/// Rows summed one by one into per-column accumulators, at least this many (more
/// for narrow arrays, up to [`COLUMN_BLOCK_MAX`], so that a block holds about
/// [`COLUMN_BLOCK_ELEMS`] values); longer row ranges are halved and the halves'
/// sums added.
const COLUMN_BLOCK: usize = 128;
const COLUMN_BLOCK_MAX: usize = 1024;
const COLUMN_BLOCK_ELEMS: usize = 1 << 13;
/// Columns summed together over a block's rows: their accumulators stay in the
/// L1 cache.
const COLUMN_TILE: usize = 2048;

/// Per-column sums, in the accumulator type, of the contiguous `[rows, cols]` array
/// `x` (a reduction over leading dims: a bias gradient, a mean over the batch).
/// Rows are added into per-column accumulators, so the inner loop runs along a row
/// (and vectorises) instead of striding down each column; row ranges are halved
/// down to blocks of [`COLUMN_BLOCK`] to [`COLUMN_BLOCK_MAX`] rows and the halves
/// added, so rounding grows with the block length and the log of the number of
/// blocks, not with `rows`.
pub(crate) fn column_sums<T: SliceMath>(x: &[T], rows: usize, cols: usize) -> Result<Vec<T::Acc>> {
    // pooled buffers: fresh pages would cost more than the sums
    let mut out = alloc_filled(cols, T::Acc::zero())?;
    // few rows but wide: split the columns over threads instead
    if rows < 2 * COLUMN_BLOCK && rows * cols >= PAR_MIN && cols >= 2 * COLUMN_TILE {
        let width = cols.div_ceil(rayon::current_num_threads()).max(COLUMN_TILE);
        out.par_chunks_mut(width)
            .enumerate()
            .try_for_each(|(i, o)| sum_rows(x, cols, 0..rows, i * width, o))?;
    } else {
        sum_rows(x, cols, 0..rows, 0, &mut out)?;
    }
    Ok(out)
}

/// Adds `x[r][c0 + j]` over `rows` into `out[j]` (zeroed by the caller).
fn sum_rows<T: SliceMath>(
    x: &[T],
    cols: usize,
    rows: std::ops::Range<usize>,
    c0: usize,
    out: &mut [T::Acc],
) -> Result<()> {
    let block = (COLUMN_BLOCK_ELEMS / cols.max(1)).clamp(COLUMN_BLOCK, COLUMN_BLOCK_MAX);
    if rows.len() <= block {
        for (t, o) in out.chunks_mut(COLUMN_TILE).enumerate() {
            let c = c0 + t * COLUMN_TILE;
            let width = o.len();
            let row = |r: usize| &x[r * cols + c..r * cols + c + width];
            // four rows per pass over the accumulators
            let mut r = rows.start;
            while r + 4 <= rows.end {
                let rows4 = row(r)
                    .iter()
                    .zip(row(r + 1))
                    .zip(row(r + 2))
                    .zip(row(r + 3));
                for (a, (((&p, &q), &u), &w)) in o.iter_mut().zip(rows4) {
                    *a = *a + ((p.to_acc() + q.to_acc()) + (u.to_acc() + w.to_acc()));
                }
                r += 4;
            }
            for r in r..rows.end {
                for (a, &v) in o.iter_mut().zip(row(r)) {
                    *a = *a + v.to_acc();
                }
            }
        }
        return Ok(());
    }
    let mid = rows.start + rows.len() / 2;
    let mut right = alloc_filled(out.len(), T::Acc::zero())?;
    if rows.len() * out.len() >= PAR_MIN {
        let (a, b) = rayon::join(
            || sum_rows(x, cols, rows.start..mid, c0, out),
            || sum_rows(x, cols, mid..rows.end, c0, &mut right),
        );
        a?;
        b?;
    } else {
        sum_rows(x, cols, rows.start..mid, c0, out)?;
        sum_rows(x, cols, mid..rows.end, c0, &mut right)?;
    }
    for (o, r) in out.iter_mut().zip(&right) {
        *o = *o + *r;
    }
    recycle(right);
    Ok(())
}

/// The largest value of a slice in the accumulator type in eight independent
/// lanes, NaN if it holds one, -inf if empty: the default of
/// [`SliceMath::max_slice`].
pub(crate) fn max_lanes<T: FloatDType>(src: &[T]) -> T::Acc {
    // a lane that has seen NaN keeps it: nothing compares greater than NaN
    let pick = |a: T::Acc, b: T::Acc| if b > a || b.is_nan() { b } else { a };
    let mut lanes = [T::Acc::neg_infinity(); 8];
    let chunks = src.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for j in 0..8 {
            lanes[j] = pick(lanes[j], c[j].to_acc());
        }
    }
    let tail = rest
        .iter()
        .fold(T::Acc::neg_infinity(), |a, v| pick(a, v.to_acc()));
    lanes.into_iter().fold(tail, pick)
}

/// Softmax (or log-softmax) along rows of length `row` of a contiguous buffer,
/// subtracting each row's max first so large inputs do not overflow. `None` for
/// non-float dtypes.
pub(crate) fn softmax_rows(
    data: &CpuData,
    range: std::ops::Range<usize>,
    row: usize,
    log: bool,
) -> Option<Result<CpuData>> {
    fn go<T: SliceMath>(x: &[T], row: usize, log: bool) -> Result<CpuData> {
        let mut out = alloc_uninit::<T>(x.len())?;
        // inlined into each of vmath::simd's copies
        let body = {
            #[inline(always)]
            |(src, dst): (&[T], &mut [T])| {
                let m = T::max_slice(src);
                // a row of -inf stays finite-free: exp(-inf - -inf) is NaN, as in PyTorch
                if !log && std::mem::size_of::<T>() == std::mem::size_of::<T::Acc>() {
                    // f32/f64: each exp once, kept in the output, then scaled (same values
                    // as computing it twice: T is the accumulator type)
                    for (d, &v) in dst.iter_mut().zip(src) {
                        *d = T::from_acc((v.to_acc() - m).vexp());
                    }
                    let inv = T::sum_slice(dst).recip();
                    for d in dst.iter_mut() {
                        *d = T::from_acc(d.to_acc() * inv);
                    }
                    return;
                }
                let sum = sum_acc(src, |v: T| (v.to_acc() - m).vexp());
                if log {
                    let lse = sum.ln();
                    for (d, &v) in dst.iter_mut().zip(src) {
                        *d = T::from_acc(v.to_acc() - m - lse);
                    }
                } else {
                    let inv = sum.recip();
                    for (d, &v) in dst.iter_mut().zip(src) {
                        *d = T::from_acc((v.to_acc() - m).vexp() * inv);
                    }
                }
            }
        };
        if row == 0 {
            return Ok(T::wrap(out));
        }
        let body = |rows: (&[T], &mut [T])| {
            super::vmath::simd(
                #[inline(always)]
                || body(rows),
            )
        };
        if x.len() >= PAR_MIN && x.len() / row > 1 {
            x.par_chunks(row)
                .zip(out.par_chunks_mut(row))
                .for_each(body);
        } else {
            x.chunks(row).zip(out.chunks_mut(row)).for_each(body);
        }
        Ok(T::wrap(out))
    }
    crate::dtype::dispatch_float!(data, v => Some(go(&v[range], row, log)), _other => None)
}

/// `Σ a·b` of two rows in the accumulator type, in eight independent lanes (a
/// loop that vectorises).
#[inline(always)]
fn dot_acc<T: SliceMath>(a: &[T], b: &[T]) -> T::Acc {
    let mut acc = [T::Acc::zero(); 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let (at, bt) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for j in 0..8 {
            acc[j] = acc[j] + x[j].to_acc() * y[j].to_acc();
        }
    }
    let mut s = acc.iter().fold(T::Acc::zero(), |s, &v| s + v);
    for (x, y) in at.iter().zip(bt) {
        s = s + x.to_acc() * y.to_acc();
    }
    s
}

/// `d`'s elements if they are `like`'s type (for the second and third operands
/// of a primitive dispatched on its first).
pub(super) fn same<'a, T: crate::dtype::CpuElem>(_like: &[T], d: &'a CpuData) -> Option<&'a [T]> {
    T::slice(d)
}

/// The input gradient of [`softmax_rows`] from the output's gradient `g` and the
/// output `y` (one float dtype, rows of `row` elements): `y · (g - Σ g·y)`, or
/// `g - exp(y) · Σ g` for log-softmax, summed in the accumulator type. `None` when
/// the dtypes are not one float dtype.
pub(crate) fn softmax_backward_rows(
    g: (&CpuData, std::ops::Range<usize>),
    y: (&CpuData, std::ops::Range<usize>),
    row: usize,
    log: bool,
) -> Option<Result<CpuData>> {
    fn go<T: SliceMath>(g: &[T], y: &[T], row: usize, log: bool) -> Result<CpuData> {
        let mut out = alloc_uninit::<T>(g.len())?;
        let body = |((gr, yr), dst): ((&[T], &[T]), &mut [T])| {
            super::vmath::simd(
                #[inline(always)]
                || {
                    if log {
                        let s = T::sum_slice(gr);
                        for ((d, a), b) in dst.iter_mut().zip(gr).zip(yr) {
                            *d = T::from_acc(a.to_acc() - b.to_acc().vexp() * s);
                        }
                    } else {
                        let s = dot_acc(gr, yr);
                        for ((d, a), b) in dst.iter_mut().zip(gr).zip(yr) {
                            *d = T::from_acc(b.to_acc() * (a.to_acc() - s));
                        }
                    }
                },
            )
        };
        if let Some(rows) = g.len().checked_div(row) {
            if g.len() >= PAR_MIN && rows > 1 {
                g.par_chunks(row)
                    .zip(y.par_chunks(row))
                    .zip(out.par_chunks_mut(row))
                    .for_each(body);
            } else {
                g.chunks(row)
                    .zip(y.chunks(row))
                    .zip(out.chunks_mut(row))
                    .for_each(body);
            }
        }
        Ok(T::wrap(out))
    }
    let (gd, gr) = g;
    let (yd, yr) = y;
    crate::dtype::dispatch_float!(gd, v => {
        let ys = same(v, yd)?;
        Some(go(&v[gr], &ys[yr], row, log))
    }, _other => None)
}

/// Normalises each row of `row` elements: `xhat = (x - mean) · rstd`, or `x ·
/// rstd` with `rms`, where `rstd = 1 / sqrt(var + eps)` (the biased variance; the
/// mean square with `rms`), two passes over the row in the accumulator type, then
/// `xhat · w + b` with the parts given (`[row]` slices in the rows' dtype). Returns
/// the rows and each row's (mean, rstd) pair in the accumulator type; `None` for a
/// dtype that is not float, or parts of another dtype.
pub(crate) fn norm_rows(
    (data, range): (&CpuData, std::ops::Range<usize>),
    row: usize,
    (eps, rms): (f64, bool),
    (w, b): (Option<Stat>, Option<Stat>),
) -> Option<Result<(CpuData, CpuData)>> {
    fn go<T: NormRow>(
        x: &[T],
        row: usize,
        (eps, rms): (f64, bool),
        (w, b): (Option<&[T]>, Option<&[T]>),
    ) -> Result<(CpuData, CpuData)> {
        let rows = x.len().checked_div(row).unwrap_or(0);
        let mut out = alloc_uninit::<T>(x.len())?;
        let mut stats = alloc_uninit::<T::Acc>(2 * rows)?;
        let (n, eps) = (T::Acc::c(row as f64), T::Acc::c(eps));
        let (w, b) = (norm_part(w), norm_part(b));
        let (w, b) = (w.as_deref(), b.as_deref());
        type Row<'a, T, A> = ((&'a [T], &'a mut [T]), &'a mut [A]);
        let body = |scratch: &mut Vec<T::C>, ((src, dst), st): Row<T, T::Acc>| {
            super::vmath::simd(
                #[inline(always)]
                || {
                    let src = T::row(src, scratch);
                    let mean = if rms {
                        T::Acc::zero()
                    } else {
                        T::C::sum_slice(src) / n
                    };
                    let ss = sum_acc(src, |v: T::C| {
                        let d = v.to_acc() - mean;
                        d * d
                    });
                    let s = (ss / n + eps).sqrt().recip();
                    let xhat = |v: T::C| (v.to_acc() - mean) * s;
                    // a loop per combination of parts, each without branches
                    let rows = dst.iter_mut().zip(src);
                    match (w, b) {
                        (None, None) => rows.for_each(|(d, &v)| *d = T::from_acc(xhat(v))),
                        (Some(w), None) => rows
                            .zip(w)
                            .for_each(|((d, &v), &w)| *d = T::from_acc(xhat(v) * w.to_acc())),
                        (None, Some(b)) => rows
                            .zip(b)
                            .for_each(|((d, &v), &b)| *d = T::from_acc(xhat(v) + b.to_acc())),
                        (Some(w), Some(b)) => {
                            rows.zip(w.iter().zip(b)).for_each(|((d, &v), (&w, &b))| {
                                *d = T::from_acc(xhat(v) * w.to_acc() + b.to_acc())
                            })
                        }
                    }
                    st[0] = mean;
                    st[1] = s;
                },
            )
        };
        if rows > 0 {
            if x.len() >= PAR_MIN && rows > 1 {
                x.par_chunks(row)
                    .zip(out.par_chunks_mut(row))
                    .zip(stats.par_chunks_mut(2))
                    .for_each_init(Vec::new, body);
            } else {
                let mut scratch = Vec::new();
                x.chunks(row)
                    .zip(out.chunks_mut(row))
                    .zip(stats.chunks_mut(2))
                    .for_each(|r| body(&mut scratch, r));
            }
        }
        Ok((T::wrap(out), <T::Acc as CpuElem>::wrap(stats)))
    }
    crate::dtype::dispatch_float!(data, v => {
        let w = part(v, w)?;
        let b = part(v, b)?;
        Some(go(&v[range], row, (eps, rms), (w, b)))
    }, _other => None)
}

/// The part `p` of a norm's operands as a slice of `like`'s type: `Some(None)`
/// where it is absent, `None` where its dtype differs.
fn part<'a, T: CpuElem>(like: &[T], p: Option<Stat<'a>>) -> Option<Option<&'a [T]>> {
    match p {
        None => Some(None),
        Some((d, r)) => same(like, d).map(|s| Some(&s[r])),
    }
}

/// Each row's (mean, rstd) as [`norm_rows`] returned them, for rows like `_like`.
fn norm_stats<'a, T: FloatDType>(_like: &[T], (d, r): Stat<'a>) -> Option<&'a [T::Acc]> {
    <T::Acc as CpuElem>::slice(d).map(|s| &s[r])
}

/// `Σ gw` and `Σ gw · xhat(x)` over a row, `gw = g · w` (`g` without a weight), in
/// eight lanes combined in order (as [`dot_acc`]), so that the loops vectorise.
#[inline(always)]
fn grad_sums<T: SliceMath>(
    g: &[T],
    x: &[T],
    w: Option<&[T]>,
    xhat: impl Fn(T) -> T::Acc,
) -> (T::Acc, T::Acc) {
    let (mut a, mut b) = ([T::Acc::zero(); 8], [T::Acc::zero(); 8]);
    let (mut ta, mut tb) = (T::Acc::zero(), T::Acc::zero());
    let mut add = |gw: T::Acc, v: T, lane: Option<usize>| {
        let p = gw * xhat(v);
        match lane {
            Some(l) => {
                a[l] = a[l] + gw;
                b[l] = b[l] + p;
            }
            None => {
                ta = ta + gw;
                tb = tb + p;
            }
        }
    };
    let (gc, xc) = (g.chunks_exact(8), x.chunks_exact(8));
    let (gt, xt) = (gc.remainder(), xc.remainder());
    match w {
        None => {
            for (gs, xs) in gc.zip(xc) {
                for l in 0..8 {
                    add(gs[l].to_acc(), xs[l], Some(l));
                }
            }
            for (&g, &v) in gt.iter().zip(xt) {
                add(g.to_acc(), v, None);
            }
        }
        Some(w) => {
            let wc = w.chunks_exact(8);
            let wt = wc.remainder();
            for ((gs, xs), ws) in gc.zip(xc).zip(wc) {
                for l in 0..8 {
                    add(gs[l].to_acc() * ws[l].to_acc(), xs[l], Some(l));
                }
            }
            for ((&g, &v), &w) in gt.iter().zip(xt).zip(wt) {
                add(g.to_acc() * w.to_acc(), v, None);
            }
        }
    }
    let total = |l: [T::Acc; 8]| l.into_iter().fold(T::Acc::zero(), |s, v| s + v);
    (total(a) + ta, total(b) + tb)
}

/// A norm backward's operands: the output's gradient, the input, each row's
/// (mean, rstd) and the weight.
type NormGrad<'a, T> = (
    &'a [T],
    &'a [T],
    &'a [<T as FloatDType>::Acc],
    Option<&'a [T]>,
);

/// The input gradient of [`norm_rows`] from its output's gradient `g`, its input
/// `x`, each row's (mean, rstd) and the weight `w` (all contiguous; `g`, `x` and
/// `w` of one float dtype, the statistics in its accumulator dtype): with `gw =
/// g · w` and `xhat = (x - mean) · rstd`, `rstd · (gw - mean(gw) - xhat ·
/// mean(gw · xhat))`, without the `mean(gw)` term for `rms`. `None` when the
/// dtypes do not fit.
pub(crate) fn norm_rows_backward(
    (g, x, stats, w): (Stat, Stat, Stat, Option<Stat>),
    row: usize,
    rms: bool,
) -> Option<Result<CpuData>> {
    fn go<T: NormRow + CpuElem>(
        (g, x, stats, w): NormGrad<T>,
        row: usize,
        rms: bool,
    ) -> Result<CpuData> {
        let mut out = alloc_uninit::<T>(g.len())?;
        let n = T::Acc::c(row as f64);
        let w = norm_part(w);
        let w = w.as_deref();
        type Row<'a, T, A> = (((&'a [T], &'a [T]), &'a mut [T]), &'a [A]);
        type Scratch<C> = (Vec<C>, Vec<C>);
        let body = |(sg_, sx_): &mut Scratch<T::C>, (((gr, xr), dst), st): Row<T, T::Acc>| {
            super::vmath::simd(
                #[inline(always)]
                || {
                    let (gr, xr) = (T::row(gr, sg_), T::row(xr, sx_));
                    let (m, s) = (st[0], st[1]);
                    let xhat = |v: T::C| (v.to_acc() - m) * s;
                    let (sg, sgx) = grad_sums(gr, xr, w, xhat);
                    let mg = if rms { T::Acc::zero() } else { sg / n };
                    let mgx = sgx / n;
                    let dx = |gw: T::Acc, v: T::C| T::from_acc(s * (gw - mg - xhat(v) * mgx));
                    let rows = dst.iter_mut().zip(gr.iter().zip(xr));
                    match w {
                        None => rows.for_each(|(d, (&g, &v))| *d = dx(g.to_acc(), v)),
                        Some(w) => rows
                            .zip(w)
                            .for_each(|((d, (&g, &v)), &w)| *d = dx(g.to_acc() * w.to_acc(), v)),
                    }
                },
            )
        };
        if let Some(rows) = g.len().checked_div(row) {
            if g.len() >= PAR_MIN && rows > 1 {
                g.par_chunks(row)
                    .zip(x.par_chunks(row))
                    .zip(out.par_chunks_mut(row))
                    .zip(stats.par_chunks(2))
                    .for_each_init(Default::default, body);
            } else {
                let mut scratch = Default::default();
                g.chunks(row)
                    .zip(x.chunks(row))
                    .zip(out.chunks_mut(row))
                    .zip(stats.chunks(2))
                    .for_each(|r| body(&mut scratch, r));
            }
        }
        Ok(T::wrap(out))
    }
    let (gd, gr) = g;
    crate::dtype::dispatch_float!(gd, v => {
        let xs = same(v, x.0)?;
        let st = norm_stats(v, stats)?;
        let w = part(v, w)?;
        Some(go((&v[gr], &xs[x.1], st, w), row, rms))
    }, _other => None)
}

/// The weight and bias gradients of [`norm_rows`] from its output's gradient
/// `g`, its input `x` and each row's (mean, rstd) (as for
/// [`norm_rows_backward`]): the sums over rows of `g · xhat` and of `g`, `[row]`
/// each in the rows' dtype, each chunk of rows of [`norm_affine_chunks`] summed
/// in the accumulator type and the chunks' sums added in order. `None` when the
/// dtypes do not fit.
pub(crate) fn norm_affine_backward(
    (g, x, stats): (Stat, Stat, Stat),
    row: usize,
) -> Option<Result<(CpuData, CpuData)>> {
    fn go<T: NormRow + CpuElem>(
        (g, x, stats): (&[T], &[T], &[T::Acc]),
        row: usize,
    ) -> Result<(CpuData, CpuData)> {
        let rows = g.len().checked_div(row).unwrap_or(0);
        let (_, per_chunk) = norm_affine_chunks(rows);
        // one chunk's column sums: g · xhat in [0, row), g in [row, 2 row)
        let chunk = |c: usize| -> Vec<T::Acc> {
            let mut acc = vec![T::Acc::zero(); 2 * row];
            let (dw, db) = acc.split_at_mut(row);
            let (mut sg, mut sx) = (Vec::new(), Vec::new());
            for r in c * per_chunk..((c + 1) * per_chunk).min(rows) {
                let (m, s) = (stats[2 * r], stats[2 * r + 1]);
                let (gr, xr) = (&g[r * row..(r + 1) * row], &x[r * row..(r + 1) * row]);
                super::vmath::simd(
                    #[inline(always)]
                    || {
                        let (gr, xr) = (T::row(gr, &mut sg), T::row(xr, &mut sx));
                        for (((w, b), &a), &v) in dw.iter_mut().zip(db.iter_mut()).zip(gr).zip(xr) {
                            let gv = a.to_acc();
                            *w = *w + gv * ((v.to_acc() - m) * s);
                            *b = *b + gv;
                        }
                    },
                );
            }
            acc
        };
        let chunks = if row == 0 {
            0
        } else {
            rows.div_ceil(per_chunk)
        };
        let parts: Vec<Vec<T::Acc>> = if g.len() >= PAR_MIN {
            (0..chunks).into_par_iter().map(chunk).collect()
        } else {
            (0..chunks).map(chunk).collect()
        };
        // each its own pooled buffer
        let (mut dw, mut db) = (alloc_uninit::<T>(row)?, alloc_uninit::<T>(row)?);
        for (i, o) in dw.iter_mut().chain(db.iter_mut()).enumerate() {
            let s = parts.iter().fold(T::Acc::zero(), |s, p| s + p[i]);
            *o = T::from_acc(s);
        }
        Ok((T::wrap(dw), T::wrap(db)))
    }
    let (gd, gr) = g;
    crate::dtype::dispatch_float!(gd, v => {
        let xs = same(v, x.0)?;
        let st = norm_stats(v, stats)?;
        Some(go((&v[gr], &xs[x.1], st), row))
    }, _other => None)
}

/// Each row's cross-entropy and (max, log-sum) pair (see
/// `BackendStorage::cross_entropy_rows`), in the accumulator dtype; None for a
/// dtype that is not a float.
pub(crate) fn cross_entropy_rows(
    data: &CpuData,
    range: std::ops::Range<usize>,
    row: usize,
    target: &[i64],
    opts: CeOpts,
) -> Option<Result<(CpuData, CpuData)>> {
    fn go<T: SliceMath>(
        x: &[T],
        row: usize,
        target: &[i64],
        CeOpts {
            ignore,
            smoothing,
            half_steps,
        }: CeOpts,
    ) -> Result<(CpuData, CpuData)> {
        let rows = target.len();
        let mut loss = alloc_uninit::<T::Acc>(rows)?;
        let mut lse = alloc_uninit::<T::Acc>(2 * rows)?;
        let (ls, keep, n) = (
            T::Acc::c(smoothing),
            T::Acc::c(1.0 - smoothing),
            T::Acc::c(row as f64),
        );
        let body = |((src, &t), (l, s)): CeRow<'_, T, T::Acc>| {
            super::vmath::simd(
                #[inline(always)]
                || {
                    // lse = m + e, kept apart: lse - x is taken as (m - x) + e, which
                    // loses nothing where the logits are large and close
                    let m = T::max_slice(src);
                    let e = sum_acc(src, |v: T| (v.to_acc() - m).vexp()).ln();
                    s[0] = m;
                    s[1] = e;
                    *l = if t == ignore {
                        T::Acc::zero()
                    } else if t < 0 || t as usize >= row {
                        T::Acc::nan()
                    } else if half_steps {
                        // the log-probability as a log-softmax in T keeps it
                        -T::from_acc((src[t as usize].to_acc() - m) - e).to_acc()
                    } else {
                        let hit = (m - src[t as usize].to_acc()) + e;
                        let spread = if smoothing == 0.0 {
                            T::Acc::zero()
                        } else {
                            (m - T::sum_slice(src) / n) + e
                        };
                        keep * hit + ls * spread
                    };
                },
            )
        };
        if row > 0 {
            if x.len() >= PAR_MIN && rows > 1 {
                x.par_chunks(row)
                    .zip(target.par_iter())
                    .zip(loss.par_iter_mut().zip(lse.par_chunks_mut(2)))
                    .for_each(body);
            } else {
                x.chunks(row)
                    .zip(target)
                    .zip(loss.iter_mut().zip(lse.chunks_mut(2)))
                    .for_each(body);
            }
        } else {
            // no classes: the maximum and log Σ over nothing are -inf
            lse.fill(T::Acc::neg_infinity());
            for (l, &t) in loss.iter_mut().zip(target) {
                *l = if t == ignore {
                    T::Acc::zero()
                } else {
                    T::Acc::nan()
                };
            }
        }
        Ok((
            <T::Acc as crate::dtype::CpuElem>::wrap(loss),
            <T::Acc as crate::dtype::CpuElem>::wrap(lse),
        ))
    }
    crate::dtype::dispatch_float!(data, v => Some(go(&v[range], row, target, opts)), _other => None)
}

/// One row of logits and its target, with the row's loss and (max, log-sum) to
/// write.
type CeRow<'a, T, A> = ((&'a [T], &'a i64), (&'a mut A, &'a mut [A]));

/// One row of logits and of their gradient to write, with the row's target,
/// (max, log-sum) and loss gradient.
type CeGradRow<'a, T, A> = ((&'a [T], &'a mut [T]), ((&'a i64, &'a [A]), &'a A));

/// A statistics array and the range of it an op reads.
pub(super) type Stat<'a> = (&'a CpuData, std::ops::Range<usize>);

/// The logits' gradient of [`cross_entropy_rows`] from each row's (max, log-sum) pair and loss
/// gradient `g` (accumulator dtype); None where the dtypes do not fit.
pub(crate) fn cross_entropy_rows_backward(
    (data, range): (&CpuData, std::ops::Range<usize>),
    row: usize,
    target: &[i64],
    ((lse, rl), (g, rg)): (Stat, Stat),
    opts: CeOpts,
) -> Option<Result<CpuData>> {
    fn go<T: SliceMath>(
        x: &[T],
        row: usize,
        target: &[i64],
        (lse, g): (&[T::Acc], &[T::Acc]),
        CeOpts {
            ignore,
            smoothing,
            half_steps,
        }: CeOpts,
    ) -> Result<CpuData> {
        let mut out = alloc_uninit::<T>(x.len())?;
        let hit = T::Acc::c(1.0 - smoothing);
        let off = T::Acc::c(smoothing / row as f64);
        let body = |((src, dst), ((&t, s), &gi)): CeGradRow<'_, T, T::Acc>| {
            super::vmath::simd(
                #[inline(always)]
                || {
                    if t == ignore {
                        dst.fill(T::from_acc(T::Acc::zero()));
                        return;
                    }
                    let (m, e) = (s[0], s[1]);
                    if half_steps {
                        // a log-softmax's backward from the log-probabilities it
                        // kept in T, the loss's gradient at the target
                        for (d, &v) in dst.iter_mut().zip(src) {
                            let p = T::from_acc((v.to_acc() - m) - e).to_acc().vexp();
                            *d = T::from_acc(gi * p);
                        }
                        if t >= 0 && (t as usize) < row {
                            let j = t as usize;
                            let p = T::from_acc((src[j].to_acc() - m) - e).to_acc().vexp();
                            dst[j] = T::from_acc(gi * p - gi);
                        }
                        return;
                    }
                    for (d, &v) in dst.iter_mut().zip(src) {
                        *d = T::from_acc(gi * (((v.to_acc() - m) - e).vexp() - off));
                    }
                    if t >= 0 && (t as usize) < row {
                        let j = t as usize;
                        let p = ((src[j].to_acc() - m) - e).vexp();
                        dst[j] = T::from_acc(gi * (p - off - hit));
                    }
                },
            )
        };
        if row > 0 {
            let per_row = target.iter().zip(lse.chunks(2)).zip(g);
            if x.len() >= PAR_MIN && target.len() > 1 {
                x.par_chunks(row)
                    .zip(out.par_chunks_mut(row))
                    .zip(target.par_iter().zip(lse.par_chunks(2)).zip(g.par_iter()))
                    .for_each(body);
            } else {
                x.chunks(row)
                    .zip(out.chunks_mut(row))
                    .zip(per_row)
                    .for_each(body);
            }
        }
        Ok(T::wrap(out))
    }
    // the statistics come in the accumulator dtype: f64 for f64, f32 otherwise
    match (data, lse, g) {
        (CpuData::F32(x), CpuData::F32(e), CpuData::F32(g)) => {
            Some(go::<f32>(&x[range], row, target, (&e[rl], &g[rg]), opts))
        }
        (CpuData::F64(x), CpuData::F64(e), CpuData::F64(g)) => {
            Some(go::<f64>(&x[range], row, target, (&e[rl], &g[rg]), opts))
        }
        (CpuData::F16(x), CpuData::F32(e), CpuData::F32(g)) => Some(go::<half::f16>(
            &x[range],
            row,
            target,
            (&e[rl], &g[rg]),
            opts,
        )),
        (CpuData::BF16(x), CpuData::F32(e), CpuData::F32(g)) => Some(go::<half::bf16>(
            &x[range],
            row,
            target,
            (&e[rl], &g[rg]),
            opts,
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_over_middle_dim() {
        // shape [2,3,2], reduce dim 1
        let v: Vec<f32> = (0..12).map(|x| x as f32).collect();
        let l = Layout::contiguous(&[2, 3, 2]);
        let out = reduce_lanes(&v, &l, &[1], |s| s.iter().sum::<f32>()).unwrap();
        assert_eq!(out, vec![6.0, 9.0, 24.0, 27.0]);
    }

    #[test]
    fn long_sums_are_accurate() {
        let v = vec![0.1f32; 1_000_000];
        let s = sum_acc(&v, |x| x);
        // PyTorch's cascade sum gives 100000.0 here; a running f32 sum is off by ~1%
        assert!((s - 100_000.0).abs() < 0.5, "{s}");
    }
}
