//! The `meta` device: every public op gives the CPU's shape and dtype (and the
//! CPU's errors for bad input), autograd and optimizers run, values cannot be read,
//! printing shows the size, the accounting hook sees every allocation with its
//! phase and module, and a model built on meta moves to a device with `to_empty`.

use ember::nn::{self, Module, Reduction};
use ember::optim::{Adam, Optimizer, Sgd};
use ember::prelude::*;
use ember::Operand;
use std::sync::{Arc, Mutex};

const META: Device = Device::Meta;

/// Tests that seed the CPU's generator and draw from it hold this, so that no other
/// test draws in between.
fn rng_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

type Op = fn(&[Tensor]) -> Result<Vec<Tensor>>;

fn one(r: Result<Tensor>) -> Result<Vec<Tensor>> {
    r.map(|t| vec![t])
}

/// Inputs every op below draws from, made on the CPU (seeded) and moved to `dev`.
fn inputs(dev: &Device) -> Result<Vec<Tensor>> {
    ember::manual_seed(3);
    let cpu = Device::Cpu;
    let ts = vec![
        Tensor::randn([3, 4], &cpu)?,       // 0: x
        Tensor::randn([4], &cpu)?,          // 1: row
        Tensor::randn([4, 5], &cpu)?,       // 2: w
        Tensor::randn([2, 3, 6, 6], &cpu)?, // 3: images
        Tensor::randn([4, 3, 3, 3], &cpu)?, // 4: conv weight
        Tensor::randn([4], &cpu)?,          // 5: conv bias
        Tensor::new([2i64, 0, 1], &cpu)?,   // 6: index
        Tensor::new([[0i64, 1, 2, 3], [3, 2, 1, 0], [1, 1, 1, 1]], &cpu)?, // 7: index2d
        Tensor::randn([3, 4], &cpu)?.gt(0.0)?, // 8: mask
        Tensor::new([[1u8, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]], &cpu)?, // 9: u8
        Tensor::randn([2, 3, 4], &cpu)?.to_dtype(DType::F64)?, // 10: f64 batch
        Tensor::randn([2, 4, 5], &cpu)?.to_dtype(DType::F64)?, // 11: f64 batch 2
        Tensor::randn([3, 4], &cpu)?.to_dtype(DType::BF16)?, // 12: bf16
        Tensor::new([1i64, 3, 0], &cpu)?,   // 13: labels
        Tensor::rand([3, 4], &cpu)?,        // 14: probabilities
    ];
    ts.iter().map(|t| t.to(dev)).collect()
}

/// Every public tensor op, on the inputs above.
fn ops() -> Vec<(&'static str, Op)> {
    vec![
        // elementwise, with broadcasting, scalars and promotion
        ("add", |t| one(t[0].add(&t[1]))),
        ("sub scalar", |t| one(t[0].sub(2.5))),
        ("mul u8 by f32", |t| one(t[9].mul(&t[0]))),
        ("div ints", |t| one(t[9].div(&t[9]))),
        ("maximum", |t| one(t[0].maximum(&t[1]))),
        ("minimum scalar", |t| one(t[0].minimum(0.0))),
        ("pow tensor", |t| one(t[14].pow(&t[14]))),
        ("pow scalar", |t| one(t[0].pow(2.0))),
        ("pow int", |t| one(t[9].pow(2i64))),
        ("neg", |t| one(t[0].neg())),
        ("abs", |t| one(t[9].abs())),
        ("exp of ints", |t| one(t[9].exp())),
        ("log", |t| one(t[14].log())),
        ("sqrt", |t| one(t[14].sqrt())),
        ("tanh", |t| one(t[0].tanh())),
        ("sin", |t| one(t[0].sin())),
        ("cos", |t| one(t[0].cos())),
        ("recip", |t| one(t[14].recip())),
        ("square", |t| one(t[9].square())),
        ("relu", |t| one(t[0].relu())),
        ("sigmoid", |t| one(t[12].sigmoid())),
        ("erf", |t| one(t[0].erf())),
        ("gelu", |t| one(t[0].gelu())),
        ("gelu_tanh", |t| one(t[0].gelu_tanh())),
        ("silu", |t| one(t[0].silu())),
        ("hardsigmoid", |t| one(t[0].hardsigmoid())),
        ("hardswish", |t| one(t[0].hardswish())),
        ("softplus", |t| one(t[12].softplus(2.0, 5.0))),
        ("elu", |t| one(t[0].elu(1.0))),
        ("leaky_relu", |t| one(t[0].leaky_relu(0.01))),
        ("log1p", |t| one(t[14].log1p())),
        ("expm1 of ints", |t| one(t[9].expm1())),
        ("rsqrt", |t| one(t[14].rsqrt())),
        ("log2", |t| one(t[14].log2())),
        ("log10 of u8", |t| one(t[9].log10())),
        ("hardtanh", |t| one(t[0].hardtanh(-0.5, 0.5))),
        ("relu6 of u8", |t| one(t[9].relu6())),
        ("selu", |t| one(t[12].selu())),
        ("celu", |t| one(t[0].celu(0.5))),
        ("mish", |t| one(t[0].mish())),
        ("lerp", |t| one(t[0].lerp(&t[1], 0.3))),
        ("lerp tensor weight", |t| one(t[0].lerp(&t[1], &t[14]))),
        ("addcmul", |t| one(t[0].addcmul(&t[1], &t[9], 0.5))),
        ("addcdiv", |t| one(t[1].addcdiv(&t[0], &t[14], 2.0))),
        ("unbind", |t| t[3].unbind(1)),
        ("median", |t| one(t[12].median())),
        ("median_dim", |t| {
            t[0].median_dim(1, true).map(|(v, i)| vec![v, i])
        }),
        ("cosine_similarity", |t| {
            one(ember::nn::functional::cosine_similarity(
                &t[0], &t[1], -1, 1e-8,
            ))
        }),
        ("pairwise_distance", |t| {
            one(ember::nn::functional::pairwise_distance(
                &t[0], &t[1], 2.0, 1e-6, true,
            ))
        }),
        ("tan", |t| one(t[0].tan())),
        ("atan", |t| one(t[0].atan())),
        ("floor", |t| one(t[0].floor())),
        ("ceil of u8", |t| one(t[9].ceil())),
        ("trunc", |t| one(t[12].trunc())),
        ("round", |t| one(t[0].round())),
        ("sign", |t| one(t[0].sign())),
        ("sign of bools", |t| one(t[8].sign())),
        ("isnan", |t| one(t[0].isnan())),
        ("isinf of u8", |t| one(t[9].isinf())),
        ("isfinite", |t| one(t[12].isfinite())),
        ("nan_to_num", |t| {
            one(t[0].nan_to_num(0.0, None, Some(-1.0)))
        }),
        ("atan2", |t| one(t[0].atan2(&t[1]))),
        ("remainder", |t| one(t[0].remainder(&t[14]))),
        ("fmod scalar", |t| one(t[0].fmod(0.5))),
        ("floor_divide u8", |t| one(t[9].floor_divide(3i64))),
        ("flip", |t| one(t[3].flip([0, 2]))),
        ("roll", |t| one(t[3].roll(&[1, -2], &[0, 2]))),
        ("roll flattened", |t| one(t[0].roll(&[3], &[]))),
        ("repeat", |t| one(t[0].repeat(&[2, 1, 3]))),
        ("tril", |t| one(t[3].tril(0))),
        ("triu of bools", |t| one(t[8].triu(1))),
        ("pad constant", |t| {
            one(t[3].pad(&[1, 2, -1, 0], ember::PadMode::Constant(0.5)))
        }),
        ("pad reflect", |t| {
            one(t[10].pad(&[2, 1], ember::PadMode::Reflect))
        }),
        ("pad replicate", |t| {
            one(t[10].pad(&[1, 1, 1, 1], ember::PadMode::Replicate))
        }),
        ("pad circular", |t| {
            one(t[10].pad(&[1, 2], ember::PadMode::Circular))
        }),
        ("clamp", |t| one(t[0].clamp(Some(-0.5), Some(0.5)))),
        ("clamp int by float", |t| one(t[9].clamp_min(2.5))),
        ("clamp_max", |t| one(t[9].clamp_max(4.0))),
        ("clamp_tensor", |t| {
            one(t[0].clamp_tensor(Some(&t[1]), Some(&t[5])))
        }),
        ("clamp_tensor int", |t| {
            one(t[9].clamp_tensor(None, Some(&t[7])))
        }),
        ("cumsum_dtype", |t| one(t[9].cumsum_dtype(1, DType::U8))),
        ("cumprod_dtype", |t| one(t[0].cumprod_dtype(0, DType::F64))),
        ("prod_dtype", |t| one(t[0].prod_dtype(1, true, DType::Bool))),
        ("prod_all_dtype", |t| one(t[9].prod_all_dtype(DType::I64))),
        ("eq", |t| one(t[0].eq(&t[1]))),
        ("ne scalar", |t| one(t[9].ne(3i64))),
        ("lt", |t| one(t[0].lt(0.0))),
        ("le", |t| one(t[0].le(&t[0]))),
        ("gt", |t| one(t[12].gt(0.0))),
        ("ge", |t| one(t[9].ge(&t[9]))),
        ("where", |t| one(t[8].where_(&t[0], &t[1]))),
        ("where scalars", |t| one(t[8].where_(1.0, 0i64))),
        ("masked_fill", |t| one(t[0].masked_fill(&t[8], -1.0))),
        ("logical_not", |t| one(t[9].logical_not())),
        ("logical_and", |t| one(t[8].logical_and(&t[9]))),
        ("logical_or", |t| one(t[8].logical_or(&t[8]))),
        ("logical_xor", |t| one(t[0].logical_xor(&t[9]))),
        ("to_dtype", |t| one(t[0].to_dtype(DType::F16))),
        ("contiguous", |t| one(t[0].t()?.contiguous())),
        ("copy", |t| one(t[0].copy())),
        ("copy_", |t| {
            let dst = t[0].zeros_like()?;
            dst.copy_(&t[1])?;
            Ok(vec![dst])
        }),
        ("add_", |t| {
            let dst = t[0].copy()?;
            dst.add_(&t[1])?;
            dst.mul_(2.0)?;
            Ok(vec![dst])
        }),
        ("operators", |t| Ok(vec![&(&t[0] * 2.0) + &t[1], -&t[0]])),
        // reductions
        ("sum_all ints", |t| one(t[9].sum_all())),
        ("sum dims", |t| one(t[3].sum([0, 2], true))),
        ("mean", |t| one(t[3].mean(-1, false))),
        ("mean_all", |t| one(t[12].mean_all())),
        ("max", |t| one(t[0].max(1, true))),
        ("max_all", |t| one(t[9].max_all())),
        ("min", |t| one(t[0].min(0, false))),
        ("min_all", |t| one(t[0].min_all())),
        ("argmax", |t| one(t[0].argmax(1, false))),
        ("argmax_all", |t| one(t[3].argmax_all())),
        ("argmin", |t| one(t[9].argmin(0, true))),
        ("argmin_all", |t| one(t[0].argmin_all())),
        ("max_dim", |t| {
            t[0].max_dim(1, false).map(|(a, b)| vec![a, b])
        }),
        ("min_dim", |t| {
            t[0].min_dim(0, true).map(|(a, b)| vec![a, b])
        }),
        ("var", |t| one(t[3].var([1, 2], false))),
        ("var_all", |t| one(t[0].var_all())),
        ("var_correction", |t| one(t[0].var_correction(1, 0.0, true))),
        ("std", |t| one(t[0].std(0, false))),
        ("std_all", |t| one(t[0].std_all())),
        ("std_correction", |t| {
            one(t[10].std_correction(-1, 2.0, false))
        }),
        ("bmm", |t| one(t[10].bmm(&t[11]))),
        ("outer", |t| one(t[13].outer(&t[13]))),
        ("einsum", |t| {
            one(Tensor::einsum("bij,bjk->bki", &[&t[10], &t[11]]))
        }),
        ("einsum ellipsis", |t| {
            one(Tensor::einsum("...i,...i", &[&t[0], &t[1]]))
        }),
        ("sort", |t| t[0].sort(1, false).map(|(v, i)| vec![v, i])),
        ("argsort", |t| one(t[9].argsort(0, true))),
        ("topk", |t| t[3].topk(2, -1, true).map(|(v, i)| vec![v, i])),
        ("multinomial", |t| one(t[14].multinomial(2, false))),
        ("embedding", |t| {
            one(ember::nn::embedding(&t[13], &t[0].t()?, Some(1)))
        }),
        ("group_norm", |t| {
            one(ember::nn::group_norm(
                &t[3],
                3,
                Some(&t[3].select(0, 0)?.select(1, 0)?.select(1, 0)?),
                None,
                1e-5,
            ))
        }),
        ("layer_norm", |t| {
            one(ember::nn::layer_norm(&t[3], &[6, 6], None, None, 1e-5))
        }),
        ("rms_norm", |t| {
            one(ember::nn::rms_norm(&t[12], &[4], None, None))
        }),
        ("dropout", |t| one(ember::nn::dropout(&t[0], 0.3, true))),
        ("sdpa causal", |t| {
            one(ember::nn::scaled_dot_product_attention(
                &t[10],
                &t[10],
                &t[11].narrow(1, 0, 3)?,
                None,
                0.1,
                true,
                None,
            ))
        }),
        ("cross_entropy_opts spatial", |t| {
            let target = t[3].select(1, 0)?.gt(0.0)?.to_dtype(DType::I64)?;
            let opts = nn::LossOptions {
                label_smoothing: 0.1,
                ..Default::default()
            };
            one(nn::cross_entropy_opts(&t[3], &target, opts))
        }),
        ("cross_entropy probabilities", |t| {
            one(nn::cross_entropy(&t[0], &t[14]))
        }),
        ("bce pos_weight", |t| {
            one(nn::bce_with_logits_opts(
                &t[0],
                &t[14],
                None,
                Some(&t[1]),
                Reduction::Sum,
            ))
        }),
        ("conv2d_same", |t| {
            one(t[3].conv2d_same(&t[4], Some(&t[5]), (1, 1), 1))
        }),
        ("cumsum", |t| one(t[3].cumsum(1))),
        ("cumsum of bools", |t| one(t[8].cumsum(0))),
        ("cumprod", |t| one(t[12].cumprod(-1))),
        ("prod", |t| one(t[0].prod(1, true))),
        ("prod_all of u8", |t| one(t[9].prod_all())),
        ("all", |t| one(t[9].all(0, false))),
        ("any", |t| one(t[0].any([0, 1], true))),
        ("all_all", |t| one(t[8].all_all())),
        ("any_all", |t| one(t[9].any_all())),
        ("logsumexp", |t| one(t[3].logsumexp([0, 2], false))),
        ("vector_norm", |t| one(t[10].vector_norm(3.0, [1], true))),
        ("norm", |t| one(t[0].norm())),
        ("softmax", |t| one(t[3].softmax(1))),
        ("log_softmax", |t| one(t[12].log_softmax(-1))),
        // linear algebra, convolution, pooling
        ("matmul", |t| one(t[0].matmul(&t[2]))),
        ("matmul vec", |t| one(t[1].matmul(&t[2]))),
        ("matmul batched", |t| one(t[10].matmul(&t[11]))),
        ("matmul ints", |t| one(t[9].matmul(&t[9].t()?))),
        ("conv2d", |t| {
            one(t[3].conv2d(&t[4], Some(&t[5]), Conv2dOptions::default().padding(1)))
        }),
        ("conv2d strided", |t| {
            one(t[3].conv2d(&t[4], None, Conv2dOptions::default().stride(2)))
        }),
        ("conv2d groups", |t| {
            let w = t[4].narrow(0, 0, 3)?.narrow(1, 0, 1)?;
            one(t[3].conv2d(&w, None, Conv2dOptions::default().groups(3)))
        }),
        (
            "max_pool2d",
            |t| one(t[3].max_pool2d(Pool2dOptions::new(2))),
        ),
        ("max_pool2d ceil", |t| {
            one(t[3].max_pool2d(Pool2dOptions::new(4).stride(3).ceil_mode(true)))
        }),
        ("avg_pool2d", |t| {
            one(t[3].avg_pool2d(Pool2dOptions::new(3).stride(2).padding(1)))
        }),
        // the layers of gen_nn.py's `layers2`
        ("interpolate bilinear", |t| {
            let o = nn::functional::InterpolateOptions::scale_factor(1.5)
                .mode(nn::functional::InterpolateMode::Bilinear);
            one(nn::functional::interpolate(&t[3], &o))
        }),
        ("interpolate nearest", |t| {
            let o = nn::functional::InterpolateOptions::size([4, 9]);
            one(nn::functional::interpolate(&t[3], &o))
        }),
        ("conv_transpose2d", |t| {
            let o = nn::ConvTranspose2dOptions::default()
                .stride(2)
                .padding(1)
                .output_padding(1);
            one(t[3].conv_transpose2d(&t[4].narrow(0, 0, 3)?, Some(&t[5].narrow(0, 0, 3)?), o))
        }),
        ("conv1d", |t| {
            let w = t[10].narrow(2, 0, 2)?;
            one(nn::functional::conv1d(
                &t[10],
                &w,
                None,
                nn::Conv1dOptions::default(),
            ))
        }),
        ("prelu", |t| {
            one(nn::functional::prelu(&t[3], &t[5].narrow(0, 0, 3)?))
        }),
        ("instance_norm", |t| {
            let w = t[5].narrow(0, 0, 3)?;
            one(nn::functional::instance_norm(
                &t[3],
                Some(&w),
                None,
                Default::default(),
            ))
        }),
        // views, joins, splits
        ("reshape", |t| one(t[3].reshape([6, -1]))),
        ("view", |t| one(t[0].view([2, 6]))),
        ("flatten", |t| one(t[3].flatten(1, -1))),
        ("flatten_all", |t| one(t[3].flatten_all())),
        ("squeeze", |t| one(t[0].unsqueeze(0)?.squeeze(0))),
        ("squeeze_all", |t| {
            one(t[0].reshape([1, 3, 1, 4])?.squeeze_all())
        }),
        ("unsqueeze", |t| one(t[1].unsqueeze(-1))),
        ("transpose", |t| one(t[3].transpose(1, 3))),
        ("t", |t| one(t[0].t())),
        ("permute", |t| one(t[3].permute([3, 0, 2, 1]))),
        ("narrow", |t| one(t[0].narrow(1, 1, 2))),
        ("slice", |t| one(t[3].slice(2, Some(1), None, 2))),
        ("select", |t| one(t[3].select(1, -1))),
        ("i", |t| one(t[3].i((.., 1..3, 2)))),
        ("expand", |t| one(t[1].expand([3, 4]))),
        ("broadcast_to", |t| one(t[1].broadcast_to([2, 3, 4]))),
        ("cat", |t| one(Tensor::cat(&[&t[0], &t[9]], 0))),
        ("stack", |t| one(Tensor::stack(&[&t[0], &t[0]], 1))),
        ("split", |t| t[0].split(3, 1)),
        ("split_with_sizes", |t| t[0].split_with_sizes(&[1, 2], 0)),
        ("chunk", |t| t[3].chunk(4, 3)),
        // index ops
        ("index_select", |t| one(t[0].index_select(0, &t[6]))),
        ("gather", |t| one(t[0].gather(1, &t[7]))),
        ("scatter_add", |t| {
            one(t[0].zeros_like()?.scatter_add(1, &t[7], &t[0]))
        }),
        ("one_hot", |t| one(t[6].one_hot(4))),
        ("index_add", |t| one(t[0].index_add(0, &t[6], &t[0], 2.0))),
        ("index_add_", |t| {
            let dst = t[0].copy()?;
            dst.index_add_(1, &t[13], &t[0].narrow(1, 0, 3)?, 1)?;
            Ok(vec![dst])
        }),
        // creation on the device of the inputs
        ("zeros_like", |t| one(t[9].zeros_like())),
        ("ones_like", |t| one(t[0].ones_like())),
        ("full_like", |t| one(t[12].full_like(7.0))),
        ("rand_like", |t| one(t[10].rand_like())),
        ("randn_like", |t| one(t[0].randn_like())),
        ("empty_like", |t| one(t[9].empty_like())),
        ("creation", |t| {
            let d = t[0].device();
            Ok(vec![
                Tensor::zeros([2, 3], DType::I64, &d)?,
                Tensor::ones([4], DType::Bool, &d)?,
                Tensor::full([2, 2], 3.5, DType::F64, &d)?,
                Tensor::scalar(2.5f32, &d)?,
                Tensor::new([[1u8, 2], [3, 4]], &d)?,
                Tensor::from_vec(vec![1i64, 2, 3], [3], &d)?,
                Tensor::from_slice(&[1f64, 2.0], [2, 1], &d)?,
                Tensor::arange(0i64, 10, &d)?,
                Tensor::arange_step(0.0, 1.0, 0.25, DType::F32, &d)?,
                Tensor::linspace(0.0, 1.0, 5, DType::BF16, &d)?,
                Tensor::eye(3, DType::F32, &d)?,
                Tensor::eye_rect(2, 4, DType::U8, &d)?,
                Tensor::rand([2, 2], &d)?,
                Tensor::randn([3], &d)?,
                Tensor::uniform(-1.0, 1.0, [2], DType::F16, &d)?,
                Tensor::normal(0.0, 2.0, [2], DType::F64, &d)?,
                Tensor::randint(0, 10, [5], &d)?,
                Tensor::randperm(6, &d)?,
                Tensor::empty([2, 0, 3], DType::F32, &d)?,
            ])
        }),
        // losses
        ("cross_entropy", |t| one(nn::cross_entropy(&t[0], &t[13]))),
        ("cross_entropy smoothed sum", |t| {
            one(nn::cross_entropy_with(&t[0], &t[13], Reduction::Sum, 0.1))
        }),
        ("nll_loss", |t| {
            one(nn::nll_loss(&t[0].log_softmax(1)?, &t[13], Reduction::None))
        }),
        ("mse_loss", |t| {
            one(nn::mse_loss(&t[0], &t[14], Reduction::Mean))
        }),
        ("bce_with_logits", |t| {
            one(nn::bce_with_logits(&t[0], &t[14], Reduction::Mean))
        }),
    ]
}

/// Every op gives on meta the shape and dtype it gives on the CPU, on meta.
#[test]
fn every_op_on_meta_has_the_cpus_shape_and_dtype() -> Result<()> {
    let _g = rng_lock();
    let (cpu_in, meta_in) = (inputs(&Device::Cpu)?, inputs(&META)?);
    let ops = ops();
    assert!(ops.len() > 110, "{} ops", ops.len());
    for (name, op) in ops {
        let want = op(&cpu_in)?;
        let got = op(&meta_in).unwrap_or_else(|e| panic!("{name} on meta: {e}"));
        assert_eq!(got.len(), want.len(), "{name}: number of outputs");
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.device(), META, "{name} [{k}] left meta");
            assert_eq!(g.shape(), w.shape(), "{name} [{k}]: shape");
            assert_eq!(g.dtype(), w.dtype(), "{name} [{k}]: dtype");
            assert_eq!(g.stride(), w.stride(), "{name} [{k}]: strides");
        }
    }
    Ok(())
}

/// Bad input is refused on meta with the error the CPU gives (same kind, same
/// message), never a panic.
#[test]
fn bad_input_on_meta_gives_the_cpus_errors() -> Result<()> {
    let _g = rng_lock();
    let (cpu_in, meta_in) = (inputs(&Device::Cpu)?, inputs(&META)?);
    let bad: Vec<(&str, Op)> = vec![
        ("broadcast", |t| one(t[0].add(&t[2]))),
        ("matmul shapes", |t| one(t[0].matmul(&t[0]))),
        ("matmul dtypes", |t| one(t[0].matmul(&t[10]))),
        ("dim out of range", |t| one(t[0].sum(2, false))),
        ("repeated dim", |t| one(t[0].sum([1, -1], false))),
        ("softmax of ints", |t| one(t[9].softmax(0))),
        ("mean of ints", |t| one(t[9].mean_all())),
        ("bool subtraction", |t| one(t[8].sub(&t[8]))),
        ("negative int power", |t| one(t[9].pow(-1i64))),
        ("where without bools", |t| one(t[0].where_(&t[0], &t[0]))),
        ("reshape", |t| one(t[0].reshape([5, -1]))),
        ("view of a transpose", |t| one(t[0].t()?.view([12]))),
        ("narrow past the end", |t| one(t[0].narrow(1, 3, 2))),
        ("expand", |t| one(t[0].expand([3, 5]))),
        ("cat ranks", |t| one(Tensor::cat(&[&t[0], &t[1]], 0))),
        ("stack shapes", |t| one(Tensor::stack(&[&t[0], &t[2]], 0))),
        ("conv2d channels", |t| {
            one(t[0]
                .reshape([1, 1, 3, 4])?
                .conv2d(&t[4], None, Conv2dOptions::default()))
        }),
        ("conv2d kernel too large", |t| {
            let x = t[3].narrow(2, 0, 2)?;
            one(x.conv2d(&t[4], None, Conv2dOptions::default()))
        }),
        ("max_pool2d of bools", |t| {
            one(t[9]
                .reshape([1, 3, 4])?
                .gt(0)?
                .max_pool2d(Pool2dOptions::new(2)))
        }),
        ("index_select of floats", |t| {
            one(t[0].index_select(0, &t[1]))
        }),
        ("gather shape", |t| one(t[0].gather(0, &t[6]))),
        ("one_hot of floats", |t| one(t[0].one_hot(3))),
        ("cross_entropy target", |t| {
            one(nn::cross_entropy(&t[0], &t[1].narrow(0, 0, 3)?))
        }),
        ("mse shapes", |t| {
            one(nn::mse_loss(&t[0], &t[2], Reduction::Mean))
        }),
        ("in-place broadcast", |t| t[1].add_(&t[0]).map(|()| vec![])),
        ("in-place cast", |t| t[9].add_(0.5).map(|()| vec![])),
        ("requires_grad of ints", |t| {
            one(t[9].clone().requires_grad_(true))
        }),
        ("backward of a non-scalar", |t| {
            let x = t[0].copy()?.requires_grad_(true)?;
            x.mul(2.0)?.backward().map(|()| vec![])
        }),
    ];
    for (name, op) in bad {
        let want = op(&cpu_in)
            .err()
            .unwrap_or_else(|| panic!("{name}: the CPU accepts it"));
        let got = op(&meta_in)
            .err()
            .unwrap_or_else(|| panic!("{name}: meta accepts it"));
        assert_eq!(
            std::mem::discriminant(&got),
            std::mem::discriminant(&want),
            "{name}: {got} vs {want}"
        );
        assert_eq!(got.to_string(), want.to_string(), "{name}");
    }
    // mixing meta with another device is PyTorch's device error
    let e = meta_in[0].add(&cpu_in[0]).unwrap_err();
    assert!(matches!(e, ember::Error::DeviceMismatch { .. }), "{e}");
    Ok(())
}

#[test]
fn meta_tensors_have_no_values_to_read() -> Result<()> {
    let t = Tensor::ones([2, 3], DType::F32, &META)?;
    let no_data = |r: Result<()>, what: &str| match r {
        Err(ember::Error::MetaNoData { .. }) => {}
        other => panic!("{what}: {other:?}"),
    };
    no_data(t.to_vec::<f32>().map(drop), "to_vec");
    no_data(t.to_vec2::<f32>().map(drop), "to_vec2");
    no_data(t.sum_all()?.item::<f32>().map(drop), "item");
    no_data(t.to(&Device::Cpu).map(drop), "to(cpu)");
    no_data(t.allclose(&t, 0.0, 0.0).map(drop), "allclose");
    // output sizes that depend on the values (PyTorch's meta device cannot size
    // them either)
    no_data(t.nonzero().map(drop), "nonzero");
    no_data(t.masked_select(&t.gt(0.0)?).map(drop), "masked_select");
    let e = t.sum_all()?.item::<f32>().unwrap_err().to_string();
    assert!(e.starts_with("item: meta tensors have no data"), "{e}");
    // like PyTorch, item() of several elements is the size error first
    let e = t.item::<f32>().unwrap_err().to_string();
    assert!(e.contains("6 elements"), "{e}");
    // and a module on meta points at to_empty
    let mut m = nn::Linear::new(3, 2, &META)?;
    let e = m.to_device(&Device::Cpu).unwrap_err().to_string();
    assert!(e.contains("to_empty"), "{e}");
    Ok(())
}

#[test]
fn meta_tensors_print_their_size() -> Result<()> {
    let cases: Vec<(Tensor, &str)> = vec![
        (
            Tensor::zeros([2, 3], DType::F32, &META)?,
            "tensor(..., device='meta', size=(2, 3))",
        ),
        (
            Tensor::zeros([2], DType::I64, &META)?,
            "tensor(..., device='meta', size=(2,), dtype=int64)",
        ),
        (
            Tensor::zeros([2], DType::Bool, &META)?,
            "tensor(..., device='meta', size=(2,), dtype=bool)",
        ),
        (
            Tensor::scalar(1.0f64, &META)?,
            "tensor(..., device='meta', size=(), dtype=float64)",
        ),
        (
            Tensor::zeros([0], DType::F32, &META)?,
            "tensor(..., device='meta', size=(0,))",
        ),
        (
            Tensor::zeros([3, 2], DType::F32, &META)?.t()?,
            "tensor(..., device='meta', size=(2, 3))",
        ),
    ];
    for (t, want) in cases {
        assert_eq!(t.to_string(), want);
    }
    Ok(())
}

/// The digits CNN of `ember train digits` on `dev`.
fn digits_cnn(dev: &Device) -> Result<nn::Sequential> {
    ember::models::digits_cnn(dev)
}

/// A whole training step runs on meta: forward, loss, backward, optimizer step
/// (twice, so the optimizer state exists); gradients are meta tensors of the
/// parameters' shapes.
#[test]
fn a_training_step_of_the_digits_cnn_runs_on_meta() -> Result<()> {
    let model = digits_cnn(&META)?;
    let params = model.parameters();
    assert!(params
        .iter()
        .all(|p| p.device() == META && p.requires_grad()));
    let x = Tensor::randn([64, 1, 8, 8], &META)?;
    let y = Tensor::randint(0, 10, [64], &META)?;
    for mut opt in [
        Box::new(Adam::new(params.clone(), 1e-3)?) as Box<dyn Optimizer>,
        Box::new(Sgd::new(params.clone(), 0.1)?.momentum(0.9)?),
    ] {
        for _ in 0..2 {
            opt.zero_grad();
            let logits = model.forward(&x)?;
            assert_eq!((logits.shape(), logits.device()), (&[64, 10][..], META));
            let loss = nn::cross_entropy(&logits, &y)?;
            assert_eq!(loss.shape(), &[] as &[usize]);
            loss.backward()?;
            for p in &params {
                let g = p.grad().expect("a gradient");
                assert_eq!(
                    (g.shape(), g.dtype(), g.device()),
                    (p.shape(), p.dtype(), META)
                );
            }
            opt.step()?;
        }
        let state = opt.state()?;
        assert!(state.iter().any(|(_, t)| t.device() == META));
    }
    Ok(())
}

/// What the hook heard.
#[derive(Default)]
struct Log {
    events: Mutex<Vec<(bool, usize, ember::meta::Phase, String)>>,
}

impl ember::meta::AllocHook for Log {
    fn alloc(&self, e: &ember::meta::MetaEvent) {
        let mut v = self.events.lock().unwrap();
        v.push((true, e.bytes, e.phase, e.module.to_string()));
    }
    fn free(&self, e: &ember::meta::MetaEvent) {
        let mut v = self.events.lock().unwrap();
        v.push((false, e.bytes, e.phase, e.module.to_string()));
    }
}

/// The hook sees each allocation with its bytes, the phase and the module, and
/// each free once; what a step allocates and frees balances.
#[test]
fn the_hook_sees_every_meta_allocation_with_phase_and_module() -> Result<()> {
    use ember::meta::Phase;
    let model = digits_cnn(&META)?;
    let mut opt = Adam::new(model.parameters(), 1e-3)?;
    let x = Tensor::randn([32, 1, 8, 8], &META)?;
    let y = Tensor::randint(0, 10, [32], &META)?;
    let log = Arc::new(Log::default());
    ember::meta::with_hook(log.clone(), || -> Result<()> {
        let loss = nn::cross_entropy(&model.forward(&x)?, &y)?;
        loss.backward()?;
        opt.step()?;
        drop(loss);
        opt.zero_grad();
        Ok(())
    })?;
    let events = log.events.lock().unwrap();
    let allocs: Vec<_> = events.iter().filter(|e| e.0).collect();
    // the first conv's output: 32 × 16 × 8 × 8 floats, in module "0", forward
    assert!(allocs
        .iter()
        .any(|e| e.1 == 32 * 16 * 64 * 4 && e.2 == Phase::Forward && e.3 == "0"));
    // the pooling's index, kept for backward: each output's position in its
    // window, one byte each: 32 × 32 × 4 × 4 bytes
    assert!(allocs
        .iter()
        .any(|e| e.1 == 32 * 32 * 16 && e.2 == Phase::Forward && e.3 == "4"));
    for phase in [Phase::Forward, Phase::Backward, Phase::Optimizer] {
        assert!(allocs.iter().any(|e| e.2 == phase), "{phase:?}");
    }
    // Adam's moments: two per parameter, made in the optimizer's step
    let n_params = model.parameters().len();
    let params_bytes: usize = model.parameters().iter().map(|p| p.numel() * 4).sum();
    let moment_bytes: usize = allocs
        .iter()
        .filter(|e| e.2 == Phase::Optimizer)
        .map(|e| e.1)
        .sum();
    assert_eq!(moment_bytes, 2 * params_bytes, "{n_params} parameters");
    // everything made in the step went away but the moments (the gradients were
    // cleared by zero_grad); frees carry their bytes
    let made: usize = allocs.iter().map(|e| e.1).sum();
    let freed: usize = events.iter().filter(|e| !e.0).map(|e| e.1).sum();
    assert_eq!(made - freed, moment_bytes);
    Ok(())
}

/// A model built on meta (no memory, no random draws) moves to the CPU with
/// `to_empty`, and `reset_parameters` then gives what building it on the CPU gives
/// (the same draws in the same order).
#[test]
fn to_empty_and_reset_parameters_materialise_a_meta_model() -> Result<()> {
    let _g = rng_lock();
    let mut bn = nn::Sequential::new()
        .add(nn::Linear::new(4, 3, &META)?)
        .add(nn::BatchNorm1d::new(3, &META)?);
    bn.to_empty(&Device::Cpu)?;
    for (name, t) in bn.state_dict() {
        assert_eq!(t.device(), Device::Cpu, "{name}");
    }
    let built_on_meta = {
        let mut m = digits_cnn(&META)?;
        m.to_empty(&Device::Cpu)?;
        assert!(m
            .parameters()
            .iter()
            .all(|p| p.requires_grad() && p.is_leaf()));
        ember::manual_seed(42);
        m.reset_parameters()?;
        m
    };
    ember::manual_seed(42);
    let built_on_cpu = digits_cnn(&Device::Cpu)?;
    let (a, b) = (built_on_meta.state_dict(), built_on_cpu.state_dict());
    assert_eq!(a.len(), b.len());
    for ((na, ta), (nb, tb)) in a.iter().zip(&b) {
        assert_eq!(na, nb);
        assert_eq!(ta.to_vec::<f32>()?, tb.to_vec::<f32>()?, "{na}");
    }
    // and it trains
    let x = Tensor::randn([8, 1, 8, 8], &Device::Cpu)?;
    let loss = built_on_meta.forward(&x)?.sum_all()?;
    loss.backward()?;
    assert!(built_on_meta
        .parameters()
        .iter()
        .all(|p| p.grad().is_some()));
    Ok(())
}

/// `to(meta)` from a real device keeps the shape, dtype and strides, not the values;
/// gradients flow back to the source's device as meta tensors cannot.
#[test]
fn to_meta_keeps_the_metadata() -> Result<()> {
    let _g = rng_lock();
    let x = Tensor::randn([3, 4], &Device::Cpu)?.t()?;
    let m = x.to(&META)?;
    assert_eq!(
        (m.shape(), m.dtype(), m.device()),
        (&[4, 3][..], DType::F32, META)
    );
    // PyTorch's `preserve_format`: a dense layout keeps its strides
    assert_eq!(m.stride(), x.stride());
    assert!(!m.is_contiguous());
    let s = m.add(Operand::Scalar(ember::Scalar::Int(1)))?;
    assert_eq!(s.dtype(), DType::F32);
    Ok(())
}

/// A user's module that holds state but does not implement `to_empty`,
/// `to_device` or `reset_parameters` is told so rather than left where it was;
/// one without state needs none of them.
#[test]
fn the_default_to_empty_refuses_modules_with_state() -> Result<()> {
    struct Scale(Tensor);
    impl Module for Scale {
        fn forward(&self, x: &Tensor) -> Result<Tensor> {
            x.mul(&self.0)
        }
        fn named_parameters(&self) -> Vec<(String, Tensor)> {
            vec![("scale".into(), self.0.clone())]
        }
    }
    struct Double;
    impl Module for Double {
        fn forward(&self, x: &Tensor) -> Result<Tensor> {
            x.add(x)
        }
    }
    let mut s = Scale(Tensor::ones([3], DType::F32, &META)?);
    let err = s.to_empty(&Device::Cpu).unwrap_err().to_string();
    assert!(err.contains("to_empty"), "{err}");
    assert!(err.contains("does not implement"), "{err}");
    let err = s.reset_parameters().unwrap_err().to_string();
    assert!(err.contains("reset_parameters"), "{err}");
    let err = s.to_device(&Device::Cpu).unwrap_err().to_string();
    assert!(err.contains("to_device"), "{err}");
    assert!(err.contains("does not implement"), "{err}");
    assert_eq!(
        s.0.device(),
        META,
        "the failed calls left the module as it was"
    );
    let mut d = Double;
    d.to_empty(&Device::Cpu)?;
    d.to_device(&Device::Cpu)?;
    d.reset_parameters()?;
    // inside a container: refused before any child has moved or been cast
    let mut seq = nn::Sequential::new()
        .add(nn::Linear::new(2, 3, &Device::Cpu)?)
        .add(Scale(Tensor::ones([3], DType::F32, &Device::Cpu)?))
        .add(nn::Linear::new(3, 2, &Device::Cpu)?);
    let err = seq.to_device(&META).unwrap_err().to_string();
    assert!(err.contains("to_device"), "{err}");
    let err = seq.to_dtype(DType::F64).unwrap_err().to_string();
    assert!(err.contains("to_dtype"), "{err}");
    for p in seq.parameters() {
        assert_eq!((p.device(), p.dtype()), (Device::Cpu, DType::F32));
    }
    Ok(())
}
