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

mod conv;
mod convolution;
mod elementwise;
mod matmul;
mod nn;
mod random;
mod reduce;

pub(crate) use conv::*;
pub(crate) use convolution::{conv2d, conv2d_backward};
pub(crate) use elementwise::*;
pub(crate) use matmul::*;
pub(crate) use nn::*;
pub(crate) use random::*;
pub(crate) use reduce::*;

use super::{CudaDev, CudaStorage};
use crate::layout::Layout;
use crate::{DType, Error, Result};
use std::ffi::c_void;
use std::sync::Arc;

/// Most dimensions a layout passed to a kernel may have (`EMBER_MAX_RANK`).
pub(crate) const MAX_RANK: usize = 8;

/// A strided view passed to kernels by value; mirrors `struct Layout` in
/// kernels/common.cuh.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct KLayout {
    rank: i32,
    contiguous: i32,
    offset: i64,
    shape: [i64; MAX_RANK],
    strides: [i64; MAX_RANK],
}

impl KLayout {
    pub fn new(op: &'static str, l: &Layout) -> Result<KLayout> {
        KLayout::from_parts(op, l.shape(), l.strides(), l.offset(), l.is_contiguous())
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
        let mut k = KLayout {
            rank: shape.len() as i32,
            contiguous: contiguous as i32,
            offset: offset as i64,
            shape: [1; MAX_RANK],
            strides: [0; MAX_RANK],
        };
        for (i, (&n, &s)) in shape.iter().zip(strides).enumerate() {
            k.shape[i] = n as i64;
            k.strides[i] = s as i64;
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
        dev.grid_for(n, THREADS),
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
    let grid = rows.min(65535 * 32) as u32;
    launch_blocks(dev, module, dtype, name, rows, grid, params)
}

/// Launches `grid` blocks of `THREADS` of `module::name`, nothing when there is no
/// work (`items` is 0).
fn launch_blocks(
    dev: &CudaDev,
    module: &'static str,
    dtype: DType,
    name: &str,
    items: usize,
    grid: u32,
    params: &mut [*mut c_void],
) -> Result<()> {
    if items == 0 {
        return Ok(());
    }
    let f = dev.func(module, dtype, name)?;
    // SAFETY: the callers pass parameters matching the kernel signatures in
    // kernels/*.cu, with device pointers to storage that holds the addressed elements.
    unsafe { dev.launch(&f, (grid, 1, 1), (THREADS, 1, 1), 0, params) }
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
        if let Err(e) = compile("abi_check", &struct_checks(false)) {
            panic!("the kernel structs differ from Rust's: {e}");
        }
        // the check can fail: a wrong size does not compile
        let bad = struct_checks(false).replace("sizeof(Layout) ==", "sizeof(Layout) + 8 ==");
        assert!(compile("abi_check_bad", &bad).is_err());
    }

    /// Every field offset of the by-value structs matches Rust's, under the host C++
    /// compiler of the CUDA simulator (skipped without one).
    #[test]
    fn by_value_structs_match_under_the_host_compiler() {
        let src = struct_checks(true);
        match super::super::sim::compile("abi_check", &src, &[]) {
            Ok(_) => {}
            Err(Error::CudaUnavailable { reason }) => eprintln!("skipped: {reason}"),
            Err(e) => panic!("the kernel structs differ from Rust's: {e}"),
        }
        let bad = src.replace("(Conv, oh) ==", "(Conv, oh) + 8 ==");
        assert!(super::super::sim::compile("abi_check_bad", &bad, &[]).is_err());
    }

    #[test]
    fn klayout_matches_the_kernel_struct_size() {
        // int rank, int contiguous, i64 offset, i64 shape[8], i64 strides[8]
        assert_eq!(std::mem::size_of::<KLayout>(), 4 + 4 + 8 + 64 + 64);
        assert!(KLayout::from_parts("t", &[1; 9], &[1; 9], 0, true).is_err());
    }
}
