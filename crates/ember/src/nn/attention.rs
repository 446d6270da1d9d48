//! `nn.MultiheadAttention`, `nn.TransformerEncoderLayer`, `nn.TransformerEncoder`
//! and `nn.TransformerDecoderLayer`, with PyTorch's parameter names, shapes,
//! initial values and mask conventions.

use super::functional::dropout;
use super::{
    assign, cast_state, empty_parameter, fresh_parameter, move_parameter, LayerNorm, Linear, Module,
};
use crate::{DType, Device, Error, Result, Tensor};

/// Module methods of a module made only of named children.
macro_rules! children_module {
    ($t:ty, |$s:ident| [$($name:literal => $field:expr),* $(,)?]) => {
        impl $t {
            fn children(&self) -> Vec<(String, &dyn Module)> {
                let $s = self;
                vec![$(($name.to_string(), &$field as &dyn Module)),*]
            }
            fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
                let $s = self;
                vec![$(($name.to_string(), &mut $field as &mut dyn Module)),*]
            }
        }
    };
}

/// The `Module` methods that only visit children (all but `forward`).
macro_rules! delegate_to_children {
    () => {
        fn named_parameters(&self) -> Vec<(String, Tensor)> {
            prefixed(self.children(), |m| m.named_parameters())
        }
        fn named_buffers(&self) -> Vec<(String, Tensor)> {
            prefixed(self.children(), |m| m.named_buffers())
        }
        fn to_device(&mut self, device: &Device) -> Result<()> {
            self.children_mut()
                .into_iter()
                .try_for_each(|(_, m)| m.to_device(device))
        }
        fn to_empty(&mut self, device: &Device) -> Result<()> {
            self.children_mut()
                .into_iter()
                .try_for_each(|(_, m)| m.to_empty(device))
        }
        fn to_dtype(&mut self, dtype: DType) -> Result<()> {
            self.children_mut()
                .into_iter()
                .try_for_each(|(_, m)| m.to_dtype(dtype))
        }
        fn reset_parameters(&mut self) -> Result<()> {
            self.children_mut()
                .into_iter()
                .try_for_each(|(_, m)| m.reset_parameters())
        }
        fn set_training(&mut self, training: bool) {
            self.training = training;
            self.children_mut()
                .into_iter()
                .for_each(|(_, m)| m.set_training(training));
        }
    };
}

fn prefixed(
    children: Vec<(String, &dyn Module)>,
    f: impl Fn(&dyn Module) -> Vec<(String, Tensor)>,
) -> Vec<(String, Tensor)> {
    children
        .into_iter()
        .flat_map(|(c, m)| f(m).into_iter().map(move |(n, t)| (format!("{c}.{n}"), t)))
        .collect()
}

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
    let blocked = Tensor::ones([size, size], DType::Bool, device)?.triu(1)?;
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
    training: bool,
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
        let bound = (6.0 / (4 * e) as f64).sqrt();
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

    fn embed_dim(&self) -> usize {
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
        let project = |x: &Tensor, i: i64| -> Result<Tensor> {
            let y = x.matmul(&w.narrow(0, i * e as i64, e)?.t()?)?;
            let y = match b {
                Some(b) => y.add(&b.narrow(0, i * e as i64, e)?)?,
                None => y,
            };
            // [N, T, E] -> [N, H, T, D]
            let t = y.shape()[1];
            y.reshape([n, t, h, d])?.transpose(1, 2)
        };
        let (qh, kh, vh) = (project(&q, 0)?, project(&k, 1)?, project(&v, 2)?);
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
        if let Some(m) = opts.key_padding_mask {
            if m.shape() != [n, s] {
                return Err(Error::shape(
                    OP,
                    m.shape(),
                    &[n, s],
                    format!(
                        "expected shape of key_padding_mask to be [{n}, {s}], but got {:?}",
                        m.shape()
                    ),
                ));
            }
        }
        let scale = 1.0 / (d as f64).sqrt();
        let p = if self.training { self.dropout } else { 0.0 };
        // the fused op: no weights asked for, no mask but the causal one (the
        // `is_causal` hint says `attn_mask` is it, as in PyTorch)
        let causal = opts.is_causal && attn_mask.is_some();
        let fused = !opts.need_weights
            && opts.key_padding_mask.is_none()
            && (attn_mask.is_none() || causal)
            && crate::nn::functional::fused_attention_applies(&qh, &kh, &vh, p);
        let saving = if fused {
            Some(qh.fused_attention(&kh, &vh, scale, causal)?)
        } else if !opts.need_weights {
            // no weights asked for: the path that keeps no [L, S] weights for
            // backward (a masked-out row gives NaN, as softmax does here), where it
            // applies
            let biases = || -> Result<Vec<Tensor>> {
                let mut v = Vec::new();
                if let Some(m) = &attn_mask {
                    v.push(crate::nn::functional::mask_bias(m, true, qh.dtype())?);
                }
                if let Some(m) = opts.key_padding_mask {
                    let m = m.reshape([n, 1, 1, s])?;
                    v.push(crate::nn::functional::mask_bias(&m, true, qh.dtype())?);
                }
                Ok(v)
            };
            crate::nn::functional::attention_saving_memory(&qh, &kh, &vh, biases, scale, false, p)?
        } else {
            None
        };
        let (heads, weights) = match saving {
            Some(o) => (o, None),
            None => {
                // scaling the queries ([N, H, L, D]) costs less than scaling the scores
                let mut scores = qh.mul(scale)?.matmul(&kh.transpose(2, 3)?)?;
                if let Some(m) = &attn_mask {
                    scores = add_mask(&scores, m)?;
                }
                if let Some(m) = opts.key_padding_mask {
                    scores = add_mask(&scores, &m.reshape([n, 1, 1, s])?)?;
                }
                let weights = scores.softmax(-1)?;
                let dropped = dropout(&weights, self.dropout, self.training)?;
                (dropped.matmul(&vh)?, Some(weights))
            }
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
        let bound = (6.0 / (w.shape()[0] + w.shape()[1]) as f64).sqrt();
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

/// The feed-forward activation of the transformer layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Activation {
    #[default]
    Relu,
    Gelu,
    /// GELU with the tanh approximation (`F.gelu(x, approximate="tanh")`, GPT-2's
    /// `gelu_new`).
    GeluTanh,
}

/// The settings of [`TransformerEncoderLayer`] and [`TransformerDecoderLayer`]
/// (PyTorch's keyword arguments and defaults).
#[derive(Clone, Copy, Debug)]
pub struct TransformerOptions {
    pub dim_feedforward: usize,
    pub dropout: f64,
    pub activation: Activation,
    pub layer_norm_eps: f64,
    pub batch_first: bool,
    /// Normalise before each block (pre-LN) instead of after it.
    pub norm_first: bool,
    pub bias: bool,
}

impl Default for TransformerOptions {
    fn default() -> Self {
        TransformerOptions {
            dim_feedforward: 2048,
            dropout: 0.1,
            activation: Activation::Relu,
            layer_norm_eps: 1e-5,
            batch_first: false,
            norm_first: false,
            bias: true,
        }
    }
}

/// The two-layer feed-forward block: `linear2(dropout(act(linear1(x))))`.
fn feed_forward(
    l1: &Linear,
    l2: &Linear,
    x: &Tensor,
    act: Activation,
    p: f64,
    training: bool,
) -> Result<Tensor> {
    let h = {
        let _s = crate::meta::enter_module("linear1");
        l1.forward(x)?
    };
    let h = match act {
        Activation::Relu => h.relu()?,
        Activation::Gelu => h.gelu()?,
        Activation::GeluTanh => h.gelu_tanh()?,
    };
    let h = dropout(&h, p, training)?;
    let _s = crate::meta::enter_module("linear2");
    l2.forward(&h)
}

/// One transformer encoder layer (`nn.TransformerEncoderLayer`): self-attention
/// and a feed-forward block, each with dropout, a residual connection and layer
/// normalisation (after the block, or before it with `norm_first`).
pub struct TransformerEncoderLayer {
    pub self_attn: MultiheadAttention,
    pub linear1: Linear,
    pub linear2: Linear,
    pub norm1: LayerNorm,
    pub norm2: LayerNorm,
    pub options: TransformerOptions,
    training: bool,
}

children_module!(TransformerEncoderLayer, |s| [
    "self_attn" => s.self_attn,
    "linear1" => s.linear1,
    "linear2" => s.linear2,
    "norm1" => s.norm1,
    "norm2" => s.norm2,
]);

impl TransformerEncoderLayer {
    pub fn new(
        d_model: usize,
        nhead: usize,
        options: TransformerOptions,
        device: &Device,
    ) -> Result<Self> {
        let o = options;
        Ok(TransformerEncoderLayer {
            self_attn: MultiheadAttention::with_options(
                d_model,
                nhead,
                o.dropout,
                o.bias,
                o.batch_first,
                device,
            )?,
            linear1: Linear::with_bias(d_model, o.dim_feedforward, o.bias, device)?,
            linear2: Linear::with_bias(o.dim_feedforward, d_model, o.bias, device)?,
            norm1: LayerNorm::with_options(&[d_model], o.layer_norm_eps, true, o.bias, device)?,
            norm2: LayerNorm::with_options(&[d_model], o.layer_norm_eps, true, o.bias, device)?,
            options,
            training: true,
        })
    }

    /// The layer with a source mask (`[L, L]`, PyTorch's convention: `true` or
    /// `-inf` where attention is not allowed) and a key padding mask (`[N, L]`).
    pub fn forward_masked(
        &self,
        src: &Tensor,
        src_mask: Option<&Tensor>,
        src_key_padding_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        self.forward_with(src, src_mask, src_key_padding_mask, false)
    }

    /// [`forward_masked`](Self::forward_masked) with PyTorch's `is_causal` hint:
    /// `true` says that `src_mask` is the causal mask, so that attention may apply
    /// it without reading it (the fused kernel's causal mode). `src_mask` is still
    /// needed, as in PyTorch.
    pub fn forward_with(
        &self,
        src: &Tensor,
        src_mask: Option<&Tensor>,
        src_key_padding_mask: Option<&Tensor>,
        is_causal: bool,
    ) -> Result<Tensor> {
        let o = &self.options;
        let p = if self.training { o.dropout } else { 0.0 };
        let sa = |x: &Tensor| -> Result<Tensor> {
            let opts = AttentionOptions {
                key_padding_mask: src_key_padding_mask,
                attn_mask: src_mask,
                need_weights: false,
                is_causal,
                ..Default::default()
            };
            let a = {
                let _s = crate::meta::enter_module("self_attn");
                self.self_attn.attend(x, x, x, opts)?.0
            };
            dropout(&a, p, self.training)
        };
        let norm = |which: &str, n: &LayerNorm, x: &Tensor| -> Result<Tensor> {
            let _s = crate::meta::enter_module(which);
            n.forward(x)
        };
        let ff = |x: &Tensor| -> Result<Tensor> {
            let y = feed_forward(
                &self.linear1,
                &self.linear2,
                x,
                o.activation,
                p,
                self.training,
            )?;
            dropout(&y, p, self.training)
        };
        if o.norm_first {
            let x = src.add(&sa(&norm("norm1", &self.norm1, src)?)?)?;
            x.add(&ff(&norm("norm2", &self.norm2, &x)?)?)
        } else {
            let x = norm("norm1", &self.norm1, &src.add(&sa(src)?)?)?;
            norm("norm2", &self.norm2, &x.add(&ff(&x)?)?)
        }
    }
}

impl Module for TransformerEncoderLayer {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_masked(x, None, None)
    }
    delegate_to_children!();
}

/// A stack of encoder layers (`nn.TransformerEncoder`), `layers.0` … `layers.{n-1}`,
/// each starting as a copy of the given layer (as PyTorch's deep copies), and an
/// optional final normalisation `norm`.
pub struct TransformerEncoder {
    pub layers: Vec<TransformerEncoderLayer>,
    pub norm: Option<LayerNorm>,
    training: bool,
}

impl TransformerEncoder {
    pub fn new(
        layer: TransformerEncoderLayer,
        num_layers: usize,
        norm: Option<LayerNorm>,
    ) -> Result<Self> {
        let mut layers = Vec::with_capacity(num_layers);
        for _ in 1..num_layers {
            layers.push(copy_encoder_layer(&layer)?);
        }
        if num_layers > 0 {
            layers.push(layer);
        }
        Ok(TransformerEncoder {
            layers,
            norm,
            training: true,
        })
    }

    fn children(&self) -> Vec<(String, &dyn Module)> {
        let mut v: Vec<(String, &dyn Module)> = self
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| (format!("layers.{i}"), l as &dyn Module))
            .collect();
        if let Some(n) = &self.norm {
            v.push(("norm".into(), n));
        }
        v
    }

    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        let mut v: Vec<(String, &mut dyn Module)> = self
            .layers
            .iter_mut()
            .enumerate()
            .map(|(i, l)| (format!("layers.{i}"), l as &mut dyn Module))
            .collect();
        if let Some(n) = &mut self.norm {
            v.push(("norm".into(), n));
        }
        v
    }

    /// The stack with a source mask and a key padding mask, passed to every layer.
    pub fn forward_masked(
        &self,
        src: &Tensor,
        mask: Option<&Tensor>,
        src_key_padding_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        self.forward_with(src, mask, src_key_padding_mask, false)
    }

    /// [`forward_masked`](Self::forward_masked) with PyTorch's `is_causal` hint
    /// (see [`TransformerEncoderLayer::forward_with`]).
    pub fn forward_with(
        &self,
        src: &Tensor,
        mask: Option<&Tensor>,
        src_key_padding_mask: Option<&Tensor>,
        is_causal: bool,
    ) -> Result<Tensor> {
        if is_causal && mask.is_none() {
            return Err(Error::invalid(
                "TransformerEncoder",
                "is_causal needs the causal mask as mask (PyTorch's convention)",
            ));
        }
        let mut x = src.clone();
        for (i, layer) in self.layers.iter().enumerate() {
            let _s = crate::meta::enter_module(format_args!("layers.{i}"));
            x = layer.forward_with(&x, mask, src_key_padding_mask, is_causal)?;
        }
        match &self.norm {
            Some(n) => n.forward(&x),
            None => Ok(x),
        }
    }
}

impl Module for TransformerEncoder {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_masked(x, None, None)
    }
    delegate_to_children!();
}

/// A layer with the same settings and a copy of `layer`'s parameters.
fn copy_encoder_layer(layer: &TransformerEncoderLayer) -> Result<TransformerEncoderLayer> {
    let e = layer.self_attn.embed_dim();
    let dev = layer.self_attn.in_proj_weight.device();
    let mut copy = TransformerEncoderLayer::new(e, layer.self_attn.num_heads, layer.options, &dev)?;
    copy_state(layer, &mut copy)?;
    copy.training = layer.training;
    Ok(copy)
}

/// `to`'s parameters made copies of `from`'s (same names and shapes).
fn copy_state(from: &dyn Module, to: &mut dyn Module) -> Result<()> {
    for ((_, src), (_, dst)) in from.named_parameters().iter().zip(to.named_parameters()) {
        crate::no_grad(|| dst.copy_(src))?;
    }
    Ok(())
}

/// One transformer decoder layer (`nn.TransformerDecoderLayer`): self-attention
/// over the target, attention over the encoder's output (`memory`), and a
/// feed-forward block, each with dropout, a residual and layer normalisation.
pub struct TransformerDecoderLayer {
    pub self_attn: MultiheadAttention,
    pub multihead_attn: MultiheadAttention,
    pub linear1: Linear,
    pub linear2: Linear,
    pub norm1: LayerNorm,
    pub norm2: LayerNorm,
    pub norm3: LayerNorm,
    pub options: TransformerOptions,
    training: bool,
}

children_module!(TransformerDecoderLayer, |s| [
    "self_attn" => s.self_attn,
    "multihead_attn" => s.multihead_attn,
    "linear1" => s.linear1,
    "linear2" => s.linear2,
    "norm1" => s.norm1,
    "norm2" => s.norm2,
    "norm3" => s.norm3,
]);

/// The masks of [`TransformerDecoderLayer::decode`] (PyTorch's conventions).
#[derive(Clone, Copy, Default)]
pub struct DecoderMasks<'a> {
    pub tgt_mask: Option<&'a Tensor>,
    pub memory_mask: Option<&'a Tensor>,
    pub tgt_key_padding_mask: Option<&'a Tensor>,
    pub memory_key_padding_mask: Option<&'a Tensor>,
}

impl TransformerDecoderLayer {
    pub fn new(
        d_model: usize,
        nhead: usize,
        options: TransformerOptions,
        device: &Device,
    ) -> Result<Self> {
        let o = options;
        let mha = || {
            MultiheadAttention::with_options(
                d_model,
                nhead,
                o.dropout,
                o.bias,
                o.batch_first,
                device,
            )
        };
        let norm = || LayerNorm::with_options(&[d_model], o.layer_norm_eps, true, o.bias, device);
        Ok(TransformerDecoderLayer {
            self_attn: mha()?,
            multihead_attn: mha()?,
            linear1: Linear::with_bias(d_model, o.dim_feedforward, o.bias, device)?,
            linear2: Linear::with_bias(o.dim_feedforward, d_model, o.bias, device)?,
            norm1: norm()?,
            norm2: norm()?,
            norm3: norm()?,
            options,
            training: true,
        })
    }

    /// The layer on target `tgt` attending to `memory`.
    pub fn decode(&self, tgt: &Tensor, memory: &Tensor, masks: DecoderMasks) -> Result<Tensor> {
        let o = &self.options;
        let p = if self.training { o.dropout } else { 0.0 };
        let t = self.training;
        let sa = |x: &Tensor| -> Result<Tensor> {
            let opts = AttentionOptions {
                key_padding_mask: masks.tgt_key_padding_mask,
                attn_mask: masks.tgt_mask,
                need_weights: false,
                ..Default::default()
            };
            dropout(&self.self_attn.attend(x, x, x, opts)?.0, p, t)
        };
        let mha = |x: &Tensor| -> Result<Tensor> {
            let opts = AttentionOptions {
                key_padding_mask: masks.memory_key_padding_mask,
                attn_mask: masks.memory_mask,
                need_weights: false,
                ..Default::default()
            };
            dropout(
                &self.multihead_attn.attend(x, memory, memory, opts)?.0,
                p,
                t,
            )
        };
        let ff = |x: &Tensor| -> Result<Tensor> {
            dropout(
                &feed_forward(&self.linear1, &self.linear2, x, o.activation, p, t)?,
                p,
                t,
            )
        };
        if o.norm_first {
            let x = tgt.add(&sa(&self.norm1.forward(tgt)?)?)?;
            let x = x.add(&mha(&self.norm2.forward(&x)?)?)?;
            x.add(&ff(&self.norm3.forward(&x)?)?)
        } else {
            let x = self.norm1.forward(&tgt.add(&sa(tgt)?)?)?;
            let x = self.norm2.forward(&x.add(&mha(&x)?)?)?;
            self.norm3.forward(&x.add(&ff(&x)?)?)
        }
    }
}

/// The decoder layer over its own input as the memory too (a decoder-only
/// model uses [`TransformerEncoderLayer`] with a causal mask instead).
impl Module for TransformerDecoderLayer {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.decode(x, x, DecoderMasks::default())
    }
    delegate_to_children!();
}
