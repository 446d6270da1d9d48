//! How long a memory estimate takes: `Estimator::estimate` for the model zoo's
//! ImageNet models at batch 128 (two training steps with SGD and momentum, built
//! and run on `meta`, replayed through the caching allocator), and a `max_batch`
//! search against 80 GB.
//!
//! Run: `cargo bench -p ember --bench estimate`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use ember::memory::Estimator;
use ember::models;
use ember::optim::{Optimizer, Sgd};
use std::hint::black_box;
use std::time::Duration;

fn estimator(name: &'static str) -> Estimator<Box<dyn ember::nn::Module>> {
    Estimator::new(move |dev| models::by_name(name, 1000, dev))
        .input([3, 224, 224])
        .optimizer(|p| {
            let o: Box<dyn Optimizer> = Box::new(Sgd::new(p, 0.01)?.momentum(0.9)?);
            Ok(o)
        })
        .compute_capability(9)
}

fn estimate(c: &mut Criterion) {
    let mut g = c.benchmark_group("estimate_b128");
    g.sample_size(20);
    g.measurement_time(Duration::from_secs(4));
    for name in ["alexnet", "vgg16", "resnet18", "resnet50"] {
        let est = estimator(name);
        g.bench_with_input(BenchmarkId::from_parameter(name), &name, |b, _| {
            b.iter(|| black_box(est.estimate(128).unwrap()))
        });
    }
    g.finish();
}

fn max_batch(c: &mut Criterion) {
    let mut g = c.benchmark_group("max_batch_80GB");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(8));
    for name in ["vgg16", "resnet50"] {
        let est = estimator(name);
        g.bench_with_input(BenchmarkId::from_parameter(name), &name, |b, _| {
            b.iter(|| black_box(est.max_batch(128, 80_000_000_000, 1 << 16).unwrap()))
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    // the report's plots need a system font, which a bare machine may lack
    config = Criterion::default().without_plots();
    targets = estimate, max_batch
}
criterion_main!(benches);
