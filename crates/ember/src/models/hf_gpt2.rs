//! GPT-2's published weights (Hugging Face's `GPT2LMHeadModel` and `GPT2Model`
//! state dicts, `pytorch_model.bin`) under [`CharGpt`]'s names.

use super::{CharGpt, GptConfig};
use crate::{
    device::Device,
    error::{Error, Result},
    tensor::Tensor,
};

/// GPT-2 (124M) exactly as published: [`GptConfig::gpt2`] (50257 tokens) built
/// by [`CharGpt::new_gpt2`] (tied head, tanh GELU), weights drawn as GPT-2's.
/// Load GPT-2's weights into it with [`gpt2_state_from_hf`]:
///
/// ```no_run
/// use ember::nn::Module;
/// use ember::prelude::*;
/// let dev = Device::cuda_if_available(0);
/// let model = ember::models::gpt2(&dev)?;
/// let hf = ember::io::load_pt("pytorch_model.bin", &dev)?;
/// model.load_state_dict(&ember::models::gpt2_state_from_hf(&hf)?, true)?;
/// # Ok::<(), ember::Error>(())
/// ```
pub fn gpt2(device: &Device) -> Result<CharGpt> {
    CharGpt::new_gpt2(GptConfig::gpt2(), device)
}

/// A Hugging Face GPT-2 state dict (any size: `gpt2`, `gpt2-medium`, ...) under
/// the names of [`CharGpt`] built by [`CharGpt::new_gpt2`], `Conv1D` weights
/// transposed (as views: nothing is copied until the model loads them). The
/// names are mapped as this table says; a name it does not know is an error
/// naming it, and so is an `lm_head.weight` that differs from `wte.weight`
/// (ember's GPT-2 ties them).
///
/// | Hugging Face (`transformer.` prefix optional) | ember |
/// |---|---|
/// | `wte.weight` | `tok_emb.weight` (the head's too: tied) |
/// | `wpe.weight` | `pos_emb.weight` |
/// | `h.N.ln_1.weight`, `.bias` | `blocks.layers.N.norm1.weight`, `.bias` |
/// | `h.N.attn.c_attn.weight` `[w, 3w]` | `blocks.layers.N.self_attn.in_proj_weight` `[3w, w]`, transposed |
/// | `h.N.attn.c_attn.bias` | `blocks.layers.N.self_attn.in_proj_bias` |
/// | `h.N.attn.c_proj.weight` | `blocks.layers.N.self_attn.out_proj.weight`, transposed |
/// | `h.N.attn.c_proj.bias` | `blocks.layers.N.self_attn.out_proj.bias` |
/// | `h.N.ln_2.weight`, `.bias` | `blocks.layers.N.norm2.weight`, `.bias` |
/// | `h.N.mlp.c_fc.weight` `[w, 4w]` | `blocks.layers.N.linear1.weight` `[4w, w]`, transposed |
/// | `h.N.mlp.c_fc.bias` | `blocks.layers.N.linear1.bias` |
/// | `h.N.mlp.c_proj.weight` `[4w, w]` | `blocks.layers.N.linear2.weight`, transposed |
/// | `h.N.mlp.c_proj.bias` | `blocks.layers.N.linear2.bias` |
/// | `ln_f.weight`, `.bias` | `ln_f.weight`, `.bias` |
/// | `lm_head.weight` | dropped: it must equal `wte.weight` |
/// | `h.N.attn.bias`, `h.N.attn.masked_bias` | dropped: older files' causal-mask buffers |
///
/// Hugging Face's `Conv1D` layers store their weight as `[in, out]` (`x W + b`),
/// PyTorch's `Linear` as `[out, in]`; the query, key and value projections are
/// one `[w, 3w]` matrix in both, in that order, as
/// `nn.MultiheadAttention`'s `in_proj_weight` has them.
pub fn gpt2_state_from_hf(state: &[(String, Tensor)]) -> Result<Vec<(String, Tensor)>> {
    let mut out = Vec::with_capacity(state.len());
    let mut lm_head = None;
    let mut unknown = Vec::new();
    for (name, t) in state {
        let short = name.strip_prefix("transformer.").unwrap_or(name);
        let (ember_name, transpose) = match short {
            "wte.weight" => ("tok_emb.weight".to_string(), false),
            "wpe.weight" => ("pos_emb.weight".to_string(), false),
            "ln_f.weight" | "ln_f.bias" => (short.to_string(), false),
            "lm_head.weight" => {
                lm_head = Some(t);
                continue;
            }
            _ => match block_name(short) {
                Some(Some(mapped)) => mapped,
                Some(None) => continue, // a mask buffer
                None => {
                    unknown.push(name.as_str());
                    continue;
                }
            },
        };
        let t = if transpose { t.t()? } else { t.clone() };
        out.push((ember_name, t));
    }
    if !unknown.is_empty() {
        return Err(Error::invalid(
            "gpt2_state_from_hf",
            format!("names that are not GPT-2's: {unknown:?} (is this a GPT-2 state dict?)"),
        ));
    }
    if let Some(head) = lm_head {
        let wte = out
            .iter()
            .find(|(n, _)| n == "tok_emb.weight")
            .map(|(_, t)| t);
        let tied = match wte {
            Some(w) => {
                w.shape() == head.shape()
                    && crate::autograd::no_grad(|| w.allclose(head, 0.0, 0.0))?
            }
            None => false,
        };
        if !tied {
            return Err(Error::invalid(
                "gpt2_state_from_hf",
                "lm_head.weight differs from wte.weight; ember's GPT-2 ties the head to the \
                 token embedding, so this model cannot be loaded as it is",
            ));
        }
    }
    Ok(out)
}

/// `h.N.<part>` under ember's name (`Some(Some(..))`, with whether to
/// transpose), a buffer to drop (`Some(None)`), or not a block's name (`None`).
fn block_name(name: &str) -> Option<Option<(String, bool)>> {
    let rest = name.strip_prefix("h.")?;
    let (n, part) = rest.split_once('.')?;
    n.parse::<usize>().ok()?;
    let (ember, transpose) = match part {
        "ln_1.weight" => ("norm1.weight", false),
        "ln_1.bias" => ("norm1.bias", false),
        "ln_2.weight" => ("norm2.weight", false),
        "ln_2.bias" => ("norm2.bias", false),
        "attn.c_attn.weight" => ("self_attn.in_proj_weight", true),
        "attn.c_attn.bias" => ("self_attn.in_proj_bias", false),
        "attn.c_proj.weight" => ("self_attn.out_proj.weight", true),
        "attn.c_proj.bias" => ("self_attn.out_proj.bias", false),
        "mlp.c_fc.weight" => ("linear1.weight", true),
        "mlp.c_fc.bias" => ("linear1.bias", false),
        "mlp.c_proj.weight" => ("linear2.weight", true),
        "mlp.c_proj.bias" => ("linear2.bias", false),
        "attn.bias" | "attn.masked_bias" => return Some(None),
        _ => return None,
    };
    Some(Some((format!("blocks.layers.{n}.{ember}"), transpose)))
}
