//! CPU benchmarks of the foundation ops, with the same workloads as
//! `bench/pytorch/ops.py`:
//! - matmul n×n×n f32 (throughput shown as elements/s = FLOP/s),
//! - elementwise mul of n×n f32 (bytes/s counting two reads and one write),
//! - a 4×4 add repeated (time per op: the per-op overhead), also with autograd
//!   recording, and on `meta`;
//! - cross-entropy against class indices, forward and backward (the loss and the
//!   logits' gradient), on `[1024, 50304]` (a language model's vocabulary) and
//!   `[4096, 1000]` (an image classifier's) f32 logits;
//! - `searchsorted` of 100 000 f32 values in sorted sequences of 1 000 and
//!   100 000 (bucketing data by quantile boundaries).
//!
//! Run: `cargo bench -p ember --bench ops` (or `bench/compare` for both frameworks;
//! `cargo bench -p ember --bench ops -- cross_entropy` and
//! `python3 bench/pytorch/ops.py cross_entropy` for one workload).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ember::{DType, Device, Tensor};
use std::hint::black_box;
use std::time::Duration;

fn matmul(c: &mut Criterion) {
    let dev = Device::Cpu;
    let mut g = c.benchmark_group("matmul_f32");
    for n in [256usize, 1024, 2048] {
        ember::manual_seed(0);
        let a = Tensor::randn([n, n], &dev).unwrap();
        let b = Tensor::randn([n, n], &dev).unwrap();
        g.throughput(Throughput::Elements(2 * (n * n * n) as u64));
        g.sample_size(if n >= 2048 { 10 } else { 30 });
        g.measurement_time(Duration::from_secs(if n >= 1024 { 8 } else { 4 }));
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |bch, _| {
            bch.iter(|| black_box(a.matmul(&b).unwrap()))
        });
    }
    g.finish();
}

fn elementwise(c: &mut Criterion) {
    let dev = Device::Cpu;
    let mut g = c.benchmark_group("mul_f32");
    for n in [1000usize, 4096] {
        let a = Tensor::rand([n, n], &dev).unwrap().add(0.5).unwrap();
        let b = Tensor::rand([n, n], &dev).unwrap().add(0.5).unwrap();
        g.throughput(Throughput::Bytes(3 * 4 * (n * n) as u64));
        g.sample_size(if n >= 4096 { 30 } else { 100 });
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |bch, _| {
            bch.iter(|| black_box(a.mul(&b).unwrap()))
        });
    }
    g.finish();
}

fn tiny_add(c: &mut Criterion) {
    let dev = Device::Cpu;
    let a = Tensor::ones([4, 4], DType::F32, &dev).unwrap();
    let b = Tensor::ones([4, 4], DType::F32, &dev).unwrap();
    c.bench_function("tiny_add_4x4", |bch| {
        bch.iter(|| black_box(a.add(&b).unwrap()))
    });
    // the same with `a` requiring a gradient: the op records its backward node
    let ag = a.copy().unwrap().requires_grad_(true).unwrap();
    c.bench_function("tiny_add_4x4_grad", |bch| {
        bch.iter(|| black_box(ag.add(&b).unwrap()))
    });
    // the same op on `meta`: everything but the arithmetic
    let (am, bm) = (a.to(&Device::Meta).unwrap(), b.to(&Device::Meta).unwrap());
    c.bench_function("tiny_add_4x4_meta", |bch| {
        bch.iter(|| black_box(am.add(&bm).unwrap()))
    });
}

fn cross_entropy(c: &mut Criterion) {
    let dev = Device::Cpu;
    let mut g = c.benchmark_group("cross_entropy_f32");
    for (rows, classes) in [(1024usize, 50304usize), (4096, 1000)] {
        ember::manual_seed(0);
        let x = Tensor::randn([rows, classes], &dev)
            .unwrap()
            .requires_grad_(true)
            .unwrap();
        let y = Tensor::randint(0, classes as i64, [rows], &dev).unwrap();
        // the logits read forward, read and written backward
        g.throughput(Throughput::Bytes(3 * 4 * (rows * classes) as u64));
        g.sample_size(10);
        g.measurement_time(Duration::from_secs(8));
        let id = format!("{rows}x{classes}");
        g.bench_with_input(BenchmarkId::from_parameter(id), &rows, |bch, _| {
            bch.iter(|| {
                x.zero_grad();
                ember::nn::cross_entropy(&x, &y)
                    .unwrap()
                    .backward()
                    .unwrap();
                black_box(x.grad())
            })
        });
    }
    g.finish();
}

fn searchsorted(c: &mut Criterion) {
    let dev = Device::Cpu;
    let mut g = c.benchmark_group("searchsorted_f32");
    for len in [1_000usize, 100_000] {
        ember::manual_seed(0);
        let (seq, _) = Tensor::rand([len], &dev).unwrap().sort(0, false).unwrap();
        let values = Tensor::rand([100_000], &dev).unwrap();
        g.throughput(Throughput::Elements(100_000));
        g.sample_size(10);
        g.bench_with_input(BenchmarkId::from_parameter(len), &len, |bch, _| {
            bch.iter(|| black_box(seq.searchsorted(&values, false).unwrap()))
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    // the report's plots need a system font, which a bare machine may lack
    config = Criterion::default().without_plots();
    targets = matmul, elementwise, tiny_add, cross_entropy, searchsorted
}
criterion_main!(benches);
