//! PyTorch's `torch.save` files: `PtFile` (open, entries, load), `load_pt`, and
//! `load_state_dict` of a `.pt`. Files PyTorch wrote (tests/golden/pt/) damaged
//! as bytes, their pickles damaged inside a sound zip, arbitrary bytes behind
//! each format's first bytes, and a hostile-file suite built here.

use super::*;
use ember::io::PtFile;
use std::io::Cursor;

fn golden(name: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/pt")).join(name)
}

/// The files PyTorch wrote, to damage: both layouts, views, every dtype, nested
/// checkpoints, objects ember refuses.
const BASES: [&str; 11] = [
    "views_legacy_p1.pt",
    "dtypes.pt",
    "dtypes_legacy.pt",
    "dtypes_p4.pt",
    "views_legacy_p4.pt",
    "views.pt",
    "views_legacy.pt",
    "checkpoint.pt",
    "small_net.pth",
    "int32.pt",
    "os_system.pt",
];

fn bases() -> &'static [Vec<u8>] {
    static B: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    B.get_or_init(|| {
        BASES
            .iter()
            .map(|n| std::fs::read(golden(n)).expect("tests/golden/pt"))
            .collect()
    })
}

// ---------------------------------------------------------------------------
// Writing crafted files

/// A protocol-2 pickle, written opcode by opcode.
struct Pickler(Vec<u8>);

impl Pickler {
    fn new() -> Pickler {
        Pickler(vec![0x80, 2])
    }
    fn op(&mut self, op: u8) -> &mut Self {
        self.0.push(op);
        self
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.op(b'X');
        self.0.extend((s.len() as u32).to_le_bytes());
        self.0.extend(s.as_bytes());
        self
    }
    /// Any i64, as LONG1 with 8 bytes.
    fn int(&mut self, v: i64) -> &mut Self {
        self.0.extend([0x8a, 8]);
        self.0.extend(v.to_le_bytes());
        self
    }
    fn global(&mut self, module: &str, name: &str) -> &mut Self {
        self.op(b'c');
        self.0.extend(format!("{module}\n{name}\n").bytes());
        self
    }
    fn ints(&mut self, v: &[i64]) -> &mut Self {
        self.op(b'(');
        for &x in v {
            self.int(x);
        }
        self.op(b't')
    }
    /// `_rebuild_tensor_v2(storage, offset, shape, stride, False, {})`.
    fn tensor(&mut self, t: &Crafted) -> &mut Self {
        self.global("torch._utils", "_rebuild_tensor_v2").op(b'(');
        self.op(b'(')
            .str("storage")
            .global("torch", t.class)
            .str(t.key)
            .str("cpu");
        self.int(t.numel).op(b't').op(b'Q');
        self.int(t.offset).ints(&t.shape).ints(&t.stride);
        self.op(0x89).op(b'}').op(b't').op(b'R')
    }
    fn done(&mut self) -> Vec<u8> {
        self.op(b'.');
        std::mem::take(&mut self.0)
    }
}

/// One tensor of a crafted file.
struct Crafted {
    name: &'static str,
    class: &'static str,
    key: &'static str,
    numel: i64,
    offset: i64,
    shape: Vec<i64>,
    stride: Vec<i64>,
}

fn f32s(
    name: &'static str,
    key: &'static str,
    numel: i64,
    offset: i64,
    shape: &[i64],
    stride: &[i64],
) -> Crafted {
    Crafted {
        name,
        class: "FloatStorage",
        key,
        numel,
        offset,
        shape: shape.to_vec(),
        stride: stride.to_vec(),
    }
}

/// `{name: tensor, ...}` as torch.save pickles a state dict.
fn state_pickle(ts: &[Crafted]) -> Vec<u8> {
    let mut p = Pickler::new();
    p.op(b'}').op(b'(');
    for t in ts {
        p.str(t.name).tensor(t);
    }
    p.op(b'u').done()
}

/// A zip archive in torch.save's layout (`archive/NAME`), records stored or
/// deflated.
fn archive(records: &[(&str, &[u8])], deflate: bool) -> Vec<u8> {
    let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let method = if deflate {
        zip::CompressionMethod::Deflated
    } else {
        zip::CompressionMethod::Stored
    };
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(method)
        .large_file(false);
    for (name, bytes) in records {
        w.start_file(format!("archive/{name}"), opts).unwrap();
        w.write_all(bytes).unwrap();
    }
    w.finish().unwrap().into_inner()
}

/// Writes `bytes` and loads them, returning the error's text (the case must
/// fail) and the largest allocation the load made.
fn refused(tag: &str, bytes: &[u8]) -> (String, usize) {
    let dir = Scratch::new(tag);
    let path = dir.file("crafted.pt");
    std::fs::write(&path, bytes).unwrap();
    let (r, largest) = largest_allocation(|| ember::io::load_pt(&path, &Device::Cpu));
    match r {
        Ok(ts) => panic!(
            "{tag}: a crafted file loaded: {:?}",
            ts.iter().map(|(n, _)| n).collect::<Vec<_>>()
        ),
        Err(e) => (e.to_string(), largest),
    }
}

/// An allocation no crafted case here may pass: a few times the largest file.
const SMALL: usize = 1 << 20;

// ---------------------------------------------------------------------------
// The hostile-file suite

#[test]
fn globals_that_would_run_code_are_named_never_called() {
    for (module, name, shown) in [
        ("os", "system", "os.system"),
        ("posix", "system", "posix.system"),
        ("builtins", "eval", "builtins.eval"),
        ("__builtin__", "exec", "builtins.exec"),
        ("subprocess", "Popen", "subprocess.Popen"),
    ] {
        let mut p = Pickler::new();
        p.op(b'}')
            .str("x")
            .global(module, name)
            .str("echo owned")
            .op(0x85)
            .op(b'R')
            .op(b's');
        let bytes = archive(&[("data.pkl", &p.done())], false);
        let (e, _) = refused("globals", &bytes);
        assert!(
            e.contains(&format!("`{shown}`")) && e.contains("never run"),
            "{e}"
        );
    }
}

#[test]
fn views_past_their_storage_are_refused() {
    let data = [0u8; 16];
    for (t, says) in [
        (
            f32s("short", "0", 4, 0, &[10], &[1]),
            "reaches past the end",
        ),
        (
            f32s("offset", "0", 4, 100, &[1], &[1]),
            "reaches past the end",
        ),
        (
            f32s("strided", "0", 4, 0, &[2, 2], &[3, 1]),
            "reaches past the end",
        ),
        (
            f32s("wide", "0", 4, 0, &[1 << 40, 1 << 40], &[1, 1]),
            "do not fit",
        ),
        (
            f32s("long", "0", 4, 0, &[1 << 40], &[1]),
            "reaches past the end",
        ),
        (
            f32s("overflow", "0", 4, 0, &[1 << 62, 1 << 62], &[0, 0]),
            "do not fit",
        ),
        (f32s("negative", "0", 4, 0, &[-1], &[1]), "non-negative"),
        (
            f32s("broadcast", "0", 4, 0, &[1 << 30], &[0]),
            "broadcast view",
        ),
    ] {
        let bytes = archive(
            &[("data.pkl", &state_pickle(&[t])), ("data/0", &data)],
            false,
        );
        let (e, largest) = refused("views", &bytes);
        assert!(e.contains(says), "{e}");
        assert!(largest < SMALL, "{says}: allocated {largest} bytes");
    }
}

#[test]
fn storages_the_file_does_not_hold_are_refused_before_allocating() {
    for (numel, record, says) in [
        (
            1i64 << 61,
            16usize,
            "holds 16 bytes where its storage needs",
        ),
        (8, 16, "holds 16 bytes where its storage needs 32"),
        (4, 0, "holds 0 bytes"),
    ] {
        let t = f32s("w", "0", numel, 0, &[4], &[1]);
        let data = vec![0u8; record];
        let bytes = archive(
            &[("data.pkl", &state_pickle(&[t])), ("data/0", &data)],
            false,
        );
        let (e, largest) = refused("storages", &bytes);
        assert!(e.contains(says), "{e}");
        assert!(largest < SMALL, "allocated {largest} bytes");
    }
    // a storage named but not in the archive
    let t = f32s("w", "7", 4, 0, &[4], &[1]);
    let (e, _) = refused(
        "missing",
        &archive(&[("data.pkl", &state_pickle(&[t]))], false),
    );
    assert!(e.contains("data/7 is not in the archive"), "{e}");
}

#[test]
fn deep_and_self_referring_structures_are_refused() {
    // a hundred thousand nested lists: read without recursion, refused when walked
    let mut p = Pickler::new();
    for _ in 0..100_000 {
        p.op(b']');
    }
    for _ in 0..99_999 {
        p.op(b'a');
    }
    let (e, _) = refused("deep", &archive(&[("data.pkl", &p.done())], false));
    assert!(e.contains("nest more than"), "{e}");
    // a list that holds itself
    let mut p = Pickler::new();
    p.op(b']').op(b'q').op(0).op(b'h').op(0).op(b'a');
    let (e, _) = refused("itself", &archive(&[("data.pkl", &p.done())], false));
    assert!(e.contains("themselves"), "{e}");
    // sixty levels of [x, x]: 2^60 paths to one tensor, refused at once
    let mut p = Pickler::new();
    p.tensor(&f32s("t", "0", 1, 0, &[1], &[1]));
    for _ in 0..60 {
        p.op(b'2').op(0x86);
    }
    let bytes = archive(&[("data.pkl", &p.done()), ("data/0", &[0u8; 4])], false);
    let start = Instant::now();
    let (e, _) = refused("shared", &bytes);
    assert!(e.contains("refer to each other too often"), "{e}");
    assert!(start.elapsed() < Duration::from_secs(10));
}

/// Rewrites the uncompressed size recorded for `name` in its local header and
/// in the central directory (a zip that lies about what a record expands to).
fn lie_about_size(zip: &mut [u8], name: &str, size: u32) {
    let full = format!("archive/{name}");
    let mut patched = 0;
    for at in 0..zip.len().saturating_sub(46) {
        let (sig, name_at, size_at) = match &zip[at..at + 4] {
            [b'P', b'K', 3, 4] => ("local", at + 30, at + 22),
            [b'P', b'K', 1, 2] => ("central", at + 46, at + 24),
            _ => continue,
        };
        let len_at = if sig == "local" { at + 26 } else { at + 28 };
        let len = u16::from_le_bytes([zip[len_at], zip[len_at + 1]]) as usize;
        if zip.get(name_at..name_at + len) == Some(full.as_bytes()) {
            zip[size_at..size_at + 4].copy_from_slice(&size.to_le_bytes());
            patched += 1;
        }
    }
    assert_eq!(patched, 2, "{name}: a local and a central header");
}

#[test]
fn zip_bombs_are_refused_without_inflating_them() {
    let zeros = vec![0u8; 64 << 20];
    // a record that honestly holds 64 MiB where the tensor needs 16 bytes
    let t = f32s("w", "0", 4, 0, &[4], &[1]);
    let bytes = archive(
        &[("data.pkl", &state_pickle(&[t])), ("data/0", &zeros)],
        true,
    );
    assert!(bytes.len() < 1 << 20, "64 MiB of zeros compress");
    let (e, largest) = refused("bomb", &bytes);
    assert!(e.contains("where its storage needs 16"), "{e}");
    assert!(largest < SMALL, "allocated {largest} bytes");
    // ... and one that says it holds 16 bytes but inflates to 64 MiB
    let t = f32s("w", "0", 4, 0, &[4], &[1]);
    let mut bytes = archive(
        &[("data.pkl", &state_pickle(&[t])), ("data/0", &zeros)],
        true,
    );
    lie_about_size(&mut bytes, "data/0", 16);
    let (e, largest) = refused("liar", &bytes);
    assert!(e.contains("data/0"), "{e}");
    assert!(largest < SMALL, "allocated {largest} bytes");
    // a pickle that claims 3 GiB
    let mut bytes = archive(&[("data.pkl", &zeros)], true);
    lie_about_size(&mut bytes, "data.pkl", 3 << 30);
    let (e, largest) = refused("pickle", &bytes);
    assert!(e.contains("at most"), "{e}");
    assert!(largest < SMALL, "allocated {largest} bytes");
}

/// A legacy-format file: the magic number, the format version, the system
/// information, `object`, the storage keys, then each storage as its element
/// count and bytes.
fn legacy(object: &[u8], storages: &[(&str, u64, &[u8])]) -> Vec<u8> {
    let mut out = vec![0x80, 2, 0x8a, 10];
    out.extend([
        0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, b'.',
    ]);
    out.extend([0x80, 2, b'M', 0xe9, 0x03, b'.']);
    out.extend([0x80, 2, b'}', b'.']);
    out.extend(object);
    let mut keys = Pickler::new();
    keys.op(b']').op(b'(');
    for (k, ..) in storages {
        keys.str(k);
    }
    out.extend(keys.op(b'e').done());
    for (_, numel, bytes) in storages {
        out.extend(numel.to_le_bytes());
        out.extend(*bytes);
    }
    out
}

#[test]
fn legacy_storages_are_checked_before_allocating() {
    let data = [0u8; 16];
    for (numel, stored, says) in [
        (1i64 << 40, 4u64, "holds 4 elements, not the 1099511627776"),
        (8, 4, "holds 4 elements, not the 8"),
        (4, 1 << 40, "more than the file has"),
    ] {
        let t = f32s("w", "0", numel, 0, &[4], &[1]);
        let bytes = legacy(&state_pickle(&[t]), &[("0", stored, &data)]);
        let (e, largest) = refused("legacy", &bytes);
        assert!(e.contains(says), "{e}");
        assert!(largest < SMALL, "allocated {largest} bytes");
    }
    // a storage the key list leaves out
    let t = f32s("w", "9", 4, 0, &[4], &[1]);
    let (e, _) = refused("legacy-missing", &legacy(&state_pickle(&[t]), &[]));
    assert!(e.contains("not stored in the file"), "{e}");
}

#[test]
fn crafted_calls_cost_little_and_never_recurse() {
    // _rebuild_from_type_v2 applied to a list that holds the call's own
    // arguments: read without recursing (the pickle reader never calls back into
    // itself for a builder's arguments)
    let mut p = Pickler::new();
    p.op(b'}').str("x");
    p.global("torch._tensor", "_rebuild_from_type_v2");
    p.op(b']').op(b'q').op(0).op(b'(');
    p.global("torch._tensor", "_rebuild_from_type_v2")
        .global("torch", "Tensor")
        .op(b'h')
        .op(0);
    p.op(b'e').op(b'R').op(b's');
    let (e, _) = refused("recurse", &archive(&[("data.pkl", &p.done())], false));
    assert!(e.contains("`torch.Tensor`"), "{e}");
    // a 200,000-item tuple given to 20,000 calls through the memo: no copies
    let mut p = Pickler::new();
    p.op(b'(');
    for _ in 0..200_000 {
        p.op(b'K').op(0);
    }
    p.op(b't').op(b'q').op(1).op(b'0').op(b']').op(b'(');
    for i in 0..20_000 {
        let (m, n) = if i % 2 == 0 {
            ("os", "system")
        } else {
            ("torch._utils", "_rebuild_tensor_v2")
        };
        p.global(m, n).op(b'h').op(1).op(b'R');
    }
    p.op(b'e');
    let bytes = archive(&[("data.pkl", &p.done())], false);
    let start = Instant::now();
    let (e, _) = refused("amplified", &bytes);
    assert!(e.contains("os.system"), "{e}");
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn repetition_is_refused_before_it_costs() {
    // one 1 MB key over 10,000 values: ten billion bytes of names
    let mut p = Pickler::new();
    p.op(b'}').str(&"k".repeat(1 << 20)).op(b']').op(b'(');
    for _ in 0..10_000 {
        p.op(b')');
    }
    p.op(b'e').op(b's');
    let (e, _) = refused("names", &archive(&[("data.pkl", &p.done())], false));
    assert!(e.contains("many times the file's size"), "{e}");
    // one 1 MiB key (memoised) nested 130 dicts deep: every level's name holds
    // the ones above it, gigabytes of names before the depth is refused
    let mut p = Pickler::new();
    p.op(b'}').str(&"k".repeat(1 << 20)).op(b'q').op(1).op(b'}');
    for _ in 0..129 {
        p.op(b'h').op(1).op(b'}');
    }
    for _ in 0..130 {
        p.op(b's');
    }
    let bytes = archive(&[("data.pkl", &p.done())], false);
    let dir = Scratch::new("nested-names");
    let path = dir.file("crafted.pt");
    std::fs::write(&path, bytes).unwrap();
    let (r, total) = total_allocation(|| ember::io::load_pt(&path, &Device::Cpu));
    let e = r.map(drop).unwrap_err().to_string();
    assert!(e.contains("many times the file's size"), "{e}");
    assert!(total < 256 << 20, "allocated {total} bytes in all");
    // one 1 MiB storage viewed whole by 1,000 tensors: a gigabyte of copies
    let mut p = Pickler::new();
    p.op(b'}').op(b'(');
    for i in 0..1000 {
        p.str(&format!("t{i}"))
            .tensor(&f32s("t", "0", 1 << 18, 0, &[1 << 18], &[1]));
    }
    p.op(b'u');
    let data = vec![0u8; 1 << 20];
    let bytes = archive(&[("data.pkl", &p.done()), ("data/0", &data)], false);
    let (e, largest) = refused("copies", &bytes);
    assert!(e.contains("its own copy"), "{e}");
    assert!(largest < 4 << 20, "allocated {largest} bytes");
    // the same views beside a tensor over a storage that claims 2^38 elements
    // and is not in the archive (a claim that would raise the copy budget): the
    // claim is checked before any copy
    let mut p = Pickler::new();
    p.op(b'}').op(b'(');
    for i in 0..1000 {
        p.str(&format!("t{i}"))
            .tensor(&f32s("t", "0", 1 << 18, 0, &[1 << 18], &[1]));
    }
    p.str("claim")
        .tensor(&f32s("claim", "1", 1 << 38, 0, &[1], &[1]));
    p.op(b'u');
    let bytes = archive(&[("data.pkl", &p.done()), ("data/0", &data)], false);
    let dir = Scratch::new("claimed");
    let path = dir.file("crafted.pt");
    std::fs::write(&path, bytes).unwrap();
    let (r, total) = total_allocation(|| ember::io::load_pt(&path, &Device::Cpu));
    let e = r.map(drop).unwrap_err().to_string();
    assert!(e.contains("not in the archive"), "{e}");
    assert!(total < 64 << 20, "allocated {total} bytes in all");
    // one list of 100,000 pairs made an OrderedDict 20,000 times through the
    // memo (5 bytes a call): each call would copy the list, 96 GB in all
    let mut p = Pickler::new();
    // the pair ("a", 1) in memo 0
    p.op(b'(')
        .str("a")
        .op(b'K')
        .op(1)
        .op(b't')
        .op(b'q')
        .op(0)
        .op(b'0');
    // the list of pairs in memo 1, and the call's arguments (list,) in memo 3
    p.op(b']').op(b'(');
    for _ in 0..100_000 {
        p.op(b'h').op(0);
    }
    p.op(b'e').op(b'q').op(1).op(b'0');
    p.op(b'(').op(b'h').op(1).op(b't').op(b'q').op(3).op(b'0');
    p.global("collections", "OrderedDict")
        .op(b'q')
        .op(2)
        .op(b'0');
    for _ in 0..20_000 {
        p.op(b'h').op(2).op(b'h').op(3).op(b'R').op(b'0');
    }
    p.op(b'}');
    let bytes = archive(&[("data.pkl", &p.done())], false);
    let dir = Scratch::new("ordered-copies");
    let path = dir.file("crafted.pt");
    std::fs::write(&path, bytes).unwrap();
    let (r, total) = total_allocation(|| ember::io::load_pt(&path, &Device::Cpu));
    let e = r.map(drop).unwrap_err().to_string();
    assert!(
        e.contains("calls copy more items than the pickle holds"),
        "{e}"
    );
    assert!(total < 128 << 20, "allocated {total} bytes in all");
    // keys 1 and "1" would name two values alike
    let mut p = Pickler::new();
    p.op(b'}')
        .op(b'(')
        .op(b'K')
        .op(1)
        .op(b'N')
        .str("1")
        .op(b'N')
        .op(b'u');
    let (e, _) = refused("keys", &archive(&[("data.pkl", &p.done())], false));
    assert!(e.contains("would both be named \"1\""), "{e}");
}

#[test]
fn storages_are_read_one_at_a_time() {
    // four storages of 1 MiB: the largest allocation is about one of them, not
    // the file (each storage's buffer becomes its tensor's)
    let mb = 1 << 20;
    let data = vec![0u8; mb];
    let names = ["a", "b", "c", "d"];
    let keys = ["0", "1", "2", "3"];
    let ts: Vec<Crafted> = names
        .iter()
        .zip(keys)
        .map(|(n, k)| f32s(n, k, (mb / 4) as i64, 0, &[(mb / 4) as i64], &[1]))
        .collect();
    let pickle = state_pickle(&ts);
    let mut records: Vec<(String, &[u8])> = vec![("data.pkl".into(), &pickle)];
    records.extend(keys.iter().map(|k| (format!("data/{k}"), &data[..])));
    let refs: Vec<(&str, &[u8])> = records.iter().map(|(n, b)| (n.as_str(), *b)).collect();
    let dir = Scratch::new("one-at-a-time");
    let path = dir.file("four.pt");
    std::fs::write(&path, archive(&refs, false)).unwrap();
    let (r, largest) = largest_allocation(|| ember::io::load_pt(&path, &Device::Cpu));
    assert_eq!(r.unwrap().len(), 4);
    assert!(
        largest <= mb + (64 << 10),
        "largest allocation {largest} for 1 MiB storages"
    );
}

#[test]
fn truncated_files_are_errors() {
    for (name, base) in BASES.iter().zip(bases()) {
        for cut in (0..base.len()).step_by(37) {
            let dir = Scratch::new("cut");
            let path = dir.file("cut.pt");
            std::fs::write(&path, &base[..cut]).unwrap();
            let r = ember::io::load_pt(&path, &Device::Cpu);
            assert!(r.is_err(), "{name} cut at {cut} of {} loaded", base.len());
        }
    }
}

// ---------------------------------------------------------------------------
// Properties

/// A file given to the readers: what it loads must agree with what it lists.
fn pt_case(path: &Path, bytes: &[u8], model: &nn::Sequential) -> Check {
    std::fs::write(path, bytes).unwrap();
    let limit = 16 * bytes.len() + (1 << 24) * 8 + SMALL;
    let (r, largest) = largest_allocation(|| {
        PtFile::open(path).and_then(|f| Ok((f.entries()?, f.values()?, f.load(&Device::Cpu)?)))
    });
    tally(&r);
    prop_assert!(
        largest <= limit,
        "allocated {} bytes for a file of {}",
        largest,
        bytes.len()
    );
    if let Ok((entries, _, tensors)) = r {
        prop_assert_eq!(entries.len(), tensors.len());
        for (e, (name, t)) in entries.iter().zip(&tensors) {
            prop_assert_eq!(&e.name, name);
            prop_assert_eq!(e.shape.as_slice(), t.shape());
            prop_assert_eq!(Some(t.dtype()), e.dtype.dtype);
        }
    }
    // into a model: all or nothing
    let before = super::safetensors::snapshot(model, None);
    let r = ember::io::load_state_dict(model, path);
    tally(&r);
    match r {
        Ok(()) => super::safetensors::check_model(model, &before)?,
        Err(_) => prop_assert_eq!(
            super::safetensors::snapshot(model, None),
            before,
            "a failed load_state_dict changed the model"
        ),
    }
    Ok(())
}

/// small_net.pth's layout.
fn small_net() -> nn::Sequential {
    let dev = Device::Cpu;
    nn::Sequential::new()
        .add(nn::Conv2d::new(3, 4, 3, ember::Conv2dOptions::default().padding(1), &dev).unwrap())
        .add(nn::BatchNorm2d::new(4, &dev).unwrap())
        .add(nn::ReLU)
        .add(nn::Flatten::default())
        .add(nn::Linear::new(100, 3, &dev).unwrap())
}

fn pt_prop(tag: &'static str, input: impl Strategy<Value = Vec<u8>> + 'static) -> Prop {
    let dir = Scratch::new(tag);
    let model = small_net();
    prop(input, move |bytes| {
        pt_case(&dir.file("case.pt"), &bytes, &model)
    })
}

/// A file PyTorch wrote, damaged as bytes (the zip's checksums catch most of it).
fn damaged_file() -> impl Strategy<Value = Vec<u8>> {
    (0..BASES.len(), damages(6)).prop_map(|(i, ds)| damaged(bases()[i].clone(), &ds))
}

/// The pickle and records of a zip file PyTorch wrote, the pickle damaged and the
/// archive written again with sound checksums, so the damage reaches the reader.
fn damaged_pickle() -> impl Strategy<Value = Vec<u8>> {
    let zips: Vec<usize> = (0..BASES.len())
        .filter(|&i| !BASES[i].contains("legacy"))
        .collect();
    (prop::sample::select(zips), damages(4), any::<bool>()).prop_map(|(i, ds, deflate)| {
        let mut zip = zip::ZipArchive::new(Cursor::new(bases()[i].clone())).unwrap();
        let mut records = Vec::new();
        for k in 0..zip.len() {
            let mut f = zip.by_index(k).unwrap();
            let name = f.name().split_once('/').unwrap().1.to_string();
            let mut bytes = Vec::new();
            f.read_to_end(&mut bytes).unwrap();
            if name == "data.pkl" {
                bytes = damaged(bytes, &ds);
            }
            records.push((name, bytes));
        }
        let refs: Vec<(&str, &[u8])> = records
            .iter()
            .map(|(n, b)| (n.as_str(), b.as_slice()))
            .collect();
        archive(&refs, deflate)
    })
}

/// Arbitrary bytes behind the first bytes of each layout.
fn arbitrary_pt() -> impl Strategy<Value = Vec<u8>> {
    (any::<bool>(), prop::collection::vec(any::<u8>(), 0..512)).prop_map(|(zip, rest)| {
        let mut b = if zip {
            b"PK\x03\x04".to_vec()
        } else {
            vec![0x80, 2, 0x8a, 10]
        };
        b.extend(rest);
        b
    })
}

#[test]
fn pt_damaged_files_never_panic() {
    check(300, pt_prop("pt-damaged", damaged_file()));
}

#[test]
fn pt_damaged_pickles_never_panic() {
    check(300, pt_prop("pt-pickle", damaged_pickle()));
}

#[test]
fn pt_arbitrary_bytes_never_panic() {
    check(200, pt_prop("pt-arbitrary", arbitrary_pt()));
}

#[test]
fn pt_undamaged_files_read() {
    // the bases themselves: each either loads or is refused for what it is
    let dir = Scratch::new("pt-bases");
    let model = small_net();
    for (name, bytes) in BASES.iter().zip(bases()) {
        let path = dir.file(name);
        pt_case(&path, bytes, &model).unwrap_or_else(|e| panic!("{name}: {e}"));
        let r = ember::io::load_pt(&path, &Device::Cpu);
        assert_eq!(
            r.is_ok(),
            !matches!(*name, "int32.pt" | "os_system.pt" | "checkpoint.pt"),
            "{name}"
        );
    }
}

#[test]
#[ignore = "long fuzz run: EMBER_FUZZ_SECS (600) seconds"]
fn fuzz_pt_long() {
    fuzz_long(
        "pt",
        vec![
            ("damaged", pt_prop("pt-long-damaged", damaged_file())),
            ("pickle", pt_prop("pt-long-pickle", damaged_pickle())),
            ("arbitrary", pt_prop("pt-long-arbitrary", arbitrary_pt())),
        ],
    );
}
