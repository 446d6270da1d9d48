//! Random generator objects (`torch.Generator`): a seeded stream of its own for
//! each device kind, that a thread draws from instead of the global one inside
//! [`Generator::scope`]. Threads with generators of their own get reproducible
//! values however the threads interleave, and leave the global stream alone.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::cell::RefCell;
use std::sync::{Arc, Mutex, MutexGuard};

/// The streams of one generator: the CPU's ChaCha stream and the GPUs' Philox
/// (seed, next counter), both started from the generator's seed.
pub(crate) struct Streams {
    seed: u64,
    pub(crate) cpu: ChaCha8Rng,
    pub(crate) philox: (u64, u64),
}

impl Streams {
    fn new(seed: u64) -> Streams {
        Streams {
            seed,
            cpu: ChaCha8Rng::seed_from_u64(seed),
            philox: (seed, 0),
        }
    }
}

/// A random generator with its own seed and position (`torch.Generator`).
///
/// Clones share the stream, as a PyTorch generator object passed around does.
/// Random creation, dropout masks and weight initialisation draw from it inside
/// [`scope`](Self::scope) (on the calling thread only); [`nn::Dropout::generator`](crate::nn::Dropout::generator)
/// and [`DataLoader::generator`](crate::data::DataLoader::generator) take one directly.
///
/// ```
/// use ember::{Device, Generator, Tensor};
/// let g = Generator::new(7);
/// let a = g.scope(|| Tensor::randn([3], &Device::Cpu))?;
/// let b = Generator::new(7).scope(|| Tensor::randn([3], &Device::Cpu))?;
/// assert_eq!(a.to_vec::<f32>()?, b.to_vec::<f32>()?);
/// # Ok::<(), ember::Error>(())
/// ```
#[derive(Clone)]
pub struct Generator(Arc<Mutex<Streams>>);

impl std::fmt::Debug for Generator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if holding(self.addr()) {
            // (inside with_global_rng's closure, which holds it locked)
            return write!(f, "Generator(in use)");
        }
        write!(f, "Generator(seed={})", self.initial_seed())
    }
}

impl Default for Generator {
    /// A generator started from PyTorch's default seed.
    fn default() -> Generator {
        Generator::new(super::DEFAULT_SEED)
    }
}

thread_local! {
    /// The generators of the scopes open on this thread, innermost last.
    static CURRENT: RefCell<Vec<Generator>> = const { RefCell::new(Vec::new()) };
}

impl Generator {
    /// A generator started from `seed`.
    pub fn new(seed: u64) -> Generator {
        Generator(Arc::new(Mutex::new(Streams::new(seed))))
    }

    /// The streams, locked.
    ///
    /// # Panics
    /// Inside `with_global_rng`'s closure drawing from this generator, which
    /// holds the lock: a second lock would never return.
    fn lock(&self) -> MutexGuard<'_, Streams> {
        if holding(self.addr()) {
            panic!(
                "this Generator is in use by with_global_rng's closure on this thread: \
                 use the generator the closure is given"
            );
        }
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What [`hold`] calls this generator.
    pub(crate) fn addr(&self) -> usize {
        Arc::as_ptr(&self.0) as *const () as usize
    }

    /// Restarts the streams from `seed` (`generator.manual_seed(seed)`).
    pub fn manual_seed(&self, seed: u64) -> &Generator {
        *self.lock() = Streams::new(seed);
        self
    }

    /// The seed the streams started from (`generator.initial_seed()`).
    pub fn initial_seed(&self) -> u64 {
        self.lock().seed
    }

    /// A 64-bit value drawn from the CPU stream (for seeding something else).
    pub fn next_u64(&self) -> u64 {
        use rand::Rng;
        self.lock().cpu.next_u64()
    }

    /// Runs `f` with every random draw made on this thread (random tensors on any
    /// device, dropout masks, initialisation, permutations) taken from this
    /// generator instead of the global one. Scopes nest; the innermost wins.
    pub fn scope<R>(&self, f: impl FnOnce() -> R) -> R {
        struct Pop;
        impl Drop for Pop {
            fn drop(&mut self) {
                CURRENT.with(|c| c.borrow_mut().pop());
            }
        }
        CURRENT.with(|c| c.borrow_mut().push(self.clone()));
        let _pop = Pop;
        f()
    }
}

impl Generator {
    /// A generator that starts where the stream this thread's random draws now
    /// come from stands (the innermost scope's generator, or the global
    /// streams) and then goes its own way: draws made in its scope repeat the
    /// draws that stream is about to make, and leave the stream where it is
    /// (for recomputing a region with the randomness it had).
    pub(crate) fn fork_current() -> crate::error::Result<Generator> {
        let streams = match current() {
            Some(g) => {
                if holding(g.addr()) {
                    return Err(in_use());
                }
                let s = g.streams();
                Streams {
                    seed: s.seed,
                    cpu: s.cpu.clone(),
                    philox: s.philox,
                }
            }
            None => {
                if holding(GLOBAL) {
                    return Err(in_use());
                }
                Streams {
                    seed: super::cpu::random::initial_seed(),
                    cpu: super::cpu::random::snapshot(),
                    philox: super::cuda::random::snapshot(),
                }
            }
        };
        Ok(Generator(Arc::new(Mutex::new(streams))))
    }
}

/// The generator of the innermost scope open on this thread, if any (`None`: the
/// caller draws from the global stream).
pub(crate) fn current() -> Option<Generator> {
    CURRENT.with(|c| c.borrow().last().cloned())
}

impl Generator {
    /// This generator's streams, locked.
    pub(crate) fn streams(&self) -> MutexGuard<'_, Streams> {
        // (the callers check `holding` first, returning an error)
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

thread_local! {
    /// The generator this thread's `with_global_rng` closure holds locked
    /// ([`GLOBAL`], a [`Generator::addr`], or 0 for none).
    static HELD: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// [`hold`]'s name for the global CPU stream.
pub(crate) const GLOBAL: usize = 1;

/// Whether this thread's `with_global_rng` closure holds `which` locked.
pub(crate) fn holding(which: usize) -> bool {
    HELD.with(|h| h.get()) == which
}

/// The error for a draw from a generator this thread's `with_global_rng`
/// closure holds.
pub(crate) fn in_use() -> crate::error::Error {
    crate::error::Error::invalid(
        "with_global_rng",
        "the random generator is already in use on this thread (a random op \
         inside with_global_rng's closure): draw from the generator it passes",
    )
}

/// Marks this thread as holding generator `which` until the guard drops; an
/// error when it already holds one.
pub(crate) fn hold(which: usize) -> crate::error::Result<Held> {
    if HELD.with(|h| h.get()) != 0 {
        return Err(in_use());
    }
    HELD.with(|h| h.set(which));
    Ok(Held)
}

/// See [`hold`].
pub(crate) struct Held;

impl Drop for Held {
    fn drop(&mut self) {
        HELD.with(|h| h.set(0));
    }
}
