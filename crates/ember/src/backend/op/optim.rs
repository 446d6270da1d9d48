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
