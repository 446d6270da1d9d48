//! Views that share storage (reshape of contiguous data, transpose, permute, narrow,
//! slicing, expand, squeeze/unsqueeze) and the joins and splits (cat, stack, split,
//! chunk).

use super::shape::{infer_shape, IntoShape};
use super::Tensor;
use crate::backend::Storage;
use crate::layout::{checked_numel, normalize_dim, Dims, Layout};
use crate::{
    dtype::DType,
    error::{Error, Result},
};
use std::sync::Arc;

impl Tensor {
    /// The same elements with a new shape (one size may be -1): a view when the
    /// strides allow it, otherwise a copy (`torch.reshape`).
    pub fn reshape(&self, shape: impl IntoShape) -> Result<Tensor> {
        let dims = infer_shape("reshape", &shape, self.numel())?;
        match self.layout().view(&dims) {
            Some(l) => Ok(self.view_with("reshape", l, ViewGrad::Reshape)),
            None => {
                let copied = self.copy()?.with_layout_owned(Layout::contiguous(&dims));
                Ok(Tensor::record_twice(copied, "reshape", &[self], |_| {
                    let shape = self.shape().to_vec();
                    move |g: &Tensor| Ok(vec![Some(g.reshape(&shape)?)])
                }))
            }
        }
    }

    /// Like [`reshape`](Self::reshape) but never copies: an error when the strides do
    /// not allow a view (`torch.Tensor.view`).
    pub fn view(&self, shape: impl IntoShape) -> Result<Tensor> {
        let dims = infer_shape("view", &shape, self.numel())?;
        match self.layout().view(&dims) {
            Some(l) => Ok(self.view_with("view", l, ViewGrad::Reshape)),
            None => Err(Error::invalid(
                "view",
                "view size is not compatible with input tensor's size and stride (at least one dimension spans across two contiguous subspaces); use .reshape(...) instead",
            )),
        }
    }

    /// Merges dims `start..=end` into one.
    pub fn flatten(&self, start: i64, end: i64) -> Result<Tensor> {
        // a 0-d tensor takes dims -1 and 0 (PyTorch checks them first)
        let s = normalize_dim("flatten", start, self.rank())?;
        let e = normalize_dim("flatten", end, self.rank())?;
        if self.rank() == 0 {
            return self.reshape([1]);
        }
        if s > e {
            return Err(Error::invalid(
                "flatten",
                "start_dim cannot come after end_dim",
            ));
        }
        let mut shape: Dims = self.shape()[..s].into();
        shape.push(self.shape()[s..=e].iter().product());
        shape.extend_from_slice(&self.shape()[e + 1..]);
        self.reshape(&shape[..])
    }

    /// All elements as a 1-D tensor.
    pub fn flatten_all(&self) -> Result<Tensor> {
        self.flatten(0, -1)
    }

    /// Removes `dim` when its size is 1 (a no-op otherwise, as in PyTorch).
    pub fn squeeze(&self, dim: i64) -> Result<Tensor> {
        let d = normalize_dim("squeeze", dim, self.rank())?;
        if self.rank() == 0 || self.shape()[d] != 1 {
            return Ok(self.clone());
        }
        Ok(self.view_with("squeeze", self.layout().select(d, 0), ViewGrad::Reshape))
    }

    /// Removes every size-1 dim.
    pub fn squeeze_all(&self) -> Result<Tensor> {
        let mut l = self.layout().clone();
        for d in (0..self.rank()).rev() {
            if l.shape()[d] == 1 {
                l = l.select(d, 0);
            }
        }
        Ok(self.view_with("squeeze", l, ViewGrad::Reshape))
    }

    /// Inserts a size-1 dim at `dim` (which may be `rank`, or negative).
    pub fn unsqueeze(&self, dim: i64) -> Result<Tensor> {
        let d = normalize_dim("unsqueeze", dim, self.rank() + 1)?;
        Ok(self.view_with("unsqueeze", self.layout().unsqueeze(d), ViewGrad::Reshape))
    }

    /// Swaps two dims.
    pub fn transpose(&self, dim0: i64, dim1: i64) -> Result<Tensor> {
        if self.rank() == 0 {
            normalize_dim("transpose", dim0, 0)?;
            normalize_dim("transpose", dim1, 0)?;
            return Ok(self.clone());
        }
        let a = normalize_dim("transpose", dim0, self.rank())?;
        let b = normalize_dim("transpose", dim1, self.rank())?;
        Ok(self.view_with(
            "transpose",
            self.layout().transpose(a, b),
            ViewGrad::Transpose(a, b),
        ))
    }

    /// The transpose of a matrix (0-D and 1-D tensors are returned as they are).
    pub fn t(&self) -> Result<Tensor> {
        match self.rank() {
            0 | 1 => Ok(self.clone()),
            2 => self.transpose(0, 1),
            r => Err(Error::invalid(
                "t",
                format!("t() expects a tensor with <= 2 dimensions, but self is {r}D"),
            )),
        }
    }

    /// Reorders the dims: dim `i` of the result is dim `perm[i]` of this tensor.
    pub fn permute(&self, perm: impl super::shape::IntoDims) -> Result<Tensor> {
        let raw = perm.to_dim_list();
        if raw.len() != self.rank() {
            return Err(Error::invalid(
                "permute",
                format!(
                    "number of dims in permutation ({}) doesn't match the tensor's ({})",
                    raw.len(),
                    self.rank()
                ),
            ));
        }
        let mut p: Dims = Dims::new();
        for &d in raw.iter() {
            let n = normalize_dim("permute", d, self.rank())?;
            if p.contains(&n) {
                return Err(Error::invalid(
                    "permute",
                    format!("repeated dim {n} in permutation"),
                ));
            }
            p.push(n);
        }
        Ok(self.view_with(
            "permute",
            self.layout().permute(&p),
            ViewGrad::Permute(p.to_vec()),
        ))
    }

    /// `len` elements of `dim` from `start` (a negative start counts from the end).
    pub fn narrow(&self, dim: i64, start: i64, len: usize) -> Result<Tensor> {
        self.not_0d("narrow", "narrow() cannot be applied to a 0-dim tensor.")?;
        let d = normalize_dim("narrow", dim, self.rank())?;
        let n = self.shape()[d];
        let s = if start < 0 { start + n as i64 } else { start };
        if s < 0 || (s as usize).checked_add(len).is_none_or(|end| end > n) {
            return Err(Error::invalid(
                "narrow",
                format!("start ({start}) + length ({len}) exceeds dimension size ({n}) of dim {d}"),
            ));
        }
        let (s, e) = (s as usize, s as usize + len);
        Ok(self.view_with(
            "narrow",
            self.layout().slice(d, s, e, 1),
            ViewGrad::region(move |t| Ok(t.with_layout(t.layout().slice(d, s, e, 1)))),
        ))
    }

    /// Python's `t[start:end:step]` along `dim`: bounds may be negative and are
    /// clamped to the size; `step` must be positive.
    pub fn slice(
        &self,
        dim: i64,
        start: Option<i64>,
        end: Option<i64>,
        step: usize,
    ) -> Result<Tensor> {
        self.not_0d("slice", "slice() cannot be applied to a 0-dim tensor.")?;
        let d = normalize_dim("slice", dim, self.rank())?;
        if step == 0 {
            return Err(Error::invalid("slice", "slice step must be positive"));
        }
        let n = self.shape()[d] as i64;
        let fix = |v: i64| (if v < 0 { v + n } else { v }).clamp(0, n) as usize;
        let s = start.map_or(0, fix);
        let e = end.map_or(n as usize, fix);
        let e = e.max(s);
        Ok(self.view_with(
            "slice",
            self.layout().slice(d, s, e, step),
            ViewGrad::region(move |t| Ok(t.with_layout(t.layout().slice(d, s, e, step)))),
        ))
    }

    /// Index `index` along `dim`, removing that dim (`t[:, 2]`).
    pub fn select(&self, dim: i64, index: i64) -> Result<Tensor> {
        self.not_0d("select", "select() cannot be applied to a 0-dim tensor.")?;
        let d = normalize_dim("select", dim, self.rank())?;
        let n = self.shape()[d];
        let i = if index < 0 { index + n as i64 } else { index };
        if i < 0 || i as usize >= n {
            return Err(Error::IndexOutOfRange {
                op: "select",
                index,
                dim: d,
                size: n,
            });
        }
        let i = i as usize;
        Ok(self.view_with(
            "select",
            self.layout().select(d, i),
            ViewGrad::region(move |t| Ok(t.with_layout(t.layout().select(d, i)))),
        ))
    }

    /// A view with size-1 dims repeated to `shape` (`-1` keeps a size), new leading
    /// dims allowed (`torch.Tensor.expand`).
    pub fn expand(&self, shape: impl IntoShape) -> Result<Tensor> {
        let spec = shape.to_spec();
        if spec.len() < self.rank() {
            return Err(Error::invalid(
                "expand",
                format!("the number of sizes provided ({}) must be greater or equal to the number of dimensions in the tensor ({})", spec.len(), self.rank()),
            ));
        }
        let lead = spec.len() - self.rank();
        let mut dims: Dims = Dims::new();
        for (i, &s) in spec.iter().enumerate() {
            dims.push(match s {
                -1 if i >= lead => self.shape()[i - lead],
                -1 => {
                    // PyTorch's shape error: -1 cannot keep a size that is not there
                    return Err(Error::shape(
                        "expand",
                        self.shape(),
                        &spec.iter().map(|&d| d.max(0) as usize).collect::<Vec<_>>(),
                        format!("The expanded size of the tensor (-1) isn't allowed in a leading, non-existing dimension {i}"),
                    ));
                }
                s if s >= 0 => s as usize,
                _ => {
                    return Err(Error::invalid(
                        "expand",
                        format!("invalid size {s} for dim {i}"),
                    ))
                }
            });
        }
        for (i, (&n, &m)) in dims[lead..].iter().zip(self.shape()).enumerate() {
            if m != n && m != 1 {
                return Err(Error::shape(
                    "expand",
                    self.shape(),
                    &dims,
                    format!(
                        "The expanded size of the tensor ({n}) must match the existing size ({m}) \
                         at non-singleton dimension {}.  Target sizes: {:?}.  Tensor sizes: {:?}",
                        lead + i,
                        dims.as_slice(),
                        self.shape()
                    ),
                ));
            }
        }
        Ok(self.view_with(
            "expand",
            self.layout().broadcast_to("expand", &dims)?,
            ViewGrad::Expand,
        ))
    }

    /// A view broadcast to `shape` (`torch.broadcast_to`, which is
    /// [`expand`](Self::expand): `-1` keeps a dim's size).
    pub fn broadcast_to(&self, shape: impl IntoShape) -> Result<Tensor> {
        self.expand(shape)
    }

    /// Joins tensors along an existing `dim`; dtypes promote, other dims must match.
    pub fn cat(tensors: &[&Tensor], dim: i64) -> Result<Tensor> {
        let first = tensors
            .first()
            .ok_or_else(|| Error::invalid("cat", "expected a non-empty list of tensors"))?;
        super::same_device("cat", tensors)?;
        // PyTorch skips 1-d empty tensors (a legacy rule), whose dtypes still promote
        let legacy = |t: &&Tensor| t.shape() == [0];
        if tensors.iter().any(legacy) && tensors.iter().all(|t| t.rank() > 0) {
            let kept: Vec<&Tensor> = tensors.iter().copied().filter(|t| !legacy(t)).collect();
            if !kept.is_empty() {
                let dtype = tensors
                    .iter()
                    .fold(kept[0].dtype(), |a, t| DType::promote(a, t.dtype()));
                // the skipped tensors still count against channels-last, as in
                // PyTorch (a 1-d tensor suggests row-major)
                return Tensor::cat(&kept, dim)?
                    .to_dtype(dtype)?
                    .laid_out(crate::layout::MemoryFormat::Contiguous);
            }
        }
        let d = normalize_dim("cat", dim, first.rank())?;
        if first.rank() == 0 {
            return Err(Error::invalid(
                "cat",
                "zero-dimensional tensors cannot be concatenated",
            ));
        }
        let dtype = tensors
            .iter()
            .skip(1)
            .fold(first.dtype(), |a, t| DType::promote(a, t.dtype()));
        let mut shape: Dims = first.shape().into();
        shape[d] = 0;
        for t in tensors {
            if t.rank() != first.rank()
                || t.shape()
                    .iter()
                    .zip(first.shape())
                    .enumerate()
                    .any(|(i, (a, b))| i != d && a != b)
            {
                return Err(Error::shape(
                    "cat",
                    first.shape(),
                    t.shape(),
                    format!("sizes must match except in dimension {d}"),
                ));
            }
            shape[d] = shape[d].saturating_add(t.shape()[d]);
        }
        let n = checked_numel("cat", &shape)?;
        // channels-last where every input suggests it, as PyTorch's cat
        let cl = crate::layout::MemoryFormat::ChannelsLast;
        let format = match tensors.iter().all(|t| t.suggest_memory_format() == cl) {
            true => cl,
            false => crate::layout::MemoryFormat::Contiguous,
        };
        let full = Layout::with_strides(&shape, crate::layout::format_strides(&shape, format));
        let mut out = Storage::empty(first.device(), dtype, n)?;
        let mut at = 0;
        for t in tensors {
            let len = t.shape()[d];
            let t = t.to_dtype(dtype)?;
            let dst = full.slice(d, at, at + len, 1);
            t.read().copy_into(t.layout(), &mut out, &dst)?;
            at += len;
        }
        let out = Tensor::with_storage(out, full);
        Ok(Tensor::record_twice(out, "cat", tensors, |_| {
            let sizes: Vec<usize> = tensors.iter().map(|t| t.shape()[d]).collect();
            move |g: &Tensor| {
                let parts = g.split_with_sizes(&sizes, d as i64)?;
                Ok(parts.into_iter().map(Some).collect())
            }
        }))
    }

    /// Joins same-shape tensors along a new `dim`.
    pub fn stack(tensors: &[&Tensor], dim: i64) -> Result<Tensor> {
        let first = tensors
            .first()
            .ok_or_else(|| Error::invalid("stack", "expected a non-empty list of tensors"))?;
        let d = normalize_dim("stack", dim, first.rank() + 1)?;
        for t in tensors {
            if t.shape() != first.shape() {
                return Err(Error::shape(
                    "stack",
                    first.shape(),
                    t.shape(),
                    "stack expects each tensor to be equal size",
                ));
            }
        }
        let us: Vec<Tensor> = tensors
            .iter()
            .map(|t| t.unsqueeze(d as i64))
            .collect::<Result<_>>()?;
        Tensor::cat(&us.iter().collect::<Vec<_>>(), d as i64)
    }

    /// Views of `size` elements along `dim` each (the last may be smaller).
    pub fn split(&self, size: usize, dim: i64) -> Result<Vec<Tensor>> {
        self.not_0d("split", "split expects at least a 1-dimensional tensor")?;
        let d = normalize_dim("split", dim, self.rank())?;
        if size == 0 && self.shape()[d] > 0 {
            return Err(Error::invalid(
                "split",
                "split_size must be positive for a non-empty dimension",
            ));
        }
        let n = self.shape()[d];
        if n == 0 {
            return Ok(vec![self.clone()]);
        }
        (0..n.div_ceil(size))
            .map(|i| self.narrow(d as i64, (i * size) as i64, size.min(n - i * size)))
            .collect()
    }

    /// Views with the given sizes along `dim` (they must add up to its size).
    pub fn split_with_sizes(&self, sizes: &[usize], dim: i64) -> Result<Vec<Tensor>> {
        self.not_0d(
            "split_with_sizes",
            "split expects at least a 1-dimensional tensor",
        )?;
        let d = normalize_dim("split_with_sizes", dim, self.rank())?;
        let total = sizes.iter().try_fold(0usize, |a, &s| a.checked_add(s));
        if total != Some(self.shape()[d]) {
            return Err(Error::invalid(
                "split_with_sizes",
                format!(
                    "split sizes {sizes:?} must sum to the size of dim {d} ({})",
                    self.shape()[d]
                ),
            ));
        }
        let mut at = 0;
        sizes
            .iter()
            .map(|&s| {
                let v = self.narrow(d as i64, at as i64, s);
                at += s;
                v
            })
            .collect()
    }

    /// `chunks` views of near-equal size along `dim` (`torch.chunk`: size
    /// `ceil(n / chunks)`, so fewer chunks may come back).
    pub fn chunk(&self, chunks: usize, dim: i64) -> Result<Vec<Tensor>> {
        self.not_0d("chunk", "chunk expects at least a 1-dimensional tensor")?;
        if chunks == 0 {
            return Err(Error::invalid(
                "chunk",
                "chunk expects `chunks` to be greater than 0",
            ));
        }
        let d = normalize_dim("chunk", dim, self.rank())?;
        let n = self.shape()[d];
        if n == 0 {
            // PyTorch: `chunks` empty pieces of an empty dim
            return (0..chunks).map(|_| self.narrow(d as i64, 0, 0)).collect();
        }
        self.split(n.div_ceil(chunks).max(1), d as i64)
    }

    /// The slices along `dim`, each a view without that dim (`torch.unbind`:
    /// `t.unbind(0)` of a `[3, 4]` tensor is three views of shape `[4]`, the
    /// same as `select(0, i)` for each `i`). An empty dim gives no views; a 0-d
    /// tensor is refused, as in PyTorch. The gradient of each view flows back
    /// into its slice.
    pub fn unbind(&self, dim: i64) -> Result<Vec<Tensor>> {
        if self.rank() == 0 {
            return Err(Error::invalid(
                "unbind",
                format!("Dimension specified as {dim} but tensor has no dimensions"),
            ));
        }
        let d = normalize_dim("unbind", dim, self.rank())?;
        (0..self.shape()[d])
            .map(|i| self.select(d as i64, i as i64))
            .collect()
    }

    /// PyTorch's refusal of a 0-d tensor by ops that take a part of a dim.
    fn not_0d(&self, op: &'static str, msg: &'static str) -> Result<()> {
        if self.rank() == 0 {
            return Err(Error::invalid(op, msg));
        }
        Ok(())
    }
}

/// Re-applies a region view (narrow, slice, select) to another tensor.
pub(crate) type RegionFn = Arc<dyn Fn(&Tensor) -> Result<Tensor> + Send + Sync>;

/// How the gradient of a view goes back to its base.
pub(crate) enum ViewGrad {
    /// Same elements, another shape: reshape the gradient back.
    Reshape,
    Transpose(usize, usize),
    Permute(Vec<usize>),
    /// Broadcast: sum the gradient over the expanded dims.
    Expand,
    /// A region (narrow, slice, select): the gradient goes into that region of zeros.
    Region(RegionFn),
}

impl ViewGrad {
    fn region(f: impl Fn(&Tensor) -> Result<Tensor> + Send + Sync + 'static) -> Self {
        ViewGrad::Region(Arc::new(f))
    }
}

impl Tensor {
    /// A view with `layout`, recording how its gradient returns to this tensor.
    fn view_with(&self, name: &'static str, layout: Layout, rule: ViewGrad) -> Tensor {
        let out = self.with_layout(layout);
        Tensor::record_reusable(out, name, &[self], |_| {
            let shape = self.shape().to_vec();
            let dtype = self.dtype();
            let device = self.device();
            move |g: &Tensor| {
                let gx = match &rule {
                    ViewGrad::Reshape => g.reshape(&shape)?,
                    ViewGrad::Transpose(a, b) => g.transpose(*a as i64, *b as i64)?,
                    ViewGrad::Permute(p) => {
                        let mut inv = vec![0usize; p.len()];
                        for (i, &d) in p.iter().enumerate() {
                            inv[d] = i;
                        }
                        g.permute(inv)?
                    }
                    ViewGrad::Expand => crate::autograd::sum_to(g, &shape)?,
                    ViewGrad::Region(view) => {
                        let z = crate::autograd::no_grad(|| -> Result<Tensor> {
                            let z = Tensor::zeros(&shape, dtype, &device)?;
                            view(&z)?.copy_(g)?;
                            Ok(z)
                        })?;
                        // recorded where the gradient has a history (a walk that
                        // creates a graph): its own gradient is the region of it
                        Tensor::record_reusable(z, "region_backward", &[g], |_| {
                            let view = view.clone();
                            move |gg: &Tensor| Ok(vec![Some(view(gg)?)])
                        })
                    }
                };
                Ok(vec![Some(gx)])
            }
        })
    }
}
