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
type Scalar = fn(&[Tensor]) -> Result<Tensor>;

/// Fixed inputs away from the kinks of relu, abs and max (so that central
/// differences see one smooth piece).
fn input(shape: &[usize], seed: usize, dev: &Device) -> Result<Tensor> {
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
fn check_hvp(name: &str, f: Scalar, shapes: &[&[usize]], dev: &Device) -> Result<()> {
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

/// Third order: the gradient penalty is itself a gradient's function, and its
/// Hessian-vector product differentiates three times.
fn hvp_gradient_penalty(dev: &Device) -> Result<()> {
    check_hvp("penalty", penalty, &[&[3, 2], &[2, 4], &[4, 1]], dev)
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
    hvp_gradient_penalty,
);
