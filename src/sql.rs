//! `swelake sql`: read-only SQL over every table of a lake, printed as a table, CSV, a JSON
//! array or JSON lines.

use std::io::Write;

use anyhow::{Context, Result};
use arrow::array::RecordBatch;
use datafusion::execution::context::SQLOptions;

use crate::lake::Lake;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
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

/// Runs `query` (SELECT, WITH, SHOW, DESCRIBE, EXPLAIN only) and returns the batches.
pub async fn query(lake: &Lake, query: &str) -> Result<Vec<RecordBatch>> {
    let ctx = lake.session().await?;
    let options = SQLOptions::new().with_allow_ddl(false).with_allow_dml(false).with_allow_statements(false);
    let df = ctx.sql_with_options(query, options).await.context("planning the query")?;
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
            let mut w = arrow::json::ArrayWriter::new(&mut out);
            let refs: Vec<&RecordBatch> = batches.iter().collect();
            w.write_batches(&refs)?;
            w.finish()?;
            drop(w);
            writeln!(out)?;
        }
        Format::Jsonl => {
            let mut w = arrow::json::LineDelimitedWriter::new(&mut out);
            let refs: Vec<&RecordBatch> = batches.iter().collect();
            w.write_batches(&refs)?;
            w.finish()?;
        }
    }
    Ok(())
}
