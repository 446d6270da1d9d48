//! The `ops` suite: tensor operations (copy, elementwise, reductions, softmax,
//! matrix products in every precision the device has, 2-D and 3-D convolutions, per-op
//! overhead, and copies between host and device).

use super::stats::{Row, Work};
use super::Ctx;
use ember::prelude::*;
use ember::{cuda, Tensor};

/// The largest absolute difference between two tensors' values.
pub(crate) fn max_diff(a: &Tensor, b: &Tensor) -> Result<f64> {
    let (x, y) = (a.to_vec::<f64>()?, b.to_vec::<f64>()?);
    Ok(x.iter()
        .zip(&y)
        .map(|(p, q)| (p - q).abs())
        .fold(0.0, f64::max))
}

/// The tensor-operation workloads on one device.
pub(crate) fn suite(cx: &Ctx, sizes: &[usize], lesson: bool) -> Result<Vec<Row>> {
    let dev = cx.dev;
    let gpu = dev.is_cuda();
    let q = cx.quick;
    let mut rows = Vec::new();
    ember::manual_seed(0);
    let rand = |shape: &[usize]| -> Result<Tensor> { Tensor::randn(shape, &Device::Cpu)?.to(&dev) };

    // the bandwidth ceiling first: a plain copy of a buffer the size of the
    // elementwise operands
    let n = if q {
        256
    } else if gpu {
        4096
    } else {
        2048
    };
    let x = rand(&[n, n])?;
    let copy = cx.row(
        format!("copy {n}x{n} f32"),
        Work::Bytes(8.0 * (n * n) as f64),
        || x.copy().map(drop),
    )?;
    drop(x);
    rows.push(copy);

    // elementwise, reductions, softmax
    let (a, b) = (rand(&[n, n])?, rand(&[n, n])?);
    let mut r = cx.row(
        format!("mul {n}x{n} f32"),
        Work::Bytes(12.0 * (n * n) as f64),
        || a.mul(&b).map(drop),
    )?;
    r.max_err = check(&dev, &a.mul(&b)?, |c| c.mul(&b.cpu()?), &a)?;
    rows.push(r);
    // broadcast and strided operands: the kernels' index arithmetic, not only
    // their bandwidth (a bias row added to every row; a transposed operand)
    let bias = rand(&[n])?;
    let mut r = cx.row(
        format!("add bias {n}x{n} + {n} f32"),
        Work::Bytes(8.0 * (n * n) as f64),
        || a.add(&bias).map(drop),
    )?;
    r.max_err = check(&dev, &a.add(&bias)?, |c| c.add(&bias.cpu()?), &a)?;
    rows.push(r);
    let bt = b.t()?;
    let mut r = cx.row(
        format!("add transposed {n}x{n} f32"),
        Work::Bytes(12.0 * (n * n) as f64),
        || a.add(&bt).map(drop),
    )?;
    r.max_err = check(&dev, &a.add(&bt)?, |c| c.add(&bt.cpu()?), &a)?;
    rows.push(r);
    let mut r = cx.row(
        format!("sum {n}x{n} f32"),
        Work::Bytes(4.0 * (n * n) as f64),
        || a.sum_all().map(drop),
    )?;
    r.max_err = check(&dev, &a.sum_all()?, |c| c.sum_all(), &a)?;
    rows.push(r);
    // by columns (a bias gradient's shape) and by rows
    for d in [0i64, 1] {
        let mut r = cx.row(
            format!("sum dim {d} of {n}x{n} f32"),
            Work::Bytes(4.0 * (n * n) as f64),
            || a.sum(d, false).map(drop),
        )?;
        r.max_err = check(&dev, &a.sum(d, false)?, |c| c.sum(d, false), &a)?;
        rows.push(r);
    }
    let mut r = cx.row(
        format!("softmax {n}x{n} f32"),
        Work::Bytes(8.0 * (n * n) as f64),
        || a.softmax(-1).map(drop),
    )?;
    r.max_err = check(&dev, &a.softmax(-1)?, |c| c.softmax(-1), &a)?;
    rows.push(r);
    drop((a, b));

    // matrix products
    // (bf16 on the CPU too: mixed-precision training's products)
    let mut dtypes: Vec<(&str, DType, bool)> = vec![("f32", DType::F32, false)];
    if gpu {
        dtypes.extend([
            ("tf32", DType::F32, true),
            ("bf16", DType::BF16, false),
            ("f16", DType::F16, false),
        ]);
    } else {
        dtypes.push(("bf16", DType::BF16, false));
    }
    let mut sizes = sizes.to_vec();
    if lesson && !sizes.contains(&10000) {
        sizes.push(10000);
    }
    for &s in &sizes {
        let (a32, b32) = (rand(&[s, s])?, rand(&[s, s])?);
        for &(label, dt, tf32) in &dtypes {
            let (a, b) = (a32.to_dtype(dt)?, b32.to_dtype(dt)?);
            cuda::set_allow_tf32(tf32);
            let mut r = cx.row(
                format!("matmul {s} {label}"),
                Work::Flops(2.0 * (s as f64).powi(3)),
                || a.matmul(&b).map(drop),
            )?;
            if gpu {
                // the first rows against the CPU's product (in f32)
                let k = s.min(8);
                let got = a.narrow(0, 0, k)?.matmul(&b)?.to_dtype(DType::F32)?;
                let want = a32.cpu()?.narrow(0, 0, k)?.matmul(&b32.cpu()?)?;
                r.max_err = Some(max_diff(&got.cpu()?, &want)?);
            }
            cuda::set_allow_tf32(false);
            rows.push(r);
        }
    }

    // a linear layer with its bias (the product adds it: cublasLt's bias epilogue
    // on a GPU), in each product dtype
    let (rows_, fin, fout) = if q { (64, 32, 64) } else { (4096, 256, 1024) };
    let (x32, w32, b32) = (rand(&[rows_, fin])?, rand(&[fout, fin])?, rand(&[fout])?);
    for &(label, dt, tf32) in &dtypes {
        let (x, w, b) = (x32.to_dtype(dt)?, w32.to_dtype(dt)?, b32.to_dtype(dt)?);
        cuda::set_allow_tf32(tf32);
        let r = cx.row(
            format!("linear {rows_}x{fin} -> {fout} {label}"),
            Work::Flops(2.0 * (rows_ * fin * fout) as f64),
            || ember::nn::functional::linear(&x, &w, Some(&b)).map(drop),
        )?;
        cuda::set_allow_tf32(false);
        rows.push(r);
    }
    drop((x32, w32, b32));

    // a convolution layer of the MNIST-sized CNN
    let (bn, c, o, hw) = if q { (8, 8, 16, 12) } else { (64, 32, 64, 26) };
    let xc = rand(&[bn, c, hw, hw])?;
    let wc = rand(&[o, c, 3, 3])?;
    let ohw = (hw - 2) as f64;
    let flops = 2.0 * (bn * o) as f64 * ohw * ohw * (c * 9) as f64;
    let opts = Conv2dOptions::default();
    let mut r = cx.row(
        format!("conv2d {bn}x{c}x{hw}x{hw} k3 o{o}"),
        Work::Flops(flops),
        || xc.conv2d(&wc, None, opts).map(drop),
    )?;
    if gpu {
        let got = xc.conv2d(&wc, None, opts)?.cpu()?;
        let want = xc.cpu()?.conv2d(&wc.cpu()?, None, opts)?;
        r.max_err = Some(max_diff(&got, &want)?);
    }
    rows.push(r);

    // the digits CNN's second layer, forward and both gradients: a small
    // convolution, where the cost of each call matters more than its arithmetic
    let (bn, c, o, hw) = if q { (8, 4, 8, 8) } else { (64, 16, 32, 8) };
    let xs = rand(&[bn, c, hw, hw])?.requires_grad_(true)?;
    let ws = rand(&[o, c, 3, 3])?.requires_grad_(true)?;
    let pad1 = Conv2dOptions {
        padding: (1, 1),
        ..Conv2dOptions::default()
    };
    let flops = 3.0 * 2.0 * (bn * o * hw * hw * c * 9) as f64;
    rows.push(cx.row(
        format!("conv2d fwd+bwd {bn}x{c}x{hw}x{hw} k3 p1 o{o}"),
        Work::Flops(flops),
        || {
            xs.conv2d(&ws, None, pad1)?.sum_all()?.backward()?;
            xs.zero_grad();
            ws.zero_grad();
            Ok(())
        },
    )?);

    // a 3-D convolution's forward and both gradients: a volume or video
    // network's 3x3x3 layer (padding 1), counted as 3 products of
    // 2·B·O·D·H·W·C·27
    let (bn, c, o, d, hw) = match (q, gpu) {
        (true, _) => (1, 2, 4, 4, 8),
        (false, true) => (8, 64, 64, 16, 56),
        (false, false) => (2, 16, 16, 8, 32),
    };
    let x3 = rand(&[bn, c, d, hw, hw])?.requires_grad_(true)?;
    let w3 = rand(&[o, c, 3, 3, 3])?.requires_grad_(true)?;
    let flops = 3.0 * 2.0 * (bn * o * d * hw * hw * c * 27) as f64;
    rows.push(cx.row(
        format!("conv3d fwd+bwd {bn}x{c}x{d}x{hw}x{hw} k3 p1 o{o}"),
        Work::Flops(flops),
        || {
            let opts = ember::Conv3dOptions::default().padding(1);
            x3.conv3d(&w3, None, opts)?.sum_all()?.backward()?;
            x3.zero_grad();
            w3.zero_grad();
            Ok(())
        },
    )?);
    drop((x3, w3));

    // causal attention forward and backward at GPT-2 small's shape (on GPUs in
    // bf16 and f32: the fused kernels; on the CPU a small f32 one), counted as
    // FlashAttention counts it: 4·B·H·L·S·d forward, 2.5 times that backward,
    // halved by the causal mask
    // (batch, heads, length, head dim) and the dtype
    let attention_rows: &[([usize; 4], DType)] = if gpu && !q {
        &[
            ([8, 12, 1024, 64], DType::BF16),
            ([8, 12, 1024, 64], DType::F32),
        ]
    } else {
        &[([1, 2, 128, 64], DType::F32)]
    };
    for &([b, h, l, d], adt) in attention_rows {
        let tag = if adt == DType::BF16 { "bf16" } else { "f32" };
        let qkv: Vec<Tensor> = (0..3)
            .map(|_| rand(&[b, h, l, d])?.to_dtype(adt)?.requires_grad_(true))
            .collect::<Result<_>>()?;
        let flops = 3.5 * 4.0 * (b * h * l * l * d) as f64 / 2.0;
        rows.push(cx.row(
            format!("attention fwd+bwd causal {b}x{h}x{l}x{d} {tag}"),
            Work::Flops(flops),
            || {
                ember::nn::scaled_dot_product_attention(
                    &qkv[0], &qkv[1], &qkv[2], None, 0.0, true, None,
                )?
                .sum_all()?
                .backward()?;
                for t in &qkv {
                    t.zero_grad();
                }
                Ok(())
            },
        )?);
    }

    // layer norm with its weight and bias, forward and the three gradients (GPT-2
    // small's rows and width on GPUs; under autocast it runs in float32 too),
    // counted as the bytes one pass forward and two backward move
    let [ln_rows, ln_cols] = match (gpu, q) {
        (_, true) => [64, 32],
        (true, false) => [8192, 768],
        (false, false) => [2048, 256],
    };
    let lx = rand(&[ln_rows, ln_cols])?.requires_grad_(true)?;
    let (lw, lb) = (
        rand(&[ln_cols])?.requires_grad_(true)?,
        rand(&[ln_cols])?.requires_grad_(true)?,
    );
    rows.push(cx.row(
        format!("layer norm fwd+bwd {ln_rows}x{ln_cols} f32"),
        Work::Bytes(7.0 * 4.0 * (ln_rows * ln_cols) as f64),
        || {
            ember::nn::layer_norm(&lx, &[ln_cols], Some(&lw), Some(&lb), 1e-5)?
                .sum_all()?
                .backward()?;
            for t in [&lx, &lw, &lb] {
                t.zero_grad();
            }
            Ok(())
        },
    )?);

    // per-op overhead: a 4×4 add, launched again and again
    let (t1, t2) = (rand(&[4, 4])?, rand(&[4, 4])?);
    rows.push(cx.row("tiny add 4x4 (per op)".into(), Work::None, || {
        t1.add(&t2).map(drop)
    })?);

    // copies between host memory and the GPU: ember's default (uploads staged
    // through pinned blocks, large downloads in pinned chunks), then the driver's
    // own path from and to ordinary pageable memory, for comparison
    if gpu {
        let nb = if q { 1 << 20 } else { 16 << 20 };
        let mb = nb >> 18; // MiB of f32
        let host = Tensor::randn([nb], &Device::Cpu)?;
        let on_dev = host.to(&dev)?;
        let bytes = Work::Bytes(4.0 * nb as f64);
        for staged in [true, false] {
            cuda::set_pinned_staging(staged);
            let how = if staged { "" } else { " (pageable)" };
            let up = cx.row(format!("host to device {mb} MiB{how}"), bytes, || {
                host.to(&dev).map(drop)
            });
            let down = cx.row(format!("device to host {mb} MiB{how}"), bytes, || {
                on_dev.cpu().map(drop)
            });
            cuda::set_pinned_staging(true);
            rows.push(up?);
            rows.push(down?);
        }
    }
    Ok(rows)
}

/// For a GPU row: the largest difference between `got` and the CPU's answer
/// `want(x on the CPU)`.
fn check(
    dev: &Device,
    got: &Tensor,
    want: impl FnOnce(&Tensor) -> Result<Tensor>,
    x: &Tensor,
) -> Result<Option<f64>> {
    if !dev.is_cuda() {
        return Ok(None);
    }
    let w = want(&x.cpu()?)?;
    Ok(Some(max_diff(&got.cpu()?, &w)?))
}
