//! Factorizations of one dense matrix in float64 on the host, row-major: LU
//! with partial pivoting, Cholesky, Householder QR, the symmetric eigenproblem
//! by cyclic Jacobi rotations, and the singular value decomposition by one-sided
//! (Hestenes) Jacobi rotations. The Jacobi methods are slower than LAPACK's
//! divide-and-conquer drivers for large matrices but accurate to the last few
//! bits, including for small singular values.
//!
//! Conventions follow LAPACK's where they show in results: the LU pivot is the
//! first entry of largest magnitude in its column, and a Householder reflector
//! maps its column onto `-sign(a_jj) · norm` (so QR's diagonal signs match).

/// An LU factorization `P A = L U` of an `n × n` matrix.
pub(crate) struct Lu {
    /// `L` below the diagonal (its unit diagonal not stored) and `U` on and above.
    pub lu: Vec<f64>,
    /// Row `j` was swapped with row `piv[j]` at step `j` (0-based).
    pub piv: Vec<usize>,
    /// The first zero pivot (0-based), as LAPACK's `info - 1`.
    pub zero_pivot: Option<usize>,
}

/// LU with partial pivoting of the row-major `m × n` matrix `a` (steps over
/// `min(m, n)` columns).
pub(crate) fn lu_rect(a: &[f64], m: usize, n: usize) -> Lu {
    let mut lu = a.to_vec();
    let k = m.min(n);
    let mut piv = Vec::with_capacity(k);
    let mut zero_pivot = None;
    for j in 0..k {
        let mut p = j;
        for i in j + 1..m {
            if lu[i * n + j].abs() > lu[p * n + j].abs() {
                p = i;
            }
        }
        piv.push(p);
        if lu[p * n + j] == 0.0 {
            zero_pivot.get_or_insert(j);
            continue;
        }
        if p != j {
            for c in 0..n {
                lu.swap(j * n + c, p * n + c);
            }
        }
        let d = lu[j * n + j];
        for i in j + 1..m {
            let f = lu[i * n + j] / d;
            lu[i * n + j] = f;
            if f != 0.0 {
                for c in j + 1..n {
                    lu[i * n + c] -= f * lu[j * n + c];
                }
            }
        }
    }
    Lu {
        lu,
        piv,
        zero_pivot,
    }
}

impl Lu {
    /// `det(A)` of a square factorization.
    pub(crate) fn det(&self, n: usize) -> f64 {
        let mut d = 1.0;
        for j in 0..n {
            d *= self.lu[j * n + j];
            if self.piv[j] != j {
                d = -d;
            }
        }
        d
    }

    /// `(sign, log|det A|)`: `(0, -inf)` for a singular matrix.
    pub(crate) fn slogdet(&self, n: usize) -> (f64, f64) {
        let (mut sign, mut log) = (1.0, 0.0);
        for j in 0..n {
            let u = self.lu[j * n + j];
            if u == 0.0 {
                return (0.0, f64::NEG_INFINITY);
            }
            if u < 0.0 {
                sign = -sign;
            }
            if self.piv[j] != j {
                sign = -sign;
            }
            log += u.abs().ln();
        }
        (sign, log)
    }

    /// Solves `A X = B` in place for the row-major `n × k` right-hand side `b`.
    pub(crate) fn solve(&self, n: usize, b: &mut [f64], k: usize) {
        for (j, &p) in self.piv.iter().enumerate() {
            if p != j {
                for c in 0..k {
                    b.swap(j * k + c, p * k + c);
                }
            }
        }
        triangular_solve(&self.lu, n, b, k, false, true);
        triangular_solve(&self.lu, n, b, k, true, false);
    }

    /// The row permutation as a map: row `i` of `P A` is row `perm[i]` of `A`.
    pub(crate) fn permutation(&self, m: usize) -> Vec<usize> {
        let mut perm: Vec<usize> = (0..m).collect();
        for (j, &p) in self.piv.iter().enumerate() {
            perm.swap(j, p);
        }
        perm
    }
}

/// Solves `T X = B` in place for the triangle of the row-major `n × n` `t`
/// (`upper` or lower; `unit`: its diagonal taken as ones) and the row-major
/// `n × k` `b`.
pub(crate) fn triangular_solve(
    t: &[f64],
    n: usize,
    b: &mut [f64],
    k: usize,
    upper: bool,
    unit: bool,
) {
    let mut row = |i: usize| {
        let range = if upper { i + 1..n } else { 0..i };
        for j in range {
            let f = t[i * n + j];
            if f != 0.0 {
                for c in 0..k {
                    b[i * k + c] -= f * b[j * k + c];
                }
            }
        }
        if !unit {
            let d = t[i * n + i];
            for c in 0..k {
                b[i * k + c] /= d;
            }
        }
    };
    if upper {
        (0..n).rev().for_each(&mut row);
    } else {
        (0..n).for_each(&mut row);
    }
}

/// The lower Cholesky factor of the `n × n` matrix whose lower triangle is in
/// `a`, or the order (1-based) of the first leading minor that is not positive
/// definite.
pub(crate) fn cholesky(a: &[f64], n: usize) -> Result<Vec<f64>, usize> {
    let mut l = vec![0.0; n * n];
    for j in 0..n {
        let mut d = a[j * n + j];
        for k in 0..j {
            d -= l[j * n + k] * l[j * n + k];
        }
        if d.is_nan() || d <= 0.0 {
            return Err(j + 1);
        }
        let d = d.sqrt();
        l[j * n + j] = d;
        for i in j + 1..n {
            let mut s = a[i * n + j];
            for k in 0..j {
                s -= l[i * n + k] * l[j * n + k];
            }
            l[i * n + j] = s / d;
        }
    }
    Ok(l)
}

/// Householder QR of the row-major `m × n` matrix `a`: `Q` (`m × min(m, n)`,
/// or `m × m` when `complete`; empty unless `want_q`) and `R` (`min(m, n) ×
/// n`, or `m × n` when `complete`), both row-major.
pub(crate) fn qr(
    a: &[f64],
    m: usize,
    n: usize,
    complete: bool,
    want_q: bool,
) -> (Vec<f64>, Vec<f64>) {
    let k = m.min(n);
    // column-major: each reflector reads and updates whole columns
    let mut r = transpose(a, m, n);
    // each reflector `I - tau v vᵀ` with v[0] = 1, over rows j..m
    let mut reflectors: Vec<(f64, Vec<f64>)> = Vec::with_capacity(k);
    for j in 0..k {
        let (before, rest) = r.split_at_mut((j + 1) * m);
        let col = &mut before[j * m..];
        let alpha = col[j];
        let xnorm = col[j + 1..].iter().map(|x| x * x).sum::<f64>().sqrt();
        if xnorm == 0.0 {
            reflectors.push((0.0, Vec::new()));
            continue;
        }
        let norm = alpha.hypot(xnorm);
        let beta = if alpha >= 0.0 { -norm } else { norm };
        let tau = (beta - alpha) / beta;
        let scale = 1.0 / (alpha - beta);
        let mut v = Vec::with_capacity(m - j);
        v.push(1.0);
        v.extend(col[j + 1..].iter().map(|x| x * scale));
        col[j] = beta;
        col[j + 1..].iter_mut().for_each(|x| *x = 0.0);
        for c in rest.chunks_mut(m) {
            let seg = &mut c[j..];
            let f = tau * seg.iter().zip(&v).map(|(x, y)| x * y).sum::<f64>();
            seg.iter_mut().zip(&v).for_each(|(x, vi)| *x -= f * vi);
        }
        reflectors.push((tau, v));
    }
    let rows = if complete { m } else { k };
    let r: Vec<f64> = (0..rows)
        .flat_map(|i| (0..n).map(move |c| (i, c)))
        .map(|(i, c)| if c >= i { r[c * m + i] } else { 0.0 })
        .collect();
    if !want_q {
        return (Vec::new(), r);
    }
    // Q = H_0 ⋯ H_{k-1} applied to the first columns of I, column by column
    let qc = if complete { m } else { k };
    let mut q = vec![0.0; m * qc];
    for (c, col) in q.chunks_mut(m).enumerate() {
        col[c] = 1.0;
        for (j, (tau, v)) in reflectors.iter().enumerate().rev() {
            if *tau == 0.0 {
                continue;
            }
            let seg = &mut col[j..];
            let f = tau * seg.iter().zip(v).map(|(x, y)| x * y).sum::<f64>();
            seg.iter_mut().zip(v).for_each(|(x, vi)| *x -= f * vi);
        }
    }
    (transpose(&q, qc, m), r)
}

/// Eigenvalues (ascending) and eigenvectors (columns of a row-major `n × n`
/// matrix) of the symmetric matrix whose `lower` (or upper) triangle is in `a`:
/// Householder reduction to tridiagonal form, then implicit QL steps with
/// Wilkinson's shift.
pub(crate) fn eigh(a: &[f64], n: usize, lower: bool, want_vectors: bool) -> (Vec<f64>, Vec<f64>) {
    // the full symmetric matrix from the triangle asked for
    let mut s = vec![0.0; n * n];
    for i in 0..n {
        for j in 0..n {
            let (r, c) = if (i >= j) == lower { (i, j) } else { (j, i) };
            s[i * n + j] = a[r * n + c];
        }
    }
    let (mut d, mut e, mut z) = tridiagonalize(s, n, want_vectors);
    tridiagonal_ql(&mut d, &mut e, &mut z, n);
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&i, &j| d[i].total_cmp(&d[j]));
    let w = order.iter().map(|&i| d[i]).collect();
    if !want_vectors {
        return (w, Vec::new());
    }
    // z holds the eigenvectors as rows
    let mut vs = vec![0.0; n * n];
    for (col, &i) in order.iter().enumerate() {
        for r in 0..n {
            vs[r * n + col] = z[i * n + r];
        }
    }
    (w, vs)
}

/// Reduces the symmetric row-major `s` to tridiagonal form `Qᵀ S Q` by
/// Householder reflections: its diagonal, its subdiagonal (`e[i]` between rows
/// `i` and `i + 1`, `e[n - 1] = 0`) and, when asked, `Qᵀ` (rows: `Q`'s
/// columns), else nothing.
fn tridiagonalize(mut s: Vec<f64>, n: usize, want_q: bool) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut e = vec![0.0; n];
    let mut reflectors: Vec<(f64, Vec<f64>)> = Vec::with_capacity(n.saturating_sub(2));
    for k in 0..n.saturating_sub(2) {
        // the reflector that zeroes column k below its subdiagonal
        let alpha = s[(k + 1) * n + k];
        let xnorm = (k + 2..n)
            .map(|i| s[i * n + k] * s[i * n + k])
            .sum::<f64>()
            .sqrt();
        if xnorm == 0.0 {
            e[k] = alpha;
            reflectors.push((0.0, Vec::new()));
            continue;
        }
        let norm = alpha.hypot(xnorm);
        let beta = if alpha >= 0.0 { -norm } else { norm };
        let tau = (beta - alpha) / beta;
        let scale = 1.0 / (alpha - beta);
        let len = n - k - 1;
        let mut v = vec![1.0; len];
        for i in 1..len {
            v[i] = s[(k + 1 + i) * n + k] * scale;
        }
        e[k] = beta;
        // the trailing block B ← H B H with H = I - tau v vᵀ: p = tau B v,
        // w = p - (tau/2)(pᵀv) v, B ← B - v wᵀ - w vᵀ
        let off = k + 1;
        let mut p = vec![0.0; len];
        for (i, pi) in p.iter_mut().enumerate() {
            let row = &s[(off + i) * n + off..(off + i) * n + n];
            *pi = tau * row.iter().zip(&v).map(|(x, y)| x * y).sum::<f64>();
        }
        let half = 0.5 * tau * p.iter().zip(&v).map(|(x, y)| x * y).sum::<f64>();
        let w: Vec<f64> = p.iter().zip(&v).map(|(pi, vi)| pi - half * vi).collect();
        for i in 0..len {
            let row = &mut s[(off + i) * n + off..(off + i) * n + n];
            let (vi, wi) = (v[i], w[i]);
            for ((x, vj), wj) in row.iter_mut().zip(&v).zip(&w) {
                *x -= vi * wj + wi * vj;
            }
        }
        reflectors.push((tau, v));
    }
    if n >= 2 {
        e[n - 2] = s[(n - 1) * n + n - 2];
    }
    let d: Vec<f64> = (0..n).map(|i| s[i * n + i]).collect();
    if !want_q {
        return (d, e, Vec::new());
    }
    // Qᵀ = H_{n-3} ⋯ H_0 (each H symmetric): from I, each row times each
    // reflector (acting on coordinates k+1..n), last reflector first
    let mut qt = vec![0.0; n * n];
    for i in 0..n {
        qt[i * n + i] = 1.0;
    }
    for (k, (tau, v)) in reflectors.iter().enumerate().rev() {
        if *tau == 0.0 {
            continue;
        }
        let off = k + 1;
        for r in 0..n {
            let row = &mut qt[r * n + off..r * n + n];
            let dot: f64 = row.iter().zip(v).map(|(x, y)| x * y).sum();
            if dot != 0.0 {
                let f = tau * dot;
                for (x, vi) in row.iter_mut().zip(v) {
                    *x -= f * vi;
                }
            }
        }
    }
    // I · H_{n-3} ⋯ H_0 = (H_0 ⋯ H_{n-3})ᵀ = Qᵀ: its rows are Q's columns
    (d, e, qt)
}

/// The eigenvalues of the symmetric tridiagonal matrix (diagonal `d`,
/// subdiagonal `e`) into `d`, by implicit QL steps with Wilkinson's shift;
/// each step's rotations are applied to the rows of `z` (the eigenvectors,
/// as rows, when `z` is not empty).
fn tridiagonal_ql(d: &mut [f64], e: &mut [f64], z: &mut [f64], n: usize) {
    let vectors = !z.is_empty();
    for l in 0..n {
        for _iteration in 0..60 {
            // the first negligible subdiagonal entry at or after l splits the matrix
            let mut m = l;
            while m + 1 < n {
                let dd = d[m].abs() + d[m + 1].abs();
                if e[m].abs() <= f64::EPSILON * dd {
                    break;
                }
                m += 1;
            }
            if m == l {
                break;
            }
            // Wilkinson's shift from the leading 2 × 2 block
            let mut g = (d[l + 1] - d[l]) / (2.0 * e[l]);
            let mut r = g.hypot(1.0);
            g = d[m] - d[l] + e[l] / (g + if g >= 0.0 { r } else { -r });
            let (mut sn, mut c, mut p) = (1.0, 1.0, 0.0);
            let mut deflated = false;
            for i in (l..m).rev() {
                let f = sn * e[i];
                let b = c * e[i];
                r = f.hypot(g);
                e[i + 1] = r;
                if r == 0.0 {
                    // an exact zero split the block: restart from its top
                    d[i + 1] -= p;
                    e[m] = 0.0;
                    deflated = true;
                    break;
                }
                sn = f / r;
                c = g / r;
                g = d[i + 1] - p;
                r = (d[i] - g) * sn + 2.0 * c * b;
                p = sn * r;
                d[i + 1] = g + p;
                g = c * r - b;
                if vectors {
                    let (lo, hi) = z.split_at_mut((i + 1) * n);
                    let zi = &mut lo[i * n..];
                    let zi1 = &mut hi[..n];
                    for (x, y) in zi.iter_mut().zip(zi1.iter_mut()) {
                        let f = *y;
                        *y = sn * *x + c * f;
                        *x = c * *x - sn * f;
                    }
                }
            }
            if !deflated {
                d[l] -= p;
                e[l] = g;
                e[m] = 0.0;
            }
        }
    }
}

/// The singular value decomposition of the row-major `m × n` matrix `a`:
/// `(U, S, Vᵀ)` with `S` descending, `U` row-major `m × kᵤ` and `Vᵀ` row-major
/// `kᵥ × n`, where `kᵤ = kᵥ = min(m, n)` (reduced) or `m` and `n` (`full`).
/// Columns of `U` (rows of `Vᵀ`) that zero singular values leave undetermined
/// are completed to an orthonormal basis.
pub(crate) fn svd(
    a: &[f64],
    m: usize,
    n: usize,
    full: bool,
    want_vectors: bool,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    if m < n {
        // Aᵀ = V S Uᵀ
        let at = transpose(a, m, n);
        let (v, s, ut) = svd(&at, n, m, full, want_vectors);
        if !want_vectors {
            return (v, s, ut);
        }
        let (ku, kv) = (ut.len() / m, v.len() / n);
        return (transpose(&ut, ku, m), s, transpose(&v, n, kv));
    }
    // columns of A (m ≥ n), rotated pairwise until orthogonal. Beyond a few
    // columns they are first turned by the eigenvectors of AᵀA (V₀, a fast
    // symmetric solve), which leaves them nearly orthogonal: the rotations
    // then finish in a sweep or two, with Jacobi's accuracy
    let mut cols: Vec<Vec<f64>> = (0..n)
        .map(|j| (0..m).map(|i| a[i * n + j]).collect())
        .collect();
    let mut vcols: Vec<Vec<f64>> = (0..n)
        .map(|j| (0..n).map(|i| if i == j { 1.0 } else { 0.0 }).collect())
        .collect();
    if n > 16 {
        let mut gram = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..=i {
                let g: f64 = cols[i].iter().zip(&cols[j]).map(|(x, y)| x * y).sum();
                gram[i * n + j] = g;
                gram[j * n + i] = g;
            }
        }
        let (_, v0) = eigh(&gram, n, true, true);
        // A V₀, row by row of A
        let mut turned = vec![vec![0.0; m]; n];
        for i in 0..m {
            let row = &a[i * n..(i + 1) * n];
            for (j, t) in turned.iter_mut().enumerate() {
                t[i] = (0..n).map(|k| row[k] * v0[k * n + j]).sum();
            }
        }
        cols = turned;
        if want_vectors {
            vcols = (0..n)
                .map(|j| (0..n).map(|i| v0[i * n + j]).collect())
                .collect();
        }
    }
    let dot = |x: &[f64], y: &[f64]| x.iter().zip(y).map(|(a, b)| a * b).sum::<f64>();
    for _sweep in 0..100 {
        let mut rotated = false;
        // squared norms, fresh each sweep and kept up to date by each rotation
        let mut sq: Vec<f64> = cols.iter().map(|c| dot(c, c)).collect();
        for p in 0..n {
            for q in p + 1..n {
                let (alpha, beta) = (sq[p], sq[q]);
                let gamma = dot(&cols[p], &cols[q]);
                if gamma == 0.0 || gamma.abs() <= f64::EPSILON * (alpha * beta).sqrt() {
                    continue;
                }
                rotated = true;
                let zeta = (beta - alpha) / (2.0 * gamma);
                let t = zeta.signum() / (zeta.abs() + zeta.hypot(1.0));
                let t = if zeta == 0.0 { 1.0 } else { t };
                let c = 1.0 / t.hypot(1.0);
                let s = c * t;
                sq[p] = alpha - t * gamma;
                sq[q] = beta + t * gamma;
                let rotate = |x: &mut Vec<Vec<f64>>| {
                    let (lo, hi) = x.split_at_mut(q);
                    for (u, w) in lo[p].iter_mut().zip(hi[0].iter_mut()) {
                        let (a, b) = (*u, *w);
                        *u = c * a - s * b;
                        *w = s * a + c * b;
                    }
                };
                rotate(&mut cols);
                if want_vectors {
                    rotate(&mut vcols);
                }
            }
        }
        if !rotated {
            break;
        }
    }
    let norms: Vec<f64> = cols.iter().map(|c| dot(c, c).sqrt()).collect();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&i, &j| norms[j].total_cmp(&norms[i]));
    let s: Vec<f64> = order.iter().map(|&i| norms[i]).collect();
    if !want_vectors {
        return (Vec::new(), s, Vec::new());
    }
    let ku = if full { m } else { n };
    // columns of U: the normalised columns, the ones of zero norm left out and
    // filled by completion
    let mut ucols: Vec<Vec<f64>> = Vec::with_capacity(ku);
    let mut missing = Vec::new();
    for (slot, &i) in order.iter().enumerate() {
        if norms[i] > 0.0 {
            ucols.push(cols[i].iter().map(|x| x / norms[i]).collect());
        } else {
            ucols.push(Vec::new());
            missing.push(slot);
        }
    }
    missing.extend(n..ku);
    ucols.resize(ku, Vec::new());
    complete_basis(&mut ucols, &missing, m);
    let mut u = vec![0.0; m * ku];
    for (j, col) in ucols.iter().enumerate() {
        for i in 0..m {
            u[i * ku + j] = col[i];
        }
    }
    let mut vt = vec![0.0; n * n];
    for (row, &i) in order.iter().enumerate() {
        vt[row * n..(row + 1) * n].copy_from_slice(&vcols[i]);
    }
    (u, s, vt)
}

/// Fills the columns `missing` of `cols` (each of length `m`) with unit vectors
/// orthogonal to all the others: Gram-Schmidt (twice) over the standard basis,
/// taking the candidate that keeps the most of its norm.
fn complete_basis(cols: &mut [Vec<f64>], missing: &[usize], m: usize) {
    for &slot in missing {
        let mut best: Option<(f64, Vec<f64>)> = None;
        for e in 0..m {
            let mut x = vec![0.0; m];
            x[e] = 1.0;
            for _ in 0..2 {
                for c in cols.iter().filter(|c| !c.is_empty()) {
                    let d: f64 = c.iter().zip(&x).map(|(a, b)| a * b).sum();
                    for (xi, ci) in x.iter_mut().zip(c) {
                        *xi -= d * ci;
                    }
                }
            }
            let norm = x.iter().map(|v| v * v).sum::<f64>().sqrt();
            if best.as_ref().is_none_or(|(b, _)| norm > *b) {
                best = Some((norm, x));
            }
        }
        let (norm, x) = best.unwrap_or((1.0, vec![0.0; m]));
        cols[slot] = x.into_iter().map(|v| v / norm).collect();
    }
}

/// The transpose of the row-major `m × n` matrix `a`.
pub(crate) fn transpose(a: &[f64], m: usize, n: usize) -> Vec<f64> {
    let mut t = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            t[j * m + i] = a[i * n + j];
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matmul(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for p in 0..k {
                for j in 0..n {
                    c[i * n + j] += a[i * k + p] * b[p * n + j];
                }
            }
        }
        c
    }

    fn close(a: &[f64], b: &[f64]) {
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-12, "{a:?}\n{b:?}");
        }
    }

    #[test]
    fn svd_reconstructs_rank_deficient_and_completes_its_basis() {
        let a = [1., 2., 2., 4., 3., 6.];
        let (u, s, vt) = svd(&a, 3, 2, true, true);
        assert!(s[1].abs() < 1e-12);
        // U is orthogonal
        close(
            &matmul(&transpose(&u, 3, 3), &u, 3, 3, 3),
            &[1., 0., 0., 0., 1., 0., 0., 0., 1.],
        );
        let us: Vec<f64> = (0..3)
            .flat_map(|i| (0..2).map(move |j| (i, j)))
            .map(|(i, j)| u[i * 3 + j] * s[j])
            .collect();
        close(&matmul(&us, &vt, 3, 2, 2), &a);
    }

    #[test]
    fn eigh_diagonalises() {
        // sizes through the tridiagonal reduction's corners (1, 2, 3) and beyond,
        // with a repeated eigenvalue (the 6 × 6 block diagonal)
        let mut cases: Vec<(usize, Vec<f64>)> = vec![
            (1, vec![-2.0]),
            (2, vec![1., 2., 2., -1.]),
            (3, vec![2., 1., 0., 1., 3., 1., 0., 1., 4.]),
        ];
        let n = 9;
        cases.push((
            n,
            (0..n * n)
                .map(|k| ((k / n) as f64 - (k % n) as f64).cos() + ((k / n + k % n) as f64).sin())
                .collect(),
        ));
        let mut rep = vec![0.0; 36];
        for i in 0..6 {
            rep[i * 6 + i] = if i < 3 { 2.0 } else { 5.0 };
        }
        rep[1] = 1.0;
        rep[6] = 1.0;
        cases.push((6, rep));
        for (n, a) in cases {
            let (w, v) = eigh(&a, n, true, true);
            assert!(w.windows(2).all(|p| p[0] <= p[1]), "{w:?}");
            let av = matmul(&a, &v, n, n, n);
            for j in 0..n {
                for i in 0..n {
                    assert!(
                        (av[i * n + j] - w[j] * v[i * n + j]).abs() < 1e-11,
                        "n = {n}"
                    );
                }
            }
            close(
                &matmul(&transpose(&v, n, n), &v, n, n, n),
                &(0..n * n)
                    .map(|k| f64::from(u8::from(k / n == k % n)))
                    .collect::<Vec<_>>(),
            );
            assert_eq!(eigh(&a, n, true, false).0, w);
        }
    }
}
