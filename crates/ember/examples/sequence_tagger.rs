//! Variable-length sequences, padded: a tagger and a reader, on digit strings
//! of length 4 to 16 (token 0 is padding).
//!
//! - **The tagger** marks each digit equal to its sequence's maximum (a question
//!   about the whole sequence, on both sides of each position) and names that
//!   maximum: an `Embedding` with `padding_idx`, a two-layer bidirectional `GRU`
//!   (batch first), a `ModuleList` of blocks (linear layers with `SiLU`,
//!   `LeakyReLU` and `Softplus`, and an `Identity`), and a `ModuleDict` of two
//!   heads. The maximum's head reads an
//!   attention pooling: functional `scaled_dot_product_attention` from a learnt
//!   query with a key padding mask (`[N, 1, 1, S]`) and dropout, on the
//!   memory-saving path (its backward draws the dropout masks again). The tags'
//!   loss ignores padding (`ignore_index`); accuracy counts real positions only
//!   (`masked_select`). Since the task reads the sequence both ways, the tagger
//!   tags reversed strings (`gather`) as well; and the pooling's weights,
//!   recomputed with `bmm`, give its output again.
//! - **The reader** gives the running maximum at each position, one step at a
//!   time, with an `LSTMCell` and with a `GRUCell` (its loss per sequence through
//!   `logsumexp`).
//!
//! `cargo run --release -p ember --example sequence_tagger` (train steps: an
//! optional first argument; default 300)

use ember::nn::functional::{with_attention_path, AttentionPath};
use ember::nn::{
    self, Embedding, GRUCell, Identity, LSTMCell, LeakyReLU, Linear, LossOptions, Module,
    ModuleDict, ModuleList, RnnOptions, SiLU, Softplus, GRU,
};
use ember::optim::{Adam, Optimizer};
use ember::prelude::*;

const DIGITS: i64 = 10;
const MAX_LEN: usize = 16;
const WIDTH: usize = 48;
const IGNORE: i64 = -100;

/// A batch: tokens `[n, MAX_LEN]` (digits 1-9, then 0 as padding), each real
/// position's tag (1 where it holds the maximum; `IGNORE` on padding), the
/// maximum's class (0-8 for 1-9), the running maximum's class per position, and
/// which positions are real.
struct Batch {
    tokens: Tensor,
    tags: Tensor,
    max_class: Tensor,
    running: Tensor,
    real: Tensor,
}

fn batch(n: usize, dev: &Device) -> ember::Result<Batch> {
    let digits = Tensor::randint(1, DIGITS, [n, MAX_LEN], &Device::Cpu)?.to_vec::<i64>()?;
    let lengths = Tensor::randint(4, MAX_LEN as i64 + 1, [n], &Device::Cpu)?.to_vec::<i64>()?;
    let (mut tokens, mut tags, mut running, mut max_class) = (vec![], vec![], vec![], vec![]);
    for (row, &len) in digits.chunks(MAX_LEN).zip(&lengths) {
        let len = len as usize;
        let max = *row[..len].iter().max().unwrap();
        let mut so_far = 0;
        for (i, &d) in row.iter().enumerate() {
            let real = i < len;
            so_far = so_far.max(d);
            tokens.push(if real { d } else { 0 });
            tags.push(if real { (d == max) as i64 } else { IGNORE });
            running.push(if real { so_far - 1 } else { IGNORE });
        }
        max_class.push(max - 1);
    }
    let t = |v: Vec<i64>, shape: &[usize]| Tensor::from_vec(v, shape, dev);
    let tokens = t(tokens, &[n, MAX_LEN])?;
    Ok(Batch {
        real: tokens.ne(0.0)?,
        tokens,
        tags: t(tags, &[n, MAX_LEN])?,
        max_class: t(max_class, &[n])?,
        running: t(running, &[n, MAX_LEN])?,
    })
}

struct Tagger {
    embed: Embedding,
    gru: GRU,
    blocks: ModuleList,
    heads: ModuleDict,
    /// The pooling's query `[1, 1, 1, 2·WIDTH]`.
    query: Tensor,
}

impl Tagger {
    fn new(dev: &Device) -> ember::Result<Tagger> {
        let opts = RnnOptions {
            num_layers: 2,
            batch_first: true,
            bidirectional: true,
            ..Default::default()
        };
        let h = 2 * WIDTH;
        let mut blocks = ModuleList::new();
        blocks.push(Linear::new(h, h, dev)?);
        blocks.push(SiLU);
        blocks.push(Linear::new(h, h, dev)?);
        blocks.push(LeakyReLU::default());
        blocks.push(Linear::new(h, h, dev)?);
        blocks.push(Softplus::default());
        // a slot for an optional block (a norm, say): the identity when unused
        blocks.push(Identity);
        let mut heads = ModuleDict::new();
        heads.insert("tag", Linear::new(h, 2, dev)?)?;
        heads.insert("max", Linear::new(h, 9, dev)?)?;
        Ok(Tagger {
            embed: Embedding::with_padding(DIGITS as usize, WIDTH, Some(0), dev)?,
            gru: GRU::with_options(WIDTH, WIDTH, opts, dev)?,
            blocks,
            heads,
            query: Tensor::randn([1, 1, 1, h], dev)?
                .mul(0.1)?
                .requires_grad_(true)?,
        })
    }

    fn parameters(&self) -> Vec<Tensor> {
        let parts: [&dyn Module; 4] = [&self.embed, &self.gru, &self.blocks, &self.heads];
        let mut p: Vec<Tensor> = parts.iter().flat_map(|m| m.parameters()).collect();
        p.push(self.query.clone());
        p
    }

    /// The features `[n, L, 2·WIDTH]`: both directions' states through the blocks.
    fn features(&self, tokens: &Tensor) -> ember::Result<Tensor> {
        let mut h = self.gru.forward(&self.embed.forward(tokens)?)?;
        for block in self.blocks.iter() {
            h = block.forward(&h)?;
        }
        Ok(h)
    }

    /// The pooled features `[n, 2·WIDTH]` (attention from the query over the
    /// real positions) and the keys' mask `[n, 1, 1, L]`.
    fn pool(&self, h: &Tensor, real: &Tensor, dropout: f64) -> ember::Result<(Tensor, Tensor)> {
        let (n, l, d) = (h.shape()[0], h.shape()[1], h.shape()[2]);
        let keys = h.reshape([n, 1, l, d])?;
        let allowed = real.reshape([n, 1, 1, l])?;
        let q = self.query.expand([n, 1, 1, d])?;
        let pooled = with_attention_path(AttentionPath::MemoryEfficient, || {
            nn::scaled_dot_product_attention(&q, &keys, &keys, Some(&allowed), dropout, false, None)
        })?;
        Ok((pooled.reshape([n, d])?, allowed))
    }

    /// Tag logits `[n, L, 2]` and the maximum's logits `[n, 9]`.
    fn forward(&self, b: &Batch, dropout: f64) -> ember::Result<(Tensor, Tensor)> {
        let h = self.features(&b.tokens)?;
        let tags = self.heads.get("tag").unwrap().forward(&h)?;
        let (pooled, _) = self.pool(&h, &b.real, dropout)?;
        Ok((tags, self.heads.get("max").unwrap().forward(&pooled)?))
    }
}

/// The share of real positions where `pred` equals `target`.
fn accuracy_on(pred: &Tensor, target: &Tensor, real: &Tensor) -> ember::Result<f64> {
    let right = pred.eq(target)?.masked_select(real)?;
    right.to_dtype(DType::F64)?.mean_all()?.item::<f64>()
}

fn tag_loss(logits: &Tensor, tags: &Tensor) -> ember::Result<Tensor> {
    let opts = LossOptions {
        ignore_index: IGNORE,
        ..Default::default()
    };
    nn::cross_entropy_opts(&logits.transpose(1, 2)?, tags, opts)
}

/// A cell (LSTM or GRU) reading one digit per step.
enum Cell {
    Lstm(LSTMCell),
    Gru(GRUCell),
}

struct Reader {
    embed: Embedding,
    cell: Cell,
    head: Linear,
}

impl Reader {
    fn parameters(&self) -> Vec<Tensor> {
        let mut p = self.embed.parameters();
        p.extend(match &self.cell {
            Cell::Lstm(c) => c.parameters(),
            Cell::Gru(c) => c.parameters(),
        });
        p.extend(self.head.parameters());
        p
    }

    /// Logits `[n, L, 9]` for the running maximum, one step at a time.
    fn forward(&self, tokens: &Tensor) -> ember::Result<Tensor> {
        let x = self.embed.forward(tokens)?;
        let (mut h, mut c) = (None::<Tensor>, None::<Tensor>);
        let mut outs = Vec::new();
        for t in 0..tokens.shape()[1] {
            let xt = x.select(1, t as i64)?;
            let next = match &self.cell {
                Cell::Lstm(cell) => {
                    let state = h.as_ref().zip(c.as_ref());
                    let (h1, c1) = cell.step(&xt, state)?;
                    c = Some(c1);
                    h1
                }
                Cell::Gru(cell) => cell.step(&xt, h.as_ref())?,
            };
            outs.push(self.head.forward(&next)?.unsqueeze(1)?);
            h = Some(next);
        }
        Tensor::cat(&outs.iter().collect::<Vec<_>>(), 1)
    }
}

/// The reader's loss: each sequence's negative log-likelihood of its running
/// maxima (log-softmax written with `logsumexp`), averaged over real positions.
fn reader_loss(logits: &Tensor, b: &Batch) -> ember::Result<Tensor> {
    let logp = logits.sub(&logits.logsumexp(-1, true)?)?;
    let target = b.running.clamp(Some(0), Some(8))?.unsqueeze(-1)?;
    let picked = logp.gather(-1, &target)?.squeeze(-1)?;
    let real = b.real.to_dtype(DType::F32)?;
    picked.mul(&real)?.sum_all()?.neg()?.div(&real.sum_all()?)
}

fn main() -> ember::Result<()> {
    let steps: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let dev = Device::cuda_if_available(0);
    ember::manual_seed(0);
    println!("tagging the maximum of digit strings (length 4-16) on {dev}, {steps} steps:");

    let tagger = Tagger::new(&dev)?;
    let mut opt = Adam::new(tagger.parameters(), 3e-3)?;
    for step in 1..=steps {
        let b = batch(64, &dev)?;
        let (tags, max) = tagger.forward(&b, 0.1)?;
        let loss = tag_loss(&tags, &b.tags)?.add(&nn::cross_entropy(&max, &b.max_class)?)?;
        opt.zero_grad();
        loss.backward()?;
        opt.step()?;
        if step % (steps / 3).max(1) == 0 {
            println!("  step {step:4}: loss {:.3}", loss.item::<f32>()?);
        }
    }
    let test = batch(1000, &dev)?;
    ember::no_grad(|| -> ember::Result<()> {
        let (tags, max) = tagger.forward(&test, 0.0)?;
        let tag_acc = accuracy_on(&tags.argmax(-1, false)?, &test.tags, &test.real)?;
        let max_acc = max
            .argmax(-1, false)?
            .eq(&test.max_class)?
            .to_dtype(DType::F64)?
            .mean_all()?
            .item::<f64>()?;
        println!(
            "  held out: tags {:.1}% of real positions, maximum named {:.1}%",
            100.0 * tag_acc,
            100.0 * max_acc
        );
        // the same strings reversed (padding kept at the end): the tags reverse too
        let flipped = reversed(&test)?;
        let (ftags, _) = tagger.forward(&flipped, 0.0)?;
        let f_acc = accuracy_on(&ftags.argmax(-1, false)?, &flipped.tags, &flipped.real)?;
        println!(
            "  reversed strings: tags {:.1}% (the task reads both ways, so does the GRU)",
            100.0 * f_acc
        );
        // the pooling by hand: softmax of q·kᵀ/sqrt(d) over real keys, times the keys
        let h = tagger.features(&test.tokens)?;
        let (pooled, allowed) = tagger.pool(&h, &test.real, 0.0)?;
        let (n, d) = (h.shape()[0], h.shape()[2]);
        let q = tagger.query.reshape([1, 1, d])?.expand([n, 1, d])?;
        let scores = q.bmm(&h.transpose(1, 2)?)?.mul(1.0 / (d as f64).sqrt())?;
        let blocked = allowed.reshape([n, 1, MAX_LEN])?.logical_not()?;
        let weights = scores
            .masked_fill(&blocked, f64::NEG_INFINITY)?
            .softmax(-1)?;
        let by_hand = weights.bmm(&h)?.reshape([n, d])?;
        let diff = by_hand.sub(&pooled)?.abs()?.max_all()?.item::<f32>()?;
        println!("  pooling recomputed with bmm: largest difference {diff:.1e}");
        Ok(())
    })?;

    println!("the running maximum, read one digit at a time:");
    for (name, cell) in [
        ("LSTMCell", Cell::Lstm(LSTMCell::new(WIDTH, WIDTH, &dev)?)),
        ("GRUCell", Cell::Gru(GRUCell::new(WIDTH, WIDTH, &dev)?)),
    ] {
        let reader = Reader {
            embed: Embedding::with_padding(DIGITS as usize, WIDTH, Some(0), &dev)?,
            cell,
            head: Linear::new(WIDTH, 9, &dev)?,
        };
        let mut opt = Adam::new(reader.parameters(), 1e-2)?;
        for _ in 0..steps {
            let b = batch(64, &dev)?;
            let loss = reader_loss(&reader.forward(&b.tokens)?, &b)?;
            opt.zero_grad();
            loss.backward()?;
            opt.step()?;
        }
        let acc = ember::no_grad(|| -> ember::Result<f64> {
            let pred = reader.forward(&test.tokens)?.argmax(-1, false)?;
            accuracy_on(&pred, &test.running, &test.real)
        })?;
        println!("  {name}: {:.1}% of held-out positions", 100.0 * acc);
    }
    Ok(())
}

/// `b` with each string reversed in place (its real digits; padding stays last).
fn reversed(b: &Batch) -> ember::Result<Batch> {
    let n = b.tokens.shape()[0];
    let lens = b
        .real
        .to_dtype(DType::I64)?
        .sum(1, false)?
        .to_vec::<i64>()?;
    // index of each position's source: len - 1 - i for real positions, i after
    let mut index = Vec::with_capacity(n * MAX_LEN);
    for &len in &lens {
        for i in 0..MAX_LEN as i64 {
            index.push(if i < len { len - 1 - i } else { i });
        }
    }
    let index = Tensor::from_vec(index, [n, MAX_LEN], &b.tokens.device())?;
    let take = |t: &Tensor| t.gather(1, &index);
    Ok(Batch {
        tokens: take(&b.tokens)?,
        tags: take(&b.tags)?,
        max_class: b.max_class.clone(),
        running: b.running.clone(),
        real: b.real.clone(),
    })
}
