//! `ember::data`: datasets, the data loader, train/test splits, CSV and IDX readers
//! and the bundled data sets.

use super::{assert_close, vals};
use ember::data::{self, Column, DataLoader, Dataset, Subset, TensorDataset};
use ember::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A unique temporary path for this test process.
fn tmp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("ember-data-test-{}-{name}", std::process::id()))
}

/// `n` samples: input row `i` is `[2i, 2i + 1]` (f32), target `i` (i64).
fn numbered(n: usize) -> Result<TensorDataset> {
    let dev = Device::Cpu;
    let x = Tensor::arange(0f32, 2. * n as f32, &dev)?.reshape([n, 2])?;
    let y = Tensor::arange(0i64, n as i64, &dev)?;
    TensorDataset::new(x, y)
}

/// Every batch of one pass, as (input values, target values), checking that each
/// input row matches its target.
fn collect(
    batches: impl Iterator<Item = Result<(Tensor, Tensor)>>,
) -> Result<Vec<(Vec<f64>, Vec<i64>)>> {
    batches
        .map(|b| {
            let (x, y) = b?;
            let (xv, yv) = (vals(&x), y.to_vec1::<i64>()?);
            assert_eq!(x.shape(), &[yv.len(), 2]);
            for (r, &t) in yv.iter().enumerate() {
                assert_eq!(&xv[2 * r..2 * r + 2], &[2. * t as f64, 2. * t as f64 + 1.]);
            }
            Ok((xv, yv))
        })
        .collect()
}

/// The targets of one pass, in order.
fn targets(batches: impl Iterator<Item = Result<(Tensor, Tensor)>>) -> Result<Vec<i64>> {
    Ok(collect(batches)?.into_iter().flat_map(|(_, y)| y).collect())
}

// ---------------------------------------------------------------------------------
// DataLoader

#[test]
fn loader_batch_sizes() -> Result<()> {
    // (a loader draws its dataset's base seed from the global stream)
    let _g = super::rng_lock();
    let sizes = |l: &DataLoader| -> Result<Vec<usize>> {
        Ok(collect(l.iter())?.iter().map(|(_, y)| y.len()).collect())
    };
    let l = DataLoader::new(numbered(10)?, 4)?;
    assert_eq!((l.len(), l.num_samples(), l.batch_size()), (3, 10, 4));
    assert_eq!(sizes(&l)?, vec![4, 4, 2]);
    // without shuffling the samples come in order
    assert_eq!(targets(l.iter())?, (0..10).collect::<Vec<_>>());
    let first = l.iter().next().unwrap()?;
    assert_eq!(vals(&first.0), vec![0., 1., 2., 3., 4., 5., 6., 7.]);
    assert_eq!(l.iter().len(), 3, "an exact-size iterator");

    let l = DataLoader::new(numbered(10)?, 4)?.drop_last(true);
    assert_eq!(l.len(), 2);
    assert_eq!(sizes(&l)?, vec![4, 4]);
    assert_eq!(targets(l.iter())?, (0..8).collect::<Vec<_>>());

    let l = DataLoader::new(numbered(10)?, 5)?.drop_last(true);
    assert_eq!((l.len(), sizes(&l)?), (2, vec![5, 5]));
    let l = DataLoader::new(numbered(10)?, 32)?;
    assert_eq!((l.len(), sizes(&l)?), (1, vec![10]));
    let l = DataLoader::new(numbered(10)?, 32)?.drop_last(true);
    assert_eq!((l.len(), l.is_empty()), (0, true));
    assert_eq!(l.iter().count(), 0);
    let l = DataLoader::new(numbered(10)?, 1)?;
    assert_eq!(sizes(&l)?, vec![1; 10]);

    let e = DataLoader::new(numbered(10)?, 0).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    assert!(e.to_string().contains("batch_size"), "{e}");
    Ok(())
}

#[test]
fn loader_shuffle_per_epoch() -> Result<()> {
    // (a loader draws its dataset's base seed from the global stream)
    let _g = super::rng_lock();
    let n = 23;
    let l = DataLoader::new(numbered(n)?, 5)?.shuffle(7);
    assert_eq!(l.next_epoch(), 0);
    let epochs: Vec<Vec<i64>> = (0..3).map(|_| targets(l.iter())).collect::<Result<_>>()?;
    assert_eq!(l.next_epoch(), 3, "each iter() is one epoch");
    let all: Vec<i64> = (0..n as i64).collect();
    for e in &epochs {
        let mut s = e.clone();
        s.sort();
        assert_eq!(s, all, "every sample exactly once per epoch");
    }
    assert_ne!(epochs[0], all, "shuffled");
    assert_ne!(epochs[0], epochs[1], "a new order each epoch");
    assert_ne!(epochs[1], epochs[2]);
    for (e, t) in epochs.iter().enumerate() {
        let order: Vec<i64> = l.sample_order(e as u64).iter().map(|&i| i as i64).collect();
        assert_eq!(&order, t);
    }

    // the same seed gives the same batches, epoch by epoch
    let same = DataLoader::new(numbered(n)?, 5)?.shuffle(7);
    for e in &epochs {
        assert_eq!(&targets(same.iter())?, e);
    }
    let other = DataLoader::new(numbered(n)?, 5)?.shuffle(8);
    assert_ne!(
        targets(other.iter())?,
        epochs[0],
        "another seed, another order"
    );

    // resuming at an epoch reproduces it; epoch(e) leaves the counter alone
    l.set_epoch(1);
    assert_eq!(targets(l.iter())?, epochs[1]);
    assert_eq!(targets(l.iter())?, epochs[2]);
    assert_eq!(targets(l.epoch(0))?, epochs[0]);
    assert_eq!(l.next_epoch(), 3);
    let c = l.clone();
    assert_eq!(c.next_epoch(), 3);
    c.set_epoch(0);
    assert_eq!(targets((&c).into_iter())?, epochs[0]);

    // `for batch in &loader` runs the next epoch
    l.set_epoch(2);
    let mut seen = Vec::new();
    for batch in &l {
        seen.extend(batch?.1.to_vec1::<i64>()?);
    }
    assert_eq!(seen, epochs[2]);

    // drop_last with shuffling drops different samples each epoch but never repeats
    let l = DataLoader::new(numbered(n)?, 5)?.shuffle(7).drop_last(true);
    let t = targets(l.iter())?;
    assert_eq!(t, epochs[0][..20].to_vec());
    Ok(())
}

#[test]
fn loader_prefetch_matches_inline() -> Result<()> {
    // (a loader draws its dataset's base seed from the global stream)
    let _g = super::rng_lock();
    let make = |p: usize| -> Result<DataLoader> {
        Ok(DataLoader::new(numbered(37)?, 6)?.shuffle(3).prefetch(p))
    };
    let inline = make(0)?;
    let want: Vec<_> = (0..3)
        .map(|e| collect(inline.epoch(e)))
        .collect::<Result<_>>()?;
    assert_eq!(want[0].len(), 7);
    for p in [1, 2, 5, 100] {
        let l = make(p)?;
        for (e, w) in want.iter().enumerate() {
            assert_eq!(&collect(l.iter())?, w, "prefetch {p}, epoch {e}");
        }
    }
    // and through a Subset, with the default stacking of `get`
    let sub = Subset::new(numbered(37)?, (0..37).rev().collect())?;
    let a = collect(DataLoader::new(sub.clone(), 4)?.prefetch(0).iter())?;
    let b = collect(DataLoader::new(sub, 4)?.prefetch(3).iter())?;
    assert_eq!(a, b);
    assert_eq!(a[0].1, vec![36, 35, 34, 33]);
    Ok(())
}

/// A dataset that counts its batches and takes a while for each.
struct Slow {
    n: usize,
    batches: Arc<AtomicUsize>,
}

impl Dataset for Slow {
    fn len(&self) -> usize {
        self.n
    }
    fn get(&self, index: usize) -> Result<(Tensor, Tensor)> {
        Ok((
            Tensor::new([index as f32], &Device::Cpu)?,
            Tensor::new(index as i64, &Device::Cpu)?,
        ))
    }
    fn get_batch(&self, indices: &[usize]) -> Result<(Tensor, Tensor)> {
        self.batches.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(5));
        let xs: Vec<f32> = indices.iter().map(|&i| i as f32).collect();
        let ys: Vec<i64> = indices.iter().map(|&i| i as i64).collect();
        Ok((
            Tensor::from_vec(xs, [indices.len(), 1], &Device::Cpu)?,
            Tensor::from_vec(ys, [indices.len()], &Device::Cpu)?,
        ))
    }
}

#[test]
fn loader_early_drop_stops_the_worker() -> Result<()> {
    // (a loader draws its dataset's base seed from the global stream)
    let _g = super::rng_lock();
    let count = Arc::new(AtomicUsize::new(0));
    let l = DataLoader::new(
        Slow {
            n: 1000,
            batches: Arc::clone(&count),
        },
        1,
    )?
    .prefetch(2);
    assert_eq!(l.len(), 1000);
    let start = Instant::now();
    {
        let mut it = l.iter();
        for want in 0..3 {
            let (_, y) = it.next().unwrap()?;
            assert_eq!(y.to_vec1::<i64>()?, vec![want]);
        }
    } // dropped here, 997 batches early
    let dropped_after = start.elapsed();
    let made = count.load(Ordering::SeqCst);
    // 3 used, at most 2 waiting and 1 in the making when the consumer left
    assert!((3..=6).contains(&made), "the worker made {made} batches");
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(count.load(Ordering::SeqCst), made, "the worker stopped");
    assert!(
        dropped_after < Duration::from_secs(2),
        "dropping took {dropped_after:?}"
    );
    // an iterator dropped before its first batch, and one never started
    drop(l.iter());
    let mut it = l.iter();
    assert_eq!(it.size_hint(), (1000, Some(1000)));
    it.next().unwrap()?;
    assert_eq!(it.size_hint(), (999, Some(999)));
    drop(it);
    // the loader still works afterwards
    let (_, y) = l.epoch(0).nth(4).unwrap()?;
    assert_eq!(y.to_vec1::<i64>()?, vec![4]);
    Ok(())
}

/// Only `get`: batches come from the default `get_batch`, which stacks.
struct Squares;

impl Dataset for Squares {
    fn len(&self) -> usize {
        5
    }
    fn get(&self, i: usize) -> Result<(Tensor, Tensor)> {
        let v = i as f32;
        Ok((
            Tensor::new([v, v * v], &Device::Cpu)?,
            Tensor::new(i as i64 % 2, &Device::Cpu)?,
        ))
    }
}

#[test]
fn default_get_batch_stacks() -> Result<()> {
    // (a loader draws its dataset's base seed from the global stream)
    let _g = super::rng_lock();
    assert!(!Squares.is_empty());
    let (x, y) = Squares.get_batch(&[3, 1])?;
    assert_eq!((x.shape(), y.shape()), (&[2, 2][..], &[2][..]));
    assert_eq!(vals(&x), vec![3., 9., 1., 1.]);
    assert_eq!(y.to_vec1::<i64>()?, vec![1, 1]);
    assert!(Squares.get_batch(&[]).is_err());
    let l = DataLoader::new(Squares, 2)?;
    let batches: Vec<_> = l.iter().collect::<Result<_>>()?;
    assert_eq!(batches.len(), 3);
    assert_eq!(vals(&batches[2].0), vec![4., 16.]);
    assert_eq!(batches[2].1.to_vec1::<i64>()?, vec![0]);
    Ok(())
}

/// Samples with a random augmentation: input `i` is `i` plus a uniform draw.
struct Jittered;

impl Dataset for Jittered {
    fn len(&self) -> usize {
        6
    }
    fn get(&self, i: usize) -> Result<(Tensor, Tensor)> {
        let x = Tensor::rand([2], &Device::Cpu)?.add(i as f64)?;
        Ok((x, Tensor::new(i as i64, &Device::Cpu)?))
    }
}

/// A random dataset's batches are the same with or without prefetching, while
/// the training thread draws from the global stream between batches, and a
/// resumed epoch repeats them; another epoch, another global seed or another
/// loader draws anew.
#[test]
fn random_samples_repeat_with_or_without_prefetching() -> Result<()> {
    let _g = super::rng_lock();
    let epoch = |seed: u64, prefetch: usize, epoch: u64| -> Result<Vec<Vec<f64>>> {
        ember::manual_seed(seed);
        let l = DataLoader::new(Jittered, 4)?.prefetch(prefetch);
        l.set_epoch(epoch);
        let mut got = Vec::new();
        for b in l.iter() {
            got.push(vals(&b?.0));
            // the training step's own draws (dropout, say)
            Tensor::randn([3], &Device::Cpu)?;
        }
        Ok(got)
    };
    let inline = epoch(7, 0, 0)?;
    assert_eq!(inline.len(), 2);
    assert_eq!(epoch(7, 2, 0)?, inline, "prefetched");
    assert_eq!(epoch(7, 1, 0)?, inline, "prefetched one ahead");
    assert_ne!(epoch(7, 0, 1)?, inline, "the next epoch");
    assert_ne!(epoch(8, 0, 0)?, inline, "another seed");
    // shuffled alike, the global seed still decides the samples' draws, and
    // two loaders made one after the other draw apart (two augmented views)
    type Draws = Vec<Vec<f64>>;
    let shuffled = |global: u64| -> Result<(Draws, Draws)> {
        ember::manual_seed(global);
        let (a, b) = (
            DataLoader::new(Jittered, 6)?.shuffle(3),
            DataLoader::new(Jittered, 6)?.shuffle(3),
        );
        let draws = |l: &DataLoader| -> Result<Vec<Vec<f64>>> {
            l.iter().map(|b| Ok(vals(&b?.0))).collect()
        };
        Ok((draws(&a)?, draws(&b)?))
    };
    let (a, b) = shuffled(1)?;
    assert_ne!(a, b, "two loaders");
    assert_eq!(shuffled(1)?, (a.clone(), b), "the same seed");
    assert_ne!(shuffled(2)?.0, a, "another seed");
    // a loader given a generator draws from it, whatever the global seed
    let with_gen = |global: u64| -> Result<Vec<Vec<f64>>> {
        ember::manual_seed(global);
        let l = DataLoader::new(Jittered, 6)?.generator(&ember::Generator::new(9));
        l.iter().map(|b| Ok(vals(&b?.0))).collect()
    };
    assert_eq!(with_gen(1)?, with_gen(2)?);
    Ok(())
}

/// Batches moved to a device hold the values the same loader makes on the CPU;
/// on a GPU they are uploaded on the copy stream, and used here on the current
/// stream, which must wait for each upload (on the simulator, which runs a
/// stream's work only when something waits for it, a missing wait reads memory
/// not yet written).
fn loader_moves_batches(dev: &Device) -> Result<()> {
    // (a loader draws its dataset's base seed from the global stream)
    let _g = super::rng_lock();
    for prefetch in [0, 2] {
        let l = DataLoader::new(numbered(9)?, 4)?
            .shuffle(1)
            .prefetch(prefetch)
            .device(dev);
        let on_cpu = DataLoader::new(numbered(9)?, 4)?.shuffle(1);
        let mut n = 0;
        for (b, c) in l.iter().zip(on_cpu.iter()) {
            let ((x, y), (cx, cy)) = (b?, c?);
            assert_eq!((x.device(), y.device()), (*dev, *dev));
            // computed on the device, read back
            assert_eq!(
                vals(&x.mul(2.0)?),
                vals(&cx.mul(2.0)?),
                "prefetch {prefetch}"
            );
            assert_eq!(y.add(1)?.to_vec1::<i64>()?, cy.add(1)?.to_vec1::<i64>()?);
            n += y.numel();
        }
        assert_eq!(n, 9);
    }
    Ok(())
}

device_test!(loader_moves_batches);

// ---------------------------------------------------------------------------------
// TensorDataset, Subset

#[test]
fn tensor_dataset() -> Result<()> {
    let ds = numbered(6)?;
    assert_eq!((ds.len(), ds.is_empty()), (6, false));
    assert_eq!(
        (ds.inputs().shape(), ds.targets().shape()),
        (&[6, 2][..], &[6][..])
    );
    let (x, y) = ds.get(4)?;
    assert_eq!((vals(&x), y.item::<i64>()?), (vec![8., 9.], 4));
    let (x, y) = ds.get_batch(&[5, 0, 5])?;
    assert_eq!(vals(&x), vec![10., 11., 0., 1., 10., 11.]);
    assert_eq!(y.to_vec1::<i64>()?, vec![5, 0, 5]);
    let e = ds.get(6).unwrap_err();
    assert!(
        matches!(
            e,
            Error::IndexOutOfRange {
                index: 6,
                size: 6,
                ..
            }
        ),
        "{e}"
    );
    assert!(ds.get_batch(&[1, 6]).is_err());

    // the first dimensions must agree
    let dev = Device::Cpu;
    let e = TensorDataset::new(
        Tensor::zeros([10, 3], DType::F32, &dev)?,
        Tensor::zeros([9], DType::I64, &dev)?,
    )
    .unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("10 samples") && msg.contains("9"), "{msg}");
    assert!(TensorDataset::new(Tensor::scalar(1f32, &dev)?, Tensor::scalar(1i64, &dev)?).is_err());

    // subsets
    let sub = Subset::new(numbered(6)?, vec![4, 2, 2])?;
    assert_eq!((sub.len(), sub.indices()), (3, &[4, 2, 2][..]));
    assert_eq!(sub.dataset().len(), 6);
    assert_eq!(sub.get(0)?.1.item::<i64>()?, 4);
    let (x, y) = sub.get_batch(&[2, 0])?;
    assert_eq!(
        (vals(&x), y.to_vec1::<i64>()?),
        (vec![4., 5., 8., 9.], vec![2, 4])
    );
    assert!(sub.get(3).is_err());
    assert!(Subset::new(numbered(6)?, vec![0, 6]).is_err());
    Ok(())
}

// ---------------------------------------------------------------------------------
// train_test_split

#[test]
fn train_test_split_sizes_and_determinism() -> Result<()> {
    let ds = numbered(10)?;
    let (x, y) = (ds.inputs(), ds.targets());
    let (x_tr, x_te, y_tr, y_te) = data::train_test_split(x, y, 0.25, 42)?;
    // ceil(0.25 * 10) = 3 test samples
    assert_eq!((x_tr.shape(), x_te.shape()), (&[7, 2][..], &[3, 2][..]));
    assert_eq!((y_tr.shape(), y_te.shape()), (&[7][..], &[3][..]));
    let (tr, te) = (y_tr.to_vec1::<i64>()?, y_te.to_vec1::<i64>()?);
    let mut all: Vec<i64> = tr.iter().chain(&te).copied().collect();
    all.sort();
    assert_eq!(all, (0..10).collect::<Vec<_>>(), "disjoint and complete");
    assert_ne!(tr, (0..7).collect::<Vec<_>>(), "shuffled");
    // rows stay with their targets
    let want: Vec<f64> = te
        .iter()
        .flat_map(|&t| [2. * t as f64, 2. * t as f64 + 1.])
        .collect();
    assert_close(&vals(&x_te), &want, 0., 0.);
    let want: Vec<f64> = tr
        .iter()
        .flat_map(|&t| [2. * t as f64, 2. * t as f64 + 1.])
        .collect();
    assert_close(&vals(&x_tr), &want, 0., 0.);

    // the same seed, the same split; another seed, another split
    let again = data::train_test_split(x, y, 0.25, 42)?;
    assert_eq!((vals(&again.2), vals(&again.3)), (vals(&y_tr), vals(&y_te)));
    let other = data::train_test_split(x, y, 0.25, 43)?;
    assert_ne!(vals(&other.3), vals(&y_te));

    // 0.2 of 150 is exactly 30
    let ds = numbered(150)?;
    let s = data::train_test_split(ds.inputs(), ds.targets(), 0.2, 0)?;
    assert_eq!((s.0.shape()[0], s.1.shape()[0]), (120, 30));

    for bad in [0.0, 1.0, -0.1, 1.5, f64::NAN] {
        let e = data::train_test_split(x, y, bad, 0).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{bad}: {e}");
    }
    // 2 samples with test_size 0.9: ceil(1.8) = 2 leaves no training sample
    let two = numbered(2)?;
    let e = data::train_test_split(two.inputs(), two.targets(), 0.9, 0).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    assert!(data::train_test_split(two.inputs(), two.targets(), 0.5, 0).is_ok());
    let e = data::train_test_split(x, &y.narrow(0, 0, 9)?, 0.5, 0).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
    Ok(())
}

// ---------------------------------------------------------------------------------
// CSV

#[test]
fn csv_good_file() -> Result<()> {
    let path = tmp("good.csv");
    std::fs::write(
        &path,
        "\u{feff}x, y ,species,label\n1.5,2,setosa,0\n\n-3,4e1, virginica ,2\n0.25,6,setosa,1\n",
    )
    .unwrap();
    let t = data::read_csv(&path)?;
    std::fs::remove_file(&path).ok();
    assert_eq!(t.headers(), &["x", "y", "species", "label"]);
    assert_eq!((t.num_rows(), t.num_columns()), (3, 4));
    assert_eq!(t.column("x")?, &Column::Numeric(vec![1.5, -3., 0.25]));
    assert!(t.column("y")?.is_numeric());
    assert_eq!(
        t.column("species")?.as_text().unwrap(),
        &["setosa", "virginica", "setosa"]
    );
    let e = t.column("z").unwrap_err().to_string();
    assert!(e.contains("\"z\"") && e.contains("\"species\""), "{e}");

    let m = t.to_tensor(&["y", "x"], DType::F32)?;
    assert_eq!((m.shape(), m.dtype()), (&[3, 2][..], DType::F32));
    assert_eq!(vals(&m), vec![2., 1.5, 40., -3., 6., 0.25]);
    assert_eq!(t.to_tensor(&["x"], DType::F64)?.dtype(), DType::F64);
    let l = t.labels("label")?;
    assert_eq!(
        (l.dtype(), l.to_vec1::<i64>()?),
        (DType::I64, vec![0, 2, 1])
    );
    let (codes, classes) = t.encode_labels("species")?;
    assert_eq!(classes, vec!["setosa", "virginica"]);
    assert_eq!(codes.to_vec1::<i64>()?, vec![0, 1, 0]);
    let (codes, classes) = t.encode_labels("y")?;
    assert_eq!(
        (codes.to_vec1::<i64>()?, classes),
        (vec![0, 2, 1], vec!["2".into(), "6".into(), "40".into()])
    );

    // a label that is not an integer, on the file's line 2
    let e = t.labels("x").unwrap_err().to_string();
    assert!(e.contains("good.csv:2:") && e.contains("1.5"), "{e}");
    let e = t.labels("species").unwrap_err().to_string();
    assert!(e.contains("encode_labels"), "{e}");
    assert!(t.to_tensor(&[], DType::F32).is_err());
    Ok(())
}

#[test]
fn csv_errors_name_file_and_line() -> Result<()> {
    // a ragged row, written to a real file
    let path = tmp("ragged.csv");
    std::fs::write(&path, "a,b,c\n1,2,3\n4,5\n7,8,9\n").unwrap();
    let e = data::read_csv(&path).unwrap_err();
    std::fs::remove_file(&path).ok();
    assert!(matches!(e, Error::Parse { line: Some(3), .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("ragged.csv:3:"), "{msg}");
    assert!(
        msg.contains("expected 3 fields") && msg.contains("found 2"),
        "{msg}"
    );

    // a text cell in a column asked for as numbers
    let t = data::parse_csv("x,y\n1,2\n3,abc\n5,6\n".as_bytes(), "t.csv")?;
    assert!(!t.column("y")?.is_numeric());
    let e = t
        .to_tensor(&["x", "y"], DType::F32)
        .unwrap_err()
        .to_string();
    assert_eq!(e, "t.csv:3: column \"y\": cannot parse \"abc\" as a number");
    // line numbers count blank lines and quoted line breaks
    let t = data::parse_csv("x,y\n1,\"2\"\n\n\"a\nb\",3\n".as_bytes(), "t.csv")?;
    let e = t.to_tensor(&["x"], DType::F32).unwrap_err().to_string();
    assert_eq!(
        e,
        "t.csv:4: column \"x\": cannot parse \"a\\nb\" as a number"
    );
    let t = data::parse_csv("a,b\r\n1,2\r\n\r\n3,x\r\n".as_bytes(), "crlf.csv")?;
    let e = t.to_tensor(&["b"], DType::F32).unwrap_err().to_string();
    assert_eq!(
        e,
        "crlf.csv:4: column \"b\": cannot parse \"x\" as a number"
    );
    let e = data::parse_csv(&b"a,b\n1,2\n\n3,\xff\n"[..], "bin.csv")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("bin.csv:4:") && e.contains("UTF-8"), "{e}");

    // empty input, and input with blank lines only
    for text in ["", "\n\n"] {
        let e = data::parse_csv(text.as_bytes(), "empty.csv").unwrap_err();
        assert!(matches!(e, Error::Parse { .. }), "{e}");
        assert!(
            e.to_string().starts_with("empty.csv: the file is empty"),
            "{e}"
        );
    }
    // an empty cell
    let e = data::parse_csv("a,b\n1,2\n3,\n".as_bytes(), "cells.csv")
        .unwrap_err()
        .to_string();
    assert_eq!(e, "cells.csv:3: column \"b\": empty cell");
    // no header: the first row is numbers
    let e = data::parse_csv("1,2\n3,4\n".as_bytes(), "nohead.csv")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("nohead.csv:1: missing header"), "{e}");
    // a header with an empty or repeated name
    let e = data::parse_csv("a,,c\n1,2,3\n".as_bytes(), "h.csv")
        .unwrap_err()
        .to_string();
    assert!(e.contains("h.csv:1:") && e.contains("column 2"), "{e}");
    let e = data::parse_csv("a,b,a\n1,2,3\n".as_bytes(), "h.csv")
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"a\" twice"), "{e}");
    // a file that is not there
    let e = data::read_csv(tmp("missing.csv")).unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e}");
    // only a header: no rows
    let t = data::parse_csv("a,b\n".as_bytes(), "h.csv")?;
    assert_eq!(t.num_rows(), 0);
    assert_eq!(t.to_tensor(&["a", "b"], DType::F32)?.shape(), &[0, 2]);
    Ok(())
}

// ---------------------------------------------------------------------------------
// IDX

#[test]
fn idx_round_trip_raw_and_gzipped() -> Result<()> {
    let dev = Device::Cpu;
    let u8s = Tensor::from_vec((0..24u8).map(|i| i * 10).collect(), [2, 3, 4], &dev)?;
    let f32s = Tensor::new([[1.5f32, -2.25], [3e-8, 1e30], [0., -0.5]], &dev)?;
    let f64s = Tensor::new([std::f64::consts::PI, -1e-300, 7.], &dev)?;
    let i64s = Tensor::new([[-2147483648i64, 2147483647], [0, -1]], &dev)?;
    for (i, t) in [&u8s, &f32s, &f64s, &i64s].into_iter().enumerate() {
        for ext in ["idx", "idx.gz"] {
            let p = tmp(&format!("rt{i}.{ext}"));
            data::write_idx(&p, t)?;
            let bytes = std::fs::read(&p).unwrap();
            assert_eq!(
                bytes.starts_with(&[0x1f, 0x8b]),
                ext.ends_with("gz"),
                "{ext}"
            );
            let back = data::read_idx(&p)?;
            std::fs::remove_file(&p).ok();
            assert_eq!(
                (back.dtype(), back.shape(), vals(&back)),
                (t.dtype(), t.shape(), vals(t)),
                "{ext}"
            );
        }
    }
    // the bytes of the format, checked by hand
    let b = data::encode_idx(&u8s)?;
    assert_eq!(
        &b[..16],
        &[0, 0, 0x08, 3, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4]
    );
    assert_eq!(&b[16..19], &[0, 10, 20]);
    assert_eq!(b.len(), 16 + 24);
    let b = data::encode_idx(&f32s)?;
    assert_eq!(&b[..4], &[0, 0, 0x0D, 2]);
    assert_eq!(&b[12..16], &1.5f32.to_be_bytes());
    // i8 and i16 files read as int64, negative values included
    let t = data::parse_idx(&[0, 0, 0x09, 1, 0, 0, 0, 3, 0xff, 0x7f, 0x80], "i8")?;
    assert_eq!(
        (t.dtype(), t.to_vec1::<i64>()?),
        (DType::I64, vec![-1, 127, -128])
    );
    let t = data::parse_idx(&[0, 0, 0x0B, 1, 0, 0, 0, 2, 0x80, 0x00, 0x01, 0x02], "i16")?;
    assert_eq!(t.to_vec1::<i64>()?, vec![-32768, 258]);
    // dtypes the format cannot hold, and values that do not fit
    assert!(data::encode_idx(&f32s.to_dtype(DType::F16)?).is_err());
    assert!(data::encode_idx(&Tensor::new([1i64 << 40], &dev)?).is_err());
    Ok(())
}

#[test]
fn idx_malformed_files_are_errors() -> Result<()> {
    let good = data::encode_idx(&Tensor::new([[1u8, 2, 3], [4, 5, 6]], &Device::Cpu)?)?;
    let msg = |bytes: &[u8]| -> String {
        let e = data::parse_idx(bytes, "bad.idx").unwrap_err();
        assert!(matches!(e, Error::Parse { .. }), "{e}");
        e.to_string()
    };
    let mut b = good.clone();
    b[0] = 0x50;
    let e = msg(&b);
    assert!(
        e.starts_with("bad.idx: not an IDX file") && e.contains("0x50"),
        "{e}"
    );
    let mut b = good.clone();
    b[2] = 0x07;
    let e = msg(&b);
    assert!(e.contains("unknown IDX data type 0x07"), "{e}");
    let e = msg(&good[..3]);
    assert!(e.contains("truncated IDX header"), "{e}");
    let e = msg(&good[..9]);
    assert!(
        e.contains("truncated IDX header") && e.contains("12"),
        "{e}"
    );
    let e = msg(&good[..good.len() - 2]);
    assert!(
        e.contains("truncated IDX data") && e.contains("needs 6 bytes") && e.contains("found 4"),
        "{e}"
    );
    let mut b = good.clone();
    b.extend([9, 9, 9]);
    let e = msg(&b);
    assert!(e.contains("3 trailing bytes"), "{e}");
    // dimensions whose product overflows
    let mut b = vec![0, 0, 0x0E, 3];
    for _ in 0..3 {
        b.extend(u32::MAX.to_be_bytes());
    }
    let e = msg(&b);
    assert!(e.contains("more f64 values than memory can address"), "{e}");
    // a gzip stream that is cut short
    let p = tmp("cut.idx.gz");
    data::write_idx(&p, &Tensor::zeros([50, 50], DType::F32, &Device::Cpu)?)?;
    let gz = std::fs::read(&p).unwrap();
    std::fs::remove_file(&p).ok();
    let e = msg(&gz[..gz.len() / 2]);
    assert!(e.contains("gzip"), "{e}");
    // the whole file, through the path API
    let p = tmp("trailing.idx");
    std::fs::write(&p, [&good[..], &[0u8]].concat()).unwrap();
    let e = data::read_idx(&p).unwrap_err().to_string();
    std::fs::remove_file(&p).ok();
    assert!(
        e.contains("trailing.idx") && e.contains("1 trailing bytes"),
        "{e}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------
// Bundled data sets

#[test]
fn iris() -> Result<()> {
    let path = data::find_data_file("iris.csv")?;
    let (x, y) = data::load_iris(&path)?;
    assert_eq!((x.shape(), x.dtype()), (&[150, 4][..], DType::F32));
    assert_eq!((y.shape(), y.dtype()), (&[150][..], DType::I64));
    assert_close(&vals(&x.i(0)?), &[5.1, 3.5, 1.4, 0.2], 1e-6, 0.);
    assert_close(&vals(&x.i(50)?), &[7.0, 3.2, 4.7, 1.4], 1e-6, 0.);
    assert_close(&vals(&x.i(149)?), &[5.9, 3.0, 5.1, 1.8], 1e-6, 0.);
    let y = y.to_vec1::<i64>()?;
    assert_eq!((y[0], y[50], y[149]), (0, 1, 2));
    for c in 0..3 {
        assert_eq!(y.iter().filter(|&&t| t == c).count(), 50, "class {c}");
    }
    Ok(())
}

#[test]
fn digits() -> Result<()> {
    let (x, y) = data::load_digits(data::find_data_file("digits.csv")?)?;
    assert_eq!((x.shape(), x.dtype()), (&[1797, 64][..], DType::F32));
    assert_eq!(y.shape(), &[1797]);
    assert_eq!(&vals(&x.i(0)?)[..8], &[0., 0., 5., 13., 9., 1., 0., 0.]);
    let px = vals(&x);
    assert_eq!(px.iter().cloned().fold(f64::MAX, f64::min), 0.);
    assert_eq!(px.iter().cloned().fold(f64::MIN, f64::max), 16.);
    let y = y.to_vec1::<i64>()?;
    assert_eq!((y[0], y[1], y[1796]), (0, 1, 8));
    let mut counts = [0usize; 10];
    y.iter().for_each(|&t| counts[t as usize] += 1);
    assert_eq!(counts, [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]);
    Ok(())
}

#[test]
fn missing_data_file() {
    let e = data::find_data_file("no-such-file.csv").unwrap_err();
    assert!(matches!(e, Error::DataNotFound { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("\"no-such-file.csv\" not found"), "{msg}");
    assert!(
        msg.contains("data/no-such-file.csv") && msg.contains("EMBER_DATA"),
        "{msg}"
    );
    // a data file with the wrong columns
    let p = tmp("not-iris.csv");
    std::fs::write(&p, "a,b\n1,2\n").unwrap();
    let e = data::load_iris(&p).unwrap_err().to_string();
    std::fs::remove_file(&p).ok();
    assert!(e.contains("sepal_length"), "{e}");
}

#[test]
fn distributed_samplers_deal_equal_shares_of_the_loaders_order() -> Result<()> {
    // (a loader draws its dataset's base seed from the global stream)
    let _g = super::rng_lock();
    use ember::data::DistributedSampler;
    let (len, world) = (10, 3);
    let shares: Vec<Vec<usize>> = (0..world)
        .map(|r| Ok(DistributedSampler::new(len, world, r)?.seed(7).indices(2)))
        .collect::<Result<_>>()?;
    // padded to 12: four each, the first two samples of the order repeated
    assert!(shares.iter().all(|s| s.len() == 4));
    let loader = DataLoader::new(numbered(len)?, 6)?.shuffle(7);
    let order = loader.sample_order(2);
    for (i, id) in order.iter().chain(&order[..2]).enumerate() {
        assert_eq!(shares[i % world][i / world], *id);
    }
    // another epoch, another order; drop_last drops instead of padding
    let s = DistributedSampler::new(len, world, 0)?.seed(7);
    assert_ne!(s.indices(2), s.indices(3));
    assert_eq!(
        s.clone().drop_last(true).indices(2),
        order.iter().step_by(3).take(3).copied().collect::<Vec<_>>()
    );
    assert!(DistributedSampler::new(len, 2, 2).is_err());
    assert!(DistributedSampler::new(len, 0, 0).is_err());

    // a loader with a sampler yields this rank's samples, per epoch
    let rank1 = DistributedSampler::new(len, world, 1)?.seed(7);
    let l = DataLoader::new(numbered(len)?, 3)?.sampler(rank1.clone())?;
    assert_eq!((l.len(), l.samples_per_epoch()), (2, 4));
    l.set_epoch(2);
    let got = targets(l.iter())?;
    assert_eq!(
        got,
        rank1
            .indices(2)
            .iter()
            .map(|&i| i as i64)
            .collect::<Vec<_>>()
    );
    // a sampler for another length is refused
    assert!(DataLoader::new(numbered(4)?, 3)?
        .sampler(rank1.clone())
        .is_err());
    // a loader that shuffles refuses a sampler, as PyTorch's (whose order would
    // silently replace the shuffle); a shuffle set after a sampler is not the
    // loader's seed
    let Err(e) = DataLoader::new(numbered(len)?, 3)?
        .shuffle(7)
        .sampler(rank1.clone())
    else {
        panic!("shuffle and a sampler are refused");
    };
    let e = e.to_string();
    assert!(e.contains("mutually exclusive with shuffle"), "{e}");
    // a generator beside a sampler (either order) seeds the samples' draws
    // only: the sampler's order is visited, as PyTorch's generator= does
    let want = targets(
        DataLoader::new(numbered(len)?, 3)?
            .sampler(rank1.clone())?
            .iter(),
    )?;
    let g = ember::Generator::new(0);
    let after = DataLoader::new(numbered(len)?, 3)?
        .generator(&g)
        .sampler(rank1.clone())?;
    let before = DataLoader::new(numbered(len)?, 3)?
        .sampler(rank1.clone())?
        .generator(&g);
    assert_eq!(targets(after.iter())?, want);
    assert_eq!(targets(before.iter())?, want);
    // a shuffle asked for, then a generator: still a shuffle, and refused
    assert!(DataLoader::new(numbered(len)?, 3)?
        .shuffle(7)
        .generator(&g)
        .sampler(rank1.clone())
        .is_err());
    let l = DataLoader::new(numbered(len)?, 3)?
        .sampler(rank1)?
        .shuffle(7);
    assert_eq!(l.seed(), None);
    assert_eq!(
        DataLoader::new(numbered(len)?, 3)?.shuffle(7).seed(),
        Some(7)
    );
    Ok(())
}
