//! A training step on `meta` allocates only metadata on the host: this binary
//! counts every byte the process allocates (its own global allocator) while a
//! step of the digits CNN at a large batch runs on meta, and compares that with the
//! bytes the step's tensors would take (what the meta accounting hook reports).

use ember::meta::{AllocHook, MetaEvent};
use ember::nn::{self, Module};
use ember::optim::{Adam, Optimizer};
use ember::prelude::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The system allocator, counting the bytes handed out.
struct Counting;

static ALLOCATED: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(layout.size(), Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(layout.size(), Ordering::Relaxed);
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATED.fetch_add(new_size, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The bytes of every meta storage made.
#[derive(Default)]
struct WouldTake(AtomicUsize);

impl AllocHook for WouldTake {
    fn alloc(&self, e: &MetaEvent) {
        self.0.fetch_add(e.bytes, Ordering::Relaxed);
    }
    fn free(&self, _: &MetaEvent) {}
}

#[test]
fn a_meta_training_step_allocates_only_metadata() -> Result<()> {
    let dev = Device::Meta;
    let same = Conv2dOptions::default().padding(1);
    let model = nn::Sequential::new()
        .add(nn::Conv2d::new(1, 16, 3, same, &dev)?)
        .add(nn::ReLU)
        .add(nn::Conv2d::new(16, 32, 3, same, &dev)?)
        .add(nn::ReLU)
        .add(nn::MaxPool2d(Pool2dOptions::new(2)))
        .add(nn::Flatten::default())
        .add(nn::Linear::new(32 * 4 * 4, 64, &dev)?)
        .add(nn::ReLU)
        .add(nn::Linear::new(64, 10, &dev)?);
    let mut opt = Adam::new(model.parameters(), 1e-3)?;
    let batch = 8192;
    let x = Tensor::randn([batch, 1, 8, 8], &dev)?;
    let y = Tensor::randint(0, 10, [batch], &dev)?;
    let step = |opt: &mut Adam| -> Result<()> {
        opt.zero_grad();
        let loss = nn::cross_entropy(&model.forward(&x)?, &y)?;
        loss.backward()?;
        opt.step()
    };
    // the first step makes Adam's moments and anything made once
    step(&mut opt)?;
    let would = Arc::new(WouldTake::default());
    let before = ALLOCATED.load(Ordering::Relaxed);
    ember::meta::with_hook(would.clone(), || step(&mut opt))?;
    let host = ALLOCATED.load(Ordering::Relaxed) - before;
    let would = would.0.load(Ordering::Relaxed);
    eprintln!("a meta step: {host} bytes of host memory for {would} bytes of tensors");
    // the activations alone: two conv outputs of batch × 16 × 64 and × 32 × 64 floats
    assert!(would > batch * 48 * 64 * 4, "{would}");
    assert!(host < 1 << 20, "{host} bytes allocated on the host");
    assert!(host * 1000 < would, "{host} of {would}");
    Ok(())
}
