//! Layers and activations.

use super::{assign, empty_parameter, move_parameter, parameter, Module};
use crate::{DType, Device, Error, Result, Tensor};

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
        let bound = uniform_bound(in_features);
        let weight = parameter(Tensor::uniform(
            -bound,
            bound,
            [out_features, in_features],
            DType::F32,
            device,
        )?)?;
        let bias = if bias {
            Some(parameter(Tensor::uniform(
                -bound,
                bound,
                [out_features],
                DType::F32,
                device,
            )?)?)
        } else {
            None
        };
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

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let in_features = self.weight.shape()[1];
        if x.shape().last() != Some(&in_features) {
            return Err(Error::shape(
                "Linear",
                x.shape(),
                self.weight.shape(),
                format!("the input's last dim must be in_features = {in_features}"),
            ));
        }
        let y = x.matmul(&self.weight.t()?)?;
        match &self.bias {
            Some(b) => y.add(b),
            None => Ok(y),
        }
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = vec![("weight".to_string(), self.weight.clone())];
        if let Some(b) = &self.bias {
            v.push(("bias".to_string(), b.clone()));
        }
        v
    }

    fn to_device(&mut self, device: &Device) -> Result<()> {
        self.weight = move_parameter(&self.weight, device)?;
        if let Some(b) = &self.bias {
            self.bias = Some(move_parameter(b, device)?);
        }
        Ok(())
    }

    fn to_empty(&mut self, device: &Device) -> Result<()> {
        empty_weight_bias(&mut self.weight, &mut self.bias, device)
    }

    fn reset_parameters(&mut self) -> Result<()> {
        let bound = uniform_bound(self.weight.shape()[1]);
        reset_uniform(&self.weight, self.bias.as_ref(), bound)
    }
}

/// PyTorch's default bound `1/sqrt(fan_in)` of Linear and Conv2d weights and biases
/// (Kaiming-uniform with a = √5), 0 for an empty fan-in.
fn uniform_bound(fan_in: usize) -> f64 {
    if fan_in > 0 {
        1.0 / (fan_in as f64).sqrt()
    } else {
        0.0
    }
}

/// Draws `weight` (then `bias`) again, uniform in `±bound`, in place.
fn reset_uniform(weight: &Tensor, bias: Option<&Tensor>, bound: f64) -> Result<()> {
    for p in std::iter::once(weight).chain(bias) {
        let fresh = Tensor::uniform(-bound, bound, p.shape(), p.dtype(), &p.device())?;
        assign(p, &fresh)?;
    }
    Ok(())
}

/// `to_empty` of a weight and an optional bias.
fn empty_weight_bias(w: &mut Tensor, b: &mut Option<Tensor>, device: &Device) -> Result<()> {
    *w = empty_parameter(w, device)?;
    if let Some(t) = b {
        *t = empty_parameter(t, device)?;
    }
    Ok(())
}

/// Layers applied in order (`nn.Sequential`); parameters are named `"<index>.<name>"`.
#[derive(Default)]
pub struct Sequential {
    layers: Vec<Box<dyn Module>>,
}

impl Sequential {
    pub fn new() -> Sequential {
        Sequential::default()
    }

    /// Appends a layer.
    #[allow(clippy::should_implement_trait)]
    pub fn add(mut self, layer: impl Module + 'static) -> Sequential {
        self.layers.push(Box::new(layer));
        self
    }

    /// The number of layers.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    fn prefixed(&self, f: impl Fn(&dyn Module) -> Vec<(String, Tensor)>) -> Vec<(String, Tensor)> {
        let mut all = Vec::new();
        for (i, l) in self.layers.iter().enumerate() {
            all.extend(
                f(l.as_ref())
                    .into_iter()
                    .map(|(n, t)| (format!("{i}.{n}"), t)),
            );
        }
        all
    }
}

impl Module for Sequential {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for (i, layer) in self.layers.iter().enumerate() {
            // meta allocations say which layer asked (`"3"`, `"3.1"`, ...)
            let _scope = crate::meta::enter_module(i);
            h = layer.forward(&h)?;
        }
        Ok(h)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        self.prefixed(|l| l.named_parameters())
    }

    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        self.prefixed(|l| l.named_buffers())
    }

    fn to_device(&mut self, device: &Device) -> Result<()> {
        self.layers.iter_mut().try_for_each(|l| l.to_device(device))
    }

    fn to_empty(&mut self, device: &Device) -> Result<()> {
        self.layers.iter_mut().try_for_each(|l| l.to_empty(device))
    }

    fn reset_parameters(&mut self) -> Result<()> {
        self.layers
            .iter_mut()
            .try_for_each(|l| l.reset_parameters())
    }

    fn set_training(&mut self, training: bool) {
        self.layers
            .iter_mut()
            .for_each(|l| l.set_training(training))
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
activation!(/// `max(x, 0)`.
    ReLU, relu);
activation!(/// The logistic function.
    Sigmoid, sigmoid);
activation!(/// Hyperbolic tangent.
    Tanh, tanh);
activation!(/// GELU, exact (erf) form.
    GELU, gelu);

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
#[derive(Clone, Copy, Debug)]
pub struct Dropout {
    p: f64,
    training: bool,
}

impl Dropout {
    pub fn new(p: f64) -> Result<Dropout> {
        if !(0.0..=1.0).contains(&p) {
            return Err(Error::invalid(
                "Dropout",
                format!("dropout probability has to be between 0 and 1, but got {p}"),
            ));
        }
        Ok(Dropout { p, training: true })
    }
}

impl Module for Dropout {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if !self.training || self.p == 0.0 {
            return Ok(x.clone());
        }
        if self.p == 1.0 {
            return x.mul(0.0);
        }
        let keep = Tensor::uniform(0.0, 1.0, x.shape(), DType::F32, &x.device())?.ge(self.p)?;
        x.mul(&keep.to_dtype(x.dtype())?.mul(1.0 / (1.0 - self.p))?)
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }
}

/// 2-D convolution layer (`nn.Conv2d`): weight `[out, in / groups, k, k]` and bias
/// `[out]`, uniform in `±1/sqrt(fan_in)` with `fan_in = in / groups · k · k`.
pub struct Conv2d {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub options: crate::Conv2dOptions,
}

impl Conv2d {
    /// A square `kernel × kernel` convolution with bias and the given options.
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        options: crate::Conv2dOptions,
        device: &Device,
    ) -> Result<Conv2d> {
        let g = options.groups;
        if g == 0 || !in_channels.is_multiple_of(g) || !out_channels.is_multiple_of(g) {
            return Err(Error::invalid(
                "Conv2d",
                format!("in_channels ({in_channels}) and out_channels ({out_channels}) must be divisible by groups ({g})"),
            ));
        }
        let bound = uniform_bound(in_channels / g * kernel * kernel);
        let shape = [out_channels, in_channels / g, kernel, kernel];
        Ok(Conv2d {
            weight: parameter(Tensor::uniform(-bound, bound, shape, DType::F32, device)?)?,
            bias: Some(parameter(Tensor::uniform(
                -bound,
                bound,
                [out_channels],
                DType::F32,
                device,
            )?)?),
            options,
        })
    }
}

impl Module for Conv2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.conv2d(&self.weight, self.bias.as_ref(), self.options)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = vec![("weight".to_string(), self.weight.clone())];
        if let Some(b) = &self.bias {
            v.push(("bias".to_string(), b.clone()));
        }
        v
    }

    fn to_device(&mut self, device: &Device) -> Result<()> {
        self.weight = move_parameter(&self.weight, device)?;
        if let Some(b) = &self.bias {
            self.bias = Some(move_parameter(b, device)?);
        }
        Ok(())
    }

    fn to_empty(&mut self, device: &Device) -> Result<()> {
        empty_weight_bias(&mut self.weight, &mut self.bias, device)
    }

    fn reset_parameters(&mut self) -> Result<()> {
        let fan_in: usize = self.weight.shape()[1..].iter().product();
        reset_uniform(&self.weight, self.bias.as_ref(), uniform_bound(fan_in))
    }
}

/// 2-D max pooling layer (`nn.MaxPool2d`).
#[derive(Clone, Copy, Debug)]
pub struct MaxPool2d(pub crate::Pool2dOptions);

impl Module for MaxPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.max_pool2d(self.0)
    }
}

/// 2-D average pooling layer (`nn.AvgPool2d`).
#[derive(Clone, Copy, Debug)]
pub struct AvgPool2d(pub crate::Pool2dOptions);

impl Module for AvgPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.avg_pool2d(self.0)
    }
}

/// A [`Linear`] layer whose `in_features` is taken from the first input it sees
/// (`nn.LazyLinear`). Until then it has no parameters: run one forward pass (a dry
/// run on a sample batch) before handing `parameters()` to an optimizer.
pub struct LazyLinear {
    out_features: usize,
    bias: bool,
    device: Device,
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
            let layer = Linear::with_bias(in_features, self.out_features, self.bias, &self.device)?;
            // another thread may have won the race; its layer is used then
            let _ = self.inner.set(layer);
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

    fn reset_parameters(&mut self) -> Result<()> {
        match self.inner.get_mut() {
            Some(l) => l.reset_parameters(),
            None => Ok(()),
        }
    }
}
