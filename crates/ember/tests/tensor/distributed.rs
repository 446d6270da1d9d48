//! `ember::distributed`: the ranks of a group are threads of this test process,
//! each with its own `ProcessGroup` over TCP on the loopback interface (the same
//! code paths as separate processes; `ember launch` runs those in the command's
//! tests).

use ember::distributed::{Backend, DistributedDataParallel, Options, ProcessGroup, ReduceOp};
use ember::nn::{self, Module};
use ember::optim::{Optimizer, Sgd};
use ember::prelude::*;
use ember::Error;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn opts(rank: usize, world: usize, port: u16) -> Options {
    Options::new(Backend::Gloo, rank, world, "127.0.0.1", port).timeout(Duration::from_secs(30))
}

/// Runs `f` on `world` ranks (threads), each with its group; the results in rank order.
fn ranks<R: Send>(world: usize, f: impl Fn(ProcessGroup) -> Result<R> + Sync) -> Vec<Result<R>> {
    let port = free_port();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|r| {
                let f = &f;
                s.spawn(move || f(ProcessGroup::new(&opts(r, world, port))?))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn all_ok<R>(v: Vec<Result<R>>) -> Vec<R> {
    v.into_iter().map(|r| r.unwrap()).collect()
}

/// Rank `r`'s values in the collective tests: 7 elements, so chunks are uneven.
fn values(r: usize) -> Vec<f32> {
    let r = r as f32;
    vec![r, 2.0 * r, 1.0, -r, 5.0, 0.5 + r, r * r]
}

#[test]
fn all_reduce_combines_every_rank_for_each_world_size() {
    for world in 1..=4 {
        let got = all_ok(ranks(world, |pg| {
            let mut out = Vec::new();
            for op in [
                ReduceOp::Sum,
                ReduceOp::Avg,
                ReduceOp::Max,
                ReduceOp::Min,
                ReduceOp::Product,
            ] {
                let t = Tensor::new(values(pg.rank()).as_slice(), &Device::Cpu)?;
                pg.all_reduce(&t, op)?;
                out.push(t.to_vec1::<f32>()?);
            }
            // fewer elements than ranks: some chunks are empty
            let one = Tensor::new([pg.rank() as f64 + 1.0], &Device::Cpu)?;
            pg.all_reduce(&one, ReduceOp::Sum)?;
            out.push(one.to_vec1::<f32>()?);
            Ok(out)
        }));
        let col = |i: usize| (0..world).map(move |r| values(r)[i]);
        let want: Vec<Vec<f32>> = vec![
            (0..7).map(|i| col(i).sum()).collect(),
            (0..7).map(|i| col(i).sum::<f32>() / world as f32).collect(),
            (0..7).map(|i| col(i).fold(f32::MIN, f32::max)).collect(),
            (0..7).map(|i| col(i).fold(f32::MAX, f32::min)).collect(),
            (0..7).map(|i| col(i).product()).collect(),
            vec![(1..=world).sum::<usize>() as f32],
        ];
        for (r, g) in got.iter().enumerate() {
            assert_eq!(g, &want, "world {world}, rank {r}");
        }
    }
}

#[test]
fn all_reduce_takes_every_dtype() {
    let got = all_ok(ranks(3, |pg| {
        let r = pg.rank() as i64;
        let i = Tensor::new([r, -r, 7], &Device::Cpu)?;
        pg.all_reduce(&i, ReduceOp::Sum)?;
        let m = Tensor::new([r, -r, 7], &Device::Cpu)?;
        pg.all_reduce(&m, ReduceOp::Max)?;
        let b = Tensor::new([r == 1, false, true], &Device::Cpu)?;
        pg.all_reduce(&b, ReduceOp::Sum)?;
        let h = Tensor::new([r as f32, 1.5], &Device::Cpu)?.to_dtype(DType::BF16)?;
        pg.all_reduce(&h, ReduceOp::Sum)?;
        assert_eq!(h.dtype(), DType::BF16);
        let u = Tensor::new([r as u8, 200], &Device::Cpu)?;
        pg.all_reduce(&u, ReduceOp::Min)?;
        Ok((
            i.to_vec1::<i64>()?,
            m.to_vec1::<i64>()?,
            b.to_vec1::<bool>()?,
            h.to_vec1::<f32>()?,
            u.to_vec1::<u8>()?,
        ))
    }));
    for g in got {
        assert_eq!(g.0, vec![3, -3, 21]);
        assert_eq!(g.1, vec![2, 0, 7]);
        assert_eq!(g.2, vec![true, false, true]);
        assert_eq!(g.3, vec![3.0, 4.5]);
        assert_eq!(g.4, vec![0, 200]);
    }
}

#[test]
fn broadcast_all_gather_and_reduce_scatter() {
    let world = 3;
    let got = all_ok(ranks(world, |pg| {
        let r = pg.rank();
        // more than one piece of the broadcast's pipeline (1 MiB)
        let big = Tensor::full([300_000], r as f64, DType::F32, &Device::Cpu)?;
        pg.broadcast(&big, 2)?;
        let big_ok = big.to_vec1::<f32>()?.iter().all(|&x| x == 2.0);
        let small = Tensor::new([r as f32, 10.0 + r as f32], &Device::Cpu)?;
        pg.broadcast(&small, 1)?;
        let g = pg.all_gather(&Tensor::new([r as i64, 10 + r as i64], &Device::Cpu)?)?;
        let gathered: Vec<Vec<i64>> = g
            .iter()
            .map(|t| t.to_vec1::<i64>())
            .collect::<Result<_>>()?;
        // rank r holds 0, 1, ..., 17 + 100 r; block b of rank r's input is rows 2b..2b+2
        let input = Tensor::arange(0f64, 18., &Device::Cpu)?
            .add(100.0 * r as f64)?
            .reshape([world * 2, 3])?;
        let part = pg.reduce_scatter(&input, ReduceOp::Sum)?;
        assert_eq!(part.shape(), &[2, 3]);
        pg.barrier()?;
        Ok((
            big_ok,
            small.to_vec1::<f32>()?,
            gathered,
            part.to_vec2::<f64>()?,
        ))
    }));
    for (r, (big_ok, small, gathered, part)) in got.into_iter().enumerate() {
        assert!(big_ok, "rank {r}");
        assert_eq!(small, vec![1.0, 11.0]);
        assert_eq!(gathered, vec![vec![0, 10], vec![1, 11], vec![2, 12]]);
        // the sum over ranks of rows 2r, 2r+1: 3 x (0..18) + 100 (0 + 1 + 2)
        let want: Vec<Vec<f64>> = (0..2)
            .map(|i| {
                (0..3)
                    .map(|j| 3.0 * ((2 * r + i) * 3 + j) as f64 + 300.0)
                    .collect()
            })
            .collect();
        assert_eq!(part, want, "rank {r}");
    }
}

#[test]
fn bad_groups_and_calls_are_errors() {
    let port = free_port();
    let err = |r: Result<ProcessGroup>| r.unwrap_err().to_string();
    assert!(err(ProcessGroup::new(&opts(0, 0, port))).contains("world size 0"));
    assert!(err(ProcessGroup::new(&opts(2, 2, port))).contains("rank 2 is out of range"));
    assert_eq!("nccl".parse::<Backend>().unwrap(), Backend::Nccl);
    if !ember::cuda::is_available() {
        let o = Options::new(Backend::Nccl, 0, 1, "127.0.0.1", port);
        let e = err(ProcessGroup::new(&o));
        assert!(e.contains("the NCCL backend needs a GPU"), "{e}");
    }
    assert!("mpi".parse::<Backend>().is_err());
    assert_eq!("gloo".parse::<Backend>().unwrap(), Backend::Gloo);

    let pg = ProcessGroup::new(&opts(0, 1, port)).unwrap();
    let meta = Tensor::zeros([2], DType::F32, &Device::Meta).unwrap();
    assert!(pg
        .all_reduce(&meta, ReduceOp::Sum)
        .unwrap_err()
        .to_string()
        .contains("meta"));
    let ints = Tensor::new([1i64, 2], &Device::Cpu).unwrap();
    assert!(pg
        .all_reduce(&ints, ReduceOp::Avg)
        .unwrap_err()
        .to_string()
        .contains("Avg"));
    assert!(pg
        .broadcast(&ints, 1)
        .unwrap_err()
        .to_string()
        .contains("out of range"));
    let scalar = Tensor::new([1f32], &Device::Cpu)
        .unwrap()
        .reshape(&[] as &[usize])
        .unwrap();
    assert!(pg.reduce_scatter(&scalar, ReduceOp::Sum).is_err());
    // an expanded view cannot hold a result: refused before anything is sent
    let expanded = Tensor::new([1f32], &Device::Cpu)
        .unwrap()
        .expand([3])
        .unwrap();
    for e in [
        pg.all_reduce(&expanded, ReduceOp::Sum),
        pg.broadcast(&expanded, 0),
    ] {
        let e = e.unwrap_err().to_string();
        assert!(e.contains("refers to a single memory location"), "{e}");
    }
    // a world of one: collectives are the identity
    pg.all_reduce(&ints, ReduceOp::Sum).unwrap();
    assert_eq!(ints.to_vec1::<i64>().unwrap(), vec![1, 2]);
}

#[test]
fn ranks_that_disagree_fail_on_every_rank_and_break_the_group() {
    let got = ranks(2, |pg| {
        let n = 3 + pg.rank();
        let t = Tensor::zeros([n], DType::F32, &Device::Cpu)?;
        let first = pg.all_reduce(&t, ReduceOp::Sum).unwrap_err().to_string();
        let later = pg.barrier().unwrap_err().to_string();
        Ok((first, later))
    });
    for g in got {
        let (first, later) = g.unwrap();
        assert!(first.contains("the ranks disagree"), "{first}");
        assert!(first.contains("[3]") && first.contains("[4]"), "{first}");
        assert!(later.contains("broken"), "{later}");
    }
    // another collective on one rank
    let got = ranks(2, |pg| {
        let t = Tensor::zeros([3], DType::F32, &Device::Cpu)?;
        let e = if pg.rank() == 0 {
            pg.broadcast(&t, 0)
        } else {
            pg.all_reduce(&t, ReduceOp::Sum)
        };
        Ok(e.unwrap_err().to_string())
    });
    for e in got {
        let e = e.unwrap();
        assert!(
            e.contains("broadcast(src=0)") && e.contains("all_reduce(sum)"),
            "{e}"
        );
    }
}

#[test]
fn a_rendezvous_that_never_completes_times_out_naming_the_missing_ranks() {
    let t0 = Instant::now();
    let o = opts(0, 3, free_port()).timeout(Duration::from_secs(1));
    let e = ProcessGroup::new(&o).unwrap_err().to_string();
    assert!(
        e.contains("1 of 3 ranks joined (missing: rank 1, 2)"),
        "{e}"
    );
    assert!(t0.elapsed() < Duration::from_secs(10));
    // a rank whose rank 0 never comes
    let o = opts(1, 2, free_port()).timeout(Duration::from_secs(1));
    let e = ProcessGroup::new(&o).unwrap_err().to_string();
    assert!(e.contains("could not reach the rendezvous store"), "{e}");
}

#[test]
fn a_port_in_use_is_reported() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let e = ProcessGroup::new(&opts(0, 2, port))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!("port {port}")) && e.contains("in use"),
        "{e}"
    );
}

/// Starts ranks `worlds[r]` (rank `r` with that world size) on one port, 200 ms
/// apart; their errors, and how long the last took.
fn failed_rendezvous(worlds: &[usize], timeout: Duration) -> (Vec<String>, Duration) {
    let port = free_port();
    let t0 = Instant::now();
    let got = std::thread::scope(|s| {
        let hs: Vec<_> = worlds
            .iter()
            .enumerate()
            .map(|(r, &w)| {
                let h = s.spawn(move || ProcessGroup::new(&opts(r, w, port).timeout(timeout)));
                std::thread::sleep(Duration::from_millis(200));
                h
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap().unwrap_err().to_string())
            .collect()
    });
    (got, t0.elapsed())
}

#[test]
fn ranks_that_disagree_on_the_world_or_share_a_rank_are_refused() {
    // the rank that finds the difference reports it: the others fail with it at
    // once, well within the timeout
    let (got, took) = failed_rendezvous(&[2, 3], Duration::from_secs(30));
    for e in &got {
        assert!(e.contains("rank 0 has world size 2, rank 1 has 3"), "{e}");
    }
    assert!(took < Duration::from_secs(10), "{took:?}");
    let (got, took) = failed_rendezvous(&[3, 3, 4], Duration::from_secs(30));
    for e in &got {
        assert!(e.contains("rank 0 has world size 3, rank 2 has 4"), "{e}");
    }
    assert!(took < Duration::from_secs(10), "{took:?}");
    // a timeout names the ranks that did not join, on every rank
    let (got, _) = failed_rendezvous(&[3, 3], Duration::from_secs(1));
    for e in &got {
        assert!(
            e.contains("timed out") && e.contains("2 of 3 ranks joined (missing: rank 2)"),
            "{e}"
        );
    }

    let port = free_port();
    let o = |r| opts(r, 2, port).timeout(Duration::from_secs(3));
    // the first two keep their group (and rank 0 its store) while the third comes
    let hold = |_pg: ProcessGroup| std::thread::sleep(Duration::from_millis(1500));
    let got: Vec<Result<()>> = std::thread::scope(|s| {
        let a = s.spawn(|| ProcessGroup::new(&o(0)).map(hold));
        let b = s.spawn(|| ProcessGroup::new(&o(1)).map(hold));
        std::thread::sleep(Duration::from_millis(300));
        let c = s.spawn(|| ProcessGroup::new(&o(1)).map(|_| ()));
        [a, b, c].into_iter().map(|h| h.join().unwrap()).collect()
    });
    let twice: Vec<String> = got
        .iter()
        .filter_map(|r| r.as_ref().err().map(|e| e.to_string()))
        .collect();
    assert!(
        twice.iter().any(|e| e.contains("rank 1 joined twice")),
        "{twice:?}"
    );
}

#[test]
fn a_group_left_and_joined_again_on_the_same_port_works() {
    for world in [2, 3] {
        let port = free_port();
        let got: Vec<Result<Vec<f32>>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..world)
                .map(|r| {
                    s.spawn(move || {
                        let mut sums = Vec::new();
                        // no pause: a rank may come back while rank 0 still
                        // holds the group before, and rank 0 listens again on
                        // the port it has just closed
                        for _ in 0..4 {
                            let pg = ProcessGroup::new(&opts(r, world, port))?;
                            let t = Tensor::ones([3], DType::F32, &Device::Cpu)?;
                            pg.all_reduce(&t, ReduceOp::Sum)?;
                            sums.push(t.to_vec1::<f32>()?[0]);
                        }
                        Ok(sums)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (r, g) in got.into_iter().enumerate() {
            assert_eq!(g.unwrap(), vec![world as f32; 4], "world {world}, rank {r}");
        }
    }
}

#[test]
#[ignore = "a rank of the_default_group_can_be_destroyed_and_initialized_again, started by it as a process"]
fn worker_reinit() -> Result<()> {
    use ember::distributed as dist;
    let mut sums = Vec::new();
    for _ in 0..3 {
        dist::init_process_group(Backend::Gloo)?;
        let t = Tensor::ones([2], DType::F32, &Device::Cpu)?;
        dist::all_reduce(&t, ReduceOp::Sum)?;
        sums.push(t.to_vec1::<f32>()?[0].to_string());
        dist::destroy_process_group();
    }
    println!("result: {}", sums.join(" "));
    Ok(())
}

#[test]
fn the_default_group_can_be_destroyed_and_initialized_again() {
    for world in [2, 3] {
        let got = processes(world, "distributed::worker_reinit");
        let want = vec![world.to_string(); 3].join(" ");
        assert_eq!(got, vec![want; world], "world {world}");
    }
}

#[test]
fn a_lost_rank_fails_the_others_at_once_naming_it() {
    for (world, lost) in [(3, 2), (4, 1), (2, 0)] {
        let t0 = Instant::now();
        let got = ranks(world, |pg| {
            if pg.rank() == lost {
                drop(pg); // the process exits: its connections close
                return Ok(String::new());
            }
            let t = Tensor::zeros([1000], DType::F32, &Device::Cpu)?;
            Ok(pg.all_reduce(&t, ReduceOp::Sum).unwrap_err().to_string())
        });
        for (r, e) in got.iter().enumerate().filter(|(r, _)| *r != lost) {
            let e = e.as_ref().unwrap();
            assert!(
                e.contains(&format!("lost rank {lost}")),
                "world {world}, rank {r}: {e}"
            );
        }
        // well within the 30 s timeout: the loss is seen, not waited out
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    }
}

#[test]
fn a_stuck_rank_times_out() {
    let port = free_port();
    let o = |r| opts(r, 2, port).timeout(Duration::from_secs(1));
    let got: Vec<Result<String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                s.spawn(move || {
                    let pg = ProcessGroup::new(&o(r))?;
                    if r == 1 {
                        // alive but never joins the collective
                        std::thread::sleep(Duration::from_secs(3));
                        return Ok(String::new());
                    }
                    let t = Tensor::zeros([4], DType::F32, &Device::Cpu)?;
                    Ok(pg.all_reduce(&t, ReduceOp::Sum).unwrap_err().to_string())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let e = got[0].as_ref().unwrap();
    assert!(e.contains("rank 1 sent nothing for 1s"), "{e}");
}

/// A small classifier: registered in the order linear 1, linear 2.
fn mlp(seed_shift: f64) -> Result<nn::Sequential> {
    let m = nn::Sequential::new()
        .add(nn::Linear::new(4, 8, &Device::Cpu)?)
        .add(nn::ReLU)
        .add(nn::Linear::new(8, 3, &Device::Cpu)?);
    // the same values on every thread (the global generator is shared by the
    // test threads), shifted to tell the ranks apart
    ember::no_grad(|| -> Result<()> {
        for (i, p) in m.parameters().iter().enumerate() {
            let n = p.numel();
            let v = Tensor::arange(0f64, n as f64, &Device::Cpu)?
                .mul(0.37)?
                .add(i as f64)?
                .sin()?
                .mul(0.5)?
                .add(seed_shift)?
                .to_dtype(DType::F32)?
                .reshape(p.shape())?;
            p.copy_(&v)?;
        }
        Ok(())
    })?;
    Ok(m)
}

/// Sample `i` of the data set: 4 features and a class.
fn batch(ids: &[usize]) -> Result<(Tensor, Tensor)> {
    let x: Vec<f32> = ids
        .iter()
        .flat_map(|&i| (0..4).map(move |j| ((i * 7 + j * 3) % 11) as f32 / 5.0 - 1.0))
        .collect();
    let y: Vec<i64> = ids.iter().map(|&i| (i % 3) as i64).collect();
    Ok((
        Tensor::new(x.as_slice(), &Device::Cpu)?.reshape([ids.len(), 4])?,
        Tensor::new(y.as_slice(), &Device::Cpu)?,
    ))
}

/// Trains for `steps` steps of `global` samples each; rank `r` of `world` takes
/// samples `r, r + world, ...` of each step's. Returns the parameters.
fn train_steps(
    model: &dyn Module,
    rank: usize,
    world: usize,
    global: usize,
    steps: usize,
) -> Result<Vec<Vec<f32>>> {
    train_on(model, &Device::Cpu, rank, world, global, steps)
}

/// [`train_steps`] with the batches on `dev`.
fn train_on(
    model: &dyn Module,
    dev: &Device,
    rank: usize,
    world: usize,
    global: usize,
    steps: usize,
) -> Result<Vec<Vec<f32>>> {
    let mut opt = Sgd::new(model.parameters(), 0.2)?.momentum(0.9)?;
    for s in 0..steps {
        let ids: Vec<usize> = (s * global..(s + 1) * global)
            .skip(rank)
            .step_by(world)
            .collect();
        let (x, y) = batch(&ids)?;
        let (x, y) = (x.to(dev)?, y.to(dev)?);
        opt.zero_grad();
        nn::cross_entropy(&model.forward(&x)?, &y)?.backward()?;
        opt.step()?;
    }
    model
        .parameters()
        .iter()
        .map(|p| p.flatten_all()?.to_vec1::<f32>())
        .collect()
}

fn assert_params_close(got: &[Vec<f32>], want: &[Vec<f32>], what: &str) {
    for (g, w) in got.iter().zip(want) {
        for (a, b) in g.iter().zip(w) {
            assert!((a - b).abs() <= 2e-5 + 2e-5 * b.abs(), "{what}: {a} vs {b}");
        }
    }
}

#[test]
fn ddp_on_n_ranks_trains_like_one_process_with_n_times_the_batch() {
    let _rng = super::rng_lock();
    let reference = train_steps(&mlp(0.0).unwrap(), 0, 1, 12, 4).unwrap();
    for world in [2, 3, 4] {
        for cap_mb in [25.0, 1e-6] {
            let got = all_ok(ranks(world, |pg| {
                let rank = pg.rank();
                // rank 0's parameters win: the others start elsewhere
                let ddp = DistributedDataParallel::new(mlp(rank as f64)?, Arc::new(pg))?
                    .bucket_cap_mb(cap_mb)?;
                let buckets = ddp.buckets();
                Ok((train_steps(&ddp, rank, world, 12, 4)?, buckets))
            }));
            for (params, buckets) in &got {
                assert_params_close(params, &reference, &format!("world {world}, {cap_mb} MB"));
                if cap_mb < 1.0 {
                    // one bucket per parameter, last registered first
                    let want = [["2.bias"], ["2.weight"], ["0.bias"], ["0.weight"]];
                    assert_eq!(
                        buckets,
                        &want.map(|b| b.map(String::from).to_vec()).to_vec()
                    );
                } else {
                    assert_eq!(buckets.len(), 1);
                }
            }
        }
    }
}

#[test]
fn ddp_no_sync_accumulates_locally_until_a_synced_backward() {
    let _rng = super::rng_lock();
    // reference: one process, the gradient of the two micro-batches' losses
    // summed, over all samples of both ranks (mean per micro-batch of 4)
    let model = mlp(0.0).unwrap();
    let mut want = Vec::new();
    for p in model.parameters() {
        p.zero_grad();
    }
    for m in 0..2 {
        let (x, y) = batch(&(m * 4..m * 4 + 4).collect::<Vec<_>>()).unwrap();
        nn::cross_entropy(&model.forward(&x).unwrap(), &y)
            .unwrap()
            .backward()
            .unwrap();
    }
    for p in model.parameters() {
        want.push(
            p.grad()
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap(),
        );
    }
    let got = all_ok(ranks(2, |pg| {
        let rank = pg.rank();
        let ddp = DistributedDataParallel::new(mlp(0.0)?, Arc::new(pg))?;
        let micro = |m: usize| batch(&(m * 4..m * 4 + 4).skip(rank).step_by(2).collect::<Vec<_>>());
        {
            let _local = ddp.no_sync();
            let (x, y) = micro(0)?;
            nn::cross_entropy(&ddp.forward(&x)?, &y)?.backward()?;
        }
        let local: Vec<Vec<f32>> = ddp
            .parameters()
            .iter()
            .map(|p| p.grad().unwrap().flatten_all()?.to_vec1::<f32>())
            .collect::<Result<_>>()?;
        let (x, y) = micro(1)?;
        nn::cross_entropy(&ddp.forward(&x)?, &y)?.backward()?;
        let synced: Vec<Vec<f32>> = ddp
            .parameters()
            .iter()
            .map(|p| p.grad().unwrap().flatten_all()?.to_vec1::<f32>())
            .collect::<Result<_>>()?;
        Ok((local, synced))
    }));
    // under no_sync the ranks' gradients are their own
    assert_ne!(got[0].0, got[1].0);
    for (_, synced) in &got {
        // each rank's loss is a mean over 2 samples, the reference's over 4:
        // averaging the ranks' gradients gives the reference's
        assert_params_close(synced, &want, "no_sync then sync");
    }
}

/// Two linear layers `a` and `b`: forward is `a(x) + b(x)`, or `a(x)` while
/// `use_b` is off.
struct Switch {
    a: nn::Linear,
    b: nn::Linear,
    use_b: std::sync::atomic::AtomicBool,
}

impl Switch {
    /// Parameter `i` (in the order a.weight, a.bias, b.weight, b.bias) holds
    /// `0.1 * arange(numel) + i + rank`.
    fn new(rank: usize) -> Result<Switch> {
        let m = Switch {
            a: nn::Linear::new(2, 2, &Device::Cpu)?,
            b: nn::Linear::new(2, 2, &Device::Cpu)?,
            use_b: true.into(),
        };
        ember::no_grad(|| -> Result<()> {
            for (i, p) in m.parameters().iter().enumerate() {
                let v = Tensor::arange(0f32, p.numel() as f32, &Device::Cpu)?
                    .mul(0.1)?
                    .add((i + rank) as f64)?
                    .reshape(p.shape())?;
                p.copy_(&v)?;
            }
            Ok(())
        })?;
        Ok(m)
    }

    fn use_b(&self, on: bool) {
        self.use_b.store(on, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Module for Switch {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = self.a.forward(x)?;
        if self.use_b.load(std::sync::atomic::Ordering::SeqCst) {
            y.add(&self.b.forward(x)?)
        } else {
            Ok(y)
        }
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v: Vec<(String, Tensor)> = self
            .a
            .named_parameters()
            .into_iter()
            .map(|(n, p)| (format!("a.{n}"), p))
            .collect();
        v.extend(
            self.b
                .named_parameters()
                .into_iter()
                .map(|(n, p)| (format!("b.{n}"), p)),
        );
        v
    }
}

/// `t`'s gradient, flattened (`None` when it has none).
fn grad_of(t: &Tensor) -> Result<Option<Vec<f32>>> {
    t.grad()
        .map(|g| g.flatten_all()?.to_vec1::<f32>())
        .transpose()
}

#[test]
fn ddp_reduces_parameters_used_only_under_no_sync() {
    // the values PyTorch 2 gives (gloo, find_unused_parameters=True)
    let got = all_ok(ranks(2, |pg| {
        let r = pg.rank();
        let x = Tensor::new([[1.0 + r as f32, 2.0], [0.5, -(r as f32)]], &Device::Cpu)?;
        let pg = Arc::new(pg);
        let ddp =
            DistributedDataParallel::new(Switch::new(r)?, pg.clone())?.find_unused_parameters(true);
        let m = ddp.module();
        // b is used in the micro-step under no_sync only: its accumulated
        // gradient is averaged at the synced backward all the same
        {
            let _local = ddp.no_sync();
            ddp.forward(&x)?.sum_all()?.backward()?;
        }
        m.use_b(false);
        ddp.forward(&x.mul(2.0)?)?.sum_all()?.backward()?;
        let synced = [
            grad_of(&m.a.weight)?,
            grad_of(&m.b.weight)?,
            grad_of(m.b.bias.as_ref().unwrap())?,
        ];
        // that use is forgotten after the reduction: b unused again keeps no
        // gradient
        for p in ddp.parameters() {
            p.set_grad(None)?;
        }
        ddp.forward(&x.mul(3.0)?)?.sum_all()?.backward()?;
        let after = [grad_of(&m.a.weight)?, grad_of(&m.b.weight)?];
        // used under no_sync on rank 1 only: rank 0 takes the average too
        let ddp = DistributedDataParallel::new(Switch::new(r)?, pg)?.find_unused_parameters(true);
        {
            let _local = ddp.no_sync();
            ddp.module().use_b(r == 1);
            ddp.forward(&x)?.sum_all()?.backward()?;
        }
        ddp.module().use_b(false);
        ddp.forward(&x)?.sum_all()?.backward()?;
        let one_rank = grad_of(&ddp.module().b.weight)?;
        Ok((synced, after, one_rank))
    }));
    for (synced, after, one_rank) in got {
        assert_eq!(synced[0].as_deref(), Some(&[6.0, 4.5, 6.0, 4.5][..]));
        assert_eq!(synced[1].as_deref(), Some(&[2.0, 1.5, 2.0, 1.5][..]));
        assert_eq!(synced[2].as_deref(), Some(&[2.0, 2.0][..]));
        assert_eq!(after[0].as_deref(), Some(&[6.0, 4.5, 6.0, 4.5][..]));
        assert_eq!(after[1], None);
        assert_eq!(one_rank.as_deref(), Some(&[1.25, 0.5, 1.25, 0.5][..]));
    }
}

#[test]
fn ddp_takes_rank_0s_buffers_at_the_forward_after_a_synced_one_in_eval_mode_too() {
    // the running means PyTorch 2 gives (gloo, broadcast_buffers=True), rounded
    // to 5 decimals
    let got = all_ok(ranks(2, |pg| {
        let r = pg.rank() as f32;
        let dev = &Device::Cpu;
        let lin = nn::Linear::new(2, 2, dev)?;
        ember::no_grad(|| -> Result<()> {
            lin.weight
                .copy_(&Tensor::new([[1.0f32, 0.5], [-0.5, 2.0]], dev)?)?;
            lin.bias
                .as_ref()
                .unwrap()
                .copy_(&Tensor::new([0.1f32, 0.1], dev)?)?;
            Ok(())
        })?;
        let model = nn::Sequential::new()
            .add(lin)
            .add(nn::BatchNorm1d::new(2, dev)?);
        let mut ddp = DistributedDataParallel::new(model, Arc::new(pg))?;
        let xs = |step: f32| {
            Tensor::new(
                [[1.0 + r + step, 2.0], [0.5, -r], [3.0, 2.0 * r]],
                &Device::Cpu,
            )
        };
        let mean = |d: &DistributedDataParallel<nn::Sequential>| -> Result<Vec<f32>> {
            let (_, t) = d
                .named_buffers()
                .into_iter()
                .find(|(n, _)| n.ends_with("running_mean"))
                .unwrap();
            t.to_vec1::<f32>()
        };
        let one = Tensor::new([[1.0f32, 1.0]], dev)?;
        let mut means = Vec::new();
        let mut outs = Vec::new();
        for step in 0..2 {
            ddp.forward(&xs(step as f32)?)?.sum_all()?.backward()?;
            means.push(mean(&ddp)?);
        }
        // the forward after a synced training one takes rank 0's buffers, in
        // evaluation mode and without gradients too
        ddp.eval();
        outs.push(
            ember::no_grad(|| ddp.forward(&one))?
                .flatten_all()?
                .to_vec1::<f32>()?,
        );
        means.push(mean(&ddp)?);
        // one under no_sync does not make the next forward take them
        ddp.train();
        ddp.forward(&xs(2.0)?)?.sum_all()?.backward()?;
        {
            let _local = ddp.no_sync();
            ddp.forward(&xs(3.0)?)?.sum_all()?.backward()?;
        }
        ddp.eval();
        ember::no_grad(|| ddp.forward(&one))?;
        means.push(mean(&ddp)?);
        Ok((means, outs))
    }));
    let want_means: [[[f32; 2]; 4]; 2] = [
        [
            [0.19333, 0.06833],
            [0.40067, 0.11317],
            [0.40067, 0.11317],
            [0.85187, 0.1415],
        ],
        [
            [0.24333, 0.11833],
            [0.45067, 0.16317],
            [0.40067, 0.11317],
            // taken from rank 0 before the forward under no_sync, then updated
            // by it; not taken again at the evaluation after it
            [0.90187, 0.1915],
        ],
    ];
    for (r, (means, outs)) in got.iter().enumerate() {
        for (i, (g, w)) in means.iter().zip(&want_means[r]).enumerate() {
            for (a, b) in g.iter().zip(w) {
                assert!(
                    (a - b).abs() < 1e-4,
                    "rank {r}, running mean {i}: {g:?} vs {w:?}"
                );
            }
        }
        for (a, b) in outs[0].iter().zip([1.11315f32, 1.0623]) {
            assert!((a - b).abs() < 1e-4, "rank {r}: {outs:?}");
        }
    }
}

/// Two linear layers of which forward uses only the first.
struct HalfUsed {
    a: nn::Linear,
    b: nn::Linear,
}

impl Module for HalfUsed {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.a.forward(x)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v: Vec<(String, Tensor)> = self
            .a
            .named_parameters()
            .into_iter()
            .map(|(n, p)| (format!("a.{n}"), p))
            .collect();
        v.extend(
            self.b
                .named_parameters()
                .into_iter()
                .map(|(n, p)| (format!("b.{n}"), p)),
        );
        v
    }
}

#[test]
fn ddp_names_parameters_without_gradients_unless_told_to_find_them() {
    let _rng = super::rng_lock();
    let got = ranks(2, |pg| {
        let m = HalfUsed {
            a: nn::Linear::new(4, 3, &Device::Cpu)?,
            b: nn::Linear::new(4, 3, &Device::Cpu)?,
        };
        let ddp = DistributedDataParallel::new(m, Arc::new(pg))?;
        let (x, y) = batch(&[0, 1])?;
        let e = nn::cross_entropy(&ddp.forward(&x)?, &y)?
            .backward()
            .unwrap_err()
            .to_string();
        Ok(e)
    });
    for e in got {
        let e = e.unwrap();
        assert!(
            e.contains("received no gradient") && e.contains("b.weight, b.bias"),
            "{e}"
        );
        assert!(e.contains("find_unused_parameters(true)"), "{e}");
    }
    let got = all_ok(ranks(2, |pg| {
        let m = HalfUsed {
            a: nn::Linear::new(4, 3, &Device::Cpu)?,
            b: nn::Linear::new(4, 3, &Device::Cpu)?,
        };
        let ddp = DistributedDataParallel::new(m, Arc::new(pg))?.find_unused_parameters(true);
        let (x, y) = batch(&[pg_rank(&ddp)])?;
        nn::cross_entropy(&ddp.forward(&x)?, &y)?.backward()?;
        // no rank used b: its gradients stay None, as PyTorch leaves them
        assert!(ddp.module().b.weight.grad().is_none());
        assert!(ddp.module().b.bias.as_ref().unwrap().grad().is_none());
        let ga = ddp.module().a.weight.grad().unwrap().to_vec2::<f32>()?;
        Ok(ga)
    }));
    assert_eq!(
        got[0], got[1],
        "the used parameters' gradients are averaged"
    );
}

fn pg_rank<M: Module>(d: &DistributedDataParallel<M>) -> usize {
    d.process_group().rank()
}

#[test]
fn ddp_refuses_models_that_differ_between_ranks() {
    let _rng = super::rng_lock();
    let got = ranks(2, |pg| {
        let width = 3 + pg.rank();
        let m = nn::Linear::new(4, width, &Device::Cpu)?;
        Ok(DistributedDataParallel::new(m, Arc::new(pg))
            .err()
            .map(|e| e.to_string()))
    });
    for e in got {
        let e = e.unwrap().expect("an error");
        assert!(e.contains("model differs"), "{e}");
    }
}

/// The NCCL backend on simulated GPUs (CI's simulator passes): each rank is a
/// process of its own running `worker` (an ignored test of this binary), with
/// its own simulated GPU, as ranks on separate GPUs are. Returns each rank's
/// line of results (what the worker prints after `result: `).
fn nccl_processes(world: usize, worker: &str) -> Option<Vec<String>> {
    if !ember::cuda::is_simulated() {
        println!(
            "skipped: the NCCL backend's tests run on the CUDA simulator (EMBER_CUDA_SIMULATOR)"
        );
        return None;
    }
    Some(processes(world, worker))
}

/// Runs `worker` (an ignored test of this binary) as `world` processes, one per
/// rank, with the environment `ember launch` sets. Returns each rank's line of
/// results (what the worker prints after `result: `).
fn processes(world: usize, worker: &str) -> Vec<String> {
    let exe = std::env::current_exe().unwrap();
    let port = free_port().to_string();
    let children: Vec<_> = (0..world)
        .map(|r| {
            std::process::Command::new(&exe)
                .args([
                    worker,
                    "--exact",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .envs([
                    ("RANK", r.to_string().as_str()),
                    ("WORLD_SIZE", world.to_string().as_str()),
                    ("MASTER_ADDR", "127.0.0.1"),
                    ("MASTER_PORT", port.as_str()),
                    ("EMBER_DIST_TIMEOUT", "60"),
                ])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    children
        .into_iter()
        .enumerate()
        .map(|(r, c)| {
            let out = c.wait_with_output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "rank {r} failed:\n{stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            stdout
                .lines()
                .find_map(|l| l.split_once("result: ").map(|(_, r)| r))
                .unwrap_or_else(|| panic!("rank {r} printed no result:\n{stdout}"))
                .to_string()
        })
        .collect()
}

/// The group a worker process joins (NCCL, from the environment the test sets).
fn nccl_group() -> Result<ProcessGroup> {
    ProcessGroup::new(&Options::from_env(Backend::Nccl)?)
}

#[test]
#[ignore = "a rank of nccl_collectives_on_simulated_gpus, started by it as a process"]
fn nccl_worker_collectives() -> Result<()> {
    let pg = nccl_group()?;
    let dev = &Device::Cuda(0);
    let r = pg.rank();
    let t = Tensor::new(values(r).as_slice(), dev)?;
    pg.all_reduce(&t, ReduceOp::Sum)?;
    let max = Tensor::new(values(r).as_slice(), dev)?.to_dtype(DType::BF16)?;
    pg.all_reduce(&max, ReduceOp::Max)?;
    // not contiguous: through a copy
    let strided = Tensor::arange(0f32, 6., dev)?
        .add(r as f64)?
        .reshape([2, 3])?
        .t()?;
    pg.broadcast(&strided, 1)?;
    let g = pg.all_gather(&Tensor::new([r as i64, 10 + r as i64], dev)?)?;
    let input = Tensor::arange(0f64, 18., dev)?
        .add(100.0 * r as f64)?
        .reshape([6, 3])?;
    let part = pg.reduce_scatter(&input, ReduceOp::Sum)?;
    // a CPU tensor goes through the CPU backend's ring
    let cpu = Tensor::new([r as f32], &Device::Cpu)?;
    pg.all_reduce(&cpu, ReduceOp::Sum)?;
    let gathered = g
        .iter()
        .map(|t| t.to_vec1::<i64>())
        .collect::<Result<Vec<_>>>()?;
    println!(
        "result: {:?}",
        (
            t.to_vec1::<f32>()?,
            max.to_vec1::<f32>()?,
            strided.to_vec2::<f32>()?,
            gathered,
            part.to_vec2::<f64>()?,
            cpu.to_vec1::<f32>()?,
            g[0].device().to_string(),
        )
    );
    Ok(())
}

#[test]
fn nccl_collectives_on_simulated_gpus() {
    let Some(got) = nccl_processes(3, "distributed::nccl_worker_collectives") else {
        return;
    };
    let col = |i: usize| (0..3).map(move |r| values(r)[i]);
    for (r, g) in got.into_iter().enumerate() {
        let part: Vec<Vec<f64>> = (0..2)
            .map(|i| {
                (0..3)
                    .map(|j| 3.0 * ((2 * r + i) * 3 + j) as f64 + 300.0)
                    .collect()
            })
            .collect();
        let want = (
            (0..7).map(|i| col(i).sum()).collect::<Vec<f32>>(),
            (0..7)
                .map(|i| col(i).fold(f32::MIN, f32::max))
                .collect::<Vec<f32>>(),
            vec![vec![1f32, 4.], vec![2., 5.], vec![3., 6.]],
            vec![vec![0i64, 10], vec![1, 11], vec![2, 12]],
            part,
            vec![3f32],
            "cuda:0".to_string(),
        );
        assert_eq!(g, format!("{want:?}"), "rank {r}");
    }
}

#[test]
#[ignore = "a rank of nccl_calls_that_disagree_fail_before_any_data_moves, started by it as a process"]
fn nccl_worker_disagree() -> Result<()> {
    let pg = nccl_group()?;
    let t = Tensor::zeros([3 + pg.rank()], DType::F32, &Device::Cuda(0))?;
    let e = pg.all_reduce(&t, ReduceOp::Sum).unwrap_err().to_string();
    println!("result: {e}");
    Ok(())
}

#[test]
fn nccl_calls_that_disagree_fail_before_any_data_moves() {
    let Some(got) = nccl_processes(2, "distributed::nccl_worker_disagree") else {
        return;
    };
    for e in got {
        assert!(
            e.contains("the ranks disagree") && e.contains("on cuda"),
            "{e}"
        );
    }
}

#[test]
#[ignore = "a rank of ddp_over_nccl_on_simulated_gpus_trains_like_one_process, started by it as a process"]
fn nccl_worker_ddp() -> Result<()> {
    let pg = nccl_group()?;
    let dev = Device::Cuda(0);
    let rank = pg.rank();
    let mut m = mlp(rank as f64)?;
    m.to_device(&dev)?;
    let ddp = DistributedDataParallel::new(m, Arc::new(pg))?.bucket_cap_mb(1e-6)?;
    println!("result: {:?}", train_on(&ddp, &dev, rank, 2, 12, 3)?);
    Ok(())
}

#[test]
fn ddp_over_nccl_on_simulated_gpus_trains_like_one_process() {
    let Some(got) = nccl_processes(2, "distributed::nccl_worker_ddp") else {
        return;
    };
    let reference = train_steps(&mlp(0.0).unwrap(), 0, 1, 12, 3).unwrap();
    for g in got {
        let params: Vec<Vec<f32>> = g
            .trim_matches(|c| c == '[' || c == ']')
            .split("], [")
            .map(|row| row.split(", ").map(|v| v.parse().unwrap()).collect())
            .collect();
        assert_params_close(&params, &reference, "DDP over NCCL");
    }
}

#[test]
fn two_ddp_models_on_one_group_in_one_backward() {
    // like a GAN's or twin critics' losses summed: both models' buckets go
    // through the group's one queue, in the same order on every rank
    let reference = {
        let (a, b) = (mlp(0.0).unwrap(), mlp(0.5).unwrap());
        let (x, y) = batch(&(0..8).collect::<Vec<_>>()).unwrap();
        let loss = nn::cross_entropy(&a.forward(&x).unwrap(), &y)
            .unwrap()
            .add(&nn::cross_entropy(&b.forward(&x).unwrap(), &y).unwrap())
            .unwrap();
        loss.backward().unwrap();
        [a, b].map(|m| {
            m.parameters()
                .iter()
                .map(|p| {
                    p.grad()
                        .unwrap()
                        .flatten_all()
                        .unwrap()
                        .to_vec1::<f32>()
                        .unwrap()
                })
                .collect::<Vec<_>>()
        })
    };
    let got = all_ok(ranks(2, |pg| {
        let rank = pg.rank();
        let pg = Arc::new(pg);
        let a = DistributedDataParallel::new(mlp(0.0)?, pg.clone())?.bucket_cap_mb(1e-6)?;
        let b = DistributedDataParallel::new(mlp(0.5)?, pg)?.bucket_cap_mb(1e-6)?;
        let (x, y) = batch(&(0..8).skip(rank).step_by(2).collect::<Vec<_>>())?;
        let loss = nn::cross_entropy(&a.forward(&x)?, &y)?
            .add(&nn::cross_entropy(&b.forward(&x)?, &y)?)?;
        loss.backward()?;
        let grads = |m: &dyn Module| -> Result<Vec<Vec<f32>>> {
            m.parameters()
                .iter()
                .map(|p| p.grad().unwrap().flatten_all()?.to_vec1::<f32>())
                .collect()
        };
        Ok([grads(&a)?, grads(&b)?])
    }));
    for g in got {
        assert_params_close(&g[0], &reference[0], "model a");
        assert_params_close(&g[1], &reference[1], "model b");
    }
}

#[test]
fn ddp_recovers_from_a_backward_that_failed() {
    let got = all_ok(ranks(2, |pg| {
        let rank = pg.rank();
        let ddp = DistributedDataParallel::new(mlp(0.0)?, Arc::new(pg))?.bucket_cap_mb(1e-6)?;
        // a hook that fails the first backward on every rank, after the last
        // layer's buckets have been handed over
        let first = ddp.parameters()[0].clone();
        let fail = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let f = fail.clone();
        let h = first.register_post_accumulate_grad_hook(move |_| {
            if f.swap(false, std::sync::atomic::Ordering::SeqCst) {
                return Err(Error::InvalidArgument {
                    op: "test",
                    msg: "a failure in backward".into(),
                });
            }
            Ok(())
        })?;
        let (x, y) = batch(&(0..8).skip(rank).step_by(2).collect::<Vec<_>>())?;
        let e = nn::cross_entropy(&ddp.forward(&x)?, &y)?
            .backward()
            .unwrap_err();
        assert!(e.to_string().contains("a failure in backward"), "{e}");
        // the next iteration starts afresh and averages as usual
        for p in ddp.parameters() {
            p.zero_grad();
        }
        nn::cross_entropy(&ddp.forward(&x)?, &y)?.backward()?;
        h.remove();
        ddp.parameters()
            .iter()
            .map(|p| p.grad().unwrap().flatten_all()?.to_vec1::<f32>())
            .collect::<Result<Vec<_>>>()
    }));
    assert_eq!(got[0], got[1]);
}

#[test]
fn large_calls_that_disagree_fail_at_once() {
    // frames far larger than the socket buffers: the writer threads must not keep
    // the ranks waiting on each other
    let t0 = Instant::now();
    let got = ranks(2, |pg| {
        let t = Tensor::zeros([(1 << 22) + pg.rank()], DType::F32, &Device::Cpu)?;
        Ok(pg.all_reduce(&t, ReduceOp::Sum).unwrap_err().to_string())
    });
    for e in got {
        let e = e.unwrap();
        assert!(e.contains("disagree") || e.contains("lost rank"), "{e}");
    }
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
}

#[test]
fn a_timeout_of_forever_is_accepted() {
    let o = opts(0, 1, free_port()).timeout(Duration::MAX);
    let pg = ProcessGroup::new(&o).unwrap();
    pg.barrier().unwrap();
}

#[test]
#[ignore = "a rank of the_nccl_watchdog_reports_a_rank_that_exits, started by it as a process"]
fn nccl_worker_exit() -> Result<()> {
    let pg = nccl_group()?;
    let t = Tensor::ones([4], DType::F32, &Device::Cuda(0))?;
    pg.all_reduce(&t, ReduceOp::Sum)?;
    if pg.rank() == 1 {
        println!("result: leaving");
        // exits without leaving the group (a crash, a kill)
        std::process::exit(0);
    }
    // no collective meanwhile: the watchdog learns of the loss from the store
    std::thread::sleep(Duration::from_millis(1500));
    let e = pg.all_reduce(&t, ReduceOp::Sum).unwrap_err().to_string();
    println!("result: {e}");
    Ok(())
}

#[test]
fn the_nccl_watchdog_reports_a_rank_that_exits() {
    let Some(got) = nccl_processes(2, "distributed::nccl_worker_exit") else {
        return;
    };
    assert_eq!(got[1], "leaving");
    assert!(
        got[0].contains("aborted: lost rank 1: its process exited"),
        "{}",
        got[0]
    );
}

#[test]
fn tensors_on_different_kinds_of_device_across_ranks_are_refused() {
    let Some(gpu) = crate::gpu("distributed::mixed_devices") else {
        return;
    };
    let got = ranks(2, |pg| {
        let dev = if pg.rank() == 0 { Device::Cpu } else { gpu };
        let t = Tensor::zeros([3], DType::F32, &dev)?;
        Ok(pg.all_reduce(&t, ReduceOp::Sum).unwrap_err().to_string())
    });
    for e in got {
        let e = e.unwrap();
        assert!(
            e.contains("disagree") && e.contains("on cpu") && e.contains("on cuda"),
            "{e}"
        );
    }
}
