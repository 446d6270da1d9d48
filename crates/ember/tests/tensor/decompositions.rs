//! `ember::linalg` against PyTorch's `torch.linalg` (tests/golden/linalg_cases.json,
//! made by tests/golden/gen_linalg.py): outputs, the gradients of a weighted sum
//! of them (for eigh and svd a sum their vectors' signs do not change), and
//! PyTorch's refusals in its words, on every device; shapes on meta.
//! Eigenvectors and singular vectors are compared up to sign, and the columns
//! of a full SVD's `U` beyond the rank only for orthonormality (any completion
//! is right).

use super::golden_tensor as tensor;
use ember::linalg::{self, MatrixNorm, QrMode, Uplo};
use ember::prelude::*;
use serde_json::Value;

/// Runs the case's function on `x` with its recorded arguments.
fn call(op: &str, args: &Value, x: &[Tensor]) -> Result<Vec<Tensor>> {
    let flag = |k: &str, default: bool| args[k].as_bool().unwrap_or(default);
    let two = |r: Result<(Tensor, Tensor)>| r.map(|(a, b)| vec![a, b]);
    let one = |r: Result<Tensor>| r.map(|t| vec![t]);
    let a = &x[0];
    match op {
        "inv" => one(linalg::inv(a)),
        "det" => one(linalg::det(a)),
        "slogdet" => two(linalg::slogdet(a)),
        "solve" => one(linalg::solve_with(a, &x[1], flag("left", true))),
        "solve_triangular" => one(linalg::solve_triangular(
            a,
            &x[1],
            flag("upper", false),
            flag("left", true),
            flag("unitriangular", false),
        )),
        "cholesky" => one(linalg::cholesky(a, flag("upper", false))),
        "qr" => {
            let mode = match args["mode"].as_str().unwrap_or("reduced") {
                "reduced" => QrMode::Reduced,
                "complete" => QrMode::Complete,
                "r" => QrMode::R,
                m => panic!("mode {m}"),
            };
            two(linalg::qr(a, mode))
        }
        "eigh" | "eigvalsh" => {
            let uplo = match args["UPLO"].as_str().unwrap_or("L") {
                "L" => Uplo::Lower,
                "U" => Uplo::Upper,
                u => panic!("UPLO {u}"),
            };
            if op == "eigh" {
                two(linalg::eigh(a, uplo))
            } else {
                one(linalg::eigvalsh(a, uplo))
            }
        }
        "svd" => linalg::svd(a, flag("full_matrices", true)).map(|(u, s, v)| vec![u, s, v]),
        "svdvals" => one(linalg::svdvals(a)),
        "lu_factor" => two(linalg::lu_factor(a)),
        "lu" => linalg::lu(a).map(|(p, l, u)| vec![p, l, u]),
        "pinv" => one(linalg::pinv(a)),
        "matrix_rank" => one(linalg::matrix_rank(a)),
        "matrix_power" => one(linalg::matrix_power(a, args["n"].as_i64().unwrap())),
        "matrix_norm" => {
            let ord = match &args["ord"] {
                Value::String(s) if s == "fro" => MatrixNorm::Fro,
                Value::String(s) if s == "nuc" => MatrixNorm::Nuc,
                v => MatrixNorm::Ord(match v.as_str() {
                    Some("inf") => f64::INFINITY,
                    Some("-inf") => f64::NEG_INFINITY,
                    _ => v.as_f64().unwrap(),
                }),
            };
            one(linalg::matrix_norm(a, ord, flag("keepdim", false)))
        }
        "multi_dot" => one(linalg::multi_dot(&x.iter().collect::<Vec<_>>())),
        "lstsq" => one(linalg::lstsq(a, &x[1])),
        o => panic!("op {o}"),
    }
}

/// Cases whose refusal Rust's types already rule out (a mode or triangle that
/// is not one of the enum's).
const TYPED_AWAY: &[&str] = &["qr_mode", "eigh_uplo"];

fn tolerance(dt: DType) -> f64 {
    if dt == DType::F32 {
        2e-4
    } else {
        1e-9
    }
}

/// `got` with each column `j` of its last two dims (with `rows`, each row)
/// negated where it points against `want`'s; returns the flips made, so the
/// paired factor can take the same ones.
fn align_signs(
    got: &Tensor,
    want: &Tensor,
    rows: bool,
    flips: Option<&[f64]>,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let s = got.shape().to_vec();
    let (r, c) = (s[s.len() - 2], s[s.len() - 1]);
    let mut g = got.to_dtype(DType::F64)?.to_vec::<f64>()?;
    let w = want.to_dtype(DType::F64)?.to_vec::<f64>()?;
    let per = if rows { r } else { c };
    let batch = g.len() / (r * c).max(1);
    let mut made = Vec::with_capacity(batch * per);
    for b in 0..batch {
        for k in 0..per {
            let at = |i: usize| {
                if rows {
                    b * r * c + k * c + i
                } else {
                    b * r * c + i * c + k
                }
            };
            let len = if rows { c } else { r };
            let flip = match flips {
                Some(f) => f[b * per + k],
                None => {
                    let dot: f64 = (0..len).map(|i| g[at(i)] * w[at(i)]).sum();
                    if dot < 0.0 {
                        -1.0
                    } else {
                        1.0
                    }
                }
            };
            for i in 0..len {
                g[at(i)] *= flip;
            }
            made.push(flip);
        }
    }
    Ok((g, made))
}

/// The case's loss over `out` (see gen_linalg.py).
fn loss(case: &Value, out: &[Tensor], dev: &Device) -> Result<Tensor> {
    let weights: Vec<Option<Tensor>> = case["weights"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| (!w.is_null()).then(|| tensor(w, dev)).transpose())
        .collect::<Result<_>>()?;
    let w = |i: usize| weights[i].as_ref().unwrap();
    match case["loss"].as_str().unwrap() {
        "eigh" => {
            let (vals, v) = (&out[0], &out[1]);
            let rebuilt = v.mul(&w(1).unsqueeze(-2)?)?.matmul(&v.transpose(-2, -1)?)?;
            vals.mul(w(0))?
                .sum_all()?
                .add(&rebuilt.mul(w(2))?.sum_all()?)
        }
        "svd" => {
            let (u, s, vh) = (&out[0], &out[1], &out[2]);
            let k = s.shape()[s.rank() - 1];
            let rebuilt = u
                .narrow(-1, 0, k)?
                .mul(&w(1).unsqueeze(-2)?)?
                .matmul(&vh.narrow(-2, 0, k)?)?;
            s.mul(w(0))?.sum_all()?.add(&rebuilt.mul(w(2))?.sum_all()?)
        }
        _ => {
            let mut total: Option<Tensor> = None;
            for (o, wt) in out.iter().zip(&weights) {
                if let Some(wt) = wt {
                    let term = o.mul(wt)?.sum_all()?;
                    total = Some(match total {
                        None => term,
                        Some(t) => t.add(&term)?,
                    });
                }
            }
            Ok(total.expect("a weighted output"))
        }
    }
}

fn linalg_matches_pytorch(dev: &Device) -> Result<()> {
    let cases = super::golden("linalg_cases.json");
    let (mut checked, mut refusals) = (0, 0);
    for case in cases.as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let op = case["op"].as_str().unwrap();
        if TYPED_AWAY.contains(&name) {
            continue;
        }
        // names the case a failed comparison below belongs to
        eprintln!("case {name} on {dev}");
        let wants_grad = case["grads"].as_array().is_some_and(|g| !g.is_empty());
        let inputs: Vec<Tensor> = case["inputs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                let t = tensor(v, dev)?;
                if wants_grad && t.dtype().is_float() {
                    t.requires_grad_(true)
                } else {
                    Ok(t)
                }
            })
            .collect::<Result<_>>()?;
        if let Some(want) = case["error"].as_str() {
            let err = call(op, &case["args"], &inputs)
                .err()
                .unwrap_or_else(|| panic!("{name}: no error"));
            assert!(
                err.to_string().contains(want),
                "{name}: got {err}\nwant {want}"
            );
            refusals += 1;
            continue;
        }
        let out = call(op, &case["args"], &inputs).unwrap_or_else(|e| panic!("{name}: {e}"));
        let wants = case["outputs"].as_array().unwrap();
        assert_eq!(out.len(), wants.len(), "{name}: outputs");
        let mut flips: Option<Vec<f64>> = None;
        for (i, (got, want)) in out.iter().zip(wants).enumerate() {
            let want = tensor(want, dev)?;
            assert_eq!(got.shape(), want.shape(), "{name}: output {i}'s shape");
            assert_eq!(got.dtype(), want.dtype(), "{name}: output {i}'s dtype");
            let tol = tolerance(want.dtype());
            let g = match (op, i) {
                ("eigh", 1) => align_signs(got, &want, false, None)?.0,
                ("svd", 0) => {
                    // U's first k columns up to sign (beyond k: any orthonormal completion)
                    let k = out[1].shape()[out[1].rank() - 1];
                    let (g, made) =
                        align_signs(&got.narrow(-1, 0, k)?, &want.narrow(-1, 0, k)?, false, None)?;
                    flips = Some(made);
                    let uu = got.transpose(-2, -1)?.matmul(got)?;
                    let eye = Tensor::eye(got.shape()[got.rank() - 1], got.dtype(), dev)?;
                    super::assert_close(
                        &super::vals(&uu),
                        &super::vals(&eye.expand(uu.shape())?),
                        0.0,
                        tol,
                    );
                    super::assert_close(&g, &super::vals(&want.narrow(-1, 0, k)?), tol, tol);
                    continue;
                }
                ("svd", 2) => {
                    let k = out[1].shape()[out[1].rank() - 1];
                    let (g, _) = align_signs(
                        &got.narrow(-2, 0, k)?,
                        &want.narrow(-2, 0, k)?,
                        true,
                        flips.as_deref(),
                    )?;
                    super::assert_close(&g, &super::vals(&want.narrow(-2, 0, k)?), tol, tol);
                    continue;
                }
                _ => super::vals(got),
            };
            super::assert_close(&g, &super::vals(&want), tol, tol);
        }
        if wants_grad {
            loss(case, &out, dev)?.backward()?;
            for (j, (x, want)) in inputs
                .iter()
                .zip(case["grads"].as_array().unwrap())
                .enumerate()
            {
                if want.is_null() {
                    continue;
                }
                let want = tensor(want, dev)?;
                let g = x
                    .grad()
                    .unwrap_or_else(|| panic!("{name}: no gradient for input {j}"));
                let tol = 10.0 * tolerance(want.dtype());
                super::assert_close(&super::vals(&g), &super::vals(&want), tol, tol);
            }
        }
        checked += 1;
    }
    assert_eq!((checked, refusals), (77, 18), "cases run");
    Ok(())
}

/// Every function on `meta`: the outputs' shapes and dtypes, no values read.
fn linalg_on_meta(_dev: &Device) -> Result<()> {
    let m = Device::Meta;
    let a = Tensor::zeros([2, 5, 3], DType::F32, &m)?;
    let sq = Tensor::zeros([2, 4, 4], DType::F64, &m)?;
    let (u, s, vh) = linalg::svd(&a, false)?;
    assert_eq!(
        (u.shape(), s.shape(), vh.shape()),
        (&[2, 5, 3][..], &[2, 3][..], &[2, 3, 3][..])
    );
    let (q, r) = linalg::qr(&a, QrMode::Complete)?;
    assert_eq!((q.shape(), r.shape()), (&[2, 5, 5][..], &[2, 5, 3][..]));
    assert_eq!(linalg::inv(&sq)?.shape(), &[2, 4, 4]);
    assert_eq!(linalg::det(&sq)?.shape(), &[2]);
    assert_eq!(linalg::pinv(&a)?.shape(), &[2, 3, 5]);
    assert_eq!(linalg::matrix_rank(&a)?.dtype(), DType::I64);
    let (w, v) = linalg::eigh(&sq, Uplo::Lower)?;
    assert_eq!(
        (w.shape(), v.shape(), w.dtype()),
        (&[2, 4][..], &[2, 4, 4][..], DType::F64)
    );
    assert!(w.device().is_meta());
    Ok(())
}

/// Gradients flow through every output of a multi-output factorization (QR,
/// LU), and QR's R mode, which has no Q to differentiate through, refuses at
/// backward.
fn linalg_gradients_and_refusals(dev: &Device) -> Result<()> {
    let a = Tensor::new([[4f64, 1., 0.], [1., 3., 1.], [0., 1., 2.]], dev)?.requires_grad_(true)?;
    // Q R = A: the gradient of sum(Q R) is the gradient of sum(A), all ones
    let (q, r) = linalg::qr(&a, QrMode::Reduced)?;
    q.matmul(&r)?.sum_all()?.backward()?;
    super::assert_close(&super::vals(&a.grad().unwrap()), &[1.0; 9], 1e-12, 1e-12);
    // P L U = A likewise (P has no gradient)
    a.zero_grad();
    let (p, l, u) = linalg::lu(&a)?;
    assert!(!p.requires_grad() && l.requires_grad() && u.requires_grad());
    let back = p.matmul(&l)?.matmul(&u)?;
    super::assert_close(&super::vals(&back), &super::vals(&a), 1e-12, 1e-12);
    back.sum_all()?.backward()?;
    super::assert_close(&super::vals(&a.grad().unwrap()), &[1.0; 9], 1e-12, 1e-12);
    // R mode has no Q to differentiate through: an error at backward, as PyTorch's
    let (_, r) = linalg::qr(&a, QrMode::R)?;
    let e = r.sum_all()?.backward().unwrap_err().to_string();
    assert!(e.contains("mode='r'"), "{e}");
    Ok(())
}

device_test!(
    linalg_matches_pytorch,
    linalg_on_meta,
    linalg_gradients_and_refusals
);
