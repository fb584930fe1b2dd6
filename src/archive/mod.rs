//! GH Archive's domain, for every layer that reads it: the hour keys (`YYYY-MM-DD-H`), what
//! each ingested hour file held (`source_hours`, written by ingest), and whether the hours are
//! complete ([`assess`], read by `swelake status` and the dataset card).
//!
//! Not here: reading or parsing hour files (the `ingest` stage).

mod completeness;

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::Result;
use arrow::array::{Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray};
use chrono::{NaiveDate, NaiveDateTime};

use crate::lake::{writer_properties, Codec, Lake, TableWriter};

pub use completeness::*;

/// The table of what each ingested hour file held.
pub const SOURCE_HOURS: &str = "source_hours";

/// An hour of the archive: `YYYY-MM-DD-H` (hour not zero-padded), ordered by time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Hour(pub NaiveDateTime);

impl Hour {
    /// Parses `YYYY-MM-DD-H` (also accepts a zero-padded hour).
    pub fn parse(s: &str) -> Option<Hour> {
        let (date, hour) = s.rsplit_once('-')?;
        let date = NaiveDate::parse_from_str(date, "%Y-%m-%d").ok()?;
        if hour.is_empty() || hour.len() > 2 || !hour.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let h: u32 = hour.parse().ok()?;
        Some(Hour(date.and_hms_opt(h, 0, 0)?))
    }

    pub fn key(&self) -> String {
        self.0.format("%Y-%m-%d-%-H").to_string()
    }

    pub fn next(&self) -> Hour {
        Hour(self.0 + chrono::Duration::hours(1))
    }
}

/// One row of `source_hours`: what an hour file held.
#[derive(Debug, Clone, PartialEq)]
pub struct HourRecord {
    /// The hour's key (`YYYY-MM-DD-H`; the file's stem for files not named by hour).
    pub key: String,
    pub start: Option<Hour>,
    pub file: String,
    pub lines: u64,
    pub events: u64,
    pub rejected: u64,
    pub repos: u64,
    pub pr_events: u64,
    pub compressed_bytes: u64,
    pub json_bytes: u64,
}

/// Records an hour file's row in `source_hours`, replacing an earlier row of the same hour.
pub async fn record_hour(lake: &Lake, r: &HourRecord) -> Result<()> {
    let schema = crate::schema::arrow(SOURCE_HOURS)?;
    let n = |v: u64| Arc::new(Int64Array::from(vec![v as i64]));
    let start = r.start.map(|h| h.0.and_utc().timestamp_micros());
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(StringArray::from(vec![r.key.clone()])),
            Arc::new(TimestampMicrosecondArray::from(vec![start]).with_timezone("UTC")),
            Arc::new(StringArray::from(vec![r.file.clone()])),
            n(r.lines),
            n(r.events),
            n(r.rejected),
            n(r.repos),
            n(r.pr_events),
            n(r.compressed_bytes),
            n(r.json_bytes),
        ],
    )?;
    let mut table = lake.ensure_contract_table(SOURCE_HOURS).await?;
    let mut w = TableWriter::new(lake, SOURCE_HOURS, &r.key, &schema, None, writer_properties(&[], &[], Codec::Zstd))?;
    w.write(&batch)?;
    let files = w.finish()?;
    lake.replace_key(&mut table, &r.key, files, format!("hour = '{}'", r.key), HashMap::new()).await?;
    Ok(())
}
