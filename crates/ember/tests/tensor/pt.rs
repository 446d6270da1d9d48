//! PyTorch's `torch.save` files (ember::io::PtFile, load_pt) against files real
//! PyTorch wrote (tests/golden/pt/, made by tests/golden/gen_pt.py), and
//! `Module::load_state_dict`.

use ember::io::{self, PtFile, PtFormat};
use ember::nn::{self, Module};
use ember::prelude::*;
use half::{bf16, f16};
use serde_json::Value as Json;
use std::path::PathBuf;

fn pt(name: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/pt")).join(name)
}

fn expected() -> Json {
    let text = std::fs::read_to_string(pt("expected.json")).expect("tests/golden/pt/expected.json");
    serde_json::from_str(&text).expect("expected.json is JSON")
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// A tensor's values as little-endian bytes, as PyTorch's `numpy().tobytes()`.
fn bytes_of(t: &Tensor) -> Result<Vec<u8>> {
    Ok(match t.dtype() {
        DType::F32 => t
            .to_vec::<f32>()?
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect(),
        DType::F64 => t
            .to_vec::<f64>()?
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect(),
        DType::F16 => t
            .to_vec::<f16>()?
            .iter()
            .flat_map(|x| x.to_bits().to_le_bytes())
            .collect(),
        DType::BF16 => t
            .to_vec::<bf16>()?
            .iter()
            .flat_map(|x| x.to_bits().to_le_bytes())
            .collect(),
        DType::I64 => t
            .to_vec::<i64>()?
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect(),
        DType::U8 => t.to_vec::<u8>()?,
        DType::Bool => t.to_vec::<bool>()?.into_iter().map(u8::from).collect(),
    })
}

/// `got` against the expected tensors of one file: the same names in the same
/// order, dtypes, shapes and bytes.
fn assert_tensors(file: &str, got: &[(String, Tensor)], want: &Json) -> Result<()> {
    let want = want["tensors"].as_array().expect("tensors");
    let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
    let want_names: Vec<&str> = want.iter().map(|w| w["name"].as_str().unwrap()).collect();
    assert_eq!(names, want_names, "{file}");
    for ((name, t), w) in got.iter().zip(want) {
        let shape: Vec<usize> = serde_json::from_value(w["shape"].clone()).unwrap();
        assert_eq!(
            t.dtype().to_string(),
            w["dtype"].as_str().unwrap(),
            "{file}: {name}"
        );
        assert_eq!(t.shape(), shape.as_slice(), "{file}: {name}");
        assert_eq!(
            bytes_of(t)?,
            unhex(w["hex"].as_str().unwrap()),
            "{file}: {name}"
        );
    }
    Ok(())
}

fn assert_values(file: &str, got: &[(String, String)], want: &Json) {
    let want: Vec<(String, String)> = serde_json::from_value(want["values"].clone()).unwrap();
    assert_eq!(got, want.as_slice(), "{file}");
}

fn files_load_bit_for_bit(dev: &Device) -> Result<()> {
    let exp = expected();
    for (name, format) in [
        ("dtypes.pt", PtFormat::Zip),
        ("dtypes_legacy.pt", PtFormat::Legacy),
        ("views.pt", PtFormat::Zip),
        ("views_legacy.pt", PtFormat::Legacy),
        ("dtypes_p4.pt", PtFormat::Zip),
        ("views_legacy_p4.pt", PtFormat::Legacy),
        ("views_legacy_p1.pt", PtFormat::Legacy),
        ("small_net.pth", PtFormat::Zip),
    ] {
        let want = &exp["files"][name];
        let file = PtFile::open(pt(name))?;
        assert_eq!(file.format(), format, "{name}");
        let got = file.load(dev)?;
        assert!(got.iter().all(|(_, t)| t.device() == *dev));
        assert_tensors(name, &got, want)?;
        assert_values(name, &file.values()?, want);
        // the one-call form reads the same
        let again = io::load_pt(pt(name), dev)?;
        assert_eq!(again.len(), got.len());
    }
    Ok(())
}

fn checkpoint_parts(dev: &Device) -> Result<()> {
    let _rng = super::rng_lock();
    let exp = &expected()["files"]["checkpoint.pt"];
    let file = PtFile::open(pt("checkpoint.pt"))?;
    assert_eq!(file.keys(), ["model", "optimizer", "epoch", "args"]);
    // the whole file holds an object ember does not build: an error naming it
    let e = file.load(dev).unwrap_err().to_string();
    assert!(
        e.contains("argparse.Namespace") && e.contains("\"args\""),
        "{e}"
    );
    // its parts load
    let model = file.select("model")?;
    assert_eq!(model.selected(), ["model"]);
    let state = model.load(dev)?;
    assert_tensors("checkpoint.pt model", &state, &exp["model"])?;
    let opt = file.select("optimizer")?;
    assert_tensors(
        "checkpoint.pt optimizer",
        &opt.load(dev)?,
        &exp["optimizer"],
    )?;
    assert_values("checkpoint.pt optimizer", &opt.values()?, &exp["optimizer"]);
    assert!(opt
        .values()?
        .contains(&("param_groups.0.lr".into(), "0.01".into())));
    assert_eq!(
        file.select("epoch")?.values()?,
        [(String::new(), "3".into())]
    );
    // a nested key, and a key that is not there
    let w = file.select("model/2.bias")?.load(dev)?;
    assert_eq!((w.len(), w[0].1.shape()), (1, &[2][..]));
    let e = file.select("weights").err().unwrap().to_string();
    assert!(
        e.contains("\"weights\"") && e.contains("\"optimizer\""),
        "{e}"
    );
    // into a model of the same layout
    let net = nn::Sequential::new()
        .add(nn::Linear::new(4, 3, dev)?)
        .add(nn::ReLU)
        .add(nn::Linear::new(3, 2, dev)?);
    assert!(net.load_state_dict(&state, true)?.is_empty());
    for ((n, p), (m, t)) in net.state_dict().iter().zip(&state) {
        assert_eq!((n, bytes_of(p)?), (m, bytes_of(t)?));
    }
    // the whole checkpoint into the model: the prefix is named
    let all: Vec<(String, Tensor)> = state
        .iter()
        .map(|(n, t)| (format!("model.{n}"), t.clone()))
        .collect();
    let e = net.load_state_dict(&all, true).unwrap_err().to_string();
    assert!(e.contains("prefix \"model.\""), "{e}");
    // the whole file into the model: refused for its names, from the file's
    // structure, before any tensor (or the object ember does not build) is read
    let e = io::load_state_dict(&net, pt("checkpoint.pt"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("prefix \"model.\"") && !e.contains("argparse"),
        "{e}"
    );
    Ok(())
}

fn small_net_gives_pytorchs_output(dev: &Device) -> Result<()> {
    let _rng = super::rng_lock();
    let exp = &expected()["small_net"];
    let mut net = nn::Sequential::new()
        .add(nn::Conv2d::new(
            3,
            4,
            3,
            Conv2dOptions::default().padding(1),
            dev,
        )?)
        .add(nn::BatchNorm2d::new(4, dev)?)
        .add(nn::ReLU)
        .add(nn::Flatten::default())
        .add(nn::Linear::new(4 * 5 * 5, 3, dev)?);
    // the file is told apart from safetensors by its first bytes
    io::load_state_dict(&net, pt("small_net.pth"))?;
    net.eval();
    let x = &exp["input"];
    let xs: Vec<f32> = unhex(x["hex"].as_str().unwrap())
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let x = Tensor::from_vec(xs, [2, 3, 5, 5], dev)?;
    let y = ember::no_grad(|| net.forward(&x))?;
    let want: Vec<f64> = serde_json::from_value(exp["output"].clone()).unwrap();
    assert_eq!(y.shape(), &[2, 3]);
    super::assert_close(&super::vals(&y), &want, 1e-5, 1e-5);
    Ok(())
}

/// Hugging Face's GPT-2 (transformers' GPT2LMHeadModel, 2 layers of width 32)
/// from its pytorch_model.bin-style state dict gives its logits.
fn gpt2_gives_hugging_faces_logits(dev: &Device) -> Result<()> {
    use ember::models::{self, CharGpt, GptConfig};
    let exp = &expected()["gpt2_tiny"];
    let hf = io::load_pt(pt("gpt2_tiny.bin"), dev)?;
    let config = GptConfig {
        vocab_size: 96,
        context: 16,
        layers: 2,
        heads: 4,
        width: 32,
        dropout: 0.0,
    };
    let mut model = CharGpt::new_gpt2(config, dev)?;
    let state = models::gpt2_state_from_hf(&hf)?;
    assert!(model.load_state_dict(&state, true)?.is_empty());
    model.eval();
    let ids: Vec<Vec<i64>> = serde_json::from_value(exp["ids"].clone()).unwrap();
    let x = Tensor::from_vec(ids[0].clone(), [1, ids[0].len()], dev)?;
    let logits = ember::no_grad(|| model.forward(&x))?;
    let shape: Vec<usize> = serde_json::from_value(exp["logits_shape"].clone()).unwrap();
    assert_eq!(logits.shape(), shape.as_slice());
    let want: Vec<f64> = serde_json::from_value(exp["logits"].clone()).unwrap();
    super::assert_close(&super::vals(&logits), &want, 1e-4, 1e-4);
    // a head that is not the embedding, and a name GPT-2 does not have
    let mut untied = hf.clone();
    let i = untied
        .iter()
        .position(|(n, _)| n == "lm_head.weight")
        .unwrap();
    untied[i].1 = (&untied[i].1 * 2.0f64).contiguous()?;
    let e = models::gpt2_state_from_hf(&untied).unwrap_err().to_string();
    assert!(e.contains("lm_head.weight differs"), "{e}");
    let mut extra = hf.clone();
    extra.push((
        "transformer.h.0.attn.rotary".into(),
        Tensor::zeros([1], DType::F32, dev)?,
    ));
    let e = models::gpt2_state_from_hf(&extra).unwrap_err().to_string();
    assert!(e.contains("transformer.h.0.attn.rotary"), "{e}");
    Ok(())
}

device_test!(
    files_load_bit_for_bit,
    checkpoint_parts,
    small_net_gives_pytorchs_output,
    gpt2_gives_hugging_faces_logits
);

#[test]
fn entries_describe_views_without_reading_them() -> Result<()> {
    let file = PtFile::open(pt("views.pt"))?;
    let e = file.entries()?;
    let get = |n: &str| e.iter().find(|x| x.name == n).unwrap().clone();
    let t = get("transposed");
    assert_eq!(
        (t.shape, t.stride, t.storage_offset),
        (vec![5, 4, 3], vec![1, 5, 20], 0)
    );
    let s = get("sliced");
    assert_eq!(
        (s.shape, s.stride, s.storage_offset),
        (vec![2, 2, 3], vec![20, 10, 1], 21)
    );
    assert_eq!(get("broadcast").stride, [0, 0]);
    let c = get("scalar");
    assert_eq!((c.shape.len(), c.storage_offset, c.nbytes()), (0, 33, 4));
    assert_eq!(get("base").storage, get("again").storage);
    assert_eq!(
        (get("base").storage_numel, get("base").dtype.name),
        (60, "float32")
    );
    assert_eq!(get("ints").dtype.dtype, Some(DType::I64));
    Ok(())
}

#[test]
fn a_dtype_ember_lacks_is_listed_and_named_when_loaded() -> Result<()> {
    let file = PtFile::open(pt("int32.pt"))?;
    let e = file.entries()?;
    assert_eq!(
        (e[1].name.as_str(), e[1].dtype.name, e[1].dtype.dtype),
        ("counts", "int32", None)
    );
    // uint16 is named by the tensor, over an untyped storage counted in bytes
    assert_eq!(
        (e[2].name.as_str(), e[2].dtype.name, e[2].storage_numel),
        ("u16", "uint16", 3)
    );
    let err = file.load(&Device::Cpu).unwrap_err().to_string();
    assert!(err.contains("\"counts\"") && err.contains("int32"), "{err}");
    assert_eq!(
        file.select("ok")?.load(&Device::Cpu)?[0]
            .1
            .to_vec::<f32>()?,
        [1.0, 1.0]
    );
    Ok(())
}

#[test]
fn a_whole_module_is_refused_with_what_to_save_instead() {
    let e = io::load_pt(pt("module.pt"), &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("torch.nn.modules.linear.Linear") && e.contains("state_dict()"),
        "{e}"
    );
    // loaded into a model: the same reason, not the model's keys as missing
    let linear = nn::Linear::new(2, 2, &Device::Cpu).unwrap();
    let e = io::load_state_dict(&linear, pt("module.pt"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("state_dict()") && !e.contains("missing"), "{e}");
    // a TorchScript file is named as one
    let e = io::load_state_dict(&linear, pt("script.pt"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("TorchScript") && e.contains("state_dict()"),
        "{e}"
    );
    // a numpy array is not taken for a model
    let e = io::load_pt(pt("numpy.pt"), &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(e.contains("numpy") && !e.contains("model"), "{e}");
}

#[test]
fn code_in_a_file_is_named_never_run() -> Result<()> {
    let file = PtFile::open(pt("os_system.pt"))?;
    let e = file.load(&Device::Cpu).unwrap_err().to_string();
    // (os.system pickles under its home module's name)
    assert!(
        e.contains("`posix.system`") && e.contains("\"payload\""),
        "{e}"
    );
    assert_eq!(
        file.select("weight")?.load(&Device::Cpu)?[0]
            .1
            .to_vec::<f32>()?,
        [1.0, 1.0]
    );
    let e = io::load_pt(pt("eval.pt"), &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(e.contains("`builtins.eval`"), "{e}");
    Ok(())
}

#[test]
fn pt_and_safetensors_are_told_apart() -> Result<()> {
    assert!(io::is_pt_file(pt("views.pt")) && io::is_pt_file(pt("views_legacy.pt")));
    assert!(!io::is_pt_file(pt("expected.json")) && !io::is_pt_file(pt("no-such-file")));
    let e = PtFile::open(pt("expected.json")).err().unwrap().to_string();
    assert!(e.contains("not a PyTorch file"), "{e}");
    Ok(())
}

#[test]
fn load_state_dict_strict_and_not() -> Result<()> {
    let _rng = super::rng_lock();
    let dev = Device::Cpu;
    let src = nn::Linear::new(3, 2, &dev)?;
    let dst = nn::Linear::new(3, 2, &dev)?;
    let before = dst.weight.to_vec2::<f32>()?;
    let state = src.state_dict();
    // an extra entry: refused when strict (nothing copied), reported when not
    let mut extra = state.clone();
    extra.push(("head.weight".into(), Tensor::zeros([1], DType::F32, &dev)?));
    let e = dst.load_state_dict(&extra, true).unwrap_err().to_string();
    assert!(e.contains("unexpected keys: \"head.weight\""), "{e}");
    assert_eq!(dst.weight.to_vec2::<f32>()?, before);
    let r = dst.load_state_dict(&extra, false)?;
    assert_eq!(
        (r.missing_keys.len(), r.unexpected_keys),
        (0, vec!["head.weight".to_string()])
    );
    assert_eq!(dst.weight.to_vec2::<f32>()?, src.weight.to_vec2::<f32>()?);
    // a shape that differs is an error in both modes, and copies nothing
    let other = nn::Linear::new(3, 2, &dev)?;
    let wrong = vec![
        (
            "weight".to_string(),
            Tensor::zeros([3, 2], DType::F32, &dev)?,
        ),
        ("bias".to_string(), other.bias.as_ref().unwrap().clone()),
    ];
    for strict in [true, false] {
        let e = dst.load_state_dict(&wrong, strict).unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
        assert!(e.to_string().contains("size mismatch for weight"), "{e}");
        assert_eq!(
            dst.bias.as_ref().unwrap().to_vec::<f32>()?,
            src.bias.as_ref().unwrap().to_vec::<f32>()?
        );
    }
    // entries are converted to the parameter's dtype
    let f64_state: Vec<(String, Tensor)> = state
        .iter()
        .map(|(n, t)| Ok((n.clone(), t.to_dtype(DType::F64)?)))
        .collect::<Result<_>>()?;
    let fresh = nn::Linear::new(3, 2, &dev)?;
    fresh.load_state_dict(&f64_state, true)?;
    assert_eq!(
        (fresh.weight.dtype(), fresh.weight.to_vec2::<f32>()?),
        (DType::F32, src.weight.to_vec2::<f32>()?)
    );
    // the model's names longer than the state's: said too
    let wrapped = nn::Sequential::new().add(nn::Linear::new(3, 2, &dev)?);
    let e = wrapped
        .load_state_dict(&state, true)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("missing keys: \"0.weight\", \"0.bias\"") && e.contains("prefix \"0.\""),
        "{e}"
    );
    Ok(())
}

/// The Python that writes the zoo's files: `EMBER_TORCH_PYTHON`, else `python3`;
/// `None` (with the reason) when it cannot import torch.
fn torch_python() -> std::result::Result<String, String> {
    let py = std::env::var("EMBER_TORCH_PYTHON").unwrap_or_else(|_| "python3".into());
    match std::process::Command::new(&py)
        .args(["-c", "import torch"])
        .output()
    {
        Ok(o) if o.status.success() => Ok(py),
        Ok(_) => Err(format!("{py} cannot import torch")),
        Err(e) => Err(format!("{py}: {e}")),
    }
}

/// torchvision's ResNet-18 and ResNet-50 (resnet*.pth as torch.save writes them)
/// give PyTorch's outputs in ember's zoo models. The files are large, so they are
/// written here by PyTorch when it is installed (set EMBER_TORCH_PYTHON to a
/// Python that has it); without it the test says it skipped. EMBER_PT_ZOO_ALL=1
/// adds AlexNet, VGG-11 and VGG-16 (1.3 GB of files).
#[test]
fn zoo_models_load_pytorchs_files() -> Result<()> {
    let py = match torch_python() {
        Ok(py) => py,
        Err(why) => {
            println!("zoo_models_load_pytorchs_files: skipped ({why}; set EMBER_TORCH_PYTHON)");
            return Ok(());
        }
    };
    let dir = std::env::temp_dir().join(format!("ember-pt-zoo-{}", std::process::id()));
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/gen_pt.py");
    let every = std::env::var("EMBER_PT_ZOO_ALL").is_ok_and(|v| v == "1");
    let out = std::process::Command::new(&py)
        .args([script, "--zoo"])
        .arg(&dir)
        .args(every.then_some("--all"))
        .output()
        .expect("run gen_pt.py");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let zoo: Json =
        serde_json::from_str(&std::fs::read_to_string(dir.join("zoo.json")).unwrap()).unwrap();
    let shape: Vec<usize> = serde_json::from_value(zoo["input_shape"].clone()).unwrap();
    let n: usize = shape.iter().product();
    let x = Tensor::linspace(-2.0, 2.0, n, DType::F32, &Device::Cpu)?.reshape(shape)?;
    for (name, m) in zoo["models"].as_object().unwrap() {
        let mut model = ember::models::by_name(name, 1000, &Device::Cpu)?;
        io::load_state_dict(&model, m["file"].as_str().unwrap())?;
        model.eval();
        let y = ember::no_grad(|| model.forward(&x))?;
        let want: Vec<f64> = serde_json::from_value(m["output"].clone()).unwrap();
        super::assert_close(&super::vals(&y), &want, 1e-3, 1e-4);
        println!("zoo_models_load_pytorchs_files: {name} matches PyTorch's output");
    }
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}
