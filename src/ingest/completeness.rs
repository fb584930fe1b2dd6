//! What each ingested hour file held, in `source_hours`: the facts `swelake status` and
//! `swelake report` judge completeness by (`crate::lake::hours`).

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::Result;
use arrow::array::{Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray};

use super::source::SourceFile;
use super::FileSummary;
pub use crate::lake::hours::SOURCE_HOURS;
use crate::lake::{writer_properties, Codec, Lake, TableWriter};

/// Records what the hour file `s` held (replacing an earlier row of the same hour).
pub async fn record_hour(lake: &Lake, s: &SourceFile, f: &FileSummary) -> Result<()> {
    let schema = crate::schema::arrow(SOURCE_HOURS)?;
    let n = |v: u64| Arc::new(Int64Array::from(vec![v as i64]));
    let start = s.hour.map(|h| h.0.and_utc().timestamp_micros());
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(StringArray::from(vec![s.key.clone()])),
            Arc::new(TimestampMicrosecondArray::from(vec![start]).with_timezone("UTC")),
            Arc::new(StringArray::from(vec![s.name.clone()])),
            n(f.lines_read),
            n(f.events_written),
            n(f.rejected),
            n(f.distinct_repos),
            n(f.events_by_type.get("PullRequestEvent").copied().unwrap_or(0)),
            n(f.compressed_bytes),
            n(f.json_bytes),
        ],
    )?;
    let mut table = lake.ensure_contract_table(SOURCE_HOURS).await?;
    let mut w = TableWriter::new(lake, SOURCE_HOURS, &s.key, &schema, None, writer_properties(&[], &[], Codec::Zstd))?;
    w.write(&batch)?;
    let files = w.finish()?;
    lake.replace_key(&mut table, &s.key, files, format!("hour = '{}'", s.key), HashMap::new()).await?;
    Ok(())
}
