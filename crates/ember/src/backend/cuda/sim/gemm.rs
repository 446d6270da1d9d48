//! The simulator's cuBLAS: a reference strided-batched GEMM with cuBLAS's
//! column-major contract and its argument checks, so that the parameters ember
//! computes for cuBLAS are tested, not just the products.

use crate::backend::cuda::calls::GemmCall;
use crate::{
    dtype::DType,
    error::{Error, Result},
};

fn invalid(why: String) -> Error {
    Error::Cuda {
        op: "cublasGemmStridedBatched",
        msg: format!("CUBLAS_STATUS_INVALID_VALUE (simulator: {why})"),
    }
}

/// `v` (a float32's value) as a TF32 tensor-core product reads it: the first 10
/// bits of the mantissa, the rest dropped (rounded toward zero: the larger and
/// biased error of the ways a library may convert, so that a tolerance that holds
/// here holds on a GPU); infinities and NaNs as they are.
#[inline(always)]
pub(super) fn to_tf32(v: f64) -> f64 {
    let bits = (v as f32).to_bits();
    if bits & 0x7f80_0000 == 0x7f80_0000 {
        return v;
    }
    f32::from_bits(bits & !0x1fff) as f64
}

/// Reads element `i` of a device array of `dt` as f64.
///
/// # Safety
/// `base` must point at an array of `dt` with more than `i` elements.
#[inline(always)]
pub(super) unsafe fn read(dt: DType, base: u64, i: i64) -> f64 {
    match dt {
        DType::F32 => *(base as *const f32).offset(i as isize) as f64,
        DType::F64 => *(base as *const f64).offset(i as isize),
        DType::F16 => (*(base as *const half::f16).offset(i as isize)).to_f64(),
        DType::BF16 => (*(base as *const half::bf16).offset(i as isize)).to_f64(),
        _ => f64::NAN,
    }
}

/// Element `i` of a library call's operand as the library's product reads it:
/// with `tf32` (TF32 math allowed for the call), a float32 as TF32 ([`to_tf32`]).
///
/// # Safety
/// As [`read`].
#[inline(always)]
pub(super) unsafe fn read_operand(dt: DType, base: u64, i: i64, tf32: bool) -> f64 {
    let v = read(dt, base, i);
    if tf32 && dt == DType::F32 {
        to_tf32(v)
    } else {
        v
    }
}

/// The first `len` elements of a device array of `dt` as f64, as a library
/// call's product reads them ([`read_operand`]).
///
/// # Safety
/// `base` must point at an array of `dt` with at least `len` elements.
pub(super) unsafe fn load_operand(dt: DType, base: u64, len: usize, tf32: bool) -> Vec<f64> {
    (0..len as i64)
        .map(|i| read_operand(dt, base, i, tf32))
        .collect()
}

/// # Safety
/// As [`read`].
#[inline(always)]
pub(super) unsafe fn write(dt: DType, base: u64, i: i64, v: f64) {
    match dt {
        DType::F32 => *(base as *mut f32).offset(i as isize) = v as f32,
        DType::F64 => *(base as *mut f64).offset(i as isize) = v,
        // cuBLAS accumulates f16/bf16 products in f32 and rounds once
        DType::F16 => *(base as *mut half::f16).offset(i as isize) = half::f16::from_f32(v as f32),
        DType::BF16 => {
            *(base as *mut half::bf16).offset(i as isize) = half::bf16::from_f32(v as f32)
        }
        _ => {}
    }
}

/// Checks `g` as cuBLAS does (at the call) and returns the work that computes
/// `C_p = op(A_p)·op(B_p)` (alpha 1; beta 1 with `accumulate`, else 0; plus the
/// bias epilogue's vector) for p in 0..batch, column-major: `A_p` starts at
/// `a + p·stride_a` with leading dimension `lda`, and so on. Sums run in f64 in
/// the order of `k` and are rounded once.
///
/// # Safety
/// The pointers, leading dimensions and strides must describe memory that holds
/// every element they address.
pub(crate) unsafe fn gemm_job(g: &GemmCall) -> Result<super::Work> {
    let g = *g;
    let (m, n, k) = (g.m as i64, g.n as i64, g.k as i64);
    if m < 0 || n < 0 || k < 0 || g.batch < 0 {
        return Err(invalid(format!(
            "negative size m={m} n={n} k={k} batch={}",
            g.batch
        )));
    }
    let rows_a = if g.trans_a { k } else { m };
    let rows_b = if g.trans_b { n } else { k };
    for (what, ld, rows) in [
        ("lda", g.lda, rows_a),
        ("ldb", g.ldb, rows_b),
        ("ldc", g.ldc, m),
    ] {
        if (ld as i64) < rows.max(1) {
            return Err(invalid(format!("{what} = {ld} < max(1, {rows})")));
        }
    }
    if !matches!(g.dtype, DType::F32 | DType::F64 | DType::F16 | DType::BF16) {
        return Err(invalid(format!("no GEMM for {}", g.dtype)));
    }
    if g.bias != 0 && g.dtype == DType::F64 {
        // ember sends cublasLt f32, f16 and bf16 products only
        return Err(invalid("a bias epilogue for a float64 product".into()));
    }
    let esz = g.dtype.size_in_bytes() as i64;
    let (lda, ldb, ldc) = (g.lda as i64, g.ldb as i64, g.ldc as i64);
    if m > 0 && n > 0 && k > 0 && g.batch > 0 {
        // the bytes each operand's elements span over the batch (strides >= 0)
        let cols_a = if g.trans_a { m } else { k };
        let cols_b = if g.trans_b { k } else { n };
        for (what, base, rows, cols, ld, stride) in [
            ("A", g.a, rows_a, cols_a, lda, g.stride_a),
            ("B", g.b, rows_b, cols_b, ldb, g.stride_b),
            ("C", g.c, m, n, ldc, g.stride_c),
        ] {
            let last = (rows - 1) + (cols - 1) * ld + (g.batch as i64 - 1) * stride.max(0);
            super::check_region(
                "cublasGemmStridedBatched",
                &format!("operand {what}"),
                base,
                ((last + 1) * esz) as u64,
            )?;
        }
        if g.bias != 0 {
            super::check_region("cublasLtMatmul", "the bias", g.bias, (m * esz) as u64)?;
        }
    }
    // float32 products read TF32 operands where allowed (cuBLAS's TF32 math, which
    // the driver's path asks for on the same switch at the call)
    let tf32 = crate::backend::cuda::stats::allow_tf32();
    Ok(std::sync::Arc::new(move || {
        let _lock = super::exec_lock();
        for p in 0..g.batch as i64 {
            let a = g.a.wrapping_add_signed(p * g.stride_a * esz);
            let b = g.b.wrapping_add_signed(p * g.stride_b * esz);
            let c = g.c.wrapping_add_signed(p * g.stride_c * esz);
            product(&g, (a, b, c), (m, n, k), tf32);
        }
        Ok(())
    }))
}

/// Rows of op(A) (or columns of op(B)) converted to f64 at a time.
const BLOCK: i64 = 64;

/// One product of the batch: blocks of op(A)'s rows and op(B)'s columns are
/// gathered into f64 arrays so that each sum runs over contiguous memory, four
/// columns at a time (four independent sums, each still in the order of `k`);
/// blocks of rows run in parallel. With `tf32` the operands are read as TF32
/// ([`to_tf32`]).
///
/// # Safety
/// As [`gemm_job`], for the matrices at `a`, `b` and `c`.
unsafe fn product(
    g: &GemmCall,
    (a, b, c): (u64, u64, u64),
    (m, n, k): (i64, i64, i64),
    tf32: bool,
) {
    use rayon::prelude::*;
    let (lda, ldb, ldc) = (g.lda as i64, g.ldb as i64, g.ldc as i64);
    let dt = g.dtype;
    let operand = |base: u64, i: i64| read_operand(dt, base, i, tf32);
    let op_a = |i: i64, l: i64| {
        if g.trans_a {
            operand(a, l + i * lda)
        } else {
            operand(a, i + l * lda)
        }
    };
    let op_b = |l: i64, j: i64| {
        if g.trans_b {
            operand(b, j + l * ldb)
        } else {
            operand(b, l + j * ldb)
        }
    };
    let ku = k as usize;
    (0..(m + BLOCK - 1) / BLOCK).into_par_iter().for_each(|bi| {
        let rows = bi * BLOCK..((bi + 1) * BLOCK).min(m);
        let mut at = Vec::with_capacity(rows.clone().count() * ku);
        for i in rows.clone() {
            at.extend((0..k).map(|l| op_a(i, l)));
        }
        let mut bt = Vec::with_capacity(BLOCK as usize * ku);
        for j0 in (0..n).step_by(BLOCK as usize) {
            let cols = j0..(j0 + BLOCK).min(n);
            bt.clear();
            for j in cols.clone() {
                bt.extend((0..k).map(|l| op_b(l, j)));
            }
            for (ri, i) in rows.clone().enumerate() {
                let ar = &at[ri * ku..(ri + 1) * ku];
                let mut cj = 0;
                let width = cols.clone().count();
                while cj < width {
                    let w = (width - cj).min(4);
                    let mut acc = [0f64; 4];
                    let bs: [&[f64]; 4] =
                        std::array::from_fn(|q| &bt[(cj + q.min(w - 1)) * ku..][..ku]);
                    for (l, &av) in ar.iter().enumerate() {
                        for q in 0..4 {
                            acc[q] += av * bs[q][l];
                        }
                    }
                    for (q, &sum) in acc.iter().enumerate().take(w) {
                        let j = j0 + (cj + q) as i64;
                        let at_c = i + j * ldc;
                        let mut v = sum;
                        if g.accumulate {
                            v += read(dt, c, at_c);
                        }
                        if g.bias != 0 {
                            v += read(dt, g.bias, i);
                        }
                        write(dt, c, at_c, v);
                    }
                    cj += w;
                }
            }
        }
    });
}

/// Runs `g` now: [`gemm_job`]'s checks and its product.
///
/// # Safety
/// As [`gemm_job`].
#[cfg(test)]
unsafe fn gemm(g: &GemmCall) -> Result<()> {
    gemm_job(g)?()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(a: &[f32], b: &[f32], c: &mut [f32], m: i32, n: i32, k: i32) -> GemmCall {
        GemmCall {
            dtype: DType::F32,
            trans_a: false,
            trans_b: false,
            m,
            n,
            k,
            a: a.as_ptr() as u64,
            lda: m,
            stride_a: 0,
            b: b.as_ptr() as u64,
            ldb: k,
            stride_b: 0,
            c: c.as_mut_ptr() as u64,
            ldc: m,
            stride_c: 0,
            batch: 1,
            bias: 0,
            accumulate: false,
        }
    }

    #[test]
    fn column_major_product_and_transposes() {
        // A = [[1, 2, 3], [4, 5, 6]] (2x3) stored column-major: 1 4 2 5 3 6
        let a = [1f32, 4., 2., 5., 3., 6.];
        // B = [[1, 0], [0, 1], [1, 1]] (3x2) column-major: 1 0 1 0 1 1
        let b = [1f32, 0., 1., 0., 1., 1.];
        let mut c = [0f32; 4];
        let g = call(&a, &b, &mut c, 2, 2, 3);
        unsafe { gemm(&g).unwrap() };
        // A·B = [[4, 5], [10, 11]] column-major: 4 10 5 11
        assert_eq!(c, [4., 10., 5., 11.]);
        // Aᵀ stored as its own 3x2 column-major array, used with trans_a
        let at = [1f32, 2., 3., 4., 5., 6.];
        let mut c2 = [0f32; 4];
        let mut g = call(&at, &b, &mut c2, 2, 2, 3);
        g.trans_a = true;
        g.lda = 3;
        unsafe { gemm(&g).unwrap() };
        assert_eq!(c2, c);
    }

    /// With TF32 a float32 product reads 10 bits of each operand's mantissa (cuBLAS's
    /// TF32 math, `cuda::set_allow_tf32(true)`); without it every bit.
    #[test]
    fn tf32_products_read_ten_bits_of_mantissa() {
        let e = f32::EPSILON; // 2^-23
        let a = [1.0 + 64.0 * e, 3.0];
        let b = [1.0 + 8192.0 * e, 1.0]; // 1 + 2^-10: a TF32 value
        for (tf32, want) in [
            (false, (1.0 + 64.0 * e) * (1.0 + 8192.0 * e) + 3.0),
            (true, 1.0 + 8192.0 * e + 3.0),
        ] {
            let mut c = [0f32; 1];
            let g = call(&a, &b, &mut c, 1, 1, 2);
            // SAFETY: the arrays have the sizes `call` gives the product.
            unsafe { product(&g, (g.a, g.b, g.c), (1, 1, 2), tf32) };
            assert_eq!(c[0], want, "tf32 {tf32}");
        }
    }

    /// Under the memory checker (`.ci/memcheck`), an operand that the call's leading
    /// dimension or batch stride stretches past its array is an error; the same call
    /// within bounds runs. Elsewhere it says it skipped.
    #[test]
    fn operands_past_their_arrays_are_reported_under_the_memory_checker() {
        if !super::super::memory_checker_active() {
            eprintln!("skipped: runs under .ci/memcheck (the sanitizer's runtime loaded)");
            return;
        }
        // heap arrays: the sanitizer's allocator puts a red zone after each
        let a = vec![1f32; 6];
        let b = vec![1f32; 6];
        let mut c = vec![0f32; 4];
        let g = call(&a, &b, &mut c, 2, 2, 3);
        unsafe { gemm(&g).unwrap() };
        assert_eq!(c, [3.; 4]);
        let mut wide = g;
        wide.lda = 3; // A's last column would end at element 2 + 2·3 = 8 > 5
        let e = unsafe { gemm(&wide) }.unwrap_err().to_string();
        assert!(e.contains("memory check: operand A"), "{e}");
        let mut batched = g;
        batched.batch = 2;
        batched.stride_a = 6;
        let e = unsafe { gemm(&batched) }.unwrap_err().to_string();
        assert!(e.contains("memory check: operand A"), "{e}");
    }

    #[test]
    fn bad_leading_dimensions_are_refused_like_cublas() {
        let a = [0f32; 6];
        let b = [0f32; 6];
        let mut c = [0f32; 4];
        let mut g = call(&a, &b, &mut c, 2, 2, 3);
        g.lda = 1;
        let e = unsafe { gemm(&g) }.unwrap_err().to_string();
        assert!(e.contains("lda = 1 < max(1, 2)"), "{e}");
    }
}
