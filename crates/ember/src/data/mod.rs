//! Data sets and mini-batches: PyTorch's `torch.utils.data` (`Dataset`,
//! `TensorDataset`, `Subset`, `DataLoader`), scikit-learn's `train_test_split`, and
//! readers for CSV tables and IDX (MNIST) files.
//!
//! A [`DataLoader`] cuts a [`Dataset`] into batches, reshuffled each epoch from a
//! seed, optionally prepared ahead on a background thread and moved to a device:
//!
//! ```
//! use ember::data::{DataLoader, TensorDataset};
//! use ember::prelude::*;
//!
//! let dev = Device::Cpu;
//! // ten samples of two features, and their labels
//! let x = Tensor::arange(0f32, 20., &dev)?.reshape([10, 2])?;
//! let y = Tensor::arange(0i64, 10, &dev)?;
//! let loader = DataLoader::new(TensorDataset::new(x, y)?, 4)?.shuffle(0);
//! assert_eq!(loader.len(), 3); // batches of 4, 4 and 2
//! let mut seen = Vec::new();
//! for batch in &loader {
//!     let (xb, yb) = batch?;
//!     assert_eq!(xb.shape()[1], 2);
//!     seen.extend(yb.to_vec1::<i64>()?);
//! }
//! seen.sort();
//! assert_eq!(seen, (0..10).collect::<Vec<i64>>()); // every sample once per epoch
//! # Ok::<(), ember::Error>(())
//! ```

mod csv;
mod datasets;
mod idx;
mod loader;
mod sampler;
mod text;

pub use self::csv::{parse_csv, read_csv, Column, CsvTable};
pub use self::datasets::{find_data_file, load_digits, load_iris};
pub use self::idx::{encode_idx, parse_idx, read_idx, write_idx};
pub use self::loader::{Batches, DataLoader};
pub use self::sampler::DistributedSampler;
pub use self::text::{CharCorpus, Split};

use crate::{
    device::Device,
    error::{Error, Result},
    tensor::Tensor,
};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;

/// A collection of samples, each an `(input, target)` pair of tensors
/// (`torch.utils.data.Dataset`).
///
/// Datasets are shared with a [`DataLoader`]'s background thread, hence
/// `Send + Sync`.
pub trait Dataset: Send + Sync {
    /// The number of samples.
    fn len(&self) -> usize;

    /// `true` when there are no samples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sample `index` (in `0..len()`): its input and its target.
    fn get(&self, index: usize) -> Result<(Tensor, Tensor)>;

    /// The samples `indices`, stacked along a new first dimension: inputs of
    /// shape `[indices.len(), ...]` and targets likewise. The default stacks the
    /// results of [`get`](Self::get); datasets that can gather rows at once should
    /// override it.
    fn get_batch(&self, indices: &[usize]) -> Result<(Tensor, Tensor)> {
        if indices.is_empty() {
            return Err(Error::invalid("get_batch", "expected at least one index"));
        }
        let (xs, ys): (Vec<Tensor>, Vec<Tensor>) = indices
            .iter()
            .map(|&i| self.get(i))
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .unzip();
        let xs: Vec<&Tensor> = xs.iter().collect();
        let ys: Vec<&Tensor> = ys.iter().collect();
        Ok((Tensor::stack(&xs, 0)?, Tensor::stack(&ys, 0)?))
    }
}

/// A dataset behind a pointer (`Arc<D>`, `Box<D>`) is the dataset itself.
macro_rules! dataset_behind {
    ($($ptr:ident),*) => {$(
        impl<D: Dataset + ?Sized> Dataset for $ptr<D> {
            fn len(&self) -> usize {
                (**self).len()
            }
            fn get(&self, index: usize) -> Result<(Tensor, Tensor)> {
                (**self).get(index)
            }
            fn get_batch(&self, indices: &[usize]) -> Result<(Tensor, Tensor)> {
                (**self).get_batch(indices)
            }
        }
    )*};
}
dataset_behind!(Arc, Box);

/// Errors unless `index < len`.
fn check_index(op: &'static str, index: usize, len: usize) -> Result<()> {
    if index >= len {
        return Err(Error::IndexOutOfRange {
            op,
            index: index as i64,
            dim: 0,
            size: len,
        });
    }
    Ok(())
}

/// Sample `i` is row `i` of the inputs and of the targets
/// (`torch.utils.data.TensorDataset`).
#[derive(Clone, Debug)]
pub struct TensorDataset {
    inputs: Tensor,
    targets: Tensor,
}

impl TensorDataset {
    /// A dataset over the rows of `inputs` and `targets`, which must have the same
    /// first dimension (the number of samples).
    pub fn new(inputs: Tensor, targets: Tensor) -> Result<Self> {
        if inputs.rank() == 0 || targets.rank() == 0 {
            return Err(Error::shape(
                "TensorDataset::new",
                inputs.shape(),
                targets.shape(),
                "inputs and targets need a first dimension that indexes the samples",
            ));
        }
        if inputs.shape()[0] != targets.shape()[0] {
            return Err(Error::shape(
                "TensorDataset::new",
                inputs.shape(),
                targets.shape(),
                format!(
                    "inputs have {} samples but targets have {}: the first dimensions must match",
                    inputs.shape()[0],
                    targets.shape()[0]
                ),
            ));
        }
        Ok(TensorDataset { inputs, targets })
    }

    /// All inputs, `[len, ...]`.
    pub fn inputs(&self) -> &Tensor {
        &self.inputs
    }

    /// All targets, `[len, ...]`.
    pub fn targets(&self) -> &Tensor {
        &self.targets
    }
}

/// `indices` as an int64 index tensor on `device`.
fn index_tensor(indices: &[usize], device: &Device) -> Result<Tensor> {
    let v: Vec<i64> = indices.iter().map(|&i| i as i64).collect();
    Tensor::from_vec(v, [indices.len()], &Device::Cpu)?.to(device)
}

impl Dataset for TensorDataset {
    fn len(&self) -> usize {
        self.inputs.shape()[0]
    }

    fn get(&self, index: usize) -> Result<(Tensor, Tensor)> {
        check_index("TensorDataset::get", index, self.len())?;
        Ok((self.inputs.i(index)?, self.targets.i(index)?))
    }

    /// One `index_select` per tensor.
    fn get_batch(&self, indices: &[usize]) -> Result<(Tensor, Tensor)> {
        let n = self.len();
        for &i in indices {
            check_index("TensorDataset::get_batch", i, n)?;
        }
        let xi = index_tensor(indices, &self.inputs.device())?;
        let yi = if self.targets.device() == self.inputs.device() {
            xi.clone()
        } else {
            index_tensor(indices, &self.targets.device())?
        };
        Ok((
            self.inputs.index_select(0, &xi)?,
            self.targets.index_select(0, &yi)?,
        ))
    }
}

/// The samples of a dataset at the given indices, in that order
/// (`torch.utils.data.Subset`).
#[derive(Clone)]
pub struct Subset {
    dataset: Arc<dyn Dataset>,
    indices: Vec<usize>,
}

impl std::fmt::Debug for Subset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subset")
            .field("dataset_len", &self.dataset.len())
            .field("indices", &self.indices)
            .finish()
    }
}

impl Subset {
    /// The samples `indices` of `dataset`; every index must be below
    /// `dataset.len()`.
    pub fn new(dataset: impl Dataset + 'static, indices: Vec<usize>) -> Result<Self> {
        Subset::from_arc(Arc::new(dataset), indices)
    }

    /// Like [`new`](Self::new), for a dataset that is already shared.
    pub fn from_arc(dataset: Arc<dyn Dataset>, indices: Vec<usize>) -> Result<Self> {
        let n = dataset.len();
        for &i in &indices {
            check_index("Subset::new", i, n)?;
        }
        Ok(Subset { dataset, indices })
    }

    /// The underlying dataset.
    pub fn dataset(&self) -> &Arc<dyn Dataset> {
        &self.dataset
    }

    /// The indices into the underlying dataset: sample `i` of the subset is
    /// sample `indices()[i]` of the dataset.
    pub fn indices(&self) -> &[usize] {
        &self.indices
    }
}

impl Dataset for Subset {
    fn len(&self) -> usize {
        self.indices.len()
    }

    fn get(&self, index: usize) -> Result<(Tensor, Tensor)> {
        check_index("Subset::get", index, self.len())?;
        self.dataset.get(self.indices[index])
    }

    fn get_batch(&self, indices: &[usize]) -> Result<(Tensor, Tensor)> {
        let n = self.len();
        let inner = indices
            .iter()
            .map(|&i| {
                check_index("Subset::get_batch", i, n)?;
                Ok(self.indices[i])
            })
            .collect::<Result<Vec<_>>>()?;
        self.dataset.get_batch(&inner)
    }
}

/// Splits samples into a training and a test set at random, like scikit-learn's
/// `train_test_split(inputs, targets, test_size=..., random_state=seed)`.
///
/// The rows (first dimension) of `inputs` and `targets` are shuffled with a
/// generator seeded from `seed`; the first `ceil(test_size * n)` shuffled rows form
/// the test set and the rest the training set. Returns
/// `(x_train, x_test, y_train, y_test)`. `test_size` must lie in `(0, 1)` and leave
/// at least one sample on each side.
///
/// ```
/// use ember::prelude::*;
/// let x = Tensor::arange(0f32, 10., &Device::Cpu)?.reshape([5, 2])?;
/// let y = Tensor::arange(0i64, 5, &Device::Cpu)?;
/// let (x_train, x_test, y_train, y_test) = ember::data::train_test_split(&x, &y, 0.2, 42)?;
/// assert_eq!((x_train.shape(), x_test.shape()), (&[4, 2][..], &[1, 2][..]));
/// assert_eq!((y_train.shape(), y_test.shape()), (&[4][..], &[1][..]));
/// # Ok::<(), ember::Error>(())
/// ```
pub fn train_test_split(
    inputs: &Tensor,
    targets: &Tensor,
    test_size: f64,
    seed: u64,
) -> Result<(Tensor, Tensor, Tensor, Tensor)> {
    const OP: &str = "train_test_split";
    let n = TensorDataset::new(inputs.clone(), targets.clone())
        .map_err(|_| {
            Error::shape(
                OP,
                inputs.shape(),
                targets.shape(),
                "inputs and targets must have the same number of samples (first dimension)",
            )
        })?
        .len();
    if !(test_size > 0.0 && test_size < 1.0) {
        return Err(Error::invalid(
            OP,
            format!("test_size must be a fraction in (0, 1), got {test_size}"),
        ));
    }
    let n_test = (test_size * n as f64).ceil() as usize;
    if n_test == 0 || n_test >= n {
        return Err(Error::invalid(
            OP,
            format!(
                "with {n} samples and test_size={test_size} the {} set would be empty; \
                 every side needs at least one sample",
                if n_test >= n { "training" } else { "test" }
            ),
        ));
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
    let (test, train) = order.split_at(n_test);
    let pick = |t: &Tensor, idx: &[usize]| t.index_select(0, &index_tensor(idx, &t.device())?);
    Ok((
        pick(inputs, train)?,
        pick(inputs, test)?,
        pick(targets, train)?,
        pick(targets, test)?,
    ))
}
