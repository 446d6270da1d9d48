//! What is built on the factorizations: pseudo-inverse, rank, least squares,
//! matrix powers and norms, and chained products. Each is a composite of
//! recorded ops, so its gradient comes from theirs.

use super::{check_matrix, check_square, dims, mt, svd, svdvals};
use crate::{
    dtype::DType,
    error::{Error, Result},
    tensor::Tensor,
};

/// The relative and absolute tolerances of [`pinv_with`] and
/// [`matrix_rank_with`], PyTorch's rule: `max(atol, rtol · σ₁)`, `rtol`
/// defaulting to `eps · max(m, n)` when neither is given and to 0 when only a
/// positive `atol` is.
fn tolerance(a: &Tensor, s: &Tensor, atol: Option<f64>, rtol: Option<f64>) -> Result<Tensor> {
    let (m, n) = dims(a);
    let eps = match a.dtype() {
        DType::F32 => f64::from(f32::EPSILON),
        _ => f64::EPSILON,
    };
    let rtol = match (atol, rtol) {
        (_, Some(r)) => r,
        (Some(a), None) if a > 0.0 => 0.0,
        _ => eps * m.max(n) as f64,
    };
    let k = s.shape()[s.rank() - 1];
    let smax = if k == 0 {
        Tensor::zeros(&s.shape()[..s.rank() - 1], s.dtype(), &s.device())?
    } else {
        s.narrow(-1, 0, 1)?.squeeze(-1)?
    };
    smax.mul(rtol)?.clamp_min(atol.unwrap_or(0.0))
}

/// The Moore-Penrose pseudo-inverse of each matrix (`torch.linalg.pinv`),
/// through the SVD: singular values at most `eps · max(m, n) · σ₁` are taken
/// as zero.
///
/// ```
/// use ember::linalg;
/// use ember::prelude::*;
/// let a = Tensor::new(&[[1f64, 0.], [0., 2.], [0., 0.]], &Device::Cpu)?;
/// let p = linalg::pinv(&a)?.to_vec2::<f64>()?;
/// assert!((p[0][0] - 1.0).abs() < 1e-12 && (p[1][1] - 0.5).abs() < 1e-12 && p[0][2] == 0.0);
/// # Ok::<(), ember::Error>(())
/// ```
pub fn pinv(a: &Tensor) -> Result<Tensor> {
    pinv_with(a, None, None)
}

/// [`pinv`] with PyTorch's `atol` and `rtol`.
pub fn pinv_with(a: &Tensor, atol: Option<f64>, rtol: Option<f64>) -> Result<Tensor> {
    const OP: &str = "linalg.pinv";
    let _record = crate::profiler::function(OP);
    check_matrix(OP, a, "A")?;
    let (u, s, vh) = svd(a, false)?;
    let tol = tolerance(a, &s.detach(), atol, rtol)?.unsqueeze(-1)?;
    let keep = s.gt(&tol)?;
    // 1/σ where kept; the division never sees a zero, so its gradient is finite
    let sinv = keep.where_(&keep.where_(&s, 1.0)?.recip()?, 0.0)?;
    mt(&vh)?.mul(&sinv.unsqueeze(-2)?)?.matmul(&mt(&u)?)
}

/// The rank of each matrix (`torch.linalg.matrix_rank`), int64: the number of
/// singular values above `eps · max(m, n) · σ₁`.
pub fn matrix_rank(a: &Tensor) -> Result<Tensor> {
    matrix_rank_with(a, None, None)
}

/// [`matrix_rank`] with PyTorch's `atol` and `rtol`.
pub fn matrix_rank_with(a: &Tensor, atol: Option<f64>, rtol: Option<f64>) -> Result<Tensor> {
    const OP: &str = "linalg.matrix_rank";
    let _record = crate::profiler::function(OP);
    check_matrix(OP, a, "A")?;
    let s = svdvals(&a.detach())?;
    let tol = tolerance(a, &s, atol, rtol)?.unsqueeze(-1)?;
    s.gt(&tol)?.to_dtype(DType::I64)?.sum(-1, false)
}

/// The `n`-th power of each square matrix (`torch.linalg.matrix_power`): the
/// identity for 0, products by repeated squaring, and powers of the inverse
/// for negative `n` (a singular matrix is then an error).
pub fn matrix_power(a: &Tensor, n: i64) -> Result<Tensor> {
    const OP: &str = "linalg.matrix_power";
    let _record = crate::profiler::function(OP);
    let size = check_square(OP, a)?;
    if n == 0 {
        // the identity, whose gradient with respect to A is zero (as PyTorch's)
        let eye = Tensor::eye(size, a.dtype(), &a.device())?
            .expand(a.shape())?
            .contiguous()?;
        return Ok(Tensor::record_twice(
            eye,
            "linalg_matrix_power",
            &[a],
            |_| |g: &Tensor| Ok(vec![Some(g.zeros_like()?)]),
        ));
    }
    let base = if n < 0 { super::inv(a)? } else { a.clone() };
    let mut e = n.unsigned_abs();
    let (mut result, mut square): (Option<Tensor>, Tensor) = (None, base);
    loop {
        if e & 1 == 1 {
            result = Some(match result {
                None => square.clone(),
                Some(r) => r.matmul(&square)?,
            });
        }
        e >>= 1;
        if e == 0 {
            break;
        }
        square = square.matmul(&square)?;
    }
    result.ok_or_else(|| Error::invalid(OP, "no power computed"))
}

/// Which norm [`matrix_norm`] computes (PyTorch's `ord`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MatrixNorm {
    /// Frobenius: the square root of the sum of squares (`"fro"`, the default).
    Fro,
    /// Nuclear: the sum of the singular values (`"nuc"`).
    Nuc,
    /// `1`/`-1`: the largest/smallest column sum of absolute values; `2`/`-2`:
    /// the largest/smallest singular value; `inf`/`-inf`: the largest/smallest
    /// row sum of absolute values. Other orders are an error.
    Ord(f64),
}

/// A matrix norm of each matrix (`torch.linalg.matrix_norm`), over the last two
/// dims; `keepdim` keeps them as size 1.
///
/// ```
/// use ember::linalg::{self, MatrixNorm};
/// use ember::prelude::*;
/// let a = Tensor::new(&[[1f64, -2.], [3., 4.]], &Device::Cpu)?;
/// assert_eq!(linalg::matrix_norm(&a, MatrixNorm::Ord(1.0), false)?.item::<f64>()?, 6.0);
/// assert_eq!(linalg::matrix_norm(&a, MatrixNorm::Ord(f64::INFINITY), false)?.item::<f64>()?, 7.0);
/// assert_eq!(linalg::matrix_norm(&a, MatrixNorm::Fro, false)?.item::<f64>()?, 30f64.sqrt());
/// # Ok::<(), ember::Error>(())
/// ```
pub fn matrix_norm(a: &Tensor, ord: MatrixNorm, keepdim: bool) -> Result<Tensor> {
    const OP: &str = "linalg.matrix_norm";
    let _record = crate::profiler::function(OP);
    check_matrix(OP, a, "A")?;
    let keep2 = |t: Tensor| -> Result<Tensor> {
        if keepdim {
            t.unsqueeze(-1)?.unsqueeze(-1)
        } else {
            Ok(t)
        }
    };
    match ord {
        MatrixNorm::Fro => a.vector_norm(2.0, [-2i64, -1], keepdim),
        MatrixNorm::Nuc => keep2(svdvals(a)?.sum(-1, false)?),
        MatrixNorm::Ord(p) if p.abs() == 2.0 => {
            let s = svdvals(a)?;
            keep2(if p > 0.0 {
                s.max(-1, false)?
            } else {
                s.min(-1, false)?
            })
        }
        MatrixNorm::Ord(p) if p.abs() == 1.0 || p.is_infinite() => {
            // column sums (1) or row sums (inf), then their extreme
            let (sum_dim, ext_dim) = if p.abs() == 1.0 { (-2, -1) } else { (-1, -2) };
            let sums = a.abs()?.sum(sum_dim, true)?;
            let e = if p > 0.0 {
                sums.max(ext_dim, true)?
            } else {
                sums.min(ext_dim, true)?
            };
            if keepdim {
                Ok(e)
            } else {
                e.squeeze(-1)?.squeeze(-1)
            }
        }
        MatrixNorm::Ord(p) => Err(Error::invalid(OP, format!("Order {p} not supported."))),
    }
}

/// The product of a chain of matrices (`torch.linalg.multi_dot`), multiplied in
/// the order that needs the fewest multiplications. The first may be a 1-D
/// row vector and the last a 1-D column vector; the others are 2-D.
pub fn multi_dot(tensors: &[&Tensor]) -> Result<Tensor> {
    const OP: &str = "linalg.multi_dot";
    let _record = crate::profiler::function(OP);
    let count = tensors.len();
    if count < 2 {
        return Err(Error::invalid(
            OP,
            format!("multi_dot(): expected at least 2 tensors but got {count}"),
        ));
    }
    let mut ms: Vec<Tensor> = Vec::with_capacity(count);
    for (i, t) in tensors.iter().enumerate() {
        let r = t.rank();
        let m = match (i, r) {
            (0, 1) => t.unsqueeze(0)?,
            (i, 1) if i == count - 1 => t.unsqueeze(-1)?,
            (_, 2) => (*t).clone(),
            (0, _) => {
                return Err(Error::invalid(
                    OP,
                    format!("multi_dot(): the first tensor must be 1D or 2D but got {r}D"),
                ))
            }
            (i, _) if i == count - 1 => {
                return Err(Error::invalid(
                    OP,
                    format!("multi_dot(): the last tensor must be 1D or 2D but got {r}D"),
                ))
            }
            _ => {
                return Err(Error::invalid(
                    OP,
                    format!("multi_dot(): tensor {i} must be 2D but got {r}D"),
                ))
            }
        };
        if let Some(prev) = ms.last() {
            if prev.shape()[1] != m.shape()[0] {
                return Err(Error::invalid(
                    OP,
                    format!(
                        "multi_dot(): tensors {} and {i} with shapes {:?} and {:?} cannot be multiplied",
                        i - 1,
                        tensors[i - 1].shape(),
                        t.shape()
                    ),
                ));
            }
        }
        ms.push(m);
    }
    // the chain's dims p_0 .. p_count, and the cheapest split of each span
    let p: Vec<usize> = std::iter::once(ms[0].shape()[0])
        .chain(ms.iter().map(|m| m.shape()[1]))
        .collect();
    let mut cost = vec![vec![0usize; count]; count];
    let mut split = vec![vec![0usize; count]; count];
    for len in 1..count {
        for i in 0..count - len {
            let j = i + len;
            cost[i][j] = usize::MAX;
            for k in i..j {
                let c = cost[i][k]
                    .saturating_add(cost[k + 1][j])
                    .saturating_add(p[i] * p[k + 1] * p[j + 1]);
                if c < cost[i][j] {
                    cost[i][j] = c;
                    split[i][j] = k;
                }
            }
        }
    }
    fn chain(ms: &[Tensor], split: &[Vec<usize>], i: usize, j: usize) -> Result<Tensor> {
        if i == j {
            return Ok(ms[i].clone());
        }
        let k = split[i][j];
        chain(ms, split, i, k)?.matmul(&chain(ms, split, k + 1, j)?)
    }
    let mut out = chain(&ms, &split, 0, count - 1)?;
    if tensors[count - 1].rank() == 1 {
        out = out.squeeze(-1)?;
    }
    if tensors[0].rank() == 1 {
        out = out.squeeze(0)?;
    }
    Ok(out)
}

/// The least-squares solution of `A X = B` (`torch.linalg.lstsq(A,
/// B).solution`): the `X` of smallest norm among those minimising `‖A X -
/// B‖`, for `A` `[..., m, n]` of any shape or rank and `B` `[..., m, k]`
/// (batch dims broadcast), through the pseudo-inverse.
pub fn lstsq(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    const OP: &str = "linalg.lstsq";
    let _record = crate::profiler::function(OP);
    check_matrix(OP, a, "A")?;
    check_matrix(OP, b, "B")?;
    if dims(a).0 != dims(b).0 {
        return Err(Error::shape(
            OP,
            a.shape(),
            b.shape(),
            "input.size(-2) should match other.size(-2)",
        ));
    }
    pinv(a)?.matmul(b)
}
