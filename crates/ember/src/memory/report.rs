//! The per-module table, the printed estimate, and memory sizes as people write
//! them.

use super::{Category, Estimate, Event, Phase, Replay};
use crate::backend::alloc::fmt_bytes;
use crate::{
    dtype::DType,
    error::{Error, Result},
};
use std::fmt;

/// One module's row of the table (torchinfo's summary, with memory).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleRow {
    /// The dotted path (`"features.0"`).
    pub module: String,
    /// The output's shape in the first forward pass.
    pub output: Vec<usize>,
    pub dtype: DType,
    /// Parameters (elements) of the module and its children.
    pub parameters: usize,
    /// Bytes the module and its children leave alive at the end of the forward
    /// pass (saved for backward, and the output): its share of
    /// [`Breakdown::activations`](super::Breakdown::activations).
    pub activations: usize,
}

fn within(path: &str, module: &str) -> bool {
    path == module
        || (path.len() > module.len()
            && path.starts_with(module)
            && path.as_bytes()[module.len()] == b'.')
}

/// The rows of the first forward pass, parents before children.
pub(super) fn module_rows(
    events: &[Event],
    replay: &Replay,
    modules: &[String],
    outputs: &[(u32, Vec<usize>, DType)],
    names: &[(String, usize)],
) -> Vec<ModuleRow> {
    // the first forward pass's mark
    let mut marks = 0usize;
    let mut first_forward = None;
    for e in events {
        if let Event::Mark { step, phase } = e {
            if *step == 0 && *phase == Phase::Forward {
                first_forward = Some(marks);
                break;
            }
            marks += 1;
        }
    }
    let mut seen = std::collections::HashSet::new();
    let mut rows: Vec<(usize, ModuleRow)> = Vec::new();
    for (order, (m, shape, dtype)) in outputs.iter().enumerate() {
        if !seen.insert(*m) {
            continue;
        }
        let path = &modules[*m as usize];
        let parameters = names
            .iter()
            .filter(|(n, _)| n.starts_with(path.as_str()) && n[path.len()..].starts_with('.'))
            .map(|(_, c)| c)
            .sum();
        let activations = replay
            .lives
            .values()
            .filter(|l| {
                l.category == Category::Activations
                    && Some(l.mark) == first_forward
                    && within(&modules[l.module as usize], path)
            })
            .map(|l| l.bytes)
            .sum();
        rows.push((
            order,
            ModuleRow {
                module: path.clone(),
                output: shape.clone(),
                dtype: *dtype,
                parameters,
                activations,
            },
        ));
    }
    // outputs arrive children first: list a parent before its children, siblings
    // in the order they ran
    let first_child = |i: usize| -> usize {
        let path = &rows[i].1.module;
        rows.iter()
            .filter(|(_, r)| within(&r.module, path))
            .map(|(o, _)| *o)
            .min()
            .unwrap_or(rows[i].0)
    };
    let mut keyed: Vec<((usize, usize), ModuleRow)> = (0..rows.len())
        .map(|i| {
            let depth = rows[i].1.module.matches('.').count();
            ((first_child(i), depth), rows[i].1.clone())
        })
        .collect();
    keyed.sort_by_key(|(k, _)| *k);
    keyed.into_iter().map(|(_, r)| r).collect()
}

/// A memory size: a number with an optional unit, `B`, `KiB`/`MiB`/`GiB`/`TiB`
/// (powers of 1024; `K`, `M`, `G`, `T` alone mean the same) or `kB`/`MB`/`GB`/`TB`
/// (powers of 1000): `12GiB`, `1.5 G`, `80GB`, `4096`.
pub fn parse_bytes(s: &str) -> Result<usize> {
    let bad = |why: &str| {
        Error::invalid(
            "memory size",
            format!("{s:?}: {why}; write a size such as 12GiB, 1.5G, 80GB or 4096"),
        )
    };
    let t = s.trim();
    // the unit is the letters at the end; the number before it may have an
    // exponent (1.5e3MB)
    let split = t.trim_end_matches(|c: char| c.is_ascii_alphabetic()).len();
    let (num, unit) = t.split_at(split);
    let value: f64 = num.trim().parse().map_err(|_| bad("no number"))?;
    let scale: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024f64.powi(2),
        "g" | "gib" => 1024f64.powi(3),
        "t" | "tib" => 1024f64.powi(4),
        "p" | "pib" => 1024f64.powi(5),
        "e" | "eib" => 1024f64.powi(6),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "pb" => 1e15,
        "eb" => 1e18,
        _ => {
            return Err(bad(
                "unknown unit (B, KiB, MiB, GiB, TiB or KB, MB, GB, TB)",
            ))
        }
    };
    let bytes = value * scale;
    if !bytes.is_finite() || bytes < 1.0 || bytes >= (1u64 << 60) as f64 {
        return Err(bad("not a size between 1 byte and 1 EiB"));
    }
    Ok(bytes.round() as usize)
}

fn shape(s: &[usize]) -> String {
    let parts: Vec<String> = s.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

/// `1234567` as `1,234,567`.
fn grouped(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

impl fmt::Display for Estimate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.modules.is_empty() {
            let w = self
                .modules
                .iter()
                .map(|r| r.module.len() + 2 * r.module.matches('.').count())
                .max()
                .unwrap_or(0)
                .max(6);
            writeln!(
                f,
                "{:w$}  {:>22}  {:>12}  {:>12}",
                "module", "output", "parameters", "activations"
            )?;
            for r in &self.modules {
                let depth = r.module.matches('.').count();
                let name = format!("{}{}", "  ".repeat(depth), r.module);
                writeln!(
                    f,
                    "{name:w$}  {:>22}  {:>12}  {:>12}",
                    shape(&r.output),
                    grouped(r.parameters),
                    fmt_bytes(r.activations)
                )?;
            }
            writeln!(f)?;
        }
        let what = if self.training {
            format!("{} training steps", self.steps)
        } else {
            "inference (no_grad)".to_string()
        };
        let amp = self
            .amp
            .map(|d| format!(" under {d} autocast"))
            .unwrap_or_default();
        let format = match self.memory_format {
            crate::layout::MemoryFormat::ChannelsLast => ", channels-last",
            crate::layout::MemoryFormat::Contiguous => "",
        };
        writeln!(
            f,
            "batch size {}, {what}, {}{amp}{format}: {} parameters ({})",
            self.batch_size,
            self.dtype,
            grouped(self.parameters),
            fmt_bytes(self.parameter_bytes)
        )?;
        let at = &self.peak_at;
        let module = if at.module.is_empty() {
            String::new()
        } else {
            format!(", in {}", at.module)
        };
        let when = match at.phase {
            Phase::Setup => "while building the model".to_string(),
            phase if self.training => format!("step {}, {phase}", at.step + 1),
            phase => phase.to_string(),
        };
        writeln!(
            f,
            "peak allocated: {} ({when}{module})",
            fmt_bytes(self.peak_allocated)
        )?;
        writeln!(f, "peak reserved:  {}", fmt_bytes(self.peak_reserved))?;
        if self.outside_allocator > 0 {
            writeln!(
                f,
                "needed on the device: {} (with {} of cuBLAS workspace; the CUDA context comes on top)",
                fmt_bytes(self.required()),
                fmt_bytes(self.outside_allocator)
            )?;
        }
        writeln!(f, "at the peak:")?;
        let b = &self.at_peak;
        for (name, v) in [
            ("parameters", b.parameters),
            ("buffers", b.buffers),
            ("gradients", b.gradients),
            ("optimizer state", b.optimizer_state),
            ("inputs", b.inputs),
            ("activations", b.activations),
            ("temporaries", b.temporaries),
            ("op workspaces", b.workspaces),
            ("allocator rounding", b.rounding),
        ] {
            if v > 0 {
                writeln!(f, "  {name:<20}{:>12}", fmt_bytes(v))?;
            }
        }
        Ok(())
    }
}
