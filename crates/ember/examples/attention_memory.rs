//! How much GPU memory a transformer encoder layer needs to train, before running
//! it, with each attention path: the plain one keeps every head's `[L, L]`
//! weights for backward, the memory-saving one keeps only each row's log-sum-exp
//! and recomputes the weights in backward, a group of heads at a time. Under bf16
//! autocast a Hopper GPU runs the fused kernel instead, which keeps the same and
//! makes no `[L, L]` scores at all. The estimates run the training step on the
//! `meta` device and replay its allocations through ember's CUDA caching
//! allocator (a Hopper GPU's cuBLAS workspace included); nothing is computed.
//!
//! `cargo run --release -p ember --example attention_memory`

use ember::memory::Estimator;
use ember::nn::functional::{with_attention_path, AttentionPath};
use ember::nn::{TransformerEncoderLayer, TransformerOptions};
use ember::prelude::*;

fn main() -> ember::Result<()> {
    let (batch, width, heads) = (8, 256, 8);
    println!("training one encoder layer (width {width}, {heads} heads, batch {batch}), Adam:");
    for len in [128usize, 512, 1024, 2048, 4096, 8192] {
        let est = Estimator::new(move |dev: &Device| {
            let opts = TransformerOptions {
                dim_feedforward: 4 * width,
                dropout: 0.0,
                batch_first: true,
                ..Default::default()
            };
            TransformerEncoderLayer::new(width, heads, opts, dev)
        })
        .input([len, width])
        .loss(|y: &Tensor, _targets: &Tensor| y.square()?.mean_all())
        .compute_capability(9);
        let mib = |path, est: &Estimator<TransformerEncoderLayer>| -> ember::Result<f64> {
            let e = with_attention_path(path, || est.estimate(batch))?;
            Ok(e.required() as f64 / (1 << 20) as f64)
        };
        let (plain, saving) = (
            mib(AttentionPath::Math, &est)?,
            mib(AttentionPath::MemoryEfficient, &est)?,
        );
        let est = est.amp(Some(DType::BF16));
        let (saving_bf16, fused_bf16) = (
            mib(AttentionPath::MemoryEfficient, &est)?,
            mib(AttentionPath::Auto, &est)?,
        );
        println!(
            "  length {len:5}: {plain:7.0} MiB keeping the weights, {saving:6.0} MiB recomputing them (ratio {:.1}); \
             bf16 autocast: {saving_bf16:6.0} MiB recomputing, {fused_bf16:6.0} MiB fused",
            plain / saving
        );
    }
    Ok(())
}
