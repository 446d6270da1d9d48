//! The Chrome trace-event format (the JSON object form, complete "X" events):
//! process 0 holds a track per host thread; each device with timed work gets a
//! process of its own ("cuda:0", "cpu"), with a track per host thread that queued
//! the work. Ranges nest by time on each track, as the format nests them.

use super::{EventKind, Profile};
use crate::device::Device;
use std::fmt::Write;

/// The JSON string literal of `s`.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A process id per device (the host is 0).
fn device_pid(d: Device) -> u64 {
    match d {
        Device::Cpu => 1,
        Device::Meta => 2,
        Device::Cuda(i) => 100 + i as u64,
    }
}

fn category(k: EventKind) -> &'static str {
    match k {
        EventKind::Op => "op",
        EventKind::Function => "function",
        EventKind::Backward => "backward",
        EventKind::Module => "module",
        EventKind::User => "user_annotation",
    }
}

pub(super) fn chrome_trace(p: &Profile) -> String {
    let mut ev: Vec<String> = Vec::new();
    ev.push(r#"{"name":"process_name","ph":"M","pid":0,"args":{"name":"host"}}"#.into());
    for (t, name) in p.threads() {
        ev.push(format!(
            r#"{{"name":"thread_name","ph":"M","pid":0,"tid":{t},"args":{{"name":{}}}}}"#,
            quote(&format!("{name} ({t})"))
        ));
    }
    // which device each record's device work ran on: an op's own device, a
    // range's the one device all its ops used (else none: the host track only)
    let events = p.events();
    let mut devices: Vec<Option<Option<Device>>> = vec![None; events.len()];
    for i in (0..events.len()).rev() {
        let mine = match events[i].device {
            Some(d) => Some(Some(d)),
            None => devices[i],
        };
        devices[i] = mine;
        if let (Some(par), Some(m)) = (events[i].parent, mine) {
            devices[par] = match devices[par] {
                None => Some(m),
                Some(x) if x == m => Some(x),
                Some(_) => Some(None),
            };
        }
    }
    let mut named = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let label = match e.kind {
            EventKind::Backward => format!("{} backward", e.name),
            _ => e.name.clone(),
        };
        let mut args = String::new();
        if let Some(d) = e.device {
            let _ = write!(args, r#""device":{}"#, quote(&d.to_string()));
        }
        if let Some(t) = e.dtype {
            let _ = write!(args, r#","dtype":{}"#, quote(&t.to_string()));
        }
        if !e.shapes.is_empty() {
            let _ = write!(
                args,
                r#","input shapes":{}"#,
                quote(&format!("{:?}", e.shapes))
            );
        }
        if !e.module.is_empty() {
            let _ = write!(args, r#","module":{}"#, quote(&e.module));
        }
        if !e.kernels.is_empty() {
            let k: Vec<String> = e.kernels.iter().map(|k| quote(k)).collect();
            let _ = write!(args, r#","kernels":[{}]"#, k.join(","));
        }
        if e.alloc_bytes > 0 || e.freed_bytes > 0 {
            let _ = write!(
                args,
                r#","bytes allocated":{},"bytes freed":{}"#,
                e.alloc_bytes, e.freed_bytes
            );
        }
        let _ = write!(
            args,
            r#","device time (us)":{:.3},"self device time (us)":{:.3}"#,
            e.device_total_us, e.self_device_us
        );
        let args = args.trim_start_matches(',');
        ev.push(format!(
            r#"{{"name":{},"cat":{},"ph":"X","ts":{:.3},"dur":{:.3},"pid":0,"tid":{},"args":{{{args}}}}}"#,
            quote(&label),
            quote(category(e.kind)),
            e.host_start_us,
            e.host_end_us - e.host_start_us,
            e.thread
        ));
        if let (Some((a, b)), Some(Some(d))) = (e.device_span_us, devices[i]) {
            if !named.contains(&d) {
                named.push(d);
            }
            ev.push(format!(
                r#"{{"name":{},"cat":"device","ph":"X","ts":{a:.3},"dur":{:.3},"pid":{},"tid":{},"args":{{}}}}"#,
                quote(&label),
                b - a,
                device_pid(d),
                e.thread
            ));
        }
    }
    for d in named {
        ev.push(format!(
            r#"{{"name":"process_name","ph":"M","pid":{},"args":{{"name":{}}}}}"#,
            device_pid(d),
            quote(&d.to_string())
        ));
    }
    let mut out = String::from("{\"traceEvents\":[\n");
    out.push_str(&ev.join(",\n"));
    out.push_str("\n],\"displayTimeUnit\":\"ms\"}\n");
    out
}
