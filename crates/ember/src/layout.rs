//! Shapes, strides and views: a tensor's [`Layout`] over its storage.
//!
//! Strides and offsets are counted in elements. Views (transpose, narrow, expand,
//! ...) only build a new `Layout`; the storage is shared.

use crate::error::{Error, Result};
use smallvec::SmallVec;

/// A small vector of dimensions: no heap allocation up to rank 6.
pub type Dims = SmallVec<[usize; 6]>;

/// Shape, strides (in elements) and starting offset of a tensor in its storage.
#[derive(Debug, PartialEq, Eq)]
pub struct Layout {
    pub(crate) shape: Dims,
    pub(crate) strides: Dims,
    pub(crate) offset: usize,
}

// by hand: `SmallVec`'s own `clone` goes element by element through an iterator,
// and every op clones layouts
impl Clone for Layout {
    fn clone(&self) -> Layout {
        Layout {
            shape: Dims::from_slice(&self.shape),
            strides: Dims::from_slice(&self.strides),
            offset: self.offset,
        }
    }
}

/// Row-major strides for `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Dims {
    let mut strides = Dims::from_slice(shape);
    let mut s = 1;
    for (st, &n) in strides.iter_mut().zip(shape).rev() {
        *st = s;
        s *= n.max(1);
    }
    strides
}

/// The number of elements of `shape`, or an error naming `op` when the sizes
/// multiply past what an address can count (skipping zeros, so that a shape like
/// `[2^62, 2^62, 0]` is refused too: its strides would overflow).
pub fn checked_numel(op: &'static str, shape: &[usize]) -> Result<usize> {
    let fits = shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d.max(1)))
        .is_some_and(|n| n <= isize::MAX as usize);
    if !fits {
        return Err(Error::invalid(
            op,
            format!("shape {shape:?} has more elements than memory can address"),
        ));
    }
    Ok(shape.iter().product())
}

/// Resolves a possibly negative dimension index against `rank`, PyTorch style.
pub fn normalize_dim(op: &'static str, dim: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    // a 0-d tensor accepts dims -1 and 0, as in PyTorch
    let wrap = r.max(1);
    let d = if dim < 0 { dim + wrap } else { dim };
    if d < 0 || d >= wrap {
        return Err(Error::DimOutOfRange { op, dim, rank });
    }
    Ok(d as usize)
}

/// PyTorch's broadcasting rule: align trailing dims; each pair must be equal or one of them 1.
pub fn broadcast_shapes(op: &'static str, a: &[usize], b: &[usize]) -> Result<Dims> {
    if a == b {
        return Ok(Dims::from_slice(a));
    }
    let n = a.len().max(b.len());
    let mut out: Dims = SmallVec::from_elem(0, n);
    for i in 0..n {
        let da = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let db = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(Error::Broadcast {
                op,
                lhs: a.to_vec(),
                rhs: b.to_vec(),
                dim: i,
                a: da,
                b: db,
            });
        };
    }
    checked_numel(op, &out)?;
    Ok(out)
}

impl Layout {
    /// A row-major layout starting at offset 0.
    pub fn contiguous(shape: &[usize]) -> Layout {
        Layout {
            shape: Dims::from_slice(shape),
            strides: contiguous_strides(shape),
            offset: 0,
        }
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    pub fn offset(&self) -> usize {
        self.offset
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Row-major and dense (size-1 dims may have any stride, and an empty
    /// layout is contiguous whatever its strides, as in PyTorch).
    pub fn is_contiguous(&self) -> bool {
        if self.shape.contains(&0) {
            return true;
        }
        let mut expected = 1;
        for (&n, &s) in self.shape.iter().zip(self.strides.iter()).rev() {
            if n != 1 {
                if s != expected {
                    return false;
                }
                expected *= n;
            }
        }
        true
    }

    /// The contiguous element range `[offset, offset + numel)` when the layout is
    /// contiguous (`0..0` when it is empty, whatever its offset).
    pub fn contiguous_range(&self) -> Option<std::ops::Range<usize>> {
        // is_contiguous and numel in one pass (a size-1 dim adds nothing to either)
        let (shape, strides) = (self.shape.as_slice(), self.strides.as_slice());
        let mut numel = 1;
        for (&n, &s) in shape.iter().zip(strides).rev() {
            if n != 1 {
                if s != numel {
                    return None;
                }
                numel *= n;
            }
        }
        if numel == 0 {
            return Some(0..0);
        }
        Some(self.offset..self.offset + numel)
    }

    /// One past the largest storage index this layout touches (0 for empty layouts).
    pub fn storage_extent(&self) -> usize {
        if self.shape.contains(&0) {
            return 0;
        }
        self.offset
            + self
                .shape
                .iter()
                .zip(&self.strides)
                .map(|(&n, &s)| (n - 1) * s)
                .sum::<usize>()
            + 1
    }

    /// Strides of this layout broadcast to `shape` (stride 0 on expanded dims).
    pub fn broadcast_to(&self, op: &'static str, shape: &[usize]) -> Result<Layout> {
        if shape == self.shape.as_slice() {
            // the common case of same-shape operands: nothing to check or change
            return Ok(self.clone());
        }
        if shape.len() < self.rank() {
            return Err(Error::shape(
                op,
                &self.shape,
                shape,
                "cannot broadcast to fewer dimensions",
            ));
        }
        let lead = shape.len() - self.rank();
        let mut strides: Dims = SmallVec::from_elem(0, shape.len());
        for (i, &n) in shape.iter().enumerate() {
            if i < lead {
                continue;
            }
            let (m, s) = (self.shape[i - lead], self.strides[i - lead]);
            strides[i] = if m == n {
                s
            } else if m == 1 {
                0
            } else {
                return Err(Error::shape(
                    op,
                    &self.shape,
                    shape,
                    format!("the expanded size ({n}) must match the existing size ({m}) at non-singleton dimension {i}"),
                ));
            };
        }
        checked_numel(op, shape)?;
        Ok(Layout {
            shape: Dims::from_slice(shape),
            strides,
            offset: self.offset,
        })
    }

    /// `true` when two positions of the layout share an element (an expanded view).
    pub fn is_overlapping(&self) -> bool {
        let l = self;
        l.shape()
            .iter()
            .zip(l.strides())
            .any(|(&n, &s)| n > 1 && s == 0)
            || {
                // strides that interleave (e.g. as_strided tricks) cannot be built by ember's
                // views except through stride 0, so sorting strides is a complete check here
                let mut dims: Vec<(usize, usize)> = l
                    .shape()
                    .iter()
                    .zip(l.strides())
                    .filter(|(&n, _)| n > 1)
                    .map(|(&n, &s)| (s, n))
                    .collect();
                dims.sort_unstable();
                let mut extent = 1;
                let mut bad = false;
                for (s, n) in dims {
                    if s < extent {
                        bad = true;
                    }
                    extent = s * (n - 1) + extent.max(1);
                }
                bad
            }
    }

    pub(crate) fn transpose(&self, a: usize, b: usize) -> Layout {
        let mut l = self.clone();
        l.shape.swap(a, b);
        l.strides.swap(a, b);
        l
    }

    pub(crate) fn permute(&self, perm: &[usize]) -> Layout {
        Layout {
            shape: perm.iter().map(|&p| self.shape[p]).collect(),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
            offset: self.offset,
        }
    }

    /// Elements `start, start + step, ...` below `end` along `dim`.
    pub(crate) fn slice(&self, dim: usize, start: usize, end: usize, step: usize) -> Layout {
        let mut l = self.clone();
        let len = if end > start {
            (end - start).div_ceil(step)
        } else {
            0
        };
        if len > 0 {
            l.offset += start * self.strides[dim];
        }
        l.shape[dim] = len;
        l.strides[dim] *= step;
        l
    }

    /// Removes `dim`, fixing its index at `index`.
    pub(crate) fn select(&self, dim: usize, index: usize) -> Layout {
        let mut l = self.clone();
        l.offset += index * self.strides[dim];
        l.shape.remove(dim);
        l.strides.remove(dim);
        l
    }

    pub(crate) fn unsqueeze(&self, dim: usize) -> Layout {
        let mut l = self.clone();
        let s = if dim < self.rank() {
            self.strides[dim] * self.shape[dim]
        } else {
            1
        };
        l.shape.insert(dim, 1);
        l.strides.insert(dim, s);
        l
    }

    /// A view with `shape` over the same elements, when the strides allow one
    /// (PyTorch's `view` rule); `None` when a copy is needed.
    pub(crate) fn view(&self, shape: &[usize]) -> Option<Layout> {
        let canonical = || Layout {
            shape: Dims::from_slice(shape),
            strides: contiguous_strides(shape),
            offset: self.offset,
        };
        if self.numel() == 0 {
            // an empty layout views as any shape: its own strides for its own shape,
            // else row-major ones (PyTorch's rule)
            return Some(match shape == self.shape.as_slice() {
                true => self.clone(),
                false => canonical(),
            });
        }
        // row-major with row-major strides on every dim: the common case; a size-1
        // dim with another stride (a channels-last [n, c, 1, 1]) goes through the
        // general rule, which keeps what PyTorch keeps
        if self.is_contiguous() && self.strides == contiguous_strides(&self.shape) {
            return Some(canonical());
        }
        // Walk the old dims from the back in chunks that are contiguous among
        // themselves; each chunk must be covered exactly by a run of new dims.
        let (old_shape, old_strides) = (&self.shape, &self.strides);
        let mut new_strides: Dims = SmallVec::from_elem(0, shape.len());
        let mut view_d = shape.len() as isize - 1;
        let mut chunk_base_stride = *old_strides.last()?;
        let (mut tensor_numel, mut view_numel) = (1usize, 1usize);
        for tensor_d in (0..old_shape.len()).rev() {
            tensor_numel *= old_shape[tensor_d];
            let chunk_ends = tensor_d == 0
                || (old_shape[tensor_d - 1] != 1
                    && old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride);
            if chunk_ends {
                while view_d >= 0 && (view_numel < tensor_numel || shape[view_d as usize] == 1) {
                    new_strides[view_d as usize] = view_numel * chunk_base_stride;
                    view_numel *= shape[view_d as usize];
                    view_d -= 1;
                }
                if view_numel != tensor_numel {
                    return None;
                }
                if tensor_d > 0 {
                    chunk_base_stride = old_strides[tensor_d - 1];
                    tensor_numel = 1;
                    view_numel = 1;
                }
            }
        }
        if view_d != -1 {
            return None;
        }
        Some(Layout {
            shape: Dims::from_slice(shape),
            strides: new_strides,
            offset: self.offset,
        })
    }
}

/// How a 4-D tensor's elements lie in memory (`torch.memory_format`). The shape
/// stays `[N, C, H, W]` either way; only the strides differ.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MemoryFormat {
    /// Row-major over `[N, C, H, W]` (`torch.contiguous_format`).
    #[default]
    Contiguous,
    /// The channels innermost: `[N, H, W, C]` in memory (`torch.channels_last`),
    /// the layout of NHWC convolutions and of tensor cores' half-precision kernels.
    ChannelsLast,
}

/// The strides `format` gives a tensor of `shape` (`shape` has rank 4 for
/// channels-last). Empty dims count as 1, as in [`contiguous_strides`].
pub(crate) fn format_strides(shape: &[usize], format: MemoryFormat) -> Dims {
    match format {
        MemoryFormat::Contiguous => contiguous_strides(shape),
        MemoryFormat::ChannelsLast => {
            let n = |d: usize| shape[d].max(1);
            let mut s: Dims = SmallVec::from_elem(0, 4);
            s[1] = 1;
            s[3] = n(1);
            s[2] = s[3] * n(3);
            s[0] = s[2] * n(2);
            s
        }
    }
}

impl Layout {
    /// A layout at offset 0 with the given strides (a dense order of the
    /// elements: the caller's storage is written in it).
    pub(crate) fn with_strides(shape: &[usize], strides: Dims) -> Layout {
        Layout {
            shape: Dims::from_slice(shape),
            strides,
            offset: 0,
        }
    }

    /// A view from `offset` with the given strides (within a buffer the caller
    /// wrote in that order).
    pub(crate) fn strided(shape: &[usize], strides: &[usize], offset: usize) -> Layout {
        Layout {
            shape: Dims::from_slice(shape),
            strides: Dims::from_slice(strides),
            offset,
        }
    }

    /// PyTorch's `is_contiguous(memory_format)`: dense in `format`'s order
    /// (size-1 dims may have any stride). Channels-last needs rank 4.
    pub fn is_contiguous_in(&self, format: MemoryFormat) -> bool {
        match format {
            MemoryFormat::Contiguous => self.is_contiguous(),
            MemoryFormat::ChannelsLast => {
                if self.rank() != 4 {
                    return false;
                }
                let mut expected = 1;
                for d in [1, 3, 2, 0] {
                    let n = self.shape[d];
                    if n != 1 {
                        if self.strides[d] != expected {
                            return false;
                        }
                        expected *= n;
                    }
                }
                true
            }
        }
    }

    /// PyTorch's `suggest_memory_format()`: channels-last where a rank-4 layout's
    /// strides put the channels innermost and the batch outermost (ambiguous cases,
    /// such as a channel dim of stride 0 or an `[N, 1, 1, 1]` tensor, are
    /// row-major), else row-major. Ops that keep a memory format (convolution,
    /// batch norm, pooling) decide with it.
    pub fn suggest_memory_format(&self) -> MemoryFormat {
        if self.rank() != 4 || self.strides[1] == 0 {
            return MemoryFormat::Contiguous;
        }
        let mut min = 0;
        for d in [1, 3, 2, 0] {
            let (n, s) = (self.shape[d], self.strides[d]);
            if n == 0 || s < min || (d == 0 && min == self.strides[1]) {
                return MemoryFormat::Contiguous;
            }
            min = if n > 1 { s * n } else { s };
        }
        MemoryFormat::ChannelsLast
    }

    /// PyTorch's `is_non_overlapping_and_dense()`: the elements fill a block of
    /// storage exactly, in some order of the dims.
    pub(crate) fn is_non_overlapping_and_dense(&self) -> bool {
        let mut dims: SmallVec<[(usize, usize); 6]> = self
            .shape
            .iter()
            .zip(&self.strides)
            .filter(|(&n, _)| n >= 2)
            .map(|(&n, &s)| (s, n))
            .collect();
        if self.shape.contains(&0) {
            return true;
        }
        dims.sort_unstable();
        let mut need = 1;
        for (s, n) in dims {
            if s != need {
                return false;
            }
            need *= n;
        }
        true
    }

    /// The strides `.to(dtype)`, `.to(device)` and the other copies with
    /// PyTorch's `preserve_format` give a copy of this layout: its own strides
    /// when it is dense, else dense strides in the order of its own (PyTorch's
    /// `infer_dense_strides`, the order [`elementwise_strides`] gives one
    /// operand). `None` where that is row-major.
    ///
    /// [`elementwise_strides`]: Layout::elementwise_strides
    pub(crate) fn preserved_strides(&self) -> Option<Dims> {
        if self.is_contiguous() {
            return None;
        }
        if self.is_non_overlapping_and_dense() {
            return Some(self.strides.clone());
        }
        Layout::elementwise_strides(&[self], false)
    }

    /// The strides PyTorch's elementwise ops (its `TensorIterator`) give their
    /// output, from the operands' layouts broadcast to the output's shape
    /// (`same_shape`: no operand was broadcast, which allows PyTorch's fast
    /// cases). `None` where the output is row-major, the common case.
    ///
    /// Fast cases (operands of one shape): all row-major, all channels-last, or
    /// all dense with one set of strides (the output takes them). Otherwise the
    /// dims are ordered fastest first by the operands' strides, the first operand
    /// that tells two dims apart deciding (a broadcast dim tells nothing; equal
    /// strides put the smaller dim first), and the output is dense in that order;
    /// that is how a size-1 dim's stride can carry over, as in PyTorch.
    pub(crate) fn elementwise_strides(ops: &[&Layout], same_shape: bool) -> Option<Dims> {
        let first = ops.first()?;
        let rank = first.rank();
        if rank < 2 || same_shape && ops.iter().all(|l| l.is_contiguous()) {
            return None;
        }
        let shape = first.shape();
        if same_shape {
            if ops
                .iter()
                .all(|l| l.is_contiguous_in(MemoryFormat::ChannelsLast))
            {
                return Some(format_strides(shape, MemoryFormat::ChannelsLast));
            }
            let last = ops[ops.len() - 1];
            if ops
                .iter()
                .all(|l| l.is_non_overlapping_and_dense() && l.strides == last.strides)
            {
                return Some(last.strides.clone());
            }
        }
        // 1: dim a goes after (outside) dim b, -1: before, 0: undecided
        let order = |a: usize, b: usize| -> i8 {
            for l in ops {
                let (sa, sb) = (l.strides[a], l.strides[b]);
                if sa == 0 || sb == 0 {
                    continue;
                }
                if sa != sb {
                    return if sa < sb { -1 } else { 1 };
                }
                if shape[a] > shape[b] {
                    return 1;
                }
            }
            0
        };
        // fastest first, starting from row-major's order; an insertion sort that
        // stops at the first dim it must not pass
        let mut perm: Dims = (0..rank).rev().collect();
        for i in 1..rank {
            let mut d1 = i;
            for d0 in (0..i).rev() {
                match order(perm[d0], perm[d1]) {
                    1 => {
                        perm.swap(d0, d1);
                        d1 = d0;
                    }
                    -1 => break,
                    _ => {}
                }
            }
        }
        if perm.iter().enumerate().all(|(k, &d)| d == rank - 1 - k) {
            return None;
        }
        let mut strides: Dims = SmallVec::from_elem(0, rank);
        let mut next = 1;
        for &d in &perm {
            strides[d] = next;
            next *= shape[d].max(1);
        }
        Some(strides)
    }

    /// The permutation of dims that walks this layout in memory order, where it is
    /// dense but not row-major (channels-last, a transposed matrix); `None`
    /// otherwise. An in-place kernel given its layouts so permuted (every operand
    /// by the same permutation, which keeps elements matched) reads and writes
    /// memory in order, as the out-of-place ops do over their dense outputs.
    pub(crate) fn memory_order(&self) -> Option<Dims> {
        (!self.is_contiguous() && self.is_non_overlapping_and_dense())
            .then(|| Layout::dense_order(&self.strides))
    }

    /// This layout with its dims permuted by `perm` ([`memory_order`]), or as it is.
    ///
    /// [`memory_order`]: Layout::memory_order
    pub(crate) fn permuted(&self, perm: Option<&[usize]>) -> Layout {
        perm.map_or_else(|| self.clone(), |p| self.permute(p))
    }

    /// The order of dims, outermost first, in which a layout with these dense
    /// `strides` stores its elements: a backend that writes its output row-major
    /// over the permuted operands writes it in this layout.
    pub(crate) fn dense_order(strides: &[usize]) -> Dims {
        let mut perm: Dims = (0..strides.len()).collect();
        perm.sort_by_key(|&d| std::cmp::Reverse(strides[d]));
        perm
    }
}

/// Whether the sorted, unique dims `dims` are the first `dims.len()` dims.
pub(crate) fn are_leading(dims: &[usize]) -> bool {
    dims.iter().enumerate().all(|(i, &d)| i == d)
}

/// Whether the sorted, unique dims `dims` are the last `dims.len()` of `rank`.
pub(crate) fn are_trailing(dims: &[usize], rank: usize) -> bool {
    dims.iter()
        .enumerate()
        .all(|(i, &d)| d + dims.len() == rank + i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strides_and_contiguity() {
        let l = Layout::contiguous(&[2, 3, 4]);
        assert_eq!(l.strides(), &[12, 4, 1]);
        assert!(l.is_contiguous());
        let t = l.transpose(0, 2);
        assert!(!t.is_contiguous());
        assert_eq!(t.shape(), &[4, 3, 2]);
        assert_eq!(l.storage_extent(), 24);
    }

    #[test]
    fn broadcasting() {
        assert_eq!(
            broadcast_shapes("t", &[3, 1], &[1, 4]).unwrap().as_slice(),
            &[3, 4]
        );
        assert_eq!(
            broadcast_shapes("t", &[5, 1, 4], &[3, 1])
                .unwrap()
                .as_slice(),
            &[5, 3, 4]
        );
        assert_eq!(broadcast_shapes("t", &[], &[2]).unwrap().as_slice(), &[2]);
        assert_eq!(
            broadcast_shapes("t", &[0, 1], &[1, 3]).unwrap().as_slice(),
            &[0, 3]
        );
        let e = broadcast_shapes("add", &[2, 3], &[4])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("add") && e.contains("(3)") && e.contains("(4)"),
            "{e}"
        );
    }

    #[test]
    fn views_of_non_contiguous_layouts() {
        // transpose of [2,3] -> [3,2] strides [1,3]; viewing as [3,2,1] works, [6] does not
        let t = Layout::contiguous(&[2, 3]).transpose(0, 1);
        assert!(t.view(&[6]).is_none());
        let v = t.view(&[3, 2, 1]).unwrap();
        assert_eq!(&v.strides()[..2], &[1, 3]);
        // a narrowed contiguous block: [4, 6] narrowed on dim 1 to 3 columns
        let n = Layout::contiguous(&[4, 6]).slice(1, 0, 3, 1);
        assert!(n.view(&[2, 2, 3]).is_some());
        assert!(n.view(&[12]).is_none());
        let v = n.view(&[2, 2, 3]).unwrap();
        assert_eq!(v.strides(), &[12, 6, 1]);
    }

    #[test]
    fn leading_and_trailing_dims() {
        assert!(are_leading(&[0, 1]) && !are_leading(&[1]) && !are_leading(&[0, 2]));
        assert!(are_trailing(&[1, 2], 3) && are_trailing(&[2], 3));
        assert!(!are_trailing(&[1], 3) && !are_trailing(&[0, 2], 3));
    }

    #[test]
    fn views_follow_pytorchs_strides() {
        let l = |shape: &[usize], strides: &[usize]| {
            Layout::with_strides(shape, Dims::from_slice(strides))
        };
        let strides = |v: Option<Layout>| v.map(|v| v.strides().to_vec());
        // (PyTorch 2.15's strides for each)
        let cl = l(&[2, 3, 1, 1], &[3, 1, 3, 3]);
        assert_eq!(strides(cl.view(&[2, 3, 1, 1])), Some(vec![3, 1, 3, 3]));
        assert_eq!(strides(cl.view(&[2, 3])), Some(vec![3, 1]));
        let odd = l(&[2, 1, 3], &[3, 100, 1]);
        assert_eq!(strides(odd.view(&[2, 1, 3])), Some(vec![3, 3, 1]));
        assert_eq!(strides(odd.view(&[6])), Some(vec![1]));
        let sliced = l(&[2, 3, 1, 5], &[60, 20, 20, 1]);
        assert_eq!(
            strides(sliced.view(&[2, 3, 1, 5])),
            Some(vec![60, 20, 5, 1])
        );
        let empty = l(&[2, 0, 3], &[0, 3, 1]);
        assert_eq!(strides(empty.view(&[2, 0, 3])), Some(vec![0, 3, 1]));
        assert_eq!(strides(empty.view(&[0, 6])), Some(vec![6, 1]));
    }

    #[test]
    fn memory_formats() {
        let cl = MemoryFormat::ChannelsLast;
        let l = |shape: &[usize], strides: &[usize]| {
            Layout::with_strides(shape, Dims::from_slice(strides))
        };
        let x = l(&[2, 3, 5, 4], &[60, 1, 12, 3]);
        assert_eq!(format_strides(&[2, 3, 5, 4], cl).as_slice(), x.strides());
        assert!(x.is_contiguous_in(cl) && !x.is_contiguous());
        assert_eq!(x.suggest_memory_format(), cl);
        // ambiguous layouts are row-major to PyTorch: [N, 1, 1, 1], and a channel
        // dim of stride 0
        assert_eq!(
            l(&[4, 1, 1, 1], &[1, 1, 1, 1]).suggest_memory_format(),
            MemoryFormat::Contiguous
        );
        assert_eq!(
            l(&[2, 3, 5, 4], &[20, 0, 4, 1]).suggest_memory_format(),
            MemoryFormat::Contiguous
        );
        // [N, C, 1, 1] is dense in both orders
        let c11 = Layout::contiguous(&[2, 3, 1, 1]);
        assert!(c11.is_contiguous_in(cl) && c11.is_contiguous_in(MemoryFormat::Contiguous));
        // elementwise: both channels-last, or one of them first, gives channels-last;
        // a row-major first operand decides for row-major
        let c = Layout::contiguous(&[2, 3, 5, 4]);
        assert_eq!(
            Layout::elementwise_strides(&[&x, &x], true).as_deref(),
            Some(x.strides())
        );
        assert_eq!(
            Layout::elementwise_strides(&[&x, &c], true).as_deref(),
            Some(x.strides())
        );
        assert_eq!(Layout::elementwise_strides(&[&c, &x], true), None);
        // a transposed matrix gives a transposed result; a broadcast row tells nothing
        let t = Layout::contiguous(&[4, 6]).transpose(0, 1);
        let row = Layout::contiguous(&[4]).broadcast_to("t", &[6, 4]).unwrap();
        assert_eq!(
            Layout::elementwise_strides(&[&t, &row], false).as_deref(),
            Some(&[1, 6][..])
        );
        assert_eq!(Layout::dense_order(&[1, 6]).as_slice(), &[1, 0]);
        assert!(
            x.is_non_overlapping_and_dense() && !t.slice(0, 0, 6, 2).is_non_overlapping_and_dense()
        );
        // in-place kernels' memory order: channels-last and transposed layouts
        // permuted to row-major ones over the same storage; others left alone
        for (dense, perm) in [(&x, [0, 2, 3, 1].as_slice()), (&t, &[1, 0])] {
            let order = dense.memory_order();
            assert_eq!(order.as_deref(), Some(perm));
            let walked = dense.permuted(order.as_deref());
            assert!(walked.is_contiguous() && walked.offset() == dense.offset());
        }
        assert_eq!(c.memory_order(), None);
        assert_eq!(t.slice(0, 0, 6, 2).memory_order(), None);
        assert_eq!(c.permuted(None).strides(), c.strides());
    }

    #[test]
    fn dims_wrap() {
        assert_eq!(normalize_dim("t", -1, 3).unwrap(), 2);
        assert_eq!(normalize_dim("t", 0, 0).unwrap(), 0);
        assert_eq!(normalize_dim("t", -1, 0).unwrap(), 0);
        let e = normalize_dim("sum", 3, 3).unwrap_err().to_string();
        assert!(e.contains("[-3, 2]") && e.contains("got 3"), "{e}");
    }
}
