// Over 800 lines: the one dispatch point, a method per primitive: split, the matches a new device must extend would be split too.
//! The one dispatch point: [`Storage`], the values behind a tensor on one device,
//! with a method per primitive that hands the work to that device's backend. A
//! device added to [`Storage`] makes each `match` below name what it lacks; a
//! primitive added to [`BackendStorage`] must be written for every device before
//! ember compiles.

use super::cpu::CpuStorage;
use super::cuda::CudaStorage;
use super::meta::MetaStorage;
use super::op::{
    attn_arch_refuses, attn_kernel_refuses, AdamStep, AttnShape, BinaryOp, CmpOp, ConvShape, Pool,
    PoolShape, ReduceOp, Scalar, ScanOp, SgdStep, UnaryOp,
};
use super::primitives::{BackendStorage, ConvGrads, Dist};
use super::profile::{self, Begin, EventKind, Name, Scope};
use crate::dtype::CpuData;
use crate::layout::Layout;
use crate::{
    device::Device,
    dtype::DType,
    error::{Error, Result},
};

/// The values behind a tensor, on one device.
#[derive(Debug)]
pub(crate) enum Storage {
    Cpu(CpuStorage),
    Cuda(CudaStorage),
    Meta(MetaStorage),
}

/// Any storage: the catch-all arms name every variant, so that a new device makes
/// each `match` here fail to compile until it has its own arm.
macro_rules! any {
    () => {
        Storage::Cpu(_) | Storage::Cuda(_) | Storage::Meta(_)
    };
}

/// Applies `$body` to the backend storage inside `$s` (bound as `$x`) and wraps the
/// result in the same variant.
macro_rules! each {
    ($s:expr, |$x:ident| $body:expr) => {
        match $s {
            Storage::Cpu($x) => Storage::Cpu($body),
            Storage::Cuda($x) => Storage::Cuda($body),
            Storage::Meta($x) => Storage::Meta($body),
        }
    };
}

/// Like [`each`] for two storages of one device; storages of two devices (which
/// the tensor layer refuses before) are an error.
macro_rules! pair {
    ($op:expr, $a:expr, $b:expr, |$x:ident, $y:ident| $body:expr) => {
        match ($a, $b) {
            (Storage::Cpu($x), Storage::Cpu($y)) => Storage::Cpu($body),
            (Storage::Cuda($x), Storage::Cuda($y)) => Storage::Cuda($body),
            (Storage::Meta($x), Storage::Meta($y)) => Storage::Meta($body),
            (a @ any!(), b) => return Err(mismatch($op, a.device(), b.device())),
        }
    };
}

/// Like [`pair`] with an optional third operand (a bias) that must be on the same
/// device: `$z` binds it as the backend's own storage, or `None`.
macro_rules! pair_opt {
    ($op:expr, $a:expr, $b:expr, $c:expr, |$x:ident, $y:ident, $z:ident| $body:expr) => {
        match ($a, $b, $c) {
            (Storage::Cpu($x), Storage::Cpu($y), None) => {
                let $z = None;
                Storage::Cpu($body)
            }
            (Storage::Cpu($x), Storage::Cpu($y), Some((Storage::Cpu(c), lc))) => {
                let $z = Some((c, lc));
                Storage::Cpu($body)
            }
            (Storage::Cuda($x), Storage::Cuda($y), None) => {
                let $z = None;
                Storage::Cuda($body)
            }
            (Storage::Cuda($x), Storage::Cuda($y), Some((Storage::Cuda(c), lc))) => {
                let $z = Some((c, lc));
                Storage::Cuda($body)
            }
            (Storage::Meta($x), Storage::Meta($y), None) => {
                let $z = None;
                Storage::Meta($body)
            }
            (Storage::Meta($x), Storage::Meta($y), Some((Storage::Meta(c), lc))) => {
                let $z = Some((c, lc));
                Storage::Meta($body)
            }
            (a @ any!(), b, c) => {
                let other = [Some(b.device()), c.map(|c| c.0.device())]
                    .into_iter()
                    .flatten()
                    .find(|d| *d != a.device())
                    .unwrap_or(a.device());
                return Err(mismatch($op, a.device(), other));
            }
        }
    };
}

/// The profiler's record of a primitive on a storage (`$s`), named `$name`, with
/// the shapes of its operands; nothing at all (one atomic load) while no
/// profiling session records.
macro_rules! record {
    ($s:expr, $name:expr $(, $shape:expr)*) => {
        if profile::active() {
            $s.record_begin($name, &[$($shape),*])
        } else {
            None
        }
    };
}

/// [`record!`] for a primitive that makes storage on `$device`.
macro_rules! record_on {
    ($device:expr, $dtype:expr, $name:expr, $n:expr) => {
        if profile::active() {
            record_new($device, $dtype, $name, $n)
        } else {
            None
        }
    };
}

#[cold]
#[inline(never)]
fn record_new(device: Device, dtype: DType, name: &'static str, n: usize) -> Option<Scope> {
    let span = match device {
        Device::Cuda(i) => super::cuda::dev(i)
            .ok()
            .and_then(|d| super::cuda::profile::span(&d)),
        Device::Cpu | Device::Meta => None,
    };
    profile::begin(
        Begin {
            name: Name::Static(name),
            kind: EventKind::Op,
            device: Some(device),
            dtype: Some(dtype),
            shapes: &[&[n]],
            module: None,
        },
        span,
    )
}

/// The attention bias `$bias` (`Option<(&Storage, &Layout)>`) as the backend
/// `$dev`'s storage, or (returned) the error of a bias on another device than
/// `$q`.
macro_rules! attn_bias {
    ($q:expr, $bias:expr, $dev:ident) => {
        match $bias {
            None => None,
            Some((Storage::$dev(b), l)) => Some((b, l)),
            Some((b, _)) => return Err(mismatch("attention", $q.device(), b.device())),
        }
    };
}

/// The error for storages of two devices in one primitive.
fn mismatch(op: &'static str, a: Device, b: Device) -> Error {
    let (a, b) = if b.is_cuda() && !a.is_cuda() {
        (b, a)
    } else {
        (a, b)
    };
    Error::DeviceMismatch { op, a, b }
}

impl Storage {
    /// Opens the profiler's record of a primitive on this storage (see [`record!`]),
    /// with timing events on its stream for a GPU's.
    #[cold]
    #[inline(never)]
    fn record_begin(&self, name: Name, shapes: &[&[usize]]) -> Option<Scope> {
        let span = match self {
            Storage::Cuda(s) => super::cuda::profile::span(s.dev()),
            Storage::Cpu(_) | Storage::Meta(_) => None,
        };
        profile::begin(
            Begin {
                name,
                kind: EventKind::Op,
                device: Some(self.device()),
                dtype: Some(self.dtype()),
                shapes,
                module: None,
            },
            span,
        )
    }

    pub(crate) fn dtype(&self) -> DType {
        match self {
            Storage::Cpu(s) => s.dtype(),
            Storage::Cuda(s) => s.dtype(),
            Storage::Meta(s) => s.dtype(),
        }
    }

    pub(crate) fn device(&self) -> Device {
        match self {
            Storage::Cpu(s) => s.device(),
            Storage::Cuda(s) => s.device(),
            Storage::Meta(s) => s.device(),
        }
    }

    /// `false` for `meta` storage, which has no values to read.
    pub(crate) fn holds_values(&self) -> bool {
        match self {
            Storage::Cpu(_) | Storage::Cuda(_) => true,
            Storage::Meta(_) => false,
        }
    }

    /// The CUDA storage, for user kernels (`ember::kernel`), which run only there.
    pub(crate) fn as_cuda(&self) -> Option<&CudaStorage> {
        match self {
            Storage::Cuda(s) => Some(s),
            _ => None,
        }
    }

    /// Marks this storage's memory as used by the work queued on `stream` so far
    /// (`Tensor.record_stream`); an error for storage not on the stream's device.
    pub(crate) fn record_stream(&self, stream: &super::cuda::Stream) -> Result<()> {
        match self {
            Storage::Cuda(st) if st.dev().device() == stream.device() => {
                st.dev().record_stream(st.ptr(), stream.id);
                Ok(())
            }
            _ => Err(Error::DeviceMismatch {
                op: "record_stream",
                a: self.device(),
                b: stream.device(),
            }),
        }
    }

    /// Errors unless `device` exists (a GPU that is not there, or no GPU at all).
    pub(crate) fn check_device(device: Device) -> Result<()> {
        match device {
            Device::Cuda(_) => super::cuda::discover::check_device(device),
            Device::Cpu | Device::Meta => Ok(()),
        }
    }

    // ---- creation

    /// `n` elements of `value` (converted to `dtype` as a cast converts it) on
    /// `device`.
    pub(crate) fn full(device: Device, dtype: DType, n: usize, value: Scalar) -> Result<Storage> {
        let _rec = record_on!(device, dtype, "fill", n);
        Ok(match device {
            Device::Cpu => Storage::Cpu(CpuStorage::full(dtype, n, value)?),
            Device::Cuda(i) => {
                Storage::Cuda(CudaStorage::full(&super::cuda::dev(i)?, dtype, n, value)?)
            }
            Device::Meta => Storage::Meta(MetaStorage::new(dtype, n)?),
        })
    }

    /// `n` elements of `dtype` on `device` whose values are unspecified: the caller
    /// writes every one (or the user asked for `empty`).
    pub(crate) fn empty(device: Device, dtype: DType, n: usize) -> Result<Storage> {
        Ok(match device {
            Device::Cpu => Storage::Cpu(CpuStorage::empty(dtype, n)?),
            Device::Cuda(i) => Storage::Cuda(CudaStorage::alloc(&super::cuda::dev(i)?, dtype, n)?),
            Device::Meta => Storage::Meta(MetaStorage::new(dtype, n)?),
        })
    }

    /// Host values on `device` (kept for the CPU, uploaded to a GPU).
    pub(crate) fn from_host(device: Device, data: CpuData) -> Result<Storage> {
        let _rec = record_on!(device, data.dtype(), "from_host", data.len());
        Ok(match device {
            Device::Cpu => Storage::Cpu(CpuStorage::new(data)),
            Device::Cuda(i) => Storage::Cuda(CudaStorage::from_cpu(&super::cuda::dev(i)?, &data)?),
            Device::Meta => Storage::Meta(MetaStorage::new(data.dtype(), data.len())?),
        })
    }

    /// [`from_host`](Self::from_host) of the `n` values of `dtype` that `make`
    /// computes, which `meta` never calls (no values, no random draws).
    pub(crate) fn from_host_with(
        device: Device,
        dtype: DType,
        n: usize,
        make: impl FnOnce() -> Result<CpuData>,
    ) -> Result<Storage> {
        match device {
            Device::Meta => Ok(Storage::Meta(MetaStorage::new(dtype, n)?)),
            Device::Cpu | Device::Cuda(_) => {
                let data = make()?;
                debug_assert_eq!((data.dtype(), data.len()), (dtype, n));
                Storage::from_host(device, data)
            }
        }
    }

    /// `n` random values of the float `dtype` from the device's generator.
    pub(crate) fn random(device: Device, dtype: DType, n: usize, dist: Dist) -> Result<Storage> {
        let _rec = record_on!(device, dtype, "random", n);
        Ok(match device {
            Device::Cpu => Storage::Cpu(CpuStorage::random(dtype, n, dist)?),
            Device::Cuda(i) => {
                Storage::Cuda(CudaStorage::random(&super::cuda::dev(i)?, dtype, n, dist)?)
            }
            Device::Meta => Storage::Meta(MetaStorage::new(dtype, n)?),
        })
    }

    /// The elements of `l` copied to another device (contiguous).
    pub(crate) fn to_device(&self, l: &Layout, device: Device) -> Result<Storage> {
        let _rec = record!(self, Name::Static("to"), l.shape());
        let n = l.numel();
        Ok(match (self, device) {
            (_, Device::Meta) => Storage::Meta(MetaStorage::new(self.dtype(), n)?),
            (Storage::Meta(_), _) => {
                return Err(Error::MetaNoData {
                    op: "to",
                    hint: "to move a model built on meta to a device, allocate it there with \
                           to_empty and initialise its parameters",
                })
            }
            (Storage::Cpu(s), Device::Cuda(i)) => {
                let dev = super::cuda::dev(i)?;
                match l.contiguous_range() {
                    Some(r) => Storage::Cuda(CudaStorage::from_cpu_range(&dev, s.data(), r)?),
                    None => Storage::Cuda(CudaStorage::from_cpu(&dev, s.copy(l)?.data())?),
                }
            }
            // from a GPU: to the host first
            (s @ (Storage::Cpu(_) | Storage::Cuda(_)), d @ (Device::Cpu | Device::Cuda(_))) => {
                Storage::from_host(d, s.to_host(l, "to")?)?
            }
        })
    }

    // ---- copies and casts

    pub(crate) fn to_dtype(&self, l: &Layout, dtype: DType) -> Result<Storage> {
        let _rec = record!(self, Name::Static("to_dtype"), l.shape());
        Ok(each!(self, |s| s.to_dtype(l, dtype)?))
    }

    pub(crate) fn copy(&self, l: &Layout) -> Result<Storage> {
        let _rec = record!(self, Name::Static("copy"), l.shape());
        Ok(each!(self, |s| s.copy(l)?))
    }

    pub(crate) fn copy_into(&self, l: &Layout, dst: &mut Storage, ld: &Layout) -> Result<()> {
        let _rec = record!(self, Name::Static("copy_"), l.shape(), ld.shape());
        match (self, dst) {
            (Storage::Cpu(a), Storage::Cpu(b)) => a.copy_into(l, b, ld),
            (Storage::Cuda(a), Storage::Cuda(b)) => a.copy_into(l, b, ld),
            (Storage::Meta(a), Storage::Meta(b)) => a.copy_into(l, b, ld),
            (a @ any!(), b) => Err(mismatch("copy_", a.device(), b.device())),
        }
    }

    pub(crate) fn to_host(&self, l: &Layout, op: &'static str) -> Result<CpuData> {
        let _rec = record!(self, Name::Static("to_host"), l.shape());
        match self {
            Storage::Cpu(s) => s.to_host(l, op),
            Storage::Cuda(s) => s.to_host(l, op),
            Storage::Meta(s) => s.to_host(l, op),
        }
    }

    // ---- elementwise

    pub(crate) fn unary<O: UnaryOp>(&self, l: &Layout, op: &O) -> Result<Storage> {
        let _rec = record!(self, Name::Code(op.code().0.name()), l.shape());
        Ok(each!(self, |s| s.unary(l, op)?))
    }

    pub(crate) fn binary<O: BinaryOp>(
        &self,
        l: &Layout,
        rhs: &Storage,
        lr: &Layout,
        op: &O,
    ) -> Result<Storage> {
        let _rec = record!(self, Name::Code(O::CODE.name()), l.shape(), lr.shape());
        Ok(pair!("binary op", self, rhs, |a, b| a.binary(l, b, lr, op)?))
    }

    pub(crate) fn binary_scalar<O: BinaryOp>(
        &self,
        l: &Layout,
        s: Scalar,
        op: &O,
    ) -> Result<Storage> {
        let _rec = record!(self, Name::Code(O::CODE.name()), l.shape());
        Ok(each!(self, |x| x.binary_scalar(l, s, op)?))
    }

    pub(crate) fn binary_inplace<O: BinaryOp>(
        &mut self,
        l: &Layout,
        rhs: &Storage,
        lr: &Layout,
        op: &O,
    ) -> Result<()> {
        let _rec = record!(self, Name::Inplace(O::CODE.name()), l.shape(), lr.shape());
        match (self, rhs) {
            (Storage::Cpu(a), Storage::Cpu(b)) => a.binary_inplace(l, b, lr, op),
            (Storage::Cuda(a), Storage::Cuda(b)) => a.binary_inplace(l, b, lr, op),
            (Storage::Meta(a), Storage::Meta(b)) => a.binary_inplace(l, b, lr, op),
            (a @ any!(), b) => Err(mismatch("in-place op", a.device(), b.device())),
        }
    }

    pub(crate) fn binary_scalar_inplace<O: BinaryOp>(
        &mut self,
        l: &Layout,
        s: Scalar,
        op: &O,
    ) -> Result<()> {
        let _rec = record!(self, Name::Inplace(O::CODE.name()), l.shape());
        match self {
            Storage::Cpu(x) => x.binary_scalar_inplace(l, s, op),
            Storage::Cuda(x) => x.binary_scalar_inplace(l, s, op),
            Storage::Meta(x) => x.binary_scalar_inplace(l, s, op),
        }
    }

    pub(crate) fn compare(
        &self,
        l: &Layout,
        rhs: &Storage,
        lr: &Layout,
        op: CmpOp,
    ) -> Result<Storage> {
        let _rec = record!(self, Name::Code(op.name()), l.shape(), lr.shape());
        Ok(pair!("comparison", self, rhs, |a, b| a.compare(l, b, lr, op)?))
    }

    pub(crate) fn compare_scalar(&self, l: &Layout, s: Scalar, op: CmpOp) -> Result<Storage> {
        let _rec = record!(self, Name::Code(op.name()), l.shape());
        Ok(each!(self, |x| x.compare_scalar(l, s, op)?))
    }

    pub(crate) fn where_(
        &self,
        l: &Layout,
        a: &Storage,
        la: &Layout,
        b: &Storage,
        lb: &Layout,
    ) -> Result<Storage> {
        let _rec = record!(a, Name::Static("where"), l.shape(), la.shape(), lb.shape());
        Ok(match (self, a, b) {
            (Storage::Cpu(c), Storage::Cpu(x), Storage::Cpu(y)) => {
                Storage::Cpu(c.where_(l, x, la, y, lb)?)
            }
            (Storage::Cuda(c), Storage::Cuda(x), Storage::Cuda(y)) => {
                Storage::Cuda(c.where_(l, x, la, y, lb)?)
            }
            (Storage::Meta(c), Storage::Meta(x), Storage::Meta(y)) => {
                Storage::Meta(c.where_(l, x, la, y, lb)?)
            }
            (c @ any!(), x, y) => {
                let other = [x.device(), y.device()]
                    .into_iter()
                    .find(|d| *d != c.device())
                    .unwrap_or(c.device());
                return Err(mismatch("where", c.device(), other));
            }
        })
    }

    // ---- reductions

    pub(crate) fn reduce(&self, l: &Layout, dims: &[usize], op: ReduceOp) -> Result<Storage> {
        let _rec = record!(self, Name::Code(op.code().0.name()), l.shape());
        Ok(each!(self, |s| s.reduce(l, dims, op)?))
    }

    pub(crate) fn softmax(&self, l: &Layout, log: bool) -> Result<Storage> {
        let _rec = record!(
            self,
            Name::Static(if log { "log_softmax" } else { "softmax" }),
            l.shape()
        );
        Ok(each!(self, |s| s.softmax(l, log)?))
    }

    pub(crate) fn softmax_backward(
        &self,
        l: &Layout,
        y: &Storage,
        ly: &Layout,
        log: bool,
    ) -> Result<Storage> {
        let _rec = record!(self, Name::Static("softmax_backward"), l.shape());
        Ok(pair!("softmax", self, y, |g, y| g
            .softmax_backward(l, y, ly, log)?))
    }

    pub(crate) fn norm_rows(&self, l: &Layout, eps: f64, rms: bool) -> Result<(Storage, Storage)> {
        let _rec = record!(self, Name::Static("norm_rows"), l.shape());
        Ok(match self {
            Storage::Cpu(s) => {
                let (y, r) = s.norm_rows(l, eps, rms)?;
                (Storage::Cpu(y), Storage::Cpu(r))
            }
            Storage::Cuda(s) => {
                let (y, r) = s.norm_rows(l, eps, rms)?;
                (Storage::Cuda(y), Storage::Cuda(r))
            }
            Storage::Meta(s) => {
                let (y, r) = s.norm_rows(l, eps, rms)?;
                (Storage::Meta(y), Storage::Meta(r))
            }
        })
    }

    pub(crate) fn norm_rows_backward(
        &self,
        l: &Layout,
        xhat: &Storage,
        rstd: &Storage,
        rms: bool,
    ) -> Result<Storage> {
        let _rec = record!(self, Name::Static("norm_rows_backward"), l.shape());
        Ok(match (self, xhat, rstd) {
            (Storage::Cpu(g), Storage::Cpu(x), Storage::Cpu(r)) => {
                Storage::Cpu(g.norm_rows_backward(l, x, r, rms)?)
            }
            (Storage::Cuda(g), Storage::Cuda(x), Storage::Cuda(r)) => {
                Storage::Cuda(g.norm_rows_backward(l, x, r, rms)?)
            }
            (Storage::Meta(g), Storage::Meta(x), Storage::Meta(r)) => {
                Storage::Meta(g.norm_rows_backward(l, x, r, rms)?)
            }
            (g @ any!(), x, _) => return Err(mismatch("layer_norm", g.device(), x.device())),
        })
    }

    pub(crate) fn attention(
        &self,
        lq: &Layout,
        (k, lk): (&Storage, &Layout),
        (v, lv): (&Storage, &Layout),
        bias: Option<(&Storage, &Layout)>,
        shape: AttnShape,
    ) -> Result<(Storage, Storage)> {
        let _rec = record!(self, Name::Static("attention"), lq.shape(), lk.shape());
        Ok(match (self, k, v) {
            (Storage::Cpu(q), Storage::Cpu(k), Storage::Cpu(v)) => {
                let b = attn_bias!(self, bias, Cpu);
                let (o, l) = q.attention(lq, (k, lk), (v, lv), b, shape)?;
                (Storage::Cpu(o), Storage::Cpu(l))
            }
            (Storage::Cuda(q), Storage::Cuda(k), Storage::Cuda(v)) => {
                let b = attn_bias!(self, bias, Cuda);
                let (o, l) = q.attention(lq, (k, lk), (v, lv), b, shape)?;
                (Storage::Cuda(o), Storage::Cuda(l))
            }
            (Storage::Meta(q), Storage::Meta(k), Storage::Meta(v)) => {
                let b = attn_bias!(self, bias, Meta);
                let (o, l) = q.attention(lq, (k, lk), (v, lv), b, shape)?;
                (Storage::Meta(o), Storage::Meta(l))
            }
            (q @ any!(), k, v) => {
                let other = if k.device() != q.device() { k } else { v };
                return Err(mismatch("attention", q.device(), other.device()));
            }
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attention_backward(
        &self,
        lq: &Layout,
        (k, lk): (&Storage, &Layout),
        (v, lv): (&Storage, &Layout),
        bias: Option<(&Storage, &Layout)>,
        out: &Storage,
        lse: &Storage,
        (g, lg): (&Storage, &Layout),
        shape: AttnShape,
    ) -> Result<(Storage, Storage, Storage)> {
        let _rec = record!(
            self,
            Name::Static("attention_backward"),
            lq.shape(),
            lk.shape()
        );
        Ok(match (self, k, v, out, lse, g) {
            (
                Storage::Cpu(q),
                Storage::Cpu(k),
                Storage::Cpu(v),
                Storage::Cpu(o),
                Storage::Cpu(l),
                Storage::Cpu(g),
            ) => {
                let bias = attn_bias!(self, bias, Cpu);
                let (a, b, c) =
                    q.attention_backward(lq, (k, lk), (v, lv), bias, o, l, (g, lg), shape)?;
                (Storage::Cpu(a), Storage::Cpu(b), Storage::Cpu(c))
            }
            (
                Storage::Cuda(q),
                Storage::Cuda(k),
                Storage::Cuda(v),
                Storage::Cuda(o),
                Storage::Cuda(l),
                Storage::Cuda(g),
            ) => {
                let bias = attn_bias!(self, bias, Cuda);
                let (a, b, c) =
                    q.attention_backward(lq, (k, lk), (v, lv), bias, o, l, (g, lg), shape)?;
                (Storage::Cuda(a), Storage::Cuda(b), Storage::Cuda(c))
            }
            (
                Storage::Meta(q),
                Storage::Meta(k),
                Storage::Meta(v),
                Storage::Meta(o),
                Storage::Meta(l),
                Storage::Meta(g),
            ) => {
                let bias = attn_bias!(self, bias, Meta);
                let (a, b, c) =
                    q.attention_backward(lq, (k, lk), (v, lv), bias, o, l, (g, lg), shape)?;
                (Storage::Meta(a), Storage::Meta(b), Storage::Meta(c))
            }
            (q @ any!(), ..) => {
                let other = [k, v, out, lse, g]
                    .into_iter()
                    .find(|s| s.device() != q.device())
                    .unwrap_or(q);
                return Err(mismatch("attention", q.device(), other.device()));
            }
        })
    }

    pub(crate) fn cross_entropy_rows(
        &self,
        l: &Layout,
        (t, lt): (&Storage, &Layout),
        ignore: i64,
        smoothing: f64,
    ) -> Result<(Storage, Storage)> {
        let _rec = record!(self, Name::Static("cross_entropy"), l.shape());
        Ok(match (self, t) {
            (Storage::Cpu(x), Storage::Cpu(t)) => {
                let (a, b) = x.cross_entropy_rows(l, (t, lt), ignore, smoothing)?;
                (Storage::Cpu(a), Storage::Cpu(b))
            }
            (Storage::Cuda(x), Storage::Cuda(t)) => {
                let (a, b) = x.cross_entropy_rows(l, (t, lt), ignore, smoothing)?;
                (Storage::Cuda(a), Storage::Cuda(b))
            }
            (Storage::Meta(x), Storage::Meta(t)) => {
                let (a, b) = x.cross_entropy_rows(l, (t, lt), ignore, smoothing)?;
                (Storage::Meta(a), Storage::Meta(b))
            }
            (x @ any!(), t) => return Err(mismatch("cross_entropy", x.device(), t.device())),
        })
    }

    pub(crate) fn cross_entropy_rows_backward(
        &self,
        l: &Layout,
        (t, lt): (&Storage, &Layout),
        (lse, ls): (&Storage, &Layout),
        (g, lg): (&Storage, &Layout),
        opts: (i64, f64),
    ) -> Result<Storage> {
        let _rec = record!(self, Name::Static("cross_entropy_backward"), l.shape());
        Ok(match (self, t, lse, g) {
            (Storage::Cpu(x), Storage::Cpu(t), Storage::Cpu(s), Storage::Cpu(g)) => {
                Storage::Cpu(x.cross_entropy_rows_backward(l, (t, lt), (s, ls), (g, lg), opts)?)
            }
            (Storage::Cuda(x), Storage::Cuda(t), Storage::Cuda(s), Storage::Cuda(g)) => {
                Storage::Cuda(x.cross_entropy_rows_backward(l, (t, lt), (s, ls), (g, lg), opts)?)
            }
            (Storage::Meta(x), Storage::Meta(t), Storage::Meta(s), Storage::Meta(g)) => {
                Storage::Meta(x.cross_entropy_rows_backward(l, (t, lt), (s, ls), (g, lg), opts)?)
            }
            (x @ any!(), _, _, g) => return Err(mismatch("cross_entropy", x.device(), g.device())),
        })
    }

    pub(crate) fn channel_stats(&self, l: &Layout) -> Result<Storage> {
        let _rec = record!(self, Name::Static("batch_norm_stats"), l.shape());
        Ok(each!(self, |s| s.channel_stats(l)?))
    }

    pub(crate) fn channel_dot(
        &self,
        l: &Layout,
        (x, lx): (&Storage, &Layout),
        (m, lm): (&Storage, &Layout),
    ) -> Result<Storage> {
        let _rec = record!(self, Name::Static("batch_norm_backward_sums"), l.shape());
        Ok(match (self, x, m) {
            (Storage::Cpu(g), Storage::Cpu(x), Storage::Cpu(m)) => {
                Storage::Cpu(g.channel_dot(l, (x, lx), (m, lm))?)
            }
            (Storage::Cuda(g), Storage::Cuda(x), Storage::Cuda(m)) => {
                Storage::Cuda(g.channel_dot(l, (x, lx), (m, lm))?)
            }
            (Storage::Meta(g), Storage::Meta(x), Storage::Meta(m)) => {
                Storage::Meta(g.channel_dot(l, (x, lx), (m, lm))?)
            }
            (g @ any!(), x, m) => {
                let other = [x.device(), m.device()]
                    .into_iter()
                    .find(|d| *d != g.device())
                    .unwrap_or(g.device());
                return Err(mismatch("batch_norm", g.device(), other));
            }
        })
    }

    pub(crate) fn channel_affine(
        &self,
        l: &Layout,
        q: Option<(&Storage, &Layout)>,
        (k, lk): (&Storage, &Layout),
    ) -> Result<Storage> {
        let _rec = record!(self, Name::Static("batch_norm_affine"), l.shape());
        Ok(pair_opt!("batch_norm", self, k, q, |p, k, q| p
            .channel_affine(l, q, (k, lk))?))
    }

    pub(crate) fn cumulative(&self, l: &Layout, dim: usize, op: ScanOp) -> Result<Storage> {
        let _rec = record!(
            self,
            Name::Static(match op {
                ScanOp::Sum => "cumsum",
                ScanOp::Prod => "cumprod",
            }),
            l.shape()
        );
        Ok(each!(self, |s| s.cumulative(l, dim, op)?))
    }

    pub(crate) fn argsort(&self, l: &Layout, dim: usize, descending: bool) -> Result<Storage> {
        let _rec = record!(self, Name::Static("argsort"), l.shape());
        Ok(each!(self, |s| s.argsort(l, dim, descending)?))
    }

    // ---- linear algebra

    pub(crate) fn matmul(
        &self,
        l: &Layout,
        rhs: &Storage,
        lr: &Layout,
        mkn: (usize, usize, usize),
        bias: Option<(&Storage, &Layout)>,
    ) -> Result<Storage> {
        let name = if bias.is_some() { "addmm" } else { "mm" };
        let _rec = record!(self, Name::Static(name), &[mkn.0, mkn.1], &[mkn.1, mkn.2]);
        Ok(pair_opt!("matmul", self, rhs, bias, |a, b, c| a
            .matmul(l, b, lr, mkn, c)?))
    }

    pub(crate) fn conv2d(
        &self,
        l: &Layout,
        (w, lw): (&Storage, &Layout),
        b: Option<(&Storage, &Layout)>,
        s: &ConvShape,
    ) -> Result<Storage> {
        let _rec = record!(self, Name::Static("conv2d"), l.shape(), lw.shape());
        Ok(pair_opt!("conv2d", self, w, b, |x, w, b| x.conv2d(
            l,
            (w, lw),
            b,
            s
        )?))
    }

    /// Says on stderr, where `EMBER_CUDNN_LOG` asks for cuDNN's choices, that a
    /// half-precision convolution `pass` the device refused in its own dtype (cuDNN
    /// without half kernels for this GPU or shape) is computed in float32 instead.
    pub(crate) fn log_conv_fallback(pass: &str, dtype: DType, e: &Error) {
        if crate::backend::cuda::dnn::log_choices() {
            eprintln!("ember: conv2d {pass} in {dtype} refused ({e}); computed in float32");
        }
    }

    /// Why [`attention`](Self::attention) does not run on this storage's device
    /// for operands of this storage's dtype and `shape`, `None` where it runs: on
    /// the CPU for every float dtype; on CUDA through the f16/bf16/f32
    /// tensor-core kernels ([`attn_kernel_refuses`], compute capability 8.0 or
    /// later); on `meta` as on the GPU it models
    /// ([`modelled_arch`](super::meta::account::modelled_arch)). Never for an
    /// empty operand, nor with dropout while the calling thread captures a CUDA
    /// graph (the kernels take their masks' seed by value, where a replay must
    /// draw new ones; the other paths' dropout does).
    pub(crate) fn fused_attention_refusal(&self, shape: &AttnShape) -> Option<String> {
        if [shape.batch, shape.heads, shape.l, shape.s, shape.d].contains(&0) {
            return Some("an empty operand".into());
        }
        match self {
            Storage::Cpu(x) => (!x.dtype().is_float())
                .then(|| format!("the fused op takes float dtypes (got {})", x.dtype())),
            Storage::Cuda(x) => attn_kernel_refuses(x.dtype(), shape)
                .or_else(|| attn_arch_refuses(x.dev().arch()))
                .or_else(|| {
                    (shape.dropout > 0.0 && x.dev().is_capturing()).then(|| {
                        "dropout inside a CUDA graph capture (the kernels' seed would be the \
                         same at every replay)"
                            .into()
                    })
                }),
            Storage::Meta(x) => attn_kernel_refuses(x.dtype(), shape)
                .or_else(|| attn_arch_refuses(super::meta::account::modelled_arch())),
        }
    }

    /// Whether this device convolves f16/bf16 operands of `s` in their own dtype
    /// (CUDA through cuDNN); elsewhere they are convolved in float32.
    pub(crate) fn conv_takes_half(&self, s: &ConvShape) -> bool {
        match self {
            Storage::Cuda(x) => x.conv_takes_half(s),
            _ => false,
        }
    }

    pub(crate) fn conv2d_backward(
        &self,
        l: &Layout,
        (w, lw): (&Storage, &Layout),
        (gy, lg): (&Storage, &Layout),
        s: &ConvShape,
        need: (bool, bool),
    ) -> Result<ConvGrads<Storage>> {
        let _rec = record!(
            self,
            Name::Static("conv2d_backward"),
            l.shape(),
            lw.shape(),
            lg.shape()
        );
        fn wrap<S>(g: ConvGrads<S>, f: fn(S) -> Storage) -> ConvGrads<Storage> {
            (g.0.map(f), g.1.map(f))
        }
        Ok(match (self, w, gy) {
            (Storage::Cpu(x), Storage::Cpu(w), Storage::Cpu(g)) => wrap(
                x.conv2d_backward(l, (w, lw), (g, lg), s, need)?,
                Storage::Cpu,
            ),
            (Storage::Cuda(x), Storage::Cuda(w), Storage::Cuda(g)) => wrap(
                x.conv2d_backward(l, (w, lw), (g, lg), s, need)?,
                Storage::Cuda,
            ),
            (Storage::Meta(x), Storage::Meta(w), Storage::Meta(g)) => wrap(
                x.conv2d_backward(l, (w, lw), (g, lg), s, need)?,
                Storage::Meta,
            ),
            (x @ any!(), w, g) => {
                let other = [w.device(), g.device()]
                    .into_iter()
                    .find(|d| *d != x.device())
                    .unwrap_or(x.device());
                return Err(mismatch("conv2d backward", x.device(), other));
            }
        })
    }

    pub(crate) fn pool2d(
        &self,
        l: &Layout,
        s: &PoolShape,
        kind: Pool,
        want_index: bool,
    ) -> Result<(Storage, Option<Storage>)> {
        let name = match kind {
            Pool::Max => "max_pool2d",
            Pool::Avg { .. } => "avg_pool2d",
        };
        let _rec = record!(self, Name::Static(name), l.shape());
        Ok(match self {
            Storage::Cpu(x) => {
                let (y, i) = x.pool2d(l, s, kind, want_index)?;
                (Storage::Cpu(y), i.map(Storage::Cpu))
            }
            Storage::Cuda(x) => {
                let (y, i) = x.pool2d(l, s, kind, want_index)?;
                (Storage::Cuda(y), i.map(Storage::Cuda))
            }
            Storage::Meta(x) => {
                let (y, i) = x.pool2d(l, s, kind, want_index)?;
                (Storage::Meta(y), i.map(Storage::Meta))
            }
        })
    }

    pub(crate) fn pool2d_backward(
        &self,
        l: &Layout,
        index: Option<&Storage>,
        s: &PoolShape,
        kind: Pool,
    ) -> Result<Storage> {
        let name = match kind {
            Pool::Max => "max_pool2d_backward",
            Pool::Avg { .. } => "avg_pool2d_backward",
        };
        let _rec = record!(self, Name::Static(name), l.shape());
        Ok(match (self, index) {
            (Storage::Cpu(g), None) => Storage::Cpu(g.pool2d_backward(l, None, s, kind)?),
            (Storage::Cpu(g), Some(Storage::Cpu(i))) => {
                Storage::Cpu(g.pool2d_backward(l, Some(i), s, kind)?)
            }
            (Storage::Cuda(g), None) => Storage::Cuda(g.pool2d_backward(l, None, s, kind)?),
            (Storage::Cuda(g), Some(Storage::Cuda(i))) => {
                Storage::Cuda(g.pool2d_backward(l, Some(i), s, kind)?)
            }
            (Storage::Meta(g), None) => Storage::Meta(g.pool2d_backward(l, None, s, kind)?),
            (Storage::Meta(g), Some(Storage::Meta(i))) => {
                Storage::Meta(g.pool2d_backward(l, Some(i), s, kind)?)
            }
            (g @ any!(), Some(i)) => {
                return Err(mismatch("pool2d backward", g.device(), i.device()))
            }
        })
    }

    // ---- indexing

    pub(crate) fn indices(
        &self,
        l: &Layout,
        op: &'static str,
        dim: usize,
        size: usize,
        negative: bool,
    ) -> Result<Storage> {
        let _rec = record!(self, Name::Static("check_indices"), l.shape());
        Ok(each!(self, |s| s.indices(l, op, dim, size, negative)?))
    }

    pub(crate) fn index_select(
        &self,
        l: &Layout,
        dim: usize,
        idx: &Storage,
        n: usize,
    ) -> Result<Storage> {
        let _rec = record!(self, Name::Static("index_select"), l.shape(), &[n]);
        Ok(pair!("index_select", self, idx, |s, i| s
            .index_select(l, dim, i, n)?))
    }

    pub(crate) fn gather(
        &self,
        l: &Layout,
        dim: usize,
        idx: &Storage,
        ishape: &[usize],
    ) -> Result<Storage> {
        let _rec = record!(self, Name::Static("gather"), l.shape(), ishape);
        Ok(pair!("gather", self, idx, |s, i| s.gather(l, dim, i, ishape)?))
    }

    pub(crate) fn index_add(
        &mut self,
        shape: &[usize],
        dim: usize,
        idx: &Storage,
        (src, ls): (&Storage, &Layout),
    ) -> Result<()> {
        let _rec = record!(self, Name::Static("index_add_"), shape, ls.shape());
        match (self, idx, src) {
            (Storage::Cpu(d), Storage::Cpu(i), Storage::Cpu(s)) => {
                d.index_add(shape, dim, i, (s, ls))
            }
            (Storage::Cuda(d), Storage::Cuda(i), Storage::Cuda(s)) => {
                d.index_add(shape, dim, i, (s, ls))
            }
            (Storage::Meta(d), Storage::Meta(i), Storage::Meta(s)) => {
                d.index_add(shape, dim, i, (s, ls))
            }
            (d @ any!(), i, s) => {
                let other = [i.device(), s.device()]
                    .into_iter()
                    .find(|x| *x != d.device())
                    .unwrap_or(d.device());
                Err(mismatch("index_add", d.device(), other))
            }
        }
    }

    pub(crate) fn scatter_add(
        &mut self,
        shape: &[usize],
        dim: usize,
        idx: &Storage,
        ishape: &[usize],
        (src, ls): (&Storage, &Layout),
    ) -> Result<()> {
        let _rec = record!(
            self,
            Name::Static("scatter_add_"),
            shape,
            ishape,
            ls.shape()
        );
        match (self, idx, src) {
            (Storage::Cpu(d), Storage::Cpu(i), Storage::Cpu(s)) => {
                d.scatter_add(shape, dim, i, ishape, (s, ls))
            }
            (Storage::Cuda(d), Storage::Cuda(i), Storage::Cuda(s)) => {
                d.scatter_add(shape, dim, i, ishape, (s, ls))
            }
            (Storage::Meta(d), Storage::Meta(i), Storage::Meta(s)) => {
                d.scatter_add(shape, dim, i, ishape, (s, ls))
            }
            (d @ any!(), i, s) => {
                let other = [i.device(), s.device()]
                    .into_iter()
                    .find(|x| *x != d.device())
                    .unwrap_or(d.device());
                Err(mismatch("scatter_add", d.device(), other))
            }
        }
    }

    // ---- fused optimizer steps

    /// The 2-norm of each of `items` (storage, first element, length: contiguous,
    /// of one float dtype on one device), in the statistics dtype: two launches
    /// per 48 tensors on a GPU, which meta allocates as. `None` on other devices
    /// (and dtypes), where the caller computes the norms one by one.
    pub(crate) fn foreach_norms(items: &[(&Storage, usize, usize)]) -> Result<Option<Storage>> {
        let Some(&(first, ..)) = items.first() else {
            return Ok(None);
        };
        let n: usize = items.iter().map(|i| i.2).sum();
        let _rec = record!(first, Name::Static("foreach_norm"), &[n]);
        let cuda: Option<Vec<_>> = items
            .iter()
            .map(|&(s, off, len)| match s {
                Storage::Cuda(c) => Some((c, off, len)),
                _ => None,
            })
            .collect();
        if let Some(list) = cuda {
            return Ok(CudaStorage::foreach_norms(&list)?.map(Storage::Cuda));
        }
        let meta = matches!(first.dtype(), DType::F32 | DType::F64)
            && items
                .iter()
                .all(|(s, ..)| matches!(s, Storage::Meta(_)) && s.dtype() == first.dtype());
        if meta {
            let lengths: Vec<usize> = items.iter().map(|i| i.2).collect();
            return Ok(Some(Storage::Meta(MetaStorage::foreach_norms(
                first.dtype(),
                &lengths,
            )?)));
        }
        Ok(None)
    }

    /// Multiplies each of `items` in place by `min(1, max_norm / (total +
    /// 1e-6))`, `total` one element of the statistics dtype on their device
    /// (read there), in launches of 48 tensors on a GPU; nothing to do on meta.
    /// `Ok(false)` (nothing done) elsewhere.
    pub(crate) fn foreach_clip_scale(
        items: &mut [(&mut Storage, usize, usize)],
        (total, total_offset): (&Storage, usize),
        max_norm: f64,
    ) -> Result<bool> {
        let Some((first, ..)) = items.first() else {
            return Ok(true);
        };
        let n: usize = items.iter().map(|i| i.2).sum();
        let _rec = record!(&**first, Name::Static("foreach_clip"), &[n]);
        if let Storage::Cuda(t) = total {
            let cuda: Option<Vec<_>> = items
                .iter()
                .map(|(s, off, len)| match &**s {
                    Storage::Cuda(c) => Some((c, *off, *len)),
                    _ => None,
                })
                .collect();
            if let Some(list) = cuda {
                return CudaStorage::foreach_clip_scale(&list, (t, total_offset), max_norm);
            }
        }
        Ok(matches!(total, Storage::Meta(_))
            && items.iter().all(|(s, ..)| matches!(&**s, Storage::Meta(_))))
    }

    /// One SGD step on many parameters at once (see [`SgdOperands`]): on a GPU in
    /// multi-tensor launches; on `meta` nothing (the step is in place). Other
    /// devices are refused: their SGD is made of tensor operations.
    pub(crate) fn sgd_foreach(items: &mut [SgdOperands<'_>], h: &SgdStep) -> Result<()> {
        let Some(first) = items.first() else {
            return Ok(());
        };
        let n: usize = items.iter().map(|o| o.n).sum();
        let _rec = record!(&*first.p.0, Name::Static("sgd_foreach"), &[n]);
        if items.iter().all(|o| matches!(&*o.p.0, Storage::Meta(_))) {
            return Ok(());
        }
        let list: Option<Vec<_>> = items
            .iter()
            .map(|o| {
                let buf = match &o.buf {
                    Some((Storage::Cuda(b), off, first)) => Some(Some((b, *off, *first))),
                    Some(_) => None,
                    None => Some(None),
                };
                match (&*o.p.0, o.g.0, buf) {
                    (Storage::Cuda(p), Storage::Cuda(g), Some(buf)) => {
                        Some(((p, o.p.1), (g, o.g.1), buf, o.n))
                    }
                    _ => None,
                }
            })
            .collect();
        match list {
            Some(list) if CudaStorage::sgd_foreach(&list, h)? => Ok(()),
            _ => Err(Error::invalid(
                "SGD step",
                "a multi-tensor step needs every parameter, gradient and buffer on one GPU in one float dtype",
            )),
        }
    }

    /// One Adam step on many parameters at once (PyTorch's `foreach` form): on a
    /// GPU, in launches of many tensors each (the same arithmetic as
    /// [`adam`](Storage::adam), so the same bits); elsewhere, or where the
    /// operands are not all on one GPU in one dtype, one [`adam`](Storage::adam)
    /// per parameter.
    /// With `step` (the capturable form's count on the device, from which the
    /// kernel takes the bias corrections) only the multi-tensor launch will do:
    /// `Ok(false)` where it cannot run, nothing done. Without, every item is
    /// stepped (one at a time where the launch cannot run) and `Ok(true)`.
    pub(crate) fn adam_foreach(
        items: &mut [AdamOperands<'_>],
        h: &AdamStep,
        step: Option<&Storage>,
    ) -> Result<bool> {
        let step = match step {
            None => None,
            Some(Storage::Cuda(s)) => Some(s),
            Some(_) => return Ok(false),
        };
        let cuda: Option<Vec<_>> = items
            .iter()
            .map(|o| match (&*o.p.0, o.g.0, &*o.m.0, &*o.v.0) {
                (Storage::Cuda(p), Storage::Cuda(g), Storage::Cuda(m), Storage::Cuda(v)) => {
                    Some(((p, o.p.1), (g, o.g.1), (m, o.m.1), (v, o.v.1), o.n))
                }
                _ => None,
            })
            .collect();
        if let Some(list) =
            cuda.filter(|l| !l.is_empty() && CudaStorage::adam_foreach_fits(l, step))
        {
            // recorded only where the launches run
            let n: usize = list.iter().map(|t| t.4).sum();
            let _rec = record!(&*items[0].p.0, Name::Static("adam_foreach"), &[n]);
            if CudaStorage::adam_foreach(&list, h, step)? {
                return Ok(true);
            }
        }
        if step.is_some() {
            return Ok(false);
        }
        for o in items.iter_mut() {
            Storage::adam(
                (&mut *o.p.0, o.p.1),
                (o.g.0, o.g.1),
                (&mut *o.m.0, o.m.1),
                (&mut *o.v.0, o.v.1),
                o.n,
                h,
            )?;
        }
        Ok(true)
    }

    /// One Adam step in place (see [`BackendStorage::adam`]).
    pub(crate) fn adam(
        (p, po): (&mut Storage, usize),
        (g, go): (&Storage, usize),
        (m, mo): (&mut Storage, usize),
        (v, vo): (&mut Storage, usize),
        n: usize,
        h: &AdamStep,
    ) -> Result<()> {
        let _rec = record!(p, Name::Static("adam_step"), &[n]);
        match (p, g, m, v) {
            (Storage::Cpu(p), Storage::Cpu(g), Storage::Cpu(m), Storage::Cpu(v)) => {
                CpuStorage::adam((p, po), (g, go), (m, mo), (v, vo), n, h)
            }
            (Storage::Cuda(p), Storage::Cuda(g), Storage::Cuda(m), Storage::Cuda(v)) => {
                CudaStorage::adam((p, po), (g, go), (m, mo), (v, vo), n, h)
            }
            (Storage::Meta(p), Storage::Meta(g), Storage::Meta(m), Storage::Meta(v)) => {
                MetaStorage::adam((p, po), (g, go), (m, mo), (v, vo), n, h)
            }
            (p @ any!(), g, _, _) => Err(mismatch("Adam step", p.device(), g.device())),
        }
    }
}

/// One parameter of [`Storage::adam_foreach`]: the parameter, its gradient and
/// moments (each a storage and the element its `n` contiguous values start at).
pub(crate) struct AdamOperands<'a> {
    pub p: (&'a mut Storage, usize),
    pub g: (&'a Storage, usize),
    pub m: (&'a mut Storage, usize),
    pub v: (&'a mut Storage, usize),
    pub n: usize,
}

/// One parameter of [`Storage::sgd_foreach`]: the parameter and its gradient (each a
/// storage and the element its `n` contiguous values start at), and its momentum
/// buffer with whether this is its first step.
pub(crate) struct SgdOperands<'a> {
    pub p: (&'a mut Storage, usize),
    pub g: (&'a Storage, usize),
    pub buf: Option<(&'a mut Storage, usize, bool)>,
    pub n: usize,
}

/// One rank's communicator of the distributed NCCL backend, on one GPU.
pub(crate) struct Communicator(crate::backend::cuda::comm::CudaComm);

fn no_communicator(op: &'static str, device: Device) -> Error {
    Error::UnsupportedDevice {
        op,
        device,
        msg: "NCCL communicates between GPUs: CUDA tensors only (CPU tensors go through the CPU backend)".into(),
    }
}

impl Communicator {
    /// A new communicator id, made by rank 0 on its GPU.
    pub(crate) fn unique_id(device: Device) -> Result<[u8; 128]> {
        match device {
            Device::Cuda(i) => crate::backend::cuda::comm::CudaComm::unique_id(i),
            Device::Cpu | Device::Meta => Err(no_communicator("ncclGetUniqueId", device)),
        }
    }

    /// Joins communicator `id` as `rank` of `world` on `device`; a simulated GPU
    /// runs its calls through `host`.
    pub(crate) fn new(
        device: Device,
        id: [u8; 128],
        world: usize,
        rank: usize,
        host: std::sync::Arc<dyn crate::backend::op::collective::HostCollectives>,
    ) -> Result<Communicator> {
        match device {
            Device::Cuda(i) => crate::backend::cuda::comm::CudaComm::new(i, id, world, rank, host)
                .map(Communicator),
            Device::Cpu | Device::Meta => Err(no_communicator("ncclCommInitRank", device)),
        }
    }

    /// Stops its calls in flight and frees it.
    pub(crate) fn abort(&mut self) {
        self.0.abort()
    }
}

impl Storage {
    /// `kind` (all-reduce, broadcast) over the contiguous elements of `l`, in place,
    /// queued on the current stream.
    pub(crate) fn collective_in_place(
        &mut self,
        l: &Layout,
        comm: &Communicator,
        kind: crate::backend::op::collective::CommKind,
    ) -> Result<()> {
        match self {
            Storage::Cuda(s) => s.collective_in_place(l, &comm.0, kind),
            Storage::Cpu(_) | Storage::Meta(_) => Err(no_communicator(kind.name(), self.device())),
        }
    }

    /// `kind` (all-gather, reduce-scatter) from the contiguous elements of `l` into
    /// `dst`, queued on the current stream.
    pub(crate) fn collective_into(
        &self,
        l: &Layout,
        dst: &mut Storage,
        comm: &Communicator,
        kind: crate::backend::op::collective::CommKind,
    ) -> Result<()> {
        match (self, dst) {
            (Storage::Cuda(s), Storage::Cuda(d)) => s.collective_into(l, d, &comm.0, kind),
            (s, _) => Err(no_communicator(kind.name(), s.device())),
        }
    }
}

impl Storage {
    /// A CPU storage's values, to change in place (a collective of the CPU backend
    /// works on them directly); `None` for the other devices.
    pub(crate) fn host_data_mut(&mut self) -> Option<&mut CpuData> {
        match self {
            Storage::Cpu(s) => Some(s.data_mut()),
            Storage::Cuda(_) | Storage::Meta(_) => None,
        }
    }
}
