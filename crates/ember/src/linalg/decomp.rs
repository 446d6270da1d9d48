//! QR, the symmetric eigendecomposition and the SVD, with their gradients.

use super::{check_matrix, check_square, dense, dims, mt, out, per_matrix, record_packed};
use crate::{
    dtype::DType,
    error::{Error, Result},
    tensor::Tensor,
};

/// Which factors [`qr`] returns (PyTorch's `mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum QrMode {
    /// `Q` `m × k` and `R` `k × n`, `k = min(m, n)` (`"reduced"`, the default).
    #[default]
    Reduced,
    /// `Q` `m × m` and `R` `m × n` (`"complete"`).
    Complete,
    /// `R` only (`k × n`); `Q` is an empty tensor (`"r"`).
    R,
}

/// Which triangle of a symmetric matrix [`eigh`] reads (PyTorch's `UPLO`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Uplo {
    /// The lower triangle (`"L"`, the default).
    #[default]
    Lower,
    /// The upper triangle (`"U"`).
    Upper,
}

/// The QR decomposition of each matrix (`torch.linalg.qr`): `A = Q R` with `Q`'s
/// columns orthonormal and `R` upper triangular, by Householder reflections
/// whose signs are LAPACK's (so `R`'s diagonal has the signs PyTorch's has).
/// Differentiable in the reduced mode, and in the complete mode when `m ≤ n`.
///
/// ```
/// use ember::linalg::{self, QrMode};
/// use ember::prelude::*;
/// let a = Tensor::new(&[[3f64, 1.], [4., 2.], [0., 2.]], &Device::Cpu)?;
/// let (q, r) = linalg::qr(&a, QrMode::Reduced)?;
/// assert_eq!((q.shape(), r.shape()), (&[3, 2][..], &[2, 2][..]));
/// let back = q.matmul(&r)?.to_vec2::<f64>()?;
/// assert!((back[1][0] - 4.0).abs() < 1e-12 && (back[2][1] - 2.0).abs() < 1e-12);
/// # Ok::<(), ember::Error>(())
/// ```
pub fn qr(a: &Tensor, mode: QrMode) -> Result<(Tensor, Tensor)> {
    const OP: &str = "linalg.qr";
    let _record = crate::profiler::function(OP);
    check_matrix(OP, a, "A")?;
    let (m, n) = dims(a);
    let k = m.min(n);
    let complete = mode == QrMode::Complete;
    let (qc, rr) = if complete { (m, m) } else { (k, k) };
    if mode == QrMode::R {
        let r = per_matrix(OP, a, &[out(&[k, n])], |x| {
            Ok(vec![dense::qr(x, m, n, false, false).1])
        })?
        .remove(0);
        let r = Tensor::record(r, "linalg_qr", &[a], |_| {
            |_: &Tensor| {
                Err(Error::invalid(
                    "linalg.qr",
                    "The derivative of linalg.qr depends on Q, which is not computed when mode='r'. Please use linalg.qr(A, mode='reduced') if you are going to differentiate through linalg.qr.",
                ))
            }
        });
        let q = Tensor::zeros([0], a.dtype(), &a.device())?;
        return Ok((q, r));
    }
    let mut f = per_matrix(OP, a, &[out(&[m, qc]), out(&[rr, n])], |x| {
        let (q, r) = dense::qr(x, m, n, complete, true);
        Ok(vec![q, r])
    })?;
    let r = f.remove(1);
    let q = f.remove(0);
    let ad = a.save();
    let mut parts = record_packed(vec![q, r], "linalg_qr", &[a], move |g, qr| {
        if complete && m > n {
            return Err(Error::invalid(
                "linalg.qr",
                "The QR decomposition is not differentiable when mode='complete' and nrows > ncols.",
            ));
        }
        Ok(vec![Some(qr_backward(
            &ad.value()?,
            &qr[0],
            &qr[1],
            &g[0],
            &g[1],
        )?)])
    })?;
    let r = parts.remove(1);
    Ok((parts.remove(0), r))
}

/// The gradient of `A = Q R` (reduced, or `m ≤ n`) from those of `Q` and `R`.
fn qr_backward(a: &Tensor, q: &Tensor, r: &Tensor, gq: &Tensor, gr: &Tensor) -> Result<Tensor> {
    let (m, n) = dims(a);
    if m < n {
        // A = [X | Y] with X = Q R₁ square and R₂ = Qᵀ Y: Ȳ = Q R̄₂, and X sees
        // Q̄ + Y R̄₂ᵀ
        let y = a.narrow(-1, m as i64, n - m)?;
        let (r1, gr1) = (r.narrow(-1, 0, m)?, gr.narrow(-1, 0, m)?);
        let gr2 = gr.narrow(-1, m as i64, n - m)?;
        let gq = gq.add(&y.matmul(&mt(&gr2)?)?)?;
        let gx = qr_backward_tall(q, &r1, &gq, &gr1)?;
        let gy = q.matmul(&gr2)?;
        return Tensor::cat(&[&gx, &gy], -1);
    }
    qr_backward_tall(q, r, gq, gr)
}

/// `Ā = (Q̄ + Q N) R⁻ᵀ` with `M = R̄ Rᵀ - Qᵀ Q̄` and `N` its upper triangle
/// mirrored below (for `m ≥ n`).
fn qr_backward_tall(q: &Tensor, r: &Tensor, gq: &Tensor, gr: &Tensor) -> Result<Tensor> {
    let m = gr.matmul(&mt(r)?)?.sub(&mt(q)?.matmul(gq)?)?;
    let nn = m.triu(0)?.add(&mt(&m.triu(1)?)?)?;
    let lhs = gq.add(&q.matmul(&nn)?)?;
    // Z R⁻ᵀ: solve Y Rᵀ = Z
    super::solve_triangular(&mt(r)?, &lhs, false, false, false)
}

/// Eigenvalues (ascending) and orthonormal eigenvectors (columns) of each
/// symmetric matrix (`torch.linalg.eigh`), of which only the `uplo` triangle
/// is read. Each eigenvector is determined only up to its sign (and within a
/// repeated eigenvalue's space): compare them through something the choice
/// does not change. Gradients are PyTorch's, well defined for losses that do
/// not depend on that choice and eigenvalues that are distinct.
///
/// ```
/// use ember::linalg::{self, Uplo};
/// use ember::prelude::*;
/// let a = Tensor::new(&[[2f64, 1.], [1., 2.]], &Device::Cpu)?;
/// let (w, v) = linalg::eigh(&a, Uplo::Lower)?;
/// let w = w.to_vec1::<f64>()?;
/// assert!((w[0] - 1.0).abs() < 1e-12 && (w[1] - 3.0).abs() < 1e-12);
/// // A v = λ v
/// let av = a.matmul(&v)?.sub(&v.mul(&Tensor::new(&[1f64, 3.], &Device::Cpu)?)?)?;
/// assert!(av.abs()?.max_all()?.item::<f64>()? < 1e-12);
/// # Ok::<(), ember::Error>(())
/// ```
pub fn eigh(a: &Tensor, uplo: Uplo) -> Result<(Tensor, Tensor)> {
    const OP: &str = "linalg.eigh";
    let _record = crate::profiler::function(OP);
    let n = check_square(OP, a)?;
    let lower = uplo == Uplo::Lower;
    let mut f = per_matrix(OP, a, &[out(&[n]), out(&[n, n])], |x| {
        let (w, v) = dense::eigh(x, n, lower, true);
        Ok(vec![w, v])
    })?;
    let v = f.remove(1);
    let w = f.remove(0);
    // the packing needs matrices: the eigenvalues travel as a row
    let mut parts = record_packed(
        vec![w.unsqueeze(-2)?, v],
        "linalg_eigh",
        &[a],
        move |g, wv| {
            Ok(vec![Some(eigh_backward(
                &wv[0].squeeze(-2)?,
                &wv[1],
                &g[0].squeeze(-2)?,
                Some(&g[1]),
            )?)])
        },
    )?;
    let v = parts.remove(1);
    Ok((parts.remove(0).squeeze(-2)?, v))
}

/// The eigenvalues of each symmetric matrix, ascending
/// (`torch.linalg.eigvalsh`); see [`eigh`].
pub fn eigvalsh(a: &Tensor, uplo: Uplo) -> Result<Tensor> {
    const OP: &str = "linalg.eigvalsh";
    let _record = crate::profiler::function(OP);
    let n = check_square(OP, a)?;
    let lower = uplo == Uplo::Lower;
    if !crate::autograd::needs_grad(&[a]) {
        return Ok(per_matrix(OP, a, &[out(&[n])], |x| {
            Ok(vec![dense::eigh(x, n, lower, false).0])
        })?
        .remove(0));
    }
    // the gradient needs the vectors: one node over both, of which the
    // values are given back (the rule reads the vectors with their history in a
    // walk that creates a graph)
    let mut f = per_matrix(OP, a, &[out(&[n]), out(&[n, n])], |x| {
        let (w, v) = dense::eigh(x, n, lower, true);
        Ok(vec![w, v])
    })?;
    let v = f.remove(1);
    let w = f.remove(0);
    let mut parts = record_packed(
        vec![w.unsqueeze(-2)?, v],
        "linalg_eigvalsh",
        &[a],
        |g, wv| {
            let (w, gw) = (wv[0].squeeze(-2)?, g[0].squeeze(-2)?);
            // the vectors get a gradient from a gradient of this gradient (zeros
            // otherwise)
            Ok(vec![Some(eigh_backward(&w, &wv[1], &gw, Some(&g[1]))?)])
        },
    )?;
    parts.remove(0).squeeze(-2)
}

/// `Ā = V (diag(w̄) + F ∘ (Vᵀ V̄)) Vᵀ` with `F_ij = 1 / (w_j - w_i)` off the
/// diagonal, symmetrised (the gradient within symmetric matrices, as
/// PyTorch's).
fn eigh_backward(w: &Tensor, v: &Tensor, gw: &Tensor, gv: Option<&Tensor>) -> Result<Tensor> {
    let mut inner = gw.diag_embed(0, -2, -1)?;
    if let Some(gv) = gv {
        let diff = w.unsqueeze(-2)?.sub(&w.unsqueeze(-1)?)?;
        let f = off_diagonal_recip(&diff)?;
        let skew = f.mul(&mt(v)?.matmul(gv)?)?;
        inner = inner.add(&skew.add(&mt(&skew)?)?.mul(0.5)?)?;
    }
    v.matmul(&inner)?.matmul(&mt(v)?)
}

/// `1 / x` off the diagonal of the last two dims, zero on it.
fn off_diagonal_recip(x: &Tensor) -> Result<Tensor> {
    let n = x.shape()[x.rank() - 1];
    let eye = Tensor::eye(n, DType::Bool, &x.device())?;
    let safe = eye.where_(1.0, x)?;
    eye.where_(0.0, &safe.recip()?)
}

/// The singular value decomposition of each matrix (`torch.linalg.svd`):
/// `(U, S, Vh)` with `A = U diag(S) Vh`, `S` descending. With `full_matrices`
/// `U` is `m × m` and `Vh` `n × n`, otherwise `m × k` and `k × n` (`k = min(m,
/// n)`). Singular vectors are determined only up to sign (pairwise: `u_i` and
/// `v_i` flip together); gradients are PyTorch's, well defined for losses that
/// do not depend on that choice and distinct singular values (with
/// `full_matrices`, the gradients of the extra columns are ignored, as
/// PyTorch ignores them).
///
/// ```
/// use ember::linalg;
/// use ember::prelude::*;
/// let a = Tensor::new(&[[3f64, 0.], [0., -4.], [0., 0.]], &Device::Cpu)?;
/// let (u, s, vh) = linalg::svd(&a, false)?;
/// assert_eq!(s.to_vec1::<f64>()?, vec![4.0, 3.0]);
/// let back = u.mul(&s)?.matmul(&vh)?;
/// assert!(back.sub(&a)?.abs()?.max_all()?.item::<f64>()? < 1e-12);
/// # Ok::<(), ember::Error>(())
/// ```
pub fn svd(a: &Tensor, full_matrices: bool) -> Result<(Tensor, Tensor, Tensor)> {
    const OP: &str = "linalg.svd";
    let _record = crate::profiler::function(OP);
    check_matrix(OP, a, "A")?;
    let (m, n) = dims(a);
    let k = m.min(n);
    let (ku, kv) = if full_matrices { (m, n) } else { (k, k) };
    let mut f = per_matrix(OP, a, &[out(&[m, ku]), out(&[k]), out(&[kv, n])], |x| {
        let (u, s, vt) = dense::svd(x, m, n, full_matrices, true);
        Ok(vec![u, s, vt])
    })?;
    let vh = f.remove(2);
    let s = f.remove(1);
    let u = f.remove(0);
    let mut parts = record_packed(
        vec![u, s.unsqueeze(-2)?, vh],
        "linalg_svd",
        &[a],
        move |g, usv| {
            let gu = g[0].narrow(-1, 0, k)?;
            let gvh = g[2].narrow(-2, 0, k)?;
            let gs = g[1].squeeze(-2)?;
            let (uk, vk) = (usv[0].narrow(-1, 0, k)?, usv[2].narrow(-2, 0, k)?);
            Ok(vec![Some(svd_backward(
                &uk,
                &usv[1].squeeze(-2)?,
                &vk,
                &gs,
                Some((&gu, &gvh)),
            )?)])
        },
    )?;
    let vh = parts.remove(2);
    let s = parts.remove(1).squeeze(-2)?;
    Ok((parts.remove(0), s, vh))
}

/// The singular values of each matrix, descending (`torch.linalg.svdvals`).
/// Their gradient `U diag(S̄) Vh` is defined everywhere.
pub fn svdvals(a: &Tensor) -> Result<Tensor> {
    const OP: &str = "linalg.svdvals";
    let _record = crate::profiler::function(OP);
    check_matrix(OP, a, "A")?;
    let (m, n) = dims(a);
    let k = m.min(n);
    if !crate::autograd::needs_grad(&[a]) {
        return Ok(per_matrix(OP, a, &[out(&[k])], |x| {
            Ok(vec![dense::svd(x, m, n, false, false).1])
        })?
        .remove(0));
    }
    // the gradient needs the vectors: one node over all three, of which the
    // values are given back (as for `eigvalsh`)
    let mut f = per_matrix(OP, a, &[out(&[m, k]), out(&[k]), out(&[k, n])], |x| {
        let (u, s, vt) = dense::svd(x, m, n, false, true);
        Ok(vec![u, s, vt])
    })?;
    let (vh, s, u) = (f.remove(2), f.remove(1), f.remove(0));
    let mut parts = record_packed(
        vec![u, s.unsqueeze(-2)?, vh],
        "linalg_svdvals",
        &[a],
        |g, usv| {
            let (s, gs) = (usv[1].squeeze(-2)?, g[1].squeeze(-2)?);
            // the vectors get a gradient from a gradient of this gradient (zeros
            // otherwise)
            let gvecs = Some((&g[0], &g[2]));
            Ok(vec![Some(svd_backward(&usv[0], &s, &usv[2], &gs, gvecs)?)])
        },
    )?;
    parts.remove(1).squeeze(-2)
}

/// The gradient of the reduced SVD `A = U S Vᵀ` (`Vh = Vᵀ`, `k` columns):
/// `U [diag(S̄) + (F ∘ (UᵀŪ - ŪᵀU)) S + S (F ∘ (VᵀV̄ - V̄ᵀV))] Vᵀ`, plus
/// `(I - UUᵀ) Ū S⁻¹ Vᵀ` when `m > k` and `U S⁻¹ V̄ᵀ (I - VVᵀ)` when `n > k`,
/// with `F_ij = 1 / (s_j² - s_i²)` off the diagonal.
fn svd_backward(
    u: &Tensor,
    s: &Tensor,
    vh: &Tensor,
    gs: &Tensor,
    gvecs: Option<(&Tensor, &Tensor)>,
) -> Result<Tensor> {
    let mut inner = gs.diag_embed(0, -2, -1)?;
    let Some((gu, gvh)) = gvecs else {
        return u.matmul(&inner)?.matmul(vh);
    };
    let (m, n) = (u.shape()[u.rank() - 2], vh.shape()[vh.rank() - 1]);
    let k = s.shape()[s.rank() - 1];
    let v = mt(vh)?;
    let gv = mt(gvh)?;
    let s2 = s.square()?;
    let f = off_diagonal_recip(&s2.unsqueeze(-2)?.sub(&s2.unsqueeze(-1)?)?)?;
    let ut_gu = mt(u)?.matmul(gu)?;
    let vt_gv = mt(&v)?.matmul(&gv)?;
    let j = f.mul(&ut_gu.sub(&mt(&ut_gu)?)?)?;
    let kk = f.mul(&vt_gv.sub(&mt(&vt_gv)?)?)?;
    let srow = s.unsqueeze(-2)?;
    let scol = s.unsqueeze(-1)?;
    // (J) S scales J's columns, S (K) scales K's rows
    inner = inner.add(&j.mul(&srow)?)?.add(&kk.mul(&scol)?)?;
    let mut ga = u.matmul(&inner)?.matmul(vh)?;
    let sinv = s.recip()?;
    if m > k {
        let proj = gu.sub(&u.matmul(&ut_gu)?)?;
        ga = ga.add(&proj.mul(&sinv.unsqueeze(-2)?)?.matmul(vh)?)?;
    }
    if n > k {
        let proj = mt(&gv)?.sub(&mt(&vt_gv)?.matmul(vh)?)?;
        ga = ga.add(&u.mul(&sinv.unsqueeze(-2)?)?.matmul(&proj)?)?;
    }
    Ok(ga)
}
