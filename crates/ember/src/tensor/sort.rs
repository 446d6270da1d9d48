//! Sorting and selecting: `sort`, `argsort`, `topk` and `median` (the `argsort`
//! primitive, the values gathered, so their gradient is gather's), `nonzero`,
//! `masked_select` and `multinomial` sampling.

use super::Tensor;
use crate::layout::normalize_dim;
use crate::{
    device::Device,
    dtype::DType,
    error::{Error, Result},
};

impl Tensor {
    /// The indices (int64) that sort this tensor along `dim` (`torch.argsort`,
    /// with `stable=True`: equal elements keep their order). NaN sorts above every
    /// number, as in PyTorch.
    pub fn argsort(&self, dim: i64, descending: bool) -> Result<Tensor> {
        let d = normalize_dim("argsort", dim, self.rank().max(1))?;
        if self.rank() == 0 {
            return Tensor::zeros((), DType::I64, &self.device());
        }
        let x = self.contiguous()?;
        let idx = x.read().argsort(x.layout(), d, descending)?;
        Ok(Tensor::from_storage(idx, self.shape()))
    }

    /// The values sorted along `dim` and the indices they came from
    /// (`torch.sort(t, dim, descending, stable=True)`). The gradient flows back to
    /// where each value came from.
    pub fn sort(&self, dim: i64, descending: bool) -> Result<(Tensor, Tensor)> {
        let idx = self.argsort(dim, descending)?;
        if self.rank() == 0 {
            return Ok((self.copy()?, idx));
        }
        let d = normalize_dim("sort", dim, self.rank())?;
        Ok((self.gather_valid(d, idx.clone())?, idx))
    }

    /// The `k` largest (or smallest, with `largest = false`) elements along `dim`,
    /// in sorted order, and their indices (`torch.topk(t, k, dim, largest,
    /// sorted=True)`). Among equal elements the first ones are taken.
    pub fn topk(&self, k: usize, dim: i64, largest: bool) -> Result<(Tensor, Tensor)> {
        let d = normalize_dim("topk", dim, self.rank().max(1))?;
        if self.dtype() == DType::Bool {
            // as PyTorch (sort and argsort take bools)
            return Err(Error::dtype(
                "topk",
                DType::Bool,
                "topk does not support bool dtypes (convert the input to an integer dtype first)",
            ));
        }
        let n = self.shape().get(d).copied().unwrap_or(1);
        if k > n {
            return Err(Error::invalid("topk", "selected index k out of range"));
        }
        if self.rank() == 0 {
            // k = 0 too gives the element itself, as in PyTorch
            return self.sort(0, largest);
        }
        let order = self.argsort(d as i64, largest)?;
        // gather takes indices that own their storage: the first k of each line
        // copied out (a narrowed view keeps the whole order's storage)
        let idx = if k == n {
            order
        } else {
            order.narrow(d as i64, 0, k)?.copy()?
        };
        Ok((self.gather_valid(d, idx.clone())?, idx))
    }

    /// The median of all elements (`torch.median(t)`), a 0-d tensor of this
    /// dtype: for an even count the lower of the two middle values, as
    /// PyTorch (not their mean). NaN anywhere gives NaN; an empty tensor gives
    /// NaN (int64's lowest value, uint8's 0: PyTorch's NaN converted). Bools
    /// are refused, as in PyTorch. The gradient is PyTorch's: shared evenly
    /// among the elements equal to the median (the NaNs, for a NaN median).
    ///
    /// ```
    /// # use ember::{Device, Tensor};
    /// let x = Tensor::new(&[4.0f32, 1.0, 3.0, 2.0], &Device::Cpu)?;
    /// assert_eq!(x.median()?.item::<f32>()?, 2.0);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn median(&self) -> Result<Tensor> {
        const OP: &str = "median";
        check_median_dtype(OP, "median_cpu", self.dtype())?;
        let dt = self.dtype();
        if self.numel() == 0 {
            let v = match dt {
                DType::I64 => Tensor::full((), i64::MIN, dt, &self.device())?,
                DType::U8 => Tensor::zeros((), dt, &self.device())?,
                _ => Tensor::full((), f64::NAN, dt, &self.device())?,
            };
            return Ok(Tensor::record_twice(v, OP, &[self], |_| {
                let (shape, dev) = (self.shape().to_vec(), self.device());
                move |_g: &Tensor| Ok(vec![Some(Tensor::zeros(&shape, dt, &dev)?)])
            }));
        }
        let out = crate::autograd::no_grad(|| -> Result<Tensor> {
            let flat = self.reshape([self.numel()])?;
            Ok(flat.median_dim(0, false)?.0)
        })?;
        Ok(Tensor::record_twice(out, OP, &[self], |y| {
            let (x, y) = (self.save(), y.save());
            move |g: &Tensor| {
                let (x, y) = (&x.value()?, &y.value()?);
                let mut mask = x.eq(y)?;
                if dt.is_float() {
                    mask = mask.logical_or(&x.isnan()?.logical_and(&y.isnan()?)?)?;
                }
                let count = mask.to_dtype(DType::I64)?.sum_all()?;
                Ok(vec![Some(mask.where_(&g.div(&count)?, 0.0)?)])
            }
        }))
    }

    /// The median along `dim` and its index in each line
    /// (`torch.median(t, dim, keepdim)`): the lower middle value of the line's
    /// sorted order; a line with NaN gives NaN and the index of its first NaN,
    /// as PyTorch. Among equal values the index is that of the first in the
    /// line (a stable sort's; PyTorch does not promise which). The gradient
    /// flows to the chosen element. An empty `dim` is refused (empty other dims
    /// give empty results), and so are bools, as in PyTorch.
    pub fn median_dim(&self, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)> {
        const OP: &str = "median";
        check_median_dtype(OP, "median_out", self.dtype())?;
        let d = normalize_dim(OP, dim, self.rank().max(1))?;
        if self.rank() == 0 {
            return Ok((self.copy()?, Tensor::zeros((), DType::I64, &self.device())?));
        }
        let n = self.shape()[d];
        if n == 0 {
            return Err(Error::invalid(
                OP,
                format!("median(): Expected reduction dim {d} to have non-zero size."),
            ));
        }
        let order = self.argsort(d as i64, false)?;
        let lower = (n - 1) / 2;
        let idx = if self.dtype().is_float() {
            // NaN sorts last: a line with c NaNs has its first at n - c
            let nans = self.isnan()?.to_dtype(DType::I64)?.sum([d as i64], true)?;
            let at = nans.gt(0)?.where_(&nans.rsub(n as i64)?, lower as i64)?;
            order.gather_valid(d, at)?
        } else {
            order.narrow(d as i64, lower as i64, 1)?.copy()?
        };
        let values = self.gather_valid(d, idx.clone())?;
        if keepdim {
            Ok((values, idx))
        } else {
            Ok((values.squeeze(d as i64)?, idx.squeeze(d as i64)?))
        }
    }

    /// The indices of the nonzero elements (`torch.nonzero`): an int64 tensor of
    /// shape `[count, rank]`, in row-major order. The count depends on the values,
    /// so a tensor on a GPU is read back (a synchronisation); a meta tensor has no
    /// values to count.
    pub fn nonzero(&self) -> Result<Tensor> {
        let flat = self.positions("nonzero")?;
        let rank = self.rank();
        let mut out = Vec::with_capacity(flat.len() * rank);
        for &f in &flat {
            let mut rest = f as usize;
            let at = out.len();
            out.resize(at + rank, 0);
            for d in (0..rank).rev() {
                let s = self.shape()[d];
                out[at + d] = (rest % s) as i64;
                rest /= s;
            }
        }
        Tensor::from_vec(out, [flat.len(), rank], &self.device())
    }

    /// The elements where `mask` (bool, broadcasting with this tensor) is true, as
    /// a 1-D tensor in row-major order (`torch.masked_select`). The count depends
    /// on the mask's values, which are read back to the host.
    pub fn masked_select(&self, mask: &Tensor) -> Result<Tensor> {
        super::same_device("masked_select", &[self, mask])?;
        if mask.dtype() != DType::Bool {
            return Err(Error::dtype(
                "masked_select",
                mask.dtype(),
                "masked_select: expected BoolTensor for mask",
            ));
        }
        let shape = crate::layout::broadcast_shapes("masked_select", self.shape(), mask.shape())?;
        let x = self.broadcast_to(&shape[..])?;
        let m = mask.broadcast_to(&shape[..])?;
        let at = m.positions("masked_select")?;
        let n = at.len();
        let idx = Tensor::from_vec(at, [n], &self.device())?;
        x.reshape([x.numel()])?.index_select_valid(0, idx)
    }

    /// Flat row-major positions of the nonzero elements, read on the host.
    fn positions(&self, op: &'static str) -> Result<Vec<i64>> {
        if !self.holds_values() {
            return Err(Error::MetaNoData {
                op,
                hint: "the result's size depends on the values",
            });
        }
        let nz = self.ne(0)?.to_vec::<bool>()?;
        Ok(nz
            .iter()
            .enumerate()
            .filter(|(_, &b)| b)
            .map(|(i, _)| i as i64)
            .collect())
    }

    /// Draws `num_samples` category indices from each row of non-negative weights
    /// (1-D: one distribution; 2-D: one per row), with or without replacement
    /// (`torch.multinomial`). Draws come from the generator in scope (the global
    /// one by default), on this tensor's device. The weights are checked as
    /// PyTorch does (finite, non-negative, a positive sum per row), which reads
    /// them back to the host; `num_samples` 0 is refused.
    pub fn multinomial(&self, num_samples: usize, replacement: bool) -> Result<Tensor> {
        const OP: &str = "multinomial";
        if !self.dtype().is_float() {
            return Err(Error::dtype(
                OP,
                self.dtype(),
                "multinomial only supports floating-point dtypes for input",
            ));
        }
        if self.rank() == 0 || self.rank() > 2 {
            return Err(Error::invalid(OP, "prob_dist must be 1 or 2 dim"));
        }
        let n = self.shape()[self.rank() - 1];
        if n == 0 {
            return Err(Error::invalid(
                OP,
                "the number of categories cannot be zero",
            ));
        }
        if num_samples == 0 {
            return Err(Error::invalid(OP, "cannot sample n_sample <= 0 samples"));
        }
        if !replacement && num_samples > n {
            return Err(Error::invalid(
                OP,
                "cannot sample n_sample > prob_dist.size(-1) samples without replacement",
            ));
        }
        // float64 weights stay float64 (their range and digits), the others race
        // in float32
        let work = if self.dtype() == DType::F64 {
            DType::F64
        } else {
            DType::F32
        };
        let p = crate::autograd::no_grad(|| self.detach().to_dtype(work))?;
        let rows = if self.rank() == 1 {
            p.reshape([1, n])?
        } else {
            p.clone()
        };
        if self.holds_values() {
            let bad = rows.isfinite()?.logical_not()?.logical_or(&rows.lt(0.0)?)?;
            if bad.any_all()?.item::<bool>()? {
                return Err(Error::invalid(
                    OP,
                    "probability tensor contains either `inf`, `nan` or element < 0",
                ));
            }
            if rows.sum(1, false)?.le(0.0)?.any_all()?.item::<bool>()? {
                return Err(Error::invalid(
                    OP,
                    "invalid multinomial distribution (sum of probabilities <= 0)",
                ));
            }
        }
        let r = rows.shape()[0];
        // the exponential race: category i wins with weight p_i / E_i, E_i ~ Exp(1)
        // independent; the winner is distributed as p / sum(p), and the order of the
        // first k is a draw of k without replacement
        let race = |shape: &[usize]| -> Result<Tensor> {
            let u = Tensor::rand(shape, &self.device())?;
            // 1 - u lies in (0, 1]: -log of it is finite, and kept above 0 (u = 0
            // would make a zero weight's 0 / 0 a NaN that wins the race)
            u.neg()?
                .add(1.0)?
                .log()?
                .neg()?
                .clamp_min(f32::MIN_POSITIVE as f64)
        };
        let out = if replacement {
            with_replacement(&rows, num_samples, &self.device())?
        } else {
            let e = race(&[r, n])?;
            rows.div(&e)?.topk(num_samples, -1, true)?.1
        };
        if self.rank() == 1 {
            out.reshape([num_samples])
        } else {
            Ok(out)
        }
    }
}

/// `num_samples` draws with replacement from each row of the weights `rows`
/// (`[r, n]`, checked): a uniform draw (from the device's generator) scaled to
/// the row's total, found among the running sums in float64, which is O(n + k
/// log n) a row (a race of k × n exponentials needed that memory). A category
/// of weight 0 is never drawn: its running sum equals the one before it.
fn with_replacement(rows: &Tensor, num_samples: usize, device: &Device) -> Result<Tensor> {
    let (r, n) = (rows.shape()[0], rows.shape()[1]);
    let u = Tensor::uniform(0.0, 1.0, [r, num_samples], DType::F64, device)?;
    if !rows.holds_values() {
        return u.to_dtype(DType::I64);
    }
    if *device != Device::Cpu {
        return on_device(rows, &u);
    }
    let weights = rows.to_vec::<f64>()?;
    let u = u.to_vec::<f64>()?;
    let mut out = Vec::with_capacity(r * num_samples);
    let mut sums = vec![0.0f64; n];
    for (w, u) in weights.chunks(n).zip(u.chunks(num_samples.max(1))) {
        let mut total = 0.0;
        for (s, &x) in sums.iter_mut().zip(w) {
            total += x;
            *s = total;
        }
        // (a draw that rounds up to the total takes the last category drawn)
        let last = w.iter().rposition(|&x| x > 0.0).unwrap_or(n - 1);
        out.extend(u.iter().map(|&u| {
            let at = u * total;
            sums.partition_point(|&s| s <= at).min(last) as i64
        }));
    }
    Tensor::from_vec(out, [r, num_samples], device)
}

/// [`with_replacement`] on a GPU, without a trip to the host: each draw
/// `u · total` is searched for among the running sums, all draws at once (a
/// binary search of log2(n) steps, each a gather of one sum per draw): the
/// first category whose running sum is above it. A draw past the last
/// category of positive weight (one that rounds up to the total) is that
/// category.
fn on_device(rows: &Tensor, u: &Tensor) -> Result<Tensor> {
    let (r, n, k) = (rows.shape()[0], rows.shape()[1], u.shape()[1]);
    let dev = rows.device();
    let sums = rows.cumsum_dtype(1, DType::F64)?;
    let at = u.mul(&sums.narrow(1, n as i64 - 1, 1)?)?;
    let index = Tensor::arange(0i64, n as i64, &dev)?;
    let last = rows
        .gt(0.0)?
        .to_dtype(DType::I64)?
        .mul(&index)?
        .max(1, true)?;
    // (indices as float64, exact far past any length)
    let mut lo = Tensor::zeros([r, k], DType::F64, &dev)?;
    let mut hi = Tensor::full([r, k], n as f64, DType::F64, &dev)?;
    let steps = usize::BITS - n.leading_zeros();
    for _ in 0..steps {
        let mid = lo.add(&hi)?.mul(0.5)?.floor()?;
        let probe = mid
            .clamp(Some(0.0), Some((n - 1) as f64))?
            .to_dtype(DType::I64)?;
        let below = sums.gather(1, &probe)?.le(&at)?;
        let active = lo.lt(&hi)?;
        let right = active.logical_and(&below)?;
        let left = active.logical_and(&below.logical_not()?)?;
        lo = right.where_(&mid.add(1.0)?, &lo)?;
        hi = left.where_(&mid, &hi)?;
    }
    lo.to_dtype(DType::I64)?.minimum(&last)
}

/// PyTorch's refusal of a bool median (its kernel `kernel` has no bool instance).
fn check_median_dtype(op: &'static str, kernel: &str, dt: DType) -> Result<()> {
    if dt == DType::Bool {
        return Err(super::elementwise::not_implemented_for(op, kernel, dt));
    }
    Ok(())
}
