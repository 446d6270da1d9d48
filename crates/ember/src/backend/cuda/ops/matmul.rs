//! Matrix products: floats through cuBLAS (the operands' strides mapped onto
//! its column-major contract), integers through ember's kernel in `nn.rs`.
//!
//! A bias vector (`addmm`, `linear`) is added by the product itself, as PyTorch
//! does on a GPU: through cublasLt's bias epilogue where it takes the shapes (one
//! 2-D product of f32, f16 or bf16), otherwise written into the output first and
//! the product added to it (cuBLAS with beta = 1). Either way there is no second
//! pass over the output, and f16/bf16 round once.

use super::{binary_inplace, contiguous, fill, matmul_int, new_out};
use crate::backend::cuda::CudaStorage;
use crate::backend::op::{BinaryCode, Scalar};
use crate::layout::Layout;
use crate::{
    dtype::DType,
    error::{Error, Result},
};

/// Batched matrix product through cuBLAS: `a` is `batch + [m, k]`, `b` is
/// `batch + [k, n]` (broadcast batch dims, any strides). Each operand's last two
/// dims must be row- or column-major with a constant batch stride; otherwise it is
/// copied contiguous first. f16/bf16 accumulate in f32; f32 uses TF32 only when
/// [`allow_tf32`](crate::backend::cuda::allow_tf32) is on. Integers (u8, i64) go through ember's
/// own kernel (cuBLAS multiplies floats only); `None` for bool, which has no product.
/// `bias`, where given, is an `[n]` vector added to every row.
pub(crate) fn matmul(
    a: &CudaStorage,
    la: &Layout,
    b: &CudaStorage,
    lb: &Layout,
    (m, k, n): (usize, usize, usize),
    bias: Option<(&CudaStorage, &Layout)>,
) -> Result<Option<CudaStorage>> {
    let dt = a.dtype();
    let rank = la.rank();
    let batch: usize = la.shape()[..rank - 2].iter().product();
    // the bias broadcast over every row of the output
    let rows = |lc: &Layout| Layout {
        shape: smallvec::smallvec![batch * m, n],
        strides: smallvec::smallvec![0, lc.strides()[0]],
        offset: lc.offset(),
    };
    match dt {
        DType::I64 | DType::U8 => {
            let out = matmul_int(a, la, b, lb, (batch, m, k, n))?;
            if let Some((c, lc)) = bias {
                let lo = Layout::contiguous(&[batch * m, n]);
                binary_inplace(&out, &lo, c, &rows(lc), BinaryCode::Add)?;
            }
            return Ok(Some(out));
        }
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
    // cublasLt's bias epilogue: one 2-D product of a float type cuBLAS rounds
    // from f32, inside the sizes its kernels take (PyTorch's conditions for it),
    // with a contiguous bias that starts on a 16-byte boundary (a parameter's
    // own block always does; a row sliced out of a tensor may not)
    const LT_MAX: usize = 65535 * 32;
    let epilogue = bias.filter(|(c, lc)| {
        batch == 1
            && matches!(dt, DType::F32 | DType::F16 | DType::BF16)
            && lc.strides()[0] == 1
            && (c.ptr() + (lc.offset() * dt.size_in_bytes()) as u64).is_multiple_of(16)
            && (2..LT_MAX).contains(&m)
            && (2..LT_MAX).contains(&n)
            && k < LT_MAX
    });
    let out = match bias {
        // every row starts as the bias; the product is added to it (beta = 1)
        Some((c, lc)) if epilogue.is_none() || k == 0 => contiguous(c, &rows(lc))?,
        _ => new_out(&dev, dt, batch * m * n)?,
    };
    if batch * m * n == 0 || (k == 0 && bias.is_some()) {
        return Ok(Some(out));
    }
    if k == 0 {
        let z = fill(&dev, dt, batch * m * n, Scalar::Int(0))?;
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
    let call = crate::backend::cuda::calls::GemmCall {
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
        // cuBLAS's rows are ours columns: the bias runs along them
        bias: epilogue.map_or(0, |(c, lc)| {
            c.ptr() + (lc.offset() * dt.size_in_bytes()) as u64
        }),
        accumulate: bias.is_some() && epilogue.is_none(),
    };
    // SAFETY: pointers, leading dims and strides describe the operands' storage.
    unsafe { dev.gemm(&call) }?;
    if call.bias != 0 {
        crate::backend::cuda::stats::count_bias_epilogue();
    }
    // the operands' temporary copies (if any) are freed after the queued GEMM: the
    // allocator hands their blocks only to later work on the same stream
    drop((oa, ob));
    Ok(Some(out))
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
