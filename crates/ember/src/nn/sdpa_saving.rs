//! The memory-saving attention path: attention computed a group of heads (or of
//! a head's queries) at a time, keeping no `[L, S]` weights for backward.

use super::sdpa::{
    attention_path, broadcasts_into, recomputable_operands, AttentionPath, GROUP_SCORES,
};
use crate::{
    dtype::DType,
    error::{Error, Result},
    tensor::Tensor,
};

/// Attention that keeps no `[L, S]` matrix for backward (where
/// [`attention_path`] asks for it): `softmax(q·kᵀ·scale + biases)·v` computed a
/// group of heads at a time (at most about 4M scores at once by default; a head
/// whose `L·S` scores exceed that, a block of its queries at a time, so that
/// memory grows linearly with the length), saving only the inputs, the output
/// and each row's log-sum-exp; the backward recomputes each group's weights from
/// them (the memory-efficient attention of the GPU libraries, written with tensor
/// ops so that every device runs it), summing the keys' and values' gradients
/// over a head's query blocks as they come. Each group's results are copied to
/// their place as it finishes. The group size is
/// [`with_attention_group_scores`]'s.
///
/// Each of `biases` is additive (`-inf` where a key is masked), without a gradient,
/// in the inputs' dtype, and broadcasts to the batch + `[L, S]` (a key padding
/// mask's `[N, 1, 1, S]` is added to each group's scores without being expanded).
/// A row with every key masked gives zeros (SDPA's convention). `dropout_p` in `[0, 1)` drops weights
/// after the softmax; the backward draws the same masks again from a seed kept
/// per group. Float16 and bfloat16 inputs are computed in float32, a group at a
/// time, and the results rounded once.
///
/// `None` where it does not apply (dtypes other than the floats, batch dims that
/// differ between q, k and v, a bias that does not fit): the caller computes it
/// plainly.
pub(crate) fn attention_saving_memory(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    biases: impl FnOnce() -> Result<Vec<Tensor>>,
    scale: f64,
    dropout_p: f64,
) -> Result<Option<Tensor>> {
    let r = q.rank();
    let dt = q.dtype();
    if !recomputable_operands(q, k, v, dropout_p) {
        return Ok(None);
    }
    let batch = &q.shape()[..r - 2];
    let n: usize = batch.iter().product();
    let (l, e) = (q.shape()[r - 2], q.shape()[r - 1]);
    let (s, ev) = (k.shape()[r - 2], v.shape()[r - 1]);
    if n * l * s == 0 {
        return Ok(None);
    }
    match attention_path() {
        AttentionPath::Math => return Ok(None),
        AttentionPath::Auto | AttentionPath::Fused
            if crate::autograd::is_grad_enabled() && n * l * s <= 1 << 22 =>
        {
            return Ok(None)
        }
        _ => {}
    }
    // the groups cut a batch of at least one dim
    let dims: Vec<usize> = if batch.is_empty() {
        vec![1]
    } else {
        batch.to_vec()
    };
    let mut full = dims.clone();
    full.extend([l, s]);
    // the biases are built only once this path is taken, then padded to the
    // scores' rank (views)
    let mut padded = Vec::new();
    for b in biases()? {
        if b.requires_grad() || b.dtype() != dt || !broadcasts_into(&b, &full) {
            return Ok(None);
        }
        let mut b = b;
        while b.rank() < full.len() {
            b = b.unsqueeze(0)?;
        }
        padded.push(b);
    }
    let dev = q.device();
    let seed = if dropout_p > 0.0 {
        crate::backend::fork_seed(&dev)?
    } else {
        0
    };
    let budget = GROUP_SCORES.with(|p| p.get());
    let per = (budget / (l * s)).max(1);
    // a row of the batch whose scores exceed the budget is cut along its queries
    // too, so that memory grows linearly with the length
    let block = if l * s > budget {
        (budget / s).clamp(1, l)
    } else {
        l
    };
    let groups = plan_groups(&dims, (l, block), s, per, &padded, seed)?;
    // half types are computed in float32, a group at a time
    let cdt = if dt == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let dropout = (dropout_p > 0.0).then_some(dropout_p);
    let (q3, k3, v3) = (
        q.reshape([n, l, e])?,
        k.reshape([n, s, e])?,
        v.reshape([n, s, ev])?,
    );
    let (out, lse) = crate::autograd::no_grad(|| {
        crate::tensor::autocast::without(|| -> Result<(Tensor, Tensor)> {
            let (mut outs, mut lses) = (Assembled::new(n, l), Assembled::new(n, l));
            for g in &groups {
                let qc = g.query_rows(&q3)?.to_dtype(cdt)?;
                let kc = g.rows(&k3)?.to_dtype(cdt)?;
                let (w, m) = group_weights(&qc, &kc, g, None, scale)?;
                let w = match dropout {
                    Some(p) => w.mul(&g.keep(p, cdt, &dev)?)?,
                    None => w,
                };
                outs.put(g, &w.matmul(&g.rows(&v3)?.to_dtype(cdt)?)?)?;
                lses.put(g, &m)?;
            }
            Ok((outs.take()?.to_dtype(dt)?, lses.take()?))
        })
    })?;
    let mut shape = batch.to_vec();
    shape.extend([l, ev]);
    let out = out.reshape(&shape)?;
    let (qs, ks, vs) = (q.shape().to_vec(), k.shape().to_vec(), v.shape().to_vec());
    Ok(Some(Tensor::record(
        out,
        "scaled_dot_product_attention",
        &[q, k, v],
        |y| {
            let (y, qsv, ksv, vsv) = (y.save(), q.save(), k.save(), v.save());
            move |g: &Tensor| {
                crate::tensor::autocast::without(|| {
                    let q3 = qsv.get()?.reshape([n, l, e])?;
                    let k3 = ksv.get()?.reshape([n, s, e])?;
                    let v3 = vsv.get()?.reshape([n, s, ev])?;
                    let g = g.reshape([n, l, ev])?;
                    let o = y.get()?.reshape([n, l, ev])?;
                    let mut dqs = Assembled::new(n, l);
                    let (mut dks, mut dvs): (Vec<Tensor>, Vec<Tensor>) = (Vec::new(), Vec::new());
                    for grp in &groups {
                        let qc = grp.query_rows(&q3)?.to_dtype(cdt)?;
                        let kc = grp.rows(&k3)?.to_dtype(cdt)?;
                        let vc = grp.rows(&v3)?.to_dtype(cdt)?;
                        let gc = grp.query_rows(&g)?.to_dtype(cdt)?;
                        // D = rowsum(dO ∘ O): the softmax backward's row term (also
                        // with dropout, O being the dropped weights' product)
                        let dc = gc.mul(&grp.query_rows(&o)?.to_dtype(cdt)?)?.sum(-1, true)?;
                        let (w, _) = group_weights(&qc, &kc, grp, Some(&lse), scale)?;
                        let dwd = gc.matmul(&vc.transpose(1, 2)?)?;
                        let (wd, dw) = match dropout {
                            Some(p) => {
                                let keep = grp.keep(p, cdt, &dev)?;
                                (w.mul(&keep)?, dwd.mul(&keep)?)
                            }
                            None => (w.clone(), dwd),
                        };
                        let dv = wd.transpose(1, 2)?.matmul(&gc)?;
                        let ds = w.mul(&dw.sub(&dc)?)?.mul(scale)?;
                        dqs.put(grp, &ds.matmul(&kc)?)?;
                        let dk = ds.transpose(1, 2)?.matmul(&qc)?;
                        // the keys' and values' gradients summed over a row's
                        // query blocks as they come (each block's is whole)
                        match (dks.last(), dvs.last()) {
                            (Some(k), Some(v)) if grp.q0 > 0 => {
                                k.add_(&dk)?;
                                v.add_(&dv)?;
                            }
                            _ => {
                                dks.push(dk);
                                dvs.push(dv);
                            }
                        }
                    }
                    let rows = |parts: Vec<Tensor>, shape: &[usize]| -> Result<Tensor> {
                        let refs: Vec<&Tensor> = parts.iter().collect();
                        Tensor::cat(&refs, 0)?.to_dtype(dt)?.reshape(shape)
                    };
                    Ok(vec![
                        Some(dqs.take()?.to_dtype(dt)?.reshape(&qs)?),
                        Some(rows(dks, &ks)?),
                        Some(rows(dvs, &vs)?),
                    ])
                })
            }
        },
    )))
}

/// One group of the memory-saving attention: rows `[start, start + len)` of the
/// flattened batch, and of their queries `[q0, q0 + qlen)` (all of them unless a
/// row's scores exceed the budget). The rows are rectangular in the batch dims,
/// so that the scores viewed as `view` (`[1, .., c, the dims after, .., qlen, S]`)
/// take each bias's slice (a view) by broadcasting.
struct Group {
    start: usize,
    len: usize,
    q0: usize,
    qlen: usize,
    view: Vec<usize>,
    biases: Vec<Tensor>,
    /// The seed of this group's dropout masks.
    seed: u64,
}

impl Group {
    /// This group's rows of a `[n, .., ..]` tensor (the keys and values).
    fn rows(&self, t: &Tensor) -> Result<Tensor> {
        t.narrow(0, self.start as i64, self.len)
    }

    /// This group's rows and queries of a `[n, L, ..]` tensor (the queries, the
    /// output, its gradient, the log-sum-exps).
    fn query_rows(&self, t: &Tensor) -> Result<Tensor> {
        self.rows(t)?.narrow(1, self.q0 as i64, self.qlen)
    }

    /// The kept weights' multiplier (`1/(1 - p)` or 0), drawn from this group's
    /// seed: the same tensor in forward and backward.
    fn keep(&self, p: f64, dtype: DType, device: &crate::device::Device) -> Result<Tensor> {
        let shape = [
            self.len,
            self.view[self.view.len() - 2],
            self.view[self.view.len() - 1],
        ];
        let u = crate::backend::generator::Generator::new(self.seed)
            .scope(|| Tensor::uniform(0.0, 1.0, shape, DType::F32, device))?;
        u.ge(p)?.to_dtype(dtype)?.mul(1.0 / (1.0 - p))
    }
}

/// A `[n, L, ..]` result written a group's part at a time (each part is freed
/// once copied, so that the parts never all live at once).
struct Assembled {
    n: usize,
    l: usize,
    into: Option<Tensor>,
}

impl Assembled {
    fn new(n: usize, l: usize) -> Assembled {
        Assembled { n, l, into: None }
    }

    /// Copies `g`'s part (`[len, qlen, d]`) to its place.
    fn put(&mut self, g: &Group, part: &Tensor) -> Result<()> {
        let into = match &self.into {
            Some(t) => t,
            None => self.into.insert(Tensor::empty(
                [self.n, self.l, part.shape()[2]],
                part.dtype(),
                &part.device(),
            )?),
        };
        into.narrow(0, g.start as i64, g.len)?
            .narrow(1, g.q0 as i64, g.qlen)?
            .copy_(part)
    }

    /// The whole result (every row and query was put).
    fn take(self) -> Result<Tensor> {
        self.into
            .ok_or_else(|| Error::invalid("attention", "no group to assemble (a bug in ember)"))
    }
}

/// Cuts a batch of `dims` into groups of about `per` rows each (at least one)
/// that are rectangular: a range of one dim, whole in the dims after it, one
/// index in the dims before; each group's `l` queries in blocks of `block`.
/// `biases` are padded to `dims + [L, S]` and broadcast to it.
fn plan_groups(
    dims: &[usize],
    (l, block): (usize, usize),
    s: usize,
    per: usize,
    biases: &[Tensor],
    seed: u64,
) -> Result<Vec<Group>> {
    let k = dims.len();
    let after = |j: usize| -> usize { dims[j + 1..].iter().product() };
    // the first dim whose following dims fit in one group (the last one always does)
    let j = (0..k).find(|&j| after(j) <= per).unwrap_or(k - 1);
    let inner = after(j);
    let step = (per / inner).clamp(1, dims[j]);
    let outer: usize = dims[..j].iter().product();
    let mut groups = Vec::new();
    for o in 0..outer {
        let mut index = vec![0; j];
        let mut rest = o;
        for d in (0..j).rev() {
            index[d] = rest % dims[d];
            rest /= dims[d];
        }
        for at in (0..dims[j]).step_by(step) {
            let c = step.min(dims[j] - at);
            for q0 in (0..l).step_by(block) {
                let qlen = block.min(l - q0);
                let mut view = vec![1; j];
                view.push(c);
                view.extend(&dims[j + 1..]);
                view.extend([qlen, s]);
                let sliced = biases
                    .iter()
                    .map(|b| {
                        let mut b = b.clone();
                        for (d, &i) in index.iter().enumerate() {
                            if b.shape()[d] != 1 {
                                b = b.narrow(d as i64, i as i64, 1)?;
                            }
                        }
                        if b.shape()[j] != 1 {
                            b = b.narrow(j as i64, at as i64, c)?;
                        }
                        // the queries' axis, right after the batch dims
                        let qa = dims.len();
                        if b.shape()[qa] != 1 {
                            b = b.narrow(qa as i64, q0 as i64, qlen)?;
                        }
                        Ok(b)
                    })
                    .collect::<Result<Vec<_>>>()?;
                let number = groups.len() as u64;
                groups.push(Group {
                    start: (o * dims[j] + at) * inner,
                    len: c * inner,
                    q0,
                    qlen,
                    view,
                    biases: sliced,
                    seed: crate::backend::split_mix(
                        seed ^ number.wrapping_mul(0xD1B5_4A32_D192_ED03),
                    ),
                });
            }
        }
    }
    Ok(groups)
}

/// The attention weights of one group from its queries and keys (in the compute
/// dtype): `exp(scores - lse)` with `lse` computed here when not given; a fully
/// masked row's `-inf` is shifted by 0 (its weights become 0, SDPA's zeros).
fn group_weights(
    qc: &Tensor,
    kc: &Tensor,
    g: &Group,
    lse: Option<&Tensor>,
    scale: f64,
) -> Result<(Tensor, Tensor)> {
    let mut sc = qc.mul(scale)?.matmul(&kc.transpose(1, 2)?)?;
    if !g.biases.is_empty() {
        let shape = sc.shape().to_vec();
        let mut viewed = sc.reshape(&g.view)?;
        for b in &g.biases {
            viewed = viewed.add(&b.to_dtype(sc.dtype())?)?;
        }
        sc = viewed.reshape(&shape)?;
    }
    let m = match lse {
        Some(m) => g.query_rows(m)?,
        None => sc.logsumexp(-1, true)?,
    };
    let shift = m.isinf()?.where_(0.0, &m)?;
    Ok((sc.sub(&shift)?.exp()?, m))
}
