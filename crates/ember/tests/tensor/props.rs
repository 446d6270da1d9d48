//! Property tests: broadcasting, strides and views agree with simple references.

use ember::prelude::*;
use proptest::prelude::*;

fn shape_strategy() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1usize..5, 0..5)
}

/// Value at a multi-index of a row-major buffer of `shape`, broadcasting size-1 and
/// missing leading dims.
fn at_broadcast(v: &[f64], shape: &[usize], idx: &[usize]) -> f64 {
    let lead = idx.len() - shape.len();
    let mut off = 0;
    for (d, &n) in shape.iter().enumerate() {
        let i = if n == 1 { 0 } else { idx[lead + d] };
        off = off * n + i;
    }
    v[off]
}

fn multi_index(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = flat % shape[d];
        flat /= shape[d];
    }
    idx
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any shape broadcast against a copy with some dims set to 1 (and some leading
    /// dims dropped) matches elementwise indexing.
    #[test]
    fn broadcasting_matches_indexing(shape in shape_strategy(), mask in prop::collection::vec(any::<bool>(), 5), drop in 0usize..3) {
        let dev = Device::Cpu;
        let mut other: Vec<usize> = shape.iter().zip(&mask).map(|(&n, &m)| if m { 1 } else { n }).collect();
        let drop = drop.min(other.len());
        other.drain(..drop);
        let a = Tensor::arange(0f64, shape.iter().product::<usize>() as f64, &dev).unwrap().reshape(&shape).unwrap();
        let b = Tensor::arange(0f64, other.iter().product::<usize>() as f64, &dev).unwrap().mul(1000.0).unwrap().reshape(&other).unwrap();
        let c = a.add(&b).unwrap();
        prop_assert_eq!(c.shape(), &shape[..]);
        let (av, bv, cv) = (a.to_vec::<f64>().unwrap(), b.to_vec::<f64>().unwrap(), c.to_vec::<f64>().unwrap());
        for (flat, &got) in cv.iter().enumerate() {
            let idx = multi_index(flat, &shape);
            prop_assert_eq!(got, at_broadcast(&av, &shape, &idx) + at_broadcast(&bv, &other, &idx));
        }
        // broadcasting is symmetric
        prop_assert_eq!(b.add(&a).unwrap().to_vec::<f64>().unwrap(), cv);
    }

    /// A random permutation, made contiguous and permuted back, is the identity; the
    /// permuted view reads the element the strides say.
    #[test]
    fn permute_roundtrip(shape in prop::collection::vec(1usize..5, 1..5), seed in any::<u64>()) {
        let dev = Device::Cpu;
        let n = shape.len();
        let mut perm: Vec<usize> = (0..n).collect();
        let mut s = seed;
        for i in (1..n).rev() {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            perm.swap(i, (s >> 33) as usize % (i + 1));
        }
        let mut inv = vec![0; n];
        for (i, &p) in perm.iter().enumerate() { inv[p] = i; }
        let a = Tensor::arange(0i64, shape.iter().product::<usize>() as i64, &dev).unwrap().reshape(&shape).unwrap();
        let p = a.permute(perm.clone()).unwrap();
        let pc = p.contiguous().unwrap();
        let pv = pc.to_vec::<i64>().unwrap();
        let pshape: Vec<usize> = perm.iter().map(|&d| shape[d]).collect();
        prop_assert_eq!(pc.shape(), &pshape[..]);
        for (flat, &v) in pv.iter().enumerate() {
            let pidx = multi_index(flat, &pshape);
            let mut idx = vec![0; n];
            for (i, &d) in perm.iter().enumerate() { idx[d] = pidx[i]; }
            let mut off = 0;
            for d in 0..n { off = off * shape[d] + idx[d]; }
            prop_assert_eq!(v, off as i64);
        }
        let back = pc.permute(inv).unwrap();
        prop_assert_eq!(back.contiguous().unwrap().to_vec::<i64>().unwrap(), a.to_vec::<i64>().unwrap());
    }

    /// reshape agrees with the row-major order whatever the input strides are, and
    /// `view` succeeds exactly when the result shares storage.
    #[test]
    fn reshape_preserves_row_major_order(shape in prop::collection::vec(1usize..5, 1..4), split in 1usize..4) {
        let dev = Device::Cpu;
        let total: usize = shape.iter().product();
        let a = Tensor::arange(0i64, total as i64, &dev).unwrap().reshape(&shape).unwrap();
        let t = if shape.len() >= 2 { a.transpose(0, -1).unwrap() } else { a.clone() };
        let flat = t.contiguous().unwrap().to_vec::<i64>().unwrap();
        let d = if total.is_multiple_of(split) { split } else { 1 };
        let r = t.reshape([d as i64, -1]).unwrap();
        prop_assert_eq!(r.to_vec::<i64>().unwrap(), flat.clone());
        if let Ok(v) = t.view([d as i64, -1]) {
            prop_assert_eq!(v.to_vec::<i64>().unwrap(), flat);
        }
    }

    /// Narrowing then summing equals summing the reference slice.
    #[test]
    fn narrow_then_reduce(rows in 1usize..8, cols in 1usize..8, start in 0usize..8, len in 0usize..8) {
        let dev = Device::Cpu;
        prop_assume!(start + len <= cols);
        let a = Tensor::arange(0f64, (rows * cols) as f64, &dev).unwrap().reshape([rows, cols]).unwrap();
        let s = a.narrow(1, start as i64, len).unwrap().sum(1, false).unwrap().to_vec::<f64>().unwrap();
        for (r, &got) in s.iter().enumerate() {
            let want: f64 = (start..start + len).map(|c| (r * cols + c) as f64).sum();
            prop_assert_eq!(got, want);
        }
    }
}
