//! lerp, addcmul/addcdiv, the clamp-like and smooth activations and cosine
//! similarity beyond their golden cases: the activation modules (and their
//! in-place forms), the similarity modules, in-place recording, and the values
//! a view keeps.

use super::assert_close;
use ember::nn::{self, Module};
use ember::prelude::*;

fn activation_modules_match_their_functions(dev: &Device) -> Result<()> {
    let x = Tensor::from_vec(vec![-3.0f32, -0.5, 0.0, 0.7, 2.0, 7.0], [2, 3], dev)?;
    let cases: Vec<(Box<dyn Module>, Tensor)> = vec![
        (Box::new(nn::ReLU6), x.relu6()?),
        (Box::new(nn::SELU), x.selu()?),
        (Box::new(nn::Mish), x.mish()?),
        (Box::new(nn::Hardtanh::default()), x.hardtanh(-1.0, 1.0)?),
        (
            Box::new(nn::CELU {
                alpha: 0.5,
                inplace: false,
            }),
            x.celu(0.5)?,
        ),
    ];
    for (m, want) in cases {
        let got = m.forward(&x)?;
        assert_close(&got.to_vec::<f64>()?, &want.to_vec::<f64>()?, 0.0, 0.0);
    }
    assert_eq!(
        x.relu6()?.to_vec::<f32>()?,
        vec![0.0, 0.0, 0.0, 0.7, 2.0, 6.0]
    );
    // in place: the module returns its input, written
    let y = x.copy()?;
    let out = nn::ReLU6::inplace().forward(&y)?;
    assert_eq!(y.to_vec::<f32>()?, x.relu6()?.to_vec::<f32>()?);
    assert_eq!(out.to_vec::<f32>()?, y.to_vec::<f32>()?);
    let y = x.copy()?;
    nn::Hardtanh {
        min_val: -0.5,
        max_val: 0.5,
        inplace: true,
    }
    .forward(&y)?;
    assert_eq!(y.to_vec::<f32>()?, vec![-0.5, -0.5, 0.0, 0.5, 0.5, 0.5]);
    Ok(())
}

/// An op of `(self, other)` and its in-place form.
type OutOfPlace = fn(&Tensor, &Tensor) -> Result<Tensor>;
type InPlace = fn(&Tensor, &Tensor) -> Result<()>;

fn inplace_forms_record_as_the_out_of_place_ones(dev: &Device) -> Result<()> {
    let base = Tensor::from_vec(vec![-2.0f64, -0.3, 0.4, 1.5], [4], dev)?;
    let end = Tensor::from_vec(vec![1.0f64, 2.0, -1.0, 0.5], [4], dev)?;
    let ops: Vec<(&str, OutOfPlace, InPlace)> = vec![
        ("selu", |t, _| t.selu(), |t, _| t.selu_()),
        ("mish", |t, _| t.mish(), |t, _| t.mish_()),
        ("celu", |t, _| t.celu(0.8), |t, _| t.celu_(0.8)),
        (
            "hardtanh",
            |t, _| t.hardtanh(-1.0, 1.0),
            |t, _| t.hardtanh_(-1.0, 1.0),
        ),
        (
            "log10",
            |t, _| t.abs()?.log10(),
            |t, _| {
                t.abs_()?;
                t.log10_()
            },
        ),
        ("lerp", |t, e| t.lerp(e, 0.7), |t, e| t.lerp_(e, 0.7)),
        (
            "addcmul",
            |t, e| t.addcmul(e, e, 0.5),
            |t, e| t.addcmul_(e, e, 0.5),
        ),
        (
            "addcdiv",
            |t, e| t.addcdiv(e, e, 0.5),
            |t, e| t.addcdiv_(e, e, 0.5),
        ),
    ];
    for (name, f, f_) in ops {
        let (x, e) = (
            base.copy()?.requires_grad_(true)?,
            end.copy()?.requires_grad_(true)?,
        );
        f(&x.mul(1.0)?, &e)?.sum_all()?.backward()?;
        let (want_x, want_e) = (x.grad().unwrap(), e.grad());
        let (x, e) = (
            base.copy()?.requires_grad_(true)?,
            end.copy()?.requires_grad_(true)?,
        );
        let h = x.mul(1.0)?;
        f_(&h, &e)?;
        h.sum_all()?.backward()?;
        let got = x.grad().unwrap().to_vec::<f64>()?;
        assert_close(&got, &want_x.to_vec::<f64>()?, 1e-12, 1e-12);
        if let Some(we) = want_e {
            let ge = e.grad().unwrap_or_else(|| panic!("{name}: end's gradient"));
            assert_close(&ge.to_vec::<f64>()?, &we.to_vec::<f64>()?, 1e-12, 1e-12);
        }
    }
    Ok(())
}

fn unbind_gives_views(dev: &Device) -> Result<()> {
    let x = Tensor::arange(0.0, 6.0, dev)?.reshape([2, 3])?;
    let cols = x.unbind(1)?;
    assert_eq!(cols.len(), 3);
    assert!(cols.iter().all(|c| c.shape() == [2]));
    assert_eq!(cols[2].to_vec::<f32>()?, vec![2.0, 5.0]);
    // views: a write into the tensor shows through them
    x.add_(1.0)?;
    assert_eq!(cols[2].to_vec::<f32>()?, vec![3.0, 6.0]);
    assert!(Tensor::zeros([0, 2], DType::F32, dev)?
        .unbind(0)?
        .is_empty());
    Ok(())
}

fn similarity_modules(dev: &Device) -> Result<()> {
    let a = Tensor::from_vec(vec![1.0f32, 0.0, 3.0, 4.0], [2, 2], dev)?;
    let b = Tensor::from_vec(vec![1.0f32, 0.0, 4.0, -3.0], [2, 2], dev)?;
    let c = nn::CosineSimilarity::default().forward(&a, &b)?;
    assert_close(&c.to_vec::<f64>()?, &[1.0, 0.0], 1e-6, 1e-6);
    let d = nn::PairwiseDistance::default().forward(&a, &b)?;
    let want = [
        1e-6 * 2f64.sqrt(),
        ((1.0f64 + 1e-6).powi(2) + (7.0 + 1e-6f64).powi(2)).sqrt(),
    ];
    assert_close(&d.to_vec::<f64>()?, &want, 1e-5, 1e-6);
    Ok(())
}

fn median_picks_the_lower_middle(dev: &Device) -> Result<()> {
    let x = Tensor::from_vec(vec![4.0f32, 1.0, 3.0, 2.0, 9.0, 0.0], [2, 3], dev)?;
    assert_eq!(x.median()?.item::<f32>()?, 2.0);
    let (v, i) = x.median_dim(1, false)?;
    assert_eq!(v.to_vec::<f32>()?, vec![3.0, 2.0]);
    assert_eq!(i.to_vec::<i64>()?, vec![2, 0]);
    Ok(())
}

device_test!(
    activation_modules_match_their_functions,
    inplace_forms_record_as_the_out_of_place_ones,
    unbind_gives_views,
    similarity_modules,
    median_picks_the_lower_middle,
);
