//! File helpers shared by every layer (checkpoints, histories, the kernel cache).

use crate::error::{Error, Result};
use std::path::Path;

/// Writes `bytes` to `path` through a temporary file in the same folder and a
/// rename, so that readers see the old file or the new one, never a part: the
/// temporary file is flushed to disk before the rename, and on Unix the folder
/// after it where the file system allows (so that a crash after this returns
/// finds the new file, whole),
/// named for this process and call (threads writing one path do not share it),
/// and removed when any step before the rename fails.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::sync::atomic::{AtomicU64, Ordering};
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(
        ".{file_name}.tmp-{}-{}",
        std::process::id(),
        CALLS.fetch_add(1, Ordering::Relaxed)
    ));
    let io_err = |p: &Path| {
        let path = p.display().to_string();
        move |source| Error::Io { path, source }
    };
    let written = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        // named by the path asked for (the temporary file is this function's
        // business), and a missing folder said as such (PyTorch's "Parent
        // directory ... does not exist")
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
        let e = match dir {
            Some(d) if e.kind() == std::io::ErrorKind::NotFound && !d.is_dir() => {
                std::io::Error::new(
                    e.kind(),
                    format!("the folder {} does not exist", d.display()),
                )
            }
            _ => std::io::Error::new(
                e.kind(),
                format!("{e} (writing {} beside it)", tmp.display()),
            ),
        };
        return Err(io_err(path)(e));
    }
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io_err(path)(e)
    })?;
    // the rename is an entry in the folder: durable once the folder is synced
    // (Unix opens a folder as a file; elsewhere the rename is left to the system)
    #[cfg(unix)]
    {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        // best effort: the new file is in place whatever this says (a folder
        // that cannot be opened or synced is left to the system), so an error
        // here would report a write that happened as failed
        let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::write_atomic;

    #[test]
    fn a_failed_write_names_the_path_asked_for() {
        let dir = std::env::temp_dir().join(format!("ember-files-{}", std::process::id()));
        let target = dir.join("missing").join("model.safetensors");
        let e = write_atomic(&target, b"x").unwrap_err().to_string();
        assert!(e.starts_with(&target.display().to_string()), "{e}");
        assert!(e.contains("does not exist") && !e.contains(".tmp-"), "{e}");
        assert!(!dir.join("missing").exists());
    }
}
