//! Parameter groups: parts of a model trained with their own learning rate and
//! hyper-parameters (PyTorch's `param_groups`), most often the usual "no weight
//! decay on biases and norms".
//!
//! ```
//! use ember::optim::{split_for_weight_decay, Adam, Groups, Optimizer};
//! use ember::nn::{Linear, Module};
//! use ember::prelude::*;
//! let model = Linear::new(4, 2, &Device::Cpu)?;
//! let (decay, no_decay) = split_for_weight_decay(model.parameters());
//! let mut opt = Groups::new(vec![
//!     Box::new(Adam::adamw(decay, 1e-3)?.weight_decay(0.1)?),
//!     Box::new(Adam::adamw(no_decay, 1e-3)?.weight_decay(0.0)?),
//! ])?;
//! assert_eq!(opt.parameters().len(), 2);
//! opt.set_group_lrs(&[1e-3, 5e-4]);
//! assert_eq!(opt.group_lrs(), vec![1e-3, 5e-4]);
//! # Ok::<(), ember::Error>(())
//! ```

use super::Optimizer;
use crate::{
    error::{Error, Result},
    tensor::Tensor,
};

/// Several optimizers stepped as one, each over its own parameters with its own
/// settings: PyTorch's parameter groups (`[{"params": ..., "lr": ...}, ...]`).
/// Schedulers move every group from its own initial rate; the state and the run
/// configuration keep the groups apart (`group0.exp_avg.3`, `group1.weight_decay`).
pub struct Groups {
    groups: Vec<Box<dyn Optimizer>>,
    params: Vec<Tensor>,
}

impl Groups {
    /// The groups, in order; at least one, and no parameter in two of them
    /// (PyTorch: "some parameters appear in more than one parameter group").
    pub fn new(groups: Vec<Box<dyn Optimizer>>) -> Result<Groups> {
        if groups.is_empty() {
            return Err(Error::invalid(
                "Groups",
                "optimizer got an empty parameter list (give at least one group)",
            ));
        }
        let params: Vec<Tensor> = groups
            .iter()
            .flat_map(|g| g.parameters().iter().cloned())
            .collect();
        let mut ids: Vec<usize> = params.iter().map(Tensor::id).collect();
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) {
            return Err(Error::invalid(
                "Groups",
                "some parameters appear in more than one parameter group",
            ));
        }
        Ok(Groups { groups, params })
    }

    /// How many groups there are.
    pub fn len(&self) -> usize {
        self.groups.len()
    }

    /// Always false: a `Groups` has at least one group.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Group `i`, to read its settings.
    pub fn group(&self, i: usize) -> Option<&dyn Optimizer> {
        self.groups.get(i).map(|g| &**g)
    }

    /// Group `i`, to change its learning rate or momentum.
    pub fn group_mut(&mut self, i: usize) -> Option<&mut (dyn Optimizer + 'static)> {
        self.groups.get_mut(i).map(|g| &mut **g)
    }

    /// The entries of `state` that belong to group `i`, without their prefix.
    fn group_state(state: &[(String, Tensor)], i: usize) -> Vec<(String, Tensor)> {
        let prefix = format!("group{i}.");
        state
            .iter()
            .filter_map(|(k, t)| k.strip_prefix(&prefix).map(|k| (k.to_string(), t.clone())))
            .collect()
    }
}

impl Optimizer for Groups {
    fn step(&mut self) -> Result<()> {
        self.groups.iter_mut().try_for_each(|g| g.step())
    }

    fn zero_grad(&self) {
        self.groups.iter().for_each(|g| g.zero_grad());
    }

    /// The first group's learning rate.
    fn lr(&self) -> f64 {
        self.groups[0].lr()
    }

    /// Sets every group's learning rate to `lr`.
    fn set_lr(&mut self, lr: f64) {
        self.groups.iter_mut().for_each(|g| g.set_lr(lr));
    }

    fn group_lrs(&self) -> Vec<f64> {
        self.groups.iter().flat_map(|g| g.group_lrs()).collect()
    }

    fn capturable(&self) -> bool {
        self.groups.iter().all(|g| g.capturable())
    }

    fn make_capturable(&mut self) -> Result<bool> {
        let mut all = true;
        for g in &mut self.groups {
            all &= g.make_capturable()?;
        }
        Ok(all)
    }

    fn initial_lrs(&self) -> Option<Vec<f64>> {
        let mut all = Vec::new();
        for g in &self.groups {
            all.extend(g.initial_lrs()?);
        }
        Some(all)
    }

    fn record_initial_lrs(&self, lrs: &[f64]) {
        let mut rest = lrs;
        for g in &self.groups {
            let n = g.group_lrs().len().min(rest.len());
            g.record_initial_lrs(&rest[..n]);
            rest = &rest[n..];
        }
    }

    fn set_group_lrs(&mut self, lrs: &[f64]) {
        let mut rest = lrs;
        for g in &mut self.groups {
            let n = g.group_lrs().len().min(rest.len());
            g.set_group_lrs(&rest[..n]);
            rest = &rest[n..];
        }
    }

    /// The first group's momentum, if every group has one.
    fn cycled_momentum(&self) -> Option<f64> {
        let all: Option<Vec<f64>> = self.groups.iter().map(|g| g.cycled_momentum()).collect();
        all.map(|m| m[0])
    }

    /// Sets every group's momentum; if one group refuses the value, none changes.
    fn set_cycled_momentum(&mut self, m: f64) -> Result<()> {
        let before: Vec<Option<f64>> = self.groups.iter().map(|g| g.cycled_momentum()).collect();
        if before.iter().any(Option::is_none) {
            return Err(Error::invalid(
                "cycle_momentum",
                "optimizer must support momentum or beta1 with `cycle_momentum` option enabled (a group has neither)",
            ));
        }
        for (i, g) in self.groups.iter_mut().enumerate() {
            if let Err(e) = g.set_cycled_momentum(m) {
                for (h, b) in self.groups[..i].iter_mut().zip(before.iter().flatten()) {
                    // the value it had was accepted before
                    let _ = h.set_cycled_momentum(*b);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    fn state(&self) -> Result<Vec<(String, Tensor)>> {
        let mut s = Vec::new();
        for (i, g) in self.groups.iter().enumerate() {
            s.extend(
                g.state()?
                    .into_iter()
                    .map(|(k, t)| (format!("group{i}.{k}"), t)),
            );
        }
        Ok(s)
    }

    /// Loads every group's entries; an entry of no group, or a group that refuses
    /// its entries, is an error that leaves every group as it was.
    fn load_state(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        let n = self.groups.len();
        for (k, _) in state {
            let known = k
                .strip_prefix("group")
                .and_then(|r| r.split_once('.'))
                .and_then(|(i, _)| i.parse::<usize>().ok())
                .is_some_and(|i| i < n);
            if !known {
                return Err(Error::invalid(
                    "load_state",
                    format!("unexpected optimizer state entry {k:?} for an optimizer of {n} parameter groups (is the checkpoint from another optimizer?)"),
                ));
            }
        }
        let before = self
            .groups
            .iter()
            .map(|g| g.state())
            .collect::<Result<Vec<_>>>()?;
        for i in 0..n {
            if let Err(e) = self.groups[i].load_state(&Groups::group_state(state, i)) {
                for (g, b) in self.groups[..i].iter_mut().zip(&before) {
                    // its own state loads back
                    let _ = g.load_state(b);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    fn parameters(&self) -> &[Tensor] {
        &self.params
    }

    /// Hands each group its share of `params` (the same order as
    /// [`parameters`](Optimizer::parameters)).
    fn set_parameters(&mut self, params: Vec<Tensor>) -> Result<()> {
        super::state::check_replacement(&self.params, &params)?;
        let mut rest = params.as_slice();
        for i in 0..self.groups.len() {
            let (mine, others) = rest.split_at(self.groups[i].parameters().len());
            if let Err(e) = self.groups[i].set_parameters(mine.to_vec()) {
                // the groups already moved go back to the parameters they had
                let mut back = self.params.as_slice();
                for g in &mut self.groups[..i] {
                    let (theirs, others) = back.split_at(g.parameters().len());
                    let _ = g.set_parameters(theirs.to_vec());
                    back = others;
                }
                return Err(e);
            }
            rest = others;
        }
        self.params = params;
        Ok(())
    }

    fn config(&self) -> Vec<(String, String)> {
        let kinds: Vec<String> = self
            .groups
            .iter()
            .map(|g| {
                g.config()
                    .into_iter()
                    .find(|(k, _)| k == "optimizer")
                    .map_or_else(|| "?".to_string(), |(_, v)| v)
            })
            .collect();
        let mut c = vec![(
            "optimizer".to_string(),
            format!("groups[{}]", kinds.join(", ")),
        )];
        for (i, g) in self.groups.iter().enumerate() {
            c.push((
                format!("group{i}.parameters"),
                g.parameters().len().to_string(),
            ));
            c.extend(
                g.config()
                    .into_iter()
                    .filter(|(k, _)| k != "optimizer")
                    .map(|(k, v)| (format!("group{i}.{k}"), v)),
            );
        }
        c
    }
}

/// Splits parameters the usual way for weight decay: those with two or more
/// dimensions (weight matrices, convolution kernels, embedding tables) decay;
/// those with fewer (biases, the scales and shifts of LayerNorm and BatchNorm) do
/// not. Returns `(decay, no_decay)`, each in the given order.
pub fn split_for_weight_decay(params: Vec<Tensor>) -> (Vec<Tensor>, Vec<Tensor>) {
    params.into_iter().partition(|p| p.rank() >= 2)
}
