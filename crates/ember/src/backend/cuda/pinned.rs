//! Copies between host and device through page-locked ("pinned") host memory.
//!
//! The DMA engines read only pinned memory. Given ordinary (pageable) memory, the
//! driver stages the copy itself and may first wait for the stream, so an upload can
//! stall the host until all queued GPU work has finished. ember stages uploads
//! itself: the values are copied (in parallel when large) into a pinned block, the
//! device copy is queued from that block, and the call returns at once; an event
//! recorded after the copy says when the block may be reused. Downloads of 1 MiB and
//! more come back through pinned blocks in chunks, so the DMA of one chunk overlaps
//! the host's copy of the previous one.
//!
//! The blocks are cached per device (up to [`LIMIT`] bytes), like PyTorch's host
//! caching allocator. If pinned memory cannot be had, copies take the pageable path:
//! slower, never an error.

use super::runtime::{RtEvent, Runtime, StreamId};
use crate::error::Result;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::sync::MutexGuard;

/// Largest piece of one transfer staged through one block.
const CHUNK: usize = 8 << 20;
/// Pinned bytes a device keeps cached.
const LIMIT: usize = 256 << 20;
/// Smallest block allocated (small uploads share this size class).
const MIN_BLOCK: usize = 64 << 10;
/// Downloads from this size on go through pinned blocks.
const STAGED_DOWNLOAD: usize = 1 << 20;
/// Host copies from this size on run on several threads.
const PARALLEL_COPY: usize = 1 << 20;

static STAGING: AtomicBool = AtomicBool::new(true);

/// Turns ember's pinned staging of copies on or off (on by default). Off, copies
/// take the driver's pageable path; for measuring the difference (`ember bench`).
pub fn set_pinned_staging(on: bool) {
    STAGING.store(on, Ordering::Relaxed);
}

/// One pinned host block and the event recorded after the last device copy that
/// used it.
pub(crate) struct PinnedBlock {
    ptr: *mut u8,
    size: usize,
    event: RtEvent,
    in_flight: bool,
}

// SAFETY: the block is plain host memory, used by one thread at a time.
unsafe impl Send for PinnedBlock {}

/// A device's cached pinned blocks.
#[derive(Default)]
pub(crate) struct PinnedPool {
    free: Vec<PinnedBlock>,
    /// Bytes held in all blocks, free or handed out.
    total: usize,
    /// Blocks handed out for a copy since the start (for tests and statistics).
    pub uses: u64,
    /// Why pinned memory is unavailable, once an allocation failed.
    failed: Option<String>,
}

impl PinnedBlock {
    fn bytes(&mut self, len: usize) -> &mut [u8] {
        debug_assert!(len <= self.size);
        // SAFETY: the block holds `size` bytes and nothing else refers to it while
        // it is handed out (any device copy that read it has finished).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, len) }
    }
}

/// Copies `src` into `dst`, on several threads when large.
fn host_copy(dst: &mut [u8], src: &[u8]) {
    use rayon::prelude::*;
    if src.len() >= PARALLEL_COPY {
        dst.par_chunks_mut(256 << 10)
            .zip(src.par_chunks(256 << 10))
            .for_each(|(d, s)| d.copy_from_slice(s));
    } else {
        dst.copy_from_slice(src);
    }
}

fn as_bytes<T>(v: &[T]) -> &[u8] {
    // SAFETY: ember's element types are plain data without padding.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v)) }
}

fn as_bytes_mut<T>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: as above; every bit pattern is written by a copy of the same type.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), std::mem::size_of_val(v)) }
}

/// A device's pinned copies on one of its streams: its runtime and its pool of
/// blocks.
pub(crate) struct Pinned<'a> {
    pub rt: &'a dyn Runtime,
    pub pool: &'a Mutex<PinnedPool>,
    /// The stream the copies are queued on.
    pub stream: StreamId,
    /// The device's count of host waits (`cuda::host_syncs`): a copy that
    /// must wait for a block still in flight adds one.
    pub syncs: &'a std::sync::atomic::AtomicU64,
}

impl Pinned<'_> {
    /// `true` once the device copy that last used `b` has finished.
    fn block_idle(&self, b: &PinnedBlock) -> bool {
        // (a block whose copy failed counts as busy: waiting for it reports the error)
        !b.in_flight || self.rt.event_query(&b.event).unwrap_or(false)
    }

    /// [`block_wait`](Self::block_wait) for a block a copy takes because every
    /// cached one is in flight: a host wait the caller did not ask for, counted
    /// (a download's waits for its own chunks are its one counted wait).
    fn block_wait_for_room(&self, b: &mut PinnedBlock) -> Result<()> {
        if b.in_flight {
            self.syncs.fetch_add(1, Ordering::Relaxed);
        }
        self.block_wait(b)
    }

    /// Waits for the device copy that last used `b`.
    fn block_wait(&self, b: &mut PinnedBlock) -> Result<()> {
        if b.in_flight {
            self.rt.event_synchronize(&b.event)?;
        }
        b.in_flight = false;
        Ok(())
    }

    /// Queues a copy of `len` bytes from pinned `src` to device `dst`.
    ///
    /// # Safety
    /// `src` must be pinned and stay untouched until the copy has run; `dst` must
    /// hold `len` bytes.
    unsafe fn copy_htod_async(&self, dst: u64, src: *const u8, len: usize) -> Result<()> {
        self.rt.htod(self.stream, dst, src, len)
    }

    /// Queues a copy of `len` bytes from device `src` to host `dst`.
    ///
    /// # Safety
    /// `dst` must hold `len` bytes and not be read before the copy has run (the
    /// stream synchronized or an event after it passed); `src` must hold `len` bytes.
    unsafe fn copy_dtoh_async(&self, dst: *mut u8, src: u64, len: usize) -> Result<()> {
        self.rt.dtoh(self.stream, dst, src, len)
    }

    fn pinned_pool(&self) -> MutexGuard<'_, PinnedPool> {
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Statistics of the pinned pool: (bytes held, blocks handed out so far).
    pub(crate) fn stats(&self) -> (usize, u64) {
        let p = self.pinned_pool();
        (p.total, p.uses)
    }

    /// A pinned block of at least `len` bytes whose last copy has finished, or
    /// `None` when pinned memory is not available.
    fn acquire_pinned(&self, len: usize) -> Result<Option<PinnedBlock>> {
        if !STAGING.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let want = len.max(MIN_BLOCK).next_power_of_two();
        loop {
            let mut pool = self.pinned_pool();
            if pool.failed.is_some() {
                return Ok(None);
            }
            // 1. a cached block of this size class whose last copy is done
            if let Some(i) = pool
                .free
                .iter()
                .position(|b| b.size == want && self.block_idle(b))
            {
                let mut b = pool.free.swap_remove(i);
                b.in_flight = false;
                pool.uses += 1;
                return Ok(Some(b));
            }
            // 2. room for a new block (idle blocks of other sizes make room)
            if pool.total + want > LIMIT {
                let (idle, busy): (Vec<_>, Vec<_>) = pool
                    .free
                    .drain(..)
                    .partition(|b| b.size != want && self.block_idle(b));
                pool.free = busy;
                for b in idle {
                    pool.total -= b.size;
                    self.free_pinned(b);
                }
            }
            if pool.total + want <= LIMIT {
                pool.total += want;
                drop(pool);
                return match self.alloc_pinned(want) {
                    Ok(b) => {
                        self.pinned_pool().uses += 1;
                        Ok(Some(b))
                    }
                    Err(msg) => {
                        let mut pool = self.pinned_pool();
                        pool.total -= want;
                        pool.failed = Some(msg);
                        Ok(None)
                    }
                };
            }
            // 3. the cache is full of blocks in flight: wait for one of this size...
            if let Some(i) = pool.free.iter().position(|b| b.size == want) {
                let mut b = pool.free.swap_remove(i);
                pool.uses += 1;
                drop(pool);
                self.block_wait_for_room(&mut b)?;
                return Ok(Some(b));
            }
            // ...or for any, which then makes room on the next round
            let Some(mut b) = pool.free.pop() else {
                // every block is in another thread's hands: copy unstaged
                return Ok(None);
            };
            drop(pool);
            self.block_wait_for_room(&mut b)?;
            self.pinned_pool().free.push(b);
        }
    }

    fn alloc_pinned(&self, size: usize) -> std::result::Result<PinnedBlock, String> {
        let ptr = self.rt.alloc_host(size)?;
        match self.rt.event_create(false) {
            Ok(event) => Ok(PinnedBlock {
                ptr,
                size,
                event,
                in_flight: false,
            }),
            Err(e) => {
                // SAFETY: allocated just above, never used.
                unsafe { self.rt.free_host(ptr, size) };
                Err(e.to_string())
            }
        }
    }

    fn free_pinned(&self, b: PinnedBlock) {
        // SAFETY: idle (its copy finished), allocated by alloc_pinned with its size.
        unsafe { self.rt.free_host(b.ptr, b.size) };
        self.rt.event_destroy(b.event);
    }

    /// Hands a block back; `queued` says a device copy that uses it was just queued
    /// (the block's event is recorded after it).
    fn release_pinned(&self, mut b: PinnedBlock, queued: bool) -> Result<()> {
        let recorded = if queued {
            self.record_block(&mut b)
        } else {
            Ok(())
        };
        // without its event the block may go back only once the stream has run the
        // copy; if even that fails it stays out of the pool (still counted, never
        // reused while the device might read or write it)
        if recorded.is_ok() || self.rt.synchronize().is_ok() {
            self.pinned_pool().free.push(b);
        }
        recorded
    }

    /// Marks `b` in flight until the work queued so far on the stream has run.
    fn record_block(&self, b: &mut PinnedBlock) -> Result<()> {
        self.rt.event_record(&mut b.event, self.stream)?;
        b.in_flight = true;
        Ok(())
    }

    /// Empties the pinned cache (blocks whose copies are done).
    pub(crate) fn release_cache(&self) {
        let mut pool = self.pinned_pool();
        let blocks: Vec<PinnedBlock> = pool.free.drain(..).collect();
        for mut b in blocks {
            if self.block_wait(&mut b).is_ok() {
                pool.total -= b.size;
                self.free_pinned(b);
            } else {
                pool.free.push(b);
            }
        }
    }

    /// Queues a copy of `src` to device address `dst` and returns once `src` may be
    /// dropped (the values sit in pinned blocks until the device has copied them).
    pub(crate) fn htod<T>(&self, dst: u64, src: &[T]) -> Result<()> {
        let src = as_bytes(src);
        let mut off = 0;
        while off < src.len() {
            let len = (src.len() - off).min(CHUNK);
            let Some(mut block) = self.acquire_pinned(len)? else {
                // pageable path for the rest: the driver stages it (and may wait)
                // SAFETY: `dst + off` holds the remaining bytes.
                return unsafe {
                    self.copy_htod_async(dst + off as u64, src[off..].as_ptr(), src.len() - off)
                };
            };
            host_copy(block.bytes(len), &src[off..off + len]);
            // SAFETY: the block is pinned and stays untouched until its event, recorded
            // by release_pinned right after, has passed; `dst + off` holds `len` bytes.
            let queued = unsafe { self.copy_htod_async(dst + off as u64, block.ptr, len) };
            self.release_pinned(block, queued.is_ok())?;
            queued?;
            off += len;
        }
        Ok(())
    }

    /// Copies device address `src` into `dst`, waiting for the work queued before
    /// on the stream.
    pub(crate) fn dtoh<T>(&self, dst: &mut [T], src: u64) -> Result<()> {
        let dst = as_bytes_mut(dst);
        if dst.is_empty() {
            return Ok(());
        }
        if dst.len() >= STAGED_DOWNLOAD {
            return self.dtoh_staged(dst, src);
        }
        // SAFETY: `src` holds `dst.len()` bytes; `dst` is read after the synchronize.
        unsafe { self.copy_dtoh_async(dst.as_mut_ptr(), src, dst.len()) }?;
        self.rt.stream_synchronize(self.stream)
    }

    /// [`dtoh`](Self::dtoh) in chunks through up to three pinned blocks in flight.
    fn dtoh_staged(&self, dst: &mut [u8], src: u64) -> Result<()> {
        let mut pending: VecDeque<(PinnedBlock, usize, usize)> = VecDeque::new();
        let copied = self.dtoh_staged_into(dst, src, &mut pending);
        if copied.is_err() {
            // blocks still in flight go back once the stream has finished with them
            for (b, _, _) in pending.drain(..) {
                let _ = self.release_pinned(b, true);
            }
        }
        copied
    }

    fn dtoh_staged_into(
        &self,
        dst: &mut [u8],
        src: u64,
        pending: &mut VecDeque<(PinnedBlock, usize, usize)>,
    ) -> Result<()> {
        let finish = |(mut b, at, len): (PinnedBlock, usize, usize), dst: &mut [u8]| {
            self.block_wait(&mut b)?;
            host_copy(&mut dst[at..at + len], b.bytes(len));
            self.release_pinned(b, false)
        };
        let mut off = 0;
        while off < dst.len() {
            let len = (dst.len() - off).min(CHUNK);
            let Some(mut block) = self.acquire_pinned(len)? else {
                while let Some(p) = pending.pop_front() {
                    finish(p, dst)?;
                }
                let rest = &mut dst[off..];
                // SAFETY: as in `dtoh`.
                unsafe { self.copy_dtoh_async(rest.as_mut_ptr(), src + off as u64, rest.len()) }?;
                return self.rt.stream_synchronize(self.stream);
            };
            // SAFETY: the block holds `len` bytes and is read only after its event.
            if let Err(e) = unsafe { self.copy_dtoh_async(block.ptr, src + off as u64, len) } {
                self.release_pinned(block, false)?;
                return Err(e);
            }
            if let Err(e) = self.record_block(&mut block) {
                self.release_pinned(block, true)?;
                return Err(e);
            }
            pending.push_back((block, off, len));
            if pending.len() > 2 {
                let p = pending.pop_front().expect("three pending");
                finish(p, dst)?;
            }
            off += len;
        }
        while let Some(p) = pending.pop_front() {
            finish(p, dst)?;
        }
        Ok(())
    }
}
