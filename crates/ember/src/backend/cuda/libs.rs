//! Finding the CUDA libraries (driver, NVRTC, cuBLAS, cuDNN) and headers where
//! users have them.
//!
//! cudarc opens each library by its usual file names through the system loader and
//! panics when none loads. ember looks first, in this order:
//!
//! 1. `EMBER_CUDA_LIB_DIR` (one or more folders, `:`-separated);
//! 2. the loader's own search path (`LD_LIBRARY_PATH`, `ldconfig`'s cache);
//! 3. `CUDA_HOME` / `CUDA_PATH` (`lib64`, `lib`), then `/usr/local/cuda*/lib64`;
//! 4. the `nvidia/*/lib` folders of pip installs (`pip install nvidia-cuda-nvrtc`),
//!    under the active virtual environment, `~/.local`, pyenv and the system Pythons.
//!
//! A library found outside the loader's path is opened by its full path with
//! `RTLD_GLOBAL` before cudarc asks for it by name; the system loader then hands
//! cudarc that same library, since it is already loaded under that name. The folder
//! each library came from is recorded, and `ember devices` prints it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// A CUDA library ember uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CudaLib {
    /// `libcuda.so`, installed with the NVIDIA driver.
    Driver,
    /// `libnvrtc.so`: compiles ember's CUDA C kernels at run time.
    Nvrtc,
    /// `libcublas.so` (and `libcublasLt.so`): matrix multiplication.
    Cublas,
    /// `libcudnn.so.9` (and its sub-libraries): convolutions, where switched on
    /// with `ember::cuda::cudnn::set_enabled`. Optional.
    Cudnn,
    /// `libnccl.so.2`: the collectives of the distributed NCCL backend. Optional.
    Nccl,
}

impl CudaLib {
    /// Every library, in the order `ember devices` lists them.
    pub const ALL: [CudaLib; 5] = [
        CudaLib::Driver,
        CudaLib::Nvrtc,
        CudaLib::Cublas,
        CudaLib::Cudnn,
        CudaLib::Nccl,
    ];

    /// `true` for the libraries ember works without (cuDNN, NCCL).
    pub fn is_optional(self) -> bool {
        matches!(self, CudaLib::Cudnn | CudaLib::Nccl)
    }

    /// The file names tried, most specific first (CUDA 13 first, then older majors
    /// whose ABI cudarc also accepts).
    fn file_names(self) -> &'static [&'static str] {
        match self {
            CudaLib::Driver => &["libcuda.so.1", "libcuda.so"],
            CudaLib::Nvrtc => &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"],
            CudaLib::Cublas => &["libcublas.so.13", "libcublas.so.12", "libcublas.so"],
            CudaLib::Cudnn => &["libcudnn.so.9"],
            CudaLib::Nccl => &["libnccl.so.2", "libnccl.so"],
        }
    }

    /// Libraries that must be loaded from the same folder first, by file-name prefix
    /// (their versions follow the toolkit's minor version).
    fn companions(self) -> &'static [&'static str] {
        match self {
            // NVRTC opens its builtins library by name when it compiles
            CudaLib::Nvrtc => &["libnvrtc-builtins.so"],
            CudaLib::Cublas => &["libcublasLt.so"],
            // cuDNN 9 opens these by name from the one it was asked for
            CudaLib::Cudnn => &[
                "libcudnn_graph.so",
                "libcudnn_ops.so",
                "libcudnn_cnn.so",
                "libcudnn_heuristic.so",
                "libcudnn_engines_precompiled.so",
                "libcudnn_engines_runtime_compiled.so",
            ],
            _ => &[],
        }
    }

    /// The pip package that ships the library (for the error message).
    fn pip_package(self) -> Option<&'static str> {
        match self {
            CudaLib::Driver => None,
            CudaLib::Nvrtc => Some("nvidia-cuda-nvrtc"),
            CudaLib::Cublas => Some("nvidia-cublas"),
            CudaLib::Cudnn => Some("nvidia-cudnn-cu13"),
            CudaLib::Nccl => Some("nvidia-nccl-cu13"),
        }
    }

    /// A short name: `driver`, `nvrtc`, `cublas`.
    pub fn name(self) -> &'static str {
        match self {
            CudaLib::Driver => "driver",
            CudaLib::Nvrtc => "nvrtc",
            CudaLib::Cublas => "cublas",
            CudaLib::Cudnn => "cudnn",
            CudaLib::Nccl => "nccl",
        }
    }
}

/// Where a library was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LibSource {
    /// Opened by name through the system loader's search path.
    LoaderPath(String),
    /// Opened by full path from a folder ember searched.
    Path(PathBuf),
}

impl std::fmt::Display for LibSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LibSource::LoaderPath(name) => write!(f, "{name} (system loader path)"),
            LibSource::Path(p) => write!(f, "{}", p.display()),
        }
    }
}

type Found = std::result::Result<LibSource, String>;

fn found() -> &'static Mutex<BTreeMap<CudaLib, Found>> {
    static FOUND: OnceLock<Mutex<BTreeMap<CudaLib, Found>>> = OnceLock::new();
    FOUND.get_or_init(|| Mutex::new(BTreeMap::new()))
}

/// Makes `lib` loadable for cudarc, searching the places listed in the module
/// documentation. Returns where it was found, or a message that names the library,
/// the places searched and how to point ember at it. The answer is remembered.
pub fn ensure(lib: CudaLib) -> std::result::Result<LibSource, String> {
    let mut map = found().lock().unwrap_or_else(|p| p.into_inner());
    map.entry(lib).or_insert_with(|| locate(lib)).clone()
}

/// What [`ensure`] found for every library it was asked about so far.
#[cfg(test)]
fn loaded() -> Vec<(CudaLib, std::result::Result<LibSource, String>)> {
    let map = found().lock().unwrap_or_else(|p| p.into_inner());
    map.iter().map(|(k, v)| (*k, v.clone())).collect()
}

fn env_dirs(var: &str) -> Vec<PathBuf> {
    std::env::var_os(var)
        .map(|v| {
            std::env::split_paths(&v)
                .filter(|p| !p.as_os_str().is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// The entries of `parent` whose names start with `prefix`, newest version first.
fn glob_dirs(parent: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(parent)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default();
    // newest version first (cuda-13.0 before cuda-12.4)
    out.sort();
    out.reverse();
    out
}

/// The `site-packages` folders of the Pythons a user may have installed pip's
/// NVIDIA wheels into.
fn site_packages() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Some(v) = std::env::var_os("VIRTUAL_ENV") {
        roots.push(PathBuf::from(v));
    }
    if let Some(v) = std::env::var_os("CONDA_PREFIX") {
        roots.push(PathBuf::from(v));
    }
    if let Some(home) = std::env::var_os("HOME").map(PathBuf::from) {
        roots.push(home.join(".local"));
        roots.extend(glob_dirs(&home.join(".pyenv/versions"), ""));
    }
    roots.extend(["/usr/local", "/usr", "/opt/conda"].map(PathBuf::from));
    let mut out = Vec::new();
    for root in roots {
        for py in glob_dirs(&root.join("lib"), "python3") {
            for sub in ["site-packages", "dist-packages"] {
                let p = py.join(sub);
                if p.is_dir() {
                    out.push(p);
                }
            }
        }
    }
    out
}

/// Folders searched after the loader path: CUDA installs, then pip wheels.
fn search_dirs(sub_lib: &[&str]) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"] {
        for d in env_dirs(var) {
            for s in sub_lib {
                dirs.push(d.join(s));
            }
        }
    }
    let mut installs = vec![PathBuf::from("/usr/local/cuda")];
    installs.extend(glob_dirs(Path::new("/usr/local"), "cuda-"));
    installs.push(PathBuf::from("/opt/cuda"));
    for d in installs {
        for s in sub_lib {
            dirs.push(d.join(s));
        }
    }
    for sp in site_packages() {
        // cu13 wheels put everything in nvidia/cu13/lib; cu12 ones use one folder
        // per library (nvidia/cuda_nvrtc/lib, nvidia/cublas/lib, ...)
        for d in glob_dirs(&sp.join("nvidia"), "") {
            dirs.push(d.join(sub_lib.last().copied().unwrap_or("lib")));
        }
    }
    dirs.retain(|d| d.is_dir());
    dirs.dedup();
    dirs
}

fn lib_dirs() -> Vec<PathBuf> {
    search_dirs(&["lib64", "lib"])
}

/// Opens `path` with `RTLD_GLOBAL` and keeps it loaded for the life of the process.
fn preload(path: &Path) -> std::result::Result<(), String> {
    use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
    // SAFETY: loading a CUDA library runs its initialisers, which only set up the
    // library itself.
    let lib = unsafe { Library::open(Some(path), RTLD_NOW | RTLD_GLOBAL) }
        .map_err(|e| format!("{}: {e}", path.display()))?;
    std::mem::forget(lib);
    Ok(())
}

fn loadable_by_name(name: &str) -> bool {
    use libloading::os::unix::{Library, RTLD_LAZY, RTLD_LOCAL};
    // SAFETY: as in `preload`; the handle is dropped at once.
    unsafe { Library::open(Some(name), RTLD_LAZY | RTLD_LOCAL) }.is_ok()
}

fn locate(lib: CudaLib) -> Found {
    if std::env::var_os("EMBER_DISABLE_CUDA").is_some_and(|v| v != "0") {
        return Err("disabled by the EMBER_DISABLE_CUDA environment variable".into());
    }
    let user_dirs = env_dirs("EMBER_CUDA_LIB_DIR");
    let mut tried: Vec<String> = Vec::new();
    let mut errors: Vec<String> = Vec::new();
    let mut from_dir = |dir: &Path, tried: &mut Vec<String>| -> Option<Found> {
        tried.push(dir.display().to_string());
        let file = lib
            .file_names()
            .iter()
            .map(|n| dir.join(n))
            .find(|p| p.exists())?;
        for prefix in lib.companions() {
            // the newest of e.g. libnvrtc-builtins.so.13.0 / .so.13.2
            if let Some(p) = glob_dirs(dir, prefix).first() {
                if let Err(e) = preload(p) {
                    errors.push(e);
                }
            }
        }
        match preload(&file) {
            Ok(()) => Some(Ok(LibSource::Path(file))),
            Err(e) => {
                errors.push(e);
                None
            }
        }
    };
    for d in &user_dirs {
        if let Some(f) = from_dir(d, &mut tried) {
            return f;
        }
    }
    if let Some(name) = lib.file_names().iter().find(|n| loadable_by_name(n)) {
        return Ok(LibSource::LoaderPath(name.to_string()));
    }
    tried.push("the system loader path".into());
    if lib != CudaLib::Driver {
        for d in lib_dirs() {
            if user_dirs.contains(&d) {
                continue;
            }
            if let Some(f) = from_dir(&d, &mut tried) {
                return f;
            }
        }
    }
    let mut msg = format!(
        "the CUDA library {} could not be loaded (looked in: {})",
        lib.file_names()[0],
        tried.join(", ")
    );
    if !errors.is_empty() {
        msg.push_str(&format!("; errors: {}", errors.join("; ")));
    }
    msg.push_str(match lib {
        CudaLib::Driver => {
            "; install the NVIDIA driver, or add the folder holding libcuda.so.1 to \
             LD_LIBRARY_PATH or EMBER_CUDA_LIB_DIR"
        }
        CudaLib::Cudnn => "; install cuDNN 9 or the pip package ",
        CudaLib::Nccl => "; install NCCL 2 or the pip package ",
        _ => "; install the CUDA toolkit or the pip package ",
    });
    if let Some(pkg) = lib.pip_package() {
        msg.push_str(&format!(
            "{pkg} (pip install {pkg}), or point EMBER_CUDA_LIB_DIR or CUDA_HOME at the folder that holds it"
        ));
    }
    Err(msg)
}

/// Folders holding the CUDA headers ember's and users' kernels may include
/// (`cuda_fp16.h`, `cuda_bf16.h`): `EMBER_CUDA_INCLUDE_DIR`, the CUDA installs and
/// pip's `nvidia/*/include`. Only folders that hold `cuda_fp16.h` are returned.
pub fn include_dirs() -> Vec<PathBuf> {
    let mut dirs = env_dirs("EMBER_CUDA_INCLUDE_DIR");
    dirs.extend(search_dirs(&["include"]));
    dirs.retain(|d| d.join("cuda_fp16.h").is_file());
    dirs.dedup();
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_names_itself_and_the_fix() {
        // A folder without any CUDA library: the answer for the driver depends on the
        // machine, but the message format does not.
        let msg = match ensure(CudaLib::Driver) {
            Ok(src) => {
                assert!(!src.to_string().is_empty());
                return;
            }
            Err(m) => m,
        };
        assert!(msg.contains("libcuda.so.1"), "{msg}");
        assert!(msg.contains("EMBER_CUDA_LIB_DIR"), "{msg}");
        assert!(loaded().iter().any(|(l, _)| *l == CudaLib::Driver));
    }

    #[test]
    fn glob_sorts_newest_first() {
        let dir = std::env::temp_dir().join(format!("ember-glob-{}", std::process::id()));
        for v in ["cuda-12.4", "cuda-13.0", "other"] {
            std::fs::create_dir_all(dir.join(v)).unwrap();
        }
        let found = glob_dirs(&dir, "cuda-");
        let names: Vec<_> = found
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["cuda-13.0", "cuda-12.4"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
