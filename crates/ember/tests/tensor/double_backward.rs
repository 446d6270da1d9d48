//! Gradients of gradients (`create_graph`) and kept graphs (`retain_graph`).
//!
//! Each twice-differentiable op is checked by a Hessian-vector product: the
//! gradient made with `create_graph`, dotted with a fixed direction `v` and
//! differentiated again, against central differences of the first-order
//! gradient along `v`, in float64. Whole cases (a gradient penalty, a Hessian,
//! a meta-learning step) are checked against PyTorch's values
//! (tests/golden/double_backward_cases.json, made by
//! tests/golden/gen_double_backward.py).

use super::assert_close;
use ember::autograd::{self, BackwardOptions, GradOptions};
use ember::prelude::*;
use serde_json::Value;

/// A scalar function of some tensors.
pub(super) type Scalar = fn(&[Tensor]) -> Result<Tensor>;

/// Fixed inputs away from the kinks of relu, abs and max (so that central
/// differences see one smooth piece).
pub(super) fn input(shape: &[usize], seed: usize, dev: &Device) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|i| {
            let t = (i * 7 + seed * 13) % 17;
            (t as f64 - 8.3) / 7.0 + 0.011 * i as f64
        })
        .collect();
    Tensor::from_vec(v, shape.to_vec(), dev)
}

/// The first-order gradients of `f` at `xs` (no graph kept).
fn gradient(f: Scalar, xs: &[Tensor]) -> Result<Vec<Tensor>> {
    let leaves: Vec<Tensor> = xs
        .iter()
        .map(|x| x.detach().requires_grad_(true))
        .collect::<Result<_>>()?;
    let y = f(&leaves)?;
    let refs: Vec<&Tensor> = leaves.iter().collect();
    let options = GradOptions {
        materialize_grads: true,
        ..Default::default()
    };
    Ok(autograd::grad_with(&[&y], &refs, options)?
        .into_iter()
        .map(|g| g.expect("materialized"))
        .collect())
}

/// Checks `H v` from double backward against central differences of the
/// gradient along `v`, for every input at once (mixed partials included).
pub(super) fn check_hvp(name: &str, f: Scalar, shapes: &[&[usize]], dev: &Device) -> Result<()> {
    let xs: Vec<Tensor> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| input(s, i, dev)?.requires_grad_(true))
        .collect::<Result<_>>()?;
    let vs: Vec<Tensor> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| input(s, i + 5, dev))
        .collect::<Result<_>>()?;
    let refs: Vec<&Tensor> = xs.iter().collect();
    let y = f(&xs)?;
    let options = GradOptions {
        create_graph: true,
        materialize_grads: true,
        ..Default::default()
    };
    let gs = autograd::grad_with(&[&y], &refs, options)?;
    let mut dot = Tensor::zeros(&[] as &[usize], DType::F64, dev)?;
    for (g, v) in gs.iter().zip(&vs) {
        let g = g.as_ref().expect("materialized");
        dot = dot.add(&g.mul(v)?.sum_all()?)?;
    }
    // a gradient whose graph reaches none of the inputs (a linear function)
    // has a zero Hessian
    let hv: Vec<Tensor> = if dot.requires_grad() {
        let options = GradOptions {
            materialize_grads: true,
            ..Default::default()
        };
        autograd::grad_with(&[&dot], &refs, options)?
            .into_iter()
            .map(|h| h.expect("materialized"))
            .collect()
    } else {
        xs.iter().map(|x| x.zeros_like()).collect::<Result<_>>()?
    };
    let eps = 1e-5;
    let shifted = |sign: f64| -> Result<Vec<Tensor>> {
        let moved: Vec<Tensor> = xs
            .iter()
            .zip(&vs)
            .map(|(x, v)| x.detach().add(&v.mul(sign * eps)?))
            .collect::<Result<_>>()?;
        gradient(f, &moved)
    };
    let (plus, minus) = (shifted(1.0)?, shifted(-1.0)?);
    for (i, h) in hv.iter().enumerate() {
        let want = plus[i].sub(&minus[i])?.div(2.0 * eps)?;
        let (got, want) = (h.to_vec::<f64>()?, want.to_vec::<f64>()?);
        assert!(
            got.iter()
                .zip(&want)
                .all(|(g, w)| (g - w).abs() <= 1e-6 + 1e-6 * w.abs()),
            "{name}: input {i}: H v = {got:?}, differences give {want:?}"
        );
    }
    Ok(())
}

fn pointwise(x: &[Tensor]) -> Result<Tensor> {
    let (a, b) = (&x[0], &x[1]);
    // +, -, ×, ÷ by a tensor and by a number, pow by a tensor and a number
    let q = a.mul(b)?.sub(&a.div(&b.square()?.add(3.0)?)?)?.add(a)?;
    let p = a.abs()?.add(1.0)?.pow(&b.mul(0.5)?)?;
    q.square()?
        .mul(0.5)?
        .add(&p)?
        .add(&b.pow(3.0)?.div(4.0)?)?
        .sum_all()
}

fn transcendental(x: &[Tensor]) -> Result<Tensor> {
    let a = &x[0];
    let e = a.exp()?.add(&a.square()?.add(1.0)?.log()?)?;
    let t = e.tanh()?.sigmoid()?.add(&a.sin()?.mul(&a.cos()?)?)?;
    let r = a
        .square()?
        .add(2.0)?
        .sqrt()?
        .mul(&a.square()?.add(1.0)?.rsqrt()?)?;
    t.add(&r)?
        .add(&a.atan()?)?
        .add(&a.square()?.log1p()?)?
        .sum_all()
}

fn activations(x: &[Tensor]) -> Result<Tensor> {
    let (a, w) = (&x[0], &x[1]);
    let aw = a.mul(w)?;
    let s = aw.relu()?.mul(a)?.sum_all()?;
    let s = s.add(&a.gelu()?.mul(w)?.sum_all()?)?;
    let s = s.add(&aw.gelu_tanh()?.sum_all()?)?;
    let s = s.add(&aw.softplus(1.5, 20.0)?.sum_all()?)?;
    let s = s.add(&aw.silu()?.sum_all()?)?;
    let s = s.add(&aw.elu(1.0)?.mul(a)?.sum_all()?)?;
    let s = s.add(&aw.leaky_relu(0.1)?.mul(a)?.sum_all()?)?;
    s.add(&aw.clamp(Some(-0.5), Some(0.5))?.mul(a)?.sum_all()?)
}

fn reductions(x: &[Tensor]) -> Result<Tensor> {
    let a = &x[0];
    let s = a.square()?.sum(1, false)?.sqrt()?.sum_all()?;
    let s = s.add(&a.mean(0, true)?.square()?.sum_all()?)?;
    let s = s.add(&a.var(1, false)?.sum_all()?)?;
    let s = s.add(&a.std(0, false)?.sum_all()?)?;
    let s = s.add(&a.mul(a)?.max(1, false)?.sum_all()?)?;
    s.add(&a.exp()?.mean_all()?)
}

fn products(x: &[Tensor]) -> Result<Tensor> {
    let (a, w, b) = (&x[0], &x[1], &x[2]);
    let h = ember::nn::functional::linear(a, w, Some(b))?.tanh()?;
    let m = h.matmul(&h.t()?)?;
    let v = a.select(0, 0)?.matmul(&w.t()?)?;
    m.sum_all()?
        .add(&v.square()?.sum_all()?)?
        .add(&b.addmm(a, &w.t()?)?.square()?.mean_all()?)
}

fn softmaxes(x: &[Tensor]) -> Result<Tensor> {
    let (a, c) = (&x[0], &x[1]);
    let s = a.softmax(-1)?.mul(c)?.sum_all()?;
    let t = a.mul(c)?.log_softmax(0)?.mul(c)?.sum_all()?;
    s.add(&t)
}

fn views(x: &[Tensor]) -> Result<Tensor> {
    let (a, b) = (&x[0], &x[1]);
    let n = a.narrow(1, 1, 2)?.square()?;
    let c = Tensor::cat(&[&n, &b.t()?.narrow(1, 0, 2)?], 0)?;
    let e = a.select(0, 1)?.unsqueeze(0)?.expand([3, 3])?;
    let p = a
        .reshape([3, 2])?
        .permute([1, 0])?
        .mul(&b.t()?.narrow(1, 0, 2)?.t()?)?;
    let st = Tensor::stack(&[&a.sin()?, &a.mul(a)?], 0)?;
    c.sum_all()?
        .mul(&e.mul(&e)?.sum_all()?)?
        .add(&p.exp()?.sum_all()?)?
        .add(&st.square()?.sum_all()?)
}

fn selection(x: &[Tensor]) -> Result<Tensor> {
    let (a, b) = (&x[0], &x[1]);
    let cond = a.gt(0.0)?;
    let w = cond.where_(&a.square()?, &b.pow(3.0)?)?;
    let m = a.maximum(b)?.mul(a)?;
    w.mul(b)?.add(&m)?.sum_all()
}

fn composites(x: &[Tensor]) -> Result<Tensor> {
    let (a, b) = (&x[0], &x[1]);
    let pos = b.square()?.add(0.5)?;
    let s = a.xlogy(&pos)?.sum_all()?;
    let s = s.add(&a.lerp(b, &b.sigmoid()?)?.square()?.sum_all()?)?;
    let s = s.add(&a.addcmul(b, &a.sin()?, 0.7)?.square()?.sum_all()?)?;
    let s = s.add(&a.addcdiv(b, &pos, -0.3)?.square()?.sum_all()?)?;
    let s = s.add(&a.hypot(b)?.sum_all()?)?;
    let lo = b.sub(2.0)?;
    let s = s.add(
        &a.mul(3.0)?
            .clamp_tensor(Some(&lo), Some(b))?
            .mul(a)?
            .sum_all()?,
    )?;
    s.add(&a.mul(b)?.median()?.square()?)
}

fn scans(x: &[Tensor]) -> Result<Tensor> {
    let a = &x[0];
    let s = a.cumsum(1)?.square()?.sum_all()?;
    let s = s.add(&a.add(2.0)?.cumprod(1)?.sum_all()?)?;
    let s = s.add(&a.logcumsumexp(0)?.sum_all()?)?;
    let s = s.add(&a.logsumexp(1, false)?.square()?.sum_all()?)?;
    let s = s.add(&a.vector_norm(2.0, [1], false)?.sum_all()?)?;
    s.add(&a.vector_norm(3.0, [0], false)?.sum_all()?)
}

fn losses(x: &[Tensor]) -> Result<Tensor> {
    use ember::nn::functional as F;
    use ember::nn::Reduction;
    let (a, b) = (&x[0], &x[1]);
    let s = F::mse_loss(a, b, Reduction::Mean)?;
    let s = s.add(&F::smooth_l1_loss(&a.mul(2.0)?, b, Reduction::Sum, 1.5)?)?;
    let s = s.add(&F::huber_loss(&a.mul(2.0)?, b, Reduction::Mean, 0.8)?)?;
    let p = a.sigmoid()?;
    let s = s.add(&F::binary_cross_entropy(
        &p,
        &b.sigmoid()?,
        None,
        Reduction::Mean,
    )?)?;
    let s = s.add(&F::bce_with_logits(
        &a.mul(b)?,
        &b.sigmoid()?,
        Reduction::Sum,
    )?)?;
    let s = s.add(&F::cosine_similarity(a, b, 1, 1e-8)?.sum_all()?)?;
    let s = s.add(&F::pairwise_distance(a, b, 2.0, 1e-6, false)?.sum_all()?)?;
    s.add(&a.cdist(b, 2.0)?.sum_all()?)
}

fn in_place(x: &[Tensor]) -> Result<Tensor> {
    let (a, b) = (&x[0], &x[1]);
    let h = a.mul(b)?;
    h.mul_(&b.exp()?)?; // binary in place
    h.mul_(1.5)?; // by a number
    h.tanh_()?; // reads only its output
    let c = h.zeros_like()?;
    c.copy_(&a.square()?)?;
    let f = h.to_memory_format(ember::MemoryFormat::ChannelsLast)?;
    h.mul(&c)?.add(&f)?.sum_all()
}

fn convolutions(x: &[Tensor]) -> Result<Tensor> {
    use ember::{nn::ConvTranspose2dOptions, Conv2dOptions};
    let (a, w, wg, b) = (&x[0], &x[1], &x[2], &x[3]);
    let strided = Conv2dOptions {
        stride: (2, 1),
        padding: (1, 2),
        dilation: (1, 2),
        groups: 1,
    };
    let h = a.conv2d(w, Some(b), strided)?.tanh()?;
    let grouped = Conv2dOptions {
        groups: 2,
        padding: (1, 1),
        ..Default::default()
    };
    let k = a.conv2d(wg, None, grouped)?.sigmoid()?;
    let t = ConvTranspose2dOptions {
        stride: (2, 2),
        output_padding: (1, 0),
        ..Default::default()
    };
    // (conv_transpose2d's weight is [in, out / groups, kh, kw]: 4 in, 2 out)
    let u = k.conv_transpose2d(wg, None, t)?;
    h.square()?.sum_all()?.add(&u.sin()?.sum_all()?)
}

fn convolutions_1d_3d(x: &[Tensor]) -> Result<Tensor> {
    use ember::nn::{functional as F, Conv1dOptions, ConvTranspose3dOptions};
    let (a, w1, v, w3) = (&x[0], &x[1], &x[2], &x[3]);
    let o1 = Conv1dOptions::default().padding(1).stride(2);
    let s = F::conv1d(a, w1, None, o1)?.tanh()?.sum_all()?;
    let o3 = ember::Conv3dOptions {
        padding: (1, 0, 1),
        ..Default::default()
    };
    let h = v.conv3d(w3, None, o3)?.sigmoid()?;
    let t = ConvTranspose3dOptions::default().stride(2);
    let u = h.conv_transpose3d(w3, None, t)?;
    // padding="same" with an even kernel (one side more than the other), and
    // a depth stride over padding
    let e = v.conv3d_same(w3, None, (1, 1, 1), 1)?.tanh()?.sum_all()?;
    let o3 = ember::Conv3dOptions {
        stride: (2, 1, 1),
        padding: (1, 1, 0),
        ..Default::default()
    };
    let f = v.conv3d(w3, None, o3)?.cos()?.sum_all()?;
    // taps that read only padding at some output depths, and a transposed
    // convolution whose output padding reaches a stride (under the dilation)
    let o3 = ember::Conv3dOptions {
        stride: (2, 1, 1),
        padding: (2, 1, 0),
        ..Default::default()
    };
    let p = v.conv3d(w3, None, o3)?.sigmoid()?.sum_all()?;
    let t = ConvTranspose3dOptions {
        stride: (1, 2, 1),
        dilation: (2, 1, 2),
        output_padding: (1, 1, 1),
        ..Default::default()
    };
    let q = h.conv_transpose3d(w3, None, t)?.cos()?.sum_all()?;
    s.add(&h.square()?.sum_all()?)?
        .add(&u.sin()?.sum_all()?)?
        .add(&e)?
        .add(&f)?
        .add(&p)?
        .add(&q)
}

fn normalisations(x: &[Tensor]) -> Result<Tensor> {
    use ember::nn::functional as F;
    let (a, w, b, wg) = (&x[0], &x[1], &x[2], &x[3]);
    let l = F::layer_norm(a, &[4], Some(w), Some(b), 1e-5)?;
    let r = F::rms_norm(&a.mul(2.0)?, &[4], Some(w), Some(1e-6))?;
    let g = F::group_norm(&a.reshape([2, 6, 2, 1])?, 3, Some(wg), None, 1e-5)?;
    let u = F::layer_norm(&a.sin()?, &[3, 4], None, None, 1e-5)?;
    l.mul(&a.cos()?)?
        .sum_all()?
        .add(&r.tanh()?.sum_all()?)?
        .add(&g.sigmoid()?.sum_all()?)?
        .add(&u.exp()?.sum_all()?)
}

fn cross_entropies(x: &[Tensor]) -> Result<Tensor> {
    use ember::nn::{functional as F, LossOptions, Reduction};
    let (a, w) = (&x[0], &x[1]);
    let dev = a.device();
    let logits = a.matmul(w)?; // [4, 5]
    let t = Tensor::from_vec(vec![1i64, 4, 0, 2], [4], &dev)?;
    let s = F::cross_entropy(&logits, &t)?;
    let ignored = Tensor::from_vec(vec![3i64, -100, 0, 4], [4], &dev)?;
    let smoothed = LossOptions {
        label_smoothing: 0.2,
        reduction: Reduction::Sum,
        ..Default::default()
    };
    let s = s.add(&F::cross_entropy_opts(&logits.tanh()?, &ignored, smoothed)?)?;
    let cw = Tensor::from_vec(vec![0.5f64, 1.0, 2.0, 1.5, 0.7], [5], &dev)?;
    let weighted = LossOptions {
        weight: Some(&cw),
        ..Default::default()
    };
    let s = s.add(&F::cross_entropy_opts(&logits.mul(&logits)?, &t, weighted)?)?;
    // a [N, C, d] input: classes along dim 1
    let spatial = logits.reshape([2, 2, 5])?.transpose(1, 2)?;
    let ts = Tensor::from_vec(vec![1i64, 4, 0, 2], [2, 2], &dev)?;
    s.add(&F::cross_entropy(&spatial, &ts)?)
}

fn index_ops(x: &[Tensor]) -> Result<Tensor> {
    let (a, e) = (&x[0], &x[1]);
    let dev = a.device();
    let rows = Tensor::from_vec(vec![2i64, 0, 2], [3], &dev)?;
    let s = a.index_select(0, &rows)?.pow(3.0)?.sum_all()?;
    let idx = Tensor::from_vec(vec![0i64, 2, 1, 1, 0, 0, 3, 3, 2], [3, 3], &dev)?;
    let s = s.add(&a.gather(0, &idx)?.mul(&a.narrow(0, 0, 3)?)?.sum_all()?)?;
    let spread = a
        .sin()?
        .scatter_add(0, &idx, &a.narrow(0, 1, 3)?.square()?)?;
    let s = s.add(&spread.square()?.sum_all()?)?;
    let added = a.index_add(0, &rows, &a.narrow(0, 0, 3)?.exp()?, 0.5)?;
    let s = s.add(&added.tanh()?.sum_all()?)?;
    let (top, _) = a.mul(a)?.max_dim(1, false)?;
    let s = s.add(&top.mul(&a.select(1, 0)?)?.sum_all()?)?;
    let words = Tensor::from_vec(vec![1i64, 0, 1, 2], [2, 2], &dev)?;
    let v = ember::nn::functional::embedding(&words, e, None)?;
    s.add(&v.square()?.sum(2, false)?.sqrt()?.sum_all()?)
}

/// A two-layer tanh network's input-gradient penalty (WGAN-GP's term): the
/// gradient of the critic with respect to its input, itself differentiated
/// with respect to the weights.
fn penalty(x: &[Tensor]) -> Result<Tensor> {
    let (input, w1, w2) = (&x[0], &x[1], &x[2]);
    let critic = |z: &Tensor| -> Result<Tensor> { z.matmul(w1)?.tanh()?.matmul(w2)?.sum_all() };
    let g = autograd::grad_with(
        &[&critic(input)?],
        &[input],
        GradOptions {
            create_graph: true,
            ..Default::default()
        },
    )?;
    let g = g[0].clone().expect("a gradient");
    g.square()?
        .sum(1, false)?
        .add(1e-12)?
        .sqrt()?
        .sub(1.0)?
        .square()?
        .mean_all()
}

fn hvp_pointwise(dev: &Device) -> Result<()> {
    check_hvp("pointwise", pointwise, &[&[2, 3], &[3]], dev)
}

fn hvp_transcendental(dev: &Device) -> Result<()> {
    check_hvp("transcendental", transcendental, &[&[2, 3]], dev)
}

fn hvp_activations(dev: &Device) -> Result<()> {
    check_hvp("activations", activations, &[&[2, 3], &[2, 3]], dev)
}

fn hvp_reductions(dev: &Device) -> Result<()> {
    check_hvp("reductions", reductions, &[&[3, 4]], dev)
}

fn hvp_products(dev: &Device) -> Result<()> {
    check_hvp("products", products, &[&[2, 3], &[4, 3], &[4]], dev)
}

fn hvp_softmax(dev: &Device) -> Result<()> {
    check_hvp("softmax", softmaxes, &[&[3, 4], &[3, 4]], dev)
}

fn hvp_views(dev: &Device) -> Result<()> {
    check_hvp("views", views, &[&[2, 3], &[3, 3]], dev)
}

fn hvp_selection(dev: &Device) -> Result<()> {
    check_hvp("selection", selection, &[&[2, 3], &[2, 3]], dev)
}

fn hvp_composites(dev: &Device) -> Result<()> {
    check_hvp("composites", composites, &[&[2, 3], &[2, 3]], dev)
}

fn hvp_scans(dev: &Device) -> Result<()> {
    check_hvp("scans", scans, &[&[3, 4]], dev)
}

fn hvp_losses(dev: &Device) -> Result<()> {
    check_hvp("losses", losses, &[&[3, 4], &[3, 4]], dev)
}

fn hvp_in_place(dev: &Device) -> Result<()> {
    check_hvp("in_place", in_place, &[&[1, 2, 2, 3], &[1, 2, 2, 3]], dev)
}

/// conv2d (strided, padded, dilated, grouped, with a bias) and
/// conv_transpose2d: their gradients are convolutions, differentiable again.
fn hvp_convolutions(dev: &Device) -> Result<()> {
    let shapes: &[&[usize]] = &[&[2, 4, 5, 6], &[3, 4, 3, 2], &[4, 2, 3, 3], &[3]];
    check_hvp("convolutions", convolutions, shapes, dev)
}

/// conv1d, conv3d and conv_transpose3d, made of the 2-D convolutions.
fn hvp_convolutions_1d_3d(dev: &Device) -> Result<()> {
    let shapes: &[&[usize]] = &[&[2, 3, 7], &[4, 3, 3], &[1, 2, 3, 4, 3], &[3, 2, 2, 2, 2]];
    check_hvp("convolutions_1d_3d", convolutions_1d_3d, shapes, dev)
}

/// layer_norm, rms_norm and group_norm: the fused rows' rule is written in
/// recorded ops when a walk creates a graph.
fn hvp_normalisations(dev: &Device) -> Result<()> {
    let shapes: &[&[usize]] = &[&[2, 3, 4], &[4], &[4], &[6]];
    check_hvp("normalisations", normalisations, shapes, dev)
}

/// cross_entropy (class indices; label smoothing, an ignored target, class
/// weights, a spatial input): its fused rule is written in recorded ops when a
/// walk creates a graph.
fn hvp_cross_entropy(dev: &Device) -> Result<()> {
    check_hvp("cross_entropy", cross_entropies, &[&[4, 3], &[3, 5]], dev)
}

/// index_select, gather, scatter_add, index_add, max_dim and embedding: their
/// gradients are index ops, recorded.
fn hvp_index_ops(dev: &Device) -> Result<()> {
    check_hvp("index_ops", index_ops, &[&[4, 3], &[3, 4]], dev)
}

/// Third order: the gradient penalty is itself a gradient's function, and its
/// Hessian-vector product differentiates three times.
fn hvp_gradient_penalty(dev: &Device) -> Result<()> {
    check_hvp("penalty", penalty, &[&[3, 2], &[2, 4], &[4, 1]], dev)
}

pub(super) fn create() -> GradOptions<'static> {
    GradOptions {
        create_graph: true,
        ..Default::default()
    }
}

/// `retain_graph` keeps what the rules saved: a second backward adds the same
/// gradients again; the walk that does not keep the graph spends it, and a
/// third is PyTorch's error with the hint.
fn retain_graph_backward(dev: &Device) -> Result<()> {
    let x = Tensor::from_vec(vec![0.5f64, -1.0, 2.0], [3], dev)?.requires_grad_(true)?;
    let y = x.mul(&x)?.exp()?.sum_all()?; // Σ e^(x²): 2x e^(x²)
    let want: Vec<f64> = [0.5f64, -1.0, 2.0]
        .iter()
        .map(|v| 2.0 * v * (v * v).exp())
        .collect();
    let retain = BackwardOptions {
        retain_graph: true,
        ..Default::default()
    };
    autograd::backward_with(&[&y], retain)?;
    assert_close(&x.grad().unwrap().to_vec::<f64>()?, &want, 1e-12, 0.0);
    autograd::backward_with(&[&y], retain)?;
    y.backward()?;
    let thrice: Vec<f64> = want.iter().map(|w| 3.0 * w).collect();
    assert_close(&x.grad().unwrap().to_vec::<f64>()?, &thrice, 1e-12, 0.0);
    let e = y.backward().unwrap_err().to_string();
    assert!(
        e.contains("second time") && e.contains("retain_graph"),
        "{e}"
    );
    // the gradient is unchanged by the refused walk
    assert_close(&x.grad().unwrap().to_vec::<f64>()?, &thrice, 1e-12, 0.0);
    Ok(())
}

/// `grad` with `retain_graph` leaves the graph for another `grad` or backward.
fn retain_graph_grad(dev: &Device) -> Result<()> {
    let x = Tensor::from_vec(vec![1.0f64, 2.0], [2], dev)?.requires_grad_(true)?;
    let y = x.sin()?.mul(&x)?.sum_all()?; // x sin x: sin x + x cos x
    let keep = GradOptions {
        retain_graph: true,
        ..Default::default()
    };
    let a = autograd::grad_with(&[&y], &[&x], keep)?[0].clone().unwrap();
    let b = autograd::grad(&[&y], &[&x])?;
    assert_eq!(a.to_vec::<f64>()?, b[0].to_vec::<f64>()?);
    let want: Vec<f64> = [1.0f64, 2.0]
        .iter()
        .map(|v| v.sin() + v * v.cos())
        .collect();
    assert_close(&a.to_vec::<f64>()?, &want, 1e-12, 0.0);
    assert!(
        !a.requires_grad(),
        "without create_graph a gradient has no history"
    );
    assert!(autograd::grad(&[&y], &[&x]).is_err());
    Ok(())
}

/// `backward` with `create_graph`: the leaf's `.grad()` has a history (the sum
/// with what was there, `grad = grad + new`), and differentiating it gives the
/// second derivative.
fn create_graph_backward(dev: &Device) -> Result<()> {
    let x = Tensor::from_vec(vec![0.5f64, 1.5], [2], dev)?.requires_grad_(true)?;
    x.pow(2.0)?.sum_all()?.backward()?; // .grad() = 2x, no history
    assert!(!x.grad().unwrap().requires_grad());
    let y = x.pow(4.0)?.sum_all()?; // 4x³, then 12x²
    let options = BackwardOptions {
        create_graph: true,
        ..Default::default()
    };
    autograd::backward_with(&[&y], options)?;
    let g = x.grad().unwrap();
    assert!(g.requires_grad(), "create_graph gives .grad() a history");
    let first: Vec<f64> = [0.5f64, 1.5]
        .iter()
        .map(|v| 2.0 * v + 4.0 * v.powi(3))
        .collect();
    assert_close(&g.to_vec::<f64>()?, &first, 1e-12, 0.0);
    let h = autograd::grad(&[&g.sum_all()?], &[&x])?;
    let second: Vec<f64> = [0.5f64, 1.5].iter().map(|v| 12.0 * v * v).collect();
    assert_close(&h[0].to_vec::<f64>()?, &second, 1e-12, 0.0);
    Ok(())
}

device_test!(
    hvp_pointwise,
    hvp_transcendental,
    hvp_activations,
    hvp_reductions,
    hvp_products,
    hvp_softmax,
    hvp_views,
    hvp_selection,
    hvp_composites,
    hvp_scans,
    hvp_losses,
    hvp_in_place,
    hvp_convolutions,
    hvp_convolutions_1d_3d,
    hvp_normalisations,
    hvp_cross_entropy,
    hvp_index_ops,
    hvp_gradient_penalty,
    retain_graph_backward,
    retain_graph_grad,
    create_graph_backward,
);

/// The golden file's tensors by name, as fresh leaves (those in `need`
/// require grad).
fn golden_inputs(all: &Value, need: &[&str], dev: &Device) -> Result<Vec<(String, Tensor)>> {
    let mut t = Vec::new();
    for (k, v) in all["inputs"].as_object().unwrap() {
        let x = super::golden_tensor(v, dev)?;
        let x = if need.contains(&k.as_str()) {
            x.requires_grad_(true)?
        } else {
            x
        };
        t.push((k.clone(), x));
    }
    Ok(t)
}

/// Runs one golden case in ember: its named results.
fn golden_case(name: &str, dev: &Device) -> Result<Vec<(&'static str, Tensor)>> {
    use ember::nn::functional as F;
    let all = super::golden("double_backward_cases.json");
    let need: &[&str] = match name {
        "wgan_gp" | "maml" => &["w1", "b1", "w2", "b2"],
        "hvp" => &["w1"],
        "r1" => &["k1", "kb1", "k2"],
        "maml_conv" => &["c1", "cb1", "gamma", "beta", "wh", "bh"],
        "attention_hvp" => &["q", "k", "vv"],
        "linalg_hvp" => &["m"],
        _ => &["x"],
    };
    let inputs = golden_inputs(&all, need, dev)?;
    match name {
        "maml_conv" | "attention_hvp" => {
            return super::double_backward_layers::golden_case(name, &inputs, dev)
        }
        "linalg_hvp" => return super::double_backward_linalg::golden_case(name, &inputs, dev),
        _ => {}
    }
    let t = |k: &str| inputs.iter().find(|(n, _)| n == k).unwrap().1.clone();
    let params = [t("w1"), t("b1"), t("w2"), t("b2")];
    let param_refs: Vec<&Tensor> = params.iter().collect();
    let critic = |z: &Tensor| -> Result<Tensor> {
        let h = F::linear(z, &params[0], Some(&params[1]))?.leaky_relu(0.2)?;
        F::linear(&h, &params[2], Some(&params[3]))
    };
    let named = |gs: Vec<Option<Tensor>>| -> Vec<(&'static str, Tensor)> {
        ["w1", "b1", "w2", "b2"]
            .into_iter()
            .zip(gs.into_iter().map(|g| g.expect("a gradient")))
            .collect()
    };
    Ok(match name {
        "wgan_gp" => {
            let (x, x2, eps) = (t("x"), t("x2"), t("eps"));
            let mix = eps
                .mul(&x)?
                .add(&eps.rsub(1.0)?.mul(&x2)?)?
                .requires_grad_(true)?;
            let out = critic(&mix)?;
            let g = autograd::grad_with(&[&out.sum_all()?], &[&mix], create())?;
            let g = g[0].clone().unwrap();
            let penalty = g
                .vector_norm(2.0, [1], false)?
                .sub(1.0)?
                .square()?
                .mean_all()?;
            let loss = critic(&x2)?
                .mean_all()?
                .sub(&critic(&x)?.mean_all()?)?
                .add(&penalty.mul(10.0)?)?;
            let gs = autograd::grad_with(&[&loss], &param_refs, GradOptions::default())?;
            let mut out = vec![("penalty", penalty)];
            out.extend(named(gs));
            out
        }
        "r1" => {
            let img = t("img").requires_grad_(true)?;
            let down = ember::Conv2dOptions {
                stride: (2, 2),
                padding: (1, 1),
                ..Default::default()
            };
            let h = img
                .conv2d(&t("k1"), Some(&t("kb1")), down)?
                .leaky_relu(0.2)?;
            let grouped = ember::Conv2dOptions {
                groups: 2,
                ..Default::default()
            };
            let score = h.conv2d(&t("k2"), None, grouped)?.sum_all()?;
            let g = autograd::grad_with(&[&score], &[&img], create())?[0]
                .clone()
                .unwrap();
            let penalty = g.square()?.sum_all()?.div(2.0)?;
            let (k1, kb1, k2) = (t("k1"), t("kb1"), t("k2"));
            let gs = autograd::grad(&[&penalty], &[&k1, &kb1, &k2])?;
            vec![
                ("penalty", penalty),
                ("k1", gs[0].clone()),
                ("kb1", gs[1].clone()),
                ("k2", gs[2].clone()),
            ]
        }
        "maml" => {
            let net = |p: &[Tensor], z: &Tensor| -> Result<Tensor> {
                let h = F::linear(z, &p[0], Some(&p[1]))?.tanh()?;
                F::linear(&h, &p[2], Some(&p[3]))
            };
            let mean = ember::nn::Reduction::Mean;
            let inner = F::mse_loss(&net(&params, &t("x"))?, &t("y"), mean)?;
            let gs = autograd::grad_with(&[&inner], &param_refs, create())?;
            let fast: Vec<Tensor> = params
                .iter()
                .zip(&gs)
                .map(|(p, g)| p.sub(&g.as_ref().unwrap().mul(0.1)?))
                .collect::<Result<_>>()?;
            let outer = F::mse_loss(&net(&fast, &t("x2"))?, &t("y2"), mean)?;
            let meta = autograd::grad_with(&[&outer], &param_refs, GradOptions::default())?;
            let mut out = vec![("outer", outer)];
            out.extend(named(meta));
            out
        }
        "hvp" => {
            let w1 = t("w1");
            let logits = F::linear(&t("x"), &w1, Some(&t("b1")))?;
            let classes = Tensor::from_vec(vec![0i64, 3, 1, 4], [4], dev)?;
            let target = classes.one_hot(5)?.to_dtype(DType::F64)?;
            let loss = logits
                .log_softmax(1)?
                .mul(&target)?
                .sum(1, false)?
                .mean_all()?
                .neg()?;
            let g = autograd::grad_with(&[&loss], &[&w1], create())?[0]
                .clone()
                .unwrap();
            let direction = w1.detach().flip([0])?;
            let hv = autograd::grad(&[&g.mul(&direction)?.sum_all()?], &[&w1])?;
            vec![("loss", loss), ("hv", hv[0].clone())]
        }
        "hessian" => {
            let xs = t("x");
            let x = xs.select(0, 0)?;
            let prod = x
                .select(0, 0)?
                .mul(&x.select(0, 1)?)?
                .mul(&x.select(0, 2)?)?;
            let f = x.sin()?.mul(&x.pow(3.0)?)?.sum_all()?.add(&prod.exp()?)?;
            let g = autograd::grad_with(&[&f], &[&xs], create())?[0]
                .clone()
                .unwrap();
            let keep = GradOptions {
                retain_graph: true,
                ..Default::default()
            };
            let mut rows = Vec::new();
            for i in 0..3 {
                let gi = g.select(0, 0)?.select(0, i)?;
                let r = autograd::grad_with(&[&gi], &[&xs], keep)?[0]
                    .clone()
                    .unwrap();
                rows.push(r.select(0, 0)?);
            }
            let rows: Vec<&Tensor> = rows.iter().collect();
            vec![("f", f), ("hessian", Tensor::stack(&rows, 0)?)]
        }
        "jvp" => {
            let x = t("x");
            let y = F::linear(&x, &params[0], Some(&params[1]))?.tanh()?;
            let u = y.zeros_like()?.requires_grad_(true)?;
            let options = GradOptions {
                grad_outputs: &[Some(&u)],
                create_graph: true,
                ..Default::default()
            };
            let vjp = autograd::grad_with(&[&y], &[&x], options)?[0]
                .clone()
                .unwrap();
            let v = t("v");
            let options = GradOptions {
                grad_outputs: &[Some(&v)],
                ..Default::default()
            };
            let jv = autograd::grad_with(&[&vjp], &[&u], options)?[0]
                .clone()
                .unwrap();
            vec![("jvp", jv)]
        }
        "backward_twice" => {
            let x = t("x");
            let y = x.exp()?.mul(&x.sigmoid()?)?.sum_all()?;
            let options = BackwardOptions {
                create_graph: true,
                ..Default::default()
            };
            autograd::backward_with(&[&y], options)?;
            let g = x.grad().unwrap();
            let first = g.detach().copy()?;
            g.mul(&g)?.sum_all()?.backward()?;
            vec![("first", first), ("grad", x.grad().unwrap())]
        }
        "retained" => {
            let x = t("x");
            let y = x.pow(2.0)?.mul(&t("x2").cos()?)?.sum_all()?;
            let retain = BackwardOptions {
                retain_graph: true,
                ..Default::default()
            };
            autograd::backward_with(&[&y], retain)?;
            y.backward()?;
            vec![("grad", x.grad().unwrap())]
        }
        other => panic!("no golden case {other}"),
    })
}

/// Every golden case against PyTorch's results, to float64's rounding.
fn golden_cases(dev: &Device) -> Result<()> {
    let all = super::golden("double_backward_cases.json");
    for case in all["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let got = golden_case(name, dev)?;
        let want = case["results"].as_object().unwrap();
        assert_eq!(got.len(), want.len(), "{name}: results");
        for (k, t) in got {
            let w = super::golden_tensor(&want[k], &Device::Cpu)?;
            assert_eq!(t.shape(), w.shape(), "{name}.{k}: shape");
            assert_eq!(t.dtype(), DType::F64, "{name}.{k}: dtype");
            assert_close(&t.to_vec::<f64>()?, &w.to_vec::<f64>()?, 1e-10, 1e-12);
        }
    }
    Ok(())
}

device_test!(golden_cases);
