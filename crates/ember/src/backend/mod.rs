//! Storage and kernels per device: the only layer that knows how values are held
//! and how a kernel runs.
//!
//! - [`storage`]: the one dispatch point, [`Storage`] `{ Cpu, Cuda, Meta }` with a
//!   method per primitive; [`primitives`]: the `BackendStorage` trait every device
//!   implements;
//! - [`op`]: the op vocabulary (what each primitive computes, device-neutral);
//! - [`cpu`], [`cuda`], [`meta`]: the devices; they never import each other, and
//!   nothing here imports the tensor, nn, optim, io or train layers;
//! - [`host`]: the host memory pool both the CPU and CUDA copies draw on;
//!   [`alloc`]: the caching allocator's logic (CUDA memory today; generic over
//!   the memory it manages, so that meta allocations can be replayed through it).

pub(crate) mod alloc;
pub mod cpu;
pub mod cuda;
pub mod generator;
pub mod host;
pub mod meta;
pub(crate) mod op;
pub(crate) mod primitives;
pub(crate) mod storage;

pub use cpu::random::with_global_rng;
pub(crate) use primitives::Dist;
pub(crate) use storage::Storage;

/// PyTorch's default seed, so unseeded programs are repeatable too.
const DEFAULT_SEED: u64 = 67280421310721;

/// Seeds ember's global random generators (`torch.manual_seed`): the same seed
/// gives the same sequence of random tensors. The CPU draws from a ChaCha stream and
/// GPUs from a Philox stream, both started from this seed, so (as in PyTorch) a
/// seed gives repeatable values on each device, but not the same values on the CPU
/// and on a GPU. (`meta` tensors draw nothing.)
pub fn manual_seed(seed: u64) {
    cpu::random::seed(seed);
    cuda::random::seed(seed);
}
