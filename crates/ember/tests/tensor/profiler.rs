//! The profiler (`ember::profiler`): what a profiled training step records, how
//! its times add up, the trace file, threads, and that nothing is recorded while
//! it is off.
//!
//! A session records every thread, and the other tests of this binary run
//! meanwhile: each test that profiles takes its turn (`profile_turn`, one session
//! at a time, here and in the other files) and reads only the records of its own
//! thread.

use super::{mine, profile_turn as turn};
use ember::nn::{self, Module};
use ember::optim::{Adam, Optimizer};
use ember::prelude::*;
use ember::profiler::{self, Event, EventKind, Profile, Profiler, SortBy};

fn named<'a>(p: &'a Profile, name: &str, kind: EventKind) -> Vec<&'a Event> {
    p.events()
        .iter()
        .filter(|e| e.name == name && e.kind == kind)
        .collect()
}

/// Two profiled training steps of the digits CNN (two convolutions, Adam):
/// the convolutions, their backward rules and primitives, the optimizer's
/// updates, counted as often as they ran, inside their modules and ranges.
fn a_profiled_training_step(dev: &Device) -> Result<()> {
    let _turn = turn();
    let (model, x, y) = {
        let _rng = crate::rng_lock();
        ember::manual_seed(0);
        let model = ember::models::digits_cnn(dev)?;
        let x = Tensor::randn([8, 1, 8, 8], dev)?;
        let y = Tensor::randint(0, 10, [8], dev)?;
        (model, x, y)
    };
    let params = model.parameters().len();
    let mut opt = Adam::new(model.parameters(), 1e-3)?;
    let mut step = || -> Result<()> {
        let loss = nn::cross_entropy(&model.forward(&x)?, &y)?;
        opt.zero_grad();
        loss.backward()?;
        opt.step()
    };
    step()?; // warm-up: the optimizer's state is made here
    let prof = Profiler::start()?;
    assert!(profiler::is_enabled());
    for _ in 0..2 {
        profiler::record_function("step", &mut step)?;
    }
    let p = mine(&prof.stop()?);
    assert!(!profiler::is_enabled());
    let ops = p.key_averages();
    let count = |name: &str, kind| ops.get_kind(name, kind).map_or(0, |r| r.count);
    assert_eq!(count("step", EventKind::User), 2);
    assert_eq!(
        count("conv2d", EventKind::Op),
        4,
        "2 convolutions x 2 steps"
    );
    assert_eq!(
        count("conv2d", EventKind::Backward),
        4,
        "their backward rules"
    );
    assert_eq!(count("conv2d_backward", EventKind::Op), 4);
    assert_eq!(
        count("addmm", EventKind::Op),
        4,
        "2 linear layers x 2 steps"
    );
    assert_eq!(count("linear", EventKind::Function), 4);
    assert_eq!(count("max_pool2d", EventKind::Op), 2);
    assert_eq!(count("cross_entropy", EventKind::Function), 2);
    assert_eq!(count("backward", EventKind::Function), 2);
    assert_eq!(count("optimizer.step", EventKind::Function), 2);
    // one update per parameter on the CPU; on a GPU one multi-tensor update of
    // them all per step (Adam's foreach form)
    let (update, updates) = if dev.is_cuda() {
        ("adam_foreach", 2)
    } else {
        ("adam_step", 2 * params)
    };
    assert_eq!(count(update, EventKind::Op), updates, "{update}");
    // every update is inside the optimizer's step, every step inside "step"
    for e in named(&p, update, EventKind::Op) {
        let parent = &p.events()[e.parent.expect("inside a range")];
        assert_eq!(
            (parent.name.as_str(), parent.kind),
            ("optimizer.step", EventKind::Function)
        );
        assert_eq!(e.device, Some(*dev));
    }
    // convolutions run inside their modules ("0" and "2" of the Sequential); their
    // backward rules name the module of the forward op
    for e in named(&p, "conv2d", EventKind::Op) {
        assert!(
            e.module == "0" || e.module == "2",
            "conv2d in {:?}",
            e.module
        );
        assert_eq!(e.shapes[1].len(), 4, "the weight's shape: {:?}", e.shapes);
    }
    let mut rule_modules: Vec<&str> = named(&p, "conv2d", EventKind::Backward)
        .iter()
        .map(|e| e.module.as_str())
        .collect();
    rule_modules.sort();
    assert_eq!(rule_modules, ["0", "0", "2", "2"]);
    for e in named(&p, "conv2d_backward", EventKind::Op) {
        let rule = &p.events()[e.parent.expect("inside its rule")];
        assert_eq!(
            (rule.name.as_str(), rule.kind),
            ("conv2d", EventKind::Backward)
        );
    }
    // the first convolution's output, [8, 16, 8, 8] f32, was allocated by it
    let first = named(&p, "conv2d", EventKind::Op)[0];
    assert!(
        first.alloc_bytes >= 8 * 16 * 8 * 8 * 4,
        "{}",
        first.alloc_bytes
    );
    if dev.is_cuda() {
        assert!(
            !first.kernels.is_empty(),
            "a GPU convolution queues kernels"
        );
        assert!(
            named(&p, "addmm", EventKind::Op)
                .iter()
                .all(|e| e.kernels.iter().any(|k| k.starts_with("cublas"))),
            "products go to cuBLAS"
        );
    }
    // self times add up to the totals of the outermost records
    let roots: Vec<&Event> = p.events().iter().filter(|e| e.parent.is_none()).collect();
    assert_eq!(roots.len(), 2, "the two user ranges hold everything");
    let close = |a: f64, b: f64| (a - b).abs() <= 0.05 * b.max(1e-9);
    let host_total: f64 = roots.iter().map(|e| e.host_total_us).sum();
    let host_self: f64 = p.events().iter().map(|e| e.self_host_us).sum();
    assert!(close(host_self, host_total), "{host_self} vs {host_total}");
    let device_total: f64 = roots.iter().map(|e| e.device_total_us).sum();
    assert!(device_total > 0.0);
    assert!(close(ops.self_device_total_us(), device_total));
    // on the CPU an op's device time is its host time
    if dev.is_cpu() {
        for e in p.events().iter().filter(|e| e.kind == EventKind::Op) {
            assert_eq!(e.device_total_us, e.host_total_us);
        }
    }
    let table = ops.table(SortBy::SelfDevice, 15);
    assert!(table.contains("conv2d_backward"), "{table}");
    assert!(
        !table.contains("conv2d backward"),
        "ranges have no self time: {table}"
    );
    let table = ops.table(SortBy::DeviceTotal, 15);
    assert!(table.contains("conv2d backward"), "{table}");
    assert!(table.contains("Self device time total"), "{table}");
    let by_module = p.module_averages();
    assert_eq!(by_module.get("0").map(|r| r.count), Some(2));
    Ok(())
}

/// Nested user ranges nest in the records and in the trace file, which is
/// Chrome's trace-event JSON with a host track and a device track.
fn nested_ranges_and_the_trace(dev: &Device) -> Result<()> {
    let _turn = turn();
    let x = Tensor::ones([64, 64], DType::F32, dev)?;
    let prof = Profiler::start()?;
    profiler::record_function("outer", || {
        profiler::record_function("inner", || x.exp())?;
        x.sqrt()
    })?;
    let p = mine(&prof.stop()?);
    let outer = named(&p, "outer", EventKind::User)[0];
    let inner = named(&p, "inner", EventKind::User)[0];
    let exp = named(&p, "exp", EventKind::Op)[0];
    let sqrt = named(&p, "sqrt", EventKind::Op)[0];
    let index = |e: &Event| p.events().iter().position(|x| std::ptr::eq(x, e));
    assert_eq!(outer.parent, None);
    assert_eq!(inner.parent, index(outer));
    assert_eq!(exp.parent, index(inner));
    assert_eq!(sqrt.parent, index(outer));
    assert_eq!(exp.shapes, vec![vec![64, 64]]);

    let trace: serde_json::Value =
        serde_json::from_str(&p.chrome_trace()).expect("the trace is JSON");
    let events = trace["traceEvents"].as_array().expect("traceEvents");
    let find = |name: &str, host: bool| {
        events
            .iter()
            .find(|e| e["ph"] == "X" && e["name"] == name && (e["pid"] == 0) == host)
            .unwrap_or_else(|| {
                panic!(
                    "no {name} on the {} track",
                    if host { "host" } else { "device" }
                )
            })
    };
    let span = |e: &serde_json::Value| {
        let ts = e["ts"].as_f64().expect("ts");
        (ts, ts + e["dur"].as_f64().expect("dur"))
    };
    let (o, i, x_) = (
        span(find("outer", true)),
        span(find("inner", true)),
        span(find("exp", true)),
    );
    assert!(
        o.0 <= i.0 && i.1 <= o.1 && i.0 <= x_.0 && x_.1 <= i.1,
        "{o:?} {i:?} {x_:?}"
    );
    // the device track: the op's device work, in a process named after the device
    let d = find("exp", false);
    let pid = d["pid"].clone();
    assert!(events.iter().any(|e| e["ph"] == "M"
        && e["pid"] == pid
        && e["args"]["name"] == dev.to_string().as_str()));
    assert_eq!(find("exp", true)["args"]["input shapes"], "[[64, 64]]");

    let dir = std::env::temp_dir().join(format!("ember-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary folder");
    let path = dir.join(format!("{}.json", dev.to_string().replace(':', "")));
    p.export_chrome_trace(&path)?;
    let back: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("the trace file"))
            .expect("the file is JSON");
    assert_eq!(back, trace);
    std::fs::remove_file(&path).expect("removed");
    assert!(p
        .export_chrome_trace(dir.join("missing/trace.json"))
        .is_err());
    Ok(())
}

device_test!(a_profiled_training_step, nested_ranges_and_the_trace);

/// A GPT's ops are named by the module they ran in, down to its blocks' layers,
/// forward and backward.
#[test]
fn a_gpt_step_names_its_modules() -> Result<()> {
    let _turn = turn();
    let _rng = super::rng_lock();
    let dev = Device::Cpu;
    let config = ember::models::GptConfig {
        vocab_size: 16,
        context: 8,
        layers: 2,
        heads: 2,
        width: 8,
        dropout: 0.0,
    };
    let gpt = ember::models::CharGpt::new(config, &dev)?;
    let ids = Tensor::randint(0, 16, [2, 8], &dev)?;
    let prof = Profiler::start()?;
    gpt.loss(&ids, &ids)?.backward()?;
    let p = mine(&prof.stop()?);
    let modules = |name: &str, kind| -> Vec<String> {
        let mut m: Vec<String> = named(&p, name, kind)
            .iter()
            .map(|e| e.module.clone())
            .collect();
        m.sort();
        m.dedup();
        m
    };
    let linear: Vec<String> = (0..2)
        .flat_map(|i| ["linear1", "linear2", "self_attn"].map(|l| format!("blocks.layers.{i}.{l}")))
        .chain(["head".to_string()])
        .collect();
    assert_eq!(modules("linear", EventKind::Function), linear);
    assert!(
        modules("layer_norm", EventKind::Function).contains(&"blocks.layers.1.norm2".to_string())
    );
    assert_eq!(
        modules("embedding", EventKind::Function),
        ["pos_emb", "tok_emb"]
    );
    // the head's backward rule ran in backward, named after the forward's module
    assert!(modules("addmm", EventKind::Backward).contains(&"head".to_string()));
    assert!(!p.module_averages().rows().is_empty());
    Ok(())
}

#[test]
fn nothing_is_recorded_while_off() -> Result<()> {
    let _turn = turn();
    let x = Tensor::ones([8], DType::F32, &Device::Cpu)?;
    assert!(!profiler::is_enabled());
    let _ = profiler::record_function("off", || x.exp())?;
    let p = mine(&Profiler::start()?.stop()?);
    assert!(p.events().is_empty(), "{:?}", p.events());
    // a session records what runs inside it only
    let prof = Profiler::start()?;
    x.exp()?;
    let p = mine(&prof.stop()?);
    x.exp()?;
    assert_eq!(p.events().len(), 1);
    Ok(())
}

#[test]
fn one_session_at_a_time() -> Result<()> {
    let _turn = turn();
    let first = Profiler::start()?;
    let err = Profiler::start()
        .err()
        .expect("a second session is refused");
    assert!(err.to_string().contains("already on"), "{err}");
    drop(first); // discards its records and ends the session
    assert!(!profiler::is_enabled());
    let ((), p) = profiler::profile(|| Ok(()))?;
    assert!(mine(&p).events().is_empty());
    Ok(())
}

/// Ranges opened on two threads at the same time nest only within their own
/// thread.
#[test]
fn threads_keep_their_own_ranges() -> Result<()> {
    let _turn = turn();
    let x = Tensor::ones([16], DType::F32, &Device::Cpu)?;
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
    let prof = Profiler::start()?;
    let workers: Vec<_> = ["profiled-a", "profiled-b"]
        .into_iter()
        .map(|name| {
            let (x, barrier) = (x.clone(), barrier.clone());
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    profiler::record_function(name, || {
                        barrier.wait(); // both outer ranges are open now
                        profiler::record_function("inner", || x.exp())?;
                        barrier.wait();
                        Ok::<(), Error>(())
                    })
                })
                .expect("a thread")
        })
        .collect();
    for w in workers {
        w.join().expect("the thread finished")?;
    }
    let p = prof.stop()?;
    for name in ["profiled-a", "profiled-b"] {
        let t = p.filter_threads(|_, n| n == name);
        let names: Vec<(String, Option<usize>)> = t
            .events()
            .iter()
            .map(|e| (e.name.clone(), e.parent))
            .collect();
        assert_eq!(
            names,
            [
                (name.to_string(), None),
                ("inner".to_string(), Some(0)),
                ("exp".to_string(), Some(1))
            ]
        );
    }
    Ok(())
}

/// What a loop's profile holds: `within` keeps the steps' records (not an
/// evaluation between them); ranges dropped out of order leave those still
/// open as the parents of what follows; an empty profile's totals are +0; a
/// step profiler stopped during its warm-up starts no session after.
#[test]
fn steps_alone_out_of_order_ranges_and_stops() -> Result<()> {
    let _t = turn();
    let x = Tensor::randn([4, 4], &Device::Cpu)?;
    let p = Profiler::start()?;
    for _ in 0..2 {
        let _step = profiler::range("train_step");
        x.matmul(&x)?;
    }
    x.exp()?; // an evaluation between steps
    let whole = mine(&p.stop()?);
    let steps = whole.within("train_step");
    let mm = |p: &Profile| p.key_averages().get("mm").map_or(0, |r| r.count);
    assert_eq!((mm(&whole), mm(&steps)), (2, 2));
    assert!(whole.key_averages().get("exp").is_some());
    assert!(steps.key_averages().get("exp").is_none());

    let p = Profiler::start()?;
    let a = profiler::range("a");
    let b = profiler::range("b");
    drop(a);
    let c = profiler::range("c");
    x.relu()?;
    drop(c);
    drop(b);
    let prof = mine(&p.stop()?);
    let ev = prof.events();
    let find = |n: &str| ev.iter().position(|e| e.name == n).unwrap();
    assert_eq!(ev[find("c")].parent, Some(find("b")));
    assert_eq!(ev[find("relu")].parent, Some(find("c")));

    let empty = Profiler::start()?.stop()?.filter_threads(|_, _| false);
    let table = empty.key_averages().table(SortBy::SelfDevice, 5);
    assert!(!table.contains("-0.000"), "{table}");

    let mut sp = profiler::StepProfiler::new(3, 2)?;
    sp.stop()?;
    for _ in 0..5 {
        sp.step()?;
        assert!(!sp.is_recording());
    }
    Ok(())
}
