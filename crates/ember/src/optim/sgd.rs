//! Stochastic gradient descent with momentum, dampening, Nesterov and weight
//! decay (`torch.optim.SGD`).

use super::state::*;
use super::state::{non_negative_setters, plain_optimizer_methods};
use super::{InitialLrs, Optimizer};
use crate::{Error, Result, Tensor};

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
}

impl Optimizer for Sgd {
    plain_optimizer_methods!();

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
}

non_negative_setters!(Sgd, "SGD" {
    /// L2 penalty added to the gradient (negative or not finite is an error).
    weight_decay: "weight_decay value",
});
