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
    let (f32, bf16) = (DType::F32, DType::BF16);
    let cases: [Case; 4] = [
        ("digits cnn, sgd", digits_cnn, vec![1, 8, 8], 256, sgd, f32),
        (
            "digits cnn in bf16, sgd",
            digits_cnn,
            vec![1, 8, 8],
            64,
            sgd,
            bf16,
        ),
        (
            "mnist cnn with batch norm, sgd",
            mnist_cnn,
            vec![1, 28, 28],
            16,
            sgd,
            f32,
        ),
        (
            "grouped cnn, adam",
            grouped_cnn,
            vec![8, 16, 16],
            16,
            adam,
            f32,
        ),
    ];
    for (name, build, input, batch, opt, dtype) in cases {
        let est = Estimator::new(build)
            .input(&input)
            .optimizer(opt)
            .dtype(dtype)
            .estimate(batch)?;
        let measured = measure(&dev, build, &input, batch, opt, (dtype, None), est.steps)?;
        check_estimate(name, est.peak_allocated, measured, 0.05, &est);
    }
    // inference, where a convolution's patches are alive while its bias is added
    let est = Estimator::new(grouped_cnn)
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
