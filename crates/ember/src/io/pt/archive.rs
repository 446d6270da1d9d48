//! Where a `torch.save` file keeps its pickle and its storages: the zip layout
//! PyTorch has written since 1.6 (`NAME/data.pkl`, one record `NAME/data/KEY` per
//! storage) and the legacy layout before it (five pickles one after another, then
//! each storage as an 8-byte element count and its bytes).

use super::pickle::{self, Obj, Pickle, PickleError, Value};
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// The most bytes a pickle may take (a state dict's pickle is about 100 bytes a
/// tensor; this is ten million tensors).
pub(crate) const MAX_PICKLE_BYTES: u64 = 1 << 30;

/// How far a compressed pickle may expand (pickles compress three to five-fold).
const MAX_PICKLE_RATIO: u64 = 64;

/// Deflate cannot expand data more than about 1032-fold.
const MAX_DEFLATE_RATIO: u64 = 1100;

/// The layout of a `torch.save` file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PtFormat {
    /// The zip archive `torch.save` writes by default (PyTorch 1.6 and later).
    Zip,
    /// The format before it (`_use_new_zipfile_serialization=False`).
    Legacy,
}

/// How many first bytes [`layout_of`] looks at.
pub(crate) const HEAD_LEN: usize = 32;

/// The layout a file's first bytes announce: a zip archive, or the legacy
/// format's first pickle (its magic number as LONG1 after PROTO 2 or 3, after
/// PROTO and FRAME for 4 and 5, as text for protocol 1). A safetensors file
/// cannot start so: its first eight bytes are its header's length, at most
/// 100 MB.
pub(crate) fn layout_of(head: &[u8]) -> Option<PtFormat> {
    const TEXT_MAGIC: &[u8] = b"L119547037146038801333356L";
    match head {
        [b'P', b'K', 3, 4, ..] | [b'P', b'K', 5, 6, ..] => Some(PtFormat::Zip),
        [0x80, 2 | 3, 0x8a, 10, ..] => Some(PtFormat::Legacy),
        [0x80, 4 | 5, 0x95, _, _, _, _, _, _, _, _, 0x8a, 10, ..] => Some(PtFormat::Legacy),
        _ if head.starts_with(TEXT_MAGIC) => Some(PtFormat::Legacy),
        _ => None,
    }
}

/// The legacy format's first pickle: this number.
const LEGACY_MAGIC: [u8; 10] = [0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19];

pub(crate) fn parse_error(path: &Path, what: &str, e: PickleError) -> Error {
    Error::Parse {
        file: path.display().to_string(),
        line: None,
        msg: format!("{what}, byte {}: {}", e.at, e.msg),
    }
}

pub(crate) fn bad_file(path: &Path, msg: impl Into<String>) -> Error {
    Error::Parse {
        file: path.display().to_string(),
        line: None,
        msg: msg.into(),
    }
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.display().to_string(),
        source,
    }
}

fn zip_err(path: &Path, e: zip::result::ZipError) -> Error {
    match e {
        zip::result::ZipError::Io(source) => Error::Io {
            path: path.display().to_string(),
            source,
        },
        other => bad_file(path, format!("a damaged zip archive ({other})")),
    }
}

/// An open `torch.save` file: its pickle, and how to reach each storage.
pub(crate) struct Archive {
    pub path: PathBuf,
    pub format: PtFormat,
    pub pickle: Pickle,
    /// The pickle's length in bytes (what the structure read from it is
    /// measured against).
    pub pickle_len: usize,
    pub little_endian: bool,
    file_len: u64,
    source: Source,
}

enum Source {
    Zip {
        zip: zip::ZipArchive<BufReader<File>>,
        /// The records' folder (`archive`, or the name the file was saved under).
        prefix: String,
    },
    Legacy {
        file: BufReader<File>,
        /// Each storage's element count and where its bytes start.
        storages: HashMap<String, (u64, u64)>,
        /// The first storage of a type ember does not know (its key and class):
        /// its length is unknown, so no storage after it can be found.
        unknown: Option<(String, String)>,
    },
}

impl Archive {
    pub fn open(path: &Path) -> Result<Archive> {
        let mut file = File::open(path).map_err(io_err(path))?;
        let mut head = [0u8; HEAD_LEN];
        let n = read_up_to(&mut file, &mut head).map_err(io_err(path))?;
        file.seek(SeekFrom::Start(0)).map_err(io_err(path))?;
        match layout_of(&head[..n]) {
            Some(PtFormat::Zip) => open_zip(path, file),
            Some(PtFormat::Legacy) => open_legacy(path, file),
            None => Err(bad_file(
                path,
                "not a PyTorch file: it is neither the zip archive torch.save writes nor its \
                 legacy format",
            )),
        }
    }

    /// Checks, before anything is allocated for it, that storage `key` is in the
    /// file and holds `nbytes` bytes: a stored record no larger than the file, a
    /// compressed one expanding no more than deflate can.
    pub fn check_storage(&mut self, key: &str, nbytes: u64, itemsize: u64) -> Result<()> {
        let path = &self.path;
        match &mut self.source {
            Source::Zip { zip, prefix } => {
                let name = format!("{prefix}/data/{key}");
                let file_len = self.file_len;
                let rec = match zip.by_name(&name) {
                    Ok(rec) => rec,
                    Err(zip::result::ZipError::FileNotFound) => {
                        return Err(bad_file(
                            path,
                            format!("storage {key:?} is named by the pickle but {name} is not in the archive"),
                        ))
                    }
                    Err(e) => return Err(zip_err(path, e)),
                };
                if rec.size() != nbytes {
                    return Err(bad_file(
                        path,
                        format!(
                            "{name} holds {} bytes where its storage needs {nbytes}",
                            rec.size()
                        ),
                    ));
                }
                let packed = rec.compressed_size();
                let plausible = if rec.compression() == zip::CompressionMethod::Stored {
                    packed == nbytes && nbytes <= file_len
                } else {
                    packed <= file_len && nbytes <= packed.saturating_mul(MAX_DEFLATE_RATIO)
                };
                if plausible {
                    Ok(())
                } else {
                    Err(bad_file(
                        path,
                        format!(
                            "{name} claims {nbytes} bytes from {packed} stored in a file of {file_len}"
                        ),
                    ))
                }
            }
            // each storage's place was checked against the file's length when it
            // was opened: its length must be the one the tensors need
            Source::Legacy {
                storages, unknown, ..
            } => match storages.get(key) {
                Some(&(stored, _)) if Some(nbytes) == itemsize.checked_mul(stored) => Ok(()),
                Some(&(stored, _)) => Err(bad_file(
                    path,
                    format!(
                        "storage {key:?} holds {stored} elements, not the {} its tensors need",
                        nbytes / itemsize.max(1)
                    ),
                )),
                None => Err(not_stored(path, key, unknown)),
            },
        }
    }

    /// Reads storage `key`, `numel` elements, into `out` (their bytes: `numel`
    /// times the element size).
    pub fn read_storage(&mut self, key: &str, numel: u64, out: &mut [u8]) -> Result<()> {
        let path = &self.path;
        match &mut self.source {
            Source::Zip { zip, prefix } => {
                let name = format!("{prefix}/data/{key}");
                let mut rec = match zip.by_name(&name) {
                    Ok(rec) => rec,
                    Err(zip::result::ZipError::FileNotFound) => {
                        return Err(bad_file(
                            path,
                            format!("storage {key:?} is named by the pickle but {name} is not in the archive"),
                        ))
                    }
                    Err(e) => return Err(zip_err(path, e)),
                };
                if rec.size() != out.len() as u64 {
                    return Err(bad_file(
                        path,
                        format!(
                            "{name} holds {} bytes where its storage needs {}",
                            rec.size(),
                            out.len()
                        ),
                    ));
                }
                // the zip reader checks the record's CRC when it reaches its end;
                // reading one byte more makes it get there and proves the size
                rec.read_exact(out).map_err(|e| damaged(path, &name, e))?;
                let mut extra = [0u8; 1];
                match rec.read(&mut extra) {
                    Ok(0) => Ok(()),
                    Ok(_) => Err(bad_file(path, format!("{name} is longer than it says"))),
                    Err(e) => Err(damaged(path, &name, e)),
                }
            }
            Source::Legacy {
                file,
                storages,
                unknown,
            } => {
                let Some(&(stored, start)) = storages.get(key) else {
                    return Err(not_stored(path, key, unknown));
                };
                if stored != numel {
                    return Err(bad_file(
                        path,
                        format!(
                            "storage {key:?} holds {stored} elements where the pickle says {numel}"
                        ),
                    ));
                }
                file.seek(SeekFrom::Start(start)).map_err(io_err(path))?;
                file.read_exact(out).map_err(|e| damaged(path, key, e))
            }
        }
    }
}

fn not_stored(path: &Path, key: &str, unknown: &Option<(String, String)>) -> Error {
    match unknown {
        Some((k, class)) => bad_file(
            path,
            format!(
                "storage {key:?} comes after storage {k:?} of type torch.{class}, whose length \
                 ember cannot know, so it cannot be found"
            ),
        ),
        None => bad_file(
            path,
            format!("storage {key:?} is named by the pickle but not stored in the file"),
        ),
    }
}

fn damaged(path: &Path, record: &str, e: std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        bad_file(
            path,
            format!("{record} ends early (the file is truncated?)"),
        )
    } else if e.kind() == std::io::ErrorKind::InvalidData {
        bad_file(path, format!("{record} is damaged ({e})"))
    } else {
        io_err(path)(e)
    }
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

fn open_zip(path: &Path, file: File) -> Result<Archive> {
    let file_len = file.metadata().map_err(io_err(path))?.len();
    let mut zip = zip::ZipArchive::new(BufReader::new(file)).map_err(|e| zip_err(path, e))?;
    let pickle_name = zip
        .file_names()
        .filter(|n| n.ends_with("/data.pkl") && n.matches('/').count() == 1)
        .min()
        .map(str::to_string)
        .ok_or_else(|| {
            bad_file(
                path,
                "a zip archive without a data.pkl record: not a file torch.save wrote",
            )
        })?;
    let prefix = pickle_name.trim_end_matches("/data.pkl").to_string();
    // PyTorch stores the pickle uncompressed; a compressed one may expand only
    // as far as pickles compress, so the objects built from it stay in
    // proportion to the file
    let limit = {
        let rec = zip.by_name(&pickle_name).map_err(|e| zip_err(path, e))?;
        if rec.compression() == zip::CompressionMethod::Stored {
            MAX_PICKLE_BYTES
        } else {
            MAX_PICKLE_BYTES.min(rec.compressed_size().saturating_mul(MAX_PICKLE_RATIO))
        }
    };
    let bytes = read_record(path, &mut zip, &pickle_name, limit)?;
    let (pickle, pickle_len) =
        pickle::parse(&bytes).map_err(|e| parse_error(path, &pickle_name, e))?;
    let order_name = format!("{prefix}/byteorder");
    let little_endian = match zip.index_for_name(&order_name) {
        None => true,
        Some(_) => match read_record(path, &mut zip, &order_name, 16)?.as_slice() {
            b"little" => true,
            b"big" => false,
            other => {
                return Err(bad_file(
                    path,
                    format!(
                        "{order_name} says {:?} (little or big expected)",
                        String::from_utf8_lossy(other)
                    ),
                ))
            }
        },
    };
    Ok(Archive {
        path: path.to_path_buf(),
        format: PtFormat::Zip,
        pickle,
        pickle_len,
        little_endian,
        file_len,
        source: Source::Zip { zip, prefix },
    })
}

/// A small record's bytes, refused past `limit` (read incrementally: a record
/// that claims a huge size but is short costs only what it holds).
fn read_record(
    path: &Path,
    zip: &mut zip::ZipArchive<BufReader<File>>,
    name: &str,
    limit: u64,
) -> Result<Vec<u8>> {
    let rec = zip.by_name(name).map_err(|e| zip_err(path, e))?;
    if rec.size() > limit {
        return Err(bad_file(
            path,
            format!(
                "{name} claims {} bytes (at most {limit} are read)",
                rec.size()
            ),
        ));
    }
    let mut out = Vec::new();
    rec.take(limit + 1)
        .read_to_end(&mut out)
        .map_err(|e| damaged(path, name, e))?;
    if out.len() as u64 > limit {
        return Err(bad_file(
            path,
            format!("{name} is longer than {limit} bytes"),
        ));
    }
    Ok(out)
}

/// The legacy format: magic number, protocol version, system info, the object,
/// then the list of storage keys, each storage's bytes after it in that order.
fn open_legacy(path: &Path, file: File) -> Result<Archive> {
    let len = file.metadata().map_err(io_err(path))?.len();
    let mut file = BufReader::new(file);
    // the five pickles come first; read until they parse (a legacy file's
    // storages follow them, and are not read here)
    let mut buf = Vec::new();
    let mut want = 1u64 << 16;
    let pickles = loop {
        let target = want.min(len).min(MAX_PICKLE_BYTES);
        let have = buf.len() as u64;
        if target > have {
            (&mut file)
                .take(target - have)
                .read_to_end(&mut buf)
                .map_err(io_err(path))?;
        }
        match parse_legacy_pickles(path, &buf) {
            Ok(p) => break p,
            Err(e) if e.1 && (buf.len() as u64) < len.min(MAX_PICKLE_BYTES) => want *= 4,
            Err(e) => return Err(e.0),
        }
    };
    let (object, pickle_len, keys, mut at) = pickles;
    // the element size of each storage, from the object's persistent ids
    let mut itemsize = HashMap::new();
    for o in &object.objects {
        if let Obj::Storage(s) = o {
            let size = super::storage_dtype(&s.class).map(|d| d.itemsize);
            itemsize.insert(s.key.to_string(), (size, s.class.to_string()));
        }
    }
    let mut storages = HashMap::new();
    let mut unknown = None;
    for key in keys {
        let size = match itemsize.get(&key) {
            Some((Some(size), _)) => *size as u64,
            Some((None, class)) => {
                unknown = Some((key, class.clone()));
                break;
            }
            None => {
                return Err(bad_file(
                    path,
                    format!("the storage list names {key:?}, which no tensor uses"),
                ))
            }
        };
        file.seek(SeekFrom::Start(at)).map_err(io_err(path))?;
        let mut count = [0u8; 8];
        file.read_exact(&mut count)
            .map_err(|e| damaged(path, &format!("storage {key:?}"), e))?;
        // PyTorch writes (and reads) these counts and the storages' bytes
        // little-endian, whatever the system information says
        let numel = u64::from_le_bytes(count);
        let bytes = numel
            .checked_mul(size)
            .filter(|b| (at + 8).checked_add(*b).is_some_and(|end| end <= len));
        let Some(bytes) = bytes else {
            return Err(bad_file(
                path,
                format!("storage {key:?} says it holds {numel} elements, more than the file has"),
            ));
        };
        storages.insert(key, (numel, at + 8));
        at += 8 + bytes;
    }
    Ok(Archive {
        path: path.to_path_buf(),
        format: PtFormat::Legacy,
        pickle: object,
        pickle_len,
        little_endian: true,
        file_len: len,
        source: Source::Legacy {
            file,
            storages,
            unknown,
        },
    })
}

/// The object of a legacy file, its pickle's length, the storage keys, and
/// where the storages start; the error says whether more bytes could help.
type LegacyPickles = (Pickle, usize, Vec<String>, u64);

fn parse_legacy_pickles(
    path: &Path,
    buf: &[u8],
) -> std::result::Result<LegacyPickles, (Error, bool)> {
    let mut at = 0usize;
    let mut next = |what: &str| -> std::result::Result<(Pickle, usize), (Error, bool)> {
        match pickle::parse(&buf[at..]) {
            Ok((p, n)) => {
                at += n;
                Ok((p, n))
            }
            Err(e) => {
                let short = e.is_truncated();
                let e = PickleError {
                    at: e.at + at,
                    msg: e.msg,
                };
                Err((parse_error(path, what, e), short))
            }
        }
    };
    let (magic, _) = next("the magic number")?;
    let (version, _) = next("the format version")?;
    next("the system information")?;
    let (object, object_len) = next("the saved object")?;
    let (keys, _) = next("the storage list")?;
    if magic.root != Value::BigInt(LEGACY_MAGIC[..].into()) {
        return Err((
            bad_file(path, "not a PyTorch file (wrong magic number)"),
            false,
        ));
    }
    if version.root != Value::Int(1001) {
        return Err((
            bad_file(
                path,
                format!("legacy format version {:?} (1001 expected)", version.root),
            ),
            false,
        ));
    }
    let key_list = match &keys.root {
        Value::Obj(id) => match &keys.objects[*id] {
            Obj::List(items) => items
                .iter()
                .map(|k| match k {
                    Value::Str(s) => Ok(s.to_string()),
                    _ => Err(()),
                })
                .collect::<std::result::Result<Vec<_>, ()>>()
                .ok(),
            _ => None,
        },
        _ => None,
    };
    let Some(key_list) = key_list else {
        return Err((
            bad_file(path, "the storage list is not a list of names"),
            false,
        ));
    };
    Ok((object, object_len, key_list, at as u64))
}
