//! Walking strided layouts in row-major order, in runs along the innermost dim.
//!
//! Every CPU kernel that reads or writes a non-contiguous tensor goes through
//! [`for_each_run`]: the loop body sees a start offset and a stride per operand and
//! a run length, so the innermost loop stays tight (and vectorises when the strides
//! are 1).

use smallvec::SmallVec;

type Dims = SmallVec<[usize; 6]>;

/// A shape and `K` stride vectors with size-1 dims dropped and mergeable dims merged.
#[derive(Clone, Debug)]
pub(crate) struct Walk<const K: usize> {
    pub shape: Dims,
    pub strides: [Dims; K],
}

impl<const K: usize> Walk<K> {
    /// Coalesces `shape` for operands with the given `strides` (all of the same rank).
    pub fn new(shape: &[usize], strides: [&[usize]; K]) -> Self {
        let mut out_shape: Dims = SmallVec::new();
        let mut out_strides: [Dims; K] = std::array::from_fn(|_| SmallVec::new());
        for d in 0..shape.len() {
            let n = shape[d];
            if n == 1 {
                continue;
            }
            if !out_shape.is_empty() {
                let r = out_shape.len() - 1;
                // dim r can absorb dim d when stride_r == stride_d * n for every operand
                if (0..K).all(|k| out_strides[k][r] == strides[k][d] * n) {
                    out_shape[r] *= n;
                    for k in 0..K {
                        out_strides[k][r] = strides[k][d];
                    }
                    continue;
                }
            }
            out_shape.push(n);
            for k in 0..K {
                out_strides[k].push(strides[k][d]);
            }
        }
        Walk {
            shape: out_shape,
            strides: out_strides,
        }
    }

    /// Calls `f(pos, len, starts, inner_strides)` for the positions `[start, end)` of the
    /// row-major walk, where `starts[k]` is operand k's offset (plus `base[k]`) at `pos`.
    #[inline]
    pub fn for_each_run(
        &self,
        base: [usize; K],
        start: usize,
        end: usize,
        mut f: impl FnMut(usize, usize, [usize; K], [usize; K]),
    ) {
        if start >= end {
            return;
        }
        let r = self.shape.len();
        if r == 0 {
            f(start, 1, base, [0; K]);
            return;
        }
        let inner = self.shape[r - 1];
        let inner_strides: [usize; K] = std::array::from_fn(|k| self.strides[k][r - 1]);
        // multi-index of `start`
        let mut idx: Dims = SmallVec::from_elem(0, r);
        let mut rem = start;
        for d in (0..r).rev() {
            idx[d] = rem % self.shape[d];
            rem /= self.shape[d];
        }
        let mut pos = start;
        while pos < end {
            let mut offs = base;
            for (k, o) in offs.iter_mut().enumerate() {
                *o += idx
                    .iter()
                    .zip(&self.strides[k])
                    .map(|(i, s)| i * s)
                    .sum::<usize>();
            }
            let len = (inner - idx[r - 1]).min(end - pos);
            f(pos, len, offs, inner_strides);
            pos += len;
            // advance the outer index
            idx[r - 1] = 0;
            let mut d = r - 1;
            while d > 0 {
                d -= 1;
                idx[d] += 1;
                if idx[d] < self.shape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offsets(w: &Walk<1>, start: usize, end: usize) -> Vec<usize> {
        let mut v = vec![];
        w.for_each_run([0], start, end, |_, len, [o], [s]| {
            for i in 0..len {
                v.push(o + i * s);
            }
        });
        v
    }

    #[test]
    fn coalesces_contiguous_dims() {
        let w = Walk::new(&[2, 3, 4], [&[12, 4, 1]]);
        assert_eq!(w.shape.as_slice(), &[24]);
        let w = Walk::new(&[2, 1, 3], [&[3, 7, 1]]);
        assert_eq!(w.shape.as_slice(), &[6]);
    }

    #[test]
    fn walks_transposed_layout() {
        // [2,3] transposed -> shape [3,2], strides [1,3]
        let w = Walk::new(&[3, 2], [&[1, 3]]);
        assert_eq!(offsets(&w, 0, 6), vec![0, 3, 1, 4, 2, 5]);
        // a chunk starting in the middle of a run
        assert_eq!(offsets(&w, 3, 6), vec![4, 2, 5]);
    }

    #[test]
    fn broadcast_strides_repeat() {
        let w = Walk::new(&[2, 3], [&[0, 1]]);
        assert_eq!(offsets(&w, 0, 6), vec![0, 1, 2, 0, 1, 2]);
    }
}
