//! cuDNN's graph API (its backend descriptors), as much of it as ember's fused
//! attention and its convolutions need: tensors, pointwise, reduction,
//! matrix-product, reshape and convolution nodes, an operation graph, cuDNN's
//! heuristic engine choices (with their numerical notes), execution plans and
//! their execution with a variant pack.
//!
//! A plan is built for a GPU through its cuDNN handle, or, with no GPU at all,
//! for a GPU described by its properties ([`DeviceModel`]): cuDNN 9.8 and later
//! accept a JSON description, which is how the tests check here, without a GPU,
//! that cuDNN recognises ember's graphs and proposes engines for them on a Hopper
//! GPU.

use super::{library, loaded};
use crate::error::{Error, Result};
use cudarc::cudnn::sys;
use std::collections::HashMap;
use std::ffi::c_void;

use sys::cudnnBackendAttributeName_t as A;
use sys::cudnnBackendAttributeType_t as T;
use sys::cudnnBackendDescriptorType_t as D;
pub(crate) use sys::cudnnDataType_t as Dt;
pub(crate) use sys::cudnnPointwiseMode_t as Pw;
pub(crate) use sys::cudnnReduceTensorOp_t as Red;

/// cuDNN's message for its last failure on this thread, if it left one.
fn last_error() -> String {
    let mut buf = [0 as std::ffi::c_char; 512];
    // SAFETY: a buffer of the size passed; cuDNN writes a NUL-terminated string.
    unsafe { sys::cudnnGetLastErrorString(buf.as_mut_ptr(), buf.len()) };
    // SAFETY: NUL-terminated (zeroed above, and cuDNN terminates what it writes).
    let s = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    s.to_string_lossy().trim().to_string()
}

/// `status` as ember's error for `op`, with cuDNN's own message where it left one.
fn check(op: &'static str, status: sys::cudnnStatus_t) -> Result<()> {
    if status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        return Ok(());
    }
    let detail = last_error();
    Err(Error::Cuda {
        op,
        msg: if detail.is_empty() {
            format!("{status:?}")
        } else {
            format!("{status:?}: {detail}")
        },
    })
}

/// One backend descriptor, destroyed when dropped.
pub(crate) struct Desc(sys::cudnnBackendDescriptor_t);

// SAFETY: a descriptor is plain host data of cuDNN's; ember uses each under its
// device's cuDNN lock (or on one thread in the tests).
unsafe impl Send for Desc {}

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created by `new`, destroyed once.
        unsafe {
            let _ = sys::cudnnBackendDestroyDescriptor(self.0);
        }
    }
}

impl Desc {
    fn new(kind: D) -> Result<Desc> {
        loaded()?;
        let mut d: sys::cudnnBackendDescriptor_t = std::ptr::null_mut();
        // SAFETY: one out-parameter.
        check("cudnnBackendCreateDescriptor", unsafe {
            sys::cudnnBackendCreateDescriptor(kind, &mut d)
        })?;
        Ok(Desc(d))
    }

    /// Sets `name` to `vals`, elements of cuDNN's type `ty` laid out as `V`.
    fn set<V>(&self, name: A, ty: T, vals: &[V]) -> Result<()> {
        // SAFETY: `vals` holds `len` elements of the layout `ty` names (each
        // caller pairs them: i64 with INT64, the bindings' 32-bit enums with their
        // types, descriptor handles with BACKEND_DESCRIPTOR); cuDNN copies them.
        check("cudnnBackendSetAttribute", unsafe {
            sys::cudnnBackendSetAttribute(self.0, name, ty, vals.len() as i64, vals.as_ptr().cast())
        })
    }

    fn set_i64(&self, name: A, vals: &[i64]) -> Result<()> {
        self.set(name, T::CUDNN_TYPE_INT64, vals)
    }

    fn set_descs(&self, name: A, descs: &[&Desc]) -> Result<()> {
        let raw: Vec<sys::cudnnBackendDescriptor_t> = descs.iter().map(|d| d.0).collect();
        self.set(name, T::CUDNN_TYPE_BACKEND_DESCRIPTOR, &raw)
    }

    fn set_dtype(&self, name: A, dt: Dt) -> Result<()> {
        self.set(name, T::CUDNN_TYPE_DATA_TYPE, &[dt])
    }

    fn set_bool(&self, name: A, on: bool) -> Result<()> {
        self.set(name, T::CUDNN_TYPE_BOOLEAN, &[on])
    }

    fn finalize(self) -> Result<Desc> {
        // SAFETY: a live descriptor whose attributes were set above.
        check("cudnnBackendFinalize", unsafe {
            sys::cudnnBackendFinalize(self.0)
        })?;
        Ok(self)
    }

    fn get_i64(&self, name: A) -> Result<i64> {
        let (mut v, mut n) = (0i64, 0i64);
        // SAFETY: one i64 out-parameter and its count.
        check("cudnnBackendGetAttribute", unsafe {
            sys::cudnnBackendGetAttribute(
                self.0,
                name,
                T::CUDNN_TYPE_INT64,
                1,
                &mut n,
                (&mut v as *mut i64).cast(),
            )
        })?;
        Ok(v)
    }
}

/// A tensor of a graph: its unique id, 4-d size and strides (in elements), type,
/// whether it lives only inside the graph (virtual) and whether it is a host
/// scalar passed by value at execution.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TensorSpec {
    pub dims: [i64; 4],
    pub strides: [i64; 4],
    pub dtype: Dt,
    pub virtual_: bool,
    pub by_value: bool,
}

impl TensorSpec {
    /// A tensor of device memory.
    pub fn real(dims: [i64; 4], strides: [i64; 4], dtype: Dt) -> TensorSpec {
        TensorSpec {
            dims,
            strides,
            dtype,
            virtual_: false,
            by_value: false,
        }
    }

    /// A tensor inside the graph, dense in its dims' order.
    pub fn inner(dims: [i64; 4], dtype: Dt) -> TensorSpec {
        TensorSpec {
            dims,
            strides: dense(dims),
            dtype,
            virtual_: true,
            by_value: false,
        }
    }

    /// A float32 scalar given at execution (by value, on the host).
    pub fn scalar() -> TensorSpec {
        TensorSpec {
            dims: [1; 4],
            strides: [1; 4],
            dtype: Dt::CUDNN_DATA_FLOAT,
            virtual_: false,
            by_value: true,
        }
    }
}

/// The strides of a dense tensor of `dims` (the last dim's elements adjacent).
pub(crate) fn dense(dims: [i64; 4]) -> [i64; 4] {
    [dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1]
}

/// An operation graph under construction: its tensors by unique id and its nodes.
#[derive(Default)]
pub(crate) struct Graph {
    tensors: HashMap<i64, Desc>,
    /// (uid, spec) in the order made, for the variant pack's checks
    specs: Vec<(i64, TensorSpec)>,
    nodes: Vec<Desc>,
    next_uid: i64,
}

impl Graph {
    /// A graph whose inner tensors get ids from `first_inner` on (below it: the
    /// caller's own, for the variant pack).
    pub fn new(first_inner: i64) -> Graph {
        Graph {
            next_uid: first_inner,
            ..Graph::default()
        }
    }

    /// Declares tensor `uid`.
    pub fn tensor(&mut self, uid: i64, spec: TensorSpec) -> Result<i64> {
        let d = Desc::new(D::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
        d.set_dtype(A::CUDNN_ATTR_TENSOR_DATA_TYPE, spec.dtype)?;
        d.set_i64(A::CUDNN_ATTR_TENSOR_DIMENSIONS, &spec.dims)?;
        d.set_i64(A::CUDNN_ATTR_TENSOR_STRIDES, &spec.strides)?;
        d.set_i64(A::CUDNN_ATTR_TENSOR_UNIQUE_ID, &[uid])?;
        d.set_i64(A::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, &[16])?;
        d.set_bool(A::CUDNN_ATTR_TENSOR_IS_VIRTUAL, spec.virtual_)?;
        d.set_bool(A::CUDNN_ATTR_TENSOR_IS_BY_VALUE, spec.by_value)?;
        self.tensors.insert(uid, d.finalize()?);
        self.specs.push((uid, spec));
        Ok(uid)
    }

    /// Whether tensor `uid` is declared.
    pub fn declared(&self, uid: i64) -> bool {
        self.tensors.contains_key(&uid)
    }

    /// A new inner tensor of `dims`, dense, of `dtype`.
    pub fn inner(&mut self, dims: [i64; 4], dtype: Dt) -> Result<i64> {
        let uid = self.next_uid;
        self.next_uid += 1;
        self.tensor(uid, TensorSpec::inner(dims, dtype))
    }

    /// A new inner tensor of `dims` and `strides`.
    pub fn inner_strided(&mut self, dims: [i64; 4], strides: [i64; 4], dtype: Dt) -> Result<i64> {
        let uid = self.next_uid;
        self.next_uid += 1;
        let spec = TensorSpec {
            strides,
            ..TensorSpec::inner(dims, dtype)
        };
        self.tensor(uid, spec)
    }

    fn t(&self, uid: i64) -> &Desc {
        &self.tensors[&uid]
    }

    /// `y = mode(x, b)` elementwise (`b` broadcast), or `y = t ? x : b` for
    /// `BINARY_SELECT`; `axis` for `GEN_INDEX` (each element's index along it);
    /// computed in `prec`.
    pub fn pointwise(
        &mut self,
        mode: Pw,
        prec: Dt,
        (x, b, t): (i64, Option<i64>, Option<i64>),
        y: i64,
        axis: Option<i64>,
    ) -> Result<()> {
        let pw = Desc::new(D::CUDNN_BACKEND_POINTWISE_DESCRIPTOR)?;
        pw.set(
            A::CUDNN_ATTR_POINTWISE_MODE,
            T::CUDNN_TYPE_POINTWISE_MODE,
            &[mode],
        )?;
        pw.set_dtype(A::CUDNN_ATTR_POINTWISE_MATH_PREC, prec)?;
        if let Some(axis) = axis {
            pw.set_i64(A::CUDNN_ATTR_POINTWISE_AXIS, &[axis])?;
        }
        let pw = pw.finalize()?;
        let op = Desc::new(D::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)?;
        op.set_descs(A::CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, &[&pw])?;
        op.set_descs(A::CUDNN_ATTR_OPERATION_POINTWISE_XDESC, &[self.t(x)])?;
        if let Some(b) = b {
            op.set_descs(A::CUDNN_ATTR_OPERATION_POINTWISE_BDESC, &[self.t(b)])?;
        }
        if let Some(t) = t {
            op.set_descs(A::CUDNN_ATTR_OPERATION_POINTWISE_TDESC, &[self.t(t)])?;
        }
        op.set_descs(A::CUDNN_ATTR_OPERATION_POINTWISE_YDESC, &[self.t(y)])?;
        self.nodes.push(op.finalize()?);
        // the node keeps what it needs of the pointwise descriptor
        drop(pw);
        Ok(())
    }

    /// [`pointwise`](Self::pointwise) into a new dense inner tensor of `dims`
    /// and `dtype`, whose id it returns (`GEN_INDEX`: [`index`](Self::index)).
    pub fn op(
        &mut self,
        mode: Pw,
        prec: Dt,
        xbt: (i64, Option<i64>, Option<i64>),
        (dims, dtype): ([i64; 4], Dt),
    ) -> Result<i64> {
        let y = self.inner(dims, dtype)?;
        self.pointwise(mode, prec, xbt, y, None)?;
        Ok(y)
    }

    /// Each element's index along `axis` of `x` (of `dims`), as a new int32
    /// inner tensor, computed in `prec`.
    pub fn index(&mut self, x: i64, axis: i64, prec: Dt, dims: [i64; 4]) -> Result<i64> {
        let y = self.inner(dims, Dt::CUDNN_DATA_INT32)?;
        self.pointwise(
            Pw::CUDNN_POINTWISE_GEN_INDEX,
            prec,
            (x, None, None),
            y,
            Some(axis),
        )?;
        Ok(y)
    }

    /// `y = op` over the dims where `y` has size 1 and `x` does not.
    pub fn reduction(&mut self, op: Red, x: i64, y: i64) -> Result<()> {
        let r = Desc::new(D::CUDNN_BACKEND_REDUCTION_DESCRIPTOR)?;
        r.set(
            A::CUDNN_ATTR_REDUCTION_OPERATOR,
            T::CUDNN_TYPE_REDUCTION_OPERATOR_TYPE,
            &[op],
        )?;
        r.set_dtype(A::CUDNN_ATTR_REDUCTION_COMP_TYPE, Dt::CUDNN_DATA_FLOAT)?;
        // (an attribute from cuDNN 9.11 on; false is its default)
        if library().as_ref().is_ok_and(|v| *v >= 91100) {
            r.set_bool(A::CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC, false)?;
        }
        let r = r.finalize()?;
        let node = Desc::new(D::CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR)?;
        node.set_descs(A::CUDNN_ATTR_OPERATION_REDUCTION_DESC, &[&r])?;
        node.set_descs(A::CUDNN_ATTR_OPERATION_REDUCTION_XDESC, &[self.t(x)])?;
        node.set_descs(A::CUDNN_ATTR_OPERATION_REDUCTION_YDESC, &[self.t(y)])?;
        self.nodes.push(node.finalize()?);
        Ok(())
    }

    /// `c = a @ b` over the last two dims (batched over the first two), float32
    /// accumulation.
    pub fn matmul(&mut self, a: i64, b: i64, c: i64) -> Result<()> {
        let m = Desc::new(D::CUDNN_BACKEND_MATMUL_DESCRIPTOR)?;
        m.set_dtype(A::CUDNN_ATTR_MATMUL_COMP_TYPE, Dt::CUDNN_DATA_FLOAT)?;
        let m = m.finalize()?;
        let node = Desc::new(D::CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR)?;
        node.set_descs(A::CUDNN_ATTR_OPERATION_MATMUL_ADESC, &[self.t(a)])?;
        node.set_descs(A::CUDNN_ATTR_OPERATION_MATMUL_BDESC, &[self.t(b)])?;
        node.set_descs(A::CUDNN_ATTR_OPERATION_MATMUL_CDESC, &[self.t(c)])?;
        node.set_descs(A::CUDNN_ATTR_OPERATION_MATMUL_DESC, &[&m])?;
        self.nodes.push(node.finalize()?);
        Ok(())
    }

    /// A convolution pass: `y = x ⋆ w` (forward), `x` from `y` and `w`
    /// (backward data) or `w` from `x` and `y` (backward filter), cross-correlation
    /// over two spatial dims computed in `comp` (float64 for float64 operands,
    /// else float32); groups follow from the filter's second dim.
    pub fn convolution(
        &mut self,
        pass: ConvNode,
        [x, w, y]: [i64; 3],
        conv: &ConvSpec,
    ) -> Result<()> {
        let c = Desc::new(D::CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)?;
        c.set_dtype(A::CUDNN_ATTR_CONVOLUTION_COMP_TYPE, conv.comp)?;
        c.set(
            A::CUDNN_ATTR_CONVOLUTION_CONV_MODE,
            T::CUDNN_TYPE_CONVOLUTION_MODE,
            &[sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION],
        )?;
        c.set_i64(A::CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, &[2])?;
        c.set_i64(A::CUDNN_ATTR_CONVOLUTION_DILATIONS, &conv.dilation)?;
        c.set_i64(A::CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, &conv.stride)?;
        c.set_i64(A::CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, &conv.pad)?;
        c.set_i64(A::CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, &conv.pad)?;
        let c = c.finalize()?;
        use ConvNode::*;
        let (kind, [ax, aw, ay, desc, alpha, beta]) = match pass {
            Forward => (
                D::CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
                [
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
                ],
            ),
            BackwardData => (
                D::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
                [
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
                ],
            ),
            BackwardFilter => (
                D::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
                [
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
                    A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
                ],
            ),
        };
        let node = Desc::new(kind)?;
        node.set_descs(ax, &[self.t(x)])?;
        node.set_descs(aw, &[self.t(w)])?;
        node.set_descs(ay, &[self.t(y)])?;
        node.set_descs(desc, &[&c])?;
        if conv.comp == Dt::CUDNN_DATA_DOUBLE {
            node.set(alpha, T::CUDNN_TYPE_DOUBLE, &[1f64])?;
            node.set(beta, T::CUDNN_TYPE_DOUBLE, &[0f64])?;
        } else {
            node.set(alpha, T::CUDNN_TYPE_FLOAT, &[1f32])?;
            node.set(beta, T::CUDNN_TYPE_FLOAT, &[0f32])?;
        }
        self.nodes.push(node.finalize()?);
        Ok(())
    }

    /// `y` as `x` seen with another layout or type (no arithmetic).
    pub fn reshape(&mut self, x: i64, y: i64) -> Result<()> {
        let node = Desc::new(D::CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR)?;
        node.set_descs(A::CUDNN_ATTR_OPERATION_RESHAPE_XDESC, &[self.t(x)])?;
        node.set_descs(A::CUDNN_ATTR_OPERATION_RESHAPE_YDESC, &[self.t(y)])?;
        self.nodes.push(node.finalize()?);
        Ok(())
    }

    /// The finalized operation graph, for the GPU of `handle` (cuDNN 9 takes
    /// the GPU from the heuristics and the plan too, and deprecates the graph's
    /// handle; given, it is set as cuDNN's frontend sets it; `None` for a GPU
    /// described by its properties).
    pub fn finish(self, handle: Option<sys::cudnnHandle_t>) -> Result<OpGraph> {
        let g = Desc::new(D::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
        if let Some(h) = handle {
            g.set(
                A::CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
                T::CUDNN_TYPE_HANDLE,
                &[h],
            )?;
        }
        let nodes: Vec<&Desc> = self.nodes.iter().collect();
        g.set_descs(A::CUDNN_ATTR_OPERATIONGRAPH_OPS, &nodes)?;
        let g = g.finalize()?;
        Ok(OpGraph {
            graph: g,
            _parts: (self.tensors.into_values().collect(), self.nodes),
            specs: self.specs,
        })
    }
}

/// Which convolution a [`Graph::convolution`] node computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConvNode {
    Forward,
    BackwardData,
    BackwardFilter,
}

/// A convolution's parameters in cuDNN's terms.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConvSpec {
    pub comp: Dt,
    pub pad: [i64; 2],
    pub stride: [i64; 2],
    pub dilation: [i64; 2],
}

/// cuDNN's numerical notes of an engine (`cudnnBackendNumericalNote_t`), read as
/// plain integers: a newer cuDNN may report values the bindings do not list.
pub(crate) mod note {
    pub const TENSOR_CORE: u32 = 0;
    pub const DOWN_CONVERT_INPUTS: u32 = 1;
    pub const NONDETERMINISTIC: u32 = 4;
}

/// A finalized operation graph, with the descriptors it was made of.
pub(crate) struct OpGraph {
    graph: Desc,
    _parts: (Vec<Desc>, Vec<Desc>),
    specs: Vec<(i64, TensorSpec)>,
}

/// What a plan is built for: a GPU through its cuDNN handle, or a GPU described
/// by its properties (no GPU needed).
pub(crate) enum Target<'a> {
    Handle(sys::cudnnHandle_t),
    #[cfg_attr(not(test), allow(dead_code))]
    Model(&'a DeviceModel),
}

impl Target<'_> {
    /// The handle, for a GPU reached through one.
    pub fn handle(&self) -> Option<sys::cudnnHandle_t> {
        match self {
            Target::Handle(h) => Some(*h),
            Target::Model(_) => None,
        }
    }
}

/// A GPU described by its properties, for cuDNN's heuristics and plans without
/// one (cuDNN 9.8 or later).
pub(crate) struct DeviceModel(Desc);

impl DeviceModel {
    /// For the tests that ask cuDNN about ember's graphs without a GPU: an H200
    /// described by its properties where cuDNN 9.8 or later loads, else `None`
    /// after saying why `test` skipped ([`offline_skip`]).
    #[cfg(test)]
    pub fn offline_h200(test: &str) -> Option<DeviceModel> {
        let why = match library() {
            Err(why) => why.clone(),
            Ok(v) if *v < 90800 => {
                format!("cuDNN {v} describes no GPU without one (9.8 or later does)")
            }
            Ok(_) => return Some(DeviceModel::h200().expect("cuDNN takes the H200's description")),
        };
        offline_skip(test, &why);
        None
    }

    #[cfg_attr(not(test), allow(dead_code))]
    /// An NVIDIA H200 (sm_90, 132 multiprocessors, 227 KiB of shared memory a
    /// block), as cuDNN's JSON describes a device.
    pub fn h200() -> Result<DeviceModel> {
        let json = concat!(
            r#"{"maxGridSize":[2147483647,65535,65535],"maxBlockSize":[1024,1024,64],"#,
            r#""regsPerBlock":65536,"multiProcessorCount":132,"warpSize":32,"#,
            r#""maxSharedMemoryPerBlock":49152,"maxSharedMemoryPerBlockOptin":232448,"#,
            r#""reservedSharedMemoryPerBlock":1024,"maxRegistersPerSM":65536,"maxCtasPerSM":32,"#,
            r#""maxThreadsPerBlock":1024,"maxThreadsPerSM":2048,"pciDeviceId":9013,"#,
            r#""isTccDriver":0,"supportCoopLaunch":1,"totalGlobalMem":150754820096,"#,
            r#""smClockRateKHz":1980000,"memClockRateKHz":3201000,"l2CacheSize":52428800,"#,
            r#""cudaDeviceId":0,"deviceVer":900,"driverVer":13000,"deviceName":"NVIDIA H200"}"#,
            "\0"
        );
        let d = Desc::new(D::CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR)?;
        d.set(
            A::CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION,
            T::CUDNN_TYPE_CHAR,
            json.as_bytes(),
        )?;
        Ok(DeviceModel(d.finalize()?))
    }
}

/// Says that the offline cuDNN test `test` skipped and why; fails it instead
/// where `EMBER_CUDNN_OFFLINE=1` (set by `bench/cudnn-offline`, whose checks
/// must run).
#[cfg(test)]
pub fn offline_skip(test: &str, why: &str) {
    if std::env::var("EMBER_CUDNN_OFFLINE").is_ok_and(|v| v == "1") {
        panic!("{test} cannot run: {why}");
    }
    eprintln!("skipped {test}: {why}");
}

/// One engine configuration cuDNN's heuristics proposed.
pub(crate) struct Config(Desc);

impl Config {
    /// The workspace its plan needs, in bytes.
    pub fn workspace(&self) -> Result<usize> {
        Ok(self
            .0
            .get_i64(A::CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE)?
            .max(0) as usize)
    }
    /// Its engine's numerical notes ([`note`]) and the engine's index.
    pub fn engine(&self) -> Result<(Vec<u32>, i64)> {
        let engine = Desc::new(D::CUDNN_BACKEND_ENGINE_DESCRIPTOR)?;
        let mut raw = engine.0;
        let mut n = 0i64;
        // SAFETY: one created descriptor for cuDNN to fill with the engine.
        check("cudnnBackendGetAttribute", unsafe {
            sys::cudnnBackendGetAttribute(
                self.0 .0,
                A::CUDNN_ATTR_ENGINECFG_ENGINE,
                T::CUDNN_TYPE_BACKEND_DESCRIPTOR,
                1,
                &mut n,
                (&mut raw as *mut sys::cudnnBackendDescriptor_t).cast(),
            )
        })?;
        let mut notes = [0u32; 16];
        let mut count = 0i64;
        // SAFETY: room for 16 notes (cuDNN lists a handful), as 32-bit integers.
        check("cudnnBackendGetAttribute", unsafe {
            sys::cudnnBackendGetAttribute(
                engine.0,
                A::CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                T::CUDNN_TYPE_NUMERICAL_NOTE,
                notes.len() as i64,
                &mut count,
                notes.as_mut_ptr().cast(),
            )
        })?;
        let index = engine.get_i64(A::CUDNN_ATTR_ENGINE_GLOBAL_INDEX)?;
        Ok((notes[..count.clamp(0, 16) as usize].to_vec(), index))
    }
}

impl OpGraph {
    /// cuDNN's engine configurations for this graph, best first (heuristic mode
    /// A), for `target`.
    pub fn configs(&self, target: &Target<'_>) -> Result<Vec<Config>> {
        self.configs_in(target, sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A)
    }

    /// [`configs`](Self::configs), then cuDNN's fallback list (engines that run
    /// without its heuristics' ranking: the ones left where the first list's are
    /// all refused, for their math or determinism).
    pub fn configs_with_fallback(&self, target: &Target<'_>) -> Result<Vec<Config>> {
        let mut all = self.configs(target)?;
        // (a failed fallback query leaves the first list as it is)
        let fallback = self.configs_in(
            target,
            sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_FALLBACK,
        );
        all.extend(fallback.unwrap_or_default());
        Ok(all)
    }

    fn configs_in(
        &self,
        target: &Target<'_>,
        mode: sys::cudnnBackendHeurMode_t,
    ) -> Result<Vec<Config>> {
        let h = Desc::new(D::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?;
        h.set_descs(A::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, &[&self.graph])?;
        h.set(
            A::CUDNN_ATTR_ENGINEHEUR_MODE,
            T::CUDNN_TYPE_HEUR_MODE,
            &[mode],
        )?;
        if let Target::Model(m) = target {
            h.set_descs(A::CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, &[&m.0])?;
        }
        let h = h.finalize()?;
        let mut count = 0i64;
        // SAFETY: a count query (no elements requested).
        check("cudnnBackendGetAttribute", unsafe {
            sys::cudnnBackendGetAttribute(
                h.0,
                A::CUDNN_ATTR_ENGINEHEUR_RESULTS,
                T::CUDNN_TYPE_BACKEND_DESCRIPTOR,
                0,
                &mut count,
                std::ptr::null_mut(),
            )
        })?;
        let configs = (0..count.max(0))
            .map(|_| Desc::new(D::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR).map(Config))
            .collect::<Result<Vec<_>>>()?;
        let mut raw: Vec<sys::cudnnBackendDescriptor_t> = configs.iter().map(|c| c.0 .0).collect();
        let mut got = 0i64;
        // SAFETY: `raw` holds `count` created engine-config descriptors for cuDNN
        // to fill.
        check("cudnnBackendGetAttribute", unsafe {
            sys::cudnnBackendGetAttribute(
                h.0,
                A::CUDNN_ATTR_ENGINEHEUR_RESULTS,
                T::CUDNN_TYPE_BACKEND_DESCRIPTOR,
                raw.len() as i64,
                &mut got,
                raw.as_mut_ptr().cast(),
            )
        })?;
        let mut configs = configs;
        configs.truncate(got.clamp(0, count) as usize);
        Ok(configs)
    }

    /// The execution plan of `config` for `target`.
    pub fn plan(&self, config: &Config, target: &Target<'_>) -> Result<Plan> {
        let p = Desc::new(D::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
        p.set_descs(A::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &[&config.0])?;
        match target {
            Target::Handle(h) => p.set(
                A::CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
                T::CUDNN_TYPE_HANDLE,
                &[*h],
            )?,
            Target::Model(m) => p.set_descs(A::CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, &[&m.0])?,
        }
        let p = p.finalize()?;
        let workspace = p
            .get_i64(A::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)?
            .max(0) as usize;
        Ok(Plan {
            plan: p,
            workspace,
            uids: self
                .specs
                .iter()
                .filter(|(_, s)| !s.virtual_)
                .map(|(u, _)| *u)
                .collect(),
        })
    }
}

/// An execution plan: what runs the graph on the GPU.
pub(crate) struct Plan {
    plan: Desc,
    /// The workspace it needs, in bytes.
    pub workspace: usize,
    /// The ids of the graph's tensors that an execution must be given.
    uids: Vec<i64>,
}

impl Plan {
    /// Queues the graph on the stream `handle` is bound to, with each tensor's
    /// address by id (device memory, or a host scalar for a by-value tensor) and
    /// a workspace of at least [`workspace`](Self::workspace) bytes.
    ///
    /// # Safety
    /// Each address holds a tensor of its id's size and strides (by-value ones:
    /// one float32 on the host, alive until this returns); `workspace` addresses
    /// that many bytes of device memory; `handle` is the device's, bound to its
    /// stream, its context current.
    pub unsafe fn execute(
        &self,
        handle: sys::cudnnHandle_t,
        data: &[(i64, *mut c_void)],
        workspace: *mut c_void,
    ) -> Result<()> {
        for u in &self.uids {
            if !data.iter().any(|(id, _)| id == u) {
                return Err(Error::Cuda {
                    op: "cudnnBackendExecute",
                    msg: format!("no address for tensor {u} of the graph"),
                });
            }
        }
        // the plan's tensors only: cuDNN may refuse ids its graph does not have
        let (ids, ptrs): (Vec<i64>, Vec<*mut c_void>) = data
            .iter()
            .copied()
            .filter(|(id, _)| self.uids.contains(id))
            .unzip();
        let vp = Desc::new(D::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?;
        vp.set_i64(A::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, &ids)?;
        vp.set(
            A::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
            T::CUDNN_TYPE_VOID_PTR,
            &ptrs,
        )?;
        vp.set(
            A::CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
            T::CUDNN_TYPE_VOID_PTR,
            &[workspace],
        )?;
        let vp = vp.finalize()?;
        // SAFETY: as the caller promises.
        check("cudnnBackendExecute", unsafe {
            sys::cudnnBackendExecute(handle, self.plan.0, vp.0)
        })
    }
}
