//! A transformer encoder that learns to sort: each input is 10 random digits, and
//! at every position the model predicts the digit that belongs there once the
//! sequence is sorted. Attention is what makes this possible (a position has to
//! count the smaller digits anywhere in the sequence). Shows `Embedding` (tokens
//! and positions), `TransformerEncoder` (pre-norm, GELU), parameter groups with no
//! weight decay on biases and norms, `OneCycleLr` with momentum cycling,
//! `clip_grad_norm_`, and `sort` for the targets.
//!
//! `cargo run --release -p ember --example transformer_sort [STEPS]` (default 600)

use ember::nn::{
    self, Activation, Embedding, LayerNorm, Linear, Module, TransformerEncoder,
    TransformerEncoderLayer, TransformerOptions,
};
use ember::optim::{split_for_weight_decay, Adam, Groups, LrScheduler, OneCycleLr, Optimizer};
use ember::prelude::*;

const DIGITS: usize = 10;
const LEN: usize = 10;

fn main() -> ember::Result<()> {
    let steps: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    let dev = Device::cuda_if_available(0);
    ember::manual_seed(0);
    let width = 64;
    let tokens = Embedding::new(DIGITS, width, &dev)?;
    let positions = Embedding::new(LEN, width, &dev)?;
    let opts = TransformerOptions {
        dim_feedforward: 4 * width,
        dropout: 0.0,
        activation: Activation::Gelu,
        batch_first: true,
        norm_first: true,
        ..Default::default()
    };
    let layer = TransformerEncoderLayer::new(width, 4, opts, &dev)?;
    let encoder = TransformerEncoder::new(layer, 2, Some(LayerNorm::new(&[width], &dev)?))?;
    let head = Linear::new(width, DIGITS, &dev)?;
    let mut params = tokens.parameters();
    params.extend(positions.parameters());
    params.extend(encoder.parameters());
    params.extend(head.parameters());
    let (decay, no_decay) = split_for_weight_decay(params.clone());
    let mut opt = Groups::new(vec![
        Box::new(Adam::adamw(decay, 1e-3)?.weight_decay(0.01)?),
        Box::new(Adam::adamw(no_decay, 1e-3)?.weight_decay(0.0)?),
    ])?;
    let mut sched = OneCycleLr::new(&mut opt, 3e-3, steps)?;

    let pos = Tensor::arange(0i64, LEN as i64, &dev)?;
    let logits_of = |x: &Tensor| -> ember::Result<Tensor> {
        let h = tokens.forward(x)?.add(&positions.forward(&pos)?)?; // [B, LEN, width]
        head.forward(&encoder.forward(&h)?) // [B, LEN, DIGITS]
    };
    // a batch of random sequences and their sorted versions
    let batch = |n: usize| -> ember::Result<(Tensor, Tensor)> {
        let x = Tensor::randint(0, DIGITS as i64, [n, LEN], &Device::Cpu)?;
        let (sorted, _) = x.sort(1, false)?;
        Ok((x.to(&dev)?, sorted.to(&dev)?))
    };
    let (test_x, test_y) = batch(1000)?;
    let accuracy = |x: &Tensor, y: &Tensor| -> ember::Result<(f64, f64)> {
        let pred = ember::no_grad(|| logits_of(x))?.argmax(-1, false)?;
        let right = pred.eq(y)?;
        let per_digit = right.to_dtype(DType::F64)?.mean_all()?.item::<f64>()?;
        let whole = right
            .all(1, false)?
            .to_dtype(DType::F64)?
            .mean_all()?
            .item::<f64>()?;
        Ok((per_digit, whole))
    };
    println!(
        "sorting {LEN} digits with a 2-layer transformer encoder ({} parameters) on {dev}",
        params.iter().map(|p| p.numel()).sum::<usize>()
    );
    let start = std::time::Instant::now();
    for step in 1..=steps {
        let (x, y) = batch(64)?;
        let logits = logits_of(&x)?;
        let loss = nn::cross_entropy(
            &logits.reshape([64 * LEN, DIGITS])?,
            &y.reshape([64 * LEN])?,
        )?;
        opt.zero_grad();
        loss.backward()?;
        nn::clip_grad_norm_(&params, 1.0, 2.0, false)?;
        opt.step()?;
        sched.step(&mut opt);
        if step % 100 == 0 || step == steps {
            let (digit, whole) = accuracy(&test_x, &test_y)?;
            println!(
                "step {step:4}  loss {:.3}  held-out: {:.1}% of digits, {:.1}% of sequences sorted exactly  {:.1} s",
                loss.item::<f32>()?,
                100.0 * digit,
                100.0 * whole,
                start.elapsed().as_secs_f64()
            );
        }
    }
    let (x, _) = batch(1)?;
    let pred = ember::no_grad(|| logits_of(&x))?.argmax(-1, false)?;
    println!(
        "{:?} -> {:?}",
        x.to_vec2::<i64>()?[0],
        pred.to_vec2::<i64>()?[0]
    );
    Ok(())
}
