//! Property-based fuzzing of the file readers: CSV ([`parse_csv`], [`read_csv`]),
//! IDX, raw and gzipped ([`parse_idx`], [`read_idx`]), and safetensors
//! ([`ember::io::load`], [`ember::io::load_state_dict`],
//! [`ember::io::load_checkpoint`]).
//!
//! Every reader gets arbitrary bytes and valid files damaged on purpose (bits
//! flipped, bytes cut, spliced or repeated, header numbers, lengths, dims, dtypes
//! and JSON fields changed). The property is always the same: the reader returns
//! `Ok` or an `ember::Error`, never panics, and what it returns is consistent with
//! the bytes it was given.
//!
//! The `#[test]`s run a few thousand cases in all. The `#[ignore]`d `fuzz_*_long`
//! tests keep generating cases for `EMBER_FUZZ_SECS` seconds each (600 by
//! default):
//!
//! ```text
//! nice -n 19 cargo test --release -p ember --test fuzz -- --ignored fuzz --test-threads=1
//! ```
//!
//! Failures are saved to `tests/proptest-regressions/fuzz.txt` and replayed first
//! by every later run.
//!
//! This binary has its own global allocator, which records the largest single
//! allocation a thread makes while it asks for that: the gzip bomb tests check
//! with it that a huge decompressed stream is never held in memory.

use ember::data::{encode_idx, parse_csv, parse_idx, read_csv, read_idx, Column, CsvTable};
use ember::nn::{self, Module};
use ember::optim::{Adam, Optimizer};
use ember::prelude::*;
use ember::Error;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{
    Config, FileFailurePersistence, RngAlgorithm, TestCaseError, TestRng, TestRunner,
};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::{Cell, RefCell};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// The largest allocation of a thread

/// The system allocator, noting the size of each allocation for the threads that
/// asked for it (see [`largest_allocation`]).
struct Watching;

thread_local! {
    /// `Some(largest size so far)` while this thread is being watched.
    static LARGEST: Cell<Option<usize>> = const { Cell::new(None) };
}

fn note(size: usize) {
    // `try_with`: the allocator can run while thread locals are torn down
    let _ = LARGEST.try_with(|l| {
        if let Some(m) = l.get() {
            l.set(Some(m.max(size)));
        }
    });
}

// SAFETY: every call is forwarded unchanged to the system allocator; the only
// extra work is a thread-local `Cell` update, which does not allocate.
unsafe impl GlobalAlloc for Watching {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        System.realloc(ptr, layout, new_size)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static GLOBAL: Watching = Watching;

/// Runs `f` and returns its result with the size of the largest single
/// allocation (or reallocation) this thread made meanwhile.
fn largest_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|l| l.set(Some(0)));
    let out = f();
    let largest = LARGEST.with(|l| l.replace(None)).unwrap_or(0);
    (out, largest)
}

// ---------------------------------------------------------------------------
// Running properties

/// Where failing cases are saved, relative to the crate (the directory `cargo
/// test` runs in), beside the other binaries' regressions.
const REGRESSIONS: &str = "tests/proptest-regressions/fuzz.txt";

fn config(cases: u32) -> Config {
    Config {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(REGRESSIONS))),
        ..Config::default()
    }
}

/// A property: runs its cases with the given runner, `Err` describing the
/// (shrunk) failing case.
type Prop = Box<dyn Fn(&mut TestRunner) -> std::result::Result<(), String>>;

fn prop<S>(strategy: S, test: impl Fn(S::Value) -> Check + 'static) -> Prop
where
    S: Strategy + 'static,
    S::Value: std::fmt::Debug,
{
    Box::new(move |runner: &mut TestRunner| runner.run(&strategy, &test).map_err(|e| e.to_string()))
}

/// Runs `cases` cases of `p` with a randomly seeded runner; panics on a failure.
fn check(cases: u32, p: Prop) {
    let mut runner = TestRunner::new(config(cases));
    if let Err(e) = p(&mut runner) {
        panic!("{e}");
    }
}

/// The seconds each long fuzz test runs: `EMBER_FUZZ_SECS`, 600 by default.
fn fuzz_secs() -> u64 {
    match std::env::var("EMBER_FUZZ_SECS") {
        Ok(s) => s
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("EMBER_FUZZ_SECS={s:?} is not a number of seconds")),
        Err(_) => 600,
    }
}

/// Runs batches of cases of every property in turn, each batch from its own
/// seed, until `EMBER_FUZZ_SECS` have passed; prints the count and panics on
/// the first failure (which is also saved to the regressions file).
fn fuzz_long(reader: &str, props: Vec<(&str, Prop)>) {
    const BATCH: u32 = 256;
    let secs = fuzz_secs();
    let base: u64 = match std::env::var("EMBER_FUZZ_SEED") {
        Ok(s) => s.trim().parse().expect("EMBER_FUZZ_SEED must be a u64"),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    };
    ACCEPTED.store(0, Ordering::Relaxed);
    REFUSED.store(0, Ordering::Relaxed);
    let start = Instant::now();
    let deadline = start + Duration::from_secs(secs);
    let mut counts = vec![0u64; props.len()];
    let mut batch = 0u64;
    while Instant::now() < deadline {
        for (i, (name, p)) in props.iter().enumerate() {
            let mut seed = [0u8; 32];
            seed[..8].copy_from_slice(&base.to_le_bytes());
            seed[8..16].copy_from_slice(&batch.to_le_bytes());
            seed[16..24].copy_from_slice(&(i as u64).to_le_bytes());
            let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed);
            let mut runner = TestRunner::new_with_rng(config(BATCH), rng);
            if let Err(e) = p(&mut runner) {
                panic!(
                    "{reader}: property {name} failed (EMBER_FUZZ_SEED={base}, batch {batch}) \
                     after {} cases: {e}",
                    counts.iter().sum::<u64>()
                );
            }
            counts[i] += u64::from(BATCH);
        }
        batch += 1;
    }
    let total: u64 = counts.iter().sum();
    let per: Vec<String> = props
        .iter()
        .zip(&counts)
        .map(|((name, _), n)| format!("{name} {n}"))
        .collect();
    println!(
        "{reader}: {total} cases in {:.0} s, 0 failures (EMBER_FUZZ_SEED={base}; {}); \
         reader calls: {} Ok, {} Err",
        start.elapsed().as_secs_f64(),
        per.join(", "),
        ACCEPTED.load(Ordering::Relaxed),
        REFUSED.load(Ordering::Relaxed),
    );
}

/// How many cases a reader accepted and refused, for the long runs' report.
static ACCEPTED: AtomicU64 = AtomicU64::new(0);
static REFUSED: AtomicU64 = AtomicU64::new(0);

/// Counts an outcome of a reader.
fn tally<T>(r: &ember::Result<T>) {
    let n = if r.is_ok() { &ACCEPTED } else { &REFUSED };
    n.fetch_add(1, Ordering::Relaxed);
}

/// The result of checking a case.
type Check<T = ()> = std::result::Result<T, TestCaseError>;

/// An `ember::Result` as a test result, the error failing the case.
fn ok<T>(r: ember::Result<T>) -> Check<T> {
    r.map_err(|e| TestCaseError::fail(format!("unexpected error: {e}")))
}

/// A directory of this process's own under the system's temporary one, removed
/// when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("ember-fuzz-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create a scratch directory");
        Scratch(dir)
    }

    fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

// ---------------------------------------------------------------------------
// Byte-level damage

/// One change to a file's bytes.
#[derive(Clone, Debug)]
enum Damage {
    FlipBit(Index, u8),
    SetByte(Index, u8),
    Truncate(Index),
    Remove(Index, u8),
    Insert(Index, Vec<u8>),
    /// Copies up to `n` bytes from a position and inserts them `k` more times.
    Repeat(Index, u8, u8),
    /// Writes a number, `width` bytes wide, big- or little-endian.
    Number(Index, u8, bool, u64),
}

/// Numbers that tend to matter in headers: zero, one, small counts, the limits
/// of the integer types.
fn edgy_number() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        0u64..300,
        Just(u64::from(u8::MAX)),
        Just(u64::from(u16::MAX)),
        Just(0x7fff_ffff),
        Just(u64::from(u32::MAX)),
        Just(i64::MAX as u64),
        Just(u64::MAX),
        any::<u64>(),
    ]
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        3 => (any::<Index>(), 0u8..8).prop_map(|(i, b)| Damage::FlipBit(i, b)),
        2 => (any::<Index>(), any::<u8>()).prop_map(|(i, v)| Damage::SetByte(i, v)),
        1 => any::<Index>().prop_map(Damage::Truncate),
        1 => (any::<Index>(), 1u8..16).prop_map(|(i, n)| Damage::Remove(i, n)),
        1 => (any::<Index>(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(i, v)| Damage::Insert(i, v)),
        1 => (any::<Index>(), 1u8..32, 1u8..8).prop_map(|(i, n, k)| Damage::Repeat(i, n, k)),
        2 => (any::<Index>(), prop::sample::select(vec![1u8, 2, 4, 8]), any::<bool>(), edgy_number())
            .prop_map(|(i, w, be, v)| Damage::Number(i, w, be, v)),
    ]
}

fn damages(max: usize) -> impl Strategy<Value = Vec<Damage>> {
    prop::collection::vec(damage(), 1..=max)
}

fn apply(bytes: &mut Vec<u8>, d: &Damage) {
    let len = bytes.len();
    match d {
        Damage::FlipBit(i, b) if len > 0 => bytes[i.index(len)] ^= 1 << b,
        Damage::SetByte(i, v) if len > 0 => bytes[i.index(len)] = *v,
        Damage::Truncate(i) => bytes.truncate(i.index(len + 1)),
        Damage::Remove(i, n) => {
            let at = i.index(len + 1);
            bytes.drain(at..(at + *n as usize).min(len));
        }
        Damage::Insert(i, v) => {
            let at = i.index(len + 1);
            bytes.splice(at..at, v.iter().copied());
        }
        Damage::Repeat(i, n, k) if len > 0 => {
            let at = i.index(len);
            let end = (at + *n as usize).min(len);
            let chunk = bytes[at..end].to_vec();
            for _ in 0..*k {
                bytes.splice(end..end, chunk.iter().copied());
            }
        }
        Damage::Number(i, w, be, v) if len >= *w as usize => {
            let w = *w as usize;
            let at = i.index(len - w + 1);
            let src = if *be {
                v.to_be_bytes()[8 - w..].to_vec()
            } else {
                v.to_le_bytes()[..w].to_vec()
            };
            bytes[at..at + w].copy_from_slice(&src);
        }
        _ => {}
    }
}

fn damaged(mut bytes: Vec<u8>, ds: &[Damage]) -> Vec<u8> {
    for d in ds {
        apply(&mut bytes, d);
    }
    bytes
}

fn gzip(bytes: &[u8], level: u32) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(level));
    gz.write_all(bytes).expect("gzip into memory");
    gz.finish().expect("gzip into memory")
}

// ---------------------------------------------------------------------------
// CSV

const CSV_NAME: &str = "fuzz.csv";

/// What a CSV cell can look like, well- or ill-formed.
fn csv_cell() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => any::<i32>().prop_map(|v| v.to_string()),
        3 => any::<f64>().prop_map(|v| v.to_string()),
        3 => "[a-z]{1,6}",
        1 => prop::sample::select(vec!["nan", "-inf", "1e999", "-0", "0x10", "1_000", "", " ", "\u{feff}"])
            .prop_map(str::to_string),
        1 => "[a-z, \n\r\"]{0,6}".prop_map(|s| format!("\"{}\"", s.replace('"', "\"\""))),
        1 => "[a-z\"]{0,4}",
        1 => " {0,2}[0-9]{1,3}(\\.[0-9]{0,2})? {0,2}",
        1 => "\\PC{0,4}",
    ]
}

/// A CSV text: a header and rows of cells, mostly as many as header names,
/// with either line ending, blank lines, a byte order mark.
fn csv_text() -> impl Strategy<Value = String> {
    let header = prop::collection::vec(
        prop_oneof![3 => "[a-z_][a-z0-9_]{0,5}", 1 => csv_cell()],
        1..5,
    );
    let row = (
        prop::collection::vec(csv_cell(), 6),
        prop::bool::weighted(0.1),
        0usize..8,
        prop::bool::weighted(0.1),
    );
    (
        header,
        prop::collection::vec(row, 0..7),
        any::<bool>(),
        any::<bool>(),
        prop::bool::weighted(0.2),
    )
        .prop_map(|(header, rows, crlf, final_eol, bom)| {
            let eol = if crlf { "\r\n" } else { "\n" };
            let mut s = String::new();
            if bom {
                s.push('\u{feff}');
            }
            s.push_str(&header.join(","));
            for (cells, ragged, n, blank) in rows {
                s.push_str(eol);
                if blank {
                    s.push_str(eol);
                }
                let n = if ragged { n.min(6) } else { header.len() };
                s.push_str(&cells[..n].join(","));
            }
            if final_eol {
                s.push_str(eol);
            }
            s
        })
}

/// Checks a table that parsed: the columns have the header's names (unique, not
/// empty, not all numbers), one cell per row each, numeric exactly when every cell
/// is a number; the tensors built from it have the table's values and shapes.
fn check_csv_table(t: &CsvTable) -> Check {
    let headers = t.headers();
    prop_assert_eq!(headers.len(), t.num_columns());
    prop_assert!(!headers.is_empty());
    prop_assert!(
        !headers.iter().all(|h| h.parse::<f64>().is_ok()),
        "a header of numbers was accepted: {:?}",
        headers
    );
    let rows = t.num_rows();
    let mut numeric = Vec::new();
    for (i, h) in headers.iter().enumerate() {
        prop_assert!(!h.is_empty());
        prop_assert!(!headers[..i].contains(h), "column {:?} twice", h);
        let col = ok(t.column(h))?;
        prop_assert_eq!(col.len(), rows, "column {:?}", h);
        match col {
            Column::Numeric(_) => numeric.push(h.as_str()),
            Column::Text(cells) => {
                prop_assert!(cells.iter().all(|c| !c.is_empty()));
                prop_assert!(cells.iter().any(|c| c.parse::<f64>().is_err()));
            }
        }
        let labels = t.labels(h);
        match col {
            Column::Text(_) => prop_assert!(labels.is_err(), "labels of a text column"),
            Column::Numeric(v) => {
                let whole = v
                    .iter()
                    .all(|x| x.is_finite() && x.fract() == 0.0 && x.abs() < 9.0e15);
                prop_assert_eq!(labels.is_ok(), whole, "labels of {:?}", v);
                if let Ok(l) = labels {
                    prop_assert_eq!(l.shape(), &[rows][..]);
                    let got = ok(l.to_vec::<i64>())?;
                    let want: Vec<i64> = v.iter().map(|&x| x as i64).collect();
                    prop_assert_eq!(got, want);
                }
            }
        }
        let (idx, classes) = ok(t.encode_labels(h))?;
        prop_assert_eq!(idx.shape(), &[rows][..]);
        let idx = ok(idx.to_vec::<i64>())?;
        prop_assert!(idx.iter().all(|&i| i >= 0 && (i as usize) < classes.len()));
        let mut used = vec![false; classes.len()];
        idx.iter().for_each(|&i| used[i as usize] = true);
        prop_assert!(used.iter().all(|&u| u), "a class no row has");
    }
    let x = t.to_tensor(&numeric, DType::F64);
    if numeric.is_empty() {
        prop_assert!(x.is_err());
    } else {
        let x = ok(x)?;
        prop_assert_eq!(x.shape(), &[rows, numeric.len()][..]);
        let got = ok(x.to_vec::<f64>())?;
        for (c, h) in numeric.iter().enumerate() {
            let col = ok(t.column(h))?.as_numeric().expect("numeric").to_vec();
            for (r, want) in col.iter().enumerate() {
                let g = got[r * numeric.len() + c];
                prop_assert!(g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()));
            }
        }
    }
    Ok(())
}

/// Runs the CSV reader on `bytes`: an `Ok` table must be consistent, an error
/// must be a parse error naming the source.
fn csv_case(bytes: &[u8]) -> Check {
    let r = parse_csv(bytes, CSV_NAME);
    tally(&r);
    match r {
        Ok(t) => {
            prop_assert_eq!(t.name(), CSV_NAME);
            check_csv_table(&t)
        }
        Err(Error::Parse { file, .. }) if file == CSV_NAME => Ok(()),
        Err(e) => Err(TestCaseError::fail(format!(
            "not a parse error of {CSV_NAME}: {e:?}"
        ))),
    }
}

fn csv_arbitrary() -> Prop {
    prop(prop::collection::vec(any::<u8>(), 0..256), |b| csv_case(&b))
}

fn csv_structured() -> Prop {
    prop(
        (csv_text(), prop::collection::vec(damage(), 0..3)),
        |(text, ds)| csv_case(&damaged(text.into_bytes(), &ds)),
    )
}

/// A well-formed table (distinct names, as many non-empty cells as names on
/// every row) reads back as written.
fn csv_valid() -> Prop {
    let cell = prop_oneof![
        any::<i32>().prop_map(|v| v.to_string()),
        (-1e6f64..1e6).prop_map(|v| v.to_string()),
        "[a-z]{1,5}",
        "[a-z ,]{0,4}[a-z][a-z ,\n]{0,4}".prop_map(|s| format!("\"{s}\"")),
    ];
    let table = (1usize..5).prop_flat_map(move |ncols| {
        (
            prop::collection::vec("[a-z]{0,3}", ncols),
            prop::collection::vec(prop::collection::vec(cell.clone(), ncols), 0..6),
            any::<bool>(),
        )
    });
    prop(table, |(names, rows, crlf)| {
        let names: Vec<String> = names
            .iter()
            .enumerate()
            .map(|(i, n)| format!("c{i}{n}"))
            .collect();
        let eol = if crlf { "\r\n" } else { "\n" };
        let mut text = names.join(",");
        for r in &rows {
            text.push_str(eol);
            text.push_str(&r.join(","));
        }
        let t = ok(parse_csv(text.as_bytes(), CSV_NAME))?;
        prop_assert_eq!(t.headers(), &names[..]);
        prop_assert_eq!(t.num_rows(), rows.len());
        for (c, name) in names.iter().enumerate() {
            let cells: Vec<String> = rows
                .iter()
                .map(|r| r[c].trim_matches('"').trim().to_string())
                .collect();
            let col = ok(t.column(name))?;
            let all_numbers = cells.iter().all(|c| c.parse::<f64>().is_ok());
            prop_assert_eq!(
                col.is_numeric(),
                all_numbers,
                "column {:?}: {:?}",
                name,
                cells
            );
            match col {
                Column::Numeric(v) => {
                    // compared as bits: `nan` cells read as NaN
                    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    let want: Vec<f64> = cells.iter().map(|s| s.parse().unwrap()).collect();
                    prop_assert_eq!(bits(v), bits(&want), "column {:?}", name);
                }
                Column::Text(v) => prop_assert_eq!(v, &cells),
            }
        }
        check_csv_table(&t)
    })
}

#[test]
fn csv_arbitrary_bytes_never_panic() {
    check(500, csv_arbitrary());
}

#[test]
fn csv_damaged_tables_never_panic() {
    check(800, csv_structured());
}

#[test]
fn csv_valid_tables_read_back() {
    check(300, csv_valid());
}

#[test]
fn csv_through_a_file_names_it() {
    let dir = Scratch::new("csv-file");
    let p = dir.file("table.csv");
    std::fs::write(&p, "a,b\n1,2\n3\n").unwrap();
    let e = read_csv(&p).unwrap_err().to_string();
    assert!(
        e.starts_with(&p.display().to_string()) && e.contains(":3:"),
        "{e}"
    );
    std::fs::write(&p, "a,b\n1,2\n3,x\n").unwrap();
    let t = read_csv(&p).unwrap();
    assert_eq!(t.num_rows(), 2);
    assert!(t.column("a").unwrap().is_numeric() && !t.column("b").unwrap().is_numeric());
}

#[test]
#[ignore = "long fuzz run: EMBER_FUZZ_SECS (600) seconds"]
fn fuzz_csv_long() {
    fuzz_long(
        "csv",
        vec![
            ("arbitrary", csv_arbitrary()),
            ("damaged", csv_structured()),
            ("valid", csv_valid()),
        ],
    );
}

// ---------------------------------------------------------------------------
// IDX

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

// ---------------------------------------------------------------------------
// safetensors: load, load_state_dict, load_checkpoint

/// Valid files to damage: several dtypes and shapes (empty and scalar
/// included), a state dict of a `Linear(3, 2)`, and a checkpoint of one with
/// Adam after a step.
fn safetensors_bases() -> &'static [Vec<u8>] {
    static BASES: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    BASES.get_or_init(|| {
        let dir = Scratch::new("bases");
        let dev = Device::Cpu;
        let p = dir.file("base.safetensors");
        let mut out = Vec::new();
        let f = Tensor::from_vec(
            (0..6).map(|i| i as f32 * 0.5 - 1.0).collect::<Vec<_>>(),
            [2, 3],
            &dev,
        )
        .unwrap();
        let tensors = vec![
            ("f32".to_string(), f.clone()),
            ("f64".to_string(), f.to_dtype(DType::F64).unwrap()),
            ("f16".to_string(), f.to_dtype(DType::F16).unwrap()),
            ("bf16".to_string(), f.to_dtype(DType::BF16).unwrap()),
            (
                "i64".to_string(),
                Tensor::from_vec(vec![-1i64, 0, 7], [3], &dev).unwrap(),
            ),
            (
                "u8".to_string(),
                Tensor::from_vec(vec![1u8, 2, 3, 4], [2, 1, 2], &dev).unwrap(),
            ),
            (
                "bool".to_string(),
                Tensor::from_vec(vec![true, false], [2], &dev).unwrap(),
            ),
            ("scalar".to_string(), Tensor::scalar(2.5f32, &dev).unwrap()),
            (
                "empty".to_string(),
                Tensor::from_vec(Vec::<f32>::new(), [0, 3], &dev).unwrap(),
            ),
        ];
        ember::io::save(&tensors, &p).unwrap();
        out.push(std::fs::read(&p).unwrap());
        let (model, opt) = checkpoint_model();
        ember::io::save_state_dict(&model, &p).unwrap();
        out.push(std::fs::read(&p).unwrap());
        ember::io::save_checkpoint(&model, &opt, &p).unwrap();
        out.push(std::fs::read(&p).unwrap());
        let extra = vec![("epoch".to_string(), Tensor::scalar(3i64, &dev).unwrap())];
        ember::io::save_checkpoint_with(&model, &opt, &extra, &p).unwrap();
        out.push(std::fs::read(&p).unwrap());
        out
    })
}

/// A `Linear(3, 2)` and its Adam optimizer after one step (so that the moment
/// buffers exist).
fn checkpoint_model() -> (nn::Linear, Adam) {
    let dev = Device::Cpu;
    let model = nn::Linear::new(3, 2, &dev).unwrap();
    let mut opt = Adam::new(model.parameters(), 0.01).unwrap();
    let x = Tensor::from_vec(vec![0.5f32, -1.0, 2.0, 1.0, 0.0, -0.5], [2, 3], &dev).unwrap();
    model
        .forward(&x)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    opt.step().unwrap();
    (model, opt)
}

/// A change to the JSON header of a safetensors file.
#[derive(Clone, Debug)]
enum Edit {
    Dtype(Index, String),
    Shape(Index, Vec<serde_json::Value>),
    Offsets(Index, Vec<serde_json::Value>),
    DropField(Index, Index),
    AddField(Index, String, serde_json::Value),
    Rename(Index, String),
    Duplicate(Index, String),
    Remove(Index),
    /// Sets (or with `None` removes) a metadata entry: a key of the file's or one
    /// made up.
    Meta(Option<Index>, String, Option<serde_json::Value>),
    DropMetadata,
    MetadataNotAMap(serde_json::Value),
}

/// How the header is framed: its length prefix and padding.
#[derive(Clone, Debug)]
enum Frame {
    Exact,
    LengthOff(i64),
    Length(u64),
    Spaces(u8),
    /// Data bytes added (positive) or cut (negative) at the end.
    DataOff(i16),
}

fn json_number() -> impl Strategy<Value = serde_json::Value> {
    prop_oneof![
        4 => (0u64..8).prop_map(serde_json::Value::from),
        1 => edgy_number().prop_map(serde_json::Value::from),
        1 => (-5i64..0).prop_map(serde_json::Value::from),
        1 => Just(serde_json::json!(1.5)),
        1 => Just(serde_json::json!("2")),
        1 => Just(serde_json::Value::Null),
    ]
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    prop_oneof![
        json_number(),
        "[a-zA-Z0-9_.]{0,8}".prop_map(serde_json::Value::from),
        prop::collection::vec(json_number(), 0..3).prop_map(serde_json::Value::from),
        Just(serde_json::json!({"a": 1})),
        any::<bool>().prop_map(serde_json::Value::from),
    ]
}

fn tensor_name() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9_.]{0,10}",
        prop::sample::select(vec![
            "",
            "__metadata__",
            "weight",
            "bias",
            "model.weight",
            "model.bias",
            "optim.lr",
            "optim.step",
            "optim.exp_avg.0",
            "optim.has_state",
            "trial.epoch",
            "crc32.weight",
        ])
        .prop_map(str::to_string),
    ]
}

fn edit() -> impl Strategy<Value = Edit> {
    let dtypes = vec![
        "F32", "F64", "F16", "BF16", "I64", "U8", "BOOL", "I8", "I16", "I32", "U16", "U32", "U64",
        "F8_E4M3", "F8_E5M2", "F4", "C64", "f32", "",
    ];
    let meta_value = prop_oneof![
        3 => "[0-9a-f]{8}".prop_map(serde_json::Value::from),
        1 => "[0-9a-zA-Z ]{0,10}".prop_map(serde_json::Value::from),
        1 => json_value(),
    ];
    prop_oneof![
        2 => (any::<Index>(), prop::sample::select(dtypes).prop_map(str::to_string))
            .prop_map(|(i, d)| Edit::Dtype(i, d)),
        2 => (any::<Index>(), prop::collection::vec(json_number(), 0..5))
            .prop_map(|(i, s)| Edit::Shape(i, s)),
        2 => (any::<Index>(), prop::collection::vec(json_number(), 0..4))
            .prop_map(|(i, o)| Edit::Offsets(i, o)),
        1 => (any::<Index>(), any::<Index>()).prop_map(|(i, f)| Edit::DropField(i, f)),
        1 => (any::<Index>(), "[a-z_]{1,12}", json_value())
            .prop_map(|(i, k, v)| Edit::AddField(i, k, v)),
        1 => (any::<Index>(), tensor_name()).prop_map(|(i, n)| Edit::Rename(i, n)),
        1 => (any::<Index>(), tensor_name()).prop_map(|(i, n)| Edit::Duplicate(i, n)),
        1 => any::<Index>().prop_map(Edit::Remove),
        3 => (
            prop::option::of(any::<Index>()),
            prop_oneof!["crc32\\.[a-z_.0-9]{0,12}", "[a-z]{1,6}"],
            prop::option::weighted(0.8, meta_value),
        )
            .prop_map(|(i, k, v)| Edit::Meta(i, k, v)),
        1 => Just(Edit::DropMetadata),
        1 => json_value().prop_map(Edit::MetadataNotAMap),
    ]
}

fn frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        6 => Just(Frame::Exact),
        1 => (-9i64..10).prop_map(Frame::LengthOff),
        1 => edgy_number().prop_map(Frame::Length),
        1 => (1u8..16).prop_map(Frame::Spaces),
        1 => (-40i16..40).prop_map(Frame::DataOff),
    ]
}

/// The JSON header and the data of a safetensors file ember wrote.
fn split_safetensors(bytes: &[u8]) -> (serde_json::Map<String, serde_json::Value>, Vec<u8>) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let serde_json::Value::Object(map) = header else {
        panic!("a safetensors header is a JSON object")
    };
    (map, bytes[8 + n..].to_vec())
}

fn pick<'a>(keys: &'a [String], i: &Index) -> Option<&'a String> {
    (!keys.is_empty()).then(|| &keys[i.index(keys.len())])
}

/// The JSON object of the tensor `i` picks among `tensors`, if it is one.
fn entry<'a>(
    map: &'a mut serde_json::Map<String, serde_json::Value>,
    tensors: &[String],
    i: &Index,
) -> Option<&'a mut serde_json::Map<String, serde_json::Value>> {
    pick(tensors, i)
        .and_then(|k| map.get_mut(k))
        .and_then(serde_json::Value::as_object_mut)
}

/// `base` with its header edited and reframed.
fn edited_safetensors(base: &[u8], edits: &[Edit], frame: &Frame) -> Vec<u8> {
    use serde_json::Value;
    let (mut map, mut data) = split_safetensors(base);
    for e in edits {
        let tensors: Vec<String> = map
            .keys()
            .filter(|k| *k != "__metadata__")
            .cloned()
            .collect();
        match e {
            Edit::Dtype(i, d) => {
                if let Some(o) = entry(&mut map, &tensors, i) {
                    o.insert("dtype".into(), Value::from(d.clone()));
                }
            }
            Edit::Shape(i, s) => {
                if let Some(o) = entry(&mut map, &tensors, i) {
                    o.insert("shape".into(), Value::from(s.clone()));
                }
            }
            Edit::Offsets(i, s) => {
                if let Some(o) = entry(&mut map, &tensors, i) {
                    o.insert("data_offsets".into(), Value::from(s.clone()));
                }
            }
            Edit::DropField(i, f) => {
                if let Some(o) = entry(&mut map, &tensors, i) {
                    let fields: Vec<String> = o.keys().cloned().collect();
                    if let Some(k) = pick(&fields, f) {
                        o.remove(k);
                    }
                }
            }
            Edit::AddField(i, k, v) => {
                if let Some(o) = entry(&mut map, &tensors, i) {
                    o.insert(k.clone(), v.clone());
                }
            }
            Edit::Rename(i, n) => {
                if let Some(k) = pick(&tensors, i) {
                    if let Some(v) = map.remove(k) {
                        map.insert(n.clone(), v);
                    }
                }
            }
            Edit::Duplicate(i, n) => {
                if let Some(v) = pick(&tensors, i).and_then(|k| map.get(k)).cloned() {
                    map.insert(n.clone(), v);
                }
            }
            Edit::Remove(i) => {
                if let Some(k) = pick(&tensors, i) {
                    map.remove(k);
                }
            }
            Edit::Meta(i, key, v) => {
                let meta = map
                    .entry("__metadata__")
                    .or_insert_with(|| Value::Object(Default::default()));
                if let Some(m) = meta.as_object_mut() {
                    let keys: Vec<String> = m.keys().cloned().collect();
                    let key = i
                        .as_ref()
                        .and_then(|i| pick(&keys, i))
                        .unwrap_or(key)
                        .clone();
                    match v {
                        Some(v) => m.insert(key, v.clone()),
                        None => m.remove(&key),
                    };
                }
            }
            Edit::DropMetadata => {
                map.remove("__metadata__");
            }
            Edit::MetadataNotAMap(v) => {
                map.insert("__metadata__".into(), v.clone());
            }
        }
    }
    let mut header = serde_json::to_vec(&Value::Object(map)).unwrap();
    let mut len = header.len() as u64;
    match frame {
        Frame::Exact => {}
        Frame::LengthOff(d) => len = len.wrapping_add(*d as u64),
        Frame::Length(n) => len = *n,
        Frame::Spaces(n) => {
            header.extend(std::iter::repeat_n(b' ', *n as usize));
            len = header.len() as u64;
        }
        Frame::DataOff(d) => {
            if *d < 0 {
                data.truncate(data.len().saturating_sub(d.unsigned_abs() as usize));
            } else {
                data.extend(std::iter::repeat_n(0xA5, *d as usize));
            }
        }
    }
    [&len.to_le_bytes()[..], &header, &data].concat()
}

/// What a safetensors case is made of.
fn safetensors_input() -> impl Strategy<Value = Vec<u8>> {
    let n = safetensors_bases().len();
    prop_oneof![
        // arbitrary bytes, and arbitrary text after a plausible length
        1 => prop::collection::vec(any::<u8>(), 0..128),
        1 => "[{}\\[\\]\":,a-zA-Z0-9_ ]{0,64}".prop_map(|s| {
            [&(s.len() as u64).to_le_bytes()[..], s.as_bytes()].concat()
        }),
        // a valid file with its header edited, then maybe bytes damaged
        6 => (0..n, prop::collection::vec(edit(), 0..4), frame(), prop::collection::vec(damage(), 0..2))
            .prop_map(|(b, edits, fr, ds)| {
                damaged(edited_safetensors(&safetensors_bases()[b], &edits, &fr), &ds)
            }),
        // a valid file with bytes damaged
        3 => (0..n, damages(4)).prop_map(|(b, ds)| damaged(safetensors_bases()[b].clone(), &ds)),
    ]
}

/// The header of a file that loaded, as the reference for what was loaded.
fn header_of(bytes: &[u8]) -> Check<serde_json::Map<String, serde_json::Value>> {
    let fail = |m: &str| TestCaseError::fail(format!("loaded, but {m}"));
    let n = bytes
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
        .ok_or_else(|| fail("shorter than 8 bytes"))?;
    let end = usize::try_from(n)
        .ok()
        .and_then(|n| n.checked_add(8))
        .ok_or_else(|| fail("a huge header length"))?;
    let json = bytes.get(8..end).ok_or_else(|| fail("the header is cut"))?;
    match serde_json::from_slice(json) {
        Ok(serde_json::Value::Object(m)) => Ok(m),
        _ => Err(fail("the header is not a JSON object")),
    }
}

fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "F32",
        DType::F64 => "F64",
        DType::F16 => "F16",
        DType::BF16 => "BF16",
        DType::I64 => "I64",
        DType::U8 => "U8",
        DType::Bool => "BOOL",
    }
}

/// `load`: the tensors are those of the header, with its names, shapes and
/// dtypes, and hold as many values as their shapes say.
fn check_load(bytes: &[u8], r: ember::Result<Vec<(String, Tensor)>>) -> Check {
    let Ok(ts) = r else { return Ok(()) };
    let header = header_of(bytes)?;
    let entries = header.keys().filter(|k| *k != "__metadata__").count();
    prop_assert_eq!(ts.len(), entries);
    for (i, (name, t)) in ts.iter().enumerate() {
        prop_assert!(!ts[..i].iter().any(|(n, _)| n == name), "{} twice", name);
        let h = header.get(name).and_then(|v| v.as_object());
        let h = h.ok_or_else(|| TestCaseError::fail(format!("{name:?} is not in the header")))?;
        let shape: Option<Vec<usize>> = h
            .get("shape")
            .and_then(|s| s.as_array())
            .and_then(|s| s.iter().map(|d| d.as_u64().map(|d| d as usize)).collect());
        prop_assert_eq!(Some(t.shape().to_vec()), shape, "{}", name);
        prop_assert_eq!(
            h.get("dtype").and_then(|d| d.as_str()),
            Some(dtype_name(t.dtype()))
        );
        prop_assert_eq!(t.numel(), t.shape().iter().product::<usize>());
        let n = ok(t.to_dtype(DType::F64).and_then(|t| t.to_vec::<f64>()))?.len();
        prop_assert_eq!(n, t.numel());
    }
    Ok(())
}

/// A model's and optimizer's state, to compare before and after a load.
type Snapshot = Vec<(String, Vec<usize>, Vec<u64>)>;

fn snapshot(model: &dyn Module, opt: Option<&dyn Optimizer>) -> Snapshot {
    let mut all = model.state_dict();
    if let Some(opt) = opt {
        all.extend(
            opt.state()
                .unwrap()
                .into_iter()
                .map(|(n, t)| (format!("optim.{n}"), t)),
        );
    }
    all.into_iter()
        .map(|(n, t)| {
            let bits = t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
            (
                n,
                t.shape().to_vec(),
                bits.iter().map(|x| x.to_bits()).collect(),
            )
        })
        .collect()
}

/// After a load that succeeded: the model kept its shapes and holds finite
/// values (the default options refuse others).
fn check_model(model: &dyn Module, before: &Snapshot) -> Check {
    let now = snapshot(model, None);
    prop_assert_eq!(now.len(), before.len());
    for ((n, s, v), (n0, s0, _)) in now.iter().zip(before) {
        prop_assert_eq!((n, s), (n0, s0));
        prop_assert!(
            v.iter().all(|&b| f64::from_bits(b).is_finite()),
            "{} holds non-finite values",
            n
        );
    }
    Ok(())
}

/// Runs `load`, `load_state_dict` and `load_checkpoint` on `bytes` (written to
/// `path`).
fn safetensors_case(path: &Path, bytes: &[u8], model: &nn::Linear, opt: &RefCell<Adam>) -> Check {
    std::fs::write(path, bytes).unwrap();
    let r = ember::io::load(path, &Device::Cpu);
    tally(&r);
    check_load(bytes, r)?;
    checkpoint_case(path, model, opt)
}

fn checkpoint_case(path: &Path, model: &nn::Linear, opt: &RefCell<Adam>) -> Check {
    let before = snapshot(model, None);
    let r = ember::io::load_state_dict(model, path);
    tally(&r);
    match r {
        Ok(()) => {
            check_model(model, &before)?;
            // the model holds the file's values
            let file = ok(ember::io::load(path, &Device::Cpu))?;
            for (name, p) in model.state_dict() {
                let (_, t) = file
                    .iter()
                    .find(|(n, _)| *n == name)
                    .expect("loaded, so present");
                let want = ok(t.to_dtype(p.dtype()).and_then(|t| t.to_vec::<f64>()))?;
                prop_assert_eq!(ok(p.to_vec::<f64>())?, want);
            }
        }
        Err(_) => prop_assert_eq!(
            snapshot(model, None),
            before,
            "a failed load_state_dict changed the model"
        ),
    }
    let mut opt = opt.borrow_mut();
    let before = snapshot(model, Some(&*opt));
    let r = ember::io::load_checkpoint(model, &mut *opt, path);
    tally(&r);
    match r {
        Ok(extra) => {
            check_model(model, &snapshot(model, None))?;
            for (_, t) in extra {
                prop_assert_eq!(t.numel(), t.shape().iter().product::<usize>());
            }
            prop_assert!(opt.lr().is_finite() && opt.lr() >= 0.0);
        }
        Err(_) => prop_assert_eq!(
            snapshot(model, Some(&*opt)),
            before,
            "a failed load_checkpoint changed the model or the optimizer"
        ),
    }
    Ok(())
}

fn safetensors_prop(tag: &'static str, input: impl Strategy<Value = Vec<u8>> + 'static) -> Prop {
    let dir = Scratch::new(tag);
    let (model, opt) = checkpoint_model();
    let opt = RefCell::new(opt);
    prop(input, move |bytes| {
        safetensors_case(&dir.file("case.safetensors"), &bytes, &model, &opt)
    })
}

/// Only the checkpoint readers, on the state dict and checkpoint files.
fn checkpoint_prop(tag: &'static str) -> Prop {
    let input = (
        1usize..4,
        prop::collection::vec(edit(), 0..3),
        frame(),
        prop::collection::vec(damage(), 0..2),
    )
        .prop_map(|(b, edits, fr, ds)| {
            damaged(
                edited_safetensors(&safetensors_bases()[b], &edits, &fr),
                &ds,
            )
        });
    let dir = Scratch::new(tag);
    let (model, opt) = checkpoint_model();
    let opt = RefCell::new(opt);
    prop(input, move |bytes| {
        let path = dir.file("case.safetensors");
        std::fs::write(&path, &bytes).unwrap();
        checkpoint_case(&path, &model, &opt)
    })
}

#[test]
fn safetensors_damaged_files_never_panic() {
    check(600, safetensors_prop("st", safetensors_input()));
}

#[test]
fn checkpoint_damaged_files_never_panic() {
    check(300, checkpoint_prop("checkpoint"));
}

#[test]
fn safetensors_bases_load_back() {
    // the undamaged files load, and a checkpoint restores the model it came from
    let dir = Scratch::new("bases-load");
    let p = dir.file("x.safetensors");
    for b in safetensors_bases() {
        std::fs::write(&p, b).unwrap();
        let ts = ember::io::load(&p, &Device::Cpu).unwrap();
        assert!(!ts.is_empty());
    }
    std::fs::write(&p, &safetensors_bases()[2]).unwrap();
    let model = nn::Linear::new(3, 2, &Device::Cpu).unwrap();
    let mut opt = Adam::new(model.parameters(), 0.5).unwrap();
    ember::io::load_checkpoint(&model, &mut opt, &p).unwrap();
    assert_eq!((opt.lr(), opt.steps()), (0.01, 1));
    let file = ember::io::load(&p, &Device::Cpu).unwrap();
    let (_, w) = file.iter().find(|(n, _)| n == "model.weight").unwrap();
    assert_eq!(
        model.weight.to_vec::<f32>().unwrap(),
        w.to_vec::<f32>().unwrap()
    );
}

#[test]
#[ignore = "long fuzz run: EMBER_FUZZ_SECS (600) seconds"]
fn fuzz_safetensors_long() {
    fuzz_long(
        "safetensors",
        vec![(
            "load+state_dict+checkpoint",
            safetensors_prop("st-long", safetensors_input()),
        )],
    );
}

#[test]
#[ignore = "long fuzz run: EMBER_FUZZ_SECS (600) seconds"]
fn fuzz_checkpoint_long() {
    fuzz_long(
        "checkpoint",
        vec![("state_dict+checkpoint", checkpoint_prop("checkpoint-long"))],
    );
}
