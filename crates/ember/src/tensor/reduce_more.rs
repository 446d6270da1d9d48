//! Reductions composed from the primitives: `nansum`, `nanmean`, `var_mean`,
//! `std_mean`, `count_nonzero`, `aminmax`, and `diff` and `isin`.

use super::shape::IntoDims;
use super::Tensor;
use crate::layout::normalize_dim;
use crate::{
    dtype::DType,
    error::{Error, Result},
};

impl Tensor {
    /// This tensor with NaN replaced by 0 (float dtypes; others as they are).
    fn nan_zeroed(&self) -> Result<Tensor> {
        if self.dtype().is_float() {
            self.isnan()?.where_(0.0, self)
        } else {
            Ok(self.clone())
        }
    }

    /// Sum over `dims` counting NaN as 0 (`torch.nansum`); integers and bools
    /// sum to int64. The gradient is 0 at the NaN.
    ///
    /// ```
    /// # use ember::{Device, Tensor};
    /// let x = Tensor::new(&[1.0f32, f32::NAN, 2.0], &Device::Cpu)?;
    /// assert_eq!(x.nansum(0, false)?.to_vec::<f32>()?, vec![3.0]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn nansum(&self, dims: impl IntoDims, keepdim: bool) -> Result<Tensor> {
        self.nan_zeroed()?.sum(dims, keepdim)
    }

    /// [`nansum`](Self::nansum) of every element, as a 0-d tensor.
    pub fn nansum_all(&self) -> Result<Tensor> {
        self.nan_zeroed()?.sum_all()
    }

    /// Mean over `dims` of the elements that are not NaN (`torch.nanmean`):
    /// NaN where all are. Floating-point dtypes only, as in PyTorch.
    pub fn nanmean(&self, dims: impl IntoDims, keepdim: bool) -> Result<Tensor> {
        self.check_nanmean()?;
        let dims: Vec<i64> = dims.to_dim_list().to_vec();
        let count = self.isnan()?.logical_not()?.sum(dims.clone(), keepdim)?;
        self.nansum(dims, keepdim)?.div(&count)
    }

    /// [`nanmean`](Self::nanmean) of every element, as a 0-d tensor.
    pub fn nanmean_all(&self) -> Result<Tensor> {
        self.check_nanmean()?;
        let count = self.isnan()?.logical_not()?.sum_all()?;
        self.nansum_all()?.div(&count)
    }

    fn check_nanmean(&self) -> Result<()> {
        if self.dtype().is_float() {
            return Ok(());
        }
        Err(Error::dtype(
            "nanmean",
            self.dtype(),
            format!(
                "nanmean(): expected input to have floating point or complex dtype but got {}",
                super::elementwise::torch_dtype_name(self.dtype())
            ),
        ))
    }

    /// `(variance, mean)` over `dims`, the variance dividing by `N -
    /// correction` (`torch.var_mean`). Floating-point dtypes only.
    ///
    /// ```
    /// # use ember::{Device, Tensor};
    /// let x = Tensor::new(&[1.0f64, 2.0, 3.0, 4.0], &Device::Cpu)?;
    /// let (v, m) = x.var_mean(0, 1.0, false)?;
    /// assert_eq!((v.to_vec::<f64>()?, m.to_vec::<f64>()?), (vec![5.0 / 3.0], vec![2.5]));
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn var_mean(
        &self,
        dims: impl IntoDims,
        correction: f64,
        keepdim: bool,
    ) -> Result<(Tensor, Tensor)> {
        self.check_moments("var_mean")?;
        let dims: Vec<i64> = dims.to_dim_list().to_vec();
        Ok((
            self.var_correction(dims.clone(), correction, keepdim)?,
            self.mean(dims, keepdim)?,
        ))
    }

    /// `(standard deviation, mean)` over `dims` (`torch.std_mean`).
    pub fn std_mean(
        &self,
        dims: impl IntoDims,
        correction: f64,
        keepdim: bool,
    ) -> Result<(Tensor, Tensor)> {
        self.check_moments("std_mean")?;
        let dims: Vec<i64> = dims.to_dim_list().to_vec();
        Ok((
            self.std_correction(dims.clone(), correction, keepdim)?,
            self.mean(dims, keepdim)?,
        ))
    }

    fn check_moments(&self, op: &'static str) -> Result<()> {
        if self.dtype().is_float() {
            return Ok(());
        }
        Err(Error::dtype(
            op,
            self.dtype(),
            format!("{op} only support floating point and complex dtypes"),
        ))
    }

    /// The number of nonzero elements over `dims`, as int64
    /// (`torch.count_nonzero`; NaN counts as nonzero).
    pub fn count_nonzero(&self, dims: impl IntoDims) -> Result<Tensor> {
        self.ne(0)?.sum(dims, false)
    }

    /// The number of nonzero elements, as a 0-d int64 tensor.
    pub fn count_nonzero_all(&self) -> Result<Tensor> {
        self.ne(0)?.sum_all()
    }

    /// `(min, max)` along `dim`, or of every element when `dim` is `None`
    /// (`torch.aminmax`); NaN wins, as in [`min`](Self::min). With `keepdim`
    /// and no dim, both keep every dim with size 1. An empty reduction is an
    /// error.
    pub fn aminmax(&self, dim: Option<i64>, keepdim: bool) -> Result<(Tensor, Tensor)> {
        match dim {
            Some(d) => Ok((self.min(d, keepdim)?, self.max(d, keepdim)?)),
            None => {
                let (lo, hi) = (self.min_all()?, self.max_all()?);
                if keepdim {
                    let ones = vec![1usize; self.rank()];
                    Ok((lo.reshape(&ones[..])?, hi.reshape(&ones[..])?))
                } else {
                    Ok((lo, hi))
                }
            }
        }
    }

    /// The `n`-th forward difference along `dim` (`torch.diff`): `out[i] =
    /// x[i + 1] - x[i]`, applied `n` times, after `prepend` and `append` are
    /// joined to `self` along `dim` (they must match its other dims). Bools
    /// differ by `xor`, as in PyTorch. A 0-d input is an error.
    ///
    /// ```
    /// # use ember::{Device, Tensor};
    /// let x = Tensor::new(&[1i64, 4, 9, 16], &Device::Cpu)?;
    /// assert_eq!(x.diff(1, -1, None, None)?.to_vec::<i64>()?, vec![3, 5, 7]);
    /// assert_eq!(x.diff(2, -1, None, None)?.to_vec::<i64>()?, vec![2, 2]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn diff(
        &self,
        n: usize,
        dim: i64,
        prepend: Option<&Tensor>,
        append: Option<&Tensor>,
    ) -> Result<Tensor> {
        if self.rank() == 0 {
            return Err(Error::invalid(
                "diff",
                "diff expects input to be at least one-dimensional",
            ));
        }
        let d = normalize_dim("diff", dim, self.rank())? as i64;
        let mut parts: Vec<&Tensor> = Vec::with_capacity(3);
        parts.extend(prepend);
        parts.push(self);
        parts.extend(append);
        let mut x = if parts.len() > 1 {
            Tensor::cat(&parts, d)?
        } else {
            self.clone()
        };
        for _ in 0..n {
            let len = x.shape()[d as usize];
            if len == 0 {
                break;
            }
            let (hi, lo) = (x.narrow(d, 1, len - 1)?, x.narrow(d, 0, len - 1)?);
            x = if x.dtype() == DType::Bool {
                hi.logical_xor(&lo)?
            } else {
                hi.sub(&lo)?
            };
        }
        Ok(x)
    }

    /// Whether each element is among `test_elements` (any shape), as a bool
    /// tensor of this tensor's shape (`torch.isin`); `invert` gives the
    /// opposite. NaN is in no set.
    ///
    /// ```
    /// # use ember::{Device, Tensor};
    /// let x = Tensor::new(&[1i64, 2, 3, 4], &Device::Cpu)?;
    /// let s = Tensor::new(&[4i64, 2], &Device::Cpu)?;
    /// assert_eq!(x.isin(&s, false)?.to_vec::<bool>()?, vec![false, true, false, true]);
    /// # Ok::<(), ember::Error>(())
    /// ```
    pub fn isin(&self, test_elements: &Tensor, invert: bool) -> Result<Tensor> {
        let _ng = crate::autograd::no_grad_guard();
        let set = test_elements.flatten_all()?;
        let found = if set.numel() == 0 {
            Tensor::zeros(self.shape(), DType::Bool, &self.device())?
        } else {
            self.unsqueeze(-1)?
                .eq(&set)?
                .to_dtype(DType::I64)?
                .sum(-1, false)?
                .gt(0)?
        };
        if invert {
            found.logical_not()
        } else {
            Ok(found)
        }
    }
}
