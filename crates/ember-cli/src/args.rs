//! The options of `ember train` (the classifiers' and the text model's, which
//! share one command line), the files a run reads and writes, and where its data
//! file is: what `train` and `text` both read, so neither imports the other's.

use clap::{Args, ValueEnum};
use ember::data;
use ember::{Error, Result as EmberResult};
use std::path::PathBuf;

/// The text shipped in `data/` (see data/README.md).
pub const TEXT_FILE: &str = "kjv-new-testament.txt";
/// The file a checkpoint folder holds: the model, with its vocabulary and shape
/// (what `ember generate` reads).
pub const MODEL_FILE: &str = "char-gpt.safetensors";
/// Beside it, what resuming needs: the model again, the optimizer's state, the
/// schedule's and the loss scaler's positions, the step, and the run's settings.
pub const STATE_FILE: &str = "train-state.safetensors";

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Dataset {
    /// Fisher's Iris: 150 flowers, 4 measurements, 3 species.
    Iris,
    /// UCI optical digits: 1797 images of 8×8 pixels, 10 classes.
    Digits,
    /// Random images and labels (torchvision's FakeData) of --input's shape and
    /// --classes: for the speed and memory of the model zoo's image models.
    Fake,
    /// The King James New Testament (data/kjv-new-testament.txt), for a
    /// character-level GPT (the options marked "Text:").
    Text,
}

#[derive(Args, Clone, Debug)]
pub struct TrainArgs {
    /// Data set to train on.
    #[arg(value_enum, default_value = "digits")]
    pub dataset: Dataset,
    /// `auto` (the first GPU if there is one, else the CPU), `cpu`, or `cuda:N`.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Passes over the training set [default: iris 100, digits 15].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub epochs: Option<u32>,
    /// Samples per batch [default: iris 120 (full batch), digits 64].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub batch_size: Option<u32>,
    /// Learning rate [default for Adam: iris 0.01, digits 0.001 (cnn) / 0.01
    /// (mlp); fake 0.001; for SGD 0.05].
    #[arg(long, allow_negative_numbers = true)]
    pub lr: Option<f64>,
    /// The optimizer: adam, or sgd (momentum 0.9).
    #[arg(long, value_enum, default_value = "adam")]
    pub optimizer: crate::estimate::OptimizerKind,
    /// On a GPU, capture the training step in a CUDA graph after its first step
    /// and replay it (one launch per step instead of one per kernel; Adam in its
    /// capturable form). On other devices it does nothing (the first line says
    /// so).
    #[arg(long)]
    pub cuda_graphs: bool,
    /// Mixed precision: the forward passes under autocast to bf16 or f16
    /// (products and convolutions in it, parameters kept in float32; f16 also
    /// scales the loss).
    #[arg(long, value_enum)]
    pub amp: Option<crate::estimate::AmpKind>,
    /// Model: mlp or cnn, or on fake data any of ember::models (alexnet, vgg11,
    /// vgg16, resnet18, resnet50) [default: iris mlp, digits cnn, fake resnet18].
    #[arg(long)]
    pub model: Option<String>,
    /// Fake data: one sample's shape [default: 3x224x224; mlp 64; cnn 1x8x8].
    #[arg(long, value_name = "SHAPE")]
    pub input: Option<String>,
    /// Fake data: the number of classes [default: 1000; mlp and cnn 10].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=(1 << 24)))]
    pub classes: Option<u64>,
    /// Fake data: the number of samples (a fifth of them for testing).
    #[arg(long, default_value_t = 640, value_parser = clap::value_parser!(u64).range(2..=(1 << 24)))]
    pub samples: u64,
    /// Print the estimate of the training step's memory (`ember estimate`) before
    /// training.
    #[arg(long)]
    pub estimate: bool,
    /// Train on a GPU even when the estimate says the step does not fit in its free
    /// memory.
    #[arg(long)]
    pub skip_memory_check: bool,
    /// Make each block of the model an activation checkpoint, recomputed in the
    /// backward pass instead of kept (less memory, one more forward pass of
    /// the blocks): resnet18 and resnet50 on fake data, the text model.
    #[arg(long)]
    pub checkpoint_activations: bool,
    /// Seed for the split, the initial weights and the shuffling.
    #[arg(long, default_value_t = 32)]
    pub seed: u64,
    /// Skip the last batch of an epoch when it is smaller than --batch-size (and,
    /// under `ember launch`, the samples past the last multiple of the world size,
    /// instead of repeating the first ones).
    #[arg(long)]
    pub drop_last: bool,
    /// Write the loss and accuracy curves to FILE (.svg or .png) and the history
    /// next to it (same name, `.csv`).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Save a checkpoint to DIR after every epoch.
    #[arg(long, value_name = "DIR")]
    pub checkpoint: Option<PathBuf>,
    /// Replace the files this run writes (--plot's image and CSV, --profile's
    /// trace) and the checkpoint in --checkpoint DIR if they exist (another
    /// run's); without it, an existing one is an error before training starts.
    #[arg(long)]
    pub force: bool,
    /// Continue from the checkpoint in the --checkpoint DIR.
    #[arg(long, requires = "checkpoint")]
    pub resume: bool,
    /// Folder holding the data sets [default: the project's `data/`].
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Print only the summary.
    #[arg(long, short)]
    pub quiet: bool,
    /// Profile a few training steps after a warm-up of 3 and print where their
    /// time goes, op by op (ember::profiler); with FILE, also write their Chrome
    /// trace there (open it in ui.perfetto.dev).
    #[arg(long, value_name = "FILE", num_args = 0..=1)]
    pub profile: Option<Option<PathBuf>>,
    /// How many steps --profile profiles.
    #[arg(long, default_value_t = 5, requires = "profile", value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub profile_steps: u32,
    #[command(flatten)]
    pub text: TextArgs,
}

impl Default for TrainArgs {
    fn default() -> Self {
        TrainArgs {
            dataset: Dataset::Digits,
            device: "auto".into(),
            epochs: None,
            batch_size: None,
            lr: None,
            optimizer: crate::estimate::OptimizerKind::Adam,
            cuda_graphs: false,
            amp: None,
            model: None,
            input: None,
            classes: None,
            samples: 640,
            estimate: false,
            skip_memory_check: false,
            checkpoint_activations: false,
            seed: 32,
            drop_last: false,
            plot: None,
            checkpoint: None,
            resume: false,
            force: false,
            data: None,
            quiet: false,
            profile: None,
            profile_steps: 5,
            text: Default::default(),
        }
    }
}

/// The options of `ember train text` (beside the common ones).
#[derive(Args, Clone, Debug)]
pub struct TextArgs {
    /// Text: optimizer steps.
    #[arg(long, default_value_t = 300)]
    pub steps: usize,
    /// Text: characters of context.
    #[arg(long, default_value_t = 128)]
    pub context: usize,
    /// Text: transformer blocks.
    #[arg(long, default_value_t = 4)]
    pub layers: usize,
    /// Text: attention heads.
    #[arg(long, default_value_t = 4)]
    pub heads: usize,
    /// Text: embedding width.
    #[arg(long, default_value_t = 128)]
    pub width: usize,
    /// Text: dropout in the blocks.
    #[arg(long, default_value_t = 0.0)]
    pub dropout: f64,
    /// Text: validate every N steps.
    #[arg(long, default_value_t = 100)]
    pub eval_every: usize,
    /// Text: batches averaged for a validation loss.
    #[arg(long, default_value_t = 8)]
    pub eval_batches: usize,
    /// Text: with --checkpoint, save the model and the training's state every N
    /// steps (and at the end) [default: --eval-every]; --resume continues from
    /// the last one exactly.
    #[arg(long, value_name = "N")]
    pub checkpoint_every: Option<usize>,
    /// Text: print N sampled characters after training.
    #[arg(long, default_value_t = 0)]
    pub sample: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

/// How text is sampled, shared by `train text --sample` and `generate`.
#[derive(Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Sampling temperature (0 takes the most likely character).
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f64,
    /// Sample among the K most likely characters only.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// The text the sample continues.
    #[arg(long, default_value = "And Jesus said")]
    pub prompt: String,
}

impl SamplingArgs {
    /// Checks `--temperature`, `--top-k` and `--prompt` (`op` names the
    /// command), before anything is trained or loaded.
    pub fn check(&self, op: &'static str) -> EmberResult<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(Error::InvalidArgument {
                op,
                msg: format!(
                    "--temperature {}: must be a finite number, 0 or more (0 takes the most \
                     likely character)",
                    self.temperature
                ),
            });
        }
        if self.top_k == Some(0) {
            return Err(Error::InvalidArgument {
                op,
                msg: "--top-k 0: sampling needs at least one character to choose from; leave \
                      --top-k out to choose among all"
                    .into(),
            });
        }
        if self.prompt.is_empty() {
            return Err(Error::InvalidArgument {
                op,
                msg: "--prompt '': the model continues a text, so the prompt needs at least \
                      one character"
                    .into(),
            });
        }
        Ok(())
    }
}

impl Default for SamplingArgs {
    fn default() -> Self {
        SamplingArgs {
            temperature: 0.8,
            top_k: None,
            prompt: "And Jesus said".into(),
        }
    }
}

impl Default for TextArgs {
    fn default() -> Self {
        TextArgs {
            steps: 300,
            context: 128,
            layers: 4,
            heads: 4,
            width: 128,
            dropout: 0.0,
            eval_every: 100,
            eval_batches: 8,
            checkpoint_every: None,
            sample: 0,
            sampling: SamplingArgs::default(),
        }
    }
}

/// The data file a run reads (iris, digits, text), found as training will find
/// it; `None` for fake data.
pub fn data_file(args: &TrainArgs) -> EmberResult<Option<PathBuf>> {
    let file = match args.dataset {
        Dataset::Iris => "iris.csv",
        Dataset::Digits => "digits.csv",
        Dataset::Text => TEXT_FILE,
        Dataset::Fake => return Ok(None),
    };
    Ok(Some(match &args.data {
        Some(dir) => {
            let path = dir.join(file);
            if !path.is_file() {
                let msg = if !dir.exists() {
                    format!("--data {}: there is no such folder", dir.display())
                } else if !dir.is_dir() {
                    format!(
                        "--data {}: this is a file; --data names the folder that holds {file}",
                        dir.display()
                    )
                } else {
                    format!("--data {}: there is no {file} in it", dir.display())
                };
                return Err(Error::InvalidArgument { op: "train", msg });
            }
            path
        }
        None => data::find_data_file(file)?,
    }))
}
