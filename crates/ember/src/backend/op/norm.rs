//! Normalisation's vocabulary: the affine part a fused layer norm applies, how
//! its weight and bias gradients are summed, and batch normalisation's
//! per-channel coefficient steps.

use super::{map_view, View};
use crate::error::Result;

/// Which normalisation [`norm_rows`](crate::backend::primitives::BackendStorage::norm_rows)
/// computes: centred (layer norm) or not (`rms`), with `eps` added to the
/// variance (the mean square).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct RowNorm {
    pub eps: f64,
    pub rms: bool,
}

/// What a norm's backward reads of its forward: the input rows `x` (a contiguous
/// view), each row's mean and rstd as the forward returned them, and the weight
/// (a contiguous `[cols]` view; absent: 1).
pub(crate) struct NormSaved<'a, S> {
    pub x: View<'a, S>,
    pub stats: &'a S,
    pub weight: Option<View<'a, S>>,
}

impl<'a, S> NormSaved<'a, S> {
    /// The same views of `f`'s storages (input, statistics, weight); the first
    /// error of `f` (an operand on another device) is returned.
    pub fn try_map<T: 'a>(
        self,
        mut f: impl FnMut(&'a S) -> Result<&'a T>,
    ) -> Result<NormSaved<'a, T>> {
        Ok(NormSaved {
            x: (f(self.x.0)?, self.x.1),
            stats: f(self.stats)?,
            weight: map_view(self.weight, &mut f)?,
        })
    }
}

/// Layer normalisation's elementwise affine part (`xhat · weight + bias`), each a
/// contiguous `[cols]` view of storage `S` in the rows' dtype; an absent part is
/// weight 1 or bias 0.
pub(crate) struct NormAffine<'a, S> {
    pub weight: Option<View<'a, S>>,
    pub bias: Option<View<'a, S>>,
}

/// `Clone` and `Copy` for structs of borrowed views of a storage `S` (deriving
/// them would ask `S` itself to be `Copy`).
macro_rules! views_copy {
    ($($t:ident),*) => {$(
        impl<S> Clone for $t<'_, S> {
            fn clone(&self) -> Self {
                *self
            }
        }
        impl<S> Copy for $t<'_, S> {}
    )*};
}
views_copy!(NormSaved, NormAffine, BnParams, BnGradIn);

/// What batch normalisation's per-channel coefficients are made of (see
/// [`batch_norm_coefs`](crate::backend::primitives::BackendStorage::batch_norm_coefs)):
/// the statistics it normalises with (mean and biased variance: the batch's or
/// the running ones), the weight and the bias (absent: 1 and 0), each a
/// contiguous `[c]` view in the statistics dtype.
pub(crate) struct BnParams<'a, S> {
    pub mean: View<'a, S>,
    pub var: View<'a, S>,
    pub weight: Option<View<'a, S>>,
    pub bias: Option<View<'a, S>>,
}

impl<'a, S> BnParams<'a, S> {
    /// The same views of `f`'s storages; the first error of `f` (an operand on
    /// another device) is returned.
    pub fn try_map<T: 'a>(
        self,
        mut f: impl FnMut(&'a S) -> Result<&'a T>,
    ) -> Result<BnParams<'a, T>> {
        Ok(BnParams {
            mean: (f(self.mean.0)?, self.mean.1),
            var: (f(self.var.0)?, self.var.1),
            weight: map_view(self.weight, &mut f)?,
            bias: map_view(self.bias, &mut f)?,
        })
    }
}

/// Running statistics that a training batch normalisation moves towards the
/// batch's in the same step as its coefficients: each (where present) a
/// contiguous `[c]` array of the statistics dtype at an element offset of its
/// storage, updated in place as `(1 - momentum) · running + momentum · batch`,
/// the batch's variance first multiplied by `unbiased` (`n / (n - 1)` for `n`
/// values a channel). The two are distinct storages, and neither is read as a
/// [`BnParams`] operand.
pub(crate) struct BnRunning<'a, S> {
    pub mean: Option<(&'a mut S, usize)>,
    pub var: Option<(&'a mut S, usize)>,
    pub momentum: f64,
    pub unbiased: f64,
}

impl<'a, S> BnRunning<'a, S> {
    /// The same arrays of `f`'s storages; the first error of `f` is returned.
    pub fn try_map<T: 'a>(
        self,
        mut f: impl FnMut(&'a mut S) -> Result<&'a mut T>,
    ) -> Result<BnRunning<'a, T>> {
        let mut at = |a: Option<(&'a mut S, usize)>| a.map(|(s, o)| Ok((f(s)?, o))).transpose();
        Ok(BnRunning {
            mean: at(self.mean)?,
            var: at(self.var)?,
            momentum: self.momentum,
            unbiased: self.unbiased,
        })
    }
}

/// What batch normalisation's backward coefficients are made of (see
/// [`batch_norm_grad_coefs`](crate::backend::primitives::BackendStorage::batch_norm_grad_coefs)):
/// the two per-channel sums of the output's gradient (`[2, c]`: `Σ g`, then
/// `Σ g · (x - mean)`), the forward's mean and inverse standard deviation, and the
/// weight (absent: 1), each contiguous in the statistics dtype. `count` is the
/// number of values a channel (`n · s`) where the forward normalised with the
/// batch's statistics (their gradient flows into the input's), `None` where it
/// used running ones.
pub(crate) struct BnGradIn<'a, S> {
    pub sums: View<'a, S>,
    pub mean: View<'a, S>,
    pub invstd: View<'a, S>,
    pub weight: Option<View<'a, S>>,
    pub count: Option<f64>,
}

impl<'a, S> BnGradIn<'a, S> {
    /// The same views of `f`'s storages; the first error of `f` is returned.
    pub fn try_map<T: 'a>(
        self,
        mut f: impl FnMut(&'a S) -> Result<&'a T>,
    ) -> Result<BnGradIn<'a, T>> {
        Ok(BnGradIn {
            sums: (f(self.sums.0)?, self.sums.1),
            mean: (f(self.mean.0)?, self.mean.1),
            invstd: (f(self.invstd.0)?, self.invstd.1),
            weight: map_view(self.weight, &mut f)?,
            count: self.count,
        })
    }
}

impl<'a, S> NormAffine<'a, S> {
    /// The same views of `f`'s storages (weight, then bias); the first error of
    /// `f` (an operand on another device) is returned.
    pub fn try_map<T: 'a>(
        self,
        mut f: impl FnMut(&'a S) -> Result<&'a T>,
    ) -> Result<NormAffine<'a, T>> {
        Ok(NormAffine {
            weight: map_view(self.weight, &mut f)?,
            bias: map_view(self.bias, &mut f)?,
        })
    }
}

/// How the weight and bias gradients of `rows` normalised rows are summed: in
/// `chunks` chunks of `per_chunk` consecutive rows (the last may be shorter), each
/// chunk's column sums a partial, the partials then summed in chunk order. The
/// same split on every device, so that their sums agree and `meta` knows the
/// CUDA launcher's workspace (`2 · chunks · cols` values of the statistics dtype).
pub(crate) fn norm_affine_chunks(rows: usize) -> (usize, usize) {
    // at least 32 rows a chunk, at most 64 chunks
    let per_chunk = rows.div_ceil(64).max(32);
    (rows.div_ceil(per_chunk).max(1), per_chunk)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_rows() {
        for rows in [0, 1, 31, 32, 33, 2047, 2048, 2049, 8192, 100_000] {
            let (chunks, per) = norm_affine_chunks(rows);
            assert!((1..=64).contains(&chunks) && per >= 32, "{rows}");
            assert!(chunks * per >= rows, "{rows}: {chunks} x {per}");
            assert!(
                rows == 0 || (chunks - 1) * per < rows,
                "{rows}: an empty chunk"
            );
        }
    }
}
