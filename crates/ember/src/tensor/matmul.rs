//! `matmul` with `torch.matmul` semantics.

use super::{Storages, Tensor};
use crate::autograd::Saved;
use crate::layout::{broadcast_shapes, checked_numel, Dims};
use crate::{DType, Error, Result};

impl Tensor {
    /// Matrix product with `torch.matmul` semantics: 1-D·1-D is a dot product, 2-D·2-D
    /// a matrix product, and higher ranks are batches of matrices whose batch dims
    /// broadcast. A 1-D operand gets a dim prepended (left) or appended (right) that
    /// is removed from the result. f16/bf16 accumulate in f32.
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        /// Whether the last two dims are stored column-major (a transposed view).
        fn is_transposed(t: &Tensor) -> bool {
            let (r, st) = (t.rank(), t.stride());
            r >= 2 && st[r - 2] == 1 && st[r - 1] != 1 && t.shape()[r - 2] > 1
        }
        const OP: &str = "matmul";
        if let Some(c) = crate::amp::lower(&[self, rhs])? {
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
        let _ng = crate::no_grad_guard();
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
        let out = st.get(0).matmul(&la, st.get(1), &lb, (m, ka, n))?;
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
        Ok(Tensor::record(out, OP, &[self, rhs], |_| {
            let (na, nb) = (self.requires_grad(), rhs.requires_grad());
            // each operand's values are saved only when the other's gradient needs them
            let (ta, tb) = (is_transposed(&a), is_transposed(&b));
            let (a_shape, b_shape) = (a.shape().to_vec(), b.shape().to_vec());
            let (a, b) = (nb.then(|| a.save()), na.then(|| b.save()));
            let (sa, sb) = (self.shape().to_vec(), rhs.shape().to_vec());
            move |g: &Tensor| {
                // in the 2-D-or-more domain: dA = dC·Bᵀ, dB = Aᵀ·dC, summed over broadcast batch dims
                let g = g.reshape(&full)?;
                fn saved(s: &Option<Saved>) -> Result<&Tensor> {
                    match s {
                        Some(s) => s.get(),
                        None => Err(Error::invalid(
                            "backward",
                            "matmul: an operand was not saved",
                        )),
                    }
                }
                // An operand stored transposed (`x.matmul(&w.t())`) gets its gradient
                // computed transposed too, (Xᵀ)ᵀ, so that it comes out with the
                // operand's own memory order and the gradient of the transpose view
                // is contiguous again (no transposing copy).
                let ga = if na {
                    let b = saved(&b)?;
                    let t = if ta {
                        b.matmul(&g.transpose(-1, -2)?)?.transpose(-1, -2)?
                    } else {
                        g.matmul(&b.transpose(-1, -2)?)?
                    };
                    Some(crate::autograd::sum_to(&t, &a_shape)?.reshape(&sa)?)
                } else {
                    None
                };
                let gb = if nb {
                    let a = saved(&a)?;
                    let t = if tb {
                        g.transpose(-1, -2)?.matmul(a)?.transpose(-1, -2)?
                    } else {
                        a.transpose(-1, -2)?.matmul(&g)?
                    };
                    Some(crate::autograd::sum_to(&t, &b_shape)?.reshape(&sb)?)
                } else {
                    None
                };
                Ok(vec![ga, gb])
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
