//! `nn.TransformerDecoder` (a stack of decoder layers) and `nn.Transformer`
//! (the encoder–decoder model of "Attention Is All You Need"), built from the
//! layers of `transformer.rs` with PyTorch's state-dict names, initial values
//! and argument checks.
//!
//! ```
//! use ember::nn::{self, Module, TransformerMasks, TransformerOptions};
//! use ember::prelude::*;
//! let dev = Device::Cpu;
//! let opts = TransformerOptions { dim_feedforward: 32, batch_first: true, ..Default::default() };
//! let mut model = nn::Transformer::new(16, 4, 2, 2, opts, &dev)?;
//! model.eval();
//! let (src, tgt) = (Tensor::randn([3, 7, 16], &dev)?, Tensor::randn([3, 5, 16], &dev)?);
//! let causal = nn::Transformer::generate_square_subsequent_mask(5, &dev)?;
//! let masks = TransformerMasks { tgt_mask: Some(&causal), ..Default::default() };
//! assert_eq!(model.forward_masked(&src, &tgt, masks)?.shape(), &[3, 5, 16]);
//! # Ok::<(), ember::Error>(())
//! ```

use super::transformer::{copy_decoder_layer, stack_children, stack_children_mut};
use super::{
    DecoderMasks, LayerNorm, Module, TransformerDecoderLayer, TransformerEncoder,
    TransformerEncoderLayer, TransformerOptions,
};
use crate::{
    device::Device,
    dtype::DType,
    error::{Error, Result},
    layout::MemoryFormat,
    tensor::Tensor,
};

/// A stack of decoder layers (`nn.TransformerDecoder`), `layers.0` …
/// `layers.{n-1}`, each starting as a copy of the given layer (PyTorch deep-copies
/// it, so all layers start with the same values), and an optional final
/// normalisation `norm`. Every layer attends to the same `memory`.
pub struct TransformerDecoder {
    pub layers: Vec<TransformerDecoderLayer>,
    pub norm: Option<LayerNorm>,
}

impl TransformerDecoder {
    pub fn new(
        layer: TransformerDecoderLayer,
        num_layers: usize,
        norm: Option<LayerNorm>,
    ) -> Result<Self> {
        let mut layers = Vec::with_capacity(num_layers);
        for _ in 1..num_layers {
            layers.push(copy_decoder_layer(&layer)?);
        }
        if num_layers > 0 {
            layers.push(layer);
        }
        Ok(TransformerDecoder { layers, norm })
    }

    fn children(&self) -> Vec<(String, &dyn Module)> {
        stack_children(&self.layers, self.norm.as_ref())
    }

    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        stack_children_mut(&mut self.layers, self.norm.as_mut())
    }

    /// The stack on target `tgt` attending to `memory` (the encoder's output),
    /// the same masks given to every layer.
    pub fn decode(&self, tgt: &Tensor, memory: &Tensor, masks: DecoderMasks) -> Result<Tensor> {
        let mut x = tgt.clone();
        for (i, layer) in self.layers.iter().enumerate() {
            // the previous output moves into the layer's scope and drops there
            x = super::in_module(format_args!("layers.{i}"), move || {
                layer.decode(&x, memory, masks)
            })?;
        }
        match &self.norm {
            Some(n) => super::in_module("norm", move || n.forward(&x)),
            None => Ok(x),
        }
    }
}

/// The stack over its own input as the memory too, as
/// [`TransformerDecoderLayer`]'s `forward`.
impl Module for TransformerDecoder {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.decode(x, x, DecoderMasks::default())
    }
    super::delegate_to_children!();
}

/// The masks and causal hints of [`Transformer::forward_masked`], PyTorch's
/// keyword arguments of `nn.Transformer.forward`: `src_mask` `[S, S]`,
/// `tgt_mask` `[T, T]` and `memory_mask` `[T, S]` (or with a leading
/// `N · nhead`), `true` or `-inf` where attention is not allowed; the key
/// padding masks `[N, S]`, `[N, T]` and `[N, S]` (`[S]`/`[T]` unbatched).
#[derive(Clone, Copy, Default)]
pub struct TransformerMasks<'a> {
    pub src_mask: Option<&'a Tensor>,
    pub tgt_mask: Option<&'a Tensor>,
    pub memory_mask: Option<&'a Tensor>,
    pub src_key_padding_mask: Option<&'a Tensor>,
    pub tgt_key_padding_mask: Option<&'a Tensor>,
    pub memory_key_padding_mask: Option<&'a Tensor>,
    /// `src_mask` is the causal mask (it must still be given): attention may
    /// apply it without reading it.
    pub src_is_causal: bool,
    /// The same hint for `tgt_mask`.
    pub tgt_is_causal: bool,
    /// The same hint for `memory_mask`.
    pub memory_is_causal: bool,
}

/// The encoder–decoder transformer (`nn.Transformer`): an [`encoder`] of
/// `num_encoder_layers` layers and a [`decoder`] of `num_decoder_layers`, each
/// stack ending in a layer normalisation (`encoder.norm`, `decoder.norm`). Built
/// as PyTorch builds it: each stack's layers start as copies of one layer, then
/// every parameter with more than one dimension is drawn again, Xavier-uniform,
/// so that the weight matrices differ between layers while the biases and the
/// norms' values start equal.
///
/// [`encoder`]: Self::encoder
/// [`decoder`]: Self::decoder
pub struct Transformer {
    pub encoder: TransformerEncoder,
    pub decoder: TransformerDecoder,
    d_model: usize,
    nhead: usize,
    batch_first: bool,
}

impl Transformer {
    /// The model of width `d_model` with `nhead` attention heads, the layers'
    /// other settings from `options` (PyTorch's `nn.Transformer(d_model, nhead,
    /// num_encoder_layers, num_decoder_layers, dim_feedforward, dropout,
    /// activation, layer_norm_eps, batch_first, norm_first, bias)`; PyTorch's
    /// defaults are 512, 8, 6, 6 and [`TransformerOptions::default`]).
    pub fn new(
        d_model: usize,
        nhead: usize,
        num_encoder_layers: usize,
        num_decoder_layers: usize,
        options: TransformerOptions,
        device: &Device,
    ) -> Result<Self> {
        let o = options;
        let norm = || LayerNorm::with_options(&[d_model], o.layer_norm_eps, true, o.bias, device);
        let encoder_layer = TransformerEncoderLayer::new(d_model, nhead, o, device)?;
        let encoder = TransformerEncoder::new(encoder_layer, num_encoder_layers, Some(norm()?))?;
        let decoder_layer = TransformerDecoderLayer::new(d_model, nhead, o, device)?;
        let decoder = TransformerDecoder::new(decoder_layer, num_decoder_layers, Some(norm()?))?;
        let model = Transformer {
            encoder,
            decoder,
            d_model,
            nhead,
            batch_first: o.batch_first,
        };
        model.xavier_matrices()?;
        Ok(model)
    }

    /// The width of the model's inputs and outputs.
    pub fn d_model(&self) -> usize {
        self.d_model
    }

    /// The number of attention heads.
    pub fn nhead(&self) -> usize {
        self.nhead
    }

    /// Whether inputs are `[N, L, E]` (else `[L, N, E]`).
    pub fn batch_first(&self) -> bool {
        self.batch_first
    }

    /// The causal mask for a target of `size` positions
    /// (`nn.Transformer.generate_square_subsequent_mask`): float32, 0 where a
    /// position may attend (itself and those before it), `-inf` elsewhere. The
    /// same as [`square_subsequent_mask`](super::square_subsequent_mask).
    pub fn generate_square_subsequent_mask(size: usize, device: &Device) -> Result<Tensor> {
        super::square_subsequent_mask(size, device)
    }

    /// PyTorch's `_reset_parameters`: Xavier-uniform for every parameter of
    /// more than one dimension, in the order of the state dict.
    fn xavier_matrices(&self) -> Result<()> {
        for p in self.parameters().iter().filter(|p| p.rank() > 1) {
            super::init::xavier_uniform_(p, 1.0)?;
        }
        Ok(())
    }

    fn children(&self) -> Vec<(String, &dyn Module)> {
        vec![
            ("encoder".into(), &self.encoder as &dyn Module),
            ("decoder".into(), &self.decoder as &dyn Module),
        ]
    }

    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        vec![
            ("encoder".into(), &mut self.encoder as &mut dyn Module),
            ("decoder".into(), &mut self.decoder as &mut dyn Module),
        ]
    }

    /// The model on source `src` (`[S, N, E]`, `[N, S, E]` with `batch_first`,
    /// or unbatched `[S, E]`) and target `tgt` (the same with `T` positions):
    /// the encoder's output over `src` is the memory the decoder attends to.
    /// The output is shaped like `tgt`. A batched `src` and `tgt` of different
    /// batch sizes, or inputs whose last dimension is not `d_model`, are
    /// refused with PyTorch's messages.
    pub fn forward_masked(
        &self,
        src: &Tensor,
        tgt: &Tensor,
        masks: TransformerMasks,
    ) -> Result<Tensor> {
        const OP: &str = "Transformer";
        // PyTorch's checks as it makes them: the batch sizes only when `src` is
        // batched (`tgt`'s dimension at the same place, whatever its rank)
        let b = if self.batch_first { 0 } else { 1 };
        if src.rank() == 3 && tgt.shape().get(b) != Some(&src.shape()[b]) {
            return Err(Error::shape(
                OP,
                src.shape(),
                tgt.shape(),
                "the batch number of src and tgt must be equal",
            ));
        }
        let width = |t: &Tensor| t.shape().last().copied();
        if width(src) != Some(self.d_model) || width(tgt) != Some(self.d_model) {
            return Err(Error::shape(
                OP,
                src.shape(),
                tgt.shape(),
                format!(
                    "the feature number of src and tgt must be equal to d_model ({})",
                    self.d_model
                ),
            ));
        }
        let memory = super::in_module("encoder", || {
            self.encoder.forward_with(
                src,
                masks.src_mask,
                masks.src_key_padding_mask,
                masks.src_is_causal,
            )
        })?;
        let decoder_masks = DecoderMasks {
            tgt_mask: masks.tgt_mask,
            memory_mask: masks.memory_mask,
            tgt_key_padding_mask: masks.tgt_key_padding_mask,
            memory_key_padding_mask: masks.memory_key_padding_mask,
            tgt_is_causal: masks.tgt_is_causal,
            memory_is_causal: masks.memory_is_causal,
        };
        super::in_module("decoder", move || {
            self.decoder.decode(tgt, &memory, decoder_masks)
        })
    }
}

/// The model with its input as both source and target, as the decoder layer's
/// `forward` uses its input as the memory: [`Transformer::forward_masked`]
/// takes the two.
impl Module for Transformer {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_masked(x, x, TransformerMasks::default())
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        super::prefixed(self.children(), |m| m.named_parameters())
    }

    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        super::prefixed(self.children(), |m| m.named_buffers())
    }

    fn materialize_lazy(&self, shapes: &[(&str, &[usize])]) -> Result<()> {
        super::materialize_children(self.children(), shapes)
    }

    fn to_device(&mut self, device: &Device) -> Result<()> {
        super::to_device_all(
            self.children_mut().into_iter().map(|(_, m)| m).collect(),
            device,
        )
    }

    fn to_empty(&mut self, device: &Device) -> Result<()> {
        let shared = super::shared_in(&*self);
        super::converting(shared, || {
            self.children_mut()
                .into_iter()
                .try_for_each(|(_, m)| m.to_empty(device))
        })
    }

    fn to_dtype(&mut self, dtype: DType) -> Result<()> {
        super::to_dtype_all(
            self.children_mut().into_iter().map(|(_, m)| m).collect(),
            dtype,
        )
    }

    fn to_memory_format(&mut self, format: MemoryFormat) -> Result<()> {
        let shared = super::shared_in(&*self);
        super::converting(shared, || {
            self.children_mut()
                .into_iter()
                .try_for_each(|(_, m)| m.to_memory_format(format))
        })
    }

    /// The layers' own initial values, then Xavier-uniform for every matrix, as
    /// a new model draws them.
    fn reset_parameters(&mut self) -> Result<()> {
        self.children_mut()
            .into_iter()
            .try_for_each(|(_, m)| m.reset_parameters())?;
        self.xavier_matrices()
    }

    fn set_training(&mut self, training: bool) {
        self.children_mut()
            .into_iter()
            .for_each(|(_, m)| m.set_training(training));
    }
}
