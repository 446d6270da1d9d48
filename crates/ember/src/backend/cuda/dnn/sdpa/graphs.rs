//! The forward and backward graphs of cuDNN's fused attention for one
//! geometry, node for node as cuDNN's frontend writes them (checked, as far as
//! cuDNN's debug log shows them and for cuDNN 9.14, by `bench/cudnn-offline`
//! against `tests/golden/cudnn/graphs.json`).

use super::super::graph::{dense, Dt, Graph, OpGraph, Pw, Red, TensorSpec};
use super::super::loaded;
use super::uid;
use crate::dtype::DType;
use crate::error::{Error, Result};
use cudarc::cudnn::sys;

/// An attention call in cuDNN's terms: the operands' type and sizes (batch,
/// heads, query rows `l`, key rows `s`, head dim `d`), each operand's (batch,
/// head, row) strides in elements (its columns adjacent), and the mask.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SdpaGeom {
    pub dtype: DType,
    pub b: i64,
    pub h: i64,
    pub l: i64,
    pub s: i64,
    pub d: i64,
    pub q: [i64; 3],
    pub k: [i64; 3],
    pub v: [i64; 3],
    /// the output's (the forward writes it, the backward reads it)
    pub o: [i64; 3],
    pub causal: bool,
    /// the backward's: the output's gradient, and where dq, dk and dv go
    pub grads: Option<[[i64; 3]; 4]>,
}

/// Where the inner tensors' ids start.
const FIRST_INNER: i64 = 100;

impl SdpaGeom {
    fn data(&self) -> Dt {
        if self.dtype == DType::BF16 {
            Dt::CUDNN_DATA_BFLOAT16
        } else {
            Dt::CUDNN_DATA_HALF
        }
    }

    fn dims(&self, rows: i64) -> [i64; 4] {
        [self.b, self.h, rows, self.d]
    }

    fn strided(st: [i64; 3]) -> [i64; 4] {
        [st[0], st[1], st[2], 1]
    }

    /// `k` (or `v`) seen as its transpose `[b, h, d, s]`.
    fn transposed(&self, st: [i64; 3]) -> ([i64; 4], [i64; 4]) {
        ([self.b, self.h, self.d, self.s], [st[0], st[1], 1, st[2]])
    }

    /// Declares the masked score `NEG_INF` (a host scalar) once: a graph's
    /// tensors are exactly those its nodes use.
    fn neg_inf(g: &mut Graph) -> Result<()> {
        if !g.declared(uid::NEG_INF) {
            g.tensor(uid::NEG_INF, TensorSpec::scalar())?;
        }
        Ok(())
    }

    /// Whether the backward's graph masks the scores past each sequence's
    /// length, which are none: cuDNN's backward engines up to 9.15 need this
    /// mask where the key count is not a multiple of 128, and cuDNN's frontend
    /// adds it for them (the lengths `SEQ_Q` and `SEQ_KV`, one int32 of each a
    /// batch, in the workspace: [`AttnLibraryParts::lens`]).
    pub fn padding_mask(&self, cudnn_version: usize) -> bool {
        self.grads.is_some() && self.s % 128 != 0 && cudnn_version <= 91500
    }

    /// `x` (`[b, h, l, s]` float32) with the scores of rows past `SEQ_Q` or
    /// columns past `SEQ_KV` set to `NEG_INF`, as cuDNN's frontend writes its
    /// padding mask. (cuDNN's debug log, which `bench/cudnn-offline` compares
    /// with the frontend's graphs, shows neither the index nodes' axes, nor
    /// the select's masked value, nor the AND's operands, nor which length
    /// each comparison takes: those are as the frontend's by reading.)
    fn padded(&self, g: &mut Graph, x: i64) -> Result<i64> {
        let scores = [self.b, self.h, self.l, self.s];
        let lens = [self.b, 1, 1, 1];
        let (i32_, bool_) = (Dt::CUDNN_DATA_INT32, Dt::CUDNN_DATA_BOOLEAN);
        Self::neg_inf(g)?;
        g.tensor(uid::SEQ_Q, TensorSpec::real(lens, [1; 4], i32_))?;
        g.tensor(uid::SEQ_KV, TensorSpec::real(lens, [1; 4], i32_))?;
        let row = g.index(x, 2, i32_, scores)?;
        let col = g.index(x, 3, i32_, scores)?;
        let lt = Pw::CUDNN_POINTWISE_CMP_LT;
        let row_in = g.op(lt, bool_, (row, Some(uid::SEQ_Q), None), (scores, bool_))?;
        let col_in = g.op(lt, bool_, (col, Some(uid::SEQ_KV), None), (scores, bool_))?;
        let and = Pw::CUDNN_POINTWISE_LOGICAL_AND;
        let keep = g.op(and, bool_, (row_in, Some(col_in), None), (scores, bool_))?;
        let f32_ = Dt::CUDNN_DATA_FLOAT;
        let select = Pw::CUDNN_POINTWISE_BINARY_SELECT;
        g.op(
            select,
            f32_,
            (x, Some(uid::NEG_INF), Some(keep)),
            (scores, f32_),
        )
    }

    /// The scaled scores with the causal mask (when asked) applied to `x`
    /// (`[b, h, l, s]` float32): a key after its query gets `NEG_INF`.
    fn masked(&self, g: &mut Graph, x: i64) -> Result<i64> {
        if !self.causal {
            return Ok(x);
        }
        let scores = [self.b, self.h, self.l, self.s];
        let (f32_, bool_) = (Dt::CUDNN_DATA_FLOAT, Dt::CUDNN_DATA_BOOLEAN);
        Self::neg_inf(g)?;
        let row = g.index(x, 2, f32_, scores)?;
        let col = g.index(x, 3, f32_, scores)?;
        let ge = Pw::CUDNN_POINTWISE_CMP_GE;
        let keep = g.op(ge, bool_, (row, Some(col), None), (scores, bool_))?;
        let select = Pw::CUDNN_POINTWISE_BINARY_SELECT;
        g.op(
            select,
            f32_,
            (x, Some(uid::NEG_INF), Some(keep)),
            (scores, f32_),
        )
    }

    /// An operand or result of `rows` rows with (batch, head, row) strides `st`.
    fn real(&self, rows: i64, st: [i64; 3]) -> TensorSpec {
        TensorSpec::real(self.dims(rows), Self::strided(st), self.data())
    }

    /// A graph with what both passes declare alike (`Q`, `K` as its transpose,
    /// `O`, `STATS` and `SCALE`), and the scores' and rows' sizes with float32.
    #[allow(clippy::type_complexity)]
    fn operands(&self) -> Result<(Graph, ([i64; 4], Dt), ([i64; 4], Dt))> {
        let f32_ = Dt::CUDNN_DATA_FLOAT;
        let mut g = Graph::new(FIRST_INNER);
        let scores = ([self.b, self.h, self.l, self.s], f32_);
        let rows = ([self.b, self.h, self.l, 1], f32_);
        g.tensor(uid::Q, self.real(self.l, self.q))?;
        let (kd, ks) = self.transposed(self.k);
        g.tensor(uid::K, TensorSpec::real(kd, ks, self.data()))?;
        g.tensor(uid::O, self.real(self.l, self.o))?;
        g.tensor(uid::STATS, TensorSpec::real(rows.0, dense(rows.0), f32_))?;
        g.tensor(uid::SCALE, TensorSpec::scalar())?;
        Ok((g, scores, rows))
    }

    /// The forward's graph: the output `O` and the log-sum-exps `STATS` of
    /// `Q`, `K`, `V` and the host scalars `SCALE` and (causal) `NEG_INF`.
    pub fn forward(&self, handle: Option<sys::cudnnHandle_t>) -> Result<OpGraph> {
        let (data, f32_) = (self.data(), Dt::CUDNN_DATA_FLOAT);
        let (mut g, scores, rows) = self.operands()?;
        g.tensor(uid::V, self.real(self.s, self.v))?;

        // softmax(scale · q kᵀ [masked]) v, and each row's log-sum-exp
        let s = g.inner(scores.0, f32_)?;
        g.matmul(uid::Q, uid::K, s)?;
        let scaled = g.op(
            Pw::CUDNN_POINTWISE_MUL,
            f32_,
            (s, Some(uid::SCALE), None),
            scores,
        )?;
        let x = self.masked(&mut g, scaled)?;
        let max = g.inner(rows.0, f32_)?;
        g.reduction(Red::CUDNN_REDUCE_TENSOR_MAX, x, max)?;
        let shifted = g.op(Pw::CUDNN_POINTWISE_SUB, f32_, (x, Some(max), None), scores)?;
        let e = g.op(Pw::CUDNN_POINTWISE_EXP, f32_, (shifted, None, None), scores)?;
        let sum = g.inner(rows.0, f32_)?;
        g.reduction(Red::CUDNN_REDUCE_TENSOR_ADD, e, sum)?;
        let log = g.op(Pw::CUDNN_POINTWISE_LOG, f32_, (sum, None, None), rows)?;
        let add = Pw::CUDNN_POINTWISE_ADD;
        g.pointwise(add, f32_, (max, Some(log), None), uid::STATS, None)?;
        let div = Pw::CUDNN_POINTWISE_DIV;
        let p = g.op(div, f32_, (e, Some(sum), None), (scores.0, data))?;
        g.matmul(p, uid::V, uid::O)?;
        g.finish(handle)
    }

    /// The backward's graph: `DQ`, `DK` and `DV` of `Q`, `K`, `V`, `O`, `DO`
    /// and `STATS` (the forward's), the scalars `SCALE`, `ONE` and (causal or
    /// padded) `NEG_INF`, two float32 parts of the workspace, `DOT` (each row's
    /// `Σ dout · out`) and `DQ_ACC` (dq before its cast), and where
    /// [`padding_mask`](Self::padding_mask) says so the lengths `SEQ_Q` and
    /// `SEQ_KV`.
    pub fn backward(&self, handle: Option<sys::cudnnHandle_t>) -> Result<OpGraph> {
        let [go, dq, dk, dv] = self.grads.ok_or_else(|| Error::Cuda {
            op: "cuDNN attention",
            msg: "a backward geometry without its gradients' strides".into(),
        })?;
        let version = loaded()?;
        let (data, f32_) = (self.data(), Dt::CUDNN_DATA_FLOAT);
        let (mut g, scores, rows) = self.operands()?;
        let (vd, vs) = self.transposed(self.v);
        g.tensor(uid::V, TensorSpec::real(vd, vs, data))?;
        g.tensor(uid::DO, self.real(self.l, go))?;
        g.tensor(uid::DQ, self.real(self.l, dq))?;
        g.tensor(uid::DK, self.real(self.s, dk))?;
        g.tensor(uid::DV, self.real(self.s, dv))?;
        g.tensor(uid::DOT, TensorSpec::real(rows.0, dense(rows.0), f32_))?;
        let acc = self.dims(self.l);
        g.tensor(uid::DQ_ACC, TensorSpec::real(acc, dense(acc), f32_))?;
        g.tensor(uid::ONE, TensorSpec::scalar())?;
        let (mul, sub) = (Pw::CUDNN_POINTWISE_MUL, Pw::CUDNN_POINTWISE_SUB);

        // each row's Σ dout · out (the product's strides are the ones cuDNN's
        // frontend gives it: a virtual tensor's describe no memory, and ember's
        // graphs are the frontend's node for node, bench/cudnn-offline)
        let (h, l, d) = (self.h, self.l, self.d);
        let prod = g.inner_strided(self.dims(l), [h * l * d, l * d, h * d, 1], f32_)?;
        g.pointwise(mul, f32_, (uid::DO, Some(uid::O), None), prod, None)?;
        let dot = g.inner(rows.0, f32_)?;
        g.reduction(Red::CUDNN_REDUCE_TENSOR_ADD, prod, dot)?;
        g.pointwise(mul, f32_, (dot, Some(uid::ONE), None), uid::DOT, None)?;

        // the weights again, from the scores and the saved log-sum-exps
        let s = g.inner(scores.0, f32_)?;
        g.matmul(uid::Q, uid::K, s)?;
        let scaled = g.op(mul, f32_, (s, Some(uid::SCALE), None), scores)?;
        let shifted = g.op(sub, f32_, (scaled, Some(uid::STATS), None), scores)?;
        let shifted = if self.padding_mask(version) {
            self.padded(&mut g, shifted)?
        } else {
            shifted
        };
        let x = self.masked(&mut g, shifted)?;
        let p = g.op(Pw::CUDNN_POINTWISE_EXP, f32_, (x, None, None), scores)?;

        // dv = pᵀ dout
        let t_dims = [self.b, self.h, self.s, self.l];
        let t_strides = [self.h * self.l * self.s, self.l * self.s, 1, self.s];
        let pt = g.inner_strided(t_dims, t_strides, data)?;
        g.reshape(p, pt)?;
        g.matmul(pt, uid::DO, uid::DV)?;

        // ds = p · (dout vᵀ - Σ dout · out) · scale
        let dp = g.inner(scores.0, f32_)?;
        g.matmul(uid::DO, uid::V, dp)?;
        let centred = g.op(sub, f32_, (dp, Some(uid::DOT), None), scores)?;
        let weighted = g.op(mul, f32_, (centred, Some(p), None), scores)?;
        let ds = g.op(mul, f32_, (weighted, Some(uid::SCALE), None), scores)?;

        // dk = dsᵀ q
        let dst = g.inner_strided(t_dims, t_strides, data)?;
        g.reshape(ds, dst)?;
        g.matmul(dst, uid::Q, uid::DK)?;

        // dq = ds k, accumulated in float32, then cast
        let k32 = g.inner_strided(self.dims(self.s), Self::strided(self.k), f32_)?;
        g.reshape(uid::K, k32)?;
        g.matmul(ds, k32, uid::DQ_ACC)?;
        let identity = Pw::CUDNN_POINTWISE_IDENTITY;
        g.pointwise(identity, f32_, (uid::DQ_ACC, None, None), uid::DQ, None)?;
        g.finish(handle)
    }
}
