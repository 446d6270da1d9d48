//! Advanced indexing against PyTorch (the `advanced` section of
//! tests/golden/ops_cases.json, made by tests/golden/gen_ops.py): `x[...]`
//! reads with int64 and bool index tensors, `torch.index_put` and
//! `x[...] = v`, their outputs and gradients on every device, their shapes on
//! meta, and PyTorch's refusals in its words.

use super::reshaping::{ops_cases, same, same_within, tensor, weights};
use ember::prelude::*;
use ember::{Idx, TensorIndex as T};
use serde_json::Value;

/// The case's call, by name: inputs are the tensor, (for writes) the
/// values, then the index tensors.
fn call(name: &str, x: &[Tensor]) -> Result<Tensor> {
    let a = &x[0];
    let i = |k: usize| &x[k];
    let step2 = T::Basic(Idx::Range {
        start: Some(1),
        end: None,
        step: 2,
    });
    let set = |index: Vec<T>| -> Result<Tensor> {
        let y = a.copy()?;
        y.index_set_(index, i(1))?;
        Ok(y)
    };
    match name {
        "int_dim0" | "int_2d_index" | "mask_full" | "mask_none_true" | "mask_0d_true"
        | "mask_0d_false" | "empty_index" | "index_0d" | "i64_self" | "f32_self" => a.index(i(1)),
        "int_negative_dim1" | "mask_dim1" | "mask_trailing_2d" | "empty_index_dim1"
        | "bool_self" => a.index((.., i(1))),
        "two_adjacent" => a.index((.., i(1), i(2))),
        "two_separated" => a.index((i(1), .., i(2))),
        "two_broadcast" | "mask_and_int" | "index_0d_and_vector" => a.index((i(1), i(2))),
        "three_full" => a.index((i(1), i(2), i(3))),
        "select_then_index" => a.index((0, .., i(1))),
        "newaxis_ellipsis" => a.index((T::NewAxis, T::Ellipsis, i(1))),
        "ellipsis_middle" => a.index((i(1), T::Ellipsis, i(2))),
        "slice_step_then_index" => a.index((step2, i(1))),
        "uint8_mask" => a.index(i(1).to_dtype(DType::U8)?),
        "put_rows" | "put_broadcast_value" | "put_mask" => a.index_put(&[Some(i(2))], i(1), false),
        "put_accumulate_repeats" | "put_mask_accumulate" => a.index_put(&[Some(i(2))], i(1), true),
        "put_scalar_value" => a.index_put(&[Some(i(2)), Some(i(3))], i(1), false),
        "put_two_accumulate" | "put_i64" => a.index_put(&[Some(i(2)), Some(i(3))], i(1), true),
        "set_adjacent" => set(vec![T::from(..), i(2).into(), i(3).into()]),
        "set_separated" => set(vec![i(2).into(), T::from(..), i(3).into()]),
        "set_mask_tensor" | "set_mask_rows" => set(vec![i(2).into()]),
        "set_ellipsis" => set(vec![T::Ellipsis, i(2).into()]),
        "set_slice_then_index" => set(vec![T::from(1..3), i(2).into()]),
        "set_select_then_mask" => set(vec![T::from(1), i(2).into()]),
        other => panic!("unknown case {other}"),
    }
}

fn cases() -> Vec<Value> {
    ops_cases()["advanced"]["cases"].as_array().unwrap().clone()
}

/// Every case's output and float inputs' gradients against PyTorch's.
fn advanced_indexing_matches_pytorch(dev: &Device) -> Result<()> {
    let all = cases();
    assert!(all.len() >= 40, "{} cases", all.len());
    for case in &all {
        let name = case["name"].as_str().unwrap();
        let grads = case["grads"].as_array().unwrap();
        let inputs: Vec<Tensor> = case["inputs"]
            .as_array()
            .unwrap()
            .iter()
            .zip(grads)
            .map(|(v, g)| {
                let t = tensor(v, dev)?;
                match g.is_null() {
                    true => Ok(t),
                    false => t.requires_grad_(true),
                }
            })
            .collect::<Result<_>>()?;
        let out = call(name, &inputs)?;
        assert_eq!(out.device(), *dev, "{name}");
        same(&format!("{name} output"), &out, &case["outputs"][0])?;
        if out.requires_grad() {
            out.mul(&weights(&out)?)?.sum_all()?.backward()?;
        }
        for (k, g) in grads.iter().enumerate() {
            if g.is_null() {
                continue;
            }
            let got = match inputs[k].grad() {
                Some(g) => g,
                None => inputs[k].zeros_like()?,
            };
            let tol = if out.dtype() == DType::F32 {
                1e-6
            } else {
                1e-12
            };
            same_within(&format!("{name} grad {k}"), &got, g, tol)?;
        }
    }
    Ok(())
}

/// Whether a case indexes with a mask, whose true positions a meta tensor
/// does not have.
fn masked(case: &Value) -> bool {
    case["inputs"].as_array().unwrap()[1..]
        .iter()
        .any(|v| v["dtype"] == "bool")
}

/// The same calls on meta: PyTorch's shapes and dtypes, forward and
/// backward; a mask is refused there (PyTorch's meta device refuses it too).
#[test]
fn advanced_indexing_on_meta() -> Result<()> {
    let meta = Device::Meta;
    let mut ran = 0;
    for case in cases() {
        let name = case["name"].as_str().unwrap();
        let grads = case["grads"].as_array().unwrap();
        let inputs: Vec<Tensor> = case["inputs"]
            .as_array()
            .unwrap()
            .iter()
            .zip(grads)
            .map(|(v, g)| {
                let t = tensor(v, &Device::Cpu)?;
                let m = Tensor::zeros(t.shape(), t.dtype(), &meta)?;
                match g.is_null() {
                    true => Ok(m),
                    false => m.requires_grad_(true),
                }
            })
            .collect::<Result<_>>()?;
        let got = call(name, &inputs);
        if masked(&case) && inputs[0].dtype() != DType::Bool {
            let e = got.expect_err(name).to_string();
            assert!(e.contains("depends on the values"), "{name}: {e}");
            continue;
        }
        let out = got?;
        let want = tensor(&case["outputs"][0], &Device::Cpu)?;
        assert_eq!(
            (out.shape(), out.dtype()),
            (want.shape(), want.dtype()),
            "{name}"
        );
        assert_eq!(out.device(), meta, "{name}");
        if out.requires_grad() {
            out.sum_all()?.backward()?;
            assert_eq!(inputs[0].grad().unwrap().shape(), inputs[0].shape());
        }
        ran += 1;
    }
    assert!(ran >= 25, "{ran} cases ran on meta");
    Ok(())
}

/// PyTorch's refusals: ember's message contains PyTorch's, on every device.
fn advanced_indexing_refuses_as_pytorch(dev: &Device) -> Result<()> {
    let z = |s: &[usize]| Tensor::zeros(s, DType::F64, dev);
    let i64s = |v: &[i64]| Tensor::from_vec(v.to_vec(), [v.len()], dev);
    let bools = |v: &[bool], s: &[usize]| Tensor::from_vec(v.to_vec(), s, dev);
    let errors = ops_cases()["advanced"]["errors"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(errors.len(), 11);
    for e in &errors {
        let name = e["name"].as_str().unwrap();
        let phrase = e["phrase"].as_str().unwrap();
        let got = match name {
            "out_of_bounds" => z(&[2, 3, 4])?.index(&i64s(&[5])?),
            "out_of_bounds_negative" => z(&[2, 3, 4])?.index((.., &i64s(&[1, -4])?)),
            "out_of_bounds_second" => z(&[2, 3, 4])?.index((&i64s(&[0])?, .., &i64s(&[9])?)),
            "empty_dim" => z(&[0, 3])?.index(&i64s(&[0])?),
            "too_many" => {
                let i = i64s(&[0])?;
                z(&[2, 3])?.index((&i, &i, &i))
            }
            "mask_shape" => z(&[2, 3, 4])?.index((.., &bools(&[true, false], &[2])?)),
            "mask_shape_2d" => {
                let m = bools(&[true, false, true, true, true, true, true, true], &[2, 4])?;
                z(&[2, 3, 4])?.index((.., &m))
            }
            "index_dtype" => z(&[3])?.index(&z(&[1])?),
            "broadcast" => z(&[2, 3, 4])?.index((&i64s(&[0, 1])?, &i64s(&[0, 1, 2])?)),
            "put_dtype" => z(&[3])?.index_put(
                &[Some(&i64s(&[0])?)],
                &Tensor::zeros([1], DType::F32, dev)?,
                false,
            ),
            "put_shape" => z(&[2, 3, 4])?.index_put(&[Some(&i64s(&[0])?)], &z(&[2])?, false),
            other => panic!("unknown error case {other}"),
        };
        // the GPU checks indices on the device and reports at the next wait
        let msg = super::synced(got).expect_err(name).to_string();
        assert!(msg.contains(phrase), "{name}: {msg:?} lacks {phrase:?}");
    }
    Ok(())
}

/// Writes in place: through `index_put_` and `index_set_`, recorded by
/// autograd on a non-leaf, refused on a leaf that requires grad; an index
/// without tensors reads a view; indices may come from the CPU.
fn advanced_indexing_in_place(dev: &Device) -> Result<()> {
    let x = Tensor::arange(0f64, 6.0, dev)?.reshape([2, 3])?;
    let at = Tensor::from_vec(vec![2i64, 0, 2], [3], dev)?;
    let ones = Tensor::ones([3], DType::F64, dev)?;
    x.index_put_(&[None, Some(&at)], &ones, true)?;
    assert_eq!(x.to_vec::<f64>()?, vec![1.0, 1.0, 4.0, 4.0, 4.0, 7.0]);
    // a view: writes through it reach the tensor
    let row = x.index((1, ..))?;
    row.fill_(0.0)?;
    assert_eq!(x.to_vec::<f64>()?[3..], [0.0, 0.0, 0.0]);

    let w = Tensor::ones([4], DType::F64, dev)?.requires_grad_(true)?;
    let mask = Tensor::from_vec(vec![true, false, true, false], [4], dev)?;
    let e = w
        .index_set_(&mask, 5.0)
        .expect_err("a leaf that requires grad");
    assert!(e.to_string().contains("leaf Variable"), "{e}");
    let h = w.mul(3.0)?;
    h.index_set_(&mask, 5.0)?;
    assert_eq!(h.to_vec::<f64>()?, vec![5.0, 3.0, 5.0, 3.0]);
    h.sum_all()?.backward()?;
    assert_eq!(w.grad().unwrap().to_vec::<f64>()?, vec![0.0, 3.0, 0.0, 3.0]);

    // indices on the CPU for a tensor elsewhere, as PyTorch takes them
    let cpu_at = Tensor::from_vec(vec![1i64], [1], &Device::Cpu)?;
    let y = Tensor::arange(0f32, 4.0, dev)?;
    assert_eq!(y.index(&cpu_at)?.device(), *dev);
    assert_eq!(y.index(&cpu_at)?.to_vec::<f32>()?, vec![1.0]);
    Ok(())
}

device_test!(
    advanced_indexing_matches_pytorch,
    advanced_indexing_refuses_as_pytorch,
    advanced_indexing_in_place,
);
