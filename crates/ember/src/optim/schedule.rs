// Over 800 lines: every learning-rate schedule on the one LrScheduler trait, each with PyTorch's step rule and closed form side by side.
//! More learning-rate schedules: linear warm-up (`LinearLR`), a closure
//! (`LambdaLR`), schedules one after another (`SequentialLR`), the one-cycle
//! policy (`OneCycleLR`), and the metric-driven `ReduceLROnPlateau`.
//!
//! As PyTorch's, a step of [`StepLr`](super::StepLr),
//! [`CosineAnnealingLr`](super::CosineAnnealingLr) and [`LinearLr`] changes
//! each group's *current* rate (times a factor, or along the cosine from where
//! it is): two schedules stepped together compose, and a rate set by hand
//! between steps is built on. [`LrScheduler::set_epoch`] and
//! [`LrScheduler::step_to`] give the closed form at an epoch instead, from the
//! initial rates (PyTorch's `step(epoch)`). `LambdaLR` and `OneCycleLR` set
//! their rates outright, as PyTorch's do.

use super::Optimizer;
use crate::error::{Error, Result};

/// Changes an optimizer's learning rate once per epoch (`scheduler.step()`), in
/// every parameter group: each group follows the schedule from its own initial
/// rate, as PyTorch's schedulers do.
pub trait LrScheduler: Send {
    /// Advances one epoch and sets the optimizer's learning rates for the next
    /// one (from the groups' current rates, for the schedules PyTorch chains).
    fn step(&mut self, opt: &mut dyn Optimizer);
    /// The first group's learning rate set by the last step (the rate the
    /// schedule started with before any step; after
    /// [`set_epoch`](Self::set_epoch), the closed form's at that epoch).
    fn last_lr(&self) -> f64;
    /// Every group's learning rate set by the last step (as
    /// [`last_lr`](Self::last_lr)).
    fn last_lrs(&self) -> Vec<f64> {
        vec![self.last_lr()]
    }
    /// Epochs stepped so far.
    fn epoch(&self) -> usize;
    /// Jumps to `epoch` (to resume from a checkpoint) without touching the
    /// optimizer: [`last_lrs`](Self::last_lrs) becomes the closed form's at
    /// `epoch` (PyTorch's `_get_closed_form_lr`), and the next
    /// [`step`](Self::step) goes on from the groups' rates then (those a
    /// loaded optimizer state restored).
    fn set_epoch(&mut self, epoch: usize);
    /// Jumps to `epoch` and sets the optimizer's rates to the closed form's
    /// there (PyTorch's deprecated `step(epoch)`).
    fn step_to(&mut self, opt: &mut dyn Optimizer, epoch: usize) {
        self.set_epoch(epoch);
        opt.set_group_lrs(&self.last_lrs());
    }
    /// Goes back to epoch 0 and sets the rates the schedule starts with from
    /// the groups' current ones, as building it did (PyTorch's
    /// `_initial_step`, which `SequentialLR` runs on its first schedule). The
    /// default sets the closed form's at epoch 0.
    fn restart(&mut self, opt: &mut dyn Optimizer) {
        self.step_to(opt, 0);
    }
}

/// Each group's current learning rate (the optimizer's `lr()` alone if it
/// lists no groups).
pub(super) fn current_rates(opt: &dyn Optimizer) -> Vec<f64> {
    let lrs = opt.group_lrs();
    if lrs.is_empty() {
        vec![opt.lr()]
    } else {
        lrs
    }
}

/// The rates a schedule starts from: those recorded when the optimizer's first
/// schedule was built, or else the groups' current rates, which are then
/// recorded (PyTorch's `initial_lr`, set by the first scheduler).
pub(super) fn initial_rates(opt: &dyn Optimizer) -> Vec<f64> {
    let now = current_rates(opt);
    match opt.initial_lrs() {
        Some(r) if r.len() == now.len() => r,
        _ => {
            opt.record_initial_lrs(&now);
            now
        }
    }
}

/// An optimizer's [`Optimizer::initial_lrs`], set through `&self` as schedules
/// are built from a shared reference.
#[derive(Default)]
pub(crate) struct InitialLrs(std::sync::Mutex<Option<Vec<f64>>>);

impl InitialLrs {
    pub(crate) fn get(&self) -> Option<Vec<f64>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn record(&self, lrs: &[f64]) {
        self.set(Some(lrs.to_vec()));
    }

    /// Replaces what is recorded (a loaded state's, or none).
    pub(crate) fn set(&self, lrs: Option<Vec<f64>>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = lrs;
    }
}

/// The rates a closed-form schedule gives each group at its epoch: `rate(base)`
/// for each group's initial rate.
pub(super) fn group_rates(bases: &[f64], rate: impl Fn(f64) -> f64) -> Vec<f64> {
    bases.iter().map(|&b| rate(b)).collect()
}

/// Sets each group's rate to `rate(its current rate, its initial rate)`;
/// returns the rates the optimizer then holds (PyTorch reads them back).
pub(super) fn move_rates(
    opt: &mut dyn Optimizer,
    bases: &[f64],
    rate: impl Fn(f64, f64) -> f64,
) -> Vec<f64> {
    let lrs: Vec<f64> = current_rates(opt)
        .into_iter()
        .zip(bases)
        .map(|(lr, &b)| rate(lr, b))
        .collect();
    opt.set_group_lrs(&lrs);
    current_rates(opt)
}

/// The `LrScheduler` of a schedule PyTorch chains. A step moves each group
/// from its current rate `lr` to `next(lr, base)` at the new epoch (`base`:
/// the group's initial rate), as PyTorch's `get_lr`; `set_epoch` gives
/// `closed(base)` at the epoch (`_get_closed_form_lr`); the schedule starts at
/// `first(lr)` from each group's current rate (the initial step).
macro_rules! chained_schedule {
    ($($name:ident),*) => {$(
        impl LrScheduler for $name {
            fn step(&mut self, opt: &mut dyn Optimizer) {
                self.epoch += 1;
                self.last = move_rates(opt, &self.bases, |lr, base| self.next(lr, base));
            }

            fn epoch(&self) -> usize {
                self.epoch
            }

            fn set_epoch(&mut self, epoch: usize) {
                self.epoch = epoch;
                self.last = group_rates(&self.bases, |b| self.closed(b));
            }

            fn last_lr(&self) -> f64 {
                self.last[0]
            }

            fn last_lrs(&self) -> Vec<f64> {
                self.last.clone()
            }

            fn restart(&mut self, opt: &mut dyn Optimizer) {
                self.epoch = 0;
                self.last = move_rates(opt, &self.bases, |lr, _| self.first(lr));
            }
        }
    )*};
}
chained_schedule!(StepLr, CosineAnnealingLr, LinearLr);
// (also used by the schedules of schedule_more.rs)
pub(super) use chained_schedule;

/// Multiplies the learning rate by `gamma` every `step_size` epochs (`StepLR`).
pub struct StepLr {
    bases: Vec<f64>,
    step_size: usize,
    gamma: f64,
    epoch: usize,
    last: Vec<f64>,
}

impl StepLr {
    /// Starts from the optimizer's current learning rates (which it leaves as
    /// they are).
    pub fn new(opt: &dyn Optimizer, step_size: usize, gamma: f64) -> Result<StepLr> {
        if step_size == 0 {
            return Err(Error::invalid("StepLR", "step_size must be positive"));
        }
        Ok(StepLr {
            bases: initial_rates(opt),
            step_size,
            gamma,
            epoch: 0,
            last: current_rates(opt),
        })
    }

    fn first(&self, lr: f64) -> f64 {
        lr
    }

    /// Times `gamma` at each multiple of `step_size`.
    fn next(&self, lr: f64, _base: f64) -> f64 {
        if !self.epoch.is_multiple_of(self.step_size) {
            lr
        } else {
            lr * self.gamma
        }
    }

    fn closed(&self, base: f64) -> f64 {
        // (`powf`: PyTorch's `gamma ** n` is C's `pow`)
        base * self.gamma.powf((self.epoch / self.step_size) as f64)
    }
}

/// Cosine annealing from the initial rate down to `eta_min` over `t_max` epochs,
/// then back up over the next `t_max` and so on (`CosineAnnealingLR`). A step
/// follows PyTorch's recursive form from the current rate; the closed form is
/// `eta_min + (base - eta_min) (1 + cos(π epoch / t_max)) / 2`.
pub struct CosineAnnealingLr {
    bases: Vec<f64>,
    t_max: usize,
    eta_min: f64,
    epoch: usize,
    last: Vec<f64>,
}

impl CosineAnnealingLr {
    /// Starts from the optimizer's current learning rates (which it leaves as
    /// they are).
    pub fn new(opt: &dyn Optimizer, t_max: usize, eta_min: f64) -> Result<CosineAnnealingLr> {
        if t_max == 0 {
            return Err(Error::invalid(
                "CosineAnnealingLR",
                "T_max must be positive",
            ));
        }
        Ok(CosineAnnealingLr {
            bases: initial_rates(opt),
            t_max,
            eta_min,
            epoch: 0,
            last: current_rates(opt),
        })
    }

    fn first(&self, lr: f64) -> f64 {
        lr
    }

    /// The ratio of the cosine at this epoch to the last one's, applied above
    /// `eta_min`; the step out of the bottom (where that ratio would divide by
    /// zero) adds the first step's change instead, as PyTorch does.
    fn next(&self, lr: f64, base: f64) -> f64 {
        let (e, t) = (self.epoch as f64, self.t_max as f64);
        let pi = std::f64::consts::PI;
        let (epoch, t_max) = (self.epoch as i128, self.t_max as i128);
        if (epoch - 1 - t_max).rem_euclid(2 * t_max) == 0 {
            lr + (base - self.eta_min) * (1.0 - (pi / t).cos()) / 2.0
        } else {
            (1.0 + (pi * e / t).cos()) / (1.0 + (pi * (e - 1.0) / t).cos()) * (lr - self.eta_min)
                + self.eta_min
        }
    }

    fn closed(&self, base: f64) -> f64 {
        let (e, t) = (self.epoch as f64, self.t_max as f64);
        self.eta_min + (base - self.eta_min) * (1.0 + (std::f64::consts::PI * e / t).cos()) / 2.0
    }
}

/// The learning rate times a factor going linearly from `start_factor` to
/// `end_factor` over `total_iters` epochs, then staying there (`LinearLR`; a
/// warm-up with `start_factor < 1`). With `total_iters` 0 the factor stays
/// `start_factor` for good, as PyTorch's does.
pub struct LinearLr {
    bases: Vec<f64>,
    start: f64,
    end: f64,
    total: usize,
    epoch: usize,
    last: Vec<f64>,
}

impl LinearLr {
    /// Starts from the optimizer's current learning rates, and sets them to
    /// `start_factor` times them, as PyTorch does at construction.
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
        let mut s = LinearLr {
            bases: initial_rates(opt),
            start: start_factor,
            end: end_factor,
            total: total_iters,
            epoch: 0,
            last: Vec::new(),
        };
        s.restart(opt);
        Ok(s)
    }

    fn first(&self, lr: f64) -> f64 {
        lr * self.start
    }

    /// The factor at this epoch over the last one's, until `total_iters`.
    fn next(&self, lr: f64, _base: f64) -> f64 {
        if self.epoch > self.total {
            return lr;
        }
        let change = self.end - self.start;
        lr * (1.0 + change / (self.total as f64 * self.start + (self.epoch - 1) as f64 * change))
    }

    fn closed(&self, base: f64) -> f64 {
        // (no iterations: PyTorch's rate stays at the start factor's)
        if self.total == 0 {
            return base * self.start;
        }
        let done = self.epoch.min(self.total) as f64;
        base * (self.start + (self.end - self.start) * done / self.total as f64)
    }
}

/// The initial learning rate times `f(epoch)` (`LambdaLR`, which sets the rate
/// outright: it does not build on a rate set since).
pub struct LambdaLr {
    bases: Vec<f64>,
    f: Box<dyn Fn(usize) -> f64 + Send>,
    epoch: usize,
}

impl LambdaLr {
    /// Sets the optimizer's rate to `f(0)` times it, as PyTorch does.
    pub fn new(opt: &mut dyn Optimizer, f: impl Fn(usize) -> f64 + Send + 'static) -> LambdaLr {
        let s = LambdaLr {
            bases: initial_rates(opt),
            f: Box::new(f),
            epoch: 0,
        };
        opt.set_group_lrs(&s.last_lrs());
        s
    }
}

impl LrScheduler for LambdaLr {
    fn step(&mut self, opt: &mut dyn Optimizer) {
        self.epoch += 1;
        opt.set_group_lrs(&self.last_lrs());
    }
    fn last_lr(&self) -> f64 {
        self.bases[0] * (self.f)(self.epoch)
    }
    fn last_lrs(&self) -> Vec<f64> {
        let f = (self.f)(self.epoch);
        group_rates(&self.bases, |b| b * f)
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
/// Build every schedule from the same optimizer first, in any order: each starts
/// from the rates the optimizer had when its first schedule was built
/// ([`Optimizer::initial_lrs`], PyTorch's `initial_lr`), then combine them.
/// Building this one puts the rates back to those and starts the first
/// schedule from them; at each milestone the next schedule starts at its
/// closed form's epoch 0, then steps on from there.
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
        // the rates back to the initial ones, then the first schedule's start
        // (what building the others set is undone)
        opt.set_group_lrs(&initial_rates(opt));
        let (i, _) = s.current(0);
        s.schedulers[i].restart(opt);
        Ok(s)
    }

    /// The usual transformer schedule: a linear warm-up over `warmup` steps from
    /// a hundredth of each group's current rate up to it, then cosine decay to
    /// `min_lr` by step `total` (`SequentialLR` of `LinearLR(0.01, 1, warmup)`
    /// and `CosineAnnealingLR(total - warmup, min_lr)`).
    pub fn warmup_cosine(
        opt: &mut dyn Optimizer,
        warmup: usize,
        total: usize,
        min_lr: f64,
    ) -> Result<SequentialLr> {
        if warmup == 0 || warmup > total {
            return Err(Error::invalid(
                "warmup_cosine",
                format!(
                    "the warm-up ({warmup} steps) must be at least 1 and at most the {total} steps"
                ),
            ));
        }
        let warm: Box<dyn LrScheduler> = Box::new(LinearLr::new(opt, 0.01, 1.0, warmup)?);
        let decay = (total - warmup).max(1);
        let cos: Box<dyn LrScheduler> =
            Box::new(super::CosineAnnealingLr::new(opt, decay, min_lr)?);
        SequentialLr::new(opt, vec![warm, cos], vec![warmup])
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
        self.epoch += 1;
        let (i, e) = self.current(self.epoch);
        if i > 0 && e == 0 {
            // a milestone: the next schedule from its closed form's start
            self.schedulers[i].step_to(opt, 0);
        } else {
            self.schedulers[i].step(opt);
        }
    }
    fn last_lr(&self) -> f64 {
        self.schedulers[self.current(self.epoch).0].last_lr()
    }
    fn last_lrs(&self) -> Vec<f64> {
        self.schedulers[self.current(self.epoch).0].last_lrs()
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

/// How a one-cycle phase goes from its start to its end value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Anneal {
    /// Half a cosine (PyTorch's default, `anneal_strategy="cos"`).
    Cos,
    /// A straight line (`anneal_strategy="linear"`).
    Linear,
}

impl Anneal {
    fn at(self, start: f64, end: f64, pct: f64) -> f64 {
        match self {
            Anneal::Cos => end + (start - end) / 2.0 * ((std::f64::consts::PI * pct).cos() + 1.0),
            Anneal::Linear => (end - start) * pct + start,
        }
    }
}

/// The settings of [`OneCycleLr`] other than the peak rate and the length;
/// `Default` gives PyTorch's.
#[derive(Clone, Copy, Debug)]
pub struct OneCycleOptions {
    /// The share of the cycle spent raising the rate (0.3).
    pub pct_start: f64,
    pub anneal: Anneal,
    /// Vary the momentum inversely to the rate (true): SGD's and RMSprop's
    /// momentum, Adam's first beta; an optimizer without one is refused.
    pub cycle_momentum: bool,
    /// The momentum at the peak rate (0.85).
    pub base_momentum: f64,
    /// The momentum at the lowest rates (0.95).
    pub max_momentum: f64,
    /// The initial rate is `max_lr / div_factor` (25).
    pub div_factor: f64,
    /// The final rate is the initial one over `final_div_factor` (1e4).
    pub final_div_factor: f64,
    /// Up, back down to the initial rate, then to the final one (false: up, then
    /// down to the final rate).
    pub three_phase: bool,
}

impl Default for OneCycleOptions {
    fn default() -> Self {
        OneCycleOptions {
            pct_start: 0.3,
            anneal: Anneal::Cos,
            cycle_momentum: true,
            base_momentum: 0.85,
            max_momentum: 0.95,
            div_factor: 25.0,
            final_div_factor: 1e4,
            three_phase: false,
        }
    }
}

/// One phase of the cycle: the step it ends at, and its start and end rate and
/// momentum.
#[derive(Clone, Copy, Debug)]
struct Phase {
    end_step: f64,
    lr: (f64, f64),
    momentum: (f64, f64),
}

/// The one-cycle policy (`OneCycleLR`, stepped once per batch): from
/// `max_lr / div_factor` up to `max_lr` over the first `pct_start` of
/// `total_steps`, then down to the initial rate over `final_div_factor`
/// (optionally in two phases), while the momentum goes the other way between
/// `max_momentum` and `base_momentum`. Every parameter group follows the same
/// rates, as PyTorch's do for a single `max_lr`. From step `total_steps` on
/// the final values stay (PyTorch's step `total_steps` goes on past the last
/// phase's end, the cosine back up from its minimum and the line below zero,
/// and later steps raise an error).
pub struct OneCycleLr {
    phases: Vec<Phase>,
    anneal: Anneal,
    cycle_momentum: bool,
    groups: usize,
    total: usize,
    epoch: usize,
}

impl OneCycleLr {
    /// PyTorch's defaults ([`OneCycleOptions::default`]). Sets the optimizer's
    /// rate (and momentum) to the initial ones.
    pub fn new(opt: &mut dyn Optimizer, max_lr: f64, total_steps: usize) -> Result<OneCycleLr> {
        OneCycleLr::with_options(opt, max_lr, total_steps, OneCycleOptions::default())
    }

    pub fn with_options(
        opt: &mut dyn Optimizer,
        max_lr: f64,
        total_steps: usize,
        o: OneCycleOptions,
    ) -> Result<OneCycleLr> {
        if total_steps == 0 {
            return Err(Error::invalid(
                "OneCycleLR",
                "Expected positive integer total_steps, but got 0",
            ));
        }
        if !(0.0..=1.0).contains(&o.pct_start) {
            return Err(Error::invalid(
                "OneCycleLR",
                format!(
                    "Expected float between 0 and 1 pct_start, but got {}",
                    o.pct_start
                ),
            ));
        }
        for (what, v) in [
            ("max_lr", max_lr),
            ("div_factor", o.div_factor),
            ("final_div_factor", o.final_div_factor),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(Error::invalid(
                    "OneCycleLR",
                    format!("{what} must be a finite number > 0, got {v}"),
                ));
            }
        }
        if o.cycle_momentum {
            if opt.cycled_momentum().is_none() {
                return Err(Error::invalid(
                    "OneCycleLR",
                    "optimizer must support momentum or beta1 with `cycle_momentum` option enabled",
                ));
            }
            // both values are checked by the optimizer before any step uses them;
            // on a refusal the optimizer keeps the momentum it had
            let had = opt.cycled_momentum();
            if let Err(e) = opt
                .set_cycled_momentum(o.base_momentum)
                .and_then(|()| opt.set_cycled_momentum(o.max_momentum))
            {
                if let Some(m) = had {
                    let _ = opt.set_cycled_momentum(m);
                }
                return Err(e);
            }
        }
        let initial = max_lr / o.div_factor;
        let min_lr = initial / o.final_div_factor;
        let (lo, hi) = (o.base_momentum, o.max_momentum);
        let up = o.pct_start * total_steps as f64 - 1.0;
        let last = total_steps as f64 - 1.0;
        // up to the peak, the momentum down; then down to the final rate, in one
        // phase or (three_phase) back to the initial rate first
        let rise = Phase {
            end_step: up,
            lr: (initial, max_lr),
            momentum: (hi, lo),
        };
        let phases = if o.three_phase {
            vec![
                rise,
                Phase {
                    end_step: 2.0 * o.pct_start * total_steps as f64 - 2.0,
                    lr: (max_lr, initial),
                    momentum: (lo, hi),
                },
                Phase {
                    end_step: last,
                    lr: (initial, min_lr),
                    momentum: (hi, hi),
                },
            ]
        } else {
            vec![
                rise,
                Phase {
                    end_step: last,
                    lr: (max_lr, min_lr),
                    momentum: (lo, hi),
                },
            ]
        };
        // the schedule's own initial rate becomes the groups' (PyTorch sets
        // `initial_lr` to it)
        let groups = initial_rates(opt).len();
        opt.record_initial_lrs(&vec![initial; groups]);
        let s = OneCycleLr {
            phases,
            anneal: o.anneal,
            cycle_momentum: o.cycle_momentum,
            groups,
            total: total_steps,
            epoch: 0,
        };
        s.apply(opt);
        Ok(s)
    }

    /// The rate and momentum at the current step (PyTorch's phase walk).
    fn values(&self) -> (f64, f64) {
        let step = self.epoch.min(self.total) as f64;
        let i = self
            .phases
            .iter()
            .position(|p| step <= p.end_step)
            .unwrap_or(self.phases.len() - 1);
        let start = if i == 0 {
            0.0
        } else {
            self.phases[i - 1].end_step
        };
        let p = self.phases[i];
        let len = p.end_step - start;
        // a phase of no length is at its end (PyTorch divides by zero there)
        let pct = if len > 0.0 {
            ((step - start) / len).min(1.0)
        } else {
            1.0
        };
        (
            self.anneal.at(p.lr.0, p.lr.1, pct),
            self.anneal.at(p.momentum.0, p.momentum.1, pct),
        )
    }

    /// The momentum set by the last step.
    pub fn last_momentum(&self) -> Option<f64> {
        self.cycle_momentum.then(|| self.values().1)
    }

    fn apply(&self, opt: &mut dyn Optimizer) {
        let (lr, m) = self.values();
        opt.set_group_lrs(&vec![lr; self.groups]);
        if self.cycle_momentum {
            // every value on the cycle lies between the two checked in `new`
            let _ = opt.set_cycled_momentum(m);
        }
    }
}

impl LrScheduler for OneCycleLr {
    fn step(&mut self, opt: &mut dyn Optimizer) {
        self.epoch += 1;
        self.apply(opt);
    }
    fn last_lr(&self) -> f64 {
        self.values().0
    }
    fn last_lrs(&self) -> Vec<f64> {
        vec![self.values().0; self.groups]
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
/// goes below `min_lr`. Each parameter group is lowered on its own. Step it with the metric: [`step_metric`](Self::step_metric).
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
    /// The best metric so far (None before the first).
    best: Option<f64>,
    bad_epochs: usize,
    cooldown_left: usize,
    epoch: usize,
}

impl ReduceLrOnPlateau {
    /// PyTorch's defaults: mode `min`, factor 0.1, patience 10, threshold 1e-4
    /// (relative), no cooldown, `min_lr` 0, `eps` 1e-8.
    pub fn new(factor: f64, patience: usize) -> Result<ReduceLrOnPlateau> {
        // PyTorch's one bound (0 drops to min_lr, as there); NaN is refused
        if factor >= 1.0 || factor.is_nan() {
            return Err(Error::invalid(
                "ReduceLROnPlateau",
                format!("Factor should be < 1.0 (got {factor})."),
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
            best: None,
            bad_epochs: 0,
            cooldown_left: 0,
            epoch: 0,
        })
    }

    /// A metric to maximise instead.
    pub fn maximize(mut self) -> Self {
        self.maximize = true;
        self
    }

    fn better(&self, m: f64) -> bool {
        // PyTorch's relative rule, as it is written (also for negative metrics),
        // from the mode's worst value (so that setting `maximize` by hand works)
        if self.maximize {
            m > self.best.unwrap_or(f64::NEG_INFINITY) * (1.0 + self.threshold)
        } else {
            m < self.best.unwrap_or(f64::INFINITY) * (1.0 - self.threshold)
        }
    }

    /// One epoch with its metric; lowers the optimizer's rate when the patience
    /// runs out.
    pub fn step_metric(&mut self, opt: &mut dyn Optimizer, metric: f64) {
        if !self.observe(metric) {
            return;
        }
        let lrs: Vec<f64> = opt
            .group_lrs()
            .into_iter()
            .map(|old| {
                let new = (old * self.factor).max(self.min_lr);
                if old - new > self.eps {
                    new
                } else {
                    old
                }
            })
            .collect();
        opt.set_group_lrs(&lrs);
    }

    /// Counts one epoch with its metric: whether the rates are lowered now (the
    /// count does not depend on the rates, so a resumed run can replay it from
    /// the metrics recorded).
    fn observe(&mut self, metric: f64) -> bool {
        self.epoch += 1;
        if self.better(metric) {
            self.best = Some(metric);
            self.bad_epochs = 0;
        } else {
            self.bad_epochs += 1;
        }
        if self.cooldown_left > 0 {
            self.cooldown_left -= 1;
            self.bad_epochs = 0;
        }
        let lower = self.bad_epochs > self.patience;
        if lower {
            self.cooldown_left = self.cooldown;
            self.bad_epochs = 0;
        }
        lower
    }

    /// Starts again from `metrics`, one per epoch, without changing any rate
    /// (the rates are the optimizer's, restored with it): the state a run that
    /// stepped those epochs has.
    pub fn replay(&mut self, metrics: &[f64]) {
        (self.best, self.bad_epochs, self.cooldown_left, self.epoch) = (None, 0, 0, 0);
        for &m in metrics {
            self.observe(m);
        }
    }

    /// The best metric so far (`None` before the first).
    pub fn best(&self) -> Option<f64> {
        self.best
    }

    /// Epochs without improvement counted so far (PyTorch's `num_bad_epochs`).
    pub fn bad_epochs(&self) -> usize {
        self.bad_epochs
    }

    /// Epochs stepped so far.
    pub fn epoch(&self) -> usize {
        self.epoch
    }
}
