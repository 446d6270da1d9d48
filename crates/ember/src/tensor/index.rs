//! Indexing: Python-style `t.i((.., 1..3, 2))`, and the index ops (`index_select`,
//! `gather`, `scatter_add`, `one_hot`) that take int64 index tensors.

use super::{Storages, Tensor};
use crate::layout::normalize_dim;
use crate::{
    dtype::DType,
    error::{Error, Result},
};
use std::ops::{Range, RangeFrom, RangeFull, RangeInclusive, RangeTo, RangeToInclusive};

/// One item of an index expression: a position (removes the dim) or a range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Idx {
    /// `t[i]`: negative counts from the end.
    At(i64),
    /// `t[start:end:step]`.
    Range {
        start: Option<i64>,
        end: Option<i64>,
        step: usize,
    },
}

impl From<i64> for Idx {
    fn from(i: i64) -> Idx {
        Idx::At(i)
    }
}
impl From<i32> for Idx {
    fn from(i: i32) -> Idx {
        Idx::At(i as i64)
    }
}
impl From<usize> for Idx {
    fn from(i: usize) -> Idx {
        Idx::At(i as i64)
    }
}
impl From<RangeFull> for Idx {
    fn from(_: RangeFull) -> Idx {
        Idx::Range {
            start: None,
            end: None,
            step: 1,
        }
    }
}
macro_rules! idx_ranges {
    ($($t:ty),*) => {$(
        impl From<Range<$t>> for Idx {
            fn from(r: Range<$t>) -> Idx { Idx::Range { start: Some(bound(r.start)), end: Some(bound(r.end)), step: 1 } }
        }
        impl From<RangeFrom<$t>> for Idx {
            fn from(r: RangeFrom<$t>) -> Idx { Idx::Range { start: Some(bound(r.start)), end: None, step: 1 } }
        }
        impl From<RangeTo<$t>> for Idx {
            fn from(r: RangeTo<$t>) -> Idx { Idx::Range { start: None, end: Some(bound(r.end)), step: 1 } }
        }
        impl From<RangeInclusive<$t>> for Idx {
            fn from(r: RangeInclusive<$t>) -> Idx {
                Idx::Range { start: Some(bound(*r.start())), end: inclusive_end(bound(*r.end())), step: 1 }
            }
        }
        impl From<RangeToInclusive<$t>> for Idx {
            fn from(r: RangeToInclusive<$t>) -> Idx { Idx::Range { start: None, end: inclusive_end(bound(r.end)), step: 1 } }
        }
    )*};
}
idx_ranges!(i64, i32, usize);

/// The exclusive end of a range that ends at `end` inclusive: the next index,
/// or none for the last element (`-1`, whose next index, 0, would be the
/// first).
fn inclusive_end(end: i64) -> Option<i64> {
    (end != -1).then(|| end.saturating_add(1))
}

/// A range bound as an i64: one past i64's range (a usize) is as far as any
/// dimension goes, which slicing clamps to its size.
fn bound<T: TryInto<i64>>(b: T) -> i64 {
    b.try_into().unwrap_or(i64::MAX)
}

/// Anything `Tensor::i` accepts: one [`Idx`]-convertible item or a tuple of them.
pub trait IndexArg {
    fn items(self) -> Vec<Idx>;
}

impl<T: Into<Idx>> IndexArg for T {
    fn items(self) -> Vec<Idx> {
        vec![self.into()]
    }
}

macro_rules! index_tuple {
    ($($n:ident),*) => {
        impl<$($n: Into<Idx>),*> IndexArg for ($($n,)*) {
            #[allow(non_snake_case)]
            fn items(self) -> Vec<Idx> {
                let ($($n,)*) = self;
                vec![$($n.into()),*]
            }
        }
    };
}
index_tuple!(A);
index_tuple!(A, B);
index_tuple!(A, B, C);
index_tuple!(A, B, C, D);
index_tuple!(A, B, C, D, E);
index_tuple!(A, B, C, D, E, F);

impl Tensor {
    /// Python-style indexing, a view: `t.i(1)` is `t[1]`, `t.i((.., 1..3))` is
    /// `t[:, 1:3]`, `t.i((0, 2..))` is `t[0, 2:]`.
    pub fn i(&self, index: impl IndexArg) -> Result<Tensor> {
        let items = index.items();
        if items.len() > self.rank() {
            return Err(Error::invalid(
                "index",
                format!("too many indices for tensor of dimension {}", self.rank()),
            ));
        }
        let mut t = self.clone();
        let mut dim = 0i64;
        for it in items {
            match it {
                Idx::At(i) => t = t.select(dim, i)?,
                Idx::Range { start, end, step } => {
                    t = t.slice(dim, start, end, step)?;
                    dim += 1;
                }
            }
        }
        Ok(t)
    }

    /// The index tensor's values, contiguous on its device, each checked to lie in
    /// `[-size, size)` (or `[0, size)` without `negative`) and wrapped to
    /// `[0, size)`.
    pub(crate) fn index_values(
        op: &'static str,
        index: &Tensor,
        dim: usize,
        size: usize,
        negative: bool,
    ) -> Result<Tensor> {
        if index.dtype() != DType::I64 {
            return Err(Error::dtype(
                op,
                index.dtype(),
                "indices must be an int64 tensor",
            ));
        }
        if size == 0 && index.numel() > 0 && index.holds_values() {
            // every index is out of range of an empty dim: refused here, before a
            // GPU kernel could read the empty tensor, naming the first index as
            // PyTorch does (a read of one value, on this error only; not while a
            // CUDA graph is captured, where nothing may be read); a meta index
            // has no values to name, and PyTorch's meta device checks none
            if index.read().capture_id().is_some() {
                return Err(Error::invalid(
                    op,
                    format!(
                        "{} indices into dimension {dim} of size 0: every index is out of bounds",
                        index.numel()
                    ),
                ));
            }
            let mut first = index.clone();
            for d in 0..index.rank() {
                first = first.narrow(d as i64, 0, 1)?;
            }
            return Err(Error::IndexOutOfRange {
                op,
                index: first.to_vec::<i64>()?[0],
                dim,
                size: 0,
            });
        }
        index.map_storage_same(|s, l| s.indices(l, op, dim, size, negative))
    }

    /// The entries `index` (1-D int64) along `dim` (`torch.index_select`). Each
    /// index must lie in `[0, size)`: negative indices are an error, as in PyTorch.
    pub fn index_select(&self, dim: i64, index: &Tensor) -> Result<Tensor> {
        super::same_device("index_select", &[self, index])?;
        let d = normalize_dim("index_select", dim, self.rank())?;
        if index.rank() > 1 {
            return Err(Error::invalid(
                "index_select",
                "index_select(): Index is supposed to be a vector",
            ));
        }
        let size = if self.rank() == 0 { 1 } else { self.shape()[d] };
        let idx = Tensor::index_values("index_select", index, d, size, false)?;
        if self.rank() == 0 {
            // a scalar's one value, as a scalar
            if index.numel() != 1 {
                return Err(Error::invalid(
                    "index_select",
                    format!(
                        "index_select(): Index to scalar can have only 1 value, got {} value(s)",
                        index.numel()
                    ),
                ));
            }
            return self
                .reshape([1])?
                .index_select(0, &index.reshape([1])?)?
                .reshape(Vec::<usize>::new());
        }
        self.index_select_valid(d, idx)
    }

    /// [`index_select`](Self::index_select) along the normalised `dim` of a tensor
    /// of rank ≥ 1, with indices that are known to lie in `[0, size)` (built by
    /// ember itself, or checked by [`index_values`](Self::index_values)): 1-D int64
    /// on this tensor's device, whose storage holds its values alone (a view into
    /// a larger tensor is copied here when it starts at an offset or is strided;
    /// a prefix view must be copied by the caller).
    pub(crate) fn index_select_valid(&self, d: usize, idx: Tensor) -> Result<Tensor> {
        let idx = match idx.layout().offset() == 0 && idx.is_contiguous() {
            true => idx,
            false => crate::autograd::no_grad(|| idx.copy())?,
        };
        let n_idx = idx.numel();
        let mut shape = self.shape().to_vec();
        shape[d] = n_idx;
        let out = {
            let st = Storages::read(&[self, &idx]);
            st.get(0).index_select(self.layout(), d, st.get(1), n_idx)?
        };
        let out = Tensor::from_storage(out, &shape);
        Ok(Tensor::record_twice(out, "index_select", &[self], |_| {
            let (shape, dtype, device) = (self.shape().to_vec(), self.dtype(), self.device());
            let idx = idx.save();
            move |g: &Tensor| {
                if crate::autograd::creating_graph() {
                    // a walk that creates a graph: index_add, recorded
                    let z = Tensor::zeros(&shape, dtype, &device)?;
                    return Ok(vec![Some(z.index_add_valid(d, idx.value()?, g)?)]);
                }
                // add the rows back where they came from (index_add: the 1-D index
                // as it is, no index expanded to the gradient's shape)
                let g = g.contiguous()?;
                let z = Tensor::zeros(&shape, dtype, &device)?;
                {
                    let st = Storages::read(&[idx.get()?, &g]);
                    z.write()
                        .index_add(&shape, d, st.get(0), (st.get(1), g.layout()))?;
                }
                Ok(vec![Some(z)])
            }
        }))
    }

    /// `out[i][j] = self[index[i][j]][j]` for `dim = 0` and likewise for other dims
    /// (`torch.gather`); `index` has this tensor's rank and no larger sizes off `dim`
    /// (a 0-d tensor or index counts as 1-d of one element, as in PyTorch: a 0-d
    /// index picks one element of a 1-d tensor into a 0-d output). Indices must
    /// lie in `[0, size)` (negative ones are an error, as in PyTorch).
    pub fn gather(&self, dim: i64, index: &Tensor) -> Result<Tensor> {
        super::same_device("gather", &[self, index])?;
        let d = normalize_dim("gather", dim, self.rank())?;
        if index.numel() == 0 && index.dtype() == DType::I64 {
            // PyTorch checks no shapes for an empty index: an empty output of its
            // shape (still a function of this tensor, for autograd)
            return self.flatten_all()?.narrow(0, 0, 0)?.reshape(index.shape());
        }
        self.check_index_shape("gather", d, index)?;
        if self.rank() == 0 || index.rank() == 0 {
            // a 0-d tensor or index counts as 1-d of one element (PyTorch's
            // rule): the output has the index's shape
            return as_1d(self)?
                .gather(0, &as_1d(index)?)?
                .reshape(index.shape());
        }
        let size = self.shape().get(d).copied().unwrap_or(1);
        let idx = Tensor::index_values("gather", index, d, size, false)?;
        self.gather_valid(d, idx)
    }

    /// [`gather`](Self::gather) along the normalised `dim` with indices already
    /// validated and wrapped by [`index_values`](Self::index_values) (contiguous
    /// int64 of a checked shape).
    pub(crate) fn gather_valid(&self, d: usize, idx: Tensor) -> Result<Tensor> {
        let out = {
            let st = Storages::read(&[self, &idx]);
            st.get(0).gather(self.layout(), d, st.get(1), idx.shape())?
        };
        let out = Tensor::from_storage(out, idx.shape());
        Ok(Tensor::record_twice(out, "gather", &[self], |_| {
            let (shape, dtype, device) = (self.shape().to_vec(), self.dtype(), self.device());
            let idx = idx.save();
            move |g: &Tensor| {
                let z = Tensor::zeros(&shape, dtype, &device)?;
                Ok(vec![Some(z.scatter_add_valid(d, idx.value()?, g)?)])
            }
        }))
    }

    /// PyTorch's shape rule of gather and scatter: `index` has this tensor's
    /// number of dimensions, a 0-d tensor counting as 1-d of one element on
    /// either side, and sizes no larger off `d`.
    fn check_index_shape(&self, op: &'static str, d: usize, index: &Tensor) -> Result<()> {
        let (is, ss) = (shape_1d(index), shape_1d(self));
        if is.len() != ss.len()
            || is
                .iter()
                .zip(&ss)
                .enumerate()
                .any(|(i, (&a, &b))| i != d && a > b)
        {
            return Err(Error::shape(
                op,
                self.shape(),
                index.shape(),
                format!("index must have the same number of dimensions as input and no larger size off dimension {d}"),
            ));
        }
        Ok(())
    }

    /// A copy of this tensor with `src` values added at `index` along `dim`
    /// (`torch.scatter_add`): `out[index[i][j]][j] += src[i][j]` for `dim = 0`.
    /// `index` has this tensor's rank and `src`'s, and is no larger than `src`
    /// (a 0-d tensor, index or source counts as 1-d of one element, as in
    /// PyTorch). Indices must lie in `[0, size)` (negative ones are an error, as
    /// in PyTorch).
    pub fn scatter_add(&self, dim: i64, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        super::same_device("scatter_add", &[self, index, src])?;
        let d = normalize_dim("scatter_add", dim, self.rank())?;
        if src.dtype() != self.dtype() {
            return Err(Error::DTypeMismatch {
                op: "scatter_add",
                lhs: self.dtype(),
                rhs: src.dtype(),
            });
        }
        if index.numel() == 0 && index.dtype() == DType::I64 {
            // PyTorch checks no shapes for an empty index: a copy
            return self.copy();
        }
        self.check_index_shape("scatter_add", d, index)?;
        let (is, ss) = (shape_1d(index), shape_1d(src));
        if is.len() != ss.len() || is.iter().zip(&ss).any(|(a, b)| a > b) {
            return Err(Error::shape(
                "scatter_add",
                index.shape(),
                src.shape(),
                "src must be at least as large as index in every dimension",
            ));
        }
        if [self, index, src].iter().any(|t| t.rank() == 0) {
            // a 0-d tensor, index or source counts as 1-d of one element
            // (PyTorch's rule): the output has this tensor's shape
            return as_1d(self)?
                .scatter_add(0, &as_1d(index)?, &as_1d(src)?)?
                .reshape(self.shape());
        }
        let size = self.shape().get(d).copied().unwrap_or(1);
        let idx = Tensor::index_values("scatter_add", index, d, size, false)?;
        self.scatter_add_valid(d, idx, src)
    }

    /// [`scatter_add`](Self::scatter_add) along the normalised `dim` with indices
    /// already validated (contiguous int64 of a checked shape, no larger than
    /// `src`): no check, so no copy of the indices to the host on CUDA.
    pub(crate) fn scatter_add_valid(&self, d: usize, idx: Tensor, src: &Tensor) -> Result<Tensor> {
        let index = &idx;
        let out = crate::autograd::no_grad(|| self.copy())?;
        {
            let st = Storages::read(&[&idx, src]);
            out.write().scatter_add(
                self.shape(),
                d,
                st.get(0),
                index.shape(),
                (st.get(1), src.layout()),
            )?;
        }
        Ok(Tensor::record_twice(
            out,
            "scatter_add",
            &[self, src],
            |_| {
                let src_shape = src.shape().to_vec();
                let idx = idx.save();
                move |g: &Tensor| {
                    // src positions outside the index's extent received nothing
                    // (the indices were validated by the forward pass)
                    let picked = g.gather_valid(d, idx.value()?)?;
                    let gs = if picked.shape() == src_shape.as_slice() {
                        picked
                    } else {
                        let z = Tensor::zeros(&src_shape, g.dtype(), &g.device())?;
                        let mut region = z.clone();
                        for (dim, &n) in picked.shape().iter().enumerate() {
                            region = region.narrow(dim as i64, 0, n)?;
                        }
                        region.copy_(&picked)?;
                        z
                    };
                    Ok(vec![Some(g.clone()), Some(gs)])
                }
            },
        ))
    }

    /// A copy of this tensor with `alpha * source` added at `index` along `dim`
    /// (`torch.index_add`): `out[.., index[j], ..] += alpha * source[.., j, ..]`;
    /// repeated indices add up. `index` is a 1-D (or 0-d) int64 tensor of values in
    /// `[0, size)`, `source` has this tensor's dtype and shape except along `dim`,
    /// where it has one entry per index. An integer tensor takes `alpha`
    /// truncated to an integer, as PyTorch's. Gradients: this tensor gets the
    /// output's gradient, `source` the gradient's entries at `index` times
    /// `alpha`.
    ///
    /// ```
    /// # use ember::{DType, Device, Tensor};
    /// let dev = Device::Cpu;
    /// let x = Tensor::zeros([3, 2], DType::F32, &dev)?;
    /// let index = Tensor::from_vec(vec![0i64, 2, 0], [3], &dev)?;
    /// let source = Tensor::ones([3, 2], DType::F32, &dev)?;
    /// let y = x.index_add(0, &index, &source, 2.0)?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![4.0, 4.0, 0.0, 0.0, 2.0, 2.0]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn index_add(
        &self,
        dim: i64,
        index: &Tensor,
        source: &Tensor,
        alpha: impl Into<crate::tensor::Scalar>,
    ) -> Result<Tensor> {
        const OP: &str = "index_add";
        super::same_device(OP, &[self, index, source])?;
        let d = normalize_dim(OP, dim, self.rank().max(1))?;
        if index.rank() > 1 {
            return Err(Error::invalid(
                OP,
                format!(
                    "index_add_(): Index is supposed to be a vector, but got dim: {} with size: {:?}",
                    index.rank(),
                    index.shape()
                ),
            ));
        }
        if index.dtype() != DType::I64 {
            return Err(Error::dtype(
                OP,
                index.dtype(),
                format!(
                    "index_add_(): Expected dtype int32/int64 for index but got: {}",
                    super::elementwise::torch_dtype_name(index.dtype())
                ),
            ));
        }
        if source.dtype() != self.dtype() {
            return Err(Error::DTypeMismatch {
                op: OP,
                lhs: self.dtype(),
                rhs: source.dtype(),
            });
        }
        if d != 0 && d >= source.rank() {
            return Err(Error::invalid(
                OP,
                format!(
                    "index_add_(): Indexing dim {d} is out of bounds of the source tensor with dim {}",
                    source.rank()
                ),
            ));
        }
        let n = index.numel();
        let src_n = if source.rank() == 0 {
            1
        } else {
            source.shape()[d]
        };
        if n != src_n {
            return Err(Error::shape(
                OP,
                index.shape(),
                source.shape(),
                format!("index_add_(): Number of indices ({n}) should be equal to source.size(dim): ({src_n}), for dim: {d}"),
            ));
        }
        let (mut xs, mut ss) = (self.shape().to_vec(), source.shape().to_vec());
        if self.rank() != 0 && source.rank() != 0 {
            xs.remove(d);
            ss.remove(d);
        }
        if xs != ss {
            return Err(Error::shape(
                OP,
                self.shape(),
                source.shape(),
                format!("source tensor shape must match self tensor shape, excluding the specified dimension. Got self.shape = {:?} source.shape = {:?}", self.shape(), source.shape()),
            ));
        }
        let size = if self.rank() == 0 { 1 } else { self.shape()[d] };
        let idx = Tensor::index_values(OP, index, d, size, false)?.reshape([n])?;
        let alpha = match alpha.into() {
            a if self.dtype().is_float() => a,
            crate::tensor::Scalar::Float(f) => crate::tensor::Scalar::Int(f as i64),
            a => a,
        };
        let one = matches!(
            alpha,
            crate::tensor::Scalar::Int(1) | crate::tensor::Scalar::Bool(true)
        ) || matches!(alpha, crate::tensor::Scalar::Float(f) if f == 1.0);
        let src = if one {
            source.clone()
        } else {
            source.mul(alpha)?.to_dtype(self.dtype())?
        };
        if self.rank() == 0 {
            return self
                .reshape([1])?
                .index_add_valid(0, idx, &src.reshape([1])?)?
                .reshape(self.shape());
        }
        self.index_add_valid(d, idx, &src)
    }

    /// [`index_add`](Self::index_add) in place (`Tensor.index_add_`). Recorded by
    /// autograd as the other in-place ops are: a leaf that requires a gradient is
    /// refused, as in PyTorch.
    pub fn index_add_(
        &self,
        dim: i64,
        index: &Tensor,
        source: &Tensor,
        alpha: impl Into<crate::tensor::Scalar>,
    ) -> Result<()> {
        let recorded = self.check_inplace_target("index_add_", source.requires_grad())?;
        self.check_writable("index_add_")?;
        let out = self.index_add(dim, index, source, alpha)?;
        if recorded {
            self.write_history(&out)
        } else {
            crate::autograd::no_grad(|| self.copy_(&out))
        }
    }

    /// `index_add` along the normalised `dim` of a tensor of rank ≥ 1 with the
    /// 1-D indices `idx` already validated and `src` checked and scaled.
    fn index_add_valid(&self, d: usize, idx: Tensor, src: &Tensor) -> Result<Tensor> {
        let src = src.contiguous()?;
        let out = crate::autograd::no_grad(|| self.copy())?;
        {
            let st = Storages::read(&[&idx, &src]);
            out.write()
                .index_add(self.shape(), d, st.get(0), (st.get(1), src.layout()))?;
        }
        Ok(Tensor::record_twice(
            out,
            "index_add",
            &[self, &src],
            |_| {
                let idx = idx.save();
                move |g: &Tensor| {
                    let gs = g.index_select_valid(d, idx.value()?)?;
                    Ok(vec![Some(g.clone()), Some(gs)])
                }
            },
        ))
    }

    /// One-hot encoding of int64 class indices: a new last dim of `num_classes`
    /// (`F.one_hot`), int64.
    pub fn one_hot(&self, num_classes: usize) -> Result<Tensor> {
        if self.dtype() != DType::I64 {
            return Err(Error::dtype(
                "one_hot",
                self.dtype(),
                "one_hot is only applicable to index (int64) tensors",
            ));
        }
        let mut shape = self.shape().to_vec();
        shape.push(num_classes);
        crate::layout::checked_numel("one_hot", &shape)?;
        let idx = Tensor::index_values("one_hot", self, self.rank(), num_classes, false)?;
        // each index against 0..num_classes, broadcast along a new last dim
        let classes = Tensor::arange(0i64, num_classes as i64, &self.device())?;
        idx.unsqueeze(-1)?.eq(&classes)?.to_dtype(DType::I64)
    }

    /// [`one_hot`](Self::one_hot) with the number of classes inferred as the
    /// largest index plus one (`F.one_hot(t)`, `num_classes=-1`). This reads the
    /// indices on the host (one wait on a GPU); an empty tensor, whose number of
    /// classes cannot be inferred, a negative index, and a meta tensor (no
    /// values) are errors.
    ///
    /// ```
    /// # use ember::{Device, Tensor};
    /// let t = Tensor::from_vec(vec![1i64, 3, 0], [3], &Device::Cpu)?;
    /// let y = t.one_hot_inferred()?;
    /// assert_eq!(y.shape(), &[3, 4]);
    /// assert_eq!(y.to_vec::<i64>()?[..4], [0, 1, 0, 0]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn one_hot_inferred(&self) -> Result<Tensor> {
        const OP: &str = "one_hot";
        if self.dtype() != DType::I64 {
            return Err(Error::dtype(
                OP,
                self.dtype(),
                "one_hot is only applicable to index (int64) tensors",
            ));
        }
        if self.numel() == 0 {
            return Err(Error::invalid(
                OP,
                "Can not infer total number of classes from empty tensor.",
            ));
        }
        let (lo, hi) = crate::autograd::no_grad(|| -> Result<(i64, i64)> {
            Ok((
                self.min_all()?.item::<i64>()?,
                self.max_all()?.item::<i64>()?,
            ))
        })?;
        if lo < 0 {
            // PyTorch: "Class values must be non-negative."
            return Err(Error::IndexOutOfRange {
                op: OP,
                index: lo,
                dim: self.rank(),
                size: (hi.max(0) as usize).saturating_add(1),
            });
        }
        // (hi + 1 classes: i64::MAX has no room for one more)
        let classes = (hi as usize).checked_add(1).ok_or_else(|| {
            Error::invalid(
                OP,
                format!("a class value of {hi} leaves no room for a count of classes"),
            )
        })?;
        self.one_hot(classes)
    }
}

/// A 0-d tensor's shape as 1-d of one element (PyTorch's `ensure_nonempty`);
/// any other shape as it is.
fn shape_1d(t: &Tensor) -> Vec<usize> {
    match t.rank() {
        0 => vec![1],
        _ => t.shape().to_vec(),
    }
}

/// A 0-d tensor viewed as 1-d of one element; any other as it is.
fn as_1d(t: &Tensor) -> Result<Tensor> {
    match t.rank() {
        0 => t.reshape([1]),
        _ => Ok(t.clone()),
    }
}
