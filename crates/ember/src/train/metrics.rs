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

/// `total / n`, read from the device (NaN before any batch: no value, rather
/// than a made-up 0).
fn mean(total: &Option<Tensor>, n: usize) -> Result<f64> {
    match total {
        Some(t) => Ok(t.item::<f64>()? / n.max(1) as f64),
        None => Ok(f64::NAN),
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
/// `C >= k`, targets `[N]` class indices.
pub struct TopKAccuracy {
    k: usize,
    correct: Option<Tensor>,
    n: usize,
}

impl TopKAccuracy {
    /// Top-`k` accuracy; `k` must be at least 1.
    pub fn new(k: usize) -> Result<TopKAccuracy> {
        if k == 0 {
            return Err(Error::invalid("top-k accuracy", "k must be at least 1"));
        }
        Ok(TopKAccuracy {
            k,
            correct: None,
            n: 0,
        })
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
        self.correct = None;
        self.n = 0;
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
        let target = target.to_dtype(DType::I64)?;
        let correct = if self.k == 1 {
            output.argmax(1, false)?.eq(&target)?
        } else {
            // the target is among the k best when fewer than k classes beat it:
            // a higher score, or an equal one at a lower index (of equal scores
            // the lowest indices are taken, as argmax takes the first for k = 1;
            // a tie at the k-th place is not a hit for every class in it). One
            // pass over the scores, no sort.
            let classes = output.shape()[1];
            if self.k > classes {
                return Err(Error::invalid(
                    "top-k accuracy",
                    format!(
                        "top-{} accuracy of outputs with {classes} classes: k must be at most \
                         the number of classes (torch.topk: selected index k out of range)",
                        self.k
                    ),
                ));
            }
            let t = target.unsqueeze(1)?;
            let score = output.gather(1, &t)?;
            let column = Tensor::arange(0i64, classes as i64, &output.device())?;
            let ahead = output
                .gt(&score)?
                .logical_or(&output.eq(&score)?.logical_and(&column.lt(&t)?)?)?;
            ahead.sum(1, false)?.lt(self.k as i64)?
        };
        accumulate(&mut self.correct, &correct.sum_all()?)?;
        self.n += target.numel();
        Ok(())
    }
    fn value(&self) -> Result<f64> {
        mean(&self.correct, self.n)
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
