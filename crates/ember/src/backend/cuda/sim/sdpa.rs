//! The simulator's stand-in for cuDNN's fused attention: a reference with the
//! contract of ember's attention graphs (`backend/cuda/dnn/sdpa/`): strided
//! f16/bf16 operands `[batch, heads, rows, d]`, the scale and top-left causal
//! mask, float32 log-sum-exps, and the backward's workspace parts (each row's
//! `Σ dout · out` and dq's float32 accumulator written where the graph writes
//! them, and room for the padding mask's lengths); the backward's weights come from the forward's saved log-sum-exps, as
//! the graph computes them. It checks every region it touches, so that the calls
//! ember makes (the addresses, strides and workspace of an [`SdpaCall`]) are
//! tested without a GPU; the graphs built for cuDNN from them are checked
//! against those cuDNN's own frontend builds and planned without a GPU
//! (`bench/cudnn-offline`), and run on a GPU only. The
//! numbers are an f64 reference, rounded once to the operands' type.

use super::gemm::{read, write};
use crate::backend::cuda::dnn::sdpa::SdpaCall;
use crate::backend::op::AttnLibraryParts;
use crate::dtype::DType;
use crate::error::{Error, Result};
use rayon::prelude::*;

/// The bytes a view of `rows × d` elements with (batch, head, row) strides `st`
/// spans from its start.
fn span(g: &crate::backend::cuda::dnn::sdpa::SdpaGeom, st: [i64; 3], rows: i64) -> u64 {
    let last = (g.b - 1) * st[0] + (g.h - 1) * st[1] + (rows - 1) * st[2] + g.d - 1;
    (last + 1) as u64 * g.dtype.size_in_bytes() as u64
}

/// Checks `c` as cuDNN's plan would take it and returns the work that runs it.
///
/// # Safety
/// `c`'s addresses must hold its geometry's operands and results.
pub(crate) unsafe fn sdpa_job(c: &SdpaCall) -> Result<super::Work> {
    let g = c.geom;
    if !matches!(g.dtype, DType::F16 | DType::BF16) || g.d % 8 != 0 || g.d > 128 {
        return Err(Error::Cuda {
            op: "cuDNN attention",
            msg: format!("simulator: no engine for {g:?}"),
        });
    }
    let check =
        |what: &str, ptr: u64, len: u64| super::check_region("cuDNN attention", what, ptr, len);
    check("q", c.q, span(&g, g.q, g.l))?;
    check("k", c.k, span(&g, g.k, g.s))?;
    check("v", c.v, span(&g, g.v, g.s))?;
    check("out", c.o, span(&g, g.o, g.l))?;
    check("stats", c.stats, (g.b * g.h * g.l * 4) as u64)?;
    if let Some([go, dq, dk, dv]) = g.grads {
        check("dout", c.grads[0], span(&g, go, g.l))?;
        check("dq", c.grads[1], span(&g, dq, g.l))?;
        check("dk", c.grads[2], span(&g, dk, g.s))?;
        check("dv", c.grads[3], span(&g, dv, g.s))?;
        let p = c.parts;
        if p.dot < (g.b * g.h * g.l * 4) as usize
            || p.acc < (g.b * g.h * g.l * g.d * 4) as usize
            // (the padding mask's lengths: cuDNN's engines up to 9.15 need them
            // for these key counts, SdpaGeom::padding_mask)
            || (g.s % 128 != 0 && p.lens < AttnLibraryParts::lens_layout(g.b as usize).1)
            || c.workspace_bytes < p.total()
        {
            return Err(Error::Cuda {
                op: "cuDNN attention",
                msg: format!(
                    "simulator: a workspace of {} bytes is too small",
                    c.workspace_bytes
                ),
            });
        }
    }
    if c.workspace_bytes > 0 {
        check("workspace", c.workspace, c.workspace_bytes as u64)?;
    }
    let c = *c;
    Ok(std::sync::Arc::new(move || {
        let _lock = super::exec_lock();
        // SAFETY: the regions were checked above and stay allocated until the
        // work ran (the caller's buffers go back to the cache for later work).
        unsafe { run(&c) };
        Ok(())
    }))
}

/// The element (bi, hi, row, col) of a view with strides `st` from `base`.
fn at(st: [i64; 3], bi: i64, hi: i64, row: i64, col: i64) -> i64 {
    bi * st[0] + hi * st[1] + row * st[2] + col
}

/// # Safety
/// As [`sdpa_job`].
unsafe fn run(c: &SdpaCall) {
    let g = c.geom;
    let dt = g.dtype;
    let (l, s, d) = (g.l, g.s, g.d);
    // per (batch, head): computed apart, written after
    let pairs: Vec<(i64, i64)> = (0..g.b)
        .flat_map(|bi| (0..g.h).map(move |hi| (bi, hi)))
        .collect();
    let load = |ptr: u64, st: [i64; 3], bi: i64, hi: i64, rows: i64| -> Vec<f64> {
        let mut v = Vec::with_capacity((rows * d) as usize);
        for r in 0..rows {
            for e in 0..d {
                // SAFETY: within the checked span.
                v.push(unsafe { read(dt, ptr, at(st, bi, hi, r, e)) });
            }
        }
        v
    };
    let scale = c.scale as f64;
    let results: Vec<_> = pairs
        .par_iter()
        .map(|&(bi, hi)| {
            let (q, k, v) = (
                load(c.q, g.q, bi, hi, l),
                load(c.k, g.k, bi, hi, s),
                load(c.v, g.v, bi, hi, s),
            );
            // the weights p[i][j] and each row's log-sum-exp: the forward's own,
            // the backward's from the forward's saved ones (as the graph reads them)
            let bh = bi * g.h + hi;
            let mut p = vec![0f64; (l * s) as usize];
            let mut lse = vec![f64::NEG_INFINITY; l as usize];
            for i in 0..l {
                let seen = if g.causal { (i + 1).min(s) } else { s };
                let row = &mut p[(i * s) as usize..((i + 1) * s) as usize];
                let mut m = f64::NEG_INFINITY;
                for j in 0..seen {
                    let dotqk: f64 = (0..d)
                        .map(|e| q[(i * d + e) as usize] * k[(j * d + e) as usize])
                        .sum();
                    row[j as usize] = dotqk * scale;
                    m = m.max(row[j as usize]);
                }
                if g.grads.is_some() {
                    // SAFETY: `[b · h, l]` float32 log-sum-exps, checked.
                    let saved = unsafe { read(DType::F32, c.stats, bh * l + i) };
                    for w in row.iter_mut().take(seen as usize) {
                        *w = (*w - saved).exp();
                    }
                    continue;
                }
                let mut sum = 0.0;
                for j in 0..seen {
                    row[j as usize] = (row[j as usize] - m).exp();
                    sum += row[j as usize];
                }
                for w in row.iter_mut().take(seen as usize) {
                    *w /= sum;
                }
                lse[i as usize] = m + sum.ln();
            }
            let Some([go, ..]) = g.grads else {
                let mut o = vec![0f64; (l * d) as usize];
                for i in 0..l {
                    for j in 0..s {
                        let w = p[(i * s + j) as usize];
                        if w != 0.0 {
                            for e in 0..d {
                                o[(i * d + e) as usize] += w * v[(j * d + e) as usize];
                            }
                        }
                    }
                }
                return (o, lse, vec![], vec![]);
            };
            let (dout, out) = (load(c.grads[0], go, bi, hi, l), load(c.o, g.o, bi, hi, l));
            let dot: Vec<f64> = (0..l)
                .map(|i| {
                    (0..d)
                        .map(|e| dout[(i * d + e) as usize] * out[(i * d + e) as usize])
                        .sum()
                })
                .collect();
            let (mut dq, mut dk, mut dv) = (
                vec![0f64; (l * d) as usize],
                vec![0f64; (s * d) as usize],
                vec![0f64; (s * d) as usize],
            );
            for i in 0..l {
                for j in 0..s {
                    let w = p[(i * s + j) as usize];
                    if w == 0.0 {
                        continue;
                    }
                    let dp: f64 = (0..d)
                        .map(|e| dout[(i * d + e) as usize] * v[(j * d + e) as usize])
                        .sum();
                    let ds = w * (dp - dot[i as usize]) * scale;
                    for e in 0..d {
                        let (ie, je) = ((i * d + e) as usize, (j * d + e) as usize);
                        dv[je] += w * dout[ie];
                        dq[ie] += ds * k[je];
                        dk[je] += ds * q[ie];
                    }
                }
            }
            (dq, dot, dk, dv)
        })
        .collect();
    for (&(bi, hi), (a, b, x, y)) in pairs.iter().zip(results) {
        let bh = bi * g.h + hi;
        match g.grads {
            None => {
                for i in 0..l {
                    for e in 0..d {
                        // SAFETY: within the checked spans.
                        unsafe { write(dt, c.o, at(g.o, bi, hi, i, e), a[(i * d + e) as usize]) };
                    }
                    // SAFETY: `[b · h, l]` float32 log-sum-exps, checked.
                    unsafe { write(DType::F32, c.stats, bh * l + i, b[i as usize]) };
                }
            }
            Some([_, dqs, dks, dvs]) => {
                let acc = c.workspace + c.parts.dot as u64;
                for i in 0..l {
                    // SAFETY: the workspace's parts, checked above.
                    unsafe { write(DType::F32, c.workspace, bh * l + i, b[i as usize]) };
                    for e in 0..d {
                        let v = a[(i * d + e) as usize];
                        // SAFETY: as above; dq's accumulator is `[b, h, l, d]` dense.
                        unsafe {
                            write(DType::F32, acc, (bh * l + i) * d + e, v);
                            write(dt, c.grads[1], at(dqs, bi, hi, i, e), v);
                        }
                    }
                }
                for j in 0..s {
                    for e in 0..d {
                        // SAFETY: within the checked spans.
                        unsafe {
                            write(
                                dt,
                                c.grads[2],
                                at(dks, bi, hi, j, e),
                                x[(j * d + e) as usize],
                            );
                            write(
                                dt,
                                c.grads[3],
                                at(dvs, bi, hi, j, e),
                                y[(j * d + e) as usize],
                            );
                        }
                    }
                }
            }
        }
    }
}
