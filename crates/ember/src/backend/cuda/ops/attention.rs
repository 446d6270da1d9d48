//! Fused attention on tensor cores (kernels/attention.cu; f16/bf16, and float32
//! by split tf32 products): a forward launch, and
//! three backward launches (each row's `Σ dout · out`, then the keys' and
//! values' gradients, then the queries').

use super::{base_ptr, launch_kernel, new_out, suffix};
use crate::backend::cuda::dnn::{
    log_choices,
    sdpa::{SdpaCall, SdpaGeom},
};
use crate::backend::cuda::{CudaDev, CudaStorage};
use crate::backend::op::{
    attn_arch_refuses, attn_bias_refuses, attn_kernel_refuses, attn_library_parts,
    attn_library_refuses, attn_library_workspace, attn_packed_refuses, stat_dtype, AttnGrads,
    AttnLibraryParts, AttnOperands, AttnPlace, AttnSaved, AttnShape, AttnViews,
};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::Layout;
use std::ffi::c_void;

/// `struct AttnArgs` of kernels/attention.cu: where the operands start, their
/// (batch, head, row) strides in elements, and the call's shape.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct KAttn {
    pub q_off: i64,
    pub k_off: i64,
    pub v_off: i64,
    pub qs: [i64; 3],
    pub ks: [i64; 3],
    pub vs: [i64; 3],
    pub heads: i32,
    pub l: i32,
    pub s: i32,
    pub d: i32,
    pub scale: f32,
    pub causal: i32,
    pub seed: u64,
    pub drop_threshold: u32,
    pub keep_scale: f32,
    pub bias_off: i64,
    pub bias_st: [i64; 4],
    pub os: [i64; 3],
    pub dqs: [i64; 3],
    pub dkvs: [i64; 3],
}

const THREADS: u32 = 128;
/// Query (or key) rows per block.
const BLOCK_ROWS: usize = 64;

/// The shared memory any block may have without opting in to more.
const STATIC_SHARED: usize = 48 << 10;

/// The kernels whose shared tiles may exceed [`STATIC_SHARED`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AttnTiles {
    /// The forward's (`attn_fwd_tiles` of kernels/attention.cu).
    Forward,
    /// dk and dv's (`attn_kv_tiles`).
    KeysValues,
}

/// The bytes of the shared tiles of `kernel` for `dtype` (f16, bf16 or float32)
/// at head dim `dm` (64 or 128): `sizeof` of the kernels' structs, from the
/// same steps (`attn_steps`) and row paddings (`attn_tile`). The tests hold
/// them to the kernels' under NVRTC and the host compiler.
pub(crate) fn attn_tiles_bytes(kernel: AttnTiles, dtype: DType, dm: usize) -> usize {
    let es = dtype.size_in_bytes();
    let half = es == 2;
    // a row along which the tiles are read, and down which (float32's copy)
    let (row, col) = (dm + 8, if half { dm + 8 } else { dm + 4 });
    let bytes = match kernel {
        AttnTiles::Forward => {
            let keys = match (half, dm <= 64) {
                (true, true) | (false, true) => 64,
                (true, false) => 32,
                (false, false) => 16,
            };
            2 * keys * (row + col) * es
        }
        AttnTiles::KeysValues => {
            let queries = match (half, dm <= 64) {
                (true, true) => 64,
                (true, false) | (false, true) => 32,
                (false, false) => 16,
            };
            let stages = if half || dm <= 64 { 2 } else { 1 };
            // f16/bf16 keep no column copies (8 elements stand in for them)
            let cols = if half { 8 } else { queries * col };
            stages * (2 * queries * row + 2 * cols) * es + 2 * stages * queries * 4
        }
    };
    bytes.next_multiple_of(16)
}

/// The dynamic shared memory `kernel`'s launch takes: its tiles where they
/// exceed [`STATIC_SHARED`] (float32's at head dim 64), else none (the kernel
/// declares them as static arrays).
fn dynamic_shared(kernel: AttnTiles, dtype: DType, dm: usize) -> u32 {
    match attn_tiles_bytes(kernel, dtype, dm) {
        b if b > STATIC_SHARED => b as u32,
        _ => 0,
    }
}

fn strides(l: &Layout) -> [i64; 3] {
    let s = l.strides();
    [s[0] as i64, s[1] as i64, s[2] as i64]
}

fn place_strides(p: &AttnPlace) -> [i64; 3] {
    p.strides.map(|s| s as i64)
}

impl KAttn {
    fn new(sh: &AttnShape, q: &Layout, k: &Layout, v: &Layout, bias: Option<&Layout>) -> KAttn {
        let (drop_threshold, keep_scale) = sh.drop_threshold();
        let [dq, dkv, _] = sh.grad_places();
        let (bias_off, bias_st) = match bias {
            Some(b) => {
                let s = b.strides();
                (
                    b.offset() as i64,
                    [s[0] as i64, s[1] as i64, s[2] as i64, s[3] as i64],
                )
            }
            None => (0, [0; 4]),
        };
        KAttn {
            q_off: q.offset() as i64,
            k_off: k.offset() as i64,
            v_off: v.offset() as i64,
            qs: strides(q),
            ks: strides(k),
            vs: strides(v),
            heads: sh.heads as i32,
            l: sh.l as i32,
            s: sh.s as i32,
            d: sh.d as i32,
            scale: sh.scale as f32,
            causal: sh.causal as i32,
            seed: sh.seed,
            drop_threshold,
            keep_scale: keep_scale as f32,
            bias_off,
            bias_st,
            os: place_strides(&sh.out_place()),
            dqs: place_strides(&dq),
            dkvs: place_strides(&dkv),
        }
    }

    /// The same call with `g` (a view like the queries') in the queries' place:
    /// how the backward kernels address the output's gradient.
    fn with_queries(mut self, g: &Layout) -> KAttn {
        self.q_off = g.offset() as i64;
        self.qs = strides(g);
        self
    }
}

/// Checks what the kernels take ([`attn_kernel_refuses`]), that the GPU is
/// sm_80 or later, and that a bias is what they read ([`attn_bias_refuses`]) on
/// the same GPU.
fn check(
    dev: &CudaDev,
    q: &CudaStorage,
    bias: Option<(&CudaStorage, &Layout)>,
    sh: &AttnShape,
) -> Result<()> {
    if let Some((b, l)) = bias {
        let why = attn_bias_refuses(l, b.dtype(), q.dtype(), sh).or_else(|| {
            (!std::sync::Arc::ptr_eq(b.dev(), q.dev()))
                .then(|| "the bias lies on another GPU than the queries".to_string())
        });
        if let Some(msg) = why {
            return Err(Error::invalid("attention", msg));
        }
    }
    let align = (16 / q.dtype().size_in_bytes()).max(1);
    let why = attn_kernel_refuses(q.dtype(), sh)
        .or_else(|| attn_arch_refuses(dev.arch()))
        .or_else(|| attn_packed_refuses(sh, align));
    match why {
        Some(msg) => Err(Error::invalid("attention", msg)),
        None => Ok(()),
    }
}

/// The kernel names' part for a call with or without a bias (the kernels that
/// add one hold more registers).
fn masked(bias: Option<(&CudaStorage, &Layout)>) -> &'static str {
    if bias.is_some() {
        "_masked"
    } else {
        ""
    }
}

/// The head dim of the kernel instance for `d` (64 or 128; [`attn_kernel_refuses`]
/// keeps larger ones away).
fn kernel_dim(d: usize) -> usize {
    if d <= 64 {
        64
    } else {
        128
    }
}

/// Launches `name` with `shared` bytes of dynamic shared memory (opted in to
/// where that is more than a block may have without).
fn launch(
    dev: &CudaDev,
    q: &CudaStorage,
    name: &str,
    (grid, shared): ((u32, u32), u32),
    params: &mut [*mut c_void],
) -> Result<()> {
    if shared as usize > STATIC_SHARED {
        dev.allow_dynamic_shared(("attention", q.dtype(), name), shared)?;
    }
    // the views the parameters address lie within their storages (the tensor
    // layer's layouts)
    launch_kernel(
        dev,
        ("attention", q.dtype(), name),
        (grid.0, grid.1, 1),
        ((THREADS, 1, 1), shared),
        params,
    )
}

/// The geometry of a call that goes to cuDNN's fused attention
/// ([`attn_library_refuses`]: switched on, f16/bf16, no bias or dropout, aligned
/// views), `grads` the output's gradient's layout for the backward's.
fn library_geom(
    q: &CudaStorage,
    [lq, lk, lv]: [&Layout; 3],
    bias: bool,
    sh: &AttnShape,
    grads: Option<&Layout>,
) -> Option<SdpaGeom> {
    // (switched off, the default: nothing more to decide or allocate)
    if !crate::backend::op::library_attention() {
        return None;
    }
    // (the meta device models a GPU with cuDNN or without: Estimator::cudnn)
    if !crate::backend::cuda::cudnn::is_available() {
        log_once(|| {
            let why = crate::backend::cuda::cudnn::unavailable_reason().unwrap_or_default();
            format!("ember: attention not sent to cuDNN: it is not available ({why})")
        });
        return None;
    }
    let views = AttnViews::of(&[&[lq, lk, lv][..], grads.as_slice()].concat());
    if let Some(why) = attn_library_refuses(q.dtype(), sh, &views, bias) {
        log_once(|| format!("ember: attention {sh:?} not sent to cuDNN: {why}"));
        return None;
    }
    let [dq, dk, dv] = sh.grad_places().map(|p| place_strides(&p));
    Some(SdpaGeom {
        dtype: q.dtype(),
        b: sh.batch as i64,
        h: sh.heads as i64,
        l: sh.l as i64,
        s: sh.s as i64,
        d: sh.d as i64,
        q: strides(lq),
        k: strides(lk),
        v: strides(lv),
        o: place_strides(&sh.out_place()),
        causal: sh.causal,
        grads: grads.map(|g| [strides(g), dq, dk, dv]),
    })
}

/// Queues `call` on cuDNN; `false` (with the reason under `EMBER_CUDNN_LOG`)
/// where it refuses, for ember's kernels to run instead.
fn library_ran(dev: &CudaDev, call: &SdpaCall) -> bool {
    // SAFETY: the caller made every address in `call` from live buffers of the
    // geometry's sizes (the tensor layer's layouts place the views within them)
    // and the workspace of `call.workspace_bytes`.
    match unsafe { dev.sdpa(call) } {
        Ok(()) => {
            crate::backend::cuda::cudnn::count_attention_pass();
            true
        }
        Err(e) => {
            log_once(|| {
                format!(
                    "ember: cuDNN attention of {:?} refused ({e}); ember's kernels instead",
                    call.geom
                )
            });
            false
        }
    }
}

/// Prints `line` on stderr where `EMBER_CUDNN_LOG` asks for it, each distinct
/// line once.
fn log_once(line: impl FnOnce() -> String) {
    if !log_choices() {
        return;
    }
    let line = line();
    static SEEN: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    if !seen.contains(&line) {
        eprintln!("{line}");
        seen.push(line);
    }
}

/// Each gradient's device address at its view's start in `grads` (the places
/// [`AttnShape::grad_places`] gives).
fn grad_ptrs(grads: &mut AttnGrads<CudaStorage>, sh: &AttnShape, dtype: DType) -> [u64; 3] {
    let (bases, places) = (grads.per_grad(|g| base_ptr(g, 0)), sh.grad_places());
    [0, 1, 2].map(|i| bases[i] + (places[i].offset * dtype.size_in_bytes()) as u64)
}

/// The forward's cuDNN call on `x` (each operand at its view's start) into
/// `out` and `lse`, with the workspace `ws` of `bytes`; the backward's adds its
/// gradients and workspace parts.
fn library_call(
    geom: SdpaGeom,
    x: &AttnOperands<'_, CudaStorage>,
    sh: &AttnShape,
    (out, lse): (&CudaStorage, &CudaStorage),
    (ws, bytes): (&CudaStorage, usize),
) -> SdpaCall {
    let at = |(s, l): (&CudaStorage, &Layout)| base_ptr(s, l.offset());
    SdpaCall {
        geom,
        q: at(x.q),
        k: at(x.k),
        v: at(x.v),
        o: out.ptr(),
        stats: lse.ptr(),
        grads: [0; 4],
        scale: sh.scale as f32,
        workspace: ws.ptr(),
        workspace_bytes: bytes,
        parts: AttnLibraryParts::default(),
    }
}

/// The output and log-sum-exps of [`BackendStorage::attention`](crate::backend::primitives::BackendStorage::attention).
pub(crate) fn attention(
    x: AttnOperands<'_, CudaStorage>,
    sh: AttnShape,
) -> Result<(CudaStorage, CudaStorage)> {
    let (q, lq) = x.q;
    let dev = q.dev();
    check(dev, q, x.bias, &sh)?;
    let n = sh.batch * sh.heads;
    let out = new_out(dev, q.dtype(), n * sh.l * sh.d)?;
    let lse = new_out(dev, stat_dtype(q.dtype()), n * sh.l)?;
    if let Some(geom) = library_geom(q, [lq, x.k.1, x.v.1], x.bias.is_some(), &sh, None) {
        // (the meta device allocates the same after the results)
        let bytes = attn_library_workspace(&sh, false);
        let ws = new_out(dev, DType::U8, bytes)?;
        if library_ran(
            dev,
            &library_call(geom, &x, &sh, (&out, &lse), (&ws, bytes)),
        ) {
            return Ok((out, lse));
        }
    }
    let ((q, lq), (k, lk), (v, lv), bias) = x.parts();
    let a = KAttn::new(&sh, lq, lk, lv, bias.map(|b| b.1));
    let (pq, pk, pv) = (base_ptr(q, 0), base_ptr(k, 0), base_ptr(v, 0));
    // no bias: a null pointer, which the kernels test
    let pb = bias.map_or(0, |b| base_ptr(b.0, 0));
    let (po, pl) = (out.ptr(), lse.ptr());
    let dm = kernel_dim(sh.d);
    let name = format!("attn_fwd{}_{}_d{dm}", masked(bias), suffix(q.dtype()));
    let grid = (n as u32, sh.l.div_ceil(BLOCK_ROWS) as u32);
    let shared = dynamic_shared(AttnTiles::Forward, q.dtype(), dm);
    launch(
        dev,
        q,
        &name,
        (grid, shared),
        &mut args![pq, pk, pv, pb, po, pl, a],
    )?;
    Ok((out, lse))
}

/// The gradients of [`attention`] (see `BackendStorage::attention_backward`).
pub(crate) fn attention_backward(
    x: AttnOperands<'_, CudaStorage>,
    saved: AttnSaved<'_, CudaStorage>,
    sh: AttnShape,
) -> Result<AttnGrads<CudaStorage>> {
    let (out, lse, (g, lg)) = saved.parts();
    let (q, lq) = x.q;
    let dev = q.dev();
    check(dev, q, x.bias, &sh)?;
    let n = sh.batch * sh.heads;
    if let Some(geom) = library_geom(q, [lq, x.k.1, x.v.1], x.bias.is_some(), &sh, Some(lg)) {
        // the gradients, then the workspace (as the meta device allocates them)
        let mut grads = AttnGrads::alloc(&sh, |len| new_out(dev, q.dtype(), len))?;
        let [pdq, pdk, pdv] = grad_ptrs(&mut grads, &sh, q.dtype());
        let bytes = attn_library_workspace(&sh, true);
        let ws = new_out(dev, DType::U8, bytes)?;
        let call = SdpaCall {
            grads: [base_ptr(g, lg.offset()), pdq, pdk, pdv],
            parts: attn_library_parts(&sh),
            ..library_call(geom, &x, &sh, (out, lse), (&ws, bytes))
        };
        if library_ran(dev, &call) {
            return Ok(grads);
        }
    }
    let ((q, lq), (k, lk), (v, lv), bias) = x.parts();
    // each row's Σ g · out, freed once the kernels are queued (the allocator
    // keeps it from reuse until they ran)
    let dsum = new_out(dev, stat_dtype(q.dtype()), n * sh.l)?;
    let mut grads = AttnGrads::alloc(&sh, |len| new_out(dev, q.dtype(), len))?;
    let [pdq, pdk, pdv] = grad_ptrs(&mut grads, &sh, q.dtype());
    let a = KAttn::new(&sh, lq, lk, lv, bias.map(|b| b.1));
    let ga = a.with_queries(lg);
    let sfx = suffix(q.dtype());
    let (pq, pk, pv) = (base_ptr(q, 0), base_ptr(k, 0), base_ptr(v, 0));
    let pb = bias.map_or(0, |b| base_ptr(b.0, 0));
    let (pg, po, pl, pd) = (base_ptr(g, 0), out.ptr(), lse.ptr(), dsum.ptr());
    let rows = (n * sh.l) as i64;
    let blocks = dev.grid_for(n * sh.l * 32, THREADS);
    launch(
        dev,
        q,
        &format!("attn_dot_{sfx}"),
        ((blocks, 1), 0),
        &mut args![pg, ga, po, pd, rows],
    )?;
    let dm = kernel_dim(sh.d);
    let kv_shared = dynamic_shared(AttnTiles::KeysValues, q.dtype(), dm);
    launch(
        dev,
        q,
        &format!("attn_bwd_kv{}_{sfx}_d{dm}", masked(bias)),
        ((n as u32, sh.s.div_ceil(BLOCK_ROWS) as u32), kv_shared),
        &mut args![pq, pk, pv, pb, pg, pl, pd, pdk, pdv, a, ga],
    )?;
    launch(
        dev,
        q,
        &format!("attn_bwd_q{}_{sfx}_d{dm}", masked(bias)),
        ((n as u32, sh.l.div_ceil(BLOCK_ROWS) as u32), 0),
        &mut args![pq, pk, pv, pb, pg, pl, pd, pdq, a, ga],
    )?;
    drop(dsum);
    Ok(grads)
}
