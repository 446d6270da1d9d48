//! cuBLAS: the driver's GEMMs (the simulator has its reference in `sim/gemm.rs`),
//! and cublasLt for products with a bias epilogue.

use super::calls::GemmCall;
use super::runtime::Workspaces;
use crate::{
    dtype::DType,
    error::{Error, Result},
};
use cudarc::cublas::result::CublasError;
use cudarc::cublas::sys::{cublasHandle_t, cublasStatus_t};
use cudarc::driver::sys::CUstream;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, MutexGuard};

/// A cuBLAS handle of one device, the stream it is bound to now, a workspace per
/// stream (address, bytes; 0 bytes where none could be had), and the device's
/// cublasLt handle (made at the first product with a bias; it takes the stream
/// and the workspace per call).
struct Handle(
    cublasHandle_t,
    CUstream,
    HashMap<usize, (u64, usize)>,
    Option<cudarc::cublaslt::sys::cublasLtHandle_t>,
);
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
        let status = |e: Status| Error::Cuda {
            op: if g.bias != 0 {
                "cublasLtMatmul"
            } else {
                "cublasGemmStridedBatched"
            },
            msg: e.msg,
        };
        match self.call(stream, g, ws)? {
            // cuBLAS allocates its handle and workspace outside ember's cache: hand
            // it the cached memory and try once more
            Err(e) if e.alloc_failed => {
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
            *g = Some(Handle(h, std::ptr::null_mut(), HashMap::new(), None));
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
    ) -> Result<std::result::Result<(), Status>> {
        if g.bias != 0 {
            let mut guard = self.handle(stream, ws)?;
            let handle = guard.as_mut().expect("the handle was created");
            return lt_bias(handle, stream, g);
        }
        self.call_blas(stream, g, ws)
            .map(|r| r.map_err(|e| Status::blas(&e)))
    }

    /// [`call`](Self::call) in cuBLAS's terms (cublasLt's where `g` has a bias).
    unsafe fn call_blas(
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
        let beta = if g.accumulate { 1.0 } else { 0.0 };
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
                let (alpha, beta) = (1f32, beta as f32);
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
                let (alpha, beta) = (1f64, beta);
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
                let (alpha, beta) = (1f32, beta as f32);
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

/// A failed library call: whether it was out of memory, and the status.
struct Status {
    alloc_failed: bool,
    msg: String,
}

impl Status {
    fn blas(e: &CublasError) -> Status {
        Status {
            alloc_failed: e.0 == cublasStatus_t::CUBLAS_STATUS_ALLOC_FAILED,
            msg: e.to_string(),
        }
    }

    fn lt(e: cudarc::cublaslt::result::CublasError) -> Status {
        use cudarc::cublaslt::sys::cublasStatus_t as S;
        Status {
            alloc_failed: e.0 == S::CUBLAS_STATUS_ALLOC_FAILED,
            msg: e.to_string(),
        }
    }
}

/// A cublasLt descriptor, destroyed when dropped (after the call that used it is
/// queued, as cublasLt allows).
struct Lt<T: Copy>(
    T,
    unsafe fn(T) -> std::result::Result<(), cudarc::cublaslt::result::CublasError>,
);

impl<T: Copy> Drop for Lt<T> {
    fn drop(&mut self) {
        // SAFETY: made by the matching create call and destroyed once, here.
        let _ = unsafe { (self.1)(self.0) };
    }
}

/// `g` (with its bias pointer) through cublasLt: the product with the bias
/// epilogue, `C = op(A)·op(B) + bias` along C's rows, in one kernel, on
/// `stream` with the stream's cuBLAS workspace.
///
/// # Safety
/// As [`Blas::gemm`]; `h` is bound to `stream`.
unsafe fn lt_bias(
    h: &mut Handle,
    stream: CUstream,
    g: &GemmCall,
) -> Result<std::result::Result<(), Status>> {
    use cudarc::cublaslt::{result as lt, sys as ltsys};
    use ltsys::cublasLtMatmulDescAttributes_t as Attr;
    use ltsys::cublasLtMatrixLayoutAttribute_t as LayoutAttr;
    let lt_handle = match h.3 {
        Some(l) => l,
        None => match lt::create_handle() {
            Ok(l) => *h.3.insert(l),
            Err(e) => return Ok(Err(Status::lt(e))),
        },
    };
    let (ws_ptr, ws_bytes) = h.2.get(&(stream as usize)).copied().unwrap_or((0, 0));
    let (ty, compute) = match g.dtype {
        DType::F32 if super::allow_tf32() => (
            ltsys::cudaDataType_t::CUDA_R_32F,
            ltsys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
        ),
        DType::F32 => (
            ltsys::cudaDataType_t::CUDA_R_32F,
            ltsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        ),
        DType::F16 => (
            ltsys::cudaDataType_t::CUDA_R_16F,
            ltsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        ),
        DType::BF16 => (
            ltsys::cudaDataType_t::CUDA_R_16BF,
            ltsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        ),
        dt => {
            return Err(Error::invalid(
                "matmul",
                format!("ember sends no {dt} product with a bias to cublasLt"),
            ))
        }
    };
    let run = || -> std::result::Result<(), lt::CublasError> {
        let desc = Lt(
            lt::create_matmul_desc(compute, ltsys::cudaDataType_t::CUDA_R_32F)?,
            lt::destroy_matmul_desc,
        );
        let set = |attr: Attr, p: *const c_void, size: usize| {
            lt::set_matmul_desc_attribute(desc.0, attr, p, size)
        };
        let (ta, tb) = (g.trans_a as i32, g.trans_b as i32);
        set(Attr::CUBLASLT_MATMUL_DESC_TRANSA, &ta as *const i32 as _, 4)?;
        set(Attr::CUBLASLT_MATMUL_DESC_TRANSB, &tb as *const i32 as _, 4)?;
        let epilogue = ltsys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS;
        set(
            Attr::CUBLASLT_MATMUL_DESC_EPILOGUE,
            &epilogue as *const _ as _,
            std::mem::size_of_val(&epilogue),
        )?;
        set(
            Attr::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
            &g.bias as *const u64 as _,
            8,
        )?;
        let (m, n, k) = (g.m as u64, g.n as u64, g.k as u64);
        let layout = |rows: u64, cols: u64, ld: i32, stride: i64| {
            let l = Lt(
                lt::create_matrix_layout(ty, rows, cols, ld as i64)?,
                lt::destroy_matrix_layout,
            );
            if g.batch > 1 {
                let count = g.batch;
                lt::set_matrix_layout_attribute(
                    l.0,
                    LayoutAttr::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                    &count as *const i32 as _,
                    4,
                )?;
                lt::set_matrix_layout_attribute(
                    l.0,
                    LayoutAttr::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                    &stride as *const i64 as _,
                    8,
                )?;
            }
            Ok(l)
        };
        let (ar, ac) = if g.trans_a { (k, m) } else { (m, k) };
        let (br, bc) = if g.trans_b { (n, k) } else { (k, n) };
        let la = layout(ar, ac, g.lda, g.stride_a)?;
        let lb = layout(br, bc, g.ldb, g.stride_b)?;
        let lc = layout(m, n, g.ldc, g.stride_c)?;
        let pref = Lt(lt::create_matmul_pref()?, lt::destroy_matmul_pref);
        use ltsys::cublasLtMatmulPreferenceAttributes_t as Pref;
        lt::set_matmul_pref_attribute(
            pref.0,
            Pref::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            &ws_bytes as *const usize as _,
            std::mem::size_of::<usize>(),
        )?;
        // the heuristic assumes 256-byte aligned operands unless told otherwise (a
        // view's product can start anywhere): each operand's own alignment, as
        // PyTorch gives it
        let align = |p: u64| -> u32 { 1 << p.trailing_zeros().min(8) };
        for (attr, p) in [
            (Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, g.a),
            (Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, g.b),
            (Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, g.c),
            (Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, g.c),
        ] {
            let a = align(p);
            lt::set_matmul_pref_attribute(pref.0, attr, &a as *const u32 as _, 4)?;
        }
        let heuristic =
            lt::get_matmul_algo_heuristic(lt_handle, desc.0, la.0, lb.0, lc.0, lc.0, pref.0)?;
        let (alpha, beta) = (1f32, if g.accumulate { 1f32 } else { 0f32 });
        lt::matmul(
            lt_handle,
            desc.0,
            &alpha as *const f32 as _,
            &beta as *const f32 as _,
            g.a as _,
            la.0,
            g.b as _,
            lb.0,
            g.c as _,
            lc.0,
            g.c as _,
            lc.0,
            &heuristic.algo,
            ws_ptr as _,
            ws_bytes,
            stream as _,
        )
    };
    Ok(run().map_err(Status::lt))
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
