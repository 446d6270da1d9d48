//! The geometry of 2-D convolutions and pooling.

/// Geometry of a 2-D convolution or pooling window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Window {
    pub kernel: (usize, usize),
    pub stride: (usize, usize),
    pub padding: (usize, usize),
    pub dilation: (usize, usize),
}

impl Window {
    /// Output size along one axis (PyTorch's formula, with ceil mode for pooling);
    /// `None` when the window does not fit or the sizes overflow.
    pub fn out_size(
        input: usize,
        k: usize,
        s: usize,
        p: usize,
        d: usize,
        ceil: bool,
    ) -> Option<usize> {
        let eff = d.checked_mul(k.checked_sub(1)?)?.checked_add(1)?;
        let padded = p.checked_mul(2)?.checked_add(input)?;
        // PyTorch's `(padded - eff + (ceil ? s - 1 : 0)) / s + 1`, rounded down: in
        // ceil mode a window wider than the (padded) input still gives one output
        // when it starts inside the input
        let num = padded.checked_add(if ceil { s - 1 } else { 0 })?;
        let mut out = num.checked_sub(eff)? / s + 1;
        // the last window must start inside the input or the left padding
        if ceil && (out - 1) * s >= input + p {
            out -= 1;
        }
        (out > 0).then_some(out)
    }
}

/// Shapes of one conv2d call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConvShape {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub o: usize,
    pub groups: usize,
    pub oh: usize,
    pub ow: usize,
    pub win: Window,
    /// The operands and the result in channels-last order (input and output NHWC,
    /// weight `[o, kh, kw, c/g]`), dense from their offsets; otherwise row-major.
    /// Only a device that takes it (`Storage::conv_takes_channels_last`) is given
    /// it.
    pub nhwc: bool,
}

/// The most bytes of per-sample buffers ember's CUDA convolution makes at once (the
/// im2col patch matrix `[samples, c·kh·kw, oh·ow]`, and for the weight gradient one
/// `[o, c/g·kh·kw]` product per sample), unless `EMBER_CONV_PATCH_BYTES` says
/// otherwise (read once per process).
pub(crate) const PATCH_BYTES: usize = 64 << 20;

fn patch_bytes() -> usize {
    static BYTES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BYTES.get_or_init(|| {
        std::env::var("EMBER_CONV_PATCH_BYTES")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(PATCH_BYTES)
    })
}

/// A process-wide on/off setting whose first read, unless it was set before,
/// takes its value from an environment variable (`1`, `true`, `on`; `0`,
/// `false`, `off`; anything else or nothing: the default).
pub(crate) struct EnvSwitch {
    /// 0: not decided yet, 1: off, 2: on.
    state: std::sync::atomic::AtomicU8,
    var: &'static str,
    default: bool,
}

impl EnvSwitch {
    pub(crate) const fn new(var: &'static str, default: bool) -> EnvSwitch {
        EnvSwitch {
            state: std::sync::atomic::AtomicU8::new(0),
            var,
            default,
        }
    }

    pub(crate) fn set(&self, on: bool) {
        self.state
            .store(if on { 2 } else { 1 }, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        if self.state.load(Relaxed) == 0 {
            let on = match std::env::var(self.var).as_deref().map(str::trim) {
                Ok("1" | "true" | "on") => true,
                Ok("0" | "false" | "off") => false,
                _ => self.default,
            };
            // a set() racing with this first read wins
            let _ = self
                .state
                .compare_exchange(0, if on { 2 } else { 1 }, Relaxed, Relaxed);
        }
        self.state.load(Relaxed) == 2
    }
}

/// Whether GPU convolutions go to the vendor library (cuDNN) where it loads. Here
/// and not in the CUDA backend because the meta device models the path it selects.
static LIBRARY: EnvSwitch = EnvSwitch::new("EMBER_CUDNN", true);

/// Whether the vendor library keeps to its deterministic algorithms
/// (`torch.backends.cudnn.deterministic`). Here and not in the CUDA backend
/// because the meta device models the attention path it selects.
static LIBRARY_DETERMINISTIC: EnvSwitch = EnvSwitch::new("EMBER_CUDNN_DETERMINISTIC", false);

pub(crate) fn set_library_deterministic(on: bool) {
    LIBRARY_DETERMINISTIC.set(on)
}

pub(crate) fn library_deterministic() -> bool {
    LIBRARY_DETERMINISTIC.get()
}

/// The default of [`library_workspace_limit`]: 512 MiB. On an H200 (2026-11-29)
/// the first of cuDNN's heuristic choices for ResNet-50's convolutions at batch 64
/// needed up to 303 MiB (FFT algorithms aside); those that did not fit fell back
/// to algorithms up to 40 times slower (bf16 row-major: a layout transform in the
/// workspace, or no tensor cores without it).
pub(crate) const LIBRARY_WORKSPACE: usize = 512 << 20;

static WORKSPACE_LIMIT: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(LIBRARY_WORKSPACE);

/// Switches the library path on or off for the process (`torch.backends.cudnn.enabled`).
pub(crate) fn set_library_enabled(on: bool) {
    LIBRARY.set(on)
}

/// Whether GPU convolutions go to the library where it loads: on unless
/// [`set_library_enabled(false)`](set_library_enabled) or `EMBER_CUDNN=0`.
pub(crate) fn library_enabled() -> bool {
    LIBRARY.get()
}

/// Sets the most scratch memory one library convolution may take
/// ([`ConvShape::library_workspace`]); `0` is refused.
pub(crate) fn set_library_workspace_limit(bytes: usize) -> crate::error::Result<()> {
    if bytes == 0 {
        return Err(crate::error::Error::invalid(
            "cudnn::set_workspace_limit",
            "a workspace limit of 0 bytes leaves cuDNN only its slowest algorithms; give a \
             positive number of bytes (the default is 512 MiB), or switch cuDNN off with \
             cudnn::set_enabled(false)",
        ));
    }
    WORKSPACE_LIMIT.store(bytes, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

/// The most scratch memory one library convolution may take.
pub(crate) fn library_workspace_limit() -> usize {
    WORKSPACE_LIMIT.load(std::sync::atomic::Ordering::Relaxed)
}

impl ConvShape {
    /// The patches of one sample, in elements.
    pub fn patches_per_sample(&self) -> usize {
        let (kh, kw) = self.win.kernel;
        self.c * kh * kw * self.oh * self.ow
    }

    /// The weight's elements (`o · c/g · kh · kw`): one sample's product in the
    /// weight gradient.
    pub fn weight_numel(&self) -> usize {
        let (kh, kw) = self.win.kernel;
        self.o * (self.c / self.groups.max(1)) * kh * kw
    }

    /// Samples per pass of the im2col path: as many as keep a pass's per-sample
    /// buffers (patches and weight-gradient products) of `elem_bytes`-byte elements
    /// within the budget ([`PATCH_BYTES`]), at least one, at most the batch. The
    /// CUDA backend and the meta device's mirror of its memory both use it.
    pub fn samples_per_pass(&self, elem_bytes: usize) -> usize {
        let per = (self.patches_per_sample() + self.weight_numel()).saturating_mul(elem_bytes);
        let n = self.n.max(1);
        if per == 0 {
            return n;
        }
        (patch_bytes() / per).clamp(1, n)
    }

    /// Whether the library (cuDNN) can take this shape: no empty dim, and every
    /// size and every operand's element count within its 32-bit limits; ember's
    /// own path takes the rest.
    pub fn fits_library(&self) -> bool {
        let max = i32::MAX as usize;
        let (kh, kw) = self.win.kernel;
        let w = &self.win;
        let positive = [
            self.n,
            self.c,
            self.h,
            self.w,
            self.o,
            self.c / self.groups.max(1),
            kh,
            kw,
            self.oh,
            self.ow,
            w.stride.0,
            w.stride.1,
            w.dilation.0,
            w.dilation.1,
            self.groups,
        ];
        let sized = |d: [usize; 4]| {
            d.iter()
                .try_fold(1usize, |a, &v| a.checked_mul(v))
                .is_some_and(|v| v <= max)
        };
        positive.iter().all(|&v| v > 0 && v <= max)
            && w.padding.0 <= max
            && w.padding.1 <= max
            && sized([self.n, self.c, self.h, self.w])
            && sized([self.o, self.c / self.groups, kh, kw])
            && sized([self.n, self.o, self.oh, self.ow])
    }

    /// Whether a GPU convolution of this shape in `dtype` goes to the library where
    /// it loads: switched on ([`library_enabled`]), a dtype it takes (f16, bf16,
    /// f32, f64) and a shape it fits. The CUDA backend also asks whether it loads;
    /// the meta device models a GPU where it does.
    pub fn through_library(&self, dtype: crate::dtype::DType) -> bool {
        use crate::dtype::DType::*;
        matches!(dtype, F16 | BF16 | F32 | F64) && library_enabled() && self.fits_library()
    }

    /// Whether a library convolution of this shape in `dtype` (f16 or bf16) runs in
    /// its own dtype (half kernels accumulating in float32), where the library
    /// loads; otherwise half operands are convolved in float32.
    pub fn library_takes_half(&self, dtype: crate::dtype::DType) -> bool {
        use crate::dtype::DType::*;
        matches!(dtype, F16 | BF16) && self.through_library(dtype)
    }

    /// Whether a convolution of this shape in `dtype` takes channels-last operands
    /// as they lie (the library's NHWC descriptors; float64 stays row-major, as
    /// PyTorch keeps it), where the library loads.
    pub fn library_takes_channels_last(&self, dtype: crate::dtype::DType) -> bool {
        dtype != crate::dtype::DType::F64 && self.through_library(dtype)
    }

    /// The scratch memory, in bytes, each library pass of this shape takes from the
    /// caching allocator for `elem_bytes`-byte elements: the larger of the batch's
    /// im2col patch matrix (what cuDNN's explicit-GEMM algorithm needs) and three
    /// times the input and output together (what its implicit-GEMM algorithms need
    /// for their index tables and, for half-precision row-major operands, their
    /// layout transforms: at most 2.6 times on an H200 for ResNet-50's shapes), at
    /// most [`library_workspace_limit`]. Algorithms that need more are not used. A
    /// size from the shape rather than the chosen algorithm's own (which only the
    /// GPU knows) keeps the meta device's estimate exact: it allocates the same
    /// bytes at the same point.
    pub fn library_workspace(&self, elem_bytes: usize) -> usize {
        let operands = (self
            .n
            .saturating_mul(self.c)
            .saturating_mul(self.h * self.w))
        .saturating_add(
            self.n
                .saturating_mul(self.o)
                .saturating_mul(self.oh * self.ow),
        );
        self.n
            .saturating_mul(self.patches_per_sample())
            .max(operands.saturating_mul(3))
            .saturating_mul(elem_bytes)
            .min(library_workspace_limit())
    }

    /// This shape for `n` of its samples.
    pub fn with_batch(&self, n: usize) -> ConvShape {
        ConvShape { n, ..*self }
    }
}

/// Pooling flavour.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Pool {
    Max,
    /// Average; `count_include_pad` counts padded positions in the divisor.
    Avg {
        count_include_pad: bool,
    },
}

/// Shapes of one pooling call: `planes` (batch × channels) planes of `h × w`
/// pooled into `oh × ow`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PoolShape {
    pub planes: usize,
    pub h: usize,
    pub w: usize,
    pub oh: usize,
    pub ow: usize,
    pub win: Window,
    /// `Some(c)`: the input, output and index lie channels-last (NHWC with `c`
    /// channels: the planes interleaved), dense from their offsets; `None`:
    /// row-major planes. Only a device that pools so
    /// (`Storage::pools_channels_last`) is given it.
    pub nhwc: Option<usize>,
}

impl PoolShape {
    /// The dtype of max pooling's index, each output's position in its window
    /// (`ki · kw + kj`): one byte where windows have at most 256 positions (an
    /// eighth of PyTorch's int64 plane offsets), int64 for larger windows.
    pub(crate) fn index_dtype(&self) -> crate::dtype::DType {
        if self.win.kernel.0 * self.win.kernel.1 <= 256 {
            crate::dtype::DType::U8
        } else {
            crate::dtype::DType::I64
        }
    }
}
