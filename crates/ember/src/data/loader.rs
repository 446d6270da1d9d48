//! [`DataLoader`]: batches of a dataset, shuffled per epoch, optionally prepared
//! ahead on a background thread.

use super::Dataset;
use crate::backend::cuda::{self, Stream};
use crate::backend::generator::Generator;
use crate::{
    device::Device,
    error::{Error, Result},
    tensor::Tensor,
};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Batches of a [`Dataset`] (`torch.utils.data.DataLoader`).
///
/// Each pass over the loader ([`iter`](Self::iter), or `for batch in &loader`) is
/// one epoch and yields `Result<(inputs, targets)>` batches of
/// [`batch_size`](Self::batch_size) samples (the last one smaller unless
/// [`drop_last`](Self::drop_last) is set). With [`shuffle`](Self::shuffle) the
/// samples are visited in a new random order each epoch; the order depends only on
/// the seed and the epoch number, so runs are repeatable and a resumed run can
/// continue exactly where it stopped ([`set_epoch`](Self::set_epoch)).
///
/// By default two batches are prepared ahead on a background thread while the
/// current one is used ([`prefetch`](Self::prefetch)); the batches are the same
/// with or without prefetching. A dataset that draws random values while making
/// its samples (random augmentation) draws them from a generator of the epoch's
/// own, seeded from the epoch number and a base the loader draws from the
/// random stream when it is first iterated (after
/// [`manual_seed`](crate::manual_seed), the same for the same seed; each loader
/// its own; from the generator given to [`generator`](Self::generator), which
/// leaves the global stream alone): what the training step draws meanwhile
/// changes nothing, and a resumed epoch ([`set_epoch`](Self::set_epoch)) of a
/// loader made and iterated as before repeats its samples. (PyTorch draws a base seed for
/// its worker processes at the start of each epoch instead.)
pub struct DataLoader {
    dataset: Arc<dyn Dataset>,
    batch_size: usize,
    seed: Option<u64>,
    drop_last: bool,
    device: Option<Device>,
    prefetch: usize,
    next_epoch: AtomicU64,
    sampler: Option<super::DistributedSampler>,
    /// Drawn from the random stream when the loader is first iterated (from
    /// its generator with [`generator`](Self::generator)): what the dataset's
    /// draws start from, each epoch (PyTorch's per-iterator base seed).
    samples_base: std::sync::OnceLock<u64>,
    /// Whether `seed` came from [`generator`](Self::generator) rather than
    /// [`shuffle`](Self::shuffle): a sampler then takes over the order.
    seed_from_generator: bool,
}

impl DataLoader {
    /// A loader over `dataset` in batches of `batch_size` samples, in order, not
    /// shuffled, keeping the last partial batch, prefetching two batches.
    /// `batch_size` 0 is an error.
    pub fn new(dataset: impl Dataset + 'static, batch_size: usize) -> Result<Self> {
        DataLoader::from_arc(Arc::new(dataset), batch_size)
    }

    /// Like [`new`](Self::new), for a dataset that is already shared.
    pub fn from_arc(dataset: Arc<dyn Dataset>, batch_size: usize) -> Result<Self> {
        if batch_size == 0 {
            return Err(Error::invalid(
                "DataLoader::new",
                "batch_size should be a positive integer value, but got batch_size=0",
            ));
        }
        Ok(DataLoader {
            dataset,
            batch_size,
            seed: None,
            drop_last: false,
            device: None,
            prefetch: 2,
            next_epoch: AtomicU64::new(0),
            sampler: None,
            samples_base: std::sync::OnceLock::new(),
            seed_from_generator: false,
        })
    }

    /// Shuffles the samples each epoch: epoch `e` visits them in a permutation
    /// drawn from a generator seeded with `seed` (stream `e`), so two loaders with
    /// the same seed give the same batches, and each epoch a different order.
    /// A loader given a [`sampler`](Self::sampler) visits the sampler's order:
    /// shuffling is then the sampler's ([`seed`](Self::seed) says `None`).
    pub fn shuffle(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self.seed_from_generator = false;
        self
    }

    /// Shuffles with a seed drawn from `generator` (PyTorch's
    /// `DataLoader(generator=g, shuffle=True)`), and the dataset's random draws
    /// start from it too: loaders given generators seeded alike shuffle and
    /// augment alike, whatever other threads draw from the global stream. With
    /// a [`sampler`](Self::sampler) (before or after this), the sampler's order
    /// is visited and the generator seeds the draws only, as PyTorch's
    /// `generator=` beside a sampler.
    pub fn generator(mut self, generator: &crate::backend::generator::Generator) -> Self {
        let seed = generator.next_u64();
        self.samples_base = std::sync::OnceLock::from(generator.next_u64());
        if self.sampler.is_none() {
            // (a shuffle asked for stays asked for, now with this seed: a
            // sampler is then refused)
            self.seed_from_generator = self.seed.is_none() || self.seed_from_generator;
            self.seed = Some(seed);
        }
        self
    }

    /// With `true`, the last batch is skipped when it has fewer than
    /// `batch_size` samples.
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// Moves every batch to `device` before yielding it (PyTorch's `pin_memory=True`
    /// with `.to(device, non_blocking=True)`): for a GPU, the background thread
    /// stages each batch in pinned host memory and queues its copy on the device's
    /// copy stream, without waiting for the GPU, so the upload of the next batch
    /// overlaps the training step in flight. The batch handed out is ordered
    /// after its upload on the current stream of the thread that takes it (an
    /// event, no host wait), and its memory is kept from the next uploads until
    /// that stream's work on it has finished. Without this, batches stay where the
    /// dataset makes them.
    pub fn device(mut self, device: &Device) -> Self {
        self.device = Some(*device);
        self
    }

    /// Prepares up to `n` batches ahead on a background thread; `0` prepares each
    /// batch when it is asked for, on the calling thread. The default is 2.
    pub fn prefetch(mut self, n: usize) -> Self {
        self.prefetch = n;
        self
    }

    /// Visits only the samples `sampler` gives this rank, in its order
    /// (`DataLoader(sampler=DistributedSampler(...))`): the sampler shuffles (or
    /// not) itself, so a loader already set to [`shuffle`](Self::shuffle) refuses
    /// it, as PyTorch refuses both ("sampler option is mutually exclusive with
    /// shuffle"). The sampler must be for this dataset's length.
    pub fn sampler(mut self, sampler: super::DistributedSampler) -> Result<Self> {
        if self.seed_from_generator {
            // (the generator's draws stay: the sampler takes over the order)
            self.seed = None;
            self.seed_from_generator = false;
        }
        if let Some(seed) = self.seed {
            return Err(Error::invalid(
                "DataLoader::sampler",
                format!(
                    "sampler option is mutually exclusive with shuffle (this loader shuffles \
                     with seed {seed}): shuffle with the sampler's own seed instead"
                ),
            ));
        }
        if sampler.dataset_len() != self.dataset.len() {
            return Err(Error::invalid(
                "DataLoader::sampler",
                format!(
                    "the sampler shares out {} samples, the dataset has {}",
                    sampler.dataset_len(),
                    self.dataset.len()
                ),
            ));
        }
        self.sampler = Some(sampler);
        Ok(self)
    }

    /// The sampler, if one was given.
    pub fn distributed_sampler(&self) -> Option<&super::DistributedSampler> {
        self.sampler.as_ref()
    }

    /// The number of batches per epoch.
    pub fn len(&self) -> usize {
        let n = self.samples_per_epoch();
        if self.drop_last {
            n / self.batch_size
        } else {
            n.div_ceil(self.batch_size)
        }
    }

    /// `true` when an epoch has no batches.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The number of samples in the dataset (all of them, including those a
    /// [`drop_last`](Self::drop_last) epoch skips).
    pub fn num_samples(&self) -> usize {
        self.dataset.len()
    }

    /// The samples an epoch visits: the dataset's, or this rank's share with a
    /// [`sampler`](Self::sampler).
    pub fn samples_per_epoch(&self) -> usize {
        self.sampler
            .as_ref()
            .map_or(self.dataset.len(), |s| s.len())
    }

    /// Samples per batch.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Whether a last, smaller batch is skipped ([`drop_last`](Self::drop_last)).
    pub fn drops_last(&self) -> bool {
        self.drop_last
    }

    /// The shuffling seed, if shuffling (`None` with a sampler, whose order
    /// replaces the loader's).
    pub fn seed(&self) -> Option<u64> {
        self.seed.filter(|_| self.sampler.is_none())
    }

    /// The dataset.
    pub fn dataset(&self) -> &Arc<dyn Dataset> {
        &self.dataset
    }

    /// The epoch the next call to [`iter`](Self::iter) runs (0 at first).
    pub fn next_epoch(&self) -> u64 {
        self.next_epoch.load(Ordering::SeqCst)
    }

    /// Makes the next call to [`iter`](Self::iter) run epoch `epoch` (and the
    /// following calls `epoch + 1`, ...): to resume training from a checkpoint
    /// with the same batches as an uninterrupted run.
    pub fn set_epoch(&self, epoch: u64) {
        self.next_epoch.store(epoch, Ordering::SeqCst);
    }

    /// The order in which epoch `epoch` visits the samples: `0..num_samples()`, or
    /// its permutation for that epoch when shuffling.
    pub fn sample_order(&self, epoch: u64) -> Vec<usize> {
        if let Some(s) = &self.sampler {
            return s.indices(epoch);
        }
        let mut order: Vec<usize> = (0..self.dataset.len()).collect();
        if let Some(seed) = self.seed {
            super::sampler::shuffle_epoch(&mut order, seed, epoch);
        }
        order
    }

    /// The seed of the generator the dataset draws from while making epoch
    /// `epoch`'s samples: the loader's own base (drawn when it is first
    /// iterated), this rank's with a sampler, mixed with the epoch number.
    fn samples_seed(&self, epoch: u64) -> u64 {
        // nearby seeds and epochs give unrelated streams
        let mix = crate::backend::split_mix;
        let base = *self.samples_base.get_or_init(|| {
            // (inside with_global_rng's closure, which holds the stream: the
            // global seed instead)
            crate::backend::fork_seed(&Device::Cpu)
                .unwrap_or_else(|_| crate::backend::initial_seed())
        });
        let rank = self.sampler.as_ref().map_or(0, |s| s.rank() as u64 + 1);
        mix(mix(base ^ mix(rank)).wrapping_add(epoch))
    }

    /// The batches of the next epoch, and advances the epoch counter: successive
    /// calls give successive epochs (a new order each time when shuffling).
    pub fn iter(&self) -> Batches {
        let epoch = self.next_epoch.fetch_add(1, Ordering::SeqCst);
        self.epoch(epoch)
    }

    /// The batches of epoch `epoch`, leaving the epoch counter alone.
    pub fn epoch(&self, epoch: u64) -> Batches {
        let plan = Plan {
            dataset: Arc::clone(&self.dataset),
            order: self.sample_order(epoch),
            batch_size: self.batch_size,
            device: self.device,
            rng: Generator::new(self.samples_seed(epoch)),
        };
        let total = self.len();
        let state = if self.prefetch == 0 || total == 0 {
            State::Inline(plan)
        } else {
            spawn_worker(plan, total, self.prefetch)
        };
        Batches {
            state,
            next: 0,
            total,
        }
    }
}

impl Clone for DataLoader {
    /// A loader over the same dataset with the same settings, whose epoch counter
    /// starts where this one's is now.
    fn clone(&self) -> Self {
        DataLoader {
            dataset: Arc::clone(&self.dataset),
            batch_size: self.batch_size,
            seed: self.seed,
            drop_last: self.drop_last,
            device: self.device,
            prefetch: self.prefetch,
            next_epoch: AtomicU64::new(self.next_epoch()),
            sampler: self.sampler.clone(),
            samples_base: self.samples_base.clone(),
            seed_from_generator: self.seed_from_generator,
        }
    }
}

impl fmt::Debug for DataLoader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DataLoader")
            .field("num_samples", &self.num_samples())
            .field("batch_size", &self.batch_size)
            .field("shuffle_seed", &self.seed)
            .field("drop_last", &self.drop_last)
            .field("device", &self.device)
            .field("prefetch", &self.prefetch)
            .field("next_epoch", &self.next_epoch())
            .finish()
    }
}

impl IntoIterator for &DataLoader {
    type Item = Result<(Tensor, Tensor)>;
    type IntoIter = Batches;

    /// [`DataLoader::iter`]: the next epoch.
    fn into_iter(self) -> Batches {
        self.iter()
    }
}

/// What one epoch needs to make its batches, on any thread.
struct Plan {
    dataset: Arc<dyn Dataset>,
    order: Vec<usize>,
    batch_size: usize,
    device: Option<Device>,
    /// What the dataset's random draws come from, batch after batch.
    rng: Generator,
}

impl Plan {
    fn batch(&self, b: usize) -> BatchResult {
        let start = b * self.batch_size;
        let end = (start + self.batch_size).min(self.order.len());
        let (x, y) = self
            .rng
            .scope(|| self.dataset.get_batch(&self.order[start..end]))?;
        match &self.device {
            Some(Device::Cuda(i)) => {
                // uploaded on the copy stream; the taker's stream waits for `ready`
                let copy = Stream::copy_stream(&Device::Cuda(*i))?;
                let d = Device::Cuda(*i);
                let (x, y) = cuda::with_stream(&copy, || -> Result<_> {
                    Ok((x.to_device_non_blocking(&d)?, y.to_device_non_blocking(&d)?))
                })?;
                let ready = copy.record_event()?;
                Ok((x, y, Some(ready)))
            }
            Some(d) => Ok((x.to(d)?, y.to(d)?, None)),
            None => Ok((x, y, None)),
        }
    }
}

/// A batch, and for one uploaded to a GPU the event after its upload.
type BatchResult = Result<(Tensor, Tensor, Option<cuda::Event>)>;

/// Orders the use of a batch on the calling thread's current stream after its
/// upload, and keeps its memory from reuse by the copy stream until that use
/// has finished.
fn hand_out(batch: BatchResult) -> Result<(Tensor, Tensor)> {
    let (x, y, ready) = batch?;
    if let Some(ready) = ready {
        let here = cuda::current_stream(&ready.device())?;
        here.wait_event(&ready)?;
        x.record_stream(&here)?;
        y.record_stream(&here)?;
    }
    Ok((x, y))
}

enum State {
    /// Batches are made on demand.
    Inline(Plan),
    /// A worker thread makes them ahead.
    Prefetch {
        rx: Option<Receiver<BatchResult>>,
        stop: Arc<AtomicBool>,
        worker: Option<JoinHandle<()>>,
    },
}

/// Starts the thread that prepares `total` batches, at most `ahead` of them
/// waiting at any time; falls back to inline batches when no thread can start.
fn spawn_worker(plan: Plan, total: usize, ahead: usize) -> State {
    // the worker holds one finished batch while blocked in `send`: `ahead - 1`
    // slots (no more than the epoch has batches: the channel allocates them)
    let (tx, rx) = sync_channel::<BatchResult>(ahead.min(total) - 1);
    let stop = Arc::new(AtomicBool::new(false));
    let stop_w = Arc::clone(&stop);
    let plan = Arc::new(plan);
    let plan_w = Arc::clone(&plan);
    let spawned = std::thread::Builder::new()
        .name("ember-data-loader".into())
        .spawn(move || {
            for b in 0..total {
                if stop_w.load(Ordering::Relaxed) {
                    return;
                }
                // a dropped receiver means the consumer is gone
                if tx.send(plan_w.batch(b)).is_err() {
                    return;
                }
            }
        });
    match spawned {
        Ok(worker) => State::Prefetch {
            rx: Some(rx),
            stop,
            worker: Some(worker),
        },
        Err(_) => match Arc::try_unwrap(plan) {
            Ok(plan) => State::Inline(plan),
            // unreachable: the closure that held the other reference was dropped
            Err(_) => State::Prefetch {
                rx: None,
                stop,
                worker: None,
            },
        },
    }
}

/// The batches of one epoch of a [`DataLoader`]: an iterator of
/// `Result<(inputs, targets)>`.
///
/// Dropping it before the end stops its background thread (after the batch that
/// thread is preparing, if any).
pub struct Batches {
    state: State,
    next: usize,
    total: usize,
}

impl Iterator for Batches {
    type Item = Result<(Tensor, Tensor)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next >= self.total {
            return None;
        }
        let item = match &mut self.state {
            State::Inline(plan) => hand_out(plan.batch(self.next)),
            State::Prefetch { rx, worker, .. } => {
                match rx.as_ref().map(|rx| rx.recv()) {
                    Some(Ok(item)) => hand_out(item),
                    // the worker ended early: it panicked (in a dataset's `get`)
                    _ => {
                        self.next = self.total;
                        if let Some(Err(panic)) = worker.take().map(|w| w.join()) {
                            std::panic::resume_unwind(panic);
                        }
                        return Some(Err(Error::invalid(
                            "DataLoader",
                            "the background thread preparing batches stopped early",
                        )));
                    }
                }
            }
        };
        self.next += 1;
        Some(item)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.total - self.next;
        (left, Some(left))
    }
}

impl ExactSizeIterator for Batches {}

impl Drop for Batches {
    fn drop(&mut self) {
        if let State::Prefetch { rx, stop, worker } = &mut self.state {
            stop.store(true, Ordering::Relaxed);
            // dropping the receiver wakes a worker blocked in `send`
            drop(rx.take());
            if let Some(w) = worker.take() {
                // a worker that panicked has nothing left to clean up
                let _ = w.join();
            }
        }
    }
}
