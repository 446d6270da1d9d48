//! Runs the `ember` binary as a user would.

use std::process::Command;

fn ember(args: &[&str]) -> (bool, String, String) {
    ember_with(args, &[])
}

fn ember_with(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(args)
        .envs(env.iter().copied())
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .output()
        .expect("running ember");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn devices_lists_the_cpu_and_the_gpus_or_why_none() {
    let (ok, out, _) = ember(&["devices"]);
    assert!(ok);
    assert!(out.contains("cpu: ") && out.contains("cores"), "{out}");
    assert!(out.contains("cuda:"), "{out}");
    assert!(out.contains("best available device: "), "{out}");
    // a library found is shown with the version that loaded
    if let Some(nvrtc) = out.lines().find(|l| l.starts_with("  nvrtc: /")) {
        assert!(nvrtc.contains("(version 1"), "{nvrtc}");
    } else {
        println!("(no NVRTC here: its version line is not checked)");
    }
    // the main thread works in the CPU pool (ember::cpu::init_threads), except
    // where the pool has one thread, which is then a thread of its own
    let (ok, out, _) = ember_with(&["devices"], &[("RAYON_NUM_THREADS", "3")]);
    assert!(ok);
    assert!(
        out.contains("3 worker threads, the main thread one of them"),
        "{out}"
    );
    let (ok, out, _) = ember_with(&["devices"], &[("RAYON_NUM_THREADS", "1")]);
    assert!(ok && out.contains(", 1 worker thread)"), "{out}");
}

fn percent(out: &str, prefix: &str) -> f64 {
    out.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|v| v.trim_end_matches('%').parse().ok())
        .unwrap_or_else(|| panic!("no {prefix:?} line in\n{out}"))
}

#[test]
fn short_training_run_reports_device_loss_and_accuracy() {
    // the Iris lesson: 100 full-batch epochs
    let (ok, out, err) = ember(&["train", "iris", "--device", "cpu"]);
    assert!(ok, "{err}");
    for want in [
        "device: cpu",
        "time per epoch:",
        "final loss:",
        "test accuracy:",
    ] {
        assert!(out.contains(want), "missing {want:?} in\n{out}");
    }
    assert!(percent(&out, "test accuracy: ") >= 90.0, "{out}");
    // not a terminal: one progress line per epoch on stderr
    assert_eq!(
        err.lines().filter(|l| l.starts_with("epoch ")).count(),
        100,
        "{err}"
    );
}

#[test]
fn plot_checkpoint_and_resume() {
    let dir = std::env::temp_dir().join(format!("ember-cli-{}", std::process::id()));
    let (svg, ck) = (dir.join("curves.svg"), dir.join("ck"));
    let (svg_s, ck_s) = (svg.to_str().unwrap(), ck.to_str().unwrap());
    let common = ["train", "digits", "--model", "mlp", "--device", "cpu", "-q"];
    let run = |extra: &[&str]| {
        let args: Vec<&str> = common.iter().chain(extra).copied().collect();
        ember(&args)
    };
    let (ok, out, err) = run(&["--epochs", "2", "--plot", svg_s, "--checkpoint", ck_s]);
    assert!(ok, "{err}");
    assert!(
        out.contains("(2 epochs in") && !out.contains("before resuming"),
        "{out}"
    );
    assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));
    let csv = std::fs::read_to_string(dir.join("curves.csv")).unwrap();
    assert_eq!(csv.lines().count(), 3, "{csv}");
    assert!(ck.join("last.safetensors").exists(), "{out}");
    let png = dir.join("resumed.png");
    let png_s = png.to_str().unwrap();
    let (ok, out, err) = run(&[
        "--epochs",
        "4",
        "--checkpoint",
        ck_s,
        "--resume",
        "--plot",
        png_s,
    ]);
    assert!(ok, "{err}");
    assert!(std::fs::read(&png).unwrap().starts_with(b"\x89PNG\r\n"));
    assert!(out.contains("after epoch 2"), "{out}");
    // the epochs of the history, those of the first run among them
    assert!(out.contains("(4 epochs in"), "{out}");
    assert!(out.contains(" ms, the first 2 before resuming)"), "{out}");
    assert!(percent(&out, "test accuracy: ") > 90.0, "{out}");
    // a finished run asked for no more epochs: nothing to do, nothing trained
    let (ok, out, err) = run(&["--epochs", "3", "--checkpoint", ck_s, "--resume"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("nothing to do") && out.contains("at epoch 4") && !out.contains("training"),
        "{out}"
    );
    // a setting that changes the result is refused, naming it, before training
    for (flag, value, want) in [
        ("--batch-size", "32", "batch_size is 64 there and 32 here"),
        ("--lr", "0.1", "lr is 0.01 there and 0.1 here"),
        ("--seed", "5", "seed is 32 there and 5 here"),
    ] {
        let (ok, out, err) = run(&[
            "--epochs",
            "6",
            "--checkpoint",
            ck_s,
            "--resume",
            flag,
            value,
        ]);
        assert!(!ok, "{flag} {value}: {out}");
        assert!(
            err.contains(want) && !out.contains("training"),
            "{flag} {value}: {out}{err}"
        );
    }
    // another run's checkpoint is not replaced unless asked; nor is a plot
    let (ok, out, err) = run(&["--epochs", "1", "--checkpoint", ck_s]);
    assert!(
        !ok && err.contains("another run's checkpoint") && err.contains("--resume"),
        "{err}"
    );
    assert!(!out.contains("training"), "{out}");
    let (ok, _, err) = run(&["--epochs", "1", "--plot", svg_s]);
    assert!(
        !ok && err.contains("the file exists") && err.contains("--force"),
        "{err}"
    );
    let copy = dir.join("ck-copy");
    std::fs::create_dir_all(&copy).unwrap();
    std::fs::copy(ck.join("last.safetensors"), copy.join("last.safetensors")).unwrap();
    let copy_s = copy.to_str().unwrap();
    let (ok, _, err) = run(&[
        "--epochs",
        "1",
        "--checkpoint",
        copy_s,
        "--plot",
        svg_s,
        "--force",
    ]);
    assert!(ok, "{err}");
    // a damaged checkpoint is refused, naming the tensor
    let file = ck.join("last.safetensors");
    let mut bytes = std::fs::read(&file).unwrap();
    let n = bytes.len();
    bytes[n - 1] ^= 1;
    std::fs::write(&file, &bytes).unwrap();
    let (ok, _, err) = run(&["--epochs", "6", "--checkpoint", ck_s, "--resume"]);
    assert!(!ok && err.contains("is damaged"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A run never writes over its own input, and refuses data that holds NaN or
/// infinity, naming the line.
#[test]
fn inputs_are_never_overwritten_and_must_be_finite() {
    let dir = std::env::temp_dir().join(format!("ember-cli-inputs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let iris = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../data/iris.csv"))
        .unwrap();
    std::fs::write(dir.join("iris.csv"), &iris).unwrap();
    let d = dir.to_str().unwrap();
    let plot = dir.join("iris.png");
    // the plot's CSV would be dd/iris.csv, the data itself: refused, even forced
    for force in [false, true] {
        let mut args = vec![
            "train",
            "iris",
            "--data",
            d,
            "--plot",
            plot.to_str().unwrap(),
        ];
        if force {
            args.push("--force");
        }
        let (ok, out, err) = ember(&args);
        assert!(!ok && err.contains("the run's input"), "{out}{err}");
        assert_eq!(std::fs::read_to_string(dir.join("iris.csv")).unwrap(), iris);
    }
    // a checkpoint remembers its data: resuming on another file of the same size
    // is refused, naming it
    let ck = dir.join("ck");
    let ck_s = ck.to_str().unwrap();
    let (ok, _, err) = ember(&[
        "train",
        "iris",
        "--data",
        d,
        "--epochs",
        "1",
        "--checkpoint",
        ck_s,
        "-q",
    ]);
    assert!(ok, "{err}");
    let swapped = iris.replacen("5.1,3.5", "5.1,3.6", 1);
    assert_eq!(swapped.len(), iris.len());
    std::fs::write(dir.join("iris.csv"), &swapped).unwrap();
    let (ok, out, err) = ember(&[
        "train",
        "iris",
        "--data",
        d,
        "--epochs",
        "2",
        "--checkpoint",
        ck_s,
        "--resume",
    ]);
    assert!(
        !ok && err.contains("data is ") && !out.contains("training"),
        "{out}{err}"
    );
    std::fs::write(dir.join("iris.csv"), &iris).unwrap();
    let (ok, _, err) = ember(&[
        "train",
        "iris",
        "--data",
        d,
        "--epochs",
        "2",
        "--checkpoint",
        ck_s,
        "--resume",
        "-q",
    ]);
    assert!(ok, "{err}");
    // a NaN feature on line 5, and an infinite one
    for bad in ["nan", "inf"] {
        let mut lines: Vec<String> = iris.lines().map(str::to_string).collect();
        let mut cells: Vec<&str> = lines[4].split(',').collect();
        cells[1] = bad;
        lines[4] = cells.join(",");
        std::fs::write(dir.join("iris.csv"), lines.join("\n") + "\n").unwrap();
        let (ok, out, err) = ember(&["train", "iris", "--data", d, "--epochs", "1"]);
        assert!(!ok && !out.contains("final loss"), "{out}");
        assert!(
            err.contains("iris.csv:5:")
                && err.contains("sepal_width")
                && err.contains("not a finite number"),
            "{err}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `--cuda-graphs` off a GPU trains as without it, and the first line says so
/// (the README's "on a GPU": not silently ignored).
#[test]
fn cuda_graphs_off_a_gpu_say_so() {
    let run = |graphs: bool| {
        let mut args = vec!["train", "iris", "--device", "cpu", "--epochs", "3", "-q"];
        if graphs {
            args.push("--cuda-graphs");
        }
        let (ok, out, err) = ember(&args);
        assert!(ok, "{err}");
        out
    };
    let (with, without) = (run(true), run(false));
    let first = with.lines().next().unwrap_or_default();
    assert!(
        first.contains(
            "on cpu, no CUDA graph (--cuda-graphs captures GPU work: not used on this device)"
        ),
        "{with}"
    );
    assert!(!without.contains("CUDA graph"), "{without}");
    // the same seeded steps either way
    let results = |out: &str| -> Vec<String> {
        out.lines()
            .filter(|l| l.starts_with("final loss:") || l.starts_with("test accuracy:"))
            .map(String::from)
            .collect()
    };
    assert_eq!(results(&with).len(), 2, "{with}");
    assert_eq!(results(&with), results(&without));
}

#[test]
fn bad_flags_and_values_fail_with_one_line() {
    for args in [
        &["train", "iris", "--device", "tpu"][..],
        &["train", "iris", "--epochs", "0"],
        &["train", "mnist"],
        &["train", "iris", "--lr", "fast"],
        &["frobnicate"],
        &["train", "iris", "--data", "/nonexistent"],
        &["train", "iris", "--model", "cnn"],
        &["train", "iris", "--batch-size", "0"],
        &["train", "iris", "--resume"],
        &["train", "digits", "--model", "rnn"],
        &["train", "digits", "--model", "vgg16"],
        &["train", "iris", "--input", "3x3"],
        &["train", "fake", "--model", "vgg16", "--input", "3x16x16"],
        &["train", "fake", "--samples", "1"],
        &["train", "iris", "--plot", "curves.jpg"],
        &["train", "iris", "--device", "meta"],
        &["train", "iris", "--optimizer", "lbfgs"],
        &["train", "text", "--cuda-graphs", "--steps", "1"],
        // flags that do not apply are refused, not ignored
        &["train", "text", "--estimate", "--steps", "1"],
        &["train", "text", "--drop-last", "--steps", "1"],
        &["train", "fake", "--data", "/nonexistent", "--samples", "10"],
        &["bench", "--device", "meta", "--quick"],
    ] {
        let (ok, _, err) = ember(args);
        assert!(!ok, "{args:?} should fail");
        assert!(
            err.trim_end()
                .lines()
                .next()
                .is_some_and(|l| l.starts_with("error")),
            "{args:?}: {err}"
        );
    }
    let (_, _, err) = ember(&["train", "iris", "--device", "tpu"]);
    assert!(err.contains("\"cuda:N\""), "{err}");
    // PyTorch has no `gpu` device, and neither has ember; a GPU that is not there
    // is an error before the run's first line
    for dev in ["gpu", "gpu:0"] {
        let (ok, _, err) = ember(&["train", "iris", "--device", dev]);
        assert!(!ok && err.contains("invalid device string"), "{err}");
    }
    let (ok, out, err) = ember(&["train", "iris", "--device", "cuda:7", "--epochs", "1"]);
    if std::env::var_os("EMBER_CUDA_SIMULATOR").is_none() {
        assert!(!ok && out.is_empty(), "{out}{err}");
    } else {
        // the simulator has one device
        assert!(
            !ok && out.is_empty() && err.contains("cuda:7"),
            "{out}{err}"
        );
    }
    let (_, _, err) = ember(&["train", "digits", "--model", "vgg16"]);
    assert!(err.contains("ember train fake --model vgg16"), "{err}");
    // an input the model cannot take fails on meta, naming the layer, before any
    // data is drawn or training starts
    let (_, out, err) = ember(&["train", "fake", "--model", "vgg16", "--input", "3x16x16"]);
    assert!(
        err.contains("max_pool2d") && err.contains("features.29") && out.is_empty(),
        "{out}{err}"
    );
    // `meta` parses, but has no values to train on or to time
    let (_, out, err) = ember(&["train", "iris", "--device", "meta"]);
    assert!(
        err.contains("no values") && !out.contains("epoch"),
        "{out}{err}"
    );
    // a plot file that cannot be written fails before any training
    let (_, out, err) = ember(&["train", "iris", "--plot", "curves.jpg"]);
    assert!(
        err.contains(".svg or .png") && !out.contains("epoch"),
        "{out}{err}"
    );
}

#[test]
fn bench_says_why_it_has_no_gpu_rows_and_output_can_be_cut_short() {
    if std::env::var_os("EMBER_CUDA_SIMULATOR").is_none() {
        let (ok, out, err) = ember(&["bench", "--quick", "--suite", "ops", "--sizes", "16"]);
        assert!(ok, "{err}");
        assert!(out.contains("cuda: no rows ("), "{out}");
    }
    // a reader that stops early (`ember devices | head -1`) ends ember quietly
    let mut child = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["bench", "--quick", "--suite", "ops", "--sizes", "16"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running ember");
    let mut first = [0u8; 1];
    use std::io::Read;
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    // the pipe is closed here (the handle dropped), with most of the output unread
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn help_describes_the_commands() {
    let (ok, out, _) = ember(&["--help"]);
    assert!(
        ok && out.contains("devices") && out.contains("train"),
        "{out}"
    );
    let (ok, out, _) = ember(&["train", "--help"]);
    for flag in [
        "--device",
        "--epochs",
        "--batch-size",
        "--lr",
        "--model",
        "--plot",
        "--checkpoint",
        "--resume",
    ] {
        assert!(ok && out.contains(flag), "{flag} missing from\n{out}");
    }
}

#[test]
fn quick_cpu_benchmark_prints_a_table_and_json() {
    let json = std::env::temp_dir().join(format!("ember-bench-{}.jsonl", std::process::id()));
    let (ok, out, err) = ember(&[
        "bench",
        "--device",
        "cpu",
        "--quick",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    for want in [
        "copy 256x256 f32",
        "mul 256x256 f32",
        "add bias 256x256 + 256 f32",
        "add transposed 256x256 f32",
        "sum dim 0 of 256x256 f32",
        "sum dim 1 of 256x256 f32",
        "matmul 128 f32",
        "matmul 128 bf16",
        "linear 64x32 -> 64 f32",
        "linear 64x32 -> 64 bf16",
        "conv2d fwd+bwd 8x4x8x8 k3 p1 o8",
        "conv3d fwd+bwd 1x2x4x8x8 k3 p1 o4",
        "attention fwd+bwd causal 1x2x128x64 f32",
        "layer norm fwd+bwd 64x32 f32",
        "tiny add 4x4",
        "GB/s",
        "GFLOP/s",
        "train iris mlp, 10 epochs",
        "train mlp 784-1024-1024-10 b32",
        "train mlp 784-1024-1024-10 b32, autocast bf16",
        "train cnn mnist-sized b8",
        "train cnn mnist-sized b8, autocast bf16",
        "train digits cnn epoch (1437 imgs, b64)",
        "transformer encoder layer fwd+bwd b4 l32 w64",
        "train char-gpt 4x32 ctx32 b4",
        "samples/s",
    ] {
        assert!(out.contains(want), "{want:?} missing in\n{out}");
    }
    let lines = std::fs::read_to_string(&json).unwrap();
    assert_eq!(lines.lines().count(), 26, "{lines}");
    // training rows carry their share of the GEMM rate measured in the ops suite
    let mlp = lines.lines().find(|l| l.contains("train mlp")).unwrap();
    assert!(
        mlp.contains("\"unit\": \"samples/s\"") && !mlp.contains("\"share\": null"),
        "{mlp}"
    );
    assert!(lines
        .lines()
        .all(|l| l.starts_with("{\"device\": \"cpu\"") && l.contains("\"median_s\": ")));
    std::fs::remove_file(&json).unwrap();
    // a bad device or suite is a one-line error
    let (ok, _, err) = ember(&["bench", "--device", "tpu"]);
    assert!(!ok && err.contains("invalid device string"), "{err}");
    let (ok, _, err) = ember(&["bench", "--device", "cpu", "--suite", "nope"]);
    assert!(!ok && err.contains("unknown suite"), "{err}");
}

#[test]
fn estimate_channels_last() {
    // the default, cuDNN, which convolves channels-last as it lies (a test pass
    // may switch it off for the whole run)
    let cudnn = [("EMBER_CUDNN", "1")];
    let args = [
        "estimate",
        "--model",
        "resnet18",
        "--input",
        "3x32x32",
        "--batch-size",
        "8",
    ];
    let peak = |extra: &[&str]| -> usize {
        let (ok, out, err) = ember_with(&[&args[..], extra].concat(), &cudnn);
        assert!(ok, "{err}");
        // the summary says which layout was estimated
        let summary = out
            .lines()
            .find(|l| l.starts_with("batch size 8, "))
            .unwrap_or_else(|| panic!("no summary in\n{out}"));
        assert_eq!(
            summary.contains(", float32, channels-last: "),
            extra.contains(&"--channels-last"),
            "{summary}"
        );
        let line = out
            .lines()
            .find_map(|l| l.strip_prefix("peak allocated:"))
            .unwrap_or_else(|| panic!("no peak in\n{out}"));
        let size = line.split(" (").next().unwrap().trim();
        ember::memory::parse_bytes(size).unwrap_or_else(|e| panic!("{size}: {e}"))
    };
    // the same tensors laid out otherwise: no copies to row-major in the step
    let (row_major, channels_last) = (peak(&[]), peak(&["--channels-last"]));
    assert!(
        channels_last <= row_major,
        "channels-last {channels_last} bytes, row-major {row_major}"
    );
    let (ok, _, err) = ember(&["estimate", "--model", "mlp", "--channels-last"]);
    assert!(!ok && err.contains("--channels-last"), "{err}");
}

/// `--checkpoint-activations` recomputes gpt2_small's blocks in the backward pass instead
/// of keeping their activations: a lower peak; VGG has no blocks to
/// checkpoint.
#[test]
fn estimate_checkpoint_activations() {
    let args = [
        "estimate",
        "--model",
        "gpt2_small",
        "--input",
        "1024",
        "--batch-size",
        "4",
        "--optimizer",
        "adam",
    ];
    let peak = |extra: &[&str]| -> usize {
        let (ok, out, err) = ember(&[&args[..], extra].concat());
        assert!(ok, "{err}");
        let line = out
            .lines()
            .find_map(|l| l.strip_prefix("peak allocated:"))
            .unwrap_or_else(|| panic!("no peak in\n{out}"));
        let size = line.split(" (").next().unwrap().trim();
        ember::memory::parse_bytes(size).unwrap_or_else(|e| panic!("{size}: {e}"))
    };
    let (kept, recomputed) = (peak(&[]), peak(&["--checkpoint-activations"]));
    assert!(
        recomputed < kept,
        "checkpointed {recomputed} bytes, kept {kept}"
    );
    let (ok, _, err) = ember(&["estimate", "--model", "vgg16", "--checkpoint-activations"]);
    assert!(!ok && err.contains("--checkpoint-activations"), "{err}");
}

/// `ember bench --suite SUITE --quick --device cpu --json FILE`, which must
/// succeed: its standard output and the JSON file's text.
fn quick_cpu_suite(suite: &str) -> (String, String) {
    let json = std::env::temp_dir().join(format!("ember-{suite}-{}.jsonl", std::process::id()));
    let (ok, out, err) = ember(&[
        "bench",
        "--suite",
        suite,
        "--quick",
        "--device",
        "cpu",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let lines = std::fs::read_to_string(&json).unwrap();
    std::fs::remove_file(&json).unwrap();
    (out, lines)
}

#[test]
fn quick_models_suite_writes_its_rows_with_estimates() {
    let (out, lines) = quick_cpu_suite("models");
    assert!(
        out.contains("peak mem") && out.contains("estimate"),
        "{out}"
    );
    let names = [
        "train resnet50 b2 32x32",
        "train resnet50 b2 32x32, autocast bf16",
        "train gpt 2x128 v512 b2x64",
        "train gpt 2x128 v512 b2x64, autocast bf16",
    ];
    assert_eq!(lines.lines().count(), names.len(), "{lines}");
    for (line, name) in lines.lines().zip(names) {
        assert!(line.contains(&format!("\"name\": \"{name}\"")), "{line}");
        assert!(line.contains("\"unit\": \"samples/s\""), "{line}");
        // the CPU keeps no peak statistics; the estimate is of a GPU's step
        assert!(line.contains("\"peak_bytes\": null"), "{line}");
        let estimate: u64 = line
            .split("\"estimate_bytes\": ")
            .nth(1)
            .and_then(|v| v.trim_end_matches('}').parse().ok())
            .unwrap_or_else(|| panic!("no estimate in {line}"));
        assert!(estimate > 1 << 20, "{line}");
    }
}

/// The pieces suite: each model's layers forward and backward, in f32 and bf16,
/// by the names PyTorch's counterpart (`device_ops.py --suite pieces`) gives
/// its rows, so that `bench/compare_devices` pairs them.
#[test]
fn quick_pieces_suite_writes_every_piece_in_both_dtypes() {
    let (_, lines) = quick_cpu_suite("pieces");
    let pieces = [
        "conv 3x3 64->64 at 8x8 b1 fwd+bwd",
        "conv 1x1 256->64 at 8x8 b1 fwd+bwd",
        "conv 3x3 256->256 at 4x4 b1 fwd+bwd",
        "conv 3x3 64->64 at 8x8 b1 channels-last fwd+bwd",
        "conv 1x1 256->64 at 8x8 b1 channels-last fwd+bwd",
        "conv 3x3 256->256 at 4x4 b1 channels-last fwd+bwd",
        "batch norm 256ch at 8x8 b1 fwd+bwd",
        "batch norm 256ch at 8x8 b1 channels-last fwd+bwd",
        "relu 1x256x8x8 fwd+bwd",
        "attention causal 1x2x64x32 fwd+bwd",
        "layer norm 64x96 fwd+bwd",
        "gelu 64x384 fwd+bwd",
        "linear 64x96 -> 384 fwd+bwd",
        "cross-entropy 64x1000 fwd+bwd",
    ];
    let names: Vec<String> = ["f32", "bf16"]
        .iter()
        .flat_map(|t| pieces.iter().map(move |p| format!("{p} {t}")))
        .collect();
    assert_eq!(lines.lines().count(), names.len(), "{lines}");
    for (line, name) in lines.lines().zip(&names) {
        assert!(line.contains(&format!("\"name\": \"{name}\"")), "{line}");
        let median: f64 = line
            .split("\"median_s\": ")
            .nth(1)
            .and_then(|v| v.split(',').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no median in {line}"));
        assert!(median > 0.0, "{line}");
    }
}

/// `--filter` keeps the pieces whose name contains it (both dtypes' attention
/// here), as it keeps the models suite's rows.
#[test]
fn pieces_filter_keeps_the_named_pieces() {
    let (ok, out, err) = ember(&[
        "bench",
        "--suite",
        "pieces",
        "--quick",
        "--device",
        "cpu",
        "--filter",
        "attention",
    ]);
    assert!(ok, "{err}");
    for dt in ["f32", "bf16"] {
        let row = format!("attention causal 1x2x64x32 fwd+bwd {dt}");
        assert_eq!(out.matches(&row).count(), 1, "{row}: {out}");
    }
    for other in [
        "conv ",
        "batch norm",
        "relu",
        "layer norm",
        "gelu",
        "linear",
        "cross-entropy",
    ] {
        assert!(!out.contains(other), "{other}: {out}");
    }
}

/// `--profile`: a few steps after a warm-up, the top of the per-op table, the
/// Chrome trace (one per row of the models suite).
#[test]
fn profile_prints_the_top_ops_and_writes_the_trace() {
    let dir = std::env::temp_dir().join(format!("ember-cli-profile-{}", std::process::id()));
    let trace = dir.join("digits.json");
    let (ok, out, err) = ember(&[
        "train",
        "digits",
        "--device",
        "cpu",
        "--epochs",
        "1",
        "-q",
        "--profile",
        trace.to_str().unwrap(),
        "--profile-steps",
        "2",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("profile of CNN: 2 steps after at least 3 of warm-up"),
        "{out}"
    );
    for op in ["conv2d_backward", "conv2d", "addmm", "adam_step"] {
        assert!(
            out.lines().any(|l| l.starts_with(&format!("{op} "))),
            "{op}: {out}"
        );
    }
    let text = std::fs::read_to_string(&trace).expect("the trace was written");
    assert!(text.starts_with("{\"traceEvents\":[") && text.contains("\"train_step\""));
    // the models suite: one row, one trace named after it
    let (ok, out, err) = ember(&[
        "bench",
        "--suite",
        "models",
        "--quick",
        "--device",
        "cpu",
        "--filter",
        "gpt 2x128 v512 b2x64, autocast",
        "--profile",
        dir.join("bench.json").to_str().unwrap(),
        "--profile-steps",
        "1",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("profile of train gpt 2x128 v512 b2x64, autocast bf16 on cpu: 1 step "),
        "{out}"
    );
    assert_eq!(out.matches("profile of").count(), 1, "{out}");
    assert!(out.contains("to_dtype"), "autocast's casts: {out}");
    assert!(dir
        .join("bench-cpu-train-gpt-2x128-v512-b2x64-autocast-bf16.json")
        .exists());
    // --json naming the file a row's trace would be: refused before any row runs
    let rows = dir.join("b-cpu-train-gpt-2x128-v512-b2x64-autocast-bf16.json");
    let (ok, out, err) = ember(&[
        "bench",
        "--suite",
        "models",
        "--quick",
        "--device",
        "cpu",
        "--filter",
        "gpt 2x128 v512 b2x64, autocast",
        "--profile",
        dir.join("b.json").to_str().unwrap(),
        "--json",
        rows.to_str().unwrap(),
    ]);
    assert!(!ok, "{out}");
    assert!(err.contains("would be written where --json is"), "{err}");
    assert!(!out.contains("profile of") && !rows.exists(), "{out}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `ember estimate --amp` estimates the step `ember train --amp` runs: float32
/// parameters, the forward pass under autocast.
/// `ember estimate`'s verdict names the need it is judged by, and its flags are
/// checked (and named) before the table is printed.
#[test]
fn estimate_verdicts_and_flags() {
    // 13 GiB is less than the unconstrained need, but the step runs in it (the
    // allocator releases its cache): the verdict says how much it needs at least
    let (ok, out, err) = ember(&[
        "estimate",
        "--model",
        "vgg16",
        "--batch-size",
        "128",
        "--memory",
        "13GiB",
    ]);
    assert!(ok, "{err}");
    let verdict = out
        .lines()
        .find(|l| l.starts_with("batch size 128 "))
        .expect("a verdict");
    assert!(
        verdict.starts_with("batch size 128 fits on 13GiB")
            && verdict.contains("it needs at least"),
        "{verdict}"
    );
    let least: f64 = verdict
        .split("at least ")
        .nth(1)
        .and_then(|r| r.split(" GiB").next())
        .and_then(|n| n.parse().ok())
        .expect("a size in GiB");
    assert!(least <= 13.0, "{verdict}");
    for (args, want) in [
        (
            &["estimate", "--model", "vgg16", "--memory", "1e40GiB"][..],
            "not a size between",
        ),
        (
            &["estimate", "--model", "vgg16", "--memory", "2EiB"][..],
            "not a size between",
        ),
        (
            &["estimate", "--model", "vgg16", "--memory", "3 furlongs"][..],
            "unknown unit",
        ),
        (
            &["estimate", "--model", "vgg16", "--max-batch"][..],
            "--max-batch needs the memory",
        ),
        (
            &["estimate", "--model", "resnet18", "--input", "3x32"][..],
            "--input 3x32: resnet18 takes 3xHxW",
        ),
        (
            &["estimate", "--model", "mlp", "--input", "3x8"][..],
            "--input 3x8: mlp takes [features]",
        ),
        (
            &["estimate", "--model", "alexnet", "--input", "3x8x8"][..],
            "--input 3x8x8: alexnet cannot take",
        ),
    ] {
        let (ok, out, err) = ember(args);
        assert!(!ok && err.contains(want), "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?} printed before failing:\n{out}");
    }
}

/// The README's memory table (AlexNet and VGG-16 at batch 128, f32 and bf16)
/// says what `ember estimate` prints: its peak allocated and peak reserved rows.
#[test]
fn readme_memory_table_matches_ember_estimate() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let row = |start: &str| -> Vec<String> {
        let line = readme
            .lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no README row {start:?}"));
        line.split('|')
            .skip(2)
            .map(|c| c.trim().trim_matches('*').to_string())
            .filter(|c| !c.is_empty())
            .collect()
    };
    let (allocated, reserved) = (
        row("| **peak allocated** (second step, backward)"),
        row("| peak reserved from the driver"),
    );
    let columns = [
        ("alexnet", "f32"),
        ("alexnet", "bf16"),
        ("vgg16", "f32"),
        ("vgg16", "bf16"),
    ];
    assert_eq!((allocated.len(), reserved.len()), (4, 4));
    for (i, (model, dtype)) in columns.iter().enumerate() {
        // the README's table is of the default: convolutions through cuDNN (a
        // test pass may switch it off for the whole run)
        let (ok, out, err) = ember_with(
            &[
                "estimate",
                "--model",
                model,
                "--batch-size",
                "128",
                "--dtype",
                dtype,
            ],
            &[("EMBER_CUDNN", "1")],
        );
        assert!(ok, "{err}");
        let printed = |prefix: &str| -> String {
            out.lines()
                .find_map(|l| l.strip_prefix(prefix))
                .map(|r| r.split(" (").next().unwrap().trim().to_string())
                .unwrap_or_else(|| panic!("no {prefix:?} in\n{out}"))
        };
        assert_eq!(
            printed("peak allocated:"),
            allocated[i],
            "{model} {dtype}: the README's peak allocated"
        );
        assert_eq!(
            printed("peak reserved:"),
            reserved[i],
            "{model} {dtype}: the README's peak reserved"
        );
    }
}

#[test]
fn estimate_under_autocast() {
    let (ok, out, err) = ember(&[
        "estimate",
        "--model",
        "cnn",
        "--batch-size",
        "64",
        "--amp",
        "bf16",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("float32 under bfloat16 autocast:"), "{out}");
    let (ok, _, err) = ember(&[
        "estimate",
        "--model",
        "cnn",
        "--batch-size",
        "64",
        "--amp",
        "bf16",
        "--dtype",
        "bf16",
    ]);
    assert!(
        !ok && err.contains("--amp keeps the parameters in float32"),
        "{err}"
    );
}

#[test]
fn estimate_prints_the_table_the_peak_and_the_largest_batch() {
    let (ok, out, err) = ember(&["estimate", "--model", "alexnet", "--batch-size", "128"]);
    assert!(ok, "{err}");
    for want in [
        "61,100,840 parameters",
        "features.0",
        "[128, 64, 55, 55]",
        "classifier.6",
        "peak allocated: ",
        "peak reserved: ",
        "optimizer state",
        "activations",
    ] {
        assert!(out.contains(want), "{want:?} missing in\n{out}");
    }
    let (ok, out, err) = ember(&[
        "estimate",
        "--model",
        "resnet18",
        "--input",
        "3x32x32",
        "--memory",
        "4GiB",
        "--max-batch",
    ]);
    assert!(ok, "{err}");
    let best: usize = out
        .lines()
        .find_map(|l| l.strip_prefix("largest batch size that fits: "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no largest batch in\n{out}"));
    assert!(best > 128, "{out}");
    assert!(out.contains("batch size 128 fits on 4GiB"), "{out}");
    // a language model: T token ids per sample, a next token at each
    let (ok, out, err) = ember(&[
        "estimate",
        "--model",
        "gpt2_small",
        "--batch-size",
        "2",
        "--input",
        "256",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("batch size 2, 2 training steps, float32: 124,475,904 parameters"),
        "{out}"
    );
    // its module table: the children CharGpt runs, each block's layers, and
    // each layer's children, with their outputs (the head's logits [2, 256, 50304])
    let row = |name: &str| {
        out.lines()
            .find(|l| l.trim_start().starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no row {name} in\n{out}"))
    };
    assert!(row("tok_emb").contains("[2, 256, 768]"), "{out}");
    assert!(
        row("blocks.layers.11.self_attn").contains("[2, 256, 768]"),
        "{out}"
    );
    assert!(
        row("blocks.layers.0.linear1").contains("[2, 256, 3072]"),
        "{out}"
    );
    assert!(row("head").contains("[2, 256, 50304]"), "{out}");
    for (args, want) in [
        (
            &["estimate", "--model", "lenet"][..],
            "the models are alexnet",
        ),
        (
            &["estimate", "--model", "alexnet", "--input", "3x32x32"],
            "the last module to finish was features.",
        ),
        (
            &["estimate", "--model", "vgg16", "--memory", "12 parsecs"],
            "unknown unit",
        ),
        (
            &["estimate", "--model", "vgg16", "--max-batch"],
            "--max-batch needs",
        ),
        (
            &["estimate", "--model", "vgg16", "--input", "3x0x7"],
            "positive sizes",
        ),
        (
            &["estimate", "--model", "vgg16", "--device", "cpu"],
            "CUDA device",
        ),
        (
            &["estimate", "--model", "gpt2_small", "--input", "2048"],
            "1 <= T <= 1024",
        ),
        (
            &["estimate", "--model", "gpt2_small", "--classes", "10"],
            "its own vocabulary",
        ),
    ] {
        let (ok, _, err) = ember(args);
        assert!(!ok, "{args:?}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// `ember` with the CUDA simulator standing in for a GPU of `memory_mb` MiB
/// (set on the child, so it runs in every test pass).
fn ember_on_simulator(args: &[&str], memory_mb: usize) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(args)
        .env("EMBER_CUDA_SIMULATOR", "1")
        .env("EMBER_SIM_MEMORY_MB", memory_mb.to_string())
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .output()
        .expect("running ember");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `ember train --checkpoint-activations` recomputes ResNet-18's blocks in
/// the backward pass: the same gradients and running statistics, so the same
/// losses and accuracies to the last digit printed (at this size the
/// recomputation's temporaries outweigh the activations it saves: the
/// estimates' comparison is `estimate_checkpoint_activations`'); models
/// without blocks refuse.
#[test]
fn train_with_checkpointed_activations() {
    let args = [
        "train",
        "fake",
        "--model",
        "resnet18",
        "--input",
        "3x32x32",
        "--classes",
        "10",
        "--samples",
        "20",
        "--batch-size",
        "8",
        "--device",
        "cpu",
        "--estimate",
    ];
    let run = |extra: &[&str]| -> String {
        let (ok, out, err) = ember(&[&args[..], extra].concat());
        assert!(ok, "{err}");
        assert!(out.contains("peak allocated:"), "no estimate in\n{out}");
        // the training lines, without their timings
        let losses: Vec<&str> = out
            .lines()
            .filter(|l| l.contains("loss") || l.contains("accuracy"))
            .map(|l| l.split(" in ").next().unwrap_or(l))
            .collect();
        assert!(!losses.is_empty(), "no training lines in\n{out}");
        losses.join("\n")
    };
    assert_eq!(run(&[]), run(&["--checkpoint-activations"]));
    let (ok, _, err) = ember(&["train", "digits", "--checkpoint-activations"]);
    assert!(!ok && err.contains("--checkpoint-activations"), "{err}");
}

#[test]
fn train_estimates_on_the_cpu_and_refuses_a_gpu_run_that_cannot_fit() {
    let (ok, out, err) = ember(&[
        "train",
        "fake",
        "--model",
        "resnet18",
        "--input",
        "3x32x32",
        "--classes",
        "10",
        "--samples",
        "20",
        "--batch-size",
        "4",
        "--device",
        "cpu",
        "--estimate",
        "-q",
    ]);
    assert!(ok, "{err}");
    for want in [
        "layer4.1",
        "peak allocated:",
        "training ResNet-18 (11181642 parameters)",
    ] {
        assert!(out.contains(want), "missing {want:?} in\n{out}");
    }
    // AlexNet with Adam at batch 512 on a 1.1 GB GPU: refused up front, with the
    // largest batch that fits
    let args = [
        "train",
        "fake",
        "--model",
        "alexnet",
        "--input",
        "3x64x64",
        "--samples",
        "40",
        "--batch-size",
        "512",
        "--device",
        "cuda:0",
    ];
    let (ok, out, err) = ember_on_simulator(&args, 1100);
    assert!(!ok && !out.contains("epoch"), "{out}{err}");
    for want in [
        "needs an estimated",
        "not started",
        "--skip-memory-check",
        "--optimizer adam",
    ] {
        assert!(err.contains(want), "missing {want:?} in\n{err}");
    }
    let best: usize = err
        .split("the largest batch that fits is ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no largest batch in\n{err}"));
    // the batch it names fits, and one more does not
    let fits = |b: usize| {
        let b = b.to_string();
        let (ok, out, err) = ember(&[
            "estimate",
            "--model",
            "alexnet",
            "--input",
            "3x64x64",
            "--optimizer",
            "adam",
            "--batch-size",
            &b,
            "--memory",
            "1100MiB",
        ]);
        assert!(ok, "{err}");
        !out.contains("does NOT fit")
    };
    assert!(best > 1 && best < 512, "{err}");
    assert!(fits(best) && !fits(best + 1), "{best}: {err}");
}

#[test]
fn train_on_a_gpu_prints_the_measured_peak_next_to_the_estimate() {
    let (ok, out, err) = ember_on_simulator(
        &[
            "train", "digits", "--device", "cuda:0", "--epochs", "1", "-q",
        ],
        4096,
    );
    assert!(ok, "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("peak memory allocated: "))
        .unwrap_or_else(|| panic!("no peak line in\n{out}"));
    // "peak memory allocated: 14.66 MiB measured, 14.21 MiB estimated (...)"
    let mib = |s: &str| -> f64 {
        let v: Vec<&str> = s.split_whitespace().collect();
        assert_eq!(v[1], "MiB", "{line}");
        v[0].parse().unwrap()
    };
    let rest = line.trim_start_matches("peak memory allocated: ");
    let (measured, estimated) = rest.split_once(" measured, ").unwrap();
    let (measured, estimated) = (mib(measured), mib(estimated));
    assert!((measured - estimated).abs() / measured <= 0.05, "{line}");
    // the host waits for the GPU when it reads the epoch's loss and metrics, not
    // at every step
    let waits = out
        .lines()
        .find_map(|l| l.strip_prefix("host waits for the GPU while training: "))
        .unwrap_or_else(|| panic!("no host-wait line in\n{out}"));
    let (n, rest) = waits.split_once(" in ").unwrap();
    let n: usize = n.parse().unwrap();
    let steps: usize = rest.split_whitespace().next().unwrap().parse().unwrap();
    assert!(steps == 1437usize.div_ceil(64) && n <= 4, "{waits}");
}

#[test]
fn train_with_cuda_graphs_replays_the_captured_step() {
    let (ok, out, err) = ember_on_simulator(
        &[
            "train",
            "digits",
            "--model",
            "mlp",
            "--device",
            "cuda:0",
            "--epochs",
            "1",
            "-q",
            "--cuda-graphs",
        ],
        4096,
    );
    assert!(ok, "{err}");
    assert!(out.contains("Adam lr 0.01"), "{out}");
    assert!(out.contains("the step captured in a CUDA graph"), "{out}");
    // 1437 samples in batches of 64: 22 full batches (the first eager), one partial
    assert!(
        out.contains("steps replayed from a CUDA graph: 21 of 23"),
        "{out}"
    );
    assert!(percent(&out, "test accuracy: ") >= 70.0, "{out}");
}

#[test]
fn train_with_amp_says_so_and_learns() {
    for (amp, says) in [
        ("bf16", "autocast bfloat16"),
        ("f16", "autocast float16 with loss scaling"),
    ] {
        let (ok, out, err) = ember(&["train", "iris", "--amp", amp, "-q"]);
        assert!(ok, "{err}");
        assert!(out.contains(says), "{out}");
        assert!(percent(&out, "test accuracy: ") >= 90.0, "{out}");
    }
    // bfloat16 on the simulated GPU, with its step captured in a CUDA graph
    let (ok, out, err) = ember_on_simulator(
        &[
            "train",
            "digits",
            "--model",
            "mlp",
            "--device",
            "cuda:0",
            "--epochs",
            "1",
            "-q",
            "--amp",
            "bf16",
            "--cuda-graphs",
        ],
        4096,
    );
    assert!(ok, "{err}");
    assert!(
        out.contains("steps replayed from a CUDA graph: 21 of 23"),
        "{out}"
    );
    assert!(percent(&out, "test accuracy: ") >= 70.0, "{out}");
    let (ok, _, err) = ember(&["train", "iris", "--amp", "f32"]);
    assert!(!ok && err.contains("invalid value 'f32'"), "{err}");
}

#[test]
fn output_paths_and_values_are_checked_before_any_work() {
    let dir = std::env::temp_dir().join(format!("ember-cli-paths-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let (file_s, dir_s) = (file.to_str().unwrap(), dir.to_str().unwrap());
    let missing = dir.join("no-checkpoint");
    let plot_in_file = file.join("curves.svg");
    let trace_in_file = file.join("trace.json");
    for (args, want) in [
        (
            vec!["train", "iris", "--lr", "-1"],
            "--lr -1: the learning rate",
        ),
        (
            vec!["train", "iris", "--lr", "inf"],
            "--lr inf: the learning rate",
        ),
        (
            vec!["train", "iris", "--checkpoint", file_s],
            "this is a file",
        ),
        (
            vec!["train", "iris", "--plot", plot_in_file.to_str().unwrap()],
            "a folder is needed",
        ),
        (
            vec![
                "train",
                "iris",
                "--checkpoint",
                missing.to_str().unwrap(),
                "--resume",
            ],
            "there is no checkpoint folder",
        ),
        (vec!["bench", "--sizes", "0", "--quick"], "at least 1"),
        (
            vec![
                "train",
                "digits",
                "--profile",
                trace_in_file.to_str().unwrap(),
            ],
            "a folder is needed",
        ),
        (
            vec![
                "train",
                "text",
                "--profile",
                trace_in_file.to_str().unwrap(),
            ],
            "a folder is needed",
        ),
        (
            vec!["bench", "--suite", "ops", "--quick", "--profile"],
            "--profile is for --suite models",
        ),
        (
            vec!["bench", "--json", dir_s, "--quick"],
            "this is a folder",
        ),
    ] {
        let (ok, out, err) = ember(&args);
        assert!(!ok, "{args:?} should fail");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(
            !out.contains("training") && !out.contains("epoch"),
            "{args:?}: {out}"
        );
    }
    // a plot in folders that do not exist yet: they are made before training
    let plot = dir.join("new/deeper/curves.svg");
    let (ok, out, err) = ember(&[
        "train",
        "iris",
        "--epochs",
        "1",
        "-q",
        "--plot",
        plot.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(plot.exists(), "{out}");
    assert!(out.contains("(1 epoch in"), "{out}");
    let (_, help, _) = ember(&["--help"]);
    assert!(
        help.contains("With no command, `ember` trains the digits CNN"),
        "{help}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// `ember train text` trains a (tiny, here) character GPT on the shipped text,
/// reports the validation loss beside the unigram baseline, saves the model with
/// its vocabulary, and `ember generate` samples from it; bad options are refused
/// before training.
#[test]
fn text_model_trains_saves_and_generates() {
    let dir = std::env::temp_dir().join(format!("ember-cli-text-{}", std::process::id()));
    let d = dir.to_str().unwrap();
    let run = [
        "train",
        "text",
        "--device",
        "cpu",
        "--steps",
        "4",
        "--layers",
        "1",
        "--heads",
        "2",
        "--width",
        "16",
        "--context",
        "16",
        "--batch-size",
        "4",
        "--eval-every",
        "2",
        "--eval-batches",
        "1",
        "--sample",
        "30",
        "--top-k",
        "5",
        "--checkpoint",
        d,
    ];
    let (ok, out, err) = ember(&run);
    assert!(ok, "{err}");
    let val: f64 = out
        .lines()
        .find_map(|l| l.strip_prefix("validation loss: "))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no validation loss in\n{out}"));
    assert!(val.is_finite() && val > 0.0, "{out}");
    assert!(out.contains("unigram baseline 2.98"), "{out}");
    assert!(out.contains("step     4/4"), "{out}");
    let sample = out
        .split("sample (temperature 0.8, top-k 5):\n")
        .nth(1)
        .expect("a sample");
    assert!(
        sample.starts_with("And Jesus said") && sample.trim_end().chars().count() >= 44,
        "{sample}"
    );
    // resumed with every step done: nothing trained, the sample still printed
    let resumed: Vec<&str> = run.iter().copied().chain(["--resume"]).collect();
    let (ok, again, err) = ember(&resumed);
    assert!(ok, "{err}");
    assert!(
        again.contains("nothing to do") && !again.contains("step     4/4"),
        "{again}"
    );
    let sample_again = again
        .split("sample (temperature 0.8, top-k 5):\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no sample in\n{again}"));
    // the trained model's, drawn as the first run drew it
    assert_eq!(sample_again, sample, "{again}");
    let (ok, gen, err) = ember(&[
        "generate",
        "--checkpoint",
        d,
        "--chars",
        "20",
        "--prompt",
        "Amen",
        "--device",
        "cpu",
    ]);
    assert!(ok, "{err}");
    assert!(
        gen.starts_with("Amen") && gen.trim_end().chars().count() >= 24,
        "{gen}"
    );
    // generate prints as it goes: a long run shows its first characters long
    // before it ends (read them, then stop it, as an interrupted run would be)
    {
        use std::io::Read;
        let mut child = Command::new(env!("CARGO_BIN_EXE_ember"))
            .args([
                "generate",
                "--checkpoint",
                d,
                "--chars",
                "1000000",
                "--prompt",
                "Amen",
            ])
            .args(["--device", "cpu"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("run ember generate");
        let mut stdout = child.stdout.take().unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 64];
        while got.len() < 10 {
            let n = stdout.read(&mut buf).unwrap();
            assert!(
                n > 0,
                "generate ended after {:?}",
                String::from_utf8_lossy(&got)
            );
            got.extend_from_slice(&buf[..n]);
        }
        child.kill().ok();
        child.wait().ok();
        assert!(
            got.starts_with(b"Amen"),
            "{:?}",
            String::from_utf8_lossy(&got)
        );
    }
    // the folder holds this run's model: another run refuses it without --force
    let tiny = [
        "train",
        "text",
        "--device",
        "cpu",
        "--steps",
        "1",
        "--layers",
        "1",
        "--heads",
        "2",
        "--width",
        "16",
        "--context",
        "16",
        "--batch-size",
        "2",
        "--eval-batches",
        "1",
        "--checkpoint",
        d,
    ];
    let (ok, _, err) = ember(&tiny);
    assert!(
        !ok && err.contains("another run's checkpoint") && err.contains("--force"),
        "{err}"
    );
    let forced: Vec<&str> = tiny.iter().copied().chain(["--force"]).collect();
    let (ok, _, err) = ember(&forced);
    assert!(ok, "{err}");
    std::fs::remove_dir_all(&dir).ok();
    // a text too short for the context, and an empty one, named before training
    let small = std::env::temp_dir().join(format!("ember-cli-text-small-{}", std::process::id()));
    std::fs::create_dir_all(&small).unwrap();
    let text_file = small.join("kjv-new-testament.txt");
    std::fs::write(&text_file, "In the beginning was the Word.\n").unwrap();
    let small_s = small.to_str().unwrap();
    let (ok, _, err) = ember(&["train", "text", "--data", small_s, "--device", "cpu"]);
    assert!(
        !ok && err.contains("--context 128") && err.contains("holds 31 characters"),
        "{err}"
    );
    std::fs::write(&text_file, "").unwrap();
    let (ok, _, err) = ember(&["train", "text", "--data", small_s, "--device", "cpu"]);
    assert!(!ok && err.contains("is empty"), "{err}");
    std::fs::remove_dir_all(&small).ok();
    for (args, want) in [
        (
            &["train", "text", "--epochs", "2"][..],
            "--steps, not --epochs",
        ),
        (
            &["train", "text", "--width", "10", "--heads", "4"][..],
            "a multiple of --heads",
        ),
        (&["train", "text", "--steps", "0"][..], "must be positive"),
        (
            &["generate", "--checkpoint", "/nonexistent/ember"][..],
            "no such folder (it would hold char-gpt.safetensors)",
        ),
    ] {
        let (ok, _, err) = ember(args);
        assert!(!ok && err.contains(want), "{args:?}: {err}");
    }
}

/// A stand-in for the NVIDIA driver that reports one GPU of compute capability
/// 1.1 and nothing else: what a machine with a driver but without NVRTC, cuBLAS
/// or a supported architecture looks like to ember.
const FAKE_DRIVER: &str = r#"
#include <stddef.h>
int cuInit(unsigned flags) { return 0; }
int cuDriverGetVersion(int *v) { *v = 13000; return 0; }
int cuDeviceGetCount(int *n) { *n = 1; return 0; }
int cuDeviceGet(int *d, int i) { *d = i; return 0; }
int cuDeviceGetAttribute(int *v, int attr, int d) { *v = 1; return 0; }
int cuDeviceGetName(char *name, int len, int d) { if (len > 0) name[0] = 0; return 0; }
int cuDeviceTotalMem_v2(size_t *b, int d) { *b = 1 << 30; return 0; }
int cuGetErrorString(int e, const char **s) { *s = "fake driver"; return 0; }
int cuGetErrorName(int e, const char **s) { *s = "CUDA_ERROR_FAKE"; return 0; }
"#;

#[test]
fn a_gpu_ember_cannot_use_is_not_chosen() {
    let dir = std::env::temp_dir().join(format!("ember-fake-driver-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("fake.c");
    std::fs::write(&src, FAKE_DRIVER).unwrap();
    let lib = dir.join("libcuda.so.1");
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o"])
        .arg(&lib)
        .arg(&src)
        .status();
    if !built.is_ok_and(|s| s.success()) {
        println!("skipped a_gpu_ember_cannot_use_is_not_chosen: no C compiler (cc) to build a stand-in driver");
        return;
    }
    // only the stand-in driver is found: no loader path, CUDA install or pip wheel
    // (HOME points at an empty folder)
    let out = Command::new(env!("CARGO_BIN_EXE_ember"))
        .arg("devices")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", &dir)
        .env("EMBER_CUDA_LIB_DIR", &dir)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .output()
        .expect("running ember");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    std::fs::remove_dir_all(&dir).ok();
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(&format!("driver: {}", lib.display())),
        "the stand-in driver was not the one loaded: {text}"
    );
    assert!(text.contains("best available device: cpu"), "{text}");
    // why: NVRTC is missing here; where a CUDA install provides it (and cuBLAS),
    // compute capability 1.1 is what no NVRTC compiles for
    let reason = text
        .lines()
        .find_map(|l| l.strip_prefix("cuda: not available: "))
        .unwrap_or_else(|| panic!("no reason given: {text}"));
    assert!(
        reason.starts_with("the NVIDIA driver reports 1 GPU(s), but ember cannot ")
            && (reason.contains("libnvrtc")
                || reason.contains("libcublas")
                || reason.contains("sm_11")),
        "{reason}"
    );
}

/// `ember inspect` lists PyTorch's files (tests/golden/pt/, written by PyTorch)
/// and safetensors files; `ember convert` writes what `load_pt` reads, and
/// refuses, before reading anything, to overwrite a file or its own input.
#[test]
fn inspect_and_convert_pytorch_files() {
    let golden = "crates/ember/tests/golden/pt";
    let (ok, out, err) = ember(&["inspect", &format!("{golden}/checkpoint.pt")]);
    assert!(ok, "{err}");
    for want in [
        "PyTorch torch.save file (zip archive)",
        "model.0.weight",
        "float32",
        "[3, 4]",
        "optimizer.state.0.exp_avg_sq",
        "epoch = 3",
        "args = <a `argparse.Namespace` object, not read>",
    ] {
        assert!(out.contains(want), "{want:?} in\n{out}");
    }
    let (ok, out, err) = ember(&[
        "inspect",
        &format!("{golden}/views_legacy.pt"),
        "--key",
        "base",
    ]);
    assert!(
        ok && out.contains("legacy format") && out.contains("[3, 4, 5]"),
        "{out}{err}"
    );
    let (ok, out, _) = ember(&["inspect", &format!("{golden}/int32.pt")]);
    assert!(ok && out.contains("int32 (not in ember)"), "{out}");

    let dir = std::env::temp_dir().join(format!("ember-cli-convert-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out_path = dir.join("model.safetensors");
    let out_s = out_path.to_str().unwrap();
    // the whole checkpoint holds an object ember does not build: refused, naming
    // the part to pick, and nothing written
    let ck = format!("{golden}/checkpoint.pt");
    let (ok, _, err) = ember(&["convert", &ck, out_s]);
    assert!(
        !ok && err.contains("argparse.Namespace") && err.contains("--key"),
        "{err}"
    );
    assert!(!out_path.exists());
    let (ok, out, err) = ember(&["convert", &ck, out_s, "--key", "model"]);
    assert!(ok && out.contains("wrote 4 tensors"), "{out}{err}");
    let written = ember::io::load(&out_path, &ember::Device::Cpu).unwrap();
    let golden_abs =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ember/tests/golden/pt");
    let source = ember::io::PtFile::open(golden_abs.join("checkpoint.pt"))
        .unwrap()
        .select("model")
        .unwrap()
        .load(&ember::Device::Cpu)
        .unwrap();
    assert_eq!(written.len(), source.len());
    for (name, b) in &source {
        let (_, a) = written
            .iter()
            .find(|(n, _)| n == name)
            .expect("every tensor written");
        assert_eq!(
            a.to_vec::<f32>().unwrap(),
            b.to_vec::<f32>().unwrap(),
            "{name}"
        );
    }
    let (ok, out, _) = ember(&["inspect", out_s]);
    assert!(
        ok && out.contains("safetensors file") && out.contains("0.weight"),
        "{out}"
    );
    // an existing output is kept unless --force
    let before = std::fs::read(&out_path).unwrap();
    let (ok, _, err) = ember(&["convert", &format!("{golden}/small_net.pth"), out_s]);
    assert!(!ok && err.contains("--force"), "{err}");
    assert_eq!(std::fs::read(&out_path).unwrap(), before);
    let (ok, _, err) = ember(&[
        "convert",
        &format!("{golden}/small_net.pth"),
        out_s,
        "--force",
    ]);
    assert!(ok, "{err}");
    assert_ne!(std::fs::read(&out_path).unwrap(), before);
    // its own input, a file that is not PyTorch's, a dtype ember lacks
    for (args, want) in [
        (
            vec!["convert", &ck, &ck, "--force"],
            "OUTPUT is the input file",
        ),
        (
            vec!["convert", out_s, "x.safetensors"],
            "not a torch.save file",
        ),
        (
            vec!["convert", &format!("{golden}/no-such.pt"), "x.safetensors"],
            "no such file",
        ),
        (
            vec!["inspect", &format!("{golden}/no-such.pt")],
            "no such file",
        ),
        (
            vec!["inspect", out_s, "--key", "model"],
            "--key selects a part",
        ),
    ] {
        let (ok, _, err) = ember(&args);
        assert!(!ok && err.contains(want), "{args:?}: {err}");
    }
    // a file that is one tensor: named after the file, and the output says
    // format = pt (Hugging Face's loaders look for it)
    let one_out = dir.join("one.safetensors");
    let (ok, out, err) = ember(&[
        "convert",
        &format!("{golden}/one_tensor.pt"),
        one_out.to_str().unwrap(),
    ]);
    assert!(ok && out.contains("\"one_tensor\""), "{out}{err}");
    let written = ember::io::load(&one_out, &ember::Device::Cpu).unwrap();
    assert_eq!(written[0].0, "one_tensor");
    assert_eq!(
        written[0].1.to_vec::<f32>().unwrap(),
        [0., 1., 2., 3., 4., 5.]
    );
    assert!(ember::io::metadata(&one_out)
        .unwrap()
        .contains(&("format".to_string(), "pt".to_string())));
    let int_out = dir.join("int32.safetensors");
    let (ok, _, err) = ember(&[
        "convert",
        &format!("{golden}/int32.pt"),
        int_out.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("\"counts\" is int32"), "{err}");
    assert!(!int_out.exists());
    // an output named with a trailing separator is a folder: refused before
    // any work (it failed at the end, the work lost)
    let (ok, out, err) = ember(&["train", "iris", "--epochs", "1", "--plot", "curves.png/"]);
    assert!(!ok && err.contains("names a folder"), "{out}{err}");
    assert!(!out.contains("epoch"), "{out}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `ember train text` killed at any moment resumes to exactly the parameters of
/// an uninterrupted run: five kills at random moments of one run (each resumed
/// with --resume from the last step saved), then the run finished; the final
/// model is compared bit for bit with the uninterrupted run's (CPU, dropout on).
#[test]
fn text_training_killed_anywhere_resumes_exactly() {
    use std::time::{Duration, Instant};
    let base = std::env::temp_dir().join(format!("ember-cli-text-kill-{}", std::process::id()));
    let (whole, cut) = (base.join("whole"), base.join("cut"));
    let common = [
        "train",
        "text",
        "--device",
        "cpu",
        "--steps",
        "120",
        "--layers",
        "1",
        "--heads",
        "2",
        "--width",
        "16",
        "--context",
        "16",
        "--batch-size",
        "4",
        "--eval-every",
        "40",
        "--eval-batches",
        "1",
        "--dropout",
        "0.1",
        "--checkpoint-every",
        "1",
        "-q",
    ];
    let args_for = |dir: &std::path::Path| -> Vec<String> {
        let mut a: Vec<String> = common.iter().map(|s| s.to_string()).collect();
        a.extend(["--checkpoint".to_string(), dir.display().to_string()]);
        if dir.join("train-state.safetensors").exists() {
            a.push("--resume".into());
        } else if dir.join("char-gpt.safetensors").exists() {
            a.push("--force".into());
        }
        a
    };
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(args_for(&whole))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let took = start.elapsed();
    // kill points spread over the run's length (a small generator: no extra crate)
    let mut state = u64::from(std::process::id()) ^ 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % 1000) as f64 / 1000.0
    };
    let step_saved = |dir: &std::path::Path| -> Option<i64> {
        let file = dir.join("train-state.safetensors");
        let all = ember::io::load(&file, &ember::Device::Cpu).ok()?;
        let (_, t) = all.iter().find(|(n, _)| n == "trial.step")?;
        t.to_vec::<i64>().ok()?.first().copied()
    };
    let mut interrupted_at = Vec::new();
    for _ in 0..5 {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ember"))
            .args(args_for(&cut))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_secs_f64(
            took.as_secs_f64() * (0.05 + 0.3 * next()),
        ));
        child.kill().ok();
        child.wait().ok();
        interrupted_at.push(step_saved(&cut));
    }
    // finish the interrupted run
    let out = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(args_for(&cut))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        interrupted_at
            .iter()
            .any(|s| s.is_some_and(|s| (1..120).contains(&s))),
        "no kill landed inside the run (steps saved at each kill: {interrupted_at:?}; \
         the whole run took {took:?})"
    );
    let load = |dir: &std::path::Path| {
        ember::io::load(dir.join("char-gpt.safetensors"), &ember::Device::Cpu).unwrap()
    };
    let (a, b) = (load(&whole), load(&cut));
    assert_eq!(a.len(), b.len());
    for (n, x) in &a {
        let bits = |t: &ember::Tensor| -> Vec<u32> {
            t.to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        };
        // (io::load gives a file's tensors in no set order)
        let (_, y) = b.iter().find(|(m, _)| m == n).expect("the same tensors");
        assert!(
            bits(x) == bits(y),
            "{n} differs after resuming at steps {interrupted_at:?}"
        );
    }
    println!("resumed after kills at steps {interrupted_at:?}: the same parameters, bit for bit");
    std::fs::remove_dir_all(&base).ok();
}

/// Every argument that takes a value is checked before any work, and its error
/// names it: one bad value per argument of every subcommand (boolean switches
/// have no value to get wrong; clap refuses values of the wrong type and ranges
/// itself, naming the flag). Nothing is trained, printed or written first.
#[test]
fn every_bad_argument_is_named_before_any_work() {
    let dir = std::env::temp_dir().join(format!("ember-cli-args-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let a_file = dir.join("a-file");
    std::fs::write(&a_file, b"x").unwrap();
    let file = a_file.to_str().unwrap().to_string();
    let in_file = a_file.join("x.svg").to_str().unwrap().to_string();
    let pt = "crates/ember/tests/golden/pt/checkpoint.pt".to_string();
    let out = dir.join("out.safetensors").to_str().unwrap().to_string();
    // (a folder no command may leave behind: its runs are refused)
    let ck_dir = dir.join("ck").join("nested");
    let ck = ck_dir.to_str().unwrap().to_string();
    let ck_plot = ck_dir.join("history.png").to_str().unwrap().to_string();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        // train, the classifiers
        (
            vec!["train", "digits", "--device", "bogus"],
            "--device bogus",
        ),
        (vec!["train", "digits", "--epochs", "0"], "--epochs"),
        (vec!["train", "digits", "--batch-size", "0"], "--batch-size"),
        (vec!["train", "digits", "--lr", "inf"], "--lr inf"),
        (
            vec!["train", "digits", "--optimizer", "rmsprop"],
            "--optimizer",
        ),
        (vec!["train", "digits", "--amp", "fp8"], "--amp"),
        (vec!["train", "digits", "--model", "bogus"], "--model bogus"),
        (
            vec!["train", "fake", "--model", "gpt2_small"],
            "--model gpt2_small is a language model",
        ),
        (vec!["train", "fake", "--input", "3x"], "--input"),
        // a shape the model cannot take (the CNN's linear layer after pooling)
        (
            vec!["train", "fake", "--model", "cnn", "--input", "1x2x2"],
            "--input 1x2x2: cnn cannot take inputs of this shape",
        ),
        (vec!["train", "fake", "--classes", "0"], "--classes"),
        (vec!["train", "fake", "--samples", "1"], "--samples"),
        (vec!["train", "digits", "--seed", "x"], "--seed"),
        (vec!["train", "digits", "--plot", "curves.txt"], "--plot"),
        (vec!["train", "digits", "--plot", &in_file], "--plot"),
        (
            vec!["train", "digits", "--checkpoint", &file],
            "--checkpoint",
        ),
        (
            vec!["train", "digits", "--data", "/nonexistent/ember"],
            "--data /nonexistent/ember",
        ),
        (vec!["train", "digits", "--profile", &in_file], "--profile"),
        (
            vec!["train", "digits", "--profile-steps", "0"],
            "--profile-steps",
        ),
        // train text
        (vec!["train", "text", "--steps", "0"], "--steps 0"),
        (vec!["train", "text", "--context", "0"], "--context 0"),
        (vec!["train", "text", "--layers", "0"], "--layers 0"),
        (vec!["train", "text", "--heads", "0"], "--heads 0"),
        (vec!["train", "text", "--width", "10"], "--width 10"),
        (vec!["train", "text", "--dropout", "1.5"], "--dropout 1.5"),
        (vec!["train", "text", "--eval-every", "0"], "--eval-every 0"),
        (
            vec!["train", "text", "--eval-batches", "0"],
            "--eval-batches 0",
        ),
        (
            vec!["train", "text", "--checkpoint-every", "5"],
            "--checkpoint-every",
        ),
        (vec!["train", "text", "--sample", "x"], "--sample"),
        (
            vec!["train", "text", "--temperature", "nan"],
            "--temperature NaN",
        ),
        (vec!["train", "text", "--top-k", "0"], "--top-k 0"),
        (
            vec!["train", "text", "--top-k", "0", "--sample", "5"],
            "--top-k 0",
        ),
        (
            vec!["train", "text", "--temperature=-1", "--sample", "5"],
            "--temperature -1",
        ),
        (
            vec!["train", "text", "--sample", "5", "--prompt", "Zq@"],
            "--prompt",
        ),
        // options a data set does not take
        (
            vec!["train", "digits", "--steps", "5"],
            "--steps is for `ember train text`",
        ),
        (
            vec!["train", "iris", "--context", "8", "--top-k", "2"],
            "--context, --top-k are for",
        ),
        (
            vec!["train", "iris", "--samples", "10"],
            "--samples sets the size of fake data",
        ),
        (
            vec!["train", "text", "--sample", "5", "--prompt", "@@"],
            "--prompt",
        ),
        // estimate
        (vec!["estimate", "--model", "bogus"], "--model bogus"),
        (
            vec!["estimate", "--model", "vgg16", "--batch-size", "0"],
            "--batch-size",
        ),
        (
            vec!["estimate", "--model", "vgg16", "--input", "3x"],
            "--input",
        ),
        (
            vec!["estimate", "--model", "vgg16", "--classes", "0"],
            "--classes",
        ),
        (
            vec!["estimate", "--model", "vgg16", "--optimizer", "x"],
            "--optimizer",
        ),
        (
            vec!["estimate", "--model", "vgg16", "--dtype", "i64"],
            "--dtype i64",
        ),
        (
            vec!["estimate", "--model", "vgg16", "--dtype", "f12"],
            "--dtype f12",
        ),
        (vec!["estimate", "--model", "vgg16", "--amp", "x"], "--amp"),
        (
            vec!["estimate", "--model", "vgg16", "--device", "cpu"],
            "--device cpu",
        ),
        (
            vec!["estimate", "--model", "vgg16", "--device", "bogus"],
            "--device bogus",
        ),
        (
            vec!["estimate", "--model", "vgg16", "--memory", "lots"],
            "--memory lots",
        ),
        // bench
        (vec!["bench", "--device", "bogus"], "--device bogus"),
        (vec!["bench", "--suite", "foo"], "--suite foo"),
        (vec!["bench", "--sizes", "0", "--quick"], "--sizes"),
        (vec!["bench", "--json", &in_file, "--quick"], "--json"),
        (vec!["bench", "--suite", "ops", "--filter", "x"], "--filter"),
        (
            vec!["bench", "--suite", "models", "--profile", &in_file],
            "--profile",
        ),
        (
            vec![
                "bench",
                "--suite",
                "models",
                "--profile",
                "--profile-steps",
                "0",
            ],
            "--profile-steps",
        ),
        // generate
        (
            vec!["generate", "--checkpoint", "/nonexistent/ember"],
            "--checkpoint /nonexistent/ember",
        ),
        (
            vec!["generate", "--checkpoint", "x", "--chars", "x"],
            "--chars",
        ),
        (
            vec!["generate", "--checkpoint", "x", "--temperature=-1"],
            "--temperature -1",
        ),
        (
            vec!["generate", "--checkpoint", "x", "--top-k", "0"],
            "--top-k 0",
        ),
        (
            vec!["generate", "--checkpoint", "x", "--seed", "x"],
            "--seed",
        ),
        (
            vec!["generate", "--checkpoint", "x", "--device", "bogus"],
            "--device bogus",
        ),
        // inspect and convert
        (
            vec!["inspect", "/nonexistent/ember.pt"],
            "/nonexistent/ember.pt",
        ),
        (vec!["inspect", &pt, "--key", "nope"], "--key nope"),
        (
            vec!["convert", "/nonexistent/ember.pt", &out],
            "/nonexistent/ember.pt",
        ),
        (vec!["convert", &pt, &out, "--key", "nope"], "--key nope"),
        (vec!["convert", &pt, &pt, "--force"], "OUTPUT"),
        // an optional value that took the dataset's place; outputs inside the
        // checkpoint folder; batches that would train nothing, or that the model
        // refuses at each epoch's end; sampling that could not run
        (
            vec!["train", "--profile", "iris", "--epochs", "1"],
            "--profile iris",
        ),
        (
            vec!["train", "iris", "--checkpoint", &ck, "--plot", &ck_plot],
            "--plot",
        ),
        (
            vec!["train", "digits", "--drop-last", "--batch-size", "5000"],
            "--drop-last",
        ),
        (
            vec![
                "train",
                "fake",
                "--model",
                "resnet18",
                "--input",
                "3x32x32",
                "--samples",
                "10",
                "--batch-size",
                "7",
            ],
            "--drop-last",
        ),
        (
            vec!["train", "text", "--sample", "5", "--prompt", ""],
            "--prompt",
        ),
        (
            vec!["generate", "--checkpoint", "x", "--prompt", ""],
            "--prompt",
        ),
        (
            vec!["generate", "--checkpoint", "x", "--device", "meta"],
            "--device meta",
        ),
    ];
    for (args, flag) in cases {
        let (ok, stdout, err) = ember(&args);
        assert!(!ok, "{args:?} was accepted:\n{stdout}");
        assert!(
            err.contains(flag),
            "{args:?}: the error does not name {flag:?}: {err}"
        );
        assert!(
            stdout.is_empty(),
            "{args:?} printed before failing:\n{stdout}"
        );
    }
    assert!(!std::path::Path::new(&out).exists());
    // the folders the refused runs made for their outputs are gone again
    assert!(!dir.join("ck").exists());
    // a filter that keeps no row is an error (after the machine's header, with
    // nothing measured), not an empty table
    let (ok, stdout, err) = ember(&["bench", "--suite", "models", "--quick", "--filter", "zzz"]);
    assert!(
        !ok && err.contains("--filter \"zzz\" matches none"),
        "{err}"
    );
    assert!(!stdout.contains("workload"), "{stdout}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A run whose parameters turn NaN stops at the checkpoint that would hold
/// them, saying so, and keeps the last good one (which still loads); a part of
/// a `torch.save` file converted alone keeps its own name.
#[test]
fn a_diverged_run_keeps_its_last_good_checkpoint() {
    let dir = std::env::temp_dir().join(format!("ember-cli-diverged-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ck = dir.join("ck");
    // three epochs at a learning rate that makes the parameters infinite
    let diverge = |more: &[&str]| {
        let mut a = vec!["train", "iris", "--epochs", "3", "--lr", "1e30"];
        a.extend(["--checkpoint", ck.to_str().unwrap()]);
        a.extend(more);
        ember(&a)
    };
    let (ok, _, err) = diverge(&[]);
    assert!(!ok && err.contains("nothing was saved"), "{err}");
    let history = std::fs::read_to_string(ck.join("history.csv")).unwrap();
    let saved = history.lines().count() - 1;
    assert!((1..3).contains(&saved), "{history}");
    // the checkpoint kept loads: --resume gets as far as training again
    let (_, out, err) = diverge(&["--resume"]);
    let both = format!("{out}{err}");
    assert!(
        both.contains(&format!("after epoch {saved}"))
            && both.contains(&format!("epoch {}/3", saved + 1)),
        "{both}"
    );
    let part = dir.join("part.safetensors");
    let (ok, out, err) = ember(&[
        "convert",
        "crates/ember/tests/golden/pt/checkpoint.pt",
        part.to_str().unwrap(),
        "--key",
        "model/0.weight",
    ]);
    assert!(ok && out.contains("wrote 1 tensor ("), "{out}{err}");
    let (ok, out, err) = ember(&["inspect", part.to_str().unwrap()]);
    assert!(ok && out.contains("0.weight"), "{out}{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `bench --profile FILE` writes one trace a row, named after the row: those
/// files are checked before anything runs, and one that exists is kept.
#[test]
fn bench_profile_checks_the_traces_it_will_write() {
    let dir = std::env::temp_dir().join(format!("ember-cli-traces-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("t.json");
    let row = dir.join("t-cpu-train-resnet50-b2-32x32.json");
    std::fs::write(&row, "{}").unwrap();
    let (ok, _, err) = ember(&[
        "bench",
        "--suite",
        "models",
        "--device",
        "cpu",
        "--quick",
        "--filter",
        "resnet50 b2 32x32",
        "--profile",
        trace.to_str().unwrap(),
    ]);
    assert!(!ok, "refused");
    assert!(
        err.contains("t-cpu-train-resnet50-b2-32x32.json") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&row).unwrap(), "{}");
    std::fs::remove_dir_all(&dir).ok();
}
