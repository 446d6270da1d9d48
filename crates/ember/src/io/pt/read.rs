//! Storages read one at a time, straight into the tensors that view them.

use super::archive::{bad_file, Archive};
use super::*;

impl PtFile {
    /// [`load`](Self::load), refusing (naming the tensor) floating-point values
    /// that are NaN or infinite when `check_finite` is set.
    pub(crate) fn load_checked(
        &self,
        device: &Device,
        check_finite: bool,
    ) -> Result<Vec<(String, Tensor)>> {
        let entries = self.entries_of(true)?;
        for e in &entries {
            if e.dtype.dtype.is_none() {
                return Err(Error::invalid(
                    "load_pt",
                    format!(
                        "{}: tensor {:?} is {}, which ember does not have (its dtypes are \
                         float32, float64, float16, bfloat16, int64, uint8 and bool); convert \
                         it in PyTorch first",
                        self.path.display(),
                        e.name,
                        e.dtype.name
                    ),
                ));
            }
        }
        // storages in order of first use, each read once for all its views
        let mut order: Vec<&str> = Vec::new();
        let mut users: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, e) in entries.iter().enumerate() {
            let u = users.entry(&e.storage).or_insert_with(|| {
                order.push(&e.storage);
                Vec::new()
            });
            if let Some(&first) = u.first() {
                let f: &PtEntry = &entries[first];
                if (f.dtype, f.storage_numel) != (e.dtype, e.storage_numel) {
                    return Err(bad_file(
                        &self.path,
                        format!(
                            "tensors {:?} and {:?} name storage {:?} with different types or sizes",
                            f.name, e.name, e.storage
                        ),
                    ));
                }
            }
            u.push(i);
        }
        let mut archive = self
            .archive
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // every storage is checked in the archive (there, and of the size the
        // pickle claims) before any is read: the copy budget below rests on
        // those sizes
        for key in &order {
            let e = &entries[users[key][0]];
            let nbytes = e
                .storage_numel
                .checked_mul(e.dtype.itemsize)
                .ok_or_else(|| {
                    bad_file(&self.path, format!("storage {:?} is too large", e.storage))
                })?;
            archive.check_storage(key, nbytes as u64, e.dtype.itemsize as u64)?;
        }
        let total = entries
            .iter()
            .fold(0usize, |n, e| n.saturating_add(e.nbytes()));
        let mut seen = HashSet::new();
        let distinct = entries
            .iter()
            .filter(|e| seen.insert(e.storage.as_str()))
            .fold(0usize, |n, e| {
                n.saturating_add(e.storage_numel.saturating_mul(e.dtype.itemsize))
            });
        let allowed = distinct
            .saturating_mul(COPIES_PER_STORAGE_BYTE)
            .saturating_add(MAX_REPEATED_ELEMENTS * 8);
        if total > allowed {
            return Err(Error::invalid(
                "load_pt",
                format!(
                    "{}: its tensors would take {total} bytes, copied from {distinct} bytes of \
                     storages (views of one storage named many times over); ember loads every \
                     tensor as its own copy",
                    self.path.display()
                ),
            ));
        }
        let mut loaded: Vec<Option<Tensor>> = vec![None; entries.len()];
        for key in order {
            let views: Vec<&PtEntry> = users[key].iter().map(|&i| &entries[i]).collect();
            let tensors = read_views(&mut archive, &views, device, check_finite)?;
            for (&i, t) in users[key].iter().zip(tensors) {
                loaded[i] = Some(t);
            }
        }
        Ok(entries
            .into_iter()
            .zip(loaded)
            .map(|(e, t)| (e.name, t.expect("every entry's storage was read")))
            .collect())
    }
}

/// Reads one storage and makes each of its views a tensor on `device`.
fn read_views(
    archive: &mut Archive,
    views: &[&PtEntry],
    device: &Device,
    check_finite: bool,
) -> Result<Vec<Tensor>> {
    let first = views[0];
    let dtype = first.dtype.dtype.expect("checked by the caller");
    macro_rules! typed {
        ($t:ty) => {
            read_typed::<$t>(archive, views, device, check_finite)
        };
    }
    match dtype {
        DType::F32 => typed!(f32),
        DType::F64 => typed!(f64),
        DType::F16 => typed!(half::f16),
        DType::BF16 => typed!(half::bf16),
        DType::I64 => typed!(i64),
        DType::U8 => typed!(u8),
        DType::Bool => {
            let raw: Vec<u8> = read_storage(archive, views[0])?;
            views
                .iter()
                .map(|v| {
                    let vals: Vec<bool> = gather(&raw, v).into_iter().map(|b| b != 0).collect();
                    Tensor::from_vec(vals, v.shape.clone(), device)
                })
                .collect()
        }
    }
}

/// A storage's elements, in the machine's byte order.
fn read_storage<T: bytemuck::Pod>(archive: &mut Archive, e: &PtEntry) -> Result<Vec<T>> {
    let size = std::mem::size_of::<T>();
    debug_assert_eq!(size, e.dtype.itemsize);
    let nbytes = e.storage_numel.checked_mul(size).ok_or_else(|| {
        bad_file(
            &archive.path,
            format!("storage {:?} is too large", e.storage),
        )
    })?;
    archive.check_storage(&e.storage, nbytes as u64, size as u64)?;
    let mut v = vec![T::zeroed(); e.storage_numel];
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut v);
    archive.read_storage(&e.storage, e.storage_numel as u64, bytes)?;
    if archive.little_endian != cfg!(target_endian = "little") && size > 1 {
        bytes.chunks_exact_mut(size).for_each(<[u8]>::reverse);
    }
    Ok(v)
}

fn read_typed<T: WithDType + bytemuck::Pod>(
    archive: &mut Archive,
    views: &[&PtEntry],
    device: &Device,
    check_finite: bool,
) -> Result<Vec<Tensor>> {
    let mut raw: Vec<T> = read_storage(archive, views[0])?;
    let mut out = Vec::with_capacity(views.len());
    for (i, v) in views.iter().enumerate() {
        // the last view of a storage that is exactly the storage takes its buffer
        let whole =
            v.storage_offset == 0 && v.numel() == raw.len() && is_contiguous(&v.shape, &v.stride);
        let vals = if whole && i + 1 == views.len() {
            std::mem::take(&mut raw)
        } else {
            gather(&raw, v)
        };
        if check_finite && T::DTYPE.is_float() {
            let bad = vals.iter().filter(|x| !x.to_f64().is_finite()).count();
            if bad > 0 {
                return Err(Error::invalid(
                    "load",
                    format!(
                        "{}: tensor {:?} holds {bad} NaN or infinite value{} of {}; refusing to \
                         load it (the run it was saved from had diverged?). To load it anyway, \
                         use LoadOptions::new().allow_non_finite(true)",
                        archive.path.display(),
                        v.name,
                        if bad == 1 { "" } else { "s" },
                        vals.len()
                    ),
                ));
            }
        }
        out.push(Tensor::from_vec(vals, v.shape.clone(), device)?);
    }
    Ok(out)
}

/// Whether sizes and strides are row-major contiguous (dimensions of size 1 may
/// have any stride).
fn is_contiguous(shape: &[usize], stride: &[usize]) -> bool {
    let mut expect = 1usize;
    for (&d, &s) in shape.iter().zip(stride).rev() {
        if d != 1 && s != expect {
            return false;
        }
        expect = expect.saturating_mul(d);
    }
    true
}

/// A view's elements in row-major order (its bounds were checked by
/// [`PtFile::entry`]).
fn gather<T: Copy>(src: &[T], v: &PtEntry) -> Vec<T> {
    let n = v.numel();
    let (shape, stride) = (&v.shape, &v.stride);
    if n == 0 {
        return Vec::new();
    }
    if shape.is_empty() {
        return vec![src[v.storage_offset]];
    }
    if is_contiguous(shape, stride) {
        return src[v.storage_offset..v.storage_offset + n].to_vec();
    }
    let nd = shape.len();
    let (inner, step) = (shape[nd - 1], stride[nd - 1]);
    let mut out = Vec::with_capacity(n);
    let mut idx = vec![0usize; nd - 1];
    loop {
        let base = v.storage_offset + idx.iter().zip(stride).map(|(&i, &s)| i * s).sum::<usize>();
        if step == 1 {
            out.extend_from_slice(&src[base..base + inner]);
        } else {
            out.extend((0..inner).map(|i| src[base + i * step]));
        }
        // the next index of the outer dimensions, last fastest
        let mut d = nd - 1;
        loop {
            if d == 0 {
                return out;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(shape: &[usize], stride: &[usize], offset: usize) -> PtEntry {
        PtEntry {
            name: "t".into(),
            shape: shape.to_vec(),
            dtype: storage_dtype("FloatStorage").unwrap(),
            storage: "0".into(),
            storage_offset: offset,
            stride: stride.to_vec(),
            storage_numel: 100,
        }
    }

    #[test]
    fn gather_follows_strides() {
        let src: Vec<i32> = (0..24).collect();
        // a [3, 4] transposed to [4, 3] starting at 1: t[i][j] = 1 + i + 4j
        let v = gather(&src, &entry(&[4, 3], &[1, 4], 1));
        assert_eq!(v, [1, 5, 9, 2, 6, 10, 3, 7, 11, 4, 8, 12]);
        assert_eq!(gather(&src, &entry(&[], &[], 7)), [7]);
        assert_eq!(gather(&src, &entry(&[2, 0], &[1, 1], 0)), Vec::<i32>::new());
        assert_eq!(
            gather(&src, &entry(&[2, 3], &[0, 2], 3)),
            [3, 5, 7, 3, 5, 7]
        );
        assert_eq!(
            gather(&src, &entry(&[2, 1, 3], &[3, 99, 1], 2)),
            [2, 3, 4, 5, 6, 7]
        );
    }

    #[test]
    fn contiguity() {
        assert!(is_contiguous(&[2, 3], &[3, 1]));
        assert!(is_contiguous(&[2, 1, 3], &[3, 7, 1]));
        assert!(!is_contiguous(&[2, 3], &[1, 2]));
        assert!(is_contiguous(&[], &[]));
    }
}
