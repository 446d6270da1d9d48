// Over 800 lines: many small layers and activations, each a few lines of PyTorch's API.
//! Layers and activations.

use super::{
    assign, cast_state, empty_parameter, fresh_parameter, move_parameter, parameter, Module,
};
use crate::{
    device::Device,
    dtype::DType,
    error::{Error, Result},
    tensor::Tensor,
};

/// `y = x Wᵀ + b` (`nn.Linear`). Weights and bias start uniform in
/// `±1/sqrt(in_features)`, PyTorch's default (Kaiming-uniform with a = √5).
pub struct Linear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
}

impl Linear {
    /// A layer with bias.
    pub fn new(in_features: usize, out_features: usize, device: &Device) -> Result<Linear> {
        Linear::with_bias(in_features, out_features, true, device)
    }

    /// A layer with or without bias.
    pub fn with_bias(
        in_features: usize,
        out_features: usize,
        bias: bool,
        device: &Device,
    ) -> Result<Linear> {
        let shape = [out_features, in_features];
        let (weight, bias) = draw("Linear", &shape, out_features, bias, device)?;
        Ok(Linear { weight, bias })
    }

    /// A layer with the given weight `[out, in]` and bias `[out]` (copied into fresh
    /// parameters).
    pub fn from_weights(weight: &Tensor, bias: Option<&Tensor>) -> Result<Linear> {
        if weight.rank() != 2 || bias.is_some_and(|b| b.shape() != [weight.shape()[0]]) {
            return Err(Error::invalid(
                "Linear",
                format!(
                    "expected weight [out, in] and bias [out], got {:?} and {:?}",
                    weight.shape(),
                    bias.map(|b| b.shape().to_vec())
                ),
            ));
        }
        Ok(Linear {
            weight: parameter(weight.clone())?,
            bias: bias.map(|b| parameter(b.clone())).transpose()?,
        })
    }
}

/// The `Module` methods of a layer whose parameters are `weight` and an
/// optional `bias` (`Linear`, `Conv2d`, `ConvTranspose2d`): their names,
/// moving, emptying and casting them, and the weight's memory format.
/// `(no to_memory_format)`: the same but the memory format (`Conv1d`, whose
/// 3-D weight has none); `(weight only)`: a layer with a `weight` alone
/// (`Embedding`, `PReLU`).
macro_rules! weight_bias_methods {
    () => {
        weight_bias_methods!(@params bias);

        fn to_memory_format(&mut self, format: crate::layout::MemoryFormat) -> Result<()> {
            self.weight = super::format_state(&self.weight, format)?;
            Ok(())
        }
    };
    (no to_memory_format) => {
        weight_bias_methods!(@params bias);
    };
    (weight only) => {
        weight_bias_methods!(@params);
    };
    (@params $($bias:ident)?) => {
        fn named_parameters(&self) -> Vec<(String, Tensor)> {
            std::iter::once(("weight".to_string(), self.weight.clone()))
                $(.chain(self.$bias.iter().map(|b| ("bias".to_string(), b.clone()))))?
                .collect()
        }

        fn to_device(&mut self, device: &Device) -> Result<()> {
            self.weight = move_parameter(&self.weight, device)?;
            $(if let Some(b) = &mut self.$bias {
                *b = move_parameter(b, device)?;
            })?
            Ok(())
        }

        fn to_empty(&mut self, device: &Device) -> Result<()> {
            self.weight = empty_parameter(&self.weight, device)?;
            $(if let Some(b) = &mut self.$bias {
                *b = empty_parameter(b, device)?;
            })?
            Ok(())
        }

        fn to_dtype(&mut self, dtype: DType) -> Result<()> {
            self.weight = cast_state(&self.weight, dtype)?;
            $(if let Some(b) = &mut self.$bias {
                *b = cast_state(b, dtype)?;
            })?
            Ok(())
        }
    };
}
pub(super) use weight_bias_methods;

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // (the fields are public: a weight set by hand may be of any shape)
        if self.weight.rank() != 2 {
            return Err(Error::shape(
                "Linear",
                x.shape(),
                self.weight.shape(),
                "the weight must be a [out_features, in_features] matrix",
            ));
        }
        let in_features = self.weight.shape()[1];
        if x.shape().last() != Some(&in_features) {
            return Err(Error::shape(
                "Linear",
                x.shape(),
                self.weight.shape(),
                format!("the input's last dim must be in_features = {in_features}"),
            ));
        }
        super::functional::linear(x, &self.weight, self.bias.as_ref())
    }

    weight_bias_methods!();

    fn reset_parameters(&mut self) -> Result<()> {
        let bound = uniform_bound(self.weight.shape().get(1).copied().unwrap_or(0));
        reset_uniform(&self.weight, self.bias.as_ref(), bound)
    }
}

/// PyTorch's default bound `1/sqrt(fan_in)` of Linear and convolution weights
/// and biases (Kaiming-uniform with a = √5), 0 for an empty fan-in.
pub(super) fn uniform_bound(fan_in: usize) -> f64 {
    if fan_in > 0 {
        1.0 / (fan_in as f64).sqrt()
    } else {
        0.0
    }
}

/// A weight of `shape` and (with `bias`) a bias `[out]`, each uniform in
/// `±1/sqrt(fan_in)` where `fan_in` is the product of the weight's dims
/// after the first (`shape[1]` times the kernel's size), drawn weight first
/// as PyTorch draws them.
pub(super) fn draw(
    op: &'static str,
    shape: &[usize],
    out: usize,
    bias: bool,
    device: &Device,
) -> Result<(Tensor, Option<Tensor>)> {
    let fan_in = shape[1..]
        .iter()
        .try_fold(1usize, |a, &v| a.checked_mul(v))
        .ok_or_else(|| Error::invalid(op, format!("a weight of {shape:?} overflows a size")))?;
    let bound = uniform_bound(fan_in);
    let weight = fresh_parameter(Tensor::uniform(-bound, bound, shape, DType::F32, device)?)?;
    let bias = bias
        .then(|| fresh_parameter(Tensor::uniform(-bound, bound, [out], DType::F32, device)?))
        .transpose()?;
    Ok((weight, bias))
}

/// Draws `weight` (then `bias`) again, uniform in `±bound`, in place.
fn reset_uniform(weight: &Tensor, bias: Option<&Tensor>, bound: f64) -> Result<()> {
    for p in std::iter::once(weight).chain(bias) {
        let fresh = Tensor::uniform(-bound, bound, p.shape(), p.dtype(), &p.device())?;
        assign(p, &fresh)?;
    }
    Ok(())
}

/// A convolution's `reset_parameters`: `weight` (then `bias`) drawn again
/// uniform in `±1/sqrt(fan_in)`, `fan_in` the weight's dims after the first.
pub(super) fn reset_conv(weight: &Tensor, bias: Option<&Tensor>) -> Result<()> {
    let fan_in: usize = weight.shape()[1..].iter().product();
    reset_uniform(weight, bias, uniform_bound(fan_in))
}

/// Layers applied in order (`nn.Sequential`). Each child has a name: its index
/// (`"0"`, `"1"`, ...) when added with [`add`](Sequential::add), or the name given
/// to [`add_named`](Sequential::add_named) (`"features"`, `"conv1"`), as PyTorch's
/// `nn.Sequential(OrderedDict(...))`. Parameters and buffers are named
/// `"<child>.<name>"`, and `forward` enters each child's name as the module path
/// of the meta device's accounting ([`crate::meta::enter_module`]).
///
/// ```
/// use ember::nn::{self, Module};
/// use ember::prelude::*;
/// let dev = Device::Meta;
/// let head = nn::Sequential::new()
///     .add(nn::Dropout::new(0.5)?)
///     .add(nn::Linear::new(8, 2, &dev)?);
/// let model = nn::Sequential::new()
///     .add_named("features", nn::Linear::new(4, 8, &dev)?)?
///     .add_named("classifier", head)?;
/// let names: Vec<String> = model.named_parameters().into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, ["features.weight", "features.bias", "classifier.1.weight", "classifier.1.bias"]);
/// # Ok::<(), ember::Error>(())
/// ```
#[derive(Default)]
pub struct Sequential {
    layers: Vec<(String, Box<dyn Module>)>,
}

impl Sequential {
    pub fn new() -> Sequential {
        Sequential::default()
    }

    /// Appends a layer, named by its index (`"0"`, `"1"`, ...).
    #[allow(clippy::should_implement_trait)]
    pub fn add(mut self, layer: impl Module + 'static) -> Sequential {
        let name = self.layers.len().to_string();
        self.layers.push((name, Box::new(layer)));
        self
    }

    /// Appends a layer under `name` (`self.add_module(name, layer)`), which then
    /// prefixes its parameter and buffer names and its module path.
    ///
    /// Errors for an empty name, a name with a `.` (the separator of paths), a name
    /// already used, and a number other than the layer's index (which could clash
    /// with the index names of [`add`](Sequential::add)).
    pub fn add_named(
        mut self,
        name: impl Into<String>,
        layer: impl Module + 'static,
    ) -> Result<Sequential> {
        let name = name.into();
        let index = self.layers.len();
        let problem = if name.is_empty() {
            Some("a child's name can't be empty".to_string())
        } else if name.contains('.') {
            Some("a child's name can't contain \".\"".to_string())
        } else if self.layers.iter().any(|(n, _)| *n == name) {
            Some("a child of that name exists already".to_string())
        } else if name.bytes().all(|c| c.is_ascii_digit()) && name != index.to_string() {
            Some(format!(
                "a numeric name must be the child's index ({index}), as `add` names it"
            ))
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(Error::invalid(
                "Sequential::add_named",
                format!("{problem}: {name:?}"),
            ));
        }
        self.layers.push((name, Box::new(layer)));
        Ok(self)
    }

    /// The number of layers.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// The children's names, in order (the names of `named_children()`).
    pub fn names(&self) -> impl Iterator<Item = &str> + '_ {
        self.layers.iter().map(|(n, _)| n.as_str())
    }

    /// The child called `name` (an index name such as `"0"`, or a name given to
    /// [`add_named`](Sequential::add_named)).
    pub fn get(&self, name: &str) -> Option<&dyn Module> {
        self.layers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, l)| l.as_ref())
    }

    fn prefixed(&self, f: impl Fn(&dyn Module) -> Vec<(String, Tensor)>) -> Vec<(String, Tensor)> {
        let mut all = Vec::new();
        for (name, l) in &self.layers {
            all.extend(
                f(l.as_ref())
                    .into_iter()
                    .map(|(n, t)| (format!("{name}.{n}"), t)),
            );
        }
        all
    }
}

impl Module for Sequential {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for (name, layer) in &self.layers {
            // meta allocations say which layer asked (`"3"`, `"features.3"`, ...);
            // the previous output moves in, so that it drops in the layer's scope
            h = super::in_module(name, move || layer.forward(&h))?;
        }
        Ok(h)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        self.prefixed(|l| l.named_parameters())
    }

    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        self.prefixed(|l| l.named_buffers())
    }

    fn materialize_lazy(&self, shapes: &[(&str, &[usize])]) -> Result<()> {
        let children = self.layers.iter().map(|(n, l)| (n, l.as_ref()));
        super::materialize_children(children, shapes)
    }

    fn to_device(&mut self, device: &Device) -> Result<()> {
        super::to_device_all(
            self.layers
                .iter_mut()
                .map(|(_, l)| l.as_mut() as &mut dyn Module)
                .collect(),
            device,
        )
    }

    fn to_empty(&mut self, device: &Device) -> Result<()> {
        let shared = super::shared_in(&*self);
        let layers = self.layers.iter_mut();
        super::converting(shared, || {
            layers.into_iter().try_for_each(|(_, l)| l.to_empty(device))
        })
    }

    fn to_dtype(&mut self, dtype: DType) -> Result<()> {
        super::to_dtype_all(
            self.layers
                .iter_mut()
                .map(|(_, l)| l.as_mut() as &mut dyn Module)
                .collect(),
            dtype,
        )
    }

    fn reset_parameters(&mut self) -> Result<()> {
        self.layers
            .iter_mut()
            .try_for_each(|(_, l)| l.reset_parameters())
    }

    fn to_memory_format(&mut self, format: crate::layout::MemoryFormat) -> Result<()> {
        let shared = super::shared_in(&*self);
        let mut layers = self.layers.iter_mut();
        super::converting(shared, || {
            layers.try_for_each(|(_, l)| l.to_memory_format(format))
        })
    }

    fn set_training(&mut self, training: bool) {
        self.layers
            .iter_mut()
            .for_each(|(_, l)| l.set_training(training))
    }
}

macro_rules! activation {
    ($(#[$doc:meta])* $name:ident, $f:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default)]
        pub struct $name;
        impl Module for $name {
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                x.$f()
            }
        }
    };
}
/// An activation PyTorch's module can apply in place (`inplace=True`): a struct
/// with its `inplace` flag, and a constant of the same name that is the module
/// with the flag off, so that `nn::ReLU` stays a value as `nn.ReLU()` is.
macro_rules! inplace_activation {
    ($(#[$doc:meta])* $name:ident, $f:ident, $f_:ident) => {
        $(#[$doc])*
        ///
        #[doc = concat!("`", stringify!($name), "` as a value is the module with `inplace: false`; [`", stringify!($name), "::inplace()`] writes its result into its input and returns that tensor (PyTorch's `inplace=True`, as torchvision's models use it): no new buffer, and autograd keeps what the rule reads (see [`Tensor::", stringify!($f_), "`]). A leaf that requires grad is refused, as in PyTorch. Where autograd records through a view (a `Linear`'s output for inputs of rank 3 or more, say), or a tensor with live views, which ember cannot yet write in place, it returns a new tensor as `inplace: false` does and leaves its input as it was.")]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct $name {
            /// Whether `forward` writes into its input.
            pub inplace: bool,
        }

        #[doc = concat!("The [`", stringify!($name), "`](struct@", stringify!($name), ") module that returns a new tensor (`inplace: false`).")]
        #[allow(non_upper_case_globals)]
        pub const $name: $name = $name { inplace: false };

        impl $name {
            #[doc = concat!("The module that writes into its input (`nn.", stringify!($name), "(inplace=True)`).")]
            pub const fn inplace() -> $name {
                $name { inplace: true }
            }
        }

        impl Module for $name {
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                if self.inplace && !x.inplace_blocked_by_views() {
                    x.$f_()?;
                    Ok(x.clone())
                } else {
                    x.$f()
                }
            }
        }
    };
}
inplace_activation!(/// `max(x, 0)` (`nn.ReLU`).
    ReLU, relu, relu_);
activation!(/// The logistic function.
    Sigmoid, sigmoid);
activation!(/// Hyperbolic tangent.
    Tanh, tanh);
activation!(/// GELU, exact (erf) form.
    GELU, gelu);
inplace_activation!(/// SiLU (swish): `x · sigmoid(x)` (`nn.SiLU`).
    SiLU, silu, silu_);
inplace_activation!(/// `relu6(x + 3) / 6` (`nn.Hardsigmoid`).
    Hardsigmoid, hardsigmoid, hardsigmoid_);
inplace_activation!(/// `x · relu6(x + 3) / 6` (`nn.Hardswish`, MobileNetV3's activation).
    Hardswish, hardswish, hardswish_);
inplace_activation!(/// `min(max(x, 0), 6)` (`nn.ReLU6`, MobileNetV2's activation).
    ReLU6, relu6, relu6_);
inplace_activation!(/// SELU: `λ x` where `x > 0`, else `λ α (e^x - 1)` (`nn.SELU`).
    SELU, selu, selu_);
inplace_activation!(/// Mish: `x · tanh(softplus(x))` (`nn.Mish`).
    Mish, mish, mish_);

/// Returns its input (`nn.Identity`): a placeholder where a model may or may not
/// have a layer.
#[derive(Clone, Copy, Debug, Default)]
pub struct Identity;

impl Module for Identity {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.clone())
    }
}

/// `x` where `x > 0`, else `negative_slope · x` (`nn.LeakyReLU`; the default slope
/// is 0.01).
#[derive(Clone, Copy, Debug)]
pub struct LeakyReLU {
    pub negative_slope: f64,
}

impl Default for LeakyReLU {
    fn default() -> Self {
        LeakyReLU {
            negative_slope: 0.01,
        }
    }
}

impl Module for LeakyReLU {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.leaky_relu(self.negative_slope)
    }
}

/// `log(1 + e^(βx)) / β`, linear above `threshold` (`nn.Softplus`; defaults
/// `beta = 1`, `threshold = 20`).
#[derive(Clone, Copy, Debug)]
pub struct Softplus {
    pub beta: f64,
    pub threshold: f64,
}

impl Default for Softplus {
    fn default() -> Self {
        Softplus {
            beta: 1.0,
            threshold: 20.0,
        }
    }
}

impl Module for Softplus {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.softplus(self.beta, self.threshold)
    }
}

/// `x` where `x > 0`, else `alpha · (e^x - 1)` (`nn.ELU`; default `alpha = 1`).
#[derive(Clone, Copy, Debug)]
pub struct ELU {
    pub alpha: f64,
}

impl Default for ELU {
    fn default() -> Self {
        ELU { alpha: 1.0 }
    }
}

impl Module for ELU {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.elu(self.alpha)
    }
}

/// `x` clamped to `[min_val, max_val]` (`nn.Hardtanh`; defaults -1 and 1),
/// with PyTorch's gradient (0 at the bounds); `inplace` writes into the input
/// as [`ReLU::inplace()`](ReLU::inplace) does.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Hardtanh {
    /// The lower bound.
    pub min_val: f64,
    /// The upper bound.
    pub max_val: f64,
    /// Whether `forward` writes into its input.
    pub inplace: bool,
}

impl Default for Hardtanh {
    fn default() -> Self {
        Hardtanh {
            min_val: -1.0,
            max_val: 1.0,
            inplace: false,
        }
    }
}

impl Module for Hardtanh {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        super::functional::hardtanh(x, self.min_val, self.max_val, self.inplace)
    }
}

/// `x` where `x > 0`, else `alpha · (e^(x/alpha) - 1)` (`nn.CELU`; default
/// `alpha = 1`); `inplace` writes into the input as [`ReLU::inplace()`](ReLU::inplace) does.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CELU {
    /// The scale of the negative part (and of its input).
    pub alpha: f64,
    /// Whether `forward` writes into its input.
    pub inplace: bool,
}

impl Default for CELU {
    fn default() -> Self {
        CELU {
            alpha: 1.0,
            inplace: false,
        }
    }
}

impl Module for CELU {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        super::functional::celu(x, self.alpha, self.inplace)
    }
}

/// Softmax along a dim (`nn.Softmax(dim)`).
#[derive(Clone, Copy, Debug)]
pub struct Softmax(pub i64);

impl Module for Softmax {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.softmax(self.0)
    }
}

/// Flattens dims `start..=end` (`nn.Flatten()`: from 1 to -1).
#[derive(Clone, Copy, Debug)]
pub struct Flatten {
    pub start: i64,
    pub end: i64,
}

impl Default for Flatten {
    fn default() -> Self {
        Flatten { start: 1, end: -1 }
    }
}

impl Module for Flatten {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.flatten(self.start, self.end)
    }
}

/// Zeroes each element with probability `p` in training and scales the rest by
/// `1 / (1 - p)`; the identity in evaluation (`nn.Dropout`).
#[derive(Clone, Debug)]
pub struct Dropout {
    p: f64,
    training: bool,
    generator: Option<crate::backend::generator::Generator>,
}

impl Dropout {
    pub fn new(p: f64) -> Result<Dropout> {
        if !(0.0..=1.0).contains(&p) {
            return Err(Error::invalid(
                "Dropout",
                format!("dropout probability has to be between 0 and 1, but got {p}"),
            ));
        }
        Ok(Dropout {
            p,
            training: true,
            generator: None,
        })
    }

    /// Draws the masks from `generator` instead of the global stream.
    pub fn generator(mut self, generator: &crate::backend::generator::Generator) -> Dropout {
        self.generator = Some(generator.clone());
        self
    }
}

impl Module for Dropout {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if !self.training || self.p == 0.0 {
            return Ok(x.clone());
        }
        if let Some(y) = super::functional::dropout_corner(x, self.p)? {
            return Ok(y);
        }
        let draw = || Tensor::uniform(0.0, 1.0, x.shape(), DType::F32, &x.device());
        let u = match &self.generator {
            Some(g) => g.scope(draw)?,
            None => draw()?,
        };
        let keep = u.ge(self.p)?;
        x.mul(&keep.to_dtype(x.dtype())?.mul(1.0 / (1.0 - self.p))?)
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }
}

/// 2-D convolution layer (`nn.Conv2d`): weight `[out, in / groups, k, k]` and an
/// optional bias `[out]`, uniform in `±1/sqrt(fan_in)` with `fan_in = in / groups · k · k`.
pub struct Conv2d {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub options: crate::tensor::Conv2dOptions,
    /// `padding="same"`: the output keeps the input's size (stride 1; the
    /// padding of `options` is then not used). See [`Conv2d::padding_same`].
    pub same: bool,
    /// How the input is padded (`padding_mode=`; zeros by default).
    pub padding_mode: super::PaddingMode,
}

impl Conv2d {
    /// A square `kernel × kernel` convolution with bias and the given options.
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        options: crate::tensor::Conv2dOptions,
        device: &Device,
    ) -> Result<Conv2d> {
        Conv2d::with_bias(in_channels, out_channels, kernel, true, options, device)
    }

    /// A square `kernel × kernel` convolution with or without bias
    /// (`nn.Conv2d(..., bias=False)`, as before a batch norm). The weight is drawn
    /// first, then the bias, as PyTorch does, so the same seed gives the same
    /// weight either way.
    ///
    /// ```
    /// use ember::nn::{self, Module};
    /// use ember::prelude::*;
    /// let conv = nn::Conv2d::with_bias(3, 64, 7, false, Conv2dOptions::default(), &Device::Meta)?;
    /// assert!(conv.bias.is_none());
    /// assert_eq!(conv.num_parameters(), 64 * 3 * 7 * 7);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn with_bias(
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        bias: bool,
        options: crate::tensor::Conv2dOptions,
        device: &Device,
    ) -> Result<Conv2d> {
        let g = options.groups;
        if g == 0 || !in_channels.is_multiple_of(g) || !out_channels.is_multiple_of(g) {
            return Err(Error::invalid(
                "Conv2d",
                format!("in_channels ({in_channels}) and out_channels ({out_channels}) must be divisible by groups ({g})"),
            ));
        }
        // (refused here with the kernel in the message, before `draw` takes
        // the same fan-in)
        (in_channels / g)
            .checked_mul(kernel)
            .and_then(|f| f.checked_mul(kernel))
            .ok_or_else(|| {
                Error::invalid(
                    "Conv2d",
                    format!(
                        "a {kernel}x{kernel} kernel over {in_channels} channels overflows a size"
                    ),
                )
            })?;
        let shape = [out_channels, in_channels / g, kernel, kernel];
        let (weight, bias) = draw("Conv2d", &shape, out_channels, bias, device)?;
        Ok(Conv2d {
            weight,
            bias,
            options,
            same: false,
            padding_mode: super::PaddingMode::Zeros,
        })
    }

    /// The layer padding its input in `mode` (`nn.Conv2d(...,
    /// padding_mode=...)`); see [`PaddingMode`](super::PaddingMode).
    pub fn padding_mode(mut self, mode: super::PaddingMode) -> Conv2d {
        self.padding_mode = mode;
        self
    }

    /// The layer with `padding="same"` (`nn.Conv2d(..., padding="same")`): refused
    /// for a stride other than 1, as in PyTorch.
    pub fn padding_same(mut self) -> Result<Conv2d> {
        if self.options.stride != (1, 1) {
            return Err(Error::invalid(
                "Conv2d",
                "padding='same' is not supported for strided convolutions",
            ));
        }
        self.same = true;
        Ok(self)
    }
}

impl Module for Conv2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if self.same && self.options.stride != (1, 1) {
            return Err(Error::invalid(
                "conv2d",
                "padding='same' is not supported for strided convolutions",
            ));
        }
        let o = self.options;
        let k = &self.weight.shape()[self.weight.rank().saturating_sub(2)..];
        let (dil, pad) = ([o.dilation.0, o.dilation.1], [o.padding.0, o.padding.1]);
        if let Some(xp) = self.padding_mode.pad_input(x, k, &dil, &pad, self.same)? {
            let unpadded = crate::tensor::Conv2dOptions {
                padding: (0, 0),
                ..o
            };
            return xp.conv2d(&self.weight, self.bias.as_ref(), unpadded);
        }
        if self.same {
            // (refuses a stride set since `padding_same`: the options are public)
            return x.conv2d_same_opts(&self.weight, self.bias.as_ref(), self.options);
        }
        x.conv2d(&self.weight, self.bias.as_ref(), self.options)
    }

    weight_bias_methods!();

    fn reset_parameters(&mut self) -> Result<()> {
        reset_conv(&self.weight, self.bias.as_ref())
    }
}

/// 2-D max pooling layer (`nn.MaxPool2d`).
#[derive(Clone, Copy, Debug)]
pub struct MaxPool2d(pub crate::tensor::Pool2dOptions);

impl Module for MaxPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.max_pool2d(self.0)
    }
}

/// 2-D average pooling layer (`nn.AvgPool2d`).
#[derive(Clone, Copy, Debug)]
pub struct AvgPool2d(pub crate::tensor::Pool2dOptions);

impl Module for AvgPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.avg_pool2d(self.0)
    }
}

/// 2-D average pooling to a fixed output size (`nn.AdaptiveAvgPool2d((oh, ow))`) over
/// `[N, C, H, W]` or `[C, H, W]`: output cell `(i, j)` averages input rows
/// `floor(i·H/oh) .. ceil((i+1)·H/oh)` and the columns likewise, PyTorch's windows
/// (which overlap where `H` is not a multiple of `oh`).
///
/// A composite of tensor ops, so it runs (and differentiates) on every device: a
/// mean over `H` and `W` for `(1, 1)`, `avg_pool2d` with kernel = stride = `H/oh ×
/// W/ow` when the sizes divide, otherwise a mean over each window of rows, then of
/// columns (narrow, mean, cat).
///
/// ```
/// use ember::nn::{self, Module};
/// use ember::prelude::*;
/// let x = Tensor::arange(0f32, 10.0, &Device::Cpu)?.reshape([1, 1, 1, 10])?;
/// let y = nn::AdaptiveAvgPool2d::new((1, 3)).forward(&x)?;
/// // windows 0..4, 3..7, 6..10
/// assert_eq!(y.to_vec::<f32>()?, [1.5, 4.5, 7.5]);
/// # Ok::<(), ember::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdaptiveAvgPool2d {
    /// The output's `(height, width)`.
    pub output: (usize, usize),
}

impl AdaptiveAvgPool2d {
    pub fn new(output: (usize, usize)) -> AdaptiveAvgPool2d {
        AdaptiveAvgPool2d { output }
    }
}

impl Module for AdaptiveAvgPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        adaptive_avg_pool2d(x, self.output)
    }
}

fn adaptive_avg_pool2d(x: &Tensor, (oh, ow): (usize, usize)) -> Result<Tensor> {
    const OP: &str = "adaptive_avg_pool2d";
    let r = x.rank();
    if r != 3 && r != 4 {
        return Err(Error::invalid(
            OP,
            format!("expected a 3-D or 4-D input, got shape {:?}", x.shape()),
        ));
    }
    if !x.dtype().is_float() {
        return Err(Error::dtype(
            OP,
            x.dtype(),
            "pooling needs a floating-point input",
        ));
    }
    if oh == 0 || ow == 0 {
        return Err(Error::invalid(
            OP,
            format!("the output size must be positive, got ({oh}, {ow})"),
        ));
    }
    let (h, w) = (x.shape()[r - 2], x.shape()[r - 1]);
    if h == 0 || w == 0 {
        return Err(Error::invalid(
            OP,
            format!(
                "expected an input with non-zero height and width, got shape {:?}",
                x.shape()
            ),
        ));
    }
    let (dh, dw) = (r as i64 - 2, r as i64 - 1);
    if (oh, ow) == (1, 1) {
        // `[N, C, 1, 1]` in the input's memory format, as PyTorch's output
        return x.mean([dh, dw], true)?.laid_out(x.suggest_memory_format());
    }
    if h.is_multiple_of(oh) && w.is_multiple_of(ow) {
        return x.avg_pool2d(crate::tensor::Pool2dOptions::rect(h / oh, w / ow));
    }
    // the windows of each dim in turn: a mean over a rectangle is the mean over its
    // rows of the means over its columns
    let pool_dim = |t: &Tensor, dim: i64, size: usize, out: usize| -> Result<Tensor> {
        if size == out {
            return Ok(t.clone());
        }
        let cells = (0..out)
            .map(|i| {
                let start = i * size / out;
                let end = ((i + 1) * size).div_ceil(out);
                t.narrow(dim, start as i64, end - start)?.mean(dim, true)
            })
            .collect::<Result<Vec<_>>>()?;
        Tensor::cat(&cells.iter().collect::<Vec<_>>(), dim)
    };
    let y = pool_dim(x, dh, h, oh)?;
    pool_dim(&y, dw, w, ow)?.laid_out(x.suggest_memory_format())
}

/// A [`Linear`] layer whose `in_features` is taken from the first input it sees
/// (`nn.LazyLinear`), or from the `weight` of a state loaded into it (a state
/// dict or a checkpoint: [`Module::materialize_lazy`]). Until then it has no
/// parameters: run one forward pass (a dry run on a sample batch), or load, before
/// handing `parameters()` to an optimizer.
pub struct LazyLinear {
    out_features: usize,
    bias: bool,
    device: Device,
    /// The parameters' dtype once made ([`Module::to_dtype`] before the first
    /// forward sets it).
    dtype: DType,
    inner: std::sync::OnceLock<Linear>,
}

impl LazyLinear {
    /// A layer with bias, materialised on `device` at the first forward.
    pub fn new(out_features: usize, device: &Device) -> LazyLinear {
        LazyLinear::with_bias(out_features, true, device)
    }

    /// A layer with or without bias.
    pub fn with_bias(out_features: usize, bias: bool, device: &Device) -> LazyLinear {
        LazyLinear {
            out_features,
            bias,
            device: *device,
            dtype: DType::F32,
            inner: std::sync::OnceLock::new(),
        }
    }

    /// The inferred input size, once known.
    pub fn in_features(&self) -> Option<usize> {
        self.inner.get().map(|l| l.weight.shape()[1])
    }

    /// The materialised layer, once known.
    pub fn linear(&self) -> Option<&Linear> {
        self.inner.get()
    }

    /// Makes the layer for inputs of `in_features` (freshly initialised, in
    /// the dtype and on the device set so far).
    fn make(&self, in_features: usize) -> Result<()> {
        let mut layer = Linear::with_bias(in_features, self.out_features, self.bias, &self.device)?;
        layer.to_dtype(self.dtype)?;
        // another thread may have won the race; its layer is used then
        let _ = self.inner.set(layer);
        Ok(())
    }
}

impl Module for LazyLinear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if self.inner.get().is_none() {
            let Some(&in_features) = x.shape().last() else {
                return Err(Error::invalid(
                    "LazyLinear",
                    "the input must have at least one dim (the features)",
                ));
            };
            self.make(in_features)?;
        }
        match self.inner.get() {
            Some(layer) => layer.forward(x),
            None => Err(Error::invalid(
                "LazyLinear",
                "the layer failed to initialise",
            )),
        }
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        self.inner
            .get()
            .map_or_else(Vec::new, |l| l.named_parameters())
    }

    /// Made from a `weight` entry of `[out_features, in]`, whatever `in` is.
    fn materialize_lazy(&self, shapes: &[(&str, &[usize])]) -> Result<()> {
        if self.inner.get().is_some() {
            return Ok(());
        }
        match shapes.iter().rev().find(|(n, _)| *n == "weight") {
            Some((_, &[out, in_features])) if out == self.out_features => {
                // zeros the load overwrites: no draw (the generator stays where
                // it is, as PyTorch's lazy load leaves it)
                let w = Tensor::zeros([out, in_features], self.dtype, &self.device)?;
                let b = if self.bias {
                    Some(Tensor::zeros([out], self.dtype, &self.device)?)
                } else {
                    None
                };
                let _ = self.inner.set(Linear::from_weights(&w, b.as_ref())?);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn to_device(&mut self, device: &Device) -> Result<()> {
        self.device = *device;
        match self.inner.get_mut() {
            Some(l) => l.to_device(device),
            None => Ok(()),
        }
    }

    fn to_empty(&mut self, device: &Device) -> Result<()> {
        self.device = *device;
        match self.inner.get_mut() {
            Some(l) => l.to_empty(device),
            None => Ok(()),
        }
    }

    fn to_dtype(&mut self, dtype: DType) -> Result<()> {
        super::float_target(dtype)?;
        self.dtype = dtype;
        match self.inner.get_mut() {
            Some(l) => l.to_dtype(dtype),
            None => Ok(()),
        }
    }

    fn reset_parameters(&mut self) -> Result<()> {
        match self.inner.get_mut() {
            Some(l) => l.reset_parameters(),
            None => Ok(()),
        }
    }
}
