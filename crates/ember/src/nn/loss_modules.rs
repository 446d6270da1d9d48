//! The losses as modules, as PyTorch's `nn.CrossEntropyLoss`, `nn.MSELoss`,
//! `nn.TripletMarginLoss`, ...: each holds its options, starts from PyTorch's
//! defaults (`new()`, or `default()`), is set by builder methods named as
//! PyTorch's keyword arguments, and calls its functional loss in `forward`.
//! A loss takes two or three tensors, so it is not a [`Module`](super::Module)
//! (whose `forward` takes one).
//!
//! The tensors a loss holds (class weights, `pos_weight`) are PyTorch's
//! buffers of that loss: [`named_buffers`](CrossEntropyLoss::named_buffers)
//! lists them under PyTorch's names, and they move as a model's buffers do,
//! with `to_device` and `to_dtype` (floating-point tensors only). Every loss
//! has these three methods (a loss without tensors has nothing to move), so
//! code that moves a model and its loss treats every loss alike.
//!
//! ```
//! use ember::nn::{self, Module, Reduction};
//! use ember::prelude::*;
//! let dev = Device::Cpu;
//! let model = nn::Linear::new(4, 3, &dev)?;
//! let weight = Tensor::new(&[1.0f32, 2.0, 0.5], &dev)?;
//! let mut loss_fn = nn::CrossEntropyLoss::new()
//!     .weight(&weight)
//!     .ignore_index(-1)
//!     .label_smoothing(0.1)
//!     .reduction(Reduction::Sum);
//! loss_fn.to_dtype(DType::F32)?;
//! let x = Tensor::randn([5, 4], &dev)?;
//! let y = Tensor::new(&[0i64, 2, -1, 1, 2], &dev)?;
//! let loss = loss_fn.forward(&model.forward(&x)?, &y)?;
//! loss.backward()?;
//! assert_eq!(loss_fn.named_buffers()[0].0, "weight");
//! # Ok::<(), ember::Error>(())
//! ```

use super::loss::{
    bce_with_logits_opts, cross_entropy_opts, mse_loss, nll_loss_opts, LossOptions, Reduction,
};
use super::loss_more::{
    cosine_embedding_loss, gaussian_nll_loss, hinge_embedding_loss, margin_ranking_loss,
    multi_margin_loss, multilabel_margin_loss, multilabel_soft_margin_loss, poisson_nll_loss,
    soft_margin_loss, triplet_margin_loss,
};
use super::loss_pointwise::{
    binary_cross_entropy, huber_loss, kl_div, kl_div_batchmean, l1_loss, smooth_l1_loss,
};
use crate::{
    device::Device,
    dtype::DType,
    error::Result,
    tensor::{Operand, Tensor},
};

/// The state methods of a loss whose optional tensors are `fields` (none for
/// a loss without tensors), each listed under its field's name (PyTorch's
/// buffer names), and builder methods that set them.
macro_rules! loss_state {
    ($name:ident $(, $field:ident)*) => {
        impl $name {
            /// The tensors this loss holds, under PyTorch's buffer names
            /// (`"weight"`, `"pos_weight"`), as its `state_dict()` lists them.
            pub fn named_buffers(&self) -> Vec<(String, Tensor)> {
                #[allow(unused_mut)]
                let mut all = Vec::new();
                $(
                    if let Some(t) = &self.$field {
                        all.push((stringify!($field).to_string(), t.clone()));
                    }
                )*
                all
            }

            /// Moves the tensors this loss holds to `device` (`loss.to(device)`),
            /// all or none.
            pub fn to_device(&mut self, device: &Device) -> Result<()> {
                $(let $field = self.$field.as_ref().map(|t| t.to(device)).transpose()?;)*
                $(self.$field = $field;)*
                let _ = device;
                Ok(())
            }

            /// Converts the floating-point tensors this loss holds to `dtype`
            /// (`loss.to(dtype)`), all or none; `dtype` must be a
            /// floating-point type, as a module's.
            pub fn to_dtype(&mut self, dtype: DType) -> Result<()> {
                super::float_target(dtype)?;
                $(
                    let $field = self
                        .$field
                        .as_ref()
                        .map(|t| super::cast_state(t, dtype))
                        .transpose()?;
                )*
                $(self.$field = $field;)*
                Ok(())
            }

            $(
                #[doc = concat!("Sets `", stringify!($field), "` (shared with the caller's tensor, as PyTorch's buffer is).")]
                pub fn $field(mut self, $field: &Tensor) -> Self {
                    self.$field = Some($field.clone());
                    self
                }
            )*
        }
    };
}

/// Builder methods that set plain options.
macro_rules! setters {
    ($name:ident { $($field:ident: $ty:ty),* $(,)? }) => {
        impl $name {
            /// PyTorch's defaults.
            pub fn new() -> Self {
                Self::default()
            }

            $(
                #[doc = concat!("Sets `", stringify!($field), "`.")]
                pub fn $field(mut self, $field: $ty) -> Self {
                    self.$field = $field;
                    self
                }
            )*
        }
    };
}

/// `nn.CrossEntropyLoss`: [`cross_entropy_opts`] with class `weight`,
/// `ignore_index` (default -100), `reduction` and `label_smoothing`.
#[derive(Clone, Debug)]
pub struct CrossEntropyLoss {
    pub weight: Option<Tensor>,
    pub ignore_index: i64,
    pub reduction: Reduction,
    pub label_smoothing: f64,
}

impl Default for CrossEntropyLoss {
    fn default() -> Self {
        let o = LossOptions::default();
        CrossEntropyLoss {
            weight: None,
            ignore_index: o.ignore_index,
            reduction: o.reduction,
            label_smoothing: o.label_smoothing,
        }
    }
}

setters!(CrossEntropyLoss {
    ignore_index: i64,
    reduction: Reduction,
    label_smoothing: f64
});
loss_state!(CrossEntropyLoss, weight);

impl CrossEntropyLoss {
    /// The cross-entropy of logits `input` against class indices or
    /// probabilities `target`.
    pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        let opts = LossOptions {
            weight: self.weight.as_ref(),
            ignore_index: self.ignore_index,
            reduction: self.reduction,
            label_smoothing: self.label_smoothing,
        };
        cross_entropy_opts(input, target, opts)
    }
}

/// `nn.NLLLoss`: [`nll_loss_opts`] with class `weight`, `ignore_index`
/// (default -100) and `reduction`.
#[derive(Clone, Debug)]
pub struct NLLLoss {
    pub weight: Option<Tensor>,
    pub ignore_index: i64,
    pub reduction: Reduction,
}

impl Default for NLLLoss {
    fn default() -> Self {
        NLLLoss {
            weight: None,
            ignore_index: LossOptions::default().ignore_index,
            reduction: Reduction::Mean,
        }
    }
}

setters!(NLLLoss {
    ignore_index: i64,
    reduction: Reduction
});
loss_state!(NLLLoss, weight);

impl NLLLoss {
    /// The negative log-likelihood of log-probabilities `input` at class
    /// indices `target`.
    pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        let opts = LossOptions {
            weight: self.weight.as_ref(),
            ignore_index: self.ignore_index,
            reduction: self.reduction,
            label_smoothing: 0.0,
        };
        nll_loss_opts(input, target, opts)
    }
}

/// `nn.BCELoss`: [`binary_cross_entropy`] of probabilities, with an
/// element `weight` (broadcast to the input) and `reduction`.
#[derive(Clone, Debug, Default)]
pub struct BCELoss {
    pub weight: Option<Tensor>,
    pub reduction: Reduction,
}

setters!(BCELoss {
    reduction: Reduction
});
loss_state!(BCELoss, weight);

impl BCELoss {
    /// The binary cross-entropy of probabilities `input` against `target`.
    pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        binary_cross_entropy(input, target, self.weight.as_ref(), self.reduction)
    }
}

/// `nn.BCEWithLogitsLoss`: [`bce_with_logits_opts`] with an element
/// `weight`, a `pos_weight` per class of the last dim, and `reduction`.
#[derive(Clone, Debug, Default)]
pub struct BCEWithLogitsLoss {
    pub weight: Option<Tensor>,
    pub pos_weight: Option<Tensor>,
    pub reduction: Reduction,
}

setters!(BCEWithLogitsLoss {
    reduction: Reduction
});
loss_state!(BCEWithLogitsLoss, weight, pos_weight);

impl BCEWithLogitsLoss {
    /// The binary cross-entropy of logits `input` against `target`.
    pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        bce_with_logits_opts(
            input,
            target,
            self.weight.as_ref(),
            self.pos_weight.as_ref(),
            self.reduction,
        )
    }
}

/// `nn.MultiLabelSoftMarginLoss`: [`multilabel_soft_margin_loss`] with a
/// class `weight` and `reduction`.
#[derive(Clone, Debug, Default)]
pub struct MultiLabelSoftMarginLoss {
    pub weight: Option<Tensor>,
    pub reduction: Reduction,
}

setters!(MultiLabelSoftMarginLoss {
    reduction: Reduction
});
loss_state!(MultiLabelSoftMarginLoss, weight);

impl MultiLabelSoftMarginLoss {
    /// The loss of logits `input` against 0/1 labels `target`.
    pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        multilabel_soft_margin_loss(input, target, self.weight.as_ref(), self.reduction)
    }
}

/// `nn.MultiMarginLoss`: [`multi_margin_loss`] with `p` (1 or 2, default
/// 1), `margin` (default 1), a class `weight` and `reduction`.
#[derive(Clone, Debug)]
pub struct MultiMarginLoss {
    pub p: i64,
    pub margin: f64,
    pub weight: Option<Tensor>,
    pub reduction: Reduction,
}

impl Default for MultiMarginLoss {
    fn default() -> Self {
        MultiMarginLoss {
            p: 1,
            margin: 1.0,
            weight: None,
            reduction: Reduction::Mean,
        }
    }
}

setters!(MultiMarginLoss {
    p: i64,
    margin: f64,
    reduction: Reduction
});
loss_state!(MultiMarginLoss, weight);

impl MultiMarginLoss {
    /// The multi-class hinge loss of scores `input` at class indices `target`.
    pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        let w = self.weight.as_ref();
        multi_margin_loss(input, target, self.p, self.margin, w, self.reduction)
    }
}

/// A loss of `reduction` alone, calling `$f(input, target, reduction)`.
macro_rules! plain_loss {
    ($(#[$doc:meta])* $name:ident, $f:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq)]
        pub struct $name {
            pub reduction: Reduction,
        }

        setters!($name { reduction: Reduction });
        loss_state!($name);

        impl $name {
            #[doc = $what]
            pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
                $f(input, target, self.reduction)
            }
        }
    };
}

plain_loss!(
    /// `nn.MSELoss`: [`mse_loss`] with `reduction`.
    MSELoss,
    mse_loss,
    "The squared error of `input` against `target`."
);
plain_loss!(
    /// `nn.L1Loss`: [`l1_loss`] with `reduction`.
    L1Loss,
    l1_loss,
    "The absolute error of `input` against `target`."
);
plain_loss!(
    /// `nn.SoftMarginLoss`: [`soft_margin_loss`] with `reduction`.
    SoftMarginLoss,
    soft_margin_loss,
    "The logistic loss of `input` against targets of 1 or -1."
);
plain_loss!(
    /// `nn.MultiLabelMarginLoss`: [`multilabel_margin_loss`] with `reduction`.
    MultiLabelMarginLoss,
    multilabel_margin_loss,
    "The multi-label hinge loss of scores `input` at the classes `target` lists."
);

/// `nn.SmoothL1Loss`: [`smooth_l1_loss`] with `reduction` and `beta`
/// (default 1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SmoothL1Loss {
    pub reduction: Reduction,
    pub beta: f64,
}

impl Default for SmoothL1Loss {
    fn default() -> Self {
        SmoothL1Loss {
            reduction: Reduction::Mean,
            beta: 1.0,
        }
    }
}

setters!(SmoothL1Loss {
    reduction: Reduction,
    beta: f64
});
loss_state!(SmoothL1Loss);

impl SmoothL1Loss {
    /// The smooth absolute error of `input` against `target`.
    pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        smooth_l1_loss(input, target, self.reduction, self.beta)
    }
}

/// `nn.HuberLoss`: [`huber_loss`] with `reduction` and `delta` (default 1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HuberLoss {
    pub reduction: Reduction,
    pub delta: f64,
}

impl Default for HuberLoss {
    fn default() -> Self {
        HuberLoss {
            reduction: Reduction::Mean,
            delta: 1.0,
        }
    }
}

setters!(HuberLoss {
    reduction: Reduction,
    delta: f64
});
loss_state!(HuberLoss);

impl HuberLoss {
    /// The Huber loss of `input` against `target`.
    pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        huber_loss(input, target, self.reduction, self.delta)
    }
}

/// `nn.KLDivLoss`: [`kl_div`] with `reduction` and `log_target`, or
/// [`kl_div_batchmean`] with [`batchmean`](Self::batchmean) (PyTorch's
/// `reduction='batchmean'`, which takes precedence over `reduction` while
/// set). PyTorch's default is `'mean'`, the mean over every element.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct KLDivLoss {
    pub reduction: Reduction,
    /// The sum divided by the batch size (PyTorch's `'batchmean'`).
    pub batchmean: bool,
    pub log_target: bool,
}

setters!(KLDivLoss { log_target: bool });
loss_state!(KLDivLoss);

impl KLDivLoss {
    /// Sets `reduction` (and leaves `'batchmean'`).
    pub fn reduction(mut self, reduction: Reduction) -> Self {
        self.reduction = reduction;
        self.batchmean = false;
        self
    }

    /// PyTorch's `reduction='batchmean'`: the divergence between
    /// distributions, the sum over every element divided by the batch size.
    pub fn batchmean(mut self) -> Self {
        self.batchmean = true;
        self
    }

    /// The divergence of `target` from the log-probabilities `input`.
    pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        if self.batchmean {
            kl_div_batchmean(input, target, self.log_target)
        } else {
            kl_div(input, target, self.reduction, self.log_target)
        }
    }
}

/// `nn.MarginRankingLoss`: [`margin_ranking_loss`] with `margin` (default 0)
/// and `reduction`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MarginRankingLoss {
    pub margin: f64,
    pub reduction: Reduction,
}

setters!(MarginRankingLoss {
    margin: f64,
    reduction: Reduction
});
loss_state!(MarginRankingLoss);

impl MarginRankingLoss {
    /// The loss of ranking `input1` against `input2` as `target` (1 or -1) says.
    pub fn forward(&self, input1: &Tensor, input2: &Tensor, target: &Tensor) -> Result<Tensor> {
        margin_ranking_loss(input1, input2, target, self.margin, self.reduction)
    }
}

/// `nn.HingeEmbeddingLoss`: [`hinge_embedding_loss`] with `margin` (default
/// 1) and `reduction`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HingeEmbeddingLoss {
    pub margin: f64,
    pub reduction: Reduction,
}

impl Default for HingeEmbeddingLoss {
    fn default() -> Self {
        HingeEmbeddingLoss {
            margin: 1.0,
            reduction: Reduction::Mean,
        }
    }
}

setters!(HingeEmbeddingLoss {
    margin: f64,
    reduction: Reduction
});
loss_state!(HingeEmbeddingLoss);

impl HingeEmbeddingLoss {
    /// The loss of distances `input` for targets of 1 (similar) or -1.
    pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        hinge_embedding_loss(input, target, self.margin, self.reduction)
    }
}

/// `nn.CosineEmbeddingLoss`: [`cosine_embedding_loss`] with `margin`
/// (default 0) and `reduction`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CosineEmbeddingLoss {
    pub margin: f64,
    pub reduction: Reduction,
}

setters!(CosineEmbeddingLoss {
    margin: f64,
    reduction: Reduction
});
loss_state!(CosineEmbeddingLoss);

impl CosineEmbeddingLoss {
    /// The loss of the cosines of `input1` and `input2` for targets of 1 or -1.
    pub fn forward(&self, input1: &Tensor, input2: &Tensor, target: &Tensor) -> Result<Tensor> {
        cosine_embedding_loss(input1, input2, target, self.margin, self.reduction)
    }
}

/// `nn.TripletMarginLoss`: [`triplet_margin_loss`] with `margin` (default
/// 1), `p` (2), `eps` (1e-6), `swap` (false) and `reduction`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TripletMarginLoss {
    pub margin: f64,
    pub p: f64,
    pub eps: f64,
    pub swap: bool,
    pub reduction: Reduction,
}

impl Default for TripletMarginLoss {
    fn default() -> Self {
        TripletMarginLoss {
            margin: 1.0,
            p: 2.0,
            eps: 1e-6,
            swap: false,
            reduction: Reduction::Mean,
        }
    }
}

setters!(TripletMarginLoss {
    margin: f64,
    p: f64,
    eps: f64,
    swap: bool,
    reduction: Reduction
});
loss_state!(TripletMarginLoss);

impl TripletMarginLoss {
    /// The triplet loss of `anchor` against `positive` and `negative`.
    pub fn forward(&self, anchor: &Tensor, positive: &Tensor, negative: &Tensor) -> Result<Tensor> {
        let s = self;
        triplet_margin_loss(
            anchor,
            positive,
            negative,
            s.margin,
            s.p,
            s.eps,
            s.swap,
            s.reduction,
        )
    }
}

/// `nn.PoissonNLLLoss`: [`poisson_nll_loss`] with `log_input` (default
/// true), `full` (false), `eps` (1e-8) and `reduction`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PoissonNLLLoss {
    pub log_input: bool,
    pub full: bool,
    pub eps: f64,
    pub reduction: Reduction,
}

impl Default for PoissonNLLLoss {
    fn default() -> Self {
        PoissonNLLLoss {
            log_input: true,
            full: false,
            eps: 1e-8,
            reduction: Reduction::Mean,
        }
    }
}

setters!(PoissonNLLLoss {
    log_input: bool,
    full: bool,
    eps: f64,
    reduction: Reduction
});
loss_state!(PoissonNLLLoss);

impl PoissonNLLLoss {
    /// The Poisson negative log-likelihood of the (log-)rates `input` for the
    /// counts `target`.
    pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        let s = self;
        poisson_nll_loss(input, target, s.log_input, s.full, s.eps, s.reduction)
    }
}

/// `nn.GaussianNLLLoss`: [`gaussian_nll_loss`] with `full` (default false),
/// `eps` (1e-6) and `reduction`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GaussianNLLLoss {
    pub full: bool,
    pub eps: f64,
    pub reduction: Reduction,
}

impl Default for GaussianNLLLoss {
    fn default() -> Self {
        GaussianNLLLoss {
            full: false,
            eps: 1e-6,
            reduction: Reduction::Mean,
        }
    }
}

setters!(GaussianNLLLoss {
    full: bool,
    eps: f64,
    reduction: Reduction
});
loss_state!(GaussianNLLLoss);

impl GaussianNLLLoss {
    /// The Gaussian negative log-likelihood of `target` under the
    /// expectations `input` and the variances `var` (a tensor or a number).
    pub fn forward<'a>(
        &self,
        input: &Tensor,
        target: &Tensor,
        var: impl Into<Operand<'a>>,
    ) -> Result<Tensor> {
        gaussian_nll_loss(input, target, var, self.full, self.eps, self.reduction)
    }
}
