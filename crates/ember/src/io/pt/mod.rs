//! PyTorch's own files: what `torch.save` writes (`.pt`, `.pth`, `.bin`), read as
//! data.
//!
//! A `torch.save` file is a pickle (a Python program that rebuilds the saved
//! object) beside the raw bytes of each tensor storage. ember runs the pickle's
//! opcodes without calling anything: dicts (`OrderedDict` too), lists, tuples,
//! strings, numbers and tensors are built; any other object is kept as the name
//! of the Python function that would have made it, and reading it is an error
//! naming that function. A file cannot run code here, and a damaged or hostile
//! one gives an error, never a panic or an allocation larger than what the file
//! holds.
//!
//! Both layouts are read: the zip archive PyTorch has written since 1.6 and the
//! legacy one before it (`_use_new_zipfile_serialization=False`). Nested
//! checkpoints (`{"model": ..., "optimizer": ..., "epoch": 3}`) are read whole,
//! their tensors named by the path of keys (`model.fc.weight`,
//! `optimizer.state.0.exp_avg`), or one part at a time with [`PtFile::select`].
//! Tensors that were views (transposed, sliced, sharing one storage) load as
//! independent contiguous tensors with the views' values; storages are read one
//! at a time, each straight onto the target device.
//!
//! ```no_run
//! use ember::io::PtFile;
//! use ember::prelude::*;
//! let dev = Device::cuda_if_available(0);
//! // torchvision's pretrained weights into ember's ResNet-18
//! let model = ember::models::resnet18(1000, &dev)?;
//! let weights = ember::io::load_pt("resnet18-f37072fd.pth", &dev)?;
//! model.load_state_dict(&weights, true)?;
//! // one part of a training checkpoint, after a look at what it holds
//! let file = PtFile::open("checkpoint.pt")?;
//! for e in file.select("model")?.entries()? {
//!     println!("{} {} {:?}", e.name, e.dtype.name, e.shape);
//! }
//! # Ok::<(), ember::Error>(())
//! ```

mod archive;
pub(crate) mod pickle;
mod read;
mod walk;

use walk::{key_text, Leaf};

pub use archive::PtFormat;

use crate::{
    device::Device,
    dtype::{DType, WithDType},
    error::{Error, Result},
    tensor::Tensor,
};
use archive::Archive;
use pickle::{Obj, StorageRef, TensorRef, Value};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A storage's element type as PyTorch names it, with ember's dtype where ember
/// has one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PtDType {
    /// PyTorch's name without `torch.` (`float32`, `int32`).
    pub name: &'static str,
    /// Bytes per element.
    pub itemsize: usize,
    /// ember's dtype, `None` for the types ember does not have (an entry of such
    /// a type can be listed but not loaded).
    pub dtype: Option<DType>,
}

/// PyTorch's element types: the typed storage class that holds each (the zip
/// and legacy formats name it), the dtype's name, its size, and ember's dtype.
const STORAGE_CLASSES: [(&str, &str, usize, Option<DType>); 19] = [
    ("FloatStorage", "float32", 4, Some(DType::F32)),
    ("DoubleStorage", "float64", 8, Some(DType::F64)),
    ("HalfStorage", "float16", 2, Some(DType::F16)),
    ("BFloat16Storage", "bfloat16", 2, Some(DType::BF16)),
    ("LongStorage", "int64", 8, Some(DType::I64)),
    ("IntStorage", "int32", 4, None),
    ("ShortStorage", "int16", 2, None),
    ("CharStorage", "int8", 1, None),
    ("ByteStorage", "uint8", 1, Some(DType::U8)),
    ("BoolStorage", "bool", 1, Some(DType::Bool)),
    ("ComplexFloatStorage", "complex64", 8, None),
    ("ComplexDoubleStorage", "complex128", 16, None),
    ("ComplexHalfStorage", "complex32", 4, None),
    // types only named by the tensor (`_rebuild_tensor_v3` over an untyped storage)
    ("", "uint16", 2, None),
    ("", "uint32", 4, None),
    ("", "uint64", 8, None),
    ("", "float8_e4m3fn", 1, None),
    ("", "float8_e5m2", 1, None),
    ("", "float8_e8m0fnu", 1, None),
];

fn pt_dtype(&(_, name, itemsize, dtype): &(&str, &'static str, usize, Option<DType>)) -> PtDType {
    PtDType {
        name,
        itemsize,
        dtype,
    }
}

/// The element type of a storage class (`FloatStorage`), if PyTorch has it.
pub(crate) fn storage_dtype(class: &str) -> Option<PtDType> {
    STORAGE_CLASSES
        .iter()
        .find(|(c, ..)| !c.is_empty() && *c == class)
        .map(pt_dtype)
}

/// The element type named `name` (`uint16`), if ember knows its size.
fn named_dtype(name: &str) -> Option<PtDType> {
    STORAGE_CLASSES
        .iter()
        .find(|(_, n, ..)| *n == name)
        .map(pt_dtype)
}

/// One tensor of a file, as stored: nothing of it is read until it is loaded.
#[derive(Clone, Debug, PartialEq)]
pub struct PtEntry {
    /// The keys leading to it, joined by dots (`model.fc.weight`).
    pub name: String,
    pub shape: Vec<usize>,
    pub dtype: PtDType,
    /// The storage it views (several tensors can share one).
    pub storage: String,
    /// Its first element's index in the storage, and the step of each dimension
    /// (in elements).
    pub storage_offset: usize,
    pub stride: Vec<usize>,
    /// The storage's length in elements.
    pub storage_numel: usize,
}

impl PtEntry {
    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The bytes its values take once loaded.
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype.itemsize
    }
}

/// How deep containers may nest (deeper, or an object holding itself, is refused).
const MAX_DEPTH: usize = 128;

/// Names and texts listed from a pickle may take this many bytes per byte of it
/// (a nested checkpoint repeats its keys' prefixes; a crafted file could repeat
/// one long string without end).
const TEXT_PER_PICKLE_BYTE: usize = 16;

/// The tensors loaded from a file may take this many times the bytes of its
/// distinct storages (views sharing a storage are each copied; a tied weight
/// is two), plus [`MAX_REPEATED_ELEMENTS`] elements.
const COPIES_PER_STORAGE_BYTE: usize = 4;

/// A view may hold more elements than its storage only by repeating them (a
/// zero stride); loading makes it contiguous, so it is refused past this many.
const MAX_REPEATED_ELEMENTS: usize = 1 << 24;

/// An open `torch.save` file: its structure is read, its storages are not.
///
/// [`entries`](Self::entries) lists the tensors, [`values`](Self::values) the
/// other values (numbers, strings), [`load`](Self::load) reads the tensors onto a
/// device, and [`select`](Self::select) narrows the file to the part under a key.
pub struct PtFile {
    archive: Arc<Mutex<Archive>>,
    path: PathBuf,
    format: PtFormat,
    root: Value,
    /// The keys [`select`](Self::select) followed to `root`.
    selected: Vec<String>,
    /// The pickle's objects (shared with `archive`, copied out so that listing
    /// does not lock).
    objects: Arc<Vec<Obj>>,
    /// The pickle's length in bytes: names and texts listed from it are
    /// limited to a multiple of it.
    pickle_len: usize,
}

impl PtFile {
    /// Opens `path` and reads its structure (the pickle), not its tensors.
    pub fn open(path: impl AsRef<Path>) -> Result<PtFile> {
        let path = path.as_ref();
        let mut archive = Archive::open(path)?;
        let objects = Arc::new(std::mem::take(&mut archive.pickle.objects));
        let root = archive.pickle.root.clone();
        let pickle_len = archive.pickle_len;
        Ok(PtFile {
            pickle_len,
            path: path.to_path_buf(),
            format: archive.format,
            archive: Arc::new(Mutex::new(archive)),
            root,
            selected: Vec::new(),
            objects,
        })
    }

    /// The file's layout.
    pub fn format(&self) -> PtFormat {
        self.format
    }

    /// The keys [`select`](Self::select) followed (empty for the whole file).
    pub fn selected(&self) -> &[String] {
        &self.selected
    }

    /// The keys of the saved object when it is a dict (a checkpoint's `model`,
    /// `optimizer`, ...), in the file's order; empty otherwise.
    pub fn keys(&self) -> Vec<String> {
        match self.obj(&self.root) {
            Some(Obj::Dict(items)) => {
                let mut seen = HashSet::new();
                let mut keys: Vec<String> = items
                    .iter()
                    .rev()
                    .filter_map(|(k, _)| key_text(k))
                    .filter(|k| seen.insert(k.clone()))
                    .collect();
                keys.reverse();
                keys
            }
            _ => Vec::new(),
        }
    }

    /// The part of the file under `key` (`torch.load(f)["model"]`); `a/b` follows
    /// nested dicts, and a number steps into a list (`optimizer/param_groups/0`).
    /// A key that is itself in the dict is taken whole first (state-dict keys hold
    /// dots, never slashes). Tensors are then named from there (`fc.weight`).
    pub fn select(&self, key: &str) -> Result<PtFile> {
        let mut root = self.root.clone();
        let mut selected = self.selected.clone();
        let steps: Vec<&str> = if self.child(&root, key).is_some() {
            vec![key]
        } else {
            key.split('/').collect()
        };
        for step in steps {
            match self.child(&root, step) {
                Some(v) => {
                    root = v;
                    selected.push(step.to_string());
                }
                None => {
                    let here = self.clone_with(root.clone(), selected.clone());
                    let keys = here.keys();
                    return Err(Error::invalid(
                        "load_pt",
                        format!(
                            "{}: {} has no key {step:?}{}",
                            self.path.display(),
                            self.describe(&selected),
                            if keys.is_empty() {
                                " (it is not a dict)".to_string()
                            } else {
                                format!("; its keys are {keys:?}")
                            }
                        ),
                    ));
                }
            }
        }
        Ok(self.clone_with(root, selected))
    }

    fn clone_with(&self, root: Value, selected: Vec<String>) -> PtFile {
        PtFile {
            archive: self.archive.clone(),
            path: self.path.clone(),
            format: self.format,
            root,
            selected,
            objects: self.objects.clone(),
            pickle_len: self.pickle_len,
        }
    }

    fn describe(&self, selected: &[String]) -> String {
        if selected.is_empty() {
            "the saved object".to_string()
        } else {
            format!("the object at {:?}", selected.join("/"))
        }
    }

    fn obj(&self, v: &Value) -> Option<&Obj> {
        match v {
            Value::Obj(id) => self.objects.get(*id),
            _ => None,
        }
    }

    /// The value under `key` of a dict (the last one set, as in Python).
    fn child(&self, v: &Value, key: &str) -> Option<Value> {
        match self.obj(v)? {
            Obj::Dict(items) => items
                .iter()
                .rev()
                .find(|(k, _)| key_text(k).as_deref() == Some(key))
                .map(|(_, v)| v.clone()),
            Obj::List(items) | Obj::Tuple(items) => items.get(key.parse::<usize>().ok()?).cloned(),
            _ => None,
        }
    }

    /// Every tensor of the (selected part of the) file, in the file's order, with
    /// its shape, dtype and storage. Nothing is read from the storages.
    /// An object ember does not build (a Python class instance) is skipped here
    /// and listed by [`values`](Self::values); [`load`](Self::load) refuses it.
    pub fn entries(&self) -> Result<Vec<PtEntry>> {
        self.entries_of(false)
    }

    /// [`entries`](Self::entries), refusing an object ember does not build as
    /// [`load`](Self::load) refuses it (with its hint: a whole model saved),
    /// still without reading a storage.
    pub(crate) fn entries_strict(&self) -> Result<Vec<PtEntry>> {
        self.entries_of(true)
    }

    fn entries_of(&self, strict: bool) -> Result<Vec<PtEntry>> {
        let mut out = Vec::new();
        for (name, leaf) in self.walk(strict)? {
            if let Leaf::Tensor(t) = leaf {
                out.push(self.entry(name, &t)?);
            }
        }
        Ok(out)
    }

    /// The values that are not tensors (an epoch count, a learning rate, a
    /// string), named like the tensors and written as Python prints them; an
    /// object ember does not build appears as `<a `NAME` object, not read>`.
    pub fn values(&self) -> Result<Vec<(String, String)>> {
        Ok(self
            .walk(false)?
            .into_iter()
            .filter_map(|(name, leaf)| match leaf {
                Leaf::Other(text) => Some((name, text)),
                Leaf::Tensor(_) => None,
            })
            .collect())
    }

    fn storage_ref(&self, t: &TensorRef) -> &StorageRef {
        match &self.objects[t.storage] {
            Obj::Storage(s) => s,
            _ => unreachable!("the pickle reader builds tensors over storages only"),
        }
    }

    /// Reads every tensor of the (selected part of the) file onto `device`, in
    /// the file's order, named like [`entries`](Self::entries). NaN and infinity
    /// load as they are.
    pub fn load(&self, device: &Device) -> Result<Vec<(String, Tensor)>> {
        self.load_checked(device, false)
    }
}

/// `torch.load(path)`'s tensors, read onto `device`: every tensor of the file,
/// named by its path of keys (a state dict's own names for a plain state dict;
/// `model.fc.weight` inside a `{"model": ...}` checkpoint). Values that are not
/// tensors are left out ([`PtFile::values`] lists them). NaN and infinity load.
///
/// ```no_run
/// use ember::nn::Module;
/// use ember::prelude::*;
/// let model = ember::models::resnet50(1000, &Device::Cpu)?;
/// let state = ember::io::load_pt("resnet50.pth", &Device::Cpu)?;
/// let report = model.load_state_dict(&state, false)?;
/// println!("missing {:?}, unexpected {:?}", report.missing_keys, report.unexpected_keys);
/// # Ok::<(), ember::Error>(())
/// ```
pub fn load_pt(path: impl AsRef<Path>, device: &Device) -> Result<Vec<(String, Tensor)>> {
    PtFile::open(path)?.load(device)
}

/// Whether `path` starts like a `torch.save` file (either layout), as opposed to
/// a safetensors file. Unreadable files are not.
pub fn is_pt_file(path: impl AsRef<Path>) -> bool {
    use std::io::Read;
    let mut head = Vec::with_capacity(archive::HEAD_LEN);
    std::fs::File::open(path)
        .and_then(|f| f.take(archive::HEAD_LEN as u64).read_to_end(&mut head))
        .is_ok()
        && archive::layout_of(&head).is_some()
}
