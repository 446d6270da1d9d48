//! Convolutions through cuDNN against the CPU's, forward and backward. The cuDNN
//! switch is global, so these tests have a process of their own and take turns.
//! Without a GPU they say so and pass; on ember's simulator a reference with
//! cuDNN's contract stands in for the library.

mod common;
#[path = "common/training.rs"]
mod training;

use ember::cuda::cudnn;
use ember::nn::{self, Module};
use ember::prelude::*;

/// One test's turn with the global switches: they are put back as they were when
/// the turn ends (a failed test's too), so each test starts from the process's
/// settings (`EMBER_CUDNN`, `EMBER_CUDNN_TF32`, `EMBER_CUDNN_BENCHMARK`,
/// `EMBER_CUDNN_DETERMINISTIC` or the defaults).
struct Turn {
    _lock: std::sync::MutexGuard<'static, ()>,
    enabled: bool,
    benchmark: bool,
    deterministic: bool,
    tf32: bool,
    limit: usize,
    attention: bool,
    graph: bool,
}

impl Drop for Turn {
    fn drop(&mut self) {
        cudnn::set_enabled(self.enabled);
        cudnn::set_benchmark(self.benchmark);
        cudnn::set_deterministic(self.deterministic);
        cudnn::set_allow_tf32(self.tf32);
        cudnn::set_workspace_limit(self.limit).expect("a limit that was set before");
        cudnn::set_attention(self.attention);
        cudnn::set_graph_api(self.graph);
    }
}

fn turn() -> Turn {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let lock = TURN.lock().unwrap_or_else(|p| p.into_inner());
    Turn {
        _lock: lock,
        enabled: cudnn::enabled(),
        benchmark: cudnn::benchmark(),
        deterministic: cudnn::deterministic(),
        tf32: cudnn::allow_tf32(),
        limit: cudnn::workspace_limit(),
        attention: cudnn::attention(),
        graph: cudnn::graph_api(),
    }
}

/// The GPU when cuDNN can be used there, or `None` after saying why not.
fn cudnn_gpu(test: &str) -> Option<Device> {
    common::gpu_unless(test, || {
        (!cudnn::is_available()).then(|| {
            format!(
                "cuDNN is not available: {}",
                cudnn::unavailable_reason().unwrap_or_default()
            )
        })
    })
}

/// Output, input gradient, weight gradient and bias gradient of
/// `sum(conv2d(x, w, b) * r)` on `dev`, brought back to the CPU.
fn conv_and_grads(
    dev: &Device,
    (x, w, b, r): (&Tensor, &Tensor, &Tensor, &Tensor),
    opts: Conv2dOptions,
) -> Result<Vec<Tensor>> {
    // fresh leaves on `dev` (`to` returns the tensor itself on its own device)
    let x = x.detach().to(dev)?.requires_grad_(true)?;
    let w = w.detach().to(dev)?.requires_grad_(true)?;
    let b = b.detach().to(dev)?.requires_grad_(true)?;
    let y = x.conv2d(&w, Some(&b), opts)?;
    y.mul(&r.to(dev)?)?.sum_all()?.backward()?;
    let grad = |t: &Tensor, name: &str| {
        t.grad()
            .unwrap_or_else(|| panic!("no gradient for {name} on {dev}"))
            .cpu()
    };
    Ok(vec![
        y.detach().cpu()?,
        grad(&x, "x")?,
        grad(&w, "w")?,
        grad(&b, "b")?,
    ])
}

#[test]
fn cudnn_convolutions_match_the_cpu() -> Result<()> {
    let _turn = turn();
    let Some(dev) = cudnn_gpu("cudnn_convolutions_match_the_cpu") else {
        return Ok(());
    };
    let cpu = Device::Cpu;
    let opts = Conv2dOptions::default;
    // (input, weight, options): plain, strided and padded, dilated, grouped,
    // depthwise, 1x1, rectangular
    let cases: Vec<([usize; 4], [usize; 4], Conv2dOptions)> = vec![
        ([2, 3, 7, 6], [4, 3, 3, 3], opts()),
        ([2, 3, 9, 8], [5, 3, 3, 3], opts().stride(2).padding(1)),
        ([1, 2, 9, 9], [3, 2, 3, 3], opts().dilation(2).padding(2)),
        ([2, 4, 6, 5], [6, 2, 3, 3], opts().groups(2).padding(1)),
        ([1, 4, 6, 6], [4, 1, 3, 3], opts().groups(4)),
        ([3, 5, 4, 4], [2, 5, 1, 1], opts()),
        (
            [2, 2, 8, 7],
            [3, 2, 2, 3],
            Conv2dOptions {
                stride: (2, 1),
                padding: (0, 1),
                dilation: (1, 2),
                groups: 1,
            },
        ),
    ];
    cudnn::set_enabled(true);
    let (before, graph_before) = (cudnn::convolutions(), cudnn::graph_convolutions());
    ember::manual_seed(5);
    // float32 in FMA math (TF32 off) to float32's tolerance, then with TF32 (the
    // default, as PyTorch's) to TF32's: inputs rounded to 10 bits of mantissa,
    // about 1e-3 of the values' scale; float16 and bfloat16 in their own dtype
    // (float32 accumulation; the CPU's convolves them in float32 and rounds once,
    // cuDNN may round partial sums too)
    // and, timed (`set_benchmark`), float32 with TF32 and bfloat16: each shape's
    // algorithms are those cuDNN's search found fastest on the GPU
    let configs = [
        (DType::F32, false, false),
        (DType::F32, true, false),
        (DType::F64, false, false),
        (DType::F16, true, false),
        (DType::BF16, true, false),
        (DType::F32, true, true),
        (DType::BF16, true, true),
    ];
    // each through cuDNN's legacy calls, then through its graph API
    let rounds = [false, true];
    for (graph, (dtype, tf32, timed)) in rounds
        .iter()
        .flat_map(|&g| configs.iter().map(move |&c| (g, c)))
    {
        cudnn::set_graph_api(graph);
        cudnn::set_allow_tf32(tf32);
        cudnn::set_benchmark(timed);
        let graph_start = cudnn::graph_convolutions();
        // (bf16 is bounded by its terms' magnitudes, below)
        let tol = match (dtype, tf32) {
            (DType::F64, _) => 1e-10,
            (DType::F16, _) => 2e-3,
            (_, false) => 1e-4,
            (_, true) => 2e-2,
        };
        for (xs, ws, o) in &cases {
            let x = Tensor::randn(*xs, &cpu)?.to_dtype(dtype)?;
            let w = Tensor::randn(*ws, &cpu)?.to_dtype(dtype)?;
            let b = Tensor::randn([ws[0]], &cpu)?.to_dtype(dtype)?;
            let y_shape = x.conv2d(&w, None, *o)?.shape().to_vec();
            let r = Tensor::randn(y_shape, &cpu)?.to_dtype(dtype)?;
            let want = conv_and_grads(&cpu, (&x, &w, &b, &r), *o)?;
            let got = conv_and_grads(&dev, (&x, &w, &b, &r), *o)?;
            // the same sums of the operands' magnitudes (float64, on the CPU)
            let abs = |t: &Tensor| t.to_dtype(DType::F64)?.abs();
            let terms = conv_and_grads(&cpu, (&abs(&x)?, &abs(&w)?, &abs(&b)?, &abs(&r)?), *o)?;
            for (what, ((g, e), t)) in ["output", "input grad", "weight grad", "bias grad"]
                .iter()
                .zip(got.iter().zip(&want).zip(&terms))
            {
                assert_eq!(g.shape(), e.shape(), "{what} of {xs:?} * {ws:?} {o:?}");
                assert_eq!(g.dtype(), dtype, "{what} of {xs:?} * {ws:?} {o:?}");
                if dtype == DType::BF16 {
                    // bf16 may round partial sums in its own dtype (cuDNN's backward
                    // did on an H200, where f16 kept within 2e-3): the result's
                    // rounding and two of sums at most as large as the terms'
                    // magnitudes summed (bf16's unit roundoff 2^-8)
                    let f64s = |t: &Tensor| t.to_dtype(DType::F64)?.flatten_all()?.to_vec::<f64>();
                    let what = format!("{what} of {xs:?} * {ws:?} {o:?} ({dtype})");
                    common::assert_within_terms(
                        &f64s(g)?,
                        &f64s(e)?,
                        &f64s(t)?,
                        1.0 / 256.0,
                        &what,
                    );
                } else {
                    assert!(
                        g.allclose(e, tol, tol)?,
                        "{what} of {xs:?} * {ws:?} {o:?} ({dtype}): max difference {}",
                        g.max_abs_diff(e)?
                    );
                }
            }
        }
        // on a GPU each pass of the second round went through the graph API
        // (float64 may take the legacy calls: cuDNN's graph API lacks some of
        // its engines); the simulator's stand-in has no graph API
        if graph && !ember::cuda::is_simulated() && dtype != DType::F64 {
            assert_eq!(
                cudnn::graph_convolutions() - graph_start,
                3 * cases.len() as u64,
                "{dtype}, TF32 {tf32}, timed {timed}: passes through the graph API"
            );
        }
    }
    cudnn::set_allow_tf32(true);
    cudnn::set_benchmark(false);
    cudnn::set_graph_api(false);
    // every case ran its three passes through cuDNN, the half ones too (in their
    // own dtype: nothing fell back to float32)
    let passes = (configs.len() * 3 * cases.len()) as u64;
    assert_eq!(cudnn::convolutions() - before, rounds.len() as u64 * passes);
    if ember::cuda::is_simulated() {
        assert_eq!(cudnn::graph_convolutions(), graph_before);
    }

    // half precision convolves in f32 and rounds once
    let x = Tensor::randn([2, 3, 6, 6], &cpu)?;
    let w = Tensor::randn([4, 3, 3, 3], &cpu)?;
    let want = x.conv2d(&w, None, opts())?;
    for dt in [DType::F16, DType::BF16] {
        let (xh, wh) = (x.to_dtype(dt)?.to(&dev)?, w.to_dtype(dt)?.to(&dev)?);
        let got = xh.conv2d(&wh, None, opts())?;
        assert_eq!(got.dtype(), dt);
        let d = got.cpu()?.max_abs_diff(&want)?;
        assert!(d < 0.1, "{dt}: max difference {d}");
    }
    Ok(())
}

/// Channels-last operands go to cuDNN's NHWC kernels as they lie (every pass
/// counted as channels-last), with the CPU's values and PyTorch's layouts: the
/// output and the input's gradient channels-last, each leaf's gradient in its own
/// layout. A row-major weight beside a channels-last input is laid out for the
/// call; float64 stays row-major on GPUs, as PyTorch keeps it.
#[test]
fn channels_last_convolutions_run_nhwc() -> Result<()> {
    use ember::MemoryFormat::ChannelsLast as CL;
    let _turn = turn();
    let Some(dev) = cudnn_gpu("channels_last_convolutions_run_nhwc") else {
        return Ok(());
    };
    let cpu = Device::Cpu;
    let opts = Conv2dOptions::default;
    let cases: Vec<([usize; 4], [usize; 4], Conv2dOptions, bool)> = vec![
        ([2, 3, 7, 6], [4, 3, 3, 3], opts().padding(1), true),
        ([2, 4, 9, 8], [6, 2, 3, 3], opts().stride(2).groups(2), true),
        ([3, 5, 4, 4], [2, 5, 1, 1], opts(), false),
    ];
    cudnn::set_enabled(true);
    cudnn::set_allow_tf32(false);
    ember::manual_seed(6);
    // through cuDNN's legacy calls, then its graph API (NHWC tensors, KRSC filters)
    let dtypes = [
        (DType::F32, 1e-4),
        (DType::F16, 2e-3),
        (DType::BF16, 1e-2),
        (DType::F64, 1e-10),
    ];
    for (graph, (dtype, tol)) in [false, true]
        .into_iter()
        .flat_map(|g| dtypes.into_iter().map(move |d| (g, d)))
    {
        cudnn::set_graph_api(graph);
        for (xs, ws, o, weight_cl) in &cases {
            let x = Tensor::randn(*xs, &cpu)?
                .to_dtype(dtype)?
                .to_memory_format(CL)?;
            let mut w = Tensor::randn(*ws, &cpu)?.to_dtype(dtype)?;
            if *weight_cl {
                w = w.to_memory_format(CL)?;
            }
            let b = Tensor::randn([ws[0]], &cpu)?.to_dtype(dtype)?;
            let y_shape = x.conv2d(&w, None, *o)?.shape().to_vec();
            let r = Tensor::randn(y_shape, &cpu)?.to_dtype(dtype)?;
            let (passes, nhwc) = (cudnn::convolutions(), cudnn::channels_last_convolutions());
            let graph_passes = cudnn::graph_convolutions();
            let run = |dev: &Device| -> Result<Vec<Tensor>> {
                let xl = x.detach().to(dev)?.requires_grad_(true)?;
                let wl = w.detach().to(dev)?.requires_grad_(true)?;
                let bl = b.detach().to(dev)?.requires_grad_(true)?;
                let y = xl.conv2d(&wl, Some(&bl), *o)?;
                y.mul(&r.to(dev)?)?.sum_all()?.backward()?;
                Ok(vec![y, xl.grad().unwrap(), wl.grad().unwrap()])
            };
            let (want, got) = (run(&cpu)?, run(&dev)?);
            let what = format!("{xs:?} * {ws:?} {o:?} in {dtype}, graph API {graph}");
            assert_eq!(cudnn::convolutions() - passes, 3, "{what}");
            // (float64 is row-major here; the simulator has no graph API)
            if graph && dtype != DType::F64 && !ember::cuda::is_simulated() {
                assert_eq!(cudnn::graph_convolutions() - graph_passes, 3, "{what}");
            }
            let expect_nhwc = if dtype == DType::F64 { 0 } else { 3 };
            assert_eq!(
                cudnn::channels_last_convolutions() - nhwc,
                expect_nhwc,
                "{what}"
            );
            for (k, (g, e)) in got.iter().zip(&want).enumerate() {
                let g_cpu = g.cpu()?;
                assert!(
                    g_cpu.allclose(e, tol, tol)?,
                    "{what}: tensor {k}: max difference {}",
                    g_cpu.max_abs_diff(e)?
                );
                // float64's output on a GPU is row-major (PyTorch's rule); each
                // leaf's gradient takes the leaf's layout
                let strides_as_cpu = !(dtype == DType::F64 && k == 0);
                assert_eq!(
                    g.stride() == e.stride(),
                    strides_as_cpu,
                    "{what}: tensor {k} strides"
                );
            }
            assert!(
                got[0].is_contiguous_in(CL) != (dtype == DType::F64),
                "{what}"
            );
        }
    }
    cudnn::set_allow_tf32(true);
    cudnn::set_graph_api(false);
    Ok(())
}

#[test]
fn empty_batches_and_the_switch() -> Result<()> {
    let _turn = turn();
    let Some(dev) = cudnn_gpu("empty_batches_and_the_switch") else {
        return Ok(());
    };
    let w = Tensor::ones([4, 3, 3, 3], DType::F32, &dev)?;
    cudnn::set_enabled(true);
    assert!(cudnn::enabled());
    // cuDNN refuses empty tensors: an empty batch takes ember's own path
    let before = cudnn::convolutions();
    let x = Tensor::zeros([0, 3, 5, 5], DType::F32, &dev)?;
    let y = x.conv2d(&w, None, Conv2dOptions::default())?;
    assert_eq!(y.shape(), &[0, 4, 3, 3]);
    // ... and so do zero input channels: the output is all zeros
    let x0 = Tensor::zeros([1, 0, 5, 5], DType::F32, &dev)?;
    let w0 = Tensor::zeros([4, 0, 3, 3], DType::F32, &dev)?;
    let y0 = x0.conv2d(&w0, None, Conv2dOptions::default())?;
    assert_eq!(y0.to_vec::<f32>()?, vec![0.0; 4 * 3 * 3]);
    assert_eq!(cudnn::convolutions(), before);
    // switched off, convolutions do not reach cuDNN
    cudnn::set_enabled(false);
    assert!(!cudnn::enabled());
    let x = Tensor::ones([1, 3, 5, 5], DType::F32, &dev)?;
    let y = x.conv2d(&w, None, Conv2dOptions::default())?;
    assert_eq!(y.to_vec::<f32>()?, vec![27.0; 4 * 3 * 3]);
    assert_eq!(cudnn::convolutions(), before);
    cudnn::set_enabled(true);
    Ok(())
}

/// The switches' defaults are PyTorch's: convolutions through cuDNN where it loads
/// (unless `EMBER_CUDNN=0`), TF32 allowed (unless `EMBER_CUDNN_TF32=0`),
/// algorithms from its heuristics rather than timed (unless
/// `EMBER_CUDNN_BENCHMARK=1`), nondeterministic ones allowed (unless
/// `EMBER_CUDNN_DETERMINISTIC=1`); each pass's workspace at most 512 MiB.
#[test]
fn the_switches_default_as_pytorchs() {
    let _turn = turn();
    let env = |name: &str| std::env::var(name).ok().map(|v| v.trim().to_string());
    let off = |name| env(name).is_some_and(|v| matches!(v.as_str(), "0" | "false" | "off"));
    let on = |name| env(name).is_some_and(|v| matches!(v.as_str(), "1" | "true" | "on"));
    assert_eq!(cudnn::enabled(), !off("EMBER_CUDNN"));
    assert_eq!(cudnn::allow_tf32(), !off("EMBER_CUDNN_TF32"));
    assert_eq!(cudnn::benchmark(), on("EMBER_CUDNN_BENCHMARK"));
    assert_eq!(cudnn::deterministic(), on("EMBER_CUDNN_DETERMINISTIC"));
    assert_eq!(cudnn::workspace_limit(), 512 << 20);
    // ember's own choice: off until measured against its kernels on a GPU
    assert_eq!(cudnn::attention(), on("EMBER_CUDNN_ATTENTION"));
}

/// With `set_deterministic(true)` a convolution's three passes give the same bits
/// on every run, heuristic or timed, and the CPU's values. On a GPU this can fail:
/// some of cuDNN's backward algorithms add with atomics in an order that varies.
/// The simulator's stand-in has no such algorithm, so there it checks the values
/// and that every run goes through cuDNN.
#[test]
fn deterministic_convolutions_repeat_bit_for_bit() -> Result<()> {
    let _turn = turn();
    let Some(dev) = cudnn_gpu("deterministic_convolutions_repeat_bit_for_bit") else {
        return Ok(());
    };
    let cpu = Device::Cpu;
    cudnn::set_enabled(true);
    cudnn::set_deterministic(true);
    ember::manual_seed(8);
    // a weight gradient summed over 4 · 16 · 16 positions per element
    let (xs, ws) = ([4, 8, 16, 16], [16, 8, 3, 3]);
    let o = Conv2dOptions::default().padding(1);
    let bits = |ts: &[Tensor]| -> Result<Vec<Vec<f32>>> {
        ts.iter()
            .map(|t| t.to_dtype(DType::F32)?.to_vec::<f32>())
            .collect()
    };
    for (dtype, timed, tol) in [
        (DType::F32, false, 2e-2),
        (DType::BF16, false, 2e-2),
        (DType::F32, true, 2e-2),
    ] {
        cudnn::set_benchmark(timed);
        let x = Tensor::randn(xs, &cpu)?.to_dtype(dtype)?;
        let w = Tensor::randn(ws, &cpu)?.to_dtype(dtype)?;
        let b = Tensor::randn([ws[0]], &cpu)?.to_dtype(dtype)?;
        let r = Tensor::randn([xs[0], ws[0], xs[2], xs[3]], &cpu)?.to_dtype(dtype)?;
        let passes = cudnn::convolutions();
        let first = conv_and_grads(&dev, (&x, &w, &b, &r), o)?;
        for run in 1..4 {
            let again = conv_and_grads(&dev, (&x, &w, &b, &r), o)?;
            assert!(
                bits(&again)? == bits(&first)?,
                "{dtype}, timed {timed}: run {run} differs from the first"
            );
        }
        assert_eq!(cudnn::convolutions() - passes, 4 * 3, "{dtype}");
        let want = conv_and_grads(&cpu, (&x, &w, &b, &r), o)?;
        for (k, (g, e)) in first.iter().zip(&want).enumerate() {
            let (g, e) = (g.to_dtype(DType::F32)?, e.to_dtype(DType::F32)?);
            // relative to the result's scale
            let scale = e.abs()?.max_all()?.item::<f32>()? as f64;
            let d = g.max_abs_diff(&e)?;
            assert!(
                d <= tol * scale,
                "{dtype}: result {k}: max difference {d} of {scale}"
            );
        }
    }
    Ok(())
}

/// Each cuDNN pass takes the larger of the batch's im2col patch size and three
/// times its input and output, at most the workspace limit, from the caching
/// allocator: the device's peak over a forward pass is
/// the output plus that, as the meta device's estimate says, and a small limit
/// still finds algorithms (cuDNN's implicit-GEMM ones need none) with the CPU's
/// values. A limit of 0 is refused and changes nothing.
#[test]
fn the_workspace_limit_bounds_each_pass() -> Result<()> {
    let _turn = turn();
    let err = cudnn::set_workspace_limit(0).unwrap_err().to_string();
    assert!(err.contains("workspace limit of 0"), "{err}");
    assert_eq!(cudnn::workspace_limit(), 512 << 20);
    let Some(dev) = cudnn_gpu("the_workspace_limit_bounds_each_pass") else {
        return Ok(());
    };
    if std::env::var_os("EMBER_CUDA_NO_CACHING").is_some() {
        eprintln!(
            "skipped the_workspace_limit_bounds_each_pass: EMBER_CUDA_NO_CACHING is set, \
             and the comparison is of the caching allocator"
        );
        return Ok(());
    }
    cudnn::set_enabled(true);
    // a test of memory: float32's own math, so that the values compare tightly
    cudnn::set_allow_tf32(false);
    ember::manual_seed(9);
    let cpu = Device::Cpu;
    // [2, 4, 16, 16] * [8, 4, 1, 1]: the input 8 KiB, the output 16 KiB, the
    // patches 2 · 4 · 256 · 4 bytes = 8 KiB, so the workspace is three times input
    // and output, 72 KiB (all whole blocks of the allocator)
    let x = Tensor::randn([2, 4, 16, 16], &cpu)?;
    let w = Tensor::randn([8, 4, 1, 1], &cpu)?;
    let opts = Conv2dOptions::default();
    let want = x.conv2d(&w, None, opts)?;
    let (out, workspace) = (16 << 10, 72 << 10);
    for limit in [512 << 20, 8 << 10] {
        cudnn::set_workspace_limit(limit)?;
        // the meta device's peak above its start
        let peak = std::sync::Arc::new(common::MetaPeak::default());
        let (xm, wm) = (x.to(&Device::Meta)?, w.to(&Device::Meta)?);
        ember::meta::with_hook(peak.clone(), || xm.conv2d(&wm, None, opts))?;
        let estimated = peak.top() as usize;
        // the device's
        let (xd, wd) = (x.to(&dev)?, w.to(&dev)?);
        ember::cuda::synchronize(&dev)?;
        let base = ember::cuda::memory_allocated(&dev)?;
        ember::cuda::reset_peak_memory_stats(&dev)?;
        let passes = cudnn::convolutions();
        let got = xd.conv2d(&wd, None, opts)?;
        ember::cuda::synchronize(&dev)?;
        let measured = ember::cuda::max_memory_allocated(&dev)? - base;
        assert_eq!(cudnn::convolutions() - passes, 1);
        let expected = out + usize::min(limit, workspace);
        assert_eq!((estimated, measured), (expected, expected), "limit {limit}");
        let d = got.cpu()?.max_abs_diff(&want)?;
        assert!(d < 2e-2, "limit {limit}: max difference {d}");
    }
    cudnn::set_workspace_limit(512 << 20)?;
    Ok(())
}

#[test]
fn tf32_is_on_by_default_for_convolutions_only() {
    let _turn = turn();
    // PyTorch's defaults: torch.backends.cudnn.allow_tf32 is True,
    // torch.backends.cuda.matmul.allow_tf32 False
    let off =
        std::env::var("EMBER_CUDNN_TF32").is_ok_and(|v| matches!(v.trim(), "0" | "false" | "off"));
    assert_eq!(cudnn::allow_tf32(), !off);
    assert!(!ember::cuda::allow_tf32());
    cudnn::set_allow_tf32(false);
    assert!(!cudnn::allow_tf32() && !ember::cuda::allow_tf32());
    cudnn::set_allow_tf32(true);
    assert!(cudnn::allow_tf32() && !ember::cuda::allow_tf32());
}

#[test]
fn missing_cudnn_is_reported() {
    let _turn = turn();
    match cudnn::unavailable_reason() {
        // this machine has cuDNN: nothing to report
        None => assert!(cudnn::version().is_some_and(|v| v / 10000 == 9)),
        Some(reason) => {
            assert!(cudnn::version().is_none());
            // not found: the message names the library and how to get it
            let ok = if reason.starts_with("the CUDA library") {
                reason.contains("libcudnn.so.9") && reason.contains("nvidia-cudnn-cu13")
            } else {
                reason.contains("cuDNN") || reason.contains("EMBER_DISABLE_CUDA")
            };
            assert!(ok, "{reason}");
        }
    }
}

/// `(out, dq, dk, dv)` of `sum(attention(q, k, v) * up)` over fresh leaves made
/// from `qkv`, on `path`.
fn attention_and_grads(
    path: ember::nn::functional::AttentionPath,
    qkv: &[Tensor; 3],
    causal: bool,
    up: &Tensor,
) -> Result<Vec<Tensor>> {
    let leaves: Vec<Tensor> = qkv
        .iter()
        .map(|t| t.detach().requires_grad_(true))
        .collect::<Result<_>>()?;
    let out = ember::nn::functional::with_attention_path(path, || {
        nn::scaled_dot_product_attention(
            &leaves[0], &leaves[1], &leaves[2], None, 0.0, causal, None,
        )
    })?;
    out.mul(up)?.sum_all()?.backward()?;
    let mut v = vec![out.detach()];
    v.extend(leaves.iter().map(|t| t.grad().expect("a gradient")));
    Ok(v)
}

/// The largest difference between `got` and `want`, over `want`'s largest
/// magnitude (half-precision attention rounds its weights once: errors scale
/// with the values, not elementwise).
fn scaled_error(got: &Tensor, want: &Tensor) -> Result<f64> {
    let g = got
        .to_dtype(DType::F64)?
        .cpu()?
        .flatten_all()?
        .to_vec::<f64>()?;
    let w = want
        .to_dtype(DType::F64)?
        .cpu()?
        .flatten_all()?
        .to_vec::<f64>()?;
    let scale = w.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let err = g
        .iter()
        .zip(&w)
        .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
    Ok(if g.iter().any(|x| x.is_nan()) {
        f64::NAN
    } else {
        err / scale.max(f64::MIN_POSITIVE)
    })
}

/// f16/bf16 attention through cuDNN's fused engines
/// (`cudnn::set_attention(true)`) against the plain path in float32 on the same
/// rounded values, forward and the three gradients: causal or not, as many
/// queries as keys or not (lengths that end mid-tile), head dims 16 to 128,
/// operands apart (transposed views) or slices of one packed `[B, T, 3, H, d]`
/// projection. Each call must run on cuDNN (two passes: forward and backward).
/// On a GPU this checks cuDNN's engines; on ember's simulator, the calls ember
/// makes (addresses, strides, workspace) against a stand-in with the graphs'
/// contract.
#[test]
fn cudnn_attention_matches_the_plain_path() -> Result<()> {
    use ember::nn::functional::AttentionPath;
    let Some(dev) = cudnn_gpu("cudnn_attention_matches_the_plain_path") else {
        return Ok(());
    };
    let _turn = turn();
    ember::manual_seed(17);
    for &(b, h, l, s, d, packed) in &[
        (2, 3, 70, 70, 64, false),
        (1, 2, 45, 77, 16, false),
        (2, 1, 80, 33, 96, false),
        (1, 2, 66, 66, 128, true),
        (2, 2, 40, 40, 64, true),
        // keys a multiple of 128: no padding mask in cuDNN's backward graph
        // (the key counts above get one up to cuDNN 9.15, SdpaGeom::padding_mask)
        (1, 2, 100, 256, 64, false),
        (1, 2, 128, 128, 32, true),
    ] {
        let base = [
            Tensor::randn([b, l, h, d], &dev)?,
            Tensor::randn([b, s, h, d], &dev)?,
            Tensor::randn([b, s, h, d], &dev)?,
        ];
        let up = Tensor::randn([b, h, l, d], &dev)?;
        for causal in [false, true] {
            for dt in [DType::BF16, DType::F16] {
                let what = format!(
                    "{dt} [{b}, {h}, {l}, {d}] x {s} keys, causal {causal}, packed {packed}"
                );
                // [B, H, T, d] views of `[B, T, H, d]` tensors, or of one packed projection
                let qkv: [Tensor; 3] = if packed {
                    let p = Tensor::stack(&[&base[0], &base[1], &base[2]], 2)?
                        .to_dtype(dt)?
                        .contiguous()?;
                    [0, 1, 2].map(|i| {
                        p.select(2, i)
                            .and_then(|t| t.transpose(1, 2))
                            .expect("a view")
                    })
                } else {
                    let cast = |t: &Tensor| t.to_dtype(dt).and_then(|t| t.transpose(1, 2));
                    [cast(&base[0])?, cast(&base[1])?, cast(&base[2])?]
                };
                let exact = [0, 1, 2].map(|i| qkv[i].to_dtype(DType::F32).expect("a cast"));
                cudnn::set_attention(false);
                let want = attention_and_grads(AttentionPath::Math, &exact, causal, &up)?;
                cudnn::set_attention(true);
                let before = cudnn::attention_passes();
                let got =
                    attention_and_grads(AttentionPath::Auto, &qkv, causal, &up.to_dtype(dt)?)?;
                cudnn::set_attention(false);
                assert_eq!(
                    cudnn::attention_passes() - before,
                    2,
                    "{what}: cuDNN's passes"
                );
                let tol = if dt == DType::BF16 { 2e-2 } else { 4e-3 };
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(g.dtype(), dt, "{what}: result {i}");
                    assert_eq!(g.shape(), w.shape(), "{what}: result {i}");
                    let err = scaled_error(g, w)?;
                    assert!(
                        err <= tol,
                        "{what}: result {i} differs by {err} of its scale"
                    );
                }
            }
        }
    }
    Ok(())
}

/// Calls cuDNN's attention does not take keep ember's kernels with the switch
/// on: float32, a bias (an explicit mask), dropout, and any call while
/// deterministic algorithms are asked for (cuDNN's backward adds with atomics).
#[test]
fn attention_cudnn_does_not_take_runs_embers_kernels() -> Result<()> {
    let Some(dev) = cudnn_gpu("attention_cudnn_does_not_take_runs_embers_kernels") else {
        return Ok(());
    };
    let _turn = turn();
    cudnn::set_attention(true);
    let t = |dt: DType| Tensor::randn([1, 2, 24, 64], &dev).and_then(|t| t.to_dtype(dt));
    let sdpa = |dt, mask: Option<&Tensor>, dropout| -> Result<Tensor> {
        let (q, k, v) = (t(dt)?, t(dt)?, t(dt)?);
        nn::scaled_dot_product_attention(&q, &k, &v, mask, dropout, mask.is_none(), None)
    };
    let before = cudnn::attention_passes();
    sdpa(DType::F32, None, 0.0)?;
    let mask = Tensor::ones([24, 24], DType::Bool, &dev)?.tril(0)?;
    sdpa(DType::BF16, Some(&mask), 0.0)?;
    sdpa(DType::BF16, None, 0.25)?;
    cudnn::set_deterministic(true);
    sdpa(DType::BF16, None, 0.0)?;
    cudnn::set_deterministic(false);
    ember::cuda::synchronize(&dev)?;
    assert_eq!(cudnn::attention_passes(), before, "no call went to cuDNN");
    // and one it takes does
    sdpa(DType::BF16, None, 0.0)?;
    assert_eq!(cudnn::attention_passes(), before + 1);
    Ok(())
}

/// A forward on one path and its backward on the other (the switch changed in
/// between) agree with both on one path: cuDNN's log-sum-exps and ember's
/// kernels' are the same (natural log of each row's sum of exponentials of the
/// scaled scores, float32), so either backward can follow either forward.
#[test]
fn cudnn_and_embers_attention_passes_mix() -> Result<()> {
    let Some(dev) = cudnn_gpu("cudnn_and_embers_attention_passes_mix") else {
        return Ok(());
    };
    let _turn = turn();
    ember::manual_seed(23);
    let (b, h, l, d) = (2, 3, 50, 64);
    let dt = DType::BF16;
    let base: Vec<Tensor> = (0..3)
        .map(|_| Tensor::randn([b, h, l, d], &dev)?.to_dtype(dt))
        .collect::<Result<_>>()?;
    let up = Tensor::randn([b, h, l, d], &dev)?.to_dtype(dt)?;
    // (forward on cuDNN, backward on cuDNN)
    let run = |forward: bool, backward: bool| -> Result<Vec<Tensor>> {
        let leaves: Vec<Tensor> = base
            .iter()
            .map(|t| t.detach().requires_grad_(true))
            .collect::<Result<_>>()?;
        cudnn::set_attention(forward);
        let out = nn::scaled_dot_product_attention(
            &leaves[0], &leaves[1], &leaves[2], None, 0.0, true, None,
        )?;
        cudnn::set_attention(backward);
        out.mul(&up)?.sum_all()?.backward()?;
        cudnn::set_attention(false);
        let mut v = vec![out.detach()];
        v.extend(leaves.iter().map(|t| t.grad().expect("a gradient")));
        Ok(v)
    };
    let before = cudnn::attention_passes();
    let (own, library) = (run(false, false)?, run(true, true)?);
    for (forward, backward) in [(true, false), (false, true)] {
        let mixed = run(forward, backward)?;
        for (i, m) in mixed.iter().enumerate() {
            // each result against the run whose pass made it
            let want = if (i == 0 && forward) || (i > 0 && backward) {
                &library[i]
            } else {
                &own[i]
            };
            let err = scaled_error(m, want)?;
            assert!(
                err <= 2e-2,
                "forward on cuDNN {forward}, backward {backward}: result {i} differs by {err}"
            );
        }
    }
    // the library run's two passes and the mixed runs' one each
    assert_eq!(cudnn::attention_passes() - before, 4);
    Ok(())
}

/// `MultiheadAttention` over one input (its gradients come back packed as its
/// projection, `[N, L, 3, H, d]`) and over a memory that is both keys and values
/// (`[N, S, 2, H, d]`) in bf16: cuDNN writes the gradients where the packing
/// puts them, and the module's outputs and parameter gradients agree with
/// ember's kernels'.
#[test]
fn multihead_attention_with_packed_gradients_on_cudnn() -> Result<()> {
    let Some(dev) = cudnn_gpu("multihead_attention_with_packed_gradients_on_cudnn") else {
        return Ok(());
    };
    let _turn = turn();
    ember::manual_seed(29);
    let mut mha = nn::MultiheadAttention::with_options(64, 4, 0.0, true, true, &dev)?;
    mha.to_dtype(DType::BF16)?;
    let x = Tensor::randn([2, 40, 64], &dev)?.to_dtype(DType::BF16)?;
    let memory = Tensor::randn([2, 56, 64], &dev)?.to_dtype(DType::BF16)?;
    for (what, kv) in [("self-attention", &x), ("over a memory", &memory)] {
        let run = |library: bool| -> Result<Vec<Tensor>> {
            for p in mha.parameters() {
                p.zero_grad();
            }
            cudnn::set_attention(library);
            let opts = nn::AttentionOptions {
                need_weights: false,
                ..Default::default()
            };
            let out = mha.attend(&x, kv, kv, opts)?.0;
            out.to_dtype(DType::F32)?.square()?.sum_all()?.backward()?;
            cudnn::set_attention(false);
            let mut v = vec![out.detach()];
            v.extend(
                mha.parameters()
                    .iter()
                    .map(|p| p.grad().expect("a gradient")),
            );
            Ok(v)
        };
        let want = run(false)?;
        let before = cudnn::attention_passes();
        let got = run(true)?;
        assert_eq!(
            cudnn::attention_passes() - before,
            2,
            "{what}: cuDNN's passes"
        );
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let err = scaled_error(g, w)?;
            assert!(
                err <= 2e-2,
                "{what}: result {i} differs by {err} of its scale"
            );
        }
    }
    Ok(())
}

/// Causal self-attention over `[N, 128, 64]` (4 heads of 16; q, k and v
/// slices of one projection), the only layer with activations of that size:
/// attention's backward, whose workspace holds dq in float32, makes a training
/// step's peak.
struct SelfAttention(nn::Linear);

impl Module for SelfAttention {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (n, l, e, h) = (x.shape()[0], x.shape()[1], x.shape()[2], 4);
        let qkv = self.0.forward(x)?.reshape([n, l, 3, h, e / h])?;
        let part = |i: i64| qkv.select(2, i).and_then(|t| t.transpose(1, 2));
        let out = nn::scaled_dot_product_attention(
            &part(0)?,
            &part(1)?,
            &part(2)?,
            None,
            0.0,
            true,
            None,
        )?;
        out.transpose(1, 2)?.reshape([n, l * e])?.narrow(1, 0, 10)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        self.0.named_parameters()
    }

    fn to_device(&mut self, device: &Device) -> Result<()> {
        self.0.to_device(device)
    }

    fn to_dtype(&mut self, dtype: DType) -> Result<()> {
        self.0.to_dtype(dtype)
    }
}

fn self_attention(dev: &Device) -> Result<nn::Sequential> {
    Ok(nn::Sequential::new().add(SelfAttention(nn::Linear::new(64, 192, dev)?)))
}

/// The memory estimate follows cuDNN's attention: a training step of an encoder
/// layer under bf16 autocast with `set_attention(true)` estimates the caching
/// allocator's peak to the byte (the backward's workspace holds dq in float32;
/// with the meta device modelling ember's kernels instead, the estimate is
/// lower).
#[test]
fn the_estimate_follows_cudnn_attention() -> Result<()> {
    let Some(dev) = cudnn_gpu("the_estimate_follows_cudnn_attention") else {
        return Ok(());
    };
    let _turn = turn();
    cudnn::set_attention(true);
    let major = match dev {
        Device::Cuda(i) => ember::cuda::device_properties(i)?.compute_capability.0,
        _ => 9,
    };
    let estimator = |cudnn_modelled| {
        ember::memory::Estimator::new(self_attention)
            .multiprocessors(common::multiprocessors(&dev))
            .cudnn(cudnn_modelled)
            .input([128, 64])
            .optimizer(training::adam)
            .amp(Some(DType::BF16))
            .compute_capability(major)
            .estimate(8)
    };
    let (est, without) = (estimator(true)?, estimator(false)?);
    assert!(
        est.peak_allocated > without.peak_allocated,
        "with cuDNN's attention {} bytes, without {}",
        est.peak_allocated,
        without.peak_allocated
    );
    let before = cudnn::attention_passes();
    let measured = training::measure(
        &dev,
        self_attention,
        &[128, 64],
        8,
        training::adam,
        (DType::F32, Some(DType::BF16)),
        est.steps,
    )?;
    assert!(
        cudnn::attention_passes() > before,
        "no attention ran on cuDNN"
    );
    training::check_estimate(
        "causal self-attention, cuDNN attention, autocast bf16, adam",
        est.peak_allocated,
        measured,
        0.10,
        &est,
    );
    Ok(())
}
