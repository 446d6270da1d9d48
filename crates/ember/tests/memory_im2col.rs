//! The memory estimate of ember's own im2col convolutions: GPUs convolve through
//! cuDNN by default (`tests/memory.rs` compares that path), so this process
//! switches cuDNN off and compares the estimate with the caching allocator's
//! measured peak where the patch matrix, the half-precision convolutions'
//! float32 copies and the grouped products are allocated. A binary of its own
//! because the switch is global. It skips, saying why, without a GPU (CI runs it
//! on the CUDA simulator).

mod common;
#[path = "common/training.rs"]
mod training;

use ember::memory::Estimator;
use ember::prelude::*;
use training::*;

#[test]
fn the_im2col_estimate_matches_the_allocators_peak() -> Result<()> {
    let Some(dev) = common::gpu("the_im2col_estimate_matches_the_allocators_peak") else {
        return Ok(());
    };
    ember::cuda::cudnn::set_enabled(false);
    // the training cases whose convolutions take im2col's distinct buffers: the
    // patch matrix, float32 copies of bf16 operands, batch norm, groups
    let im2col = [
        "digits cnn, sgd",
        "digits cnn in bf16, sgd",
        "mnist cnn with batch norm, sgd",
        "grouped cnn, adam",
    ];
    let cases: Vec<Case> = training_cases()
        .into_iter()
        .filter(|c| im2col.contains(&c.0))
        .collect();
    assert_eq!(cases.len(), im2col.len());
    check_training_cases(&dev, &cases, NO_CACHE_TOLERANCE)?;
    // inference, where a convolution's patches are alive while its bias is added
    let est = Estimator::new(grouped_cnn)
        .multiprocessors(common::multiprocessors(&dev))
        .cudnn(ember::cuda::cudnn::is_available())
        .input([8, 16, 16])
        .training(false)
        .estimate(16)?;
    let measured = measure_inference(&dev, grouped_cnn, &[8, 16, 16], 16)?;
    check_estimate(
        "grouped cnn, inference",
        est.peak_allocated,
        measured,
        0.05,
        &est,
    );
    Ok(())
}
