//! Further learning-rate schedules of `torch.optim.lr_scheduler`: decay at
//! given epochs (`MultiStepLR`), every epoch (`ExponentialLR`), by a
//! polynomial (`PolynomialLR`) or by a closure (`MultiplicativeLR`); a constant
//! factor for a while (`ConstantLR`); cosine annealing with warm restarts
//! (`CosineAnnealingWarmRestarts`); the cyclical policy (`CyclicLR`); and
//! schedules stepped together (`ChainedScheduler`).
//!
//! `MultiStepLr`, `ExponentialLr`, `ConstantLr`, `PolynomialLr` and
//! `MultiplicativeLr` move each group's *current* rate at a step, as PyTorch's
//! do, so they compose with other schedules and with rates set by hand;
//! `CosineAnnealingWarmRestarts` and `CyclicLr` set their rates outright.
//!
//! ```
//! use ember::optim::{LrScheduler, MultiStepLr, Optimizer, Sgd};
//! use ember::prelude::*;
//! let w = Tensor::zeros([2], DType::F32, &Device::Cpu)?;
//! let mut opt = Sgd::new(vec![w], 0.1)?;
//! let mut s = MultiStepLr::new(&mut opt, vec![2, 4], 0.5)?;
//! for _ in 0..4 {
//!     s.step(&mut opt);
//! }
//! assert!((opt.lr() - 0.025).abs() < 1e-15);
//! # Ok::<(), ember::Error>(())
//! ```

use super::schedule::{chained_schedule, current_rates, group_rates, initial_rates, move_rates};
use super::{LrScheduler, Optimizer};
use crate::error::{Error, Result};

/// A factor a schedule multiplies by must be a finite number.
fn check_finite(op: &'static str, what: &str, v: f64) -> Result<()> {
    if !v.is_finite() {
        return Err(Error::invalid(
            op,
            format!("{what} must be a finite number, got {v}"),
        ));
    }
    Ok(())
}

chained_schedule!(
    MultiStepLr,
    ExponentialLr,
    ConstantLr,
    PolynomialLr,
    MultiplicativeLr
);

/// Multiplies the learning rate by `gamma` at each of the `milestones` epochs
/// (`torch.optim.lr_scheduler.MultiStepLR`). A milestone listed twice
/// multiplies by `gamma²` there, as PyTorch's counter of milestones does.
pub struct MultiStepLr {
    bases: Vec<f64>,
    /// Sorted, repeats kept.
    milestones: Vec<usize>,
    gamma: f64,
    epoch: usize,
    last: Vec<f64>,
}

impl MultiStepLr {
    /// Starts from the optimizer's current rates; a milestone at epoch 0 applies
    /// at once, as PyTorch's first step does. `gamma` must be finite.
    pub fn new(opt: &mut dyn Optimizer, milestones: Vec<usize>, gamma: f64) -> Result<MultiStepLr> {
        check_finite("MultiStepLR", "gamma", gamma)?;
        let mut milestones = milestones;
        milestones.sort_unstable();
        let mut s = MultiStepLr {
            bases: initial_rates(opt),
            milestones,
            gamma,
            epoch: 0,
            last: Vec::new(),
        };
        s.restart(opt);
        Ok(s)
    }

    /// How many milestones are at `epoch`.
    fn hits(&self, epoch: usize) -> usize {
        self.milestones.iter().filter(|&&m| m == epoch).count()
    }

    fn first(&self, lr: f64) -> f64 {
        self.next(lr, 0.0)
    }

    fn next(&self, lr: f64, _base: f64) -> f64 {
        match self.hits(self.epoch) {
            0 => lr,
            k => lr * self.gamma.powf(k as f64),
        }
    }

    fn closed(&self, base: f64) -> f64 {
        let passed = self.milestones.iter().filter(|&&m| m <= self.epoch).count();
        base * self.gamma.powf(passed as f64)
    }
}

/// Multiplies the learning rate by `gamma` every epoch
/// (`torch.optim.lr_scheduler.ExponentialLR`).
pub struct ExponentialLr {
    bases: Vec<f64>,
    gamma: f64,
    epoch: usize,
    last: Vec<f64>,
}

impl ExponentialLr {
    /// Starts from the optimizer's current rates (which it leaves as they
    /// are). `gamma` must be finite.
    pub fn new(opt: &dyn Optimizer, gamma: f64) -> Result<ExponentialLr> {
        check_finite("ExponentialLR", "gamma", gamma)?;
        Ok(ExponentialLr {
            bases: initial_rates(opt),
            gamma,
            epoch: 0,
            last: current_rates(opt),
        })
    }

    fn first(&self, lr: f64) -> f64 {
        lr
    }

    fn next(&self, lr: f64, _base: f64) -> f64 {
        lr * self.gamma
    }

    fn closed(&self, base: f64) -> f64 {
        base * self.gamma.powf(self.epoch as f64)
    }
}

/// The learning rate times `factor` until epoch `total_iters`, then the rate
/// itself again (`torch.optim.lr_scheduler.ConstantLR`; PyTorch's defaults
/// are a factor of 1/3 for 5 epochs).
pub struct ConstantLr {
    bases: Vec<f64>,
    factor: f64,
    total: usize,
    epoch: usize,
    last: Vec<f64>,
}

impl ConstantLr {
    /// Sets the optimizer's rates to `factor` times them, as PyTorch does at
    /// construction. `factor` must lie in [0, 1].
    pub fn new(opt: &mut dyn Optimizer, factor: f64, total_iters: usize) -> Result<ConstantLr> {
        if !(0.0..=1.0).contains(&factor) {
            return Err(Error::invalid(
                "ConstantLR",
                "Constant multiplicative factor expected to be between 0 and 1.",
            ));
        }
        let mut s = ConstantLr {
            bases: initial_rates(opt),
            factor,
            total: total_iters,
            epoch: 0,
            last: Vec::new(),
        };
        s.restart(opt);
        Ok(s)
    }

    fn first(&self, lr: f64) -> f64 {
        lr * self.factor
    }

    /// Divides the factor out again at `total_iters`. With a factor of 0
    /// there is nothing to divide (PyTorch raises a division by zero): the
    /// rate becomes the group's initial one, the closed form's.
    fn next(&self, lr: f64, base: f64) -> f64 {
        if self.epoch != self.total {
            lr
        } else if self.factor == 0.0 {
            base
        } else {
            lr * (1.0 / self.factor)
        }
    }

    fn closed(&self, base: f64) -> f64 {
        let after = if self.epoch >= self.total {
            1.0 - self.factor
        } else {
            0.0
        };
        base * (self.factor + after)
    }
}

/// Decays the learning rate to 0 over `total_iters` epochs along
/// `(1 - epoch / total_iters)^power`, then leaves it there
/// (`torch.optim.lr_scheduler.PolynomialLR`; PyTorch's defaults are 5 epochs
/// and power 1).
pub struct PolynomialLr {
    bases: Vec<f64>,
    total: usize,
    power: f64,
    epoch: usize,
    last: Vec<f64>,
}

impl PolynomialLr {
    /// Starts from the optimizer's current rates (which it leaves as they
    /// are). `power` must be finite. With `total_iters` 0 the rates stay as
    /// they are.
    pub fn new(opt: &dyn Optimizer, total_iters: usize, power: f64) -> Result<PolynomialLr> {
        check_finite("PolynomialLR", "power", power)?;
        Ok(PolynomialLr {
            bases: initial_rates(opt),
            total: total_iters,
            power,
            epoch: 0,
            last: current_rates(opt),
        })
    }

    fn first(&self, lr: f64) -> f64 {
        lr
    }

    /// The polynomial at this epoch over the last one's, until `total_iters`.
    fn next(&self, lr: f64, _base: f64) -> f64 {
        if self.epoch > self.total {
            return lr;
        }
        let (e, t) = (self.epoch as f64, self.total as f64);
        lr * ((1.0 - e / t) / (1.0 - (e - 1.0) / t)).powf(self.power)
    }

    fn closed(&self, base: f64) -> f64 {
        if self.total == 0 {
            return base;
        }
        let done = self.epoch.min(self.total) as f64;
        base * (1.0 - done / self.total as f64).powf(self.power)
    }
}

/// Multiplies the learning rate by `f(epoch)` at each step
/// (`torch.optim.lr_scheduler.MultiplicativeLR`); one closure for every group.
/// PyTorch has no closed form for it: [`LrScheduler::set_epoch`] gives the
/// initial rate times `f(1)·f(2)···f(epoch)`, what stepping from the start
/// gives.
pub struct MultiplicativeLr {
    bases: Vec<f64>,
    f: Box<dyn Fn(usize) -> f64 + Send>,
    epoch: usize,
    last: Vec<f64>,
}

impl MultiplicativeLr {
    /// Starts from the optimizer's current rates (which it leaves as they are).
    pub fn new(opt: &dyn Optimizer, f: impl Fn(usize) -> f64 + Send + 'static) -> MultiplicativeLr {
        MultiplicativeLr {
            bases: initial_rates(opt),
            f: Box::new(f),
            epoch: 0,
            last: current_rates(opt),
        }
    }

    fn first(&self, lr: f64) -> f64 {
        lr
    }

    fn next(&self, lr: f64, _base: f64) -> f64 {
        lr * (self.f)(self.epoch)
    }

    fn closed(&self, base: f64) -> f64 {
        (1..=self.epoch).fold(base, |lr, e| lr * (self.f)(e))
    }
}

/// Cosine annealing from each group's initial rate down to `eta_min` over
/// `t_0` epochs, then again from the top over `t_0·t_mult`, `t_0·t_mult²`, ...
/// epochs (SGDR, `torch.optim.lr_scheduler.CosineAnnealingWarmRestarts`). The
/// rates are set outright from the initial ones at each step. It may be
/// stepped with a fractional epoch ([`step_at`](Self::step_at), PyTorch's
/// `step(epoch + i / iters)` within an epoch).
pub struct CosineAnnealingWarmRestarts {
    bases: Vec<f64>,
    t_0: usize,
    t_mult: usize,
    eta_min: f64,
    /// Epochs since the last restart, and the length of the current cycle
    /// (PyTorch's `T_cur` and `T_i`).
    t_cur: f64,
    t_i: f64,
    epoch: usize,
}

impl CosineAnnealingWarmRestarts {
    /// Sets the optimizer's rates to the groups' initial ones (PyTorch's first
    /// step). `t_0` must be positive, `t_mult` at least 1 and `eta_min` finite.
    pub fn new(
        opt: &mut dyn Optimizer,
        t_0: usize,
        t_mult: usize,
        eta_min: f64,
    ) -> Result<CosineAnnealingWarmRestarts> {
        if t_0 == 0 {
            return Err(Error::invalid(
                "CosineAnnealingWarmRestarts",
                "Expected positive integer T_0, but got 0",
            ));
        }
        if t_mult == 0 {
            return Err(Error::invalid(
                "CosineAnnealingWarmRestarts",
                "Expected integer T_mult >= 1, but got 0",
            ));
        }
        if !eta_min.is_finite() {
            return Err(Error::invalid(
                "CosineAnnealingWarmRestarts",
                format!("Expected float or int eta_min, but got {eta_min}"),
            ));
        }
        let mut s = CosineAnnealingWarmRestarts {
            bases: initial_rates(opt),
            t_0,
            t_mult,
            eta_min,
            t_cur: 0.0,
            t_i: t_0 as f64,
            epoch: 0,
        };
        s.restart(opt);
        Ok(s)
    }

    /// Epochs since the last restart (PyTorch's `T_cur`, fractional after
    /// [`step_at`](Self::step_at)).
    pub fn t_cur(&self) -> f64 {
        self.t_cur
    }

    /// The length of the current cycle (PyTorch's `T_i`).
    pub fn t_i(&self) -> f64 {
        self.t_i
    }

    /// Jumps to `epoch`, which may be fractional, and sets the optimizer's
    /// rates there (PyTorch's `step(epoch)`); `epoch()` becomes its floor. A
    /// negative or non-finite epoch is refused ("Expected non-negative epoch").
    pub fn step_at(&mut self, opt: &mut dyn Optimizer, epoch: f64) -> Result<()> {
        if !(epoch.is_finite() && epoch >= 0.0) {
            return Err(Error::invalid(
                "CosineAnnealingWarmRestarts",
                format!("Expected non-negative epoch, but got {epoch}"),
            ));
        }
        self.jump(epoch);
        opt.set_group_lrs(&self.last_lrs());
        Ok(())
    }

    /// `T_cur` and `T_i` at `epoch`: the cycles that fit before it are
    /// counted exactly (PyTorch takes a floating-point logarithm, which can
    /// land one cycle short at a restart for some `t_mult`).
    fn jump(&mut self, epoch: f64) {
        let (mut start, mut len) = (0.0, self.t_0 as f64);
        if self.t_mult == 1 {
            start = epoch - epoch % len;
        } else {
            while start + len <= epoch {
                start += len;
                len *= self.t_mult as f64;
            }
        }
        self.t_cur = epoch - start;
        self.t_i = len;
        self.epoch = epoch.floor() as usize;
    }

    fn rate(&self, base: f64) -> f64 {
        let c = (std::f64::consts::PI * self.t_cur / self.t_i).cos();
        self.eta_min + (base - self.eta_min) * (1.0 + c) / 2.0
    }
}

impl LrScheduler for CosineAnnealingWarmRestarts {
    fn step(&mut self, opt: &mut dyn Optimizer) {
        self.epoch += 1;
        self.t_cur += 1.0;
        if self.t_cur >= self.t_i {
            self.t_cur %= self.t_i;
            self.t_i *= self.t_mult as f64;
        }
        opt.set_group_lrs(&self.last_lrs());
    }
    fn last_lr(&self) -> f64 {
        self.rate(self.bases[0])
    }
    fn last_lrs(&self) -> Vec<f64> {
        group_rates(&self.bases, |b| self.rate(b))
    }
    fn epoch(&self) -> usize {
        self.epoch
    }
    fn set_epoch(&mut self, epoch: usize) {
        self.jump(epoch as f64);
    }
}

/// The shape of [`CyclicLr`]'s cycles (PyTorch's `mode`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CyclicMode {
    /// The same triangle every cycle (`"triangular"`, the default).
    Triangular,
    /// The triangle's height halves each cycle (`"triangular2"`).
    Triangular2,
    /// The height times `gamma^iteration` (`"exp_range"`).
    ExpRange,
}

/// The settings of [`CyclicLr`] other than the two rates; `Default` gives
/// PyTorch's.
#[derive(Clone, Copy, Debug)]
pub struct CyclicOptions {
    /// Steps from the base rate up to the peak (2000).
    pub step_size_up: usize,
    /// Steps back down (`None`: as many as up).
    pub step_size_down: Option<usize>,
    pub mode: CyclicMode,
    /// [`CyclicMode::ExpRange`]'s decay per step (1).
    pub gamma: f64,
    /// Vary the momentum inversely to the rate (true): SGD's and RMSprop's
    /// momentum, the first beta of the Adam family; an optimizer without
    /// one is refused.
    pub cycle_momentum: bool,
    /// The momentum at the peak rate (0.8).
    pub base_momentum: f64,
    /// The momentum at the base rate (0.9).
    pub max_momentum: f64,
}

impl Default for CyclicOptions {
    fn default() -> Self {
        CyclicOptions {
            step_size_up: 2000,
            step_size_down: None,
            mode: CyclicMode::Triangular,
            gamma: 1.0,
            cycle_momentum: true,
            base_momentum: 0.8,
            max_momentum: 0.9,
        }
    }
}

/// The cyclical learning-rate policy (`torch.optim.lr_scheduler.CyclicLR`,
/// stepped once per batch): each group's rate goes from its base rate up to
/// its peak over `step_size_up` steps and back down over `step_size_down`,
/// the height scaled by the mode, while the momentum goes the other way
/// between `max_momentum` and `base_momentum`. The rates are set outright.
pub struct CyclicLr {
    bases: Vec<f64>,
    peaks: Vec<f64>,
    total: f64,
    ratio: f64,
    o: CyclicOptions,
    epoch: usize,
}

impl CyclicLr {
    /// Every group from `base_lr` to `max_lr`. Sets the optimizer's rates to
    /// `base_lr` (and its momentum to `max_momentum`), as PyTorch does.
    pub fn new(
        opt: &mut dyn Optimizer,
        base_lr: f64,
        max_lr: f64,
        o: CyclicOptions,
    ) -> Result<CyclicLr> {
        let n = current_rates(opt).len();
        CyclicLr::with_group_lrs(opt, &vec![base_lr; n], &vec![max_lr; n], o)
    }

    /// Each group from its own base rate to its own peak (PyTorch's lists of
    /// `base_lr` and `max_lr`), one of each per group.
    pub fn with_group_lrs(
        opt: &mut dyn Optimizer,
        base_lrs: &[f64],
        max_lrs: &[f64],
        o: CyclicOptions,
    ) -> Result<CyclicLr> {
        let groups = current_rates(opt).len();
        for (name, v) in [("base_lr", base_lrs), ("max_lr", max_lrs)] {
            if v.len() != groups {
                return Err(Error::invalid(
                    "CyclicLR",
                    format!(
                        "{name} must have the same length as optimizer.param_groups. {name} has {} values, param_groups has {groups}.",
                        v.len()
                    ),
                ));
            }
            if let Some(bad) = v.iter().find(|r| !(r.is_finite() && **r >= 0.0)) {
                return Err(Error::invalid(
                    "CyclicLR",
                    format!("Invalid learning rate: {bad} ({name} must be a finite number >= 0)"),
                ));
            }
        }
        if o.step_size_up == 0 {
            // (PyTorch divides by zero at its first step)
            return Err(Error::invalid("CyclicLR", "step_size_up must be positive"));
        }
        check_finite("CyclicLR", "gamma", o.gamma)?;
        if o.cycle_momentum {
            let Some(had) = opt.cycled_momentum() else {
                return Err(Error::invalid(
                    "CyclicLR",
                    "optimizer must support momentum or beta1 with `cycle_momentum` option enabled",
                ));
            };
            // both ends checked by the optimizer; on a refusal it keeps its own
            if let Err(e) = opt
                .set_cycled_momentum(o.base_momentum)
                .and_then(|()| opt.set_cycled_momentum(o.max_momentum))
            {
                let _ = opt.set_cycled_momentum(had);
                return Err(e);
            }
        }
        let up = o.step_size_up as f64;
        let down = o.step_size_down.map_or(up, |d| d as f64);
        opt.set_group_lrs(base_lrs);
        // the base rates become the groups' initial ones unless a schedule
        // recorded some before (PyTorch's `initial_lr`, set if absent)
        initial_rates(opt);
        let s = CyclicLr {
            bases: base_lrs.to_vec(),
            peaks: max_lrs.to_vec(),
            total: up + down,
            ratio: up / (up + down),
            o,
            epoch: 0,
        };
        s.apply(opt);
        Ok(s)
    }

    /// Where in the triangle the current step is (0 at the base, 1 at the
    /// peak) times the mode's scale.
    fn height(&self) -> f64 {
        let e = self.epoch as f64;
        let cycle = (1.0 + e / self.total).floor();
        let x = 1.0 + e / self.total - cycle;
        let along = if x <= self.ratio {
            x / self.ratio
        } else {
            (x - 1.0) / (self.ratio - 1.0)
        };
        let scale = match self.o.mode {
            CyclicMode::Triangular => 1.0,
            CyclicMode::Triangular2 => 1.0 / 2f64.powf(cycle - 1.0),
            CyclicMode::ExpRange => self.o.gamma.powf(e),
        };
        along * scale
    }

    /// The momentum set by the last step, if the schedule cycles it.
    pub fn last_momentum(&self) -> Option<f64> {
        self.o.cycle_momentum.then(|| {
            let (lo, hi) = (self.o.base_momentum, self.o.max_momentum);
            hi - (hi - lo) * self.height()
        })
    }

    fn apply(&self, opt: &mut dyn Optimizer) {
        opt.set_group_lrs(&self.last_lrs());
        if let Some(m) = self.last_momentum() {
            // between the two values checked in `with_group_lrs`, except for
            // an ExpRange gamma above 1, which the optimizer may refuse
            let _ = opt.set_cycled_momentum(m);
        }
    }
}

impl LrScheduler for CyclicLr {
    fn step(&mut self, opt: &mut dyn Optimizer) {
        self.epoch += 1;
        self.apply(opt);
    }
    fn last_lr(&self) -> f64 {
        self.last_lrs()[0]
    }
    fn last_lrs(&self) -> Vec<f64> {
        let h = self.height();
        self.bases
            .iter()
            .zip(&self.peaks)
            .map(|(&b, &m)| b + (m - b) * h)
            .collect()
    }
    fn epoch(&self) -> usize {
        self.epoch
    }
    fn set_epoch(&mut self, epoch: usize) {
        self.epoch = epoch;
    }
    /// Also sets the momentum at `epoch`.
    fn step_to(&mut self, opt: &mut dyn Optimizer, epoch: usize) {
        self.epoch = epoch;
        self.apply(opt);
    }
}

/// Several schedules stepped together on one optimizer, each in turn
/// (`torch.optim.lr_scheduler.ChainedScheduler`): with schedules that
/// multiply the current rate (`ExponentialLr`, `ConstantLr`, `LinearLr`, ...)
/// their factors multiply. Build every schedule from the same optimizer first.
pub struct ChainedScheduler {
    schedulers: Vec<Box<dyn LrScheduler>>,
    bases: Vec<f64>,
    last: Vec<f64>,
    epoch: usize,
}

impl ChainedScheduler {
    /// At least one schedule (PyTorch's "expects at least one scheduler to be
    /// chained").
    pub fn new(
        opt: &dyn Optimizer,
        schedulers: Vec<Box<dyn LrScheduler>>,
    ) -> Result<ChainedScheduler> {
        if schedulers.is_empty() {
            return Err(Error::invalid(
                "ChainedScheduler",
                "ChainedScheduler expects at least one scheduler to be chained, but got no scheduler.",
            ));
        }
        Ok(ChainedScheduler {
            schedulers,
            bases: initial_rates(opt),
            last: current_rates(opt),
            epoch: 0,
        })
    }
}

impl LrScheduler for ChainedScheduler {
    fn step(&mut self, opt: &mut dyn Optimizer) {
        self.epoch += 1;
        for s in &mut self.schedulers {
            s.step(opt);
        }
        self.last = current_rates(opt);
    }
    fn last_lr(&self) -> f64 {
        self.last[0]
    }
    fn last_lrs(&self) -> Vec<f64> {
        self.last.clone()
    }
    fn epoch(&self) -> usize {
        self.epoch
    }
    /// Every schedule to `epoch`; the rates are the initial ones times each
    /// schedule's factor there (its closed form over the initial rate), which
    /// is the chain's closed form for schedules that multiply.
    fn set_epoch(&mut self, epoch: usize) {
        self.epoch = epoch;
        let mut rates = self.bases.clone();
        for s in &mut self.schedulers {
            s.set_epoch(epoch);
            for ((r, &b), l) in rates.iter_mut().zip(&self.bases).zip(s.last_lrs()) {
                *r = if b == 0.0 { 0.0 } else { *r * (l / b) };
            }
        }
        self.last = rates;
    }
}
