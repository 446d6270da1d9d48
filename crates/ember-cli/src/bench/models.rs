//! The `models` suite: training steps of real-size models, where the time goes to
//! the device's kernels rather than to per-op overhead:
//! - ResNet-50 (`models::resnet50`, 1000 classes), SGD with momentum 0.9 (lr 0.01,
//!   no weight decay), cross-entropy; batch 64 of 224×224 images on a GPU, 2 on
//!   the CPU;
//! - GPT-2 small (`models::gpt2_small`), AdamW (lr 6e-4, weight decay 0.1 on the
//!   matrices and embeddings, none on biases and norms, as `ember train text`
//!   groups them), gradients clipped to norm 1.0, cross-entropy over the
//!   vocabulary; batch 8 × 1024 tokens on a GPU, 1 × 128 on the CPU;
//!
//! each in float32 and under bfloat16 autocast, in images or tokens per second,
//! with the step's peak device memory (a GPU's `max_memory_allocated`) beside
//! `ember estimate`'s prediction for the same step. Where cuDNN is in use (the
//! default where it loads), ResNet-50 also runs channels-last with
//! `cudnn.benchmark` (the model and the batch laid out so, convolved by cuDNN's
//! NHWC kernels with the algorithms its timed search finds fastest), as PyTorch's
//! reference row of the same name, its estimate channels-last too. On a GPU the
//! bf16 GPT row runs again with its attention on cuDNN's fused engines
//! (`cuda::cudnn::set_attention(true)`, off by default), beside PyTorch's row
//! of that name (its cuDNN attention backend). `--quick`
//! shrinks both models
//! (ResNet-50 on 32×32 images, a 2-layer GPT of width 128) so the suite runs in
//! seconds. `bench/pytorch/device_ops.py --suite models` runs the same steps in
//! PyTorch, with its reference rows (channels-last with cuDNN autotuning,
//! `torch.compile`).
//!
//! [`workloads`] lists the rows without running them; each builds its model only
//! when asked, so one row's model is gone before the next is built.

use super::stats::{Row, Work};
use super::Ctx;
use ember::memory::Estimator;
use ember::models::{self, CharGpt, GptConfig};
use ember::nn;
use ember::optim::{split_for_weight_decay, Adam, Groups, Optimizer, Sgd};
use ember::prelude::*;
use ember::{autocast_guard, cuda, MemoryFormat};

/// One training step of a built workload.
pub(crate) type Step = Box<dyn FnMut() -> Result<()>>;

/// One row of the suite, not built yet.
pub(crate) struct Workload {
    /// The row's name, the same in PyTorch's rows.
    pub name: String,
    /// Images or tokens per step.
    pub work: Work,
    /// Builds the model, its optimizer and a fixed batch on the device, and
    /// returns the training step (which owns them: dropping it frees them).
    pub build: Box<dyn FnOnce() -> Result<Step>>,
    /// `ember estimate`'s peak of allocated memory for the same step, on meta
    /// (`None` where meta does not model the step's path).
    pub estimate: Box<dyn FnOnce() -> Result<Option<usize>>>,
}

const RESNET_LR: f64 = 0.01;
const GPT_LR: f64 = 6e-4;
const GPT_WEIGHT_DECAY: f64 = 0.1;
const GPT_CLIP: f64 = 1.0;

/// The precisions every model runs in: float32, and bfloat16 autocast.
const PRECISIONS: [(Option<DType>, &str); 2] = [(None, ""), (Some(DType::BF16), ", autocast bf16")];

/// The multiprocessors of `dev` where it is a GPU, else an H100's (132): how the
/// estimate splits long sums as the GPU does.
fn multiprocessors(dev: Device) -> usize {
    match dev {
        Device::Cuda(i) => {
            cuda::device_properties(i).map_or(132, |p| p.multiprocessor_count as usize)
        }
        _ => 132,
    }
}

/// The suite's rows on `cx`'s device, unbuilt, in the order they run.
pub(crate) fn workloads(cx: &Ctx) -> Vec<Workload> {
    let dev = cx.dev;
    let gpu = dev.is_cuda();
    let (b, hw) = match (cx.quick, gpu) {
        (true, _) => (2, 32),
        (false, true) => (64, 224),
        (false, false) => (2, 224),
    };
    let (config, gpt_name, gb, t) = if cx.quick {
        let c = GptConfig {
            vocab_size: 512,
            context: 64,
            layers: 2,
            heads: 2,
            width: 128,
            dropout: 0.0,
        };
        (c, "gpt 2x128 v512".to_string(), 2, 64)
    } else {
        let (gb, t) = if gpu { (8, 1024) } else { (1, 128) };
        (GptConfig::gpt2_small(), "gpt2_small".to_string(), gb, t)
    };
    let mut all = Vec::new();
    benchmark_as_started();
    // channels-last rows where cuDNN convolves (ember's own kernels are row-major)
    let channels_last = gpu && cuda::cudnn::in_use();
    for (amp, suffix) in PRECISIONS {
        all.push(resnet50_workload(dev, b, hw, amp, suffix, false));
        if channels_last {
            all.push(resnet50_workload(dev, b, hw, amp, suffix, true));
        }
    }
    for (amp, suffix) in PRECISIONS {
        // and on a GPU the half-precision row again with its attention on
        // cuDNN's fused engines (off by default)
        for cudnn_attention in [false, true] {
            if !cudnn_attention || (gpu && amp.is_some()) {
                let (shape, name) = ((gb, t), &gpt_name);
                all.push(gpt_workload(
                    dev,
                    config,
                    name,
                    shape,
                    amp,
                    suffix,
                    cudnn_attention,
                ));
            }
        }
    }
    all
}

/// Runs `f` with `cuda::cudnn::set_attention(on)`, then restores the switch
/// (also when `f` panics).
pub(crate) fn with_cudnn_attention<R>(on: bool, f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            cuda::cudnn::set_attention(self.0);
        }
    }
    let _restore = Restore(cuda::cudnn::attention());
    cuda::cudnn::set_attention(on);
    f()
}

/// Says on stderr when a row meant for cuDNN's attention ran none of it (every
/// call fell back to ember's kernels: `EMBER_CUDNN_LOG=1` says why).
pub(crate) fn warn_unless_cudnn_attention_ran(name: &str, passes_before: u64) {
    if cuda::cudnn::attention_passes() == passes_before {
        eprintln!(
            "warning: {name}: no attention ran on cuDNN (ember's kernels ran; \
             EMBER_CUDNN_LOG=1 says why)"
        );
    }
}

/// `--profile`: the steps to profile per row, and the trace file they name.
pub(crate) struct ProfileRequest {
    pub steps: usize,
    pub trace: Option<std::path::PathBuf>,
}

/// Times each workload whose name contains `filter` (built only then, and
/// dropped before the next), with its peak memory on a GPU and its estimate;
/// with `profile`, then profiles a few more of its steps and prints the table.
pub(crate) fn suite(
    cx: &Ctx,
    filter: Option<&str>,
    profile: Option<&ProfileRequest>,
) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for w in workloads(cx) {
        if filter.is_some_and(|f| !w.name.contains(f)) {
            continue;
        }
        let estimate = (w.estimate)()?;
        let mut step = (w.build)()?;
        let name = w.name.clone();
        let passes = cuda::cudnn::attention_passes();
        let mut row = cx.row(w.name, w.work, &mut step)?;
        if name.ends_with("cudnn attention") {
            warn_unless_cudnn_attention_ran(&name, passes);
        }
        row.peak_bytes = peak_of_step(&cx.dev, &mut step)?;
        row.estimate_bytes = estimate;
        rows.push(row);
        if let Some(p) = profile {
            // the timing above warmed it up
            let prof = ember::profiler::Profiler::start()?;
            for _ in 0..p.steps {
                ember::profiler::record_function("train_step", &mut step)?;
            }
            let recorded = prof.stop()?;
            let trace = p
                .trace
                .as_ref()
                .map(|t| crate::profile::trace_path(t, Some(&format!("{} {name}", cx.dev))));
            println!();
            crate::profile::report(
                &recorded,
                &format!("{name} on {}", cx.dev),
                p.steps,
                trace.as_deref(),
            )?;
        }
    }
    Ok(rows)
}

/// The allocated memory at the peak of one more step, from the memory the step
/// starts with (a GPU's statistics; `None` on the CPU, which keeps none).
fn peak_of_step(dev: &Device, step: &mut Step) -> Result<Option<usize>> {
    if !dev.is_cuda() {
        return Ok(None);
    }
    cuda::synchronize(dev)?;
    cuda::reset_peak_memory_stats(dev)?;
    step()?;
    cuda::synchronize(dev)?;
    Ok(Some(cuda::max_memory_allocated(dev)?))
}

/// ResNet-50, SGD with momentum, on a fixed batch of `b` random `hw`×`hw` images;
/// with `channels_last`, the model and the batch laid out channels-last.
fn resnet50_workload(
    dev: Device,
    b: usize,
    hw: usize,
    amp: Option<DType>,
    suffix: &str,
    channels_last: bool,
) -> Workload {
    let sgd = |p: Vec<Tensor>| -> Result<Box<dyn Optimizer>> {
        Ok(Box::new(Sgd::new(p, RESNET_LR)?.momentum(0.9)?))
    };
    let format = if channels_last {
        MemoryFormat::ChannelsLast
    } else {
        MemoryFormat::Contiguous
    };
    // PyTorch's reference row's name, and its settings
    let layout = if channels_last {
        ", channels_last + cudnn.benchmark"
    } else {
        ""
    };
    Workload {
        name: format!("train resnet50 b{b} {hw}x{hw}{suffix}{layout}"),
        work: Work::Samples {
            n: b as f64,
            flops: None,
        },
        build: Box::new(move || {
            ember::manual_seed(0);
            let mut model = models::resnet50(1000, &dev)?;
            model.to_memory_format(format)?;
            let mut opt = sgd(model.parameters())?;
            let x = Tensor::randn([b, 3, hw, hw], &Device::Cpu)?
                .to(&dev)?
                .to_memory_format(format)?;
            let y = Tensor::randint(0, 1000, [b], &Device::Cpu)?.to(&dev)?;
            Ok(Box::new(move || {
                // timed algorithms for the channels-last row, the process's
                // setting for the others (an atomic store: each row sets its own
                // before its first convolution)
                cuda::cudnn::set_benchmark(channels_last || benchmark_as_started());
                opt.zero_grad();
                let ac = amp.map(autocast_guard).transpose()?;
                let loss = nn::cross_entropy(&model.forward(&x)?, &y)?;
                drop(ac);
                loss.backward()?;
                opt.step()
            }))
        }),
        estimate: Box::new(move || {
            // (the step keeps only the loss: its logits go after their gradient)
            let e = Estimator::new(|d| models::resnet50(1000, d))
                .input([3, hw, hw])
                .keep_output(false)
                .optimizer(sgd)
                .amp(amp)
                .memory_format(format)
                .multiprocessors(multiprocessors(dev))
                .cudnn(!dev.is_cuda() || cuda::cudnn::is_available())
                .estimate(b)?;
            Ok(Some(e.peak_allocated))
        }),
    }
}

/// Whether cuDNN's algorithms were timed (`EMBER_CUDNN_BENCHMARK`) before the
/// channels-last rows switched it on for themselves.
fn benchmark_as_started() -> bool {
    static AS_STARTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AS_STARTED.get_or_init(cuda::cudnn::benchmark)
}

/// AdamW over two groups, as `ember train text` makes them: weight decay on the
/// matrices and embedding tables, none on biases and norms.
fn gpt_optimizer(params: Vec<Tensor>) -> Result<Box<dyn Optimizer>> {
    let (decay, no_decay) = split_for_weight_decay(params);
    Ok(Box::new(Groups::new(vec![
        Box::new(Adam::adamw(decay, GPT_LR)?.weight_decay(GPT_WEIGHT_DECAY)?),
        Box::new(Adam::adamw(no_decay, GPT_LR)?.weight_decay(0.0)?),
    ])?))
}

/// FLOPs of a training step per token of a GPT: six per parameter that
/// multiplies (all but the position embeddings; the tied head counts once, as
/// the product it is) and the attention's products, `12 · layers · width · T`
/// (the causal half not subtracted): the PaLM paper's count.
fn gpt_flops_per_token(c: &GptConfig, t: usize) -> f64 {
    let w = c.width;
    let per_layer = 12 * w * w + 13 * w;
    let params = c.vocab_size * w + c.layers * per_layer + 2 * w;
    6.0 * params as f64 + 12.0 * (c.layers * w * t) as f64
}

/// A GPT with its head tied to the token embedding, on a fixed batch of `b`
/// sequences of `t` random token ids (and random next tokens).
fn gpt_workload(
    dev: Device,
    config: GptConfig,
    name: &str,
    (b, t): (usize, usize),
    amp: Option<DType>,
    suffix: &str,
    cudnn_attention: bool,
) -> Workload {
    let v = config.vocab_size as i64;
    let attention = if cudnn_attention {
        ", cudnn attention"
    } else {
        ""
    };
    Workload {
        name: format!("train {name} b{b}x{t}{suffix}{attention}"),
        work: Work::Samples {
            n: (b * t) as f64,
            flops: Some(gpt_flops_per_token(&config, t) * (b * t) as f64),
        },
        build: Box::new(move || {
            ember::manual_seed(0);
            let gpt = CharGpt::new_tied(config, &dev)?;
            let params = gpt.parameters();
            let mut opt = gpt_optimizer(params.clone())?;
            let x = Tensor::randint(0, v, [b, t], &Device::Cpu)?.to(&dev)?;
            let y = Tensor::randint(0, v, [b, t], &Device::Cpu)?.to(&dev)?;
            Ok(Box::new(move || {
                with_cudnn_attention(cudnn_attention, || {
                    opt.zero_grad();
                    let ac = amp.map(autocast_guard).transpose()?;
                    let loss = gpt.loss(&x, &y)?;
                    drop(ac);
                    loss.backward()?;
                    nn::clip_grad_norm_(&params, GPT_CLIP, 2.0, false)?;
                    opt.step()
                })
            }))
        }),
        estimate: Box::new(move || {
            // (`CharGpt::loss` keeps only the loss: the logits go after their
            // gradient)
            let e = Estimator::new(move |d| CharGpt::new_tied(config, d))
                .input([t])
                .input_dtype(DType::I64)
                .targets([t])
                .keep_output(false)
                .loss(|logits, y| nn::cross_entropy(&logits.flatten(0, 1)?, &y.flatten(0, 1)?))
                .optimizer(gpt_optimizer)
                .clip_grad_norm(GPT_CLIP)
                .amp(amp)
                .multiprocessors(multiprocessors(dev))
                .cudnn(!dev.is_cuda() || cuda::cudnn::is_available());
            let e = with_cudnn_attention(cudnn_attention, || e.estimate(b))?;
            Ok(Some(e.peak_allocated))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt_flops_count_six_per_parameter_and_the_attention() -> Result<()> {
        // GPT-2 small: 124,475,904 parameters less 1024 × 768 position embeddings
        let c = GptConfig::gpt2_small();
        let n = models::gpt2_small(&Device::Meta)?.num_parameters() - 1024 * 768;
        let want = 6.0 * n as f64 + 12.0 * (12 * 768 * 1024) as f64;
        assert_eq!(gpt_flops_per_token(&c, 1024), want);
        Ok(())
    }

    #[test]
    fn workloads_are_listed_before_anything_is_built() {
        let cx = Ctx {
            dev: Device::Cpu,
            budget: std::time::Duration::from_millis(1),
            quick: true,
        };
        let names: Vec<String> = workloads(&cx).into_iter().map(|w| w.name).collect();
        assert_eq!(
            names,
            [
                "train resnet50 b2 32x32",
                "train resnet50 b2 32x32, autocast bf16",
                "train gpt 2x128 v512 b2x64",
                "train gpt 2x128 v512 b2x64, autocast bf16",
            ]
        );
    }
}
