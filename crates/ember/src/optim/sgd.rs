//! Stochastic gradient descent with momentum, dampening, Nesterov and weight
//! decay (`torch.optim.SGD`).

use super::state::*;
use super::state::{flag_setters, non_negative_setters, plain_optimizer_methods};
use super::{fused, InitialLrs, Optimizer};
use crate::{
    error::{Error, Result},
    tensor::Tensor,
};

/// Stochastic gradient descent (`torch.optim.SGD`).
pub struct Sgd {
    params: Vec<Tensor>,
    lr: f64,
    momentum: f64,
    dampening: f64,
    nesterov: bool,
    weight_decay: f64,
    /// Steps up the gradient ([`Sgd::maximize`]).
    maximize: bool,
    /// The momentum a one-cycle schedule has set, in place of `momentum`.
    cycled: Option<f64>,
    buffers: Vec<Option<Tensor>>,
    /// The rates the first schedule started from (`initial_lr`).
    initial: InitialLrs,
    /// Multi-tensor steps on GPUs ([`Sgd::foreach`]).
    foreach: bool,
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
            maximize: false,
            cycled: None,
            buffers: vec![None; n],
            initial: InitialLrs::default(),
            foreach: true,
        })
    }

    /// Whether a step on a GPU updates many parameters per launch (PyTorch's
    /// `foreach=True`, its default on CUDA, and ember's): weight decay, momentum
    /// and the update in one kernel, up to 48 parameters per launch, where every
    /// parameter with a gradient is a contiguous f32 or f64 tensor on one GPU.
    /// Otherwise, and off, each parameter is updated by tensor operations (up to
    /// seven each), which can differ from the fused step in the last bit.
    pub fn foreach(mut self, on: bool) -> Sgd {
        self.foreach = on;
        self
    }

    /// The step in multi-tensor launches, when every parameter qualifies
    /// ([`fused::sgd_fusable`]); `Ok(false)` (nothing done) otherwise.
    fn foreach_step(&mut self, momentum: f64) -> Result<bool> {
        // (the gradients as they are decide whether the step fuses: a negated
        // one, for maximize, is made below with the same layout and dtype)
        let mut live: Vec<(usize, Tensor, Tensor)> = self
            .params
            .iter()
            .enumerate()
            .filter_map(|(i, p)| p.grad().map(|g| (i, p.clone(), g)))
            .collect();
        let uses_buffer = momentum != 0.0;
        let items: Vec<fused::SgdItem<'_>> = live
            .iter()
            .map(|(i, p, g)| {
                let buf = self.buffers[*i].as_ref().filter(|_| uses_buffer);
                (p, g, buf.map(|b| (b, false)))
            })
            .collect();
        // (a buffer made below is a fresh contiguous tensor like its parameter)
        if !fused::sgd_fusable(&items) {
            return Ok(false);
        }
        drop(items);
        if self.maximize {
            for (_, _, g) in live.iter_mut() {
                *g = g.neg()?;
            }
        }
        // buffers made at their first step (written from the gradient there)
        let mut made: Vec<Option<Tensor>> = Vec::with_capacity(live.len());
        for (i, p, _) in &live {
            made.push(if uses_buffer && self.buffers[*i].is_none() {
                Some(p.zeros_like()?)
            } else {
                None
            });
        }
        let items: Vec<fused::SgdItem<'_>> = live
            .iter()
            .zip(&made)
            .map(|((i, p, g), new)| {
                let buf = match new {
                    Some(b) => Some((b, true)),
                    None => self.buffers[*i]
                        .as_ref()
                        .filter(|_| uses_buffer)
                        .map(|b| (b, false)),
                };
                (p, g, buf)
            })
            .collect();
        let h = fused::SgdStep {
            lr: self.lr,
            momentum,
            dampening: self.dampening,
            weight_decay: self.weight_decay,
            nesterov: self.nesterov,
        };
        fused::sgd_foreach(&items, h)?;
        drop(items);
        for ((i, ..), new) in live.iter().zip(made) {
            if let Some(b) = new {
                self.buffers[*i] = Some(b);
            }
        }
        Ok(true)
    }

    /// Momentum factor (0 disables it; negative or not finite is an error).
    pub fn momentum(mut self, m: f64) -> Result<Sgd> {
        check_non_negative("SGD", "momentum value", m)?;
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
        self.dampening = d;
        Ok(self)
    }

    /// Nesterov momentum (needs momentum > 0 and no dampening). The three
    /// settings are checked together by the first [`step`](Optimizer::step),
    /// before anything changes, so the builder calls may come in any order
    /// (`.nesterov(true)?.momentum(0.9)?` as PyTorch's keyword arguments).
    pub fn nesterov(mut self, on: bool) -> Result<Sgd> {
        self.nesterov = on;
        Ok(self)
    }

    /// PyTorch's refusal of Nesterov momentum without a momentum or with
    /// dampening.
    fn check_nesterov(&self, momentum: f64) -> Result<()> {
        if self.nesterov && (momentum <= 0.0 || self.dampening != 0.0) {
            return Err(Error::invalid(
                "SGD",
                "Nesterov momentum requires a momentum and zero dampening",
            ));
        }
        Ok(())
    }
}

impl Optimizer for Sgd {
    plain_optimizer_methods!();

    fn state(&self) -> Result<Vec<(String, Tensor)>> {
        let mut s = buffers_state("momentum_buffer", &self.buffers);
        s.push(state_mask(self.params.len(), &[&self.buffers])?);
        lr_state(&mut s, self.lr, &self.initial)?;
        cycled_state(&mut s, self.cycled)?;
        Ok(s)
    }

    fn load_state(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        check_names(
            state,
            &[
                "momentum_buffer",
                "has_state",
                "lr",
                "initial_lr",
                "cycled_momentum",
            ],
        )?;
        let buffers = load_buffers("momentum_buffer", &self.params, state)?;
        check_mask(state, self.params.len(), &[("momentum_buffer", &buffers)])?;
        let (lr, initial) = load_lr(state)?;
        let cycled = load_cycled(state, |m| self.check_momentum(m))?;
        self.buffers = buffers;
        self.lr = lr;
        self.initial.set(initial);
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

    fn set_parameters(&mut self, params: Vec<Tensor>) -> Result<()> {
        replace_parameters(&mut self.params, params, &mut [&mut self.buffers])
    }

    fn config(&self) -> Vec<(String, String)> {
        let mut c = vec![
            ("optimizer".into(), "SGD".into()),
            ("momentum".into(), self.momentum.to_string()),
            ("dampening".into(), self.dampening.to_string()),
            ("nesterov".into(), self.nesterov.to_string()),
            ("weight_decay".into(), self.weight_decay.to_string()),
        ];
        push_flags(&mut c, &[(self.maximize, "maximize")]);
        c
    }

    fn step(&mut self) -> Result<()> {
        let _ng = crate::autograd::no_grad_guard();
        let _phase = crate::backend::meta::account::enter_phase(
            crate::backend::meta::account::Phase::Optimizer,
        );
        let momentum = self.cycled.unwrap_or(self.momentum);
        self.check_nesterov(momentum)?;
        if self.foreach && self.foreach_step(momentum)? {
            return Ok(());
        }
        for (i, p) in self.params.iter().enumerate() {
            let Some(mut g) = step_gradient(p, self.maximize)? else {
                continue;
            };
            let buf = &mut self.buffers[i];
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
}

flag_setters!(Sgd {
    /// Maximizes the objective instead of minimizing it (PyTorch's
    /// `maximize=True`): each step goes up the gradient, which is negated before
    /// weight decay and momentum see it.
    maximize,
});

non_negative_setters!(Sgd, "SGD" {
    /// L2 penalty added to the gradient (negative or not finite is an error).
    weight_decay: "weight_decay value",
});
