//! Run-time compilation of CUDA C with NVRTC, to the device's own machine code
//! (a cubin for `sm_XY`, which sidesteps PTX-version mismatches between NVRTC and
//! the driver), cached in memory and on disk.
//!
//! The disk cache lives in `EMBER_CACHE_DIR`, else `$XDG_CACHE_HOME/ember/kernels`,
//! else `~/.cache/ember/kernels`; entries are keyed by a hash of the source, the
//! options, the architecture and NVRTC's version, and written atomically. Set
//! `EMBER_KERNEL_CACHE=0` to compile every time.

use crate::backend::cuda::libs::{self, CudaLib};
use crate::error::{Error, Result};
use cudarc::nvrtc::{result as nv, sys as nvsys};
use std::collections::HashMap;
use std::ffi::CString;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

/// ember's own kernel sources, embedded in the library.
pub(crate) const COMMON: &str = include_str!("../../../kernels/common.cuh");
pub(crate) const SOURCES: &[(&str, &str)] = &[
    (
        "elementwise",
        include_str!("../../../kernels/elementwise.cu"),
    ),
    ("reduce", include_str!("../../../kernels/reduce.cu")),
    ("nn", include_str!("../../../kernels/nn.cu")),
    ("conv", include_str!("../../../kernels/conv.cu")),
    ("random", include_str!("../../../kernels/random.cu")),
    ("attention", include_str!("../../../kernels/attention.cu")),
];

/// The text NVRTC compiles for ember's kernel file `name`, instantiated for the
/// dtype with kernel suffix `dtype` (`f32`, `i64`, ...) only. The operation codes
/// come first, generated from the op vocabulary's tables.
pub(crate) fn ember_source(name: &str, dtype: &str) -> Option<String> {
    let (_, body) = SOURCES.iter().find(|(n, _)| *n == name)?;
    let codes = crate::backend::op::kernel_defines();
    Some(format!(
        "#define EMBER_T_{dtype}\n{codes}{COMMON}\n#line 1 \"{name}.cu\"\n{body}"
    ))
}

/// Makes NVRTC loadable, or says why it is not.
pub(crate) fn ensure_nvrtc() -> Result<()> {
    libs::ensure(CudaLib::Nvrtc)
        .map(|_| ())
        .map_err(|reason| Error::CudaUnavailable { reason })
}

/// NVRTC's (major, minor) version.
pub(crate) fn version() -> Result<(i32, i32)> {
    ensure_nvrtc()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: plain out-parameters.
    unsafe { nvsys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| Error::Cuda {
            op: "nvrtcVersion",
            msg: e.to_string(),
        })?;
    Ok((major, minor))
}

/// The architecture to compile for on a GPU of compute capability `arch`
/// (`major * 10 + minor`), given the ones NVRTC supports: the GPU's own, else the
/// newest of the same major version below it (a cubin runs on later minor
/// revisions of its major version), else an error that says why.
pub(crate) fn target_arch(
    arch: u32,
    supported: &[u32],
    nvrtc: (i32, i32),
) -> std::result::Result<u32, String> {
    if supported.contains(&arch) {
        return Ok(arch);
    }
    if let Some(&a) = supported
        .iter()
        .filter(|&&a| a / 10 == arch / 10 && a < arch)
        .max()
    {
        return Ok(a);
    }
    let range = match (supported.iter().min(), supported.iter().max()) {
        (Some(lo), Some(hi)) => format!("sm_{lo} to sm_{hi}"),
        _ => "no architecture".into(),
    };
    let why = if supported.iter().all(|&a| a > arch) {
        "this CUDA version no longer supports it; use an NVRTC (and driver) of an \
         older CUDA that does"
    } else {
        "it is newer than this NVRTC; install a newer one (pip install nvidia-cuda-nvrtc)"
    };
    Err(format!(
        "NVRTC {}.{} compiles for {range}, but the GPU is sm_{arch} (compute capability \
         {}.{}): {why}",
        nvrtc.0,
        nvrtc.1,
        arch / 10,
        arch % 10
    ))
}

/// The architectures this NVRTC can compile for, as `sm` numbers (75, 80, ...).
pub(crate) fn supported_archs() -> Result<Vec<u32>> {
    ensure_nvrtc()?;
    let mut n = 0;
    // SAFETY: out-parameters sized by the first call.
    unsafe {
        nvsys::nvrtcGetNumSupportedArchs(&mut n)
            .result()
            .map_err(nv_err("nvrtcGetNumSupportedArchs"))?;
        let mut v = vec![0i32; n as usize];
        nvsys::nvrtcGetSupportedArchs(v.as_mut_ptr())
            .result()
            .map_err(nv_err("nvrtcGetSupportedArchs"))?;
        Ok(v.into_iter().map(|a| a as u32).collect())
    }
}

fn nv_err(op: &'static str) -> impl Fn(nv::NvrtcError) -> Error {
    move |e| Error::Cuda {
        op,
        msg: e.to_string(),
    }
}

/// Compiles `source` for `sm_{arch}` into a cubin. A compile error returns
/// [`Error::KernelCompile`] with NVRTC's log (file names and line numbers).
pub(crate) fn compile(name: &str, source: &str, arch: u32, options: &[String]) -> Result<Vec<u8>> {
    compile_logged(name, source, arch, options).map(|(cubin, _)| cubin)
}

/// [`compile`], with NVRTC's log of a successful compile too (warnings, and with
/// `--ptxas-options=--verbose` each kernel's registers and local memory).
pub(crate) fn compile_logged(
    name: &str,
    source: &str,
    arch: u32,
    options: &[String],
) -> Result<(Vec<u8>, String)> {
    ensure_nvrtc()?;
    let src = CString::new(source)
        .map_err(|_| Error::invalid("compile kernel", "the source contains a NUL byte"))?;
    let cname = CString::new(format!("{name}.cu")).unwrap_or_default();
    let prog = nv::create_program(&src, Some(&cname)).map_err(nv_err("nvrtcCreateProgram"))?;
    let mut opts = vec![
        format!("--gpu-architecture=sm_{arch}"),
        "-std=c++17".to_string(),
    ];
    for d in libs::include_dirs() {
        opts.push(format!("-I{}", d.display()));
    }
    opts.extend(options.iter().cloned());
    if let Some(bad) = opts.iter().find(|o| o.contains('\0')) {
        return Err(Error::invalid(
            "compile kernel",
            format!("option {bad:?} contains a NUL byte"),
        ));
    }
    // SAFETY: `prog` is a live program until destroyed below.
    let result = unsafe {
        let compiled = nv::compile_program(prog, &opts);
        let log = nv::get_program_log(prog)
            .map(|l| {
                let bytes: Vec<u8> = l.iter().map(|&c| c as u8).take_while(|&c| c != 0).collect();
                String::from_utf8_lossy(&bytes).into_owned()
            })
            .unwrap_or_default();
        match compiled {
            Err(_) => Err(Error::KernelCompile {
                name: name.to_string(),
                arch: format!("sm_{arch}"),
                log: log.trim().to_string(),
            }),
            Ok(()) => {
                let mut size = 0usize;
                nvsys::nvrtcGetCUBINSize(prog, &mut size)
                    .result()
                    .map_err(nv_err("nvrtcGetCUBINSize"))
                    .and_then(|()| {
                        let mut cubin = vec![0u8; size];
                        nvsys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast())
                            .result()
                            .map_err(nv_err("nvrtcGetCUBIN"))
                            .map(|()| (cubin, log))
                    })
            }
        }
    };
    // SAFETY: created above, destroyed once.
    let _ = unsafe { nv::destroy_program(prog) };
    result
}

/// FNV-1a, 64 bits: a stable hash for cache keys (std's hasher may change between
/// Rust releases).
pub(crate) fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for p in parts {
        for &b in *p {
            h ^= b as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

pub(crate) fn cache_dir() -> Option<PathBuf> {
    if std::env::var_os("EMBER_KERNEL_CACHE").is_some_and(|v| v == "0") {
        return None;
    }
    if let Some(d) = std::env::var_os("EMBER_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("ember").join("kernels"))
}

type CubinCache = Mutex<HashMap<u64, Arc<Vec<u8>>>>;

fn memory_cache() -> &'static CubinCache {
    static CACHE: OnceLock<CubinCache> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Where a cubin came from (for tests and `ember devices`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CubinOrigin {
    Memory,
    Disk,
    Compiled,
}

/// Whether `options` add include folders: headers there may change between runs
/// without changing the cache key (the source and options), so such a kernel is
/// cached in memory only.
fn includes_user_headers(options: &[String]) -> bool {
    options
        .iter()
        .any(|o| o.starts_with("-I") || o.starts_with("--include-path"))
}

/// [`compile`] through the in-memory and on-disk caches (memory only for kernels
/// compiled with include folders of their own).
pub(crate) fn cubin(
    name: &str,
    source: &str,
    arch: u32,
    options: &[String],
) -> Result<(Arc<Vec<u8>>, CubinOrigin)> {
    let (major, minor) = version()?;
    let ver = format!("{major}.{minor}");
    let arch_s = arch.to_string();
    let mut parts: Vec<&[u8]> = vec![source.as_bytes(), ver.as_bytes(), arch_s.as_bytes()];
    parts.extend(options.iter().map(|o| o.as_bytes()));
    let key = fnv1a(&parts);
    if let Some(c) = memory_cache()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&key)
    {
        return Ok((c.clone(), CubinOrigin::Memory));
    }
    let file = cache_dir()
        .filter(|_| !includes_user_headers(options))
        .map(|d| d.join(format!("{name}-sm_{arch}-{key:016x}.cubin")));
    let mut origin = CubinOrigin::Compiled;
    let bytes = match file.as_ref().and_then(|f| std::fs::read(f).ok()) {
        // a cubin is an ELF file; anything else in the cache is ignored
        Some(b) if b.starts_with(b"\x7fELF") => {
            origin = CubinOrigin::Disk;
            b
        }
        _ => {
            let b = compile(name, source, arch, options)?;
            if let Some(f) = &file {
                // best effort: a read-only cache only costs a recompile
                if let Some(dir) = f.parent() {
                    let _ = std::fs::create_dir_all(dir);
                }
                let _ = crate::files::write_atomic(f, &b);
            }
            b
        }
    };
    let bytes = Arc::new(bytes);
    memory_cache()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, bytes.clone());
    Ok((bytes, origin))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_architecture_is_the_gpus_or_an_older_one_of_its_major() {
        let cuda13 = [75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121];
        let v = (13, 0);
        assert_eq!(target_arch(90, &cuda13, v).unwrap(), 90);
        assert_eq!(target_arch(86, &cuda13, v).unwrap(), 86);
        // a minor revision this NVRTC does not list runs the major's newest below
        assert_eq!(target_arch(122, &cuda13, v).unwrap(), 121);
        assert_eq!(target_arch(92, &cuda13, v).unwrap(), 90);
        let old = target_arch(70, &cuda13, v).unwrap_err();
        assert!(
            old.contains("sm_75 to sm_121") && old.contains("sm_70") && old.contains("no longer"),
            "{old}"
        );
        let new = target_arch(130, &cuda13, v).unwrap_err();
        assert!(new.contains("newer than this NVRTC"), "{new}");
    }

    #[test]
    fn kernels_with_their_own_include_folders_skip_the_disk_cache() {
        let o = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(!includes_user_headers(&o(&["-use_fast_math", "-DN=4"])));
        assert!(includes_user_headers(&o(&["-I/home/me/kernels"])));
        assert!(includes_user_headers(&o(&["--include-path=inc"])));
    }

    /// One kernel's resources as ptxas reports them: (registers per thread, bytes
    /// of spill stores, bytes of stack frame), by kernel name.
    fn kernel_resources(log: &str) -> Vec<(String, u32, u32, u32)> {
        let mut out: Vec<(String, u32, u32, u32)> = Vec::new();
        let number = |line: &str, before: &str| -> Option<u32> {
            let head = &line[..line.find(before)?];
            head.split_whitespace().last()?.parse().ok()
        };
        for line in log.lines() {
            if let Some(rest) = line.split("Compiling entry function '").nth(1) {
                let name = rest.split('\'').next().unwrap_or_default();
                out.push((name.to_string(), 0, 0, 0));
            } else if let Some(k) = out.last_mut() {
                if let Some(spill) = number(line, "bytes spill stores") {
                    k.2 = spill;
                    k.3 = number(line, "bytes stack frame").unwrap_or(0);
                } else if let Some(regs) = line.split("Used ").nth(1) {
                    k.1 = regs
                        .split_whitespace()
                        .next()
                        .and_then(|r| r.parse().ok())
                        .unwrap_or(0);
                }
            }
        }
        out
    }

    #[test]
    fn ptxas_reports_are_read() {
        // NVRTC 13.0's log for two kernels, the second spilling
        let log = "ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k' for 'sm_90'
ptxas info    : Function properties for k
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers
ptxas info    : Compiling entry function 'big_f32' for 'sm_90'
ptxas info    : Function properties for big_f32
ptxas         .     8 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 8 bytes cumulative stack size
ptxas info    : Compile time = 18.524 ms";
        assert_eq!(
            kernel_resources(log),
            [
                ("k".to_string(), 8, 0, 0),
                ("big_f32".to_string(), 255, 8, 8)
            ]
        );
    }

    /// Compiles every ember kernel, for every dtype, for `sm_{arch}`. Without NVRTC
    /// it says so and passes, unless `EMBER_REQUIRE_NVRTC=1` (set by CI, which
    /// installs NVRTC from PyPI) makes a missing NVRTC a failure. One test per
    /// architecture, so the test harness compiles them in parallel.
    ///
    /// For sm_90 ptxas also reports each kernel's registers: a block needs
    /// registers × threads of the multiprocessor's 64 Ki, or the launch fails on a
    /// GPU (which the simulator cannot see); every kernel runs 256 threads or fewer
    /// (the attention kernels declare their 128 as launch bounds, the per-channel
    /// sums' width is checked where it is defined), which any register count
    /// allows. Kernels that spill or keep a stack frame are printed (`--nocapture`).
    fn every_kernel_compiles_for(arch: u32) {
        if let Err(e) = ensure_nvrtc() {
            assert!(
                std::env::var_os("EMBER_REQUIRE_NVRTC").is_none_or(|v| v == "0"),
                "EMBER_REQUIRE_NVRTC is set but NVRTC is missing: {e}"
            );
            eprintln!("skipped: {e}");
            return;
        }
        let archs = supported_archs().unwrap();
        assert!(archs.contains(&arch), "NVRTC lacks sm_{arch}: {archs:?}");
        let verbose = ["--ptxas-options=--verbose".to_string()];
        let options: &[String] = if arch == 90 { &verbose } else { &[] };
        let mut kernels = 0;
        // EMBER_KERNEL_FILE=attention: that kernel file only; EMBER_KERNEL_DUMP=DIR:
        // each module's source, cubin and ptxas's report written there (for a
        // disassembler: `cuobjdump -sass`, see bench/sass_loops.py)
        let only = std::env::var("EMBER_KERNEL_FILE").ok();
        assert!(
            only.as_deref()
                .is_none_or(|o| SOURCES.iter().any(|(n, _)| *n == o)),
            "EMBER_KERNEL_FILE={only:?}: no such kernel file"
        );
        let dump = std::env::var_os("EMBER_KERNEL_DUMP").map(std::path::PathBuf::from);
        for (name, _) in SOURCES {
            if only.as_deref().is_some_and(|o| o != *name) {
                continue;
            }
            for dt in ["bool", "u8", "i64", "f16", "bf16", "f32", "f64"] {
                let src = ember_source(name, dt).unwrap();
                let (cubin, log) = compile_logged(name, &src, arch, options)
                    .unwrap_or_else(|e| panic!("{name} ({dt}) for sm_{arch}: {e}"));
                if let Some(dir) = &dump {
                    let path = dir.join(format!("{name}_{dt}_sm{arch}"));
                    std::fs::write(path.with_extension("cubin"), &cubin).unwrap();
                    std::fs::write(path.with_extension("log"), &log).unwrap();
                    std::fs::write(path.with_extension("cu"), &src).unwrap();
                }
                assert!(cubin.starts_with(b"\x7fELF"), "{name}: not a cubin");
                if options.is_empty() {
                    continue;
                }
                for (kernel, regs, spill, stack) in kernel_resources(&log) {
                    kernels += 1;
                    assert!(
                        regs > 0,
                        "{kernel}: no register count in ptxas's report\n{log}"
                    );
                    // EMBER_KERNEL_RESOURCES=1: every kernel's, not only those with a stack
                    if spill > 0
                        || stack > 0
                        || std::env::var_os("EMBER_KERNEL_RESOURCES").is_some()
                    {
                        eprintln!("{kernel}: {regs} registers, {spill} bytes spilled, {stack} bytes of stack");
                    }
                }
            }
        }
        // every module reported its kernels (the report's format is as parsed)
        assert!(
            options.is_empty() || kernels > if only.is_some() { 0 } else { 300 },
            "{kernels} kernels reported"
        );
    }

    // CUDA 13's NVRTC starts at sm_75 (Volta's sm_70 was dropped in CUDA 13).
    // The oldest and the newest architecture ember runs on: the kernels' branches
    // on sm_80 (bfloat16's `cvt`, the attention's `mma` and `cp.async`) and the
    // headers' are compiled on both sides by these two. (sm_80 was a third test until
    // CI's time asked for the minute and a half it took.)
    #[test]
    fn every_kernel_compiles_for_turing_sm75() {
        every_kernel_compiles_for(75);
    }

    #[test]
    fn every_kernel_compiles_for_hopper_sm90() {
        every_kernel_compiles_for(90);
    }

    #[test]
    fn compile_errors_carry_the_log_with_line_numbers() {
        if ensure_nvrtc().is_err() {
            eprintln!("skipped: NVRTC not found");
            return;
        }
        let src = "extern \"C\" __global__ void k(float* x) {\n  x[0] = undefined_thing;\n}\n";
        let e = compile("broken", src, 80, &[]).unwrap_err().to_string();
        assert!(e.contains("broken"), "{e}");
        assert!(e.contains("undefined_thing"), "{e}");
        assert!(e.contains("broken.cu(2)"), "{e}");
    }

    #[test]
    fn disk_cache_skips_compilation() {
        if ensure_nvrtc().is_err() {
            eprintln!("skipped: NVRTC not found");
            return;
        }
        // a unique source so that neither cache holds it yet
        let tag = format!(
            "{}_{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        );
        let src = format!("extern \"C\" __global__ void k_{tag}(float* x) {{ x[0] = 1.0f; }}\n");
        let (a, o1) = cubin("cache_test", &src, 80, &[]).unwrap();
        assert_eq!(o1, CubinOrigin::Compiled);
        let (b, o2) = cubin("cache_test", &src, 80, &[]).unwrap();
        assert_eq!(o2, CubinOrigin::Memory);
        assert_eq!(a, b);
        if cache_dir().is_some() {
            memory_cache().lock().unwrap().clear();
            let (c, o3) = cubin("cache_test", &src, 80, &[]).unwrap();
            assert_eq!(o3, CubinOrigin::Disk);
            assert_eq!(a, c);
        }
    }

    #[test]
    fn hash_is_stable() {
        // part boundaries count: ("ab", "c") and ("a", "bc") are different keys
        assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]));
    }
}
