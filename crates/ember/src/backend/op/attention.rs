//! Fused attention's geometry (`BackendStorage::attention`).

use super::{map_view, View};
use crate::dtype::DType;
use crate::error::Result;
use crate::layout::Layout;

/// One fused attention call: `softmax(q kᵀ · scale) v` for each of `batch · heads`
/// query rows `[l, d]` against keys and values `[s, d]`; with `causal`, query `i`
/// sees keys `0..=i` (the mask's top-left triangle). With `dropout` (in `[0, 1)`)
/// each weight is dropped after the softmax, by a mask that is a function of
/// `seed` and the weight's place ([`AttnShape::kept`]), so that the backward (and
/// every device) draws the same one.
/// Fused attention's operands on one device's storage `S` (see
/// [`BackendStorage::attention`](crate::backend::primitives::BackendStorage::attention)):
/// the queries, keys and values, each a rank-4 view `[batch, heads, rows, d]`,
/// and the optional additive bias `[batch, heads, l, s]`.
pub(crate) struct AttnOperands<'a, S> {
    pub q: View<'a, S>,
    pub k: View<'a, S>,
    pub v: View<'a, S>,
    pub bias: Option<View<'a, S>>,
}

/// What attention's backward reads besides its operands: the forward's output
/// (where [`AttnShape::out_place`] puts it), its log-sum-exps (contiguous) and
/// the output's gradient (a view like the queries').
pub(crate) struct AttnSaved<'a, S> {
    pub out: &'a S,
    pub lse: &'a S,
    pub g: View<'a, S>,
}

impl<'a, S> AttnOperands<'a, S> {
    /// Queries, keys, values and bias, as a tuple to take apart.
    pub fn parts(self) -> (View<'a, S>, View<'a, S>, View<'a, S>, Option<View<'a, S>>) {
        (self.q, self.k, self.v, self.bias)
    }

    /// The same views of `f`'s storages, taken in order (queries, keys, values,
    /// bias); the first error of `f` (an operand on another device) is returned.
    pub fn try_map<T: 'a>(
        self,
        mut f: impl FnMut(&'a S) -> Result<&'a T>,
    ) -> Result<AttnOperands<'a, T>> {
        Ok(AttnOperands {
            q: (f(self.q.0)?, self.q.1),
            k: (f(self.k.0)?, self.k.1),
            v: (f(self.v.0)?, self.v.1),
            bias: map_view(self.bias, &mut f)?,
        })
    }
}

impl<'a, S> AttnSaved<'a, S> {
    /// Output, log-sum-exps and gradient, as a tuple to take apart.
    pub fn parts(self) -> (&'a S, &'a S, View<'a, S>) {
        (self.out, self.lse, self.g)
    }

    /// As [`AttnOperands::try_map`]: output, log-sum-exps, gradient.
    pub fn try_map<T: 'a>(
        self,
        mut f: impl FnMut(&'a S) -> Result<&'a T>,
    ) -> Result<AttnSaved<'a, T>> {
        Ok(AttnSaved {
            out: f(self.out)?,
            lse: f(self.lse)?,
            g: (f(self.g.0)?, self.g.1),
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct AttnShape {
    pub batch: usize,
    pub heads: usize,
    pub l: usize,
    pub s: usize,
    pub d: usize,
    pub scale: f64,
    pub causal: bool,
    pub dropout: f64,
    pub seed: u64,
    /// Where the backward puts the gradients.
    pub packed: AttnPacking,
}

/// Where attention's backward puts the gradients of q, k and v
/// ([`AttnShape::grad_places`]): in buffers of their own, or where packed
/// projections made the operands, in one buffer laid out as the projection
/// (PyTorch's `MultiheadAttention` packs all three for self-attention, the keys
/// and values where they are one input).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum AttnPacking {
    Apart,
    /// All three in one buffer of `3 · batch · heads · l · d` elements, a
    /// `[batch, l, 3, heads, d]` tensor with these element strides of its first
    /// four dims (its last contiguous; needs `l == s`).
    Qkv([usize; 4]),
    /// dq apart; dk and dv in one buffer of `2 · batch · heads · s · d`
    /// elements, a `[batch, s, 2, heads, d]` tensor with these strides.
    Kv([usize; 4]),
}

/// Where one of attention's results lies in its buffer: a `[batch, heads, rows,
/// d]` view from `offset` with element strides (batch, head, row), the last dim
/// contiguous.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct AttnPlace {
    pub offset: usize,
    pub strides: [usize; 3],
}

impl AttnPlace {
    /// The view's layout, for `[batch, heads, rows, d]`.
    pub fn layout(&self, shape: [usize; 4]) -> Layout {
        let [b, h, r] = self.strides;
        Layout::strided(&shape, &[b, h, r, 1], self.offset)
    }
}

/// What [`BackendStorage::attention_backward`](crate::backend::primitives::BackendStorage::attention_backward)
/// returns: the gradients' buffers as [`AttnShape::packed`] asks (dq, dk, dv;
/// the one of all three; dq and the one of dk and dv).
pub(crate) enum AttnGrads<S> {
    Apart([S; 3]),
    Qkv(S),
    Kv(S, S),
}

impl<S> AttnGrads<S> {
    /// The buffers `sh.packed` asks for, each made by `make` from its length,
    /// in the order every backend allocates them (the estimate follows it).
    pub fn alloc(sh: &AttnShape, mut make: impl FnMut(usize) -> Result<S>) -> Result<AttnGrads<S>> {
        let n = sh.batch * sh.heads;
        let (ql, kv) = (n * sh.l * sh.d, n * sh.s * sh.d);
        Ok(match sh.packed {
            AttnPacking::Apart => AttnGrads::Apart([make(ql)?, make(kv)?, make(kv)?]),
            AttnPacking::Qkv(_) => AttnGrads::Qkv(make(3 * ql)?),
            AttnPacking::Kv(_) => {
                let dq = make(ql)?;
                AttnGrads::Kv(dq, make(2 * kv)?)
            }
        })
    }

    /// `f` of the buffer that holds each of dq, dk and dv (called once a
    /// buffer, so that a mutable borrow of one is not taken twice).
    pub fn per_grad<R: Copy>(&mut self, mut f: impl FnMut(&mut S) -> R) -> [R; 3] {
        match self {
            AttnGrads::Apart([q, k, v]) => [f(q), f(k), f(v)],
            AttnGrads::Qkv(g) => [f(g); 3],
            AttnGrads::Kv(q, kv) => {
                let q = f(q);
                let kv = f(kv);
                [q, kv, kv]
            }
        }
    }

    pub fn map<T>(self, mut f: impl FnMut(S) -> T) -> AttnGrads<T> {
        match self {
            AttnGrads::Apart(g) => AttnGrads::Apart(g.map(f)),
            AttnGrads::Qkv(g) => AttnGrads::Qkv(f(g)),
            AttnGrads::Kv(q, kv) => {
                let q = f(q);
                AttnGrads::Kv(q, f(kv))
            }
        }
    }
}

/// splitmix64's finaliser (`attn_mix` in kernels/attention.cu).
fn mix(mut z: u64) -> u64 {
    z ^= z >> 30;
    z = z.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z ^= z >> 27;
    z = z.wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl AttnShape {
    /// Where the output lies in its buffer (of `batch · heads · l · d`
    /// elements): with the heads inside the rows (`[batch, l, heads, d]` in
    /// memory, as PyTorch's fused kernels write it), so that the heads joined
    /// back into `[batch, l, heads · d]` are a view.
    pub fn out_place(&self) -> AttnPlace {
        let hd = self.heads * self.d;
        AttnPlace {
            offset: 0,
            strides: [self.l * hd, self.d, hd],
        }
    }

    /// Where the gradients of q, k and v lie in their buffers: apart, each
    /// like the output (heads inside the rows, a buffer of `batch · heads ·
    /// rows · d` each); packed ([`AttnPacking`]), as parts of their buffer
    /// with its strides.
    pub fn grad_places(&self) -> [AttnPlace; 3] {
        let hd = self.heads * self.d;
        let part = |[batch, row, part, head]: [usize; 4], i: usize| AttnPlace {
            offset: i * part,
            strides: [batch, head, row],
        };
        let kv = AttnPlace {
            offset: 0,
            strides: [self.s * hd, self.d, hd],
        };
        match self.packed {
            AttnPacking::Apart => [self.out_place(), kv, kv],
            AttnPacking::Qkv(st) => [0, 1, 2].map(|i| part(st, i)),
            AttnPacking::Kv(st) => [self.out_place(), part(st, 0), part(st, 1)],
        }
    }

    /// Whether query `i` sees key `j`.
    pub fn visible(&self, i: usize, j: usize) -> bool {
        !(self.causal && j > i)
    }

    /// The dropout's threshold (a weight whose 24-bit draw is below it is
    /// dropped; 0 without dropout) and the kept weights' factor `1 / (1 - p')`,
    /// `p'` the probability the threshold gives (within 2⁻²⁴ of `dropout`).
    pub fn drop_threshold(&self) -> (u32, f64) {
        let t = (self.dropout * (1u64 << 24) as f64)
            .round()
            .clamp(0.0, ((1u64 << 24) - 1) as f64) as u32;
        (t, 1.0 / (1.0 - t as f64 / (1u64 << 24) as f64))
    }

    /// The hash of pair `bh` (batch · heads + head) that [`kept`](Self::kept)
    /// starts from.
    pub fn pair_hash(&self, bh: usize) -> u64 {
        mix(self.seed ^ bh as u64)
    }

    /// Whether weight (query `i`, key `j`) of the pair whose
    /// [`pair_hash`](Self::pair_hash) is `pair` is kept by the dropout.
    pub fn kept(&self, pair: u64, threshold: u32, i: usize, j: usize) -> bool {
        threshold == 0 || (mix(pair ^ (((i as u64) << 32) | j as u64)) >> 40) as u32 >= threshold
    }
}

/// The largest head dim the fused CUDA kernels take (f16/bf16 and float32).
pub(crate) const ATTN_MAX_HEAD_DIM: usize = 128;

/// Rows (queries or keys) a fused CUDA launch covers at most: 64 per block along
/// the grid's y dim (at most 65535 blocks).
pub(crate) const ATTN_MAX_ROWS: usize = 64 * 65535;

/// Whether ember's fused CUDA attention kernels take operands of `dtype` for
/// `shape` (f16/bf16/f32; a head dim that is a multiple of 8 up to
/// [`ATTN_MAX_HEAD_DIM`]; no empty operand; `batch · heads` below 2³¹ blocks and
/// lengths up to [`ATTN_MAX_ROWS`]); the GPU's compute capability (8.0 or later)
/// is the caller's to check. `None` when they do, else why not.
pub(crate) fn attn_kernel_refuses(dtype: DType, sh: &AttnShape) -> Option<String> {
    let n = sh.batch.checked_mul(sh.heads);
    if !matches!(dtype, DType::F16 | DType::BF16 | DType::F32)
        || sh.d == 0
        || !sh.d.is_multiple_of(8)
        || sh.d > ATTN_MAX_HEAD_DIM
    {
        Some(format!(
            "the fused kernels take f16/bf16/float32 with a head dim that is a multiple \
             of 8 up to {ATTN_MAX_HEAD_DIM} (got {dtype}, {})",
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

/// Why the fused CUDA kernels do not run on a GPU of compute capability `arch`
/// (`major * 10 + minor`; the products are sm_80's `mma.sync`), `None` where
/// they do.
pub(crate) fn attn_arch_refuses(arch: u32) -> Option<String> {
    (arch < 80).then(|| {
        format!(
            "the fused kernels need compute capability 8.0 or later (the GPU is {}.{})",
            arch / 10,
            arch % 10
        )
    })
}

/// Why the attention primitives refuse an additive bias (layout `l`, dtype
/// `bias`) for operands of `dtype` and `sh`, `None` where they take it: a rank-4
/// view of `[batch, heads, l, s]` (any strides) in the operands' dtype.
pub(crate) fn attn_bias_refuses(
    l: &Layout,
    bias: DType,
    dtype: DType,
    sh: &AttnShape,
) -> Option<String> {
    let want = [sh.batch, sh.heads, sh.l, sh.s];
    (bias != dtype || l.shape() != want).then(|| {
        format!(
            "the bias must be a {want:?} view in the operands' dtype {dtype} (got {bias} of {:?})",
            l.shape()
        )
    })
}

/// Why the primitives refuse `sh.packed`, `None` where they take it (or it is
/// `Apart`): the strides must be those of a dense `[batch, l, 3, heads, d]`
/// tensor with `l == s` (`Qkv`), or `[batch, s, 2, heads, d]` (`Kv`), so that
/// each row and part has a place of its own within the buffer's elements, each
/// stride a multiple of `align` elements (the CUDA kernels' 16-byte stores).
pub(crate) fn attn_packed_refuses(sh: &AttnShape, align: usize) -> Option<String> {
    let (st, rows, parts) = match sh.packed {
        AttnPacking::Apart => return None,
        AttnPacking::Qkv(st) => (st, sh.l, 3),
        AttnPacking::Kv(st) => (st, sh.s, 2),
    };
    let dims = [sh.batch, rows, parts, sh.heads, sh.d];
    let l = Layout::strided(&dims, &[st[0], st[1], st[2], st[3], 1], 0);
    let aligned = (0..4).all(|i| dims[i] == 1 || st[i].is_multiple_of(align.max(1)));
    let lengths = parts == 2 || sh.l == sh.s;
    (!lengths || !l.is_non_overlapping_and_dense() || !aligned).then(|| {
        format!(
            "packed gradients need the strides of a dense {dims:?} tensor in whole {align} \
             elements, and as many queries as keys where q is packed too (got {} queries, {} \
             keys, strides {st:?})",
            sh.l, sh.s
        )
    })
}

/// Whether a `[batch, heads, rows, d]` view can be read by the CUDA kernels in
/// place for elements of `dtype`: the last dim contiguous, and the offset and the
/// other strides whole 16 bytes (the kernels' loads; a dim of size 1 has no
/// stride that counts). The CPU reads any view whose last dim is contiguous, and
/// takes these too.
pub(crate) fn attn_view_fits(l: &Layout, dtype: DType) -> bool {
    let (st, sh) = (l.strides(), l.shape());
    let n = (16 / dtype.size_in_bytes()).max(1);
    l.rank() == 4
        && (st[3] == 1 || sh[3] == 1)
        && l.offset().is_multiple_of(n)
        && (0..3).all(|i| sh[i] == 1 || st[i].is_multiple_of(n))
}

/// Whether f16/bf16 attention on a GPU goes to cuDNN's fused engines where it
/// loads (else ember's own kernels). Off by default until measured against
/// ember's kernels on a GPU; `EMBER_CUDNN_ATTENTION=1` switches it on. Here and
/// not in the CUDA backend because the meta device models the path it selects.
static LIBRARY_ATTENTION: super::conv::EnvSwitch =
    super::conv::EnvSwitch::new("EMBER_CUDNN_ATTENTION", false);

pub(crate) fn set_library_attention(on: bool) {
    LIBRARY_ATTENTION.set(on)
}

pub(crate) fn library_attention() -> bool {
    LIBRARY_ATTENTION.get()
}

/// The operands of one attention call as the library path checks them: each
/// operand's (batch, head, row) strides and element offset, in the order q, k,
/// v, then (the backward's) the output's gradient.
pub(crate) struct AttnViews {
    pub views: Vec<([usize; 3], usize)>,
}

impl AttnViews {
    pub fn of(layouts: &[&Layout]) -> AttnViews {
        AttnViews {
            views: layouts
                .iter()
                .map(|l| {
                    let s = l.strides();
                    ([s[0], s[1], s[2]], l.offset())
                })
                .collect(),
        }
    }
}

/// Why a GPU's attention call does not go to cuDNN (ember's kernels run), or
/// `None` when it does: the switch ([`library_attention`]) is on and
/// deterministic algorithms are not asked for; f16 or bf16;
/// no bias and no dropout; a head dim that is a multiple of 8 up to 128; every
/// operand's and gradient's strides and start in whole 16 bytes (the buffers
/// themselves are 256-byte aligned). The meta device asks the same.
pub(crate) fn attn_library_refuses(
    dtype: DType,
    sh: &AttnShape,
    x: &AttnViews,
    bias: bool,
) -> Option<String> {
    if !library_attention() {
        return Some("cuDNN attention is switched off (ember::cuda::cudnn::set_attention)".into());
    }
    if super::conv::library_deterministic() {
        return Some(
            "deterministic algorithms are asked for (cudnn::set_deterministic): cuDNN's \
             attention backward adds with atomics"
                .into(),
        );
    }
    let lanes = 8;
    let places = [sh.out_place()]
        .into_iter()
        .chain(sh.grad_places())
        .map(|p| (p.strides, p.offset));
    let aligned = x
        .views
        .iter()
        .copied()
        .chain(places)
        .all(|(st, off)| off % lanes == 0 && st.iter().all(|s| s % lanes == 0));
    if !matches!(dtype, DType::F16 | DType::BF16) {
        Some(format!(
            "cuDNN's fused attention takes f16 or bf16 (got {dtype})"
        ))
    } else if bias || sh.dropout > 0.0 {
        Some("ember sends no bias or dropout to cuDNN's attention".into())
    } else if sh.d == 0 || !sh.d.is_multiple_of(8) || sh.d > 128 {
        Some(format!(
            "cuDNN's fused attention takes a head dim that is a multiple of 8 up to 128 (got {})",
            sh.d
        ))
    } else if sh.batch * sh.heads == 0 || sh.l == 0 || sh.s == 0 {
        Some("cuDNN's fused attention takes no empty operand".into())
    } else if !aligned {
        Some("cuDNN's fused attention takes strides and starts in whole 16 bytes".into())
    } else {
        None
    }
}

/// Rounds `bytes` up to whole 256-byte blocks.
fn blocks(bytes: usize) -> usize {
    bytes.div_ceil(256) * 256
}

/// The workspace (bytes) of a cuDNN attention call, allocated after its results
/// and freed once it is queued. Forward: as many bytes as the log-sum-exps (the
/// plan's; its engines ask for a few hundred). Backward: the parts of
/// [`attn_library_parts`], then as many bytes again as dq's accumulator for the
/// plan. A plan that needs more than its part is not used.
pub(crate) fn attn_library_workspace(sh: &AttnShape, backward: bool) -> usize {
    let rows = sh.batch * sh.heads * sh.l;
    if backward {
        let parts = attn_library_parts(sh);
        parts.total() + parts.acc
    } else {
        blocks(rows * 4)
    }
}

/// The backward's workspace before the plan's part (bytes, each whole 256-byte
/// blocks, in this order).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct AttnLibraryParts {
    /// each row's `Σ dout · out` (float32)
    pub dot: usize,
    /// dq accumulated in float32
    pub acc: usize,
    /// where the key count is not a multiple of 128: the query and key counts,
    /// one int32 of each a batch (the keys' from the next 16 bytes), for the
    /// padding mask cuDNN's backward engines
    /// need then (up to cuDNN 9.15, as cuDNN's frontend adds it:
    /// `SdpaGeom::padding_mask` in backend/cuda/dnn/sdpa/graphs.rs); kept whatever the
    /// version, so that the meta device's estimate does not depend on it
    pub lens: usize,
}

impl AttnLibraryParts {
    /// All three parts' bytes.
    pub fn total(&self) -> usize {
        self.dot + self.acc + self.lens
    }

    /// Where in the `lens` part the keys' lengths start (the queries' at 0),
    /// and the bytes both take, for `batch` sequences: one int32 each, the
    /// keys' from the next 16 bytes.
    pub fn lens_layout(batch: usize) -> (usize, usize) {
        let keys = 4 * batch.next_multiple_of(4);
        (keys, keys + 4 * batch)
    }
}

/// The parts of a cuDNN attention backward's workspace for `sh`.
pub(crate) fn attn_library_parts(sh: &AttnShape) -> AttnLibraryParts {
    let rows = sh.batch * sh.heads * sh.l;
    AttnLibraryParts {
        dot: blocks(rows * 4),
        acc: blocks(rows * sh.d * 4),
        lens: if sh.s.is_multiple_of(128) {
            0
        } else {
            blocks(AttnLibraryParts::lens_layout(sh.batch).1)
        },
    }
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
            dropout: 0.0,
            seed: 0,
            packed: AttnPacking::Apart,
        }
    }

    /// The dropout keeps a fraction 1 - p of the weights, the same ones for a
    /// seed, other ones for another seed.
    #[test]
    fn dropout_keeps_one_minus_p_of_the_weights() {
        let mut sh = shape(1, 100, 100, 8);
        sh.dropout = 0.25;
        let (t, scale) = sh.drop_threshold();
        assert!((scale - 4.0 / 3.0).abs() < 1e-6);
        let count = |seed: u64| -> Vec<bool> {
            let s = AttnShape { seed, ..sh };
            let pair = s.pair_hash(3);
            (0..100 * 100)
                .map(|n| s.kept(pair, t, n / 100, n % 100))
                .collect()
        };
        let (a, b) = (count(7), count(8));
        let kept = a.iter().filter(|&&k| k).count() as f64 / 1e4;
        assert!((kept - 0.75).abs() < 0.02, "kept {kept}");
        assert_eq!(a, count(7));
        let same = a.iter().zip(&b).filter(|(x, y)| x == y).count() as f64 / 1e4;
        assert!(same < 0.7, "two seeds agree on {same} of the weights");
        sh.dropout = 0.0;
        assert_eq!(sh.drop_threshold(), (0, 1.0));
    }

    /// The CUDA kernels' limits: dtypes, head dims, empty operands, and sizes the
    /// grid cannot cover are refused with a reason (the tensor layer then takes
    /// another path), the largest sizes they cover are taken.
    #[test]
    fn the_kernels_refuse_what_they_cannot_run() {
        assert!(attn_kernel_refuses(DType::BF16, &shape(2, 70, 33, 64)).is_none());
        assert!(attn_kernel_refuses(DType::F16, &shape(1, ATTN_MAX_ROWS, 1, 128)).is_none());
        assert!(attn_kernel_refuses(DType::F32, &shape(2, 70, 33, 64)).is_none());
        assert!(attn_kernel_refuses(DType::F32, &shape(2, 70, 33, 128)).is_none());
        assert!(attn_kernel_refuses(DType::F16, &shape((1 << 31) - 1, 1, 1, 8)).is_none());
        for (dt, sh, why) in [
            (DType::F64, shape(1, 8, 8, 64), "f16/bf16"),
            (DType::F32, shape(1, 8, 8, 136), "multiple of 8 up to 128"),
            (DType::F32, shape(1, 8, 8, 100), "multiple of 8"),
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

    /// Packed gradients are taken for a dense `[batch, l, 3, heads, d]` layout
    /// (row-major, or a sequence-first projection's transposed one) with as
    /// many queries as keys, in whole `align` elements; overlapping or sparse
    /// strides, unequal lengths and misaligned strides are refused.
    #[test]
    fn packed_gradients_need_a_dense_layout() {
        // batch 2, length 5, 3 parts, 4 heads, d 8
        let mut sh = shape(2, 5, 5, 8);
        sh.heads = 4;
        let row_major = [5 * 96, 96, 32, 8];
        let seq_first = [96, 2 * 96, 32, 8];
        for st in [row_major, seq_first] {
            sh.packed = AttnPacking::Qkv(st);
            assert_eq!(attn_packed_refuses(&sh, 8), None, "{st:?}");
        }
        sh.packed = AttnPacking::Apart;
        assert_eq!(attn_packed_refuses(&sh, 8), None);
        for (st, l, align) in [
            ([5 * 96, 96, 32, 4], 5, 1),   // heads overlap
            ([5 * 192, 192, 64, 8], 5, 1), // gaps between rows
            (row_major, 4, 1),             // fewer queries than keys
        ] {
            let sh = AttnShape {
                l,
                packed: AttnPacking::Qkv(st),
                ..sh
            };
            let why = attn_packed_refuses(&sh, align).unwrap_or_default();
            assert!(why.contains("dense"), "{st:?}: {why:?}");
        }
        // dense at head dim 6, but not in whole 16 bytes of a 16-bit dtype
        let sh6 = AttnShape {
            d: 6,
            packed: AttnPacking::Qkv([5 * 72, 72, 24, 6]),
            ..sh
        };
        assert_eq!(attn_packed_refuses(&sh6, 1), None);
        assert!(attn_packed_refuses(&sh6, 8).is_some_and(|w| w.contains("whole 8")));
        // keys and values packed: [2, 3 keys, 2, 4, 8], fewer keys than queries
        let kv = AttnShape {
            s: 3,
            packed: AttnPacking::Kv([3 * 64, 64, 32, 8]),
            ..sh
        };
        assert_eq!(attn_packed_refuses(&kv, 8), None);
        let overlapping = AttnShape {
            packed: AttnPacking::Kv([3 * 64, 32, 32, 8]),
            ..kv
        };
        assert!(attn_packed_refuses(&overlapping, 1).is_some_and(|w| w.contains("dense")));
    }
}
