//! A simulated GPU's memory: host allocations counted against the device's
//! capacity, filled so that unwritten reads show, and the region checks that
//! stand in for the GPU's bounds (and, with the memory checker, the sanitizer's).

use super::*;

/// A simulated GPU's memory: host allocations (aligned like cudaMalloc's) counted
/// against the device's capacity. New memory is filled with 0xFF bytes, so a kernel
/// that reads what nothing wrote sees NaNs and -1s rather than zeros.
pub(crate) struct SimMemory {
    live: HashMap<u64, std::alloc::Layout>,
    used: usize,
    capacity: usize,
}

impl SimMemory {
    pub fn new() -> SimMemory {
        SimMemory {
            live: HashMap::new(),
            used: 0,
            capacity: capacity(),
        }
    }

    /// A new allocation, or `Err(true)` when it does not fit in the device.
    pub fn malloc(&mut self, bytes: usize) -> std::result::Result<u64, bool> {
        if bytes > self.capacity - self.used {
            return Err(true);
        }
        let layout = std::alloc::Layout::from_size_align(bytes.max(1), 256).map_err(|_| true)?;
        // SAFETY: a non-zero size with a valid alignment.
        let p = unsafe { std::alloc::alloc(layout) };
        if p.is_null() {
            return Err(true);
        }
        // SAFETY: `p` holds `layout.size()` bytes.
        unsafe { std::ptr::write_bytes(p, 0xff, layout.size()) };
        self.used += bytes;
        self.live.insert(p as u64, layout);
        Ok(p as u64)
    }

    pub fn free(&mut self, ptr: u64) {
        if let Some(layout) = self.live.remove(&ptr) {
            self.used -= layout.size().min(self.used);
            // SAFETY: allocated above with this layout and not freed before.
            unsafe { std::alloc::dealloc(ptr as *mut u8, layout) };
        }
    }

    pub fn mem_info(&self) -> (usize, usize) {
        (self.capacity - self.used, self.capacity)
    }
}

type Poisoned = unsafe extern "C" fn(*const c_void, usize) -> *const c_void;

/// The sanitizer's `__asan_region_is_poisoned`, when its runtime is loaded.
fn region_checker() -> Option<Poisoned> {
    static CHECK: OnceLock<Option<Poisoned>> = OnceLock::new();
    *CHECK.get_or_init(|| {
        let this = libloading::os::unix::Library::this();
        // SAFETY: the sanitizer's documented interface function, when present.
        unsafe { this.get::<Poisoned>(b"__asan_region_is_poisoned\0") }
            .ok()
            .map(|f| *f)
    })
}

/// Whether memory checks run (the sanitizer's runtime is loaded, as under
/// `.ci/memcheck`).
#[cfg(test)]
pub(crate) fn memory_checker_active() -> bool {
    region_checker().is_some()
}

/// With the sanitizer's runtime loaded (`.ci/memcheck`): an error when any of the
/// bytes `[addr, addr + len)` lies outside live memory. The kernels are checked by
/// the sanitizer itself; this gives the same check to the simulator's own cuBLAS and
/// cuDNN (Rust code the sanitizer does not see), so an operand that a wrong leading
/// dimension or batch stride stretches past its tensor is reported. Without the
/// runtime it checks nothing.
pub(crate) fn check_region(op: &'static str, what: &str, addr: u64, len: u64) -> Result<()> {
    let Some(check) = region_checker() else {
        return Ok(());
    };
    if len == 0 {
        return Ok(());
    }
    // SAFETY: the function only reads the sanitizer's shadow memory for the range.
    let bad = unsafe { check(addr as *const c_void, len as usize) };
    if bad.is_null() {
        return Ok(());
    }
    Err(Error::Cuda {
        op,
        msg: format!(
            "simulator memory check: {what} spans bytes {addr:#x}..{:#x}, and {:#x} is \
             outside live memory (past its tensor, or freed)",
            addr + len,
            bad as u64
        ),
    })
}

/// Copies `bytes` between two simulated-device or host addresses.
///
/// # Safety
/// Both ranges must be valid for `bytes` bytes (device ranges lie in live blocks).
pub(crate) unsafe fn memcpy(dst: u64, src: u64, bytes: usize) {
    let _g = exec_lock();
    // device ranges of different tensors never overlap; one copy within a tensor may
    std::ptr::copy(src as *const u8, dst as *mut u8, bytes);
}
