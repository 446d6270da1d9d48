//! Helpers shared by the test binaries.
//!
//! Every test that needs `cuda:0` asks [`gpu`] (or [`gpu_unless`]) for it, which
//! counts the tests that ran there and those that skipped. A skipped test passes
//! ("ok") and libtest captures what it prints, so at exit the binary writes one
//! line to the real stderr, shown in plain `cargo test` output:
//!
//! ```text
//! device tests: 0 ran on cuda:0, 57 skipped (no GPU: <reason>)
//! device tests: 57 ran on cuda:0 (CUDA simulator), 0 skipped
//! ```
//!
//! (nothing when no test of the binary asked for a GPU).

// not every test binary uses every helper
#![allow(dead_code)]

use ember::Device;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, Once, OnceLock};

/// The first GPU, or `None` after noting why `test` skipped (no GPU, no driver, or
/// a CUDA library missing: the reason names it).
pub fn gpu(test: &str) -> Option<Device> {
    gpu_unless(test, || None)
}

/// Switches TF32 off for float32 convolutions through cuDNN in this process, for
/// tests that compare float32 results with PyTorch's or the CPU's to float32's
/// tolerance: TF32 (cuDNN's default, as PyTorch's) reads 10 bits of each
/// operand's mantissa, about 1e-3 of the values, on a GPU and on ember's
/// simulator alike. TF32 itself is checked to its own tolerance in
/// tests/cudnn.rs; no test of a binary that calls this switches it back on, and
/// a binary calls it before any GPU work of a test that compares (the tensor
/// binary as each test gets its device), so no test straddles the switch.
pub fn exact_float32_convolutions() {
    ember::cuda::cudnn::set_allow_tf32(false);
}

/// As [`gpu`], but `test` also skips when `missing` gives a reason (something else
/// it needs, such as cuDNN, is absent); `missing` is asked only when a GPU is there.
pub fn gpu_unless(test: &str, missing: impl FnOnce() -> Option<String>) -> Option<Device> {
    HOOK.call_once(|| {
        // SAFETY: `print_summary` is an `extern "C" fn()` that does not unwind
        // (it catches any panic) and touches only this module's statics.
        unsafe {
            libc::atexit(print_summary);
        }
    });
    let reason = match ember::cuda::unavailable_reason() {
        Some(reason) => Some(format!("no GPU: {reason}")),
        None => missing(),
    };
    match reason {
        Some(reason) => {
            eprintln!("skipped {test}: {reason}");
            SKIPPED.fetch_add(1, Ordering::SeqCst);
            let mut first = FIRST_REASON.lock().unwrap_or_else(|p| p.into_inner());
            match &*first {
                None => *first = Some(reason),
                Some(r) if *r != reason => OTHER_REASONS.store(true, Ordering::SeqCst),
                Some(_) => {}
            }
            None
        }
        None => {
            let dev = Device::Cuda(0);
            LABEL.get_or_init(|| device_label(dev));
            RAN.fetch_add(1, Ordering::SeqCst);
            Some(dev)
        }
    }
}

static HOOK: Once = Once::new();
static RAN: AtomicUsize = AtomicUsize::new(0);
static SKIPPED: AtomicUsize = AtomicUsize::new(0);
/// The first skip's reason; `OTHER_REASONS` when a later skip gave another.
static FIRST_REASON: Mutex<Option<String>> = Mutex::new(None);
static OTHER_REASONS: AtomicBool = AtomicBool::new(false);
/// The device the tests ran on, as the summary names it (read while ember is
/// still running, not at exit).
static LABEL: OnceLock<String> = OnceLock::new();

/// `cuda:0 (CUDA simulator)` or `cuda:0 (<the GPU's name>)`.
fn device_label(dev: Device) -> String {
    if ember::cuda::is_simulated() {
        format!("{dev} (CUDA simulator)")
    } else {
        match ember::cuda::device_properties(0) {
            Ok(p) => format!("{dev} ({})", p.name),
            Err(_) => dev.to_string(),
        }
    }
}

/// The summary line, or `None` when no test asked for a GPU.
fn summary() -> Option<String> {
    let ran = RAN.load(Ordering::SeqCst);
    let skipped = SKIPPED.load(Ordering::SeqCst);
    if ran + skipped == 0 {
        return None;
    }
    let label = LABEL.get().map_or("cuda:0", String::as_str);
    let mut line = format!("device tests: {ran} ran on {label}, {skipped} skipped");
    if skipped > 0 {
        // at exit no test holds the lock; should one, the reason is left out
        // rather than waited for
        if let Ok(first) = FIRST_REASON.try_lock() {
            if let Some(reason) = &*first {
                let more = if OTHER_REASONS.load(Ordering::SeqCst) {
                    ", among other reasons"
                } else {
                    ""
                };
                line.push_str(&format!(" ({reason}{more})"));
            }
        }
    }
    Some(line)
}

/// Writes the summary to the process's stderr: not through `eprintln!`, whose
/// output libtest captures (and which is gone by the time this runs).
extern "C" fn print_summary() {
    let _ = std::panic::catch_unwind(|| {
        if let Some(line) = summary() {
            use std::io::Write;
            let mut err = std::io::stderr().lock();
            let _ = writeln!(err, "{line}");
            let _ = err.flush();
        }
    });
}

/// The highest live meta bytes above the start while it is the hook
/// (`ember::meta::with_hook`); frees of older tensors count below the start.
#[derive(Default)]
pub struct MetaPeak {
    cur: std::sync::atomic::AtomicIsize,
    top: std::sync::atomic::AtomicIsize,
}

impl MetaPeak {
    /// The highest point so far, in bytes above the start.
    pub fn top(&self) -> isize {
        self.top.load(Ordering::Relaxed)
    }
}

impl ember::meta::AllocHook for MetaPeak {
    fn alloc(&self, e: &ember::meta::MetaEvent) {
        let now = self.cur.fetch_add(e.bytes as isize, Ordering::Relaxed) + e.bytes as isize;
        self.top.fetch_max(now, Ordering::Relaxed);
    }
    fn free(&self, e: &ember::meta::MetaEvent) {
        self.cur.fetch_sub(e.bytes as isize, Ordering::Relaxed);
    }
}

/// Asserts each `got[i]` is within a half-precision sum's error of `want[i]`:
/// the result's rounding plus two of partial sums as large as `terms[i]` (the
/// sum of the terms' magnitudes), `unit` the dtype's unit roundoff (bf16 2^-8,
/// f16 2^-11). cuBLAS and cuDNN may round a split sum's partial sums in the half
/// type (PyTorch's `allow_bf16_reduced_precision_reduction` default allows it).
#[track_caller]
pub fn assert_within_terms(got: &[f64], want: &[f64], terms: &[f64], unit: f64, what: &str) {
    assert_eq!(
        (got.len(), terms.len()),
        (want.len(), want.len()),
        "lengths, {what}"
    );
    for (i, ((g, w), t)) in got.iter().zip(want).zip(terms).enumerate() {
        assert!(
            (g - w).abs() <= unit * (w.abs() + 2.0 * t),
            "element {i}: got {g}, want {w} (terms' magnitudes {t}), {what}"
        );
    }
}

/// The multiprocessor count of `dev` (132 where it is not a CUDA device), for
/// estimates of its steps (`Estimator::multiprocessors`: a GPU splits long
/// reductions by it).
pub fn multiprocessors(dev: &Device) -> usize {
    match dev {
        Device::Cuda(i) => ember::cuda::device_properties(*i)
            .map(|p| p.multiprocessor_count as usize)
            .unwrap_or(132),
        _ => 132,
    }
}
