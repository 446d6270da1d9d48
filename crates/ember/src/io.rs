//! Saving and loading named tensors as safetensors files (readable by PyTorch's
//! `safetensors` package), model state dicts, and training checkpoints; reading
//! PyTorch's own `torch.save` files ([`PtFile`], [`load_pt`]).
//!
//! Writes are atomic: the file is written beside its destination and renamed into
//! place, so an interrupted save never leaves a half-written checkpoint.
//!
//! Every file ember writes carries a CRC-32 of each tensor's bytes in the
//! safetensors metadata (`crc32.NAME`), checked when the file is read: a tensor
//! changed on disk after it was saved is an error naming it. Files without
//! checksums (written by PyTorch's `safetensors`) load as they are. State dicts
//! and checkpoints holding NaN or infinite values are refused by default, naming
//! the tensor ([`LoadOptions::allow_non_finite`] lets them through).
//!
//! ```
//! use ember::nn::{self, Module};
//! use ember::prelude::*;
//! let dev = Device::Cpu;
//! let model = nn::Linear::new(3, 2, &dev)?;
//! let path = std::env::temp_dir().join("ember-doc-linear.safetensors");
//! ember::io::save_state_dict(&model, &path)?;
//! let fresh = nn::Linear::new(3, 2, &dev)?;
//! ember::io::load_state_dict(&fresh, &path)?;
//! assert_eq!(fresh.weight.to_vec2::<f32>()?, model.weight.to_vec2::<f32>()?);
//! # std::fs::remove_file(&path).ok();
//! # Ok::<(), ember::Error>(())
//! ```

mod pt;

pub use pt::{is_pt_file, load_pt, PtDType, PtEntry, PtFile, PtFormat};

/// Writes `bytes` to `path` through a temporary file in the same folder and a
/// rename, as every file ember writes: a reader (or a crash) sees the old file
/// or the new one, never a part.
pub fn write_atomic(path: impl AsRef<Path>, bytes: &[u8]) -> Result<()> {
    crate::files::write_atomic(path.as_ref(), bytes)
}

use crate::dtype::CpuData;
use crate::nn::Module;
use crate::optim::Optimizer;
use crate::{
    device::Device,
    dtype::DType,
    error::{Error, Result},
    tensor::Tensor,
};
use half::{bf16, f16};
use safetensors::tensor::{Dtype, SafeTensors, View};
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// The metadata key holding a tensor's checksum.
fn crc_key(name: &str) -> String {
    format!("crc32.{name}")
}

/// How state dicts and checkpoints are loaded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Load floating-point tensors holding NaN or infinite values (refused by
    /// default: a model that diverged before it was saved is rarely what a user
    /// means to continue from).
    pub allow_non_finite: bool,
}

impl LoadOptions {
    /// The defaults: non-finite values refused.
    pub fn new() -> LoadOptions {
        LoadOptions::default()
    }

    /// Lets NaN and infinite values through.
    pub fn allow_non_finite(mut self, allow: bool) -> LoadOptions {
        self.allow_non_finite = allow;
        self
    }
}

/// A tensor ready to serialize: its values contiguous on the host in their own
/// type, viewed as little-endian bytes when written (one copy of the tensor,
/// not two).
struct Raw {
    dtype: Dtype,
    shape: Vec<usize>,
    values: CpuData,
}

impl Raw {
    fn bytes(&self) -> &[u8] {
        match &self.values {
            CpuData::F32(v) => bytemuck::cast_slice(v),
            CpuData::F64(v) => bytemuck::cast_slice(v),
            CpuData::F16(v) => bytemuck::cast_slice(v),
            CpuData::BF16(v) => bytemuck::cast_slice(v),
            CpuData::I64(v) => bytemuck::cast_slice(v),
            CpuData::U8(v) => v,
            // SAFETY: a bool is one byte holding 0 or 1 (safetensors' BOOL)
            CpuData::Bool(v) => unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), v.len()) },
        }
    }
}

impl View for &Raw {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(self.bytes())
    }
    fn data_len(&self) -> usize {
        self.bytes().len()
    }
}

fn raw(t: &Tensor) -> Result<Raw> {
    // (read to the host in its own type at once: a tensor on a GPU is not
    // first copied whole to a CPU tensor)
    let values = t.detach().host_data("save")?;
    let dtype = match t.dtype() {
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::I64 => Dtype::I64,
        DType::U8 => Dtype::U8,
        DType::Bool => Dtype::BOOL,
    };
    Ok(Raw {
        dtype,
        shape: t.shape().to_vec(),
        values,
    })
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Writes `tensors` to `path` as one safetensors file, atomically, with a checksum
/// of each tensor.
pub fn save(tensors: &[(String, Tensor)], path: impl AsRef<Path>) -> Result<()> {
    save_with_metadata(tensors, &[], path)
}

/// [`save`] with string metadata of the caller's (read back by [`metadata`]).
/// Keys starting with `crc32.` are ember's own and refused. The file says
/// `format = pt` unless the caller gives a `format` (Hugging Face's loaders
/// read the tensors as PyTorch's only with it).
pub fn save_with_metadata(
    tensors: &[(String, Tensor)],
    metadata: &[(String, String)],
    path: impl AsRef<Path>,
) -> Result<()> {
    check_names(tensors.iter().map(|(n, _)| n.as_str()))?;
    check_metadata(metadata)?;
    let raws: Vec<(String, Raw)> = tensors
        .iter()
        .map(|(n, t)| Ok((n.clone(), raw(t)?)))
        .collect::<Result<_>>()?;
    write_raws(raws, metadata, path.as_ref())
}

/// [`save`] of tensors the caller gives up: each is read to the host and then
/// dropped, so that writing a large checkpoint (as `ember convert` does) holds
/// its size in memory twice at the peak (the values read, and the file's
/// bytes), not three times.
pub fn save_owned(tensors: Vec<(String, Tensor)>, path: impl AsRef<Path>) -> Result<()> {
    check_names(tensors.iter().map(|(n, _)| n.as_str()))?;
    let raws: Vec<(String, Raw)> = tensors
        .into_iter()
        .map(|(n, t)| Ok((n, raw(&t)?)))
        .collect::<Result<_>>()?;
    write_raws(raws, &[], path.as_ref())
}

/// Refuses a tensor name given twice, an empty one, or the header's own entry.
fn check_names<'a>(names: impl Iterator<Item = &'a str>) -> Result<()> {
    let mut seen = HashSet::new();
    for name in names {
        if name.is_empty() {
            return Err(Error::invalid(
                "save",
                "a tensor has an empty name: name it (a file's tensors are found by name)",
            ));
        }
        if !seen.insert(name) {
            return Err(Error::invalid(
                "save",
                format!("duplicate tensor name {name:?}"),
            ));
        }
        // (the header's own entry: a file with a tensor of that name is unreadable)
        if name == "__metadata__" {
            return Err(Error::invalid(
                "save",
                "a tensor cannot be named \"__metadata__\" (the safetensors header's \
                 metadata entry): rename it",
            ));
        }
    }
    Ok(())
}

/// Refuses a metadata key of ember's own (`crc32.`) or given twice.
fn check_metadata(metadata: &[(String, String)]) -> Result<()> {
    let mut seen = HashSet::new();
    for (k, _) in metadata {
        if k.starts_with("crc32.") || !seen.insert(k) {
            return Err(Error::invalid(
                "save",
                format!("metadata key {k:?} is reserved or repeated"),
            ));
        }
    }
    Ok(())
}

/// Writes `raws` with `metadata`, a checksum of each and `format = pt`
/// (unless `metadata` has a format), atomically.
fn write_raws(raws: Vec<(String, Raw)>, metadata: &[(String, String)], path: &Path) -> Result<()> {
    let mut info: HashMap<String, String> = metadata.iter().cloned().collect();
    info.entry("format".into()).or_insert_with(|| "pt".into());
    for (n, r) in &raws {
        info.insert(crc_key(n), format!("{:08x}", crc32fast::hash(r.bytes())));
    }
    let bytes = safetensors::serialize(raws.iter().map(|(n, r)| (n.as_str(), r)), Some(info))
        .map_err(|e| Error::invalid("save", format!("{}: {e}", path.display())))?;
    drop(raws);
    crate::files::write_atomic(path, &bytes)
}

/// The string metadata of a safetensors file (empty when it has none), without
/// its checksums.
pub fn metadata(path: impl AsRef<Path>) -> Result<Vec<(String, String)>> {
    let path = path.as_ref();
    let meta = read_header(path)?;
    let mut out: Vec<(String, String)> = meta
        .metadata()
        .iter()
        .flatten()
        .filter(|(k, _)| !k.starts_with("crc32."))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    out.sort();
    Ok(out)
}

/// A tensor as a file lists it, without its values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// PyTorch's name for its dtype (`float32`, `int32`): files can hold types
    /// ember does not have.
    pub dtype: String,
    pub shape: Vec<usize>,
    /// The bytes its values take.
    pub nbytes: usize,
}

/// The tensors of a safetensors file or a `torch.save` file (told apart by their
/// first bytes), in the file's order, without loading their values. For a
/// `torch.save` file nested names are joined with dots, as [`load_pt`] names
/// them; [`PtFile`] lists one part of such a file, and its other values.
pub fn list(path: impl AsRef<Path>) -> Result<Vec<TensorInfo>> {
    let path = path.as_ref();
    if is_pt_file(path) {
        return Ok(PtFile::open(path)?
            .entries()?
            .into_iter()
            .map(|e| TensorInfo {
                nbytes: e.nbytes(),
                dtype: e.dtype.name.to_string(),
                shape: e.shape,
                name: e.name,
            })
            .collect());
    }
    let meta = read_header(path)?;
    let mut out: Vec<(usize, TensorInfo)> = meta
        .tensors()
        .into_iter()
        .map(|(name, info)| {
            let dtype = match info.dtype {
                Dtype::BOOL => "bool".to_string(),
                Dtype::U8 => "uint8".to_string(),
                Dtype::I8 => "int8".to_string(),
                Dtype::I16 => "int16".to_string(),
                Dtype::I32 => "int32".to_string(),
                Dtype::I64 => "int64".to_string(),
                Dtype::F16 => "float16".to_string(),
                Dtype::BF16 => "bfloat16".to_string(),
                Dtype::F32 => "float32".to_string(),
                Dtype::F64 => "float64".to_string(),
                other => format!("{other:?}").to_lowercase(),
            };
            let (start, end) = info.data_offsets;
            (
                start,
                TensorInfo {
                    name,
                    dtype,
                    shape: info.shape.clone(),
                    nbytes: end - start,
                },
            )
        })
        .collect();
    out.sort_by(|a, b| (a.0, &a.1.name).cmp(&(b.0, &b.1.name)));
    Ok(out.into_iter().map(|(_, t)| t).collect())
}

/// The header of the safetensors file at `path`, read alone (a file of any size
/// lists at once), with the reader's checks: a header of at most 100 MB, whose
/// tensors' offsets follow one another and cover the file's data exactly.
fn read_header(path: &Path) -> Result<safetensors::tensor::Metadata> {
    use safetensors::SafeTensorError as E;
    use std::io::Read;
    let bad = |e| not_safetensors(path, e);
    let mut f = std::fs::File::open(path).map_err(io_err(path))?;
    let file_len = f.metadata().map_err(io_err(path))?.len();
    let mut len = [0u8; 8];
    if file_len < 8 {
        return Err(bad(E::HeaderTooSmall));
    }
    f.read_exact(&mut len).map_err(io_err(path))?;
    let n = u64::from_le_bytes(len);
    if n > 100_000_000 {
        return Err(bad(E::HeaderTooLarge));
    }
    if 8 + n > file_len {
        return Err(bad(E::InvalidHeaderLength));
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header).map_err(io_err(path))?;
    let text = std::str::from_utf8(&header).map_err(|e| bad(E::InvalidHeader(e)))?;
    // (the deserialiser checks the offsets against the shapes and dtypes)
    let meta: safetensors::tensor::Metadata =
        serde_json::from_str(text).map_err(|e| bad(E::InvalidHeaderDeserialization(e)))?;
    let data = meta
        .tensors()
        .values()
        .map(|t| t.data_offsets.1 as u64)
        .max()
        .unwrap_or(0);
    if 8 + n + data != file_len {
        return Err(bad(E::MetadataIncompleteBuffer));
    }
    Ok(meta)
}

fn not_safetensors(path: &Path, e: safetensors::SafeTensorError) -> Error {
    Error::invalid(
        "load",
        format!("{}: not a valid safetensors file ({e})", path.display()),
    )
}

/// A float tensor's values from its bytes, refused (naming it) when `check` is set
/// and they hold NaN or infinity.
fn decode_floats<T: bytemuck::Pod + Into<f64>>(
    path: &Path,
    name: &str,
    data: &[u8],
    check: bool,
) -> Result<Vec<T>> {
    let v = bytemuck::pod_collect_to_vec::<u8, T>(data);
    if check {
        check_finite(path, name, &v)?;
    }
    Ok(v)
}

/// Refuses a float tensor holding NaN or infinity, naming it.
fn check_finite<T: Copy + Into<f64>>(path: &Path, name: &str, v: &[T]) -> Result<()> {
    let bad = v.iter().filter(|x| !(**x).into().is_finite()).count();
    if bad > 0 {
        return Err(Error::invalid(
            "load",
            format!(
                "{}: tensor {name:?} holds {bad} NaN or infinite value{} of {}; refusing to \
                 load it (the run it was saved from had diverged?). To load it anyway, use \
                 LoadOptions::new().allow_non_finite(true)",
                path.display(),
                if bad == 1 { "" } else { "s" },
                v.len()
            ),
        ));
    }
    Ok(())
}

/// Reads every tensor of a safetensors file (in the file's order) onto `device`,
/// checking the checksums ember wrote (a file without them loads as it is). Values
/// are not checked: NaN and infinity load.
pub fn load(path: impl AsRef<Path>, device: &Device) -> Result<Vec<(String, Tensor)>> {
    load_checked(path.as_ref(), device, true)
}

fn load_checked(
    path: &Path,
    device: &Device,
    allow_non_finite: bool,
) -> Result<Vec<(String, Tensor)>> {
    let bytes = std::fs::read(path).map_err(io_err(path))?;
    let (_, meta) = SafeTensors::read_metadata(&bytes).map_err(|e| not_safetensors(path, e))?;
    let file = SafeTensors::deserialize(&bytes).map_err(|e| not_safetensors(path, e))?;
    let sums = meta.metadata().clone().unwrap_or_default();
    for key in sums.keys() {
        if let Some(name) = key.strip_prefix("crc32.") {
            if file.tensor(name).is_err() {
                return Err(Error::invalid(
                    "load",
                    format!(
                        "{}: the file lists a checksum for tensor {name:?} but has no such tensor (the file is damaged)",
                        path.display()
                    ),
                ));
            }
        }
    }
    let mut out = Vec::new();
    // the file's order (the reader's own iteration order is a hash map's)
    let mut views: Vec<_> = file.iter().collect();
    views.sort_by_key(|(_, v)| v.data().as_ptr() as usize);
    for (name, view) in views {
        let shape = view.shape().to_vec();
        let data = view.data();
        if let Some(want) = sums.get(&crc_key(name)) {
            let got = format!("{:08x}", crc32fast::hash(data));
            if !got.eq_ignore_ascii_case(want) {
                return Err(Error::invalid(
                    "load",
                    format!(
                        "{}: tensor {name:?} is damaged: its bytes have checksum {got}, the file recorded {want} when it was saved",
                        path.display()
                    ),
                ));
            }
        }
        let t = match view.dtype() {
            Dtype::F32 => Tensor::from_vec(
                decode_floats::<f32>(path, name, data, !allow_non_finite)?,
                shape,
                device,
            )?,
            Dtype::F64 => Tensor::from_vec(
                decode_floats::<f64>(path, name, data, !allow_non_finite)?,
                shape,
                device,
            )?,
            Dtype::F16 => Tensor::from_vec(
                decode_floats::<f16>(path, name, data, !allow_non_finite)?,
                shape,
                device,
            )?,
            Dtype::BF16 => Tensor::from_vec(
                decode_floats::<bf16>(path, name, data, !allow_non_finite)?,
                shape,
                device,
            )?,
            Dtype::I64 => {
                Tensor::from_vec(bytemuck::pod_collect_to_vec::<u8, i64>(data), shape, device)?
            }
            Dtype::U8 => Tensor::from_vec(data.to_vec(), shape, device)?,
            Dtype::BOOL => Tensor::from_vec(
                data.iter().map(|&b| b != 0).collect::<Vec<bool>>(),
                shape,
                device,
            )?,
            other => {
                return Err(Error::invalid(
                    "load",
                    format!(
                        "{}: tensor {name:?} has dtype {other:?}, which ember does not support",
                        path.display()
                    ),
                ))
            }
        };
        out.push((name.to_string(), t));
    }
    Ok(out)
}

/// Saves a model's parameters and buffers under their `state_dict` names.
pub fn save_state_dict(model: &dyn Module, path: impl AsRef<Path>) -> Result<()> {
    save(&model.state_dict(), path)
}

/// Copies `state` into the model's parameters and buffers (converted to each one's
/// dtype), after checking that the names and shapes match exactly; on a mismatch
/// nothing is changed. `what` names the state in errors (a file name).
pub fn load_state_into(model: &dyn Module, state: &[(String, Tensor)], what: &str) -> Result<()> {
    crate::nn::load_state(model, state, true, what).map(|_| ())
}

/// Loads a file written by [`save_state_dict`], PyTorch's `save_file` of a state
/// dict, or PyTorch's `torch.save` of a state dict (`.pt`/`.pth`, told apart by
/// their first bytes; see [`PtFile`]) into the model's parameters, strictly: the
/// names and shapes must match ([`Module::load_state_dict`] can load a part). NaN or infinite values are refused,
/// naming the tensor; [`load_state_dict_with`] can allow them.
pub fn load_state_dict(model: &dyn Module, path: impl AsRef<Path>) -> Result<()> {
    load_state_dict_with(model, path, LoadOptions::default())
}

/// [`load_state_dict`] with options.
pub fn load_state_dict_with(
    model: &dyn Module,
    path: impl AsRef<Path>,
    options: LoadOptions,
) -> Result<()> {
    let path = path.as_ref();
    let device = model
        .parameters()
        .first()
        .map_or(Device::Cpu, |p| p.device());
    let state = if is_pt_file(path) {
        // names and shapes checked from the file's structure before any tensor
        // is read onto the device
        let file = PtFile::open(path)?;
        let entries = file.entries()?;
        if entries.is_empty() {
            // no tensor ember reads: an object it does not build (a whole
            // model saved) is named as such, not as missing keys
            file.entries_strict()?;
        }
        let shapes: Vec<(&str, &[usize])> = entries
            .iter()
            .map(|e| (e.name.as_str(), e.shape.as_slice()))
            .collect();
        model.materialize_lazy(&shapes)?;
        crate::nn::check_state(
            &model.state_dict(),
            &shapes,
            true,
            &path.display().to_string(),
        )?;
        file.load_checked(&device, !options.allow_non_finite)?
    } else {
        // the same from the header, before any value is read
        let listed = list(path)?;
        let shapes: Vec<(&str, &[usize])> = listed
            .iter()
            .map(|t| (t.name.as_str(), t.shape.as_slice()))
            .collect();
        model.materialize_lazy(&shapes)?;
        crate::nn::check_state(
            &model.state_dict(),
            &shapes,
            true,
            &path.display().to_string(),
        )?;
        load_checked(path, &device, options.allow_non_finite)?
    };
    load_state_into(model, &state, &path.display().to_string())
}

/// Saves model parameters and buffers (`model.*`) and optimizer state (`optim.*`)
/// in one file, so training can resume exactly where it stopped.
pub fn save_checkpoint(
    model: &dyn Module,
    opt: &dyn Optimizer,
    path: impl AsRef<Path>,
) -> Result<()> {
    save_checkpoint_with(model, opt, &[], path)
}

/// [`save_checkpoint`] with extra entries of the caller's (`trial.*`: an epoch
/// count, a scheduler position...), returned by [`load_checkpoint`].
pub fn save_checkpoint_with(
    model: &dyn Module,
    opt: &dyn Optimizer,
    extra: &[(String, Tensor)],
    path: impl AsRef<Path>,
) -> Result<()> {
    save_checkpoint_full(model, opt, extra, &[], path)
}

/// The name of the first of `model`'s floating-point parameters or buffers
/// (batch norm's running statistics) that holds a NaN or an infinity, if any:
/// what [`load_checkpoint`] and [`load_state_dict`] would refuse by default. A
/// training loop checks it before it saves, so that a run that diverged keeps
/// its last good checkpoint rather than writing one that will not load. Reads
/// each tensor's check back to the host.
pub fn first_non_finite(model: &dyn Module) -> Result<Option<String>> {
    first_non_finite_of(model.state_dict())
}

/// [`first_non_finite`] of the model, then of the optimizer's state (named "the
/// optimizer's NAME"): what [`save_checkpoint`] would write and
/// [`load_checkpoint`] refuse. (A gradient past float32's range makes Adam's
/// second moment infinite while the parameters stay finite.)
pub fn first_non_finite_state(model: &dyn Module, opt: &dyn Optimizer) -> Result<Option<String>> {
    if let Some(name) = first_non_finite(model)? {
        return Ok(Some(name));
    }
    let state = opt.state()?.into_iter();
    first_non_finite_of(state.map(|(n, t)| (format!("the optimizer's {n}"), t)))
}

/// The name of the first of `entries` that holds a NaN or an infinity (float
/// tensors only), if any.
fn first_non_finite_of(
    entries: impl IntoIterator<Item = (String, Tensor)>,
) -> Result<Option<String>> {
    crate::autograd::no_grad(|| {
        for (name, p) in entries {
            if p.dtype().is_float() && p.numel() > 0 && !p.isfinite()?.all_all()?.item::<bool>()? {
                return Ok(Some(name));
            }
        }
        Ok(None)
    })
}

/// [`save_checkpoint_with`] plus string metadata (a run's configuration, which
/// [`metadata`] reads back).
pub fn save_checkpoint_full(
    model: &dyn Module,
    opt: &dyn Optimizer,
    extra: &[(String, Tensor)],
    metadata: &[(String, String)],
    path: impl AsRef<Path>,
) -> Result<()> {
    let prefixed = |p: &str, v: Vec<(String, Tensor)>| -> Vec<(String, Tensor)> {
        v.into_iter()
            .map(|(n, t)| (format!("{p}.{n}"), t))
            .collect()
    };
    let mut all = prefixed("model", model.state_dict());
    all.extend(prefixed("optim", opt.state()?));
    all.extend(prefixed("trial", extra.to_vec()));
    save_with_metadata(&all, metadata, path)
}

/// Restores a checkpoint written by [`save_checkpoint`] into a model and an
/// optimizer of the same architecture and kind, and returns the extra entries
/// (without their `trial.` prefix). On an error neither is changed. NaN or
/// infinite values are refused ([`load_checkpoint_with`] can allow them), and so
/// is an optimizer state with an entry missing.
pub fn load_checkpoint(
    model: &dyn Module,
    opt: &mut dyn Optimizer,
    path: impl AsRef<Path>,
) -> Result<Vec<(String, Tensor)>> {
    load_checkpoint_with(model, opt, path, LoadOptions::default())
}

/// [`load_checkpoint`] with options.
pub fn load_checkpoint_with(
    model: &dyn Module,
    opt: &mut dyn Optimizer,
    path: impl AsRef<Path>,
    options: LoadOptions,
) -> Result<Vec<(String, Tensor)>> {
    load_checkpoint_checked(model, opt, path.as_ref(), options, |_| Ok(())).map(|(e, ())| e)
}

/// [`load_checkpoint_with`] that first gives the extra entries to `check`,
/// before anything is changed: an error from it leaves the model and the
/// optimizer as they were. Returns the extra entries and what `check` made of
/// them.
pub(crate) fn load_checkpoint_checked<T>(
    model: &dyn Module,
    opt: &mut dyn Optimizer,
    path: &Path,
    options: LoadOptions,
    check: impl FnOnce(&[(String, Tensor)]) -> Result<T>,
) -> Result<(Vec<(String, Tensor)>, T)> {
    let device = model
        .parameters()
        .first()
        .map_or(Device::Cpu, |p| p.device());
    let all = load_checked(path, &device, options.allow_non_finite)?;
    let (mut params, mut state, mut extra) = (Vec::new(), Vec::new(), Vec::new());
    for (n, t) in all {
        if let Some(rest) = n.strip_prefix("model.") {
            params.push((rest.to_string(), t));
        } else if let Some(rest) = n.strip_prefix("optim.") {
            state.push((rest.to_string(), t));
        } else if let Some(rest) = n.strip_prefix("trial.") {
            extra.push((rest.to_string(), t));
        } else {
            return Err(Error::invalid(
                "load_checkpoint",
                format!("{}: unexpected entry {n:?}", path.display()),
            ));
        }
    }
    let checked = check(&extra)?;
    // the optimizer first (restored if anything fails), then the model, which
    // checks everything before it copies
    let before = opt.state()?;
    let loaded = opt
        .load_state(&state)
        .and_then(|()| load_state_into(model, &params, &path.display().to_string()));
    if let Err(e) = loaded {
        opt.load_state(&before)?;
        return Err(e);
    }
    Ok((extra, checked))
}
