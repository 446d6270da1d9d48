//! Optimizers that update parameters in place on their device: SGD (momentum,
//! dampening, Nesterov, weight decay), Adam and AdamW, RMSprop and Adagrad, with
//! PyTorch's update rules; parameter [`Groups`] with their own settings; and
//! learning-rate schedules that move every group.
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

mod adaptive;
pub(crate) mod fused;
mod grad_scaler;
mod groups;
mod schedule;

pub use adaptive::{Adagrad, RmsProp};
pub use grad_scaler::GradScaler;
pub use groups::{split_for_weight_decay, Groups};
pub use schedule::{
    Anneal, LambdaLr, LinearLr, OneCycleLr, OneCycleOptions, ReduceLrOnPlateau, SequentialLr,
};

use crate::{Error, Result, Tensor};

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
    /// is; Adam is not yet (its bias corrections are computed on the host each
    /// step). The default is `false`.
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

/// Where a one-cycle schedule has put the momentum: a `cycled_momentum` state
/// entry, present only once it has.
fn cycled_state(s: &mut Vec<(String, Tensor)>, cycled: Option<f64>) -> Result<()> {
    if let Some(m) = cycled {
        s.push((
            "cycled_momentum".into(),
            Tensor::scalar(m, &crate::Device::Cpu)?,
        ));
    }
    Ok(())
}

/// The `cycled_momentum` entry of a state, if it has one, checked with `check`.
fn load_cycled(
    state: &[(String, Tensor)],
    check: impl Fn(f64) -> Result<()>,
) -> Result<Option<f64>> {
    if !state.iter().any(|(n, _)| n == "cycled_momentum") {
        return Ok(None);
    }
    let m = scalar_entry(state, "cycled_momentum")?;
    check(m)?;
    Ok(Some(m))
}

/// A beta of Adam must lie in [0, 1) (PyTorch's "Invalid beta parameter at
/// index i").
fn check_beta(i: usize, b: f64) -> Result<()> {
    if !(0.0..1.0).contains(&b) {
        return Err(Error::invalid(
            "Adam",
            format!("Invalid beta parameter at index {i}: {b} (it must be in [0, 1))"),
        ));
    }
    Ok(())
}

/// The checks and moves of [`Optimizer::set_parameters`] for `params` and their
/// per-parameter buffers.
/// The checks of [`Optimizer::set_parameters`]: as many parameters, each of the
/// same shape.
fn check_replacement(params: &[Tensor], new: &[Tensor]) -> Result<()> {
    if new.len() != params.len() {
        return Err(Error::invalid(
            "set_parameters",
            format!(
                "the optimizer has {} parameters, got {}",
                params.len(),
                new.len()
            ),
        ));
    }
    for (i, (p, q)) in params.iter().zip(new).enumerate() {
        if p.shape() != q.shape() {
            return Err(Error::shape(
                "set_parameters",
                p.shape(),
                q.shape(),
                format!("parameter {i} changed shape"),
            ));
        }
    }
    Ok(())
}

fn replace_parameters(
    params: &mut Vec<Tensor>,
    new: Vec<Tensor>,
    buffers: &mut [&mut Vec<Option<Tensor>>],
) -> Result<()> {
    check_replacement(params, &new)?;
    let mut moved: Vec<Vec<Option<Tensor>>> = Vec::with_capacity(buffers.len());
    for bufs in buffers.iter() {
        let v = bufs
            .iter()
            .zip(&new)
            .map(|(b, q)| {
                b.as_ref()
                    .map(|b| crate::no_grad(|| b.to(&q.device())))
                    .transpose()
            })
            .collect::<Result<_>>()?;
        moved.push(v);
    }
    for (bufs, v) in buffers.iter_mut().zip(moved) {
        **bufs = v;
    }
    *params = new;
    Ok(())
}

/// Named per-parameter buffers (`"{prefix}.{index}"`), for the ones that exist.
fn buffers_state(prefix: &str, bufs: &[Option<Tensor>]) -> Vec<(String, Tensor)> {
    bufs.iter()
        .enumerate()
        .filter_map(|(i, b)| b.as_ref().map(|b| (format!("{prefix}.{i}"), b.clone())))
        .collect()
}

/// Which parameters have per-parameter state (`has_state`: 1 where any of `bufs`
/// holds a buffer), saved so that loading can tell a parameter that never had state
/// from an entry missing from the file.
fn state_mask(n: usize, bufs: &[&[Option<Tensor>]]) -> Result<(String, Tensor)> {
    let mask: Vec<u8> = (0..n)
        .map(|i| u8::from(bufs.iter().any(|b| b.get(i).is_some_and(Option::is_some))))
        .collect();
    Ok((
        "has_state".into(),
        Tensor::from_vec(mask, [n], &crate::Device::Cpu)?,
    ))
}

/// Checks loaded buffers against a saved `has_state` mask: a parameter marked as
/// having state must have every one of its buffers, and one not marked must have
/// none. States saved before the mask existed are taken as they are.
fn check_mask(
    state: &[(String, Tensor)],
    n: usize,
    loaded: &[(&str, &[Option<Tensor>])],
) -> Result<()> {
    let Some((_, mask)) = state.iter().find(|(k, _)| k == "has_state") else {
        return Ok(());
    };
    let mask = mask.to_dtype(crate::DType::I64)?.to_vec::<i64>()?;
    if mask.len() != n {
        return Err(Error::invalid(
            "load_state",
            format!(
                "the optimizer state is for {} parameters, this optimizer has {n}",
                mask.len()
            ),
        ));
    }
    for (i, &m) in mask.iter().enumerate() {
        for (name, bufs) in loaded {
            let has = bufs[i].is_some();
            if m != 0 && !has {
                return Err(Error::invalid(
                    "load_state",
                    format!("the optimizer state has no {name}.{i} entry, but parameter {i} had state when it was saved (the file is incomplete)"),
                ));
            }
            if m == 0 && has {
                return Err(Error::invalid(
                    "load_state",
                    format!("the optimizer state has an entry {name}.{i} for parameter {i}, which had no state when it was saved"),
                ));
            }
        }
    }
    Ok(())
}

/// Restores buffers saved by [`buffers_state`], checking each against its parameter.
fn load_buffers(
    prefix: &str,
    params: &[Tensor],
    state: &[(String, Tensor)],
) -> Result<Vec<Option<Tensor>>> {
    let mut out = vec![None; params.len()];
    for (name, t) in state {
        let Some(i) = name
            .strip_prefix(prefix)
            .and_then(|r| r.strip_prefix('.'))
            .and_then(|r| r.parse::<usize>().ok())
        else {
            continue;
        };
        let p = params.get(i).ok_or_else(|| {
            Error::invalid(
                "load_state",
                format!("{name}: the optimizer has only {} parameters", params.len()),
            )
        })?;
        if t.shape() != p.shape() {
            return Err(Error::shape(
                "load_state",
                p.shape(),
                t.shape(),
                format!("{name} does not fit parameter {i}"),
            ));
        }
        out[i] = Some(crate::no_grad(|| t.to_dtype(p.dtype())?.to(&p.device()))?.copy()?);
    }
    Ok(out)
}

/// A scalar entry of an optimizer state, or an error naming it.
fn scalar_entry(state: &[(String, Tensor)], name: &str) -> Result<f64> {
    state
        .iter()
        .find(|(n, _)| n == name)
        .ok_or_else(|| {
            Error::invalid(
                "load_state",
                format!("the optimizer state has no {name:?} entry"),
            )
        })?
        .1
        .item::<f64>()
}

fn check_names(state: &[(String, Tensor)], allowed: &[&str]) -> Result<()> {
    for (n, _) in state {
        let head = n.split('.').next().unwrap_or("");
        if !allowed.contains(&head) {
            return Err(Error::invalid(
                "load_state",
                format!("unexpected optimizer state entry {n:?} (is the checkpoint from another optimizer?)"),
            ));
        }
    }
    Ok(())
}

/// A learning rate must be a finite number at least 0 (PyTorch: "Invalid learning
/// rate"; PyTorch lets NaN through, ember does not).
fn check_lr(op: &'static str, lr: f64) -> Result<()> {
    if !lr.is_finite() || lr < 0.0 {
        return Err(Error::invalid(
            op,
            format!("Invalid learning rate: {lr} (it must be a finite number >= 0)"),
        ));
    }
    Ok(())
}

/// A hyper-parameter that must be finite and at least 0 (`what` names it as
/// PyTorch's messages do: "weight_decay value", "epsilon value", "momentum value").
fn check_non_negative(op: &'static str, what: &str, v: f64) -> Result<()> {
    if !v.is_finite() || v < 0.0 {
        return Err(Error::invalid(
            op,
            format!("Invalid {what}: {v} (it must be a finite number >= 0)"),
        ));
    }
    Ok(())
}

fn zero_all(params: &[Tensor]) {
    params.iter().for_each(|p| p.zero_grad());
}

/// Stochastic gradient descent (`torch.optim.SGD`).
pub struct Sgd {
    params: Vec<Tensor>,
    lr: f64,
    momentum: f64,
    dampening: f64,
    nesterov: bool,
    weight_decay: f64,
    /// The momentum a one-cycle schedule has set, in place of `momentum`.
    cycled: Option<f64>,
    buffers: Vec<Option<Tensor>>,
    /// The rates the first schedule started from (`initial_lr`).
    initial: InitialLrs,
}

impl Sgd {
    /// Plain SGD with learning rate `lr`, which must be finite and at least 0.
    pub fn new(params: Vec<Tensor>, lr: f64) -> Result<Sgd> {
        check_lr("SGD", lr)?;
        let n = params.len();
        Ok(Sgd {
            params,
            lr,
            momentum: 0.0,
            dampening: 0.0,
            nesterov: false,
            weight_decay: 0.0,
            cycled: None,
            buffers: vec![None; n],
            initial: InitialLrs::default(),
        })
    }

    /// Momentum factor (0 disables it; negative or not finite is an error).
    pub fn momentum(mut self, m: f64) -> Result<Sgd> {
        self.check_momentum(m)?;
        self.momentum = m;
        Ok(self)
    }

    fn check_momentum(&self, m: f64) -> Result<()> {
        check_non_negative("SGD", "momentum value", m)?;
        if self.nesterov && m <= 0.0 {
            return Err(Error::invalid(
                "SGD",
                "Nesterov momentum requires a momentum and zero dampening",
            ));
        }
        Ok(())
    }

    /// Dampening of the momentum (must be finite; Nesterov needs it to be 0).
    pub fn dampening(mut self, d: f64) -> Result<Sgd> {
        if !d.is_finite() {
            return Err(Error::invalid(
                "SGD",
                format!("Invalid dampening value: {d}"),
            ));
        }
        if self.nesterov && d != 0.0 {
            return Err(Error::invalid(
                "SGD",
                "Nesterov momentum requires a momentum and zero dampening",
            ));
        }
        self.dampening = d;
        Ok(self)
    }

    /// Nesterov momentum (needs momentum > 0 and no dampening).
    pub fn nesterov(mut self, on: bool) -> Result<Sgd> {
        if on && (self.momentum <= 0.0 || self.dampening != 0.0) {
            return Err(Error::invalid(
                "SGD",
                "Nesterov momentum requires a momentum and zero dampening",
            ));
        }
        self.nesterov = on;
        Ok(self)
    }

    /// L2 penalty added to the gradient (negative or not finite is an error).
    pub fn weight_decay(mut self, wd: f64) -> Result<Sgd> {
        check_non_negative("SGD", "weight_decay value", wd)?;
        self.weight_decay = wd;
        Ok(self)
    }
}

impl Optimizer for Sgd {
    fn initial_lrs(&self) -> Option<Vec<f64>> {
        self.initial.get()
    }
    fn record_initial_lrs(&self, lrs: &[f64]) {
        self.initial.record(lrs)
    }
    fn state(&self) -> Result<Vec<(String, Tensor)>> {
        let mut s = buffers_state("momentum_buffer", &self.buffers);
        s.push(state_mask(self.params.len(), &[&self.buffers])?);
        s.push(("lr".into(), Tensor::scalar(self.lr, &crate::Device::Cpu)?));
        cycled_state(&mut s, self.cycled)?;
        Ok(s)
    }

    fn load_state(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        check_names(
            state,
            &["momentum_buffer", "has_state", "lr", "cycled_momentum"],
        )?;
        let buffers = load_buffers("momentum_buffer", &self.params, state)?;
        check_mask(state, self.params.len(), &[("momentum_buffer", &buffers)])?;
        let lr = scalar_entry(state, "lr")?;
        check_lr("load_state", lr)?;
        let cycled = load_cycled(state, |m| self.check_momentum(m))?;
        self.buffers = buffers;
        self.lr = lr;
        self.cycled = cycled;
        Ok(())
    }

    fn cycled_momentum(&self) -> Option<f64> {
        Some(self.cycled.unwrap_or(self.momentum))
    }

    fn set_cycled_momentum(&mut self, m: f64) -> Result<()> {
        self.check_momentum(m)?;
        self.cycled = Some(m);
        Ok(())
    }

    /// The momentum buffers are made at the first step and updated in place
    /// after it.
    fn capturable(&self) -> bool {
        true
    }

    fn parameters(&self) -> &[Tensor] {
        &self.params
    }

    fn set_parameters(&mut self, params: Vec<Tensor>) -> Result<()> {
        replace_parameters(&mut self.params, params, &mut [&mut self.buffers])
    }

    fn config(&self) -> Vec<(String, String)> {
        vec![
            ("optimizer".into(), "SGD".into()),
            ("momentum".into(), self.momentum.to_string()),
            ("dampening".into(), self.dampening.to_string()),
            ("nesterov".into(), self.nesterov.to_string()),
            ("weight_decay".into(), self.weight_decay.to_string()),
        ]
    }

    fn step(&mut self) -> Result<()> {
        let _ng = crate::no_grad_guard();
        let _phase = crate::meta::enter_phase(crate::meta::Phase::Optimizer);
        let momentum = self.cycled.unwrap_or(self.momentum);
        for (p, buf) in self.params.iter().zip(self.buffers.iter_mut()) {
            let Some(mut g) = p.grad() else { continue };
            if self.weight_decay != 0.0 {
                g = g.add(&p.mul(self.weight_decay)?)?;
            }
            if momentum != 0.0 {
                let b = match buf.take() {
                    None => g.copy()?,
                    Some(b) => {
                        b.mul_(momentum)?;
                        b.add_(&g.mul(1.0 - self.dampening)?)?;
                        b
                    }
                };
                g = if self.nesterov {
                    g.add(&b.mul(momentum)?)?
                } else {
                    b.clone()
                };
                *buf = Some(b);
            }
            p.sub_(&g.mul(self.lr)?)?;
        }
        Ok(())
    }

    fn zero_grad(&self) {
        zero_all(&self.params)
    }

    fn lr(&self) -> f64 {
        self.lr
    }

    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }
}

/// Adam (`torch.optim.Adam`), or AdamW with decoupled weight decay.
pub struct Adam {
    params: Vec<Tensor>,
    lr: f64,
    betas: (f64, f64),
    eps: f64,
    weight_decay: f64,
    decoupled: bool,
    /// The first beta a one-cycle schedule has set, in place of `betas.0`.
    cycled: Option<f64>,
    step: u64,
    m: Vec<Option<Tensor>>,
    v: Vec<Option<Tensor>>,
    /// Capturable form ([`Optimizer::make_capturable`]): the step count on the
    /// parameters' device (made at the next step from `step`), read by the
    /// bias corrections there.
    capturable: bool,
    step_on_device: Option<Tensor>,
    /// The rates the first schedule started from (`initial_lr`).
    initial: InitialLrs,
}

impl Adam {
    /// Adam with PyTorch's defaults: betas (0.9, 0.999), eps 1e-8, no weight decay.
    /// `lr` must be finite and at least 0.
    pub fn new(params: Vec<Tensor>, lr: f64) -> Result<Adam> {
        check_lr("Adam", lr)?;
        let n = params.len();
        Ok(Adam {
            params,
            lr,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled: false,
            cycled: None,
            step: 0,
            m: vec![None; n],
            v: vec![None; n],
            capturable: false,
            step_on_device: None,
            initial: InitialLrs::default(),
        })
    }

    /// AdamW (`torch.optim.AdamW`): weight decay 0.01 applied to the weights directly.
    pub fn adamw(params: Vec<Tensor>, lr: f64) -> Result<Adam> {
        Ok(Adam {
            weight_decay: 1e-2,
            decoupled: true,
            ..Adam::new(params, lr)?
        })
    }

    /// The moments' decay rates, each in [0, 1) (PyTorch's "Invalid beta parameter
    /// at index 0/1" otherwise).
    pub fn betas(mut self, b1: f64, b2: f64) -> Result<Adam> {
        check_beta(0, b1)?;
        check_beta(1, b2)?;
        self.betas = (b1, b2);
        Ok(self)
    }

    /// The term added to the denominator (finite, at least 0).
    pub fn eps(mut self, eps: f64) -> Result<Adam> {
        check_non_negative("Adam", "epsilon value", eps)?;
        self.eps = eps;
        Ok(self)
    }

    /// L2 penalty (Adam) or decoupled decay (AdamW), finite and at least 0.
    pub fn weight_decay(mut self, wd: f64) -> Result<Adam> {
        check_non_negative("Adam", "weight_decay value", wd)?;
        self.weight_decay = wd;
        Ok(self)
    }

    /// Steps taken so far (in the capturable form, read from the device: a wait
    /// for it, counting replays of captured steps).
    pub fn steps(&self) -> u64 {
        self.device_steps().unwrap_or(self.step)
    }

    /// The step count kept on the device, when there is one.
    fn device_steps(&self) -> Option<u64> {
        let t = self.step_on_device.as_ref()?;
        t.item::<f64>().ok().map(|v| v as u64)
    }

    /// The capturable step: the count and the bias corrections computed on the
    /// device, the update made of tensor operations that read them (no value
    /// that changes from step to step passed from the host).
    fn capturable_step(&mut self, b1: f64, b2: f64) -> Result<()> {
        let Some(first) = self.params.first() else {
            return Ok(());
        };
        let t = match &self.step_on_device {
            Some(t) => t.clone(),
            None => self
                .step_on_device
                .insert(Tensor::scalar(self.step as f64, &first.device())?)
                .clone(),
        };
        t.add_(1.0)?;
        self.step += 1;
        // 1 - b^t as exp(t ln b): ln 0 = -inf gives 1 for a beta of 0
        let correction = |b: f64| -> Result<Tensor> { t.mul(b.ln())?.exp()?.neg()?.add(1.0) };
        let (bc1, bc2) = (correction(b1)?, correction(b2)?);
        // lr / bc1 and sqrt(bc2), in each parameter dtype once
        let mut per_dtype: Vec<(crate::DType, Tensor, Tensor)> = Vec::new();
        for ((p, m), v) in self
            .params
            .iter()
            .zip(self.m.iter_mut())
            .zip(self.v.iter_mut())
        {
            let Some(g) = p.grad() else { continue };
            let dt = p.dtype();
            let (step_size, sqrt_bc2) = match per_dtype.iter().find(|(d, _, _)| *d == dt) {
                Some((_, a, b)) => (a.clone(), b.clone()),
                None => {
                    let a = bc1.recip()?.mul(self.lr)?.to_dtype(dt)?;
                    let b = bc2.sqrt()?.to_dtype(dt)?;
                    per_dtype.push((dt, a.clone(), b.clone()));
                    (a, b)
                }
            };
            let (m, v) = (moment(p, m)?, moment(p, v)?);
            let (lr, eps, wd, decoupled) = (self.lr, self.eps, self.weight_decay, self.decoupled);
            adam_update(
                p,
                g,
                (m, v),
                (b1, b2),
                (lr, eps, wd, decoupled),
                (&step_size).into(),
                (&sqrt_bc2).into(),
            )?;
        }
        Ok(())
    }
}

/// A moment buffer of `p`, made (zeros) at its first step.
fn moment<'a>(p: &Tensor, slot: &'a mut Option<Tensor>) -> Result<&'a Tensor> {
    match slot {
        Some(t) => Ok(t),
        None => Ok(slot.insert(p.zeros_like()?)),
    }
}

/// Adam's update of `p` from its gradient `g` in tensor operations, PyTorch's
/// form: `p -= step_size · m / (sqrt(v) / sqrt_bc2 + eps)`, where `step_size` is
/// `lr / bc1`; the corrections are numbers, or tensors on the device (the
/// capturable form).
fn adam_update(
    p: &Tensor,
    mut g: Tensor,
    (m, v): (&Tensor, &Tensor),
    (b1, b2): (f64, f64),
    (lr, eps, weight_decay, decoupled): (f64, f64, f64, bool),
    step_size: crate::Operand<'_>,
    sqrt_bc2: crate::Operand<'_>,
) -> Result<()> {
    if weight_decay != 0.0 {
        if decoupled {
            p.mul_(1.0 - lr * weight_decay)?;
        } else {
            g = g.add(&p.mul(weight_decay)?)?;
        }
    }
    m.mul_(b1)?;
    m.add_(&g.mul(1.0 - b1)?)?;
    v.mul_(b2)?;
    v.add_(&g.square()?.mul(1.0 - b2)?)?;
    let denom = v.sqrt()?.div(sqrt_bc2)?.add(eps)?;
    p.sub_(&m.div(&denom)?.mul(step_size)?)
}

impl Optimizer for Adam {
    fn initial_lrs(&self) -> Option<Vec<f64>> {
        self.initial.get()
    }
    fn record_initial_lrs(&self, lrs: &[f64]) {
        self.initial.record(lrs)
    }
    fn state(&self) -> Result<Vec<(String, Tensor)>> {
        let mut s = buffers_state("exp_avg", &self.m);
        s.extend(buffers_state("exp_avg_sq", &self.v));
        s.push(state_mask(self.params.len(), &[&self.m, &self.v])?);
        s.push((
            "step".into(),
            Tensor::scalar(self.steps() as i64, &crate::Device::Cpu)?,
        ));
        s.push(("lr".into(), Tensor::scalar(self.lr, &crate::Device::Cpu)?));
        cycled_state(&mut s, self.cycled)?;
        Ok(s)
    }

    fn cycled_momentum(&self) -> Option<f64> {
        Some(self.cycled.unwrap_or(self.betas.0))
    }

    fn set_cycled_momentum(&mut self, m: f64) -> Result<()> {
        check_beta(0, m)?;
        self.cycled = Some(m);
        Ok(())
    }

    fn load_state(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        check_names(
            state,
            &[
                "exp_avg",
                "exp_avg_sq",
                "has_state",
                "step",
                "lr",
                "cycled_momentum",
            ],
        )?;
        let m = load_buffers("exp_avg", &self.params, state)?;
        let v = load_buffers("exp_avg_sq", &self.params, state)?;
        check_mask(
            state,
            self.params.len(),
            &[("exp_avg", &m), ("exp_avg_sq", &v)],
        )?;
        let step = scalar_entry(state, "step")?;
        let lr = scalar_entry(state, "lr")?;
        check_lr("load_state", lr)?;
        if !(step >= 0.0 && step.fract() == 0.0) {
            return Err(Error::invalid(
                "load_state",
                format!("the optimizer state's step count {step} is not a whole number >= 0"),
            ));
        }
        let cycled = load_cycled(state, |b| check_beta(0, b))?;
        (self.m, self.v, self.step, self.lr, self.cycled) = (m, v, step as u64, lr, cycled);
        self.step_on_device = None;
        Ok(())
    }

    fn capturable(&self) -> bool {
        self.capturable
    }

    fn make_capturable(&mut self) -> Result<bool> {
        self.capturable = true;
        Ok(true)
    }

    fn parameters(&self) -> &[Tensor] {
        &self.params
    }

    fn set_parameters(&mut self, params: Vec<Tensor>) -> Result<()> {
        replace_parameters(&mut self.params, params, &mut [&mut self.m, &mut self.v])?;
        // the count moves with the parameters (made again on their device)
        self.step = self.steps();
        self.step_on_device = None;
        Ok(())
    }

    fn config(&self) -> Vec<(String, String)> {
        let kind = if self.decoupled { "AdamW" } else { "Adam" };
        vec![
            ("optimizer".into(), kind.into()),
            (
                "betas".into(),
                format!("({}, {})", self.betas.0, self.betas.1),
            ),
            ("eps".into(), self.eps.to_string()),
            ("weight_decay".into(), self.weight_decay.to_string()),
        ]
    }

    fn step(&mut self) -> Result<()> {
        let _ng = crate::no_grad_guard();
        let _phase = crate::meta::enter_phase(crate::meta::Phase::Optimizer);
        let (b1, b2) = (self.cycled.unwrap_or(self.betas.0), self.betas.1);
        if self.capturable {
            return self.capturable_step(b1, b2);
        }
        self.step += 1;
        let bc1 = 1.0 - b1.powi(self.step as i32);
        let bc2 = 1.0 - b2.powi(self.step as i32);
        for ((p, m), v) in self
            .params
            .iter()
            .zip(self.m.iter_mut())
            .zip(self.v.iter_mut())
        {
            let Some(g) = p.grad() else { continue };
            let (m, v) = (moment(p, m)?, moment(p, v)?);
            let h = fused::AdamStep {
                lr: self.lr,
                b1,
                b2,
                eps: self.eps,
                bc1,
                bc2,
                weight_decay: self.weight_decay,
                decoupled: self.decoupled,
            };
            if fused::adam(p, &g, m, v, h)? {
                continue;
            }
            let (lr, eps, wd, decoupled) = (self.lr, self.eps, self.weight_decay, self.decoupled);
            let (step_size, sqrt_bc2) = (lr / bc1, bc2.sqrt());
            adam_update(
                p,
                g,
                (m, v),
                (b1, b2),
                (lr, eps, wd, decoupled),
                step_size.into(),
                sqrt_bc2.into(),
            )?;
        }
        Ok(())
    }

    fn zero_grad(&self) {
        zero_all(&self.params)
    }

    fn lr(&self) -> f64 {
        self.lr
    }

    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }
}

/// Changes an optimizer's learning rate once per epoch (`scheduler.step()`), in
/// every parameter group: each group follows the schedule from its own initial
/// rate, as PyTorch's schedulers do.
pub trait LrScheduler: Send {
    /// Advances one epoch and sets the optimizer's learning rates for the next one.
    fn step(&mut self, opt: &mut dyn Optimizer);
    /// The first group's learning rate set by the last step (the initial one
    /// before any step).
    fn last_lr(&self) -> f64;
    /// Every group's learning rate set by the last step.
    fn last_lrs(&self) -> Vec<f64> {
        vec![self.last_lr()]
    }
    /// Epochs stepped so far.
    fn epoch(&self) -> usize;
    /// Jumps to `epoch` (to resume from a checkpoint) without touching the optimizer.
    fn set_epoch(&mut self, epoch: usize);
}

/// The rates a schedule starts from: those recorded when the optimizer's first
/// schedule was built, or else the groups' current rates (the optimizer's
/// `lr()` alone if it lists no groups), which are then recorded (PyTorch's
/// `initial_lr`, set by the first scheduler).
fn initial_rates(opt: &dyn Optimizer) -> Vec<f64> {
    let lrs = opt.group_lrs();
    let now = if lrs.is_empty() { vec![opt.lr()] } else { lrs };
    match opt.initial_lrs() {
        Some(r) if r.len() == now.len() => r,
        _ => {
            opt.record_initial_lrs(&now);
            now
        }
    }
}

/// An optimizer's [`Optimizer::initial_lrs`], set through `&self` as schedules
/// are built from a shared reference.
#[derive(Default)]
pub(crate) struct InitialLrs(std::sync::Mutex<Option<Vec<f64>>>);

impl InitialLrs {
    pub(crate) fn get(&self) -> Option<Vec<f64>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn record(&self, lrs: &[f64]) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(lrs.to_vec());
    }
}

/// The rates a closed-form schedule gives each group at its epoch: `rate(base)`
/// for each group's initial rate.
fn group_rates(bases: &[f64], rate: impl Fn(f64) -> f64) -> Vec<f64> {
    bases.iter().map(|&b| rate(b)).collect()
}

/// Multiplies the learning rate by `gamma` every `step_size` epochs (`StepLR`).
pub struct StepLr {
    bases: Vec<f64>,
    step_size: usize,
    gamma: f64,
    epoch: usize,
}

impl StepLr {
    /// Starts from the optimizer's current learning rates.
    pub fn new(opt: &dyn Optimizer, step_size: usize, gamma: f64) -> Result<StepLr> {
        if step_size == 0 {
            return Err(Error::invalid("StepLR", "step_size must be positive"));
        }
        Ok(StepLr {
            bases: initial_rates(opt),
            step_size,
            gamma,
            epoch: 0,
        })
    }

    fn rate(&self, base: f64) -> f64 {
        base * self.gamma.powi((self.epoch / self.step_size) as i32)
    }
}

impl LrScheduler for StepLr {
    fn step(&mut self, opt: &mut dyn Optimizer) {
        self.epoch += 1;
        opt.set_group_lrs(&self.last_lrs());
    }

    fn epoch(&self) -> usize {
        self.epoch
    }

    fn set_epoch(&mut self, epoch: usize) {
        self.epoch = epoch;
    }

    fn last_lr(&self) -> f64 {
        self.rate(self.bases[0])
    }

    fn last_lrs(&self) -> Vec<f64> {
        group_rates(&self.bases, |b| self.rate(b))
    }
}

/// Cosine annealing from the initial rate down to `eta_min` over `t_max` epochs
/// (`CosineAnnealingLR`, closed form).
pub struct CosineAnnealingLr {
    bases: Vec<f64>,
    t_max: usize,
    eta_min: f64,
    epoch: usize,
}

impl CosineAnnealingLr {
    /// Starts from the optimizer's current learning rates.
    pub fn new(opt: &dyn Optimizer, t_max: usize, eta_min: f64) -> Result<CosineAnnealingLr> {
        if t_max == 0 {
            return Err(Error::invalid(
                "CosineAnnealingLR",
                "T_max must be positive",
            ));
        }
        Ok(CosineAnnealingLr {
            bases: initial_rates(opt),
            t_max,
            eta_min,
            epoch: 0,
        })
    }

    fn rate(&self, base: f64) -> f64 {
        let t = self.epoch as f64 / self.t_max as f64;
        self.eta_min + (base - self.eta_min) * (1.0 + (std::f64::consts::PI * t).cos()) / 2.0
    }
}

impl LrScheduler for CosineAnnealingLr {
    fn step(&mut self, opt: &mut dyn Optimizer) {
        self.epoch += 1;
        opt.set_group_lrs(&self.last_lrs());
    }

    fn epoch(&self) -> usize {
        self.epoch
    }

    fn set_epoch(&mut self, epoch: usize) {
        self.epoch = epoch;
    }

    fn last_lr(&self) -> f64 {
        self.rate(self.bases[0])
    }

    fn last_lrs(&self) -> Vec<f64> {
        group_rates(&self.bases, |b| self.rate(b))
    }
}
