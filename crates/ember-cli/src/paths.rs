//! Output paths checked before any work starts, so that a long run is not lost to
//! a folder that does not exist or cannot be written.

use ember::Error;
use std::path::Path;

/// An I/O error naming the flag and the folder it concerns.
fn io(flag: &str, path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        path: format!("{flag}: {}", path.display()),
        source,
    }
}

/// The folders this process made for its outputs, deepest first.
static MADE: std::sync::Mutex<Vec<std::path::PathBuf>> = std::sync::Mutex::new(Vec::new());

/// Removes the folders [`writable_dir`] made that are still empty (a command
/// refused or failed before writing there), deepest first.
pub fn remove_made_dirs_if_empty() {
    let made = std::mem::take(&mut *MADE.lock().unwrap_or_else(|p| p.into_inner()));
    for dir in made {
        // (fails, and keeps the folder, where something was written in it)
        let _ = std::fs::remove_dir(&dir);
    }
}

/// Makes `dir` (and its parents) if it does not exist and checks that a file can
/// be written in it; errors name `dir` and say which flag gave it. The folders
/// made are noted, so that a command that fails removes them again while they
/// are empty ([`remove_made_dirs_if_empty`]).
pub fn writable_dir(dir: &Path, flag: &str) -> ember::Result<()> {
    if dir.exists() && !dir.is_dir() {
        return Err(Error::InvalidArgument {
            op: "output",
            msg: format!(
                "{flag} {}: this is a file, and a folder is needed",
                dir.display()
            ),
        });
    }
    let missing: Vec<std::path::PathBuf> = dir
        .ancestors()
        .take_while(|d| !d.as_os_str().is_empty() && !d.exists())
        .map(Path::to_path_buf)
        .collect();
    std::fs::create_dir_all(dir).map_err(|e| io(flag, dir, e))?;
    MADE.lock()
        .unwrap_or_else(|p| p.into_inner())
        .splice(0..0, missing);
    // a probe file, removed at once
    let probe = dir.join(format!(".ember-write-check-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(|e| io(flag, dir, e))?;
    std::fs::remove_file(&probe).map_err(|e| io(flag, dir, e))
}

/// Checks that the file `path` can be written later: its folder exists (made if
/// need be) and is writable, and `path` is not a folder.
pub fn writable_file(path: &Path, flag: &str) -> ember::Result<()> {
    if path.is_dir() {
        return Err(Error::InvalidArgument {
            op: "output",
            msg: format!(
                "{flag} {}: this is a folder, and a file name is needed",
                path.display()
            ),
        });
    }
    match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(dir) => writable_dir(dir, flag),
        None => writable_dir(Path::new("."), flag),
    }
}

/// `path` as the file system resolves it, to compare two paths: canonical when
/// it exists, else its folder's canonical form joined with its name.
fn resolved(path: &Path) -> std::path::PathBuf {
    if let Ok(p) = path.canonicalize() {
        return p;
    }
    let dir = match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(d) => d.to_path_buf(),
        None => std::path::PathBuf::from("."),
    };
    match (dir.canonicalize(), path.file_name()) {
        (Ok(d), Some(name)) => d.join(name),
        _ => path.to_path_buf(),
    }
}

/// The rule for every file the command writes, checked before any work: it is
/// writable, it is none of the run's `inputs` (never, even with `--force`), and
/// no file is there yet unless `force` (a file there is another run's, or this
/// run's input under another name).
pub fn new_output(
    path: &Path,
    flag: &str,
    inputs: &[std::path::PathBuf],
    force: bool,
) -> ember::Result<()> {
    writable_file(path, flag)?;
    let target = resolved(path);
    if let Some(input) = inputs.iter().find(|i| resolved(i) == target) {
        return Err(Error::InvalidArgument {
            op: "output",
            msg: format!(
                "{flag} {}: this is the run's input {}; writing there would destroy it, so \
                 choose another name",
                path.display(),
                input.display()
            ),
        });
    }
    if path.exists() && !force {
        return Err(Error::InvalidArgument {
            op: "output",
            msg: format!(
                "{flag} {}: the file exists (another run's?); pass --force to replace it",
                path.display()
            ),
        });
    }
    Ok(())
}

/// The rule between the files one command writes (`outputs`: each flag and
/// its file): no two are one file, and none lies in the `--checkpoint` folder
/// (whose files the run writes itself, and a resumed run reads), so that no
/// output replaces another or the checkpoint.
pub fn distinct_outputs(outputs: &[(&str, &Path)], checkpoint: Option<&Path>) -> ember::Result<()> {
    for (i, (flag, path)) in outputs.iter().enumerate() {
        let target = resolved(path);
        if let Some((other, _)) = outputs[..i].iter().find(|(_, p)| resolved(p) == target) {
            return Err(Error::InvalidArgument {
                op: "output",
                msg: format!(
                    "{flag} {}: {other} writes that file too; give each output its own name",
                    path.display()
                ),
            });
        }
        if let Some(dir) = checkpoint {
            if target.starts_with(resolved(dir)) {
                return Err(Error::InvalidArgument {
                    op: "output",
                    msg: format!(
                        "{flag} {}: this is inside the --checkpoint folder {}, whose files the \
                         run writes (and --resume reads); name a file outside it",
                        path.display(),
                        dir.display()
                    ),
                });
            }
        }
    }
    Ok(())
}

/// The device `--device` names (`auto`: the first GPU if there is one, else
/// the CPU); an error names the flag and what it accepts.
pub fn device(s: &str, flag: &str) -> ember::Result<ember::Device> {
    if s == "auto" {
        return Ok(ember::Device::cuda_if_available(0));
    }
    s.parse().map_err(|e: Error| Error::InvalidArgument {
        op: "arguments",
        msg: format!("{flag} {s}: {e}"),
    })
}

/// `e` with the flag whose value caused it named first.
pub fn named(flag: &str, value: &str, e: Error) -> Error {
    Error::InvalidArgument {
        op: "arguments",
        msg: format!("{flag} {value}: {e}"),
    }
}

/// What identifies a data file in a checkpoint's settings: its length and a
/// 64-bit FNV-1a hash of its bytes (stable across versions and machines).
pub fn data_identity(path: &std::path::Path) -> ember::Result<String> {
    let bytes = std::fs::read(path).map_err(|e| Error::Io {
        path: path.display().to_string(),
        source: e,
    })?;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in &bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    Ok(format!("{} bytes, FNV-1a {h:016x}", bytes.len()))
}
