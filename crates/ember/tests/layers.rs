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

/// The full paths a `use` tree names: `crate::{a::X, b::{c, d}}` gives
/// `crate::a::X`, `crate::b::c`, `crate::b::d`.
fn expand(tree: &str) -> Vec<String> {
    let tree: String = tree.chars().filter(|c| !c.is_whitespace()).collect();
    let Some(open) = tree.find('{') else {
        return vec![tree];
    };
    let (head, inner) = (&tree[..open], &tree[open + 1..tree.len() - 1]);
    let (mut parts, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.is_empty())
        .flat_map(|p| expand(&format!("{head}{p}")))
        .collect()
}

/// Each line of `text` that is not a comment, as `line: text`, with a `use`
/// tree (possibly over several lines) given once per path it expands to, as
/// `line: use path`.
fn named(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i].trim_start();
        if l.starts_with("//") {
            i += 1;
            continue;
        }
        if let Some(rest) = l
            .strip_prefix("use ")
            .or_else(|| l.split_once(" use ").map(|(_, r)| r))
        {
            let mut tree = rest.to_string();
            let first = i;
            while !tree.contains(';') && i + 1 < lines.len() {
                i += 1;
                tree.push_str(lines[i]);
            }
            let tree = tree.split(';').next().unwrap_or("");
            let tree = tree.split(" as ").next().unwrap_or("");
            for path in expand(tree) {
                out.push(format!("{}: use {path}", first + 1));
            }
        } else {
            out.push(format!("{}: {}", i + 1, l.trim()));
        }
        i += 1;
    }
    out
}

/// What `text` (comments left out) names of `forbidden`, as `line: text`: in its
/// code, and in the paths its `use` trees expand to.
fn violations(text: &str, forbidden: &[&str]) -> Vec<String> {
    named(text)
        .into_iter()
        .filter(|n| forbidden.iter().any(|f| n.contains(f)))
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

/// The checker finds what it looks for, in plain and grouped imports and in code
/// (and skips comments).
#[test]
fn the_checker_finds_a_violation() {
    let text = "use crate::tensor::Tensor;\n// crate::nn in a comment\nuse crate::{\n    dtype::DType,\n    optim::{Adam, Sgd},\n};\nfn f() { crate::io::save(); }\n";
    assert_eq!(
        violations(text, ABOVE_THE_BACKEND),
        vec![
            "1: use crate::tensor::Tensor".to_string(),
            "3: use crate::optim::Adam".to_string(),
            "3: use crate::optim::Sgd".to_string(),
            "7: fn f() { crate::io::save(); }".to_string(),
        ]
    );
    assert!(violations(
        "use crate::{dtype::DType, layout::Layout};",
        ABOVE_THE_BACKEND
    )
    .is_empty());
}

/// The library's layers, bottom first, as ARCHITECTURE.md draws them: a module
/// may name modules of its own layer or below, never above.
const LIBRARY_LAYERS: &[&[&str]] = &[
    &["dtype", "layout", "device", "error", "files"],
    &["backend"],
    &["profiler"],
    &["tensor", "autograd", "kernel"],
    &["nn", "optim", "linalg"],
    &["models"],
    &["data", "io"],
    &["distributed"],
    &["train"],
    &["memory"],
];

/// The command's modules, bottom first: the option structs below the commands
/// that read them, `train` (which hands `ember train text` to `text`) above
/// `text`, `main` on top.
const CLI_LAYERS: &[&[&str]] = &[
    &["paths"],
    &["profile", "devices"],
    &["estimate", "files"],
    &["args"],
    &["text"],
    &["train"],
    &["bench", "launch"],
    &["main"],
];

/// Each violation of `layers` in the crate whose sources are in `src`: a file of
/// a module naming `crate::M` (or `crate::{M...}`) for a module `M` above its own.
fn layer_violations(src: &Path, layers: &[&[&str]]) -> Vec<String> {
    let level = |m: &str| layers.iter().position(|l| l.contains(&m));
    let mut bad = Vec::new();
    for f in sources(src) {
        let rel = f.strip_prefix(src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = first.trim_end_matches(".rs").to_string();
        let Some(own) = level(&module) else {
            continue; // lib.rs: the public entry, which names every layer
        };
        let above: Vec<String> = layers[own + 1..]
            .iter()
            .flat_map(|l| l.iter().map(|m| format!("crate::{m}")))
            .collect();
        let above: Vec<&str> = above.iter().map(String::as_str).collect();
        let text = std::fs::read_to_string(&f).expect("a source file");
        for v in violations(&text, &above) {
            // `crate::train` must not match `crate::trainer`: check the name ends
            let named = above.iter().any(|a| {
                v.match_indices(a).any(|(i, _)| {
                    !v[i + a.len()..]
                        .chars()
                        .next()
                        .is_some_and(|c| c.is_alphanumeric() || c == '_')
                })
            });
            if named {
                bad.push(format!("{} ({module}): {v}", f.display()));
            }
        }
    }
    bad
}

#[test]
fn every_library_module_imports_only_layers_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    // every module is placed in a layer (a new one must be placed too)
    for entry in std::fs::read_dir(&src).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        let module = name.trim_end_matches(".rs");
        assert!(
            module == "lib" || LIBRARY_LAYERS.iter().any(|l| l.contains(&module)),
            "src/{name}: a module in no layer; place it in LIBRARY_LAYERS and ARCHITECTURE.md"
        );
    }
    let bad = layer_violations(&src, LIBRARY_LAYERS);
    assert!(
        bad.is_empty(),
        "imports of a layer above:\n{}",
        bad.join("\n")
    );
}

#[test]
fn every_command_module_imports_only_layers_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ember-cli/src");
    for entry in std::fs::read_dir(&src).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        let module = name.trim_end_matches(".rs");
        assert!(
            CLI_LAYERS.iter().any(|l| l.contains(&module)),
            "ember-cli/src/{name}: a module in no layer; place it in CLI_LAYERS"
        );
    }
    let bad = layer_violations(&src, CLI_LAYERS);
    assert!(
        bad.is_empty(),
        "imports of a layer above:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_layer_checker_finds_an_upward_import() {
    let dir = std::env::temp_dir().join(format!("ember-layers-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("nn")).unwrap();
    std::fs::write(
        dir.join("nn/a.rs"),
        "use crate::train::Trial;\nuse crate::tensor::Tensor;\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("tensor.rs"),
        "use crate::{nn::Linear, dtype::DType};\n// crate::io\nfn f() { crate::trainer(); }\n",
    )
    .unwrap();
    std::fs::write(dir.join("memory.rs"), "use crate::train::Trial;\n").unwrap();
    let mut bad = layer_violations(&dir, LIBRARY_LAYERS);
    bad.sort();
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(bad.len(), 2, "{bad:#?}");
    assert!(
        bad[0].contains("(nn): 1: use crate::train::Trial"),
        "{bad:#?}"
    );
    assert!(
        bad[1].contains("(tensor)") && bad[1].contains("nn::Linear"),
        "{bad:#?}"
    );
}

/// The `.rs` files under `dir` of more than `max` lines whose first line does not
/// say why (`// Over 800 lines: <reason>`).
fn long_files_without_a_reason(dir: &Path, max: usize) -> Vec<String> {
    let mut bad = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                let lines = text.lines().count();
                let first = text.lines().next().unwrap_or("");
                let reason = first.strip_prefix("// Over 800 lines: ").unwrap_or("");
                if lines > max && reason.trim().len() < 20 {
                    bad.push(format!("{} ({lines} lines)", path.display()));
                }
            }
        }
    }
    bad.sort();
    bad
}

/// Source files stay focused: a file over 800 lines says why on its first line
/// (`// Over 800 lines: <reason>`), so that growing past it is a decision.
#[test]
fn long_source_files_say_why() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut bad = long_files_without_a_reason(&root.join("src"), 800);
    bad.extend(long_files_without_a_reason(
        &root.join("../ember-cli/src"),
        800,
    ));
    assert!(
        bad.is_empty(),
        "over 800 lines without a reason on the first line (split them, or say why):\n{}",
        bad.join("\n")
    );
    // the check can fail: every file over 100 lines lacks a reason at that limit
    assert!(long_files_without_a_reason(&root.join("src"), 100).len() > 10);
}

/// What `text` names through the crate root (`crate::X` where `X` is not one of
/// `modules`: a name `lib.rs` re-exports, or one of its facade modules), as
/// `line: text`.
fn root_names(text: &str, modules: &[String]) -> Vec<String> {
    named(text)
        .into_iter()
        .filter(|n| {
            n.match_indices("crate::").any(|(i, _)| {
                let after: String = n[i + "crate::".len()..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                !n[..i].ends_with('$') && !modules.contains(&after)
            })
        })
        .collect()
}

/// `lib.rs` is the public entry file only: inside the library every path names
/// the module an item lives in (`crate::dtype::DType`, not `crate::DType`), so
/// that a module's imports show which layer it reaches.
#[test]
fn the_library_names_items_by_their_home_module() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules: Vec<String> = std::fs::read_dir(&src)
        .unwrap()
        .map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            name.trim_end_matches(".rs").to_string()
        })
        .filter(|m| m != "lib")
        .collect();
    let mut bad = Vec::new();
    for f in sources(&src) {
        if f == src.join("lib.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&f).expect("a source file");
        for v in root_names(&text, &modules) {
            bad.push(format!("{}:{v}", f.display()));
        }
    }
    assert!(
        bad.is_empty(),
        "names through the crate root (name the home module):\n{}",
        bad.join("\n")
    );
    // the check can fail: re-exports, facades and grouped imports are found
    let planted = "use crate::{dtype::DType, Error};\nuse crate::cuda::Stream;\n// crate::Tensor\nfn f() -> crate::Result<()> { $crate::dtype::x(); crate::tensor::y() }\n";
    let mods = ["dtype".to_string(), "tensor".to_string()];
    assert_eq!(
        root_names(planted, &mods),
        vec![
            "1: use crate::Error".to_string(),
            "2: use crate::cuda::Stream".to_string(),
            "4: fn f() -> crate::Result<()> { $crate::dtype::x(); crate::tensor::y() }".to_string(),
        ]
    );
}
