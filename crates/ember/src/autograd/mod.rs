// Over 800 lines: the module documentation (kept graphs, the list of twice-differentiable ops) and the node, edge and saved-value machinery that a walk and the rules share.
//! Reverse-mode automatic differentiation.
//!
//! An operation records a node on its output only when grad mode is on and one
//! of its inputs requires a gradient. The node holds an edge per input (the input
//! and the node that computed it when the op ran) and a one-shot closure that maps
//! the output's gradient to the inputs' gradients; the closure owns whatever the
//! rule saved, so saved tensors are freed as soon as `backward` has used them. Each
//! rule is written beside its forward op.
//!
//! In-place ops are recorded as in PyTorch: each storage counts its writes
//! ([`Tensor::version`]), and a rule whose saved values were overwritten since the
//! op ran fails at backward with PyTorch's "modified by an inplace operation"
//! error; a rule that does not read them does not care.
//!
//! ```
//! use ember::prelude::*;
//! let x = Tensor::new(&[1f64, 2., 3.], &Device::Cpu)?.requires_grad_(true)?;
//! let h = x.mul(2.0)?;
//! h.add_(1.0)?; // recorded: h = 2x + 1
//! h.square()?.sum_all()?.backward()?; // d/dx (2x + 1)² = 4 (2x + 1)
//! assert_eq!(x.grad().unwrap().to_vec1::<f64>()?, vec![12., 20., 28.]);
//! let y = x.exp()?;
//! y.add_(1.0)?; // exp's rule reads its output, which is now overwritten
//! assert!(y.sum_all()?.backward().is_err());
//! # Ok::<(), ember::Error>(())
//! ```
//!
//! ```
//! use ember::prelude::*;
//! let x = Tensor::new(&[1f64, 2., 3.], &Device::Cpu)?.requires_grad_(true)?;
//! let y = x.mul(&x)?.sum_all()?; // y = Σ x²
//! y.backward()?;
//! assert_eq!(x.grad().unwrap().to_vec1::<f64>()?, vec![2., 4., 6.]);
//! # Ok::<(), ember::Error>(())
//! ```
//!
//! # Kept graphs and gradients of gradients
//!
//! A walk frees what the rules it ran saved; a second backward through the
//! same nodes is then an error, unless the first kept the graph
//! ([`BackwardOptions::retain_graph`], [`GradOptions::retain_graph`]).
//! With `create_graph` the walk records the gradients' own graph, as
//! PyTorch's `create_graph=True`: the gradients [`grad_with`] returns (or the
//! leaves' `.grad()` after [`backward_with`]) have a history and can be
//! differentiated again, for a gradient penalty, a Hessian-vector product, a
//! meta-learning step or a derivative inside a loss.
//!
//! ```
//! use ember::autograd::{grad, grad_with, GradOptions};
//! use ember::prelude::*;
//! let x = Tensor::new(&[1f64, 2.], &Device::Cpu)?.requires_grad_(true)?;
//! let y = x.pow(3.0)?.sum_all()?; // y = Σ x³
//! let create = GradOptions { create_graph: true, ..Default::default() };
//! let g = grad_with(&[&y], &[&x], create)?[0].clone().unwrap(); // 3x²
//! let h = grad(&[&g.sum_all()?], &[&x])?; // d/dx Σ 3x² = 6x
//! assert_eq!(h[0].to_vec1::<f64>()?, vec![6., 12.]);
//! # Ok::<(), ember::Error>(())
//! ```
//!
//! ## Gradients of gradients
//!
//! An op's gradient is differentiable where its rule is written in
//! differentiable ops. That holds for:
//! - the elementwise arithmetic (`add`, `sub`, `mul`, `div`, `pow`,
//!   `maximum`, `minimum`, `atan2`, `remainder`, `fmod`, by a tensor or a
//!   number) and their in-place forms;
//! - every one-input elementwise op (`exp`, `log`, `tanh`, `sigmoid`,
//!   `relu`, `gelu`, `silu`, `softplus`, `elu`, `leaky_relu`, `hardtanh`,
//!   `clamp` by numbers or tensors, the trigonometric and special functions);
//!   in place only those whose rule reads their result or nothing (`exp_`,
//!   `sqrt_`, `tanh_`, `sigmoid_`, `relu_`, `neg_`, ...), not those that read
//!   their input (`sin_`, `log_`, ...: the copy they keep is a constant);
//! - `where_`, `xlogy`, `lerp`, `addcmul`, `addcdiv`, `hypot`;
//! - the reductions `sum`, `mean`, `max` and `min` over dims, `var`, `std`,
//!   `logsumexp`, `vector_norm`, `median`, and the scans `cumsum`,
//!   `cumprod`, `logcumsumexp`;
//! - `softmax`, `log_softmax`, `matmul`, `addmm`, `linear`, `cdist`;
//! - `conv2d` and `conv_transpose2d`, and `conv1d`, `conv3d` and
//!   `conv_transpose3d`, which are made of them: under `create_graph` their gradients are
//!   computed as convolutions, slower than the fused backward but
//!   differentiable again;
//! - views and copies (`reshape`, `transpose`, `permute`, `narrow`, `select`,
//!   `expand`, `unsqueeze`, `cat`, `stack`, `to`, `to_dtype`, `copy`,
//!   `copy_`, `to_memory_format`);
//! - `layer_norm`, `rms_norm`, `group_norm` and `instance_norm` (their fused
//!   rule is written in recorded ops when a walk creates a graph), and
//!   `batch_norm` in training and evaluation (its gradients recomputed in
//!   recorded ops from the input then);
//! - the pools `max_pool2d`, `avg_pool2d` (their gradient is linear in the
//!   output's, and its gradient is the pooling again: a gather at the maxima,
//!   an average pooling), the 1-D and 3-D pools and the adaptive ones made of
//!   them, and `max_unpool`;
//! - the index ops `index_select`, `gather`, `scatter_add`, `index_add`,
//!   `embedding`, and the values of `max_dim` and `min_dim`, `sort`, `topk`
//!   and `kthvalue` (gathers at the positions found);
//! - `ember::linalg`: `inv`, `det` (its second derivative goes through the
//!   inverse: at a singular matrix the first gradient is given and
//!   differentiating it is an error), `slogdet`, `solve`,
//!   `solve_triangular`, `cholesky`, `lu`, `lu_factor`, `qr`, `eigh`,
//!   `eigvalsh`, `svd`, `svdvals`, and `matrix_power`, `pinv`, `lstsq`,
//!   `matrix_norm`, which are made of them (their rules are tensor ops of the
//!   outputs, given with their history); `diagonal` and `trace`;
//! - the losses `cross_entropy` (class indices; its fused rule is written in
//!   recorded ops when a walk creates a graph), `mse_loss`, `smooth_l1_loss`,
//!   `huber_loss`, `binary_cross_entropy`, `bce_with_logits`,
//!   `gaussian_nll_loss`, and `cosine_similarity`, `pairwise_distance`;
//! - anything composed of these.
//!
//! The other ops (the fused and memory-saving attention, regions under
//! [`nn::checkpoint`](crate::nn::checkpoint)) give their first
//! gradient under `create_graph` as usual, but that gradient's own gradient is
//! an error naming the op, raised when a walk reaches it. Attention is twice differentiable on its plain path, made of
//! the ops above: run it under
//! [`with_attention_path(AttentionPath::Math)`](crate::nn::functional::with_attention_path)
//! (PyTorch's math backend, the one its double backward takes).
//! Where PyTorch's backward of an op takes its input but reads only a mask of
//! it (`abs`, `leaky_relu`, `hardtanh`, `hardsigmoid`), the gradient's own
//! gradient reaches that input as zeros, as in PyTorch. The pools' and
//! `max_unpool`'s gradients do not reach their input at all (PyTorch's reach
//! it as zeros; tying them to it would keep every pooled input alive for
//! first-order backward too): ask `grad` with `allow_unused` or
//! `materialize_grads` where only that path leads to an input.

use crate::{
    error::{Error, Result},
    tensor::Tensor,
};
use std::cell::Cell;
use std::sync::{Arc, Mutex};

mod walk;
pub(crate) use walk::checkpoint_grads;
pub use walk::{backward, backward_with, grad, grad_with, BackwardOptions, GradOptions};

/// Gradients of a node's inputs, in input order (`None`: no gradient flows there).
pub(crate) type Grads = Vec<Option<Tensor>>;
/// A rule: the output's gradient and the node's inputs to the inputs' gradients.
type BackwardFn = Box<dyn Fn(&Tensor, &Inputs) -> Result<Grads> + Send + Sync>;
/// A rule that saved nothing of the forward pass's values (a view's), which
/// backward can run again.
type ReusableFn = Arc<dyn Fn(&Tensor, &Inputs) -> Result<Grads> + Send + Sync>;

enum Rule {
    /// Frees what it saved when it runs: a second backward through it is an error.
    Once(BackwardFn),
    /// Kept after it runs, as PyTorch keeps nodes that saved no tensors: graphs
    /// that share a view can each be backpropagated through it.
    Reusable(ReusableFn),
}

/// What an edge keeps of its input: the tensor (a leaf that requires grad, whose
/// gradient goes into it, or an input whose values the rule reads, held as a
/// detached alias), or only its shape and dtype, so that a value no rule reads is
/// freed as soon as nothing else holds it (PyTorch saves only what a rule reads).
#[derive(Clone)]
enum Held {
    Value(Tensor),
    Shape(
        smallvec::SmallVec<[usize; 6]>,
        crate::dtype::DType,
        crate::device::Device,
    ),
}

impl Held {
    fn shape(&self) -> &[usize] {
        match self {
            Held::Value(t) => t.shape(),
            Held::Shape(s, ..) => s,
        }
    }

    fn dtype(&self) -> crate::dtype::DType {
        match self {
            Held::Value(t) => t.dtype(),
            Held::Shape(_, d, _) => *d,
        }
    }

    fn device(&self) -> crate::device::Device {
        match self {
            Held::Value(t) => t.device(),
            Held::Shape(.., d) => *d,
        }
    }
}

/// One input of a node, as it was when the op ran: what it keeps of the input
/// ([`Held`]), the node that computed it then (a later in-place op on the tensor
/// gives the tensor a new node, not this edge), whether a gradient flows to it,
/// and its version.
#[derive(Clone)]
struct Edge {
    value: Held,
    node: Option<Arc<Node>>,
    needs: bool,
    version: u64,
}

/// A node's inputs as its rule sees them: values are checked against the
/// version the op saw.
pub(crate) struct Inputs(smallvec::SmallVec<[Edge; 2]>);

impl Inputs {
    /// The `i`-th input's values; an error when an in-place op changed them since,
    /// or when the op did not keep them (its rule reads what it did not declare).
    pub(crate) fn get(&self, i: usize) -> Result<&Tensor> {
        let e = &self.0[i];
        match &e.value {
            Held::Value(t) => {
                check_version(t, e.version)?;
                Ok(t)
            }
            Held::Shape(..) => Err(Error::invalid(
                "backward",
                format!(
                    "the rule of {} reads its input {i}, which its op did not keep (a bug in ember)",
                    RUNNING.with(|r| r.get())
                ),
            )),
        }
    }

    /// `true` when a gradient flows to the `i`-th input.
    pub(crate) fn needs(&self, i: usize) -> bool {
        self.0[i].needs
    }

    /// The `i`-th input's shape (never changed by in-place ops).
    pub(crate) fn shape(&self, i: usize) -> &[usize] {
        self.0[i].value.shape()
    }

    /// The `i`-th input's dtype.
    pub(crate) fn dtype(&self, i: usize) -> crate::dtype::DType {
        self.0[i].value.dtype()
    }
}

/// A tensor a rule keeps for backward (`ctx.save_for_backward`): its values, and
/// the version they had, so that backward can tell when an in-place op overwrote
/// them, and where they came from, so that a walk that creates a graph
/// (`create_graph`) can give a twice-differentiable rule the values with their
/// history.
pub(crate) struct Saved {
    t: Tensor,
    version: u64,
    origin: Origin,
}

/// The history of a saved value, as PyTorch's `SavedVariable` keeps it: the node
/// that computed it (an input's), the leaf itself, the op's own output (whose
/// node is the one whose rule reads it: not held, which would be a cycle), or
/// none (a constant).
enum Origin {
    Constant,
    Node(Arc<Node>),
    Leaf(Tensor),
    Output,
}

impl Saved {
    /// The saved values; an error when an in-place op changed them since.
    pub(crate) fn get(&self) -> Result<&Tensor> {
        check_version(&self.t, self.version)?;
        Ok(&self.t)
    }

    /// The saved values as a twice-differentiable rule reads them: with their
    /// history while a walk creates a graph (so that the gradient it computes
    /// depends on them), detached otherwise; an error when an in-place op changed
    /// them since.
    pub(crate) fn value(&self) -> Result<Tensor> {
        check_version(&self.t, self.version)?;
        let Some(running) = CREATING.with(|c| c.borrow().clone()) else {
            return Ok(self.t.clone());
        };
        Ok(match &self.origin {
            Origin::Constant => self.t.clone(),
            Origin::Node(n) => self.t.with_node(n.clone()),
            Origin::Leaf(leaf) => leaf.clone(),
            Origin::Output => self.t.with_node(running),
        })
    }
}

impl Tensor {
    /// Keeps this tensor's values for a backward rule (detached: a saved output
    /// cannot keep its own node alive).
    pub(crate) fn save(&self) -> Saved {
        self.save_as(self)
    }

    /// Keeps this tensor's values for a backward rule with the history of
    /// `source`, of which it is a copy made without recording (the same values
    /// and dtype in another memory layout): a twice-differentiable rule that
    /// reads the copy depends on `source` when a walk creates a graph.
    pub(crate) fn save_as(&self, source: &Tensor) -> Saved {
        debug_assert!(self.shape() == source.shape() && self.dtype() == source.dtype());
        let origin = Self::origin_of(source);
        Saved {
            t: self.detach(),
            version: self.version(),
            origin,
        }
    }

    /// Where `source`'s values come from, for a [`Saved`].
    fn origin_of(this: &Tensor) -> Origin {
        if RECORDING.with(|r| r.get()) == this.id() {
            Origin::Output
        } else if let Some(n) = this.node() {
            Origin::Node(n)
        } else if this.requires_grad() {
            Origin::Leaf(this.clone())
        } else {
            Origin::Constant
        }
    }
}

thread_local! {
    /// The node whose rule is running, named in a saved-tensor error.
    static RUNNING: Cell<&'static str> = const { Cell::new("") };
    /// The identity of the output whose rule is being built ([`Tensor::save`]
    /// tells the op's output from other values by it); 0 when none is.
    static RECORDING: Cell<usize> = const { Cell::new(0) };
    /// While a walk that creates a graph runs a twice-differentiable rule: that
    /// rule's node, the history of the output it saved.
    static CREATING: std::cell::RefCell<Option<Arc<Node>>> = const { std::cell::RefCell::new(None) };
}

/// `true` while a twice-differentiable rule runs in a walk that creates a graph
/// (`create_graph`): a rule whose usual path is a fused kernel (which records
/// nothing) computes its gradients in recorded ops instead.
pub(crate) fn creating_graph() -> bool {
    CREATING.with(|c| c.borrow().is_some())
}

/// PyTorch's error for a saved tensor that an in-place op has overwritten.
fn check_version(t: &Tensor, saved: u64) -> Result<()> {
    let now = t.version();
    if now == saved {
        return Ok(());
    }
    let node = RUNNING.with(|r| r.get());
    Err(Error::invalid(
        "backward",
        format!(
            "one of the variables needed for gradient computation has been modified by an inplace operation: [{} {:?}], saved by {node}, is at version {now}; expected version {saved} instead. Use the out-of-place op, or .copy() the tensor before modifying it",
            t.dtype(),
            t.shape(),
        ),
    ))
}

/// How an op output was computed: its inputs and the rule that sends gradients back.
/// The output tensor holds it, and so does every later op's edge to that output;
/// `backward` empties it (unless its rule is reusable).
pub(crate) struct Node {
    name: &'static str,
    inner: Mutex<Option<(Inputs, Rule)>>,
    /// Whether the rule is written in recorded tensor ops on values it reads
    /// with their history ([`Saved::value`], `Inputs::get`), so that a walk
    /// that creates a graph can run it recording (twice differentiable). A walk
    /// that creates a graph runs any other rule without recording and gives
    /// its gradients a node whose own rule is an error.
    twice: bool,
    /// The module the op ran in, kept only while a profiling session records (the
    /// profiler names the rule's range after it).
    module: Option<Arc<str>>,
}

/// A vertex of the backward walk: a node, or a leaf whose `.grad()` receives.
enum Vertex {
    Node(Arc<Node>),
    Leaf(Tensor),
}

/// Whether `t` was made from a leaf that requires grad through views only (a
/// view of a parameter, as `w.narrow(..)`, or a view of such a view): PyTorch
/// refuses an in-place op on such a view as on the leaf. (Views record
/// reusable rules, as no other op but a cast does.)
pub(crate) fn made_from_grad_leaf(t: &Tensor) -> bool {
    let mut next = t.node();
    while let Some(node) = next {
        let inner = node.inner.lock().unwrap_or_else(|p| p.into_inner());
        let Some((inputs, rule)) = inner.as_ref() else {
            return false;
        };
        if !matches!(rule, Rule::Reusable(_)) || node.name == "to_dtype" {
            return false;
        }
        next = match inputs.0.first() {
            Some(Edge {
                node: None,
                value: Held::Value(leaf),
                ..
            }) => return leaf.requires_grad() && leaf.is_leaf(),
            Some(Edge { node: Some(n), .. }) => Some(n.clone()),
            _ => None,
        };
    }
    false
}

impl Vertex {
    fn key(&self) -> usize {
        match self {
            Vertex::Node(n) => Arc::as_ptr(n) as usize,
            Vertex::Leaf(t) => t.id(),
        }
    }

    /// The vertex a gradient flowing along `edge` goes to: its node, or the leaf
    /// (which an edge that needs a gradient and has no node always keeps).
    fn of(edge: &Edge) -> Result<Vertex> {
        match (&edge.node, &edge.value) {
            (Some(n), _) => Ok(Vertex::Node(n.clone())),
            (None, Held::Value(t)) => Ok(Vertex::Leaf(t.clone())),
            (None, Held::Shape(..)) => Err(Error::invalid(
                "backward",
                "a gradient flows to an input that is neither a leaf nor computed (a bug in ember)",
            )),
        }
    }
}

thread_local! {
    /// How many no-grad guards are open: recording is on at 0, whatever order
    /// the guards drop in (two in a struct drop first field first).
    static NO_GRAD_DEPTH: Cell<usize> = const { Cell::new(0) };
    /// The callbacks queued during the backward running on this thread
    /// ([`queue_callback`]); `None` outside a backward.
    static CALLBACKS: std::cell::RefCell<Option<Vec<Callback>>> = const { std::cell::RefCell::new(None) };
}

/// A post-accumulate-grad hook: called with the leaf after `backward` has added to
/// its `.grad()`.
pub(crate) type GradHook = (u64, Arc<dyn Fn(&Tensor) -> Result<()> + Send + Sync>);

type Callback = Box<dyn FnOnce() -> Result<()>>;

static NEXT_HOOK: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A registered hook; [`remove`](Self::remove) unregisters it (dropping the handle
/// keeps the hook, as in PyTorch).
pub struct HookHandle {
    id: u64,
    target: Tensor,
}

impl HookHandle {
    /// Unregisters the hook.
    pub fn remove(self) {
        self.target.hook_slot().retain(|(id, _)| *id != self.id);
    }
}

/// Runs `f` when the backward running on this thread has finished
/// (`Variable._execution_engine.queue_callback`): after every gradient has been
/// accumulated, before `backward` returns; an error from `f` is `backward`'s error.
/// Callbacks run in the order they were queued. Queuing outside a backward is an
/// error.
pub fn queue_callback(f: impl FnOnce() -> Result<()> + 'static) -> Result<()> {
    CALLBACKS.with(|c| match c.borrow_mut().as_mut() {
        Some(list) => {
            list.push(Box::new(f));
            Ok(())
        }
        None => Err(Error::invalid(
            "queue_callback",
            "final callbacks can only be installed during the backward pass",
        )),
    })
}

/// Collects [`queue_callback`]'s callbacks for one backward (nested backwards each
/// keep their own); dropped without running them when backward fails.
struct CallbackScope(Option<Vec<Callback>>);

impl CallbackScope {
    fn enter() -> CallbackScope {
        CallbackScope(CALLBACKS.with(|c| c.borrow_mut().replace(Vec::new())))
    }

    /// Runs the callbacks queued in this scope (and those they queue).
    fn finish(self) -> Result<()> {
        loop {
            let queued = CALLBACKS.with(|c| c.borrow_mut().as_mut().map(std::mem::take));
            match queued {
                Some(list) if !list.is_empty() => {
                    for f in list {
                        f()?;
                    }
                }
                _ => return Ok(()),
            }
        }
    }
}

impl Drop for CallbackScope {
    fn drop(&mut self) {
        let outer = self.0.take();
        CALLBACKS.with(|c| *c.borrow_mut() = outer);
    }
}

/// `true` unless inside [`no_grad`] on this thread.
pub fn is_grad_enabled() -> bool {
    NO_GRAD_DEPTH.with(|g| g.get()) == 0
}

/// Restores the previous grad mode when dropped (see [`no_grad_guard`]):
/// recording is back on once every guard has dropped, in whatever order. The
/// mode is this thread's: the guard cannot move to another thread (dropped
/// there, it would set that thread's mode).
///
/// ```compile_fail
/// fn elsewhere<T: Send + 'static>(t: T) {
///     std::thread::spawn(move || drop(t));
/// }
/// elsewhere(ember::no_grad_guard());
/// ```
#[must_use = "gradients are off only while the guard lives"]
pub struct GradModeGuard {
    _this_thread: std::marker::PhantomData<*const ()>,
}

impl Drop for GradModeGuard {
    fn drop(&mut self) {
        NO_GRAD_DEPTH.with(|g| g.set(g.get().saturating_sub(1)));
    }
}

/// Turns graph recording off on this thread until the guard drops
/// (`with torch.no_grad():`).
pub fn no_grad_guard() -> GradModeGuard {
    NO_GRAD_DEPTH.with(|g| g.set(g.get() + 1));
    GradModeGuard {
        _this_thread: std::marker::PhantomData,
    }
}

/// Runs `f` without recording a graph (`torch.no_grad()`).
pub fn no_grad<R>(f: impl FnOnce() -> R) -> R {
    let _g = no_grad_guard();
    f()
}

/// Restores the grad mode [`enable_grad_guard`] found when dropped.
#[must_use = "recording is on only while the guard lives"]
pub struct EnableGradGuard {
    depth: usize,
    _this_thread: std::marker::PhantomData<*const ()>,
}

impl Drop for EnableGradGuard {
    fn drop(&mut self) {
        NO_GRAD_DEPTH.with(|g| g.set(self.depth));
    }
}

/// Turns graph recording on on this thread, inside [`no_grad`] too, until the
/// guard drops (`with torch.enable_grad():`).
pub fn enable_grad_guard() -> EnableGradGuard {
    let depth = NO_GRAD_DEPTH.with(|g| g.replace(0));
    EnableGradGuard {
        depth,
        _this_thread: std::marker::PhantomData,
    }
}

/// Runs `f` with graph recording on, inside [`no_grad`] too
/// (`torch.enable_grad()`).
///
/// ```
/// use ember::prelude::*;
/// let x = Tensor::new([1f32, 2.], &Device::Cpu)?.requires_grad_(true)?;
/// let y = ember::no_grad(|| ember::autograd::enable_grad(|| x.mul(2.0)))?;
/// assert!(y.requires_grad());
/// # Ok::<(), ember::Error>(())
/// ```
pub fn enable_grad<R>(f: impl FnOnce() -> R) -> R {
    let _g = enable_grad_guard();
    f()
}

thread_local! {
    /// Whether a checkpointed region is being recomputed on this thread.
    static RECOMPUTING: Cell<bool> = const { Cell::new(false) };
}

/// `true` while an activation checkpoint recomputes its region on this thread
/// (`nn::checkpoint`): state a forward pass moves (batch norm's running
/// statistics and batch count) was moved by the region's first run and stays.
pub(crate) fn is_recomputing() -> bool {
    RECOMPUTING.with(|r| r.get())
}

/// Marks this thread as recomputing a checkpointed region until dropped.
pub(crate) struct Recomputing(bool);

impl Recomputing {
    pub(crate) fn enter() -> Recomputing {
        Recomputing(RECOMPUTING.with(|r| r.replace(true)))
    }
}

impl Drop for Recomputing {
    fn drop(&mut self) {
        RECOMPUTING.with(|r| r.set(self.0));
    }
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
        F: Fn(&Tensor) -> Result<Grads> + Send + Sync + 'static,
    {
        // the rule saved what it reads: the node keeps none of the inputs' values
        Tensor::record_keeping(out, name, inputs, &[], |y| {
            let f = rule(y);
            move |g: &Tensor, _: &Inputs| f(g)
        })
    }

    /// [`record`](Self::record) for a twice-differentiable rule: one written in
    /// recorded tensor ops on the gradient and on values it reads through
    /// [`Saved::value`], so that a walk that creates a graph
    /// (`create_graph`) differentiates it.
    pub(crate) fn record_twice<F>(
        out: Tensor,
        name: &'static str,
        inputs: &[&Tensor],
        rule: impl FnOnce(&Tensor) -> F,
    ) -> Tensor
    where
        F: Fn(&Tensor) -> Result<Grads> + Send + Sync + 'static,
    {
        Tensor::record_with(out, name, inputs, &[], true, |y| {
            let f = rule(y);
            move |g: &Tensor, _: &Inputs| f(g)
        })
    }

    /// `self`, a gradient computed from a mask of `x` (comparisons, which record
    /// nothing), recorded as depending on `x` with a zero derivative where a walk
    /// creates a graph: PyTorch's fused backward ops (`leaky_relu_backward`,
    /// `hardtanh_backward`, ...) take `x`, so a gradient of the gradient reaches
    /// `x` as zeros there, where without the tie it would not reach it at all.
    pub(crate) fn tied_to(self, x: &Tensor, name: &'static str) -> Tensor {
        if !creating_graph() || !x.requires_grad() {
            return self;
        }
        Tensor::record_twice(self.detach(), name, &[&self, x], |_| {
            |g: &Tensor| Ok(vec![Some(g.clone()), Some(g.zeros_like()?)])
        })
    }

    /// [`record`](Self::record) for a rule that reads inputs from the node
    /// (`Inputs::get`) instead of saving its own copies, keeping only the values
    /// of the inputs `keep` marks (the rest are freed when nothing else holds them;
    /// the rule may read their shapes and dtypes, not their values). A rule that
    /// captures nothing costs no allocation.
    pub(crate) fn record_keeping<F>(
        out: Tensor,
        name: &'static str,
        inputs: &[&Tensor],
        keep: &[bool],
        rule: impl FnOnce(&Tensor) -> F,
    ) -> Tensor
    where
        F: Fn(&Tensor, &Inputs) -> Result<Grads> + Send + Sync + 'static,
    {
        Tensor::record_with(out, name, inputs, keep, false, rule)
    }

    /// [`record_keeping`](Self::record_keeping) for a twice-differentiable rule
    /// (see [`record_twice`](Self::record_twice)).
    pub(crate) fn record_keeping_twice<F>(
        out: Tensor,
        name: &'static str,
        inputs: &[&Tensor],
        keep: &[bool],
        rule: impl FnOnce(&Tensor) -> F,
    ) -> Tensor
    where
        F: Fn(&Tensor, &Inputs) -> Result<Grads> + Send + Sync + 'static,
    {
        Tensor::record_with(out, name, inputs, keep, true, rule)
    }

    fn record_with<F>(
        out: Tensor,
        name: &'static str,
        inputs: &[&Tensor],
        keep: &[bool],
        twice: bool,
        rule: impl FnOnce(&Tensor) -> F,
    ) -> Tensor
    where
        F: Fn(&Tensor, &Inputs) -> Result<Grads> + Send + Sync + 'static,
    {
        if !needs_grad(inputs) {
            return out;
        }
        // the rule sees `out` before it gets its node, so what it saves of the output
        // cannot keep the node alive (no reference cycle)
        let f: BackwardFn = Box::new(building(&out, || rule(&out)));
        out.attach(name, inputs, keep, twice, Rule::Once(f))
    }

    /// [`record`](Self::record) for a rule that saves nothing of the forward
    /// values (views): its node survives backward, so two graphs that share the
    /// output can each backpropagate through it. Such rules are written in
    /// recorded tensor ops: twice differentiable.
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
        let f = building(&out, || rule(&out));
        let f: ReusableFn = Arc::new(move |g: &Tensor, _: &Inputs| f(g));
        out.attach(name, inputs, &[], true, Rule::Reusable(f))
    }

    fn attach(
        mut self,
        name: &'static str,
        inputs: &[&Tensor],
        keep: &[bool],
        twice: bool,
        rule: Rule,
    ) -> Tensor {
        let edges = inputs
            .iter()
            .enumerate()
            .map(|(i, t)| Edge {
                // a leaf that requires grad is the vertex its gradient goes to;
                // an input whose values the rule reads lends them through an alias
                // (an input that later takes this node in place must not hold it: a
                // cycle); of any other, the node keeps the shape and dtype only
                value: if t.requires_grad() && t.is_leaf() {
                    Held::Value((*t).clone())
                } else if keep.get(i).copied().unwrap_or(false) {
                    Held::Value(t.detach())
                } else {
                    Held::Shape(t.shape().into(), t.dtype(), t.device())
                },
                node: t.node(),
                needs: t.requires_grad(),
                version: t.version(),
            })
            .collect();
        let node = Arc::new(Node {
            name,
            inner: Mutex::new(Some((Inputs(edges), rule))),
            twice,
            module: crate::profiler::forward_module(),
        });
        if self.is_unique_handle() {
            self.set_node(node);
            self
        } else {
            // the rule kept a handle on the output: give the node to a new handle,
            // so that the rule's handle does not hold its own node (a cycle)
            self.with_node(node)
        }
    }

    /// Gives this tensor the history of `out`, whose values were just written into
    /// it: the end of a recorded in-place op. Ops recorded earlier keep the old
    /// history in their edges.
    pub(crate) fn take_history(&self, out: &Tensor) {
        if let Some(node) = out.node() {
            self.set_node(node);
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

    /// Registers `hook`, called with this leaf each time `backward` has accumulated
    /// a gradient into its `.grad()` (`register_post_accumulate_grad_hook`), on the
    /// thread running backward. An error from the hook stops backward with it.
    /// Only leaves that require a gradient accept hooks.
    pub fn register_post_accumulate_grad_hook(
        &self,
        hook: impl Fn(&Tensor) -> Result<()> + Send + Sync + 'static,
    ) -> Result<HookHandle> {
        if !self.requires_grad() || !self.is_leaf() {
            return Err(Error::invalid(
                "register_post_accumulate_grad_hook",
                "post accumulate grad hooks can only be registered on leaf tensors that require grad",
            ));
        }
        let id = NEXT_HOOK.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.hook_slot().push((id, Arc::new(hook)));
        Ok(HookHandle {
            id,
            target: self.clone(),
        })
    }

    /// Backward from this tensor with `grad` as its gradient (`t.backward(grad)`).
    pub fn backward_with(&self, grad: &Tensor) -> Result<()> {
        walk::backward(&[self], &[Some(grad)])
    }

    /// Adds `g` to this leaf's `.grad()`, taking `g` over when nothing else
    /// holds it. A gradient already there is added to in place (PyTorch's
    /// `grad += new`: no new memory, and a CUDA graph's replays add into the
    /// same tensor); one that cannot take `g` is left as it was. A walk that
    /// creates a graph (`create`) keeps `g`'s history and replaces a gradient
    /// already there by the recorded sum (`grad = grad + new`), as PyTorch.
    fn accumulate_grad(&self, g: Tensor, create: bool) -> Result<()> {
        let mut slot = self.grad_slot();
        match slot.as_ref() {
            Some(prev) if create => {
                let sum = prev.add(&g)?;
                *slot = Some(sum);
            }
            Some(prev) => {
                prev.add_(&g)?;
            }
            None if create => {
                *slot = Some(g);
            }
            None => {
                let unique = g.storage_is_unique();
                *slot = Some(self.grad_laid_out_for(g, unique)?.detach());
            }
        }
        drop(slot);
        let hooks: Vec<_> = self.hook_slot().iter().map(|(_, h)| h.clone()).collect();
        for h in hooks {
            h(self)?;
        }
        Ok(())
    }
}

impl Inputs {
    /// These inputs as a twice-differentiable rule reads them in a walk that
    /// creates a graph: each kept value with the history it had when the op
    /// ran (a leaf is kept as itself).
    fn attached(&self) -> Inputs {
        let edges = self
            .0
            .iter()
            .map(|e| match (&e.value, &e.node) {
                (Held::Value(t), Some(n)) => Edge {
                    value: Held::Value(t.with_node(n.clone())),
                    ..e.clone()
                },
                _ => e.clone(),
            })
            .collect();
        Inputs(edges)
    }
}

/// Marks the node whose twice-differentiable rule runs recording until dropped
/// (the history [`Saved::value`] gives the op's saved output).
struct Creating(Option<Arc<Node>>);

impl Creating {
    fn enter(node: &Arc<Node>) -> Creating {
        Creating(CREATING.with(|c| c.replace(Some(node.clone()))))
    }
}

impl Drop for Creating {
    fn drop(&mut self) {
        let outer = self.0.take();
        CREATING.with(|c| *c.borrow_mut() = outer);
    }
}

/// Runs `node`'s rule on the output's gradient `g`. A walk that creates a graph
/// (`create`) runs a twice-differentiable rule recording, on the inputs and
/// saved values with their history; any other rule runs without recording, and
/// each gradient it gives gets a node that leads back to `g` and to the op's
/// inputs and whose rule is an error: a gradient of that gradient is not
/// available, and asking for one says so (PyTorch's "not implemented" for a
/// double backward it lacks).
fn run_rule(
    node: &Arc<Node>,
    rule: &Rule,
    g: &Tensor,
    inputs: &Inputs,
    create: bool,
) -> Result<Grads> {
    let f: &(dyn Fn(&Tensor, &Inputs) -> Result<Grads> + Send + Sync) = match rule {
        Rule::Once(f) => &**f,
        Rule::Reusable(f) => &**f,
    };
    if !create {
        return f(g, inputs);
    }
    if node.twice {
        let attached = inputs.attached();
        let _creating = Creating::enter(node);
        return f(g, &attached);
    }
    let gs = {
        let _no_grad = no_grad_guard();
        f(g, inputs)?
    };
    let mut edges: smallvec::SmallVec<[Edge; 2]> =
        inputs.0.iter().filter(|e| e.needs).cloned().collect();
    if g.requires_grad() {
        edges.push(Edge {
            value: if g.is_leaf() {
                Held::Value(g.clone())
            } else {
                Held::Shape(g.shape().into(), g.dtype(), g.device())
            },
            node: g.node(),
            needs: true,
            version: g.version(),
        });
    }
    if edges.is_empty() {
        return Ok(gs);
    }
    let op = node.name;
    Ok(gs
        .into_iter()
        .map(|pg| {
            pg.map(|pg| {
                let fails: BackwardFn = Box::new(move |_: &Tensor, _: &Inputs| {
                    // attention has a path made of recorded ops (PyTorch's math
                    // backend, which its fused kernels also send double backward to)
                    let hint = match op {
                        "scaled_dot_product_attention" => "; run the attention under ember::nn::functional::with_attention_path(AttentionPath::Math), whose ops are",
                        _ => "",
                    };
                    Err(Error::invalid(
                        "backward",
                        format!(
                            "the gradient of {op} is not differentiable in ember (its backward is not recorded when a graph is created); the ops whose gradients are differentiable are listed in ember::autograd's documentation{hint}"
                        ),
                    ))
                });
                let n = Arc::new(Node {
                    name: op,
                    inner: Mutex::new(Some((Inputs(edges.clone()), Rule::Once(fails)))),
                    twice: false,
                    module: None,
                });
                pg.detach().with_node(n)
            })
        })
        .collect())
}

/// Runs `f`, which builds the rule of `out`'s op, with `out` marked as the
/// output ([`Tensor::save`] tells it from other values by that).
fn building<R>(out: &Tensor, f: impl FnOnce() -> R) -> R {
    struct Restore(usize);
    impl Drop for Restore {
        fn drop(&mut self) {
            RECORDING.with(|r| r.set(self.0));
        }
    }
    let _restore = Restore(RECORDING.with(|r| r.replace(out.id())));
    f()
}

/// Names the node whose rule runs until dropped (for [`check_version`]'s message).
struct Running(&'static str);

impl Running {
    fn enter(name: &'static str) -> Running {
        Running(RUNNING.with(|r| r.replace(name)))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.with(|r| r.set(self.0));
    }
}
