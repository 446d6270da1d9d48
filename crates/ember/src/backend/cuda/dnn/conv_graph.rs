//! Convolutions through cuDNN's graph API ([`set_graph_api`](super::set_graph_api),
//! off by default): each pass one convolution node whose execution plan is built
//! once per shape, dtype, layout, math, workspace and the settings that choose
//! it, as PyTorch runs its cuDNN convolutions; a call then costs one variant pack
//! and `cudnnBackendExecute`. The engine is the first of cuDNN's heuristic
//! choices (mode A, then its fallback list) that fits the pass's workspace and
//! builds, or with
//! [`set_benchmark`](super::set_benchmark) the fastest of those that do, timed on
//! the call's own arrays. An engine's numerical notes keep TF32 out of float32
//! convolutions where it is not allowed, lower-precision inputs out always, and
//! nondeterministic engines out with [`set_deterministic`](super::set_deterministic).
//! The workspace is the legacy path's ([`ConvShape::library_workspace`]), so
//! `ember estimate` is the same either way.
//!
//! [`ConvShape::library_workspace`]: crate::backend::op::ConvShape::library_workspace

use super::graph::{
    note, Config, ConvNode, ConvSpec, Dt, Graph, OpGraph, Plan, Target, TensorSpec,
};
use super::{benchmark, capturing, deterministic, log_choices, ChoiceKey, Dnn};
use crate::backend::cuda::calls::{ConvCall, ConvGeom, ConvPass};
use crate::dtype::DType;
use crate::error::{Error, Result};
use cudarc::cudnn::sys;
use cudarc::driver::sys::CUstream;
use std::ffi::c_void;

/// The ids of the three tensors.
const X: i64 = 1;
const W: i64 = 2;
const Y: i64 = 3;

fn data_type(dtype: DType) -> Result<Dt> {
    Ok(match dtype {
        DType::F32 => Dt::CUDNN_DATA_FLOAT,
        DType::F64 => Dt::CUDNN_DATA_DOUBLE,
        DType::F16 => Dt::CUDNN_DATA_HALF,
        DType::BF16 => Dt::CUDNN_DATA_BFLOAT16,
        dt => {
            return Err(Error::dtype(
                "conv2d",
                dt,
                "ember's cuDNN path takes float16, bfloat16, float32 or float64",
            ))
        }
    })
}

/// `[n, c, h, w]`-like dims and their strides: row-major, or with the channels
/// innermost (NHWC; KRSC for a filter).
fn tensor(d: [i32; 4], nhwc: bool, dt: Dt) -> TensorSpec {
    let [_, c, h, w] = d.map(i64::from);
    let strides = if nhwc {
        [h * w * c, 1, w * c, c]
    } else {
        [c * h * w, h * w, w, 1]
    };
    TensorSpec::real(d.map(i64::from), strides, dt)
}

/// The operation graph of `pass` over `g`.
pub(super) fn graph(
    g: &ConvGeom,
    pass: ConvPass,
    handle: Option<sys::cudnnHandle_t>,
) -> Result<OpGraph> {
    let dt = data_type(g.dtype)?;
    let mut graph = Graph::new(10);
    graph.tensor(X, tensor(g.x, g.nhwc, dt))?;
    graph.tensor(W, tensor(g.w, g.nhwc, dt))?;
    graph.tensor(Y, tensor(g.y, g.nhwc, dt))?;
    let spec = ConvSpec {
        comp: if g.dtype == DType::F64 {
            Dt::CUDNN_DATA_DOUBLE
        } else {
            Dt::CUDNN_DATA_FLOAT
        },
        pad: g.pad.map(i64::from),
        stride: g.stride.map(i64::from),
        dilation: g.dilation.map(i64::from),
    };
    let node = match pass {
        ConvPass::Forward => ConvNode::Forward,
        ConvPass::BackwardData => ConvNode::BackwardData,
        ConvPass::BackwardFilter => ConvNode::BackwardFilter,
    };
    graph.convolution(node, [X, W, Y], &spec)?;
    graph.finish(handle)
}

/// Whether an engine with numerical `notes` may run a convolution of `dtype`:
/// no inputs converted to a lower precision; for float32 no tensor cores (TF32)
/// unless `tf32`; nothing nondeterministic where `deterministic`.
pub(super) fn allowed(notes: &[u32], dtype: DType, tf32: bool, deterministic: bool) -> bool {
    let has = |n| notes.contains(&n);
    let refused = has(note::DOWN_CONVERT_INPUTS)
        || (dtype == DType::F32 && !tf32 && has(note::TENSOR_CORE))
        || (deterministic && has(note::NONDETERMINISTIC));
    !refused
}

/// One candidate: a plan, the engine configuration it was built from, and the
/// engine's index (for the log).
pub(super) struct Candidate {
    pub plan: Plan,
    pub engine: i64,
    _config: Config,
}

/// A pass's chosen plan, with the graph it was built for.
pub(super) struct ConvPlan {
    pub chosen: Candidate,
    pub timed: bool,
    _graph: OpGraph,
}

impl ConvPlan {
    /// The `i`th of `candidates` (their graph `graph`), the rest dropped.
    pub fn pick(graph: OpGraph, mut candidates: Vec<Candidate>, i: usize, timed: bool) -> ConvPlan {
        ConvPlan {
            chosen: candidates.swap_remove(i),
            timed,
            _graph: graph,
        }
    }
}

/// The graph of `c` and the plans cuDNN's heuristics propose for it that its
/// settings allow and its workspace fits, in their order: the first that
/// builds, or with `all` every one that does (at most 16).
pub(super) fn plans(
    c: &ConvCall,
    target: &Target<'_>,
    (deterministic, all): (bool, bool),
) -> Result<(OpGraph, Vec<Candidate>)> {
    let mut out = Vec::new();
    let mut why = Vec::new();
    let graph = graph(&c.geom, c.pass, target.handle())?;
    for config in graph.configs_with_fallback(target)? {
        // (a configuration cuDNN cannot describe is skipped, not the pass)
        let (notes, engine) = match config.engine() {
            Ok(e) => e,
            Err(e) => {
                why.push(e.to_string());
                continue;
            }
        };
        if !allowed(&notes, c.geom.dtype, c.tf32, deterministic) {
            continue;
        }
        // (cuDNN before 9.2 reports no configuration's workspace: the plan's says)
        let bytes = config.workspace().unwrap_or(0);
        if bytes > c.workspace_bytes {
            why.push(format!(
                "engine {engine} needs {bytes} bytes of workspace, the pass has {}",
                c.workspace_bytes
            ));
            continue;
        }
        match graph.plan(&config, target) {
            Ok(plan) if plan.workspace > c.workspace_bytes => why.push(format!(
                "engine {engine}'s plan needs {} bytes of workspace, the pass has {}",
                plan.workspace, c.workspace_bytes
            )),
            Ok(plan) => {
                out.push(Candidate {
                    plan,
                    engine,
                    _config: config,
                });
                if !all || out.len() == 16 {
                    break;
                }
            }
            Err(e) => why.push(format!("engine {engine}: {e}")),
        }
    }
    if out.is_empty() {
        return Err(Error::Cuda {
            op: "cuDNN graph convolution",
            msg: format!(
                "no engine of cuDNN's for {:?} of {:?} within {} bytes of workspace{}{}",
                c.pass,
                c.geom,
                c.workspace_bytes,
                if why.is_empty() { "" } else { ": " },
                why.join("; ")
            ),
        });
    }
    Ok((graph, out))
}

/// The variant pack's addresses of `c`.
fn addresses(c: &ConvCall) -> [(i64, *mut c_void); 3] {
    let p = |a: u64| a as usize as *mut c_void;
    [(X, p(c.x)), (W, p(c.w)), (Y, p(c.y))]
}

/// Queues `plan` for `c`.
///
/// # Safety
/// As [`super::Cudnn::conv`]; `h` bound to the device's stream.
pub(super) unsafe fn run(h: sys::cudnnHandle_t, plan: &Plan, c: &ConvCall) -> Result<()> {
    // SAFETY: as the caller promises.
    unsafe { plan.execute(h, &addresses(c), c.workspace as usize as *mut c_void) }
}

/// The index of the fastest of `plans` on `c`'s own arrays (each run once to
/// warm up, then three times between two events; the output is overwritten,
/// and the caller runs the chosen plan after), waiting for the GPU.
///
/// # Safety
/// As [`run`]; `stream` is the one `h` is bound to, and no graph is being
/// captured on it.
pub(super) unsafe fn fastest(
    h: sys::cudnnHandle_t,
    stream: CUstream,
    plans: &[Candidate],
    c: &ConvCall,
) -> Result<usize> {
    use cudarc::driver::sys as cu;
    let check = |op: &'static str, r: cu::CUresult| {
        if r == cu::CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(Error::Cuda {
                op,
                msg: format!("{r:?}"),
            })
        }
    };
    let mut ev = [std::ptr::null_mut(); 2];
    for i in 0..2 {
        // SAFETY: one out-parameter; the context is current.
        let made = check("cuEventCreate", unsafe {
            cu::cuEventCreate(&mut ev[i], cu::CUevent_flags::CU_EVENT_DEFAULT as u32)
        });
        if let Err(e) = made {
            if i == 1 {
                // SAFETY: the first, created above, destroyed once.
                unsafe {
                    let _ = cu::cuEventDestroy_v2(ev[0]);
                }
            }
            return Err(e);
        }
    }
    let mut best: Option<(usize, f32)> = None;
    let result = (|| -> Result<()> {
        for (i, p) in plans.iter().enumerate() {
            // SAFETY: as the caller promises.
            if unsafe { run(h, &p.plan, c) }.is_err() {
                continue;
            }
            // SAFETY: live events of this context, the device's stream.
            unsafe {
                check("cuEventRecord", cu::cuEventRecord(ev[0], stream))?;
                let mut ok = true;
                for _ in 0..3 {
                    ok &= run(h, &p.plan, c).is_ok();
                }
                check("cuEventRecord", cu::cuEventRecord(ev[1], stream))?;
                check("cuEventSynchronize", cu::cuEventSynchronize(ev[1]))?;
                let mut ms = 0f32;
                check(
                    "cuEventElapsedTime",
                    cu::cuEventElapsedTime_v2(&mut ms, ev[0], ev[1]),
                )?;
                if ok && best.is_none_or(|(_, t)| ms < t) {
                    best = Some((i, ms));
                }
            }
        }
        Ok(())
    })();
    for e in ev {
        // SAFETY: created above, destroyed once.
        unsafe {
            let _ = cu::cuEventDestroy_v2(e);
        }
    }
    result?;
    best.map(|(i, _)| i).ok_or_else(|| Error::Cuda {
        op: "cuDNN graph convolution",
        msg: format!(
            "none of cuDNN's {} plans ran for {:?} of {:?}",
            plans.len(),
            c.pass,
            c.geom
        ),
    })
}

/// Runs `c` through the graph API with the plan built for its key before, or
/// builds one (heuristic, or timed where [`benchmark`] and not capturing); a
/// key with no plan is refused at once later. Nothing is built while a CUDA
/// graph is captured.
///
/// # Safety
/// As [`Cudnn::conv`]; `state`'s handle bound to `stream`.
pub(super) unsafe fn graph_conv(state: &mut Dnn, stream: CUstream, c: &ConvCall) -> Result<()> {
    let h = state.handle;
    let deterministic = deterministic();
    let key = |timed: bool| ChoiceKey {
        geom: c.geom,
        pass: c.pass,
        tf32: c.tf32,
        timed,
        deterministic,
        workspace_bytes: c.workspace_bytes,
    };
    // cuDNN's engines read 16-byte vectors: a view that starts elsewhere takes
    // the legacy calls (nothing remembered: the same shape may be aligned next)
    if [c.x, c.w, c.y, c.workspace].iter().any(|p| p % 16 != 0) {
        return Err(Error::Cuda {
            op: "cuDNN graph convolution",
            msg: "an operand does not start on 16 bytes".into(),
        });
    }
    let timed = benchmark() && (state.conv_plans.contains_key(&key(true)) || !capturing(stream));
    let key = key(timed);
    if !state.conv_plans.contains_key(&key) && capturing(stream) {
        return Err(Error::Cuda {
            op: "cuDNN graph convolution",
            msg: "no plan for this shape yet, and none is built while a CUDA graph is captured"
                .into(),
        });
    }
    let entry = state.conv_plans.entry(key).or_insert_with(|| {
        let target = Target::Handle(h);
        let built = plans(c, &target, (deterministic, timed)).and_then(|(g, plans)| {
            if !timed {
                return Ok(ConvPlan::pick(g, plans, 0, false));
            }
            // SAFETY: as the caller promises; not capturing (checked above).
            let i = unsafe { fastest(h, stream, &plans, c) }?;
            Ok(ConvPlan::pick(g, plans, i, true))
        });
        if log_choices() {
            match &built {
                Ok(p) => eprintln!(
                    "ember: cuDNN graph {:?} of {:?}: engine {}, workspace {} of {} bytes{}",
                    c.pass,
                    c.geom,
                    p.chosen.engine,
                    p.chosen.plan.workspace,
                    c.workspace_bytes,
                    if p.timed { " (timed)" } else { "" }
                ),
                Err(e) => eprintln!("ember: cuDNN graph {:?} of {:?}: {e}", c.pass, c.geom),
            }
        }
        built.map_err(|e| e.to_string())
    });
    let p = entry.as_ref().map_err(|msg| Error::Cuda {
        op: "cuDNN graph convolution",
        msg: msg.clone(),
    })?;
    // SAFETY: as the caller promises.
    unsafe { run(h, &p.chosen.plan, c) }.inspect_err(|e| {
        if log_choices() {
            eprintln!(
                "ember: cuDNN graph {:?} of {:?} failed ({e}); the legacy calls instead",
                c.pass, c.geom
            );
        }
    })
}

#[cfg(test)]
mod tests {
    use super::super::graph::DeviceModel;
    use super::*;
    use crate::backend::op::{ConvShape, Window};

    fn call(dtype: DType, nhwc: bool, pass: ConvPass, s: ConvShape) -> ConvCall {
        ConvCall {
            geom: ConvGeom::new(dtype, &ConvShape { nhwc, ..s }).expect("a cuDNN geometry"),
            pass,
            x: 0,
            w: 0,
            y: 0,
            workspace: 0,
            workspace_bytes: 512 << 20,
            tf32: true,
        }
    }

    fn shape(
        n: usize,
        c: usize,
        hw: usize,
        o: usize,
        k: usize,
        stride: usize,
        groups: usize,
    ) -> ConvShape {
        let win = Window {
            kernel: (k, k),
            stride: (stride, stride),
            padding: (k / 2, k / 2),
            dilation: (1, 1),
        };
        let out = Window::out_size(hw, k, stride, k / 2, 1, false).unwrap();
        ConvShape {
            n,
            c,
            h: hw,
            w: hw,
            o,
            groups,
            oh: out,
            ow: out,
            win,
            nhwc: false,
        }
    }

    #[test]
    fn the_notes_keep_tf32_lower_precision_and_nondeterminism_out() {
        use note::*;
        assert!(allowed(&[TENSOR_CORE], DType::F32, true, false));
        assert!(!allowed(&[TENSOR_CORE], DType::F32, false, false));
        assert!(allowed(&[TENSOR_CORE], DType::BF16, false, false));
        assert!(!allowed(&[DOWN_CONVERT_INPUTS], DType::F32, true, false));
        assert!(allowed(&[NONDETERMINISTIC], DType::F32, true, false));
        assert!(!allowed(&[NONDETERMINISTIC], DType::F16, true, true));
        assert!(allowed(&[], DType::F64, false, true));
    }

    /// Where cuDNN loads (no GPU needed: an H200 described by its properties),
    /// its heuristics propose engines for each pass of ResNet-50's convolutions
    /// (3x3, 1x1, strided, the 7x7 stem, grouped) in the half types and float32,
    /// both layouts, some of them allowed by the TF32 and determinism rules, and
    /// plans build for them (cuDNN's precompiled engines build without a GPU).
    /// Float64 convolutions are tried too, without asserting: cuDNN 9.26's graph
    /// API has no engine for some (a strided 1x1's forward), and those passes
    /// take the legacy calls. `bench/cudnn-offline` logs the graphs and checks
    /// 18 of them (each pass of each shape) against those cuDNN's frontend builds
    /// (`tests/golden/cudnn/graphs.json`).
    #[test]
    fn cudnn_builds_plans_for_the_convolution_graphs() {
        let Some(h200) = DeviceModel::offline_h200("cudnn_builds_plans_for_the_convolution_graphs")
        else {
            return;
        };

        let target = Target::Model(&h200);
        let shapes = [
            shape(64, 64, 56, 64, 3, 1, 1),
            shape(64, 256, 56, 64, 1, 1, 1),
            shape(64, 256, 56, 512, 1, 2, 1),
            shape(64, 3, 224, 64, 7, 2, 1),
            shape(8, 64, 14, 64, 3, 1, 4),
        ];
        for s in &shapes {
            for (dtype, nhwc) in [
                (DType::BF16, true),
                (DType::BF16, false),
                (DType::F16, true),
                (DType::F16, false),
                (DType::F32, false),
                (DType::F32, true),
                (DType::F64, false),
            ] {
                for pass in [
                    ConvPass::Forward,
                    ConvPass::BackwardData,
                    ConvPass::BackwardFilter,
                ] {
                    for (tf32, deterministic) in [(true, false), (false, true)] {
                        let c = ConvCall {
                            tf32,
                            ..call(dtype, nhwc, pass, *s)
                        };
                        let built = plans(&c, &target, (deterministic, false));
                        if dtype == DType::F64 {
                            if let Err(e) = built {
                                eprintln!("(float64, legacy calls instead) {e}");
                            }
                            continue;
                        }
                        let (_graph, p) = built.unwrap_or_else(|e| panic!("{e}"));
                        assert!(
                            p[0].plan.workspace <= c.workspace_bytes,
                            "{:?} {pass:?}",
                            c.geom
                        );
                    }
                }
            }
        }
    }
}
