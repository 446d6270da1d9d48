//! `nn::pad_sequence` and `nn::unpad_sequence` against PyTorch
//! (tests/golden/gen_nn.py, `rnn_utils`): each batch, each sequence's
//! gradient and the sequences cut back, on every device; PyTorch's refusals.

use super::{assert_matches, cases, tensor};
use ember::nn::{self, PadSequenceOptions, PaddingSide};
use ember::prelude::*;
use serde_json::Value;

fn options(c: &Value) -> PadSequenceOptions {
    PadSequenceOptions::default()
        .batch_first(c["batch_first"].as_bool().unwrap_or(false))
        .padding_value(c["padding_value"].as_f64().unwrap_or(0.0))
        .padding_side(match c["padding_side"].as_str() {
            Some("left") => PaddingSide::Left,
            _ => PaddingSide::Right,
        })
}

fn dtype_named(v: &Value) -> DType {
    v.as_str().unwrap().parse().unwrap()
}

fn pad_sequence_matches_pytorch(dev: &Device) -> Result<()> {
    let all = cases();
    let cases = all["rnn_utils"]["cases"].as_array().unwrap();
    assert!(cases.len() >= 11, "{} cases", cases.len());
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let opts = options(&case["config"]);
        let seqs = case["seqs"]
            .as_array()
            .unwrap()
            .iter()
            .zip(case["dtypes"].as_array().unwrap())
            .map(|(s, dt)| {
                let dt = dtype_named(dt);
                tensor(s, dev)?.to_dtype(dt)?.requires_grad_(dt.is_float())
            })
            .collect::<Result<Vec<_>>>()?;
        let y = nn::pad_sequence(&seqs, opts)?;
        assert_eq!(y.dtype(), dtype_named(&case["y_dtype"]), "{name}");
        assert_eq!(y.device(), *dev, "{name}");
        assert_matches(name, &y, &case["y"], (0.0, 0.0))?;
        if y.dtype().is_float() {
            let gy = Tensor::linspace(-1.0, 1.0, y.numel(), y.dtype(), dev)?.reshape(y.shape())?;
            y.backward_with(&gy)?;
            for (i, (s, want)) in seqs
                .iter()
                .zip(case["grads"].as_array().unwrap())
                .enumerate()
            {
                match want {
                    Value::Null => assert!(s.grad().is_none(), "{name} {i}"),
                    want => {
                        let g = s.grad().unwrap();
                        assert_eq!(g.dtype(), s.dtype(), "{name} {i}");
                        assert_matches(&format!("{name} grad {i}"), &g, want, (1e-6, 1e-6))?;
                    }
                }
            }
        }
        if let Some(lengths) = case["lengths"].as_array() {
            let lengths: Vec<usize> = lengths
                .iter()
                .map(|l| l.as_u64().unwrap() as usize)
                .collect();
            let back = nn::unpad_sequence(&y.detach(), &lengths, opts.batch_first)?;
            for (i, (b, want)) in back
                .iter()
                .zip(case["unpadded"].as_array().unwrap())
                .enumerate()
            {
                assert_matches(&format!("{name} unpadded {i}"), b, want, (0.0, 0.0))?;
            }
        }
    }
    Ok(())
}

/// PyTorch's refusals (a phrase of each message), ember's for what PyTorch
/// reports obscurely (a 0-d sequence) or cannot be asked (unpad's lengths),
/// and sequences on two devices.
fn pad_sequence_refuses_as_pytorch(dev: &Device) -> Result<()> {
    let seq = |n: usize, rest: &[usize]| -> Result<Tensor> {
        let mut shape = vec![n];
        shape.extend_from_slice(rest);
        Tensor::ones(shape, DType::F32, dev)
    };
    let all = cases();
    let errors = all["rnn_utils"]["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 3);
    for e in errors {
        let name = e["name"].as_str().unwrap();
        let got = match name {
            "empty_list" => nn::pad_sequence(&[], PadSequenceOptions::default()),
            "trailing_mismatch" => nn::pad_sequence(
                &[seq(3, &[2])?, seq(2, &[3])?],
                PadSequenceOptions::default(),
            ),
            "trailing_mismatch_2" => nn::pad_sequence(
                &[seq(3, &[4, 2])?, seq(2, &[4, 5])?],
                PadSequenceOptions::default().batch_first(true),
            ),
            other => panic!("unknown refusal {other}"),
        };
        let msg = got.expect_err(name).to_string();
        let phrase = e["phrase"].as_str().unwrap();
        assert!(msg.contains(phrase), "{name}: {msg}");
    }
    let scalar = Tensor::ones([0usize; 0], DType::F32, dev)?;
    let msg = nn::pad_sequence(&[seq(2, &[])?, scalar], PadSequenceOptions::default())
        .expect_err("0-d")
        .to_string();
    assert!(msg.contains("sequence 1 is a 0-d tensor"), "{msg}");
    let batch = nn::pad_sequence(&[seq(3, &[])?, seq(1, &[])?], PadSequenceOptions::default())?;
    assert!(nn::unpad_sequence(&batch, &[3], false).is_err());
    assert!(nn::unpad_sequence(&batch, &[3, 4], false).is_err());
    assert!(nn::unpad_sequence(&batch.reshape([6])?, &[3, 1], false).is_err());
    if *dev != Device::Cpu {
        let cpu = Tensor::ones([2], DType::F32, &Device::Cpu)?;
        assert!(nn::pad_sequence(&[seq(2, &[])?, cpu], PadSequenceOptions::default()).is_err());
    }
    Ok(())
}

device_test!(
    pad_sequence_matches_pytorch,
    pad_sequence_refuses_as_pytorch,
);
