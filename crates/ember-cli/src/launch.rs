//! `ember launch` (torchrun's role): starts the workers of a data-parallel job on
//! this machine with the environment `ember::distributed` reads, and stops them all
//! when one fails.

use clap::Args;
use ember::Error;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

#[derive(Args, Debug, Clone)]
#[command(after_help = "\
Each worker gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, \
MASTER_ADDR and MASTER_PORT, which `ember train` and \
`ember::distributed::init_process_group` read. A program named `ember` is this \
ember. Example, two processes training the digits CNN on the CPU, each on half of \
every batch of 64:

    ember launch --nproc-per-node 2 -- ember train digits --device cpu --batch-size 32")]
pub struct LaunchArgs {
    /// Workers to start on this machine.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub nproc_per_node: u32,
    /// Machines in the job (each runs `ember launch` with its --node-rank).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub nnodes: u32,
    /// This machine's index, 0..nnodes.
    #[arg(long, default_value_t = 0)]
    pub node_rank: u32,
    /// The host of rank 0, where the rendezvous store listens.
    #[arg(long, default_value = "127.0.0.1")]
    pub master_addr: String,
    /// The store's port [default: a free port on a single machine; 29500 for
    /// several, as torchrun].
    #[arg(long)]
    pub master_port: Option<u16>,
    /// Seconds to wait for the other workers to stop, after one failed or a
    /// signal came, before killing them.
    #[arg(long, default_value_t = 5.0)]
    pub grace: f64,
    /// The program and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "PROGRAM")]
    pub command: Vec<String>,
}

/// The signal the launcher received (0: none).
static SIGNALLED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNALLED.store(sig, Ordering::SeqCst);
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidArgument {
        op: "launch",
        msg: msg.into(),
    }
}

pub fn run(args: &LaunchArgs) -> ember::Result<()> {
    if args.node_rank >= args.nnodes {
        return Err(invalid(format!(
            "--node-rank {} is out of range for --nnodes {} (0..{})",
            args.node_rank, args.nnodes, args.nnodes
        )));
    }
    if !(args.grace >= 0.0 && args.grace <= 86_400.0) {
        return Err(invalid(format!(
            "--grace {}: a number of seconds from 0 to 86400",
            args.grace
        )));
    }
    let per_node = args.nproc_per_node as usize;
    let world = per_node * args.nnodes as usize;
    let port = match args.master_port {
        Some(p) => p,
        None if args.nnodes == 1 => free_port()?,
        None => 29500,
    };
    let (program, rest) = args.command.split_first().expect("clap requires a command");
    let exe = if program == "ember" {
        std::env::current_exe().map_err(|e| invalid(format!("cannot find this ember: {e}")))?
    } else {
        program.into()
    };
    // SAFETY: plain handlers that store the signal number, installed before any
    // worker starts
    unsafe {
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
            libc::signal(sig, on_signal as *const () as libc::sighandler_t);
        }
    }
    let mut workers: Vec<(usize, Child)> = Vec::with_capacity(per_node);
    for local in 0..per_node {
        let rank = args.node_rank as usize * per_node + local;
        // each worker leads a process group of its own, so that stopping it stops
        // what it started too
        let mut cmd = Command::new(&exe);
        let launcher = std::process::id() as libc::pid_t;
        // SAFETY: prctl and getppid are async-signal-safe; the child asks to be
        // sent SIGTERM when the launcher dies (even by SIGKILL), so no worker
        // outlives it, and does not start if the launcher died before it asked
        unsafe {
            cmd.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                if libc::getppid() != launcher {
                    return Err(std::io::Error::other("the launcher has exited"));
                }
                Ok(())
            });
        }
        let child = cmd
            .process_group(0)
            .args(rest)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", local.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("LOCAL_WORLD_SIZE", per_node.to_string())
            .env("GROUP_RANK", args.node_rank.to_string())
            .env("MASTER_ADDR", &args.master_addr)
            .env("MASTER_PORT", port.to_string())
            .spawn();
        match child {
            Ok(c) => workers.push((rank, c)),
            Err(e) => {
                stop(&mut workers, libc::SIGTERM, args.grace);
                return Err(invalid(format!("cannot start {}: {e}", exe.display())));
            }
        }
    }
    // watch: the first failure (or a signal) stops everyone
    let mut running: Vec<(usize, Child)> = workers;
    loop {
        let sig = SIGNALLED.load(Ordering::SeqCst);
        if sig != 0 {
            eprintln!(
                "ember launch: received signal {sig}; stopping {} worker(s)",
                running.len()
            );
            stop(&mut running, sig, args.grace);
            return Err(invalid(format!("stopped by signal {sig}")));
        }
        let mut failed = None;
        let mut i = 0;
        while i < running.len() {
            match running[i].1.try_wait() {
                Ok(Some(status)) => {
                    let (rank, child) = running.swap_remove(i);
                    if !status.success() {
                        failed = Some((rank, child.id(), status));
                        break;
                    }
                }
                Ok(None) => i += 1,
                Err(e) => return Err(invalid(format!("cannot watch worker: {e}"))),
            }
        }
        if let Some((rank, pid, status)) = failed {
            let others = running.len();
            eprintln!(
                "ember launch: worker rank {rank} (pid {pid}) failed: {}; stopping the other {others} worker(s)",
                describe(status)
            );
            stop(&mut running, libc::SIGTERM, args.grace);
            return Err(invalid(format!(
                "worker rank {rank} of {world} failed: {}",
                describe(status)
            )));
        }
        if running.is_empty() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends `sig` to every worker, waits up to `grace` seconds for them to exit, then
/// kills those left.
fn stop(workers: &mut Vec<(usize, Child)>, sig: i32, grace: f64) {
    for (_, c) in workers.iter() {
        // SAFETY: kill(2) on the process group of a child this process started
        // (its leader, not reaped yet)
        unsafe {
            libc::kill(-(c.id() as libc::pid_t), sig);
        }
    }
    let until = Instant::now() + Duration::from_secs_f64(grace);
    while !workers.is_empty() && Instant::now() < until {
        workers.retain_mut(|(_, c)| !matches!(c.try_wait(), Ok(Some(_))));
        std::thread::sleep(Duration::from_millis(20));
    }
    for (rank, c) in workers.iter_mut() {
        eprintln!("ember launch: worker rank {rank} did not stop within {grace}s; killing it");
        // SAFETY: as above
        unsafe {
            libc::kill(-(c.id() as libc::pid_t), libc::SIGKILL);
        }
        let _ = c.wait();
    }
    workers.clear();
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => status.to_string(),
    }
}

/// A port nothing listens on now, for a job on this machine alone.
fn free_port() -> ember::Result<u16> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| invalid(format!("cannot find a free port: {e}; pass --master-port")))
}
