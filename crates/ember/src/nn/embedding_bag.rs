//! Bags of embeddings (`nn.EmbeddingBag`, `F.embedding_bag`): the rows of a
//! table looked up for each bag of indices and reduced to one vector per bag
//! (sum, mean or max) without the `[indices, dim]` intermediate leaving the
//! op. Bags are the rows of a 2-D input, or runs of a 1-D input that
//! `offsets` starts.
//!
//! A composite of index ops, so it runs and differentiates on every device:
//! each index's row is gathered (`index_select`) and added into its bag's
//! (`index_add` by bag number; the numbers come from a running sum of marks at
//! the offsets, on the device). Max gathers the rows into a dense
//! `[bags, longest bag, dim]` block (empty slots `-inf`) and reduces it, so it
//! reads the offsets on the host for the longest bag, as the checks of a 1-D
//! input do.

use super::embed_norm::{normal_table, pretrained_table, reset_table};
use super::layers::weight_bias_methods;
use super::{cast_state, empty_parameter, move_parameter, Module};
use crate::{
    device::Device,
    dtype::DType,
    error::{Error, Result},
    tensor::Tensor,
};

const OP: &str = "embedding_bag";

/// How a bag's rows are reduced (`mode=` of `F.embedding_bag`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BagMode {
    /// The rows' sum (times `per_sample_weights` where given).
    Sum,
    /// The rows' mean (PyTorch's default).
    #[default]
    Mean,
    /// The elementwise maximum of the rows.
    Max,
}

impl BagMode {
    /// PyTorch's name of the mode.
    pub fn name(self) -> &'static str {
        match self {
            BagMode::Sum => "sum",
            BagMode::Mean => "mean",
            BagMode::Max => "max",
        }
    }
}

/// The arguments of [`embedding_bag`] beside the tensors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EmbeddingBagOptions {
    pub mode: BagMode,
    /// An index whose entries are left out of their bags (not summed, not
    /// counted in a mean, not a maximum's candidate); negative counts from
    /// the end of the table.
    pub padding_idx: Option<i64>,
    /// `offsets` has one more entry than there are bags, the input's length
    /// (the compressed-row layout). Another last entry is refused: PyTorch's
    /// CPU kernels end the last bag there for float32 and at the input's end
    /// for float64.
    pub include_last_offset: bool,
}

/// One vector per bag of indices into `weight` `[num_embeddings, dim]`
/// (`F.embedding_bag`): a 2-D `input` `[B, N]` is `B` bags of `N` indices
/// (`offsets` must be `None`); a 1-D `input` is cut into bags where the int64
/// `offsets` say (the first 0, then non-decreasing, at most the input's
/// length; a repeated offset makes an empty bag). Returns `[B, dim]` in the
/// weight's dtype; an empty bag gives zeros in every mode.
/// `per_sample_weights` (the input's shape, the weight's dtype) scales each
/// row, in sum mode only. Errors as PyTorch's (with a message of ember's
/// for decreasing offsets and indices out of range, where PyTorch's is an
/// internal assertion).
///
/// ```
/// use ember::nn::functional::{embedding_bag, BagMode, EmbeddingBagOptions};
/// use ember::prelude::*;
/// let dev = Device::Cpu;
/// let weight = Tensor::new(&[[1f32, 10.0], [2.0, 20.0], [3.0, 30.0]], &dev)?;
/// let input = Tensor::new(&[0i64, 1, 2, 2], &dev)?;
/// let offsets = Tensor::new(&[0i64, 3], &dev)?; // bags [0, 1, 2] and [2]
/// let opts = EmbeddingBagOptions { mode: BagMode::Sum, ..Default::default() };
/// let y = embedding_bag(&input, &weight, Some(&offsets), None, opts)?;
/// assert_eq!(y.to_vec2::<f32>()?, [[6.0, 60.0], [3.0, 30.0]]);
/// # Ok::<(), ember::Error>(())
/// ```
pub fn embedding_bag(
    input: &Tensor,
    weight: &Tensor,
    offsets: Option<&Tensor>,
    per_sample_weights: Option<&Tensor>,
    opts: EmbeddingBagOptions,
) -> Result<Tensor> {
    let _record = crate::profiler::function("embedding_bag");
    let mut ts = vec![input, weight];
    ts.extend(offsets);
    ts.extend(per_sample_weights);
    crate::tensor::same_device(OP, &ts)?;
    if weight.rank() != 2 {
        return Err(Error::invalid(
            OP,
            format!(
                "weight has to be a 2D Tensor, but got Tensor of dimension {}",
                weight.rank()
            ),
        ));
    }
    for (t, what) in [(Some(input), "#1 'indices'"), (offsets, "#2 'offsets'")] {
        if let Some(t) = t.filter(|t| t.dtype() != DType::I64) {
            return Err(Error::dtype(
                OP,
                t.dtype(),
                format!(
                    "Expected tensor for argument {what} to have one of the following scalar types: Long; but got {} instead (while checking arguments for embedding_bag)",
                    crate::tensor::torch_dtype_name(t.dtype())
                ),
            ));
        }
    }
    let (n, dim) = (weight.shape()[0] as i64, weight.shape()[1]);
    let padding_idx = match opts.padding_idx {
        Some(p) if !(-n..n).contains(&p) => {
            return Err(Error::invalid(
                OP,
                format!(
                "padding_idx must be within the number of embeddings, -{n} through {}, but got {p}",
                n - 1
            ),
            ))
        }
        Some(p) => Some(if p < 0 { p + n } else { p }),
        None => None,
    };
    if let Some(w) = per_sample_weights {
        if opts.mode != BagMode::Sum {
            return Err(Error::invalid(
                OP,
                format!(
                    "embedding_bag: per_sample_weights was not None. per_sample_weights is only supported for mode='sum' (got mode='{}'). Please open a feature request on GitHub.",
                    opts.mode.name()
                ),
            ));
        }
        if w.shape() != input.shape() {
            return Err(Error::shape(
                OP,
                w.shape(),
                input.shape(),
                format!(
                    "embedding_bag: If per_sample_weights ({:?}) is not None, then it must have the same shape as the input ({:?})",
                    w.shape(),
                    input.shape()
                ),
            ));
        }
        if w.dtype() != weight.dtype() {
            return Err(Error::DTypeMismatch {
                op: OP,
                lhs: weight.dtype(),
                rhs: w.dtype(),
            });
        }
    }
    let bags = Bags::of(input, offsets, opts.include_last_offset)?;
    let device = weight.device();
    if bags.count == 0 || bags.longest == 0 {
        return Tensor::zeros([bags.count, dim], weight.dtype(), &device);
    }
    let flat = input.reshape([input.numel()])?;
    let rows = super::functional::table_rows(OP, weight, &flat)?;
    // which entries count: those not the padding index
    let keep = padding_idx
        .map(|p| flat.ne(p)?.to_dtype(weight.dtype()))
        .transpose()?;
    let scale = match (keep.as_ref(), per_sample_weights) {
        (Some(k), Some(w)) => Some(k.mul(&w.reshape([input.numel()])?)?),
        (Some(k), None) => Some(k.clone()),
        (None, Some(w)) => Some(w.reshape([input.numel()])?),
        (None, None) => None,
    };
    let rows = match &scale {
        Some(s) => rows.mul(&s.unsqueeze(1)?)?,
        None => rows,
    };
    let zeros = |shape: Vec<usize>| Tensor::zeros(shape, weight.dtype(), &device);
    match opts.mode {
        BagMode::Sum | BagMode::Mean => {
            let sum = zeros(vec![bags.count, dim])?.index_add(0, &bags.number, &rows, 1.0)?;
            if opts.mode == BagMode::Sum {
                return Ok(sum);
            }
            let ones;
            let counted = match &keep {
                Some(k) => k,
                None => {
                    ones = Tensor::ones([input.numel()], weight.dtype(), &device)?;
                    &ones
                }
            };
            let count = zeros(vec![bags.count])?.index_add(0, &bags.number, counted, 1.0)?;
            sum.div(&count.clamp_min(1.0)?.unsqueeze(1)?)
        }
        BagMode::Max => {
            let slots = bags.count * bags.longest;
            let slot = bags.slots()?;
            let values = zeros(vec![slots, dim])?.index_add(0, &slot, &rows, 1.0)?;
            let filled = match &keep {
                Some(k) => zeros(vec![slots])?.index_add(0, &slot, k, 1.0)?,
                None => zeros(vec![slots])?.index_add(
                    0,
                    &slot,
                    &Tensor::ones([input.numel()], weight.dtype(), &device)?,
                    1.0,
                )?,
            }
            .gt(0.0)?;
            let dense = filled
                .unsqueeze(1)?
                .where_(&values, f64::NEG_INFINITY)?
                .reshape([bags.count, bags.longest, dim])?;
            let (max, _) = dense.max_dim(1, false)?;
            let nonempty = filled.reshape([bags.count, bags.longest])?.any(1, true)?;
            nonempty.where_(&max, 0.0)
        }
    }
}

/// The bags of an input: each entry's bag number (`[entries]` int64), where
/// each bag starts, the number of bags and the longest one's length.
struct Bags {
    number: Tensor,
    starts: Tensor,
    count: usize,
    longest: usize,
}

impl Bags {
    fn of(input: &Tensor, offsets: Option<&Tensor>, include_last: bool) -> Result<Bags> {
        let device = input.device();
        match (input.rank(), offsets) {
            (2, Some(_)) => Err(Error::invalid(
                OP,
                "if input is 2D, then offsets has to be None, as input is treated is a mini-batch of fixed length sequences. However, found offsets of type Tensor",
            )),
            (2, None) => {
                let (b, len) = (input.shape()[0], input.shape()[1]);
                let iota = Tensor::affine_iota(b * len, 0, 1, &device)?;
                Ok(Bags {
                    number: iota.floor_divide(len.max(1) as i64)?,
                    starts: Tensor::affine_iota(b, 0, len as i64, &device)?,
                    count: b,
                    longest: len,
                })
            }
            (1, None) => Err(Error::invalid(
                OP,
                "offsets has to be a 1D Tensor but got None",
            )),
            (1, Some(o)) if o.rank() != 1 => {
                Err(Error::invalid(OP, "offsets has to be a 1D Tensor"))
            }
            (1, Some(o)) => Bags::cut(input.numel(), o, include_last),
            (r, _) => Err(Error::invalid(
                OP,
                format!("input has to be 1D or 2D Tensor, but got Tensor of dimension {r}"),
            )),
        }
    }

    /// The bags `offsets` cuts `len` entries into (read on the host for
    /// PyTorch's checks and the longest bag).
    fn cut(len: usize, offsets: &Tensor, include_last: bool) -> Result<Bags> {
        let device = offsets.device();
        let offs = match device {
            // (values unknown on meta: bags of one entry, the rest in the
            // last; the output's shape depends on the count only)
            Device::Meta => {
                let mut offs: Vec<i64> = (0..offsets.numel() as i64)
                    .map(|i| i.min(len as i64))
                    .collect();
                if let Some(last) = offs.last_mut().filter(|_| include_last) {
                    *last = len as i64;
                }
                offs
            }
            _ => offsets.to_vec::<i64>()?,
        };
        if let Some(&first) = offs.first().filter(|&&f| f != 0) {
            return Err(Error::invalid(
                OP,
                format!(
                    "offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start from position 0. However, got {first}"
                ),
            ));
        }
        if let Some(&last) = offs.last().filter(|&&l| l > len as i64) {
            return Err(Error::invalid(
                OP,
                format!(
                    "offsets[-1] can not be greater than input's length {len} but got offsets[-1] of {last}"
                ),
            ));
        }
        if let Some(i) = offs.windows(2).position(|w| w[1] < w[0]) {
            return Err(Error::invalid(
                OP,
                format!(
                    "offsets must not decrease, but offsets[{}] = {} is greater than offsets[{}] = {}",
                    i,
                    offs[i],
                    i + 1,
                    offs[i + 1]
                ),
            ));
        }
        if let Some(&last) = offs.last().filter(|&&l| include_last && l != len as i64) {
            return Err(Error::invalid(
                OP,
                format!(
                    "with include_last_offset, offsets[-1] must be the input's length {len} (the end of the last bag), but got {last}"
                ),
            ));
        }
        if include_last && offs.is_empty() {
            return Err(Error::invalid(
                OP,
                "include_last_offset: number of offset should be at least 1",
            ));
        }
        let count = match include_last {
            true => offs.len().saturating_sub(1),
            false => offs.len(),
        };
        let bounds = |i: usize| -> (usize, usize) {
            let s = offs[i] as usize;
            let e = offs.get(i + 1).map_or(len, |&e| e as usize);
            (s, e)
        };
        let longest = (0..count)
            .map(|i| bounds(i).1 - bounds(i).0)
            .max()
            .unwrap_or(0);
        let starts = offsets.narrow(0, 0, count)?;
        // a mark at each later bag's start; their running sum numbers the bags
        let marks = Tensor::zeros([len + 1], DType::I64, &device)?;
        let number = match count {
            0 | 1 => Tensor::zeros([len], DType::I64, &device)?,
            _ => {
                let later = offsets.narrow(0, 1, count - 1)?;
                let ones = Tensor::ones([count - 1], DType::I64, &device)?;
                marks
                    .index_add(0, &later, &ones, 1i64)?
                    .cumsum(0)?
                    .narrow(0, 0, len)?
            }
        };
        Ok(Bags {
            number,
            starts,
            count,
            longest,
        })
    }

    /// Each entry's slot in the dense `[bags · longest]` block of max mode:
    /// `bag · longest + position in the bag`.
    fn slots(&self) -> Result<Tensor> {
        let len = self.number.numel();
        let position = Tensor::affine_iota(len, 0, 1, &self.number.device())?
            .sub(&self.starts.index_select(0, &self.number)?)?;
        self.number.mul(self.longest as i64)?.add(&position)
    }
}

/// A table of `num_embeddings` vectors of size `embedding_dim` looked up and
/// reduced per bag (`nn.EmbeddingBag`): `weight` starts standard normal,
/// with the `padding_idx` row zero. `forward` takes a 2-D input (one bag per
/// row); [`forward_bags`](Self::forward_bags) a 1-D one with offsets and
/// per-sample weights.
pub struct EmbeddingBag {
    pub weight: Tensor,
    pub options: EmbeddingBagOptions,
}

impl EmbeddingBag {
    /// Bags reduced by their mean, without padding (PyTorch's defaults).
    pub fn new(
        num_embeddings: usize,
        embedding_dim: usize,
        device: &Device,
    ) -> Result<EmbeddingBag> {
        EmbeddingBag::with_options(
            num_embeddings,
            embedding_dim,
            EmbeddingBagOptions::default(),
            device,
        )
    }

    /// With a mode, a padding index (its row zero) and `include_last_offset`.
    pub fn with_options(
        num_embeddings: usize,
        embedding_dim: usize,
        options: EmbeddingBagOptions,
        device: &Device,
    ) -> Result<EmbeddingBag> {
        let size = (num_embeddings, embedding_dim);
        let (weight, padding_idx) =
            normal_table("EmbeddingBag", size, options.padding_idx, device)?;
        Ok(EmbeddingBag {
            weight,
            options: EmbeddingBagOptions {
                padding_idx,
                ..options
            },
        })
    }

    /// A table holding a copy of `embeddings` `[num, dim]`
    /// (`nn.EmbeddingBag.from_pretrained`): `freeze` (PyTorch's default)
    /// keeps it out of training; a padding row keeps its values.
    pub fn from_pretrained(
        embeddings: &Tensor,
        freeze: bool,
        options: EmbeddingBagOptions,
    ) -> Result<EmbeddingBag> {
        let (weight, padding_idx) =
            pretrained_table("EmbeddingBag", embeddings, freeze, options.padding_idx)?;
        Ok(EmbeddingBag {
            weight,
            options: EmbeddingBagOptions {
                padding_idx,
                ..options
            },
        })
    }

    /// [`embedding_bag`] of a 1-D `input` cut at `offsets` (or a 2-D one with
    /// `None`), each row scaled by `per_sample_weights` (sum mode).
    pub fn forward_bags(
        &self,
        input: &Tensor,
        offsets: Option<&Tensor>,
        per_sample_weights: Option<&Tensor>,
    ) -> Result<Tensor> {
        embedding_bag(
            input,
            &self.weight,
            offsets,
            per_sample_weights,
            self.options,
        )
    }
}

impl Module for EmbeddingBag {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_bags(x, None, None)
    }

    weight_bias_methods!(weight only);

    fn reset_parameters(&mut self) -> Result<()> {
        reset_table(&self.weight, self.options.padding_idx, true)
    }
}
