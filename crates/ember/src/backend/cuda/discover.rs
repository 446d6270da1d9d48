//! CUDA discovery: is a GPU usable, how many, and what are they. The runtime's
//! system (the driver's or the simulator's) answers; nothing here panics or aborts
//! on a machine without CUDA, and every failure becomes a reason string that
//! [`Error::CudaUnavailable`] carries to the user.

pub use super::runtime::DeviceProperties;
use super::runtime::System;
use crate::{
    device::Device,
    error::{Error, Result},
};
use std::sync::OnceLock;

/// The system of this process: the simulator when `EMBER_CUDA_SIMULATOR` asks for
/// it, else the driver. Decided at first use; the only place that asks which.
pub(crate) fn system() -> &'static dyn System {
    static SYSTEM: OnceLock<Box<dyn System>> = OnceLock::new();
    SYSTEM
        .get_or_init(|| match super::sim::enabled() {
            Some(n) => Box::new(super::sim::SimSystem::new(n)),
            None => Box::new(super::driver::DriverSystem),
        })
        .as_ref()
}

/// What discovery said at first use: the number of GPUs or why there are none.
fn discovery() -> &'static std::result::Result<usize, String> {
    static DISCOVERY: OnceLock<std::result::Result<usize, String>> = OnceLock::new();
    DISCOVERY.get_or_init(|| system().discover())
}

/// The CUDA version the installed NVIDIA driver supports, as (major, minor)
/// (`(13, 0)` for a CUDA 13.0 driver), or `None` without a usable driver. A
/// simulated GPU reports none.
pub fn driver_version() -> Option<(u32, u32)> {
    system().driver_version()
}

/// The version of `lib` that was loaded (`13.0`, `13.1.0`, the cuDNN number), or
/// `None` where it is not found (the driver's: the CUDA version it supports; none
/// under the simulator). What `ember devices` shows next to each library's file.
pub fn library_version(lib: super::libs::CudaLib) -> Option<String> {
    use super::libs::CudaLib;
    match lib {
        CudaLib::Driver => driver_version().map(|(a, b)| format!("CUDA {a}.{b}")),
        // NVRTC's calls locate the library first (an error, never a panic)
        CudaLib::Nvrtc => super::nvrtc::version()
            .ok()
            .map(|(a, b)| format!("{a}.{b}")),
        CudaLib::Cublas => super::blas::loaded_version(),
        CudaLib::Cudnn => super::dnn::library().as_ref().ok().map(|v| v.to_string()),
        CudaLib::Nccl => super::nccl::library()
            .as_ref()
            .ok()
            .and_then(|l| l.version().ok())
            .map(|(a, b, c)| format!("{a}.{b}.{c}")),
    }
}

/// `torch.cuda.is_available()`. With `EMBER_CUDA_SIMULATOR=1` in the environment,
/// simulated GPUs that run on the CPU stand in for real ones (see
/// [`is_simulated`]).
pub fn is_available() -> bool {
    device_count() > 0
}

/// `torch.cuda.device_count()`: 0 on a machine without a usable GPU.
pub fn device_count() -> usize {
    *discovery().as_ref().unwrap_or(&0)
}

/// `true` when the `cuda:N` devices are ember's CPU simulator
/// (`EMBER_CUDA_SIMULATOR`), which checks the logic of GPU code without a GPU but
/// says nothing of its speed.
pub fn is_simulated() -> bool {
    system().is_simulated()
}

/// Why no GPU can be used, or `None` when at least one can.
pub fn unavailable_reason() -> Option<String> {
    discovery().as_ref().err().cloned()
}

/// Returns an error unless `device` is a GPU that exists.
pub(crate) fn check_device(device: Device) -> Result<()> {
    if let Device::Cuda(i) = device {
        match discovery() {
            Err(reason) => {
                return Err(Error::CudaUnavailable {
                    reason: reason.clone(),
                })
            }
            Ok(n) if i >= *n => {
                return Err(Error::CudaUnavailable {
                    reason: format!(
                        "device {device} requested but only {n} GPU(s) present (cuda:0..cuda:{})",
                        n - 1
                    ),
                })
            }
            Ok(_) => {}
        }
    }
    Ok(())
}

impl Device {
    /// `cuda:i` when that GPU can be used, otherwise the CPU.
    pub fn cuda_if_available(i: usize) -> Device {
        if i < device_count() {
            Device::Cuda(i)
        } else {
            Device::Cpu
        }
    }

    /// d2l's `try_gpu(i)`: `cuda:i` if it exists, else the CPU.
    pub fn try_gpu(i: usize) -> Device {
        Device::cuda_if_available(i)
    }

    /// d2l's `try_all_gpus()`: every GPU, or `[cpu]` when there is none.
    pub fn try_all_gpus() -> Vec<Device> {
        let n = device_count();
        if n == 0 {
            vec![Device::Cpu]
        } else {
            (0..n).map(Device::Cuda).collect()
        }
    }
}

/// Properties of GPU `i`, read without creating a context.
pub fn device_properties(i: usize) -> Result<DeviceProperties> {
    check_device(Device::Cuda(i))?;
    system().properties(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_gpu_is_an_error_not_a_panic() {
        match unavailable_reason() {
            Some(reason) => {
                assert!(!is_available());
                assert_eq!(device_count(), 0);
                let e = check_device(Device::Cuda(0)).unwrap_err().to_string();
                assert!(
                    e.contains("CUDA is not available") && e.contains(&reason),
                    "{e}"
                );
                assert!(device_properties(0).is_err());
            }
            None => {
                assert!(is_available());
                let p = device_properties(0).unwrap();
                assert!(p.multiprocessor_count > 0 && p.total_memory > 0, "{p:?}");
                let n = device_count();
                assert!(check_device(Device::Cuda(n)).is_err());
            }
        }
        assert!(check_device(Device::Cpu).is_ok());
    }

    #[test]
    fn helpers_fall_back_to_cpu_without_gpu() {
        let n = device_count();
        if n == 0 {
            assert_eq!(Device::cuda_if_available(0), Device::Cpu);
            assert_eq!(Device::try_gpu(1), Device::Cpu);
            assert_eq!(Device::try_all_gpus(), vec![Device::Cpu]);
        } else {
            assert_eq!(Device::cuda_if_available(0), Device::Cuda(0));
            assert_eq!(Device::try_all_gpus().len(), n);
            assert_eq!(Device::try_gpu(n), Device::Cpu);
        }
    }
}
