//! What the host CPU is: for `ember devices` and benchmark reports.

/// The CPU's model name (from `/proc/cpuinfo` on Linux) and its logical cores.
#[derive(Clone, Debug)]
pub struct CpuInfo {
    pub model: String,
    pub logical_cores: usize,
    /// Worker threads ember's parallel kernels use.
    pub threads: usize,
}

/// Reads the host CPU's description; never fails (unknown fields say so).
pub fn cpu_info() -> CpuInfo {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    CpuInfo {
        model,
        logical_cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        threads: rayon::current_num_threads(),
    }
}
