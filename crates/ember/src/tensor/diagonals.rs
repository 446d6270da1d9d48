//! Diagonals and grids: `diagonal` (a strided view), `diag`, `diag_embed`,
//! `trace`, `block_diag`, the triangle index lists `tril_indices` and
//! `triu_indices`, `meshgrid`, `cartesian_prod` and `logspace`. Composites of
//! views, `cat`, `index_select` with indices ember builds in range, and
//! elementwise ops; `diagonal` records the one backward rule here (its
//! gradient is written into the same diagonal of zeros).
//!
//! ```
//! use ember::{Device, Tensor};
//! let m = Tensor::arange(0i64, 9, &Device::Cpu)?.reshape([3, 3])?;
//! assert_eq!(m.diagonal(0, 0, 1)?.to_vec::<i64>()?, [0, 4, 8]);
//! assert_eq!(m.trace()?.item::<i64>()?, 12);
//! # Ok::<(), ember::Error>(())
//! ```

use super::Tensor;
use crate::layout::{normalize_dim, Layout};
use crate::{
    device::Device,
    dtype::{CpuData, DType},
    error::{Error, Result},
};

/// The layout of the diagonal `offset` of dims `d1` and `d2` of `l`: those
/// dims removed, a last dim of the diagonal's length whose stride steps both.
fn diagonal_layout(l: &Layout, offset: i64, d1: usize, d2: usize) -> Layout {
    let (n1, n2) = (l.shape()[d1] as i64, l.shape()[d2] as i64);
    let (s1, s2) = (l.strides()[d1], l.strides()[d2]);
    let len = if offset >= 0 {
        n1.min(n2 - offset)
    } else {
        (n1 + offset).min(n2)
    }
    .max(0) as usize;
    let start = match (len, offset >= 0) {
        (0, _) => l.offset(),
        (_, true) => l.offset() + offset as usize * s2,
        (_, false) => l.offset() + offset.unsigned_abs() as usize * s1,
    };
    let keep = |v: &[usize]| -> Vec<usize> {
        v.iter()
            .enumerate()
            .filter(|&(i, _)| i != d1 && i != d2)
            .map(|(_, &x)| x)
            .collect()
    };
    let mut shape = keep(l.shape());
    let mut strides = keep(l.strides());
    shape.push(len);
    strides.push(s1 + s2);
    Layout::strided(&shape, &strides, start)
}

/// Which `(rows, cols)` elements of a `rows × cols` grid lie on or below
/// (`lower`) or on or above the diagonal `offset`, row by row.
fn triangle_positions(rows: usize, cols: usize, offset: i64, lower: bool) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    for r in 0..rows as i64 {
        for c in 0..cols as i64 {
            if (lower && c - r <= offset) || (!lower && c - r >= offset) {
                out.push((r, c));
            }
        }
    }
    out
}

impl Tensor {
    /// The diagonal `offset` of the matrices in dims `dim1` and `dim2`
    /// (`torch.diagonal`): a view, those dims removed and the diagonal
    /// appended as the last dim. `offset > 0` is above the main diagonal,
    /// `< 0` below; an offset past the edge gives an empty diagonal.
    ///
    /// ```
    /// # use ember::{Device, Tensor};
    /// let m = Tensor::arange(0i64, 6, &Device::Cpu)?.reshape([2, 3])?;
    /// assert_eq!(m.diagonal(1, 0, 1)?.to_vec::<i64>()?, [1, 5]);
    /// assert_eq!(m.diagonal(-1, 0, 1)?.to_vec::<i64>()?, [3]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn diagonal(&self, offset: i64, dim1: i64, dim2: i64) -> Result<Tensor> {
        const OP: &str = "diagonal";
        let d1 = normalize_dim(OP, dim1, self.rank())?;
        let d2 = normalize_dim(OP, dim2, self.rank())?;
        if d1 == d2 {
            return Err(Error::invalid(
                OP,
                format!("diagonal dimensions cannot be identical {dim1}, {dim2}"),
            ));
        }
        let out = self.with_layout(diagonal_layout(self.layout(), offset, d1, d2));
        Ok(Tensor::record_reusable(out, OP, &[self], |_| {
            let (shape, dtype, device) = (self.shape().to_vec(), self.dtype(), self.device());
            move |g: &Tensor| {
                let z = crate::autograd::no_grad(|| -> Result<Tensor> {
                    let z = Tensor::zeros(&shape, dtype, &device)?;
                    z.with_layout(diagonal_layout(z.layout(), offset, d1, d2))
                        .copy_(g)?;
                    Ok(z)
                })?;
                // recorded where the gradient has a history (a walk that creates
                // a graph): its own gradient is the diagonal of the incoming one
                Ok(vec![Some(Tensor::record_reusable(
                    z,
                    "diagonal_backward",
                    &[g],
                    |_| {
                        move |gg: &Tensor| {
                            Ok(vec![Some(gg.diagonal(offset, d1 as i64, d2 as i64)?)])
                        }
                    },
                ))])
            }
        }))
    }

    /// `torch.diag`: of a 1-D tensor, the square matrix with it on the
    /// diagonal `diagonal` (zeros elsewhere); of a matrix, a copy of its
    /// diagonal `diagonal` as a 1-D tensor.
    ///
    /// ```
    /// # use ember::{Device, Tensor};
    /// let v = Tensor::new([1i64, 2], &Device::Cpu)?;
    /// assert_eq!(v.diag(1)?.to_vec2::<i64>()?, vec![vec![0, 1, 0], vec![0, 0, 2], vec![0, 0, 0]]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn diag(&self, diagonal: i64) -> Result<Tensor> {
        match self.rank() {
            1 => self.diag_embed(diagonal, 0, 1),
            2 => self.diagonal(diagonal, 0, 1)?.copy(),
            r => Err(Error::invalid(
                "diag",
                format!("diag(): Supports 1D or 2D tensors. Got {r}D"),
            )),
        }
    }

    /// Each vector along the last dim placed on the diagonal `offset` of a
    /// matrix in the output's dims `dim1` and `dim2`, zeros elsewhere
    /// (`torch.diag_embed`): the output has one dim more, and those two dims
    /// have the vectors' length plus `|offset|`.
    pub fn diag_embed(&self, offset: i64, dim1: i64, dim2: i64) -> Result<Tensor> {
        const OP: &str = "diag_embed";
        let r = self.rank() + 1;
        let d1 = normalize_dim(OP, dim1, r)?;
        let d2 = normalize_dim(OP, dim2, r)?;
        if d1 == d2 {
            return Err(Error::invalid(
                OP,
                format!("diagonal dimensions cannot be identical {dim1}, {dim2}"),
            ));
        }
        let x = self.atleast_1d()?;
        let n = *x.shape().last().expect("at least 1-D");
        let m = n
            .checked_add(offset.unsigned_abs() as usize)
            .ok_or_else(|| Error::invalid(OP, format!("offset {offset} is too large")))?;
        let mut out_shape: Vec<usize> = x.shape()[..x.rank() - 1].to_vec();
        out_shape.extend([m, m]);
        crate::layout::checked_numel(OP, &out_shape)?;
        // element (i, j) takes the vector's entry `i - r0` where `j - i` is the
        // offset, else the zero put in front of each vector (index 0)
        let dev = x.device();
        let rows = Tensor::affine_iota(m, 0, 1, &dev)?.unsqueeze(1)?;
        let cols = Tensor::affine_iota(m, 0, 1, &dev)?.unsqueeze(0)?;
        let on = cols.sub(&rows)?.eq(offset)?;
        let r0 = (-offset).max(0);
        let idx = on
            .where_(&rows.add(1 - r0)?, 0i64)?
            .reshape([m * m])?
            .contiguous()?;
        let mut zshape = x.shape().to_vec();
        *zshape.last_mut().expect("at least 1-D") = 1;
        let zero = Tensor::zeros(&zshape, x.dtype(), &dev)?;
        let padded = Tensor::cat(&[&zero, &x], -1)?;
        let last = padded.rank() - 1;
        let flat = padded.index_select_valid(last, idx)?;
        let y = flat.reshape(&out_shape)?;
        y.movedim([r as i64 - 2, r as i64 - 1], [d1 as i64, d2 as i64])
    }

    /// The sum of a matrix's main diagonal (`torch.trace`): a 0-d tensor,
    /// int64 for integer matrices, as [`sum_all`](Self::sum_all); bool is
    /// refused, as in PyTorch.
    pub fn trace(&self) -> Result<Tensor> {
        if self.rank() != 2 {
            return Err(Error::invalid(
                "trace",
                format!(
                    "trace: expected a matrix, but got tensor with dim {}",
                    self.rank()
                ),
            ));
        }
        if self.dtype() == DType::Bool {
            return Err(Error::dtype(
                "trace",
                self.dtype(),
                "\"trace\" not implemented for 'Bool'",
            ));
        }
        self.diagonal(0, 0, 1)?.sum_all()
    }

    /// The matrices placed along the diagonal of one matrix, zeros elsewhere
    /// (`torch.block_diag`): a 0-d tensor counts as `[1, 1]`, a 1-D one of `n`
    /// elements as `[1, n]`; dtypes promote. The list must not be empty
    /// (the result's device comes from it).
    ///
    /// ```
    /// # use ember::{Device, Tensor};
    /// let dev = Device::Cpu;
    /// let a = Tensor::new([[1i64, 2]], &dev)?;
    /// let b = Tensor::new(3i64, &dev)?;
    /// assert_eq!(Tensor::block_diag(&[&a, &b])?.to_vec2::<i64>()?, vec![vec![1, 2, 0], vec![0, 0, 3]]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn block_diag(tensors: &[&Tensor]) -> Result<Tensor> {
        const OP: &str = "block_diag";
        let first = tensors
            .first()
            .ok_or_else(|| Error::invalid(OP, "block_diag expects a non-empty list of tensors"))?;
        let dev = super::same_device(OP, tensors)?;
        let mut mats = Vec::with_capacity(tensors.len());
        for (i, t) in tensors.iter().enumerate() {
            mats.push(match t.rank() {
                0 => t.reshape([1, 1])?,
                1 => t.unsqueeze(0)?,
                2 => (*t).clone(),
                r => {
                    return Err(Error::invalid(
                        OP,
                        format!("torch.block_diag: Input tensors must have 2 or fewer dimensions. Input {i} has {r} dimensions"),
                    ))
                }
            });
        }
        let dtype = tensors
            .iter()
            .fold(first.dtype(), |a, t| DType::promote(a, t.dtype()));
        let cols: usize = mats.iter().map(|m| m.shape()[1]).sum();
        let mut rows = Vec::with_capacity(mats.len());
        let mut at = 0;
        for m in &mats {
            let (h, w) = (m.shape()[0], m.shape()[1]);
            let left = Tensor::zeros([h, at], dtype, &dev)?;
            let right = Tensor::zeros([h, cols - at - w], dtype, &dev)?;
            rows.push(Tensor::cat(&[&left, &m.to_dtype(dtype)?, &right], 1)?);
            at += w;
        }
        Tensor::cat(&rows.iter().collect::<Vec<_>>(), 0)
    }

    /// The coordinates of the lower triangle (on and below the diagonal
    /// `offset`) of a `row × col` matrix, row by row (`torch.tril_indices`):
    /// an int64 tensor of shape `[2, n]`, the rows then the columns.
    ///
    /// ```
    /// # use ember::{Device, Tensor};
    /// let i = Tensor::tril_indices(3, 3, 0, &Device::Cpu)?;
    /// assert_eq!(i.to_vec2::<i64>()?, vec![vec![0, 1, 1, 2, 2, 2], vec![0, 0, 1, 0, 1, 2]]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn tril_indices(row: usize, col: usize, offset: i64, device: &Device) -> Result<Tensor> {
        Tensor::triangle_indices(row, col, offset, true, device)
    }

    /// The coordinates of the upper triangle (on and above the diagonal
    /// `offset`) of a `row × col` matrix, row by row (`torch.triu_indices`):
    /// an int64 tensor of shape `[2, n]`.
    pub fn triu_indices(row: usize, col: usize, offset: i64, device: &Device) -> Result<Tensor> {
        Tensor::triangle_indices(row, col, offset, false, device)
    }

    fn triangle_indices(
        row: usize,
        col: usize,
        offset: i64,
        lower: bool,
        device: &Device,
    ) -> Result<Tensor> {
        let op = if lower {
            "tril_indices"
        } else {
            "triu_indices"
        };
        crate::layout::checked_numel(op, &[row, col])?;
        // the count without listing them, so that meta lists nothing
        let n = (0..row as i64)
            .map(|r| {
                let (lo, hi) = if lower {
                    (0, (r + offset).min(col as i64 - 1))
                } else {
                    ((r + offset).max(0), col as i64 - 1)
                };
                (hi - lo + 1).max(0) as usize
            })
            .sum::<usize>();
        Tensor::from_host_with(&[2, n], DType::I64, *device, || {
            let pos = triangle_positions(row, col, offset, lower);
            let mut v: Vec<i64> = pos.iter().map(|p| p.0).collect();
            v.extend(pos.iter().map(|p| p.1));
            Ok(CpuData::I64(v))
        })
    }

    /// Coordinate grids of 0-d or 1-D tensors (`torch.meshgrid`): output `i`
    /// holds tensor `i`'s values along dim `i` of the grid, whose shape lists
    /// the tensors' lengths. `indexing` is `"ij"` (matrix order) or `"xy"`
    /// (the first two dims swapped, as NumPy's default). Each output is a view
    /// (an expanded tensor) of its input. The tensors share one dtype and
    /// device.
    ///
    /// ```
    /// # use ember::{Device, Tensor};
    /// let dev = Device::Cpu;
    /// let (x, y) = (Tensor::new([1i64, 2, 3], &dev)?, Tensor::new([7i64, 8], &dev)?);
    /// let g = Tensor::meshgrid(&[&x, &y], "ij")?;
    /// assert_eq!(g[1].to_vec2::<i64>()?, vec![vec![7, 8], vec![7, 8], vec![7, 8]]);
    /// assert_eq!(Tensor::meshgrid(&[&x, &y], "xy")?[0].shape(), &[2, 3]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn meshgrid(tensors: &[&Tensor], indexing: &str) -> Result<Vec<Tensor>> {
        const OP: &str = "meshgrid";
        let first = tensors
            .first()
            .ok_or_else(|| Error::invalid(OP, "torch.meshgrid: Expected at least one tensor"))?;
        if indexing != "ij" && indexing != "xy" {
            return Err(Error::invalid(
                OP,
                format!("torch.meshgrid: indexing must be one of \"xy\" or \"ij\", but received: {indexing}"),
            ));
        }
        for t in tensors {
            if t.rank() > 1 {
                return Err(Error::invalid(
                    OP,
                    format!(
                        "torch.meshgrid: Expected 0D or 1D tensor in the tensor list but got: {}D",
                        t.rank()
                    ),
                ));
            }
        }
        for t in &tensors[1..] {
            if t.dtype() != first.dtype() {
                return Err(Error::invalid(
                    OP,
                    "meshgrid expects all tensors to have the same dtype",
                ));
            }
        }
        super::same_device(OP, tensors)?;
        let swap = indexing == "xy" && tensors.len() >= 2;
        let mut order: Vec<usize> = (0..tensors.len()).collect();
        if swap {
            order.swap(0, 1);
        }
        let shape: Vec<usize> = order.iter().map(|&i| tensors[i].numel()).collect();
        tensors
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let at = order
                    .iter()
                    .position(|&o| o == i)
                    .expect("every tensor placed");
                let mut view = vec![1usize; shape.len()];
                view[at] = shape[at];
                t.reshape(&view)?.expand(&shape)
            })
            .collect()
    }

    /// The Cartesian product of 1-D tensors (`torch.cartesian_prod`): a
    /// `[n, k]` tensor whose rows are every combination, the last tensor
    /// varying fastest; one tensor is returned as it is.
    pub fn cartesian_prod(tensors: &[&Tensor]) -> Result<Tensor> {
        const OP: &str = "cartesian_prod";
        for t in tensors {
            if t.rank() != 1 {
                return Err(Error::invalid(
                    OP,
                    format!("Expect a 1D vector, but got shape {:?}", t.shape()),
                ));
            }
        }
        if tensors.len() == 1 {
            return Ok(tensors[0].clone());
        }
        let grids = Tensor::meshgrid(tensors, "ij")?;
        let cols: Vec<Tensor> = grids
            .iter()
            .map(|g| g.reshape([-1i64]))
            .collect::<Result<_>>()?;
        Tensor::stack(&cols.iter().collect::<Vec<_>>(), 1)
    }

    /// `steps` values from `base^start` to `base^end`, evenly spaced in the
    /// exponent (`torch.logspace`). Computed in float64 (`base` raised to the
    /// float64 `linspace`), then converted to `dtype` (integers truncate).
    ///
    /// ```
    /// # use ember::{DType, Device, Tensor};
    /// let t = Tensor::logspace(0.0, 2.0, 3, 10.0, DType::I64, &Device::Cpu)?;
    /// assert_eq!(t.to_vec::<i64>()?, [1, 10, 100]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn logspace(
        start: f64,
        end: f64,
        steps: usize,
        base: f64,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        if dtype == DType::Bool {
            return Err(Error::dtype(
                "logspace",
                dtype,
                "\"logspace_cpu\" not implemented for 'Bool'",
            ));
        }
        let exps = Tensor::linspace(start, end, steps, DType::F64, device)?;
        Tensor::full([steps], base, DType::F64, device)?
            .pow(&exps)?
            .to_dtype(dtype)
    }
}
