//! Row normalisation's vocabulary: the affine part a fused layer norm applies,
//! and how its weight and bias gradients are summed.

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
views_copy!(NormSaved, NormAffine);

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
