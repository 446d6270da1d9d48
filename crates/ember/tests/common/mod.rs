//! Helpers shared by the test binaries.

use ember::Device;

/// The first GPU, or `None` after printing why `test` skipped (no GPU, no driver, or
/// a CUDA library missing: the reason names it).
pub fn gpu(test: &str) -> Option<Device> {
    match ember::cuda::unavailable_reason() {
        Some(reason) => {
            eprintln!("skipped {test}: {reason}");
            None
        }
        None => Some(Device::Cuda(0)),
    }
}
