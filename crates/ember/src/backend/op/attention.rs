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

/// Whether ember's fused CUDA attention kernels take operands of `dtype` with head
/// dim `d` (f16/bf16, `d` a multiple of 8 up to [`ATTN_MAX_HEAD_DIM`]; a GPU of
/// compute capability 8.0 or later, which the caller checks).
pub(crate) fn attn_kernel_takes(dtype: DType, d: usize) -> bool {
    matches!(dtype, DType::F16 | DType::BF16)
        && d > 0
        && d.is_multiple_of(8)
        && d <= ATTN_MAX_HEAD_DIM
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
