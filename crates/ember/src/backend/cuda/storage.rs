//! Values on one GPU.

use super::device::CudaDev;
use crate::dtype::CpuData;
use crate::{DType, Error, Result};
use std::sync::Arc;

/// Values on one GPU: a block from the caching allocator holding `len` elements of
/// `dtype`, returned to the allocator when dropped.
pub(crate) struct CudaStorage {
    ptr: u64,
    len: usize,
    dtype: DType,
    dev: Arc<CudaDev>,
}

impl std::fmt::Debug for CudaStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CudaStorage(cuda:{}, {} x {})",
            self.dev.ordinal, self.len, self.dtype
        )
    }
}

impl Drop for CudaStorage {
    fn drop(&mut self) {
        self.dev.free(self.ptr);
    }
}

impl CudaStorage {
    /// Uninitialised storage for `len` elements.
    pub fn alloc(dev: &Arc<CudaDev>, dtype: DType, len: usize) -> Result<CudaStorage> {
        let bytes = len
            .checked_mul(dtype.size_in_bytes())
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| Error::OutOfMemory {
                device: dev.device(),
                requested: len.saturating_mul(dtype.size_in_bytes()),
                msg: "more than an address can count".into(),
            })?;
        let ptr = dev.malloc(bytes)?;
        Ok(CudaStorage {
            ptr,
            len,
            dtype,
            dev: dev.clone(),
        })
    }

    /// A copy of host data.
    pub fn from_cpu(dev: &Arc<CudaDev>, data: &CpuData) -> Result<CudaStorage> {
        CudaStorage::from_cpu_range(dev, data, 0..data.len())
    }

    /// A copy of the elements `range` of host data.
    pub fn from_cpu_range(
        dev: &Arc<CudaDev>,
        data: &CpuData,
        range: std::ops::Range<usize>,
    ) -> Result<CudaStorage> {
        let s = CudaStorage::alloc(dev, data.dtype(), range.len())?;
        crate::dtype::dispatch!(data, v => dev.htod(s.ptr, &v[range]))?;
        Ok(s)
    }

    /// The whole storage copied to the host (waits for queued work).
    pub fn to_cpu(&self) -> Result<CpuData> {
        self.to_cpu_range(0, self.len)
    }

    /// `n` elements from `offset` copied to the host (waits for queued work).
    pub fn to_cpu_range(&self, offset: usize, n: usize) -> Result<CpuData> {
        fn go<T: crate::WithDType>(s: &CudaStorage, offset: usize, n: usize) -> Result<CpuData> {
            let mut v = crate::backend::host::alloc_uninit::<T>(n)?;
            let at = s.ptr + (offset * std::mem::size_of::<T>()) as u64;
            s.dev.dtoh(&mut v, at)?;
            Ok(T::wrap(v))
        }
        debug_assert!(offset + n <= self.len);
        match self.dtype {
            DType::Bool => go::<bool>(self, offset, n),
            DType::U8 => go::<u8>(self, offset, n),
            DType::I64 => go::<i64>(self, offset, n),
            DType::F16 => go::<half::f16>(self, offset, n),
            DType::BF16 => go::<half::bf16>(self, offset, n),
            DType::F32 => go::<f32>(self, offset, n),
            DType::F64 => go::<f64>(self, offset, n),
        }
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    pub fn dev(&self) -> &Arc<CudaDev> {
        &self.dev
    }
}
