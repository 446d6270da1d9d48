//! Metrics accumulated over the batches of an epoch.

use crate::{
    dtype::DType,
    error::{Error, Result},
    tensor::Tensor,
};

/// A quantity computed batch by batch and averaged over an epoch. Implement it for
/// your own metrics and pass them to [`Trial::metric`](super::Trial::metric).
///
/// Keep what `update` accumulates on the batch's device, as the metrics here do:
/// reading a value there (`item`, `to_vec`) makes the host wait for the GPU at
/// every step, where `value` reads once per epoch.
pub trait Metric: Send {
    /// The column name in the history (`"loss"`, `"acc"`, ...); validation values
    /// get a `val_` prefix.
    fn name(&self) -> String;
    /// Forgets everything (called at the start of each phase).
    fn reset(&mut self);
    /// Adds one batch: the model's `output`, the `target` and the batch's mean
    /// loss (a 0-d tensor on the output's device, not part of any graph).
    fn update(&mut self, output: &Tensor, target: &Tensor, loss: &Tensor) -> Result<()>;
    /// The value over the batches seen since the last reset (NaN before any, for
    /// the metrics here).
    fn value(&self) -> Result<f64>;
}

/// `total + x`, or `x` for the first batch (kept in f64 on `x`'s device).
fn accumulate(total: &mut Option<Tensor>, x: &Tensor) -> Result<()> {
    let x = x.to_dtype(DType::F64)?;
    *total = Some(match total.take() {
        Some(t) => t.add(&x)?,
        None => x,
    });
    Ok(())
}

/// `total / n`, read from the device (NaN before any sample: no value, rather
/// than a made-up 0).
fn mean(total: &Option<Tensor>, n: usize) -> Result<f64> {
    match total {
        Some(t) if n > 0 => Ok(t.item::<f64>()? / n as f64),
        _ => Ok(f64::NAN),
    }
}

/// The mean loss per sample.
#[derive(Default)]
pub struct Loss {
    sum: Option<Tensor>,
    n: usize,
}

impl Metric for Loss {
    fn name(&self) -> String {
        "loss".into()
    }
    fn reset(&mut self) {
        *self = Loss::default();
    }
    fn update(&mut self, output: &Tensor, _: &Tensor, loss: &Tensor) -> Result<()> {
        let n = output.shape().first().copied().unwrap_or(1);
        accumulate(
            &mut self.sum,
            &loss.detach().to_dtype(DType::F64)?.mul(n as f64)?,
        )?;
        self.n += n;
        Ok(())
    }
    fn value(&self) -> Result<f64> {
        mean(&self.sum, self.n)
    }
}

/// The fraction of samples whose target class is among the `k` highest scores
/// (`k = 1`: accuracy); of equal scores the lowest indices count as the higher
/// (PyTorch's `topk` leaves ties unspecified). Outputs `[N, C]` scores with
/// `C >= k`, targets `[N]` class indices in `0..C`: another target (such as
/// the -100 that pads sequences) makes [`value`](Metric::value) an error
/// naming it, unless it is the [`ignore_index`](Self::ignore_index).
pub struct TopKAccuracy {
    k: usize,
    ignore_index: Option<i64>,
    /// The samples seen.
    n: usize,
    /// Kept on the device, read once by `value`: the hits, the samples not
    /// counted (ignored, or with a target outside the classes), and those of
    /// them outside the classes (an error then).
    counts: Option<Tensor>,
    /// The smallest and the largest target outside the classes (read only
    /// for the error).
    bad_range: Option<[Tensor; 2]>,
    classes: usize,
}

impl TopKAccuracy {
    /// Top-`k` accuracy; `k` must be at least 1.
    pub fn new(k: usize) -> Result<TopKAccuracy> {
        if k == 0 {
            return Err(Error::invalid("top-k accuracy", "k must be at least 1"));
        }
        Ok(TopKAccuracy {
            k,
            ignore_index: None,
            n: 0,
            counts: None,
            bad_range: None,
            classes: 0,
        })
    }

    /// Skips the samples whose target is `index`: they count neither as hits
    /// nor as samples (torchbearer's `ignore_index`; `cross_entropy` ignores
    /// PyTorch's -100 the same way).
    pub fn ignore_index(mut self, index: i64) -> TopKAccuracy {
        self.ignore_index = Some(index);
        self
    }

    /// Takes a batch's targets outside `0..classes` (`bad`, those not
    /// ignored) into the smallest and the largest such target.
    fn note_bad(&mut self, target: &Tensor, bad: &Tensor) -> Result<()> {
        let lo = bad.where_(target, i64::MAX)?.min_all()?;
        let hi = bad.where_(target, i64::MIN)?.max_all()?;
        self.bad_range = Some(match self.bad_range.take() {
            Some([l, h]) => [l.minimum(&lo)?, h.maximum(&hi)?],
            None => [lo, hi],
        });
        Ok(())
    }
}

impl Metric for TopKAccuracy {
    fn name(&self) -> String {
        if self.k == 1 {
            "acc".into()
        } else {
            format!("top_{}_acc", self.k)
        }
    }
    fn reset(&mut self) {
        (self.n, self.counts, self.bad_range) = (0, None, None);
    }
    fn update(&mut self, output: &Tensor, target: &Tensor, _: &Tensor) -> Result<()> {
        if output.rank() != 2 || target.shape() != [output.shape()[0]] {
            return Err(Error::shape(
                "accuracy",
                output.shape(),
                target.shape(),
                "expected outputs [N, C] and class-index targets [N]",
            ));
        }
        let classes = output.shape()[1];
        if self.k > 1 && self.k > classes {
            return Err(Error::invalid(
                "top-k accuracy",
                format!(
                    "top-{} accuracy of outputs with {classes} classes: k must be at most \
                     the number of classes (torch.topk: selected index k out of range)",
                    self.k
                ),
            ));
        }
        if target.numel() == 0 {
            return Ok(());
        }
        self.classes = classes;
        let target = target.to_dtype(DType::I64)?;
        // the targets that are no class are noted (and reported by `value`);
        // they and the ignored ones are looked up as class 0, and not counted
        let ignored = self.ignore_index.map(|i| target.eq(i)).transpose()?;
        let outside = target.lt(0i64)?.logical_or(&target.ge(classes as i64)?)?;
        let (bad, skip) = match &ignored {
            Some(ig) => (
                outside.logical_and(&ig.logical_not()?)?,
                outside.logical_or(ig)?,
            ),
            None => (outside.clone(), outside),
        };
        self.note_bad(&target, &bad)?;
        let t = target.masked_fill(&skip, 0i64)?;
        let hit = if self.k == 1 {
            output.argmax(1, false)?.eq(&t)?
        } else {
            // the target is among the k best when fewer than k classes beat it:
            // a higher score, or an equal one at a lower index (of equal scores
            // the lowest indices are taken, as argmax takes the first for k = 1;
            // a tie at the k-th place is not a hit for every class in it). One
            // pass over the scores, no sort.
            let t = t.unsqueeze(1)?;
            let score = output.gather(1, &t)?;
            let column = Tensor::arange(0i64, classes as i64, &output.device())?;
            let ahead = output
                .gt(&score)?
                .logical_or(&output.eq(&score)?.logical_and(&column.lt(&t)?)?)?;
            ahead.sum(1, false)?.lt(self.k as i64)?
        };
        let hits = hit.logical_and(&skip.logical_not()?)?.sum_all()?;
        let counts = Tensor::stack(&[&hits, &skip.sum_all()?, &bad.sum_all()?], 0)?;
        accumulate(&mut self.counts, &counts)?;
        self.n += target.numel();
        Ok(())
    }
    fn value(&self) -> Result<f64> {
        // (one read of the device: the hits, the samples skipped, the bad ones)
        let Some(counts) = &self.counts else {
            return Ok(f64::NAN);
        };
        let [hits, skipped, bad] = counts.to_vec1::<f64>()?[..] else {
            return Err(Error::invalid("accuracy", "expected three counts"));
        };
        if let (true, Some([lo, hi])) = (bad > 0.0, &self.bad_range) {
            let (lo, hi) = (lo.item::<i64>()?, hi.item::<i64>()?);
            let values = if lo == hi {
                lo.to_string()
            } else {
                format!("from {lo} to {hi}")
            };
            let (k, c) = (self.k, self.classes);
            return Err(Error::invalid(
                "accuracy",
                format!(
                    "metric {}: {bad} targets are not classes of the {c} scores (0 to {}): \
                     {values}; a target that marks samples to skip (such as the -100 of \
                     padding) needs TopKAccuracy::new({k})?.ignore_index(..)",
                    self.name(),
                    c.saturating_sub(1)
                ),
            ));
        }
        // (0 / 0: NaN while no sample is counted)
        Ok(hits / (self.n as f64 - skipped))
    }
}

/// Builds a metric from its name: `loss`, `acc` / `accuracy`, `top_K_acc`
/// (for example `top_5_acc`).
pub fn metric_by_name(name: &str) -> Result<Box<dyn Metric>> {
    match name {
        "loss" => Ok(Box::new(Loss::default())),
        "acc" | "accuracy" => Ok(Box::new(TopKAccuracy::new(1)?)),
        _ => {
            let k = name
                .strip_prefix("top_")
                .and_then(|r| r.strip_suffix("_acc"))
                .and_then(|k| k.parse::<usize>().ok());
            match k {
                Some(k) => Ok(Box::new(TopKAccuracy::new(k)?)),
                None => Err(Error::invalid(
                    "Trial",
                    format!(
                        "unknown metric {name:?}: use loss, acc, accuracy, top_K_acc or a Metric"
                    ),
                )),
            }
        }
    }
}
