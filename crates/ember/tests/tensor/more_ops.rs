//! Running extremes, bit ops and products against PyTorch
//! (tests/golden/more_ops_cases.json, made by tests/golden/gen_more_ops.py):
//! outputs and the gradients of the first output's sum on every device,
//! shapes and dtypes on meta, and PyTorch's refusals in its words.

use super::golden_tensor as tensor;
use ember::prelude::*;
use serde_json::Value;

fn cases() -> Value {
    super::golden("more_ops_cases.json")
}

fn call(name: &str, x: &[Tensor]) -> Result<Vec<Tensor>> {
    let (a, b) = (&x[0], x.get(1));
    let b = || b.unwrap();
    let pair = |r: Result<(Tensor, Tensor)>| r.map(|(v, i)| vec![v, i]);
    let one = |r: Result<Tensor>| r.map(|t| vec![t]);
    match name {
        "cummax_1" | "cummax_empty_dim" => pair(a.cummax(1)),
        "cummin_0" => pair(a.cummin(0)),
        "cummax_nan" | "cummax_bool" | "cummax_0d" => pair(a.cummax(0)),
        "cummin_nan" => pair(a.cummin(-1)),
        "cummax_m1" => pair(a.cummax(-1)),
        "cummin_i64" | "cummin_empty" => pair(a.cummin(0)),
        "logcumsumexp_1" | "logcumsumexp_nan" => one(a.logcumsumexp(1)),
        "logcumsumexp_big" | "logcumsumexp_inf" | "logcumsumexp_0d" | "logcumsumexp_empty" => {
            one(a.logcumsumexp(0))
        }
        "logcumsumexp_f32" => one(a.logcumsumexp(-2)),
        "hypot" | "hypot_0d" | "hypot_f32_big" | "hypot_mixed" | "hypot_inf" => one(a.hypot(b())),
        "heaviside" | "heaviside_0d" | "heaviside_i64" => one(a.heaviside(b())),
        "bitwise_and_i64"
        | "bitwise_and_u8"
        | "bitwise_and_empty"
        | "bitwise_and_bool"
        | "bitwise_and_bool_u8" => one(a.bitwise_and(b())),
        "bitwise_or_i64" | "bitwise_or_u8" | "bitwise_or_bool" | "bitwise_or_i64_u8" => {
            one(a.bitwise_or(b()))
        }
        "bitwise_xor_i64" | "bitwise_xor_u8" | "bitwise_xor_bool" => one(a.bitwise_xor(b())),
        "bitwise_not_i64" | "bitwise_not_u8" | "bitwise_not_bool" => one(a.bitwise_not()),
        "left_shift_i64" | "left_shift_u8" | "left_shift_0d" => one(a.bitwise_left_shift(b())),
        "right_shift_i64" | "right_shift_u8" => one(a.bitwise_right_shift(b())),
        "bitwise_and_scalar" => one(a.bitwise_and(6i64)),
        "bitwise_xor_bool_scalar" => one(a.bitwise_xor(3i64)),
        "right_shift_scalar" => one(a.bitwise_right_shift(2i64)),
        "cross_m1" | "cross_i64" | "cross_empty" => one(a.cross(b(), -1)),
        "cross_0_bcast" => one(a.cross(b(), 0)),
        "kron_2d" | "kron_empty" | "kron_rank" | "kron_0d" => one(a.kron(b())),
        "tensordot_2" => one(a.tensordot(b(), &[1, 2], &[1, 0])),
        "tensordot_neg" => one(a.tensordot(b(), &[-1], &[0])),
        "tensordot_none" => one(a.tensordot(b(), &[], &[])),
        "baddbmm" => one(a.baddbmm(b(), &x[2], 0.5, 2.0)),
        "baddbmm_beta0" => one(a.baddbmm(b(), &x[2], 0.0, 1.0)),
        "addbmm" => one(a.addbmm(b(), &x[2], 1.0, -1.5)),
        "addmv" => one(a.addmv(b(), &x[2], 2.0, 0.5)),
        "addmv_f32" => one(a.addmv(b(), &x[2], 1.0, 1.0)),
        "addmv_i64" => one(a.addmv(b(), &x[2], 1.5, 2.5)),
        "addr" => one(a.addr(b(), &x[2], 1.0, 1.0)),
        "addr_i64" => one(a.addr(b(), &x[2], 2.0, 3.0)),
        "cdist_2" | "cdist_empty" | "cdist_mm" => one(a.cdist(b(), 2.0)),
        "cdist_1_batch" => one(a.cdist(b(), 1.0)),
        "cdist_inf" => one(a.cdist(b(), f64::INFINITY)),
        "cdist_0" => one(a.cdist(b(), 0.0)),
        "cdist_3" => one(a.cdist(b(), 3.0)),
        "cdist_half" => one(a.cdist(b(), 0.5)),
        "argwhere" | "argwhere_i64" | "argwhere_0d" | "argwhere_0d_zero" | "argwhere_empty" => {
            one(a.argwhere())
        }
        "bincount" | "bincount_empty" | "bincount_u8" => one(a.bincount(None, 0)),
        "bincount_minlength" => one(a.bincount(None, 10)),
        "bincount_w32" => one(a.bincount(Some(b()), 0)),
        "bincount_w_i64" => one(a.bincount(Some(b()), 5)),
        "histc" => one(a.histc(7, -1.0, 1.0)),
        "histc_auto" | "histc_same" => {
            one(a.histc(4 - usize::from(name == "histc_same"), 0.0, 0.0))
        }
        "histc_nan" => one(a.histc(2, 0.0, 1.0)),
        "histc_edges" => one(a.histc(10, 0.1, 0.7)),
        "histc_edges_f32" => one(a.histc(13, 0.1, 0.7)),
        n => panic!("case {n}"),
    }
}

/// The values of `t` as f64 (int64 beyond 2^53 compared through their
/// exact i64 values instead, see [`exact`]).
fn values(t: &Tensor) -> Result<Vec<f64>> {
    t.to_dtype(DType::F64)?.to_vec::<f64>()
}

/// int64 values exactly, for the bit ops' full-width results.
fn exact(t: &Tensor) -> Result<Option<Vec<i64>>> {
    if t.dtype() == DType::I64 {
        Ok(Some(t.to_vec::<i64>()?))
    } else {
        Ok(None)
    }
}

fn tolerance(dt: DType) -> (f64, f64) {
    if dt == DType::F32 {
        (1e-5, 1e-6)
    } else {
        (1e-9, 1e-12)
    }
}

fn more_ops_match_pytorch(dev: &Device) -> Result<()> {
    let all = cases();
    for case in all["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let inputs: Vec<Tensor> = case["inputs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                let t = tensor(v, dev)?;
                if t.dtype().is_float() {
                    t.requires_grad_(true)
                } else {
                    Ok(t)
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
            assert_eq!(o.device(), *dev, "{name}");
            match exact(o)? {
                Some(got) => assert_eq!(got, exact(&want)?.unwrap(), "{name}"),
                None => {
                    let (rtol, atol) = tolerance(o.dtype());
                    crate::assert_close(&values(o)?, &values(&want)?, rtol, atol)
                }
            }
        }
        let grads = case["grads"].as_array().unwrap();
        if !grads.is_empty() {
            outs[0].sum_all()?.backward()?;
            for (x, g) in inputs.iter().zip(grads) {
                if g.is_null() {
                    continue;
                }
                let got = match x.grad() {
                    Some(g) => g,
                    None => x.zeros_like()?,
                };
                let (rtol, atol) = tolerance(x.dtype());
                crate::assert_close(
                    &values(&got)?,
                    &values(&tensor(g, &Device::Cpu)?)?,
                    rtol,
                    atol,
                );
            }
        } else if let Some(op) = ["heaviside", "bincount"]
            .into_iter()
            .find(|p| name.starts_with(p))
        {
            // no derivative: the backward pass is refused where one is asked for
            if outs[0].requires_grad() {
                let e = outs[0].sum_all()?.backward().expect_err(name).to_string();
                let want = format!("derivative for aten::{op} is not implemented");
                assert!(e.contains(&want), "{name}: {e}");
            }
        } else if name.starts_with("histc") {
            assert!(!outs[0].requires_grad(), "{name} has no gradient");
        }
    }
    Ok(())
}

device_test!(more_ops_match_pytorch);

#[test]
fn more_ops_run_on_meta_with_pytorchs_shapes() -> Result<()> {
    let all = cases();
    for case in all["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let inputs: Vec<Tensor> = case["inputs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                let t = tensor(v, &Device::Cpu)?;
                Tensor::zeros(t.shape(), t.dtype(), &Device::Meta)
            })
            .collect::<Result<_>>()?;
        // the counts' sizes depend on values, which a meta tensor lacks (an
        // empty bincount needs none)
        let reads_values = ["argwhere", "bincount", "histc_auto", "histc_same"]
            .iter()
            .any(|p| name.starts_with(p))
            && name != "bincount_empty";
        if reads_values {
            assert!(call(name, &inputs).is_err(), "{name} on meta");
            continue;
        }
        for (o, w) in call(name, &inputs)?
            .iter()
            .zip(case["outputs"].as_array().unwrap())
        {
            let want = tensor(w, &Device::Cpu)?;
            assert_eq!(
                (o.shape(), o.dtype()),
                (want.shape(), want.dtype()),
                "{name}"
            );
            assert_eq!(o.device(), Device::Meta, "{name}");
        }
    }
    Ok(())
}

#[test]
fn more_ops_refusals_use_pytorchs_words() -> Result<()> {
    let dev = Device::Cpu;
    let all = cases();
    let t = |v: &[f64], dt: DType| Tensor::from_vec(v.to_vec(), [v.len()], &dev)?.to_dtype(dt);
    for e in all["errors"].as_array().unwrap() {
        let name = e["name"].as_str().unwrap();
        let want = e["message"].as_str().unwrap();
        let (f32s, f64s, i64s) = (
            t(&[1.0], DType::F32)?,
            t(&[1.0], DType::F64)?,
            t(&[1.0, 2.0], DType::I64)?,
        );
        let bools = t(&[1.0], DType::Bool)?;
        let z = |s: &[usize]| Tensor::zeros(s, DType::F32, &dev);
        let got = match name {
            "cummax_dim" => t(&[0.0; 3], DType::F32)?.cummax(1).map(|_| ()),
            "logcumsumexp_i64" => i64s.logcumsumexp(0).map(|_| ()),
            "hypot_i64" => i64s.hypot(&i64s).map(|_| ()),
            "heaviside_dtypes" => f32s.heaviside(&f64s).map(|_| ()),
            "heaviside_backward" => {
                let x = t(&[1.0, 0.0], DType::F32)?.requires_grad_(true)?;
                x.heaviside(&t(&[0.5], DType::F32)?)?.sum_all()?.backward()
            }
            "bitwise_and_f32" => f32s.bitwise_and(&f32s).map(|_| ()),
            "bitwise_or_f32_i64" => i64s.bitwise_or(&f32s).map(|_| ()),
            "bitwise_xor_f64" => f64s.bitwise_xor(&f64s).map(|_| ()),
            "bitwise_not_f32" => f32s.bitwise_not().map(|_| ()),
            "left_shift_bool" => bools.bitwise_left_shift(&bools).map(|_| ()),
            "right_shift_f32" => f32s.bitwise_right_shift(&f32s).map(|_| ()),
            "cross_len" => z(&[2, 2])?.cross(&z(&[2, 2])?, -1).map(|_| ()),
            "cross_dtype" => z(&[3])?
                .cross(&z(&[3])?.to_dtype(DType::F64)?, -1)
                .map(|_| ()),
            "cross_rank" => z(&[2, 3])?.cross(&z(&[3])?, -1).map(|_| ()),
            "tensordot_size" => z(&[2, 3])?.tensordot(&z(&[2, 3])?, &[1], &[0]).map(|_| ()),
            "tensordot_len" => z(&[2, 3])?
                .tensordot(&z(&[3, 2])?, &[1, 0], &[0])
                .map(|_| ()),
            "baddbmm_3d" => z(&[2, 2])?
                .baddbmm(&z(&[2, 2])?, &z(&[2, 2, 2])?, 1.0, 1.0)
                .map(|_| ()),
            "baddbmm_shape" => z(&[2, 2])?
                .baddbmm(&z(&[2, 2, 3])?, &z(&[2, 2, 2])?, 1.0, 1.0)
                .map(|_| ()),
            "baddbmm_dtype" => z(&[2, 2, 2])?
                .baddbmm(
                    &z(&[2, 2, 3])?,
                    &z(&[2, 3, 2])?.to_dtype(DType::F64)?,
                    1.0,
                    1.0,
                )
                .map(|_| ()),
            "addbmm_3d" => z(&[2, 2])?
                .addbmm(&z(&[2, 2])?, &z(&[2, 2, 2])?, 1.0, 1.0)
                .map(|_| ()),
            "addmv_size" => z(&[2])?
                .addmv(&z(&[2, 3])?, &z(&[2])?, 1.0, 1.0)
                .map(|_| ()),
            "addmv_rank" => z(&[2])?.addmv(&z(&[2])?, &z(&[2])?, 1.0, 1.0).map(|_| ()),
            "addr_1d" => z(&[2, 2])?
                .addr(&z(&[2, 2])?, &z(&[2])?, 1.0, 1.0)
                .map(|_| ()),
            "cdist_cols" => z(&[2, 3])?.cdist(&z(&[2, 4])?, 2.0).map(|_| ()),
            "cdist_p" => z(&[2, 3])?.cdist(&z(&[2, 3])?, -1.0).map(|_| ()),
            "cdist_long" => {
                let l = z(&[2, 3])?.to_dtype(DType::I64)?;
                l.cdist(&l, 2.0).map(|_| ())
            }
            "cdist_1d" => z(&[3])?.cdist(&z(&[3])?, 2.0).map(|_| ()),
            "bincount_neg" => t(&[1.0, -1.0], DType::I64)?.bincount(None, 0).map(|_| ()),
            "bincount_2d" => i64s.reshape([1, 2])?.bincount(None, 0).map(|_| ()),
            "bincount_float" => f32s.bincount(None, 0).map(|_| ()),
            "bincount_backward" => {
                let w = t(&[1.0, 2.0], DType::F32)?.requires_grad_(true)?;
                let x = t(&[0.0, 1.0], DType::I64)?;
                x.bincount(Some(&w), 0)?.sum_all()?.backward()
            }
            "bincount_weights" => i64s.bincount(Some(&f32s), 0).map(|_| ()),
            "bincount_minlength" => i64s.bincount(None, -1).map(|_| ()),
            "histc_long" => i64s.histc(3, 0.0, 0.0).map(|_| ()),
            "histc_bins" => f32s.histc(0, 0.0, 0.0).map(|_| ()),
            "histc_minmax" => f32s.histc(3, 3.0, 1.0).map(|_| ()),
            "histc_inf" => t(&[f64::INFINITY, 1.0], DType::F32)?
                .histc(2, 0.0, 0.0)
                .map(|_| ()),
            n => panic!("error case {n}"),
        };
        // (ember's errors begin with the op's name, so a capital may be lowered)
        let msg = got.expect_err(name).to_string();
        assert!(
            msg.to_lowercase().contains(&want.to_lowercase()),
            "{name}: {msg:?} lacks {want:?}"
        );
    }
    Ok(())
}
