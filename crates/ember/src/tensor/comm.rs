//! Collectives of the distributed NCCL backend on tensors: the storage's, queued on
//! the current stream like any op (no autograd).

use crate::backend::op::collective::CommKind;
use crate::backend::storage::Communicator;
use crate::{
    error::{Error, Result},
    tensor::Tensor,
};

impl Tensor {
    /// Runs `f` on this CPU tensor's values in place, when they are the whole of
    /// a contiguous storage (counted as a write); `None` otherwise (another device,
    /// a view), for the caller to copy instead.
    pub(crate) fn with_host_data_mut<R>(
        &self,
        f: impl FnOnce(&mut crate::dtype::CpuData) -> R,
    ) -> Option<R> {
        let whole = self.is_contiguous() && self.layout().offset() == 0;
        if !whole || !self.device().is_cpu() {
            return None;
        }
        let mut s = self.write();
        let data = s.host_data_mut()?;
        if data.len() != self.numel() {
            return None;
        }
        Some(f(data))
    }

    /// `kind` (all-reduce, broadcast) over this contiguous tensor, in place.
    pub(crate) fn comm_in_place(&self, comm: &Communicator, kind: CommKind) -> Result<()> {
        if !self.is_contiguous() {
            return Err(Error::invalid(kind.name(), "the tensor must be contiguous"));
        }
        let l = self.layout().clone();
        self.write().collective_in_place(&l, comm, kind)
    }

    /// `kind` (all-gather, reduce-scatter) from this contiguous tensor into `out`,
    /// a fresh contiguous tensor of the result's size.
    pub(crate) fn comm_into(
        &self,
        out: &Tensor,
        comm: &Communicator,
        kind: CommKind,
    ) -> Result<()> {
        if !self.is_contiguous() || !out.is_contiguous() || out.layout().offset() != 0 {
            return Err(Error::invalid(
                kind.name(),
                "the tensors must be contiguous",
            ));
        }
        let from = self.read();
        from.collective_into(self.layout(), &mut out.write(), comm, kind)
    }
}
