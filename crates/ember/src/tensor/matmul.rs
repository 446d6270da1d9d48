//! `matmul` with `torch.matmul` semantics.

use super::{Storages, Tensor};
use crate::autograd::Saved;
use crate::layout::{broadcast_shapes, checked_numel, Dims};
use crate::{
    dtype::DType,
    error::{Error, Result},
};

/// Whether the last two dims are stored column-major (a transposed view).
fn is_transposed(t: &Tensor) -> bool {
    let (r, st) = (t.rank(), t.stride());
    r >= 2 && st[r - 2] == 1 && st[r - 1] != 1 && t.shape()[r - 2] > 1
}

/// The gradients of `C = A·B` (2-D or more, batch dims already broadcast) from
/// `g = dC`: `dA = dC·Bᵀ` where `B` was saved (`A`'s gradient is wanted), `dB =
/// Aᵀ·dC` where `A` was. An operand stored transposed (`x.matmul(&w.t())`, `ta`/`tb`)
/// gets its gradient computed transposed too, (Xᵀ)ᵀ, so that it comes out in the
/// operand's own memory order and the gradient of the transpose view is contiguous
/// again (no transposing copy).
fn product_grads(
    g: &Tensor,
    (a, b): (&Option<Saved>, &Option<Saved>),
    (ta, tb): (bool, bool),
) -> Result<(Option<Tensor>, Option<Tensor>)> {
    let ga = match b {
        Some(b) => {
            let b = &b.value()?;
            Some(if ta {
                b.matmul(&g.transpose(-1, -2)?)?.transpose(-1, -2)?
            } else {
                g.matmul(&b.transpose(-1, -2)?)?
            })
        }
        None => None,
    };
    let gb = match a {
        Some(a) => {
            let a = &a.value()?;
            Some(if tb {
                g.transpose(-1, -2)?.matmul(a)?.transpose(-1, -2)?
            } else {
                a.transpose(-1, -2)?.matmul(g)?
            })
        }
        None => None,
    };
    Ok((ga, gb))
}

impl Tensor {
    /// Matrix product with `torch.matmul` semantics: 1-D·1-D is a dot product, 2-D·2-D
    /// a matrix product, and higher ranks are batches of matrices whose batch dims
    /// broadcast. A 1-D operand gets a dim prepended (left) or appended (right) that
    /// is removed from the result. f16/bf16 accumulate in f32.
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        const OP: &str = "matmul";
        if let Some(c) = crate::tensor::autocast::lower(&[self, rhs])? {
            return c[0].matmul(&c[1]);
        }
        super::same_device(OP, &[self, rhs])?;
        if self.dtype() != rhs.dtype() {
            return Err(Error::DTypeMismatch {
                op: OP,
                lhs: self.dtype(),
                rhs: rhs.dtype(),
            });
        }
        if self.dtype() == DType::Bool {
            return Err(Error::dtype(
                OP,
                DType::Bool,
                "convert to an integer or float dtype first",
            ));
        }
        if self.rank() == 0 || rhs.rank() == 0 {
            return Err(Error::invalid(
                OP,
                format!(
                    "both arguments to matmul need to be at least 1D, but they are {}D and {}D",
                    self.rank(),
                    rhs.rank()
                ),
            ));
        }
        if self.rank() >= 3 && rhs.rank() <= 2 && self.shape()[self.rank() - 1] == rhs.shape()[0] {
            return self.folded_matmul(rhs);
        }
        // a 1-D operand's view is recorded: the rule saves it, and a gradient
        // of the gradient goes back through it
        let a = if self.rank() == 1 {
            self.unsqueeze(0)?
        } else {
            self.clone()
        };
        let b = if rhs.rank() == 1 {
            rhs.unsqueeze(1)?
        } else {
            rhs.clone()
        };
        let _ng = crate::autograd::no_grad_guard();
        let (ra, rb) = (a.rank(), b.rank());
        let (m, ka) = (a.shape()[ra - 2], a.shape()[ra - 1]);
        let (kb, n) = (b.shape()[rb - 2], b.shape()[rb - 1]);
        if ka != kb {
            return Err(Error::shape(
                OP,
                self.shape(),
                rhs.shape(),
                format!("mat1 and mat2 shapes cannot be multiplied ({m}x{ka} and {kb}x{n})"),
            ));
        }
        let batch = broadcast_shapes(OP, &a.shape()[..ra - 2], &b.shape()[..rb - 2])?;
        let with = |x: usize, y: usize| -> Dims {
            let mut s = batch.clone();
            s.push(x);
            s.push(y);
            s
        };
        checked_numel(OP, &with(m, n))?;
        let la = a.layout().broadcast_to(OP, &with(m, ka))?;
        let lb = b.layout().broadcast_to(OP, &with(ka, n))?;
        let st = Storages::read(&[&a, &b]);
        let out = st.get(0).matmul(&la, st.get(1), &lb, (m, ka, n), None)?;
        drop(st);
        // drop the dims that 1-D operands gained
        let mut shape = with(m, n);
        if rhs.rank() == 1 {
            shape.pop();
        }
        if self.rank() == 1 {
            let r = shape.len() - if rhs.rank() == 1 { 1 } else { 2 };
            shape.remove(r);
        }
        drop(_ng);
        let out = Tensor::from_storage(out, &shape);
        let full = with(m, n).to_vec();
        Ok(Tensor::record_twice(out, OP, &[self, rhs], |_| {
            let (na, nb) = (self.requires_grad(), rhs.requires_grad());
            // each operand's values are saved only when the other's gradient needs them
            let (ta, tb) = (is_transposed(&a), is_transposed(&b));
            let (a_shape, b_shape) = (a.shape().to_vec(), b.shape().to_vec());
            let (a, b) = (nb.then(|| a.save()), na.then(|| b.save()));
            let (sa, sb) = (self.shape().to_vec(), rhs.shape().to_vec());
            move |g: &Tensor| {
                // in the 2-D-or-more domain: dA = dC·Bᵀ, dB = Aᵀ·dC, summed over broadcast batch dims
                let g = g.reshape(&full)?;
                let (ga, gb) = product_grads(&g, (&a, &b), (ta, tb))?;
                let ga = match ga {
                    Some(t) => Some(crate::autograd::sum_to(&t, &a_shape)?.reshape(&sa)?),
                    None => None,
                };
                let gb = match gb {
                    Some(t) => Some(crate::autograd::sum_to(&t, &b_shape)?.reshape(&sb)?),
                    None => None,
                };
                Ok(vec![ga, gb])
            }
        }))
    }

    /// `self + mat1 · mat2` with `torch.addmm` semantics (beta = alpha = 1): `mat1`
    /// is `[n, k]`, `mat2` `[k, m]`, and `self` expands to `[n, m]`. When `self` is
    /// one row for every row (`[m]`, `[1, m]`, `[1]` or a scalar), the product adds
    /// it itself, as PyTorch's kernels do (cublasLt's bias epilogue on a GPU): no
    /// second pass over the output, and f16/bf16 round once. Integers are allowed,
    /// bools are not. Under autocast it runs in the lower precision.
    ///
    /// ```
    /// # use ember::{Tensor, Device};
    /// let b = Tensor::from_slice(&[1.0f32, 2.0], &[2], &Device::Cpu)?;
    /// let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[1, 3], &Device::Cpu)?;
    /// let w = Tensor::from_slice(&[1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0], &[3, 2], &Device::Cpu)?;
    /// assert_eq!(b.addmm(&x, &w)?.to_vec::<f32>()?, [5.0, 7.0]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn addmm(&self, mat1: &Tensor, mat2: &Tensor) -> Result<Tensor> {
        const OP: &str = "addmm";
        if let Some(c) = crate::tensor::autocast::lower(&[self, mat1, mat2])? {
            return c[0].addmm(&c[1], &c[2]);
        }
        super::same_device(OP, &[self, mat1, mat2])?;
        // (PyTorch checks self against mat2 first, then mat1)
        for t in [self, mat1] {
            if t.dtype() != mat2.dtype() {
                return Err(Error::DTypeMismatch {
                    op: OP,
                    lhs: t.dtype(),
                    rhs: mat2.dtype(),
                });
            }
        }
        if self.dtype() == DType::Bool {
            return Err(Error::dtype(
                OP,
                DType::Bool,
                "\"addmm\" is not implemented for 'Bool'; convert to an integer or float dtype first",
            ));
        }
        // (PyTorch calls mat1 "self" in this message)
        for (what, t) in [("self", mat1), ("mat2", mat2)] {
            if t.rank() != 2 {
                return Err(Error::invalid(
                    OP,
                    format!("addmm: {what} must be a matrix, got {}-D tensor", t.rank()),
                ));
            }
        }
        let (n, k) = (mat1.shape()[0], mat1.shape()[1]);
        let (k2, m) = (mat2.shape()[0], mat2.shape()[1]);
        if k != k2 {
            return Err(Error::shape(
                OP,
                mat1.shape(),
                mat2.shape(),
                format!("addmm: mat1 and mat2 shapes cannot be multiplied ({n}x{k} and {k2}x{m})"),
            ));
        }
        let expanded = self.expand([n, m])?;
        let _ng = crate::autograd::no_grad_guard();
        let out = if n > 0 && (self.rank() < 2 || self.shape()[0] == 1) {
            // one row for all: the product adds it
            let row = expanded.select(0, 0)?;
            let st = Storages::read(&[mat1, mat2, &row]);
            let out = st.get(0).matmul(
                mat1.layout(),
                st.get(1),
                mat2.layout(),
                (n, k, m),
                Some((st.get(2), row.layout())),
            )?;
            drop(st);
            Tensor::from_storage(out, &[n, m])
        } else {
            mat1.matmul(mat2)?.add(&expanded)?
        };
        drop(_ng);
        Ok(Tensor::record_twice(out, OP, &[self, mat1, mat2], |_| {
            let (na, nb) = (mat1.requires_grad(), mat2.requires_grad());
            let (ta, tb) = (is_transposed(mat1), is_transposed(mat2));
            let (a, b) = (nb.then(|| mat1.save()), na.then(|| mat2.save()));
            let bias_shape = self.requires_grad().then(|| self.shape().to_vec());
            move |g: &Tensor| {
                let gbias = match &bias_shape {
                    Some(s) => Some(crate::autograd::sum_to(g, s)?),
                    None => None,
                };
                let (ga, gb) = product_grads(g, (&a, &b), (ta, tb))?;
                Ok(vec![gbias, ga, gb])
            }
        }))
    }

    /// `[..., m, k] @ [k, n]` (or `[k]`) as one `[rows, k] @ [k, n]` product, as
    /// PyTorch folds it: the batch becomes rows, so the weight's gradient is one
    /// product too, not a product per batch entry summed afterwards.
    fn folded_matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        let r = self.rank();
        let k = self.shape()[r - 1];
        let rows: usize = self.shape()[..r - 1].iter().product();
        let out = self.reshape([rows, k])?.matmul(rhs)?;
        let mut shape = self.shape()[..r - 1].to_vec();
        if rhs.rank() == 2 {
            shape.push(rhs.shape()[1]);
        }
        out.reshape(shape)
    }
}
