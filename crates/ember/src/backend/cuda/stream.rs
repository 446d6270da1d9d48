//! Streams for users (`torch.cuda.Stream`): queues of GPU work that run in order
//! on their own and side by side with each other, ordered by events.
//!
//! Each thread has a current stream per device, where ember queues the work of
//! every op: the device's default stream unless [`with_stream`] chose another.
//! Work on two streams may overlap; a stream that needs another's results waits
//! for them with [`Stream::wait_stream`] or [`Stream::wait_event`], without
//! the host waiting. A tensor made on one stream and used on another must be
//! kept from reuse until that use has finished: [`Tensor::record_stream`]
//! tells the caching allocator so (`Tensor.record_stream` in PyTorch).
//!
//! ```no_run
//! # use ember::prelude::*;
//! use ember::cuda::{self, Stream};
//! let dev = Device::Cuda(0);
//! let side = Stream::new(&dev)?;
//! let x = Tensor::randn([1024, 1024], &dev)?;
//! // the side stream starts after what the current stream queued so far
//! side.wait_stream(&cuda::current_stream(&dev)?)?;
//! let y = cuda::with_stream(&side, || x.matmul(&x))?;
//! x.record_stream(&side)?; // x is read there
//! // the current stream goes on only after the side stream's product
//! cuda::current_stream(&dev)?.wait_stream(&side)?;
//! println!("{}", y.sum_all()?);
//! # Ok::<(), ember::Error>(())
//! ```
//!
//! [`Tensor::record_stream`]: crate::Tensor::record_stream

use super::device::{current_stream as current_id, dev, with_current_stream, CudaDev};
use super::runtime::StreamId;
use super::stats::Event;
use crate::{
    device::Device,
    error::{Error, Result},
};
use std::sync::Arc;

/// A queue of work on one GPU (`torch.cuda.Stream`). Cloning gives another handle
/// of the same stream.
#[derive(Clone)]
pub struct Stream {
    pub(crate) dev: Arc<CudaDev>,
    pub(crate) id: StreamId,
}

fn cuda_dev(device: &Device, what: &str) -> Result<Arc<CudaDev>> {
    match device {
        Device::Cuda(i) => dev(*i),
        other => Err(Error::invalid(
            "cuda::Stream",
            format!("{what} needs a CUDA device (cuda:N), got {other}"),
        )),
    }
}

impl Stream {
    /// A stream of `device` other than its default. ember keeps a pool of 32 per
    /// device and hands them out in turn, as PyTorch does: the 33rd is the 1st
    /// again (still correct, less overlap).
    pub fn new(device: &Device) -> Result<Stream> {
        let d = cuda_dev(device, "a stream")?;
        let id = d.user_stream()?;
        Ok(Stream { dev: d, id })
    }

    /// The stream ember's background uploads use on `device` (crate-internal).
    pub(crate) fn copy_stream(device: &Device) -> Result<Stream> {
        let d = cuda_dev(device, "a copy stream")?;
        let id = d.copy_stream()?;
        Ok(Stream { dev: d, id })
    }

    /// The device the stream belongs to.
    pub fn device(&self) -> Device {
        self.dev.device()
    }

    /// Records an event here now (for timing and for other streams to wait for).
    pub fn record_event(&self) -> Result<Event> {
        Event::record_on(self)
    }

    /// Makes the work queued here from now on wait for `event`'s work; the host
    /// does not wait. An event of another GPU is refused (PyTorch allows it;
    /// ember has not run on two GPUs yet): [`Event::synchronize`] waits for it
    /// on the host instead.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        if event.device() != self.device() {
            return Err(Error::invalid(
                "Stream::wait_event",
                format!(
                    "the event was recorded on {} and the stream is on {}",
                    event.device(),
                    self.device()
                ),
            ));
        }
        self.dev.stream_wait(self.id, event.raw())
    }

    /// Makes the work queued here from now on wait for the work queued on `other`
    /// so far; the host does not wait. `other` on another GPU is refused, as
    /// in [`wait_event`](Self::wait_event).
    pub fn wait_stream(&self, other: &Stream) -> Result<()> {
        if other == self {
            return Ok(());
        }
        self.wait_event(&other.record_event()?)
    }

    /// Waits until the work queued here has finished (a host wait, counted by
    /// [`host_syncs`](super::host_syncs)); an error of that work as an error.
    pub fn synchronize(&self) -> Result<()> {
        self.dev.stream_synchronize(self.id)
    }

    /// `true` when the work queued here has finished, without waiting.
    /// Refused while a graph is captured on the device (CUDA forbids it).
    pub fn query(&self) -> Result<bool> {
        self.dev
            .refuse_in_capture("querying a stream", CudaDev::NOT_RUN_YET)?;
        self.dev.rt().stream_query(self.id)
    }
}

impl PartialEq for Stream {
    fn eq(&self, other: &Stream) -> bool {
        Arc::ptr_eq(&self.dev, &other.dev) && self.id == other.id
    }
}

impl Eq for Stream {}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Stream({}, {})", self.dev.device(), self.id.0)
    }
}

/// The calling thread's current stream of `device`, where ember queues its work
/// (`torch.cuda.current_stream`).
pub fn current_stream(device: &Device) -> Result<Stream> {
    let d = cuda_dev(device, "current_stream")?;
    let id = current_id(d.ordinal);
    Ok(Stream { dev: d, id })
}

/// `device`'s default stream: the current stream of every thread that has not
/// chosen another (`torch.cuda.default_stream`). It is a stream of ember's own,
/// not the driver's legacy NULL stream, so other streams overlap with it.
pub fn default_stream(device: &Device) -> Result<Stream> {
    let d = cuda_dev(device, "default_stream")?;
    Ok(Stream {
        dev: d,
        id: StreamId(0),
    })
}

/// Runs `f` with `stream` as the calling thread's current stream of its device
/// (`with torch.cuda.stream(s):`); the stream before is current again afterwards,
/// also when `f` panics. Other devices' current streams, and other threads', are
/// unchanged.
pub fn with_stream<R>(stream: &Stream, f: impl FnOnce() -> R) -> R {
    with_current_stream(stream.dev.ordinal, stream.id, f)
}
