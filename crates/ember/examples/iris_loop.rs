//! The lessons' hand-written training loop on Iris: the model moved to the device,
//! the data moved to the device, then zero_grad / backward / step for 100 epochs.
//!
//! Run: `cargo run --release -p ember --example iris_loop`

use ember::data;
use ember::nn::{self, Module};
use ember::optim::{Adam, Optimizer};
use ember::prelude::*;

fn main() -> Result<()> {
    let device = Device::cuda_if_available(0);
    let (x, y) = data::load_iris(data::find_data_file("iris.csv")?)?;
    let (x_train, x_test, y_train, y_test) = data::train_test_split(&x, &y, 0.2, 32)?;

    ember::manual_seed(32);
    let mut model = nn::Sequential::new()
        .add(nn::Linear::new(4, 8, &Device::Cpu)?)
        .add(nn::ReLU)
        .add(nn::Linear::new(8, 9, &Device::Cpu)?)
        .add(nn::ReLU)
        .add(nn::Linear::new(9, 3, &Device::Cpu)?);
    model.to_device(&device)?; // model.to(device)
    assert!(model.parameters().iter().all(|p| p.device() == device));
    let (x_train, y_train) = (x_train.to(&device)?, y_train.to(&device)?);
    let (x_test, y_test) = (x_test.to(&device)?, y_test.to(&device)?);

    let mut opt = Adam::new(model.parameters(), 0.01)?;
    for epoch in 1..=100 {
        let loss = nn::cross_entropy(&model.forward(&x_train)?, &y_train)?;
        opt.zero_grad();
        loss.backward()?;
        opt.step()?;
        if epoch % 10 == 0 {
            println!("epoch {epoch:3}  loss {:.4}", loss.item::<f32>()?);
        }
    }
    let correct = ember::no_grad(|| -> Result<f64> {
        let pred = model.forward(&x_test)?.argmax(1, false)?;
        pred.eq(&y_test)?
            .to_dtype(DType::F32)?
            .mean_all()?
            .item::<f64>()
    })?;
    println!("test accuracy on {device}: {:.1}%", 100.0 * correct);
    Ok(())
}
