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

/// The geometry of a scan over a contiguous array: `outer` blocks of `n` steps of
/// `inner` elements each; element `(o, j, i)` is at `(o * n + j) * inner + i`.
pub(crate) fn scan_shape(shape: &[usize], dim: usize) -> (usize, usize, usize) {
    let outer = shape[..dim].iter().product();
    let inner = shape[dim + 1..].iter().product();
    (outer, shape.get(dim).copied().unwrap_or(1), inner)
}
