//! Host memory for tensors and transfers: the pool of freed buffers, and
//! allocations that report failure as [`Error::OutOfMemory`] instead of aborting.
//!
//! Freed buffers of 64 KiB and more go back to a bounded pool and are handed out
//! again for the next tensor of the same dtype and length: writing into a fresh
//! large allocation costs several times the op itself in page faults, so reuse is
//! what makes large elementwise ops fast. The CPU backend's storage and the CUDA
//! backend's copies to the host both draw on it.

use crate::dtype::{CpuData, WithDType};
use crate::{
    dtype::DType,
    error::{Error, Result},
};
use std::collections::HashMap;
use std::sync::Mutex;

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
pub(crate) fn recycle_data(data: CpuData) {
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
        device: crate::device::Device::Cpu,
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

/// [`zeroed`] for a buffer under [`MIN_POOLED_BYTES`]: allocated, then cleared.
fn small_zeroed<T: WithDType>(len: usize) -> Result<Vec<T>> {
    let layout = std::alloc::Layout::array::<T>(len)
        .map_err(|_| host_oom(len.saturating_mul(std::mem::size_of::<T>())))?;
    if layout.size() == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: the layout has a non-zero size.
    let p = unsafe { std::alloc::alloc(layout) }.cast::<T>();
    if p.is_null() {
        return Err(host_oom(layout.size()));
    }
    // an allocation cleared right away would be compiled into calloc, whose path
    // through the allocator is the slow one this function avoids
    let p = std::hint::black_box(p);
    // SAFETY: `p` holds `len` Ts; all-zero bytes are a valid value of each of them
    // (as in `zeroed`), and the Vec owns the allocation with capacity `len`.
    unsafe {
        std::ptr::write_bytes(p, 0, len);
        Ok(Vec::from_raw_parts(p, len, len))
    }
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
    if let Some(v) = pool_take(len) {
        return Ok(v);
    }
    if len.saturating_mul(std::mem::size_of::<T>()) < MIN_POOLED_BYTES {
        // small: the allocator's fast path (calloc takes a slower one)
        return small_zeroed(len);
    }
    zeroed(len)
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
