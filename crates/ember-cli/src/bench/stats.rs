//! Timing statistics and the report: medians and quartiles of per-call times,
//! throughput, and the table and JSON rows `ember bench` prints.

use ember::cuda;
use ember::prelude::*;
use std::time::{Duration, Instant};

/// Timing statistics of one workload, in seconds per call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stats {
    pub median: f64,
    pub p25: f64,
    pub p75: f64,
    pub samples: usize,
    /// Calls per sample.
    pub inner: usize,
    /// On a GPU, the median host time per call of the same samples: how long
    /// the calls took to queue their work, without waiting for it at the end.
    /// Well below `median`, the row is bound by the GPU; near it, probably by
    /// the host (but a call that reads a value back, or fills the driver's
    /// launch queue, waits inside too). `None` on the CPU, where both are one
    /// time.
    pub host: Option<f64>,
}

/// The `q`-quantile (0..=1) of sorted values, linearly interpolated.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    assert!(!sorted.is_empty(), "quantile of nothing");
    let pos = q.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// Median and quartiles of per-call times.
pub fn stats(mut per_call: Vec<f64>, inner: usize) -> Stats {
    per_call.sort_by(f64::total_cmp);
    Stats {
        median: quantile(&per_call, 0.5),
        p25: quantile(&per_call, 0.25),
        p75: quantile(&per_call, 0.75),
        samples: per_call.len(),
        inner,
        host: None,
    }
}

/// Times `f` on `dev`: one warm-up call, then samples of `inner` calls each
/// (enough for ~2 ms per sample) until `budget` is spent (at least 5 samples, at
/// most 200). GPU samples are measured with device events around the calls, so
/// they count the GPU's work, not just the launches; the host's time to queue
/// them is kept beside (`Stats::host`).
pub fn measure(dev: &Device, budget: Duration, mut f: impl FnMut() -> Result<()>) -> Result<Stats> {
    f()?;
    cuda::synchronize(dev)?;
    let t0 = Instant::now();
    f()?;
    cuda::synchronize(dev)?;
    let one = t0.elapsed().as_secs_f64().max(1e-9);
    let inner = ((2e-3 / one).ceil() as usize).clamp(1, 100_000);
    let per_sample = one * inner as f64;
    let samples = ((budget.as_secs_f64() / per_sample) as usize).clamp(5, 200);
    let mut times = Vec::with_capacity(samples);
    let mut host = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t = if dev.is_cuda() {
            let start = cuda::Event::record(dev)?;
            let queued = Instant::now();
            for _ in 0..inner {
                f()?;
            }
            host.push(queued.elapsed().as_secs_f64() / inner as f64);
            let end = cuda::Event::record(dev)?;
            start.elapsed_ms(&end)? as f64 * 1e-3
        } else {
            let t = Instant::now();
            for _ in 0..inner {
                f()?;
            }
            t.elapsed().as_secs_f64()
        };
        times.push(t / inner as f64);
    }
    let host = (!host.is_empty()).then(|| stats(host, inner).median);
    Ok(Stats {
        host,
        ..stats(times, inner)
    })
}

/// What a row's throughput counts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Work {
    /// Floating-point operations per call.
    Flops(f64),
    /// Bytes read plus written per call.
    Bytes(f64),
    /// Training samples per call, and the floating-point operations of the call
    /// when known (for the share of the GEMM rate).
    Samples { n: f64, flops: Option<f64> },
    /// Nothing (per-call overhead).
    None,
}

/// One measured workload on one device.
#[derive(Clone, Debug)]
pub struct Row {
    pub device: Device,
    pub name: String,
    pub stats: Stats,
    pub work: Work,
    /// Share of the device's ceiling (copy bandwidth or GEMM rate), when known.
    pub share: Option<f64>,
    /// How many times faster than the CPU on the same row, when both ran.
    pub speedup: Option<f64>,
    /// The largest difference from the CPU's result, when checked.
    pub max_err: Option<f64>,
    /// The device memory allocated at the peak of one call (a GPU's
    /// `max_memory_allocated` after `reset_peak_memory_stats`), when measured.
    pub peak_bytes: Option<usize>,
    /// What `ember estimate` predicts for that peak, when estimated.
    pub estimate_bytes: Option<usize>,
}

impl Row {
    /// GFLOP/s, GB/s or samples/s.
    pub fn throughput(&self) -> Option<(f64, &'static str)> {
        match self.work {
            Work::Flops(f) => Some((f / self.stats.median / 1e9, "GFLOP/s")),
            Work::Bytes(b) => Some((b / self.stats.median / 1e9, "GB/s")),
            Work::Samples { n, .. } => Some((n / self.stats.median, "samples/s")),
            Work::None => None,
        }
    }

    /// Bytes or FLOPs per second, what the ceilings are measured in.
    pub fn rate(&self) -> Option<f64> {
        match self.work {
            Work::Flops(x) | Work::Bytes(x) | Work::Samples { flops: Some(x), .. } => {
                Some(x / self.stats.median)
            }
            _ => None,
        }
    }

    pub fn json(&self) -> String {
        let (tp, unit) = self.throughput().unwrap_or((f64::NAN, "s/call"));
        let num = |x: f64| {
            if x.is_finite() {
                format!("{x:e}")
            } else {
                "null".into()
            }
        };
        let opt = |x: Option<f64>| x.map_or("null".to_string(), num);
        let bytes = |x: Option<usize>| x.map_or("null".to_string(), |b| b.to_string());
        format!(
            "{{\"device\": \"{}\", \"name\": \"{}\", \"median_s\": {}, \"p25_s\": {}, \"p75_s\": {}, \"host_s\": {}, \"samples\": {}, \"throughput\": {}, \"unit\": \"{}\", \"share\": {}, \"speedup_vs_cpu\": {}, \"max_err_vs_cpu\": {}, \"peak_bytes\": {}, \"estimate_bytes\": {}}}",
            self.device,
            self.name,
            num(self.stats.median),
            num(self.stats.p25),
            num(self.stats.p75),
            opt(self.stats.host),
            self.stats.samples,
            num(tp),
            unit,
            opt(self.share),
            opt(self.speedup),
            opt(self.max_err),
            bytes(self.peak_bytes),
            bytes(self.estimate_bytes),
        )
    }
}

/// Seconds in a readable unit.
pub fn fmt_time(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.3} s")
    } else if s >= 1e-3 {
        format!("{:.3} ms", s * 1e3)
    } else if s >= 1e-6 {
        format!("{:.2} µs", s * 1e6)
    } else {
        format!("{:.0} ns", s * 1e9)
    }
}

/// The table printed at the end (the workload column as wide as the longest
/// name); the host column (a GPU row's time to queue a call) and the memory
/// columns (measured peak, estimate) only when some row has them.
pub fn table(rows: &[Row]) -> String {
    let w = rows
        .iter()
        .map(|r| r.name.chars().count())
        .fold(34, usize::max);
    let memory = rows
        .iter()
        .any(|r| r.peak_bytes.is_some() || r.estimate_bytes.is_some());
    let mem = |peak: &str, est: &str| {
        if memory {
            format!(" {peak:>11} {est:>11}")
        } else {
            String::new()
        }
    };
    let hosts = rows.iter().any(|r| r.stats.host.is_some());
    let host = |t: &str| {
        if hosts {
            format!(" {t:>11}")
        } else {
            String::new()
        }
    };
    let mut out = String::new();
    out.push_str(&format!(
        "{:<8} {:<w$} {:>11} {:>9}{} {:>18} {:>8} {:>9} {:>9}{}\n",
        "device",
        "workload",
        "median",
        "spread",
        host("host"),
        "throughput",
        "ceiling",
        "vs cpu",
        "max err",
        mem("peak mem", "estimate")
    ));
    for r in rows {
        let spread = if r.stats.median > 0.0 {
            format!(
                "±{:.1}%",
                50.0 * (r.stats.p75 - r.stats.p25) / r.stats.median
            )
        } else {
            "-".into()
        };
        let tp = r.throughput().map_or("-".into(), |(v, u)| {
            if v >= 1e4 {
                format!("{v:.0} {u}")
            } else {
                format!("{v:.1} {u}")
            }
        });
        let share = r.share.map_or("-".into(), |s| format!("{:.0}%", s * 100.0));
        let speed = r.speedup.map_or("-".into(), |s| format!("{s:.1}×"));
        let err = r.max_err.map_or("-".into(), |e| format!("{e:.1e}"));
        let bytes = |b: Option<usize>| b.map_or("-".into(), ember::memory::fmt_bytes);
        out.push_str(&format!(
            "{:<8} {:<w$} {:>11} {:>9}{} {:>18} {:>8} {:>9} {:>9}{}\n",
            r.device.to_string(),
            r.name,
            fmt_time(r.stats.median),
            spread,
            host(&r.stats.host.map_or("-".into(), fmt_time)),
            tp,
            share,
            speed,
            err,
            mem(&bytes(r.peak_bytes), &bytes(r.estimate_bytes))
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile(&v, 0.0), 1.0);
        assert_eq!(quantile(&v, 1.0), 4.0);
        assert_eq!(quantile(&v, 0.5), 2.5);
        assert!((quantile(&v, 0.25) - 1.75).abs() < 1e-12);
        let s = stats(vec![5.0, 1.0, 3.0], 7);
        assert_eq!(
            (s.median, s.p25, s.p75, s.samples, s.inner),
            (3.0, 2.0, 4.0, 3, 7)
        );
    }

    #[test]
    fn measure_times_real_work_on_the_cpu() {
        let mut calls = 0usize;
        let s = measure(&Device::Cpu, Duration::from_millis(20), || {
            calls += 1;
            std::thread::sleep(Duration::from_micros(300));
            Ok(())
        })
        .unwrap();
        assert!(s.median >= 300e-6, "{s:?}");
        assert!(s.samples >= 5 && s.inner >= 1);
        // (a CPU row has one time: no host column of its own)
        assert_eq!(s.host, None);
        assert_eq!(calls, 2 + s.samples * s.inner);
    }

    #[test]
    fn rows_report_throughput_and_json() {
        let r = Row {
            device: Device::Cpu,
            name: "mul 2x2 f32".into(),
            stats: stats(vec![1e-3, 2e-3, 3e-3], 1),
            work: Work::Bytes(4e6),
            share: Some(0.5),
            speedup: None,
            max_err: None,
            peak_bytes: None,
            estimate_bytes: None,
        };
        let (v, unit) = r.throughput().unwrap();
        assert_eq!(unit, "GB/s");
        assert!((v - 2.0).abs() < 1e-9);
        let j = r.json();
        assert!(j.contains("\"name\": \"mul 2x2 f32\""), "{j}");
        assert!(j.contains("\"median_s\": 2e-3"), "{j}");
        assert!(j.contains("\"speedup_vs_cpu\": null"), "{j}");
        assert!(
            j.ends_with("\"peak_bytes\": null, \"estimate_bytes\": null}"),
            "{j}"
        );
        let t = table(std::slice::from_ref(&r));
        assert!(
            t.contains("2.000 ms") && t.contains("2.0 GB/s") && t.contains("50%"),
            "{t}"
        );
        assert!(j.contains("\"host_s\": null"), "{j}");
        // the host and memory columns appear only with a row that has them
        assert!(!t.contains("peak mem") && !t.contains("host"), "{t}");
        // (rows whose other columns all have values: the one "-" is the host's)
        let full = Row {
            speedup: Some(2.0),
            max_err: Some(1e-6),
            ..r.clone()
        };
        let g = Row {
            stats: Stats {
                host: Some(7.5e-4),
                ..r.stats
            },
            ..full.clone()
        };
        assert!(g.json().contains("\"host_s\": 7.5e-4"), "{}", g.json());
        let t = table(&[g, full]);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].contains(" host "), "{t}");
        assert!(
            lines[1].contains("750.00 µs") && !lines[1].contains(" - "),
            "{t}"
        );
        assert_eq!(lines[2].matches(" - ").count(), 1, "{t}");
        let m = Row {
            peak_bytes: Some(3 << 30),
            estimate_bytes: Some(5 << 20),
            ..r
        };
        assert!(m
            .json()
            .contains("\"peak_bytes\": 3221225472, \"estimate_bytes\": 5242880"));
        let t = table(&[m]);
        assert!(
            t.contains("peak mem") && t.contains("3.00 GiB") && t.contains("5.00 MiB"),
            "{t}"
        );
        assert_eq!(fmt_time(2.5e-7), "250 ns");
    }

    #[test]
    fn training_rows_report_samples_per_second_and_their_flop_rate() {
        let r = Row {
            device: Device::Cpu,
            name: "train mlp".into(),
            stats: stats(vec![0.5, 0.5, 0.5], 1),
            work: Work::Samples {
                n: 256.0,
                flops: Some(1e9),
            },
            share: None,
            speedup: Some(3.0),
            max_err: None,
            peak_bytes: None,
            estimate_bytes: None,
        };
        assert_eq!(r.throughput(), Some((512.0, "samples/s")));
        assert_eq!(r.rate(), Some(2e9));
        let t = table(&[r]);
        assert!(t.contains("512.0 samples/s") && t.contains("3.0×"), "{t}");
    }
}
