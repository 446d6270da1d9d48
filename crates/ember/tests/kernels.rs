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
    k.launch(cfg, &args)?;
    c.cpu()?.assert_close(&a.add(&b)?, 1e-6, 1e-6)?;
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
    let with = |x: Arg| {
        k.launch(
            cfg,
            &[
                x,
                Arg::input(&c, DType::F32),
                Arg::output(&c, DType::F32),
                Arg::I32(32),
            ],
        )
    };
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
    let e = k
        .launch(
            LaunchConfig::new(1, 4096),
            &[
                Arg::input(&c, DType::F32),
                Arg::input(&c, DType::F32),
                Arg::output(&c, DType::F32),
                Arg::I32(32),
            ],
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
    let wide = k
        .launch(
            cfg,
            &[
                Arg::input(&c, DType::F32),
                Arg::input(&c, DType::F32),
                Arg::output(&c, DType::F32),
                Arg::I64(32),
            ],
        )
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
}
