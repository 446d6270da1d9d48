//! The part of Python's pickle format that `torch.save` writes, read as data.
//!
//! A pickle is a program for a small stack machine; Python runs it and calls any
//! function it names. This reader runs the same opcodes but calls nothing: a named
//! function (a "global") is kept as a name, and applying one builds a value only
//! for the few that mean data in a checkpoint (an `OrderedDict`, a tensor over a
//! storage, a parameter, bytes). Applying any other global gives an opaque object
//! that remembers the global's name, so a file that would run `os.system` in
//! Python loads here as an error naming `os.system` once that part is read.
//!
//! Every object lives in one arena and is referred to by index, so shared and
//! self-referring objects (which pickles can express) cost nothing to hold and
//! cannot make a drop recurse. Lengths are checked against the bytes left before
//! anything is allocated: memory stays proportional to the pickle's size.

use std::collections::HashMap;
use std::sync::Arc;

/// An index into [`Pickle::objects`].
pub(crate) type ObjId = usize;

/// A value on the machine's stack or in a container.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// An integer wider than 64 bits: its little-endian two's-complement bytes.
    BigInt(Arc<[u8]>),
    Float(f64),
    Str(Arc<str>),
    Bytes(Arc<[u8]>),
    Obj(ObjId),
}

/// A storage named by a persistent id: `('storage', torch.FloatStorage, key,
/// location, numel)`; the bytes themselves are in the file beside the pickle.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct StorageRef {
    /// The storage class's name (`FloatStorage`).
    pub class: Arc<str>,
    pub key: Arc<str>,
    pub location: Arc<str>,
    pub numel: u64,
}

/// A tensor as `torch._utils._rebuild_tensor_v2` describes it: a view of a
/// storage (sizes and strides in elements).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TensorRef {
    /// The storage: an [`Obj::Storage`].
    pub storage: ObjId,
    pub offset: u64,
    pub shape: Vec<u64>,
    pub stride: Vec<u64>,
    /// The dtype's name (`uint16`) when the tensor names it rather than its
    /// storage's class (`_rebuild_tensor_v3`, over an untyped storage whose
    /// length is in bytes).
    pub dtype: Option<Arc<str>>,
}

/// What an arena slot holds.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Obj {
    List(Vec<Value>),
    Tuple(Vec<Value>),
    /// A dict or an `OrderedDict`, in insertion order; a key set twice appears
    /// twice (the later one is the value, as in Python).
    Dict(Vec<(Value, Value)>),
    Set(Vec<Value>),
    /// `module.name`, not applied.
    Global(Arc<str>),
    Storage(StorageRef),
    Tensor(TensorRef),
    /// The result of applying a global this reader does not build (or of applying
    /// something that is not a global): never evaluated, only named.
    Opaque(Arc<str>),
}

/// A parsed pickle: its objects and the value it returned.
#[derive(Debug)]
pub(crate) struct Pickle {
    pub objects: Vec<Obj>,
    pub root: Value,
}

/// A failure to read a pickle, with the byte offset of the opcode.
#[derive(Debug, PartialEq)]
pub(crate) struct PickleError {
    pub at: usize,
    pub msg: String,
}

impl PickleError {
    /// Whether the pickle only ended too soon (more bytes might complete it).
    pub fn is_truncated(&self) -> bool {
        self.msg.starts_with("the pickle ends")
    }
}

type Res<T> = std::result::Result<T, PickleError>;

mod build;

struct Machine<'a> {
    data: &'a [u8],
    pos: usize,
    /// Where the current opcode started (for errors).
    op_at: usize,
    stack: Vec<Value>,
    /// The stack's length at each MARK, innermost last.
    marks: Vec<usize>,
    memo: HashMap<u64, Value>,
    objects: Vec<Obj>,
    /// Items copied by calls so far (an OrderedDict made from a list copies its
    /// pairs): at most the pickle's length, so that a list called on again and
    /// again through the memo costs no more than the file.
    copied: usize,
}

/// Reads one pickle from the start of `data`; returns it and the number of bytes
/// it took (the STOP opcode included), so that several pickles written one after
/// another (PyTorch's legacy format) can be read in turn.
pub(crate) fn parse(data: &[u8]) -> Res<(Pickle, usize)> {
    let mut m = Machine {
        data,
        pos: 0,
        op_at: 0,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: HashMap::new(),
        objects: Vec::new(),
        copied: 0,
    };
    let root = m.run()?;
    Ok((
        Pickle {
            objects: m.objects,
            root,
        },
        m.pos,
    ))
}

impl Machine<'_> {
    fn err<T>(&self, msg: impl Into<String>) -> Res<T> {
        Err(PickleError {
            at: self.op_at,
            msg: msg.into(),
        })
    }

    fn take(&mut self, n: u64) -> Res<&[u8]> {
        let left = (self.data.len() - self.pos) as u64;
        if n > left {
            return self.err(format!(
                "the pickle ends early: {n} bytes needed, {left} left"
            ));
        }
        let n = n as usize;
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn u8(&mut self) -> Res<u8> {
        Ok(self.take(1)?[0])
    }

    fn le<const N: usize>(&mut self) -> Res<[u8; N]> {
        let mut b = [0u8; N];
        b.copy_from_slice(self.take(N as u64)?);
        Ok(b)
    }

    /// A text line (protocol 0 arguments), without its newline.
    fn line(&mut self) -> Res<&str> {
        let rest = &self.data[self.pos..];
        let Some(n) = rest.iter().position(|&b| b == b'\n') else {
            return self.err("the pickle ends inside a text argument");
        };
        let s = std::str::from_utf8(&rest[..n]).map_err(|_| PickleError {
            at: self.op_at,
            msg: "a text argument is not UTF-8".into(),
        })?;
        self.pos += n + 1;
        Ok(s)
    }

    fn new_obj(&mut self, o: Obj) -> Value {
        self.objects.push(o);
        Value::Obj(self.objects.len() - 1)
    }

    fn push(&mut self, v: Value) {
        self.stack.push(v);
    }

    /// The stack's length above the innermost mark's (values below it belong to
    /// an outer level).
    fn floor(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    fn pop(&mut self) -> Res<Value> {
        if self.stack.len() <= self.floor() {
            return self.err("a value was expected on the stack, found a mark or nothing");
        }
        Ok(self.stack.pop().expect("the stack is above its floor"))
    }

    fn top(&self) -> Res<&Value> {
        match self.stack.last() {
            Some(v) if self.stack.len() > self.floor() => Ok(v),
            _ => self.err("a value was expected on the stack"),
        }
    }

    /// The values above the innermost mark, removing them and the mark.
    fn pop_mark(&mut self) -> Res<Vec<Value>> {
        let Some(at) = self.marks.pop() else {
            return self.err("no mark on the stack");
        };
        Ok(self.stack.split_off(at))
    }

    fn string(&mut self, n: u64) -> Res<Value> {
        let b = self.take(n)?;
        match std::str::from_utf8(b) {
            Ok(s) => Ok(Value::Str(s.into())),
            Err(_) => self.err("a string is not valid UTF-8"),
        }
    }

    fn bytes(&mut self, n: u64) -> Res<Value> {
        Ok(Value::Bytes(self.take(n)?.into()))
    }

    /// Python 2 `str` (BINSTRING): bytes, read as Latin-1 text.
    fn latin1(&mut self, n: u64) -> Res<Value> {
        let b = self.take(n)?;
        Ok(Value::Str(
            b.iter().map(|&c| c as char).collect::<String>().into(),
        ))
    }

    fn long(&mut self, n: u64) -> Res<Value> {
        let b = self.take(n)?;
        if b.len() <= 8 {
            let mut v: i64 = 0;
            for (i, &byte) in b.iter().enumerate() {
                v |= (byte as i64) << (8 * i);
            }
            // sign-extend from the last byte
            if let Some(&last) = b.last() {
                if b.len() < 8 && last & 0x80 != 0 {
                    v |= -1i64 << (8 * b.len());
                }
            }
            Ok(Value::Int(v))
        } else {
            Ok(Value::BigInt(b.into()))
        }
    }

    fn memo_put(&mut self, key: u64) -> Res<()> {
        let v = self.top()?.clone();
        self.memo.insert(key, v);
        Ok(())
    }

    fn memo_get(&mut self, key: u64) -> Res<()> {
        match self.memo.get(&key) {
            Some(v) => {
                let v = v.clone();
                self.push(v);
                Ok(())
            }
            None => self.err(format!("memo entry {key} is read before it is written")),
        }
    }

    fn container(&self, v: &Value) -> Res<ObjId> {
        match v {
            Value::Obj(id) => Ok(*id),
            other => self.err(format!("{other:?} is not a container")),
        }
    }

    fn append(&mut self, items: Vec<Value>) -> Res<()> {
        let id = self.container(self.top()?)?;
        match &mut self.objects[id] {
            Obj::List(v) => {
                v.extend(items);
                Ok(())
            }
            Obj::Opaque(_) => Ok(()), // an unknown list-like object: its items are not kept
            _ => self.err("APPEND to something that is not a list"),
        }
    }

    fn set_items(&mut self, items: Vec<Value>) -> Res<()> {
        if !items.len().is_multiple_of(2) {
            return self.err("SETITEMS with an odd number of values");
        }
        let id = self.container(self.top()?)?;
        match &mut self.objects[id] {
            Obj::Dict(d) => {
                // a repeated key is kept twice here; whoever reads the dict
                // lets the later one win, as Python does
                let mut it = items.into_iter();
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    d.push((k, v));
                }
                Ok(())
            }
            Obj::Opaque(_) => Ok(()),
            _ => self.err("SETITEM on something that is not a dict"),
        }
    }

    fn run(&mut self) -> Res<Value> {
        loop {
            self.op_at = self.pos;
            let op = match self.data.get(self.pos) {
                Some(&op) => op,
                None => return self.err("the pickle ends without a STOP opcode"),
            };
            self.pos += 1;
            match op {
                0x80 => {
                    let proto = self.u8()?;
                    if proto > 5 {
                        return self.err(format!("pickle protocol {proto} (5 is the newest)"));
                    }
                }
                0x95 => {
                    self.le::<8>()?; // FRAME: a length hint
                }
                b'.' => return self.pop(),
                b'(' => self.marks.push(self.stack.len()),
                b'0' => {
                    // POP takes the innermost mark when nothing is above it
                    if self.stack.len() > self.floor() {
                        self.stack.pop();
                    } else if self.marks.pop().is_none() {
                        return self.err("POP on an empty stack");
                    }
                }
                b'1' => {
                    self.pop_mark()?;
                }
                b'2' => {
                    let v = self.top()?.clone();
                    self.push(v);
                }
                b'N' => self.push(Value::None),
                0x88 => self.push(Value::Bool(true)),
                0x89 => self.push(Value::Bool(false)),
                b'J' => {
                    let v = i32::from_le_bytes(self.le()?);
                    self.push(Value::Int(v as i64));
                }
                b'K' => {
                    let v = self.u8()?;
                    self.push(Value::Int(v as i64));
                }
                b'M' => {
                    let v = u16::from_le_bytes(self.le()?);
                    self.push(Value::Int(v as i64));
                }
                0x8a => {
                    let n = self.u8()? as u64;
                    let v = self.long(n)?;
                    self.push(v);
                }
                0x8b => {
                    let n = i32::from_le_bytes(self.le()?);
                    if n < 0 {
                        return self.err("LONG4 with a negative length");
                    }
                    let v = self.long(n as u64)?;
                    self.push(v);
                }
                b'G' => {
                    let v = f64::from_be_bytes(self.le()?);
                    self.push(Value::Float(v));
                }
                b'I' => {
                    let text = self.line()?.trim().to_string();
                    let v = match text.as_str() {
                        "00" => Value::Bool(false),
                        "01" => Value::Bool(true),
                        s => match s.parse::<i64>() {
                            Ok(i) => Value::Int(i),
                            Err(_) => return self.err(format!("INT {s:?} is not an integer")),
                        },
                    };
                    self.push(v);
                }
                b'L' => {
                    let s = self.line()?.trim().trim_end_matches('L').to_string();
                    let v = match s.parse::<i64>() {
                        Ok(i) => Value::Int(i),
                        Err(_) => match decimal_bytes(&s) {
                            Some(b) => Value::BigInt(b.into()),
                            None => return self.err(format!("LONG {s:?} is not an integer")),
                        },
                    };
                    self.push(v);
                }
                b'F' => {
                    let s = self.line()?.trim().to_string();
                    match s.parse::<f64>() {
                        Ok(f) => self.push(Value::Float(f)),
                        Err(_) => return self.err(format!("FLOAT {s:?} is not a number")),
                    }
                }
                b'X' => {
                    let n = u32::from_le_bytes(self.le()?) as u64;
                    let v = self.string(n)?;
                    self.push(v);
                }
                0x8c => {
                    let n = self.u8()? as u64;
                    let v = self.string(n)?;
                    self.push(v);
                }
                0x8d => {
                    let n = u64::from_le_bytes(self.le()?);
                    let v = self.string(n)?;
                    self.push(v);
                }
                b'T' => {
                    let n = i32::from_le_bytes(self.le()?);
                    if n < 0 {
                        return self.err("BINSTRING with a negative length");
                    }
                    let v = self.latin1(n as u64)?;
                    self.push(v);
                }
                b'U' => {
                    let n = self.u8()? as u64;
                    let v = self.latin1(n)?;
                    self.push(v);
                }
                b'B' => {
                    let n = u32::from_le_bytes(self.le()?) as u64;
                    let v = self.bytes(n)?;
                    self.push(v);
                }
                b'C' => {
                    let n = self.u8()? as u64;
                    let v = self.bytes(n)?;
                    self.push(v);
                }
                0x8e | 0x96 => {
                    let n = u64::from_le_bytes(self.le()?);
                    let v = self.bytes(n)?;
                    self.push(v);
                }
                b']' => {
                    let v = self.new_obj(Obj::List(Vec::new()));
                    self.push(v);
                }
                b')' => {
                    let v = self.new_obj(Obj::Tuple(Vec::new()));
                    self.push(v);
                }
                b'}' => {
                    let v = self.new_obj(Obj::Dict(Vec::new()));
                    self.push(v);
                }
                0x8f => {
                    let v = self.new_obj(Obj::Set(Vec::new()));
                    self.push(v);
                }
                b't' => {
                    let items = self.pop_mark()?;
                    let v = self.new_obj(Obj::Tuple(items));
                    self.push(v);
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    let mut items = Vec::with_capacity(n);
                    for _ in 0..n {
                        items.push(self.pop()?);
                    }
                    items.reverse();
                    let v = self.new_obj(Obj::Tuple(items));
                    self.push(v);
                }
                b'l' => {
                    let items = self.pop_mark()?;
                    let v = self.new_obj(Obj::List(items));
                    self.push(v);
                }
                b'd' => {
                    let items = self.pop_mark()?;
                    let v = self.new_obj(Obj::Dict(Vec::new()));
                    self.push(v);
                    self.set_items(items)?;
                }
                0x91 => {
                    let items = self.pop_mark()?;
                    let v = self.new_obj(Obj::Set(items));
                    self.push(v);
                }
                b'a' => {
                    let v = self.pop()?;
                    self.append(vec![v])?;
                }
                b'e' => {
                    let items = self.pop_mark()?;
                    self.append(items)?;
                }
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    self.set_items(vec![k, v])?;
                }
                b'u' => {
                    let items = self.pop_mark()?;
                    self.set_items(items)?;
                }
                0x90 => {
                    let items = self.pop_mark()?;
                    let id = self.container(self.top()?)?;
                    match &mut self.objects[id] {
                        Obj::Set(s) => s.extend(items),
                        _ => return self.err("ADDITEMS to something that is not a set"),
                    }
                }
                b'c' => {
                    // protocol 2 writes Python 2's module names where Python 3
                    // renamed them; Python reads them back under the new ones
                    let module = match self.line()? {
                        "__builtin__" => "builtins".to_string(),
                        "copy_reg" => "copyreg".to_string(),
                        m => m.to_string(),
                    };
                    let name = self.line()?.to_string();
                    let v = self.new_obj(Obj::Global(format!("{module}.{name}").into()));
                    self.push(v);
                }
                0x93 => {
                    let name = self.pop()?;
                    let module = self.pop()?;
                    let (Value::Str(module), Value::Str(name)) = (module, name) else {
                        return self.err("STACK_GLOBAL with names that are not strings");
                    };
                    let v = self.new_obj(Obj::Global(format!("{module}.{name}").into()));
                    self.push(v);
                }
                b'R' | 0x81 => {
                    let args = self.pop()?;
                    let callable = self.pop()?;
                    let v = self.apply(callable, args)?;
                    self.push(v);
                }
                0x92 => {
                    let _kwargs = self.pop()?;
                    let args = self.pop()?;
                    let class = self.pop()?;
                    let v = self.apply(class, args)?;
                    self.push(v);
                }
                b'b' => {
                    // BUILD: sets an object's state. The dicts and tensors built
                    // here keep theirs (a state dict's `_metadata`, a parameter's
                    // hooks); an opaque object stays opaque.
                    self.pop()?;
                    self.top()?;
                }
                b'Q' => {
                    let pid = self.pop()?;
                    let v = self.persistent(pid)?;
                    self.push(v);
                }
                b'P' => {
                    let pid = self.line()?.to_string();
                    return self.err(format!("a text persistent id ({pid:?}): not a torch.save file"));
                }
                b'q' => {
                    let k = self.u8()? as u64;
                    self.memo_put(k)?;
                }
                b'r' => {
                    let k = u32::from_le_bytes(self.le()?) as u64;
                    self.memo_put(k)?;
                }
                b'p' => {
                    let s = self.line()?.trim().to_string();
                    let Ok(k) = s.parse::<u64>() else {
                        return self.err(format!("PUT {s:?} is not an index"));
                    };
                    self.memo_put(k)?;
                }
                0x94 => {
                    let k = self.memo.len() as u64;
                    self.memo_put(k)?;
                }
                b'h' => {
                    let k = self.u8()? as u64;
                    self.memo_get(k)?;
                }
                b'j' => {
                    let k = u32::from_le_bytes(self.le()?) as u64;
                    self.memo_get(k)?;
                }
                b'g' => {
                    let s = self.line()?.trim().to_string();
                    let Ok(k) = s.parse::<u64>() else {
                        return self.err(format!("GET {s:?} is not an index"));
                    };
                    self.memo_get(k)?;
                }
                other => {
                    return self.err(format!(
                        "opcode 0x{other:02x} is not one torch.save writes (not a PyTorch file, or damaged)"
                    ))
                }
            }
        }
    }
}

/// A non-negative decimal integer's little-endian two's-complement bytes, as
/// LONG1 would hold it (a zero byte on top when the highest bit is set).
fn decimal_bytes(s: &str) -> Option<Vec<u8>> {
    if s.is_empty() || s.len() > 4096 || !s.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let mut out: Vec<u8> = vec![0];
    for c in s.bytes() {
        let mut carry = u32::from(c - b'0');
        for b in out.iter_mut() {
            let v = u32::from(*b) * 10 + carry;
            *b = v as u8;
            carry = v >> 8;
        }
        while carry > 0 {
            out.push(carry as u8);
            carry >>= 8;
        }
    }
    while out.len() > 1 && out[out.len() - 1] == 0 && out[out.len() - 2] & 0x80 == 0 {
        out.pop();
    }
    if out[out.len() - 1] & 0x80 != 0 {
        out.push(0);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(bytes: &[u8]) -> Res<Pickle> {
        parse(bytes).map(|(p, _)| p)
    }

    #[test]
    fn small_values() {
        // {'a': [1, -2, 3.5, None, True], 'b': (b'xy', 'é')} as protocol 2 writes it
        let p = run(b"\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01]q\x02(K\x01J\xfe\xff\xff\xffG@\x0c\x00\x00\x00\x00\x00\x00N\x88eX\x01\x00\x00\x00bq\x03C\x02xyX\x02\x00\x00\x00\xc3\xa9\x86q\x04u.").unwrap();
        let Value::Obj(root) = p.root else { panic!() };
        let Obj::Dict(d) = &p.objects[root] else {
            panic!()
        };
        assert_eq!(d[0].0, Value::Str("a".into()));
        let Value::Obj(list) = d[0].1 else { panic!() };
        assert_eq!(
            p.objects[list],
            Obj::List(vec![
                Value::Int(1),
                Value::Int(-2),
                Value::Float(3.5),
                Value::None,
                Value::Bool(true)
            ])
        );
        let Value::Obj(t) = d[1].1 else { panic!() };
        assert_eq!(
            p.objects[t],
            Obj::Tuple(vec![Value::Bytes(b"xy"[..].into()), Value::Str("é".into())])
        );
    }

    #[test]
    fn longs_sign_extend() {
        for (bytes, want) in [
            (&b"\x80\x02\x8a\x01\xff."[..], -1i64),
            (b"\x80\x02\x8a\x02\x00\x80.", -32768),
            (b"\x80\x02\x8a\x03\x00\x80\x00.", 32768),
            (b"\x80\x02\x8a\x00.", 0),
            (
                b"\x80\x02\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f.",
                i64::MAX,
            ),
        ] {
            assert_eq!(run(bytes).unwrap().root, Value::Int(want));
        }
    }

    #[test]
    fn text_longs_as_wide_as_they_come() {
        // the legacy format's magic number, as protocol 1 writes it
        let p = run(b"L119547037146038801333356L\n.").unwrap();
        assert_eq!(
            p.root,
            Value::BigInt(vec![0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19].into())
        );
        assert_eq!(decimal_bytes("255"), Some(vec![0xff, 0]));
        assert_eq!(decimal_bytes("0"), Some(vec![0]));
        assert_eq!(decimal_bytes("-1"), None);
    }

    #[test]
    fn calls_nothing() {
        // os.system('echo hi'): the global is kept as a name, the call as opaque
        let p = run(b"\x80\x02cos\nsystem\nq\x00X\x07\x00\x00\x00echo hiq\x01\x85q\x02Rq\x03.")
            .unwrap();
        let Value::Obj(id) = p.root else { panic!() };
        assert_eq!(p.objects[id], Obj::Opaque("os.system".into()));
    }

    #[test]
    fn refuses_damage_without_panicking() {
        for bad in [
            &b""[..],
            b"\x80\x02",                      // no STOP
            b"\x80\x02X\xff\xff\xff\x7f.",    // a string longer than the pickle
            b"\x80\x02h\x05.",                // memo read before written
            b"\x80\x02e.",                    // APPENDS without a mark
            b"\x80\x02K\x01K\x02s.",          // SETITEM on an int
            b"\x80\x09.",                     // unknown protocol
            b"\x80\x02\xff.",                 // unknown opcode
            b"\x80\x02\x8b\xff\xff\xff\xff.", // negative LONG4 length
        ] {
            assert!(run(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_list_holding_itself_is_harmless() {
        // l = []; l.append(l)
        let p = run(b"\x80\x02]q\x00h\x00a.").unwrap();
        let Value::Obj(id) = p.root else { panic!() };
        assert_eq!(p.objects[id], Obj::List(vec![Value::Obj(id)]));
    }
}
