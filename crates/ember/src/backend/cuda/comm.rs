//! Communicators between the GPUs of several processes (NCCL's), and collectives
//! on CUDA storages through them.

use super::runtime::Opaque;
use super::{dev, CudaDev, CudaStorage};
use crate::backend::op::collective::{Collective, CommKind, HostCollectives};
use crate::error::{Error, Result};
use crate::layout::Layout;
use std::sync::Arc;

/// One rank's communicator on one GPU.
pub(crate) struct CudaComm {
    dev: Arc<CudaDev>,
    comm: Option<Opaque>,
    world: usize,
}

impl CudaComm {
    /// A new communicator id, made on GPU `ordinal` by rank 0.
    pub(crate) fn unique_id(ordinal: usize) -> Result<[u8; 128]> {
        dev(ordinal)?.comm_unique_id()
    }

    /// Joins communicator `id` as `rank` of `world` on GPU `ordinal`.
    pub(crate) fn new(
        ordinal: usize,
        id: [u8; 128],
        world: usize,
        rank: usize,
        host: Arc<dyn HostCollectives>,
    ) -> Result<CudaComm> {
        let dev = dev(ordinal)?;
        let comm = dev.comm_init(id, world, rank, host)?;
        Ok(CudaComm {
            dev,
            comm: Some(comm),
            world,
        })
    }

    /// Frees the communicator, stopping its calls in flight (after a failure of
    /// another rank, so that nothing waits for it).
    pub(crate) fn abort(&mut self) {
        if let Some(c) = self.comm.take() {
            self.dev.comm_destroy(c, true);
        }
    }

    fn call(
        &self,
        kind: CommKind,
        src: (&CudaStorage, &Layout),
        dst: u64,
        count: usize,
    ) -> Result<()> {
        let (s, l) = src;
        if !Arc::ptr_eq(s.dev(), &self.dev) {
            return Err(Error::invalid(
                kind.name(),
                format!(
                    "the tensor is on cuda:{} and the communicator on cuda:{}",
                    s.dev().ordinal,
                    self.dev.ordinal
                ),
            ));
        }
        let Some(comm) = &self.comm else {
            return Err(Error::Cuda {
                op: kind.name(),
                msg: "the communicator was aborted after a failure".into(),
            });
        };
        // a call after one that failed would wait for ranks that have stopped
        self.dev.comm_check(comm)?;
        let size = s.dtype().size_in_bytes() as u64;
        let c = Collective {
            kind,
            src: s.ptr() + l.offset() as u64 * size,
            dst,
            count,
            dtype: s.dtype(),
        };
        // SAFETY: the layouts are contiguous (checked by the callers) and the
        // storages hold the elements `c.sizes` gives; both stay alive until the
        // stream has run the call, as the caching allocator keeps memory freed
        // by the host until the stream's earlier work is done
        unsafe { self.dev.collective(comm, &c) }
    }
}

impl Drop for CudaComm {
    fn drop(&mut self) {
        if let Some(c) = self.comm.take() {
            self.dev.comm_destroy(c, false);
        }
    }
}

impl CudaStorage {
    /// `kind` (all-reduce or broadcast) on the `n` contiguous elements of `l`, in
    /// place.
    pub(crate) fn collective_in_place(
        &mut self,
        l: &Layout,
        comm: &CudaComm,
        kind: CommKind,
    ) -> Result<()> {
        let n = l.shape().iter().product();
        let at = self.ptr() + l.offset() as u64 * self.dtype().size_in_bytes() as u64;
        comm.call(kind, (self, l), at, n)
    }

    /// `kind` (all-gather or reduce-scatter) from the contiguous elements of `l`
    /// into the contiguous `dst` (from offset 0).
    pub(crate) fn collective_into(
        &self,
        l: &Layout,
        dst: &mut CudaStorage,
        comm: &CudaComm,
        kind: CommKind,
    ) -> Result<()> {
        let n: usize = l.shape().iter().product();
        let count = match kind {
            CommKind::ReduceScatter(_) => n / comm.world,
            _ => n,
        };
        comm.call(kind, (self, l), dst.ptr(), count)
    }
}
