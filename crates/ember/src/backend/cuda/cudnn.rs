//! The cuDNN switch (`torch.backends.cudnn`): whether GPU convolutions go to cuDNN
//! (`ember::cuda::cudnn`). The library calls themselves are in `dnn.rs`; the
//! simulator stands in for the library where it runs.

use super::discover::system;
use super::dnn::library;
use crate::backend::op::conv as policy;
use crate::error::Result;
use std::sync::atomic::Ordering;

/// Sends GPU convolutions to cuDNN where it loads (`torch.backends.cudnn.enabled`),
/// for the whole process. On by default, as PyTorch's; `EMBER_CUDNN=0` switches it
/// off for a program. Off, convolutions take ember's own im2col + cuBLAS path. The
/// meta device's memory estimate follows the switch.
pub fn set_enabled(on: bool) {
    policy::set_library_enabled(on)
}

/// Whether GPU convolutions go to cuDNN where it loads (on unless switched off).
pub fn enabled() -> bool {
    policy::library_enabled()
}

/// Sets the most scratch memory (bytes) one cuDNN convolution pass may use; its
/// algorithms that need more are not chosen, heuristic or benchmarked. Each pass
/// takes the larger of the batch's im2col patch size and three times its input
/// and output, up to this limit, from the caching allocator: a size that does not
/// depend on the algorithm, so `ember estimate` stays exact. The default is
/// 512 MiB; `0` is refused (an error, nothing changed).
pub fn set_workspace_limit(bytes: usize) -> Result<()> {
    policy::set_library_workspace_limit(bytes)
}

/// The most scratch memory one cuDNN convolution pass may use (512 MiB unless set).
pub fn workspace_limit() -> usize {
    policy::library_workspace_limit()
}

/// Sends float16 and bfloat16 attention on GPUs (`scaled_dot_product_attention`,
/// `MultiheadAttention`) to cuDNN's fused flash-attention engines where cuDNN
/// loads, as PyTorch's cuDNN attention backend; calls with a bias (an explicit
/// mask) or dropout, head dims past 128 or not a multiple of 8, and views not
/// in whole 16 bytes keep ember's own kernels, as does any call cuDNN has no
/// engine for (the reason under `EMBER_CUDNN_LOG=1`). **Off by default**: these
/// graphs are checked to be recognised by cuDNN's heuristics for an H200
/// without a GPU, but have not yet been run on one; `EMBER_CUDNN_ATTENTION=1`
/// switches it on for a program. The meta device's memory estimate follows the
/// switch (the backward's workspace holds dq accumulated in float32). On ember's
/// simulator a reference with the graphs' contract stands in for cuDNN.
pub fn set_attention(on: bool) {
    crate::backend::op::set_library_attention(on)
}

/// Whether f16/bf16 attention goes to cuDNN where it can (off unless switched on).
pub fn attention() -> bool {
    crate::backend::op::library_attention()
}

// the TF32 switch lives with the library calls that read it
pub use super::dnn::{
    allow_tf32, benchmark, deterministic, graph_api, set_allow_tf32, set_benchmark,
    set_deterministic, set_graph_api,
};

/// Whether convolutions can go to cuDNN: its library loads (version 9), or ember's
/// simulator stands in for it (`torch.backends.cudnn.is_available()`).
pub fn is_available() -> bool {
    system().dnn().is_ok()
}

/// The version of the cuDNN library that loads (`torch.backends.cudnn.version()`),
/// `None` where none does.
pub fn version() -> Option<usize> {
    library().as_ref().ok().copied()
}

/// Why cuDNN cannot be used, `None` where it can.
pub fn unavailable_reason() -> Option<String> {
    library().as_ref().err().cloned()
}

static PASSES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many convolution passes (forward, input and weight gradients) this process
/// has sent to cuDNN: a way to see that the switch took effect.
pub fn convolutions() -> u64 {
    PASSES.load(Ordering::Relaxed)
}

static NHWC_PASSES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many of [`convolutions`] took channels-last operands as they lie (cuDNN's
/// NHWC kernels, without copies to row-major).
pub fn channels_last_convolutions() -> u64 {
    NHWC_PASSES.load(Ordering::Relaxed)
}

/// Counts one pass sent to cuDNN (`nhwc`: in channels-last order).
pub(crate) fn count_pass(nhwc: bool) {
    PASSES.fetch_add(1, Ordering::Relaxed);
    if nhwc {
        NHWC_PASSES.fetch_add(1, Ordering::Relaxed);
    }
}

static GRAPH_PASSES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many of [`convolutions`] ran through cuDNN's graph API
/// ([`set_graph_api`]); the rest took its legacy calls (or, on ember's
/// simulator, its stand-in, which has no graph API).
pub fn graph_convolutions() -> u64 {
    GRAPH_PASSES.load(Ordering::Relaxed)
}

/// Counts one convolution pass run through the graph API.
pub(crate) fn count_graph_pass() {
    GRAPH_PASSES.fetch_add(1, Ordering::Relaxed);
}

static ATTENTION_PASSES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many attention passes (forward or backward) this process has run on
/// cuDNN's fused engines ([`set_attention`]): a way to see that the switch took
/// effect.
pub fn attention_passes() -> u64 {
    ATTENTION_PASSES.load(Ordering::Relaxed)
}

/// Counts one attention pass run by cuDNN.
pub(crate) fn count_attention_pass() {
    ATTENTION_PASSES.fetch_add(1, Ordering::Relaxed);
}

/// Whether convolutions on a GPU go to cuDNN now: switched on, and available.
pub fn in_use() -> bool {
    enabled() && is_available()
}
