//! Resilient backpropagation and averaged SGD (`torch.optim.Rprop`,
//! `torch.optim.ASGD`), with PyTorch's update rules, defaults and checks.
//! Their steps are composites of tensor operations per parameter (correct on
//! every device), not fused kernels.

use super::adam::moment;
use super::state::*;
use super::state::{flag_setters, non_negative_setters, plain_optimizer_methods};
use super::{InitialLrs, Optimizer};
use crate::{
    error::{Error, Result},
    tensor::Tensor,
};

/// Rprop (`torch.optim.Rprop`; PyTorch's defaults: lr 1e-2, etas (0.5, 1.2),
/// step sizes within (1e-6, 50)): each element moves by its own step size
/// against the sign of its gradient; the step size grows by `etaplus` while
/// the gradient keeps its sign and shrinks by `etaminus` when it flips (and
/// that step is skipped). The learning rate is each element's first step size,
/// taken at the parameter's first step: as in PyTorch, a rate set later (by a
/// schedule) changes nothing for parameters that have stepped. Not fused: a
/// few tensor operations per parameter.
pub struct Rprop {
    params: Vec<Tensor>,
    lr: f64,
    etas: (f64, f64),
    step_sizes: (f64, f64),
    /// Steps up the gradient ([`Rprop::maximize`]).
    maximize: bool,
    prev: Vec<Option<Tensor>>,
    step_size: Vec<Option<Tensor>>,
    counts: Vec<u64>,
    /// The rates the first schedule started from (`initial_lr`).
    initial: InitialLrs,
}

impl Rprop {
    /// `lr` must be finite and at least 0.
    pub fn new(params: Vec<Tensor>, lr: f64) -> Result<Rprop> {
        check_lr("Rprop", lr)?;
        let n = params.len();
        Ok(Rprop {
            params,
            lr,
            etas: (0.5, 1.2),
            step_sizes: (1e-6, 50.0),
            maximize: false,
            prev: vec![None; n],
            step_size: vec![None; n],
            counts: vec![0; n],
            initial: InitialLrs::default(),
        })
    }

    /// The factors by which a step size shrinks and grows, with
    /// `0 < etaminus < 1 < etaplus` (PyTorch's "Invalid eta values").
    pub fn etas(mut self, etaminus: f64, etaplus: f64) -> Result<Rprop> {
        if !(0.0 < etaminus && etaminus < 1.0 && 1.0 < etaplus && etaplus.is_finite()) {
            return Err(Error::invalid(
                "Rprop",
                format!("Invalid eta values: {etaminus}, {etaplus}"),
            ));
        }
        self.etas = (etaminus, etaplus);
        Ok(self)
    }

    /// The smallest and largest step size, `0 <= min <= max`, both finite.
    pub fn step_sizes(mut self, min: f64, max: f64) -> Result<Rprop> {
        if !(min >= 0.0 && min <= max && max.is_finite()) {
            return Err(Error::invalid(
                "Rprop",
                format!(
                    "Invalid step sizes: {min}, {max} (they must be finite, with 0 <= min <= max)"
                ),
            ));
        }
        self.step_sizes = (min, max);
        Ok(self)
    }

    /// The steps each parameter has taken.
    pub fn param_steps(&self) -> Vec<u64> {
        self.counts.clone()
    }
}

impl Optimizer for Rprop {
    plain_optimizer_methods!();

    fn step(&mut self) -> Result<()> {
        let _ng = crate::autograd::no_grad_guard();
        let _phase = crate::backend::meta::account::enter_phase(
            crate::backend::meta::account::Phase::Optimizer,
        );
        let (minus, plus) = self.etas;
        for (i, p) in self.params.iter().enumerate() {
            let Some(g) = step_gradient(p, self.maximize)? else {
                continue;
            };
            self.counts[i] += 1;
            let prev = moment(p, &mut self.prev[i])?;
            let size = match &mut self.step_size[i] {
                Some(t) => t,
                none => none.insert(p.full_like(self.lr)?),
            };
            let sign = g.mul(prev)?.sign()?;
            let (grew, flipped) = (sign.gt(0.0)?, sign.lt(0.0)?);
            let factor = flipped.where_(minus, &size.full_like(1.0)?)?;
            let factor = grew.where_(plus, &factor)?;
            size.mul_(&factor)?;
            size.clamp_(Some(self.step_sizes.0), Some(self.step_sizes.1))?;
            // where the sign flipped this step is skipped, and the next one
            // starts afresh
            let g = flipped.where_(0.0, &g)?;
            p.sub_(&g.sign()?.mul(&*size)?)?;
            prev.copy_(&g)?;
        }
        Ok(())
    }

    fn state(&self) -> Result<Vec<(String, Tensor)>> {
        let mut s = buffers_state("prev", &self.prev);
        s.extend(buffers_state("step_size", &self.step_size));
        s.push(state_mask(
            self.params.len(),
            &[&self.prev, &self.step_size],
        )?);
        s.push(counts_state(&self.counts)?);
        lr_state(&mut s, self.lr, &self.initial)?;
        Ok(s)
    }

    fn load_state(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        check_names(
            state,
            &["prev", "step_size", "has_state", "step", "lr", "initial_lr"],
        )?;
        let prev = load_buffers("prev", &self.params, state)?;
        let size = load_buffers("step_size", &self.params, state)?;
        check_mask(
            state,
            self.params.len(),
            &[("prev", &prev), ("step_size", &size)],
        )?;
        let has_state: Vec<bool> = prev.iter().map(Option::is_some).collect();
        let counts = load_counts(state, &has_state)?;
        let (lr, initial) = load_lr(state)?;
        (self.prev, self.step_size, self.counts, self.lr) = (prev, size, counts, lr);
        self.initial.set(initial);
        Ok(())
    }

    fn set_parameters(&mut self, params: Vec<Tensor>) -> Result<()> {
        replace_parameters(
            &mut self.params,
            params,
            &mut [&mut self.prev, &mut self.step_size],
        )
    }

    fn config(&self) -> Vec<(String, String)> {
        let mut c = vec![
            ("optimizer".into(), "Rprop".into()),
            ("etas".into(), format!("({}, {})", self.etas.0, self.etas.1)),
            (
                "step_sizes".into(),
                format!("({}, {})", self.step_sizes.0, self.step_sizes.1),
            ),
        ];
        push_flags(&mut c, &[(self.maximize, "maximize")]);
        c
    }
}

/// Averaged SGD (`torch.optim.ASGD`; PyTorch's defaults: lr 1e-2, lambd 1e-4,
/// alpha 0.75, t0 1e6, no weight decay): SGD with a decaying step
/// `eta = lr / (1 + lambd·lr·t)^alpha` and weight shrinkage `1 - lambd·eta`,
/// keeping a running average of the parameters from step `t0` on
/// ([`Asgd::averages`], PyTorch's `ax`). Not fused: a few tensor operations
/// per parameter.
pub struct Asgd {
    params: Vec<Tensor>,
    lr: f64,
    lambd: f64,
    alpha: f64,
    t0: f64,
    weight_decay: f64,
    /// Steps up the gradient ([`Asgd::maximize`]).
    maximize: bool,
    ax: Vec<Option<Tensor>>,
    /// Each parameter's step size and averaging weight for its next step
    /// (PyTorch's `eta` and `mu`); `eta` starts at the rate of its first step.
    eta: Vec<f64>,
    mu: Vec<f64>,
    counts: Vec<u64>,
    /// The rates the first schedule started from (`initial_lr`).
    initial: InitialLrs,
}

impl Asgd {
    /// `lr` must be finite and at least 0.
    pub fn new(params: Vec<Tensor>, lr: f64) -> Result<Asgd> {
        check_lr("ASGD", lr)?;
        let n = params.len();
        Ok(Asgd {
            params,
            lr,
            lambd: 1e-4,
            alpha: 0.75,
            t0: 1e6,
            weight_decay: 0.0,
            maximize: false,
            ax: vec![None; n],
            eta: vec![lr; n],
            mu: vec![1.0; n],
            counts: vec![0; n],
            initial: InitialLrs::default(),
        })
    }

    /// The step at which averaging starts (finite).
    pub fn t0(mut self, t0: f64) -> Result<Asgd> {
        if !t0.is_finite() {
            return Err(Error::invalid(
                "ASGD",
                format!("Invalid t0 value: {t0} (it must be finite)"),
            ));
        }
        self.t0 = t0;
        Ok(self)
    }

    /// The averaged parameters (PyTorch's `ax`), for those that have stepped.
    pub fn averages(&self) -> Vec<Option<Tensor>> {
        self.ax.clone()
    }

    /// The steps each parameter has taken.
    pub fn param_steps(&self) -> Vec<u64> {
        self.counts.clone()
    }
}

impl Optimizer for Asgd {
    plain_optimizer_methods!();

    fn step(&mut self) -> Result<()> {
        let _ng = crate::autograd::no_grad_guard();
        let _phase = crate::backend::meta::account::enter_phase(
            crate::backend::meta::account::Phase::Optimizer,
        );
        let (lr, lambd) = (self.lr, self.lambd);
        for (i, p) in self.params.iter().enumerate() {
            let Some(mut g) = step_gradient(p, self.maximize)? else {
                continue;
            };
            if self.counts[i] == 0 {
                (self.eta[i], self.mu[i]) = (lr, 1.0);
            }
            self.counts[i] += 1;
            if self.weight_decay != 0.0 {
                g = g.add(&p.mul(self.weight_decay)?)?;
            }
            let eta = self.eta[i];
            p.mul_(1.0 - lambd * eta)?;
            p.sub_(&g.mul(eta)?)?;
            let ax = moment(p, &mut self.ax[i])?;
            if self.mu[i] != 1.0 {
                ax.add_(&p.sub(ax)?.mul(self.mu[i])?)?;
            } else {
                ax.copy_(p)?;
            }
            let t = self.counts[i] as f64;
            self.eta[i] = lr / (1.0 + lambd * lr * t).powf(self.alpha);
            self.mu[i] = 1.0 / (t - self.t0).max(1.0);
        }
        Ok(())
    }

    fn state(&self) -> Result<Vec<(String, Tensor)>> {
        let cpu = crate::device::Device::Cpu;
        let n = self.params.len();
        let mut s = buffers_state("ax", &self.ax);
        s.push(state_mask(n, &[&self.ax])?);
        s.push(counts_state(&self.counts)?);
        s.push(("eta".into(), Tensor::from_vec(self.eta.clone(), [n], &cpu)?));
        s.push(("mu".into(), Tensor::from_vec(self.mu.clone(), [n], &cpu)?));
        lr_state(&mut s, self.lr, &self.initial)?;
        Ok(s)
    }

    fn load_state(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        check_names(
            state,
            &["ax", "has_state", "step", "eta", "mu", "lr", "initial_lr"],
        )?;
        let n = self.params.len();
        let ax = load_buffers("ax", &self.params, state)?;
        check_mask(state, n, &[("ax", &ax)])?;
        let has_state: Vec<bool> = ax.iter().map(Option::is_some).collect();
        let counts = load_counts(state, &has_state)?;
        let per_param = |name: &str| -> Result<Vec<f64>> {
            let t = &state
                .iter()
                .find(|(k, _)| k == name)
                .ok_or_else(|| {
                    Error::invalid(
                        "load_state",
                        format!("the optimizer state has no {name:?} entry"),
                    )
                })?
                .1;
            let v: Vec<f64> = t.to_dtype(crate::dtype::DType::F64)?.to_vec()?;
            if t.rank() != 1 || v.len() != n || v.iter().any(|x| !x.is_finite()) {
                return Err(Error::invalid(
                    "load_state",
                    format!(
                        "the optimizer state's {name:?} entry must hold one finite number per parameter ({n}), got shape {:?}",
                        t.shape()
                    ),
                ));
            }
            Ok(v)
        };
        let (eta, mu) = (per_param("eta")?, per_param("mu")?);
        let (lr, initial) = load_lr(state)?;
        (self.ax, self.counts, self.eta, self.mu, self.lr) = (ax, counts, eta, mu, lr);
        self.initial.set(initial);
        Ok(())
    }

    fn set_parameters(&mut self, params: Vec<Tensor>) -> Result<()> {
        replace_parameters(&mut self.params, params, &mut [&mut self.ax])
    }

    fn config(&self) -> Vec<(String, String)> {
        let mut c = vec![
            ("optimizer".into(), "ASGD".into()),
            ("lambd".into(), self.lambd.to_string()),
            ("alpha".into(), self.alpha.to_string()),
            ("t0".into(), self.t0.to_string()),
            ("weight_decay".into(), self.weight_decay.to_string()),
        ];
        push_flags(&mut c, &[(self.maximize, "maximize")]);
        c
    }
}

flag_setters!(Rprop {
    /// Maximizes the objective instead of minimizing it (PyTorch's
    /// `maximize=True`): the gradient is negated before anything else sees it.
    maximize,
});

flag_setters!(Asgd {
    /// Maximizes the objective instead of minimizing it (PyTorch's
    /// `maximize=True`): the gradient is negated before anything else sees it.
    maximize,
});

non_negative_setters!(Asgd, "ASGD" {
    /// The decay term (finite, at least 0).
    lambd: "lambd value",
    /// The power of the step size's decay (finite, at least 0).
    alpha: "alpha value",
    /// L2 penalty added to the gradient (finite, at least 0).
    weight_decay: "weight_decay value",
});
