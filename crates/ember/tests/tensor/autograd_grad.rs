//! `autograd::grad` / `grad_with` / `backward` against PyTorch's
//! `torch.autograd.grad` and `torch.autograd.backward`
//! (tests/golden/autograd_cases.json, made by tests/golden/gen_autograd.py):
//! the gradients asked for, the leaves' `.grad()` after each case (untouched by
//! `grad`), and PyTorch's refusals in its words.

use super::assert_close;
use ember::autograd::{self, GradOptions};
use ember::prelude::*;
use serde_json::Value;
use std::collections::HashMap;

fn cases() -> Value {
    super::golden("autograd_cases.json")
}

/// A recorded tensor, made on the CPU and moved to `dev` (meta included).
fn tensor(v: &Value, dev: &Device) -> Result<Tensor> {
    super::golden_tensor(v, &Device::Cpu)?.to(dev)
}

/// The case's inputs as fresh leaves (all but `g` require grad).
fn leaves(all: &Value, dev: &Device) -> Result<HashMap<String, Tensor>> {
    let mut t = HashMap::new();
    for (k, v) in all["inputs"].as_object().unwrap() {
        let x = tensor(v, dev)?;
        let x = if k == "g" { x } else { x.requires_grad_(true)? };
        t.insert(k.clone(), x);
    }
    Ok(t)
}

/// Compares a gradient with its record: values on real devices, shape and
/// dtype on meta.
fn check(name: &str, got: Option<&Tensor>, want: &Value, dev: &Device) -> Result<()> {
    match (got, want.is_null()) {
        (None, true) => return Ok(()),
        (Some(g), false) => {
            let shape: Vec<usize> = want["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as usize)
                .collect();
            assert_eq!(g.shape(), &shape[..], "{name}: shape");
            assert_eq!(g.dtype(), DType::F64, "{name}: dtype");
            if *dev != Device::Meta {
                let w = tensor(want, &Device::Cpu)?.to_vec::<f64>()?;
                assert_close(&g.to_vec::<f64>()?, &w, 1e-12, 1e-12);
            }
        }
        (g, _) => panic!("{name}: got {g:?}, want {want}"),
    }
    Ok(())
}

fn run(name: &str, t: &HashMap<String, Tensor>) -> Result<Vec<Option<Tensor>>> {
    let (x, w, z, g) = (&t["x"], &t["w"], &t["z"], &t["g"]);
    let some = |v: Vec<Tensor>| v.into_iter().map(Some).collect();
    Ok(match name {
        "chain" => {
            let h = x.mul(2.0)?;
            some(autograd::grad(&[&h.mul(&h)?.sum_all()?], &[&h, x])?)
        }
        "two_outputs" => {
            let a = x.mul(x)?.sum_all()?;
            let b = x.exp()?.sum_all()?;
            some(autograd::grad(&[&a, &b], &[x, x])?)
        }
        "grad_outputs" => {
            let y = x.unsqueeze(1)?.mul(w)?;
            let options = GradOptions {
                grad_outputs: &[Some(g)],
                ..Default::default()
            };
            autograd::grad_with(&[&y], &[x, w], options)?
        }
        "unused_allowed" | "unused_materialized" => {
            let options = GradOptions {
                allow_unused: true,
                materialize_grads: name == "unused_materialized",
                ..Default::default()
            };
            autograd::grad_with(&[&x.mul(x)?.sum_all()?], &[x, z], options)?
        }
        "through_view" => {
            let v = w.t()?;
            let y = v
                .sin()?
                .mul(&v)?
                .sum_all()?
                .add(&v.i(1)?.sum_all()?.mul(3.0)?)?;
            some(autograd::grad(&[&y], &[&v])?)
        }
        "cast_grad_output" => {
            let y = x.to_dtype(DType::F32)?.mul(2.0)?;
            let go = Tensor::new([1f64, 2., 3.], &Device::Cpu)?.to(&x.device())?;
            let options = GradOptions {
                grad_outputs: &[Some(&go)],
                ..Default::default()
            };
            autograd::grad_with(&[&y], &[x], options)?
        }
        "backward_two" => {
            let a = x.unsqueeze(1)?.mul(w)?;
            let b = w.mul(w)?.sum(0, false)?;
            let ones = Tensor::ones([2], DType::F64, &x.device())?;
            autograd::backward(&[&a, &b], &[Some(g), Some(&ones)])?;
            vec![]
        }
        other => panic!("unknown case {other}"),
    })
}

fn autograd_grad_matches_pytorch(dev: &Device) -> Result<()> {
    let all = cases();
    for c in all["cases"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        let t = leaves(&all, dev)?;
        let got = run(name, &t)?;
        let want = c["grads"].as_array().unwrap();
        assert_eq!(got.len(), want.len(), "{name}: how many gradients");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            check(&format!("{name}[{i}]"), g.as_ref(), w, dev)?;
        }
        for (k, w) in c["leaf_grads"].as_object().unwrap() {
            check(&format!("{name}: {k}.grad"), t[k].grad().as_ref(), w, dev)?;
        }
    }
    Ok(())
}

fn autograd_grad_refuses_as_pytorch(dev: &Device) -> Result<()> {
    let all = cases();
    for e in all["errors"].as_array().unwrap() {
        let name = e["name"].as_str().unwrap();
        let phrase = e["phrase"].as_str().unwrap();
        let t = leaves(&all, dev)?;
        let (x, z, g) = (&t["x"], &t["z"], &t["g"]);
        let two = x.mul(2.0)?;
        let got = match name {
            "unused" => autograd::grad(&[&x.mul(x)?.sum_all()?], &[x, z]).map(drop),
            "input_without_grad" => autograd::grad(&[&x.mul(x)?.sum_all()?], &[g]).map(drop),
            "output_without_grad" => autograd::grad(&[&g.sum_all()?], &[x]).map(drop),
            "implicit_non_scalar" => autograd::grad(&[&two], &[x]).map(drop),
            "grad_output_shape" | "grad_output_count" => {
                let (outputs, go): (Vec<Tensor>, &Tensor) = if name == "grad_output_shape" {
                    (vec![two], z)
                } else {
                    (vec![two, x.sum_all()?], x)
                };
                let outputs: Vec<&Tensor> = outputs.iter().collect();
                let options = GradOptions {
                    grad_outputs: &[Some(go)],
                    ..Default::default()
                };
                autograd::grad_with(&outputs, &[x], options).map(drop)
            }
            "empty_inputs" => autograd::grad(&[&two.sum_all()?], &[]).map(drop),
            "backward_shape" => autograd::backward(&[&two], &[Some(z)]),
            other => panic!("unknown error case {other}"),
        };
        let msg = got.expect_err(name).to_string();
        assert!(msg.contains(phrase), "{name}: {msg:?} lacks {phrase:?}");
        // a refusal spends no part of the graph and fills no .grad()
        assert!(x.grad().is_none(), "{name}: x.grad was written");
    }
    Ok(())
}

/// What `grad` leaves of the graph: the rules it ran are spent (a second walk
/// through them fails), the rules it did not need are not, and a gradient it
/// did not ask for is never computed into a leaf.
fn autograd_grad_spends_only_what_it_runs(dev: &Device) -> Result<()> {
    let cpu = Device::Cpu;
    let x = Tensor::new([1f64, 2., 3.], &cpu)?
        .to(dev)?
        .requires_grad_(true)?;
    let w = Tensor::new([0.5f64, -1., 2.], &cpu)?
        .to(dev)?
        .requires_grad_(true)?;
    let h = x.mul(&w)?; // h = x w
    let y = h.exp()?.sum_all()?;
    // dy/dh only: the product's rule does not run
    let gh = autograd::grad(&[&y], &[&h])?;
    if *dev != Device::Meta {
        assert_close(
            &gh[0].to_vec::<f64>()?,
            &h.exp()?.to_vec::<f64>()?,
            1e-15,
            0.0,
        );
    }
    // the sum and exp rules are spent
    let e = y.backward().expect_err("a second walk through spent rules");
    assert!(e.to_string().contains("second time"), "{e}");
    // the product's rule is intact: backward from h still reaches the leaves
    h.backward_with(&Tensor::ones([3], DType::F64, dev)?)?;
    if *dev != Device::Meta {
        assert_eq!(x.grad().unwrap().to_vec::<f64>()?, vec![0.5, -1., 2.]);
        assert_eq!(w.grad().unwrap().to_vec::<f64>()?, vec![1., 2., 3.]);
    }
    Ok(())
}

device_test!(
    autograd_grad_matches_pytorch,
    autograd_grad_refuses_as_pytorch,
    autograd_grad_spends_only_what_it_runs
);

#[test]
fn autograd_grad_on_meta() -> Result<()> {
    autograd_grad_matches_pytorch(&Device::Meta)?;
    autograd_grad_refuses_as_pytorch(&Device::Meta)?;
    autograd_grad_spends_only_what_it_runs(&Device::Meta)
}
