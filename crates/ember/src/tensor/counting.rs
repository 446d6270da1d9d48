//! Ordering and counting: `msort`, `kthvalue` (composites of `argsort` and
//! `gather`, so `kthvalue`'s values carry gather's gradient), and
//! `searchsorted` and `bucketize` (one primitive: a binary search per value).

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
    /// same probes, so the same answer for a sequence with NaNs in it), one
    /// thread per value on a GPU; the two tensors compare in their promoted dtype.
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
        let dtype = DType::promote(self.dtype(), values.dtype());
        if dtype == DType::Bool {
            return Err(crate::tensor::not_implemented_for(
                OP,
                "searchsorted_out_cpu",
                dtype,
            ));
        }
        let m = *seq.last().unwrap_or(&0);
        let n = values.numel();
        if m == 0 || n == 0 {
            return Tensor::zeros(vshape, DType::I64, &values.device());
        }
        // both in the dtype they compare in (PyTorch's promotion), contiguous, one
        // row of values per sequence; the search itself is one primitive
        let (s, v) = crate::autograd::no_grad(|| {
            Ok::<_, Error>((
                self.to_dtype(dtype)?.contiguous()?,
                values.to_dtype(dtype)?.contiguous()?,
            ))
        })?;
        let rows = self.numel() / m;
        let out = {
            let st = super::Storages::read(&[&s, &v]);
            st.get(0)
                .searchsorted(s.layout(), st.get(1), v.layout(), (m, n / rows), right)?
        };
        Ok(Tensor::from_storage(out, vshape))
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
