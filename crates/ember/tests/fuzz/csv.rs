//! CSV: `parse_csv` and `read_csv`.
use super::*;

const CSV_NAME: &str = "fuzz.csv";

/// What a CSV cell can look like, well- or ill-formed.
fn csv_cell() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => any::<i32>().prop_map(|v| v.to_string()),
        3 => any::<f64>().prop_map(|v| v.to_string()),
        3 => "[a-z]{1,6}",
        1 => prop::sample::select(vec!["nan", "-inf", "1e999", "-0", "0x10", "1_000", "", " ", "\u{feff}"])
            .prop_map(str::to_string),
        1 => "[a-z, \n\r\"]{0,6}".prop_map(|s| format!("\"{}\"", s.replace('"', "\"\""))),
        1 => "[a-z\"]{0,4}",
        1 => " {0,2}[0-9]{1,3}(\\.[0-9]{0,2})? {0,2}",
        1 => "\\PC{0,4}",
    ]
}

/// A CSV text: a header and rows of cells, mostly as many as header names,
/// with either line ending, blank lines, a byte order mark.
fn csv_text() -> impl Strategy<Value = String> {
    let header = prop::collection::vec(
        prop_oneof![3 => "[a-z_][a-z0-9_]{0,5}", 1 => csv_cell()],
        1..5,
    );
    let row = (
        prop::collection::vec(csv_cell(), 6),
        prop::bool::weighted(0.1),
        0usize..8,
        prop::bool::weighted(0.1),
    );
    (
        header,
        prop::collection::vec(row, 0..7),
        any::<bool>(),
        any::<bool>(),
        prop::bool::weighted(0.2),
    )
        .prop_map(|(header, rows, crlf, final_eol, bom)| {
            let eol = if crlf { "\r\n" } else { "\n" };
            let mut s = String::new();
            if bom {
                s.push('\u{feff}');
            }
            s.push_str(&header.join(","));
            for (cells, ragged, n, blank) in rows {
                s.push_str(eol);
                if blank {
                    s.push_str(eol);
                }
                let n = if ragged { n.min(6) } else { header.len() };
                s.push_str(&cells[..n].join(","));
            }
            if final_eol {
                s.push_str(eol);
            }
            s
        })
}

/// Checks a table that parsed: the columns have the header's names (unique, not
/// empty, not all numbers), one cell per row each, numeric exactly when every cell
/// is a number; the tensors built from it have the table's values and shapes.
fn check_csv_table(t: &CsvTable) -> Check {
    let headers = t.headers();
    prop_assert_eq!(headers.len(), t.num_columns());
    prop_assert!(!headers.is_empty());
    prop_assert!(
        !headers.iter().all(|h| h.parse::<f64>().is_ok()),
        "a header of numbers was accepted: {:?}",
        headers
    );
    let rows = t.num_rows();
    let mut numeric = Vec::new();
    for (i, h) in headers.iter().enumerate() {
        prop_assert!(!h.is_empty());
        prop_assert!(!headers[..i].contains(h), "column {:?} twice", h);
        let col = ok(t.column(h))?;
        prop_assert_eq!(col.len(), rows, "column {:?}", h);
        match col {
            Column::Numeric(_) => numeric.push(h.as_str()),
            Column::Text(cells) => {
                prop_assert!(cells.iter().all(|c| !c.is_empty()));
                prop_assert!(cells.iter().any(|c| c.parse::<f64>().is_err()));
            }
        }
        let labels = t.labels(h);
        match col {
            Column::Text(_) => prop_assert!(labels.is_err(), "labels of a text column"),
            Column::Numeric(v) => {
                let whole = v
                    .iter()
                    .all(|x| x.is_finite() && x.fract() == 0.0 && x.abs() < 9.0e15);
                prop_assert_eq!(labels.is_ok(), whole, "labels of {:?}", v);
                if let Ok(l) = labels {
                    prop_assert_eq!(l.shape(), &[rows][..]);
                    let got = ok(l.to_vec::<i64>())?;
                    let want: Vec<i64> = v.iter().map(|&x| x as i64).collect();
                    prop_assert_eq!(got, want);
                }
            }
        }
        let (idx, classes) = ok(t.encode_labels(h))?;
        prop_assert_eq!(idx.shape(), &[rows][..]);
        let idx = ok(idx.to_vec::<i64>())?;
        prop_assert!(idx.iter().all(|&i| i >= 0 && (i as usize) < classes.len()));
        let mut used = vec![false; classes.len()];
        idx.iter().for_each(|&i| used[i as usize] = true);
        prop_assert!(used.iter().all(|&u| u), "a class no row has");
    }
    let x = t.to_tensor(&numeric, DType::F64);
    if numeric.is_empty() {
        prop_assert!(x.is_err());
    } else {
        let x = ok(x)?;
        prop_assert_eq!(x.shape(), &[rows, numeric.len()][..]);
        let got = ok(x.to_vec::<f64>())?;
        for (c, h) in numeric.iter().enumerate() {
            let col = ok(t.column(h))?.as_numeric().expect("numeric").to_vec();
            for (r, want) in col.iter().enumerate() {
                let g = got[r * numeric.len() + c];
                prop_assert!(g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()));
            }
        }
    }
    Ok(())
}

/// Runs the CSV reader on `bytes`: an `Ok` table must be consistent, an error
/// must be a parse error naming the source.
fn csv_case(bytes: &[u8]) -> Check {
    let r = parse_csv(bytes, CSV_NAME);
    tally(&r);
    match r {
        Ok(t) => {
            prop_assert_eq!(t.name(), CSV_NAME);
            check_csv_table(&t)
        }
        Err(Error::Parse { file, .. }) if file == CSV_NAME => Ok(()),
        Err(e) => Err(TestCaseError::fail(format!(
            "not a parse error of {CSV_NAME}: {e:?}"
        ))),
    }
}

fn csv_arbitrary() -> Prop {
    prop(prop::collection::vec(any::<u8>(), 0..256), |b| csv_case(&b))
}

fn csv_structured() -> Prop {
    prop(
        (csv_text(), prop::collection::vec(damage(), 0..3)),
        |(text, ds)| csv_case(&damaged(text.into_bytes(), &ds)),
    )
}

/// A well-formed table (distinct names, as many non-empty cells as names on
/// every row) reads back as written.
fn csv_valid() -> Prop {
    let cell = prop_oneof![
        any::<i32>().prop_map(|v| v.to_string()),
        (-1e6f64..1e6).prop_map(|v| v.to_string()),
        "[a-z]{1,5}",
        "[a-z ,]{0,4}[a-z][a-z ,\n]{0,4}".prop_map(|s| format!("\"{s}\"")),
    ];
    let table = (1usize..5).prop_flat_map(move |ncols| {
        (
            prop::collection::vec("[a-z]{0,3}", ncols),
            prop::collection::vec(prop::collection::vec(cell.clone(), ncols), 0..6),
            any::<bool>(),
        )
    });
    prop(table, |(names, rows, crlf)| {
        let names: Vec<String> = names
            .iter()
            .enumerate()
            .map(|(i, n)| format!("c{i}{n}"))
            .collect();
        let eol = if crlf { "\r\n" } else { "\n" };
        let mut text = names.join(",");
        for r in &rows {
            text.push_str(eol);
            text.push_str(&r.join(","));
        }
        let t = ok(parse_csv(text.as_bytes(), CSV_NAME))?;
        prop_assert_eq!(t.headers(), &names[..]);
        prop_assert_eq!(t.num_rows(), rows.len());
        for (c, name) in names.iter().enumerate() {
            let cells: Vec<String> = rows
                .iter()
                .map(|r| r[c].trim_matches('"').trim().to_string())
                .collect();
            let col = ok(t.column(name))?;
            let all_numbers = cells.iter().all(|c| c.parse::<f64>().is_ok());
            prop_assert_eq!(
                col.is_numeric(),
                all_numbers,
                "column {:?}: {:?}",
                name,
                cells
            );
            match col {
                Column::Numeric(v) => {
                    // compared as bits: `nan` cells read as NaN
                    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    let want: Vec<f64> = cells.iter().map(|s| s.parse().unwrap()).collect();
                    prop_assert_eq!(bits(v), bits(&want), "column {:?}", name);
                }
                Column::Text(v) => prop_assert_eq!(v, &cells),
            }
        }
        check_csv_table(&t)
    })
}

#[test]
fn csv_arbitrary_bytes_never_panic() {
    check(500, csv_arbitrary());
}

#[test]
fn csv_damaged_tables_never_panic() {
    check(800, csv_structured());
}

#[test]
fn csv_valid_tables_read_back() {
    check(300, csv_valid());
}

#[test]
fn csv_through_a_file_names_it() {
    let dir = Scratch::new("csv-file");
    let p = dir.file("table.csv");
    std::fs::write(&p, "a,b\n1,2\n3\n").unwrap();
    let e = read_csv(&p).unwrap_err().to_string();
    assert!(
        e.starts_with(&p.display().to_string()) && e.contains(":3:"),
        "{e}"
    );
    std::fs::write(&p, "a,b\n1,2\n3,x\n").unwrap();
    let t = read_csv(&p).unwrap();
    assert_eq!(t.num_rows(), 2);
    assert!(t.column("a").unwrap().is_numeric() && !t.column("b").unwrap().is_numeric());
}

#[test]
#[ignore = "long fuzz run: EMBER_FUZZ_SECS (600) seconds"]
fn fuzz_csv_long() {
    fuzz_long(
        "csv",
        vec![
            ("arbitrary", csv_arbitrary()),
            ("damaged", csv_structured()),
            ("valid", csv_valid()),
        ],
    );
}
