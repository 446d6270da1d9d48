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
