//! `_job_runs`: what each job did to each partition, appended once per attempt.
//!
//! A job asks [`latest_ok`] which partitions it has already completed and skips them; a
//! partition whose last attempt failed, or that never ran, is done again. Rows are only ever
//! appended, so the table is also the history of every run.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::Result;
use arrow::array::{Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray};
use serde::Deserialize;
use serde_json::Value;

use crate::lake::Lake;

pub const JOB_RUNS: &str = "_job_runs";

/// One attempt of one job on one partition.
#[derive(Debug, Clone)]
pub struct RunRecord {
    pub job: String,
    pub partition_key: String,
    pub status: String,
    pub started_at: i64,
    pub finished_at: i64,
    pub rows_in: u64,
    pub rows_out: u64,
    pub rows_rejected: u64,
    pub output_version: Option<i64>,
    pub detail: Value,
}

impl RunRecord {
    pub fn ok(
        job: &str,
        key: &str,
        rows_in: u64,
        rows_out: u64,
        rejected: u64,
        version: Option<i64>,
        detail: Value,
    ) -> Self {
        let now = chrono::Utc::now().timestamp_micros();
        RunRecord {
            job: job.to_string(),
            partition_key: key.to_string(),
            status: "ok".to_string(),
            started_at: now,
            finished_at: now,
            rows_in,
            rows_out,
            rows_rejected: rejected,
            output_version: version,
            detail,
        }
    }

    /// Sets `started_at` to `seconds` before `finished_at`.
    pub fn timed(mut self, seconds: f64) -> Self {
        self.started_at = self.finished_at - (seconds * 1e6) as i64;
        self
    }
}

fn to_batch(records: &[RunRecord]) -> Result<RecordBatch> {
    let s = |f: &dyn Fn(&RunRecord) -> String| Arc::new(StringArray::from_iter_values(records.iter().map(f)));
    let t = |f: &dyn Fn(&RunRecord) -> i64| {
        Arc::new(TimestampMicrosecondArray::from_iter_values(records.iter().map(f)).with_timezone("UTC"))
    };
    let i = |f: &dyn Fn(&RunRecord) -> i64| Arc::new(Int64Array::from_iter_values(records.iter().map(f)));
    Ok(RecordBatch::try_new(
        crate::schema::arrow(JOB_RUNS)?,
        vec![
            s(&|r| r.job.clone()),
            s(&|r| r.partition_key.clone()),
            s(&|r| r.status.clone()),
            t(&|r| r.started_at),
            t(&|r| r.finished_at),
            i(&|r| r.rows_in as i64),
            i(&|r| r.rows_out as i64),
            i(&|r| r.rows_rejected as i64),
            Arc::new(Int64Array::from_iter(records.iter().map(|r| r.output_version))),
            // Error texts may quote a URL or a store's message: no credential is ever recorded.
            s(&|r| crate::lake::store::redact(&r.detail.to_string())),
            s(&|_| env!("CARGO_PKG_VERSION").to_string()),
        ],
    )?)
}

/// Appends run records.
pub async fn record(lake: &Lake, record: RunRecord) -> Result<()> {
    record_all(lake, &[record]).await
}

pub async fn record_all(lake: &Lake, records: &[RunRecord]) -> Result<()> {
    if records.is_empty() {
        return Ok(());
    }
    let table = lake.ensure_contract_table(JOB_RUNS).await?;
    lake.append(table, vec![to_batch(records)?]).await?;
    Ok(())
}

/// For each partition of `job` whose latest attempt succeeded, that attempt.
pub async fn latest_ok(lake: &Lake, job: &str) -> Result<HashMap<String, RunRecord>> {
    let mut latest: HashMap<String, RunRecord> = HashMap::new();
    for rec in history(lake, Some(job)).await? {
        // Ordered by time: a later failure cancels an earlier success.
        if rec.status == "ok" {
            latest.insert(rec.partition_key.clone(), rec);
        } else {
            latest.remove(&rec.partition_key);
        }
    }
    Ok(latest)
}

/// Every attempt of `job` (of all jobs when `None`), oldest first.
pub async fn history(lake: &Lake, job: Option<&str>) -> Result<Vec<RunRecord>> {
    if !lake.has_table(JOB_RUNS).await? {
        return Ok(Vec::new());
    }
    let table = lake.open_table(JOB_RUNS).await?;
    let ctx = datafusion::prelude::SessionContext::new();
    table.update_datafusion_session(&ctx.state())?;
    ctx.register_table(JOB_RUNS, table.table_provider().await?)?;
    #[derive(Deserialize)]
    struct Row {
        job: String,
        partition_key: String,
        status: String,
        started_at: i64,
        finished_at: i64,
        rows_in: u64,
        rows_out: u64,
        rows_rejected: u64,
        output_version: Option<i64>,
        detail: String,
    }
    let filter = job.map_or_else(|| "true".to_string(), |j| format!("job = '{}'", j.replace('\'', "''")));
    let sql = format!(
        "SELECT job, partition_key, status, started_at, finished_at, rows_in, rows_out, rows_rejected, \
         output_version, detail FROM {JOB_RUNS} WHERE {filter} ORDER BY finished_at"
    );
    let mut out = Vec::new();
    for r in crate::query::rows::<Row>(&ctx, &sql).await? {
        let detail = serde_json::from_str(&r.detail).map_err(|e| {
            anyhow::anyhow!("{JOB_RUNS}: the detail of job {} partition {} is not JSON: {e}", r.job, r.partition_key)
        })?;
        out.push(RunRecord {
            job: r.job,
            partition_key: r.partition_key,
            status: r.status,
            started_at: r.started_at,
            finished_at: r.finished_at,
            rows_in: r.rows_in,
            rows_out: r.rows_out,
            rows_rejected: r.rows_rejected,
            output_version: r.output_version,
            detail,
        });
    }
    Ok(out)
}
