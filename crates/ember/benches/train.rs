//! Training-step benchmarks on the CPU, with the same workloads as
//! `bench/pytorch/train.py`:
//! - the Iris lesson: 4 → 8 → 9 → 3 MLP (ReLU), cross-entropy, Adam lr 0.01, 100
//!   full-batch epochs on the 120 training rows (pure per-op overhead);
//! - one step (forward, backward, Adam) of a 784 → 1024 → 1024 → 10 MLP on a batch
//!   of 256 (throughput in samples/s);
//! - one step of an MNIST-sized CNN (PyTorch's MNIST example without dropout:
//!   conv 1→32 3×3, ReLU, conv 32→64 3×3, ReLU, max-pool 2, fc 9216→128, ReLU,
//!   fc 128→10) on a batch of 64 random 1×28×28 images, Adam;
//! - one epoch of `ember train digits` (the CNN 1→16→32 3×3 same-padded convs,
//!   pool, 512→64→10, on the 1437 training images, batches of 64, Adam).
//!
//! Run: `cargo bench -p ember --bench train` (or `bench/compare`).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ember::data::{DataLoader, TensorDataset};
use ember::nn::{self, Module};
use ember::optim::{Adam, Optimizer};
use ember::{Conv2dOptions, Device, Pool2dOptions, Tensor};
use std::hint::black_box;
use std::time::Duration;

fn mlp(sizes: &[usize], dev: &Device) -> nn::Sequential {
    ember::models::mlp(sizes, dev).unwrap()
}

fn step(model: &nn::Sequential, opt: &mut Adam, x: &Tensor, y: &Tensor) -> f32 {
    let loss = nn::cross_entropy(&model.forward(x).unwrap(), y).unwrap();
    opt.zero_grad();
    loss.backward().unwrap();
    opt.step().unwrap();
    loss.item::<f32>().unwrap()
}

fn iris(c: &mut Criterion) {
    let dev = Device::Cpu;
    let path = ember::data::find_data_file("iris.csv").unwrap();
    let (x, y) = ember::data::load_iris(path).unwrap();
    // the first 120 rows of a seeded permutation, as in the lesson's 80/20 split
    ember::manual_seed(32);
    let perm = Tensor::randperm(150, &dev).unwrap();
    let train = perm.narrow(0, 0, 120).unwrap();
    let (x, y) = (
        x.index_select(0, &train).unwrap(),
        y.index_select(0, &train).unwrap(),
    );
    let mut g = c.benchmark_group("iris");
    g.sample_size(50);
    g.bench_function("100_epochs", |b| {
        b.iter(|| {
            ember::manual_seed(32);
            let model = mlp(&[4, 8, 9, 3], &dev);
            let mut opt = Adam::new(model.parameters(), 0.01).unwrap();
            let mut last = 0.0;
            for _ in 0..100 {
                last = step(&model, &mut opt, &x, &y);
            }
            black_box(last)
        })
    });
    g.finish();
}

fn mlp_step(c: &mut Criterion) {
    let dev = Device::Cpu;
    ember::manual_seed(0);
    let model = mlp(&[784, 1024, 1024, 10], &dev);
    let mut opt = Adam::new(model.parameters(), 1e-3).unwrap();
    let x = Tensor::randn([256, 784], &dev).unwrap();
    let y = Tensor::randint(0, 10, [256], &dev).unwrap();
    let mut g = c.benchmark_group("mlp_784_1024_1024_10");
    g.throughput(Throughput::Elements(256));
    g.measurement_time(Duration::from_secs(8));
    g.bench_function("adam_step_b256", |b| {
        b.iter(|| black_box(step(&model, &mut opt, &x, &y)))
    });
    g.finish();
}

fn mnist_cnn(dev: &Device) -> nn::Sequential {
    let o = Conv2dOptions::default();
    nn::Sequential::new()
        .add(nn::Conv2d::new(1, 32, 3, o, dev).unwrap())
        .add(nn::ReLU)
        .add(nn::Conv2d::new(32, 64, 3, o, dev).unwrap())
        .add(nn::ReLU)
        .add(nn::MaxPool2d(Pool2dOptions::new(2)))
        .add(nn::Flatten::default())
        .add(nn::Linear::new(9216, 128, dev).unwrap())
        .add(nn::ReLU)
        .add(nn::Linear::new(128, 10, dev).unwrap())
}

fn digits_cnn(dev: &Device) -> nn::Sequential {
    ember::models::digits_cnn(dev).unwrap()
}

fn cnn(c: &mut Criterion) {
    let dev = Device::Cpu;
    ember::manual_seed(0);
    let model = mnist_cnn(&dev);
    let mut opt = Adam::new(model.parameters(), 1e-3).unwrap();
    let x = Tensor::randn([64, 1, 28, 28], &dev).unwrap();
    let y = Tensor::randint(0, 10, [64], &dev).unwrap();
    let mut g = c.benchmark_group("cnn_mnist");
    g.throughput(Throughput::Elements(64));
    g.measurement_time(Duration::from_secs(8));
    g.bench_function("adam_step_b64", |b| {
        b.iter(|| black_box(step(&model, &mut opt, &x, &y)))
    });
    g.finish();

    let (x, y) =
        ember::data::load_digits(ember::data::find_data_file("digits.csv").unwrap()).unwrap();
    let x = x.div(16.0).unwrap().reshape([1797, 1, 8, 8]).unwrap();
    let (x_train, _, y_train, _) = ember::data::train_test_split(&x, &y, 0.2, 32).unwrap();
    let n = y_train.numel();
    let loader = DataLoader::new(TensorDataset::new(x_train, y_train).unwrap(), 64)
        .unwrap()
        .shuffle(32)
        .prefetch(0);
    ember::manual_seed(32);
    let model = digits_cnn(&dev);
    let mut opt = Adam::new(model.parameters(), 1e-3).unwrap();
    let mut g = c.benchmark_group("digits_cnn");
    g.throughput(Throughput::Elements(n as u64));
    g.sample_size(20);
    g.measurement_time(Duration::from_secs(8));
    g.bench_function("epoch_b64", |b| {
        b.iter(|| {
            let mut last = 0.0;
            for batch in loader.iter() {
                let (x, y) = batch.unwrap();
                last = step(&model, &mut opt, &x, &y);
            }
            black_box(last)
        })
    });
    g.finish();
}

/// One training step of the digits CNN on `meta` (no values: validation, shapes,
/// autograd and the optimizer's bookkeeping only): what a memory estimate costs.
fn meta_step(c: &mut Criterion) {
    let dev = Device::Meta;
    let model = digits_cnn(&dev);
    let mut opt = Adam::new(model.parameters(), 1e-3).unwrap();
    let x = Tensor::randn([64, 1, 8, 8], &dev).unwrap();
    let y = Tensor::randint(0, 10, [64], &dev).unwrap();
    let mut g = c.benchmark_group("digits_cnn");
    g.bench_function("meta_step_b64", |b| {
        b.iter(|| {
            opt.zero_grad();
            let loss = nn::cross_entropy(&model.forward(&x).unwrap(), &y).unwrap();
            loss.backward().unwrap();
            opt.step().unwrap();
            black_box(loss)
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    // the report's plots need a system font, which a bare machine may lack
    config = Criterion::default().without_plots();
    targets = iris, mlp_step, cnn, meta_step
}
criterion_main!(benches);
