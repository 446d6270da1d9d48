//! safetensors: `load`, `load_state_dict`, `load_checkpoint`.
use super::*;

/// Valid files to damage: several dtypes and shapes (empty and scalar
/// included), a state dict of a `Linear(3, 2)`, and a checkpoint of one with
/// Adam after a step.
fn safetensors_bases() -> &'static [Vec<u8>] {
    static BASES: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    BASES.get_or_init(|| {
        let dir = Scratch::new("bases");
        let dev = Device::Cpu;
        let p = dir.file("base.safetensors");
        let mut out = Vec::new();
        let f = Tensor::from_vec(
            (0..6).map(|i| i as f32 * 0.5 - 1.0).collect::<Vec<_>>(),
            [2, 3],
            &dev,
        )
        .unwrap();
        let tensors = vec![
            ("f32".to_string(), f.clone()),
            ("f64".to_string(), f.to_dtype(DType::F64).unwrap()),
            ("f16".to_string(), f.to_dtype(DType::F16).unwrap()),
            ("bf16".to_string(), f.to_dtype(DType::BF16).unwrap()),
            (
                "i64".to_string(),
                Tensor::from_vec(vec![-1i64, 0, 7], [3], &dev).unwrap(),
            ),
            (
                "u8".to_string(),
                Tensor::from_vec(vec![1u8, 2, 3, 4], [2, 1, 2], &dev).unwrap(),
            ),
            (
                "bool".to_string(),
                Tensor::from_vec(vec![true, false], [2], &dev).unwrap(),
            ),
            ("scalar".to_string(), Tensor::scalar(2.5f32, &dev).unwrap()),
            (
                "empty".to_string(),
                Tensor::from_vec(Vec::<f32>::new(), [0, 3], &dev).unwrap(),
            ),
        ];
        ember::io::save(&tensors, &p).unwrap();
        out.push(std::fs::read(&p).unwrap());
        let (model, opt) = checkpoint_model();
        ember::io::save_state_dict(&model, &p).unwrap();
        out.push(std::fs::read(&p).unwrap());
        ember::io::save_checkpoint(&model, &opt, &p).unwrap();
        out.push(std::fs::read(&p).unwrap());
        let extra = vec![("epoch".to_string(), Tensor::scalar(3i64, &dev).unwrap())];
        ember::io::save_checkpoint_with(&model, &opt, &extra, &p).unwrap();
        out.push(std::fs::read(&p).unwrap());
        out
    })
}

/// A `Linear(3, 2)` and its Adam optimizer after one step (so that the moment
/// buffers exist).
fn checkpoint_model() -> (nn::Linear, Adam) {
    let dev = Device::Cpu;
    let model = nn::Linear::new(3, 2, &dev).unwrap();
    let mut opt = Adam::new(model.parameters(), 0.01).unwrap();
    let x = Tensor::from_vec(vec![0.5f32, -1.0, 2.0, 1.0, 0.0, -0.5], [2, 3], &dev).unwrap();
    model
        .forward(&x)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    opt.step().unwrap();
    (model, opt)
}

/// A change to the JSON header of a safetensors file.
#[derive(Clone, Debug)]
enum Edit {
    Dtype(Index, String),
    Shape(Index, Vec<serde_json::Value>),
    Offsets(Index, Vec<serde_json::Value>),
    DropField(Index, Index),
    AddField(Index, String, serde_json::Value),
    Rename(Index, String),
    Duplicate(Index, String),
    Remove(Index),
    /// Sets (or with `None` removes) a metadata entry: a key of the file's or one
    /// made up.
    Meta(Option<Index>, String, Option<serde_json::Value>),
    DropMetadata,
    MetadataNotAMap(serde_json::Value),
}

/// How the header is framed: its length prefix and padding.
#[derive(Clone, Debug)]
enum Frame {
    Exact,
    LengthOff(i64),
    Length(u64),
    Spaces(u8),
    /// Data bytes added (positive) or cut (negative) at the end.
    DataOff(i16),
}

fn json_number() -> impl Strategy<Value = serde_json::Value> {
    prop_oneof![
        4 => (0u64..8).prop_map(serde_json::Value::from),
        1 => edgy_number().prop_map(serde_json::Value::from),
        1 => (-5i64..0).prop_map(serde_json::Value::from),
        1 => Just(serde_json::json!(1.5)),
        1 => Just(serde_json::json!("2")),
        1 => Just(serde_json::Value::Null),
    ]
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    prop_oneof![
        json_number(),
        "[a-zA-Z0-9_.]{0,8}".prop_map(serde_json::Value::from),
        prop::collection::vec(json_number(), 0..3).prop_map(serde_json::Value::from),
        Just(serde_json::json!({"a": 1})),
        any::<bool>().prop_map(serde_json::Value::from),
    ]
}

fn tensor_name() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9_.]{0,10}",
        prop::sample::select(vec![
            "",
            "__metadata__",
            "weight",
            "bias",
            "model.weight",
            "model.bias",
            "optim.lr",
            "optim.step",
            "optim.exp_avg.0",
            "optim.has_state",
            "trial.epoch",
            "crc32.weight",
        ])
        .prop_map(str::to_string),
    ]
}

fn edit() -> impl Strategy<Value = Edit> {
    let dtypes = vec![
        "F32", "F64", "F16", "BF16", "I64", "U8", "BOOL", "I8", "I16", "I32", "U16", "U32", "U64",
        "F8_E4M3", "F8_E5M2", "F4", "C64", "f32", "",
    ];
    let meta_value = prop_oneof![
        3 => "[0-9a-f]{8}".prop_map(serde_json::Value::from),
        1 => "[0-9a-zA-Z ]{0,10}".prop_map(serde_json::Value::from),
        1 => json_value(),
    ];
    prop_oneof![
        2 => (any::<Index>(), prop::sample::select(dtypes).prop_map(str::to_string))
            .prop_map(|(i, d)| Edit::Dtype(i, d)),
        2 => (any::<Index>(), prop::collection::vec(json_number(), 0..5))
            .prop_map(|(i, s)| Edit::Shape(i, s)),
        2 => (any::<Index>(), prop::collection::vec(json_number(), 0..4))
            .prop_map(|(i, o)| Edit::Offsets(i, o)),
        1 => (any::<Index>(), any::<Index>()).prop_map(|(i, f)| Edit::DropField(i, f)),
        1 => (any::<Index>(), "[a-z_]{1,12}", json_value())
            .prop_map(|(i, k, v)| Edit::AddField(i, k, v)),
        1 => (any::<Index>(), tensor_name()).prop_map(|(i, n)| Edit::Rename(i, n)),
        1 => (any::<Index>(), tensor_name()).prop_map(|(i, n)| Edit::Duplicate(i, n)),
        1 => any::<Index>().prop_map(Edit::Remove),
        3 => (
            prop::option::of(any::<Index>()),
            prop_oneof!["crc32\\.[a-z_.0-9]{0,12}", "[a-z]{1,6}"],
            prop::option::weighted(0.8, meta_value),
        )
            .prop_map(|(i, k, v)| Edit::Meta(i, k, v)),
        1 => Just(Edit::DropMetadata),
        1 => json_value().prop_map(Edit::MetadataNotAMap),
    ]
}

fn frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        6 => Just(Frame::Exact),
        1 => (-9i64..10).prop_map(Frame::LengthOff),
        1 => edgy_number().prop_map(Frame::Length),
        1 => (1u8..16).prop_map(Frame::Spaces),
        1 => (-40i16..40).prop_map(Frame::DataOff),
    ]
}

/// The JSON header and the data of a safetensors file ember wrote.
fn split_safetensors(bytes: &[u8]) -> (serde_json::Map<String, serde_json::Value>, Vec<u8>) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let serde_json::Value::Object(map) = header else {
        panic!("a safetensors header is a JSON object")
    };
    (map, bytes[8 + n..].to_vec())
}

fn pick<'a>(keys: &'a [String], i: &Index) -> Option<&'a String> {
    (!keys.is_empty()).then(|| &keys[i.index(keys.len())])
}

/// The JSON object of the tensor `i` picks among `tensors`, if it is one.
fn entry<'a>(
    map: &'a mut serde_json::Map<String, serde_json::Value>,
    tensors: &[String],
    i: &Index,
) -> Option<&'a mut serde_json::Map<String, serde_json::Value>> {
    pick(tensors, i)
        .and_then(|k| map.get_mut(k))
        .and_then(serde_json::Value::as_object_mut)
}

/// `base` with its header edited and reframed.
fn edited_safetensors(base: &[u8], edits: &[Edit], frame: &Frame) -> Vec<u8> {
    use serde_json::Value;
    let (mut map, mut data) = split_safetensors(base);
    for e in edits {
        let tensors: Vec<String> = map
            .keys()
            .filter(|k| *k != "__metadata__")
            .cloned()
            .collect();
        match e {
            Edit::Dtype(i, d) => {
                if let Some(o) = entry(&mut map, &tensors, i) {
                    o.insert("dtype".into(), Value::from(d.clone()));
                }
            }
            Edit::Shape(i, s) => {
                if let Some(o) = entry(&mut map, &tensors, i) {
                    o.insert("shape".into(), Value::from(s.clone()));
                }
            }
            Edit::Offsets(i, s) => {
                if let Some(o) = entry(&mut map, &tensors, i) {
                    o.insert("data_offsets".into(), Value::from(s.clone()));
                }
            }
            Edit::DropField(i, f) => {
                if let Some(o) = entry(&mut map, &tensors, i) {
                    let fields: Vec<String> = o.keys().cloned().collect();
                    if let Some(k) = pick(&fields, f) {
                        o.remove(k);
                    }
                }
            }
            Edit::AddField(i, k, v) => {
                if let Some(o) = entry(&mut map, &tensors, i) {
                    o.insert(k.clone(), v.clone());
                }
            }
            Edit::Rename(i, n) => {
                if let Some(k) = pick(&tensors, i) {
                    if let Some(v) = map.remove(k) {
                        map.insert(n.clone(), v);
                    }
                }
            }
            Edit::Duplicate(i, n) => {
                if let Some(v) = pick(&tensors, i).and_then(|k| map.get(k)).cloned() {
                    map.insert(n.clone(), v);
                }
            }
            Edit::Remove(i) => {
                if let Some(k) = pick(&tensors, i) {
                    map.remove(k);
                }
            }
            Edit::Meta(i, key, v) => {
                let meta = map
                    .entry("__metadata__")
                    .or_insert_with(|| Value::Object(Default::default()));
                if let Some(m) = meta.as_object_mut() {
                    let keys: Vec<String> = m.keys().cloned().collect();
                    let key = i
                        .as_ref()
                        .and_then(|i| pick(&keys, i))
                        .unwrap_or(key)
                        .clone();
                    match v {
                        Some(v) => m.insert(key, v.clone()),
                        None => m.remove(&key),
                    };
                }
            }
            Edit::DropMetadata => {
                map.remove("__metadata__");
            }
            Edit::MetadataNotAMap(v) => {
                map.insert("__metadata__".into(), v.clone());
            }
        }
    }
    let mut header = serde_json::to_vec(&Value::Object(map)).unwrap();
    let mut len = header.len() as u64;
    match frame {
        Frame::Exact => {}
        Frame::LengthOff(d) => len = len.wrapping_add(*d as u64),
        Frame::Length(n) => len = *n,
        Frame::Spaces(n) => {
            header.extend(std::iter::repeat_n(b' ', *n as usize));
            len = header.len() as u64;
        }
        Frame::DataOff(d) => {
            if *d < 0 {
                data.truncate(data.len().saturating_sub(d.unsigned_abs() as usize));
            } else {
                data.extend(std::iter::repeat_n(0xA5, *d as usize));
            }
        }
    }
    [&len.to_le_bytes()[..], &header, &data].concat()
}

/// What a safetensors case is made of.
fn safetensors_input() -> impl Strategy<Value = Vec<u8>> {
    let n = safetensors_bases().len();
    prop_oneof![
        // arbitrary bytes, and arbitrary text after a plausible length
        1 => prop::collection::vec(any::<u8>(), 0..128),
        1 => "[{}\\[\\]\":,a-zA-Z0-9_ ]{0,64}".prop_map(|s| {
            [&(s.len() as u64).to_le_bytes()[..], s.as_bytes()].concat()
        }),
        // a valid file with its header edited, then maybe bytes damaged
        6 => (0..n, prop::collection::vec(edit(), 0..4), frame(), prop::collection::vec(damage(), 0..2))
            .prop_map(|(b, edits, fr, ds)| {
                damaged(edited_safetensors(&safetensors_bases()[b], &edits, &fr), &ds)
            }),
        // a valid file with bytes damaged
        3 => (0..n, damages(4)).prop_map(|(b, ds)| damaged(safetensors_bases()[b].clone(), &ds)),
    ]
}

/// The header of a file that loaded, as the reference for what was loaded.
fn header_of(bytes: &[u8]) -> Check<serde_json::Map<String, serde_json::Value>> {
    let fail = |m: &str| TestCaseError::fail(format!("loaded, but {m}"));
    let n = bytes
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
        .ok_or_else(|| fail("shorter than 8 bytes"))?;
    let end = usize::try_from(n)
        .ok()
        .and_then(|n| n.checked_add(8))
        .ok_or_else(|| fail("a huge header length"))?;
    let json = bytes.get(8..end).ok_or_else(|| fail("the header is cut"))?;
    match serde_json::from_slice(json) {
        Ok(serde_json::Value::Object(m)) => Ok(m),
        _ => Err(fail("the header is not a JSON object")),
    }
}

fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "F32",
        DType::F64 => "F64",
        DType::F16 => "F16",
        DType::BF16 => "BF16",
        DType::I64 => "I64",
        DType::U8 => "U8",
        DType::Bool => "BOOL",
    }
}

/// `load`: the tensors are those of the header, with its names, shapes and
/// dtypes, and hold as many values as their shapes say.
fn check_load(bytes: &[u8], r: ember::Result<Vec<(String, Tensor)>>) -> Check {
    let Ok(ts) = r else { return Ok(()) };
    let header = header_of(bytes)?;
    let entries = header.keys().filter(|k| *k != "__metadata__").count();
    prop_assert_eq!(ts.len(), entries);
    for (i, (name, t)) in ts.iter().enumerate() {
        prop_assert!(!ts[..i].iter().any(|(n, _)| n == name), "{} twice", name);
        let h = header.get(name).and_then(|v| v.as_object());
        let h = h.ok_or_else(|| TestCaseError::fail(format!("{name:?} is not in the header")))?;
        let shape: Option<Vec<usize>> = h
            .get("shape")
            .and_then(|s| s.as_array())
            .and_then(|s| s.iter().map(|d| d.as_u64().map(|d| d as usize)).collect());
        prop_assert_eq!(Some(t.shape().to_vec()), shape, "{}", name);
        prop_assert_eq!(
            h.get("dtype").and_then(|d| d.as_str()),
            Some(dtype_name(t.dtype()))
        );
        prop_assert_eq!(t.numel(), t.shape().iter().product::<usize>());
        let n = ok(t.to_dtype(DType::F64).and_then(|t| t.to_vec::<f64>()))?.len();
        prop_assert_eq!(n, t.numel());
    }
    Ok(())
}

/// A model's and optimizer's state, to compare before and after a load.
pub(super) type Snapshot = Vec<(String, Vec<usize>, Vec<u64>)>;

pub(super) fn snapshot(model: &dyn Module, opt: Option<&dyn Optimizer>) -> Snapshot {
    let mut all = model.state_dict();
    if let Some(opt) = opt {
        all.extend(
            opt.state()
                .unwrap()
                .into_iter()
                .map(|(n, t)| (format!("optim.{n}"), t)),
        );
    }
    all.into_iter()
        .map(|(n, t)| {
            let bits = t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
            (
                n,
                t.shape().to_vec(),
                bits.iter().map(|x| x.to_bits()).collect(),
            )
        })
        .collect()
}

/// After a load that succeeded: the model kept its shapes and holds finite
/// values (the default options refuse others).
pub(super) fn check_model(model: &dyn Module, before: &Snapshot) -> Check {
    let now = snapshot(model, None);
    prop_assert_eq!(now.len(), before.len());
    for ((n, s, v), (n0, s0, _)) in now.iter().zip(before) {
        prop_assert_eq!((n, s), (n0, s0));
        prop_assert!(
            v.iter().all(|&b| f64::from_bits(b).is_finite()),
            "{} holds non-finite values",
            n
        );
    }
    Ok(())
}

/// Runs `load`, `load_state_dict` and `load_checkpoint` on `bytes` (written to
/// `path`).
fn safetensors_case(path: &Path, bytes: &[u8], model: &nn::Linear, opt: &RefCell<Adam>) -> Check {
    std::fs::write(path, bytes).unwrap();
    let r = ember::io::load(path, &Device::Cpu);
    tally(&r);
    check_load(bytes, r)?;
    checkpoint_case(path, model, opt)
}

fn checkpoint_case(path: &Path, model: &nn::Linear, opt: &RefCell<Adam>) -> Check {
    let before = snapshot(model, None);
    let r = ember::io::load_state_dict(model, path);
    tally(&r);
    match r {
        Ok(()) => {
            check_model(model, &before)?;
            // the model holds the file's values
            let file = ok(ember::io::load(path, &Device::Cpu))?;
            for (name, p) in model.state_dict() {
                let (_, t) = file
                    .iter()
                    .find(|(n, _)| *n == name)
                    .expect("loaded, so present");
                let want = ok(t.to_dtype(p.dtype()).and_then(|t| t.to_vec::<f64>()))?;
                prop_assert_eq!(ok(p.to_vec::<f64>())?, want);
            }
        }
        Err(_) => prop_assert_eq!(
            snapshot(model, None),
            before,
            "a failed load_state_dict changed the model"
        ),
    }
    let mut opt = opt.borrow_mut();
    let before = snapshot(model, Some(&*opt));
    let r = ember::io::load_checkpoint(model, &mut *opt, path);
    tally(&r);
    match r {
        Ok(extra) => {
            check_model(model, &snapshot(model, None))?;
            for (_, t) in extra {
                prop_assert_eq!(t.numel(), t.shape().iter().product::<usize>());
            }
            prop_assert!(opt.lr().is_finite() && opt.lr() >= 0.0);
        }
        Err(_) => prop_assert_eq!(
            snapshot(model, Some(&*opt)),
            before,
            "a failed load_checkpoint changed the model or the optimizer"
        ),
    }
    Ok(())
}

fn safetensors_prop(tag: &'static str, input: impl Strategy<Value = Vec<u8>> + 'static) -> Prop {
    let dir = Scratch::new(tag);
    let (model, opt) = checkpoint_model();
    let opt = RefCell::new(opt);
    prop(input, move |bytes| {
        safetensors_case(&dir.file("case.safetensors"), &bytes, &model, &opt)
    })
}

/// Only the checkpoint readers, on the state dict and checkpoint files.
fn checkpoint_prop(tag: &'static str) -> Prop {
    let input = (
        1usize..4,
        prop::collection::vec(edit(), 0..3),
        frame(),
        prop::collection::vec(damage(), 0..2),
    )
        .prop_map(|(b, edits, fr, ds)| {
            damaged(
                edited_safetensors(&safetensors_bases()[b], &edits, &fr),
                &ds,
            )
        });
    let dir = Scratch::new(tag);
    let (model, opt) = checkpoint_model();
    let opt = RefCell::new(opt);
    prop(input, move |bytes| {
        let path = dir.file("case.safetensors");
        std::fs::write(&path, &bytes).unwrap();
        checkpoint_case(&path, &model, &opt)
    })
}

#[test]
fn safetensors_damaged_files_never_panic() {
    check(600, safetensors_prop("st", safetensors_input()));
}

#[test]
fn checkpoint_damaged_files_never_panic() {
    check(300, checkpoint_prop("checkpoint"));
}

#[test]
fn safetensors_bases_load_back() {
    // the undamaged files load, and a checkpoint restores the model it came from
    let dir = Scratch::new("bases-load");
    let p = dir.file("x.safetensors");
    for b in safetensors_bases() {
        std::fs::write(&p, b).unwrap();
        let ts = ember::io::load(&p, &Device::Cpu).unwrap();
        assert!(!ts.is_empty());
    }
    std::fs::write(&p, &safetensors_bases()[2]).unwrap();
    let model = nn::Linear::new(3, 2, &Device::Cpu).unwrap();
    let mut opt = Adam::new(model.parameters(), 0.5).unwrap();
    ember::io::load_checkpoint(&model, &mut opt, &p).unwrap();
    assert_eq!((opt.lr(), opt.steps()), (0.01, 1));
    let file = ember::io::load(&p, &Device::Cpu).unwrap();
    let (_, w) = file.iter().find(|(n, _)| n == "model.weight").unwrap();
    assert_eq!(
        model.weight.to_vec::<f32>().unwrap(),
        w.to_vec::<f32>().unwrap()
    );
}

#[test]
#[ignore = "long fuzz run: EMBER_FUZZ_SECS (600) seconds"]
fn fuzz_safetensors_long() {
    fuzz_long(
        "safetensors",
        vec![(
            "load+state_dict+checkpoint",
            safetensors_prop("st-long", safetensors_input()),
        )],
    );
}

#[test]
#[ignore = "long fuzz run: EMBER_FUZZ_SECS (600) seconds"]
fn fuzz_checkpoint_long() {
    fuzz_long(
        "checkpoint",
        vec![("state_dict+checkpoint", checkpoint_prop("checkpoint-long"))],
    );
}
