//! `--profile [FILE]` of `ember train` and `ember bench`: a few steps profiled
//! after a warm-up, the top of the per-op table printed, the Chrome trace written.

use ember::profiler::{Profile, SortBy};
use std::path::{Path, PathBuf};

/// The steps run before the profiled ones: kernels compiled, the optimizer's
/// state made, the allocator's cache warm.
pub const WARMUP: usize = 3;

/// The rows of the table printed.
const TOP: usize = 15;

/// Checks `--profile`'s trace file before any work starts (`Some(None)`: the table
/// only): a `.json` name, writable, none of the run's `inputs`, not there yet
/// unless `force`.
pub fn check(
    profile: &Option<Option<PathBuf>>,
    inputs: &[PathBuf],
    force: bool,
) -> ember::Result<()> {
    check_name(profile)?;
    if let Some(Some(path)) = profile {
        crate::paths::new_output(path, "--profile", inputs, force)?;
    }
    Ok(())
}

/// Checks `--profile`'s trace name alone: a `.json` name.
pub fn check_name(profile: &Option<Option<PathBuf>>) -> ember::Result<()> {
    if let Some(Some(path)) = profile {
        // (the value is optional: `--profile iris` would take a dataset's name
        // for the trace's file)
        let json = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("json"));
        if !json {
            return Err(ember::Error::InvalidArgument {
                op: "profile",
                msg: format!(
                    "--profile {}: the trace is a Chrome trace, a file whose name ends in \
                     .json; to profile without a trace, put --profile last or after the \
                     command's other words (`ember train iris --profile`)",
                    path.display()
                ),
            });
        }
    }
    Ok(())
}

/// The trace file `path` for the workload `name`: `path` itself for one workload,
/// else `path` with the workload's name before the extension.
pub fn trace_path(path: &Path, name: Option<&str>) -> PathBuf {
    let Some(name) = name else {
        return path.to_path_buf();
    };
    let slug: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect::<String>()
        .split('-')
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("-");
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let ext = path
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default();
    path.with_file_name(format!("{stem}-{slug}{ext}"))
}

/// After a training run with `--profile` (`flag`): the report of `profile`, its
/// steps counted by their `train_step` ranges, or why there is none.
pub fn report_run(
    profile: Option<&Profile>,
    what: &str,
    flag: &Option<Option<PathBuf>>,
) -> ember::Result<()> {
    let Some(trace) = flag else {
        return Ok(());
    };
    // the table counts the training steps alone (an evaluation or a checkpoint
    // between them is in the trace only)
    let steps_of = |p: &Profile| p.key_averages().get("train_step").map_or(0, |r| r.count);
    match profile {
        Some(p) if steps_of(p) > 0 => {
            report(&p.within("train_step"), what, steps_of(p), None)?;
            if let Some(path) = trace.as_deref() {
                export(p, path)?;
            }
            Ok(())
        }
        _ => {
            println!("profile: none (the run had no more than the {WARMUP} warm-up steps)");
            Ok(())
        }
    }
}

/// Prints the profile of `what` (`steps` steps) and writes its trace to `trace`.
/// The warm-up it names is [`WARMUP`] steps, or more (a benchmark's timing).
pub fn report(
    profile: &Profile,
    what: &str,
    steps: usize,
    trace: Option<&Path>,
) -> ember::Result<()> {
    let ops = profile.key_averages();
    println!(
        "profile of {what}: {steps} step{} after at least {WARMUP} of warm-up, {:.3} ms per step \
         on the device, {:.3} ms on the host",
        if steps == 1 { "" } else { "s" },
        ops.self_device_total_us() / 1e3 / steps.max(1) as f64,
        ops.self_host_total_us() / 1e3 / steps.max(1) as f64,
    );
    print!("{}", ops.table(SortBy::SelfDevice, TOP));
    if let Some(path) = trace {
        export(profile, path)?;
    }
    Ok(())
}

/// Writes `profile`'s trace to `path` and says where.
fn export(profile: &Profile, path: &Path) -> ember::Result<()> {
    profile.export_chrome_trace(path)?;
    println!(
        "trace: {} (open it in https://ui.perfetto.dev or chrome://tracing)",
        path.display()
    );
    Ok(())
}
