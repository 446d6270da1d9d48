//! Edge shapes: every op of `cases.json` on empty, 0-d and size-1 inputs, on the
//! CPU, `meta` and `cuda:0`, must not panic, and must give PyTorch's outcome: an
//! error where PyTorch raises, otherwise PyTorch's output shapes and dtypes
//! (`edges.json`, recorded by `gen_edges.py`).
//!
//! The combinations are derived from the golden cases, not written per op (see
//! `gen_edges.py`, which derives the same ones): for each op its first case that
//! PyTorch accepts, with each of [`SHAPES`] given to every tensor input at once
//! and, where there are several, to each alone; params naming dims are tried as
//! they are and adjusted to the new rank. The ops run through the golden
//! dispatcher ([`eval`]). `meta` may accept what PyTorch refuses for its values
//! (an index out of range, as the CPU's error says) and refuse, with
//! `MetaNoData`, what needs values to size its output (`nonzero`).
//!
//! `EDGES_FILTER=sort cargo test -p ember --test golden edge` runs the
//! combinations whose key contains `sort`; `EDGES_TRACE=1` (with `--nocapture`)
//! prints each key before it runs.

use super::*;

const SHAPES: [&[usize]; 8] = [
    &[],
    &[0],
    &[1],
    &[0, 3],
    &[3, 0],
    &[1, 1],
    &[2, 0, 3],
    &[1, 0],
];
const DIM_KEYS: [&str; 4] = ["dim", "dims", "dim0", "dim1"];

/// Disagreements with PyTorch not fixed yet, by key prefix (and a part of the
/// key, such as the shape): the test fails when one of these agrees again.
const KNOWN: &[(&str, &str, &str)] = &[
    (
        "adaptive_pool/adaptive_avg_pool2d_global_1x1|all|[2,0,3]",
        "",
        "PyTorch's 1x1 output is a mean over an empty plane (NaN); ember refuses it",
    ),
    (
        "products/einsum_matmul|",
        "[1,0]",
        "ember's einsum expands a size-0 dim against a size-1 one",
    ),
    (
        "seq/sdpa_",
        "",
        "PyTorch returns an empty output before checking the other operands' sizes",
    ),
    (
        "fused_attention/l9_s13_d16_f32|0|",
        "",
        "as seq/sdpa_ (an empty operand takes the plain path)",
    ),
    (
        "fused_attention/l9_s13_d16_f32|2|",
        "",
        "as seq/sdpa_ (an empty operand takes the plain path)",
    ),
    (
        "pointwise_loss/l1_none|",
        "",
        "PyTorch broadcasts input and target with a warning; ember refuses other shapes",
    ),
    (
        "pointwise_loss/smooth_l1_none_beta1.0|",
        "",
        "as pointwise_loss/l1_none",
    ),
    (
        "pointwise_loss/huber_none_delta1.0|",
        "",
        "as pointwise_loss/l1_none",
    ),
];

/// The entry of [`KNOWN`] that covers `key`.
fn known(key: &str) -> Option<usize> {
    KNOWN
        .iter()
        .position(|(prefix, part, _)| key.starts_with(prefix) && key.contains(part))
}

#[derive(Deserialize)]
struct EdgeFile {
    torch: String,
    records: BTreeMap<String, Record>,
}

/// PyTorch's outcome for one combination.
#[derive(Deserialize)]
struct Record {
    shapes: Option<Vec<Vec<usize>>>,
    dtypes: Option<Vec<String>>,
    error: Option<String>,
}

/// One derived combination: the template case, its params (adjusted or not),
/// which inputs take `shape`.
struct Combo<'a> {
    key: String,
    template: &'a Case,
    params: Value,
    reshaped: Vec<usize>,
    shape: Vec<usize>,
}

fn shape_key(s: &[usize]) -> String {
    let parts: Vec<String> = s.iter().map(usize::to_string).collect();
    format!("[{}]", parts.join(","))
}

/// `params` with its dim params kept in range for a tensor of `rank` dims (as
/// gen_edges.py's `adjust_dims`).
fn adjust_dims(params: &Value, rank: usize) -> Value {
    let r = rank as i64;
    let one = |d: i64| {
        if r == 0 {
            if d >= 0 {
                0
            } else {
                -1
            }
        } else {
            d.clamp(-r, r - 1)
        }
    };
    let mut out = params.clone();
    for k in DIM_KEYS {
        let Some(v) = params.get(k) else { continue };
        let new = match v {
            Value::Number(n) if n.is_i64() => Value::from(one(n.as_i64().expect("i64"))),
            Value::Array(ds) => {
                let mut seen: Vec<i64> = Vec::new();
                for d in ds {
                    let x = one(int(d));
                    if seen
                        .iter()
                        .all(|y| x.rem_euclid(r.max(1)) != y.rem_euclid(r.max(1)))
                    {
                        seen.push(x);
                    }
                }
                Value::from(seen)
            }
            _ => continue,
        };
        out[k] = new;
    }
    out
}

/// Every combination, derived from the golden cases.
fn combos(cases: &[Case]) -> Vec<Combo<'_>> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for c in cases {
        if seen.contains(&c.op) || c.expected.error.is_some() {
            continue;
        }
        let tensors: Vec<usize> = (0..c.inputs.len())
            .filter(|&k| c.inputs[k].scalar.is_none())
            .collect();
        if tensors.is_empty() && c.params.get("shape").is_none() {
            continue;
        }
        seen.insert(c.op.clone());
        if tensors.is_empty() {
            for s in SHAPES {
                let mut params = c.params.clone();
                params["shape"] = Value::from(s.to_vec());
                out.push(Combo {
                    key: format!("{}|shape|{}|orig", c.name, shape_key(s)),
                    template: c,
                    params,
                    reshaped: vec![],
                    shape: s.to_vec(),
                });
            }
            continue;
        }
        let mut variants = vec![("all".to_string(), tensors.clone())];
        if tensors.len() > 1 {
            variants.extend(tensors.iter().map(|&k| (k.to_string(), vec![k])));
        }
        for (name, which) in &variants {
            for s in SHAPES {
                let key = format!("{}|{name}|{}", c.name, shape_key(s));
                let combo = |tag: &str, params: Value| Combo {
                    key: format!("{key}|{tag}"),
                    template: c,
                    params,
                    reshaped: which.clone(),
                    shape: s.to_vec(),
                };
                out.push(combo("orig", c.params.clone()));
                if which.contains(&tensors[0]) {
                    let adj = adjust_dims(&c.params, s.len());
                    if adj != c.params {
                        out.push(combo("adj", adj));
                    }
                }
            }
        }
    }
    out
}

/// `spec` with `shape`, its values the original's cycled.
fn resized(spec: &TensorSpec, shape: &[usize]) -> TensorSpec {
    let n: usize = shape.iter().product();
    let enc_f = |x: f64| {
        if x.is_nan() {
            Value::from("nan")
        } else if x.is_infinite() {
            Value::from(if x > 0.0 { "inf" } else { "-inf" })
        } else {
            Value::from(x)
        }
    };
    let data: Vec<Value> = match spec.vals() {
        Vals::F(v) => (0..n)
            .map(|i| enc_f(if v.is_empty() { 0.0 } else { v[i % v.len()] }))
            .collect(),
        Vals::I(v) => (0..n)
            .map(|i| Value::from(if v.is_empty() { 0 } else { v[i % v.len()] }))
            .collect(),
    };
    TensorSpec {
        shape: shape.to_vec(),
        dtype: spec.dtype.clone(),
        data: Some(data),
        progression: None,
    }
}

/// The op of `c` on `dev`, synchronised (a GPU reports a bad index there).
fn run_combo(c: &Combo, dev: Device) -> R<Out> {
    let t = c.template;
    let mut args = Vec::new();
    for (k, i) in t.inputs.iter().enumerate() {
        if c.reshaped.contains(&k) {
            let spec = i.tensor.as_ref().expect("tensor input");
            args.push(Arg::T(resized(spec, &c.shape).build(&dev)));
        } else {
            args.push(build_input(i, &dev, false)?.0);
        }
    }
    let case = Case {
        name: c.key.clone(),
        op: t.op.clone(),
        params: c.params.clone(),
        inputs: vec![],
        expected: Expected {
            tensor: None,
            tensors: None,
            str: None,
            error: None,
            kind: None,
        },
        rtol: None,
        atol: None,
        grad_out: None,
        grads: None,
        grad_error: None,
        same_message: false,
    };
    let out = eval(&case, dev, &args)?;
    ember::cuda::synchronize(&dev).map_err(e)?;
    Ok(out)
}

/// What a combination gave: output shapes and dtypes, printed text, an error, or
/// a panic.
#[derive(Debug)]
enum Got {
    Tensors(Vec<(Vec<usize>, DType)>),
    Str,
    Err(String),
    Panic(String),
}

fn outcome(c: &Combo, dev: Device) -> Got {
    match catch_unwind(AssertUnwindSafe(|| run_combo(c, dev))) {
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            let at = PANIC_AT.with(|a| a.borrow().clone());
            Got::Panic(format!("panicked at {at}: {msg}"))
        }
        Ok(Err(m)) => Got::Err(m),
        Ok(Ok(Out::Str(_))) => Got::Str,
        Ok(Ok(Out::One(t))) => Got::Tensors(vec![(t.shape().to_vec(), t.dtype())]),
        Ok(Ok(Out::Many(ts))) => {
            Got::Tensors(ts.iter().map(|t| (t.shape().to_vec(), t.dtype())).collect())
        }
    }
}

/// An error that PyTorch raises for the values (which `meta` does not have).
fn value_error(msg: &str) -> bool {
    [
        "out of bounds",
        "out of range",
        "ZeroDivisionError",
        "probabilit",
    ]
    .iter()
    .any(|v| msg.contains(v))
}

/// `None` when `got` on `dev` agrees with PyTorch's `rec` (and with the CPU's
/// `cpu` off the CPU); otherwise why not.
fn disagreement(got: &Got, rec: &Record, dev: Device, cpu: Option<&Got>) -> Option<String> {
    let meta = dev == Device::Meta;
    if let Got::Panic(m) = got {
        return Some(m.clone());
    }
    // meta cannot size what depends on values, nor see values' errors
    if meta {
        if let Got::Err(m) = got {
            if kind_of(m) == Some("MetaNoData") {
                return None;
            }
        }
        if let (Got::Tensors(_), Some(Got::Err(m))) = (got, cpu) {
            if value_error(m) {
                return None;
            }
        }
    }
    match (got, &rec.error) {
        (Got::Err(_), Some(_)) => {}
        (Got::Err(m), None) => return Some(format!("PyTorch accepts it, ember: {m}")),
        (g, Some(m)) => return Some(format!("PyTorch raises ({m}) but ember gave {g:?}")),
        (Got::Str, None) => {}
        (Got::Tensors(ts), None) => {
            let want_s = rec.shapes.as_ref().expect("shapes");
            let want_d = rec.dtypes.as_ref().expect("dtypes");
            let got_s: Vec<&Vec<usize>> = ts.iter().map(|(s, _)| s).collect();
            let got_d: Vec<DType> = ts.iter().map(|(_, d)| *d).collect();
            let want_dt: Vec<DType> = want_d.iter().map(|d| dtype(d)).collect();
            if got_s.len() != want_s.len()
                || got_s.iter().zip(want_s).any(|(g, w)| *g != w)
                || got_d != want_dt
            {
                return Some(format!(
                    "PyTorch gives shapes {want_s:?} dtypes {want_d:?}, ember {got_s:?} {got_d:?}"
                ));
            }
        }
        (Got::Panic(_), _) => unreachable!(),
    }
    // off the CPU, the same outcome as the CPU's (with meta's allowances above)
    match (got, cpu) {
        (Got::Tensors(a), Some(Got::Tensors(b))) if a != b => {
            Some(format!("the CPU gives {b:?}, {dev} {a:?}"))
        }
        (Got::Err(_), Some(Got::Tensors(_))) | (Got::Tensors(_), Some(Got::Err(_))) => Some(
            format!("the CPU gives {:?}, {dev} {got:?}", cpu.expect("cpu")),
        ),
        _ => None,
    }
}

fn edges_on(dev: Device) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden");
    let read = |f: &str| {
        std::fs::read_to_string(format!("{dir}/{f}")).unwrap_or_else(|x| panic!("reading {f}: {x}"))
    };
    let file: File = serde_json::from_str(&read("cases.json")).expect("parsing cases.json");
    let edges: EdgeFile = serde_json::from_str(&read("edges.json")).expect("parsing edges.json");
    let filter = std::env::var("EDGES_FILTER").ok();
    // each combination's key before it runs (to find one that stops the process)
    let trace = std::env::var_os("EDGES_TRACE").is_some();
    let all = combos(&file.cases);
    let derived: std::collections::HashSet<&str> = all.iter().map(|c| c.key.as_str()).collect();
    let stale: Vec<&String> = edges
        .records
        .keys()
        .filter(|k| !derived.contains(k.as_str()))
        .collect();
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|info| {
        let at = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        PANIC_AT.with(|a| *a.borrow_mut() = at);
    }));
    let start = std::time::Instant::now();
    let mut failures = Vec::new();
    let mut ran = 0;
    let mut known_seen = vec![0; KNOWN.len()];
    let mut ops = std::collections::BTreeSet::new();
    for c in &all {
        if filter.as_deref().is_some_and(|f| !c.key.contains(f)) {
            continue;
        }
        let Some(rec) = edges.records.get(&c.key) else {
            failures.push(format!(
                "{}: no PyTorch record (run tests/golden/gen_edges.py)",
                c.key
            ));
            continue;
        };
        if trace {
            eprintln!("edge shapes on {dev}: {}", c.key);
        }
        let got = outcome(c, dev);
        let cpu = (dev != Device::Cpu).then(|| outcome(c, Device::Cpu));
        match (disagreement(&got, rec, dev, cpu.as_ref()), known(&c.key)) {
            // a known difference excuses an answer, never a panic
            (Some(_), Some(k)) if !matches!(got, Got::Panic(_)) => known_seen[k] += 1,
            (Some(why), _) => failures.push(format!("{} [{}]: {why}", c.key, c.template.op)),
            (None, _) => {}
        }
        ops.insert(c.template.op.as_str());
        ran += 1;
    }
    std::panic::set_hook(default_hook);
    eprintln!(
        "edge shapes on {dev} (PyTorch {}): {ran} combinations of {} ops in {:.1?}; \
         {} known differences",
        edges.torch,
        ops.len(),
        start.elapsed(),
        known_seen.iter().sum::<usize>()
    );
    if filter.is_none() {
        for (k, (prefix, part, why)) in KNOWN.iter().enumerate() {
            if known_seen[k] == 0 {
                failures.push(format!(
                    "KNOWN entry {prefix:?} {part:?} ({why}) agrees with PyTorch now: take it out"
                ));
            }
        }
    }
    assert!(
        ran > 0,
        "no edge combinations ran (EDGES_FILTER={filter:?})"
    );
    assert!(
        stale.is_empty() || filter.is_some(),
        "edges.json has records no longer derived from cases.json (run tests/golden/gen_edges.py): {stale:?}"
    );
    if !failures.is_empty() {
        panic!(
            "{} of {ran} edge-shape combinations on {dev} disagree with PyTorch:\n\n{}\n",
            failures.len(),
            failures.join("\n")
        );
    }
}

#[test]
fn edge_shapes_match_pytorch() {
    edges_on(Device::Cpu);
}

#[test]
fn edge_shapes_match_pytorch_on_meta() {
    edges_on(Device::Meta);
}

#[test]
fn edge_shapes_match_pytorch_on_cuda() {
    if let Some(dev) = common::gpu("edge_shapes_match_pytorch_on_cuda") {
        // PyTorch's float32 results, to float32's tolerance
        common::exact_float32_convolutions();
        edges_on(dev);
    }
}
