//! `nn::RNN` and `nn::RNNCell` against PyTorch (tests/golden/gen_nn.py, `rnn`):
//! each case's layer with PyTorch's state, its output, `h_n` and the gradients
//! of the input, `h_0` and every parameter on every device; the same cases on
//! meta (shapes and dtypes); PyTorch's refusals; names, initial values,
//! dropout and autocast.

use super::{cases, state_of, tensor};
use ember::nn::{self, Module, RnnNonlinearity, RnnOptions};
use ember::prelude::*;
use serde_json::Value;

/// A case's layer: a sequence layer or a single-step cell.
enum Layer {
    Seq(nn::RNN),
    Cell(nn::RNNCell),
}

impl Layer {
    fn module(&self) -> &dyn Module {
        match self {
            Layer::Seq(m) => m,
            Layer::Cell(m) => m,
        }
    }

    fn module_mut(&mut self) -> &mut dyn Module {
        match self {
            Layer::Seq(m) => m,
            Layer::Cell(m) => m,
        }
    }

    /// The output and `h_n` (a cell's output is its `h_n`).
    fn run(&self, x: &Tensor, h0: Option<&Tensor>) -> Result<(Tensor, Tensor)> {
        match self {
            Layer::Seq(m) => m.forward_state(x, h0),
            Layer::Cell(m) => m.step(x, h0).map(|h| (h.clone(), h)),
        }
    }
}

fn dtype_of(case: &Value) -> DType {
    match case["dtype"].as_str().unwrap() {
        "float32" => DType::F32,
        _ => DType::F64,
    }
}

/// The layer a case describes on `dev`, in the case's dtype and training mode
/// (its parameters drawn; the caller loads PyTorch's).
fn layer(case: &Value, dev: &Device) -> Result<Layer> {
    let c = &case["config"];
    let u = |k: &str| c[k].as_u64().unwrap() as usize;
    let b = |k: &str| c[k].as_bool().unwrap();
    let nonlinearity: RnnNonlinearity = c["nonlinearity"].as_str().unwrap().parse()?;
    let (input, hidden) = (u("input_size"), u("hidden_size"));
    let mut m = match case["kind"].as_str().unwrap() {
        "rnn" => {
            let options = RnnOptions {
                num_layers: u("num_layers"),
                bias: b("bias"),
                batch_first: b("batch_first"),
                dropout: c["dropout"].as_f64().unwrap(),
                bidirectional: b("bidirectional"),
            };
            let m = nn::RNN::with_options(input, hidden, nonlinearity, options, dev)?;
            assert_eq!(m.options().num_layers, options.num_layers);
            Layer::Seq(m)
        }
        "rnn_cell" => Layer::Cell(nn::RNNCell::with_options(
            input,
            hidden,
            b("bias"),
            nonlinearity,
            dev,
        )?),
        k => panic!("kind {k}"),
    };
    m.module_mut().to_dtype(dtype_of(case))?;
    m.module_mut()
        .set_training(case["train"].as_bool().unwrap());
    Ok(m)
}

/// The fixed gradient PyTorch's backward took: `linspace(a, b)` over `t`.
fn ramp(t: &Tensor, a: f64, b: f64) -> Result<Tensor> {
    Tensor::linspace(a, b, t.numel(), t.dtype(), &t.device())?.reshape(t.shape())
}

/// Every case's output, `h_n` and gradients against PyTorch's on `dev`.
fn rnn_layers_match_pytorch(dev: &Device) -> Result<()> {
    let _rng = crate::rng_lock();
    let all = cases();
    let cases = all["rnn"]["cases"].as_array().unwrap();
    assert!(cases.len() >= 15, "{} cases", cases.len());
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let dt = dtype_of(case);
        let (rtol, atol) = if dt == DType::F64 {
            (1e-10, 1e-12)
        } else {
            (2e-5, 2e-5)
        };
        let close = |what: &str, got: &Tensor, want: &Value| -> Result<()> {
            assert_eq!(got.dtype(), dt, "{name} {what}: dtype");
            super::assert_matches(&format!("{name} {what}"), got, want, (rtol, atol))
        };
        let m = layer(case, dev)?;
        let state = state_of(&case["state"], dev)?;
        ember::io::load_state_into(m.module(), &state, name)?;
        let names: Vec<String> = m
            .module()
            .state_dict()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        let mut want: Vec<&String> = case["state"].as_object().unwrap().keys().collect();
        let mut got: Vec<&String> = names.iter().collect();
        want.sort();
        got.sort();
        assert_eq!(got, want, "{name}: state-dict names");
        let x = tensor(&case["x"], dev)?
            .to_dtype(dt)?
            .requires_grad_(true)?;
        let h0 = match &case["h0"] {
            Value::Null => None,
            h => Some(tensor(h, dev)?.to_dtype(dt)?.requires_grad_(true)?),
        };
        let (y, hn) = m.run(&x, h0.as_ref())?;
        assert_eq!(y.device(), *dev);
        close("output", &y, &case["output"])?;
        close("h_n", &hn, &case["h_n"])?;
        let mut loss = y.mul(&ramp(&y, -1.0, 1.0)?)?.sum_all()?;
        if let Layer::Seq(_) = m {
            loss = loss.add(&hn.mul(&ramp(&hn, 0.5, -0.5)?)?.sum_all()?)?;
        }
        loss.backward()?;
        close("input grad", &x.grad().unwrap(), &case["x_grad"])?;
        if let Some(h0) = &h0 {
            close("h0 grad", &h0.grad().unwrap(), &case["h0_grad"])?;
        }
        for (k, p) in m.module().named_parameters() {
            let want = &case["param_grads"][&k];
            close(&format!("{k} grad"), &p.grad().unwrap(), want)?;
        }
    }
    Ok(())
}

/// The same cases on meta: the CPU's shapes and dtypes forward and backward.
#[test]
fn rnn_layers_run_on_meta_with_the_cpus_shapes() -> Result<()> {
    let _rng = crate::rng_lock();
    let all = cases();
    let meta = Device::Meta;
    for case in all["rnn"]["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let dt = dtype_of(case);
        let m = layer(case, &meta)?;
        let zeros = |v: &Value| -> Result<Tensor> {
            let shape = tensor(v, &Device::Cpu)?.shape().to_vec();
            Tensor::zeros(&shape[..], dt, &meta)?.requires_grad_(true)
        };
        let x = zeros(&case["x"])?;
        let h0 = match &case["h0"] {
            Value::Null => None,
            h => Some(zeros(h)?),
        };
        let (y, hn) = m.run(&x, h0.as_ref())?;
        for (got, want) in [(&y, &case["output"]), (&hn, &case["h_n"])] {
            let want = tensor(want, &Device::Cpu)?;
            assert_eq!((got.shape(), got.dtype()), (want.shape(), dt), "{name}");
            assert_eq!(got.device(), meta);
        }
        y.sum_all()?.add(&hn.sum_all()?)?.backward()?;
        assert_eq!(x.grad().unwrap().shape(), x.shape(), "{name}");
        if let Some(h0) = &h0 {
            assert_eq!(h0.grad().unwrap().shape(), h0.shape(), "{name}");
        }
        for (k, p) in m.module().named_parameters() {
            assert_eq!(p.grad().unwrap().shape(), p.shape(), "{name} {k}");
        }
    }
    Ok(())
}

/// PyTorch's refusals (tests/golden/gen_nn.py records a phrase of each message,
/// which ember's contains), as errors on every device.
fn rnn_layers_refuse_as_pytorch(dev: &Device) -> Result<()> {
    let _rng = crate::rng_lock();
    let all = cases();
    let z = |s: &[usize]| Tensor::zeros(s, DType::F32, dev);
    let (m, c) = (nn::RNN::new(3, 4, dev)?, nn::RNNCell::new(3, 4, dev)?);
    let with = |f: fn(&mut RnnOptions)| -> Result<Tensor> {
        let mut options = RnnOptions::default();
        f(&mut options);
        nn::RNN::with_options(3, 4, RnnNonlinearity::Tanh, options, dev)?.forward(&z(&[2, 1, 3])?)
    };
    let errors = all["rnn"]["errors"].as_array().unwrap();
    assert!(errors.len() >= 20);
    for e in errors {
        let name = e["name"].as_str().unwrap();
        let phrase = e["phrase"].as_str().unwrap();
        let state = |x: &[usize], h: &[usize]| m.forward_state(&z(x)?, Some(&z(h)?)).map(|r| r.0);
        let step = |x: &[usize], h: &[usize]| c.step(&z(x)?, Some(&z(h)?));
        let got = match name {
            "nonlinearity" => "gelu".parse::<RnnNonlinearity>().and_then(|_| z(&[1])),
            "dropout_above_one" => with(|o| o.dropout = 1.5),
            "dropout_negative" => with(|o| o.dropout = -0.1),
            "input_size_zero" => nn::RNN::new(0, 4, dev).and_then(|_| z(&[1])),
            "hidden_size_zero" => nn::RNN::new(3, 0, dev).and_then(|_| z(&[1])),
            "num_layers_zero" => with(|o| o.num_layers = 0),
            "input_rank" => m.forward(&z(&[2, 3, 4, 3])?),
            "input_size" => m.forward(&z(&[5, 2, 4])?),
            "h0_layers" => state(&[5, 2, 3], &[2, 2, 4]),
            "h0_batch" => state(&[5, 2, 3], &[1, 3, 4]),
            "h0_rank_batched" => state(&[5, 2, 3], &[2, 4]),
            "h0_rank_unbatched" => state(&[5, 3], &[1, 1, 4]),
            "h0_unbatched_size" => state(&[5, 3], &[2, 4]),
            "empty_sequence" => m.forward(&z(&[0, 2, 3])?),
            "input_dtype" => m.forward(&z(&[5, 2, 3])?.to_dtype(DType::F64)?),
            "cell_input_rank" => c.forward(&z(&[2, 2, 3])?),
            "cell_input_size" => c.forward(&z(&[2, 5])?),
            "cell_hx_batch" => step(&[2, 3], &[3, 4]),
            "cell_hx_size" => step(&[2, 3], &[2, 5]),
            "cell_hx_rank" => step(&[2, 3], &[1, 2, 4]),
            "cell_hx_unbatched_rank" => step(&[3], &[2, 4]),
            "cell_hx_unbatched_size" => step(&[3], &[5]),
            other => panic!("unknown error case {other}"),
        };
        let msg = got.expect_err(name).to_string();
        assert!(msg.contains(phrase), "{name}: {msg:?} lacks {phrase:?}");
    }
    Ok(())
}

/// PyTorch's state-dict names, shapes and initial bounds; the nonlinearity's
/// spellings; dropout between layers only in training; a cell of no hidden
/// features and a batch of no sequences, which PyTorch accepts.
fn rnn_layers_have_pytorchs_parameters(dev: &Device) -> Result<()> {
    let _rng = crate::rng_lock();
    let options = RnnOptions {
        num_layers: 2,
        dropout: 0.5,
        bidirectional: true,
        ..Default::default()
    };
    let mut m = nn::RNN::with_options(3, 4, RnnNonlinearity::Relu, options, dev)?;
    assert_eq!(m.nonlinearity(), RnnNonlinearity::Relu);
    let params = m.named_parameters();
    let names: Vec<&str> = params.iter().map(|(n, _)| n.as_str()).collect();
    let mut want = Vec::new();
    for (layer, input) in [(0, 3), (1, 8)] {
        for suffix in ["", "_reverse"] {
            want.push((format!("weight_ih_l{layer}{suffix}"), vec![4, input]));
            want.push((format!("weight_hh_l{layer}{suffix}"), vec![4, 4]));
            want.push((format!("bias_ih_l{layer}{suffix}"), vec![4]));
            want.push((format!("bias_hh_l{layer}{suffix}"), vec![4]));
        }
    }
    let want_names: Vec<&str> = want.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, want_names);
    for ((n, p), (_, shape)) in params.iter().zip(&want) {
        assert_eq!(p.shape(), &shape[..], "{n}");
        assert_eq!(p.dtype(), DType::F32, "{n}");
        assert!(p.to_vec::<f64>()?.iter().all(|v| v.abs() <= 0.5), "{n}");
    }
    let x = Tensor::randn([5, 2, 3], dev)?;
    ember::manual_seed(1);
    let a = m.forward(&x)?;
    ember::manual_seed(2);
    assert_ne!(a.to_vec::<f32>()?, m.forward(&x)?.to_vec::<f32>()?);
    m.eval();
    assert_eq!(
        m.forward(&x)?.to_vec::<f32>()?,
        m.forward(&x)?.to_vec::<f32>()?
    );
    // relu's outputs are never negative; tanh's lie in (-1, 1)
    assert!(a.to_vec::<f32>()?.iter().all(|v| *v >= 0.0));
    let tanh = nn::RNN::new(3, 4, dev)?;
    assert_eq!(tanh.nonlinearity(), RnnNonlinearity::Tanh);
    assert!(tanh
        .forward(&x)?
        .to_vec::<f32>()?
        .iter()
        .all(|v| v.abs() < 1.0));

    let cell = nn::RNNCell::with_bias(3, 4, false, dev)?;
    let names: Vec<String> = cell.state_dict().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["weight_ih", "weight_hh"]);
    assert_eq!(cell.nonlinearity(), RnnNonlinearity::Tanh);
    let names: Vec<String> = nn::RNNCell::new(3, 4, dev)?
        .state_dict()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["weight_ih", "weight_hh", "bias_ih", "bias_hh"]);
    for (s, n) in [
        ("tanh", RnnNonlinearity::Tanh),
        ("relu", RnnNonlinearity::Relu),
    ] {
        assert_eq!(s.parse::<RnnNonlinearity>()?, n);
        assert_eq!(n.as_str(), s);
    }
    // sizes PyTorch accepts: a cell of no hidden features, no sequences
    let empty = nn::RNNCell::new(3, 0, dev)?;
    assert_eq!(
        empty.forward(&Tensor::randn([2, 3], dev)?)?.shape(),
        &[2, 0]
    );
    let (y, hn) = tanh.forward_state(&Tensor::zeros([5, 0, 3], DType::F32, dev)?, None)?;
    assert_eq!((y.shape(), hn.shape()), (&[5, 0, 4][..], &[1, 0, 4][..]));
    Ok(())
}

device_test!(
    rnn_layers_match_pytorch,
    rnn_layers_refuse_as_pytorch,
    rnn_layers_have_pytorchs_parameters,
);

/// Under CPU autocast PyTorch's RNN and RNNCell keep a float32 input and state
/// but multiply in bfloat16, so their states (and outputs) come out bfloat16;
/// the values are float32's within bfloat16's precision.
#[test]
fn rnn_layers_under_cpu_autocast() -> Result<()> {
    let _rng = crate::rng_lock();
    let cpu = Device::Cpu;
    let x = Tensor::randn([4, 2, 3], &cpu)?;
    let m = nn::RNN::new(3, 4, &cpu)?;
    let (y, hn) = ember::autocast(DType::BF16, || m.forward_state(&x, None))??;
    assert_eq!((y.dtype(), hn.dtype()), (DType::BF16, DType::BF16));
    let want = m.forward(&x)?;
    assert!(y.to_dtype(DType::F32)?.allclose(&want, 3e-2, 3e-2)?);
    let cell = nn::RNNCell::new(3, 4, &cpu)?;
    let h = ember::autocast(DType::BF16, || cell.forward(&x.select(0, 0)?))??;
    assert_eq!(h.dtype(), DType::BF16);
    Ok(())
}
