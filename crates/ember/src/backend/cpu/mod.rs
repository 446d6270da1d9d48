//! CPU storage and kernels. Values live in a typed `Vec` per dtype ([`CpuData`]),
//! drawn from and returned to the host pool (`backend::host`).

pub(crate) mod conv;
pub(crate) mod elementwise;
pub(crate) mod index;
pub mod info;
pub(crate) mod matmul;
pub mod random;
pub(crate) mod reduce;
pub(crate) mod vmath;
pub(crate) mod walk;

use crate::backend::host::recycle_data;
use crate::dtype::CpuData;
use crate::DType;

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
