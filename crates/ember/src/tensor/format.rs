//! Memory formats (`torch.channels_last`): asking for one, and laying out results
//! in the order PyTorch gives them (the operands' order for elementwise ops, the
//! input's for copies, convolution, batch norm and pooling).

use super::Tensor;
use crate::backend::Storage;
use crate::error::{Error, Result};
use crate::layout::{format_strides, Dims, Layout, MemoryFormat};

impl Tensor {
    /// Whether the elements are dense in `format`'s order (PyTorch's
    /// `is_contiguous(memory_format=...)`). Channels-last needs rank 4.
    ///
    /// ```
    /// use ember::{DType, Device, MemoryFormat, Tensor};
    /// let x = Tensor::zeros([2, 3, 4, 5], DType::F32, &Device::Cpu)?;
    /// let y = x.to_memory_format(MemoryFormat::ChannelsLast)?;
    /// assert_eq!(y.stride(), &[60, 1, 15, 3]);
    /// assert!(y.is_contiguous_in(MemoryFormat::ChannelsLast) && !y.is_contiguous());
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn is_contiguous_in(&self, format: MemoryFormat) -> bool {
        self.layout().is_contiguous_in(format)
    }

    /// The memory format this tensor's strides suggest (PyTorch's
    /// `suggest_memory_format()`): channels-last for a rank-4 tensor whose channels
    /// are innermost, else row-major. Convolution, batch norm and pooling give
    /// their output (and the input's gradient) this format of their input.
    pub fn suggest_memory_format(&self) -> MemoryFormat {
        self.layout().suggest_memory_format()
    }

    /// This tensor laid out in `format` (`x.contiguous(memory_format=...)`): the
    /// tensor itself when it already is dense in that order, else a copy. The
    /// gradient flows back unchanged, as through [`contiguous`](Self::contiguous).
    /// Channels-last needs a rank-4 tensor, as in PyTorch. (PyTorch's
    /// `x.to(memory_format=...)` decides by [`suggest_memory_format`] instead, and
    /// so copies a tensor dense in both orders, such as `[n, c, 1, 1]`, to the
    /// format's exact strides: [`Module::to_memory_format`] does that.)
    ///
    /// [`suggest_memory_format`]: Self::suggest_memory_format
    /// [`Module::to_memory_format`]: crate::nn::Module::to_memory_format
    pub fn to_memory_format(&self, format: MemoryFormat) -> Result<Tensor> {
        if format == MemoryFormat::ChannelsLast && self.rank() != 4 {
            return Err(Error::invalid(
                "to_memory_format",
                format!(
                    "required rank 4 tensor to use channels_last format, got rank {}",
                    self.rank()
                ),
            ));
        }
        if self.is_contiguous_in(format) {
            return Ok(self.clone());
        }
        let strides = format_strides(self.shape(), format);
        let out = crate::autograd::no_grad(|| self.copy_with_strides(strides))?;
        Ok(Tensor::record_twice(
            out,
            "to_memory_format",
            &[self],
            |_| |g: &Tensor| Ok(vec![Some(g.clone())]),
        ))
    }

    /// This tensor dense in channels-last order (`cl`) or row-major, as a
    /// primitive that computes in that order takes it: itself where it already
    /// is, else a copy.
    pub(crate) fn in_order(&self, cl: bool) -> Result<Tensor> {
        match cl {
            true => self.to_memory_format(MemoryFormat::ChannelsLast),
            false => self.contiguous(),
        }
    }

    /// A primitive's fresh result, written in channels-last order (`cl`) or
    /// row-major, as a tensor of `dims` (the order's exact strides).
    pub(crate) fn from_storage_in(storage: Storage, dims: &[usize], cl: bool) -> Tensor {
        let f = match cl {
            true => MemoryFormat::ChannelsLast,
            false => MemoryFormat::Contiguous,
        };
        Tensor::with_storage(storage, Layout::with_strides(dims, format_strides(dims, f)))
    }

    /// A copy of the values with `format`'s exact strides (no history).
    pub(crate) fn copy_in_format(&self, format: MemoryFormat) -> Result<Tensor> {
        self.copy_with_strides(format_strides(self.shape(), format))
    }

    /// A copy of the values stored in the dense order of `strides` (no history).
    fn copy_with_strides(&self, strides: Dims) -> Result<Tensor> {
        let src = self.layout().permute(&Layout::dense_order(&strides));
        let out = self.read().copy(&src)?;
        Ok(Tensor::with_storage(
            out,
            Layout::with_strides(self.shape(), strides),
        ))
    }

    /// An op's result laid out in `format` with exactly that format's strides, as
    /// PyTorch allocates an op's output in it: relabelled where the elements
    /// already lie in that order (its history kept), else copied (recorded as
    /// [`to_memory_format`](Self::to_memory_format) where it has a history).
    pub(crate) fn laid_out(self, format: MemoryFormat) -> Result<Tensor> {
        if format == MemoryFormat::ChannelsLast && self.rank() != 4 {
            return Ok(self);
        }
        let strides = format_strides(self.shape(), format);
        if self.stride() == strides.as_slice() {
            return Ok(self);
        }
        let node = self.node();
        if self.is_contiguous_in(format) && self.layout().offset() == 0 {
            let layout = Layout::with_strides(self.shape(), strides);
            return Ok(self.alias(layout, self.0.is_view, node));
        }
        if node.is_some() {
            return self.to_memory_format(format);
        }
        crate::autograd::no_grad(|| self.copy_with_strides(strides))
    }

    /// `t`, a fresh row-major tensor of this shape holding one value everywhere
    /// (or none yet), with the strides PyTorch's `preserve_format` gives a tensor
    /// made like this one (`zeros_like`, `empty_like`): its values are the same in
    /// any order, so only the layout changes.
    pub(crate) fn fill_like(&self, t: Tensor) -> Tensor {
        match self.layout().preserved_strides() {
            None => t,
            Some(strides) => t.alias(Layout::with_strides(self.shape(), strides), false, None),
        }
    }

    /// `g`, a gradient for this leaf, laid out as PyTorch's gradient layout
    /// contract asks: with this tensor's strides where it is dense (a
    /// channels-last parameter gets a channels-last `.grad()`), else row-major.
    /// `g` itself where it already is and `unique` (nothing else holds it), else a
    /// copy (without history: the caller detaches it).
    pub(crate) fn grad_laid_out_for(&self, g: Tensor, unique: bool) -> Result<Tensor> {
        let dense = self.layout().is_non_overlapping_and_dense() && self.shape() == g.shape();
        let obeys = if dense {
            g.shape()
                .iter()
                .zip(g.stride().iter().zip(self.stride()))
                .all(|(&n, (&gs, &ps))| if n != 1 { gs == ps } else { gs != 0 })
        } else {
            g.is_contiguous()
        };
        if unique && obeys {
            return Ok(g);
        }
        if dense {
            let strides = Dims::from_slice(self.stride());
            crate::autograd::no_grad(|| g.copy_with_strides(strides))
        } else {
            g.copy()
        }
    }

    /// `f`'s result over this tensor's storage with the strides PyTorch's
    /// `preserve_format` copies give (`.to(dtype)`, `.to(device)`): this layout's
    /// own where it is dense, else its suggested format's. `f` writes its output
    /// row-major over the layout it is given.
    pub(crate) fn map_storage_preserving(
        &self,
        f: impl FnOnce(&Storage, &Layout) -> Result<Storage>,
    ) -> Result<Tensor> {
        match self.layout().preserved_strides() {
            None => self.map_storage_same(f),
            Some(strides) => self.map_storage_strided(strides, f),
        }
    }

    /// `f`'s result over this tensor's storage with the strides PyTorch's
    /// elementwise ops give (see [`Layout::elementwise_strides`]); `same_shape`:
    /// no other operand is broadcast against this one.
    pub(crate) fn map_storage_elementwise(
        &self,
        same_shape: bool,
        f: impl FnOnce(&Storage, &Layout) -> Result<Storage>,
    ) -> Result<Tensor> {
        match Layout::elementwise_strides(&[self.layout()], same_shape) {
            None => self.map_storage_same(f),
            Some(strides) => self.map_storage_strided(strides, f),
        }
    }

    fn map_storage_strided(
        &self,
        strides: Dims,
        f: impl FnOnce(&Storage, &Layout) -> Result<Storage>,
    ) -> Result<Tensor> {
        let src = self.layout().permute(&Layout::dense_order(&strides));
        let out = f(&self.read(), &src)?;
        Ok(Tensor::with_storage(
            out,
            Layout::with_strides(self.shape(), strides),
        ))
    }
}
