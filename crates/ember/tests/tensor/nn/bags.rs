//! `embedding_bag` and `nn::EmbeddingBag` against PyTorch (tests/golden/gen_nn.py,
//! `embedding_bag`): each case's output and the gradients of the weight and
//! per-sample weights on every device; the same cases on meta (shapes and
//! dtypes); PyTorch's refusals.

use super::{cases, tensor};
use ember::nn::functional::{embedding_bag, BagMode, EmbeddingBagOptions};
use ember::nn::{self, Module};
use ember::prelude::*;
use serde_json::Value;

fn options(c: &Value) -> EmbeddingBagOptions {
    EmbeddingBagOptions {
        mode: match c["mode"].as_str().unwrap_or("mean") {
            "sum" => BagMode::Sum,
            "mean" => BagMode::Mean,
            "max" => BagMode::Max,
            m => panic!("mode {m}"),
        },
        padding_idx: c["padding_idx"].as_i64(),
        include_last_offset: c["include_last_offset"].as_bool().unwrap_or(false),
    }
}

fn dtype_of(case: &Value) -> DType {
    match case["dtype"].as_str().unwrap() {
        "float32" => DType::F32,
        _ => DType::F64,
    }
}

/// A case's index tensor (`input` or `offsets`) as int64 on `dev`.
fn indices(v: &Value, dev: &Device) -> Result<Option<Tensor>> {
    match v {
        Value::Null => Ok(None),
        v => Ok(Some(tensor(v, dev)?.to_dtype(DType::I64)?)),
    }
}

fn embedding_bags_match_pytorch(dev: &Device) -> Result<()> {
    let all = cases();
    let cases = all["embedding_bag"]["cases"].as_array().unwrap();
    assert!(cases.len() >= 20, "{} cases", cases.len());
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let dt = dtype_of(case);
        let (rtol, atol) = if dt == DType::F64 {
            (1e-12, 1e-12)
        } else {
            (1e-5, 1e-5)
        };
        let close = |what: &str, got: &Tensor, want: &Value| -> Result<()> {
            super::assert_matches(&format!("{name} {what}"), got, want, (rtol, atol))
        };
        let input = indices(&case["input"], dev)?.unwrap();
        let offsets = indices(&case["offsets"], dev)?;
        let weight = tensor(&case["weight"], dev)?
            .to_dtype(dt)?
            .requires_grad_(true)?;
        let psw = match &case["psw"] {
            Value::Null => None,
            v => Some(tensor(v, dev)?.to_dtype(dt)?.requires_grad_(true)?),
        };
        let y = embedding_bag(
            &input,
            &weight,
            offsets.as_ref(),
            psw.as_ref(),
            options(&case["config"]),
        )?;
        assert_eq!(y.dtype(), dt, "{name}");
        close("output", &y, &case["y"])?;
        let gy = Tensor::linspace(-1.0, 1.0, y.numel(), dt, dev)?.reshape(y.shape())?;
        y.backward_with(&gy)?;
        close("weight grad", &weight.grad().unwrap(), &case["weight_grad"])?;
        if let Some(p) = &psw {
            close("per-sample grad", &p.grad().unwrap(), &case["psw_grad"])?;
        }
    }
    Ok(())
}

/// The same cases on meta: PyTorch's output shapes and the weight's dtype,
/// forward and backward.
#[test]
fn embedding_bags_run_on_meta() -> Result<()> {
    let all = cases();
    let meta = Device::Meta;
    for case in all["embedding_bag"]["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let dt = dtype_of(case);
        let cpu = |v: &Value| indices(v, &Device::Cpu);
        let input = cpu(&case["input"])?.unwrap();
        let input = Tensor::zeros(input.shape(), DType::I64, &meta)?;
        let offsets = cpu(&case["offsets"])?
            .map(|o| Tensor::zeros(o.shape(), DType::I64, &meta))
            .transpose()?;
        let weight = Tensor::zeros([10, 3], dt, &meta)?.requires_grad_(true)?;
        let y = embedding_bag(
            &input,
            &weight,
            offsets.as_ref(),
            None,
            EmbeddingBagOptions {
                // (per-sample weights are sum mode's; meta checks the shapes)
                ..options(&case["config"])
            },
        )?;
        let want = tensor(&case["y"], &Device::Cpu)?;
        assert_eq!((y.shape(), y.dtype()), (want.shape(), dt), "{name}");
        y.sum_all()?.backward()?;
        assert_eq!(weight.grad().unwrap().shape(), &[10, 3], "{name}");
    }
    Ok(())
}

/// PyTorch's refusals (the generator records a phrase of each message, which
/// ember's contains), and ember's own for what PyTorch only asserts:
/// decreasing offsets and indices out of range.
fn embedding_bags_refuse_as_pytorch(dev: &Device) -> Result<()> {
    let all = cases();
    let i = Tensor::new([1i64, 2, 4, 5, 4, 3, 2, 9, 0, 7], dev)?;
    let o = Tensor::new([0i64, 3, 3, 7], dev)?;
    let w = Tensor::zeros([10, 3], DType::F32, dev)?;
    let mean = EmbeddingBagOptions::default();
    let sum = EmbeddingBagOptions {
        mode: BagMode::Sum,
        ..mean
    };
    let ones = |n: usize| Tensor::ones([n], DType::F32, dev);
    let errors = all["embedding_bag"]["errors"].as_array().unwrap();
    assert!(errors.len() >= 11);
    for e in errors {
        let name = e["name"].as_str().unwrap();
        let phrase = e["phrase"].as_str().unwrap();
        let got = match name {
            "no_offsets" => embedding_bag(&i, &w, None, None, mean),
            "offsets_2d" => embedding_bag(&i.reshape([2, 5])?, &w, Some(&o), None, mean),
            "offsets_rank" => embedding_bag(&i, &w, Some(&o.reshape([2, 2])?), None, mean),
            "first_offset" => {
                let o = Tensor::new([1i64, 3], dev)?;
                embedding_bag(&i, &w, Some(&o), None, mean)
            }
            "last_offset" => {
                let o = Tensor::new([0i64, 11], dev)?;
                embedding_bag(&i, &w, Some(&o), None, mean)
            }
            "psw_mean" => embedding_bag(&i, &w, Some(&o), Some(&ones(10)?), mean),
            "psw_shape" => embedding_bag(&i, &w, Some(&o), Some(&ones(9)?), sum),
            "weight_rank" => embedding_bag(&i, &w.reshape([5, 2, 3])?, Some(&o), None, mean),
            "input_rank" => embedding_bag(&i.reshape([1, 2, 5])?, &w, None, None, mean),
            "padding_range" => {
                let opts = EmbeddingBagOptions {
                    padding_idx: Some(12),
                    ..mean
                };
                embedding_bag(&i, &w, Some(&o), None, opts)
            }
            "float_indices" => embedding_bag(&i.to_dtype(DType::F32)?, &w, Some(&o), None, mean),
            other => panic!("unknown error case {other}"),
        };
        let msg = got.expect_err(name).to_string();
        assert!(msg.contains(phrase), "{name}: {msg:?} lacks {phrase:?}");
    }
    let decreasing = Tensor::new([0i64, 5, 3], dev)?;
    let msg = embedding_bag(&i, &w, Some(&decreasing), None, mean)
        .expect_err("decreasing offsets")
        .to_string();
    assert!(msg.contains("offsets must not decrease"), "{msg}");
    // the compressed-row layout's last offset is the input's length
    let last = EmbeddingBagOptions {
        include_last_offset: true,
        ..mean
    };
    let none = Tensor::zeros([0], DType::I64, dev)?;
    let msg = embedding_bag(&i, &w, Some(&none), None, last)
        .expect_err("no offsets with include_last_offset")
        .to_string();
    assert!(
        msg.contains("number of offset should be at least 1"),
        "{msg}"
    );
    let short = Tensor::new([0i64, 2, 8], dev)?;
    let msg = embedding_bag(&i, &w, Some(&short), None, last)
        .expect_err("a last offset before the end")
        .to_string();
    assert!(msg.contains("must be the input's length 10"), "{msg}");
    let out_of_range = Tensor::new([1i64, 10], dev)?;
    let two = Tensor::new([0i64, 1], dev)?;
    // (on a GPU the indices are checked on the device: the error comes at the
    // next synchronisation)
    match super::synced(embedding_bag(&out_of_range, &w, Some(&two), None, mean)) {
        Err(ember::Error::IndexOutOfRange { index: 10, .. }) => {}
        other => panic!("expected an index error for 10, got {other:?}"),
    }
    Ok(())
}

/// The module: PyTorch's parameter name, standard-normal start with a zero
/// padding row, `forward` over a 2-D input equal to the functional op, and
/// `forward_bags` with offsets and per-sample weights.
fn embedding_bag_module(dev: &Device) -> Result<()> {
    let _rng = crate::rng_lock();
    let opts = EmbeddingBagOptions {
        mode: BagMode::Sum,
        padding_idx: Some(-1),
        include_last_offset: false,
    };
    let m = nn::EmbeddingBag::with_options(6, 4, opts, dev)?;
    assert_eq!(m.options.padding_idx, Some(5));
    let names: Vec<String> = m.state_dict().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["weight"]);
    assert_eq!(m.weight.narrow(0, 5, 1)?.to_vec::<f32>()?, [0.0; 4]);
    let x = Tensor::new([[0i64, 1, 5], [2, 2, 3]], dev)?;
    let want = embedding_bag(&x, &m.weight, None, None, opts)?;
    assert_eq!(m.forward(&x)?.to_vec::<f32>()?, want.to_vec::<f32>()?);
    let flat = x.reshape([6])?;
    let offsets = Tensor::new([0i64, 3], dev)?;
    let weights = Tensor::full([6], 2.0, DType::F32, dev)?;
    let scaled = m.forward_bags(&flat, Some(&offsets), Some(&weights))?;
    assert!(scaled.allclose(&want.mul(2.0)?, 1e-6, 1e-6)?);
    assert!(nn::EmbeddingBag::with_options(
        6,
        4,
        EmbeddingBagOptions {
            padding_idx: Some(6),
            ..opts
        },
        dev
    )
    .is_err());
    Ok(())
}

/// `from_pretrained` for both tables: a copy of the vectors (the caller's
/// tensor untouched by training), frozen (no gradient) or trained, a padding
/// row's values kept and its gradient zero, a table that is not 2-D refused.
fn pretrained_tables(dev: &Device) -> Result<()> {
    let vectors = Tensor::new([[0.5f32, 1.0], [2.0, 3.0], [-1.0, 4.0]], dev)?;
    let x = Tensor::new([[0i64, 2], [1, 1]], dev)?;
    let frozen = nn::Embedding::from_pretrained(&vectors, true, None)?;
    assert!(!frozen.weight.requires_grad());
    let y = frozen.forward(&x)?;
    assert_eq!(
        y.to_vec3::<f32>()?,
        [[[0.5, 1.0], [-1.0, 4.0]], [[2.0, 3.0], [2.0, 3.0]]]
    );
    let trained = nn::Embedding::from_pretrained(&vectors, false, Some(-1))?;
    assert_eq!(trained.padding_idx, Some(2));
    // the padding row keeps its values and gets no gradient
    let y = trained.forward(&x)?;
    assert_eq!(y.to_vec3::<f32>()?[0][1], [-1.0, 4.0]);
    y.sum_all()?.backward()?;
    let g = trained.weight.grad().unwrap().to_vec2::<f32>()?;
    assert_eq!(g, [[1.0, 1.0], [2.0, 2.0], [0.0, 0.0]]);
    assert!(vectors.grad().is_none() && !vectors.requires_grad());
    let sum = EmbeddingBagOptions {
        mode: BagMode::Sum,
        ..Default::default()
    };
    let bag = nn::EmbeddingBag::from_pretrained(&vectors, true, sum)?;
    assert!(!bag.weight.requires_grad());
    assert_eq!(
        bag.forward(&x)?.to_vec2::<f32>()?,
        [[-0.5, 5.0], [4.0, 6.0]]
    );
    let flat = vectors.reshape([6])?;
    match nn::Embedding::from_pretrained(&flat, true, None) {
        Err(e) => assert!(
            e.to_string().contains("expected to be 2-dimensional"),
            "{e}"
        ),
        Ok(_) => panic!("a 1-D table was accepted"),
    }
    assert!(nn::EmbeddingBag::from_pretrained(&flat, true, sum).is_err());
    Ok(())
}

device_test!(
    pretrained_tables,
    embedding_bags_match_pytorch,
    embedding_bags_refuse_as_pytorch,
    embedding_bag_module,
);
