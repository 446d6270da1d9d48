//! Convolutions through cuDNN, where it loads (on by default, as PyTorch's;
//! [`set_enabled(false)`](super::cudnn::set_enabled) or `EMBER_CUDNN=0` sends
//! `conv2d` and its gradients to ember's im2col + cuBLAS path). On ember's
//! simulator a reference with cuDNN's contract stands in for the library (NCHW or
//! NHWC tensors, KCRS or KRSC filters, the output size checked, bad parameters
//! refused, the workspace's bounds checked), which tests everything up to the
//! library calls themselves.
//!
//! Operands are dense NCHW or NHWC in f32, f64, f16 or bf16; the half types are
//! accumulated in f32 on tensor cores, and a half convolution cuDNN refuses runs
//! in f32 instead (the reason on stderr with `EMBER_CUDNN_LOG`). f32 convolutions
//! use TF32 tensor cores unless [`set_allow_tf32(false)`](set_allow_tf32), then
//! FMA kernels. Each pass is handed a workspace from the caching allocator whose
//! size depends on the shape only ([`ConvShape::library_workspace`]: the batch's
//! patch matrix or three times input and output, the larger, at most the
//! workspace limit), so that the meta device's estimate
//! stays exact; the algorithm is the first of cuDNN's heuristic choices that fits
//! it and runs, or with [`set_benchmark`] the fastest that fits in cuDNN's timed
//! search (`cudnnFind*AlgorithmEx`), among the deterministic ones only with
//! [`set_deterministic`], remembered per shape, dtype, layout, math and those
//! settings with the shape's descriptors (`EMBER_CUDNN_LOG=1` prints each choice, and
//! each candidate skipped for its workspace, on stderr). Shapes cuDNN cannot take
//! (an empty dim, an operand of 2^31 elements or more) go to ember's own path.
//!
//! [`ConvShape::library_workspace`]: crate::backend::op::ConvShape::library_workspace

mod algos;
mod conv_graph;
pub(crate) mod graph;
pub(crate) mod sdpa;

use super::calls::{ConvCall, ConvGeom, ConvPass};
use super::libs::{self, CudaLib};
use crate::backend::op::conv::EnvSwitch;
use crate::{
    dtype::DType,
    error::{Error, Result},
};
use algos::{found, ranked, sized, Algo, Choice};
use cudarc::cudnn::{result as dnn, sys};
use cudarc::driver::sys::CUstream;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, MutexGuard, OnceLock};

/// Whether `EMBER_CUDNN_LOG` asks for each shape's algorithm choice on stderr.
pub(crate) fn log_choices() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("EMBER_CUDNN_LOG").is_some_and(|v| v != "0"))
}

/// The loaded cuDNN's version number, or an error saying why none can be used.
pub(crate) fn loaded() -> Result<usize> {
    library()
        .as_ref()
        .copied()
        .map_err(|reason| Error::CudaUnavailable {
            reason: format!("cuDNN: {reason}"),
        })
}

/// The loaded cuDNN's version number (90100 for 9.1.0), or why none can be used.
pub(crate) fn library() -> &'static std::result::Result<usize, String> {
    static LIB: OnceLock<std::result::Result<usize, String>> = OnceLock::new();
    LIB.get_or_init(|| {
        libs::ensure(CudaLib::Cudnn)?;
        // SAFETY: a probe of the loader; cudarc panics on a missing library only in
        // the calls after it.
        if !unsafe { sys::is_culib_present() } {
            return Err("libcudnn.so.9 was found but does not load by name".into());
        }
        let v = dnn::get_version();
        if v / 10000 != 9 {
            return Err(format!("cuDNN version {v} found; ember needs cuDNN 9"));
        }
        // cuDNN 9's front library loads its parts (ops, cnn) at first use: check
        // that they load and match now rather than at the first convolution
        // SAFETY: plain version probes of a loaded cuDNN 9.
        let parts = unsafe {
            [
                ("ops", sys::cudnnOpsVersionCheck()),
                ("cnn", sys::cudnnCnnVersionCheck()),
            ]
        };
        for (part, status) in parts {
            status.result().map_err(|e| {
                format!(
                    "cuDNN {}.{}.{} loads, but its {part} library (libcudnn_{part}.so.9) does not: {e}; \
                     put the folder holding all of cuDNN's libraries on LD_LIBRARY_PATH or in \
                     EMBER_CUDA_LIB_DIR",
                    v / 10000,
                    v % 10000 / 100,
                    v % 100
                )
            })?;
        }
        Ok(v)
    })
}

static ALLOW_TF32: EnvSwitch = EnvSwitch::new("EMBER_CUDNN_TF32", true);

/// Lets float32 convolutions through cuDNN use TF32 tensor cores (inputs rounded
/// to a 10-bit mantissa, float32 accumulation), like
/// `torch.backends.cudnn.allow_tf32`, and with the same default: on
/// (`EMBER_CUDNN_TF32=0` switches it off for a program). About twice as fast as
/// float32's FMA kernels on Ampere and Hopper GPUs; results differ from exact
/// float32's by about 1e-3 of the values' scale (ember's simulator rounds the
/// operands as the tensor cores do, so tests see it too). Independent of
/// [`crate::cuda::set_allow_tf32`], which is for matrix products (off by default,
/// as `torch.backends.cuda.matmul.allow_tf32`).
pub fn set_allow_tf32(on: bool) {
    ALLOW_TF32.set(on)
}

/// Whether float32 convolutions through cuDNN may use TF32 (on unless switched
/// off).
pub fn allow_tf32() -> bool {
    ALLOW_TF32.get()
}

static BENCHMARK: EnvSwitch = EnvSwitch::new("EMBER_CUDNN_BENCHMARK", false);

/// Chooses each convolution's algorithms by timing them (`torch.backends.cudnn.benchmark`):
/// the first pass of each shape, dtype and layout runs every algorithm cuDNN has
/// for it whose workspace fits ([`set_workspace_limit`](super::cudnn::set_workspace_limit)),
/// with `cudnnFind*AlgorithmEx` on the call's own arrays, and keeps the fastest.
/// That first pass waits for the GPU; later ones cost nothing extra. Off by
/// default (cuDNN's heuristic choice, no timing), as PyTorch's;
/// `EMBER_CUDNN_BENCHMARK=1` switches it on for a program. Work queued while a CUDA
/// graph is captured is not timed: it takes a choice made before the capture, or
/// the heuristic's.
pub fn set_benchmark(on: bool) {
    BENCHMARK.set(on)
}

/// Whether convolutions' algorithms are chosen by timing them (off unless switched on).
pub fn benchmark() -> bool {
    BENCHMARK.get()
}

/// Keeps convolutions to cuDNN's deterministic algorithms
/// (`torch.backends.cudnn.deterministic`): those cuDNN reports as giving the same
/// bits on every run (some of the fastest backward algorithms add with atomics in
/// an order that varies). Off by default, as PyTorch's;
/// `EMBER_CUDNN_DETERMINISTIC=1` switches it on for a program. Applies to the
/// heuristic's choices and to the timed search's ([`set_benchmark`]) alike; choices
/// made before are kept apart, so switching back and forth does not choose again.
/// Attention keeps to ember's own kernels (deterministic) while it is on, as
/// PyTorch keeps away from cuDNN's attention then: cuDNN's backward adds dq with
/// atomics ([`super::cudnn::set_attention`]).
pub fn set_deterministic(on: bool) {
    crate::backend::op::conv::set_library_deterministic(on)
}

static GRAPH_API: EnvSwitch = EnvSwitch::new("EMBER_CUDNN_GRAPH", false);

/// Runs cuDNN convolutions through its graph API (as PyTorch does) instead of its
/// legacy `cudnnConvolution*` calls: one execution plan per shape, built once,
/// so that a call then costs a variant pack and one `cudnnBackendExecute`;
/// engines from cuDNN's heuristics, or timed with [`set_benchmark`]; the same
/// workspace either way. A pass the graph API cannot take (an operand not on 16
/// bytes, no engine) runs on the legacy calls (the reason under
/// `EMBER_CUDNN_LOG=1`). **Off by default, and not yet run on a GPU** (without
/// one, plans were checked to build for five of ResNet-50's convolution shapes
/// on an H200 described by its properties); `EMBER_CUDNN_GRAPH=1` switches it
/// on for a program. [`super::cudnn::graph_convolutions`] counts its passes.
pub fn set_graph_api(on: bool) {
    GRAPH_API.set(on)
}

/// Whether cuDNN convolutions go through its graph API (off unless switched on).
pub fn graph_api() -> bool {
    GRAPH_API.get()
}

/// Whether convolutions keep to cuDNN's deterministic algorithms (off unless
/// switched on).
pub fn deterministic() -> bool {
    crate::backend::op::conv::library_deterministic()
}

/// What a remembered algorithm choice was made for: the shape, the pass, and
/// every setting that narrows or orders the candidates.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct ChoiceKey {
    geom: ConvGeom,
    pass: ConvPass,
    tf32: bool,
    timed: bool,
    deterministic: bool,
    /// the workspace it was chosen within (a changed limit chooses again)
    workspace_bytes: usize,
}

/// Whether work queued on `stream` now is being captured into a CUDA graph (where
/// a timed search, which waits for the GPU, cannot run).
fn capturing(stream: CUstream) -> bool {
    use cudarc::driver::sys as cu;
    let mut status = cu::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: a live stream of the current context and one out-parameter.
    let r = unsafe { cu::cuStreamIsCapturing(stream, &mut status) };
    // a stream whose state cannot be read is treated as captured: no timing
    r != cu::CUresult::CUDA_SUCCESS
        || status != cu::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
}

/// One device's cuDNN, its handle created at first use.
#[derive(Default)]
pub(crate) struct Cudnn {
    state: Mutex<Option<Dnn>>,
}

/// A device's cuDNN handle (bound to the stream of its last call) and the
/// algorithms chosen so far.
struct Dnn {
    handle: sys::cudnnHandle_t,
    /// The stream the handle is bound to now.
    stream: CUstream,
    /// the choice that ran, by what it was chosen for
    algos: HashMap<ChoiceKey, Choice>,
    /// (geometry, TF32 allowed) -> its descriptors, made once (each pass sets the
    /// convolution descriptor's math type before it runs)
    descs: HashMap<(ConvGeom, bool), Descriptors>,
    /// attention's plans by geometry, or why cuDNN has none (asked once)
    sdpa: HashMap<sdpa::SdpaGeom, std::result::Result<sdpa::SdpaPlan, String>>,
    /// the graph API's convolution plans, or why there is none (asked once)
    conv_plans: HashMap<ChoiceKey, std::result::Result<conv_graph::ConvPlan, String>>,
}
// SAFETY: the handle is used under the device's dnn mutex only.
unsafe impl Send for Dnn {}

fn dnn_err(op: &'static str) -> impl Fn(dnn::CudnnError) -> Error {
    move |e| Error::Cuda {
        op,
        msg: e.to_string(),
    }
}

/// The descriptors of one geometry, destroyed when dropped.
struct Descriptors {
    x: sys::cudnnTensorDescriptor_t,
    w: sys::cudnnFilterDescriptor_t,
    y: sys::cudnnTensorDescriptor_t,
    conv: sys::cudnnConvolutionDescriptor_t,
    /// The math type the heuristics are asked with (a pass that ran since may have
    /// left another on `conv`).
    math: sys::cudnnMathType_t,
}

impl Descriptors {
    /// The descriptors of `g`, checked to give ember's output size.
    fn new(g: &ConvGeom, tf32: bool) -> Result<Descriptors> {
        use sys::cudnnDataType_t::*;
        use sys::cudnnMathType_t::*;
        // (the operands' type, the accumulation's, the math asked for)
        let (data, compute, math) = match g.dtype {
            // FMA kernels exclude TF32, which cuDNN's default math allows
            DType::F32 => (
                CUDNN_DATA_FLOAT,
                CUDNN_DATA_FLOAT,
                if tf32 {
                    CUDNN_DEFAULT_MATH
                } else {
                    CUDNN_FMA_MATH
                },
            ),
            DType::F64 => (CUDNN_DATA_DOUBLE, CUDNN_DATA_DOUBLE, CUDNN_DEFAULT_MATH),
            // half operands accumulated in float32 (PyTorch's choice), on tensor
            // cores
            DType::F16 => (CUDNN_DATA_HALF, CUDNN_DATA_FLOAT, CUDNN_TENSOR_OP_MATH),
            DType::BF16 => (CUDNN_DATA_BFLOAT16, CUDNN_DATA_FLOAT, CUDNN_TENSOR_OP_MATH),
            dt => {
                return Err(Error::dtype(
                    "conv2d",
                    dt,
                    "ember's cuDNN path takes float16, bfloat16, float32 or float64",
                ))
            }
        };
        let order = if g.nhwc {
            sys::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC
        } else {
            sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW
        };
        let mut d = Descriptors {
            x: std::ptr::null_mut(),
            w: std::ptr::null_mut(),
            y: std::ptr::null_mut(),
            conv: std::ptr::null_mut(),
            math,
        };
        // SAFETY: each descriptor is set right after its creation and destroyed once
        // (by Drop, which skips the ones not created).
        unsafe {
            d.x =
                dnn::create_tensor_descriptor().map_err(dnn_err("cudnnCreateTensorDescriptor"))?;
            dnn::set_tensor4d_descriptor(d.x, order, data, g.x)
                .map_err(dnn_err("cudnnSetTensor4dDescriptor"))?;
            d.y =
                dnn::create_tensor_descriptor().map_err(dnn_err("cudnnCreateTensorDescriptor"))?;
            dnn::set_tensor4d_descriptor(d.y, order, data, g.y)
                .map_err(dnn_err("cudnnSetTensor4dDescriptor"))?;
            d.w =
                dnn::create_filter_descriptor().map_err(dnn_err("cudnnCreateFilterDescriptor"))?;
            dnn::set_filter4d_descriptor(d.w, data, order, g.w)
                .map_err(dnn_err("cudnnSetFilter4dDescriptor"))?;
            d.conv = dnn::create_convolution_descriptor()
                .map_err(dnn_err("cudnnCreateConvolutionDescriptor"))?;
            dnn::set_convolution2d_descriptor(
                d.conv,
                g.pad[0],
                g.pad[1],
                g.stride[0],
                g.stride[1],
                g.dilation[0],
                g.dilation[1],
                sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                compute,
            )
            .map_err(dnn_err("cudnnSetConvolution2dDescriptor"))?;
            dnn::set_convolution_group_count(d.conv, g.groups)
                .map_err(dnn_err("cudnnSetConvolutionGroupCount"))?;
            dnn::set_convolution_math_type(d.conv, math)
                .map_err(dnn_err("cudnnSetConvolutionMathType"))?;
        }
        // cuDNN's output size must be ember's, or the arrays do not match
        let o = d.output_dims()?;
        if o != g.y {
            return Err(Error::Cuda {
                op: "cudnnGetConvolution2dForwardOutputDim",
                msg: format!("cuDNN computes an output of {o:?}, ember {:?}", g.y),
            });
        }
        Ok(d)
    }

    /// The output size cuDNN computes for these descriptors (host-only: no GPU
    /// or handle needed).
    fn output_dims(&self) -> Result<[i32; 4]> {
        let (mut n, mut k, mut p, mut q) = (0i32, 0i32, 0i32, 0i32);
        // SAFETY: live descriptors, four out-parameters.
        unsafe {
            sys::cudnnGetConvolution2dForwardOutputDim(
                self.conv, self.x, self.w, &mut n, &mut k, &mut p, &mut q,
            )
        }
        .result()
        .map_err(dnn_err("cudnnGetConvolution2dForwardOutputDim"))?;
        Ok([n, k, p, q])
    }
}

impl Drop for Descriptors {
    fn drop(&mut self) {
        // SAFETY: each non-null descriptor was created by `new` and is destroyed once.
        unsafe {
            if !self.x.is_null() {
                let _ = dnn::destroy_tensor_descriptor(self.x);
            }
            if !self.y.is_null() {
                let _ = dnn::destroy_tensor_descriptor(self.y);
            }
            if !self.w.is_null() {
                let _ = dnn::destroy_filter_descriptor(self.w);
            }
            if !self.conv.is_null() {
                let _ = dnn::destroy_convolution_descriptor(self.conv);
            }
        }
    }
}

impl Cudnn {
    /// The device's cuDNN handle (created at first use), bound to `stream`.
    fn handle(&self, stream: CUstream) -> Result<MutexGuard<'_, Option<Dnn>>> {
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            loaded()?;
            let h = dnn::create_handle().map_err(dnn_err("cudnnCreate"))?;
            *g = Some(Dnn {
                handle: h,
                stream: std::ptr::null_mut(),
                algos: HashMap::new(),
                descs: HashMap::new(),
                sdpa: HashMap::new(),
                conv_plans: HashMap::new(),
            });
        }
        let state = g.as_mut().expect("created above");
        if state.stream != stream {
            // SAFETY: a live handle and a live stream of this device (the handle is
            // used under this lock only).
            unsafe { dnn::set_stream(state.handle, stream as sys::cudaStream_t) }
                .map_err(dnn_err("cudnnSetStream"))?;
            state.stream = stream;
        }
        Ok(g)
    }

    /// Runs `c` with the algorithm chosen for its shape before, or chooses one
    /// whose workspace fits `c`'s: the fastest when timed
    /// ([`set_benchmark`] and not capturing a graph), else cuDNN's heuristic
    /// candidates in rank order; the first that runs is remembered. A remembered
    /// choice that fails is chosen again.
    ///
    /// # Safety
    /// `c.x`, `c.w` and `c.y` address dense device arrays of the sizes of
    /// `c.geom`, `c.workspace` one of `c.workspace_bytes`; `stream` is the
    /// device's, its context current on this thread.
    pub(crate) unsafe fn conv(&self, stream: CUstream, c: &ConvCall) -> Result<()> {
        let mut guard = self.handle(stream)?;
        let state = guard.as_mut().expect("created by dnn()");
        let h = state.handle;
        let tf32 = c.tf32;
        if graph_api() {
            // (a pass the graph API refuses takes the legacy calls below; the
            // reason was logged when its plan was asked for)
            if conv_graph::graph_conv(state, stream, c).is_ok() {
                super::cudnn::count_graph_pass();
                return Ok(());
            }
        }
        let d = match state.descs.entry((c.geom, tf32)) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(Descriptors::new(&c.geom, tf32)?)
            }
        };
        // a capture cannot wait for the GPU: there a timed choice made before it
        // is used, or else the heuristic's (remembered apart from the timed ones)
        let deterministic = deterministic();
        let key = |timed: bool| ChoiceKey {
            geom: c.geom,
            pass: c.pass,
            tf32,
            timed,
            deterministic,
            workspace_bytes: c.workspace_bytes,
        };
        let mut timed = benchmark() && (state.algos.contains_key(&key(true)) || !capturing(stream));
        if let Some(choice) = state.algos.get(&key(timed)).copied() {
            if run_choice(h, d, c, choice).is_ok() {
                return Ok(());
            }
            state.algos.remove(&key(timed));
            timed = timed && !capturing(stream);
        }
        // FMA kernels (f32 without TF32) whatever the ranking's math type
        let math_rule = (d.math == sys::cudnnMathType_t::CUDNN_FMA_MATH).then_some(d.math);
        dnn::set_convolution_math_type(d.conv, d.math)
            .map_err(dnn_err("cudnnSetConvolutionMathType"))?;
        let mut last = None;
        // timed where asked; the heuristic's ranking where the timed search fails
        // or finds nothing within the workspace
        let (mut candidates, mut searched) = (Vec::new(), false);
        if timed {
            match found(h, d, c, math_rule, deterministic) {
                Ok(found) => {
                    searched = !found.is_empty();
                    candidates = found;
                }
                Err(e) => {
                    if log_choices() {
                        eprintln!(
                            "ember: cuDNN's timed search failed ({e}); its heuristic instead"
                        );
                    }
                    last = Some(e);
                }
            }
        }
        if candidates.is_empty() {
            for choice in ranked(h, d, c.pass, math_rule, deterministic)? {
                match sized(h, d, choice) {
                    Ok(choice) if choice.bytes <= c.workspace_bytes => candidates.push(choice),
                    Ok(choice) => {
                        if log_choices() {
                            eprintln!(
                                "ember: cuDNN {:?} of {:?}: {:?} skipped, it needs {} bytes of \
                                 workspace and this pass has {} (cudnn::set_workspace_limit)",
                                c.pass, c.geom, choice.algo, choice.bytes, c.workspace_bytes
                            );
                        }
                    }
                    Err(e) => last = Some(e),
                }
            }
        }
        let key = key(timed);
        for choice in candidates {
            match run_choice(h, d, c, choice) {
                Ok(()) => {
                    if log_choices() {
                        eprintln!(
                            "ember: cuDNN {:?} of {:?}: {:?}, math {:?}, workspace {} of {} bytes{}",
                            c.pass,
                            c.geom,
                            choice.algo,
                            choice.math,
                            choice.bytes,
                            c.workspace_bytes,
                            if searched { " (timed)" } else { "" }
                        );
                    }
                    state.algos.insert(key, choice);
                    return Ok(());
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::Cuda {
            op: "choosing a cuDNN algorithm",
            msg: format!(
                "cuDNN proposes no usable {}{:?} algorithm for {:?} within {} bytes of workspace; \
                 raise ember::cuda::cudnn::set_workspace_limit{}, or \
                 ember::cuda::cudnn::set_enabled(false) uses ember's own convolutions",
                if deterministic { "deterministic " } else { "" },
                c.pass,
                c.geom,
                c.workspace_bytes,
                if deterministic {
                    " or allow nondeterministic algorithms (cudnn::set_deterministic(false))"
                } else {
                    ""
                }
            ),
        }))
    }
}

/// Queues `c` with `choice`'s algorithm and math type in `c`'s workspace.
///
/// # Safety
/// As [`Cudnn::conv`]; `h` is the device's handle, `d` describes `c`.
unsafe fn run_choice(
    h: sys::cudnnHandle_t,
    d: &Descriptors,
    c: &ConvCall,
    choice: Choice,
) -> Result<()> {
    dnn::set_convolution_math_type(d.conv, choice.math)
        .map_err(dnn_err("cudnnSetConvolutionMathType"))?;
    let (one32, zero32, one64, zero64) = (1f32, 0f32, 1f64, 0f64);
    let (one, zero): (*const c_void, *const c_void) = if c.geom.dtype == DType::F64 {
        (
            (&one64 as *const f64).cast(),
            (&zero64 as *const f64).cast(),
        )
    } else {
        (
            (&one32 as *const f32).cast(),
            (&zero32 as *const f32).cast(),
        )
    };
    let (x, w, y) = (c.x as *mut c_void, c.w as *mut c_void, c.y as *mut c_void);
    let (wsp, bytes) = (c.workspace as *mut c_void, c.workspace_bytes);
    match choice.algo {
        Algo::Forward(a) => {
            dnn::convolution_forward(h, one, d.x, x, d.w, w, d.conv, a, wsp, bytes, zero, d.y, y)
                .map_err(dnn_err("cudnnConvolutionForward"))
        }
        Algo::BackwardData(a) => dnn::convolution_backward_data(
            h, one, d.w, w, d.y, y, d.conv, a, wsp, bytes, zero, d.x, x,
        )
        .map_err(dnn_err("cudnnConvolutionBackwardData")),
        Algo::BackwardFilter(a) => dnn::convolution_backward_filter(
            h, one, d.x, x, d.y, y, d.conv, a, wsp, bytes, zero, d.w, w,
        )
        .map_err(dnn_err("cudnnConvolutionBackwardFilter")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::op::{ConvShape, Window};

    fn shape(
        (n, c, h, w): (usize, usize, usize, usize),
        (o, kh, kw): (usize, usize, usize),
        (stride, padding, dilation): ((usize, usize), (usize, usize), (usize, usize)),
        groups: usize,
    ) -> ConvShape {
        let win = Window {
            kernel: (kh, kw),
            stride,
            padding,
            dilation,
        };
        let out = |i, k, s, p, d| Window::out_size(i, k, s, p, d, false).unwrap();
        ConvShape {
            n,
            c,
            h,
            w,
            o,
            groups,
            oh: out(h, kh, stride.0, padding.0, dilation.0),
            ow: out(w, kw, stride.1, padding.1, dilation.1),
            win,
            nhwc: false,
        }
    }

    #[test]
    fn operands_past_cudnns_element_limit_are_left_to_ember() {
        let one = (1, 1);
        // every dim fits in i32, but the input has 2^31 elements
        let big = shape((128, 64, 512, 512), (8, 1, 1), (one, (0, 0), one), 1);
        assert!(ConvGeom::new(DType::F32, &big).is_none());
        let ok = shape((127, 64, 512, 512), (8, 1, 1), (one, (0, 0), one), 1);
        assert!(ConvGeom::new(DType::F32, &ok).is_some());
    }

    /// Where the cuDNN library loads (no GPU needed): it accepts ember's descriptors
    /// and computes the output sizes ember computes.
    #[test]
    fn descriptors_and_output_sizes_agree_with_cudnn() {
        if let Err(why) = library() {
            eprintln!("skipped descriptors_and_output_sizes_agree_with_cudnn: {why}");
            return;
        }
        let one = (1, 1);
        let cases = [
            shape((2, 3, 7, 6), (4, 3, 3), (one, (0, 0), one), 1),
            shape((2, 3, 9, 8), (5, 3, 3), ((2, 2), one, one), 1),
            shape((1, 2, 9, 9), (3, 3, 3), (one, (2, 2), (2, 2)), 1),
            shape((2, 4, 6, 5), (6, 3, 3), (one, one, one), 2),
            shape((1, 4, 6, 6), (4, 3, 3), (one, (0, 0), one), 4),
            shape((2, 2, 8, 7), (3, 2, 3), ((2, 1), (0, 1), (1, 2)), 1),
            shape((64, 32, 26, 26), (64, 3, 3), (one, (0, 0), one), 1),
            shape((1, 1, 5, 5), (1, 5, 5), ((3, 3), (0, 0), one), 1),
        ];
        for s in &cases {
            for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
                // channels-last descriptors (NHWC tensors, KRSC filters) too, for
                // the dtypes ember sends that way
                for nhwc in [false, dtype != DType::F64] {
                    for tf32 in [false, true] {
                        let s = ConvShape { nhwc, ..*s };
                        let g = ConvGeom::new(dtype, &s).expect("a cuDNN geometry");
                        let d = Descriptors::new(&g, tf32).unwrap();
                        assert_eq!(d.output_dims().unwrap(), g.y, "{g:?}");
                    }
                }
            }
        }
        // a filter that does not fit the input is refused, not crashed on
        let mut bad = ConvGeom::new(DType::F32, &cases[0]).expect("a cuDNN geometry");
        bad.w[1] = 2;
        let refused = Descriptors::new(&bad, false).and_then(|d| d.output_dims());
        assert!(refused.is_err(), "{refused:?}");
    }
}
