//! Neural-network building blocks: the [`Module`] trait, layers, activations and
//! losses, with PyTorch's default initialisation.
//!
//! ```
//! use ember::nn::{self, Module};
//! use ember::prelude::*;
//! let dev = Device::Cpu;
//! let model = nn::Sequential::new()
//!     .add(nn::Linear::new(4, 8, &dev)?)
//!     .add(nn::ReLU)
//!     .add(nn::Linear::new(8, 3, &dev)?);
//! let x = Tensor::randn([5, 4], &dev)?;
//! assert_eq!(model.forward(&x)?.shape(), &[5, 3]);
//! assert_eq!(model.num_parameters(), 4 * 8 + 8 + 8 * 3 + 3);
//! # Ok::<(), ember::Error>(())
//! ```

mod activation;
mod activation_checkpoint;
mod attention;
mod clip;
mod containers;
mod conv_layers;
mod distance;
mod embed_norm;
mod embedding_bag;
pub mod functional;
pub mod init;
mod instance_norm;
mod layers;
mod loss;
mod loss_modules;
mod loss_more;
mod loss_pointwise;
mod norm;
mod padding;
mod pixel;
mod pointwise_layers;
mod pool3d;
mod pooling;
mod prelu;
mod recurrent;
mod resample;
mod rnn;
mod rnn_utils;
mod sdpa;
mod sdpa_saving;
mod state;
mod transformer;
mod transformer_model;
mod upsample;

pub use crate::tensor::{Conv3dOptions, ConvTranspose2dOptions, ConvTranspose3dOptions};
pub use activation_checkpoint::{checkpoint, Checkpoint};
pub use attention::{square_subsequent_mask, AttentionOptions, MultiheadAttention};
pub use clip::{clip_grad_norm_, clip_grad_value_};
pub use containers::{ModuleDict, ModuleList};
pub use conv_layers::PaddingMode;
pub use conv_layers::{Conv1d, Conv1dOptions, Conv3d, ConvTranspose2d, ConvTranspose3d};
pub use distance::{CosineSimilarity, PairwiseDistance};
pub use embed_norm::{Embedding, GroupNorm, LayerNorm, RMSNorm};
pub use embedding_bag::{BagMode, EmbeddingBag, EmbeddingBagOptions};
pub use functional::{
    batch_norm, dropout, embedding, group_norm, layer_norm, rms_norm, scaled_dot_product_attention,
    BatchNormOptions,
};
pub use instance_norm::{InstanceNorm, InstanceNorm1d, InstanceNorm2d, InstanceNorm3d};
pub use layers::{
    AdaptiveAvgPool2d, AvgPool2d, Conv2d, Dropout, Flatten, Hardsigmoid, Hardswish, Hardtanh,
    Identity, LazyLinear, LeakyReLU, Linear, MaxPool2d, Mish, ReLU, ReLU6, Sequential, SiLU,
    Sigmoid, Softmax, Softplus, Tanh, CELU, ELU, GELU, SELU,
};
pub use loss::{
    bce_with_logits, bce_with_logits_opts, cross_entropy, cross_entropy_opts, cross_entropy_with,
    mse_loss, nll_loss, nll_loss_opts, LossOptions, Reduction,
};
// every loss module (`CrossEntropyLoss`, ..., `TripletMarginLoss`)
pub use loss_modules::*;
pub use loss_pointwise::{
    binary_cross_entropy, huber_loss, kl_div, kl_div_batchmean, l1_loss, smooth_l1_loss,
};
pub use norm::{BatchNorm, BatchNorm1d, BatchNorm2d, BatchNorm3d};
pub use padding::{
    CircularPad1d, CircularPad2d, CircularPad3d, ConstantPad1d, ConstantPad2d, ConstantPad3d,
    Padding, ReflectionPad1d, ReflectionPad2d, ReflectionPad3d, ReplicationPad1d, ReplicationPad2d,
    ReplicationPad3d, ZeroPad1d, ZeroPad2d, ZeroPad3d,
};
pub use pixel::{ChannelShuffle, Fold, FoldOptions, PixelShuffle, PixelUnshuffle, Unfold};
pub use pointwise_layers::{
    Dropout1d, Dropout2d, Dropout3d, Hardshrink, LogSigmoid, LogSoftmax, Softmin, Softshrink,
    Softsign, Tanhshrink, Threshold, Unflatten, GLU,
};
pub use pool3d::{AdaptiveAvgPool3d, AdaptiveMaxPool3d, AvgPool3d, MaxPool3d, Pool3dOptions};
pub use pooling::{
    AdaptiveAvgPool1d, AdaptiveMaxPool1d, AdaptiveMaxPool2d, AvgPool1d, MaxPool1d, MaxUnpool2d,
    Pool1dOptions,
};
pub use prelu::PReLU;
pub use recurrent::{GRUCell, LSTMCell, RnnOptions, GRU, LSTM};
pub use rnn::{RNNCell, RnnNonlinearity, RNN};
pub use rnn_utils::{pad_sequence, unpad_sequence, PadSequenceOptions, PaddingSide};
pub use state::IncompatibleKeys;
pub use transformer::{
    Activation, DecoderMasks, TransformerDecoderLayer, TransformerEncoder, TransformerEncoderLayer,
    TransformerOptions,
};
pub use transformer_model::{Transformer, TransformerDecoder, TransformerMasks};
pub use upsample::Upsample;

use crate::layout::MemoryFormat;
use crate::{device::Device, dtype::DType, error::Result, tensor::Tensor};

/// A layer or model: a forward function over parameters it owns.
pub trait Module: Send + Sync {
    /// Computes the output for `x`.
    fn forward(&self, x: &Tensor) -> Result<Tensor>;

    /// The parameters with dotted names (`"0.weight"`), in a stable order. A
    /// tensor two layers share (a tied weight) is listed under each of its
    /// names, as PyTorch's `named_parameters(remove_duplicate=False)` and its
    /// state dict list it (PyTorch's default lists it once: [`parameters`]
    /// does, and [`unique_named_parameters`] gives the names that go with
    /// them).
    ///
    /// [`parameters`]: Self::parameters
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }

    /// The buffers: state that is saved with the model but not trained (batch
    /// norm's running statistics), named like the parameters.
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }

    /// Parameters then buffers: what `state_dict` files hold.
    fn state_dict(&self) -> Vec<(String, Tensor)> {
        let mut all = self.named_parameters();
        all.extend(self.named_buffers());
        all
    }

    /// Copies a state dict into the parameters and buffers
    /// (`model.load_state_dict(state, strict)`): each entry is converted to the
    /// dtype of the tensor it replaces and moved to its device. With `strict`,
    /// a key the model lacks or an entry the state lacks is an error; without,
    /// they are returned. A shape that differs is an error either way. Nothing is
    /// copied unless everything checks.
    ///
    /// `state` can come from [`crate::io::load`] (safetensors),
    /// [`crate::io::load_pt`] (PyTorch's `torch.save` files) or another model's
    /// [`state_dict`](Self::state_dict).
    ///
    /// ```
    /// use ember::nn::{self, Module};
    /// use ember::prelude::*;
    /// let dev = Device::Cpu;
    /// let a = nn::Linear::new(3, 2, &dev)?;
    /// let b = nn::Linear::new(3, 2, &dev)?;
    /// assert!(b.load_state_dict(&a.state_dict(), true)?.is_empty());
    /// assert_eq!(b.weight.to_vec2::<f32>()?, a.weight.to_vec2::<f32>()?);
    /// // a state without the bias: refused when strict, reported when not
    /// let weight_only = &a.state_dict()[..1];
    /// assert!(b.load_state_dict(weight_only, true).is_err());
    /// assert_eq!(b.load_state_dict(weight_only, false)?.missing_keys, ["bias"]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    fn load_state_dict(
        &self,
        state: &[(String, Tensor)],
        strict: bool,
    ) -> Result<IncompatibleKeys> {
        state::load_state(self, state, strict, "the state dict")
    }

    /// Makes the parameters of lazy layers not yet made ([`LazyLinear`]) from
    /// the shapes of a state about to be loaded (names relative to this
    /// module), as PyTorch's lazy modules do when a state dict is loaded: a
    /// lazy model loads a checkpoint without a dry run first. Called by every
    /// state load before its checks; a layer whose entry is absent or of
    /// another shape stays lazy (and the check reports it). The default has no
    /// lazy layer; the containers pass each child the entries under its name.
    fn materialize_lazy(&self, shapes: &[(&str, &[usize])]) -> Result<()> {
        let _ = shapes;
        Ok(())
    }

    /// Moves every parameter (and buffer) to `device`. A model on `meta` has no
    /// values to move: use [`to_empty`](Self::to_empty) for it.
    ///
    /// A module with parameters or buffers must implement it; the default is for
    /// modules without state, and refuses the others rather than leave their
    /// tensors behind. The containers (`Sequential`, `ModuleList`, ...) refuse
    /// before moving any child when one of them does not implement it.
    fn to_device(&mut self, _device: &Device) -> Result<()> {
        stateless(self, "to_device")
    }

    /// Replaces every parameter and buffer with uninitialised storage of its shape
    /// and dtype on `device` (`module.to_empty(device=...)`), typically for a model
    /// built on `meta`; then [`reset_parameters`](Self::reset_parameters) or load a
    /// state dict. Parameters stay leaves that require a gradient.
    ///
    /// ```
    /// use ember::nn::{self, Module};
    /// use ember::prelude::*;
    /// // the structure first, without memory or random draws...
    /// let mut model = nn::Sequential::new()
    ///     .add(nn::Linear::new(784, 1024, &Device::Meta)?)
    ///     .add(nn::ReLU)
    ///     .add(nn::Linear::new(1024, 10, &Device::Meta)?);
    /// let y = model.forward(&Tensor::zeros([64, 784], DType::F32, &Device::Meta)?)?;
    /// assert_eq!((y.shape(), y.device()), (&[64, 10][..], Device::Meta));
    /// // ...then the memory, and the initial values
    /// model.to_empty(&Device::Cpu)?;
    /// model.reset_parameters()?;
    /// assert_eq!(model.parameters()[0].device(), Device::Cpu);
    /// # Ok::<(), ember::Error>(())
    /// ```
    ///
    /// A module with parameters or buffers must implement it; the default is for
    /// modules without state (activations, pooling), and refuses the others.
    fn to_empty(&mut self, _device: &Device) -> Result<()> {
        stateless(self, "to_empty")
    }

    /// Converts the floating-point parameters and buffers to `dtype`
    /// (`module.to(dtype)`); integer buffers (batch norm's `num_batches_tracked`)
    /// keep theirs, and parameters stay leaves that require a gradient. `dtype`
    /// must be a floating-point type.
    ///
    /// ```
    /// use ember::nn::{self, Module};
    /// use ember::prelude::*;
    /// let mut layer = nn::Linear::new(4, 2, &Device::Cpu)?;
    /// layer.to_dtype(DType::BF16)?;
    /// assert_eq!(layer.parameters()[0].dtype(), DType::BF16);
    /// assert!(layer.to_dtype(DType::I64).is_err());
    /// # Ok::<(), ember::Error>(())
    /// ```
    ///
    /// Like [`to_empty`](Self::to_empty), the default is for modules without state.
    fn to_dtype(&mut self, dtype: DType) -> Result<()> {
        float_target(dtype)?;
        stateless(self, "to_dtype")
    }

    /// Lays out the 4-D parameters and buffers (convolution weights) in `format`
    /// (`model.to(memory_format=torch.channels_last)`); the others keep theirs.
    /// Parameters stay leaves that require a gradient, and their gradients take
    /// their layout. With channels-last weights, convolutions give channels-last
    /// outputs, and batch norm, pooling and the activations after them keep it.
    ///
    /// ```
    /// use ember::nn::{self, Module};
    /// use ember::prelude::*;
    /// use ember::MemoryFormat;
    /// let mut conv = nn::Conv2d::new(3, 8, 3, Conv2dOptions::default(), &Device::Cpu)?;
    /// conv.to_memory_format(MemoryFormat::ChannelsLast)?;
    /// assert!(conv.weight.is_contiguous_in(MemoryFormat::ChannelsLast));
    /// let y = conv.forward(&Tensor::zeros([2, 3, 8, 8], DType::F32, &Device::Cpu)?)?;
    /// assert!(y.is_contiguous_in(MemoryFormat::ChannelsLast));
    /// # Ok::<(), ember::Error>(())
    /// ```
    ///
    /// A module holding 4-D parameters or buffers must implement it; the default is
    /// for the others (nothing to change), and refuses a module that holds some.
    fn to_memory_format(&mut self, _format: MemoryFormat) -> Result<()> {
        if self.state_dict().iter().any(|(_, t)| t.rank() == 4) {
            return Err(crate::error::Error::invalid(
                "to_memory_format",
                "this module has 4-D parameters or buffers but does not implement it",
            ));
        }
        Ok(())
    }

    /// Initialises the parameters and buffers again as a new module does
    /// (`reset_parameters()`), drawing from the global generator. Like
    /// [`to_empty`](Self::to_empty), the default is for modules without state.
    fn reset_parameters(&mut self) -> Result<()> {
        stateless(self, "reset_parameters")
    }

    /// Switches between training (`true`) and evaluation behaviour (dropout, batch norm).
    fn set_training(&mut self, _training: bool) {}

    /// The parameters, in the order of [`named_parameters`](Self::named_parameters),
    /// each once: a tensor two layers share (a tied weight) is listed at its
    /// first place only, as PyTorch's `parameters()` lists it, so that an
    /// optimizer steps it once (with the gradient of both uses) and
    /// [`num_parameters`](Self::num_parameters) counts it once.
    fn parameters(&self) -> Vec<Tensor> {
        let unique = unique_named_parameters(self).into_iter();
        unique.map(|(_, p)| p).collect()
    }

    /// The number of scalar parameters.
    fn num_parameters(&self) -> usize {
        self.parameters().iter().map(|p| p.numel()).sum()
    }

    /// `model.train()`.
    fn train(&mut self) {
        self.set_training(true)
    }

    /// `model.eval()`.
    fn eval(&mut self) {
        self.set_training(false)
    }

    /// Clears every parameter's gradient (`model.zero_grad()`, whose default
    /// `set_to_none=True` this is): the next backward pass starts each anew.
    fn zero_grad(&self) {
        for p in self.parameters() {
            p.zero_grad();
        }
    }

    /// Sets whether the parameters require a gradient
    /// (`model.requires_grad_(on)`): `false` freezes the module, so that
    /// backward passes give its parameters no gradient and optimizers leave
    /// them as they are (fine-tuning a part of a model). Buffers are untouched.
    ///
    /// ```
    /// use ember::nn::{self, Module};
    /// use ember::optim::{Optimizer, Sgd};
    /// use ember::prelude::*;
    /// let dev = Device::Cpu;
    /// let (body, head) = (nn::Linear::new(4, 3, &dev)?, nn::Linear::new(3, 2, &dev)?);
    /// body.requires_grad_(false)?;
    /// let mut params = body.parameters();
    /// params.extend(head.parameters());
    /// let mut opt = Sgd::new(params, 0.1)?;
    /// let (before, x) = (body.weight.to_vec2::<f32>()?, Tensor::ones([5, 4], DType::F32, &dev)?);
    /// head.forward(&body.forward(&x)?)?.sum_all()?.backward()?;
    /// assert!(body.weight.grad().is_none() && head.weight.grad().is_some());
    /// opt.step()?;
    /// assert_eq!(body.weight.to_vec2::<f32>()?, before);
    /// head.zero_grad();
    /// assert!(head.weight.grad().is_none());
    /// # Ok::<(), ember::Error>(())
    /// ```
    fn requires_grad_(&self, on: bool) -> Result<()> {
        for p in self.parameters() {
            p.requires_grad_(on)?;
        }
        Ok(())
    }
}

/// A boxed module is a module (`models::by_name` returns one): every method goes to
/// the module inside, so a `Box<dyn Module>` can be handed to what takes `impl
/// Module` (a `Sequential`, a `Trial`, an estimate).
impl<M: Module + ?Sized> Module for Box<M> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        (**self).forward(x)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        (**self).named_parameters()
    }

    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        (**self).named_buffers()
    }

    fn state_dict(&self) -> Vec<(String, Tensor)> {
        (**self).state_dict()
    }

    fn load_state_dict(
        &self,
        state: &[(String, Tensor)],
        strict: bool,
    ) -> Result<IncompatibleKeys> {
        (**self).load_state_dict(state, strict)
    }

    fn materialize_lazy(&self, shapes: &[(&str, &[usize])]) -> Result<()> {
        (**self).materialize_lazy(shapes)
    }

    fn to_device(&mut self, device: &Device) -> Result<()> {
        (**self).to_device(device)
    }

    fn to_empty(&mut self, device: &Device) -> Result<()> {
        (**self).to_empty(device)
    }

    fn to_dtype(&mut self, dtype: DType) -> Result<()> {
        (**self).to_dtype(dtype)
    }

    fn to_memory_format(&mut self, format: MemoryFormat) -> Result<()> {
        (**self).to_memory_format(format)
    }

    fn reset_parameters(&mut self) -> Result<()> {
        (**self).reset_parameters()
    }

    fn set_training(&mut self, training: bool) {
        (**self).set_training(training)
    }

    fn parameters(&self) -> Vec<Tensor> {
        (**self).parameters()
    }

    fn num_parameters(&self) -> usize {
        (**self).num_parameters()
    }

    fn train(&mut self) {
        (**self).train()
    }

    fn eval(&mut self) {
        (**self).eval()
    }
}

/// `m`'s parameters each once, under the first of their names (PyTorch's
/// `named_parameters()`, which leaves out a tied weight's later names): the
/// names that go with [`Module::parameters`].
pub fn unique_named_parameters(m: &(impl Module + ?Sized)) -> Vec<(String, Tensor)> {
    let mut seen = std::collections::HashSet::new();
    m.named_parameters()
        .into_iter()
        .filter(|(_, p)| seen.insert(p.id()))
        .collect()
}

/// `Ok` for a module without parameters or buffers; an error naming `op` (a method
/// such a module has to implement) otherwise.
fn stateless<M: Module + ?Sized>(m: &M, op: &'static str) -> Result<()> {
    if m.named_parameters().is_empty() && m.named_buffers().is_empty() {
        Ok(())
    } else {
        Err(crate::error::Error::invalid(
            op,
            "this module has parameters or buffers but does not implement it",
        ))
    }
}

/// `m`'s parameters and buffers.
fn tensors_of(m: &dyn Module) -> impl Iterator<Item = Tensor> {
    m.named_parameters()
        .into_iter()
        .chain(m.named_buffers())
        .map(|(_, t)| t)
}

/// Applies `apply(child, target)` to each of `children`. Each child whose
/// tensors all have one value of `now` (their device, or their floating-point
/// dtype) is first asked to go to that value, which changes nothing, so that
/// one which cannot go (a module with state that does not implement the move
/// or the cast) refuses before any child has changed. (A child without such
/// tensors, or with several values, is not asked first: the question would
/// change it.)
///
/// A tensor shared by two children (a weight tied by assigning one tensor to
/// two layers) stays shared: it is converted once, and every child gets that
/// one ([`shared`]), as PyTorch's `model.to()` keeps a tie.
fn all_children<K: Copy + PartialEq>(
    mut children: Vec<&mut dyn Module>,
    now: impl Fn(&Tensor) -> Option<K>,
    apply: impl Fn(&mut dyn Module, K) -> Result<()>,
    target: K,
) -> Result<()> {
    for m in children.iter_mut() {
        let values: Vec<K> = tensors_of(&**m).filter_map(|t| now(&t)).collect();
        if let Some(&here) = values.first() {
            if values.iter().all(|&v| v == here) {
                apply(&mut **m, here)?;
            }
        }
    }
    let shared = shared_ids(children.iter().flat_map(|m| tensors_of(&**m)));
    let _conversions = Conversions::begin(shared);
    children.into_iter().try_for_each(|m| apply(m, target))
}

/// The ids of the tensors listed more than once among `tensors` (a weight two
/// layers share): only those are converted once for all (the others are freed
/// as their layers replace them, not kept to the end of the conversion).
pub(crate) fn shared_ids(
    tensors: impl Iterator<Item = Tensor>,
) -> std::collections::HashSet<usize> {
    let mut seen = std::collections::HashSet::new();
    tensors
        .map(|t| t.id())
        .filter(|&id| !seen.insert(id))
        .collect()
}

thread_local! {
    /// While a container converts its children: each tensor converted so far
    /// and what it became, by the old tensor's id.
    static CONVERTED: std::cell::RefCell<Option<Converted>> = const { std::cell::RefCell::new(None) };
}

/// One container-wide conversion's memo: the ids of the tensors its children
/// share, and each of those converted so far with what it became.
struct Converted {
    shared: std::collections::HashSet<usize>,
    done: std::collections::HashMap<usize, (Tensor, Tensor)>,
}

/// `f`, a container's conversion of its children (`to_empty`,
/// `to_memory_format`), in one scope of [`shared`] conversions: `shared` is
/// [`shared_in`] the container, taken before `f` borrows it.
pub(crate) fn converting(
    shared: std::collections::HashSet<usize>,
    f: impl FnOnce() -> Result<()>,
) -> Result<()> {
    let _scope = Conversions::begin(shared);
    f()
}

/// The ids of the tensors `m` lists more than once ([`shared_ids`]).
pub(crate) fn shared_in(m: &dyn Module) -> std::collections::HashSet<usize> {
    shared_ids(tensors_of(m))
}

/// The scope of one container-wide conversion (the outermost one: nested
/// containers share it).
struct Conversions {
    outermost: bool,
}

impl Conversions {
    /// (a nested container's `shared` is within the outermost's, which is kept)
    fn begin(shared: std::collections::HashSet<usize>) -> Conversions {
        let outermost = CONVERTED.with(|c| {
            let mut c = c.borrow_mut();
            let fresh = c.is_none();
            if fresh {
                *c = Some(Converted {
                    shared,
                    done: std::collections::HashMap::new(),
                });
            }
            fresh
        });
        Conversions { outermost }
    }
}

impl Drop for Conversions {
    fn drop(&mut self) {
        if self.outermost {
            CONVERTED.with(|c| *c.borrow_mut() = None);
        }
    }
}

/// `convert(t)`, made once per tensor during a container's conversion: a
/// tensor two children share (a tied weight) becomes one new tensor that both
/// get, not two copies that would train apart. Outside one, `convert(t)`.
fn shared(t: &Tensor, convert: impl FnOnce() -> Result<Tensor>) -> Result<Tensor> {
    let known = CONVERTED.with(|c| {
        let c = c.borrow();
        let m = c.as_ref().filter(|m| m.shared.contains(&t.id()))?;
        Some(m.done.get(&t.id()).map(|(_, new)| new.clone()))
    });
    match known {
        None => convert(),
        Some(Some(new)) => Ok(new),
        Some(None) => {
            let new = convert()?;
            CONVERTED.with(|c| {
                if let Some(m) = c.borrow_mut().as_mut() {
                    // the old tensor is kept too, so that its id is not reused
                    m.done.insert(t.id(), (t.clone(), new.clone()));
                }
            });
            Ok(new)
        }
    }
}

/// Moves `children` to `device` ([`all_children`]).
pub(crate) fn to_device_all(children: Vec<&mut dyn Module>, device: &Device) -> Result<()> {
    all_children(
        children,
        |t| Some(t.device()),
        |m, d| m.to_device(&d),
        *device,
    )
}

/// Casts `children` to `dtype` ([`all_children`], by their floating-point
/// tensors' dtype).
pub(crate) fn to_dtype_all(children: Vec<&mut dyn Module>, dtype: DType) -> Result<()> {
    float_target(dtype)?;
    all_children(
        children,
        |t| t.dtype().is_float().then_some(t.dtype()),
        |m, d| m.to_dtype(d),
        dtype,
    )
}

pub(crate) use state::{check_state, load_state};

/// The parameters or buffers (`f` of each child) of named children, each name
/// prefixed with its child's (`"conv1.weight"`).
pub(crate) fn prefixed<N: std::fmt::Display>(
    children: Vec<(N, &dyn Module)>,
    f: impl Fn(&dyn Module) -> Vec<(String, Tensor)>,
) -> Vec<(String, Tensor)> {
    children
        .into_iter()
        .flat_map(|(c, m)| f(m).into_iter().map(move |(n, t)| (format!("{c}.{n}"), t)))
        .collect()
}

/// [`Module::materialize_lazy`] of named children: each is given the entries
/// under its name (`"3.weight"` is child `3`'s `"weight"`).
pub(crate) fn materialize_children<'a, N: std::fmt::Display>(
    children: impl IntoIterator<Item = (N, &'a dyn Module)>,
    shapes: &[(&str, &[usize])],
) -> Result<()> {
    for (c, m) in children {
        let prefix = format!("{c}.");
        let under: Vec<(&str, &[usize])> = shapes
            .iter()
            .filter_map(|&(n, s)| n.strip_prefix(prefix.as_str()).map(|r| (r, s)))
            .collect();
        if !under.is_empty() {
            m.materialize_lazy(&under)?;
        }
    }
    Ok(())
}

/// The `Module` methods of a module whose state is all in its children (every
/// method but `forward`), from its `children` and `children_mut` (named children,
/// in state-dict order). `(own training)`: the module also keeps a `training`
/// flag of its own, which `set_training` sets.
macro_rules! delegate_to_children {
    () => {
        $crate::nn::delegate_to_children!(@visit);
        fn set_training(&mut self, training: bool) {
            self.children_mut()
                .into_iter()
                .for_each(|(_, m)| m.set_training(training));
        }
    };
    (own training) => {
        $crate::nn::delegate_to_children!(@visit);
        fn set_training(&mut self, training: bool) {
            self.training = training;
            self.children_mut()
                .into_iter()
                .for_each(|(_, m)| m.set_training(training));
        }
    };
    (@visit) => {
        fn named_parameters(&self) -> Vec<(String, $crate::tensor::Tensor)> {
            $crate::nn::prefixed(self.children(), |m| m.named_parameters())
        }
        fn named_buffers(&self) -> Vec<(String, $crate::tensor::Tensor)> {
            $crate::nn::prefixed(self.children(), |m| m.named_buffers())
        }
        fn materialize_lazy(&self, shapes: &[(&str, &[usize])]) -> $crate::error::Result<()> {
            $crate::nn::materialize_children(self.children(), shapes)
        }
        fn to_device(&mut self, device: &$crate::device::Device) -> $crate::error::Result<()> {
            $crate::nn::to_device_all(
                self.children_mut().into_iter().map(|(_, m)| m).collect(),
                device,
            )
        }
        fn to_empty(&mut self, device: &$crate::device::Device) -> $crate::error::Result<()> {
            let shared = $crate::nn::shared_in(&*self);
            $crate::nn::converting(shared, || {
                self.children_mut()
                    .into_iter()
                    .try_for_each(|(_, m)| m.to_empty(device))
            })
        }
        fn to_dtype(&mut self, dtype: $crate::dtype::DType) -> $crate::error::Result<()> {
            $crate::nn::to_dtype_all(
                self.children_mut().into_iter().map(|(_, m)| m).collect(),
                dtype,
            )
        }
        fn reset_parameters(&mut self) -> $crate::error::Result<()> {
            self.children_mut()
                .into_iter()
                .try_for_each(|(_, m)| m.reset_parameters())
        }
        fn to_memory_format(
            &mut self,
            format: $crate::layout::MemoryFormat,
        ) -> $crate::error::Result<()> {
            let shared = $crate::nn::shared_in(&*self);
            $crate::nn::converting(shared, || {
                self.children_mut()
                    .into_iter()
                    .try_for_each(|(_, m)| m.to_memory_format(format))
            })
        }
    };
}
pub(crate) use delegate_to_children;

/// `f`, a child module's forward, inside its module scope (a child `name` of
/// `blocks.3` runs as `blocks.3.name`), its output then reported to the meta
/// device's hook: the profiler's ranges and the memory estimate's rows name
/// it. `Sequential`, the transformer layers and the model zoo run their
/// children through it.
pub(crate) fn in_module(
    name: impl std::fmt::Display,
    f: impl FnOnce() -> Result<Tensor>,
) -> Result<Tensor> {
    let _scope = crate::backend::meta::account::enter_module(name);
    let y = f()?;
    crate::backend::meta::account::module_output(y.shape(), y.dtype());
    Ok(y)
}

/// `Ok` for a floating-point `dtype`, the one kind a module converts to.
pub(crate) fn float_target(dtype: DType) -> Result<()> {
    let refusal = || format!("a module converts only to a floating-point dtype, not {dtype}");
    match dtype.is_float() {
        true => Ok(()),
        false => Err(crate::error::Error::invalid("to_dtype", refusal())),
    }
}

/// `t` converted to `dtype` when it is floating point (a parameter stays a leaf
/// that requires a gradient); integer and bool tensors, and tensors already of
/// `dtype`, as they are.
pub(crate) fn cast_state(t: &Tensor, dtype: DType) -> Result<Tensor> {
    float_target(dtype)?;
    if !t.dtype().is_float() || t.dtype() == dtype {
        return Ok(t.clone());
    }
    shared(t, || {
        crate::autograd::no_grad(|| t.detach().to_dtype(dtype))?.requires_grad_(t.requires_grad())
    })
}

/// `t` laid out in `format` when it is 4-D (a parameter stays a leaf that
/// requires a gradient); other tensors, and those whose strides suggest `format`
/// already, as they are. As PyTorch's `t.to(memory_format=...)`, a tensor dense
/// in both orders (a 1 × 1 kernel's `[o, c, 1, 1]`) is copied to `format`'s exact
/// strides, so that it suggests `format` to the convolutions it meets.
pub(crate) fn format_state(t: &Tensor, format: MemoryFormat) -> Result<Tensor> {
    if t.rank() != 4 || t.suggest_memory_format() == format {
        return Ok(t.clone());
    }
    shared(t, || {
        crate::autograd::no_grad(|| t.detach().copy_in_format(format))?
            .requires_grad_(t.requires_grad())
    })
}

/// A fresh leaf that requires a gradient, holding `t`'s values (copied: `t` may
/// share its storage with the caller's tensors).
pub(crate) fn parameter(t: Tensor) -> Result<Tensor> {
    crate::autograd::no_grad(|| t.detach().copy())?.requires_grad_(true)
}

/// [`parameter`] for a tensor just made (drawn or filled) and owned by no one
/// else: it becomes the leaf itself, without a copy (on a GPU, building a layer
/// then needs its weight's memory once, not twice).
pub(crate) fn fresh_parameter(t: Tensor) -> Result<Tensor> {
    t.requires_grad_(true)
}

/// Uninitialised storage of `p`'s shape and dtype on `device`, a leaf that requires
/// a gradient as `p` does.
pub(crate) fn empty_parameter(p: &Tensor, device: &Device) -> Result<Tensor> {
    shared(p, || {
        Tensor::empty(p.shape(), p.dtype(), device)?.requires_grad_(p.requires_grad())
    })
}

/// Overwrites `p`'s values with `values` (outside the graph).
pub(crate) fn assign(p: &Tensor, values: &Tensor) -> Result<()> {
    crate::autograd::no_grad(|| p.copy_(values))
}

/// A parameter moved to `device` (still a leaf that requires a gradient).
pub(crate) fn move_parameter(p: &Tensor, device: &Device) -> Result<Tensor> {
    if p.device() == *device {
        return Ok(p.clone());
    }
    shared(p, || {
        crate::autograd::no_grad(|| p.detach().to(device))?.requires_grad_(p.requires_grad())
    })
}
