//! The GPUs' random generator: a Philox4x32-10 counter stream for the process,
//! seeded by `manual_seed`. Each draw reserves a range of counters, so draws never
//! overlap and repeat for the same seed and sequence of calls.

use crate::backend::generator::Generator;
use std::sync::Mutex;

/// (seed, next Philox counter).
static STATE: Mutex<(u64, u64)> = Mutex::new((super::super::DEFAULT_SEED, 0));

/// Restarts the stream from `seed`.
pub(crate) fn seed(seed: u64) {
    *STATE.lock().unwrap_or_else(|p| p.into_inner()) = (seed, 0);
}

/// The stream where it stands: (seed, next counter).
pub(crate) fn snapshot() -> (u64, u64) {
    *STATE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Reserves `counters` consecutive Philox counters; returns (seed, first counter).
/// Inside a [`Generator::scope`](crate::Generator::scope), from the scope's generator.
pub(crate) fn reserve_counters(counters: u64) -> crate::error::Result<(u64, u64)> {
    reserve_from(crate::backend::generator::current().as_ref(), counters)
}

/// [`reserve_counters`] from generator `g` (`None`: the global stream).
pub(crate) fn reserve_from(
    g: Option<&Generator>,
    counters: u64,
) -> crate::error::Result<(u64, u64)> {
    let reserve = |state: &mut (u64, u64)| {
        let at = *state;
        state.1 = state.1.wrapping_add(counters);
        at
    };
    Ok(match g {
        Some(g) => {
            // a scope's generator keeps both streams under one lock, which
            // `with_global_rng` may hold while its closure runs
            if crate::backend::generator::holding(g.addr()) {
                return Err(crate::backend::generator::in_use());
            }
            reserve(&mut g.streams().philox)
        }
        None => reserve(&mut STATE.lock().unwrap_or_else(|p| p.into_inner())),
    })
}
