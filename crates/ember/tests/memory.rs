//! The memory estimator: its numbers add up and are exact where they can be, it
//! agrees with the caching allocator's measured peak on a (simulated) GPU, its
//! batch search agrees with estimates around it, and bad input is an error.
//!
//! The comparisons with measurement read the device's process-wide counters, so
//! they live in this binary and take turns; each skips, saying why, without a GPU (CI
//! runs it on the CUDA simulator, whose caching allocator is ember's real one).

mod common;
#[path = "common/training.rs"]
mod training;

use ember::memory::{parse_bytes, Estimator, Phase};
use ember::nn::{self, Module};
use ember::prelude::*;
use ember::{models, Conv2dOptions, Conv3dOptions};
use training::*;

/// `cuda:0` and this binary's turn on it: the comparisons read the device's
/// process-wide peak, so they run one at a time.
fn gpu(test: &str) -> Option<(Device, std::sync::MutexGuard<'static, ()>)> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let dev = common::gpu(test)?;
    Some((dev, TURN.lock().unwrap_or_else(|p| p.into_inner())))
}

#[test]
fn the_breakdown_adds_up_and_the_state_is_exact() -> Result<()> {
    for (name, est) in [
        ("mlp adam", Estimator::new(mlp).input([784]).estimate(64)?),
        (
            "cnn sgd",
            Estimator::new(mnist_cnn)
                .input([1, 28, 28])
                .optimizer(sgd)
                .estimate(32)?,
        ),
    ] {
        assert_eq!(est.at_peak.total(), est.peak_allocated, "{name}");
        assert!(est.peak_reserved >= est.peak_allocated, "{name}");
        // parameters and optimizer state are exact
        let m = if name.starts_with("mlp") {
            mlp(&Device::Meta)?
        } else {
            mnist_cnn(&Device::Meta)?
        };
        let n: usize = m.parameters().iter().map(|p| p.numel()).sum();
        assert_eq!(est.parameters, n, "{name}");
        assert_eq!(est.parameter_bytes, 4 * n, "{name}");
        assert_eq!(est.gradient_bytes, 4 * n, "{name}");
        let moments = if name.ends_with("adam") { 2 } else { 1 };
        assert_eq!(est.optimizer_state_bytes, moments * 4 * n, "{name}");
        // at the peak, every parameter and buffer is alive
        assert_eq!(est.at_peak.parameters, est.parameter_bytes, "{name}");
        assert_eq!(est.at_peak.buffers, est.buffer_bytes, "{name}");
        // the second step's peak holds the first step's optimizer state
        assert!(est.peak_at.step >= 1, "{name}: {:?}", est.peak_at);
        assert_eq!(
            est.at_peak.optimizer_state, est.optimizer_state_bytes,
            "{name}"
        );
        assert!(est.at_peak.inputs > 0 && est.at_peak.rounding < est.peak_allocated);
    }
    // batch norm's running statistics are buffers
    let est = Estimator::new(mnist_cnn).input([1, 28, 28]).estimate(8)?;
    assert_eq!(est.buffer_bytes, 2 * 32 * 4 + 8);
    Ok(())
}

#[test]
fn inference_needs_less_than_training() -> Result<()> {
    let e = Estimator::new(mlp).input([784]);
    let train = e.estimate(256)?;
    let infer = Estimator::new(mlp)
        .input([784])
        .training(false)
        .estimate(256)?;
    assert!(!infer.training);
    assert_eq!(infer.at_peak.gradients + infer.at_peak.optimizer_state, 0);
    assert!(infer.peak_allocated < train.peak_allocated);
    assert_ne!(infer.peak_at.phase, Phase::Backward);
    assert_eq!(train.peak_at.phase, Phase::Backward);
    Ok(())
}

/// Checkpointed blocks keep one block's activations at a time: the peak
/// holds fewer activations than the same model's without checkpoints, and the
/// parameters, gradients and optimizer state are the same.
#[test]
fn checkpointed_blocks_hold_fewer_activations() -> Result<()> {
    let plain = Estimator::new(deep_mlp_plain).input([784]).estimate(2048)?;
    let ckpt = Estimator::new(deep_mlp_checkpointed)
        .input([784])
        .estimate(2048)?;
    assert_eq!(plain.parameter_bytes, ckpt.parameter_bytes);
    assert_eq!(plain.optimizer_state_bytes, ckpt.optimizer_state_bytes);
    // six 512-wide layers of 2048 rows, two saved tensors each (the linear's
    // input, GELU's input): 48 MiB of float32 without checkpoints; with them,
    // the three blocks' inputs and, while a block is recomputed, its own
    let layer = 2048 * 512 * 4;
    assert!(
        plain.at_peak.activations >= 12 * layer,
        "{}",
        plain.at_peak.activations
    );
    assert!(
        ckpt.at_peak.activations + 6 * layer <= plain.at_peak.activations,
        "checkpointed {} vs plain {}",
        ckpt.at_peak.activations,
        plain.at_peak.activations
    );
    assert!(
        ckpt.peak_allocated + 4 * layer <= plain.peak_allocated,
        "checkpointed {} vs plain {}",
        ckpt.peak_allocated,
        plain.peak_allocated
    );
    Ok(())
}

#[test]
fn activations_grow_with_the_batch() -> Result<()> {
    let e = Estimator::new(digits_cnn).input([1, 8, 8]);
    let (a, b) = (e.estimate(64)?, e.estimate(128)?);
    assert_eq!(a.parameter_bytes, b.parameter_bytes);
    assert!(b.peak_allocated > a.peak_allocated);
    // a convolution's patch matrix is counted where the CUDA path makes one
    assert!(a.at_peak.workspaces > 0 || a.at_peak.temporaries > 0);
    Ok(())
}

/// The search's answer fits and the next batch does not. (Memory is not quite
/// monotonic in the batch size: which pool and segment size a tensor gets
/// changes with its size, so a larger batch can occasionally fit where a smaller
/// one does not; like any bisection, the search finds a boundary.)
#[test]
fn max_batch_is_the_largest_batch_that_fits() -> Result<()> {
    let e = Estimator::new(mlp).input([784]).compute_capability(9);
    for capacity in [100 << 20, 1 << 30] {
        let best = e.max_batch(64, capacity, 1 << 20)?.expect("a batch fits");
        assert!(e.estimate(best)?.fits(capacity), "{best}");
        assert!(!e.estimate(best + 1)?.fits(capacity), "{best}");
    }
    // searching down from a batch that does not fit
    let best = e
        .max_batch(1 << 14, 100 << 20, 1 << 20)?
        .expect("a batch fits");
    assert!(e.estimate(best)?.fits(100 << 20) && !e.estimate(best + 1)?.fits(100 << 20));
    let none = e.max_batch(8, 1 << 20, 1 << 16)?;
    assert_eq!(none, None, "1 MiB holds not even the model");
    assert_eq!(
        e.max_batch(8, 1 << 30, 100)?,
        Some(100),
        "the limit caps it"
    );
    Ok(())
}

#[test]
fn bad_input_is_an_error() -> Result<()> {
    let e = Estimator::new(mlp).input([784]);
    assert!(e
        .estimate(0)
        .unwrap_err()
        .to_string()
        .contains("batch size"));
    let err = Estimator::new(mlp).estimate(4).unwrap_err().to_string();
    assert!(err.contains(".input"), "{err}");
    // an input the model cannot take: the error names the shapes
    let err = Estimator::new(mlp)
        .input([100])
        .estimate(4)
        .unwrap_err()
        .to_string();
    assert!(err.contains("100") && err.contains("784"), "{err}");
    let err = Estimator::new(digits_cnn)
        .input([1, 1, 1])
        .estimate(4)
        .unwrap_err()
        .to_string();
    // the pooling layer's own shapes, the batch's, and the module before it
    assert!(err.contains("[4, 1, 1, 1]"), "{err}");
    assert!(err.contains("last module to finish was 3"), "{err}");
    // a constructor that ignores the device it is given
    let err = Estimator::new(|_| mlp(&Device::Cpu))
        .input([784])
        .estimate(4)
        .unwrap_err()
        .to_string();
    assert!(err.contains("device it is given"), "{err}");
    for (s, want) in [
        ("12GiB", 12usize << 30),
        ("12 GiB", 12 << 30),
        ("1.5G", 3 << 29),
        ("80GB", 80_000_000_000),
        ("512MiB", 512 << 20),
        ("4096", 4096),
    ] {
        assert_eq!(parse_bytes(s)?, want, "{s}");
    }
    for s in ["", "GiB", "-3GiB", "12 parsecs", "0", "1e30GB"] {
        assert!(parse_bytes(s).is_err(), "{s:?}");
    }
    // what ember prints (fmt_bytes: B, KiB, MiB, GiB with two decimals) reads
    // back within those decimals
    for n in [1, 1000, 38_440, 124_928, 5_000_000, 7 << 30] {
        let back = parse_bytes(&ember::memory::fmt_bytes(n))?;
        assert!(back.abs_diff(n) as f64 <= n as f64 * 0.005, "{n} -> {back}");
    }
    Ok(())
}

/// A decoder of the layers gen_nn.py's `layers2` checks (bilinear and nearest
/// upsampling, composites of index ops; a transposed convolution through the
/// convolution's backward-data pass; PReLU; instance norm; a 1-D convolution).
fn upsampling_decoder(dev: &Device) -> Result<nn::Sequential> {
    use nn::functional::{InterpolateMode, InterpolateOptions};
    let up = |o: InterpolateOptions| nn::Upsample::new(o);
    let ct = nn::ConvTranspose2dOptions::default()
        .stride(2)
        .padding(1)
        .output_padding(1);
    Ok(nn::Sequential::new()
        .add(nn::Conv2d::new(
            1,
            8,
            3,
            Conv2dOptions::default().padding(1),
            dev,
        )?)
        .add(nn::PReLU::new(8, dev)?)
        .add(up(
            InterpolateOptions::scale_factor(1.5).mode(InterpolateMode::Bilinear)
        ))
        .add(nn::InstanceNorm2d::with_options(8, true, true, dev)?)
        .add(nn::ConvTranspose2d::new(8, 4, 3, ct, dev)?)
        .add(up(InterpolateOptions::size([20, 20])))
        .add(nn::Flatten { start: 2, end: -1 })
        .add(nn::Conv1d::new(
            4,
            4,
            5,
            nn::Conv1dOptions::default().stride(4),
            dev,
        )?)
        .add(nn::Flatten::default())
        .add(nn::Linear::new(4 * 99, 10, dev)?))
}

/// The estimate of training the upsampling decoder equals the measured peak,
/// as the training cases' do.
#[test]
fn the_estimate_matches_the_allocators_peak_for_upsampling_layers() -> Result<()> {
    let Some((dev, _turn)) = gpu("the_estimate_matches_the_allocators_peak_for_upsampling_layers")
    else {
        return Ok(());
    };
    let case: Case = (
        "upsampling decoder, adam",
        upsampling_decoder,
        vec![1, 8, 8],
        16,
        adam,
        DType::F32,
    );
    check_training_cases(&dev, &[case], NO_CACHE_TOLERANCE)
}

/// The same steps run on `cuda:0`, from a fresh allocator: the estimate's peak
/// equals `max_memory_allocated` (minus what was allocated before) to the byte
/// (within a few percent in the memory checker's runs, without the caching
/// allocator).
#[test]
fn the_estimate_matches_the_allocators_peak_on_a_gpu() -> Result<()> {
    let Some((dev, _turn)) = gpu("the_estimate_matches_the_allocators_peak_on_a_gpu") else {
        return Ok(());
    };
    check_training_cases(&dev, &training_cases(), NO_CACHE_TOLERANCE)?;
    // under autocast (ember::amp, meta following CUDA's op lists): products in the
    // lower precision, the parameters' casts kept for the region (alive at the
    // peak, in the backward pass), losses in float32
    for (name, build, input, batch, amp) in [
        (
            "mlp, autocast bf16, adam",
            mlp as Build,
            vec![784],
            64,
            DType::BF16,
        ),
        (
            "digits cnn, autocast bf16, adam",
            digits_cnn,
            vec![1, 8, 8],
            64,
            DType::BF16,
        ),
        (
            "digits cnn, autocast f16, adam",
            digits_cnn,
            vec![1, 8, 8],
            256,
            DType::F16,
        ),
        (
            "encoder layer (fused attention), autocast bf16, adam",
            encoder,
            vec![16, 32],
            4,
            DType::BF16,
        ),
    ] {
        // the GPU's compute capability decides the kernels meta models (the fused
        // attention needs 8.0)
        let major = match dev {
            Device::Cuda(i) => ember::cuda::device_properties(i)?.compute_capability.0,
            _ => 9,
        };
        let est = Estimator::new(build)
            .multiprocessors(common::multiprocessors(&dev))
            .cudnn(ember::cuda::cudnn::is_available())
            .input(&input)
            .optimizer(adam)
            .amp(Some(amp))
            .compute_capability(major)
            .estimate(batch)?;
        let measured = measure(
            &dev,
            build,
            &input,
            batch,
            adam,
            (DType::F32, Some(amp)),
            est.steps,
        )?;
        // (the memory checker's runs: the MLP's estimate is 6.9% above the raw peak)
        check_estimate(name, est.peak_allocated, measured, 0.10, &est);
    }
    // inference: one forward pass under no_grad (where a convolution's patches
    // are alive while its bias is added)
    for (name, build, input, batch) in [
        (
            "digits cnn, inference",
            digits_cnn as Build,
            vec![1, 8, 8],
            256,
        ),
        ("alexnet on 63x63, inference", alexnet, vec![3, 63, 63], 4),
        // groups of 4 (fewer than the samples) and of 64 (more)
        ("grouped cnn, inference", grouped_cnn, vec![8, 16, 16], 16),
    ] {
        let est = Estimator::new(build)
            .multiprocessors(common::multiprocessors(&dev))
            .cudnn(ember::cuda::cudnn::is_available())
            .input(&input)
            .training(false)
            .estimate(batch)?;
        let measured = measure_inference(&dev, build, &input, batch)?;
        check_estimate(name, est.peak_allocated, measured, 0.05, &est);
    }
    Ok(())
}

/// How the attention test model masks its scores.
#[derive(Clone, Copy, Debug)]
enum Masking {
    None,
    Causal,
    /// A bool `[L, S]` mask (SDPA's: `true` allows).
    Square,
    /// A bool key padding mask shaped `[N, 1, 1, S]`.
    KeyPadding,
    /// A float mask per sample, `[N, 1, L, S]`.
    PerSample,
    /// Dropout on the weights, with a key padding mask.
    Dropout,
    /// MultiheadAttention in training with a key padding mask and dropout.
    Module,
}

/// Self-attention over `[N, L, E]` with `heads` heads, masked as `masking` says.
struct AttentionModel {
    proj: nn::Linear,
    mha: nn::MultiheadAttention,
    heads: usize,
    masking: Masking,
}

impl Module for AttentionModel {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        use ember::nn::functional::scaled_dot_product_attention as sdpa;
        let (n, l, e) = (x.shape()[0], x.shape()[1], x.shape()[2]);
        let dev = x.device();
        // keys past a third of the sequence are padding in every other sample
        let padding = || -> Result<Tensor> {
            let pos = Tensor::arange(0.0f32, l as f32, &dev)?.reshape([1, l])?;
            let odd = Tensor::arange(0.0f32, n as f32, &dev)?
                .remainder(2.0)?
                .reshape([n, 1])?;
            pos.ge((l / 3) as f64)?.logical_and(&odd.eq(1.0)?)
        };
        if let Masking::Module = self.masking {
            let opts = nn::AttentionOptions {
                key_padding_mask: Some(&padding()?),
                need_weights: false,
                ..Default::default()
            };
            return Ok(self.mha.attend(x, x, x, opts)?.0);
        }
        let h = self.heads;
        let split = |t: Tensor| t.reshape([n, l, h, e / h])?.transpose(1, 2);
        let qkv = self.proj.forward(x)?;
        let (q, k, v) = (
            split(qkv.narrow(2, 0, e)?)?,
            split(qkv.narrow(2, e as i64, e)?)?,
            split(qkv.narrow(2, 2 * e as i64, e)?)?,
        );
        let keys_allowed = || -> Result<Tensor> { padding()?.logical_not()?.reshape([n, 1, 1, l]) };
        let out = match self.masking {
            Masking::None => sdpa(&q, &k, &v, None, 0.0, false, None)?,
            Masking::Causal => sdpa(&q, &k, &v, None, 0.0, true, None)?,
            Masking::Square => {
                let m = Tensor::ones([l, l], DType::Bool, &dev)?.triu(-3)?;
                sdpa(&q, &k, &v, Some(&m), 0.0, false, None)?
            }
            Masking::KeyPadding => sdpa(&q, &k, &v, Some(&keys_allowed()?), 0.0, false, None)?,
            Masking::PerSample => {
                let m = Tensor::zeros([n, 1, l, l], q.dtype(), &dev)?;
                sdpa(&q, &k, &v, Some(&m), 0.0, false, None)?
            }
            Masking::Dropout => sdpa(&q, &k, &v, Some(&keys_allowed()?), 0.1, false, None)?,
            Masking::Module => unreachable!(),
        };
        out.transpose(1, 2)?.reshape([n, l, e])
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = self.proj.named_parameters();
        if let Masking::Module = self.masking {
            v = self.mha.named_parameters();
        }
        v
    }

    fn to_dtype(&mut self, dtype: DType) -> Result<()> {
        self.proj.to_dtype(dtype)?;
        self.mha.to_dtype(dtype)
    }
}

/// The memory-saving attention path keeps no `[L, S]` matrix per head for
/// backward with every kind of mask it takes (a key padding mask broadcast over
/// heads and queries, a per-sample mask, the causal one), under dropout (whose
/// masks its backward draws again), in bfloat16, and inside MultiheadAttention;
/// the plain path keeps them. Estimated on `meta`: 8 samples, 8 heads, length
/// 1024 make 64M scores, 256 MiB in float32; the saving path works on 4M at a time.
#[test]
fn the_memory_saving_attention_keeps_no_scores() -> Result<()> {
    use ember::nn::functional::{with_attention_path, AttentionPath};
    let (batch, len, width, heads) = (8usize, 1024usize, 64usize, 8usize);
    let scores = batch * heads * len * len * 4;
    for dtype in [DType::F32, DType::BF16] {
        for masking in [
            Masking::None,
            Masking::Causal,
            Masking::Square,
            Masking::KeyPadding,
            Masking::PerSample,
            Masking::Dropout,
            Masking::Module,
        ] {
            if dtype == DType::BF16 && !matches!(masking, Masking::KeyPadding | Masking::Dropout) {
                continue;
            }
            let est = Estimator::new(move |dev: &Device| {
                Ok(AttentionModel {
                    proj: nn::Linear::new(width, 3 * width, dev)?,
                    mha: nn::MultiheadAttention::with_options(width, heads, 0.1, true, true, dev)?,
                    heads,
                    masking,
                })
            })
            .input([len, width])
            .dtype(dtype)
            .loss(|y: &Tensor, _t: &Tensor| y.to_dtype(DType::F32)?.square()?.mean_all());
            let peak = |path| -> Result<usize> {
                Ok(with_attention_path(path, || est.estimate(batch))?.peak_allocated)
            };
            let (plain, saving) = (
                peak(AttentionPath::Math)?,
                peak(AttentionPath::MemoryEfficient)?,
            );
            let elem = if dtype == DType::F32 { 1 } else { 2 };
            // the plain path keeps at least the weights (in the dtype) for backward
            assert!(
                plain >= scores / elem,
                "{masking:?} {dtype}: plain path {plain} bytes, scores {scores}"
            );
            // the saving path's peak is a few 4M-score groups (16 MiB each in
            // float32, where half types are computed) and the inputs (the
            // per-sample mask is 32 MiB): under one float32 copy of the scores,
            // where the plain path's is four or more
            assert!(
                saving < scores,
                "{masking:?} {dtype}: memory-saving path {saving} bytes, scores {scores} (plain {plain})"
            );
            eprintln!(
                "{masking:?} {dtype}: plain {} MiB, saving {} MiB",
                plain >> 20,
                saving >> 20
            );
        }
    }
    Ok(())
}

/// Live meta bytes made on this thread while `f` runs and still alive after it.
fn live_after(f: impl FnOnce() -> Result<Tensor>) -> Result<(usize, Tensor)> {
    use ember::meta::{AllocHook, MetaEvent};
    use std::sync::atomic::{AtomicUsize, Ordering};
    #[derive(Default)]
    struct Live(AtomicUsize);
    impl AllocHook for Live {
        fn alloc(&self, e: &MetaEvent) {
            self.0.fetch_add(e.bytes, Ordering::Relaxed);
        }
        fn free(&self, e: &MetaEvent) {
            self.0.fetch_sub(e.bytes, Ordering::Relaxed);
        }
    }
    let live = std::sync::Arc::new(Live::default());
    let out = ember::meta::with_hook(live.clone(), f)?;
    Ok((live.0.load(Ordering::Relaxed), out))
}

/// Autograd keeps an input's values only where its rule reads them (PyTorch's
/// saved tensors): after the forward pass, a sum feeding a ReLU is gone (the sum
/// reads nothing, the ReLU its output), and so is a batch norm's output under a
/// ReLU; what stays is what backward will read.
#[test]
fn backward_keeps_only_what_its_rules_read() -> Result<()> {
    let dev = Device::Meta;
    let t = 8 * 4 * 16 * 16 * 4; // the bytes of one [8, 4, 16, 16] f32 activation
    let a = Tensor::zeros([8, 4, 16, 16], DType::F32, &dev)?.requires_grad_(true)?;
    let b = Tensor::zeros([8, 4, 16, 16], DType::F32, &dev)?.requires_grad_(true)?;
    let (live, y) = live_after(|| a.add(&b)?.relu())?;
    assert_eq!(
        live, t,
        "only the ReLU's output (which its rule reads) is alive"
    );
    drop(y);
    // conv -> batch norm -> ReLU -> conv: the first conv's output (batch norm's
    // input), the ReLU's output (read by the ReLU and the second conv) and the
    // result; not batch norm's output, and of its statistics a few bytes
    let conv = || nn::Conv2d::with_bias(4, 4, 3, false, Conv2dOptions::default().padding(1), &dev);
    let model = nn::Sequential::new()
        .add(conv()?)
        .add(nn::BatchNorm2d::new(4, &dev)?)
        .add(nn::ReLU)
        .add(conv()?);
    let x = Tensor::zeros([8, 4, 16, 16], DType::F32, &dev)?;
    let (live, y) = live_after(|| model.forward(&x))?;
    assert!(
        (3 * t..3 * t + 1024).contains(&live),
        "{live} bytes alive after the forward pass, {} activations",
        live as f64 / t as f64
    );
    y.sum_all()?.backward()?;
    Ok(())
}

/// A 3-D convolution keeps its input and weight for backward, as PyTorch's does,
/// not the depth slices each of its kernel's depth taps convolves (a copy of
/// about the input per tap: three inputs more for a 3 x 3 x 3 kernel): after
/// the forward pass only the output is new. Its backward holds the output's
/// gradient in depth-major order, the input's gradient, and one tap's slices
/// and their gradient at a time (no padded copy of the input or of its
/// gradient): four inputs and the weight's taps, besides workspaces. The
/// transposed convolution keeps no copy of its input either.
#[test]
fn conv3d_keeps_only_its_input_and_weight() -> Result<()> {
    let dev = Device::Meta;
    let x = Tensor::zeros([2, 8, 16, 16, 16], DType::F32, &dev)?.requires_grad_(true)?;
    let w = Tensor::zeros([8, 8, 3, 3, 3], DType::F32, &dev)?.requires_grad_(true)?;
    let b = Tensor::zeros([8], DType::F32, &dev)?.requires_grad_(true)?;
    let t = x.numel() * 4; // the bytes of the input, and of a same-size output
    for (opts, what) in [
        (Conv3dOptions::default().padding(1), "padding 1"),
        (Conv3dOptions::default().stride(2), "stride 2"),
    ] {
        let (live, y) = live_after(|| x.conv3d(&w, Some(&b), opts))?;
        assert_eq!(
            live,
            y.numel() * 4,
            "{what}: {live} bytes alive after the forward pass"
        );
        let peak = peak_of(|| y.sum_all()?.backward())?;
        assert!(
            peak <= 4 * t + 2 * w.numel() * 4,
            "{what}: backward's peak {peak} bytes, {} inputs",
            peak as f64 / t as f64
        );
        assert_eq!(
            x.grad().map(|g| g.shape().to_vec()),
            Some(x.shape().to_vec())
        );
        x.set_grad(None)?;
    }
    // the transposed convolution too: the output alone is new
    let (live, y) = live_after(|| {
        x.conv_transpose3d(
            &w,
            Some(&b),
            nn::ConvTranspose3dOptions::default().stride(2),
        )
    })?;
    assert_eq!(
        live,
        y.numel() * 4,
        "conv_transpose3d: {live} bytes alive after the forward pass"
    );
    Ok(())
}

/// The highest meta bytes of tensors alive at once, counted from zero, while
/// `f` runs (an op's workspace, which it frees before it returns, left out).
fn peak_of(f: impl FnOnce() -> Result<()>) -> Result<usize> {
    use ember::meta::{AllocHook, MetaEvent};
    use std::sync::atomic::{AtomicIsize, Ordering};
    #[derive(Default)]
    struct Peak(AtomicIsize, AtomicIsize);
    impl AllocHook for Peak {
        fn alloc(&self, e: &MetaEvent) {
            if !e.workspace {
                let b = e.bytes as isize;
                let now = self.0.fetch_add(b, Ordering::Relaxed) + b;
                self.1.fetch_max(now, Ordering::Relaxed);
            }
        }
        fn free(&self, e: &MetaEvent) {
            if !e.workspace {
                self.0.fetch_sub(e.bytes as isize, Ordering::Relaxed);
            }
        }
    }
    let peak = std::sync::Arc::new(Peak::default());
    ember::meta::with_hook(peak.clone(), f)?;
    Ok(peak.1.load(Ordering::Relaxed) as usize)
}

/// Under bfloat16 autocast a conv -> batch norm -> ReLU -> conv chain keeps its
/// activations in bfloat16, as PyTorch's does: each convolution keeps its bfloat16
/// input (not a float32 copy of it, which lives only while the convolution runs),
/// batch norm keeps its bfloat16 input, and the ReLU's backward runs in bfloat16
/// (its kernel widens to float32 inside) rather than through float32 copies.
#[test]
fn autocast_keeps_half_precision_activations() -> Result<()> {
    let dev = Device::Meta;
    let n = 8 * 4 * 16 * 16; // the elements of one [8, 4, 16, 16] activation
    let conv = || nn::Conv2d::with_bias(4, 4, 3, false, Conv2dOptions::default().padding(1), &dev);
    let model = nn::Sequential::new()
        .add(conv()?)
        .add(nn::BatchNorm2d::new(4, &dev)?)
        .add(nn::ReLU)
        .add(conv()?);
    let x = Tensor::zeros([8, 4, 16, 16], DType::F32, &dev)?;
    let (live, y) = live_after(|| ember::amp::autocast(DType::BF16, || model.forward(&x))?)?;
    assert_eq!(y.dtype(), DType::BF16);
    // the first conv's bfloat16 input, its output (batch norm's input), the ReLU's
    // output (read by the ReLU and the second conv) and the result: four bfloat16
    // activations, plus batch norm's statistics and nothing in float32
    let half = 2 * n;
    assert!(
        (4 * half..4 * half + 1024).contains(&live),
        "{live} bytes alive after the forward pass: {} bfloat16 activations",
        live as f64 / half as f64
    );
    drop(y);
    // a ReLU's backward in bfloat16 allocates the input's gradient and nothing
    // else (through float32 copies it would make three of four bytes an element)
    let a = Tensor::zeros([8, 4, 16, 16], DType::BF16, &dev)?.requires_grad_(true)?;
    let y = a.relu()?;
    let g = Tensor::ones([8, 4, 16, 16], DType::BF16, &dev)?;
    let peak = std::sync::Arc::new(common::MetaPeak::default());
    ember::meta::with_hook(peak.clone(), || y.backward_with(&g))?;
    let top = peak.top();
    assert_eq!(
        top, half as isize,
        "the ReLU's backward peaked {top} bytes above its start"
    );
    Ok(())
}

/// `Estimator::keep_output`: a loop that holds the model's output through the
/// backward pass and one that keeps only the loss, each against the allocator's
/// peak of the same loop on `cuda:0`. With an 8192-class head the two peaks
/// differ by the logits (`[64, 8192]` float32), so each estimate follows its loop.
#[test]
fn the_estimate_follows_whether_the_loop_holds_the_output() -> Result<()> {
    let est = |keep: bool, dev: &Device| -> Result<ember::memory::Estimate> {
        let mut e = Estimator::new(wide_head)
            .input([784])
            .optimizer(sgd)
            .keep_output(keep);
        if dev.is_cuda() {
            e = e
                .multiprocessors(common::multiprocessors(dev))
                .cudnn(ember::cuda::cudnn::is_available());
        }
        e.estimate(64)
    };
    let (held, let_go) = (est(true, &Device::Meta)?, est(false, &Device::Meta)?);
    let logits = 64 * 8192 * 4;
    assert_eq!(
        held.peak_allocated - let_go.peak_allocated,
        logits,
        "held {held}\nlet go {let_go}"
    );
    let Some((dev, _turn)) = gpu("the_estimate_follows_whether_the_loop_holds_the_output") else {
        return Ok(());
    };
    for keep in [true, false] {
        let e = est(keep, &dev)?;
        let format = ember::MemoryFormat::Contiguous;
        let measured = measure_in(
            (format, keep),
            &dev,
            wide_head,
            &[784],
            64,
            sgd,
            (DType::F32, None),
            e.steps,
        )?;
        let name = format!("wide head, output held: {keep}");
        check_estimate(&name, e.peak_allocated, measured, 0.05, &e);
    }
    Ok(())
}

/// A channels-last step (the model and each batch laid out so; convolutions,
/// batch norm and pooling keep the layout) on `cuda:0` against
/// `Estimator::memory_format`'s estimate, as the row-major steps above; a
/// channels-last request for an input of another rank is refused.
#[test]
fn the_channels_last_estimate_matches_the_allocators_peak() -> Result<()> {
    use ember::MemoryFormat::ChannelsLast;
    let err = Estimator::new(mlp)
        .input([784])
        .memory_format(ChannelsLast)
        .estimate(4)
        .unwrap_err()
        .to_string();
    assert!(err.contains("rank 4"), "{err}");
    let Some((dev, _turn)) = gpu("the_channels_last_estimate_matches_the_allocators_peak") else {
        return Ok(());
    };
    for (name, build, input, batch, amp) in [
        (
            "resnet-18 on 32x32, channels-last, sgd",
            resnet18 as Build,
            [3, 32, 32],
            4,
            None,
        ),
        (
            "mnist cnn with batch norm, channels-last, autocast bf16, sgd",
            mnist_cnn,
            [1, 28, 28],
            16,
            Some(DType::BF16),
        ),
    ] {
        let est = Estimator::new(build)
            .multiprocessors(common::multiprocessors(&dev))
            .cudnn(ember::cuda::cudnn::is_available())
            .input(input)
            .optimizer(sgd)
            .amp(amp)
            .memory_format(ChannelsLast)
            .estimate(batch)?;
        let measured = measure_in(
            (ChannelsLast, true),
            &dev,
            build,
            &input,
            batch,
            sgd,
            (DType::F32, amp),
            est.steps,
        )?;
        check_estimate(name, est.peak_allocated, measured, 0.05, &est);
    }
    Ok(())
}

/// An estimate for a GPU without cuDNN (`Estimator::cudnn(false)`) is of ember's
/// im2col path: in bfloat16 its convolutions make float32 copies that cuDNN's do
/// not, so the step needs more (with cuDNN switched off for the whole run, as the
/// memory checker's pass has it, both are the im2col path's).
#[test]
fn an_estimate_for_a_gpu_without_cudnn_is_of_the_im2col_path() -> Result<()> {
    let est = |cudnn: bool| -> Result<usize> {
        Ok(Estimator::new(digits_cnn)
            .input([1, 8, 8])
            .optimizer(sgd)
            .dtype(DType::BF16)
            .cudnn(cudnn)
            .estimate(256)?
            .peak_allocated)
    };
    let (with, without) = (est(true)?, est(false)?);
    if ember::cuda::cudnn::enabled() {
        assert!(without > with, "without cuDNN {without} bytes, with {with}");
    } else {
        assert_eq!(without, with);
    }
    Ok(())
}

/// ResNet-50's training step (batch 64, 224x224, SGD with momentum, 1000 classes)
/// needs at most what PyTorch 2.11's measured on an H200 for the same step
/// (`torch.cuda.max_memory_allocated`): 5636 MiB in float32 and 3141 MiB under
/// bfloat16 autocast. The estimate is the caching allocator's peak on a GPU.
#[test]
fn resnet50_needs_no_more_memory_than_pytorch() -> Result<()> {
    for (amp, pytorch_mib) in [(None, 5636), (Some(DType::BF16), 3141)] {
        let est = Estimator::new(|d| models::resnet50(1000, d))
            .input([3, 224, 224])
            .optimizer(sgd)
            .amp(amp)
            .estimate(64)?;
        at_most_pytorchs("resnet50 b64 sgd", amp, &est, pytorch_mib);
    }
    Ok(())
}

/// Asserts that `est`'s peak is at most PyTorch's measured `pytorch_mib` for the
/// step `what` under autocast `amp`, and prints both.
fn at_most_pytorchs(
    what: &str,
    amp: Option<DType>,
    est: &ember::memory::Estimate,
    pytorch_mib: u32,
) {
    let mib = est.peak_allocated as f64 / (1 << 20) as f64;
    eprintln!("{what}, autocast {amp:?}: {mib:.0} MiB (PyTorch {pytorch_mib} MiB)");
    assert!(
        mib <= pytorch_mib as f64,
        "{what}, autocast {amp:?}: {mib:.0} MiB, PyTorch {pytorch_mib} MiB\n{est}"
    );
}

/// The GPT-2-small step (batch 8 x 1024 tokens, Adam, cross-entropy over 50304
/// tokens) needs at most what PyTorch 2.11 measured on an H200 for the same layout:
/// 13172 MiB in float32 and 9537 MiB under bfloat16 autocast.
#[test]
fn gpt2_small_needs_no_more_memory_than_pytorch() -> Result<()> {
    for (amp, pytorch_mib) in [(None, 13172), (Some(DType::BF16), 9537)] {
        let est = Estimator::new(|d| models::by_name("gpt2_small", 0, d))
            .input([1024])
            .input_dtype(DType::I64)
            .targets([1024])
            .loss(|logits, y| nn::cross_entropy(&logits.flatten(0, 1)?, &y.flatten(0, 1)?))
            .amp(amp)
            .estimate(8)?;
        at_most_pytorchs("gpt2_small b8x1024 adam", amp, &est, pytorch_mib);
    }
    Ok(())
}

/// Cross-entropy over `[64, 1000]` bfloat16 logits on meta, from `loss` (which
/// makes it): the loss in `dtype`, fewer than `live_max` bytes alive after the
/// forward pass, and backward's peak the logits' bfloat16 gradient (within 4 KiB).
fn cross_entropy_memory(
    loss: impl FnOnce(&Tensor, &Tensor) -> Result<Tensor>,
    dtype: DType,
    live_max: impl FnOnce(usize) -> usize,
) -> Result<()> {
    let dev = Device::Meta;
    let (rows, classes) = (64, 1000);
    let logits = Tensor::zeros([rows, classes], DType::BF16, &dev)?.requires_grad_(true)?;
    let y = Tensor::zeros([rows], DType::I64, &dev)?;
    let (live, loss) = live_after(|| loss(&logits, &y))?;
    assert_eq!(loss.dtype(), dtype);
    assert!(
        live < live_max(rows),
        "{live} bytes alive after the forward pass"
    );
    let peak = std::sync::Arc::new(common::MetaPeak::default());
    ember::meta::with_hook(peak.clone(), || loss.backward())?;
    let top = peak.top() as usize;
    assert!(
        (2 * rows * classes..2 * rows * classes + 4096).contains(&top),
        "backward peaked {top} bytes above its start (the bfloat16 gradient is {})",
        2 * rows * classes
    );
    Ok(())
}

/// Cross-entropy under autocast reads half-precision logits in float32 without a
/// float32 copy of them: after the forward pass only the loss and one log-sum-exp
/// per row are new, and backward's peak is the logits' gradient in their dtype.
#[test]
fn cross_entropy_keeps_no_float32_copy_of_the_logits() -> Result<()> {
    cross_entropy_memory(
        |x, y| ember::amp::autocast(DType::BF16, || nn::cross_entropy(x, y))?,
        DType::F32,
        |rows| 4 * rows * 4 + 1024,
    )
}

/// Cross-entropy on bfloat16 logits outside autocast keeps no log-probabilities
/// of the logits' size (the composite `log_softmax` and `nll_loss` kept them, 2
/// bytes an element): after the forward pass only each row's loss and log-sum-exp
/// are new, and backward's peak is the logits' gradient.
#[test]
fn half_cross_entropy_keeps_no_log_probabilities() -> Result<()> {
    cross_entropy_memory(nn::cross_entropy, DType::BF16, |rows| 5 * rows * 4 + 1024)
}

/// Layer norm and RMS norm on bfloat16 rows with bfloat16 parameters read and
/// write bfloat16 (computing in float32): after the forward pass only the output
/// and each row's two float32 statistics are new, where the float32 route kept a
/// float32 copy of the input (4 bytes an element) for the backward; the
/// backward's peak is the input's bfloat16 gradient and the parameters', no
/// float32 gradient of the rows.
#[test]
fn half_norms_keep_no_float32_copy_of_their_input() -> Result<()> {
    let dev = Device::Meta;
    let (rows, cols) = (256, 512);
    for rms in [false, true] {
        let x = Tensor::zeros([rows, cols], DType::BF16, &dev)?.requires_grad_(true)?;
        let w = Tensor::zeros([cols], DType::BF16, &dev)?.requires_grad_(true)?;
        let b = Tensor::zeros([cols], DType::BF16, &dev)?.requires_grad_(true)?;
        let (live, y) = live_after(|| {
            if rms {
                nn::rms_norm(&x, &[cols], None, None)
            } else {
                nn::layer_norm(&x, &[cols], Some(&w), Some(&b), 1e-5)
            }
        })?;
        assert_eq!(y.dtype(), DType::BF16);
        let out = 2 * rows * cols;
        assert!(
            (out..out + 2 * 4 * rows + 1024).contains(&live),
            "rms {rms}: {live} bytes alive after the forward pass (the output is {out})"
        );
        let peak = std::sync::Arc::new(common::MetaPeak::default());
        let loss = y.sum_all()?;
        ember::meta::with_hook(peak.clone(), || loss.backward())?;
        let top = peak.top() as usize;
        // the upstream gradient made contiguous and the input's, in bfloat16,
        // and the parameters' float32 partial sums over chunks of 32 rows
        let partials = 2 * 4 * (rows / 32) * cols;
        assert!(
            top <= 2 * out + partials + 4096,
            "rms {rms}: backward peaked {top} bytes above its start (the bfloat16 gradient is {out})"
        );
    }
    Ok(())
}

/// The memory-saving attention's memory grows linearly with the length: training
/// one encoder layer (width 256, 8 heads, batch 8, Adam) at 8192 tokens needs at
/// most 4.2 times what it needs at 2048 (keeping the weights it needs 16 times:
/// the `[L, L]` scores), because rows longer than the group budget are cut into
/// blocks of queries.
#[test]
fn the_memory_saving_attention_grows_linearly_with_the_length() -> Result<()> {
    use ember::nn::functional::{with_attention_path, AttentionPath};
    use ember::nn::{TransformerEncoderLayer, TransformerOptions};
    let (batch, width, heads) = (8, 256, 8);
    let peak = |len: usize, path| -> Result<f64> {
        let est = Estimator::new(move |dev: &Device| {
            let opts = TransformerOptions {
                dim_feedforward: 4 * width,
                dropout: 0.0,
                batch_first: true,
                ..Default::default()
            };
            TransformerEncoderLayer::new(width, heads, opts, dev)
        })
        .input([len, width])
        .loss(|y: &Tensor, _targets: &Tensor| y.square()?.mean_all());
        let e = with_attention_path(path, || est.estimate(batch))?;
        Ok(e.peak_allocated as f64)
    };
    let saving = |len| peak(len, AttentionPath::MemoryEfficient);
    let (short, long) = (saving(2048)?, saving(8192)?);
    eprintln!(
        "memory-saving attention: {:.0} MiB at 2048 tokens, {:.0} MiB at 8192",
        short / (1 << 20) as f64,
        long / (1 << 20) as f64
    );
    assert!(
        long <= 4.2 * short,
        "{long} bytes at 8192 against {short} at 2048"
    );
    let plain = peak(8192, AttentionPath::Math)? / peak(2048, AttentionPath::Math)?;
    assert!(plain > 12.0, "keeping the weights grows {plain} times");
    Ok(())
}

/// The meta device models the GPU an estimate names: on compute capability 8.0
/// or later f16/bf16 attention runs the fused kernel, which keeps each row's
/// log-sum-exp where the plain path (older GPUs) keeps the weights, so the same
/// step estimates less there.
#[test]
fn the_estimate_follows_the_gpus_attention_kernels() -> Result<()> {
    let est = |major| {
        Estimator::new(encoder)
            .input([16, 32])
            .optimizer(adam)
            .amp(Some(DType::BF16))
            .compute_capability(major)
            .estimate(4)
    };
    let (volta, hopper) = (est(7)?, est(9)?);
    assert!(
        volta.peak_allocated > hopper.peak_allocated,
        "sm_70 {} bytes, sm_90 {} bytes",
        volta.peak_allocated,
        hopper.peak_allocated
    );
    Ok(())
}
