//! The IDX format of the MNIST files (`train-images-idx3-ubyte`, ...), raw or
//! gzipped.
//!
//! An IDX file is: two zero bytes, a type byte, a byte with the number of
//! dimensions, each dimension as a big-endian u32, then the values, big-endian,
//! row-major.

use crate::{
    device::Device,
    dtype::DType,
    error::{Error, Result},
    tensor::Tensor,
};
use std::io::{Read, Write};
use std::path::Path;

/// The element types of the format: (type byte, name, bytes per value).
const TYPES: [(u8, &str, usize); 6] = [
    (0x08, "u8", 1),
    (0x09, "i8", 1),
    (0x0B, "i16", 2),
    (0x0C, "i32", 4),
    (0x0D, "f32", 4),
    (0x0E, "f64", 8),
];

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Reads an IDX file into a CPU tensor of the file's shape: u8 values give a
/// uint8 tensor, i8/i16/i32 int64, f32 float32 and f64 float64. A gzipped file
/// (`train-images-idx3-ubyte.gz`) is recognised by its magic bytes and
/// decompressed.
///
/// A malformed file is an error, never a panic: wrong magic bytes, an unknown
/// type, a truncated header or data, bytes after the data. A gzipped file is
/// inflated no further than its header allows (see [`parse_idx`]), so a small
/// file that would decompress to gigabytes is refused with bounded memory.
pub fn read_idx(path: impl AsRef<Path>) -> Result<Tensor> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(io_err(path))?;
    parse_idx(&bytes, &path.display().to_string())
}

/// Decodes the bytes of an IDX file (gzipped or not), like [`read_idx`]; `name`
/// stands for the source in error messages.
///
/// Gzipped data is inflated only as far as its header allows: once the header
/// is read, at most one byte more than the values it announces is decompressed,
/// so a small file that inflates to gigabytes (a "gzip bomb") is refused without
/// being expanded. A header that announces more bytes than the compressed file
/// could possibly hold is refused before anything else is inflated.
pub fn parse_idx(bytes: &[u8], name: &str) -> Result<Tensor> {
    if bytes.starts_with(&[0x1f, 0x8b]) {
        return decode(&inflate(bytes, name)?, name);
    }
    decode(bytes, name)
}

/// The most bytes that deflate can produce from one compressed byte: a block
/// codes at most 258 repeated bytes with one bit for the length and one for the
/// distance, 1032 to 1; rounded up for the gzip framing.
const MAX_GZIP_RATIO: u64 = 1100;

fn parse_err(name: &str, msg: String) -> Error {
    Error::Parse {
        file: name.to_string(),
        line: None,
        msg,
    }
}

/// Reads from the gzip stream `gz` until `buf` is full or the stream ends;
/// returns how many bytes were read.
fn read_full(gz: &mut impl Read, buf: &mut [u8], name: &str) -> Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match gz.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(parse_err(
                    name,
                    format!("cannot decompress the gzip data: {e}"),
                ))
            }
        }
    }
    Ok(got)
}

/// Decompresses a gzipped IDX file: its header, then no more than the values
/// that header announces plus one byte (which, if present, shows the stream is
/// too long). Returns the uncompressed header and values.
fn inflate(bytes: &[u8], name: &str) -> Result<Vec<u8>> {
    let mut gz = flate2::read::MultiGzDecoder::new(bytes);
    let mut out = vec![0u8; 4];
    let got = read_full(&mut gz, &mut out, name)?;
    if got < 4 {
        return Err(parse_err(
            name,
            format!(
                "truncated IDX header in the gzip data: expected at least 4 bytes, found {got}"
            ),
        ));
    }
    let (tname, size) = check_magic(&out, name)?;
    let ndim = out[3] as usize;
    let header = 4 + 4 * ndim;
    out.resize(header, 0);
    let got = read_full(&mut gz, &mut out[4..], name)?;
    if got < 4 * ndim {
        return Err(parse_err(
            name,
            format!(
                "truncated IDX header in the gzip data: {ndim} dimensions need {header} \
                 header bytes, found {}",
                4 + got
            ),
        ));
    }
    let (dims, expected) = payload_len(&out, tname, size, name)?;
    let limit = (bytes.len() as u64).saturating_mul(MAX_GZIP_RATIO);
    if expected as u64 > limit {
        return Err(parse_err(
            name,
            format!(
                "the IDX header announces shape {dims:?}, {expected} bytes of values, but \
                 {} bytes of gzip data cannot decompress to more than {limit} bytes \
                 (damaged header or truncated file)",
                bytes.len()
            ),
        ));
    }
    // `take` bounds what is inflated, and so the memory, by the header's promise.
    let mut rest = gz.take(expected as u64 + 1);
    rest.read_to_end(&mut out)
        .map_err(|e| parse_err(name, format!("cannot decompress the gzip data: {e}")))?;
    let found = out.len() - header;
    if found > expected {
        return Err(parse_err(
            name,
            format!(
                "the gzip data decompresses to more than the IDX header announces: shape \
                 {dims:?} needs {expected} bytes after the header, and the stream goes on \
                 past that (trailing data or a gzip bomb; decompression stopped there)"
            ),
        ));
    }
    Ok(out)
}

/// Checks the magic bytes and type byte of an IDX header (`head` holds at least
/// 4 bytes); returns the type's name and bytes per value.
fn check_magic(head: &[u8], name: &str) -> Result<(&'static str, usize)> {
    if head[0] != 0 || head[1] != 0 {
        return Err(parse_err(
            name,
            format!(
                "not an IDX file: it starts with 0x{:02x} 0x{:02x}, expected 0x00 0x00",
                head[0], head[1]
            ),
        ));
    }
    let code = head[2];
    let Some(&(_, tname, size)) = TYPES.iter().find(|t| t.0 == code) else {
        return Err(parse_err(
            name,
            format!(
                "unknown IDX data type 0x{code:02x} (expected 0x08 u8, 0x09 i8, 0x0b i16, \
                 0x0c i32, 0x0d f32 or 0x0e f64)"
            ),
        ));
    };
    Ok((tname, size))
}

/// The dimensions of a complete IDX header and the number of bytes of values
/// they announce, or an error when that count overflows.
fn payload_len(head: &[u8], tname: &str, size: usize, name: &str) -> Result<(Vec<usize>, usize)> {
    let dims: Vec<usize> = head[4..]
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as usize)
        .collect();
    // Zero sizes are skipped in the bound, as tensor shapes require: `[0, 2^32 - 1,
    // 2^32 - 1, 2^32 - 1]` holds no values but its strides would overflow.
    let fits = dims
        .iter()
        .try_fold(size, |n, &d| n.checked_mul(d.max(1)))
        .is_some_and(|n| n <= isize::MAX as usize);
    if !fits {
        return Err(parse_err(
            name,
            format!(
                "the dimensions {dims:?} hold more {tname} values than memory can address \
                 (zero sizes aside, their product overflows)"
            ),
        ));
    }
    let expected = dims.iter().product::<usize>() * size;
    Ok((dims, expected))
}

/// Decodes uncompressed IDX bytes.
fn decode(bytes: &[u8], name: &str) -> Result<Tensor> {
    let err = |msg: String| parse_err(name, msg);
    if bytes.len() < 4 {
        return Err(err(format!(
            "truncated IDX header: expected at least 4 bytes, found {}",
            bytes.len()
        )));
    }
    let (tname, size) = check_magic(bytes, name)?;
    let code = bytes[2];
    let ndim = bytes[3] as usize;
    let header = 4 + 4 * ndim;
    if bytes.len() < header {
        return Err(err(format!(
            "truncated IDX header: {ndim} dimensions need {header} header bytes, found {}",
            bytes.len()
        )));
    }
    let (dims, expected) = payload_len(&bytes[..header], tname, size, name)?;
    let data = &bytes[header..];
    if data.len() < expected {
        return Err(err(format!(
            "truncated IDX data: shape {dims:?} of {tname} needs {expected} bytes after the \
             header, found {}",
            data.len()
        )));
    }
    if data.len() > expected {
        return Err(err(format!(
            "{} trailing bytes after the IDX data (shape {dims:?} of {tname} needs {expected} \
             bytes, found {})",
            data.len() - expected,
            data.len()
        )));
    }
    let dev = Device::Cpu;
    match code {
        0x08 => Tensor::from_vec(data.to_vec(), dims, &dev),
        0x09 => Tensor::from_vec(
            data.iter().map(|&b| b as i8 as i64).collect::<Vec<_>>(),
            dims,
            &dev,
        ),
        0x0B => Tensor::from_vec(
            data.chunks_exact(2)
                .map(|c| i16::from_be_bytes([c[0], c[1]]) as i64)
                .collect::<Vec<_>>(),
            dims,
            &dev,
        ),
        0x0C => Tensor::from_vec(
            data.chunks_exact(4)
                .map(|c| i32::from_be_bytes(c.try_into().expect("4 bytes")) as i64)
                .collect::<Vec<_>>(),
            dims,
            &dev,
        ),
        0x0D => Tensor::from_vec(
            data.chunks_exact(4)
                .map(|c| f32::from_be_bytes(c.try_into().expect("4 bytes")))
                .collect::<Vec<_>>(),
            dims,
            &dev,
        ),
        _ => Tensor::from_vec(
            data.chunks_exact(8)
                .map(|c| f64::from_be_bytes(c.try_into().expect("8 bytes")))
                .collect::<Vec<_>>(),
            dims,
            &dev,
        ),
    }
}

/// The IDX bytes (uncompressed) of `tensor`: uint8 as u8, float32 as f32, float64
/// as f64 and int64 as i32 (an error for values outside the i32 range). Other
/// dtypes, more than 255 dimensions or a dimension above `u32::MAX` are errors.
pub fn encode_idx(tensor: &Tensor) -> Result<Vec<u8>> {
    const OP: &str = "write_idx";
    let (code, size) = match tensor.dtype() {
        DType::U8 => (0x08u8, 1),
        DType::I64 => (0x0C, 4),
        DType::F32 => (0x0D, 4),
        DType::F64 => (0x0E, 8),
        d => {
            return Err(Error::dtype(
                OP,
                d,
                "IDX stores uint8, int64 (as i32), float32 and float64; convert with to_dtype",
            ))
        }
    };
    let rank = u8::try_from(tensor.rank()).map_err(|_| {
        Error::invalid(
            OP,
            format!(
                "IDX files hold at most 255 dimensions, the tensor has {}",
                tensor.rank()
            ),
        )
    })?;
    let mut out = Vec::with_capacity(4 + 4 * tensor.rank() + size * tensor.numel());
    out.extend_from_slice(&[0, 0, code, rank]);
    for &d in tensor.shape() {
        let d = u32::try_from(d).map_err(|_| {
            Error::invalid(
                OP,
                format!(
                    "IDX dimensions are u32, {d} does not fit (shape {:?})",
                    tensor.shape()
                ),
            )
        })?;
        out.extend_from_slice(&d.to_be_bytes());
    }
    match tensor.dtype() {
        DType::U8 => out.extend(tensor.to_vec::<u8>()?),
        DType::F32 => {
            for x in tensor.to_vec::<f32>()? {
                out.extend_from_slice(&x.to_be_bytes());
            }
        }
        DType::F64 => {
            for x in tensor.to_vec::<f64>()? {
                out.extend_from_slice(&x.to_be_bytes());
            }
        }
        _ => {
            for x in tensor.to_vec::<i64>()? {
                let x = i32::try_from(x).map_err(|_| {
                    Error::invalid(
                        OP,
                        format!("IDX stores int64 tensors as i32, and {x} does not fit"),
                    )
                })?;
                out.extend_from_slice(&x.to_be_bytes());
            }
        }
    }
    Ok(out)
}

/// Writes `tensor` as an IDX file (see [`encode_idx`] for the dtypes), gzipped
/// when `path` ends in `.gz`.
pub fn write_idx(path: impl AsRef<Path>, tensor: &Tensor) -> Result<()> {
    let path = path.as_ref();
    let raw = encode_idx(tensor)?;
    let bytes = if path.extension().is_some_and(|e| e == "gz") {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&raw).map_err(io_err(path))?;
        gz.finish().map_err(io_err(path))?
    } else {
        raw
    };
    crate::files::write_atomic(path, &bytes)
}
