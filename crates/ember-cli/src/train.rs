//! `ember train`: a classifier on a data set shipped in `data/` (Iris or the UCI
//! digits), trained by a [`Trial`] on the chosen device.

use clap::{Args, ValueEnum};
use ember::data::{self, DataLoader, TensorDataset};
use ember::models::{digits_cnn, mlp};
use ember::nn::{self, Module};
use ember::optim::Adam;
use ember::prelude::*;
use ember::train::{Checkpoint, Progress, Trial};
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Dataset {
    /// Fisher's Iris: 150 flowers, 4 measurements, 3 species.
    Iris,
    /// UCI optical digits: 1797 images of 8×8 pixels, 10 classes.
    Digits,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ModelKind {
    /// A multi-layer perceptron (Iris: the lesson's 4-8-9-3; digits: 64-128-10).
    Mlp,
    /// A small convolutional network (digits only).
    Cnn,
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
    /// Learning rate (Adam) [default: iris 0.01, digits 0.001 (cnn) / 0.01 (mlp)].
    #[arg(long)]
    pub lr: Option<f64>,
    /// Model [default: iris mlp, digits cnn].
    #[arg(long, value_enum)]
    pub model: Option<ModelKind>,
    /// Seed for the split, the initial weights and the shuffling.
    #[arg(long, default_value_t = 32)]
    pub seed: u64,
    /// Write the loss and accuracy curves to FILE (.svg or .png) and the history
    /// next to it (same name, `.csv`).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Save a checkpoint to DIR after every epoch.
    #[arg(long, value_name = "DIR")]
    pub checkpoint: Option<PathBuf>,
    /// Continue from the checkpoint in the --checkpoint DIR.
    #[arg(long, requires = "checkpoint")]
    pub resume: bool,
    /// Folder holding the data sets [default: the project's `data/`].
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Print only the summary.
    #[arg(long, short)]
    pub quiet: bool,
}

impl Default for TrainArgs {
    fn default() -> Self {
        TrainArgs {
            dataset: Dataset::Digits,
            device: "auto".into(),
            epochs: None,
            batch_size: None,
            lr: None,
            model: None,
            seed: 32,
            plot: None,
            checkpoint: None,
            resume: false,
            data: None,
            quiet: false,
        }
    }
}

pub fn run(args: &TrainArgs) -> ember::Result<()> {
    // a plot that cannot be written fails now, not after the training
    if let Some(plot) = &args.plot {
        let ext = plot.extension().and_then(|e| e.to_str()).unwrap_or("");
        if !ext.eq_ignore_ascii_case("svg") && !ext.eq_ignore_ascii_case("png") {
            return Err(ember::Error::InvalidArgument {
                op: "train",
                msg: format!(
                    "--plot {}: the file name must end in .svg or .png",
                    plot.display()
                ),
            });
        }
    }
    let device = match args.device.as_str() {
        "auto" => Device::cuda_if_available(0),
        s => s.parse()?,
    };
    if device.is_meta() {
        return Err(ember::Error::UnsupportedDevice {
            op: "train",
            device,
            msg: "training reads losses and accuracies, and a meta tensor has no values; \
                  train on cpu or cuda:N"
                .into(),
        });
    }
    let file = match args.dataset {
        Dataset::Iris => "iris.csv",
        Dataset::Digits => "digits.csv",
    };
    let path = match &args.data {
        Some(dir) => dir.join(file),
        None => data::find_data_file(file)?,
    };
    let kind = args.model.unwrap_or(match args.dataset {
        Dataset::Iris => ModelKind::Mlp,
        Dataset::Digits => ModelKind::Cnn,
    });
    let (x, y) = match args.dataset {
        Dataset::Iris => data::load_iris(&path)?,
        // pixels 0..16 to 0..1
        Dataset::Digits => {
            let (x, y) = data::load_digits(&path)?;
            (x.div(16.0)?, y)
        }
    };
    let (x_train, x_test, y_train, y_test) = data::train_test_split(&x, &y, 0.2, args.seed)?;
    let (n_train, n_test) = (y_train.numel(), y_test.numel());

    ember::manual_seed(args.seed);
    let cpu = Device::Cpu;
    let (model, x_train, x_test, lr_default, epochs_default, batch_default) =
        match (args.dataset, kind) {
            (Dataset::Iris, ModelKind::Mlp) => {
                (mlp(&[4, 8, 9, 3], &cpu)?, x_train, x_test, 0.01, 100, 120)
            }
            (Dataset::Iris, ModelKind::Cnn) => {
                return Err(Error::InvalidArgument {
                    op: "train",
                    msg: "--model cnn needs image data: use it with digits".into(),
                })
            }
            (Dataset::Digits, ModelKind::Mlp) => {
                (mlp(&[64, 128, 10], &cpu)?, x_train, x_test, 0.01, 15, 64)
            }
            (Dataset::Digits, ModelKind::Cnn) => (
                digits_cnn(&cpu)?,
                x_train.reshape([n_train, 1, 8, 8])?,
                x_test.reshape([n_test, 1, 8, 8])?,
                0.001,
                15,
                64,
            ),
        };
    let epochs = args.epochs.map_or(epochs_default, |e| e as usize);
    let batch = args.batch_size.map_or(batch_default, |b| b as usize);
    let lr = args.lr.unwrap_or(lr_default);
    let params = model.num_parameters();
    let opt = Adam::new(model.parameters(), lr);
    let train = DataLoader::new(TensorDataset::new(x_train, y_train)?, batch)?.shuffle(args.seed);
    let test = DataLoader::new(TensorDataset::new(x_test, y_test)?, 256)?;
    println!(
        "training a {} ({params} parameters) on {} ({n_train} train / {n_test} test samples), batch {batch}, Adam lr {lr}, on {device}",
        match kind {
            ModelKind::Mlp => "MLP",
            ModelKind::Cnn => "CNN",
        },
        path.display(),
    );
    let mut trial = Trial::new(model, opt, nn::cross_entropy)
        .metrics(&["loss", "accuracy"])?
        .progress(if args.quiet {
            Progress::Quiet
        } else {
            Progress::Auto
        })
        .to(&device)?
        .with_generators(Some(train), Some(test), None);
    if let Some(dir) = &args.checkpoint {
        trial = trial.callback(Checkpoint::new(dir));
        if args.resume {
            trial = trial.resume(dir)?;
            println!(
                "resumed from {} after epoch {}",
                dir.display(),
                trial.history().len()
            );
        }
    }
    let history = trial.run(epochs)?.clone();
    let Some(last) = history.last() else {
        return Err(Error::InvalidArgument {
            op: "train",
            msg: "no epoch ran".into(),
        });
    };
    let secs: f64 = history.records.iter().map(|r| r.seconds).sum();
    let test = trial.evaluate()?;
    let get = |name: &str| {
        test.iter()
            .find(|(n, _)| n == name)
            .map_or(f64::NAN, |(_, v)| *v)
    };
    println!("device: {device}");
    println!(
        "time per epoch: {:.2} ms ({} epochs in {:.1} ms)",
        secs * 1e3 / history.len() as f64,
        history.len(),
        secs * 1e3
    );
    println!("final loss: {:.4}", last.get("loss").unwrap_or(f64::NAN));
    println!(
        "train accuracy: {:.1}%",
        100.0 * last.get("acc").unwrap_or(f64::NAN)
    );
    println!("test loss: {:.4}", get("loss"));
    println!("test accuracy: {:.1}%", 100.0 * get("acc"));
    if let Some(plot) = &args.plot {
        history.write_plot(plot)?;
        let csv = plot.with_extension("csv");
        history.write_csv(&csv)?;
        println!("curves: {} and {}", plot.display(), csv.display());
    }
    Ok(())
}
