//! Gradients of gradients through `ember::linalg`: Hessian-vector products
//! against central differences (the check of tests/tensor/double_backward.rs)
//! for the inverse, determinants, solves, Cholesky, QR, LU, the symmetric
//! eigendecomposition, the SVD and the functions made of them, and a
//! Gaussian likelihood's Hessian-vector product against PyTorch
//! (tests/golden/gen_double_backward.py).

use super::assert_close;
use super::double_backward::{check_hvp, create};
use ember::autograd;
use ember::linalg::{self, MatrixNorm, QrMode, Uplo};
use ember::prelude::*;

/// `a aᵀ + n I`: symmetric positive definite, well conditioned.
fn spd(a: &Tensor) -> Result<Tensor> {
    let n = a.shape()[a.rank() - 1];
    let eye = Tensor::eye(n, DType::F64, &a.device())?.mul(n as f64)?;
    a.matmul(&a.transpose(-2, -1)?)?.add(&eye)
}

/// The inverse, the determinant, its logarithm, matrix powers, diagonals and
/// traces.
fn inverses(x: &[Tensor]) -> Result<Tensor> {
    let a = &x[0]; // [3, 3]
    let m = a.add(&Tensor::eye(3, DType::F64, &a.device())?.mul(3.0)?)?;
    let (_, logabs) = linalg::slogdet(&m)?;
    linalg::inv(&m)?
        .square()?
        .sum_all()?
        .add(&logabs.mul(2.0)?)?
        .add(&linalg::det(&m)?.sin()?)?
        .add(&linalg::matrix_power(&m, -2)?.sum_all()?)?
        .add(&linalg::matrix_power(a, 3)?.tanh()?.sum_all()?)?
        .add(&linalg::inv(&m)?.diagonal(0, 0, 1)?.exp()?.sum_all()?)?
        .add(&a.mul(a)?.trace()?.square()?)
}

/// General and triangular solves (broadcast batch dims, both sides, unit
/// diagonals) and the Cholesky factor.
fn solves(x: &[Tensor]) -> Result<Tensor> {
    let (a, b) = (&x[0], &x[1]); // [2, 3, 3], [3, 2]
    let m = spd(a)?;
    let s = linalg::solve(&m, b)?.square()?.sum_all()?;
    let s = s.add(
        &linalg::solve_with(&m, &b.transpose(0, 1)?, false)?
            .sin()?
            .sum_all()?,
    )?;
    let up = linalg::solve_triangular(&m, b, true, true, false)?;
    let s = s.add(&up.square()?.sum_all()?)?;
    let low = linalg::solve_triangular(&a.sin()?, b, false, true, true)?;
    let s = s.add(&low.tanh()?.sum_all()?)?;
    let l = linalg::cholesky(&m, false)?;
    let weights = Tensor::arange(1.0f64, 10.0, &a.device())?.reshape([3, 3])?;
    s.add(&l.square()?.mul(&weights)?.sum_all()?)
}

/// QR (tall and wide), LU, the symmetric eigendecomposition and the SVD, through
/// functions that do not depend on the vectors' signs, and what is made of
/// them (`eigvalsh`, `svdvals`, `pinv`, `lstsq`, the nuclear and 2-norms).
fn decompositions(x: &[Tensor]) -> Result<Tensor> {
    let (a, b) = (&x[0], &x[1]); // [4, 3], [4, 2]
    let dev = a.device();
    let (q, r) = linalg::qr(a, QrMode::Reduced)?;
    let s = q.sin()?.sum_all()?.add(&r.square()?.sum_all()?)?;
    let (qw, rw) = linalg::qr(&a.transpose(0, 1)?, QrMode::Reduced)?;
    let s = s.add(&qw.exp()?.sum_all()?)?.add(&rw.tanh()?.sum_all()?)?;
    let sq = a.transpose(0, 1)?.matmul(a)?; // [3, 3], symmetric
    let (w, v) = linalg::eigh(&sq, Uplo::Lower)?;
    let c = Tensor::from_vec(vec![1.0f64, -2.0, 0.5], [3], &dev)?;
    let s = s
        .add(&w.square()?.sum_all()?)?
        .add(&v.square()?.mul(&c)?.sum_all()?)?;
    let s = s.add(&linalg::eigvalsh(&sq, Uplo::Upper)?.exp()?.sum_all()?)?;
    let (u, sv, vh) = linalg::svd(a, false)?;
    let s = s
        .add(&sv.pow(3.0)?.sum_all()?)?
        .add(&u.square()?.mul(&c)?.sum_all()?)?
        .add(&vh.square()?.mul(&c.unsqueeze(1)?)?.sum_all()?)?;
    let s = s.add(&linalg::svdvals(&a.sin()?)?.pow(3.0)?.sum_all()?)?;
    let s = s.add(&linalg::pinv(a)?.square()?.sum_all()?)?;
    let s = s.add(&linalg::lstsq(a, b)?.sin()?.sum_all()?)?;
    let (_, ls, us) = linalg::lu(&sq.sin()?)?;
    let s = s.add(&ls.exp()?.sum_all()?)?.add(&us.tanh()?.sum_all()?)?;
    let (_, l, lu_u) = linalg::lu(a)?;
    let s = s
        .add(&l.sin()?.sum_all()?)?
        .add(&lu_u.square()?.sum_all()?)?;
    let (packed, _) = linalg::lu_factor(&a.transpose(0, 1)?.sin()?)?;
    let s = s.add(&packed.exp()?.sum_all()?)?;
    let nuc = linalg::matrix_norm(a, MatrixNorm::Nuc, false)?;
    let two = linalg::matrix_norm(&a.cos()?, MatrixNorm::Ord(2.0), false)?;
    s.add(&nuc.square()?)?.add(&two.exp()?)
}

fn hvp_inverses(dev: &Device) -> Result<()> {
    check_hvp("inverses", inverses, &[&[3, 3]], dev)
}

fn hvp_solves(dev: &Device) -> Result<()> {
    check_hvp("solves", solves, &[&[2, 3, 3], &[3, 2]], dev)
}

fn hvp_decompositions(dev: &Device) -> Result<()> {
    check_hvp("decompositions", decompositions, &[&[4, 3], &[4, 2]], dev)
}

/// `det` at a singular matrix under `create_graph`: the first gradient is
/// the adjugate's transpose, as without it; differentiating it is an error.
fn det_singular_twice(dev: &Device) -> Result<()> {
    let m = Tensor::from_vec(vec![1.0f64, 2.0, 2.0, 4.0], [2, 2], dev)?.requires_grad_(true)?;
    let g = autograd::grad_with(&[&linalg::det(&m)?], &[&m], create())?[0]
        .clone()
        .unwrap();
    let got = g.to_vec::<f64>()?;
    assert_close(&got, &[4.0, -2.0, -2.0, 1.0], 1e-12, 1e-12);
    let e = autograd::grad(&[&g.sum_all()?], &[&m])
        .unwrap_err()
        .to_string();
    assert!(e.contains("singular") && e.contains("det"), "{e}");
    Ok(())
}

device_test!(
    hvp_inverses,
    hvp_solves,
    hvp_decompositions,
    det_singular_twice
);

/// The golden case of this file: a Gaussian likelihood with a learned
/// covariance, its Hessian-vector product in the covariance's factor.
pub(super) fn golden_case(
    name: &str,
    inputs: &[(String, Tensor)],
    dev: &Device,
) -> Result<Vec<(&'static str, Tensor)>> {
    assert_eq!(name, "linalg_hvp", "no golden case {name} here");
    let t = |k: &str| inputs.iter().find(|(n, _)| n == k).unwrap().1.clone();
    let (m, r) = (t("m"), t("r"));
    let s = m
        .matmul(&m.transpose(0, 1)?)?
        .add(&Tensor::eye(3, DType::F64, dev)?)?;
    let chol = linalg::cholesky(&s, false)?;
    let z = linalg::solve_triangular(&chol, &r, false, true, false)?;
    let nll = z
        .square()?
        .sum_all()?
        .mul(0.5)?
        .add(&chol.diagonal(0, 0, 1)?.log()?.sum_all()?.mul(2.0)?)?;
    let extra = linalg::eigvalsh(&s, Uplo::Lower)?
        .log()?
        .sum_all()?
        .add(&linalg::det(&s)?.sqrt()?)?
        .add(&linalg::inv(&s)?.diagonal(0, 0, 1)?.sum_all()?)?
        .add(&linalg::svdvals(&m)?.pow(3.0)?.sum_all()?)?
        .add(&linalg::slogdet(&s)?.1)?;
    let loss = nll.add(&extra.mul(0.1)?)?;
    let g = autograd::grad_with(&[&loss], &[&m], create())?[0]
        .clone()
        .unwrap();
    let direction = m.detach().flip([0])?;
    let hv = autograd::grad(&[&g.mul(&direction)?.sum_all()?], &[&m])?;
    Ok(vec![("loss", loss), ("hv", hv[0].clone())])
}
