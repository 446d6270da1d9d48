//! Fused attention through cuDNN's graph API: the forward and backward of
//! `softmax(scale · q kᵀ [+ causal mask]) v` on f16/bf16 operands, written as
//! the graphs cuDNN's flash-attention engines recognise (matrix products,
//! pointwise nodes and row reductions), built once per geometry and kept as
//! execution plans.
//!
//! The forward writes the output and each row's log-sum-exp of the scaled
//! scores (natural log, float32: what ember's own kernels save), so either
//! backward can follow either forward. The backward takes a workspace of
//! [`attn_library_workspace`](crate::backend::op::attn_library_workspace)
//! bytes: each row's `Σ dout · out`, then the queries' gradient accumulated in
//! float32, then the plan's own.

use super::graph::{dense, Config, Dt, Graph, OpGraph, Plan, Pw, Red, Target, TensorSpec};
use super::{capturing, library, log_choices};
use crate::dtype::DType;
use crate::error::{Error, Result};
use cudarc::cudnn::sys;
use cudarc::driver::sys::CUstream;
use std::ffi::c_void;

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

/// The ids of the tensors an execution is given.
pub(crate) mod uid {
    pub const Q: i64 = 1;
    pub const K: i64 = 2;
    pub const V: i64 = 3;
    pub const O: i64 = 4;
    pub const STATS: i64 = 5;
    pub const SCALE: i64 = 6;
    pub const NEG_INF: i64 = 7;
    pub const DO: i64 = 8;
    pub const DQ: i64 = 9;
    pub const DK: i64 = 10;
    pub const DV: i64 = 11;
    pub const DOT: i64 = 12;
    pub const DQ_ACC: i64 = 13;
    pub const ONE: i64 = 14;
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

    /// The scaled scores with the causal mask (when asked) applied to `x`
    /// (`[b, h, l, s]` float32): a key after its query gets `NEG_INF`.
    fn masked(&self, g: &mut Graph, x: i64) -> Result<i64> {
        if !self.causal {
            return Ok(x);
        }
        let scores = [self.b, self.h, self.l, self.s];
        // (declared only here: a graph's tensors are exactly those its nodes use)
        g.tensor(uid::NEG_INF, TensorSpec::scalar())?;
        let row = g.inner(scores, Dt::CUDNN_DATA_INT32)?;
        let col = g.inner(scores, Dt::CUDNN_DATA_INT32)?;
        let f32_ = Dt::CUDNN_DATA_FLOAT;
        g.pointwise(
            Pw::CUDNN_POINTWISE_GEN_INDEX,
            f32_,
            (x, None, None),
            row,
            Some(2),
        )?;
        g.pointwise(
            Pw::CUDNN_POINTWISE_GEN_INDEX,
            f32_,
            (x, None, None),
            col,
            Some(3),
        )?;
        let keep = g.inner(scores, Dt::CUDNN_DATA_BOOLEAN)?;
        g.pointwise(
            Pw::CUDNN_POINTWISE_CMP_GE,
            Dt::CUDNN_DATA_BOOLEAN,
            (row, Some(col), None),
            keep,
            None,
        )?;
        let y = g.inner(scores, f32_)?;
        g.pointwise(
            Pw::CUDNN_POINTWISE_BINARY_SELECT,
            f32_,
            (x, Some(uid::NEG_INF), Some(keep)),
            y,
            None,
        )?;
        Ok(y)
    }

    /// The forward's graph: the output `O` and the log-sum-exps `STATS` of
    /// `Q`, `K`, `V` and the host scalars `SCALE` and (causal) `NEG_INF`.
    pub fn forward(&self, handle: Option<sys::cudnnHandle_t>) -> Result<OpGraph> {
        let (data, f32_) = (self.data(), Dt::CUDNN_DATA_FLOAT);
        let mut g = Graph::new(FIRST_INNER);
        let (scores, rows) = (
            [self.b, self.h, self.l, self.s],
            [self.b, self.h, self.l, 1],
        );
        g.tensor(
            uid::Q,
            TensorSpec::real(self.dims(self.l), Self::strided(self.q), data),
        )?;
        let (kd, ks) = self.transposed(self.k);
        g.tensor(uid::K, TensorSpec::real(kd, ks, data))?;
        g.tensor(
            uid::V,
            TensorSpec::real(self.dims(self.s), Self::strided(self.v), data),
        )?;
        g.tensor(
            uid::O,
            TensorSpec::real(self.dims(self.l), Self::strided(self.o), data),
        )?;
        g.tensor(uid::STATS, TensorSpec::real(rows, dense(rows), f32_))?;
        g.tensor(uid::SCALE, TensorSpec::scalar())?;

        let s = g.inner(scores, f32_)?;
        g.matmul(uid::Q, uid::K, s)?;
        let scaled = g.inner(scores, f32_)?;
        g.pointwise(
            Pw::CUDNN_POINTWISE_MUL,
            f32_,
            (s, Some(uid::SCALE), None),
            scaled,
            None,
        )?;
        let x = self.masked(&mut g, scaled)?;
        let max = g.inner(rows, f32_)?;
        g.reduction(Red::CUDNN_REDUCE_TENSOR_MAX, x, max)?;
        let shifted = g.inner(scores, f32_)?;
        g.pointwise(
            Pw::CUDNN_POINTWISE_SUB,
            f32_,
            (x, Some(max), None),
            shifted,
            None,
        )?;
        let e = g.inner(scores, f32_)?;
        g.pointwise(
            Pw::CUDNN_POINTWISE_EXP,
            f32_,
            (shifted, None, None),
            e,
            None,
        )?;
        let sum = g.inner(rows, f32_)?;
        g.reduction(Red::CUDNN_REDUCE_TENSOR_ADD, e, sum)?;
        let log = g.inner(rows, f32_)?;
        g.pointwise(Pw::CUDNN_POINTWISE_LOG, f32_, (sum, None, None), log, None)?;
        g.pointwise(
            Pw::CUDNN_POINTWISE_ADD,
            f32_,
            (max, Some(log), None),
            uid::STATS,
            None,
        )?;
        let p = g.inner(scores, data)?;
        g.pointwise(Pw::CUDNN_POINTWISE_DIV, f32_, (e, Some(sum), None), p, None)?;
        g.matmul(p, uid::V, uid::O)?;
        g.finish(handle)
    }

    /// The backward's graph: `DQ`, `DK` and `DV` of `Q`, `K`, `V`, `O`, `DO`
    /// and `STATS` (the forward's), the scalars `SCALE`, `ONE` and (causal)
    /// `NEG_INF`,
    /// and two float32 parts of the workspace: `DOT` (each row's `Σ dout · out`)
    /// and `DQ_ACC` (dq before its cast).
    pub fn backward(&self, handle: Option<sys::cudnnHandle_t>) -> Result<OpGraph> {
        let [go, dq, dk, dv] = self.grads.ok_or_else(|| Error::Cuda {
            op: "cuDNN attention",
            msg: "a backward geometry without its gradients' strides".into(),
        })?;
        let (data, f32_) = (self.data(), Dt::CUDNN_DATA_FLOAT);
        let mut g = Graph::new(FIRST_INNER);
        let scores = [self.b, self.h, self.l, self.s];
        let rows = [self.b, self.h, self.l, 1];
        let real = |st| TensorSpec::real(self.dims(self.l), Self::strided(st), data);
        g.tensor(uid::Q, real(self.q))?;
        let (kd, ks) = self.transposed(self.k);
        g.tensor(uid::K, TensorSpec::real(kd, ks, data))?;
        let (vd, vs) = self.transposed(self.v);
        g.tensor(uid::V, TensorSpec::real(vd, vs, data))?;
        g.tensor(uid::O, real(self.o))?;
        g.tensor(uid::DO, real(go))?;
        g.tensor(uid::STATS, TensorSpec::real(rows, dense(rows), f32_))?;
        g.tensor(uid::DQ, real(dq))?;
        let kv = |st| TensorSpec::real(self.dims(self.s), Self::strided(st), data);
        g.tensor(uid::DK, kv(dk))?;
        g.tensor(uid::DV, kv(dv))?;
        g.tensor(uid::DOT, TensorSpec::real(rows, dense(rows), f32_))?;
        let acc = self.dims(self.l);
        g.tensor(uid::DQ_ACC, TensorSpec::real(acc, dense(acc), f32_))?;
        for u in [uid::SCALE, uid::ONE] {
            g.tensor(u, TensorSpec::scalar())?;
        }

        // each row's Σ dout · out
        let prod = g.inner(self.dims(self.l), f32_)?;
        g.pointwise(
            Pw::CUDNN_POINTWISE_MUL,
            f32_,
            (uid::DO, Some(uid::O), None),
            prod,
            None,
        )?;
        let dot = g.inner(rows, f32_)?;
        g.reduction(Red::CUDNN_REDUCE_TENSOR_ADD, prod, dot)?;
        g.pointwise(
            Pw::CUDNN_POINTWISE_MUL,
            f32_,
            (dot, Some(uid::ONE), None),
            uid::DOT,
            None,
        )?;

        // the weights again, from the scores and the saved log-sum-exps
        let s = g.inner(scores, f32_)?;
        g.matmul(uid::Q, uid::K, s)?;
        let scaled = g.inner(scores, f32_)?;
        g.pointwise(
            Pw::CUDNN_POINTWISE_MUL,
            f32_,
            (s, Some(uid::SCALE), None),
            scaled,
            None,
        )?;
        let shifted = g.inner(scores, f32_)?;
        g.pointwise(
            Pw::CUDNN_POINTWISE_SUB,
            f32_,
            (scaled, Some(uid::STATS), None),
            shifted,
            None,
        )?;
        let x = self.masked(&mut g, shifted)?;
        let p = g.inner(scores, f32_)?;
        g.pointwise(Pw::CUDNN_POINTWISE_EXP, f32_, (x, None, None), p, None)?;

        // dv = pᵀ dout
        let t_dims = [self.b, self.h, self.s, self.l];
        let t_strides = [self.h * self.l * self.s, self.l * self.s, 1, self.s];
        let pt = g.inner_strided(t_dims, t_strides, data)?;
        g.reshape(p, pt)?;
        g.matmul(pt, uid::DO, uid::DV)?;

        // ds = p · (dout vᵀ - Σ dout · out) · scale
        let dp = g.inner(scores, f32_)?;
        g.matmul(uid::DO, uid::V, dp)?;
        let centred = g.inner(scores, f32_)?;
        g.pointwise(
            Pw::CUDNN_POINTWISE_SUB,
            f32_,
            (dp, Some(uid::DOT), None),
            centred,
            None,
        )?;
        let weighted = g.inner(scores, f32_)?;
        g.pointwise(
            Pw::CUDNN_POINTWISE_MUL,
            f32_,
            (centred, Some(p), None),
            weighted,
            None,
        )?;
        let ds = g.inner(scores, f32_)?;
        g.pointwise(
            Pw::CUDNN_POINTWISE_MUL,
            f32_,
            (weighted, Some(uid::SCALE), None),
            ds,
            None,
        )?;

        // dk = dsᵀ q
        let dst = g.inner_strided(t_dims, t_strides, data)?;
        g.reshape(ds, dst)?;
        g.matmul(dst, uid::Q, uid::DK)?;

        // dq = ds k, accumulated in float32, then cast
        let k32 = g.inner_strided(self.dims(self.s), Self::strided(self.k), f32_)?;
        g.reshape(uid::K, k32)?;
        g.matmul(ds, k32, uid::DQ_ACC)?;
        g.pointwise(
            Pw::CUDNN_POINTWISE_IDENTITY,
            f32_,
            (uid::DQ_ACC, None, None),
            uid::DQ,
            None,
        )?;
        g.finish(handle)
    }
}

#[derive(Clone, Copy)]
/// One attention pass to queue: its geometry (the backward's has
/// [`SdpaGeom::grads`]), the operands' and results' device addresses (each at
/// its view's start), the scale, and the workspace.
pub(crate) struct SdpaCall {
    pub geom: SdpaGeom,
    pub q: u64,
    pub k: u64,
    pub v: u64,
    /// the forward's result, the backward's operand
    pub o: u64,
    /// each query row's log-sum-exp (`[batch · heads, l]` float32)
    pub stats: u64,
    /// the backward's: the output's gradient, then where dq, dk and dv go
    pub grads: [u64; 4],
    pub scale: f32,
    pub workspace: u64,
    pub workspace_bytes: usize,
    /// the backward's: the workspace's `Σ dout · out` and dq-accumulator bytes,
    /// before the plan's part
    pub parts: (usize, usize),
}

impl SdpaCall {
    /// The workspace bytes left for the plan.
    pub fn plan_budget(&self) -> usize {
        self.workspace_bytes
            .saturating_sub(self.parts.0 + self.parts.1)
    }

    /// Each tensor's address by id for an execution (host addresses for the
    /// by-value scalars in `scalars`: scale, the masked score, one).
    pub fn addresses(&self, scalars: &[f32; 3]) -> Vec<(i64, *mut std::ffi::c_void)> {
        let dev = |p: u64| p as usize as *mut std::ffi::c_void;
        let host = |i: usize| (&scalars[i] as *const f32).cast_mut().cast();
        let mut a = vec![
            (uid::Q, dev(self.q)),
            (uid::K, dev(self.k)),
            (uid::V, dev(self.v)),
            (uid::O, dev(self.o)),
            (uid::STATS, dev(self.stats)),
            (uid::SCALE, host(0)),
            (uid::NEG_INF, host(1)),
        ];
        if self.geom.grads.is_some() {
            let [go, dq, dk, dv] = self.grads;
            let ws = self.workspace;
            a.extend([
                (uid::DO, dev(go)),
                (uid::DQ, dev(dq)),
                (uid::DK, dev(dk)),
                (uid::DV, dev(dv)),
                (uid::DOT, dev(ws)),
                (uid::DQ_ACC, dev(ws + self.parts.0 as u64)),
                (uid::ONE, host(2)),
            ]);
        }
        a
    }

    /// Where the plan's own workspace starts.
    pub fn plan_workspace(&self) -> u64 {
        self.workspace + (self.parts.0 + self.parts.1) as u64
    }
}

/// An attention plan with the graph and engine configuration it was built from.
pub(super) struct SdpaPlan {
    plan: Plan,
    _made_of: (OpGraph, Config),
}

/// The first of cuDNN's engines for `g` whose plan builds on `h` and needs at
/// most `budget` bytes of workspace.
fn sdpa_plan(g: &SdpaGeom, h: sys::cudnnHandle_t, budget: usize) -> Result<SdpaPlan> {
    let graph = if g.grads.is_some() {
        g.backward(Some(h))?
    } else {
        g.forward(Some(h))?
    };
    let target = Target::Handle(h);
    let mut why = Vec::new();
    for config in graph.configs(&target)? {
        let bytes = config.workspace()?;
        if bytes > budget {
            why.push(format!(
                "an engine needs {bytes} bytes of workspace, {budget} are set aside"
            ));
            continue;
        }
        match graph.plan(&config, &target) {
            Ok(plan) if plan.workspace <= budget => {
                return Ok(SdpaPlan {
                    plan,
                    _made_of: (graph, config),
                })
            }
            Ok(plan) => why.push(format!(
                "a plan needs {} bytes of workspace, {budget} are set aside",
                plan.workspace
            )),
            Err(e) => why.push(e.to_string()),
        }
    }
    Err(Error::Cuda {
        op: "cuDNN attention",
        msg: if why.is_empty() {
            "cuDNN proposes no engine for this attention".into()
        } else {
            why.join("; ")
        },
    })
}

impl super::Cudnn {
    /// Queues attention pass `c` with the plan built for its geometry before, or
    /// builds one (once: a geometry cuDNN has no engine for is refused at once
    /// later).
    ///
    /// # Safety
    /// `c`'s addresses hold its geometry's operands and results, its workspace
    /// `c.workspace_bytes` bytes; `stream` is the device's, its context current.
    pub(crate) unsafe fn sdpa(&self, stream: CUstream, c: &SdpaCall) -> Result<()> {
        let version = *library()
            .as_ref()
            .map_err(|reason| Error::CudaUnavailable {
                reason: format!("cuDNN: {reason}"),
            })?;
        let mut guard = self.handle(stream)?;
        let state = guard.as_mut().expect("created by handle()");
        let h = state.handle;
        // a plan is built (kernels compiled and loaded) outside a CUDA graph
        // capture only: a geometry first seen while capturing runs ember's kernels
        // this time, and nothing is remembered
        if !state.sdpa.contains_key(&c.geom) && capturing(stream) {
            return Err(Error::Cuda {
                op: "cuDNN attention",
                msg: "no plan for this shape yet, and none is built while a CUDA graph \
                      is captured"
                    .into(),
            });
        }
        let entry = state.sdpa.entry(c.geom).or_insert_with(|| {
            let built = sdpa_plan(&c.geom, h, c.plan_budget()).map_err(|e| e.to_string());
            if log_choices() {
                match &built {
                    Ok(b) => eprintln!(
                        "ember: cuDNN attention for {:?}: a plan with {} bytes of workspace",
                        c.geom, b.plan.workspace
                    ),
                    Err(why) => eprintln!(
                        "ember: cuDNN attention for {:?}: none ({why}); ember's kernels instead",
                        c.geom
                    ),
                }
            }
            built
        });
        let built = entry.as_ref().map_err(|msg| Error::Cuda {
            op: "cuDNN attention",
            msg: msg.clone(),
        })?;
        // cuDNN before 9.6 left dq's float32 accumulator for its caller to zero
        if c.geom.grads.is_some() && version < 90600 {
            use cudarc::driver::sys as cu;
            let acc = c.workspace + c.parts.0 as u64;
            // SAFETY: the accumulator's bytes lie in the call's workspace.
            let r = unsafe { cu::cuMemsetD8Async(acc, 0, c.parts.1, stream) };
            if r != cu::CUresult::CUDA_SUCCESS {
                return Err(Error::Cuda {
                    op: "cuMemsetD8Async",
                    msg: format!("{r:?}"),
                });
            }
        }
        // a masked score: -inf, or the lowest float for cuDNN before 9.10
        let masked = if version >= 91000 {
            f32::NEG_INFINITY
        } else {
            f32::MIN
        };
        let scalars = [c.scale, masked, 1.0];
        let data = c.addresses(&scalars);
        // SAFETY: as the caller promises; the scalars outlive the call.
        unsafe {
            built
                .plan
                .execute(h, &data, c.plan_workspace() as usize as *mut c_void)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::graph::{DeviceModel, Target};
    use super::*;

    /// GPT-2 small's attention (8 × 12 heads × 1024 rows × 64), q, k and v read
    /// from the `[batch, rows, 3, heads, d]` projection, the output and the
    /// gradients with the heads inside the rows.
    fn gpt2(dtype: DType, causal: bool, d: i64, backward: bool) -> SdpaGeom {
        let (b, h, l) = (8, 12, 1024);
        let packed = [l * 3 * h * d, d, 3 * h * d];
        let rows = [l * h * d, d, h * d];
        SdpaGeom {
            dtype,
            b,
            h,
            l,
            s: l,
            d,
            q: packed,
            k: packed,
            v: packed,
            o: rows,
            causal,
            grads: backward.then_some([rows, packed, packed, packed]),
        }
    }

    /// Where cuDNN, NVRTC and a CUDA driver library load (no GPU needed: an H200
    /// described by its properties),
    /// its heuristics propose engines for ember's forward and backward graphs,
    /// with and without the causal mask, in both half types, and for head dims
    /// 64 and 128 and different query and key lengths: cuDNN recognises them as
    /// fused attention. (Whether the engines' results are right is checked on a
    /// GPU, in tests/cudnn.rs.)
    #[test]
    fn cudnn_proposes_engines_for_the_attention_graphs() {
        let Some(h200) =
            DeviceModel::offline_h200("cudnn_proposes_engines_for_the_attention_graphs")
        else {
            return;
        };
        // cuDNN's attention engines are compiled at run time: its heuristics
        // propose them only where NVRTC and a CUDA driver library load (a GPU
        // need not be there)
        use crate::backend::cuda::libs::{ensure, CudaLib};
        if let Some(why) = [CudaLib::Driver, CudaLib::Nvrtc]
            .into_iter()
            .find_map(|lib| ensure(lib).err())
        {
            eprintln!("skipped cudnn_proposes_engines_for_the_attention_graphs: {why}");
            return;
        }

        let target = Target::Model(&h200);
        let mut cases = vec![];
        for dtype in [DType::BF16, DType::F16] {
            for causal in [true, false] {
                for backward in [false, true] {
                    cases.push(gpt2(dtype, causal, 64, backward));
                }
            }
        }
        for backward in [false, true] {
            cases.push(gpt2(DType::BF16, true, 128, backward));
            // 300 queries against 700 keys, each operand apart and dense
            let (l, s, d) = (300, 700, 64);
            let q = [4 * l * d, l * d, d];
            let kv = [4 * s * d, s * d, d];
            for causal in [false, true] {
                cases.push(SdpaGeom {
                    dtype: DType::BF16,
                    b: 2,
                    h: 4,
                    l,
                    s,
                    d,
                    q,
                    k: kv,
                    v: kv,
                    o: q,
                    causal,
                    grads: backward.then_some([q, q, kv, kv]),
                });
            }
        }
        for g in &cases {
            let graph = if g.grads.is_some() {
                g.backward(None)
            } else {
                g.forward(None)
            };
            let graph = graph.unwrap_or_else(|e| panic!("{g:?}: {e}"));
            let configs = graph.configs(&target).unwrap();
            assert!(!configs.is_empty(), "cuDNN proposes no engine for {g:?}");
            let first = configs[0].workspace().unwrap();
            eprintln!(
                "{} engine(s), the first's workspace {first} bytes, for {:?} causal {} {}",
                configs.len(),
                g.dtype,
                g.causal,
                if g.grads.is_some() {
                    "backward"
                } else {
                    "forward"
                }
            );
        }
    }

    /// An execution's addresses: each operand and result at its id, the host
    /// scalars at theirs, and the backward's workspace split as the graph reads
    /// it (`Σ dout · out` first, dq's accumulator after it, the plan's last).
    #[test]
    fn an_execution_gets_each_address_at_its_id() {
        let g = gpt2(DType::BF16, true, 64, true);
        let call = SdpaCall {
            geom: g,
            q: 0x1000,
            k: 0x2000,
            v: 0x3000,
            o: 0x4000,
            stats: 0x5000,
            grads: [0x6000, 0x7000, 0x8000, 0x9000],
            scale: 0.125,
            workspace: 0x10_0000,
            workspace_bytes: 0x1000 + 2 * 0x4000,
            parts: (0x1000, 0x4000),
        };
        let scalars = [0.125f32, f32::NEG_INFINITY, 1.0];
        let at: std::collections::HashMap<i64, usize> = call
            .addresses(&scalars)
            .into_iter()
            .map(|(id, p)| (id, p as usize))
            .collect();
        let host = |i: usize| &scalars[i] as *const f32 as usize;
        let want = [
            (uid::Q, 0x1000),
            (uid::K, 0x2000),
            (uid::V, 0x3000),
            (uid::O, 0x4000),
            (uid::STATS, 0x5000),
            (uid::DO, 0x6000),
            (uid::DQ, 0x7000),
            (uid::DK, 0x8000),
            (uid::DV, 0x9000),
            (uid::DOT, 0x10_0000),
            (uid::DQ_ACC, 0x10_1000),
            (uid::SCALE, host(0)),
            (uid::NEG_INF, host(1)),
            (uid::ONE, host(2)),
        ];
        assert_eq!(at.len(), want.len());
        for (id, addr) in want {
            assert_eq!(at[&id], addr, "tensor {id}");
        }
        assert_eq!(call.plan_workspace(), 0x10_5000);
        assert_eq!(call.plan_budget(), 0x4000);
        // the forward's: no gradients or workspace parts
        let fwd = SdpaCall {
            geom: gpt2(DType::BF16, true, 64, false),
            parts: (0, 0),
            ..call
        };
        let ids: Vec<i64> = fwd
            .addresses(&scalars)
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        assert_eq!(
            ids,
            [
                uid::Q,
                uid::K,
                uid::V,
                uid::O,
                uid::STATS,
                uid::SCALE,
                uid::NEG_INF
            ]
        );
        assert_eq!(fwd.plan_workspace(), 0x10_0000);
    }
}
