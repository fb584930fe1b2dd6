//! Rows written from their schema: the twin of [`crate::query`]. A stage's rows are a
//! `#[derive(Serialize)]` struct; [`to_batch`] matches its fields to the columns of the
//! table's schema file **by name** and builds the record batch in the file's layout, so a
//! column's name lives in two places (the schema file and the struct), never in a list of
//! builders filled by position.
//!
//! A field the table does not have, or a column the struct does not fill, is an error that
//! names both, as is a value that does not fit its column. Values keep their types: integers
//! into integer columns, `i64` microseconds into timestamps, `Vec` into lists, maps and
//! nested structs into maps and structs, `f32`/`f64` bit for bit. A `binary` column takes
//! its bytes through [`hex`] (Arrow's JSON decoder reads binary as hex).

use std::collections::BTreeSet;

use anyhow::{bail, Context, Result};
use arrow::array::RecordBatch;
use arrow::json::ReaderBuilder;
use serde::{Serialize, Serializer};

/// The rows of `table` as one record batch in its schema file's layout.
pub fn to_batch<T: Serialize>(table: &str, rows: &[T]) -> Result<RecordBatch> {
    let schema = crate::schema::arrow(table)?;
    if let Some(first) = rows.first() {
        let fields = field_names(first).with_context(|| format!("rows of `{table}`"))?;
        let columns: BTreeSet<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        let extra: Vec<&str> = fields.iter().map(String::as_str).filter(|f| !columns.contains(f)).collect();
        let missing: Vec<&str> = columns.iter().copied().filter(|c| !fields.contains(*c)).collect();
        if !extra.is_empty() || !missing.is_empty() {
            bail!(
                "the rows of `{table}` do not match schemas/{table}.toml: fields without a column {extra:?}, \
                 columns without a field {missing:?}"
            );
        }
    }
    let mut decoder = ReaderBuilder::new(schema.clone())
        .with_batch_size(rows.len().max(1))
        .with_strict_mode(true)
        .build_decoder()
        .with_context(|| format!("the schema of `{table}`"))?;
    decoder.serialize(rows).with_context(|| format!("rows of `{table}`"))?;
    let batch = decoder.flush().with_context(|| format!("rows of `{table}`"))?;
    Ok(batch.unwrap_or_else(|| RecordBatch::new_empty(schema)))
}

/// The top-level field names of one row (a struct or a map).
fn field_names<T: Serialize>(row: &T) -> Result<BTreeSet<String>> {
    match serde_json::to_value(row)? {
        serde_json::Value::Object(m) => Ok(m.keys().cloned().collect()),
        other => bail!("a row must be a struct or a map, not {other}"),
    }
}

/// Bytes as a `binary` column reads them: `#[serde(serialize_with = "hex")]` on an
/// `Option<Vec<u8>>` field.
pub fn hex<S: Serializer>(bytes: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
    match bytes {
        None => s.serialize_none(),
        Some(b) => {
            const DIGITS: &[u8; 16] = b"0123456789abcdef";
            let mut out = String::with_capacity(b.len() * 2);
            for byte in b {
                out.push(DIGITS[(byte >> 4) as usize] as char);
                out.push(DIGITS[(byte & 15) as usize] as char);
            }
            s.serialize_str(&out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Commit {
        repo_name: String,
        pr_number: i64,
        position: i64,
        sha: String,
        author_name: String,
        author_email: String,
        authored_at: i64,
        committer_name: String,
        committed_at: i64,
        message: String,
        parents: i64,
    }

    fn commit() -> Commit {
        Commit {
            repo_name: "o/r".into(),
            pr_number: 7,
            position: 0,
            sha: "ab".into(),
            author_name: "A".into(),
            author_email: "a@x".into(),
            authored_at: 1_700_000_000_000_000,
            committer_name: "C".into(),
            committed_at: 1_700_000_001_000_000,
            message: "fix\n".into(),
            parents: 1,
        }
    }

    #[test]
    fn fields_fill_their_columns_by_name() {
        let b = to_batch("pr_commits", &[commit()]).unwrap();
        assert_eq!(b.schema(), crate::schema::arrow("pr_commits").unwrap());
        let ts = b.column_by_name("committed_at").unwrap();
        let ts = ts.as_any().downcast_ref::<arrow::array::TimestampMicrosecondArray>().unwrap();
        assert_eq!(ts.value(0), 1_700_000_001_000_000);
        assert_eq!(to_batch::<Commit>("pr_commits", &[]).unwrap().num_rows(), 0);
    }

    #[test]
    fn a_column_missing_on_either_side_is_named() {
        #[derive(Serialize)]
        struct Short {
            repo_name: String,
            pr_number: i64,
            shaa: String,
        }
        let e = to_batch("pr_commits", &[Short { repo_name: "o/r".into(), pr_number: 1, shaa: "x".into() }])
            .unwrap_err()
            .to_string();
        assert!(e.contains("[\"shaa\"]") && e.contains("\"sha\"") && e.contains("\"message\""), "{e}");
    }

    #[test]
    fn binary_goes_through_hex_exactly() {
        #[derive(Serialize)]
        struct Blob {
            blob_sha: String,
            size: i64,
            is_binary: bool,
            is_utf8: bool,
            stored: bool,
            content: Option<String>,
            #[serde(serialize_with = "hex")]
            content_bytes: Option<Vec<u8>>,
        }
        let bytes: Vec<u8> = (0..=255).collect();
        let rows = [Blob {
            blob_sha: "b".into(),
            size: 256,
            is_binary: true,
            is_utf8: false,
            stored: true,
            content: None,
            content_bytes: Some(bytes.clone()),
        }];
        let b = to_batch("file_blobs", &rows).unwrap();
        let col = b.column_by_name("content_bytes").unwrap();
        let col = col.as_any().downcast_ref::<arrow::array::BinaryArray>().unwrap();
        assert_eq!(col.value(0), bytes.as_slice());
    }
}
