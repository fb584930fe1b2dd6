//! `swelake sql`: read-only SQL over every table of a lake, with every swelake SQL function,
//! printed as a table, CSV, a JSON array or JSON lines. In JSON every column of a row is a key,
//! `null` when the value is NULL (scripts index rows by key).

use std::io::Write;

use anyhow::{Context, Result};
use arrow::array::RecordBatch;

use crate::lake::Lake;

pub mod bounded;
pub mod guard;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Aligned text table.
    Table,
    /// CSV with a header row.
    Csv,
    /// One JSON array of row objects.
    Json,
    /// One JSON object per line.
    Jsonl,
}

/// A session over every table of the lake with every swelake SQL function: what `swelake sql`,
/// its shell and the console query.
pub async fn session(lake: &Lake) -> Result<datafusion::prelude::SessionContext> {
    let ctx = lake.session().await?;
    crate::udfs::register_all(&ctx);
    Ok(ctx)
}

/// The lake's tables registered in a [`session`], sorted.
pub fn table_names(ctx: &datafusion::prelude::SessionContext) -> Vec<String> {
    let mut names =
        ctx.catalog("datafusion").and_then(|c| c.schema("public")).map_or_else(Vec::new, |s| s.table_names());
    names.sort();
    names
}

/// Runs `query` (SELECT, WITH, SHOW, DESCRIBE, EXPLAIN only) and returns the batches.
pub async fn query(lake: &Lake, query: &str) -> Result<Vec<RecordBatch>> {
    run_read_only(&session(lake).await?, query).await
}

/// [`query`] on the Ballista cluster at `scheduler`, over the tables' current files.
pub async fn query_on_cluster(lake: &Lake, scheduler: &str, query: &str) -> Result<Vec<RecordBatch>> {
    let ctx = crate::distributed::session(lake, scheduler, &[]).await?;
    run_read_only(&ctx, query).await
}

/// Runs `query` if its plan only reads ([`guard::check`]).
pub(crate) async fn run_read_only(ctx: &datafusion::prelude::SessionContext, query: &str) -> Result<Vec<RecordBatch>> {
    let state = ctx.state();
    let plan = guard::plan(&state, query).await.context("planning the query")?;
    let df = datafusion::dataframe::DataFrame::new(state, plan);
    df.collect().await.context("running the query")
}

/// Writes batches in the chosen format.
pub fn write(batches: &[RecordBatch], format: Format, mut out: impl Write) -> Result<()> {
    match format {
        Format::Table => {
            writeln!(out, "{}", arrow::util::pretty::pretty_format_batches(batches)?)?;
        }
        Format::Csv => {
            let mut w = arrow::csv::WriterBuilder::new().with_header(true).build(&mut out);
            for b in batches {
                w.write(b)?;
            }
        }
        Format::Json => {
            let mut w = arrow::json::WriterBuilder::new()
                .with_explicit_nulls(true)
                .build::<_, arrow::json::writer::JsonArray>(&mut out);
            let refs: Vec<&RecordBatch> = batches.iter().collect();
            w.write_batches(&refs)?;
            w.finish()?;
            drop(w);
            writeln!(out)?;
        }
        Format::Jsonl => {
            let mut w = arrow::json::WriterBuilder::new()
                .with_explicit_nulls(true)
                .build::<_, arrow::json::writer::LineDelimited>(&mut out);
            let refs: Vec<&RecordBatch> = batches.iter().collect();
            w.write_batches(&refs)?;
            w.finish()?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, BooleanArray, Int64Array};

    use super::*;

    #[test]
    fn json_rows_keep_every_column_null_included() {
        let b = RecordBatch::try_from_iter(vec![
            ("number", Arc::new(Int64Array::from(vec![9, 10])) as ArrayRef),
            ("merged", Arc::new(BooleanArray::from(vec![None, Some(true)]))),
        ])
        .unwrap();
        let mut out = Vec::new();
        write(std::slice::from_ref(&b), Format::Jsonl, &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "{\"number\":9,\"merged\":null}\n{\"number\":10,\"merged\":true}\n"
        );
        let mut out = Vec::new();
        write(&[b], Format::Json, &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "[{\"number\":9,\"merged\":null},{\"number\":10,\"merged\":true}]\n"
        );
    }
}
