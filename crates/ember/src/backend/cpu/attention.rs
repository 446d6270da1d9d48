//! Fused attention on the CPU (`BackendStorage::attention`): one query row at a
//! time, its scores over the keys it sees (plus the bias, where there is one)
//! kept only while the row is computed, in the accumulator type; each (batch,
//! head) pair on a thread of its own.

use crate::backend::host::alloc_uninit;
use crate::backend::op::{
    attn_bias_refuses, attn_packed_refuses, AttnGrads, AttnOperands, AttnPlace, AttnSaved,
    AttnShape,
};
use crate::dtype::{CpuData, CpuElem, FloatDType, Real};
use crate::error::{Error, Result};
use crate::layout::Layout;
use num_traits::{Float, Zero};
use rayon::prelude::*;

/// A rank-4 view of a slice: q, k, v or g `[batch, heads, rows, d]` (last dim
/// contiguous), or the bias `[batch, heads, l, s]` (any strides, 0 where a mask
/// broadcasts).
#[derive(Clone, Copy)]
struct View<'a, T> {
    data: &'a [T],
    offset: usize,
    strides: [usize; 4],
}

impl<'a, T: Copy> View<'a, T> {
    /// `l` is rank 4 (the primitive's contract; the bias is checked by
    /// [`check_bias`]).
    fn new(data: &'a [T], l: &Layout) -> View<'a, T> {
        let s = l.strides();
        View {
            data,
            offset: l.offset(),
            strides: [s[0], s[1], s[2], s[3]],
        }
    }

    /// Row `r` of the pair `(b, h)`, `d` elements.
    fn row(&self, (b, h): (usize, usize), r: usize, d: usize) -> &'a [T] {
        let at = self.offset + b * self.strides[0] + h * self.strides[1] + r * self.strides[2];
        &self.data[at..at + d]
    }

    /// Element `(i, j)` of the pair `(b, h)` (the bias of query `i` against key `j`).
    fn at(&self, (b, h): (usize, usize), i: usize, j: usize) -> T {
        let st = &self.strides;
        self.data[self.offset + b * st[0] + h * st[1] + i * st[2] + j * st[3]]
    }
}

/// A result buffer that the pairs' threads write at once, each the rows of its
/// own pair only, where an [`AttnPlace`] puts them (rows of distinct pairs and
/// of distinct results never overlap: backend/op/attention.rs).
struct RowsOut<T> {
    ptr: *mut T,
    len: usize,
    place: AttnPlace,
}

// the threads write disjoint rows (see `write`)
unsafe impl<T: Send> Send for RowsOut<T> {}
unsafe impl<T: Send> Sync for RowsOut<T> {}

impl<T> RowsOut<T> {
    /// Writes row `r` of the pair `(b, h)` (`row.len()` elements).
    ///
    /// # Safety
    /// No other thread writes or reads this row of this buffer meanwhile, and
    /// the buffer outlives the call.
    unsafe fn write(
        &self,
        (b, h): (usize, usize),
        r: usize,
        row: impl ExactSizeIterator<Item = T>,
    ) {
        let st = &self.place.strides;
        let at = self.place.offset + b * st[0] + h * st[1] + r * st[2];
        assert!(
            at + row.len() <= self.len,
            "an attention row outside its buffer"
        );
        for (i, x) in row.enumerate() {
            // SAFETY: within the buffer (checked above); the caller's contract
            // keeps other threads off this row
            unsafe { self.ptr.add(at + i).write(x) };
        }
    }
}

fn dot<T: FloatDType>(a: &[T], b: &[T]) -> T::Acc {
    a.iter()
        .zip(b)
        .fold(T::Acc::zero(), |s, (&x, &y)| s + x.to_acc() * y.to_acc())
}

/// The scaled scores (plus the bias) of query row `qi` against the keys it sees
/// (`s` of them at most), in `scores`, and their maximum (`-inf` for none, or
/// where the bias masks them all).
fn scores_of<T: FloatDType>(
    q: &[T],
    (k, bias): (&View<'_, T>, Option<&View<'_, T>>),
    pair: (usize, usize),
    (qi, sh): (usize, &AttnShape),
    scores: &mut Vec<T::Acc>,
) -> T::Acc {
    scores.clear();
    let scale = T::Acc::c(sh.scale);
    let mut m = T::Acc::neg_infinity();
    for j in (0..sh.s).take_while(|&j| sh.visible(qi, j)) {
        let x = dot(q, k.row(pair, j, sh.d)) * scale;
        let x = match bias {
            Some(b) => x + b.at(pair, qi, j).to_acc(),
            None => x,
        };
        m = m.max(x);
        scores.push(x);
    }
    m
}

/// One (batch, head) pair's index and its log-sum-exps to write.
type Pair<'a, A> = (usize, &'a mut [A]);

/// The primitive's contract: no empty operand (the tensor layer computes those
/// another way), and a bias of the operands' dtype and the scores' shape.
fn check_sizes(q: &CpuData, bias: Option<(&CpuData, &Layout)>, sh: &AttnShape) -> Result<()> {
    if [sh.batch, sh.heads, sh.l, sh.s, sh.d].contains(&0) {
        return Err(Error::invalid(
            "attention",
            "the fused op takes no empty operand",
        ));
    }
    if let Some(why) = bias.and_then(|(b, l)| attn_bias_refuses(l, b.dtype(), q.dtype(), sh)) {
        return Err(Error::invalid("attention", why));
    }
    if let Some(why) = attn_packed_refuses(sh, 1) {
        return Err(Error::invalid("attention", why));
    }
    Ok(())
}

pub(crate) fn attention(x: AttnOperands<'_, CpuData>, sh: AttnShape) -> Result<(CpuData, CpuData)> {
    let ((q, lq), (k, lk), (v, lv), bias) = x.parts();
    check_sizes(q, bias, &sh)?;
    fn go<T: FloatDType + CpuElem>(
        (q, k, v): (View<'_, T>, View<'_, T>, View<'_, T>),
        bias: Option<View<'_, T>>,
        sh: AttnShape,
    ) -> Result<(CpuData, CpuData)> {
        let (n, l, d) = (sh.batch * sh.heads, sh.l, sh.d);
        let mut out = alloc_uninit::<T>(n * l * d)?;
        let mut lse = alloc_uninit::<T::Acc>(n * l)?;
        let (threshold, keep) = sh.drop_threshold();
        let keep = T::Acc::c(keep);
        let o = RowsOut {
            ptr: out.as_mut_ptr(),
            len: out.len(),
            place: sh.out_place(),
        };
        let body = |(i, ls): Pair<'_, T::Acc>| {
            let pair = (i / sh.heads, i % sh.heads);
            let hash = sh.pair_hash(i);
            let (mut scores, mut acc) = (Vec::new(), vec![T::Acc::zero(); d]);
            for (qi, row_lse) in ls.iter_mut().enumerate() {
                let kb = (&k, bias.as_ref());
                let m = scores_of(q.row(pair, qi, d), kb, pair, (qi, &sh), &mut scores);
                acc.iter_mut().for_each(|a| *a = T::Acc::zero());
                let mut sum = T::Acc::zero();
                // a row that sees no key (or whose bias masks them all) gets
                // zeros; NaN scores stay NaN (max passes over them)
                let ninf = T::Acc::neg_infinity();
                let seen = if scores.iter().all(|&x| x == ninf) {
                    &[][..]
                } else {
                    &scores[..]
                };
                for (j, &x) in seen.iter().enumerate() {
                    let p = (x - m).exp();
                    sum = sum + p;
                    // dropout after the softmax's sum
                    let p = if sh.kept(hash, threshold, qi, j) {
                        p * keep
                    } else {
                        T::Acc::zero()
                    };
                    for (a, &vv) in acc.iter_mut().zip(v.row(pair, j, d)) {
                        *a = *a + p * vv.to_acc();
                    }
                }
                let inv = if sum == T::Acc::zero() {
                    T::Acc::zero()
                } else {
                    sum.recip()
                };
                // SAFETY: this thread alone computes the pair `i`'s rows, and
                // `out` outlives the parallel loop
                unsafe { o.write(pair, qi, acc.iter().map(|&a| T::from_acc(a * inv))) };
                *row_lse = if seen.is_empty() {
                    T::Acc::neg_infinity()
                } else {
                    m + sum.ln()
                };
            }
        };
        lse.par_chunks_mut(l).enumerate().for_each(body);
        Ok((T::wrap(out), T::Acc::wrap(lse)))
    }
    crate::dtype::dispatch_float!(q, qv => {
        let (kv, vv) = (same(qv, k)?, same(qv, v)?);
        let bias = match bias {
            Some((b, lb)) => Some(View::new(bias_slice(qv, b)?, lb)),
            None => None,
        };
        go((View::new(qv, lq), View::new(kv, lk), View::new(vv, lv)), bias, sh)
    }, other => Err(Error::dtype("attention", other.dtype(), "needs floating-point inputs")))
}

/// The bias `b` in `like`'s element type ([`check_sizes`] checked its dtype).
fn bias_slice<'a, T: CpuElem>(like: &[T], b: &'a CpuData) -> Result<&'a [T]> {
    super::reduce::same(like, b).ok_or_else(|| {
        Error::dtype(
            "attention",
            b.dtype(),
            "the bias must be in the operands' dtype",
        )
    })
}

/// The slice of `d` in `like`'s element type, or the error of mixed dtypes.
fn same<'a, T: CpuElem>(like: &[T], d: &'a CpuData) -> Result<&'a [T]> {
    super::reduce::same(like, d)
        .ok_or_else(|| Error::dtype("attention", d.dtype(), "q, k and v must share a dtype"))
}

/// The statistics `d` in `like`'s accumulator type.
fn acc_slice<'a, T: FloatDType>(_like: &[T], d: &'a CpuData) -> Result<&'a [T::Acc]> {
    T::Acc::slice(d).ok_or_else(|| {
        Error::dtype(
            "attention",
            d.dtype(),
            "the log-sum-exps must be in the accumulator dtype",
        )
    })
}

pub(crate) fn attention_backward(
    x: AttnOperands<'_, CpuData>,
    saved: AttnSaved<'_, CpuData>,
    sh: AttnShape,
) -> Result<AttnGrads<CpuData>> {
    let ((q, lq), (k, lk), (v, lv), bias) = x.parts();
    let (out, lse, (g, lg)) = saved.parts();
    check_sizes(q, bias, &sh)?;
    fn go<T: FloatDType + CpuElem>(
        (q, k, v, g): (View<'_, T>, View<'_, T>, View<'_, T>, View<'_, T>),
        bias: Option<View<'_, T>>,
        out: View<'_, T>,
        lse: &[T::Acc],
        sh: AttnShape,
    ) -> Result<AttnGrads<CpuData>> {
        let (n, l, s, d) = (sh.batch * sh.heads, sh.l, sh.s, sh.d);
        let mut grads = AttnGrads::alloc(&sh, alloc_uninit::<T>)?;
        // one pointer taken a buffer, so that no writer's reborrow
        // invalidates another's
        let raw = grads.per_grad(|b| (b.as_mut_ptr(), b.len()));
        let places = sh.grad_places();
        let [wq, wk, wv] = [0, 1, 2].map(|i| RowsOut {
            ptr: raw[i].0,
            len: raw[i].1,
            place: places[i],
        });
        let scale = T::Acc::c(sh.scale);
        let (threshold, keep) = sh.drop_threshold();
        let keep = T::Acc::c(keep);
        let body = |i: usize| {
            let pair = (i / sh.heads, i % sh.heads);
            let hash = sh.pair_hash(i);
            let zero = T::Acc::zero();
            let (mut gk, mut gv) = (vec![zero; s * d], vec![zero; s * d]);
            let (mut scores, mut gq) = (Vec::new(), vec![zero; d]);
            for qi in 0..l {
                let qr = q.row(pair, qi, d);
                let gr = g.row(pair, qi, d);
                let ls = lse[i * l + qi];
                // a row that saw no key: no weights, no gradients
                if ls == T::Acc::neg_infinity() {
                    scores.clear();
                } else {
                    scores_of(qr, (&k, bias.as_ref()), pair, (qi, &sh), &mut scores);
                }
                // D = Σ g · out, the softmax backward's row term
                let dsum = dot(gr, out.row(pair, qi, d));
                gq.iter_mut().for_each(|a| *a = zero);
                for (j, &x) in scores.iter().enumerate() {
                    let (kr, vr) = (k.row(pair, j, d), v.row(pair, j, d));
                    let p = (x - ls).exp();
                    // the dropout's factor: the weights' gradient is z · (g · v)
                    let z = if sh.kept(hash, threshold, qi, j) {
                        keep
                    } else {
                        zero
                    };
                    let ds = p * (dot(gr, vr) * z - dsum) * scale;
                    let pz = p * z;
                    for c in 0..d {
                        gq[c] = gq[c] + ds * kr[c].to_acc();
                        gk[j * d + c] = gk[j * d + c] + ds * qr[c].to_acc();
                        gv[j * d + c] = gv[j * d + c] + pz * gr[c].to_acc();
                    }
                }
                // SAFETY (here and below): this thread alone computes the
                // pair `i`'s rows, and the buffers outlive the parallel loop
                unsafe { wq.write(pair, qi, gq.iter().map(|&a| T::from_acc(a))) };
            }
            for j in 0..s {
                let (rk, rv) = (&gk[j * d..(j + 1) * d], &gv[j * d..(j + 1) * d]);
                unsafe { wk.write(pair, j, rk.iter().map(|&a| T::from_acc(a))) };
                unsafe { wv.write(pair, j, rv.iter().map(|&a| T::from_acc(a))) };
            }
        };
        (0..n).into_par_iter().for_each(body);
        Ok(grads.map(T::wrap))
    }
    crate::dtype::dispatch_float!(q, qv => {
        let views = (
            View::new(qv, lq),
            View::new(same(qv, k)?, lk),
            View::new(same(qv, v)?, lv),
            View::new(same(qv, g)?, lg),
        );
        let bias = match bias {
            Some((b, lb)) => Some(View::new(bias_slice(qv, b)?, lb)),
            None => None,
        };
        let place = sh.out_place();
        let out = View::new(same(qv, out)?, &place.layout([sh.batch, sh.heads, sh.l, sh.d]));
        go(views, bias, out, acc_slice(qv, lse)?, sh)
    }, other => Err(Error::dtype("attention", other.dtype(), "needs floating-point inputs")))
}
