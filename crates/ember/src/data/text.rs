//! Character-level text for language models: a vocabulary of the characters a
//! text uses, the text as int64 ids, a training/validation split, and random
//! windows of it as batches of inputs and next-character targets.

use crate::{
    device::Device,
    error::{Error, Result},
    tensor::Tensor,
};

/// A text as character ids, split into training and validation parts.
#[derive(Clone, Debug)]
pub struct CharCorpus {
    vocab: Vec<char>,
    train: Vec<i64>,
    val: Vec<i64>,
}

/// Which part of a [`CharCorpus`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    Train,
    Val,
}

impl CharCorpus {
    /// The vocabulary is the text's distinct characters in code-point order; the
    /// last `val_fraction` of the text is the validation part.
    pub fn new(text: &str, val_fraction: f64) -> Result<CharCorpus> {
        if !(0.0..1.0).contains(&val_fraction) {
            return Err(Error::invalid(
                "CharCorpus",
                format!("val_fraction must be in [0, 1), got {val_fraction}"),
            ));
        }
        let mut vocab: Vec<char> = text.chars().collect();
        vocab.sort_unstable();
        vocab.dedup();
        let ids = Self::encode_with(&vocab, text)?;
        let cut = ids.len() - (ids.len() as f64 * val_fraction) as usize;
        Ok(CharCorpus {
            train: ids[..cut].to_vec(),
            val: ids[cut..].to_vec(),
            vocab,
        })
    }

    /// Reads a UTF-8 text file.
    pub fn from_file(path: impl AsRef<std::path::Path>, val_fraction: f64) -> Result<CharCorpus> {
        let p = path.as_ref();
        let text = std::fs::read_to_string(p).map_err(|source| Error::Io {
            path: p.display().to_string(),
            source,
        })?;
        CharCorpus::new(&text, val_fraction)
    }

    /// The characters, in id order.
    pub fn vocab(&self) -> &[char] {
        &self.vocab
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    /// The ids of a part.
    pub fn ids(&self, split: Split) -> &[i64] {
        match split {
            Split::Train => &self.train,
            Split::Val => &self.val,
        }
    }

    fn encode_with(vocab: &[char], text: &str) -> Result<Vec<i64>> {
        text.chars()
            .map(|c| {
                vocab.binary_search(&c).map(|i| i as i64).map_err(|_| {
                    Error::invalid(
                        "encode",
                        format!("the character {c:?} is not in the vocabulary"),
                    )
                })
            })
            .collect()
    }

    /// The ids of `text` (every character must be in the vocabulary).
    pub fn encode(&self, text: &str) -> Result<Vec<i64>> {
        Self::encode_with(&self.vocab, text)
    }

    /// The text of `ids`.
    pub fn decode(&self, ids: &[i64]) -> Result<String> {
        ids.iter()
            .map(|&i| {
                usize::try_from(i)
                    .ok()
                    .and_then(|i| self.vocab.get(i).copied())
                    .ok_or_else(|| {
                        Error::invalid("decode", format!("id {i} is not in the vocabulary"))
                    })
            })
            .collect()
    }

    /// `batch` windows of `context` characters at random places of a part (drawn
    /// from the generator in scope), and the characters that follow each one:
    /// inputs and targets, int64 `[batch, context]` on `device`.
    pub fn batch(
        &self,
        split: Split,
        batch: usize,
        context: usize,
        device: &Device,
    ) -> Result<(Tensor, Tensor)> {
        let ids = self.ids(split);
        if ids.len() <= context {
            return Err(Error::invalid(
                "CharCorpus::batch",
                format!("the {split:?} part has {} characters, fewer than a window of {context} and its target", ids.len()),
            ));
        }
        let starts = Tensor::randint(0, (ids.len() - context) as i64, [batch], &Device::Cpu)?
            .to_vec::<i64>()?;
        let mut x = Vec::with_capacity(batch * context);
        let mut y = Vec::with_capacity(batch * context);
        for s in starts {
            let s = s as usize;
            x.extend_from_slice(&ids[s..s + context]);
            y.extend_from_slice(&ids[s + 1..s + context + 1]);
        }
        Ok((
            Tensor::from_vec(x, [batch, context], device)?,
            Tensor::from_vec(y, [batch, context], device)?,
        ))
    }

    /// The cross-entropy (nats per character) of the validation part under the
    /// training part's character frequencies (with add-one smoothing): what a
    /// model that ignores context achieves, the baseline a language model must
    /// beat.
    pub fn unigram_loss(&self) -> f64 {
        let v = self.vocab.len();
        let mut counts = vec![1.0f64; v];
        for &i in &self.train {
            counts[i as usize] += 1.0;
        }
        let total: f64 = counts.iter().sum();
        let n = self.val.len().max(1) as f64;
        self.val
            .iter()
            .map(|&i| -(counts[i as usize] / total).ln())
            .sum::<f64>()
            / n
    }
}
