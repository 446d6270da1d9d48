//! Ops that move or mask elements without arithmetic: `flip`, `roll`, `repeat`,
//! `tril`/`triu` and `pad`. Each is a composite of views, `cat`, `index_select`
//! with indices ember builds itself (in range by construction, so not checked on
//! the device) and `masked_fill`: they run on every device and autograd needs no
//! rule of their own. The indices and masks are computed on the tensor's device
//! from counts ([`Tensor::affine_iota`]), never copied from the host, so these
//! ops run inside a CUDA graph capture too.

use super::shape::{dim_list, IntoDims};
use super::{Scalar, Tensor};
use crate::layout::normalize_dim;
use crate::{
    dtype::DType,
    error::{Error, Result},
};

/// How [`Tensor::pad`] fills the new border (`F.pad`'s `mode`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PadMode {
    /// A constant value (`mode="constant"`, `value=`).
    Constant(f64),
    /// The mirror image without the edge element: `[1, 2, 3]` padded by 2 on the
    /// left gives `[3, 2, 1, 2, 3]`.
    Reflect,
    /// The edge element repeated.
    Replicate,
    /// The other end's elements, as if the dim were a ring.
    Circular,
}

impl PadMode {
    fn name(self) -> &'static str {
        match self {
            PadMode::Constant(_) => "constant",
            PadMode::Reflect => "reflect",
            PadMode::Replicate => "replicate",
            PadMode::Circular => "circular",
        }
    }
}

impl Tensor {
    /// The elements in reverse order along each of `dims` (`torch.flip`): a copy.
    pub fn flip(&self, dims: impl IntoDims) -> Result<Tensor> {
        let dims = dim_list("flip", &dims, self.rank().max(1))?;
        if self.rank() == 0 {
            return self.copy();
        }
        // (an empty tensor flips to itself, whatever its other dims hold)
        if self.numel() == 0 {
            return self.copy();
        }
        let mut t = self.clone();
        for &d in &dims {
            let n = self.shape()[d];
            let idx = Tensor::affine_iota(n, n as i64 - 1, -1, &self.device())?;
            t = t.index_select_valid(d, idx)?;
        }
        if dims.is_empty() {
            t = t.copy()?;
        }
        Ok(t)
    }

    /// The elements shifted by `shifts[i]` along `dims[i]`, those pushed past the
    /// end coming back at the start (`torch.roll`). With no dims, the tensor is
    /// rolled as if flattened and keeps its shape.
    pub fn roll(&self, shifts: &[i64], dims: &[i64]) -> Result<Tensor> {
        if dims.is_empty() {
            if shifts.len() != 1 {
                return Err(Error::invalid(
                    "roll",
                    format!(
                        "shifts and dimensions must align. shifts: {}, dims:0",
                        shifts.len()
                    ),
                ));
            }
            return self
                .flatten_all()?
                .roll(shifts, &[0])?
                .reshape(self.shape());
        }
        if shifts.len() != dims.len() {
            return Err(Error::invalid(
                "roll",
                format!(
                    "shifts and dimensions must align. shifts: {}, dims:{}",
                    shifts.len(),
                    dims.len()
                ),
            ));
        }
        if self.rank() == 0 {
            return Err(Error::invalid(
                "roll",
                format!(
                    "Dimension specified as {} but tensor has no dimensions (a 0-d tensor rolls only with no dims given)",
                    dims[0]
                ),
            ));
        }
        let mut t = self.clone();
        for (&shift, &dim) in shifts.iter().zip(dims) {
            let d = normalize_dim("roll", dim, self.rank())?;
            let n = self.shape()[d] as i64;
            let s = if n == 0 { 0 } else { shift.rem_euclid(n) };
            if s != 0 {
                let tail = t.narrow(d as i64, n - s, s as usize)?;
                let head = t.narrow(d as i64, 0, (n - s) as usize)?;
                t = Tensor::cat(&[&tail, &head], d as i64)?;
            }
        }
        if t.same_storage(self) {
            t = t.copy()?;
        }
        Ok(t)
    }

    /// The tensor tiled `sizes[i]` times along each dim (`Tensor.repeat`); `sizes`
    /// may be longer than the rank, adding leading dims.
    pub fn repeat(&self, sizes: &[usize]) -> Result<Tensor> {
        if sizes.len() < self.rank() {
            return Err(Error::invalid(
                "repeat",
                "Number of dimensions of repeat dims can not be smaller than number of dimensions of tensor",
            ));
        }
        let lead = sizes.len() - self.rank();
        let mut shape = vec![1usize; lead];
        shape.extend_from_slice(self.shape());
        // [r0, s0, r1, s1, ...]: each size behind its repeat count, expanded, then
        // merged pairwise
        let mut split = Vec::with_capacity(2 * sizes.len());
        let mut expanded = Vec::with_capacity(2 * sizes.len());
        for (&r, &s) in sizes.iter().zip(&shape) {
            split.extend([1, s]);
            expanded.extend([r, s]);
        }
        let out = sizes
            .iter()
            .zip(&shape)
            .map(|(r, s)| r.checked_mul(*s))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| {
                Error::invalid(
                    "repeat",
                    format!("repeating {:?} by {sizes:?} overflows a size", self.shape()),
                )
            })?;
        self.reshape(&split)?
            .expand(&expanded)?
            .contiguous()?
            .reshape(&out)
    }

    /// The lower triangle of the last two dims (`torch.tril`): elements with
    /// `col - row <= diagonal` are kept, the rest set to 0.
    pub fn tril(&self, diagonal: i64) -> Result<Tensor> {
        self.triangle("tril", diagonal, true)
    }

    /// The upper triangle of the last two dims (`torch.triu`): elements with
    /// `col - row >= diagonal` are kept, the rest set to 0.
    pub fn triu(&self, diagonal: i64) -> Result<Tensor> {
        self.triangle("triu", diagonal, false)
    }

    fn triangle(&self, op: &'static str, k: i64, lower: bool) -> Result<Tensor> {
        if self.rank() < 2 {
            return Err(Error::invalid(
                op,
                format!("{op}: input tensor must have at least 2 dimensions"),
            ));
        }
        // (nothing to mask in an empty tensor, however wide its last dims)
        if self.numel() == 0 {
            return self.copy();
        }
        let (m, n) = (self.shape()[self.rank() - 2], self.shape()[self.rank() - 1]);
        // the elements tril(k) sets to 0 are those triu(k + 1) keeps, and the
        // other way round
        let zeroed = if lower {
            Tensor::triangle_mask(m, n, k.saturating_add(1), false, &self.device())?
        } else {
            Tensor::triangle_mask(m, n, k.saturating_sub(1), true, &self.device())?
        };
        let zero = if self.dtype() == DType::Bool {
            Scalar::Bool(false)
        } else {
            Scalar::Int(0)
        };
        self.masked_fill(&zeroed, zero)
    }

    /// The `[m, n]` bool mask of the elements `tril(k)` keeps (`lower`), or
    /// `triu(k)`'s, built on `device` (no values from the host, so in a CUDA
    /// graph capture too): a causal attention mask is `triangle_mask(l, s, 0,
    /// true)`, its blocked keys `triangle_mask(l, s, 1, false)`.
    pub(crate) fn triangle_mask(
        m: usize,
        n: usize,
        k: i64,
        lower: bool,
        device: &crate::device::Device,
    ) -> Result<Tensor> {
        // each column against its row's diagonal, `row + k`, broadcast (no [m, n]
        // of integers); `col - row` lies in `(-m, n)`, so a `k` beyond that
        // range masks as its end does
        let k = k.clamp(-(m as i64), n as i64);
        let diagonal = Tensor::affine_iota(m, k, 1, device)?.unsqueeze(1)?;
        let cols = Tensor::affine_iota(n, 0, 1, device)?.unsqueeze(0)?;
        if lower {
            cols.le(&diagonal)
        } else {
            cols.ge(&diagonal)
        }
    }

    /// Pads (or, with negative amounts, crops) the last dims (`F.pad`): `pads` is
    /// `[left, right]` for the last dim, then `[top, bottom]` for the one before,
    /// and so on. `Reflect`, `Replicate` and `Circular` pad the last 1, 2 or 3 dims
    /// of an input with one or two leading (batch, channel) dims, as in PyTorch.
    pub fn pad(&self, pads: &[i64], mode: PadMode) -> Result<Tensor> {
        // reflection (of 1 or 2 dims: not reflection_pad3d) and replication
        // padding are on PyTorch's CPU autocast float32 list
        if mode == PadMode::Replicate || (mode == PadMode::Reflect && pads.len() <= 4) {
            if let Some(c) = crate::tensor::autocast::to_f32_cpu(&[self])? {
                return c[0].pad(pads, mode);
            }
        }
        if !pads.len().is_multiple_of(2) {
            return Err(Error::invalid(
                "pad",
                "Padding length must be divisible by 2",
            ));
        }
        let k = pads.len() / 2;
        if k > self.rank() {
            return Err(Error::invalid(
                "pad",
                format!(
                    "Padding length should be less than or equal to two times the input dimension but got padding length {} and input of dimension {}",
                    pads.len(),
                    self.rank()
                ),
            ));
        }
        if let PadMode::Constant(v) = mode {
            // a value the dtype cannot hold is an error, as in `full` (-inf for int64)
            super::create::check_fill_value("pad", Scalar::Float(v), self.dtype())?;
        } else {
            if !(1..=3).contains(&k) || !(k + 1..=k + 2).contains(&self.rank()) {
                return Err(Error::invalid(
                    "pad",
                    format!(
                        "Padding size {} is not supported for {}D input tensor ({} padding pads the last 1, 2 or 3 dims of an input with 1 or 2 more dims)",
                        pads.len(),
                        self.rank(),
                        mode.name()
                    ),
                ));
            }
            let kernel = match mode {
                PadMode::Reflect => Some("reflection"),
                PadMode::Replicate => Some("replication"),
                _ => None,
            };
            if let Some(kernel) = kernel {
                if self.dtype() == DType::Bool {
                    return Err(Error::dtype(
                        "pad",
                        DType::Bool,
                        format!("\"{kernel}_pad{k}d\" not implemented for 'Bool'"),
                    ));
                }
                // only a batch dim (one more than the padded dims and a channel
                // dim) may be empty
                if self.shape()[self.rank() - k - 1..].contains(&0) {
                    return Err(Error::invalid(
                        "pad",
                        format!(
                            "Expected {}D or {}D (batch mode) tensor with possibly 0 batch size and other non-zero dimensions for input, but got: {:?} ({} padding)",
                            k + 1,
                            k + 2,
                            self.shape(),
                            mode.name()
                        ),
                    ));
                }
            }
        }
        let mut t = self.clone();
        for i in 0..k {
            let d = self.rank() - 1 - i;
            let (l, r) = (pads[2 * i], pads[2 * i + 1]);
            let n = self.shape()[d] as i64;
            let bad = |what: &str| {
                Error::invalid(
                    "pad",
                    format!(
                        "{what}: padding ({l}, {r}) at dimension {d} of input {:?} ({} padding)",
                        self.shape(),
                        mode.name()
                    ),
                )
            };
            let len = n
                .checked_add(l)
                .and_then(|v| v.checked_add(r))
                .ok_or_else(|| bad("the padded size overflows"))?;
            // what is left of the input once negative pads have cropped it
            let core = n + l.min(0) + r.min(0);
            match mode {
                // PyTorch crops with narrow first
                PadMode::Constant(_) | PadMode::Circular if core < 0 => {
                    return Err(bad(
                        "narrow(): length must be non-negative (negative padding crops more than the input holds)",
                    ))
                }
                PadMode::Reflect if l >= n || r >= n => {
                    return Err(bad(
                        "Argument #4: Padding size should be less than the corresponding input dimension, but got",
                    ))
                }
                PadMode::Reflect | PadMode::Replicate if len < 1 => {
                    return Err(bad(&format!(
                        "input (W: {n}) is too small. Calculated output W: {len}"
                    )))
                }
                // the border wraps around what is left of the input, at most once
                PadMode::Circular if l > core || r > core => {
                    return Err(bad("Padding value causes wrapping around more than once."))
                }
                _ => {}
            }
            t = match mode {
                PadMode::Constant(v) => t.pad_constant(d, l, r, v)?,
                _ => {
                    t.index_select_valid(d, pad_indices(mode, n, l, len, core, &self.device())?)?
                }
            };
        }
        if t.same_storage(self) {
            t = t.copy()?;
        }
        // PyTorch's constant, reflection and replication pads keep the input's
        // memory format; circular padding's result is row-major
        let format = match mode {
            PadMode::Circular => crate::layout::MemoryFormat::Contiguous,
            _ => self.suggest_memory_format(),
        };
        t.laid_out(format)
    }

    /// `l` elements of `value` before and `r` after along `d` (negative: cropped).
    fn pad_constant(&self, d: usize, l: i64, r: i64, value: f64) -> Result<Tensor> {
        let n = self.shape()[d] as i64;
        let start = (-l).max(0);
        let end = n - (-r).max(0);
        let mut t = self.narrow(d as i64, start, (end - start).max(0) as usize)?;
        // PyTorch casts the value to the tensor's dtype (2.5 pads an int tensor with 2)
        let value = match self.dtype() {
            DType::Bool => Scalar::Bool(value != 0.0),
            dt if dt.is_float() => Scalar::Float(value),
            _ => Scalar::Int(value as i64),
        };
        let mut parts = Vec::new();
        for amount in [l, r] {
            let mut shape = t.shape().to_vec();
            shape[d] = amount.max(0) as usize;
            parts.push(Tensor::full(&shape, value, self.dtype(), &self.device())?);
        }
        if l > 0 || r > 0 {
            t = Tensor::cat(&[&parts[0], &t, &parts[1]], d as i64)?;
        }
        Ok(t)
    }
}

/// The input's index for each of the `len` positions `j` in `-l..n + r` of a dim
/// of size `n` padded by `mode` (`core`: what negative pads leave of it), int64
/// on `device`.
fn pad_indices(
    mode: PadMode,
    n: i64,
    l: i64,
    len: i64,
    core: i64,
    device: &crate::device::Device,
) -> Result<Tensor> {
    let len = len as usize;
    match mode {
        // the mirror image: j modulo the period 2(n - 1), folded back above n - 1
        PadMode::Reflect => {
            let p = Tensor::affine_iota(len, -l, 1, device)?.remainder(2 * (n - 1).max(1))?;
            let folded = p.mul(-1)?.add(2 * (n - 1))?;
            p.lt(n)?.where_(&p, &folded)
        }
        PadMode::Replicate => Tensor::affine_iota(len, -l, 1, device)?.clamp(Some(0), Some(n - 1)),
        // relative to the cropped input
        _ => Tensor::affine_iota(len, -l + l.min(0), 1, device)?
            .remainder(core.max(1))?
            .add((-l).max(0)),
    }
}
