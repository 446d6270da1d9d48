//! Making tensors (zeros, ones, full, random, from Rust data; arange, linspace
//! and eye in `ranges`) and reading values back (`to_vec*`, `item`).

use super::shape::{dims_of, IntoShape};
use super::Tensor;
use crate::backend::host::try_collect;
use crate::backend::op::Scalar;
use crate::backend::{Dist, Storage};
use crate::dtype::WithDType;
use crate::dtype::{CpuData, CpuElem};
use crate::layout::{checked_numel, Dims};
use crate::{
    device::Device,
    dtype::DType,
    error::{Error, Result},
};
use half::{bf16, f16};
use smallvec::SmallVec;

mod ranges;

/// The C++ name PyTorch's overflow errors give a dtype.
fn cpp_type_name(dt: DType) -> &'static str {
    match dt {
        DType::Bool => "bool",
        DType::U8 => "uint8_t",
        DType::I64 => "int64_t",
        DType::F16 => "c10::Half",
        DType::BF16 => "c10::BFloat16",
        DType::F32 => "float",
        DType::F64 => "double",
    }
}

/// PyTorch's checked conversion of a Python number into `dtype` (`fill_`, `full`,
/// `masked_fill`, `linspace`'s endpoints): an error when the value does not fit.
/// Integers in `[-255, 255]` wrap into uint8; floats must lie in `[0, 256)`
/// (uint8) or `[-2^63, 2^63)` (int64) and not be NaN; a finite value beyond a
/// float dtype's largest is an error, infinities and NaN are not; bools take
/// anything.
pub(crate) fn check_fill_value(op: &'static str, s: Scalar, dtype: DType) -> Result<()> {
    const TWO_63: f64 = 9_223_372_036_854_775_808.0;
    let fits = match (s, dtype) {
        (Scalar::Bool(_), _) | (_, DType::Bool | DType::F64) => true,
        (Scalar::Int(i), DType::U8) => (-255..=255).contains(&i),
        (Scalar::Int(_), DType::I64) => true,
        (Scalar::Float(f), DType::U8) => (0.0..256.0).contains(&f),
        (Scalar::Float(f), DType::I64) => (-TWO_63..TWO_63).contains(&f),
        (s, DType::F16 | DType::BF16 | DType::F32) => {
            let v = s.to_f64();
            let max = match dtype {
                DType::F16 => f16::MAX.to_f64(),
                DType::BF16 => bf16::MAX.to_f64(),
                _ => f32::MAX as f64,
            };
            !v.is_finite() || v.abs() <= max
        }
    };
    if fits {
        return Ok(());
    }
    let shown = match s {
        Scalar::Int(i) => i.to_string(),
        other => format!("{:?}", other.to_f64()),
    };
    Err(Error::invalid(
        op,
        format!(
            "value cannot be converted to type {} without overflow (value {shown}, dtype {dtype})",
            cpp_type_name(dtype)
        ),
    ))
}

/// Creation is possible only on devices that exist.
fn check_creatable(device: &Device) -> Result<()> {
    Storage::check_device(*device)
}

impl Tensor {
    /// `torch.zeros(shape, dtype=..., device=...)`.
    pub fn zeros(shape: impl IntoShape, dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::full(shape, 0.0, dtype, device)
    }

    /// `torch.ones`.
    pub fn ones(shape: impl IntoShape, dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::full(shape, 1.0, dtype, device)
    }

    /// `torch.full`: `value` (a float, an integer or a bool, like a Python number)
    /// converted to `dtype` everywhere. As in PyTorch, a value the dtype cannot hold
    /// is an error: a float outside `[0, 256)` (or NaN) for uint8, outside the int64
    /// range (or NaN) for int64, a finite float beyond the largest float16, bfloat16
    /// or float32; integers in `[-255, 255]` wrap into uint8 (`-1` is 255).
    pub fn full(
        shape: impl IntoShape,
        value: impl Into<Scalar>,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let dims = dims_of("full", &shape)?;
        let value = value.into();
        check_fill_value("full", value, dtype)?;
        Tensor::full_scalar(&dims, value, dtype, *device)
    }

    /// A contiguous tensor of `s` converted to `dtype` (as a cast converts it).
    pub(crate) fn full_scalar(
        shape: &[usize],
        s: Scalar,
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        let n = shape.iter().product();
        Ok(Tensor::from_storage(
            Storage::full(device, dtype, n, s)?,
            shape,
        ))
    }

    /// `torch.empty`: a tensor whose values are unspecified until written (for
    /// buffers filled next, and [`Module::to_empty`](crate::nn::Module::to_empty)).
    pub fn empty(shape: impl IntoShape, dtype: DType, device: &Device) -> Result<Tensor> {
        let dims = dims_of("empty", &shape)?;
        let n = dims.iter().product();
        Ok(Tensor::from_storage(
            Storage::empty(*device, dtype, n)?,
            &dims,
        ))
    }

    /// [`empty`](Self::empty) with this tensor's shape, dtype and device.
    pub fn empty_like(&self) -> Result<Tensor> {
        Ok(self.fill_like(Tensor::empty(self.shape(), self.dtype(), &self.device())?))
    }

    /// Zeros with this tensor's shape, dtype and device (and its memory format, as
    /// PyTorch's `preserve_format`: a channels-last tensor gives a channels-last
    /// one).
    pub fn zeros_like(&self) -> Result<Tensor> {
        Ok(self.fill_like(Tensor::zeros(self.shape(), self.dtype(), &self.device())?))
    }

    /// Ones with this tensor's shape, dtype, device and memory format.
    pub fn ones_like(&self) -> Result<Tensor> {
        Ok(self.fill_like(Tensor::ones(self.shape(), self.dtype(), &self.device())?))
    }

    /// `value` with this tensor's shape, dtype, device and memory format (checked
    /// as in [`full`](Self::full)).
    pub fn full_like(&self, value: impl Into<Scalar>) -> Result<Tensor> {
        let t = Tensor::full(self.shape(), value, self.dtype(), &self.device())?;
        Ok(self.fill_like(t))
    }

    /// A 0-dimensional tensor holding `value`.
    pub fn scalar<T: WithDType>(value: T, device: &Device) -> Result<Tensor> {
        Tensor::from_host(T::wrap(vec![value]), &[], *device)
    }

    /// A tensor from (nested) Rust arrays, slices or vectors:
    /// `Tensor::new(&[[1f32, 2.], [3., 4.]], &dev)`. Integer literals give int64,
    /// like `torch.tensor([1, 2])`.
    pub fn new<A: NdArray>(data: A, device: &Device) -> Result<Tensor> {
        let shape = data.shape()?;
        check_creatable(device)?;
        let mut v = Vec::with_capacity(shape.iter().product());
        data.push_to(&mut v);
        Tensor::from_host(A::Elem::wrap(v), &shape, *device)
    }

    /// A tensor of `shape` from a vector holding its elements in row-major order.
    pub fn from_vec<T: WithDType>(
        data: Vec<T>,
        shape: impl IntoShape,
        device: &Device,
    ) -> Result<Tensor> {
        let dims = dims_of("from_vec", &shape)?;
        let n: usize = dims.iter().product();
        if n != data.len() {
            return Err(Error::invalid(
                "from_vec",
                format!(
                    "shape {:?} needs {n} elements but the data has {}",
                    dims.as_slice(),
                    data.len()
                ),
            ));
        }
        Tensor::from_host(T::wrap(data), &dims, *device)
    }

    /// Like [`from_vec`](Self::from_vec), copying from a slice.
    pub fn from_slice<T: WithDType>(
        data: &[T],
        shape: impl IntoShape,
        device: &Device,
    ) -> Result<Tensor> {
        Tensor::from_vec(data.to_vec(), shape, device)
    }

    /// Uniform samples from `[0, 1)`, float32 (`torch.rand`).
    pub fn rand(shape: impl IntoShape, device: &Device) -> Result<Tensor> {
        Tensor::uniform(0.0, 1.0, shape, DType::F32, device)
    }

    /// Standard normal samples, float32 (`torch.randn`).
    pub fn randn(shape: impl IntoShape, device: &Device) -> Result<Tensor> {
        Tensor::normal(0.0, 1.0, shape, DType::F32, device)
    }

    /// Uniform samples from `[lo, hi)` in a float `dtype` (`lo` where they are
    /// equal); bounds that are not finite, or `lo > hi`, are refused, as
    /// PyTorch's `uniform_` refuses them.
    pub fn uniform(
        lo: f64,
        hi: f64,
        shape: impl IntoShape,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let dims = dims_of("uniform", &shape)?;
        check_float("uniform", dtype)?;
        // bounds the dtype holds, and a width it holds (PyTorch's checks, in
        // its order): a draw past them rounds to an infinity
        let (max, c10, limits) = match dtype {
            DType::F16 => (65504.0, "c10::Half", "Half"),
            DType::BF16 => (3.3895313892515355e38, "c10::BFloat16", "BFloat16"),
            DType::F32 => (f32::MAX as f64, "float", "float"),
            _ => (f64::MAX, "double", "double"),
        };
        for (which, v) in [("from", lo), ("to", hi)] {
            if !v.is_finite() || v.abs() > max {
                return Err(Error::invalid(
                    "uniform",
                    format!("{which} is out of bounds for {c10}"),
                ));
            }
        }
        if lo <= hi && hi - lo > max {
            return Err(Error::invalid(
                "uniform",
                format!(
                    "uniform_ expects to-from <= std::numeric_limits<{limits}>::max(), but found \
                     to={hi} and from={lo} which result in to-from to exceed the limit"
                ),
            ));
        }
        // (the width too: values are lo + (hi - lo) · u)
        if !(lo <= hi && (hi - lo).is_finite()) {
            return Err(Error::invalid(
                "uniform",
                format!("expects to return a [from, to) range of finite bounds, but found from={lo}, to={hi}"),
            ));
        }
        Tensor::random(&dims, dtype, *device, Dist::Uniform(lo, hi))
    }

    fn random(shape: &[usize], dtype: DType, device: Device, dist: Dist) -> Result<Tensor> {
        let n = shape.iter().product();
        Ok(Tensor::from_storage(
            Storage::random(device, dtype, n, dist)?,
            shape,
        ))
    }

    /// Normal samples with `mean` and `std` in a float `dtype`; a `std` below 0
    /// (or NaN) is refused, as PyTorch's `normal` refuses it.
    pub fn normal(
        mean: f64,
        std: f64,
        shape: impl IntoShape,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let dims = dims_of("normal", &shape)?;
        check_float("normal", dtype)?;
        if std.is_nan() || std < 0.0 {
            return Err(Error::invalid(
                "normal",
                format!("expects std >= 0.0, but found std {std}"),
            ));
        }
        Tensor::random(&dims, dtype, *device, Dist::Normal(mean, std))
    }

    /// Integers drawn uniformly from `[low, high)`, int64 (`torch.randint`), on
    /// `device` from its generator (a GPU's Philox stream: inside a CUDA graph
    /// capture too, new numbers at each replay).
    pub fn randint(low: i64, high: i64, shape: impl IntoShape, device: &Device) -> Result<Tensor> {
        let dims = dims_of("randint", &shape)?;
        if high <= low {
            return Err(Error::invalid(
                "randint",
                format!("expected low < high, got low={low}, high={high}"),
            ));
        }
        check_creatable(device)?;
        Tensor::random(&dims, DType::I64, *device, Dist::Integers(low, high))
    }

    /// A random permutation of `0..n`, int64 (`torch.randperm`), drawn on the host
    /// from the CPU's generator and copied to `device` (not inside a CUDA graph
    /// capture, which cannot hold the copy).
    pub fn randperm(n: usize, device: &Device) -> Result<Tensor> {
        use rand::seq::SliceRandom;
        check_creatable(device)?;
        checked_numel("randperm", &[n])?;
        Tensor::from_host_with(&[n], DType::I64, *device, || {
            let mut v = try_collect(n, 0..n as i64)?;
            super::with_global_rng(|r| v.shuffle(r))?;
            Ok(CpuData::I64(v))
        })
        .map_err(|e| made_on_host("randperm", e))
    }

    /// Uniform `[0, 1)` samples with this tensor's shape, dtype and device.
    pub fn rand_like(&self) -> Result<Tensor> {
        Tensor::uniform(0.0, 1.0, self.shape(), self.dtype(), &self.device())
    }

    /// Standard normal samples with this tensor's shape, dtype and device.
    pub fn randn_like(&self) -> Result<Tensor> {
        Tensor::normal(0.0, 1.0, self.shape(), self.dtype(), &self.device())
    }

    /// All elements, row-major, converted to `T`.
    pub fn to_vec<T: WithDType>(&self) -> Result<Vec<T>> {
        self.values("to_vec")
    }

    /// All elements, row-major, converted to `T` (`op` names the caller in errors:
    /// reading a `meta` tensor is one). Waits for queued GPU work.
    pub(crate) fn values<T: WithDType>(&self, op: &'static str) -> Result<Vec<T>> {
        if !self.read().holds_values() {
            // meta's answer is its no-data error; asked before converting, since a
            // meta conversion would be reported as an allocation
            return self.read().to_host(self.layout(), op).map(|_| Vec::new());
        }
        let t = self.to_dtype(T::DTYPE)?;
        let mut data = t.read().to_host(t.layout(), op)?;
        Ok(std::mem::take(
            T::slice_mut(&mut data).expect("to_vec: converted to T"),
        ))
    }

    /// All elements, row-major, in this tensor's dtype, on the host (`op` names
    /// the caller in errors). Waits for queued GPU work.
    pub(crate) fn host_data(&self, op: &'static str) -> Result<CpuData> {
        let t = self.contiguous()?;
        let data = t.read().to_host(t.layout(), op)?;
        Ok(data)
    }

    /// The values of a 1-D tensor, converted to `T`.
    pub fn to_vec1<T: WithDType>(&self) -> Result<Vec<T>> {
        self.expect_rank("to_vec1", 1)?;
        self.to_vec()
    }

    /// The rows of a 2-D tensor, converted to `T`.
    pub fn to_vec2<T: WithDType>(&self) -> Result<Vec<Vec<T>>> {
        self.expect_rank("to_vec2", 2)?;
        let v = self.to_vec::<T>()?;
        let cols = self.shape()[1];
        Ok((0..self.shape()[0])
            .map(|i| v[i * cols..(i + 1) * cols].to_vec())
            .collect())
    }

    /// The values of a 3-D tensor, converted to `T`.
    pub fn to_vec3<T: WithDType>(&self) -> Result<Vec<Vec<Vec<T>>>> {
        self.expect_rank("to_vec3", 3)?;
        let v = self.to_vec::<T>()?;
        let (a, b, c) = (self.shape()[0], self.shape()[1], self.shape()[2]);
        Ok((0..a)
            .map(|i| {
                (0..b)
                    .map(|j| v[(i * b + j) * c..(i * b + j + 1) * c].to_vec())
                    .collect()
            })
            .collect())
    }

    /// The one value of a one-element tensor, converted to `T` (`tensor.item()`).
    pub fn item<T: WithDType>(&self) -> Result<T> {
        if self.numel() != 1 {
            return Err(Error::invalid(
                "item",
                format!(
                    "a Tensor with {} elements cannot be converted to a scalar",
                    self.numel()
                ),
            ));
        }
        Ok(self.values::<T>("item")?[0])
    }

    pub(crate) fn expect_rank(&self, op: &'static str, rank: usize) -> Result<()> {
        if self.rank() != rank {
            return Err(Error::invalid(
                op,
                format!("expected a {rank}-D tensor, got shape {:?}", self.shape()),
            ));
        }
        Ok(())
    }
}

/// `op`'s name on a CUDA graph capture's refusal of the copy that brings its
/// values from the host (other errors unchanged).
fn made_on_host(op: &'static str, e: Error) -> Error {
    match e {
        Error::InvalidArgument {
            op: "cuda::Graph",
            msg,
        } => Error::invalid(op, format!("its values are made on the host: {msg}")),
        e => e,
    }
}

fn check_float(op: &'static str, dtype: DType) -> Result<()> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(Error::dtype(op, dtype, "expected a floating-point dtype"))
    }
}

// ---------------------------------------------------------------------------------
// Nested Rust data

/// Rust data that becomes a tensor: scalars, arrays, slices and vectors of them.
pub trait NdArray {
    /// The element type stored.
    type Elem: WithDType;
    /// The shape, or an error for ragged data.
    fn shape(&self) -> Result<Dims>;
    /// Appends the elements in row-major order.
    fn push_to(&self, out: &mut Vec<Self::Elem>);
}

macro_rules! nd_scalar {
    ($t:ty, $e:ty, $conv:expr) => {
        impl NdArray for $t {
            type Elem = $e;
            fn shape(&self) -> Result<Dims> {
                Ok(SmallVec::new())
            }
            fn push_to(&self, out: &mut Vec<$e>) {
                out.push($conv(*self));
            }
        }
    };
}
nd_scalar!(f32, f32, |x| x);
nd_scalar!(f64, f64, |x| x);
nd_scalar!(f16, f16, |x| x);
nd_scalar!(bf16, bf16, |x| x);
nd_scalar!(i64, i64, |x| x);
nd_scalar!(i32, i64, |x: i32| x as i64);
nd_scalar!(u8, u8, |x| x);
nd_scalar!(bool, bool, |x| x);

fn seq_shape<A: NdArray>(items: &[A]) -> Result<Dims> {
    let inner = match items.first() {
        Some(a) => a.shape()?,
        None => SmallVec::new(),
    };
    for a in items.iter().skip(1) {
        if a.shape()? != inner {
            return Err(Error::invalid(
                "new",
                format!(
                    "ragged nested data: expected every element to have shape {:?}",
                    inner.as_slice()
                ),
            ));
        }
    }
    let mut s: Dims = smallvec::smallvec![items.len()];
    s.extend_from_slice(&inner);
    Ok(s)
}

impl<A: NdArray, const N: usize> NdArray for [A; N] {
    type Elem = A::Elem;
    fn shape(&self) -> Result<Dims> {
        seq_shape(self)
    }
    fn push_to(&self, out: &mut Vec<A::Elem>) {
        self.iter().for_each(|a| a.push_to(out));
    }
}

impl<A: NdArray> NdArray for [A] {
    type Elem = A::Elem;
    fn shape(&self) -> Result<Dims> {
        seq_shape(self)
    }
    fn push_to(&self, out: &mut Vec<A::Elem>) {
        self.iter().for_each(|a| a.push_to(out));
    }
}

impl<A: NdArray> NdArray for Vec<A> {
    type Elem = A::Elem;
    fn shape(&self) -> Result<Dims> {
        seq_shape(self)
    }
    fn push_to(&self, out: &mut Vec<A::Elem>) {
        self.iter().for_each(|a| a.push_to(out));
    }
}

impl<A: NdArray + ?Sized> NdArray for &A {
    type Elem = A::Elem;
    fn shape(&self) -> Result<Dims> {
        (**self).shape()
    }
    fn push_to(&self, out: &mut Vec<A::Elem>) {
        (**self).push_to(out)
    }
}
