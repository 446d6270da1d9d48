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
pub mod profile;
pub(crate) mod storage;

pub use cpu::random::with_global_rng;
/// The stream type the layers above name (`Tensor::record_stream`, the data
/// loader's copy stream), without reaching into the CUDA backend.
pub use cuda::Stream;
pub(crate) use primitives::Dist;
pub(crate) use storage::{AdamOperands, SgdOperands, Storage};

/// PyTorch's default seed, so unseeded programs are repeatable too.
const DEFAULT_SEED: u64 = 67280421310721;

/// A seed drawn from `device`'s random stream (the scope's generator inside
/// [`Generator::scope`](crate::Generator::scope)), for an op that must draw the same
/// values twice: it seeds a [`Generator`](crate::Generator) of its own each time.
/// The CPU stream gives its next 64 bits; a GPU reserves one Philox counter.
pub(crate) fn fork_seed(device: &crate::device::Device) -> crate::error::Result<u64> {
    Ok(match device {
        crate::device::Device::Cpu => with_global_rng(rand::Rng::next_u64)?,
        crate::device::Device::Cuda(_) => {
            let (seed, counter) = cuda::random::reserve_counters(1)?;
            seed ^ counter.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29)
        }
        crate::device::Device::Meta => 0,
    })
}

/// SplitMix64's step: nearby inputs give unrelated seeds (for seeds derived
/// from other seeds and counters).
pub(crate) fn split_mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Seeds ember's global random generators (`torch.manual_seed`): the same seed
/// gives the same sequence of random tensors. The CPU draws from a ChaCha stream and
/// GPUs from a Philox stream, both started from this seed, so (as in PyTorch) a
/// seed gives repeatable values on each device, but not the same values on the CPU
/// and on a GPU. (`meta` tensors draw nothing.)
///
/// # Panics
/// Inside [`with_global_rng`]'s closure, which holds the global generator (a
/// wait there would never end).
pub fn manual_seed(seed: u64) {
    cpu::random::seed(seed);
    cuda::random::seed(seed);
}

/// The seed of the last [`manual_seed`] (`torch.initial_seed()`; ember's
/// default seed before any). Inside a [`Generator::scope`](crate::Generator::scope),
/// the scope generator's.
pub fn initial_seed() -> u64 {
    match generator::current() {
        Some(g) => g.initial_seed(),
        None => cpu::random::initial_seed(),
    }
}
