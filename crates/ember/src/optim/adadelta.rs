//! Adadelta (`torch.optim.Adadelta`), with PyTorch's update rule, defaults and
//! checks. Its step is a composite of tensor operations per parameter
//! (correct on every device), not a fused kernel.

use super::state::*;
use super::state::{flag_setters, non_negative_setters, plain_optimizer_methods};
use super::{InitialLrs, Optimizer};
use crate::{
    error::{Error, Result},
    tensor::Tensor,
};

/// Adadelta: scales each gradient by the ratio of the running root mean
/// squares of past updates and of past gradients (`torch.optim.Adadelta`;
/// PyTorch's defaults are lr 1, rho 0.9, eps 1e-6, no weight decay). Not fused:
/// a few tensor operations per parameter.
///
/// ```
/// use ember::optim::{Adadelta, Optimizer};
/// use ember::prelude::*;
/// let w = Tensor::new(&[1f64, -2.], &Device::Cpu)?.requires_grad_(true)?;
/// let mut opt = Adadelta::new(vec![w.clone()], 1.0)?.rho(0.9)?;
/// w.square()?.sum_all()?.backward()?;
/// opt.step()?;
/// let v = w.to_vec1::<f64>()?;
/// assert!(v[0] < 1.0 && v[1] > -2.0);
/// # Ok::<(), ember::Error>(())
/// ```
pub struct Adadelta {
    params: Vec<Tensor>,
    lr: f64,
    rho: f64,
    eps: f64,
    weight_decay: f64,
    /// Steps up the gradient ([`Adadelta::maximize`]).
    maximize: bool,
    square_avg: Vec<Option<Tensor>>,
    acc_delta: Vec<Option<Tensor>>,
    /// The steps each parameter has taken (PyTorch's per-parameter `step`).
    counts: Vec<u64>,
    /// The rates the first schedule started from (`initial_lr`).
    initial: InitialLrs,
}

impl Adadelta {
    /// `lr` must be finite and at least 0 (PyTorch's default is 1).
    pub fn new(params: Vec<Tensor>, lr: f64) -> Result<Adadelta> {
        check_lr("Adadelta", lr)?;
        let n = params.len();
        Ok(Adadelta {
            params,
            lr,
            rho: 0.9,
            eps: 1e-6,
            weight_decay: 0.0,
            maximize: false,
            square_avg: vec![None; n],
            acc_delta: vec![None; n],
            counts: vec![0; n],
            initial: InitialLrs::default(),
        })
    }

    /// The decay of both running averages, in [0, 1] (PyTorch's "Invalid rho
    /// value" otherwise).
    pub fn rho(mut self, rho: f64) -> Result<Adadelta> {
        if !(0.0..=1.0).contains(&rho) {
            return Err(Error::invalid(
                "Adadelta",
                format!("Invalid rho value: {rho} (it must be in [0, 1])"),
            ));
        }
        self.rho = rho;
        Ok(self)
    }

    /// The steps each parameter has taken.
    pub fn param_steps(&self) -> Vec<u64> {
        self.counts.clone()
    }
}

impl Optimizer for Adadelta {
    plain_optimizer_methods!();

    fn step(&mut self) -> Result<()> {
        let _ng = crate::autograd::no_grad_guard();
        let _phase = crate::backend::meta::account::enter_phase(
            crate::backend::meta::account::Phase::Optimizer,
        );
        let (rho, eps) = (self.rho, self.eps);
        for (i, p) in self.params.iter().enumerate() {
            let Some(mut g) = step_gradient(p, self.maximize)? else {
                continue;
            };
            self.counts[i] += 1;
            if self.weight_decay != 0.0 {
                g = g.add(&p.mul(self.weight_decay)?)?;
            }
            let sq = super::adam::moment(p, &mut self.square_avg[i])?;
            sq.mul_(rho)?;
            sq.add_(&g.square()?.mul(1.0 - rho)?)?;
            let acc = super::adam::moment(p, &mut self.acc_delta[i])?;
            let delta = acc.add(eps)?.sqrt()?.div(&sq.add(eps)?.sqrt()?)?.mul(&g)?;
            acc.mul_(rho)?;
            acc.add_(&delta.square()?.mul(1.0 - rho)?)?;
            p.sub_(&delta.mul(self.lr)?)?;
        }
        Ok(())
    }

    fn state(&self) -> Result<Vec<(String, Tensor)>> {
        let mut s = buffers_state("square_avg", &self.square_avg);
        s.extend(buffers_state("acc_delta", &self.acc_delta));
        s.push(state_mask(
            self.params.len(),
            &[&self.square_avg, &self.acc_delta],
        )?);
        s.push(counts_state(&self.counts)?);
        lr_state(&mut s, self.lr, &self.initial)?;
        Ok(s)
    }

    fn load_state(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        check_names(
            state,
            &[
                "square_avg",
                "acc_delta",
                "has_state",
                "step",
                "lr",
                "initial_lr",
            ],
        )?;
        let sq = load_buffers("square_avg", &self.params, state)?;
        let acc = load_buffers("acc_delta", &self.params, state)?;
        check_mask(
            state,
            self.params.len(),
            &[("square_avg", &sq), ("acc_delta", &acc)],
        )?;
        let has_state: Vec<bool> = sq.iter().map(Option::is_some).collect();
        let counts = load_counts(state, &has_state)?;
        let (lr, initial) = load_lr(state)?;
        (self.square_avg, self.acc_delta, self.counts, self.lr) = (sq, acc, counts, lr);
        self.initial.set(initial);
        Ok(())
    }

    fn set_parameters(&mut self, params: Vec<Tensor>) -> Result<()> {
        replace_parameters(
            &mut self.params,
            params,
            &mut [&mut self.square_avg, &mut self.acc_delta],
        )
    }

    fn config(&self) -> Vec<(String, String)> {
        let mut c = vec![
            ("optimizer".into(), "Adadelta".into()),
            ("rho".into(), self.rho.to_string()),
            ("eps".into(), self.eps.to_string()),
            ("weight_decay".into(), self.weight_decay.to_string()),
        ];
        push_flags(&mut c, &[(self.maximize, "maximize")]);
        c
    }
}

flag_setters!(Adadelta {
    /// Maximizes the objective instead of minimizing it (PyTorch's
    /// `maximize=True`): the gradient is negated before anything else sees it.
    maximize,
});

non_negative_setters!(Adadelta, "Adadelta" {
    /// The term added inside both square roots (finite, at least 0).
    eps: "epsilon value",
    /// L2 penalty added to the gradient (finite, at least 0).
    weight_decay: "weight_decay value",
});
