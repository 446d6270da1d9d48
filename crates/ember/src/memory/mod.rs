// Over 800 lines: the Estimator, the trace it records and the Estimate it returns, one pipeline (its report tables are in report.rs).
//! How much GPU memory training will need, before running it.
//!
//! An [`Estimator`] builds the model on the `meta` device, runs training steps
//! there (inputs, forward, loss, backward, optimizer step, `zero_grad`: ember's own
//! loop), and replays every allocation and free, in order, through ember's CUDA
//! caching allocator (the same code, with its 512-byte rounding, its small and large
//! pools, block splitting and segment sizes), standing in a ledger for the driver.
//! Meta ops also report the buffers ember's CUDA ops use inside themselves (a
//! convolution's patch matrix), so the replay sees what `max_memory_allocated`
//! would see on the GPU. The result, an [`Estimate`], gives the peaks of allocated
//! and reserved memory, where the peak happens (step, phase, module), what the
//! memory at the peak holds ([`Breakdown`]: its categories add up to the peak), the
//! exact bytes of parameters, gradients and optimizer state, and a per-module table
//! with output shapes and parameter counts.
//!
//! ```
//! use ember::memory::Estimator;
//! use ember::nn::{self, Module};
//! use ember::prelude::*;
//!
//! let est = Estimator::new(|dev| {
//!     Ok(nn::Sequential::new()
//!         .add(nn::Linear::new(784, 1024, dev)?)
//!         .add(nn::ReLU)
//!         .add(nn::Linear::new(1024, 10, dev)?))
//! })
//! .input([784])
//! .estimate(256)?;
//! // Adam (the default) keeps two moments per parameter
//! assert_eq!(est.optimizer_state_bytes, 2 * est.parameter_bytes);
//! assert_eq!(est.at_peak.total(), est.peak_allocated);
//! println!("{est}");
//! # Ok::<(), ember::Error>(())
//! ```
//!
//! What the estimate does not count: the CUDA context (created by the driver
//! outside any allocator), and cuBLAS's own workspace ([`Estimate::outside_allocator`]
//! assumes NVIDIA's recommended 32 MiB on Hopper, 4 MiB before; ember does not
//! set it). Convolutions are estimated as a GPU where cuDNN loads runs them, with
//! `ember::cuda::cudnn`'s switch and workspace limit as set (each pass's
//! workspace depends on the shape only, not on the algorithm cuDNN picks); with
//! the switch off, as ember's im2col path runs them.

mod report;

use crate::backend::alloc::{AllocError, Allocator, RawMemory};
use crate::backend::cuda::runtime::StreamId;
use crate::backend::meta::account::{AllocHook, MetaEvent};
use crate::nn::Module;
use crate::optim::{Adam, Optimizer};
use crate::{
    device::Device,
    dtype::DType,
    error::{Error, Result},
    tensor::Tensor,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

pub use crate::backend::alloc::fmt_bytes;
pub use report::{parse_bytes, ModuleRow};

/// The part of a training step an allocation happens in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Building the model and the optimizer.
    Setup,
    /// The batch arriving on the device.
    Inputs,
    /// The forward pass and the loss.
    Forward,
    /// `backward`.
    Backward,
    /// Gradient clipping (when set), the optimizer's `step` and `zero_grad`.
    Optimizer,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Phase::Setup => "setup",
            Phase::Inputs => "inputs",
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Optimizer => "optimizer step",
        })
    }
}

/// What the memory allocated at the peak holds, in bytes as requested; `rounding`
/// is what the allocator adds (blocks are at least the request rounded up to 512
/// bytes). The fields add up to the peak ([`total`](Self::total)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Breakdown {
    /// The model's parameters.
    pub parameters: usize,
    /// The model's buffers (batch norm's running statistics).
    pub buffers: usize,
    /// Parameters' gradients (made by `backward`, alive until `zero_grad`).
    pub gradients: usize,
    /// The optimizer's state (momentum, Adam's moments).
    pub optimizer_state: usize,
    /// The batch: inputs and targets.
    pub inputs: usize,
    /// Tensors of the forward pass still alive when it ends: what autograd saved
    /// for backward, the output and the loss.
    pub activations: usize,
    /// Tensors freed in the phase that made them (intermediate results, the
    /// gradients of activations).
    pub temporaries: usize,
    /// Buffers ember's CUDA ops use inside themselves (convolution patches).
    pub workspaces: usize,
    /// The allocator's rounding of all of the above.
    pub rounding: usize,
}

impl Breakdown {
    /// The sum of every field: the memory allocated at the peak.
    pub fn total(&self) -> usize {
        self.parameters
            + self.buffers
            + self.gradients
            + self.optimizer_state
            + self.inputs
            + self.activations
            + self.temporaries
            + self.workspaces
            + self.rounding
    }

    fn add(&mut self, c: Category, bytes: usize) {
        let f = match c {
            Category::State => &mut self.parameters,
            Category::Gradients => &mut self.gradients,
            Category::OptimizerState => &mut self.optimizer_state,
            Category::Inputs => &mut self.inputs,
            Category::Activations => &mut self.activations,
            Category::Temporaries => &mut self.temporaries,
            Category::Workspaces => &mut self.workspaces,
        };
        *f += bytes;
    }
}

/// Where the peak happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Moment {
    /// The training step (0-based); 0 in setup.
    pub step: usize,
    pub phase: Phase,
    /// The dotted path of the module running (`"features.3"`), empty outside any.
    pub module: String,
}

/// An estimate of a training (or inference) step's device memory.
#[derive(Clone, Debug)]
pub struct Estimate {
    pub batch_size: usize,
    /// Training steps (`false`: forward passes under `no_grad`).
    pub training: bool,
    /// The steps run (the second one counts: optimizer state exists only after the
    /// first).
    pub steps: usize,
    /// The dtype of the model's parameters and of the inputs.
    pub dtype: DType,
    /// The autocast dtype of the forward passes, if any.
    pub amp: Option<DType>,
    /// The layout of the model's parameters and of the inputs
    /// ([`Estimator::memory_format`]).
    pub memory_format: crate::layout::MemoryFormat,
    /// The largest `memory_allocated` (bytes in blocks handed out).
    pub peak_allocated: usize,
    /// The largest `memory_reserved` (bytes taken from the driver in segments).
    pub peak_reserved: usize,
    /// When `peak_allocated` was reached (its first time).
    pub peak_at: Moment,
    /// What the allocated memory held at that moment.
    pub at_peak: Breakdown,
    /// The number of parameters (elements).
    pub parameters: usize,
    /// Exact bytes: parameters, buffers, gradients (of the parameters `backward`
    /// reached), optimizer state after the last step.
    pub parameter_bytes: usize,
    pub buffer_bytes: usize,
    pub gradient_bytes: usize,
    pub optimizer_state_bytes: usize,
    /// Device memory used outside ember's allocator that ember knows of (cuBLAS's
    /// workspace, NVIDIA's recommended size for the target; 0 without a target):
    /// add it to `peak_reserved` for what the device must have free.
    pub outside_allocator: usize,
    /// One row per module that reported its output (children of `Sequential`s and
    /// of the model zoo's blocks), in the order they ran in the first forward pass.
    pub modules: Vec<ModuleRow>,
    /// The allocations and frees, for [`fits`](Self::fits).
    events: Arc<Vec<Event>>,
}

impl Estimate {
    /// The device memory the step needs: the peak reserved by the allocator plus
    /// what is used outside it.
    pub fn required(&self) -> usize {
        self.peak_reserved + self.outside_allocator
    }

    /// Whether the steps run on a device with `capacity` bytes free: the
    /// allocations are replayed through the caching allocator on a device of that
    /// size less [`outside_allocator`](Self::outside_allocator), where, as on a GPU,
    /// a request the device cannot meet first releases the allocator's cached
    /// segments and tries again. Needs at most [`required`](Self::required), and
    /// can need less when freeing the cache avoids a new segment.
    pub fn fits(&self, capacity: usize) -> bool {
        if self.required() <= capacity {
            return true;
        }
        capacity
            .checked_sub(self.outside_allocator)
            .is_some_and(|c| matches!(replay(&self.events, Some(c)), Ok(Some(_))))
    }

    /// The least free memory the steps run in ([`fits`](Self::fits)): between
    /// the peak allocated (plus what is used outside the allocator) and
    /// [`required`](Self::required), lower than the latter when the allocator
    /// can release its cache instead of growing, as it does when a device runs
    /// short. Found to within 1 MiB.
    pub fn min_required(&self) -> usize {
        let (mut lo, mut hi) = (
            (self.peak_allocated + self.outside_allocator).saturating_sub(1),
            self.required(),
        );
        // lo does not fit (nothing fits below the peak allocated), hi does
        while hi - lo > 1 << 20 {
            let mid = lo + (hi - lo) / 2;
            if self.fits(mid) {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        hi
    }
}

type Loss = dyn Fn(&Tensor, &Tensor) -> Result<Tensor>;
type Build<M> = dyn Fn(&Device) -> Result<M>;
type MakeOptimizer = dyn Fn(Vec<Tensor>) -> Result<Box<dyn Optimizer>>;

/// Runs training steps on `meta` and replays their memory through ember's CUDA
/// caching allocator. Build it with the model's constructor (called with
/// `Device::Meta`, once per estimate), then set the input's shape (one sample's:
/// `[3, 224, 224]`) and, where they differ from the defaults, the number of
/// classes, the loss, the optimizer and the target device.
///
/// Defaults: inputs of the parameters' dtype, cross-entropy against class-index
/// targets (`int64`, one per sample), Adam, no gradient clipping, two training
/// steps, no target device (no outside-the-allocator workspace).
///
/// A language model takes token ids and predicts one per position: integer
/// inputs ([`input_dtype`](Self::input_dtype)) and a target per position
/// ([`targets`](Self::targets)), with a loss that flattens them:
///
/// ```
/// use ember::memory::Estimator;
/// use ember::models::{CharGpt, GptConfig};
/// use ember::nn;
/// use ember::prelude::*;
/// let config = GptConfig { vocab_size: 512, context: 64, layers: 2, heads: 2, width: 128, dropout: 0.0 };
/// let est = Estimator::new(move |dev| CharGpt::new_tied(config, dev))
///     .input([64])
///     .input_dtype(DType::I64)
///     .targets([64])
///     .loss(|logits, y| nn::cross_entropy(&logits.flatten(0, 1)?, &y.flatten(0, 1)?))
///     .clip_grad_norm(1.0)
///     .estimate(8)?;
/// assert!(est.peak_allocated > 3 * est.parameter_bytes);
/// # Ok::<(), ember::Error>(())
/// ```
pub struct Estimator<M> {
    build: Box<Build<M>>,
    input: Vec<usize>,
    input_dtype: Option<DType>,
    targets: Vec<usize>,
    clip: Option<f64>,
    loss: Box<Loss>,
    optimizer: Box<MakeOptimizer>,
    training: bool,
    keep_output: bool,
    steps: usize,
    outside: usize,
    /// The compute capability meta models (`major * 10`; 90 unless set).
    arch: u32,
    /// The multiprocessors of the GPU meta models (132 unless set).
    multiprocessors: usize,
    /// Whether that GPU has cuDNN (yes unless set).
    cudnn: bool,
    dtype: Option<DType>,
    amp: Option<DType>,
    format: crate::layout::MemoryFormat,
}

impl<M: Module> Estimator<M> {
    /// An estimator for the model `build` makes on the device it is given.
    pub fn new(build: impl Fn(&Device) -> Result<M> + 'static) -> Estimator<M> {
        Estimator {
            build: Box::new(build),
            input: Vec::new(),
            input_dtype: None,
            targets: Vec::new(),
            clip: None,
            loss: Box::new(crate::nn::cross_entropy),
            optimizer: Box::new(|p| Ok(Box::new(Adam::new(p, 1e-3)?))),
            training: true,
            keep_output: true,
            steps: 2,
            outside: 0,
            arch: 90,
            multiprocessors: 132,
            cudnn: true,
            dtype: None,
            amp: None,
            format: crate::layout::MemoryFormat::Contiguous,
        }
    }

    /// One sample's shape (the batch dimension is added in front).
    pub fn input(mut self, shape: impl AsRef<[usize]>) -> Self {
        self.input = shape.as_ref().to_vec();
        self
    }

    /// The inputs' dtype (default: the parameters'); `DType::I64` for token ids
    /// (an embedding's input).
    pub fn input_dtype(mut self, dtype: DType) -> Self {
        self.input_dtype = Some(dtype);
        self
    }

    /// One sample's targets' shape (class indices, `int64`; the batch dimension is
    /// added in front). Default `[]`: one class per sample; `[T]` for a class at
    /// each of `T` positions (a language model's next tokens).
    pub fn targets(mut self, shape: impl AsRef<[usize]>) -> Self {
        self.targets = shape.as_ref().to_vec();
        self
    }

    /// Clips the gradients' total 2-norm to `max_norm` before each optimizer step
    /// ([`nn::clip_grad_norm_`](crate::nn::clip_grad_norm_)), as a training loop
    /// with clipping does, so that its temporaries are counted.
    pub fn clip_grad_norm(mut self, max_norm: f64) -> Self {
        self.clip = Some(max_norm);
        self
    }

    /// The loss of the output and the class-index targets (default: cross-entropy).
    pub fn loss(mut self, f: impl Fn(&Tensor, &Tensor) -> Result<Tensor> + 'static) -> Self {
        self.loss = Box::new(f);
        self
    }

    /// The optimizer over the model's parameters (default: Adam).
    pub fn optimizer(
        mut self,
        f: impl Fn(Vec<Tensor>) -> Result<Box<dyn Optimizer>> + 'static,
    ) -> Self {
        self.optimizer = Box::new(f);
        self
    }

    /// `false` estimates inference: one forward pass under `no_grad` in
    /// evaluation mode, no loss, no optimizer.
    pub fn training(mut self, on: bool) -> Self {
        self.training = on;
        self
    }

    /// Whether the training loop holds the model's output until the backward pass
    /// has finished (default: yes, as [`Trial`](crate::train::Trial) does, which
    /// returns each step's outputs for its metrics). `false` estimates a loop that
    /// keeps only the loss (`loss_fn(model(x), y).backward()`), whose output goes
    /// as soon as the loss's backward has read it: a language model's logits are
    /// then not alive at a peak later in the backward pass.
    pub fn keep_output(mut self, on: bool) -> Self {
        self.keep_output = on;
        self
    }

    /// Converts the model to `dtype` (a floating-point type) after building it
    /// ([`Module::to_dtype`]); the inputs take the parameters' dtype. Default: the
    /// model as built (float32 for ember's layers).
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = Some(dtype);
        self
    }

    /// Runs the forward passes and the loss under autocast to `dtype`
    /// ([`amp`](crate::amp), as `Trial::amp` does; `meta` follows CUDA's lists), so
    /// that the estimate counts the lower-precision activations and the casts of
    /// the parameters.
    pub fn amp(mut self, dtype: Option<DType>) -> Self {
        self.amp = dtype;
        self
    }

    /// Training steps to run (at least 1; default 2, since the optimizer's state
    /// appears in the first).
    pub fn steps(mut self, n: usize) -> Self {
        self.steps = n.max(1);
        self
    }

    /// The device the estimate is for: a CUDA device's compute capability decides
    /// cuBLAS's workspace (counted in [`Estimate::outside_allocator`]). `major` is
    /// the compute capability's major version (9 for Hopper).
    pub fn compute_capability(mut self, major: u32) -> Self {
        self.outside = if major >= 9 { 32 << 20 } else { 4 << 20 };
        // which kernels run (the fused attention needs 8.0 or later)
        self.arch = major * 10;
        self
    }

    /// Lays the model and the inputs out in `format`
    /// ([`Module::to_memory_format`], PyTorch's `model.to(memory_format=...)`),
    /// the model after building it, each batch as it is made: with
    /// [`MemoryFormat::ChannelsLast`](crate::MemoryFormat::ChannelsLast), a
    /// channels-last step (inputs of rank 4 only). Default: row-major.
    pub fn memory_format(mut self, format: crate::layout::MemoryFormat) -> Self {
        self.format = format;
        self
    }

    /// The number of multiprocessors of the GPU the estimate is for (132, an
    /// H100's or H200's, unless set): a GPU splits long reductions (a loss, a
    /// bias's gradient) in more chunks the more multiprocessors it has, and the
    /// chunks' partial sums take memory while they run.
    pub fn multiprocessors(mut self, count: usize) -> Self {
        self.multiprocessors = count.max(1);
        self
    }

    /// Whether the GPU the estimate is for has cuDNN (default: yes). Without it
    /// its convolutions take ember's im2col path (as with
    /// `ember::cuda::cudnn::set_enabled(false)`), which allocates otherwise;
    /// `ember::cuda::cudnn::is_available()` says so for this machine's GPUs.
    pub fn cudnn(mut self, available: bool) -> Self {
        self.cudnn = available;
        self
    }

    /// Estimates a step at `batch_size` samples.
    pub fn estimate(&self, batch_size: usize) -> Result<Estimate> {
        if batch_size == 0 {
            return Err(Error::invalid(
                "estimate",
                "the batch size must be at least 1",
            ));
        }
        if self.input.is_empty() {
            return Err(Error::invalid(
                "estimate",
                "set the shape of one input sample with .input([...]) (for images [C, H, W])",
            ));
        }
        let trace = Arc::new(Trace::default());
        let run = crate::backend::meta::account::with_hook(trace.clone(), || {
            crate::backend::meta::account::with_arch(self.arch, || {
                crate::backend::meta::account::with_multiprocessors(self.multiprocessors, || {
                    crate::backend::meta::account::with_cudnn(self.cudnn, || {
                        self.run(&trace, batch_size)
                    })
                })
            })
        });
        let summary = run?;
        let events = without_setup_temporaries(std::mem::take(&mut *lock(&trace.events)));
        let modules = std::mem::take(&mut *lock(&trace.modules));
        let outputs = std::mem::take(&mut *lock(&trace.outputs));
        let replay = replay(&events, None)?
            .ok_or_else(|| Error::invalid("estimate", "the unlimited replay ran out of memory"))?;
        let at_peak = replay.breakdown(&events, summary.buffer_bytes);
        let rows = report::module_rows(&events, &replay, &modules, &outputs, &summary.names);
        Ok(Estimate {
            batch_size,
            training: self.training,
            steps: if self.training { self.steps } else { 1 },
            dtype: summary.dtype,
            amp: self.amp,
            memory_format: self.format,
            peak_allocated: replay.peak_allocated,
            peak_reserved: replay.peak_reserved,
            peak_at: Moment {
                step: replay.peak_mark.0,
                phase: replay.peak_mark.1,
                module: modules[replay.peak_module as usize].clone(),
            },
            at_peak,
            parameters: summary.parameters,
            parameter_bytes: summary.parameter_bytes,
            buffer_bytes: summary.buffer_bytes,
            gradient_bytes: summary.gradient_bytes,
            optimizer_state_bytes: summary.optimizer_state_bytes,
            outside_allocator: self.outside,
            modules: rows,
            events: Arc::new(events),
        })
    }

    /// The largest batch size (up to `limit`) whose steps fit in `capacity` bytes
    /// ([`Estimate::fits`]), searched from `from` (a batch size the model can
    /// take: batch norm, for one, refuses a single sample per channel): doubling
    /// while it fits, then bisecting. `None` when not even one sample fits.
    pub fn max_batch(&self, from: usize, capacity: usize, limit: usize) -> Result<Option<usize>> {
        let fits = |b: usize| -> Result<bool> { Ok(self.estimate(b)?.fits(capacity)) };
        let from = from.clamp(1, limit.max(1));
        if limit == 0 {
            return Ok(None);
        }
        // lo fits (0: nothing known to), hi does not (or is past the limit)
        let (mut lo, mut hi) = if fits(from)? {
            let (mut lo, mut hi) = (from, from.saturating_mul(2));
            while hi <= limit && fits(hi)? {
                lo = hi;
                hi = hi.saturating_mul(2);
            }
            (lo, hi.min(limit.saturating_add(1)))
        } else {
            (0, from)
        };
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits(mid)? {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Ok((lo > 0).then_some(lo))
    }

    /// Builds the model and runs the steps on meta, marking the phases in `trace`.
    fn run(&self, trace: &Trace, batch: usize) -> Result<Summary> {
        let meta = Device::Meta;
        trace.mark(0, Phase::Setup);
        let mut model = (self.build)(&meta)?;
        if let Some(d) = self.dtype {
            model.to_dtype(d)?;
        }
        let channels_last = self.format == crate::layout::MemoryFormat::ChannelsLast;
        if channels_last {
            if self.input.len() != 3 {
                return Err(Error::invalid(
                    "estimate",
                    format!(
                        "a channels-last step takes inputs of rank 4 (a batch of [C, H, W] \
                         images); one sample here is {:?}",
                        self.input
                    ),
                ));
            }
            model.to_memory_format(self.format)?;
        }
        let state = model.state_dict();
        if let Some((name, t)) = state.iter().find(|(_, t)| t.device() != meta) {
            return Err(Error::invalid(
                "estimate",
                format!(
                    "the model's constructor must build on the device it is given; {name} is on {}",
                    t.device()
                ),
            ));
        }
        // (a tied weight counted once, as num_parameters counts it)
        let params = crate::nn::unique_named_parameters(&model);
        let bytes = |ts: &[(String, Tensor)]| -> usize {
            ts.iter()
                .map(|(_, t)| t.numel() * t.dtype().size_in_bytes())
                .sum()
        };
        let dtype = params.first().map(|(_, t)| t.dtype()).unwrap_or(DType::F32);
        let mut summary = Summary {
            dtype,
            parameters: params.iter().map(|(_, t)| t.numel()).sum(),
            parameter_bytes: bytes(&params),
            buffer_bytes: bytes(&model.named_buffers()),
            names: params.iter().map(|(n, t)| (n.clone(), t.numel())).collect(),
            gradient_bytes: 0,
            optimizer_state_bytes: 0,
        };
        drop(state);
        let mut shape = vec![batch];
        shape.extend_from_slice(&self.input);
        let mut target_shape = vec![batch];
        target_shape.extend_from_slice(&self.targets);
        let input_dtype = self.input_dtype.unwrap_or(dtype);
        // a batch as the loop makes it: channels-last made so, not copied
        let input = || -> Result<Tensor> {
            if channels_last {
                let nhwc = [shape[0], shape[2], shape[3], shape[1]];
                Tensor::empty(nhwc, input_dtype, &meta)?.permute([0, 3, 1, 2])
            } else {
                Tensor::empty(shape.as_slice(), input_dtype, &meta)
            }
        };
        if !self.training {
            model.set_training(false);
            let _ng = crate::autograd::no_grad_guard();
            trace.mark(0, Phase::Inputs);
            let x = input()?;
            trace.mark(0, Phase::Forward);
            let _ac = self
                .amp
                .map(crate::tensor::autocast::autocast_guard)
                .transpose()?;
            let out = model.forward(&x).map_err(|e| in_model(e, &shape, trace))?;
            drop((out, x));
            return Ok(summary);
        }
        model.set_training(true);
        let params = model.parameters();
        let mut opt = (self.optimizer)(params.clone())?;
        for step in 0..self.steps {
            trace.mark(step, Phase::Inputs);
            let x = input()?;
            let y = Tensor::empty(target_shape.as_slice(), DType::I64, &meta)?;
            trace.mark(step, Phase::Forward);
            let ac = self
                .amp
                .map(crate::tensor::autocast::autocast_guard)
                .transpose()?;
            let out = model.forward(&x).map_err(|e| in_model(e, &shape, trace))?;
            let loss = (self.loss)(&out, &y)?;
            drop(ac);
            // (a loop that keeps only the loss lets the output go now: autograd
            // holds what the loss's backward reads of it until that has run)
            let out = self.keep_output.then_some(out);
            trace.mark(step, Phase::Backward);
            loss.backward()?;
            drop((loss, out));
            summary.gradient_bytes = model
                .parameters()
                .iter()
                .filter_map(|p| p.grad())
                .map(|g| g.numel() * g.dtype().size_in_bytes())
                .sum();
            trace.mark(step, Phase::Optimizer);
            if let Some(max_norm) = self.clip {
                crate::nn::clip_grad_norm_(&params, max_norm, 2.0, false)?;
            }
            opt.step()?;
            opt.zero_grad();
            drop((x, y));
        }
        summary.optimizer_state_bytes = opt
            .state()?
            .iter()
            .filter(|(_, t)| t.device() == meta)
            .map(|(_, t)| t.numel() * t.dtype().size_in_bytes())
            .sum();
        Ok(summary)
    }
}

/// The model's error for an input of `shape`, saying which input it was and
/// which module ran last before the failing one.
fn in_model(e: Error, shape: &[usize], trace: &Trace) -> Error {
    let last = lock(&trace.outputs).last().map(|(m, out, _)| {
        let path = lock(&trace.modules)[*m as usize].clone();
        format!("; the last module to finish was {path}, with output {out:?}")
    });
    match e {
        Error::InvalidArgument { op, msg } => Error::InvalidArgument {
            op,
            msg: format!(
                "{msg} (estimating a batch of input shape {shape:?}{})",
                last.unwrap_or_default()
            ),
        },
        e => e,
    }
}

/// What the run learns from the model and optimizer directly.
struct Summary {
    dtype: DType,
    parameters: usize,
    parameter_bytes: usize,
    buffer_bytes: usize,
    gradient_bytes: usize,
    optimizer_state_bytes: usize,
    /// Parameter names and element counts, for the module table.
    names: Vec<(String, usize)>,
}

/// `events` less the allocations made and freed while the model and optimizer
/// were being built (a float32 weight converted to bfloat16, an initialiser's
/// draw): the steps start from the state setup leaves, as they do on a GPU when the
/// model is built on the CPU and moved there, where such buffers never exist.
fn without_setup_temporaries(events: Vec<Event>) -> Vec<Event> {
    let setup_end = events
        .iter()
        .skip(1)
        .position(|e| matches!(e, Event::Mark { .. }))
        .map_or(events.len(), |i| i + 1);
    let made: std::collections::HashSet<u64> = events[..setup_end]
        .iter()
        .filter_map(|e| match *e {
            Event::Alloc { id, .. } => Some(id),
            _ => None,
        })
        .collect();
    let dropped: std::collections::HashSet<u64> = events[..setup_end]
        .iter()
        .filter_map(|e| match *e {
            Event::Free { id } if made.contains(&id) => Some(id),
            _ => None,
        })
        .collect();
    if dropped.is_empty() {
        return events;
    }
    events
        .into_iter()
        .filter(|e| match *e {
            Event::Alloc { id, .. } | Event::Free { id } => !dropped.contains(&id),
            Event::Mark { .. } => true,
        })
        .collect()
}

/// One entry of the trace.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Event {
    Alloc {
        id: u64,
        bytes: usize,
        workspace: bool,
        module: u32,
    },
    Free {
        id: u64,
    },
    Mark {
        step: usize,
        phase: Phase,
    },
}

/// Collects the events of a run (the meta accounting hook).
#[derive(Default)]
struct Trace {
    events: Mutex<Vec<Event>>,
    /// Module paths, by index (0 is the empty path).
    modules: Mutex<Vec<String>>,
    index: Mutex<HashMap<String, u32>>,
    /// (module index, output shape, dtype), in the order reported.
    outputs: Mutex<Vec<(u32, Vec<usize>, DType)>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Trace {
    fn mark(&self, step: usize, phase: Phase) {
        lock(&self.events).push(Event::Mark { step, phase });
    }

    fn module(&self, path: &str) -> u32 {
        let mut index = lock(&self.index);
        if let Some(&i) = index.get(path) {
            return i;
        }
        let mut modules = lock(&self.modules);
        if modules.is_empty() {
            modules.push(String::new());
            index.insert(String::new(), 0);
            if path.is_empty() {
                return 0;
            }
        }
        let i = modules.len() as u32;
        modules.push(path.to_string());
        index.insert(path.to_string(), i);
        i
    }
}

impl AllocHook for Trace {
    fn alloc(&self, e: &MetaEvent) {
        let module = self.module(e.module);
        lock(&self.events).push(Event::Alloc {
            id: e.id,
            bytes: e.bytes,
            workspace: e.workspace,
            module,
        });
    }

    fn free(&self, e: &MetaEvent) {
        lock(&self.events).push(Event::Free { id: e.id });
    }

    fn module_output(&self, module: &str, shape: &[usize], dtype: DType) {
        let m = self.module(module);
        lock(&self.outputs).push((m, shape.to_vec(), dtype));
    }
}

/// The allocator's view of the device in a replay: addresses handed out in
/// order, up to a capacity (none: unlimited, to find the peak).
struct Ledger {
    next: u64,
    capacity: Option<usize>,
    used: usize,
    sizes: HashMap<u64, usize>,
}

impl Ledger {
    fn new(capacity: Option<usize>) -> Ledger {
        Ledger {
            next: 1 << 32,
            capacity,
            used: 0,
            sizes: HashMap::new(),
        }
    }
}

impl RawMemory for Ledger {
    fn malloc(&mut self, bytes: usize) -> std::result::Result<u64, bool> {
        if self.capacity.is_some_and(|c| self.used + bytes > c) {
            return Err(true);
        }
        let p = self.next;
        // keep segments apart, aligned as the driver aligns them
        self.next += (bytes as u64).div_ceil(1 << 21).max(1) << 21;
        self.used += bytes;
        self.sizes.insert(p, bytes);
        Ok(p)
    }
    fn free(&mut self, ptr: u64) {
        self.used -= self.sizes.remove(&ptr).unwrap_or(0);
    }
    // a replay runs on one stream: no block waits for another's events
    type Event = ();
    fn record(&mut self, _s: StreamId) -> Option<()> {
        None
    }
    fn passed(&self, _e: &()) -> bool {
        true
    }
    fn destroy(&mut self, _e: ()) {}
    fn mem_info(&self) -> (usize, usize) {
        let c = self.capacity.unwrap_or(usize::MAX / 2);
        (c - self.used, c)
    }
    fn synchronize(&self) {}
}

/// How an allocation counts, from when it was made and whether it outlived the
/// phase that made it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Category {
    /// Made in setup and alive after it: parameters and buffers.
    State,
    Gradients,
    OptimizerState,
    Inputs,
    Activations,
    Temporaries,
    Workspaces,
}

/// One allocation's life in the trace.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Life {
    pub bytes: usize,
    pub block: usize,
    pub category: Category,
    pub module: u32,
    /// The mark (index into the marks) it was made in.
    pub mark: usize,
}

/// The result of replaying a trace through the caching allocator.
pub(crate) struct Replay {
    pub peak_allocated: usize,
    pub peak_reserved: usize,
    /// Index of the event at which `peak_allocated` was first reached.
    pub peak_event: usize,
    pub peak_mark: (usize, Phase),
    pub peak_module: u32,
    /// Every allocation, by id.
    pub lives: HashMap<u64, Life>,
}

/// Replays `events` through ember's caching allocator on a device of `capacity`
/// bytes (`None`: unlimited) and classifies each allocation; `None` when an
/// allocation fails even after the allocator released its cache and retried, as
/// it does on a GPU.
fn replay(events: &[Event], capacity: Option<usize>) -> Result<Option<Replay>> {
    let mut alloc = Allocator::new(Ledger::new(capacity));
    let mut addr: HashMap<u64, u64> = HashMap::new();
    let mut lives: HashMap<u64, Life> = HashMap::new();
    // per allocation: the mark it was made in and the mark it was freed in
    let mut freed_in: HashMap<u64, usize> = HashMap::new();
    let mut marks: Vec<(usize, Phase)> = Vec::new();
    let mut out = Replay {
        peak_allocated: 0,
        peak_reserved: 0,
        peak_event: 0,
        peak_mark: (0, Phase::Setup),
        peak_module: 0,
        lives: HashMap::new(),
    };
    for (i, e) in events.iter().enumerate() {
        match *e {
            Event::Mark { step, phase } => marks.push((step, phase)),
            Event::Alloc {
                id,
                bytes,
                workspace,
                module,
            } => {
                let a = match alloc.alloc(bytes, StreamId(0)) {
                    Ok(a) => a,
                    Err(AllocError::OutOfMemory { .. }) => return Ok(None),
                    Err(AllocError::Driver(e)) => {
                        return Err(Error::invalid(
                            "estimate",
                            format!("the allocator's replay failed: {e}"),
                        ))
                    }
                };
                addr.insert(id, a);
                let block = alloc.block_size(a).unwrap_or(0);
                let mark = marks.len().saturating_sub(1);
                let category = if workspace {
                    Category::Workspaces
                } else {
                    Category::Temporaries
                };
                lives.insert(
                    id,
                    Life {
                        bytes,
                        block,
                        category,
                        module,
                        mark,
                    },
                );
                let s = alloc.stats();
                if s.allocated > out.peak_allocated {
                    out.peak_allocated = s.allocated;
                    out.peak_event = i;
                    out.peak_mark = marks.get(mark).copied().unwrap_or((0, Phase::Setup));
                    out.peak_module = module;
                }
            }
            Event::Free { id } => {
                // storages made before the estimate began are not in the replay
                if let Some(a) = addr.remove(&id) {
                    alloc.free(a);
                    freed_in.insert(id, marks.len().saturating_sub(1));
                }
            }
        }
    }
    let s = alloc.stats();
    out.peak_reserved = s.peak_reserved;
    // classify: freed in the mark that made it -> temporary (or workspace);
    // otherwise by the phase that made it
    for (id, life) in lives.iter_mut() {
        if life.category == Category::Workspaces {
            continue;
        }
        if freed_in.get(id) == Some(&life.mark) {
            continue;
        }
        life.category = match marks.get(life.mark).map(|m| m.1) {
            Some(Phase::Setup) | None => Category::State,
            Some(Phase::Inputs) => Category::Inputs,
            Some(Phase::Forward) => Category::Activations,
            Some(Phase::Backward) => Category::Gradients,
            Some(Phase::Optimizer) => Category::OptimizerState,
        };
    }
    out.lives = lives;
    Ok(Some(out))
}

impl Replay {
    /// What was allocated just after the peak event, by category; the model's
    /// state splits into parameters and `buffer_bytes` of buffers.
    fn breakdown(&self, events: &[Event], buffer_bytes: usize) -> Breakdown {
        let mut live = std::collections::HashSet::new();
        for e in events.iter().take(self.peak_event + 1) {
            match *e {
                Event::Alloc { id, .. } => {
                    live.insert(id);
                }
                Event::Free { id } => {
                    live.remove(&id);
                }
                Event::Mark { .. } => {}
            }
        }
        let mut b = Breakdown::default();
        for id in &live {
            if let Some(l) = self.lives.get(id) {
                b.add(l.category, l.bytes);
                b.rounding += l.block - l.bytes;
            }
        }
        let buffers = buffer_bytes.min(b.parameters);
        b.parameters -= buffers;
        b.buffers = buffers;
        b
    }
}
