//! Compiling a kernel's `.cu` source with the host's C++ compiler (the prelude
//! standing in for the CUDA runtime), cached next to NVRTC's cubins.

use super::*;

/// The host compiler and its version line (part of the cache key).
pub(super) fn compiler() -> Result<&'static (String, String)> {
    static CXX: OnceLock<std::result::Result<(String, String), String>> = OnceLock::new();
    CXX.get_or_init(|| {
        let cxx = std::env::var("EMBER_SIM_CXX").unwrap_or_else(|_| "c++".into());
        let out = std::process::Command::new(&cxx)
            .arg("--version")
            .output()
            .map_err(|e| {
                format!(
                    "the CUDA simulator compiles kernels with a C++ compiler, and `{cxx}` \
                     could not be run ({e}); install g++ or clang++, or name one in EMBER_SIM_CXX"
                )
            })?;
        let version = String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or("")
            .to_string();
        Ok((cxx, version))
    })
    .as_ref()
    .map_err(|msg| Error::CudaUnavailable {
        reason: msg.clone(),
    })
}

/// The compiler flags `EMBER_SIM_SANITIZE` asks for (empty without it).
fn sanitize_flags() -> Result<&'static [&'static str]> {
    static FLAGS: OnceLock<std::result::Result<&'static [&'static str], String>> = OnceLock::new();
    FLAGS
        .get_or_init(|| {
            let v = std::env::var("EMBER_SIM_SANITIZE").unwrap_or_default();
            match v.trim() {
                "" | "0" => Ok(&[][..]),
                // the fibers' stacks are switched by hand: stack checks would
                // misread them, so only heap (device memory) and globals (shared
                // memory) are checked
                "address" | "1" => Ok(&[
                    "-fsanitize=address",
                    "-fno-omit-frame-pointer",
                    "-fno-sanitize-address-use-after-scope",
                    "--param=asan-stack=0",
                ][..]),
                other => Err(format!(
                    "EMBER_SIM_SANITIZE={other}: the simulator knows `address` only"
                )),
            }
        })
        .as_ref()
        .map(|f| *f)
        .map_err(|msg| Error::CudaUnavailable {
            reason: msg.clone(),
        })
}

/// Rewrites `extern __shared__ T name[];` (dynamic shared memory) as a pointer to
/// the simulator's dynamic shared buffer.
fn rewrite_dynamic_shared(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(at) = rest.find("extern __shared__") {
        let (before, decl) = rest.split_at(at);
        out.push_str(before);
        let Some(end) = decl.find(';') else {
            out.push_str(decl);
            return out;
        };
        let body = decl["extern __shared__".len()..end].trim();
        let body = body.trim_end_matches(|c: char| c == ']' || c == '[' || c.is_whitespace());
        let split = body
            .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
            .map_or(0, |i| i + 1);
        let (ty, name) = body.split_at(split);
        let ty = ty.trim();
        let ty = match ty.strip_prefix("__align__") {
            // drop `__align__(n)`: the buffer is aligned to 256 bytes
            Some(t) => t.split_once(')').map_or(ty, |(_, t)| t.trim()),
            None => ty,
        };
        out.push_str(&format!(
            "{ty}* const {name} = ({ty}*)::ember_sim::dyn_smem;"
        ));
        rest = &decl[end + 1..];
    }
    out.push_str(rest);
    out
}

/// What `__launch_bounds__(...)` becomes in the pass that finds the kernels.
const BOUNDS_MARK: &str = "__ember_sim_launch_bounds__";

/// A kernel of a module: its name and the text of its `__launch_bounds__`'
/// first argument (the most threads per block), if it has one.
#[derive(Debug, PartialEq)]
struct KernelDecl {
    name: String,
    max_threads: Option<String>,
}

/// Strips a `BOUNDS_MARK(args)` from the front of `t`, returning the first
/// argument's text and the rest.
fn strip_bounds(t: &str) -> Option<(String, &str)> {
    let t = t.trim_start().strip_prefix(BOUNDS_MARK)?.trim_start();
    let t = t.strip_prefix('(')?;
    let (mut depth, mut end) = (1, None);
    for (i, c) in t.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    end = Some(i);
                    break;
                }
            }
            _ => {}
        }
    }
    let end = end?;
    let args = &t[..end];
    let mut depth = 0;
    let first_end = args
        .char_indices()
        .find(|&(_, c)| {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ => {}
            }
            c == ',' && depth == 0
        })
        .map_or(args.len(), |(i, _)| i);
    Some((args[..first_end].trim().to_string(), &t[end + 1..]))
}

/// The `extern "C"` kernels of a preprocessed source where `__global__` was defined
/// as the marker and `__launch_bounds__` as [`BOUNDS_MARK`].
fn kernel_decls(preprocessed: &str, marker: &str) -> Vec<KernelDecl> {
    let mut decls: Vec<KernelDecl> = Vec::new();
    let mut rest = preprocessed;
    while let Some(at) = rest.find(marker) {
        let before = rest[..at].trim_end();
        rest = &rest[at + marker.len()..];
        if !before.ends_with("extern \"C\"") {
            continue;
        }
        // `__launch_bounds__` stands before or after the return type
        let mut t = rest;
        let mut bounds = None;
        if let Some((b, after)) = strip_bounds(t) {
            bounds = Some(b);
            t = after;
        }
        let Some(after_void) = t.trim_start().strip_prefix("void") else {
            continue;
        };
        t = after_void;
        if let Some((b, after)) = strip_bounds(t) {
            bounds = Some(b);
            t = after;
        }
        let name: String = t
            .trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() && !decls.iter().any(|d| d.name == name) {
            decls.push(KernelDecl {
                name,
                max_threads: bounds,
            });
        }
    }
    decls
}

fn run_compiler(args: &[&str], name: &str) -> Result<String> {
    let (cxx, _) = compiler()?;
    let out = std::process::Command::new(cxx)
        .args(args)
        .output()
        .map_err(|e| Error::Cuda {
            op: "simulator: running the C++ compiler",
            msg: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(Error::KernelCompile {
            name: name.to_string(),
            arch: "the CUDA simulator (host C++)".into(),
            log: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Compiles CUDA C `source` (file name `name`.cu in messages) for the simulator,
/// through an in-memory and an on-disk cache. `options` may hold `-D` and `-I`
/// options; other NVRTC options mean nothing here and are ignored.
pub(crate) fn compile(name: &str, source: &str, options: &[String]) -> Result<Arc<SimModule>> {
    type Cache = Mutex<HashMap<u64, Arc<SimModule>>>;
    static MODULES: OnceLock<Cache> = OnceLock::new();
    let (_, version) = compiler()?;
    let opts: Vec<&str> = options
        .iter()
        .map(|s| s.as_str())
        .filter(|o| o.starts_with("-D") || o.starts_with("-I"))
        .collect();
    let sanitize = sanitize_flags()?;
    let mut parts: Vec<&[u8]> = vec![PRELUDE.as_bytes(), source.as_bytes(), version.as_bytes()];
    parts.extend(opts.iter().map(|o| o.as_bytes()));
    parts.extend(sanitize.iter().map(|o| o.as_bytes()));
    let key = crate::backend::cuda::nvrtc::fnv1a(&parts);
    let modules = MODULES.get_or_init(|| Mutex::new(HashMap::new()));
    let mut cache = modules.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(m) = cache.get(&key) {
        return Ok(m.clone());
    }
    let dir = crate::backend::cuda::nvrtc::cache_dir()
        .unwrap_or_else(|| std::env::temp_dir().join("ember-sim"))
        .join("sim");
    std::fs::create_dir_all(&dir).map_err(|e| Error::Cuda {
        op: "simulator: creating the module cache",
        msg: format!("{}: {e}", dir.display()),
    })?;
    let lib_path = dir.join(format!("{name}-{key:016x}.so"));
    if !lib_path.is_file() {
        build(name, source, &opts, &dir, &lib_path, key)?;
    }
    use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
    // SAFETY: a library built above from ember's prelude and the given source; its
    // initialisers only set up static data.
    let lib = unsafe { Library::open(Some(&lib_path), RTLD_NOW | RTLD_LOCAL) }.map_err(|e| {
        let hint = if sanitize.is_empty() {
            ""
        } else {
            " (kernels built for EMBER_SIM_SANITIZE need the sanitizer's runtime loaded \
             first: LD_PRELOAD=$(c++ -print-file-name=libasan.so), as .ci/memcheck does)"
        };
        Error::Cuda {
            op: "simulator: loading a module",
            msg: format!("{e}{hint}"),
        }
    })?;
    // SAFETY: a `const int` the module defines (EMBER_SIM_FIBERS in prelude.h).
    let fibers = unsafe { lib.get::<*const i32>(b"__ember_sim_fibers\0") }
        .map(|p| unsafe { **p } != 0)
        .map_err(|e| Error::Cuda {
            op: "simulator: loading a module",
            msg: e.to_string(),
        })?;
    let m = Arc::new(SimModule {
        lib: lib.into(),
        fibers,
    });
    cache.insert(key, m.clone());
    Ok(m)
}

fn build(
    name: &str,
    source: &str,
    opts: &[&str],
    dir: &std::path::Path,
    lib_path: &std::path::Path,
    key: u64,
) -> Result<()> {
    // unique per process and thread, renamed into place when complete
    let tag = format!("{}-{:?}", std::process::id(), std::thread::current().id())
        .replace(|c: char| !c.is_alphanumeric() && c != '-', "");
    let cpp = dir.join(format!("{name}-{key:016x}.{tag}.cpp"));
    let so = dir.join(format!("{name}-{key:016x}.{tag}.so"));
    let body = rewrite_dynamic_shared(source);
    const USER: &str = "#pragma ember_sim_user_source";
    let text = format!("{PRELUDE}\n{USER}\n#line 1 \"{name}.cu\"\n{body}\n");
    let write = |p: &std::path::Path, s: &str| {
        std::fs::write(p, s).map_err(|e| Error::Cuda {
            op: "simulator: writing a source file",
            msg: format!("{}: {e}", p.display()),
        })
    };
    write(&cpp, &text)?;
    let cpp_s = cpp.to_string_lossy().into_owned();
    const MARK: &str = "__ember_sim_kernel_marker__";
    let mut pre_args = vec!["-std=c++17", "-E", "-P", "-w", "-x", "c++"];
    let mark_def = format!("-D__global__={MARK}");
    pre_args.push(&mark_def);
    let bounds_def = format!("-D__launch_bounds__(...)={BOUNDS_MARK}(__VA_ARGS__)");
    pre_args.push(&bounds_def);
    pre_args.extend(opts);
    pre_args.push(&cpp_s);
    let pre = run_compiler(&pre_args, name);
    let pre = match pre {
        Ok(p) => p,
        Err(e) => {
            let _ = std::fs::remove_file(&cpp);
            return Err(e);
        }
    };
    let decls = kernel_decls(&pre, MARK);
    // threads that may wait at a barrier, a shuffle or another warp-wide
    // exchange need fibers; the macros and headers of the source are expanded
    // here, the prelude's own uses left out
    let user = pre.split_once(USER).map_or(pre.as_str(), |(_, u)| u);
    let fibers = [
        "__syncthreads",
        "__syncwarp",
        "__shfl",
        "__ember_sim_warp_all",
    ]
    .iter()
    .any(|w| user.contains(w));
    let mut full = text;
    full.push_str(&format!("EMBER_SIM_FIBERS({})\n", fibers as i32));
    for d in &decls {
        full.push_str(&format!("EMBER_SIM_ENTRY({})\n", d.name));
        if let Some(t) = &d.max_threads {
            full.push_str(&format!("EMBER_SIM_MAX_THREADS({}, ({t}))\n", d.name));
        }
    }
    write(&cpp, &full)?;
    let so_s = so.to_string_lossy().into_owned();
    let mut args = vec![
        "-std=c++17",
        "-O1",
        "-fPIC",
        "-shared",
        "-fvisibility=hidden",
        "-Wl,-Bsymbolic",
        "-w",
        "-x",
        "c++",
    ];
    args.extend(opts);
    args.extend(sanitize_flags()?);
    args.extend([cpp_s.as_str(), "-o", so_s.as_str()]);
    let built = run_compiler(&args, name);
    let _ = std::fs::remove_file(&cpp);
    built?;
    std::fs::rename(&so, lib_path).map_err(|e| Error::Cuda {
        op: "simulator: storing a module",
        msg: format!("{}: {e}", lib_path.display()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamic_shared_memory_becomes_a_pointer() {
        let s = "extern __shared__ float tile[];\n__global__ void k() { extern __shared__ __align__(16) double d[ ]; }";
        let r = rewrite_dynamic_shared(s);
        assert!(
            r.contains("float* const tile = (float*)::ember_sim::dyn_smem;"),
            "{r}"
        );
        assert!(
            r.contains("double* const d = (double*)::ember_sim::dyn_smem;"),
            "{r}"
        );
    }

    #[test]
    fn kernel_names_are_the_extern_c_ones() {
        let m = "__ember_sim_kernel_marker__";
        let pre = format!(
            "extern \"C\" {m} void add_f32(float* x) {{}}\nstatic {m} void helper() {{}}\n\
             extern \"C\"   {m}\n void  mv (const float* a) {{}}"
        );
        let names: Vec<String> = kernel_decls(&pre, m).into_iter().map(|d| d.name).collect();
        assert_eq!(names, ["add_f32", "mv"]);
    }

    #[test]
    fn launch_bounds_are_read_before_or_after_the_return_type() {
        let m = "__ember_sim_kernel_marker__";
        let b = BOUNDS_MARK;
        let pre = format!(
            "extern \"C\" {m} void {b}(256) k1(float* x) {{}}\n\
             extern \"C\" {m} {b}( 2 * 64 , 4) void k2() {{}}\n\
             extern \"C\" {m} void k3() {{}}"
        );
        let decls = kernel_decls(&pre, m);
        let got: Vec<(&str, Option<&str>)> = decls
            .iter()
            .map(|d| (d.name.as_str(), d.max_threads.as_deref()))
            .collect();
        assert_eq!(
            got,
            [("k1", Some("256")), ("k2", Some("2 * 64")), ("k3", None)]
        );
    }
}
