//! How fast ember's CPU backend (`Backend::Gloo`: a ring over TCP) all-reduces
//! float32 tensors: the median time per call and the bus bandwidth, the bytes each
//! rank sends, `2 (world - 1) / world` of the tensor, per second.
//!
//! Under `ember launch` each worker is a rank:
//!
//! `cargo build --release -p ember --example all_reduce && target/release/ember launch --nproc-per-node 2 -- target/release/examples/all_reduce`
//!
//! Started alone, it runs `--world N` ranks (default 2) as threads of this process
//! over the loopback interface.
//!
//! With `--nccl`, under `ember launch`: the NCCL backend on CUDA tensors of each
//! rank's GPU (`cuda:LOCAL_RANK`), timed with a synchronize after each call.

use ember::distributed::{Backend, Options, ProcessGroup, ReduceOp};
use ember::prelude::*;
use std::time::{Duration, Instant};

fn measure(pg: &ProcessGroup, dev: &Device) -> Result<Vec<(usize, f64)>> {
    let mut rows = Vec::new();
    let sync = || match dev {
        Device::Cuda(_) => ember::cuda::synchronize(dev),
        _ => Ok(()),
    };
    for kib in [4usize, 64, 1024, 16 * 1024, 64 * 1024] {
        let t = Tensor::ones([kib * 256], DType::F32, dev)?;
        pg.all_reduce(&t, ReduceOp::Sum)?; // warm-up
        sync()?;
        let reps = (256 * 1024 / kib).clamp(5, 200);
        let mut times = Vec::with_capacity(reps);
        for _ in 0..reps {
            pg.barrier()?;
            let s = Instant::now();
            pg.all_reduce(&t, ReduceOp::Sum)?;
            sync()?;
            times.push(s.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        rows.push((kib, times[times.len() / 2]));
    }
    Ok(rows)
}

fn report(world: usize, backend: &str, rows: &[(usize, f64)]) {
    println!("all_reduce(sum) of float32 over {world} ranks ({backend})");
    println!("{:>10}  {:>12}  {:>14}", "size", "median", "bus bandwidth");
    for (kib, secs) in rows {
        let bytes = (*kib * 1024) as f64;
        let bus = bytes * 2.0 * (world as f64 - 1.0) / world as f64 / secs;
        println!(
            "{:>8} KiB  {:>9.1} µs  {:>10.2} GB/s",
            kib,
            secs * 1e6,
            bus / 1e9
        );
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let nccl = args.iter().any(|a| a == "--nccl");
    if std::env::var_os("WORLD_SIZE").is_some() {
        let backend = if nccl { Backend::Nccl } else { Backend::Gloo };
        let o = Options::from_env(backend)?;
        let dev = if nccl {
            Device::Cuda(o.local_rank)
        } else {
            Device::Cpu
        };
        let pg = ProcessGroup::new(&o)?;
        let rows = measure(&pg, &dev)?;
        if pg.rank() == 0 {
            let name = if nccl {
                "NCCL, CUDA tensors"
            } else {
                "ember's CPU backend"
            };
            report(pg.world_size(), name, &rows);
        }
        return Ok(());
    }
    let world = match args.iter().position(|a| a == "--world") {
        Some(i) => args.get(i + 1).and_then(|v| v.parse().ok()).unwrap_or(2),
        None => 2,
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| Error::InvalidArgument {
            op: "all_reduce",
            msg: e.to_string(),
        })?;
    let results: Vec<Result<Vec<(usize, f64)>>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..world)
            .map(|r| {
                s.spawn(move || {
                    let o = Options::new(Backend::Gloo, r, world, "127.0.0.1", port)
                        .timeout(Duration::from_secs(60));
                    measure(&ProcessGroup::new(&o)?, &Device::Cpu)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut results = results.into_iter();
    let rows = results.next().expect("rank 0")?;
    report(world, "ember's CPU backend", &rows);
    println!("(ranks are threads of one process here; under `ember launch` they are processes)");
    Ok(())
}
