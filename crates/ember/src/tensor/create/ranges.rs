//! Ranges, evenly spaced values and the identity matrix (`arange`, `linspace`,
//! `eye`), computed on the tensor's device from counts ([`Tensor::affine_iota`]),
//! bit for bit as the host computes them: no values are copied from the host,
//! so they are made inside a CUDA graph capture too (all but a `linspace` whose
//! values the device cannot compute exactly, which is made on the host).

use super::{check_creatable, check_fill_value, made_on_host};
use crate::backend::host::try_collect;
use crate::backend::op::Scalar;
use crate::dtype::{CpuData, WithDType};
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
        // the values in f64, on the device where each is exact there (see
        // `linspace_exact`), else on the host
        let values = |start: f64, end: f64| -> Result<Tensor> {
            if let Some(t) = linspace_exact(start, end, steps, device)? {
                return Ok(t);
            }
            let v = linspace_on_host(start, end, steps);
            Tensor::from_host_with(&[steps], DType::F64, *device, || {
                try_collect(steps, v).map(CpuData::F64)
            })
            .map_err(|e| made_on_host("linspace", e))
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
    /// computed on `device` by its own ops: no values are copied from the host, so
    /// it runs inside a CUDA graph capture too. A line of up to [`IOTA_LINE`]
    /// numbers is a running count of ones; a longer one is rows of that many,
    /// each row's first number (a shorter line of the same kind) plus the
    /// columns' offsets. The result is contiguous (a view of the rows' first `n`
    /// numbers: its storage may hold up to `IOTA_LINE - 1` more).
    /// On the CPU the numbers are written in one loop, and a meta tensor holds
    /// none.
    pub(crate) fn affine_iota(n: usize, first: i64, step: i64, device: &Device) -> Result<Tensor> {
        match device {
            Device::Cpu => {
                let v = (0..n as i64).map(|i| first.wrapping_add(step.wrapping_mul(i)));
                return Tensor::from_vec(try_collect(n, v)?, [n], device);
            }
            Device::Meta => return Tensor::zeros([n], DType::I64, device),
            _ => {}
        }
        if n <= IOTA_LINE {
            // the running count is 1, 2, ..., n
            return Tensor::ones([n], DType::I64, device)?
                .cumsum(0)?
                .mul(step)?
                .add(first.wrapping_sub(step));
        }
        let rows = n.div_ceil(IOTA_LINE);
        let starts = Tensor::affine_iota(rows, first, step.wrapping_mul(IOTA_LINE as i64), device)?;
        let cols = Tensor::affine_iota(IOTA_LINE, 0, step, device)?;
        starts
            .unsqueeze(1)?
            .add(&cols.unsqueeze(0)?)?
            .flatten_all()?
            .narrow(0, 0, n)
    }
}

/// The longest line [`Tensor::affine_iota`] counts in one running sum (a GPU
/// sums a line in one thread).
const IOTA_LINE: usize = 1024;

/// [`Tensor::linspace`]'s values in f64, as the host computes them. Like
/// PyTorch: the first half forward from `start` and the second half backward
/// from `end`, so both endpoints are exact, each a fused multiply-add, as
/// PyTorch's vectorised CPU kernel computes them (one rounding: an integer
/// linspace truncates the difference).
fn linspace_on_host(start: f64, end: f64, steps: usize) -> impl Iterator<Item = f64> {
    let step = if steps > 1 {
        (end - start) / (steps - 1) as f64
    } else {
        0.0
    };
    let half = steps / 2;
    (0..steps).map(move |i| {
        if i < half || steps == 1 {
            step.mul_add(i as f64, start)
        } else {
            (-step).mul_add((steps - 1 - i) as f64, end)
        }
    })
}

/// `x` as `m · 2^e` with `m` odd (`(0, 0)` for either zero); `None` for an
/// infinity or NaN.
fn odd_times_power_of_two(x: f64) -> Option<(i64, i32)> {
    if x == 0.0 {
        return Some((0, 0));
    }
    if !x.is_finite() {
        return None;
    }
    let bits = x.to_bits();
    let (biased, frac) = (
        ((bits >> 52) & 0x7ff) as i32,
        (bits & ((1 << 52) - 1)) as i64,
    );
    let (m, e) = if biased == 0 {
        (frac, -1074)
    } else {
        (frac | 1 << 52, biased - 1075)
    };
    let tz = m.trailing_zeros();
    let m = m >> tz;
    Some((if x < 0.0 { -m } else { m }, e + tz as i32))
}

/// `fma(a, i, c)` (one rounding) for `i` in `0..count`, ascending or descending,
/// as float64 on `device`, where each is exact there: `a` and `c` are `M · 2^E`
/// and `K · 2^E` with integers such that every `K + M · i` fits in an int64,
/// whose conversion to f64 rounds it once, and `2^E` scales it exactly (a
/// normal result). `None` where they do not fit (long lines of a step with a
/// full mantissa, ends of very different sizes), for a `c` of -0.0 (where the
/// sign of a zero result depends on `a`'s) and for values not finite.
fn fma_line(
    a: f64,
    c: f64,
    count: usize,
    descending: bool,
    device: &Device,
) -> Result<Option<Tensor>> {
    if c == 0.0 && c.is_sign_negative() {
        return Ok(None);
    }
    let (Some((ma, ea)), Some((mc, ec))) = (odd_times_power_of_two(a), odd_times_power_of_two(c))
    else {
        return Ok(None);
    };
    let e = match (ma, mc) {
        (0, 0) => 0,
        (0, _) => ec,
        (_, 0) => ea,
        _ => ea.min(ec),
    };
    if !(-1022..=960).contains(&e) {
        return Ok(None);
    }
    let scaled = |m: i64, shift: i32| -> Option<i128> {
        if m == 0 {
            return Some(0);
        }
        (shift < 64).then(|| (m as i128) << shift)
    };
    let (Some(m), Some(k)) = (scaled(ma, ea - e), scaled(mc, ec - e)) else {
        return Ok(None);
    };
    let last = count.saturating_sub(1) as i128;
    let fits = m
        .abs()
        .checked_mul(last)
        .and_then(|p| p.checked_add(k.abs()))
        .is_some_and(|b| b <= i64::MAX as i128);
    if !fits {
        return Ok(None);
    }
    let (first, step) = if descending {
        (k + m * last, -m)
    } else {
        (k, m)
    };
    let n = Tensor::affine_iota(count, first as i64, step as i64, device)?.to_dtype(DType::F64)?;
    if e == 0 {
        return Ok(Some(n));
    }
    let scale = f64::from_bits(((e + 1023) as u64) << 52);
    Ok(Some(n.mul(scale)?))
}

/// [`Tensor::linspace`]'s values in float64 on `device`, computed there where
/// each is exact ([`fma_line`]: the first half `fma(step, i, start)`, the second
/// `fma(-step, steps - 1 - i, end)`, as [`linspace_on_host`] computes them);
/// `None` where one half is not.
fn linspace_exact(start: f64, end: f64, steps: usize, device: &Device) -> Result<Option<Tensor>> {
    let step = if steps > 1 {
        (end - start) / (steps - 1) as f64
    } else {
        0.0
    };
    let half = if steps == 1 { 1 } else { steps / 2 };
    let Some(lower) = fma_line(step, start, half, false, device)? else {
        return Ok(None);
    };
    if half == steps {
        return Ok(Some(lower));
    }
    let Some(upper) = fma_line(-step, end, steps - half, true, device)? else {
        return Ok(None);
    };
    Tensor::cat(&[&lower, &upper], 0).map(Some)
}
