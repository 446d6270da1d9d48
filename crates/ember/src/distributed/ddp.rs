//! [`DistributedDataParallel`]: one model replica per rank, gradients averaged
//! over the ranks while backward still runs.

use super::{ProcessGroup, ReduceOp};
use crate::autograd::HookHandle;
use crate::nn::{IncompatibleKeys, Module};
use crate::{
    device::Device,
    dtype::DType,
    error::{Error, Result},
    tensor::Tensor,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};

/// PyTorch's default bucket size, and its smaller first bucket (so that the first
/// reduction starts early in backward).
const BUCKET_CAP: usize = 25 << 20;
const FIRST_BUCKET_CAP: usize = 1 << 20;

/// Data-parallel training of `module` over a [`ProcessGroup`]
/// (`torch.nn.parallel.DistributedDataParallel`).
///
/// At construction the ranks check that they hold the same parameters (names,
/// shapes, dtypes) and take rank 0's values of every parameter and buffer. Then
/// each rank runs forward and backward on its own batch; the gradients are
/// averaged over the ranks during backward, so after `backward` every rank holds
/// the gradient of the mean loss over all ranks' samples, and the same optimizer
/// step keeps the replicas equal.
///
/// How: the parameters are grouped, in reverse order of registration (about the
/// order backward produces their gradients), into buckets of about 25 MB (the
/// first 1 MB). A hook on each parameter notes its gradient; when a bucket's
/// gradients are all there, the bucket is flattened and handed to a communication
/// thread that all-reduces it while backward goes on with the rest of the graph.
/// At the end of backward the buckets are awaited and written back into `.grad()`.
///
/// - [`no_sync`](Self::no_sync) skips the reduction (gradient accumulation: the
///   gradients of several backward passes add up locally, and the first backward
///   outside `no_sync` reduces the sum, of every parameter used since the last
///   reduction).
/// - A parameter that received no gradient in a backward is an error at the end
///   of that backward, naming it, unless
///   [`find_unused_parameters`](Self::find_unused_parameters) is set (then it counts
///   as a zero gradient). The group is aborted with the error, so the other ranks
///   fail too instead of waiting for this rank's buckets.
/// - Buffers (batch norm's running statistics) are taken from rank 0 at the first
///   forward and at each forward after one that ran with gradients outside
///   `no_sync` (in training or evaluation mode alike), as PyTorch's
///   `broadcast_buffers=True` does.
///
/// The state dict is the inner module's (no `module.` prefix), so a checkpoint
/// loads into the model with or without the wrapper.
pub struct DistributedDataParallel<M: Module> {
    module: M,
    reducer: Arc<Reducer>,
    hooks: Vec<HookHandle>,
    bucket_cap: usize,
    find_unused: bool,
    broadcast_buffers: bool,
    /// Whether the next forward takes rank 0's buffers (PyTorch's
    /// `require_forward_param_sync`): at first, and after a forward with
    /// gradients outside `no_sync`.
    sync_buffers: AtomicBool,
}

/// The reduction state the parameters' hooks share.
struct Reducer {
    pg: Arc<ProcessGroup>,
    names: Vec<String>,
    params: Vec<Tensor>,
    /// Parameter indices per bucket, in launch order.
    buckets: Vec<Vec<usize>>,
    /// Each parameter's bucket.
    bucket_of: Vec<usize>,
    sync: AtomicBool,
    find_unused: AtomicBool,
    /// The parameters whose gradient arrived in a backward under `no_sync` since
    /// the last reduction: the next reduction counts them as used.
    used_unsynced: Mutex<Vec<bool>>,
    iter: Mutex<Iteration>,
    /// The communication streams, one per GPU that holds parameters.
    streams: Mutex<Vec<crate::backend::cuda::Stream>>,
}

/// One backward's progress.
#[derive(Default)]
struct Iteration {
    /// Parameters whose gradient arrived.
    seen: Vec<bool>,
    /// Gradients still missing per bucket.
    missing: Vec<usize>,
    /// The first bucket not handed to the communication thread yet.
    next: usize,
    /// The reductions handed over, per bucket.
    pending: Vec<Option<Pending>>,
}

/// A bucket ready for reduction.
enum Pending {
    /// Handed to the group's communication thread, which answers with the reduced
    /// values (and on a GPU an event of the communication stream after the
    /// reduction).
    Queued(Receiver<Result<Reduced>>),
}

/// A bucket's values after the reduction, and on a GPU the event after which they
/// are there.
type Reduced = (Tensor, Option<crate::backend::cuda::Event>);

struct Job {
    flat: Tensor,
    /// On a GPU: the communication stream, and an event of the backward thread's
    /// stream after which `flat` holds the gradients.
    streams: Option<(crate::backend::cuda::Stream, crate::backend::cuda::Event)>,
}

/// Runs a bucket's reduction: on a GPU on the communication stream, after the
/// backward thread's stream has made the bucket, so that it overlaps the kernels
/// backward queues meanwhile.
fn reduce(pg: &ProcessGroup, job: Job) -> Result<Reduced> {
    let Job { flat, streams, .. } = job;
    match streams {
        None => pg.all_reduce(&flat, ReduceOp::Avg).map(|()| (flat, None)),
        Some((comm, ready)) => crate::backend::cuda::with_stream(&comm, || {
            comm.wait_event(&ready)?;
            pg.all_reduce(&flat, ReduceOp::Avg)?;
            let done = comm.record_event()?;
            Ok((flat, Some(done)))
        }),
    }
}

impl<M: Module> DistributedDataParallel<M> {
    /// Wraps `module` (already on its device) for data-parallel training over
    /// `pg`: checks that every rank has the same parameters, and broadcasts rank
    /// 0's parameters and buffers.
    pub fn new(module: M, pg: Arc<ProcessGroup>) -> Result<Self> {
        let mut ddp = DistributedDataParallel {
            module,
            reducer: Reducer::empty(pg),
            hooks: Vec::new(),
            bucket_cap: BUCKET_CAP,
            find_unused: false,
            broadcast_buffers: true,
            sync_buffers: AtomicBool::new(true),
        };
        ddp.check_same_model()?;
        ddp.sync_from_rank0(true)?;
        ddp.rebuild()?;
        Ok(ddp)
    }

    /// Buckets of about `mb` megabytes (PyTorch's `bucket_cap_mb`, default 25).
    pub fn bucket_cap_mb(mut self, mb: f64) -> Result<Self> {
        if !(mb > 0.0 && mb.is_finite()) {
            return Err(Error::invalid(
                "DistributedDataParallel",
                format!("bucket_cap_mb must be positive, got {mb}"),
            ));
        }
        self.bucket_cap = (mb * (1 << 20) as f64) as usize;
        self.rebuild()?;
        Ok(self)
    }

    /// Lets parameters receive no gradient in a backward (they count as zero).
    pub fn find_unused_parameters(mut self, on: bool) -> Self {
        self.find_unused = on;
        self.reducer.find_unused.store(on, Ordering::SeqCst);
        self
    }

    /// Takes rank 0's buffers before a forward (the default; see the type's
    /// documentation for which) or never.
    pub fn broadcast_buffers(mut self, on: bool) -> Self {
        self.broadcast_buffers = on;
        self
    }

    /// The wrapped module.
    pub fn module(&self) -> &M {
        &self.module
    }

    /// The process group.
    pub fn process_group(&self) -> &Arc<ProcessGroup> {
        &self.reducer.pg
    }

    /// The parameter names per bucket, in the order the buckets are reduced.
    pub fn buckets(&self) -> Vec<Vec<String>> {
        let r = &self.reducer;
        r.buckets
            .iter()
            .map(|b| b.iter().map(|&i| r.names[i].clone()).collect())
            .collect()
    }

    /// Skips the gradient reduction while the guard lives (`with ddp.no_sync():`):
    /// gradients accumulate locally until a backward outside it.
    pub fn no_sync(&self) -> NoSyncGuard {
        let was = self.reducer.sync.swap(false, Ordering::SeqCst);
        NoSyncGuard {
            reducer: self.reducer.clone(),
            was,
        }
    }

    /// Every rank must hold parameters of the same names, shapes and dtypes.
    fn check_same_model(&self) -> Result<()> {
        let pg = &self.reducer.pg;
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |b: &[u8]| {
            for x in b {
                h = (h ^ *x as u64).wrapping_mul(0x100_0000_01b3);
            }
        };
        for (name, p) in self.module.state_dict() {
            eat(name.as_bytes());
            eat(p.dtype().as_str().as_bytes());
            for d in p.shape() {
                eat(&d.to_le_bytes());
            }
        }
        let mine = Tensor::new([h as i64], &Device::Cpu)?;
        let all = pg.all_gather(&mine)?;
        for (r, t) in all.iter().enumerate() {
            if t.to_vec1::<i64>()? != [h as i64] {
                return Err(Error::distributed(
                    "DistributedDataParallel",
                    format!(
                        "rank {r}'s model differs from rank {}'s (parameter and buffer names, shapes or dtypes): every rank must build the same model",
                        pg.rank()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Takes rank 0's buffers, and with `params` its parameters too, one
    /// broadcast per dtype and device.
    fn sync_from_rank0(&self, params: bool) -> Result<()> {
        let pg = &self.reducer.pg;
        if pg.world_size() == 1 {
            return Ok(());
        }
        let mut tensors: Vec<Tensor> = Vec::new();
        if params {
            tensors.extend(self.module.parameters());
        }
        tensors.extend(self.module.named_buffers().into_iter().map(|(_, b)| b));
        for group in by_dtype_device(&tensors) {
            let flat = concat_flat(group.iter().map(|t| Ok(t.detach())))?;
            pg.broadcast(&flat, 0)?;
            if pg.rank() != 0 {
                scatter_back(&flat, &group, |t, v| {
                    crate::autograd::no_grad(|| t.copy_(v))
                })?;
            }
        }
        Ok(())
    }

    /// Groups the parameters into buckets and puts a hook on each.
    fn rebuild(&mut self) -> Result<()> {
        for h in self.hooks.drain(..) {
            h.remove();
        }
        // (a tied weight once: one bucket slot and one hook)
        let named: Vec<(String, Tensor)> = crate::nn::unique_named_parameters(&self.module)
            .into_iter()
            .filter(|(_, p)| p.requires_grad())
            .collect();
        let mut buckets: Vec<Vec<usize>> = Vec::new();
        let mut open: HashMap<(DType, Device), (usize, usize)> = HashMap::new();
        for i in (0..named.len()).rev() {
            let p = &named[i].1;
            let key = (p.dtype(), p.device());
            let bytes = p.numel() * p.dtype().size_in_bytes();
            let cap = |b: usize| match b {
                0 => FIRST_BUCKET_CAP.min(self.bucket_cap),
                _ => self.bucket_cap,
            };
            match open.get_mut(&key) {
                Some((b, size)) if *size < cap(*b) => {
                    buckets[*b].push(i);
                    *size += bytes;
                }
                _ => {
                    open.insert(key, (buckets.len(), bytes));
                    buckets.push(vec![i]);
                }
            }
        }
        let mut bucket_of = vec![0; named.len()];
        for (b, members) in buckets.iter().enumerate() {
            for &i in members {
                bucket_of[i] = b;
            }
        }
        let reducer = Arc::new(Reducer {
            pg: self.reducer.pg.clone(),
            names: named.iter().map(|(n, _)| n.clone()).collect(),
            params: named.iter().map(|(_, p)| p.clone()).collect(),
            buckets,
            bucket_of,
            sync: AtomicBool::new(true),
            find_unused: AtomicBool::new(self.find_unused),
            used_unsynced: Mutex::new(vec![false; named.len()]),
            iter: Mutex::new(Iteration::default()),
            streams: Mutex::new(Vec::new()),
        });
        for (i, (_, p)) in named.iter().enumerate() {
            let r = reducer.clone();
            self.hooks
                .push(p.register_post_accumulate_grad_hook(move |_| Reducer::ready(&r, i))?);
        }
        self.reducer = reducer;
        Ok(())
    }
}

/// Restores gradient reduction when dropped (see
/// [`DistributedDataParallel::no_sync`]).
pub struct NoSyncGuard {
    reducer: Arc<Reducer>,
    was: bool,
}

impl Drop for NoSyncGuard {
    fn drop(&mut self) {
        self.reducer.sync.store(self.was, Ordering::SeqCst);
    }
}

impl<M: Module> Drop for DistributedDataParallel<M> {
    fn drop(&mut self) {
        for h in self.hooks.drain(..) {
            h.remove();
        }
    }
}

impl Reducer {
    fn empty(pg: Arc<ProcessGroup>) -> Arc<Reducer> {
        Arc::new(Reducer {
            pg,
            names: Vec::new(),
            params: Vec::new(),
            buckets: Vec::new(),
            bucket_of: Vec::new(),
            sync: AtomicBool::new(true),
            find_unused: AtomicBool::new(false),
            used_unsynced: Mutex::new(Vec::new()),
            iter: Mutex::new(Iteration::default()),
            streams: Mutex::new(Vec::new()),
        })
    }

    /// Parameter `i`'s gradient has been accumulated.
    fn ready(this: &Arc<Reducer>, i: usize) -> Result<()> {
        if !this.sync.load(Ordering::SeqCst) {
            let mut used = this.used_unsynced.lock().unwrap_or_else(|p| p.into_inner());
            used[i] = true;
            return Ok(());
        }
        let mut it = this.iter.lock().unwrap_or_else(|p| p.into_inner());
        if it.seen.is_empty() {
            // the first gradient of this backward (`finish`, and `reset` after a
            // backward that failed, empty the state again)
            let r = this.clone();
            crate::autograd::queue_callback(move || Reducer::finish(&r))?;
            it.seen = vec![false; this.params.len()];
            it.missing = this.buckets.iter().map(|b| b.len()).collect();
            it.pending = (0..this.buckets.len()).map(|_| None).collect();
            it.next = 0;
        }
        // backward accumulates into each leaf once
        debug_assert!(!it.seen[i], "{} ready twice in one backward", this.names[i]);
        it.seen[i] = true;
        it.missing[this.bucket_of[i]] -= 1;
        this.launch_ready(&mut it)
    }

    /// Hands every complete bucket, in order, to the communication thread.
    fn launch_ready(&self, it: &mut Iteration) -> Result<()> {
        while it.next < self.buckets.len() && it.missing[it.next] == 0 {
            let b = it.next;
            let flat = concat_flat(self.buckets[b].iter().map(|&i| {
                let p = &self.params[i];
                p.grad().map_or_else(|| p.zeros_like(), Ok)
            }))?;
            let streams = match flat.device() {
                d @ Device::Cuda(_) => {
                    let comm = self.comm_stream(&d)?;
                    let ready = crate::backend::cuda::current_stream(&d)?.record_event()?;
                    // the bucket's memory is used on the communication stream too
                    flat.record_stream(&comm)?;
                    Some((comm, ready))
                }
                _ => None,
            };
            let (done, wait) = channel();
            let pg = self.pg.clone();
            // the group's one queue: buckets of every model on the group, and
            // anything else queued there, reach the ring in the same order on
            // every rank
            self.pg.submit(Box::new(move || {
                let _ = done.send(reduce(&pg, Job { flat, streams }));
            }))?;
            it.pending[b] = Some(Pending::Queued(wait));
            it.next += 1;
        }
        Ok(())
    }

    /// The communication stream of `device`.
    fn comm_stream(&self, device: &Device) -> Result<crate::backend::cuda::Stream> {
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = streams.iter().find(|s| s.device() == *device) {
            return Ok(s.clone());
        }
        let s = crate::backend::cuda::Stream::new(device)?;
        streams.push(s.clone());
        Ok(s)
    }

    /// Forgets a backward that stopped before its end (an error in it): its
    /// reductions already handed over are awaited, the rest dropped, so that the
    /// next backward starts afresh.
    fn reset(&self) {
        let it = std::mem::take(&mut *self.iter.lock().unwrap_or_else(|p| p.into_inner()));
        for Pending::Queued(wait) in it.pending.into_iter().flatten() {
            let _ = wait.recv();
        }
    }

    /// The end of backward: every bucket reduced and written back.
    fn finish(this: &Arc<Reducer>) -> Result<()> {
        let mut it = std::mem::take(&mut *this.iter.lock().unwrap_or_else(|p| p.into_inner()));
        // used under no_sync since the last reduction: their accumulated gradients
        // are reduced now, as PyTorch's `local_used_map` counts them
        let unsynced = std::mem::replace(
            &mut *this.used_unsynced.lock().unwrap_or_else(|p| p.into_inner()),
            vec![false; this.params.len()],
        );
        let unused: Vec<usize> = (0..this.params.len()).filter(|&i| !it.seen[i]).collect();
        if !unused.is_empty() {
            if !this.find_unused.load(Ordering::SeqCst) {
                let names: Vec<&str> = unused.iter().map(|&i| this.names[i].as_str()).collect();
                let msg = format!(
                    "parameters that received no gradient in this backward: {}. Every parameter must take part in computing the loss on every rank; if some do not, wrap the model with .find_unused_parameters(true)",
                    names.join(", ")
                );
                this.pg.abort(&msg);
                return Err(Error::distributed("DistributedDataParallel", msg));
            }
            for &i in &unused {
                it.missing[this.bucket_of[i]] -= 1;
            }
            this.launch_ready(&mut it)?;
        }
        // with find_unused_parameters, which parameters any rank used in this
        // backward or under no_sync since the last reduction (PyTorch's
        // `local_used_map`): those no rank used keep their gradient as it is
        let used = if this.find_unused.load(Ordering::SeqCst) {
            let mine: Vec<u8> = it
                .seen
                .iter()
                .zip(&unsynced)
                .map(|(s, u)| (*s || *u) as u8)
                .collect();
            let (done, wait) = channel();
            let pg = this.pg.clone();
            this.pg.submit(Box::new(move || {
                let r = Tensor::new(mine.as_slice(), &Device::Cpu).and_then(|t| {
                    pg.all_reduce(&t, ReduceOp::Max)?;
                    t.to_vec1::<u8>()
                });
                let _ = done.send(r);
            }))?;
            Some(wait)
        } else {
            None
        };
        let mut reduced = Vec::with_capacity(it.pending.len());
        for pending in it.pending {
            let flat = match pending.expect("every bucket was launched") {
                Pending::Queued(wait) => {
                    let (flat, done) = wait.recv().map_err(|_| {
                        Error::distributed(
                            "DistributedDataParallel",
                            "the communication thread has stopped",
                        )
                    })??;
                    if let Some(done) = done {
                        // the write-back waits on the GPU, not on the host
                        crate::backend::cuda::current_stream(&flat.device())?.wait_event(&done)?;
                    }
                    flat
                }
            };
            reduced.push(flat);
        }
        let used = match used {
            Some(wait) => Some(wait.recv().map_err(|_| {
                Error::distributed(
                    "DistributedDataParallel",
                    "the communication thread has stopped",
                )
            })??),
            None => None,
        };
        for (b, flat) in reduced.into_iter().enumerate() {
            let members = &this.buckets[b];
            let tensors: Vec<Tensor> = members.iter().map(|&i| this.params[i].clone()).collect();
            let mut k = 0;
            scatter_back(&flat, &tensors, |p, v| {
                let i = members[k];
                k += 1;
                if used.as_ref().is_some_and(|u| u[i] == 0) {
                    return Ok(());
                }
                match p.grad() {
                    Some(g) => crate::autograd::no_grad(|| g.copy_(v)),
                    None => {
                        p.set_grad(Some(v.copy()?))?;
                        Ok(())
                    }
                }
            })?;
        }
        Ok(())
    }
}

/// The values of `tensors`, flattened one after the other (a bucket, or what a
/// broadcast sends); [`scatter_back`] undoes it.
fn concat_flat(tensors: impl Iterator<Item = Result<Tensor>>) -> Result<Tensor> {
    let parts: Vec<Tensor> = tensors
        .map(|t| t.and_then(|t| t.flatten_all()))
        .collect::<Result<_>>()?;
    Tensor::cat(&parts.iter().collect::<Vec<_>>(), 0)
}

/// Hands each of `tensors` its part of `flat` (their values, flattened one after
/// the other), reshaped to its shape.
fn scatter_back(
    flat: &Tensor,
    tensors: &[Tensor],
    mut put: impl FnMut(&Tensor, &Tensor) -> Result<()>,
) -> Result<()> {
    let mut at = 0;
    for t in tensors {
        let n = t.numel();
        let part = flat.narrow(0, at as i64, n)?.reshape(t.shape())?;
        put(t, &part)?;
        at += n;
    }
    Ok(())
}

/// `tensors` grouped by dtype and device, each group in the given order.
fn by_dtype_device(tensors: &[Tensor]) -> Vec<Vec<Tensor>> {
    let mut groups: Vec<((DType, Device), Vec<Tensor>)> = Vec::new();
    for t in tensors {
        let key = (t.dtype(), t.device());
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, g)) => g.push(t.clone()),
            None => groups.push((key, vec![t.clone()])),
        }
    }
    groups.into_iter().map(|(_, g)| g).collect()
}

impl<M: Module> Module for DistributedDataParallel<M> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let grad = crate::autograd::is_grad_enabled();
        if grad {
            self.reducer.reset();
        }
        if self.broadcast_buffers && self.sync_buffers.load(Ordering::SeqCst) {
            self.sync_from_rank0(false)?;
        }
        let y = self.module.forward(x)?;
        // the next forward takes rank 0's buffers after one whose backward reduces
        // (every rank runs it), not after one under no_sync or without gradients
        let synced = grad && self.reducer.sync.load(Ordering::SeqCst);
        self.sync_buffers.store(synced, Ordering::SeqCst);
        Ok(y)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        self.module.named_parameters()
    }

    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        self.module.named_buffers()
    }

    fn state_dict(&self) -> Vec<(String, Tensor)> {
        self.module.state_dict()
    }

    fn load_state_dict(
        &self,
        state: &[(String, Tensor)],
        strict: bool,
    ) -> Result<IncompatibleKeys> {
        self.module.load_state_dict(state, strict)
    }

    fn to_device(&mut self, device: &Device) -> Result<()> {
        self.module.to_device(device)?;
        self.rebuild()
    }

    fn to_empty(&mut self, device: &Device) -> Result<()> {
        self.module.to_empty(device)?;
        self.rebuild()
    }

    fn to_dtype(&mut self, dtype: DType) -> Result<()> {
        self.module.to_dtype(dtype)?;
        self.rebuild()
    }

    fn to_memory_format(&mut self, format: crate::layout::MemoryFormat) -> Result<()> {
        self.module.to_memory_format(format)?;
        self.rebuild()
    }

    fn reset_parameters(&mut self) -> Result<()> {
        self.module.reset_parameters()?;
        self.sync_from_rank0(true)
    }

    fn set_training(&mut self, training: bool) {
        self.module.set_training(training)
    }
}
