//! Batch normalisation as one op with its own backward rule: two passes over the
//! input forward (the channels' statistics, then one affine map per channel) and
//! two backward (the channels' two sums, then one map of the gradient and the
//! input), the per-channel arithmetic on `[C]` tensors between them. It saves the
//! input and the statistics, as PyTorch's `native_batch_norm` does.

use super::Storages;
use crate::backend::op::{channel_shape, stat_dtype};
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
    /// input, whose running statistics stay as they are).
    pub(crate) fn batch_norm_op(
        &self,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        stats: BatchStats,
        eps: f64,
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
        super::same_device(op, &ts)?;
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
            let nan = Tensor::full([c], f64::NAN, sd, &self.device())?;
            return Ok((y, nan.clone(), nan));
        }
        let batch = matches!(stats, BatchStats::Batch);
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
                BatchStats::Running { mean, var } => (mean.to_dtype(sd)?, var.to_dtype(sd)?),
            };
            let invstd = var.add(eps)?.rsqrt()?;
            let w = weight.map(|w| w.to_dtype(sd)).transpose()?;
            let a = match &w {
                Some(w) => invstd.mul(w)?,
                None => invstd.clone(),
            };
            let shift = mean.mul(&a)?.neg()?;
            let d = match bias {
                Some(b) => shift.add(&b.to_dtype(sd)?)?,
                None => shift,
            };
            // the output (and the input's gradient) in the input's memory format
            let y = x.channel_affine(None, &Tensor::stack(&[&a, &d], 0)?, (&shape, cl))?;
            let y = y.laid_out(format)?;
            Ok((y, mean, var, invstd, w))
        })?;
        let (has_w, has_b) = (weight.is_some(), bias.is_some());
        let mut inputs: Vec<&Tensor> = vec![self];
        inputs.extend(weight);
        inputs.extend(bias);
        let (m, iv) = (mean.clone(), invstd.clone());
        // the rule reads the input's values, and of the parameters their dtypes
        let keep = [true, false, false];
        let y = Tensor::record_keeping(y, op, &inputs, &keep, move |_| {
            move |g: &Tensor, inp: &crate::autograd::Inputs| {
                let x = channel_view(inp.get(0)?, cl)?;
                let g = match cl {
                    true => channel_view(&g.to_memory_format(MemoryFormat::ChannelsLast)?, cl)?,
                    false => g.contiguous()?,
                };
                let sums = Tensor::channel_sums(&g, &x, &m)?;
                let (sum_g, sum_gx) = (sums.select(0, 0)?, sums.select(0, 1)?);
                let k = match &w {
                    Some(w) => iv.mul(w)?,
                    None => iv.clone(),
                };
                let gx = if inp.needs(0) {
                    let coefs = if batch {
                        // dx = k (g - Σg/m - (x - mean) invstd² Σg(x - mean)/m)
                        let m_ = (n * s) as f64;
                        let bq = k.mul(&iv.square()?)?.mul(&sum_gx)?.div(-m_)?;
                        let d = k.mul(&sum_g)?.div(-m_)?.sub(&m.mul(&bq)?)?;
                        Tensor::stack(&[&k, &bq, &d], 0)?
                    } else {
                        Tensor::stack(&[&k, &k.zeros_like()?], 0)?
                    };
                    let q = batch.then_some(&x);
                    let gx = g.channel_affine(q, &coefs, (&shape, cl))?;
                    Some(gx.laid_out(format)?)
                } else {
                    None
                };
                let mut grads = vec![gx];
                if has_w {
                    grads.push(
                        inp.needs(1)
                            .then(|| sum_gx.mul(&iv)?.to_dtype(inp.dtype(1)))
                            .transpose()?,
                    );
                }
                if has_b {
                    let i = 1 + has_w as usize;
                    grads.push(
                        inp.needs(i)
                            .then(|| sum_g.to_dtype(inp.dtype(i)))
                            .transpose()?,
                    );
                }
                Ok(grads)
            }
        });
        Ok((y, mean, var))
    }

    /// [`BackendStorage::channel_affine`](crate::backend::primitives) of this
    /// contiguous tensor (and `q`, contiguous, of its shape) with `coefs` `[k, C]`,
    /// as a tensor of `dims` (the input's shape) in channels-last order where `cl`
    /// (this tensor then being [`channel_view`]'s view), else row-major.
    fn channel_affine(
        &self,
        q: Option<&Tensor>,
        coefs: &Tensor,
        (dims, cl): (&[usize], bool),
    ) -> Result<Tensor> {
        let coefs = coefs.contiguous()?;
        let mut ts = vec![self, &coefs];
        ts.extend(q);
        let st = Storages::read(&ts);
        let q = q.map(|q| (st.get(2), q.layout()));
        let out = st
            .get(0)
            .channel_affine(self.layout(), q, (st.get(1), coefs.layout()))?;
        Ok(Tensor::from_storage_in(out, dims, cl))
    }

    /// `[2, C]`: per channel `Σ g` and `Σ g · (x - mean)` of contiguous `g` and `x`.
    fn channel_sums(g: &Tensor, x: &Tensor, mean: &Tensor) -> Result<Tensor> {
        let c = channel_shape(g.shape()).1;
        let mean = mean.contiguous()?;
        let st = Storages::read(&[g, x, &mean]);
        let out = st.get(0).channel_dot(
            g.layout(),
            (st.get(1), x.layout()),
            (st.get(2), mean.layout()),
        )?;
        Ok(Tensor::from_storage(out, &[2, c]))
    }
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
