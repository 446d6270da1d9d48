//! A simulated GPU's stream: work queued by the host runs later, in order, on a
//! thread of its own, as a GPU runs a stream's work while the host goes on.
//!
//! It runs as late as it may: a job runs only once something waits for it (the
//! host, through a synchronisation, a copy to pageable memory or an event; another
//! stream, through an event it waits for), or once the queue is full, as a
//! GPU's launch queue is. An event query that finds its work not yet run lets it
//! run, so a host polling an event sees it pass, later. So a host that reads a
//! result before waiting for it, reuses a pinned buffer before the copy that
//! reads it has run, or trusts an event that has not passed, and a stream that
//! uses another's results without waiting for its event, sees stale data in CI
//! every time, instead of the right values by luck of timing.
//!
//! An error of queued work (a kernel that stops at a deadlock or traps) is
//! returned by every wait after it, as a GPU's asynchronous errors are: they
//! surface at the next synchronisation and stay (the context is unusable), so a
//! wait whose result is ignored cannot hide one from the next.

use super::Job;
use crate::error::{Error, Result};
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// The most jobs a stream holds before a push waits (a GPU's launch queue holds
/// about a thousand).
const DEPTH: u64 = 1024;

/// The work queued on one simulated stream and the thread that runs it.
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
    /// Jobs up to this one may run (something waits for them).
    demand: u64,
    /// The first error of queued work: every wait returns it from then on.
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
                    if s.jobs.front().is_some_and(|(k, _)| *k <= s.demand) {
                        break s.jobs.pop_front().expect("a front job");
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

    /// Queues `job`; returns its number (for [`wait_for`](Self::wait_for)). With
    /// [`DEPTH`] jobs waiting, the oldest is let run first (and this call waits for
    /// room, as a launch into a GPU's full queue does).
    pub(crate) fn push(&self, job: Job) -> u64 {
        let mut s = self.lock();
        if s.queued - s.done >= DEPTH {
            let k = s.queued - DEPTH + 1;
            s.demand = s.demand.max(k);
            self.changed.notify_all();
            while s.done < k {
                s = self.changed.wait(s).unwrap_or_else(|p| p.into_inner());
            }
        }
        s.queued += 1;
        let k = s.queued;
        s.jobs.push_back((k, job));
        k
    }

    /// Lets job `k` and those before it run, without waiting for them.
    pub(crate) fn release(&self, k: u64) {
        let mut s = self.lock();
        if k > s.demand {
            s.demand = k;
            self.changed.notify_all();
        }
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
    /// the first error of queued work, if there was one.
    pub(crate) fn wait_for(&self, k: u64) -> Result<()> {
        self.release(k);
        let mut s = self.lock();
        while s.done < k {
            s = self.changed.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        Queue::sticky(&s)
    }

    /// The error of earlier work, if any, without waiting.
    pub(crate) fn check(&self) -> Result<()> {
        Queue::sticky(&self.lock())
    }

    fn sticky(s: &State) -> Result<()> {
        match &s.error {
            Some(msg) => Err(Error::Cuda {
                op: "simulated work queued before this call (the device is unusable from \
                     then on, as after a GPU's asynchronous error)",
                msg: msg.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Waits for everything queued so far.
    pub(crate) fn wait_all(&self) -> Result<()> {
        let k = self.last();
        self.wait_for(k)
    }

    /// Waits for everything queued so far, without reporting an error (the next
    /// wait does).
    pub(crate) fn drain(&self) {
        let k = self.last();
        self.release(k);
        let mut s = self.lock();
        while s.done < k {
            s = self.changed.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_runs_in_order_and_its_errors_reach_the_next_wait() {
        let q = Queue::start("ember-sim-test".into()).unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        // a job that waits for the host, so the first wait below finds work queued
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let g = gate.clone();
        let first = q.push(Box::new(move || {
            let (open, cv) = &*g;
            let mut o = open.lock().unwrap();
            while !*o {
                o = cv.wait(o).unwrap();
            }
            Ok(())
        }));
        for i in 0..100 {
            let l = log.clone();
            q.push(Box::new(move || {
                l.lock().unwrap().push(i);
                Ok(())
            }));
        }
        assert!(!q.is_done(first), "queued work ran before the host let it");
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
        q.push(Box::new(|| Err(Error::invalid("k", "the first error"))));
        q.push(Box::new(|| Err(Error::invalid("k", "a later error"))));
        // drain waits without reporting
        q.drain();
        assert_eq!(*log.lock().unwrap(), (0..100).collect::<Vec<_>>());
        let e = q.wait_all().unwrap_err().to_string();
        assert!(e.contains("the first error"), "{e}");
        // the error stays, for every later wait and check
        let k = q.push(Box::new(|| Ok(())));
        assert!(q
            .wait_for(k)
            .unwrap_err()
            .to_string()
            .contains("the first error"));
        assert!(q.is_done(k) && q.check().is_err());
    }

    #[test]
    fn work_runs_only_once_something_waits_for_it_or_the_queue_is_full() {
        let q = Queue::start("ember-sim-test".into()).unwrap();
        let ran = Arc::new(Mutex::new(Vec::new()));
        let job = |i: u64| -> Job {
            let r = ran.clone();
            Box::new(move || {
                r.lock().unwrap().push(i);
                Ok(())
            })
        };
        let a = q.push(job(1));
        let b = q.push(job(2));
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(ran.lock().unwrap().is_empty(), "ran before anything waited");
        // a query lets the work run, later
        assert!(!q.is_done(a));
        q.release(a);
        q.wait_for(a).unwrap();
        assert_eq!(*ran.lock().unwrap(), vec![1]);
        assert!(!q.is_done(b));
        q.wait_all().unwrap();
        assert_eq!(*ran.lock().unwrap(), vec![1, 2]);
        // a full queue lets its oldest work run
        for i in 0..DEPTH + 10 {
            q.push(job(100 + i));
        }
        assert!(ran.lock().unwrap().len() >= 12);
        q.drain();
        assert_eq!(ran.lock().unwrap().len() as u64, 2 + DEPTH + 10);
    }

    #[test]
    fn a_panic_in_queued_work_is_an_error_and_the_stream_goes_on() {
        let q = Queue::start("ember-sim-test".into()).unwrap();
        q.push(Box::new(|| panic!("a kernel's bug")));
        let ran = Arc::new(Mutex::new(false));
        let r = ran.clone();
        let k = q.push(Box::new(move || {
            *r.lock().unwrap() = true;
            Ok(())
        }));
        let e = q.wait_for(k).unwrap_err().to_string();
        assert!(e.contains("a kernel's bug"), "{e}");
        assert!(*ran.lock().unwrap());
    }
}
