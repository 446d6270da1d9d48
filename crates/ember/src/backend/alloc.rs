// Over 800 lines: the allocator is about 640 lines; its unit tests follow it in the file.
//! The caching allocator: device memory is taken from the driver in segments and
//! handed out as blocks; freed blocks go back to a size-ordered pool and are reused
//! without calling the driver, like PyTorch's CUDA caching allocator.
//!
//! - Sizes are rounded up to 512 bytes.
//! - Requests up to 1 MiB come from the small pool (2 MiB segments); larger ones
//!   from the large pool (20 MiB segments for requests under 10 MiB, otherwise the
//!   request rounded up to 2 MiB).
//! - The best-fitting free block is used; what it has beyond the request is split
//!   off as a free block when it is at least 512 bytes (small pool) or 1 MiB (large).
//! - A freed block merges with free neighbours of the same segment.
//! - When the driver is out of memory, every segment with nothing allocated in it is
//!   released and the request tried once more; then the caller gets
//!   [`Error::OutOfMemory`](crate::Error::OutOfMemory) and the allocator is intact.
//!
//! With `EMBER_CUDA_NO_CACHING=1` (PyTorch's `PYTORCH_NO_CUDA_MEMORY_CACHING`) every
//! block is its own driver allocation of the bytes asked for (in whole 4-byte
//! words), given back when the block is freed: slow, but a memory checker
//! (compute-sanitizer, or the simulator's AddressSanitizer) then sees where each
//! tensor ends.
//!
//! Memory is kept per stream. A segment belongs to the stream of the allocation
//! that made it, and its blocks go only to later allocations on that stream: work
//! queued there runs in order, so a block freed while a kernel still reads it can
//! be handed to the next kernel on that stream safely. A block that work on
//! another stream used is made known with [`Allocator::record_stream`]
//! (`Tensor.record_stream` in PyTorch): when it is freed, an event is recorded
//! on each such stream and the block returns to its pool only once they have all
//! passed. Segments are only returned to the driver after a synchronization.
//!
//! While a CUDA graph is captured, the capturing stream's requests come from a
//! private pool of the graph ([`Allocator::begin_capture`]): the graph's replays
//! use those addresses, so its pool is never handed to other work or released
//! while the graph lives, and blocks from elsewhere freed during the capture
//! (which captured work may read) are held until the graph is dropped
//! ([`Allocator::release_graph`]): PyTorch's graph pools, simplified.

use crate::backend::cuda::runtime::StreamId;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// What the allocator needs from the driver (a fake one in tests).
pub(crate) trait RawMemory {
    /// A new device allocation of `bytes`, or `Err(true)` when the device is out of
    /// memory (`Err(false)`: another driver error, with the message in `last_error`).
    fn malloc(&mut self, bytes: usize) -> std::result::Result<u64, bool>;
    fn free(&mut self, ptr: u64);
    /// (free, total) bytes on the device.
    fn mem_info(&self) -> (usize, usize);
    /// Waits for all queued work on the device.
    fn synchronize(&self);
    fn last_error(&self) -> String {
        String::new()
    }
    /// A marker of a point in a stream's work.
    type Event;
    /// An event recorded on `s` now, or `None` when none can be (the caller then
    /// waits for the device instead).
    fn record(&mut self, s: StreamId) -> Option<Self::Event>;
    /// `true` once the work queued on its stream before `e` has finished (an
    /// event whose work failed never passes).
    fn passed(&self, e: &Self::Event) -> bool;
    fn destroy(&mut self, e: Self::Event);
}

const ROUND: usize = 512;
const SMALL_MAX: usize = 1 << 20;
const SMALL_SEGMENT: usize = 2 << 20;
const LARGE_SEGMENT: usize = 20 << 20;
const MIN_LARGE_ALLOC: usize = 10 << 20;
const LARGE_ROUND: usize = 2 << 20;
const MIN_LARGE_SPLIT: usize = 1 << 20;

/// `n` bytes as people read them: GiB, MiB or KiB with two decimals, else
/// bytes (`512 B`); `memory::parse_bytes` reads each back but `0 B` (it takes
/// no size of 0).
pub fn fmt_bytes(n: usize) -> String {
    const UNITS: [(u32, &str); 3] = [(30, "GiB"), (20, "MiB"), (10, "KiB")];
    let x = n as f64;
    UNITS
        .iter()
        .find(|(shift, _)| n >= 1 << shift)
        .map_or(format!("{n} B"), |&(shift, unit)| {
            format!("{:.2} {unit}", x / (1u64 << shift) as f64)
        })
}

fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to).max(1) * to
}

#[derive(Clone, Copy, Debug)]
struct Block {
    size: usize,
    segment: u64,
    free: bool,
    small: bool,
    /// The stream whose pool the block's segment belongs to.
    stream: StreamId,
}

/// Free blocks of one pool by (stream, size, address).
type Pool = BTreeSet<(StreamId, usize, u64)>;

/// Memory statistics of one device (PyTorch's `torch.cuda.memory_stats` core).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes in blocks handed out to tensors (rounded sizes).
    pub allocated: usize,
    /// Bytes taken from the driver (allocated + cached).
    pub reserved: usize,
    /// The largest `allocated` since the start or the last peak reset.
    pub peak_allocated: usize,
    /// The largest `reserved` since the start or the last peak reset.
    pub peak_reserved: usize,
    /// Blocks handed out (including reuse) since the start.
    pub num_allocs: u64,
    /// Segments taken from the driver since the start.
    pub num_device_mallocs: u64,
    /// Segments returned to the driver since the start.
    pub num_device_frees: u64,
    /// Times the cache was emptied to retry an allocation that the driver refused.
    pub num_alloc_retries: u64,
    /// Allocations that failed with out-of-memory.
    pub num_ooms: u64,
}

/// Why an allocation failed.
#[derive(Debug)]
pub(crate) enum AllocError {
    OutOfMemory {
        requested: usize,
        free: usize,
        total: usize,
        allocated: usize,
        reserved: usize,
        /// Whether the cache was emptied and the request tried again first
        /// (not while a graph is captured: emptying waits for the device).
        retried: bool,
    },
    Driver(String),
}

pub(crate) struct Allocator<M: RawMemory> {
    raw: M,
    /// Every block, by address.
    blocks: BTreeMap<u64, Block>,
    /// Free blocks by (stream, size, address), per pool.
    free_small: Pool,
    free_large: Pool,
    /// Streams other than its own that used a block handed out
    /// ([`record_stream`](Self::record_stream)).
    stream_uses: HashMap<u64, Vec<StreamId>>,
    /// Blocks freed while work on other streams may still use them, with the
    /// events that say when it has finished.
    pending: Vec<(u64, Vec<M::Event>)>,
    /// The capture under way: (the stream captured, the graph's private pool).
    capture: Option<(StreamId, StreamId)>,
    /// The private pools of graphs alive (their blocks are never released).
    graph_pools: HashSet<StreamId>,
    /// The pools of graphs dropped: nothing allocates from them again, so each
    /// of their segments goes back to the driver once it is all free.
    dead_pools: HashSet<StreamId>,
    /// Blocks of other pools freed during a graph's capture, held for the graph.
    held: HashMap<StreamId, Vec<u64>>,
    /// The id of the next graph pool (above every stream's).
    next_pool: u32,
    /// Segment base -> size.
    segments: BTreeMap<u64, usize>,
    stats: MemoryStats,
    /// false: one driver allocation per block, freed with it (no cache).
    caching: bool,
}

/// Whether `EMBER_CUDA_NO_CACHING` asks for one driver allocation per tensor.
pub(crate) fn caching_from_env() -> bool {
    !std::env::var("EMBER_CUDA_NO_CACHING").is_ok_and(|v| !v.trim().is_empty() && v.trim() != "0")
}

impl<M: RawMemory> Allocator<M> {
    pub fn new(raw: M) -> Self {
        Allocator {
            raw,
            blocks: BTreeMap::new(),
            free_small: BTreeSet::new(),
            free_large: BTreeSet::new(),
            stream_uses: HashMap::new(),
            pending: Vec::new(),
            capture: None,
            graph_pools: HashSet::new(),
            dead_pools: HashSet::new(),
            held: HashMap::new(),
            next_pool: 1 << 16,
            segments: BTreeMap::new(),
            stats: MemoryStats::default(),
            caching: true,
        }
    }

    /// An allocator without a cache: every block is one driver allocation of the
    /// bytes asked for (rounded up to a 4-byte word), returned to the driver when
    /// the block is freed.
    pub fn without_cache(raw: M) -> Self {
        Allocator {
            caching: false,
            ..Allocator::new(raw)
        }
    }

    #[cfg(test)]
    pub fn raw(&self) -> &M {
        &self.raw
    }

    pub fn stats(&self) -> MemoryStats {
        self.stats
    }

    pub fn reset_peak(&mut self) {
        self.stats.peak_allocated = self.stats.allocated;
        self.stats.peak_reserved = self.stats.reserved;
    }

    /// The size of the block handed out at `addr` (its request rounded up, and
    /// more where what was left of a free block was too small to split off).
    pub fn block_size(&self, addr: u64) -> Option<usize> {
        self.blocks.get(&addr).map(|b| b.size)
    }

    /// The size a request of `bytes` occupies.
    pub fn rounded(bytes: usize) -> usize {
        round_up(bytes, ROUND)
    }

    fn pool(&mut self, small: bool) -> &mut Pool {
        if small {
            &mut self.free_small
        } else {
            &mut self.free_large
        }
    }

    /// Starts the capture of a graph on `stream`: its requests come from a new
    /// private pool from now on. Returns the pool; `None` while another capture
    /// is under way.
    pub fn begin_capture(&mut self, stream: StreamId) -> Option<StreamId> {
        if self.capture.is_some() {
            return None;
        }
        let pool = StreamId(self.next_pool);
        self.next_pool += 1;
        self.capture = Some((stream, pool));
        self.graph_pools.insert(pool);
        Some(pool)
    }

    /// Whether `pool` is a graph's that has not been released.
    pub fn graph_pool_alive(&self, pool: StreamId) -> bool {
        self.graph_pools.contains(&pool)
    }

    /// Ends the capture under way; its pool and held blocks stay the graph's.
    pub fn end_capture(&mut self) {
        self.capture = None;
    }

    /// After a graph is dropped and its launches have finished: the blocks held
    /// for it go back to their pools, and its pool's free segments to the driver
    /// (the rest as they become free).
    pub fn release_graph(&mut self, pool: StreamId) {
        if self.capture.is_some_and(|(_, p)| p == pool) {
            self.capture = None;
        }
        self.graph_pools.remove(&pool);
        self.dead_pools.insert(pool);
        for addr in self.held.remove(&pool).unwrap_or_default() {
            if self.caching {
                self.free_block(addr);
            } else {
                let block = self.blocks[&addr];
                self.release_block(addr, block);
            }
        }
        let empty: Vec<u64> = self
            .segments
            .iter()
            .filter(|(base, size)| {
                self.blocks
                    .get(base)
                    .is_some_and(|b| b.free && b.size == **size && b.stream == pool)
            })
            .map(|(b, _)| *b)
            .collect();
        for base in empty {
            self.release_segment(base);
        }
    }

    /// Returns the free segment at `base` to the driver (no queued work uses it).
    fn release_segment(&mut self, base: u64) {
        let size = self.segments.remove(&base).expect("a segment");
        let b = self.blocks.remove(&base).expect("segment block");
        self.pool(b.small).remove(&(b.stream, size, base));
        self.raw.free(base);
        self.stats.reserved -= size;
        self.stats.num_device_frees += 1;
    }

    /// A block of at least `bytes` for work on `stream`; returns its address.
    pub fn alloc(
        &mut self,
        bytes: usize,
        stream: StreamId,
    ) -> std::result::Result<u64, AllocError> {
        let stream = match self.capture {
            Some((s, pool)) if s == stream => pool,
            _ => stream,
        };
        let size = Self::rounded(bytes);
        let small = size <= SMALL_MAX;
        if !self.caching {
            return self.uncached(bytes, size, small, stream);
        }
        // querying events is not allowed while a stream is captured
        if self.capture.is_none() {
            self.process_events();
        }
        let found = self
            .pool(small)
            .range((stream, size, 0)..=(stream, usize::MAX, u64::MAX))
            .next()
            .copied();
        let addr = match found {
            Some(key) => {
                self.pool(small).remove(&key);
                key.2
            }
            None => self.new_segment(size, small, stream)?,
        };
        // split what is left over
        let block = self
            .blocks
            .get_mut(&addr)
            .expect("block of a free-list entry");
        let rest = block.size - size;
        // PyTorch's rule: a small block splits off any whole 512 bytes, a large
        // one only more than 1 MiB (a remainder of exactly 1 MiB stays with
        // the block)
        let split = if small {
            rest >= ROUND
        } else {
            rest > MIN_LARGE_SPLIT
        };
        block.free = false;
        if split {
            block.size = size;
            let tail = Block {
                size: rest,
                segment: block.segment,
                free: true,
                small,
                stream,
            };
            let tail_addr = addr + size as u64;
            self.blocks.insert(tail_addr, tail);
            self.pool(small).insert((stream, rest, tail_addr));
        }
        let got = self.blocks[&addr].size;
        self.count_alloc(got);
        Ok(addr)
    }

    /// Without a cache: a driver allocation of `bytes` (whole words), counted as `size`.
    fn uncached(
        &mut self,
        bytes: usize,
        size: usize,
        small: bool,
        stream: StreamId,
    ) -> std::result::Result<u64, AllocError> {
        // whole 32-bit words: byte-sized atomics swap the word holding the byte
        let addr = self.driver_alloc(round_up(bytes, 4), size)?;
        self.add_segment(addr, size, small, stream);
        if let Some(b) = self.blocks.get_mut(&addr) {
            b.free = false;
        }
        self.count_alloc(size);
        Ok(addr)
    }

    fn count_alloc(&mut self, size: usize) {
        self.stats.allocated += size;
        self.stats.peak_allocated = self.stats.peak_allocated.max(self.stats.allocated);
        self.stats.num_allocs += 1;
    }

    fn new_segment(
        &mut self,
        size: usize,
        small: bool,
        stream: StreamId,
    ) -> std::result::Result<u64, AllocError> {
        let seg = if small {
            SMALL_SEGMENT
        } else if size < MIN_LARGE_ALLOC {
            LARGE_SEGMENT
        } else {
            round_up(size, LARGE_ROUND)
        };
        let base = self.driver_alloc(seg, size)?;
        self.add_segment(base, seg, small, stream);
        Ok(base)
    }

    /// Records a new driver allocation as a segment of `stream` holding one free
    /// block.
    fn add_segment(&mut self, base: u64, seg: usize, small: bool, stream: StreamId) {
        self.stats.num_device_mallocs += 1;
        self.stats.reserved += seg;
        self.stats.peak_reserved = self.stats.peak_reserved.max(self.stats.reserved);
        self.segments.insert(base, seg);
        self.blocks.insert(
            base,
            Block {
                size: seg,
                segment: base,
                free: true,
                small,
                stream,
            },
        );
    }

    /// `bytes` from the driver; when it is out of memory, the cache is released and
    /// the request tried once more. `size` is the request reported in the error.
    fn driver_alloc(&mut self, bytes: usize, size: usize) -> std::result::Result<u64, AllocError> {
        let retried = self.capture.is_none();
        let first = match self.raw.malloc(bytes) {
            // a capture may not wait for the device (what emptying the cache does):
            // no second try then
            Err(true) if retried => {
                // free the cache and try once more
                self.stats.num_alloc_retries += 1;
                self.release_cached();
                self.raw.malloc(bytes)
            }
            r => r,
        };
        match first {
            Ok(p) => Ok(p),
            Err(true) => {
                self.stats.num_ooms += 1;
                let (free, total) = self.raw.mem_info();
                Err(AllocError::OutOfMemory {
                    requested: size,
                    free,
                    total,
                    allocated: self.stats.allocated,
                    reserved: self.stats.reserved,
                    retried,
                })
            }
            Err(false) => Err(AllocError::Driver(self.raw.last_error())),
        }
    }

    /// Marks the block handed out at `addr` as used by work on `stream` too: when
    /// it is freed, it waits for the work queued there by then before it is
    /// handed out again. `false` for an address that is not a block handed out.
    pub fn record_stream(&mut self, addr: u64, stream: StreamId) -> bool {
        let Some(block) = self.blocks.get(&addr) else {
            return false;
        };
        if block.free {
            return false;
        }
        if block.stream != stream {
            let uses = self.stream_uses.entry(addr).or_default();
            if !uses.contains(&stream) {
                uses.push(stream);
            }
        }
        true
    }

    /// Returns the blocks whose other streams' work has finished to their pools.
    fn process_events(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let pending = std::mem::take(&mut self.pending);
        for (addr, events) in pending {
            if events.iter().all(|e| self.raw.passed(e)) {
                for e in events {
                    self.raw.destroy(e);
                }
                self.free_block(addr);
            } else {
                self.pending.push((addr, events));
            }
        }
    }

    /// Waits for the device, then returns every pending block to its pool;
    /// `false` when there was none (and nothing waited).
    fn synchronize_and_free_events(&mut self) -> bool {
        if self.pending.is_empty() {
            return false;
        }
        self.raw.synchronize();
        for (addr, events) in std::mem::take(&mut self.pending) {
            for e in events {
                self.raw.destroy(e);
            }
            self.free_block(addr);
        }
        true
    }

    /// Gives back the block at `addr`: to its pool, or, when work on other streams
    /// used it, to its pool once that work has finished.
    pub fn free(&mut self, addr: u64) {
        let Some(block) = self.blocks.get(&addr).copied() else {
            debug_assert!(false, "free of an unknown block {addr:#x}");
            return;
        };
        if block.free {
            debug_assert!(false, "double free of {addr:#x}");
            return;
        }
        self.stats.allocated -= block.size;
        let uses = self.stream_uses.remove(&addr).unwrap_or_default();
        if let Some((_, pool)) = self.capture {
            // captured work may read a block from before the capture: it waits
            // for the graph (as does one of the graph's that another stream used:
            // no event can be recorded for it during the capture)
            if block.stream != pool || !uses.is_empty() {
                self.held.entry(pool).or_default().push(addr);
                return;
            }
        }
        if !self.caching && self.graph_pools.contains(&block.stream) {
            // without a cache a freed block goes back to the driver: a graph's own
            // waits for the graph
            self.held.entry(block.stream).or_default().push(addr);
            return;
        }
        if !self.caching {
            // the driver's free waits for every stream
            self.release_block(addr, block);
            return;
        }
        if !uses.is_empty() {
            let mut events = Vec::with_capacity(uses.len());
            for s in uses {
                match self.raw.record(s) {
                    Some(e) => events.push(e),
                    None => {
                        // no event to wait for: wait for the device
                        for e in events.drain(..) {
                            self.raw.destroy(e);
                        }
                        self.raw.synchronize();
                        break;
                    }
                }
            }
            if !events.is_empty() {
                self.pending.push((addr, events));
                return;
            }
        }
        self.free_block(addr);
    }

    /// Without a cache: returns the block's allocation to the driver.
    fn release_block(&mut self, addr: u64, block: Block) {
        // queued kernels may still read the block: wait for every stream (the
        // driver's free would too)
        self.blocks.remove(&addr);
        self.segments.remove(&addr);
        self.raw.synchronize();
        self.raw.free(addr);
        self.stats.reserved -= block.size;
        self.stats.num_device_frees += 1;
    }

    /// Returns a block no work needs any more to its stream's pool, merged with
    /// its free neighbours.
    fn free_block(&mut self, addr: u64) {
        let mut block = self.blocks[&addr];
        let mut start = addr;
        // merge with the next block
        let next = addr + block.size as u64;
        if let Some(n) = self.blocks.get(&next).copied() {
            if n.free && n.segment == block.segment {
                self.pool(n.small).remove(&(n.stream, n.size, next));
                self.blocks.remove(&next);
                block.size += n.size;
            }
        }
        // merge with the previous block
        if let Some((&paddr, &p)) = self.blocks.range(..addr).next_back() {
            if p.free && p.segment == block.segment && paddr + p.size as u64 == addr {
                self.pool(p.small).remove(&(p.stream, p.size, paddr));
                self.blocks.remove(&addr);
                block.size += p.size;
                start = paddr;
            }
        }
        block.free = true;
        self.blocks.insert(start, block);
        self.pool(block.small)
            .insert((block.stream, block.size, start));
        if self.dead_pools.contains(&block.stream) && self.segments.get(&start) == Some(&block.size)
        {
            // the last block of a dropped graph's segment: queued work may still
            // read it
            self.raw.synchronize();
            self.release_segment(start);
        }
    }

    /// Returns every segment with nothing allocated in it to the driver
    /// (`torch.cuda.empty_cache()`).
    pub fn release_cached(&mut self) {
        if self.capture.is_some() {
            // a capture may not wait for the device: the cache stays
            return;
        }
        let synced = self.synchronize_and_free_events();
        let empty: Vec<(u64, usize)> = self
            .segments
            .iter()
            .filter(|(base, size)| {
                self.blocks.get(base).is_some_and(|b| {
                    b.free && b.size == **size && !self.graph_pools.contains(&b.stream)
                })
            })
            .map(|(b, s)| (*b, *s))
            .collect();
        if empty.is_empty() {
            return;
        }
        // blocks in the cache may still be read by queued kernels
        if !synced {
            self.raw.synchronize();
        }
        for (base, _) in empty {
            self.release_segment(base);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        let cases = [
            (0, "0 B"),
            (1023, "1023 B"),
            (1024, "1.00 KiB"),
            (512_000, "500.00 KiB"),
            (1 << 20, "1.00 MiB"),
            (3 << 29, "1.50 GiB"),
        ];
        for (n, want) in cases {
            assert_eq!(fmt_bytes(n), want);
        }
        // (that parse_bytes reads these back: tests/memory.rs)
    }

    /// A pretend device with `capacity` bytes, handing out increasing addresses.
    struct Fake {
        capacity: usize,
        used: usize,
        next: u64,
        live: BTreeMap<u64, usize>,
        mallocs: usize,
        /// Whether events can be recorded.
        events: bool,
        /// Every event recorded so far has passed (set by the test, and by a
        /// synchronize).
        passed: std::cell::Cell<bool>,
        /// Events recorded and not destroyed, and synchronizations.
        live_events: usize,
        syncs: std::cell::Cell<usize>,
    }

    impl Fake {
        fn new(capacity: usize) -> Self {
            Fake {
                capacity,
                used: 0,
                next: 1 << 32,
                live: BTreeMap::new(),
                mallocs: 0,
                events: true,
                passed: std::cell::Cell::new(true),
                live_events: 0,
                syncs: std::cell::Cell::new(0),
            }
        }
    }

    impl RawMemory for Fake {
        fn malloc(&mut self, bytes: usize) -> std::result::Result<u64, bool> {
            if self.used + bytes > self.capacity {
                return Err(true);
            }
            self.mallocs += 1;
            self.used += bytes;
            let p = self.next;
            self.next += bytes as u64 + 4096;
            self.live.insert(p, bytes);
            Ok(p)
        }
        fn free(&mut self, ptr: u64) {
            let n = self.live.remove(&ptr).expect("freeing a live allocation");
            self.used -= n;
        }
        fn mem_info(&self) -> (usize, usize) {
            (self.capacity - self.used, self.capacity)
        }
        fn synchronize(&self) {
            self.passed.set(true);
            self.syncs.set(self.syncs.get() + 1);
        }
        type Event = StreamId;
        fn record(&mut self, s: StreamId) -> Option<StreamId> {
            self.live_events += self.events as usize;
            self.events.then_some(s)
        }
        fn passed(&self, _e: &StreamId) -> bool {
            self.passed.get()
        }
        fn destroy(&mut self, _e: StreamId) {
            self.live_events -= 1;
        }
    }

    const S1: StreamId = StreamId(1);

    #[test]
    fn each_stream_has_its_own_blocks() {
        let mut a = Allocator::new(Fake::new(1 << 30));
        let p = a.alloc(3 * MB, S0).unwrap();
        let q = a.alloc(3 * MB, S1).unwrap();
        assert_eq!(a.raw().mallocs, 2, "a segment per stream");
        a.free(p);
        // the free block of stream 0 does not go to stream 1...
        let r = a.alloc(3 * MB, S1).unwrap();
        assert_ne!(r, p);
        // ...but to stream 0's next request
        assert_eq!(a.alloc(3 * MB, S0).unwrap(), p);
        a.free(q);
        a.free(r);
        a.free(p);
        a.release_cached();
        assert_eq!((a.stats().reserved, a.raw().used), (0, 0));
    }

    #[test]
    fn a_block_used_on_another_stream_waits_for_its_event() {
        let mut a = Allocator::new(Fake::new(1 << 30));
        let p = a.alloc(3 * MB, S0).unwrap();
        assert!(a.record_stream(p, S1));
        assert!(a.record_stream(p, S0), "its own stream needs no event");
        assert!(!a.record_stream(p + 512, S1), "not a block handed out");
        a.raw.passed.set(false);
        a.free(p);
        assert_eq!(a.stats().allocated, 0, "freed for the statistics at once");
        assert_eq!(a.raw().live_events, 1, "one event, on stream 1");
        // stream 1's work has not finished: the block is not handed out
        let q = a.alloc(3 * MB, S0).unwrap();
        assert_ne!(q, p);
        a.free(q);
        // it has: the block is back in stream 0's pool (merged with its neighbour)
        a.raw.passed.set(true);
        assert_eq!(a.alloc(3 * MB, S0).unwrap(), p);
        assert_eq!(a.raw().live_events, 0);
        assert_eq!(a.raw().syncs.get(), 0, "no wait for the device");
        a.free(p);
        // a recorded use is forgotten once the block is freed
        let p = a.alloc(3 * MB, S0).unwrap();
        a.free(p);
        assert_eq!(a.raw().live_events, 0);
    }

    #[test]
    fn pending_blocks_are_waited_for_when_the_cache_is_emptied_or_no_event_can_be_had() {
        let mut a = Allocator::new(Fake::new(1 << 30));
        let p = a.alloc(12 * MB, S0).unwrap();
        a.record_stream(p, S1);
        a.raw.passed.set(false);
        a.free(p);
        a.release_cached();
        assert_eq!(a.raw().syncs.get(), 1);
        assert_eq!(
            (a.stats().reserved, a.raw().used, a.raw().live_events),
            (0, 0, 0)
        );
        // without events the free waits for the device, and the block is free at once
        a.raw.events = false;
        let p = a.alloc(12 * MB, S0).unwrap();
        a.record_stream(p, S1);
        a.raw.passed.set(false);
        a.free(p);
        assert_eq!(a.raw().syncs.get(), 2);
        assert_eq!(a.alloc(12 * MB, S0).unwrap(), p);
    }

    const MB: usize = 1 << 20;
    const S0: StreamId = StreamId(0);

    #[test]
    fn rounds_and_counts() {
        let mut a = Allocator::new(Fake::new(1 << 30));
        let p = a.alloc(1, S0).unwrap();
        assert_eq!(a.stats().allocated, 512);
        assert_eq!(a.stats().reserved, 2 * MB);
        let q = a.alloc(1000, S0).unwrap();
        assert_eq!(
            q,
            p + 512,
            "second small block carved from the same segment"
        );
        assert_eq!(a.stats().allocated, 512 + 1024);
        a.free(p);
        a.free(q);
        assert_eq!(a.stats().allocated, 0);
        assert_eq!(a.stats().reserved, 2 * MB, "freed blocks stay cached");
        assert_eq!(a.raw().mallocs, 1);
    }

    #[test]
    fn reuse_without_driver_calls() {
        let mut a = Allocator::new(Fake::new(1 << 30));
        let p = a.alloc(64 * MB, S0).unwrap();
        a.free(p);
        for _ in 0..100 {
            let q = a.alloc(64 * MB, S0).unwrap();
            assert_eq!(q, p);
            a.free(q);
        }
        assert_eq!(a.raw().mallocs, 1);
        assert_eq!(a.stats().num_device_mallocs, 1);
        assert_eq!(a.stats().num_allocs, 101);
    }

    #[test]
    fn without_cache_each_block_is_a_driver_allocation_of_its_bytes() {
        let mut a = Allocator::without_cache(Fake::new(64 << 20));
        let p = a.alloc(1000, S0).unwrap();
        let q = a.alloc(3 << 20, S0).unwrap();
        // the bytes asked for (in whole words), so a memory checker sees each
        // tensor's end
        assert_eq!(a.raw().live[&p], 1000);
        let w = a.alloc(3, S0).unwrap();
        assert_eq!(a.raw().live[&w], 4);
        a.free(w);
        assert_eq!(a.raw().live[&q], 3 << 20);
        let s = a.stats();
        assert_eq!(s.allocated, 1024 + (3 << 20));
        assert_eq!(s.reserved, s.allocated);
        assert_eq!(s.num_device_mallocs, 3);
        a.free(p);
        assert!(!a.raw().live.contains_key(&p), "freed at once");
        assert_eq!(a.stats().reserved, 3 << 20);
        assert_eq!(a.stats().peak_reserved, 1024 + 512 + (3 << 20));
        a.free(q);
        assert!(a.raw().live.is_empty());
        let s = a.stats();
        assert_eq!((s.allocated, s.reserved, s.num_device_frees), (0, 0, 3));
        // out of memory is still an error, and the allocator goes on
        assert!(matches!(
            a.alloc(65 << 20, S0),
            Err(AllocError::OutOfMemory { .. })
        ));
        let r = a.alloc(8, S0).unwrap();
        a.free(r);
        assert!(a.raw().live.is_empty());
    }

    #[test]
    fn split_and_merge() {
        let mut a = Allocator::new(Fake::new(1 << 30));
        // 3 MiB from a 20 MiB large segment: the rest is split off
        let p = a.alloc(3 * MB, S0).unwrap();
        let q = a.alloc(5 * MB, S0).unwrap();
        assert_eq!(q, p + 3 * MB as u64);
        assert_eq!(a.stats().reserved, 20 * MB);
        a.free(p);
        a.free(q);
        // everything merged back into one 20 MiB block
        let r = a.alloc(20 * MB, S0).unwrap();
        assert_eq!(r, p);
        assert_eq!(a.raw().mallocs, 1);
        a.free(r);
        a.release_cached();
        assert_eq!(a.stats().reserved, 0);
        assert_eq!(a.raw().used, 0);
    }

    /// A large block's remainder splits off only when it is more than 1 MiB
    /// (PyTorch's `remaining > kSmallSize`); a small block's from 512 bytes.
    #[test]
    fn split_thresholds_are_pytorchs() {
        let mut a = Allocator::new(Fake::new(1 << 30));
        // 19 MiB of a 20 MiB segment: the 1 MiB left stays with the block
        let p = a.alloc(19 * MB, S0).unwrap();
        assert_eq!(a.block_size(p), Some(20 * MB));
        assert_eq!(a.stats().allocated, 20 * MB);
        a.free(p);
        // a byte less leaves more than 1 MiB (rounded to 512 bytes): split
        let q = a.alloc(19 * MB - 512, S0).unwrap();
        assert_eq!(a.block_size(q), Some(19 * MB - 512));
        a.free(q);
        // small (at most 1 MiB, from 2 MiB segments): even 512 bytes left of
        // a block are split off
        let r = a.alloc(MB, S0).unwrap();
        assert_eq!(a.block_size(r), Some(MB));
        let t = a.alloc(MB - 512, S0).unwrap();
        assert_eq!((t, a.block_size(t)), (r + MB as u64, Some(MB - 512)));
        assert_eq!(a.stats().reserved, 20 * MB + 2 * MB);
    }

    #[test]
    fn oom_frees_cache_retries_then_errors_and_recovers() {
        let mut a = Allocator::new(Fake::new(100 * MB));
        let p = a.alloc(60 * MB, S0).unwrap();
        a.free(p); // cached: 60 MiB reserved
                   // 80 MiB does not fit next to the cached 60: the cache is freed and retried
        let q = a.alloc(80 * MB, S0).unwrap();
        assert_eq!(a.stats().num_alloc_retries, 1);
        assert_eq!(a.stats().reserved, 80 * MB);
        // too large even with an empty cache
        match a.alloc(500 * MB, S0) {
            Err(AllocError::OutOfMemory {
                requested,
                allocated,
                reserved,
                free,
                ..
            }) => {
                assert_eq!(requested, 500 * MB);
                assert_eq!(allocated, 80 * MB);
                assert_eq!(reserved, 80 * MB);
                assert_eq!(free, 20 * MB);
            }
            other => panic!("expected OutOfMemory, got {other:?}"),
        }
        assert_eq!(a.stats().num_ooms, 1);
        assert!(matches!(
            a.alloc(500 * MB, S0),
            Err(AllocError::OutOfMemory { retried: true, .. })
        ));
        // during a capture the cache is not emptied (that waits for the
        // device): no second try, and the error says so
        let retries = a.stats().num_alloc_retries;
        a.begin_capture(S0).unwrap();
        assert!(matches!(
            a.alloc(500 * MB, S0),
            Err(AllocError::OutOfMemory { retried: false, .. })
        ));
        assert_eq!(a.stats().num_alloc_retries, retries);
        a.end_capture();
        // the allocator still works
        let r = a.alloc(MB, S0).unwrap();
        a.free(r);
        a.free(q);
        a.release_cached();
        assert_eq!(a.raw().used, 0);
    }

    #[test]
    fn peak_and_reset() {
        let mut a = Allocator::new(Fake::new(1 << 30));
        let p = a.alloc(4 * MB, S0).unwrap();
        let q = a.alloc(4 * MB, S0).unwrap();
        a.free(p);
        assert_eq!(a.stats().peak_allocated, 8 * MB);
        a.reset_peak();
        assert_eq!(a.stats().peak_allocated, 4 * MB);
        a.free(q);
    }

    #[test]
    fn many_random_blocks_keep_invariants() {
        use rand::{RngExt, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let mut a = Allocator::new(Fake::new(1 << 32));
        let mut live: Vec<(u64, usize)> = Vec::new();
        for _ in 0..2000 {
            if live.is_empty() || rng.random_range(0..3) > 0 {
                let n = if rng.random_bool(0.8) {
                    rng.random_range(1..200_000)
                } else {
                    rng.random_range(1..30 * MB)
                };
                let p = a.alloc(n, S0).unwrap();
                // no overlap with any live block
                let r = Allocator::<Fake>::rounded(n) as u64;
                for &(q, m) in &live {
                    let m = Allocator::<Fake>::rounded(m) as u64;
                    assert!(p + r <= q || q + m <= p, "overlap");
                }
                live.push((p, n));
            } else {
                let i = rng.random_range(0..live.len());
                let (p, _) = live.swap_remove(i);
                a.free(p);
            }
            let in_use: usize = a.blocks.values().filter(|b| !b.free).map(|b| b.size).sum();
            assert_eq!(a.stats().allocated, in_use);
            for &(p, n) in &live {
                assert!(a.blocks[&p].size >= Allocator::<Fake>::rounded(n));
            }
        }
        for (p, _) in live.drain(..) {
            a.free(p);
        }
        a.release_cached();
        assert_eq!(a.stats().reserved, 0);
        assert_eq!(a.raw().used, 0);
    }
}
