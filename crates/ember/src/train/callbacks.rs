//! Things done at the end of each epoch: checkpoints, early stopping.

use super::History;
use crate::nn::Module;
use crate::optim::{LrScheduler, Optimizer};
use crate::{
    error::{Error, Result},
    tensor::Tensor,
};
use std::path::{Path, PathBuf};

/// What a callback sees at the end of an epoch.
pub struct EpochEnd<'a> {
    /// Epochs completed (1-based number of the epoch that just ended).
    pub epoch: usize,
    pub history: &'a History,
    pub model: &'a dyn Module,
    pub optimizer: &'a dyn Optimizer,
    pub scheduler: Option<&'a dyn LrScheduler>,
    /// The run's configuration ([`Trial::run_config`](super::Trial::run_config)),
    /// which a [`Checkpoint`] records.
    pub config: &'a [(String, String)],
    /// The loss scaler of float16 training ([`Trial::amp`](super::Trial::amp)),
    /// whose state a [`Checkpoint`] keeps.
    pub grad_scaler: Option<&'a crate::optim::GradScaler>,
}

/// Whether training goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    Continue,
    Stop,
}

/// Called by [`Trial::run`](super::Trial::run) after each epoch's record is added.
pub trait Callback: Send {
    fn on_epoch_end(&mut self, ctx: &EpochEnd) -> Result<Control>;

    /// Called by [`Trial::run`](super::Trial::run) before the first epoch with
    /// the metric names each epoch will record (`loss`, `acc`, ..., and
    /// `val_loss`, ... with a validation loader): an error here (a metric
    /// watched that no epoch records) stops the run before it trains. Accepts
    /// everything by default.
    fn check_metrics(&self, recorded: &[String]) -> Result<()> {
        let _ = recorded;
        Ok(())
    }

    /// Called by [`Trial::run`](super::Trial::run) before the first epoch,
    /// after [`check_metrics`](Self::check_metrics): an error here (a folder
    /// that cannot be written) stops the run before it trains. Does nothing by
    /// default.
    fn on_train_begin(&mut self) -> Result<()> {
        Ok(())
    }
}

/// Saves everything needed to resume after every epoch: `last.safetensors` (model
/// parameters and buffers, optimizer state, the epoch count and the scheduler's
/// position) and `history.csv` in `dir`. [`Trial::resume`](super::Trial::resume)
/// reads them back.
pub struct Checkpoint {
    dir: PathBuf,
}

impl Checkpoint {
    /// Checkpoints into `dir` (created if missing).
    pub fn new(dir: impl AsRef<Path>) -> Checkpoint {
        Checkpoint {
            dir: dir.as_ref().to_path_buf(),
        }
    }

    /// The checkpoint file in `dir`.
    pub fn file(dir: impl AsRef<Path>) -> PathBuf {
        dir.as_ref().join("last.safetensors")
    }

    /// The history file in `dir`.
    pub fn history_file(dir: impl AsRef<Path>) -> PathBuf {
        dir.as_ref().join("history.csv")
    }
}

/// Makes `dir` (and its parents) if missing and checks that a file can be
/// written in it, before any training: the errors say which folder and what
/// to do.
fn writable_dir(dir: &Path) -> Result<()> {
    let advice = "the Checkpoint folder, checked before training: choose a folder that can \
                  be written, or make this one writable";
    if dir.exists() && !dir.is_dir() {
        return Err(Error::invalid(
            "Checkpoint",
            format!(
                "{}: this is a file, and a folder is needed ({advice})",
                dir.display()
            ),
        ));
    }
    let io = |e| Error::Io {
        path: format!("{} ({advice})", dir.display()),
        source: e,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    // a probe file of this process and thread (ranks of one run may check the
    // same folder at once), removed at once
    let probe = dir.join(format!(
        ".ember-write-check-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::write(&probe, b"").map_err(io)?;
    std::fs::remove_file(&probe).map_err(io)
}

impl Callback for Checkpoint {
    /// Makes the folder if missing and checks that it can be written: a run
    /// that could not save fails before its first epoch, not after it.
    fn on_train_begin(&mut self) -> Result<()> {
        writable_dir(&self.dir)
    }

    fn on_epoch_end(&mut self, ctx: &EpochEnd) -> Result<Control> {
        // a diverged run stops here, its last good checkpoint kept: a checkpoint
        // of NaN parameters would not load (nor resume) without overrides
        // (the optimizer's state too)
        if let Some(name) = crate::io::first_non_finite_state(ctx.model, ctx.optimizer)? {
            return Err(Error::invalid(
                "Checkpoint",
                format!(
                    "after epoch {}, {name} holds NaN or infinite values (the training \
                     diverged: a smaller learning rate may help); nothing was saved, and a \
                     checkpoint of an earlier epoch in {} is kept",
                    ctx.epoch,
                    self.dir.display()
                ),
            ));
        }
        std::fs::create_dir_all(&self.dir).map_err(|e| Error::Io {
            path: self.dir.display().to_string(),
            source: e,
        })?;
        let cpu = crate::device::Device::Cpu;
        let mut extra = vec![("epoch".to_string(), Tensor::scalar(ctx.epoch as i64, &cpu)?)];
        if let Some(s) = ctx.scheduler {
            extra.push((
                "scheduler_epoch".to_string(),
                Tensor::scalar(s.epoch() as i64, &cpu)?,
            ));
        }
        if let Some(s) = ctx.grad_scaler {
            for (k, v) in s.state_dict() {
                extra.push((format!("grad_scaler.{k}"), Tensor::scalar(v, &cpu)?));
            }
        }
        // the history first: a crash between the two writes leaves a checkpoint
        // that is at most one epoch behind its history, never ahead of it
        ctx.history.write_csv(Self::history_file(&self.dir))?;
        let meta: Vec<(String, String)> = ctx
            .config
            .iter()
            .map(|(k, v)| (format!("config.{k}"), v.clone()))
            .collect();
        crate::io::save_checkpoint_full(
            ctx.model,
            ctx.optimizer,
            &extra,
            &meta,
            Self::file(&self.dir),
        )?;
        Ok(Control::Continue)
    }
}

/// Whether a smaller or a larger value of the monitored metric is better.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Min,
    Max,
}

/// Stops training when a metric has not improved by more than `min_delta` for
/// `patience` epochs (torchbearer's / Keras' `EarlyStopping`).
pub struct EarlyStopping {
    monitor: String,
    patience: usize,
    min_delta: f64,
    mode: Mode,
    best: Option<f64>,
    waited: usize,
}

impl EarlyStopping {
    /// Watches `monitor` (for example `"val_loss"`, minimised, or `"val_acc"`,
    /// maximised): the mode follows from the name as in torchbearer's and Keras'
    /// `mode="auto"`, `Mode::Max` for a name that contains `acc` (`val_acc`,
    /// `top_5_acc`), `Mode::Min` otherwise. The name is a column of the history:
    /// the `"accuracy"` metric is recorded as `acc` (`val_acc` on the
    /// validation loader). [`Trial::run`](super::Trial::run) refuses a name that
    /// no epoch records before it trains.
    pub fn new(monitor: &str, patience: usize) -> EarlyStopping {
        let mode = if monitor.contains("acc") {
            Mode::Max
        } else {
            Mode::Min
        };
        EarlyStopping {
            monitor: monitor.to_string(),
            patience,
            min_delta: 0.0,
            mode,
            best: None,
            waited: 0,
        }
    }

    /// The least change that counts as an improvement.
    pub fn min_delta(mut self, d: f64) -> EarlyStopping {
        self.min_delta = d.abs();
        self
    }

    /// Overrides the direction.
    pub fn mode(mut self, mode: Mode) -> EarlyStopping {
        self.mode = mode;
        self
    }

    /// The best value seen so far (`None` before any value improved on the
    /// mode's worst, infinity; a NaN never does).
    pub fn best(&self) -> Option<f64> {
        self.best
    }

    /// Whether it looks for a smaller or a larger value (from the name, or as
    /// set by [`mode`](Self::mode)).
    pub fn direction(&self) -> Mode {
        self.mode
    }
}

/// Refuses a `monitor` that no epoch records (`recorded`: the history's
/// columns), with a hint where it is a validation metric and there is no
/// validation loader.
pub(crate) fn check_recorded(who: &'static str, monitor: &str, recorded: &[String]) -> Result<()> {
    if recorded.iter().any(|r| r == monitor) {
        return Ok(());
    }
    let hint = if monitor.starts_with("val_") && !recorded.iter().any(|n| n.starts_with("val_")) {
        " (a val_ metric needs a validation loader)"
    } else {
        ""
    };
    Err(Error::invalid(
        who,
        format!("metric {monitor:?} is not recorded{hint}: the epochs record {recorded:?}"),
    ))
}

impl Callback for EarlyStopping {
    fn check_metrics(&self, recorded: &[String]) -> Result<()> {
        check_recorded("EarlyStopping", &self.monitor, recorded)
    }

    fn on_epoch_end(&mut self, ctx: &EpochEnd) -> Result<Control> {
        let record = ctx.history.last().ok_or_else(|| {
            Error::invalid("EarlyStopping", "called before any epoch was recorded")
        })?;
        if record.get(&self.monitor).is_none() {
            return Err(Error::invalid(
                "EarlyStopping",
                format!(
                    "metric {:?} is not recorded (have {:?})",
                    self.monitor,
                    record.metrics.iter().map(|(n, _)| n).collect::<Vec<_>>()
                ),
            ));
        }
        // the best value and the epochs waited since, from the whole history:
        // a resumed run (whose history is restored) decides as an uninterrupted one
        (self.best, self.waited) = (None, 0);
        for value in ctx
            .history
            .records
            .iter()
            .filter_map(|r| r.get(&self.monitor))
        {
            // from the mode's worst value (torchbearer's and Keras' ±inf): a
            // NaN is no improvement, not a best that nothing beats
            let improved = match self.mode {
                Mode::Min => value < self.best.unwrap_or(f64::INFINITY) - self.min_delta,
                Mode::Max => value > self.best.unwrap_or(f64::NEG_INFINITY) + self.min_delta,
            };
            if improved {
                self.best = Some(value);
                self.waited = 0;
            } else {
                self.waited += 1;
            }
        }
        Ok(if self.waited >= self.patience && self.waited > 0 {
            Control::Stop
        } else {
            Control::Continue
        })
    }
}
