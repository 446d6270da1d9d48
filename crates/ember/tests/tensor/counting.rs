//! Ordering and counting ops against PyTorch (tests/golden/counting_cases.json,
//! made by tests/golden/gen_counting.py): outputs and the gradients of the
//! first output's sum on every device, shapes and dtypes on meta, and
//! PyTorch's refusals in its words.

use super::golden_tensor as tensor;
use ember::prelude::*;
use serde_json::Value;

fn cases() -> Value {
    super::golden("counting_cases.json")
}

fn call(name: &str, x: &[Tensor]) -> Result<Vec<Tensor>> {
    let (a, b) = (&x[0], x.get(1));
    let pair = |r: Result<(Tensor, Tensor)>| r.map(|(v, i)| vec![v, i]);
    match name {
        "msort" | "msort_i64" => Ok(vec![a.msort()?]),
        "kthvalue_2_m1" => pair(a.kthvalue(2, -1, false)),
        "kthvalue_1_0_keep" => pair(a.kthvalue(1, 0, true)),
        "kthvalue_4_1" => pair(a.kthvalue(4, 1, false)),
        "kthvalue_i64" => pair(a.kthvalue(2, 0, false)),
        "searchsorted_left"
        | "searchsorted_nd"
        | "searchsorted_i64"
        | "searchsorted_long"
        | "searchsorted_nan_seq"
        | "searchsorted_empty_seq"
        | "searchsorted_empty_values"
        | "searchsorted_mixed"
        | "searchsorted_bf16"
        | "searchsorted_u8"
        | "searchsorted_scalar_value" => Ok(vec![a.searchsorted(b.unwrap(), false)?]),
        "searchsorted_right"
        | "searchsorted_nd_right"
        | "searchsorted_long_right"
        | "searchsorted_nan_seq_right"
        | "searchsorted_batch_i64"
        | "searchsorted_mixed_f64"
        | "searchsorted_f16_right" => Ok(vec![a.searchsorted(b.unwrap(), true)?]),
        "bucketize" | "bucketize_long" => Ok(vec![a.bucketize(b.unwrap(), false)?]),
        "bucketize_right" => Ok(vec![a.bucketize(b.unwrap(), true)?]),
        n => panic!("case {n}"),
    }
}

fn values(t: &Tensor) -> Result<Vec<f64>> {
    t.to_dtype(DType::F64)?.to_vec::<f64>()
}

fn counting_matches_pytorch(dev: &Device) -> Result<()> {
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
            crate::assert_close(&values(o)?, &values(&want)?, 1e-6, 1e-12);
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
                crate::assert_close(
                    &values(&got)?,
                    &values(&tensor(g, &Device::Cpu)?)?,
                    1e-6,
                    1e-12,
                );
            }
        }
    }
    Ok(())
}

device_test!(counting_matches_pytorch);

#[test]
fn counting_runs_on_meta_with_pytorchs_shapes() -> Result<()> {
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
fn counting_refusals_use_pytorchs_words() -> Result<()> {
    let dev = Device::Cpu;
    let all = cases();
    for e in all["errors"].as_array().unwrap() {
        let name = e["name"].as_str().unwrap();
        let want = e["message"].as_str().unwrap();
        let z = |s: &[usize]| Tensor::zeros(s, DType::F32, &dev);
        let got = match name {
            "kthvalue_k_big" => z(&[3])?.kthvalue(4, -1, false).map(|_| ()),
            "kthvalue_k_zero" => z(&[3])?.kthvalue(0, -1, false).map(|_| ()),
            "searchsorted_shape" => z(&[2, 3])?.searchsorted(&z(&[3, 1])?, false).map(|_| ()),
            "bucketize_2d" => z(&[3])?.bucketize(&z(&[2, 2])?, false).map(|_| ()),
            "searchsorted_bool" => Tensor::from_vec(vec![false, true], [2], &dev)?
                .searchsorted(&Tensor::from_vec(vec![true], [1], &dev)?, false)
                .map(|_| ()),
            n => panic!("error case {n}"),
        };
        let msg = got.expect_err(name).to_string();
        assert!(msg.contains(want), "{name}: {msg:?} lacks {want:?}");
    }
    Ok(())
}

/// Many values over many sequences (the parallel host path and the kernel's
/// grid), a strided sequence, values exactly at elements: the answers of a
/// linear scan, on every device.
fn searchsorted_matches_a_scan(dev: &Device) -> Result<()> {
    let (rows, m, per) = (3usize, 1000usize, 30_000usize);
    // elements on a coarse grid (many repeats), values on a finer one (many hits)
    let seq: Vec<f32> = (0..rows * m)
        .map(|i| ((i % m) / 3) as f32 * 0.5 + (i / m) as f32)
        .collect();
    let vals: Vec<f32> = (0..rows * per)
        .map(|i| ((i * 7919) % 2200) as f32 * 0.25 - 10.0)
        .collect();
    // the sequences stored as columns, so `seq` is a strided view
    let s = Tensor::from_vec(seq.clone(), [rows, m], dev)?
        .t()?
        .contiguous()?
        .t()?;
    assert!(!s.is_contiguous());
    let v = Tensor::from_vec(vals.clone(), [rows, per], dev)?;
    for right in [false, true] {
        let got = s.searchsorted(&v, right)?.to_vec::<i64>()?;
        let want: Vec<i64> = (0..rows * per)
            .map(|i| {
                let (row, x) = (&seq[(i / per) * m..][..m], vals[i]);
                row.iter()
                    .filter(|&&e| if right { e <= x } else { e < x })
                    .count() as i64
            })
            .collect();
        assert_eq!(got, want, "right={right}");
    }
    Ok(())
}

device_test!(searchsorted_matches_a_scan);

/// argsort over lines longer than a GPU's counting sort takes (merge passes
/// there), with many ties, NaNs and a stride between a line's elements: the
/// stable order of a host sort, ascending and descending, in f32, bf16 and int64.
fn long_lines_sort_stably(dev: &Device) -> Result<()> {
    use std::cmp::Ordering;
    let (outer, n, inner) = (2usize, 3001usize, 3usize);
    let vals: Vec<f64> = (0..outer * n * inner)
        .map(|k| match k % 211 {
            0 => f64::NAN,
            _ => ((k * 37) % 50) as f64 - 20.0,
        })
        .collect();
    let want = |desc: bool| -> Vec<i64> {
        let mut out = vec![0i64; vals.len()];
        for o in 0..outer {
            for i in 0..inner {
                let at = |j: usize| vals[(o * n + j) * inner + i];
                let mut idx: Vec<usize> = (0..n).collect();
                // NaN above every number; a stable sort keeps equal keys in order
                idx.sort_by(|&a, &b| {
                    let ord = match (at(a).is_nan(), at(b).is_nan()) {
                        (true, true) => Ordering::Equal,
                        (true, false) => Ordering::Greater,
                        (false, true) => Ordering::Less,
                        _ => at(a).partial_cmp(&at(b)).unwrap(),
                    };
                    if desc {
                        ord.reverse()
                    } else {
                        ord
                    }
                });
                for (j, &k) in idx.iter().enumerate() {
                    out[(o * n + j) * inner + i] = k as i64;
                }
            }
        }
        out
    };
    let x = Tensor::from_vec(vals.clone(), [outer, n, inner], dev)?;
    for dtype in [DType::F32, DType::BF16] {
        let x = x.to_dtype(dtype)?;
        for desc in [false, true] {
            let got = x.argsort(1, desc)?.to_vec::<i64>()?;
            assert_eq!(got, want(desc), "{dtype:?} descending={desc}");
        }
    }
    // integers (no NaN): a 1-D line of int64, sorted values and indices
    let ints: Vec<i64> = (0..5000).map(|k| (k * 7919 % 613) as i64 - 300).collect();
    let t = Tensor::from_vec(ints.clone(), [5000], dev)?;
    let (v, i) = t.sort(0, true)?;
    let mut order: Vec<usize> = (0..ints.len()).collect();
    order.sort_by(|&a, &b| ints[b].cmp(&ints[a]));
    assert_eq!(
        i.to_vec::<i64>()?,
        order.iter().map(|&k| k as i64).collect::<Vec<_>>()
    );
    assert_eq!(
        v.to_vec::<i64>()?,
        order.iter().map(|&k| ints[k]).collect::<Vec<_>>()
    );
    Ok(())
}

device_test!(long_lines_sort_stably);
