//! Linear algebra (`torch.linalg`): inverses, determinants, solvers, the
//! Cholesky, LU, QR, symmetric eigen- and singular value decompositions, and
//! what is built on them (pseudo-inverse, rank, matrix powers and norms,
//! least squares, chained products).
//!
//! Every function takes batches: the last two dims are the matrices, the ones
//! before them the batch. Inputs are float32 or float64 (PyTorch refuses
//! integers and half precision, and so does ember); each factorization runs in
//! float64 and its result is given back in the input's dtype, so float32
//! results are at least as accurate as PyTorch's. Gradients follow PyTorch's
//! formulas.
//!
//! **Where it runs**: the factorizations run on the host (a tensor on a GPU is
//! copied to host memory, factorized, and its results copied back, with a
//! synchronize), one thread per matrix of a batch. They are correct on every
//! device but not GPU-accelerated; products and the other ops around them
//! (and in their gradients) run on the tensors' device as usual. On `meta`
//! every function gives results of the right shape and dtype, without values.
//!
//! ```
//! use ember::linalg;
//! use ember::prelude::*;
//! let a = Tensor::new(&[[4f64, 1.], [2., 3.]], &Device::Cpu)?;
//! let b = Tensor::new(&[1f64, 2.], &Device::Cpu)?;
//! let x = linalg::solve(&a, &b)?;
//! assert_eq!(x.to_vec1::<f64>()?, vec![0.1, 0.6]);
//! assert!((linalg::det(&a)?.item::<f64>()? - 10.0).abs() < 1e-12);
//! // the eigenvalues of a symmetric matrix, ascending
//! let s = Tensor::new(&[[2f64, 1.], [1., 2.]], &Device::Cpu)?;
//! let w = linalg::eigvalsh(&s, linalg::Uplo::Lower)?;
//! assert!((w.to_vec1::<f64>()?[1] - 3.0).abs() < 1e-12);
//! # Ok::<(), ember::Error>(())
//! ```

mod decomp;
mod dense;
mod derived;

pub use decomp::{eigh, eigvalsh, qr, svd, svdvals, QrMode, Uplo};
pub use derived::{
    lstsq, matrix_norm, matrix_power, matrix_rank, matrix_rank_with, multi_dot, pinv, pinv_with,
    MatrixNorm,
};

use crate::{
    device::Device,
    dtype::DType,
    error::{Error, Result},
    tensor::Tensor,
};
use rayon::prelude::*;

/// PyTorch's checks of a matrix argument: float32/float64, at least 2-D.
fn check_matrix(op: &'static str, a: &Tensor, name: &str) -> Result<()> {
    match a.dtype() {
        DType::F32 | DType::F64 => {}
        DType::F16 | DType::BF16 => {
            return Err(Error::invalid(
                op,
                format!(
                    "Low precision dtypes not supported. Got {}",
                    crate::tensor::torch_dtype_name(a.dtype())
                ),
            ))
        }
        dt => {
            return Err(Error::invalid(
                op,
                format!(
                    "Expected a floating point or complex tensor as input. Got {}",
                    crate::tensor::torch_dtype_name(dt)
                ),
            ))
        }
    }
    if a.rank() < 2 {
        return Err(Error::invalid(
            op,
            format!("The input tensor {name} must have at least 2 dimensions."),
        ));
    }
    Ok(())
}

/// [`check_matrix`], and square.
fn check_square(op: &'static str, a: &Tensor) -> Result<usize> {
    check_matrix(op, a, "A")?;
    let (m, n) = dims(a);
    if m != n {
        return Err(Error::invalid(
            op,
            format!("A must be batches of square matrices, but they are {m} by {n} matrices"),
        ));
    }
    Ok(n)
}

/// The matrix dims `(rows, cols)` of a tensor of rank 2 or more.
fn dims(a: &Tensor) -> (usize, usize) {
    let s = a.shape();
    (s[s.len() - 2], s[s.len() - 1])
}

/// The batch dims of a tensor of rank 2 or more.
fn batch_dims(a: &Tensor) -> Vec<usize> {
    a.shape()[..a.rank() - 2].to_vec()
}

/// One output of [`per_matrix`]: its shape per matrix and its dtype (`None`:
/// the input's).
struct Out {
    shape: Vec<usize>,
    dtype: Option<DType>,
}

fn out(shape: &[usize]) -> Out {
    Out {
        shape: shape.to_vec(),
        dtype: None,
    }
}

/// Runs `f` on each matrix of `a` (row-major float64 values) in parallel on the
/// host and assembles its outputs as tensors `[...batch, ...shape]` on `a`'s
/// device. An error `f` returns for a matrix is reported as PyTorch reports
/// it, with the matrix's batch index where `a` is batched. On `meta` the
/// outputs are made without running `f`.
fn per_matrix(
    op: &'static str,
    a: &Tensor,
    outs: &[Out],
    f: impl Fn(&[f64]) -> std::result::Result<Vec<Vec<f64>>, String> + Sync,
) -> Result<Vec<Tensor>> {
    let batch = batch_dims(a);
    let (m, n) = dims(a);
    let count: usize = batch.iter().product();
    let shapes: Vec<Vec<usize>> = outs
        .iter()
        .map(|o| batch.iter().chain(&o.shape).copied().collect())
        .collect();
    let dtype = |o: &Out| o.dtype.unwrap_or(a.dtype());
    let dev = a.device();
    if dev.is_meta() {
        return outs
            .iter()
            .zip(&shapes)
            .map(|(o, s)| Tensor::zeros(s.as_slice(), dtype(o), &dev))
            .collect();
    }
    let values = a.to_vec::<f64>()?;
    let size = m * n;
    let results: Vec<std::result::Result<Vec<Vec<f64>>, String>> = (0..count)
        .into_par_iter()
        .map(|b| f(&values[b * size..(b + 1) * size]))
        .collect();
    let mut flat: Vec<Vec<f64>> = outs
        .iter()
        .map(|o| Vec::with_capacity(count * o.shape.iter().product::<usize>()))
        .collect();
    for (b, r) in results.into_iter().enumerate() {
        let parts = r.map_err(|msg| match batch.is_empty() {
            true => Error::invalid(op, msg),
            false => Error::invalid(op, format!("(Batch element {b}): {msg}")),
        })?;
        for (dst, part) in flat.iter_mut().zip(parts) {
            dst.extend(part);
        }
    }
    flat.into_iter()
        .zip(outs)
        .zip(&shapes)
        .map(|((v, o), s)| {
            Tensor::from_vec(v, s.as_slice(), &Device::Cpu)?
                .to_dtype(dtype(o))?
                .to_device(&dev)
        })
        .collect()
}

/// `Xᵀ` over the last two dims.
fn mt(x: &Tensor) -> Result<Tensor> {
    x.transpose(-2, -1)
}

/// Records one node for several outputs of one op: they are packed side by side
/// in one tensor whose rule gets the gradients of all of them (zeros for an
/// output that got none) and the outputs themselves (with their history in a
/// walk that creates a graph, so a rule written in tensor ops of them is
/// differentiable again), and given back as views of it, so a gradient
/// through any of them reaches the rule.
fn record_packed(
    parts: Vec<Tensor>,
    name: &'static str,
    inputs: &[&Tensor],
    rule: impl Fn(Vec<Tensor>, Vec<Tensor>) -> Result<Vec<Option<Tensor>>> + Send + Sync + 'static,
) -> Result<Vec<Tensor>> {
    if !crate::autograd::needs_grad(inputs) {
        return Ok(parts);
    }
    let lead = parts[0].rank() - 2;
    let batch = parts[0].shape()[..lead].to_vec();
    let shapes: Vec<Vec<usize>> = parts.iter().map(|p| p.shape().to_vec()).collect();
    let widths: Vec<usize> = shapes.iter().map(|s| s[lead..].iter().product()).collect();
    let flat: Vec<Tensor> = parts
        .iter()
        .zip(&widths)
        .map(|(p, &w)| {
            let s: Vec<usize> = batch.iter().copied().chain([w]).collect();
            p.reshape(s)
        })
        .collect::<Result<_>>()?;
    let refs: Vec<&Tensor> = flat.iter().collect();
    let packed = Tensor::cat(&refs, -1)?;
    let (shapes2, widths2) = (shapes.clone(), widths.clone());
    let packed = Tensor::record_twice(packed, name, inputs, move |y| {
        let y = y.save();
        move |g: &Tensor| {
            let grads = unpack(g, &shapes2, &widths2)?;
            rule(grads, unpack(&y.value()?, &shapes2, &widths2)?)
        }
    });
    unpack(&packed, &shapes, &widths)
}

/// The parts of a [`record_packed`] tensor: views of its last dim's `widths`
/// slices, in their `shapes`.
fn unpack(packed: &Tensor, shapes: &[Vec<usize>], widths: &[usize]) -> Result<Vec<Tensor>> {
    let mut at = 0;
    shapes
        .iter()
        .zip(widths)
        .map(|(s, &w)| {
            let part = packed.narrow(-1, at as i64, w)?.reshape(s.as_slice());
            at += w;
            part
        })
        .collect()
}

/// The inverse of each square matrix (`torch.linalg.inv`). A singular matrix
/// is an error, as PyTorch's: "The diagonal element k is zero".
///
/// ```
/// use ember::linalg;
/// use ember::prelude::*;
/// let a = Tensor::new(&[[2f64, 0.], [0., 4.]], &Device::Cpu)?;
/// assert_eq!(linalg::inv(&a)?.to_vec2::<f64>()?, vec![vec![0.5, 0.], vec![0., 0.25]]);
/// let singular = Tensor::new(&[[1f64, 2.], [2., 4.]], &Device::Cpu)?;
/// assert!(linalg::inv(&singular).is_err());
/// # Ok::<(), ember::Error>(())
/// ```
pub fn inv(a: &Tensor) -> Result<Tensor> {
    const OP: &str = "linalg.inv";
    let _record = crate::profiler::function(OP);
    let n = check_square(OP, a)?;
    let y = per_matrix(OP, a, &[out(&[n, n])], |x| {
        let lu = dense::lu_rect(x, n, n);
        if let Some(j) = lu.zero_pivot {
            return Err(format!("The diagonal element {} is zero, the inversion could not be completed because the input matrix is singular.", j + 1));
        }
        let mut eye = vec![0.0; n * n];
        for i in 0..n {
            eye[i * n + i] = 1.0;
        }
        lu.solve(n, &mut eye, n);
        Ok(vec![eye])
    })?
    .remove(0);
    Ok(Tensor::record_twice(y, "linalg_inv", &[a], |y| {
        let y = y.save();
        move |g: &Tensor| {
            // d(A⁻¹) = -A⁻¹ dA A⁻¹
            let yt = mt(&y.value()?)?;
            Ok(vec![Some(yt.matmul(g)?.matmul(&yt)?.neg()?)])
        }
    }))
}

/// The determinant of each square matrix (`torch.linalg.det`). Its gradient is
/// the transposed adjugate, so it is defined for singular matrices too.
pub fn det(a: &Tensor) -> Result<Tensor> {
    const OP: &str = "linalg.det";
    let _record = crate::profiler::function(OP);
    let n = check_square(OP, a)?;
    let d = per_matrix(OP, a, &[out(&[])], |x| {
        Ok(vec![vec![dense::lu_rect(x, n, n).det(n)]])
    })?
    .remove(0);
    Ok(Tensor::record_twice(d, "linalg_det", &[a], |_| {
        let keep = a.save();
        move |g: &Tensor| {
            let adjugate = |x: &Tensor| -> Result<Tensor> {
                per_matrix("linalg.det", x, &[out(&[n, n])], |x| {
                    Ok(vec![adjugate_transposed(x, n)])
                })
                .map(|mut r| r.remove(0))
            };
            let adj_t = if crate::autograd::creating_graph() {
                // in recorded ops: det(A) A⁻ᵀ where every matrix is invertible;
                // otherwise the adjugate, whose own gradient is an error
                let a = keep.value()?;
                match inv(&a) {
                    Ok(i) => mt(&i)?.mul(&det(&a)?.unsqueeze(-1)?.unsqueeze(-1)?)?,
                    Err(_) => {
                        let adj_t = crate::autograd::no_grad(|| adjugate(&a))?;
                        Tensor::record(adj_t, "linalg_det", &[&a], |_| {
                            |_: &Tensor| -> Result<crate::autograd::Grads> {
                                Err(Error::invalid(
                                    "linalg.det",
                                    "the gradient of det at a singular matrix is not differentiable again in ember (its second derivative is computed through the inverse)",
                                ))
                            }
                        })
                    }
                }
            } else {
                adjugate(keep.get()?)?
            };
            Ok(vec![Some(adj_t.mul(&g.unsqueeze(-1)?.unsqueeze(-1)?)?)])
        }
    }))
}

/// `adj(A)ᵀ` (the gradient of `det A`) of a row-major `n × n` matrix, through
/// its SVD `A = U S Vᵀ`: `det(U) det(V) U diag(Π_{j≠i} s_j) Vᵀ`, which holds
/// whether or not `A` is singular.
fn adjugate_transposed(x: &[f64], n: usize) -> Vec<f64> {
    let (u, s, vt) = dense::svd(x, n, n, false, true);
    let det_uv = dense::lu_rect(&u, n, n).det(n) * dense::lu_rect(&vt, n, n).det(n);
    let cof: Vec<f64> = (0..n)
        .map(|i| (0..n).filter(|&j| j != i).map(|j| s[j]).product::<f64>() * det_uv)
        .collect();
    let mut out = vec![0.0; n * n];
    for i in 0..n {
        for j in 0..n {
            out[i * n + j] = (0..n).map(|k| u[i * n + k] * cof[k] * vt[k * n + j]).sum();
        }
    }
    out
}

/// The sign and the log of the absolute value of each square matrix's
/// determinant (`torch.linalg.slogdet`): `(sign, logabsdet)`, `(0, -inf)` for
/// a singular matrix. `logabsdet` has a gradient (`A⁻ᵀ`), `sign` none.
pub fn slogdet(a: &Tensor) -> Result<(Tensor, Tensor)> {
    const OP: &str = "linalg.slogdet";
    let _record = crate::profiler::function(OP);
    let n = check_square(OP, a)?;
    let mut r = per_matrix(OP, a, &[out(&[]), out(&[])], |x| {
        let (s, l) = dense::lu_rect(x, n, n).slogdet(n);
        Ok(vec![vec![s], vec![l]])
    })?;
    let logabs = r.remove(1);
    let logabs = Tensor::record_twice(logabs, "linalg_slogdet", &[a], |_| {
        let keep = a.save();
        move |g: &Tensor| {
            let it = mt(&inv(&keep.value()?)?)?;
            Ok(vec![Some(it.mul(&g.unsqueeze(-1)?.unsqueeze(-1)?)?)])
        }
    });
    Ok((r.remove(0), logabs))
}

/// Solves `A X = B` for `X` (`torch.linalg.solve`): `A` is `[..., n, n]`, `B`
/// `[..., n, k]` or a batch of vectors `[..., n]` (when `B` is 1-D, or has
/// one dim less than `A` and `A`'s batch shape); batch dims broadcast. A
/// singular `A` is an error.
pub fn solve(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    solve_with(a, b, true)
}

/// [`solve`], or with `left` false `X A = B` (PyTorch's `left=False`).
pub fn solve_with(a: &Tensor, b: &Tensor, left: bool) -> Result<Tensor> {
    const OP: &str = "linalg.solve";
    let _record = crate::profiler::function(OP);
    if !left {
        // X A = B  ⟺  Aᵀ Xᵀ = Bᵀ
        check_matrix(OP, b, "B")?;
        return mt(&solve_with(&mt(a)?, &mt(b)?, true)?);
    }
    let n = check_square(OP, a)?;
    check_float_like(OP, b)?;
    if a.dtype() != b.dtype() {
        return Err(Error::invalid(
            OP,
            format!(
                "Expected A and B to have the same dtype, but found A of type {} and B of type {} instead",
                crate::tensor::torch_dtype_name(a.dtype()),
                crate::tensor::torch_dtype_name(b.dtype())
            ),
        ));
    }
    let vector =
        b.rank() == 1 || (b.rank() + 1 == a.rank() && b.shape() == &a.shape()[..a.rank() - 1]);
    let bm = if vector { b.unsqueeze(-1)? } else { b.clone() };
    if bm.rank() < 2 || bm.shape()[bm.rank() - 2] != n {
        let (r, c) = if vector {
            (b.shape()[b.rank() - 1], 1)
        } else if b.rank() >= 2 {
            dims(b)
        } else {
            (b.numel(), 1)
        };
        return Err(Error::invalid(
            OP,
            format!("Incompatible shapes of A and B for the equation AX = B ({n}x{n} and {r}x{c})"),
        ));
    }
    let x = solve_matrix(a, &bm)?;
    if vector {
        x.squeeze(-1)
    } else {
        Ok(x)
    }
}

/// The float checks of [`check_matrix`] without the rank's.
fn check_float_like(op: &'static str, t: &Tensor) -> Result<()> {
    if t.rank() >= 2 {
        return check_matrix(op, t, "B");
    }
    check_matrix(op, &t.unsqueeze(0)?.unsqueeze(0)?, "B")
}

/// `A X = B` for `A` `[..., n, n]` and `B` `[..., n, k]`, batch dims broadcast.
fn solve_matrix(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    const OP: &str = "linalg.solve";
    let n = dims(a).0;
    let k = dims(b).1;
    let batch = broadcast_batch(OP, a, b)?;
    let shape_a: Vec<usize> = batch.iter().copied().chain([n, n]).collect();
    let shape_b: Vec<usize> = batch.iter().copied().chain([n, k]).collect();
    let (ae, be) = (a.expand(shape_a)?, b.expand(shape_b)?);
    // both operands side by side, so one host pass factorizes and solves
    let joint = Tensor::cat(&[&ae.detach(), &be.detach()], -1)?;
    let x = per_matrix(OP, &joint, &[out(&[n, k])], |ab| {
        let w = n + k;
        let av: Vec<f64> = (0..n).flat_map(|i| ab[i * w..i * w + n].to_vec()).collect();
        let mut bv: Vec<f64> = (0..n)
            .flat_map(|i| ab[i * w + n..(i + 1) * w].to_vec())
            .collect();
        let lu = dense::lu_rect(&av, n, n);
        if lu.zero_pivot.is_some() {
            return Err("The solver failed because the input matrix is singular.".into());
        }
        lu.solve(n, &mut bv, k);
        Ok(vec![bv])
    })
    .map_err(|e| match e {
        // PyTorch names this one with its module
        Error::InvalidArgument { msg, .. } => Error::invalid("torch.linalg.solve", msg),
        e => e,
    })?
    .remove(0);
    let (sa, sb) = (a.shape().to_vec(), b.shape().to_vec());
    Ok(Tensor::record_twice(x, "linalg_solve", &[a, b], |x| {
        let (x, ad) = (x.save(), a.save());
        move |g: &Tensor| {
            // B̄ = A⁻ᵀ X̄, Ā = -B̄ Xᵀ, each summed over the batch dims it was broadcast over
            let gb = solve_matrix(&mt(&ad.value()?)?, g)?;
            let ga = gb.matmul(&mt(&x.value()?)?)?.neg()?;
            Ok(vec![
                Some(crate::autograd::sum_to(&ga, &sa)?),
                Some(crate::autograd::sum_to(&gb, &sb)?),
            ])
        }
    }))
}

/// The broadcast batch shape of two matrix operands.
fn broadcast_batch(op: &'static str, a: &Tensor, b: &Tensor) -> Result<Vec<usize>> {
    let (x, y) = (batch_dims(a), batch_dims(b));
    let r = x.len().max(y.len());
    let at = |v: &[usize], i: usize| {
        let pad = r - v.len();
        if i < pad {
            1
        } else {
            v[i - pad]
        }
    };
    (0..r)
        .map(|i| match (at(&x, i), at(&y, i)) {
            (p, q) if p == q || q == 1 => Ok(p),
            (1, q) => Ok(q),
            _ => Err(Error::shape(
                op,
                a.shape(),
                b.shape(),
                "the batch dims of A and B do not broadcast",
            )),
        })
        .collect()
}

/// Solves `T X = B` for a triangular `T` (`torch.linalg.solve_triangular`):
/// only `T`'s `upper` (or lower) triangle is read, its diagonal taken as ones
/// with `unitriangular`; with `left` false it solves `X T = B`. `T` is `[...,
/// n, n]`, `B` `[..., n, k]` (`[..., k, n]` for the right side); batch dims
/// broadcast. A zero on the diagonal gives infinities, as PyTorch's.
pub fn solve_triangular(
    t: &Tensor,
    b: &Tensor,
    upper: bool,
    left: bool,
    unitriangular: bool,
) -> Result<Tensor> {
    const OP: &str = "linalg.solve_triangular";
    let _record = crate::profiler::function(OP);
    check_square(OP, t)?;
    check_matrix(OP, b, "B")?;
    if !left {
        return mt(&solve_triangular(
            &mt(t)?,
            &mt(b)?,
            !upper,
            true,
            unitriangular,
        )?);
    }
    if t.dtype() != b.dtype() {
        return Err(Error::invalid(
            OP,
            format!(
                "Expected A and B to have the same dtype, but found A of type {} and B of type {} instead",
                crate::tensor::torch_dtype_name(t.dtype()),
                crate::tensor::torch_dtype_name(b.dtype())
            ),
        ));
    }
    let n = dims(t).0;
    let (rows, k) = dims(b);
    if rows != n {
        return Err(Error::shape(
            OP,
            t.shape(),
            b.shape(),
            format!(
                "Incompatible shapes of A and B for the equation AX = B ({n}x{n} and {rows}x{k})"
            ),
        ));
    }
    let batch = broadcast_batch(OP, t, b)?;
    let te = t.expand(batch.iter().copied().chain([n, n]).collect::<Vec<_>>())?;
    let be = b.expand(batch.iter().copied().chain([n, k]).collect::<Vec<_>>())?;
    let joint = Tensor::cat(&[&te.detach(), &be.detach()], -1)?;
    let x = per_matrix(OP, &joint, &[out(&[n, k])], |tb| {
        let w = n + k;
        let tv: Vec<f64> = (0..n).flat_map(|i| tb[i * w..i * w + n].to_vec()).collect();
        let mut bv: Vec<f64> = (0..n)
            .flat_map(|i| tb[i * w + n..(i + 1) * w].to_vec())
            .collect();
        dense::triangular_solve(&tv, n, &mut bv, k, upper, unitriangular);
        Ok(vec![bv])
    })?
    .remove(0);
    let (st, sb) = (t.shape().to_vec(), b.shape().to_vec());
    Ok(Tensor::record_twice(
        x,
        "linalg_solve_triangular",
        &[t, b],
        |x| {
            let (x, td) = (x.save(), t.save());
            move |g: &Tensor| {
                let gb = solve_triangular(&mt(&td.value()?)?, g, !upper, true, unitriangular)?;
                let gt = gb.matmul(&mt(&x.value()?)?)?.neg()?;
                let off = i64::from(unitriangular);
                let gt = if upper { gt.triu(off)? } else { gt.tril(-off)? };
                Ok(vec![
                    Some(crate::autograd::sum_to(&gt, &st)?),
                    Some(crate::autograd::sum_to(&gb, &sb)?),
                ])
            }
        },
    ))
}

/// The Cholesky factor of each symmetric positive-definite matrix
/// (`torch.linalg.cholesky`): lower triangular `L` with `A = L Lᵀ`, or with
/// `upper` its transpose `U = Lᵀ` (`A = Uᵀ U`). Only the lower triangle of `A`
/// is read. A matrix that is not positive definite is an error naming the
/// first leading minor that is not.
pub fn cholesky(a: &Tensor, upper: bool) -> Result<Tensor> {
    const OP: &str = "linalg.cholesky";
    let _record = crate::profiler::function(OP);
    let n = check_square(OP, a)?;
    if upper {
        return mt(&cholesky(a, false)?);
    }
    let l = per_matrix(OP, a, &[out(&[n, n])], |x| {
        dense::cholesky(x, n).map(|l| vec![l]).map_err(|k| {
            format!("The factorization could not be completed because the input is not positive-definite (the leading minor of order {k} is not positive-definite).")
        })
    })?
    .remove(0);
    Ok(Tensor::record_twice(l, "linalg_cholesky", &[a], |l| {
        let l = l.save();
        move |g: &Tensor| {
            // Ā = sym(L⁻ᵀ Φ(Lᵀ L̄) L⁻¹), Φ: the lower triangle, its diagonal halved
            let l = &l.value()?;
            let phi = mt(l)?.matmul(&g.tril(0)?)?.tril(0)?;
            let phi = phi.sub(&phi.diagonal(0, -2, -1)?.mul(0.5)?.diag_embed(0, -2, -1)?)?;
            let left = solve_triangular(&mt(l)?, &phi, true, true, false)?;
            let ga = solve_triangular(l, &left, false, false, false)?;
            Ok(vec![Some(ga.add(&mt(&ga)?)?.mul(0.5)?)])
        }
    }))
}

/// The LU factorization with partial pivoting of each matrix, compactly
/// (`torch.linalg.lu_factor`): `(LU, pivots)`, `L`'s multipliers below the
/// diagonal and `U` on and above it, `pivots[j]` the (1-based) row swapped
/// with row `j + 1` at step `j`. PyTorch's pivots are int32; ember's are int64
/// (it has no int32 dtype). Matrices may be rectangular. `LU` has PyTorch's
/// gradient (that of [`lu`]'s `L` and `U`), defined where `U`'s diagonal has
/// no zero, and differentiable again.
pub fn lu_factor(a: &Tensor) -> Result<(Tensor, Tensor)> {
    const OP: &str = "linalg.lu_factor";
    let _record = crate::profiler::function(OP);
    check_matrix(OP, a, "A")?;
    let (m, n) = dims(a);
    let k = m.min(n);
    let grad = crate::autograd::needs_grad(&[a]);
    let mut outs = vec![
        out(&[m, n]),
        Out {
            shape: vec![k],
            dtype: Some(DType::I64),
        },
    ];
    if grad {
        // the gradient needs the permutation as a matrix
        outs.push(out(&[m, m]));
    }
    let mut r = per_matrix(OP, a, &outs, |x| {
        let lu = dense::lu_rect(x, m, n);
        let piv = lu.piv.iter().map(|&p| (p + 1) as f64).collect();
        let p = grad.then(|| permutation_matrix(&lu, m));
        let mut parts = vec![lu.lu, piv];
        parts.extend(p);
        Ok(parts)
    })?;
    if !grad {
        let piv = r.remove(1);
        return Ok((r.remove(0), piv));
    }
    let p = r.remove(2);
    let piv = r.remove(1);
    let packed = Tensor::record_twice(r.remove(0), "linalg_lu_factor", &[a], |y| {
        let y = y.save();
        move |g: &Tensor| {
            let (l, u) = split_lu(&y.value()?)?;
            let (gl, gu) = (g.tril(-1)?.narrow(-1, 0, k)?, g.triu(0)?.narrow(-2, 0, k)?);
            Ok(vec![Some(lu_backward(&p, &l, &u, &gl, &gu)?)])
        }
    });
    Ok((packed, piv))
}

/// `P` of `A = P L U` for a factorization of `m` rows, row-major: row `i` of
/// `P A` is row `perm[i]` of `A`, so `P`'s column `i` is `e_perm[i]`.
fn permutation_matrix(f: &dense::Lu, m: usize) -> Vec<f64> {
    let mut p = vec![0.0; m * m];
    for (i, &src) in f.permutation(m).iter().enumerate() {
        p[src * m + i] = 1.0;
    }
    p
}

/// `L` (unit lower, `m × k`) and `U` (upper, `k × n`) of a compact `LU`, in
/// recorded ops.
fn split_lu(lu: &Tensor) -> Result<(Tensor, Tensor)> {
    let (m, n) = dims(lu);
    let k = m.min(n);
    let eye = Tensor::eye_rect(m, k, lu.dtype(), &lu.device())?;
    let l = lu.tril(-1)?.narrow(-1, 0, k)?.add(&eye)?;
    Ok((l, lu.triu(0)?.narrow(-2, 0, k)?))
}

/// The gradient of `A = P L U` (`L` `m × k` unit lower, `U` `k × n` upper, `P`
/// a constant) from those of `L` and `U`, in tensor ops (differentiable
/// again). For a square `A`: `P L⁻ᵀ (tril(Lᵀ L̄, -1) + triu(Ū Uᵀ)) U⁻ᵀ`. A wide
/// `A` splits `U = [U₁ U₂]` (`U₂ = L⁻¹ Pᵀ A₂`: `Ā₂ = P L⁻ᵀ Ū₂`, and `L` sees
/// `-L⁻ᵀ Ū₂ U₂ᵀ` more); a tall one `L = [L₁; L₂]` (`L₂ = A₂' U⁻¹`: `Ā₂' = L̄₂
/// U⁻ᵀ`, and `U` sees `-L₂ᵀ L̄₂ U⁻ᵀ` more).
fn lu_backward(p: &Tensor, l: &Tensor, u: &Tensor, gl: &Tensor, gu: &Tensor) -> Result<Tensor> {
    let (m, n) = (dims(l).0, dims(u).1);
    let k = m.min(n);
    let (l1, u1) = (l.narrow(-2, 0, k)?, u.narrow(-1, 0, k)?);
    // the square part's M = tril(L₁ᵀ L̄₁, -1) + triu(Ū₁ U₁ᵀ), with the other block's terms
    let mut lower = mt(&l1)?.matmul(&gl.narrow(-2, 0, k)?)?;
    let mut upper = gu.narrow(-1, 0, k)?.matmul(&mt(&u1)?)?;
    if n > k {
        let (u2, gu2) = (
            u.narrow(-1, k as i64, n - k)?,
            gu.narrow(-1, k as i64, n - k)?,
        );
        lower = lower.sub(&gu2.matmul(&mt(&u2)?)?)?;
    }
    let tall = if m > k {
        let (l2, gl2) = (
            l.narrow(-2, k as i64, m - k)?,
            gl.narrow(-2, k as i64, m - k)?,
        );
        upper = upper.sub(&mt(&l2)?.matmul(&gl2)?)?;
        // L̄₂ U⁻ᵀ: X Uᵀ = L̄₂
        Some(solve_triangular(&mt(&u1)?, &gl2, false, false, false)?)
    } else {
        None
    };
    let inner = lower.tril(-1)?.add(&upper.triu(0)?)?;
    let left = solve_triangular(&mt(&l1)?, &inner, true, true, true)?;
    let mut ga = solve_triangular(&mt(&u1)?, &left, false, false, false)?;
    if n > k {
        let gu2 = gu.narrow(-1, k as i64, n - k)?;
        let g2 = solve_triangular(&mt(&l1)?, &gu2, true, true, true)?;
        ga = Tensor::cat(&[&ga, &g2], -1)?;
    }
    if let Some(g2) = tall {
        ga = Tensor::cat(&[&ga, &g2], -2)?;
    }
    p.matmul(&ga)
}

/// The LU factorization with partial pivoting as three matrices
/// (`torch.linalg.lu`): `(P, L, U)` with `A = P L U`, `L` unit lower
/// triangular `m × k` and `U` upper triangular `k × n` (`k = min(m, n)`).
/// `L` and `U` have PyTorch's gradients (defined where `U`'s diagonal has no
/// zero, and differentiable again); `P` has none.
pub fn lu(a: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
    const OP: &str = "linalg.lu";
    let _record = crate::profiler::function(OP);
    check_matrix(OP, a, "A")?;
    let (m, n) = dims(a);
    let k = m.min(n);
    let mut r = per_matrix(OP, a, &[out(&[m, m]), out(&[m, k]), out(&[k, n])], |x| {
        let f = dense::lu_rect(x, m, n);
        let p = permutation_matrix(&f, m);
        let mut l = vec![0.0; m * k];
        let mut u = vec![0.0; k * n];
        for i in 0..m {
            for j in 0..n {
                let v = f.lu[i * n + j];
                if j < i && j < k {
                    l[i * k + j] = v;
                } else if i < k && j >= i {
                    u[i * n + j] = v;
                }
            }
            if i < k {
                l[i * k + i] = 1.0;
            }
        }
        Ok(vec![p, l, u])
    })?;
    let u = r.remove(2);
    let l = r.remove(1);
    let p = r.remove(0);
    if !crate::autograd::needs_grad(&[a]) {
        return Ok((p, l, u));
    }
    let pc = p.clone();
    let mut parts = record_packed(vec![l, u], "linalg_lu", &[a], move |g, lu| {
        Ok(vec![Some(lu_backward(&pc, &lu[0], &lu[1], &g[0], &g[1])?)])
    })?;
    let u = parts.remove(1);
    Ok((p, parts.remove(0), u))
}
