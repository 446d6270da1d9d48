//! `nn.TransformerEncoderLayer`, `nn.TransformerEncoder` and
//! `nn.TransformerDecoderLayer` over [`MultiheadAttention`], with PyTorch's
//! parameter names, shapes, initial values and mask conventions (the decoder
//! stack and the full model are in `transformer_model.rs`).

use super::attention::{AttentionOptions, MultiheadAttention};
use super::functional::dropout;
use super::{LayerNorm, Linear, Module};
use crate::{
    device::Device,
    error::{Error, Result},
    tensor::Tensor,
};

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
    let h = super::in_module("linear1", || l1.forward(x))?;
    let h = match act {
        Activation::Relu => h.relu()?,
        Activation::Gelu => h.gelu()?,
        Activation::GeluTanh => h.gelu_tanh()?,
    };
    let h = dropout(&h, p, training)?;
    super::in_module("linear2", || l2.forward(&h))
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
            let a = super::in_module("self_attn", || Ok(self.self_attn.attend(x, x, x, opts)?.0))?;
            dropout(&a, p, self.training)
        };
        let norm = |which: &str, n: &LayerNorm, x: &Tensor| -> Result<Tensor> {
            super::in_module(which, || n.forward(x))
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
    super::delegate_to_children!(own training);
}

/// The children of a stack of layers: `layers.0` … `layers.{n-1}`, then the
/// final `norm` where there is one (the encoder's and decoder's names).
pub(super) fn stack_children<'a, L: Module>(
    layers: &'a [L],
    norm: Option<&'a LayerNorm>,
) -> Vec<(String, &'a dyn Module)> {
    let mut v: Vec<(String, &dyn Module)> = layers
        .iter()
        .enumerate()
        .map(|(i, l)| (format!("layers.{i}"), l as &dyn Module))
        .collect();
    v.extend(norm.map(|n| ("norm".to_string(), n as &dyn Module)));
    v
}

/// [`stack_children`], mutable.
pub(super) fn stack_children_mut<'a, L: Module>(
    layers: &'a mut [L],
    norm: Option<&'a mut LayerNorm>,
) -> Vec<(String, &'a mut dyn Module)> {
    let mut v: Vec<(String, &mut dyn Module)> = layers
        .iter_mut()
        .enumerate()
        .map(|(i, l)| (format!("layers.{i}"), l as &mut dyn Module))
        .collect();
    v.extend(norm.map(|n| ("norm".to_string(), n as &mut dyn Module)));
    v
}

/// A stack of encoder layers (`nn.TransformerEncoder`), `layers.0` … `layers.{n-1}`,
/// each starting as a copy of the given layer (as PyTorch's deep copies), and an
/// optional final normalisation `norm`.
pub struct TransformerEncoder {
    pub layers: Vec<TransformerEncoderLayer>,
    pub norm: Option<LayerNorm>,
    training: bool,
    checkpoint: bool,
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
            checkpoint: false,
        })
    }

    /// Runs each layer as an activation checkpoint ([`checkpoint`](super::checkpoint))
    /// when `on` (Hugging Face's `gradient_checkpointing_enable`): a training
    /// step then holds each layer's input instead of its activations, and
    /// backward runs every layer's forward pass again. Gradients are unchanged.
    pub fn checkpoint_layers(&mut self, on: bool) {
        self.checkpoint = on;
    }

    /// Whether the layers run as activation checkpoints.
    pub fn checkpoints_layers(&self) -> bool {
        self.checkpoint
    }

    fn children(&self) -> Vec<(String, &dyn Module)> {
        stack_children(&self.layers, self.norm.as_ref())
    }

    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        stack_children_mut(&mut self.layers, self.norm.as_mut())
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
            // (PyTorch's attention refuses it with these words)
            return Err(Error::invalid(
                "TransformerEncoder",
                "Need attn_mask if specifying the is_causal hint. You may use the Transformer module method `generate_square_subsequent_mask` to create this mask.",
            ));
        }
        let mut x = src.clone();
        for (i, layer) in self.layers.iter().enumerate() {
            // the previous output moves in, so that it drops inside the layer's
            // scope, as the layer's own temporaries do
            x = super::in_module(format_args!("layers.{i}"), move || {
                if !self.checkpoint {
                    return layer.forward_with(&x, mask, src_key_padding_mask, is_causal);
                }
                // the recomputation runs a copy of the layer that shares its
                // parameters, and the masks (constants) it was given
                let shared = copy_encoder_layer_with(layer, |t| Ok(t.clone()))?;
                let (mask, padding) = (mask.cloned(), src_key_padding_mask.cloned());
                super::checkpoint(
                    move |xs| {
                        shared.forward_with(&xs[0], mask.as_ref(), padding.as_ref(), is_causal)
                    },
                    &[&x],
                    &layer.parameters(),
                )
            })?;
        }
        match &self.norm {
            Some(n) => super::in_module("norm", move || n.forward(&x)),
            None => Ok(x),
        }
    }
}

impl Module for TransformerEncoder {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_masked(x, None, None)
    }
    super::delegate_to_children!(own training);
}

/// A copy of parameter `t` (its dtype, device and `requires_grad`), made
/// outside the graph.
fn dup(t: &Tensor) -> Result<Tensor> {
    crate::autograd::no_grad(|| t.copy())?.requires_grad_(t.requires_grad())
}

fn dup_opt(t: &Option<Tensor>, f: Dup) -> Result<Option<Tensor>> {
    t.as_ref().map(f).transpose()
}

/// How a layer copy gets each parameter: [`dup`] (a deep copy) or a handle
/// on the same tensor.
type Dup = fn(&Tensor) -> Result<Tensor>;

fn dup_linear(l: &Linear, f: Dup) -> Result<Linear> {
    Ok(Linear {
        weight: f(&l.weight)?,
        bias: dup_opt(&l.bias, f)?,
    })
}

fn dup_norm(n: &LayerNorm, f: Dup) -> Result<LayerNorm> {
    Ok(LayerNorm {
        weight: dup_opt(&n.weight, f)?,
        bias: dup_opt(&n.bias, f)?,
        normalized_shape: n.normalized_shape.clone(),
        eps: n.eps,
    })
}

fn dup_attention(a: &MultiheadAttention, f: Dup) -> Result<MultiheadAttention> {
    Ok(MultiheadAttention {
        in_proj_weight: f(&a.in_proj_weight)?,
        in_proj_bias: dup_opt(&a.in_proj_bias, f)?,
        out_proj: dup_linear(&a.out_proj, f)?,
        num_heads: a.num_heads,
        dropout: a.dropout,
        batch_first: a.batch_first,
        training: a.training,
    })
}

/// A deep copy of `layer` (PyTorch's `copy.deepcopy`, which `TransformerEncoder`
/// makes of its layer): every parameter copied with its own dtype, device and
/// `requires_grad`, the settings and training flags as they are; nothing drawn
/// from the random generator.
fn copy_encoder_layer(layer: &TransformerEncoderLayer) -> Result<TransformerEncoderLayer> {
    copy_encoder_layer_with(layer, dup)
}

/// A copy of `layer` whose parameters each come from `f`.
fn copy_encoder_layer_with(
    layer: &TransformerEncoderLayer,
    f: Dup,
) -> Result<TransformerEncoderLayer> {
    Ok(TransformerEncoderLayer {
        self_attn: dup_attention(&layer.self_attn, f)?,
        linear1: dup_linear(&layer.linear1, f)?,
        linear2: dup_linear(&layer.linear2, f)?,
        norm1: dup_norm(&layer.norm1, f)?,
        norm2: dup_norm(&layer.norm2, f)?,
        options: layer.options,
        training: layer.training,
    })
}

/// A deep copy of a decoder layer, as [`copy_encoder_layer`] makes of an
/// encoder layer (for `TransformerDecoder`'s stack).
pub(super) fn copy_decoder_layer(
    layer: &TransformerDecoderLayer,
) -> Result<TransformerDecoderLayer> {
    Ok(TransformerDecoderLayer {
        self_attn: dup_attention(&layer.self_attn, dup)?,
        multihead_attn: dup_attention(&layer.multihead_attn, dup)?,
        linear1: dup_linear(&layer.linear1, dup)?,
        linear2: dup_linear(&layer.linear2, dup)?,
        norm1: dup_norm(&layer.norm1, dup)?,
        norm2: dup_norm(&layer.norm2, dup)?,
        norm3: dup_norm(&layer.norm3, dup)?,
        options: layer.options,
        training: layer.training,
    })
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
    /// PyTorch's `tgt_is_causal` hint: `tgt_mask` is the causal mask (which
    /// must still be given), so that attention may apply it without reading it.
    pub tgt_is_causal: bool,
    /// PyTorch's `memory_is_causal` hint, the same for `memory_mask`.
    pub memory_is_causal: bool,
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
                is_causal: masks.tgt_is_causal,
                ..Default::default()
            };
            let a = super::in_module("self_attn", || Ok(self.self_attn.attend(x, x, x, opts)?.0))?;
            dropout(&a, p, t)
        };
        let mha = |x: &Tensor| -> Result<Tensor> {
            let opts = AttentionOptions {
                key_padding_mask: masks.memory_key_padding_mask,
                attn_mask: masks.memory_mask,
                need_weights: false,
                is_causal: masks.memory_is_causal,
                ..Default::default()
            };
            let a = super::in_module("multihead_attn", || {
                Ok(self.multihead_attn.attend(x, memory, memory, opts)?.0)
            })?;
            dropout(&a, p, t)
        };
        let ff = |x: &Tensor| -> Result<Tensor> {
            dropout(
                &feed_forward(&self.linear1, &self.linear2, x, o.activation, p, t)?,
                p,
                t,
            )
        };
        let norm = |which: &str, n: &LayerNorm, x: &Tensor| -> Result<Tensor> {
            super::in_module(which, || n.forward(x))
        };
        let (n1, n2, n3) = (&self.norm1, &self.norm2, &self.norm3);
        if o.norm_first {
            let x = tgt.add(&sa(&norm("norm1", n1, tgt)?)?)?;
            let x = x.add(&mha(&norm("norm2", n2, &x)?)?)?;
            x.add(&ff(&norm("norm3", n3, &x)?)?)
        } else {
            let x = norm("norm1", n1, &tgt.add(&sa(tgt)?)?)?;
            let x = norm("norm2", n2, &x.add(&mha(&x)?)?)?;
            norm("norm3", n3, &x.add(&ff(&x)?)?)
        }
    }
}

/// The decoder layer over its own input as the memory too (a decoder-only
/// model uses [`TransformerEncoderLayer`] with a causal mask instead).
impl Module for TransformerDecoderLayer {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.decode(x, x, DecoderMasks::default())
    }
    super::delegate_to_children!(own training);
}
