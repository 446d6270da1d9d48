//! Typed buffers of host memory: a `Vec` of one element type per dtype.

use super::{DType, WithDType};
use half::{bf16, f16};

/// A typed buffer of host memory.
#[derive(Clone, Debug)]
pub enum CpuData {
    Bool(Vec<bool>),
    U8(Vec<u8>),
    I64(Vec<i64>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    F32(Vec<f32>),
    F64(Vec<f64>),
}

/// Runs `$body` with `$v` bound to the typed vector inside a `CpuData` (by the given
/// binding mode), for every dtype. The one place the dtype `match` is written.
macro_rules! dispatch {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            $crate::dtype::CpuData::Bool($v) => $body,
            $crate::dtype::CpuData::U8($v) => $body,
            $crate::dtype::CpuData::I64($v) => $body,
            $crate::dtype::CpuData::F16($v) => $body,
            $crate::dtype::CpuData::BF16($v) => $body,
            $crate::dtype::CpuData::F32($v) => $body,
            $crate::dtype::CpuData::F64($v) => $body,
        }
    };
}
/// Like `dispatch!` for the float dtypes; other dtypes evaluate `$other`.
macro_rules! dispatch_float {
    ($data:expr, $v:ident => $body:expr, $other:ident => $else:expr) => {
        match $data {
            $crate::dtype::CpuData::F16($v) => $body,
            $crate::dtype::CpuData::BF16($v) => $body,
            $crate::dtype::CpuData::F32($v) => $body,
            $crate::dtype::CpuData::F64($v) => $body,
            $other => $else,
        }
    };
}
pub(crate) use dispatch;
pub(crate) use dispatch_float;

/// Moves typed vectors in and out of [`CpuData`] (a supertrait of [`WithDType`];
/// not nameable outside ember).
pub trait CpuElem: Sized {
    fn wrap(v: Vec<Self>) -> CpuData;
    fn slice(d: &CpuData) -> Option<&[Self]>;
    fn slice_mut(d: &mut CpuData) -> Option<&mut Vec<Self>>;
}

macro_rules! cpu_elem {
    ($t:ty, $var:ident) => {
        impl CpuElem for $t {
            #[inline]
            fn wrap(v: Vec<Self>) -> CpuData {
                CpuData::$var(v)
            }
            #[inline]
            fn slice(d: &CpuData) -> Option<&[Self]> {
                match d {
                    CpuData::$var(v) => Some(v),
                    _ => None,
                }
            }
            #[inline]
            fn slice_mut(d: &mut CpuData) -> Option<&mut Vec<Self>> {
                match d {
                    CpuData::$var(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}
cpu_elem!(bool, Bool);
cpu_elem!(u8, U8);
cpu_elem!(i64, I64);
cpu_elem!(f16, F16);
cpu_elem!(bf16, BF16);
cpu_elem!(f32, F32);
cpu_elem!(f64, F64);

impl CpuData {
    pub fn dtype(&self) -> DType {
        dispatch!(self, v => elem_dtype(v))
    }

    pub fn len(&self) -> usize {
        dispatch!(self, v => v.len())
    }

    pub(crate) fn bytes(&self) -> usize {
        dispatch!(self, v => std::mem::size_of_val(v.as_slice()))
    }

    /// The elements' bytes (bool as one byte each, 0 or 1).
    pub(crate) fn as_bytes(&self) -> &[u8] {
        // SAFETY: every element type is plain data of its size (bool is one byte
        // holding 0 or 1), so its memory reads as bytes
        dispatch!(self, v => unsafe {
            std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v.as_slice()))
        })
    }

    /// The elements' bytes, to overwrite: for bool only with 0 or 1.
    ///
    /// # Safety
    /// A bool element must be given 0 or 1.
    pub(crate) unsafe fn as_bytes_mut(&mut self) -> &mut [u8] {
        dispatch!(self, v => std::slice::from_raw_parts_mut(
            v.as_mut_ptr().cast::<u8>(),
            std::mem::size_of_val(v.as_slice())
        ))
    }

    /// `n` zeros of `dtype`.
    pub(crate) fn zeros(dtype: DType, n: usize) -> CpuData {
        match dtype {
            DType::Bool => CpuData::Bool(vec![false; n]),
            DType::U8 => CpuData::U8(vec![0; n]),
            DType::I64 => CpuData::I64(vec![0; n]),
            DType::F16 => CpuData::F16(vec![f16::ZERO; n]),
            DType::BF16 => CpuData::BF16(vec![bf16::ZERO; n]),
            DType::F32 => CpuData::F32(vec![0.0; n]),
            DType::F64 => CpuData::F64(vec![0.0; n]),
        }
    }

    /// A copy of `n` elements from `at`.
    pub(crate) fn slice(&self, at: usize, n: usize) -> CpuData {
        dispatch!(self, v => CpuElem::wrap(v[at..at + n].to_vec()))
    }

    /// Overwrites the elements from `at` with `src` (of the same dtype).
    pub(crate) fn write_at(&mut self, at: usize, src: &CpuData) {
        dispatch!(self, v => {
            let s = CpuElem::slice(src).expect("write_at: the same dtype");
            v[at..at + s.len()].copy_from_slice(s)
        })
    }
}

fn elem_dtype<T: WithDType>(_: &[T]) -> DType {
    T::DTYPE
}
