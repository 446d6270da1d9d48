//! File helpers shared by every layer (checkpoints, histories, the kernel cache).

use crate::error::{Error, Result};
use std::path::Path;

/// Writes `bytes` to `path` through a temporary file in the same folder and a
/// rename, so that readers see the old file or the new one, never a part.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{file_name}.tmp-{}", std::process::id()));
    let io_err = |p: &Path| {
        let path = p.display().to_string();
        move |source| Error::Io { path, source }
    };
    std::fs::write(&tmp, bytes).map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io_err(path)(e)
    })
}
