//! Your own CUDA kernels: CUDA C compiled at run time by NVRTC for the device's
//! architecture and launched on ember's stream with a grid/block configuration,
//! with tensors and scalars as arguments (what numba.cuda and CuPy's `RawKernel`
//! offer in Python). No nvcc and no build script.
//!
//! ```no_run
//! use ember::kernel::{Arg, Kernel, LaunchConfig};
//! use ember::prelude::*;
//!
//! let dev = Device::Cuda(0);
//! let src = r#"
//! extern "C" __global__ void add_vectors(const float* a, const float* b, float* c, int n) {
//!     int i = blockIdx.x * blockDim.x + threadIdx.x;
//!     if (i < n) c[i] = a[i] + b[i];
//! }"#;
//! let k = Kernel::compile(src, "add_vectors", &dev)?;
//! let n = 100_000;
//! let a = Tensor::rand([n], &dev)?;
//! let b = Tensor::rand([n], &dev)?;
//! let c = Tensor::zeros([n], DType::F32, &dev)?;
//! // the lessons' `ceil(N / 1024)` blocks of 1024 threads
//! k.launch(
//!     LaunchConfig::for_elements(n, 1024),
//!     &[Arg::input(&a, DType::F32), Arg::input(&b, DType::F32), Arg::output(&c, DType::F32), Arg::I32(n as i32)],
//! )?;
//! assert!(c.allclose(&a.add(&b)?, 1e-6, 1e-6)?);
//! # Ok::<(), ember::Error>(())
//! ```

use crate::backend::cuda::{self, nvrtc, CudaDev, Func};
use crate::tensor::Storages;
use crate::{
    device::Device,
    dtype::DType,
    error::{Error, Result},
    tensor::Tensor,
};
use half::{bf16, f16};
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

pub use crate::backend::cuda::runtime::FuncAttributes;

/// The shared memory (static and dynamic together) a block may use without the
/// opt-in, on every GPU since Volta.
const DEFAULT_SHARED: usize = 48 << 10;

/// A compiled kernel, ready to launch on one device.
pub struct Kernel {
    name: String,
    func: Func,
    dev: Arc<CudaDev>,
    /// The byte size of each parameter, as compiled.
    params: Vec<usize>,
    /// The device's limits, for checking launch configurations.
    props: crate::backend::cuda::discover::DeviceProperties,
    /// The compiled function's own limits.
    attrs: FuncAttributes,
    /// The dynamic shared memory the function may use now: what 48 KiB leaves
    /// beside its static shared memory, raised through the opt-in attribute when a
    /// launch asks for more (only ever raised, under this lock).
    dynamic_shared: Mutex<u32>,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Kernel({} on {})", self.name, self.dev.device())
    }
}

/// Compiles CUDA C for `sm_{arch}` (e.g. 90 for an H100) into a cubin, without a
/// GPU: for checking that a kernel compiles. Errors carry NVRTC's log.
pub fn compile_for_arch(source: &str, name: &str, arch: u32, options: &[&str]) -> Result<Vec<u8>> {
    let opts: Vec<String> = options.iter().map(|s| s.to_string()).collect();
    nvrtc::compile(name, source, arch, &opts)
}

impl Kernel {
    /// Compiles the `extern "C" __global__` function `name` of `source` for
    /// `device`'s architecture (cached in memory and on disk like ember's own
    /// kernels). A compile error is [`Error::KernelCompile`] with NVRTC's log.
    pub fn compile(source: &str, name: &str, device: &Device) -> Result<Kernel> {
        Kernel::compile_with(source, name, device, &[])
    }

    /// [`compile`](Self::compile) with NVRTC options such as `-use_fast_math`. A
    /// kernel compiled with include folders of its own (`-I...`) is cached in
    /// memory only, since its headers may change between runs (within one run
    /// the same source, name and options give the kernel loaded first: a header
    /// edited meanwhile is not read again).
    pub fn compile_with(
        source: &str,
        name: &str,
        device: &Device,
        options: &[&str],
    ) -> Result<Kernel> {
        let Device::Cuda(i) = *device else {
            return Err(Error::UnsupportedDevice {
                op: "Kernel::compile",
                device: *device,
                msg: "CUDA kernels run on a GPU (cuda:N)".into(),
            });
        };
        let dev = cuda::dev(i)?;
        let opts: Vec<String> = options.iter().map(|s| s.to_string()).collect();
        let func = dev.load_user_function(source, name, &opts)?;
        let attrs = dev.rt().func_attributes(&func)?;
        Ok(Kernel {
            name: name.to_string(),
            params: dev.param_sizes(&func)?,
            props: crate::backend::cuda::discover::device_properties(i)?,
            attrs,
            dynamic_shared: Mutex::new(
                DEFAULT_SHARED.saturating_sub(attrs.static_shared_bytes) as u32
            ),
            func,
            dev,
        })
    }

    /// What the compiled code allows: the most threads per block (below the
    /// device's limit where the kernel's register use or `__launch_bounds__` says
    /// so), registers per thread and static shared memory (numba's
    /// `kernel.max_threads_per_block`, CuPy's `RawKernel.attributes`). On the CUDA
    /// simulator, registers and static shared memory read 0.
    pub fn attributes(&self) -> FuncAttributes {
        self.attrs
    }

    /// The device the kernel runs on.
    pub fn device(&self) -> Device {
        self.dev.device()
    }

    /// The byte size of each of the kernel's parameters, as compiled (8 for a
    /// pointer or a `long long`, 4 for an `int` or a `float`, 2 for a `short` or
    /// a `__half`, 1 for a `bool` or a `char`, a struct's `sizeof`).
    pub fn param_sizes(&self) -> &[usize] {
        &self.params
    }

    /// Queues the kernel on the current stream of its device (in order with
    /// ember's own operations there) with `config` and `args`, after checking the configuration
    /// against the device's limits, the arguments against the kernel's parameters
    /// (their number and sizes: an `Arg::I32` for a `long long` is an error, not a
    /// misread value), and each tensor's device, dtype and layout.
    pub fn launch(&self, config: LaunchConfig, args: &[Arg]) -> Result<()> {
        let device = self.device();
        config.check(&self.props)?;
        self.check_function_limits(&config)?;
        self.check_args(args)?;
        // validate the tensors first, then keep their storages locked (and alive)
        // until the launch is queued, each storage once however often it is passed
        let mut tensors: Vec<&Tensor> = Vec::new();
        for (k, a) in args.iter().enumerate() {
            if let Arg::Tensor { t, dtype, .. } = *a {
                if t.device() != device {
                    return Err(Error::DeviceMismatch {
                        op: "Kernel::launch",
                        a: device,
                        b: t.device(),
                    });
                }
                if t.dtype() != dtype {
                    return Err(Error::invalid(
                        "Kernel::launch",
                        format!(
                            "argument {k}: the kernel takes {dtype} but the tensor is {}",
                            t.dtype()
                        ),
                    ));
                }
                if !t.is_contiguous() {
                    return Err(Error::invalid(
                        "Kernel::launch",
                        format!(
                            "argument {k}: the tensor is not contiguous; call .contiguous() first"
                        ),
                    ));
                }
                tensors.push(t);
            }
        }
        let storages = Storages::read(&tensors);
        let mut next = 0;
        // each value's bytes (little-endian, as the GPU and its host read them)
        // in 16-byte-aligned words of its own
        let mut values: Vec<Vec<u128>> = Vec::with_capacity(args.len());
        for a in args {
            // a pointer's or a scalar's bytes
            let word: [u8; 8];
            let bytes: &[u8] = match *a {
                Arg::Tensor { t, dtype, .. } => {
                    let st = storages
                        .get(next)
                        .as_cuda()
                        .expect("a tensor on the kernel's GPU");
                    next += 1;
                    let ptr = st.ptr() + (t.layout().offset() * dtype.size_in_bytes()) as u64;
                    word = ptr.to_le_bytes();
                    &word
                }
                Arg::Bytes(b) => b,
                _ => {
                    word = a.scalar_bytes();
                    &word[..a.size()]
                }
            };
            values.push(aligned_words(bytes));
        }
        let mut params: Vec<*mut c_void> = values
            .iter_mut()
            .map(|v| v.as_mut_ptr() as *mut c_void)
            .collect();
        self.allow_dynamic_shared(config.shared_mem)?;
        // SAFETY: the device pointers lie in live storages (locked above); the
        // parameter list is what the user declared for the kernel.
        unsafe {
            self.dev.launch(
                &self.func,
                config.grid,
                config.block,
                config.shared_mem,
                &mut params,
            )?;
        }
        // outputs count as written (`tensor._version`): autograd then refuses
        // a backward that would read values saved before the kernel changed them
        for a in args {
            if let Arg::Tensor {
                t, writes: true, ..
            } = *a
            {
                t.bump_version();
            }
        }
        Ok(())
    }
}

impl Kernel {
    /// Errors when `config` asks for more than the compiled function allows: more
    /// threads than its registers leave room for, or more shared memory (its static
    /// arrays and the dynamic request) than the device gives a block.
    fn check_function_limits(&self, config: &LaunchConfig) -> Result<()> {
        let (a, p) = (&self.attrs, &self.props);
        let (bx, by, bz) = config.block;
        let threads = bx as u64 * by as u64 * bz as u64;
        if threads > a.max_threads_per_block as u64 {
            return Err(Error::invalid(
                "Kernel::launch",
                format!(
                    "block {:?} has {threads} threads; {} allows at most {} per block as \
                     compiled ({} registers per thread, or its __launch_bounds__), although {} \
                     allows {}: use smaller blocks, or limit registers \
                     (__launch_bounds__, -maxrregcount)",
                    config.block,
                    self.name,
                    a.max_threads_per_block,
                    a.registers,
                    p.name,
                    p.max_threads_per_block
                ),
            ));
        }
        let total = a.static_shared_bytes + config.shared_mem as usize;
        if total > p.max_shared_memory_per_block_optin {
            return Err(Error::invalid(
                "Kernel::launch",
                format!(
                    "{} bytes of dynamic shared memory requested; with {}'s {} bytes of \
                     static shared memory that is {total}, and {} allows {} per block",
                    config.shared_mem,
                    self.name,
                    a.static_shared_bytes,
                    p.name,
                    p.max_shared_memory_per_block_optin
                ),
            ));
        }
        Ok(())
    }

    /// Opts the function in to `bytes` of dynamic shared memory when that is more
    /// than it may use now (more than 48 KiB with its static shared memory;
    /// checked against the device's opt-in limit before).
    fn allow_dynamic_shared(&self, bytes: u32) -> Result<()> {
        let mut allowed = self
            .dynamic_shared
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if bytes > *allowed {
            self.dev.rt().set_max_dynamic_shared(&self.func, bytes)?;
            *allowed = bytes;
        }
        Ok(())
    }

    fn check_args(&self, args: &[Arg]) -> Result<()> {
        if args.len() != self.params.len() {
            return Err(Error::invalid(
                "Kernel::launch",
                format!(
                    "{} takes {} arguments, {} given",
                    self.name,
                    self.params.len(),
                    args.len()
                ),
            ));
        }
        for (k, (a, &want)) in args.iter().zip(&self.params).enumerate() {
            if a.size() != want {
                return Err(Error::invalid(
                    "Kernel::launch",
                    format!(
                        "argument {k} of {}: the kernel's parameter takes {want} bytes, but {} is \
                         {} bytes (a pointer or long long is 8, an int or float 4, a short or \
                         __half 2, a bool or char 1, a struct its sizeof: Arg::Bytes)",
                        self.name,
                        a.describe(),
                        a.size()
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// A kernel argument.
#[derive(Clone, Copy, Debug)]
pub enum Arg<'a> {
    /// A contiguous tensor on the kernel's device, passed as a pointer to its first
    /// element; `dtype` is the element type the kernel expects.
    Tensor {
        t: &'a Tensor,
        dtype: DType,
        writes: bool,
    },
    /// `bool` (one byte, 0 or 1).
    Bool(bool),
    /// `signed char` / `int8_t`.
    I8(i8),
    /// `unsigned char` / `uint8_t`.
    U8(u8),
    /// `short` / `int16_t`.
    I16(i16),
    /// `unsigned short` / `uint16_t`.
    U16(u16),
    I32(i32),
    U32(u32),
    I64(i64),
    U64(u64),
    /// `__half` (cuda_fp16.h).
    F16(f16),
    /// `__nv_bfloat16` (cuda_bf16.h).
    BF16(bf16),
    F32(f32),
    F64(f64),
    /// A parameter passed by value as raw bytes: a struct, whose bytes must be
    /// laid out as the kernel's C struct is (padding included; a `#[repr(C)]`
    /// Rust struct of the same fields has that layout, e.g. through
    /// `bytemuck::bytes_of`). Its length must be the struct's `sizeof`.
    Bytes(&'a [u8]),
}

impl<'a> Arg<'a> {
    /// The bytes the argument takes in the kernel's parameter list.
    fn size(&self) -> usize {
        match self {
            Arg::Tensor { .. } | Arg::I64(_) | Arg::U64(_) | Arg::F64(_) => 8,
            Arg::I32(_) | Arg::U32(_) | Arg::F32(_) => 4,
            Arg::I16(_) | Arg::U16(_) | Arg::F16(_) | Arg::BF16(_) => 2,
            Arg::Bool(_) | Arg::I8(_) | Arg::U8(_) => 1,
            Arg::Bytes(b) => b.len(),
        }
    }

    /// A scalar's bytes, little-endian, in the first [`size`](Self::size) of
    /// eight (zeros after them; zeros for a tensor or raw bytes).
    fn scalar_bytes(&self) -> [u8; 8] {
        let mut out = [0u8; 8];
        let mut put = |b: &[u8]| out[..b.len()].copy_from_slice(b);
        match *self {
            Arg::Bool(v) => put(&[v as u8]),
            Arg::I8(v) => put(&v.to_le_bytes()),
            Arg::U8(v) => put(&[v]),
            Arg::I16(v) => put(&v.to_le_bytes()),
            Arg::U16(v) => put(&v.to_le_bytes()),
            Arg::I32(v) => put(&v.to_le_bytes()),
            Arg::U32(v) => put(&v.to_le_bytes()),
            Arg::I64(v) => put(&v.to_le_bytes()),
            Arg::U64(v) => put(&v.to_le_bytes()),
            Arg::F16(v) => put(&v.to_le_bytes()),
            Arg::BF16(v) => put(&v.to_le_bytes()),
            Arg::F32(v) => put(&v.to_le_bytes()),
            Arg::F64(v) => put(&v.to_le_bytes()),
            Arg::Tensor { .. } | Arg::Bytes(_) => {}
        }
        out
    }

    fn describe(&self) -> &'static str {
        match self {
            Arg::Tensor { .. } => "a tensor (a device pointer)",
            Arg::Bool(_) => "Arg::Bool",
            Arg::I8(_) => "Arg::I8",
            Arg::U8(_) => "Arg::U8",
            Arg::I16(_) => "Arg::I16",
            Arg::U16(_) => "Arg::U16",
            Arg::I32(_) => "Arg::I32",
            Arg::U32(_) => "Arg::U32",
            Arg::I64(_) => "Arg::I64",
            Arg::U64(_) => "Arg::U64",
            Arg::F16(_) => "Arg::F16",
            Arg::BF16(_) => "Arg::BF16",
            Arg::F32(_) => "Arg::F32",
            Arg::F64(_) => "Arg::F64",
            Arg::Bytes(_) => "Arg::Bytes",
        }
    }

    /// A tensor the kernel reads (`const T*`).
    pub fn input(t: &'a Tensor, dtype: DType) -> Arg<'a> {
        Arg::Tensor {
            t,
            dtype,
            writes: false,
        }
    }

    /// A tensor the kernel writes (`T*`). Its values change in place.
    pub fn output(t: &'a Tensor, dtype: DType) -> Arg<'a> {
        Arg::Tensor {
            t,
            dtype,
            writes: true,
        }
    }
}

/// `bytes` in 16-byte words of their own (zeros after them): a parameter's value
/// where the launch reads it, aligned for any parameter type.
fn aligned_words(bytes: &[u8]) -> Vec<u128> {
    let mut words = vec![0u128; bytes.len().div_ceil(16).max(1)];
    for (w, chunk) in words.iter_mut().zip(bytes.chunks(16)) {
        let mut b = [0u8; 16];
        b[..chunk.len()].copy_from_slice(chunk);
        *w = u128::from_le_bytes(b);
    }
    words
}

/// Grid and block dimensions and dynamic shared memory of a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub shared_mem: u32,
}

impl LaunchConfig {
    /// `grid` blocks of `block` threads, one-dimensional.
    pub fn new(grid: u32, block: u32) -> LaunchConfig {
        LaunchConfig {
            grid: (grid, 1, 1),
            block: (block, 1, 1),
            shared_mem: 0,
        }
    }

    /// Enough blocks of `threads` threads for `n` elements (`ceil(n / threads)`).
    pub fn for_elements(n: usize, threads: u32) -> LaunchConfig {
        let blocks = n.div_ceil(threads.max(1) as usize).max(1);
        LaunchConfig::new(blocks.min(u32::MAX as usize) as u32, threads)
    }

    /// This configuration with `bytes` of dynamic shared memory per block.
    pub fn with_shared_mem(mut self, bytes: u32) -> LaunchConfig {
        self.shared_mem = bytes;
        self
    }

    /// Errors when the configuration exceeds what the device allows (shared memory
    /// up to the device's opt-in limit; [`Kernel::launch`] also checks the compiled
    /// function's own limits).
    pub fn check(&self, p: &crate::backend::cuda::discover::DeviceProperties) -> Result<()> {
        let (bx, by, bz) = self.block;
        let (gx, gy, gz) = self.grid;
        let bad = |msg: String| Err(Error::invalid("Kernel::launch", msg));
        if [bx, by, bz, gx, gy, gz].contains(&0) {
            return bad(format!(
                "grid {:?} and block {:?} must be at least 1 in every dimension",
                self.grid, self.block
            ));
        }
        let threads = bx as u64 * by as u64 * bz as u64;
        if threads > p.max_threads_per_block as u64 {
            return bad(format!(
                "block {:?} has {threads} threads; {} allows at most {} per block",
                self.block, p.name, p.max_threads_per_block
            ));
        }
        if bx > 1024 || by > 1024 || bz > 64 {
            return bad(format!(
                "block {:?} exceeds the per-dimension limits (1024, 1024, 64)",
                self.block
            ));
        }
        if gx > i32::MAX as u32 || gy > 65535 || gz > 65535 {
            return bad(format!(
                "grid {:?} exceeds the limits (2147483647, 65535, 65535)",
                self.grid
            ));
        }
        if self.shared_mem as usize > p.max_shared_memory_per_block_optin {
            return bad(format!(
                "{} bytes of shared memory requested; {} allows {} per block ({} without \
                 the opt-in that Kernel::launch makes for larger requests)",
                self.shared_mem,
                p.name,
                p.max_shared_memory_per_block_optin,
                p.max_shared_memory_per_block
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h100() -> crate::backend::cuda::discover::DeviceProperties {
        crate::backend::cuda::discover::DeviceProperties {
            ordinal: 0,
            name: "test GPU".into(),
            compute_capability: (9, 0),
            multiprocessor_count: 132,
            max_threads_per_block: 1024,
            max_shared_memory_per_block: 49152,
            max_shared_memory_per_block_optin: 232448,
            warp_size: 32,
            total_memory: 80 << 30,
            l2_cache_size: 50 << 20,
            clock_rate_khz: 1_980_000,
            memory_bus_width_bits: 5120,
        }
    }

    #[test]
    fn lesson_config_is_ceil_n_over_threads() {
        let c = LaunchConfig::for_elements(100_000, 1024);
        assert_eq!(c.grid, (98, 1, 1));
        assert_eq!(c.block, (1024, 1, 1));
        assert_eq!(LaunchConfig::for_elements(1024, 1024).grid.0, 1);
        assert_eq!(LaunchConfig::for_elements(0, 256).grid.0, 1);
        assert!(c.check(&h100()).is_ok());
    }

    #[test]
    fn limits_are_checked_with_clear_errors() {
        let p = h100();
        let e = LaunchConfig::new(1, 2048)
            .check(&p)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("2048 threads") && e.contains("at most 1024"),
            "{e}"
        );
        let e = LaunchConfig::new(0, 32).check(&p).unwrap_err().to_string();
        assert!(e.contains("at least 1"), "{e}");
        // above 48 KiB with the opt-in, up to the device's opt-in limit
        assert!(LaunchConfig::new(1, 32)
            .with_shared_mem(100_000)
            .check(&p)
            .is_ok());
        assert!(LaunchConfig::new(1, 32)
            .with_shared_mem(232_448)
            .check(&p)
            .is_ok());
        let e = LaunchConfig::new(1, 32)
            .with_shared_mem(232_449)
            .check(&p)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("232449 bytes of shared memory") && e.contains("allows 232448"),
            "{e}"
        );
        let mut c = LaunchConfig::new(1, 32);
        c.grid.1 = 70_000;
        assert!(c.check(&p).is_err());
    }

    #[test]
    fn compile_errors_report_nvrtc_log() {
        if nvrtc::ensure_nvrtc().is_err() {
            eprintln!("skipped: NVRTC not found");
            return;
        }
        let ok = "extern \"C\" __global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }";
        let cubin = compile_for_arch(ok, "k", 80, &["-use_fast_math"]).unwrap();
        assert!(cubin.starts_with(b"\x7fELF"));
        let bad = "extern \"C\" __global__ void k(float* x) {\n  x[0] = y;\n}";
        match compile_for_arch(bad, "my_kernel", 80, &[]) {
            Err(Error::KernelCompile { name, arch, log }) => {
                assert_eq!((name.as_str(), arch.as_str()), ("my_kernel", "sm_80"));
                assert!(
                    log.contains("my_kernel.cu(2)") && log.contains("\"y\""),
                    "{log}"
                );
            }
            other => panic!("expected a compile error, got {other:?}"),
        }
        let e = compile_for_arch(ok, "k", 80, &["--no-such-option"]).unwrap_err();
        assert!(matches!(e, Error::KernelCompile { .. }), "{e}");
    }

    #[test]
    fn compiling_for_the_cpu_is_an_error() {
        let e = Kernel::compile("", "k", &Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(e.contains("cuda:N"), "{e}");
    }
}
