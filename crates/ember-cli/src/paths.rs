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

/// Makes `dir` (and its parents) if it does not exist and checks that a file can
/// be written in it; errors name `dir` and say which flag gave it.
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
    std::fs::create_dir_all(dir).map_err(|e| io(flag, dir, e))?;
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
