//! Shape helpers built from views, `cat`, `flip` and `index_select`: the
//! `*_as` forms, `movedim`, `unflatten`, `tile`, `repeat_interleave`, the
//! stacks and `atleast_*d`, `tensor_split` and its `h`/`v`/`d` forms, and
//! `rot90`. None has a kernel or a backward rule of its own: autograd, every
//! dtype and every device come from the ops they are made of.
//!
//! ```
//! use ember::{Device, Tensor};
//! let t = Tensor::arange(0i64, 6, &Device::Cpu)?.reshape([2, 3])?;
//! assert_eq!(t.movedim(0, 1)?.shape(), &[3, 2]);
//! assert_eq!(t.repeat_interleave(2, Some(0))?.shape(), &[4, 3]);
//! assert_eq!(t.rot90(1, [0, 1])?.to_vec2::<i64>()?, vec![vec![2, 5], vec![1, 4], vec![0, 3]]);
//! # Ok::<(), ember::Error>(())
//! ```

use super::shape::IntoDims;
use super::Tensor;
use crate::layout::normalize_dim;
use crate::{
    dtype::DType,
    error::{Error, Result},
};

/// How [`Tensor::tensor_split`] and its `hsplit`/`vsplit`/`dsplit` forms cut a
/// dim: into a number of sections, or at a list of indices (PyTorch's
/// `indices_or_sections`). `3.into()` is three sections, `[1, 4].into()` the
/// cuts before indices 1 and 4.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sections {
    /// That many pieces of near-equal size (the first ones one longer).
    Count(usize),
    /// The pieces `[..i0]`, `[i0..i1]`, ..., `[ik..]`, the indices taken as
    /// Python slice bounds (negative counts from the end; clamped to the size).
    Indices(Vec<i64>),
}

impl From<usize> for Sections {
    fn from(n: usize) -> Sections {
        Sections::Count(n)
    }
}
impl From<i32> for Sections {
    /// A negative count becomes 0, which is refused as PyTorch refuses it.
    fn from(n: i32) -> Sections {
        Sections::Count(n.max(0) as usize)
    }
}
impl From<Vec<i64>> for Sections {
    fn from(v: Vec<i64>) -> Sections {
        Sections::Indices(v)
    }
}
impl From<&[i64]> for Sections {
    fn from(v: &[i64]) -> Sections {
        Sections::Indices(v.to_vec())
    }
}
impl<const N: usize> From<[i64; N]> for Sections {
    fn from(v: [i64; N]) -> Sections {
        Sections::Indices(v.to_vec())
    }
}

impl Tensor {
    /// This tensor expanded to `other`'s shape (`Tensor.expand_as`): a view.
    pub fn expand_as(&self, other: &Tensor) -> Result<Tensor> {
        self.expand(other.shape())
    }

    /// This tensor viewed with `other`'s shape (`Tensor.view_as`): an error
    /// where the strides do not allow a view, as [`view`](Self::view).
    pub fn view_as(&self, other: &Tensor) -> Result<Tensor> {
        self.view(other.shape())
    }

    /// This tensor reshaped to `other`'s shape (`Tensor.reshape_as`).
    pub fn reshape_as(&self, other: &Tensor) -> Result<Tensor> {
        self.reshape(other.shape())
    }

    /// This tensor in `other`'s dtype (`Tensor.type_as`): itself when the
    /// dtypes agree.
    pub fn type_as(&self, other: &Tensor) -> Result<Tensor> {
        self.to_dtype(other.dtype())
    }

    /// A view with the dims `source` moved to the positions `destination`, the
    /// other dims keeping their order (`torch.movedim`). One dim or a list of
    /// them, negative counting from the end.
    ///
    /// ```
    /// # use ember::{DType, Device, Tensor};
    /// let t = Tensor::zeros([2, 3, 4, 5], DType::F32, &Device::Cpu)?;
    /// assert_eq!(t.movedim(1, -1)?.shape(), &[2, 4, 5, 3]);
    /// assert_eq!(t.movedim([0, 1], [2, 0])?.shape(), &[3, 4, 2, 5]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn movedim(&self, source: impl IntoDims, destination: impl IntoDims) -> Result<Tensor> {
        const OP: &str = "movedim";
        let (src, dst) = (source.to_dim_list(), destination.to_dim_list());
        if src.len() != dst.len() {
            return Err(Error::invalid(
                OP,
                format!(
                    "movedim: Invalid source or destination dims: source ({:?} dims) should contain the same number of dims as destination ({:?} dims)",
                    src.as_slice(),
                    dst.as_slice()
                ),
            ));
        }
        let r = self.rank();
        let norm = |l: &[i64]| -> Result<Vec<usize>> {
            l.iter().map(|&d| normalize_dim(OP, d, r)).collect()
        };
        let (s, d) = (norm(&src)?, norm(&dst)?);
        for (name, l) in [("source", &s), ("destination", &d)] {
            if (1..l.len()).any(|i| l[..i].contains(&l[i])) {
                return Err(Error::invalid(
                    OP,
                    format!("movedim: repeated dim in `{name}` ({:?})", l),
                ));
            }
        }
        if r == 0 {
            return Ok(self.clone());
        }
        // the result's dim `d[i]` is `s[i]`; the free places take the other
        // dims in order
        let mut perm: Vec<Option<usize>> = vec![None; r];
        for (&a, &b) in s.iter().zip(&d) {
            perm[b] = Some(a);
        }
        let mut rest = (0..r).filter(|i| !s.contains(i));
        let perm: Vec<usize> = perm
            .into_iter()
            .map(|p| {
                p.or_else(|| rest.next())
                    .expect("as many free places as dims")
            })
            .collect();
        self.permute(perm)
    }

    /// Alias of [`movedim`](Self::movedim) (`torch.moveaxis`).
    pub fn moveaxis(&self, source: impl IntoDims, destination: impl IntoDims) -> Result<Tensor> {
        self.movedim(source, destination)
    }

    /// Alias of [`transpose`](Self::transpose) (`torch.swapaxes`).
    pub fn swapaxes(&self, axis0: i64, axis1: i64) -> Result<Tensor> {
        self.transpose(axis0, axis1)
    }

    /// Alias of [`transpose`](Self::transpose) (`torch.swapdims`).
    pub fn swapdims(&self, dim0: i64, dim1: i64) -> Result<Tensor> {
        self.transpose(dim0, dim1)
    }

    /// The elements as a 1-D tensor (`torch.ravel`): a view where the strides
    /// allow, a copy otherwise; a 0-d tensor gives one element.
    pub fn ravel(&self) -> Result<Tensor> {
        self.reshape([-1i64])
    }

    /// `dim` split into `sizes` (`Tensor.unflatten`), one of which may be -1
    /// (inferred): `[2, 50]` unflattened at dim 1 into `[2, -1, 5]` is
    /// `[2, 2, 5, 5]`. A view where the strides allow. PyTorch's checks in its
    /// order: sizes given, the dim in range, then the inference (at most one
    /// -1, no other negative size, a product that divides the size).
    ///
    /// ```
    /// # use ember::{DType, Device, Tensor};
    /// let t = Tensor::zeros([2, 50], DType::F32, &Device::Cpu)?;
    /// assert_eq!(t.unflatten(1, &[2, -1, 5])?.shape(), &[2, 2, 5, 5]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn unflatten(&self, dim: i64, sizes: &[i64]) -> Result<Tensor> {
        const OP: &str = "unflatten";
        if sizes.is_empty() {
            return Err(Error::invalid(OP, "unflatten: sizes must be non-empty"));
        }
        if self.rank() == 0 {
            return Err(Error::invalid(
                OP,
                format!("unflatten: Dimension specified as {dim} but tensor has no dimensions"),
            ));
        }
        let d = normalize_dim(OP, dim, self.rank())?;
        let n = self.shape()[d];
        let mut inferred = None;
        let mut known: usize = 1;
        for (i, &s) in sizes.iter().enumerate() {
            if s == -1 {
                if inferred.is_some() {
                    return Err(Error::invalid(
                        OP,
                        "unflatten: only one dimension can be inferred",
                    ));
                }
                inferred = Some(i);
            } else if s >= 0 {
                known = known.saturating_mul(s as usize);
            } else {
                return Err(Error::invalid(
                    OP,
                    format!(
                        "unflatten: invalid shape dimension {s} at index {i} of shape {sizes:?}"
                    ),
                ));
            }
        }
        let fits = n == known || (inferred.is_some() && known > 0 && n.is_multiple_of(known));
        if !fits {
            return Err(Error::invalid(
                OP,
                format!(
                    "unflatten: Provided sizes {sizes:?} don't multiply up to the size of dim {dim} ({n}) in the input tensor"
                ),
            ));
        }
        let mut split: Vec<usize> = sizes.iter().map(|&s| s.max(0) as usize).collect();
        if let Some(i) = inferred {
            if known == 0 {
                return Err(Error::invalid(
                    OP,
                    format!(
                        "unflatten: cannot reshape tensor of 0 elements into shape {sizes:?} because the unspecified dimension size -1 can be any value and is ambiguous"
                    ),
                ));
            }
            split[i] = n / known;
        }
        let mut shape = self.shape()[..d].to_vec();
        shape.extend(split);
        shape.extend_from_slice(&self.shape()[d + 1..]);
        self.reshape(shape)
    }

    /// This tensor repeated `reps[i]` times along dim `i` (`torch.tile`): as
    /// [`repeat`](Self::repeat), except that fewer counts than dims are padded
    /// with leading ones.
    pub fn tile(&self, reps: &[usize]) -> Result<Tensor> {
        let mut full = vec![1usize; self.rank().saturating_sub(reps.len())];
        full.extend_from_slice(reps);
        self.repeat(&full)
    }

    /// Each element repeated `repeats` times in a row along `dim`
    /// (`torch.repeat_interleave` with an integer count), or along the
    /// flattened tensor without a dim: `[1, 2]` by 2 is `[1, 1, 2, 2]`.
    pub fn repeat_interleave(&self, repeats: usize, dim: Option<i64>) -> Result<Tensor> {
        const OP: &str = "repeat_interleave";
        let (x, d) = match dim {
            None => (self.reshape([-1i64])?, 0),
            Some(dim) => (self.clone(), normalize_dim(OP, dim, self.rank())?),
        };
        if x.rank() == 0 {
            // a 0-d tensor with dim 0 or -1 repeats as one element
            return x.reshape([1])?.repeat_interleave(repeats, Some(0));
        }
        let mut size = x.shape().to_vec();
        size[d] = size[d].checked_mul(repeats).ok_or_else(|| {
            Error::invalid(
                OP,
                format!("{repeats} repeats overflow the size of dim {d}"),
            )
        })?;
        let mut expanded = x.shape().to_vec();
        expanded.insert(d + 1, repeats);
        x.unsqueeze(d as i64 + 1)?.expand(&expanded)?.reshape(size)
    }

    /// Element `i` along `dim` repeated `repeats[i]` times
    /// (`torch.repeat_interleave(input, repeats, dim)` with a tensor of
    /// counts): `repeats` is an int64 tensor of one count per element, or of a
    /// single count for all; without `dim` the tensor is flattened first. The
    /// output's length is the counts' sum: given as `output_size`, nothing is
    /// read back (a meta tensor needs it); without it the counts are read on
    /// the host (one wait on a GPU). Negative counts are refused where the
    /// counts can be read.
    ///
    /// ```
    /// # use ember::{Device, Tensor};
    /// let dev = Device::Cpu;
    /// let t = Tensor::new([10i64, 20, 30], &dev)?;
    /// let r = Tensor::new([2i64, 0, 1], &dev)?;
    /// assert_eq!(t.repeat_interleave_tensor(&r, None, None)?.to_vec::<i64>()?, [10, 10, 30]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn repeat_interleave_tensor(
        &self,
        repeats: &Tensor,
        dim: Option<i64>,
        output_size: Option<usize>,
    ) -> Result<Tensor> {
        const OP: &str = "repeat_interleave";
        super::same_device(OP, &[self, repeats])?;
        if repeats.rank() > 1 {
            return Err(Error::invalid(OP, "repeats must be 0-dim or 1-dim tensor"));
        }
        if repeats.dtype() != DType::I64 {
            return Err(Error::dtype(
                OP,
                repeats.dtype(),
                "repeat_interleave only accept int32 and int64 tensor as repeats",
            ));
        }
        let (x, d) = match dim {
            None => (self.reshape([-1i64])?, 0),
            Some(dim) => (self.clone(), normalize_dim(OP, dim, self.rank())?),
        };
        let x = if x.rank() == 0 { x.reshape([1])? } else { x };
        let n = x.shape()[d];
        let counts = if repeats.numel() == 1 && n != 1 {
            repeats.reshape([1])?.expand([n])?
        } else {
            repeats.reshape([-1i64])?
        };
        if counts.numel() != n {
            return Err(Error::invalid(
                OP,
                format!(
                    "repeats must have the same size as input along dim, but got repeats.size(0) = {} and input.size({d}) = {n}",
                    counts.numel()
                ),
            ));
        }
        let total = match (output_size, counts.holds_values()) {
            _ if n == 0 => 0,
            (_, true) => {
                let (lo, sum) = crate::autograd::no_grad(|| -> Result<(i64, i64)> {
                    Ok((
                        counts.min_all()?.item::<i64>()?,
                        counts.sum_all()?.item::<i64>()?,
                    ))
                })?;
                if lo < 0 {
                    return Err(Error::invalid(OP, "repeats can not be negative"));
                }
                match output_size {
                    Some(s) if s as i64 != sum => {
                        return Err(Error::invalid(
                            OP,
                            format!("allocated size does not match required size: output_size {s}, sum of repeats {sum}"),
                        ))
                    }
                    _ => sum as usize,
                }
            }
            (Some(s), false) => s,
            (None, false) => {
                return Err(Error::invalid(
                    OP,
                    "repeat_interleave of a tensor without values needs output_size: the counts cannot be read",
                ))
            }
        };
        // position j of the output takes element #{i : end_i <= j}, where end_i
        // is the running sum of the counts: ones added at each end, summed up
        let ends = counts.cumsum(0)?;
        let ends = ends.clamp_max(total as i64)?;
        let ones = Tensor::ones([n], DType::I64, &x.device())?;
        let marks = Tensor::zeros([total + 1], DType::I64, &x.device())?;
        let idx = marks
            .scatter_add_valid(0, ends, &ones)?
            .cumsum(0)?
            .narrow(0, 0, total)?
            .clamp_max(n.saturating_sub(1) as i64)?
            .contiguous()?;
        x.index_select_valid(d, idx)
    }

    /// The tensors joined column-wise (`torch.hstack`): along dim 0 for 1-D
    /// tensors (0-d ones count as 1-D), along dim 1 otherwise.
    pub fn hstack(tensors: &[&Tensor]) -> Result<Tensor> {
        let ts = each("hstack", tensors, Tensor::atleast_1d)?;
        let dim = if ts[0].rank() == 1 { 0 } else { 1 };
        Tensor::cat(&ts.iter().collect::<Vec<_>>(), dim)
    }

    /// The tensors joined row-wise (`torch.vstack`): each made at least 2-D
    /// ([`atleast_2d`](Self::atleast_2d)), then joined along dim 0.
    pub fn vstack(tensors: &[&Tensor]) -> Result<Tensor> {
        let ts = each("vstack", tensors, Tensor::atleast_2d)?;
        Tensor::cat(&ts.iter().collect::<Vec<_>>(), 0)
    }

    /// The tensors joined depth-wise (`torch.dstack`): each made at least 3-D
    /// ([`atleast_3d`](Self::atleast_3d)), then joined along dim 2.
    pub fn dstack(tensors: &[&Tensor]) -> Result<Tensor> {
        let ts = each("dstack", tensors, Tensor::atleast_3d)?;
        Tensor::cat(&ts.iter().collect::<Vec<_>>(), 2)
    }

    /// The tensors as columns side by side (`torch.column_stack`): a 0-d or
    /// 1-D tensor of `n` elements becomes a `[n, 1]` column, the others are
    /// joined as they are along dim 1.
    pub fn column_stack(tensors: &[&Tensor]) -> Result<Tensor> {
        let ts = each("column_stack", tensors, |t| match t.rank() {
            0 | 1 => t.reshape([t.numel(), 1]),
            _ => Ok(t.clone()),
        })?;
        Tensor::cat(&ts.iter().collect::<Vec<_>>(), 1)
    }

    /// This tensor with at least one dim (`torch.atleast_1d`): a 0-d tensor
    /// becomes `[1]`, the others are returned as they are.
    pub fn atleast_1d(&self) -> Result<Tensor> {
        match self.rank() {
            0 => self.reshape([1]),
            _ => Ok(self.clone()),
        }
    }

    /// This tensor with at least two dims (`torch.atleast_2d`): 0-d becomes
    /// `[1, 1]`, 1-D `[n]` becomes `[1, n]`.
    pub fn atleast_2d(&self) -> Result<Tensor> {
        match self.rank() {
            0 => self.reshape([1, 1]),
            1 => self.unsqueeze(0),
            _ => Ok(self.clone()),
        }
    }

    /// This tensor with at least three dims (`torch.atleast_3d`): 0-d becomes
    /// `[1, 1, 1]`, `[n]` becomes `[1, n, 1]` and `[m, n]` becomes `[m, n, 1]`.
    pub fn atleast_3d(&self) -> Result<Tensor> {
        match self.rank() {
            0 => self.reshape([1, 1, 1]),
            1 => self.unsqueeze(0)?.unsqueeze(-1),
            2 => self.unsqueeze(-1),
            _ => Ok(self.clone()),
        }
    }

    /// Views of this tensor cut along `dim` (`torch.tensor_split`): into
    /// `Sections::Count(n)` pieces, the first `size % n` of them one element
    /// longer than the rest, or at `Sections::Indices`, Python slice bounds
    /// (pieces may be empty).
    ///
    /// ```
    /// # use ember::{Device, Tensor};
    /// let t = Tensor::arange(0i64, 7, &Device::Cpu)?;
    /// let sizes = |v: Vec<Tensor>| v.iter().map(|p| p.numel()).collect::<Vec<_>>();
    /// assert_eq!(sizes(t.tensor_split(3, 0)?), [3, 2, 2]);
    /// assert_eq!(sizes(t.tensor_split([1, 5], 0)?), [1, 4, 2]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn tensor_split(&self, sections: impl Into<Sections>, dim: i64) -> Result<Vec<Tensor>> {
        const OP: &str = "tensor_split";
        if self.rank() == 0 {
            return Err(Error::invalid(
                OP,
                "tensor_split expected at least a 1-dimensional tensor, but got a tensor with 0 dims",
            ));
        }
        let d = normalize_dim(OP, dim, self.rank())?;
        let len = self.shape()[d];
        match sections.into() {
            Sections::Count(0) => Err(Error::invalid(
                OP,
                "number of sections must be larger than 0, got 0",
            )),
            Sections::Count(n) => {
                let (base, extra) = (len / n, len % n);
                let mut at = 0;
                (0..n)
                    .map(|i| {
                        let size = base + usize::from(i < extra);
                        let piece = self.narrow(d as i64, at as i64, size);
                        at += size;
                        piece
                    })
                    .collect()
            }
            Sections::Indices(cuts) => {
                let mut start = Some(0);
                let mut out = Vec::with_capacity(cuts.len() + 1);
                for &c in &cuts {
                    out.push(self.slice(d as i64, start, Some(c), 1)?);
                    start = Some(c);
                }
                out.push(self.slice(d as i64, start, None, 1)?);
                Ok(out)
            }
        }
    }

    /// [`tensor_split`](Self::tensor_split) along dim 1, or dim 0 of a 1-D
    /// tensor (`torch.hsplit`); a count of sections must divide the size.
    pub fn hsplit(&self, sections: impl Into<Sections>) -> Result<Vec<Tensor>> {
        let dim = if self.rank() == 1 { 0 } else { 1 };
        self.split_along("hsplit", 1, dim, sections.into())
    }

    /// [`tensor_split`](Self::tensor_split) along dim 0 of a tensor of at least
    /// two dims (`torch.vsplit`); a count of sections must divide the size.
    pub fn vsplit(&self, sections: impl Into<Sections>) -> Result<Vec<Tensor>> {
        self.split_along("vsplit", 2, 0, sections.into())
    }

    /// [`tensor_split`](Self::tensor_split) along dim 2 of a tensor of at least
    /// three dims (`torch.dsplit`); a count of sections must divide the size.
    pub fn dsplit(&self, sections: impl Into<Sections>) -> Result<Vec<Tensor>> {
        self.split_along("dsplit", 3, 2, sections.into())
    }

    /// The checks PyTorch's `hsplit`, `vsplit` and `dsplit` make before they
    /// call `tensor_split`.
    fn split_along(
        &self,
        op: &'static str,
        min_rank: usize,
        dim: usize,
        sections: Sections,
    ) -> Result<Vec<Tensor>> {
        if self.rank() < min_rank {
            return Err(Error::invalid(
                op,
                format!(
                    "torch.{op} requires a tensor with at least {min_rank} dimension, but got a tensor with {} dimensions!",
                    self.rank()
                ),
            ));
        }
        if let Sections::Count(n) = sections {
            let size = self.shape()[dim];
            if n != 0 && !size.is_multiple_of(n) {
                return Err(Error::invalid(
                    op,
                    format!(
                        "torch.{op} attempted to split along dimension {dim}, but the size of the dimension {size} is not divisible by the split_size {n}!"
                    ),
                ));
            }
        }
        self.tensor_split(sections, dim as i64)
    }

    /// This tensor rotated by 90 degrees `k` times in the plane of `dims`
    /// (`torch.rot90`), from the first dim's direction towards the second's;
    /// a negative `k` turns the other way. A copy.
    pub fn rot90(&self, k: i64, dims: impl IntoDims) -> Result<Tensor> {
        const OP: &str = "rot90";
        let dims = dims.to_dim_list();
        if dims.len() != 2 {
            return Err(Error::invalid(
                OP,
                format!(
                    "expected total rotation dims == 2, but got dims = {}",
                    dims.len()
                ),
            ));
        }
        if self.rank() < 2 {
            return Err(Error::invalid(
                OP,
                format!(
                    "expected total dims >= 2, but got total dims = {}",
                    self.rank()
                ),
            ));
        }
        let (a, b) = (dims[0], dims[1]);
        let d0 = normalize_dim(OP, a, self.rank())? as i64;
        let d1 = normalize_dim(OP, b, self.rank())? as i64;
        if d0 == d1 {
            return Err(Error::invalid(
                OP,
                format!(
                    "expected rotation dims to be different, but got dim0 = {a} and dim1 = {b}"
                ),
            ));
        }
        match k.rem_euclid(4) {
            1 => self.flip(d1)?.transpose(d0, d1),
            2 => self.flip([d0, d1]),
            3 => self.flip(d0)?.transpose(d0, d1),
            _ => self.copy(),
        }
    }
}

/// `f` of each tensor of a non-empty list (PyTorch's message for an empty one).
fn each(
    op: &'static str,
    tensors: &[&Tensor],
    f: impl Fn(&Tensor) -> Result<Tensor>,
) -> Result<Vec<Tensor>> {
    if tensors.is_empty() {
        return Err(Error::invalid(
            op,
            format!("{op} expects a non-empty TensorList"),
        ));
    }
    tensors.iter().map(|t| f(t)).collect()
}
