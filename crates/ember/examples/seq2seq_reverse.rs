//! A tiny encoder-decoder that learns to reverse 12 random digits. The encoder is
//! a `GRU` followed by a residual `MultiheadAttention` self-attention block with
//! `RMSNorm`; the decoder is one `TransformerDecoderLayer` whose self-attention is
//! causal (`square_subsequent_mask`) and whose cross-attention reads the encoder's
//! output (`decode(tgt, memory, DecoderMasks { tgt_mask, .. })`). Trained with
//! AdamW, a `LinearLr` warm-up followed by `CosineAnnealingLr` (one
//! `SequentialLr`), and `clip_grad_value_`; then scored on fresh sequences,
//! teacher-forced and greedy-decoded one digit at a time.
//!
//! `cargo run --release -p ember --example seq2seq_reverse [STEPS]` (default 200)

use ember::nn::{
    self, DecoderMasks, Embedding, Linear, Module, MultiheadAttention, RMSNorm, RnnOptions,
    TransformerDecoderLayer, TransformerOptions, GRU,
};
use ember::optim::{Adam, CosineAnnealingLr, LinearLr, LrScheduler, Optimizer, SequentialLr};
use ember::prelude::*;

const DIGITS: usize = 10;
/// The decoder's start token, after the ten digits.
const BOS: i64 = DIGITS as i64;
const LEN: usize = 12;
const WIDTH: usize = 64;

struct Seq2Seq {
    src_tokens: Embedding,
    src_positions: Embedding,
    gru: GRU,
    attn_norm: RMSNorm,
    self_attn: MultiheadAttention,
    memory_norm: RMSNorm,
    tgt_tokens: Embedding,
    tgt_positions: Embedding,
    decoder: TransformerDecoderLayer,
    out_norm: RMSNorm,
    head: Linear,
}

impl Seq2Seq {
    fn new(dev: &Device) -> ember::Result<Seq2Seq> {
        let gru_opts = RnnOptions {
            batch_first: true,
            ..Default::default()
        };
        let dec_opts = TransformerOptions {
            dim_feedforward: 2 * WIDTH,
            dropout: 0.0,
            batch_first: true,
            norm_first: true,
            ..Default::default()
        };
        Ok(Seq2Seq {
            src_tokens: Embedding::new(DIGITS, WIDTH, dev)?,
            src_positions: Embedding::new(LEN, WIDTH, dev)?,
            gru: GRU::with_options(WIDTH, WIDTH, gru_opts, dev)?,
            attn_norm: RMSNorm::new(&[WIDTH], dev)?,
            // embed_dim, heads, dropout, bias, batch_first
            self_attn: MultiheadAttention::with_options(WIDTH, 4, 0.0, true, true, dev)?,
            memory_norm: RMSNorm::new(&[WIDTH], dev)?,
            tgt_tokens: Embedding::new(DIGITS + 1, WIDTH, dev)?,
            tgt_positions: Embedding::new(LEN, WIDTH, dev)?,
            decoder: TransformerDecoderLayer::new(WIDTH, 4, dec_opts, dev)?,
            out_norm: RMSNorm::new(&[WIDTH], dev)?,
            head: Linear::new(WIDTH, DIGITS, dev)?,
        })
    }

    fn parameters(&self) -> Vec<Tensor> {
        let parts: [&dyn Module; 11] = [
            &self.src_tokens,
            &self.src_positions,
            &self.gru,
            &self.attn_norm,
            &self.self_attn,
            &self.memory_norm,
            &self.tgt_tokens,
            &self.tgt_positions,
            &self.decoder,
            &self.out_norm,
            &self.head,
        ];
        parts.iter().flat_map(|m| m.parameters()).collect()
    }

    /// The source digits `[B, LEN]` to the memory `[B, LEN, WIDTH]`.
    fn encode(&self, src: &Tensor) -> ember::Result<Tensor> {
        let pos = Tensor::arange(0i64, LEN as i64, &src.device())?;
        let x = self
            .src_tokens
            .forward(src)?
            .add(&self.src_positions.forward(&pos)?)?;
        let h = self.gru.forward(&x)?; // [B, LEN, WIDTH]
        let h = h.add(&self.self_attn.forward(&self.attn_norm.forward(&h)?)?)?;
        self.memory_norm.forward(&h)
    }

    /// The logits `[B, T, DIGITS]` for the next digit after each prefix of `tgt`
    /// (`[B, T]`, starting with `BOS`), each position seeing only itself and the
    /// ones before.
    fn decode(&self, tgt: &Tensor, memory: &Tensor) -> ember::Result<Tensor> {
        let t = tgt.shape()[1];
        let dev = tgt.device();
        let pos = Tensor::arange(0i64, t as i64, &dev)?;
        let y = self
            .tgt_tokens
            .forward(tgt)?
            .add(&self.tgt_positions.forward(&pos)?)?;
        let causal = nn::square_subsequent_mask(t, &dev)?;
        let masks = DecoderMasks {
            tgt_mask: Some(&causal),
            ..Default::default()
        };
        let h = self.decoder.decode(&y, memory, masks)?;
        self.head.forward(&self.out_norm.forward(&h)?)
    }

    /// Greedy decoding: one digit at a time, each fed back in.
    fn greedy(&self, src: &Tensor) -> ember::Result<Tensor> {
        ember::no_grad(|| {
            let memory = self.encode(src)?;
            let n = src.shape()[0];
            let mut tgt = Tensor::full([n, 1], BOS, DType::I64, &src.device())?;
            for step in 0..LEN {
                let next = self
                    .decode(&tgt, &memory)?
                    .select(1, step as i64)?
                    .argmax(-1, true)?; // [n, 1]
                tgt = Tensor::cat(&[&tgt, &next], 1)?;
            }
            tgt.narrow(1, 1, LEN)
        })
    }
}

/// `n` random sequences, their reversals, and the decoder's input: `BOS`
/// followed by the reversal shifted right by one (teacher forcing).
fn batch(n: usize, dev: &Device) -> ember::Result<(Tensor, Tensor, Tensor)> {
    let src = Tensor::randint(0, DIGITS as i64, [n, LEN], dev)?;
    let tgt = src.flip(1)?;
    let bos = Tensor::full([n, 1], BOS, DType::I64, dev)?;
    let tgt_in = Tensor::cat(&[&bos, &tgt.narrow(1, 0, LEN - 1)?], 1)?;
    Ok((src, tgt, tgt_in))
}

fn accuracy(pred: &Tensor, target: &Tensor) -> ember::Result<(f64, f64)> {
    let right = pred.eq(target)?;
    let tokens = right.to_dtype(DType::F64)?.mean_all()?.item::<f64>()?;
    let whole = right
        .all(1, false)?
        .to_dtype(DType::F64)?
        .mean_all()?
        .item::<f64>()?;
    Ok((tokens, whole))
}

fn main() -> ember::Result<()> {
    let steps: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let dev = Device::cuda_if_available(0);
    ember::manual_seed(0);
    let model = Seq2Seq::new(&dev)?;
    let params = model.parameters();
    let mut opt = Adam::adamw(params.clone(), 3e-3)?;
    // a linear warm-up from a tenth of the rate over the first 10% of the steps,
    // then cosine decay from the full rate (each schedule starts from the rate the
    // optimizer had when its first schedule was built, as in PyTorch)
    let warmup = (steps / 10).max(1);
    let warm = LinearLr::new(&mut opt, 0.1, 1.0, warmup)?;
    let cosine = CosineAnnealingLr::new(&opt, steps.saturating_sub(warmup).max(1), 1e-4)?;
    let mut sched = SequentialLr::new(
        &mut opt,
        vec![Box::new(warm), Box::new(cosine)],
        vec![warmup],
    )?;

    let (test_src, test_tgt, test_in) = batch(1000, &dev)?;
    println!(
        "reversing {LEN} digits: GRU + self-attention encoder, causal transformer decoder, {} parameters on {dev}; chance is 10% of digits",
        params.iter().map(|p| p.numel()).sum::<usize>()
    );
    let start = std::time::Instant::now();
    for step in 1..=steps {
        let (src, tgt, tgt_in) = batch(64, &dev)?;
        let logits = model.decode(&tgt_in, &model.encode(&src)?)?;
        let loss = nn::cross_entropy(
            &logits.reshape([64 * LEN, DIGITS])?,
            &tgt.reshape([64 * LEN])?,
        )?;
        opt.zero_grad();
        loss.backward()?;
        nn::clip_grad_value_(&params, 0.5)?;
        opt.step()?;
        sched.step(&mut opt);
        if [10, 25].contains(&step) || step % 50 == 0 || step == steps {
            let pred = ember::no_grad(|| model.decode(&test_in, &model.encode(&test_src)?))?
                .argmax(-1, false)?;
            let (tokens, _) = accuracy(&pred, &test_tgt)?;
            println!(
                "step {step:4}  lr {:.2e}  loss {:.3}  held-out digits right (teacher-forced) {:5.1}%  {:.1} s",
                sched.last_lr(),
                loss.item::<f32>()?,
                100.0 * tokens,
                start.elapsed().as_secs_f64()
            );
        }
    }
    let greedy = model.greedy(&test_src)?;
    let (tokens, whole) = accuracy(&greedy, &test_tgt)?;
    println!(
        "greedy decoding of 1000 fresh sequences: {:.1}% of digits, {:.1}% of sequences reversed exactly",
        100.0 * tokens,
        100.0 * whole
    );
    let src = test_src.narrow(0, 0, 1)?;
    println!(
        "{:?} -> {:?}",
        src.to_vec2::<i64>()?[0],
        model.greedy(&src)?.to_vec2::<i64>()?[0]
    );
    Ok(())
}
