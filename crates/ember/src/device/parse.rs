//! Reading a device's name (`"cpu"`, `"cuda:1"`, `"meta"`): apart from [`Device`]
//! itself so that the error type, which names devices, sits between.

use super::Device;
use crate::error::{Error, Result};
use std::str::FromStr;

impl FromStr for Device {
    type Err = Error;

    /// Accepts `cpu` (or `cpu:0`), `cuda` (meaning `cuda:0`), `cuda:N` (N
    /// without leading zeros, as PyTorch) and `meta`, ignoring surrounding
    /// whitespace and ASCII case.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::ParseDevice {
            input: s.to_string(),
        };
        let t = s.trim().to_ascii_lowercase();
        match t.as_str() {
            // (PyTorch's `torch.device("cpu:0")` is the one CPU too)
            "cpu" | "cpu:0" => Ok(Device::Cpu),
            // PyTorch has no "gpu" device type, and neither does ember
            "cuda" => Ok(Device::Cuda(0)),
            "meta" => Ok(Device::Meta),
            _ => {
                let n = t.strip_prefix("cuda:").ok_or_else(bad)?;
                // digits, without leading zeros (PyTorch's `[1-9]\d*|0`)
                if n.is_empty()
                    || !n.bytes().all(|b| b.is_ascii_digit())
                    || n.len() > 1 && n.starts_with('0')
                {
                    return Err(bad());
                }
                n.parse().map(Device::Cuda).map_err(|_| bad())
            }
        }
    }
}

impl TryFrom<&str> for Device {
    type Error = Error;
    fn try_from(s: &str) -> Result<Self> {
        s.parse()
    }
}
