//! Loss functions, as in `torch.nn.functional`.

use crate::{DType, Error, Result, Tensor};

/// How per-sample losses are combined.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Reduction {
    #[default]
    Mean,
    Sum,
    /// Per-sample losses.
    None,
}

fn reduce(l: Tensor, r: Reduction) -> Result<Tensor> {
    match r {
        Reduction::Mean => l.mean_all(),
        Reduction::Sum => l.sum_all(),
        Reduction::None => Ok(l),
    }
}

/// The targets `[N]` as validated `[N, 1]` indices into the classes of `[N, C]`.
fn check_targets(op: &'static str, logits: &Tensor, target: &Tensor) -> Result<Tensor> {
    if logits.rank() != 2 {
        return Err(Error::invalid(
            op,
            format!("expected input of shape [N, C], got {:?}", logits.shape()),
        ));
    }
    if target.dtype() != DType::I64 {
        return Err(Error::dtype(
            op,
            target.dtype(),
            "targets must be int64 class indices (use .to_dtype(DType::I64))",
        ));
    }
    if target.shape() != [logits.shape()[0]] {
        return Err(Error::shape(
            op,
            logits.shape(),
            target.shape(),
            "expected targets of shape [N]",
        ));
    }
    // each class in [0, C), checked once (a meta tensor has no values to check):
    // the picked column of each row
    Tensor::index_values(op, target, 1, logits.shape()[1], false)?.unsqueeze(1)
}

/// Negative log-likelihood of log-probabilities `[N, C]` at int64 targets `[N]`.
pub fn nll_loss(log_probs: &Tensor, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
    let idx = check_targets("nll_loss", log_probs, target)?;
    let picked = log_probs.gather_valid(1, idx)?.squeeze(1)?;
    reduce(picked.neg()?, reduction)
}

/// Cross-entropy of logits `[N, C]` against int64 class indices `[N]`, mean over the
/// batch (`F.cross_entropy`).
pub fn cross_entropy(logits: &Tensor, target: &Tensor) -> Result<Tensor> {
    cross_entropy_with(logits, target, Reduction::Mean, 0.0)
}

/// Cross-entropy with a reduction and label smoothing `ε`: the target distribution
/// puts `1 - ε` on the class and spreads `ε` evenly over all classes.
pub fn cross_entropy_with(
    logits: &Tensor,
    target: &Tensor,
    reduction: Reduction,
    label_smoothing: f64,
) -> Result<Tensor> {
    if !(0.0..=1.0).contains(&label_smoothing) {
        return Err(Error::invalid(
            "cross_entropy",
            format!("label_smoothing must be in [0, 1], got {label_smoothing}"),
        ));
    }
    let idx = check_targets("cross_entropy", logits, target)?;
    let logp = logits.log_softmax(-1)?;
    let nll = logp.gather_valid(1, idx)?.squeeze(1)?.neg()?;
    let per_sample = if label_smoothing > 0.0 {
        let smooth = logp.mean(-1, false)?.neg()?;
        nll.mul(1.0 - label_smoothing)?
            .add(&smooth.mul(label_smoothing)?)?
    } else {
        nll
    };
    reduce(per_sample, reduction)
}

/// Mean squared error (`F.mse_loss`); shapes must match.
pub fn mse_loss(input: &Tensor, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
    if input.shape() != target.shape() {
        return Err(Error::shape(
            "mse_loss",
            input.shape(),
            target.shape(),
            "input and target must have the same shape",
        ));
    }
    reduce(input.sub(target)?.square()?, reduction)
}

/// Binary cross-entropy on logits (`F.binary_cross_entropy_with_logits`),
/// computed stably as PyTorch computes it: `(1 - y)·x - log_sigmoid(x)` with
/// `log_sigmoid(x) = min(x, 0) - log(1 + exp(-|x|))`. At infinite logits the
/// values are PyTorch's: `+inf` with target 0 (or 0.5) is `inf`; `+inf` with
/// target 1, and `-inf` with any target, are NaN (`0·inf`, `-inf + inf`). The
/// gradient `sigmoid(x) - y` is finite everywhere.
pub fn bce_with_logits(logits: &Tensor, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
    if logits.shape() != target.shape() {
        return Err(Error::shape(
            "bce_with_logits",
            logits.shape(),
            target.shape(),
            "logits and targets must have the same shape",
        ));
    }
    if !target.dtype().is_float() {
        return Err(Error::dtype(
            "bce_with_logits",
            target.dtype(),
            "targets must be floating point probabilities",
        ));
    }
    let l = crate::no_grad(|| {
        let log_sigmoid = logits
            .clamp_max(0.0)?
            .sub(&logits.abs()?.neg()?.exp()?.add(1.0)?.log()?)?;
        target.neg()?.add(1.0)?.mul(logits)?.sub(&log_sigmoid)
    })?;
    // its own rule: d/dx = sigmoid(x) - y everywhere (the composite has a kink at 0)
    let l = Tensor::record(l, "bce_with_logits", &[logits, target], |_| {
        let (x, y) = (logits.save(), target.save());
        move |g: &Tensor| {
            let (x, y) = (x.get()?, y.get()?);
            Ok(vec![
                Some(g.mul(&x.sigmoid()?.sub(y)?)?),
                Some(g.mul(&x.neg()?)?),
            ])
        }
    });
    reduce(l, reduction)
}
