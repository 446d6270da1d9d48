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
//! float32, then (keys not a multiple of 128) the padding mask's lengths, then
//! the plan's own.
//!
//! `graphs.rs` writes the graphs (`SdpaGeom`); this file builds and runs their
//! plans.

use super::graph::{Config, OpGraph, Plan, Target};
use super::{capturing, loaded, log_choices};
use crate::backend::op::AttnLibraryParts;
use crate::error::{Error, Result};
use cudarc::driver::sys::CUstream;
use std::ffi::c_void;

mod graphs;
#[cfg(test)]
mod tests;

pub(crate) use graphs::SdpaGeom;

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
    pub const SEQ_Q: i64 = 15;
    pub const SEQ_KV: i64 = 16;
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
    /// the backward's: the workspace's parts before the plan's
    pub parts: AttnLibraryParts,
}

/// A stretch of device memory a pass needs set before it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fill {
    /// `count` bytes of `value` from `at`
    Bytes { at: u64, value: u8, count: usize },
    /// `count` 32-bit words of `value` from `at` (4-byte aligned)
    Words { at: u64, value: u32, count: usize },
}

impl SdpaCall {
    /// The workspace bytes left for the plan.
    pub fn plan_budget(&self) -> usize {
        self.workspace_bytes.saturating_sub(self.parts.total())
    }

    /// Each tensor's address by id for an execution with cuDNN `version` (host
    /// addresses for the by-value scalars in `scalars`: scale, the masked
    /// score, one).
    pub fn addresses(
        &self,
        scalars: &[f32; 3],
        version: usize,
    ) -> Vec<(i64, *mut std::ffi::c_void)> {
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
                (uid::DQ_ACC, dev(ws + self.parts.dot as u64)),
                (uid::ONE, host(2)),
            ]);
            if self.geom.padding_mask(version) {
                let (q, kv) = self.lens();
                a.extend([(uid::SEQ_Q, dev(q)), (uid::SEQ_KV, dev(kv))]);
            }
        }
        a
    }

    /// Where the plan's own workspace starts.
    pub fn plan_workspace(&self) -> u64 {
        self.workspace + self.parts.total() as u64
    }

    /// Where the backward's sequence lengths lie: `SEQ_Q`, then `SEQ_KV` on the
    /// next 16 bytes (one int32 a batch each; [`AttnLibraryParts::lens`]).
    pub fn lens(&self) -> (u64, u64) {
        let q = self.workspace + (self.parts.dot + self.parts.acc) as u64;
        let (keys, _) = AttnLibraryParts::lens_layout(self.geom.b as usize);
        (q, q + keys as u64)
    }

    /// What the workspace needs written before cuDNN `version` runs this pass:
    /// dq's accumulator zeroed (cuDNN before 9.6 leaves that to its caller),
    /// and the padding mask's lengths (every sequence whole:
    /// [`SdpaGeom::padding_mask`]). Refuses a workspace without room for its
    /// parts.
    pub fn fills(&self, version: usize) -> Result<Vec<Fill>> {
        let g = &self.geom;
        let p = &self.parts;
        let b = g.b as usize;
        let (_, lens_bytes) = AttnLibraryParts::lens_layout(b);
        if self.workspace_bytes < p.total() || (g.padding_mask(version) && p.lens < lens_bytes) {
            return Err(Error::Cuda {
                op: "cuDNN attention",
                msg: format!(
                    "a workspace of {} bytes has no room for its parts {p:?}",
                    self.workspace_bytes
                ),
            });
        }
        let mut fills = Vec::new();
        if g.grads.is_some() && version < 90600 {
            fills.push(Fill::Bytes {
                at: self.workspace + p.dot as u64,
                value: 0,
                count: p.acc,
            });
        }
        if g.padding_mask(version) {
            let (q, kv) = self.lens();
            for (at, len) in [(q, g.l), (kv, g.s)] {
                fills.push(Fill::Words {
                    at,
                    value: len as u32,
                    count: b,
                });
            }
        }
        Ok(fills)
    }
}

/// An attention plan with the graph and engine configuration it was built from.
pub(super) struct SdpaPlan {
    plan: Plan,
    _made_of: (OpGraph, Config),
}

/// The first of cuDNN's engines for `g` whose plan builds for `target` and
/// needs at most `budget` bytes of workspace. (Each geometry compiles its
/// engine's kernel anew: cuDNN's kernel cache takes dynamic-shape graphs only,
/// and its attention engines build none, 9.14 and 9.26 alike.)
fn sdpa_plan(g: &SdpaGeom, target: &Target<'_>, budget: usize) -> Result<SdpaPlan> {
    let graph = if g.grads.is_some() {
        g.backward(target.handle())?
    } else {
        g.forward(target.handle())?
    };
    let mut why = Vec::new();
    for config in graph.configs(target)? {
        let bytes = config.workspace()?;
        if bytes > budget {
            why.push(format!(
                "an engine needs {bytes} bytes of workspace, {budget} are set aside"
            ));
            continue;
        }
        match graph.plan(&config, target) {
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
        let version = loaded()?;
        // (checked before a plan is built for it)
        let fills = c.fills(version)?;
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
            let built =
                sdpa_plan(&c.geom, &Target::Handle(h), c.plan_budget()).map_err(|e| e.to_string());
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
        for fill in fills {
            use cudarc::driver::sys as cu;
            // SAFETY: `fills` placed each within the call's workspace.
            let (op, r) = unsafe {
                match fill {
                    Fill::Bytes { at, value, count } => (
                        "cuMemsetD8Async",
                        cu::cuMemsetD8Async(at, value, count, stream),
                    ),
                    Fill::Words { at, value, count } => (
                        "cuMemsetD32Async",
                        cu::cuMemsetD32Async(at, value, count, stream),
                    ),
                }
            };
            if r != cu::CUresult::CUDA_SUCCESS {
                return Err(Error::Cuda {
                    op,
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
        let data = c.addresses(&scalars, version);
        // SAFETY: as the caller promises; the scalars outlive the call.
        unsafe {
            built
                .plan
                .execute(h, &data, c.plan_workspace() as usize as *mut c_void)
        }
    }
}
