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
    /// `Some(bytes allocated so far)` while this thread is being watched.
    static TOTAL: Cell<Option<usize>> = const { Cell::new(None) };
}

fn note(size: usize) {
    // `try_with`: the allocator can run while thread locals are torn down
    let _ = LARGEST.try_with(|l| {
        if let Some(m) = l.get() {
            l.set(Some(m.max(size)));
        }
    });
    let _ = TOTAL.try_with(|t| {
        if let Some(n) = t.get() {
            t.set(Some(n.saturating_add(size)));
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

/// Runs `f` and returns its result with the bytes this thread allocated
/// meanwhile, all allocations together (freed or not).
fn total_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
    TOTAL.with(|t| t.set(Some(0)));
    let out = f();
    let total = TOTAL.with(|t| t.replace(None)).unwrap_or(0);
    (out, total)
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
/// when dropped. Each is unique (a counter after the tag): tests run in parallel
/// threads of one process, and two with the same tag would remove each other's
/// files.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ember-fuzz-{}-{tag}-{n}", std::process::id()));
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

mod csv;
mod idx;
mod pt;
mod safetensors;
