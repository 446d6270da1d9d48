//! A simulated GPU's stream: work queued by the host runs later, in order, on a
//! thread of its own, as a GPU runs a stream's work while the host goes on. So a
//! host that reads a result before waiting for it, reuses a pinned buffer before
//! the copy that reads it has run, or trusts an event that has not passed, sees
//! stale data in CI, as it would on a GPU, instead of the right values by luck.
//!
//! An error of queued work (a kernel that stops at a deadlock, an access the
//! memory checker refuses) is kept and returned by the next wait, as a GPU's
//! asynchronous errors surface at the next synchronisation.

use super::Job;
use crate::{Error, Result};
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// The work queued on one simulated GPU and the thread that runs it.
pub(crate) struct Queue {
    state: Mutex<State>,
    /// Signalled when work is queued (for the thread) and when work finishes (for
    /// waiting hosts).
    changed: Condvar,
}

#[derive(Default)]
struct State {
    jobs: VecDeque<(u64, Job)>,
    /// The number of jobs queued so far; job `k` (from 1) is the k-th.
    queued: u64,
    /// Every job up to this one has finished.
    done: u64,
    /// The first error of queued work not yet returned by a wait.
    error: Option<String>,
}

impl Queue {
    /// A queue and the thread that runs its work (named `name`).
    pub(crate) fn start(name: String) -> Result<Arc<Queue>> {
        let q = Arc::new(Queue {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        });
        let worker = q.clone();
        std::thread::Builder::new()
            .name(name)
            .spawn(move || worker.run())
            .map_err(|e| Error::Cuda {
                op: "simulator: starting a stream",
                msg: e.to_string(),
            })?;
        Ok(q)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs the queued jobs, in order, for the rest of the process.
    fn run(&self) {
        loop {
            let (k, job) = {
                let mut s = self.lock();
                loop {
                    if let Some(j) = s.jobs.pop_front() {
                        break j;
                    }
                    s = self.changed.wait(s).unwrap_or_else(|p| p.into_inner());
                }
            };
            // a panic in queued work is that work's error, not the stream's end
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
            let mut s = self.lock();
            let err = match r {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e.to_string()),
                Err(p) => Some(format!(
                    "panicked: {}",
                    p.downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| p.downcast_ref::<String>().cloned())
                        .unwrap_or_default()
                )),
            };
            if let Some(e) = err {
                s.error.get_or_insert(e);
            }
            s.done = k;
            self.changed.notify_all();
        }
    }

    /// Queues `job`; returns its number (for [`wait_for`](Self::wait_for)).
    pub(crate) fn push(&self, job: Job) -> u64 {
        let mut s = self.lock();
        s.queued += 1;
        let k = s.queued;
        s.jobs.push_back((k, job));
        self.changed.notify_all();
        k
    }

    /// The number of the last job queued (0 before any).
    pub(crate) fn last(&self) -> u64 {
        self.lock().queued
    }

    /// `true` once job `k` (and every job before it) has finished.
    pub(crate) fn is_done(&self, k: u64) -> bool {
        self.lock().done >= k
    }

    /// Waits until job `k` and every job before it have finished; then returns
    /// the first error of queued work since the last wait, if any.
    pub(crate) fn wait_for(&self, k: u64) -> Result<()> {
        let mut s = self.lock();
        while s.done < k {
            s = self.changed.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        match s.error.take() {
            Some(msg) => Err(Error::Cuda {
                op: "simulated work queued before this wait",
                msg,
            }),
            None => Ok(()),
        }
    }

    /// Waits for everything queued so far.
    pub(crate) fn wait_all(&self) -> Result<()> {
        let k = self.last();
        self.wait_for(k)
    }

    /// Waits for everything queued so far, leaving an error of that work for the
    /// next [`wait_for`](Self::wait_for).
    pub(crate) fn drain(&self) {
        let mut s = self.lock();
        let k = s.queued;
        while s.done < k {
            s = self.changed.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }
}
