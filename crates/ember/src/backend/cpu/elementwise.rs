//! Elementwise CPU kernels: maps over one, two or three strided operands into a
//! contiguous output, strided writes for in-place ops and copies, and dtype casts.
//!
//! The operations themselves are tiny traits ([`UnaryOp`], [`BinaryOp`]) with one
//! generic float body (f16/bf16 compute in f32) and integer bodies.

use super::walk::Walk;
use crate::backend::host::{alloc_uninit, PAR_CHUNK, PAR_MIN};
use crate::backend::op::{BinaryOp, CmpOp, NumElem, Scalar, UnaryOp};
use crate::dtype::WithDType;
use crate::dtype::{CpuData, CpuElem};
use crate::error::Result;
use crate::layout::Layout;
use half::{bf16, f16};
use rayon::prelude::*;

/// Runs `g(start, chunk)` over `out` in chunks, in parallel when `out` is large.
///
/// The parallel helpers take their bodies as `&dyn Fn`: rayon's machinery is then
/// compiled once per element type instead of once per op and dtype (it was over
/// half of ember's generated code), at the cost of one indirect call per chunk.
#[inline]
fn run_chunks<U: Send>(out: &mut [U], g: &(dyn Fn(usize, &mut [U]) + Sync)) {
    if out.len() >= PAR_MIN {
        out.par_chunks_mut(PAR_CHUNK)
            .enumerate()
            .for_each(|(i, c)| g(i * PAR_CHUNK, c));
    } else {
        g(0, out);
    }
}

/// Outputs at least this large are written with non-temporal (streaming) stores:
/// they bypass the cache, so the write costs one memory transfer instead of a read
/// for ownership plus a write back.
const STREAM_MIN_BYTES: usize = 16 << 20;
const STREAM_BLOCK: usize = 512;

/// Like [`run_chunks`] for a contiguous output: `body(start, block)` fills each block.
/// Large outputs are computed block by block into a small buffer that stays in L1 and
/// streamed to memory from there, which keeps the op itself generic.
#[inline]
fn write_contiguous<U: WithDType>(out: &mut [U], body: &(dyn Fn(usize, &mut [U]) + Sync)) {
    let streaming = cfg!(target_arch = "x86_64")
        && std::mem::size_of_val(out) >= STREAM_MIN_BYTES
        && (out.as_ptr() as usize).is_multiple_of(16);
    if !streaming {
        return run_chunks(out, body);
    }
    run_chunks(out, &|s, c| {
        let mut tmp = [U::default(); STREAM_BLOCK];
        let mut blocks = c.chunks_exact_mut(STREAM_BLOCK);
        let mut at = s;
        for dst in &mut blocks {
            body(at, &mut tmp);
            // SAFETY: both blocks hold STREAM_BLOCK elements; `dst` starts at a multiple
            // of STREAM_BLOCK elements from a 16-byte-aligned base, and the block size in
            // bytes is a multiple of 16.
            unsafe {
                stream_copy(
                    dst.as_mut_ptr().cast(),
                    tmp.as_ptr().cast(),
                    std::mem::size_of_val(dst),
                )
            };
            at += STREAM_BLOCK;
        }
        let rest = blocks.into_remainder();
        if !rest.is_empty() {
            body(at, rest);
        }
        stream_fence();
    });
}

#[cfg(target_arch = "x86_64")]
unsafe fn stream_copy(dst: *mut u8, src: *const u8, bytes: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    let mut i = 0;
    while i < bytes {
        // SSE2 is part of the x86_64 baseline
        let v = _mm_loadu_si128(src.add(i) as *const __m128i);
        _mm_stream_si128(dst.add(i) as *mut __m128i, v);
        i += 16;
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn stream_copy(dst: *mut u8, src: *const u8, bytes: usize) {
    std::ptr::copy_nonoverlapping(src, dst, bytes);
}

/// Orders the streaming stores before whatever the thread does next.
fn stream_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a store fence has no preconditions.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// `out[i] = f(a[i])` over the elements of `la` in row-major order.
pub(crate) fn map1<T, U>(a: &[T], la: &Layout, f: impl Fn(T) -> U + Sync) -> Result<Vec<U>>
where
    T: Copy + Sync,
    U: WithDType,
{
    let mut out = alloc_uninit::<U>(la.numel())?;
    if let Some(r) = la.contiguous_range() {
        let src = &a[r];
        write_contiguous(&mut out, &|s, c| {
            let n = c.len();
            super::vmath::simd(
                #[inline(always)]
                || {
                    for (d, &x) in c.iter_mut().zip(&src[s..s + n]) {
                        *d = f(x);
                    }
                },
            )
        });
        return Ok(out);
    }
    let w = Walk::new(la.shape(), [la.strides()]);
    run_chunks(&mut out, &|s, c| {
        w.for_each_run([la.offset()], s, s + c.len(), |pos, len, [o], [st]| {
            let dst = &mut c[pos - s..pos - s + len];
            if st == 1 {
                for (d, &x) in dst.iter_mut().zip(&a[o..o + len]) {
                    *d = f(x);
                }
            } else {
                for (i, d) in dst.iter_mut().enumerate() {
                    *d = f(a[o + i * st]);
                }
            }
        })
    });
    Ok(out)
}

/// `out[i] = f(a[i], b[i])` where `la` and `lb` are already broadcast to one shape.
pub(crate) fn map2<T, U, V>(
    a: &[T],
    la: &Layout,
    b: &[U],
    lb: &Layout,
    f: impl Fn(T, U) -> V + Sync,
) -> Result<Vec<V>>
where
    T: Copy + Sync,
    U: Copy + Sync,
    V: WithDType,
{
    let mut out = alloc_uninit::<V>(la.numel())?;
    if let (Some(ra), Some(rb)) = (la.contiguous_range(), lb.contiguous_range()) {
        let (a, b) = (&a[ra], &b[rb]);
        write_contiguous(&mut out, &|s, c| {
            let n = c.len();
            super::vmath::simd(
                #[inline(always)]
                || {
                    for ((d, &x), &y) in c.iter_mut().zip(&a[s..s + n]).zip(&b[s..s + n]) {
                        *d = f(x, y);
                    }
                },
            )
        });
        return Ok(out);
    }
    let w = Walk::new(la.shape(), [la.strides(), lb.strides()]);
    run_chunks(&mut out, &|s, c| {
        w.for_each_run(
            [la.offset(), lb.offset()],
            s,
            s + c.len(),
            |pos, len, [oa, ob], [sa, sb]| {
                let dst = &mut c[pos - s..pos - s + len];
                match (sa, sb) {
                    (1, 1) => {
                        for ((d, &x), &y) in
                            dst.iter_mut().zip(&a[oa..oa + len]).zip(&b[ob..ob + len])
                        {
                            *d = f(x, y);
                        }
                    }
                    (1, 0) => {
                        let y = b[ob];
                        for (d, &x) in dst.iter_mut().zip(&a[oa..oa + len]) {
                            *d = f(x, y);
                        }
                    }
                    (0, 1) => {
                        let x = a[oa];
                        for (d, &y) in dst.iter_mut().zip(&b[ob..ob + len]) {
                            *d = f(x, y);
                        }
                    }
                    _ => {
                        for (i, d) in dst.iter_mut().enumerate() {
                            *d = f(a[oa + i * sa], b[ob + i * sb]);
                        }
                    }
                }
            },
        )
    });
    Ok(out)
}

/// `out[i] = f(a[i], b[i], c[i])` for three layouts broadcast to one shape.
pub(crate) fn map3<A, B, C, V>(
    (a, la): (&[A], &Layout),
    (b, lb): (&[B], &Layout),
    (c, lc): (&[C], &Layout),
    f: impl Fn(A, B, C) -> V + Sync,
) -> Result<Vec<V>>
where
    A: Copy + Sync,
    B: Copy + Sync,
    C: Copy + Sync,
    V: WithDType,
{
    let mut out = alloc_uninit::<V>(la.numel())?;
    let w = Walk::new(la.shape(), [la.strides(), lb.strides(), lc.strides()]);
    run_chunks(&mut out, &|s, chunk| {
        w.for_each_run(
            [la.offset(), lb.offset(), lc.offset()],
            s,
            s + chunk.len(),
            |pos, len, [oa, ob, oc], [sa, sb, sc]| {
                let dst = &mut chunk[pos - s..pos - s + len];
                match (sa, sb, sc) {
                    // the runs of `where` and `masked_fill`: contiguous operands, or
                    // a broadcast fill value, in loops that vectorise
                    (1, 1, 1) => {
                        let (a, b, c) = (&a[oa..oa + len], &b[ob..ob + len], &c[oc..oc + len]);
                        for (((d, &x), &y), &z) in dst.iter_mut().zip(a).zip(b).zip(c) {
                            *d = f(x, y, z);
                        }
                    }
                    (1, 0, 1) => {
                        let (a, y, c) = (&a[oa..oa + len], b[ob], &c[oc..oc + len]);
                        for ((d, &x), &z) in dst.iter_mut().zip(a).zip(c) {
                            *d = f(x, y, z);
                        }
                    }
                    (1, 1, 0) => {
                        let (a, b, z) = (&a[oa..oa + len], &b[ob..ob + len], c[oc]);
                        for ((d, &x), &y) in dst.iter_mut().zip(a).zip(b) {
                            *d = f(x, y, z);
                        }
                    }
                    _ => {
                        for (i, d) in dst.iter_mut().enumerate() {
                            *d = f(a[oa + i * sa], b[ob + i * sb], c[oc + i * sc]);
                        }
                    }
                }
            },
        )
    });
    Ok(out)
}

/// A raw pointer that may cross threads: used only to write disjoint elements.
#[derive(Clone, Copy)]
struct SendPtr<T>(*mut T);
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}
impl<T> SendPtr<T> {
    // a method (not field access) so closures capture the whole Send wrapper
    fn get(self) -> *mut T {
        self.0
    }
}

/// `f(&mut dst[j], src[i])` for each element, where `ld` (the destination view) and
/// `ls` have one shape. `ld` must not overlap itself (callers check `is_overlapping`).
pub(crate) fn zip_mut<T, U>(
    dst: &mut [T],
    ld: &Layout,
    src: &[U],
    ls: &Layout,
    f: impl Fn(&mut T, U) + Sync,
) where
    T: Copy + Send + Sync,
    U: Copy + Sync,
{
    let n = ld.numel();
    if n == 0 {
        return;
    }
    assert!(ld.storage_extent() <= dst.len() && ls.storage_extent() <= src.len());
    if let (Some(rd), Some(rs)) = (ld.contiguous_range(), ls.contiguous_range()) {
        let (d, s) = (&mut dst[rd], &src[rs]);
        let body = |d: &mut [T], s: &[U]| d.iter_mut().zip(s).for_each(|(d, &x)| f(d, x));
        let body: &(dyn Fn(&mut [T], &[U]) + Sync) = &body;
        if n >= PAR_MIN {
            d.par_chunks_mut(PAR_CHUNK)
                .zip(s.par_chunks(PAR_CHUNK))
                .for_each(|(d, s)| body(d, s));
        } else {
            body(d, s);
        }
        return;
    }
    let w = Walk::new(ld.shape(), [ld.strides(), ls.strides()]);
    let base = SendPtr(dst.as_mut_ptr());
    let body = |start: usize, end: usize| {
        w.for_each_run(
            [ld.offset(), ls.offset()],
            start,
            end,
            |_, len, [od, os], [sd, ss]| {
                for i in 0..len {
                    // SAFETY: offsets lie within `dst` (extent checked above) and a
                    // non-overlapping layout maps distinct positions to distinct
                    // elements, so parallel chunks never write the same element.
                    unsafe { f(&mut *base.get().add(od + i * sd), src[os + i * ss]) }
                }
            },
        )
    };
    par_ranges(n, &body);
}

/// `body(start, end)` over `0..n` in chunks, in parallel when `n` is large.
fn par_ranges(n: usize, body: &(dyn Fn(usize, usize) + Sync)) {
    if n >= PAR_MIN {
        (0..n.div_ceil(PAR_CHUNK))
            .into_par_iter()
            .for_each(|c| body(c * PAR_CHUNK, ((c + 1) * PAR_CHUNK).min(n)));
    } else {
        body(0, n);
    }
}

/// Converts any dtype to any dtype with PyTorch's casting rules.
pub(crate) fn cast(data: &CpuData, l: &Layout, to: crate::dtype::DType) -> Result<CpuData> {
    fn go<T: WithDType + Sync>(v: &[T], l: &Layout, to: crate::dtype::DType) -> Result<CpuData> {
        use crate::dtype::DType::*;
        Ok(match to {
            Bool => CpuData::Bool(map1(v, l, |x| bool::from_f64(x.to_f64()))?),
            U8 => CpuData::U8(map1(v, l, |x| u8::from_f64(x.to_f64()))?),
            I64 => CpuData::I64(map1(v, l, |x| i64_from(x))?),
            F16 => CpuData::F16(map1(v, l, |x| <f16 as WithDType>::from_f64(x.to_f64()))?),
            BF16 => CpuData::BF16(map1(v, l, |x| <bf16 as WithDType>::from_f64(x.to_f64()))?),
            F32 => CpuData::F32(map1(v, l, |x| x.to_f64() as f32)?),
            F64 => CpuData::F64(map1(v, l, |x| x.to_f64())?),
        })
    }
    // the casts of mixed-precision training, on every step: straight from float32
    // (the same roundings as through f64, without its branches, so they vectorise)
    match (data, to) {
        (CpuData::F32(v), crate::dtype::DType::BF16) => {
            return map1(v, l, bf16::from_f32).map(CpuData::BF16)
        }
        (CpuData::BF16(v), crate::dtype::DType::F32) => {
            return map1(v, l, bf16::to_f32).map(CpuData::F32)
        }
        (CpuData::F32(v), crate::dtype::DType::F16) => {
            return map1(v, l, f16::from_f32).map(CpuData::F16)
        }
        (CpuData::F16(v), crate::dtype::DType::F32) => {
            return map1(v, l, f16::to_f32).map(CpuData::F32)
        }
        // int64 past 2^53 without a trip through f64 (which rounds it first):
        // uint8 wraps, floats are rounded once (the half types through float32,
        // as PyTorch's and the CUDA kernels' casts go)
        (CpuData::I64(v), crate::dtype::DType::U8) => {
            return map1(v, l, |x| x as u8).map(CpuData::U8)
        }
        (CpuData::I64(v), crate::dtype::DType::F32) => {
            return map1(v, l, |x| x as f32).map(CpuData::F32)
        }
        (CpuData::I64(v), crate::dtype::DType::F16) => {
            return map1(v, l, |x| f16::from_f32(x as f32)).map(CpuData::F16)
        }
        (CpuData::I64(v), crate::dtype::DType::BF16) => {
            return map1(v, l, |x| bf16::from_f32(x as f32)).map(CpuData::BF16)
        }
        _ => {}
    }
    crate::dtype::dispatch!(data, v => go(v, l, to))
}

/// A contiguous copy of the elements of `l`.
pub(crate) fn contiguous_copy(data: &CpuData, l: &Layout) -> Result<CpuData> {
    crate::dtype::dispatch!(data, v => map1(v, l, |x| x).map(CpuElem::wrap))
}

/// i64 from any element without the 2^53 rounding of a trip through f64.
#[inline(always)]
fn i64_from<T: WithDType>(x: T) -> i64 {
    match T::DTYPE {
        crate::dtype::DType::I64 => {
            // SAFETY: T is i64 when its DTYPE is I64.
            unsafe { std::mem::transmute_copy::<T, i64>(&x) }
        }
        _ => i64::from_f64(x.to_f64()),
    }
}

/// Applies `op` to every element; the output keeps the input dtype.
pub(crate) fn unary<O: UnaryOp>(data: &CpuData, l: &Layout, op: &O) -> Result<CpuData> {
    fn go<T: NumElem, O: UnaryOp>(v: &[T], l: &Layout, op: &O) -> Result<CpuData> {
        if let Some(r) = l.contiguous_range() {
            let src = &v[r];
            let mut out = alloc_uninit::<T>(src.len())?;
            write_contiguous(&mut out, &|s, c| {
                let n = c.len();
                super::vmath::simd(
                    #[inline(always)]
                    || T::unary_slice(op, &src[s..s + n], c),
                )
            });
            return Ok(T::wrap(out));
        }
        map1(v, l, |x| T::unary(op, x)).map(T::wrap)
    }
    crate::dtype::dispatch!(data, v => go(v, l, op))
}

/// In place: `v[i] = f(v[i])` over the (non-overlapping) view `l`, a contiguous
/// one in parallel chunks with the CPU's vector instructions.
fn map_inplace<T: NumElem>(v: &mut [T], l: &Layout, f: impl Fn(T) -> T + Sync) {
    if let Some(r) = l.contiguous_range() {
        let body = |c: &mut [T]| {
            super::vmath::simd(
                #[inline(always)]
                || c.iter_mut().for_each(|d| *d = f(*d)),
            )
        };
        let v = &mut v[r];
        if v.len() >= PAR_MIN {
            v.par_chunks_mut(PAR_CHUNK).for_each(body);
        } else {
            body(v);
        }
        return;
    }
    // each position reads the one "element" of a broadcast unit
    let unit = Layout::contiguous(&[]).broadcast_to("in-place op", l.shape());
    let unit = unit.expect("a 0-d layout broadcasts to any shape");
    zip_mut(v, l, &[()], &unit, |d, ()| *d = f(*d));
}

/// In place: `a[i] = op(a[i])` through `a`'s (non-overlapping) layout, with the
/// out-of-place op's arithmetic (the same values).
pub(crate) fn unary_inplace<O: UnaryOp>(data: &mut CpuData, l: &Layout, op: &O) {
    fn go<T: NumElem, O: UnaryOp>(v: &mut [T], l: &Layout, op: &O) {
        map_inplace(v, l, |x| T::unary(op, x));
    }
    crate::dtype::dispatch!(data, v => go(v, l, op))
}

/// Applies `op` to pairs of elements of one dtype (broadcast layouts).
pub(crate) fn binary<O: BinaryOp>(
    a: &CpuData,
    la: &Layout,
    b: &CpuData,
    lb: &Layout,
    op: &O,
) -> Result<CpuData> {
    fn go<T: NumElem, O: BinaryOp>(
        a: &[T],
        la: &Layout,
        b: &CpuData,
        lb: &Layout,
        op: &O,
    ) -> Result<CpuData> {
        let b = T::slice(b).expect("binary: operands were cast to one dtype");
        if let (Some(ra), Some(rb)) = (la.contiguous_range(), lb.contiguous_range()) {
            let (a, b) = (&a[ra], &b[rb]);
            debug_assert_eq!(a.len(), b.len(), "binary: operands broadcast to one shape");
            let mut out = alloc_uninit::<T>(a.len())?;
            write_contiguous(&mut out, &|s, c| {
                let n = c.len();
                super::vmath::simd(
                    #[inline(always)]
                    || T::binary_slice(op, &a[s..s + n], &b[s..s + n], c),
                )
            });
            return Ok(T::wrap(out));
        }
        map2(a, la, b, lb, |x, y| T::binary(op, x, y)).map(T::wrap)
    }
    crate::dtype::dispatch!(a, v => go(v, la, b, lb, op))
}

/// In place: `a[i] = op(a[i], b[i])` through `a`'s (non-overlapping) layout.
pub(crate) fn binary_inplace<O: BinaryOp>(
    a: &mut CpuData,
    la: &Layout,
    b: &CpuData,
    lb: &Layout,
    op: &O,
) {
    fn go<T: NumElem, O: BinaryOp>(a: &mut [T], la: &Layout, b: &CpuData, lb: &Layout, op: &O) {
        let b = T::slice(b).expect("binary_inplace: operands were cast to one dtype");
        zip_mut(a, la, b, lb, |d, y| *d = T::binary(op, *d, y));
    }
    crate::dtype::dispatch!(a, v => go(v, la, b, lb, op))
}

/// Copies `src` (layout `ls`) into `dst` through the view `ld` of the same shape.
pub(crate) fn copy_strided(dst: &mut CpuData, ld: &Layout, src: &CpuData, ls: &Layout) {
    fn go<T: WithDType>(dst: &mut [T], ld: &Layout, src: &CpuData, ls: &Layout) {
        let s = T::slice(src).expect("copy_strided: same dtype");
        zip_mut(dst, ld, s, ls, |d, x| *d = x);
    }
    crate::dtype::dispatch!(dst, v => go(v, ld, src, ls))
}

/// Comparison of two same-dtype operands into a bool tensor.
pub(crate) fn compare(
    a: &CpuData,
    la: &Layout,
    b: &CpuData,
    lb: &Layout,
    cmp: CmpOp,
) -> Result<CpuData> {
    fn go<T: WithDType>(
        a: &[T],
        la: &Layout,
        b: &CpuData,
        lb: &Layout,
        cmp: CmpOp,
    ) -> Result<CpuData> {
        let b = T::slice(b).expect("compare: operands were cast to one dtype");
        Ok(CpuData::Bool(match cmp {
            CmpOp::Eq => map2(a, la, b, lb, |x, y| x == y),
            CmpOp::Ne => map2(a, la, b, lb, |x, y| x != y),
            CmpOp::Lt => map2(a, la, b, lb, |x, y| x < y),
            CmpOp::Le => map2(a, la, b, lb, |x, y| x <= y),
            CmpOp::Gt => map2(a, la, b, lb, |x, y| x > y),
            CmpOp::Ge => map2(a, la, b, lb, |x, y| x >= y),
        }?))
    }
    crate::dtype::dispatch!(a, v => go(v, la, b, lb, cmp))
}

/// `cond ? a : b` elementwise; `a` and `b` share a dtype.
pub(crate) fn where_(
    cond: &[bool],
    lc: &Layout,
    a: &CpuData,
    la: &Layout,
    b: &CpuData,
    lb: &Layout,
) -> Result<CpuData> {
    fn go<T: WithDType>(
        cond: &[bool],
        lc: &Layout,
        a: &[T],
        la: &Layout,
        b: &CpuData,
        lb: &Layout,
    ) -> Result<CpuData> {
        let b = T::slice(b).expect("where: operands were cast to one dtype");
        map3(
            (cond, lc),
            (a, la),
            (b, lb),
            |c, x, y| if c { x } else { y },
        )
        .map(T::wrap)
    }
    crate::dtype::dispatch!(a, v => go(cond, lc, v, la, b, lb))
}

/// `op(a[i], s)` for a scalar converted to the dtype (as a cast converts it).
pub(crate) fn binary_scalar<O: BinaryOp>(
    data: &CpuData,
    l: &Layout,
    s: Scalar,
    op: &O,
) -> Result<CpuData> {
    fn go<T: NumElem, O: BinaryOp>(v: &[T], l: &Layout, s: Scalar, op: &O) -> Result<CpuData> {
        map1(v, l, T::with_scalar(op, s)).map(T::wrap)
    }
    crate::dtype::dispatch!(data, v => go(v, l, s, op))
}

/// In place: `a[i] = op(a[i], s)` through `a`'s (non-overlapping) layout.
pub(crate) fn binary_scalar_inplace<O: BinaryOp>(
    data: &mut CpuData,
    l: &Layout,
    s: Scalar,
    op: &O,
) {
    fn go<T: NumElem, O: BinaryOp>(v: &mut [T], l: &Layout, s: Scalar, op: &O) {
        map_inplace(v, l, T::with_scalar(op, s));
    }
    crate::dtype::dispatch!(data, v => go(v, l, s, op))
}

/// A bool buffer of `cmp(a[i], s)` for a scalar converted to the dtype.
pub(crate) fn compare_scalar(a: &CpuData, la: &Layout, s: Scalar, cmp: CmpOp) -> Result<CpuData> {
    fn go<T: WithDType>(a: &[T], la: &Layout, s: Scalar, cmp: CmpOp) -> Result<CpuData> {
        let y: T = s.to();
        Ok(CpuData::Bool(match cmp {
            CmpOp::Eq => map1(a, la, |x| x == y),
            CmpOp::Ne => map1(a, la, |x| x != y),
            CmpOp::Lt => map1(a, la, |x| x < y),
            CmpOp::Le => map1(a, la, |x| x <= y),
            CmpOp::Gt => map1(a, la, |x| x > y),
            CmpOp::Ge => map1(a, la, |x| x >= y),
        }?))
    }
    crate::dtype::dispatch!(a, v => go(v, la, s, cmp))
}
