//! Adam's relatives: NAdam (Nesterov momentum), RAdam (rectified second
//! moment) and Adamax (infinity norm), as `torch.optim.NAdam`, `RAdam` and
//! `Adamax`, with PyTorch's update rules, defaults and checks.
//!
//! Their steps are composites of tensor operations per parameter (correct on
//! every device), not fused kernels nor multi-tensor launches.
//!
//! ```
//! use ember::optim::{NAdam, Optimizer};
//! use ember::prelude::*;
//! let w = Tensor::new(&[1f64, -2.], &Device::Cpu)?.requires_grad_(true)?;
//! let mut opt = NAdam::new(vec![w.clone()], 0.1)?.decoupled_weight_decay(true).weight_decay(0.01)?;
//! w.square()?.sum_all()?.backward()?;
//! opt.step()?;
//! let v = w.to_vec1::<f64>()?;
//! assert!(v[0] < 1.0 && v[1] > -2.0);
//! # Ok::<(), ember::Error>(())
//! ```

use super::adam::moment;
use super::state::*;
use super::{InitialLrs, Optimizer};
use crate::{
    error::{Error, Result},
    tensor::Tensor,
};

/// Which of the family an optimizer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    NAdam,
    RAdam,
    Adamax,
}

impl Kind {
    /// PyTorch's class name (in messages and the configuration).
    fn name(self) -> &'static str {
        match self {
            Kind::NAdam => "NAdam",
            Kind::RAdam => "RAdam",
            Kind::Adamax => "Adamax",
        }
    }

    /// The state key of the second buffer (PyTorch's).
    fn second(self) -> &'static str {
        match self {
            Kind::Adamax => "exp_inf",
            _ => "exp_avg_sq",
        }
    }
}

/// What the three keep: the settings, and per parameter its step count, its
/// first moment and its second buffer (the squared moment, or Adamax's
/// infinity norm), and NAdam's product of momentum factors.
struct Family {
    kind: Kind,
    params: Vec<Tensor>,
    lr: f64,
    betas: (f64, f64),
    eps: f64,
    weight_decay: f64,
    /// AdamW-style decay of the weights (NAdam's and RAdam's
    /// `decoupled_weight_decay`).
    decoupled: bool,
    /// NAdam's `momentum_decay`.
    momentum_decay: f64,
    /// The first beta a cyclic schedule has set, in place of `betas.0`.
    cycled: Option<f64>,
    maximize: bool,
    counts: Vec<u64>,
    m: Vec<Option<Tensor>>,
    v: Vec<Option<Tensor>>,
    /// NAdam's `mu_product` per parameter (1 before its first step).
    mu_product: Vec<f64>,
    initial: InitialLrs,
}

impl Family {
    fn new(kind: Kind, params: Vec<Tensor>, lr: f64) -> Result<Family> {
        check_lr(kind.name(), lr)?;
        let n = params.len();
        Ok(Family {
            kind,
            params,
            lr,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled: false,
            momentum_decay: 4e-3,
            cycled: None,
            maximize: false,
            counts: vec![0; n],
            m: vec![None; n],
            v: vec![None; n],
            mu_product: vec![1.0; n],
            initial: InitialLrs::default(),
        })
    }

    /// One parameter's update from its gradient `g`, at its step `t`.
    fn update(&mut self, i: usize, g: Tensor, t: u64) -> Result<()> {
        let p = &self.params[i];
        let (b1, b2) = (self.cycled.unwrap_or(self.betas.0), self.betas.1);
        let (lr, wd, eps) = (self.lr, self.weight_decay, self.eps);
        let t = t.min(i32::MAX as u64) as f64;
        let mut g = g;
        if wd != 0.0 {
            if self.decoupled {
                p.mul_(1.0 - lr * wd)?;
            } else {
                g = g.add(&p.mul(wd)?)?;
            }
        }
        let m = moment(p, &mut self.m[i])?;
        m.mul_(b1)?;
        m.add_(&g.mul(1.0 - b1)?)?;
        let v = moment(p, &mut self.v[i])?;
        match self.kind {
            Kind::Adamax => {
                v.mul_(b2)?;
                v.maximum_(&g.abs()?.add(eps)?)?;
                let clr = lr / (1.0 - b1.powf(t));
                p.sub_(&m.div(v)?.mul(clr)?)
            }
            Kind::NAdam => {
                v.mul_(b2)?;
                v.add_(&g.square()?.mul(1.0 - b2)?)?;
                let bc2 = 1.0 - b2.powf(t);
                let md = self.momentum_decay;
                let mu = b1 * (1.0 - 0.5 * 0.96f64.powf(t * md));
                let mu_next = b1 * (1.0 - 0.5 * 0.96f64.powf((t + 1.0) * md));
                self.mu_product[i] *= mu;
                let prod = self.mu_product[i];
                let denom = v.div(bc2)?.sqrt()?.add(eps)?;
                // the gradient's share, then the moment's (Nesterov's look-ahead)
                p.sub_(&g.div(&denom)?.mul(lr * (1.0 - mu) / (1.0 - prod))?)?;
                p.sub_(&m.div(&denom)?.mul(lr * mu_next / (1.0 - prod * mu_next))?)
            }
            Kind::RAdam => {
                v.mul_(b2)?;
                v.add_(&g.square()?.mul(1.0 - b2)?)?;
                let bc1 = 1.0 - b1.powf(t);
                let bc2 = 1.0 - b2.powf(t);
                let m_hat = m.div(bc1)?;
                // the length of the approximated simple moving average, and
                // its limit
                let rho_inf = 2.0 / (1.0 - b2) - 1.0;
                let rho_t = rho_inf - 2.0 * t * b2.powf(t) / bc2;
                if rho_t > 5.0 {
                    let rect = ((rho_t - 4.0) * (rho_t - 2.0) * rho_inf
                        / ((rho_inf - 4.0) * (rho_inf - 2.0) * rho_t))
                        .sqrt();
                    let adaptive = v.sqrt()?.add(eps)?.recip()?.mul(bc2.sqrt())?;
                    p.sub_(&m_hat.mul(lr)?.mul(&adaptive)?.mul(rect)?)
                } else {
                    // the variance is not yet tractable: a momentum step
                    p.sub_(&m_hat.mul(lr)?)
                }
            }
        }
    }

    fn check_beta1(&self, b: f64) -> Result<()> {
        check_beta(0, b).map_err(|e| rename(e, self.kind))
    }
}

/// A check's error under the optimizer's own name.
fn rename(e: Error, kind: Kind) -> Error {
    match e {
        Error::InvalidArgument { msg, .. } => Error::invalid(kind.name(), msg),
        e => e,
    }
}

impl Optimizer for Family {
    fn step(&mut self) -> Result<()> {
        let _ng = crate::autograd::no_grad_guard();
        let _phase = crate::backend::meta::account::enter_phase(
            crate::backend::meta::account::Phase::Optimizer,
        );
        for i in 0..self.params.len() {
            let Some(g) = step_gradient(&self.params[i], self.maximize)? else {
                continue;
            };
            self.counts[i] += 1;
            self.update(i, g, self.counts[i])?;
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

    fn initial_lrs(&self) -> Option<Vec<f64>> {
        self.initial.get()
    }

    fn record_initial_lrs(&self, lrs: &[f64]) {
        self.initial.record(lrs)
    }

    fn parameters(&self) -> &[Tensor] {
        &self.params
    }

    fn state(&self) -> Result<Vec<(String, Tensor)>> {
        let mut s = buffers_state("exp_avg", &self.m);
        s.extend(buffers_state(self.kind.second(), &self.v));
        s.push(state_mask(self.params.len(), &[&self.m, &self.v])?);
        s.push(counts_state(&self.counts)?);
        if self.kind == Kind::NAdam {
            s.push((
                "mu_product".into(),
                Tensor::from_vec(
                    self.mu_product.clone(),
                    [self.params.len()],
                    &crate::device::Device::Cpu,
                )?,
            ));
        }
        lr_state(&mut s, self.lr, &self.initial)?;
        cycled_state(&mut s, self.cycled)?;
        Ok(s)
    }

    fn load_state(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        let second = self.kind.second();
        let mut names = vec![
            "exp_avg",
            second,
            "has_state",
            "step",
            "lr",
            "initial_lr",
            "cycled_momentum",
        ];
        if self.kind == Kind::NAdam {
            names.push("mu_product");
        }
        check_names(state, &names)?;
        let m = load_buffers("exp_avg", &self.params, state)?;
        let v = load_buffers(second, &self.params, state)?;
        let n = self.params.len();
        check_mask(state, n, &[("exp_avg", &m), (second, &v)])?;
        let has_state: Vec<bool> = m.iter().map(Option::is_some).collect();
        let counts = load_counts(state, &has_state)?;
        let mu_product = if self.kind == Kind::NAdam {
            let t = &state
                .iter()
                .find(|(k, _)| k == "mu_product")
                .ok_or_else(|| {
                    Error::invalid(
                        "load_state",
                        "the optimizer state has no \"mu_product\" entry",
                    )
                })?
                .1;
            let mu: Vec<f64> = t.to_dtype(crate::dtype::DType::F64)?.to_vec()?;
            if t.rank() != 1 || mu.len() != n || mu.iter().any(|x| !x.is_finite()) {
                return Err(Error::invalid(
                    "load_state",
                    format!(
                        "the optimizer state's \"mu_product\" entry must hold one finite number per parameter ({n}), got shape {:?}",
                        t.shape()
                    ),
                ));
            }
            mu
        } else {
            vec![1.0; n]
        };
        let (lr, initial) = load_lr(state)?;
        let cycled = load_cycled(state, |b| self.check_beta1(b))?;
        (self.m, self.v, self.counts, self.mu_product) = (m, v, counts, mu_product);
        (self.lr, self.cycled) = (lr, cycled);
        self.initial.set(initial);
        Ok(())
    }

    fn set_parameters(&mut self, params: Vec<Tensor>) -> Result<()> {
        replace_parameters(&mut self.params, params, &mut [&mut self.m, &mut self.v])
    }

    fn config(&self) -> Vec<(String, String)> {
        let mut c = vec![
            ("optimizer".into(), self.kind.name().into()),
            (
                "betas".into(),
                format!("({}, {})", self.betas.0, self.betas.1),
            ),
            ("eps".into(), self.eps.to_string()),
            ("weight_decay".into(), self.weight_decay.to_string()),
        ];
        if self.kind == Kind::NAdam {
            c.push(("momentum_decay".into(), self.momentum_decay.to_string()));
        }
        push_flags(
            &mut c,
            &[
                (self.decoupled, "decoupled_weight_decay"),
                (self.maximize, "maximize"),
            ],
        );
        c
    }

    fn cycled_momentum(&self) -> Option<f64> {
        Some(self.cycled.unwrap_or(self.betas.0))
    }

    fn set_cycled_momentum(&mut self, m: f64) -> Result<()> {
        self.check_beta1(m)?;
        self.cycled = Some(m);
        Ok(())
    }
}

/// A public optimizer of the family: every `Optimizer` method is the
/// family's, and the builder setters they share.
macro_rules! family_optimizer {
    ($ty:ident) => {
        impl Optimizer for $ty {
            fn step(&mut self) -> Result<()> {
                self.0.step()
            }
            fn zero_grad(&self) {
                self.0.zero_grad()
            }
            fn lr(&self) -> f64 {
                self.0.lr()
            }
            fn set_lr(&mut self, lr: f64) {
                self.0.set_lr(lr)
            }
            fn state(&self) -> Result<Vec<(String, Tensor)>> {
                self.0.state()
            }
            fn load_state(&mut self, state: &[(String, Tensor)]) -> Result<()> {
                self.0.load_state(state)
            }
            fn parameters(&self) -> &[Tensor] {
                self.0.parameters()
            }
            fn set_parameters(&mut self, params: Vec<Tensor>) -> Result<()> {
                self.0.set_parameters(params)
            }
            fn config(&self) -> Vec<(String, String)> {
                self.0.config()
            }
            fn initial_lrs(&self) -> Option<Vec<f64>> {
                self.0.initial_lrs()
            }
            fn record_initial_lrs(&self, lrs: &[f64]) {
                self.0.record_initial_lrs(lrs)
            }
            fn cycled_momentum(&self) -> Option<f64> {
                self.0.cycled_momentum()
            }
            fn set_cycled_momentum(&mut self, m: f64) -> Result<()> {
                self.0.set_cycled_momentum(m)
            }
        }

        impl $ty {
            /// The decay rates of the first moment and of the second buffer,
            /// each in [0, 1) (PyTorch's "Invalid beta parameter at index
            /// 0/1" otherwise).
            pub fn betas(mut self, b1: f64, b2: f64) -> Result<$ty> {
                let kind = self.0.kind;
                check_beta(0, b1).map_err(|e| rename(e, kind))?;
                check_beta(1, b2).map_err(|e| rename(e, kind))?;
                self.0.betas = (b1, b2);
                Ok(self)
            }

            /// The term that keeps the denominator from 0 (finite, at least 0).
            pub fn eps(mut self, v: f64) -> Result<$ty> {
                check_non_negative(self.0.kind.name(), "epsilon value", v)?;
                self.0.eps = v;
                Ok(self)
            }

            /// The weight decay (finite, at least 0): an L2 penalty added to
            /// the gradient, or a decay of the weights themselves where
            /// decoupled.
            pub fn weight_decay(mut self, v: f64) -> Result<$ty> {
                check_non_negative(self.0.kind.name(), "weight_decay value", v)?;
                self.0.weight_decay = v;
                Ok(self)
            }

            /// Maximizes the objective instead of minimizing it (PyTorch's
            /// `maximize=True`): the gradient is negated before anything else
            /// sees it.
            pub fn maximize(mut self, on: bool) -> $ty {
                self.0.maximize = on;
                self
            }

            /// The steps each parameter has taken (PyTorch's per-parameter
            /// `step`: a step at which a parameter has no gradient does not
            /// count for it).
            pub fn param_steps(&self) -> Vec<u64> {
                self.0.counts.clone()
            }
        }
    };
}

/// Adam with Nesterov momentum (`torch.optim.NAdam`; defaults in PyTorch:
/// lr 2e-3, betas (0.9, 0.999), eps 1e-8, no weight decay, momentum_decay
/// 4e-3). The momentum factor at step `t` is
/// `beta1·(1 - 0.96^(t·momentum_decay) / 2)`. A composite of tensor
/// operations per parameter, not fused.
pub struct NAdam(Family);

impl NAdam {
    /// `lr` must be finite and at least 0.
    pub fn new(params: Vec<Tensor>, lr: f64) -> Result<NAdam> {
        Ok(NAdam(Family::new(Kind::NAdam, params, lr)?))
    }

    /// How fast the momentum factor rises towards `beta1` (finite, at least
    /// 0; PyTorch's "Invalid momentum_decay value").
    pub fn momentum_decay(mut self, v: f64) -> Result<NAdam> {
        check_non_negative("NAdam", "momentum_decay value", v)?;
        self.0.momentum_decay = v;
        Ok(self)
    }

    /// Decays the weights by `lr·weight_decay` at each step instead of adding
    /// an L2 penalty to the gradient (NAdamW; PyTorch's
    /// `decoupled_weight_decay=True`).
    pub fn decoupled_weight_decay(mut self, on: bool) -> NAdam {
        self.0.decoupled = on;
        self
    }
}

/// Adam with a rectified second moment (`torch.optim.RAdam`; defaults in
/// PyTorch: lr 1e-3, betas (0.9, 0.999), eps 1e-8, no weight decay): while
/// the moving average's length `rho_t` is at most 5 the step is a momentum
/// step without the second moment. A composite of tensor operations per
/// parameter, not fused.
pub struct RAdam(Family);

impl RAdam {
    /// `lr` must be finite and at least 0.
    pub fn new(params: Vec<Tensor>, lr: f64) -> Result<RAdam> {
        Ok(RAdam(Family::new(Kind::RAdam, params, lr)?))
    }

    /// Decays the weights by `lr·weight_decay` at each step instead of adding
    /// an L2 penalty to the gradient (PyTorch's `decoupled_weight_decay=True`).
    pub fn decoupled_weight_decay(mut self, on: bool) -> RAdam {
        self.0.decoupled = on;
        self
    }
}

/// Adam with the infinity norm in place of the second moment
/// (`torch.optim.Adamax`; defaults in PyTorch: lr 2e-3, betas (0.9, 0.999),
/// eps 1e-8, no weight decay): `exp_inf = max(beta2·exp_inf, |g| + eps)`. A
/// composite of tensor operations per parameter, not fused.
pub struct Adamax(Family);

impl Adamax {
    /// `lr` must be finite and at least 0.
    pub fn new(params: Vec<Tensor>, lr: f64) -> Result<Adamax> {
        Ok(Adamax(Family::new(Kind::Adamax, params, lr)?))
    }
}

family_optimizer!(NAdam);
family_optimizer!(RAdam);
family_optimizer!(Adamax);
