//! Matrix multiplication on the CPU through the `gemm` crate (f32, f64; f16 and
//! bf16 compute in f32), with a plain loop for integer dtypes.
//!
//! A bias vector, where given, is written into the output first and the product
//! added to it (the `gemm` crate reads the destination), so the sum is one pass
//! and, for f16/bf16, one rounding, as PyTorch's `addmm`.
//!
//! f16 does not use the `gemm` crate's own f16 product: it adds each block of the
//! depth dimension into an f16 output, rounding to f16 between blocks, where
//! PyTorch (and ember) accumulate the whole sum in f32 and round once.

use super::walk::Walk;
use crate::backend::host::{alloc_filled, alloc_uninit};
use crate::dtype::CpuData;
use crate::dtype::WithDType;
use crate::error::Result;
use crate::layout::Layout;
use gemm::Parallelism;
use rayon::prelude::*;

/// Operands for a batched matmul: `a` is `batch + [m, k]`, `b` is `batch + [k, n]`
/// (batch dims already broadcast, any strides).
#[derive(Clone, Copy)]
pub(crate) struct MatmulArgs<'a> {
    pub a: (&'a CpuData, &'a Layout),
    pub b: (&'a CpuData, &'a Layout),
    pub m: usize,
    pub k: usize,
    pub n: usize,
    /// An `[n]` vector added to every row of the product.
    pub bias: Option<(&'a CpuData, &'a Layout)>,
}

/// Work below this many multiply-adds per matrix runs on one thread.
const PAR_FLOPS: usize = 64 * 64 * 64;

impl MatmulArgs<'_> {
    fn batch(&self) -> (&[usize], usize) {
        let la = self.a.1;
        let batch = &la.shape()[..la.rank() - 2];
        (batch, batch.iter().product())
    }

    /// Storage offsets of each batch's `a` and `b` matrices.
    fn batch_offsets(&self) -> Vec<(usize, usize)> {
        let (la, lb) = (self.a.1, self.b.1);
        let (batch, count) = self.batch();
        let r = batch.len();
        let w = Walk::new(batch, [&la.strides()[..r], &lb.strides()[..r]]);
        let mut offs = Vec::with_capacity(count);
        w.for_each_run(
            [la.offset(), lb.offset()],
            0,
            count,
            |_, len, [oa, ob], [sa, sb]| {
                for i in 0..len {
                    offs.push((oa + i * sa, ob + i * sb));
                }
            },
        );
        offs
    }
}

/// The product computed in `work` (operands converted to contiguous copies), then
/// converted back to the operands' dtype.
fn via(args: &MatmulArgs, work: crate::dtype::DType) -> Result<CpuData> {
    let dtype = args.a.0.dtype();
    let a = super::elementwise::cast(args.a.0, args.a.1, work)?;
    let b = super::elementwise::cast(args.b.0, args.b.1, work)?;
    let (la, lb) = (
        Layout::contiguous(args.a.1.shape()),
        Layout::contiguous(args.b.1.shape()),
    );
    let bias = match args.bias {
        Some((c, lc)) => Some(super::elementwise::cast(c, lc, work)?),
        None => None,
    };
    let lc = Layout::contiguous(&[args.n]);
    let out = matmul(&MatmulArgs {
        a: (&a, &la),
        b: (&b, &lb),
        bias: bias.as_ref().map(|c| (c, &lc)),
        ..*args
    })?;
    super::elementwise::cast(&out, &Layout::contiguous(&[out.len()]), dtype)
}

/// Runs the batched product; the output is contiguous `batch + [m, n]`.
pub(crate) fn matmul(args: &MatmulArgs) -> Result<CpuData> {
    match args.a.0 {
        CpuData::F32(a) => float_mm(a, args),
        CpuData::F64(a) => float_mm(a, args),
        // accumulate in f32 across the whole k dim: convert, multiply, round once
        CpuData::F16(_) | CpuData::BF16(_) => via(args, crate::dtype::DType::F32),
        CpuData::I64(a) => int_mm(a, args),
        CpuData::U8(_) | CpuData::Bool(_) => via(args, crate::dtype::DType::I64),
    }
}

fn float_mm<T: WithDType + num_traits::Zero + num_traits::One>(
    a: &[T],
    args: &MatmulArgs,
) -> Result<CpuData> {
    let b = T::slice(args.b.0).expect("matmul: operands share a dtype");
    let (m, k, n) = (args.m, args.k, args.n);
    let (_, count) = args.batch();
    let bias = args
        .bias
        .map(|(c, lc)| bias_row::<T>(c, lc, n))
        .transpose()?;
    let mut out = match &bias {
        // every row starts as the bias; the product is added to it
        Some(row) if n > 0 => {
            let mut out = alloc_uninit::<T>(count * m * n)?;
            out.par_chunks_mut(n).for_each(|r| r.copy_from_slice(row));
            out
        }
        _ if k == 0 || m * n == 0 => {
            return alloc_filled(count * m * n, T::zero()).map(T::wrap);
        }
        _ => alloc_uninit::<T>(count * m * n)?,
    };
    if k == 0 || m * n == 0 {
        return Ok(T::wrap(out));
    }
    // the gemm crate computes dst = alpha·dst + beta·lhs·rhs, reading dst only when
    // asked
    let (read_dst, alpha) = if bias.is_some() {
        (true, T::one())
    } else {
        (false, T::zero())
    };
    let offs = args.batch_offsets();
    let (la, lb) = (args.a.1, args.b.1);
    let r = la.rank();
    let (a_rs, a_cs) = (la.strides()[r - 2] as isize, la.strides()[r - 1] as isize);
    let (b_rs, b_cs) = (lb.strides()[r - 2] as isize, lb.strides()[r - 1] as isize);
    let one = |dst: &mut [T], (oa, ob): (usize, usize), par: Parallelism| {
        // SAFETY: `dst` holds m*n elements written with row stride n; the operand
        // offsets and strides come from layouts that lie within their storage.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                dst.as_mut_ptr(),
                1,
                n as isize,
                read_dst,
                a.as_ptr().add(oa),
                a_cs,
                a_rs,
                b.as_ptr().add(ob),
                b_cs,
                b_rs,
                alpha,
                T::one(),
                false,
                false,
                false,
                par,
            )
        }
    };
    let big = m * n * k >= PAR_FLOPS;
    // One product per thread where they are small, or enough to keep every thread
    // busy: splitting one product of a batch measured slower at every size tried
    // (attention's [128, 32] @ [32, 128] per head: 60 against 140 GFLOP/s).
    let threads = rayon::current_num_threads();
    let spread = count > 1 && (!big || count >= 2 * threads);
    if spread {
        out.par_chunks_mut(m * n)
            .zip(offs.par_iter())
            .for_each(|(dst, &o)| one(dst, o, Parallelism::None));
    } else {
        let par = if big {
            Parallelism::Rayon(0)
        } else {
            Parallelism::None
        };
        for (dst, &o) in out.chunks_mut(m * n).zip(&offs) {
            one(dst, o, par);
        }
    }
    Ok(T::wrap(out))
}

/// The bias `c[lc]` (an `[n]` vector of `T`) as a contiguous row.
fn bias_row<T: WithDType>(c: &CpuData, lc: &Layout, n: usize) -> Result<Vec<T>> {
    let mut row = super::elementwise::cast(c, lc, T::DTYPE)?;
    let row = std::mem::take(T::slice_mut(&mut row).expect("cast to the product's dtype"));
    debug_assert_eq!(row.len(), n);
    Ok(row)
}

/// Integer matmul: exact (wrapping) i64 arithmetic, rows in parallel.
fn int_mm(a: &[i64], args: &MatmulArgs) -> Result<CpuData> {
    let CpuData::I64(b) = args.b.0 else {
        unreachable!("matmul: operands share a dtype")
    };
    let (m, k, n) = (args.m, args.k, args.n);
    let (la, lb) = (args.a.1, args.b.1);
    let r = la.rank();
    let (a_rs, a_cs) = (la.strides()[r - 2], la.strides()[r - 1]);
    let (b_rs, b_cs) = (lb.strides()[r - 2], lb.strides()[r - 1]);
    let offs = args.batch_offsets();
    let bias = args
        .bias
        .map(|(c, lc)| bias_row::<i64>(c, lc, n))
        .transpose()?;
    let mut out = alloc_uninit::<i64>(offs.len() * m * n)?;
    if n > 0 {
        out.par_chunks_mut(n).enumerate().for_each(|(row, dst)| {
            let (bi, i) = (row / m, row % m);
            let (oa, ob) = offs[bi];
            for (j, d) in dst.iter_mut().enumerate() {
                let start = bias.as_ref().map_or(0, |c| c[j]);
                *d = (0..k).fold(start, |acc, p| {
                    acc.wrapping_add(
                        a[oa + i * a_rs + p * a_cs].wrapping_mul(b[ob + p * b_rs + j * b_cs]),
                    )
                });
            }
        });
    }
    Ok(CpuData::I64(out))
}
