//! Per-epoch results, written as CSV and plotted as SVG.

use crate::error::{Error, Result};
use std::fmt::Write as _;
use std::path::Path;

/// What one epoch produced.
#[derive(Clone, Debug, PartialEq)]
pub struct EpochRecord {
    /// 1-based epoch number.
    pub epoch: usize,
    /// Metric values in column order (`loss`, `acc`, ..., `val_loss`, ...).
    pub metrics: Vec<(String, f64)>,
    /// The learning rate used during the epoch.
    pub lr: f64,
    /// Wall time of the epoch's training pass (validation not included), in
    /// seconds: the time `samples_per_sec` is measured over.
    pub seconds: f64,
    /// Training samples per second.
    pub samples_per_sec: f64,
}

impl EpochRecord {
    /// A metric's value, if it was recorded.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.metrics
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| *v)
    }
}

/// The records of every epoch run so far.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct History {
    pub records: Vec<EpochRecord>,
}

fn io_error(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Io {
        path: path.display().to_string(),
        source: std::io::Error::other(e.to_string()),
    }
}

impl History {
    /// The number of epochs recorded.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The last epoch's record.
    pub fn last(&self) -> Option<&EpochRecord> {
        self.records.last()
    }

    /// One metric over the epochs (`NaN` where an epoch lacks it).
    pub fn series(&self, name: &str) -> Vec<f64> {
        self.records
            .iter()
            .map(|r| r.get(name).unwrap_or(f64::NAN))
            .collect()
    }

    /// Every metric name, in first-seen order.
    pub fn metric_names(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for r in &self.records {
            for (n, _) in &r.metrics {
                if !names.contains(n) {
                    names.push(n.clone());
                }
            }
        }
        names
    }

    /// The history as CSV: `epoch,seconds,samples_per_sec,lr,<metrics...>`.
    pub fn to_csv(&self) -> String {
        let names = self.metric_names();
        let mut s = String::from("epoch,seconds,samples_per_sec,lr");
        for n in &names {
            s.push(',');
            s.push_str(n);
        }
        s.push('\n');
        for r in &self.records {
            let _ = write!(
                s,
                "{},{},{},{}",
                r.epoch, r.seconds, r.samples_per_sec, r.lr
            );
            for n in &names {
                match r.get(n) {
                    Some(v) => {
                        let _ = write!(s, ",{v}");
                    }
                    None => s.push(','),
                }
            }
            s.push('\n');
        }
        s
    }

    /// Parses what [`to_csv`](Self::to_csv) wrote (to continue a history on resume).
    pub fn from_csv(text: &str, origin: &str) -> Result<History> {
        let mut lines = text.lines();
        let header: Vec<&str> = lines
            .next()
            .ok_or_else(|| Error::invalid("History", format!("{origin}: empty file")))?
            .split(',')
            .collect();
        if header.len() < 4 || header[..4] != ["epoch", "seconds", "samples_per_sec", "lr"] {
            return Err(Error::invalid(
                "History",
                format!("{origin}: not a history file (header {header:?})"),
            ));
        }
        let mut records = Vec::new();
        for (i, line) in lines.enumerate() {
            let bad = |what: &str| Error::invalid("History", format!("{origin}:{}: {what}", i + 2));
            let cells: Vec<&str> = line.split(',').collect();
            if cells.len() != header.len() {
                return Err(bad("wrong number of fields"));
            }
            let num = |c: &str| {
                c.parse::<f64>()
                    .map_err(|_| bad(&format!("not a number: {c:?}")))
            };
            let mut metrics = Vec::new();
            for (n, c) in header[4..].iter().zip(&cells[4..]) {
                if !c.is_empty() {
                    metrics.push((n.to_string(), num(c)?));
                }
            }
            records.push(EpochRecord {
                epoch: num(cells[0])? as usize,
                seconds: num(cells[1])?,
                samples_per_sec: num(cells[2])?,
                lr: num(cells[3])?,
                metrics,
            });
        }
        Ok(History { records })
    }

    /// Writes [`to_csv`](Self::to_csv) to `path` (atomically: a crash leaves the
    /// old file or the new one).
    pub fn write_csv(&self, path: impl AsRef<Path>) -> Result<()> {
        crate::files::write_atomic(path.as_ref(), self.to_csv().as_bytes())
    }

    /// Plots the loss curves and, when recorded, the accuracy curves (training and
    /// validation) against the epoch, as an SVG file.
    pub fn write_svg(&self, path: impl AsRef<Path>) -> Result<()> {
        use plotters::prelude::*;
        let path = path.as_ref();
        let size = self.plot_size()?;
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
            self.draw(root).map_err(|e| io_error(path, e))?;
        }
        crate::files::write_atomic(path, svg.as_bytes())
    }

    /// The same plot as [`write_svg`](Self::write_svg), as a PNG image.
    pub fn write_png(&self, path: impl AsRef<Path>) -> Result<()> {
        use plotters::prelude::*;
        let path = path.as_ref();
        let (w, h) = self.plot_size()?;
        let mut rgb = vec![0u8; (w * h * 3) as usize];
        {
            let root = BitMapBackend::with_buffer(&mut rgb, (w, h)).into_drawing_area();
            self.draw(root).map_err(|e| io_error(path, e))?;
        }
        let mut bytes = Vec::new();
        let mut enc = png::Encoder::new(&mut bytes, w, h);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        enc.write_header()
            .and_then(|mut wr| wr.write_image_data(&rgb))
            .map_err(|e| io_error(path, e))?;
        crate::files::write_atomic(path, &bytes)
    }

    /// [`write_svg`](Self::write_svg) or [`write_png`](Self::write_png), by the
    /// file's extension.
    pub fn write_plot(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        match path.extension().and_then(|e| e.to_str()) {
            Some(e) if e.eq_ignore_ascii_case("svg") => self.write_svg(path),
            Some(e) if e.eq_ignore_ascii_case("png") => self.write_png(path),
            _ => Err(Error::invalid(
                "History",
                format!(
                    "cannot plot to {}: the file name must end in .svg or .png",
                    path.display()
                ),
            )),
        }
    }

    /// Pixels of the plot: one 480x360 panel for loss, one for accuracy if recorded.
    fn plot_size(&self) -> Result<(u32, u32)> {
        if self.records.is_empty() {
            return Err(Error::invalid(
                "History",
                "nothing to plot: no epoch has run",
            ));
        }
        Ok((480 * self.panels().len().max(1) as u32, 360))
    }

    /// The plot's panels: a title and the columns drawn in it.
    fn panels(&self) -> Vec<(&'static str, Vec<String>)> {
        let names = self.metric_names();
        [("loss", "loss"), ("accuracy", "acc")]
            .into_iter()
            .map(|(title, key)| {
                let cols = names
                    .iter()
                    .filter(|n| {
                        n.trim_start_matches("val_") == key || n.ends_with("_acc") && key == "acc"
                    })
                    .cloned()
                    .collect::<Vec<_>>();
                (title, cols)
            })
            .filter(|(_, cols)| !cols.is_empty())
            .collect()
    }

    /// Draws the panels on any plotters backend.
    fn draw<DB: plotters::prelude::DrawingBackend>(
        &self,
        root: plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
    ) -> std::result::Result<(), String> {
        use plotters::prelude::*;
        register_fonts()?;
        let err = |e: &dyn std::fmt::Display| e.to_string();
        let panels = self.panels();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let areas = root.split_evenly((1, panels.len().max(1)));
        let epochs: Vec<f64> = self.records.iter().map(|r| r.epoch as f64).collect();
        let x0 = epochs[0] - 0.5;
        let x1 = epochs[epochs.len() - 1] + 0.5;
        for ((title, cols), area) in panels.iter().zip(areas.iter()) {
            let values: Vec<f64> = cols
                .iter()
                .flat_map(|c| self.series(c))
                .filter(|v| v.is_finite())
                .collect();
            let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let (lo, hi) = if lo.is_finite() && hi > lo {
                (lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo))
            } else if lo.is_finite() {
                (lo - 0.5, lo + 0.5)
            } else {
                (0.0, 1.0)
            };
            let mut chart = ChartBuilder::on(area)
                .caption(*title, ("sans-serif", 20))
                .margin(12)
                .x_label_area_size(32)
                .y_label_area_size(56)
                .build_cartesian_2d(x0..x1, lo..hi)
                .map_err(|e| err(&e))?;
            chart
                .configure_mesh()
                .x_desc("epoch")
                .draw()
                .map_err(|e| err(&e))?;
            for (i, c) in cols.iter().enumerate() {
                let color = Palette99::pick(i).to_rgba();
                let pts: Vec<(f64, f64)> = epochs
                    .iter()
                    .copied()
                    .zip(self.series(c))
                    .filter(|(_, v)| v.is_finite())
                    .collect();
                chart
                    .draw_series(LineSeries::new(pts, color.stroke_width(2)))
                    .map_err(|e| err(&e))?
                    .label(c.as_str())
                    .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color));
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(|e| err(&e))?;
        }
        root.present().map_err(|e| err(&e))
    }
}

/// Text in plots is laid out and drawn with DejaVu Sans, embedded in ember, so
/// plots look the same on machines without fonts.
fn register_fonts() -> std::result::Result<(), String> {
    static DONE: std::sync::OnceLock<std::result::Result<(), String>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        use plotters::style::{register_font, FontStyle};
        let font = dejavu::sans::regular();
        for style in [FontStyle::Normal, FontStyle::Bold] {
            register_font("sans-serif", style, font)
                .map_err(|_| "the embedded plot font could not be read".to_string())?;
        }
        Ok(())
    })
    .clone()
}
