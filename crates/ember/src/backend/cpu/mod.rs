//! CPU storage and kernels. Values live in a typed `Vec` per dtype ([`CpuData`]),
//! drawn from and returned to the host pool (`backend::host`).

pub(crate) mod attention;
pub(crate) mod channel;
pub(crate) mod conv;
pub(crate) mod elementwise;
pub(crate) mod index;
pub mod info;
pub(crate) mod matmul;
pub(crate) mod optim;
pub mod random;
pub(crate) mod reduce;
pub(crate) mod storage;
pub(crate) mod vmath;
pub(crate) mod walk;

pub(crate) use storage::CpuStorage;
