//! The small real data sets shipped in the repository's `data/` folder.

use super::csv::{read_csv, CsvTable};
use crate::{
    dtype::DType,
    error::{Error, Result},
    tensor::Tensor,
};
use std::path::{Path, PathBuf};

/// Finds the data file `name` (`"iris.csv"`), looking in this order in `./data/`
/// (relative to the working directory), in the folder named by the `EMBER_DATA`
/// environment variable, and in the `data/` folder of the ember source tree this
/// crate was built from. The error lists every place it looked.
pub fn find_data_file(name: &str) -> Result<PathBuf> {
    let mut searched = Vec::new();
    let mut candidates = vec![Path::new("data").join(name)];
    match std::env::var_os("EMBER_DATA") {
        Some(dir) if !dir.is_empty() => candidates.push(PathBuf::from(dir).join(name)),
        _ => searched.push("$EMBER_DATA (not set)".to_string()),
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let repo = manifest.parent().and_then(Path::parent).unwrap_or(manifest);
    candidates.push(repo.join("data").join(name));
    for c in &candidates {
        if c.is_file() {
            return Ok(c.clone());
        }
    }
    let mut places: Vec<String> = candidates.iter().map(|c| c.display().to_string()).collect();
    places.append(&mut searched);
    Err(Error::DataNotFound {
        name: name.to_string(),
        searched: places,
    })
}

/// Errors unless every label lies in `0..classes`.
fn check_labels(table: &CsvTable, labels: &Tensor, classes: i64) -> Result<()> {
    let v = labels.to_vec::<i64>()?;
    if let Some((row, bad)) = v
        .iter()
        .enumerate()
        .find(|(_, &y)| !(0..classes).contains(&y))
    {
        return Err(Error::Parse {
            file: table.name().to_string(),
            line: Some(table.row_line(row)),
            msg: format!(
                "column \"target\": label {bad} is outside 0..{}",
                classes - 1
            ),
        });
    }
    Ok(())
}

/// Refuses a NaN or infinite feature (`nan`, `inf` parse as numbers, and one
/// would make every loss NaN), naming the file, line and column.
fn check_finite(table: &CsvTable, columns: &[&str]) -> Result<()> {
    for name in columns {
        let Some(values) = table.column(name)?.as_numeric() else {
            continue; // text: to_tensor names it
        };
        if let Some((row, v)) = values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(Error::Parse {
                file: table.name().to_string(),
                line: Some(table.row_line(row)),
                msg: format!("column {name:?}: {v} is not a finite number"),
            });
        }
    }
    Ok(())
}

/// Fisher's Iris data from a CSV file with the header
/// `sepal_length,sepal_width,petal_length,petal_width,target` (the repository's
/// `data/iris.csv`; see [`find_data_file`]): the features as float32
/// `[150, 4]` (cm) and the classes 0 setosa, 1 versicolor, 2 virginica as int64
/// `[150]`.
///
/// ```
/// let path = ember::data::find_data_file("iris.csv")?;
/// let (x, y) = ember::data::load_iris(path)?;
/// assert_eq!((x.shape(), y.shape()), (&[150, 4][..], &[150][..]));
/// # Ok::<(), ember::Error>(())
/// ```
pub fn load_iris(path: impl AsRef<Path>) -> Result<(Tensor, Tensor)> {
    let path = path.as_ref();
    let table = read_csv(path)?;
    let features = ["sepal_length", "sepal_width", "petal_length", "petal_width"];
    check_finite(&table, &features)?;
    let x = table.to_tensor(&features, DType::F32)?;
    let y = table.labels("target")?;
    check_labels(&table, &y, 3)?;
    Ok((x, y))
}

/// The handwritten digits of scikit-learn's `load_digits` from a CSV file with
/// columns `p0..p63` (8×8 pixels, row-major, 0..16) and `target` (the
/// repository's `data/digits.csv`): the pixels as float32 `[1797, 64]` and the
/// digits 0..9 as int64 `[1797]`.
pub fn load_digits(path: impl AsRef<Path>) -> Result<(Tensor, Tensor)> {
    let path = path.as_ref();
    let table = read_csv(path)?;
    let names: Vec<String> = (0..64).map(|i| format!("p{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    check_finite(&table, &names)?;
    let x = table.to_tensor(&names, DType::F32)?;
    let y = table.labels("target")?;
    check_labels(&table, &y, 10)?;
    Ok((x, y))
}
