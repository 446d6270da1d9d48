//! The CPU's random generator: one ChaCha stream for the process, seeded by
//! `manual_seed`, that random tensors, shuffles, dropout masks and initialisation
//! draw from.

use crate::backend::host::try_collect;
use crate::backend::primitives::Dist;
use crate::dtype::{CpuData, WithDType};
use crate::layout::Layout;
use crate::{dtype::DType, error::Result};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Mutex;

static RNG: Mutex<Option<ChaCha8Rng>> = Mutex::new(None);

/// The seed the stream last started from (`torch.initial_seed()`).
static INITIAL: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(super::super::DEFAULT_SEED);

/// Restarts the stream from `seed`.
///
/// # Panics
/// Inside `with_global_rng`'s closure, which holds the stream locked.
pub(crate) fn seed(seed: u64) {
    if crate::backend::generator::holding(crate::backend::generator::GLOBAL) {
        panic!(
            "manual_seed inside with_global_rng's closure, which holds the global \
             generator: seed before or after it"
        );
    }
    let mut g = RNG.lock().unwrap_or_else(|p| p.into_inner());
    *g = Some(ChaCha8Rng::seed_from_u64(seed));
    INITIAL.store(seed, std::sync::atomic::Ordering::SeqCst);
}

/// The seed of the last [`seed`] (the default seed before any).
pub(crate) fn initial_seed() -> u64 {
    INITIAL.load(std::sync::atomic::Ordering::SeqCst)
}

/// A copy of the stream where it stands (the caller checks that this thread's
/// `with_global_rng` does not hold it).
pub(crate) fn snapshot() -> ChaCha8Rng {
    RNG.lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(|| ChaCha8Rng::seed_from_u64(super::super::DEFAULT_SEED))
        .clone()
}

/// Runs `f` with the global generator (for shuffling, dropout masks, init).
/// Inside a [`Generator::scope`](crate::Generator::scope), the scope's generator.
///
/// The generator is locked while `f` runs: an op that draws random values
/// (`Tensor::randn`, dropout, a shuffle, `with_global_rng` itself) called from
/// inside `f` is an error rather than a thread that waits for ever; draw from
/// the generator `f` is given instead.
///
/// ```
/// use rand::Rng;
/// let a: u64 = ember::with_global_rng(|r| r.next_u64())?;
/// let nested = ember::with_global_rng(|_| ember::Tensor::randn([2], &ember::Device::Cpu));
/// assert!(nested?.is_err());
/// # let _ = a;
/// # Ok::<(), ember::Error>(())
/// ```
pub fn with_global_rng<R>(f: impl FnOnce(&mut ChaCha8Rng) -> R) -> Result<R> {
    use crate::backend::generator::{hold, GLOBAL};
    if let Some(g) = crate::backend::generator::current() {
        let _held = hold(g.addr())?;
        return Ok(f(&mut g.streams().cpu));
    }
    let _held = hold(GLOBAL)?;
    let mut g = RNG.lock().unwrap_or_else(|p| p.into_inner());
    Ok(f(g.get_or_insert_with(|| {
        ChaCha8Rng::seed_from_u64(super::super::DEFAULT_SEED)
    })))
}

/// `n` draws of `dist` in the float `dtype`: f32 draws for the f32-and-narrower
/// dtypes, f64 for float64, computed in f64 and rounded once.
pub(crate) fn draw(dtype: DType, n: usize, dist: Dist) -> Result<CpuData> {
    let (p0, p1, normal) = match dist {
        Dist::Integers(low, high) => {
            let v =
                with_global_rng(|r| try_collect(n, (0..n).map(|_| r.random_range(low..high))))??;
            return Ok(CpuData::I64(v));
        }
        Dist::Uniform(lo, hi) => (lo, hi, false),
        Dist::Normal(mean, std) => (mean, std, true),
    };
    let v = with_global_rng(|r| {
        if normal {
            return try_collect(
                n,
                (0..n).map(|_| p0 + p1 * r.sample::<f64, _>(rand_distr::StandardNormal)),
            );
        }
        let (lo, hi) = (p0, p1);
        try_collect(
            n,
            (0..n).map(|_| {
                let u = if dtype == DType::F64 {
                    r.random::<f64>()
                } else {
                    r.random::<f32>() as f64
                };
                // rounded to the dtype now (the conversion below is then exact); a
                // draw that rounds up to `hi` becomes `lo`: samples in [lo, hi)
                let v = round_to(dtype, lo + (hi - lo) * u);
                if v < hi {
                    v
                } else {
                    round_to(dtype, lo)
                }
            }),
        )
    })??;
    if dtype == DType::F64 {
        return Ok(CpuData::F64(v));
    }
    super::elementwise::cast(&CpuData::F64(v), &Layout::contiguous(&[n]), dtype)
}

/// `v` rounded to the nearest value of the float `dtype`.
fn round_to(dtype: DType, v: f64) -> f64 {
    match dtype {
        DType::F32 => v as f32 as f64,
        DType::F16 => <half::f16 as WithDType>::from_f64(v).to_f64(),
        DType::BF16 => <half::bf16 as WithDType>::from_f64(v).to_f64(),
        _ => v,
    }
}
