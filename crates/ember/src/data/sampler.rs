//! [`DistributedSampler`]: each rank's share of a dataset.

use crate::error::{Error, Result};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// The samples one rank of a data-parallel job visits each epoch
/// (`torch.utils.data.distributed.DistributedSampler`).
///
/// The dataset's indices, shuffled per epoch from a seed shared by every rank
/// (`set_epoch` on the loader picks the epoch), are made a multiple of the world
/// size, by repeating the first ones (the default) or by dropping the last ones
/// ([`drop_last`](Self::drop_last)), and dealt out in turn: rank `r` takes
/// positions `r`, `r + world`, `r + 2 world`, ... So every rank has the same number
/// of samples, and together the ranks' first batches of `b` samples are the
/// samples of a single process's first batch of `world * b`, with the same seed.
///
/// ```
/// use ember::data::DistributedSampler;
/// let s = DistributedSampler::new(10, 4, 1)?.shuffle(false);
/// assert_eq!(s.len(), 3); // ten samples padded to twelve, three per rank
/// assert_eq!(s.indices(0), vec![1, 5, 9]);
/// assert_eq!(s.clone().drop_last(true).indices(0), vec![1, 5]);
/// # Ok::<(), ember::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct DistributedSampler {
    len: usize,
    replicas: usize,
    rank: usize,
    shuffle: bool,
    seed: u64,
    drop_last: bool,
}

impl DistributedSampler {
    /// Rank `rank`'s share of a dataset of `len` samples among `num_replicas`
    /// ranks, shuffled with seed 0, padded. `num_replicas` 0 or `rank` out of range
    /// is an error.
    pub fn new(len: usize, num_replicas: usize, rank: usize) -> Result<DistributedSampler> {
        if num_replicas == 0 || rank >= num_replicas {
            return Err(Error::invalid(
                "DistributedSampler",
                format!(
                    "invalid rank {rank}, rank should be in the interval [0, {}]",
                    num_replicas as i64 - 1
                ),
            ));
        }
        Ok(DistributedSampler {
            len,
            replicas: num_replicas,
            rank,
            shuffle: true,
            seed: 0,
            drop_last: false,
        })
    }

    /// Shuffles per epoch (the default) or keeps the dataset's order.
    pub fn shuffle(mut self, on: bool) -> Self {
        self.shuffle = on;
        self
    }

    /// The shuffling seed, which every rank must share (default 0).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Drops the samples past the last multiple of the world size instead of
    /// repeating the first ones.
    pub fn drop_last(mut self, on: bool) -> Self {
        self.drop_last = on;
        self
    }

    /// Samples per epoch for this rank.
    pub fn len(&self) -> usize {
        if self.drop_last {
            self.len / self.replicas
        } else {
            self.len.div_ceil(self.replicas)
        }
    }

    /// `true` when this rank has no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The length of the dataset it shares out.
    pub fn dataset_len(&self) -> usize {
        self.len
    }

    /// The number of ranks.
    pub fn num_replicas(&self) -> usize {
        self.replicas
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The dataset indices this rank visits in epoch `epoch`, in order. The
    /// shuffled order is the one a [`DataLoader`](super::DataLoader) shuffled with
    /// the same seed visits.
    pub fn indices(&self, epoch: u64) -> Vec<usize> {
        let mut all: Vec<usize> = (0..self.len).collect();
        if self.shuffle {
            shuffle_epoch(&mut all, self.seed, epoch);
        }
        let total = self.len() * self.replicas;
        if total > all.len() && !all.is_empty() {
            let n = all.len();
            let pad: Vec<usize> = (0..total - n).map(|i| all[i % n]).collect();
            all.extend(pad);
        }
        all.truncate(total);
        all.into_iter()
            .skip(self.rank)
            .step_by(self.replicas)
            .collect()
    }
}

/// Permutes `order` as epoch `epoch` of a loader shuffled with `seed` does.
pub(crate) fn shuffle_epoch(order: &mut [usize], seed: u64, epoch: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(epoch);
    order.shuffle(&mut rng);
}
