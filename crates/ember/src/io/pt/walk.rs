//! The saved object walked into named leaves: tensors (checked against their
//! storages) and other values, with the limits a crafted file meets.

use super::archive::bad_file;
use super::pickle::{Obj, TensorRef, Value};
use super::*;

/// A walk's settings and what it has found so far.
pub(super) struct Walk<'a> {
    strict: bool,
    /// Bytes of names and texts that may still be made.
    text_budget: usize,
    /// Visits left (see [`PtFile::walk`]).
    budget: &'a mut usize,
    names: &'a mut HashSet<String>,
    out: &'a mut Vec<(String, Leaf)>,
}

/// What a walk over the saved object finds at a leaf.
pub(super) enum Leaf {
    Tensor(TensorRef),
    Other(String),
}

/// A dict key as a name part: strings as they are, integers in decimal (an
/// optimizer's state is keyed by parameter index).
pub(super) fn key_text(k: &Value) -> Option<String> {
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

impl PtFile {
    pub(super) fn entry(&self, name: String, t: &TensorRef) -> Result<PtEntry> {
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
    pub(super) fn walk(&self, strict: bool) -> Result<Vec<(String, Leaf)>> {
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

    pub(super) fn walk_into(
        &self,
        v: &Value,
        name: String,
        depth: usize,
        w: &mut Walk,
    ) -> Result<()> {
        let path = &self.path;
        if depth > MAX_DEPTH {
            // (the name's start only: a deep name can be long)
            let start: String = name.chars().take(80).collect();
            return Err(bad_file(
                path,
                format!(
                    "{start:?}...: containers nest more than {MAX_DEPTH} deep (or hold themselves)"
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
        // a child's name, charged to the text budget as it is made (a long key
        // nested deep would otherwise hold a longer name at every level)
        let join = |w: &mut Walk, k: &str| -> Result<String> {
            let joined = if name.is_empty() {
                k.to_string()
            } else {
                format!("{name}.{k}")
            };
            w.text_budget = w.text_budget.checked_sub(joined.len()).ok_or_else(|| {
                bad_file(
                    path,
                    "the saved object's names would take many times the file's size to list \
                     (long names nested deep)",
                )
            })?;
            Ok(joined)
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
                            let child = join(w, &k)?;
                            self.walk_into(v, child, depth + 1, w)?;
                        }
                    }
                    Ok(())
                }
                Obj::List(items) | Obj::Tuple(items) => {
                    for (i, v) in items.iter().enumerate() {
                        let child = join(w, &i.to_string())?;
                        self.walk_into(v, child, depth + 1, w)?;
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

    pub(super) fn shown(&self, name: &str) -> String {
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

    pub(super) fn unknown_object(&self, name: &str, global: &str) -> Error {
        let hint = if global.starts_with("__torch__.") {
            " It is a TorchScript model (torch.jit.save, which torch.load hands to \
             torch.jit.load): save the model's state_dict() with torch.save instead."
                .to_string()
        } else if global.starts_with("torch.nn.") || global.starts_with("__main__.") {
            " It looks like a whole model was saved (torch.save(model)): save its \
             state_dict() instead, which holds only tensors."
                .to_string()
        } else if name.is_empty() && self.selected.is_empty() && !plain_data(global) {
            // a class of the user's package, saved whole
            " If it is a whole model (torch.save(model)), save its state_dict() \
             instead, which holds only tensors."
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
}

/// Whether `global` builds plain data (an array, a namespace, a container)
/// rather than an object of the user's classes: no model hint for those.
fn plain_data(global: &str) -> bool {
    ["numpy.", "builtins.", "argparse.", "collections.", "torch."]
        .iter()
        .any(|p| global.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
