//! The calls the runtime's libraries take, in their own terms: a strided-batched
//! GEMM as cuBLAS sees it, and a convolution pass as cuDNN sees it. The driver
//! hands them to the libraries; the simulator runs references with the same
//! contracts.

use crate::backend::op::ConvShape;
use crate::dtype::DType;

/// `C_p = op(A_p)·op(B_p)` for p in 0..batch, column-major, with cuBLAS's meaning
/// of every field (`op` transposes when `trans_*`; `ld*` are leading dimensions;
/// strides are in elements). f16/bf16 accumulate in f32.
///
/// With `accumulate`, C's old values are added (beta = 1); with a `bias` (a device
/// pointer, 0 for none), the `[m]` vector at it is added to every column: cublasLt's
/// bias epilogue, each `C_p[i, j] += bias[i]`. Both are added to the f32 (f64)
/// sum before it is rounded to the dtype.
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
    pub bias: u64,
    pub accumulate: bool,
}

impl GemmCall {
    /// The library call's name in the profiler's records (the one the driver
    /// makes for this call).
    pub fn library_name(&self) -> &'static str {
        match (self.bias != 0, self.dtype) {
            (true, _) => "cublasLtMatmul (bias epilogue)",
            (false, DType::F32) => "cublasSgemmStridedBatched",
            (false, DType::F64) => "cublasDgemmStridedBatched",
            (false, _) => "cublasGemmStridedBatchedEx",
        }
    }
}

/// Geometry of a convolution in cuDNN's terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ConvGeom {
    pub dtype: DType,
    /// Input `[n, c, h, w]`.
    pub x: [i32; 4],
    /// Filter `[k, c / groups, r, s]`.
    pub w: [i32; 4],
    /// Output `[n, k, p, q]`.
    pub y: [i32; 4],
    pub pad: [i32; 2],
    pub stride: [i32; 2],
    pub dilation: [i32; 2],
    pub groups: i32,
    /// The three tensors in channels-last order (x and y NHWC, the filter KRSC),
    /// else NCHW and KCRS.
    pub nhwc: bool,
}

impl ConvGeom {
    /// The geometry of `s` in `dtype`; `None` where cuDNN cannot take it (a size or
    /// an operand's element count past its 32-bit limit, or an empty tensor), which
    /// ember's own path handles.
    pub fn new(dtype: DType, s: &ConvShape) -> Option<ConvGeom> {
        if !s.fits_library() {
            return None;
        }
        // every value below fits in i32 (checked above)
        let i = |v: usize| v as i32;
        let win = &s.win;
        Some(ConvGeom {
            dtype,
            x: [i(s.n), i(s.c), i(s.h), i(s.w)],
            w: [i(s.o), i(s.c / s.groups), i(win.kernel.0), i(win.kernel.1)],
            y: [i(s.n), i(s.o), i(s.oh), i(s.ow)],
            pad: [i(win.padding.0), i(win.padding.1)],
            stride: [i(win.stride.0), i(win.stride.1)],
            dilation: [i(win.dilation.0), i(win.dilation.1)],
            groups: i(s.groups),
            nhwc: s.nhwc,
        })
    }

    /// The dims of the operand `pass` writes: `y`, `dx` or `dw`.
    pub fn written(&self, pass: ConvPass) -> [i32; 4] {
        match pass {
            ConvPass::Forward => self.y,
            ConvPass::BackwardData => self.x,
            ConvPass::BackwardFilter => self.w,
        }
    }

    /// The elements of `[n, c, h, w]`-like dims.
    pub fn numel(d: [i32; 4]) -> usize {
        d.iter().map(|&v| v as usize).product()
    }
}

/// One of the three convolutions of a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum ConvPass {
    /// `y = x ⋆ w`.
    Forward,
    /// `dx` from `dy` (in `y`) and `w`.
    BackwardData,
    /// `dw` from `x` and `dy` (in `y`).
    BackwardFilter,
}

/// One call: device pointers to dense `x`, `w` and `y` arrays of the geometry's
/// sizes, in its order (NCHW or NHWC). The pass reads two of them and overwrites the third (`y` holds
/// `dy` in the backward passes).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConvCall {
    pub geom: ConvGeom,
    pub pass: ConvPass,
    pub x: u64,
    pub w: u64,
    pub y: u64,
    /// Scratch memory for the library, `workspace_bytes` long (0: none): an
    /// algorithm that needs more is not used.
    pub workspace: u64,
    pub workspace_bytes: usize,
    /// Float32 operands may be rounded to TF32 on tensor cores (cuDNN's default
    /// math, [`allow_tf32`](super::dnn::allow_tf32) when the call was made).
    pub tf32: bool,
}

impl ConvCall {
    /// The library call's name in the profiler's records.
    pub fn library_name(&self) -> &'static str {
        match self.pass {
            ConvPass::Forward => "cudnnConvolutionForward",
            ConvPass::BackwardData => "cudnnConvolutionBackwardData",
            ConvPass::BackwardFilter => "cudnnConvolutionBackwardFilter",
        }
    }

    /// The operand the pass writes: its dims and its pointer.
    pub fn output(&self) -> ([i32; 4], u64) {
        let ptr = match self.pass {
            ConvPass::Forward => self.y,
            ConvPass::BackwardData => self.x,
            ConvPass::BackwardFilter => self.w,
        };
        (self.geom.written(self.pass), ptr)
    }
}
