//! Launching ember's kernels on CUDA storage, one file per kernel family of
//! `kernels/*.cu`. Each function validates nothing the tensor layer has already
//! checked (shapes, dtypes, devices); it only builds the by-value layout structs
//! and the launch configuration.

/// A kernel argument: a pointer to the value, as cuLaunchKernel wants.
macro_rules! args {
    ($($x:expr),* $(,)?) => {
        [$(&$x as *const _ as *mut c_void),*]
    };
}

mod attention;
mod channel;
mod conv;
mod convolution;
mod elementwise;
mod matmul;
mod nn;
mod random;
mod reduce;

#[cfg(test)]
pub(crate) use attention::KAttn;
pub(crate) use attention::{attention, attention_backward};
pub(crate) use channel::*;
pub(crate) use conv::*;
pub(crate) use convolution::{conv2d, conv2d_backward, conv_takes_channels_last, conv_takes_half};
pub(crate) use elementwise::*;
pub(crate) use matmul::*;
pub(crate) use nn::*;
pub(crate) use random::*;
pub(crate) use reduce::*;

use super::{CudaDev, CudaStorage};
use crate::backend::op::{FOREACH_CHUNK, FOREACH_LIST};
use crate::layout::Layout;
use crate::{
    dtype::DType,
    error::{Error, Result},
};
use std::ffi::c_void;
use std::sync::Arc;

/// Most dimensions a layout passed to a kernel may have (`EMBER_MAX_RANK`).
pub(crate) const MAX_RANK: usize = 8;

/// A strided view passed to kernels by value; mirrors `struct Layout` in
/// kernels/common.cuh. Kernels address it by a linear index below its element
/// count.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct KLayout {
    rank: i32,
    contiguous: i32,
    offset: i64,
    shape: [i64; MAX_RANK],
    strides: [i64; MAX_RANK],
    /// `magic[d]` and `shift[d]` divide a 32-bit index by `shape[d]`
    /// ([`FastDiv`]); used when `small` is 1 (fewer than 2^31 elements).
    magic: [u32; MAX_RANK],
    shift: [u8; MAX_RANK],
    small: i32,
    reserved: i32,
}

/// Division of `n < 2^31` by a fixed divisor `d` as `(umulhi(n, magic) + n) >>
/// shift`: a multiply, an add and a shift on the GPU instead of a division
/// (Granlund and Montgomery's method: `shift = ceil(log2 d)`, `magic =
/// floor(2^32 (2^shift - d) / d) + 1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FastDiv {
    pub magic: u32,
    pub shift: u8,
}

impl FastDiv {
    /// The multiplier and shift for `d` (1 ≤ d < 2^31).
    pub fn new(d: u32) -> FastDiv {
        debug_assert!((1..1 << 31).contains(&d));
        let shift = 32 - (d - 1).leading_zeros(); // ceil(log2 d); 0 for 1
        let magic = (((1u64 << 32) * ((1u64 << shift) - d as u64)) / d as u64 + 1) as u32;
        FastDiv {
            magic,
            shift: shift as u8,
        }
    }

    /// `n / d` the way the kernels compute it.
    #[cfg(test)]
    pub fn div(self, n: u32) -> u32 {
        let hi = ((n as u64 * self.magic as u64) >> 32) as u32;
        (hi + n) >> self.shift
    }
}

impl KLayout {
    pub fn new(op: &'static str, l: &Layout) -> Result<KLayout> {
        KLayout::from_parts(op, l.shape(), l.strides(), l.offset(), l.is_contiguous())
    }

    /// The view `l` with dimensions merged where that addresses the same elements:
    /// size-1 dimensions dropped and a dimension folded into the next where its
    /// stride is the next one's stride times its size (a broadcast `[N, C, H, W]`
    /// bias of strides `[0, 1, 0, 0]` becomes `[N, C, H·W]`, `[0, 1, 0]`), so the
    /// kernel splits an index into fewer coordinates. Only for kernels that address
    /// the layout through `loc` alone (not by its dimensions).
    pub fn coalesced(op: &'static str, l: &Layout) -> Result<KLayout> {
        if l.is_contiguous() {
            return KLayout::from_parts(op, &[l.numel()], &[1], l.offset(), true);
        }
        let mut shape: Vec<usize> = Vec::with_capacity(l.shape().len());
        let mut strides: Vec<usize> = Vec::with_capacity(l.shape().len());
        for (&n, &st) in l.shape().iter().zip(l.strides()) {
            if n == 1 {
                continue;
            }
            match (shape.last_mut(), strides.last_mut()) {
                (Some(pn), Some(ps)) if *ps == st * n => {
                    *pn *= n;
                    *ps = st;
                }
                _ => {
                    shape.push(n);
                    strides.push(st);
                }
            }
        }
        let contiguous = shape.is_empty() || (shape.len() == 1 && strides[0] == 1);
        KLayout::from_parts(op, &shape, &strides, l.offset(), contiguous)
    }

    pub fn from_parts(
        op: &'static str,
        shape: &[usize],
        strides: &[usize],
        offset: usize,
        contiguous: bool,
    ) -> Result<KLayout> {
        if shape.len() > MAX_RANK {
            return Err(Error::invalid(
                op,
                format!(
                    "tensors of more than {MAX_RANK} dimensions are not supported on CUDA (got {})",
                    shape.len()
                ),
            ));
        }
        let numel = shape.iter().try_fold(1usize, |a, &n| a.checked_mul(n));
        // (an empty view launches nothing, and may have a dimension of 2^31 or more)
        let small = numel.is_some_and(|n| (1..1 << 31).contains(&n));
        let mut k = KLayout {
            rank: shape.len() as i32,
            contiguous: contiguous as i32,
            offset: offset as i64,
            shape: [1; MAX_RANK],
            strides: [0; MAX_RANK],
            magic: [1; MAX_RANK],
            shift: [0; MAX_RANK],
            small: small as i32,
            reserved: 0,
        };
        for (i, (&n, &s)) in shape.iter().zip(strides).enumerate() {
            k.shape[i] = n as i64;
            k.strides[i] = s as i64;
            if small {
                let f = FastDiv::new(n as u32);
                k.magic[i] = f.magic;
                k.shift[i] = f.shift;
            }
        }
        Ok(k)
    }
}

/// The kernel-name suffix of a dtype.
pub(crate) fn suffix(dt: DType) -> &'static str {
    match dt {
        DType::Bool => "bool",
        DType::U8 => "u8",
        DType::I64 => "i64",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::F32 => "f32",
        DType::F64 => "f64",
    }
}

pub(super) const THREADS: u32 = 256;

/// Launches `module::name` over `n` elements (1-D grid-stride).
pub(super) fn launch_n(
    dev: &CudaDev,
    module: &'static str,
    dtype: DType,
    name: &str,
    n: usize,
    params: &mut [*mut c_void],
) -> Result<()> {
    launch_blocks(
        dev,
        module,
        dtype,
        name,
        n,
        (dev.grid_for(n, THREADS), 0),
        params,
    )
}

/// Launches `name` with one block of `THREADS` per row (the kernels loop when
/// there are more rows than blocks); the same contract as [`launch_n`].
pub(super) fn launch_rows(
    dev: &CudaDev,
    module: &'static str,
    dtype: DType,
    name: &str,
    rows: usize,
    params: &mut [*mut c_void],
) -> Result<()> {
    launch_rows_shared(dev, module, dtype, name, rows, 0, params)
}

/// [`launch_rows`] with `shared` bytes of dynamic shared memory per block.
pub(super) fn launch_rows_shared(
    dev: &CudaDev,
    module: &'static str,
    dtype: DType,
    name: &str,
    rows: usize,
    shared: u32,
    params: &mut [*mut c_void],
) -> Result<()> {
    let grid = rows.min(65535 * 32) as u32;
    launch_blocks(dev, module, dtype, name, rows, (grid, shared), params)
}

/// `struct TensorList` of kernels/common.cuh: the tensors of one multi-tensor
/// launch, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct TensorList {
    a: [[u64; FOREACH_LIST]; 4],
    n: [i64; FOREACH_LIST],
    flag: [i64; FOREACH_LIST],
    first_chunk: [i64; FOREACH_LIST + 1],
    count: i64,
}

/// One tensor of a multi-tensor launch: the device addresses of up to four arrays
/// of its length (a parameter, its gradient, its state; 0 where unused), the
/// length, and a flag its kernel reads.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ListTensor {
    pub arrays: [u64; 4],
    pub n: usize,
    pub flag: bool,
}

/// The launches that cover `tensors`: up to `FOREACH_LIST` per list, each with
/// its number of chunks.
pub(super) fn tensor_lists(tensors: &[ListTensor]) -> Vec<(TensorList, usize)> {
    tensors
        .chunks(FOREACH_LIST)
        .map(|group| {
            let mut l = TensorList {
                a: [[0; FOREACH_LIST]; 4],
                n: [0; FOREACH_LIST],
                flag: [0; FOREACH_LIST],
                first_chunk: [0; FOREACH_LIST + 1],
                count: group.len() as i64,
            };
            let mut chunks = 0usize;
            for (i, t) in group.iter().enumerate() {
                for (a, &ptr) in t.arrays.iter().enumerate() {
                    l.a[a][i] = ptr;
                }
                (l.n[i], l.flag[i]) = (t.n as i64, t.flag as i64);
                l.first_chunk[i] = chunks as i64;
                chunks += t.n.div_ceil(FOREACH_CHUNK);
            }
            l.first_chunk[group.len()] = chunks as i64;
            (l, chunks)
        })
        .collect()
}

/// Launches a multi-tensor kernel over `chunks` chunks: a block per chunk up to
/// what fills the GPU, each block looping over its chunks.
pub(super) fn launch_chunks(
    dev: &CudaDev,
    module: &'static str,
    dtype: DType,
    name: &str,
    chunks: usize,
    params: &mut [*mut c_void],
) -> Result<()> {
    let grid = dev.grid_for(chunks * THREADS as usize, THREADS);
    launch_blocks(dev, module, dtype, name, chunks, (grid, 0), params)
}

/// Launches the multi-tensor kernel `module::name` over `tensors`, once per list
/// of [`tensor_lists`]: the list is the kernel's first parameter, `rest` (as
/// `args!` makes them) its others.
pub(super) fn launch_lists(
    dev: &CudaDev,
    (module, dtype, name): (&'static str, DType, &str),
    tensors: &[ListTensor],
    rest: &[*mut c_void],
) -> Result<()> {
    for (mut l, chunks) in tensor_lists(tensors) {
        let mut params = Vec::with_capacity(1 + rest.len());
        params.push(&mut l as *mut TensorList as *mut c_void);
        params.extend_from_slice(rest);
        launch_chunks(dev, module, dtype, name, chunks, &mut params)?;
    }
    Ok(())
}

/// Launches `grid` blocks of `THREADS` of `module::name` with `shared` bytes of
/// dynamic shared memory each (within the 48 KiB a kernel may use without
/// opting in), nothing when there is no work (`items` is 0).
fn launch_blocks(
    dev: &CudaDev,
    module: &'static str,
    dtype: DType,
    name: &str,
    items: usize,
    (grid, shared): (u32, u32),
    params: &mut [*mut c_void],
) -> Result<()> {
    if items == 0 {
        return Ok(());
    }
    launch_kernel(
        dev,
        (module, dtype, name),
        (grid, 1, 1),
        ((THREADS, 1, 1), shared),
        params,
    )
}

/// Launches kernel `name` of ember's kernel file `module` (compiled for `dtype`)
/// with `grid` blocks of `block` threads and `shared` bytes of dynamic shared
/// memory each (more than 48 KiB only where the kernel was opted in to it:
/// `CudaDev::allow_dynamic_shared`): the one place ember's own kernels are
/// launched.
pub(super) fn launch_kernel(
    dev: &CudaDev,
    (module, dtype, name): (&'static str, DType, &str),
    grid: (u32, u32, u32),
    (block, shared): ((u32, u32, u32), u32),
    params: &mut [*mut c_void],
) -> Result<()> {
    let f = dev.func(module, dtype, name)?;
    // SAFETY: the callers pass parameters matching the kernel signatures in
    // kernels/*.cu, with device pointers to storage that holds the addressed
    // elements (each caller names the kernel whose parameters it builds).
    unsafe { dev.launch(&f, grid, block, shared, params) }
}

pub(super) fn new_out(dev: &Arc<CudaDev>, dtype: DType, n: usize) -> Result<CudaStorage> {
    CudaStorage::alloc(dev, dtype, n)
}

/// The address of element `offset` of `s`.
pub(super) fn base_ptr(s: &CudaStorage, offset: usize) -> u64 {
    s.ptr() + (offset * s.dtype().size_in_bytes()) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `static_assert`s that the kernel structs have Rust's sizes and (with
    /// `offsets`) field offsets.
    fn struct_checks(offsets: bool) -> String {
        use std::mem::{offset_of, size_of};
        let mut checks = vec![
            format!(
                "static_assert(sizeof(Layout) == {}, \"Layout size\");",
                size_of::<KLayout>()
            ),
            format!(
                "static_assert(sizeof(Conv) == {}, \"Conv size\");",
                size_of::<KConv>()
            ),
        ];
        if offsets {
            let fields = [
                ("Layout", "rank", offset_of!(KLayout, rank)),
                ("Layout", "contiguous", offset_of!(KLayout, contiguous)),
                ("Layout", "offset", offset_of!(KLayout, offset)),
                ("Layout", "shape", offset_of!(KLayout, shape)),
                ("Layout", "strides", offset_of!(KLayout, strides)),
                ("Layout", "magic", offset_of!(KLayout, magic)),
                ("Layout", "shift", offset_of!(KLayout, shift)),
                ("Layout", "small", offset_of!(KLayout, small)),
                ("Conv", "n", offset_of!(KConv, n)),
                ("Conv", "w", offset_of!(KConv, w)),
                ("Conv", "oh", offset_of!(KConv, oh)),
                ("Conv", "kh", offset_of!(KConv, kh)),
                ("Conv", "sh", offset_of!(KConv, sh)),
                ("Conv", "ph", offset_of!(KConv, ph)),
                ("Conv", "dw", offset_of!(KConv, dw)),
            ];
            for (ty, field, off) in fields {
                checks.push(format!(
                    "static_assert(__builtin_offsetof({ty}, {field}) == {off}, \"{ty}.{field}\");"
                ));
            }
        }
        super::super::nvrtc::ember_source("conv", "f32").unwrap() + &checks.join("\n")
    }

    /// The same for attention's `AttnArgs` (in its own kernel file), and the
    /// sizes of its shared tiles, which the launches' dynamic shared memory
    /// must match where they take it.
    fn attn_checks(offsets: bool) -> String {
        use super::attention::{attn_tiles_bytes, AttnTiles};
        use std::mem::{offset_of, size_of};
        let mut checks = vec![format!(
            "static_assert(sizeof(AttnArgs) == {}, \"AttnArgs size\");",
            size_of::<KAttn>()
        )];
        for (ty, dt) in [
            ("f16", DType::F16),
            ("bf16", DType::BF16),
            ("float", DType::F32),
        ] {
            for dm in [64, 128] {
                for (kind, tiles) in [
                    ("attn_fwd_tiles", AttnTiles::Forward),
                    ("attn_kv_tiles", AttnTiles::KeysValues),
                ] {
                    let b = attn_tiles_bytes(tiles, dt, dm);
                    checks.push(format!(
                        "static_assert(sizeof({kind}<{ty}, {dm}>) == {b} && {kind}<{ty}, {dm}>::DYNAMIC == {}, \"{kind}<{ty}, {dm}>\");",
                        b > 48 << 10
                    ));
                }
            }
        }
        if offsets {
            for (field, off) in [
                ("k_off", offset_of!(KAttn, k_off)),
                ("qs", offset_of!(KAttn, qs)),
                ("vs", offset_of!(KAttn, vs)),
                ("heads", offset_of!(KAttn, heads)),
                ("d", offset_of!(KAttn, d)),
                ("scale", offset_of!(KAttn, scale)),
                ("causal", offset_of!(KAttn, causal)),
                ("seed", offset_of!(KAttn, seed)),
                ("drop_threshold", offset_of!(KAttn, drop_threshold)),
                ("keep_scale", offset_of!(KAttn, keep_scale)),
                ("bias_off", offset_of!(KAttn, bias_off)),
                ("bias_st", offset_of!(KAttn, bias_st)),
                ("os", offset_of!(KAttn, os)),
                ("dqs", offset_of!(KAttn, dqs)),
                ("dkvs", offset_of!(KAttn, dkvs)),
            ] {
                checks.push(format!(
                    "static_assert(__builtin_offsetof(AttnArgs, {field}) == {off}, \"AttnArgs.{field}\");"
                ));
            }
        }
        super::super::nvrtc::ember_source("attention", "bf16").unwrap() + &checks.join("\n")
    }

    /// The structs passed to kernels by value have Rust's sizes in NVRTC's compiler
    /// (which has no `offsetof`; CUDA lays kernel parameters out like the host ABI).
    /// Skips without NVRTC unless `EMBER_REQUIRE_NVRTC` is set.
    #[test]
    fn by_value_structs_match_under_nvrtc() {
        let nv = super::super::nvrtc::ensure_nvrtc();
        if let Err(e) = nv {
            assert!(
                std::env::var_os("EMBER_REQUIRE_NVRTC").is_none_or(|v| v == "0"),
                "EMBER_REQUIRE_NVRTC is set but NVRTC is missing: {e}"
            );
            eprintln!("skipped: {e}");
            return;
        }
        let compile = |name, src: &str| super::super::nvrtc::compile(name, src, 80, &[]);
        for (name, src) in [
            ("abi_check", struct_checks(false)),
            ("abi_attn", attn_checks(false)),
        ] {
            if let Err(e) = compile(name, &src) {
                panic!("the kernel structs differ from Rust's: {e}");
            }
        }
        // the check can fail: a wrong size does not compile
        let bad = struct_checks(false).replace("sizeof(Layout) ==", "sizeof(Layout) + 8 ==");
        assert!(compile("abi_check_bad", &bad).is_err());
    }

    /// Every field offset of the by-value structs matches Rust's, under the host C++
    /// compiler of the CUDA simulator (skipped without one).
    #[test]
    fn by_value_structs_match_under_the_host_compiler() {
        for (name, src) in [
            ("abi_check", struct_checks(true)),
            ("abi_attn", attn_checks(true)),
        ] {
            match super::super::sim::compile(name, &src, &[]) {
                Ok(_) => {}
                Err(Error::CudaUnavailable { reason }) => eprintln!("skipped: {reason}"),
                Err(e) => panic!("the kernel structs differ from Rust's: {e}"),
            }
        }
        let src = struct_checks(true);
        let bad = src.replace("(Conv, oh) ==", "(Conv, oh) + 8 ==");
        assert!(super::super::sim::compile("abi_check_bad", &bad, &[]).is_err());
    }

    #[test]
    fn klayout_matches_the_kernel_struct_size() {
        // int rank, int contiguous, i64 offset, i64 shape[8], i64 strides[8],
        // unsigned magic[8], unsigned char shift[8], int small, int reserved
        assert_eq!(
            std::mem::size_of::<KLayout>(),
            4 + 4 + 8 + 64 + 64 + 32 + 8 + 4 + 4
        );
        assert!(KLayout::from_parts("t", &[1; 9], &[1; 9], 0, true).is_err());
        // an empty view with a dimension past 32 bits takes the 64-bit path
        let k = KLayout::from_parts("t", &[0, 1 << 32], &[0, 1], 0, false).unwrap();
        assert_eq!(k.small, 0);
        assert_eq!(
            KLayout::from_parts("t", &[1 << 31], &[1], 0, false)
                .unwrap()
                .small,
            0
        );
        assert_eq!(
            KLayout::from_parts("t", &[(1 << 31) - 1], &[1], 0, false)
                .unwrap()
                .small,
            1
        );
    }

    /// The kernels' 32-bit division by a shape's size is exact for every index
    /// below 2^31: every divisor up to 4096 against the indices near each multiple
    /// and the range's ends, and random divisors and indices.
    #[test]
    fn fast_division_is_exact_below_2_pow_31() {
        let max = (1u32 << 31) - 1;
        let check = |d: u32, n: u32| {
            assert_eq!(FastDiv::new(d).div(n), n / d, "{n} / {d}");
        };
        for d in 1..=4096u32 {
            for n in [0, 1, d - 1, d, d + 1, max, max - 1, max - d, max / d * d] {
                check(d, n);
            }
            let last = max / d;
            for q in [1, 2, 3, last / 2, last] {
                let m = q.saturating_mul(d);
                for n in [m.saturating_sub(1), m, m.saturating_add(1)] {
                    check(d, n.min(max));
                }
            }
        }
        // a fixed-seed generator (xorshift) for the rest
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..200_000 {
            let d = (next() % max as u64) as u32 + 1;
            let d = if next() % 2 == 0 {
                d >> (next() % 31)
            } else {
                d
            }
            .max(1);
            check(d, (next() % (max as u64 + 1)) as u32);
        }
        for d in [max, 1 << 30, (1 << 30) + 1, 65_537, 3, 7, 641] {
            for n in [max, max - 1, 0, d - 1] {
                check(d, n);
            }
        }
    }

    /// Coalescing keeps every element where it was.
    #[test]
    fn coalesced_layouts_address_the_same_elements() {
        use crate::layout::Layout;
        let locate = |k: &KLayout, mut i: usize| -> usize {
            if k.contiguous == 1 {
                return k.offset as usize + i;
            }
            let mut off = k.offset as usize;
            for d in (0..k.rank as usize).rev() {
                let n = k.shape[d] as usize;
                off += (i % n) * k.strides[d] as usize;
                i /= n;
            }
            off
        };
        let base = Layout::contiguous(&[2, 3, 4, 5]);
        let views = [
            base.clone(),
            base.permute(&[0, 2, 1, 3]),
            base.slice(2, 1, 3, 1),
            Layout::contiguous(&[3, 1, 1])
                .broadcast_to("t", &[2, 3, 4, 5])
                .unwrap(),
            Layout::contiguous(&[5])
                .broadcast_to("t", &[2, 3, 4, 5])
                .unwrap(),
            Layout::contiguous(&[4, 1])
                .broadcast_to("t", &[2, 3, 4, 5])
                .unwrap(),
            base.slice(0, 1, 2, 1).slice(3, 0, 4, 1),
            base.slice(3, 0, 5, 2),
            base.transpose(0, 3),
        ];
        for l in &views {
            let k = KLayout::coalesced("t", l).unwrap();
            let plain = KLayout::new("t", l).unwrap();
            for i in 0..l.numel() {
                assert_eq!(locate(&k, i), locate(&plain, i), "{l:?} element {i}");
            }
        }
        // the broadcast bias of a convolution's output loses a dimension
        let bias = Layout::contiguous(&[3, 1, 1])
            .broadcast_to("t", &[2, 3, 4, 5])
            .unwrap();
        let k = KLayout::coalesced("t", &bias).unwrap();
        assert_eq!(
            (k.rank, &k.shape[..3], &k.strides[..3]),
            (3, &[2, 3, 20][..], &[0, 1, 0][..])
        );
        // a narrowed outer dim of a contiguous array is one run
        let k = KLayout::coalesced("t", &base.slice(0, 1, 2, 1)).unwrap();
        assert_eq!(k.contiguous, 1);
    }
}
