// Over 800 lines: the process group and its collectives; the CPU and NCCL paths share the agreement, the queue and the failure handling.
//! Data-parallel training across processes (`torch.distributed`): a process group,
//! its collectives on tensors, and [`DistributedDataParallel`].
//!
//! Each process (rank) of a job joins a process group; collectives then combine or
//! share tensors across the ranks. `ember launch` starts the processes the way
//! `torchrun` does, with `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR` and
//! `MASTER_PORT` set, and [`init_process_group`] reads them:
//!
//! ```no_run
//! use ember::distributed::{self as dist, Backend, ReduceOp};
//! use ember::prelude::*;
//! dist::init_process_group(Backend::Gloo)?;
//! let t = Tensor::full([4], dist::get_rank()? as f64, DType::F32, &Device::Cpu)?;
//! dist::all_reduce(&t, ReduceOp::Sum)?; // every rank now holds 0 + 1 + ... + (world - 1)
//! dist::destroy_process_group();
//! # Ok::<(), ember::Error>(())
//! ```
//!
//! The rendezvous: rank 0 serves a small key-value store (PyTorch's `TCPStore`) at
//! `MASTER_ADDR:MASTER_PORT`; every rank reaches it, publishes where it listens,
//! and connects to its neighbours. Nothing waits forever: the rendezvous and every
//! collective fail after the group's timeout (30 minutes by default, as in
//! PyTorch; `EMBER_DIST_TIMEOUT` in seconds, or [`Options::timeout`]), and a rank
//! whose process exits is noticed at once by the others, whose collectives fail
//! with an error that names it.
//!
//! Backends:
//! - [`Backend::Nccl`]: NVIDIA's NCCL for CUDA tensors (`libnccl.so.2`, found at run
//!   time like the other CUDA libraries), queued on the current stream without a
//!   host wait; the ranks compare their calls over the CPU backend's ring first.
//!   CPU tensors go through the CPU backend. On ember's CUDA simulator the NCCL
//!   calls are served through the CPU backend.
//! - [`Backend::Gloo`], ember's own CPU backend (PyTorch's gloo role): ring
//!   collectives over TCP between the ranks' host memory. It takes CPU tensors,
//!   and CUDA tensors through copies to the host.
//!
//! Every rank must call the same collectives in the same order with tensors of
//! the same shape, dtype and kind of device; ember checks this at each call (the
//! ranks exchange a description first) and fails on every rank, naming both calls,
//! when they differ.

mod ddp;
mod ring;
mod store;

pub use crate::data::DistributedSampler;
pub use ddp::{DistributedDataParallel, NoSyncGuard};

use crate::backend::op::collective::{CommKind, HostCollectives};
use crate::backend::storage::Communicator;
use crate::dtype::CpuData;
use crate::{
    device::Device,
    dtype::DType,
    error::{Error, Result},
    tensor::Tensor,
};
use ring::{Call, Ring};
use std::str::FromStr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

/// The engine that moves the tensors between ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// ember's CPU backend (`"gloo"`, also `"cpu"`): ring collectives over TCP.
    Gloo,
    /// NVIDIA's NCCL (`"nccl"`) for CUDA tensors, queued on the current stream;
    /// CPU tensors (metrics) go through the CPU backend's ring.
    Nccl,
}

impl FromStr for Backend {
    type Err = Error;
    fn from_str(s: &str) -> Result<Backend> {
        match s {
            "gloo" | "cpu" => Ok(Backend::Gloo),
            "nccl" => Ok(Backend::Nccl),
            _ => Err(Error::distributed(
                "init_process_group",
                format!("unknown backend {s:?}: expected \"gloo\" or \"nccl\""),
            )),
        }
    }
}

pub use crate::backend::op::collective::ReduceOp;

/// Where a rank finds the others, and who it is.
#[derive(Clone, Debug)]
pub struct Options {
    /// The engine.
    pub backend: Backend,
    /// This process's rank, `0..world_size`.
    pub rank: usize,
    /// How many ranks the job has.
    pub world_size: usize,
    /// The rank among those of this machine (`LOCAL_RANK`): the GPU it uses.
    pub local_rank: usize,
    /// The ranks on this machine (`LOCAL_WORLD_SIZE`), when known: fewer than the
    /// world size means the job spans machines.
    pub local_world_size: Option<usize>,
    /// Rank 0's host, where the rendezvous store listens.
    pub master_addr: String,
    /// The store's port.
    pub master_port: u16,
    /// How long the rendezvous and each collective may wait for the other ranks.
    pub timeout: Duration,
}

/// The longest timeout kept (ten years): longer ones, `Duration::MAX` included,
/// mean "wait as long as it takes" and are cut to this.
const MAX_TIMEOUT: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// PyTorch's default process-group timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);

impl Options {
    /// Options for rank `rank` of `world_size`, meeting at `master_addr:master_port`,
    /// with `LOCAL_RANK` equal to the rank and the default timeout.
    pub fn new(
        backend: Backend,
        rank: usize,
        world_size: usize,
        master_addr: &str,
        master_port: u16,
    ) -> Options {
        Options {
            backend,
            rank,
            world_size,
            local_rank: rank,
            local_world_size: None,
            master_addr: master_addr.to_string(),
            master_port,
            timeout: default_timeout(),
        }
    }

    /// The options `torchrun` and `ember launch` give a worker: `RANK`,
    /// `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, and `LOCAL_RANK` (the rank when
    /// unset). A missing or malformed variable is an error naming it.
    pub fn from_env(backend: Backend) -> Result<Options> {
        let var = |name: &str| {
            std::env::var(name).map_err(|_| {
                Error::distributed(
                    "init_process_group",
                    format!("{name} is not set: start the workers with `ember launch` (or torchrun), which sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT"),
                )
            })
        };
        let num = |name: &str| -> Result<usize> {
            let v = var(name)?;
            v.trim().parse().map_err(|_| {
                Error::distributed(
                    "init_process_group",
                    format!("{name}={v:?} is not a non-negative integer"),
                )
            })
        };
        let (rank, world, addr) = (num("RANK")?, num("WORLD_SIZE")?, var("MASTER_ADDR")?);
        let port = num("MASTER_PORT")?;
        let port = u16::try_from(port).map_err(|_| {
            Error::distributed(
                "init_process_group",
                format!("MASTER_PORT={port} is not a port"),
            )
        })?;
        let mut o = Options::new(backend, rank, world, &addr, port);
        if std::env::var_os("LOCAL_RANK").is_some() {
            o.local_rank = num("LOCAL_RANK")?;
        }
        if std::env::var_os("LOCAL_WORLD_SIZE").is_some() {
            o.local_world_size = Some(num("LOCAL_WORLD_SIZE")?);
        }
        // refused as soon as read, before a caller sizes its work by them
        o.check()?;
        Ok(o)
    }

    /// Whether the rank and world size can make a group: a world of at least
    /// one rank, and a rank within it.
    pub fn check(&self) -> Result<()> {
        let (rank, world) = (self.rank, self.world_size);
        if world == 0 {
            return Err(Error::distributed(
                "init_process_group",
                "world size 0: a group needs at least one rank",
            ));
        }
        if rank >= world {
            return Err(Error::distributed(
                "init_process_group",
                format!(
                    "rank {rank} is out of range for world size {world} (ranks are 0..{world})"
                ),
            ));
        }
        Ok(())
    }

    /// The same options with `timeout`.
    pub fn timeout(mut self, timeout: Duration) -> Options {
        self.timeout = timeout;
        self
    }
}

fn default_timeout() -> Duration {
    std::env::var("EMBER_DIST_TIMEOUT")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| *s > 0.0 && s.is_finite())
        .map(|s| Duration::from_secs_f64(s.min(MAX_TIMEOUT.as_secs_f64())))
        .unwrap_or(DEFAULT_TIMEOUT)
}

/// Work for a group's communication thread.
pub(crate) type CommJob = Box<dyn FnOnce() + Send>;

/// The ranks of a job, and the connections between them.
pub struct ProcessGroup {
    rank: usize,
    world: usize,
    local_rank: usize,
    backend: Backend,
    /// The ring, and the number of collectives called so far.
    ring: Mutex<(Ring, u64)>,
    /// Why the group was aborted, and its NCCL communicators (shared with the
    /// watchdog).
    shared: Arc<Shared>,
    /// The connections [`abort`](Self::abort) closes.
    sockets: Vec<std::net::TcpStream>,
    /// The NCCL backend's watchdog: its stop signal and thread.
    watchdog: Option<(std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>)>,
    store: store::Store,
    _server: Option<store::StoreServer>,
    /// The prefix of this group's keys in the store (see [`store::generation`]).
    prefix: String,
    /// The rendezvous this group was made by, counted as left when it is dropped.
    _joined: store::Joined,
    timeout: Duration,
    spans_machines: bool,
    /// The communication thread's queue (started by the first job).
    queue: Mutex<Option<std::sync::mpsc::Sender<CommJob>>>,
}

impl std::fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ProcessGroup(rank {} of {}, {:?})",
            self.rank, self.world, self.backend
        )
    }
}

impl ProcessGroup {
    /// Joins the group `options` describe: rank 0 starts the rendezvous store,
    /// every rank connects to it and to its neighbours. Returns when every rank
    /// has joined, or fails after the timeout naming the ranks that did not; a
    /// rank given twice, or a world size that differs from rank 0's, fails every
    /// rank at once.
    pub fn new(options: &Options) -> Result<ProcessGroup> {
        options.check()?;
        let (rank, world) = (options.rank, options.world_size);
        let timeout = options.timeout.min(MAX_TIMEOUT);
        let spans_machines = options.local_world_size.is_some_and(|l| l < world);
        if options.backend == Backend::Nccl {
            nccl_ready()?;
        }
        let (host, port) = (options.master_addr.as_str(), options.master_port);
        let server = if rank == 0 {
            Some(store::StoreServer::start(host, port, timeout)?)
        } else {
            None
        };
        let port = server.as_ref().map_or(port, |s| s.port());
        let joined_as = (host.to_string(), options.master_port, rank);
        let prefix = format!("{}/", store::generation(&joined_as));
        let st = store::join(host, port, &prefix, rank, world, timeout)?;
        let joined = store::Joined(joined_as);
        let ring = Ring::connect(
            &st,
            &format!("{prefix}g"),
            rank,
            world,
            timeout,
            spans_machines,
        )?;
        let sockets = ring.handles();
        let shared = Arc::new(Shared::default());
        let watchdog = if options.backend == Backend::Nccl && world > 1 {
            Some(watchdog(
                store::Store::connect(host, port, timeout)?,
                rank,
                shared.clone(),
            )?)
        } else {
            None
        };
        let pg = ProcessGroup {
            shared,
            watchdog,
            sockets,
            rank,
            world,
            local_rank: options.local_rank,
            backend: options.backend,
            ring: Mutex::new((ring, 0)),
            store: st,
            _server: server,
            prefix,
            _joined: joined,
            timeout,
            spans_machines,
            queue: Mutex::new(None),
        };
        pg.barrier()?;
        Ok(pg)
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.world
    }

    /// The rank among this machine's (`LOCAL_RANK`).
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// The engine.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Runs `f` on the ring with the description of this call.
    fn collective<R>(
        &self,
        op: &'static str,
        t: Option<&Tensor>,
        reduce: Option<ReduceOp>,
        root: Option<usize>,
        f: impl FnOnce(&mut Ring, &Call) -> Result<R>,
    ) -> Result<R> {
        self.collective_on(op, t, reduce, root, None, f)
    }

    /// [`collective`](Self::collective) through NCCL communicator `comm`.
    fn collective_on<R>(
        &self,
        op: &'static str,
        t: Option<&Tensor>,
        reduce: Option<ReduceOp>,
        root: Option<usize>,
        comm: Option<usize>,
        f: impl FnOnce(&mut Ring, &Call) -> Result<R>,
    ) -> Result<R> {
        let (dtype, device, shape) = match t {
            Some(t) => {
                let device = match t.device() {
                    Device::Cpu => "cpu",
                    Device::Cuda(_) => "cuda",
                    Device::Meta => {
                        return Err(Error::MetaNoData {
                            op,
                            hint: "collectives need values",
                        });
                    }
                };
                (t.dtype(), device, t.shape().to_vec())
            }
            None => (DType::U8, "cpu", vec![1]),
        };
        if reduce == Some(ReduceOp::Avg) && !dtype.is_float() {
            return Err(Error::dtype(
                op,
                dtype,
                "ReduceOp::Avg needs a floating-point tensor",
            ));
        }
        self.check_aborted(op)?;
        let mut guard = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let (ring, seq) = &mut *guard;
        *seq += 1;
        let call = Call {
            seq: *seq,
            op,
            reduce,
            root,
            dtype,
            device,
            shape,
            comm,
        };
        let out = f(ring, &call);
        if out.is_err() {
            self.check_aborted(op)?;
        }
        out
    }

    /// Breaks the group from any thread: a collective in flight on another thread
    /// fails, later ones fail at once, and the other ranks see this rank's
    /// connections close, so their collectives fail too instead of waiting.
    pub fn abort(&self, why: &str) {
        self.shared.abort(why);
        // every rank's watchdog learns it from the store (a rank waiting on a GPU
        // for NCCL has its calls aborted), the neighbours also from the ring
        let _ = self.store.report_abort(why);
        // the next rank learns why (best effort: a collective in flight on another
        // thread may be writing), then every neighbour sees the connections close
        if let Some(mut next) = self.sockets.first() {
            let _ = next.set_write_timeout(Some(Duration::from_millis(500)));
            let _ = std::io::Write::write_all(&mut next, &ring::poison_frame(why));
        }
        for s in &self.sockets {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Runs `job` on the group's communication thread after every job submitted
    /// before it. Work that runs collectives from there (DDP's bucket reductions,
    /// of every model on the group) reaches the ring in submission order, which is
    /// the same on every rank.
    pub(crate) fn submit(&self, job: CommJob) -> Result<()> {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.is_none() {
            let (tx, rx) = std::sync::mpsc::channel::<CommJob>();
            std::thread::Builder::new()
                .name("ember-comm".into())
                .spawn(move || {
                    for job in rx {
                        job();
                    }
                })
                .map_err(|e| Error::distributed("distributed", e.to_string()))?;
            *q = Some(tx);
        }
        q.as_ref()
            .expect("started above")
            .send(job)
            .map_err(|_| Error::distributed("distributed", "the communication thread has stopped"))
    }

    /// `true` when `t` goes through NCCL.
    fn uses_nccl(&self, t: &Tensor) -> bool {
        self.backend == Backend::Nccl && t.device().is_cuda()
    }

    /// Runs an NCCL call: the ranks first compare their calls over the ring (no
    /// data), then `f` queues the call on the communicator of `t`'s GPU.
    fn nccl<R>(
        &self,
        op: &'static str,
        t: &Tensor,
        reduce: Option<ReduceOp>,
        root: Option<usize>,
        f: impl FnOnce(&Communicator) -> Result<R>,
    ) -> Result<R> {
        let index = self.comm_index(t.device());
        let run = |ring: &mut Ring, call: &Call| -> Result<R> {
            ring.agree(call)?;
            let comm = self.communicator(t.device())?;
            let c = comm.lock().unwrap_or_else(|p| p.into_inner());
            f(&c)
        };
        self.collective_on(op, Some(t), reduce, root, Some(index), run)
            .inspect_err(|e| {
                // the other ranks may have queued their part on their GPUs: their
                // watchdogs abort it
                if !matches!(e, Error::MetaNoData { .. } | Error::UnsupportedDType { .. }) {
                    self.abort(&format!("rank {} failed in {op}: {e}", self.rank));
                }
            })
    }

    /// The index of the communicator of `device` among this rank's (the next one
    /// when there is none yet).
    fn comm_index(&self, device: Device) -> usize {
        let comms = self.shared.comms.lock().unwrap_or_else(|p| p.into_inner());
        comms
            .iter()
            .position(|(d, _)| *d == device)
            .unwrap_or(comms.len())
    }

    /// The communicator on `device`, made when first asked for: every rank asks at
    /// the same collective (the ranks have just agreed on it), rank 0 makes the id
    /// and shares it through the store.
    fn communicator(&self, device: Device) -> Result<Arc<Mutex<Communicator>>> {
        let mut comms = self.shared.comms.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, c)) = comms.iter().find(|(d, _)| *d == device) {
            return Ok(c.clone());
        }
        let n = comms.len();
        let key = format!("{}nccl/{n}", self.prefix);
        let id = if self.rank == 0 {
            let id = Communicator::unique_id(device)?;
            self.store.set(&key, &id)?;
            id
        } else {
            let id = self.store.get(&key, || "rank 0's NCCL id".into())?;
            id.try_into().map_err(|_| {
                Error::distributed("init_process_group", "rank 0 published a bad NCCL id")
            })?
        };
        // a simulated GPU serves NCCL's calls through a ring of its own
        let host: Arc<dyn HostCollectives> = if crate::backend::cuda::discover::is_simulated() {
            let r = Ring::connect(
                &self.store,
                &format!("{}nccl{n}", self.prefix),
                self.rank,
                self.world,
                self.timeout,
                self.spans_machines,
            )?;
            Arc::new(HostRing {
                ring: Mutex::new((r, 0)),
                rank: self.rank,
                world: self.world,
            })
        } else {
            Arc::new(HostRing::none(self.rank, self.world))
        };
        let c = Arc::new(Mutex::new(Communicator::new(
            device, id, self.world, self.rank, host,
        )?));
        comms.push((device, c.clone()));
        Ok(c)
    }

    fn check_aborted(&self, op: &'static str) -> Result<()> {
        match &*self
            .shared
            .aborted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
        {
            Some(why) => Err(Error::distributed(
                op,
                format!("the process group was aborted: {why}"),
            )),
            None => Ok(()),
        }
    }

    /// Combines `t` over the ranks in place (`dist.all_reduce(t, op)`).
    pub fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<()> {
        let name = "all_reduce";
        // refused before any rank sends: an expanded view cannot take the result
        t.check_writable(name)?;
        if self.uses_nccl(t) {
            return self.nccl(name, t, Some(op), None, |c| {
                in_place(t, c, CommKind::AllReduce(op))
            });
        }
        self.collective(name, Some(t), Some(op), None, |ring, call| {
            // a CPU tensor in place, others through a host copy
            if let Some(r) = t.with_host_data_mut(|d| ring.all_reduce(call, d, op)) {
                return r;
            }
            let mut data = t.host_data(name)?;
            ring.all_reduce(call, &mut data, op)?;
            write_back(t, data)
        })
    }

    /// Gives every rank rank `src`'s values of `t`, in place (`dist.broadcast`).
    pub fn broadcast(&self, t: &Tensor, src: usize) -> Result<()> {
        let name = "broadcast";
        self.check_rank(name, src)?;
        t.check_writable(name)?;
        if self.uses_nccl(t) {
            return self.nccl(name, t, None, Some(src), |c| {
                in_place(t, c, CommKind::Broadcast(src))
            });
        }
        self.collective(name, Some(t), None, Some(src), |ring, call| {
            if let Some(r) = t.with_host_data_mut(|d| ring.broadcast(call, d, src)) {
                return r;
            }
            let mut data = t.host_data(name)?;
            ring.broadcast(call, &mut data, src)?;
            if self.rank == src {
                return Ok(());
            }
            write_back(t, data)
        })
    }

    /// Every rank's `t`, in rank order, on `t`'s device (`dist.all_gather`).
    pub fn all_gather(&self, t: &Tensor) -> Result<Vec<Tensor>> {
        let name = "all_gather";
        if self.uses_nccl(t) {
            return self.nccl(name, t, None, None, |c| {
                let n = t.numel();
                let out = Tensor::empty([self.world * n], t.dtype(), &t.device())?;
                t.contiguous()?.comm_into(&out, c, CommKind::AllGather)?;
                (0..self.world)
                    .map(|r| out.narrow(0, (r * n) as i64, n)?.reshape(t.shape()))
                    .collect()
            });
        }
        self.collective(name, Some(t), None, None, |ring, call| {
            let mine = t.host_data(name)?;
            let n = mine.len();
            let mut all = CpuData::zeros(t.dtype(), n * self.world);
            all.write_at(self.rank * n, &mine);
            ring.all_gather(call, &mut all)?;
            (0..self.world)
                .map(|r| Tensor::from_host(all.slice(r * n, n), t.shape(), t.device()))
                .collect()
        })
    }

    /// Combines `t` over the ranks and returns this rank's part of the result: `t`'s
    /// first dimension, which must divide by the world size, is split into one block
    /// per rank (`dist.reduce_scatter_tensor`).
    pub fn reduce_scatter(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        let name = "reduce_scatter";
        let first = t.shape().first().copied().unwrap_or(0);
        if t.shape().is_empty() || first % self.world != 0 {
            return Err(Error::invalid(
                name,
                format!(
                    "the input's first dimension must divide by the world size {}: got shape {:?}",
                    self.world,
                    t.shape()
                ),
            ));
        }
        let mut shape = t.shape().to_vec();
        shape[0] /= self.world;
        if self.uses_nccl(t) {
            return self.nccl(name, t, Some(op), None, |c| {
                let out = Tensor::empty(shape.as_slice(), t.dtype(), &t.device())?;
                t.contiguous()?
                    .comm_into(&out, c, CommKind::ReduceScatter(op))?;
                Ok(out)
            });
        }
        self.collective(name, Some(t), Some(op), None, |ring, call| {
            let mut data = t.host_data(name)?;
            let m = data.len() / self.world;
            ring.reduce_scatter(call, &mut data, op)?;
            Tensor::from_host(data.slice(self.rank * m, m), &shape, t.device())
        })
    }

    /// Returns when every rank has called it (`dist.barrier`).
    pub fn barrier(&self) -> Result<()> {
        self.collective("barrier", None, None, None, |ring, call| ring.barrier(call))
    }

    /// Sums `values` over the ranks (metrics: host numbers, no tensor).
    pub fn all_reduce_f64(&self, values: &mut [f64], op: ReduceOp) -> Result<()> {
        let t = Tensor::new(&*values, &Device::Cpu)?;
        self.all_reduce(&t, op)?;
        values.copy_from_slice(&t.to_vec1::<f64>()?);
        Ok(())
    }

    fn check_rank(&self, op: &'static str, r: usize) -> Result<()> {
        if r >= self.world {
            return Err(Error::invalid(
                op,
                format!("rank {r} is out of range for world size {}", self.world),
            ));
        }
        Ok(())
    }
}

/// `kind` in place on `t` through `comm` (through a contiguous copy when `t` is
/// not contiguous).
fn in_place(t: &Tensor, comm: &Communicator, kind: CommKind) -> Result<()> {
    if t.is_contiguous() {
        return t.comm_in_place(comm, kind);
    }
    let c = t.contiguous()?;
    c.comm_in_place(comm, kind)?;
    crate::autograd::no_grad(|| t.copy_(&c))
}

/// The NCCL backend can run here: on ember's simulator, or where NCCL loads and
/// a GPU is present.
fn nccl_ready() -> Result<()> {
    let op = "init_process_group";
    if !crate::backend::cuda::discover::is_available() {
        return Err(Error::distributed(
            op,
            format!(
                "the NCCL backend needs a GPU, and there is none ({}): use Backend::Gloo",
                crate::backend::cuda::discover::unavailable_reason().unwrap_or_default()
            ),
        ));
    }
    if crate::backend::cuda::discover::is_simulated() {
        return Ok(());
    }
    let lib = crate::backend::cuda::nccl::library()
        .as_ref()
        .map_err(|why| Error::distributed(op, format!("the NCCL backend needs NCCL: {why}")))?;
    // ReduceOp::Avg (DDP's) is NCCL's since 2.10
    match lib.version()? {
        (major, minor, _) if (major, minor) >= (2, 10) => Ok(()),
        (major, minor, patch) => Err(Error::distributed(
            op,
            format!(
                "NCCL {major}.{minor}.{patch} is too old: the NCCL backend needs 2.10 or later"
            ),
        )),
    }
}

/// The host side of a simulated GPU's communicator: a ring of its own (or none on
/// a real GPU, where NCCL moves the data).
struct HostRing {
    ring: Mutex<(Ring, u64)>,
    rank: usize,
    world: usize,
}

impl HostRing {
    fn none(rank: usize, world: usize) -> HostRing {
        HostRing {
            ring: Mutex::new((Ring::unconnected(rank, world), 0)),
            rank,
            world,
        }
    }
}

impl HostCollectives for HostRing {
    fn world(&self) -> usize {
        self.world
    }

    fn run(&self, kind: CommKind, input: CpuData) -> Result<CpuData> {
        let mut g = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let (ring, seq) = &mut *g;
        *seq += 1;
        let (op, reduce, root) = match kind {
            CommKind::AllReduce(r) => ("all_reduce", Some(r), None),
            CommKind::Broadcast(root) => ("broadcast", None, Some(root)),
            CommKind::AllGather => ("all_gather", None, None),
            CommKind::ReduceScatter(r) => ("reduce_scatter", Some(r), None),
        };
        let call = Call {
            seq: *seq,
            op,
            reduce,
            root,
            dtype: input.dtype(),
            device: "cuda",
            shape: vec![input.len()],
            comm: None,
        };
        let mut data = input;
        match kind {
            CommKind::AllReduce(r) => ring.all_reduce(&call, &mut data, r)?,
            CommKind::Broadcast(root) => ring.broadcast(&call, &mut data, root)?,
            CommKind::AllGather => {
                let n = data.len();
                let mut all = CpuData::zeros(data.dtype(), n * self.world);
                all.write_at(self.rank * n, &data);
                ring.all_gather(&call, &mut all)?;
                return Ok(all);
            }
            CommKind::ReduceScatter(r) => {
                let m = data.len() / self.world;
                ring.reduce_scatter(&call, &mut data, r)?;
                return Ok(data.slice(self.rank * m, m));
            }
        }
        Ok(data)
    }
}

/// What the group shares with its watchdog.
#[derive(Default)]
struct Shared {
    /// Why the group was aborted (the first reason).
    aborted: Mutex<Option<String>>,
    /// The NCCL backend's communicators, one per GPU this rank has used.
    /// (Kept with their GPU, so that finding one does not wait for a call being
    /// queued on another.)
    comms: Mutex<Vec<(Device, Arc<Mutex<Communicator>>)>>,
}

impl Shared {
    /// Marks the group aborted and stops its NCCL calls in flight, so that no
    /// stream waits for a rank that is gone.
    fn abort(&self, why: &str) {
        {
            let mut a = self.aborted.lock().unwrap_or_else(|p| p.into_inner());
            if a.is_none() {
                *a = Some(why.to_string());
            }
        }
        for (_, c) in self.comms.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            c.lock().unwrap_or_else(|p| p.into_inner()).abort();
        }
    }
}

/// The NCCL backend's watchdog (PyTorch's NCCL watchdog role): a thread that asks
/// the store every 200 ms whether the group was aborted, and aborts this rank's
/// communicators when it was. A rank whose process exits is reported by the store
/// itself (its watch connection closes), and a lost store means rank 0 is gone:
/// so a rank waiting on its GPU for an NCCL call that a lost rank will never
/// join is released, instead of waiting forever (NCCL calls have no timeout).
fn watchdog(
    st: store::Store,
    rank: usize,
    shared: Arc<Shared>,
) -> Result<(std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>)> {
    use std::sync::mpsc::RecvTimeoutError;
    st.watch(rank)?;
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let handle = std::thread::Builder::new()
        .name("ember-watchdog".into())
        .spawn(move || {
            loop {
                match rx.recv_timeout(Duration::from_millis(200)) {
                    Err(RecvTimeoutError::Timeout) => {}
                    // the group is dropped: this rank leaves normally
                    _ => {
                        let _ = st.bye();
                        return;
                    }
                }
                let why = match st.aborted() {
                    Ok(None) => continue,
                    Ok(Some(why)) => why,
                    Err(_) => "lost the rendezvous store: rank 0's process has exited".to_string(),
                };
                shared.abort(&why);
                // stay registered until the group is dropped
                let _ = rx.recv();
                let _ = st.bye();
                return;
            }
        })
        .map_err(|e| Error::distributed("init_process_group", e.to_string()))?;
    Ok((tx, handle))
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if let Some((stop, handle)) = self.watchdog.take() {
            drop(stop);
            let _ = handle.join();
        }
    }
}

/// Writes `data` into `t` (outside autograd: collectives are not recorded).
fn write_back(t: &Tensor, data: CpuData) -> Result<()> {
    let src = Tensor::from_host(data, t.shape(), t.device())?;
    crate::autograd::no_grad(|| t.copy_(&src))
}

static DEFAULT: RwLock<Option<Arc<ProcessGroup>>> = RwLock::new(None);

/// Joins the default group from the environment `ember launch` sets
/// (`dist.init_process_group(backend)`). A second call without
/// [`destroy_process_group`] is an error.
pub fn init_process_group(backend: Backend) -> Result<()> {
    init_process_group_with(&Options::from_env(backend)?)
}

/// Joins the default group described by `options`.
pub fn init_process_group_with(options: &Options) -> Result<()> {
    if is_initialized() {
        return Err(Error::distributed(
            "init_process_group",
            "the default process group is already initialized: call destroy_process_group first",
        ));
    }
    let pg = Arc::new(ProcessGroup::new(options)?);
    *DEFAULT.write().unwrap_or_else(|p| p.into_inner()) = Some(pg);
    Ok(())
}

/// `true` once [`init_process_group`] has succeeded (and until it is destroyed).
pub fn is_initialized() -> bool {
    DEFAULT.read().unwrap_or_else(|p| p.into_inner()).is_some()
}

/// The default group; an error before [`init_process_group`].
pub fn group() -> Result<Arc<ProcessGroup>> {
    DEFAULT
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .ok_or_else(|| {
            Error::distributed(
                "distributed",
                "default process group has not been initialized, please make sure to call init_process_group",
            )
        })
}

/// Leaves the default group (its connections close), once the last handle to it
/// (a [`DistributedDataParallel`] holds one) is gone too. Rank 0's rendezvous store
/// stops with it, its port free again: every rank of the job can then
/// [`init_process_group`] again, on the same port.
pub fn destroy_process_group() {
    DEFAULT.write().unwrap_or_else(|p| p.into_inner()).take();
}

/// This process's rank in the default group.
pub fn get_rank() -> Result<usize> {
    Ok(group()?.rank())
}

/// The default group's size.
pub fn get_world_size() -> Result<usize> {
    Ok(group()?.world_size())
}

/// [`ProcessGroup::all_reduce`] on the default group.
pub fn all_reduce(t: &Tensor, op: ReduceOp) -> Result<()> {
    group()?.all_reduce(t, op)
}

/// [`ProcessGroup::broadcast`] on the default group.
pub fn broadcast(t: &Tensor, src: usize) -> Result<()> {
    group()?.broadcast(t, src)
}

/// [`ProcessGroup::all_gather`] on the default group.
pub fn all_gather(t: &Tensor) -> Result<Vec<Tensor>> {
    group()?.all_gather(t)
}

/// [`ProcessGroup::reduce_scatter`] on the default group.
pub fn reduce_scatter(t: &Tensor, op: ReduceOp) -> Result<Tensor> {
    group()?.reduce_scatter(t, op)
}

/// [`ProcessGroup::barrier`] on the default group.
pub fn barrier() -> Result<()> {
    group()?.barrier()
}
