//! What applying a global builds (`REDUCE`, `NEWOBJ`): the few functions that
//! mean data in a checkpoint (an `OrderedDict`, a tensor over a storage, a
//! parameter, bytes, a `torch.Size`), and the persistent ids naming storages.
//! Everything else stays an opaque object named by its global.

use super::{Machine, Obj, Res, StorageRef, TensorRef, Value};
use std::sync::Arc;

/// The globals that build values when applied (`REDUCE`); any other applied
/// global becomes [`Obj::Opaque`].
const REBUILD_TENSOR_V2: &str = "torch._utils._rebuild_tensor_v2";
const REBUILD_TENSOR: &str = "torch._utils._rebuild_tensor";
const REBUILD_PARAMETER: &str = "torch._utils._rebuild_parameter";
const REBUILD_PARAMETER_STATE: &str = "torch._utils._rebuild_parameter_with_state";
const REBUILD_FROM_TYPE_V2: &str = "torch._tensor._rebuild_from_type_v2";
const REBUILD_TENSOR_V3: &str = "torch._utils._rebuild_tensor_v3";
const ORDERED_DICT: &str = "collections.OrderedDict";
const CODECS_ENCODE: &str = "_codecs.encode";
const BYTES: &str = "builtins.bytes";
const TORCH_SIZE: &str = "torch.Size";
const TORCH_DEVICE: &str = "torch.device";

/// Every global [`Machine::apply`] builds a value for.
const BUILDERS: [&str; 11] = [
    REBUILD_TENSOR_V2,
    REBUILD_TENSOR,
    REBUILD_TENSOR_V3,
    REBUILD_PARAMETER,
    REBUILD_PARAMETER_STATE,
    REBUILD_FROM_TYPE_V2,
    ORDERED_DICT,
    CODECS_ENCODE,
    BYTES,
    TORCH_SIZE,
    TORCH_DEVICE,
];

/// The builders take at most this many arguments; a longer tuple is not theirs.
const MAX_ARGS: usize = 8;

/// The most dimensions a tensor may have.
pub(crate) const MAX_DIMS: usize = 64;

/// The classes `_rebuild_from_type_v2` may turn a tensor into and stay a tensor.
const TENSOR_TYPES: [&str; 2] = ["torch.nn.parameter.Parameter", "torch.Tensor"];

impl Machine<'_> {
    pub(super) fn global_name(&self, v: &Value) -> Option<Arc<str>> {
        match v {
            Value::Obj(id) => match &self.objects[*id] {
                Obj::Global(name) => Some(name.clone()),
                _ => None,
            },
            _ => None,
        }
    }

    /// The items of a tuple (or, for a persistent id, a list), cloned: only for
    /// the few small argument tuples the builders read.
    fn tuple_items(&self, v: &Value) -> Res<Vec<Value>> {
        match v {
            Value::Obj(id) => match &self.objects[*id] {
                Obj::Tuple(items) | Obj::List(items) if items.len() <= MAX_ARGS => {
                    Ok(items.clone())
                }
                _ => self.err("arguments that are not a short tuple"),
            },
            _ => self.err("arguments that are not a tuple"),
        }
    }

    fn int_arg(&self, v: &Value, what: &str, f: &str) -> Res<u64> {
        match v {
            Value::Int(i) if *i >= 0 => Ok(*i as u64),
            other => self.err(format!(
                "{f}: the {what} should be a non-negative integer, found {other:?}"
            )),
        }
    }

    /// A tuple of non-negative integers (sizes, strides), at most [`MAX_DIMS`].
    fn ints_arg(&self, v: &Value, what: &str, f: &str) -> Res<Vec<u64>> {
        let items = match v {
            Value::Obj(id) => match &self.objects[*id] {
                Obj::Tuple(items) => items,
                _ => return self.err(format!("{f}: the {what} is not a tuple")),
            },
            _ => return self.err(format!("{f}: the {what} is not a tuple")),
        };
        if items.len() > MAX_DIMS {
            return self.err(format!(
                "{f}: {} dimensions (at most {MAX_DIMS})",
                items.len()
            ));
        }
        items.iter().map(|x| self.int_arg(x, what, f)).collect()
    }

    /// `torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)` (and
    /// `_v3`, whose seventh argument is the dtype, over an untyped storage).
    fn rebuild_tensor(&mut self, f: &str, args: &[Value]) -> Res<Value> {
        if args.len() < 4 {
            return self.err(format!(
                "{f} with {} arguments (4 or more expected)",
                args.len()
            ));
        }
        let storage = match &args[0] {
            Value::Obj(id) if matches!(self.objects[*id], Obj::Storage(_)) => *id,
            other => return self.err(format!("{f}: {other:?} is not a storage")),
        };
        let offset = self.int_arg(&args[1], "storage offset", f)?;
        let shape = self.ints_arg(&args[2], "size", f)?;
        let stride = self.ints_arg(&args[3], "stride", f)?;
        if shape.len() != stride.len() {
            return self.err(format!(
                "{f}: {} sizes but {} strides",
                shape.len(),
                stride.len()
            ));
        }
        let dtype = if f == REBUILD_TENSOR_V3 {
            match args.get(6).and_then(|d| self.global_name(d)) {
                Some(d) => Some(d.strip_prefix("torch.").unwrap_or(&d).into()),
                None => return self.err(format!("{f}: the seventh argument is not a dtype")),
            }
        } else {
            None
        };
        Ok(self.new_obj(Obj::Tensor(TensorRef {
            storage,
            offset,
            shape,
            stride,
            dtype,
        })))
    }

    /// REDUCE / NEWOBJ: `callable(*args)`, built only for the globals that mean
    /// data; anything else is an opaque object named by its global (its
    /// arguments are not even looked at).
    pub(super) fn apply(&mut self, callable: Value, args: Value) -> Res<Value> {
        let Some(name) = self.global_name(&callable) else {
            return Ok(self.new_obj(Obj::Opaque("<the result of a call>".into())));
        };
        if !BUILDERS.contains(&&*name) {
            return Ok(self.new_obj(Obj::Opaque(name)));
        }
        let args = match self.tuple_items(&args) {
            Ok(a) => a,
            Err(_) => return Ok(self.new_obj(Obj::Opaque(name))),
        };
        let is_tensor = |m: &Self, v: &Value| matches!(v, Value::Obj(id) if matches!(m.objects[*id], Obj::Tensor(_)));
        match (&*name, args.as_slice()) {
            (ORDERED_DICT, []) => Ok(self.new_obj(Obj::Dict(Vec::new()))),
            // Python 2's pickles give an OrderedDict its items as a list of pairs
            (ORDERED_DICT, [items]) => {
                let list = match items {
                    Value::Obj(id) => match &self.objects[*id] {
                        Obj::List(p) | Obj::Tuple(p) => p,
                        _ => return Ok(self.new_obj(Obj::Opaque(name))),
                    },
                    _ => return Ok(self.new_obj(Obj::Opaque(name))),
                };
                // (counted before the copy)
                let copied = self.copied.saturating_add(list.len());
                if copied > self.data.len() {
                    return self.err(
                        "calls copy more items than the pickle holds (one list made an \
                         OrderedDict over and over)",
                    );
                }
                let pairs = list.clone();
                self.copied = copied;
                let mut d = Vec::with_capacity(pairs.len());
                for pair in pairs {
                    match pair {
                        Value::Obj(id) => match &self.objects[id] {
                            Obj::List(kv) | Obj::Tuple(kv) if kv.len() == 2 => {
                                d.push((kv[0].clone(), kv[1].clone()))
                            }
                            _ => return self.err("OrderedDict items that are not pairs"),
                        },
                        _ => return self.err("OrderedDict items that are not pairs"),
                    }
                }
                Ok(self.new_obj(Obj::Dict(d)))
            }
            (REBUILD_TENSOR_V2 | REBUILD_TENSOR | REBUILD_TENSOR_V3, _) => {
                self.rebuild_tensor(&name, &args)
            }
            (REBUILD_PARAMETER | REBUILD_PARAMETER_STATE, [t, ..]) if is_tensor(self, t) => {
                Ok(t.clone())
            }
            // (func, new_type, args, state): a tensor rebuilt by func, given a class
            (REBUILD_FROM_TYPE_V2, [func, class, inner, ..]) => {
                let func = self.global_name(func);
                let class = self.global_name(class);
                match (func.as_deref(), class) {
                    (
                        Some(f @ (REBUILD_TENSOR_V2 | REBUILD_TENSOR | REBUILD_TENSOR_V3)),
                        Some(c),
                    ) if TENSOR_TYPES.contains(&&*c) => {
                        let f = f.to_string();
                        match self.tuple_items(inner) {
                            Ok(inner) => self.rebuild_tensor(&f, &inner),
                            Err(_) => Ok(self.new_obj(Obj::Opaque(name))),
                        }
                    }
                    (_, Some(c)) => Ok(self.new_obj(Obj::Opaque(c))),
                    _ => Ok(self.new_obj(Obj::Opaque(name))),
                }
            }
            (CODECS_ENCODE, [Value::Str(s), Value::Str(enc)]) if &**enc == "latin1" => {
                let mut out = Vec::with_capacity(s.len());
                for c in s.chars() {
                    match u8::try_from(u32::from(c)) {
                        Ok(b) => out.push(b),
                        Err(_) => return self.err("_codecs.encode: a character past Latin-1"),
                    }
                }
                Ok(Value::Bytes(out.into()))
            }
            (CODECS_ENCODE, [Value::Str(s), Value::Str(enc)])
                if &**enc == "utf-8" || &**enc == "utf8" =>
            {
                Ok(Value::Bytes(s.as_bytes().into()))
            }
            (BYTES, []) => Ok(Value::Bytes(Vec::new().into())),
            (TORCH_SIZE, [dims]) if self.ints_arg(dims, "size", &name).is_ok() => Ok(dims.clone()),
            (TORCH_DEVICE, [Value::Str(kind)]) => Ok(Value::Str(kind.clone())),
            (TORCH_DEVICE, [Value::Str(kind), Value::Int(i)]) => {
                Ok(Value::Str(format!("{kind}:{i}").into()))
            }
            _ => Ok(self.new_obj(Obj::Opaque(name))),
        }
    }

    /// BINPERSID: the id of a storage kept outside the pickle.
    pub(super) fn persistent(&mut self, pid: Value) -> Res<Value> {
        let items = match self.tuple_items(&pid) {
            Ok(items) => items,
            Err(_) => return self.err(format!("a persistent id that is not a tuple: {pid:?}")),
        };
        let bad = || format!("a persistent id this reader does not know: {items:?}");
        match items.as_slice() {
            [Value::Str(kind), class, Value::Str(key), Value::Str(location), Value::Int(numel), rest @ ..]
                if &**kind == "storage" && *numel >= 0 =>
            {
                // old PyTorch's legacy files could name a view of another storage
                if rest.first().is_some_and(|v| *v != Value::None) {
                    return self.err(format!(
                        "storage {key:?} is a view of another storage (view_metadata {:?}), \
                         which only PyTorch before 1.0 wrote; load and save it again with a \
                         newer PyTorch",
                        rest[0]
                    ));
                }
                let Some(class) = self.global_name(class) else {
                    return self.err(bad());
                };
                let class = class.rsplit('.').next().unwrap_or("").into();
                let storage = StorageRef {
                    class,
                    key: key.clone(),
                    location: location.clone(),
                    numel: *numel as u64,
                };
                Ok(self.new_obj(Obj::Storage(storage)))
            }
            _ => self.err(bad()),
        }
    }
}
