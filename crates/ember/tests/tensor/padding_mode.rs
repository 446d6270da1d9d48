//! The convolution layers' padding modes against PyTorch
//! (tests/golden/conv_padding_mode_cases.json, made by
//! tests/golden/gen_conv_padding_mode.py): `nn.Conv1d/2d/3d` with
//! `padding_mode` reflect, replicate and circular, explicit and "same"
//! padding, strides, dilation, groups, unbatched inputs; the output and the
//! input's, weight's and bias's gradients on every device, shapes on meta, and
//! PyTorch's refusals.

use super::conv3d::pattern;
use super::golden_tensor as tensor;
use ember::nn::{self, Conv1dOptions, Module, PaddingMode};
use ember::prelude::*;
use serde_json::Value;

fn cases() -> Value {
    super::golden("conv_padding_mode_cases.json")
}

fn sizes(v: &Value) -> Vec<usize> {
    v.as_array()
        .expect("a list")
        .iter()
        .map(|x| x.as_u64().expect("a size") as usize)
        .collect()
}

/// The case's layer on `dev`, with the golden weight and bias (requiring
/// gradients).
fn layer(case: &Value, dev: &Device) -> Result<Box<dyn Module>> {
    let mode = PaddingMode::from_name(case["mode"].as_str().unwrap())?;
    let (k, s, d) = (
        sizes(&case["kernel"]),
        sizes(&case["stride"]),
        sizes(&case["dilation"]),
    );
    let same = case["padding"].as_str() == Some("same");
    let p = if same {
        vec![0; k.len()]
    } else {
        sizes(&case["padding"])
    };
    let g = case["groups"].as_u64().unwrap() as usize;
    let (cin, cout) = (
        case["in_channels"].as_u64().unwrap() as usize,
        case["out_channels"].as_u64().unwrap() as usize,
    );
    let bias = !case["bias"].is_null();
    let w = tensor(&case["weight"], dev)?.requires_grad_(true)?;
    let b = match bias {
        true => Some(tensor(&case["bias"], dev)?.requires_grad_(true)?),
        false => None,
    };
    Ok(match k.len() {
        1 => {
            let o = Conv1dOptions {
                stride: s[0],
                padding: p[0],
                dilation: d[0],
                groups: g,
            };
            let mut c = nn::Conv1d::with_bias(cin, cout, k[0], bias, o, dev)?.padding_mode(mode);
            if same {
                c = c.padding_same()?;
            }
            (c.weight, c.bias) = (w, b);
            Box::new(c)
        }
        2 => {
            let o = Conv2dOptions {
                stride: (s[0], s[1]),
                padding: (p[0], p[1]),
                dilation: (d[0], d[1]),
                groups: g,
            };
            let mut c = nn::Conv2d::with_bias(cin, cout, k[0], bias, o, dev)?.padding_mode(mode);
            if same {
                c = c.padding_same()?;
            }
            (c.weight, c.bias) = (w, b);
            Box::new(c)
        }
        _ => {
            let o = Conv3dOptions {
                stride: (s[0], s[1], s[2]),
                padding: (p[0], p[1], p[2]),
                dilation: (d[0], d[1], d[2]),
                groups: g,
            };
            let k3 = (k[0], k[1], k[2]);
            let mut c = nn::Conv3d::with_kernel(cin, cout, k3, bias, o, dev)?.padding_mode(mode);
            if same {
                c = c.padding_same()?;
            }
            (c.weight, c.bias) = (w, b);
            Box::new(c)
        }
    })
}

fn values(t: &Tensor) -> Result<Vec<f64>> {
    t.to_dtype(DType::F64)?.to_vec::<f64>()
}

fn padding_modes_match_pytorch(dev: &Device) -> Result<()> {
    let all = cases();
    let list = all["cases"].as_array().unwrap();
    assert_eq!(list.len(), 33);
    for case in list {
        let name = case["name"].as_str().unwrap();
        let conv = layer(case, dev)?;
        let x = tensor(&case["x"], dev)?.requires_grad_(true)?;
        let y = conv.forward(&x)?;
        let want = tensor(&case["out"], &Device::Cpu)?;
        assert_eq!(y.shape(), want.shape(), "{name}");
        crate::assert_close(&values(&y)?, &values(&want)?, 1e-12, 1e-12);
        y.mul(&pattern(&y)?)?.sum_all()?.backward()?;
        let params = conv.named_parameters();
        let param = |n: &str| params.iter().find(|(k, _)| k == n).map(|(_, t)| t.clone());
        let mut got = vec![
            ("grad_x", x.grad()),
            ("grad_weight", param("weight").and_then(|w| w.grad())),
        ];
        if !case["grad_bias"].is_null() {
            got.push(("grad_bias", param("bias").and_then(|b| b.grad())));
        }
        for (key, g) in got {
            let g = g.unwrap_or_else(|| panic!("{name}: no {key}"));
            let want = tensor(&case[key], &Device::Cpu)?;
            assert_eq!(g.shape(), want.shape(), "{name} {key}");
            crate::assert_close(&values(&g)?, &values(&want)?, 1e-12, 1e-12);
        }
    }
    Ok(())
}

device_test!(padding_modes_match_pytorch);

/// On meta the layers give PyTorch's output shapes.
#[test]
fn padding_modes_run_on_meta_with_pytorchs_shapes() -> Result<()> {
    for case in cases()["cases"].as_array().unwrap() {
        let conv = layer(case, &Device::Meta)?;
        let x = tensor(&case["x"], &Device::Meta)?;
        let want = sizes(&case["out"]["shape"]);
        assert_eq!(
            conv.forward(&x)?.shape(),
            want.as_slice(),
            "{}",
            case["name"]
        );
    }
    Ok(())
}

/// PyTorch's refusals: an unknown mode's name, a reflection as wide as the
/// input, a wrap-around more than once; a strided "same" layer.
#[test]
fn padding_mode_refusals_use_pytorchs_words() -> Result<()> {
    let all = cases();
    let errors = &all["errors"];
    let message = |r: Result<Tensor>| r.expect_err("refused").to_string();
    let bad = PaddingMode::from_name("mirror")
        .expect_err("refused")
        .to_string();
    let want = errors["bad_mode"].as_str().unwrap();
    // (PyTorch prints its set of names in an order of its own)
    assert!(bad.contains("padding_mode must be one of {"), "{bad}");
    for name in ["'zeros'", "'reflect'", "'replicate'", "'circular'"] {
        assert!(bad.contains(name) && want.contains(name), "{bad} / {want}");
    }
    assert!(bad.ends_with("but got padding_mode='mirror'"), "{bad}");
    let dev = Device::Cpu;
    let o = Conv2dOptions::default().padding(3);
    let conv = nn::Conv2d::new(1, 1, 3, o, &dev)?.padding_mode(PaddingMode::Reflect);
    let got = message(conv.forward(&Tensor::zeros([1, 1, 3, 3], DType::F32, &dev)?));
    let want = errors["reflect_too_wide"].as_str().unwrap();
    assert!(got.contains(want), "{got} / {want}");
    let o = Conv1dOptions::default().padding(5);
    let conv = nn::Conv1d::new(1, 1, 3, o, &dev)?.padding_mode(PaddingMode::Circular);
    let got = message(conv.forward(&Tensor::zeros([1, 1, 3], DType::F32, &dev)?));
    let want = errors["circular_too_wide"].as_str().unwrap();
    assert!(got.contains(want), "{got} / {want}");
    // a stride set after padding_same is still refused
    let mut conv = nn::Conv2d::new(1, 1, 3, Conv2dOptions::default(), &dev)?
        .padding_same()?
        .padding_mode(PaddingMode::Replicate);
    conv.options.stride = (2, 2);
    let got = message(conv.forward(&Tensor::zeros([1, 1, 5, 5], DType::F32, &dev)?));
    assert!(
        got.contains("padding='same' is not supported for strided convolutions"),
        "{got}"
    );
    Ok(())
}
