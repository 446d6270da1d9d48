//! The vocabulary of collectives between processes: what a distributed backend
//! computes, and the host side that a simulated GPU's NCCL calls go through.

use crate::dtype::CpuData;
use crate::{dtype::DType, error::Result};

/// How a collective combines the ranks' values (`torch.distributed.ReduceOp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// The sum.
    Sum,
    /// The mean over the ranks (floating-point tensors only).
    Avg,
    /// The product.
    Product,
    /// The largest value (NaN if any rank has NaN).
    Max,
    /// The smallest value (NaN if any rank has NaN).
    Min,
}

impl ReduceOp {
    pub(crate) const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Avg,
        ReduceOp::Product,
        ReduceOp::Max,
        ReduceOp::Min,
    ];

    /// PyTorch's name: `sum`, `avg`, `product`, `max`, `min`.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Avg => "avg",
            ReduceOp::Product => "product",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        }
    }
}

/// A collective, in NCCL's terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CommKind {
    /// `count` elements in, combined, `count` out.
    AllReduce(ReduceOp),
    /// The root's `count` elements to every rank.
    Broadcast(usize),
    /// `count` elements in, `world x count` out, in rank order.
    AllGather,
    /// `world x count` elements in, combined, this rank's `count` out.
    ReduceScatter(ReduceOp),
}

impl CommKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            CommKind::AllReduce(_) => "ncclAllReduce",
            CommKind::Broadcast(_) => "ncclBroadcast",
            CommKind::AllGather => "ncclAllGather",
            CommKind::ReduceScatter(_) => "ncclReduceScatter",
        }
    }
}

/// One collective on device memory: `count` as NCCL counts it (see [`CommKind`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Collective {
    pub(crate) kind: CommKind,
    pub(crate) src: u64,
    pub(crate) dst: u64,
    pub(crate) count: usize,
    pub(crate) dtype: DType,
}

impl Collective {
    /// The elements read and written, in the world of `world` ranks.
    pub(crate) fn sizes(&self, world: usize) -> (usize, usize) {
        match self.kind {
            CommKind::AllReduce(_) | CommKind::Broadcast(_) => (self.count, self.count),
            CommKind::AllGather => (self.count, world * self.count),
            CommKind::ReduceScatter(_) => (world * self.count, self.count),
        }
    }
}

/// The host collectives a simulated GPU's communicator runs its calls through
/// (the distributed layer's CPU backend, on connections of the communicator's
/// own): `input` is what the call reads, the result what it writes.
pub(crate) trait HostCollectives: Send + Sync {
    fn run(&self, kind: CommKind, input: CpuData) -> Result<CpuData>;
    /// The number of ranks.
    fn world(&self) -> usize;
}
