//! Adam and AdamW (`torch.optim.Adam`, `AdamW`).

use super::state::*;
use super::state::{flag_setters, non_negative_setters, plain_optimizer_methods};
use super::{fused, InitialLrs, Optimizer};
use crate::{
    error::{Error, Result},
    tensor::Tensor,
};

/// A parameter to step: `[parameter, gradient, first moment, second moment]`
/// and its AMSGrad maximum.
type Item = ([Tensor; 4], Option<Tensor>);

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
    /// The steps each parameter has taken (PyTorch keeps a `step` in each
    /// parameter's state): a step at which a parameter has no gradient leaves its
    /// count, and so its bias corrections, where they were.
    counts: Vec<u64>,
    m: Vec<Option<Tensor>>,
    v: Vec<Option<Tensor>>,
    /// AMSGrad's running maximum of `v` ([`Adam::amsgrad`]), made at a
    /// parameter's first step.
    vmax: Vec<Option<Tensor>>,
    amsgrad: bool,
    /// Steps up the gradient ([`Adam::maximize`]).
    maximize: bool,
    /// Capturable form ([`Optimizer::make_capturable`]): the counts on the
    /// parameters' device (made at the next step from `counts`), read by the
    /// bias corrections there.
    capturable: bool,
    on_device: Option<DeviceCounts>,
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
            counts: vec![0; n],
            m: vec![None; n],
            v: vec![None; n],
            vmax: vec![None; n],
            amsgrad: false,
            maximize: false,
            capturable: false,
            on_device: None,
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

    /// Steps taken so far: the most any parameter has taken (every step, when
    /// every parameter has a gradient at each). In the capturable form the counts
    /// are read from the device (a wait for it), counting replays of captured
    /// steps.
    pub fn steps(&self) -> u64 {
        self.param_steps().into_iter().max().unwrap_or(0)
    }

    /// The steps each parameter has taken: a step at which a parameter has no
    /// gradient does not count for it, and its bias corrections start from its
    /// own first step (PyTorch's per-parameter `step`).
    pub fn param_steps(&self) -> Vec<u64> {
        match &self.on_device {
            Some(d) => d.read(&self.counts),
            None => self.counts.clone(),
        }
    }

    /// (index, [parameter, gradient, moments]) of every parameter with a
    /// gradient, the moments made at their first step.
    fn items_to_step(&mut self) -> Result<Vec<(usize, [Tensor; 4])>> {
        let mut items = Vec::new();
        for (i, ((p, m), v)) in self
            .params
            .iter()
            .zip(self.m.iter_mut())
            .zip(self.v.iter_mut())
            .enumerate()
        {
            let Some(g) = step_gradient(p, self.maximize)? else {
                continue;
            };
            if self.amsgrad {
                moment(p, &mut self.vmax[i])?;
            }
            let (m, v) = (moment(p, m)?.clone(), moment(p, v)?.clone());
            items.push((i, [p.clone(), g, m, v]));
        }
        Ok(items)
    }

    /// The capturable step: the counts kept on the device and advanced there,
    /// the bias corrections computed from them there (no value that changes from
    /// step to step passed from the host): on a GPU by the multi-tensor kernel,
    /// which reads a count ([`Adam::foreach`]); the parameters it does not take by
    /// tensor operations that read the corrections. Parameters that have stepped
    /// together share one count (one launch per 48 of them).
    fn capturable_step(&mut self, b1: f64, b2: f64) -> Result<()> {
        let (dev, capture) = match self.params.first() {
            Some(p) => (p.device(), p.read().capture_id()),
            None => return Ok(()),
        };
        let capturing = capture.is_some();
        let items = self.items_to_step()?;
        let d = match self.on_device.take() {
            Some(d) => d,
            None => DeviceCounts::new(&self.counts, &dev)?,
        };
        let d = self.on_device.insert(d);
        let first = self.params[0].read();
        d.captured.retain(|&id| first.graph_alive(id));
        drop(first);
        let cohorts = d.advance(&items, capturing, !d.captured.is_empty())?;
        d.captured.extend(capture);
        for (t, members) in cohorts {
            t.add_(1.0)?;
            let mut group = Vec::with_capacity(members.len());
            for k in members {
                let i = items[k].0;
                self.counts[i] += 1;
                group.push((items[k].1.clone(), self.vmax[i].clone()));
            }
            self.capturable_update(group, &t, b1, b2)?;
        }
        Ok(())
    }

    /// The capturable update of `items` (parameters that have taken the same
    /// steps, each with its AMSGrad maximum) with their count `t` on the device,
    /// already advanced.
    fn capturable_update(&self, items: Vec<Item>, t: &Tensor, b1: f64, b2: f64) -> Result<()> {
        let (lr, eps, wd, decoupled) = (self.lr, self.eps, self.weight_decay, self.decoupled);
        let done = if self.foreach && !self.amsgrad {
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
            let refs: Vec<[&Tensor; 4]> =
                items.iter().map(|([p, g, m, v], _)| [p, g, m, v]).collect();
            fused::adam_foreach(&refs, h, Some(t))?
        } else {
            vec![false; items.len()]
        };
        // 1 - b^t as exp(t ln b): ln 0 = -inf gives 1 for a beta of 0
        let correction = |b: f64| -> Result<Tensor> { t.mul(b.ln())?.exp()?.neg()?.add(1.0) };
        let mut corrections = None;
        // lr / bc1 and sqrt(bc2), in each parameter dtype once
        let mut per_dtype: Vec<(crate::dtype::DType, Tensor, Tensor)> = Vec::new();
        for (([p, g, m, v], vmax), done) in items.into_iter().zip(done) {
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
                (&m, &v, vmax.as_ref()),
                (b1, b2),
                (lr, eps, wd, decoupled),
                (&step_size).into(),
                (&sqrt_bc2).into(),
            )?;
        }
        Ok(())
    }
}

/// The capturable form's step counts on the parameters' device: one float64
/// scalar per cohort of parameters that have taken the same steps
/// (`cohort[i]` is parameter `i`'s), which the kernels read and advance.
struct DeviceCounts {
    scalars: Vec<Tensor>,
    cohort: Vec<usize>,
    /// The captures of a step (graphs named by their memory pools): while
    /// one of their graphs lives, its replays advance the scalars it captured,
    /// so the cohorts may not split.
    captured: Vec<u32>,
}

impl DeviceCounts {
    /// The counts `counts` on `dev`, parameters with equal counts in one cohort.
    fn new(counts: &[u64], dev: &crate::device::Device) -> Result<DeviceCounts> {
        let mut values: Vec<u64> = Vec::new();
        let mut cohort = Vec::with_capacity(counts.len());
        for &c in counts {
            let k = match values.iter().position(|&v| v == c) {
                Some(k) => k,
                None => {
                    values.push(c);
                    values.len() - 1
                }
            };
            cohort.push(k);
        }
        let scalars = values
            .iter()
            .map(|&c| Tensor::scalar(c as f64, dev))
            .collect::<Result<_>>()?;
        Ok(DeviceCounts {
            scalars,
            cohort,
            captured: Vec::new(),
        })
    }

    /// Each parameter's count, read from the device (`host` where a read fails).
    fn read(&self, host: &[u64]) -> Vec<u64> {
        let values: Vec<Option<u64>> = self
            .scalars
            .iter()
            .map(|t| t.item::<f64>().ok().map(|v| v as u64))
            .collect();
        self.cohort
            .iter()
            .zip(host)
            .map(|(&k, &h)| values[k].unwrap_or(h))
            .collect()
    }

    /// The counts of the parameters stepping now (`items`, by index), each
    /// with the positions in `items` of the parameters that share it. Those that
    /// step without the rest of their cohort leave it with a copy of its count
    /// (a copy a captured graph would repeat at each replay, so refused while
    /// capturing; and after a capture, whose replays would go on advancing the
    /// count the parameters left).
    fn advance(
        &mut self,
        items: &[(usize, [Tensor; 4])],
        capturing: bool,
        graph_lives: bool,
    ) -> Result<Vec<(Tensor, Vec<usize>)>> {
        let mut touched: Vec<(usize, Vec<usize>)> = Vec::new();
        for (k, (i, _)) in items.iter().enumerate() {
            let c = self.cohort[*i];
            match touched.iter_mut().find(|(t, _)| *t == c) {
                Some((_, ks)) => ks.push(k),
                None => touched.push((c, vec![k])),
            }
        }
        for (c, ks) in touched.iter_mut() {
            let members = self.cohort.iter().filter(|&&k| k == *c).count();
            if members == ks.len() {
                continue;
            }
            if capturing {
                return Err(Error::invalid(
                    "Adam::step",
                    "while a CUDA graph is captured, some parameters have a gradient and \
                     others that took the same steps so far have none: take one eager step \
                     with this set of gradients before capturing",
                ));
            }
            if graph_lives {
                return Err(Error::invalid(
                    "Adam::step",
                    "a CUDA graph captured this optimizer's step, and now some parameters \
                     have a gradient and others that took the same steps have none: the \
                     graph's replays would advance a count these parameters no longer \
                     read; step with the same set of gradients as the graph, or use a new \
                     optimizer (its state loaded) for this one",
                ));
            }
            self.scalars.push(self.scalars[*c].copy()?);
            let new = self.scalars.len() - 1;
            for &k in ks.iter() {
                self.cohort[items[k].0] = new;
            }
            *c = new;
        }
        Ok(touched
            .into_iter()
            .map(|(c, ks)| (self.scalars[c].clone(), ks))
            .collect())
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
/// capturable form). With AMSGrad's `vmax`, it takes the larger of itself and
/// `v`, and divides in place of `v`.
pub(super) fn adam_update(
    p: &Tensor,
    mut g: Tensor,
    (m, v, vmax): (&Tensor, &Tensor, Option<&Tensor>),
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
    let second = match vmax {
        Some(vmax) => {
            vmax.maximum_(v)?;
            vmax
        }
        None => v,
    };
    let denom = second.sqrt()?.div(sqrt_bc2)?.add(eps)?;
    p.sub_(&m.div(&denom)?.mul(step_size)?)
}

impl Optimizer for Adam {
    plain_optimizer_methods!();

    fn state(&self) -> Result<Vec<(String, Tensor)>> {
        let mut s = buffers_state("exp_avg", &self.m);
        s.extend(buffers_state("exp_avg_sq", &self.v));
        if self.amsgrad {
            s.extend(buffers_state("max_exp_avg_sq", &self.vmax));
        }
        s.push(state_mask(self.params.len(), &[&self.m, &self.v])?);
        s.push(counts_state(&self.param_steps())?);
        lr_state(&mut s, self.lr, &self.initial)?;
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
                "max_exp_avg_sq",
                "has_state",
                "step",
                "lr",
                "initial_lr",
                "cycled_momentum",
            ],
        )?;
        let m = load_buffers("exp_avg", &self.params, state)?;
        let v = load_buffers("exp_avg_sq", &self.params, state)?;
        let vmax = load_buffers("max_exp_avg_sq", &self.params, state)?;
        check_mask(
            state,
            self.params.len(),
            &[("exp_avg", &m), ("exp_avg_sq", &v)],
        )?;
        // AMSGrad's maximum is there exactly when the state was saved with it
        let saved_with = vmax.iter().any(Option::is_some);
        if saved_with && !self.amsgrad {
            return Err(Error::invalid(
                "load_state",
                "the optimizer state has max_exp_avg_sq entries (it was saved with \
                 amsgrad): make this Adam with .amsgrad(true) to load it",
            ));
        }
        if self.amsgrad {
            if !saved_with && m.iter().any(Option::is_some) {
                return Err(Error::invalid(
                    "load_state",
                    "the optimizer state has no max_exp_avg_sq entries (it was saved \
                     without amsgrad): make this Adam without .amsgrad(true) to load it",
                ));
            }
            check_mask(state, self.params.len(), &[("max_exp_avg_sq", &vmax)])?;
        }
        let has_state: Vec<bool> = m.iter().map(Option::is_some).collect();
        let counts = load_counts(state, &has_state)?;
        let (lr, initial) = load_lr(state)?;
        let cycled = load_cycled(state, |b| check_beta(0, b))?;
        (self.m, self.v, self.vmax) = (m, v, vmax);
        (self.counts, self.lr, self.cycled) = (counts, lr, cycled);
        self.initial.set(initial);
        self.on_device = None;
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
        replace_parameters(
            &mut self.params,
            params,
            &mut [&mut self.m, &mut self.v, &mut self.vmax],
        )?;
        // the counts move with the parameters (made again on their device)
        self.counts = self.param_steps();
        self.on_device = None;
        Ok(())
    }

    fn config(&self) -> Vec<(String, String)> {
        let kind = if self.decoupled { "AdamW" } else { "Adam" };
        let mut c = vec![
            ("optimizer".into(), kind.into()),
            (
                "betas".into(),
                format!("({}, {})", self.betas.0, self.betas.1),
            ),
            ("eps".into(), self.eps.to_string()),
            ("weight_decay".into(), self.weight_decay.to_string()),
        ];
        push_flags(
            &mut c,
            &[(self.amsgrad, "amsgrad"), (self.maximize, "maximize")],
        );
        c
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
        let items = self.items_to_step()?;
        // the parameters that have taken as many steps share their corrections
        let mut by_count: Vec<(u64, Vec<Item>)> = Vec::new();
        for (i, item) in items {
            self.counts[i] += 1;
            let c = self.counts[i];
            let item = (item, self.vmax[i].clone());
            match by_count.iter_mut().find(|(k, _)| *k == c) {
                Some((_, group)) => group.push(item),
                None => by_count.push((c, vec![item])),
            }
        }
        for (count, items) in by_count {
            let t = count.min(i32::MAX as u64) as i32;
            let (bc1, bc2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
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
            // AMSGrad's maximum is not in the fused kernels
            let fuse = !self.amsgrad;
            let done = if self.foreach && fuse {
                let refs: Vec<[&Tensor; 4]> =
                    items.iter().map(|([p, g, m, v], _)| [p, g, m, v]).collect();
                fused::adam_foreach(&refs, h, None)?
            } else {
                vec![false; items.len()]
            };
            for (([p, g, m, v], vmax), done) in items.into_iter().zip(done) {
                if done || fuse && fused::adam(&p, &g, &m, &v, h)? {
                    continue;
                }
                let (p, m, v) = (&p, &m, &v);
                let (lr, eps, wd, decoupled) =
                    (self.lr, self.eps, self.weight_decay, self.decoupled);
                let (step_size, sqrt_bc2) = (lr / bc1, bc2.sqrt());
                adam_update(
                    p,
                    g,
                    (m, v, vmax.as_ref()),
                    (b1, b2),
                    (lr, eps, wd, decoupled),
                    step_size.into(),
                    sqrt_bc2.into(),
                )?;
            }
        }
        Ok(())
    }
}

flag_setters!(Adam {
    /// AMSGrad (PyTorch's `amsgrad=True`): the update divides by the square root
    /// of the largest second moment seen so far (kept per parameter as
    /// `max_exp_avg_sq`) instead of the current one. Its steps run as tensor
    /// operations, without the fused and multi-tensor kernels.
    amsgrad,
    /// Maximizes the objective instead of minimizing it (PyTorch's
    /// `maximize=True`): each step goes up the gradient, which is negated before
    /// weight decay and the moments see it.
    maximize,
});

non_negative_setters!(Adam, "Adam" {
    /// The term added to the denominator (finite, at least 0).
    eps: "epsilon value",
    /// L2 penalty (Adam) or decoupled decay (AdamW), finite and at least 0.
    weight_decay: "weight_decay value",
});
