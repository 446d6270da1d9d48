//! The backward walk, and the two ways to start it: [`backward`] adds the
//! gradients into the leaves' `.grad()` (`torch.autograd.backward`), [`grad`]
//! and [`grad_with`] return the gradients of chosen tensors and touch no
//! `.grad()` (`torch.autograd.grad`).
//!
//! The walk visits the nodes reachable from the outputs in reverse topological
//! order, so a vertex's gradient is complete (summed over every path) when it
//! is reached. For `grad` it runs only the rules that lie between the outputs
//! and the inputs asked for; the rules it runs are spent, as by `backward`.
//! Gradients are computed without recording, and the rules that ran free
//! what they saved, unless the walk keeps the graph (`retain_graph`) or
//! records the gradients' own graph (`create_graph`).
//!
//! ```
//! use ember::prelude::*;
//! let x = Tensor::new(&[1f64, 2., 3.], &Device::Cpu)?.requires_grad_(true)?;
//! let h = x.mul(2.0)?;
//! let y = h.square()?.sum_all()?; // y = Σ (2x)²
//! let g = ember::autograd::grad(&[&y], &[&h, &x])?;
//! assert_eq!(g[0].to_vec1::<f64>()?, vec![4., 8., 12.]); // dy/dh = 2h
//! assert_eq!(g[1].to_vec1::<f64>()?, vec![8., 16., 24.]); // dy/dx = 8x
//! assert!(x.grad().is_none()); // nothing was accumulated
//! # Ok::<(), ember::Error>(())
//! ```

use super::{enable_grad_guard, no_grad_guard, CallbackScope, Inputs, Rule, Vertex};
use crate::{
    device::Device,
    error::{torch_size, Error, Result},
    tensor::Tensor,
};
use std::cell::Cell;
use std::collections::{HashMap, HashSet};

/// What a walk does with the gradients it computes.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Adds every leaf's gradient into its `.grad()`.
    Backward,
    /// Returns the chosen vertices' gradients, runs only the rules that lead
    /// to them, and accumulates nothing.
    Grad,
    /// Inside a checkpoint's rule: returns the chosen vertices' gradients and
    /// adds the other leaves' into their `.grad()`, as the walk around it
    /// would have (an error inside a [`Mode::Grad`] walk, which must not).
    Checkpoint,
}

thread_local! {
    /// Whether the innermost walk running on this thread is a [`Mode::Grad`] one.
    static IN_GRAD: Cell<bool> = const { Cell::new(false) };
}

/// Options of [`grad_with`], PyTorch's keywords of `torch.autograd.grad`.
#[derive(Clone, Copy, Debug, Default)]
pub struct GradOptions<'a> {
    /// The gradient of each output (`grad_outputs`): one entry per output, or
    /// none at all. `None` (or no entries) stands for ones, which only a
    /// one-element output may take.
    pub grad_outputs: &'a [Option<&'a Tensor>],
    /// An input that no output depends on gets `None` instead of an error.
    pub allow_unused: bool,
    /// An input that no output depends on gets zeros of its shape (implies
    /// `allow_unused`).
    pub materialize_grads: bool,
    /// Keeps the graph after the walk (`retain_graph=True`), so that another
    /// backward or `grad` can go through it again. Without it the rules that
    /// ran free what they saved, and a second walk through them is an error.
    pub retain_graph: bool,
    /// Records the gradients' own graph (`create_graph=True`), so that the
    /// gradients returned can be differentiated again (a gradient penalty, a
    /// Hessian-vector product, a derivative in a loss). Keeps the graph, as
    /// `retain_graph`. See [the module's list](crate::autograd#gradients-of-gradients)
    /// of the ops whose gradients are themselves differentiable.
    pub create_graph: bool,
}

/// Options of [`backward_with`], PyTorch's keywords of `torch.autograd.backward`
/// and `Tensor.backward`.
#[derive(Clone, Copy, Debug, Default)]
pub struct BackwardOptions<'a> {
    /// The gradient of each tensor (`grad_tensors`): one entry per tensor, or
    /// none at all (ones, for one-element tensors).
    pub grad_tensors: &'a [Option<&'a Tensor>],
    /// Keeps the graph after the walk (`retain_graph=True`): another backward
    /// through it is possible.
    pub retain_graph: bool,
    /// Records the gradients' graph (`create_graph=True`): the leaves'
    /// `.grad()` then has a history, and can be differentiated (keeps the
    /// graph, as `retain_graph`).
    pub create_graph: bool,
}

/// How a walk treats the graph it goes through.
#[derive(Clone, Copy, Default)]
struct Keep {
    /// The rules that run stay (with what they saved).
    retain: bool,
    /// The rules run recording.
    create: bool,
}

impl Keep {
    fn new(retain: bool, create: bool) -> Keep {
        Keep {
            retain: retain || create,
            create,
        }
    }
}

/// The gradients of the sum of `outputs` (each a one-element tensor) with
/// respect to each of `inputs` (`torch.autograd.grad(outputs, inputs)`). An
/// input may be a leaf or an intermediate tensor; no `.grad()` changes. An
/// input that no output depends on, or one that does not require grad, is an
/// error.
pub fn grad(outputs: &[&Tensor], inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    let gs = grad_with(outputs, inputs, GradOptions::default())?;
    Ok(gs.into_iter().flatten().collect())
}

/// [`grad`] with PyTorch's options: the outputs' gradients (for outputs with
/// more than one element), and what an input that no output uses receives.
pub fn grad_with(
    outputs: &[&Tensor],
    inputs: &[&Tensor],
    options: GradOptions<'_>,
) -> Result<Vec<Option<Tensor>>> {
    if inputs.is_empty() {
        return Err(Error::invalid(
            "grad",
            "`inputs` argument to `grad()` cannot be empty.",
        ));
    }
    let roots = roots(outputs, options.grad_outputs)?;
    let mut keys = Vec::with_capacity(inputs.len());
    for x in inputs {
        if !x.requires_grad() {
            return Err(Error::invalid(
                "grad",
                "One of the differentiated Tensors does not require grad",
            ));
        }
        keys.push(vertex_of(x).key());
    }
    let scope = CallbackScope::enter();
    let keep = Keep::new(options.retain_graph, options.create_graph);
    let mut found = walk(&roots, &keys, Mode::Grad, keep)?;
    scope.finish()?;
    let mut out = Vec::with_capacity(inputs.len());
    for (i, (x, key)) in inputs.iter().zip(&keys).enumerate() {
        // the same tensor asked for twice gets its gradient twice
        let g = match found.get(key) {
            Some(g) if keys[i + 1..].contains(key) => Some(g.clone()),
            _ => found.remove(key),
        };
        let g = match g {
            Some(g) => Some(g),
            None if options.materialize_grads => Some(x.zeros_like()?),
            None if options.allow_unused => None,
            None => {
                return Err(Error::invalid(
                    "grad",
                    format!(
                        "The differentiated Tensor at index {i} appears to not have been used in the graph. Set allow_unused=True if this is the desired behavior."
                    ),
                ))
            }
        };
        out.push(g);
    }
    Ok(out)
}

/// Backward from several tensors at once (`torch.autograd.backward(tensors,
/// grad_tensors)`): the gradients of all of them are summed at every vertex
/// before it runs, and added into the leaves' `.grad()`. `grad_tensors` has
/// one entry per tensor, or none (ones for one-element tensors).
pub fn backward(tensors: &[&Tensor], grad_tensors: &[Option<&Tensor>]) -> Result<()> {
    backward_with(
        tensors,
        BackwardOptions {
            grad_tensors,
            ..BackwardOptions::default()
        },
    )
}

/// [`backward`] with PyTorch's options: keep the graph for another backward
/// (`retain_graph`), or record the gradients' graph (`create_graph`: each
/// leaf's `.grad()` gets a history, and a gradient already there is replaced
/// by the sum, `grad = grad + new`, as PyTorch does then).
///
/// ```
/// use ember::autograd::{backward_with, BackwardOptions};
/// use ember::prelude::*;
/// let x = Tensor::new(&[1f64, 2.], &Device::Cpu)?.requires_grad_(true)?;
/// let y = x.square()?.sum_all()?;
/// let retain = BackwardOptions { retain_graph: true, ..Default::default() };
/// backward_with(&[&y], retain)?;
/// y.backward()?; // the graph was kept: the gradients add up
/// assert_eq!(x.grad().unwrap().to_vec1::<f64>()?, vec![4., 8.]);
/// # Ok::<(), ember::Error>(())
/// ```
pub fn backward_with(tensors: &[&Tensor], options: BackwardOptions<'_>) -> Result<()> {
    let roots = roots(tensors, options.grad_tensors)?;
    let scope = CallbackScope::enter();
    let keep = Keep::new(options.retain_graph, options.create_graph);
    walk(&roots, &[], Mode::Backward, keep)?;
    scope.finish()
}

/// The walk of an activation checkpoint's rule: backward from `y` (the
/// recomputed output) with `g`, returning the gradients of `targets` (`None`
/// where none flows) and adding those of other leaves into their `.grad()`.
pub(crate) fn checkpoint_grads(
    y: &Tensor,
    g: &Tensor,
    targets: &[Tensor],
) -> Result<Vec<Option<Tensor>>> {
    let keys: Vec<usize> = targets.iter().map(|t| vertex_of(t).key()).collect();
    let mut found = walk(
        &[(y.clone(), g.clone())],
        &keys,
        Mode::Checkpoint,
        Keep::default(),
    )?;
    Ok(keys.iter().map(|k| found.remove(k)).collect())
}

/// Pairs each output with its gradient, checked as PyTorch checks them.
fn roots(outputs: &[&Tensor], grads: &[Option<&Tensor>]) -> Result<Vec<(Tensor, Tensor)>> {
    if !grads.is_empty() && grads.len() != outputs.len() {
        return Err(Error::invalid(
            "backward",
            format!(
                "got {} tensors and {} gradients",
                outputs.len(),
                grads.len()
            ),
        ));
    }
    let mut roots = Vec::with_capacity(outputs.len());
    for (i, y) in outputs.iter().enumerate() {
        let g = match grads.get(i).copied().flatten() {
            Some(g) => {
                if g.shape() != y.shape() {
                    return Err(Error::shape(
                        "backward",
                        y.shape(),
                        g.shape(),
                        format!(
                            "Mismatch in shape: grad_output[{i}] has a shape of {} and output[{i}] has a shape of {}.",
                            torch_size(g.shape()),
                            torch_size(y.shape())
                        ),
                    ));
                }
                if g.device() != y.device() {
                    return Err(Error::invalid(
                        "backward",
                        format!(
                            "invalid gradient at index {i} - expected device {} but got {}",
                            y.device(),
                            g.device()
                        ),
                    ));
                }
                g.clone()
            }
            None if y.requires_grad() && y.numel() != 1 => {
                return Err(Error::invalid(
                    "backward",
                    format!(
                        "grad can be implicitly created only for scalar outputs (shape {:?})",
                        y.shape()
                    ),
                ))
            }
            None => y.ones_like()?,
        };
        if !y.requires_grad() {
            return Err(Error::invalid(
                "backward",
                format!("element {i} of tensors does not require grad and does not have a grad_fn"),
            ));
        }
        roots.push(((*y).clone(), g));
    }
    Ok(roots)
}

/// The vertex a tensor's gradient collects at: its node, or itself as a leaf.
fn vertex_of(t: &Tensor) -> Vertex {
    match t.node() {
        Some(n) => Vertex::Node(n),
        None => Vertex::Leaf(t.clone()),
    }
}

/// Runs the rules reachable from `roots` (each an output and its gradient),
/// returning the gradients that reach the vertices keyed in `capture`, as
/// `mode` says.
fn walk(
    roots: &[(Tensor, Tensor)],
    capture: &[usize],
    mode: Mode,
    keep: Keep,
) -> Result<HashMap<usize, Tensor>> {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            IN_GRAD.with(|f| f.set(self.0));
        }
    }
    let in_grad = IN_GRAD.with(|f| f.get());
    let _restore = Restore(in_grad);
    match mode {
        Mode::Backward => IN_GRAD.with(|f| f.set(false)),
        Mode::Grad => IN_GRAD.with(|f| f.set(true)),
        Mode::Checkpoint => {}
    }
    // a walk that creates a graph records the rules' ops
    let _no_grad = (!keep.create).then(no_grad_guard);
    let _enable_grad = keep.create.then(enable_grad_guard);
    let _phase =
        crate::backend::meta::account::enter_phase(crate::backend::meta::account::Phase::Backward);
    // post-order of the vertices reachable from the roots (iterative DFS):
    // every vertex comes after all the vertices its gradient flows to
    let mut order: Vec<Vertex> = Vec::new();
    let mut next: HashMap<usize, Vec<usize>> = HashMap::new();
    let mut seen: HashSet<usize> = HashSet::new();
    let mut stack: Vec<(Vertex, bool)> = roots.iter().map(|(y, _)| (vertex_of(y), false)).collect();
    while let Some((v, expanded)) = stack.pop() {
        if expanded {
            order.push(v);
            continue;
        }
        if !seen.insert(v.key()) {
            continue;
        }
        let mut children = Vec::new();
        if let Vertex::Node(node) = &v {
            let guard = node.inner.lock().unwrap_or_else(|p| p.into_inner());
            match &*guard {
                Some((inputs, _)) => {
                    for e in inputs.0.iter().filter(|e| e.needs) {
                        children.push(Vertex::of(e)?);
                    }
                }
                None => {
                    return Err(Error::invalid(
                        "backward",
                        format!(
                        "trying to backward through the graph a second time ({} was already used and what it saved freed); set retain_graph on the first backward or grad to go through the graph again",
                        node.name
                    ),
                    ))
                }
            }
        }
        next.insert(v.key(), children.iter().map(Vertex::key).collect());
        stack.push((v, true));
        stack.extend(children.into_iter().map(|c| (c, false)));
    }
    // for `grad`, the vertices from which a captured one is reached: the only
    // ones whose rules need to run
    let leads: Option<HashSet<usize>> = (mode == Mode::Grad).then(|| {
        let mut reaches: HashSet<usize> = HashSet::new();
        let mut leads = HashSet::new();
        for v in &order {
            let k = v.key();
            if next[&k].iter().any(|c| reaches.contains(c)) {
                leads.insert(k);
                reaches.insert(k);
            } else if capture.contains(&k) {
                reaches.insert(k);
            }
        }
        leads
    });
    let mut grads: HashMap<usize, Tensor> = HashMap::new();
    for (y, g) in roots {
        let k = vertex_of(y).key();
        let g = g.to_dtype(y.dtype())?;
        let sum = match grads.remove(&k) {
            Some(prev) => prev.add(&g)?,
            None => g,
        };
        grads.insert(k, sum);
    }
    let mut captured = HashMap::new();
    for v in order.iter().rev() {
        let key = v.key();
        let Some(g) = grads.remove(&key) else {
            continue;
        };
        if capture.contains(&key) {
            captured.insert(key, g.clone());
        }
        let node = match v {
            Vertex::Leaf(t) => {
                // a leaf whose requires_grad was turned off after recording
                // gets nothing (PyTorch's AccumulateGrad returns early)
                if mode != Mode::Grad && !capture.contains(&key) && t.requires_grad() {
                    if mode == Mode::Checkpoint && in_grad {
                        return Err(Error::invalid(
                            "checkpoint",
                            "Checkpointing is not compatible with .grad() or when an `inputs` parameter is passed to .backward(). Please use .backward() and do not pass its `inputs` argument.",
                        ));
                    }
                    t.accumulate_grad(g, keep.create)?;
                }
                continue;
            }
            Vertex::Node(node) => node,
        };
        if leads.as_ref().is_some_and(|l| !l.contains(&key)) {
            continue;
        }
        let _record = crate::profiler::backward_rule(node.name, node.module.as_ref());
        let (inputs, gs) = {
            let _running = super::Running::enter(node.name);
            let mut slot = node.inner.lock().unwrap_or_else(|p| p.into_inner());
            let Some((inputs, rule)) = slot.take() else {
                continue;
            };
            if let Rule::Reusable(f) = &rule {
                // a view's rule saved nothing and stays
                *slot = Some((Inputs(inputs.0.clone()), Rule::Reusable(f.clone())));
            }
            drop(slot);
            let gs = super::run_rule(node, &rule, &g, &inputs, keep.create);
            if keep.retain && matches!(rule, Rule::Once(_)) {
                let again = Inputs(inputs.0.clone());
                *node.inner.lock().unwrap_or_else(|p| p.into_inner()) = Some((again, rule));
            }
            (inputs, gs?)
        };
        for (e, pg) in inputs.0.iter().zip(gs) {
            let Some(pg) = pg else { continue };
            if !e.needs {
                continue;
            }
            if pg.shape() != e.value.shape() {
                return Err(Error::shape(
                    "backward",
                    e.value.shape(),
                    pg.shape(),
                    format!(
                        "the gradient rule of {} returned a gradient of the wrong shape",
                        node.name
                    ),
                ));
            }
            // a CPU scalar's gradient, computed beside the tensors on another
            // device it met there, goes back to the CPU (PyTorch's rule)
            let pg = if pg.device() != e.value.device()
                && e.value.device() == Device::Cpu
                && e.value.shape().is_empty()
            {
                pg.to(&Device::Cpu)?
            } else {
                pg
            };
            let pg = pg.to_dtype(e.value.dtype())?;
            let key = Vertex::of(e)?.key();
            let sum = match grads.remove(&key) {
                Some(prev) => prev.add(&pg)?,
                None => pg,
            };
            grads.insert(key, sum);
        }
    }
    Ok(captured)
}
