//! torchvision's ResNet: the residual blocks and the network around them.

use crate::nn::{self, BatchNorm2d, Conv2d, Module, Sequential};
use crate::{
    device::Device,
    error::Result,
    tensor::{Conv2dOptions, Pool2dOptions, Tensor},
};

/// A child's forward inside its module scope (`conv1` of `layer1.0` runs as
/// `layer1.0.conv1` for the meta device's accounting), as `Sequential` runs its
/// children.
fn child(name: &str, module: &dyn Module, x: &Tensor) -> Result<Tensor> {
    nn::in_module(name, || module.forward(x))
}

/// A batch norm `name` and the ReLU after it as one op
/// ([`BatchNorm2d::forward_relu`]: a pass less each way than the two modules), in
/// the batch norm's module scope.
fn bn_relu(name: &str, bn: &BatchNorm2d, x: &Tensor) -> Result<Tensor> {
    nn::in_module(name, || bn.forward_relu(x))
}

/// A 3 × 3 convolution without bias, padding 1 (torchvision's `conv3x3`).
fn conv3x3(c_in: usize, c_out: usize, stride: usize, device: &Device) -> Result<Conv2d> {
    let options = Conv2dOptions::default().stride(stride).padding(1);
    Conv2d::with_bias(c_in, c_out, 3, false, options, device)
}

/// A 1 × 1 convolution without bias (torchvision's `conv1x1`).
fn conv1x1(c_in: usize, c_out: usize, stride: usize, device: &Device) -> Result<Conv2d> {
    let options = Conv2dOptions::default().stride(stride);
    Conv2d::with_bias(c_in, c_out, 1, false, options, device)
}

/// The shortcut's projection where the block changes the shape (a stride or a
/// channel count): 1 × 1 convolution and batch norm, children `0` and `1`.
fn downsample(
    c_in: usize,
    c_out: usize,
    stride: usize,
    device: &Device,
) -> Result<Option<Sequential>> {
    if stride == 1 && c_in == c_out {
        return Ok(None);
    }
    Ok(Some(
        Sequential::new()
            .add(conv1x1(c_in, c_out, stride, device)?)
            .add(BatchNorm2d::new(c_out, device)?),
    ))
}

/// Implements `Module` for a block from its `run` (the forward) and its
/// `children`/`children_mut` (the state, in torchvision's order).
macro_rules! block_module {
    ($t:ty) => {
        impl Module for $t {
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                self.run(x)
            }

            nn::delegate_to_children!();
        }
    };
}

/// `children` and `children_mut` of a block: its fields `$f` in order, then
/// `downsample` where there is one.
macro_rules! block_children {
    ($($f:ident),*) => {
        fn children(&self) -> Vec<(&'static str, &dyn Module)> {
            let mut v: Vec<(&'static str, &dyn Module)> = vec![$((stringify!($f), &self.$f)),*];
            if let Some(d) = &self.downsample {
                v.push(("downsample", d));
            }
            v
        }

        fn children_mut(&mut self) -> Vec<(&'static str, &mut dyn Module)> {
            let mut v: Vec<(&'static str, &mut dyn Module)> =
                vec![$((stringify!($f), &mut self.$f)),*];
            if let Some(d) = &mut self.downsample {
                v.push(("downsample", d));
            }
            v
        }
    };
}

/// The end of a block: its last batch norm `bn` of `out`, plus the input (or its
/// `downsample` projection; torchvision's `out += identity`), then ReLU, as one
/// op ([`BatchNorm2d::forward_add_relu`]) in the batch norm's module scope.
fn residual(
    (name, bn): (&str, &BatchNorm2d),
    downsample: Option<&Sequential>,
    x: &Tensor,
    out: &Tensor,
) -> Result<Tensor> {
    let identity = match downsample {
        Some(d) => child("downsample", d, x)?,
        None => x.clone(),
    };
    nn::in_module(name, || bn.forward_add_relu(out, &identity))
}

/// ResNet-18/34's residual block (torchvision's `BasicBlock`): `conv1` (3 × 3,
/// `stride`), `bn1`, ReLU, `conv2` (3 × 3), `bn2`, plus the input, or its
/// `downsample` projection where the shape changes, then ReLU. The forward enters
/// the module scopes `conv1`, `bn1` (with the ReLU after it, one op:
/// [`BatchNorm2d::forward_relu`]), `conv2`, `downsample`, `bn2` (with the sum and
/// the ReLU after it, one op: [`BatchNorm2d::forward_add_relu`]).
pub struct BasicBlock {
    pub conv1: Conv2d,
    pub bn1: BatchNorm2d,
    pub conv2: Conv2d,
    pub bn2: BatchNorm2d,
    pub downsample: Option<Sequential>,
}

impl BasicBlock {
    /// The output has `planes * EXPANSION` channels.
    pub const EXPANSION: usize = 1;

    /// A block from `inplanes` to `planes` channels; `stride` 2 halves the height
    /// and width. The shortcut is projected (`downsample`: 1 × 1 convolution with
    /// `stride`, batch norm) when `stride != 1` or the channels change, as
    /// torchvision's `_make_layer` does.
    pub fn new(
        inplanes: usize,
        planes: usize,
        stride: usize,
        device: &Device,
    ) -> Result<BasicBlock> {
        Ok(BasicBlock {
            conv1: conv3x3(inplanes, planes, stride, device)?,
            bn1: BatchNorm2d::new(planes, device)?,
            conv2: conv3x3(planes, planes, 1, device)?,
            bn2: BatchNorm2d::new(planes, device)?,
            downsample: downsample(inplanes, planes * Self::EXPANSION, stride, device)?,
        })
    }

    fn run(&self, x: &Tensor) -> Result<Tensor> {
        let out = child("conv1", &self.conv1, x)?;
        let out = bn_relu("bn1", &self.bn1, &out)?;
        let out = child("conv2", &self.conv2, &out)?;
        residual(("bn2", &self.bn2), self.downsample.as_ref(), x, &out)
    }

    block_children!(conv1, bn1, conv2, bn2);
}

block_module!(BasicBlock);

/// ResNet-50/101/152's residual block (torchvision's `Bottleneck`, ResNet v1.5):
/// `conv1` (1 × 1 to `planes`), `bn1`, ReLU, `conv2` (3 × 3, `stride`), `bn2`,
/// ReLU, `conv3` (1 × 1 to `4 · planes`), `bn3`, plus the input or its
/// `downsample` projection, then ReLU. The forward enters the module scopes of
/// those names (`bn1` and `bn2` with the ReLU after each, one op:
/// [`BatchNorm2d::forward_relu`]; `downsample` before `bn3`, which takes the sum
/// and the last ReLU: [`BatchNorm2d::forward_add_relu`]).
pub struct Bottleneck {
    pub conv1: Conv2d,
    pub bn1: BatchNorm2d,
    pub conv2: Conv2d,
    pub bn2: BatchNorm2d,
    pub conv3: Conv2d,
    pub bn3: BatchNorm2d,
    pub downsample: Option<Sequential>,
}

impl Bottleneck {
    /// The output has `planes * EXPANSION` channels.
    pub const EXPANSION: usize = 4;

    /// A block from `inplanes` to `4 · planes` channels through a `planes`-wide 3
    /// × 3 convolution with `stride`; the shortcut is projected when `stride != 1`
    /// or `inplanes != 4 · planes`.
    pub fn new(
        inplanes: usize,
        planes: usize,
        stride: usize,
        device: &Device,
    ) -> Result<Bottleneck> {
        let out = planes * Self::EXPANSION;
        Ok(Bottleneck {
            conv1: conv1x1(inplanes, planes, 1, device)?,
            bn1: BatchNorm2d::new(planes, device)?,
            conv2: conv3x3(planes, planes, stride, device)?,
            bn2: BatchNorm2d::new(planes, device)?,
            conv3: conv1x1(planes, out, 1, device)?,
            bn3: BatchNorm2d::new(out, device)?,
            downsample: downsample(inplanes, out, stride, device)?,
        })
    }

    fn run(&self, x: &Tensor) -> Result<Tensor> {
        let out = child("conv1", &self.conv1, x)?;
        let out = bn_relu("bn1", &self.bn1, &out)?;
        let out = child("conv2", &self.conv2, &out)?;
        let out = bn_relu("bn2", &self.bn2, &out)?;
        let out = child("conv3", &self.conv3, &out)?;
        residual(("bn3", &self.bn3), self.downsample.as_ref(), x, &out)
    }

    block_children!(conv1, bn1, conv2, bn2, conv3, bn3);
}

block_module!(Bottleneck);

/// What `resnet` needs of a block type.
pub(super) trait Block: Module + Sized + 'static {
    const EXPANSION: usize;
    fn build(inplanes: usize, planes: usize, stride: usize, device: &Device) -> Result<Self>;
}

impl Block for BasicBlock {
    const EXPANSION: usize = BasicBlock::EXPANSION;
    fn build(inplanes: usize, planes: usize, stride: usize, device: &Device) -> Result<Self> {
        BasicBlock::new(inplanes, planes, stride, device)
    }
}

impl Block for Bottleneck {
    const EXPANSION: usize = Bottleneck::EXPANSION;
    fn build(inplanes: usize, planes: usize, stride: usize, device: &Device) -> Result<Self> {
        Bottleneck::new(inplanes, planes, stride, device)
    }
}

/// torchvision's `ResNet(block, layers, num_classes)`: `conv1` (7 × 7, stride 2,
/// padding 3, no bias), `bn1`, `relu`, `maxpool` (3, stride 2, padding 1),
/// `layer1` .. `layer4` (64, 128, 256, 512 planes; the first block of layers 2-4
/// with stride 2), `avgpool` (adaptive, 1 × 1), `flatten`, `fc`. With
/// `checkpoint`, each block is an activation checkpoint ([`nn::Checkpoint`],
/// the same parameter names).
pub(super) fn resnet<B: Block>(
    layers: &[usize; 4],
    num_classes: usize,
    checkpoint: bool,
    device: &Device,
) -> Result<Sequential> {
    let stem = Conv2dOptions::default().stride(2).padding(3);
    let mut model = Sequential::new()
        .add_named("conv1", Conv2d::with_bias(3, 64, 7, false, stem, device)?)?
        .add_named("bn1", BatchNorm2d::new(64, device)?)?
        .add_named("relu", nn::ReLU::inplace())?
        .add_named(
            "maxpool",
            nn::MaxPool2d(Pool2dOptions::new(3).stride(2).padding(1)),
        )?;
    let mut inplanes = 64;
    for (i, (&blocks, planes)) in layers.iter().zip([64, 128, 256, 512]).enumerate() {
        let stride = if i == 0 { 1 } else { 2 };
        let mut layer = Sequential::new();
        for b in 0..blocks {
            let block = B::build(inplanes, planes, if b == 0 { stride } else { 1 }, device)?;
            layer = if checkpoint {
                layer.add(nn::Checkpoint::new(block))
            } else {
                layer.add(block)
            };
            inplanes = planes * B::EXPANSION;
        }
        model = model.add_named(format!("layer{}", i + 1), layer)?;
    }
    model
        .add_named("avgpool", nn::AdaptiveAvgPool2d::new((1, 1)))?
        .add_named("flatten", nn::Flatten::default())?
        .add_named(
            "fc",
            nn::Linear::new(512 * B::EXPANSION, num_classes, device)?,
        )
}
