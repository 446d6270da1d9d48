//! Batching sequences of different lengths (`torch.nn.utils.rnn`'s
//! `pad_sequence` and `unpad_sequence`): padded to the longest along a new
//! batch dim, and cut back to their lengths.

use crate::{
    error::{Error, Result},
    tensor::Tensor,
};

const OP: &str = "pad_sequence";

/// Where [`pad_sequence`] puts the padding of a shorter sequence.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PaddingSide {
    /// After the sequence's items (PyTorch's default).
    #[default]
    Right,
    /// Before them.
    Left,
}

/// The options of [`pad_sequence`]: `batch_first` (default `false`: the
/// output is `[longest, batch, *]`), the padding value (default 0) and the
/// side padded (default right), as PyTorch's keyword arguments.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PadSequenceOptions {
    pub batch_first: bool,
    pub padding_value: f64,
    pub padding_side: PaddingSide,
}

impl PadSequenceOptions {
    /// `[batch, longest, *]` out instead of `[longest, batch, *]`.
    pub fn batch_first(mut self, on: bool) -> Self {
        self.batch_first = on;
        self
    }
    /// The value of the padded places (cast to the output's dtype as PyTorch
    /// fills: 2.7 pads an integer batch with 2).
    pub fn padding_value(mut self, value: f64) -> Self {
        self.padding_value = value;
        self
    }
    /// The side padded.
    pub fn padding_side(mut self, side: PaddingSide) -> Self {
        self.padding_side = side;
        self
    }
}

/// Stacks sequences `[L_i, *]` of different lengths into one tensor, each
/// padded to the longest (`torch.nn.utils.rnn.pad_sequence`): `[longest,
/// batch, *]`, or `[batch, longest, *]` with `batch_first`. The output has
/// the first sequence's dtype (the others are cast to it) and every
/// sequence's trailing dims must broadcast to the first's, as PyTorch's copy
/// into the batch asks. Differentiable: each sequence's gradient is its slice
/// of the batch's.
///
/// ```
/// use ember::nn::{pad_sequence, PadSequenceOptions};
/// use ember::prelude::*;
/// let dev = Device::Cpu;
/// let (a, b) = (Tensor::new([1f32, 2.0, 3.0], &dev)?, Tensor::new([4f32], &dev)?);
/// let batch = pad_sequence(&[a, b], PadSequenceOptions::default().batch_first(true))?;
/// assert_eq!(batch.to_vec2::<f32>()?, [[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]]);
/// # Ok::<(), ember::Error>(())
/// ```
pub fn pad_sequence(sequences: &[Tensor], opts: PadSequenceOptions) -> Result<Tensor> {
    let Some(first) = sequences.first() else {
        return Err(Error::invalid(OP, "received an empty list of sequences"));
    };
    let refs: Vec<&Tensor> = sequences.iter().collect();
    crate::tensor::same_device(OP, &refs)?;
    if let Some(i) = sequences.iter().position(|s| s.rank() == 0) {
        return Err(Error::invalid(
            OP,
            format!("each sequence needs a length (a first dim), but sequence {i} is a 0-d tensor"),
        ));
    }
    let trailing = &first.shape()[1..];
    let longest = sequences.iter().map(|s| s.shape()[0]).max().unwrap_or(0);
    let mut padded = Vec::with_capacity(sequences.len());
    for s in sequences {
        let len = s.shape()[0];
        let mut shape = vec![len];
        shape.extend_from_slice(trailing);
        let s = broadcast_items(s, &shape)?.to_dtype(first.dtype())?;
        if len == longest {
            padded.push(s);
            continue;
        }
        let mut pad_shape = vec![longest - len];
        pad_shape.extend_from_slice(trailing);
        let pad = Tensor::full(
            pad_shape,
            opts.padding_value,
            first.dtype(),
            &first.device(),
        )?;
        let parts = match opts.padding_side {
            PaddingSide::Right => [&s, &pad],
            PaddingSide::Left => [&pad, &s],
        };
        padded.push(Tensor::cat(&parts, 0)?);
    }
    let padded: Vec<&Tensor> = padded.iter().collect();
    Tensor::stack(&padded, if opts.batch_first { 0 } else { 1 })
}

/// `s` with its trailing dims broadcast to `shape`'s (PyTorch's message
/// where they cannot be).
fn broadcast_items(s: &Tensor, shape: &[usize]) -> Result<Tensor> {
    if s.shape() == shape {
        return Ok(s.clone());
    }
    let (have, want) = (&s.shape()[1..], &shape[1..]);
    if have.len() <= want.len() {
        let lead = want.len() - have.len();
        let fits = have
            .iter()
            .zip(&want[lead..])
            .all(|(&h, &w)| h == w || h == 1);
        if fits {
            let mut view = vec![s.shape()[0]];
            view.extend(std::iter::repeat_n(1, lead));
            view.extend_from_slice(have);
            return s.reshape(view)?.expand(shape);
        }
    }
    // the first trailing dim, from the right, that does not broadcast
    let (dim, h, w) = (1..=have.len().max(want.len()))
        .map(|k| {
            let h = have.len().checked_sub(k).map_or(1, |i| have[i]);
            let w = want.len().checked_sub(k).map_or(1, |i| want[i]);
            (want.len() + 1 - k.min(want.len()), h, w)
        })
        .find(|&(_, h, w)| h != w && h != 1)
        .unwrap_or((1, 0, 0));
    Err(Error::shape(
        OP,
        s.shape(),
        shape,
        format!(
            "The size of tensor a ({w}) must match the size of tensor b ({h}) at non-singleton dimension {dim}"
        ),
    ))
}

/// The sequences a padded batch holds, cut to their lengths
/// (`torch.nn.utils.rnn.unpad_sequence`): the inverse of [`pad_sequence`]
/// with right padding. Each is a view of the batch (differentiable).
///
/// ```
/// use ember::nn::{pad_sequence, unpad_sequence, PadSequenceOptions};
/// use ember::prelude::*;
/// let dev = Device::Cpu;
/// let seqs = [Tensor::new([1f32, 2.0], &dev)?, Tensor::new([3f32], &dev)?];
/// let batch = pad_sequence(&seqs, PadSequenceOptions::default())?;
/// let back = unpad_sequence(&batch, &[2, 1], false)?;
/// assert_eq!(back[1].to_vec::<f32>()?, [3.0]);
/// # Ok::<(), ember::Error>(())
/// ```
pub fn unpad_sequence(
    padded: &Tensor,
    lengths: &[usize],
    batch_first: bool,
) -> Result<Vec<Tensor>> {
    const OP: &str = "unpad_sequence";
    if padded.rank() < 2 {
        return Err(Error::invalid(
            OP,
            format!(
                "expected a padded batch of at least 2 dims, got shape {:?}",
                padded.shape()
            ),
        ));
    }
    let (batch_dim, time_dim) = if batch_first { (0, 1) } else { (1, 0) };
    let (batch, longest) = (padded.shape()[batch_dim], padded.shape()[time_dim]);
    if lengths.len() != batch {
        return Err(Error::invalid(
            OP,
            format!("{} lengths for a batch of {batch} sequences", lengths.len()),
        ));
    }
    if let Some(&l) = lengths.iter().find(|&&l| l > longest) {
        return Err(Error::invalid(
            OP,
            format!("a length of {l} is longer than the padded batch's {longest}"),
        ));
    }
    lengths
        .iter()
        .enumerate()
        .map(|(i, &l)| {
            padded
                .narrow(batch_dim as i64, i as i64, 1)?
                .squeeze(batch_dim as i64)?
                .narrow(0, 0, l)
        })
        .collect()
}
