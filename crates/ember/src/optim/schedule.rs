//! More learning-rate schedules, in closed form like [`StepLr`](super::StepLr):
//! linear warm-up (`LinearLR`), a closure (`LambdaLR`), schedules one after
//! another (`SequentialLR`), the one-cycle policy (`OneCycleLR`), and the
//! metric-driven `ReduceLROnPlateau`.

use super::{LrScheduler, Optimizer};
use crate::{Error, Result};

/// The learning rate times a factor going linearly from `start_factor` to
/// `end_factor` over `total_iters` epochs, then staying there (`LinearLR`; a
/// warm-up with `start_factor < 1`).
pub struct LinearLr {
    base: f64,
    start: f64,
    end: f64,
    total: usize,
    epoch: usize,
}

impl LinearLr {
    /// Starts from the optimizer's current learning rate (and sets it to
    /// `start_factor` times it, as PyTorch does at construction).
    pub fn new(
        opt: &mut dyn Optimizer,
        start_factor: f64,
        end_factor: f64,
        total_iters: usize,
    ) -> Result<LinearLr> {
        if !(start_factor > 0.0 && start_factor <= 1.0) {
            return Err(Error::invalid(
                "LinearLR",
                "Starting multiplicative factor expected to be greater than 0 and less or equal to 1.",
            ));
        }
        if !(0.0..=1.0).contains(&end_factor) {
            return Err(Error::invalid(
                "LinearLR",
                "Ending multiplicative factor expected to be between 0 and 1.",
            ));
        }
        let s = LinearLr {
            base: opt.lr(),
            start: start_factor,
            end: end_factor,
            total: total_iters,
            epoch: 0,
        };
        opt.set_lr(s.last_lr());
        Ok(s)
    }
}

impl LrScheduler for LinearLr {
    fn step(&mut self, opt: &mut dyn Optimizer) {
        self.epoch += 1;
        opt.set_lr(self.last_lr());
    }
    fn last_lr(&self) -> f64 {
        let t = if self.total == 0 {
            1.0
        } else {
            self.epoch.min(self.total) as f64 / self.total as f64
        };
        self.base * (self.start + (self.end - self.start) * t)
    }
    fn epoch(&self) -> usize {
        self.epoch
    }
    fn set_epoch(&mut self, epoch: usize) {
        self.epoch = epoch;
    }
}

/// The initial learning rate times `f(epoch)` (`LambdaLR`).
pub struct LambdaLr {
    base: f64,
    f: Box<dyn Fn(usize) -> f64 + Send>,
    epoch: usize,
}

impl LambdaLr {
    /// Sets the optimizer's rate to `f(0)` times it, as PyTorch does.
    pub fn new(opt: &mut dyn Optimizer, f: impl Fn(usize) -> f64 + Send + 'static) -> LambdaLr {
        let s = LambdaLr {
            base: opt.lr(),
            f: Box::new(f),
            epoch: 0,
        };
        opt.set_lr(s.last_lr());
        s
    }
}

impl LrScheduler for LambdaLr {
    fn step(&mut self, opt: &mut dyn Optimizer) {
        self.epoch += 1;
        opt.set_lr(self.last_lr());
    }
    fn last_lr(&self) -> f64 {
        self.base * (self.f)(self.epoch)
    }
    fn epoch(&self) -> usize {
        self.epoch
    }
    fn set_epoch(&mut self, epoch: usize) {
        self.epoch = epoch;
    }
}

/// Schedules one after another (`SequentialLR`): the first until `milestones[0]`,
/// the second (counting its epochs from 0 again) until `milestones[1]`, and so on.
/// Build every schedule from the same optimizer first (each reads the initial
/// rate), then combine them.
pub struct SequentialLr {
    schedulers: Vec<Box<dyn LrScheduler>>,
    milestones: Vec<usize>,
    epoch: usize,
}

impl SequentialLr {
    pub fn new(
        opt: &mut dyn Optimizer,
        schedulers: Vec<Box<dyn LrScheduler>>,
        milestones: Vec<usize>,
    ) -> Result<SequentialLr> {
        if schedulers.is_empty() || milestones.len() + 1 != schedulers.len() {
            return Err(Error::invalid(
                "SequentialLR",
                format!(
                    "Sequential Schedulers expects number of schedulers provided to be one more than the number of milestone points, but got number of schedulers {} and the number of milestones to be equal to {}",
                    schedulers.len(),
                    milestones.len()
                ),
            ));
        }
        if milestones.windows(2).any(|w| w[0] > w[1]) {
            return Err(Error::invalid(
                "SequentialLR",
                "milestones must be increasing",
            ));
        }
        let mut s = SequentialLr {
            schedulers,
            milestones,
            epoch: 0,
        };
        s.set_epoch(0);
        opt.set_lr(s.last_lr());
        Ok(s)
    }

    /// The schedule in charge at `epoch` and its own epoch count.
    fn current(&self, epoch: usize) -> (usize, usize) {
        let i = self.milestones.iter().filter(|&&m| m <= epoch).count();
        let start = if i == 0 { 0 } else { self.milestones[i - 1] };
        (i, epoch - start)
    }
}

impl LrScheduler for SequentialLr {
    fn step(&mut self, opt: &mut dyn Optimizer) {
        self.set_epoch(self.epoch + 1);
        opt.set_lr(self.last_lr());
    }
    fn last_lr(&self) -> f64 {
        self.schedulers[self.current(self.epoch).0].last_lr()
    }
    fn epoch(&self) -> usize {
        self.epoch
    }
    fn set_epoch(&mut self, epoch: usize) {
        self.epoch = epoch;
        let (i, e) = self.current(epoch);
        self.schedulers[i].set_epoch(e);
    }
}

/// The one-cycle policy (`OneCycleLR`, stepped once per batch): from
/// `max_lr / div_factor` up to `max_lr` over the first `pct_start` of
/// `total_steps` (cosine), then down to `initial / final_div_factor` (cosine).
/// PyTorch also cycles the momentum by default; ember's schedules set the
/// learning rate only. Steps past `total_steps` keep the final rate (PyTorch
/// raises an error there).
pub struct OneCycleLr {
    initial: f64,
    max_lr: f64,
    min_lr: f64,
    warmup_end: f64,
    total: usize,
    epoch: usize,
}

impl OneCycleLr {
    /// PyTorch's defaults are `pct_start = 0.3`, `div_factor = 25`,
    /// `final_div_factor = 1e4`. Sets the optimizer's rate to the initial one.
    pub fn new(
        opt: &mut dyn Optimizer,
        max_lr: f64,
        total_steps: usize,
        pct_start: f64,
        div_factor: f64,
        final_div_factor: f64,
    ) -> Result<OneCycleLr> {
        if total_steps == 0 {
            return Err(Error::invalid(
                "OneCycleLR",
                "Expected positive integer total_steps, but got 0",
            ));
        }
        if !(0.0..=1.0).contains(&pct_start) {
            return Err(Error::invalid(
                "OneCycleLR",
                format!("Expected float between 0 and 1 pct_start, but got {pct_start}"),
            ));
        }
        let initial = max_lr / div_factor;
        let s = OneCycleLr {
            initial,
            max_lr,
            min_lr: initial / final_div_factor,
            warmup_end: pct_start * total_steps as f64 - 1.0,
            total: total_steps,
            epoch: 0,
        };
        opt.set_lr(s.last_lr());
        Ok(s)
    }
}

/// Cosine from `start` (at `pct = 0`) to `end` (at `pct = 1`).
fn cos_anneal(start: f64, end: f64, pct: f64) -> f64 {
    end + (start - end) / 2.0 * ((std::f64::consts::PI * pct).cos() + 1.0)
}

impl LrScheduler for OneCycleLr {
    fn step(&mut self, opt: &mut dyn Optimizer) {
        self.epoch += 1;
        opt.set_lr(self.last_lr());
    }
    fn last_lr(&self) -> f64 {
        let step = self.epoch.min(self.total) as f64;
        let last = self.total as f64 - 1.0;
        if step <= self.warmup_end {
            cos_anneal(self.initial, self.max_lr, step / self.warmup_end)
        } else {
            let pct = (step - self.warmup_end) / (last - self.warmup_end);
            cos_anneal(self.max_lr, self.min_lr, pct.min(1.0))
        }
    }
    fn epoch(&self) -> usize {
        self.epoch
    }
    fn set_epoch(&mut self, epoch: usize) {
        self.epoch = epoch;
    }
}

/// Lowers the learning rate by `factor` when a metric has stopped improving for
/// `patience` epochs (`ReduceLROnPlateau`, mode `min`, relative threshold); after
/// a reduction, `cooldown` epochs pass before counting again; the rate never
/// goes below `min_lr`. Step it with the metric: [`step_metric`](Self::step_metric).
pub struct ReduceLrOnPlateau {
    pub factor: f64,
    pub patience: usize,
    pub threshold: f64,
    pub cooldown: usize,
    pub min_lr: f64,
    /// Reductions smaller than this are skipped (PyTorch's `eps`).
    pub eps: f64,
    /// `true` for a metric to maximise (accuracy), `false` to minimise (loss).
    pub maximize: bool,
    best: f64,
    bad_epochs: usize,
    cooldown_left: usize,
    epoch: usize,
}

impl ReduceLrOnPlateau {
    /// PyTorch's defaults: mode `min`, factor 0.1, patience 10, threshold 1e-4
    /// (relative), no cooldown, `min_lr` 0, `eps` 1e-8.
    pub fn new(factor: f64, patience: usize) -> Result<ReduceLrOnPlateau> {
        if factor >= 1.0 || factor <= 0.0 {
            return Err(Error::invalid(
                "ReduceLROnPlateau",
                "Factor should be < 1.0.",
            ));
        }
        Ok(ReduceLrOnPlateau {
            factor,
            patience,
            threshold: 1e-4,
            cooldown: 0,
            min_lr: 0.0,
            eps: 1e-8,
            maximize: false,
            best: f64::INFINITY,
            bad_epochs: 0,
            cooldown_left: 0,
            epoch: 0,
        })
    }

    /// A metric to maximise instead.
    pub fn maximize(mut self) -> Self {
        self.maximize = true;
        self.best = f64::NEG_INFINITY;
        self
    }

    fn better(&self, m: f64) -> bool {
        // PyTorch's relative rule, as it is written (also for negative metrics)
        if self.maximize {
            m > self.best * (1.0 + self.threshold)
        } else {
            m < self.best * (1.0 - self.threshold)
        }
    }

    /// One epoch with its metric; lowers the optimizer's rate when the patience
    /// runs out.
    pub fn step_metric(&mut self, opt: &mut dyn Optimizer, metric: f64) {
        self.epoch += 1;
        if self.better(metric) {
            self.best = metric;
            self.bad_epochs = 0;
        } else {
            self.bad_epochs += 1;
        }
        if self.cooldown_left > 0 {
            self.cooldown_left -= 1;
            self.bad_epochs = 0;
        }
        if self.bad_epochs > self.patience {
            let old = opt.lr();
            let new = (old * self.factor).max(self.min_lr);
            if old - new > self.eps {
                opt.set_lr(new);
            }
            self.cooldown_left = self.cooldown;
            self.bad_epochs = 0;
        }
    }

    /// Epochs stepped so far.
    pub fn epoch(&self) -> usize {
        self.epoch
    }
}
