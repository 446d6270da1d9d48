//! The op vocabulary: what each primitive computes, said once for every device.
//!
//! Device-neutral structs and enums with the CPU's scalar definition of each op
//! (`UnaryOp::f`, `BinaryOp::i`, ...), the operation codes the CUDA kernels switch
//! on (their `#define`s are generated from the tables here into the kernel source
//! when it is compiled, see [`kernel_defines`]), the geometry of convolutions and
//! pooling, and the constants of fused optimizer steps. Both backends and the
//! tensor layer import from here; nothing here imports a backend.

/// Declares an operation-code enum and the table of its kernel names:
/// `Name = value => "KERNEL_NAME"`, with `prefix` before each kernel name.
macro_rules! codes {
    ($(#[$m:meta])* $vis:vis enum $name:ident prefix $prefix:literal {
        $($variant:ident = $value:literal => $cname:literal,)*
    }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(i32)]
        $vis enum $name {
            $($variant = $value,)*
        }

        impl $name {
            /// Every code with its name in the kernels.
            pub(crate) const DEFINES: &'static [(&'static str, i32)] =
                &[$((concat!($prefix, $cname), $value),)*];

            /// The code's name in the kernels, without the prefix (`GELU_TANH`).
            #[allow(dead_code)]
            pub(crate) fn name(self) -> &'static str {
                match self {
                    $(Self::$variant => $cname,)*
                }
            }
        }
    };
}

mod attention;
pub(crate) mod collective;
pub(crate) mod conv;
mod elementwise;
mod index;
mod norm;
mod optim;
mod reduce;
mod special;

pub(crate) use attention::{
    attn_arch_refuses, attn_bias_refuses, attn_kernel_refuses, attn_library_parts,
    attn_library_refuses, attn_library_workspace, attn_packed_refuses, attn_view_fits,
    library_attention, set_library_attention, AttnGrads, AttnLibraryParts, AttnOperands,
    AttnPacking, AttnPlace, AttnSaved, AttnShape, AttnViews,
};
pub(crate) use conv::{ConvShape, Pool, PoolShape, Window};
pub(crate) use elementwise::*;
pub(crate) use index::wrap_indices;
pub(crate) use norm::{
    norm_affine_chunks, BnGradIn, BnParams, BnRunning, NormAffine, NormSaved, RowNorm,
};
pub(crate) use optim::{foreach_chunks, AdamStep, SgdStep, FOREACH_CHUNK, FOREACH_LIST};
pub(crate) use reduce::{
    scan_chunks, scan_shape, CeOpts, ReduceCode, ReduceOp, ReduceRoute, ScanOp, ARGSORT_COUNT_MAX,
};

use crate::dtype::DType;

/// A view of storage `S`: the storage and the layout of the elements an op reads.
pub(crate) type View<'a, S> = (&'a S, &'a crate::layout::Layout);

/// An optional view with its storage through `f` (an operand's storage on one
/// device, or the error of an operand elsewhere), for the operand structs'
/// `try_map`.
pub(crate) fn map_view<'a, S, T>(
    v: Option<View<'a, S>>,
    f: &mut impl FnMut(&'a S) -> crate::error::Result<&'a T>,
) -> crate::error::Result<Option<View<'a, T>>> {
    v.map(|(s, l)| Ok((f(s)?, l))).transpose()
}

/// A view seen as rows along its last dim, as the row primitives (softmax, the
/// norms, cross-entropy) see it: `(rows, cols)`; a rank-0 view is one row of one
/// element, and a view with an empty last dim has no rows.
pub(crate) fn row_split(l: &crate::layout::Layout) -> (usize, usize) {
    let cols = l.shape().last().copied().unwrap_or(1);
    (l.numel().checked_div(cols).unwrap_or(0), cols)
}

/// The dtype batch normalisation's per-channel statistics and coefficients are
/// kept in for inputs of `dtype`: float64 for float64, float32 for the other float
/// dtypes (PyTorch keeps half-precision batches' statistics in float32 too).
pub(crate) fn stat_dtype(dtype: DType) -> DType {
    if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// A contiguous shape seen as batch normalisation sees it: `[n, c, s]`, dim 1 the
/// channels and `s` the product of the dims after it (1 for `[n, c]`).
pub(crate) fn channel_shape(shape: &[usize]) -> (usize, usize, usize) {
    let n = shape.first().copied().unwrap_or(1);
    let c = shape.get(1).copied().unwrap_or(1);
    (n, c, shape.iter().skip(2).product())
}

/// The length of each of the chunks `total` elements (or rows) are cut into
/// for about `want` chunks: within `[min, max]`, and more than `max` only where
/// a grid's 65535 chunks would not cover `total`. Batch norm's per-channel sums
/// cut their work until a grid has [`busy_blocks`](reduce::busy_blocks) blocks
/// (each of their threads has few loads in flight: a grid of fewer blocks than
/// multiprocessors waited on memory's latency).
fn chunk_len(total: usize, want: usize, (min, max): (usize, usize)) -> usize {
    total
        .div_ceil(want.max(1))
        .clamp(min, max)
        .max(total.div_ceil(65535))
}

/// The most rows one block of the column-wise per-channel sums takes (see
/// [`channel_columns`]), unless the rows need more chunks than a grid holds.
const COLUMN_ROWS: usize = 1024;

/// The fewest rows a block of the column-wise sums takes while more blocks are
/// wanted: 8 rows a thread of its 8 row lanes.
const MIN_COLUMN_ROWS: usize = 64;

/// How a GPU of `sm_count` multiprocessors sums batch norm's per-channel
/// statistics over `[n, c, s]` elements whose planes are single elements
/// (`s == 1`: a channels-last `[n, h, w, c]` seen as `[n·h·w, c, 1]`, or a
/// `[n, c]` batch): `Some((rows, chunks))` when it sums columns in chunks of
/// `rows` rows, in blocks of 32 channels by a chunk, each chunk's partial sums
/// in a float64 workspace of `2 · chunks · c` elements (which the meta device
/// counts too); `None` where it walks each channel's planes in one block.
/// Chunks are `COLUMN_ROWS` rows, or fewer (down to `MIN_COLUMN_ROWS`) where
/// that leaves a grid short of [`busy_blocks`](reduce::busy_blocks).
pub(crate) fn channel_columns(
    (n, c, s): (usize, usize, usize),
    sm_count: usize,
) -> Option<(usize, usize)> {
    (s == 1 && n > 0 && c > 0).then(|| {
        // blocks of 32 channels by a chunk of rows
        let want = reduce::busy_blocks(sm_count).div_ceil(c.div_ceil(32));
        let rows = chunk_len(n, want, (MIN_COLUMN_ROWS, COLUMN_ROWS));
        (rows, n.div_ceil(rows))
    })
}

/// The most elements of a channel one block of the plane-wise per-channel sums
/// takes before a channel is cut into chunks (see [`channel_chunks`]), unless
/// it needs more chunks than a grid holds.
const PLANE_CHUNK: usize = 16384;

/// The fewest elements a chunk of a channel holds where chunks are cut for more
/// blocks: 16 a thread of a block.
const MIN_PLANE_CHUNK: usize = 4096;

/// How a GPU of `sm_count` multiprocessors sums batch norm's per-channel
/// statistics over `[n, c, s]` elements whose planes hold `s > 1` elements:
/// `Some((per, chunks))` when each channel's `n · s` elements are cut into
/// `chunks` chunks of `per` (a block each), whose partial sums take a float64
/// workspace of `2 · chunks · c` elements (which the meta device counts too);
/// `None` where one block sums a whole channel, or the planes are single
/// elements ([`channel_columns`]). Chunks are `PLANE_CHUNK` elements, or fewer
/// (down to `MIN_PLANE_CHUNK`) where `c` blocks would leave a grid short of
/// [`busy_blocks`](reduce::busy_blocks).
pub(crate) fn channel_chunks(
    (n, c, s): (usize, usize, usize),
    sm_count: usize,
) -> Option<(usize, usize)> {
    let total = n * s;
    let want = reduce::busy_blocks(sm_count).div_ceil(c.max(1));
    let per = chunk_len(total, want, (MIN_PLANE_CHUNK, PLANE_CHUNK));
    (s > 1 && c > 0 && total > per).then(|| (per, total.div_ceil(per)))
}

/// Every operation code the kernels use, as `#define NAME VALUE` lines: the
/// kernels' source gets these in front, so the codes cannot drift from Rust's.
pub(crate) fn kernel_defines() -> String {
    [
        UnaryCode::DEFINES,
        BinaryCode::DEFINES,
        CmpOp::DEFINES,
        ReduceCode::DEFINES,
        ScanOp::DEFINES,
    ]
    .concat()
    .iter()
    .map(|(name, value)| format!("#define {name} {value}\n"))
    .collect()
}

/// A Python-style number operand: its kind (bool, int, float) drives type promotion
/// the way a Python scalar does in PyTorch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    Bool(bool),
    Int(i64),
    Float(f64),
}

impl Scalar {
    /// The value as a kernel parameter pair: (as f64, as i64).
    pub(crate) fn by_value(self) -> (f64, i64) {
        match self {
            Scalar::Bool(b) => (b as u8 as f64, b as i64),
            Scalar::Int(i) => (i as f64, i),
            Scalar::Float(f) => (f, f as i64),
        }
    }

    /// The value as an f64 (`true` is 1).
    pub fn to_f64(self) -> f64 {
        match self {
            Scalar::Bool(b) => b as u8 as f64,
            Scalar::Int(i) => i as f64,
            Scalar::Float(f) => f,
        }
    }

    /// The dtype PyTorch gives the scalar on its own: bool, int64 or float32.
    pub(crate) fn dtype(self) -> DType {
        match self {
            Scalar::Bool(_) => DType::Bool,
            Scalar::Int(_) => DType::I64,
            Scalar::Float(_) => DType::F32,
        }
    }

    /// The value converted to `T` as a cast to `T`'s dtype converts it (integers
    /// exactly, also past 2^53).
    #[inline]
    pub(crate) fn to<T: crate::dtype::WithDType>(self) -> T {
        match self {
            Scalar::Int(i) if T::DTYPE == DType::I64 => {
                // SAFETY: T is i64 when its DTYPE is I64.
                unsafe { std::mem::transmute_copy::<i64, T>(&i) }
            }
            other => T::from_f64(other.to_f64()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `chunks` chunks of `len` cover `total` with no empty last chunk.
    fn assert_covers(len: usize, chunks: usize, total: usize) {
        assert!(len * chunks >= total, "{len} x {chunks} < {total}");
        assert!(
            len * (chunks - 1) < total,
            "{len} x {chunks}: an empty last chunk"
        );
    }

    /// Batch norm's chunks of planes (an H200's 132 multiprocessors): none for
    /// single-element planes (the column path's), for channels of at most 4 Ki
    /// elements, or where a block a channel already makes 4 blocks a
    /// multiprocessor and a channel holds at most 16 Ki elements; otherwise at
    /// least two, covering the channel, at most a grid's 65535, of 4 to 16 Ki
    /// elements until a channel needs more than 65535 of them (a GPU's sums
    /// read every element once whatever the size: the simulator cannot reach
    /// these).
    #[test]
    fn channel_chunks_cover_a_channel_within_a_grid() {
        let chunks = |shape| channel_chunks(shape, 132);
        assert_eq!(chunks((64, 256, 1)), None);
        assert_eq!(chunks((64, 2048, 49)), None);
        assert_eq!(chunks((0, 8, 4096)), None);
        assert_eq!(chunks((4, 0, 8192)), None);
        // 8 channels: 66 blocks each would keep 528 busy; 4096 a block at least
        assert_eq!(chunks((4, 8, 4096)), Some((4096, 4)));
        assert_eq!(chunks((1, 8, 4096)), None);
        // ResNet-50 at batch 64: 112 x 112, 56 x 56 and 14 x 14 planes (the
        // last, 256 channels, in 3 chunks: 768 blocks, not 256)
        assert_eq!(chunks((64, 64, 112 * 112)), Some((16384, 49)));
        assert_eq!(chunks((64, 256, 56 * 56)), Some((16384, 13)));
        assert_eq!(chunks((64, 256, 14 * 14)), Some((4182, 3)));
        // a multiprocessor of the simulator's 4 takes 16 blocks
        assert_eq!(channel_chunks((8, 3, 2500), 4), Some((4096, 5)));
        for (n, s) in [
            (5, 4096),
            (1, 16385),
            (1000, 1 << 20),
            (3, 1 << 31),
            (1 << 20, 1 << 20),
        ] {
            let (per, chunks) = chunks((n, 3, s)).expect("chunks");
            let total = n * s;
            assert!((2..=65535).contains(&chunks), "{n} x {s}: {chunks} chunks");
            assert!(per >= 4096, "{n} x {s}: {per} x {chunks}");
            assert_covers(per, chunks, total);
        }
    }

    /// Batch norm's chunks of rows for single-element planes (132
    /// multiprocessors): 1024 rows, or fewer (64 at least) until the blocks of
    /// 32 channels by a chunk are 4 a multiprocessor, and more than 1024 only
    /// where 65535 chunks would not cover the rows.
    #[test]
    fn channel_columns_keep_every_multiprocessor_busy() {
        let columns = |shape| channel_columns(shape, 132);
        assert_eq!(columns((64, 8, 49)), None);
        assert_eq!(columns((0, 8, 1)), None);
        assert_eq!(columns((8, 0, 1)), None);
        // ResNet-50 channels-last at batch 64: 64 channels at 112 x 112 (2
        // tiles of channels) keep 1024 rows; 256 at 14 x 14 and 512 at 7 x 7
        // took 104 and 64 blocks, now 528
        assert_eq!(columns((64 * 112 * 112, 64, 1)), Some((1024, 784)));
        assert_eq!(columns((64 * 14 * 14, 256, 1)), Some((191, 66)));
        assert_eq!(columns((64 * 7 * 7, 512, 1)), Some((96, 33)));
        // few rows: one chunk of at least 64
        assert_eq!(columns((3, 33, 1)), Some((64, 1)));
        // 2048 channels (64 tiles) at 7 x 7: 9 chunks, 576 blocks (256 before);
        // 2048 tiles: 1024 rows a chunk already make the blocks
        assert_eq!(columns((64 * 7 * 7, 2048, 1)), Some((349, 9)));
        assert_eq!(columns((5000, 1 << 16, 1)), Some((1024, 5)));
        // rows past 65535 chunks of 1024
        let n = 65535 * 1024 + 1;
        let (rows, chunks) = columns((n, 4, 1)).expect("chunks");
        assert!(rows > 1024 && chunks <= 65535);
        assert_covers(rows, chunks, n);
        for (n, c) in [(1, 1), (63, 4), (2312, 35), (2100, 40), (1 << 20, 3)] {
            let (rows, chunks) = columns((n, c, 1)).expect("chunks");
            assert!((64..=1024).contains(&rows), "{n} x {c}: {rows} rows");
            assert_covers(rows, chunks, n);
        }
    }

    #[test]
    fn kernel_defines_name_every_code_once() {
        let text = kernel_defines();
        for table in [
            UnaryCode::DEFINES,
            BinaryCode::DEFINES,
            CmpOp::DEFINES,
            ReduceCode::DEFINES,
            ScanOp::DEFINES,
        ] {
            let mut values: Vec<i32> = table.iter().map(|(_, v)| *v).collect();
            values.sort_unstable();
            values.dedup();
            assert_eq!(values.len(), table.len(), "a code is used twice: {table:?}");
            for (name, value) in table {
                assert_eq!(text.matches(&format!("#define {name} ")).count(), 1);
                assert!(text.contains(&format!("#define {name} {value}\n")));
            }
        }
        assert_eq!(UnaryCode::Clamp as i32, 16);
        assert_eq!(CmpOp::Ge as i32, 5);
    }

    /// The kernel files define no operation code themselves: they get them all from
    /// [`kernel_defines`].
    #[test]
    fn kernel_files_do_not_copy_the_codes() {
        let sources = [
            include_str!("../../../kernels/elementwise.cu"),
            include_str!("../../../kernels/reduce.cu"),
            include_str!("../../../kernels/common.cuh"),
        ];
        for src in sources {
            for line in src
                .lines()
                .filter(|l| l.trim_start().starts_with("#define"))
            {
                let name = line.split_whitespace().nth(1).unwrap_or("");
                assert!(
                    !["U_", "B_", "C_", "R_"].iter().any(|p| name.starts_with(p)),
                    "a kernel file defines {name} itself"
                );
            }
        }
    }

    #[test]
    fn scalars_convert_like_a_cast() {
        assert_eq!(Scalar::Int(-2).to::<u8>(), 254);
        assert_eq!(Scalar::Int(i64::MAX).to::<i64>(), i64::MAX);
        assert_eq!(Scalar::Float(2.7).to::<i64>(), 2);
        assert_eq!(Scalar::Bool(true).to::<f32>(), 1.0);
        assert!(Scalar::Float(0.5).to::<bool>());
    }
}
