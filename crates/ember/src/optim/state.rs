//! What the optimizers share: checks of their hyper-parameters and of the
//! parameters they are given, and the state-dict helpers (moment buffers with
//! their mask of present entries, scalar entries, cycled momentum).

use crate::{
    error::{Error, Result},
    tensor::Tensor,
};

/// Where a one-cycle schedule has put the momentum: a `cycled_momentum` state
/// entry, present only once it has.
pub(super) fn cycled_state(s: &mut Vec<(String, Tensor)>, cycled: Option<f64>) -> Result<()> {
    if let Some(m) = cycled {
        s.push((
            "cycled_momentum".into(),
            Tensor::scalar(m, &crate::device::Device::Cpu)?,
        ));
    }
    Ok(())
}

/// Pushes the learning rate and, once a schedule recorded it, the rate the
/// first schedule started from (`initial_lr`, which PyTorch keeps in the groups
/// it saves): a schedule built after a resume starts from that, not from the
/// decayed rate the checkpoint holds.
pub(super) fn lr_state(
    s: &mut Vec<(String, Tensor)>,
    lr: f64,
    initial: &super::InitialLrs,
) -> Result<()> {
    let cpu = crate::device::Device::Cpu;
    s.push(("lr".into(), Tensor::scalar(lr, &cpu)?));
    if let Some([first]) = initial.get().as_deref() {
        s.push(("initial_lr".into(), Tensor::scalar(*first, &cpu)?));
    }
    Ok(())
}

/// The `lr` entry of a state and its `initial_lr` if it has one (a state
/// saved before any schedule, or by an older ember, has none), both checked.
pub(super) fn load_lr(state: &[(String, Tensor)]) -> Result<(f64, Option<Vec<f64>>)> {
    let lr = scalar_entry(state, "lr")?;
    check_lr("load_state", lr)?;
    if !state.iter().any(|(n, _)| n == "initial_lr") {
        return Ok((lr, None));
    }
    let initial = scalar_entry(state, "initial_lr")?;
    check_lr("load_state", initial)?;
    Ok((lr, Some(vec![initial])))
}

/// The `cycled_momentum` entry of a state, if it has one, checked with `check`.
pub(super) fn load_cycled(
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
pub(super) fn check_beta(i: usize, b: f64) -> Result<()> {
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
pub(super) fn check_replacement(params: &[Tensor], new: &[Tensor]) -> Result<()> {
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

pub(super) fn replace_parameters(
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
                    .map(|b| crate::autograd::no_grad(|| b.to(&q.device())))
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
pub(super) fn buffers_state(prefix: &str, bufs: &[Option<Tensor>]) -> Vec<(String, Tensor)> {
    bufs.iter()
        .enumerate()
        .filter_map(|(i, b)| b.as_ref().map(|b| (format!("{prefix}.{i}"), b.clone())))
        .collect()
}

/// Which parameters have per-parameter state (`has_state`: 1 where any of `bufs`
/// holds a buffer), saved so that loading can tell a parameter that never had state
/// from an entry missing from the file.
pub(super) fn state_mask(n: usize, bufs: &[&[Option<Tensor>]]) -> Result<(String, Tensor)> {
    let mask: Vec<u8> = (0..n)
        .map(|i| u8::from(bufs.iter().any(|b| b.get(i).is_some_and(Option::is_some))))
        .collect();
    Ok((
        "has_state".into(),
        Tensor::from_vec(mask, [n], &crate::device::Device::Cpu)?,
    ))
}

/// Checks loaded buffers against a saved `has_state` mask: a parameter marked as
/// having state must have every one of its buffers, and one not marked must have
/// none. States saved before the mask existed are taken as they are.
pub(super) fn check_mask(
    state: &[(String, Tensor)],
    n: usize,
    loaded: &[(&str, &[Option<Tensor>])],
) -> Result<()> {
    let Some((_, mask)) = state.iter().find(|(k, _)| k == "has_state") else {
        return Ok(());
    };
    let mask = mask.to_dtype(crate::dtype::DType::I64)?.to_vec::<i64>()?;
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
pub(super) fn load_buffers(
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
        out[i] = Some(crate::autograd::no_grad(|| t.to_dtype(p.dtype())?.to(&p.device()))?.copy()?);
    }
    Ok(out)
}

/// A scalar entry of an optimizer state, or an error naming it.
pub(super) fn scalar_entry(state: &[(String, Tensor)], name: &str) -> Result<f64> {
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

pub(super) fn check_names(state: &[(String, Tensor)], allowed: &[&str]) -> Result<()> {
    for (n, _) in state {
        let head = n.split('.').next().unwrap_or("");
        if !allowed.contains(&head) {
            // PyTorch's optimizer.state_dict() as torch.save wrote it
            // ({"state": {0: {"step": ..., "exp_avg": ...}}, "param_groups": [...]})
            let why = if head == "state" || head == "param_groups" {
                "this is PyTorch's optimizer state_dict() layout (state.N.exp_avg, \
                 param_groups); ember's optimizers keep their own (exp_avg.N) and do not \
                 read PyTorch's: load the model's weights, and start the optimizer afresh"
            } else {
                "is the checkpoint from another optimizer?"
            };
            return Err(Error::invalid(
                "load_state",
                format!("unexpected optimizer state entry {n:?} ({why})"),
            ));
        }
    }
    Ok(())
}

/// A learning rate must be a finite number at least 0 (PyTorch: "Invalid learning
/// rate"; PyTorch lets NaN through, ember does not).
pub(super) fn check_lr(op: &'static str, lr: f64) -> Result<()> {
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
pub(super) fn check_non_negative(op: &'static str, what: &str, v: f64) -> Result<()> {
    if !v.is_finite() || v < 0.0 {
        return Err(Error::invalid(
            op,
            format!("Invalid {what}: {v} (it must be a finite number >= 0)"),
        ));
    }
    Ok(())
}

pub(super) fn zero_all(params: &[Tensor]) {
    params.iter().for_each(|p| p.zero_grad());
}

/// The [`Optimizer`](super::Optimizer) methods every optimizer here writes
/// alike, from its `params`, `lr` and `initial` fields.
macro_rules! plain_optimizer_methods {
    () => {
        fn zero_grad(&self) {
            super::state::zero_all(&self.params)
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
    };
}
pub(super) use plain_optimizer_methods;

/// Builder setters for hyper-parameters that must be finite and at least 0,
/// each declared once with the name PyTorch's error gives it
/// (`Invalid weight_decay value: -1`).
macro_rules! non_negative_setters {
    ($ty:ident, $op:literal { $($(#[$doc:meta])* $name:ident: $what:literal),* $(,)? }) => {
        impl $ty {
            $(
                $(#[$doc])*
                pub fn $name(mut self, v: f64) -> Result<$ty> {
                    super::state::check_non_negative($op, $what, v)?;
                    self.$name = v;
                    Ok(self)
                }
            )*
        }
    };
}
pub(super) use non_negative_setters;

/// Builder setters for on/off options (`maximize`, `amsgrad`, ...), each
/// declared once with its doc.
macro_rules! flag_setters {
    ($ty:ident { $($(#[$doc:meta])* $name:ident),* $(,)? }) => {
        impl $ty {
            $(
                $(#[$doc])*
                pub fn $name(mut self, on: bool) -> $ty {
                    self.$name = on;
                    self
                }
            )*
        }
    };
}
pub(super) use flag_setters;

/// The per-parameter step counts as a `step` entry (PyTorch keeps a `step` in
/// each parameter's state): int64, one per parameter.
pub(super) fn counts_state(counts: &[u64]) -> Result<(String, Tensor)> {
    let v: Vec<i64> = counts.iter().map(|&c| c as i64).collect();
    Ok((
        "step".into(),
        Tensor::from_vec(v, [counts.len()], &crate::device::Device::Cpu)?,
    ))
}

/// The per-parameter step counts of a `step` entry: one whole number >= 0 per
/// parameter, or (files written before the counts were kept per parameter) one
/// count for all, which the parameters with state (`has_state`) took and the
/// others did not.
pub(super) fn load_counts(state: &[(String, Tensor)], has_state: &[bool]) -> Result<Vec<u64>> {
    let n = has_state.len();
    let t = &state
        .iter()
        .find(|(name, _)| name == "step")
        .ok_or_else(|| Error::invalid("load_state", "the optimizer state has no \"step\" entry"))?
        .1;
    let values: Vec<f64> = t.to_dtype(crate::dtype::DType::F64)?.to_vec()?;
    let whole = |c: f64| -> Result<u64> {
        if c >= 0.0 && c.fract() == 0.0 && c < 2f64.powi(53) {
            Ok(c as u64)
        } else {
            Err(Error::invalid(
                "load_state",
                format!("the optimizer state's step count {c} is not a whole number >= 0"),
            ))
        }
    };
    match (t.rank(), values.as_slice()) {
        (0, &[c]) => {
            let c = whole(c)?;
            if c == 0 && has_state.iter().any(|&h| h) {
                return Err(Error::invalid(
                    "load_state",
                    "the step count is 0 but some parameters have state: the count and \
                     the state do not belong together",
                ));
            }
            Ok(has_state.iter().map(|&h| if h { c } else { 0 }).collect())
        }
        (1, v) if v.len() == n => {
            let counts = v.iter().map(|&c| whole(c)).collect::<Result<Vec<u64>>>()?;
            // a parameter has moments exactly when it has taken steps
            match counts
                .iter()
                .zip(has_state)
                .position(|(&c, &h)| (c > 0) != h)
            {
                Some(i) => Err(Error::invalid(
                    "load_state",
                    format!(
                        "parameter {i} has step count {} but {} state: the counts and the \
                         state do not belong together",
                        counts[i],
                        if has_state[i] { "has" } else { "no" }
                    ),
                )),
                None => Ok(counts),
            }
        }
        _ => Err(Error::invalid(
            "load_state",
            format!(
                "the optimizer state's \"step\" entry has shape {:?}: one count per parameter \
                 ({n}) was expected",
                t.shape()
            ),
        )),
    }
}

/// `p`'s gradient to step by: its own, or its negation for an optimizer that
/// maximizes (PyTorch's `maximize=True`, which negates it before anything else
/// sees it).
pub(super) fn step_gradient(p: &Tensor, maximize: bool) -> Result<Option<Tensor>> {
    match p.grad() {
        Some(g) if maximize => Ok(Some(g.neg()?)),
        g => Ok(g),
    }
}

/// Appends the boolean options that are on (`name = true`) to an optimizer's
/// configuration. An option that is off is not named, so that the
/// configurations of runs saved before it existed still match.
pub(super) fn push_flags(c: &mut Vec<(String, String)>, flags: &[(bool, &str)]) {
    for &(on, name) in flags {
        if on {
            c.push((name.into(), "true".into()));
        }
    }
}
