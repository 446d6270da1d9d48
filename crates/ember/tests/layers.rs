//! The layering rules of ARCHITECTURE.md, checked on the source: the backend
//! imports nothing above it, the CPU and CUDA backends do not import each other,
//! and the tensor layer reaches devices only through the dispatch point.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("a source folder") {
        let p = entry.expect("a folder entry").path();
        if p.is_dir() {
            out.extend(sources(&p));
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
    out
}

/// The lines of `text` (comments left out) that name one of `forbidden`, as
/// `line: text`.
fn violations(text: &str, forbidden: &[&str]) -> Vec<String> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .filter(|(_, l)| forbidden.iter().any(|f| l.contains(f)))
        .map(|(i, l)| format!("{}: {}", i + 1, l.trim()))
        .collect()
}

/// Every rule's violations in the files under `src/<dir>`.
fn check(dir: &str, forbidden: &[&str]) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(dir);
    let mut bad = Vec::new();
    for f in sources(&root) {
        let text = std::fs::read_to_string(&f).expect("a source file");
        for v in violations(&text, forbidden) {
            bad.push(format!("{}:{v}", f.display()));
        }
    }
    bad
}

const ABOVE_THE_BACKEND: &[&str] = &[
    "crate::tensor",
    "crate::Tensor",
    "crate::autograd",
    "crate::nn",
    "crate::optim",
    "crate::io",
    "crate::train",
    "crate::data",
    "crate::kernel",
];

#[test]
fn the_backend_imports_nothing_above_it() {
    let bad = check("backend", ABOVE_THE_BACKEND);
    assert!(
        bad.is_empty(),
        "backend/ imports the layers above it:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_cpu_and_cuda_backends_do_not_import_each_other() {
    let cpu = check(
        "backend/cpu",
        &["backend::cuda", "super::cuda", "super::meta"],
    );
    let cuda = check(
        "backend/cuda",
        &["backend::cpu", "super::cpu", "backend::meta"],
    );
    let meta = check(
        "backend/meta",
        &["backend::cpu", "backend::cuda", "super::cpu", "super::cuda"],
    );
    let bad = [cpu, cuda, meta].concat();
    assert!(
        bad.is_empty(),
        "one backend imports another:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_tensor_layer_reaches_devices_only_through_storage() {
    let bad = check(
        "tensor",
        &[
            "backend::cpu",
            "backend::cuda",
            "backend::meta",
            "Storage::Cpu",
            "Storage::Cuda",
            "Storage::Meta",
        ],
    );
    assert!(
        bad.is_empty(),
        "the tensor layer picks a device itself:\n{}",
        bad.join("\n")
    );
    let above = check(
        "tensor",
        &["crate::nn", "crate::optim", "crate::train", "crate::data"],
    );
    assert!(
        above.is_empty(),
        "the tensor layer imports a layer above it:\n{}",
        above.join("\n")
    );
}

/// The checker finds what it looks for (and skips comments).
#[test]
fn the_checker_finds_a_violation() {
    let text = "use crate::tensor::Tensor;\n// crate::nn in a comment\nfn f() {}\n";
    assert_eq!(
        violations(text, ABOVE_THE_BACKEND),
        vec!["1: use crate::tensor::Tensor;".to_string()]
    );
}
