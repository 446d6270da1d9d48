//! A character-level GPT: token and position embeddings, pre-norm transformer
//! blocks with causal self-attention and a GELU feed-forward, a final layer norm
//! and a linear head over the vocabulary (the decoder-only layout of GPT-2, with
//! PyTorch's `nn.TransformerEncoderLayer(norm_first=True)` as the block).
//!
//! [`CharGpt::new_tied`] ties the head to the token embedding as GPT-2 does (one
//! `[vocab, width]` parameter, read by the embedding and multiplied by the head,
//! no head bias), which is how [`gpt2_small`](super::gpt2_small) builds GPT-2's
//! 124M layout.

use crate::nn::{
    self, init, Activation, Embedding, LayerNorm, Linear, Module, TransformerEncoder,
    TransformerEncoderLayer, TransformerOptions,
};
use crate::{
    device::Device,
    dtype::DType,
    error::{Error, Result},
    tensor::Tensor,
};

/// The shape of a [`CharGpt`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GptConfig {
    pub vocab_size: usize,
    /// The longest input (positions have learned embeddings up to it).
    pub context: usize,
    pub layers: usize,
    pub heads: usize,
    /// The embedding width (the feed-forward is 4 times wider).
    pub width: usize,
    pub dropout: f64,
}

impl GptConfig {
    /// GPT-2's smallest model exactly: [`gpt2_small`](Self::gpt2_small) with
    /// GPT-2's own 50257 tokens, the shape of its published weights.
    pub fn gpt2() -> GptConfig {
        GptConfig {
            vocab_size: 50257,
            ..GptConfig::gpt2_small()
        }
    }

    /// GPT-2's smallest layout (124M parameters with the tied head): 12 layers,
    /// 12 heads, width 768, context 1024, and GPT-2's 50257 tokens padded to
    /// 50304 (a multiple of 64, which the products of the head prefer); no
    /// dropout, as pre-training runs commonly set it.
    pub fn gpt2_small() -> GptConfig {
        GptConfig {
            vocab_size: 50304,
            context: 1024,
            layers: 12,
            heads: 12,
            width: 768,
            dropout: 0.0,
        }
    }
}

/// A decoder-only transformer over character (or token) ids.
pub struct CharGpt {
    pub tok_emb: Embedding,
    pub pos_emb: Embedding,
    pub blocks: TransformerEncoder,
    pub ln_f: LayerNorm,
    /// The output layer. When [tied](CharGpt::new_tied), its weight is the token
    /// embedding's `weight` (the same tensor) and it has no bias.
    pub head: Linear,
    pub config: GptConfig,
    tied: bool,
    /// The positions `0..context` and the `[context, context]` causal mask of
    /// each device used so far: made once, not at every forward pass, so a step
    /// copies nothing from the host and can be captured in a CUDA graph; a
    /// shorter sequence takes views of them (one pair a device, whatever the
    /// lengths generation goes through).
    fixed: std::sync::Mutex<Vec<(Device, Tensor, Tensor)>>,
}

impl CharGpt {
    /// Weights drawn as GPT-2's: normal with standard deviation 0.02, except the
    /// two projections back into the residual stream (each attention's
    /// `out_proj` and each feed-forward's `linear2`), drawn with
    /// `0.02 / sqrt(2 * layers)` as GPT-2 scales them (Hugging Face's and
    /// nanoGPT's `c_proj`); biases zero (layer norms: weight 1, bias 0).
    pub fn new(config: GptConfig, device: &Device) -> Result<CharGpt> {
        CharGpt::build(config, false, Activation::Gelu, device)
    }

    /// [`new`](CharGpt::new) with the head tied to the token embedding, as GPT-2
    /// has it: the head multiplies by the embedding table (`logits = h Eᵀ`, no
    /// bias), so the model holds one `[vocab, width]` parameter, listed once by
    /// [`named_parameters`](Module::named_parameters) (as `tok_emb.weight`), and
    /// its gradient sums both uses. PyTorch writes this
    /// `head.weight = tok_emb.weight`.
    ///
    /// ```
    /// use ember::models::{CharGpt, GptConfig};
    /// use ember::prelude::*;
    /// let config = GptConfig { vocab_size: 64, context: 16, layers: 1, heads: 2, width: 32, dropout: 0.0 };
    /// let (tied, untied) = (CharGpt::new_tied(config, &Device::Meta)?, CharGpt::new(config, &Device::Meta)?);
    /// // the head's weight and bias are not parameters of their own
    /// assert_eq!(untied.num_parameters() - tied.num_parameters(), 64 * 32 + 64);
    /// assert!(tied.is_tied() && tied.head.bias.is_none());
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn new_tied(config: GptConfig, device: &Device) -> Result<CharGpt> {
        CharGpt::build(config, true, Activation::Gelu, device)
    }

    /// GPT-2's own block, as Hugging Face's `GPT2LMHeadModel` computes it: the
    /// head tied as in [`new_tied`](CharGpt::new_tied), and the feed-forward's
    /// GELU with the tanh approximation (GPT-2's `gelu_new`). With GPT-2's
    /// weights (see [`gpt2_state_from_hf`](super::gpt2_state_from_hf)) it gives
    /// GPT-2's logits.
    pub fn new_gpt2(config: GptConfig, device: &Device) -> Result<CharGpt> {
        CharGpt::build(config, true, Activation::GeluTanh, device)
    }

    /// Whether the head's weight is the token embedding's.
    pub fn is_tied(&self) -> bool {
        self.tied
    }

    fn build(
        config: GptConfig,
        tied: bool,
        activation: Activation,
        device: &Device,
    ) -> Result<CharGpt> {
        let c = config;
        if c.heads == 0 || !c.width.is_multiple_of(c.heads) || c.context == 0 || c.vocab_size == 0 {
            return Err(Error::invalid(
                "CharGpt",
                format!("width ({}) must be a positive multiple of heads ({}), context and vocabulary positive", c.width, c.heads),
            ));
        }
        let opts = TransformerOptions {
            dim_feedforward: 4 * c.width,
            dropout: c.dropout,
            activation,
            batch_first: true,
            norm_first: true,
            ..Default::default()
        };
        let layer = TransformerEncoderLayer::new(c.width, c.heads, opts, device)?;
        let tok_emb = Embedding::new(c.vocab_size, c.width, device)?;
        let head = if tied {
            Linear {
                weight: tok_emb.weight.clone(),
                bias: None,
            }
        } else {
            Linear::new(c.width, c.vocab_size, device)?
        };
        let model = CharGpt {
            tok_emb,
            pos_emb: Embedding::new(c.context, c.width, device)?,
            blocks: TransformerEncoder::new(layer, c.layers, None)?,
            ln_f: LayerNorm::new(&[c.width], device)?,
            head,
            config,
            tied,
            fixed: std::sync::Mutex::new(Vec::new()),
        };
        // (GPT-2's scaling keeps the residual stream's variance from growing
        // with the depth: each layer adds two projections to it)
        let residual_std = 0.02 / (2.0 * c.layers as f64).sqrt();
        for (name, p) in model.named_parameters() {
            if name.contains("norm") || name.starts_with("ln_f") {
                continue;
            }
            if name.ends_with("bias") {
                init::zeros_(&p)?;
            } else if name.ends_with("out_proj.weight") || name.ends_with("linear2.weight") {
                init::normal_(&p, 0.0, residual_std)?;
            } else {
                init::normal_(&p, 0.0, 0.02)?;
            }
        }
        Ok(model)
    }

    /// The children that own parameters: the head too unless it is tied (then
    /// its one tensor is the token embedding's).
    fn children(&self) -> Vec<(&'static str, &dyn Module)> {
        let mut c: Vec<(&'static str, &dyn Module)> = vec![
            ("tok_emb", &self.tok_emb),
            ("pos_emb", &self.pos_emb),
            ("blocks", &self.blocks),
            ("ln_f", &self.ln_f),
        ];
        if !self.tied {
            c.push(("head", &self.head));
        }
        c
    }

    /// Applies `f` to every child that owns parameters, then points a tied head
    /// at the token embedding's new tensor (moving, emptying or casting makes a
    /// new one).
    fn each_child_mut(&mut self, mut f: impl FnMut(&mut dyn Module) -> Result<()>) -> Result<()> {
        f(&mut self.tok_emb)?;
        f(&mut self.pos_emb)?;
        f(&mut self.blocks)?;
        f(&mut self.ln_f)?;
        if self.tied {
            self.head.weight = self.tok_emb.weight.clone();
            Ok(())
        } else {
            f(&mut self.head)
        }
    }

    /// The next-character logits `[B, T, vocab]` of ids `[B, T]` (`T` at most the
    /// context).
    pub fn logits(&self, idx: &Tensor) -> Result<Tensor> {
        if idx.rank() != 2 || idx.shape()[1] > self.config.context || idx.shape()[1] == 0 {
            return Err(Error::shape(
                "CharGpt",
                idx.shape(),
                &[self.config.context],
                format!(
                    "expected ids [batch, length] with 1 <= length <= {}, got {:?}",
                    self.config.context,
                    idx.shape()
                ),
            ));
        }
        let t = idx.shape()[1];
        let (pos, causal) = self.positions_and_mask(t, idx.device())?;
        // each child in its module scope (`blocks.layers.3.self_attn`), as Sequential
        // runs its children: the profiler's ranges and the memory estimate's
        // rows name them
        let tok = nn::in_module("tok_emb", || self.tok_emb.forward(idx))?;
        let x = nn::in_module("pos_emb", || tok.add(&self.pos_emb.forward(&pos)?))?;
        let h = nn::in_module("blocks", || {
            self.blocks.forward_with(&x, Some(&causal), None, true)
        })?;
        let h = nn::in_module("ln_f", || self.ln_f.forward(&h))?;
        nn::in_module("head", || self.head.forward(&h))
    }

    /// The positions `0..t` and the causal mask (PyTorch's convention: true where
    /// attention is not allowed, the future) for sequences of length `t` on
    /// `device`.
    fn positions_and_mask(&self, t: usize, device: Device) -> Result<(Tensor, Tensor)> {
        let mut fixed = self.fixed.lock().unwrap_or_else(|p| p.into_inner());
        let (pos, causal) = match fixed.iter().find(|(d, _, _)| *d == device) {
            Some((_, p, m)) => (p.clone(), m.clone()),
            None => {
                let c = self.config.context;
                let pos = Tensor::arange(0i64, c as i64, &device)?;
                let causal = Tensor::triangle_mask(c, c, 1, false, &device)?;
                fixed.push((device, pos.clone(), causal.clone()));
                (pos, causal)
            }
        };
        if t == self.config.context {
            return Ok((pos, causal));
        }
        // the first t positions, and the mask's top-left [t, t] (the same
        // pattern: the future of each of the first t positions among them)
        Ok((
            pos.narrow(0, 0, t)?,
            causal.narrow(0, 0, t)?.narrow(1, 0, t)?,
        ))
    }

    /// The mean cross-entropy of predicting `targets [B, T]` from `idx [B, T]`.
    pub fn loss(&self, idx: &Tensor, targets: &Tensor) -> Result<Tensor> {
        let logits = self.logits(idx)?;
        let v = self.config.vocab_size;
        let n = targets.numel();
        nn::cross_entropy(&logits.reshape([n, v])?, &targets.reshape([n])?)
    }

    /// `n` more ids after `prompt`, each drawn from the softmax of the last
    /// position's logits divided by `temperature` (0, or one so small that the
    /// quotients overflow, takes the most likely),
    /// among the `top_k` most likely when given. Runs without recording a graph;
    /// set the model to evaluation first to turn dropout off.
    pub fn generate(
        &self,
        prompt: &[i64],
        n: usize,
        temperature: f64,
        top_k: Option<usize>,
    ) -> Result<Vec<i64>> {
        if prompt.is_empty() {
            return Err(Error::invalid(
                "generate",
                "the prompt needs at least one id",
            ));
        }
        if temperature.is_nan() || temperature < 0.0 {
            return Err(Error::invalid(
                "generate",
                format!("temperature must be >= 0, got {temperature}"),
            ));
        }
        let dev = self.head.weight.device();
        let mut ids = prompt.to_vec();
        crate::autograd::no_grad(|| {
            for _ in 0..n {
                let start = ids.len().saturating_sub(self.config.context);
                let window = &ids[start..];
                let x = Tensor::from_vec(window.to_vec(), [1, window.len()], &dev)?;
                let last = self
                    .logits(&x)?
                    .select(1, window.len() as i64 - 1)?
                    .squeeze(0)?;
                let next = if temperature == 0.0 {
                    last.argmax_all()?.item::<i64>()?
                } else {
                    // in float64 (any positive temperature is a number there), shifted
                    // by the largest logit first (softmax is the same), so that a
                    // temperature so small that the quotients overflow still gives the
                    // most likely ids, not NaN
                    let l = last.to_dtype(DType::F64)?;
                    let mut l = l.sub(&l.max_all()?)?.div(temperature)?;
                    if let Some(k) = top_k.filter(|&k| k < self.config.vocab_size && k > 0) {
                        let kth = l.topk(k, 0, true)?.0.select(0, k as i64 - 1)?;
                        l = l.masked_fill(&l.lt(&kth)?, f64::NEG_INFINITY)?;
                    }
                    l.softmax(0)?.multinomial(1, true)?.item::<i64>()?
                };
                ids.push(next);
            }
            Ok(ids[prompt.len()..].to_vec())
        })
    }
}

impl Module for CharGpt {
    fn forward(&self, idx: &Tensor) -> Result<Tensor> {
        self.logits(idx)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        self.children()
            .into_iter()
            .flat_map(|(c, m)| {
                m.named_parameters()
                    .into_iter()
                    .map(move |(n, t)| (format!("{c}.{n}"), t))
            })
            .collect()
    }

    fn to_device(&mut self, device: &Device) -> Result<()> {
        self.fixed.lock().unwrap_or_else(|p| p.into_inner()).clear();
        self.each_child_mut(|m| m.to_device(device))
    }

    fn to_empty(&mut self, device: &Device) -> Result<()> {
        self.fixed.lock().unwrap_or_else(|p| p.into_inner()).clear();
        self.each_child_mut(|m| m.to_empty(device))
    }

    fn to_dtype(&mut self, dtype: DType) -> Result<()> {
        self.each_child_mut(|m| m.to_dtype(dtype))
    }

    fn set_training(&mut self, training: bool) {
        self.tok_emb.set_training(training);
        self.pos_emb.set_training(training);
        self.blocks.set_training(training);
        self.ln_f.set_training(training);
        self.head.set_training(training);
    }
}
