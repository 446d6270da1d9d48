//! cuBLAS: the driver's GEMMs (the simulator has its reference in `sim/gemm.rs`).

use super::calls::GemmCall;
use super::runtime::Workspaces;
use crate::{DType, Error, Result};
use cudarc::cublas::result::CublasError;
use cudarc::cublas::sys::{cublasHandle_t, cublasStatus_t};
use cudarc::driver::sys::CUstream;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, MutexGuard};

/// A cuBLAS handle of one device, the stream it is bound to now, and a workspace
/// per stream (address, bytes; 0 bytes where none could be had).
struct Handle(cublasHandle_t, CUstream, HashMap<usize, (u64, usize)>);
// SAFETY: ember uses the handle under its mutex only.
unsafe impl Send for Handle {}

/// One device's cuBLAS, its handle created at first use.
///
/// One handle serves every stream, under a lock, and each stream gets a
/// workspace of its own (`cublasSetWorkspace`, as PyTorch gives each handle and
/// stream one): with the handle's single default workspace, products queued on
/// two streams could run at once over the same scratch memory, and a capture
/// could not hold the library's own allocation.
pub(crate) struct Blas {
    handle: Mutex<Option<Handle>>,
    /// The workspace size: NVIDIA's recommendation for the architecture (32 MiB
    /// from Hopper on, 4 MiB before), what ember's memory estimate counts.
    workspace: usize,
}

impl Blas {
    /// cuBLAS for a device of compute capability `major`.
    pub(crate) fn new(major: u32) -> Blas {
        Blas {
            handle: Mutex::new(None),
            workspace: if major >= 9 { 32 << 20 } else { 4 << 20 },
        }
    }
}

impl Blas {
    /// Queues `g` on `stream` (the device's context current on this thread).
    ///
    /// # Safety
    /// The pointers, leading dimensions and strides of `g` must describe live device
    /// memory holding every element they address; `stream` is the device's.
    pub(crate) unsafe fn gemm(
        &self,
        stream: CUstream,
        g: &GemmCall,
        ws: &dyn Workspaces,
    ) -> Result<()> {
        let status = |e: CublasError| Error::Cuda {
            op: "cublasGemmStridedBatched",
            msg: e.to_string(),
        };
        match self.call(stream, g, ws)? {
            // cuBLAS allocates its handle and workspace outside ember's cache: hand
            // it the cached memory and try once more
            Err(e) if e.0 == cublasStatus_t::CUBLAS_STATUS_ALLOC_FAILED => {
                ws.release_cached();
                self.call(stream, g, ws)?.map_err(status)
            }
            r => r.map_err(status),
        }
    }

    /// The cuBLAS handle (created at first use), bound to `stream` and its
    /// workspace (made at the stream's first product).
    fn handle(
        &self,
        stream: CUstream,
        ws: &dyn Workspaces,
    ) -> Result<MutexGuard<'_, Option<Handle>>> {
        let mut g = self.handle.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            super::libs::ensure(super::libs::CudaLib::Cublas)
                .map_err(|reason| Error::CudaUnavailable { reason })?;
            let h = cudarc::cublas::result::create_handle().map_err(|e| Error::Cuda {
                op: "cublasCreate",
                msg: e.to_string(),
            })?;
            *g = Some(Handle(h, std::ptr::null_mut(), HashMap::new()));
        }
        let handle = g.as_mut().expect("created above");
        if handle.1 != stream {
            // SAFETY: a live handle and a live stream of this device; the handle is
            // used under this lock only, so the stream stays until the call.
            unsafe { cudarc::cublas::result::set_stream(handle.0, stream as _) }.map_err(|e| {
                Error::Cuda {
                    op: "cublasSetStream",
                    msg: e.to_string(),
                }
            })?;
            let (ptr, bytes) = *handle.2.entry(stream as usize).or_insert_with(|| {
                // without one cuBLAS takes algorithms that need no workspace
                ws.device_alloc(self.workspace)
                    .map_or((0, 0), |p| (p, self.workspace))
            });
            // SAFETY: a live handle; the workspace lives for the process and only
            // this stream's products use it.
            let set = unsafe {
                cudarc::cublas::sys::cublasSetWorkspace_v2(handle.0, ptr as *mut c_void, bytes)
            };
            if set != cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                return Err(Error::Cuda {
                    op: "cublasSetWorkspace",
                    msg: format!("{set:?}"),
                });
            }
            handle.1 = stream;
        }
        Ok(g)
    }

    /// The cuBLAS call for `g`: ember's own errors outside, cuBLAS's status inside.
    unsafe fn call(
        &self,
        stream: CUstream,
        g: &GemmCall,
        ws: &dyn Workspaces,
    ) -> Result<std::result::Result<(), CublasError>> {
        use cudarc::cublas::{result as blas, sys as bsys};
        let op = |t: bool| {
            if t {
                bsys::cublasOperation_t::CUBLAS_OP_T
            } else {
                bsys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let guard = self.handle(stream, ws)?;
        let h = guard.as_ref().expect("the handle was created").0;
        let (ta, tb) = (op(g.trans_a), op(g.trans_b));
        match g.dtype {
            DType::F32 => {
                let mode = if super::allow_tf32() {
                    bsys::cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH
                } else {
                    bsys::cublasMath_t::CUBLAS_DEFAULT_MATH
                };
                if let Err(e) = bsys::cublasSetMathMode(h, mode).result() {
                    return Ok(Err(e));
                }
                let (alpha, beta) = (1f32, 0f32);
                Ok(blas::sgemm_strided_batched(
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
                ))
            }
            DType::F64 => {
                let (alpha, beta) = (1f64, 0f64);
                Ok(blas::dgemm_strided_batched(
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
                ))
            }
            DType::F16 | DType::BF16 => {
                let ty = if g.dtype == DType::F16 {
                    bsys::cudaDataType_t::CUDA_R_16F
                } else {
                    bsys::cudaDataType_t::CUDA_R_16BF
                };
                let (alpha, beta) = (1f32, 0f32);
                Ok(blas::gemm_strided_batched_ex(
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
                ))
            }
            dt => Err(Error::invalid(
                "matmul",
                format!("cuBLAS has no GEMM for {dt}"),
            )),
        }
    }
}

/// The version of the cuBLAS library loaded (`13.1.0`), or `None` where it is not
/// found.
pub(crate) fn loaded_version() -> Option<String> {
    super::libs::ensure(super::libs::CudaLib::Cublas).ok()?;
    let prop = |p: cudarc::cublas::sys::libraryPropertyType| -> Option<i32> {
        let mut v = 0;
        // SAFETY: the library is loaded (checked above) and `v` is an out-parameter.
        let status = unsafe { cudarc::cublas::sys::cublasGetProperty(p, &mut v) };
        (status == cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS).then_some(v)
    };
    use cudarc::cublas::sys::libraryPropertyType::*;
    Some(format!(
        "{}.{}.{}",
        prop(MAJOR_VERSION)?,
        prop(MINOR_VERSION)?,
        prop(PATCH_LEVEL)?
    ))
}
