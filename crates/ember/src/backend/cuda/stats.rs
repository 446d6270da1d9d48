//! The public face of the CUDA runtime (re-exported as `ember::cuda::*`):
//! synchronization, memory statistics, events and TF32.

use super::device::{dev, existing, CudaDev};
use super::runtime::RtEvent;
use crate::backend::alloc::MemoryStats;
use crate::{
    device::Device,
    error::{Error, Result},
};
use std::sync::Arc;

fn cuda_index(device: Device) -> Result<usize> {
    match device {
        Device::Cuda(i) => Ok(i),
        other => Err(Error::invalid(
            "cuda",
            format!("expected a CUDA device (cuda:N), got {other}"),
        )),
    }
}

/// `device`'s index, for a call that has nothing to do on a GPU not used yet:
/// an error for a device that is not CUDA, or an index past the GPUs there
/// are (no error without CUDA at all: there is nothing to do either).
fn unused_or_absent(device: Device) -> Result<usize> {
    let i = cuda_index(device)?;
    if super::discover::device_count() > 0 {
        super::discover::check_device(device)?;
    }
    Ok(i)
}

/// Waits until all work queued on `device` has finished
/// (`torch.cuda.synchronize(device)`). A no-op for the CPU and `meta`.
pub fn synchronize(device: &Device) -> Result<()> {
    match device {
        Device::Cuda(i) => dev(*i)?.synchronize(),
        // nothing runs asynchronously there
        Device::Cpu | Device::Meta => Ok(()),
    }
}

/// How many times the host has waited for `device` so far: each copy of values
/// to the host (`to_vec`, `item`, printing, `to(cpu)`) and each [`synchronize`].
/// Read it before and after a training step to see the step's hidden waits (a
/// GPU step that waits for nothing lets the host queue the next one meanwhile);
/// `ember train` prints it per step. 0 for a GPU not used yet; an error for the
/// CPU and `meta`, which never wait.
pub fn host_syncs(device: &Device) -> Result<u64> {
    let i = cuda_index(*device)?;
    super::discover::check_device(*device)?;
    Ok(existing(i).map_or(0, |d| d.host_syncs()))
}

/// The caching allocator's statistics for `device` (all zero before its first use).
pub fn memory_stats(device: &Device) -> Result<MemoryStats> {
    let i = cuda_index(*device)?;
    super::discover::check_device(*device)?;
    Ok(existing(i).map_or_else(MemoryStats::default, |d| d.memory_stats()))
}

/// Bytes held by tensors on `device` (`torch.cuda.memory_allocated`).
pub fn memory_allocated(device: &Device) -> Result<usize> {
    Ok(memory_stats(device)?.allocated)
}

/// Bytes taken from the driver, cached blocks included (`torch.cuda.memory_reserved`).
pub fn memory_reserved(device: &Device) -> Result<usize> {
    Ok(memory_stats(device)?.reserved)
}

/// The most bytes held by tensors since the start or the last
/// [`reset_peak_memory_stats`] (`torch.cuda.max_memory_allocated`).
pub fn max_memory_allocated(device: &Device) -> Result<usize> {
    Ok(memory_stats(device)?.peak_allocated)
}

/// Starts peak tracking again from the current usage. A GPU not used yet has
/// no peak to reset: nothing is done (no CUDA context is made for it, and none
/// is needed, so this is no error without a GPU either).
pub fn reset_peak_memory_stats(device: &Device) -> Result<()> {
    if let Some(d) = existing(unused_or_absent(*device)?) {
        d.reset_peak();
    }
    Ok(())
}

/// Returns cached, unused device memory to the driver (`torch.cuda.empty_cache`),
/// and the idle pinned host blocks that stage copies. A GPU not used yet holds
/// nothing: nothing is done (as PyTorch's, without making a CUDA context, and
/// without a GPU too).
pub fn empty_cache(device: &Device) -> Result<()> {
    if let Some(d) = existing(unused_or_absent(*device)?) {
        d.empty_cache();
    }
    Ok(())
}

/// What ember's pinned host memory for copies to and from one GPU holds
/// (`torch.cuda.host_memory_stats`' core).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostMemoryStats {
    /// Bytes of page-locked host memory kept for staging copies.
    pub reserved: usize,
    /// Copies (or chunks of large copies) staged through it since the start.
    pub staged_copies: u64,
}

/// Statistics of the pinned host memory that stages `device`'s copies (zero before
/// its first copy). [`empty_cache`] returns the idle blocks.
pub fn host_memory_stats(device: &Device) -> Result<HostMemoryStats> {
    let i = cuda_index(*device)?;
    super::discover::check_device(*device)?;
    Ok(existing(i).map_or_else(HostMemoryStats::default, |d| {
        let (reserved, staged_copies) = d.pinned_stats();
        HostMemoryStats {
            reserved,
            staged_copies,
        }
    }))
}

/// (free, total) bytes of device memory as the driver sees them
/// (`torch.cuda.mem_get_info`); creates the device's context.
pub fn mem_get_info(device: &Device) -> Result<(usize, usize)> {
    dev(cuda_index(*device)?)?.mem_get_info()
}

thread_local! {
    static BIAS_EPILOGUES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many matrix products the calling thread has queued for cublasLt with its
/// bias epilogue (`Linear`, `linear` and `addmm` with one bias row, on a GPU): a
/// way to see that the bias is added by the product and not by a second kernel.
pub fn bias_epilogue_products() -> u64 {
    BIAS_EPILOGUES.with(|c| c.get())
}

/// Counts one product queued with the bias epilogue.
pub(crate) fn count_bias_epilogue() {
    BIAS_EPILOGUES.with(|c| c.set(c.get() + 1));
}

static ALLOW_TF32: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Lets f32 matrix products use TF32 tensor cores (10-bit mantissa inputs, f32
/// accumulate), like `torch.backends.cuda.matmul.allow_tf32 = True`. Off by default.
/// ember's simulator then reads the operands as TF32 too. Convolutions through
/// cuDNN have a switch of their own,
/// [`cudnn::set_allow_tf32`](crate::cuda::cudnn::set_allow_tf32), on by default.
pub fn set_allow_tf32(on: bool) {
    ALLOW_TF32.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Whether f32 matrix products may use TF32.
pub fn allow_tf32() -> bool {
    ALLOW_TF32.load(std::sync::atomic::Ordering::Relaxed)
}

/// A point in a device's stream, for timing GPU work and for ordering streams
/// (`torch.cuda.Event(enable_timing=True)`).
///
/// ```no_run
/// # use ember::prelude::*;
/// let dev = Device::Cuda(0);
/// let a = Tensor::randn([4096, 4096], &dev)?;
/// let start = ember::cuda::Event::record(&dev)?;
/// let c = a.matmul(&a)?;
/// let end = ember::cuda::Event::record(&dev)?;
/// println!("{:.3} ms", start.elapsed_ms(&end)?); // waits for `end`
/// # Ok::<(), ember::Error>(())
/// ```
pub struct Event {
    ev: Option<RtEvent>,
    dev: Arc<CudaDev>,
}

impl Event {
    /// Records an event on `device`'s current stream now.
    pub fn record(device: &Device) -> Result<Event> {
        let d = dev(cuda_index(*device)?)?;
        let s = d.stream();
        Event::record_at(d, s)
    }

    /// Records an event on `stream` now.
    pub fn record_on(stream: &super::Stream) -> Result<Event> {
        Event::record_at(stream.dev.clone(), stream.id)
    }

    fn record_at(d: Arc<CudaDev>, s: super::runtime::StreamId) -> Result<Event> {
        let mut ev = d.rt().event_create(true)?;
        if let Err(e) = d.rt().event_record(&mut ev, s) {
            d.rt().event_destroy(ev);
            return Err(e);
        }
        Ok(Event {
            ev: Some(ev),
            dev: d,
        })
    }

    /// The device the event was recorded on.
    pub fn device(&self) -> Device {
        self.dev.device()
    }

    /// Makes the work queued on `stream` from now on wait for this event's work
    /// (`Event.wait(stream)`); the host does not wait.
    pub fn wait(&self, stream: &super::Stream) -> Result<()> {
        stream.wait_event(self)
    }

    pub(crate) fn raw(&self) -> &RtEvent {
        self.ev
            .as_ref()
            .expect("an event is destroyed only by drop")
    }

    /// `true` once the work queued before this event has finished, `false` while
    /// it runs, without waiting (`torch.cuda.Event.query()`); an error of that
    /// work is returned as an error.
    /// Refused while a graph is captured on the device (CUDA forbids it: the
    /// captured work has not run).
    pub fn query(&self) -> Result<bool> {
        self.dev
            .refuse_in_capture("querying an event", CudaDev::NOT_RUN_YET)?;
        self.dev.rt().event_query(self.raw())
    }

    /// Waits until the work queued before this event has finished (a host wait,
    /// counted by [`host_syncs`]). Refused while a graph is captured on the
    /// device, as every wait is.
    pub fn synchronize(&self) -> Result<()> {
        self.dev
            .refuse_in_capture("waiting for an event", CudaDev::NOT_RUN_YET)?;
        self.dev.rt().event_synchronize(self.raw())?;
        self.dev.count_sync();
        Ok(())
    }

    /// Milliseconds of GPU time from this event to `end` (waits for `end`, so
    /// refused while a graph is captured).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        if !Arc::ptr_eq(&self.dev, &end.dev) {
            return Err(Error::invalid(
                "Event::elapsed_ms",
                format!(
                    "the events were recorded on two devices ({} and {})",
                    self.dev.device(),
                    end.dev.device()
                ),
            ));
        }
        end.synchronize()?;
        self.dev.rt().event_elapsed_ms(self.raw(), end.raw())
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Some(ev) = self.ev.take() {
            self.dev.rt().event_destroy(ev);
        }
    }
}
