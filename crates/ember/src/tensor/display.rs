//! Printing tensors the way PyTorch prints them: one width for every element,
//! fixed or scientific notation chosen from the values, `...` past a threshold,
//! line wrapping at 80 columns, and `dtype=` / `device=` suffixes.

use super::Tensor;
use crate::{device::Device, dtype::DType};
use std::fmt;
use std::sync::RwLock;

/// Printer settings (`torch.set_printoptions`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PrintOptions {
    /// Digits after the decimal point.
    pub precision: usize,
    /// Tensors with more elements than this are summarised with `...`.
    pub threshold: usize,
    /// Elements shown at each end of a summarised dim.
    pub edgeitems: usize,
    /// Characters per line before wrapping.
    pub linewidth: usize,
    /// Force (`Some(true)`) or forbid scientific notation; `None` decides from the values.
    pub sci_mode: Option<bool>,
}

impl Default for PrintOptions {
    fn default() -> Self {
        PrintOptions {
            precision: 4,
            threshold: 1000,
            edgeitems: 3,
            linewidth: 80,
            sci_mode: None,
        }
    }
}

static OPTIONS: RwLock<Option<PrintOptions>> = RwLock::new(None);

/// Sets how tensors print from now on, for the whole process.
pub fn set_print_options(opts: PrintOptions) {
    *OPTIONS.write().unwrap_or_else(|p| p.into_inner()) = Some(opts);
}

fn options() -> PrintOptions {
    OPTIONS
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .unwrap_or_default()
}

/// Python's `'{:.Ne}'`: mantissa with N digits and an exponent of at least two digits.
fn sci(v: f64, precision: usize) -> String {
    let s = format!("{v:.precision$e}");
    match s.split_once('e') {
        Some((m, e)) => {
            let (sign, digits) = match e.strip_prefix('-') {
                Some(d) => ('-', d),
                None => ('+', e),
            };
            format!("{m}e{sign}{digits:0>2}")
        }
        None => s,
    }
}

/// Python's float `str` of an inf or NaN.
fn nonfinite(v: f64) -> String {
    if v.is_nan() {
        "nan".into()
    } else if v > 0.0 {
        "inf".into()
    } else {
        "-inf".into()
    }
}

/// PyTorch's `_Formatter`: decides the notation and width from the values printed.
struct Formatter {
    float: bool,
    int_mode: bool,
    sci_mode: bool,
    width: usize,
    precision: usize,
    dtype: DType,
}

/// An element as the printer reads it: a float's value as f64, an integer's
/// (and a bool's) exactly, as i64 (an int64 past 2^53 has no exact f64).
trait Cell: Copy {
    /// The text of a non-float element.
    fn plain(self, dtype: DType) -> String;
    /// The value, for a float dtype's notation.
    fn value(self) -> f64;
}

impl Cell for f64 {
    fn plain(self, dtype: DType) -> String {
        match dtype {
            DType::Bool => if self != 0.0 { "True" } else { "False" }.into(),
            _ => format!("{}", self as i64),
        }
    }
    fn value(self) -> f64 {
        self
    }
}

impl Cell for i64 {
    fn plain(self, dtype: DType) -> String {
        match dtype {
            DType::Bool => if self != 0 { "True" } else { "False" }.into(),
            _ => self.to_string(),
        }
    }
    fn value(self) -> f64 {
        self as f64
    }
}

impl Formatter {
    fn new<T: Cell>(values: &[T], dtype: DType, opts: &PrintOptions) -> Formatter {
        let mut f = Formatter {
            float: dtype.is_float(),
            int_mode: true,
            sci_mode: false,
            width: 1,
            precision: opts.precision,
            dtype,
        };
        if !f.float {
            for &v in values {
                f.width = f.width.max(v.plain(dtype).len());
            }
            return f;
        }
        let finite: Vec<f64> = values
            .iter()
            .map(|v| v.value())
            .filter(|v| v.is_finite() && *v != 0.0)
            .collect();
        if !finite.is_empty() {
            let abs = finite.iter().map(|v| v.abs());
            let (min, max) = abs.fold((f64::INFINITY, 0f64), |(lo, hi), a| (lo.min(a), hi.max(a)));
            f.int_mode = finite.iter().all(|v| v.fract() == 0.0);
            // a notation forced by the options also decides the width (PyTorch 2)
            f.sci_mode = opts
                .sci_mode
                .unwrap_or(max / min > 1000.0 || max > 1e8 || min < 1e-4);
            let (p, sci_mode, int_mode) = (opts.precision, f.sci_mode, f.int_mode);
            let len = |v: f64| {
                if sci_mode {
                    sci(v, p).len()
                } else if int_mode {
                    // the "." that marks a float
                    format!("{v:.0}").len() + 1
                } else {
                    format!("{v:.p$}").len()
                }
            };
            f.width = finite.iter().map(|&v| len(v)).max().unwrap_or(1);
        }
        f
    }

    fn format<T: Cell>(&self, x: T) -> String {
        let v = x.value();
        let s = if !self.float {
            x.plain(self.dtype)
        } else if !v.is_finite() {
            nonfinite(v)
        } else if self.sci_mode {
            sci(v, self.precision)
        } else if self.int_mode {
            format!("{v:.0}.")
        } else {
            format!("{v:.p$}", p = self.precision)
        };
        format!("{s:>w$}", w = self.width)
    }
}

/// The values printed: all of them, or only the edges when summarising.
fn shown_values<T: Cell>(v: &[T], shape: &[usize], summarize: bool, edge: usize) -> Vec<T> {
    if shape.is_empty() {
        return v.to_vec();
    }
    let inner: usize = shape[1..].iter().product();
    let rows: Vec<usize> = if summarize && shape[0] > 2 * edge {
        (0..edge).chain(shape[0] - edge..shape[0]).collect()
    } else {
        (0..shape[0]).collect()
    };
    rows.into_iter()
        .flat_map(|i| shown_values(&v[i * inner..(i + 1) * inner], &shape[1..], summarize, edge))
        .collect()
}

struct Printer<'a> {
    fmt: Formatter,
    opts: &'a PrintOptions,
    summarize: bool,
}

impl Printer<'_> {
    fn vector<T: Cell>(&self, v: &[T], indent: usize) -> String {
        let elem = self.fmt.width + 2;
        let per_line = ((self.opts.linewidth.saturating_sub(indent)) / elem).max(1);
        let e = self.opts.edgeitems;
        let items: Vec<String> = if self.summarize && v.len() > 2 * e {
            v[..e]
                .iter()
                .map(|&x| self.fmt.format(x))
                .chain(std::iter::once(" ...".to_string()))
                .chain(v[v.len() - e..].iter().map(|&x| self.fmt.format(x)))
                .collect()
        } else {
            v.iter().map(|&x| self.fmt.format(x)).collect()
        };
        let lines: Vec<String> = items.chunks(per_line).map(|c| c.join(", ")).collect();
        format!(
            "[{}]",
            lines.join(&format!(",\n{}", " ".repeat(indent + 1)))
        )
    }

    fn tensor<T: Cell>(&self, v: &[T], shape: &[usize], indent: usize) -> String {
        match shape.len() {
            0 => self.fmt.format(v[0]),
            1 => self.vector(v, indent),
            r => {
                let inner: usize = shape[1..].iter().product();
                let sub =
                    |i: usize| self.tensor(&v[i * inner..(i + 1) * inner], &shape[1..], indent + 1);
                let e = self.opts.edgeitems;
                let parts: Vec<String> = if self.summarize && shape[0] > 2 * e {
                    (0..e)
                        .map(sub)
                        .chain(std::iter::once("...".to_string()))
                        .chain((shape[0] - e..shape[0]).map(sub))
                        .collect()
                } else {
                    (0..shape[0]).map(sub).collect()
                };
                let sep = format!(",{}{}", "\n".repeat(r - 1), " ".repeat(indent + 1));
                format!("[{}]", parts.join(&sep))
            }
        }
    }
}

/// A shape as a Python tuple: `(2, 3)`, `(3,)`, `()`.
fn size_tuple(shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    if dims.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    }
}

impl Tensor {
    /// The bracketed values, summarised past the threshold.
    fn print_values<T: Cell>(&self, values: &[T], opts: &PrintOptions) -> String {
        let summarize = self.numel() > opts.threshold;
        let shown = if summarize {
            shown_values(values, self.shape(), true, opts.edgeitems)
        } else {
            values.to_vec()
        };
        let printer = Printer {
            fmt: Formatter::new(&shown, self.dtype(), opts),
            opts,
            summarize,
        };
        printer.tensor(values, self.shape(), "tensor(".len())
    }

    fn render(&self) -> String {
        let opts = options();
        let prefix = "tensor(";
        let indent = prefix.len();
        let mut suffixes = Vec::new();
        if self.device() != Device::Cpu {
            suffixes.push(format!("device='{}'", self.device()));
        }
        let body = if !self.read().holds_values() {
            // PyTorch's form for meta tensors: the size instead of values
            suffixes.push(format!("size={}", size_tuple(self.shape())));
            if self.dtype() != DType::F32 {
                suffixes.push(format!("dtype={}", self.dtype()));
            }
            "...".to_string()
        } else if self.numel() == 0 {
            if self.rank() != 1 {
                suffixes.push(format!("size={}", size_tuple(self.shape())));
            }
            if self.dtype() != DType::F32 {
                suffixes.push(format!("dtype={}", self.dtype()));
            }
            "[]".to_string()
        } else {
            if !matches!(self.dtype(), DType::F32 | DType::I64 | DType::Bool) {
                suffixes.push(format!("dtype={}", self.dtype()));
            }
            // values in row-major order: floats as f64, integers and bools
            // exactly as i64
            let read = if self.dtype().is_float() {
                self.values::<f64>("print")
                    .map(|v| self.print_values(&v, &opts))
            } else {
                self.values::<i64>("print")
                    .map(|v| self.print_values(&v, &opts))
            };
            match read {
                Ok(body) => body,
                Err(e) => return format!("tensor(<unreadable: {e}>)"),
            }
        };
        let mut out = format!("{prefix}{body}");
        let mut last_line = out.len() - out.rfind('\n').map_or(0, |i| i + 1) + 1;
        for s in suffixes {
            if last_line + s.len() + 2 > opts.linewidth {
                out.push_str(&format!(",\n{}{s}", " ".repeat(indent)));
                last_line = indent + s.len();
            } else {
                out.push_str(&format!(", {s}"));
                last_line += s.len() + 2;
            }
        }
        out.push(')');
        out
    }
}

impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render())
    }
}

impl fmt::Debug for Tensor {
    /// The PyTorch-style printout followed by shape and strides.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} [shape={:?}, stride={:?}, dtype={}]",
            self.render(),
            self.shape(),
            self.stride(),
            self.dtype()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_style_scientific_notation() {
        assert_eq!(sci(1.0, 4), "1.0000e+00");
        assert_eq!(sci(-1.5e-10, 4), "-1.5000e-10");
        assert_eq!(sci(2.5e100, 2), "2.50e+100");
    }
}
