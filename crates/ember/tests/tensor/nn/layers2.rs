//! Upsample (`F.interpolate`, and its bicubic, area and antialiased modes from
//! the `resample` section), ConvTranspose2d, Conv1d, PReLU and
//! InstanceNorm1d/2d against PyTorch (tests/golden/gen_nn.py, `layers2`): each
//! case's module with PyTorch's state, its outputs, input and parameter
//! gradients and final state on every device; the same cases on meta (shapes and
//! dtypes); PyTorch's refusals.

use super::{cases, state_of, tensor};
use ember::nn::functional::{
    conv1d, conv_transpose2d, instance_norm, interpolate, prelu, InstanceNormOptions,
    InterpolateMode, InterpolateOptions,
};
use ember::nn::{self, Conv1dOptions, ConvTranspose2dOptions, Module};
use ember::prelude::*;
use serde_json::Value;

fn usize_of(v: &Value) -> usize {
    v.as_u64().unwrap() as usize
}

/// A config's `(h, w)` pair from an int or a list of two ints (PyTorch's forms).
fn pair(v: &Value, default: usize) -> (usize, usize) {
    match v {
        Value::Null => (default, default),
        Value::Array(a) => (usize_of(&a[0]), usize_of(&a[1])),
        v => (usize_of(v), usize_of(v)),
    }
}

/// One value, or a list of them (PyTorch's `size`/`scale_factor`).
fn list<T>(v: &Value, f: impl Fn(&Value) -> T) -> Option<Vec<T>> {
    match v {
        Value::Null => None,
        Value::Array(a) => Some(a.iter().map(f).collect()),
        v => Some(vec![f(v)]),
    }
}

fn interpolate_options(c: &Value) -> InterpolateOptions {
    InterpolateOptions {
        size: list(&c["size"], usize_of),
        scale_factor: list(&c["scale_factor"], |v| v.as_f64().unwrap()),
        mode: match c["mode"].as_str().unwrap_or("nearest") {
            "nearest" => InterpolateMode::Nearest,
            "nearest-exact" => InterpolateMode::NearestExact,
            "linear" => InterpolateMode::Linear,
            "bilinear" => InterpolateMode::Bilinear,
            "trilinear" => InterpolateMode::Trilinear,
            "bicubic" => InterpolateMode::Bicubic,
            "area" => InterpolateMode::Area,
            m => panic!("mode {m}"),
        },
        align_corners: c["align_corners"].as_bool(),
        recompute_scale_factor: c["recompute_scale_factor"].as_bool(),
        antialias: c["antialias"].as_bool().unwrap_or(false),
    }
}

/// The layer a case describes, built on `dev` (its parameters drawn, then
/// replaced by the case's state).
fn layer(case: &Value, dev: &Device) -> Result<Box<dyn Module>> {
    let c = &case["config"];
    let u = |k: &str| usize_of(&c[k]);
    let bias = c["bias"].as_bool().unwrap_or(true);
    Ok(match case["kind"].as_str().unwrap() {
        "upsample" => Box::new(nn::Upsample::new(interpolate_options(c))),
        "conv_transpose2d" => {
            let opts = ConvTranspose2dOptions {
                stride: pair(&c["stride"], 1),
                padding: pair(&c["padding"], 0),
                output_padding: pair(&c["output_padding"], 0),
                dilation: pair(&c["dilation"], 1),
                groups: c["groups"].as_u64().unwrap_or(1) as usize,
            };
            let k = pair(&c["kernel_size"], 0);
            Box::new(nn::ConvTranspose2d::with_kernel(
                u("in_channels"),
                u("out_channels"),
                k,
                bias,
                opts,
                dev,
            )?)
        }
        "conv1d" => {
            let same = c["padding"] == "same";
            let opts = Conv1dOptions {
                stride: c["stride"].as_u64().unwrap_or(1) as usize,
                padding: c["padding"].as_u64().unwrap_or(0) as usize,
                dilation: c["dilation"].as_u64().unwrap_or(1) as usize,
                groups: c["groups"].as_u64().unwrap_or(1) as usize,
            };
            let conv = nn::Conv1d::with_bias(
                u("in_channels"),
                u("out_channels"),
                u("kernel_size"),
                bias,
                opts,
                dev,
            )?;
            Box::new(if same { conv.padding_same()? } else { conv })
        }
        "prelu" => Box::new(nn::PReLU::new(u("num_parameters"), dev)?),
        "instance_norm" => {
            let affine = c["affine"].as_bool().unwrap_or(false);
            let track = c["track_running_stats"].as_bool().unwrap_or(false);
            let (features, momentum, eps) = (
                u("num_features"),
                c["momentum"].as_f64().unwrap_or(0.1),
                c["eps"].as_f64().unwrap_or(1e-5),
            );
            if u("dims") == 1 {
                let mut m = nn::InstanceNorm1d::with_options(features, affine, track, dev)?;
                (m.momentum, m.eps) = (momentum, eps);
                Box::new(m)
            } else {
                let mut m = nn::InstanceNorm2d::with_options(features, affine, track, dev)?;
                (m.momentum, m.eps) = (momentum, eps);
                Box::new(m)
            }
        }
        k => panic!("kind {k}"),
    })
}

/// `m`'s forward, or a transposed convolution's with an output size.
fn forward(case: &Value, m: &dyn Module, x: &Tensor, dev: &Device) -> Result<Tensor> {
    let Some(size) = case["config"]["call"]["output_size"].as_array() else {
        return m.forward(x);
    };
    // (rebuilt from the state: `m` is a trait object)
    let c = &case["config"];
    let opts = ConvTranspose2dOptions {
        stride: pair(&c["stride"], 1),
        padding: pair(&c["padding"], 0),
        ..Default::default()
    };
    let state = m.state_dict();
    let get = |n: &str| state.iter().find(|(k, _)| k == n).map(|(_, t)| t.clone());
    // the module's own tensors, so that their gradients are the module's
    let ct = nn::ConvTranspose2d {
        weight: get("weight").unwrap(),
        bias: get("bias"),
        options: opts,
    };
    assert_eq!(ct.weight.device(), *dev);
    ct.forward_with_output_size(x, (usize_of(&size[0]), usize_of(&size[1])))
}

fn dtype_of(case: &Value) -> DType {
    match case["dtype"].as_str().unwrap() {
        "float32" => DType::F32,
        _ => DType::F64,
    }
}

/// The cases of `layers2` and of `resample` (interpolate's bicubic, area and
/// antialiased modes).
fn all_cases(all: &Value) -> Vec<&Value> {
    let (layers, resample) = (&all["layers2"]["cases"], &all["resample"]["cases"]);
    let cases: Vec<&Value> = [layers, resample]
        .iter()
        .flat_map(|s| s.as_array().unwrap())
        .collect();
    assert!(cases.len() >= 60, "{} cases", cases.len());
    cases
}

/// Every case's steps against PyTorch's values on `dev`.
fn new_layers_match_pytorch(dev: &Device) -> Result<()> {
    let _rng = crate::rng_lock();
    let all = cases();
    for case in all_cases(&all) {
        let name = format!(
            "{}/{}",
            case["kind"].as_str().unwrap(),
            case["name"].as_str().unwrap()
        );
        let dt = dtype_of(case);
        let (rtol, atol) = if dt == DType::F64 {
            (1e-10, 1e-12)
        } else {
            (2e-5, 2e-5)
        };
        let close = |what: &str, got: &Tensor, want: &Value| -> Result<()> {
            super::assert_matches(&format!("{name} {what}"), got, want, (rtol, atol))
        };
        let mut m = layer(case, dev)?;
        m.to_dtype(dt)?;
        ember::io::load_state_into(m.as_ref(), &state_of(&case["state"], dev)?, &name)?;
        for (i, step) in case["steps"].as_array().unwrap().iter().enumerate() {
            m.set_training(step["train"].as_bool().unwrap());
            let x = tensor(&step["x"], dev)?
                .to_dtype(dt)?
                .requires_grad_(true)?;
            let y = forward(case, m.as_ref(), &x, dev)?;
            assert_eq!(y.dtype(), dt, "{name}");
            close(&format!("step {i} output"), &y, &step["y"])?;
            let gy = Tensor::linspace(-1.0, 1.0, y.numel(), dt, dev)?.reshape(y.shape())?;
            y.backward_with(&gy)?;
            close(
                &format!("step {i} input grad"),
                &x.grad().unwrap(),
                &step["x_grad"],
            )?;
            for (k, p) in m.named_parameters() {
                let want = &step["param_grads"][&k];
                close(&format!("step {i} {k} grad"), &p.grad().unwrap(), want)?;
            }
        }
        let final_state = &case["final_state"];
        let state = m.state_dict();
        assert_eq!(
            state.len(),
            final_state.as_object().unwrap().len(),
            "{name}: state-dict names"
        );
        for (k, t) in state {
            close(
                &format!("final {k}"),
                &t.to_dtype(DType::F64)?,
                &final_state[&k],
            )?;
        }
    }
    Ok(())
}

/// The same cases on meta: the CPU's shapes and dtypes forward and backward.
#[test]
fn new_layers_run_on_meta_with_the_cpus_shapes() -> Result<()> {
    let _rng = crate::rng_lock();
    let all = cases();
    let meta = Device::Meta;
    for case in all_cases(&all) {
        let name = case["name"].as_str().unwrap();
        let dt = dtype_of(case);
        let mut m = layer(case, &meta)?;
        m.to_dtype(dt)?;
        for step in case["steps"].as_array().unwrap() {
            m.set_training(step["train"].as_bool().unwrap());
            let shape = tensor(&step["x"], &Device::Cpu)?.shape().to_vec();
            let x = Tensor::zeros(&shape[..], dt, &meta)?.requires_grad_(true)?;
            let y = forward(case, m.as_ref(), &x, &meta)?;
            let want = tensor(&step["y"], &Device::Cpu)?;
            assert_eq!((y.shape(), y.dtype()), (want.shape(), dt), "{name}");
            assert_eq!(y.device(), meta);
            y.sum_all()?.backward()?;
            assert_eq!(x.grad().unwrap().shape(), &shape[..], "{name}");
            for (k, p) in m.named_parameters() {
                assert_eq!(p.grad().unwrap().shape(), p.shape(), "{name} {k}");
            }
        }
    }
    Ok(())
}

/// PyTorch's refusals (tests/golden/gen_nn.py records a phrase of each message,
/// which ember's contains), as errors on every device.
fn new_layers_refuse_as_pytorch(dev: &Device) -> Result<()> {
    let _rng = crate::rng_lock();
    let all = cases();
    let x = Tensor::zeros([1, 2, 4, 4], DType::F32, dev)?;
    let w = Tensor::zeros([2, 3, 3, 3], DType::F32, dev)?;
    let z = |s: &[usize]| Tensor::zeros(s, DType::F32, dev);
    let size = InterpolateOptions::size([3]);
    let ct = ConvTranspose2dOptions::default();
    let errors: Vec<&Value> = ["layers2", "resample"]
        .iter()
        .flat_map(|s| all[s]["errors"].as_array().unwrap())
        .collect();
    assert!(errors.len() >= 23);
    for e in errors {
        let name = e["name"].as_str().unwrap();
        let phrase = e["phrase"].as_str().unwrap();
        let got = match name {
            "interp_both" => interpolate(
                &x,
                &InterpolateOptions {
                    scale_factor: Some(vec![2.0]),
                    ..size.clone()
                },
            ),
            "interp_neither" => interpolate(&x, &InterpolateOptions::default()),
            "interp_align_nearest" => interpolate(&x, &size.clone().align_corners(true)),
            "interp_bilinear_3d" => interpolate(
                &z(&[1, 2, 4])?,
                &size.clone().mode(InterpolateMode::Bilinear),
            ),
            "interp_rank_2" => interpolate(&z(&[2, 4])?, &size),
            "interp_size_dims" => interpolate(&x, &InterpolateOptions::size([2, 3, 4])),
            "interp_recompute_size" => interpolate(&x, &size.clone().recompute_scale_factor(true)),
            "interp_zero_output" => interpolate(&x, &InterpolateOptions::scale_factor(0.2)),
            "bicubic_3d" => interpolate(
                &z(&[1, 2, 5])?,
                &size.clone().mode(InterpolateMode::Bicubic),
            ),
            "area_align" => interpolate(
                &x,
                &size
                    .clone()
                    .mode(InterpolateMode::Area)
                    .align_corners(false),
            ),
            "antialias_nearest" => interpolate(&x, &size.clone().antialias(true)),
            "antialias_linear_3d" => interpolate(
                &z(&[1, 2, 5])?,
                &size.clone().mode(InterpolateMode::Linear).antialias(true),
            ),
            "area_int" => interpolate(
                &Tensor::zeros([1, 2, 5, 4], DType::I64, dev)?,
                &size.clone().mode(InterpolateMode::Area),
            ),
            "ct_output_padding" => conv_transpose2d(&x, &w, None, ct.stride(2).output_padding(2)),
            "ct_channels" => conv_transpose2d(&z(&[1, 3, 4, 4])?, &w, None, ct),
            "ct_too_small" => conv_transpose2d(&z(&[1, 2, 1, 1])?, &w, None, ct.padding(3)),
            "conv1d_channels" => conv1d(
                &z(&[1, 3, 8])?,
                &z(&[4, 2, 3])?,
                None,
                Conv1dOptions::default(),
            ),
            "conv1d_kernel" => conv1d(
                &z(&[1, 2, 2])?,
                &z(&[4, 2, 3])?,
                None,
                Conv1dOptions::default(),
            ),
            "conv1d_rank" => conv1d(&x, &z(&[4, 2, 3])?, None, Conv1dOptions::default()),
            "prelu_channels" => prelu(&z(&[2, 4, 3])?, &z(&[3])?),
            "instance_norm_one_position" => {
                instance_norm(&z(&[2, 3, 1])?, None, None, InstanceNormOptions::default())
            }
            "instance_norm2d_rank" => {
                nn::InstanceNorm2d::new(3, dev)?.forward(&z(&[2, 3, 4, 4, 4])?)
            }
            "instance_norm_affine_channels" => {
                nn::InstanceNorm1d::with_options(3, true, false, dev)?.forward(&z(&[2, 4, 5])?)
            }
            other => panic!("unknown error case {other}"),
        };
        let msg = got.expect_err(name).to_string();
        assert!(msg.contains(phrase), "{name}: {msg:?} lacks {phrase:?}");
    }
    Ok(())
}

/// The layers' parameters and state-dict names are PyTorch's, with PyTorch's
/// initial values (PReLU 0.25, instance norm's ones and zeros) and bounds.
fn new_layers_have_pytorchs_parameters(dev: &Device) -> Result<()> {
    let _rng = crate::rng_lock();
    let names =
        |m: &dyn Module| -> Vec<String> { m.state_dict().into_iter().map(|(n, _)| n).collect() };
    let ct = nn::ConvTranspose2d::new(4, 6, 3, ConvTranspose2dOptions::default().groups(2), dev)?;
    assert_eq!(ct.weight.shape(), &[4, 3, 3, 3]);
    assert_eq!(names(&ct), ["weight", "bias"]);
    // Kaiming-uniform's bound 1/sqrt(fan_in), fan_in = out / groups · k · k
    let bound = 1.0 / (27f64).sqrt();
    let all_in = |t: &Tensor| -> Result<bool> {
        Ok(t.to_vec::<f32>()?.iter().all(|v| (v.abs() as f64) <= bound))
    };
    assert!(all_in(&ct.weight)? && all_in(ct.bias.as_ref().unwrap())?);
    assert!(
        nn::ConvTranspose2d::new(3, 4, 3, ConvTranspose2dOptions::default().groups(2), dev)
            .is_err()
    );
    let c1 = nn::Conv1d::with_bias(6, 4, 5, false, Conv1dOptions::default().groups(2), dev)?;
    assert_eq!(c1.weight.shape(), &[4, 3, 5]);
    assert_eq!(names(&c1), ["weight"]);
    assert!(nn::Conv1d::new(3, 4, 3, Conv1dOptions::default().groups(2), dev).is_err());
    assert!(
        nn::Conv1d::new(3, 4, 3, Conv1dOptions::default().stride(2), dev)?
            .padding_same()
            .is_err()
    );
    let p = nn::PReLU::new(3, dev)?;
    assert_eq!(p.weight.to_vec::<f32>()?, [0.25; 3]);
    assert_eq!(names(&p), ["weight"]);
    let norm = nn::InstanceNorm2d::with_options(3, true, true, dev)?;
    assert_eq!(
        names(&norm),
        [
            "weight",
            "bias",
            "running_mean",
            "running_var",
            "num_batches_tracked"
        ]
    );
    assert!(names(&nn::InstanceNorm1d::new(3, dev)?).is_empty());
    assert!(nn::Upsample::new(InterpolateOptions::scale_factor(2.0))
        .state_dict()
        .is_empty());
    Ok(())
}

/// Nearest upsampling of uint8 (PyTorch takes it, without gradients), and a
/// half-precision bilinear one blended in float32 and rounded once.
fn interpolate_takes_uint8_and_half(dev: &Device) -> Result<()> {
    let _rng = crate::rng_lock();
    let x = Tensor::new([1u8, 2, 3, 4], dev)?.reshape([1, 1, 2, 2])?;
    let y = interpolate(&x, &InterpolateOptions::scale_factor(2.0))?;
    assert_eq!(y.dtype(), DType::U8);
    assert_eq!(
        y.to_vec::<u8>()?,
        [1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4]
    );
    let bilinear = InterpolateOptions::size([3, 5]).mode(InterpolateMode::Bilinear);
    assert!(interpolate(&x.to_dtype(DType::I64)?, &bilinear).is_err());
    let xf = Tensor::randn([2, 3, 4, 4], dev)?;
    for dt in [DType::F16, DType::BF16] {
        let want = interpolate(&xf, &bilinear)?.to_dtype(dt)?;
        let got = interpolate(&xf.to_dtype(dt)?, &bilinear)?;
        assert_eq!(got.dtype(), dt);
        let tol = if dt == DType::BF16 { 2e-2 } else { 2e-3 };
        assert!(got
            .to_dtype(DType::F32)?
            .allclose(&want.to_dtype(DType::F32)?, tol, tol)?);
    }
    Ok(())
}

/// An empty batch gives an empty output (PyTorch's `[0, C_out, H_out, W_out]`)
/// with zero gradients for the weight and bias, on every device; a weight
/// without input channels is refused, as in PyTorch.
fn conv_transpose2d_of_nothing(dev: &Device) -> Result<()> {
    let w = Tensor::ones([2, 3, 3, 3], DType::F32, dev)?.requires_grad_(true)?;
    let b = Tensor::new([1f32, 2.0, 3.0], dev)?.requires_grad_(true)?;
    let x = Tensor::zeros([0, 2, 3, 3], DType::F32, dev)?.requires_grad_(true)?;
    let opts = ConvTranspose2dOptions::default();
    let y = x.conv_transpose2d(&w, Some(&b), opts)?;
    assert_eq!(y.shape(), &[0, 3, 5, 5]);
    y.sum_all()?.backward()?;
    assert_eq!(w.grad().unwrap().to_vec::<f32>()?, [0.0; 54]);
    assert_eq!(b.grad().unwrap().to_vec::<f32>()?, [0.0; 3]);
    let w0 = Tensor::ones([0, 3, 2, 2], DType::F32, dev)?;
    let x0 = Tensor::zeros([1, 0, 2, 2], DType::F32, dev)?;
    let err = x0.conv_transpose2d(&w0, Some(&b), opts).unwrap_err();
    assert!(err
        .to_string()
        .contains("expected weight to be at least 1 at dimension 0"));
    let err = x.conv_transpose2d(&Tensor::ones([2, 0, 3, 3], DType::F32, dev)?, None, opts);
    assert!(err.is_err());
    // a channels-last input gives a channels-last output, as PyTorch's
    let _rng = crate::rng_lock();
    let xc =
        Tensor::randn([2, 2, 4, 4], dev)?.to_memory_format(ember::MemoryFormat::ChannelsLast)?;
    let y = xc.conv_transpose2d(&w.detach(), None, opts.stride(2))?;
    assert_eq!(y.shape(), &[2, 3, 9, 9]);
    assert!(y.is_contiguous_in(ember::MemoryFormat::ChannelsLast));
    Ok(())
}

/// A channels-last input gives a channels-last output in every mode (PyTorch's
/// suggested memory format), with the values of the contiguous input's; other
/// layouts give contiguous outputs.
fn interpolate_keeps_channels_last(dev: &Device) -> Result<()> {
    let _rng = crate::rng_lock();
    let cl = ember::MemoryFormat::ChannelsLast;
    let x = Tensor::randn([2, 3, 5, 7], dev)?;
    let xl = x.to_memory_format(cl)?;
    let modes = [
        (InterpolateMode::Nearest, false),
        (InterpolateMode::NearestExact, false),
        (InterpolateMode::Bilinear, false),
        (InterpolateMode::Bilinear, true),
        (InterpolateMode::Bicubic, false),
        (InterpolateMode::Bicubic, true),
        (InterpolateMode::Area, false),
    ];
    for (mode, aa) in modes {
        let opts = InterpolateOptions::size([4, 9]).mode(mode).antialias(aa);
        let (want, got) = (interpolate(&x, &opts)?, interpolate(&xl, &opts)?);
        assert!(got.is_contiguous_in(cl), "{mode:?} {aa}");
        assert!(want.is_contiguous(), "{mode:?} {aa}");
        assert_eq!(got.to_vec::<f32>()?, want.to_vec::<f32>()?, "{mode:?} {aa}");
    }
    Ok(())
}

/// uint8 bilinear and bicubic resizing, antialiased or not, equal to PyTorch's
/// CPU kernels value for value (their fixed-point arithmetic; the cases were
/// made on a CPU whose capability the section records).
fn uint8_resizes_match_pytorch(dev: &Device) -> Result<()> {
    let all = cases();
    let cases = all["resample"]["uint8"].as_array().unwrap();
    assert!(cases.len() >= 20, "{} cases", cases.len());
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let image = &all["resample"]["images"][case["image"].as_str().unwrap()];
        let x = tensor(image, dev)?.to_dtype(DType::U8)?;
        let want = tensor(&case["y"], &Device::Cpu)?;
        let y = interpolate(&x, &interpolate_options(&case["config"]))?;
        assert_eq!((y.dtype(), y.shape()), (DType::U8, want.shape()), "{name}");
        let (got, want) = (
            y.to_dtype(DType::F64)?.to_vec::<f64>()?,
            want.to_vec::<f64>()?,
        );
        let off: Vec<(f64, f64)> = got
            .iter()
            .zip(&want)
            .filter(|(a, b)| a != b)
            .map(|(a, b)| (*a, *b))
            .collect();
        assert!(
            off.is_empty(),
            "{name}: {} of {} values differ, e.g. {:?}",
            off.len(),
            want.len(),
            &off[..off.len().min(5)]
        );
    }
    Ok(())
}

/// Corners of the resampling taps: an antialiased output of one element per
/// dim (every source weighted, the gradient the normalised weights), and
/// infinite or NaN sources reaching only the outputs whose windows hold them
/// (area and antialiased modes leave out the taps beyond a window instead of
/// multiplying them by 0).
fn resampling_corners(dev: &Device) -> Result<()> {
    let x = Tensor::new([0f32, 10.0, 20.0, 30.0], dev)?
        .reshape([1, 1, 4, 1])?
        .requires_grad_(true)?;
    let one = InterpolateOptions::size([1, 1])
        .mode(InterpolateMode::Bilinear)
        .antialias(true);
    let y = interpolate(&x, &one)?;
    assert!((y.to_vec::<f32>()?[0] - 15.0).abs() < 1e-5);
    y.sum_all()?.backward()?;
    // the triangle's weights 5/8, 7/8, 7/8, 5/8 over their sum 3
    let want = [5.0 / 24.0, 7.0 / 24.0, 7.0 / 24.0, 5.0 / 24.0];
    for (g, w) in x.grad().unwrap().to_vec::<f32>()?.iter().zip(want) {
        assert!((g - w).abs() < 1e-6, "{g} vs {w}");
    }
    let mut v = vec![1f32; 20];
    v[19] = f32::INFINITY;
    let row = Tensor::from_vec(v, [1, 1, 1, 20], dev)?;
    let area = interpolate(
        &row,
        &InterpolateOptions::size([1, 7]).mode(InterpolateMode::Area),
    )?;
    assert_eq!(
        area.to_vec::<f32>()?,
        [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, f32::INFINITY]
    );
    let aa = interpolate(
        &row,
        &InterpolateOptions::size([1, 7])
            .mode(InterpolateMode::Bilinear)
            .antialias(true),
    )?
    .to_vec::<f32>()?;
    assert!(aa[..6].iter().all(|v| (v - 1.0).abs() < 1e-6), "{aa:?}");
    assert_eq!(aa[6], f32::INFINITY);
    // a window without the NaN and the infinity stays finite
    let mut v: Vec<f32> = (0..16).map(|i| i as f32).collect();
    (v[5], v[10]) = (f32::NAN, f32::INFINITY);
    let x = Tensor::from_vec(v, [1, 1, 4, 4], dev)?;
    let y = interpolate(
        &x,
        &InterpolateOptions::size([2, 3]).mode(InterpolateMode::Area),
    )?;
    // rows 2..4 × columns 0..2: 8, 9, 12, 13
    assert_eq!(y.to_vec::<f32>()?[3], 10.5);
    Ok(())
}

device_test!(
    resampling_corners,
    uint8_resizes_match_pytorch,
    interpolate_keeps_channels_last,
    conv_transpose2d_of_nothing,
    new_layers_match_pytorch,
    new_layers_refuse_as_pytorch,
    new_layers_have_pytorchs_parameters,
    interpolate_takes_uint8_and_half,
);

/// PReLU is a lower-precision op under autocast (PyTorch's lists, CPU and
/// CUDA): a float32 input and weight give bfloat16, and a bfloat16 input with
/// a float32 weight is accepted; a scale factor whose output size overflows
/// int64 is refused with PyTorch's message instead of wrapping around.
#[test]
fn prelu_under_autocast_and_huge_scale_factors() -> Result<()> {
    use ember::nn::functional as F;
    let cpu = Device::Cpu;
    let x = Tensor::new([[-1f32, 2.0]], &cpu)?;
    let w = Tensor::new([0.25f32], &cpu)?;
    for input in [x.clone(), x.to_dtype(DType::BF16)?] {
        let y = ember::autocast(DType::BF16, || F::prelu(&input, &w))??;
        assert_eq!(y.dtype(), DType::BF16);
        assert_eq!(y.to_dtype(DType::F32)?.to_vec2::<f32>()?, [[-0.25, 2.0]]);
    }
    let ones = Tensor::ones([1, 1, 1], DType::F32, &cpu)?;
    for s in [18446744073709555712.0, 1e300, f64::INFINITY, f64::NAN] {
        let e = F::interpolate(&ones, &InterpolateOptions::scale_factor(s))
            .expect_err("refused")
            .to_string();
        assert!(
            e.contains("cannot be converted to type int64_t without overflow"),
            "{s}: {e}"
        );
    }
    Ok(())
}
