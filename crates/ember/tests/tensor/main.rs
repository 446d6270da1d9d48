//! Tensor op tests. Each op's test body takes a `&Device` and runs on the CPU and,
//! where a GPU is present, on `cuda:0` (a skipped CUDA variant passes; the binary
//! prints how many ran and skipped, and why, at exit: see `common::gpu`).

// `&[a.clone()]` reads better than `std::slice::from_ref(&a)` in the tests.
#![allow(clippy::cloned_ref_to_slice_refs)]

/// Makes `name::cpu` and `name::cuda` tests from `fn name(dev: &Device) -> Result<()>`.
macro_rules! device_test {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn cpu() -> ember::Result<()> {
                super::$name(&ember::Device::Cpu)
            }
            #[test]
            fn cuda() -> ember::Result<()> {
                match crate::gpu(concat!(stringify!($name), "::cuda")) {
                    Some(dev) => super::$name(&dev),
                    None => Ok(()),
                }
            }
        }
    )*};
}

#[path = "../common/mod.rs"]
mod common;

/// The GPU for a test of this binary ([`common::gpu`]), with float32 convolutions
/// exact from then on ([`common::exact_float32_convolutions`]): these tests compare
/// with PyTorch's and the CPU's float32 values, and every CUDA test here asks for
/// its device this way before its first GPU work, so none runs any part with TF32
/// (cuDNN's default, checked to its own tolerance in tests/cudnn.rs).
fn gpu(test: &str) -> Option<ember::Device> {
    gpu_unless(test, || None)
}

/// [`common::gpu_unless`], with float32 convolutions exact as [`gpu`] says.
fn gpu_unless(test: &str, missing: impl FnOnce() -> Option<String>) -> Option<ember::Device> {
    let dev = common::gpu_unless(test, missing)?;
    common::exact_float32_convolutions();
    Some(dev)
}

/// Asserts two float slices agree within `atol + rtol * |expected|` (NaN matches NaN).
#[track_caller]
fn assert_close(got: &[f64], want: &[f64], rtol: f64, atol: f64) {
    assert_eq!(got.len(), want.len(), "length: got {got:?}, want {want:?}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= atol + rtol * w.abs();
        assert!(
            ok,
            "element {i}: got {g}, want {w}\n got {got:?}\nwant {want:?}"
        );
    }
}

/// Tests that seed the global generator hold this so that no other test draws
/// numbers between their `manual_seed` and their draws; so do the tests that
/// draw from it unseeded (initialised layers, `randn`), which would otherwise
/// take numbers from a seeded test's sequence (a flaky failure of
/// `named_children_and_layers_for_models`, whose two equally seeded layers
/// differed).
fn rng_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Tests that profile hold this (before [`rng_lock`] where they hold both): the
/// profiler allows one session at a time, and records every thread.
fn profile_turn() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock().unwrap_or_else(|p| p.into_inner())
}

/// The records of the calling thread (the test's: other tests' work beside it
/// is recorded too).
fn mine(p: &ember::profiler::Profile) -> ember::profiler::Profile {
    let me = std::thread::current().name().map(str::to_owned);
    assert!(me.is_some(), "a test thread has a name");
    p.filter_threads(|_, name| me.as_deref() == Some(name))
}

/// How many ops named `op` this thread recorded in `profile`.
fn this_threads_count(profile: &ember::profiler::Profile, op: &str) -> usize {
    mine(profile)
        .key_averages()
        .get_kind(op, ember::profiler::EventKind::Op)
        .map_or(0, |r| r.count)
}

/// The values of `t` as f64, row-major.
/// `r` once its device has finished it: a GPU checks indices on the device and
/// reports a bad one at the next wait, which this is (a no-op on the CPU).
fn synced(r: ember::Result<ember::Tensor>) -> ember::Result<ember::Tensor> {
    let t = r?;
    ember::cuda::synchronize(&t.device())?;
    Ok(t)
}

/// A golden file of `tests/golden/`, parsed.
fn golden(file: &str) -> serde_json::Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// A recorded tensor (`shape`, `dtype`, `values`; a float as a number, `null`
/// for NaN, or "inf" / "-inf") made on `dev`.
fn golden_tensor(v: &serde_json::Value, dev: &ember::Device) -> ember::Result<ember::Tensor> {
    use ember::{DType, Tensor};
    let shape: Vec<usize> = v["shape"]
        .as_array()
        .expect("a shape")
        .iter()
        .map(|d| d.as_u64().expect("a dim") as usize)
        .collect();
    let vals = v["values"].as_array().expect("values");
    let float = |x: &serde_json::Value| match x.as_str() {
        Some("inf") => f64::INFINITY,
        Some("-inf") => f64::NEG_INFINITY,
        _ => x.as_f64().unwrap_or(f64::NAN),
    };
    match v["dtype"].as_str().expect("a dtype") {
        "int64" => {
            let x: Vec<i64> = vals.iter().map(|x| x.as_i64().expect("an int")).collect();
            Tensor::from_vec(x, shape, dev)
        }
        "uint8" => {
            let x: Vec<u8> = vals
                .iter()
                .map(|x| x.as_u64().expect("a byte") as u8)
                .collect();
            Tensor::from_vec(x, shape, dev)
        }
        "bool" => {
            let x: Vec<bool> = vals.iter().map(|x| x.as_bool().expect("a bool")).collect();
            Tensor::from_vec(x, shape, dev)
        }
        d => {
            let dt = match d {
                "float32" => DType::F32,
                "float64" => DType::F64,
                "bfloat16" => DType::BF16,
                "float16" => DType::F16,
                other => panic!("golden dtype {other}"),
            };
            let x: Vec<f64> = vals.iter().map(float).collect();
            Tensor::from_vec(x, shape, dev)?.to_dtype(dt)
        }
    }
}

fn vals(t: &ember::Tensor) -> Vec<f64> {
    t.to_vec::<f64>().expect("to_vec")
}

/// Each element's float64 bit pattern (exact for every float dtype), NaN as one
/// value: for comparing results bit for bit.
fn bits(t: &ember::Tensor) -> ember::Result<Vec<u64>> {
    Ok(t.to_dtype(ember::DType::F64)?
        .to_vec::<f64>()?
        .iter()
        .map(|v| if v.is_nan() { u64::MAX } else { v.to_bits() })
        .collect())
}

mod activation_checkpoint;
mod advanced_index;
mod amp;
mod autograd;
mod autograd_grad;
mod conv3d;
mod counting;
mod creation;
mod cuda;
mod data;
mod decompositions;
mod distributed;
mod double_backward;
mod double_backward_layers;
mod double_backward_linalg;
mod elementwise;
mod errors;
mod format;
mod io;
mod linalg;
mod math_more;
mod more_ops;
mod nn;
mod padding_mode;
mod pointwise_ops;
mod profiler;
mod props;
mod pt;
mod random_fill;
mod reduce;
mod reshaping;
mod thin;
mod train;
mod views;
