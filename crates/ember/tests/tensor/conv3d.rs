//! 3-D convolutions, pools and norms against PyTorch
//! (tests/golden/conv3d_cases.json, made by tests/golden/gen_conv3d.py):
//! outputs and the gradients of `sum(out · pattern)` on every device, shapes
//! and dtypes on meta, PyTorch's refusals in its words, and the layers
//! (PyTorch's state-dict names, default initialisation).

use super::golden_tensor as tensor;
use ember::nn::functional as F;
use ember::nn::ConvTranspose3dOptions;
use ember::nn::{self, Module, Pool3dOptions};
use ember::prelude::*;
use serde_json::Value;

fn cases() -> Value {
    super::golden("conv3d_cases.json")
}

fn triple(v: &Value) -> (usize, usize, usize) {
    let a: Vec<usize> = v
        .as_array()
        .expect("a triple")
        .iter()
        .map(|x| x.as_u64().expect("a size") as usize)
        .collect();
    (a[0], a[1], a[2])
}

fn pool_options(a: &Value) -> Pool3dOptions {
    let k = triple(&a["kernel"]);
    Pool3dOptions {
        kernel: k,
        stride: (!a["stride"].is_null()).then(|| triple(&a["stride"])),
        padding: triple(&a["padding"]),
        dilation: triple(&a["dilation"]),
        ceil_mode: a["ceil_mode"].as_bool().unwrap(),
        count_include_pad: a["count_include_pad"].as_bool().unwrap(),
        divisor_override: a["divisor_override"].as_u64().map(|d| d as usize),
    }
}

/// The case's op on `x` (its inputs, `None` where PyTorch's was), the
/// outputs in PyTorch's order.
fn call(case: &Value, x: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    let a = &case["args"];
    let input = || x[0].as_ref().unwrap();
    let groups = || a["groups"].as_u64().unwrap() as usize;
    let dev = input().device();
    match case["op"].as_str().unwrap() {
        "conv3d" => {
            let opts = Conv3dOptions {
                stride: triple(&a["stride"]),
                padding: triple(&a["padding"]),
                dilation: triple(&a["dilation"]),
                groups: groups(),
            };
            let (w, b) = (x[1].as_ref().unwrap(), x[2].as_ref());
            let y = match a["same"].as_bool() == Some(true) {
                true => input().conv3d_same_opts(w, b, opts)?,
                false => F::conv3d(input(), w, b, opts)?,
            };
            Ok(vec![y])
        }
        "conv_transpose3d" => {
            let opts = ConvTranspose3dOptions {
                stride: triple(&a["stride"]),
                padding: triple(&a["padding"]),
                output_padding: triple(&a["output_padding"]),
                dilation: triple(&a["dilation"]),
                groups: groups(),
            };
            let (w, b) = (x[1].as_ref().unwrap(), x[2].as_ref());
            Ok(vec![F::conv_transpose3d(input(), w, b, opts)?])
        }
        "max_pool3d" => {
            let opts = pool_options(a);
            let (y, i) = F::max_pool3d_with_indices(input(), opts)?;
            // the values alone, and the layer's, are the same
            let plain = nn::MaxPool3d(opts).forward(input())?;
            assert_eq!(plain.to_vec::<f64>()?, y.to_vec::<f64>()?);
            Ok(vec![y, i])
        }
        "avg_pool3d" => Ok(vec![nn::AvgPool3d(pool_options(a)).forward(input())?]),
        "adaptive_avg_pool3d" => {
            let layer = nn::AdaptiveAvgPool3d::new(triple(&a["output"]));
            Ok(vec![layer.forward(input())?])
        }
        "adaptive_max_pool3d" => {
            let layer = nn::AdaptiveMaxPool3d::new(triple(&a["output"]));
            let (y, i) = layer.forward_with_indices(input())?;
            let plain = F::adaptive_max_pool3d(input(), layer.output)?;
            assert_eq!(plain.to_vec::<f64>()?, y.to_vec::<f64>()?);
            Ok(vec![y, i])
        }
        "batch_norm3d" => {
            let mut bn = nn::BatchNorm3d::new(3, &dev)?;
            bn.to_dtype(DType::F64)?;
            bn.weight = Some(Tensor::new([1.5f64, -0.5, 2.0], &dev)?.requires_grad_(true)?);
            bn.bias = Some(Tensor::new([0.25f64, 0.0, -1.0], &dev)?.requires_grad_(true)?);
            let y = bn.forward(input())?;
            let (m, v) = (bn.running_mean.clone(), bn.running_var.clone());
            Ok(vec![y, m.unwrap(), v.unwrap()])
        }
        "instance_norm3d" => {
            let mut norm = nn::InstanceNorm3d::with_options(2, true, false, &dev)?;
            norm.to_dtype(DType::F64)?;
            norm.weight = Some(Tensor::new([0.5f64, 2.0], &dev)?.requires_grad_(true)?);
            norm.bias = Some(Tensor::new([1.0f64, -0.5], &dev)?.requires_grad_(true)?);
            Ok(vec![norm.forward(input())?])
        }
        op => panic!("op {op}"),
    }
}

fn tolerance(dt: DType) -> (f64, f64) {
    if dt == DType::F32 {
        (1e-4, 1e-5)
    } else {
        (1e-9, 1e-12)
    }
}

fn values(t: &Tensor) -> Result<Vec<f64>> {
    t.to_dtype(DType::F64)?.to_vec::<f64>()
}

/// The inputs of a case on `dev` (floats requiring gradients), `None` where
/// PyTorch's was.
fn inputs(case: &Value, dev: &Device) -> Result<Vec<Option<Tensor>>> {
    case["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            if v.is_null() {
                return Ok(None);
            }
            let t = tensor(v, dev)?;
            Ok(Some(if t.dtype().is_float() {
                t.requires_grad_(true)?
            } else {
                t
            }))
        })
        .collect()
}

/// `1, 2, ..., 7, 1, ...` shaped as `y`: the weights of the summed output
/// whose gradient is compared (as the generator's).
pub(super) fn pattern(y: &Tensor) -> Result<Tensor> {
    let n = y.numel() as f64;
    Tensor::arange(0f64, n, &y.device())?
        .remainder(7.0)?
        .add(1.0)?
        .reshape(y.shape())?
        .to_dtype(y.dtype())
}

fn conv3d_and_pools_match_pytorch(dev: &Device) -> Result<()> {
    let all = cases();
    let list = all["cases"].as_array().unwrap();
    assert!(list.len() >= 40, "{} cases", list.len());
    for case in list {
        let name = case["name"].as_str().unwrap();
        let xs = inputs(case, dev)?;
        let outs = call(case, &xs)?;
        let wants = case["outputs"].as_array().unwrap();
        assert_eq!(outs.len(), wants.len(), "{name}");
        for (o, w) in outs.iter().zip(wants) {
            let want = tensor(w, &Device::Cpu)?;
            assert_eq!(
                (o.shape(), o.dtype()),
                (want.shape(), want.dtype()),
                "{name}"
            );
            assert_eq!(o.device(), *dev, "{name}");
            if o.dtype() == DType::I64 {
                assert_eq!(o.to_vec::<i64>()?, want.to_vec::<i64>()?, "{name} indices");
            } else {
                let (rtol, atol) = tolerance(o.dtype());
                crate::assert_close(&values(o)?, &values(&want)?, rtol, atol);
            }
        }
        let grads = case["grads"].as_array().unwrap();
        if !outs[0].dtype().is_float() {
            assert!(grads.is_empty() && !outs[0].requires_grad(), "{name}");
            continue;
        }
        assert!(!grads.is_empty(), "{name} has gradients");
        outs[0].mul(&pattern(&outs[0])?)?.sum_all()?.backward()?;
        for (i, (x, g)) in xs.iter().zip(grads).enumerate() {
            let (Some(x), false) = (x, g.is_null()) else {
                continue;
            };
            let got = match x.grad() {
                Some(g) => g,
                None => x.zeros_like()?,
            };
            let want = tensor(g, &Device::Cpu)?;
            assert_eq!(got.shape(), want.shape(), "{name} gradient {i}");
            let (rtol, atol) = tolerance(x.dtype());
            crate::assert_close(&values(&got)?, &values(&want)?, rtol, atol);
        }
    }
    Ok(())
}

device_test!(conv3d_and_pools_match_pytorch);

/// Each golden convolution again with some operands frozen (the input alone,
/// the weight alone, the bias alone needing a gradient): the gradients that
/// are asked for are the same as when all are, and the others are not made;
/// and the bias is not written to by the calls (a one-position output's
/// bias, laid out as the output, is a contiguous view of it).
fn conv3d_gradients_with_frozen_operands(dev: &Device) -> Result<()> {
    let all = cases();
    for case in all["cases"].as_array().unwrap() {
        let op = case["op"].as_str().unwrap();
        if op != "conv3d" && op != "conv_transpose3d" {
            continue;
        }
        let name = case["name"].as_str().unwrap();
        let full = inputs(case, dev)?;
        let y = call(case, &full)?.remove(0);
        y.mul(&pattern(&y)?)?.sum_all()?.backward()?;
        let bias_before = full[2].as_ref().map(values).transpose()?;
        for only in 0..3 {
            let Some(Some(wanted)) = full.get(only) else {
                continue;
            };
            let xs: Vec<Option<Tensor>> = full
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    t.as_ref()
                        .map(|t| t.detach().requires_grad_(i == only))
                        .transpose()
                })
                .collect::<Result<_>>()?;
            let y = call(case, &xs)?.remove(0);
            y.mul(&pattern(&y)?)?.sum_all()?.backward()?;
            for (i, t) in xs.iter().enumerate() {
                let Some(t) = t else { continue };
                match (i == only, t.grad()) {
                    (true, Some(g)) => crate::assert_close(
                        &values(&g)?,
                        &values(&wanted.grad().expect("a gradient"))?,
                        1e-12,
                        1e-12,
                    ),
                    (true, None) => panic!("{name}: no gradient for operand {i}"),
                    (false, g) => assert!(g.is_none(), "{name}: a gradient for frozen operand {i}"),
                }
            }
        }
        if let (Some(b), Some(before)) = (&full[2], bias_before) {
            assert_eq!(values(b)?, before, "{name}: the bias changed");
        }
    }
    Ok(())
}

device_test!(conv3d_gradients_with_frozen_operands);

#[test]
fn conv3d_and_pools_run_on_meta_with_pytorchs_shapes() -> Result<()> {
    let all = cases();
    for case in all["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let xs: Vec<Option<Tensor>> = inputs(case, &Device::Cpu)?
            .into_iter()
            .map(|t| {
                t.map(|t| Tensor::zeros(t.shape(), t.dtype(), &Device::Meta))
                    .transpose()
            })
            .collect::<Result<_>>()?;
        if ["max_pool3d", "adaptive_max_pool3d"].contains(&case["op"].as_str().unwrap()) {
            // (the layers' values are compared with the functions' in `call`,
            // which a meta tensor has none of: the shapes only here)
            let a = &case["args"];
            let x = xs[0].as_ref().unwrap();
            let (y, i) = match case["op"].as_str().unwrap() {
                "max_pool3d" => F::max_pool3d_with_indices(x, pool_options(a))?,
                _ => F::adaptive_max_pool3d_with_indices(x, triple(&a["output"]))?,
            };
            let want = case["outputs"].as_array().unwrap();
            assert_eq!(y.shape(), tensor(&want[0], &Device::Cpu)?.shape(), "{name}");
            assert_eq!(i.shape(), tensor(&want[1], &Device::Cpu)?.shape(), "{name}");
            assert_eq!(
                (y.device(), i.dtype()),
                (Device::Meta, DType::I64),
                "{name}"
            );
            continue;
        }
        for (o, w) in call(case, &xs)?
            .iter()
            .zip(case["outputs"].as_array().unwrap())
        {
            let want = tensor(w, &Device::Cpu)?;
            assert_eq!(
                (o.shape(), o.dtype()),
                (want.shape(), want.dtype()),
                "{name}"
            );
            assert_eq!(o.device(), Device::Meta, "{name}");
        }
    }
    Ok(())
}

#[test]
fn conv3d_refusals_use_pytorchs_words() -> Result<()> {
    let dev = Device::Cpu;
    let all = cases();
    let z = |s: &[usize]| Tensor::zeros(s, DType::F32, &dev);
    let conv = |x: &[usize], w: &[usize], o: Conv3dOptions| z(x)?.conv3d(&z(w)?, None, o);
    let d = Conv3dOptions::default();
    let t = ConvTranspose3dOptions::default();
    let p = Pool3dOptions::new;
    let errors = all["errors"].as_array().unwrap();
    assert!(errors.len() >= 30);
    for e in errors {
        let name = e["name"].as_str().unwrap();
        let want = e["message"].as_str().unwrap();
        let got = match name {
            "conv_rank" => conv(&[2, 3, 4], &[4, 3, 1, 1, 1], d).map(|_| ()),
            "conv_channels" => conv(&[1, 2, 4, 4, 4], &[4, 3, 1, 1, 1], d).map(|_| ()),
            "conv_groups_out" => conv(&[1, 4, 4, 4, 4], &[3, 2, 1, 1, 1], d.groups(2)).map(|_| ()),
            "conv_groups_zero" => conv(&[1, 4, 4, 4, 4], &[3, 2, 1, 1, 1], d.groups(0)).map(|_| ()),
            "conv_kernel_big" => conv(&[1, 3, 2, 4, 4], &[4, 3, 5, 2, 2], d.padding(1)).map(|_| ()),
            "conv_kernel_dilated" => conv(
                &[1, 3, 5, 4, 4],
                &[4, 3, 3, 2, 2],
                Conv3dOptions {
                    dilation: (3, 1, 1),
                    ..d
                },
            )
            .map(|_| ()),
            "conv_stride_zero" => conv(&[1, 3, 4, 4, 4], &[4, 3, 1, 1, 1], d.stride(0)).map(|_| ()),
            "conv_dilation_zero" => {
                conv(&[1, 3, 4, 4, 4], &[4, 3, 1, 1, 1], d.dilation(0)).map(|_| ())
            }
            "conv_bias" => z(&[1, 3, 4, 4, 4])?
                .conv3d(&z(&[4, 3, 1, 1, 1])?, Some(&z(&[3])?), d)
                .map(|_| ()),
            "conv_same_strided" => z(&[1, 3, 4, 4, 4])?
                .conv3d_same_opts(&z(&[4, 3, 1, 1, 1])?, None, d.stride(2))
                .map(|_| ()),
            "convt_rank" => z(&[3, 4, 4])?
                .conv_transpose3d(&z(&[3, 4, 2, 2, 2])?, None, t)
                .map(|_| ()),
            "convt_channels" => z(&[1, 2, 4, 4, 4])?
                .conv_transpose3d(&z(&[3, 4, 2, 2, 2])?, None, t)
                .map(|_| ()),
            "convt_output_padding" => z(&[1, 3, 4, 4, 4])?
                .conv_transpose3d(&z(&[3, 4, 2, 2, 2])?, None, t.stride(2).output_padding(2))
                .map(|_| ()),
            "max_rank" => F::max_pool3d(&z(&[3, 4, 4])?, p(2)).map(|_| ()),
            "max_pad" => F::max_pool3d(&z(&[1, 1, 4, 4, 4])?, p(2).padding(2)).map(|_| ()),
            "max_pad_dilated" => {
                F::max_pool3d(&z(&[1, 1, 6, 6, 6])?, p(3).padding(2).dilation(2)).map(|_| ())
            }
            "max_stride_zero" => F::max_pool3d(&z(&[1, 1, 4, 4, 4])?, p(2).stride(0)).map(|_| ()),
            "max_small" => F::max_pool3d(&z(&[1, 1, 1, 4, 4])?, p(3)).map(|_| ()),
            "avg_rank" => F::avg_pool3d(&z(&[3, 4, 4])?, p(2)).map(|_| ()),
            "avg_pad" => F::avg_pool3d(&z(&[1, 1, 4, 4, 4])?, p(2).padding(2)).map(|_| ()),
            "avg_small" => F::avg_pool3d(&z(&[1, 1, 2, 4, 4])?, p(3).padding(1)).map(|_| ()),
            "avg_u8" => F::avg_pool3d(&z(&[1, 1, 4, 4, 4])?.to_dtype(DType::U8)?, p(2)).map(|_| ()),
            "avg_divisor_zero" => {
                F::avg_pool3d(&z(&[1, 1, 4, 4, 4])?, p(2).divisor_override(0)).map(|_| ())
            }
            "aavg_rank" => F::adaptive_avg_pool3d(&z(&[3, 4, 4])?, (2, 2, 2)).map(|_| ()),
            "aavg_empty" => F::adaptive_avg_pool3d(&z(&[1, 1, 0, 4, 4])?, (2, 2, 2)).map(|_| ()),
            "amax_rank" => F::adaptive_max_pool3d(&z(&[3, 4, 4])?, (2, 2, 2)).map(|_| ()),
            "amax_empty" => F::adaptive_max_pool3d(&z(&[1, 1, 0, 4, 4])?, (2, 2, 2)).map(|_| ()),
            "amax_long" => {
                F::adaptive_max_pool3d(&z(&[1, 1, 4, 4, 4])?.to_dtype(DType::I64)?, (2, 2, 2))
                    .map(|_| ())
            }
            "bn3d_rank" => nn::BatchNorm3d::new(3, &dev)?
                .forward(&z(&[2, 3, 4, 4])?)
                .map(|_| ()),
            "in3d_rank" => nn::InstanceNorm3d::new(3, &dev)?
                .forward(&z(&[2, 3, 4])?)
                .map(|_| ()),
            "module_groups" => nn::Conv3d::new(4, 6, 3, d.groups(4), &dev).map(|_| ()),
            "module_same_strided" => nn::Conv3d::new(4, 6, 3, d.stride(2), &dev)?
                .padding_same()
                .map(|_| ()),
            n => panic!("error case {n}"),
        };
        let got = got.expect_err(name).to_string();
        // PyTorch's message, but for its `[[...]]` around a size
        let want = want.replace("[[", "[").replace("]]", "]");
        let want = match name {
            // the part of the message that is ember's too
            "bn3d_rank" => "expected 5D input",
            _ => want.as_str(),
        };
        assert!(got.contains(want), "{name}: got {got}, want {want}");
    }
    Ok(())
}

/// A PyTorch `Conv3d`'s state dict (names `weight`, `bias`) loads into
/// `nn::Conv3d`, which then computes PyTorch's output; a fresh layer's
/// parameters are PyTorch's default uniform in `±1/sqrt(fan_in)`.
fn conv3d_layers_load_pytorchs_state(dev: &Device) -> Result<()> {
    // (the layers draw from the global generator)
    let _rng = crate::rng_lock();
    let all = cases();
    let case = all["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "stride_pad")
        .unwrap();
    let x = tensor(&case["inputs"][0], dev)?;
    let (w, b) = (
        tensor(&case["inputs"][1], dev)?,
        tensor(&case["inputs"][2], dev)?,
    );
    let opts = Conv3dOptions {
        stride: (2, 1, 2),
        padding: (1, 0, 1),
        ..Conv3dOptions::default()
    };
    let mut conv = nn::Conv3d::with_kernel(2, 3, (3, 2, 3), true, opts, dev)?;
    conv.to_dtype(DType::F64)?;
    let names: Vec<String> = conv
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["weight", "bias"]);
    let bound = 1.0 / ((2 * 3 * 2 * 3) as f64).sqrt();
    for (_, p) in conv.named_parameters() {
        assert!(values(&p)?.iter().all(|v| v.abs() <= bound));
        assert!(p.requires_grad());
    }
    conv.load_state_dict(&[("weight".into(), w), ("bias".into(), b)], true)?;
    let y = conv.forward(&x)?;
    let want = tensor(&case["outputs"][0], &Device::Cpu)?;
    crate::assert_close(&values(&y)?, &values(&want)?, 1e-12, 1e-12);
    // the transposed layer: weight [in, out / groups, kD, kH, kW]
    let up = nn::ConvTranspose3d::with_kernel(
        4,
        6,
        (1, 2, 3),
        false,
        ConvTranspose3dOptions::default().groups(2),
        dev,
    )?;
    assert_eq!(up.weight.shape(), &[4, 3, 1, 2, 3]);
    let bound = 1.0 / ((3 * 2 * 3) as f64).sqrt();
    assert!(values(&up.weight)?.iter().all(|v| v.abs() <= bound));
    assert_eq!(up.named_parameters().len(), 1);
    let y = up.forward(&Tensor::ones([4, 2, 2, 2], DType::F32, dev)?)?;
    assert_eq!(y.shape(), &[6, 2, 3, 4]);
    // an output size within a stride of the smallest picks the output padding
    let opts = ConvTranspose3dOptions::default().stride(2).padding(1);
    let up = nn::ConvTranspose3d::new(2, 3, 3, opts, dev)?;
    let x = Tensor::randn([1, 2, 3, 2, 4], dev)?;
    let sized = up.forward_with_output_size(&x, (6, 3, 8))?;
    let padded = x.conv_transpose3d(
        &up.weight,
        up.bias.as_ref(),
        ConvTranspose3dOptions {
            output_padding: (1, 0, 1),
            ..opts
        },
    )?;
    assert_eq!(sized.shape(), &[1, 3, 6, 3, 8]);
    assert_eq!(values(&sized)?, values(&padded)?);
    let e = up
        .forward_with_output_size(&x, (7, 3, 8))
        .expect_err("too big");
    assert!(
        e.to_string().contains("valid sizes range from 5 to 6"),
        "{e}"
    );
    Ok(())
}

device_test!(conv3d_layers_load_pytorchs_state);

/// An empty batch gives an empty output of PyTorch's shape (the other dims
/// as for one sample), and int64 max pooling picks the float one's values.
fn conv3d_and_pools_take_empty_batches_and_integers(dev: &Device) -> Result<()> {
    let x = Tensor::zeros([0, 2, 4, 5, 4], DType::F32, dev)?;
    let w = Tensor::ones([3, 2, 2, 2, 2], DType::F32, dev)?;
    let d = Conv3dOptions::default();
    assert_eq!(x.conv3d(&w, None, d.padding(1))?.shape(), &[0, 3, 5, 6, 5]);
    let t = ConvTranspose3dOptions::default().stride(2);
    let wt = Tensor::ones([2, 3, 2, 2, 2], DType::F32, dev)?;
    assert_eq!(x.conv_transpose3d(&wt, None, t)?.shape(), &[0, 3, 8, 10, 8]);
    // and their gradients: zeros of the operands' shapes
    let (xg, wg, wtg) = (
        x.detach().requires_grad_(true)?,
        w.detach().requires_grad_(true)?,
        wt.detach().requires_grad_(true)?,
    );
    xg.conv3d(&wg, None, d.padding(1))?.sum_all()?.backward()?;
    xg.conv_transpose3d(&wtg, None, t)?.sum_all()?.backward()?;
    for g in [xg.grad(), wg.grad(), wtg.grad()] {
        let g = g.expect("a gradient");
        assert!(values(&g)?.iter().all(|&v| v == 0.0));
    }
    assert_eq!(wtg.grad().unwrap().shape(), wt.shape());
    let p = Pool3dOptions::new(2);
    assert_eq!(F::max_pool3d(&x, p)?.shape(), &[0, 2, 2, 2, 2]);
    assert_eq!(F::avg_pool3d(&x, p.padding(1))?.shape(), &[0, 2, 3, 3, 3]);
    assert_eq!(
        F::adaptive_avg_pool3d(&x, (2, 3, 1))?.shape(),
        &[0, 2, 2, 3, 1]
    );
    let v = Tensor::arange(0f64, 2.0 * 4.0 * 5.0 * 4.0, dev)?
        .remainder(11.0)?
        .reshape([2, 4, 5, 4])?;
    let opts = Pool3dOptions::cuboid(2, 3, 2).stride(1).padding(1);
    let (want, wi) = F::max_pool3d_with_indices(&v, opts)?;
    let (got, gi) = F::max_pool3d_with_indices(&v.to_dtype(DType::I64)?, opts)?;
    assert_eq!(got.dtype(), DType::I64);
    assert_eq!(values(&got)?, values(&want)?);
    assert_eq!(gi.to_vec::<i64>()?, wi.to_vec::<i64>()?);
    Ok(())
}

device_test!(conv3d_and_pools_take_empty_batches_and_integers);
