//! What the host CPU is: for `ember devices` and benchmark reports.

/// The CPU's model name (from `/proc/cpuinfo` on Linux) and its logical cores.
#[derive(Clone, Debug)]
pub struct CpuInfo {
    pub model: String,
    pub logical_cores: usize,
    /// Worker threads ember's parallel kernels use.
    pub threads: usize,
    /// Whether the thread that asked is one of them ([`init_threads`]).
    pub caller_in_pool: bool,
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
        caller_in_pool: rayon::current_thread_index().is_some(),
    }
}

/// Builds the thread pool that runs ember's parallel CPU kernels with the calling
/// thread as one of its `threads` (`None`: `RAYON_NUM_THREADS`, or one per logical
/// core), as PyTorch's intra-op threads include the thread that calls an op.
/// Without it the pool is built on first use from other threads only, and the
/// caller sleeps through each parallel op and is woken after it: a wake-up per op,
/// about 4% of a small transformer's training step on two cores.
///
/// Call it once, first, from a thread that lives as long as the program (`main`):
/// the pool's work runs on that thread whenever it waits for a parallel op. With
/// a single thread the pool gets its own thread instead, so that work submitted
/// from other threads (a data loader's) never waits for the caller. It is an
/// error once the pool exists (an earlier call, or a CPU op that already ran),
/// which leaves the pool as it is.
pub fn init_threads(threads: Option<usize>) -> crate::error::Result<()> {
    let n = threads.filter(|&n| n > 0).unwrap_or_else(|| {
        std::env::var("RAYON_NUM_THREADS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&n: &usize| n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    });
    let builder = rayon::ThreadPoolBuilder::new().num_threads(n);
    let built = if n > 1 {
        builder.use_current_thread().build_global()
    } else {
        builder.build_global()
    };
    built.map_err(|e| {
        crate::error::Error::invalid(
            "init_threads",
            format!("the CPU thread pool cannot be built now: {e}; call init_threads once, before any CPU op"),
        )
    })
}
