//! Advanced indexing, PyTorch's `x[idx]`, `x[mask]` and `x[:, idx] = v`: integer
//! and boolean index tensors mixed with positions, ranges, new axes and an
//! ellipsis; read as a copy ([`Tensor::index`]), written out of place
//! ([`Tensor::index_put`]) or in place ([`Tensor::index_put_`],
//! [`Tensor::index_set_`]).
//!
//! The rules are PyTorch's: positions, ranges, new axes and the ellipsis are
//! applied first, as views; then the index tensors, broadcast together to one
//! shape `B`, pick entries of the dims they stand at. When those dims are next
//! to each other, `B` takes their place in the result; when other dims separate
//! them, `B` comes first. A boolean mask stands for the indices of its true
//! elements (found on the host: a synchronisation, as in PyTorch).

use super::{Idx, Operand, Tensor};
use crate::{
    autograd::no_grad,
    dtype::DType,
    error::{Error, Result},
    layout::broadcast_shapes,
};
use std::ops::{Range, RangeFrom, RangeFull, RangeInclusive, RangeTo, RangeToInclusive};

/// One item of an advanced index expression, PyTorch's `x[...]` items.
#[derive(Clone, Debug)]
pub enum TensorIndex {
    /// A position (removes the dim) or a range (see [`Idx`]): basic indexing.
    Basic(Idx),
    /// Python's `None`: a new dim of size 1 here.
    NewAxis,
    /// Python's `...`: full ranges over the dims the other items leave.
    Ellipsis,
    /// An index tensor. int64 picks entries along one dim (negative counts
    /// from the end); bool (or uint8, as PyTorch still accepts) is a mask over
    /// as many dims as it has, standing for the positions of its true elements.
    Tensor(Tensor),
}

macro_rules! tensor_index_from {
    ($($t:ty),*) => {$(
        impl From<$t> for TensorIndex {
            fn from(i: $t) -> TensorIndex { TensorIndex::Basic(i.into()) }
        }
    )*};
}
tensor_index_from!(Idx, i64, i32, usize, RangeFull);
macro_rules! tensor_index_ranges {
    ($($t:ty),*) => {$(
        tensor_index_from!(Range<$t>, RangeFrom<$t>, RangeTo<$t>, RangeInclusive<$t>, RangeToInclusive<$t>);
    )*};
}
tensor_index_ranges!(i64, i32, usize);

impl From<Tensor> for TensorIndex {
    fn from(t: Tensor) -> TensorIndex {
        TensorIndex::Tensor(t)
    }
}
impl From<&Tensor> for TensorIndex {
    fn from(t: &Tensor) -> TensorIndex {
        TensorIndex::Tensor(t.clone())
    }
}

/// Anything [`Tensor::index`] accepts: one item, a tuple of items, or a list.
pub trait IntoTensorIndex {
    /// The items, in order.
    fn tensor_index(self) -> Vec<TensorIndex>;
}

impl<T: Into<TensorIndex>> IntoTensorIndex for T {
    fn tensor_index(self) -> Vec<TensorIndex> {
        vec![self.into()]
    }
}
impl IntoTensorIndex for Vec<TensorIndex> {
    fn tensor_index(self) -> Vec<TensorIndex> {
        self
    }
}
impl IntoTensorIndex for &[TensorIndex] {
    fn tensor_index(self) -> Vec<TensorIndex> {
        self.to_vec()
    }
}

macro_rules! tensor_index_tuple {
    ($($n:ident),*) => {
        impl<$($n: Into<TensorIndex>),*> IntoTensorIndex for ($($n,)*) {
            #[allow(non_snake_case)]
            fn tensor_index(self) -> Vec<TensorIndex> {
                let ($($n,)*) = self;
                vec![$($n.into()),*]
            }
        }
    };
}
tensor_index_tuple!(A);
tensor_index_tuple!(A, B);
tensor_index_tuple!(A, B, C);
tensor_index_tuple!(A, B, C, D);
tensor_index_tuple!(A, B, C, D, E);
tensor_index_tuple!(A, B, C, D, E, F);

/// An index expression with its basic items applied: the view they give
/// (`sliced` when it differs from the tensor indexed), and the int64 index
/// tensors with the dims of the view they stand at (ascending, unchecked).
struct Plan {
    view: Tensor,
    sliced: bool,
    picks: Vec<(usize, Tensor)>,
}

/// The index tensors checked and merged: the dims they pick along, their
/// broadcast shape, and one flat int64 position per picked entry into those
/// dims taken together (row-major).
struct Picked {
    dims: Vec<usize>,
    shape: Vec<usize>,
    flat: Tensor,
}

impl Picked {
    /// Whether the picked dims lie next to each other (`B` then takes their
    /// place; otherwise it comes first).
    fn adjacent(&self) -> bool {
        self.dims.windows(2).all(|w| w[1] == w[0] + 1)
    }

    /// The shape of `view` indexed.
    fn result_shape(&self, view: &[usize]) -> Vec<usize> {
        let rest = view
            .iter()
            .enumerate()
            .filter(|(d, _)| !self.dims.contains(d))
            .map(|(_, &s)| s);
        if self.adjacent() {
            let a = self.dims[0];
            let mut out = view[..a].to_vec();
            out.extend(&self.shape);
            out.extend(&view[a + self.dims.len()..]);
            out
        } else {
            self.shape.iter().copied().chain(rest).collect()
        }
    }

    /// `view` arranged so that the picked dims are one dim, at `a` (returned),
    /// and the result's other dims keep their order around it; `perm` is the
    /// permutation applied (none when the picked dims were adjacent).
    fn merged(&self, view: &Tensor) -> Result<(Tensor, usize, Option<Vec<usize>>)> {
        let shape = view.shape();
        let p: usize = self.dims.iter().map(|&d| shape[d]).product();
        if self.adjacent() {
            let a = self.dims[0];
            let mut m = shape[..a].to_vec();
            m.push(p);
            m.extend(&shape[a + self.dims.len()..]);
            return Ok((view.reshape(m)?, a, None));
        }
        let rest: Vec<usize> = (0..shape.len())
            .filter(|d| !self.dims.contains(d))
            .collect();
        let perm: Vec<usize> = self.dims.iter().chain(&rest).copied().collect();
        let mut m = vec![p];
        m.extend(rest.iter().map(|&d| shape[d]));
        Ok((view.permute(perm.clone())?.reshape(m)?, 0, Some(perm)))
    }
}

/// The index tensor `t` as one PyTorch accepts: int64 as it is, uint8 as the
/// bool mask it stands for, on `device`.
fn index_tensor(t: &Tensor, device: &crate::device::Device) -> Result<Tensor> {
    let t = match t.dtype() {
        DType::I64 | DType::Bool => t.clone(),
        DType::U8 => t.ne(0i64)?,
        other => {
            return Err(Error::dtype(
                "index",
                other,
                "tensors used as indices must be long, int, byte or bool tensors",
            ))
        }
    };
    // PyTorch takes indices from the CPU for a tensor on a GPU
    if &t.device() != device {
        t.to(device)
    } else {
        Ok(t)
    }
}

fn plan(x: &Tensor, items: Vec<TensorIndex>) -> Result<Plan> {
    let rank = x.rank();
    let mut used = 0;
    let mut ellipses = 0;
    for it in &items {
        match it {
            TensorIndex::Basic(_) => used += 1,
            TensorIndex::Tensor(t) if matches!(t.dtype(), DType::Bool | DType::U8) => {
                used += t.rank()
            }
            TensorIndex::Tensor(_) => used += 1,
            TensorIndex::NewAxis => {}
            TensorIndex::Ellipsis => ellipses += 1,
        }
    }
    if ellipses > 1 {
        return Err(Error::invalid(
            "index",
            "an index can only have a single ellipsis ('...')",
        ));
    }
    if used > rank {
        return Err(Error::invalid(
            "index",
            format!("too many indices for tensor of dimension {rank}"),
        ));
    }
    let device = x.device();
    let (mut view, mut sliced, mut picks) = (x.clone(), false, Vec::new());
    let mut d = 0usize;
    for it in items {
        match it {
            TensorIndex::Basic(Idx::At(i)) => {
                view = view.select(d as i64, i)?;
                sliced = true;
            }
            TensorIndex::Basic(Idx::Range {
                start: None,
                end: None,
                step: 1,
            }) => d += 1,
            TensorIndex::Basic(Idx::Range { start, end, step }) => {
                view = view.slice(d as i64, start, end, step)?;
                sliced = true;
                d += 1;
            }
            TensorIndex::NewAxis => {
                view = view.unsqueeze(d as i64)?;
                sliced = true;
                d += 1;
            }
            TensorIndex::Ellipsis => d += rank - used,
            TensorIndex::Tensor(t) => {
                let t = index_tensor(&t, &device)?;
                if t.dtype() == DType::I64 {
                    picks.push((d, t));
                    d += 1;
                    continue;
                }
                // a 0-d mask stands over a new dim of size 1
                let mask = if t.rank() == 0 {
                    view = view.unsqueeze(d as i64)?;
                    sliced = true;
                    t.reshape([1])?
                } else {
                    t
                };
                for (i, &n) in mask.shape().iter().enumerate() {
                    if view.shape()[d + i] != n {
                        return Err(Error::shape(
                            "index",
                            mask.shape(),
                            view.shape(),
                            format!(
                                "The shape of the mask {:?} at index {i} does not match the shape of the indexed tensor {:?} at index {}",
                                mask.shape(),
                                view.shape(),
                                d + i
                            ),
                        ));
                    }
                }
                let at = mask.nonzero()?;
                for j in 0..mask.rank() {
                    picks.push((d + j, at.select(1, j as i64)?));
                }
                d += mask.rank();
            }
        }
    }
    Ok(Plan {
        view,
        sliced,
        picks,
    })
}

/// The index tensors of `picks` into `view` broadcast together, checked and
/// merged into flat positions.
fn pick(view: &Tensor, picks: &[(usize, Tensor)]) -> Result<Picked> {
    let mut shape: Vec<usize> = picks[0].1.shape().to_vec();
    for (_, t) in &picks[1..] {
        shape = match broadcast_shapes("index", &shape, t.shape()) {
            Ok(s) => s.to_vec(),
            Err(_) => {
                let all: Vec<String> = picks
                    .iter()
                    .map(|(_, t)| format!("{:?}", t.shape()))
                    .collect();
                return Err(Error::invalid(
                    "index",
                    format!(
                        "shape mismatch: indexing tensors could not be broadcast together with shapes {}",
                        all.join(", ")
                    ),
                ));
            }
        };
    }
    let dims: Vec<usize> = picks.iter().map(|(d, _)| *d).collect();
    // row-major strides of the picked dims taken together
    let mut stride = 1i64;
    let mut flat: Option<Tensor> = None;
    for (k, (d, t)) in picks.iter().enumerate().rev() {
        let size = view.shape()[*d];
        if size == 0 && t.numel() > 0 {
            return Err(Error::invalid(
                "index",
                "index is out of bounds for dimension with size 0",
            ));
        }
        let w = Tensor::index_values("index", t, k, size, true)?;
        let w = if stride == 1 { w } else { w.mul(stride)? };
        flat = Some(match flat {
            None => w,
            Some(f) => f.add(&w)?,
        });
        stride *= size as i64;
    }
    let flat = flat
        .expect("at least one index tensor")
        .broadcast_to(&shape[..])?
        .reshape([-1i64])?
        .contiguous()?;
    Ok(Picked { dims, shape, flat })
}

/// `values` written into a copy of `view` at `picks` (added with
/// `accumulate`), in `view`'s shape.
fn put(
    view: &Tensor,
    picks: &[(usize, Tensor)],
    values: &Tensor,
    accumulate: bool,
) -> Result<Tensor> {
    super::same_device("index_put", &[view, values])?;
    if values.dtype() != view.dtype() {
        return Err(Error::dtype(
            "index_put",
            values.dtype(),
            format!(
            "Index put requires the source and destination dtypes match, got {} for the destination and {} for the source.",
            super::torch_dtype_name(view.dtype()),
            super::torch_dtype_name(values.dtype())
            ),
        ));
    }
    let picked = match picks.is_empty() {
        true => None,
        false => Some(pick(view, picks)?),
    };
    let target = match &picked {
        None => view.shape().to_vec(),
        Some(p) => p.result_shape(view.shape()),
    };
    let fits = broadcast_shapes("index_put", values.shape(), &target)
        .is_ok_and(|s| s.as_slice() == target.as_slice());
    if !fits {
        return Err(Error::shape(
            "index_put",
            values.shape(),
            &target,
            format!(
                "shape mismatch: value tensor of shape {:?} cannot be broadcast to indexing result of shape {:?}",
                values.shape(),
                target
            ),
        ));
    }
    let values = values.broadcast_to(&target[..])?;
    let Some(p) = picked else {
        return match accumulate {
            true => view.add(&values),
            false => values.contiguous(),
        };
    };
    let (merged, a, perm) = p.merged(view)?;
    let mut vshape = merged.shape().to_vec();
    vshape[a] = p.flat.numel();
    let v = values.reshape(vshape)?;
    let out = match accumulate {
        true => merged.index_add(a as i64, &p.flat, &v, 1i64)?,
        false => merged.index_copy(a as i64, &p.flat, &v)?,
    };
    match perm {
        None => out.reshape(view.shape()),
        Some(perm) => {
            let permuted: Vec<usize> = perm.iter().map(|&d| view.shape()[d]).collect();
            let mut inverse = vec![0usize; perm.len()];
            for (i, &d) in perm.iter().enumerate() {
                inverse[d] = i;
            }
            out.reshape(permuted)?.permute(inverse)?.contiguous()
        }
    }
}

/// `indices` as index items: `None` is a full range.
fn put_items(indices: &[Option<&Tensor>]) -> Vec<TensorIndex> {
    indices
        .iter()
        .map(|t| match t {
            Some(t) => TensorIndex::Tensor((*t).clone()),
            None => TensorIndex::from(..),
        })
        .collect()
}

impl Tensor {
    /// Indexing with index tensors, PyTorch's `x[...]` (`Tensor.__getitem__`):
    /// items are positions and ranges (as [`i`](Self::i) takes them),
    /// [`TensorIndex::NewAxis`], [`TensorIndex::Ellipsis`] and int64 or bool
    /// tensors. Without an index tensor the result is a view, as in PyTorch;
    /// with one, a copy whose gradient flows back to the picked entries
    /// (repeated picks add up). As in PyTorch, the index tensors broadcast to
    /// one shape `B`, which takes the place of the dims they index when those
    /// are next to each other, and comes first when other dims separate them.
    /// A bool mask's true positions are read back to the host; a meta tensor
    /// refuses a mask (its count depends on values).
    ///
    /// ```
    /// # use ember::{Device, Tensor, TensorIndex};
    /// let dev = Device::Cpu;
    /// let x = Tensor::arange(0f32, 12.0, &dev)?.reshape([3, 4])?;
    /// let rows = Tensor::from_vec(vec![2i64, 0], [2], &dev)?;
    /// assert_eq!(x.index(&rows)?.shape(), &[2, 4]); // x[[2, 0]]
    /// let cols = Tensor::from_vec(vec![1i64, -1], [2], &dev)?;
    /// assert_eq!(x.index((&rows, &cols))?.to_vec::<f32>()?, vec![9.0, 3.0]);
    /// assert_eq!(x.index((TensorIndex::Ellipsis, &cols))?.shape(), &[3, 2]);
    /// let big = x.gt(6.0)?; // x[x > 6]
    /// assert_eq!(x.index(&big)?.to_vec::<f32>()?, vec![7.0, 8.0, 9.0, 10.0, 11.0]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn index(&self, index: impl IntoTensorIndex) -> Result<Tensor> {
        let Plan { view, picks, .. } = plan(self, index.tensor_index())?;
        if picks.is_empty() {
            return Ok(view);
        }
        let p = pick(&view, &picks)?;
        let shape = p.result_shape(view.shape());
        let (merged, a, _) = p.merged(&view)?;
        merged.index_select_valid(a, p.flat.clone())?.reshape(shape)
    }

    /// A copy of this tensor with `values` written at `indices`
    /// (`torch.index_put`): one optional index tensor per leading dim (`None`
    /// is the whole dim), int64 or bool, as [`index`](Self::index) takes them;
    /// `values` has this tensor's dtype and broadcasts to the shape indexing
    /// gives. With `accumulate`, values at a repeated position add up;
    /// without, the last one written stays (PyTorch leaves it unspecified).
    /// Gradients flow to this tensor (but at overwritten positions) and to
    /// `values`.
    ///
    /// ```
    /// # use ember::{DType, Device, Tensor};
    /// let dev = Device::Cpu;
    /// let x = Tensor::zeros([4], DType::F32, &dev)?;
    /// let at = Tensor::from_vec(vec![1i64, 3, 1], [3], &dev)?;
    /// let ones = Tensor::ones([3], DType::F32, &dev)?;
    /// let y = x.index_put(&[Some(&at)], &ones, true)?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![0.0, 2.0, 0.0, 1.0]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn index_put(
        &self,
        indices: &[Option<&Tensor>],
        values: &Tensor,
        accumulate: bool,
    ) -> Result<Tensor> {
        let Plan { view, picks, .. } = plan(self, put_items(indices))?;
        put(&view, &picks, values, accumulate)
    }

    /// [`index_put`](Self::index_put) in place (`Tensor.index_put_`). Recorded
    /// by autograd as the other in-place ops are; a leaf that requires a
    /// gradient is refused, as in PyTorch. The values are written through a
    /// copy of the tensor, not by a scatter in its storage.
    pub fn index_put_(
        &self,
        indices: &[Option<&Tensor>],
        values: &Tensor,
        accumulate: bool,
    ) -> Result<()> {
        let recorded = self.check_inplace_target("index_put_", values.requires_grad())?;
        self.check_writable("index_put_")?;
        let out = self.index_put(indices, values, accumulate)?;
        self.store(&out, recorded)
    }

    /// Python's `x[...] = value` (`Tensor.__setitem__`): `value` (a scalar, or
    /// a tensor broadcast to the indexed shape; leading dims of size 1 are
    /// dropped first, as PyTorch drops them) written at `index`, in place.
    /// Without an index tensor it is a [`copy_`](Self::copy_) into the view
    /// the index gives (a tensor value of another dtype is converted); with
    /// one, a tensor value must have this tensor's dtype (PyTorch's rule). A
    /// repeated position keeps the last value written.
    ///
    /// ```
    /// # use ember::{DType, Device, Tensor};
    /// let dev = Device::Cpu;
    /// let x = Tensor::arange(0f32, 6.0, &dev)?.reshape([2, 3])?;
    /// x.index_set_(&x.lt(2.0)?, 0.0)?; // x[x < 2] = 0
    /// x.index_set_((.., Tensor::from_vec(vec![2i64], [1], &dev)?), -1.0)?; // x[:, [2]] = -1
    /// assert_eq!(x.to_vec::<f32>()?, vec![0.0, 0.0, -1.0, 3.0, 4.0, -1.0]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn index_set_<'a>(
        &self,
        index: impl IntoTensorIndex,
        value: impl Into<Operand<'a>>,
    ) -> Result<()> {
        let Plan {
            view,
            sliced,
            picks,
        } = plan(self, index.tensor_index())?;
        let value = match value.into() {
            Operand::Scalar(s) => Tensor::full_scalar(&[], s, view.dtype(), view.device())?,
            Operand::Tensor(v) => {
                let lead = v.shape().iter().take_while(|&&n| n == 1).count();
                v.reshape(&v.shape()[lead..])?
            }
        };
        if picks.is_empty() {
            return view.copy_(&value);
        }
        if sliced {
            // into a view: its values computed, then copied in
            let out = put(&view, &picks, &value, false)?;
            return view.copy_(&out);
        }
        let recorded = self.check_inplace_target("index_put_", value.requires_grad())?;
        self.check_writable("index_put_")?;
        let out = put(&view, &picks, &value, false)?;
        self.store(&out, recorded)
    }

    /// `out` (this tensor's shape and dtype) made this tensor's values, and its
    /// history when `recorded`.
    fn store(&self, out: &Tensor, recorded: bool) -> Result<()> {
        if recorded {
            self.write_history(out)
        } else {
            no_grad(|| self.copy_(out))
        }
    }
}
