//! Shape, diagonal and index helpers against PyTorch
//! (tests/golden/ops_cases.json, made by tests/golden/gen_ops.py): every
//! case's outputs and the gradients of its float inputs on every device, the
//! same calls on meta (shapes and dtypes), and PyTorch's refusals.

use ember::prelude::*;
use serde_json::Value;

pub(super) fn ops_cases() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/ops_cases.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("ops_cases.json"))
        .expect("valid JSON")
}

fn dtype_of(name: &str) -> DType {
    match name {
        "float64" => DType::F64,
        "float32" => DType::F32,
        "int64" => DType::I64,
        "bool" => DType::Bool,
        d => panic!("dtype {d}"),
    }
}

/// A recorded tensor (shape, dtype, values) on `dev`.
pub(super) fn tensor(v: &Value, dev: &Device) -> Result<Tensor> {
    let shape: Vec<usize> = v["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect();
    let dt = dtype_of(v["dtype"].as_str().unwrap());
    let vals = v["values"].as_array().unwrap();
    if dt == DType::I64 {
        let x: Vec<i64> = vals.iter().map(|x| x.as_i64().unwrap()).collect();
        return Tensor::from_vec(x, shape, dev);
    }
    let x: Vec<f64> = vals
        .iter()
        .map(|x| x.as_f64().unwrap_or(f64::NAN))
        .collect();
    Tensor::from_vec(x, shape, dev)?.to_dtype(dt)
}

fn i64s(t: &Tensor) -> Vec<i64> {
    t.to_vec::<i64>().unwrap()
}

/// The case's call, by name, on its inputs.
fn call(name: &str, x: &[Tensor]) -> Result<Vec<Tensor>> {
    let one = |t: Result<Tensor>| t.map(|t| vec![t]);
    let a = &x[0];
    let b = x.get(1);
    let i = |k: usize| &x[k];
    match name {
        "expand_as" => one(a.expand_as(i(1))),
        "view_as" => one(a.view_as(i(1))),
        "reshape_as_t" => one(a.t()?.reshape_as(i(1))),
        "type_as_f32" | "type_as_i64" => one(a.type_as(i(1))),
        "movedim_0_m1" => one(a.movedim(0, -1)),
        "movedim_list" => one(a.movedim([0, 1], [2, 0])),
        "moveaxis_i64" => one(a.moveaxis([-1, 0], [0, -1])),
        "movedim_empty" => one(a.movedim(0, 2)),
        "swapaxes" => one(a.swapaxes(0, -1)),
        "swapdims_bool" => one(a.swapdims(1, 0)),
        "ravel_t" => one(a.t()?.ravel()),
        "ravel_0d" => one(a.ravel()),
        "unflatten" => one(a.unflatten(1, &[3, -1])),
        "unflatten_neg" => one(a.unflatten(-1, &[2, 2, 3])),
        "tile_short" => one(a.tile(&[2])),
        "tile_long_bool" => one(a.tile(&[2, 1, 2])),
        "ri_int_dim1" | "ri_int_empty" => one(a.repeat_interleave(2, Some(1))),
        "ri_int_flat" => one(a.repeat_interleave(3, None)),
        "ri_int_neg_i64" => one(a.repeat_interleave(2, Some(-2))),
        "ri_tensor_dim0" => one(a.repeat_interleave_tensor(i(1), Some(0), None)),
        "ri_tensor_one" => one(a.repeat_interleave_tensor(i(1), Some(1), None)),
        "ri_tensor_flat" => one(a.repeat_interleave_tensor(i(1), None, None)),
        "ri_tensor_bool" => one(a.repeat_interleave_tensor(i(1), Some(-1), None)),
        n if n.starts_with("hstack") => one(Tensor::hstack(&[a, i(1)])),
        n if n.starts_with("vstack") => one(Tensor::vstack(&[a, i(1)])),
        n if n.starts_with("dstack") => one(Tensor::dstack(&[a, i(1)])),
        "column_stack" => one(Tensor::column_stack(&[a, i(1)])),
        n if n.starts_with("atleast_") => {
            Ok(vec![a.atleast_1d()?, a.atleast_2d()?, a.atleast_3d()?])
        }
        "tensor_split_sections" => a.tensor_split(3, 0),
        "tensor_split_indices" => a.tensor_split([1, 5], 0),
        "tensor_split_negative" => a.tensor_split([-2], 0),
        "tensor_split_dim1" => a.tensor_split(2, 1),
        "tensor_split_backwards" => a.tensor_split([4, 1], -1),
        "tensor_split_more_than_size" => a.tensor_split(4, 0),
        "tensor_split_empty" => a.tensor_split(2usize, 0),
        "hsplit" => a.hsplit(2),
        "hsplit_indices_1d" => a.hsplit([1, 3]),
        "vsplit" => a.vsplit(2),
        "dsplit_i64" => a.dsplit([1]),
        n if n.starts_with("rot90_k") => one(a.rot90(n[7..].parse().unwrap(), [0, 1])),
        "rot90_dims12" => one(a.rot90(1, [1, 2])),
        "rot90_neg_dims" => one(a.rot90(1, [-1, 0])),
        "rot90_bool" => one(a.rot90(3, [0, 1])),
        "rot90_empty" => one(a.rot90(1, [0, 1])),
        n if n.starts_with("diagonal_") && n[9..].parse::<i64>().is_ok() => {
            one(a.diagonal(n[9..].parse().unwrap(), 0, 1))
        }
        "diagonal_3d" => one(a.diagonal(1, 0, 2)),
        "diagonal_3d_neg" => one(a.diagonal(-1, -1, -3)),
        "diagonal_i64_t" => one(a.t()?.diagonal(0, 0, 1)),
        n if n.starts_with("diag_vec_") => one(a.diag(n[9..].parse().unwrap())),
        n if n.starts_with("diag_mat_") => one(a.diag(n[9..].parse().unwrap())),
        "diag_i64" | "diag_empty" => one(a.diag(0)),
        "diag_embed" => one(a.diag_embed(0, -2, -1)),
        "diag_embed_dims" => one(a.diag_embed(1, 0, 2)),
        "diag_embed_swapped" => one(a.diag_embed(-1, 2, 0)),
        "diag_embed_bool" => one(a.diag_embed(1, -2, -1)),
        "trace" | "trace_i64" => one(a.trace()),
        n if n.starts_with("block_diag") => one(Tensor::block_diag(&x.iter().collect::<Vec<_>>())),
        n if n.starts_with("cartesian_prod") => {
            one(Tensor::cartesian_prod(&x.iter().collect::<Vec<_>>()))
        }
        "meshgrid_ij" => Tensor::meshgrid(&x.iter().collect::<Vec<_>>(), "ij"),
        "meshgrid_xy" | "meshgrid_0d" => Tensor::meshgrid(&x.iter().collect::<Vec<_>>(), "xy"),
        n if n.starts_with("take_along_dim") => one(a.take_along_dim(
            i(1),
            match n {
                "take_along_dim_flat" => None,
                "take_along_dim_bcast_self" => Some(0),
                "take_along_dim_i64" => Some(-1),
                _ => Some(1),
            },
        )),
        n if n.starts_with("take") => one(a.take(i(1))),
        "index_fill" => one(a.index_fill(1, i(1), -2.5)),
        "index_fill_repeat" => one(a.index_fill(0, i(1), 7.0)),
        "index_fill_tensor" => one(a.index_fill(-1, i(1), i(2))),
        "index_fill_i64" => one(a.index_fill(0, i(1), 9i64)),
        "index_fill_bool" => one(a.index_fill(1, i(1), true)),
        "index_copy" => one(a.index_copy(0, i(1), i(2))),
        "index_copy_dim1" => one(a.index_copy(-1, i(1), i(2))),
        "index_copy_i64" => one(a.index_copy(1, i(1), i(2))),
        "scatter" | "scatter_bool" | "scatter_0d" => one(a.scatter(0, i(1), i(2))),
        "scatter_larger_src" => one(a.scatter(1, i(1), i(2))),
        "scatter_neg_dim_i64" => one(a.scatter(-1, i(1), i(2))),
        "scatter_value" => one(a.scatter_value(1, i(1), 2.5)),
        "scatter_value_repeats" => one(a.scatter_value(0, i(1), -1.0)),
        n if n.starts_with("scatter_reduce_") => {
            let rest = &n["scatter_reduce_".len()..];
            let (dim, inc, red) = if let Some(r) = rest.strip_prefix("2d_") {
                (1, false, r)
            } else if let Some(r) = rest.strip_prefix("i64_") {
                (0, true, r)
            } else if let Some(r) = rest.strip_prefix("nan_") {
                (0, true, r)
            } else {
                let (r, inc) = rest.split_once('_').unwrap();
                (0, inc == "1", r)
            };
            one(a.scatter_reduce(dim, i(1), i(2), red, inc))
        }
        other => {
            let _ = b;
            panic!("unknown case {other}")
        }
    }
}

fn sections() -> [&'static str; 3] {
    ["reshaping", "diagonals", "index"]
}

/// The gradient weights PyTorch's generator used: linspace(-1, 1) per output.
pub(super) fn weights(y: &Tensor) -> Result<Tensor> {
    Tensor::linspace(-1.0, 1.0, y.numel(), y.dtype(), &y.device())?.reshape(y.shape())
}

pub(super) fn same(what: &str, got: &Tensor, want: &Value) -> Result<()> {
    same_within(what, got, want, 1e-12)
}

/// [`same`] with a relative tolerance for float64 values (float32 ones
/// always get 1e-6).
pub(super) fn same_within(what: &str, got: &Tensor, want: &Value, f64_tol: f64) -> Result<()> {
    let want = tensor(want, &Device::Cpu)?;
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    let (g, w) = (
        got.to_dtype(DType::F64)?.to_vec::<f64>()?,
        want.to_dtype(DType::F64)?.to_vec::<f64>()?,
    );
    let tol = if want.dtype() == DType::F32 {
        1e-6
    } else {
        f64_tol
    };
    for (k, (a, b)) in g.iter().zip(&w).enumerate() {
        let ok = (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= tol * (1.0 + b.abs());
        assert!(ok, "{what} [{k}]: {a} vs {b}\n got {g:?}\nwant {w:?}");
    }
    Ok(())
}

/// Every case's outputs and float inputs' gradients against PyTorch's.
fn ops_match_pytorch(dev: &Device) -> Result<()> {
    let all = ops_cases();
    let mut n = 0;
    for sec in sections() {
        for case in all[sec]["cases"].as_array().unwrap() {
            let name = case["name"].as_str().unwrap();
            let inputs: Vec<Tensor> = case["inputs"]
                .as_array()
                .unwrap()
                .iter()
                .zip(case["grads"].as_array().unwrap())
                .map(|(v, g)| {
                    let t = tensor(v, dev)?;
                    match g.is_null() {
                        true => Ok(t),
                        false => t.requires_grad_(true),
                    }
                })
                .collect::<Result<_>>()?;
            let outs = call(name, &inputs)?;
            let want = case["outputs"].as_array().unwrap();
            assert_eq!(outs.len(), want.len(), "{name}: number of outputs");
            let mut loss: Option<Tensor> = None;
            for (k, (o, w)) in outs.iter().zip(want).enumerate() {
                assert_eq!(o.device(), *dev, "{name}");
                same(&format!("{name} output {k}"), o, w)?;
                if o.requires_grad() {
                    let term = o.mul(&weights(o)?)?.sum_all()?;
                    loss = Some(match loss {
                        Some(l) => l.add(&term)?,
                        None => term,
                    });
                }
            }
            if let Some(l) = loss {
                l.backward()?;
            }
            for (k, g) in case["grads"].as_array().unwrap().iter().enumerate() {
                if g.is_null() {
                    continue;
                }
                let got = match inputs[k].grad() {
                    Some(g) => g,
                    None => inputs[k].zeros_like()?,
                };
                // a float32 output's weights were rounded to float32
                let f32_out = outs.iter().any(|o| o.dtype() == DType::F32);
                let tol = if f32_out { 1e-6 } else { 1e-12 };
                same_within(&format!("{name} grad {k}"), &got, g, tol)?;
            }
            n += 1;
        }
    }
    assert!(n >= 120, "{n} cases");
    Ok(())
}

/// The same calls on meta: PyTorch's shapes and dtypes, forward and backward
/// (`repeat_interleave` with counts needs `output_size` there).
#[test]
fn ops_run_on_meta_with_pytorchs_shapes() -> Result<()> {
    let all = ops_cases();
    let meta = Device::Meta;
    for sec in sections() {
        for case in all[sec]["cases"].as_array().unwrap() {
            let name = case["name"].as_str().unwrap();
            if name.starts_with("ri_tensor") {
                continue;
            }
            let inputs: Vec<Tensor> = case["inputs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| {
                    let t = tensor(v, &Device::Cpu)?;
                    let m = Tensor::zeros(t.shape(), t.dtype(), &meta)?;
                    match t.dtype().is_float() {
                        true => m.requires_grad_(true),
                        false => Ok(m),
                    }
                })
                .collect::<Result<_>>()?;
            let outs = call(name, &inputs)?;
            for (o, w) in outs.iter().zip(case["outputs"].as_array().unwrap()) {
                let want = tensor(w, &Device::Cpu)?;
                assert_eq!(
                    (o.shape(), o.dtype()),
                    (want.shape(), want.dtype()),
                    "{name}"
                );
                assert_eq!(o.device(), meta, "{name}");
                if o.requires_grad() {
                    o.sum_all()?.backward()?;
                }
            }
        }
    }
    // with output_size, the counts are not read
    let x = Tensor::zeros([3, 2], DType::F32, &meta)?;
    let r = Tensor::zeros([3], DType::I64, &meta)?;
    assert_eq!(
        x.repeat_interleave_tensor(&r, Some(0), Some(5))?.shape(),
        &[5, 2]
    );
    assert!(x.repeat_interleave_tensor(&r, Some(0), None).is_err());
    Ok(())
}

/// The triangle index lists and logspace against PyTorch's.
fn creation_matches_pytorch(dev: &Device) -> Result<()> {
    let all = ops_cases();
    for c in all["diagonals"]["tri"].as_array().unwrap() {
        let (r, col, off) = (
            c["row"].as_u64().unwrap() as usize,
            c["col"].as_u64().unwrap() as usize,
            c["offset"].as_i64().unwrap(),
        );
        same(
            "tril_indices",
            &Tensor::tril_indices(r, col, off, dev)?,
            &c["tril"],
        )?;
        same(
            "triu_indices",
            &Tensor::triu_indices(r, col, off, dev)?,
            &c["triu"],
        )?;
        let meta = Tensor::tril_indices(r, col, off, &Device::Meta)?;
        assert_eq!(meta.shape(), tensor(&c["tril"], &Device::Cpu)?.shape());
    }
    for c in all["diagonals"]["logspace"].as_array().unwrap() {
        let want = tensor(&c["out"], &Device::Cpu)?;
        let f = |k: &str| c[k].as_f64().unwrap();
        let got = Tensor::logspace(
            f("start"),
            f("end"),
            c["steps"].as_u64().unwrap() as usize,
            f("base"),
            want.dtype(),
            dev,
        )?;
        same("logspace", &got, &c["out"])?;
    }
    Ok(())
}

/// PyTorch's refusals: ember's message contains the phrase recorded from
/// PyTorch's, on every device.
fn ops_refuse_as_pytorch(dev: &Device) -> Result<()> {
    let all = ops_cases();
    let z = |s: &[usize]| Tensor::zeros(s, DType::F64, dev);
    let i64s = |v: &[i64]| Tensor::from_vec(v.to_vec(), [v.len()], dev);
    let f32z = |s: &[usize]| Tensor::zeros(s, DType::F32, dev);
    let errors = all["errors"]["errors"].as_array().unwrap();
    assert!(errors.len() >= 45);
    for e in errors {
        let name = e["name"].as_str().unwrap();
        let phrase = e["phrase"].as_str().unwrap();
        let got: Result<Vec<Tensor>> = match name {
            "movedim_lengths" => z(&[2, 3])?.movedim([0, 1], [0]).map(|t| vec![t]),
            "movedim_repeat_source" => z(&[2, 3])?.movedim([0, 0], [0, 1]).map(|t| vec![t]),
            "movedim_repeat_destination" => z(&[2, 3])?.movedim([0, 1], [1, 1]).map(|t| vec![t]),
            "movedim_range" => z(&[2, 3])?.movedim(2, 0).map(|t| vec![t]),
            "view_as_strides" => z(&[2, 3])?.t()?.view_as(&z(&[6])?).map(|t| vec![t]),
            "expand_as" => z(&[2, 3])?.expand_as(&z(&[3, 3])?).map(|t| vec![t]),
            "unflatten_sizes" => z(&[2, 6])?.unflatten(1, &[4, -1]).map(|t| vec![t]),
            "unflatten_two_inferred" => z(&[2, 6])?.unflatten(1, &[-1, -1]).map(|t| vec![t]),
            "ri_negative" => z(&[3])?
                .repeat_interleave_tensor(&i64s(&[1, -1, 2])?, None, None)
                .map(|t| vec![t]),
            "ri_length" => z(&[3])?
                .repeat_interleave_tensor(&i64s(&[1, 2])?, None, None)
                .map(|t| vec![t]),
            "ri_2d_repeats" => z(&[3])?
                .repeat_interleave_tensor(&i64s(&[1, 2, 3])?.reshape([1, 3])?, None, None)
                .map(|t| vec![t]),
            "hstack_empty" => Tensor::hstack(&[]).map(|t| vec![t]),
            "vstack_empty" => Tensor::vstack(&[]).map(|t| vec![t]),
            "tensor_split_0d" => z(&[])?.tensor_split(2, 0),
            "tensor_split_zero" => z(&[4])?.tensor_split(0, 0),
            "hsplit_0d" => z(&[])?.hsplit(2),
            "hsplit_divisible" => z(&[2, 5])?.hsplit(2),
            "vsplit_rank" => z(&[4])?.vsplit(2),
            "dsplit_rank" => z(&[2, 4])?.dsplit(2),
            "dsplit_divisible" => z(&[1, 2, 3])?.dsplit(2),
            "rot90_dims_len" => z(&[2, 3])?.rot90(1, [0, 1, 2]).map(|t| vec![t]),
            "rot90_rank" => z(&[3])?.rot90(1, [0, 1]).map(|t| vec![t]),
            "rot90_same" => z(&[2, 3])?.rot90(1, [1, 1]).map(|t| vec![t]),
            "rot90_wrapped_same" => z(&[2, 3])?.rot90(1, [1, -1]).map(|t| vec![t]),
            "rot90_range" => z(&[2, 3])?.rot90(1, [0, 2]).map(|t| vec![t]),
            "diagonal_same" => z(&[2, 3])?.diagonal(0, 1, -1).map(|t| vec![t]),
            "diagonal_1d" => z(&[3])?.diagonal(0, 0, 1).map(|t| vec![t]),
            "diag_rank" => z(&[2, 2, 2])?.diag(0).map(|t| vec![t]),
            "diag_embed_same" => z(&[2, 3])?.diag_embed(0, 1, -2).map(|t| vec![t]),
            "trace_rank" => z(&[2, 2, 2])?.trace().map(|t| vec![t]),
            "trace_bool" => Tensor::zeros([2, 2], DType::Bool, dev)?
                .trace()
                .map(|t| vec![t]),
            "block_diag_rank" => {
                Tensor::block_diag(&[&z(&[2, 2])?, &z(&[1, 2, 2])?]).map(|t| vec![t])
            }
            "cartesian_prod_rank" => {
                Tensor::cartesian_prod(&[&z(&[2])?, &z(&[2, 2])?]).map(|t| vec![t])
            }
            "meshgrid_rank" => Tensor::meshgrid(&[&z(&[2])?, &z(&[2, 2])?], "ij"),
            "meshgrid_dtype" => {
                Tensor::meshgrid(&[&z(&[2])?, &Tensor::zeros([2], DType::I64, dev)?], "ij")
            }
            "take_along_dim_rank" => z(&[2, 3])?
                .take_along_dim(&i64s(&[0])?, Some(1))
                .map(|t| vec![t]),
            "take_along_dim_dtype" => z(&[2, 3])?
                .take_along_dim(&z(&[2, 3])?, Some(1))
                .map(|t| vec![t]),
            "take_along_dim_bcast" => z(&[2, 3])?
                .take_along_dim(&i64s(&[0, 1, 0])?.reshape([3, 1])?, Some(1))
                .map(|t| vec![t]),
            "index_fill_value_rank" => z(&[3])?
                .index_fill(0, &i64s(&[0])?, &z(&[2])?)
                .map(|t| vec![t]),
            "index_fill_index_rank" => z(&[3])?
                .index_fill(0, &i64s(&[0])?.reshape([1, 1])?, 1.0)
                .map(|t| vec![t]),
            "index_copy_index_rank" => z(&[3])?
                .index_copy(0, &i64s(&[0])?.reshape([1, 1])?, &z(&[1])?)
                .map(|t| vec![t]),
            "index_copy_count" => z(&[3, 2])?
                .index_copy(0, &i64s(&[0, 1])?, &z(&[3, 2])?)
                .map(|t| vec![t]),
            "index_copy_dtype" => z(&[3])?
                .index_copy(0, &i64s(&[0])?, &f32z(&[1])?)
                .map(|t| vec![t]),
            "index_copy_slices" => z(&[3, 2])?
                .index_copy(0, &i64s(&[0])?, &z(&[1, 3])?)
                .map(|t| vec![t]),
            "scatter_rank" => z(&[3, 2])?
                .scatter(0, &i64s(&[0])?, &z(&[1])?)
                .map(|t| vec![t]),
            "scatter_dtype" => z(&[3])?
                .scatter(0, &i64s(&[0])?, &f32z(&[1])?)
                .map(|t| vec![t]),
            "scatter_index_dtype" => z(&[3])?.scatter(0, &z(&[1])?, &z(&[1])?).map(|t| vec![t]),
            "scatter_index_larger" => z(&[2, 2])?
                .scatter(0, &i64s(&[0, 1, 0])?.reshape([1, 3])?, &z(&[1, 3])?)
                .map(|t| vec![t]),
            "scatter_reduce_name" => z(&[3])?
                .scatter_reduce(0, &i64s(&[0])?, &z(&[1])?, "foo", true)
                .map(|t| vec![t]),
            other => panic!("unknown error case {other}"),
        };
        let msg = match got {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{name}: no error"),
        };
        assert!(msg.contains(phrase), "{name}: {msg:?} lacks {phrase:?}");
    }
    Ok(())
}

/// Views stay views (shared storage), the gradient of a diagonal view goes
/// back to the diagonal, `unflatten` is the one `nn::Unflatten` uses, and a
/// repeated index writes its last value.
fn views_and_duplicates(dev: &Device) -> Result<()> {
    let x = Tensor::arange(0f64, 12.0, dev)?.reshape([3, 4])?;
    let d = x.diagonal(1, 0, 1)?;
    assert_eq!(d.to_vec::<f64>()?, [1.0, 6.0, 11.0]);
    assert!(x.movedim(0, 1)?.to_vec2::<f64>()?[1] == [1.0, 5.0, 9.0]);
    let w = x.detach().requires_grad_(true)?;
    w.diagonal(-1, 1, 0)?.sum_all()?.backward()?;
    let g = w.grad().unwrap().to_vec::<f64>()?;
    // offset -1 of (dim1 = 1, dim2 = 0): elements (c = i, r = i - 1)
    assert_eq!(g, [0., 1., 0., 0., 0., 0., 1., 0., 0., 0., 0., 1.]);
    use ember::nn::Module;
    let y = ember::nn::Unflatten::new(1, [2, -1]).forward(&x)?;
    assert_eq!(y.shape(), &[3, 2, 2]);
    let idx = Tensor::from_vec(vec![2i64, 0, 2, 2], [4], dev)?;
    let src = Tensor::new([1f32, 2., 3., 4.], dev)?;
    let out = Tensor::zeros([3], DType::F32, dev)?.scatter(0, &idx, &src)?;
    assert_eq!(out.to_vec::<f32>()?, [2., 0., 4.]);
    let m = Tensor::zeros([3, 1], DType::I64, dev)?;
    let s = Tensor::new([[5i64], [6], [7]], dev)?;
    let out = m.index_copy(0, &Tensor::new([1i64, 1, 0], dev)?, &s)?;
    assert_eq!(i64s(&out), [7, 6, 0]);
    Ok(())
}

device_test!(
    ops_match_pytorch,
    creation_matches_pytorch,
    ops_refuse_as_pytorch,
    views_and_duplicates
);
