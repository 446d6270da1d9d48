//! Ranges, evenly spaced values and the identity matrix (`arange`, `linspace`,
//! `eye`), computed on the tensor's device (one kernel on a GPU: the
//! storages' `iota` and `linspace`), bit for bit as the host
//! computes them: no values are copied from the host, so they are made inside a
//! CUDA graph capture too.

use super::{check_creatable, check_fill_value};
use crate::backend::op::Scalar;
use crate::backend::Storage;
use crate::dtype::WithDType;
use crate::layout::checked_numel;
use crate::tensor::Tensor;
use crate::{
    device::Device,
    dtype::DType,
    error::{Error, Result},
};

impl Tensor {
    /// `torch.arange(start, end)` with step 1; the dtype is `T`'s.
    pub fn arange<T: WithDType>(start: T, end: T, device: &Device) -> Result<Tensor> {
        use std::any::Any;
        // int64 bounds counted in integers: exact beyond 2^53 too
        if let (Some(&s), Some(&e)) = (
            (&start as &dyn Any).downcast_ref::<i64>(),
            (&end as &dyn Any).downcast_ref::<i64>(),
        ) {
            if e < s {
                return Err(Error::invalid(
                    "arange",
                    format!(
                        "upper bound and larger bound inconsistent with step sign \
                         (start={s}, end={e}, step=1)"
                    ),
                ));
            }
            check_creatable(device)?;
            let n = usize::try_from(e as i128 - s as i128).unwrap_or(usize::MAX);
            if n > isize::MAX as usize {
                return Err(Error::invalid(
                    "arange",
                    format!("{n} values (start={s}, end={e}) are more than memory can hold"),
                ));
            }
            return Tensor::affine_iota(n, s, 1, device);
        }
        Tensor::arange_step(start.to_f64(), end.to_f64(), 1.0, T::DTYPE, device)
    }

    /// `torch.arange(start, end, step, dtype=...)`: `ceil((end - start) / step)`
    /// values `start + i * step`, computed in f64 and converted to `dtype`. Bool
    /// is refused, as PyTorch refuses it.
    pub fn arange_step(
        start: f64,
        end: f64,
        step: f64,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let (s, e, st) = (start, end, step);
        if dtype == DType::Bool {
            return Err(Error::dtype(
                "arange",
                dtype,
                "\"arange_cpu\" not implemented for 'Bool'",
            ));
        }
        if st == 0.0 || !st.is_finite() || !s.is_finite() || !e.is_finite() {
            return Err(Error::invalid(
                "arange",
                format!("step must be finite and non-zero, got start={s}, end={e}, step={st}"),
            ));
        }
        if (e - s) * st < 0.0 {
            return Err(Error::invalid(
                "arange",
                format!("upper bound and larger bound inconsistent with step sign (start={s}, end={e}, step={st})"),
            ));
        }
        check_creatable(device)?;
        let count = ((e - s) / st).ceil().max(0.0);
        if count > isize::MAX as f64 {
            return Err(Error::invalid(
                "arange",
                format!(
                    "{count} values (start={s}, end={e}, step={st}) are more than memory can hold"
                ),
            ));
        }
        let n = count as usize;
        if matches!(dtype, DType::I64 | DType::U8) {
            // exact integers, also beyond 2^53, from start and step truncated
            // first (PyTorch's; a uint8 one then wraps: -1.5 gives 255, 0, 1, ...)
            const TWO_63: f64 = 9_223_372_036_854_775_808.0;
            if [s, e, st].iter().any(|v| !(-TWO_63..TWO_63).contains(v)) {
                return Err(Error::invalid(
                    "arange",
                    format!(
                        "value cannot be converted to type int64_t without overflow \
                         (start={s}, end={e}, step={st})"
                    ),
                ));
            }
            let (s, st) = (s as i64, st as i64);
            // (each value lies between start and end, so the wrapping sum is
            // exact where `i * st` alone would overflow)
            return Tensor::affine_iota(n, s, st, device)?.to_dtype(dtype);
        }
        // `start + i * step` in f64, each rounded once per operation (the counts
        // are exact in f64: fewer than 2^53 of them fit in memory)
        Tensor::affine_iota(n, 0, 1, device)?
            .to_dtype(DType::F64)?
            .mul(st)?
            .add(s)?
            .to_dtype(dtype)
    }

    /// `torch.linspace(start, end, steps)` in `dtype`. `start` and `end` are Python
    /// numbers (floats, integers or bools), converted to `dtype` first as PyTorch
    /// converts them (an error when they do not fit, see [`full`](Self::full)):
    /// for integer dtypes the endpoints are truncated to integers, the step is
    /// `(end - start) / (steps - 1)` in f64 and each value is truncated back, so
    /// `linspace(0, 10, 4)` in int64 is `[0, 3, 6, 10]`. Bool is refused.
    pub fn linspace(
        start: impl Into<Scalar>,
        end: impl Into<Scalar>,
        steps: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let (start, end) = (start.into(), end.into());
        if dtype == DType::Bool {
            return Err(Error::dtype(
                "linspace",
                dtype,
                "\"linspace_cpu\" not implemented for 'Bool'",
            ));
        }
        check_fill_value("linspace", start, dtype)?;
        check_fill_value("linspace", end, dtype)?;
        check_creatable(device)?;
        checked_numel("linspace", &[steps])?;
        // the values in f64 on the device, as the host computes them
        let values = |start: f64, end: f64| -> Result<Tensor> {
            Ok(Tensor::from_storage(
                Storage::linspace(*device, start, end, steps)?,
                &[steps],
            ))
        };
        if !dtype.is_float() {
            // the endpoints in the integer dtype (truncated, uint8 wrapping), the
            // values computed in f64 and truncated back
            let (a, b) = (start.to::<i64>(), end.to::<i64>());
            let (a, b) = if dtype == DType::U8 {
                (start.to::<u8>() as i64, end.to::<u8>() as i64)
            } else {
                (a, b)
            };
            return values(a as f64, b as f64)?
                .to_dtype(DType::I64)?
                .to_dtype(dtype);
        }
        values(start.to_f64(), end.to_f64())?.to_dtype(dtype)
    }

    /// The `n × n` identity matrix.
    pub fn eye(n: usize, dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::eye_rect(n, n, dtype, device)
    }

    /// An `n × m` matrix with ones on the diagonal.
    pub fn eye_rect(n: usize, m: usize, dtype: DType, device: &Device) -> Result<Tensor> {
        check_creatable(device)?;
        checked_numel("eye", &[n, m])?;
        // where the row's number equals the column's
        let rows = Tensor::affine_iota(n, 0, 1, device)?.unsqueeze(1)?;
        let cols = Tensor::affine_iota(m, 0, 1, device)?.unsqueeze(0)?;
        rows.eq(&cols)?.to_dtype(dtype)
    }

    /// `first + step · i` for `i` in `0..n`, int64 (wrapping around on overflow),
    /// computed on `device` in one pass (one kernel on a GPU): no values are
    /// copied from the host, so it runs inside a CUDA graph capture too.
    pub(crate) fn affine_iota(n: usize, first: i64, step: i64, device: &Device) -> Result<Tensor> {
        Ok(Tensor::from_storage(
            Storage::iota(*device, n, first, step)?,
            &[n],
        ))
    }
}
