//! IDX, raw and gzipped: `parse_idx` and `read_idx`.
use super::*;

const IDX_NAME: &str = "fuzz.idx";

/// The IDX type codes and their bytes per value.
const IDX_TYPES: [(u8, usize); 6] = [
    (0x08, 1),
    (0x09, 1),
    (0x0B, 2),
    (0x0C, 4),
    (0x0D, 4),
    (0x0E, 8),
];

/// How an IDX file is packed for a case.
#[derive(Clone, Debug)]
enum Packing {
    Raw,
    Gzip(u32),
    /// Gzipped, then the compressed bytes damaged.
    GzipDamaged(u32, Vec<Damage>),
    /// Gzipped, then bytes appended.
    GzipTrailing(Vec<u8>),
    /// Two gzip members, split at a position.
    TwoMembers(Index),
}

fn packing() -> impl Strategy<Value = Packing> {
    prop_oneof![
        3 => Just(Packing::Raw),
        2 => (0u32..10).prop_map(Packing::Gzip),
        2 => (0u32..10, damages(3)).prop_map(|(l, d)| Packing::GzipDamaged(l, d)),
        1 => prop::collection::vec(any::<u8>(), 1..32).prop_map(Packing::GzipTrailing),
        1 => any::<Index>().prop_map(Packing::TwoMembers),
    ]
}

fn pack(raw: &[u8], p: &Packing) -> Vec<u8> {
    match p {
        Packing::Raw => raw.to_vec(),
        Packing::Gzip(level) => gzip(raw, *level),
        Packing::GzipDamaged(level, ds) => damaged(gzip(raw, *level), ds),
        Packing::GzipTrailing(junk) => [gzip(raw, 6), junk.clone()].concat(),
        Packing::TwoMembers(at) => {
            let at = at.index(raw.len() + 1);
            [gzip(&raw[..at], 6), gzip(&raw[at..], 1)].concat()
        }
    }
}

/// An IDX file from its parts: a type code, dimensions, and a payload as long
/// as the dimensions need (when that is small) give or take a few bytes.
fn idx_file() -> impl Strategy<Value = Vec<u8>> {
    let code = prop_oneof![
        6 => prop::sample::select(IDX_TYPES.iter().map(|t| t.0).collect::<Vec<u8>>()),
        1 => any::<u8>(),
    ];
    let dim = prop_oneof![
        6 => 0u32..5,
        1 => any::<u32>(),
        1 => Just(u32::MAX),
    ];
    (
        code,
        prop::collection::vec(dim, 0..5),
        prop_oneof![4 => Just(0i64), 1 => -3i64..4],
        prop::collection::vec(any::<u8>(), 1..32),
    )
        .prop_map(|(code, dims, delta, fill)| {
            let size = IDX_TYPES.iter().find(|t| t.0 == code).map_or(1, |t| t.1);
            let mut b = vec![0, 0, code, dims.len() as u8];
            for d in &dims {
                b.extend(d.to_be_bytes());
            }
            let need = dims
                .iter()
                .try_fold(size as u64, |n, &d| n.checked_mul(u64::from(d)))
                .filter(|&n| n <= 4096)
                .unwrap_or(16);
            let len = (need as i64 + delta).max(0) as usize;
            b.extend(fill.iter().cycle().take(len));
            b
        })
}

/// The IDX bytes a result came from: `input`, or the whole of its gzip
/// decompression.
fn idx_raw(input: &[u8]) -> Check<Vec<u8>> {
    if !input.starts_with(&[0x1f, 0x8b]) {
        return Ok(input.to_vec());
    }
    let mut raw = Vec::new();
    flate2::read::MultiGzDecoder::new(input)
        .read_to_end(&mut raw)
        .map_err(|e| TestCaseError::fail(format!("read as IDX, but not valid gzip: {e}")))?;
    Ok(raw)
}

/// Checks a tensor read from `input`: it has the shape the header gives, a dtype
/// for the header's type, exactly the payload's values, and the payload has
/// exactly the bytes the shape needs.
fn check_idx_tensor(input: &[u8], t: &Tensor) -> Check {
    let raw = idx_raw(input)?;
    prop_assert!(raw.len() >= 4 && raw[0] == 0 && raw[1] == 0);
    let (code, rank) = (raw[2], raw[3] as usize);
    let size = IDX_TYPES
        .iter()
        .find(|t| t.0 == code)
        .map(|t| t.1)
        .ok_or_else(|| TestCaseError::fail(format!("type 0x{code:02x} was accepted")))?;
    let dims: Vec<usize> = raw[4..4 + 4 * rank]
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as usize)
        .collect();
    prop_assert_eq!(t.shape(), &dims[..]);
    prop_assert_eq!(t.numel(), dims.iter().product::<usize>());
    prop_assert_eq!(raw.len(), 4 + 4 * rank + size * t.numel());
    let want = match code {
        0x08 => DType::U8,
        0x09..=0x0C => DType::I64,
        0x0D => DType::F32,
        _ => DType::F64,
    };
    prop_assert_eq!(t.dtype(), want);
    let payload = &raw[4 + 4 * rank..];
    if matches!(code, 0x09 | 0x0B) {
        let got = ok(t.to_vec::<i64>())?;
        let expect: Vec<i64> = if code == 0x09 {
            payload.iter().map(|&b| i64::from(b as i8)).collect()
        } else {
            payload
                .chunks_exact(2)
                .map(|c| i64::from(i16::from_be_bytes([c[0], c[1]])))
                .collect()
        };
        prop_assert_eq!(got, expect);
    } else {
        // u8, i32, f32 and f64 tensors encode back to the very same bytes
        prop_assert_eq!(ok(encode_idx(t))?, raw);
    }
    Ok(())
}

fn idx_case(input: &[u8]) -> Check {
    let r = parse_idx(input, IDX_NAME);
    tally(&r);
    match r {
        Ok(t) => check_idx_tensor(input, &t),
        Err(Error::Parse { file, .. }) if file == IDX_NAME => Ok(()),
        Err(e) => Err(TestCaseError::fail(format!(
            "not a parse error of {IDX_NAME}: {e:?}"
        ))),
    }
}

fn idx_arbitrary() -> Prop {
    let bytes = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..128),
        // past the magic bytes
        prop::collection::vec(any::<u8>(), 0..128).prop_map(|b| [&[0u8, 0][..], &b].concat()),
        (prop::collection::vec(any::<u8>(), 0..128), 0u32..10).prop_map(|(b, l)| gzip(&b, l)),
    ];
    prop(bytes, |b| idx_case(&b))
}

fn idx_structured() -> Prop {
    prop(
        (idx_file(), prop::collection::vec(damage(), 0..3), packing()),
        |(file, ds, p)| idx_case(&pack(&damaged(file, &ds), &p)),
    )
}

/// A tensor IDX can hold, with a small shape: uint8, int64 in the i32 range,
/// float32 or float64 (any bits, NaNs included).
fn idx_tensor() -> impl Strategy<Value = (u8, Vec<usize>, Vec<u64>)> {
    (
        prop::sample::select(vec![0x08u8, 0x0C, 0x0D, 0x0E]),
        prop::collection::vec(0usize..4, 0..4),
    )
        .prop_flat_map(|(code, shape)| {
            let n = shape.iter().product::<usize>();
            (
                Just(code),
                Just(shape),
                prop::collection::vec(any::<u64>(), n),
            )
        })
}

fn make_idx_tensor(code: u8, shape: &[usize], bits: &[u64]) -> Tensor {
    let dev = Device::Cpu;
    let shape = shape.to_vec();
    match code {
        0x08 => Tensor::from_vec(
            bits.iter().map(|&b| b as u8).collect::<Vec<_>>(),
            shape,
            &dev,
        ),
        0x0C => Tensor::from_vec(
            bits.iter()
                .map(|&b| i64::from(b as i32))
                .collect::<Vec<_>>(),
            shape,
            &dev,
        ),
        0x0D => Tensor::from_vec(
            bits.iter()
                .map(|&b| f32::from_bits(b as u32))
                .collect::<Vec<_>>(),
            shape,
            &dev,
        ),
        _ => Tensor::from_vec(
            bits.iter().map(|&b| f64::from_bits(b)).collect::<Vec<_>>(),
            shape,
            &dev,
        ),
    }
    .expect("a tensor of a valid shape")
}

/// Valid tensors written as IDX (raw, or gzipped in one or two members) read
/// back with their shape, dtype and bits.
fn idx_valid() -> Prop {
    prop((idx_tensor(), packing()), |((code, shape, bits), p)| {
        let t = make_idx_tensor(code, &shape, &bits);
        let raw = ok(encode_idx(&t))?;
        let p = match p {
            Packing::GzipDamaged(level, _) | Packing::Gzip(level) => Packing::Gzip(level),
            Packing::GzipTrailing(_) => Packing::Raw,
            p => p,
        };
        let input = pack(&raw, &p);
        let back = ok(parse_idx(&input, IDX_NAME))?;
        prop_assert_eq!(back.shape(), t.shape());
        prop_assert_eq!(back.dtype(), t.dtype());
        prop_assert_eq!(ok(encode_idx(&back))?, raw);
        check_idx_tensor(&input, &back)
    })
}

#[test]
fn idx_arbitrary_bytes_never_panic() {
    check(500, idx_arbitrary());
}

#[test]
fn idx_damaged_files_never_panic() {
    check(800, idx_structured());
}

#[test]
fn idx_valid_files_read_back() {
    check(300, idx_valid());
}

#[test]
#[ignore = "long fuzz run: EMBER_FUZZ_SECS (600) seconds"]
fn fuzz_idx_long() {
    fuzz_long(
        "idx",
        vec![
            ("arbitrary", idx_arbitrary()),
            ("damaged", idx_structured()),
            ("valid", idx_valid()),
        ],
    );
}

/// A gzipped IDX file: the header of a u8 tensor of shape `dims`, then `zeros`
/// zero bytes, compressed in chunks (never held whole in memory), as `members`
/// gzip members.
fn write_gzip_idx(path: &Path, dims: &[u32], zeros: usize, members: usize) {
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let chunk = vec![0u8; 1 << 20];
    let per_member = zeros.div_ceil(members.max(1));
    let mut left = zeros;
    for m in 0..members.max(1) {
        let mut gz = flate2::write::GzEncoder::new(&mut file, flate2::Compression::default());
        if m == 0 {
            let mut head = vec![0u8, 0, 0x08, dims.len() as u8];
            for d in dims {
                head.extend(d.to_be_bytes());
            }
            gz.write_all(&head).unwrap();
        }
        let mut this = per_member.min(left);
        left -= this;
        while this > 0 {
            let n = this.min(chunk.len());
            gz.write_all(&chunk[..n]).unwrap();
            this -= n;
        }
        gz.finish().unwrap();
    }
    file.flush().unwrap();
}

/// The error of reading `path` as IDX, and the largest allocation made doing so.
fn idx_error(path: &Path) -> (String, usize) {
    let (r, largest) = largest_allocation(|| read_idx(path));
    let e = r.expect_err("the file must be refused");
    assert!(matches!(e, Error::Parse { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.starts_with(&path.display().to_string()), "{msg}");
    (msg, largest)
}

const MIB: usize = 1 << 20;

#[test]
fn idx_gzip_bomb_is_refused_without_inflating_it() {
    let dir = Scratch::new("bomb");
    let path = dir.file("bomb-images-idx3-ubyte.gz");
    // a header for 16 values, then 200 MB of zeros: about 200 KB compressed
    write_gzip_idx(&path, &[4, 4], 200 * MIB, 1);
    let size = std::fs::metadata(&path).unwrap().len() as usize;
    assert!(size < 2 * MIB, "the bomb is {size} bytes");
    let start = Instant::now();
    let (msg, largest) = idx_error(&path);
    assert!(
        msg.contains("decompresses to more than the IDX header announces")
            && msg.contains("needs 16 bytes"),
        "{msg}"
    );
    // reading the compressed file is the largest allocation; inflating the 200 MB
    // would have needed buffers of more than 100 MB
    assert!(largest <= size + MIB, "an allocation of {largest} bytes");
    eprintln!(
        "200 MB gzip bomb ({size} bytes) refused in {:?}, largest allocation {largest} bytes",
        start.elapsed()
    );

    // the same stream as 200 gzip members of 1 MB each
    write_gzip_idx(&path, &[4, 4], 200 * MIB, 200);
    let (msg, largest) = idx_error(&path);
    assert!(msg.contains("decompresses to more than"), "{msg}");
    assert!(largest <= 2 * MIB, "an allocation of {largest} bytes");
}

#[test]
fn idx_gzip_payload_shorter_than_the_header_is_an_error() {
    let dir = Scratch::new("short");
    let path = dir.file("short.idx.gz");
    write_gzip_idx(&path, &[10, 100], 999, 1);
    let (msg, _) = idx_error(&path);
    assert!(
        msg.contains("truncated IDX data")
            && msg.contains("needs 1000 bytes")
            && msg.contains("found 999"),
        "{msg}"
    );
    // one byte too many, raw and gzipped
    write_gzip_idx(&path, &[10, 100], 1001, 1);
    let (msg, _) = idx_error(&path);
    assert!(msg.contains("decompresses to more than"), "{msg}");
    // exactly right
    write_gzip_idx(&path, &[10, 100], 1000, 3);
    let t = read_idx(&path).unwrap();
    assert_eq!((t.shape(), t.dtype()), (&[10, 100][..], DType::U8));
    assert!(t.to_vec::<u8>().unwrap().iter().all(|&v| v == 0));
}

#[test]
fn idx_gzip_header_beyond_what_the_file_can_hold_is_refused_up_front() {
    let dir = Scratch::new("absurd");
    let path = dir.file("absurd.idx.gz");
    // MNIST's training images (47 MB) announced by a file of a few dozen bytes
    // that holds 100 of them: refused before anything past the header is
    // inflated, so no buffer for the 47 MB is ever made
    write_gzip_idx(&path, &[60000, 28, 28], 100, 1);
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(size < 100, "{size}");
    let (msg, largest) = idx_error(&path);
    assert!(
        msg.contains("47040000 bytes of values") && msg.contains("cannot decompress to more than"),
        "{msg}"
    );
    assert!(largest < MIB, "an allocation of {largest} bytes");
    // dimensions whose product overflows, or overflows past a zero
    for dims in [&[u32::MAX; 4][..], &[0, u32::MAX, u32::MAX, u32::MAX]] {
        write_gzip_idx(&path, dims, 0, 1);
        let (msg, _) = idx_error(&path);
        assert!(msg.contains("than memory can address"), "{msg}");
    }
}
