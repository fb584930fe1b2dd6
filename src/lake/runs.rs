//! `_job_runs`: what each job did to each partition, appended once per attempt.
//!
//! A job asks [`latest_ok`] which partitions it has already completed and skips them; a
//! partition whose last attempt failed, or that never ran, is done again. Rows are only ever
//! appended, so the table is also the history of every run.

use std::collections::HashMap;

use anyhow::Result;
use arrow::array::RecordBatch;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::lake::rows::to_batch;
use crate::lake::Lake;

pub const JOB_RUNS: &str = "_job_runs";

/// The partition key of a job that works on its inputs as a whole (and the lease key of a
/// run over every repository): one spelling for the scheduler, `status` and the leases.
pub const WHOLE: &str = "__all__";
/// The partition key of a run's failure record.
pub const RUN: &str = "__run";
/// The partition key of an SQL job's run made due by its `also_due_when` query.
pub const ALSO_DUE: &str = "__also_due";
/// A partition column no table has: every file of a table in one partition.
pub const NO_COLUMN: &str = "__none__";

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

/// A row of `_job_runs`, as it is written and read back.
#[derive(Serialize, Deserialize)]
struct JobRunRow {
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
    /// Written by every run; not needed to read a record back.
    #[serde(default)]
    swelake_version: String,
}

impl From<&RunRecord> for JobRunRow {
    fn from(r: &RunRecord) -> JobRunRow {
        JobRunRow {
            job: r.job.clone(),
            partition_key: r.partition_key.clone(),
            status: r.status.clone(),
            started_at: r.started_at,
            finished_at: r.finished_at,
            rows_in: r.rows_in,
            rows_out: r.rows_out,
            rows_rejected: r.rows_rejected,
            output_version: r.output_version,
            // Error texts may quote a URL or a store's message: no credential is ever recorded.
            detail: crate::lake::store::redact(&r.detail.to_string()),
            swelake_version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }
}

impl TryFrom<JobRunRow> for RunRecord {
    type Error = anyhow::Error;

    fn try_from(r: JobRunRow) -> Result<RunRecord> {
        let detail = serde_json::from_str(&r.detail).map_err(|e| {
            anyhow::anyhow!("{JOB_RUNS}: the detail of job {} partition {} is not JSON: {e}", r.job, r.partition_key)
        })?;
        Ok(RunRecord {
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
        })
    }
}

fn batch(records: &[RunRecord]) -> Result<RecordBatch> {
    let rows: Vec<JobRunRow> = records.iter().map(JobRunRow::from).collect();
    to_batch(JOB_RUNS, &rows)
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
    lake.append(table, vec![batch(records)?]).await?;
    Ok(())
}

/// For each partition of `job` whose latest attempt succeeded, that attempt.
/// The newest successful run of `writer` that did work (`rows_in > 0`) after the newest
/// successful run of `reader` began: what `reader`'s output does not yet carry. `None` when
/// `reader` never ran or nothing of `writer` came after it.
pub async fn ran_after(lake: &Lake, writer: &str, reader: &str) -> Result<Option<RunRecord>> {
    let Some(read_at) = latest_ok(lake, reader).await?.values().map(|r| r.started_at).max() else {
        return Ok(None);
    };
    Ok(history(lake, Some(writer))
        .await?
        .into_iter()
        .filter(|r| r.status == "ok" && r.rows_in > 0 && r.finished_at > read_at)
        .max_by_key(|r| r.finished_at))
}

/// An error naming the command to run when verdicts were written after `rl_seed` was built:
/// an export or a card of it would silently leave them out (`--verified-only` would say 0).
pub async fn refuse_stale_seed(lake: &Lake) -> Result<()> {
    if let Some(r) = ran_after(lake, "verify", "seed").await? {
        let at = chrono::DateTime::from_timestamp_micros(r.finished_at).map(|t| t.to_rfc3339()).unwrap_or_default();
        anyhow::bail!(
            "rl_seed is older than the verdicts: verify judged {} PR(s) of {} at {at}, after the seed was built. \
             Run `swelake run seed --lake {}` first (a `swelake run verify` runs it itself)",
            r.rows_in,
            r.partition_key,
            lake.location()
        );
    }
    Ok(())
}

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
    let filter = if job.is_some() { "job = $1" } else { "true" };
    let sql = format!(
        "SELECT job, partition_key, status, started_at, finished_at, rows_in, rows_out, rows_rejected, \
         output_version, detail FROM {JOB_RUNS} WHERE {filter} ORDER BY finished_at"
    );
    let mut df = ctx.sql(&sql).await?;
    if let Some(j) = job {
        df = df.with_param_values(vec![datafusion::common::ScalarValue::from(j)])?;
    }
    let rows: Vec<JobRunRow> = crate::query::from_batches(&df.collect().await?)?;
    rows.into_iter().map(RunRecord::try_from).collect()
}
