//! Storage and kernels per device. Only this layer knows how values are held and
//! how a kernel runs; the tensor layer validates and dispatches on [`Storage`].

pub mod cpu;
pub mod cuda;

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
