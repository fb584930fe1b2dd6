//! GH Archive's domain, for every layer that reads it: the hour keys (`YYYY-MM-DD-H`), what
//! each ingested hour file held (`source_hours`, written by ingest), and whether the hours are
//! complete ([`assess`], read by `swelake status` and the dataset card); and what GitHub's REST
//! API gave in its place ([`api_sources()`]).
//!
//! Not here: reading or parsing hour files (the `ingest` stage).

pub mod api_sources;
mod completeness;

use std::collections::HashMap;

use anyhow::Result;
use chrono::{NaiveDate, NaiveDateTime};
use serde::Serialize;

use crate::lake::rows::to_batch;
use crate::lake::{writer_properties, Codec, Lake, TableWriter};

pub use api_sources::{api_sources, ApiSource};
pub use completeness::{
    assess, hours, judge, Completeness, CompletenessConfig, Expect, Expected, HourFlag, HourVerdict, HoursView,
};

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
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HourRecord {
    /// The hour's key (`YYYY-MM-DD-H`; the file's stem for files not named by hour).
    #[serde(rename = "hour")]
    pub key: String,
    #[serde(rename = "hour_start", serialize_with = "micros")]
    pub start: Option<Hour>,
    #[serde(rename = "source_file")]
    pub file: String,
    pub lines: u64,
    pub events: u64,
    pub rejected: u64,
    pub repos: u64,
    pub pr_events: u64,
    pub compressed_bytes: u64,
    pub json_bytes: u64,
}

/// An hour as the microseconds of its start, as a `timestamp` column takes it.
fn micros<S: serde::Serializer>(hour: &Option<Hour>, s: S) -> Result<S::Ok, S::Error> {
    match hour {
        Some(h) => s.serialize_i64(h.0.and_utc().timestamp_micros()),
        None => s.serialize_none(),
    }
}

/// Records an hour file's row in `source_hours`, replacing an earlier row of the same hour.
pub async fn record_hour(lake: &Lake, r: &HourRecord) -> Result<()> {
    let batch = to_batch(SOURCE_HOURS, std::slice::from_ref(r))?;
    let schema = batch.schema();
    let mut table = lake.ensure_contract_table(SOURCE_HOURS).await?;
    let mut w = TableWriter::new(lake, SOURCE_HOURS, &r.key, &schema, None, writer_properties(&[], &[], Codec::Zstd))?;
    w.write(&batch)?;
    let files = w.finish()?;
    lake.replace_key(&mut table, &r.key, files, format!("hour = '{}'", r.key), HashMap::new()).await?;
    Ok(())
}
