//! `ember bench`: timings of tensor operations on the CPU and the GPUs, done right
//! (warm-up, synchronization or device events, medians), with throughput and the
//! share of the device's own measured ceiling (copy bandwidth, large-GEMM rate).

use clap::Args;
use ember::prelude::*;
use ember::{cuda, Tensor};
use std::time::{Duration, Instant};

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Where to run: cpu, cuda:N, or all (the CPU and every GPU).
    #[arg(long, default_value = "all")]
    pub device: String,
    /// Which workloads: ops (tensor operations).
    #[arg(long, default_value = "ops")]
    pub suite: String,
    /// Square matmul sizes, comma-separated (default: 256,1024 on the CPU;
    /// 1024,4096,8192 on a GPU).
    #[arg(long, value_delimiter = ',')]
    pub sizes: Option<Vec<usize>>,
    /// Also run the lessons' comparison: a 10000×10000 matmul on every device.
    #[arg(long)]
    pub lesson: bool,
    /// Short runs with small inputs (seconds in all), for a smoke test.
    #[arg(long)]
    pub quick: bool,
    /// Also write the rows as JSON lines to this file.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

/// Timing statistics of one workload, in seconds per call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stats {
    pub median: f64,
    pub p25: f64,
    pub p75: f64,
    pub samples: usize,
    /// Calls per sample.
    pub inner: usize,
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
    }
}

/// Times `f` on `dev`: one warm-up call, then samples of `inner` calls each
/// (enough for ~2 ms per sample) until `budget` is spent (at least 5 samples, at
/// most 200). GPU samples are measured with device events around the calls, so
/// they count the GPU's work, not just the launches.
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
    for _ in 0..samples {
        let t = if dev.is_cuda() {
            let start = cuda::Event::record(dev)?;
            for _ in 0..inner {
                f()?;
            }
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
    Ok(stats(times, inner))
}

/// What a row's throughput counts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Work {
    /// Floating-point operations per call.
    Flops(f64),
    /// Bytes read plus written per call.
    Bytes(f64),
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
}

impl Row {
    /// GFLOP/s or GB/s.
    pub fn throughput(&self) -> Option<(f64, &'static str)> {
        match self.work {
            Work::Flops(f) => Some((f / self.stats.median / 1e9, "GFLOP/s")),
            Work::Bytes(b) => Some((b / self.stats.median / 1e9, "GB/s")),
            Work::None => None,
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
        format!(
            "{{\"device\": \"{}\", \"name\": \"{}\", \"median_s\": {}, \"p25_s\": {}, \"p75_s\": {}, \"samples\": {}, \"throughput\": {}, \"unit\": \"{}\", \"share\": {}, \"speedup_vs_cpu\": {}, \"max_err_vs_cpu\": {}}}",
            self.device,
            self.name,
            num(self.stats.median),
            num(self.stats.p25),
            num(self.stats.p75),
            self.stats.samples,
            num(tp),
            unit,
            opt(self.share),
            opt(self.speedup),
            opt(self.max_err),
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

/// The table printed at the end.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "{:<8} {:<26} {:>11} {:>9} {:>16} {:>8} {:>9} {:>9}\n",
        "device", "workload", "median", "spread", "throughput", "ceiling", "vs cpu", "max err"
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
        let tp = r
            .throughput()
            .map_or("-".into(), |(v, u)| format!("{v:.1} {u}"));
        let share = r.share.map_or("-".into(), |s| format!("{:.0}%", s * 100.0));
        let speed = r.speedup.map_or("-".into(), |s| format!("{s:.1}×"));
        let err = r.max_err.map_or("-".into(), |e| format!("{e:.1e}"));
        out.push_str(&format!(
            "{:<8} {:<26} {:>11} {:>9} {:>16} {:>8} {:>9} {:>9}\n",
            r.device.to_string(),
            r.name,
            fmt_time(r.stats.median),
            spread,
            tp,
            share,
            speed,
            err
        ));
    }
    out
}

fn devices(spec: &str) -> Result<Vec<Device>> {
    if spec == "all" {
        let mut v = vec![Device::Cpu];
        v.extend((0..cuda::device_count()).map(Device::Cuda));
        return Ok(v);
    }
    let d: Device = spec.parse()?;
    if d.is_cuda() {
        cuda::device_properties(d.index().unwrap_or(0))?;
    }
    Ok(vec![d])
}

/// The largest absolute difference between two tensors' values.
fn max_diff(a: &Tensor, b: &Tensor) -> Result<f64> {
    let (x, y) = (a.to_vec::<f64>()?, b.to_vec::<f64>()?);
    Ok(x.iter()
        .zip(&y)
        .map(|(p, q)| (p - q).abs())
        .fold(0.0, f64::max))
}

struct Ctx {
    dev: Device,
    budget: Duration,
    quick: bool,
}

impl Ctx {
    fn row(&self, name: String, work: Work, f: impl FnMut() -> Result<()>) -> Result<Row> {
        eprintln!("  {} {name} ...", self.dev);
        let stats = measure(&self.dev, self.budget, f)?;
        Ok(Row {
            device: self.dev,
            name,
            stats,
            work,
            share: None,
            speedup: None,
            max_err: None,
        })
    }
}

/// The tensor-operation workloads on one device.
fn ops_suite(cx: &Ctx, sizes: &[usize], lesson: bool) -> Result<Vec<Row>> {
    let dev = cx.dev;
    let gpu = dev.is_cuda();
    let q = cx.quick;
    let mut rows = Vec::new();
    ember::manual_seed(0);
    let rand = |shape: &[usize]| -> Result<Tensor> { Tensor::randn(shape, &Device::Cpu)?.to(&dev) };

    // the bandwidth ceiling first: a plain copy of a buffer the size of the
    // elementwise operands
    let n = if q {
        256
    } else if gpu {
        4096
    } else {
        2048
    };
    let x = rand(&[n, n])?;
    let copy = cx.row(
        format!("copy {n}x{n} f32"),
        Work::Bytes(8.0 * (n * n) as f64),
        || x.copy().map(drop),
    )?;
    drop(x);
    let bandwidth = copy.throughput().map(|t| t.0 * 1e9);
    rows.push(copy);

    // elementwise, reductions, softmax
    let (a, b) = (rand(&[n, n])?, rand(&[n, n])?);
    let mut r = cx.row(
        format!("mul {n}x{n} f32"),
        Work::Bytes(12.0 * (n * n) as f64),
        || a.mul(&b).map(drop),
    )?;
    r.max_err = check(&dev, &a.mul(&b)?, |c| c.mul(&b.cpu()?), &a)?;
    rows.push(r);
    rows.push(cx.row(
        format!("sum {n}x{n} f32"),
        Work::Bytes(4.0 * (n * n) as f64),
        || a.sum_all().map(drop),
    )?);
    rows.push(cx.row(
        format!("softmax {n}x{n} f32"),
        Work::Bytes(8.0 * (n * n) as f64),
        || a.softmax(-1).map(drop),
    )?);
    drop((a, b));

    // matrix products
    let mut dtypes: Vec<(&str, DType, bool)> = vec![("f32", DType::F32, false)];
    if gpu {
        dtypes.extend([
            ("tf32", DType::F32, true),
            ("bf16", DType::BF16, false),
            ("f16", DType::F16, false),
        ]);
    }
    let mut sizes = sizes.to_vec();
    if lesson && !sizes.contains(&10000) {
        sizes.push(10000);
    }
    for &s in &sizes {
        let (a32, b32) = (rand(&[s, s])?, rand(&[s, s])?);
        for &(label, dt, tf32) in &dtypes {
            let (a, b) = (a32.to_dtype(dt)?, b32.to_dtype(dt)?);
            cuda::set_allow_tf32(tf32);
            let mut r = cx.row(
                format!("matmul {s} {label}"),
                Work::Flops(2.0 * (s as f64).powi(3)),
                || a.matmul(&b).map(drop),
            )?;
            if gpu {
                // the first rows against the CPU's product (in f32)
                let k = s.min(8);
                let got = a.narrow(0, 0, k)?.matmul(&b)?.to_dtype(DType::F32)?;
                let want = a32.cpu()?.narrow(0, 0, k)?.matmul(&b32.cpu()?)?;
                r.max_err = Some(max_diff(&got.cpu()?, &want)?);
            }
            cuda::set_allow_tf32(false);
            rows.push(r);
        }
    }

    // a convolution layer of the MNIST-sized CNN
    let (bn, c, o, hw) = if q { (8, 8, 16, 12) } else { (64, 32, 64, 26) };
    let xc = rand(&[bn, c, hw, hw])?;
    let wc = rand(&[o, c, 3, 3])?;
    let ohw = (hw - 2) as f64;
    let flops = 2.0 * (bn * o) as f64 * ohw * ohw * (c * 9) as f64;
    let opts = Conv2dOptions::default();
    let mut r = cx.row(
        format!("conv2d {bn}x{c}x{hw}x{hw} k3 o{o}"),
        Work::Flops(flops),
        || xc.conv2d(&wc, None, opts).map(drop),
    )?;
    if gpu {
        let got = xc.conv2d(&wc, None, opts)?.cpu()?;
        let want = xc.cpu()?.conv2d(&wc.cpu()?, None, opts)?;
        r.max_err = Some(max_diff(&got, &want)?);
    }
    rows.push(r);

    // per-op overhead: a 4×4 add, launched again and again
    let (t1, t2) = (rand(&[4, 4])?, rand(&[4, 4])?);
    rows.push(cx.row("tiny add 4x4 (per op)".into(), Work::None, || {
        t1.add(&t2).map(drop)
    })?);

    // host <-> device copies (pageable host memory)
    if gpu {
        let nb = if q { 1 << 20 } else { 16 << 20 };
        let host = Tensor::randn([nb], &Device::Cpu)?;
        rows.push(cx.row(
            format!("host to device {}M f32", nb >> 20),
            Work::Bytes(4.0 * nb as f64),
            || host.to(&dev).map(drop),
        )?);
        let on_dev = host.to(&dev)?;
        rows.push(cx.row(
            format!("device to host {}M f32", nb >> 20),
            Work::Bytes(4.0 * nb as f64),
            || on_dev.cpu().map(drop),
        )?);
    }

    // shares of the measured ceilings
    let gemm = rows
        .iter()
        .filter(|r| r.name.starts_with("matmul") && r.name.ends_with(" f32"))
        .filter_map(|r| r.throughput().map(|t| t.0 * 1e9))
        .fold(0.0, f64::max);
    for r in &mut rows {
        r.share = match r.work {
            Work::Bytes(bytes) => bandwidth.map(|bw| bytes / r.stats.median / bw),
            Work::Flops(f) if gemm > 0.0 => Some(f / r.stats.median / gemm),
            _ => None,
        };
    }
    Ok(rows)
}

/// For a GPU row: the largest difference between `got` and the CPU's answer
/// `want(x on the CPU)`.
fn check(
    dev: &Device,
    got: &Tensor,
    want: impl FnOnce(&Tensor) -> Result<Tensor>,
    x: &Tensor,
) -> Result<Option<f64>> {
    if !dev.is_cuda() {
        return Ok(None);
    }
    let w = want(&x.cpu()?)?;
    Ok(Some(max_diff(&got.cpu()?, &w)?))
}

pub fn run(args: &BenchArgs) -> Result<()> {
    if args.suite != "ops" {
        return Err(Error::InvalidArgument {
            op: "bench",
            msg: format!("unknown suite {:?}; available: ops", args.suite),
        });
    }
    let devs = devices(&args.device)?;
    let budget = Duration::from_millis(if args.quick { 30 } else { 400 });
    let cpu_info = ember::cpu::cpu_info();
    println!("cpu: {} ({} threads)", cpu_info.model, cpu_info.threads);
    let mut rows: Vec<Row> = Vec::new();
    for dev in devs {
        if let Device::Cuda(i) = dev {
            let p = cuda::device_properties(i)?;
            println!(
                "{dev}: {} (compute capability {}.{}, {} SMs)",
                p.name, p.compute_capability.0, p.compute_capability.1, p.multiprocessor_count
            );
            if cuda::is_simulated() {
                println!(
                    "warning: {dev} is ember's CUDA simulator: its rows time CPU emulation, not a GPU"
                );
            }
        }
        let sizes = args.sizes.clone().unwrap_or_else(|| {
            if args.quick {
                vec![128]
            } else if dev.is_cuda() {
                vec![1024, 4096, 8192]
            } else {
                vec![256, 1024]
            }
        });
        let cx = Ctx {
            dev,
            budget,
            quick: args.quick,
        };
        eprintln!("measuring on {dev}:");
        rows.extend(ops_suite(&cx, &sizes, args.lesson)?);
    }
    // speed-up of each GPU row over the same row on the CPU
    let cpu_times: Vec<(String, f64)> = rows
        .iter()
        .filter(|r| r.device.is_cpu())
        .map(|r| (r.name.clone(), r.stats.median))
        .collect();
    for r in rows.iter_mut().filter(|r| r.device.is_cuda()) {
        r.speedup = cpu_times
            .iter()
            .find(|(n, _)| *n == r.name)
            .map(|(_, t)| t / r.stats.median);
    }
    print!("{}", table(&rows));
    println!("ceiling: bytes rows against the device's copy bandwidth, FLOP rows against its best f32 matmul; spread: half the interquartile range");
    if let Some(path) = &args.json {
        let text: String = rows.iter().map(|r| r.json() + "\n").collect();
        std::fs::write(path, text).map_err(|e| Error::Io {
            path: path.display().to_string(),
            source: e,
        })?;
    }
    Ok(())
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
        };
        let (v, unit) = r.throughput().unwrap();
        assert_eq!(unit, "GB/s");
        assert!((v - 2.0).abs() < 1e-9);
        let j = r.json();
        assert!(j.contains("\"name\": \"mul 2x2 f32\""), "{j}");
        assert!(j.contains("\"median_s\": 2e-3"), "{j}");
        assert!(j.contains("\"speedup_vs_cpu\": null"), "{j}");
        let t = table(&[r]);
        assert!(
            t.contains("2.000 ms") && t.contains("2.0 GB/s") && t.contains("50%"),
            "{t}"
        );
        assert_eq!(fmt_time(2.5e-7), "250 ns");
    }
}
