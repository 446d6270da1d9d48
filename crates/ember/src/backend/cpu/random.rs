//! The CPU's random generator: one ChaCha stream for the process, seeded by
//! `manual_seed`, that random tensors, shuffles, dropout masks and initialisation
//! draw from.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::sync::Mutex;

static RNG: Mutex<Option<ChaCha8Rng>> = Mutex::new(None);

/// Restarts the stream from `seed`.
pub(crate) fn seed(seed: u64) {
    *RNG.lock().unwrap_or_else(|p| p.into_inner()) = Some(ChaCha8Rng::seed_from_u64(seed));
}

/// Runs `f` with the global generator (for shuffling, dropout masks, init).
pub fn with_global_rng<R>(f: impl FnOnce(&mut ChaCha8Rng) -> R) -> R {
    let mut g = RNG.lock().unwrap_or_else(|p| p.into_inner());
    f(g.get_or_insert_with(|| ChaCha8Rng::seed_from_u64(super::super::DEFAULT_SEED)))
}
