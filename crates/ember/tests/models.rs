//! `ember::models` against torchvision: parameter counts, state-dict names, shapes
//! and dtypes (tests/golden/models.json, written by tests/golden/gen_models.py from
//! PyTorch), output shapes and errors on the meta device, module paths, and a real
//! forward and backward of ResNet-18 on the CPU; GPT-2 small against the same
//! layout built from `torch.nn`, and its tied head's gradient.

use ember::meta::{AllocHook, MetaEvent};
use ember::models;
use ember::nn::{self, Module};
use ember::prelude::*;
use serde_json::Value;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

/// torchvision's documented parameter counts (1000 classes).
const TORCHVISION_PARAMETERS: &[(&str, usize)] = &[
    ("alexnet", 61_100_840),
    ("vgg11", 132_863_336),
    ("vgg16", 138_357_544),
    ("resnet18", 11_689_512),
    ("resnet50", 25_557_032),
];

fn golden() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/models.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("models.json")).unwrap()
}

/// Tests that draw from the global generator, or check that nothing drew from it,
/// hold this.
fn rng_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn meta(name: &str, num_classes: usize) -> Box<dyn Module> {
    models::by_name(name, num_classes, &Device::Meta).unwrap()
}

fn shape_of(v: &Value) -> Vec<usize> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect()
}

/// `(name, shape, dtype)` of each named tensor, as the golden file lists them.
type Entry = (String, Vec<usize>, String);

fn entries(named: Vec<(String, Tensor)>) -> Vec<Entry> {
    named
        .into_iter()
        .map(|(n, t)| (n, t.shape().to_vec(), t.dtype().to_string()))
        .collect()
}

/// The golden file's `[name, shape, dtype]` list `v`.
fn golden_entries(v: &Value) -> Vec<Entry> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e[0].as_str().unwrap().to_string(),
                shape_of(&e[1]),
                e[2].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn parameter_counts_are_torchvisions() {
    let g = golden();
    let torchvision: Vec<&str> = TORCHVISION_PARAMETERS.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        models::NAMES,
        [&torchvision[..], &["mlp", "cnn", "gpt2_small"]].concat()
    );
    for &(name, count) in TORCHVISION_PARAMETERS {
        let model = meta(name, 1000);
        assert_eq!(model.num_parameters(), count, "{name}");
        assert_eq!(
            g["models"][name]["num_parameters"].as_u64(),
            Some(count as u64),
            "{name} in models.json"
        );
    }
    // only the classifier changes with the classes
    let (m10, m1000) = (meta("resnet50", 10), meta("resnet50", 1000));
    assert_eq!(m1000.num_parameters() - m10.num_parameters(), 990 * 2049);
}

#[test]
fn state_dicts_are_torchvisions() {
    let g = golden();
    for (name, _) in TORCHVISION_PARAMETERS {
        let model = meta(name, 1000);
        let got = entries(model.state_dict());
        let want = golden_entries(&g["models"][name]["state"]);
        // PyTorch's state_dict interleaves each module's parameters and buffers;
        // ember's lists all parameters, then all buffers: the same entries
        let (mut g_sorted, mut w_sorted) = (got.clone(), want.clone());
        g_sorted.sort();
        w_sorted.sort();
        assert_eq!(g_sorted, w_sorted, "{name}: state-dict entries");
        // ...and each kind in PyTorch's order
        let is_buffer = |n: &str| {
            ["running_mean", "running_var", "num_batches_tracked"]
                .iter()
                .any(|b| n.ends_with(b))
        };
        let names =
            |v: Vec<(String, Tensor)>| -> Vec<String> { v.into_iter().map(|(n, _)| n).collect() };
        let want_params: Vec<&str> = want
            .iter()
            .map(|e| e.0.as_str())
            .filter(|n| !is_buffer(n))
            .collect();
        let want_buffers: Vec<&str> = want
            .iter()
            .map(|e| e.0.as_str())
            .filter(|n| is_buffer(n))
            .collect();
        assert_eq!(
            names(model.named_parameters()),
            want_params,
            "{name}: parameters"
        );
        assert_eq!(
            names(model.named_buffers()),
            want_buffers,
            "{name}: buffers"
        );
    }
    // a sample, spelled out
    let keys = |name| -> BTreeSet<String> {
        meta(name, 1000)
            .state_dict()
            .into_iter()
            .map(|(n, _)| n)
            .collect()
    };
    let (alexnet, vgg16, resnet18, resnet50) = (
        keys("alexnet"),
        keys("vgg16"),
        keys("resnet18"),
        keys("resnet50"),
    );
    for k in ["features.0.weight", "features.10.bias", "classifier.6.bias"] {
        assert!(alexnet.contains(k), "alexnet {k}");
    }
    for k in [
        "features.28.weight",
        "classifier.0.weight",
        "classifier.3.bias",
    ] {
        assert!(vgg16.contains(k), "vgg16 {k}");
    }
    for k in [
        "conv1.weight",
        "bn1.num_batches_tracked",
        "layer1.0.conv1.weight",
        "layer1.0.bn1.running_mean",
        "layer2.0.downsample.0.weight",
        "layer4.1.bn2.running_var",
        "fc.weight",
    ] {
        assert!(resnet18.contains(k), "resnet18 {k}");
    }
    assert!(!resnet18.contains("layer1.0.downsample.0.weight"));
    assert!(!resnet18.contains("conv1.bias"));
    for k in [
        "layer1.0.downsample.0.weight",
        "layer1.0.downsample.1.running_mean",
        "layer3.5.conv3.weight",
        "layer4.2.bn3.bias",
    ] {
        assert!(resnet50.contains(k), "resnet50 {k}");
    }
}

/// "(256x1x1)" of PyTorch's message as the end of ember's shape "[.., 256, 1, 1]".
fn pytorch_size_as_ember(msg: &str) -> String {
    let inner = msg
        .split("Given input size: (")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .unwrap_or_else(|| panic!("no input size in {msg:?}"));
    format!("{}]", inner.replace('x', ", "))
}

#[test]
fn output_shapes_and_errors_match_pytorch_on_meta() -> Result<()> {
    let g = golden();
    for (name, _) in TORCHVISION_PARAMETERS {
        let mut model = meta(name, 1000);
        // as gen_models.py runs them (batch norm with a batch of one needs eval)
        model.eval();
        for case in g["models"][name]["outputs"].as_array().unwrap() {
            let input = shape_of(&case["input"]);
            let x = Tensor::zeros(input.as_slice(), DType::F32, &Device::Meta)?;
            let got = model.forward(&x);
            match (&case["output"], &case["error"]) {
                (out, Value::Null) => {
                    let y = got.unwrap_or_else(|e| panic!("{name} {input:?}: {e}"));
                    assert_eq!(y.shape(), shape_of(out).as_slice(), "{name} {input:?}");
                    assert_eq!(y.device(), Device::Meta);
                }
                (_, torch_err) => {
                    let err = match got {
                        Err(e) => e.to_string(),
                        Ok(y) => panic!("{name} {input:?}: PyTorch raises, ember gave {y:?}"),
                    };
                    // PyTorch: "Given input size: (256x1x1). Calculated output
                    // size: (256x0x0). Output size is too small"
                    let want = pytorch_size_as_ember(torch_err.as_str().unwrap());
                    assert!(
                        err.contains("max_pool2d") && err.contains("too small"),
                        "{name}: {err}"
                    );
                    assert!(err.contains(&want), "{name}: {err} does not name {want}");
                }
            }
        }
    }
    // other class counts, batch sizes; training mode
    for (name, n, classes) in [("alexnet", 3, 10), ("vgg11", 1, 7), ("resnet50", 4, 100)] {
        let y = meta(name, classes).forward(&Tensor::zeros(
            [n, 3, 224, 224],
            DType::F32,
            &Device::Meta,
        )?)?;
        assert_eq!(y.shape(), &[n, classes], "{name}");
    }
    let y =
        meta("resnet18", 10).forward(&Tensor::zeros([8, 3, 32, 32], DType::F32, &Device::Meta)?)?;
    assert_eq!(y.shape(), &[8, 10]);
    // AlexNet's smallest input is 63 x 63 (PyTorch: 62 gives "Given input size:
    // (256x2x2) ... Output size is too small")
    let alexnet = meta("alexnet", 1000);
    let ok = alexnet.forward(&Tensor::zeros([1, 3, 63, 63], DType::F32, &Device::Meta)?)?;
    assert_eq!(ok.shape(), &[1, 1000]);
    let err = alexnet
        .forward(&Tensor::zeros([1, 3, 62, 62], DType::F32, &Device::Meta)?)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("too small") && err.contains("[1, 256, 2, 2]"),
        "{err}"
    );
    // wrong channels: a shape error, not a panic
    let err = meta("resnet18", 10)
        .forward(&Tensor::zeros([1, 1, 32, 32], DType::F32, &Device::Meta)?)
        .unwrap_err();
    assert!(err.to_string().contains("[1, 1, 32, 32]"), "{err}");
    Ok(())
}

#[test]
fn unknown_names_are_listed() {
    let err = models::by_name("resnet152", 1000, &Device::Meta)
        .err()
        .expect("an unknown model")
        .to_string();
    for name in models::NAMES {
        assert!(err.contains(name), "{err}");
    }
    assert!(err.contains("\"resnet152\""), "{err}");
}

/// Records the module path of every meta allocation.
#[derive(Default)]
struct Paths(Mutex<BTreeSet<String>>);

impl AllocHook for Paths {
    fn alloc(&self, e: &MetaEvent) {
        self.0.lock().unwrap().insert(e.module.to_string());
    }
    fn free(&self, _: &MetaEvent) {}
}

#[test]
fn meta_is_cheap_and_module_paths_follow_the_names() -> Result<()> {
    let _g = rng_lock();
    // building on meta draws nothing from the CPU's generator
    ember::manual_seed(1);
    let before = Tensor::rand([4], &Device::Cpu)?.to_vec::<f32>()?;
    ember::manual_seed(1);
    let model = models::resnet50(1000, &Device::Meta)?;
    let after = Tensor::rand([4], &Device::Cpu)?.to_vec::<f32>()?;
    assert_eq!(before, after);

    let paths = Arc::new(Paths::default());
    ember::meta::with_hook(paths.clone(), || -> Result<()> {
        let x = Tensor::zeros([2, 3, 224, 224], DType::F32, &Device::Meta)?;
        model.forward(&x)?.sum_all()?.backward()?;
        let x = Tensor::zeros([2, 3, 224, 224], DType::F32, &Device::Meta)?;
        models::alexnet(10, &Device::Meta)?.forward(&x)?;
        Ok(())
    })?;
    let paths = paths.0.lock().unwrap();
    for p in [
        "conv1",
        "bn1",
        "maxpool",
        "layer1.0.conv1",
        "layer1.0.bn3",
        "layer1.0.downsample.0",
        "layer1.0.downsample.1",
        "layer3.5.conv2",
        "avgpool",
        "fc",
        "features.0",
        "features.2",
        "classifier.6",
    ] {
        assert!(paths.contains(p), "no allocation in {p}: {paths:?}");
    }
    // the ReLUs work in place, and so does each block's residual sum (`out +=
    // identity`), as torchvision's: neither allocates
    let relus: Vec<_> = paths.iter().filter(|p| p.ends_with("relu")).collect();
    assert!(relus.is_empty(), "ReLUs that allocated: {relus:?}");
    let block = |p: &str| p.starts_with("layer") && p.matches('.').count() == 1;
    let sums: Vec<_> = paths.iter().filter(|p| block(p)).collect();
    assert!(
        sums.is_empty(),
        "blocks that allocated outside their children: {sums:?}"
    );
    Ok(())
}

/// Every parameter of `model` has a gradient of its shape on its device.
fn assert_all_grads(model: &dyn Module, device: Device) {
    for (n, p) in model.named_parameters() {
        let g = p.grad().unwrap_or_else(|| panic!("{n} has no gradient"));
        assert_eq!(g.shape(), p.shape(), "{n}");
        assert_eq!(g.device(), device, "{n}");
    }
}

#[test]
fn resnet18_trains_on_the_cpu() -> Result<()> {
    let _g = rng_lock();
    ember::manual_seed(0);
    let dev = Device::Cpu;
    let model = models::resnet18(10, &dev)?;
    let x = Tensor::randn([2, 3, 32, 32], &dev)?;
    let target = Tensor::new(vec![3i64, 7], &dev)?;
    let y = model.forward(&x)?;
    assert_eq!(y.shape(), &[2, 10]);
    let loss = nn::cross_entropy(&y, &target)?;
    assert!(loss.item::<f32>()?.is_finite());
    loss.backward()?;
    assert_all_grads(&model, dev);
    for (n, p) in model.named_parameters() {
        let g = p.grad().unwrap().to_vec::<f32>()?;
        assert!(g.iter().all(|v| v.is_finite()), "{n}");
        assert!(g.iter().any(|&v| v != 0.0), "{n}: all zero");
    }
    // training updated every batch norm's statistics
    for (n, b) in model.named_buffers() {
        if n.ends_with("num_batches_tracked") {
            assert_eq!(b.to_vec::<i64>()?, [1], "{n}");
        }
    }
    Ok(())
}

#[test]
fn blocks_move_empty_reset_and_switch_modes() -> Result<()> {
    let _g = rng_lock();
    ember::manual_seed(2);
    // structure on meta, then memory and values on the CPU
    let mut model = models::resnet18(10, &Device::Meta)?;
    model.to_empty(&Device::Cpu)?;
    model.reset_parameters()?;
    for (n, t) in model.state_dict() {
        assert_eq!(t.device(), Device::Cpu, "{n}");
    }
    for (n, b) in model.named_buffers() {
        let v = b.to_dtype(DType::F64)?.to_vec::<f64>()?;
        let want = if n.ends_with("running_var") { 1.0 } else { 0.0 };
        assert!(v.iter().all(|&x| x == want), "{n}");
    }
    let p = model.named_parameters();
    let (_, w) = p
        .iter()
        .find(|(n, _)| n == "layer2.0.downsample.0.weight")
        .unwrap();
    let bound = 1.0 / 64f64.sqrt();
    let w = w.to_dtype(DType::F64)?.to_vec::<f64>()?;
    assert!(w.iter().all(|v| v.abs() <= bound) && w.iter().any(|&v| v != 0.0));
    // a batch of one reaches layer4 as 1 x 1: batch norm needs eval mode there,
    // which must reach the blocks' own batch norms
    let x = Tensor::randn([1, 3, 32, 32], &Device::Cpu)?;
    let err = model.forward(&x).unwrap_err();
    assert!(
        err.to_string().contains("more than 1 value per channel"),
        "{err}"
    );
    model.eval();
    let y = model.forward(&x)?;
    assert_eq!(y.shape(), &[1, 10]);
    assert_eq!(y.to_vec::<f32>()?, model.forward(&x)?.to_vec::<f32>()?);
    model.train();
    // to_device reaches every block's layers
    model.to_device(&Device::Meta)?;
    for (n, t) in model.state_dict() {
        assert_eq!(t.device(), Device::Meta, "{n}");
        if t.dtype().is_float() {
            assert!(t.requires_grad() != n.contains("running"), "{n}");
        }
    }
    let y = model.forward(&Tensor::zeros([2, 3, 32, 32], DType::F32, &Device::Meta)?)?;
    assert_eq!(y.shape(), &[2, 10]);
    Ok(())
}

#[test]
fn vgg11_forward_and_backward_on_meta() -> Result<()> {
    let dev = Device::Meta;
    let model = models::vgg11(1000, &dev)?;
    let x = Tensor::zeros([2, 3, 224, 224], DType::F32, &dev)?;
    let target = Tensor::zeros([2], DType::I64, &dev)?;
    let loss = nn::cross_entropy(&model.forward(&x)?, &target)?;
    assert_eq!(loss.shape(), &[] as &[usize]);
    loss.backward()?;
    assert_all_grads(&model, dev);
    Ok(())
}

#[test]
fn blocks_on_their_own() -> Result<()> {
    let dev = Device::Meta;
    let names =
        |m: &dyn Module| -> Vec<String> { m.state_dict().into_iter().map(|(n, _)| n).collect() };
    let same = models::BasicBlock::new(64, 64, 1, &dev)?;
    assert!(same.downsample.is_none());
    let down = models::BasicBlock::new(64, 128, 2, &dev)?;
    assert!(names(&down).contains(&"downsample.1.running_var".to_string()));
    let y = down.forward(&Tensor::zeros([2, 64, 8, 8], DType::F32, &dev)?)?;
    assert_eq!(y.shape(), &[2, 128, 4, 4]);
    let wide = models::Bottleneck::new(256, 64, 1, &dev)?;
    assert!(wide.downsample.is_none());
    assert_eq!(
        wide.num_parameters(),
        256 * 64 + 64 * 64 * 9 + 64 * 256 + 2 * (64 + 64 + 256)
    );
    let y = wide.forward(&Tensor::zeros([2, 256, 8, 8], DType::F32, &dev)?)?;
    assert_eq!(y.shape(), &[2, 256, 8, 8]);
    let into = models::Bottleneck::new(64, 64, 1, &dev)?;
    assert!(
        into.downsample.is_some(),
        "64 -> 256 channels needs a projection"
    );
    assert_eq!(models::Bottleneck::EXPANSION, 4);
    assert_eq!(models::BasicBlock::EXPANSION, 1);
    Ok(())
}

#[test]
fn lesson_models_draw_as_the_cli_did() -> Result<()> {
    let _g = rng_lock();
    let dev = Device::Cpu;
    let values = |m: &dyn Module| -> Vec<(String, Vec<f32>)> {
        m.state_dict()
            .into_iter()
            .map(|(n, t)| (n, t.to_vec::<f32>().unwrap()))
            .collect()
    };
    // the CLI's construction (ember-cli/src/train.rs), spelled out
    ember::manual_seed(32);
    let cli_mlp = nn::Sequential::new()
        .add(nn::Linear::new(64, 128, &dev)?)
        .add(nn::ReLU)
        .add(nn::Linear::new(128, 10, &dev)?);
    ember::manual_seed(32);
    let mlp = models::mlp(&[64, 128, 10], &dev)?;
    assert_eq!(values(&mlp), values(&cli_mlp));
    assert_eq!(mlp.len(), 3);

    let same = Conv2dOptions::default().padding(1);
    ember::manual_seed(32);
    let cli_cnn = nn::Sequential::new()
        .add(nn::Conv2d::new(1, 16, 3, same, &dev)?)
        .add(nn::ReLU)
        .add(nn::Conv2d::new(16, 32, 3, same, &dev)?)
        .add(nn::ReLU)
        .add(nn::MaxPool2d(Pool2dOptions::new(2)))
        .add(nn::Flatten::default())
        .add(nn::Linear::new(32 * 4 * 4, 64, &dev)?)
        .add(nn::ReLU)
        .add(nn::Linear::new(64, 10, &dev)?);
    ember::manual_seed(32);
    let cnn = models::digits_cnn(&dev)?;
    assert_eq!(values(&cnn), values(&cli_cnn));
    let y = cnn.forward(&Tensor::randn([5, 1, 8, 8], &dev)?)?;
    assert_eq!(y.shape(), &[5, 10]);

    // by name, as `ember estimate` builds them: the same draws
    ember::manual_seed(32);
    assert_eq!(values(&models::by_name("mlp", 10, &dev)?), values(&mlp));
    ember::manual_seed(32);
    assert_eq!(values(&models::by_name("cnn", 10, &dev)?), values(&cnn));
    let meta = Device::Meta;
    let x = Tensor::zeros([7, 64], DType::F32, &meta)?;
    assert_eq!(
        models::by_name("mlp", 3, &meta)?.forward(&x)?.shape(),
        &[7, 3]
    );
    let x = Tensor::zeros([7, 1, 8, 8], DType::F32, &meta)?;
    assert_eq!(
        models::by_name("cnn", 4, &meta)?.forward(&x)?.shape(),
        &[7, 4]
    );
    Ok(())
}

/// What takes `impl Module` takes a boxed model.
#[test]
fn boxed_models_are_modules() -> Result<()> {
    fn count(m: &impl Module) -> usize {
        m.num_parameters()
    }
    let mut boxed = models::by_name("resnet18", 10, &Device::Meta)?;
    assert_eq!(count(&boxed), 11_689_512 - 990 * 513);
    boxed.eval();
    boxed.to_empty(&Device::Meta)?;
    let wrapped = nn::Sequential::new().add_named("net", boxed)?;
    assert_eq!(wrapped.named_buffers()[0].0, "net.bn1.running_mean");
    let y = wrapped.forward(&Tensor::zeros([1, 3, 32, 32], DType::F32, &Device::Meta)?)?;
    assert_eq!(y.shape(), &[1, 10]);
    Ok(())
}

/// GPT-2 small's parameter count. PyTorch's for the same layout (gen_models.py's
/// `Gpt2Small`) is in models.json; by hand: the tied token embedding 50304 × 768,
/// positions 1024 × 768, 12 blocks of 12·768² + 13·768 (attention in and out,
/// the 3072-wide feed-forward, two norms) and the final norm's 2 × 768.
const GPT2_SMALL_PARAMETERS: usize =
    50304 * 768 + 1024 * 768 + 12 * (12 * 768 * 768 + 13 * 768) + 2 * 768;

#[test]
fn gpt2_small_is_pytorchs_layout_on_meta() -> Result<()> {
    let g = &golden()["gpt2_small"];
    let gpt = models::gpt2_small(&Device::Meta)?;
    assert_eq!(GPT2_SMALL_PARAMETERS, 124_475_904);
    assert_eq!(gpt.num_parameters(), GPT2_SMALL_PARAMETERS);
    assert_eq!(
        g["num_parameters"].as_u64(),
        Some(GPT2_SMALL_PARAMETERS as u64)
    );
    assert_eq!(
        meta("gpt2_small", 1000).num_parameters(),
        GPT2_SMALL_PARAMETERS,
        "by_name"
    );
    // the parameters in PyTorch's order, the tied one once (as named_parameters
    // lists it); PyTorch's state_dict repeats it as head.weight
    let got = entries(gpt.named_parameters());
    let want = golden_entries(&g["parameters"]);
    assert_eq!(got, want);
    assert_eq!(g["tied_state"].as_array().unwrap().len(), 1);
    assert_eq!(g["tied_state"][0], "head.weight");
    assert!(gpt.is_tied() && gpt.head.bias.is_none());
    assert_eq!(gpt.head.weight.shape(), &[50304, 768]);
    // token ids [B, T] in, logits [B, T, vocab] out; T at most the context
    let ids = |t: usize| Tensor::zeros([2, t], DType::I64, &Device::Meta);
    let out = gpt.forward(&ids(16)?)?;
    assert_eq!(out.shape(), shape_of(&g["output"]).as_slice());
    assert_eq!(shape_of(&g["input"]), [2, 16]);
    assert_eq!(gpt.forward(&ids(1024)?)?.shape(), &[2, 1024, 50304]);
    let err = gpt.forward(&ids(1025)?).unwrap_err().to_string();
    assert!(err.contains("1024"), "{err}");
    Ok(())
}

#[test]
fn the_tied_head_gets_the_sum_of_both_gradients() -> Result<()> {
    use ember::models::{CharGpt, GptConfig};
    let _g = rng_lock();
    ember::manual_seed(0);
    let config = GptConfig {
        vocab_size: 11,
        context: 8,
        layers: 1,
        heads: 2,
        width: 8,
        dropout: 0.0,
    };
    let dev = Device::Cpu;
    let mut tied = CharGpt::new_tied(config, &dev)?;
    tied.to_dtype(DType::F64)?;
    // the same values in an untied model: its head a copy of the embedding,
    // without bias (zero)
    let mut untied = CharGpt::new(config, &dev)?;
    untied.to_dtype(DType::F64)?;
    let from: std::collections::HashMap<String, Tensor> =
        tied.named_parameters().into_iter().collect();
    for (n, p) in untied.named_parameters() {
        let src = match n.as_str() {
            "head.weight" => from["tok_emb.weight"].clone(),
            "head.bias" => p.zeros_like()?,
            _ => from[&n].clone(),
        };
        ember::no_grad(|| p.copy_(&src))?;
    }
    assert_eq!(untied.num_parameters() - tied.num_parameters(), 11 * 8 + 11);
    let x = Tensor::new(vec![1i64, 4, 2, 9, 0, 3, 3, 10], &dev)?.reshape([2, 4])?;
    let y = Tensor::new(vec![4i64, 2, 9, 0, 3, 3, 10, 5], &dev)?.reshape([2, 4])?;
    let (lt, lu) = (tied.loss(&x, &y)?, untied.loss(&x, &y)?);
    assert!((lt.item::<f64>()? - lu.item::<f64>()?).abs() < 1e-12);
    lt.backward()?;
    lu.backward()?;
    let grad = |m: &CharGpt, name: &str| -> Result<Tensor> {
        let p = m.named_parameters().into_iter().find(|(n, _)| n == name);
        Ok(p.unwrap().1.grad().expect("a gradient"))
    };
    let (emb, head) = (
        grad(&untied, "tok_emb.weight")?,
        grad(&untied, "head.weight")?,
    );
    // both uses contribute...
    assert!(emb.abs()?.max_all()?.item::<f64>()? > 1e-6);
    assert!(head.abs()?.max_all()?.item::<f64>()? > 1e-6);
    // ...and the one tied parameter gets their sum
    let sum = emb.add(&head)?;
    assert!(grad(&tied, "tok_emb.weight")?.allclose(&sum, 1e-10, 1e-12)?);
    // the other parameters' gradients are the untied model's
    for (n, p) in tied.named_parameters() {
        if n != "tok_emb.weight" {
            assert!(
                p.grad()
                    .unwrap()
                    .allclose(&grad(&untied, &n)?, 1e-10, 1e-12)?,
                "{n}"
            );
        }
    }
    // moving or casting keeps the tie: the head reads what the embedding holds
    tied.to_dtype(DType::F32)?;
    tied.to_device(&Device::Cpu)?;
    ember::no_grad(|| tied.tok_emb.weight.copy_(&tied.tok_emb.weight.mul(2.0)?))?;
    assert_eq!(
        tied.head.weight.to_vec::<f32>()?,
        tied.tok_emb.weight.to_vec::<f32>()?
    );
    assert_eq!(tied.head.weight.dtype(), DType::F32);
    let mut empty = CharGpt::new_tied(config, &Device::Meta)?;
    empty.to_empty(&dev)?;
    assert_eq!(empty.parameters().len(), tied.parameters().len());
    ember::no_grad(|| {
        empty
            .tok_emb
            .weight
            .copy_(&empty.tok_emb.weight.full_like(0.5)?)
    })?;
    assert!(empty.head.weight.to_vec::<f32>()?.iter().all(|&v| v == 0.5));
    Ok(())
}

/// The character GPT draws its weights as GPT-2 does: standard deviation 0.02,
/// and 0.02 / sqrt(2 * layers) for the projections back into the residual
/// stream (attention's `out_proj`, the feed-forward's `linear2`; GPT-2's
/// `c_proj`).
#[test]
fn gpt_weights_are_drawn_as_gpt2_s() -> Result<()> {
    use ember::models::{CharGpt, GptConfig};
    let _g = rng_lock();
    ember::manual_seed(0);
    let config = GptConfig {
        vocab_size: 64,
        context: 32,
        layers: 6,
        heads: 4,
        width: 128,
        dropout: 0.0,
    };
    let m = CharGpt::new_tied(config, &Device::Cpu)?;
    let residual = 0.02 / 12f64.sqrt();
    let mut checked = 0;
    for (n, p) in m.named_parameters() {
        let v = p.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let sd = (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64).sqrt();
        let want = if n.contains("norm") || n.starts_with("ln_f") {
            continue;
        } else if n.ends_with("bias") {
            0.0
        } else if n.ends_with("out_proj.weight") || n.ends_with("linear2.weight") {
            residual
        } else {
            0.02
        };
        // (at least 4096 draws each: the sample deviation within 5%)
        assert!(
            (sd - want).abs() <= 0.05 * want,
            "{n}: std {sd}, want {want}"
        );
        checked += 1;
    }
    // embeddings (the head tied), and per layer: in_proj, out_proj, linear1,
    // linear2 and their biases
    assert_eq!(checked, 2 + 6 * 8);
    Ok(())
}

/// A sequence shorter than the context sees the top-left corner of the one
/// causal mask kept per device: every prefix's logits are the full window's
/// at its positions (causal attention), and generating through every length
/// up to the context keeps working.
#[test]
fn gpt_prefixes_see_the_same_causal_mask() -> Result<()> {
    use ember::models::{CharGpt, GptConfig};
    let _g = rng_lock();
    ember::manual_seed(1);
    let config = GptConfig {
        vocab_size: 13,
        context: 12,
        layers: 2,
        heads: 2,
        width: 16,
        dropout: 0.0,
    };
    let mut m = CharGpt::new(config, &Device::Cpu)?;
    m.eval();
    m.to_dtype(DType::F64)?;
    let ids: Vec<i64> = (0..12).map(|i| (i * 5 + 3) % 13).collect();
    let full = m.logits(&Tensor::from_vec(ids.clone(), [1, 12], &Device::Cpu)?)?;
    for t in 1..=12 {
        let x = Tensor::from_vec(ids[..t].to_vec(), [1, t], &Device::Cpu)?;
        let got = m.logits(&x)?;
        let want = full.narrow(1, 0, t)?;
        assert!(got.allclose(&want, 1e-12, 1e-12)?, "length {t}");
    }
    // past the context the window slides; every length is served
    assert_eq!(m.generate(&[1], 30, 1.0, None)?.len(), 30);
    Ok(())
}
