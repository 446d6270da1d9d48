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
    attn_arch_refuses, attn_kernel_refuses, AdamStep, AttnGrads, AttnOperands, AttnSaved,
    AttnShape, BinaryOp, BnGradIn, BnParams, BnRunning, CmpOp, ConvShape, NormAffine, NormSaved,
    Pool, PoolShape, ReduceOp, RowNorm, Scalar, ScanOp, SgdStep, UnaryOp,
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

/// A device's storage as a variant of [`Storage`]: how a dispatch takes an
/// operand's backend storage out (`None`: the operand is on another device) and
/// wraps a result.
trait Variant: BackendStorage {
    fn of(s: &Storage) -> Option<&Self>;
    fn of_mut(s: &mut Storage) -> Option<&mut Self>;
    fn wrap(self) -> Storage;
}

macro_rules! variant {
    ($t:ty, $v:ident) => {
        impl Variant for $t {
            fn of(s: &Storage) -> Option<&Self> {
                match s {
                    Storage::$v(x) => Some(x),
                    _ => None,
                }
            }
            fn of_mut(s: &mut Storage) -> Option<&mut Self> {
                match s {
                    Storage::$v(x) => Some(x),
                    _ => None,
                }
            }
            fn wrap(self) -> Storage {
                Storage::$v(self)
            }
        }
    };
}
variant!(CpuStorage, Cpu);
variant!(CudaStorage, Cuda);
variant!(MetaStorage, Meta);

/// Runs `$body` with `$S` naming the backend storage type of `$s`'s device: an
/// arm per device, each compiling `$body` for its type as a generic function
/// would (a new device makes this `match` fail to compile until it has its arm).
macro_rules! on_device {
    ($s:expr, $S:ident => $body:expr) => {
        match $s {
            Storage::Cpu(_) => {
                type $S = CpuStorage;
                $body
            }
            Storage::Cuda(_) => {
                type $S = CudaStorage;
                $body
            }
            Storage::Meta(_) => {
                type $S = MetaStorage;
                $body
            }
        }
    };
}

/// The operands of one primitive (`op`), which must all be on the device of its
/// first: each taken as that device's storage, or the error naming the first
/// one found elsewhere (another kind of device, or another GPU: a kernel runs on
/// one GPU and reads only its memory).
#[derive(Clone, Copy)]
struct Operands {
    op: &'static str,
    device: Device,
}

impl Operands {
    fn of(op: &'static str, first: &Storage) -> Operands {
        Operands {
            op,
            device: first.device(),
        }
    }

    fn one<S: Variant>(self, s: &Storage) -> Result<&S> {
        let device = s.device();
        S::of(s)
            .filter(|_| device == self.device)
            .ok_or_else(|| mismatch(self.op, self.device, device))
    }

    fn one_mut<S: Variant>(self, s: &mut Storage) -> Result<&mut S> {
        let device = s.device();
        S::of_mut(s)
            .filter(|_| device == self.device)
            .ok_or_else(|| mismatch(self.op, self.device, device))
    }

    fn view<'a, S: Variant>(
        self,
        (s, l): (&'a Storage, &'a Layout),
    ) -> Result<(&'a S, &'a Layout)> {
        Ok((self.one(s)?, l))
    }

    fn opt<'a, S: Variant>(
        self,
        v: Option<(&'a Storage, &'a Layout)>,
    ) -> Result<Option<(&'a S, &'a Layout)>> {
        v.map(|v| self.view(v)).transpose()
    }
}

/// Like [`each`] for two storages of one device (`$x`, `$y`); storages of two
/// devices (which the tensor layer refuses before) are an error.
macro_rules! pair {
    ($op:expr, $a:expr, $b:expr, |$x:ident, $y:ident| $body:expr) => {{
        let on = Operands::of($op, $a);
        on_device!($a, S => {
            let ($x, $y): (&S, &S) = (on.one($a)?, on.one($b)?);
            $body.wrap()
        })
    }};
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

    /// `first + step · i` for `i` in `0..n`, int64 (wrapping around on
    /// overflow), computed on `device`: nothing is copied from the host, so a
    /// CUDA graph capture holds it.
    pub(crate) fn iota(device: Device, n: usize, first: i64, step: i64) -> Result<Storage> {
        let _rec = record_on!(device, DType::I64, "iota", n);
        Ok(match device {
            Device::Cpu => Storage::Cpu(CpuStorage::iota(n, first, step)?),
            Device::Cuda(i) => {
                Storage::Cuda(CudaStorage::iota(&super::cuda::dev(i)?, n, first, step)?)
            }
            Device::Meta => Storage::Meta(MetaStorage::new(DType::I64, n)?),
        })
    }

    /// `torch.linspace(start, end, n)`'s values in float64, computed on `device`
    /// as PyTorch's CPU kernel computes them: with `step = (end - start) / (n -
    /// 1)`, the first half `fma(step, i, start)` and the second half
    /// `fma(-step, n - 1 - i, end)`, so that both ends are exact (one value,
    /// `start`, when `n` is 1).
    pub(crate) fn linspace(device: Device, start: f64, end: f64, n: usize) -> Result<Storage> {
        let _rec = record_on!(device, DType::F64, "linspace", n);
        let (step, half) = if n > 1 {
            ((end - start) / (n - 1) as f64, n / 2)
        } else {
            (0.0, n)
        };
        let line = (start, end, step);
        Ok(match device {
            Device::Cpu => Storage::Cpu(CpuStorage::linspace(n, line, half)?),
            Device::Cuda(i) => {
                Storage::Cuda(CudaStorage::linspace(&super::cuda::dev(i)?, n, line, half)?)
            }
            Device::Meta => Storage::Meta(MetaStorage::new(DType::F64, n)?),
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
        let on = Operands::of("copy_", self);
        on_device!(self, S => {
            let src: &S = on.one(self)?;
            src.copy_into(l, on.one_mut(dst)?, ld)
        })
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

    pub(crate) fn unary_inplace<O: UnaryOp>(&mut self, l: &Layout, op: &O) -> Result<()> {
        let _rec = record!(self, Name::Inplace(op.code().0.name()), l.shape());
        // in memory order where that is not row-major (channels-last): on the H200
        // a channels-last relu_ walked in row-major order took 12 times as long
        let l = &l.permuted(l.memory_order().as_deref());
        match self {
            Storage::Cpu(x) => x.unary_inplace(l, op),
            Storage::Cuda(x) => x.unary_inplace(l, op),
            Storage::Meta(x) => x.unary_inplace(l, op),
        }
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
        // both in the target's memory order (see unary_inplace; `lr` is broadcast
        // to the target's shape)
        let perm = l.memory_order().filter(|_| lr.shape() == l.shape());
        let (l, lr) = (&l.permuted(perm.as_deref()), &lr.permuted(perm.as_deref()));
        let on = Operands::of("in-place op", self);
        on_device!(self, S => {
            let b: &S = on.one(rhs)?;
            on.one_mut::<S>(self)?.binary_inplace(l, b, lr, op)
        })
    }

    pub(crate) fn binary_scalar_inplace<O: BinaryOp>(
        &mut self,
        l: &Layout,
        s: Scalar,
        op: &O,
    ) -> Result<()> {
        let _rec = record!(self, Name::Inplace(O::CODE.name()), l.shape());
        let l = &l.permuted(l.memory_order().as_deref());
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
        let on = Operands::of("where", self);
        on_device!(self, S => {
            let c: &S = on.one(self)?;
            Ok(c.where_(l, on.one(a)?, la, on.one(b)?, lb)?.wrap())
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

    pub(crate) fn norm_rows(
        &self,
        l: &Layout,
        n: RowNorm,
        affine: NormAffine<'_, Storage>,
    ) -> Result<(Storage, Storage)> {
        let _rec = record!(self, Name::Static("norm_rows"), l.shape());
        let on = Operands::of("layer_norm", self);
        on_device!(self, S => {
            let x: &S = on.one(self)?;
            let (y, stats) = x.norm_rows(l, n, affine.try_map(|s| on.one(s))?)?;
            Ok((y.wrap(), stats.wrap()))
        })
    }

    pub(crate) fn norm_rows_backward(
        &self,
        l: &Layout,
        saved: NormSaved<'_, Storage>,
        rms: bool,
    ) -> Result<Storage> {
        let _rec = record!(self, Name::Static("norm_rows_backward"), l.shape());
        let on = Operands::of("layer_norm", self);
        on_device!(self, S => {
            let g: &S = on.one(self)?;
            Ok(g.norm_rows_backward(l, saved.try_map(|s| on.one(s))?, rms)?.wrap())
        })
    }

    pub(crate) fn norm_affine_backward(
        &self,
        l: &Layout,
        saved: NormSaved<'_, Storage>,
    ) -> Result<(Storage, Storage)> {
        let _rec = record!(self, Name::Static("norm_affine_backward"), l.shape());
        let on = Operands::of("layer_norm", self);
        on_device!(self, S => {
            let g: &S = on.one(self)?;
            let (dw, db) = g.norm_affine_backward(l, saved.try_map(|s| on.one(s))?)?;
            Ok((dw.wrap(), db.wrap()))
        })
    }

    pub(crate) fn attention(
        x: AttnOperands<'_, Storage>,
        shape: AttnShape,
    ) -> Result<(Storage, Storage)> {
        let (q, k) = (x.q.0, x.k.1.shape());
        let _rec = record!(q, Name::Static("attention"), x.q.1.shape(), k);
        let on = Operands::of("attention", q);
        on_device!(q, S => {
            let (o, l) = S::attention(x.try_map(|s| on.one(s))?, shape)?;
            Ok((o.wrap(), l.wrap()))
        })
    }

    pub(crate) fn attention_backward(
        x: AttnOperands<'_, Storage>,
        saved: AttnSaved<'_, Storage>,
        shape: AttnShape,
    ) -> Result<AttnGrads<Storage>> {
        let (q, k) = (x.q.0, x.k.1.shape());
        let _rec = record!(q, Name::Static("attention_backward"), x.q.1.shape(), k);
        let on = Operands::of("attention", q);
        on_device!(q, S => {
            let (x, saved) = (x.try_map(|s| on.one(s))?, saved.try_map(|s| on.one(s))?);
            Ok(S::attention_backward(x, saved, shape)?.map(|g| g.wrap()))
        })
    }

    pub(crate) fn cross_entropy_rows(
        &self,
        l: &Layout,
        t: (&Storage, &Layout),
        opts: crate::backend::op::CeOpts,
    ) -> Result<(Storage, Storage)> {
        let _rec = record!(self, Name::Static("cross_entropy"), l.shape());
        let on = Operands::of("cross_entropy", self);
        on_device!(self, S => {
            let x: &S = on.one(self)?;
            let (a, b) = x.cross_entropy_rows(l, on.view(t)?, opts)?;
            Ok((a.wrap(), b.wrap()))
        })
    }

    pub(crate) fn cross_entropy_rows_backward(
        &self,
        l: &Layout,
        t: (&Storage, &Layout),
        lse: (&Storage, &Layout),
        g: (&Storage, &Layout),
        opts: crate::backend::op::CeOpts,
    ) -> Result<Storage> {
        let _rec = record!(self, Name::Static("cross_entropy_backward"), l.shape());
        let on = Operands::of("cross_entropy", self);
        on_device!(self, S => {
            let x: &S = on.one(self)?;
            let (t, lse, g) = (on.view(t)?, on.view(lse)?, on.view(g)?);
            Ok(x.cross_entropy_rows_backward(l, t, lse, g, opts)?.wrap())
        })
    }

    pub(crate) fn channel_stats(&self, l: &Layout) -> Result<Storage> {
        let _rec = record!(self, Name::Static("batch_norm_stats"), l.shape());
        Ok(each!(self, |s| s.channel_stats(l)?))
    }

    pub(crate) fn channel_dot(
        &self,
        l: &Layout,
        x: (&Storage, &Layout),
        m: (&Storage, &Layout),
        mask: Option<(&Storage, &Layout)>,
    ) -> Result<Storage> {
        let _rec = record!(self, Name::Static("batch_norm_backward_sums"), l.shape());
        let on = Operands::of("batch_norm", self);
        on_device!(self, S => {
            let g: &S = on.one(self)?;
            Ok(g.channel_dot(l, on.view(x)?, on.view(m)?, on.opt(mask)?)?.wrap())
        })
    }

    pub(crate) fn channel_affine(
        &self,
        l: &Layout,
        q: Option<(&Storage, &Layout)>,
        coefs: (&Storage, &Layout),
        (relu, mask): (bool, Option<(&Storage, &Layout)>),
    ) -> Result<Storage> {
        let _rec = record!(self, Name::Static("batch_norm_affine"), l.shape());
        let on = Operands::of("batch_norm", self);
        on_device!(self, S => {
            let p: &S = on.one(self)?;
            let coefs = on.view(coefs)?;
            Ok(p.channel_affine(l, on.opt(q)?, coefs, (relu, on.opt(mask)?))?.wrap())
        })
    }

    /// See [`BackendStorage::batch_norm_coefs`].
    pub(crate) fn batch_norm_coefs(
        p: BnParams<'_, Storage>,
        running: BnRunning<'_, Storage>,
        eps: f64,
    ) -> Result<Storage> {
        let first = p.mean.0;
        let _rec = record!(first, Name::Static("batch_norm_coefs"), p.mean.1.shape());
        let on = Operands::of("batch_norm", first);
        on_device!(first, S => {
            let p = p.try_map(|s| on.one(s))?;
            let running = running.try_map(|s| on.one_mut(s))?;
            Ok(S::batch_norm_coefs(p, running, eps)?.wrap())
        })
    }

    /// See [`BackendStorage::batch_norm_grad_coefs`].
    pub(crate) fn batch_norm_grad_coefs(
        p: BnGradIn<'_, Storage>,
        weight_grad: bool,
    ) -> Result<(Storage, Option<Storage>)> {
        let first = p.sums.0;
        let _rec = record!(
            first,
            Name::Static("batch_norm_grad_coefs"),
            p.mean.1.shape()
        );
        let on = Operands::of("batch_norm", first);
        on_device!(first, S => {
            let (coefs, gw) = S::batch_norm_grad_coefs(p.try_map(|s| on.one(s))?, weight_grad)?;
            Ok((coefs.wrap(), gw.map(Variant::wrap)))
        })
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

    pub(crate) fn searchsorted(
        &self,
        ls: &Layout,
        values: &Storage,
        lv: &Layout,
        m_per: (usize, usize),
        right: bool,
    ) -> Result<Storage> {
        let _rec = record!(self, Name::Static("searchsorted"), ls.shape(), lv.shape());
        Ok(pair!("searchsorted", self, values, |s, v| s
            .searchsorted(ls, v, lv, m_per, right)?))
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
        let on = Operands::of("matmul", self);
        on_device!(self, S => {
            let a: &S = on.one(self)?;
            Ok(a.matmul(l, on.one(rhs)?, lr, mkn, on.opt(bias)?)?.wrap())
        })
    }

    pub(crate) fn conv2d(
        &self,
        l: &Layout,
        w: (&Storage, &Layout),
        b: Option<(&Storage, &Layout)>,
        s: &ConvShape,
    ) -> Result<Storage> {
        let _rec = record!(self, Name::Static("conv2d"), l.shape(), w.1.shape());
        let on = Operands::of("conv2d", self);
        on_device!(self, S => {
            let x: &S = on.one(self)?;
            Ok(x.conv2d(l, on.view(w)?, on.opt(b)?, s)?.wrap())
        })
    }

    /// Says on stderr, where `EMBER_CUDNN_LOG` asks for cuDNN's choices, that a
    /// half-precision convolution `pass` the device refused in its own dtype (cuDNN
    /// without half kernels for this GPU or shape) is computed in float32 instead.
    pub(crate) fn log_conv_fallback(pass: &str, dtype: DType, e: &Error, instead: &str) {
        if crate::backend::cuda::dnn::log_choices() {
            eprintln!("ember: conv2d {pass} in {dtype} refused ({e}); {instead}");
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

    /// The capture the calling thread has under way on this storage's device
    /// (on its current stream), named by its graph's memory pool; `None` when
    /// there is none, and never on the CPU or `meta`.
    pub(crate) fn capture_id(&self) -> Option<u32> {
        match self {
            Storage::Cuda(x) if x.dev().is_capturing() => x.dev().capture_pool().map(|p| p.0),
            _ => None,
        }
    }

    /// Whether the graph of capture `id` ([`capture_id`](Self::capture_id)) on
    /// this tensor's device still exists (captured, not dropped).
    pub(crate) fn graph_alive(&self, id: u32) -> bool {
        matches!(self, Storage::Cuda(x) if x.dev().graph_alive(id))
    }

    /// Whether this device pools f16/bf16 in their own dtype (CUDA, and meta as the
    /// GPU it models); the CPU pools them in float32.
    pub(crate) fn pools_half(&self) -> bool {
        !matches!(self, Storage::Cpu(_))
    }

    /// Whether this device pools a dense channels-last input as it lies
    /// ([`PoolShape::nhwc`]: CUDA, and meta as the GPU it models); the CPU pools
    /// row-major planes, and the result is laid out again.
    pub(crate) fn pools_channels_last(&self) -> bool {
        !matches!(self, Storage::Cpu(_))
    }

    /// Whether this device convolves f16/bf16 operands of `s` in their own dtype
    /// (CUDA through cuDNN, and meta as it); elsewhere they are convolved in
    /// float32.
    pub(crate) fn conv_takes_half(&self, s: &ConvShape) -> bool {
        match self {
            Storage::Cuda(x) => x.conv_takes_half(s),
            Storage::Meta(x) => x.conv_takes_half(s),
            Storage::Cpu(_) => false,
        }
    }

    /// Whether this device convolves channels-last operands of `s` as they lie
    /// (CUDA through cuDNN's NHWC kernels, [`ConvShape::nhwc`]); elsewhere they
    /// are convolved row-major and the result laid out again.
    pub(crate) fn conv_takes_channels_last(&self, s: &ConvShape) -> bool {
        match self {
            Storage::Cuda(x) => x.conv_takes_channels_last(s),
            Storage::Meta(x) => x.conv_takes_channels_last(s),
            Storage::Cpu(_) => false,
        }
    }

    pub(crate) fn conv2d_backward(
        &self,
        l: &Layout,
        w: (&Storage, &Layout),
        gy: (&Storage, &Layout),
        s: &ConvShape,
        need: (bool, bool),
    ) -> Result<ConvGrads<Storage>> {
        let _rec = record!(
            self,
            Name::Static("conv2d_backward"),
            l.shape(),
            w.1.shape(),
            gy.1.shape()
        );
        let on = Operands::of("conv2d backward", self);
        on_device!(self, S => {
            let x: &S = on.one(self)?;
            let (dx, dw) = x.conv2d_backward(l, on.view(w)?, on.view(gy)?, s, need)?;
            Ok((dx.map(S::wrap), dw.map(S::wrap)))
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
        let on = Operands::of(name, self);
        on_device!(self, S => {
            let (y, i) = on.one::<S>(self)?.pool2d(l, s, kind, want_index)?;
            Ok((y.wrap(), i.map(S::wrap)))
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
        let on = Operands::of("pool2d backward", self);
        on_device!(self, S => {
            let g: &S = on.one(self)?;
            let index = index.map(|i| on.one(i)).transpose()?;
            Ok(g.pool2d_backward(l, index, s, kind)?.wrap())
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
        src: (&Storage, &Layout),
    ) -> Result<()> {
        let _rec = record!(self, Name::Static("index_add_"), shape, src.1.shape());
        let on = Operands::of("index_add", self);
        on_device!(self, S => {
            let (i, src) = (on.one(idx)?, on.view(src)?);
            on.one_mut::<S>(self)?.index_add(shape, dim, i, src)
        })
    }

    pub(crate) fn scatter_add(
        &mut self,
        shape: &[usize],
        dim: usize,
        idx: &Storage,
        ishape: &[usize],
        src: (&Storage, &Layout),
    ) -> Result<()> {
        let _rec = record!(
            self,
            Name::Static("scatter_add_"),
            shape,
            ishape,
            src.1.shape()
        );
        let on = Operands::of("scatter_add", self);
        on_device!(self, S => {
            let (i, src) = (on.one(idx)?, on.view(src)?);
            on.one_mut::<S>(self)?.scatter_add(shape, dim, i, ishape, src)
        })
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
        let on = Operands::of("Adam step", p);
        on_device!(p, S => {
            let g = (on.one(g)?, go);
            let (m, v) = (on.one_mut(m)?, on.one_mut(v)?);
            S::adam((on.one_mut(p)?, po), g, (m, mo), (v, vo), n, h)
        })
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
