//! The CUDA backend: storage on GPUs and the kernels, libraries and runtime that
//! compute on it.
//!
//! - [`runtime`]: the seam to what executes the work, the NVIDIA driver
//!   ([`driver`], with cuBLAS in [`blas`] and cuDNN in [`dnn`]) or ember's
//!   simulator ([`sim`]), chosen once per process;
//! - [`device`]: one GPU as ember uses it (caching allocator, loaded kernels,
//!   pinned staging in [`pinned`]);
//! - [`storage`]: values on a GPU; [`ops`]: launching ember's kernels, one file per
//!   kernel family of `kernels/*.cu`;
//! - [`stream`]: streams for users, and each thread's current stream; [`graph`]:
//!   CUDA graphs;
//! - [`discover`], [`libs`], [`stats`]: discovery, the libraries found, and the
//!   public statistics (`ember::cuda::*`).
//!
//! Work is queued on the calling thread's current stream of the device and
//! returns at once; reading values back (`to_vec`, `item`, printing) waits for that
//! stream. Nothing here panics when CUDA
//! is missing: every entry goes through [`device::dev`], which checks the device
//! first.

pub(crate) mod blas;
pub(crate) mod calls;
pub(crate) mod comm;
pub(crate) mod cudnn;
pub(crate) mod device;
pub mod discover;
pub(crate) mod dnn;
pub(crate) mod driver;
pub(crate) mod graph;
pub mod libs;
pub(crate) mod nccl;
pub(crate) mod nvrtc;
pub(crate) mod ops;
pub(crate) mod pinned;
pub(crate) mod profile;
pub(crate) mod random;
pub(crate) mod runtime;
pub(crate) mod sim;
pub(crate) mod stats;
pub(crate) mod storage;
pub(crate) mod stream;

pub use crate::backend::alloc::MemoryStats;
pub(crate) use device::{dev, CudaDev};
pub use graph::Graph;
pub(crate) use runtime::Func;
pub use stats::*;
pub(crate) use storage::CudaStorage;
pub use stream::{current_stream, default_stream, with_stream, Stream};
