//! RMSprop and Adagrad (`torch.optim.RMSprop`, `torch.optim.Adagrad`), with
//! PyTorch's update rules, defaults and checks.

use super::state::*;
use super::state::{flag_setters, non_negative_setters, plain_optimizer_methods};
use super::{InitialLrs, Optimizer};
use crate::{error::Result, tensor::Tensor};

/// RMSprop: divides each gradient by a running root mean square of the past ones
/// (`torch.optim.RMSprop`; defaults `alpha = 0.99`, `eps = 1e-8`, no weight decay,
/// momentum or centering).
pub struct RmsProp {
    params: Vec<Tensor>,
    lr: f64,
    alpha: f64,
    eps: f64,
    weight_decay: f64,
    momentum: f64,
    /// The momentum a one-cycle schedule has set, in place of `momentum`.
    cycled: Option<f64>,
    centered: bool,
    /// Steps up the gradient ([`RmsProp::maximize`]).
    maximize: bool,
    square_avg: Vec<Option<Tensor>>,
    momentum_buffer: Vec<Option<Tensor>>,
    grad_avg: Vec<Option<Tensor>>,
    /// The rates the first schedule started from (`initial_lr`).
    initial: InitialLrs,
}

impl RmsProp {
    pub fn new(params: Vec<Tensor>, lr: f64) -> Result<RmsProp> {
        check_lr("RMSprop", lr)?;
        let n = params.len();
        Ok(RmsProp {
            params,
            lr,
            alpha: 0.99,
            eps: 1e-8,
            weight_decay: 0.0,
            momentum: 0.0,
            cycled: None,
            centered: false,
            maximize: false,
            square_avg: vec![None; n],
            momentum_buffer: vec![None; n],
            grad_avg: vec![None; n],
            initial: InitialLrs::default(),
        })
    }
}

impl Optimizer for RmsProp {
    plain_optimizer_methods!();

    fn step(&mut self) -> Result<()> {
        let _ng = crate::autograd::no_grad_guard();
        let _phase = crate::backend::meta::account::enter_phase(
            crate::backend::meta::account::Phase::Optimizer,
        );
        let a = self.alpha;
        let momentum = self.cycled.unwrap_or(self.momentum);
        for (i, p) in self.params.iter().enumerate() {
            let Some(mut g) = step_gradient(p, self.maximize)? else {
                continue;
            };
            if self.weight_decay != 0.0 {
                g = g.add(&p.mul(self.weight_decay)?)?;
            }
            let sq = match &mut self.square_avg[i] {
                Some(t) => t,
                none => none.insert(p.zeros_like()?),
            };
            sq.mul_(a)?;
            sq.add_(&g.square()?.mul(1.0 - a)?)?;
            let avg = if self.centered {
                let ga = match &mut self.grad_avg[i] {
                    Some(t) => t,
                    none => none.insert(p.zeros_like()?),
                };
                ga.mul_(a)?;
                ga.add_(&g.mul(1.0 - a)?)?;
                sq.sub(&ga.square()?)?.sqrt()?.add(self.eps)?
            } else {
                sq.sqrt()?.add(self.eps)?
            };
            if momentum > 0.0 {
                let buf = match &mut self.momentum_buffer[i] {
                    Some(t) => t,
                    none => none.insert(p.zeros_like()?),
                };
                buf.mul_(momentum)?;
                buf.add_(&g.div(&avg)?)?;
                p.sub_(&buf.mul(self.lr)?)?;
            } else {
                p.sub_(&g.div(&avg)?.mul(self.lr)?)?;
            }
        }
        Ok(())
    }

    fn state(&self) -> Result<Vec<(String, Tensor)>> {
        let mut s = buffers_state("square_avg", &self.square_avg);
        s.extend(buffers_state("momentum_buffer", &self.momentum_buffer));
        s.extend(buffers_state("grad_avg", &self.grad_avg));
        s.push(state_mask(self.params.len(), &[&self.square_avg])?);
        lr_state(&mut s, self.lr, &self.initial)?;
        cycled_state(&mut s, self.cycled)?;
        Ok(s)
    }

    fn cycled_momentum(&self) -> Option<f64> {
        Some(self.cycled.unwrap_or(self.momentum))
    }

    fn set_cycled_momentum(&mut self, m: f64) -> Result<()> {
        check_non_negative("RMSprop", "momentum value", m)?;
        self.cycled = Some(m);
        Ok(())
    }

    fn load_state(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        check_names(
            state,
            &[
                "square_avg",
                "momentum_buffer",
                "grad_avg",
                "has_state",
                "lr",
                "initial_lr",
                "cycled_momentum",
            ],
        )?;
        let sq = load_buffers("square_avg", &self.params, state)?;
        let mb = load_buffers("momentum_buffer", &self.params, state)?;
        let ga = load_buffers("grad_avg", &self.params, state)?;
        check_mask(state, self.params.len(), &[("square_avg", &sq)])?;
        let (lr, initial) = load_lr(state)?;
        let cycled = load_cycled(state, |m| {
            check_non_negative("RMSprop", "momentum value", m)
        })?;
        (
            self.square_avg,
            self.momentum_buffer,
            self.grad_avg,
            self.lr,
            self.cycled,
        ) = (sq, mb, ga, lr, cycled);
        self.initial.set(initial);
        Ok(())
    }

    fn set_parameters(&mut self, params: Vec<Tensor>) -> Result<()> {
        replace_parameters(
            &mut self.params,
            params,
            &mut [
                &mut self.square_avg,
                &mut self.momentum_buffer,
                &mut self.grad_avg,
            ],
        )
    }

    fn config(&self) -> Vec<(String, String)> {
        let mut c = vec![
            ("optimizer".into(), "RMSprop".into()),
            ("alpha".into(), self.alpha.to_string()),
            ("eps".into(), self.eps.to_string()),
            ("weight_decay".into(), self.weight_decay.to_string()),
            ("momentum".into(), self.momentum.to_string()),
            ("centered".into(), self.centered.to_string()),
        ];
        push_flags(&mut c, &[(self.maximize, "maximize")]);
        c
    }
}

/// Adagrad: divides each gradient by the root of the sum of all past squared
/// gradients (`torch.optim.Adagrad`; defaults `lr_decay = 0`, no weight decay,
/// `initial_accumulator_value = 0`, `eps = 1e-10`).
pub struct Adagrad {
    params: Vec<Tensor>,
    lr: f64,
    lr_decay: f64,
    weight_decay: f64,
    initial_accumulator_value: f64,
    eps: f64,
    /// Steps up the gradient ([`Adagrad::maximize`]).
    maximize: bool,
    sum: Vec<Option<Tensor>>,
    /// The steps each parameter has taken (PyTorch's per-parameter `step`,
    /// which the decayed rate follows).
    counts: Vec<u64>,
    /// The rates the first schedule started from (`initial_lr`).
    initial: InitialLrs,
}

impl Adagrad {
    pub fn new(params: Vec<Tensor>, lr: f64) -> Result<Adagrad> {
        check_lr("Adagrad", lr)?;
        let n = params.len();
        Ok(Adagrad {
            params,
            lr,
            lr_decay: 0.0,
            weight_decay: 0.0,
            initial_accumulator_value: 0.0,
            eps: 1e-10,
            maximize: false,
            sum: vec![None; n],
            counts: vec![0; n],
            initial: InitialLrs::default(),
        })
    }
}

impl Optimizer for Adagrad {
    plain_optimizer_methods!();

    fn step(&mut self) -> Result<()> {
        let _ng = crate::autograd::no_grad_guard();
        let _phase = crate::backend::meta::account::enter_phase(
            crate::backend::meta::account::Phase::Optimizer,
        );
        for (i, p) in self.params.iter().enumerate() {
            let Some(mut g) = step_gradient(p, self.maximize)? else {
                continue;
            };
            self.counts[i] += 1;
            let clr = self.lr / (1.0 + (self.counts[i] - 1) as f64 * self.lr_decay);
            if self.weight_decay != 0.0 {
                g = g.add(&p.mul(self.weight_decay)?)?;
            }
            let s = match &mut self.sum[i] {
                Some(t) => t,
                none => none.insert(p.full_like(self.initial_accumulator_value)?),
            };
            s.add_(&g.square()?)?;
            p.sub_(&g.div(&s.sqrt()?.add(self.eps)?)?.mul(clr)?)?;
        }
        Ok(())
    }

    fn state(&self) -> Result<Vec<(String, Tensor)>> {
        let mut s = buffers_state("sum", &self.sum);
        s.push(state_mask(self.params.len(), &[&self.sum])?);
        lr_state(&mut s, self.lr, &self.initial)?;
        s.push(counts_state(&self.counts)?);
        Ok(s)
    }

    fn load_state(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        check_names(state, &["sum", "has_state", "lr", "initial_lr", "step"])?;
        let sum = load_buffers("sum", &self.params, state)?;
        check_mask(state, self.params.len(), &[("sum", &sum)])?;
        let (lr, initial) = load_lr(state)?;
        let has_state: Vec<bool> = sum.iter().map(Option::is_some).collect();
        let counts = load_counts(state, &has_state)?;
        (self.sum, self.lr, self.counts) = (sum, lr, counts);
        self.initial.set(initial);
        Ok(())
    }

    fn set_parameters(&mut self, params: Vec<Tensor>) -> Result<()> {
        replace_parameters(&mut self.params, params, &mut [&mut self.sum])
    }

    fn config(&self) -> Vec<(String, String)> {
        let mut c = vec![
            ("optimizer".into(), "Adagrad".into()),
            ("lr_decay".into(), self.lr_decay.to_string()),
            ("weight_decay".into(), self.weight_decay.to_string()),
            (
                "initial_accumulator_value".into(),
                self.initial_accumulator_value.to_string(),
            ),
            ("eps".into(), self.eps.to_string()),
        ];
        push_flags(&mut c, &[(self.maximize, "maximize")]);
        c
    }
}

flag_setters!(RmsProp {
    /// Normalise by the variance (the mean square minus the squared mean) instead.
    centered,
    /// Maximizes the objective instead of minimizing it (PyTorch's
    /// `maximize=True`): the gradient is negated before anything else sees it.
    maximize,
});

flag_setters!(Adagrad {
    /// Maximizes the objective instead of minimizing it (PyTorch's
    /// `maximize=True`): the gradient is negated before anything else sees it.
    maximize,
});

non_negative_setters!(RmsProp, "RMSprop" {
    /// The smoothing constant of the running mean of squares.
    alpha: "alpha value",
    eps: "epsilon value",
    weight_decay: "weight_decay value",
    momentum: "momentum value",
});

non_negative_setters!(Adagrad, "Adagrad" {
    /// The learning rate at step `t` is `lr / (1 + (t - 1)·lr_decay)`.
    lr_decay: "lr_decay value",
    weight_decay: "weight_decay value",
    initial_accumulator_value: "initial_accumulator_value",
    eps: "epsilon value",
});
