//! Scans and the reductions built on them or on the others: `cumsum`, `cumprod`
//! (the `cumulative` primitive), `prod`, `all`/`any`, `logsumexp` and the vector
//! norms.

use super::shape::{dim_list, IntoDims};
use super::Tensor;
use crate::backend::op::ScanOp;
use crate::layout::{normalize_dim, Dims};
use crate::{
    dtype::DType,
    error::{Error, Result},
};

impl Tensor {
    /// Running sums along `dim` (`torch.cumsum`); integers and bools sum in int64.
    pub fn cumsum(&self, dim: i64) -> Result<Tensor> {
        self.scan("cumsum", dim, ScanOp::Sum)
    }

    /// Running products along `dim` (`torch.cumprod`); integers and bools in int64.
    /// The gradient is exact where the input has zeros, as PyTorch's.
    pub fn cumprod(&self, dim: i64) -> Result<Tensor> {
        self.scan("cumprod", dim, ScanOp::Prod)
    }

    /// [`cumsum`](Self::cumsum) of this tensor cast to `dtype` first
    /// (`torch.cumsum(t, dim, dtype=dtype)`): the sums are computed in `dtype`
    /// (uint8 wraps around, as PyTorch's), bool is refused, and autocast leaves
    /// the explicit dtype alone. The gradient flows back through the cast.
    ///
    /// ```
    /// # use ember::{DType, Device, Tensor};
    /// let t = Tensor::from_vec(vec![200u8, 100, 3], [3], &Device::Cpu)?;
    /// assert_eq!(t.cumsum_dtype(0, DType::U8)?.to_vec::<u8>()?, vec![200, 44, 47]);
    /// assert_eq!(t.cumsum_dtype(0, DType::F32)?.to_vec::<f32>()?, vec![200.0, 300.0, 303.0]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn cumsum_dtype(&self, dim: i64, dtype: DType) -> Result<Tensor> {
        self.scan_dtype("cumsum", dim, ScanOp::Sum, dtype)
    }

    /// [`cumprod`](Self::cumprod) of this tensor cast to `dtype` first
    /// (`torch.cumprod(t, dim, dtype=dtype)`), as [`cumsum_dtype`](Self::cumsum_dtype).
    pub fn cumprod_dtype(&self, dim: i64, dtype: DType) -> Result<Tensor> {
        self.scan_dtype("cumprod", dim, ScanOp::Prod, dtype)
    }

    fn scan_dtype(&self, name: &'static str, dim: i64, op: ScanOp, dtype: DType) -> Result<Tensor> {
        if dtype == DType::Bool {
            return Err(Error::dtype(
                name,
                dtype,
                format!("\"{name}_out_cpu\" not implemented for 'Bool'"),
            ));
        }
        let y = self.to_dtype(dtype)?.scan_in(name, dim, op)?;
        // uint8 scans in int64: the same values modulo 256
        y.to_dtype(dtype)
    }

    fn scan(&self, name: &'static str, dim: i64, op: ScanOp) -> Result<Tensor> {
        // cumsum and cumprod are on CUDA's autocast float32 list
        if let Some(c) = crate::tensor::autocast::to_f32_cuda(&[self])? {
            return c[0].scan(name, dim, op);
        }
        self.scan_in(name, dim, op)
    }

    fn scan_in(&self, name: &'static str, dim: i64, op: ScanOp) -> Result<Tensor> {
        let d = normalize_dim(name, dim, self.rank().max(1))?;
        let x = if self.dtype().is_float() {
            self.clone()
        } else {
            self.to_dtype(DType::I64)?
        };
        if self.rank() == 0 {
            return x.copy();
        }
        let x = x.contiguous()?;
        let out = x.map_storage_same(|s, l| s.cumulative(l, d, op))?;
        let dim = d as i64;
        Ok(Tensor::record_twice(out, name, &[&x], |y| {
            let saved = (op == ScanOp::Prod).then(|| (x.save(), y.save()));
            move |g: &Tensor| {
                let gx = match &saved {
                    // each input reaches every later output
                    None => reverse_cumsum(g, dim)?,
                    Some((x, y)) => cumprod_backward(&x.value()?, &y.value()?, g, dim)?,
                };
                Ok(vec![Some(gx)])
            }
        }))
    }

    /// The product over `dim` (`torch.prod(t, dim)`); integers and bools multiply
    /// in int64; an empty dim gives 1.
    pub fn prod(&self, dim: i64, keepdim: bool) -> Result<Tensor> {
        // on both device types' autocast float32 lists
        if let Some(c) = crate::tensor::autocast::to_f32(&[self])? {
            return c[0].prod(dim, keepdim);
        }
        self.prod_in(dim, keepdim)
    }

    /// [`prod`](Self::prod) of this tensor cast to `dtype` first
    /// (`torch.prod(t, dim, dtype=dtype)`): uint8 wraps around, bool gives whether
    /// every element is nonzero, as PyTorch's; autocast leaves the explicit dtype
    /// alone.
    ///
    /// ```
    /// # use ember::{DType, Device, Tensor};
    /// let t = Tensor::from_vec(vec![200u8, 100, 3], [3], &Device::Cpu)?;
    /// assert_eq!(t.prod_dtype(0, false, DType::I64)?.to_vec::<i64>()?, vec![60000]);
    /// assert_eq!(t.prod_dtype(0, false, DType::U8)?.to_vec::<u8>()?, vec![96]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn prod_dtype(&self, dim: i64, keepdim: bool, dtype: DType) -> Result<Tensor> {
        let x = self.to_dtype(dtype)?;
        match dtype {
            DType::Bool => {
                normalize_dim("prod", dim, self.rank().max(1))?;
                if x.rank() == 0 {
                    return x.copy();
                }
                x.all(dim, keepdim)
            }
            _ => x.prod_in(dim, keepdim)?.to_dtype(dtype),
        }
    }

    /// [`prod_all`](Self::prod_all) of this tensor cast to `dtype` first
    /// (`torch.prod(t, dtype=dtype)`), as [`prod_dtype`](Self::prod_dtype).
    pub fn prod_all_dtype(&self, dtype: DType) -> Result<Tensor> {
        self.flatten_all()?.prod_dtype(0, false, dtype)
    }

    fn prod_in(&self, dim: i64, keepdim: bool) -> Result<Tensor> {
        let d = normalize_dim("prod", dim, self.rank().max(1))?;
        if self.rank() == 0 {
            return self.scan_in("cumprod", 0, ScanOp::Prod);
        }
        let n = self.shape()[d];
        if n == 0 {
            let dt = if self.dtype().is_float() {
                self.dtype()
            } else {
                DType::I64
            };
            let mut shape = self.shape().to_vec();
            if keepdim {
                shape[d] = 1;
            } else {
                shape.remove(d);
            }
            return Tensor::ones(shape, dt, &self.device());
        }
        let last = self
            .scan_in("cumprod", dim, ScanOp::Prod)?
            .narrow(dim, n as i64 - 1, 1)?;
        if keepdim {
            Ok(last)
        } else {
            last.squeeze(dim)
        }
    }

    /// The product of all elements as a 0-d tensor.
    pub fn prod_all(&self) -> Result<Tensor> {
        self.flatten_all()?.prod(0, false)
    }

    /// Whether every element over `dims` is nonzero (`torch.all(t, dims)`): bool,
    /// or uint8 for a uint8 input, as in PyTorch. An empty list of dims reduces
    /// nothing (each element's own truth), unlike `sum`'s, as in PyTorch.
    pub fn all(&self, dims: impl IntoDims, keepdim: bool) -> Result<Tensor> {
        if dims.to_dim_list().is_empty() {
            return self.truth(self.ne(0)?);
        }
        let zeros = self.eq(0)?.sum(dims, keepdim)?;
        self.truth(zeros.eq(0)?)
    }

    /// Whether any element over `dims` is nonzero (`torch.any(t, dims)`); NaN counts
    /// as nonzero. An empty list of dims reduces nothing, as in
    /// [`all`](Self::all).
    pub fn any(&self, dims: impl IntoDims, keepdim: bool) -> Result<Tensor> {
        if dims.to_dim_list().is_empty() {
            return self.truth(self.ne(0)?);
        }
        let nonzero = self.ne(0)?.sum(dims, keepdim)?;
        self.truth(nonzero.gt(0)?)
    }

    /// [`all`](Self::all) over every element, as a 0-d tensor.
    pub fn all_all(&self) -> Result<Tensor> {
        self.truth(self.eq(0)?.sum_all()?.eq(0)?)
    }

    /// [`any`](Self::any) over every element, as a 0-d tensor.
    pub fn any_all(&self) -> Result<Tensor> {
        self.truth(self.ne(0)?.sum_all()?.gt(0)?)
    }

    fn truth(&self, b: Tensor) -> Result<Tensor> {
        if self.dtype() == DType::U8 {
            b.to_dtype(DType::U8)
        } else {
            Ok(b)
        }
    }

    /// `log(sum(exp(x)))` over `dims`, computed without overflow
    /// (`torch.logsumexp`); integers give float32. An empty dim gives -∞. The
    /// gradient is the softmax over `dims`.
    pub fn logsumexp(&self, dims: impl IntoDims, keepdim: bool) -> Result<Tensor> {
        // on CUDA's autocast float32 list
        if let Some(c) = crate::tensor::autocast::to_f32_cuda(&[self])? {
            return c[0].logsumexp(dims, keepdim);
        }
        let x = if self.dtype().is_float() {
            self.clone()
        } else {
            self.to_dtype(DType::F32)?
        };
        let dims = dim_list("logsumexp", &dims, x.rank())?;
        if x.rank() == 0 {
            // dim 0 (or -1) of a 0-d tensor is the tensor itself: a 0-d result,
            // kept dim or not, as in PyTorch
            return x.reshape([1])?.logsumexp(0, false);
        }
        let dims: Dims = if dims.is_empty() {
            (0..x.rank()).collect()
        } else {
            dims
        };
        // an empty dim gives -inf (the log of an empty sum), with a gradient (of
        // the input's empty shape) all the same
        let empty = dims.iter().any(|&d| x.shape()[d] == 0);
        // the largest element is taken out before exp; where it is infinite, 0
        // instead, so that -inf - -inf gives no NaN
        let out = crate::autograd::no_grad(|| -> Result<Tensor> {
            if empty {
                let shape = reduced_shape(x.shape(), &dims, keepdim);
                return Tensor::full(shape, f64::NEG_INFINITY, x.dtype(), &x.device());
            }
            let x = x.detach();
            let m = x.max(&dims[..], true)?;
            let m = m.isinf()?.where_(0.0, &m)?;
            let s = x.sub(&m)?.exp()?.sum(&dims[..], keepdim)?.log()?;
            s.add(&m.reshape(s.shape())?)
        })?;
        let kept = reduced_shape(x.shape(), &dims, true);
        Ok(Tensor::record_twice(out, "logsumexp", &[&x], |y| {
            let (xs, y) = (x.save(), y.save());
            // PyTorch's rule: g · exp(x - y), the softmax over `dims`
            move |g: &Tensor| {
                let y = y.value()?.reshape(&kept)?;
                let e = xs.value()?.sub(&y)?.exp()?;
                Ok(vec![Some(g.reshape(&kept)?.mul(&e)?)])
            }
        }))
    }

    /// The vector `ord`-norm over `dims` (every element when `dims` is empty), as
    /// `torch.linalg.vector_norm`: `ord` 2 is the Euclidean norm, 1 the sum of
    /// absolute values, ±∞ the largest (smallest) absolute value, 0 the number of
    /// nonzero elements, any other `p` `(Σ|x|^p)^(1/p)`. Floating-point only. The
    /// gradient at a zero norm is 0, as PyTorch's.
    pub fn vector_norm(&self, ord: f64, dims: impl IntoDims, keepdim: bool) -> Result<Tensor> {
        let name = "vector_norm";
        // on CUDA's autocast float32 list
        if let Some(c) = crate::tensor::autocast::to_f32_cuda(&[self])? {
            return c[0].vector_norm(ord, dims, keepdim);
        }
        if !self.dtype().is_float() {
            return Err(Error::dtype(
                name,
                self.dtype(),
                format!(
                    "linalg.vector_norm: Expected a floating point or complex tensor as input. Got {}",
                    super::elementwise::torch_dtype_name(self.dtype())
                ),
            ));
        }
        let dims = dim_list(name, &dims, self.rank())?;
        if self.rank() == 0 {
            return self.reshape([1])?.vector_norm(ord, 0, false);
        }
        let dims: Dims = if dims.is_empty() {
            (0..self.rank()).collect()
        } else {
            dims
        };
        let empty = dims.iter().any(|&d| self.shape()[d] == 0) || self.numel() == 0;
        if empty && ord.is_infinite() {
            return Err(Error::invalid(
                name,
                format!(
                    "linalg.vector_norm cannot compute the {}inf norm on an empty tensor because the operation does not have an identity",
                    if ord < 0.0 { "-" } else { "" }
                ),
            ));
        }
        let ds = &dims[..];
        let out = crate::autograd::no_grad(|| -> Result<Tensor> {
            // float16 and bfloat16 accumulate in float32, rounded once at the end,
            // as in PyTorch: the norm of [300, 400] in float16 is 500, not inf
            let x = match self.dtype() {
                DType::F16 | DType::BF16 => self.detach().to_dtype(DType::F32)?,
                _ => self.detach(),
            };
            let a = x.abs()?;
            let y = match ord {
                2.0 => a.square()?.sum(ds, keepdim)?.sqrt(),
                1.0 => a.sum(ds, keepdim),
                f64::INFINITY => a.max(ds, keepdim),
                f64::NEG_INFINITY => a.min(ds, keepdim),
                0.0 => x.ne(0)?.to_dtype(x.dtype())?.sum(ds, keepdim),
                p => a.pow(p)?.sum(ds, keepdim)?.pow(1.0 / p),
            }?;
            y.to_dtype(self.dtype())
        })?;
        let kept = reduced_shape(self.shape(), &dims, true);
        Ok(Tensor::record_twice(out, name, &[self], |y| {
            let (x, y) = (self.save(), y.save());
            move |g: &Tensor| {
                if ord == 0.0 {
                    // the count of nonzeros: no gradient, as in PyTorch
                    return Ok(vec![None]);
                }
                let (x, y) = (x.value()?, y.value()?.reshape(&kept)?);
                let g = g.reshape(&kept)?;
                Ok(vec![Some(norm_backward(&x, &y, &g, ord, &dims)?)])
            }
        }))
    }

    /// The 2-norm of all elements (`torch.norm(t)`), a 0-d tensor.
    pub fn norm(&self) -> Result<Tensor> {
        self.vector_norm(2.0, Vec::<i64>::new(), false)
    }
}

/// `shape` with `dims` removed, or set to 1 with `keepdim`.
fn reduced_shape(shape: &[usize], dims: &[usize], keepdim: bool) -> Vec<usize> {
    shape
        .iter()
        .enumerate()
        .filter_map(|(d, &s)| match (dims.contains(&d), keepdim) {
            (false, _) => Some(s),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect()
}

/// Sums from each position to the end along `dim`: cumsum's backward.
fn reverse_cumsum(g: &Tensor, dim: i64) -> Result<Tensor> {
    g.flip(dim)?.cumsum(dim)?.flip(dim)
}

/// The gradient of `y = cumprod(x)` along `dim` for the output gradient `g`:
/// `Σ_{k≥i} g_k y_k / x_i` before the first zero of each line, the same sum with
/// that zero taken as 1 at the first zero, and 0 after it (every later product
/// holds the zero). No division by a zero and no host synchronisation.
fn cumprod_backward(x: &Tensor, y: &Tensor, g: &Tensor, dim: i64) -> Result<Tensor> {
    let zero = x.eq(0.0)?;
    let zeros_so_far = zero.cumsum(dim)?;
    let before = zeros_so_far.eq(0)?;
    let first = zero.logical_and(&zeros_so_far.eq(1)?)?;
    let safe_x = before.where_(x, 1.0)?;
    let plain = reverse_cumsum(&g.mul(y)?, dim)?.div(&safe_x)?;
    let without_first = first.where_(1.0, x)?.cumprod(dim)?;
    let at_first = reverse_cumsum(&g.mul(&without_first)?, dim)?;
    before.where_(&plain, &first.where_(&at_first, 0.0)?)
}

/// The gradient of the `ord`-norm `y` of `x` over `dims` (`y` and `g` with the
/// reduced dims kept as 1), as PyTorch's `norm_backward`.
fn norm_backward(x: &Tensor, y: &Tensor, g: &Tensor, ord: f64, dims: &[usize]) -> Result<Tensor> {
    let at_zero = || y.eq(0.0);
    match ord {
        1.0 => x.sign()?.mul(g),
        2.0 => x.mul(&g.div(y)?.masked_fill(&at_zero()?, 0.0)?),
        p if p.is_infinite() => {
            // shared evenly among the elements that reach the norm
            let hit = x.abs()?.eq(y)?.to_dtype(x.dtype())?;
            x.sign()?.mul(&g.div(&hit.sum(dims, true)?)?.mul(&hit)?)
        }
        p if p < 1.0 => {
            let scaled = x
                .sign()?
                .mul(&x.abs()?.pow(p - 1.0)?.masked_fill(&x.eq(0.0)?, 0.0)?)?;
            scaled.mul(g)?.mul(&y.pow(1.0 - p)?)
        }
        p => {
            let scaled = if p < 2.0 {
                x.sign()?.mul(&x.abs()?.pow(p - 1.0)?)?
            } else {
                x.mul(&x.abs()?.pow(p - 2.0)?)?
            };
            scaled.mul(&g.div(&y.pow(p - 1.0)?)?.masked_fill(&at_zero()?, 0.0)?)
        }
    }
}
