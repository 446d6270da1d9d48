//! Constants of the fused optimizer steps.

/// Adam's constants for one step.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AdamStep {
    pub lr: f64,
    pub b1: f64,
    pub b2: f64,
    pub eps: f64,
    /// Bias corrections `1 - b1^t`, `1 - b2^t`.
    pub bc1: f64,
    pub bc2: f64,
    pub weight_decay: f64,
    pub decoupled: bool,
}

/// SGD's constants for one step (`torch.optim.SGD`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SgdStep {
    pub lr: f64,
    pub momentum: f64,
    pub dampening: f64,
    pub weight_decay: f64,
    pub nesterov: bool,
}

/// Tensors per multi-tensor launch (`FOREACH_LIST` in kernels/common.cuh).
pub(crate) const FOREACH_LIST: usize = 48;
/// Elements per chunk of a multi-tensor launch (`FOREACH_CHUNK` there).
pub(crate) const FOREACH_CHUNK: usize = 65536;

/// The chunks a multi-tensor launch cuts tensors of `lengths` into, per launch of
/// up to [`FOREACH_LIST`] tensors (the clipping kernels' partial sums have one
/// value per chunk).
pub(crate) fn foreach_chunks(lengths: &[usize]) -> Vec<usize> {
    lengths
        .chunks(FOREACH_LIST)
        .map(|g| g.iter().map(|n| n.div_ceil(FOREACH_CHUNK)).sum())
        .collect()
}
