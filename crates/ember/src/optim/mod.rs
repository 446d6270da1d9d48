//! Optimizers that update parameters in place on their device: SGD (momentum,
//! dampening, Nesterov, weight decay), Adam and AdamW, with PyTorch's update rules.
//!
//! ```
//! use ember::optim::{Optimizer, Sgd};
//! use ember::prelude::*;
//! let w = Tensor::new(&[1f32, -2.], &Device::Cpu)?.requires_grad_(true)?;
//! let mut opt = Sgd::new(vec![w.clone()], 0.1);
//! w.square()?.sum_all()?.backward()?; // d/dw = 2w
//! opt.step()?;
//! assert_eq!(w.to_vec1::<f32>()?, vec![0.8, -1.6]);
//! # Ok::<(), ember::Error>(())
//! ```

pub(crate) mod fused;

use crate::{Error, Result, Tensor};

/// What every optimizer offers.
pub trait Optimizer {
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
}

/// The checks and moves of [`Optimizer::set_parameters`] for `params` and their
/// per-parameter buffers.
fn replace_parameters(
    params: &mut Vec<Tensor>,
    new: Vec<Tensor>,
    buffers: &mut [&mut Vec<Option<Tensor>>],
) -> Result<()> {
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
    for (i, (p, q)) in params.iter().zip(&new).enumerate() {
        if p.shape() != q.shape() {
            return Err(Error::shape(
                "set_parameters",
                p.shape(),
                q.shape(),
                format!("parameter {i} changed shape"),
            ));
        }
    }
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
    buffers: Vec<Option<Tensor>>,
}

impl Sgd {
    /// Plain SGD with learning rate `lr`.
    pub fn new(params: Vec<Tensor>, lr: f64) -> Sgd {
        let n = params.len();
        Sgd {
            params,
            lr,
            momentum: 0.0,
            dampening: 0.0,
            nesterov: false,
            weight_decay: 0.0,
            buffers: vec![None; n],
        }
    }

    /// Momentum factor (0 disables it).
    pub fn momentum(mut self, m: f64) -> Sgd {
        self.momentum = m;
        self
    }

    /// Dampening of the momentum.
    pub fn dampening(mut self, d: f64) -> Sgd {
        self.dampening = d;
        self
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

    /// L2 penalty added to the gradient.
    pub fn weight_decay(mut self, wd: f64) -> Sgd {
        self.weight_decay = wd;
        self
    }
}

impl Optimizer for Sgd {
    fn state(&self) -> Result<Vec<(String, Tensor)>> {
        let mut s = buffers_state("momentum_buffer", &self.buffers);
        s.push(("lr".into(), Tensor::scalar(self.lr, &crate::Device::Cpu)?));
        Ok(s)
    }

    fn load_state(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        check_names(state, &["momentum_buffer", "lr"])?;
        self.buffers = load_buffers("momentum_buffer", &self.params, state)?;
        self.lr = scalar_entry(state, "lr")?;
        Ok(())
    }

    fn parameters(&self) -> &[Tensor] {
        &self.params
    }

    fn set_parameters(&mut self, params: Vec<Tensor>) -> Result<()> {
        replace_parameters(&mut self.params, params, &mut [&mut self.buffers])
    }

    fn step(&mut self) -> Result<()> {
        let _ng = crate::no_grad_guard();
        let _phase = crate::meta::enter_phase(crate::meta::Phase::Optimizer);
        for (p, buf) in self.params.iter().zip(self.buffers.iter_mut()) {
            let Some(mut g) = p.grad() else { continue };
            if self.weight_decay != 0.0 {
                g = g.add(&p.mul(self.weight_decay)?)?;
            }
            if self.momentum != 0.0 {
                let b = match buf.take() {
                    None => g.copy()?,
                    Some(b) => {
                        b.mul_(self.momentum)?;
                        b.add_(&g.mul(1.0 - self.dampening)?)?;
                        b
                    }
                };
                g = if self.nesterov {
                    g.add(&b.mul(self.momentum)?)?
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
    step: u64,
    m: Vec<Option<Tensor>>,
    v: Vec<Option<Tensor>>,
}

impl Adam {
    /// Adam with PyTorch's defaults: betas (0.9, 0.999), eps 1e-8, no weight decay.
    pub fn new(params: Vec<Tensor>, lr: f64) -> Adam {
        let n = params.len();
        Adam {
            params,
            lr,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled: false,
            step: 0,
            m: vec![None; n],
            v: vec![None; n],
        }
    }

    /// AdamW (`torch.optim.AdamW`): weight decay 0.01 applied to the weights directly.
    pub fn adamw(params: Vec<Tensor>, lr: f64) -> Adam {
        Adam {
            weight_decay: 1e-2,
            decoupled: true,
            ..Adam::new(params, lr)
        }
    }

    pub fn betas(mut self, b1: f64, b2: f64) -> Adam {
        self.betas = (b1, b2);
        self
    }

    pub fn eps(mut self, eps: f64) -> Adam {
        self.eps = eps;
        self
    }

    /// L2 penalty (Adam) or decoupled decay (AdamW).
    pub fn weight_decay(mut self, wd: f64) -> Adam {
        self.weight_decay = wd;
        self
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.step
    }
}

impl Optimizer for Adam {
    fn state(&self) -> Result<Vec<(String, Tensor)>> {
        let mut s = buffers_state("exp_avg", &self.m);
        s.extend(buffers_state("exp_avg_sq", &self.v));
        s.push((
            "step".into(),
            Tensor::scalar(self.step as i64, &crate::Device::Cpu)?,
        ));
        s.push(("lr".into(), Tensor::scalar(self.lr, &crate::Device::Cpu)?));
        Ok(s)
    }

    fn load_state(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        check_names(state, &["exp_avg", "exp_avg_sq", "step", "lr"])?;
        self.m = load_buffers("exp_avg", &self.params, state)?;
        self.v = load_buffers("exp_avg_sq", &self.params, state)?;
        self.step = scalar_entry(state, "step")? as u64;
        self.lr = scalar_entry(state, "lr")?;
        Ok(())
    }

    fn parameters(&self) -> &[Tensor] {
        &self.params
    }

    fn set_parameters(&mut self, params: Vec<Tensor>) -> Result<()> {
        replace_parameters(&mut self.params, params, &mut [&mut self.m, &mut self.v])
    }

    fn step(&mut self) -> Result<()> {
        let _ng = crate::no_grad_guard();
        let _phase = crate::meta::enter_phase(crate::meta::Phase::Optimizer);
        self.step += 1;
        let (b1, b2) = self.betas;
        let bc1 = 1.0 - b1.powi(self.step as i32);
        let bc2 = 1.0 - b2.powi(self.step as i32);
        for ((p, m), v) in self
            .params
            .iter()
            .zip(self.m.iter_mut())
            .zip(self.v.iter_mut())
        {
            let Some(mut g) = p.grad() else { continue };
            let m = match m {
                Some(t) => t,
                None => m.insert(p.zeros_like()?),
            };
            let v = match v {
                Some(t) => t,
                None => v.insert(p.zeros_like()?),
            };
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
            if self.weight_decay != 0.0 {
                if self.decoupled {
                    p.mul_(1.0 - self.lr * self.weight_decay)?;
                } else {
                    g = g.add(&p.mul(self.weight_decay)?)?;
                }
            }
            m.mul_(b1)?;
            m.add_(&g.mul(1.0 - b1)?)?;
            v.mul_(b2)?;
            v.add_(&g.square()?.mul(1.0 - b2)?)?;
            // PyTorch's form: p -= lr/bc1 · m / (sqrt(v)/sqrt(bc2) + eps)
            let denom = v.sqrt()?.div(bc2.sqrt())?.add(self.eps)?;
            p.sub_(&m.div(&denom)?.mul(self.lr / bc1)?)?;
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

/// Changes an optimizer's learning rate once per epoch (`scheduler.step()`).
pub trait LrScheduler {
    /// Advances one epoch and sets the optimizer's learning rate for the next one.
    fn step(&mut self, opt: &mut dyn Optimizer);
    /// The learning rate set by the last step (the initial one before any step).
    fn last_lr(&self) -> f64;
    /// Epochs stepped so far.
    fn epoch(&self) -> usize;
    /// Jumps to `epoch` (to resume from a checkpoint) without touching the optimizer.
    fn set_epoch(&mut self, epoch: usize);
}

/// Multiplies the learning rate by `gamma` every `step_size` epochs (`StepLR`).
pub struct StepLr {
    base: f64,
    step_size: usize,
    gamma: f64,
    epoch: usize,
}

impl StepLr {
    /// Starts from the optimizer's current learning rate.
    pub fn new(opt: &dyn Optimizer, step_size: usize, gamma: f64) -> Result<StepLr> {
        if step_size == 0 {
            return Err(Error::invalid("StepLR", "step_size must be positive"));
        }
        Ok(StepLr {
            base: opt.lr(),
            step_size,
            gamma,
            epoch: 0,
        })
    }
}

impl LrScheduler for StepLr {
    fn step(&mut self, opt: &mut dyn Optimizer) {
        self.epoch += 1;
        opt.set_lr(self.last_lr());
    }

    fn epoch(&self) -> usize {
        self.epoch
    }

    fn set_epoch(&mut self, epoch: usize) {
        self.epoch = epoch;
    }

    fn last_lr(&self) -> f64 {
        self.base * self.gamma.powi((self.epoch / self.step_size) as i32)
    }
}

/// Cosine annealing from the initial rate down to `eta_min` over `t_max` epochs
/// (`CosineAnnealingLR`, closed form).
pub struct CosineAnnealingLr {
    base: f64,
    t_max: usize,
    eta_min: f64,
    epoch: usize,
}

impl CosineAnnealingLr {
    /// Starts from the optimizer's current learning rate.
    pub fn new(opt: &dyn Optimizer, t_max: usize, eta_min: f64) -> Result<CosineAnnealingLr> {
        if t_max == 0 {
            return Err(Error::invalid(
                "CosineAnnealingLR",
                "T_max must be positive",
            ));
        }
        Ok(CosineAnnealingLr {
            base: opt.lr(),
            t_max,
            eta_min,
            epoch: 0,
        })
    }
}

impl LrScheduler for CosineAnnealingLr {
    fn step(&mut self, opt: &mut dyn Optimizer) {
        self.epoch += 1;
        opt.set_lr(self.last_lr());
    }

    fn epoch(&self) -> usize {
        self.epoch
    }

    fn set_epoch(&mut self, epoch: usize) {
        self.epoch = epoch;
    }

    fn last_lr(&self) -> f64 {
        let t = self.epoch as f64 / self.t_max as f64;
        self.eta_min + (self.base - self.eta_min) * (1.0 + (std::f64::consts::PI * t).cos()) / 2.0
    }
}
