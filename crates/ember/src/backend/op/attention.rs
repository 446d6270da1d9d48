//! Fused attention's geometry (`BackendStorage::attention`).

use crate::layout::Layout;
use crate::DType;

/// One fused attention call: `softmax(q kᵀ · scale) v` for each of `batch · heads`
/// query rows `[l, d]` against keys and values `[s, d]`; with `causal`, query `i`
/// sees keys `0..=i` (the mask's top-left triangle).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct AttnShape {
    pub batch: usize,
    pub heads: usize,
    pub l: usize,
    pub s: usize,
    pub d: usize,
    pub scale: f64,
    pub causal: bool,
}

impl AttnShape {
    /// Whether query `i` sees key `j`.
    pub fn visible(&self, i: usize, j: usize) -> bool {
        !(self.causal && j > i)
    }
}

/// The largest head dim the fused CUDA kernels take.
pub(crate) const ATTN_MAX_HEAD_DIM: usize = 128;

/// Rows (queries or keys) a fused CUDA launch covers at most: 64 per block along
/// the grid's y dim (at most 65535 blocks).
pub(crate) const ATTN_MAX_ROWS: usize = 64 * 65535;

/// Whether ember's fused CUDA attention kernels take operands of `dtype` for
/// `shape` (f16/bf16; a head dim that is a multiple of 8 up to
/// [`ATTN_MAX_HEAD_DIM`]; no empty operand; `batch · heads` below 2³¹ blocks and
/// lengths up to [`ATTN_MAX_ROWS`]); the GPU's compute capability (8.0 or later)
/// is the caller's to check. `None` when they do, else why not.
pub(crate) fn attn_kernel_refuses(dtype: DType, sh: &AttnShape) -> Option<String> {
    let n = sh.batch.checked_mul(sh.heads);
    if !matches!(dtype, DType::F16 | DType::BF16)
        || sh.d == 0
        || !sh.d.is_multiple_of(8)
        || sh.d > ATTN_MAX_HEAD_DIM
    {
        Some(format!(
            "the fused kernels take f16/bf16 with a head dim that is a multiple of 8 up to \
             {ATTN_MAX_HEAD_DIM} (got {dtype}, {})",
            sh.d
        ))
    } else if n.is_none_or(|n| n == 0) || sh.l == 0 || sh.s == 0 {
        Some("the fused kernels take no empty operand".into())
    } else if n.is_some_and(|n| n >= 1 << 31) || sh.l.max(sh.s) > ATTN_MAX_ROWS {
        Some(format!(
            "too large for the fused kernels: {} x {} rows of {} queries and {} keys \
             (at most 2^31 rows of {ATTN_MAX_ROWS})",
            sh.batch, sh.heads, sh.l, sh.s
        ))
    } else {
        None
    }
}

/// Whether a `[batch, heads, rows, d]` view can be read by the CUDA kernels in
/// place: the last dim contiguous, and the offset and the other strides multiples
/// of 8 elements (16-byte loads; a dim of size 1 has no stride that counts). The
/// CPU reads any view whose last dim is contiguous, and takes these too.
pub(crate) fn attn_view_fits(l: &Layout) -> bool {
    let (st, sh) = (l.strides(), l.shape());
    l.rank() == 4
        && (st[3] == 1 || sh[3] == 1)
        && l.offset().is_multiple_of(8)
        && (0..3).all(|i| sh[i] == 1 || st[i].is_multiple_of(8))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(batch: usize, l: usize, s: usize, d: usize) -> AttnShape {
        AttnShape {
            batch,
            heads: 1,
            l,
            s,
            d,
            scale: 1.0,
            causal: true,
        }
    }

    /// The CUDA kernels' limits: dtypes, head dims, empty operands, and sizes the
    /// grid cannot cover are refused with a reason (the tensor layer then takes
    /// another path), the largest sizes they cover are taken.
    #[test]
    fn the_kernels_refuse_what_they_cannot_run() {
        assert!(attn_kernel_refuses(DType::BF16, &shape(2, 70, 33, 64)).is_none());
        assert!(attn_kernel_refuses(DType::F16, &shape(1, ATTN_MAX_ROWS, 1, 128)).is_none());
        assert!(attn_kernel_refuses(DType::F16, &shape((1 << 31) - 1, 1, 1, 8)).is_none());
        for (dt, sh, why) in [
            (DType::F32, shape(1, 8, 8, 64), "f16/bf16"),
            (DType::BF16, shape(1, 8, 8, 60), "multiple of 8"),
            (DType::BF16, shape(1, 8, 8, 136), "multiple of 8"),
            (DType::BF16, shape(1, 0, 8, 64), "empty"),
            (DType::BF16, shape(0, 8, 8, 64), "empty"),
            (DType::BF16, shape(1, 8, 8, 0), "multiple of 8"),
            (DType::BF16, shape(1, ATTN_MAX_ROWS + 1, 8, 64), "too large"),
            (DType::BF16, shape(1, 8, ATTN_MAX_ROWS + 1, 64), "too large"),
            (DType::BF16, shape(1 << 31, 8, 8, 64), "too large"),
            (DType::BF16, shape(usize::MAX, 8, 8, 64), "too large"),
        ] {
            let msg = attn_kernel_refuses(dt, &sh).unwrap_or_default();
            assert!(msg.contains(why), "{dt} {sh:?}: {msg:?}");
        }
    }
}
