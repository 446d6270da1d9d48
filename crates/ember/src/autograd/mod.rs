//! Reverse-mode automatic differentiation.
//!
//! An operation records a node on its output only when grad mode is on and one
//! of its inputs requires a gradient. The node holds the inputs (for the walk back)
//! and a one-shot closure that maps the output's gradient to the inputs' gradients;
//! the closure owns whatever the rule saved, so saved tensors are freed as soon as
//! `backward` has used them. Each rule is written beside its forward op.
//!
//! ```
//! use ember::prelude::*;
//! let x = Tensor::new(&[1f64, 2., 3.], &Device::Cpu)?.requires_grad_(true)?;
//! let y = x.mul(&x)?.sum_all()?; // y = Σ x²
//! y.backward()?;
//! assert_eq!(x.grad().unwrap().to_vec1::<f64>()?, vec![2., 4., 6.]);
//! # Ok::<(), ember::Error>(())
//! ```

use crate::{Error, Result, Tensor};
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Gradients of a node's inputs, in input order (`None`: no gradient flows there).
pub(crate) type Grads = Vec<Option<Tensor>>;
/// A rule: the output's gradient and the node's inputs to the inputs' gradients.
type BackwardFn = Box<dyn FnOnce(&Tensor, &[Tensor]) -> Result<Grads> + Send + Sync>;
/// A rule that saved nothing of the forward pass's values (a view's), which
/// backward can run again.
type ReusableFn = Arc<dyn Fn(&Tensor, &[Tensor]) -> Result<Grads> + Send + Sync>;
type Inputs = smallvec::SmallVec<[Tensor; 2]>;

enum Rule {
    /// Frees what it saved when it runs: a second backward through it is an error.
    Once(BackwardFn),
    /// Kept after it runs, as PyTorch keeps nodes that saved no tensors: graphs
    /// that share a view can each be backpropagated through it.
    Reusable(ReusableFn),
}

/// How an op output was computed: its inputs and the rule that sends gradients back.
/// It lives inside the output tensor, and is emptied by `backward` (unless its
/// rule is reusable).
pub(crate) struct Node {
    name: &'static str,
    inner: Mutex<Option<(Inputs, Rule)>>,
}

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
}

/// `true` unless inside [`no_grad`] on this thread.
pub fn is_grad_enabled() -> bool {
    GRAD_ENABLED.with(|g| g.get())
}

/// Restores the previous grad mode when dropped (see [`no_grad_guard`]).
pub struct GradModeGuard {
    previous: bool,
}

impl Drop for GradModeGuard {
    fn drop(&mut self) {
        GRAD_ENABLED.with(|g| g.set(self.previous));
    }
}

/// Turns graph recording off on this thread until the guard drops
/// (`with torch.no_grad():`).
pub fn no_grad_guard() -> GradModeGuard {
    let previous = GRAD_ENABLED.with(|g| g.replace(false));
    GradModeGuard { previous }
}

/// Runs `f` without recording a graph (`torch.no_grad()`).
pub fn no_grad<R>(f: impl FnOnce() -> R) -> R {
    let _g = no_grad_guard();
    f()
}

/// `true` when an op on `inputs` must record a node.
pub(crate) fn needs_grad(inputs: &[&Tensor]) -> bool {
    is_grad_enabled() && inputs.iter().any(|t| t.requires_grad())
}

/// Sums `grad` down to `shape` (undoing broadcasting).
pub(crate) fn sum_to(grad: &Tensor, shape: &[usize]) -> Result<Tensor> {
    if grad.shape() == shape {
        return Ok(grad.clone());
    }
    let lead = grad.rank() - shape.len();
    let mut dims: Vec<usize> = (0..lead).collect();
    for (i, &n) in shape.iter().enumerate() {
        if n == 1 && grad.shape()[lead + i] != 1 {
            dims.push(lead + i);
        }
    }
    let g = if dims.is_empty() {
        grad.clone()
    } else {
        grad.sum(dims, true)?
    };
    g.reshape(shape)
}

impl Tensor {
    /// Attaches a node to `out` when one of `inputs` requires a gradient; `rule`
    /// builds the backward closure only in that case.
    pub(crate) fn record<F>(
        out: Tensor,
        name: &'static str,
        inputs: &[&Tensor],
        rule: impl FnOnce(&Tensor) -> F,
    ) -> Tensor
    where
        F: FnOnce(&Tensor) -> Result<Grads> + Send + Sync + 'static,
    {
        Tensor::record_inputs(out, name, inputs, |y| {
            let f = rule(y);
            move |g: &Tensor, _: &[Tensor]| f(g)
        })
    }

    /// [`record`](Self::record) for rules that read the inputs from the node instead
    /// of saving their own copies: a rule that captures nothing costs no allocation.
    pub(crate) fn record_inputs<F>(
        out: Tensor,
        name: &'static str,
        inputs: &[&Tensor],
        rule: impl FnOnce(&Tensor) -> F,
    ) -> Tensor
    where
        F: FnOnce(&Tensor, &[Tensor]) -> Result<Grads> + Send + Sync + 'static,
    {
        if !needs_grad(inputs) {
            return out;
        }
        // the rule sees `out` before it gets its node, so what it saves of the output
        // cannot keep the node alive (no reference cycle)
        let f: BackwardFn = Box::new(rule(&out));
        out.attach(name, inputs, Rule::Once(f))
    }

    /// [`record`](Self::record) for a rule that saves nothing of the forward
    /// values (views): its node survives backward, so two graphs that share the
    /// output can each backpropagate through it.
    pub(crate) fn record_reusable<F>(
        out: Tensor,
        name: &'static str,
        inputs: &[&Tensor],
        rule: impl FnOnce(&Tensor) -> F,
    ) -> Tensor
    where
        F: Fn(&Tensor) -> Result<Grads> + Send + Sync + 'static,
    {
        if !needs_grad(inputs) {
            return out;
        }
        let f = rule(&out);
        let f: ReusableFn = Arc::new(move |g: &Tensor, _: &[Tensor]| f(g));
        out.attach(name, inputs, Rule::Reusable(f))
    }

    fn attach(mut self, name: &'static str, inputs: &[&Tensor], rule: Rule) -> Tensor {
        let node = Node {
            name,
            inner: Mutex::new(Some((inputs.iter().map(|t| (*t).clone()).collect(), rule))),
        };
        match self.set_node(node) {
            Ok(()) => self,
            // the rule kept a handle on the output: give the node to a new handle
            Err(node) => self.with_node(node),
        }
    }

    /// Computes the gradient of this scalar with respect to every leaf that requires
    /// one, and adds it to their `.grad()`. The graph is consumed: a second backward
    /// through the same ops is an error.
    pub fn backward(&self) -> Result<()> {
        if self.numel() != 1 {
            return Err(Error::invalid(
                "backward",
                format!(
                    "grad can be implicitly created only for scalar outputs (shape {:?})",
                    self.shape()
                ),
            ));
        }
        self.backward_with(&self.ones_like()?)
    }

    /// Backward from this tensor with `grad` as its gradient (`t.backward(grad)`).
    pub fn backward_with(&self, grad: &Tensor) -> Result<()> {
        if !self.requires_grad() {
            return Err(Error::invalid(
                "backward",
                "element 0 of tensors does not require grad and does not have a grad_fn",
            ));
        }
        if grad.shape() != self.shape() {
            return Err(Error::shape(
                "backward",
                self.shape(),
                grad.shape(),
                "grad must have the output's shape",
            ));
        }
        let _no_grad = no_grad_guard();
        let _phase = crate::meta::enter_phase(crate::meta::Phase::Backward);
        // topological order of the nodes reachable from self (iterative DFS)
        let mut order: Vec<Tensor> = Vec::new();
        let mut seen: HashMap<usize, ()> = HashMap::new();
        let mut stack: Vec<(Tensor, bool)> = vec![(self.clone(), false)];
        while let Some((t, expanded)) = stack.pop() {
            if expanded {
                order.push(t);
                continue;
            }
            if seen.insert(t.id(), ()).is_some() {
                continue;
            }
            stack.push((t.clone(), true));
            if let Some(node) = t.node() {
                let guard = node.inner.lock().unwrap_or_else(|p| p.into_inner());
                match &*guard {
                    Some((inputs, _)) => {
                        for p in inputs.iter().filter(|p| p.requires_grad()) {
                            stack.push((p.clone(), false));
                        }
                    }
                    None => {
                        return Err(Error::invalid(
                            "backward",
                            format!("trying to backward through the graph a second time ({} was already used)", node.name),
                        ))
                    }
                }
            }
        }
        let mut grads: HashMap<usize, Tensor> = HashMap::new();
        grads.insert(self.id(), grad.to_dtype(self.dtype())?);
        for t in order.iter().rev() {
            let Some(g) = grads.remove(&t.id()) else {
                continue;
            };
            match t.node() {
                None => t.accumulate_grad(g)?,
                Some(node) => {
                    let (inputs, gs) = {
                        let mut slot = node.inner.lock().unwrap_or_else(|p| p.into_inner());
                        match slot.take() {
                            None => continue,
                            Some((inputs, Rule::Once(rule))) => {
                                drop(slot);
                                let gs = rule(&g, &inputs)?;
                                (inputs, gs)
                            }
                            Some((inputs, Rule::Reusable(rule))) => {
                                *slot = Some((inputs.clone(), Rule::Reusable(rule.clone())));
                                drop(slot);
                                let gs = rule(&g, &inputs)?;
                                (inputs, gs)
                            }
                        }
                    };
                    for (p, pg) in inputs.iter().zip(gs) {
                        let Some(pg) = pg else { continue };
                        if !p.requires_grad() {
                            continue;
                        }
                        if pg.shape() != p.shape() {
                            return Err(Error::shape(
                                "backward",
                                p.shape(),
                                pg.shape(),
                                format!("the gradient rule of {} returned a gradient of the wrong shape", node.name),
                            ));
                        }
                        let pg = pg.to_dtype(p.dtype())?;
                        let sum = match grads.remove(&p.id()) {
                            Some(prev) => prev.add(&pg)?,
                            None => pg,
                        };
                        grads.insert(p.id(), sum);
                    }
                }
            }
        }
        Ok(())
    }

    /// Adds `g` to this leaf's `.grad()`, taking `g` over when nothing else holds it.
    fn accumulate_grad(&self, g: Tensor) -> Result<()> {
        let mut slot = self.grad_slot();
        let new = match slot.take() {
            Some(prev) => prev.add(&g)?,
            None if g.storage_is_unique() && g.is_contiguous() => g,
            None => g.copy()?,
        };
        *slot = Some(new.detach());
        Ok(())
    }
}
