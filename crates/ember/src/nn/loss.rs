//! Loss functions, as in `torch.nn.functional`.

use crate::{
    dtype::DType,
    error::{Error, Result},
    tensor::Tensor,
};

/// How per-sample losses are combined.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Reduction {
    #[default]
    Mean,
    Sum,
    /// Per-sample losses.
    None,
}

pub(super) fn reduce(l: Tensor, r: Reduction) -> Result<Tensor> {
    match r {
        Reduction::Mean => l.mean_all(),
        Reduction::Sum => l.sum_all(),
        Reduction::None => Ok(l),
    }
}

/// Negative log-likelihood of log-probabilities `[N, C]` at int64 (or uint8)
/// targets `[N]` (`F.nll_loss`; a target of -100 is ignored, as there). See [`nll_loss_opts`]
/// for the other layouts and arguments.
pub fn nll_loss(log_probs: &Tensor, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
    let opts = LossOptions {
        reduction,
        ..Default::default()
    };
    nll_loss_opts(log_probs, target, opts)
}

/// Cross-entropy of logits `[N, C]` against int64 (or uint8) class indices `[N]`,
/// mean over the batch (`F.cross_entropy`; a target of -100 is ignored, as
/// there).
pub fn cross_entropy(logits: &Tensor, target: &Tensor) -> Result<Tensor> {
    cross_entropy_opts(logits, target, LossOptions::default())
}

/// Cross-entropy with a reduction and label smoothing `ε`: the target distribution
/// puts `1 - ε` on the class and spreads `ε` evenly over all classes.
pub fn cross_entropy_with(
    logits: &Tensor,
    target: &Tensor,
    reduction: Reduction,
    label_smoothing: f64,
) -> Result<Tensor> {
    let opts = LossOptions {
        reduction,
        label_smoothing,
        ..Default::default()
    };
    cross_entropy_opts(logits, target, opts)
}

/// The keyword arguments of [`cross_entropy_opts`] and [`nll_loss_opts`], with
/// PyTorch's defaults.
#[derive(Clone, Copy, Debug)]
pub struct LossOptions<'a> {
    /// A weight per class `[C]`; a weighted mean divides by the targets' weights.
    pub weight: Option<&'a Tensor>,
    /// Targets equal to it add nothing and do not count in the mean (default
    /// -100).
    pub ignore_index: i64,
    pub reduction: Reduction,
    /// Cross-entropy only: `1 - ε` on the target class, `ε` spread over all.
    pub label_smoothing: f64,
}

impl Default for LossOptions<'_> {
    fn default() -> Self {
        LossOptions {
            weight: None,
            ignore_index: -100,
            reduction: Reduction::Mean,
            label_smoothing: 0.0,
        }
    }
}

/// `F.cross_entropy` with all its arguments: `input` is `[N, C]`, `[N, C, d1,
/// ...]` or unbatched `[C]`; `target` holds int64 class indices of the input's
/// shape without the class dim (uint8 too for `[N, C]` and `[C]` inputs, as in
/// PyTorch), or class probabilities of the input's shape.
pub fn cross_entropy_opts(input: &Tensor, target: &Tensor, opts: LossOptions) -> Result<Tensor> {
    let _record = crate::profiler::function("cross_entropy");
    // (class indices only: with probabilities the weight scales the terms,
    // and PyTorch gives it a gradient)
    if input.shape() != target.shape() {
        not_differentiable("cross_entropy", "nll_loss_forward", "weight", opts.weight)?;
    }
    let ls = opts.label_smoothing;
    if !(0.0..=1.0).contains(&ls) {
        return Err(Error::invalid(
            "cross_entropy",
            format!("label_smoothing must be in [0, 1], got {ls}"),
        ));
    }
    // (probabilities: the input's shape)
    if input.shape() == target.shape() && opts.ignore_index >= 0 {
        return Err(Error::invalid(
            "cross_entropy",
            "ignore_index is not supported for floating point target",
        ));
    }
    if let Some(t) = byte_targets(input, target)? {
        return cross_entropy_opts(input, &t, opts);
    }
    if fused_applies(input, target, &opts) {
        return fused_cross_entropy(input, target, opts);
    }
    if let Some(c) = crate::tensor::autocast::to_f32(&[input, target])? {
        return cross_entropy_opts(&c[0], &c[1], opts);
    }
    let (x, shape) = classes_last("cross_entropy", input)?;
    let logp = x.log_softmax(-1)?;
    if input.shape() == target.shape() {
        return soft_cross_entropy(&logp, target, &shape, opts);
    }
    weighted_nll("cross_entropy", &logp, input, target, &shape, opts)
}

/// Whether [`fused_cross_entropy`] computes this cross-entropy: class-index
/// targets without class weights, on float32 or float64 logits, on half logits
/// that autocast would run in float32, or on half logits outside autocast
/// without label smoothing (rounded as PyTorch's half-precision `log_softmax`
/// and `nll_loss` round: [`half_steps`]); half logits with smoothing take the
/// composite path, which rounds as PyTorch's half kernels do.
fn fused_applies(input: &Tensor, target: &Tensor, opts: &LossOptions) -> bool {
    let autocast_f32 = crate::tensor::autocast::would_f32(&[input]);
    opts.weight.is_none()
        && input.rank() >= 1
        && input.shape() != target.shape()
        && target.dtype() == DType::I64
        && (matches!(input.dtype(), DType::F32 | DType::F64)
            || autocast_f32
            || (matches!(input.dtype(), DType::F16 | DType::BF16) && opts.label_smoothing == 0.0))
}

/// Whether the fused cross-entropy of `input` rounds its log-probabilities to
/// the input's dtype, as the composite `log_softmax` and `nll_loss` would in
/// that dtype: half logits outside autocast (under it they are read in float32
/// as PyTorch's float32 cast would make them).
fn half_steps(input: &Tensor) -> bool {
    matches!(input.dtype(), DType::F16 | DType::BF16)
        && !crate::tensor::autocast::would_f32(&[input])
}

/// Cross-entropy against class indices in one pass over the logits each way
/// (`Tensor::cross_entropy_rows`), with PyTorch's values: under autocast the
/// half-precision logits are read in float32 as PyTorch's float32 cast would
/// make them, the loss is float32, and their gradient is rounded once to their
/// dtype; outside autocast each row's log-probabilities are rounded to the
/// logits' dtype where PyTorch's half `log_softmax` leaves them, and the loss is
/// in that dtype ([`half_steps`]). Nothing of the logits' size is kept but the
/// logits.
fn fused_cross_entropy(input: &Tensor, target: &Tensor, opts: LossOptions) -> Result<Tensor> {
    const OP: &str = "cross_entropy";
    let (x, shape) = classes_last(OP, input)?;
    check_class_targets(OP, input, target, &shape)?;
    let (m, c) = (x.shape()[0], x.shape()[1]);
    let t = target.reshape([m])?;
    let valid = t.ne(opts.ignore_index)?;
    // checked where the targets are, as the composite path checks them; with no
    // classes only ignored rows are valid (PyTorch's loss is then 0, or NaN for
    // a mean; meta has no values to check)
    if c > 0 {
        Tensor::index_values(OP, &valid.where_(&t, 0i64)?, 1, c, false)?;
    } else {
        refuse_any_target(OP, &t, &valid)?;
    }
    let steps = half_steps(input);
    let ce = crate::backend::op::CeOpts {
        ignore: opts.ignore_index,
        smoothing: opts.label_smoothing,
        half_steps: steps,
    };
    let rows = x.cross_entropy_rows(&t, ce)?;
    // with half_steps each row's loss is a value of the logits' dtype, exact in
    // float32, and its gradient is rounded to the dtype by the round trip through
    // it on the way back (PyTorch divides by the count rounded to the dtype
    // there, which moves it by at most a rounding)
    let rows = if steps {
        rows.to_dtype(input.dtype())?
    } else {
        rows
    };
    reduce_losses(rows, &valid, opts.reduction, &shape, input.rank() <= 2)
}

/// The reduction of per-element losses `l`, in their dtype: a mean divides by the
/// sum of `denominator` (each element's weight: 1, or its class's weight, and 0
/// where ignored; over none, 0 / 0 is NaN as in PyTorch). With `half_in_f32`
/// half losses are summed in float32 (the denominator too), divided there and
/// rounded once, as PyTorch's CUDA nll_loss sums over `[N, C]` or `[C]`;
/// without it in the dtype, as its nll_loss2d sums over `[N, C, d1, ...]`
/// (adding its blocks' sums into a half total) and as its CPU kernels sum every
/// layout: a float16 mean whose sum passes 65504 is inf there.
fn reduce_losses(
    l: Tensor,
    denominator: &Tensor,
    reduction: Reduction,
    shape: &[usize],
    half_in_f32: bool,
) -> Result<Tensor> {
    let dt = l.dtype();
    let sum_dt = match dt {
        DType::F16 | DType::BF16 if half_in_f32 => DType::F32,
        _ => dt,
    };
    match reduction {
        Reduction::Mean => l
            .to_dtype(sum_dt)?
            .sum_all()?
            .div(&denominator.to_dtype(sum_dt)?.sum_all()?)?
            .to_dtype(dt),
        Reduction::Sum => l.to_dtype(sum_dt)?.sum_all()?.to_dtype(dt),
        Reduction::None => l.reshape(shape),
    }
}

/// Checks class-index targets: the shape of the per-element losses, int64.
fn check_class_targets(
    op: &'static str,
    input: &Tensor,
    target: &Tensor,
    shape: &[usize],
) -> Result<()> {
    if target.shape() != shape {
        let msg = if input.rank() == 2 && target.rank() == 1 {
            format!(
                "Expected input batch_size ({}) to match target batch_size ({}).",
                input.shape()[0],
                target.shape()[0]
            )
        } else {
            format!("Expected target size {shape:?}, got {:?}", target.shape())
        };
        return Err(Error::shape(op, input.shape(), target.shape(), msg));
    }
    if target.dtype() != DType::I64 {
        if input.rank() > 2 && target.dtype() == DType::U8 {
            // PyTorch's nll_loss2d takes int64 only
            return Err(Error::dtype(
                op,
                DType::U8,
                "expected scalar type Long but found Byte: uint8 class indices are taken \
                 for [N, C] and [C] inputs only; convert the target with to_dtype(DType::I64)",
            ));
        }
        return Err(Error::dtype(
            op,
            target.dtype(),
            format!(
                "expected target dtype to be Long or Byte, but got {}",
                target.dtype()
            ),
        ));
    }
    Ok(())
}

/// PyTorch's refusal of a weight that requires grad while autograd records:
/// its losses have no derivative for it (a gradient would be silently made up
/// on one path and missing on another).
pub(super) fn not_differentiable(
    op: &'static str,
    function: &str,
    arg: &str,
    t: Option<&Tensor>,
) -> Result<()> {
    if t.is_some_and(|t| crate::autograd::needs_grad(&[t])) {
        return Err(Error::invalid(
            op,
            format!(
                "The function '{function}' is not differentiable with respect to argument \
                 '{arg}'. This input cannot have requires_grad True."
            ),
        ));
    }
    Ok(())
}

/// uint8 class indices as int64, for an input of `[N, C]` or `[C]`, where
/// PyTorch takes them beside int64 (labels read from MNIST's IDX files are
/// uint8); with more dims PyTorch refuses them, and so does the check.
fn byte_targets(input: &Tensor, target: &Tensor) -> Result<Option<Tensor>> {
    if target.dtype() == DType::U8 && input.rank() <= 2 && input.shape() != target.shape() {
        Ok(Some(target.to_dtype(DType::I64)?))
    } else {
        Ok(None)
    }
}

/// `F.nll_loss` with all its arguments, on log-probabilities of the layouts of
/// [`cross_entropy_opts`] (class indices only; `label_smoothing` must be 0).
pub fn nll_loss_opts(log_probs: &Tensor, target: &Tensor, opts: LossOptions) -> Result<Tensor> {
    let _record = crate::profiler::function("nll_loss");
    not_differentiable("nll_loss", "nll_loss_forward", "weight", opts.weight)?;
    if let Some(t) = byte_targets(log_probs, target)? {
        return nll_loss_opts(log_probs, &t, opts);
    }
    if let Some(c) = crate::tensor::autocast::to_f32(&[log_probs, target])? {
        return nll_loss_opts(&c[0], &c[1], opts);
    }
    if opts.label_smoothing != 0.0 {
        return Err(Error::invalid(
            "nll_loss",
            "nll_loss has no label smoothing",
        ));
    }
    let (x, shape) = classes_last("nll_loss", log_probs)?;
    weighted_nll("nll_loss", &x, log_probs, target, &shape, opts)
}

/// `[M, C]` rows with the classes last, and the shape of the per-element losses.
fn classes_last(op: &'static str, input: &Tensor) -> Result<(Tensor, Vec<usize>)> {
    match input.rank() {
        0 => Err(Error::invalid(
            op,
            "input must have at least one dim (the classes)",
        )),
        1 => Ok((input.unsqueeze(0)?, vec![])),
        r => {
            let c = input.shape()[1];
            let mut perm: Vec<i64> = vec![0];
            perm.extend((2..r as i64).collect::<Vec<_>>());
            perm.push(1);
            let mut shape = vec![input.shape()[0]];
            shape.extend_from_slice(&input.shape()[2..]);
            let m: usize = shape.iter().product();
            Ok((input.permute(perm)?.reshape([m, c])?, shape))
        }
    }
}

/// Checks a per-class weight of `c` classes.
fn check_weight(op: &'static str, w: Option<&Tensor>, c: usize) -> Result<()> {
    match w {
        Some(w) if w.shape() != [c] => Err(Error::shape(
            op,
            w.shape(),
            &[c],
            format!(
                "weight tensor should be defined either for all {c} classes or no classes but got weight tensor of shape: {:?}",
                w.shape()
            ),
        )),
        _ => Ok(()),
    }
}

/// With no classes, every target `t` that `valid` keeps is out of bounds: the
/// first is named (PyTorch's IndexError). Read where the targets are; a meta
/// target has no values to check.
fn refuse_any_target(op: &'static str, t: &Tensor, valid: &Tensor) -> Result<()> {
    if t.numel() > 0 && t.holds_values() && valid.any(0, false)?.item::<bool>()? {
        Tensor::index_values(op, &t.masked_select(valid)?, 1, 0, false)?;
    }
    Ok(())
}

/// The (weighted, smoothed) negative log-likelihood of rows `logp [M, C]` at
/// class indices.
fn weighted_nll(
    op: &'static str,
    logp: &Tensor,
    input: &Tensor,
    target: &Tensor,
    shape: &[usize],
    opts: LossOptions,
) -> Result<Tensor> {
    let c = logp.shape()[1];
    check_weight(op, opts.weight, c)?;
    check_class_targets(op, input, target, shape)?;
    let m = logp.shape()[0];
    let t = target.reshape([m])?;
    let valid = t.ne(opts.ignore_index)?;
    if c == 0 {
        // no classes: a target not ignored is refused; with every row ignored
        // (or none) the loss is 0 per row, 0 summed, NaN as a mean (0 / 0), as
        // in PyTorch, and its gradient zeros
        refuse_any_target(op, &t, &valid)?;
        let zeros = logp.sum(-1, false)?;
        let weights = valid.to_dtype(logp.dtype())?;
        return reduce_losses(zeros, &weights, opts.reduction, shape, input.rank() <= 2);
    }
    // checked where the targets are: at once on the CPU, on a GPU without waiting
    // for it (a bad target is reported at the next synchronisation)
    let safe = Tensor::index_values(op, &valid.where_(&t, 0i64)?, 1, c, false)?;
    let idx = safe.unsqueeze(1)?;
    let valid_f = valid.to_dtype(logp.dtype())?;
    // the weight of each row's target, and the same 0 where ignored
    let w_target = match opts.weight {
        Some(w) => Some(
            w.to_dtype(logp.dtype())?
                .index_select_valid(0, safe.clone())?,
        ),
        None => None,
    };
    let wt = match &w_target {
        Some(w) => w.mul(&valid_f)?,
        None => valid_f,
    };
    // ignored rows are filled with 0 rather than multiplied by it: a mean over no
    // target (0 / 0, NaN as in PyTorch) then sends them a zero gradient, not
    // 0 · inf
    let ignored = valid.logical_not()?;
    let picked = logp.gather_valid(1, idx)?.squeeze(1)?.neg()?;
    let nll = match &w_target {
        Some(w) => picked.mul(w)?,
        None => picked,
    }
    .masked_fill(&ignored, 0.0)?;
    // the products rounded to the dtype, as PyTorch's nll_loss rounds them
    let ls = opts.label_smoothing;
    let loss = reduce_losses(nll, &wt, opts.reduction, shape, input.rank() <= 2)?;
    if ls == 0.0 {
        return Ok(loss);
    }
    let per_class = match opts.weight {
        Some(w) => logp.mul(&w.to_dtype(logp.dtype())?)?,
        None => logp.clone(),
    };
    let smooth = per_class
        .sum(-1, false)?
        .neg()?
        .masked_fill(&ignored, 0.0)?;
    // summed in the dtype, as PyTorch's composite sums it
    let smooth = reduce_losses(smooth, &wt, opts.reduction, shape, false)?;
    loss.mul(1.0 - ls)?.add(&smooth.mul(ls / c as f64)?)
}

/// Cross-entropy against class probabilities `target` (the input's shape).
fn soft_cross_entropy(
    logp: &Tensor,
    target: &Tensor,
    shape: &[usize],
    opts: LossOptions,
) -> Result<Tensor> {
    const OP: &str = "cross_entropy";
    let c = logp.shape()[1];
    check_weight(OP, opts.weight, c)?;
    if !target.dtype().is_float() {
        return Err(Error::dtype(
            OP,
            target.dtype(),
            "class-probability targets must be floating point",
        ));
    }
    let (t, _) = classes_last(OP, target)?;
    let ls = opts.label_smoothing;
    let t = if ls > 0.0 {
        t.mul(1.0 - ls)?.add(ls / c as f64)?
    } else {
        t
    };
    let per_class = logp.mul(&t)?;
    let per_class = match opts.weight {
        Some(w) => per_class.mul(w)?,
        None => per_class,
    };
    let l = per_class.sum(-1, false)?.neg()?;
    match opts.reduction {
        Reduction::Mean => l.mean_all(),
        Reduction::Sum => l.sum_all(),
        Reduction::None => l.reshape(shape),
    }
}

/// Mean squared error (`F.mse_loss`); shapes must match. PyTorch broadcasts
/// input and target of different shapes with a warning that the result is
/// likely wrong (a `[N, 1]` prediction against a `[N]` target gives `N·N`
/// squared differences); ember refuses them instead, so that mistake is an
/// error and not a silently wrong loss.
pub fn mse_loss(input: &Tensor, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
    let _record = crate::profiler::function("mse_loss");
    if let Some(c) = crate::tensor::autocast::to_f32(&[input, target])? {
        return mse_loss(&c[0], &c[1], reduction);
    }
    same_shape("mse_loss", input, target)?;
    reduce(input.sub(target)?.square()?, reduction)
}

/// Refuses an input and a target of different shapes (the pointwise losses):
/// PyTorch broadcasts them with a warning that the result is likely wrong.
pub(super) fn same_shape(op: &'static str, input: &Tensor, target: &Tensor) -> Result<()> {
    if input.shape() != target.shape() {
        return Err(Error::shape(
            op,
            input.shape(),
            target.shape(),
            "input and target must have the same shape",
        ));
    }
    Ok(())
}

/// Refuses a weight that does not broadcast to `shape` without growing it
/// (PyTorch applies the weights in place, and says so).
pub(super) fn weight_broadcasts(op: &'static str, w: &Tensor, shape: &[usize]) -> Result<()> {
    let b = crate::layout::broadcast_shapes(op, w.shape(), shape)?;
    if b[..] != *shape {
        return Err(Error::shape(
            op,
            shape,
            &b[..],
            format!("output with shape {shape:?} doesn't match the broadcast shape {b:?}"),
        ));
    }
    Ok(())
}

/// Binary cross-entropy on logits (`F.binary_cross_entropy_with_logits`),
/// computed stably as PyTorch computes it: `(1 - y)·x - log_sigmoid(x)` with
/// `log_sigmoid(x) = min(x, 0) - log(1 + exp(-|x|))`. At infinite logits the
/// values are PyTorch's: `+inf` with target 0 (or 0.5) is `inf`; `+inf` with
/// target 1, and `-inf` with any target, are NaN (`0·inf`, `-inf + inf`). The
/// gradient `sigmoid(x) - y` is finite everywhere.
pub fn bce_with_logits(logits: &Tensor, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
    if let Some(c) = crate::tensor::autocast::to_f32(&[logits, target])? {
        return bce_with_logits(&c[0], &c[1], reduction);
    }
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
    let l = crate::autograd::no_grad(|| {
        let log_sigmoid = logits
            .clamp_max(0.0)?
            .sub(&logits.abs()?.neg()?.exp()?.add(1.0)?.log()?)?;
        target.neg()?.add(1.0)?.mul(logits)?.sub(&log_sigmoid)
    })?;
    // its own rule: d/dx = sigmoid(x) - y everywhere (the composite has a kink at 0)
    let l = Tensor::record_twice(l, "bce_with_logits", &[logits, target], |_| {
        let (x, y) = (logits.save(), target.save());
        move |g: &Tensor| {
            let (x, y) = (&x.value()?, &y.value()?);
            Ok(vec![
                Some(g.mul(&x.sigmoid()?.sub(y)?)?),
                Some(g.mul(&x.neg()?)?),
            ])
        }
    });
    reduce(l, reduction)
}

/// `F.binary_cross_entropy_with_logits` with its `weight` (rescales each
/// element's loss; broadcasts to the input) and `pos_weight` (weighs the positive
/// term, one value per class of the last dim; broadcasts too):
/// `w · [(1 - y)·x + (1 + (p - 1)·y)·softplus(-x)]`, with `softplus(-x)` computed
/// as `log(1 + e^-|x|) + max(-x, 0)`, as PyTorch does.
pub fn bce_with_logits_opts(
    logits: &Tensor,
    target: &Tensor,
    weight: Option<&Tensor>,
    pos_weight: Option<&Tensor>,
    reduction: Reduction,
) -> Result<Tensor> {
    let _record = crate::profiler::function("binary_cross_entropy_with_logits");
    const OP: &str = "bce_with_logits";
    not_differentiable(OP, "binary_cross_entropy_with_logits", "weight", weight)?;
    not_differentiable(
        OP,
        "binary_cross_entropy_with_logits",
        "pos_weight",
        pos_weight,
    )?;
    let mut ts = vec![logits, target];
    ts.extend(weight);
    ts.extend(pos_weight);
    if let Some(c) = crate::tensor::autocast::to_f32(&ts)? {
        let w = weight.map(|_| &c[2]);
        let pw = pos_weight.map(|_| &c[ts.len() - 1]);
        return bce_with_logits_opts(&c[0], &c[1], w, pw, reduction);
    }
    // the weights broadcast to the logits, never past them (PyTorch applies
    // them in place)
    for w in [weight, pos_weight].into_iter().flatten() {
        weight_broadcasts(OP, w, logits.shape())?;
    }
    let Some(p) = pos_weight else {
        let l = bce_with_logits(logits, target, Reduction::None)?;
        let l = match weight {
            Some(w) => l.mul(w)?,
            None => l,
        };
        return reduce(l, reduction);
    };
    if logits.shape() != target.shape() {
        return Err(Error::shape(
            OP,
            logits.shape(),
            target.shape(),
            "logits and targets must have the same shape",
        ));
    }
    let (x, y) = (logits, target);
    // softplus(-x) = log1p(e^-|x|) + max(-x, 0) = -log_sigmoid(x)
    let softplus_neg = |x: &Tensor| -> Result<Tensor> {
        x.abs()?
            .neg()?
            .exp()?
            .log1p()?
            .add(&x.neg()?.clamp_min(0.0)?)
    };
    let scaled = |l: Tensor, w: Option<&Tensor>| match w {
        Some(w) => l.mul(w),
        None => Ok(l),
    };
    let l = crate::autograd::no_grad(|| -> Result<Tensor> {
        let log_weight = p.sub(1.0)?.mul(y)?.add(1.0)?;
        let l = y
            .neg()?
            .add(1.0)?
            .mul(x)?
            .add(&log_weight.mul(&softplus_neg(x)?)?)?;
        scaled(l, weight)
    })?;
    // PyTorch's rules (the weights get no gradient):
    // d/dx = w·((1 + (p - 1)·y)·sigmoid(x) - p·y), d/dy = w·((p - 1)·softplus(-x) - x)
    let l = Tensor::record_twice(l, OP, &[x, y], |_| {
        let (xs, ys) = (x.save(), y.save());
        let (p, w) = (p.detach(), weight.map(Tensor::detach));
        move |g: &Tensor| {
            let (x, y) = (&xs.value()?, &ys.value()?);
            let gx = p
                .sub(1.0)?
                .mul(y)?
                .add(1.0)?
                .mul(&x.sigmoid()?)?
                .sub(&p.mul(y)?)?;
            let gy = p.sub(1.0)?.mul(&softplus_neg(x)?)?.sub(x)?;
            Ok(vec![
                Some(g.mul(&scaled(gx, w.as_ref())?)?),
                Some(g.mul(&scaled(gy, w.as_ref())?)?),
            ])
        }
    });
    reduce(l, reduction)
}
