use super::{assert_close, bits, vals};
use ember::nn::{self, Module};
use ember::prelude::*;

fn t(dev: &Device, v: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice(v, shape, dev).unwrap()
}

fn arithmetic_broadcasts(dev: &Device) -> Result<()> {
    let a = t(dev, &[1., 2., 3.], &[3, 1]);
    let b = t(dev, &[10., 20., 30., 40.], &[1, 4]);
    let s = a.add(&b)?;
    assert_eq!(s.shape(), &[3, 4]);
    assert_eq!(
        vals(&s),
        vec![11., 21., 31., 41., 12., 22., 32., 42., 13., 23., 33., 43.]
    );
    assert_eq!(vals(&b.sub(&a)?)[..4], [9., 19., 29., 39.]);
    assert_eq!(vals(&a.mul(&b)?)[8..], [30., 60., 90., 120.]);
    assert_eq!(vals(&b.div(&a)?)[4..8], [5., 10., 15., 20.]);
    // leading dims and size-1 dims: [2,1,4] x [3,1] -> [2,3,4]
    let c = Tensor::arange(0f32, 8., dev)?.reshape([2, 1, 4])?;
    let d = t(dev, &[0., 100., 200.], &[3, 1]);
    let e = c.add(&d)?;
    assert_eq!(e.shape(), &[2, 3, 4]);
    assert_eq!(vals(&e.i((1, 2))?), vec![204., 205., 206., 207.]);
    // empty broadcast dims
    let z = Tensor::zeros([0, 1], DType::F32, dev)?.add(&b)?;
    assert_eq!(z.shape(), &[0, 4]);
    // 0-d operands
    let s0 = Tensor::new(2f32, dev)?;
    assert_eq!(vals(&a.mul(&s0)?), vec![2., 4., 6.]);
    assert_eq!(s0.add(&s0)?.rank(), 0);
    Ok(())
}

fn scalar_operands_and_promotion(dev: &Device) -> Result<()> {
    let i = Tensor::new([1i64, 2, 3], dev)?;
    assert_eq!(i.add(1)?.dtype(), DType::I64);
    assert_eq!(
        i.add(0.5)?.dtype(),
        DType::F32,
        "int tensor + float scalar is float32"
    );
    assert_eq!(vals(&i.add(0.5)?), vec![1.5, 2.5, 3.5]);
    let d = i.div(2)?;
    assert_eq!(
        (d.dtype(), vals(&d)),
        (DType::F32, vec![0.5, 1.0, 1.5]),
        "true division"
    );
    let f = t(dev, &[1., 2.], &[2]);
    let f64t = Tensor::new([1f64, 2.], dev)?;
    assert_eq!(f.add(&f64t)?.dtype(), DType::F64);
    assert_eq!(
        f.add(&Tensor::new(1f64, dev)?)?.dtype(),
        DType::F32,
        "0-d tensors do not widen"
    );
    assert_eq!(
        i.add(&Tensor::new(1.5f64, dev)?)?.dtype(),
        DType::F64,
        "but do change category"
    );
    let u = Tensor::new([250u8, 10], dev)?;
    assert_eq!(u.add(10)?.to_vec1::<u8>()?, vec![4, 20], "uint8 wraps");
    assert_eq!(u.add(&i.narrow(0, 0, 2)?)?.dtype(), DType::I64);
    let h = f.to_dtype(DType::F16)?;
    assert_eq!(h.add(&f.to_dtype(DType::BF16)?)?.dtype(), DType::F32);
    assert_eq!(h.mul(3.0)?.dtype(), DType::F16);
    assert_eq!(vals(&h.mul(3.0)?), vec![3., 6.]);
    let b = Tensor::new([true, false], dev)?;
    assert_eq!(b.add(&b)?.dtype(), DType::Bool);
    assert_eq!(b.add(1)?.dtype(), DType::I64);
    assert_eq!(
        vals(&b.mul(&Tensor::new([true, true], dev)?)?),
        vec![1., 0.]
    );
    assert!(b.sub(&b).is_err(), "bool - bool is refused, as in PyTorch");
    Ok(())
}

fn unary_math(dev: &Device) -> Result<()> {
    let x = t(dev, &[-2., -0.5, 0., 0.5, 2.], &[5]);
    let xs: Vec<f64> = vec![-2., -0.5, 0., 0.5, 2.];
    // atol 1e-6: gelu(-2) = -2 * (1 + erf(-1.41)) / 2 cancels, and CUDA's erff is
    // within 2 ulp
    let check = |got: Tensor, f: &dyn Fn(f64) -> f64| {
        assert_close(
            &vals(&got),
            &xs.iter().map(|&v| f(v)).collect::<Vec<_>>(),
            1e-6,
            1e-6,
        )
    };
    check(x.neg()?, &|v| -v);
    check(x.abs()?, &|v| v.abs());
    check(x.exp()?, &|v| v.exp());
    check(x.tanh()?, &|v| v.tanh());
    check(x.relu()?, &|v| v.max(0.0));
    check(x.sigmoid()?, &|v| 1.0 / (1.0 + (-v).exp()));
    check(x.gelu()?, &|v| 0.5 * v * (1.0 + libm::erf(v / 2f64.sqrt())));
    check(x.square()?, &|v| v * v);
    check(x.sin()?, &|v| v.sin());
    check(x.clamp(Some(-1.0), Some(1.0))?, &|v| v.clamp(-1.0, 1.0));
    check(x.clamp_min(0.25)?, &|v| v.max(0.25));
    check(x.pow(2.0)?, &|v| v * v);
    check(x.abs()?.sqrt()?, &|v| v.abs().sqrt());
    check(x.abs()?.add(1.0)?.log()?, &|v| (v.abs() + 1.0).ln());
    let gt = vals(&x.gelu_tanh()?);
    assert!((gt[4] - 1.9546).abs() < 1e-3, "{gt:?}");
    // integer inputs: exp and friends give float32, abs/neg keep int64
    let i = Tensor::new([-1i64, 0, 2], dev)?;
    assert_eq!(i.exp()?.dtype(), DType::F32);
    assert_eq!(i.abs()?.to_vec1::<i64>()?, vec![1, 0, 2]);
    assert_eq!(i.neg()?.to_vec1::<i64>()?, vec![1, 0, -2]);
    assert_eq!(i.pow(2)?.to_vec1::<i64>()?, vec![1, 0, 4]);
    // bounds are Python-style scalars: an int bound keeps int64, a float one
    // (whole or not) gives float32
    assert_eq!(i.clamp(Some(0), None)?.dtype(), DType::I64);
    assert_eq!(i.clamp(Some(0), None)?.to_vec1::<i64>()?, vec![0, 0, 2]);
    assert_eq!(i.clamp(Some(0.0), None)?.dtype(), DType::F32);
    assert_eq!(i.clamp_min(0.0)?.to_vec1::<f32>()?, vec![0.0, 0.0, 2.0]);
    assert!(i.pow(-1).is_err());
    assert!(Tensor::new([true], dev)?.neg().is_err());
    // NaN propagates through relu, clamp, maximum
    let n = t(dev, &[f32::NAN, 1.], &[2]);
    assert!(vals(&n.relu()?)[0].is_nan());
    assert!(vals(&n.clamp(Some(0.0), Some(0.5))?)[0].is_nan());
    assert!(vals(&n.maximum(&t(dev, &[0., 0.], &[2]))?)[0].is_nan());
    // sigmoid of large magnitudes is finite
    assert_eq!(
        vals(&t(dev, &[-1000., 1000.], &[2]).sigmoid()?),
        vec![0.0, 1.0]
    );
    // f16 math computes in f32 and rounds once
    let h = x.to_dtype(DType::F16)?.exp()?;
    assert_eq!(h.dtype(), DType::F16);
    assert_close(
        &vals(&h),
        &xs.iter().map(|v| v.exp()).collect::<Vec<_>>(),
        1e-3,
        0.0,
    );
    Ok(())
}

fn binary_extras(dev: &Device) -> Result<()> {
    let a = t(dev, &[1., 5., 3.], &[3]);
    let b = t(dev, &[4., 2., 3.], &[3]);
    assert_eq!(vals(&a.maximum(&b)?), vec![4., 5., 3.]);
    assert_eq!(vals(&a.minimum(&b)?), vec![1., 2., 3.]);
    assert_eq!(vals(&a.pow(&b)?), vec![1., 25., 27.]);
    assert_eq!(vals(&a.pow(0.5)?)[0], 1.0);
    Ok(())
}

fn comparisons_where_masked_fill(dev: &Device) -> Result<()> {
    let a = t(dev, &[1., 2., 3., 4.], &[2, 2]);
    let m = a.gt(2.0)?;
    assert_eq!(m.dtype(), DType::Bool);
    assert_eq!(
        m.to_vec2::<bool>()?,
        vec![vec![false, false], vec![true, true]]
    );
    assert_eq!(vals(&a.eq(&t(dev, &[1., 0.], &[2]))?), vec![1., 0., 0., 0.]);
    assert_eq!(vals(&a.le(2)?), vec![1., 1., 0., 0.]);
    assert_eq!(vals(&a.ne(2)?), vec![1., 0., 1., 1.]);
    assert_eq!(vals(&a.lt(&a)?), vec![0.; 4]);
    assert_eq!(vals(&a.ge(3.0)?), vec![0., 0., 1., 1.]);
    // int tensor compared with a float scalar compares in float
    assert_eq!(vals(&Tensor::new([1i64, 2], dev)?.lt(1.5)?), vec![1., 0.]);
    let w = m.where_(&a, 0.0)?;
    assert_eq!(vals(&w), vec![0., 0., 3., 4.]);
    let cond = Tensor::new([true, false], dev)?;
    let w2 = cond.where_(&a, &t(dev, &[-1., -2.], &[2, 1]))?;
    assert_eq!(vals(&w2), vec![1., -1., 3., -2.]);
    assert_eq!(cond.where_(1, 0)?.dtype(), DType::I64);
    assert_eq!(cond.where_(1.0, 0)?.dtype(), DType::F32);
    assert!(a.where_(&a, &a).is_err(), "condition must be bool");
    let f = a.masked_fill(&m, -1.0)?;
    assert_eq!(vals(&f), vec![1., 2., -1., -1.]);
    let col = Tensor::new([[true], [false]], dev)?;
    assert_eq!(vals(&a.masked_fill(&col, 0.0)?), vec![0., 0., 3., 4.]);
    let i = Tensor::new([1i64, 2], dev)?;
    assert_eq!(
        i.masked_fill(&cond, 2.5)?.to_vec1::<i64>()?,
        vec![2, 2],
        "a float value truncates"
    );
    assert_eq!(i.masked_fill(&cond, 7)?.to_vec1::<i64>()?, vec![7, 2]);
    assert!(a.masked_fill(&a, 0.0).is_err(), "mask must be bool");
    Ok(())
}

fn logical_ops_and_bool_subtraction(dev: &Device) -> Result<()> {
    let a = Tensor::new([0.0f32, 2.0, -0.0, f32::NAN], dev)?;
    let b = Tensor::new([1i64, 0, 0, 3], dev)?;
    let bools = |t: Tensor| t.to_vec1::<bool>();
    // truth is "not zero": -0.0 is false, NaN is true (as in PyTorch)
    assert_eq!(bools(a.logical_not()?)?, [true, false, true, false]);
    assert_eq!(bools(a.logical_and(&b)?)?, [false, false, false, true]);
    assert_eq!(bools(a.logical_or(&b)?)?, [true, true, false, true]);
    assert_eq!(bools(a.logical_xor(&b)?)?, [true, true, false, false]);
    let m = Tensor::new([[true, false]], dev)?;
    let n = Tensor::new([[true], [false]], dev)?;
    assert_eq!(
        m.logical_xor(&n)?.to_vec2::<bool>()?,
        [[false, true], [true, false]],
        "broadcasts"
    );
    assert_eq!(m.logical_not()?.dtype(), DType::Bool);
    // PyTorch refuses `-` between bools, scalar or tensor, in place or not
    for e in [
        m.sub(true).map(drop),
        m.sub(&m).map(drop),
        m.sub_(false),
        m.sub_(&m),
    ] {
        let e = e.unwrap_err().to_string();
        assert!(
            e.contains("logical_xor") && e.contains("two bool tensors"),
            "{e}"
        );
    }
    // a bool minus a number is refused too, as in PyTorch
    let e = m.sub(1).unwrap_err().to_string();
    assert!(
        e.contains("logical_not") && e.contains("with a bool tensor"),
        "{e}"
    );
    if dev.is_cuda() {
        let cpu = Tensor::new([true], &Device::Cpu)?;
        let e = m.logical_and(&cpu).unwrap_err().to_string();
        assert!(
            e.contains("same device") && e.contains("logical_and"),
            "{e}"
        );
    }
    Ok(())
}

fn non_contiguous_inputs(dev: &Device) -> Result<()> {
    let a = Tensor::arange(0f32, 6., dev)?.reshape([2, 3])?;
    let at = a.t()?; // [3,2], strides [1,3]
    assert!(!at.is_contiguous());
    let s = at.add(&Tensor::ones([3, 2], DType::F32, dev)?)?;
    assert_eq!(vals(&s), vec![1., 4., 2., 5., 3., 6.]);
    assert_eq!(vals(&at.mul(&at)?), vec![0., 9., 1., 16., 4., 25.]);
    let stepped = Tensor::arange(0f32, 10., dev)?.slice(0, Some(1), None, 3)?;
    assert_close(&vals(&stepped.exp()?.log()?), &[1., 4., 7.], 1e-6, 0.0);
    // big enough to take the parallel path, strided
    let big = Tensor::arange(0f32, 300_000., dev)?
        .reshape([600, 500])?
        .t()?;
    let y = big.mul(2.0)?;
    let row1: Vec<f64> = (0..600).map(|i| 2.0 * (i * 500 + 1) as f64).collect();
    assert_eq!(vals(&y.i(1)?), row1);
    Ok(())
}

fn in_place_ops(dev: &Device) -> Result<()> {
    let a = Tensor::zeros([2, 3], DType::F32, dev)?;
    a.add_(1.0)?;
    a.mul_(&t(dev, &[1., 2., 3.], &[3]))?;
    assert_eq!(vals(&a), vec![1., 2., 3., 1., 2., 3.]);
    // through a view: column 1 of a
    let col = a.i((.., 1))?;
    col.sub_(10.0)?;
    assert_eq!(vals(&a), vec![1., -8., 3., 1., -8., 3.]);
    // aliasing: a += a
    a.add_(&a)?;
    assert_eq!(vals(&a), vec![2., -16., 6., 2., -16., 6.]);
    // transposed destination
    let b = Tensor::zeros([3, 2], DType::F32, dev)?;
    b.t()?
        .copy_(&Tensor::arange(0f32, 6., dev)?.reshape([2, 3])?)?;
    assert_eq!(vals(&b), vec![0., 3., 1., 4., 2., 5.]);
    // int tensor += float is refused; float += int is fine
    let i = Tensor::new([1i64, 2], dev)?;
    assert!(i.add_(0.5).is_err());
    assert!(
        i.div_(2).is_err(),
        "true division result cannot go into int64"
    );
    let f = t(dev, &[1., 2.], &[2]);
    f.add_(&i)?;
    assert_eq!(vals(&f), vec![2., 4.]);
    // the destination cannot grow by broadcasting, nor be an expanded view
    assert!(f.add_(&Tensor::ones([2, 2], DType::F32, dev)?).is_err());
    let e = Tensor::ones([1], DType::F32, dev)?.expand([3])?;
    assert!(e.add_(1.0).is_err());
    // f64 into f32 storage computes in f64 and casts
    f.mul_(&Tensor::new([0.5f64, 0.25], dev)?)?;
    assert_eq!((f.dtype(), vals(&f)), (DType::F32, vec![1., 1.]));
    Ok(())
}

fn operators(dev: &Device) -> Result<()> {
    let a = t(dev, &[1., 2.], &[2]);
    let b = t(dev, &[3., 4.], &[2]);
    assert_eq!(vals(&(&a + &b)), vec![4., 6.]);
    assert_eq!(vals(&(&a - &b)), vec![-2., -2.]);
    assert_eq!(vals(&(&a * 2.0)), vec![2., 4.]);
    assert_eq!(vals(&(&b / &a)), vec![3., 2.]);
    assert_eq!(vals(&(1.0 - &a)), vec![0., -1.]);
    assert_eq!(vals(&(2.0 * &a)), vec![2., 4.]);
    assert_eq!(vals(&(4.0 / &a)), vec![4., 2.]);
    assert_eq!(vals(&-&a), vec![-1., -2.]);
    // owned left operand: computed in place when nothing else holds it
    let c = &a + &b;
    let d = c * &a;
    assert_eq!(vals(&d), vec![4., 12.]);
    // ...and never when something else does
    let e = a.clone();
    let f = e + &b;
    assert_eq!((vals(&a), vals(&f)), (vec![1., 2.], vec![4., 6.]));
    let g = (&a * 1.0) + 1.0;
    assert_eq!(vals(&g), vec![2., 3.]);
    Ok(())
}

/// In-place ops and copies through a transposed view of 300 × 300 elements (over
/// the 2¹⁶ where the CPU splits the work into chunks of 2¹⁵ over threads): every
/// element is written once, the first chunk as much as the last.
fn large_strided_inplace_ops_write_every_element(dev: &Device) -> Result<()> {
    let n = 300usize;
    let a = Tensor::zeros([n, n], DType::F32, dev)?;
    let at = a.t()?;
    at.add_(&Tensor::arange(0.0f32, (n * n) as f32, dev)?.reshape([n, n])?)?;
    // a[i, j] = at[j, i] = j·n + i
    let got = a.to_vec::<f32>()?;
    for (k, &v) in got.iter().enumerate() {
        let (i, j) = (k / n, k % n);
        assert_eq!(v, (j * n + i) as f32, "add_ through the view at [{i}, {j}]");
    }
    let b = Tensor::zeros([n, n], DType::F32, dev)?;
    b.t()?.copy_(&a)?;
    // b[i, j] = a[j, i] = i·n + j
    let got = b.to_vec::<f32>()?;
    assert!(
        got.iter().enumerate().all(|(k, &v)| v == k as f32),
        "copy_ through the view"
    );
    Ok(())
}

/// The contiguous float kernels take 16-byte vectors where the arrays are
/// aligned, and the end of the array (and arrays off a 16-byte boundary)
/// element by element. Over lengths around those pieces (and past one pass of
/// the grid on the simulator), from offsets 0, one element and one 16-byte step
/// in, each op on contiguous values gives, bit for bit, what the same op gives
/// on a strided view of the same values (the element-by-element path). The
/// results are read on the CPU, so that no kernel under test reads them back.
fn contiguous_kernels_match_the_strided_path_at_every_length(dev: &Device) -> Result<()> {
    // the same values as a strided view: column 0 of [n, 2]
    let strided = |t: &Tensor| -> Result<Tensor> { Tensor::stack(&[t, t], 1)?.select(1, 0) };
    for dt in [DType::F32, DType::BF16, DType::F16] {
        let step = (16 / dt.size_in_bytes()) as i64;
        for n in [1usize, 7, 9, 1029, 8 * 1024 + 5, 70_001, 600_011] {
            // values k / 8 with |k| <= 50, exact in each dtype
            let vals = |seed: usize| -> Vec<f32> {
                (0..n + 16)
                    .map(|i| ((i * seed) % 101) as f32 / 8.0 - 6.25)
                    .collect()
            };
            for off in [0, 1, step] {
                let at = |v: &[f32]| -> Result<Tensor> {
                    Tensor::from_slice(v, [n + 16], dev)?
                        .to_dtype(dt)?
                        .narrow(0, off, n)
                };
                let (x, y) = (at(&vals(37))?, at(&vals(53))?);
                let (xs, ys) = (strided(&x)?, strided(&y)?);
                assert!(x.is_contiguous() && (n == 1 || !xs.is_contiguous()));
                let what = format!("{dt:?}, {n} elements from {off}");
                let same = |a: Tensor, b: Tensor, op: &str| -> Result<()> {
                    let cpu = |t: Tensor| t.to(&Device::Cpu);
                    assert_eq!(bits(&cpu(a)?)?, bits(&cpu(b)?)?, "{op} ({what})");
                    Ok(())
                };
                same(x.relu()?, xs.relu()?, "relu")?;
                same(-&x, -&xs, "neg")?;
                same(x.square()?, xs.square()?, "square")?;
                same(x.gelu()?, xs.gelu()?, "gelu")?;
                same(x.add(&y)?, xs.add(&ys)?, "add")?;
                same(x.sub(&y)?, xs.sub(&ys)?, "sub")?;
                same(x.mul(&y)?, xs.mul(&ys)?, "mul")?;
                same(x.div(&y)?, xs.div(&ys)?, "div")?;
                same(x.add(2.5)?, xs.add(2.5)?, "add a scalar")?;
                // (a fresh strided view: `strided` stacks a new array)
                let (z, zs) = (x.copy()?, strided(&x)?);
                z.add_(&y)?;
                zs.add_(&ys)?;
                same(z.clone(), zs.clone(), "add_")?;
                z.relu_()?;
                zs.relu_()?;
                same(z, zs, "relu_")?;
                same(
                    x.to_dtype(DType::F64)?,
                    xs.to_dtype(DType::F64)?,
                    "cast to float64",
                )?;
                let w = x.to_dtype(DType::F32)?.mul(1.0 / 3.0)?;
                same(
                    w.to_dtype(dt)?,
                    strided(&w)?.to_dtype(dt)?,
                    "cast from float32",
                )?;
            }
        }
    }
    Ok(())
}

/// In-place ops on a channels-last tensor (which walk it in memory order) write
/// what the out-of-place ops on a row-major copy give, with a broadcast operand,
/// a row-major one of the same shape, a scalar, and recorded by autograd; the
/// tensor keeps its strides.
fn in_place_ops_on_channels_last_tensors(dev: &Device) -> Result<()> {
    let shape = [2usize, 3, 4, 5];
    let n = shape.iter().product::<usize>();
    let v: Vec<f32> = (0..n).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
    let rm = Tensor::from_slice(&v, shape, dev)?;
    let other: Vec<f32> = (0..n).map(|i| (i % 13) as f32 * 0.5).collect();
    let other = Tensor::from_slice(&other, shape, dev)?;
    let bias = Tensor::from_slice(&[1.0f32, -2.0, 3.0], [3, 1, 1], dev)?;
    let want = rm
        .add(&bias)?
        .mul(2.0)?
        .relu()?
        .sub(&other)?
        .to_vec::<f32>()?;
    let cl = rm.to_memory_format(ember::MemoryFormat::ChannelsLast)?;
    let strides = cl.stride().to_vec();
    cl.add_(&bias)?;
    cl.mul_(2.0)?;
    cl.relu_()?;
    cl.sub_(&other)?;
    assert_eq!(cl.stride(), &strides[..], "strides kept");
    assert_eq!(cl.to_vec::<f32>()?, want, "values");
    // recorded: the gradient through mul_ and relu_ of a non-leaf
    let leaf = rm.detach().requires_grad_(true)?;
    let x = leaf
        .to_memory_format(ember::MemoryFormat::ChannelsLast)?
        .mul(1.0)?;
    x.mul_(&other)?;
    x.relu_()?;
    x.sum_all()?.backward()?;
    let g = leaf.grad().expect("a gradient").to_vec::<f32>()?;
    let o = other.to_vec::<f32>()?;
    let g_want: Vec<f32> = v
        .iter()
        .zip(&o)
        .map(|(&a, &b)| if a * b > 0.0 { b } else { 0.0 })
        .collect();
    assert_eq!(g, g_want, "gradient");
    Ok(())
}

/// Every in-place one-input op (`relu_`, `exp_`, ...) writes what its out-of-place
/// op returns, bit for bit, in each float dtype, into contiguous tensors (the
/// kernels' 16-byte path, with a tail) and through a transposed view; integer
/// targets take the ops that keep integers and refuse the float-only ones, as
/// PyTorch does.
fn in_place_unary_ops_write_what_the_ops_return(dev: &Device) -> Result<()> {
    type Op = fn(&Tensor) -> Result<Tensor>;
    type OpInPlace = fn(&Tensor) -> Result<()>;
    let ops: [(&str, Op, OpInPlace); 26] = [
        ("neg", Tensor::neg, Tensor::neg_),
        ("abs", Tensor::abs, Tensor::abs_),
        ("exp", Tensor::exp, Tensor::exp_),
        ("log", Tensor::log, Tensor::log_),
        ("sqrt", Tensor::sqrt, Tensor::sqrt_),
        ("tanh", Tensor::tanh, Tensor::tanh_),
        ("sin", Tensor::sin, Tensor::sin_),
        ("cos", Tensor::cos, Tensor::cos_),
        ("recip", Tensor::recip, Tensor::recip_),
        ("square", Tensor::square, Tensor::square_),
        ("relu", Tensor::relu, Tensor::relu_),
        ("sigmoid", Tensor::sigmoid, Tensor::sigmoid_),
        ("erf", Tensor::erf, Tensor::erf_),
        ("silu", Tensor::silu, Tensor::silu_),
        ("hardsigmoid", Tensor::hardsigmoid, Tensor::hardsigmoid_),
        ("hardswish", Tensor::hardswish, Tensor::hardswish_),
        ("log1p", Tensor::log1p, Tensor::log1p_),
        ("expm1", Tensor::expm1, Tensor::expm1_),
        ("rsqrt", Tensor::rsqrt, Tensor::rsqrt_),
        ("log2", Tensor::log2, Tensor::log2_),
        ("tan", Tensor::tan, Tensor::tan_),
        ("atan", Tensor::atan, Tensor::atan_),
        ("floor", Tensor::floor, Tensor::floor_),
        ("ceil", Tensor::ceil, Tensor::ceil_),
        ("trunc", Tensor::trunc, Tensor::trunc_),
        ("round", Tensor::round, Tensor::round_),
    ];
    // 37 values: NaN, infinities, zeros of both signs, halves, and a spread
    let mut xs = vec![
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        0.5,
        -2.5,
        3.5,
    ];
    xs.extend((0..29).map(|i| (i as f32 - 14.0) * 0.37));
    for dt in [DType::F32, DType::F64, DType::BF16, DType::F16] {
        let base = Tensor::new(xs.as_slice(), dev)?.to_dtype(dt)?;
        for (name, op, op_) in ops {
            let want = op(&base)?;
            let x = base.copy()?;
            op_(&x)?;
            assert_eq!(x.dtype(), dt, "{name}_ {dt}");
            assert_eq!(bits(&x)?, bits(&want)?, "{name}_ {dt}");
            // through a strided view (columns 1..5 of every other row, transposed):
            // the elements it covers, none other
            let m = base.narrow(0, 0, 36)?.reshape([6, 6])?.copy()?;
            let before = bits(&m)?;
            let view = || m.narrow(1, 1, 4)?.slice(0, None, None, 2)?.t();
            let want = op(&view()?)?;
            op_(&view()?)?;
            assert_eq!(bits(&view()?)?, bits(&want)?, "{name}_ {dt} through a view");
            let after = bits(&m)?;
            for (k, (a, b)) in after.iter().zip(&before).enumerate() {
                let (row, col) = (k / 6, k % 6);
                if row % 2 == 1 || col == 0 || col == 5 {
                    assert_eq!(a, b, "{name}_ {dt}: element {k} outside the view changed");
                }
            }
        }
    }
    // integers: the ops that keep them work in place; float-only ops are refused
    let i = Tensor::new([-3i64, 0, 2], dev)?;
    i.neg_()?;
    i.abs_()?;
    i.relu_()?;
    i.floor_()?;
    assert_eq!(i.to_vec::<i64>()?, vec![3, 0, 2]);
    for bad in [Tensor::exp_ as OpInPlace, Tensor::sigmoid_, Tensor::sqrt_] {
        let e = bad(&i).unwrap_err();
        assert!(
            e.to_string()
                .contains("can't be cast to the desired output type"),
            "{e}"
        );
    }
    assert!(i.hardswish_().is_err(), "a float-only kernel");
    assert!(Tensor::new([true, false], dev)?.relu_().is_err());
    // an expanded view has elements that share memory
    let e = Tensor::ones([1], DType::F32, dev)?.expand([3])?;
    assert!(e.relu_().is_err());
    assert_eq!(i.to_vec::<i64>()?, vec![3, 0, 2], "refusals write nothing");
    Ok(())
}

/// `relu_` and a residual `add_` while autograd records allocate nothing (on
/// meta, which counts every storage made): the kernels write in place and the
/// rules keep the result (relu) or nothing (add); the out-of-place ops allocate
/// one output each. `sin_` keeps a copy of its input (its rule reads it).
#[test]
fn recorded_in_place_activations_allocate_nothing() -> Result<()> {
    use ember::meta::{AllocHook, MetaEvent};
    use std::sync::atomic::{AtomicUsize, Ordering};
    #[derive(Default)]
    struct Count(AtomicUsize);
    impl AllocHook for Count {
        fn alloc(&self, _: &MetaEvent) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
        fn free(&self, _: &MetaEvent) {}
    }
    let dev = Device::Meta;
    let w = Tensor::zeros([64, 64], DType::F32, &dev)?.requires_grad_(true)?;
    let id = Tensor::zeros([64, 64], DType::F32, &dev)?;
    let count = |f: &dyn Fn(&Tensor) -> Result<()>| -> Result<usize> {
        let h = w.mul(2.0)?;
        let c = std::sync::Arc::new(Count::default());
        ember::meta::with_hook(c.clone(), || f(&h))?;
        Ok(c.0.load(Ordering::Relaxed))
    };
    assert_eq!(count(&|h| h.relu_())?, 0);
    assert_eq!(count(&|h| h.add_(&id))?, 0);
    assert_eq!(count(&|h| nn::ReLU::inplace().forward(h).map(drop))?, 0);
    assert_eq!(count(&|h| h.sin_())?, 1, "sin_ keeps its input");
    assert_eq!(count(&|h| h.relu().map(drop))?, 1);
    assert_eq!(count(&|h| h.add(&id).map(drop))?, 1);
    // and a gradient of w's shape flows back through them (meta has no values)
    let h = w.mul(2.0)?;
    h.add_(&id)?;
    h.relu_()?;
    h.sum_all()?.backward()?;
    assert_eq!(w.grad().map(|g| g.shape().to_vec()), Some(vec![64, 64]));
    Ok(())
}

/// `nn::ReLU::inplace()` writes into its input and returns it; where autograd
/// records through a view (a `Linear`'s output for a rank-3 input), which ember
/// cannot yet write in place, it returns a new tensor and leaves the input as it
/// was, with the same values and gradient as `nn::ReLU`; a leaf that requires
/// grad is refused, as in PyTorch.
fn in_place_relu_module(dev: &Device) -> Result<()> {
    let _rng = super::rng_lock();
    let x = Tensor::new([-1.0f32, 2.0, -3.0, 4.0], dev)?;
    let y = nn::ReLU::inplace().forward(&x)?;
    assert_eq!(vals(&x), vec![0.0, 2.0, 0.0, 4.0]);
    // the same elements: a write through the result shows in the input
    y.add_(1.0)?;
    assert_eq!(vals(&x), vec![1.0, 3.0, 1.0, 5.0]);
    let lin = nn::Linear::new(4, 4, dev)?;
    let input = Tensor::randn([2, 3, 4], dev)?;
    let h = lin.forward(&input)?;
    let before = vals(&h);
    let got = nn::ReLU::inplace().forward(&h)?;
    let want = nn::ReLU.forward(&h)?;
    assert_eq!(vals(&h), before, "the view is left as it was");
    assert_eq!(vals(&got), vals(&want));
    got.sum_all()?.backward()?;
    let g = lin.weight.grad().expect("a gradient through the fallback");
    assert_eq!(g.shape(), &[4, 4]);
    let leaf = Tensor::ones([3], DType::F32, dev)?.requires_grad_(true)?;
    let e = nn::ReLU::inplace().forward(&leaf).unwrap_err();
    assert!(e.to_string().contains("leaf Variable"), "{e}");
    Ok(())
}

device_test!(
    contiguous_kernels_match_the_strided_path_at_every_length,
    in_place_relu_module,
    in_place_unary_ops_write_what_the_ops_return,
    large_strided_inplace_ops_write_every_element,
    in_place_ops_on_channels_last_tensors,
    arithmetic_broadcasts,
    scalar_operands_and_promotion,
    unary_math,
    binary_extras,
    comparisons_where_masked_fill,
    logical_ops_and_bool_subtraction,
    non_contiguous_inputs,
    in_place_ops,
    operators,
);

#[test]
#[should_panic(expected = "must match the size of tensor b")]
fn operators_panic_with_the_error_message() {
    let a = Tensor::zeros([2], DType::F32, &Device::Cpu).unwrap();
    let b = Tensor::zeros([3], DType::F32, &Device::Cpu).unwrap();
    let _ = &a + &b;
}

// ---- PyTorch parity: refusals with PyTorch's reasons, scalars on the left --------

/// Subtraction with a bool on either side, pow/argmax/argmin/gelu on bools, fill
/// values a dtype cannot hold and negative indices are errors of PyTorch's kind,
/// carrying PyTorch's reason.
fn refused_like_pytorch(dev: &Device) -> Result<()> {
    let b = Tensor::from_slice(&[true, false], [2], dev)?;
    let i = Tensor::from_slice(&[1i64, 2], [2], dev)?;
    let f = Tensor::from_slice(&[1.0f32, 2.0], [2], dev)?;
    let msg = |r: Result<Tensor>| match r {
        Err(e @ ember::Error::UnsupportedDType { .. }) => e.to_string(),
        other => panic!("expected an UnsupportedDType error, got {other:?}"),
    };
    assert!(msg(b.sub(&b)).contains("with two bool tensors is not supported"));
    for r in [
        b.sub(&i),
        i.sub(&b),
        f.sub(&b),
        b.sub(1),
        b.sub(1.5),
        b.rsub(1),
        i.rsub(true),
    ] {
        assert!(
            msg(r).contains("If you are trying to invert a mask, use the `~` or `logical_not()`")
        );
    }
    assert!(msg(b.rsub(true)).contains("two bool tensors"));
    assert!(msg(b.pow(&b)).contains("\"pow\" not implemented for 'Bool'"));
    assert!(msg(b.argmax(0, false)).contains("argmax(): does not support bool input"));
    assert!(msg(b.argmin_all()).contains("argmin(): does not support bool input"));
    assert!(msg(b.gelu()).contains("GeluKernelImpl"));
    assert!(msg(i.gelu_tanh()).contains("not implemented for 'Long'"));
    // ... while these are fine, as in PyTorch
    assert_eq!(b.pow(2)?.dtype(), DType::I64);
    assert_eq!(b.pow(2)?.to_vec::<i64>()?, vec![1, 0]);
    assert_eq!(b.pow(false)?.to_vec::<bool>()?, vec![true, true]);
    assert_eq!(b.max_dim(0, false)?.1.to_vec::<i64>()?, vec![0]);

    let overflow = |r: Result<Tensor>| match r {
        Err(e @ ember::Error::InvalidArgument { .. }) => {
            assert!(e.to_string().contains("without overflow"), "{e}")
        }
        other => panic!("expected an overflow error, got {other:?}"),
    };
    overflow(Tensor::full([2], 300, DType::U8, dev));
    overflow(Tensor::full([2], -1.0, DType::U8, dev));
    overflow(Tensor::full([2], f64::NAN, DType::U8, dev));
    overflow(Tensor::full([2], 1e20, DType::I64, dev));
    overflow(Tensor::full([2], f64::NAN, DType::I64, dev));
    overflow(Tensor::full([2], 1e39, DType::F32, dev));
    overflow(Tensor::full([2], 70000.0, DType::F16, dev));
    overflow(Tensor::zeros([2], DType::U8, dev)?.masked_fill(&b, 300));
    overflow(Tensor::zeros([2], DType::I64, dev)?.masked_fill(&b, f64::NAN));
    assert_eq!(
        Tensor::full([2], -1, DType::U8, dev)?.to_vec::<u8>()?,
        vec![255, 255]
    );
    assert_eq!(
        Tensor::full([2], 255.5, DType::U8, dev)?.to_vec::<u8>()?,
        vec![255, 255]
    );
    assert!(Tensor::full([1], f64::INFINITY, DType::F16, dev)?.to_vec::<f64>()?[0].is_infinite());
    assert_eq!(
        Tensor::zeros([2], DType::U8, dev)?
            .masked_fill(&b, -1)?
            .to_vec::<u8>()?,
        vec![255, 0]
    );

    // on a GPU the indices are checked on the device: the error comes at the
    // next synchronisation
    let oob = |r: Result<Tensor>| match super::synced(r) {
        Err(ember::Error::IndexOutOfRange { index: -1, .. }) => {}
        other => panic!("expected an index error for -1, got {other:?}"),
    };
    let neg = Tensor::from_slice(&[-1i64], [1], dev)?;
    oob(f.index_select(0, &neg));
    oob(f.gather(0, &neg));
    oob(Tensor::zeros([2], DType::F32, dev)?.scatter_add(0, &neg, &f));
    Ok(())
}

/// `rsub` / `rdiv` (and the operators with a scalar on the left) promote like
/// PyTorch's `2 - t` and `2 / t`.
fn scalar_on_the_left(dev: &Device) -> Result<()> {
    let i = Tensor::from_slice(&[1i64, 2, 4], [3], dev)?;
    let f = Tensor::from_slice(&[0.5f32, -2.0, 4.0], [3], dev)?;
    let r = i.rsub(2)?;
    assert_eq!(
        (r.dtype(), r.to_vec::<i64>()?),
        (DType::I64, vec![1, 0, -2])
    );
    let r = i.rsub(0.5)?;
    assert_eq!((r.dtype(), vals(&r)), (DType::F32, vec![-0.5, -1.5, -3.5]));
    let r = i.rdiv(2)?;
    assert_eq!((r.dtype(), vals(&r)), (DType::F32, vec![2.0, 1.0, 0.5]));
    assert_eq!(vals(&(1.0 - &f)), vec![0.5, 3.0, -3.0]);
    assert_eq!(vals(&(2 - &f)), vec![1.5, 4.0, -2.0]);
    assert_eq!(vals(&(1.0 / &f)), vec![2.0, -0.5, 0.25]);
    assert_eq!(vals(&(2 / &i)), vec![2.0, 1.0, 0.5]);
    assert_eq!((2 - &i).to_vec::<i64>()?, vec![1, 0, -2]);
    assert_eq!((&i * 3).to_vec::<i64>()?, vec![3, 6, 12]);
    let u = Tensor::from_slice(&[1u8, 2], [2], dev)?;
    assert_eq!(u.rsub(300)?.to_vec::<u8>()?, vec![43, 42]);
    // f16: the scalar is not rounded to f16 before dividing (PyTorch: [inf, 49984])
    let h = Tensor::from_slice(&[1.0f32, 2.0], [2], dev)?.to_dtype(DType::F16)?;
    assert_eq!(vals(&h.rdiv(1e5)?), vec![f64::INFINITY, 49984.0]);
    // gradients flow through the tensor operand
    let x = Tensor::from_slice(&[0.5f64, 2.0], [2], dev)?.requires_grad_(true)?;
    x.rsub(1.0)?.add(&x.rdiv(2.0)?)?.sum_all()?.backward()?;
    assert_eq!(vals(&x.grad().unwrap()), vec![-1.0 - 8.0, -1.0 - 0.5]);
    Ok(())
}

/// A bool on the left of `-` panics with PyTorch's reason (the method returns it).
#[test]
#[should_panic(expected = "logical_not")]
fn scalar_minus_bool_panics_with_the_reason() {
    let b = Tensor::from_slice(&[true], [1], &Device::Cpu).unwrap();
    let _ = 1.0 - &b;
}

/// A 0-d CPU tensor (PyTorch's CPU scalar) goes with tensors on any device in
/// elementwise ops, on either side, in place, in comparisons, `where` and the
/// logical ops (not as `clamp`'s bound, as in PyTorch's CUDA clamp); it promotes as a 0-d tensor (not as a Python number);
/// a gradient that flows to it comes back to the CPU; a CPU tensor of rank 1
/// beside a GPU tensor is still a device mismatch.
fn cpu_scalars_go_with_tensors_on_any_device(dev: &Device) -> Result<()> {
    let cpu = Device::Cpu;
    let x = Tensor::from_slice(&[1f32, 2., 3.], [3], dev)?;
    let two = Tensor::scalar(2f32, &cpu)?;
    let on_dev = |t: Tensor| -> Result<Vec<f64>> {
        assert_eq!(t.device(), *dev);
        Ok(vals(&t))
    };
    assert_eq!(on_dev(x.mul(&two)?)?, [2., 4., 6.]);
    assert_eq!(on_dev(two.sub(&x)?)?, [1., 0., -1.]);
    assert_eq!(on_dev(x.div(&two)?)?, [0.5, 1., 1.5]);
    assert_eq!(on_dev(x.pow(&two)?)?, [1., 4., 9.]);
    assert_eq!(on_dev(x.maximum(&two)?)?, [2., 2., 3.]);
    assert_eq!(on_dev(x.lt(&two)?)?, [1., 0., 0.]);
    assert_eq!(on_dev(two.lt(&x)?)?, [0., 0., 1.]);
    assert_eq!(on_dev(x.gt(1.5)?.where_(&two, &x)?)?, [1., 2., 2.]);
    let yes = Tensor::scalar(true, &cpu)?;
    assert_eq!(on_dev(yes.where_(&x, 0.0)?)?, [1., 2., 3.]);
    let zero = Tensor::scalar(0f32, &cpu)?;
    assert_eq!(on_dev(x.logical_and(&zero)?)?, [0., 0., 0.]);
    assert_eq!(on_dev(zero.logical_or(&x)?)?, [1., 1., 1.]);
    let z = x.copy()?;
    z.add_(&two)?;
    z.mul_(&Tensor::scalar(0.5f64, &cpu)?)?;
    assert_eq!(
        (z.dtype(), on_dev(z.clone())?),
        (DType::F32, vec![1.5, 2., 2.5])
    );
    // a 0-d float64 makes an int64 tensor float64 (a Python float: float32)
    let i = Tensor::from_slice(&[1i64, -2], [2], dev)?;
    let r = i.mul(&Tensor::scalar(2.5f64, &cpu)?)?;
    assert_eq!(
        (r.dtype(), on_dev(r.clone())?),
        (DType::F64, vec![2.5, -5.])
    );
    assert_eq!(i.mul(2.5)?.dtype(), DType::F32);
    // a float16 quotient by a float32 one uses it in float32: not 0
    let h = Tensor::from_slice(&[1000f32, 3.], [2], dev)?.to_dtype(DType::F16)?;
    let q = h.div(&Tensor::scalar(1e5f32, &cpu)?)?;
    assert_eq!(q.dtype(), DType::F16);
    assert!(on_dev(q)?.iter().all(|&v| v > 0.0));
    // in place too, whether or not the scalar requires grad
    let big = Tensor::scalar(1e5f32, &cpu)?.requires_grad_(true)?;
    let hq = h.copy()?;
    ember::autograd::no_grad(|| hq.div_(&big))?;
    assert!(on_dev(hq)?.iter().all(|&v| v > 0.0));
    let hg = h.copy()?.requires_grad_(true)?;
    let hq = hg.mul(1.0)?;
    hq.div_(&big)?;
    assert!(on_dev(hq.detach())?.iter().all(|&v| v > 0.0));
    hq.sum_all()?.backward()?;
    assert_eq!(big.grad().expect("the divisor's gradient").device(), cpu);
    // gradients: the scalar's on the CPU, on either side
    let xg = x.copy()?.requires_grad_(true)?;
    let s = Tensor::scalar(2f32, &cpu)?.requires_grad_(true)?;
    xg.mul(&s)?.add(&s.div(&xg)?)?.sum_all()?.backward()?;
    let sg = s.grad().expect("the scalar's gradient");
    assert_eq!(sg.device(), cpu);
    assert_close(&vals(&sg), &[6.0 + 1.0 + 0.5 + 1.0 / 3.0], 1e-6, 0.0);
    let xgrad = xg.grad().expect("the tensor's gradient");
    assert_close(
        &on_dev(xgrad)?,
        &[0.0, 2. - 0.5, 2. - 2. / 9.], // s - s / x²
        1e-6,
        0.0,
    );
    if !dev.is_cpu() {
        // (PyTorch's CUDA clamp refuses a CPU scalar as a bound)
        assert!(matches!(
            x.clamp_tensor(Some(&two), None),
            Err(Error::DeviceMismatch { .. })
        ));
        let one = Tensor::from_slice(&[1f32], [1], &cpu)?;
        assert!(matches!(x.add(&one), Err(Error::DeviceMismatch { .. })));
        assert!(matches!(one.add(&x), Err(Error::DeviceMismatch { .. })));
    }
    Ok(())
}

device_test!(
    refused_like_pytorch,
    scalar_on_the_left,
    cpu_scalars_go_with_tensors_on_any_device
);
