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
    // each missing level made one at a time, and noted only where this process
    // made it (another process, such as a rank of the same `ember launch`, may
    // be making the same folders)
    let missing: Vec<&Path> = dir
        .ancestors()
        .take_while(|d| !d.as_os_str().is_empty() && !d.exists())
        .collect();
    for level in missing.into_iter().rev() {
        match std::fs::create_dir(level) {
            Ok(()) => MADE
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(0, level.to_path_buf()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io(flag, dir, e)),
        }
    }
    // a probe file, removed at once
    let probe = dir.join(format!(".ember-write-check-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(|e| io(flag, dir, e))?;
    std::fs::remove_file(&probe).map_err(|e| io(flag, dir, e))
}

/// Checks that the file `path` can be written later: its folder exists (made if
/// need be) and is writable, and `path` is not a folder.
pub fn writable_file(path: &Path, flag: &str) -> ember::Result<()> {
    // (a name ending in a separator names a folder: Path drops the separator,
    // and the write at the end of the run would fail)
    let text = path.as_os_str().to_string_lossy();
    if text.ends_with('/') || text.ends_with(std::path::MAIN_SEPARATOR) {
        return Err(Error::InvalidArgument {
            op: "output",
            msg: format!("{flag} {text}: this names a folder, and a file name is needed"),
        });
    }
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
pub(crate) fn resolved(path: &Path) -> std::path::PathBuf {
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

/// The rule between a command's outputs (`outputs`: each flag and its file) and
/// its `--checkpoint` folder's own files (`checkpoint`: the checkpoint, its
/// history, the model): none is one of them, which the run writes itself (and
/// `--resume` reads). `--plot DIR/history.png` would write its curves over the
/// checkpoint's `history.csv`.
pub fn spare_checkpoint_files(
    outputs: &[(&str, &Path)],
    checkpoint: &[std::path::PathBuf],
) -> ember::Result<()> {
    for (flag, path) in outputs {
        let target = resolved(path);
        if let Some(file) = checkpoint.iter().find(|f| resolved(f) == target) {
            return Err(Error::InvalidArgument {
                op: "output",
                msg: format!(
                    "{flag} {}: the checkpoint writes {} itself (and --resume reads it); name \
                     another file",
                    path.display(),
                    file.display()
                ),
            });
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
        msg: format!("{flag} {s}: {e} (or auto: the first GPU if there is one, else the CPU)"),
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

/// `n` and `noun`, plural unless `n` is 1: "1 layer", "4 layers" (for the
/// messages of every command).
pub fn count(n: usize, noun: &str) -> String {
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}
