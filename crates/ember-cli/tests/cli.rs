//! Runs the `ember` binary as a user would.

use std::process::Command;

fn ember(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(args)
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
}

#[test]
fn short_training_run_reports_device_loss_and_accuracy() {
    let (ok, out, err) = ember(&["train", "iris", "--epochs", "30", "--device", "cpu"]);
    assert!(ok, "{err}");
    for want in [
        "device: cpu",
        "time per epoch:",
        "final loss:",
        "test accuracy:",
    ] {
        assert!(out.contains(want), "missing {want:?} in\n{out}");
    }
    let acc: f64 = out
        .lines()
        .find_map(|l| l.strip_prefix("train accuracy: "))
        .and_then(|v| v.trim_end_matches('%').parse().ok())
        .expect("train accuracy line");
    assert!(acc > 80.0, "{out}");
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
}

#[test]
fn help_describes_the_commands() {
    let (ok, out, _) = ember(&["--help"]);
    assert!(
        ok && out.contains("devices") && out.contains("train"),
        "{out}"
    );
    let (ok, out, _) = ember(&["train", "--help"]);
    assert!(
        ok && out.contains("--device") && out.contains("--epochs"),
        "{out}"
    );
}
