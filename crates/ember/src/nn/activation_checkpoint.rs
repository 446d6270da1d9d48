//! Activation checkpointing (`torch.utils.checkpoint`): once a region's
//! forward pass has run, nothing of it is kept for backward but its inputs;
//! it runs again, recording, when backward reaches it. Memory then holds the
//! activations of one region at a time instead of all of them, for one more
//! forward pass of compute.
//!
//! The recomputation draws the same random numbers as the forward pass did
//! (dropout masks repeat: the stream is forked where it stood) and runs under
//! the autocast setting the forward pass had. Batch norm's running statistics
//! and batch count move once, in the first run, as without checkpoints
//! (PyTorch's checkpoint moves them again in the recomputation).

use crate::{
    autograd::{
        checkpoint_grads, enable_grad_guard, is_grad_enabled, needs_grad, Grads, Inputs,
        Recomputing,
    },
    backend::generator::Generator,
    device::Device,
    dtype::DType,
    error::{Error, Result},
    layout::MemoryFormat,
    nn::{IncompatibleKeys, Module},
    tensor::autocast::{autocast_dtype, autocast_guard_for, DeviceType},
    tensor::Tensor,
};
use std::sync::{Arc, RwLock};

/// Runs `f(inputs)` as a checkpointed region (`torch.utils.checkpoint.
/// checkpoint(f, *inputs, use_reentrant=False)`): nothing inside it is kept for
/// backward but `inputs`, and backward runs `f` again to get the gradients.
///
/// `params` are the leaves `f` reads besides its inputs that need gradients
/// (a module's parameters): they give the region its place in the graph when no
/// input requires grad, and receive their gradients through it. A leaf that
/// `f` reads and `params` does not list still receives its gradient (added into
/// its `.grad()` when the region's backward runs), except under
/// [`autograd::grad`](crate::autograd::grad), which refuses it.
///
/// An input changed in place between the forward pass and backward is an error
/// at backward, as for any saved tensor; so is a parameter changed in place (an
/// optimizer step) before backward.
///
/// ```
/// use ember::prelude::*;
/// use ember::nn::{self, Module};
/// let dev = Device::Cpu;
/// let lin = std::sync::Arc::new(nn::Linear::new(4, 4, &dev)?);
/// let x = Tensor::randn([2, 4], &dev)?.requires_grad_(true)?;
/// let inner = lin.clone();
/// let y = nn::checkpoint(
///     move |xs| inner.forward(&xs[0])?.tanh(),
///     &[&x],
///     &lin.parameters(),
/// )?;
/// y.sum_all()?.backward()?;
/// assert!(x.grad().is_some() && lin.weight.grad().is_some());
/// # Ok::<(), ember::Error>(())
/// ```
pub fn checkpoint<F>(f: F, inputs: &[&Tensor], params: &[Tensor]) -> Result<Tensor>
where
    F: Fn(&[Tensor]) -> Result<Tensor> + Send + Sync + 'static,
{
    if let Some(p) = params.iter().find(|p| !p.is_leaf()) {
        return Err(Error::invalid(
            "checkpoint",
            format!(
                "params must be leaves (a module's parameters); a computed tensor ({:?} {}) goes in inputs",
                p.shape(),
                p.dtype()
            ),
        ));
    }
    let rng = Generator::fork_current()?;
    let autocast = [
        autocast_dtype(DeviceType::Cpu),
        autocast_dtype(DeviceType::Cuda),
    ];
    let params: Vec<&Tensor> = params.iter().filter(|p| p.requires_grad()).collect();
    let edges: Vec<&Tensor> = inputs.iter().copied().chain(params).collect();
    if !is_grad_enabled() {
        let given: Vec<Tensor> = inputs.iter().map(|&t| t.clone()).collect();
        return f(&given);
    }
    // The forward pass records as the recomputation will (ops that choose
    // their kernel by whether a graph is recorded choose the same one both
    // times, so the values and random draws are the same), on detached inputs,
    // and its graph goes as soon as it returns: what its rules saved is freed
    // then, at the end of the region.
    let detached = detach_all(inputs)?;
    let out = f(&detached)?.detach();
    drop(detached);
    if !needs_grad(&edges) {
        return Ok(out);
    }
    let n_in = inputs.len();
    let wants: Vec<bool> = inputs.iter().map(|t| t.requires_grad()).collect();
    // the inputs' values are the checkpoint; the parameters are leaves, which
    // the node holds anyway
    let keep: Vec<bool> = (0..edges.len()).map(|i| i < n_in).collect();
    let n_edges = edges.len();
    Ok(Tensor::record_keeping(
        out,
        "checkpoint",
        &edges,
        &keep,
        move |_| {
            move |g: &Tensor, ins: &Inputs| -> Result<Grads> {
                let mut targets = Vec::with_capacity(n_edges);
                let mut xs = Vec::with_capacity(n_in);
                for (i, &want) in wants.iter().enumerate() {
                    let x = ins.get(i)?.detach();
                    let x = if want { x.requires_grad_(true)? } else { x };
                    targets.push(x.clone());
                    xs.push(x);
                }
                for i in n_in..n_edges {
                    targets.push(ins.get(i)?.clone());
                }
                let y = {
                    let _recomputing = Recomputing::enter();
                    let _recording = enable_grad_guard();
                    let _cpu = autocast_guard_for(DeviceType::Cpu, autocast[0])?;
                    let _cuda = autocast_guard_for(DeviceType::Cuda, autocast[1])?;
                    rng.scope(|| f(&xs))?
                };
                if !y.requires_grad() {
                    return Ok(vec![None; n_edges]);
                }
                if y.shape() != g.shape() {
                    return Err(Error::shape(
                        "checkpoint",
                        g.shape(),
                        y.shape(),
                        "the recomputed output's shape differs from the forward pass's",
                    ));
                }
                let mut gs = checkpoint_grads(&y, g, &targets)?;
                for (i, want) in wants.iter().enumerate() {
                    if !want {
                        gs[i] = None;
                    }
                }
                Ok(gs)
            }
        },
    ))
}

/// Each of `inputs` detached, requiring grad where it did: the region's own
/// leaves.
fn detach_all(inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    inputs
        .iter()
        .map(|t| {
            let d = t.detach();
            if t.requires_grad() {
                d.requires_grad_(true)
            } else {
                Ok(d)
            }
        })
        .collect()
}

/// A module run as a checkpointed region ([`checkpoint`]): PyTorch's
/// `checkpoint_wrapper`. Its parameters, buffers and state dict are the inner
/// module's, under the same names, so a model whose blocks are wrapped loads
/// the same checkpoints. Wrap the blocks of a deep model (a transformer's
/// layers, a ResNet's stages) to hold one block's activations at a time.
///
/// ```
/// use ember::prelude::*;
/// use ember::nn::{self, Module};
/// let dev = Device::Cpu;
/// let block = nn::Checkpoint::new(nn::Linear::new(8, 8, &dev)?);
/// let x = Tensor::randn([3, 8], &dev)?;
/// block.forward(&x)?.square()?.sum_all()?.backward()?;
/// assert_eq!(block.named_parameters()[0].0, "weight");
/// assert!(block.parameters().iter().all(|p| p.grad().is_some()));
/// # Ok::<(), ember::Error>(())
/// ```
pub struct Checkpoint<M: Module + 'static> {
    inner: Arc<RwLock<M>>,
}

impl<M: Module + 'static> Checkpoint<M> {
    /// Wraps `module`.
    pub fn new(module: M) -> Checkpoint<M> {
        Checkpoint {
            inner: Arc::new(RwLock::new(module)),
        }
    }

    /// Runs `f` with the module inside.
    pub fn with_inner<R>(&self, f: impl FnOnce(&M) -> R) -> R {
        f(&self.inner.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Runs `f` with the module inside, mutably.
    pub fn with_inner_mut<R>(&mut self, f: impl FnOnce(&mut M) -> R) -> R {
        f(&mut self.inner.write().unwrap_or_else(|p| p.into_inner()))
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, M> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&mut self) -> std::sync::RwLockWriteGuard<'_, M> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }
}

impl<M: Module + 'static> Module for Checkpoint<M> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let inner = self.inner.clone();
        let params = self.read().parameters();
        checkpoint(
            move |xs| {
                inner
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .forward(&xs[0])
            },
            &[x],
            &params,
        )
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        self.read().named_parameters()
    }

    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        self.read().named_buffers()
    }

    fn state_dict(&self) -> Vec<(String, Tensor)> {
        self.read().state_dict()
    }

    fn load_state_dict(
        &self,
        state: &[(String, Tensor)],
        strict: bool,
    ) -> Result<IncompatibleKeys> {
        self.read().load_state_dict(state, strict)
    }

    fn materialize_lazy(&self, shapes: &[(&str, &[usize])]) -> Result<()> {
        self.read().materialize_lazy(shapes)
    }

    fn to_device(&mut self, device: &Device) -> Result<()> {
        self.write().to_device(device)
    }

    fn to_empty(&mut self, device: &Device) -> Result<()> {
        self.write().to_empty(device)
    }

    fn to_dtype(&mut self, dtype: DType) -> Result<()> {
        self.write().to_dtype(dtype)
    }

    fn to_memory_format(&mut self, format: MemoryFormat) -> Result<()> {
        self.write().to_memory_format(format)
    }

    fn reset_parameters(&mut self) -> Result<()> {
        self.write().reset_parameters()
    }

    fn set_training(&mut self, training: bool) {
        self.write().set_training(training)
    }

    fn parameters(&self) -> Vec<Tensor> {
        self.read().parameters()
    }

    fn num_parameters(&self) -> usize {
        self.read().num_parameters()
    }

    fn train(&mut self) {
        self.write().train()
    }

    fn eval(&mut self) {
        self.write().eval()
    }
}
