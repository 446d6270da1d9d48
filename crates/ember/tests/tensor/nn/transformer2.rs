//! `TransformerDecoder` and the full `Transformer` against PyTorch
//! (tests/golden/gen_nn.py, `transformer2`): each case's model with PyTorch's
//! parameters, its output and the gradients of its inputs and parameters on
//! every device and attention path; the same cases on meta (shapes); PyTorch's
//! refusals; how the models are built (copies, Xavier-uniform matrices) and how
//! training and evaluation mode reach every layer.

use super::{cases, tensor};
use ember::nn::functional::{with_attention_path, AttentionPath};
use ember::nn::{
    self, Activation, DecoderMasks, LayerNorm, Module, Transformer, TransformerDecoder,
    TransformerDecoderLayer, TransformerMasks, TransformerOptions,
};
use ember::prelude::*;
use serde_json::Value;

fn usize_of(v: &Value) -> usize {
    v.as_u64().unwrap() as usize
}

/// The layers' settings a case's config names (PyTorch's keyword arguments).
fn options(c: &Value) -> TransformerOptions {
    TransformerOptions {
        dim_feedforward: usize_of(&c["dim_feedforward"]),
        dropout: c["dropout"].as_f64().unwrap_or(0.0),
        activation: match c["activation"].as_str() {
            Some("gelu") => Activation::Gelu,
            _ => Activation::Relu,
        },
        layer_norm_eps: c["layer_norm_eps"].as_f64().unwrap_or(1e-5),
        batch_first: c["batch_first"].as_bool().unwrap(),
        norm_first: c["norm_first"].as_bool().unwrap_or(false),
        bias: c["bias"].as_bool().unwrap_or(true),
    }
}

/// A case's model: a decoder stack or the full transformer.
enum Model {
    Decoder(TransformerDecoder),
    Full(Transformer),
}

impl Model {
    fn module(&self) -> &dyn Module {
        match self {
            Model::Decoder(m) => m,
            Model::Full(m) => m,
        }
    }

    fn module_mut(&mut self) -> &mut dyn Module {
        match self {
            Model::Decoder(m) => m,
            Model::Full(m) => m,
        }
    }

    /// The forward of the case: its inputs, masks and causal hints.
    fn run(
        &self,
        case: &Value,
        input: impl Fn(&str) -> Tensor,
        masks: &[(String, Tensor)],
    ) -> Result<Tensor> {
        let mask = |k: &str| masks.iter().find(|(n, _)| n == k).map(|(_, t)| t);
        let hint = |k: &str| case["config"][k].as_bool().unwrap_or(false);
        match self {
            Model::Decoder(m) => {
                let masks = DecoderMasks {
                    tgt_mask: mask("tgt_mask"),
                    memory_mask: mask("memory_mask"),
                    tgt_key_padding_mask: mask("tgt_key_padding_mask"),
                    memory_key_padding_mask: mask("memory_key_padding_mask"),
                    tgt_is_causal: hint("tgt_is_causal"),
                    memory_is_causal: false,
                };
                m.decode(&input("tgt"), &input("memory"), masks)
            }
            Model::Full(m) => {
                let masks = TransformerMasks {
                    src_mask: mask("src_mask"),
                    tgt_mask: mask("tgt_mask"),
                    memory_mask: mask("memory_mask"),
                    src_key_padding_mask: mask("src_key_padding_mask"),
                    tgt_key_padding_mask: mask("tgt_key_padding_mask"),
                    memory_key_padding_mask: mask("memory_key_padding_mask"),
                    ..Default::default()
                };
                m.forward_masked(&input("src"), &input("tgt"), masks)
            }
        }
    }
}

/// The model a case describes, built on `dev` in float64 (its parameters as
/// drawn; [`formula_state`] replaces them).
fn model(case: &Value, dev: &Device) -> Result<Model> {
    let c = &case["config"];
    let (d, h) = (usize_of(&c["d_model"]), usize_of(&c["nhead"]));
    let o = options(c);
    let mut m = match case["kind"].as_str().unwrap() {
        "decoder" => {
            let layer = TransformerDecoderLayer::new(d, h, o, dev)?;
            let norm = c["norm"]
                .as_bool()
                .unwrap()
                .then(|| LayerNorm::with_options(&[d], o.layer_norm_eps, true, o.bias, dev))
                .transpose()?;
            Model::Decoder(TransformerDecoder::new(
                layer,
                usize_of(&c["num_layers"]),
                norm,
            )?)
        }
        "transformer" => Model::Full(Transformer::new(
            d,
            h,
            usize_of(&c["num_encoder_layers"]),
            usize_of(&c["num_decoder_layers"]),
            o,
            dev,
        )?),
        k => panic!("kind {k}"),
    };
    m.module_mut().to_dtype(DType::F64)?;
    Ok(m)
}

/// The case's parameters: the generator fills the state dict's `j`-th entry
/// with `0.3 sin(0.013 i² + 0.71 i + 1.1 j)` at element `i`, in PyTorch's
/// order of names (`keys`), so that the file need not hold them.
fn formula_state(case: &Value, dev: &Device) -> Result<Vec<(String, Tensor)>> {
    let keys = case["keys"].as_array().unwrap();
    keys.iter()
        .enumerate()
        .map(|(j, k)| {
            let shape: Vec<usize> = k[1].as_array().unwrap().iter().map(usize_of).collect();
            let n: usize = shape.iter().product();
            let values: Vec<f64> = (0..n)
                .map(|i| {
                    let i = i as f64;
                    0.3 * (i * i * 0.013 + i * 0.71 + j as f64 * 1.1).sin()
                })
                .collect();
            Ok((
                k[0].as_str().unwrap().to_string(),
                Tensor::from_vec(values, shape, dev)?,
            ))
        })
        .collect()
}

/// The case's masks, bool where PyTorch's were.
fn masks_of(case: &Value, dev: &Device) -> Result<Vec<(String, Tensor)>> {
    case["masks"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| {
            let t = tensor(v, dev)?;
            Ok((k.clone(), if v["bool"] == true { t.ne(0.0)? } else { t }))
        })
        .collect()
}

/// Every case against PyTorch on `dev`, with each attention path: the one
/// that keeps the weights (the default at these sizes) and the memory-saving one.
fn transformers_match_pytorch(dev: &Device) -> Result<()> {
    for path in [AttentionPath::Auto, AttentionPath::MemoryEfficient] {
        with_attention_path(path, || transformers_match_pytorch_with(dev))?;
    }
    Ok(())
}

fn transformers_match_pytorch_with(dev: &Device) -> Result<()> {
    let _rng = crate::rng_lock();
    let all = cases();
    let cases = all["transformer2"]["cases"].as_array().unwrap();
    assert!(cases.len() >= 9, "{} cases", cases.len());
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let close = |what: &str, got: &Tensor, want: &Value| -> Result<()> {
            super::assert_matches(&format!("{name} {what}"), got, want, (1e-7, 1e-9))
        };
        let mut m = model(case, dev)?;
        // PyTorch's names, shapes and order
        let want_keys: Vec<(String, Vec<usize>)> = case["keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| {
                let s = k[1].as_array().unwrap().iter().map(usize_of).collect();
                (k[0].as_str().unwrap().to_string(), s)
            })
            .collect();
        let keys: Vec<(String, Vec<usize>)> = m
            .module()
            .state_dict()
            .into_iter()
            .map(|(n, t)| (n, t.shape().to_vec()))
            .collect();
        assert_eq!(keys, want_keys, "{name}: state-dict names and shapes");
        ember::io::load_state_into(m.module(), &formula_state(case, dev)?, name)?;
        m.module_mut().eval();
        let ins: Vec<(String, Tensor)> = case["inputs"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| Ok((k.clone(), tensor(v, dev)?.requires_grad_(true)?)))
            .collect::<Result<_>>()?;
        let input = |k: &str| ins.iter().find(|(n, _)| n == k).unwrap().1.clone();
        let y = m.run(case, input, &masks_of(case, dev)?)?;
        close("output", &y, &case["output"])?;
        y.backward_with(
            &Tensor::linspace(-1.0, 1.0, y.numel(), DType::F64, dev)?.reshape(y.shape())?,
        )?;
        for (k, t) in &ins {
            let g = t
                .grad()
                .unwrap_or_else(|| panic!("{name}: no gradient for {k}"));
            close(&format!("gradient of {k}"), &g, &case["input_grads"][k])?;
        }
        if let Some(want) = case["param_grads"].as_object() {
            let params = m.module().named_parameters();
            assert_eq!(params.len(), want.len(), "{name}: parameters");
            for (k, p) in &params {
                let g = p
                    .grad()
                    .unwrap_or_else(|| panic!("{name}: no gradient for {k}"));
                close(&format!("gradient of {k}"), &g, &want[k])?;
            }
        }
    }
    Ok(())
}

/// The same cases on meta: the output's shape, and gradients of the inputs'
/// and parameters' shapes.
#[test]
fn transformers_run_on_meta_with_the_cpus_shapes() -> Result<()> {
    let _rng = crate::rng_lock();
    let all = cases();
    let meta = Device::Meta;
    for case in all["transformer2"]["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let mut m = model(case, &meta)?;
        m.module_mut().eval();
        let ins: Vec<(String, Tensor)> = case["inputs"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| {
                let shape = tensor(v, &Device::Cpu)?.shape().to_vec();
                Ok((
                    k.clone(),
                    Tensor::zeros(&shape[..], DType::F64, &meta)?.requires_grad_(true)?,
                ))
            })
            .collect::<Result<_>>()?;
        let masks: Vec<(String, Tensor)> = masks_of(case, &Device::Cpu)?
            .into_iter()
            .map(|(k, t)| Ok((k, Tensor::zeros(t.shape(), t.dtype(), &meta)?)))
            .collect::<Result<_>>()?;
        let input = |k: &str| ins.iter().find(|(n, _)| n == k).unwrap().1.clone();
        let y = m.run(case, input, &masks)?;
        let want = tensor(&case["output"], &Device::Cpu)?;
        assert_eq!(
            (y.shape(), y.dtype(), y.device()),
            (want.shape(), DType::F64, meta),
            "{name}"
        );
        y.sum_all()?.backward()?;
        for (k, t) in &ins {
            assert_eq!(t.grad().unwrap().shape(), t.shape(), "{name} {k}");
        }
        for (k, p) in m.module().named_parameters() {
            assert_eq!(p.grad().unwrap().shape(), p.shape(), "{name} {k}");
        }
    }
    Ok(())
}

/// PyTorch's refusals (the generator records a phrase of each message, which
/// ember's contains), as errors on every device.
fn transformers_refuse_as_pytorch(dev: &Device) -> Result<()> {
    let _rng = crate::rng_lock();
    let all = cases();
    let opts = TransformerOptions {
        dim_feedforward: 16,
        dropout: 0.0,
        ..Default::default()
    };
    let bf = TransformerOptions {
        batch_first: true,
        ..opts
    };
    let t = Transformer::new(8, 2, 1, 1, opts, dev)?;
    let tb = Transformer::new(8, 2, 1, 1, bf, dev)?;
    let dec = TransformerDecoder::new(TransformerDecoderLayer::new(8, 2, opts, dev)?, 2, None)?;
    let z = |s: &[usize]| Tensor::zeros(s, DType::F32, dev).unwrap();
    let none = TransformerMasks::default();
    let errors = all["transformer2"]["errors"].as_array().unwrap();
    assert!(errors.len() >= 12);
    for e in errors {
        let name = e["name"].as_str().unwrap();
        let phrase = e["phrase"].as_str().unwrap();
        let (src, tgt) = (z(&[5, 2, 8]), z(&[4, 2, 8]));
        let got = match name {
            "batch" => t.forward_masked(&src, &z(&[4, 3, 8]), none),
            "batch_first_batch" => tb.forward_masked(&z(&[2, 5, 8]), &z(&[3, 4, 8]), none),
            "batched_src_unbatched_tgt" => t.forward_masked(&src, &z(&[4, 8]), none),
            "feature_src" => t.forward_masked(&z(&[5, 2, 6]), &tgt, none),
            "feature_tgt" => t.forward_masked(&src, &z(&[4, 2, 6]), none),
            "feature_rank_4" => t.forward_masked(&z(&[5, 2, 8, 1]), &tgt, none),
            "nhead" => Transformer::new(8, 3, 1, 1, opts, dev).map(|_| src.clone()),
            "src_causal_without_mask" => t.forward_masked(
                &src,
                &tgt,
                TransformerMasks {
                    src_is_causal: true,
                    ..none
                },
            ),
            "tgt_causal_without_mask" => t.forward_masked(
                &src,
                &tgt,
                TransformerMasks {
                    tgt_is_causal: true,
                    ..none
                },
            ),
            "decoder_causal_without_mask" => dec.decode(
                &tgt,
                &src,
                DecoderMasks {
                    tgt_is_causal: true,
                    ..Default::default()
                },
            ),
            "tgt_mask_shape" => {
                let m = z(&[3, 3]);
                t.forward_masked(
                    &src,
                    &tgt,
                    TransformerMasks {
                        tgt_mask: Some(&m),
                        ..none
                    },
                )
            }
            "memory_mask_shape" => {
                let m = z(&[4, 4]);
                t.forward_masked(
                    &src,
                    &tgt,
                    TransformerMasks {
                        memory_mask: Some(&m),
                        ..none
                    },
                )
            }
            other => panic!("unknown error case {other}"),
        };
        let msg = got.expect_err(name).to_string();
        assert!(msg.contains(phrase), "{name}: {msg:?} lacks {phrase:?}");
    }
    // an unbatched source with a batched target: the decoder's attention refuses
    // the memory (PyTorch's words differ)
    assert!(t.forward_masked(&z(&[5, 8]), &z(&[4, 2, 8]), none).is_err());
    Ok(())
}

/// As PyTorch builds them: the decoder stack's layers start as copies of its
/// layer; the transformer's matrices are then drawn again, Xavier-uniform, each
/// its own, while its biases and norms start equal; PyTorch's state-dict names;
/// the causal mask; the causal hints change nothing but the path.
fn transformers_are_built_as_pytorch_builds_them(dev: &Device) -> Result<()> {
    let _rng = crate::rng_lock();
    let vals = crate::vals;
    let opts = TransformerOptions {
        dim_feedforward: 16,
        dropout: 0.0,
        ..Default::default()
    };
    let layer = TransformerDecoderLayer::new(8, 2, opts, dev)?;
    let dec = TransformerDecoder::new(layer, 3, Some(LayerNorm::new(&[8], dev)?))?;
    let p = dec.named_parameters();
    assert_eq!(p.len(), 3 * 18 + 2);
    assert_eq!(p[0].0, "layers.0.self_attn.in_proj_weight");
    assert_eq!(p[18].0, "layers.1.self_attn.in_proj_weight");
    assert_eq!(p[19].0, "layers.1.self_attn.in_proj_bias");
    assert_eq!(p[20].0, "layers.1.self_attn.out_proj.weight");
    assert_eq!(p[24].0, "layers.1.multihead_attn.out_proj.weight");
    assert_eq!(p[p.len() - 2].0, "norm.weight");
    assert_eq!(p[p.len() - 1].0, "norm.bias");
    for i in 0..18 {
        assert_eq!(vals(&p[i].1), vals(&p[18 + i].1), "{}", p[i].0);
        assert_eq!(vals(&p[i].1), vals(&p[36 + i].1), "{}", p[i].0);
    }
    // the copies are the layers' own
    ember::no_grad(|| dec.layers[0].linear1.weight.add_(1.0))?;
    assert_ne!(
        vals(&dec.layers[0].linear1.weight),
        vals(&dec.layers[1].linear1.weight)
    );
    assert!(
        TransformerDecoder::new(TransformerDecoderLayer::new(8, 2, opts, dev)?, 2, None)?
            .named_parameters()
            .iter()
            .all(|(n, _)| n.starts_with("layers."))
    );

    let eps = TransformerOptions {
        layer_norm_eps: 1e-3,
        ..opts
    };
    let mut t = Transformer::new(8, 2, 2, 3, eps, dev)?;
    assert_eq!((t.d_model(), t.nhead(), t.batch_first()), (8, 2, false));
    assert_eq!(t.encoder.layers.len(), 2);
    assert_eq!(t.decoder.layers.len(), 3);
    assert_eq!(t.encoder.norm.as_ref().unwrap().eps, 1e-3);
    assert_eq!(t.decoder.norm.as_ref().unwrap().eps, 1e-3);
    // (after `reset_parameters`, each layer has drawn its own biases too)
    let check_init = |t: &Transformer, fresh: bool| -> Result<()> {
        let p = t.named_parameters();
        assert_eq!(p.len(), 2 * 12 + 2 + 3 * 18 + 2);
        assert_eq!(p[0].0, "encoder.layers.0.self_attn.in_proj_weight");
        assert_eq!(p[24].0, "encoder.norm.weight");
        assert_eq!(p[26].0, "decoder.layers.0.self_attn.in_proj_weight");
        assert_eq!(p.last().unwrap().0, "decoder.norm.bias");
        for (n, w) in p.iter().filter(|(_, w)| w.rank() > 1) {
            let (fan_out, fan_in) = (w.shape()[0], w.shape()[1]);
            let bound = (6.0 / (fan_in + fan_out) as f64).sqrt();
            assert!(vals(w).iter().all(|v| v.abs() <= bound), "{n}");
        }
        let get = |n: &str| vals(&p.iter().find(|(k, _)| k == n).unwrap().1);
        for suffix in [
            "self_attn.in_proj_weight",
            "linear1.weight",
            "multihead_attn.out_proj.weight",
        ] {
            let a = get(&format!("decoder.layers.0.{suffix}"));
            assert_ne!(a, get(&format!("decoder.layers.1.{suffix}")), "{suffix}");
        }
        for suffix in ["linear1.bias", "norm1.weight", "self_attn.in_proj_bias"] {
            let a = get(&format!("encoder.layers.0.{suffix}"));
            let b = get(&format!("encoder.layers.1.{suffix}"));
            assert!(a == b || !fresh && suffix == "linear1.bias", "{suffix}");
        }
        assert_ne!(
            get("encoder.layers.0.self_attn.in_proj_weight"),
            get("encoder.layers.1.self_attn.in_proj_weight")
        );
        Ok(())
    };
    check_init(&t, true)?;
    t.reset_parameters()?;
    check_init(&t, false)?;
    let mask = Transformer::generate_square_subsequent_mask(3, dev)?;
    assert_eq!(mask.dtype(), DType::F32);
    let inf = f64::NEG_INFINITY;
    assert_eq!(vals(&mask), [0.0, inf, inf, 0.0, 0.0, inf, 0.0, 0.0, 0.0]);
    assert_eq!(vals(&mask), vals(&nn::square_subsequent_mask(3, dev)?));

    // the causal hints give what the masks alone give
    let (src, tgt) = (
        Tensor::randn([5, 2, 8], dev)?,
        Tensor::randn([4, 2, 8], dev)?,
    );
    let (sm, tm) = (
        Transformer::generate_square_subsequent_mask(5, dev)?,
        Transformer::generate_square_subsequent_mask(4, dev)?,
    );
    let masks = TransformerMasks {
        src_mask: Some(&sm),
        tgt_mask: Some(&tm),
        ..Default::default()
    };
    let plain = t.forward_masked(&src, &tgt, masks)?;
    let hinted = TransformerMasks {
        src_is_causal: true,
        tgt_is_causal: true,
        ..masks
    };
    assert!(t
        .forward_masked(&src, &tgt, hinted)?
        .allclose(&plain, 1e-5, 1e-6)?);
    // `forward` is the model over its input as both source and target
    assert_eq!(
        vals(&t.forward(&tgt)?),
        vals(&t.forward_masked(&tgt, &tgt, TransformerMasks::default())?)
    );
    Ok(())
}

/// `train()` and `eval()` reach every layer of both stacks and their attention:
/// dropout draws in training, and nothing is dropped in evaluation.
fn transformers_switch_dropout_with_the_mode(dev: &Device) -> Result<()> {
    let _rng = crate::rng_lock();
    let vals = crate::vals;
    let opts = TransformerOptions {
        dim_feedforward: 16,
        dropout: 0.5,
        batch_first: true,
        ..Default::default()
    };
    let (src, tgt) = (
        Tensor::randn([2, 5, 8], dev)?,
        Tensor::randn([2, 4, 8], dev)?,
    );
    let none = TransformerMasks::default();
    let mut t = Transformer::new(8, 2, 2, 2, opts, dev)?;
    ember::manual_seed(1);
    let a = t.forward_masked(&src, &tgt, none)?;
    ember::manual_seed(2);
    let b = t.forward_masked(&src, &tgt, none)?;
    assert_ne!(vals(&a), vals(&b), "dropout in training");
    t.eval();
    let a = t.forward_masked(&src, &tgt, none)?;
    // the same model with no dropout at all gives the same output
    let still = Transformer::new(
        8,
        2,
        2,
        2,
        TransformerOptions {
            dropout: 0.0,
            ..opts
        },
        dev,
    )?;
    ember::io::load_state_into(&still, &t.state_dict(), "model")?;
    assert_eq!(vals(&a), vals(&still.forward_masked(&src, &tgt, none)?));
    // the decoder alone, too
    let memory = t.encoder.forward(&src)?;
    t.decoder.train();
    ember::manual_seed(3);
    let a = t.decoder.decode(&tgt, &memory, DecoderMasks::default())?;
    ember::manual_seed(4);
    let b = t.decoder.decode(&tgt, &memory, DecoderMasks::default())?;
    assert_ne!(vals(&a), vals(&b), "dropout in training");
    t.decoder.eval();
    assert_eq!(
        vals(&t.decoder.decode(&tgt, &memory, DecoderMasks::default())?),
        vals(
            &still
                .decoder
                .decode(&tgt, &memory, DecoderMasks::default())?
        )
    );
    Ok(())
}

device_test!(
    transformers_match_pytorch,
    transformers_refuse_as_pytorch,
    transformers_are_built_as_pytorch_builds_them,
    transformers_switch_dropout_with_the_mode,
);
