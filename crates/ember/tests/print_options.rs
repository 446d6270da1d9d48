//! `set_print_options` (PyTorch's `torch.set_printoptions`): precision, threshold,
//! edge items, line width and scientific notation change how tensors print from
//! then on. A binary of its own, since the options are the whole process's. The
//! expected strings are PyTorch 2.15's `str(t)` under the same options.

use ember::prelude::*;
use ember::PrintOptions;

#[test]
fn print_options_change_how_tensors_print() -> Result<()> {
    let dev = Device::Cpu;
    // arange(n) / d in float32
    let over =
        |n: usize, d: f64| -> Result<Tensor> { Tensor::arange(0f32, n as f32, &dev)?.div(d) };
    ember::set_print_options(PrintOptions {
        precision: 2,
        threshold: 5,
        edgeitems: 1,
        linewidth: 30,
        sci_mode: None,
    });
    // summarised past 5 elements, one item at each end; the values shown (0 and 3)
    // decide the format
    assert_eq!(over(10, 3.0)?.to_string(), "tensor([0.,  ..., 3.])");
    assert_eq!(
        over(12, 7.0)?.reshape([3, 4])?.to_string(),
        "tensor([[0.00,  ..., 0.43],\n        ...,\n        [1.14,  ..., 1.57]])"
    );
    // 4 elements are under the threshold; 30 columns hold three of them a line
    assert_eq!(
        over(4, 3.0)?.to_string(),
        "tensor([0.00, 0.33, 0.67,\n        1.00])"
    );
    ember::set_print_options(PrintOptions {
        precision: 3,
        sci_mode: Some(true),
        ..PrintOptions::default()
    });
    let t = Tensor::new(vec![1.5f32, 20.25, -3.0], &dev)?;
    assert_eq!(
        t.to_string(),
        "tensor([ 1.500e+00,  2.025e+01, -3.000e+00])"
    );
    // integers too; and zeros alone keep the plain form whatever the option
    let t = Tensor::new(vec![2f32, -30.0], &dev)?;
    assert_eq!(t.to_string(), "tensor([ 2.000e+00, -3.000e+01])");
    let t = Tensor::zeros([2], DType::F32, &dev)?;
    assert_eq!(t.to_string(), "tensor([0., 0.])");
    let wide = Tensor::new(vec![1e-8f32, 1e6, 3.0], &dev)?;
    ember::set_print_options(PrintOptions {
        sci_mode: Some(false),
        ..PrintOptions::default()
    });
    assert_eq!(
        wide.to_string(),
        "tensor([      0.0000, 1000000.0000,       3.0000])"
    );
    let t = Tensor::new(vec![1e9f32, 1.0], &dev)?;
    assert_eq!(t.to_string(), "tensor([1000000000.,          1.])");
    // back to the defaults: the values choose scientific notation
    ember::set_print_options(PrintOptions::default());
    assert_eq!(
        wide.to_string(),
        "tensor([1.0000e-08, 1.0000e+06, 3.0000e+00])"
    );
    Ok(())
}
