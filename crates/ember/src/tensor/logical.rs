//! Logical operations on the truth of elements (`torch.logical_*`): an element is
//! true when it is not zero, in any dtype; the results are bool tensors. Built
//! from comparisons, so they run on every device.

use super::Tensor;
use crate::error::Result;

impl Tensor {
    /// `true` where an element is zero (`torch.logical_not`; `~mask` for bools).
    pub fn logical_not(&self) -> Result<Tensor> {
        self.eq(0i64)
    }

    /// `true` where both elements are non-zero (`torch.logical_and`).
    pub fn logical_and(&self, other: &Tensor) -> Result<Tensor> {
        super::elementwise::elementwise_device("logical_and", &[self, other])?;
        self.ne(0i64)?.mul(&other.ne(0i64)?)
    }

    /// `true` where either element is non-zero (`torch.logical_or`).
    pub fn logical_or(&self, other: &Tensor) -> Result<Tensor> {
        super::elementwise::elementwise_device("logical_or", &[self, other])?;
        self.ne(0i64)?.maximum(&other.ne(0i64)?)
    }

    /// `true` where exactly one element is non-zero (`torch.logical_xor`).
    pub fn logical_xor(&self, other: &Tensor) -> Result<Tensor> {
        super::elementwise::elementwise_device("logical_xor", &[self, other])?;
        self.ne(0i64)?.ne(&other.ne(0i64)?)
    }
}
