//! The `ember` command: list devices and train a model on the best one.

mod args;
mod bench;
mod devices;
mod estimate;
mod files;
mod launch;
mod paths;
mod profile;
mod text;
mod train;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "ember",
    version,
    about = "GPU-accelerated tensors with PyTorch's device model",
    after_help = "With no command, `ember` trains the digits CNN on the best available device \
                  (the same as `ember train digits`)."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// List the CPU and every CUDA GPU, or say why there is none.
    Devices,
    /// Train a classifier on a data set shipped in data/.
    Train(Box<args::TrainArgs>),
    /// The device memory a model's training step needs, computed before running
    /// it (on the meta device, through ember's CUDA caching allocator).
    Estimate(estimate::EstimateArgs),
    /// What a weights file holds: names, dtypes, shapes and sizes of a PyTorch
    /// `torch.save` file (.pt/.pth/.bin), a safetensors file or an ember
    /// checkpoint, without loading the values.
    Inspect(files::InspectArgs),
    /// Convert a PyTorch `torch.save` file (.pt/.pth/.bin) to safetensors, which
    /// ember (and PyTorch's `safetensors`) load.
    Convert(files::ConvertArgs),
    /// Text from a character model saved by `ember train text --checkpoint DIR`.
    Generate(text::GenerateArgs),
    /// Start the workers of a data-parallel job (torchrun's role): `ember launch
    /// --nproc-per-node N -- ember train ...`.
    Launch(launch::LaunchArgs),
    /// Time tensor operations on the CPU and the GPUs (median, throughput, share
    /// of the device's measured ceiling, speed-up over the CPU).
    Bench(bench::BenchArgs),
}

fn main() -> ExitCode {
    // `ember devices | head` ends quietly when head stops reading, as Unix tools
    // do, instead of panicking on the closed pipe (Rust ignores SIGPIPE by default)
    #[cfg(unix)]
    // SAFETY: restoring a signal's default action before any thread is started
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    // the main thread works in the CPU pool instead of sleeping through each op;
    // nothing has built the pool yet, so this cannot fail but is not fatal if it does
    if let Err(e) = ember::cpu::init_threads(None) {
        eprintln!("warning: {e}");
    }
    let result = match cli.command {
        Some(Command::Devices) => devices::run(),
        Some(Command::Train(args)) => train::run(&args),
        Some(Command::Bench(args)) => bench::run(&args),
        Some(Command::Launch(args)) => launch::run(&args),
        Some(Command::Estimate(args)) => estimate::run(&args),
        Some(Command::Generate(args)) => text::generate(&args),
        Some(Command::Inspect(args)) => files::inspect(&args),
        Some(Command::Convert(args)) => files::convert(&args),
        // the main job: train on the best available device
        None => train::run(&args::TrainArgs::default()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            // a refused or failed command leaves no empty folder of its own behind
            paths::remove_made_dirs_if_empty();
            ExitCode::FAILURE
        }
    }
}
