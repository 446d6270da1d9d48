//! Devices and copies, as in the lessons' first steps: pick the best device, make
//! tensors there, copy them between devices, and see the error when two devices
//! meet in one op.
//!
//! Run: `cargo run -p ember --example device_basics`

use ember::prelude::*;

fn main() -> Result<()> {
    // `torch.cuda.is_available()`, `device_count()`, names and properties
    println!("CUDA available: {}", ember::cuda::is_available());
    println!("GPUs: {}", ember::cuda::device_count());
    if let Some(why) = ember::cuda::unavailable_reason() {
        println!("(no GPU: {why})");
    }
    for i in 0..ember::cuda::device_count() {
        let p = ember::cuda::device_properties(i)?;
        println!("cuda:{i}: {p:?}");
    }

    // device-agnostic code: "cuda:0" when there is a GPU, else "cpu"
    let device = Device::cuda_if_available(0);
    println!("using {device}");

    // created on the CPU, then copied with .to(device)
    let a = Tensor::new([[1f32, 2.], [3., 4.]], &Device::Cpu)?;
    let b = a.to(&device)?;
    println!("{a}");
    println!("{b}");

    // created directly on the device
    ember::manual_seed(0);
    let c = Tensor::randn([2, 2], &device)?;
    let d = b.matmul(&c)?.relu()?;
    println!("relu(b @ c) = {d}");

    // back to the host to read the values
    println!("as a Vec: {:?}", d.cpu()?.to_vec2::<f32>()?);

    // two devices in one op: an error, not a panic
    if device.is_cuda() {
        match a.add(&b) {
            Err(e) => println!("as expected: {e}"),
            Ok(_) => println!("unexpected: a CPU and a CUDA tensor were added"),
        }
    }
    Ok(())
}
