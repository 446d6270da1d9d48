//! The rule every index op applies to its indices.

use crate::error::{Error, Result};

/// Checks that each index lies in `[-size, size)` and wraps the negative ones to
/// `[0, size)`; without `negative`, in `[0, size)` (`op` and `dim` name them in the
/// error).
pub(crate) fn wrap_indices(
    v: &mut [i64],
    op: &'static str,
    dim: usize,
    size: usize,
    negative: bool,
) -> Result<()> {
    let lo = if negative { -(size as i64) } else { 0 };
    for x in v.iter_mut() {
        if *x < lo || *x >= size as i64 {
            return Err(Error::IndexOutOfRange {
                op,
                index: *x,
                dim,
                size,
            });
        }
        if *x < 0 {
            *x += size as i64;
        }
    }
    Ok(())
}
