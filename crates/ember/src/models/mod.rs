//! A model zoo: torchvision's AlexNet, VGG and ResNet architectures, GPT-2's
//! smallest layout ([`gpt2_small`], 124M parameters), and the small models of
//! ember's lessons (among them the character GPT of `ember train text`,
//! [`CharGpt`]).
//!
//! The torchvision models have torchvision's exact layers and state-dict names
//! (`features.0.weight`, `layer1.0.downsample.1.running_mean`, `fc.bias`), so
//! their parameter counts and memory match PyTorch's. Built on
//! [`Device::Meta`] they cost no memory and draw no numbers: that is how a memory
//! estimate runs them, with the module paths of the meta device's accounting
//! following the same names (`layer1.0.conv1`).
//!
//! ```
//! use ember::models;
//! use ember::prelude::*;
//! let model = models::resnet18(1000, &Device::Meta)?;
//! assert_eq!(model.num_parameters(), 11_689_512);
//! let x = Tensor::zeros([8, 3, 224, 224], DType::F32, &Device::Meta)?;
//! assert_eq!(model.forward(&x)?.shape(), &[8, 1000]);
//! # Ok::<(), ember::Error>(())
//! ```
//!
//! Initialisation: every layer starts as ember's layers do, which is PyTorch's
//! default layer initialisation (`Conv2d` and `Linear` uniform in
//! `±1/sqrt(fan_in)`, batch norm weight 1 and bias 0), not the initialisation
//! torchvision's constructors apply afterwards (Kaiming-normal convolutions,
//! `N(0, 0.01)` VGG classifier weights). Shapes, names and counts are the same;
//! load a state dict for torchvision's values.
//!
//! [`gpt2_small`] takes token ids `[B, T]` (`int64`, `T` up to 1024) and returns
//! logits `[B, T, 50304]`:
//!
//! ```
//! use ember::models;
//! use ember::prelude::*;
//! let gpt = models::gpt2_small(&Device::Meta)?;
//! assert_eq!(gpt.num_parameters(), 124_475_904);
//! let ids = Tensor::zeros([2, 1024], DType::I64, &Device::Meta)?;
//! assert_eq!(gpt.forward(&ids)?.shape(), &[2, 1024, 50304]);
//! # Ok::<(), ember::Error>(())
//! ```
//!
//! As torchvision's, the ReLUs work in place (`nn::ReLU::inplace()`) and the
//! residual sum is `out += identity` (`add_`). One difference that changes no
//! state or shape: `torch.flatten(x, 1)` of AlexNet, VGG and ResNet is a stateless
//! child named `flatten` (so it has a module path of its own).

mod gpt;
mod hf_gpt2;
mod resnet;

pub use gpt::{CharGpt, GptConfig};
pub use hf_gpt2::{gpt2, gpt2_state_from_hf};
pub use resnet::{BasicBlock, Bottleneck};

use crate::nn::{self, Module, Sequential};
use crate::{
    device::Device,
    error::{Error, Result},
    tensor::{Conv2dOptions, Pool2dOptions},
};

/// The names [`by_name`] knows, in the order it lists them: torchvision's models,
/// then the digits lesson's `mlp` (64 → 128 → classes) and `cnn` ([`digits_cnn`]
/// with `num_classes` outputs), which take `[N, 64]` and `[N, 1, 8, 8]` inputs,
/// then `gpt2_small` ([`gpt2_small`]), which takes token ids `[B, T]`.
pub const NAMES: &[&str] = &[
    "alexnet",
    "vgg11",
    "vgg16",
    "resnet18",
    "resnet50",
    "mlp",
    "cnn",
    "gpt2_small",
];

/// The models of [`NAMES`] that [`checkpointed`] makes with checkpointed blocks.
pub const WITH_BLOCKS: &[&str] = &["resnet18", "resnet50", "gpt2_small"];

/// [`by_name`] with each of the model's blocks an activation checkpoint
/// ([`nn::Checkpoint`]: kept as its input, recomputed in the backward pass):
/// the residual blocks of `resnet18` and `resnet50`, the transformer blocks of
/// `gpt2_small` ([`TransformerEncoder::checkpoint_layers`](crate::nn::TransformerEncoder::checkpoint_layers)).
/// The parameters and their names are [`by_name`]'s; the other models have no
/// blocks, and are an error.
///
/// ```
/// use ember::models;
/// use ember::prelude::*;
/// let r = models::checkpointed("resnet50", 1000, &Device::Meta)?;
/// assert_eq!(r.num_parameters(), 25_557_032);
/// assert!(models::checkpointed("vgg16", 1000, &Device::Meta).is_err());
/// # Ok::<(), ember::Error>(())
/// ```
pub fn checkpointed(name: &str, num_classes: usize, device: &Device) -> Result<Box<dyn Module>> {
    if NAMES.contains(&name) && !WITH_BLOCKS.contains(&name) {
        return Err(Error::invalid(
            "models::checkpointed",
            format!(
                "{name} has no blocks to checkpoint: {} do",
                WITH_BLOCKS.join(", ")
            ),
        ));
    }
    Ok(match name {
        "resnet18" => Box::new(resnet::resnet::<BasicBlock>(
            &[2, 2, 2, 2],
            num_classes,
            true,
            device,
        )?),
        "resnet50" => Box::new(resnet::resnet::<Bottleneck>(
            &[3, 4, 6, 3],
            num_classes,
            true,
            device,
        )?),
        "gpt2_small" => {
            let mut gpt = gpt2_small(device)?;
            gpt.blocks.checkpoint_layers(true);
            Box::new(gpt)
        }
        // (an unknown name: by_name's error, which lists the names)
        _ => return by_name(name, num_classes, device),
    })
}

/// The model called `name` (one of [`NAMES`]) with `num_classes` outputs on
/// `device`; an error listing the names for any other. `gpt2_small` has GPT-2's
/// own vocabulary as its outputs and ignores `num_classes`.
///
/// ```
/// use ember::models;
/// use ember::prelude::*;
/// let vgg = models::by_name("vgg16", 1000, &Device::Meta)?;
/// assert_eq!(vgg.num_parameters(), 138_357_544);
/// assert!(models::by_name("vgg19", 1000, &Device::Meta).is_err());
/// # Ok::<(), ember::Error>(())
/// ```
pub fn by_name(name: &str, num_classes: usize, device: &Device) -> Result<Box<dyn Module>> {
    Ok(match name {
        "alexnet" => Box::new(alexnet(num_classes, device)?),
        "vgg11" => Box::new(vgg11(num_classes, device)?),
        "vgg16" => Box::new(vgg16(num_classes, device)?),
        "resnet18" => Box::new(resnet18(num_classes, device)?),
        "resnet50" => Box::new(resnet50(num_classes, device)?),
        "mlp" => Box::new(mlp(&[64, 128, num_classes], device)?),
        "cnn" => Box::new(cnn(num_classes, device)?),
        "gpt2_small" => Box::new(gpt2_small(device)?),
        _ => {
            return Err(Error::invalid(
                "models::by_name",
                format!(
                    "unknown model {name:?}: expected one of {}",
                    NAMES.join(", ")
                ),
            ))
        }
    })
}

fn relu_conv(
    seq: Sequential,
    c_in: usize,
    c_out: usize,
    kernel: usize,
    options: Conv2dOptions,
    device: &Device,
) -> Result<Sequential> {
    Ok(seq
        .add(nn::Conv2d::new(c_in, c_out, kernel, options, device)?)
        .add(nn::ReLU::inplace()))
}

/// torchvision's `alexnet(num_classes=...)` (the one-GPU variant of "One weird
/// trick...", 61,100,840 parameters for 1000 classes): `features` (five
/// convolutions, three max pools), `avgpool` (adaptive, 6 × 6), `flatten`,
/// `classifier` (dropout 0.5, 9216 → 4096 → 4096 → `num_classes`). Inputs of at
/// least 63 × 63; 224 × 224 as trained.
pub fn alexnet(num_classes: usize, device: &Device) -> Result<Sequential> {
    let conv = Conv2dOptions::default;
    let pool = || nn::MaxPool2d(Pool2dOptions::new(3).stride(2));
    let mut f = Sequential::new();
    f = relu_conv(f, 3, 64, 11, conv().stride(4).padding(2), device)?.add(pool());
    f = relu_conv(f, 64, 192, 5, conv().padding(2), device)?.add(pool());
    f = relu_conv(f, 192, 384, 3, conv().padding(1), device)?;
    f = relu_conv(f, 384, 256, 3, conv().padding(1), device)?;
    f = relu_conv(f, 256, 256, 3, conv().padding(1), device)?.add(pool());
    let classifier = Sequential::new()
        .add(nn::Dropout::new(0.5)?)
        .add(nn::Linear::new(256 * 6 * 6, 4096, device)?)
        .add(nn::ReLU::inplace())
        .add(nn::Dropout::new(0.5)?)
        .add(nn::Linear::new(4096, 4096, device)?)
        .add(nn::ReLU::inplace())
        .add(nn::Linear::new(4096, num_classes, device)?);
    classifier_model(f, (6, 6), classifier)
}

/// `features`, `avgpool`, `flatten`, `classifier`: AlexNet's and VGG's layout.
fn classifier_model(
    features: Sequential,
    pooled: (usize, usize),
    classifier: Sequential,
) -> Result<Sequential> {
    Sequential::new()
        .add_named("features", features)?
        .add_named("avgpool", nn::AdaptiveAvgPool2d::new(pooled))?
        .add_named("flatten", nn::Flatten::default())?
        .add_named("classifier", classifier)
}

/// A VGG layer configuration: a convolution's output channels, or `0` for a max pool.
const VGG_A: &[usize] = &[64, 0, 128, 0, 256, 256, 0, 512, 512, 0, 512, 512, 0];
const VGG_D: &[usize] = &[
    64, 64, 0, 128, 128, 0, 256, 256, 256, 0, 512, 512, 512, 0, 512, 512, 512, 0,
];

/// torchvision's `vgg11()`, configuration A without batch norm (132,863,336
/// parameters for 1000 classes).
pub fn vgg11(num_classes: usize, device: &Device) -> Result<Sequential> {
    vgg(VGG_A, num_classes, device)
}

/// torchvision's `vgg16()`, configuration D without batch norm (138,357,544
/// parameters for 1000 classes).
pub fn vgg16(num_classes: usize, device: &Device) -> Result<Sequential> {
    vgg(VGG_D, num_classes, device)
}

/// `features` (3 × 3 convolutions with padding 1 and ReLU, 2 × 2 max pools),
/// `avgpool` (adaptive, 7 × 7), `flatten`, `classifier` (25088 → 4096 → 4096 →
/// `num_classes`, ReLU and dropout 0.5 between). Inputs of at least 32 × 32.
fn vgg(config: &[usize], num_classes: usize, device: &Device) -> Result<Sequential> {
    let mut f = Sequential::new();
    let mut c_in = 3;
    for &c in config {
        if c == 0 {
            f = f.add(nn::MaxPool2d(Pool2dOptions::new(2)));
        } else {
            f = relu_conv(f, c_in, c, 3, Conv2dOptions::default().padding(1), device)?;
            c_in = c;
        }
    }
    let classifier = Sequential::new()
        .add(nn::Linear::new(512 * 7 * 7, 4096, device)?)
        .add(nn::ReLU::inplace())
        .add(nn::Dropout::new(0.5)?)
        .add(nn::Linear::new(4096, 4096, device)?)
        .add(nn::ReLU::inplace())
        .add(nn::Dropout::new(0.5)?)
        .add(nn::Linear::new(4096, num_classes, device)?);
    classifier_model(f, (7, 7), classifier)
}

/// torchvision's `resnet18()`: [`BasicBlock`]s, two per stage (11,689,512
/// parameters for 1000 classes).
pub fn resnet18(num_classes: usize, device: &Device) -> Result<Sequential> {
    resnet::resnet::<BasicBlock>(&[2, 2, 2, 2], num_classes, false, device)
}

/// torchvision's `resnet50()`: [`Bottleneck`] blocks (ResNet v1.5, the stride on
/// the 3 × 3 convolution), 3, 4, 6 and 3 per stage (25,557,032 parameters for 1000
/// classes).
pub fn resnet50(num_classes: usize, device: &Device) -> Result<Sequential> {
    resnet::resnet::<Bottleneck>(&[3, 4, 6, 3], num_classes, false, device)
}

/// GPT-2's 124M layout as a [`CharGpt`] ([`GptConfig::gpt2_small`]): token and
/// learned position embeddings, 12 pre-norm blocks (PyTorch's
/// `nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.0, activation="gelu",
/// batch_first=True, norm_first=True)` with a causal mask), a final layer norm and
/// the head tied to the token embedding ([`CharGpt::new_tied`]): 124,475,904
/// parameters with the vocabulary padded to 50304. Weights drawn as GPT-2's
/// (normal, standard deviation 0.02; biases zero).
pub fn gpt2_small(device: &Device) -> Result<CharGpt> {
    CharGpt::new_tied(GptConfig::gpt2_small(), device)
}

/// A multilayer perceptron `sizes[0] → sizes[1] → ... → sizes[n-1]`: `Linear`
/// layers with ReLU between (none after the last), children `0`, `1`, ... as
/// `nn.Sequential` numbers them. Parameters are drawn layer by layer, weight then
/// bias, as PyTorch draws them.
///
/// ```
/// use ember::models;
/// use ember::prelude::*;
/// let iris = models::mlp(&[4, 8, 9, 3], &Device::Cpu)?;
/// assert_eq!(iris.len(), 5);
/// assert_eq!(iris.num_parameters(), 4 * 8 + 8 + 8 * 9 + 9 + 9 * 3 + 3);
/// # Ok::<(), ember::Error>(())
/// ```
pub fn mlp(sizes: &[usize], device: &Device) -> Result<Sequential> {
    let mut model = Sequential::new();
    for (i, w) in sizes.windows(2).enumerate() {
        if i > 0 {
            model = model.add(nn::ReLU);
        }
        model = model.add(nn::Linear::new(w[0], w[1], device)?);
    }
    Ok(model)
}

/// The digits lesson's CNN, for `[N, 1, 8, 8]` images and 10 classes: conv 3 × 3
/// (16, padding 1), ReLU, conv 3 × 3 (32, padding 1), ReLU, max pool 2, flatten,
/// 512 → 64, ReLU, 64 → 10.
pub fn digits_cnn(device: &Device) -> Result<Sequential> {
    cnn(10, device)
}

/// [`digits_cnn`] with `num_classes` outputs.
fn cnn(num_classes: usize, device: &Device) -> Result<Sequential> {
    let same = Conv2dOptions::default().padding(1);
    Ok(Sequential::new()
        .add(nn::Conv2d::new(1, 16, 3, same, device)?)
        .add(nn::ReLU)
        .add(nn::Conv2d::new(16, 32, 3, same, device)?)
        .add(nn::ReLU)
        .add(nn::MaxPool2d(Pool2dOptions::new(2)))
        .add(nn::Flatten::default())
        .add(nn::Linear::new(32 * 4 * 4, 64, device)?)
        .add(nn::ReLU)
        .add(nn::Linear::new(64, num_classes, device)?))
}
