//! `nn.MultiheadAttention`, with PyTorch's parameter names, shapes, initial
//! values and mask conventions (the transformer layers built on it are in
//! `transformer.rs`).

use super::functional::dropout;
use super::{assign, cast_state, empty_parameter, fresh_parameter, move_parameter, Linear, Module};
use crate::{
    device::Device,
    dtype::DType,
    error::{Error, Result},
    tensor::Tensor,
};

/// The masks and options of one [`MultiheadAttention`] call (PyTorch's keyword
/// arguments, with its defaults).
#[derive(Clone, Copy)]
pub struct AttentionOptions<'a> {
    /// `[N, S]`: `true` (or `-inf`, for a float mask) at the keys to ignore
    /// (padding).
    pub key_padding_mask: Option<&'a Tensor>,
    /// `[L, S]` or `[N·heads, L, S]`: `true` where a query may NOT attend to a key,
    /// or a float mask added to the scores (PyTorch's convention, the opposite of
    /// [`scaled_dot_product_attention`](super::scaled_dot_product_attention)'s
    /// bool masks).
    pub attn_mask: Option<&'a Tensor>,
    /// Return the attention weights too (default `true`, as in PyTorch).
    pub need_weights: bool,
    /// Average the returned weights over the heads (default `true`).
    pub average_attn_weights: bool,
    /// A hint that `attn_mask` is the causal mask (it must then be given).
    pub is_causal: bool,
}

impl Default for AttentionOptions<'_> {
    fn default() -> Self {
        AttentionOptions {
            key_padding_mask: None,
            attn_mask: None,
            need_weights: true,
            average_attn_weights: true,
            is_causal: false,
        }
    }
}

/// A causal mask for [`MultiheadAttention`] and the transformer layers
/// (`nn.Transformer.generate_square_subsequent_mask`): `[size, size]` float32,
/// 0 on and below the diagonal, `-inf` above it.
pub fn square_subsequent_mask(size: usize, device: &Device) -> Result<Tensor> {
    let blocked = Tensor::triangle_mask(size, size, 1, false, device)?;
    Tensor::zeros([size, size], DType::F32, device)?.masked_fill(&blocked, f64::NEG_INFINITY)
}

/// Multi-head attention (`nn.MultiheadAttention`): `in_proj_weight [3E, E]`
/// (Xavier-uniform) and `in_proj_bias [3E]` (zeros) project query, key and value;
/// `out_proj` (`[E, E]` weight, zero bias) the concatenated heads. Inputs are
/// `[L, N, E]`, or `[N, L, E]` with `batch_first`, or unbatched `[L, E]`.
pub struct MultiheadAttention {
    pub in_proj_weight: Tensor,
    pub in_proj_bias: Option<Tensor>,
    pub out_proj: Linear,
    pub num_heads: usize,
    /// Dropout on the attention weights in training.
    pub dropout: f64,
    pub batch_first: bool,
    pub(super) training: bool,
}

impl MultiheadAttention {
    /// PyTorch's defaults: no dropout, biases, sequence-first inputs.
    pub fn new(embed_dim: usize, num_heads: usize, device: &Device) -> Result<Self> {
        Self::with_options(embed_dim, num_heads, 0.0, true, false, device)
    }

    pub fn with_options(
        embed_dim: usize,
        num_heads: usize,
        dropout: f64,
        bias: bool,
        batch_first: bool,
        device: &Device,
    ) -> Result<Self> {
        if num_heads == 0 || !embed_dim.is_multiple_of(num_heads) {
            return Err(Error::invalid(
                "MultiheadAttention",
                format!("embed_dim must be divisible by num_heads (embed_dim {embed_dim}, num_heads {num_heads})"),
            ));
        }
        if !(0.0..=1.0).contains(&dropout) {
            return Err(Error::invalid(
                "MultiheadAttention",
                format!("dropout probability has to be between 0 and 1, but got {dropout}"),
            ));
        }
        let e = embed_dim;
        // xavier_uniform_: bound sqrt(6 / (fan_in + fan_out)) for a [3E, E] matrix
        let bound = (6.0 / (4 * e).max(1) as f64).sqrt();
        let in_proj_weight = fresh_parameter(Tensor::uniform(
            -bound,
            bound,
            [3 * e, e],
            DType::F32,
            device,
        )?)?;
        let in_proj_bias = bias
            .then(|| fresh_parameter(Tensor::zeros([3 * e], DType::F32, device)?))
            .transpose()?;
        let out_proj = Linear::with_bias(e, e, bias, device)?;
        if let Some(b) = &out_proj.bias {
            assign(b, &b.zeros_like()?)?;
        }
        Ok(MultiheadAttention {
            in_proj_weight,
            in_proj_bias,
            out_proj,
            num_heads,
            dropout,
            batch_first,
            training: true,
        })
    }

    pub(super) fn embed_dim(&self) -> usize {
        self.in_proj_weight.shape()[1]
    }

    /// Attention of `query` over `key`/`value` (`mha(query, key, value, ...)`): the
    /// output, shaped like `query`, and with `need_weights` the attention weights
    /// `[N, L, S]` (averaged over heads) or `[N, heads, L, S]`.
    pub fn attend(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        opts: AttentionOptions,
    ) -> Result<(Tensor, Option<Tensor>)> {
        const OP: &str = "MultiheadAttention";
        let e = self.embed_dim();
        let h = self.num_heads;
        // (the fields are public: a changed head count is checked here)
        if h == 0 || !e.is_multiple_of(h) {
            return Err(Error::invalid(
                OP,
                format!(
                    "embed_dim ({e}) must be divisible by num_heads ({h}), which must be above 0"
                ),
            ));
        }
        let batched = query.rank() == 3;
        if !(batched || query.rank() == 2)
            || key.rank() != query.rank()
            || value.rank() != query.rank()
        {
            return Err(Error::invalid(
                OP,
                format!(
                    "query, key and value must all be 3-D (batched) or 2-D (unbatched), got {:?}, {:?} and {:?}",
                    query.shape(),
                    key.shape(),
                    value.shape()
                ),
            ));
        }
        // [N, L, E] whatever the layout
        let to_nle = |t: &Tensor| -> Result<Tensor> {
            match (batched, self.batch_first) {
                (false, _) => t.unsqueeze(0),
                (true, true) => Ok(t.clone()),
                (true, false) => t.transpose(0, 1),
            }
        };
        let (q, k, v) = (to_nle(query)?, to_nle(key)?, to_nle(value)?);
        for (t, what) in [(&q, "query"), (&k, "key"), (&v, "value")] {
            if t.shape()[2] != e {
                return Err(Error::shape(
                    OP,
                    t.shape(),
                    &[e],
                    format!(
                        "was expecting embedding dimension of {e}, but {what} has {}",
                        t.shape()[2]
                    ),
                ));
            }
        }
        let (n, l, s) = (q.shape()[0], q.shape()[1], k.shape()[1]);
        if k.shape()[0] != n || v.shape()[..2] != k.shape()[..2] {
            return Err(Error::shape(
                OP,
                key.shape(),
                value.shape(),
                format!(
                    "key shape {:?} does not match value shape {:?} (or the query's batch)",
                    key.shape(),
                    value.shape()
                ),
            ));
        }
        if opts.is_causal && opts.attn_mask.is_none() {
            return Err(Error::invalid(
                OP,
                "Need attn_mask if specifying the is_causal hint. You may use the Transformer module method `generate_square_subsequent_mask` to create this mask.",
            ));
        }
        let d = e / h;
        // under autocast the packed projection and its bias are cast here, whole
        // (each once per region), so that q, k and v come out in the lower
        // precision like the product that makes them
        let w = &crate::tensor::autocast::lower_one(&self.in_proj_weight)?;
        let b = self
            .in_proj_bias
            .as_ref()
            .map(crate::tensor::autocast::lower_one)
            .transpose()?;
        let b = b.as_ref();
        let attn_mask = match opts.attn_mask {
            None => None,
            Some(m) if m.shape() == [l, s] => Some(m.clone()),
            Some(m) if m.shape() == [n * h, l, s] => Some(m.reshape([n, h, l, s])?),
            Some(m) => {
                return Err(Error::shape(
                    OP,
                    m.shape(),
                    &[l, s],
                    format!(
                        "The shape of the attn_mask is {:?}, but should be ({l}, {s}) or ({}, {l}, {s}).",
                        m.shape(),
                        n * h
                    ),
                ))
            }
        };
        // [N, S]: an unbatched input's mask is 1-D, [S], as PyTorch wants it
        let key_padding_mask = match opts.key_padding_mask {
            None => None,
            Some(m) if batched && m.shape() == [n, s] => Some(m.clone()),
            Some(m) if !batched && m.shape() == [s] => Some(m.reshape([1, s])?),
            Some(m) => {
                let want: &[usize] = if batched { &[n, s] } else { &[s] };
                return Err(Error::shape(
                    OP,
                    m.shape(),
                    want,
                    format!(
                        "expected shape of key_padding_mask to be {want:?}, but got {:?}",
                        m.shape()
                    ),
                ));
            }
        };
        // masks hide where true (bool) or are added (floats): PyTorch takes no other
        for (m, what) in [
            (opts.attn_mask, "attn_mask"),
            (opts.key_padding_mask, "key_padding_mask"),
        ] {
            if let Some(m) = m.filter(|m| m.dtype() != DType::Bool && !m.dtype().is_float()) {
                return Err(Error::dtype(
                    OP,
                    m.dtype(),
                    format!("only bool and floating types of {what} are supported"),
                ));
            }
        }
        let scale = 1.0 / (d as f64).sqrt();
        let p = if self.training { self.dropout } else { 0.0 };
        // the projections as PyTorch's module makes them: where the fused op
        // runs, one product with the packed weight where query, key and value
        // are one input (`query is key is value`), and one for the keys and
        // values where those are one (`key is value`); each made as its input
        // lies (sequence first or not) and seen batch first, `[N, T, parts, H,
        // D]` (one part: `[N, H, T, D]`), whose parts are views (the fused op
        // takes the whole projection; elsewhere a part's gradient would be a
        // zero-filled projection)
        let project = |x: &Tensor, from: usize, parts: usize| -> Result<Tensor> {
            let (at, len) = ((from * e) as i64, parts * e);
            // the whole weight as it is: a narrowed one fills its gradient
            let y = if parts == 3 {
                crate::nn::functional::linear(x, w, b)?
            } else {
                let wp = w.narrow(0, at, len)?;
                let bp = b.map(|b| b.narrow(0, at, len)).transpose()?;
                crate::nn::functional::linear(x, &wp, bp.as_ref())?
            };
            let y = to_nle(&y)?;
            let t = y.shape()[1];
            // one part's heads as [N, H, T, D] (reshaped: a selected part
            // would fill its gradient)
            match parts {
                1 => y.reshape([n, t, h, d])?.transpose(1, 2),
                _ => y.reshape([n, t, parts, h, d]),
            }
        };
        // part `i` of a projection as [N, H, T, D]
        let heads_of = |p5: &Tensor, i: i64| p5.select(2, i)?.transpose(1, 2);
        let one = |x: &Tensor, from: usize| project(x, from, 1);
        // q, k and v as the projections will make them (dtype, device, shape):
        // zero-stride views of one element of the weight, so that the fused
        // op's choice comes before the projections
        let stand_in = |rows: usize| -> Result<Option<Tensor>> {
            if w.numel() == 0 {
                return Ok(None);
            }
            let one = w.detach().narrow(0, 0, 1)?.narrow(1, 0, 1)?;
            Ok(Some(one.reshape([1, 1, 1, 1])?.expand([n, h, rows, d])?))
        };
        let apart = || -> Result<(Tensor, Tensor, Tensor)> {
            Ok((one(query, 0)?, one(key, 1)?, one(value, 2)?))
        };
        let (heads, weights) = if !opts.need_weights {
            // PyTorch's path without weights: attention over the masks as additive
            // biases (MultiheadAttention's masks hide where they are true), so
            // that a query they leave with no key gets zeros, as there
            let kpm = key_padding_mask
                .as_ref()
                .map(|m| m.reshape([n, 1, 1, s]))
                .transpose()?;
            // each mask as an additive bias, once
            let as_bias = |m: &Tensor| -> Result<Tensor> {
                crate::nn::functional::mask_bias(m, true, w.dtype())?.to_dtype(w.dtype())
            };
            // the `is_causal` hint says `attn_mask` is the causal mask, which the
            // fused op applies without reading it: then the mask is made a bias
            // only where another path takes it
            let causal = opts.is_causal && attn_mask.is_some();
            let attn_bias = if causal {
                None
            } else {
                attn_mask.as_ref().map(as_bias).transpose()?
            };
            let kpm_bias = kpm.as_ref().map(as_bias).transpose()?;
            let read_by_fused = [attn_bias.as_ref(), kpm_bias.as_ref()];
            let all = || -> Result<Vec<Tensor>> {
                let attn_bias = match &attn_bias {
                    Some(b) => Some(b.clone()),
                    None => attn_mask.as_ref().map(as_bias).transpose()?,
                };
                Ok([attn_bias, kpm_bias.clone()]
                    .into_iter()
                    .flatten()
                    .collect())
            };
            let why = match (stand_in(l)?, stand_in(s)?) {
                (Some(ql), Some(kl)) => {
                    if read_by_fused
                        .iter()
                        .all(|b| crate::nn::functional::fused_mask_fits(*b, &ql, s))
                    {
                        crate::nn::functional::fused_attention_refusal(&ql, &kl, &kl, p)
                    } else {
                        Some("a mask it does not take".into())
                    }
                }
                _ => Some("an empty operand".into()),
            };
            let packing = if why.is_some() {
                Packing::Apart
            } else if query.is(key) && key.is(value) {
                Packing::Qkv(project(query, 0, 3)?)
            } else if key.is(value) {
                Packing::Kv(one(query, 0)?, project(key, 1, 2)?)
            } else {
                Packing::Apart
            };
            let (qh, kh, vh) = match &packing {
                Packing::Qkv(p5) => (heads_of(p5, 0)?, heads_of(p5, 1)?, heads_of(p5, 2)?),
                Packing::Kv(qh, kv5) => (qh.clone(), heads_of(kv5, 0)?, heads_of(kv5, 1)?),
                Packing::Apart => apart()?,
            };
            let heads = if why.is_none() {
                // one bias: with both masks their sum, [N, 1, L, S]
                let bias = sum_of(read_by_fused.into_iter().flatten().cloned().collect())?;
                let path = if causal { "fused, causal" } else { "fused" };
                crate::nn::functional::log_attention_path(&qh, s, path, None);
                let opts = (scale, causal, p);
                match &packing {
                    Packing::Qkv(p5) => p5.fused_attention_packed(bias.as_ref(), opts)?,
                    Packing::Kv(qh, kv5) => {
                        qh.fused_attention_kv_packed(kv5, bias.as_ref(), opts)?
                    }
                    Packing::Apart => qh.fused_attention(&kh, &vh, bias.as_ref(), opts)?,
                }
            } else if let Some(o) = crate::nn::functional::attention_saving_memory(
                &qh, &kh, &vh,
                // each mask added to each group of scores where it lies (the key
                // padding mask is not widened)
                all, scale, p,
            )? {
                let w = why.as_deref();
                crate::nn::functional::log_attention_path(&qh, s, "memory-saving", w);
                o
            } else {
                crate::nn::functional::scaled_dot_product_attention(
                    &qh,
                    &kh,
                    &vh,
                    sum_of(all()?)?.as_ref(),
                    p,
                    false,
                    Some(scale),
                )?
            };
            (heads, None)
        } else {
            // the weights asked for: materialised (a query the masks leave with no
            // key gets NaN weights, as softmax gives in PyTorch here)
            // scaling the queries ([N, H, L, D]) costs less than scaling the scores
            let (qh, kh, vh) = apart()?;
            crate::nn::functional::log_attention_path(&qh, s, "plain", Some("weights asked for"));
            let mut scores = qh.mul(scale)?.matmul(&kh.transpose(2, 3)?)?;
            if let Some(m) = &attn_mask {
                scores = add_mask(&scores, m)?;
            }
            if let Some(m) = &key_padding_mask {
                scores = add_mask(&scores, &m.reshape([n, 1, 1, s])?)?;
            }
            // the weights returned are the ones applied: after dropout, as PyTorch's
            let weights = scores.softmax(-1)?;
            let weights = dropout(&weights, self.dropout, self.training)?;
            (weights.matmul(&vh)?, Some(weights))
        };
        let out = heads.transpose(1, 2)?.reshape([n, l, e])?;
        let out = self.out_proj.forward(&out)?;
        let out = match (batched, self.batch_first) {
            (false, _) => out.squeeze(0)?,
            (true, true) => out,
            (true, false) => out.transpose(0, 1)?,
        };
        let weights = match weights {
            Some(w) if opts.need_weights => {
                let w = if opts.average_attn_weights {
                    w.mean(1, false)?
                } else {
                    w
                };
                Some(if batched { w } else { w.squeeze(0)? })
            }
            _ => None,
        };
        Ok((out, weights))
    }
}

/// How `MultiheadAttention::attend` projected its inputs: apart, all three
/// with the packed weight (`[N, L, 3, H, D]`), or the queries apart (`[N, H,
/// L, D]`) and the keys and values together (`[N, S, 2, H, D]`).
enum Packing {
    Apart,
    Qkv(Tensor),
    Kv(Tensor, Tensor),
}

/// The sum of additive biases (`None` for none).
fn sum_of(biases: Vec<Tensor>) -> Result<Option<Tensor>> {
    let mut sum: Option<Tensor> = None;
    for b in biases {
        sum = Some(match sum {
            Some(a) => a.add(&b)?,
            None => b,
        });
    }
    Ok(sum)
}

/// `scores` with a mask: a bool mask sets `-inf` where it is true, a float mask is
/// added.
fn add_mask(scores: &Tensor, m: &Tensor) -> Result<Tensor> {
    if m.dtype() == DType::Bool {
        scores.masked_fill(m, f64::NEG_INFINITY)
    } else {
        scores.add(m)
    }
}

/// Self-attention: `attend(x, x, x)` without the weights.
impl Module for MultiheadAttention {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let opts = AttentionOptions {
            need_weights: false,
            ..Default::default()
        };
        Ok(self.attend(x, x, x, opts)?.0)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = vec![("in_proj_weight".to_string(), self.in_proj_weight.clone())];
        if let Some(b) = &self.in_proj_bias {
            v.push(("in_proj_bias".to_string(), b.clone()));
        }
        v.extend(
            self.out_proj
                .named_parameters()
                .into_iter()
                .map(|(n, t)| (format!("out_proj.{n}"), t)),
        );
        v
    }

    fn to_device(&mut self, device: &Device) -> Result<()> {
        self.in_proj_weight = move_parameter(&self.in_proj_weight, device)?;
        if let Some(b) = &self.in_proj_bias {
            self.in_proj_bias = Some(move_parameter(b, device)?);
        }
        self.out_proj.to_device(device)
    }

    fn to_empty(&mut self, device: &Device) -> Result<()> {
        self.in_proj_weight = empty_parameter(&self.in_proj_weight, device)?;
        if let Some(b) = &self.in_proj_bias {
            self.in_proj_bias = Some(empty_parameter(b, device)?);
        }
        self.out_proj.to_empty(device)
    }

    fn to_dtype(&mut self, dtype: DType) -> Result<()> {
        self.in_proj_weight = cast_state(&self.in_proj_weight, dtype)?;
        if let Some(b) = &self.in_proj_bias {
            self.in_proj_bias = Some(cast_state(b, dtype)?);
        }
        self.out_proj.to_dtype(dtype)
    }

    fn reset_parameters(&mut self) -> Result<()> {
        let w = &self.in_proj_weight;
        let bound = (6.0 / (w.shape()[0] + w.shape()[1]).max(1) as f64).sqrt();
        assign(
            w,
            &Tensor::uniform(-bound, bound, w.shape(), w.dtype(), &w.device())?,
        )?;
        self.out_proj.reset_parameters()?;
        for b in [self.in_proj_bias.as_ref(), self.out_proj.bias.as_ref()]
            .into_iter()
            .flatten()
        {
            assign(b, &b.zeros_like()?)?;
        }
        Ok(())
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }
}
