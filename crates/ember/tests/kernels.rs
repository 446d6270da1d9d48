//! User-written CUDA kernels (`ember::kernel`): the lessons' two kernels against the
//! CPU, in order with ember's own operations, argument checks, launch limits and
//! compile errors. Each test skips, saying why, where no GPU is present (CI runs
//! them on ember's CUDA simulator).

use ember::kernel::{Arg, Kernel, LaunchConfig};
use ember::prelude::*;
use ember::Error;

mod common;
use common::gpu;

/// The lessons' kernels, the same files the examples launch.
const ADD: &str = include_str!("../examples/kernels/cu_add_vectors.cu");
const MV: &str = include_str!("../examples/kernels/cu_mv_product.cu");

#[test]
fn the_lessons_vector_add_matches_the_cpu() -> Result<()> {
    let Some(dev) = gpu("vector_add") else {
        return Ok(());
    };
    let n = 100_000;
    let a = Tensor::rand([n], &Device::Cpu)?;
    let b = Tensor::rand([n], &Device::Cpu)?;
    let (ag, bg) = (a.to(&dev)?, b.to(&dev)?);
    let c = Tensor::zeros([n], DType::F32, &dev)?;
    let k = Kernel::compile(ADD, "cu_add_vectors", &dev)?;
    assert_eq!(k.device(), dev);
    let cfg = LaunchConfig::for_elements(n, 1024);
    assert_eq!(cfg.grid.0, 98);
    let args = [
        Arg::input(&ag, DType::F32),
        Arg::input(&bg, DType::F32),
        Arg::output(&c, DType::F32),
        Arg::I32(n as i32),
    ];
    let versions = (ag.version(), c.version());
    k.launch(cfg, &args)?;
    c.cpu()?.assert_close(&a.add(&b)?, 1e-6, 1e-6)?;
    // the output counts as written, the inputs do not (`tensor._version`)
    assert_eq!((ag.version(), c.version()), (versions.0, versions.1 + 1));
    // and autograd refuses a backward that would read a value saved before the
    // kernel wrote over it
    let w = ag.detach().requires_grad_(true)?;
    let saved = c.mul(1.0)?;
    let y = w.mul(&saved)?.sum_all()?;
    k.launch(
        cfg,
        &[
            Arg::input(&ag, DType::F32),
            Arg::input(&bg, DType::F32),
            Arg::output(&saved, DType::F32),
            Arg::I32(n as i32),
        ],
    )?;
    let e = y.backward().unwrap_err().to_string();
    assert!(e.contains("modified by an inplace operation"), "{e}");
    // in order with ember's own ops on the same stream: a kernel launched after a
    // built-in op sees its result, and an op after the kernel sees the kernel's
    let b2 = bg.mul(2.0)?;
    k.launch(
        cfg,
        &[
            Arg::input(&ag, DType::F32),
            Arg::input(&b2, DType::F32),
            Arg::output(&c, DType::F32),
            Arg::I32(n as i32),
        ],
    )?;
    let d = c.sub(&ag)?;
    assert!(d.allclose(&b2, 1e-5, 1e-6)?);
    Ok(())
}

#[test]
fn the_lessons_matrix_vector_product_matches_the_cpu() -> Result<()> {
    let Some(dev) = gpu("mv_product") else {
        return Ok(());
    };
    let (rows, cols) = (1000, 100);
    let m = Tensor::randn([rows, cols], &Device::Cpu)?;
    let x = Tensor::randn([cols], &Device::Cpu)?;
    let (mg, xg) = (m.to(&dev)?, x.to(&dev)?);
    let y = Tensor::zeros([rows], DType::F32, &dev)?;
    let k = Kernel::compile(MV, "cu_mv_product", &dev)?;
    k.launch(
        LaunchConfig::for_elements(rows, 256),
        &[
            Arg::input(&mg, DType::F32),
            Arg::input(&xg, DType::F32),
            Arg::output(&y, DType::F32),
            Arg::I32(rows as i32),
            Arg::I32(cols as i32),
        ],
    )?;
    let want = m.matmul(&x)?;
    assert!(y.cpu()?.allclose(&want, 1e-4, 1e-4)?);
    assert!(y.max_abs_diff(&want.to(&dev)?)? < 1e-3);
    Ok(())
}

#[test]
fn arguments_are_checked_before_the_launch() -> Result<()> {
    let Some(dev) = gpu("argument_checks") else {
        return Ok(());
    };
    let k = Kernel::compile(ADD, "cu_add_vectors", &dev)?;
    let a = Tensor::ones([8, 4], DType::F32, &dev)?;
    let c = Tensor::zeros([32], DType::F32, &dev)?;
    let cfg = LaunchConfig::for_elements(32, 32);
    // the kernel's arguments with the first and the last one given
    let launch = |cfg: LaunchConfig, first: Arg, last: Arg| {
        k.launch(
            cfg,
            &[
                first,
                Arg::input(&c, DType::F32),
                Arg::output(&c, DType::F32),
                last,
            ],
        )
    };
    let with = |x: Arg| launch(cfg, x, Arg::I32(32));
    // a dtype other than the one declared
    let e = with(Arg::input(&a.to_dtype(DType::F64)?, DType::F32))
        .unwrap_err()
        .to_string();
    assert!(e.contains("takes float32") && e.contains("float64"), "{e}");
    // a view that is not contiguous
    let e = with(Arg::input(&a.t()?, DType::F32))
        .unwrap_err()
        .to_string();
    assert!(e.contains("not contiguous"), "{e}");
    // a tensor on another device
    let e = with(Arg::input(
        &Tensor::ones([32], DType::F32, &Device::Cpu)?,
        DType::F32,
    ))
    .unwrap_err();
    assert!(matches!(e, Error::DeviceMismatch { .. }), "{e}");
    // too many threads per block, checked against the device's limit
    let e = launch(
        LaunchConfig::new(1, 4096),
        Arg::input(&c, DType::F32),
        Arg::I32(32),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("4096 threads"), "{e}");
    // the arguments' number and sizes must be the kernel's parameters'
    assert_eq!(k.param_sizes(), &[8, 8, 8, 4]);
    let e = k
        .launch(cfg, &[Arg::input(&c, DType::F32), Arg::I32(32)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("takes 4 arguments, 2 given"), "{e}");
    let e = with(Arg::F32(0.0)).unwrap_err().to_string();
    assert!(e.contains("argument 0 of cu_add_vectors"), "{e}");
    let wide = launch(cfg, Arg::input(&c, DType::F32), Arg::I64(32))
        .unwrap_err()
        .to_string();
    assert!(
        wide.contains("argument 3") && wide.contains("takes 4 bytes") && wide.contains("Arg::I64"),
        "{wide}"
    );
    let src =
        r#"extern "C" __global__ void mixed(const double* a, long long n, float s, char c) {}"#;
    let mixed = Kernel::compile(src, "mixed", &dev)?;
    assert_eq!(mixed.param_sizes(), &[8, 8, 4, 1]);
    // nothing was written by the refused launches
    assert_eq!(c.sum_all()?.item::<f32>()?, 0.0);
    Ok(())
}

/// A kernel taking by value what the API's 4- and 8-byte scalars cannot pass:
/// `bool`, `char`, `short`, `__half`, `__nv_bfloat16` and a struct (three
/// floats and a short: 16 bytes with the padding). Without a GPU NVRTC compiles
/// it for sm_90 (where NVRTC is found), and the simulator runs it with the CUDA
/// headers' types stood in for by 2-byte structs.
const BY_VALUE: &str = r#"
#ifdef EMBER_SIMULATOR
struct __half { unsigned short bits; };
struct __nv_bfloat16 { unsigned short bits; };
#else
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#endif
struct Params { float scale; float shift; float unused; short tag; };
extern "C" __global__ void by_value(bool flip, const float* x, float* y, char c, Params p,
                                    short s, __half h, __half* h_out, __nv_bfloat16 b,
                                    __nv_bfloat16* b_out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = (flip ? -x[i] : x[i]) * p.scale + p.shift + c + s + p.tag;
    if (i == 0) { h_out[0] = h; b_out[0] = b; }
}"#;

#[test]
fn small_scalars_and_structs_are_passed_by_value() -> Result<()> {
    if ember::kernel::compile_for_arch(BY_VALUE, "by_value", 90, &[]).is_ok() {
        eprintln!("NVRTC compiled by_value for sm_90");
    }
    let Some(dev) = gpu("small_scalars_and_structs") else {
        return Ok(());
    };
    let k = Kernel::compile(BY_VALUE, "by_value", &dev)?;
    assert_eq!(k.param_sizes(), &[1, 8, 8, 1, 16, 2, 2, 8, 2, 8, 4]);
    let n = 100;
    let x = Tensor::arange(0f32, n as f32, &dev)?;
    let y = Tensor::zeros([n], DType::F32, &dev)?;
    let h = Tensor::zeros([1], DType::F16, &dev)?;
    let b = Tensor::zeros([1], DType::BF16, &dev)?;
    // the struct's bytes as the kernel lays it out
    let mut params = Vec::new();
    for v in [2.5f32, 0.5, 99.0] {
        params.extend(v.to_le_bytes());
    }
    params.extend(7i16.to_le_bytes());
    params.extend([0u8; 2]);
    let (hv, bv) = (half::f16::from_f32(-1.5), half::bf16::from_f32(3.25));
    let args = |flip: bool, struct_bytes: usize| {
        [
            Arg::Bool(flip),
            Arg::input(&x, DType::F32),
            Arg::output(&y, DType::F32),
            Arg::I8(-3),
            Arg::Bytes(&params[..struct_bytes]),
            Arg::I16(-300),
            Arg::F16(hv),
            Arg::output(&h, DType::F16),
            Arg::BF16(bv),
            Arg::output(&b, DType::BF16),
            Arg::I32(n as i32),
        ]
    };
    for flip in [false, true] {
        k.launch(LaunchConfig::for_elements(n, 32), &args(flip, 16))?;
        let want: Vec<f32> = (0..n)
            .map(|i| {
                let v = if flip { -(i as f32) } else { i as f32 };
                v * 2.5 + 0.5 + -3.0 + -300.0 + 7.0
            })
            .collect();
        assert_eq!(y.to_vec::<f32>()?, want, "flip {flip}");
    }
    assert_eq!(h.to_vec::<half::f16>()?, vec![hv]);
    assert_eq!(b.to_vec::<half::bf16>()?, vec![bv]);
    // sizes are checked: a struct's bytes must be its sizeof, a bool one byte
    let e = k
        .launch(LaunchConfig::new(1, 32), &args(true, 12))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("argument 4") && e.contains("takes 16 bytes") && e.contains("Arg::Bytes"),
        "{e}"
    );
    let mut wrong = args(true, 16);
    wrong[0] = Arg::I32(1);
    let e = k
        .launch(LaunchConfig::new(1, 32), &wrong)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("argument 0") && e.contains("takes 1 bytes"),
        "{e}"
    );
    wrong[0] = Arg::U8(1);
    wrong[5] = Arg::F16(hv);
    wrong[6] = Arg::U16(0xbe00); // -1.5 as a half's bits
    k.launch(LaunchConfig::for_elements(n, 32), &wrong)?;
    assert_eq!(h.to_vec::<half::f16>()?, vec![hv]);
    Ok(())
}

/// A kernel whose compiled code allows fewer threads than the device (here through
/// `__launch_bounds__`, which caps its registers so: a GPU reports the same limit)
/// is refused above that limit with both limits named; at the limit it runs.
#[test]
fn the_compiled_functions_thread_limit_is_checked() -> Result<()> {
    let Some(dev) = gpu("function_thread_limit") else {
        return Ok(());
    };
    let src = r#"
extern "C" __global__ void __launch_bounds__(256) twice(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= 2.0f;
}"#;
    let k = Kernel::compile(src, "twice", &dev)?;
    assert_eq!(k.attributes().max_threads_per_block, 256);
    let x = Tensor::ones([512], DType::F32, &dev)?;
    let args = [Arg::output(&x, DType::F32), Arg::I32(512)];
    let e = k
        .launch(LaunchConfig::new(1, 512), &args)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("512 threads")
            && e.contains("twice allows at most 256")
            && e.contains("allows 1024"),
        "{e}"
    );
    // nothing ran
    assert_eq!(x.sum_all()?.item::<f32>()?, 512.0);
    k.launch(LaunchConfig::new(2, 256), &args)?;
    assert_eq!(x.sum_all()?.item::<f32>()?, 1024.0);
    Ok(())
}

/// Dynamic shared memory above 48 KiB: the launch opts the kernel in (the driver,
/// and the simulator like it, refuses such a launch otherwise) up to the device's
/// opt-in limit; beyond it the launch is refused before anything runs.
#[test]
fn dynamic_shared_memory_above_48_kib_is_opted_in() -> Result<()> {
    let Some(dev) = gpu("large_dynamic_shared") else {
        return Ok(());
    };
    let src = r#"
extern "C" __global__ void reverse_through_shared(const float* x, float* y, int n) {
    extern __shared__ float buf[];
    for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = x[i];
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = buf[n - 1 - i];
}"#;
    let k = Kernel::compile(src, "reverse_through_shared", &dev)?;
    let n: usize = 25_000; // 100 000 bytes of shared memory
    let x = Tensor::arange(0f32, n as f32, &dev)?;
    let y = Tensor::zeros([n], DType::F32, &dev)?;
    let args = [
        Arg::input(&x, DType::F32),
        Arg::output(&y, DType::F32),
        Arg::I32(n as i32),
    ];
    let props = ember::cuda::device_properties(0)?;
    if props.max_shared_memory_per_block_optin < 100_000 {
        eprintln!(
            "skipped the 100 KB launch: {} allows {} bytes per block",
            props.name, props.max_shared_memory_per_block_optin
        );
        return Ok(());
    }
    k.launch(LaunchConfig::new(1, 256).with_shared_mem(100_000), &args)?;
    assert_eq!(y.max_abs_diff(&x.flip(0)?)?, 0.0);
    let too_much = props.max_shared_memory_per_block_optin as u32 + 4;
    let e = k
        .launch(LaunchConfig::new(1, 256).with_shared_mem(too_much), &args)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!("{too_much} bytes of shared memory")),
        "{e}"
    );
    Ok(())
}

/// Work on a GPU is asynchronous, on the simulator too (its stream runs on a
/// thread of its own): a launch returns before its kernel has run, an event
/// recorded after it stays pending until the kernel has finished, and reading the
/// result waits for it.
#[test]
fn launches_return_before_their_kernels_have_run() -> Result<()> {
    let Some(dev) = gpu("asynchronous_launches") else {
        return Ok(());
    };
    // one thread, 10^8 dependent steps: a fraction of a second on a GPU or the CPU
    let src = r#"
extern "C" __global__ void spin(float* out, long long n) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    float acc = 0.0f;
    for (long long i = 0; i < n; ++i) acc = acc * 0.999999f + 1.0f;
    out[0] = acc;
}"#;
    let k = Kernel::compile(src, "spin", &dev)?;
    let out = Tensor::zeros([1], DType::F32, &dev)?;
    let args = [Arg::output(&out, DType::F32), Arg::I64(100_000_000)];
    ember::cuda::synchronize(&dev)?;
    k.launch(LaunchConfig::new(1, 32), &args)?;
    let ev = ember::cuda::Event::record(&dev)?;
    assert!(!ev.query()?, "the kernel had run when its launch returned");
    ev.synchronize()?;
    assert!(ev.query()?);
    // 1e6 (1 - 0.999999^1e8) in float32 arithmetic
    let v = out.item::<f32>()?;
    assert!(v > 9.0e5 && v < 1.1e6, "{v}");
    Ok(())
}

#[test]
fn compile_errors_and_missing_kernels_are_errors() {
    let Some(dev) = gpu("compile_errors") else {
        return;
    };
    let bad = "extern \"C\" __global__ void k(float* x) {\n  x[0] = not_declared;\n}\n";
    match Kernel::compile(bad, "k", &dev) {
        Err(Error::KernelCompile { log, .. }) => {
            assert!(log.contains("not_declared"), "{log}")
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
    let e = Kernel::compile(ADD, "no_such_kernel", &dev).unwrap_err();
    assert!(e.to_string().contains("no_such_kernel"), "{e}");
    // a C++ name is mangled: the error says how to declare it
    let mangled = "__global__ void plain(float* x) { x[0] = 1.0f; }\n";
    let e = Kernel::compile(mangled, "plain", &dev)
        .unwrap_err()
        .to_string();
    assert!(e.contains("plain") && e.contains("extern \"C\""), "{e}");
}

/// Runs this binary's ignored test `child` in a child process on the simulator with
/// `env` (and no other simulator setting) and `EMBER_CHILD_CASE=case`: its success
/// and output.
fn run_child(child: &str, case: &str, env: &[(&str, &str)]) -> (bool, String) {
    let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--ignored", "--exact", child, "--test-threads=1"])
        // only what `env` says, whatever pass this test runs in
        .env_remove("EMBER_SIM_ORDER")
        .env_remove("EMBER_SIM_SANITIZE")
        .env_remove("EMBER_CUDA_NO_CACHING")
        .env_remove("LD_PRELOAD")
        .env("EMBER_CUDA_SIMULATOR", "1")
        .env("EMBER_CHILD_CASE", case)
        .envs(env.iter().copied())
        .output()
        .expect("running the test binary");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success() && text.contains("1 passed"), text)
}

/// The memory checker of `.ci/memcheck` (the simulator's kernels built with
/// AddressSanitizer, one device allocation per tensor) reports what
/// compute-sanitizer's memcheck would: a write one element past a tensor, a read
/// past a `__shared__` array and a read past the dynamic shared memory the launch
/// asked for stop the program with the sanitizer's report, while
/// the same kernel within bounds runs clean. Runs `memcheck_child` in a child
/// process (the sanitizer's runtime must be loaded first); skips where the host
/// compiler has no AddressSanitizer.
#[test]
fn the_simulators_memory_checker_reports_out_of_bounds_accesses() {
    let cxx = std::env::var("EMBER_SIM_CXX").unwrap_or_else(|_| "c++".into());
    let asan = std::process::Command::new(&cxx)
        .arg("-print-file-name=libasan.so")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    if !std::path::Path::new(&asan).is_file() {
        eprintln!("skipped the memory checker's test: `{cxx}` has no libasan.so");
        return;
    }
    let env = [
        ("EMBER_SIM_SANITIZE", "address"),
        ("EMBER_CUDA_NO_CACHING", "1"),
        ("LD_PRELOAD", asan.as_str()),
        (
            "ASAN_OPTIONS",
            "detect_leaks=0:verify_asan_link_order=0:halt_on_error=1",
        ),
    ];
    for case in ["in_bounds", "dynamic_in_bounds"] {
        let (ok, text) = run_child("memcheck_child", case, &env);
        assert!(ok, "clean run ({case}) failed:\n{text}");
    }
    let (ok, text) = run_child("memcheck_child", "past_the_end", &env);
    assert!(!ok, "a write past the tensor went unreported:\n{text}");
    assert!(
        text.contains("heap-buffer-overflow") && text.contains("memcheck_probe"),
        "{text}"
    );
    let (ok, text) = run_child("memcheck_child", "shared", &env);
    assert!(!ok, "a read past shared memory went unreported:\n{text}");
    assert!(
        text.contains("global-buffer-overflow") && text.contains("memcheck_probe"),
        "{text}"
    );
    let (ok, text) = run_child("memcheck_child", "dynamic_shared", &env);
    assert!(
        !ok,
        "a read past the launch's dynamic shared memory went unreported:\n{text}"
    );
    assert!(
        text.contains("use-after-poison") && text.contains("memcheck_dynamic"),
        "{text}"
    );
}

/// The kernel the memory checker's test runs, within bounds or not as
/// `EMBER_CHILD_CASE` says (on its own it is skipped).
#[test]
#[ignore = "run by the_simulators_memory_checker_reports_out_of_bounds_accesses"]
fn memcheck_child() -> Result<()> {
    const PROBE: &str = r#"
extern "C" __global__ void memcheck_probe(float* out, int n, int reach, int tile_reach) {
    __shared__ float tile[64];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    tile[threadIdx.x] = (float)i;
    __syncthreads();
    if (i < n) out[i + reach] = tile[(threadIdx.x + tile_reach) % 128];
}
"#;
    // the same with the tile in dynamic shared memory of 64 floats
    const DYNAMIC: &str = r#"
extern "C" __global__ void memcheck_dynamic(float* out, int n, int reach, int tile_reach) {
    extern __shared__ float tile[];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    tile[threadIdx.x] = (float)i;
    __syncthreads();
    if (i < n) out[i + reach] = tile[(threadIdx.x + tile_reach) % 128];
}
"#;
    let case = std::env::var("EMBER_CHILD_CASE").unwrap_or_default();
    let (reach, tile_reach) = match case.as_str() {
        "past_the_end" => (1, 0),
        "shared" | "dynamic_shared" => (0, 1),
        _ => (0, 0),
    };
    let dev = Device::Cuda(0);
    let out = Tensor::zeros([64], DType::F32, &dev)?;
    let args = [
        Arg::output(&out, DType::F32),
        Arg::I32(64),
        Arg::I32(reach),
        Arg::I32(tile_reach),
    ];
    if case.starts_with("dynamic") {
        let k = Kernel::compile(DYNAMIC, "memcheck_dynamic", &dev)?;
        k.launch(LaunchConfig::new(1, 64).with_shared_mem(64 * 4), &args)?;
    } else {
        let k = Kernel::compile(PROBE, "memcheck_probe", &dev)?;
        k.launch(LaunchConfig::new(1, 64), &args)?;
    }
    let want: Vec<f32> = (0..64).map(|i| i as f32).collect();
    assert_eq!(out.to_vec::<f32>()?, want);
    Ok(())
}

/// `EMBER_SIM_ORDER=reverse` (the order `.ci/memcheck` runs in) exposes a kernel
/// that depends on the order of its threads or blocks: reading a neighbour's
/// shared-memory value without `__syncthreads`, or a value a lower block wrote,
/// works first-to-last and fails last-to-first. With the barrier it works both ways.
#[test]
fn reversed_order_exposes_kernels_that_depend_on_thread_order() {
    for case in ["missing_barrier", "block_order"] {
        let (ok, text) = run_child("order_child", case, &[]);
        assert!(ok, "{case} in the usual order:\n{text}");
        let (ok, text) = run_child("order_child", case, &[("EMBER_SIM_ORDER", "reverse")]);
        assert!(!ok, "{case} passed in reverse order:\n{text}");
    }
    let (ok, text) = run_child(
        "order_child",
        "with_barrier",
        &[("EMBER_SIM_ORDER", "reverse")],
    );
    assert!(ok, "with a barrier, in reverse order:\n{text}");
}

/// The kernels of `reversed_order_exposes_kernels_that_depend_on_thread_order`.
#[test]
#[ignore = "run by reversed_order_exposes_kernels_that_depend_on_thread_order"]
fn order_child() -> Result<()> {
    // thread i publishes i + 1, then reads its left neighbour's value; SYNC is
    // __syncthreads() or nothing
    const SHIFT: &str = r#"
extern "C" __global__ void shift_left(float* out) {
    __shared__ float tile[64];
    int t = threadIdx.x;
    tile[t] = (float)(t + 1);
    SYNC;
    out[t] = t > 0 ? tile[t - 1] : 0.0f;
}
"#;
    // block b adds what block b - 1 left in `out` (a dependence between blocks
    // that CUDA never promises)
    const CHAIN: &str = r#"
extern "C" __global__ void chain(float* out) {
    int b = blockIdx.x;
    if (threadIdx.x == 0) out[b] = (b > 0 ? out[b - 1] : 0.0f) + 1.0f;
}
"#;
    let dev = Device::Cuda(0);
    let case = std::env::var("EMBER_CHILD_CASE").unwrap_or_default();
    let out = Tensor::zeros([64], DType::F32, &dev)?;
    let args = [Arg::output(&out, DType::F32)];
    let want: Vec<f32> = if case == "block_order" {
        let k = Kernel::compile(CHAIN, "chain", &dev)?;
        k.launch(LaunchConfig::new(64, 32), &args)?;
        (1..=64).map(|i| i as f32).collect()
    } else {
        let sync = if case == "with_barrier" {
            "-DSYNC=__syncthreads()"
        } else {
            "-DSYNC=(void)0"
        };
        let k = Kernel::compile_with(SHIFT, "shift_left", &dev, &[sync])?;
        k.launch(LaunchConfig::new(1, 64), &args)?;
        (0..64).map(|i| i as f32).collect()
    };
    assert_eq!(out.to_vec::<f32>()?, want);
    Ok(())
}
