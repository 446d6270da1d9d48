//! Arguments that describe shapes and dims, so `[2, 3]`, `vec![2, 3]`, `&[2, -1]`
//! and `t.shape()` all work where a shape is expected.

use crate::error::{Error, Result};
use crate::layout::{checked_numel, normalize_dim, Dims};
use smallvec::SmallVec;

/// A shape argument; `-1` is allowed where PyTorch allows it (`reshape`, `expand`).
pub trait IntoShape {
    /// The sizes as signed integers.
    fn to_spec(&self) -> SmallVec<[i64; 6]>;
}

macro_rules! shape_impls {
    ($($t:ty),*) => {$(
        impl<const N: usize> IntoShape for [$t; N] {
            fn to_spec(&self) -> SmallVec<[i64; 6]> { self.iter().map(|&d| d as i64).collect() }
        }
        impl IntoShape for &[$t] {
            fn to_spec(&self) -> SmallVec<[i64; 6]> { self.iter().map(|&d| d as i64).collect() }
        }
        impl<const N: usize> IntoShape for &[$t; N] {
            fn to_spec(&self) -> SmallVec<[i64; 6]> { self.iter().map(|&d| d as i64).collect() }
        }
        impl IntoShape for Vec<$t> {
            fn to_spec(&self) -> SmallVec<[i64; 6]> { self.iter().map(|&d| d as i64).collect() }
        }
        impl IntoShape for &Vec<$t> {
            fn to_spec(&self) -> SmallVec<[i64; 6]> { self.iter().map(|&d| d as i64).collect() }
        }
    )*};
}
shape_impls!(usize, i64, i32);

/// The empty shape of a scalar (0-dimensional) tensor.
impl IntoShape for () {
    fn to_spec(&self) -> SmallVec<[i64; 6]> {
        SmallVec::new()
    }
}

/// A 1-D shape.
impl IntoShape for usize {
    fn to_spec(&self) -> SmallVec<[i64; 6]> {
        smallvec::smallvec![*self as i64]
    }
}

/// Checks that every size is non-negative and that the element count fits.
pub(crate) fn dims_of(op: &'static str, s: &impl IntoShape) -> Result<Dims> {
    let spec = s.to_spec();
    let dims = spec
        .iter()
        .map(|&d| {
            usize::try_from(d).map_err(|_| {
                Error::invalid(
                    op,
                    format!("negative dimension {d} in shape {:?}", spec.as_slice()),
                )
            })
        })
        .collect::<Result<Dims>>()?;
    checked_numel(op, &dims)?;
    Ok(dims)
}

/// Resolves one `-1` against `numel` (reshape/view).
pub(crate) fn infer_shape(op: &'static str, s: &impl IntoShape, numel: usize) -> Result<Dims> {
    let spec = s.to_spec();
    let mut infer = None;
    let mut known = 1usize;
    for (i, &d) in spec.iter().enumerate() {
        if d == -1 {
            if infer.replace(i).is_some() {
                return Err(Error::invalid(op, "only one dimension can be inferred"));
            }
        } else if d < 0 {
            return Err(Error::invalid(op, format!("invalid shape dimension {d}")));
        } else {
            // a product past usize cannot equal any tensor's numel
            known = known.checked_mul(d as usize).ok_or_else(|| {
                Error::invalid(
                    op,
                    format!(
                        "shape '{:?}' is invalid for input of size {numel}",
                        spec.as_slice()
                    ),
                )
            })?;
        }
    }
    let mut out: Dims = spec.iter().map(|&d| d.max(0) as usize).collect();
    if let Some(i) = infer {
        if known == 0 || !numel.is_multiple_of(known) {
            return Err(Error::invalid(
                op,
                format!(
                    "shape '{:?}' is invalid for input of size {numel}",
                    spec.as_slice()
                ),
            ));
        }
        out[i] = numel / known;
    } else if known != numel {
        return Err(Error::invalid(
            op,
            format!(
                "shape '{:?}' is invalid for input of size {numel}",
                spec.as_slice()
            ),
        ));
    }
    // an empty shape whose other sizes multiply past an address (its strides
    // would), refused as the creation ops refuse it
    crate::layout::checked_numel(op, &out)?;
    Ok(out)
}

/// One or several dims, possibly negative: `1`, `-1`, `[0, 2]`, `&[1, 2][..]`.
pub trait IntoDims {
    fn to_dim_list(&self) -> SmallVec<[i64; 6]>;
}

macro_rules! dims_impls {
    ($($t:ty),*) => {$(
        impl IntoDims for $t {
            fn to_dim_list(&self) -> SmallVec<[i64; 6]> { smallvec::smallvec![*self as i64] }
        }
        impl<const N: usize> IntoDims for [$t; N] {
            fn to_dim_list(&self) -> SmallVec<[i64; 6]> { self.iter().map(|&d| d as i64).collect() }
        }
        impl IntoDims for &[$t] {
            fn to_dim_list(&self) -> SmallVec<[i64; 6]> { self.iter().map(|&d| d as i64).collect() }
        }
        impl IntoDims for Vec<$t> {
            fn to_dim_list(&self) -> SmallVec<[i64; 6]> { self.iter().map(|&d| d as i64).collect() }
        }
    )*};
}
dims_impls!(usize, i64, i32);

/// Normalises a dim list: each in range, no repeats, sorted.
pub(crate) fn dim_list(op: &'static str, d: &impl IntoDims, rank: usize) -> Result<Dims> {
    let mut out: Dims = SmallVec::new();
    for &x in d.to_dim_list().iter() {
        let n = normalize_dim(op, x, rank)?;
        if out.contains(&n) {
            return Err(Error::invalid(
                op,
                format!("dim {n} appears multiple times in the list of dims"),
            ));
        }
        out.push(n);
    }
    out.sort_unstable();
    Ok(out)
}
