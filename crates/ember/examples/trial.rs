//! torchbearer's `Trial` in ember: a CNN on the UCI digits with loss and accuracy
//! metrics, validation after every epoch, a progress bar, early stopping, and the
//! curves written as SVG and CSV.
//!
//! Run: `cargo run --release -p ember --example trial`

use ember::data::{self, DataLoader, TensorDataset};
use ember::nn::{self, Module};
use ember::optim::Adam;
use ember::prelude::*;
use ember::train::{EarlyStopping, Trial};

fn main() -> Result<()> {
    let device = Device::cuda_if_available(0);
    let (x, y) = data::load_digits(data::find_data_file("digits.csv")?)?;
    let x = x.div(16.0)?.reshape([1797, 1, 8, 8])?;
    let (x_train, x_test, y_train, y_test) = data::train_test_split(&x, &y, 0.2, 0)?;
    let train = DataLoader::new(TensorDataset::new(x_train, y_train)?, 64)?.shuffle(0);
    let test = DataLoader::new(TensorDataset::new(x_test, y_test)?, 256)?;

    ember::manual_seed(0);
    let dev = Device::Cpu;
    let same = Conv2dOptions::default().padding(1);
    let model = nn::Sequential::new()
        .add(nn::Conv2d::new(1, 16, 3, same, &dev)?)
        .add(nn::ReLU)
        .add(nn::MaxPool2d(Pool2dOptions::new(2)))
        .add(nn::Flatten::default())
        .add(nn::Linear::new(16 * 4 * 4, 10, &dev)?);
    let opt = Adam::new(model.parameters(), 0.005)?;

    let mut trial = Trial::new(model, opt, nn::cross_entropy)
        .metrics(&["loss", "accuracy", "top_2_acc"])?
        .callback(EarlyStopping::new("val_loss", 3))
        .to(&device)?
        .with_generators(Some(train), Some(test), None);
    let history = trial.run(15)?.clone();
    let out = std::env::temp_dir();
    history.write_svg(out.join("ember-trial.svg"))?;
    history.write_png(out.join("ember-trial.png"))?;
    history.write_csv(out.join("ember-trial.csv"))?;
    println!("final: {:?}", trial.evaluate()?);
    println!("curves in {}", out.join("ember-trial.{svg,png}").display());
    Ok(())
}
