//! Devices: where a tensor's values live.
//!
//! ```
//! use ember::Device;
//! let cpu: Device = "cpu".parse()?;
//! assert_eq!(cpu, Device::Cpu);
//! assert_eq!("cuda".parse::<Device>()?, Device::Cuda(0));
//! assert_eq!(Device::Cuda(1).to_string(), "cuda:1");
//! // PyTorch's `"cuda:0" if torch.cuda.is_available() else "cpu"`
//! let dev = Device::cuda_if_available(0);
//! println!("training on {dev}");
//! # Ok::<(), ember::Error>(())
//! ```

mod parse;

use std::fmt;

/// A device: the host CPU, one CUDA GPU (numbered from 0), or `meta`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// Host memory and CPU kernels.
    #[default]
    Cpu,
    /// The CUDA GPU with this ordinal.
    Cuda(usize),
    /// PyTorch's `meta` device: tensors with a shape, dtype and strides but no
    /// values. Every op computes its output's shape and dtype (and refuses bad input
    /// as on a real device) without computing anything, so a model's forward and
    /// backward pass and an optimizer step run in microseconds per op, allocating
    /// nothing but metadata. Reading values is an error.
    Meta,
}

impl Device {
    /// `true` for `Cuda(_)`.
    pub fn is_cuda(&self) -> bool {
        matches!(self, Device::Cuda(_))
    }

    /// `true` for `Cpu`.
    pub fn is_cpu(&self) -> bool {
        matches!(self, Device::Cpu)
    }

    /// `true` for `Meta`.
    pub fn is_meta(&self) -> bool {
        matches!(self, Device::Meta)
    }

    /// PyTorch's `device.type`: `"cpu"`, `"cuda"` or `"meta"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Cuda(_) => "cuda",
            Device::Meta => "meta",
        }
    }

    /// The GPU ordinal, `None` for the CPU and `meta`.
    pub fn index(&self) -> Option<usize> {
        match self {
            Device::Cuda(i) => Some(*i),
            Device::Cpu | Device::Meta => None,
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
            Device::Meta => f.write_str("meta"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_accepted_forms() {
        assert_eq!("cpu".parse::<Device>().unwrap(), Device::Cpu);
        assert_eq!(" CPU ".parse::<Device>().unwrap(), Device::Cpu);
        assert_eq!("cuda".parse::<Device>().unwrap(), Device::Cuda(0));
        assert_eq!("cuda:0".parse::<Device>().unwrap(), Device::Cuda(0));
        assert_eq!("cuda:12".parse::<Device>().unwrap(), Device::Cuda(12));
        assert_eq!("meta".parse::<Device>().unwrap(), Device::Meta);
        assert_eq!(Device::Meta.to_string(), "meta");
        assert_eq!((Device::Meta.kind(), Device::Meta.index()), ("meta", None));
        for d in [Device::Cpu, Device::Cuda(0), Device::Cuda(3), Device::Meta] {
            assert_eq!(d.to_string().parse::<Device>().unwrap(), d);
        }
    }

    #[test]
    fn parse_errors_list_accepted_forms() {
        for bad in [
            "", "cuda:", "cuda:-1", "cuda:x", "tpu", "cuda:1:2", "cuda: 1", "cuda:+1",
        ] {
            let e = bad.parse::<Device>().unwrap_err().to_string();
            assert!(
                e.contains("\"cpu\"") && e.contains("\"cuda:N\"") && e.contains("\"meta\""),
                "{bad:?} -> {e}"
            );
        }
        // larger than usize
        assert!("cuda:99999999999999999999999".parse::<Device>().is_err());
    }
}
