//! Loading a PyTorch `torch.save` file: `io::load_pt` onto the CPU beside reading
//! the file's bytes (`std::fs::read`, the floor) and beside opening it (the
//! pickle only). Medians of 7 after one warm-up, so the file is in the page cache.
//! `bench/pt-load` writes ResNet-50's state dict with PyTorch and runs this beside
//! `torch.load`.
//!
//! Run: `cargo bench -p ember --bench pt_load -- FILE`.

use ember::io::PtFile;
use ember::Device;
use std::hint::black_box;
use std::time::Instant;

fn median_ms(mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..7)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn main() {
    // cargo bench passes its own flags (--bench); the file is the one argument
    // that is not a flag
    let Some(path) = std::env::args().skip(1).find(|a| !a.starts_with("--")) else {
        eprintln!("usage: cargo bench -p ember --bench pt_load -- FILE (a torch.save file)");
        std::process::exit(2);
    };
    let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    let read = median_ms(|| {
        black_box(std::fs::read(&path).expect("read the file"));
    });
    let open = median_ms(|| {
        black_box(PtFile::open(&path).expect("open the file"));
    });
    let load = median_ms(|| {
        black_box(ember::io::load_pt(&path, &Device::Cpu).expect("load the file"));
    });
    let tensors = ember::io::load_pt(&path, &Device::Cpu).map_or(0, |t| t.len());
    println!(
        "ember: {path} ({:.1} MB, {tensors} tensors): read the file {read:.1} ms, \
         PtFile::open {open:.1} ms, load_pt {load:.1} ms ({:.2}x the read)",
        bytes as f64 / 1e6,
        load / read
    );
}
