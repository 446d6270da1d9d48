//! Gradients of gradients through the layers of convolutional networks and
//! transformers: the pools, batch normalisation, attention on its plain path,
//! sorting. Hessian-vector products against central differences (the check of
//! tests/tensor/double_backward.rs), a MAML step through a convolutional
//! classifier and a Hessian-vector product through causal attention against
//! PyTorch (tests/golden/gen_double_backward.py), and the ops that stay first
//! order.

use super::assert_close;
use super::double_backward::{check_hvp, create, input, Scalar};
use ember::autograd;
use ember::nn::functional::{self as F, AttentionPath, BatchNormOptions, Pool3dOptions};
use ember::nn::{BatchNorm2d, Pool1dOptions};
use ember::prelude::*;
use ember::{MemoryFormat, Pool2dOptions};

/// Max and average pooling (overlapping, padded, ceil mode, without the
/// padding in the count, a divisor override), the adaptive pools, 1-D and 3-D
/// pooling and max unpooling, each between nonlinear ops.
fn pools(x: &[Tensor]) -> Result<Tensor> {
    let a = &x[0]; // [1, 2, 5, 5]
    let s = a.sin()?;
    let m = s.max_pool2d(Pool2dOptions::new(3).stride(1).padding(1))?;
    let mut total = m.square()?.sum_all()?;
    let avg = Pool2dOptions::new(2)
        .padding(1)
        .ceil_mode(true)
        .count_include_pad(false);
    total = total.add(&a.mul(a)?.avg_pool2d(avg)?.tanh()?.sum_all()?)?;
    let divided = Pool2dOptions::new(2).divisor_override(3);
    total = total.add(&a.exp()?.avg_pool2d(divided)?.square()?.sum_all()?)?;
    let ad = F::adaptive_avg_pool2d(&a.cos()?, (3, 2))?;
    total = total.add(&ad.square()?.sum_all()?)?;
    let am = F::adaptive_max_pool2d(&a.mul(a)?, (2, 3))?;
    total = total.add(&am.sin()?.sum_all()?)?;
    let rows = a.reshape([2, 5, 5])?.tanh()?;
    let m1 = F::max_pool1d(&rows, Pool1dOptions::new(2).stride(1))?;
    total = total.add(&m1.square()?.sum_all()?)?;
    let v = a.reshape([1, 1, 2, 5, 5])?;
    let m3 = F::max_pool3d(&v.sin()?, Pool3dOptions::new(2))?;
    total = total.add(&m3.exp()?.sum_all()?)?;
    let a3 = F::avg_pool3d(&v.square()?, Pool3dOptions::new(2).stride(1))?;
    total = total.add(&a3.sin()?.sum_all()?)?;
    // channels-last inputs (pooled as they lie where the device can)
    let c = a.to_memory_format(MemoryFormat::ChannelsLast)?.sin()?;
    let mc = c.max_pool2d(Pool2dOptions::new(2).stride(1))?;
    let ac = c
        .mul(&c)?
        .avg_pool2d(Pool2dOptions::new(3).stride(2).padding(1))?;
    total = total
        .add(&mc.square()?.sum_all()?)?
        .add(&ac.exp()?.sum_all()?)?;
    // dilated windows reaching into the padding
    let dilated = Pool2dOptions::new(2).padding(1).dilation(4);
    total = total.add(&s.max_pool2d(dilated)?.tanh()?.sum_all()?)?;
    let (mp, at) = F::max_pool2d_with_indices(&s, Pool2dOptions::new(2))?;
    let size: &[usize] = &[5, 5];
    let un = F::max_unpool2d(&mp.mul(&mp)?, &at, Pool2dOptions::new(2), Some(size))?;
    total.add(&un.cos()?.mul(a)?.sum_all()?)
}

/// Batch normalisation with the batch's statistics (with a weight and a bias;
/// a 3-D input without them), with running statistics, and the layer's fused
/// ReLU and residual forms.
fn batch_norms(x: &[Tensor]) -> Result<Tensor> {
    let (a, w, b) = (&x[0], &x[1], &x[2]); // [3, 2, 2, 2], [2], [2]
    let dev = a.device();
    let train = BatchNormOptions {
        training: true,
        ..Default::default()
    };
    let y = F::batch_norm(&a.sin()?, Some(w), Some(b), train)?;
    let mut total = y.mul(a)?.tanh()?.sum_all()?;
    let y3 = F::batch_norm(&a.reshape([3, 2, 4])?.square()?, None, None, train)?;
    total = total.add(&y3.pow(3.0)?.sum_all()?)?;
    let rm = Tensor::from_vec(vec![0.1f64, -0.2], [2], &dev)?;
    let rv = Tensor::from_vec(vec![0.5f64, 1.5], [2], &dev)?;
    let eval = BatchNormOptions {
        running_mean: Some(&rm),
        running_var: Some(&rv),
        ..Default::default()
    };
    let ye = F::batch_norm(a, Some(&w.mul(w)?), Some(b), eval)?;
    total = total.add(&ye.sin()?.mul(a)?.sum_all()?)?;
    let cl = a.to_memory_format(MemoryFormat::ChannelsLast)?.tanh()?;
    let yc = F::batch_norm(&cl, Some(w), None, train)?;
    total = total.add(&yc.square()?.mul(a)?.sum_all()?)?;
    let mut layer = BatchNorm2d::new(2, &dev)?;
    layer.weight = Some(w.clone());
    layer.bias = Some(b.clone());
    (
        layer.running_mean,
        layer.running_var,
        layer.num_batches_tracked,
    ) = (None, None, None);
    let r = layer.forward_relu(&a.cos()?)?;
    total = total.add(&r.square()?.mul(a)?.sum_all()?)?;
    let fused = layer.forward_add_relu(&a.mul(a)?, &a.sin()?)?;
    total.add(&fused.exp()?.sum_all()?)
}

/// Attention on the plain path (`AttentionPath::Math`): unmasked, causal
/// with fewer queries than keys, a boolean mask and a scale.
fn attention(x: &[Tensor]) -> Result<Tensor> {
    let (q, k, v) = (&x[0], &x[1], &x[2]); // [1, 2, 3, 4], [1, 2, 5, 4], [1, 2, 5, 4]
    let dev = q.device();
    F::with_attention_path(AttentionPath::Math, || {
        let sdpa = F::scaled_dot_product_attention;
        let o = sdpa(q, k, v, None, 0.0, false, None)?;
        let c = sdpa(&q.sin()?, k, v, None, 0.0, true, None)?;
        let keep: Vec<bool> = (0..15).map(|i| i % 4 != 1).collect();
        let mask = Tensor::from_vec(keep, [3, 5], &dev)?;
        let m = sdpa(
            q,
            &k.mul(k)?,
            &v.tanh()?,
            Some(&mask),
            0.0,
            false,
            Some(0.3),
        )?;
        o.square()?
            .sum_all()?
            .add(&c.sin()?.sum_all()?)?
            .add(&m.mul(&m)?.sum_all()?)
    })
}

/// Sorting and its relatives: their values are gathers at the order found.
fn sorting(x: &[Tensor]) -> Result<Tensor> {
    let a = &x[0]; // [3, 4]
    let (s, _) = a.sin()?.sort(1, false)?;
    let weights = Tensor::arange(1.0f64, 5.0, &a.device())?;
    let mut total = s.square()?.mul(&weights)?.sum_all()?;
    let (t, _) = a.mul(a)?.topk(2, 0, true)?;
    total = total.add(&t.exp()?.sum_all()?)?;
    let (k, _) = a.tanh()?.kthvalue(2, 1, false)?;
    total.add(&k.pow(3.0)?.sum_all()?)
}

fn hvp_pools(dev: &Device) -> Result<()> {
    check_hvp("pools", pools, &[&[1, 2, 5, 5]], dev)
}

fn hvp_batch_norm(dev: &Device) -> Result<()> {
    check_hvp("batch_norm", batch_norms, &[&[3, 2, 2, 2], &[2], &[2]], dev)
}

fn hvp_attention(dev: &Device) -> Result<()> {
    let shapes: [&[usize]; 3] = [&[1, 2, 3, 4], &[1, 2, 5, 4], &[1, 2, 5, 4]];
    check_hvp("attention", attention, &shapes, dev)
}

fn hvp_sorting(dev: &Device) -> Result<()> {
    check_hvp("sorting", sorting, &[&[3, 4]], dev)
}

/// The ops that stay first order: their first gradient under `create_graph`
/// is the usual one; differentiating it is an error naming the op, raised
/// when a walk reaches it (a checkpointed region; attention's fused op, whose
/// error names the path that is twice differentiable).
fn not_twice_differentiable(dev: &Device) -> Result<()> {
    let x = input(&[2, 3], 0, dev)?.requires_grad_(true)?;
    let f = |x: &Tensor| -> Result<Tensor> {
        ember::nn::checkpoint(|xs| xs[0].sin()?.square(), &[x], &[])?.sum_all()
    };
    let plain = autograd::grad(&[&f(&x)?], &[&x])?;
    let made = autograd::grad_with(&[&f(&x)?], &[&x], create())?;
    let m = made[0].as_ref().unwrap();
    assert!(m.requires_grad());
    assert_close(
        &m.to_vec::<f64>()?,
        &plain[0].to_vec::<f64>()?,
        1e-12,
        1e-12,
    );
    let e = autograd::grad(&[&m.square()?.sum_all()?], &[&x])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("checkpoint") && e.contains("not differentiable"),
        "{e}"
    );

    let q = input(&[1, 2, 3, 8], 1, dev)?
        .to_dtype(DType::F32)?
        .requires_grad_(true)?;
    let kv = input(&[1, 2, 5, 8], 2, dev)?.to_dtype(DType::F32)?;
    let o = F::with_attention_path(AttentionPath::Fused, || {
        F::scaled_dot_product_attention(&q, &kv, &kv, None, 0.0, false, None)
    })?;
    let g = autograd::grad_with(&[&o.sin()?.sum_all()?], &[&q], create())?;
    let e = autograd::grad(&[&g[0].as_ref().unwrap().sum_all()?], &[&q])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("scaled_dot_product_attention")
            && e.contains("with_attention_path(AttentionPath::Math)"),
        "{e}"
    );
    Ok(())
}

/// Pools and batch norm on a channels-last input, for the float32 and
/// bfloat16 check below.
fn layers_lowp(x: &[Tensor]) -> Result<Tensor> {
    let a = x[0].to_memory_format(MemoryFormat::ChannelsLast)?.sin()?;
    let train = BatchNormOptions {
        training: true,
        ..Default::default()
    };
    let m = a.max_pool2d(Pool2dOptions::new(2).stride(1))?;
    let p = m.avg_pool2d(Pool2dOptions::new(2))?;
    F::batch_norm(&p, None, None, train)?
        .mul(&p)?
        .sum_all()?
        .add(&m.square()?.sum_all()?)
}

/// `H v` of `f` at `x` by double backward, in the dtype of `x`.
fn hvp(f: Scalar, x: &Tensor, v: &Tensor) -> Result<Tensor> {
    let x = x.detach().requires_grad_(true)?;
    let y = f(std::slice::from_ref(&x))?;
    let g = autograd::grad_with(&[&y], &[&x], create())?[0]
        .clone()
        .unwrap();
    let dot = g.mul(v)?.sum_all()?;
    Ok(autograd::grad(&[&dot], &[&x])?[0].clone())
}

/// The recorded rules of the pools and batch norm in float32 and bfloat16
/// (computed in float32 where the device does not pool half types) on a
/// channels-last input: `H v` within each dtype's rounding of float64's.
fn hvp_low_precision(dev: &Device) -> Result<()> {
    let (x, v) = (input(&[2, 3, 5, 5], 0, dev)?, input(&[2, 3, 5, 5], 3, dev)?);
    let want = hvp(layers_lowp, &x, &v)?.to_vec::<f64>()?;
    let norm = want.iter().map(|w| w * w).sum::<f64>().sqrt();
    for (dt, tol) in [(DType::F32, 1e-4), (DType::BF16, 5e-2)] {
        let got = hvp(layers_lowp, &x.to_dtype(dt)?, &v.to_dtype(dt)?)?;
        assert_eq!(got.dtype(), dt);
        let got = got.to_dtype(DType::F64)?.to_vec::<f64>()?;
        let err = got
            .iter()
            .zip(&want)
            .map(|(g, w)| (g - w) * (g - w))
            .sum::<f64>()
            .sqrt();
        assert!(
            err <= tol * norm,
            "{dt}: |H v - float64's| = {err}, |H v| = {norm}"
        );
    }
    Ok(())
}

device_test!(
    hvp_low_precision,
    hvp_pools,
    hvp_batch_norm,
    hvp_attention,
    hvp_sorting,
    not_twice_differentiable,
);

/// The golden cases of this file's layers, from the golden file's `inputs`
/// (those the case differentiates require grad): their named results.
pub(super) fn golden_case(
    name: &str,
    inputs: &[(String, Tensor)],
    dev: &Device,
) -> Result<Vec<(&'static str, Tensor)>> {
    let t = |k: &str| inputs.iter().find(|(n, _)| n == k).unwrap().1.clone();
    Ok(match name {
        "maml_conv" => {
            const PARAMS: [&str; 6] = ["c1", "cb1", "gamma", "beta", "wh", "bh"];
            let params: Vec<Tensor> = PARAMS.iter().map(|k| t(k)).collect();
            let refs: Vec<&Tensor> = params.iter().collect();
            let net = |p: &[Tensor], z: &Tensor| -> Result<Tensor> {
                let conv = ember::Conv2dOptions {
                    padding: (1, 1),
                    ..Default::default()
                };
                let train = BatchNormOptions {
                    training: true,
                    ..Default::default()
                };
                let h = z.conv2d(&p[0], Some(&p[1]), conv)?;
                let h = F::batch_norm(&h, Some(&p[2]), Some(&p[3]), train)?.relu()?;
                let h = h
                    .max_pool2d(Pool2dOptions::new(2))?
                    .avg_pool2d(Pool2dOptions::new(3))?;
                F::linear(&h.flatten(1, -1)?, &p[4], Some(&p[5]))
            };
            let ys = Tensor::from_vec(vec![0i64, 1, 1, 0], [4], dev)?;
            let yq = Tensor::from_vec(vec![1i64, 0, 0, 1], [4], dev)?;
            let inner = F::cross_entropy(&net(&params, &t("support"))?, &ys)?;
            let gs = autograd::grad_with(&[&inner], &refs, create())?;
            let fast: Vec<Tensor> = params
                .iter()
                .zip(&gs)
                .map(|(p, g)| p.sub(&g.as_ref().unwrap().mul(0.4)?))
                .collect::<Result<_>>()?;
            let outer = F::cross_entropy(&net(&fast, &t("query"))?, &yq)?;
            let meta = autograd::grad(&[&outer], &refs)?;
            let mut out = vec![("outer", outer)];
            out.extend(PARAMS.into_iter().zip(meta));
            out
        }
        "attention_hvp" => {
            let (q, k, v) = (t("q"), t("k"), t("vv"));
            let loss = F::with_attention_path(AttentionPath::Math, || {
                F::scaled_dot_product_attention(&q, &k, &v, None, 0.0, true, None)?
                    .sin()?
                    .sum_all()
            })?;
            let gs = autograd::grad_with(&[&loss], &[&q, &k, &v], create())?;
            let mut dot = Tensor::zeros(&[] as &[usize], DType::F64, dev)?;
            for g in gs.iter().map(|g| g.as_ref().unwrap()) {
                dot = dot.add(&g.mul(&g.detach().flip([-1])?)?.sum_all()?)?;
            }
            let hv = autograd::grad(&[&dot], &[&q, &k, &v])?;
            vec![
                ("loss", loss),
                ("q", hv[0].clone()),
                ("k", hv[1].clone()),
                ("vv", hv[2].clone()),
            ]
        }
        other => panic!("no golden case {other} here"),
    })
}
