//! Bad input is an error with a message that names the op, never a panic.

use super::synced;
use ember::prelude::*;
use ember::Error;

/// Asserts `r` is an error whose message contains every fragment.
#[track_caller]
fn err_has<T: std::fmt::Debug>(r: Result<T>, fragments: &[&str]) {
    let e = r.expect_err("expected an error").to_string();
    for f in fragments {
        assert!(e.contains(f), "error {e:?} does not mention {f:?}");
    }
}

fn bad_input_is_an_error(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    let a = Tensor::zeros([2, 3], DType::F32, dev)?;
    let b = Tensor::zeros([4], DType::F32, dev)?;
    let i = Tensor::zeros([2, 3], DType::I64, dev)?;
    err_has(a.add(&b), &["add", "(3)", "(4)", "[2, 3]", "[4]"]);
    err_has(
        a.mul(&Tensor::zeros([3, 3], DType::F32, dev)?),
        &["mul", "dimension 0"],
    );
    err_has(
        a.sum(2, false),
        &["sum", "dimension out of range", "[-2, 1]", "got 2"],
    );
    err_has(a.sum([0, 0], false), &["sum", "multiple times"]);
    err_has(a.mean(-3, true), &["mean", "got -3"]);
    err_has(a.argmax(5, false), &["argmax"]);
    err_has(a.softmax(3), &["softmax"]);
    err_has(a.transpose(0, 2), &["transpose"]);
    err_has(a.unsqueeze(4), &["unsqueeze"]);
    err_has(a.squeeze(-3), &["squeeze"]);
    err_has(a.narrow(2, 0, 1), &["narrow"]);
    err_has(
        a.reshape([4, 2]),
        &["reshape", "invalid for input of size 6"],
    );
    err_has(a.view([7, -1]), &["view"]);
    err_has(a.matmul(&a), &["matmul", "2x3 and 2x3"]);
    err_has(
        a.matmul(&i.t()?),
        &["matmul", "same dtype", "float32", "int64"],
    );
    err_has(Tensor::new(1f32, dev)?.matmul(&a), &["at least 1D"]);
    err_has(a.conv2d(&a, None, Conv2dOptions::default()), &["conv2d"]);
    let x = Tensor::zeros([1, 3, 5, 5], DType::F32, dev)?;
    let w = Tensor::zeros([2, 3, 3, 3], DType::F32, dev)?;
    err_has(
        x.conv2d(
            &Tensor::zeros([2, 2, 3, 3], DType::F32, dev)?,
            None,
            Conv2dOptions::default(),
        ),
        &["conv2d", "channels"],
    );
    err_has(
        x.conv2d(
            &w,
            Some(&Tensor::zeros([3], DType::F32, dev)?),
            Conv2dOptions::default(),
        ),
        &["conv2d", "bias"],
    );
    err_has(
        x.conv2d(&w, None, Conv2dOptions::default().groups(2)),
        &["conv2d"],
    );
    err_has(
        x.conv2d(&w, None, Conv2dOptions::default().stride(0)),
        &["stride"],
    );
    err_has(
        x.conv2d(
            &Tensor::zeros([2, 3, 7, 7], DType::F32, dev)?,
            None,
            Conv2dOptions::default(),
        ),
        &["kernel size"],
    );
    err_has(
        x.conv2d(&w.to_dtype(DType::F64)?, None, Conv2dOptions::default()),
        &["conv2d", "float64"],
    );
    // int64 pools, as in PyTorch; bools do not
    err_has(
        x.gt(0.0)?.max_pool2d(Pool2dOptions::new(2)),
        &["max_pool2d", "bool", "not implemented for 'Bool'"],
    );
    err_has(
        a.max_pool2d(Pool2dOptions::new(2)),
        &["max_pool2d", "3-D or 4-D"],
    );
    err_has(Tensor::cat(&[&a, &b], 0), &["cat"]);
    err_has(Tensor::stack(&[&a, &b], 0), &["stack"]);
    err_has(
        synced(a.index_select(0, &Tensor::new([5i64], dev)?)),
        &["index_select", "index 5", "size 2"],
    );
    err_has(
        a.index_select(0, &Tensor::new([0.0f32], dev)?),
        &["index_select", "int64"],
    );
    err_has(
        a.gather(0, &Tensor::new([[0i64, 1, 2, 0]], dev)?),
        &["gather"],
    );
    err_has(
        a.scatter_add(0, &Tensor::new([[0i64]], dev)?, &i),
        &["scatter_add"],
    );
    err_has(a.where_(&a, &a), &["where", "bool"]);
    err_has(a.masked_fill(&a, 1.0), &["masked_fill", "bool"]);
    err_has(i.mean_all(), &["mean", "int64"]);
    err_has(i.add_(1.5), &["add_", "can't be cast"]);
    err_has(
        a.add_(&Tensor::zeros([2, 2, 3], DType::F32, dev)?),
        &["add_", "broadcast shape"],
    );
    err_has(a.expand([3, 3]), &["expand"]);
    err_has(a.split(0, 0), &["split"]);
    err_has(a.item::<f32>(), &["item", "6 elements"]);
    err_has(a.i((0, 0, 0)), &["too many indices"]);
    err_has(a.select(1, 3), &["select", "index 3", "size 3"]);
    err_has(a.permute([0]), &["permute"]);
    err_has(a.clamp::<f64>(None, None), &["clamp"]);
    // a zero or non-finite step, or a non-finite bound, is refused for that reason
    // (not for the element count it would give)
    for (start, end, step) in [
        (0.0, 1.0, 0.0),
        (0.0, 1.0, f64::INFINITY),
        (0.0, 1.0, f64::NAN),
        (f64::NAN, 1.0, 0.5),
        (0.0, f64::INFINITY, 0.5),
    ] {
        err_has(
            Tensor::arange_step(start, end, step, DType::F32, dev),
            &["arange", "step must be finite and non-zero"],
        );
    }
    err_has(
        Tensor::arange_step(0.0, 10.0, -1.0, DType::I64, dev),
        &["arange"],
    );
    err_has(
        Tensor::from_vec(vec![1f32; 3], [2, 2], dev),
        &["from_vec", "4 elements", "has 3"],
    );
    err_has(
        Tensor::zeros([2, -3], DType::F32, dev),
        &["negative dimension"],
    );
    err_has(Tensor::randint(5, 5, [2], dev), &["randint"]);
    Ok(())
}

device_test!(bad_input_is_an_error);

/// Corners where ember once differed from PyTorch: a 0-d tensor has no size to
/// give; a NaN clamp bound makes NaN; `index_select` of a scalar is a scalar
/// (one index only); equal infinities are close; int64 ranges are exact past
/// 2^53; bounds and sizes past the integer range are errors or clamp, never a
/// panic; an empty tensor is contiguous whatever its strides.
fn corners_as_pytorch(dev: &Device) -> Result<()> {
    let s = Tensor::scalar(5f32, dev)?;
    err_has(s.size(0), &["no dimensions"]);
    err_has(s.size(-1), &["no dimensions"]);
    let x = Tensor::new([0.5f32, 2.0, -1.0], dev)?;
    for y in [
        x.clamp(Some(f64::NAN), Some(1.0))?,
        x.clamp(Some(0.0), Some(f64::NAN))?,
        x.clamp_min(f64::NAN)?,
        x.clamp_max(f64::NAN)?,
    ] {
        assert!(y.to_vec::<f32>()?.iter().all(|v| v.is_nan()), "{y:?}");
    }
    // its gradient is 0 (PyTorch's), also where the incoming one is infinite
    let w = x.detach().requires_grad_(true)?;
    w.clamp_min(f64::NAN)?
        .backward_with(&Tensor::new([f32::INFINITY, 1.0, f32::NAN], dev)?)?;
    assert_eq!(w.grad().unwrap().to_vec::<f32>()?, [0.0; 3]);
    let picked = s.index_select(0, &Tensor::new([0i64], dev)?)?;
    assert_eq!(picked.shape(), &[] as &[usize]);
    assert_eq!(picked.item::<f32>()?, 5.0);
    err_has(
        s.index_select(0, &Tensor::new([0i64, 0], dev)?),
        &["Index to scalar can have only 1 value, got 2"],
    );
    let inf = Tensor::new([f32::INFINITY, f32::NEG_INFINITY, 1.0], dev)?;
    assert!(inf.allclose(&inf, 1e-5, 1e-8)?);
    assert!(!inf.allclose(&inf.neg()?, 1e-5, 1e-8)?);
    // each alone: an infinite difference is not within the infinite tolerance
    // that |other| = ∞ gives
    let one = |v: f32| Tensor::new([v], dev);
    assert!(!one(f32::INFINITY)?.allclose(&one(f32::NEG_INFINITY)?, 1e-5, 1e-8)?);
    assert!(!one(1.0)?.allclose(&one(f32::INFINITY)?, 1e-5, 1e-8)?);
    assert!(!one(f32::INFINITY)?.allclose(&one(1.0)?, 1e-5, 1e-8)?);
    let nan = Tensor::new([f32::NAN], dev)?;
    assert!(!nan.allclose(&nan, 1e-5, 1e-8)?);
    err_has(
        inf.allclose(&inf, -1e-5, 1e-8),
        &["rtol must be greater than or equal to zero"],
    );
    let big = 9_007_199_254_740_993i64;
    assert_eq!(
        Tensor::arange(big, big + 2, dev)?.to_vec::<i64>()?,
        [big, big + 1]
    );
    // PyTorch: an end below the start with step 1 is an error, not empty
    err_has(
        Tensor::arange(3i64, 1, dev),
        &["upper bound and larger bound inconsistent with step sign"],
    );
    assert_eq!(Tensor::arange(3i64, 3, dev)?.numel(), 0);
    let v = Tensor::arange(0i64, 6, dev)?;
    err_has(v.split_with_sizes(&[usize::MAX, 7], 0), &["must sum to"]);
    assert_eq!(v.i(0..=i64::MAX)?.numel(), 6);
    assert_eq!(v.i(0..=usize::MAX)?.numel(), 6);
    assert_eq!(v.i(2..usize::MAX)?.numel(), 4);
    let empty = Tensor::zeros([0, 3], DType::F32, dev)?.t()?;
    assert!(empty.is_contiguous());
    Ok(())
}

device_test!(corners_as_pytorch);

/// With no classes, PyTorch's IndexError names the first target that is not
/// ignored ("Target 2 is out of bounds." for `[-100, 2, 5]`), on both paths of
/// cross-entropy (fused, and through the weighted log-likelihood) and in
/// `nll_loss`; an index into an empty dimension names its first index.
fn no_class_errors_name_the_first_target(dev: &Device) -> Result<()> {
    use ember::nn::{LossOptions, Reduction};
    let x = Tensor::zeros([3, 0], DType::F32, dev)?;
    let t = Tensor::new([-100i64, 2, 5], dev)?;
    let w = Tensor::zeros([0], DType::F32, dev)?;
    for weight in [None, Some(&w)] {
        let opts = || LossOptions {
            weight,
            reduction: Reduction::Mean,
            ..Default::default()
        };
        for r in [
            ember::nn::cross_entropy_opts(&x, &t, opts()),
            ember::nn::nll_loss_opts(&x, &t, opts()),
        ] {
            match synced(r) {
                Err(Error::IndexOutOfRange { index, size, .. }) => {
                    assert_eq!((index, size), (2, 0))
                }
                other => panic!("expected the index error, got {other:?}"),
            }
        }
    }
    let e = Tensor::zeros([0, 2], DType::F32, dev)?.index_select(0, &Tensor::new([4i64, 1], dev)?);
    err_has(e, &["index 4 is out of bounds for dimension 0 with size 0"]);
    Ok(())
}

device_test!(no_class_errors_name_the_first_target);

/// Sizes no memory can hold are errors, not overflows, panics or aborts, and the
/// process goes on working after them.
fn impossible_sizes_are_errors(dev: &Device) -> Result<()> {
    let _g = super::rng_lock();
    let too_many = "more elements than memory can address";
    err_has(
        Tensor::zeros([1usize << 62, 8], DType::F32, dev),
        &["full", too_many],
    );
    err_has(
        Tensor::randn([1usize << 40, 1 << 40], dev),
        &["normal", too_many],
    );
    // 2^60 float32 elements count fine but are 4 EiB: refused by the allocator,
    // whatever the system's overcommit policy
    let oom = Tensor::zeros([1usize << 30, 1 << 30], DType::F32, dev).unwrap_err();
    match &oom {
        Error::OutOfMemory {
            device, requested, ..
        } => {
            assert_eq!(*device, *dev);
            assert_eq!(*requested, 1usize << 62, "{oom}");
        }
        e => panic!("expected OutOfMemory, got {e}"),
    }
    assert!(oom.to_string().starts_with("out of memory on"), "{oom}");
    err_has(
        Tensor::ones([1usize << 31, 1 << 31], DType::F64, dev),
        &["out of memory"],
    );
    err_has(
        Tensor::arange_step(0.0, 1e30, 1e-30, DType::F32, dev),
        &["arange", "more than memory can hold"],
    );
    err_has(
        Tensor::linspace(0.0, 1.0, usize::MAX, DType::F32, dev),
        &["linspace", too_many],
    );
    err_has(Tensor::eye(usize::MAX, DType::F32, dev), &["eye", too_many]);
    err_has(Tensor::randperm(usize::MAX, dev), &["randperm", too_many]);
    let labels = Tensor::new([1i64, 2], dev)?;
    err_has(labels.one_hot(usize::MAX), &["one_hot", too_many]);

    let t = Tensor::arange(0f32, 6., dev)?.reshape([2, 3])?;
    err_has(
        t.narrow(1, 2, usize::MAX),
        &["narrow", "exceeds dimension size"],
    );
    err_has(
        t.reshape([1i64 << 40, 1 << 40, 0]),
        &["reshape", "invalid for input of size 6"],
    );
    // expanded views hold one element; what they would produce cannot exist
    let one = Tensor::ones([1, 1], DType::F32, dev)?;
    err_has(one.expand([1usize << 40, 1 << 40]), &["expand", too_many]);
    let (col, row) = (
        one.expand([1usize << 40, 1])?,
        one.expand([1, 1usize << 40])?,
    );
    err_has(col.add(&row), &["add", too_many]);
    err_has(col.matmul(&row), &["matmul", too_many]);
    err_has(
        Tensor::cat(&[&col, &one.expand([usize::MAX >> 1, 1])?], 0),
        &["cat", too_many],
    );
    let x = Tensor::zeros([1, 1, 4, 4], DType::F32, dev)?;
    let w = Tensor::zeros([1, 1, 2, 2], DType::F32, dev)?;
    err_has(
        x.conv2d(&w, None, Conv2dOptions::default().padding(1 << 40)),
        &["conv2d", too_many],
    );
    err_has(
        x.conv2d(&w, None, Conv2dOptions::default().padding(usize::MAX)),
        &["conv2d", "kernel size"],
    );
    err_has(
        x.max_pool2d(Pool2dOptions::new(2).padding(usize::MAX)),
        &["max_pool2d", "pad should be at most half"],
    );

    // nothing was lost: ordinary work goes on
    let y = t.add(1.0)?.sum_all()?.item::<f32>()?;
    assert_eq!(y, 21.0);
    Ok(())
}

device_test!(impossible_sizes_are_errors);

#[test]
fn parse_errors_list_the_accepted_forms() {
    // PyTorch's "cpu:0" is the CPU; ember has no other CPU index
    assert_eq!("cpu:0".parse::<Device>().unwrap(), Device::Cpu);
    for s in [
        "gpu", "gpu:0", "gpu0", "cuda:a", "cuda:-1", "", "metal", "cpu:1", "cuda:01", "cuda:00",
    ] {
        let e = s.parse::<Device>().unwrap_err().to_string();
        assert!(
            e.contains("\"cpu\"") && e.contains("\"cuda\"") && e.contains("\"cuda:N\""),
            "{e}"
        );
    }
    let e = "f8".parse::<DType>().unwrap_err().to_string();
    assert!(e.contains("float32") && e.contains("int64"), "{e}");
}

/// Corners PyTorch refuses, refused here too with its reasons (and no panic,
/// abort or silent wrong value): random ranges, sample counts, dtypes, layers
/// whose public fields were set by hand, a shuffling loader given a sampler, and
/// sizes that overflow.
#[test]
fn refused_as_pytorch_refuses() -> Result<()> {
    use ember::nn::{init, Conv2d, Linear, Module, MultiheadAttention};
    use ember::PadMode;
    let _g = super::rng_lock();
    let cpu = Device::Cpu;
    let w = Tensor::zeros([3, 4], DType::F32, &cpu)?;
    err_has(
        Tensor::uniform(1.0, 0.0, [3], DType::F32, &cpu),
        &["uniform", "from=1", "to=0"],
    );
    err_has(init::uniform_(&w, 1.0, 0.0), &["uniform"]);
    err_has(init::xavier_uniform_(&w, -1.0), &["uniform"]);
    for (lo, hi) in [(0.0, f64::INFINITY), (-f64::MAX, f64::MAX), (f64::NAN, 1.0)] {
        err_has(Tensor::uniform(lo, hi, [3], DType::F32, &cpu), &["uniform"]);
    }
    err_has(
        Tensor::normal(0.0, -1.0, [3], DType::F32, &cpu),
        &["normal", "std >= 0.0", "std -1"],
    );
    err_has(init::normal_(&w, 0.0, f64::NAN), &["normal", "std NaN"]);
    // equal bounds and a zero std are not refused: constants
    let lo = Tensor::uniform(2.0, 2.0, [3], DType::F32, &cpu)?;
    assert_eq!(lo.to_vec::<f32>()?, [2.0; 3]);
    let c = Tensor::normal(5.0, 0.0, [3], DType::F32, &cpu)?;
    assert_eq!(c.to_vec::<f32>()?, [5.0; 3]);

    let p = Tensor::new([1f32, 2.0], &cpu)?;
    err_has(p.multinomial(0, true), &["multinomial", "n_sample <= 0"]);
    err_has(
        Tensor::arange_step(0.0, 3.0, 1.0, DType::Bool, &cpu),
        &["arange", "Bool"],
    );

    // layers whose public fields were changed after construction
    let x = Tensor::ones([2, 4], DType::F32, &cpu)?;
    let bad = Linear {
        weight: Tensor::ones([4], DType::F32, &cpu)?,
        bias: None,
    };
    err_has(bad.forward(&x), &["Linear", "[out_features, in_features]"]);
    let mut mha = MultiheadAttention::new(4, 2, &cpu)?;
    mha.num_heads = 0;
    err_has(mha.forward(&x), &["MultiheadAttention", "num_heads (0)"]);
    mha.num_heads = 3;
    err_has(mha.forward(&x), &["MultiheadAttention", "divisible"]);
    let mut conv = Conv2d::new(3, 8, 3, Default::default(), &cpu)?.padding_same()?;
    conv.options.stride = (2, 2);
    let img = Tensor::ones([1, 3, 8, 8], DType::F32, &cpu)?;
    err_has(conv.forward(&img), &["conv2d", "strided"]);
    err_has(
        Conv2d::new(1, 1, 1usize << 32, Default::default(), &cpu).map(|_| ()),
        &["Conv2d", "overflows"],
    );

    // sizes that overflow are errors, and an empty tensor's huge dims cost nothing
    let v = Tensor::zeros([2], DType::F32, &cpu)?;
    err_has(v.repeat(&[1usize << 63]), &["repeat", "overflows"]);
    let row = Tensor::zeros([1, 1, 4], DType::F32, &cpu)?;
    err_has(
        row.pad(&[i64::MAX, 1], PadMode::Constant(0.0)),
        &["pad", "overflows"],
    );
    err_has(
        row.pad(&[i64::MAX, 1], PadMode::Replicate),
        &["pad", "overflows"],
    );
    err_has(
        row.pad(&[1 << 62, 0], PadMode::Replicate),
        &["out of memory"],
    );
    err_has(
        Tensor::new([-1i64, i64::MAX], &cpu)?.one_hot_inferred(),
        &["one_hot"],
    );
    err_has(
        Tensor::new([0i64, i64::MAX], &cpu)?.one_hot_inferred(),
        &["one_hot", "more elements than memory can address"],
    );
    let wide = Tensor::zeros([0, 1usize << 40], DType::F32, &cpu)?;
    assert_eq!(wide.flip([1i64])?.shape(), &[0, 1usize << 40]);
    let square = Tensor::zeros([0, 1usize << 20, 1usize << 20], DType::F32, &cpu)?;
    assert_eq!(square.tril(0)?.shape(), square.shape());
    assert_eq!(square.triu(1)?.shape(), square.shape());
    Ok(())
}

/// Inside `with_global_rng`'s closure the generator it holds is locked: a
/// random op there is an error, reseeding it or reading a scope generator's
/// seed a panic (never a wait that does not end), and the generator works
/// after the closure.
#[test]
fn the_generator_held_by_with_global_rng_is_not_waited_for() -> Result<()> {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    let _g = super::rng_lock();
    let nested = ember::with_global_rng(|_| Tensor::randn([2], &Device::Cpu))?;
    err_has(nested, &["already in use on this thread"]);
    let reseed = ember::with_global_rng(|_| catch_unwind(|| ember::manual_seed(1)))?;
    assert!(reseed.is_err(), "manual_seed inside the closure");
    let g = ember::Generator::new(5);
    let seed = g.scope(|| {
        ember::with_global_rng(|_| catch_unwind(AssertUnwindSafe(|| g.initial_seed())))
    })?;
    assert!(
        seed.is_err(),
        "the scope generator's seed inside the closure"
    );
    // another generator, and the global one outside a scope, are free
    let other = ember::Generator::new(6);
    assert_eq!(
        g.scope(|| ember::with_global_rng(|_| other.initial_seed()))?,
        6
    );
    assert_eq!(g.initial_seed(), 5);
    ember::manual_seed(2);
    assert_eq!(ember::initial_seed(), 2);
    Tensor::randn([2], &Device::Cpu)?;
    Ok(())
}

/// Recurrent layers refuse sizes of zero and an input of another dtype than
/// their weights with PyTorch's messages, naming the fix (the cells accept an
/// input size of zero, as PyTorch's do).
#[test]
fn recurrent_layers_refuse_zero_sizes_and_a_mismatched_dtype() -> Result<()> {
    use ember::nn::{GRUCell, Module, RnnOptions, LSTM};
    let cpu = Device::Cpu;
    err_has(
        LSTM::new(0, 4, &cpu).map(|_| ()),
        &["input_size must be greater than zero"],
    );
    err_has(
        LSTM::new(3, 0, &cpu).map(|_| ()),
        &["hidden_size must be greater than zero"],
    );
    err_has(
        LSTM::with_options(
            3,
            4,
            RnnOptions {
                num_layers: 0,
                ..Default::default()
            },
            &cpu,
        )
        .map(|_| ()),
        &["num_layers must be greater than zero"],
    );
    GRUCell::new(0, 4, &cpu)?;
    let lstm = LSTM::new(3, 4, &cpu)?;
    let x = Tensor::zeros([2, 1, 3], DType::F64, &cpu)?;
    err_has(
        lstm.forward(&x),
        &[
            "RNN input dtype (float64) does not match weight dtype (float32)",
            "input.to_dtype(DType::F32)",
        ],
    );
    Ok(())
}
