//! Fused attention as one recorded op over the `attention` primitives: the
//! forward keeps q, k, v, the output and each row's log-sum-exp; the backward
//! recomputes the weights from them (FlashAttention's algorithm).

use super::{Storages, Tensor};
use crate::backend::op::{
    attn_view_fits, AttnGrads, AttnOperands, AttnPacking, AttnPlace, AttnSaved, AttnShape,
};
use crate::backend::Storage;
use crate::error::{Error, Result};
use crate::layout::Layout;

/// `t` (`[.., rows, cols]`) as a rank-4 view `[b, h, rows, cols]`: the batch
/// dims folded into two (a view where they fold, else a copy).
fn fold4(t: &Tensor) -> Result<Tensor> {
    let r = t.rank();
    let (rows, d) = (t.shape()[r - 2], t.shape()[r - 1]);
    match r {
        2 => t.reshape([1, 1, rows, d]),
        3 => t.unsqueeze(1),
        4 => Ok(t.clone()),
        _ => {
            let inner = t.shape()[r - 3];
            let outer: usize = t.shape()[..r - 3].iter().product();
            t.reshape([outer, inner, rows, d])
        }
    }
}

/// `t` (`[.., rows, d]`) as the rank-4 view `[b, h, rows, d]` the primitive
/// reads: its own view where its batch dims fold into two and its layout fits
/// the CUDA kernels' loads, else a contiguous copy.
fn as_rank4(t: &Tensor) -> Result<Tensor> {
    let t4 = fold4(t)?;
    if attn_view_fits(t4.layout(), t4.dtype()) {
        Ok(t4)
    } else {
        t4.contiguous()
    }
}

impl Tensor {
    /// Why [`fused_attention`](Self::fused_attention) does not run for queries
    /// like this tensor (`[.., L, d]`: its device, dtype and sizes) against `s`
    /// keys with dropout `dropout`, `None` where it runs.
    pub(crate) fn fused_attention_refusal(&self, s: usize, dropout: f64) -> Option<String> {
        let r = self.rank();
        if r < 2 {
            return Some("queries of fewer than 2 dims".into());
        }
        let (l, d) = (self.shape()[r - 2], self.shape()[r - 1]);
        let shape = AttnShape {
            batch: self.shape()[..r - 2].iter().product(),
            heads: 1,
            l,
            s,
            d,
            scale: 1.0,
            causal: false,
            dropout,
            seed: 0,
            packed: AttnPacking::Apart,
        };
        self.read().fused_attention_refusal(&shape)
    }

    /// `softmax(self kᵀ · scale) v` over the last two dims in one fused op
    /// (queries `self` `[.., L, d]`, keys and values `[.., S, d]` with the same
    /// batch dims and dtype; with `causal`, query `i` sees keys `0..=i`; with
    /// `dropout` in `[0, 1)` the weights are dropped after the softmax, by masks
    /// drawn from a seed forked from the device's generator and kept for
    /// backward), where the device runs it
    /// ([`fused_attention_refusal`](Self::fused_attention_refusal);
    /// `nn::functional::fused_attention_refusal` decides). `bias`, in the
    /// inputs' dtype and broadcasting to `[.., L, S]`, is added to the scaled
    /// scores (an additive mask: `-inf` hides a key; a query it leaves with no
    /// key gets zeros); it gets no gradient. No `[L, S]` matrix is made or kept
    /// (a bias is read where it lies, broadcast dims included). The output
    /// lies with the heads (the last batch dim) inside the rows, as PyTorch's
    /// fused kernels return it: joining the heads back is a view.
    pub(crate) fn fused_attention(
        &self,
        k: &Tensor,
        v: &Tensor,
        bias: Option<&Tensor>,
        opts: (f64, bool, f64),
    ) -> Result<Tensor> {
        let r = self.rank();
        if r < 2 || k.rank() != r || v.rank() != r {
            return Err(Error::invalid(
                "attention",
                "q, k and v need the same rank, at least 2",
            ));
        }
        let qkv4 = crate::autograd::no_grad(|| -> Result<_> {
            Ok([as_rank4(self)?, as_rank4(k)?, as_rank4(v)?])
        })?;
        fused(&[self, k, v], qkv4, bias, opts, AttnPacking::Apart)
    }

    /// [`fused_attention`](Self::fused_attention) of self-attention over a
    /// packed projection: `self` `[N, L, 3, H, d]` holds the queries, keys and
    /// values (`[.., 0, .., ..]`, `[.., 1, ..]`, `[.., 2, ..]`, as
    /// `linear(x, in_proj_weight)` makes them, reshaped); returns the heads'
    /// output `[N, H, L, d]`. The backward writes the three gradients into one
    /// `[N, L, 3, H, d]` tensor, laid out as `self` where it is dense (as
    /// `empty_like` would: a projection of a sequence-first input is a
    /// transposed view), so that the projection's gradient needs no copy, no
    /// zeros and no sum.
    pub(crate) fn fused_attention_packed(
        &self,
        bias: Option<&Tensor>,
        opts: (f64, bool, f64),
    ) -> Result<Tensor> {
        if self.rank() != 5 || self.shape()[2] != 3 {
            return Err(Error::invalid(
                "attention",
                format!(
                    "a packed projection is [N, L, 3, H, d], got {:?}",
                    self.shape()
                ),
            ));
        }
        let qkv4 = crate::autograd::no_grad(|| -> Result<_> {
            Ok([part4(self, 0)?, part4(self, 1)?, part4(self, 2)?])
        })?;
        let packing = AttnPacking::Qkv(packed_strides(self));
        fused(&[self], qkv4, bias, opts, packing)
    }

    /// [`fused_attention`](Self::fused_attention) of the queries `self` `[N,
    /// H, L, d]` over keys and values packed in one projection `kv` `[N, S, 2,
    /// H, d]` (as `MultiheadAttention` makes them from one input, PyTorch's
    /// `key is value`). The backward writes the keys' and values' gradients
    /// into one tensor laid out as `kv` where it is dense, as
    /// [`fused_attention_packed`](Self::fused_attention_packed) does.
    pub(crate) fn fused_attention_kv_packed(
        &self,
        kv: &Tensor,
        bias: Option<&Tensor>,
        opts: (f64, bool, f64),
    ) -> Result<Tensor> {
        let (q, k) = (self.shape(), kv.shape());
        if self.rank() != 4
            || kv.rank() != 5
            || k[2] != 2
            || [k[0], k[3], k[4]] != [q[0], q[1], q[3]]
        {
            return Err(Error::invalid(
                "attention",
                format!("queries [N, H, L, d] and a packed projection [N, S, 2, H, d] of the same N, H and d, got {q:?} and {k:?}"),
            ));
        }
        let qkv4 = crate::autograd::no_grad(|| -> Result<_> {
            Ok([as_rank4(self)?, part4(kv, 0)?, part4(kv, 1)?])
        })?;
        let packing = AttnPacking::Kv(packed_strides(kv));
        fused(&[self, kv], qkv4, bias, opts, packing)
    }
}

/// Part `i` of a packed projection `[N, rows, parts, H, d]` as the rank-4 view
/// `[N, H, rows, d]` the primitive reads (a copy where it does not fit).
fn part4(p: &Tensor, i: i64) -> Result<Tensor> {
    as_rank4(&p.select(2, i)?.transpose(1, 2)?)
}

/// The strides of the first four dims of a packed projection's gradient
/// (`[N, rows, parts, H, d]`): those `empty_like` gives it
/// ([`Layout::preserved_strides`]: its own where it is dense, as a projection
/// of a sequence-first input, a transposed view, is), row-major's where its
/// last dim would not be contiguous.
fn packed_strides(t: &Tensor) -> [usize; 4] {
    let st = (t.layout().preserved_strides())
        .filter(|st| st[4] == 1)
        .unwrap_or_else(|| crate::layout::contiguous_strides(t.shape()));
    [st[0], st[1], st[2], st[3]]
}

/// The fused op over the rank-4 views `[q4, k4, v4]` of `inputs` (q, k and v;
/// with `packed` the one projection they are parts of, or q and the projection
/// k and v are parts of: [`AttnPacking`]), recorded with the gradients of
/// `inputs`.
fn fused(
    inputs: &[&Tensor],
    [q4, k4, v4]: [Tensor; 3],
    bias: Option<&Tensor>,
    (scale, causal, dropout): (f64, bool, f64),
    packed: AttnPacking,
) -> Result<Tensor> {
    let (b, h, l, s, d) = (
        q4.shape()[0],
        q4.shape()[1],
        q4.shape()[2],
        k4.shape()[2],
        q4.shape()[3],
    );
    // the queries' shape: the packed op's output is [N, H, L, d]
    let qs = if matches!(packed, AttnPacking::Qkv(_)) {
        q4.shape().to_vec()
    } else {
        inputs[0].shape().to_vec()
    };
    let b4 = match bias {
        Some(bias) => {
            let mut to = qs[..qs.len() - 1].to_vec();
            to.push(s);
            Some(crate::autograd::no_grad(|| {
                fold4(&bias.detach().expand(&to[..])?)
            })?)
        }
        None => None,
    };
    let shape = AttnShape {
        batch: b,
        heads: h,
        l,
        s,
        d,
        scale,
        causal,
        dropout,
        // the masks' seed, drawn from the device's generator; kept for backward
        seed: if dropout > 0.0 {
            crate::backend::fork_seed(&q4.device())?
        } else {
            0
        },
        packed,
    };
    let (out, lse) = {
        let mut ts = vec![&q4, &k4, &v4];
        ts.extend(&b4);
        let st = Storages::read(&ts);
        let x = AttnOperands {
            q: (st.get(0), q4.layout()),
            k: (st.get(1), k4.layout()),
            v: (st.get(2), v4.layout()),
            bias: b4.as_ref().map(|b| (st.get(3), b.layout())),
        };
        let (out, lse) = Storage::attention(x, shape)?;
        drop(st);
        (
            placed(out, shape.out_place(), [b, h, l, d], &qs)?,
            Tensor::from_storage(lse, &[b * h * l]),
        )
    };
    let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
    Ok(Tensor::record(
        out,
        "scaled_dot_product_attention",
        inputs,
        |y| {
            let (y, q4, k4, v4) = (y.save(), q4.save(), k4.save(), v4.save());
            // the bias too: changed in place before backward is an error
            let b4 = b4.map(|b| b.save());
            move |g: &Tensor| {
                let (q4, k4, v4, y) = (q4.get()?, k4.get()?, v4.get()?, y.get()?);
                let b4 = b4.as_ref().map(|b| b.get()).transpose()?;
                let g4 = as_rank4(g)?;
                // `y`'s storage is the buffer the primitive wrote the output in
                let mut ts = vec![q4, k4, v4, y, &lse, &g4];
                ts.extend(b4);
                let st = Storages::read(&ts);
                let x = AttnOperands {
                    q: (st.get(0), q4.layout()),
                    k: (st.get(1), k4.layout()),
                    v: (st.get(2), v4.layout()),
                    bias: b4.map(|b| (st.get(6), b.layout())),
                };
                let saved = AttnSaved {
                    out: st.get(3),
                    lse: st.get(4),
                    g: (st.get(5), g4.layout()),
                };
                let grads = Storage::attention_backward(x, saved, shape)?;
                drop(st);
                let [pq, pk, pv] = shape.grad_places();
                // a packed buffer with the strides the primitive wrote it in
                let whole = |g: Storage, shape: &[usize], st: [usize; 4]| {
                    let layout = Layout::strided(shape, &[st[0], st[1], st[2], st[3], 1], 0);
                    Tensor::with_storage(g, layout)
                };
                match (grads, packed) {
                    (AttnGrads::Apart([dq, dk, dv]), AttnPacking::Apart) => Ok(vec![
                        Some(placed(dq, pq, [b, h, l, d], &shapes[0])?),
                        Some(placed(dk, pk, [b, h, s, d], &shapes[1])?),
                        Some(placed(dv, pv, [b, h, s, d], &shapes[2])?),
                    ]),
                    (AttnGrads::Qkv(g), AttnPacking::Qkv(st)) => {
                        Ok(vec![Some(whole(g, &shapes[0], st))])
                    }
                    (AttnGrads::Kv(dq, g), AttnPacking::Kv(st)) => Ok(vec![
                        Some(placed(dq, pq, [b, h, l, d], &shapes[0])?),
                        Some(whole(g, &shapes[1], st)),
                    ]),
                    _ => Err(Error::invalid(
                        "attention",
                        "the backward's gradients came back packed otherwise than asked",
                    )),
                }
            }
        },
    ))
}

/// A result buffer the primitive wrote where `place` says, as the `[b, h,
/// rows, d]` view `dims` and then as `shape` (its batch dims unfolded: always
/// a view for the folds of `fold4`; the backward reads the saved output's
/// storage where `place` says, so a copy would be wrong).
fn placed(s: Storage, place: AttnPlace, dims: [usize; 4], shape: &[usize]) -> Result<Tensor> {
    let t = Tensor::with_storage(s, place.layout(dims));
    match t.layout().view(shape) {
        Some(l) => Ok(t.with_layout_owned(l)),
        None => Err(Error::invalid(
            "attention",
            format!("the result {dims:?} does not unfold into {shape:?} as a view"),
        )),
    }
}
