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

/// Tensors per launch of the multi-tensor clipping kernels (`NORM_LIST` in
/// kernels/reduce.cu).
pub(crate) const NORM_LIST: usize = 48;
/// Elements per chunk of those kernels (`NORM_CHUNK` in kernels/reduce.cu).
pub(crate) const NORM_CHUNK: usize = 65536;

/// The chunks the clipping kernels cut tensors of `lengths` into, per launch of
/// up to [`NORM_LIST`] tensors: the length of each launch's partial sums.
pub(crate) fn norm_chunks(lengths: &[usize]) -> Vec<usize> {
    lengths
        .chunks(NORM_LIST)
        .map(|g| g.iter().map(|n| n.div_ceil(NORM_CHUNK)).sum())
        .collect()
}
