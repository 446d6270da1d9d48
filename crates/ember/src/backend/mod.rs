//! Storage and kernels per device. Only this layer knows how values are held and
//! how a kernel runs; the tensor layer validates and dispatches on [`Storage`].

pub(crate) mod alloc;
pub mod cpu;
pub mod cuda;
pub mod host;
pub(crate) mod op;

/// PyTorch's default seed, so unseeded programs are repeatable too.
const DEFAULT_SEED: u64 = 67280421310721;

/// Seeds ember's global random generators (`torch.manual_seed`): the same seed
/// gives the same sequence of random tensors. The CPU draws from a ChaCha stream and
/// GPUs from a Philox stream, both started from this seed, so (as in PyTorch) a
/// seed gives repeatable values on each device, but not the same values on the CPU
/// and on a GPU.
pub fn manual_seed(seed: u64) {
    cpu::random::seed(seed);
    cuda::random::seed(seed);
}

/// The values behind a tensor, on one device.
#[derive(Debug)]
pub(crate) enum Storage {
    Cpu(cpu::CpuStorage),
    Cuda(cuda::CudaStorage),
}

impl Storage {
    pub(crate) fn dtype(&self) -> crate::DType {
        match self {
            Storage::Cpu(s) => s.dtype(),
            Storage::Cuda(s) => s.dtype(),
        }
    }
}
