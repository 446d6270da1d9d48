//! The GPU side of the profiler's records: two timing events on the op's stream
//! around its work, and one origin event per device and session that places the
//! device's clock on the host's timeline. Nothing waits for them until the
//! session has ended and its report is made.

use super::device::CudaDev;
use super::runtime::{RtEvent, StreamId};
use crate::backend::profile::{self, DeviceSpan};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// A device's first event of a session and the host instant it was recorded at.
struct Origin {
    dev: Arc<CudaDev>,
    event: Option<RtEvent>,
    host: Instant,
}

impl Drop for Origin {
    fn drop(&mut self) {
        if let Some(e) = self.event.take() {
            self.dev.rt().event_destroy(e);
        }
    }
}

/// The origins of the current session: (session, ordinal, origin).
static ORIGINS: Mutex<Vec<(u64, usize, Arc<Origin>)>> = Mutex::new(Vec::new());

/// This session's origin of `dev`, recorded on `stream` at the first call.
fn origin(dev: &Arc<CudaDev>, stream: StreamId) -> Option<Arc<Origin>> {
    let session = profile::session();
    let mut all = ORIGINS.lock().unwrap_or_else(|p| p.into_inner());
    all.retain(|(s, _, _)| *s == session);
    if let Some((_, _, o)) = all.iter().find(|(_, i, _)| *i == dev.ordinal) {
        return Some(o.clone());
    }
    let rt = dev.rt();
    let mut e = rt.event_create(true).ok()?;
    let host = Instant::now();
    if rt.event_record(&mut e, stream).is_err() {
        rt.event_destroy(e);
        return None;
    }
    let o = Arc::new(Origin {
        dev: dev.clone(),
        event: Some(e),
        host,
    });
    all.push((session, dev.ordinal, o.clone()));
    Some(o)
}

/// One op's events.
struct CudaSpan {
    origin: Arc<Origin>,
    stream: StreamId,
    start: Option<RtEvent>,
    end: Option<RtEvent>,
}

/// Timing events around the work the calling thread is about to queue on `dev`;
/// `None` while it captures a CUDA graph (a capture holds no timing events) or
/// when the runtime refuses an event.
pub(crate) fn span(dev: &Arc<CudaDev>) -> Option<Box<dyn DeviceSpan>> {
    if dev.is_capturing() {
        return None;
    }
    let stream = dev.stream();
    let origin = origin(dev, stream)?;
    let rt = dev.rt();
    let mut e = rt.event_create(true).ok()?;
    if rt.event_record(&mut e, stream).is_err() {
        rt.event_destroy(e);
        return None;
    }
    Some(Box::new(CudaSpan {
        origin,
        stream,
        start: Some(e),
        end: None,
    }))
}

impl DeviceSpan for CudaSpan {
    fn end(&mut self) {
        let rt = self.origin.dev.rt();
        let Ok(mut e) = rt.event_create(true) else {
            return;
        };
        if rt.event_record(&mut e, self.stream).is_err() {
            rt.event_destroy(e);
            return;
        }
        self.end = Some(e);
    }

    fn times(&self) -> Option<(Instant, f64, f64)> {
        let rt = self.origin.dev.rt();
        let (o, s, e) = (
            self.origin.event.as_ref()?,
            self.start.as_ref()?,
            self.end.as_ref()?,
        );
        rt.event_synchronize(e).ok()?;
        let from_origin = rt.event_elapsed_ms(o, s).ok()? as f64 * 1e3;
        let length = rt.event_elapsed_ms(s, e).ok()? as f64 * 1e3;
        Some((self.origin.host, from_origin, from_origin + length.max(0.0)))
    }
}

impl Drop for CudaSpan {
    fn drop(&mut self) {
        let rt = self.origin.dev.rt();
        for e in [self.start.take(), self.end.take()].into_iter().flatten() {
            rt.event_destroy(e);
        }
    }
}
