use super::{synced, vals};
use ember::prelude::*;

fn reshape_view_flatten(dev: &Device) -> Result<()> {
    let a = Tensor::arange(0f32, 12., dev)?;
    let r = a.reshape([3, -1])?;
    assert_eq!(
        (r.shape(), r.stride()),
        (&[3usize, 4][..], &[4usize, 1][..])
    );
    assert_eq!(vals(&a.view([2, 2, 3])?.i((1, 1))?), vec![9., 10., 11.]);
    let t = r.t()?;
    assert!(
        t.view([12]).is_err(),
        "a transposed matrix cannot be viewed flat"
    );
    assert_eq!(
        vals(&t.reshape([12])?)[..4],
        [0., 4., 8., 1.],
        "reshape copies instead"
    );
    assert_eq!(r.flatten_all()?.shape(), &[12]);
    let b = a.reshape([2, 3, 2])?;
    assert_eq!(b.flatten(1, 2)?.shape(), &[2, 6]);
    assert_eq!(b.flatten(0, 1)?.shape(), &[6, 2]);
    assert_eq!(Tensor::new(5f32, dev)?.flatten_all()?.shape(), &[1]);
    assert!(
        a.reshape([5, -1]).is_err() && a.reshape([-1, -1]).is_err() && a.reshape([3, 3]).is_err()
    );
    // reshape of a view shares storage: writing through it changes the base
    let v = a.view([3, 4])?;
    v.i((0, 0))?.add_(100.0)?;
    assert_eq!(vals(&a)[0], 100.0);
    Ok(())
}

fn squeeze_unsqueeze_transpose_permute(dev: &Device) -> Result<()> {
    let a = Tensor::zeros([2, 1, 3, 1], DType::F32, dev)?;
    assert_eq!(a.squeeze(1)?.shape(), &[2, 3, 1]);
    assert_eq!(
        a.squeeze(0)?.shape(),
        &[2, 1, 3, 1],
        "no-op on a size that is not 1"
    );
    assert_eq!(a.squeeze(-1)?.shape(), &[2, 1, 3]);
    assert_eq!(a.squeeze_all()?.shape(), &[2, 3]);
    assert_eq!(a.unsqueeze(0)?.shape(), &[1, 2, 1, 3, 1]);
    assert_eq!(a.unsqueeze(-1)?.shape(), &[2, 1, 3, 1, 1]);
    assert_eq!(a.unsqueeze(4)?.shape(), &[2, 1, 3, 1, 1]);
    let b = Tensor::arange(0f32, 24., dev)?.reshape([2, 3, 4])?;
    let p = b.permute([2, 0, 1])?;
    assert_eq!(
        (p.shape(), p.stride()),
        (&[4usize, 2, 3][..], &[1usize, 12, 4][..])
    );
    assert_eq!(vals(&p.i((1, 1))?), vec![13., 17., 21.]);
    assert_eq!(vals(&b.transpose(0, -1)?.i((3, 2))?), vec![11., 23.]);
    assert!(b.t().map(|_| ()).is_err(), "t() needs <= 2 dims");
    assert_eq!(Tensor::arange(0f32, 3., dev)?.t()?.shape(), &[3]);
    assert!(b.permute([0, 0, 1]).is_err() && b.permute([0, 1]).is_err());
    Ok(())
}

fn narrow_slice_select_index(dev: &Device) -> Result<()> {
    let a = Tensor::arange(0i64, 20, dev)?.reshape([4, 5])?;
    assert_eq!(
        a.narrow(1, 1, 2)?.to_vec2::<i64>()?,
        vec![vec![1, 2], vec![6, 7], vec![11, 12], vec![16, 17]]
    );
    assert_eq!(
        a.narrow(0, -1, 1)?.to_vec2::<i64>()?,
        vec![vec![15, 16, 17, 18, 19]]
    );
    assert!(a.narrow(1, 4, 2).is_err());
    assert_eq!(
        a.slice(1, Some(0), None, 2)?.i(0)?.to_vec1::<i64>()?,
        vec![0, 2, 4]
    );
    assert_eq!(
        a.slice(1, Some(-2), None, 1)?.i(1)?.to_vec1::<i64>()?,
        vec![8, 9]
    );
    assert_eq!(
        a.slice(0, Some(3), Some(100), 1)?.shape(),
        &[1, 5],
        "bounds clamp"
    );
    assert_eq!(a.slice(0, Some(3), Some(1), 1)?.shape(), &[0, 5]);
    assert_eq!(a.select(1, -1)?.to_vec1::<i64>()?, vec![4, 9, 14, 19]);
    assert!(a.select(0, 4).is_err());
    assert_eq!(a.i((1..3, 2))?.to_vec1::<i64>()?, vec![7, 12]);
    assert_eq!(a.i((.., ..=1))?.shape(), &[4, 2]);
    assert_eq!(a.i(-1)?.to_vec1::<i64>()?, vec![15, 16, 17, 18, 19]);
    assert_eq!(a.i((2, 3))?.item::<i64>()?, 13);
    assert!(a.i((0, 0, 0)).is_err());
    Ok(())
}

fn expand_and_contiguous(dev: &Device) -> Result<()> {
    let a = Tensor::new([[1f32], [2.]], dev)?;
    let e = a.expand([2, 3])?;
    assert_eq!(
        (e.stride(), vals(&e)),
        (&[1usize, 0][..], vec![1., 1., 1., 2., 2., 2.])
    );
    assert_eq!(a.expand([4, -1, 3])?.shape(), &[4, 2, 3]);
    assert!(a.expand([3, 3]).is_err());
    assert_eq!(a.broadcast_to([2, 2])?.shape(), &[2, 2]);
    let c = e.contiguous()?;
    assert!(c.is_contiguous() && !e.is_contiguous());
    assert_eq!(vals(&c), vals(&e));
    let same = c.contiguous()?;
    assert_eq!(same.stride(), c.stride());
    Ok(())
}

fn cat_stack_split_chunk(dev: &Device) -> Result<()> {
    let a = Tensor::arange(0f32, 6., dev)?.reshape([2, 3])?;
    let b = Tensor::arange(6f32, 9., dev)?.reshape([1, 3])?;
    let c = Tensor::cat(&[&a, &b], 0)?;
    assert_eq!(
        (c.shape(), vals(&c)),
        (&[3usize, 3][..], (0..9).map(|x| x as f64).collect())
    );
    let d = Tensor::cat(&[&a, &a.t()?.contiguous()?.reshape([2, 3])?], 1)?;
    assert_eq!(d.shape(), &[2, 6]);
    assert_eq!(vals(&d.i(1)?), vec![3., 4., 5., 4., 2., 5.]);
    let t = a.t()?; // non-contiguous input
    assert_eq!(
        vals(&Tensor::cat(&[&t, &t], -1)?.i(0)?),
        vec![0., 3., 0., 3.]
    );
    assert_eq!(
        Tensor::cat(&[&a, &a.to_dtype(DType::F64)?], 0)?.dtype(),
        DType::F64
    );
    assert!(Tensor::cat(&[&a, &b.reshape([3, 1])?], 0).is_err());
    assert!(Tensor::cat(&[], 0).is_err());
    let s = Tensor::stack(&[&a, &a], 1)?;
    assert_eq!(s.shape(), &[2, 2, 3]);
    assert_eq!(vals(&s.i((1, 1))?), vec![3., 4., 5.]);
    assert!(Tensor::stack(&[&a, &b], 0).is_err());
    let x = Tensor::arange(0i64, 10, dev)?;
    let parts = x.split(4, 0)?;
    assert_eq!(
        parts.iter().map(|p| p.numel()).collect::<Vec<_>>(),
        vec![4, 4, 2]
    );
    assert_eq!(parts[2].to_vec1::<i64>()?, vec![8, 9]);
    let ws = x.split_with_sizes(&[1, 9], 0)?;
    assert_eq!(ws[1].to_vec1::<i64>()?[0], 1);
    assert!(x.split_with_sizes(&[1, 2], 0).is_err());
    let ch = x.chunk(3, 0)?;
    assert_eq!(
        ch.iter().map(|p| p.numel()).collect::<Vec<_>>(),
        vec![4, 4, 2]
    );
    assert_eq!(
        Tensor::arange(0i64, 6, dev)?.chunk(4, 0)?.len(),
        3,
        "torch.chunk may return fewer"
    );
    assert!(x.chunk(0, 0).is_err());
    Ok(())
}

fn index_ops(dev: &Device) -> Result<()> {
    let a = Tensor::arange(0f32, 12., dev)?.reshape([3, 4])?;
    // negative indices are refused, as in PyTorch ("index out of range in self")
    assert!(synced(a.index_select(0, &Tensor::new([2i64, 0, -1], dev)?)).is_err());
    let idx = Tensor::new([2i64, 0, 2], dev)?;
    let r = a.index_select(0, &idx)?;
    assert_eq!(r.shape(), &[3, 4]);
    assert_eq!(vals(&r.i(0)?), vec![8., 9., 10., 11.]);
    assert_eq!(vals(&r.i(2)?), vec![8., 9., 10., 11.]);
    let c = a.index_select(1, &Tensor::new([3i64, 3], dev)?)?;
    assert_eq!(vals(&c), vec![3., 3., 7., 7., 11., 11.]);
    assert_eq!(
        a.t()?.index_select(1, &Tensor::new([1i64], dev)?)?.shape(),
        &[4, 1]
    );
    assert!(synced(a.index_select(0, &Tensor::new([3i64], dev)?)).is_err());
    assert!(a.index_select(0, &Tensor::new([0f32], dev)?).is_err());
    let g = a.gather(1, &Tensor::new([[0i64, 0], [1, 0], [3, 2]], dev)?)?;
    assert_eq!(vals(&g), vec![0., 0., 5., 4., 11., 10.]);
    let g0 = a.gather(0, &Tensor::new([[2i64, 1, 0, 0]], dev)?)?;
    assert_eq!(vals(&g0), vec![8., 5., 2., 3.]);
    assert!(synced(a.gather(1, &Tensor::new([[4i64]], dev)?)).is_err());
    assert!(
        a.gather(1, &Tensor::new([0i64], dev)?).is_err(),
        "index rank must match"
    );
    let z = Tensor::zeros([2, 3], DType::F32, dev)?;
    let src = Tensor::ones([2, 3], DType::F32, dev)?;
    let sa = z.scatter_add(1, &Tensor::new([[0i64, 0, 2], [1, 1, 1]], dev)?, &src)?;
    assert_eq!(vals(&sa), vec![2., 0., 1., 0., 3., 0.]);
    assert_eq!(vals(&z), vec![0.; 6], "out of place");
    let sa0 = z.scatter_add(0, &Tensor::new([[1i64, 0, 1]], dev)?, &src)?;
    assert_eq!(vals(&sa0), vec![0., 1., 0., 1., 0., 1.]);
    let oh = Tensor::new([0i64, 2, 1], dev)?.one_hot(3)?;
    assert_eq!(
        (oh.dtype(), oh.to_vec2::<i64>()?),
        (
            DType::I64,
            vec![vec![1, 0, 0], vec![0, 0, 1], vec![0, 1, 0]]
        )
    );
    assert!(synced(Tensor::new([3i64], dev)?.one_hot(3)).is_err());
    assert!(Tensor::new([0f32], dev)?.one_hot(3).is_err());
    Ok(())
}

device_test!(
    reshape_view_flatten,
    squeeze_unsqueeze_transpose_permute,
    narrow_slice_select_index,
    expand_and_contiguous,
    cat_stack_split_chunk,
    index_ops,
    empty_views_past_their_storage,
    circular_pad_wraps_what_the_crop_leaves,
);

/// An empty view whose offset lies past the end of its (empty) storage, as
/// `zeros([2, 0, 3]).narrow(0, 1, 1)` (PyTorch: storage offset 3, storage size 0):
/// every op and every move between devices gives an empty `[1, 0, 3]`, no panic.
fn empty_views_past_their_storage(dev: &Device) -> Result<()> {
    let make = |on: &Device| Tensor::zeros([2, 0, 3], DType::F32, on)?.narrow(0, 1, 1);
    for v in [make(dev)?, make(&Device::Cpu)?] {
        for moved in [
            v.to_device(dev)?,
            v.to_device(&Device::Cpu)?,
            v.contiguous()?,
            v.exp()?,
            v.add(&v)?,
            v.to_dtype(DType::F16)?,
            v.transpose(0, 2)?.contiguous()?.transpose(0, 2)?,
            v.roll(&[1], &[2])?,
        ] {
            assert_eq!(moved.shape(), [1, 0, 3]);
            assert!(moved.to_vec::<f32>().unwrap_or_default().is_empty());
        }
        assert_eq!(v.sum(2, false)?.shape(), [1, 0]);
        assert_eq!(v.to_vec::<f32>()?, Vec::<f32>::new());
    }
    Ok(())
}

/// Circular padding with negative pads wraps around what the crop leaves, as
/// PyTorch does (`F.pad(arange(6), (-3, 2), mode="circular")` is `[3, 4, 5, 3,
/// 4]`). Where a pad is longer than what is left, PyTorch reads memory it never
/// wrote (`(-6, 1)` and `(-7, 2)` give arbitrary values; `(6, -1)` gives `[?, 0,
/// 1, 2, 3, 4, 0, 1, 2, 3, 4]` with `?` arbitrary) or fails in another op (`(2,
/// -7)`); ember refuses those, naming the padding.
fn circular_pad_wraps_what_the_crop_leaves(dev: &Device) -> Result<()> {
    use ember::PadMode;
    let x = Tensor::arange(0f32, 6.0, dev)?.reshape([1, 1, 6])?;
    let got = x.pad(&[-3, 2], PadMode::Circular)?;
    assert_eq!(got.to_vec::<f32>()?, [3.0, 4.0, 5.0, 3.0, 4.0]);
    let got = x.pad(&[2, -1], PadMode::Circular)?;
    assert_eq!(got.to_vec::<f32>()?, [3.0, 4.0, 0.0, 1.0, 2.0, 3.0, 4.0]);
    for pads in [[-6, 1], [-7, 2], [6, -1], [2, -7], [5, -2]] {
        match x.pad(&pads, PadMode::Circular) {
            Err(Error::InvalidArgument { msg, .. }) => {
                assert!(
                    msg.contains(&format!("padding ({}, {})", pads[0], pads[1])),
                    "{msg}"
                )
            }
            other => panic!("{pads:?}: {other:?}"),
        }
    }
    Ok(())
}

/// `copy_` takes a source on another device, as PyTorch's does: a CPU batch
/// into a GPU tensor (broadcast and converted), a GPU result into a CPU buffer,
/// into a view; the gradient reaches the source on its own device; a shape
/// that does not broadcast is refused before anything is written; nothing is
/// copied into a meta tensor, and nothing can be copied out of one.
fn copy_takes_a_source_on_another_device(dev: &Device) -> Result<()> {
    let cpu = Device::Cpu;
    let dst = Tensor::zeros([2, 3], DType::F32, dev)?;
    dst.copy_(&Tensor::new([1i64, 2, 3], &cpu)?)?;
    assert_eq!(dst.device(), *dev);
    assert_eq!(vals(&dst), [1., 2., 3., 1., 2., 3.]);
    let back = Tensor::zeros([2, 3], DType::F64, &cpu)?;
    back.copy_(&dst.mul(2.0)?)?;
    assert_eq!(vals(&back), [2., 4., 6., 2., 4., 6.]);
    // converted where it is smaller, the same values
    let half = Tensor::zeros([3], DType::F16, dev)?;
    half.copy_(&Tensor::new([0.1f64, 1e5, -2.5], &cpu)?)?;
    let want = Tensor::new([0.1f64, 1e5, -2.5], &cpu)?.to_dtype(DType::F16)?;
    assert_eq!(vals(&half), vals(&want));
    dst.narrow(1, 0, 1)?
        .copy_(&Tensor::new([[7f32], [8.]], &cpu)?)?;
    assert_eq!(vals(&dst), [7., 2., 3., 8., 2., 3.]);
    assert!(dst.copy_(&Tensor::zeros([4], DType::F32, &cpu)?).is_err());
    assert_eq!(vals(&dst), [7., 2., 3., 8., 2., 3.]);
    // the gradient goes back to the source's device
    let src = Tensor::new([1f32, 2., 3.], &cpu)?.requires_grad_(true)?;
    let y = Tensor::zeros([2, 3], DType::F32, dev)?;
    y.copy_(&src)?;
    y.square()?.sum_all()?.backward()?;
    let g = src.grad().expect("the source's gradient");
    assert_eq!((g.device(), vals(&g)), (cpu, vec![4., 8., 12.]));
    // a leaf that requires grad is refused, as on one device
    let leaf = Tensor::zeros([3], DType::F32, dev)?.requires_grad_(true)?;
    let e = leaf
        .copy_(&Tensor::ones([3], DType::F32, &cpu)?)
        .unwrap_err();
    assert!(e.to_string().contains("leaf Variable"), "{e}");
    // meta: PyTorch copies nothing into it and refuses to copy out of it
    let meta = Tensor::zeros([3], DType::F32, &Device::Meta)?;
    meta.copy_(&Tensor::ones([3], DType::F32, &cpu)?)?;
    let e = Tensor::zeros([3], DType::F32, &cpu)?
        .copy_(&meta)
        .unwrap_err();
    assert!(matches!(e, Error::MetaNoData { op: "copy_", .. }), "{e}");
    Ok(())
}

device_test!(copy_takes_a_source_on_another_device);

/// The in-place fills write through views into their base, as PyTorch's do (an
/// expanded view is filled, a narrowed or transposed one writes its elements),
/// read a value that is an element of the tensor itself before writing, and
/// refuse what PyTorch refuses without writing anything.
fn fills_write_through_views(dev: &Device) -> Result<()> {
    let base = Tensor::zeros([1, 3], DType::F32, dev)?;
    base.expand([4, 3])?.fill_(2.5)?;
    assert_eq!(vals(&base), [2.5; 3]);
    base.expand([2, 4, 3])?.zero_()?;
    assert_eq!(vals(&base), [0.0; 3]);
    let x = Tensor::arange(0f32, 6f32, dev)?.reshape([2, 3])?;
    x.narrow(1, 1, 2)?.fill_(-1.0)?;
    assert_eq!(vals(&x), [0., -1., -1., 3., -1., -1.]);
    x.select(1, 0)?
        .masked_fill_(&Tensor::new([true, false], dev)?, 9.0)?;
    assert_eq!(vals(&x), [9., -1., -1., 3., -1., -1.]);
    x.transpose(0, 1)?.clamp_(Some(0.0), Some(5.0))?;
    assert_eq!(vals(&x), [5., 0., 0., 3., 0., 0.]);
    // a value that is an element of the tensor itself
    let y = Tensor::arange(0f32, 3f32, dev)?;
    y.fill_(&y.select(0, 2)?)?;
    assert_eq!(vals(&y), [2.0; 3]);
    let y = Tensor::arange(0f32, 3f32, dev)?;
    y.masked_fill_(&Tensor::new([true, false, false], dev)?, &y.select(0, 2)?)?;
    assert_eq!(vals(&y), [2., 1., 2.]);
    // refused, and nothing written
    let z = Tensor::ones([3], DType::F32, dev)?;
    let wide = Tensor::new([[true, false, true], [false, false, true]], dev)?;
    assert!(matches!(
        z.masked_fill_(&wide, 0.0),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(z.fill_(&Tensor::zeros([1], DType::F32, dev)?).is_err());
    assert!(z
        .clamp_tensor_(Some(&wide.to_dtype(DType::F32)?), None)
        .is_err());
    let ints = Tensor::new([1i64, 5, 9], dev)?;
    assert!(ints.clamp_(Some(2.5), None).is_err());
    // a value on another device that is not a CPU scalar
    let elsewhere = Tensor::scalar(0f32, &Device::Meta)?;
    let mask = Tensor::new([true, false, true], dev)?;
    assert!(matches!(
        z.masked_fill(&mask, &elsewhere),
        Err(Error::DeviceMismatch { .. })
    ));
    assert_eq!((vals(&z), vals(&ints)), (vec![1.0; 3], vec![1., 5., 9.]));
    // a leaf that requires grad: refused (its values kept), written under no_grad
    let w = Tensor::ones([3], DType::F32, dev)?.requires_grad_(true)?;
    for r in [w.fill_(0.0), w.zero_(), w.clamp_(Some(2.0), None)] {
        assert!(r.unwrap_err().to_string().contains("leaf Variable"));
    }
    assert_eq!(vals(&w), [1.0; 3]);
    ember::no_grad(|| w.zero_())?;
    assert_eq!(vals(&w), [0.0; 3]);
    // a tensor a recorded op reads, overwritten: backward refuses, as PyTorch's
    let a = Tensor::ones([3], DType::F32, dev)?.requires_grad_(true)?;
    let h = a.mul(2.0)?;
    let sq = h.square()?;
    h.fill_(0.0)?;
    let e = sq.sum_all()?.backward().unwrap_err();
    assert!(
        e.to_string().contains("modified by an inplace operation"),
        "{e}"
    );
    Ok(())
}

device_test!(fills_write_through_views);

/// An inclusive range ending at `-1` reaches the last element (it read as
/// `..0`: nothing), and a reshape of an empty tensor whose other sizes multiply
/// past an address is an error (it overflowed computing strides).
fn inclusive_ranges_and_huge_empty_shapes(dev: &Device) -> Result<()> {
    let t = Tensor::arange(0f32, 5f32, dev)?;
    // (an end computed at run time: clippy refuses a literal `1..=-1`)
    let last = -1i64;
    assert_eq!(vals(&t.i(1..=last)?), [1., 2., 3., 4.]);
    assert_eq!(vals(&t.i(..=last)?), [0., 1., 2., 3., 4.]);
    assert_eq!(vals(&t.i(-3..=-2i64)?), [2., 3.]);
    assert_eq!(vals(&t.i(1..=3usize)?), [1., 2., 3.]);
    let empty = Tensor::zeros([0usize], DType::F32, dev)?;
    let e = empty.reshape([0usize, 1 << 32, 1 << 32]).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    assert_eq!(
        empty.reshape([0usize, 1 << 20, 1 << 20])?.shape(),
        [0, 1 << 20, 1 << 20]
    );
    Ok(())
}

device_test!(inclusive_ranges_and_huge_empty_shapes);
