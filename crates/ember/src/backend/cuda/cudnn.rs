//! The cuDNN switch (`torch.backends.cudnn`): whether GPU convolutions go to cuDNN
//! (`ember::cuda::cudnn`). The library calls themselves are in `dnn.rs`; the
//! simulator stands in for the library where it runs.

use super::discover::system;
use super::dnn::library;
use std::sync::atomic::{AtomicU8, Ordering};

/// 0: not decided yet (`EMBER_CUDNN` decides), 1: off, 2: on.
static ENABLED: AtomicU8 = AtomicU8::new(0);

/// Sends GPU convolutions to cuDNN when it is available
/// (`torch.backends.cudnn.enabled`). Off by default until ember's cuDNN path has
/// run on a GPU; `EMBER_CUDNN=1` switches it on for a whole program.
pub fn set_enabled(on: bool) {
    ENABLED.store(if on { 2 } else { 1 }, Ordering::Relaxed);
}

/// Whether GPU convolutions go to cuDNN when it is available.
pub fn enabled() -> bool {
    match ENABLED.load(Ordering::Relaxed) {
        0 => {
            let on = std::env::var("EMBER_CUDNN").is_ok_and(|v| matches!(v.trim(), "1" | "true"));
            // a set_enabled() racing with this first read wins
            let _ = ENABLED.compare_exchange(
                0,
                if on { 2 } else { 1 },
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            ENABLED.load(Ordering::Relaxed) == 2
        }
        v => v == 2,
    }
}

// the TF32 switch lives with the library calls that read it
pub use super::dnn::{allow_tf32, set_allow_tf32};

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

/// Whether convolutions on a GPU go to cuDNN now: switched on, and available.
pub fn in_use() -> bool {
    enabled() && is_available()
}
