//! Scaled dot-product attention (`F.scaled_dot_product_attention`) and its three
//! paths: the fused op, the memory-saving composite, and the plain composite,
//! chosen per thread by [`AttentionPath`]. Re-exported from `nn::functional`.

use super::functional::dropout;
use crate::{
    dtype::DType,
    error::{Error, Result},
    tensor::Tensor,
};

/// Attention `softmax(q kᵀ · scale + mask) v` over the last two dims
/// (`F.scaled_dot_product_attention`): `q` is `[..., L, E]`, `k` `[..., S, E]`,
/// `v` `[..., S, Ev]`, the leading dims broadcast. `attn_mask` broadcasts to
/// `[..., L, S]`: a bool mask says which keys each query may attend to, a float
/// mask is added to the scores. `is_causal` lets query `i` attend to keys `0..=i`
/// (the mask's top-left triangle; not together with `attn_mask`). `scale`
/// defaults to `1/sqrt(E)`. A query that may attend to no key gets zeros, as in
/// PyTorch. `dropout_p` drops attention weights (always: pass 0 in evaluation).
pub fn scaled_dot_product_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    attn_mask: Option<&Tensor>,
    dropout_p: f64,
    is_causal: bool,
    scale: Option<f64>,
) -> Result<Tensor> {
    let _record = crate::profiler::function("scaled_dot_product_attention");
    const OP: &str = "scaled_dot_product_attention";
    let mut ts = vec![q, k, v];
    ts.extend(attn_mask.filter(|m| m.dtype().is_float()));
    if let Some(c) = crate::tensor::autocast::lower(&ts)? {
        let mask = match attn_mask {
            Some(m) if m.dtype().is_float() => Some(&c[3]),
            m => m,
        };
        return scaled_dot_product_attention(
            &c[0], &c[1], &c[2], mask, dropout_p, is_causal, scale,
        );
    }
    if q.rank() < 2 || k.rank() < 2 || v.rank() < 2 {
        return Err(Error::invalid(
            OP,
            format!(
                "Expected query, key, and value to all be at least 2 dimensional, but got query.dim: {} key.dim: {} and value.dim: {} instead.",
                q.rank(),
                k.rank(),
                v.rank()
            ),
        ));
    }
    if q.dtype() != k.dtype() || q.dtype() != v.dtype() {
        return Err(Error::DTypeMismatch {
            op: OP,
            lhs: q.dtype(),
            rhs: if q.dtype() != k.dtype() {
                k.dtype()
            } else {
                v.dtype()
            },
        });
    }
    if is_causal && attn_mask.is_some() {
        return Err(Error::invalid(
            OP,
            "_scaled_dot_product_attention: Explicit attn_mask should not be set when is_causal=True",
        ));
    }
    if let Some(m) = attn_mask {
        if ![DType::Bool, DType::F32, q.dtype()].contains(&m.dtype()) {
            return Err(Error::dtype(
                OP,
                m.dtype(),
                format!(
                    "Expected attn_mask dtype to be bool or float or to match query dtype, but got attn_mask.dtype: {} and query.dtype: {}",
                    m.dtype(),
                    q.dtype()
                ),
            ));
        }
    }
    // a float32 mask with queries of another float dtype is added in theirs
    let cast;
    let attn_mask = match attn_mask {
        Some(m) if m.dtype() == DType::F32 && q.dtype() != DType::F32 => {
            cast = m.to_dtype(q.dtype())?;
            Some(&cast)
        }
        m => m,
    };
    let e = q.shape()[q.rank() - 1];
    let (l, s) = (q.shape()[q.rank() - 2], k.shape()[k.rank() - 2]);
    let scale = scale.unwrap_or(1.0 / (e as f64).sqrt());
    if let Some(m) = attn_mask {
        // the mask broadcasts to the scores (PyTorch adds it to them)
        let mut sshape = q.shape()[..q.rank() - 1].to_vec();
        sshape.push(s);
        crate::layout::broadcast_shapes(OP, m.shape(), &sshape)?;
    }
    let refusal = if fused_mask_fits(attn_mask, q, s) {
        fused_attention_refusal(q, k, v, dropout_p)
    } else {
        Some(
            "a mask it does not take (a float mask that needs a gradient, one on another \
             device, or one that widens the scores)"
                .into(),
        )
    };
    if refusal.is_none() {
        log_attention_path(q, s, "fused", None);
        let bias = attn_mask
            .map(|m| mask_bias(m, false, q.dtype()))
            .transpose()?;
        return q.fused_attention(k, v, bias.as_ref(), (scale, is_causal, dropout_p));
    }
    // which keys each query may attend to (None: all)
    let allowed = match attn_mask {
        Some(m) if m.dtype() == DType::Bool => Some(m.clone()),
        _ if is_causal => Some(Tensor::triangle_mask(l, s, 0, true, &q.device())?),
        _ => None,
    };
    // the path that keeps no [L, S] weights for backward, where it applies
    let biases = || -> Result<Vec<Tensor>> {
        Ok(match (attn_mask, &allowed) {
            (Some(m), _) if m.dtype() != DType::Bool => vec![m.clone()],
            (_, Some(a)) => vec![mask_bias(a, false, q.dtype())?],
            _ => Vec::new(),
        })
    };
    if let Some(out) =
        super::sdpa_saving::attention_saving_memory(q, k, v, biases, scale, dropout_p)?
    {
        log_attention_path(q, s, "memory-saving", refusal.as_deref());
        return Ok(out);
    }
    log_attention_path(q, s, "plain", refusal.as_deref());
    // scaling the queries ([.., L, E]) costs less than scaling the scores ([.., L, S])
    let scores = q.mul(scale)?.matmul(&k.transpose(-2, -1)?)?;
    // rows a float mask leaves with no finite score: zeros, as PyTorch's safe
    // softmax gives (the scores are read back on the CPU to skip this pass where
    // every row has one); their scores are set to 0 before the softmax so that
    // no NaN reaches the gradient either
    let (scores, no_key) = match attn_mask {
        Some(m) if m.dtype() != DType::Bool => {
            let scores = scores.add(m)?;
            let none = scores.eq(f64::NEG_INFINITY)?.all(-1, true)?;
            if !none.device().is_cpu() || none.any_all()?.item::<bool>()? {
                (scores.masked_fill(&none, 0.0)?, Some(none))
            } else {
                (scores, None)
            }
        }
        _ => (scores, None),
    };
    let weights = match &allowed {
        Some(a) => {
            let blocked = a.logical_not()?;
            let w = scores
                .masked_fill(&blocked, f64::NEG_INFINITY)?
                .softmax(-1)?;
            // a query with no key to attend to: zeros, not NaN (a mask in host
            // memory is read to skip this pass where every query has a key)
            let none = blocked.all(-1, true)?;
            let any_empty = !none.device().is_cpu() || none.any_all()?.item::<bool>()?;
            if any_empty {
                w.masked_fill(&none, 0.0)?
            } else {
                w
            }
        }
        None => {
            let w = scores.softmax(-1)?;
            match &no_key {
                Some(none) => w.masked_fill(none, 0.0)?,
                None => w,
            }
        }
    };
    let weights = dropout(&weights, dropout_p, dropout_p > 0.0)?;
    weights.matmul(v)
}

/// An attention mask as the additive bias the memory-saving path takes: a float
/// mask as it is; a bool mask as 0 and `-inf`, `-inf` where it is `true` when
/// `true_masks` (MultiheadAttention's convention) or where it is `false`
/// (SDPA's: `true` allows).
pub(crate) fn mask_bias(m: &Tensor, true_masks: bool, dtype: DType) -> Result<Tensor> {
    if m.dtype() != DType::Bool {
        return Ok(m.clone());
    }
    let masked = if true_masks {
        m.clone()
    } else {
        m.logical_not()?
    };
    Tensor::zeros(m.shape(), dtype, &m.device())?.masked_fill(&masked, f64::NEG_INFINITY)
}

/// Which computation `scaled_dot_product_attention` and `MultiheadAttention`
/// (without weights asked for) use, chosen per thread like PyTorch's
/// `torch.nn.attention.sdpa_kernel` switches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttentionPath {
    /// The fused kernel on GPUs where it applies (FlashAttention's algorithm on
    /// tensor cores: f16/bf16 and float32 on compute capability 8.0 or later,
    /// head dims that are multiples of 8 up to 128, bool masks
    /// and float masks that need no gradient (read as an additive bias,
    /// broadcast dims in place), dropout below 1;
    /// `meta` estimates as the GPU an estimate names, sm_90 unless told). Elsewhere the memory-saving path where the scores
    /// of one call exceed 2²² elements (16 MiB in f32) or no gradient is recorded,
    /// and the plain path otherwise, whose backward is faster because it keeps the
    /// weights (default).
    #[default]
    Auto,
    /// The fused op wherever it applies, the CPU and float32/float64 included (on
    /// the CPU it computes a query row at a time; on CUDA only the f16/bf16/f32
    /// kernels exist, so float64 there goes as [`Auto`](Self::Auto)); elsewhere
    /// as `Auto`.
    Fused,
    /// The memory-saving path wherever it applies: no `[L, S]` weights are kept
    /// for backward, which recomputes them a group of heads at a time.
    MemoryEfficient,
    /// The plain path: the weights are materialised and kept for backward.
    Math,
}

thread_local! {
    static ATTENTION_PATH: std::cell::Cell<AttentionPath> =
        const { std::cell::Cell::new(AttentionPath::Auto) };
    pub(super) static GROUP_SCORES: std::cell::Cell<usize> = const { std::cell::Cell::new(1 << 22) };
}

/// Runs `f` with the memory-saving attention computing at most `scores` scores at
/// once on this thread (at least one head's `[L, S]`; restored after). The default,
/// 2²² (16 MiB of float32 scores, a few such buffers live at a time), balances
/// memory against the number of products; less saves memory, more saves launches.
pub fn with_attention_group_scores<R>(scores: usize, f: impl FnOnce() -> R) -> R {
    with_setting(&GROUP_SCORES, scores, f)
}

/// Runs `f` with the thread-local `setting` holding `value`, restored after (also
/// when `f` panics).
fn with_setting<T: Copy + 'static, R>(
    setting: &'static std::thread::LocalKey<std::cell::Cell<T>>,
    value: T,
    f: impl FnOnce() -> R,
) -> R {
    struct Restore<T: Copy + 'static>(&'static std::thread::LocalKey<std::cell::Cell<T>>, T);
    impl<T: Copy + 'static> Drop for Restore<T> {
        fn drop(&mut self) {
            self.0.with(|c| c.set(self.1));
        }
    }
    let _restore = Restore(setting, setting.with(|c| c.replace(value)));
    f()
}

/// Whether the fused op takes `mask` as its additive bias for queries `q` over
/// `s` keys: none, or a bool mask or a float mask in q's dtype, on q's device,
/// that needs no gradient (the fused op gives the bias none) and broadcasts to
/// the scores' shape (q's batch dims + `[L, S]`) without widening it.
pub(crate) fn fused_mask_fits(mask: Option<&Tensor>, q: &Tensor, s: usize) -> bool {
    mask.is_none_or(|m| {
        let r = q.rank();
        let mut scores = q.shape()[..r - 1].to_vec();
        scores.push(s);
        (m.dtype() == DType::Bool || m.dtype() == q.dtype())
            && !m.requires_grad()
            && m.device() == q.device()
            && broadcasts_into(m, &scores)
    })
}

/// Whether mask or bias `m` broadcasts to the scores' shape `scores` without
/// widening it: no more dims, each 1 or the scores'.
pub(super) fn broadcasts_into(m: &Tensor, scores: &[usize]) -> bool {
    m.rank() <= scores.len()
        && m.shape()
            .iter()
            .rev()
            .zip(scores.iter().rev())
            .all(|(&have, &want)| have == 1 || have == want)
}

/// Why attention of `q` over `k`/`v` with dropout `dropout_p` does not take the
/// fused op on this thread's [`attention_path`], `None` where it does: it needs
/// one float dtype outside autocast's casts, the same batch dims, one head dim
/// for q, k and v, no empty operand, dropout in `[0, 1)`, one device, and a
/// device that runs it (on the CPU, `AttentionPath::Fused` asking for it).
pub(crate) fn fused_attention_refusal(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    dropout_p: f64,
) -> Option<String> {
    let r = q.rank();
    let path = attention_path();
    if matches!(path, AttentionPath::Math | AttentionPath::MemoryEfficient) {
        return Some(format!("AttentionPath::{path:?} asked for"));
    }
    let why = if !recomputable_operands(q, k, v, dropout_p) {
        "operands it does not take (dtypes, ranks or batch dims that differ, a \
         non-float dtype, dropout outside [0, 1), or inputs autocast still casts)"
    } else if v.shape()[r - 1] != q.shape()[r - 1] {
        "values of another head dim than the queries"
    } else if q.numel() == 0 || k.numel() == 0 {
        "an empty operand"
    } else if q.device() != k.device() || q.device() != v.device() {
        "operands on different devices"
    } else if path == AttentionPath::Auto && q.device().is_cpu() {
        "the CPU runs it only when AttentionPath::Fused asks for it"
    } else {
        return q.fused_attention_refusal(k.shape()[r - 2], dropout_p);
    };
    Some(why.into())
}

/// Whether `EMBER_ATTENTION_LOG` asks for each attention call's path on stderr.
fn log_paths() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("EMBER_ATTENTION_LOG").is_some_and(|v| v != "0"))
}

/// Says on stderr, where `EMBER_ATTENTION_LOG` asks for it, which path attention
/// of queries `q` over `s` keys takes and why not the fused op (`why`), each
/// distinct line once.
pub(crate) fn log_attention_path(q: &Tensor, s: usize, path: &str, why: Option<&str>) {
    if !log_paths() {
        return;
    }
    let mut line = format!(
        "ember: attention of {:?} {} queries over {s} keys on {}: {path}",
        q.shape(),
        q.dtype(),
        q.device()
    );
    if let Some(w) = why {
        line += &format!(" (not fused: {w})");
    }
    static SEEN: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    if !seen.contains(&line) {
        eprintln!("{line}");
        seen.push(line);
    }
}

/// Whether q, k and v suit the paths that recompute the weights in backward (the
/// fused op and the memory-saving one): one float dtype that autocast would not
/// cast again (its casts are the caller's; inputs it would still cast take the
/// plain path, whose ops autocast handles one by one), the same rank and batch
/// dims (no broadcasting), keys and values of one length, q and k of one head
/// dim, and dropout in `[0, 1)`.
pub(super) fn recomputable_operands(q: &Tensor, k: &Tensor, v: &Tensor, dropout_p: f64) -> bool {
    let r = q.rank();
    let dt = q.dtype();
    r >= 2
        && !crate::tensor::autocast::would_lower(&[q, k, v])
        && k.rank() == r
        && v.rank() == r
        && dt.is_float()
        && k.dtype() == dt
        && v.dtype() == dt
        && q.shape()[..r - 2] == k.shape()[..r - 2]
        && q.shape()[..r - 2] == v.shape()[..r - 2]
        && k.shape()[r - 2] == v.shape()[r - 2]
        && k.shape()[r - 1] == q.shape()[r - 1]
        && (0.0..1.0).contains(&dropout_p)
}

/// This thread's attention path.
pub fn attention_path() -> AttentionPath {
    ATTENTION_PATH.with(|p| p.get())
}

/// Runs `f` with this thread's attention path set to `path` (restored after).
pub fn with_attention_path<R>(path: AttentionPath, f: impl FnOnce() -> R) -> R {
    with_setting(&ATTENTION_PATH, path, f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Device;

    fn qkv(dt: DType, d: usize, dv: usize, dev: &Device) -> Result<[Tensor; 3]> {
        Ok([
            Tensor::zeros([2, 3, 10, d], dt, dev)?,
            Tensor::zeros([2, 3, 12, d], dt, dev)?,
            Tensor::zeros([2, 3, 12, dv], dt, dev)?,
        ])
    }

    /// Each reason the fused op is not taken is said, and none where it is:
    /// head dims and dtypes the kernels do not take (on `meta`, as on the GPU it
    /// models), a GPU older than sm_80, the path asked for, the CPU without
    /// `Fused`, and values of another head dim.
    #[test]
    fn the_fused_op_says_why_it_is_not_taken() -> Result<()> {
        let why = |dt: DType, d: usize, dv: usize, dev: &Device| -> Result<Option<String>> {
            let [q, k, v] = qkv(dt, d, dv, dev)?;
            Ok(fused_attention_refusal(&q, &k, &v, 0.0))
        };
        let has = |got: Option<String>, want: &str| {
            let got = got.unwrap_or_default();
            assert!(got.contains(want), "{got:?} does not say {want:?}");
        };
        let meta = Device::Meta;
        assert_eq!(why(DType::BF16, 64, 64, &meta)?, None);
        assert_eq!(why(DType::F32, 64, 64, &meta)?, None);
        has(
            why(DType::BF16, 136, 136, &meta)?,
            "multiple of 8 up to 128",
        );
        assert_eq!(why(DType::F32, 128, 128, &meta)?, None);
        has(why(DType::F64, 64, 64, &meta)?, "got float64");
        has(why(DType::BF16, 64, 32, &meta)?, "another head dim");
        has(
            crate::backend::meta::account::with_arch(75, || why(DType::BF16, 64, 64, &meta))?,
            "compute capability 8.0",
        );
        has(
            with_attention_path(AttentionPath::Math, || why(DType::BF16, 64, 64, &meta))?,
            "AttentionPath::Math asked for",
        );
        has(
            why(DType::F32, 64, 64, &Device::Cpu)?,
            "AttentionPath::Fused asks",
        );
        assert_eq!(
            with_attention_path(AttentionPath::Fused, || why(
                DType::F64,
                64,
                64,
                &Device::Cpu
            ))?,
            None
        );
        Ok(())
    }
}
