//! Activation checkpointing (`nn::checkpoint`, `nn::Checkpoint`): the
//! gradients equal those of the same model run without it, to the bit (the
//! recomputation repeats the forward pass's ops, random draws and autocast
//! setting); the random stream moves as without it; the refusals.

use ember::autograd;
use ember::nn::{self, Module};
use ember::prelude::*;
use std::sync::Arc;

/// A block as a transformer's MLP has it: linear, GELU, dropout, linear.
fn block(dev: &Device) -> Result<nn::Sequential> {
    Ok(nn::Sequential::new()
        .add(nn::Linear::new(6, 12, dev)?)
        .add(nn::GELU)
        .add(nn::Dropout::new(0.3)?)
        .add(nn::Linear::new(12, 6, dev)?))
}

/// Three blocks with a residual tanh between them, each block checkpointed or
/// not; the same weights either way (same seed).
fn model(checkpointed: bool, dev: &Device) -> Result<nn::Sequential> {
    ember::manual_seed(3);
    let mut m = nn::Sequential::new();
    for _ in 0..3 {
        m = if checkpointed {
            m.add(nn::Checkpoint::new(block(dev)?))
        } else {
            m.add(block(dev)?)
        };
        m = m.add(nn::Tanh);
    }
    Ok(m)
}

/// One training step's gradients (input's, then each parameter's), and a draw
/// from the random stream after it.
fn step(m: &nn::Sequential, dev: &Device, amp: Option<DType>) -> Result<(Vec<Vec<f64>>, Vec<f64>)> {
    ember::manual_seed(11);
    let x = Tensor::randn([5, 6], dev)?.requires_grad_(true)?;
    let loss = match amp {
        Some(dt) => ember::amp::autocast(dt, || m.forward(&x))??,
        None => m.forward(&x)?,
    };
    loss.to_dtype(DType::F32)?.square()?.sum_all()?.backward()?;
    let mut grads = vec![x.grad().unwrap().to_vec::<f64>()?];
    for p in m.parameters() {
        grads.push(
            p.grad()
                .expect("every parameter has a gradient")
                .to_vec::<f64>()?,
        );
    }
    let after = Tensor::rand([4], dev)?.to_vec::<f64>()?;
    Ok((grads, after))
}

fn checkpointing_changes_no_gradient(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    for amp in [None, Some(DType::BF16)] {
        let plain = model(false, dev)?;
        let ckpt = model(true, dev)?;
        assert_eq!(
            plain
                .state_dict()
                .iter()
                .map(|(k, _)| k)
                .collect::<Vec<_>>(),
            ckpt.state_dict().iter().map(|(k, _)| k).collect::<Vec<_>>(),
            "the wrapper keeps the names"
        );
        let (want, want_after) = step(&plain, dev, amp)?;
        let (got, got_after) = step(&ckpt, dev, amp)?;
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g, w, "gradient {i} under {amp:?}");
        }
        // the recomputation drew from a fork: the stream is where it would be
        assert_eq!(got_after, want_after, "random stream after the step");
    }
    Ok(())
}

/// The function form: gradients of the inputs and of the listed leaves, with
/// `autograd::grad` too; a leaf it reads unlisted still gets its gradient under
/// `backward`, and `autograd::grad` refuses it with PyTorch's message.
fn checkpoint_function_form(dev: &Device) -> Result<()> {
    let cpu = Device::Cpu;
    let w = Tensor::new([0.5f64, -2.0, 1.5], &cpu)?
        .to(dev)?
        .requires_grad_(true)?;
    let x = Tensor::new([1f64, 2., 3.], &cpu)?
        .to(dev)?
        .requires_grad_(true)?;
    let f = {
        let w = w.clone();
        move |xs: &[Tensor]| xs[0].mul(&w)?.sin()?.mul(&xs[0])
    };
    let plain = x.mul(&w)?.sin()?.mul(&x)?.sum_all()?;
    let want = autograd::grad(&[&plain], &[&x, &w])?;

    let y = nn::checkpoint(f.clone(), &[&x], std::slice::from_ref(&w))?.sum_all()?;
    let got = autograd::grad(&[&y], &[&x, &w])?;
    if *dev != Device::Meta {
        for (g, e) in got.iter().zip(&want) {
            assert_eq!(g.to_vec::<f64>()?, e.to_vec::<f64>()?);
        }
    }
    assert!(
        w.grad().is_none() && x.grad().is_none(),
        "grad fills no .grad()"
    );

    // w unlisted: backward still reaches it
    let y = nn::checkpoint(f.clone(), &[&x], &[])?.sum_all()?;
    y.backward()?;
    if *dev != Device::Meta {
        assert_eq!(w.grad().unwrap().to_vec::<f64>()?, want[1].to_vec::<f64>()?);
        assert_eq!(x.grad().unwrap().to_vec::<f64>()?, want[0].to_vec::<f64>()?);
    }
    // ... and grad() refuses it
    let y = nn::checkpoint(f.clone(), &[&x], &[])?.sum_all()?;
    let e = autograd::grad(&[&y], &[&x]).expect_err("an unlisted leaf under grad()");
    assert!(
        e.to_string()
            .contains("Checkpointing is not compatible with .grad()"),
        "{e}"
    );

    // an input changed in place before backward
    let h = x.mul(1.0)?;
    let y = nn::checkpoint(f.clone(), &[&h], std::slice::from_ref(&w))?.sum_all()?;
    h.add_(1.0)?;
    let e = y.backward().expect_err("the checkpoint was overwritten");
    assert!(
        e.to_string().contains("modified by an inplace operation"),
        "{e}"
    );

    // a computed tensor is no parameter
    let e = nn::checkpoint(f, &[&x], &[w.mul(2.0)?]).expect_err("a computed param");
    assert!(e.to_string().contains("params must be leaves"), "{e}");
    Ok(())
}

/// No input requires grad (the first block of a model): the parameters still
/// get their gradients through the wrapper; in eval under `no_grad` nothing is
/// recorded.
fn checkpoint_without_input_gradients(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    ember::manual_seed(5);
    let lin = Arc::new(nn::Linear::new(4, 3, dev)?);
    let x = Tensor::randn([2, 4], dev)?;
    let wrapped = {
        let inner = lin.clone();
        nn::checkpoint(move |xs| inner.forward(&xs[0]), &[&x], &lin.parameters())?
    };
    wrapped.sum_all()?.backward()?;
    let gw = lin.weight.grad().expect("the weight's gradient");
    if *dev != Device::Meta {
        // d(sum(x Wᵀ + b))/dW = column sums of x, per output row
        let cols = x.sum(0, false)?.to_vec::<f64>()?;
        let g = gw.to_vec::<f64>()?;
        for r in 0..3 {
            for (c, want) in cols.iter().enumerate() {
                assert!((g[r * 4 + c] - want).abs() < 1e-6, "{g:?} vs {cols:?}");
            }
        }
    }
    let m = nn::Checkpoint::new(nn::Linear::new(4, 3, dev)?);
    let y = ember::no_grad(|| m.forward(&x))?;
    assert!(!y.requires_grad());
    Ok(())
}

/// A transformer encoder whose layers are checkpoints (causal mask, dropout)
/// gives the gradients of the same encoder without.
fn checkpointed_encoder_layers(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    let run = |checkpointed: bool| -> Result<Vec<Vec<f64>>> {
        ember::manual_seed(21);
        let opts = nn::TransformerOptions {
            dim_feedforward: 16,
            dropout: 0.2,
            batch_first: true,
            ..Default::default()
        };
        let layer = nn::TransformerEncoderLayer::new(8, 2, opts, dev)?;
        let mut enc = nn::TransformerEncoder::new(layer, 3, None)?;
        enc.checkpoint_layers(checkpointed);
        assert_eq!(enc.checkpoints_layers(), checkpointed);
        let x = Tensor::randn([2, 5, 8], dev)?.to_dtype(DType::F64)?;
        let x = x.requires_grad_(true)?;
        enc.to_dtype(DType::F64)?;
        let mask = nn::square_subsequent_mask(5, dev)?.to_dtype(DType::F64)?;
        let y = enc.forward_with(&x, Some(&mask), None, true)?;
        y.square()?.sum_all()?.backward()?;
        let mut out = vec![x.grad().unwrap().to_vec::<f64>()?];
        for p in enc.parameters() {
            out.push(p.grad().expect("a gradient").to_vec::<f64>()?);
        }
        Ok(out)
    };
    let (plain, ckpt) = (run(false)?, run(true)?);
    assert_eq!(plain.len(), ckpt.len());
    for (i, (a, b)) in plain.iter().zip(&ckpt).enumerate() {
        assert_eq!(a, b, "gradient {i}");
    }
    Ok(())
}

/// ResNet-18 with checkpointed residual blocks (`models::checkpointed`):
/// the same parameters and names and, in training (batch norm on the batch's
/// statistics), the same gradients to the bit; the running statistics and
/// batch counts move once, as without checkpoints.
fn checkpointed_resnet_blocks(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    type Run = (Vec<String>, Vec<Vec<f64>>, Vec<Vec<f64>>);
    let run = |checkpointed: bool| -> Result<Run> {
        ember::manual_seed(2);
        let m = if checkpointed {
            ember::models::checkpointed("resnet18", 10, dev)?
        } else {
            ember::models::by_name("resnet18", 10, dev)?
        };
        let x = Tensor::randn([2, 3, 32, 32], dev)?;
        m.forward(&x)?.square()?.sum_all()?.backward()?;
        let names = m.named_parameters().into_iter().map(|(n, _)| n).collect();
        let grads = m
            .parameters()
            .iter()
            .map(|p| p.grad().expect("a gradient").to_vec::<f64>())
            .collect::<Result<_>>()?;
        let buffers = m
            .named_buffers()
            .iter()
            .map(|(_, b)| b.to_vec::<f64>())
            .collect::<Result<_>>()?;
        Ok((names, grads, buffers))
    };
    let (plain, ckpt) = (run(false)?, run(true)?);
    assert_eq!(plain.0, ckpt.0, "parameter names");
    for (i, (a, b)) in plain.1.iter().zip(&ckpt.1).enumerate() {
        assert_eq!(a, b, "gradient of {}", plain.0[i]);
    }
    assert!(!plain.2.is_empty());
    assert_eq!(plain.2, ckpt.2, "running statistics and batch counts");
    Ok(())
}

device_test!(
    checkpointed_resnet_blocks,
    checkpointed_encoder_layers,
    checkpointing_changes_no_gradient,
    checkpoint_function_form,
    checkpoint_without_input_gradients
);

#[test]
fn activation_checkpoint_on_meta() -> Result<()> {
    checkpoint_function_form(&Device::Meta)?;
    checkpoint_without_input_gradients(&Device::Meta)
}
