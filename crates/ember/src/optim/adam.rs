//! Adam and AdamW (`torch.optim.Adam`, `AdamW`), with AMSGrad.

use super::state::*;
use super::state::{non_negative_setters, plain_optimizer_methods};
use super::{fused, InitialLrs, Optimizer};
use crate::{
    error::{Error, Result},
    tensor::Tensor,
};

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
    /// Multi-tensor steps on GPUs ([`Adam::foreach`]).
    foreach: bool,
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
            foreach: true,
        })
    }

    /// Whether a step on a GPU updates many parameters per launch (PyTorch's
    /// `foreach=True`, its default on CUDA, and ember's): up to 48 tensors of a
    /// device and dtype per kernel instead of one launch each, with the same
    /// arithmetic, so the same results to the bit. Off, every parameter has its
    /// own launch. CPU parameters are updated one by one either way.
    pub fn foreach(mut self, on: bool) -> Adam {
        self.foreach = on;
        self
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

    /// (parameter, gradient, moments) of every parameter with a gradient, the
    /// moments made at their first step.
    fn items_to_step(&mut self) -> Result<Vec<[Tensor; 4]>> {
        let mut items = Vec::new();
        for ((p, m), v) in self
            .params
            .iter()
            .zip(self.m.iter_mut())
            .zip(self.v.iter_mut())
        {
            let Some(g) = p.grad() else { continue };
            let (m, v) = (moment(p, m)?.clone(), moment(p, v)?.clone());
            items.push([p.clone(), g, m, v]);
        }
        Ok(items)
    }

    /// The capturable step: the count kept on the device and advanced there, the
    /// bias corrections computed from it there (no value that changes from step
    /// to step passed from the host): on a GPU by the multi-tensor kernel, which
    /// reads the count ([`Adam::foreach`]); the parameters it does not take by
    /// tensor operations that read the corrections.
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
        let (lr, eps, wd, decoupled) = (self.lr, self.eps, self.weight_decay, self.decoupled);
        let items = self.items_to_step()?;
        let done = if self.foreach {
            // the corrections are the kernel's, from t: these are unused
            let h = fused::AdamStep {
                lr,
                b1,
                b2,
                eps,
                bc1: 1.0,
                bc2: 1.0,
                weight_decay: wd,
                decoupled,
            };
            let refs: Vec<[&Tensor; 4]> = items.iter().map(|[p, g, m, v]| [p, g, m, v]).collect();
            fused::adam_foreach(&refs, h, Some(&t))?
        } else {
            vec![false; items.len()]
        };
        // 1 - b^t as exp(t ln b): ln 0 = -inf gives 1 for a beta of 0
        let correction = |b: f64| -> Result<Tensor> { t.mul(b.ln())?.exp()?.neg()?.add(1.0) };
        let mut corrections = None;
        // lr / bc1 and sqrt(bc2), in each parameter dtype once
        let mut per_dtype: Vec<(crate::dtype::DType, Tensor, Tensor)> = Vec::new();
        for ([p, g, m, v], done) in items.into_iter().zip(done) {
            if done {
                continue;
            }
            let (bc1, bc2) = match &corrections {
                Some(c) => c,
                None => corrections.insert((correction(b1)?, correction(b2)?)),
            };
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
            adam_update(
                &p,
                g,
                (&m, &v),
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
pub(super) fn moment<'a>(p: &Tensor, slot: &'a mut Option<Tensor>) -> Result<&'a Tensor> {
    match slot {
        Some(t) => Ok(t),
        None => Ok(slot.insert(p.zeros_like()?)),
    }
}

/// Adam's update of `p` from its gradient `g` in tensor operations, PyTorch's
/// form: `p -= step_size · m / (sqrt(v) / sqrt_bc2 + eps)`, where `step_size` is
/// `lr / bc1`; the corrections are numbers, or tensors on the device (the
/// capturable form).
pub(super) fn adam_update(
    p: &Tensor,
    mut g: Tensor,
    (m, v): (&Tensor, &Tensor),
    (b1, b2): (f64, f64),
    (lr, eps, weight_decay, decoupled): (f64, f64, f64, bool),
    step_size: crate::tensor::Operand<'_>,
    sqrt_bc2: crate::tensor::Operand<'_>,
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
    plain_optimizer_methods!();

    fn state(&self) -> Result<Vec<(String, Tensor)>> {
        let mut s = buffers_state("exp_avg", &self.m);
        s.extend(buffers_state("exp_avg_sq", &self.v));
        s.push(state_mask(self.params.len(), &[&self.m, &self.v])?);
        s.push((
            "step".into(),
            Tensor::scalar(self.steps() as i64, &crate::device::Device::Cpu)?,
        ));
        s.push((
            "lr".into(),
            Tensor::scalar(self.lr, &crate::device::Device::Cpu)?,
        ));
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
        let _ng = crate::autograd::no_grad_guard();
        let _phase = crate::backend::meta::account::enter_phase(
            crate::backend::meta::account::Phase::Optimizer,
        );
        let (b1, b2) = (self.cycled.unwrap_or(self.betas.0), self.betas.1);
        if self.capturable {
            return self.capturable_step(b1, b2);
        }
        self.step += 1;
        let bc1 = 1.0 - b1.powi(self.step as i32);
        let bc2 = 1.0 - b2.powi(self.step as i32);
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
        let items = self.items_to_step()?;
        let done = if self.foreach {
            let refs: Vec<[&Tensor; 4]> = items.iter().map(|[p, g, m, v]| [p, g, m, v]).collect();
            fused::adam_foreach(&refs, h, None)?
        } else {
            vec![false; items.len()]
        };
        for ([p, g, m, v], done) in items.into_iter().zip(done) {
            if done || fused::adam(&p, &g, &m, &v, h)? {
                continue;
            }
            let (p, m, v) = (&p, &m, &v);
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
}

non_negative_setters!(Adam, "Adam" {
    /// The term added to the denominator (finite, at least 0).
    eps: "epsilon value",
    /// L2 penalty (Adam) or decoupled decay (AdamW), finite and at least 0.
    weight_decay: "weight_decay value",
});
