//! Matrix products on a device: one strided-batched GEMM call in cuBLAS's terms,
//! executed by cuBLAS on a GPU or by the simulator's reference.

use super::{CudaDev, Runtime};
use crate::{DType, Error, Result};
use std::ffi::c_void;

/// `C_p = op(A_p)·op(B_p)` for p in 0..batch, column-major, with cuBLAS's meaning
/// of every field (`op` transposes when `trans_*`; `ld*` are leading dimensions;
/// strides are in elements). f16/bf16 accumulate in f32.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GemmCall {
    pub dtype: DType,
    pub trans_a: bool,
    pub trans_b: bool,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub a: u64,
    pub lda: i32,
    pub stride_a: i64,
    pub b: u64,
    pub ldb: i32,
    pub stride_b: i64,
    pub c: u64,
    pub ldc: i32,
    pub stride_c: i64,
    pub batch: i32,
}

impl CudaDev {
    /// Queues `g` on the device's stream.
    ///
    /// # Safety
    /// The pointers, leading dimensions and strides of `g` must describe live device
    /// memory holding every element they address.
    pub(crate) unsafe fn gemm(&self, g: &GemmCall) -> Result<()> {
        match &self.rt {
            Runtime::Sim => super::sim::gemm(g),
            Runtime::Driver { .. } => match self.cublas_gemm(g) {
                // cuBLAS allocates its handle and workspace outside ember's cache:
                // hand it the cached memory and try once more
                Err(Error::Cuda { msg, .. }) if msg.contains("CUBLAS_STATUS_ALLOC_FAILED") => {
                    self.allocator().release_cached();
                    self.cublas_gemm(g)
                }
                r => r,
            },
        }
    }

    unsafe fn cublas_gemm(&self, g: &GemmCall) -> Result<()> {
        use cudarc::cublas::{result as blas, sys as bsys};
        let op = |t: bool| {
            if t {
                bsys::cublasOperation_t::CUBLAS_OP_T
            } else {
                bsys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let err = |e: blas::CublasError| Error::Cuda {
            op: "cublasGemmStridedBatched",
            msg: e.to_string(),
        };
        let guard = self.blas()?;
        let h = guard.as_ref().expect("blas handle created").0;
        let (ta, tb) = (op(g.trans_a), op(g.trans_b));
        match g.dtype {
            DType::F32 => {
                let mode = if super::allow_tf32() {
                    bsys::cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH
                } else {
                    bsys::cublasMath_t::CUBLAS_DEFAULT_MATH
                };
                bsys::cublasSetMathMode(h, mode).result().map_err(err)?;
                let (alpha, beta) = (1f32, 0f32);
                blas::sgemm_strided_batched(
                    h,
                    ta,
                    tb,
                    g.m,
                    g.n,
                    g.k,
                    &alpha,
                    g.a as *const f32,
                    g.lda,
                    g.stride_a,
                    g.b as *const f32,
                    g.ldb,
                    g.stride_b,
                    &beta,
                    g.c as *mut f32,
                    g.ldc,
                    g.stride_c,
                    g.batch,
                )
                .map_err(err)
            }
            DType::F64 => {
                let (alpha, beta) = (1f64, 0f64);
                blas::dgemm_strided_batched(
                    h,
                    ta,
                    tb,
                    g.m,
                    g.n,
                    g.k,
                    &alpha,
                    g.a as *const f64,
                    g.lda,
                    g.stride_a,
                    g.b as *const f64,
                    g.ldb,
                    g.stride_b,
                    &beta,
                    g.c as *mut f64,
                    g.ldc,
                    g.stride_c,
                    g.batch,
                )
                .map_err(err)
            }
            DType::F16 | DType::BF16 => {
                let ty = if g.dtype == DType::F16 {
                    bsys::cudaDataType_t::CUDA_R_16F
                } else {
                    bsys::cudaDataType_t::CUDA_R_16BF
                };
                let (alpha, beta) = (1f32, 0f32);
                blas::gemm_strided_batched_ex(
                    h,
                    ta,
                    tb,
                    g.m,
                    g.n,
                    g.k,
                    &alpha as *const f32 as *const c_void,
                    g.a as *const c_void,
                    ty,
                    g.lda,
                    g.stride_a,
                    g.b as *const c_void,
                    ty,
                    g.ldb,
                    g.stride_b,
                    &beta as *const f32 as *const c_void,
                    g.c as *mut c_void,
                    ty,
                    g.ldc,
                    g.stride_c,
                    g.batch,
                    bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    bsys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
                .map_err(err)
            }
            dt => Err(Error::invalid(
                "matmul",
                format!("cuBLAS has no GEMM for {dt}"),
            )),
        }
    }
}
