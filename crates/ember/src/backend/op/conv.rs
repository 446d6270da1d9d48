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
        let span = padded.checked_sub(eff)?;
        let mut out = if ceil { span.div_ceil(s) } else { span / s } + 1;
        // the last window must start inside the input or the left padding
        if ceil && (out - 1) * s >= input + p {
            out -= 1;
        }
        Some(out)
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
}
