//! The `train` suite: whole training steps (forward, backward, Adam) of the models
//! the lessons and ember's examples train, on any device, in samples per second:
//! - the Iris lesson: MLP 4 → 8 → 9 → 3, 100 full-batch epochs of 120 rows
//!   (per-op overhead, nothing else);
//! - an MLP 784 → 1024 → 1024 → 10 on batches of 256 (matrix products);
//! - an MNIST-sized CNN (conv 32, conv 64, max-pool, fc 128, fc 10) on batches of 64
//!   1×28×28 images (convolutions);
//! - one epoch of `ember train digits` (its CNN, 1437 images in batches of 64,
//!   through the DataLoader onto the device);
//! - a transformer encoder layer and a step of the character GPT;
//! - on a GPU, the Iris steps and the GPT step again as replays of a captured
//!   CUDA graph (Adam in its capturable form), against the eager rows above.
//!
//! `bench/pytorch/device_ops.py --suite train` runs the same models in PyTorch.

use super::stats::{Row, Work};
use super::Ctx;
use ember::data::{DataLoader, TensorDataset};
use ember::models::{digits_cnn, mlp};
use ember::nn::{self, Module};
use ember::optim::{Adam, Optimizer};
use ember::prelude::*;

/// One training step; the loss stays on the device (nothing waits for it).
fn step(model: &nn::Sequential, opt: &mut Adam, x: &Tensor, y: &Tensor) -> Result<()> {
    step_amp(model, opt, x, y, None)
}

/// [`step`] with the forward pass and the loss under autocast to `amp`.
fn step_amp(
    model: &nn::Sequential,
    opt: &mut Adam,
    x: &Tensor,
    y: &Tensor,
    amp: Option<DType>,
) -> Result<()> {
    let ac = amp.map(ember::autocast_guard).transpose()?;
    let loss = nn::cross_entropy(&model.forward(x)?, y)?;
    drop(ac);
    opt.zero_grad();
    loss.backward()?;
    opt.step()
}

/// FLOPs of one training step of layers with these multiply-adds per batch:
/// forward, weight gradients, and input gradients of every layer but the first
/// (the data needs none).
fn step_flops(macs: &[f64]) -> f64 {
    let all: f64 = macs.iter().sum();
    2.0 * all + 2.0 * all + 2.0 * (all - macs.first().copied().unwrap_or(0.0))
}

/// 1×28×28 → conv 32 → conv 64 → pool → 128 → 10 (PyTorch's MNIST example
/// without dropout).
fn mnist_cnn(dev: &Device) -> Result<nn::Sequential> {
    let o = Conv2dOptions::default();
    Ok(nn::Sequential::new()
        .add(nn::Conv2d::new(1, 32, 3, o, dev)?)
        .add(nn::ReLU)
        .add(nn::Conv2d::new(32, 64, 3, o, dev)?)
        .add(nn::ReLU)
        .add(nn::MaxPool2d(Pool2dOptions::new(2)))
        .add(nn::Flatten::default())
        .add(nn::Linear::new(9216, 128, dev)?)
        .add(nn::ReLU)
        .add(nn::Linear::new(128, 10, dev)?))
}

/// Rows timing one Adam step of the model `build` makes (after seeding 0) on a
/// fixed random batch of `shape` with 10 classes, in float32 and under bfloat16
/// autocast; `macs` are the layers' multiply-adds per sample.
fn step_rows(
    cx: &Ctx,
    name: String,
    build: impl FnOnce(&Device) -> Result<nn::Sequential>,
    shape: &[usize],
    macs: &[f64],
) -> Result<Vec<Row>> {
    ember::manual_seed(0);
    let model = build(&cx.dev)?;
    let mut opt = Adam::new(model.parameters(), 1e-3)?;
    let x = Tensor::randn(shape, &Device::Cpu)?.to(&cx.dev)?;
    let y = Tensor::randint(0, 10, [shape[0]], &Device::Cpu)?.to(&cx.dev)?;
    let n = shape[0] as f64;
    let macs: Vec<f64> = macs.iter().map(|m| m * n).collect();
    let work = Work::Samples {
        n,
        flops: Some(step_flops(&macs)),
    };
    Ok(vec![
        cx.row(name.clone(), work, || step(&model, &mut opt, &x, &y))?,
        cx.row(format!("{name}, autocast bf16"), work, || {
            step_amp(&model, &mut opt, &x, &y, Some(DType::BF16))
        })?,
    ])
}

pub(crate) fn suite(cx: &Ctx) -> Result<Vec<Row>> {
    let dev = cx.dev;
    let mut rows = Vec::new();

    // the Iris lesson: the first 120 rows of a seeded permutation, as in its split
    let (x, y) = ember::data::load_iris(ember::data::find_data_file("iris.csv")?)?;
    ember::manual_seed(32);
    let train = Tensor::randperm(150, &Device::Cpu)?.narrow(0, 0, 120)?;
    let (x, y) = (
        x.index_select(0, &train)?.to(&dev)?,
        y.index_select(0, &train)?.to(&dev)?,
    );
    let epochs = if cx.quick { 10 } else { 100 };
    // (kept for the CUDA-graph rows: `x` and `y` name other data below)
    let iris = (x.clone(), y.clone());
    rows.push(cx.row(
        format!("train iris mlp, {epochs} epochs"),
        Work::Samples {
            n: (120 * epochs) as f64,
            flops: None,
        },
        || {
            ember::manual_seed(32);
            let model = mlp(&[4, 8, 9, 3], &dev)?;
            let mut opt = Adam::new(model.parameters(), 0.01)?;
            for _ in 0..epochs {
                step(&model, &mut opt, &x, &y)?;
            }
            Ok(())
        },
    )?);

    // MLP 784-1024-1024-10 and the MNIST-sized CNN: one step on a fixed batch
    let b = if cx.quick { 32 } else { 256 };
    let macs = [784.0 * 1024.0, 1024.0 * 1024.0, 1024.0 * 10.0];
    rows.extend(step_rows(
        cx,
        format!("train mlp 784-1024-1024-10 b{b}"),
        |d| mlp(&[784, 1024, 1024, 10], d),
        &[b, 784],
        &macs,
    )?);
    let b = if cx.quick { 8 } else { 64 };
    let macs = [
        32.0 * 26.0 * 26.0 * 9.0,
        64.0 * 24.0 * 24.0 * 32.0 * 9.0,
        9216.0 * 128.0,
        128.0 * 10.0,
    ];
    rows.extend(step_rows(
        cx,
        format!("train cnn mnist-sized b{b}"),
        mnist_cnn,
        &[b, 1, 28, 28],
        &macs,
    )?);

    // an epoch of `ember train digits`, batches moved by the loader
    let (x, y) = ember::data::load_digits(ember::data::find_data_file("digits.csv")?)?;
    let x = x.div(16.0)?.reshape([1797, 1, 8, 8])?;
    let (x_train, _, y_train, _) = ember::data::train_test_split(&x, &y, 0.2, 32)?;
    let n = y_train.numel();
    let loader = DataLoader::new(TensorDataset::new(x_train, y_train)?, 64)?
        .shuffle(32)
        .device(&dev);
    ember::manual_seed(32);
    let model = digits_cnn(&dev)?;
    let mut opt = Adam::new(model.parameters(), 1e-3)?;
    let macs = [
        16.0 * 64.0 * 9.0,
        32.0 * 64.0 * 16.0 * 9.0,
        512.0 * 64.0,
        64.0 * 10.0,
    ]
    .map(|m| m * n as f64);
    rows.push(cx.row(
        format!("train digits cnn epoch ({n} imgs, b64)"),
        Work::Samples {
            n: n as f64,
            flops: Some(step_flops(&macs)),
        },
        || {
            for batch in loader.iter() {
                let (x, y) = batch?;
                step(&model, &mut opt, &x, &y)?;
            }
            Ok(())
        },
    )?);

    // sequence models: a transformer encoder layer's forward and backward, and a
    // step of `ember train text`'s character GPT (AdamW, clipping)
    let (b, t, w) = if cx.quick {
        (4, 32, 64)
    } else {
        (32, 128, 256)
    };
    ember::manual_seed(0);
    let opts = nn::TransformerOptions {
        dim_feedforward: 4 * w,
        dropout: 0.0,
        batch_first: true,
        ..Default::default()
    };
    let layer = nn::TransformerEncoderLayer::new(w, 8, opts, &dev)?;
    let xs = Tensor::randn([b, t, w], &Device::Cpu)?.to(&dev)?;
    rows.push(cx.row(
        format!("transformer encoder layer fwd+bwd b{b} l{t} w{w}"),
        Work::Samples {
            n: b as f64,
            flops: None,
        },
        || {
            layer.parameters().iter().for_each(|p| p.zero_grad());
            layer.forward(&xs)?.square()?.mean_all()?.backward()
        },
    )?);

    let (b, t, w) = if cx.quick {
        (4, 32, 32)
    } else {
        (32, 128, 128)
    };
    ember::manual_seed(0);
    let config = ember::models::GptConfig {
        vocab_size: 73,
        context: t,
        layers: 4,
        heads: 4,
        width: w,
        dropout: 0.0,
    };
    let gpt = ember::models::CharGpt::new(config, &dev)?;
    let params = gpt.parameters();
    let mut opt = Adam::adamw(params.clone(), 3e-3)?;
    let xi = Tensor::randint(0, 73, [b, t], &Device::Cpu)?.to(&dev)?;
    let yi = Tensor::randint(0, 73, [b, t], &Device::Cpu)?.to(&dev)?;
    rows.push(cx.row(
        format!("train char-gpt 4x{w} ctx{t} b{b}"),
        Work::Samples {
            n: b as f64,
            flops: None,
        },
        || {
            let loss = gpt.loss(&xi, &yi)?;
            opt.zero_grad();
            loss.backward()?;
            nn::clip_grad_norm_(&params, 1.0, 2.0, false)?;
            opt.step()
        },
    )?);
    if dev.is_cuda() {
        rows.extend(graph_rows(
            cx,
            (&iris.0, &iris.1),
            epochs,
            (&gpt, &xi, &yi),
            (b, t, w),
        )?);
    }
    Ok(rows)
}

/// A training step (gradients cleared first, as a captured step must) whose
/// optimizer is switched to its capturable form, run once eagerly and then
/// captured; returns the graph.
fn captured_step(
    dev: &Device,
    opt: &mut dyn Optimizer,
    mut step: impl FnMut(&mut dyn Optimizer) -> Result<()>,
) -> Result<ember::cuda::Graph> {
    opt.make_capturable()?;
    step(opt)?;
    let (g, ()) = ember::cuda::Graph::capture(dev, || step(opt))?;
    Ok(g)
}

/// The GPU-only rows: the Iris lesson's steps and a character-GPT step replayed
/// from CUDA graphs (the launch overhead paid once per step).
fn graph_rows(
    cx: &Ctx,
    (x, y): (&Tensor, &Tensor),
    epochs: usize,
    (gpt, xi, yi): (&ember::models::CharGpt, &Tensor, &Tensor),
    (b, t, w): (usize, usize, usize),
) -> Result<Vec<Row>> {
    let dev = cx.dev;
    let mut rows = Vec::new();
    ember::manual_seed(32);
    let model = mlp(&[4, 8, 9, 3], &dev)?;
    let mut opt = Adam::new(model.parameters(), 0.01)?;
    let g = captured_step(&dev, &mut opt, |opt| {
        opt.zero_grad();
        nn::cross_entropy(&model.forward(x)?, y)?.backward()?;
        opt.step()
    })?;
    rows.push(cx.row(
        format!("train iris mlp, {epochs} epochs, cuda graph"),
        Work::Samples {
            n: (120 * epochs) as f64,
            flops: None,
        },
        || (0..epochs).try_for_each(|_| g.replay()),
    )?);
    let params = gpt.parameters();
    let mut opt = Adam::adamw(params.clone(), 3e-3)?;
    let g = captured_step(&dev, &mut opt, |opt| {
        opt.zero_grad();
        gpt.loss(xi, yi)?.backward()?;
        nn::clip_grad_norm_(&params, 1.0, 2.0, false)?;
        opt.step()
    })?;
    rows.push(cx.row(
        format!("train char-gpt 4x{w} ctx{t} b{b}, cuda graph"),
        Work::Samples {
            n: b as f64,
            flops: None,
        },
        || g.replay(),
    )?);
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_flops_count_forward_and_both_gradients() {
        // one layer: forward and weight gradient only (the input needs none)
        assert_eq!(step_flops(&[10.0]), 40.0);
        // two layers: the second also passes a gradient to its input
        assert_eq!(step_flops(&[10.0, 5.0]), 30.0 + 30.0 + 10.0);
    }
}
