//! `ember inspect` (what a weights file holds) and `ember convert` (PyTorch's
//! `torch.save` files to safetensors).

use clap::Args;
use ember::io::{self, PtFile, PtFormat};
use ember::memory::fmt_bytes;
use ember::{Device, Error, Result};
use std::path::{Path, PathBuf};

#[derive(Args, Clone, Debug)]
pub struct InspectArgs {
    /// A `.pt`/`.pth`/`.bin` file written by `torch.save`, a safetensors file, or
    /// an ember checkpoint.
    pub file: PathBuf,
    /// For a `torch.save` checkpoint, the part to list (`model`; `a/b` for a
    /// nested one).
    #[arg(long)]
    pub key: Option<String>,
}

#[derive(Args, Clone, Debug)]
pub struct ConvertArgs {
    /// The `torch.save` file to read (`.pt`, `.pth`, `.bin`).
    pub input: PathBuf,
    /// The safetensors file to write.
    pub output: PathBuf,
    /// The part of a checkpoint to convert (`model`; `a/b` for a nested one).
    #[arg(long)]
    pub key: Option<String>,
    /// Replace OUTPUT if it exists.
    #[arg(long)]
    pub force: bool,
}

fn invalid(op: &'static str, msg: String) -> Error {
    Error::InvalidArgument { op, msg }
}

/// The error for `path` where a file to read should be: missing, or there but
/// not a regular file (a folder, a device).
fn not_a_file(path: &Path) -> Error {
    let why = if path.is_dir() {
        "a folder, not a file"
    } else if path.exists() {
        "not a regular file"
    } else {
        "no such file"
    };
    Error::Io {
        path: path.display().to_string(),
        source: std::io::Error::new(std::io::ErrorKind::NotFound, why),
    }
}

/// The `torch.save` file, narrowed to `--key`.
fn open_part(path: &Path, key: Option<&str>) -> Result<PtFile> {
    let file = PtFile::open(path)?;
    match key {
        Some(k) => file
            .select(k)
            .map_err(|e| crate::paths::named("--key", k, e)),
        None => Ok(file),
    }
}

/// `r`, with the hint to pick a part when the whole file could not be read.
fn with_key_hint<T>(r: Result<T>, file: &PtFile) -> Result<T> {
    r.map_err(|e| {
        let keys = file.keys();
        if file.selected().is_empty() && !keys.is_empty() {
            invalid(
                "convert",
                format!(
                    "{e}\n(--key KEY converts one part; the keys are {})",
                    keys.join(", ")
                ),
            )
        } else {
            e
        }
    })
}

pub fn inspect(args: &InspectArgs) -> Result<()> {
    let path = &args.file;
    if !path.is_file() {
        return Err(not_a_file(path));
    }
    if io::is_pt_file(path) {
        let file = open_part(path, args.key.as_deref())?;
        let format = match file.format() {
            PtFormat::Zip => "PyTorch torch.save file (zip archive)",
            PtFormat::Legacy => "PyTorch torch.save file (legacy format)",
        };
        let part = match file.selected() {
            [] => String::new(),
            s => format!(", key {:?}", s.join("/")),
        };
        println!("{}: {format}{part}", path.display());
        let entries = file.entries()?;
        let rows: Vec<[String; 4]> = entries
            .iter()
            .map(|e| {
                let dtype = match e.dtype.dtype {
                    Some(_) => e.dtype.name.to_string(),
                    None => format!("{} (not in ember)", e.dtype.name),
                };
                [
                    e.name.clone(),
                    dtype,
                    format!("{:?}", e.shape),
                    e.nbytes().to_string(),
                ]
            })
            .collect();
        print_table(&rows);
        let storages: std::collections::HashSet<&str> =
            entries.iter().map(|e| e.storage.as_str()).collect();
        // saturating: a crafted file's sizes can add up past usize
        let elements = entries
            .iter()
            .fold(0usize, |n, e| n.saturating_add(e.numel()));
        let bytes = entries
            .iter()
            .fold(0usize, |n, e| n.saturating_add(e.nbytes()));
        println!(
            "{} in {}, {}, {}",
            crate::paths::count(entries.len(), "tensor"),
            crate::paths::count(storages.len(), "storage"),
            crate::paths::count(elements, "element"),
            fmt_bytes(bytes)
        );
        let values = file.values()?;
        if !values.is_empty() {
            println!("other values:");
            for (name, v) in values {
                let name = if name.is_empty() {
                    "(the part itself)"
                } else {
                    &name
                };
                println!("  {name} = {v}");
            }
        }
        return Ok(());
    }
    if args.key.is_some() {
        return Err(invalid(
            "inspect",
            format!(
                "--key: {} is not a torch.save file; --key selects a part of one",
                path.display()
            ),
        ));
    }
    let entries = io::list(path)?;
    let checkpoint = !entries.is_empty()
        && entries.iter().all(|e| {
            ["model.", "optim.", "trial."]
                .iter()
                .any(|p| e.name.starts_with(p))
        });
    let kind = if checkpoint {
        "ember checkpoint (model., optim. and trial. entries, safetensors)"
    } else {
        "safetensors file"
    };
    println!("{}: {kind}", path.display());
    let rows: Vec<[String; 4]> = entries
        .iter()
        .map(|e| {
            [
                e.name.clone(),
                e.dtype.clone(),
                format!("{:?}", e.shape),
                e.nbytes.to_string(),
            ]
        })
        .collect();
    print_table(&rows);
    let elements: usize = entries
        .iter()
        .map(|e| e.shape.iter().product::<usize>())
        .sum();
    let bytes: usize = entries.iter().map(|e| e.nbytes).sum();
    println!(
        "{}, {}, {}",
        crate::paths::count(entries.len(), "tensor"),
        crate::paths::count(elements, "element"),
        fmt_bytes(bytes)
    );
    let meta = io::metadata(path)?;
    if !meta.is_empty() {
        println!("metadata:");
        for (k, v) in meta {
            println!("  {k} = {v}");
        }
    }
    Ok(())
}

fn print_table(rows: &[[String; 4]]) {
    let head = ["name", "dtype", "shape", "bytes"];
    let mut w = head.map(str::len);
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.len());
        }
    }
    let line = |r: [&str; 4]| {
        println!(
            "{:<a$}  {:<b$}  {:<c$}  {:>d$}",
            r[0],
            r[1],
            r[2],
            r[3],
            a = w[0],
            b = w[1],
            c = w[2],
            d = w[3]
        );
    };
    line(head);
    for r in rows {
        line([&r[0], &r[1], &r[2], &r[3]]);
    }
}

pub fn convert(args: &ConvertArgs) -> Result<()> {
    let (input, output) = (&args.input, &args.output);
    // every check before the file is read
    if !input.is_file() {
        return Err(not_a_file(input));
    }
    if !io::is_pt_file(input) {
        return Err(invalid(
            "convert",
            format!(
                "{}: not a torch.save file (convert reads PyTorch's .pt/.pth/.bin files)",
                input.display()
            ),
        ));
    }
    let same = match (input.canonicalize(), output.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if same {
        return Err(invalid(
            "convert",
            format!(
                "{}: OUTPUT is the input file; name another",
                output.display()
            ),
        ));
    }
    if output.exists() && !args.force {
        return Err(invalid(
            "convert",
            format!("{} exists; pass --force to replace it", output.display()),
        ));
    }
    crate::paths::writable_file(output, "OUTPUT")?;
    let file = open_part(input, args.key.as_deref())?;
    // a faithful copy: NaN and infinity too
    let mut tensors = with_key_hint(file.load(&Device::Cpu), &file)?;
    // a key that selects one tensor names it by its last part (`model/0.weight`
    // writes `0.weight`), not by the empty rest of its path
    if let (Some(key), [(name, _)]) = (&args.key, tensors.as_mut_slice()) {
        if name.is_empty() {
            *name = key.rsplit('/').next().unwrap_or(key).to_string();
        }
    }
    // a file that is one tensor (`torch.save(t, "t.pt")`) has no name for it:
    // the input's file name gives one
    if let [(name, _)] = tensors.as_mut_slice() {
        if name.is_empty() {
            *name = input
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "tensor".into());
            println!("the file holds one tensor without a name: writing it as {name:?}");
        }
    }
    if tensors.is_empty() {
        return Err(invalid(
            "convert",
            format!("{}: no tensors to write", input.display()),
        ));
    }
    let bytes: usize = tensors
        .iter()
        .map(|(_, t)| t.numel() * t.dtype().size_in_bytes())
        .sum();
    let count = tensors.len();
    // (each tensor dropped once its bytes are made: a checkpoint's size in
    // memory twice at most, not three times)
    io::save_owned(tensors, output)?;
    println!(
        "wrote {} ({}) to {}",
        crate::paths::count(count, "tensor"),
        fmt_bytes(bytes),
        output.display()
    );
    Ok(())
}
