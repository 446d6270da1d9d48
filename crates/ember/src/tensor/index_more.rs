//! Index ops built from `gather`, `scatter_add`, `argsort` and `where`:
//! `take_along_dim`, `take`, `index_fill`, `index_copy`, `scatter` (values
//! replaced) and `scatter_reduce`. No new kernel and no backward rule of their
//! own: every dtype and device the parts take, with gradients through them.
//!
//! Where several indices name one position, PyTorch leaves the value written
//! by `scatter` and `index_copy` unspecified; ember writes the one from the
//! last of them in the index's row-major order, found with a stable sort of
//! the positions (no host round trip). Gradients flow to that winner only.
//!
//! ```
//! use ember::{Device, Tensor};
//! let dev = Device::Cpu;
//! let x = Tensor::zeros([4], ember::DType::F32, &dev)?;
//! let i = Tensor::new([1i64, 3, 1], &dev)?;
//! let s = Tensor::new([5f32, 6., 7.], &dev)?;
//! assert_eq!(x.scatter(0, &i, &s)?.to_vec::<f32>()?, [0., 7., 0., 6.]);
//! # Ok::<(), ember::Error>(())
//! ```

use super::{Operand, Scalar, Tensor};
use crate::layout::{broadcast_shapes, contiguous_strides, normalize_dim};
use crate::{
    dtype::DType,
    error::{Error, Result},
};

/// How [`Tensor::scatter_reduce`] combines the values that meet at one
/// position (PyTorch's `reduce` strings but `"prod"`, which needs a kernel
/// ember does not have).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ScatterReduce {
    /// `"sum"`.
    Sum,
    /// `"mean"` (integers divide with floor, as PyTorch's).
    Mean,
    /// `"amax"`: NaN wins.
    Amax,
    /// `"amin"`: NaN wins.
    Amin,
}

impl std::str::FromStr for ScatterReduce {
    type Err = Error;
    fn from_str(s: &str) -> Result<ScatterReduce> {
        Ok(match s {
            "sum" => ScatterReduce::Sum,
            "mean" => ScatterReduce::Mean,
            "amax" => ScatterReduce::Amax,
            "amin" => ScatterReduce::Amin,
            "prod" => {
                return Err(Error::invalid(
                    "scatter_reduce",
                    "reduce=\"prod\" is not supported by ember's scatter_reduce (it needs a product kernel)",
                ))
            }
            other => {
                return Err(Error::invalid(
                    "scatter_reduce",
                    format!("reduce argument must be either sum, prod, mean, amax or amin, got {other}"),
                ))
            }
        })
    }
}

/// The row-major position in a tensor of `shape` that each element of the
/// validated `idx` (same rank) writes along `d`, as a flat int64 tensor.
fn linear_targets(shape: &[usize], d: usize, idx: &Tensor) -> Result<Tensor> {
    let strides = contiguous_strides(shape);
    let dev = idx.device();
    let r = idx.rank();
    let mut t = idx.mul(strides[d] as i64)?;
    for k in (0..r).filter(|&k| k != d) {
        let n = idx.shape()[k];
        let mut view = vec![1usize; r];
        view[k] = n;
        let pos = Tensor::affine_iota(n, 0, strides[k] as i64, &dev)?.reshape(view)?;
        t = t.add(&pos)?;
    }
    t.reshape([-1i64])?.contiguous()
}

/// For flat int64 `t`: true where no later element has the same value.
fn last_of_each(t: &Tensor) -> Result<Tensor> {
    let n = t.numel();
    let dev = t.device();
    if n == 0 {
        return Tensor::zeros([0], DType::Bool, &dev);
    }
    let order = t.argsort(0, false)?;
    let sorted = t.index_select_valid(0, order.clone())?;
    let differs = sorted
        .narrow(0, 0, n - 1)?
        .ne(&sorted.narrow(0, 1, n - 1)?)?;
    let last = Tensor::cat(&[&differs, &Tensor::ones([1], DType::Bool, &dev)?], 0)?;
    Tensor::zeros([n], DType::I64, &dev)?
        .scatter_add_valid(0, order, &last.to_dtype(DType::I64)?)?
        .ne(0i64)
}

/// `x` narrowed to `shape` from the start of each dim.
fn leading(x: &Tensor, shape: &[usize]) -> Result<Tensor> {
    let mut x = x.clone();
    for (k, &n) in shape.iter().enumerate() {
        if x.shape()[k] != n {
            x = x.narrow(k as i64, 0, n)?;
        }
    }
    Ok(x)
}

impl Tensor {
    /// `x` (flat, this tensor's dtype) written into a copy of this tensor at
    /// the flat positions `t` where `winner` holds: the others leave no trace.
    fn place(&self, t: &Tensor, x: &Tensor, winner: &Tensor) -> Result<Tensor> {
        let (n, dev, dt) = (self.numel(), self.device(), self.dtype());
        let zero = Tensor::zeros((), dt, &dev)?;
        let kept = winner.where_(x, &zero)?;
        let placed = Tensor::zeros([n], dt, &dev)?.scatter_add_valid(0, t.clone(), &kept)?;
        let ones = Tensor::ones([t.numel()], DType::I64, &dev)?;
        let hit = Tensor::zeros([n], DType::I64, &dev)?
            .scatter_add_valid(0, t.clone(), &ones)?
            .ne(0i64)?;
        hit.where_(&placed, &self.reshape([-1i64])?)?
            .reshape(self.shape())
    }

    /// The checks and index validation shared by `scatter` and
    /// `scatter_reduce`: the normalised dim and the validated index, or `None`
    /// for an empty index (nothing written).
    fn scatter_index(
        &self,
        op: &'static str,
        dim: i64,
        index: &Tensor,
        src: Option<&Tensor>,
    ) -> Result<Option<(usize, Tensor)>> {
        let mut ts = vec![self, index];
        ts.extend(src);
        super::same_device(op, &ts)?;
        let d = normalize_dim(op, dim, self.rank())?;
        if index.dtype() != DType::I64 {
            return Err(Error::dtype(
                op,
                index.dtype(),
                format!("{op}(): Expected dtype int32/int64 for index"),
            ));
        }
        if let Some(s) = src {
            if s.dtype() != self.dtype() {
                return Err(Error::invalid(
                    op,
                    format!(
                        "{op}(): Expected self.dtype to be equal to src.dtype (got {} and {})",
                        super::torch_dtype_name(self.dtype()),
                        super::torch_dtype_name(s.dtype())
                    ),
                ));
            }
        }
        if index.numel() == 0 {
            return Ok(None);
        }
        let one = |t: &Tensor| -> Vec<usize> {
            match t.rank() {
                0 => vec![1],
                _ => t.shape().to_vec(),
            }
        };
        let (is, ss) = (one(index), one(self));
        if is.len() != ss.len() {
            return Err(Error::invalid(
                op,
                "Index tensor must have the same number of dimensions as self tensor",
            ));
        }
        let src_shape = src.map(one);
        let too_big = is
            .iter()
            .enumerate()
            .any(|(k, &n)| (k != d && n > ss[k]) || src_shape.as_ref().is_some_and(|s| n > s[k]));
        if too_big || src_shape.as_ref().is_some_and(|s| s.len() != is.len()) {
            return Err(Error::shape(
                op,
                index.shape(),
                self.shape(),
                format!(
                    "Expected index {is:?} to be no larger than self {ss:?} apart from dimension {d}{}",
                    src_shape.map_or(String::new(), |s| format!(" and to be no larger size than src {s:?}"))
                ),
            ));
        }
        let size = ss[d];
        let idx = Tensor::index_values(op, &index.reshape(&is[..])?, d, size, false)?;
        Ok(Some((d, idx)))
    }

    /// A copy of this tensor with `src`'s values written at `index` along
    /// `dim` (`torch.scatter(input, dim, index, src)`): for `dim = 0`,
    /// `out[index[i][j]][j] = src[i][j]`. `index` has this tensor's number of
    /// dims, is no larger than `src` and, off `dim`, than this tensor; its
    /// values lie in `[0, size)`. Where indices repeat, the last in row-major
    /// order wins (PyTorch leaves it unspecified). Gradients: this tensor's
    /// where nothing was written, `src`'s at the written elements.
    pub fn scatter(&self, dim: i64, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        let Some((d, idx)) = self.scatter_index("scatter", dim, index, Some(src))? else {
            return self.copy();
        };
        let t = linear_targets(&self.shape_1d(), d, &idx)?;
        let x = leading(&src.reshape(src.shape_1d())?, idx.shape())?.reshape([-1i64])?;
        self.place(&t, &x, &last_of_each(&t)?)
    }

    /// `value` written at `index` along `dim` (`torch.scatter(input, dim,
    /// index, value)`): [`scatter`](Self::scatter) with a number.
    pub fn scatter_value(
        &self,
        dim: i64,
        index: &Tensor,
        value: impl Into<Scalar>,
    ) -> Result<Tensor> {
        let Some((d, idx)) = self.scatter_index("scatter", dim, index, None)? else {
            return self.copy();
        };
        let t = linear_targets(&self.shape_1d(), d, &idx)?;
        let x = Tensor::full([t.numel()], value, self.dtype(), &self.device())?;
        self.place(&t, &x, &last_of_each(&t)?)
    }

    /// `src`'s values combined into a copy of this tensor at `index` along
    /// `dim` (`torch.scatter_reduce`): by `"sum"`, `"mean"`, `"amax"` or
    /// `"amin"`, with this tensor's own value taking part where
    /// `include_self` (positions no index names keep it either way).
    /// `"prod"` is refused: it needs a product kernel. Gradients: as
    /// PyTorch's for sum and mean; for amax and amin the winning element
    /// takes the whole gradient (PyTorch splits it evenly among ties).
    ///
    /// ```
    /// # use ember::{Device, Tensor};
    /// let dev = Device::Cpu;
    /// let x = Tensor::new([1f32, 2., 3.], &dev)?;
    /// let i = Tensor::new([0i64, 0, 2, 2], &dev)?;
    /// let s = Tensor::new([5f32, -1., 4., 8.], &dev)?;
    /// assert_eq!(x.scatter_reduce(0, &i, &s, "amax", true)?.to_vec::<f32>()?, [5., 2., 8.]);
    /// assert_eq!(x.scatter_reduce(0, &i, &s, "mean", false)?.to_vec::<f32>()?, [2., 2., 6.]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn scatter_reduce(
        &self,
        dim: i64,
        index: &Tensor,
        src: &Tensor,
        reduce: &str,
        include_self: bool,
    ) -> Result<Tensor> {
        const OP: &str = "scatter_reduce";
        let how: ScatterReduce = reduce.parse()?;
        let Some((d, idx)) = self.scatter_index(OP, dim, index, Some(src))? else {
            return self.copy();
        };
        let shape = self.shape_1d();
        let (dev, dt) = (self.device(), self.dtype());
        let t = linear_targets(&shape, d, &idx)?;
        let x = leading(&src.reshape(src.shape_1d())?, idx.shape())?.reshape([-1i64])?;
        let flat = self.reshape([-1i64])?;
        let n = flat.numel();
        let ones = Tensor::ones([t.numel()], DType::I64, &dev)?;
        let count = Tensor::zeros([n], DType::I64, &dev)?.scatter_add_valid(0, t.clone(), &ones)?;
        let hit = count.ne(0i64)?;
        let out = match how {
            ScatterReduce::Sum | ScatterReduce::Mean => {
                let base = match include_self {
                    true => flat.clone(),
                    false => hit.where_(&Tensor::zeros((), dt, &dev)?, &flat)?,
                };
                let sum = base.scatter_add_valid(0, t, &x)?;
                if how == ScatterReduce::Sum {
                    sum
                } else {
                    let c = count.add(i64::from(include_self))?.clamp_min(1i64)?;
                    let mean = match dt.is_float() {
                        true => sum.div(&c.to_dtype(dt)?)?,
                        false => sum.floor_divide(&c)?.to_dtype(dt)?,
                    };
                    hit.where_(&mean, &flat)?
                }
            }
            ScatterReduce::Amax | ScatterReduce::Amin => {
                // every candidate with its target: the sources, and each
                // position's own value where it takes part
                let (t, x) = match include_self {
                    true => (
                        Tensor::cat(&[&t, &Tensor::affine_iota(n, 0, 1, &dev)?], 0)?,
                        Tensor::cat(&[&x, &flat], 0)?,
                    ),
                    false => (t, x),
                };
                // sorted by value (NaN last, the largest), then stably by
                // target: each target's last candidate wins
                let key = match dt.is_float() {
                    true => x.detach(),
                    false => x.detach().to_dtype(DType::F64)?,
                };
                let key = match how {
                    ScatterReduce::Amin => key.neg()?,
                    _ => key,
                };
                let by_value = key.argsort(0, false)?;
                let t1 = t.index_select_valid(0, by_value.clone())?;
                let by_target = t1.argsort(0, false)?;
                let order = by_value.index_select_valid(0, by_target)?;
                let ts = t.index_select_valid(0, order.clone())?;
                let last_sorted = last_of_each(&ts)?;
                let winner = Tensor::zeros([t.numel()], DType::I64, &dev)?
                    .scatter_add_valid(0, order, &last_sorted.to_dtype(DType::I64)?)?
                    .ne(0i64)?;
                return self.place(&t, &x, &winner);
            }
        };
        out.reshape(self.shape())
    }

    /// The elements of `dim` at `index` (1-D or 0-d int64; negative counts
    /// from the end) set to `value` (`Tensor.index_fill`): a number or a 0-d
    /// tensor (whose gradient is the sum of the filled elements' gradients).
    pub fn index_fill<'a>(
        &self,
        dim: i64,
        index: &Tensor,
        value: impl Into<Operand<'a>>,
    ) -> Result<Tensor> {
        const OP: &str = "index_fill";
        let value = value.into();
        super::same_device(OP, &[self, index])?;
        if let Operand::Tensor(v) = value {
            if v.rank() != 0 {
                return Err(Error::invalid(
                    OP,
                    format!(
                        "index_fill_ only supports a 0-dimensional value tensor, but got tensor with {} dimension(s).",
                        v.rank()
                    ),
                ));
            }
        }
        let d = normalize_dim(OP, dim, self.rank())?;
        if index.rank() > 1 {
            return Err(Error::invalid(OP, "Index has to be a vector/scalar"));
        }
        if index.dtype() != DType::I64 {
            return Err(Error::dtype(
                OP,
                index.dtype(),
                "index_fill_(): Expected dtype int64 for index.",
            ));
        }
        let size = if self.rank() == 0 { 1 } else { self.shape()[d] };
        let idx = Tensor::index_values(OP, index, d, size, true)?.reshape([-1i64])?;
        let dev = self.device();
        let ones = Tensor::ones([idx.numel()], DType::I64, &dev)?;
        let mask = Tensor::zeros([size], DType::I64, &dev)?
            .scatter_add_valid(0, idx.contiguous()?, &ones)?
            .ne(0i64)?;
        let mut view = vec![1usize; self.rank()];
        if self.rank() > 0 {
            view[d] = size;
        }
        self.masked_fill(&mask.reshape(view)?, value)
    }

    /// `source`'s slices along `dim` copied into this tensor's at `index`
    /// (`Tensor.index_copy`): `out[.., index[j], ..] = source[.., j, ..]`;
    /// `index` is 1-D (or 0-d) int64 in `[0, size)`, `source` has this
    /// tensor's dtype and shape but along `dim`, where it has one slice per
    /// index. A repeated index takes the last of its slices (PyTorch leaves it
    /// unspecified).
    pub fn index_copy(&self, dim: i64, index: &Tensor, source: &Tensor) -> Result<Tensor> {
        const OP: &str = "index_copy";
        super::same_device(OP, &[self, index, source])?;
        let d = normalize_dim(OP, dim, self.rank())?;
        if index.rank() > 1 {
            return Err(Error::invalid(
                OP,
                format!(
                    "index_copy_(): Index should have dimension 1 or 0 (got {})",
                    index.rank()
                ),
            ));
        }
        if index.dtype() != DType::I64 {
            return Err(Error::dtype(
                OP,
                index.dtype(),
                "index_copy_(): Expected a long tensor for index",
            ));
        }
        if source.dtype() != self.dtype() {
            return Err(Error::invalid(
                OP,
                format!(
                    "index_copy_(): self and source expected to have the same dtype, but got (self) {} and (source) {}",
                    super::torch_dtype_name(self.dtype()),
                    super::torch_dtype_name(source.dtype())
                ),
            ));
        }
        let (xs, ss) = (self.shape_1d(), source.shape_1d());
        let k = index.numel();
        if ss.len() != xs.len() || ss[d] != k {
            return Err(Error::invalid(
                OP,
                format!(
                    "index_copy_(): Number of indices ({k}) should be equal to source.size(dim) ({})",
                    ss.get(d).copied().unwrap_or(0)
                ),
            ));
        }
        if xs
            .iter()
            .zip(&ss)
            .enumerate()
            .any(|(i, (a, b))| i != d && a != b)
        {
            return Err(Error::invalid(
                OP,
                format!(
                    "index_copy_(): Source/destination tensor must have same slice shapes. Destination slice shape: {:?} at dimension {d} and source slice shape: {:?} at dimension {d}.",
                    without(&xs, d),
                    without(&ss, d)
                ),
            ));
        }
        let mut view = vec![1usize; ss.len()];
        view[d] = k;
        let full = index.reshape(view)?.expand(&ss[..])?;
        self.reshape(&xs[..])?
            .scatter(d as i64, &full, &source.reshape(&ss[..])?)?
            .reshape(self.shape())
    }

    /// The elements of the flattened tensor at `index` (any shape, int64;
    /// negative counts from the end), in `index`'s shape (`torch.take`).
    pub fn take(&self, index: &Tensor) -> Result<Tensor> {
        const OP: &str = "take";
        super::same_device(OP, &[self, index])?;
        let idx = Tensor::index_values(OP, index, 0, self.numel(), true)?
            .reshape([-1i64])?
            .contiguous()?;
        self.reshape([-1i64])?
            .gather_valid(0, idx)?
            .reshape(index.shape())
    }

    /// `torch.take_along_dim`: with a dim, [`gather`](Self::gather) after this
    /// tensor and `indices` are broadcast against each other off `dim`; without,
    /// the flattened tensor gathered at the flattened indices.
    pub fn take_along_dim(&self, indices: &Tensor, dim: Option<i64>) -> Result<Tensor> {
        const OP: &str = "take_along_dim";
        if indices.dtype() != DType::I64 {
            return Err(Error::dtype(
                OP,
                indices.dtype(),
                format!(
                    "torch.take_along_dim(): dtype of indices should be Long but got {}",
                    super::torch_dtype_name(indices.dtype())
                ),
            ));
        }
        let Some(dim) = dim else {
            return self.reshape([-1i64])?.gather(0, &indices.reshape([-1i64])?);
        };
        if self.rank() != indices.rank() {
            return Err(Error::invalid(
                OP,
                format!(
                    "torch.take_along_dim(): input and indices should have the same number of dimensions, but got {} dimensions for input, and {} dimensions for indices",
                    self.rank(),
                    indices.rank()
                ),
            ));
        }
        let d = normalize_dim(OP, dim, self.rank())?;
        if self.rank() == 0 {
            return self.gather(0, indices);
        }
        let mut s = self.shape().to_vec();
        s[d] = indices.shape()[d];
        let ib = indices.expand(&broadcast_shapes(OP, &s, indices.shape())?[..])?;
        let mut s = indices.shape().to_vec();
        s[d] = self.shape()[d];
        let xb = self.expand(&broadcast_shapes(OP, &s, self.shape())?[..])?;
        xb.gather(d as i64, &ib)
    }

    /// The shape, a 0-d tensor's as `[1]` (PyTorch's rule for index ops).
    fn shape_1d(&self) -> Vec<usize> {
        match self.rank() {
            0 => vec![1],
            _ => self.shape().to_vec(),
        }
    }
}

/// `v` without entry `d`.
fn without(v: &[usize], d: usize) -> Vec<usize> {
    let mut v = v.to_vec();
    v.remove(d);
    v
}
