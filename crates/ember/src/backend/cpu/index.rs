//! Indexing kernels: index_select, gather, scatter_add. Indices are validated by
//! the caller (every value within the indexed dim).

use super::walk::Walk;
use crate::backend::host::alloc_uninit;
use crate::backend::op::{Add, NumElem};
use crate::dtype::CpuData;
use crate::layout::{contiguous_strides, Layout};
use crate::{dtype::WithDType, error::Result};

/// Picks `idx` entries along `dim` of `src`: output shape is src's with
/// `shape[dim] = idx.len()`.
pub(crate) fn index_select(src: &CpuData, l: &Layout, dim: usize, idx: &[i64]) -> Result<CpuData> {
    fn go<T: WithDType>(v: &[T], l: &Layout, dim: usize, idx: &[i64]) -> Result<CpuData> {
        let mut shape: Vec<usize> = l.shape().to_vec();
        shape[dim] = idx.len();
        // walk the output shape, reading src with dim's stride zeroed; add the row offset
        let mut strides: Vec<usize> = l.strides().to_vec();
        let dim_stride = strides[dim];
        strides[dim] = 0;
        let out_strides = contiguous_strides(&shape);
        let mut zeroed = out_strides.to_vec();
        for (d, z) in zeroed.iter_mut().enumerate() {
            *z = if d == dim { 1 } else { 0 };
        }
        let n: usize = shape.iter().product();
        let mut out = alloc_uninit::<T>(n)?;
        // K = 2: src offset without dim, and the position along dim (via a 0/1 stride)
        let w = Walk::new(&shape, [&strides, &zeroed]);
        w.for_each_run([l.offset(), 0], 0, n, |pos, len, [o, k], [s, sk]| {
            for i in 0..len {
                let row = idx[k + i * sk] as usize;
                out[pos + i] = v[o + i * s + row * dim_stride];
            }
        });
        Ok(T::wrap(out))
    }
    crate::dtype::dispatch!(src, v => go(v, l, dim, idx))
}

/// `out[p] = src[p with dim replaced by idx[p]]` over the shape of `idx`.
pub(crate) fn gather(
    src: &CpuData,
    l: &Layout,
    dim: usize,
    idx: &[i64],
    idx_shape: &[usize],
) -> Result<CpuData> {
    fn go<T: WithDType>(
        v: &[T],
        l: &Layout,
        dim: usize,
        idx: &[i64],
        ishape: &[usize],
    ) -> Result<CpuData> {
        let mut strides: Vec<usize> = l.strides()[..ishape.len()].to_vec();
        let dim_stride = strides[dim];
        strides[dim] = 0;
        let is = contiguous_strides(ishape);
        // the index storage may hold more than the index's elements (its first ones)
        let n: usize = ishape.iter().product();
        let mut out = alloc_uninit::<T>(n)?;
        let w = Walk::new(ishape, [&strides, &is]);
        w.for_each_run([l.offset(), 0], 0, n, |pos, len, [o, k], [s, sk]| {
            for i in 0..len {
                out[pos + i] = v[o + i * s + idx[k + i * sk] as usize * dim_stride];
            }
        });
        Ok(T::wrap(out))
    }
    crate::dtype::dispatch!(src, v => go(v, l, dim, idx, idx_shape))
}

/// In place on a contiguous `dst`: `dst[p with dim replaced by idx[p]] += src[p]`
/// over the shape of `idx` (`src` is laid out by `ls`, at least that large).
/// `dst[.., idx[j], ..] += src[.., j, ..]` along `dim` of the contiguous `dst`
/// (of `dst_shape`) from the contiguous view `ls` of `src`: whole runs of the
/// trailing dims at a time.
pub(crate) fn index_add(
    dst: &mut CpuData,
    dst_shape: &[usize],
    dim: usize,
    idx: &[i64],
    src: &CpuData,
    ls: &Layout,
) {
    fn go<T: NumElem>(
        d: &mut [T],
        dshape: &[usize],
        dim: usize,
        idx: &[i64],
        src: &CpuData,
        ls: &Layout,
    ) {
        let s = T::slice(src).expect("index_add: same dtype");
        let s = &s[ls.offset()..ls.offset() + ls.numel()];
        let size = dshape[dim];
        let inner: usize = dshape[dim + 1..].iter().product();
        let outer: usize = dshape[..dim].iter().product();
        let n = idx.len();
        for o in 0..outer {
            for (j, &k) in idx.iter().enumerate() {
                let at = (o * size + k as usize) * inner;
                let from = (o * n + j) * inner;
                for (a, &b) in d[at..at + inner].iter_mut().zip(&s[from..from + inner]) {
                    *a = T::binary(&Add, *a, b);
                }
            }
        }
    }
    crate::dtype::dispatch!(dst, v => go(v, dst_shape, dim, idx, src, ls))
}

pub(crate) fn scatter_add(
    dst: &mut CpuData,
    dst_shape: &[usize],
    dim: usize,
    idx: &[i64],
    idx_shape: &[usize],
    src: &CpuData,
    ls: &Layout,
) {
    fn go<T: NumElem>(
        d: &mut [T],
        dshape: &[usize],
        dim: usize,
        idx: &[i64],
        ishape: &[usize],
        src: &CpuData,
        ls: &Layout,
    ) {
        let s = T::slice(src).expect("scatter_add: same dtype");
        let mut ds = contiguous_strides(dshape).to_vec();
        let dim_stride = ds[dim];
        ds[dim] = 0;
        let is = contiguous_strides(ishape);
        let w = Walk::new(ishape, [&ds, &is, &ls.strides()[..ishape.len()]]);
        w.for_each_run(
            [0, 0, ls.offset()],
            0,
            idx.len(),
            |_, len, [o, k, so], [st, sk, ss]| {
                for i in 0..len {
                    let at = o + i * st + idx[k + i * sk] as usize * dim_stride;
                    d[at] = T::binary(&Add, d[at], s[so + i * ss]);
                }
            },
        );
    }
    crate::dtype::dispatch!(dst, v => go(v, dst_shape, dim, idx, idx_shape, src, ls))
}
