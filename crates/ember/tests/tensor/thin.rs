//! Printing at the summarisation boundary, as PyTorch prints (`torch.set_printoptions`
//! defaults: threshold 1000, edgeitems 3, linewidth 80): a tensor of 1000 elements is
//! printed in full, one of 1001 shows the first and last 3 of each dim around `...`.
//! The expected strings are PyTorch's own (checked against torch 2's `str(t)`).

use ember::prelude::*;

/// The items of a dim printed in full the way PyTorch lays them out: each right-aligned
/// to `width`, `(80 - indent) / (width + 2)` to a line, continuation lines indented
/// `indent + 1`.
fn full_rows(items: impl Iterator<Item = String>, width: usize, indent: usize) -> String {
    let items: Vec<String> = items.map(|s| format!("{s:>width$}")).collect();
    let per_line = (80 - indent) / (width + 2);
    let lines: Vec<String> = items.chunks(per_line).map(|c| c.join(", ")).collect();
    format!(
        "[{}]",
        lines.join(&format!(",\n{}", " ".repeat(indent + 1)))
    )
}

/// `want` with the device suffix PyTorch adds off the CPU (on the last line, which
/// is short in every case here).
fn on(dev: &Device, want: &str) -> String {
    match dev {
        Device::Cpu => want.to_string(),
        _ => format!("{}, device='{dev}')", &want[..want.len() - 1]),
    }
}

fn printing_at_the_summarisation_threshold(dev: &Device) -> Result<()> {
    // 1000 elements: every one printed
    let t = Tensor::arange(0f32, 1000., dev)?;
    let want = format!(
        "tensor({})",
        full_rows((0..1000).map(|v| format!("{v}.")), 4, 7)
    );
    assert_eq!(want.lines().count(), 84);
    assert_eq!(t.to_string(), on(dev, &want));
    let t = Tensor::arange(0i64, 1000, dev)?;
    let want = format!(
        "tensor({})",
        full_rows((0..1000).map(|v| v.to_string()), 3, 7)
    );
    assert_eq!(t.to_string(), on(dev, &want));
    // 1001: summarised, and the width comes from the values shown
    let t = Tensor::arange(0f32, 1001., dev)?;
    assert_eq!(
        t.to_string(),
        on(
            dev,
            "tensor([   0.,    1.,    2.,  ...,  998.,  999., 1000.])"
        )
    );
    let t = Tensor::arange(0i64, 1001, dev)?;
    assert_eq!(
        t.to_string(),
        on(dev, "tensor([   0,    1,    2,  ...,  998,  999, 1000])")
    );
    Ok(())
}

fn printing_matrices_at_the_summarisation_threshold(dev: &Device) -> Result<()> {
    // [10, 100]: 1000 elements, every row and column printed
    let t = Tensor::arange(0f32, 1000., dev)?.reshape([10, 100])?;
    let rows: Vec<String> = (0..10)
        .map(|r| full_rows((r * 100..(r + 1) * 100).map(|v| format!("{v}.")), 4, 8))
        .collect();
    let want = format!("tensor([{}])", rows.join(",\n        "));
    assert_eq!(t.to_string(), on(dev, &want));
    assert!(!t.to_string().contains("..."));
    // [1000, 1]: more rows than 2 * edgeitems, still printed in full
    let t = Tensor::arange(0f32, 1000., dev)?.reshape([1000, 1])?;
    let s = t.to_string();
    assert_eq!(s.lines().count(), 1000, "{s}");
    assert!(!s.contains("..."));
    assert!(s.ends_with(&on(dev, "[999.]])")), "{s}");
    // 1001 elements over 7 rows: both dims summarised
    let t = Tensor::arange(0f32, 1001., dev)?.reshape([7, 143])?;
    let want = "tensor([[   0.,    1.,    2.,  ...,  140.,  141.,  142.],
        [ 143.,  144.,  145.,  ...,  283.,  284.,  285.],
        [ 286.,  287.,  288.,  ...,  426.,  427.,  428.],
        ...,
        [ 572.,  573.,  574.,  ...,  712.,  713.,  714.],
        [ 715.,  716.,  717.,  ...,  855.,  856.,  857.],
        [ 858.,  859.,  860.,  ...,  998.,  999., 1000.]])";
    assert_eq!(t.to_string(), on(dev, want));
    // [1001, 1]: the rows summarised, the one column not
    let t = Tensor::arange(0f32, 1001., dev)?.reshape([1001, 1])?;
    let want = "tensor([[   0.],
        [   1.],
        [   2.],
        ...,
        [ 998.],
        [ 999.],
        [1000.]])";
    assert_eq!(t.to_string(), on(dev, want));
    // [2, 501]: two rows (not summarised), each summarised; 1 to 1001 spans more
    // than 1000x, so scientific notation
    let t = Tensor::arange(0f32, 1002., dev)?.reshape([2, 501])?;
    let want = "tensor([[0.0000e+00, 1.0000e+00, 2.0000e+00,  ..., 4.9800e+02, 4.9900e+02,
         5.0000e+02],
        [5.0100e+02, 5.0200e+02, 5.0300e+02,  ..., 9.9900e+02, 1.0000e+03,
         1.0010e+03]])";
    assert_eq!(t.to_string(), on(dev, want));
    // [6, 167]: six rows are not more than 2 * edgeitems, so all are printed
    let t = Tensor::arange(1f32, 1003., dev)?.reshape([6, 167])?;
    let want = "tensor([[1.0000e+00, 2.0000e+00, 3.0000e+00,  ..., 1.6500e+02, 1.6600e+02,
         1.6700e+02],
        [1.6800e+02, 1.6900e+02, 1.7000e+02,  ..., 3.3200e+02, 3.3300e+02,
         3.3400e+02],
        [3.3500e+02, 3.3600e+02, 3.3700e+02,  ..., 4.9900e+02, 5.0000e+02,
         5.0100e+02],
        [5.0200e+02, 5.0300e+02, 5.0400e+02,  ..., 6.6600e+02, 6.6700e+02,
         6.6800e+02],
        [6.6900e+02, 6.7000e+02, 6.7100e+02,  ..., 8.3300e+02, 8.3400e+02,
         8.3500e+02],
        [8.3600e+02, 8.3700e+02, 8.3800e+02,  ..., 1.0000e+03, 1.0010e+03,
         1.0020e+03]])";
    assert_eq!(t.to_string(), on(dev, want));
    // [7, 11, 13]: 1001 elements, every dim summarised, blank lines between blocks
    let t = Tensor::arange(0f32, 1001., dev)?.reshape([7, 11, 13])?;
    let want = "tensor([[[   0.,    1.,    2.,  ...,   10.,   11.,   12.],
         [  13.,   14.,   15.,  ...,   23.,   24.,   25.],
         [  26.,   27.,   28.,  ...,   36.,   37.,   38.],
         ...,
         [ 104.,  105.,  106.,  ...,  114.,  115.,  116.],
         [ 117.,  118.,  119.,  ...,  127.,  128.,  129.],
         [ 130.,  131.,  132.,  ...,  140.,  141.,  142.]],

        [[ 143.,  144.,  145.,  ...,  153.,  154.,  155.],
         [ 156.,  157.,  158.,  ...,  166.,  167.,  168.],
         [ 169.,  170.,  171.,  ...,  179.,  180.,  181.],
         ...,
         [ 247.,  248.,  249.,  ...,  257.,  258.,  259.],
         [ 260.,  261.,  262.,  ...,  270.,  271.,  272.],
         [ 273.,  274.,  275.,  ...,  283.,  284.,  285.]],

        [[ 286.,  287.,  288.,  ...,  296.,  297.,  298.],
         [ 299.,  300.,  301.,  ...,  309.,  310.,  311.],
         [ 312.,  313.,  314.,  ...,  322.,  323.,  324.],
         ...,
         [ 390.,  391.,  392.,  ...,  400.,  401.,  402.],
         [ 403.,  404.,  405.,  ...,  413.,  414.,  415.],
         [ 416.,  417.,  418.,  ...,  426.,  427.,  428.]],

        ...,

        [[ 572.,  573.,  574.,  ...,  582.,  583.,  584.],
         [ 585.,  586.,  587.,  ...,  595.,  596.,  597.],
         [ 598.,  599.,  600.,  ...,  608.,  609.,  610.],
         ...,
         [ 676.,  677.,  678.,  ...,  686.,  687.,  688.],
         [ 689.,  690.,  691.,  ...,  699.,  700.,  701.],
         [ 702.,  703.,  704.,  ...,  712.,  713.,  714.]],

        [[ 715.,  716.,  717.,  ...,  725.,  726.,  727.],
         [ 728.,  729.,  730.,  ...,  738.,  739.,  740.],
         [ 741.,  742.,  743.,  ...,  751.,  752.,  753.],
         ...,
         [ 819.,  820.,  821.,  ...,  829.,  830.,  831.],
         [ 832.,  833.,  834.,  ...,  842.,  843.,  844.],
         [ 845.,  846.,  847.,  ...,  855.,  856.,  857.]],

        [[ 858.,  859.,  860.,  ...,  868.,  869.,  870.],
         [ 871.,  872.,  873.,  ...,  881.,  882.,  883.],
         [ 884.,  885.,  886.,  ...,  894.,  895.,  896.],
         ...,
         [ 962.,  963.,  964.,  ...,  972.,  973.,  974.],
         [ 975.,  976.,  977.,  ...,  985.,  986.,  987.],
         [ 988.,  989.,  990.,  ...,  998.,  999., 1000.]]])";
    assert_eq!(t.to_string(), on(dev, want));
    Ok(())
}

/// A summarised tensor's notation and width come from the values shown only: large
/// values among those left out change nothing.
fn summarised_printing_ignores_the_hidden_values(dev: &Device) -> Result<()> {
    let mut v: Vec<f32> = (0..1001).map(|i| i as f32).collect();
    // the first and the last value hidden, and one in the middle
    v[3] = -7777.0;
    v[997] = 55555.0;
    v[500] = 123_456_789.0;
    let t = Tensor::from_vec(v, [1001], dev)?;
    assert_eq!(
        t.to_string(),
        on(
            dev,
            "tensor([   0.,    1.,    2.,  ...,  998.,  999., 1000.])"
        )
    );
    Ok(())
}

/// The suffixes (dtype, device) follow PyTorch's rule with ember's own suffix
/// text (`dtype=float64` where PyTorch writes `dtype=torch.float64`, so the golden
/// cases compare their line breaks as if unwrapped): a suffix stays on the last
/// line while that line, with ", ", the suffix and the closing parenthesis, fits
/// in the 80 columns; otherwise it starts its own line, indented. Float64 rows of
/// 1 to 30 values cross the boundary at every distance.
fn suffixes_wrap_at_the_line_width(dev: &Device) -> Result<()> {
    let (mut kept, mut wrapped) = (0, 0);
    for n in 1..=30usize {
        for scale in [1.5, 12.5, 123.5] {
            let v: Vec<f64> = (1..=n).map(|k| scale * k as f64).collect();
            let t = Tensor::from_vec(v, [n], dev)?;
            let s = format!("{t}");
            let lines: Vec<&str> = s.lines().collect();
            for l in &lines {
                assert!(l.len() <= 80, "a line over 80 columns in\n{s}");
            }
            let last = lines[lines.len() - 1];
            let suffix_line = ["dtype=", "device="]
                .iter()
                .any(|p| last.trim_start().starts_with(p));
            if suffix_line {
                // on a line of its own: it would not have fitted on the one before
                let before = lines[lines.len() - 2];
                assert!(
                    before.len() + 1 + last.trim_start().len() > 80,
                    "wrapped though it fits:\n{s}"
                );
                wrapped += 1;
            } else {
                assert!(last.ends_with("dtype=float64)"), "{s}");
                kept += 1;
            }
        }
    }
    assert!(kept > 0 && wrapped > 0, "kept {kept}, wrapped {wrapped}");
    Ok(())
}

device_test!(
    suffixes_wrap_at_the_line_width,
    summarised_printing_ignores_the_hidden_values,
    printing_at_the_summarisation_threshold,
    printing_matrices_at_the_summarisation_threshold
);
