//! `ember train`: the lesson's Iris MLP (4 -> 8 -> 9 -> 3, ReLU), trained with
//! cross-entropy and Adam, full batch, on the chosen device.

use clap::Args;
use ember::nn::{self, Module};
use ember::optim::{Adam, Optimizer};
use ember::prelude::*;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Args, Clone, Debug)]
pub struct TrainArgs {
    /// Data set to train on.
    #[arg(value_parser = ["iris"], default_value = "iris")]
    pub dataset: String,
    /// `auto` (the first GPU if there is one, else the CPU), `cpu`, or `cuda:N`.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Passes over the training set.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..))]
    pub epochs: u32,
    /// Learning rate (Adam).
    #[arg(long, default_value_t = 0.01)]
    pub lr: f64,
    /// Seed for the train/test split.
    #[arg(long, default_value_t = 32)]
    pub seed: u64,
    /// Folder holding the data sets (defaults to the project's `data/`).
    #[arg(long)]
    pub data: Option<PathBuf>,
}

impl Default for TrainArgs {
    fn default() -> Self {
        TrainArgs {
            dataset: "iris".into(),
            device: "auto".into(),
            epochs: 200,
            lr: 0.01,
            seed: 32,
            data: None,
        }
    }
}

fn data_dir(arg: &Option<PathBuf>) -> PathBuf {
    if let Some(d) = arg {
        return d.clone();
    }
    let here = PathBuf::from("data");
    if here.join("iris.csv").exists() {
        return here;
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data")
}

/// Reads a numeric CSV with a header; the last column is the integer class.
fn read_csv(path: &Path) -> ember::Result<(Vec<f32>, Vec<i64>, usize)> {
    let text = std::fs::read_to_string(path).map_err(|source| ember::Error::Io {
        path: path.display().to_string(),
        source,
    })?;
    let bad = |line: usize, msg: String| ember::Error::InvalidArgument {
        op: "read_csv",
        msg: format!("{}:{line}: {msg}", path.display()),
    };
    let mut lines = text.lines();
    let header = lines.next().ok_or_else(|| bad(1, "empty file".into()))?;
    let cols = header.split(',').count();
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for (i, line) in lines.enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let cells: Vec<&str> = line.split(',').collect();
        if cells.len() != cols {
            return Err(bad(
                i + 2,
                format!("expected {cols} columns, found {}", cells.len()),
            ));
        }
        for c in &cells[..cols - 1] {
            x.push(
                c.trim()
                    .parse::<f32>()
                    .map_err(|_| bad(i + 2, format!("not a number: {c:?}")))?,
            );
        }
        let t = cells[cols - 1].trim();
        y.push(
            t.parse::<i64>()
                .map_err(|_| bad(i + 2, format!("not a class index: {t:?}")))?,
        );
    }
    Ok((x, y, cols - 1))
}

pub fn run(args: &TrainArgs) -> ember::Result<()> {
    let device = match args.device.as_str() {
        "auto" => Device::cuda_if_available(0),
        s => s.parse()?,
    };
    let path = data_dir(&args.data).join(format!("{}.csv", args.dataset));
    let (x, y, features) = read_csv(&path)?;
    let n = y.len();
    let classes = (*y.iter().max().unwrap_or(&0) + 1) as usize;

    // seeded shuffle, then an 80/20 split
    ember::manual_seed(args.seed);
    let perm = Tensor::randperm(n, &Device::Cpu)?;
    let x = Tensor::from_vec(x, [n, features], &Device::Cpu)?.index_select(0, &perm)?;
    let y = Tensor::from_vec(y, [n], &Device::Cpu)?.index_select(0, &perm)?;
    let n_train = n * 4 / 5;
    let (x_train, x_test) = (
        x.narrow(0, 0, n_train)?,
        x.narrow(0, n_train as i64, n - n_train)?,
    );
    let (y_train, y_test) = (
        y.narrow(0, 0, n_train)?,
        y.narrow(0, n_train as i64, n - n_train)?,
    );

    // standardise with the training set's statistics
    let mean = x_train.mean(0, true)?;
    let std = x_train.std(0, true)?;
    let prep = |t: &Tensor| -> ember::Result<Tensor> { t.sub(&mean)?.div(&std)?.to(&device) };
    let (x_train, x_test) = (prep(&x_train)?, prep(&x_test)?);
    let (y_train, y_test) = (y_train.to(&device)?, y_test.to(&device)?);

    // the lesson's model: 4 -> 8 -> 9 -> 3 with ReLU, cross-entropy, Adam
    ember::manual_seed(args.seed);
    let mut model = nn::Sequential::new()
        .add(nn::Linear::new(features, 8, &Device::Cpu)?)
        .add(nn::ReLU)
        .add(nn::Linear::new(8, 9, &Device::Cpu)?)
        .add(nn::ReLU)
        .add(nn::Linear::new(9, classes, &Device::Cpu)?);
    model.to_device(&device)?;
    let mut opt = Adam::new(model.parameters(), args.lr);
    println!(
        "training an MLP {features}-8-9-{classes} ({} parameters) on {} ({n_train} train / {} test rows) on {device}",
        model.num_parameters(),
        path.display(),
        n - n_train
    );
    let start = Instant::now();
    let mut loss = f32::NAN;
    for epoch in 1..=args.epochs {
        let l = nn::cross_entropy(&model.forward(&x_train)?, &y_train)?;
        opt.zero_grad();
        l.backward()?;
        opt.step()?;
        if epoch == 1 || epoch % 50 == 0 || epoch == args.epochs {
            loss = l.item::<f32>()?;
            println!("epoch {epoch:>4}  loss {loss:.4}");
        }
    }
    let elapsed = start.elapsed();
    let accuracy = |x: &Tensor, y: &Tensor| -> ember::Result<f64> {
        ember::no_grad(|| {
            let pred = model.forward(x)?.argmax(-1, false)?;
            pred.eq(y)?.to_dtype(DType::F32)?.mean_all()?.item::<f64>()
        })
    };
    println!("device: {device}");
    println!(
        "time per epoch: {:.1} µs ({} epochs in {:.1} ms)",
        elapsed.as_secs_f64() * 1e6 / args.epochs as f64,
        args.epochs,
        elapsed.as_secs_f64() * 1e3
    );
    println!("final loss: {loss:.4}");
    println!(
        "train accuracy: {:.1}%",
        100.0 * accuracy(&x_train, &y_train)?
    );
    println!("test accuracy: {:.1}%", 100.0 * accuracy(&x_test, &y_test)?);
    Ok(())
}
