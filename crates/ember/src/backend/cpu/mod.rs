//! CPU storage and kernels.
//!
//! Values live in a typed `Vec` per dtype ([`CpuData`]). Freed buffers of 64 KiB and
//! more go back to a bounded pool and are handed out again for the next tensor of the
//! same dtype and length: writing into a fresh large allocation costs several times
//! the op itself in page faults, so reuse is what makes large elementwise ops fast.

pub(crate) mod conv;
pub(crate) mod elementwise;
pub(crate) mod index;
pub(crate) mod matmul;
pub(crate) mod reduce;
pub(crate) mod vmath;
pub(crate) mod walk;

use crate::dtype::WithDType;
use crate::{DType, Error, Result};
use half::{bf16, f16};
use std::collections::HashMap;
use std::sync::Mutex;

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
            $crate::backend::cpu::CpuData::Bool($v) => $body,
            $crate::backend::cpu::CpuData::U8($v) => $body,
            $crate::backend::cpu::CpuData::I64($v) => $body,
            $crate::backend::cpu::CpuData::F16($v) => $body,
            $crate::backend::cpu::CpuData::BF16($v) => $body,
            $crate::backend::cpu::CpuData::F32($v) => $body,
            $crate::backend::cpu::CpuData::F64($v) => $body,
        }
    };
}
/// Like `dispatch!` for the float dtypes; other dtypes evaluate `$other`.
macro_rules! dispatch_float {
    ($data:expr, $v:ident => $body:expr, $other:ident => $else:expr) => {
        match $data {
            $crate::backend::cpu::CpuData::F16($v) => $body,
            $crate::backend::cpu::CpuData::BF16($v) => $body,
            $crate::backend::cpu::CpuData::F32($v) => $body,
            $crate::backend::cpu::CpuData::F64($v) => $body,
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

    fn bytes(&self) -> usize {
        self.len() * self.dtype().size_in_bytes()
    }
}

fn elem_dtype<T: WithDType>(_: &[T]) -> DType {
    T::DTYPE
}

/// Host storage: a [`CpuData`] that returns its buffer to the pool when dropped.
#[derive(Debug)]
pub(crate) struct CpuStorage {
    data: CpuData,
}

impl CpuStorage {
    pub fn new(data: CpuData) -> Self {
        CpuStorage { data }
    }

    pub fn data(&self) -> &CpuData {
        &self.data
    }

    pub fn data_mut(&mut self) -> &mut CpuData {
        &mut self.data
    }

    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }
}

impl Drop for CpuStorage {
    fn drop(&mut self) {
        recycle_data(std::mem::replace(&mut self.data, CpuData::U8(Vec::new())));
    }
}

/// Buffers below this size come from (and go back to) the system allocator directly.
const MIN_POOLED_BYTES: usize = 64 * 1024;

struct Pool {
    free: HashMap<(DType, usize), Vec<CpuData>>,
    bytes: usize,
    limit: usize,
}

static POOL: Mutex<Option<Pool>> = Mutex::new(None);

fn default_limit() -> usize {
    std::env::var("EMBER_CPU_POOL_MB")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map_or(512 << 20, |mb| mb << 20)
}

fn with_pool<R>(f: impl FnOnce(&mut Pool) -> R) -> R {
    let mut guard = POOL.lock().unwrap_or_else(|p| p.into_inner());
    let pool = guard.get_or_insert_with(|| Pool {
        free: HashMap::new(),
        bytes: 0,
        limit: default_limit(),
    });
    f(pool)
}

fn pool_put(data: CpuData) {
    let bytes = data.bytes();
    with_pool(|p| {
        if p.bytes + bytes <= p.limit {
            p.bytes += bytes;
            p.free
                .entry((data.dtype(), data.len()))
                .or_default()
                .push(data);
        }
        // otherwise `data` is dropped here and its memory goes back to the system
    })
}

/// Hands a buffer large enough to pool to the pool, for a later allocation of the
/// same size; smaller ones go back to the system.
fn recycle_data(data: CpuData) {
    if data.bytes() >= MIN_POOLED_BYTES {
        pool_put(data);
    }
}

/// [`recycle_data`] for a scratch vector.
pub(crate) fn recycle<T: WithDType>(v: Vec<T>) {
    recycle_data(T::wrap(v));
}

fn pool_take<T: WithDType>(len: usize) -> Option<Vec<T>> {
    if len.saturating_mul(std::mem::size_of::<T>()) < MIN_POOLED_BYTES {
        return None;
    }
    with_pool(|p| {
        let list = p.free.get_mut(&(T::DTYPE, len))?;
        let data = list.pop()?;
        p.bytes -= len * T::DTYPE.size_in_bytes();
        dispatch_take::<T>(data)
    })
}

fn dispatch_take<T: WithDType>(mut d: CpuData) -> Option<Vec<T>> {
    T::slice_mut(&mut d).map(std::mem::take)
}

/// The error for host memory the system would not give: like PyTorch's CPU
/// allocator, a request that cannot be met is an error the caller can handle,
/// where Rust's own allocation would abort the process.
pub(crate) fn host_oom(bytes: usize) -> Error {
    Error::OutOfMemory {
        device: crate::Device::Cpu,
        requested: bytes,
        msg: "the system allocator refused the request".into(),
    }
}

/// An empty vector with room for `len` elements, or [`host_oom`].
fn reserve<T>(len: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| host_oom(len.saturating_mul(std::mem::size_of::<T>())))?;
    Ok(v)
}

/// `len` elements of all-zero bytes (`0`, `0.0`, `false` in every dtype ember
/// stores), from zeroed pages that the system maps lazily.
fn zeroed<T: WithDType>(len: usize) -> Result<Vec<T>> {
    let layout = std::alloc::Layout::array::<T>(len)
        .map_err(|_| host_oom(len.saturating_mul(std::mem::size_of::<T>())))?;
    if layout.size() == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: the layout has a non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if p.is_null() {
        return Err(host_oom(layout.size()));
    }
    // SAFETY: `p` comes from the global allocator with the layout of `len` Ts
    // (capacity = len), and all-zero bytes are a valid value of each of the seven
    // WithDType types (the trait is sealed: its supertrait CpuElem cannot be named
    // outside ember).
    Ok(unsafe { Vec::from_raw_parts(p, len, len) })
}

/// `true` when `value` is stored as all-zero bytes (`0.0` but not `-0.0`).
fn is_zero_bytes<T: WithDType>(value: &T) -> bool {
    // SAFETY: WithDType types are plain numbers without padding bytes.
    let bytes = unsafe {
        std::slice::from_raw_parts((value as *const T).cast::<u8>(), std::mem::size_of::<T>())
    };
    bytes.iter().all(|&b| b == 0)
}

/// A buffer of `len` elements whose contents are unspecified (a pooled buffer keeps
/// old values): the caller must write every element.
pub(crate) fn alloc_uninit<T: WithDType>(len: usize) -> Result<Vec<T>> {
    match pool_take(len) {
        Some(v) => Ok(v),
        None => zeroed(len),
    }
}

/// A buffer of `len` copies of `value`.
pub(crate) fn alloc_filled<T: WithDType>(len: usize, value: T) -> Result<Vec<T>> {
    match pool_take::<T>(len) {
        Some(mut v) => {
            fill(&mut v, value);
            Ok(v)
        }
        None if is_zero_bytes(&value) => zeroed(len),
        None => {
            let mut v = Vec::new();
            try_resize(&mut v, len, value)?;
            Ok(v)
        }
    }
}

/// Resizes `v` to `len` copies of `value` (keeping what it holds), or
/// [`host_oom`] when the memory cannot be had.
pub(crate) fn try_resize<T: Clone>(v: &mut Vec<T>, len: usize, value: T) -> Result<()> {
    if len > v.len() {
        v.try_reserve_exact(len - v.len())
            .map_err(|_| host_oom(len.saturating_mul(std::mem::size_of::<T>())))?;
    }
    v.resize(len, value);
    Ok(())
}

/// The `len` items of `it` collected into memory reserved up front, so that a
/// size the system cannot hold is an error.
pub(crate) fn try_collect<T>(len: usize, it: impl IntoIterator<Item = T>) -> Result<Vec<T>> {
    let mut v = reserve(len)?;
    v.extend(it);
    debug_assert_eq!(v.len(), len);
    Ok(v)
}

/// Fills a slice, in parallel when it is large.
pub(crate) fn fill<T: Copy + Send + Sync>(v: &mut [T], value: T) {
    use rayon::prelude::*;
    if v.len() >= PAR_MIN {
        v.par_chunks_mut(PAR_CHUNK).for_each(|c| c.fill(value));
    } else {
        v.fill(value);
    }
}

/// Elementwise loops go parallel from this many elements on...
pub(crate) const PAR_MIN: usize = 1 << 16;
/// ...in chunks of this many elements.
pub(crate) const PAR_CHUNK: usize = 1 << 15;

/// Statistics of ember's pool of freed host buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuPoolStats {
    /// Bytes held in freed buffers, ready for reuse.
    pub pooled_bytes: usize,
    /// The most the pool keeps (`EMBER_CPU_POOL_MB`, default 512 MiB).
    pub limit_bytes: usize,
}

/// How much freed host memory ember keeps for reuse.
pub fn pool_stats() -> CpuPoolStats {
    with_pool(|p| CpuPoolStats {
        pooled_bytes: p.bytes,
        limit_bytes: p.limit,
    })
}

/// Returns every pooled host buffer to the system allocator.
pub fn empty_cache() {
    let freed = with_pool(|p| {
        p.bytes = 0;
        std::mem::take(&mut p.free)
    });
    drop(freed);
}

/// Sets the most freed host memory ember keeps for reuse (0 disables pooling).
pub fn set_pool_limit(bytes: usize) {
    with_pool(|p| p.limit = bytes);
    if pool_stats().pooled_bytes > bytes {
        empty_cache();
    }
}
