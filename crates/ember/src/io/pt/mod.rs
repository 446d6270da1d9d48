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

pub use archive::PtFormat;

use crate::{DType, Device, Error, Result, Tensor, WithDType};
use archive::{bad_file, Archive};
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

/// A walk's settings and what it has found so far.
struct Walk<'a> {
    strict: bool,
    /// Bytes of names and texts that may still be made.
    text_budget: usize,
    /// Visits left (see [`PtFile::walk`]).
    budget: &'a mut usize,
    names: &'a mut HashSet<String>,
    out: &'a mut Vec<(String, Leaf)>,
}

/// What a walk over the saved object finds at a leaf.
enum Leaf {
    Tensor(TensorRef),
    Other(String),
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

    fn entry(&self, name: String, t: &TensorRef) -> Result<PtEntry> {
        let s = self.storage_ref(t);
        let dtype = match &t.dtype {
            Some(d) => named_dtype(d).ok_or_else(|| {
                bad_file(
                    &self.path,
                    format!("tensor {name:?} is torch.{d}, a dtype ember does not know"),
                )
            })?,
            None => storage_dtype(&s.class).ok_or_else(|| {
                bad_file(
                    &self.path,
                    format!(
                        "tensor {name:?} is stored as torch.{}, a storage type ember does not know",
                        s.class
                    ),
                )
            })?,
        };
        let too_big = || {
            bad_file(
                &self.path,
                format!(
                    "tensor {name:?} has sizes {:?} that do not fit in memory",
                    t.shape
                ),
            )
        };
        let usize_of = |v: u64| usize::try_from(v).map_err(|_| too_big());
        let shape = t
            .shape
            .iter()
            .map(|&d| usize_of(d))
            .collect::<Result<Vec<_>>>()?;
        let stride = t
            .stride
            .iter()
            .map(|&d| usize_of(d))
            .collect::<Result<Vec<_>>>()?;
        // an untyped storage (under `_rebuild_tensor_v3`) counts bytes
        let storage_numel = if t.dtype.is_some() && &*s.class == "UntypedStorage" {
            if !s.numel.is_multiple_of(dtype.itemsize as u64) {
                return Err(bad_file(
                    &self.path,
                    format!(
                        "tensor {name:?}: its storage of {} bytes is not a whole number of {} elements",
                        s.numel, dtype.name
                    ),
                ));
            }
            usize_of(s.numel / dtype.itemsize as u64)?
        } else {
            usize_of(s.numel)?
        };
        let offset = usize_of(t.offset)?;
        let numel = shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .filter(|n| n.checked_mul(dtype.itemsize).is_some())
            .ok_or_else(too_big)?;
        if numel > 0 {
            // the last element a view reaches must lie in its storage
            let last = shape.iter().zip(&stride).try_fold(offset, |at, (&d, &s)| {
                (d - 1).checked_mul(s).and_then(|x| at.checked_add(x))
            });
            if last.is_none_or(|last| last >= storage_numel) {
                return Err(bad_file(
                    &self.path,
                    format!(
                        "tensor {name:?} (sizes {shape:?}, strides {stride:?}, offset {offset}) \
                         reaches past the end of its storage of {storage_numel} elements"
                    ),
                ));
            }
            if numel > storage_numel && numel > MAX_REPEATED_ELEMENTS {
                return Err(Error::invalid(
                    "load_pt",
                    format!(
                        "{}: tensor {name:?} repeats its storage's {storage_numel} elements as \
                         {numel} (a broadcast view); ember loads tensors contiguous and refuses \
                         to expand one past {MAX_REPEATED_ELEMENTS} elements",
                        self.path.display()
                    ),
                ));
            }
        }
        Ok(PtEntry {
            name,
            shape,
            dtype,
            storage: s.key.to_string(),
            storage_offset: offset,
            stride,
            storage_numel,
        })
    }

    /// The leaves under the root, in order, named by their key paths. With
    /// `strict`, an object ember does not build is an error naming it; without,
    /// a leaf describing it.
    fn walk(&self, strict: bool) -> Result<Vec<(String, Leaf)>> {
        let mut out = Vec::new();
        // a budget of visits: shared objects are walked once per path to them,
        // and a crafted file could share its way to an exponential number of paths
        let mut budget = 2 * self.objects.len() + 64;
        let mut names = HashSet::new();
        let mut walk = Walk {
            strict,
            text_budget: TEXT_PER_PICKLE_BYTE
                .saturating_mul(self.pickle_len)
                .saturating_add(1 << 20),
            budget: &mut budget,
            names: &mut names,
            out: &mut out,
        };
        self.walk_into(&self.root, String::new(), 0, &mut walk)?;
        Ok(out)
    }

    fn walk_into(&self, v: &Value, name: String, depth: usize, w: &mut Walk) -> Result<()> {
        let path = &self.path;
        if depth > MAX_DEPTH {
            return Err(bad_file(
                path,
                format!(
                    "{name:?}: containers nest more than {MAX_DEPTH} deep (or hold themselves)"
                ),
            ));
        }
        if *w.budget == 0 {
            return Err(bad_file(
                path,
                "the saved object's parts refer to each other too often to be listed (shared \
                 many times over, or holding themselves)",
            ));
        }
        *w.budget -= 1;
        let join = |k: &str| {
            if name.is_empty() {
                k.to_string()
            } else {
                format!("{name}.{k}")
            }
        };
        let leaf = |w: &mut Walk, l: Leaf| -> Result<()> {
            let cost = name.len()
                + match &l {
                    Leaf::Other(text) => text.len(),
                    Leaf::Tensor(_) => 0,
                };
            w.text_budget = w.text_budget.checked_sub(cost).ok_or_else(|| {
                bad_file(
                    path,
                    "the saved object's names and values would take many times the file's \
                     size to list (one long name or string repeated over and over)",
                )
            })?;
            if !w.names.insert(name.clone()) {
                return Err(bad_file(path, format!("two values are named {name:?}")));
            }
            w.out.push((name.clone(), l));
            Ok(())
        };
        let other = |s: String| Leaf::Other(s);
        match v {
            Value::None => leaf(w, other("None".into())),
            Value::Bool(b) => leaf(w, other(if *b { "True" } else { "False" }.into())),
            Value::Int(i) => leaf(w, other(i.to_string())),
            Value::BigInt(b) => leaf(w, other(format!("<a {}-byte integer>", b.len()))),
            Value::Float(f) => leaf(w, other(python_float(*f))),
            Value::Str(s) => leaf(w, other(python_str(s))),
            Value::Bytes(b) => leaf(w, other(format!("<{} bytes>", b.len()))),
            Value::Obj(id) => match &self.objects[*id] {
                Obj::Tensor(t) => leaf(w, Leaf::Tensor(t.clone())),
                Obj::Dict(items) if items.is_empty() => leaf(w, other("{}".into())),
                Obj::List(items) if items.is_empty() => leaf(w, other("[]".into())),
                Obj::Tuple(items) if items.is_empty() => leaf(w, other("()".into())),
                Obj::Dict(items) => {
                    // a key set twice keeps its last value, in its first place;
                    // two different keys with one name (1 and "1") are refused
                    let mut last: HashMap<String, usize> = HashMap::new();
                    for (i, (k, _)) in items.iter().enumerate() {
                        let Some(text) = key_text(k) else {
                            return Err(bad_file(
                                path,
                                format!(
                                    "{}: a dict key that is not a string, a number, a bool or \
                                     None ({k:?})",
                                    self.shown(&name)
                                ),
                            ));
                        };
                        if let Some(&j) = last.get(&text) {
                            if items[j].0 != *k {
                                return Err(bad_file(
                                    path,
                                    format!(
                                        "{}: keys {:?} and {k:?} would both be named {text:?}",
                                        self.shown(&name),
                                        items[j].0
                                    ),
                                ));
                            }
                        }
                        last.insert(text, i);
                    }
                    let mut done = HashSet::new();
                    for (k, _) in items {
                        let k = key_text(k).expect("checked above");
                        if done.insert(k.clone()) {
                            let v = &items[last[&k]].1;
                            self.walk_into(v, join(&k), depth + 1, w)?;
                        }
                    }
                    Ok(())
                }
                Obj::List(items) | Obj::Tuple(items) => {
                    for (i, v) in items.iter().enumerate() {
                        self.walk_into(v, join(&i.to_string()), depth + 1, w)?;
                    }
                    Ok(())
                }
                Obj::Set(items) => leaf(w, other(format!("<a set of {} values>", items.len()))),
                Obj::Storage(s) => leaf(
                    w,
                    other(format!("<a torch.{} of {} elements>", s.class, s.numel)),
                ),
                Obj::Global(g) if g.starts_with("torch.") => leaf(w, other(g.to_string())),
                Obj::Global(g) | Obj::Opaque(g) if w.strict => Err(self.unknown_object(&name, g)),
                Obj::Global(g) | Obj::Opaque(g) => {
                    leaf(w, other(format!("<a `{g}` object, not read>")))
                }
            },
        }
    }

    fn shown(&self, name: &str) -> String {
        let mut full = self.selected.clone();
        if !name.is_empty() {
            full.push(name.to_string());
        }
        if full.is_empty() {
            "the saved object".to_string()
        } else {
            format!("{:?}", full.join("."))
        }
    }

    fn unknown_object(&self, name: &str, global: &str) -> Error {
        let hint = if global.starts_with("torch.nn.") || global.starts_with("__main__.") {
            " It looks like a whole model was saved (torch.save(model)): save its \
             state_dict() instead, which holds only tensors."
                .to_string()
        } else if !name.is_empty() {
            let keys = self.keys();
            format!(
                " Select the part that holds the tensors{}.",
                if keys.is_empty() {
                    String::new()
                } else {
                    format!(" (the keys here are {keys:?})")
                }
            )
        } else {
            String::new()
        };
        Error::invalid(
            "load_pt",
            format!(
                "{}: {} is a Python object made by `{global}`, which ember does not build: a \
                 torch.save file is read as data (tensors, dicts, lists, tuples, numbers, \
                 strings), never run.{hint}",
                self.path.display(),
                self.shown(name),
            ),
        )
    }

    /// Reads every tensor of the (selected part of the) file onto `device`, in
    /// the file's order, named like [`entries`](Self::entries). NaN and infinity
    /// load as they are.
    pub fn load(&self, device: &Device) -> Result<Vec<(String, Tensor)>> {
        self.load_checked(device, false)
    }

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
        let mut loaded: Vec<Option<Tensor>> = vec![None; entries.len()];
        let mut archive = self
            .archive
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
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

/// A dict key as a name part: strings as they are, integers in decimal (an
/// optimizer's state is keyed by parameter index).
fn key_text(k: &Value) -> Option<String> {
    match k {
        Value::Str(s) => Some(s.to_string()),
        Value::Int(i) => Some(i.to_string()),
        Value::Bool(b) => Some(if *b { "True" } else { "False" }.to_string()),
        Value::None => Some("None".to_string()),
        _ => None,
    }
}

/// A string as Python's `repr` writes it: single quotes unless the text holds
/// one and no double quote, backslash escapes for quotes, backslashes and
/// control characters.
fn python_str(s: &str) -> String {
    let q = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push(q);
    out
}

/// A float as Python's `repr` writes it: the shortest digits that read back,
/// positional from 1e-4 up to 1e16 (`0.0001`, `1.0`), else with an exponent of
/// at least two digits (`1e-05`, `1e+16`); `inf`, `nan`.
fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    // Rust's `{:e}` gives the same shortest digits: "-1.2345e-8"
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("{:e}'s exponent is an integer");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        let text = if point <= 0 {
            format!("0.{}{digits}", "0".repeat((-point) as usize))
        } else if point as usize >= digits.len() {
            format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
        } else {
            format!(
                "{}.{}",
                &digits[..point as usize],
                &digits[point as usize..]
            )
        };
        format!("{sign}{text}")
    } else {
        let m = if digits.len() > 1 {
            format!("{}.{}", &digits[..1], &digits[1..])
        } else {
            digits
        };
        let e_sign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{m}e{e_sign}{:02}", exp.abs())
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
    fn floats_as_python_writes_them() {
        for (f, py) in [
            (0.1, "0.1"),
            (1.0, "1.0"),
            (-0.0, "-0.0"),
            (1e-8, "1e-08"),
            (0.0001, "0.0001"),
            (0.00012, "0.00012"),
            (1.5e-5, "1.5e-05"),
            (123456.0, "123456.0"),
            (1e16, "1e+16"),
            (1234567890123456.0, "1234567890123456.0"),
            (2.5e300, "2.5e+300"),
            (-3.75, "-3.75"),
            (f64::INFINITY, "inf"),
        ] {
            assert_eq!(python_float(f), py, "{f}");
        }
    }

    #[test]
    fn strings_as_python_writes_them() {
        assert_eq!(python_str("adam"), "'adam'");
        assert_eq!(python_str("it's"), "\"it's\"");
        assert_eq!(python_str("a'b\"c"), "'a\\'b\"c'");
        assert_eq!(python_str("tab\there\\"), "'tab\\there\\\\'");
        assert_eq!(python_str("\u{1}"), "'\\x01'");
    }

    #[test]
    fn contiguity() {
        assert!(is_contiguous(&[2, 3], &[3, 1]));
        assert!(is_contiguous(&[2, 1, 3], &[3, 7, 1]));
        assert!(!is_contiguous(&[2, 3], &[1, 2]));
        assert!(is_contiguous(&[], &[]));
    }
}
