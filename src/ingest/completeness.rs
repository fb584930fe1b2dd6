//! What each ingested hour file held, as the archive's `source_hours` row
//! ([`crate::archive::record_hour`]): the facts `swelake status` and `swelake report` judge
//! completeness by.

use anyhow::Result;

use super::source::SourceFile;
use super::FileSummary;
pub use crate::archive::SOURCE_HOURS;
use crate::lake::Lake;

/// Records what the hour file `s` held (replacing an earlier row of the same hour).
pub async fn record_hour(lake: &Lake, s: &SourceFile, f: &FileSummary) -> Result<()> {
    let record = crate::archive::HourRecord {
        key: s.key.clone(),
        start: s.hour,
        file: s.name.clone(),
        lines: f.lines_read,
        events: f.events_written,
        rejected: f.rejected,
        repos: f.distinct_repos,
        pr_events: f.events_by_type.get("PullRequestEvent").copied().unwrap_or(0),
        compressed_bytes: f.compressed_bytes,
        json_bytes: f.json_bytes,
    };
    crate::archive::record_hour(lake, &record).await
}
