// Over 800 lines: Trial, its builder and its loop, one user-facing type (callbacks, history and metrics have files of their own).
//! Training loops with torchbearer's `Trial`: a model, an optimizer, a loss and
//! metrics, run on any device for a number of epochs, with a progress bar,
//! per-epoch history, callbacks (checkpoints, early stopping), LR schedulers and
//! plots of the curves.
//!
//! ```
//! use ember::data::{DataLoader, TensorDataset};
//! use ember::nn::{self, Module};
//! use ember::optim::Adam;
//! use ember::train::{Progress, Trial};
//! use ember::prelude::*;
//!
//! let device = Device::cuda_if_available(0);
//! ember::manual_seed(0);
//! // two well-separated blobs: class 1 sits 4 units above class 0
//! let labels: Vec<i64> = (0..64).map(|i| i % 2).collect();
//! let y = Tensor::from_vec(labels, [64], &Device::Cpu)?;
//! let x = Tensor::randn([64, 2], &Device::Cpu)?.add(&y.to_dtype(DType::F32)?.unsqueeze(1)?.mul(4.0)?)?;
//! let train = DataLoader::new(TensorDataset::new(x, y)?, 16)?.shuffle(1);
//! let model = nn::Sequential::new().add(nn::Linear::new(2, 2, &Device::Cpu)?);
//! let opt = Adam::new(model.parameters(), 0.1)?;
//! let mut trial = Trial::new(model, opt, nn::cross_entropy)
//!     .metrics(&["loss", "accuracy"])?
//!     .progress(Progress::Quiet)
//!     .to(&device)?
//!     .with_generators(Some(train), None, None);
//! let history = trial.run(20)?;
//! assert!(history.last().unwrap().get("acc").unwrap() > 0.9);
//! # Ok::<(), ember::Error>(())
//! ```

mod callbacks;
mod history;
mod metrics;

pub use callbacks::{Callback, Checkpoint, Control, EarlyStopping, EpochEnd, Mode};
pub use history::{EpochRecord, History};
pub use metrics::{metric_by_name, Loss, Metric, TopKAccuracy};

use crate::data::DataLoader;
use crate::nn::Module;
use crate::optim::GradScaler;
use crate::optim::{LrScheduler, Optimizer, ReduceLrOnPlateau};
use crate::{
    device::Device,
    dtype::DType,
    error::{Error, Result},
    tensor::Tensor,
};
use std::io::IsTerminal;
use std::path::Path;
use std::time::Instant;

/// A loss: model output and target to a scalar tensor.
pub type LossFn = Box<dyn Fn(&Tensor, &Tensor) -> Result<Tensor> + Send + Sync>;

/// How a trial reports progress (on stderr).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// A live bar when stderr is a terminal, one line per epoch otherwise.
    Auto,
    /// A live bar with the running loss and throughput, then the epoch's line.
    Bar,
    /// One line per epoch.
    Lines,
    /// Nothing.
    Quiet,
}

/// A model trained by an optimizer on a loss, with metrics (torchbearer's `Trial`).
pub struct Trial {
    model: Box<dyn Module>,
    optimizer: Box<dyn Optimizer>,
    loss_fn: LossFn,
    metrics: Vec<Box<dyn Metric>>,
    device: Device,
    train: Option<DataLoader>,
    val: Option<DataLoader>,
    test: Option<DataLoader>,
    callbacks: Vec<Box<dyn Callback>>,
    scheduler: Option<Box<dyn LrScheduler>>,
    /// A metric-driven scheduler and the history column it watches.
    plateau: Option<(ReduceLrOnPlateau, String)>,
    progress: Progress,
    history: History,
    config: Vec<(String, String)>,
    /// Whether training steps are captured in a CUDA graph ([`Trial::cuda_graphs`]).
    cuda_graphs: bool,
    /// An eager step has run since the trial was built or moved (kernels compiled,
    /// the optimizer's state made): a step may be captured.
    warmed: bool,
    step_graph: Option<StepGraph>,
    /// Training steps replayed from a CUDA graph so far.
    replays: u64,
    /// The autocast dtype of the forward passes ([`Trial::amp`]).
    amp: Option<DType>,
    /// Loss scaling, for float16 autocast.
    scaler: Option<GradScaler>,
    /// The training steps to profile ([`Trial::profile_steps`]).
    profiling: Option<crate::profiler::StepProfiler>,
    /// The process group of a data-parallel run ([`Trial::distributed`]).
    dist: Option<std::sync::Arc<crate::distributed::ProcessGroup>>,
}

/// The `monitor` column of every epoch of `history` (an error naming the file
/// where an epoch lacks it).
fn plateau_metrics(history: &History, monitor: &str, file: &Path) -> Result<Vec<f64>> {
    history
        .records
        .iter()
        .map(|r| {
            r.get(monitor).ok_or_else(|| {
                Error::invalid(
                    "resume",
                    format!(
                        "{}: epoch {} has no {monitor:?}, which the ReduceLROnPlateau \
                         scheduler watches",
                        file.display(),
                        r.epoch
                    ),
                )
            })
        })
        .collect()
}

/// One training step: the last step's gradients cleared (before the forward pass,
/// not after it, so that they and this step's activations are never alive
/// together), forward, loss, backward, optimizer step. Returns the outputs and
/// the loss, detached.
/// With `amp`, the forward pass and the loss run under autocast to that dtype,
/// and with a `scaler` the loss is scaled and the step skipped when a gradient
/// is not finite.
fn train_step(
    model: &dyn Module,
    optimizer: &mut dyn Optimizer,
    loss_fn: &LossFn,
    (amp, scaler): (Option<DType>, Option<&mut GradScaler>),
    x: &Tensor,
    y: &Tensor,
) -> Result<(Tensor, Tensor)> {
    optimizer.zero_grad();
    let (out, loss) = forward_loss(model, loss_fn, amp, x, y)?;
    match scaler {
        Some(s) => {
            s.scale(&loss)?.backward()?;
            s.step(optimizer)?;
            s.update()?;
        }
        None => {
            loss.backward()?;
            optimizer.step()?;
        }
    }
    Ok((out.detach(), loss.detach()))
}

/// The model's output and the loss, under autocast to `amp` when given.
fn forward_loss(
    model: &dyn Module,
    loss_fn: &LossFn,
    amp: Option<DType>,
    x: &Tensor,
    y: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let _ac = amp
        .map(crate::tensor::autocast::autocast_guard)
        .transpose()?;
    let out = model.forward(x)?;
    let loss = loss_fn(&out, y)?;
    Ok((out, loss))
}

/// A training step captured in a CUDA graph, with its static inputs and outputs.
struct StepGraph {
    graph: crate::backend::cuda::Graph,
    x: Tensor,
    y: Tensor,
    out: Tensor,
    loss: Tensor,
    /// The learning rates and momentum the step was captured with.
    key: (Vec<f64>, Option<f64>),
}

impl Trial {
    /// A trial on the model's current device, with the `loss` metric.
    pub fn new(
        model: impl Module + 'static,
        optimizer: impl Optimizer + 'static,
        loss: impl Fn(&Tensor, &Tensor) -> Result<Tensor> + Send + Sync + 'static,
    ) -> Trial {
        let device = model
            .parameters()
            .first()
            .map_or(Device::Cpu, |p| p.device());
        Trial {
            model: Box::new(model),
            optimizer: Box::new(optimizer),
            loss_fn: Box::new(loss),
            metrics: vec![Box::new(Loss::default())],
            device,
            train: None,
            val: None,
            test: None,
            callbacks: Vec::new(),
            scheduler: None,
            plateau: None,
            progress: Progress::Auto,
            history: History::default(),
            config: Vec::new(),
            cuda_graphs: false,
            warmed: false,
            step_graph: None,
            replays: 0,
            amp: None,
            scaler: None,
            profiling: None,
            dist: None,
        }
    }

    /// One rank of a data-parallel run over `pg`: the model should be a
    /// [`DistributedDataParallel`](crate::distributed::DistributedDataParallel)
    /// and the training loader this rank's share
    /// ([`DataLoader::sampler`](crate::data::DataLoader::sampler)). Then only rank 0
    /// prints progress and runs the callbacks (checkpoints, plots, early
    /// stopping, whose decision to stop every rank follows), and the epoch's
    /// metrics are averaged over the ranks, so every rank's history is the same.
    pub fn distributed(mut self, pg: std::sync::Arc<crate::distributed::ProcessGroup>) -> Trial {
        self.dist = Some(pg);
        self
    }

    /// `true` on the rank that prints and writes: rank 0, or the only process.
    pub fn is_main_rank(&self) -> bool {
        self.dist.as_ref().is_none_or(|pg| pg.rank() == 0)
    }

    /// The metrics averaged over the ranks of a distributed run (as they are
    /// otherwise).
    fn across_ranks(&self, mut metrics: Vec<(String, f64)>) -> Result<Vec<(String, f64)>> {
        if let Some(pg) = self.dist.as_ref().filter(|pg| pg.world_size() > 1) {
            let mut v: Vec<f64> = metrics.iter().map(|(_, x)| *x).collect();
            pg.all_reduce_f64(&mut v, crate::distributed::ReduceOp::Avg)?;
            for ((_, x), y) in metrics.iter_mut().zip(v) {
                *x = y;
            }
        }
        Ok(metrics)
    }

    /// Profiles `steps` training steps after `warmup` of them (kernels compiled,
    /// the optimizer's state made, the allocator's cache warm) with
    /// [`crate::profiler`]: each profiled step is a range named `train_step`
    /// (the batch's copy to the device, forward, loss, backward, optimizer, the
    /// metrics' update). [`take_profile`](Self::take_profile) returns what was
    /// recorded; a run that ends sooner ends the session with it. `steps` of 0 is
    /// refused.
    pub fn profile_steps(mut self, warmup: usize, steps: usize) -> Result<Trial> {
        self.profiling = Some(crate::profiler::StepProfiler::new(warmup, steps)?);
        Ok(self)
    }

    /// The profile of the steps [`profile_steps`](Self::profile_steps) asked for,
    /// once they have run (or the run ended); `None` before, and after it is
    /// taken.
    pub fn take_profile(&mut self) -> Option<crate::profiler::Profile> {
        self.profiling.as_mut().and_then(|p| p.take())
    }

    /// Runs the forward passes and the loss under autocast to `dtype`
    /// (`DType::BF16` or `DType::F16`; `None`, the default, for none): products and
    /// convolutions in that precision, the parameters kept in float32 (see
    /// [`amp`](crate::amp)). Float16 also scales the loss with a [`GradScaler`]
    /// (PyTorch's defaults), which skips steps whose gradients overflow; bfloat16,
    /// with float32's range, needs none. The setting is part of the
    /// [`run_config`](Self::run_config). Float16 is refused with
    /// [`cuda_graphs`](Self::cuda_graphs): the scaler reads a flag on the host at
    /// every step.
    pub fn amp(mut self, dtype: Option<DType>) -> Result<Trial> {
        if let Some(dt) = dtype {
            drop(crate::tensor::autocast::autocast_guard(dt)?);
        }
        self.amp = dtype;
        self.scaler = (dtype == Some(DType::F16)).then(GradScaler::new);
        Ok(self)
    }

    /// Scales the loss with `scaler` (its own settings; call after
    /// [`amp`](Self::amp), which sets PyTorch's defaults for float16). A scaler
    /// works without autocast too (float32 training, as PyTorch allows).
    pub fn grad_scaler_with(mut self, scaler: GradScaler) -> Trial {
        self.scaler = Some(scaler);
        self
    }

    /// The loss scaler of float16 training ([`amp`](Self::amp)), if any.
    pub fn grad_scaler(&self) -> Option<&GradScaler> {
        self.scaler.as_ref()
    }

    /// Adds settings of the run that change its result (data set, model, seed,
    /// initial learning rate...), as (name, value) pairs; a name given again
    /// replaces its value. With the ones the trial knows itself (see
    /// [`run_config`](Self::run_config)), a [`Checkpoint`] records them and
    /// [`resume`](Self::resume) refuses a checkpoint whose values differ, naming
    /// the setting.
    pub fn config<K: Into<String>, V: ToString>(
        mut self,
        entries: impl IntoIterator<Item = (K, V)>,
    ) -> Trial {
        for (k, v) in entries {
            let (k, v) = (k.into(), v.to_string());
            match self.config.iter_mut().find(|(n, _)| *n == k) {
                Some(e) => e.1 = v,
                None => self.config.push((k, v)),
            }
        }
        self
    }

    /// The run's configuration: the entries given to [`config`](Self::config),
    /// the optimizer's kind and hyper-parameters ([`Optimizer::config`], as
    /// `optimizer` and `optimizer.NAME`) and, once the training loader is set, its
    /// batch size, sample count, shuffling seed and `drop_last`.
    pub fn run_config(&self) -> Vec<(String, String)> {
        self.config_with(self.train.as_ref())
    }

    fn config_with(&self, train: Option<&DataLoader>) -> Vec<(String, String)> {
        let mut c = self.config.clone();
        if let Some(dt) = self.amp {
            c.push(("amp".into(), dt.to_string()));
        }
        for (k, v) in self.optimizer.config() {
            let k = if k == "optimizer" {
                k
            } else {
                format!("optimizer.{k}")
            };
            c.push((k, v));
        }
        if let Some(t) = train {
            c.push(("batch_size".into(), t.batch_size().to_string()));
            c.push(("train_samples".into(), t.num_samples().to_string()));
            c.push((
                "shuffle_seed".into(),
                t.seed().map_or("none".into(), |s| s.to_string()),
            ));
            c.push(("drop_last".into(), t.drops_last().to_string()));
        }
        c
    }

    /// Replaces the metrics by the named ones (`loss`, `acc`/`accuracy`,
    /// `top_K_acc`).
    /// Two names of one column (`acc` and `top_1_acc`) are refused.
    pub fn metrics(mut self, names: &[&str]) -> Result<Trial> {
        let metrics: Vec<Box<dyn Metric>> = names
            .iter()
            .map(|n| metric_by_name(n))
            .collect::<Result<_>>()?;
        for (i, m) in metrics.iter().enumerate() {
            if let Some(j) = metrics[..i].iter().position(|o| o.name() == m.name()) {
                return Err(Error::invalid(
                    "Trial::metrics",
                    format!(
                        "{:?} and {:?} are both recorded as {:?}: list each metric once",
                        names[j],
                        names[i],
                        m.name()
                    ),
                ));
            }
        }
        self.metrics = metrics;
        Ok(self)
    }

    /// Adds a metric of your own.
    pub fn metric(mut self, m: impl Metric + 'static) -> Trial {
        self.metrics.push(Box::new(m));
        self
    }

    /// Moves the model (and the optimizer's state) to `device`; batches are moved
    /// there as they arrive.
    pub fn to(mut self, device: &Device) -> Result<Trial> {
        self.step_graph = None;
        self.warmed = false;
        self.model.to_device(device)?;
        self.optimizer.set_parameters(self.model.parameters())?;
        self.device = *device;
        Ok(self)
    }

    /// How many training steps so far were replays of a captured step
    /// ([`cuda_graphs`](Self::cuda_graphs)).
    pub fn graph_replays(&self) -> u64 {
        self.replays
    }

    /// Captures the training step (gradients cleared, forward, loss, backward,
    /// optimizer step) in a CUDA graph after the first eager step, and replays it
    /// for every batch of the same shapes: a step then costs one launch instead of
    /// one per kernel, which is what small models on a GPU are bound by
    /// (`torch.cuda.make_graphed_callables`' whole-step form). A batch of other
    /// shapes (the last, partial one) runs eagerly; a change of learning rate or
    /// momentum (a scheduler) captures the step again. The optimizer is switched
    /// to its [capturable](Optimizer::make_capturable) form (SGD and Adam have
    /// one), and the step must not copy from the host: otherwise
    /// [`run`](Self::run) returns the error that says which. Random draws
    /// (dropout) are replayed with new numbers, the same as eager steps draw.
    /// Off by default; on a device other than a GPU it changes nothing.
    pub fn cuda_graphs(mut self, on: bool) -> Trial {
        self.cuda_graphs = on;
        if !on {
            self.step_graph = None;
        }
        self
    }

    /// The loaders for training, validation (run after each training epoch) and
    /// testing ([`evaluate`](Self::evaluate)).
    pub fn with_generators(
        mut self,
        train: Option<DataLoader>,
        val: Option<DataLoader>,
        test: Option<DataLoader>,
    ) -> Trial {
        self.train = train;
        self.val = val;
        self.test = test;
        self
    }

    /// Adds a callback, run after each epoch in the order added.
    pub fn callback(mut self, c: impl Callback + 'static) -> Trial {
        self.callbacks.push(Box::new(c));
        self
    }

    /// Steps `scheduler` after each epoch. (Set it before
    /// [`resume`](Self::resume), which puts it at the checkpoint's position.)
    pub fn scheduler(mut self, scheduler: impl LrScheduler + 'static) -> Trial {
        self.scheduler = Some(Box::new(scheduler));
        self
    }

    /// Steps `scheduler` after each epoch with that epoch's `monitor` metric, a
    /// column of the history (`"val_loss"`; `"val_acc"` with
    /// [`ReduceLrOnPlateau::maximize`]), as PyTorch's `scheduler.step(val_loss)`
    /// at each epoch's end; after [`scheduler`](Self::scheduler)'s step when both
    /// are set. [`run`](Self::run) refuses a name that no epoch records before it
    /// trains; a [`resume`](Self::resume)d run counts the epochs without
    /// improvement from the restored history (the rates are the optimizer's,
    /// restored with it), so it lowers the rate when an uninterrupted run would.
    pub fn plateau_scheduler(mut self, scheduler: ReduceLrOnPlateau, monitor: &str) -> Trial {
        self.plateau = Some((scheduler, monitor.to_string()));
        self
    }

    /// How progress is shown (default [`Progress::Auto`]).
    pub fn progress(mut self, p: Progress) -> Trial {
        self.progress = p;
        self
    }

    /// Restores a [`Checkpoint`] directory: model, optimizer, scheduler position,
    /// epoch count and history. A following [`run`](Self::run) continues from
    /// there and, with seeded shuffling and no randomness in the model, ends in
    /// the same state as an uninterrupted run.
    ///
    /// A checkpoint saved with a different [`run_config`](Self::run_config) is
    /// refused with the settings that differ (set the training loader first, so
    /// that its settings are compared too). A file damaged on disk, or holding NaN
    /// or infinite values, is refused too ([`io::load_checkpoint`](crate::io::load_checkpoint)).
    pub fn resume(mut self, dir: impl AsRef<Path>) -> Result<Trial> {
        let dir = dir.as_ref();
        let file = Checkpoint::file(dir);
        if !file.is_file() {
            return Err(Error::invalid(
                "resume",
                format!(
                    "there is no checkpoint to resume from in {} (no {})",
                    dir.display(),
                    file.display()
                ),
            ));
        }
        self.check_config(dir, &file)?;
        let hist_file = Checkpoint::history_file(dir);
        let text = std::fs::read_to_string(&hist_file).map_err(|e| Error::Io {
            path: hist_file.display().to_string(),
            source: e,
        })?;
        let history = History::from_csv(&text, &hist_file.display().to_string())?;
        // everything the checkpoint's extra entries decide is checked before
        // the model and the optimizer are loaded (an error changes neither)
        let has_scheduler = self.scheduler.is_some();
        let scaler = self.scaler.clone();
        let watched = self.plateau.as_ref().map(|(_, m)| m.clone());
        let (_, (history, scheduler_epoch, scaler, watched)) = crate::io::load_checkpoint_checked(
            self.model.as_ref(),
            self.optimizer.as_mut(),
            &file,
            crate::io::LoadOptions::default(),
            |extra| {
                let (history, epoch, scaler) =
                    Self::check_resume(extra, &file, &hist_file, history, has_scheduler, scaler)?;
                let watched = watched
                    .map(|m| plateau_metrics(&history, &m, &hist_file))
                    .transpose()?;
                Ok((history, epoch, scaler, watched))
            },
        )?;
        // the optimizer's state is replaced: a captured step would update the old
        self.step_graph = None;
        self.warmed = false;
        if let (Some(s), Some(e)) = (self.scheduler.as_mut(), scheduler_epoch) {
            s.set_epoch(e);
        }
        if let (Some((p, _)), Some(values)) = (self.plateau.as_mut(), watched) {
            p.replay(&values);
        }
        self.scaler = scaler;
        self.history = history;
        Ok(self)
    }

    /// What a checkpoint's extra entries (`extra`) restore, checked: the
    /// history cut to the checkpoint's epoch, the scheduler's epoch (a
    /// scheduler on one side only is refused: it would change the learning
    /// rates from there on) and the loss scaler with its state loaded.
    fn check_resume(
        extra: &[(String, Tensor)],
        file: &Path,
        hist_file: &Path,
        mut history: History,
        has_scheduler: bool,
        mut scaler: Option<GradScaler>,
    ) -> Result<(History, Option<usize>, Option<GradScaler>)> {
        let get = |name: &str| -> Result<Option<usize>> {
            extra
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| t.item::<i64>().map(|v| v as usize))
                .transpose()
        };
        let epoch = get("epoch")?.ok_or_else(|| {
            Error::invalid("resume", format!("{}: no epoch count", file.display()))
        })?;
        history.records.truncate(epoch);
        if history.len() != epoch {
            return Err(Error::invalid(
                "resume",
                format!(
                    "{} has {} epochs but the checkpoint is at epoch {epoch}",
                    hist_file.display(),
                    history.len()
                ),
            ));
        }
        let scheduler_epoch = get("scheduler_epoch")?;
        match (has_scheduler, scheduler_epoch) {
            (true, Some(_)) | (false, None) => {}
            (false, Some(e)) => {
                return Err(Error::invalid(
                    "resume",
                    format!(
                        "{} was saved with a learning-rate scheduler (at its epoch {e}) and this \
                         trial has none: set the same scheduler before resume()",
                        file.display()
                    ),
                ))
            }
            (true, None) => {
                return Err(Error::invalid(
                    "resume",
                    format!(
                        "{} was saved without a learning-rate scheduler and this trial has one",
                        file.display()
                    ),
                ))
            }
        }
        if let Some(scaler) = scaler.as_mut() {
            let state: Vec<(String, f64)> = extra
                .iter()
                .filter_map(|(n, t)| n.strip_prefix("grad_scaler.").map(|k| (k, t)))
                .map(|(k, t)| Ok((k.to_string(), t.item::<f64>()?)))
                .collect::<Result<_>>()?;
            scaler.load_state_dict(&state).map_err(|e| {
                Error::invalid(
                    "resume",
                    format!("{}: the loss scaler: {e}", file.display()),
                )
            })?;
        }
        Ok((history, scheduler_epoch, scaler))
    }

    /// Refuses a checkpoint whose recorded configuration differs from this run's.
    fn check_config(&self, dir: &Path, file: &Path) -> Result<()> {
        let saved: Vec<(String, String)> = crate::io::metadata(file)?
            .into_iter()
            .filter_map(|(k, v)| k.strip_prefix("config.").map(|k| (k.to_string(), v)))
            .collect();
        if saved.is_empty() {
            return Ok(()); // a checkpoint from before configurations were recorded
        }
        let here = self.run_config();
        // the loader's settings are compared only when the loader is set
        let loader_keys = ["batch_size", "train_samples", "shuffle_seed", "drop_last"];
        let skip = |k: &str| self.train.is_none() && loader_keys.contains(&k);
        let mut diffs = Vec::new();
        for (k, v) in &saved {
            if skip(k) {
                continue;
            }
            match here.iter().find(|(n, _)| n == k) {
                Some((_, w)) if w == v => {}
                Some((_, w)) => diffs.push(format!("{k} is {v} there and {w} here")),
                None => diffs.push(format!("{k} is {v} there and not set here")),
            }
        }
        for (k, w) in &here {
            if !skip(k) && !saved.iter().any(|(n, _)| n == k) {
                diffs.push(format!("{k} is not set there and is {w} here"));
            }
        }
        if diffs.is_empty() {
            return Ok(());
        }
        Err(Error::invalid(
            "resume",
            format!(
                "the checkpoint in {} was saved by a run with other settings: {}. Resume \
                 with the same settings, or start a new run in another folder",
                dir.display(),
                diffs.join("; ")
            ),
        ))
    }

    /// Trains until `epochs` epochs have run in total (torchbearer's `run`: after
    /// [`resume`](Self::resume) it continues), unless a callback stops it first.
    pub fn run(&mut self, epochs: usize) -> Result<&History> {
        let Some(train) = self.train.take() else {
            return Err(Error::invalid(
                "Trial::run",
                "no training data: call with_generators(Some(loader), ...) first",
            ));
        };
        let result = self.run_with(&train, epochs);
        self.train = Some(train);
        result?;
        Ok(&self.history)
    }

    fn run_with(&mut self, train: &DataLoader, epochs: usize) -> Result<()> {
        if self.cuda_graphs
            && self.device.is_cuda()
            && self.scaler.as_ref().is_some_and(|s| s.is_enabled())
        {
            return Err(Error::invalid(
                "Trial::cuda_graphs",
                "the loss is scaled with a GradScaler (float16 autocast), which reads a \
                 flag on the host at every step: a CUDA graph cannot replay that; use \
                 bfloat16 autocast (no scaler), or train without cuda_graphs",
            ));
        }
        // what would waste the run later is refused before its first step: an
        // epoch without batches (its metrics would be made up), and a callback
        // watching a metric no epoch records
        no_batches("Trial::run", "training", train)?;
        if let Some(v) = &self.val {
            no_batches("Trial::run", "validation", v)?;
        }
        let mut recorded: Vec<String> = self.metrics.iter().map(|m| m.name()).collect();
        // (metrics added one by one: `metrics` refuses its own repeats)
        let twice = (1..recorded.len()).find(|&i| recorded[..i].contains(&recorded[i]));
        if let Some(n) = twice.map(|i| &recorded[i]) {
            return Err(Error::invalid(
                "Trial::run",
                format!(
                    "two metrics are recorded as {n:?} (one history column each): add \
                     each metric once"
                ),
            ));
        }
        if self.val.is_some() {
            let val: Vec<String> = recorded.iter().map(|n| format!("val_{n}")).collect();
            recorded.extend(val);
        }
        for c in &self.callbacks {
            c.check_metrics(&recorded)?;
        }
        if let Some((_, m)) = &self.plateau {
            callbacks::check_recorded("ReduceLROnPlateau", m, &recorded)?;
        }
        // (on the rank that runs the callbacks' epoch ends; a refusal there breaks
        // the group, so that the other ranks stop too instead of waiting for it
        // in their first all-reduce)
        if self.is_main_rank() {
            let begun = self
                .callbacks
                .iter_mut()
                .try_for_each(|c| c.on_train_begin());
            if let (Err(e), Some(pg)) = (&begun, &self.dist) {
                pg.abort(&format!("rank 0 stopped before training: {e}"));
            }
            begun?;
        }
        let val = self.val.take();
        let config = self.config_with(Some(train));
        let result = (|| -> Result<()> {
            while self.history.len() < epochs {
                let epoch = self.history.len() + 1;
                let start = Instant::now();
                let lr = self.optimizer.lr();
                let metrics = self.train_epoch(train, epoch, epochs)?;
                let mut metrics = self.across_ranks(metrics)?;
                let train_secs = start.elapsed().as_secs_f64();
                if let Some(v) = &val {
                    let vm = self.eval_loader(v, epoch as u64)?;
                    let vm = self.across_ranks(vm)?;
                    metrics.extend(vm.into_iter().map(|(n, x)| (format!("val_{n}"), x)));
                }
                if let Some(s) = self.scheduler.as_mut() {
                    s.step(self.optimizer.as_mut());
                }
                if let Some((p, m)) = self.plateau.as_mut() {
                    let value = metrics.iter().find(|(n, _)| n == m).map(|(_, v)| *v);
                    let value = value.ok_or_else(|| {
                        Error::invalid(
                            "ReduceLROnPlateau",
                            format!("metric {m:?} was not recorded this epoch"),
                        )
                    })?;
                    p.step_metric(self.optimizer.as_mut(), value);
                }
                let record = EpochRecord {
                    epoch,
                    metrics,
                    lr,
                    seconds: train_secs,
                    samples_per_sec: (train.samples_per_epoch()
                        * self.dist.as_ref().map_or(1, |pg| pg.world_size()))
                        as f64
                        / train_secs.max(1e-12),
                };
                let main = self.is_main_rank();
                if self.progress != Progress::Quiet && main {
                    eprintln!("{}", epoch_line(&record, epochs));
                }
                self.history.records.push(record);
                let mut stop = false;
                let ctx = EpochEnd {
                    epoch,
                    history: &self.history,
                    model: self.model.as_ref(),
                    optimizer: self.optimizer.as_ref(),
                    scheduler: self.scheduler.as_deref(),
                    config: &config,
                    grad_scaler: self.scaler.as_ref(),
                };
                if main {
                    for c in self.callbacks.iter_mut() {
                        stop |= c.on_epoch_end(&ctx)? == Control::Stop;
                    }
                }
                if let Some(pg) = self.dist.as_ref().filter(|pg| pg.world_size() > 1) {
                    // rank 0 decides
                    let mut s = [stop as u8 as f64];
                    pg.all_reduce_f64(&mut s, crate::distributed::ReduceOp::Max)?;
                    stop = s[0] != 0.0;
                }
                if stop {
                    break;
                }
            }
            Ok(())
        })();
        self.val = val;
        // a run that ends inside the profiled steps ends their session
        let profiled = match self.profiling.as_mut() {
            Some(p) => p.stop(),
            None => Ok(()),
        };
        result.and(profiled)
    }

    fn bar(&self, len: usize, epoch: usize, epochs: usize) -> Option<indicatif::ProgressBar> {
        if !self.is_main_rank() {
            return None;
        }
        let show = match self.progress {
            Progress::Bar => true,
            Progress::Auto => std::io::stderr().is_terminal(),
            Progress::Lines | Progress::Quiet => false,
        };
        if !show {
            return None;
        }
        let bar = indicatif::ProgressBar::new(len as u64);
        let style = indicatif::ProgressStyle::with_template(
            "{prefix} [{bar:30}] {pos}/{len} {msg} ({elapsed})",
        )
        .map(|s| s.progress_chars("=> "));
        if let Ok(style) = style {
            bar.set_style(style);
        }
        bar.set_prefix(format!("epoch {epoch}/{epochs}"));
        Some(bar)
    }

    fn train_epoch(
        &mut self,
        loader: &DataLoader,
        epoch: usize,
        epochs: usize,
    ) -> Result<Vec<(String, f64)>> {
        self.model.train();
        self.metrics.iter_mut().for_each(|m| m.reset());
        let bar = self.bar(loader.len(), epoch, epochs);
        let start = Instant::now();
        let mut shown = start;
        let mut seen = 0usize;
        for batch in loader.epoch(epoch as u64 - 1) {
            let (x, y) = batch?;
            // a range only while a session records
            let _step = crate::profiler::range("train_step");
            let (x, y) = (x.to(&self.device)?, y.to(&self.device)?);
            let (out, loss) = match self.graph_step(&x, &y)? {
                Some(replayed) => replayed,
                None => {
                    let r = train_step(
                        self.model.as_ref(),
                        self.optimizer.as_mut(),
                        &self.loss_fn,
                        (self.amp, self.scaler.as_mut()),
                        &x,
                        &y,
                    )?;
                    self.warmed = true;
                    r
                }
            };
            crate::autograd::no_grad(|| {
                self.metrics
                    .iter_mut()
                    .try_for_each(|m| m.update(&out, &y, &loss))
            })?;
            drop(_step);
            if let Some(p) = self.profiling.as_mut() {
                p.step()?;
            }
            seen += x.shape().first().copied().unwrap_or(1);
            if let Some(bar) = &bar {
                bar.inc(1);
                // the loss is read (a wait for the GPU) a few times a second, not
                // at every step
                if shown.elapsed().as_secs_f64() >= 0.25 {
                    shown = Instant::now();
                    let loss_v = loss.item::<f64>()?;
                    let rate = seen as f64 / start.elapsed().as_secs_f64().max(1e-9);
                    bar.set_message(format!("loss {loss_v:.4} · {rate:.0} samples/s"));
                }
            }
        }
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
        self.metrics
            .iter()
            .map(|m| Ok((m.name(), m.value()?)))
            .collect()
    }

    /// The step of `(x, y)` through the captured graph (captured first when
    /// there is none for these shapes and settings), or `None` for an eager step.
    fn graph_step(&mut self, x: &Tensor, y: &Tensor) -> Result<Option<(Tensor, Tensor)>> {
        if !self.cuda_graphs || !self.device.is_cuda() {
            return Ok(None);
        }
        let key = (self.optimizer.group_lrs(), self.optimizer.cycled_momentum());
        let fits = |t: &Tensor, s: &Tensor| t.shape() == s.shape() && t.dtype() == s.dtype();
        if let Some(g) = &self.step_graph {
            if !(fits(x, &g.x) && fits(y, &g.y)) {
                return Ok(None);
            }
            if g.key == key {
                g.x.copy_(x)?;
                g.y.copy_(y)?;
                g.graph.replay()?;
                self.replays += 1;
                return Ok(Some((g.out.clone(), g.loss.clone())));
            }
            // captured with another learning rate or momentum
            self.step_graph = None;
        }
        // the capturable form from the first step on, so that every step computes
        // alike
        let capturable = self.optimizer.make_capturable()?;
        if !self.warmed {
            return Ok(None);
        }
        if !capturable {
            let name = self
                .optimizer
                .config()
                .into_iter()
                .find(|(k, _)| k == "optimizer")
                .map_or("this optimizer".to_string(), |(_, v)| v);
            return Err(Error::invalid(
                "Trial::cuda_graphs",
                format!(
                    "{name}'s step cannot be captured in a CUDA graph (it reads state \
                     on the host that changes every step); use SGD or Adam, or train \
                     without cuda_graphs"
                ),
            ));
        }
        let (xs, ys) = (x.copy()?, y.copy()?);
        let (model, optimizer, loss_fn, amp) = (
            self.model.as_ref(),
            self.optimizer.as_mut(),
            &self.loss_fn,
            self.amp,
        );
        let (graph, (out, loss)) = crate::backend::cuda::Graph::capture(&self.device, || {
            train_step(model, optimizer, loss_fn, (amp, None), &xs, &ys)
        })?;
        graph.replay()?;
        self.replays += 1;
        let g = StepGraph {
            graph,
            x: xs,
            y: ys,
            out: out.clone(),
            loss: loss.clone(),
            key,
        };
        self.step_graph = Some(g);
        Ok(Some((out, loss)))
    }

    /// The metrics over a loader in evaluation mode, without a graph.
    fn eval_loader(&mut self, loader: &DataLoader, epoch: u64) -> Result<Vec<(String, f64)>> {
        self.model.eval();
        self.metrics.iter_mut().for_each(|m| m.reset());
        let _ng = crate::autograd::no_grad_guard();
        for batch in loader.epoch(epoch) {
            let (x, y) = batch?;
            let (x, y) = (x.to(&self.device)?, y.to(&self.device)?);
            let (out, loss) = forward_loss(self.model.as_ref(), &self.loss_fn, self.amp, &x, &y)?;
            for m in self.metrics.iter_mut() {
                m.update(&out, &y, &loss)?;
            }
        }
        self.model.train();
        self.metrics
            .iter()
            .map(|m| Ok((m.name(), m.value()?)))
            .collect()
    }

    /// The metrics on the test loader (the validation loader when there is none),
    /// in evaluation mode.
    pub fn evaluate(&mut self) -> Result<Vec<(String, f64)>> {
        let from_test = self.test.is_some();
        let loader = if from_test {
            self.test.take()
        } else {
            self.val.take()
        };
        let Some(loader) = loader else {
            return Err(Error::invalid(
                "Trial::evaluate",
                "no test or validation data: pass them to with_generators",
            ));
        };
        let what = if from_test { "test" } else { "validation" };
        if let Err(e) = no_batches("Trial::evaluate", what, &loader) {
            if from_test {
                self.test = Some(loader);
            } else {
                self.val = Some(loader);
            }
            return Err(e);
        }
        let r = self.eval_loader(&loader, 0);
        if from_test {
            self.test = Some(loader);
        } else {
            self.val = Some(loader);
        }
        r
    }

    /// The model's outputs for `x` in evaluation mode, without a graph, computed
    /// on the trial's device in chunks of `batch_size` rows and returned there.
    pub fn predict(&mut self, x: &Tensor, batch_size: usize) -> Result<Tensor> {
        if batch_size == 0 {
            return Err(Error::invalid(
                "Trial::predict",
                "batch_size must be positive",
            ));
        }
        self.model.eval();
        let _ng = crate::autograd::no_grad_guard();
        let n = x.shape().first().copied().unwrap_or(0);
        let mut outs = Vec::new();
        let mut start = 0;
        while start < n {
            let len = batch_size.min(n - start);
            let xb = x.narrow(0, start as i64, len)?.to(&self.device)?;
            outs.push(self.model.forward(&xb)?);
            start += len;
        }
        self.model.train();
        if outs.is_empty() {
            return Err(Error::invalid("Trial::predict", "x has no rows"));
        }
        Tensor::cat(&outs.iter().collect::<Vec<_>>(), 0)
    }

    /// The history so far.
    pub fn history(&self) -> &History {
        &self.history
    }

    /// The device the trial runs on.
    pub fn device(&self) -> Device {
        self.device
    }

    pub fn model(&self) -> &dyn Module {
        self.model.as_ref()
    }

    pub fn model_mut(&mut self) -> &mut dyn Module {
        self.model.as_mut()
    }

    pub fn optimizer(&self) -> &dyn Optimizer {
        self.optimizer.as_ref()
    }
}

/// An error when `loader` gives no batch in an epoch (too few samples for one
/// batch under `drop_last`, or an empty dataset): a `what` epoch would then
/// step nothing and record metrics of nothing.
fn no_batches(op: &'static str, what: &str, loader: &DataLoader) -> Result<()> {
    if !loader.is_empty() {
        return Ok(());
    }
    let n = loader.samples_per_epoch();
    let why = if n == 0 {
        "its dataset (or this rank's share of it) is empty".to_string()
    } else {
        format!(
            "{n} samples make no whole batch of {} and drop_last drops the rest; \
             use a smaller batch size, or keep the last batch",
            loader.batch_size()
        )
    };
    Err(Error::invalid(
        op,
        format!("the {what} loader gives no batch in an epoch: {why}"),
    ))
}

/// `epoch 3/20  loss 0.4123  acc 0.9120  val_loss ...  12.3 ms  9734 samples/s`
fn epoch_line(r: &EpochRecord, epochs: usize) -> String {
    let mut s = format!("epoch {}/{epochs}", r.epoch);
    for (n, v) in &r.metrics {
        s.push_str(&format!("  {n} {v:.4}"));
    }
    let t = if r.seconds < 1.0 {
        format!("{:.1} ms", r.seconds * 1e3)
    } else {
        format!("{:.2} s", r.seconds)
    };
    s.push_str(&format!("  {t}  {:.0} samples/s", r.samples_per_sec));
    s
}
