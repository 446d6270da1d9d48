//! The losses of `torch.nn.functional` beside those of `loss.rs` and
//! `loss_pointwise.rs`: the ranking and embedding losses
//! (`margin_ranking_loss`, `hinge_embedding_loss`, `soft_margin_loss`,
//! `multilabel_soft_margin_loss`, `cosine_embedding_loss`,
//! `triplet_margin_loss`), the Poisson and Gaussian negative log-likelihoods,
//! and the multi-class margin losses (`multi_margin_loss`,
//! `multilabel_margin_loss`). Each is a composite of tensor ops written in the
//! order PyTorch's kernel or composite computes it, so it runs on every device
//! (meta included) and autograd needs no rule of its own; the gradients are
//! PyTorch's, ties included (a hinge at exactly 0 passes no gradient, as
//! PyTorch's `clamp_min` and its margin kernels pass none). Those on PyTorch's
//! autocast float32 lists run in float32 under autocast.

use super::distance::pairwise_distance;
use super::loss::{not_differentiable, reduce, Reduction};
use super::pointwise_layers::logsigmoid;
use crate::{
    autograd::no_grad,
    dtype::DType,
    error::{Error, Result},
    layout::broadcast_shapes,
    tensor::{autocast::to_f32, torch_dtype_name, Operand, Scalar, Tensor},
};

/// `t`'s shape as Python prints a `torch.Size`.
fn torch_size(t: &Tensor) -> String {
    crate::error::torch_size(t.shape())
}

/// `x` as Python prints a float (`0.0`, `-1.5`).
fn py_float(x: f64) -> String {
    if x.is_finite() && x.fract() == 0.0 && x.abs() < 1e16 {
        format!("{x:.1}")
    } else {
        format!("{x}")
    }
}

/// Refuses a `t` that would grow past `shape` when broadcast to it (PyTorch
/// writes into a tensor of that shape in place, and says so); a pair that
/// does not broadcast at all is the broadcast's error.
fn broadcasts_into(op: &'static str, t: &Tensor, shape: &[usize]) -> Result<()> {
    let b = broadcast_shapes(op, shape, t.shape())?;
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

/// PyTorch's refusal of an integer or bool `t` that a loss writes a
/// floating-point `result` into in place: `result type Double can't be cast
/// to the desired output type Long` (a non-float `result` is named as the
/// float32 its next step would make).
fn float_output(op: &'static str, t: &Tensor, result: DType, ctype: bool) -> Result<()> {
    if t.dtype().is_float() {
        return Ok(());
    }
    let result = if result.is_float() {
        result
    } else {
        DType::F32
    };
    // (PyTorch names the dtype as its C++ type where an in-place clamp refuses)
    let name = match (ctype, t.dtype()) {
        (true, DType::I64) => "long int",
        (true, DType::U8) => "unsigned char",
        (true, DType::Bool) => "bool",
        (_, dt) => torch_dtype_name(dt),
    };
    Err(Error::dtype(
        op,
        t.dtype(),
        format!(
            "result type {} can't be cast to the desired output type {name}",
            torch_dtype_name(result)
        ),
    ))
}

/// The margin ranking loss (`F.margin_ranking_loss`): `max(0, -y·(x1 - x2) +
/// margin)` per element, where `y` (1 or -1) says which of `x1` and `x2`
/// should rank higher. The three must have the same number of dims (PyTorch's
/// error) and broadcast together; integer operands give float32, as in
/// PyTorch, and a bool target is refused (PyTorch's negation error). Input1,
/// input2 and a floating-point target each get a gradient, none where the
/// hinge is at or below 0.
///
/// ```
/// # use ember::{nn, Device, Tensor};
/// let dev = Device::Cpu;
/// let x1 = Tensor::new(&[0.8f32, 0.1], &dev)?;
/// let x2 = Tensor::new(&[0.2f32, 0.5], &dev)?;
/// let y = Tensor::new(&[1.0f32, 1.0], &dev)?; // x1 should rank higher
/// let l = nn::functional::margin_ranking_loss(&x1, &x2, &y, 0.1, nn::Reduction::None)?;
/// let l = l.to_vec::<f32>()?;
/// assert!(l[0] == 0.0 && (l[1] - 0.5).abs() < 1e-6);
/// # Ok::<(), ember::Error>(())
/// ```
pub fn margin_ranking_loss(
    input1: &Tensor,
    input2: &Tensor,
    target: &Tensor,
    margin: f64,
    reduction: Reduction,
) -> Result<Tensor> {
    const OP: &str = "margin_ranking_loss";
    let _record = crate::profiler::function(OP);
    if input1.rank() != input2.rank() || input1.rank() != target.rank() {
        return Err(Error::invalid(
            OP,
            format!(
                "margin_ranking_loss : All input tensors should have same dimension but got \
                 sizes: input1: {}, input2: {}, target: {} ",
                torch_size(input1),
                torch_size(input2),
                torch_size(target)
            ),
        ));
    }
    if let Some(c) = to_f32(&[input1, input2, target])? {
        return margin_ranking_loss(&c[0], &c[1], &c[2], margin, reduction);
    }
    if target.dtype() == DType::Bool {
        return Err(Error::dtype(
            OP,
            DType::Bool,
            "Negation, the `-` operator, on a bool tensor is not supported. If you are trying \
             to invert a mask, use the `~` or `logical_not()` operator instead.",
        ));
    }
    let l = target
        .neg()?
        .mul(&input1.sub(input2)?)?
        .add(margin)?
        .clamp_min(0.0)?;
    reduce(l, reduction)
}

/// The hinge embedding loss (`F.hinge_embedding_loss`; PyTorch's default
/// `margin` is 1): `x` where the target is 1, `max(0, margin - x)` where it is
/// -1 (a target that is neither adds both, as PyTorch's does). Input and
/// target broadcast; the loss has the input's dtype (an integer input gives
/// integer losses, `margin` truncated to it as PyTorch fills it, and a mean
/// of them is refused). Only the input gets a gradient.
pub fn hinge_embedding_loss(
    input: &Tensor,
    target: &Tensor,
    margin: f64,
    reduction: Reduction,
) -> Result<Tensor> {
    const OP: &str = "hinge_embedding_loss";
    let _record = crate::profiler::function(OP);
    if let Some(c) = to_f32(&[input, target])? {
        return hinge_embedding_loss(&c[0], &c[1], margin, reduction);
    }
    let zeros = input.zeros_like()?;
    let margin_clamp = input.full_like(margin)?.sub(input)?.clamp_min(0)?;
    let output_margin = target.ne(1.0)?.where_(&margin_clamp, &zeros)?;
    let output_self = target.ne(-1.0)?.where_(input, &zeros)?;
    reduce(output_margin.add(&output_self)?, reduction)
}

/// The two-class logistic loss (`F.soft_margin_loss`): `log(1 + exp(-y·x))`
/// per element, for targets `y` of 1 or -1. The target broadcasts to the
/// input's shape (not past it: PyTorch computes in place) and the loss has the
/// input's dtype, which must be floating point (PyTorch's errors). The input
/// gets a gradient; a target that requires one is refused while autograd
/// records, as PyTorch has no derivative for it.
pub fn soft_margin_loss(input: &Tensor, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
    const OP: &str = "soft_margin_loss";
    let _record = crate::profiler::function(OP);
    not_differentiable(OP, OP, "target", Some(target))?;
    if let Some(c) = to_f32(&[input, target])? {
        return soft_margin_loss(&c[0], &c[1], reduction);
    }
    broadcasts_into(OP, target, input.shape())?;
    let pair = DType::result_type(input.dtype(), false, target.dtype(), target.rank() == 0);
    float_output(OP, input, pair, false)?;
    // -x·y in the pair's dtype, written into the input's (PyTorch's in-place
    // `neg_out(input).mul_(target)`), then exp, +1 and log in that dtype
    let l = input.neg()?.mul(target)?.to_dtype(input.dtype())?;
    reduce(l.exp()?.add(1.0)?.log()?, reduction)
}

/// The multi-label one-versus-all loss (`F.multilabel_soft_margin_loss`):
/// `-(y·log σ(x) + (1 - y)·log σ(-x))` per element, times `weight` (which
/// broadcasts) where given, summed over the input's last dim (the classes)
/// and divided by their number, then reduced over the samples. Input and
/// target broadcast; the input must be floating point and have a dim. Input,
/// floating-point target and weight each get a gradient (PyTorch's is a
/// composite too).
pub fn multilabel_soft_margin_loss(
    input: &Tensor,
    target: &Tensor,
    weight: Option<&Tensor>,
    reduction: Reduction,
) -> Result<Tensor> {
    const OP: &str = "multilabel_soft_margin_loss";
    let _record = crate::profiler::function(OP);
    if input.rank() == 0 {
        return Err(Error::invalid(
            OP,
            "Dimension specified as -1 but tensor has no dimensions",
        ));
    }
    let ls = logsigmoid(input)?;
    let ls_neg = logsigmoid(&input.neg()?)?;
    let l = target
        .mul(&ls)?
        .add(&target.neg()?.add(1)?.mul(&ls_neg)?)?
        .neg()?;
    let l = match weight {
        Some(w) => l.mul(w)?,
        None => l,
    };
    // the input's last dim, counted in the losses' dims (which a target or
    // weight of more dims may have added in front, as in PyTorch)
    let class_dim = input.rank() - 1;
    let c = input.shape()[class_dim];
    let l = l.sum(class_dim as i64, false)?.div(c as f64)?;
    reduce(l, reduction)
}

/// The cosine embedding loss (`F.cosine_embedding_loss`; PyTorch's default
/// `margin` is 0): `1 - cos(x1, x2)` where the target is 1, `max(0, cos(x1,
/// x2) - margin)` where it is -1, 0 elsewhere. The inputs are `[N, D]` with a
/// target `[N]`, or `[D]` with a 0-d target (PyTorch's errors otherwise); the
/// cosine is PyTorch's, `x1·x2 / sqrt((|x1|² + ε)(|x2|² + ε))` with `ε` the
/// float `1e-12`. The inputs get gradients, the target none.
pub fn cosine_embedding_loss(
    input1: &Tensor,
    input2: &Tensor,
    target: &Tensor,
    margin: f64,
    reduction: Reduction,
) -> Result<Tensor> {
    const OP: &str = "cosine_embedding_loss";
    let _record = crate::profiler::function(OP);
    let targ_dim = target.rank();
    if targ_dim > 1 {
        return Err(Error::invalid(
            OP,
            "0D or 1D target tensor expected, multi-target not supported",
        ));
    }
    let want = targ_dim + 1;
    if input1.rank() != want || input2.rank() != want {
        return Err(Error::invalid(
            OP,
            format!(
                "{targ_dim}D target tensor expects {want}D input tensors, but found inputs with \
                 sizes {:?} and {:?}.",
                input1.shape(),
                input2.shape()
            ),
        ));
    }
    if let Some(c) = to_f32(&[input1, input2, target])? {
        return cosine_embedding_loss(&c[0], &c[1], &c[2], margin, reduction);
    }
    let d = targ_dim as i64;
    let eps = f64::from(1e-12f32);
    let prod_sum = input1.mul(input2)?.sum(d, false)?;
    let mag_square1 = input1.mul(input1)?.sum(d, false)?.add(eps)?;
    let mag_square2 = input2.mul(input2)?.sum(d, false)?.add(eps)?;
    let denom = mag_square1.mul(&mag_square2)?.sqrt()?;
    let cos = prod_sum.div(&denom)?;
    let zeros = cos.zeros_like()?;
    let pos = cos.neg()?.add(1.0)?;
    let neg = cos.sub(margin)?.clamp_min(0.0)?;
    let output_pos = target.eq(1.0)?.where_(&pos, &zeros)?;
    let output_neg = target.eq(-1.0)?.where_(&neg, &zeros)?;
    reduce(output_pos.add(&output_neg)?, reduction)
}

/// The triplet loss (`F.triplet_margin_loss`; PyTorch's defaults are `margin =
/// 1`, `p = 2`, `eps = 1e-6`, `swap = false`): `max(0, margin + d(a, p) - d(a,
/// n))` with `d` the [`pairwise_distance`] (the `p`-norm of the difference
/// plus `eps` along the last dim). With `swap`, `d(a, n)` is the smaller of
/// it and `d(p, n)` (the distance swap of Balntas et al.). The three must have
/// the same number of dims, and broadcast; `margin` must be positive
/// (PyTorch's errors). All three get gradients.
#[allow(clippy::too_many_arguments)]
pub fn triplet_margin_loss(
    anchor: &Tensor,
    positive: &Tensor,
    negative: &Tensor,
    margin: f64,
    p: f64,
    eps: f64,
    swap: bool,
    reduction: Reduction,
) -> Result<Tensor> {
    const OP: &str = "triplet_margin_loss";
    let _record = crate::profiler::function(OP);
    if margin <= 0.0 || margin.is_nan() {
        return Err(Error::invalid(
            OP,
            format!("margin must be greater than 0, got {}", py_float(margin)),
        ));
    }
    let (a, pd, n) = (anchor.rank(), positive.rank(), negative.rank());
    if a != pd || pd != n {
        return Err(Error::invalid(
            OP,
            format!(
                "The anchor, positive, and negative tensors are expected to have the same number \
                 of dimensions, but got: anchor {a}D, positive {pd}D, and negative {n}D inputs"
            ),
        ));
    }
    if let Some(c) = to_f32(&[anchor, positive, negative])? {
        return triplet_margin_loss(&c[0], &c[1], &c[2], margin, p, eps, swap, reduction);
    }
    let dist_pos = pairwise_distance(anchor, positive, p, eps, false)?;
    let dist_neg = pairwise_distance(anchor, negative, p, eps, false)?;
    let dist_neg = if swap {
        dist_neg.minimum(&pairwise_distance(positive, negative, p, eps, false)?)?
    } else {
        dist_neg
    };
    let l = dist_pos.add(margin)?.sub(&dist_neg)?.clamp_min(0.0)?;
    reduce(l, reduction)
}

/// The Poisson negative log-likelihood (`F.poisson_nll_loss`; PyTorch's
/// defaults are `log_input = true`, `full = false`, `eps = 1e-8`): `exp(x) -
/// y·x` for a log-rate `x`, or `x - y·log(x + eps)` for a rate. With `full`,
/// Stirling's approximation of `log(y!)`, `y·log y - y + ½·log(2πy)`, is
/// added where `y > 1`. Input and target broadcast and both get gradients.
pub fn poisson_nll_loss(
    input: &Tensor,
    target: &Tensor,
    log_input: bool,
    full: bool,
    eps: f64,
    reduction: Reduction,
) -> Result<Tensor> {
    const OP: &str = "poisson_nll_loss";
    let _record = crate::profiler::function(OP);
    if let Some(c) = to_f32(&[input, target])? {
        return poisson_nll_loss(&c[0], &c[1], log_input, full, eps, reduction);
    }
    let loss = if log_input {
        input.exp()?.sub(&target.mul(input)?)?
    } else {
        input.sub(&target.mul(&input.add(eps)?.log()?)?)?
    };
    let loss = if full {
        let two_pi = 2.0 * std::f64::consts::PI;
        let stirling = target
            .mul(&target.log()?)?
            .sub(target)?
            .add(&target.mul(two_pi)?.log()?.mul(0.5)?)?
            .masked_fill(&target.le(1.0)?, 0.0)?;
        // added in place: the loss keeps its dtype
        loss.add(&stirling)?.to_dtype(loss.dtype())?
    } else {
        loss
    };
    reduce(loss, reduction)
}

/// `t` clamped below at `min`, its gradient passed as if unclamped: PyTorch's
/// Gaussian loss clamps a clone of the variance in place under `no_grad`.
fn clamped_keeping_grad(t: &Tensor, min: f64) -> Result<Tensor> {
    let clamped = no_grad(|| t.clamp_min(min))?;
    Ok(Tensor::record_twice(clamped, "clamp_", &[t], |_| {
        |g: &Tensor| Ok(vec![Some(g.clone())])
    }))
}

/// The Gaussian negative log-likelihood (`F.gaussian_nll_loss`; PyTorch's
/// defaults are `full = false`, `eps = 1e-6`): `½·(log v + (x - y)²/v)` for
/// the expectations `x`, samples `y` and variances `v` clamped below at `eps`
/// (the clamp passes the gradient through, as PyTorch's in-place clamp under
/// `no_grad` does), plus `½·log 2π` with `full`.
///
/// `var` is a tensor or a number (one variance for all, `var · ones_like(x)`).
/// A tensor of `x`'s shape is one variance per expectation; one of `x`'s shape
/// without the last dim, or of `x`'s rank with one dim of size 1 where `x`'s
/// differs, broadcasts (PyTorch's homoscedastic cases); any other shape is
/// PyTorch's `var is of incorrect size`. A negative variance is refused (read
/// on the host, as PyTorch reads it; not on meta). Input, target and a tensor
/// variance each get a gradient.
pub fn gaussian_nll_loss<'a>(
    input: &Tensor,
    target: &Tensor,
    var: impl Into<Operand<'a>>,
    full: bool,
    eps: f64,
    reduction: Reduction,
) -> Result<Tensor> {
    const OP: &str = "gaussian_nll_loss";
    let _record = crate::profiler::function(OP);
    let negative = || Error::invalid(OP, "var has negative entry/entries");
    let var = match var.into() {
        Operand::Scalar(s) => {
            let v = match s {
                Scalar::Float(v) => v,
                s => s.to_f64(),
            };
            if v < 0.0 {
                return Err(negative());
            }
            input.ones_like()?.mul(v)?
        }
        Operand::Tensor(v) => {
            if v.holds_values() && v.numel() > 0 && v.lt(0.0)?.any_all()?.item::<bool>()? {
                return Err(negative());
            }
            v.clone()
        }
    };
    let var = if var.shape() != input.shape() {
        let r = input.rank();
        let leading = &input.shape()[..r.saturating_sub(1)];
        if leading == var.shape() {
            // one variance per row of the last dim
            var.unsqueeze(-1)?
        } else if r == var.rank()
            && input
                .shape()
                .iter()
                .zip(var.shape())
                .filter(|(x, v)| x != v)
                .map(|(_, v)| v)
                .sum::<usize>()
                == 1
        {
            var
        } else {
            return Err(Error::invalid(OP, "var is of incorrect size"));
        }
    } else {
        var
    };
    float_output(OP, &var, DType::F32, true)?;
    let var = clamped_keeping_grad(&var, eps)?;
    let loss = var
        .log()?
        .add(&input.sub(target)?.square()?.div(&var)?)?
        .mul(0.5)?;
    let loss = if full {
        loss.add(0.5 * (2.0 * std::f64::consts::PI).ln())?
    } else {
        loss
    };
    reduce(loss, reduction)
}

/// Rows and columns of a multi-class margin loss's input (`[N, C]`, `[C]` or
/// 0-d, PyTorch's layouts), after PyTorch's check that it is one of them and
/// not empty but for the batch.
fn margin_frames(op: &'static str, input: &Tensor) -> Result<(usize, usize)> {
    let s = input.shape();
    let valid = match s.len() {
        0 => true,
        1 => s[0] != 0,
        2 => s[1] != 0,
        _ => false,
    };
    if !valid {
        return Err(Error::invalid(
            op,
            format!(
                "Expected non-empty vector or matrix with optional 0-dim batch size, but got: {s:?}"
            ),
        ));
    }
    Ok(match s.len() {
        0 => (1, 1),
        1 => (1, s[0]),
        _ => (s[0], s[1]),
    })
}

/// PyTorch's kernels for the multi-class margin losses take floating-point
/// inputs only; float16 and bfloat16 (which its CUDA kernels take, and its
/// CPU kernels refuse) are computed in float32, as those kernels accumulate,
/// and rounded once.
fn margin_input(op: &'static str, kernel: &str, input: &Tensor) -> Result<Tensor> {
    match input.dtype() {
        DType::F32 | DType::F64 => Ok(input.clone()),
        DType::F16 | DType::BF16 => input.to_dtype(DType::F32),
        dt => Err(Error::dtype(
            op,
            dt,
            format!(
                "\"{kernel}\" not implemented for '{}'",
                torch_dtype_name(dt)
            ),
        )),
    }
}

/// PyTorch's refusal of an index tensor of another dtype than int64 (or of a
/// weight of another dtype than the input's).
fn expect_dtype(op: &'static str, t: &Tensor, want: DType) -> Result<()> {
    if t.dtype() != want {
        return Err(Error::dtype(
            op,
            t.dtype(),
            format!(
                "expected scalar type {} but found {}",
                torch_dtype_name(want),
                torch_dtype_name(t.dtype())
            ),
        ));
    }
    Ok(())
}

/// `t`'s values checked to lie in `[0, size)`, PyTorch's `msg` where they do
/// not: at once on the CPU; on a GPU where the values are, reported at the
/// next synchronisation (as ember's other index checks), with its index
/// message; on meta not at all.
fn class_indices(op: &'static str, t: &Tensor, size: usize, msg: &str) -> Result<Tensor> {
    let cpu = t.device().is_cpu();
    Tensor::index_values(op, t, 1, size, false).map_err(|e| match e {
        Error::IndexOutOfRange { .. } if cpu => Error::invalid(op, msg.to_string()),
        e => e,
    })
}

/// The multi-class hinge loss (`F.multi_margin_loss`; PyTorch's defaults are
/// `p = 1`, `margin = 1`): for each sample of `input` `[N, C]` (or `[C]`, or
/// 0-d) with int64 class `target` `[N]`, the sum over the other classes `d`
/// of `max(0, margin - x[y] + x[d])^p`, times `weight[y]` where given, divided
/// by `C`. `p` is 1 or 2 and `weight` 1-D of `C` values of the input's dtype;
/// a target outside `[0, C)` is PyTorch's `target out of range` (on a GPU,
/// reported at the next synchronisation). With [`Reduction::None`] the loss
/// is `[N]`, or 0-d for a 0-d target. An empty batch gives NaN for the mean
/// and 0 for the sum (PyTorch's are left uninitialised).
///
/// Only the input gets a gradient (a weight that requires one is PyTorch's
/// error while autograd records). float16 and bfloat16 inputs, which
/// PyTorch's CPU kernel refuses and its CUDA kernel takes, are computed in
/// float32 and rounded once, on every device.
pub fn multi_margin_loss(
    input: &Tensor,
    target: &Tensor,
    p: i64,
    margin: f64,
    weight: Option<&Tensor>,
    reduction: Reduction,
) -> Result<Tensor> {
    const OP: &str = "multi_margin_loss";
    let _record = crate::profiler::function(OP);
    if p != 1 && p != 2 {
        return Err(Error::invalid(OP, "only p == 1 and p == 2 supported"));
    }
    if weight.is_some_and(|w| w.rank() != 1) {
        return Err(Error::invalid(OP, "weight must be one-dimensional"));
    }
    not_differentiable(OP, OP, "weight", weight)?;
    let mut ts = vec![input, target];
    ts.extend(weight);
    if let Some(c) = to_f32(&ts)? {
        return multi_margin_loss(&c[0], &c[1], p, margin, weight.map(|_| &c[2]), reduction);
    }
    let (nframe, dim) = margin_frames(OP, input)?;
    if target.rank() > 1 || target.numel() != nframe {
        return Err(Error::shape(
            OP,
            input.shape(),
            target.shape(),
            format!(
                "multi_margin_loss: target tensor should be 1-D with size equal to the number of \
                 input samples (batch size). Expected target size [{nframe}], but got {:?}. Input \
                 has shape {:?}.",
                target.shape(),
                input.shape()
            ),
        ));
    }
    if let Some(w) = weight {
        if w.numel() != dim {
            return Err(Error::shape(
                OP,
                &[dim],
                w.shape(),
                format!(
                    "inconsistent weight size, expected {dim} but got {:?}",
                    w.shape()
                ),
            ));
        }
    }
    let x = margin_input(OP, "multi_margin_loss_cpu_kernel", input)?;
    expect_dtype(OP, target, DType::I64)?;
    if let Some(w) = weight {
        expect_dtype(OP, w, input.dtype())?;
    }
    let x = x.reshape([nframe, dim])?;
    let t = class_indices(OP, &target.reshape([nframe])?, dim, "target out of range")?;
    let t = t.unsqueeze(1)?;
    // margin - x[y] + x[d], counted where positive and d is not y
    let z = x.gather(1, &t)?.neg()?.add(margin)?.add(&x)?;
    let h = z.relu()?;
    let h = if p == 2 { h.square()? } else { h };
    let h = match weight {
        Some(w) => h.mul(
            &w.to_dtype(x.dtype())?
                .index_select(0, &t.squeeze(1)?)?
                .unsqueeze(1)?,
        )?,
        None => h,
    };
    let classes = Tensor::arange(0i64, dim as i64, &x.device())?;
    let others = t.ne(&classes.unsqueeze(0)?)?;
    let per_sample = others.where_(&h, 0.0)?.sum(1, false)?.div(dim as f64)?;
    let l = match reduction {
        Reduction::None if target.rank() == 0 => per_sample.reshape([0usize; 0])?,
        r => reduce(per_sample, r)?,
    };
    l.to_dtype(input.dtype())
}

/// The multi-label hinge loss (`F.multilabel_margin_loss`): each sample of
/// `input` `[N, C]` (or `[C]`, or 0-d) lists its classes in the int64
/// `target` of the input's shape, up to the first -1; the loss sums
/// `max(0, 1 - x[j] + x[d])` over the listed classes `j` (a class listed
/// twice counts twice, as in PyTorch) and the unlisted classes `d`, divided
/// by `C`. A
/// target outside `[-1, C)` is PyTorch's error (on a GPU, reported at the
/// next synchronisation). With [`Reduction::None`] the loss is `[N]` for a
/// 2-D target, else 0-d. An empty batch gives NaN for the mean and 0 for the
/// sum. Only the input gets a gradient; float16 and bfloat16 inputs are
/// computed in float32 and rounded once (PyTorch's CPU kernel refuses them,
/// its CUDA kernel takes them).
///
/// The pairs of listed and unlisted classes are formed at once: memory grows
/// as `N·C²`.
pub fn multilabel_margin_loss(
    input: &Tensor,
    target: &Tensor,
    reduction: Reduction,
) -> Result<Tensor> {
    const OP: &str = "multilabel_margin_loss";
    let _record = crate::profiler::function(OP);
    if let Some(c) = to_f32(&[input, target])? {
        return multilabel_margin_loss(&c[0], &c[1], reduction);
    }
    let (nframe, dim) = margin_frames(OP, input)?;
    let fits = if input.rank() <= 1 {
        target.rank() <= 1 && target.numel() == dim
    } else {
        target.shape() == [nframe, dim]
    };
    if !fits {
        return Err(Error::shape(
            OP,
            input.shape(),
            target.shape(),
            format!(
                "inconsistent target size: {:?} for input of size: {:?}",
                target.shape(),
                input.shape()
            ),
        ));
    }
    let x = margin_input(OP, "multilabel_margin_loss_forward_out_frame", input)?;
    expect_dtype(OP, target, DType::I64)?;
    let x = x.reshape([nframe, dim])?;
    let t = target.reshape([nframe, dim])?;
    let msg = "argument #2 'target' is out of range";
    let t = class_indices(OP, &t.add(1i64)?, dim + 1, msg)?.sub(1i64)?;
    // the classes listed before the first -1
    let listed = t.eq(-1i64)?.to_dtype(DType::I64)?.cumsum(1)?.eq(0i64)?;
    let idx = listed.where_(&t, 0i64)?;
    let classes = Tensor::arange(0i64, dim as i64, &x.device())?.reshape([1, 1, dim])?;
    let is_target = idx
        .unsqueeze(2)?
        .eq(&classes)?
        .logical_and(&listed.unsqueeze(2)?)?
        .any(1, false)?;
    // 1 - x[j] + x[d] for each listed j and unlisted d: [N, C, C]
    let z = x
        .gather(1, &idx)?
        .unsqueeze(2)?
        .neg()?
        .add(1.0)?
        .add(&x.unsqueeze(1)?)?;
    let pairs = listed
        .unsqueeze(2)?
        .logical_and(&is_target.logical_not()?.unsqueeze(1)?)?;
    let per_sample = pairs
        .where_(&z.relu()?, 0.0)?
        .sum([1i64, 2], false)?
        .div(dim as f64)?;
    let l = match reduction {
        Reduction::None if target.rank() <= 1 => per_sample.reshape([0usize; 0])?,
        r => reduce(per_sample, r)?,
    };
    l.to_dtype(input.dtype())
}
