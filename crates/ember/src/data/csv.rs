//! CSV tables with a header row and typed columns.

use crate::{
    device::Device,
    dtype::DType,
    error::{Error, Result},
    tensor::Tensor,
};
use std::collections::BTreeSet;
use std::io::Read;
use std::path::Path;

/// The values of one CSV column.
#[derive(Clone, Debug, PartialEq)]
pub enum Column {
    /// Every cell parsed as a number.
    Numeric(Vec<f64>),
    /// At least one cell is not a number: the cells as written (trimmed).
    Text(Vec<String>),
}

impl Column {
    /// The number of cells (rows).
    pub fn len(&self) -> usize {
        match self {
            Column::Numeric(v) => v.len(),
            Column::Text(v) => v.len(),
        }
    }

    /// `true` when the column has no cells.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `true` for a numeric column.
    pub fn is_numeric(&self) -> bool {
        matches!(self, Column::Numeric(_))
    }

    /// The numbers of a numeric column.
    pub fn as_numeric(&self) -> Option<&[f64]> {
        match self {
            Column::Numeric(v) => Some(v),
            Column::Text(_) => None,
        }
    }

    /// The cells of a text column.
    pub fn as_text(&self) -> Option<&[String]> {
        match self {
            Column::Text(v) => Some(v),
            Column::Numeric(_) => None,
        }
    }
}

/// A CSV file read by [`read_csv`] or [`parse_csv`]: named, typed columns of equal
/// length.
#[derive(Clone, Debug)]
pub struct CsvTable {
    name: String,
    headers: Vec<String>,
    columns: Vec<Column>,
    /// The 1-based line on which each data row starts, for error messages.
    lines: Vec<u64>,
}

/// Reads the CSV file at `path`. The first row is a header naming the columns;
/// each column is numeric when every cell parses as a number, text otherwise.
///
/// Errors name the file and the line: a missing or empty file, a header with an
/// empty or repeated name (or only numbers, which means the header is missing), a
/// row with the wrong number of fields, an empty cell.
pub fn read_csv(path: impl AsRef<Path>) -> Result<CsvTable> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.display().to_string(),
        source,
    })?;
    parse_csv(&bytes[..], &path.display().to_string())
}

/// Parses CSV text from any reader, like [`read_csv`]; `name` stands for the
/// source in error messages.
pub fn parse_csv(mut reader: impl Read, name: &str) -> Result<CsvTable> {
    let err = |line: Option<u64>, msg: String| Error::Parse {
        file: name.to_string(),
        line,
        msg,
    };
    let mut bytes = Vec::new();
    reader
        .read_to_end(&mut bytes)
        .map_err(|e| err(None, format!("cannot read: {e}")))?;
    // The csv crate's line numbers miss blank lines and `\r\n` endings: count them here.
    let lines = LineCounter::new(&bytes);
    let mut rdr = ::csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .trim(::csv::Trim::All)
        .from_reader(&bytes[..]);
    let mut records = rdr.records();
    let csv_err = |e: ::csv::Error| {
        let line = e.position().map(|p| lines.line_of(p.byte()));
        let msg = match e.kind() {
            ::csv::ErrorKind::Utf8 { err, .. } => {
                format!("field {} is not valid UTF-8 text", err.field() + 1)
            }
            _ => e.to_string(),
        };
        err(line, msg)
    };

    let header = match records.next() {
        None => {
            return Err(err(
                None,
                "the file is empty: expected a header row naming the columns".into(),
            ))
        }
        Some(r) => r.map_err(csv_err)?,
    };
    let header_line = header.position().map_or(1, |p| lines.line_of(p.byte()));
    let headers: Vec<String> = header
        .iter()
        .enumerate()
        .map(|(i, h)| {
            if i == 0 {
                h.trim_start_matches('\u{feff}').to_string()
            } else {
                h.to_string()
            }
        })
        .collect();
    if headers.iter().all(|h| h.parse::<f64>().is_ok()) {
        return Err(err(
            Some(header_line),
            format!(
                "missing header: the first row ({}) holds numbers, expected column names",
                headers.join(",")
            ),
        ));
    }
    for (i, h) in headers.iter().enumerate() {
        if h.is_empty() {
            return Err(err(
                Some(header_line),
                format!("the header has no name for column {}", i + 1),
            ));
        }
        if headers[..i].contains(h) {
            return Err(err(
                Some(header_line),
                format!("the header names column {h:?} twice"),
            ));
        }
    }

    let ncols = headers.len();
    let mut cells: Vec<Vec<String>> = vec![Vec::new(); ncols];
    let mut row_lines = Vec::new();
    for record in records {
        let record = record.map_err(csv_err)?;
        let line = record.position().map_or(0, |p| lines.line_of(p.byte()));
        if record.len() != ncols {
            return Err(err(
                Some(line),
                format!(
                    "expected {ncols} fields (one per header column) but found {}",
                    record.len()
                ),
            ));
        }
        for (c, cell) in record.iter().enumerate() {
            if cell.is_empty() {
                return Err(err(
                    Some(line),
                    format!("column {:?}: empty cell", headers[c]),
                ));
            }
            cells[c].push(cell.to_string());
        }
        row_lines.push(line);
    }

    let columns = cells
        .into_iter()
        .map(|col| {
            let nums: Option<Vec<f64>> = col.iter().map(|s| s.parse::<f64>().ok()).collect();
            match nums {
                Some(v) => Column::Numeric(v),
                None => Column::Text(col),
            }
        })
        .collect();
    Ok(CsvTable {
        name: name.to_string(),
        headers,
        columns,
        lines: row_lines,
    })
}

/// 1-based line numbers of byte offsets in CSV text.
struct LineCounter<'a> {
    bytes: &'a [u8],
    /// The offset of every `\n`.
    newlines: Vec<usize>,
}

impl<'a> LineCounter<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        let newlines = bytes
            .iter()
            .enumerate()
            .filter(|(_, &b)| b == b'\n')
            .map(|(i, _)| i)
            .collect();
        LineCounter { bytes, newlines }
    }

    /// The line of the record the csv crate places at `offset`: it places a record
    /// where the previous one ended, before the line breaks and blank lines that
    /// come first.
    fn line_of(&self, offset: u64) -> u64 {
        let mut at = (offset as usize).min(self.bytes.len());
        while at < self.bytes.len() && matches!(self.bytes[at], b'\r' | b'\n') {
            at += 1;
        }
        self.newlines.partition_point(|&n| n < at) as u64 + 1
    }
}

impl CsvTable {
    fn err(&self, line: Option<u64>, msg: String) -> Error {
        Error::Parse {
            file: self.name.clone(),
            line,
            msg,
        }
    }

    /// The file name (or the name given to [`parse_csv`]).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The column names, in file order.
    pub fn headers(&self) -> &[String] {
        &self.headers
    }

    /// The number of data rows (not counting the header).
    pub fn num_rows(&self) -> usize {
        self.lines.len()
    }

    /// The 1-based line of data row `row` in the file.
    pub(crate) fn row_line(&self, row: usize) -> u64 {
        self.lines[row]
    }

    /// The number of columns.
    pub fn num_columns(&self) -> usize {
        self.headers.len()
    }

    /// The column called `name`; an error lists the columns there are.
    pub fn column(&self, name: &str) -> Result<&Column> {
        match self.headers.iter().position(|h| h == name) {
            Some(i) => Ok(&self.columns[i]),
            None => Err(self.err(
                None,
                format!(
                    "no column {name:?}; the columns are {}",
                    self.headers
                        .iter()
                        .map(|h| format!("{h:?}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )),
        }
    }

    /// The numbers of column `name`; for a text column, an error naming its first
    /// cell that is not a number and that cell's line.
    fn numeric(&self, name: &str) -> Result<&[f64]> {
        match self.column(name)? {
            Column::Numeric(v) => Ok(v),
            Column::Text(v) => {
                let (row, cell) = v
                    .iter()
                    .enumerate()
                    .find(|(_, s)| s.parse::<f64>().is_err())
                    .expect("a text column has a cell that is not a number");
                Err(self.err(
                    Some(self.lines[row]),
                    format!("column {name:?}: cannot parse {cell:?} as a number"),
                ))
            }
        }
    }

    /// The columns `columns` (numeric ones), as a `[num_rows, columns.len()]`
    /// tensor of `dtype` on the CPU, row-major like the file.
    pub fn to_tensor(&self, columns: &[&str], dtype: DType) -> Result<Tensor> {
        if columns.is_empty() {
            return Err(self.err(None, "to_tensor: no columns were asked for".into()));
        }
        let cols = columns
            .iter()
            .map(|c| self.numeric(c))
            .collect::<Result<Vec<_>>>()?;
        let rows = self.num_rows();
        let mut v = Vec::with_capacity(rows * cols.len());
        for r in 0..rows {
            v.extend(cols.iter().map(|c| c[r]));
        }
        Tensor::from_vec(v, [rows, cols.len()], &Device::Cpu)?.to_dtype(dtype)
    }

    /// Column `name`, whose values must be integers, as an int64 tensor of shape
    /// `[num_rows]` (class labels).
    pub fn labels(&self, name: &str) -> Result<Tensor> {
        let col = self.numeric(name).map_err(|e| match self.column(name) {
            Ok(Column::Text(_)) => {
                let Error::Parse { file, line, msg } = e else {
                    return e;
                };
                Error::Parse {
                    file,
                    line,
                    msg: format!(
                        "{msg} (labels must be integers; use encode_labels({name:?}) for class names)"
                    ),
                }
            }
            _ => e,
        })?;
        let v = col
            .iter()
            .enumerate()
            .map(|(r, &x)| {
                if x.is_finite() && x.fract() == 0.0 && x.abs() < 9.0e15 {
                    Ok(x as i64)
                } else {
                    Err(self.err(
                        Some(self.lines[r]),
                        format!("column {name:?}: label {x} is not an integer"),
                    ))
                }
            })
            .collect::<Result<Vec<i64>>>()?;
        Tensor::from_vec(v, [col.len()], &Device::Cpu)
    }

    /// Column `name` as class indices: the distinct values sorted (text in
    /// byte order, numbers by value) are the classes `0, 1, ...`, like
    /// scikit-learn's `LabelEncoder`. Returns the int64 `[num_rows]` indices and
    /// the class names.
    pub fn encode_labels(&self, name: &str) -> Result<(Tensor, Vec<String>)> {
        let (idx, classes) = match self.column(name)? {
            Column::Text(v) => {
                let classes: Vec<String> = v
                    .iter()
                    .cloned()
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect();
                let idx = v
                    .iter()
                    .map(|s| classes.binary_search(s).expect("a class of the column") as i64)
                    .collect::<Vec<i64>>();
                (idx, classes)
            }
            Column::Numeric(v) => {
                let mut values = v.clone();
                values.sort_by(f64::total_cmp);
                values.dedup_by(|a, b| a.total_cmp(b).is_eq());
                let idx = v
                    .iter()
                    .map(|x| {
                        values
                            .binary_search_by(|c| c.total_cmp(x))
                            .expect("a value of the column") as i64
                    })
                    .collect::<Vec<i64>>();
                (idx, values.iter().map(|x| x.to_string()).collect())
            }
        };
        let n = idx.len();
        Ok((Tensor::from_vec(idx, [n], &Device::Cpu)?, classes))
    }
}

#[cfg(test)]
mod tests {
    use super::LineCounter;

    #[test]
    fn line_counter_skips_line_breaks_before_a_record() {
        let text = b"a,b\r\n1,2\r\n\r\n3,4\n";
        let l = LineCounter::new(text);
        // offsets as the csv crate reports them: where the previous record ended
        assert_eq!(l.line_of(0), 1);
        assert_eq!(l.line_of(4), 2);
        assert_eq!(l.line_of(9), 4);
        assert_eq!(l.line_of(text.len() as u64 + 10), 5);
    }
}
