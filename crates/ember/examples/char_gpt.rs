//! A character-level GPT trained on the New Testament shipped in data/ (the same
//! model and loop as `ember train text`, in a few lines): AdamW over two
//! parameter groups (no weight decay on biases and norms), warm-up and cosine decay, gradient clipping, validation against the unigram baseline,
//! and a sample of the text it learned.
//!
//! `cargo run --release -p ember --example char_gpt [STEPS]` (default 300)

use ember::data::{find_data_file, CharCorpus, Split};
use ember::models::{CharGpt, GptConfig};
use ember::nn::{self, Module};
use ember::optim::{split_for_weight_decay, Adam, Groups, LrScheduler, Optimizer, SequentialLr};
use ember::prelude::*;

fn main() -> ember::Result<()> {
    let steps: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let dev = Device::cuda_if_available(0);
    ember::manual_seed(1);
    let corpus = CharCorpus::from_file(find_data_file("kjv-new-testament.txt")?, 0.1)?;
    let config = GptConfig {
        vocab_size: corpus.vocab_size(),
        context: 64,
        layers: 2,
        heads: 4,
        width: 64,
        dropout: 0.0,
    };
    let mut model = CharGpt::new(config, &dev)?;
    let params = model.parameters();
    // two parameter groups: weight decay on matrices only, not biases and norms
    let (decay, no_decay) = split_for_weight_decay(params.clone());
    let mut opt = Groups::new(vec![
        Box::new(Adam::adamw(decay, 3e-3)?),
        Box::new(Adam::adamw(no_decay, 3e-3)?.weight_decay(0.0)?),
    ])?;
    let warmup = (steps / 10).max(1).min(steps);
    let mut sched = SequentialLr::warmup_cosine(&mut opt, warmup, steps, 3e-4)?;
    println!(
        "{} parameters on {dev}; the unigram baseline is {:.3} nats per character",
        model.num_parameters(),
        corpus.unigram_loss()
    );
    let start = std::time::Instant::now();
    for step in 1..=steps {
        let (x, y) = corpus.batch(Split::Train, 32, config.context, &dev)?;
        let loss = model.loss(&x, &y)?;
        opt.zero_grad();
        loss.backward()?;
        nn::clip_grad_norm_(&params, 1.0, 2.0, false)?;
        opt.step()?;
        sched.step(&mut opt);
        if step % 50 == 0 || step == steps {
            model.eval();
            let (vx, vy) = corpus.batch(Split::Val, 64, config.context, &dev)?;
            let val = ember::no_grad(|| model.loss(&vx, &vy))?.item::<f32>()?;
            model.train();
            println!(
                "step {step:4}  train {:.3}  val {val:.3}  {:.1} s",
                loss.item::<f32>()?,
                start.elapsed().as_secs_f64()
            );
        }
    }
    model.eval();
    let prompt = corpus.encode("And Jesus said")?;
    let text = corpus.decode(&model.generate(&prompt, 200, 0.8, Some(10))?)?;
    println!("---\nAnd Jesus said{text}");
    Ok(())
}
