//! Optimizers that update parameters in place on their device: SGD (momentum,
//! dampening, Nesterov, weight decay), Adam and AdamW, RMSprop and Adagrad,
//! NAdam, RAdam, Adamax, Adadelta, Rprop and ASGD, with PyTorch's update
//! rules; parameter [`Groups`] with their own settings; and learning-rate
//! schedules that move every group.
//!
//! ```
//! use ember::optim::{Optimizer, Sgd};
//! use ember::prelude::*;
//! let w = Tensor::new(&[1f32, -2.], &Device::Cpu)?.requires_grad_(true)?;
//! let mut opt = Sgd::new(vec![w.clone()], 0.1)?;
//! w.square()?.sum_all()?.backward()?; // d/dw = 2w
//! opt.step()?;
//! assert_eq!(w.to_vec1::<f32>()?, vec![0.8, -1.6]);
//! # Ok::<(), ember::Error>(())
//! ```

mod adadelta;
mod adam;
mod adam_family;
mod adaptive;
pub(crate) mod fused;
mod grad_scaler;
mod groups;
mod rprop_asgd;
mod schedule;
mod schedule_more;
mod sgd;
mod state;

pub use adadelta::Adadelta;
pub use adam::Adam;
pub use adam_family::{Adamax, NAdam, RAdam};
pub use adaptive::{Adagrad, RmsProp};
pub use grad_scaler::GradScaler;
pub use groups::{split_for_weight_decay, Groups};
pub use rprop_asgd::{Asgd, Rprop};
pub(crate) use schedule::InitialLrs;
pub use schedule::{
    Anneal, CosineAnnealingLr, LambdaLr, LinearLr, LrScheduler, OneCycleLr, OneCycleOptions,
    ReduceLrOnPlateau, SequentialLr, StepLr,
};
pub use schedule_more::{
    ChainedScheduler, ConstantLr, CosineAnnealingWarmRestarts, CyclicLr, CyclicMode, CyclicOptions,
    ExponentialLr, MultiStepLr, MultiplicativeLr, PolynomialLr,
};
pub use sgd::Sgd;

use crate::{
    error::{Error, Result},
    tensor::Tensor,
};

/// What every optimizer offers.
pub trait Optimizer: Send {
    /// Applies one update from the parameters' current gradients (parameters with no
    /// gradient are skipped).
    fn step(&mut self) -> Result<()>;
    /// Clears every parameter's gradient.
    fn zero_grad(&self);
    /// The learning rate.
    fn lr(&self) -> f64;
    /// Sets the learning rate (for schedulers).
    fn set_lr(&mut self, lr: f64);
    /// The state needed to resume exactly (moment buffers, step count, learning rate).
    fn state(&self) -> Result<Vec<(String, Tensor)>>;
    /// Restores what [`state`](Self::state) returned, for the same parameters.
    fn load_state(&mut self, state: &[(String, Tensor)]) -> Result<()>;
    /// The parameters being optimized.
    fn parameters(&self) -> &[Tensor];
    /// Swaps in the same parameters after the model moved (`model.to_device`, which
    /// makes new parameter tensors): the state moves to their devices. The count and
    /// shapes must match the current parameters; on an error nothing changes.
    fn set_parameters(&mut self, params: Vec<Tensor>) -> Result<()>;
    /// The optimizer's kind and hyper-parameters other than the learning rate, as
    /// (name, value) text: a checkpoint records them so that resuming with another
    /// optimizer setting is refused. The default is none.
    fn config(&self) -> Vec<(String, String)> {
        Vec::new()
    }
    /// Each parameter group's learning rate, in order (one entry for an optimizer
    /// without [`Groups`]).
    fn group_lrs(&self) -> Vec<f64> {
        vec![self.lr()]
    }
    /// Sets each group's learning rate, one entry per group as
    /// [`group_lrs`](Self::group_lrs) lists them (what schedulers call); missing
    /// entries leave their groups as they are.
    fn set_group_lrs(&mut self, lrs: &[f64]) {
        if let Some(&lr) = lrs.first() {
            self.set_lr(lr);
        }
    }
    /// Each group's rate when the first schedule was built on this optimizer
    /// (PyTorch's `initial_lr`): a schedule built later starts from these, not
    /// from the rate an earlier schedule has set (a warm-up's first rate). `None`
    /// before any schedule, and for an optimizer that keeps none (the default).
    fn initial_lrs(&self) -> Option<Vec<f64>> {
        None
    }
    /// Records [`initial_lrs`](Self::initial_lrs), replacing any recorded: the
    /// first schedule records the current rates; a one-cycle schedule records its
    /// own initial rate. The default keeps nothing.
    fn record_initial_lrs(&self, lrs: &[f64]) {
        let _ = lrs;
    }
    /// The momentum a one-cycle schedule varies (SGD's and RMSprop's `momentum`,
    /// Adam's first beta), or `None` for an optimizer without one (Adagrad).
    fn cycled_momentum(&self) -> Option<f64> {
        None
    }
    /// Whether a [`step`](Self::step) after the first can be captured in a CUDA
    /// graph and replayed ([`cuda::Graph`](crate::cuda::Graph)): it updates its
    /// state in place and reads nothing on the host that changes from step to
    /// step but the learning rate and momentum (which a replay does not see
    /// change: [`Trial`](crate::train::Trial) captures again when they do). SGD
    /// is; Adam and AdamW are after [`make_capturable`](Self::make_capturable)
    /// (by default they compute their bias corrections on the host each step).
    /// The default is `false`.
    fn capturable(&self) -> bool {
        false
    }
    /// Switches to a form of the step that can be captured, where the optimizer
    /// has one (Adam: the step count and bias corrections kept on the device,
    /// PyTorch's `capturable=True`); returns whether its steps are capturable
    /// now. The default changes nothing.
    fn make_capturable(&mut self) -> Result<bool> {
        Ok(self.capturable())
    }
    /// Sets that momentum for the steps that follow (PyTorch's OneCycleLR writes
    /// it into the parameter groups). The constructed value stays in
    /// [`config`](Self::config); the current one is part of [`state`](Self::state).
    fn set_cycled_momentum(&mut self, m: f64) -> Result<()> {
        Err(Error::invalid(
            "cycle_momentum",
            format!("optimizer must support momentum or beta1 with `cycle_momentum` option enabled (cannot set {m})"),
        ))
    }
}

/// A boxed optimizer is one (an optimizer chosen at run time, passed to
/// [`Trial::new`](crate::train::Trial::new)): every method goes to the box's.
impl Optimizer for Box<dyn Optimizer> {
    fn step(&mut self) -> Result<()> {
        (**self).step()
    }
    fn zero_grad(&self) {
        (**self).zero_grad()
    }
    fn lr(&self) -> f64 {
        (**self).lr()
    }
    fn set_lr(&mut self, lr: f64) {
        (**self).set_lr(lr)
    }
    fn state(&self) -> Result<Vec<(String, Tensor)>> {
        (**self).state()
    }
    fn load_state(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        (**self).load_state(state)
    }
    fn parameters(&self) -> &[Tensor] {
        (**self).parameters()
    }
    fn set_parameters(&mut self, params: Vec<Tensor>) -> Result<()> {
        (**self).set_parameters(params)
    }
    fn config(&self) -> Vec<(String, String)> {
        (**self).config()
    }
    fn group_lrs(&self) -> Vec<f64> {
        (**self).group_lrs()
    }
    fn set_group_lrs(&mut self, lrs: &[f64]) {
        (**self).set_group_lrs(lrs)
    }
    fn initial_lrs(&self) -> Option<Vec<f64>> {
        (**self).initial_lrs()
    }
    fn record_initial_lrs(&self, lrs: &[f64]) {
        (**self).record_initial_lrs(lrs)
    }
    fn cycled_momentum(&self) -> Option<f64> {
        (**self).cycled_momentum()
    }
    fn capturable(&self) -> bool {
        (**self).capturable()
    }
    fn make_capturable(&mut self) -> Result<bool> {
        (**self).make_capturable()
    }
    fn set_cycled_momentum(&mut self, m: f64) -> Result<()> {
        (**self).set_cycled_momentum(m)
    }
}
