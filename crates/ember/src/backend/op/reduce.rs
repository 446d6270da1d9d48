//! The reductions.

/// Which reduction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum ReduceOp {
    Sum,
    Mean,
    Max,
    Min,
    ArgMax,
    ArgMin,
    /// Variance with the given correction (1 = unbiased).
    Var(f64),
    /// Standard deviation with the given correction: the square root is taken in
    /// the accumulation precision, before narrowing to the dtype.
    Std(f64),
}

codes! {
    /// Reduction codes (`R_*` in the kernels).
    pub(crate) enum ReduceCode prefix "R_" {
        Sum = 0 => "SUM",
        Mean = 1 => "MEAN",
        Max = 2 => "MAX",
        Min = 3 => "MIN",
        ArgMax = 4 => "ARGMAX",
        ArgMin = 5 => "ARGMIN",
        Var = 6 => "VAR",
        Std = 7 => "STD",
    }
}

impl ReduceOp {
    /// The kernels' code and the correction (variance and std only, else 0).
    pub(crate) fn code(self) -> (ReduceCode, f64) {
        match self {
            ReduceOp::Sum => (ReduceCode::Sum, 0.0),
            ReduceOp::Mean => (ReduceCode::Mean, 0.0),
            ReduceOp::Max => (ReduceCode::Max, 0.0),
            ReduceOp::Min => (ReduceCode::Min, 0.0),
            ReduceOp::ArgMax => (ReduceCode::ArgMax, 0.0),
            ReduceOp::ArgMin => (ReduceCode::ArgMin, 0.0),
            ReduceOp::Var(c) => (ReduceCode::Var, c),
            ReduceOp::Std(c) => (ReduceCode::Std, c),
        }
    }

    /// `true` for argmax / argmin, whose output is int64 indices.
    pub(crate) fn is_arg(self) -> bool {
        matches!(self, ReduceOp::ArgMax | ReduceOp::ArgMin)
    }

    /// The output dtype for an input of `dtype`: int64 for arg-reductions and sums
    /// of integers and bools, the input's dtype otherwise.
    pub(crate) fn out_dtype(self, dtype: crate::dtype::DType) -> crate::dtype::DType {
        if self.is_arg() || (self == ReduceOp::Sum && !dtype.is_float()) {
            crate::dtype::DType::I64
        } else {
            dtype
        }
    }
}

codes! {
    /// Cumulative operations along a dim (`S_*` in the kernels): `cumsum`,
    /// `cumprod`.
    pub(crate) enum ScanOp prefix "S_" {
        Sum = 0 => "SUM",
        Prod = 1 => "PROD",
    }
}

/// The blocks that keep a GPU of `sm_count` multiprocessors busy, 4 each: the
/// reductions' splits and batch norm's per-channel chunks cut their work until
/// a grid has this many.
pub(crate) fn busy_blocks(sm_count: usize) -> usize {
    sm_count.max(1) * 4
}

/// How a GPU with `sm_count` multiprocessors reduces a view over some dims: the
/// CUDA backend launches by it, and the meta device counts the partial sums it
/// allocates (so the memory estimate follows the GPU's choice).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReduceRoute {
    /// Sums and means over the leading dims of a contiguous array: `lane` rows of
    /// `n_out` columns, a column per thread, the rows in `splits` chunks (more
    /// than one: partial sums, `splits · n_out` 8-byte values, then combined).
    Columns { splits: usize },
    /// Short lanes, enough of them: a warp per output (a block would leave most of
    /// its threads idle).
    WarpPerOutput,
    /// A block per output.
    BlockPerOutput,
    /// Few outputs over long lanes (a full sum): each lane in this many chunks,
    /// reduced by separate blocks into three arrays of `n_out · chunks` 8-byte
    /// partials, then combined.
    Split(usize),
}

impl ReduceRoute {
    /// The route of `code` over `dims` (sorted, unique) of `l`.
    pub(crate) fn of(
        code: ReduceCode,
        l: &crate::layout::Layout,
        dims: &[usize],
        sm_count: usize,
    ) -> ReduceRoute {
        // outputs, and the elements each reduces
        let n_out: usize = (0..l.rank())
            .filter(|d| !dims.contains(d))
            .map(|d| l.shape()[d])
            .product();
        let lane: usize = dims.iter().map(|&d| l.shape()[d]).product();
        /// Lanes up to this long go a warp per output.
        const WARP_LANE: usize = 512;
        /// The fewest elements a chunk of a split lane holds.
        const MIN_CHUNK: usize = 8192;
        let busy = busy_blocks(sm_count);
        if matches!(code, ReduceCode::Sum | ReduceCode::Mean)
            && l.is_contiguous()
            && crate::layout::are_leading(dims)
            && dims.len() < l.rank()
            && lane > 0
        {
            // 32 columns a block; each chunk of rows at least 64 long
            let tiles = n_out.div_ceil(32);
            let splits = busy
                .div_ceil(tiles.max(1))
                .min(lane.div_ceil(64))
                .clamp(1, 65535);
            return ReduceRoute::Columns { splits };
        }
        if lane <= WARP_LANE && n_out >= sm_count {
            ReduceRoute::WarpPerOutput
        } else if n_out < busy && lane >= 2 * MIN_CHUNK {
            ReduceRoute::Split(busy.div_ceil(n_out).min(lane / MIN_CHUNK))
        } else {
            ReduceRoute::BlockPerOutput
        }
    }

    /// The 8-byte entries of the partial sums this route allocates for `n_out`
    /// outputs (0: none).
    pub(crate) fn partials(&self, n_out: usize) -> usize {
        match *self {
            ReduceRoute::Columns { splits } if splits > 1 => splits * n_out,
            ReduceRoute::Split(chunks) => 3 * n_out * chunks,
            _ => 0,
        }
    }
}

/// The geometry of a scan over a contiguous array: `outer` blocks of `n` steps of
/// `inner` elements each; element `(o, j, i)` is at `(o * n + j) * inner + i`.
pub(crate) fn scan_shape(shape: &[usize], dim: usize) -> (usize, usize, usize) {
    let outer = shape[..dim].iter().product();
    let inner = shape[dim + 1..].iter().product();
    (outer, shape.get(dim).copied().unwrap_or(1), inner)
}

/// How a CUDA cumulative sum or product splits `lines` lines of `n` elements:
/// `None` for a thread per line, else `(chunk, chunks)`, chunks of about √n
/// elements (at least 256) scanned by a thread each, with a workspace of
/// `lines * chunks` accumulators (8 bytes each) for the carries between them.
/// Many short lines keep a thread each: they fill the GPU already.
pub(crate) fn scan_chunks(lines: usize, n: usize) -> Option<(usize, usize)> {
    if n <= 2 * SCAN_CHUNK_MIN || lines >= 1 << 16 {
        return None;
    }
    let chunk = n.isqrt().max(SCAN_CHUNK_MIN);
    Some((chunk, n.div_ceil(chunk)))
}

/// The shortest chunk of a chunked scan.
const SCAN_CHUNK_MIN: usize = 256;

/// The longest line a CUDA argsort sorts by counting (each element compares
/// itself with the whole line, one launch); longer lines take log2(n) merge
/// passes between two index buffers, one of them a workspace.
pub(crate) const ARGSORT_COUNT_MAX: usize = 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_scans_split_into_chunks_that_cover_the_line() {
        assert_eq!(scan_chunks(4, 512), None);
        assert_eq!(scan_chunks(1 << 16, 100_000), None);
        assert_eq!(scan_chunks(2, 513), Some((256, 3)));
        assert_eq!(scan_chunks(1, 1_000_000), Some((1000, 1000)));
        for n in [513, 5000, 65_537, 70_000, 1 << 24] {
            let (chunk, chunks) = scan_chunks(1, n).unwrap();
            assert!(chunk >= 256 && chunks >= 2, "{n}");
            assert!((chunks - 1) * chunk < n && n <= chunks * chunk, "{n}");
        }
    }

    #[test]
    fn reduction_routes() {
        use crate::layout::Layout;
        use ReduceRoute::*;
        // a max over the last dim of [n_out, lane] (never by columns)
        let route = |n_out: usize, lane: usize| {
            let l = Layout::contiguous(&[n_out, lane]);
            ReduceRoute::of(ReduceCode::Max, &l, &[1], 132)
        };
        // an H100: 132 multiprocessors, 528 blocks keep it busy
        assert_eq!(route(1, 1 << 24), Split(528));
        assert_eq!(route(1, 100_000), Split(12));
        assert_eq!(route(64, 1 << 20), Split(9));
        assert_eq!(route(1, 16_383), BlockPerOutput);
        assert_eq!(route(600, 1 << 20), BlockPerOutput);
        assert_eq!(route(1 << 20, 10), WarpPerOutput);
        assert_eq!(route(132, 512), WarpPerOutput);
        assert_eq!(route(131, 512), BlockPerOutput);
        assert_eq!(route(1 << 20, 513), BlockPerOutput);
        assert_eq!((Split(12).partials(1), BlockPerOutput.partials(9)), (36, 0));
        // a sum over the rows of [rows, cols]: by columns, the rows split until
        // 528 blocks of 32 columns are busy, each at least 64 rows
        let sum = |rows: usize, cols: usize, sms: usize| {
            let l = Layout::contiguous(&[rows, cols]);
            ReduceRoute::of(ReduceCode::Sum, &l, &[0], sms)
        };
        assert_eq!(sum(1500, 256, 132), Columns { splits: 24 });
        assert_eq!(sum(1500, 256, 4), Columns { splits: 2 });
        assert_eq!(sum(64, 256, 132), Columns { splits: 1 });
        assert_eq!(sum(1500, 256, 4).partials(256), 512);
        assert_eq!(sum(64, 256, 132).partials(256), 0);
    }
}

/// What a cross-entropy over rows of logits is asked (the `cross_entropy_rows`
/// primitives): the target that counts for nothing, the label smoothing, and
/// `half_steps`: each row's log-probabilities rounded to the logits' dtype
/// before the loss takes its target's and before the gradient reads them, as
/// PyTorch's separate half-precision `log_softmax` and `nll_loss` round them
/// (half logits outside autocast, without smoothing: `nn::loss`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct CeOpts {
    pub ignore: i64,
    pub smoothing: f64,
    pub half_steps: bool,
}
