//! A finished profile: its events with their times resolved, and the per-op
//! table.

use super::EventKind;
use crate::backend::alloc::fmt_bytes;
use crate::backend::profile::ThreadLog;
use crate::{device::Device, dtype::DType};
use std::collections::HashMap;
use std::fmt::Write;
use std::time::Instant;

/// One record of a [`Profile`]. Times are microseconds after the profile started.
#[derive(Clone, Debug)]
pub struct Event {
    /// The op's name (`mm`, `conv2d`, `add_`), the range's (`layer_norm`,
    /// `backward`, a user's), a backward rule's forward op (`conv2d` of kind
    /// [`EventKind::Backward`]), or a module's dotted path.
    pub name: String,
    pub kind: EventKind,
    /// The thread that recorded it (a number of the profiler's).
    pub thread: u64,
    /// The index in [`Profile::events`] of the enclosing record on the same thread.
    pub parent: Option<usize>,
    /// The device of an op; `None` for a range.
    pub device: Option<Device>,
    /// The dtype of an op's first operand.
    pub dtype: Option<DType>,
    /// The shapes of an op's operands (a product's `[m, k]` and `[k, n]`).
    pub shapes: Vec<Vec<usize>>,
    /// The module it ran in (`layer1.0.conv1`; `""` outside every module); for a
    /// backward rule, the module its forward op ran in.
    pub module: String,
    pub host_start_us: f64,
    pub host_end_us: f64,
    /// Its device work, on the host's timeline: a GPU op's own events; a range's,
    /// from the first to the last of the device work inside it. On the CPU, its
    /// host time. `None` for `meta` and for what had no device work.
    pub device_span_us: Option<(f64, f64)>,
    /// The device time it took itself and inside it (see [`Profile::events`]).
    pub device_total_us: f64,
    /// Its device time less that of the records inside it.
    pub self_device_us: f64,
    pub host_total_us: f64,
    pub self_host_us: f64,
    /// The kernels and library calls it queued itself, in order.
    pub kernels: Vec<String>,
    /// Bytes allocated and freed on its thread while it was the innermost record.
    pub alloc_bytes: u64,
    pub freed_bytes: u64,
}

/// What a profiling session recorded.
#[derive(Clone, Debug)]
pub struct Profile {
    events: Vec<Event>,
    wall_us: f64,
    threads: Vec<(u64, String)>,
    loose_alloc: u64,
    loose_freed: u64,
}

impl Profile {
    pub(super) fn from_logs(start: Instant, stop: Instant, logs: Vec<ThreadLog>) -> Profile {
        let us = |t: Instant| {
            if t >= start {
                t.duration_since(start).as_secs_f64() * 1e6
            } else {
                -(start.duration_since(t).as_secs_f64() * 1e6)
            }
        };
        let mut events = Vec::new();
        let mut threads = Vec::new();
        let (mut loose_alloc, mut loose_freed) = (0, 0);
        for log in logs {
            threads.push((log.thread, log.thread_name.clone()));
            loose_alloc += log.loose_alloc;
            loose_freed += log.loose_freed;
            let base = events.len();
            for raw in log.events {
                let host_start_us = us(raw.start);
                let host_end_us = us(raw.end.unwrap_or(stop)).max(host_start_us);
                let own = match (&raw.span, raw.device) {
                    (Some(span), _) => span.times().map(|(origin, a, b)| {
                        let o = us(origin);
                        (o + a, o + b)
                    }),
                    (None, Some(Device::Cpu)) => Some((host_start_us, host_end_us)),
                    _ => None,
                };
                events.push(Event {
                    name: raw.name.text(),
                    kind: raw.kind,
                    thread: log.thread,
                    parent: raw.parent.map(|p| p + base),
                    device: raw.device,
                    dtype: raw.dtype,
                    shapes: raw.shapes,
                    module: raw.module.map(|m| m.to_string()).unwrap_or_default(),
                    host_start_us,
                    host_end_us,
                    device_span_us: own,
                    device_total_us: own.map_or(0.0, |(a, b)| b - a),
                    self_device_us: 0.0,
                    host_total_us: host_end_us - host_start_us,
                    self_host_us: 0.0,
                    kernels: raw.kernels.iter().map(|k| k.text()).collect(),
                    alloc_bytes: raw.alloc_bytes,
                    freed_bytes: raw.freed_bytes,
                });
            }
        }
        resolve(&mut events);
        Profile {
            events,
            wall_us: us(stop),
            threads,
            loose_alloc,
            loose_freed,
        }
    }

    /// Every record, parents before the records inside them (per thread, in the
    /// order they started). A record's device total is its own measured device
    /// time where it has one (a GPU op's events, a CPU op's host time), else the
    /// sum of the device totals inside it; self times are totals less the
    /// children's, so the self times of all records add up to the totals of the
    /// outermost ones.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// The threads that recorded something: (the profiler's number, the
    /// thread's name).
    pub fn threads(&self) -> &[(u64, String)] {
        &self.threads
    }

    /// The part of this profile that the threads `keep` accepts recorded (`keep`
    /// sees the profiler's number of a thread and the thread's name): a training
    /// loop's thread without the data loader's, say.
    pub fn filter_threads(&self, keep: impl Fn(u64, &str) -> bool) -> Profile {
        let threads: Vec<(u64, String)> = self
            .threads
            .iter()
            .filter(|(t, n)| keep(*t, n))
            .cloned()
            .collect();
        let kept = |t: u64| threads.iter().any(|(x, _)| *x == t);
        let mut index = vec![None; self.events.len()];
        let mut events = Vec::new();
        for (i, e) in self.events.iter().enumerate() {
            if kept(e.thread) {
                index[i] = Some(events.len());
                let mut e = e.clone();
                e.parent = e.parent.and_then(|p| index[p]);
                events.push(e);
            }
        }
        Profile {
            events,
            wall_us: self.wall_us,
            threads,
            loose_alloc: self.loose_alloc,
            loose_freed: self.loose_freed,
        }
    }

    /// Microseconds from start to stop.
    pub fn wall_us(&self) -> f64 {
        self.wall_us
    }

    /// Bytes allocated and freed outside every record (between ops: a tensor the
    /// program dropped).
    pub fn untracked_bytes(&self) -> (u64, u64) {
        (self.loose_alloc, self.loose_freed)
    }

    /// The per-op table: one row per name and kind (modules left out: see
    /// [`module_averages`](Self::module_averages)).
    /// The records inside the ranges named `range` (and those ranges): the
    /// profile of a loop's steps alone (`within("train_step")`), without what
    /// ran between them (an evaluation, a checkpoint). Parents are re-indexed,
    /// memory that no kept record counted is left out, and the wall time is
    /// the whole session's.
    pub fn within(&self, range: &str) -> Profile {
        let inside = |mut i: usize| loop {
            let e = &self.events[i];
            if e.name == range && e.kind != EventKind::Op {
                return true;
            }
            match e.parent {
                Some(p) if p != i => i = p,
                _ => return false,
            }
        };
        let kept: Vec<usize> = (0..self.events.len()).filter(|&i| inside(i)).collect();
        let mut new_index = vec![None; self.events.len()];
        for (k, &i) in kept.iter().enumerate() {
            new_index[i] = Some(k);
        }
        let events = kept
            .iter()
            .map(|&i| {
                let mut e = self.events[i].clone();
                e.parent = e.parent.and_then(|p| new_index[p]);
                e
            })
            .collect();
        Profile {
            events,
            wall_us: self.wall_us,
            threads: self.threads.clone(),
            loose_alloc: 0,
            loose_freed: 0,
        }
    }

    pub fn key_averages(&self) -> KeyAverages {
        self.averages(|e| e.kind != EventKind::Module, false)
    }

    /// [`key_averages`](Self::key_averages) with a row per name, kind and input
    /// shapes (PyTorch's `group_by_input_shape=True`).
    pub fn key_averages_by_shape(&self) -> KeyAverages {
        self.averages(|e| e.kind != EventKind::Module, true)
    }

    /// One row per module path: where the model's time goes, layer by layer.
    pub fn module_averages(&self) -> KeyAverages {
        self.averages(|e| e.kind == EventKind::Module, false)
    }

    fn averages(&self, keep: impl Fn(&Event) -> bool, by_shape: bool) -> KeyAverages {
        let mut rows: Vec<OpStats> = Vec::new();
        // a row's key: name, kind and (when grouped by them) the input shapes
        type Key = (String, EventKind, Option<Vec<Vec<usize>>>);
        let mut at: HashMap<Key, usize> = HashMap::new();
        for e in self.events.iter().filter(|e| keep(e)) {
            let shapes = by_shape.then(|| e.shapes.clone());
            let key = (e.name.clone(), e.kind, shapes.clone());
            let i = *at.entry(key).or_insert_with(|| {
                rows.push(OpStats {
                    name: e.name.clone(),
                    kind: e.kind,
                    shapes,
                    ..OpStats::default()
                });
                rows.len() - 1
            });
            let r = &mut rows[i];
            r.count += 1;
            r.self_device_us += e.self_device_us;
            r.device_total_us += e.device_total_us;
            r.self_host_us += e.self_host_us;
            r.host_total_us += e.host_total_us;
            r.kernels += e.kernels.len();
            r.alloc_bytes += e.alloc_bytes;
            r.freed_bytes += e.freed_bytes;
        }
        // (folded from +0: an empty sum of f64 is -0, printed "-0.000us")
        let total = |f: fn(&Event) -> f64| self.events.iter().map(f).fold(0.0, |a, b| a + b);
        let self_device_total = total(|e| e.self_device_us);
        let self_host_total = total(|e| e.self_host_us);
        KeyAverages {
            rows,
            self_device_total_us: self_device_total,
            self_host_total_us: self_host_total,
            wall_us: self.wall_us,
        }
    }

    /// Writes a Chrome trace-event JSON file (see the module's docs); atomic, as
    /// every file ember writes.
    pub fn export_chrome_trace(
        &self,
        path: impl AsRef<std::path::Path>,
    ) -> crate::error::Result<()> {
        let text = super::trace::chrome_trace(self);
        crate::files::write_atomic(path.as_ref(), text.as_bytes())
    }

    /// The Chrome trace-event JSON of [`export_chrome_trace`](Self::export_chrome_trace)
    /// as a string.
    pub fn chrome_trace(&self) -> String {
        super::trace::chrome_trace(self)
    }
}

/// Fills in module paths, range device spans and totals, and self times.
fn resolve(events: &mut [Event]) {
    let n = events.len();
    // module paths: a record's is its nearest enclosing module's (parents come
    // first, so each parent is resolved before its children)
    for i in 0..n {
        if events[i].kind == EventKind::Module {
            events[i].module = events[i].name.clone();
        } else if events[i].kind != EventKind::Backward || events[i].module.is_empty() {
            if let Some(p) = events[i].parent {
                let m = events[p].module.clone();
                events[i].module = m;
            }
        }
    }
    // children before parents: totals and spans flow up
    let mut child_device = vec![0.0f64; n];
    let mut child_host = vec![0.0f64; n];
    let mut child_span: Vec<Option<(f64, f64)>> = vec![None; n];
    for i in (0..n).rev() {
        let e = &mut events[i];
        let measured = e.device_span_us.is_some();
        if !measured {
            e.device_total_us = child_device[i];
            e.device_span_us = child_span[i];
        }
        e.self_device_us = (e.device_total_us - child_device[i]).max(0.0);
        e.self_host_us = (e.host_total_us - child_host[i]).max(0.0);
        if let Some(p) = e.parent {
            let (d, h, s) = (e.device_total_us, e.host_total_us, e.device_span_us);
            child_device[p] += d;
            child_host[p] += h;
            child_span[p] = match (child_span[p], s) {
                (Some((a, b)), Some((c, d))) => Some((a.min(c), b.max(d))),
                (x, None) | (None, x) => x,
            };
        }
    }
}

/// One row of [`KeyAverages`]: every record of one name and kind (and shapes).
#[derive(Clone, Debug, Default)]
pub struct OpStats {
    pub name: String,
    pub kind: EventKind,
    /// The input shapes, in a table grouped by shape.
    pub shapes: Option<Vec<Vec<usize>>>,
    pub count: usize,
    pub self_device_us: f64,
    pub device_total_us: f64,
    pub self_host_us: f64,
    pub host_total_us: f64,
    /// Kernels and library calls queued by these records themselves.
    pub kernels: usize,
    pub alloc_bytes: u64,
    pub freed_bytes: u64,
}

impl OpStats {
    /// The name as the table shows it: a backward rule as `conv2d backward`.
    pub fn label(&self) -> String {
        match self.kind {
            EventKind::Backward => format!("{} backward", self.name),
            _ => self.name.clone(),
        }
    }
}

/// How [`KeyAverages::table`] orders its rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortBy {
    SelfDevice,
    DeviceTotal,
    SelfHost,
    HostTotal,
    Count,
    /// Bytes allocated less bytes freed, by the records themselves.
    SelfMemory,
}

/// The per-op table of a profile.
#[derive(Clone, Debug)]
pub struct KeyAverages {
    rows: Vec<OpStats>,
    self_device_total_us: f64,
    self_host_total_us: f64,
    wall_us: f64,
}

impl KeyAverages {
    /// The rows, in the order their first record started.
    pub fn rows(&self) -> &[OpStats] {
        &self.rows
    }

    /// The row of ops named `name` (the first kind found, ops before ranges).
    pub fn get(&self, name: &str) -> Option<&OpStats> {
        self.rows
            .iter()
            .filter(|r| r.name == name)
            .min_by_key(|r| r.kind)
    }

    /// The row of `name` of one kind (`("conv2d", EventKind::Backward)`).
    pub fn get_kind(&self, name: &str, kind: EventKind) -> Option<&OpStats> {
        self.rows.iter().find(|r| r.name == name && r.kind == kind)
    }

    /// The self device time of every record of the profile (the table's 100%).
    pub fn self_device_total_us(&self) -> f64 {
        self.self_device_total_us
    }

    /// The self host time of every record of the profile.
    pub fn self_host_total_us(&self) -> f64 {
        self.self_host_total_us
    }

    /// The rows sorted by `sort` (largest first).
    pub fn sorted(&self, sort: SortBy) -> Vec<&OpStats> {
        let key = |r: &OpStats| match sort {
            SortBy::SelfDevice => r.self_device_us,
            SortBy::DeviceTotal => r.device_total_us,
            SortBy::SelfHost => r.self_host_us,
            SortBy::HostTotal => r.host_total_us,
            SortBy::Count => r.count as f64,
            SortBy::SelfMemory => r.alloc_bytes as f64 - r.freed_bytes as f64,
        };
        let mut v: Vec<&OpStats> = self.rows.iter().collect();
        v.sort_by(|a, b| key(b).total_cmp(&key(a)));
        v
    }

    /// The table PyTorch's `key_averages().table(...)` prints: the first `limit`
    /// rows by `sort`, with the totals below.
    pub fn table(&self, sort: SortBy, limit: usize) -> String {
        let rows = self.sorted(sort);
        let shapes = rows.iter().any(|r| r.shapes.is_some());
        let name_w = rows
            .iter()
            .take(limit)
            .map(|r| r.label().chars().count())
            .max()
            .unwrap_or(4)
            .clamp(4, 44);
        let mut out = String::new();
        let _ = write!(out, "{:<name_w$}", "Name");
        let _ = writeln!(
            out,
            "  {:>11} {:>7} {:>12} {:>11} {:>11} {:>11} {:>7} {:>8} {:>10}{}",
            "Self device",
            "Self %",
            "Device total",
            "Device avg",
            "Self host",
            "Host total",
            "Calls",
            "Kernels",
            "Self mem",
            if shapes { "  Input shapes" } else { "" }
        );
        let rule =
            "-".repeat(name_w + 2 + 11 + 1 + 7 + 1 + 12 + 1 + 11 * 3 + 3 + 7 + 1 + 8 + 1 + 10);
        let _ = writeln!(out, "{rule}");
        let pct = |x: f64| {
            if self.self_device_total_us > 0.0 {
                format!("{:.1}%", 100.0 * x / self.self_device_total_us)
            } else {
                "-".into()
            }
        };
        for r in rows.iter().take(limit) {
            let mut label = r.label();
            if label.chars().count() > name_w {
                label = label.chars().take(name_w - 3).collect::<String>() + "...";
            }
            let mem = r.alloc_bytes as i64 - r.freed_bytes as i64;
            let _ = writeln!(
                out,
                "{label:<name_w$}  {:>11} {:>7} {:>12} {:>11} {:>11} {:>11} {:>7} {:>8} {:>10}{}",
                fmt_us(r.self_device_us),
                pct(r.self_device_us),
                fmt_us(r.device_total_us),
                fmt_us(r.device_total_us / r.count.max(1) as f64),
                fmt_us(r.self_host_us),
                fmt_us(r.host_total_us),
                r.count,
                r.kernels,
                fmt_mem(mem),
                r.shapes
                    .as_ref()
                    .map(|s| format!("  {s:?}"))
                    .unwrap_or_default()
            );
        }
        let _ = writeln!(out, "{rule}");
        let _ = writeln!(
            out,
            "Self device time total: {}; self host time total: {}; profiled for {}",
            fmt_us(self.self_device_total_us),
            fmt_us(self.self_host_total_us),
            fmt_us(self.wall_us)
        );
        out
    }
}

fn fmt_us(us: f64) -> String {
    if us >= 1e6 {
        format!("{:.3}s", us / 1e6)
    } else if us >= 1e3 {
        format!("{:.3}ms", us / 1e3)
    } else {
        format!("{us:.3}us")
    }
}

fn fmt_mem(bytes: i64) -> String {
    let sign = if bytes < 0 { "-" } else { "" };
    format!("{sign}{}", fmt_bytes(bytes.unsigned_abs() as usize))
}
