//! `ember estimate`: the device memory a model's training step needs, computed on
//! the `meta` device before anything runs on a GPU.

use clap::{Args, ValueEnum};
use ember::memory::{fmt_bytes, parse_bytes, Estimator};
use ember::optim::{Adam, Optimizer, Sgd};
use ember::prelude::*;
use ember::{cuda, models, nn};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OptimizerKind {
    /// SGD with momentum 0.9 (one buffer per parameter).
    Sgd,
    /// Adam (two moments per parameter).
    Adam,
}

/// The lower precision of `--amp` (mixed-precision training).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AmpKind {
    /// bfloat16: float32's range, no loss scaling.
    Bf16,
    /// float16: the loss scaled dynamically (a GradScaler).
    F16,
}

impl AmpKind {
    pub fn dtype(self) -> ember::DType {
        match self {
            AmpKind::Bf16 => ember::DType::BF16,
            AmpKind::F16 => ember::DType::F16,
        }
    }
}

#[derive(Args, Clone, Debug)]
pub struct EstimateArgs {
    /// The model: one of ember::models (alexnet, vgg11, vgg16, resnet18,
    /// resnet50, mlp, cnn, gpt2_small).
    #[arg(long)]
    pub model: String,
    /// Samples per batch.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u64).range(1..=(1 << 24)))]
    pub batch_size: u64,
    /// One sample's shape, `CxHxW` for images [default: 3x224x224; mlp 64; cnn
    /// 1x8x8]; for gpt2_small the number of tokens T [default: 1024].
    #[arg(long, value_name = "SHAPE")]
    pub input: Option<String>,
    /// Classes of the classifier [default: 1000; mlp and cnn 10; gpt2_small has
    /// its vocabulary, 50304 tokens, and takes none].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=(1 << 24)))]
    pub classes: Option<u64>,
    /// The optimizer.
    #[arg(long, value_enum, default_value = "sgd")]
    pub optimizer: OptimizerKind,
    /// The dtype of the parameters, the inputs and the computation: f32, bf16,
    /// f16 (or f64).
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// Estimate inference (a forward pass under no_grad) instead of training.
    #[arg(long, conflicts_with = "optimizer")]
    pub inference: bool,
    /// The step under autocast to this lower precision (`ember train --amp`'s
    /// step: float32 parameters, products and convolutions in bf16 or f16).
    #[arg(long, value_enum)]
    pub amp: Option<AmpKind>,
    /// The step channels-last: the model and each batch laid out so (PyTorch's
    /// `memory_format=torch.channels_last`); image models only.
    #[arg(long)]
    pub channels_last: bool,
    /// Each block of the model an activation checkpoint (recomputed in the
    /// backward pass instead of kept: `models::checkpointed`): resnet18,
    /// resnet50 and gpt2_small.
    #[arg(long)]
    pub checkpoint_activations: bool,
    /// The GPU to check the estimate against (its free memory), e.g. cuda:0.
    #[arg(long, conflicts_with = "memory")]
    pub device: Option<String>,
    /// The memory to check the estimate against, e.g. 12GiB, 80GB.
    #[arg(long)]
    pub memory: Option<String>,
    /// Find the largest batch size that fits (needs --device or --memory).
    #[arg(long)]
    pub max_batch: bool,
}

/// Where the estimate is checked: bytes available, what they are, and the
/// compute capability's major version where known.
struct Target {
    capacity: usize,
    what: String,
    major: Option<u32>,
    multiprocessors: Option<usize>,
}

fn target(args: &EstimateArgs) -> ember::Result<Option<Target>> {
    if let Some(m) = &args.memory {
        return Ok(Some(Target {
            capacity: parse_bytes(m).map_err(|e| crate::paths::named("--memory", m, e))?,
            what: format!("{m} of memory"),
            major: None,
            multiprocessors: None,
        }));
    }
    let Some(d) = &args.device else {
        return Ok(None);
    };
    let dev = crate::paths::device(d, "--device")?;
    let Device::Cuda(i) = dev else {
        return Err(invalid(format!("--device {dev}: the estimate is for a CUDA device (cuda:N); use --memory SIZE to check against a size"),
        ));
    };
    let (free, total) = cuda::mem_get_info(&dev)?;
    let props = cuda::device_properties(i)?;
    Ok(Some(Target {
        capacity: free,
        what: format!(
            "{dev} ({}: {} free of {})",
            props.name,
            fmt_bytes(free),
            fmt_bytes(total)
        ),
        major: Some(props.compute_capability.0),
        multiprocessors: Some(props.multiprocessor_count as usize),
    }))
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidArgument {
        op: "estimate",
        msg: msg.into(),
    }
}

/// `3x224x224` as `[3, 224, 224]` (an error naming `op` otherwise).
pub(crate) fn parse_shape(s: &str, op: &'static str) -> ember::Result<Vec<usize>> {
    let dims: Option<Vec<usize>> = s
        .split(['x', 'X', ','])
        // (a size past int64 is not a tensor's: refused here, not cast later)
        .map(|p| {
            p.trim()
                .parse::<usize>()
                .ok()
                .filter(|&d| d > 0 && d <= i64::MAX as usize)
        })
        .collect();
    dims.filter(|d| !d.is_empty() && d.len() <= 4).ok_or_else(|| Error::InvalidArgument {
        op,
        msg: format!("--input {s:?}: write one sample's shape as positive sizes joined by x, such as 3x224x224"),
    })
}

pub fn run(args: &EstimateArgs) -> ember::Result<()> {
    let name = args.model.to_ascii_lowercase();
    if !models::NAMES.contains(&name.as_str()) {
        return Err(invalid(format!(
            "--model {}: unknown model; the models are {}",
            args.model,
            models::NAMES.join(", ")
        )));
    }
    let dtype: DType = args
        .dtype
        .parse()
        .map_err(|e| crate::paths::named("--dtype", &args.dtype, e))?;
    if !dtype.is_float() {
        return Err(invalid(format!(
            "--dtype {}: a model's parameters are floating point: use f32, bf16, f16 or f64",
            args.dtype
        )));
    }
    if args.amp.is_some() && dtype != DType::F32 {
        return Err(invalid(format!(
            "--amp keeps the parameters in float32: --dtype {} with --amp is not a step \
             autocast runs",
            args.dtype
        )));
    }
    let small = matches!(name.as_str(), "mlp" | "cnn");
    // a language model: token ids in, a class (the next token) per position out
    let lm = name == "gpt2_small";
    let context = models::GptConfig::gpt2_small().context;
    let input = match &args.input {
        Some(s) => parse_shape(s, "estimate")?,
        None if name == "mlp" => vec![64],
        None if name == "cnn" => vec![1, 8, 8],
        None if lm => vec![context],
        None => vec![3, 224, 224],
    };
    if lm && (input.len() != 1 || input[0] > context) {
        return Err(invalid(format!(
            "--input {}: gpt2_small takes a sequence of T tokens, 1 <= T <= {context}",
            args.input.as_deref().unwrap_or_default()
        )));
    }
    if lm && args.classes.is_some() {
        return Err(invalid(
            "--classes: gpt2_small predicts its own vocabulary (50304 tokens)",
        ));
    }
    // the input's rank: images [C, H, W] (colour for the zoo), mlp [features]
    let want = match name.as_str() {
        "mlp" => Some((1, "[features], such as 64")),
        "cnn" => Some((3, "[channels, height, width], such as 1x8x8")),
        _ if lm => None,
        _ => Some((3, "3xHxW colour images, such as 3x224x224")),
    };
    if let Some((rank, what)) = want {
        let colour = small || input.first() == Some(&3);
        if input.len() != rank || !colour {
            return Err(invalid(format!(
                "--input {}: {name} takes {what}",
                args.input.as_deref().unwrap_or_default()
            )));
        }
    }
    if args.channels_last && (lm || name == "mlp") {
        return Err(invalid(format!(
            "--channels-last lays out 4-D image batches; {name} does not take images"
        )));
    }
    if args.checkpoint_activations && !models::WITH_BLOCKS.contains(&name.as_str()) {
        return Err(invalid(format!(
            "--checkpoint-activations makes a model's blocks activation checkpoints (resnet18's and \
             resnet50's residual blocks, gpt2_small's transformer blocks); {name} has none"
        )));
    }
    if args.max_batch && args.memory.is_none() && args.device.is_none() {
        return Err(invalid(
            "--max-batch needs the memory to fit in: --device cuda:N or --memory SIZE",
        ));
    }
    let classes = args.classes.unwrap_or(if small { 10 } else { 1000 }) as usize;
    let target = target(args)?;
    let build_name = name.clone();
    let checkpoint = args.checkpoint_activations;
    let mut est = Estimator::new(move |dev| {
        if checkpoint {
            return models::checkpointed(&build_name, classes, dev);
        }
        models::by_name(&build_name, classes, dev)
    })
    .input(&input)
    .dtype(dtype)
    .amp(args.amp.map(AmpKind::dtype))
    .training(!args.inference);
    if args.channels_last {
        est = est.memory_format(ember::MemoryFormat::ChannelsLast);
    }
    if lm {
        // ids [B, T] (int64), the next token at each position, cross-entropy
        // over the vocabulary; the step keeps only the loss, as `ember train
        // text` and `ember bench`'s row do (the logits go after their gradient)
        est = est
            .input_dtype(DType::I64)
            .targets(&input)
            .keep_output(false)
            .loss(|logits, y| nn::cross_entropy(&logits.flatten(0, 1)?, &y.flatten(0, 1)?));
    }
    est = match args.optimizer {
        OptimizerKind::Sgd => est.optimizer(|p| {
            let o: Box<dyn Optimizer> = Box::new(Sgd::new(p, 0.01)?.momentum(0.9)?);
            Ok(o)
        }),
        OptimizerKind::Adam => est.optimizer(|p| {
            let o: Box<dyn Optimizer> = Box::new(Adam::new(p, 1e-3)?);
            Ok(o)
        }),
    };
    // cuBLAS's workspace: the target's size, else Hopper's (the larger)
    est = est.compute_capability(target.as_ref().and_then(|t| t.major).unwrap_or(9));
    // how a GPU splits long sums: the target's multiprocessors, else an H100's
    if let Some(n) = target.as_ref().and_then(|t| t.multiprocessors) {
        // a GPU of this machine: its multiprocessors, and whether cuDNN loads
        est = est.multiprocessors(n).cudnn(cuda::cudnn::is_available());
    }
    let batch = args.batch_size as usize;
    // a shape the model cannot take (too small for its pooling) names --input
    let e = est.estimate(batch).map_err(|e| match e {
        Error::ShapeMismatch { .. } | Error::InvalidArgument { .. } if args.input.is_some() => {
            invalid(format!(
                "--input {}: {name} cannot take inputs of this shape ({e})",
                args.input.as_deref().unwrap_or_default()
            ))
        }
        e => e,
    })?;
    print!("{e}");
    let Some(t) = target else {
        return Ok(()); // --max-batch without a target was refused above
    };
    // the verdict and the need it is judged by, one number: the least memory the
    // step runs in (the allocator releasing its cache when memory runs short),
    // which can be less than the unconstrained "needed on the device" above
    let verdict = if e.fits(t.capacity) {
        "fits"
    } else {
        "does NOT fit"
    };
    let least = e.min_required();
    let why = if least < e.required() {
        format!(
            " (it needs at least {}: less than the {} above, because the allocator \
             releases its cache when memory runs short)",
            fmt_bytes(least),
            fmt_bytes(e.required())
        )
    } else {
        format!(" (it needs {})", fmt_bytes(least))
    };
    println!("batch size {batch} {verdict} on {}{why}", t.what);
    if args.max_batch {
        const LIMIT: usize = 1 << 24;
        match est.max_batch(batch, t.capacity, LIMIT)? {
            // (the search stops there: larger batches were not tried)
            Some(b) if b >= LIMIT => {
                println!("largest batch size that fits: at least {b} (the search stops at {LIMIT})")
            }
            Some(b) => println!("largest batch size that fits: {b}"),
            None => println!("not even a batch of one fits"),
        }
    }
    Ok(())
}
