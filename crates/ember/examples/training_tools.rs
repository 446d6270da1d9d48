//! A tour of the training tools on a synthetic 5-class problem (16 features,
//! one rare class, 15% of the training labels missing), one printed line each:
//! `nn::init` (kaiming, orthogonal, trunc_normal, zeros) on a small MLP; parameter
//! groups with no weight decay on biases and norms; RMSprop with
//! `ReduceLrOnPlateau` against Adagrad with a `LambdaLr` closure, from the same
//! start; `cross_entropy_opts` with class weights and `ignore_index`, and with
//! class-probability targets (distilling the MLP into a linear model);
//! `bce_with_logits_opts` with `pos_weight` for a rare-class detector; and tensor
//! ops put to work: `einsum` for class prototypes and a bilinear score, `pad`
//! and `conv2d_same`, `cumsum` for accuracy against confidence, `topk` for
//! top-2 accuracy.
//!
//! `cargo run --release -p ember --example training_tools`

use ember::nn::init::{self, FanMode, Nonlinearity};
use ember::nn::{self, LayerNorm, Linear, LossOptions, Module, ReLU, Reduction, Sequential};
use ember::optim::{
    split_for_weight_decay, Adagrad, Adam, Groups, LambdaLr, LrScheduler, Optimizer,
    ReduceLrOnPlateau, RmsProp,
};
use ember::prelude::*;
use ember::PadMode;

const D: usize = 16;
const C: usize = 5;
/// How often each class occurs: the last one is rare.
const FREQ: [f32; C] = [0.3, 0.3, 0.2, 0.15, 0.05];
/// Marks a missing training label (`ignore_index`).
const UNLABELED: i64 = -1;
const EPOCHS: usize = 20;
const BATCH: usize = 100;

/// `n` points: a class drawn with `FREQ`, its mean plus unit Gaussian noise.
fn sample(means: &Tensor, n: usize, dev: &Device) -> ember::Result<(Tensor, Tensor)> {
    let y = Tensor::from_slice(&FREQ, [C], dev)?.multinomial(n, true)?;
    let x = means
        .index_select(0, &y)?
        .add(&Tensor::randn([n, D], dev)?)?;
    Ok((x, y))
}

fn param(m: &dyn Module, name: &str) -> Tensor {
    m.named_parameters()
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, t)| t)
        .expect("a parameter of the MLP")
}

/// The MLP, initialised the same way at every call.
fn mlp(dev: &Device) -> ember::Result<Sequential> {
    ember::manual_seed(1);
    let m = Sequential::new()
        .add(Linear::new(D, 64, dev)?)
        .add(LayerNorm::new(&[64], dev)?)
        .add(ReLU)
        .add(Linear::new(64, 64, dev)?)
        .add(ReLU)
        .add(Linear::new(64, C, dev)?);
    let relu = init::calculate_gain(Nonlinearity::Relu);
    init::kaiming_normal_(&param(&m, "0.weight"), FanMode::FanIn, Nonlinearity::Relu)?;
    init::orthogonal_(&param(&m, "3.weight"), relu)?;
    // a small head, as ViT initialises its classifier
    init::trunc_normal_(&param(&m, "5.weight"), 0.0, 0.02, -0.04, 0.04)?;
    for b in ["0.bias", "3.bias", "5.bias"] {
        init::zeros_(&param(&m, b))?;
    }
    Ok(m)
}

fn accuracy(logits: &Tensor, y: &Tensor) -> ember::Result<f64> {
    logits
        .argmax(-1, false)?
        .eq(y)?
        .to_dtype(DType::F64)?
        .mean_all()?
        .item::<f64>()
}

/// The share of each class's points predicted as that class.
fn recall(pred: &Tensor, y: &Tensor) -> ember::Result<String> {
    let sum =
        |t: &Tensor| -> ember::Result<f32> { t.to_dtype(DType::F32)?.sum_all()?.item::<f32>() };
    let per_class: Vec<String> = (0..C as i64)
        .map(|c| -> ember::Result<String> {
            let of_c = y.eq(c)?;
            let r = sum(&pred.eq(c)?.logical_and(&of_c)?)? / sum(&of_c)?;
            Ok(format!("{:.0}%", 100.0 * r))
        })
        .collect::<ember::Result<_>>()?;
    Ok(per_class.join(" "))
}

/// Trains `model` for `EPOCHS` epochs on the observed labels with the weighted,
/// `ignore_index` loss; `schedule` gets the optimizer and the validation loss
/// after each epoch. Returns the epochs where the first group's rate changed.
fn fit(
    model: &Sequential,
    opt: &mut Groups,
    (x, y): (&Tensor, &Tensor),
    (val_x, val_y): (&Tensor, &Tensor),
    loss_opts: LossOptions,
    mut schedule: impl FnMut(&mut Groups, f64),
) -> ember::Result<(f64, Vec<usize>)> {
    let n = x.shape()[0];
    let mut changes = Vec::new();
    let mut val = f64::NAN;
    for epoch in 1..=EPOCHS {
        let perm = Tensor::randperm(n, &x.device())?;
        for start in (0..n).step_by(BATCH) {
            let idx = perm.narrow(0, start as i64, BATCH.min(n - start))?;
            let logits = model.forward(&x.index_select(0, &idx)?)?;
            let loss = nn::cross_entropy_opts(&logits, &y.index_select(0, &idx)?, loss_opts)?;
            opt.zero_grad();
            loss.backward()?;
            opt.step()?;
        }
        val = ember::no_grad(|| nn::cross_entropy_opts(&model.forward(val_x)?, val_y, loss_opts))?
            .item::<f64>()?;
        let before = opt.lr();
        schedule(opt, val);
        if opt.lr() != before {
            changes.push(epoch);
        }
    }
    Ok((val, changes))
}

/// Two parameter groups: weight decay on the matrices, none on biases and norms.
fn groups<O: Optimizer + 'static>(
    model: &Sequential,
    make: impl Fn(Vec<Tensor>, f64) -> ember::Result<O>,
) -> ember::Result<Groups> {
    let (decay, no_decay) = split_for_weight_decay(model.parameters());
    Groups::new(vec![
        Box::new(make(decay, 1e-4)?),
        Box::new(make(no_decay, 0.0)?),
    ])
}

fn main() -> ember::Result<()> {
    let dev = Device::cuda_if_available(0);
    ember::manual_seed(0);
    let means = Tensor::randn([C, D], &dev)?.mul(0.6)?;
    let (x, y_true) = sample(&means, 1500, &dev)?;
    let (val_x, val_y) = sample(&means, 500, &dev)?;
    let (test_x, test_y) = sample(&means, 2000, &dev)?;
    let missing = Tensor::rand([1500], &dev)?.lt(0.15)?;
    let y = y_true.masked_fill(&missing, UNLABELED)?;
    let labeled = y.ge(0)?.nonzero()?.squeeze(1)?;
    let (lab_x, lab_y) = (x.index_select(0, &labeled)?, y.index_select(0, &labeled)?);
    println!(
        "{} training points on {dev}, {} of them unlabeled; class frequencies {FREQ:?}",
        x.shape()[0],
        x.shape()[0] - lab_y.numel()
    );

    // nn::init
    let model = mlp(&dev)?;
    let w3 = param(&model, "3.weight");
    let gram = w3.matmul(&w3.t()?)?;
    let eye = Tensor::eye(64, DType::F32, &dev)?.mul(2.0)?;
    println!(
        "init: kaiming_normal_ std {:.3} (sqrt(2/16) = 0.354); orthogonal_ W·Wᵀ = 2·I to {:.1e}; trunc_normal_ head max |w| {:.4} ≤ 2σ = 0.04; biases zeros_",
        param(&model, "0.weight").std_all()?.item::<f32>()?,
        gram.max_abs_diff(&eye)?,
        param(&model, "5.weight").abs()?.max_all()?.item::<f32>()?,
    );
    let (decay, no_decay) = split_for_weight_decay(model.parameters());
    let count = |ps: &[Tensor]| ps.iter().map(Tensor::numel).sum::<usize>();
    println!(
        "parameter groups: {} weight matrices ({} values) with weight decay 1e-4, {} biases and LayerNorm vectors ({} values) without",
        decay.len(),
        count(&decay),
        no_decay.len(),
        count(&no_decay)
    );

    // class weights: inverse frequency of the observed labels
    let counts = lab_y.one_hot(C)?.to_dtype(DType::F32)?.sum(0, false)?;
    let weight = counts.recip()?.mul(lab_y.numel() as f64 / C as f64)?;
    let loss_opts = LossOptions {
        weight: Some(&weight),
        ignore_index: UNLABELED,
        ..Default::default()
    };
    let logits = ember::no_grad(|| model.forward(&x))?;
    let all = nn::cross_entropy_opts(&logits, &y, loss_opts)?.item::<f32>()?;
    let only = nn::cross_entropy_opts(
        &logits.index_select(0, &labeled)?,
        &lab_y,
        LossOptions {
            weight: Some(&weight),
            ..Default::default()
        },
    )?
    .item::<f32>()?;
    println!(
        "cross_entropy, class weights {:.2?}, ignore_index {UNLABELED}: {all:.4} over every row = {only:.4} over the labeled rows alone",
        weight.to_vec1::<f32>()?
    );

    // RMSprop + ReduceLROnPlateau against Adagrad + LambdaLR, from the same start
    let rms_model = mlp(&dev)?;
    let mut rms = groups(&rms_model, |ps, wd| {
        RmsProp::new(ps, 1e-3)?.weight_decay(wd)
    })?;
    let mut plateau = ReduceLrOnPlateau::new(0.5, 2)?;
    let (rms_val, rms_changes) = fit(
        &rms_model,
        &mut rms,
        (&x, &y),
        (&val_x, &val_y),
        loss_opts,
        |opt, val| plateau.step_metric(opt, val),
    )?;
    let ada_model = mlp(&dev)?;
    let mut ada = groups(&ada_model, |ps, wd| {
        Adagrad::new(ps, 0.05)?.weight_decay(wd)
    })?;
    let mut decay_by_epoch = LambdaLr::new(&mut ada, |epoch| 0.9f64.powi(epoch as i32));
    let (ada_val, _) = fit(
        &ada_model,
        &mut ada,
        (&x, &y),
        (&val_x, &val_y),
        loss_opts,
        |opt, _| decay_by_epoch.step(opt),
    )?;
    let test_logits = ember::no_grad(|| rms_model.forward(&test_x))?;
    println!(
        "RMSprop + ReduceLrOnPlateau(0.5, patience 2): val loss {rms_val:.3}, test accuracy {:.1}%, lr 1e-3 -> {:.1e} (halved after epochs {rms_changes:?})",
        100.0 * accuracy(&test_logits, &test_y)?,
        rms.lr()
    );
    println!(
        "Adagrad + LambdaLr(0.9^epoch):              val loss {ada_val:.3}, test accuracy {:.1}%, lr 5e-2 -> {:.1e}",
        100.0 * accuracy(&ember::no_grad(|| ada_model.forward(&test_x))?, &test_y)?,
        ada.lr()
    );
    // what the class weights do: the same run without them
    let plain_model = mlp(&dev)?;
    let mut plain = groups(&plain_model, |ps, wd| {
        RmsProp::new(ps, 1e-3)?.weight_decay(wd)
    })?;
    let mut plain_plateau = ReduceLrOnPlateau::new(0.5, 2)?;
    let plain_opts = LossOptions {
        ignore_index: UNLABELED,
        ..Default::default()
    };
    fit(
        &plain_model,
        &mut plain,
        (&x, &y),
        (&val_x, &val_y),
        plain_opts,
        |opt, val| plain_plateau.step_metric(opt, val),
    )?;
    let pred = test_logits.argmax(-1, false)?;
    let plain_pred = ember::no_grad(|| plain_model.forward(&test_x))?.argmax(-1, false)?;
    println!(
        "recall per class on the test set, with class weights: {}; without: {}",
        recall(&pred, &test_y)?,
        recall(&plain_pred, &test_y)?
    );

    // class-probability targets: distil the MLP into a linear model, the
    // unlabeled rows included
    let temperature = 2.0;
    let soft = ember::no_grad(|| rms_model.forward(&x)?.div(temperature)?.softmax(-1))?;
    let linear_fit = |x: &Tensor, target: &Tensor, t: f64| -> ember::Result<Linear> {
        ember::manual_seed(2);
        let student = Linear::new(D, C, &dev)?;
        let mut opt = Adam::new(student.parameters(), 0.02)?;
        for _ in 0..150 {
            let loss = nn::cross_entropy_opts(
                &student.forward(x)?.div(t)?,
                target,
                LossOptions::default(),
            )?;
            opt.zero_grad();
            loss.backward()?;
            opt.step()?;
        }
        Ok(student)
    };
    let distilled = linear_fit(&x, &soft, temperature)?;
    let student = ember::no_grad(|| distilled.forward(&test_x))?;
    let agree = accuracy(&student, &test_logits.argmax(-1, false)?)?;
    let hard = linear_fit(&lab_x, &lab_y, 1.0)?;
    println!(
        "cross_entropy on probability targets (T = 2, all 1500 rows): a linear student agrees with the MLP on {:.1}% of test points, accuracy {:.1}% (trained on the labels alone: {:.1}%)",
        100.0 * agree,
        100.0 * accuracy(&student, &test_y)?,
        100.0 * accuracy(&ember::no_grad(|| hard.forward(&test_x))?, &test_y)?
    );

    // bce_with_logits with pos_weight: a detector for the rare class
    let rare = (C - 1) as i64;
    let target = lab_y.eq(rare)?.to_dtype(DType::F32)?.unsqueeze(1)?;
    let positives = target.sum_all()?.item::<f32>()?;
    let negatives = target.numel() as f32 - positives;
    let detector = |pos_weight: Option<&Tensor>| -> ember::Result<(f32, f32)> {
        ember::manual_seed(3);
        let head = Linear::new(D, 1, &dev)?;
        let mut opt = Adam::new(head.parameters(), 0.05)?;
        for _ in 0..150 {
            let loss = nn::bce_with_logits_opts(
                &head.forward(&lab_x)?,
                &target,
                None,
                pos_weight,
                Reduction::Mean,
            )?;
            opt.zero_grad();
            loss.backward()?;
            opt.step()?;
        }
        let said = ember::no_grad(|| head.forward(&test_x))?
            .squeeze(1)?
            .gt(0.0)?;
        let is = test_y.eq(rare)?;
        let sum =
            |t: &Tensor| -> ember::Result<f32> { t.to_dtype(DType::F32)?.sum_all()?.item::<f32>() };
        let hits = sum(&said.logical_and(&is)?)?;
        Ok((hits / sum(&is)?, hits / sum(&said)?.max(1.0)))
    };
    let (r0, p0) = detector(None)?;
    let pw = Tensor::from_slice(&[negatives / positives], [1], &dev)?;
    let (r1, p1) = detector(Some(&pw))?;
    println!(
        "bce_with_logits rare-class detector: recall {:.0}% precision {:.0}% without pos_weight; recall {:.0}% precision {:.0}% with pos_weight {:.1}",
        100.0 * r0,
        100.0 * p0,
        100.0 * r1,
        100.0 * p1,
        negatives / positives
    );

    // einsum: class prototypes (a one-hot contraction), then a learned bilinear
    // score x·W·p_c between a point and each prototype
    let onehot = lab_y.one_hot(C)?.to_dtype(DType::F32)?;
    let prototypes = Tensor::einsum("nc,nd->cd", &[&onehot, &lab_x])?.div(&counts.unsqueeze(1)?)?;
    let w = Tensor::zeros([D, D], DType::F32, &dev)?.requires_grad_(true)?;
    init::xavier_uniform_(&w, 1.0)?;
    let mut opt = Adam::new(vec![w.clone()], 0.02)?;
    let bilinear = |x: &Tensor| Tensor::einsum("nd,de,ce->nc", &[x, &w, &prototypes]);
    for _ in 0..150 {
        let loss = nn::cross_entropy(&bilinear(&lab_x)?, &lab_y)?;
        opt.zero_grad();
        loss.backward()?;
        opt.step()?;
    }
    let scores = ember::no_grad(|| bilinear(&test_x))?;
    let by_matmul = test_x.matmul(&w)?.matmul(&prototypes.t()?)?;
    println!(
        "einsum \"nd,de,ce->nc\" bilinear prototype score: test accuracy {:.1}% (the same as x·W·Pᵀ by matmul to {:.1e})",
        100.0 * accuracy(&scores, &test_y)?,
        scores.max_abs_diff(&by_matmul)?
    );

    // pad + conv2d_same: the Laplacian of a flat image should be 0 everywhere
    let flat = Tensor::ones([1, 1, 8, 8], DType::F32, &dev)?;
    let laplacian = Tensor::from_vec(
        vec![0f32, 1., 0., 1., -4., 1., 0., 1., 0.],
        [1, 1, 3, 3],
        &dev,
    )?;
    let same = flat.conv2d_same(&laplacian, None, (1, 1), 1)?;
    let reflect = flat.pad(&[1, 1, 1, 1], PadMode::Reflect)?.conv2d(
        &laplacian,
        None,
        Conv2dOptions::default(),
    )?;
    let img = Tensor::randn([1, 1, 8, 8], &dev)?;
    let k4 = Tensor::randn([1, 1, 4, 4], &dev)?;
    let even = img.conv2d_same(&k4, None, (1, 1), 1)?.max_abs_diff(
        &img.pad(&[1, 2, 1, 2], PadMode::Constant(0.0))?.conv2d(
            &k4,
            None,
            Conv2dOptions::default(),
        )?,
    )?;
    println!(
        "Laplacian of a flat 8x8 image: conv2d_same keeps {:?} but its zero padding reads {} at a corner; reflect pad + conv2d reads {} everywhere; a 4x4 kernel's \"same\" = pad [1, 2, 1, 2] (diff {even})",
        same.shape(),
        same.min_all()?.item::<f32>()?,
        reflect.abs()?.max_all()?.item::<f32>()?,
    );

    // cumsum: accuracy of the most confident predictions; topk: top-2 accuracy
    let (confidence, _) = test_logits.softmax(-1)?.max_dim(-1, false)?;
    let (_, order) = confidence.sort(0, true)?;
    let right = pred.eq(&test_y)?.to_dtype(DType::F32)?;
    let right_so_far = right.index_select(0, &order)?.cumsum(0)?.to_vec1::<f32>()?;
    let n = right_so_far.len();
    let at = |frac: f64| {
        let k = (frac * n as f64) as usize;
        100.0 * right_so_far[k - 1] / k as f32
    };
    println!(
        "cumsum over predictions sorted by confidence: the most confident 25% are {:.1}% right, 50% {:.1}%, all {:.1}%",
        at(0.25),
        at(0.5),
        at(1.0)
    );
    let (_, top2) = test_logits.topk(2, -1, true)?;
    let top2_acc = top2
        .eq(&test_y.unsqueeze(1)?)?
        .any(1, false)?
        .to_dtype(DType::F64)?
        .mean_all()?
        .item::<f64>()?;
    println!(
        "topk: top-1 accuracy {:.1}%, top-2 accuracy {:.1}%",
        100.0 * accuracy(&test_logits, &test_y)?,
        100.0 * top2_acc
    );
    Ok(())
}
