//! The one error type of ember.
//!
//! Every fallible operation returns [`Result<T>`]. Messages name the operation and the
//! operands so that a user can act on them without reading ember's source.

use crate::{device::Device, dtype::DType};

/// Shapes are printed like PyTorch's `torch.Size` lists: `[2, 3]`.
fn shape_str(s: &[usize]) -> String {
    format!("{s:?}")
}

/// A shape as Python prints a `torch.Size`, for messages that quote PyTorch's.
pub(crate) fn torch_size(s: &[usize]) -> String {
    let dims: Vec<String> = s.iter().map(|d| d.to_string()).collect();
    format!("torch.Size([{}])", dims.join(", "))
}

/// Everything that can go wrong in ember.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Two tensors on different devices met in one operation. (A 0-d CPU
    /// tensor is no mismatch in arithmetic, comparisons, `where` and the
    /// logical ops, as in PyTorch: it is taken as a number beside tensors on any
    /// device; see [`Operand`](crate::Operand).)
    #[error("Expected all tensors to be on the same device, but found at least two devices, {a} and {b}! (in {op})")]
    DeviceMismatch {
        op: &'static str,
        a: Device,
        b: Device,
    },

    /// A device string could not be parsed.
    #[error("invalid device string {input:?}: expected one of \"cpu\", \"cuda\", \"cuda:N\" (N = 0, 1, ...), \"meta\"")]
    ParseDevice { input: String },

    /// A dtype string could not be parsed.
    #[error("invalid dtype {input:?}: expected one of float32, float64, float16, bfloat16, int64, uint8, bool")]
    ParseDType { input: String },

    /// CUDA was asked for but cannot be used on this machine.
    #[error("CUDA is not available: {reason}")]
    CudaUnavailable { reason: String },

    /// The CUDA backend failed (driver, NVRTC, cuBLAS...).
    #[error("CUDA error in {op}: {msg}")]
    Cuda { op: &'static str, msg: String },

    /// A CUDA kernel did not compile; `log` is NVRTC's report, with line numbers.
    #[error("CUDA kernel {name} failed to compile for {arch}:\n{log}")]
    KernelCompile {
        name: String,
        arch: String,
        log: String,
    },

    /// Shapes of two operands do not fit the operation.
    #[error("{op}: shape mismatch between {} and {}{}", shape_str(.lhs), shape_str(.rhs), if .msg.is_empty() { String::new() } else { format!(" ({})", .msg) })]
    ShapeMismatch {
        op: &'static str,
        lhs: Vec<usize>,
        rhs: Vec<usize>,
        msg: String,
    },

    /// Shapes that cannot be broadcast together.
    #[error("{op}: the size of tensor a ({a}) must match the size of tensor b ({b}) at non-singleton dimension {dim} (shapes {} and {})", shape_str(.lhs), shape_str(.rhs))]
    Broadcast {
        op: &'static str,
        lhs: Vec<usize>,
        rhs: Vec<usize>,
        dim: usize,
        a: usize,
        b: usize,
    },

    /// A dimension index outside `[-rank, rank)`.
    #[error("{op}: dimension out of range (expected to be in range of [{}, {}], but got {dim})", -(*.rank as i64).max(1), (*.rank as i64).max(1) - 1)]
    DimOutOfRange {
        op: &'static str,
        dim: i64,
        rank: usize,
    },

    /// An index (element, slice bound, class label) outside its valid range.
    #[error("{op}: index {index} is out of bounds for dimension {dim} with size {size}")]
    IndexOutOfRange {
        op: &'static str,
        index: i64,
        dim: usize,
        size: usize,
    },

    /// Two dtypes that must agree do not, and no promotion rule applies.
    #[error("{op}: expected both operands to have the same dtype, but got {lhs} and {rhs}")]
    DTypeMismatch {
        op: &'static str,
        lhs: DType,
        rhs: DType,
    },

    /// The operation is not defined for this dtype.
    #[error("{op}: not supported for dtype {dtype}{}", if .hint.is_empty() { String::new() } else { format!(" ({})", .hint) })]
    UnsupportedDType {
        op: &'static str,
        dtype: DType,
        hint: String,
    },

    /// The operation is not (yet) available on this device.
    #[error("{op}: not supported on device {device}: {msg}")]
    UnsupportedDevice {
        op: &'static str,
        device: Device,
        msg: String,
    },

    /// Values were asked of a tensor on the `meta` device, which has none.
    #[error("{op}: meta tensors have no data (a tensor on the meta device has a shape, dtype and strides but no values); {hint}")]
    MetaNoData {
        op: &'static str,
        hint: &'static str,
    },

    /// Any other invalid argument, with an explanation.
    #[error("{op}: {msg}")]
    InvalidArgument { op: &'static str, msg: String },

    /// The device ran out of memory.
    #[error("out of memory on {device}: tried to allocate {requested} bytes ({msg})")]
    OutOfMemory {
        device: Device,
        requested: usize,
        msg: String,
    },

    /// I/O failure, with the path involved.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },

    /// A data file (CSV, IDX, ...) is malformed. `line` is the 1-based line of the
    /// problem where the format has lines.
    #[error("{file}{}: {msg}", .line.map(|l| format!(":{l}")).unwrap_or_default())]
    Parse {
        file: String,
        line: Option<u64>,
        msg: String,
    },

    /// A collective or the process group failed: a rank was lost or timed out, the
    /// rendezvous did not complete, or the ranks disagree about a call.
    #[error("{op}: {msg}")]
    Distributed { op: &'static str, msg: String },

    /// A data file was not found in any of the places ember looks for data.
    #[error("data file {name:?} not found; looked in: {}. Put it in ./data/ or set EMBER_DATA to the folder that holds it", .searched.join(", "))]
    DataNotFound { name: String, searched: Vec<String> },
}

/// `Result` with [`Error`] as the error type.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn invalid(op: &'static str, msg: impl Into<String>) -> Self {
        Error::InvalidArgument {
            op,
            msg: msg.into(),
        }
    }

    pub(crate) fn distributed(op: &'static str, msg: impl Into<String>) -> Self {
        Error::Distributed {
            op,
            msg: msg.into(),
        }
    }

    pub(crate) fn dtype(op: &'static str, dtype: DType, hint: impl Into<String>) -> Self {
        Error::UnsupportedDType {
            op,
            dtype,
            hint: hint.into(),
        }
    }

    pub(crate) fn shape(
        op: &'static str,
        lhs: &[usize],
        rhs: &[usize],
        msg: impl Into<String>,
    ) -> Self {
        Error::ShapeMismatch {
            op,
            lhs: lhs.to_vec(),
            rhs: rhs.to_vec(),
            msg: msg.into(),
        }
    }
}
