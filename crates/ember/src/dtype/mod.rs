//! Element types and PyTorch's type-promotion rules, the typed host buffers
//! ([`CpuData`]) that hold values of each, and the float math traits kernels are
//! written against.

mod host;
mod math;
mod parse;

pub(crate) use host::{dispatch, dispatch_float};
pub use host::{CpuData, CpuElem};
pub use math::{FloatDType, Real};

use half::{bf16, f16};
use std::fmt;

/// The element type of a tensor. `F32` is the default, as in PyTorch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// `bool`, stored one byte per element.
    Bool,
    /// `uint8`.
    U8,
    /// `int64`: labels and indices.
    I64,
    /// `float16` (IEEE half).
    F16,
    /// `bfloat16`.
    BF16,
    /// `float32`, the default.
    F32,
    /// `float64`.
    F64,
}

impl DType {
    /// Every dtype, in promotion order.
    pub const ALL: [DType; 7] = [
        DType::Bool,
        DType::U8,
        DType::I64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
    ];

    /// Bytes per element.
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::Bool | DType::U8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }

    /// `true` for f16, bf16, f32, f64.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    /// `true` for u8 and i64 (bool is its own category, as in PyTorch).
    pub fn is_int(self) -> bool {
        matches!(self, DType::U8 | DType::I64)
    }

    /// PyTorch's name without the `torch.` prefix: `float32`, `int64`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "uint8",
            DType::I64 => "int64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F32 => "float32",
            DType::F64 => "float64",
        }
    }

    fn category(self) -> u8 {
        match self {
            DType::Bool => 0,
            DType::U8 | DType::I64 => 1,
            _ => 2,
        }
    }

    /// `torch.promote_types`: the smallest dtype both operands convert to safely.
    pub fn promote(a: DType, b: DType) -> DType {
        use DType::*;
        if a == b {
            return a;
        }
        match (a, b) {
            (F16, BF16) | (BF16, F16) => F32,
            _ if a.category() != b.category() => {
                if a.category() > b.category() {
                    a
                } else {
                    b
                }
            }
            _ => a.max(b),
        }
    }

    /// PyTorch's result type for an operation between tensors of dtypes `a` and `b`,
    /// where 0-dimensional tensors only win when their category is higher.
    pub(crate) fn result_type(a: DType, a_dim0: bool, b: DType, b_dim0: bool) -> DType {
        if a_dim0 == b_dim0 {
            return DType::promote(a, b);
        }
        let (dim, zero) = if a_dim0 { (b, a) } else { (a, b) };
        if zero.category() > dim.category() {
            // a float scalar tensor with an integer tensor gives the default float
            if zero.is_float() && !dim.is_float() {
                zero
            } else {
                DType::promote(dim, zero)
            }
        } else {
            dim
        }
    }

    /// Result dtype of `tensor op python_scalar`. A float scalar turns an integral or
    /// bool tensor into the default float dtype; otherwise the tensor's dtype wins.
    pub(crate) fn with_scalar(t: DType, scalar_is_float: bool) -> DType {
        if scalar_is_float && !t.is_float() {
            DType::F32
        } else {
            t
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A Rust type that can be a tensor element.
pub trait WithDType:
    Copy + Send + Sync + 'static + PartialOrd + PartialEq + fmt::Debug + Default + host::CpuElem
{
    /// The matching [`DType`].
    const DTYPE: DType;
    /// Lossy conversion to f64 (bool is 0 or 1).
    fn to_f64(self) -> f64;
    /// Conversion from f64 with PyTorch's casting semantics (float to int truncates,
    /// anything non-zero is `true`).
    fn from_f64(v: f64) -> Self;
}

macro_rules! with_dtype {
    ($t:ty, $d:ident, $to:expr, $from:expr) => {
        impl WithDType for $t {
            const DTYPE: DType = DType::$d;
            #[inline(always)]
            fn to_f64(self) -> f64 {
                $to(self)
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                $from(v)
            }
        }
    };
}
with_dtype!(f32, F32, |x: f32| x as f64, |v: f64| v as f32);
with_dtype!(f64, F64, |x: f64| x, |v: f64| v);
// A double becomes f16 or bf16 through float, as in PyTorch (`c10::Half` and
// `c10::BFloat16` are built from a float): two roundings, which differ from one in
// rare halfway cases; and `half`'s direct bf16 conversion from f64 misrounds
// float's subnormal range.
with_dtype!(f16, F16, |x: f16| x.to_f64(), |v: f64| f16::from_f32(
    v as f32
));
with_dtype!(bf16, BF16, |x: bf16| x.to_f64(), |v: f64| bf16::from_f32(
    v as f32
));
with_dtype!(i64, I64, |x: i64| x as f64, |v: f64| v as i64);
// Casting a float to uint8 wraps like C (and PyTorch on x86): go through i64.
with_dtype!(u8, U8, |x: u8| x as f64, |v: f64| (v as i64) as u8);
with_dtype!(bool, Bool, |x: bool| if x { 1.0 } else { 0.0 }, |v: f64| v
    != 0.0);

#[cfg(test)]
mod tests {
    use super::*;
    use DType::*;

    #[test]
    fn promotion_follows_pytorch() {
        assert_eq!(DType::promote(U8, I64), I64);
        assert_eq!(DType::promote(Bool, U8), U8);
        assert_eq!(DType::promote(I64, F16), F16);
        assert_eq!(DType::promote(F16, BF16), F32);
        assert_eq!(DType::promote(F32, F64), F64);
        assert_eq!(DType::promote(BF16, F32), F32);
        // a 0-dim float64 tensor does not widen a float32 tensor
        assert_eq!(DType::result_type(F32, false, F64, true), F32);
        // but a 0-dim float tensor does turn an int tensor into float
        assert_eq!(DType::result_type(I64, false, F64, true), F64);
        assert_eq!(DType::with_scalar(I64, true), F32);
        assert_eq!(DType::with_scalar(F16, true), F16);
        assert_eq!(DType::with_scalar(U8, false), U8);
    }

    #[test]
    fn parse_and_print() {
        for d in DType::ALL {
            assert_eq!(d.as_str().parse::<DType>().unwrap(), d);
        }
        assert_eq!("torch.float64".parse::<DType>().unwrap(), F64);
        let e = "float8".parse::<DType>().unwrap_err().to_string();
        assert!(e.contains("float8") && e.contains("bfloat16"), "{e}");
    }

    #[test]
    fn casts() {
        // PyTorch 2.15's results: a double rounds to float first, then to the
        // half type (1 + 2^-8 + 2^-30 is above bf16's halfway point, its float is
        // on it, and the tie goes to even); float's subnormals round to nearest even
        assert_eq!(
            <bf16 as WithDType>::from_f64(1.0 + 2f64.powi(-8) + 2f64.powi(-30)).to_f64(),
            1.0
        );
        assert_eq!(
            <f16 as WithDType>::from_f64(1.0 + 2f64.powi(-11) + 2f64.powi(-40)).to_f64(),
            1.0
        );
        for (bits, want) in [
            (0x0020_7fffu32, 0x20u16),
            (0x0020_8000, 0x20),
            (0x0020_8001, 0x21),
        ] {
            let v = f32::from_bits(bits) as f64;
            assert_eq!(
                <bf16 as WithDType>::from_f64(v).to_bits(),
                want,
                "{bits:#x}"
            );
        }
        assert_eq!(u8::from_f64(-1.0), 255);
        assert_eq!(i64::from_f64(-2.7), -2);
        assert!(bool::from_f64(0.5));
        assert!(!bool::from_f64(0.0));
    }
}
