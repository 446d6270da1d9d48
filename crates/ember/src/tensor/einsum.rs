//! `einsum`, `bmm` and `outer`: products written in terms of `matmul`, sums,
//! permutations and reshapes, so they run on every device and their gradients
//! come from those ops.

use super::Tensor;
use crate::error::{Error, Result};

/// One operand's subscripts: a label per dim, the ellipsis standing for the
/// broadcast dims (labels from 128 up, past every letter, one per ellipsis
/// dim, right-aligned).
type Labels = Vec<u8>;

const ELLIPSIS_BASE: u8 = 128;
/// The most ellipsis dims an operand can have (PyTorch's most dims).
const MAX_ELLIPSIS: usize = 64;

impl Tensor {
    /// Batched matrix product of two 3-D tensors with the same batch size
    /// (`torch.bmm`): `[b, n, m] · [b, m, p] → [b, n, p]`.
    pub fn bmm(&self, rhs: &Tensor) -> Result<Tensor> {
        for (t, which) in [(self, "batch1"), (rhs, "batch2")] {
            if t.rank() != 3 {
                return Err(Error::invalid(
                    "bmm",
                    format!("{which} must be a 3D tensor"),
                ));
            }
        }
        let (b, m) = (self.shape()[0], self.shape()[2]);
        if rhs.shape()[..2] != [b, m] {
            return Err(Error::shape(
                "bmm",
                self.shape(),
                rhs.shape(),
                format!(
                    "Expected size for first two dimensions of batch2 tensor to be: [{b}, {m}] but got: [{}, {}].",
                    rhs.shape()[0],
                    rhs.shape()[1]
                ),
            ));
        }
        self.matmul(rhs)
    }

    /// The outer product of two 1-D tensors (`torch.outer`): `out[i][j] = a[i] ·
    /// b[j]`, with the usual type promotion.
    pub fn outer(&self, rhs: &Tensor) -> Result<Tensor> {
        for (t, which) in [(self, "self"), (rhs, "vec2")] {
            if t.rank() != 1 {
                return Err(Error::invalid(
                    "outer",
                    format!(
                        "outer: Expected 1-D argument {which}, but got {}-D",
                        t.rank()
                    ),
                ));
            }
        }
        self.unsqueeze(1)?.mul(&rhs.unsqueeze(0)?)
    }

    /// Einstein summation (`torch.einsum`): `"bij,bjk->bik"`, `"...qd,...kd->...qk"`,
    /// `"ij->ji"`, `"i,i->"`. Labels are letters; `...` stands for broadcast dims;
    /// without `->` the output holds the labels that appear once, in alphabetical
    /// order. Labels missing from the output are summed over. Operands are
    /// contracted pairwise from the left, each pair by one batched `matmul`.
    /// A label repeated within one operand takes the diagonal (`"ii->i"`, the
    /// trace `"ii"`, `"bii->bi"`).
    pub fn einsum(equation: &str, operands: &[&Tensor]) -> Result<Tensor> {
        let (inputs, output) = parse(equation, operands)?;
        // each operand with its diagonals taken: every label once per operand
        let (operands, inputs): (Vec<Tensor>, Vec<Labels>) = operands
            .iter()
            .zip(inputs)
            .map(|(t, labels)| diagonals(t, labels))
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .unzip();
        let mut acc = (operands[0].clone(), inputs[0].clone());
        for (k, (t, labels)) in operands.iter().zip(&inputs).enumerate().skip(1) {
            // keep what the output or a later operand still needs
            let later: Vec<u8> = inputs[k + 1..].iter().flatten().copied().collect();
            let keep: Labels = unique(acc.1.iter().chain(labels))
                .into_iter()
                .filter(|l| output.contains(l) || later.contains(l))
                .collect();
            acc = (contract(&acc.0, &acc.1, t, labels, &keep)?, keep);
        }
        // what remains: sum the labels the output lacks, then order as asked
        let (t, labels) = acc;
        let t = sum_labels(&t, &labels, |l| !output.contains(&l))?;
        let labels: Labels = labels.into_iter().filter(|l| output.contains(l)).collect();
        let perm: Vec<i64> = output
            .iter()
            .map(|l| {
                labels
                    .iter()
                    .position(|x| x == l)
                    .expect("every output label") as i64
            })
            .collect();
        if perm.iter().enumerate().all(|(i, &p)| i as i64 == p) {
            Ok(t)
        } else {
            t.permute(perm)
        }
    }
}

/// The labels of each operand (ellipses expanded) and of the output.
fn parse(equation: &str, operands: &[&Tensor]) -> Result<(Vec<Labels>, Labels)> {
    let eq: String = equation.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (eq.as_str(), None),
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    if terms.len() < operands.len() {
        return Err(Error::invalid(
            "einsum",
            "einsum(): more operands were provided than specified in the equation",
        ));
    }
    if terms.len() > operands.len() {
        return Err(Error::invalid(
            "einsum",
            "einsum(): fewer operands were provided than specified in the equation",
        ));
    }
    if operands.is_empty() {
        return Err(Error::invalid(
            "einsum",
            "einsum(): must provide at least one operand",
        ));
    }
    crate::tensor::same_device("einsum", operands)?;
    // PyTorch's errors, at the first character that is neither a letter nor
    // part of the term's one ellipsis (`who`: "operand k" or "output")
    let check_chars = |s: &str, at: usize, who: &str| -> Result<()> {
        let b = s.as_bytes();
        let (mut i, mut ellipsis) = (0, false);
        while i < b.len() {
            if b[i] == b'.' {
                if !ellipsis && b[i..].starts_with(b"...") {
                    (ellipsis, i) = (true, i + 3);
                    continue;
                }
                let msg = match (ellipsis, who == "output") {
                    (true, true) => {
                        "einsum(): found '.' for output but an ellipsis (...) was already found"
                            .to_string()
                    }
                    (true, false) => {
                        format!(
                            "einsum(): found '.' for {who} for which an ellipsis was already found"
                        )
                    }
                    (false, true) => {
                        "einsum(): found '.' for output that is not part of any ellipsis (...)"
                            .to_string()
                    }
                    (false, false) => {
                        format!("einsum(): found '.' for {who} that is not part of any ellipsis")
                    }
                };
                return Err(Error::invalid("einsum", msg));
            }
            if !b[i].is_ascii_alphabetic() {
                return Err(Error::invalid(
                    "einsum",
                    format!(
                        "einsum(): invalid subscript given at index {} in the equation string, subscripts must be in [a-zA-Z]",
                        at + i
                    ),
                ));
            }
            i += 1;
        }
        Ok(())
    };
    let mut at = 0;
    let mut max_ellipsis = 0;
    let mut inputs = Vec::with_capacity(terms.len());
    for (k, (term, t)) in terms.iter().zip(operands).enumerate() {
        check_chars(term, at, &format!("operand {k}"))?;
        at += term.len() + 1;
        let letters = term.replace("...", "");
        let has_ellipsis = term.contains("...");
        if (!has_ellipsis && letters.len() != t.rank()) || letters.len() > t.rank() {
            return Err(Error::invalid(
                "einsum",
                format!(
                    "einsum(): the number of subscripts in the equation ({}) does not match the number of dimensions ({}) for operand {k}{}",
                    letters.len(),
                    t.rank(),
                    if has_ellipsis { "" } else { " and no ellipsis was given" }
                ),
            ));
        }
        let n_ell = t.rank() - letters.len();
        if n_ell > MAX_ELLIPSIS {
            return Err(Error::invalid(
                "einsum",
                format!("einsum(): operand {k}'s ellipsis covers {n_ell} dims; at most {MAX_ELLIPSIS} are supported"),
            ));
        }
        max_ellipsis = max_ellipsis.max(n_ell);
        let mut labels = Labels::with_capacity(t.rank());
        let (before, after) = term.split_once("...").unwrap_or((term, ""));
        labels.extend(before.bytes());
        if has_ellipsis {
            // right-aligned: the last ellipsis dim is the same label in every operand
            labels.extend((0..n_ell).map(|i| ELLIPSIS_BASE + (MAX_ELLIPSIS - n_ell + i) as u8));
        }
        labels.extend(after.bytes());
        // a label repeated within the operand takes its diagonal (checked here)
        let mut seen: Vec<(u8, usize)> = Vec::new();
        for (d, &l) in labels.iter().enumerate() {
            match seen.iter().find(|(x, _)| *x == l) {
                Some(&(_, first)) if t.shape()[first] != t.shape()[d] => {
                    return Err(Error::invalid(
                        "einsum",
                        format!(
                            "einsum(): subscript {} is repeated for operand {k} but the sizes don't match, {} != {}",
                            l as char,
                            t.shape()[d],
                            t.shape()[first]
                        ),
                    ));
                }
                Some(_) => {}
                None => seen.push((l, d)),
            }
        }
        inputs.push(labels);
    }
    let ellipsis: Labels = (0..max_ellipsis)
        .map(|i| ELLIPSIS_BASE + (MAX_ELLIPSIS - max_ellipsis + i) as u8)
        .collect();
    let output = match rhs {
        Some(r) => {
            check_chars(r, at + 1, "output")?;
            let (before, after) = r.split_once("...").unwrap_or((r, ""));
            let mut out: Labels = before.bytes().collect();
            if r.contains("...") {
                out.extend(&ellipsis);
            }
            out.extend(after.bytes());
            for &l in out.iter().filter(|l| l.is_ascii_alphabetic()) {
                if out.iter().filter(|&&x| x == l).count() > 1 {
                    return Err(Error::invalid(
                        "einsum",
                        format!(
                            "einsum(): output subscript {} appears more than once in the output",
                            l as char
                        ),
                    ));
                }
                if !inputs.iter().any(|i| i.contains(&l)) {
                    return Err(Error::invalid(
                        "einsum",
                        format!(
                            "einsum(): output subscript {} does not appear in the equation for any input operand",
                            l as char
                        ),
                    ));
                }
            }
            out
        }
        None => {
            // the ellipsis dims first, then the labels seen once, alphabetically
            let all: Vec<u8> = inputs.iter().flatten().copied().collect();
            let mut once: Labels = unique(all.iter().filter(|l| l.is_ascii_alphabetic()))
                .into_iter()
                .filter(|l| all.iter().filter(|&x| x == l).count() == 1)
                .collect();
            once.sort_unstable();
            ellipsis.iter().copied().chain(once).collect()
        }
    };
    // every label's size agrees (or is 1, which broadcasts)
    let mut sizes: Vec<(u8, usize)> = Vec::new();
    for (k, (labels, t)) in inputs.iter().zip(operands).enumerate() {
        for (&l, &n) in labels.iter().zip(t.shape()) {
            match sizes.iter_mut().find(|(x, _)| *x == l) {
                Some((_, seen)) if *seen != n && *seen != 1 && n != 1 => {
                    return Err(Error::shape(
                        "einsum",
                        operands[0].shape(),
                        t.shape(),
                        format!(
                            "einsum(): subscript {} has size {n} for operand {k} which does not broadcast with previously seen size {seen}",
                            label_name(l)
                        ),
                    ))
                }
                Some((_, seen)) => *seen = (*seen).max(n),
                None => sizes.push((l, n)),
            }
        }
    }
    Ok((inputs, output))
}

fn label_name(l: u8) -> String {
    if l.is_ascii_alphabetic() {
        (l as char).to_string()
    } else {
        "...".into()
    }
}

fn unique<'a>(labels: impl IntoIterator<Item = &'a u8>) -> Labels {
    let mut out = Labels::new();
    for &l in labels {
        if !out.contains(&l) {
            out.push(l);
        }
    }
    out
}

/// `t` with the diagonal taken for each label repeated in `labels` (sizes
/// checked by `parse`): the elements where the two dims' indices agree, as
/// `sum(t · eye, second dim)`, so that autograd gives the gradient to the
/// diagonal only. The result keeps `t`'s dtype; the label stays at its first
/// position.
fn diagonals(t: &Tensor, mut labels: Labels) -> Result<(Tensor, Labels)> {
    let mut t = t.clone();
    while let Some(l) = repeated(&labels) {
        let first = labels.iter().position(|&x| x == l).unwrap_or(0);
        let second = labels.iter().rposition(|&x| x == l).unwrap_or(first);
        let n = t.shape()[first];
        let mut shape = vec![1; t.rank()];
        shape[first] = n;
        shape[second] = n;
        let eye = Tensor::eye(n, t.dtype(), &t.device())?.reshape(shape)?;
        let dt = t.dtype();
        t = t.mul(&eye)?.sum(second as i64, false)?;
        if t.dtype() != dt {
            t = t.to_dtype(dt)?;
        }
        labels.remove(second);
    }
    Ok((t, labels))
}

fn repeated(labels: &[u8]) -> Option<u8> {
    labels
        .iter()
        .enumerate()
        .find(|(i, l)| labels[..*i].contains(l))
        .map(|(_, &l)| l)
}

/// `t` summed over the dims whose label `drop` selects.
fn sum_labels(t: &Tensor, labels: &[u8], drop: impl Fn(u8) -> bool) -> Result<Tensor> {
    let dims: Vec<i64> = (0..labels.len())
        .filter(|&d| drop(labels[d]))
        .map(|d| d as i64)
        .collect();
    if dims.is_empty() {
        Ok(t.clone())
    } else {
        t.sum(dims, false)
    }
}

/// `a` (labels `la`) times `b` (labels `lb`), summed over the shared labels not in
/// `keep`, as a tensor whose dims are `keep`'s labels in that order: the labels
/// of only one operand that `keep` lacks are summed first; then one batched
/// matmul of `[batch, a-only, contracted] · [batch, contracted, b-only]`.
fn contract(a: &Tensor, la: &[u8], b: &Tensor, lb: &[u8], keep: &[u8]) -> Result<Tensor> {
    let a = sum_labels(a, la, |l| !keep.contains(&l) && !lb.contains(&l))?;
    let la: Labels = la
        .iter()
        .copied()
        .filter(|l| keep.contains(l) || lb.contains(l))
        .collect();
    let b = sum_labels(b, lb, |l| !keep.contains(&l) && !la.contains(&l))?;
    let lb: Labels = lb
        .iter()
        .copied()
        .filter(|l| keep.contains(l) || la.contains(l))
        .collect();
    let batch: Labels = keep
        .iter()
        .copied()
        .filter(|l| la.contains(l) && lb.contains(l))
        .collect();
    let contracted: Labels = la
        .iter()
        .copied()
        .filter(|l| lb.contains(l) && !keep.contains(l))
        .collect();
    let a_only: Labels = la.iter().copied().filter(|l| !lb.contains(l)).collect();
    let b_only: Labels = lb.iter().copied().filter(|l| !la.contains(l)).collect();
    let size = |t: &Tensor, ls: &[u8], l: u8| ls.iter().position(|&x| x == l).map(|d| t.shape()[d]);
    // a label of both operands may be 1 in one of them (broadcast): the larger size
    let full = |l: u8| {
        size(&a, &la, l)
            .unwrap_or(1)
            .max(size(&b, &lb, l).unwrap_or(1))
    };
    // `t` permuted to the labels `order` and broadcast to their full sizes
    let arrange = |t: &Tensor, ls: &[u8], order: &[u8]| -> Result<Tensor> {
        let perm: Vec<i64> = order
            .iter()
            .map(|l| {
                ls.iter()
                    .position(|x| x == l)
                    .expect("label of the operand") as i64
            })
            .collect();
        let t = t.permute(perm)?;
        let shape: Vec<usize> = order.iter().map(|&l| full(l)).collect();
        if t.shape() == shape.as_slice() {
            Ok(t)
        } else {
            t.expand(&shape)
        }
    };
    let count = |g: &[u8]| -> usize { g.iter().map(|&l| full(l)).product() };
    let (nb, m, k, n) = (
        count(&batch),
        count(&a_only),
        count(&contracted),
        count(&b_only),
    );
    let cat = |x: &[&[u8]]| -> Labels { x.iter().flat_map(|g| g.iter()).copied().collect() };
    let a3 = arrange(&a, &la, &cat(&[&batch, &a_only, &contracted]))?.reshape([nb, m, k])?;
    let b3 = arrange(&b, &lb, &cat(&[&batch, &contracted, &b_only]))?.reshape([nb, k, n])?;
    let labels = cat(&[&batch, &a_only, &b_only]);
    let out_shape: Vec<usize> = labels.iter().map(|&l| full(l)).collect();
    let out = a3.matmul(&b3)?.reshape(&out_shape)?;
    let perm: Vec<i64> = keep
        .iter()
        .map(|l| labels.iter().position(|x| x == l).expect("a kept label") as i64)
        .collect();
    out.permute(perm)
}
