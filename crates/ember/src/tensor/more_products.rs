//! Products and counts: `cross`, `kron`, `tensordot`, `baddbmm`, `addbmm`,
//! `addmv`, `addr`, `cdist`, `argwhere`, `bincount` and `histc`, composites of
//! `matmul`, `bmm`, elementwise ops and `scatter_add`, so they run on every
//! device (the counts read values back, so not on meta).

use super::Tensor;
use crate::layout::{broadcast_shapes, normalize_dim};
use crate::tensor::elementwise::torch_dtype_name;
use crate::{
    autograd::no_grad,
    dtype::DType,
    error::{Error, Result},
};

/// `t · s`, leaving `t` as it is where `s` is 1 (as PyTorch's kernels skip the
/// product); integers are scaled by `s` truncated to an integer.
fn scaled(t: &Tensor, s: f64) -> Result<Tensor> {
    if s == 1.0 {
        Ok(t.clone())
    } else if t.dtype().is_float() {
        t.mul(s)
    } else {
        t.mul(s as i64)
    }
}

/// PyTorch's refusal of operands whose dtypes differ from the first's.
fn same_dtype(op: &'static str, ts: &[&Tensor]) -> Result<()> {
    for t in &ts[1..] {
        if t.dtype() != ts[0].dtype() {
            return Err(Error::invalid(
                op,
                format!(
                    "expected scalar type {} but found {}",
                    torch_dtype_name(ts[0].dtype()),
                    torch_dtype_name(t.dtype())
                ),
            ));
        }
    }
    Ok(())
}

impl Tensor {
    /// The cross product of 3-vectors along `dim` (`torch.linalg.cross(self,
    /// other, dim=dim)`, whose default `dim` is -1): both must have one rank,
    /// length 3 along `dim` and one dtype; the other dims broadcast.
    ///
    /// ```
    /// # use ember::{Device, Tensor};
    /// let x = Tensor::from_slice(&[1.0f64, 0.0, 0.0], &[3], &Device::Cpu)?;
    /// let y = Tensor::from_slice(&[0.0f64, 1.0, 0.0], &[3], &Device::Cpu)?;
    /// assert_eq!(x.cross(&y, -1)?.to_vec::<f64>()?, [0.0, 0.0, 1.0]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn cross(&self, other: &Tensor, dim: i64) -> Result<Tensor> {
        const OP: &str = "cross";
        if self.rank() != other.rank() {
            return Err(Error::invalid(
                OP,
                "linalg.cross: inputs must have the same number of dimensions.",
            ));
        }
        same_dtype(OP, &[self, other])?;
        let d = normalize_dim(OP, dim, self.rank().max(1))?;
        let (la, lb) = (
            self.shape().get(d).copied().unwrap_or(1),
            other.shape().get(d).copied().unwrap_or(1),
        );
        if la != 3 || lb != 3 {
            return Err(Error::invalid(
                OP,
                format!(
                    "linalg.cross: inputs dimension {dim} must have length 3. Got {la} and {lb}"
                ),
            ));
        }
        broadcast_shapes(OP, self.shape(), other.shape())?;
        let dim = d as i64;
        let at = |t: &Tensor, i: i64| t.narrow(dim, i, 1);
        let part = |i: i64, j: i64| -> Result<Tensor> {
            at(self, i)?
                .mul(&at(other, j)?)?
                .sub(&at(self, j)?.mul(&at(other, i)?)?)
        };
        Tensor::cat(&[&part(1, 2)?, &part(2, 0)?, &part(0, 1)?], dim)
    }

    /// The Kronecker product (`torch.kron`): the lower-rank operand gains
    /// leading dims of size 1, and each output dim has the product of the
    /// operands' sizes, `self`'s index major.
    pub fn kron(&self, other: &Tensor) -> Result<Tensor> {
        let r = self.rank().max(other.rank());
        let padded = |t: &Tensor| {
            let mut s = vec![1; r - t.rank()];
            s.extend_from_slice(t.shape());
            s
        };
        let (sa, sb) = (padded(self), padded(other));
        let (mut ia, mut ib, mut out) = (Vec::new(), Vec::new(), Vec::new());
        for (&a, &b) in sa.iter().zip(&sb) {
            ia.extend([a, 1]);
            ib.extend([1, b]);
            out.push(a * b);
        }
        self.reshape(ia)?.mul(&other.reshape(ib)?)?.reshape(out)
    }

    /// The sum of products over the dims `dims_a` of `self` and `dims_b` of
    /// `other`, paired in order (`torch.tensordot(a, b, dims=(dims_a,
    /// dims_b))`): the result has `self`'s other dims, then `other`'s. One
    /// matrix product.
    pub fn tensordot(&self, other: &Tensor, dims_a: &[i64], dims_b: &[i64]) -> Result<Tensor> {
        const OP: &str = "tensordot";
        if dims_a.len() != dims_b.len() {
            return Err(Error::invalid(
                OP,
                "both dimension lists should have same length",
            ));
        }
        let da: Vec<usize> = dims_a
            .iter()
            .map(|&d| normalize_dim(OP, d, self.rank().max(1)))
            .collect::<Result<_>>()?;
        let db: Vec<usize> = dims_b
            .iter()
            .map(|&d| normalize_dim(OP, d, other.rank().max(1)))
            .collect::<Result<_>>()?;
        for (&i, &j) in da.iter().zip(&db) {
            let (si, sj) = (self.shape()[i], other.shape()[j]);
            if si != sj {
                return Err(Error::invalid(
                    OP,
                    format!(
                        "contracted dimensions need to match, but first has size {si} in dim \
                         {i} and second has size {sj} in dim {j}"
                    ),
                ));
            }
        }
        let free_a: Vec<usize> = (0..self.rank()).filter(|d| !da.contains(d)).collect();
        let free_b: Vec<usize> = (0..other.rank()).filter(|d| !db.contains(d)).collect();
        let size = |t: &Tensor, ds: &[usize]| ds.iter().map(|&d| t.shape()[d]).product::<usize>();
        let k = size(self, &da);
        let as_i64 = |ds: Vec<usize>| ds.into_iter().map(|d| d as i64).collect::<Vec<_>>();
        let a = self
            .permute(as_i64([free_a.clone(), da].concat()))?
            .reshape([size(self, &free_a), k])?;
        let b = other
            .permute(as_i64([db, free_b.clone()].concat()))?
            .reshape([k, size(other, &free_b)])?;
        let mut shape: Vec<usize> = free_a.iter().map(|&d| self.shape()[d]).collect();
        shape.extend(free_b.iter().map(|&d| other.shape()[d]));
        a.matmul(&b)?.reshape(shape)
    }

    /// `beta · self + alpha · (batch1 @ batch2)` per batch entry
    /// (`torch.baddbmm`): `batch1` is `[b, n, k]`, `batch2` `[b, k, m]`, and
    /// `self` broadcasts to `[b, n, m]`. Where `beta` is 0, `self` is not read
    /// (its NaNs do not spread), as PyTorch's.
    pub fn baddbmm(
        &self,
        batch1: &Tensor,
        batch2: &Tensor,
        beta: f64,
        alpha: f64,
    ) -> Result<Tensor> {
        const OP: &str = "baddbmm";
        let prod = batch_product(OP, self, batch1, batch2)?;
        let out_shape = prod.shape().to_vec();
        add_scaled(self, &prod, &out_shape, beta, alpha)
    }

    /// `beta · self + alpha · Σ_b batch1[b] @ batch2[b]` (`torch.addbmm`): the
    /// batch products summed into one `[n, m]` matrix, to which `self`
    /// broadcasts; `beta` 0 ignores `self`.
    pub fn addbmm(
        &self,
        batch1: &Tensor,
        batch2: &Tensor,
        beta: f64,
        alpha: f64,
    ) -> Result<Tensor> {
        const OP: &str = "addbmm";
        let prod = batch_product(OP, self, batch1, batch2)?.sum([0i64], false)?;
        let out_shape = prod.shape().to_vec();
        add_scaled(self, &prod, &out_shape, beta, alpha)
    }

    /// `beta · self + alpha · (mat @ vec)` (`torch.addmv`): `mat` is `[n, m]`,
    /// `vec` `[m]`, `self` broadcasts to `[n]`; `beta` 0 ignores `self`.
    pub fn addmv(&self, mat: &Tensor, vec: &Tensor, beta: f64, alpha: f64) -> Result<Tensor> {
        const OP: &str = "addmv";
        if mat.rank() != 2 || vec.rank() != 1 || self.rank() > 1 {
            return Err(Error::invalid(
                OP,
                format!(
                    "vector + matrix @ vector expected, got {}, {}, {}",
                    self.rank(),
                    mat.rank(),
                    vec.rank()
                ),
            ));
        }
        let (n, m) = (mat.shape()[0], mat.shape()[1]);
        if m != vec.shape()[0] || (self.rank() == 1 && ![1, n].contains(&self.shape()[0])) {
            let input = self.shape().first().copied().unwrap_or(1);
            return Err(Error::invalid(
                OP,
                format!(
                    "size mismatch, got input ({input}), mat ({n}x{m}), vec ({})",
                    vec.shape()[0]
                ),
            ));
        }
        same_dtype(OP, &[self, mat, vec])?;
        add_scaled(self, &mat.matmul(vec)?, &[n], beta, alpha)
    }

    /// `beta · self + alpha · outer(vec1, vec2)` (`torch.addr`): `self`
    /// broadcasts to `[n, m]`; `beta` 0 ignores `self`.
    pub fn addr(&self, vec1: &Tensor, vec2: &Tensor, beta: f64, alpha: f64) -> Result<Tensor> {
        const OP: &str = "addr";
        for (what, v) in [("vec1", vec1), ("vec2", vec2)] {
            if v.rank() != 1 {
                return Err(Error::invalid(
                    OP,
                    format!("addr: Expected 1-D argument {what}, but got {}-D", v.rank()),
                ));
            }
        }
        same_dtype(OP, &[self, vec1, vec2])?;
        let outer = vec1.outer(vec2)?;
        let out_shape = outer.shape().to_vec();
        add_scaled(self, &outer, &out_shape, beta, alpha)
    }

    /// The `p`-norm distance between each row of `self` (`[..., P, M]`) and
    /// each of `x2` (`[..., R, M]`), `[..., P, R]` with the batch dims
    /// broadcast (`torch.cdist(self, x2, p)`); `p` is 0 (a count of differing
    /// coordinates), positive, or `f64::INFINITY`. For `p = 2` with more than
    /// 25 rows on either side the distances come from one matrix product
    /// (`|x|² - 2 x·y + |y|²`), as PyTorch's default computes them; otherwise
    /// from the differences. The gradient is PyTorch's (0 where a distance
    /// is 0).
    pub fn cdist(&self, x2: &Tensor, p: f64) -> Result<Tensor> {
        const OP: &str = "cdist";
        for (what, t) in [("X1", self), ("X2", x2)] {
            if t.rank() < 2 {
                return Err(Error::invalid(
                    OP,
                    format!(
                        "cdist only supports at least 2D tensors, {what} got: {}D",
                        t.rank()
                    ),
                ));
            }
        }
        let (c1, c2) = (self.shape()[self.rank() - 1], x2.shape()[x2.rank() - 1]);
        if c1 != c2 {
            return Err(Error::invalid(
                OP,
                format!("X1 and X2 must have the same number of columns. X1: {c1} X2: {c2}"),
            ));
        }
        for (what, t) in [("X1", self), ("X2", x2)] {
            if !t.dtype().is_float() {
                return Err(Error::invalid(
                    OP,
                    format!(
                        "cdist only supports floating-point dtypes, {what} got: {}",
                        torch_dtype_name(t.dtype())
                    ),
                ));
            }
        }
        if p.is_nan() || p < 0.0 {
            return Err(Error::invalid(
                OP,
                "cdist only supports non-negative p values",
            ));
        }
        same_dtype(OP, &[self, x2])?;
        let (rows1, rows2) = (self.shape()[self.rank() - 2], x2.shape()[x2.rank() - 2]);
        let out = no_grad(|| {
            let (a, b) = (self.detach(), x2.detach());
            if p == 2.0 && (rows1 > 25 || rows2 > 25) {
                let n1 = a.square()?.sum([-1i64], true)?;
                let n2 = b.square()?.sum([-1i64], true)?;
                let a = Tensor::cat(&[&a.mul(-2.0)?, &n1, &n1.ones_like()?], -1)?;
                let b = Tensor::cat(&[&b, &n2.ones_like()?, &n2], -1)?;
                return a.matmul(&b.transpose(-1, -2)?)?.clamp_min(0.0)?.sqrt();
            }
            let diff = a.unsqueeze(-2)?.sub(&b.unsqueeze(-3)?)?.abs()?;
            if p == 0.0 {
                diff.ne(0.0)?.to_dtype(diff.dtype())?.sum([-1i64], false)
            } else if p == 1.0 {
                diff.sum([-1i64], false)
            } else if p == 2.0 {
                diff.square()?.sum([-1i64], false)?.sqrt()
            } else if p.is_infinite() {
                diff.max([-1i64], false)
            } else {
                diff.pow(p)?.sum([-1i64], false)?.pow(1.0 / p)
            }
        })?;
        let (s1, s2) = (self.shape().to_vec(), x2.shape().to_vec());
        Ok(Tensor::record_twice(out, OP, &[self, x2], |y| {
            let (a, b, y) = (self.save(), x2.save(), y.save());
            move |g: &Tensor| {
                let (a, b, y) = (&a.value()?, &b.value()?, &y.value()?);
                let diff = a.unsqueeze(-2)?.sub(&b.unsqueeze(-3)?)?;
                let (g, y) = (g.unsqueeze(-1)?, y.unsqueeze(-1)?);
                let each = if p == 0.0 {
                    diff.zeros_like()?
                } else if p == 1.0 {
                    g.mul(&diff.sign()?)?
                } else if p.is_infinite() {
                    let at_max = diff.abs()?.eq(&y)?.to_dtype(diff.dtype())?;
                    g.mul(&diff.sign()?)?.mul(&at_max)?
                } else {
                    // diff·|diff|^(p-2) / dist^(p-1), 0 where the distance is 0
                    let scale = diff.abs()?.pow(p - 2.0)?.div(&y.pow(p - 1.0)?)?;
                    let v = g.mul(&diff)?.mul(&scale)?;
                    let zero = y.eq(0.0)?.logical_or(&diff.eq(0.0)?)?;
                    zero.where_(0.0, &v)?
                };
                let ga = crate::autograd::sum_to(&each.sum([-2i64], false)?, &s1)?;
                let gb = crate::autograd::sum_to(&each.sum([-3i64], false)?.neg()?, &s2)?;
                Ok(vec![Some(ga), Some(gb)])
            }
        }))
    }

    /// The indices of the nonzero elements as rows (`torch.argwhere`): int64
    /// `[count, rank]`, as [`nonzero`](Self::nonzero). The count depends on the
    /// values, so a GPU tensor is read back and a meta tensor is refused.
    pub fn argwhere(&self) -> Result<Tensor> {
        if self.rank() == 0 {
            let n = usize::from(self.ne(0)?.item::<bool>()?);
            return Tensor::zeros([n, 0], DType::I64, &self.device());
        }
        self.nonzero()
    }

    /// How often each value occurs in this 1-D tensor of non-negative
    /// integers (`torch.bincount(self, weights, minlength)`): `[max + 1]`
    /// counts, at least `minlength`. With `weights` (one per element) each
    /// occurrence adds its weight instead: float32 weights give float32,
    /// others float64, as PyTorch's. The length depends on the values, so a
    /// GPU tensor is read back and a meta tensor is refused. Not
    /// differentiable: a backward pass to the weights is refused, as PyTorch's.
    pub fn bincount(&self, weights: Option<&Tensor>, minlength: i64) -> Result<Tensor> {
        const OP: &str = "bincount";
        if self.dtype().is_float() || self.dtype() == DType::Bool {
            return Err(crate::tensor::elementwise::not_implemented_for(
                OP,
                "bincount_cpu",
                self.dtype(),
            ));
        }
        if minlength < 0 {
            return Err(Error::invalid(OP, "minlength should be >= 0"));
        }
        let refuse = || {
            Error::invalid(
                OP,
                "bincount only supports 1-d non-negative integral inputs.",
            )
        };
        if self.rank() != 1 {
            return Err(refuse());
        }
        if let Some(w) = weights {
            if w.rank() != 1 || w.shape()[0] != self.shape()[0] {
                return Err(Error::invalid(
                    OP,
                    "weights should be 1-d and have the same length as input",
                ));
            }
        }
        let out = no_grad(|| {
            let x = self.to_dtype(DType::I64)?;
            let mut len = minlength as usize;
            if x.numel() > 0 {
                // the output's length depends on the values: one read of both
                // ends (a synchronisation, as in PyTorch)
                let (lo, hi) = x.aminmax(None, false)?;
                let ends = Tensor::stack(&[&lo, &hi], 0)?.to_vec::<i64>()?;
                if ends[0] < 0 {
                    return Err(refuse());
                }
                len = len.max(ends[1] as usize + 1);
            }
            let (dt, src) = match weights {
                None => (DType::I64, x.ones_like()?),
                Some(w) => {
                    let dt = if w.dtype() == DType::F32 {
                        DType::F32
                    } else {
                        DType::F64
                    };
                    (dt, w.to_dtype(dt)?)
                }
            };
            Tensor::zeros([len], dt, &self.device())?.scatter_add(0, &x, &src)
        })?;
        let inputs: Vec<&Tensor> = weights.into_iter().collect();
        Ok(super::more_ops::no_derivative(out, OP, &inputs))
    }

    /// A histogram of `bins` equal bins over `[min, max]` (`torch.histc`),
    /// for float tensors, in their dtype: elements outside the range and NaNs
    /// are left out, `max` itself falls in the last bin. An element's bin is
    /// `(x - min) · bins / (max - min)` truncated, computed in the tensor's
    /// precision as PyTorch's `histc` does (so elements on an edge fall as
    /// there, not always as `torch.histogram` puts them). `min == max` takes
    /// the data's range (read back from a GPU; refused on meta), widened by 1
    /// on each side where that is one value. No gradient.
    pub fn histc(&self, bins: usize, min: f64, max: f64) -> Result<Tensor> {
        const OP: &str = "histc";
        if !self.dtype().is_float() {
            return Err(crate::tensor::elementwise::not_implemented_for(
                OP,
                "histogram_cpu",
                self.dtype(),
            ));
        }
        if bins == 0 {
            return Err(Error::invalid(
                OP,
                "torch.histogram(): bins must be > 0, but got 0 for dimension 0",
            ));
        }
        if max < min {
            return Err(Error::invalid(
                OP,
                "torch.histc: max must be larger than min",
            ));
        }
        no_grad(|| {
            let x = self.flatten_all()?;
            let (mut lo, mut hi) = (min, max);
            if lo == hi && x.numel() > 0 {
                // the range from the values: one read of both ends
                let (a, b) = x.aminmax(None, false)?;
                let ends = Tensor::stack(&[&a, &b], 0)?
                    .to_dtype(DType::F64)?
                    .to_vec::<f64>()?;
                (lo, hi) = (ends[0], ends[1]);
            }
            if lo == hi {
                (lo, hi) = (lo - 1.0, hi + 1.0);
            }
            if !lo.is_finite() || !hi.is_finite() {
                return Err(Error::invalid(
                    OP,
                    format!("torch.histc: range of [{lo}, {hi}] is not finite"),
                ));
            }
            // PyTorch's bins: the range in the tensor's precision, each bin by
            // interpolation alone (as histc's kernel, unlike histogram's, does
            // not check the neighbouring edges)
            let (lo, hi, width) = if self.dtype() == DType::F64 {
                (lo, hi, hi - lo)
            } else {
                let (l, h) = (lo as f32, hi as f32);
                (f64::from(l), f64::from(h), f64::from(h - l))
            };
            let dev = self.device();
            let inside = x.ge(lo)?.logical_and(&x.le(hi)?)?;
            let at = x
                .sub(lo)?
                .mul(bins as f64)?
                .div(width)?
                .trunc()?
                .clamp(Some(0.0), Some(bins as f64 - 1.0))?;
            // what falls outside goes to one more bin, dropped after
            let at = inside.where_(&at, bins as f64)?.to_dtype(DType::I64)?;
            let counts = Tensor::zeros([bins + 1], self.dtype(), &dev)?;
            counts
                .scatter_add(0, &at, &x.ones_like()?)?
                .narrow(0, 0, bins)
        })
    }
}

/// `batch1 @ batch2` for `baddbmm`/`addbmm`, after PyTorch's checks.
fn batch_product(op: &'static str, input: &Tensor, b1: &Tensor, b2: &Tensor) -> Result<Tensor> {
    for (what, t) in [("batch1", b1), ("batch2", b2)] {
        if t.rank() != 3 {
            return Err(Error::invalid(op, format!("{what} must be a 3D tensor")));
        }
    }
    let (b, k) = (b1.shape()[0], b1.shape()[2]);
    if b2.shape()[..2] != [b, k] {
        return Err(Error::invalid(
            op,
            format!(
                "Expected size for first two dimensions of batch2 tensor to be: [{b}, {k}] but \
                 got: [{}, {}].",
                b2.shape()[0],
                b2.shape()[1]
            ),
        ));
    }
    same_dtype(op, &[input, b1, b2])?;
    b1.bmm(b2)
}

/// `beta · input + alpha · prod`, `input` broadcast to `shape` (the
/// product's); `beta` 0 leaves `input` out.
fn add_scaled(
    input: &Tensor,
    prod: &Tensor,
    shape: &[usize],
    beta: f64,
    alpha: f64,
) -> Result<Tensor> {
    let input = input.expand(shape)?;
    let prod = scaled(prod, alpha)?;
    if beta == 0.0 {
        return Ok(prod);
    }
    scaled(&input, beta)?.add(&prod)
}
