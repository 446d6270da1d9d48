//! Pixel and channel shuffle, 1-D pooling, adaptive pooling, max_pool2d's
//! indices, max unpooling, unfold and fold against PyTorch
//! (tests/golden/gen_nn.py, `layers4`): each case's output, indices and input
//! gradient on every device; the same cases on meta (shapes and dtypes);
//! PyTorch's refusals.

use super::{cases, tensor};
use ember::nn::functional as F;
use ember::nn::{self, FoldOptions, Module, Pool1dOptions};
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

fn int_tensor(v: &Value, dev: &Device) -> Result<Tensor> {
    let shape: Vec<usize> = v["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(usize_of)
        .collect();
    let values: Vec<i64> = v["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect();
    Tensor::from_vec(values, shape, dev)
}

fn pool1d(c: &Value) -> Pool1dOptions {
    let mut o = Pool1dOptions::new(usize_of(&c["kernel_size"]));
    o.stride = c["stride"].as_u64().map(|s| s as usize);
    o.padding = c["padding"].as_u64().unwrap_or(0) as usize;
    o.dilation = c["dilation"].as_u64().unwrap_or(1) as usize;
    o.ceil_mode = c["ceil_mode"].as_bool().unwrap_or(false);
    o.count_include_pad = c["count_include_pad"].as_bool().unwrap_or(true);
    o
}

fn pool2d(c: &Value) -> Pool2dOptions {
    let (kh, kw) = pair(&c["kernel_size"], 0);
    let mut o = Pool2dOptions::rect(kh, kw);
    if !c["stride"].is_null() {
        o.stride = Some(pair(&c["stride"], 0));
    }
    o.padding = pair(&c["padding"], 0);
    o.dilation = pair(&c["dilation"], 1);
    o.ceil_mode = c["ceil_mode"].as_bool().unwrap_or(false);
    o
}

fn fold_options(c: &Value) -> FoldOptions {
    let (kh, kw) = pair(&c["kernel_size"], 0);
    FoldOptions {
        kernel_size: (kh, kw),
        dilation: pair(&c["dilation"], 1),
        padding: pair(&c["padding"], 0),
        stride: pair(&c["stride"], 1),
    }
}

/// A case's call on `x`: the output, and the indices where the case has them.
/// Modules where PyTorch's case used one, the functions otherwise.
fn call(case: &Value, x: &Tensor) -> Result<(Tensor, Option<Tensor>)> {
    let c = &case["config"];
    let one = |y: Result<Tensor>| y.map(|y| (y, None));
    let two = |r: Result<(Tensor, Tensor)>| r.map(|(y, i)| (y, Some(i)));
    match case["kind"].as_str().unwrap() {
        "pixel_shuffle" => one(nn::PixelShuffle::new(usize_of(&c["factor"])).forward(x)),
        "pixel_unshuffle" => one(F::pixel_unshuffle(x, usize_of(&c["factor"]))),
        "channel_shuffle" => one(nn::ChannelShuffle::new(usize_of(&c["groups"])).forward(x)),
        "max_pool1d" => {
            let m = nn::MaxPool1d(pool1d(c));
            match c["return_indices"].as_bool().unwrap() {
                true => two(m.forward_with_indices(x)),
                false => one(m.forward(x)),
            }
        }
        "avg_pool1d" => one(nn::AvgPool1d(pool1d(c)).forward(x)),
        "adaptive_avg_pool1d" => one(nn::AdaptiveAvgPool1d::new(usize_of(&c["output"])).forward(x)),
        "adaptive_max_pool1d" => {
            two(nn::AdaptiveMaxPool1d::new(usize_of(&c["output"])).forward_with_indices(x))
        }
        "adaptive_avg_pool2d" => one(F::adaptive_avg_pool2d(x, pair(&c["output"], 0))),
        "adaptive_max_pool2d" => {
            two(nn::AdaptiveMaxPool2d::new(pair(&c["output"], 0)).forward_with_indices(x))
        }
        "max_pool2d_indices" => two(x.max_pool2d_with_indices(pool2d(c))),
        "max_unpool2d" => {
            let idx = int_tensor(&case["unpool_indices"], &x.device())?;
            let size: Option<Vec<usize>> = c["output_size"]
                .as_array()
                .map(|a| a.iter().map(usize_of).collect());
            one(nn::MaxUnpool2d(pool2d(c)).forward(x, &idx, size.as_deref()))
        }
        "unfold" => one(nn::Unfold(fold_options(c)).forward(x)),
        "fold" => one(nn::Fold::new(pair(&c["output_size"], 0), fold_options(c)).forward(x)),
        k => panic!("kind {k}"),
    }
}

fn dtype_of(case: &Value) -> DType {
    match case["dtype"].as_str().unwrap() {
        "float32" => DType::F32,
        _ => DType::F64,
    }
}

fn all_cases(all: &Value) -> &Vec<Value> {
    let cases = all["layers4"]["cases"].as_array().unwrap();
    assert!(cases.len() >= 60, "{} cases", cases.len());
    cases
}

/// Every case's output, indices and input gradient against PyTorch's on `dev`.
fn layers4_match_pytorch(dev: &Device) -> Result<()> {
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
        let x = tensor(&case["x"], dev)?
            .to_dtype(dt)?
            .requires_grad_(true)?;
        let (y, idx) = call(case, &x)?;
        assert_eq!(y.dtype(), dt, "{name}");
        close("output", &y, &case["y"])?;
        match (&idx, case.get("indices")) {
            (Some(i), Some(want)) => {
                assert_eq!(i.dtype(), DType::I64, "{name}");
                let want = int_tensor(want, &Device::Cpu)?;
                assert_eq!(i.shape(), want.shape(), "{name} indices");
                assert_eq!(i.to_vec::<i64>()?, want.to_vec::<i64>()?, "{name} indices");
            }
            (None, None) => {}
            _ => panic!("{name}: indices on one side only"),
        }
        let gy = Tensor::linspace(-1.0, 1.0, y.numel(), dt, dev)?.reshape(y.shape())?;
        y.backward_with(&gy)?;
        close("input grad", &x.grad().unwrap(), &case["x_grad"])?;
    }
    Ok(())
}

/// The same cases on meta: the CPU's shapes and dtypes forward and backward.
#[test]
fn layers4_run_on_meta_with_the_cpus_shapes() -> Result<()> {
    let all = cases();
    let meta = Device::Meta;
    for case in all_cases(&all) {
        let name = case["name"].as_str().unwrap();
        let dt = dtype_of(case);
        let shape = tensor(&case["x"], &Device::Cpu)?.shape().to_vec();
        let x = Tensor::zeros(&shape[..], dt, &meta)?.requires_grad_(true)?;
        let (y, idx) = call(case, &x)?;
        let want = tensor(&case["y"], &Device::Cpu)?;
        assert_eq!((y.shape(), y.dtype()), (want.shape(), dt), "{name}");
        assert_eq!(y.device(), meta);
        if let Some(i) = idx {
            assert_eq!((i.shape(), i.dtype()), (want.shape(), DType::I64), "{name}");
        }
        y.sum_all()?.backward()?;
        assert_eq!(x.grad().unwrap().shape(), &shape[..], "{name}");
    }
    Ok(())
}

/// PyTorch's refusals (tests/golden/gen_nn.py records a phrase of each
/// message, which ember's contains), as errors on every device. (An index out
/// of an unpooled plane is checked on the CPU at once, on a GPU at the next
/// wait: it has a test of its own.)
fn layers4_refuse_as_pytorch(dev: &Device) -> Result<()> {
    let all = cases();
    let z = |s: &[usize]| Tensor::zeros(s, DType::F64, dev);
    let zi = |s: &[usize], dt: DType| Tensor::zeros(s, dt, dev);
    let x4 = z(&[1, 6, 3, 3])?;
    let x3 = z(&[1, 2, 8])?;
    let p1 = Pool1dOptions::new;
    let (v, i) = (z(&[1, 2, 2, 2])?, zi(&[1, 2, 2, 2], DType::I64)?);
    let p2 = Pool2dOptions::new(2);
    let k = FoldOptions::new;
    let errors = all["layers4"]["errors"].as_array().unwrap();
    assert!(errors.len() >= 50);
    for e in errors {
        let name = e["name"].as_str().unwrap();
        let phrase = e["phrase"].as_str().unwrap();
        let got = match name {
            "ps_rank" => F::pixel_shuffle(&z(&[4, 4])?, 2),
            "ps_channels" => F::pixel_shuffle(&x4, 2),
            "ps_zero" => F::pixel_shuffle(&x4, 0),
            "pu_height" => F::pixel_unshuffle(&z(&[1, 1, 3, 4])?, 2),
            "pu_width" => F::pixel_unshuffle(&z(&[1, 1, 4, 3])?, 2),
            "pu_zero" => F::pixel_unshuffle(&x4, 0),
            "cs_rank" => F::channel_shuffle(&z(&[4, 4])?, 2),
            "cs_groups" => F::channel_shuffle(&x4, 4),
            "cs_zero" => F::channel_shuffle(&x4, 0),
            "mp1_rank" => F::max_pool1d(&z(&[1, 2, 3, 4])?, p1(2)),
            "mp1_empty" => F::max_pool1d(&z(&[1, 0, 5])?, p1(2)),
            "mp1_padding" => F::max_pool1d(&x3, p1(3).padding(2)),
            "mp1_kernel" => F::max_pool1d(&x3, p1(0)),
            "mp1_stride" => F::max_pool1d(&x3, p1(2).stride(0)),
            "mp1_dilation" => F::max_pool1d(&x3, p1(2).dilation(0)),
            "mp1_small" => F::max_pool1d(&z(&[1, 2, 2])?, p1(3)),
            "mp1_int" => F::max_pool1d(&zi(&[1, 2, 5], DType::I64)?, p1(2)),
            "ap1_rank" => F::avg_pool1d(&z(&[1, 2, 3, 4])?, p1(2)),
            "ap1_padding" => F::avg_pool1d(&x3, p1(3).padding(2)),
            "ap1_stride" => F::avg_pool1d(&x3, p1(2).stride(0)),
            "ap1_small" => F::avg_pool1d(&z(&[1, 2, 2])?, p1(3)),
            "ap1_empty" => F::avg_pool1d(&z(&[1, 0, 5])?, p1(2)),
            "aap1_rank" => F::adaptive_avg_pool1d(&z(&[4])?, 2),
            "aap1_empty" => F::adaptive_avg_pool1d(&z(&[1, 2, 0])?, 2),
            "aap1_int" => F::adaptive_avg_pool1d(&zi(&[1, 2, 4], DType::I64)?, 2),
            "aap2_rank" => F::adaptive_avg_pool2d(&z(&[2, 4])?, (2, 2)),
            "aap2_empty" => F::adaptive_avg_pool2d(&z(&[1, 2, 0, 4])?, (2, 2)),
            "amp1_rank" => F::adaptive_max_pool1d(&z(&[1, 2, 3, 4])?, 2),
            "amp1_empty" => F::adaptive_max_pool1d(&z(&[1, 0, 4])?, 2),
            "amp1_int" => F::adaptive_max_pool1d(&zi(&[1, 2, 4], DType::I64)?, 2),
            "amp2_rank" => F::adaptive_max_pool2d(&z(&[1, 2, 3, 4, 4])?, (2, 2)),
            "amp2_empty" => F::adaptive_max_pool2d(&z(&[1, 2, 0, 4])?, (2, 2)),
            "amp2_u8" => F::adaptive_max_pool2d(&zi(&[1, 2, 4, 4], DType::U8)?, (2, 2)),
            "unpool_output_size" => F::max_unpool2d(&v, &i, p2, Some(&[7, 5])),
            "unpool_output_size_len" => F::max_unpool2d(&v, &i, p2, Some(&[1, 5, 5])),
            "unpool_negative" => F::max_unpool2d(&v, &i, p2.padding(5), None),
            "unpool_index_dtype" => F::max_unpool2d(&v, &i.to_dtype(DType::F64)?, p2, None),
            "unpool_rank" => F::max_unpool2d(&z(&[2, 2])?, &zi(&[2, 2], DType::I64)?, p2, None),
            "unpool_index_shape" => F::max_unpool2d(&v, &zi(&[1, 1, 2, 2], DType::I64)?, p2, None),
            "unpool_empty" => F::max_unpool2d(
                &z(&[1, 0, 2, 2])?,
                &zi(&[1, 0, 2, 2], DType::I64)?,
                p2,
                None,
            ),
            "unpool_int" => F::max_unpool2d(&v.to_dtype(DType::I64)?, &i, p2, None),
            "unpool_index_range" if dev.is_cuda() => continue,
            "unpool_index_range" => F::max_unpool2d(&v, &i.add(100)?, p2, None),
            "unfold_rank" => F::unfold(&z(&[1, 3, 5, 5, 5])?, k(2)),
            "unfold_empty" => F::unfold(&z(&[2, 0, 5, 5])?, k(2)),
            "unfold_kernel" => F::unfold(&z(&[2, 3, 5, 5])?, k(0)),
            "unfold_stride" => F::unfold(&z(&[2, 3, 5, 5])?, k(2).stride(0)),
            "unfold_dilation" => F::unfold(&z(&[2, 3, 5, 5])?, k(2).dilation(0)),
            "unfold_too_big" => F::unfold(&z(&[2, 3, 5, 5])?, k(3).dilation(3)),
            "unfold_int" => F::unfold(&zi(&[2, 3, 5, 5], DType::I64)?, k(2)),
            "fold_rank" => F::fold(&z(&[1, 12, 16, 1])?, (5, 5), k(2)),
            "fold_empty" => F::fold(&z(&[2, 12, 0])?, (5, 5), k(2)),
            "fold_channels" => F::fold(&z(&[2, 13, 16])?, (5, 5), k(2)),
            "fold_blocks" => F::fold(&z(&[2, 12, 15])?, (5, 5), k(2)),
            "fold_kernel" => F::fold(&z(&[2, 12, 16])?, (5, 5), k(0)),
            "fold_int" => F::fold(&zi(&[2, 12, 16], DType::I64)?, (5, 5), k(2)),
            other => panic!("unknown error case {other}"),
        };
        let msg = got.expect_err(name).to_string();
        assert!(msg.contains(phrase), "{name}: {msg:?} lacks {phrase:?}");
    }
    Ok(())
}

/// Unfold and fold of bools, as PyTorch's CPU kernels take them (fold's sums
/// are ORs); the shuffles of integers; empty batches and zero output sizes.
fn layers4_take_other_dtypes_and_empty_inputs(dev: &Device) -> Result<()> {
    let all = cases();
    let b = &all["layers4"]["bool"];
    let x = tensor(&b["x"], dev)?.ne(0.0)?;
    let cols = F::unfold(&x, FoldOptions::new(2).padding(1))?;
    assert_eq!(cols.dtype(), DType::Bool);
    let want = tensor(&b["unfold"], &Device::Cpu)?;
    assert_eq!(cols.shape(), want.shape());
    assert_eq!(cols.to_vec::<f64>()?, want.to_vec::<f64>()?);
    let folded = F::fold(
        &F::unfold(&x, FoldOptions::new(2))?,
        (4, 5),
        FoldOptions::new(2),
    )?;
    let want = tensor(&b["fold"], &Device::Cpu)?;
    assert_eq!(folded.dtype(), DType::Bool);
    assert_eq!(folded.to_vec::<f64>()?, want.to_vec::<f64>()?);

    let ints = Tensor::arange(0i64, 16, dev)?.reshape([1, 4, 2, 2])?;
    let up = F::pixel_shuffle(&ints, 2)?;
    assert_eq!(up.dtype(), DType::I64);
    assert_eq!(
        F::pixel_unshuffle(&up, 2)?.to_vec::<i64>()?,
        ints.to_vec::<i64>()?
    );
    assert_eq!(
        F::channel_shuffle(&ints, 2)?.to_vec::<i64>()?,
        [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15]
    );
    // an int64 average pooling truncates its means, as PyTorch's
    let ramp = Tensor::new([[1i64, 2, 4, 7, -3]], dev)?;
    let avg = F::avg_pool1d(&ramp, Pool1dOptions::new(2))?;
    assert_eq!(avg.to_vec::<i64>()?, [1, 5]);
    // max pooling with indices takes int64 (PyTorch's 2-D kernel), without
    // them not (its 1-D kernel)
    let (y, i) = F::max_pool1d_with_indices(&ramp, Pool1dOptions::new(2))?;
    assert_eq!(
        (y.to_vec::<i64>()?, i.to_vec::<i64>()?),
        (vec![2, 7], vec![1, 3])
    );
    assert!(F::max_pool1d(&ramp, Pool1dOptions::new(2)).is_err());

    let empty = Tensor::zeros([0, 2, 6], DType::F32, dev)?.requires_grad_(true)?;
    let y = F::max_pool1d(&empty, Pool1dOptions::new(2))?;
    assert_eq!(y.shape(), &[0, 2, 3]);
    let (y, i) = F::adaptive_max_pool1d_with_indices(&empty, 4)?;
    assert_eq!((y.shape(), i.shape()), (&[0, 2, 4][..], &[0, 2, 4][..]));
    y.sum_all()?.backward()?;
    assert_eq!(empty.grad().unwrap().shape(), &[0, 2, 6]);
    let x = Tensor::ones([2, 3, 5], DType::F32, dev)?.requires_grad_(true)?;
    let y = F::adaptive_avg_pool1d(&x, 0)?;
    assert_eq!(y.shape(), &[2, 3, 0]);
    let y = F::adaptive_max_pool2d(&x, (0, 2))?;
    assert_eq!(y.shape(), &[2, 0, 2]);
    let cols = F::unfold(
        &Tensor::zeros([0, 2, 4, 4], DType::F32, dev)?,
        FoldOptions::new(2),
    )?;
    assert_eq!(cols.shape(), &[0, 8, 9]);
    Ok(())
}

/// An unpooling index outside the output plane is refused with PyTorch's
/// message on the CPU, before anything is written; a NaN wins its window in
/// adaptive max pooling, its position the index.
#[test]
fn unpool_checks_its_indices_and_nan_wins() -> Result<()> {
    let cpu = Device::Cpu;
    let v = Tensor::ones([1, 1, 2, 2], DType::F32, &cpu)?;
    let i = Tensor::from_vec(vec![0i64, 3, -1, 5], [1, 1, 2, 2], &cpu)?;
    let e = F::max_unpool2d(&v, &i, Pool2dOptions::new(2), None).unwrap_err();
    assert!(e
        .to_string()
        .contains("Found an invalid max index: -1 (output volumes are of size 4x4)"));
    let x = Tensor::new([[1f32, f32::NAN, 3.0, 2.0, f32::NAN, 0.0]], &cpu)?;
    let (y, i) = F::adaptive_max_pool1d_with_indices(&x, 2)?;
    assert!(y.to_vec::<f32>()?.iter().all(|v| v.is_nan()));
    assert_eq!(i.to_vec::<i64>()?, [1, 4]);
    Ok(())
}

/// A channels-last input gives channels-last outputs (and indices) where
/// PyTorch's do, with the contiguous input's values; float16 and bfloat16
/// inputs keep their dtype, with the float32 results rounded.
fn layers4_keep_channels_last_and_half(dev: &Device) -> Result<()> {
    let cl = ember::MemoryFormat::ChannelsLast;
    let x = Tensor::arange(0f32, 384.0, dev)?
        .mul(0.37)?
        .sin()?
        .reshape([2, 8, 4, 6])?;
    let xl = x.to_memory_format(cl)?;
    type Op = fn(&Tensor) -> Result<Tensor>;
    let ops: [(&str, Op); 6] = [
        ("pixel_shuffle", |t| F::pixel_shuffle(t, 2)),
        ("pixel_unshuffle", |t| F::pixel_unshuffle(t, 2)),
        ("channel_shuffle", |t| F::channel_shuffle(t, 4)),
        ("adaptive_max_pool2d", |t| F::adaptive_max_pool2d(t, (2, 3))),
        ("adaptive_max_pool2d indices", |t| {
            Ok(F::adaptive_max_pool2d_with_indices(t, (2, 3))?.1)
        }),
        ("max_unpool2d", |t| {
            let (v, i) = t.max_pool2d_with_indices(Pool2dOptions::new(2))?;
            F::max_unpool2d(&v, &i, Pool2dOptions::new(2), None)
        }),
    ];
    for (name, op) in ops {
        let (want, got) = (op(&x)?, op(&xl)?);
        assert!(got.is_contiguous_in(cl), "{name}");
        assert!(want.is_contiguous(), "{name}");
        assert_eq!(
            got.to_dtype(DType::F64)?.to_vec::<f64>()?,
            want.to_dtype(DType::F64)?.to_vec::<f64>()?,
            "{name}"
        );
    }
    let x3 = x.reshape([2, 8, 24])?;
    type Half = fn(&Tensor) -> Result<Tensor>;
    let halves: [(&str, Half); 7] = [
        ("max_pool1d", |t| {
            F::max_pool1d(t, Pool1dOptions::new(3).stride(2))
        }),
        ("avg_pool1d", |t| {
            F::avg_pool1d(t, Pool1dOptions::new(3).padding(1))
        }),
        ("adaptive_avg_pool1d", |t| F::adaptive_avg_pool1d(t, 5)),
        ("adaptive_max_pool1d", |t| F::adaptive_max_pool1d(t, 5)),
        ("unfold", |t| {
            F::unfold(&t.reshape([2, 8, 4, 6])?, FoldOptions::new(2))
        }),
        ("fold", |t| F::fold(t, (7, 7), FoldOptions::rect(4, 2))),
        ("max_unpool2d", |t| {
            let (v, i) = t
                .unsqueeze(0)?
                .max_pool2d_with_indices(Pool2dOptions::new(2))?;
            F::max_unpool2d(&v, &i, Pool2dOptions::new(2), None)
        }),
    ];
    for (name, op) in halves {
        let want = op(&x3)?;
        for dt in [DType::F16, DType::BF16] {
            let got = op(&x3.to_dtype(dt)?.requires_grad_(true)?)?;
            assert_eq!(got.dtype(), dt, "{name}");
            let tol = if dt == DType::BF16 { 3e-2 } else { 3e-3 };
            assert!(
                got.to_dtype(DType::F32)?.allclose(&want, tol, tol)?,
                "{name} {dt:?}"
            );
            got.sum_all()?.backward()?;
        }
    }
    Ok(())
}

/// `max_pool2d_with_indices` pools once: its indices are those the pooling
/// keeps for the gradient, in every layout, with a gradient or without.
fn layers4_max_pool_with_indices_pools_once(dev: &Device) -> Result<()> {
    let x = Tensor::arange(0f32, 2.0 * 3.0 * 7.0 * 6.0, dev)?
        .mul(0.61)?
        .cos()?
        .reshape([2, 3, 7, 6])?;
    let opts = Pool2dOptions::new(3).stride(2).padding(1);
    let want = x.max_pool2d_with_indices(opts)?;
    for (t, grad) in [
        (x.clone(), false),
        (x.clone(), true),
        (x.to_memory_format(ember::MemoryFormat::ChannelsLast)?, true),
    ] {
        let t = t.requires_grad_(grad)?;
        let ((v, i), prof) = ember::profiler::profile(|| t.max_pool2d_with_indices(opts))?;
        assert_eq!(super::super::this_threads_count(&prof, "max_pool2d"), 1);
        assert_eq!(v.to_vec::<f32>()?, want.0.to_vec::<f32>()?);
        assert_eq!(i.to_vec::<i64>()?, want.1.to_vec::<i64>()?);
        assert!(!i.requires_grad());
        assert_eq!(v.requires_grad(), grad);
    }
    Ok(())
}

device_test!(
    layers4_max_pool_with_indices_pools_once,
    layers4_keep_channels_last_and_half,
    layers4_match_pytorch,
    layers4_refuse_as_pytorch,
    layers4_take_other_dtypes_and_empty_inputs,
);
