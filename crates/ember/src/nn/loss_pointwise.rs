//! The element-by-element losses of `torch.nn.functional` beside `mse_loss`:
//! `l1_loss`, `smooth_l1_loss`, `huber_loss`, `kl_div` and
//! `binary_cross_entropy` (on probabilities). Each runs in float32 under
//! autocast (PyTorch's float32 lists), and each has PyTorch's gradient for both
//! the input and the target.

use super::loss::{reduce, same_shape, weight_broadcasts, Reduction};
use crate::{
    autograd::no_grad,
    error::{Error, Result},
    tensor::autocast::{is_autocast_enabled, DeviceType},
    tensor::Tensor,
};

/// Refuses integer and bool operands where PyTorch's kernel has no such dtype.
fn floats(op: &'static str, ts: &[&Tensor]) -> Result<()> {
    for t in ts {
        if !t.dtype().is_float() {
            return Err(Error::dtype(
                op,
                t.dtype(),
                format!("{op} takes floating-point tensors, got {}", t.dtype()),
            ));
        }
    }
    Ok(())
}

/// Mean absolute error (`F.l1_loss`): `|input - target|`, reduced. The shapes
/// must match (see [`mse_loss`](super::mse_loss)). The gradient is
/// `sign(input - target)`, 0 where they are equal.
///
/// ```
/// # use ember::{nn, Device, Tensor};
/// let x = Tensor::new(&[1.0f32, 2.0, 4.0], &Device::Cpu)?;
/// let y = Tensor::new(&[1.5f32, 2.0, 1.0], &Device::Cpu)?;
/// let l = nn::l1_loss(&x, &y, nn::Reduction::Sum)?;
/// assert_eq!(l.item::<f32>()?, 3.5);
/// # Ok::<(), ember::Error>(())
/// ```
pub fn l1_loss(input: &Tensor, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
    let _record = crate::profiler::function("l1_loss");
    if let Some(c) = crate::tensor::autocast::to_f32(&[input, target])? {
        return l1_loss(&c[0], &c[1], reduction);
    }
    same_shape("l1_loss", input, target)?;
    reduce(input.sub(target)?.abs()?, reduction)
}

/// The two pieces of a smooth absolute error at `z = |d|`: `0.5·z²/s` within
/// `edge` of 0, `b·(z - c)` outside, with the gradient `d/s` within and
/// `b·sign(d)` outside, in PyTorch's kernels' order of operations.
struct Piecewise {
    op: &'static str,
    edge: f64,
    s: f64,
    b: f64,
    c: f64,
}

impl Piecewise {
    fn loss(&self, input: &Tensor, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
        same_shape(self.op, input, target)?;
        floats(self.op, &[input, target])?;
        let Piecewise { edge, s, b, c, .. } = *self;
        let l = no_grad(|| -> Result<Tensor> {
            let z = input.sub(target)?.abs()?;
            let inner = z.square()?.mul(0.5)?.div(s)?;
            let outer = z.sub(c)?.mul(b)?;
            z.lt(edge)?.where_(&inner, &outer)
        })?;
        let l = Tensor::record_twice(l, self.op, &[input, target], |_| {
            let (x, y) = (input.save(), target.save());
            move |g: &Tensor| {
                let d = x.value()?.sub(&y.value()?)?;
                // d ≤ -edge: -b, d ≥ edge: b, else d/s (PyTorch's order of tests)
                let slope = d.div(s)?;
                let slope = d.ge(edge)?.where_(b, &slope)?;
                let slope = d.le(-edge)?.where_(-b, &slope)?;
                let gx = g.mul(&slope)?;
                let gy = gx.neg()?;
                Ok(vec![Some(gx), Some(gy)])
            }
        });
        reduce(l, reduction)
    }
}

/// The smooth L1 loss (`F.smooth_l1_loss`): `0.5·d²/beta` where `|d| < beta`,
/// else `|d| - 0.5·beta`, for `d = input - target`; `beta` 0 is
/// [`l1_loss`]. A negative `beta` is PyTorch's error. The shapes must match.
pub fn smooth_l1_loss(
    input: &Tensor,
    target: &Tensor,
    reduction: Reduction,
    beta: f64,
) -> Result<Tensor> {
    let _record = crate::profiler::function("smooth_l1_loss");
    const OP: &str = "smooth_l1_loss";
    if beta < 0.0 || beta.is_nan() {
        return Err(Error::invalid(
            OP,
            "smooth_l1_loss does not support negative values for beta.",
        ));
    }
    if let Some(c) = crate::tensor::autocast::to_f32(&[input, target])? {
        return smooth_l1_loss(&c[0], &c[1], reduction, beta);
    }
    if beta == 0.0 {
        same_shape(OP, input, target)?;
        return l1_loss(input, target, reduction);
    }
    Piecewise {
        op: OP,
        edge: beta,
        s: beta,
        b: 1.0,
        c: 0.5 * beta,
    }
    .loss(input, target, reduction)
}

/// The Huber loss (`F.huber_loss`): `0.5·d²` where `|d| < delta`, else
/// `delta·(|d| - 0.5·delta)`; `smooth_l1_loss` times `delta` where `beta` is
/// `delta`. `delta` must be positive (PyTorch's error). The shapes must match.
pub fn huber_loss(
    input: &Tensor,
    target: &Tensor,
    reduction: Reduction,
    delta: f64,
) -> Result<Tensor> {
    let _record = crate::profiler::function("huber_loss");
    const OP: &str = "huber_loss";
    if delta <= 0.0 || delta.is_nan() {
        return Err(Error::invalid(
            OP,
            "huber_loss does not support non-positive values for delta.",
        ));
    }
    if let Some(c) = crate::tensor::autocast::to_f32(&[input, target])? {
        return huber_loss(&c[0], &c[1], reduction, delta);
    }
    Piecewise {
        op: OP,
        edge: delta,
        s: 1.0,
        b: delta,
        c: 0.5 * delta,
    }
    .loss(input, target, reduction)
}

/// The Kullback-Leibler divergence of `target` from `input`, the model's
/// log-probabilities (`F.kl_div`): `target·(log(target) - input)` pointwise,
/// with `0·log 0 = 0` ([`Tensor::xlogy`]), or with `log_target`, for a target
/// given as log-probabilities, `exp(target)·(target - input)`. The two
/// broadcast, as in PyTorch. [`Reduction::Mean`] is PyTorch's `'mean'`, the
/// mean over every element; the divergence between distributions (the sum
/// over classes, averaged over the batch) is [`kl_div_batchmean`]. Integer
/// inputs are PyTorch's error.
///
/// ```
/// # use ember::{nn, Device, Tensor};
/// let logp = Tensor::new(&[[0.25f32, 0.75]], &Device::Cpu)?.log()?;
/// let q = Tensor::new(&[[0.5f32, 0.5]], &Device::Cpu)?;
/// let kl = nn::kl_div_batchmean(&logp, &q, false)?; // KL(q ‖ p)
/// let want = 0.5 * (0.5f32 / 0.25).ln() + 0.5 * (0.5f32 / 0.75).ln();
/// assert!((kl.item::<f32>()? - want).abs() < 1e-6);
/// # Ok::<(), ember::Error>(())
/// ```
pub fn kl_div(
    input: &Tensor,
    target: &Tensor,
    reduction: Reduction,
    log_target: bool,
) -> Result<Tensor> {
    let _record = crate::profiler::function("kl_div");
    reduce(pointwise_kl(input, target, log_target)?, reduction)
}

/// [`kl_div`] with PyTorch's `reduction='batchmean'`: the sum over every
/// element divided by the size of the first dim (a 0-d input's sum as it is).
pub fn kl_div_batchmean(input: &Tensor, target: &Tensor, log_target: bool) -> Result<Tensor> {
    let _record = crate::profiler::function("kl_div");
    let l = pointwise_kl(input, target, log_target)?.sum_all()?;
    match input.shape().first() {
        Some(&n) => l.div(n as f64),
        None => Ok(l),
    }
}

fn pointwise_kl(input: &Tensor, target: &Tensor, log_target: bool) -> Result<Tensor> {
    const OP: &str = "kl_div";
    if let Some(c) = crate::tensor::autocast::to_f32(&[input, target])? {
        return pointwise_kl(&c[0], &c[1], log_target);
    }
    if !input.dtype().is_float() || !target.dtype().is_float() {
        return Err(Error::dtype(
            OP,
            if input.dtype().is_float() {
                target.dtype()
            } else {
                input.dtype()
            },
            "kl_div: Integral inputs not supported.",
        ));
    }
    if log_target {
        target.exp()?.mul(&target.sub(input)?)
    } else {
        target.xlogy(target)?.sub(&target.mul(input)?)
    }
}

/// Binary cross-entropy of probabilities (`F.binary_cross_entropy`):
/// `-w·(y·log x + (1 - y)·log(1 - x))` with each log clamped at -100 (so a
/// probability of exactly 0 or 1 gives at most 100, not infinity), as
/// PyTorch's kernel computes it. `weight` broadcasts to the input and gets no
/// gradient (PyTorch's error if it requires one). The shapes of input and
/// target must match (PyTorch's error). On the CPU every input and target must
/// lie in `[0, 1]` (PyTorch's errors, NaN included); on a GPU they are not
/// read on the host (PyTorch's CUDA kernel stops the process there).
///
/// Under CUDA autocast this is PyTorch's error, as it is unsafe in half
/// precision: apply [`bce_with_logits`](super::bce_with_logits) to the logits
/// instead of a sigmoid followed by this. Under CPU autocast it runs in float32.
///
/// Autograd: `w·(x - y) / max(x·(1 - x), 1e-12)` for the input and
/// `-w·logit(x)` for the target, PyTorch's rules.
pub fn binary_cross_entropy(
    input: &Tensor,
    target: &Tensor,
    weight: Option<&Tensor>,
    reduction: Reduction,
) -> Result<Tensor> {
    let _record = crate::profiler::function("binary_cross_entropy");
    const OP: &str = "binary_cross_entropy";
    let on_cuda = [Some(input), Some(target), weight]
        .iter()
        .flatten()
        .any(|t| !t.device().is_cpu());
    if on_cuda && is_autocast_enabled(DeviceType::Cuda) {
        return Err(Error::invalid(
            OP,
            "binary_cross_entropy is unsafe to autocast: a sigmoid followed by it \
             rounds probabilities near 0 and 1 in half precision. Give the logits to \
             bce_with_logits (PyTorch's binary_cross_entropy_with_logits), which is \
             safe to autocast",
        ));
    }
    if target.shape() != input.shape() {
        return Err(Error::shape(
            OP,
            input.shape(),
            target.shape(),
            format!(
                "Using a target size ({:?}) that is different to the input size ({:?}) \
                 is deprecated. Please ensure they have the same size.",
                target.shape(),
                input.shape()
            ),
        ));
    }
    super::loss::not_differentiable(OP, OP, "weight", weight)?;
    let mut ts = vec![input, target];
    ts.extend(weight);
    if let Some(c) = crate::tensor::autocast::to_f32(&ts)? {
        return binary_cross_entropy(&c[0], &c[1], weight.map(|_| &c[2]), reduction);
    }
    floats(OP, &[input, target])?;
    if let Some(w) = weight {
        weight_broadcasts(OP, w, input.shape())?;
    }
    for (t, name) in [(input, "input"), (target, "target")] {
        if t.device().is_cpu() && t.numel() > 0 {
            let inside = t.ge(0.0)?.logical_and(&t.le(1.0)?)?;
            if !inside.all_all()?.item::<bool>()? {
                return Err(Error::invalid(
                    OP,
                    format!("all elements of {name} should be between 0 and 1"),
                ));
            }
        }
    }
    let (x, y) = (input, target);
    let l = no_grad(|| -> Result<Tensor> {
        // (y - 1)·max(log1p(-x), -100) - y·max(log x, -100), PyTorch's form
        let log_not = x.neg()?.log1p()?.clamp_min(-100.0)?;
        let log_x = x.log()?.clamp_min(-100.0)?;
        let l = y.sub(1.0)?.mul(&log_not)?.sub(&y.mul(&log_x)?)?;
        match weight {
            Some(w) => l.mul(w),
            None => Ok(l),
        }
    })?;
    let l = Tensor::record_twice(l, OP, &[x, y], |_| {
        let (xs, ys) = (x.save(), y.save());
        let w = weight.map(Tensor::detach);
        move |g: &Tensor| {
            let (x, y) = (&xs.value()?, &ys.value()?);
            // PyTorch's epsilon is the float 1e-12
            let eps = f64::from(1e-12f32);
            let denom = x.neg()?.add(1.0)?.mul(x)?.clamp_min(eps)?;
            let gx = g.mul(&x.sub(y)?)?.div(&denom)?;
            // -logit(x) = -log(x / (1 - x))
            let gy = g.mul(&x.div(&x.neg()?.add(1.0)?)?.log()?.neg()?)?;
            let (gx, gy) = match &w {
                Some(w) => (gx.mul(w)?, gy.mul(w)?),
                None => (gx, gy),
            };
            Ok(vec![Some(gx), Some(gy)])
        }
    });
    reduce(l, reduction)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Device;

    #[test]
    fn binary_cross_entropy_refuses_probabilities_outside_0_1_on_the_cpu() {
        let dev = Device::Cpu;
        let half = Tensor::new([0.5f32], &dev).unwrap();
        for bad in [1.5f32, -0.1, f32::NAN] {
            let x = Tensor::new([bad], &dev).unwrap();
            let e = binary_cross_entropy(&x, &half, None, Reduction::Mean).unwrap_err();
            assert!(
                e.to_string().contains("input should be between 0 and 1"),
                "{e}"
            );
            let e = binary_cross_entropy(&half, &x, None, Reduction::Mean).unwrap_err();
            assert!(
                e.to_string().contains("target should be between 0 and 1"),
                "{e}"
            );
        }
        let i = Tensor::new([1i64], &dev).unwrap();
        assert!(binary_cross_entropy(&i, &i, None, Reduction::Mean).is_err());
    }

    #[test]
    fn piecewise_losses_check_their_parameter() {
        let x = Tensor::new([0.5f32], &Device::Cpu).unwrap();
        assert!(smooth_l1_loss(&x, &x, Reduction::Mean, -1.0).is_err());
        assert!(huber_loss(&x, &x, Reduction::Mean, 0.0).is_err());
        let i = Tensor::new([1i64], &Device::Cpu).unwrap();
        assert!(kl_div(&i, &i, Reduction::Sum, false).is_err());
        assert!(huber_loss(&i, &i, Reduction::Sum, 1.0).is_err());
    }
}
