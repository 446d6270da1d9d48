use super::super::graph::{offline_skip, DeviceModel, Target};
use super::*;
use crate::backend::op::{attn_library_parts, attn_library_workspace, AttnPacking, AttnShape};
use crate::dtype::DType;

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

/// The geometries of `tests/golden/cudnn/cases.json` (named), the ones
/// `gen_graphs.py` there gives cuDNN's own frontend.
fn golden_cases() -> Vec<(String, SdpaGeom)> {
    let text = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/golden/cudnn/cases.json"
    ));
    let j: serde_json::Value = serde_json::from_str(text).unwrap();
    let int = |v: &serde_json::Value| v.as_i64().unwrap();
    let st = |v: &serde_json::Value| -> [i64; 3] {
        let a: Vec<i64> = v.as_array().unwrap().iter().map(int).collect();
        a.try_into().unwrap()
    };
    j["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let geom = SdpaGeom {
                dtype: match c["dtype"].as_str().unwrap() {
                    "bf16" => DType::BF16,
                    "f16" => DType::F16,
                    other => panic!("dtype {other}"),
                },
                b: int(&c["b"]),
                h: int(&c["h"]),
                l: int(&c["l"]),
                s: int(&c["s"]),
                d: int(&c["d"]),
                q: st(&c["q"]),
                k: st(&c["k"]),
                v: st(&c["v"]),
                o: st(&c["o"]),
                causal: c["causal"].as_bool().unwrap(),
                grads: c["grads"].as_array().map(|g| {
                    let g: Vec<[i64; 3]> = g.iter().map(st).collect();
                    g.try_into().unwrap()
                }),
            };
            (c["name"].as_str().unwrap().to_string(), geom)
        })
        .collect()
}

/// `g` as the tensor layer's attention shape (with what cuDNN's graphs do
/// not take: no dropout, operands apart).
fn shape_of(g: &SdpaGeom) -> AttnShape {
    AttnShape {
        batch: g.b as usize,
        heads: g.h as usize,
        l: g.l as usize,
        s: g.s as usize,
        d: g.d as usize,
        scale: 1.0,
        causal: g.causal,
        dropout: 0.0,
        seed: 0,
        packed: AttnPacking::Apart,
    }
}

/// The workspace bytes ember leaves a plan for `g` (as the CUDA backend
/// sets them aside: backend/cuda/ops/attention.rs).
fn plan_budget(g: &SdpaGeom) -> usize {
    let sh = shape_of(g);
    let backward = g.grads.is_some();
    let parts = if backward {
        attn_library_parts(&sh)
    } else {
        AttnLibraryParts::default()
    };
    attn_library_workspace(&sh, backward) - parts.total()
}

/// A backward pass of `geom` at made-up addresses: operands from 0x1000, the
/// workspace at 0x10_0000 (`parts`, then a plan's part as large as dq's
/// accumulator).
fn call_at(geom: SdpaGeom, parts: AttnLibraryParts) -> SdpaCall {
    SdpaCall {
        geom,
        q: 0x1000,
        k: 0x2000,
        v: 0x3000,
        o: 0x4000,
        stats: 0x5000,
        grads: [0x6000, 0x7000, 0x8000, 0x9000],
        scale: 0.125,
        workspace: 0x10_0000,
        workspace_bytes: parts.total() + parts.acc,
        parts,
    }
}

/// Where cuDNN, NVRTC and a CUDA driver library load (no GPU needed: an H200
/// described by its properties), ember picks an engine and builds its plan
/// (the kernel generated and compiled) for each geometry of
/// `tests/golden/cudnn/cases.json`, forward and backward, with and without
/// the causal mask, in both half types, head dims 64 and 128 and different
/// query and key lengths, within the workspace ember sets aside: cuDNN
/// recognises them as fused attention. `bench/cudnn-offline` runs it with
/// a driver library that loads any module and launches nothing, logs
/// cuDNN's graphs and checks them against those cuDNN's frontend builds.
/// (Whether the results are right is checked on a GPU, in tests/cudnn.rs.)
#[test]
fn cudnn_builds_plans_for_the_attention_graphs() {
    let Some(h200) = DeviceModel::offline_h200("cudnn_builds_plans_for_the_attention_graphs")
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
        offline_skip("cudnn_builds_plans_for_the_attention_graphs", &why);
        return;
    }

    let target = Target::Model(&h200);
    let cases = golden_cases();
    assert_eq!(cases.len(), 16);
    for (name, g) in &cases {
        let budget = plan_budget(g);
        let built = sdpa_plan(g, &target, budget).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(built.plan.workspace <= budget, "{name}");
        let (_notes, engine) = built._made_of.1.engine().unwrap();
        eprintln!(
            "{name}: engine {engine}, {} bytes of workspace (of {budget})",
            built.plan.workspace
        );
    }
}

/// An execution's addresses: each operand and result at its id, the host
/// scalars at theirs, and the backward's workspace split as the graph reads
/// it (`Σ dout · out` first, dq's accumulator after it, the plan's last).
#[test]
fn an_execution_gets_each_address_at_its_id() {
    let g = gpt2(DType::BF16, true, 64, true);
    let call = call_at(
        g,
        AttnLibraryParts {
            dot: 0x1000,
            acc: 0x4000,
            lens: 0,
        },
    );
    assert_eq!(call.workspace_bytes, 0x1000 + 2 * 0x4000);
    let scalars = [0.125f32, f32::NEG_INFINITY, 1.0];
    let at: std::collections::HashMap<i64, usize> = call
        .addresses(&scalars, 91400)
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
        parts: AttnLibraryParts::default(),
        ..call
    };
    let ids: Vec<i64> = fwd
        .addresses(&scalars, 91400)
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
    // keys not a multiple of 128: the padding mask's lengths after dq's
    // accumulator, one int32 a batch each (the plan's part after them)
    let mut g = gpt2(DType::BF16, true, 64, true);
    g.s = 700;
    let padded = SdpaCall {
        geom: g,
        parts: AttnLibraryParts {
            lens: 0x100,
            ..call.parts
        },
        workspace_bytes: call.workspace_bytes + 0x100,
        ..call
    };
    let at: std::collections::HashMap<i64, usize> = padded
        .addresses(&scalars, 91400)
        .into_iter()
        .map(|(id, p)| (id, p as usize))
        .collect();
    assert_eq!(at.len(), want.len() + 2);
    assert_eq!(at[&uid::SEQ_Q], 0x10_5000);
    assert_eq!(at[&uid::SEQ_KV], 0x10_5000 + 4 * 8);
    assert_eq!(padded.plan_workspace(), 0x10_5100);
    assert_eq!(padded.plan_budget(), 0x4000);
    assert!(g.padding_mask(91400) && !g.padding_mask(91600));
    assert!(!gpt2(DType::BF16, true, 64, true).padding_mask(91400));
    assert!(!gpt2(DType::BF16, true, 64, false).padding_mask(91400));
    // cuDNN 9.16 on: no mask, so no lengths bound
    assert_eq!(padded.addresses(&scalars, 91600).len(), want.len());
}

/// What a pass has written into its workspace before it runs: the padding
/// mask's lengths (each batch's query and key counts, the keys' from the next
/// 16 bytes) for cuDNN up to 9.15 where the keys are not a multiple of 128, dq's
/// accumulator zeroed for cuDNN before 9.6; and a workspace without room for
/// its parts refused.
#[test]
fn a_pass_fills_its_workspace_parts() {
    let mut g = gpt2(DType::BF16, true, 64, true);
    (g.b, g.l, g.s) = (3, 300, 700);
    let call = call_at(
        g,
        AttnLibraryParts {
            dot: 0x1000,
            acc: 0x4000,
            lens: 0x100,
        },
    );
    assert_eq!(call.workspace_bytes, 0x1000 + 0x100 + 2 * 0x4000);
    let lens = 0x10_5000;
    let words = |at, value| Fill::Words {
        at,
        value,
        count: 3,
    };
    assert_eq!(
        call.fills(91400).unwrap(),
        [words(lens, 300), words(lens + 16, 700)]
    );
    assert_eq!(call.fills(91600).unwrap(), []);
    let zero_acc = Fill::Bytes {
        at: 0x10_1000,
        value: 0,
        count: 0x4000,
    };
    assert_eq!(
        call.fills(90500).unwrap(),
        [zero_acc, words(lens, 300), words(lens + 16, 700)]
    );
    // keys a multiple of 128, and the forward: nothing to write
    let whole = SdpaCall {
        geom: SdpaGeom { s: 768, ..g },
        ..call
    };
    assert_eq!(whole.fills(91400).unwrap(), []);
    let fwd = SdpaCall {
        geom: SdpaGeom { grads: None, ..g },
        parts: AttnLibraryParts::default(),
        ..call
    };
    assert_eq!(fwd.fills(90500).unwrap(), []);
    // no room for the lengths (one byte short), or for the parts at all
    let short = SdpaCall {
        parts: AttnLibraryParts {
            lens: 4 * (4 + 3) - 1,
            ..call.parts
        },
        ..call
    };
    assert!(short.fills(91400).is_err());
    assert!(short.fills(91600).is_ok());
    let small = SdpaCall {
        workspace_bytes: call.parts.total() - 1,
        ..call
    };
    assert!(small.fills(91600).is_err());
    // the parts ember sets aside (attn_library_parts) hold the lengths for
    // every batch size, the keys' ending within them
    for b in 1..=70 {
        let g = SdpaGeom { b, ..g };
        let sh = shape_of(&g);
        let parts = attn_library_parts(&sh);
        let c = SdpaCall {
            geom: g,
            parts,
            workspace_bytes: attn_library_workspace(&sh, true),
            ..call
        };
        let fills = c.fills(91400).unwrap();
        let Some(Fill::Words { at, count, .. }) = fills.last() else {
            panic!("batch {b}: no lengths written");
        };
        assert_eq!(*count, b as usize);
        assert_eq!(at % 16, 0, "batch {b}");
        assert!(
            *at + 4 * *count as u64 <= c.lens().0 + parts.lens as u64,
            "batch {b}: the keys' lengths end past their part"
        );
    }
}
