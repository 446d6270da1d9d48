//! Ordering and counting: `msort`, `kthvalue`, `searchsorted` and `bucketize`,
//! composites of `argsort`, `gather` and comparisons, so they run on every
//! device (meta included) and `kthvalue`'s values carry gather's gradient.

use super::Tensor;
use crate::layout::normalize_dim;
use crate::{
    dtype::DType,
    error::{Error, Result},
};

impl Tensor {
    /// The tensor sorted along its first dim, ascending (`torch.msort`); the
    /// gradient flows back to where each value came from.
    pub fn msort(&self) -> Result<Tensor> {
        Ok(self.sort(0, false)?.0)
    }

    /// The `k`-th smallest value (1-based) along `dim` and its index
    /// (`torch.kthvalue(t, k, dim, keepdim)`). Among equal values the index
    /// is that of the first in a stable sort (PyTorch does not promise which);
    /// NaN sorts above every number. The gradient flows to the chosen element.
    pub fn kthvalue(&self, k: usize, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)> {
        const OP: &str = "kthvalue";
        let d = normalize_dim(OP, dim, self.rank().max(1))?;
        let n = self.shape().get(d).copied().unwrap_or(1);
        if k < 1 || k > n {
            return Err(Error::invalid(
                OP,
                format!("kthvalue(): selected number k out of range for dimension {d}"),
            ));
        }
        if self.rank() == 0 {
            return Ok((self.copy()?, Tensor::zeros((), DType::I64, &self.device())?));
        }
        let order = self.argsort(d as i64, false)?;
        let idx = order.narrow(d as i64, k as i64 - 1, 1)?.copy()?;
        let values = self.gather_valid(d, idx.clone())?;
        if keepdim {
            Ok((values, idx))
        } else {
            Ok((values.squeeze(d as i64)?, idx.squeeze(d as i64)?))
        }
    }

    /// Where each of `values` would go in `self`, a sequence sorted along its
    /// last dim, to keep it sorted (`torch.searchsorted(self, values, right=right)`):
    /// the first such place, or with `right` the last. `self` is 1-D (any
    /// `values` shape) or has the leading dims of `values`. The result is int64
    /// of `values`' shape (ember has no int32, so no `out_int32`); a NaN value
    /// goes past every element, as in PyTorch. A binary search, PyTorch's (the
    /// same probes, so the same answer for a sequence with NaNs in it): `log2`
    /// of the sequence's length steps, each one gather per value.
    pub fn searchsorted(&self, values: &Tensor, right: bool) -> Result<Tensor> {
        const OP: &str = "searchsorted";
        let (seq, vshape) = (self.shape(), values.shape());
        let leading_match = seq.len() == vshape.len()
            && !seq.is_empty()
            && seq[..seq.len() - 1] == vshape[..vshape.len() - 1];
        if seq.len() != 1 && !leading_match {
            return Err(Error::invalid(
                OP,
                format!(
                    "torch.searchsorted(): boundaries tensor should be 1 dimension or the first \
                     N-1 dimensions of boundaries tensor and input value tensor must match, but \
                     we got boundaries tensor {seq:?} and input value tensor {vshape:?}"
                ),
            ));
        }
        crate::autograd::no_grad(|| {
            let m = *seq.last().unwrap_or(&0);
            let (n, out_shape) = (values.numel(), vshape.to_vec());
            if m == 0 || n == 0 {
                return Tensor::zeros(&out_shape[..], DType::I64, &values.device());
            }
            // one row of values per sequence
            let rows = self.numel() / m;
            let (s, v) = (self.reshape([rows, m])?, values.reshape([rows, n / rows])?);
            // [lo, hi) holds the answer; each step halves it by one gather per value
            let mut lo = v.zeros_like()?.to_dtype(DType::I64)?;
            let mut hi = lo.add(m as i64)?;
            for _ in 0..usize::BITS - m.leading_zeros() {
                let mid = lo.add(&hi)?.floor_divide(2i64)?;
                let at = s.gather(1, &mid.minimum((m - 1) as i64)?)?;
                // PyTorch's bounds: an element goes before the value unless it is
                // at or above it (above it, with `right`), so a NaN element goes
                // before every value and a NaN value after every element
                let before = match right {
                    true => at.gt(&v)?,
                    false => at.ge(&v)?,
                }
                .logical_not()?;
                let open = lo.lt(&hi)?;
                lo = open.logical_and(&before)?.where_(&mid.add(1i64)?, &lo)?;
                hi = open
                    .logical_and(&before.logical_not()?)?
                    .where_(&mid, &hi)?;
            }
            lo.reshape(&out_shape[..])
        })
    }

    /// The bucket of each element among sorted 1-D `boundaries`
    /// (`torch.bucketize(self, boundaries, right=right)`): `searchsorted` with
    /// the roles swapped; int64.
    pub fn bucketize(&self, boundaries: &Tensor, right: bool) -> Result<Tensor> {
        if boundaries.rank() != 1 {
            return Err(Error::invalid(
                "bucketize",
                format!(
                    "boundaries tensor must be 1 dimension, but got dim({})",
                    boundaries.rank()
                ),
            ));
        }
        boundaries.searchsorted(self, right)
    }
}
