//! A character-level LSTM language model on the New Testament shipped in data/:
//! embedding, a two-layer `nn::LSTM` (PyTorch's layout and gates), a linear head;
//! truncated backpropagation through time over windows of 64 characters, Adam
//! with the one-cycle schedule (the rate up then down, Adam's first beta the other
//! way), gradient clipping; then text sampled one character at a time, carrying the
//! LSTM's state from step to step.
//!
//! `cargo run --release -p ember --example char_lstm [STEPS]` (default 200)

use ember::data::{find_data_file, CharCorpus, Split};
use ember::nn::{self, Embedding, Linear, Module, RnnOptions, LSTM};
use ember::optim::{Adam, LrScheduler, OneCycleLr, Optimizer};
use ember::prelude::*;

fn main() -> ember::Result<()> {
    let steps: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let dev = Device::cuda_if_available(0);
    ember::manual_seed(1);
    let corpus = CharCorpus::from_file(find_data_file("kjv-new-testament.txt")?, 0.1)?;
    let (v, width, context) = (corpus.vocab_size(), 128, 64);
    let emb = Embedding::new(v, width, &dev)?;
    let opts = RnnOptions {
        num_layers: 2,
        batch_first: true,
        ..Default::default()
    };
    let lstm = LSTM::with_options(width, width, opts, &dev)?;
    let head = Linear::new(width, v, &dev)?;
    let mut params = emb.parameters();
    params.extend(lstm.parameters());
    params.extend(head.parameters());
    let mut opt = Adam::new(params.clone(), 5e-3)?;
    // stepped once per batch: up to 1e-2 over the first 30% of the steps, then down
    let mut sched = OneCycleLr::new(&mut opt, 1e-2, steps)?;
    let loss_of = |x: &Tensor, y: &Tensor| -> ember::Result<Tensor> {
        let h = lstm.forward(&emb.forward(x)?)?; // [B, T, width]
        let logits = head.forward(&h)?;
        let n = y.numel();
        nn::cross_entropy(&logits.reshape([n, v])?, &y.reshape([n])?)
    };
    println!(
        "an LSTM language model on {dev}; the unigram baseline is {:.3} nats per character",
        corpus.unigram_loss()
    );
    let start = std::time::Instant::now();
    for step in 1..=steps {
        let (x, y) = corpus.batch(Split::Train, 32, context, &dev)?;
        let loss = loss_of(&x, &y)?;
        opt.zero_grad();
        loss.backward()?;
        nn::clip_grad_norm_(&params, 1.0, 2.0, false)?;
        opt.step()?;
        sched.step(&mut opt);
        if step % 50 == 0 || step == steps {
            let (vx, vy) = corpus.batch(Split::Val, 64, context, &dev)?;
            let val = ember::no_grad(|| loss_of(&vx, &vy))?.item::<f32>()?;
            println!(
                "step {step:4}  train {:.3}  val {val:.3}  {:.1} s",
                loss.item::<f32>()?,
                start.elapsed().as_secs_f64()
            );
        }
    }
    // sampling: one character at a time, the state carried along
    let mut text = String::from("And");
    let mut state: Option<(Tensor, Tensor)> = None;
    let mut input = corpus.encode(&text)?;
    ember::no_grad(|| -> ember::Result<()> {
        for _ in 0..200 {
            let x = Tensor::from_vec(input.clone(), [1, input.len()], &dev)?;
            let s = state.as_ref().map(|(h, c)| (h, c));
            let (out, (h, c)) = lstm.forward_state(&emb.forward(&x)?, s)?;
            let last = head
                .forward(&out.select(1, input.len() as i64 - 1)?)?
                .squeeze(0)?;
            let next = last
                .div(0.8)?
                .softmax(0)?
                .multinomial(1, true)?
                .item::<i64>()?;
            text.push_str(&corpus.decode(&[next])?);
            input = vec![next];
            state = Some((h, c));
        }
        Ok(())
    })?;
    println!("---\n{text}");
    Ok(())
}
