//! Batch normalisation as one op with its own backward rule: two passes over the
//! input forward (the channels' statistics, then one affine map per channel) and
//! two backward (the channels' two sums, then one map of the gradient and the
//! input), the per-channel arithmetic on `[C]` tensors between them. It saves the
//! input and the statistics, as PyTorch's `native_batch_norm` does.

use super::Storages;
use crate::backend::op::{channel_shape, stat_dtype, BnGradIn, BnParams, BnRunning};
use crate::backend::Storage;
use crate::dtype::DType;
use crate::layout::MemoryFormat;
use crate::{
    error::{Error, Result},
    tensor::Tensor,
};

/// Where a batch normalisation takes its statistics from.
#[derive(Clone, Copy)]
pub(crate) enum BatchStats<'a> {
    /// The batch's own (training): the input's gradient flows through them.
    Batch,
    /// Running estimates (evaluation): constants.
    Running { mean: &'a Tensor, var: &'a Tensor },
}

impl Tensor {
    /// `(x - mean) / sqrt(var + eps) · weight + bias` per channel (dim 1) of an
    /// input `[N, C, ...]` of a float dtype, with the batch's statistics (biased
    /// variance) or running ones. Returns the output (the input's dtype, as
    /// PyTorch's for a half-precision input with float32 parameters) and the
    /// statistics used, `[C]` each in the statistics dtype (float64 for float64
    /// inputs, else float32): the mean and the biased variance (NaN for an empty
    /// input, whose running statistics stay as they are). With the batch's
    /// statistics, `update`'s running statistics move towards them (in the
    /// coefficients' launch where they are contiguous arrays of the statistics
    /// dtype on the input's device, else by tensor ops). With `residual` (of the
    /// input's shape and dtype) it is added to the output in the same pass, and
    /// with `relu` the output goes through a ReLU there (`relu(batch_norm(x) +
    /// residual)`); the backward masks the gradient by it in its passes, or with
    /// a residual (which gets the masked gradient) once before them (the rule
    /// keeps the output, as an in-place ReLU's does).
    pub(crate) fn batch_norm_op(
        &self,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        (stats, update): (BatchStats, Option<RunningUpdate>),
        (eps, relu, residual): (f64, bool, Option<&Tensor>),
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let op = "batch_norm";
        if !self.dtype().is_float() || self.rank() < 2 {
            return Err(Error::dtype(
                op,
                self.dtype(),
                "batch normalisation needs a floating-point input [N, C, ...]",
            ));
        }
        let (n, c, s) = channel_shape(self.shape());
        let mut ts = vec![self];
        ts.extend(weight);
        ts.extend(bias);
        if let BatchStats::Running { mean, var } = stats {
            ts.extend([mean, var]);
        }
        ts.extend(residual);
        super::same_device(op, &ts)?;
        if let Some(r) = residual {
            if r.shape() != self.shape() || r.dtype() != self.dtype() {
                return Err(Error::shape(
                    op,
                    r.shape(),
                    self.shape(),
                    format!(
                        "the residual ({}) must have the input's shape and dtype ({})",
                        r.dtype(),
                        self.dtype()
                    ),
                ));
            }
        }
        for (t, what) in [(weight, "weight"), (bias, "bias")] {
            if let Some(t) = t {
                if t.shape() != [c] {
                    return Err(Error::shape(
                        op,
                        t.shape(),
                        &[c],
                        format!("the {what} must have one value per channel ({c})"),
                    ));
                }
            }
        }
        if let BatchStats::Running { mean, var } = stats {
            if mean.shape() != [c] || var.shape() != [c] {
                return Err(Error::shape(
                    op,
                    mean.shape(),
                    &[c],
                    "the running mean and variance must have one value per channel",
                ));
            }
        }
        let sd = stat_dtype(self.dtype());
        if self.numel() == 0 {
            // PyTorch's empty input: the output is the input through the
            // parameters' first values (so that they get gradients, zeros), and
            // the statistics NaN; callers keep their running ones as they were
            let mut y = self.copy()?;
            for (t, add) in [(weight, false), (bias, true)] {
                if let Some(t) = t.filter(|_| c > 0) {
                    let first = t.select(0, 0)?.to_dtype(self.dtype())?;
                    y = if add { y.add(&first)? } else { y.mul(&first)? };
                }
            }
            // (the residual and the ReLU as tensor ops: the residual gets its
            // empty gradient too)
            if let Some(r) = residual {
                y = y.add(r)?;
            }
            if relu {
                y = y.relu()?;
            }
            let nan = Tensor::full([c], f64::NAN, sd, &self.device())?;
            return Ok((y, nan.clone(), nan));
        }
        let batch = matches!(stats, BatchStats::Batch);
        // the running statistics move in the coefficients' launch where they can
        // be written there (else by tensor ops after it)
        // a checkpointed region's recomputation has moved them already
        let update = update.filter(|_| batch && !crate::autograd::is_recomputing());
        let unbiased = {
            let m = (n * s) as f64;
            m / (m - 1.0)
        };
        let fused = update.filter(|u| self.running_fuses(u, sd, &[weight, bias]));
        let format = self.suggest_memory_format();
        // a dense channels-last input is normalised as it lies: `[n, h, w, c]` in
        // memory is `[n·h·w, c, 1]` to the per-channel primitives, and the results
        // come out channels-last without copies
        let cl = self.rank() == 4
            && !self.is_contiguous()
            && self.is_contiguous_in(MemoryFormat::ChannelsLast);
        let shape = self.shape().to_vec();
        let (y, mean, var, invstd, w) = crate::autograd::no_grad(|| -> Result<_> {
            let x = channel_view(self, cl)?;
            let (mean, var) = match stats {
                BatchStats::Batch => {
                    let st = x.map_storage(&[2, c], |s, l| s.channel_stats(l))?;
                    (st.select(0, 0)?, st.select(0, 1)?)
                }
                BatchStats::Running { mean, var } => (
                    mean.to_dtype(sd)?.contiguous()?,
                    var.to_dtype(sd)?.contiguous()?,
                ),
            };
            let param = |p: Option<&Tensor>| p.map(|p| p.to_dtype(sd)?.contiguous()).transpose();
            let (w, b) = (param(weight)?, param(bias)?);
            let running = fused.map(|u| (u, unbiased));
            let coefs = coefs((&mean, &var), (w.as_ref(), b.as_ref()), running, eps)?;
            // the output (and the input's gradient) in the input's memory format
            let r = residual.map(|r| channel_view(r, cl)).transpose()?;
            let ad = coefs.narrow(0, 0, 2)?;
            let y = x.channel_affine((r.as_ref(), None), &ad, (&shape, cl, relu))?;
            let y = y.laid_out(format)?;
            Ok((y, mean, var, coefs.select(0, 2)?, w))
        })?;
        if let Some(u) = update.filter(|_| fused.is_none()) {
            update_running_stats(
                (u.mean, u.var),
                (&mean, &var),
                n * s,
                Momentum::Fixed(u.momentum),
            )?;
        }
        let (has_w, has_b) = (weight.is_some(), bias.is_some());
        let mut inputs: Vec<&Tensor> = vec![self];
        inputs.extend(weight);
        inputs.extend(bias);
        inputs.extend(residual);
        let has_r = residual.is_some();
        let (m, iv) = (mean.clone(), invstd.clone());
        // the rule reads the input's values, and of the residual its dtype; the
        // weight's values only in a walk that creates a graph (where the
        // gradients are functions of it), a reference the parameter's owner
        // holds anyway
        let keep = [true, has_w, false, false];
        let y = Tensor::record_keeping_twice(y, op, &inputs, &keep, move |out| {
            // (with the ReLU its output, whose sign masks the gradient)
            let out = relu.then(|| out.save());
            move |g: &Tensor, inp: &crate::autograd::Inputs| {
                let y = out.as_ref().map(|y| y.get()).transpose()?;
                if crate::autograd::creating_graph() {
                    let stats = (!batch).then_some((&m, &iv));
                    let flags = (has_w, has_b, has_r);
                    return batch_norm_grads_recorded(g, inp, y, (stats, eps), flags);
                }
                let x = channel_view(inp.get(0)?, cl)?;
                // with a residual the masked gradient is made once (it is the
                // residual's too); without, the passes below mask as they read
                let (g, y) = match (has_r, y) {
                    (true, Some(y)) => (g.relu_backward(y)?, None),
                    _ => (g.clone(), y),
                };
                let g_res = has_r.then(|| g.clone());
                let g = match cl {
                    true => channel_view(&g.to_memory_format(MemoryFormat::ChannelsLast)?, cl)?,
                    false => g.contiguous()?,
                };
                let mask = y.map(|y| channel_view(y, cl)).transpose()?;
                let mask = mask.as_ref();
                let sums = Tensor::channel_sums(&g, &x, &m, mask)?;
                let count = batch.then_some((n * s) as f64);
                let weight_grad = has_w && inp.needs(1);
                let (coefs, gw) = grad_coefs(&sums, (&m, &iv, w.as_ref()), count, weight_grad)?;
                let gx = if inp.needs(0) {
                    // (k, b, d) of `g · k + x · b + d`, or with running statistics
                    // (k, 0) of `g · k + 0`
                    let coefs = coefs.narrow(0, 0, if batch { 3 } else { 2 })?;
                    let q = batch.then_some(&x);
                    let gx = g.channel_affine((q, mask), &coefs, (&shape, cl, false))?;
                    Some(gx.laid_out(format)?)
                } else {
                    None
                };
                let mut grads = vec![gx];
                if has_w {
                    grads.push(gw.map(|gw| gw.to_dtype(inp.dtype(1))).transpose()?);
                }
                if has_b {
                    let i = 1 + has_w as usize;
                    grads.push(
                        inp.needs(i)
                            .then(|| sums.select(0, 0)?.to_dtype(inp.dtype(i)))
                            .transpose()?,
                    );
                }
                if let Some(gr) = g_res {
                    let i = 1 + has_w as usize + has_b as usize;
                    grads.push(inp.needs(i).then_some(gr));
                }
                Ok(grads)
            }
        });
        Ok((y, mean, var))
    }

    /// [`BackendStorage::channel_affine`](crate::backend::primitives) of this
    /// contiguous tensor (and `q` and the ReLU `mask`, contiguous, of its shape)
    /// with `coefs` `[k, C]`, through a ReLU with `relu`, as a tensor of `dims`
    /// (the input's shape) in channels-last order where `cl` (this tensor then
    /// being [`channel_view`]'s view), else row-major.
    fn channel_affine(
        &self,
        (q, mask): (Option<&Tensor>, Option<&Tensor>),
        coefs: &Tensor,
        (dims, cl, relu): (&[usize], bool, bool),
    ) -> Result<Tensor> {
        let coefs = coefs.contiguous()?;
        let mut ts = vec![self, &coefs];
        ts.extend(q);
        ts.extend(mask);
        let st = Storages::read(&ts);
        let q = q.map(|q| (st.get(2), q.layout()));
        let mask = mask.map(|m| (st.get(ts.len() - 1), m.layout()));
        let out = st.get(0).channel_affine(
            self.layout(),
            q,
            (st.get(1), coefs.layout()),
            (relu, mask),
        )?;
        Ok(Tensor::from_storage_in(out, dims, cl))
    }

    /// `[2, C]`: per channel `Σ g` and `Σ g · (x - mean)` of contiguous `g` and `x`
    /// (with the ReLU `mask`, contiguous, `g` where it is above 0).
    fn channel_sums(
        g: &Tensor,
        x: &Tensor,
        mean: &Tensor,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let c = channel_shape(g.shape()).1;
        let mean = mean.contiguous()?;
        let mut ts = vec![g, x, &mean];
        ts.extend(mask);
        let st = Storages::read(&ts);
        let out = st.get(0).channel_dot(
            g.layout(),
            (st.get(1), x.layout()),
            (st.get(2), mean.layout()),
            mask.map(|m| (st.get(3), m.layout())),
        )?;
        Ok(Tensor::from_storage(out, &[2, c]))
    }
}

/// Batch normalisation's gradients in recorded ops (differentiable again: the
/// rule a walk that creates a graph runs), for the output's gradient `g`: the
/// input's, the weight's, the bias's and the residual's, those the node needs.
/// With the batch's statistics (`running` `None`) they are recomputed from the
/// input, so that the gradient's dependence on them is recorded too; running
/// statistics are constants. With the ReLU its output `relu_out` masks `g` (a
/// constant mask). Computed in the statistics dtype (float32 for half inputs),
/// each gradient returned in its input's dtype.
fn batch_norm_grads_recorded(
    g: &Tensor,
    inp: &crate::autograd::Inputs,
    relu_out: Option<&Tensor>,
    (running, eps): (Option<(&Tensor, &Tensor)>, f64),
    (has_w, has_b, has_r): (bool, bool, bool),
) -> Result<crate::autograd::Grads> {
    let x = inp.get(0)?;
    let sd = stat_dtype(x.dtype());
    let g = match relu_out {
        Some(y) => y.detach().gt(0.0)?.where_(g, 0.0)?,
        None => g.clone(),
    };
    let rank = x.rank();
    let dims: Vec<i64> = (0..rank as i64).filter(|&d| d != 1).collect();
    let mut per_channel = vec![1; rank];
    per_channel[1] = x.shape()[1];
    let col = |t: &Tensor| t.reshape(&per_channel[..]);
    let (xf, gf) = (x.to_dtype(sd)?, g.to_dtype(sd)?);
    let (centred, rstd) = match running {
        None => {
            let centred = xf.sub(&xf.mean(&dims[..], true)?)?;
            let var = centred.square()?.mean(&dims[..], true)?;
            (centred, var.add(eps)?.rsqrt()?)
        }
        Some((mean, invstd)) => (xf.sub(&col(mean)?)?, col(invstd)?),
    };
    let xhat = centred.mul(&rstd)?;
    let gx = inp
        .needs(0)
        .then(|| -> Result<Tensor> {
            let gh = match has_w {
                true => gf.mul(&col(&inp.get(1)?.to_dtype(sd)?)?)?,
                false => gf.clone(),
            };
            let inner = match running {
                None => gh
                    .sub(&gh.mean(&dims[..], true)?)?
                    .sub(&xhat.mul(&gh.mul(&xhat)?.mean(&dims[..], true)?)?)?,
                Some(_) => gh,
            };
            inner.mul(&rstd)?.to_dtype(x.dtype())
        })
        .transpose()?;
    let mut grads = vec![gx];
    let mut i = 1;
    if has_w {
        let gw = inp.needs(i).then(|| gf.mul(&xhat)?.sum(&dims[..], false));
        grads.push(
            gw.transpose()?
                .map(|t| t.to_dtype(inp.dtype(1)))
                .transpose()?,
        );
        i += 1;
    }
    if has_b {
        let gb = inp.needs(i).then(|| gf.sum(&dims[..], false));
        grads.push(
            gb.transpose()?
                .map(|t| t.to_dtype(inp.dtype(i)))
                .transpose()?,
        );
        i += 1;
    }
    if has_r {
        grads.push(inp.needs(i).then_some(g));
    }
    Ok(grads)
}

/// Running statistics that a training batch normalisation moves towards the
/// batch's with a fixed momentum: `running = (1 - momentum) · running + momentum
/// · batch`, the batch's variance made unbiased.
#[derive(Clone, Copy)]
pub(crate) struct RunningUpdate<'a> {
    pub mean: Option<&'a Tensor>,
    pub var: Option<&'a Tensor>,
    pub momentum: f64,
}

impl Tensor {
    /// Whether `u`'s running statistics can be written by the coefficients'
    /// launch for this input: each a contiguous `[C]` array of the statistics
    /// dtype `sd` on this device, in a storage of its own (not this input's, not
    /// one of `params`', not the other statistic's).
    fn running_fuses(&self, u: &RunningUpdate, sd: DType, params: &[Option<&Tensor>]) -> bool {
        let c = self.shape()[1];
        let ok = |r: &Tensor| {
            r.dtype() == sd
                && r.shape() == [c]
                && r.is_contiguous()
                && r.device() == self.device()
                && !r.same_storage(self)
                && params.iter().flatten().all(|p| !r.same_storage(p))
        };
        let apart = match (u.mean, u.var) {
            (Some(m), Some(v)) => !m.same_storage(v),
            _ => true,
        };
        apart && u.mean.is_none_or(ok) && u.var.is_none_or(ok)
    }
}

/// [`BackendStorage::batch_norm_coefs`](crate::backend::primitives) of `[C]`
/// contiguous statistics and parameters in the statistics dtype: `[3, C]` (`a`,
/// `d`, the inverse standard deviation), with `running`'s statistics (checked by
/// [`Tensor::running_fuses`]) moved in the same launch, `unbiased` times the
/// batch's variance.
fn coefs(
    (mean, var): (&Tensor, &Tensor),
    (w, b): (Option<&Tensor>, Option<&Tensor>),
    running: Option<(RunningUpdate, f64)>,
    eps: f64,
) -> Result<Tensor> {
    let c = mean.numel();
    let mut ts = vec![mean, var];
    ts.extend(w);
    ts.extend(b);
    let st = Storages::read(&ts);
    let view = |i: usize| (st.get(i), ts[i].layout());
    let p = BnParams {
        mean: view(0),
        var: view(1),
        weight: w.map(|_| view(2)),
        bias: b.map(|_| view(ts.len() - 1)),
    };
    let (u, unbiased) = match running {
        Some((u, unbiased)) => (Some(u), unbiased),
        None => (None, 1.0),
    };
    let (rm, rv) = (u.and_then(|u| u.mean), u.and_then(|u| u.var));
    let (mut gm, mut gv) = (rm.map(|r| r.write()), rv.map(|r| r.write()));
    let at = |r: Option<&Tensor>| r.map_or(0, |r| r.layout().offset());
    let (om, ov) = (at(rm), at(rv));
    let running = BnRunning {
        mean: gm.as_deref_mut().map(|g| (g, om)),
        var: gv.as_deref_mut().map(|g| (g, ov)),
        momentum: u.map_or(0.0, |u| u.momentum),
        unbiased,
    };
    let out = Storage::batch_norm_coefs(p, running, eps)?;
    Ok(Tensor::from_storage(out, &[3, c]))
}

/// [`BackendStorage::batch_norm_grad_coefs`](crate::backend::primitives) of the
/// `[2, C]` sums and the forward's mean, inverse standard deviation and weight
/// (contiguous, in the statistics dtype): `[3, C]` (`k`, `b`, `d`) and, with
/// `weight_grad`, the weight's gradient `[C]`. `count` is the values a channel
/// where the forward used the batch's statistics.
fn grad_coefs(
    sums: &Tensor,
    (mean, invstd, w): (&Tensor, &Tensor, Option<&Tensor>),
    count: Option<f64>,
    weight_grad: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let c = mean.numel();
    let mut ts = vec![sums, mean, invstd];
    ts.extend(w);
    let st = Storages::read(&ts);
    let view = |i: usize| (st.get(i), ts[i].layout());
    let p = BnGradIn {
        sums: view(0),
        mean: view(1),
        invstd: view(2),
        weight: w.map(|_| view(3)),
        count,
    };
    let (coefs, gw) = Storage::batch_norm_grad_coefs(p, weight_grad)?;
    Ok((
        Tensor::from_storage(coefs, &[3, c]),
        gw.map(|gw| Tensor::from_storage(gw, &[c])),
    ))
}

/// How far running statistics move towards a batch's: a fixed factor, or a
/// cumulative average's `1 / batches` as a float64 scalar tensor (computed on the
/// device rather than read back).
pub(crate) enum Momentum<'a> {
    Fixed(f64),
    Cumulative(&'a Tensor),
}

/// In place, `running = (1 - m) · running + m · batch` for the mean and, with the
/// batch's biased variance over `n` values made unbiased (`n / (n - 1)`), for the
/// variance, by tensor ops; the batch's statistics are first rounded to the
/// running ones' dtype.
pub(crate) fn update_running_stats(
    (running_mean, running_var): (Option<&Tensor>, Option<&Tensor>),
    (mean, var): (&Tensor, &Tensor),
    n: usize,
    m: Momentum,
) -> Result<()> {
    if crate::autograd::is_recomputing() {
        // (the forward pass of a checkpointed region moved them already)
        return Ok(());
    }
    let unbiased = n as f64 / (n - 1) as f64;
    crate::autograd::no_grad(|| -> Result<()> {
        for (running, batch, scale) in [(running_mean, mean, 1.0), (running_var, var, unbiased)] {
            let Some(r) = running else { continue };
            let b = batch.to_dtype(r.dtype())?;
            match m {
                Momentum::Fixed(m) => {
                    r.mul_(1.0 - m)?;
                    r.add_(&b.mul(m * scale)?)?;
                }
                Momentum::Cumulative(m) => {
                    r.mul_(&m.neg()?.add(1.0)?.to_dtype(r.dtype())?)?;
                    r.add_(&b.mul(&m.mul(scale)?.to_dtype(r.dtype())?)?)?;
                }
            }
        }
        Ok(())
    })
}

/// `t` as the per-channel primitives read it: row-major (copied if need be), or
/// for a dense channels-last `[n, c, h, w]` (`cl`) the view `[n·h·w, c, 1]` of its
/// memory.
fn channel_view(t: &Tensor, cl: bool) -> Result<Tensor> {
    if !cl {
        return t.contiguous();
    }
    let [n, c, h, w] = [t.shape()[0], t.shape()[1], t.shape()[2], t.shape()[3]];
    t.permute([0, 2, 3, 1])?.reshape([n * h * w, c, 1])
}
