//! The `pieces` suite: the layers the real-size models of the `models` suite
//! spend their steps in, each timed forward and backward on its own, in float32
//! and in bfloat16. On a GPU at the models' sizes (ResNet-50's layers at batch
//! 64; GPT-2 small's at 8 × 1024 tokens), on the CPU smaller (batch 2; 1,024
//! tokens, 512 for the loss), with `--quick` smaller still.
//!
//! Each row runs the op on operands that need gradients and backpropagates a
//! fixed upstream gradient of the output's shape (`backward_with`; the losses
//! from their scalar), so a row is the op's forward and backward kernels and
//! nothing else. The bf16 rows give the op bfloat16 operands (no autocast),
//! but for batch norm's parameters and running statistics, float32 as under
//! autocast. The convolutions run again channels-last, with cuDNN's
//! algorithms timed (`cudnn::set_benchmark`), as the models suite's
//! channels-last rows run them.
//! `bench/pytorch/device_ops.py --suite pieces` times the same rows by the same
//! names.

use super::stats::{Row, Work};
use super::Ctx;
use ember::nn::functional::{batch_norm, BatchNormOptions};
use ember::prelude::*;
use ember::{MemoryFormat, Tensor};

/// The pieces' sizes on one device.
struct Sizes {
    /// ResNet-50's batch, and the two spatial sizes (56 and 14 at full size).
    batch: usize,
    hw: [usize; 2],
    /// GPT-2 small's rows (tokens), the attention's (batch, heads, length, head
    /// dim), and the loss's rows.
    tokens: usize,
    attention: [usize; 4],
    loss_rows: usize,
    /// The width, the MLP's width and the vocabulary.
    width: usize,
    hidden: usize,
    vocab: usize,
}

impl Sizes {
    fn of(cx: &Ctx) -> Sizes {
        if cx.quick {
            Sizes {
                batch: 1,
                hw: [8, 4],
                tokens: 64,
                attention: [1, 2, 64, 32],
                loss_rows: 64,
                width: 96,
                hidden: 384,
                vocab: 1000,
            }
        } else if cx.dev.is_cuda() {
            Sizes {
                batch: 64,
                hw: [56, 14],
                tokens: 8192,
                attention: [8, 12, 1024, 64],
                loss_rows: 8192,
                width: 768,
                hidden: 3072,
                vocab: 50304,
            }
        } else {
            Sizes {
                batch: 2,
                hw: [56, 14],
                tokens: 1024,
                attention: [1, 12, 256, 64],
                loss_rows: 512,
                width: 768,
                hidden: 3072,
                vocab: 50304,
            }
        }
    }
}

/// An upstream gradient of `shape` in `dtype` on the device (normal values).
fn upstream(cx: &Ctx, shape: &[usize], dtype: DType) -> Result<Tensor> {
    Tensor::randn(shape, &Device::Cpu)?
        .to_dtype(dtype)?
        .to(&cx.dev)
}

/// A leaf of `shape` in `dtype` on the device that needs a gradient.
fn leaf(cx: &Ctx, shape: &[usize], dtype: DType) -> Result<Tensor> {
    upstream(cx, shape, dtype)?.requires_grad_(true)
}

/// Times `f(leaves)` forward and its backward from `up` (or from the scalar `f`
/// returns, without `up`), clearing the leaves' gradients after each call.
fn piece(
    cx: &Ctx,
    name: String,
    work: Work,
    leaves: &[Tensor],
    up: Option<&Tensor>,
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
) -> Result<Row> {
    cx.row(name, work, || {
        let y = f(leaves)?;
        match up {
            Some(g) => y.backward_with(g)?,
            None => y.backward()?,
        }
        for t in leaves {
            t.zero_grad();
        }
        Ok(())
    })
}

/// The pieces of both models on one device: those whose name contains `filter`
/// where given (the others' inputs are not made).
pub(crate) fn suite(cx: &Ctx, filter: Option<&str>) -> Result<Vec<Row>> {
    let z = Sizes::of(cx);
    let keep = |name: &str| filter.is_none_or(|f| name.contains(f));
    let mut rows = Vec::new();
    ember::manual_seed(0);
    for (tag, dt) in [("f32", DType::F32), ("bf16", DType::BF16)] {
        let bytes = dt.size_in_bytes() as f64;
        // ResNet-50's: a 3x3 and a 1x1 convolution of its first stage, a 3x3 of
        // its third (padding keeps the size), with their input and weight
        // gradients; counted as 3 products of 2·B·O·H·W·C·k·k; row-major, then
        // channels-last (input, weight and gradients) with cuDNN's algorithms
        // timed, as the models suite's channels-last rows run them
        let b = z.batch;
        for (format, (k, c, o, hw)) in [MemoryFormat::Contiguous, MemoryFormat::ChannelsLast]
            .into_iter()
            .flat_map(|f| {
                [
                    (3, 64, 64, z.hw[0]),
                    (1, 256, 64, z.hw[0]),
                    (3, 256, 256, z.hw[1]),
                ]
                .map(|shape| (f, shape))
            })
        {
            let cl = format == MemoryFormat::ChannelsLast;
            let name = format!(
                "conv {k}x{k} {c}->{o} at {hw}x{hw} b{b}{} fwd+bwd {tag}",
                if cl { " channels-last" } else { "" }
            );
            if !keep(&name) {
                continue;
            }
            let laid = |t: Tensor| t.detach().to_memory_format(format)?.requires_grad_(true);
            let x = laid(leaf(cx, &[b, c, hw, hw], dt)?)?;
            let w = laid(leaf(cx, &[o, c, k, k], dt)?)?;
            let up = upstream(cx, &[b, o, hw, hw], dt)?.to_memory_format(format)?;
            let opts = Conv2dOptions {
                padding: (k / 2, k / 2),
                ..Conv2dOptions::default()
            };
            let flops = 3.0 * 2.0 * (b * o * hw * hw * c * k * k) as f64;
            let timed = ember::cuda::cudnn::benchmark();
            ember::cuda::cudnn::set_benchmark(timed || cl);
            let row = piece(cx, name, Work::Flops(flops), &[x, w], Some(&up), |t| {
                t[0].conv2d(&t[1], None, opts)
            });
            ember::cuda::cudnn::set_benchmark(timed);
            rows.push(row?);
        }
        // batch norm in training (running statistics updated) over 256 channels
        // of the first stage, with its weight and bias gradients; its parameters
        // and statistics in float32 whatever the input (as a model's under
        // autocast); counted as the 8 passes over the elements it needs
        // (statistics, normalisation; two sums and the input's gradient)
        // (and again channels-last, the input and its gradient [n, h, w, c] in
        // memory: the per-channel kernels' other layout)
        let shape = [b, 256, z.hw[0], z.hw[0]];
        let elems = shape.iter().product::<usize>() as f64;
        for format in [MemoryFormat::Contiguous, MemoryFormat::ChannelsLast] {
            let cl = if format == MemoryFormat::ChannelsLast {
                " channels-last"
            } else {
                ""
            };
            let name = format!(
                "batch norm 256ch at {0}x{0} b{b}{cl} fwd+bwd {tag}",
                z.hw[0]
            );
            if !keep(&name) {
                continue;
            }
            let x = upstream(cx, &shape, dt)?
                .to_memory_format(format)?
                .requires_grad_(true)?;
            let w = leaf(cx, &[256], DType::F32)?;
            let bias = leaf(cx, &[256], DType::F32)?;
            let up = upstream(cx, &shape, dt)?.to_memory_format(format)?;
            let mean = Tensor::zeros([256], DType::F32, &cx.dev)?;
            let var = Tensor::ones([256], DType::F32, &cx.dev)?;
            rows.push(piece(
                cx,
                name,
                Work::Bytes(8.0 * bytes * elems),
                &[x, w, bias],
                Some(&up),
                |t| {
                    let opts = BatchNormOptions {
                        running_mean: Some(&mean),
                        running_var: Some(&var),
                        training: true,
                        ..Default::default()
                    };
                    batch_norm(&t[0], Some(&t[1]), Some(&t[2]), opts)
                },
            )?);
        }
        // ReLU over the same elements (out of place); 5 passes (x in, y out;
        // the gradient and y in, the input's gradient out)
        let name = format!("relu {b}x256x{0}x{0} fwd+bwd {tag}", z.hw[0]);
        if keep(&name) {
            let x = leaf(cx, &shape, dt)?;
            let up = upstream(cx, &shape, dt)?;
            rows.push(piece(
                cx,
                name,
                Work::Bytes(5.0 * bytes * elems),
                &[x],
                Some(&up),
                |t| t[0].relu(),
            )?);
        }

        // GPT-2 small's: causal attention, counted as FlashAttention counts it
        // (4·B·H·L·S·d forward, 2.5 times that backward, halved by the mask)
        // (and on a GPU in half precision again through cuDNN's fused engines,
        // `cudnn::set_attention(true)`: PyTorch's row of that name runs its
        // cuDNN attention backend)
        let [ab, ah, al, ad] = z.attention;
        let half = dt != DType::F32 && cx.dev.is_cuda();
        for library in [false, true].into_iter().filter(|&l| !l || half) {
            let name = format!(
                "attention causal {ab}x{ah}x{al}x{ad} fwd+bwd {tag}{}",
                if library { " cudnn" } else { "" }
            );
            if !keep(&name) {
                continue;
            }
            let qkv: Vec<Tensor> = (0..3)
                .map(|_| leaf(cx, &z.attention, dt))
                .collect::<Result<_>>()?;
            let up = upstream(cx, &z.attention, dt)?;
            let passes = ember::cuda::cudnn::attention_passes();
            let row = super::models::with_cudnn_attention(library, || {
                piece(
                    cx,
                    name.clone(),
                    Work::Flops(3.5 * 4.0 * (ab * ah * al * al * ad) as f64 / 2.0),
                    &qkv,
                    Some(&up),
                    |t| {
                        ember::nn::scaled_dot_product_attention(
                            &t[0], &t[1], &t[2], None, 0.0, true, None,
                        )
                    },
                )
            });
            if library {
                super::models::warn_unless_cudnn_attention_ran(&name, passes);
            }
            rows.push(row?);
        }
        // layer norm with its weight and bias: 5 passes (x in, y out; the
        // gradient and x in, the input's gradient out)
        let (n, d, h) = (z.tokens, z.width, z.hidden);
        let name = format!("layer norm {n}x{d} fwd+bwd {tag}");
        if keep(&name) {
            let x = leaf(cx, &[n, d], dt)?;
            let (w, bias) = (leaf(cx, &[d], dt)?, leaf(cx, &[d], dt)?);
            let up = upstream(cx, &[n, d], dt)?;
            rows.push(piece(
                cx,
                name,
                Work::Bytes(5.0 * bytes * (n * d) as f64),
                &[x, w, bias],
                Some(&up),
                |t| ember::nn::layer_norm(&t[0], &[d], Some(&t[1]), Some(&t[2]), 1e-5),
            )?);
        }
        // GELU (erf) over the MLP's hidden activations: 5 passes
        let name = format!("gelu {n}x{h} fwd+bwd {tag}");
        if keep(&name) {
            let x = leaf(cx, &[n, h], dt)?;
            let up_h = upstream(cx, &[n, h], dt)?;
            rows.push(piece(
                cx,
                name,
                Work::Bytes(5.0 * bytes * (n * h) as f64),
                &[x],
                Some(&up_h),
                |t| t[0].gelu(),
            )?);
        }
        // the MLP's first linear layer with its bias: 3 products
        let name = format!("linear {n}x{d} -> {h} fwd+bwd {tag}");
        if keep(&name) {
            let x = leaf(cx, &[n, d], dt)?;
            let (w, bias) = (leaf(cx, &[h, d], dt)?, leaf(cx, &[h], dt)?);
            let up_h = upstream(cx, &[n, h], dt)?;
            rows.push(piece(
                cx,
                name,
                Work::Flops(3.0 * 2.0 * (n * d * h) as f64),
                &[x, w, bias],
                Some(&up_h),
                |t| ember::nn::functional::linear(&t[0], &t[1], Some(&t[2])),
            )?);
        }
        // the loss over the vocabulary (mean over rows): 3 passes (the logits
        // read forward; read again and the gradient written backward)
        let (r, v) = (z.loss_rows, z.vocab);
        let name = format!("cross-entropy {r}x{v} fwd+bwd {tag}");
        if keep(&name) {
            let logits = leaf(cx, &[r, v], dt)?;
            let target = Tensor::randint(0, v as i64, [r], &cx.dev)?;
            rows.push(piece(
                cx,
                name,
                Work::Bytes(3.0 * bytes * (r * v) as f64),
                &[logits],
                None,
                |t| ember::nn::cross_entropy(&t[0], &target),
            )?);
        }
    }
    Ok(rows)
}
