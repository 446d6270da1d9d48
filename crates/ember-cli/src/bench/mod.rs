//! `ember bench`: timings of tensor operations and training steps on the CPU and
//! the GPUs, done right (warm-up, synchronization or device events, medians), with
//! throughput, the share of the device's own measured ceiling (copy bandwidth,
//! large-GEMM rate), the speed-up of each GPU row over the CPU, and for real-size
//! models the step's peak device memory beside `ember estimate`'s prediction.

mod models;
mod ops;
mod pieces;
pub mod stats;
mod train;

use clap::Args;
use ember::cuda;
use ember::prelude::*;
use stats::{measure, table, Row, Work};
use std::time::Duration;

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Where to run: cpu, cuda:N, or all (the CPU and every GPU).
    #[arg(long, default_value = "all")]
    pub device: String,
    /// Which workloads: ops (tensor operations), train (training steps of small
    /// models), models (training steps of ResNet-50 and GPT-2 small, minutes on
    /// a CPU), pieces (those models' layers, forward and backward, each on its
    /// own), or all (ops and train).
    #[arg(long, default_value = "all")]
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
    /// Replace --json's file and --profile's trace if they exist.
    #[arg(long)]
    pub force: bool,
    /// Only the models or pieces suite's rows whose name contains this text (e.g.
    /// resnet, or attention).
    #[arg(long, value_name = "TEXT")]
    pub filter: Option<String>,
    /// After timing each row of the models suite, profile a few of its steps and
    /// print where their time goes, op by op (ember::profiler); with FILE, also
    /// write each row's Chrome trace next to it (FILE's name with the row's).
    #[arg(long, value_name = "FILE", num_args = 0..=1)]
    pub profile: Option<Option<std::path::PathBuf>>,
    /// How many steps --profile profiles per row.
    #[arg(long, default_value_t = 3, requires = "profile", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub profile_steps: u32,
}

/// What every workload of one device's run shares.
pub(crate) struct Ctx {
    pub dev: Device,
    pub budget: Duration,
    pub quick: bool,
}

impl Ctx {
    /// Times `f` on the device (showing progress) into a row.
    pub fn row(&self, name: String, work: Work, f: impl FnMut() -> Result<()>) -> Result<Row> {
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
            peak_bytes: None,
            estimate_bytes: None,
        })
    }
}

fn devices(spec: &str) -> Result<Vec<Device>> {
    if spec == "all" {
        let mut v = vec![Device::Cpu];
        v.extend((0..cuda::device_count()).map(Device::Cuda));
        return Ok(v);
    }
    let d = crate::paths::device(spec, "--device")?;
    if d.is_cuda() {
        cuda::device_properties(d.index().unwrap_or(0))?;
    }
    if d.is_meta() {
        return Err(Error::UnsupportedDevice {
            op: "bench",
            device: d,
            msg: "a meta tensor has no values to compute: bench cpu or cuda:N \
                  (`cargo bench -p ember` times meta ops)"
                .into(),
        });
    }
    Ok(vec![d])
}

/// Fills in each row's share of its device's ceilings: bytes against the copy
/// bandwidth measured in the same run, FLOPs against the best f32 rate (the
/// f32 matmul's, unless a row of other f32 work ran faster).
fn set_shares(rows: &mut [Row]) {
    let devs: Vec<Device> = rows.iter().map(|r| r.device).collect();
    for dev in devs {
        let of = |pred: &dyn Fn(&Row) -> bool| {
            rows.iter()
                .filter(|r| r.device == dev && pred(r))
                .filter_map(|r| r.rate())
                .fold(0.0, f64::max)
        };
        let bandwidth = of(&|r| r.name.starts_with("copy "));
        // (the best f32 matmul, or a faster f32 row where the matmul's size
        // is too small to be the ceiling: a share past 100% is no share)
        let gemm = of(&|r| r.name.ends_with(" f32") && matches!(r.work, Work::Flops(_)));
        for r in rows.iter_mut().filter(|r| r.device == dev) {
            let rate = r.rate();
            r.share = match (r.work, rate) {
                (Work::Bytes(_), Some(x)) if bandwidth > 0.0 => Some(x / bandwidth),
                (Work::Flops(_), Some(x)) | (Work::Samples { .. }, Some(x)) if gemm > 0.0 => {
                    Some(x / gemm)
                }
                _ => None,
            };
        }
    }
}

/// Fills in each GPU row's speed-up over the same row on the CPU.
fn set_speedups(rows: &mut [Row]) {
    let cpu: Vec<(String, f64)> = rows
        .iter()
        .filter(|r| r.device.is_cpu())
        .map(|r| (r.name.clone(), r.stats.median))
        .collect();
    for r in rows.iter_mut().filter(|r| r.device.is_cuda()) {
        r.speedup = cpu
            .iter()
            .find(|(n, _)| *n == r.name)
            .map(|(_, t)| t / r.stats.median);
    }
}

pub fn run(args: &BenchArgs) -> Result<()> {
    // `all` leaves the models and their pieces out: their rows take minutes on
    // a CPU
    let (ops, train, real, parts) = match args.suite.as_str() {
        "ops" => (true, false, false, false),
        "train" => (false, true, false, false),
        "models" => (false, false, true, false),
        "pieces" => (false, false, false, true),
        "all" => (true, true, false, false),
        other => {
            return Err(Error::InvalidArgument {
                op: "bench",
                msg: format!(
                    "--suite {other}: unknown suite; available: ops, train, models, pieces, \
                     all (ops and train)"
                ),
            })
        }
    };
    if let Some(path) = &args.json {
        crate::paths::new_output(path, "--json", &[], args.force)?;
    }
    // (the trace's name only: the models suite writes one trace a row, named
    // after it, checked below once the rows are known)
    crate::profile::check_name(&args.profile)?;
    if args.profile.is_some() && !real {
        return Err(Error::InvalidArgument {
            op: "bench",
            msg: "--profile is for --suite models".into(),
        });
    }
    if args.filter.is_some() && !real && !parts {
        return Err(Error::InvalidArgument {
            op: "bench",
            msg: "--filter is for --suite models or pieces".into(),
        });
    }
    if args.sizes.as_ref().is_some_and(|s| s.contains(&0)) {
        return Err(Error::InvalidArgument {
            op: "bench",
            msg: "--sizes: every matmul size must be at least 1".into(),
        });
    }
    let devs = devices(&args.device)?;
    let budget = Duration::from_millis(if args.quick { 30 } else { 400 });
    let cpu_info = ember::cpu::cpu_info();
    println!("cpu: {} ({} threads)", cpu_info.model, cpu_info.threads);
    if args.device == "all" && !devs.iter().any(|d| d.is_cuda()) {
        let why = cuda::unavailable_reason().unwrap_or_else(|| "no GPU found".into());
        println!("cuda: no rows ({why})");
    }
    // every trace file the run will write, checked before anything runs: new
    // (or --force), and each its own (two rows, or a row and --json, writing
    // one file would lose the first)
    if let (Some(Some(trace)), true) = (&args.profile, real) {
        let mut claimed: Vec<(std::path::PathBuf, String)> = args
            .json
            .iter()
            .map(|p| (crate::paths::resolved(p), "--json".to_string()))
            .collect();
        for &dev in &devs {
            let cx = Ctx {
                dev,
                budget,
                quick: args.quick,
            };
            for w in models::workloads(&cx) {
                if args.filter.as_deref().is_some_and(|f| !w.name.contains(f)) {
                    continue;
                }
                let path = crate::profile::trace_path(trace, Some(&format!("{dev} {}", w.name)));
                crate::paths::new_output(&path, "--profile", &[], args.force)?;
                let row = format!("the trace of {dev} {}", w.name);
                let target = crate::paths::resolved(&path);
                if let Some((_, by)) = claimed.iter().find(|(c, _)| *c == target) {
                    return Err(Error::InvalidArgument {
                        op: "bench",
                        msg: format!(
                            "--profile {}: {row} would be written where {by} is; choose \
                             other names",
                            path.display()
                        ),
                    });
                }
                claimed.push((target, row));
            }
        }
    }
    let mut rows: Vec<Row> = Vec::new();
    for dev in devs {
        if let Device::Cuda(i) = dev {
            let p = cuda::device_properties(i)?;
            let conv = if cuda::cudnn::in_use() {
                format!("cuDNN, {}", crate::devices::cudnn_settings())
            } else {
                "im2col + cuBLAS".to_string()
            };
            println!(
                "{dev}: {} (compute capability {}.{}, {} SMs; convolutions: {conv})",
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
        if ops {
            rows.extend(ops::suite(&cx, &sizes, args.lesson)?);
        }
        if train {
            // whole training steps take long and vary more: more samples each
            let cx = Ctx {
                budget: budget * 5,
                ..cx
            };
            rows.extend(train::suite(&cx)?);
        }
        if parts {
            rows.extend(pieces::suite(&cx, args.filter.as_deref())?);
        }
        if real {
            let cx = Ctx {
                budget: budget * 5,
                ..cx
            };
            let profile = args.profile.as_ref().map(|trace| models::ProfileRequest {
                steps: args.profile_steps as usize,
                trace: trace.clone(),
            });
            rows.extend(models::suite(
                &cx,
                args.filter.as_deref(),
                profile.as_ref(),
            )?);
        }
    }
    if let (Some(f), true) = (&args.filter, rows.is_empty()) {
        return Err(Error::InvalidArgument {
            op: "bench",
            msg: format!(
                "--filter {f:?} matches none of the --suite {} rows on this device (it keeps \
                 those whose name contains it; their names are in the table of a run without \
                 --filter, and differ with --quick)",
                args.suite
            ),
        });
    }
    set_shares(&mut rows);
    set_speedups(&mut rows);
    print!("{}", table(&rows));
    println!(
        "ceiling: bytes rows against the device's copy bandwidth, FLOP and training rows against \
         its best f32 matmul (ops suite); spread: half the interquartile range"
    );
    if let Some(path) = &args.json {
        let text: String = rows.iter().map(|r| r.json() + "\n").collect();
        ember::io::write_atomic(path, text.as_bytes())?;
    }
    Ok(())
}
