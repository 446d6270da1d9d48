//! Memory formats (channels-last) against PyTorch: the programs of
//! tests/golden/gen_nn.py's `memory_format` section, run by name, give PyTorch's
//! values, strides and gradients' strides; and the module conversion.

use super::{assert_close, vals};
use ember::nn::{self, BatchNormOptions, Module};
use ember::prelude::*;
use ember::{MemoryFormat, PadMode};
use serde_json::Value;
use std::collections::BTreeMap;

const CL: MemoryFormat = MemoryFormat::ChannelsLast;

fn section() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/nn_cases.json");
    let all: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("nn_cases.json")).unwrap();
    all["memory_format"].clone()
}

fn usizes(v: &Value) -> Vec<usize> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// A float32 tensor with the JSON's shape and values (row-major) on `dev`; on
/// `meta`, zeros of that shape (meta keeps no values).
fn leaf(v: &Value, dev: &Device) -> Result<Tensor> {
    let shape = usizes(&v["shape"]);
    if *dev == Device::Meta {
        return Tensor::zeros(shape, DType::F32, dev);
    }
    Tensor::from_vec(floats(&v["values"]), shape, &Device::Cpu)?
        .to_dtype(DType::F32)?
        .to(dev)
}

/// A channels-last leaf of its own with `t`'s values.
fn cl_leaf(t: &Tensor) -> Result<Tensor> {
    t.detach().to_memory_format(CL)?.requires_grad_(true)
}

/// Runs the program `name` over the leaves `l`: what it returns, and the scalar
/// to backpropagate (none where the program ran its own backward).
fn program(name: &str, l: &BTreeMap<String, Tensor>) -> Result<(Vec<Tensor>, Option<Tensor>)> {
    let t = |k: &str| &l[k];
    let c = |k: &str| l[k].to_memory_format(CL);
    let bias4 = |k: &str| l[k].reshape([1, 3, 1, 1]);
    Ok(match name {
        "to_channels_last" => {
            let y = c("x")?;
            let loss = y.mul(t("x2"))?.sum_all()?;
            (vec![y], Some(loss))
        }
        "already_channels_last" => {
            let z = c("x")?.to_memory_format(CL)?;
            let loss = z.mul(t("x2"))?.sum_all()?;
            (vec![z], Some(loss))
        }
        "unary" => {
            let xc = c("x")?;
            let (y, z) = (xc.relu()?, xc.mul(0.5)?.exp()?);
            let loss = y.mul(&z)?.sum_all()?;
            (vec![y, z], Some(loss))
        }
        "add_both_channels_last" => {
            let y = c("x")?.add(&c("x2")?)?;
            let loss = y.mul(&y)?.sum_all()?;
            (vec![y], Some(loss))
        }
        "add_mixed" => {
            let y = c("x")?.add(t("x2"))?;
            let z = t("x2").mul(&c("x")?)?;
            let loss = y.mul(&z)?.sum_all()?;
            (vec![y, z], Some(loss))
        }
        "channel_bias" => {
            let y = c("x")?.mul(&bias4("b")?)?;
            let z = bias4("b")?.add(&c("x2")?)?;
            let loss = y.mul(&z)?.sum_all()?;
            (vec![y, z], Some(loss))
        }
        "scalar" => {
            let y = c("x")?.mul(2.5)?.add(1)?;
            let loss = y.mul(&y)?.sum_all()?;
            (vec![y], Some(loss))
        }
        "transposed" => {
            let at = t("a").t()?;
            let (y, z) = (at.exp()?, at.add(&at)?);
            let u = at.mul(&t("a").select(1, 0)?)?;
            let loss = y.mul(&z)?.add(&u)?.sum_all()?;
            (vec![y, z, u], Some(loss))
        }
        "conv_input_channels_last" => {
            let opts = Conv2dOptions::default().padding(1);
            let y = c("x")?.conv2d(t("w"), Some(t("g4")), opts)?;
            let loss = y.mul(&y)?.sum_all()?;
            (vec![y], Some(loss))
        }
        "conv_weight_channels_last" => {
            let opts = Conv2dOptions::default().stride(2);
            let y = t("x").conv2d(&c("w")?, None, opts)?;
            let loss = y.mul(&y)?.sum_all()?;
            (vec![y], Some(loss))
        }
        "conv_leaves_channels_last" => {
            let (xl, wl) = (cl_leaf(t("x"))?, cl_leaf(t("w"))?);
            let y = xl.conv2d(&wl, None, Conv2dOptions::default().padding(1))?;
            y.mul(&y)?.sum_all()?.backward()?;
            (vec![y, xl.grad().unwrap(), wl.grad().unwrap()], None)
        }
        "batch_norm_train" => {
            let dev = t("x").device();
            let (rm, rv) = (
                Tensor::zeros([3], DType::F32, &dev)?,
                Tensor::ones([3], DType::F32, &dev)?,
            );
            let opts = BatchNormOptions {
                running_mean: Some(&rm),
                running_var: Some(&rv),
                training: true,
                momentum: 0.1,
                ..Default::default()
            };
            let w = t("b").add(1)?;
            let y = nn::functional::batch_norm(&c("x")?, Some(&w), Some(t("b")), opts)?;
            let loss = y.mul(t("x2"))?.sum_all()?;
            (vec![y, rm, rv], Some(loss))
        }
        "batch_norm_eval" => {
            let b = t("b").detach();
            let (rm, rv) = (b.mul(0.1)?, b.abs()?.add(0.5)?);
            let opts = BatchNormOptions {
                running_mean: Some(&rm),
                running_var: Some(&rv),
                training: false,
                ..Default::default()
            };
            let y = nn::functional::batch_norm(&c("x")?, None, None, opts)?;
            let loss = y.mul(t("x2"))?.sum_all()?;
            (vec![y], Some(loss))
        }
        "max_pool" => {
            let y = c("x")?.max_pool2d(Pool2dOptions::new(2).stride(2).padding(1))?;
            let loss = y.mul(&y)?.sum_all()?;
            (vec![y], Some(loss))
        }
        "avg_pool" => {
            let opts = Pool2dOptions::new(3)
                .stride(1)
                .padding(1)
                .count_include_pad(false);
            let y = c("x")?.avg_pool2d(opts)?;
            let loss = y.mul(&y)?.sum_all()?;
            (vec![y], Some(loss))
        }
        "adaptive_avg_pool" => {
            let xc = c("x")?;
            let y = nn::AdaptiveAvgPool2d::new((1, 1)).forward(&xc)?;
            let z = nn::AdaptiveAvgPool2d::new((2, 2)).forward(&xc.narrow(2, 0, 4)?)?;
            let loss = y.sum_all()?.add(&z.mul(&z)?.sum_all()?)?;
            (vec![y, z], Some(loss))
        }
        "residual_block" => {
            let (xl, wl) = (cl_leaf(t("x"))?, cl_leaf(t("w3"))?);
            let h = xl.conv2d(&wl, None, Conv2dOptions::default().padding(1))?;
            let opts = BatchNormOptions {
                training: true,
                ..Default::default()
            };
            let w = t("b").add(1)?;
            let h = nn::functional::batch_norm(&h, Some(&w), Some(t("b")), opts)?;
            let h = h.add(&xl)?;
            h.relu_()?;
            h.mul(t("x2"))?.sum_all()?.backward()?;
            (vec![h, xl.grad().unwrap(), wl.grad().unwrap()], None)
        }
        "zeros_like" => {
            let xc = c("x")?;
            (vec![xc.zeros_like()?, xc.full_like(2.0)?], None)
        }
        "preserve_strided" => {
            let xs = c("x")?.slice(2, None, None, 2)?;
            let at = t("a").t()?.slice(1, None, None, 2)?;
            let y = xs.to_dtype(DType::F64)?;
            let loss = y.mul(&y)?.sum_all()?;
            (
                vec![xs.zeros_like()?, y, at.ones_like()?, at.exp()?],
                Some(loss),
            )
        }
        "adaptive_uneven" => {
            let y = nn::AdaptiveAvgPool2d::new((2, 3)).forward(&c("x")?)?;
            let loss = y.mul(&y)?.sum_all()?;
            (vec![y], Some(loss))
        }
        "after_pooled" => {
            let y = nn::AdaptiveAvgPool2d::new((1, 1)).forward(&c("x")?)?;
            let (z, u) = (y.relu()?, y.mul(2.0)?);
            let loss = z.mul(&u)?.sum_all()?;
            (vec![y, z, u], Some(loss))
        }
        "module_1x1" => {
            let w = t("w")
                .detach()
                .narrow(2, 0, 1)?
                .narrow(3, 0, 1)?
                .contiguous()?;
            let mut conv = nn::Conv2d {
                weight: w.requires_grad_(true)?,
                bias: None,
                options: Conv2dOptions::default(),
                same: false,
                padding_mode: nn::PaddingMode::Zeros,
            };
            conv.to_memory_format(CL)?;
            let y = conv.forward(t("x"))?;
            y.mul(&y)?.sum_all()?.backward()?;
            let g = conv.weight.grad().unwrap();
            (vec![conv.weight.clone(), y, g], None)
        }
        "cat_and_pad" => {
            let xc = c("x")?;
            let x2c = c("x2")?;
            let pad = |p: [i64; 4], mode| xc.pad(&p, mode);
            let ys = vec![
                Tensor::cat(&[&xc, &x2c], 1)?,
                Tensor::cat(&[&xc, t("x2")], 1)?,
                Tensor::cat(&[&xc, &xc], 0)?,
                pad([1, 2, 1, 1], PadMode::Constant(0.0))?,
                pad([1, 1, 1, 1], PadMode::Reflect)?,
                pad([1, 1, 2, 0], PadMode::Replicate)?,
                pad([1, 1, 0, 0], PadMode::Circular)?,
                pad([-1, 1, 0, 0], PadMode::Constant(0.0))?,
            ];
            let mut loss = ys[0].mul(&ys[0])?.sum_all()?;
            for y in &ys[1..] {
                loss = loss.add(&y.mul(y)?.sum_all()?)?;
            }
            (ys, Some(loss))
        }
        other => panic!("no memory-format program {other} (gen_nn.py and format.rs disagree)"),
    })
}

/// `got` has PyTorch's shape and strides, and (off `meta`) its values.
#[track_caller]
fn check(what: &str, got: &Tensor, want: &Value) {
    assert_eq!(
        got.shape(),
        usizes(&want["shape"]).as_slice(),
        "{what}: shape"
    );
    assert_eq!(
        got.stride(),
        usizes(&want["strides"]).as_slice(),
        "{what}: strides"
    );
    if got.device() != Device::Meta {
        assert_close(&vals(got), &floats(&want["values"]), 1e-5, 1e-5);
    }
}

fn memory_format_programs_match_pytorch(dev: &Device) -> Result<()> {
    let s = section();
    let order: Vec<String> = s["order"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap().to_string())
        .collect();
    let programs = s["programs"].as_array().unwrap();
    assert!(programs.len() >= 23);
    for p in programs {
        let name = p["name"].as_str().unwrap();
        let mut l = BTreeMap::new();
        for k in &order {
            l.insert(k.clone(), leaf(&s["leaves"][k], dev)?.requires_grad_(true)?);
        }
        let (outs, loss) = program(name, &l).unwrap_or_else(|e| panic!("{name}: {e}"));
        if let Some(loss) = loss {
            loss.backward()?;
        }
        let want = p["outputs"].as_array().unwrap();
        assert_eq!(outs.len(), want.len(), "{name}: outputs");
        for (i, (o, w)) in outs.iter().zip(want).enumerate() {
            check(&format!("{name}: output {i}"), o, w);
        }
        for (k, w) in order.iter().zip(p["grads"].as_array().unwrap()) {
            match (l[k].grad(), w.is_null()) {
                (None, true) => {}
                (Some(g), false) => check(&format!("{name}: gradient of {k}"), &g, w),
                (g, _) => panic!("{name}: gradient of {k}: {g:?}, PyTorch's {w}"),
            }
        }
    }
    Ok(())
}

/// `meta` lays tensors out as the CPU does (strides only: it has no values).
#[test]
fn memory_format_programs_match_pytorch_on_meta() -> Result<()> {
    memory_format_programs_match_pytorch(&Device::Meta)
}

/// A model laid out channels-last trains as the row-major one does (same values),
/// its convolution weights and their gradients channels-last.
fn module_to_channels_last_trains_alike(dev: &Device) -> Result<()> {
    let build = || -> Result<nn::Sequential> {
        let _g = super::rng_lock();
        ember::manual_seed(3);
        Ok(nn::Sequential::new()
            .add(nn::Conv2d::new(3, 4, 3, Conv2dOptions::default(), dev)?)
            .add(nn::BatchNorm2d::new(4, dev)?)
            .add(nn::ReLU::inplace())
            .add(nn::MaxPool2d(Pool2dOptions::new(2)))
            .add(nn::AdaptiveAvgPool2d::new((1, 1)))
            .add(nn::Flatten::default())
            .add(nn::Linear::new(4, 2, dev)?))
    };
    let x = {
        let _g = super::rng_lock();
        ember::manual_seed(4);
        Tensor::randn([2, 3, 9, 9], dev)?
    };
    type MakeOpt = fn(Vec<Tensor>) -> Result<Box<dyn ember::optim::Optimizer>>;
    let optimizers: [(&str, MakeOpt); 2] = [
        ("adam", |p| Ok(Box::new(ember::optim::Adam::new(p, 0.01)?))),
        ("sgd", |p| {
            Ok(Box::new(ember::optim::Sgd::new(p, 0.05)?.momentum(0.9)?))
        }),
    ];
    for (name, make) in optimizers {
        let (plain, mut cl) = (build()?, build()?);
        cl.to_memory_format(CL)?;
        let w = &cl.parameters()[0];
        assert!(
            w.is_contiguous_in(CL) && !w.is_contiguous(),
            "{:?}",
            w.stride()
        );
        // the other parameters are not 4-D: unchanged
        assert!(cl.parameters()[1..].iter().all(|p| p.is_contiguous()));
        let mut losses = Vec::new();
        for m in [&plain, &cl] {
            let mut opt = make(m.parameters())?;
            let mut last = 0.0;
            for _ in 0..3 {
                opt.zero_grad();
                let loss = m.forward(&x)?.square()?.mean_all()?;
                loss.backward()?;
                opt.step()?;
                last = loss.item::<f32>()?;
            }
            losses.push(last);
        }
        assert!(
            (losses[0] - losses[1]).abs() <= 1e-5 * losses[0].abs(),
            "{name}: {losses:?}"
        );
        let w = &cl.parameters()[0];
        let g = w.grad().unwrap();
        assert_eq!(g.stride(), w.stride(), "{name}: the gradient's layout");
        // the steps wrote the channels-last weight in its own order
        assert!(w.is_contiguous_in(CL) && !w.is_contiguous(), "{name}");
        assert_close(&vals(w), &vals(&plain.parameters()[0]), 1e-5, 1e-6);
    }
    Ok(())
}

/// Channels-last needs rank 4 (PyTorch's refusal), and a module holding 4-D
/// parameters must implement the conversion.
#[test]
fn channels_last_refusals() -> Result<()> {
    let x = Tensor::zeros([2, 3, 4], DType::F32, &Device::Cpu)?;
    let e = x.to_memory_format(CL).unwrap_err();
    assert!(e.to_string().contains("rank 4"), "{e}");
    // row-major is always possible
    assert!(x
        .to_memory_format(MemoryFormat::Contiguous)?
        .is_contiguous());
    struct Own(Tensor);
    impl Module for Own {
        fn forward(&self, x: &Tensor) -> Result<Tensor> {
            Ok(x.clone())
        }
        fn named_parameters(&self) -> Vec<(String, Tensor)> {
            vec![("w".into(), self.0.clone())]
        }
    }
    let mut m = Own(Tensor::zeros([1, 2, 3, 3], DType::F32, &Device::Cpu)?);
    let e = m.to_memory_format(CL).unwrap_err();
    assert!(e.to_string().contains("does not implement"), "{e}");
    let mut flat = Own(Tensor::zeros([4], DType::F32, &Device::Cpu)?);
    flat.to_memory_format(CL)?;
    Ok(())
}

device_test!(
    memory_format_programs_match_pytorch,
    module_to_channels_last_trains_alike
);
