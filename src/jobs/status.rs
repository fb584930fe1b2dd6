//! `swelake status`: what state a lake is in, for an operator — per job its watermark, the
//! partitions still to do and its last run; per table its version and files; the leases held.

use std::fmt::Write as _;

use anyhow::Result;
use serde::Serialize;

use super::{sql_job, whole_fingerprint, Partitioning, Registry, RunOptions, Step};
use crate::lake::lease::Entry;
use crate::lake::maintain::TableStatus;
use crate::lake::runs::{self, RunRecord, WHOLE};
use crate::lake::Lake;

/// The last attempt of a job.
#[derive(Debug, Clone, Serialize)]
pub struct LastRun {
    /// RFC 3339, UTC.
    pub finished_at: String,
    pub seconds: f64,
    pub partition: String,
    pub rows_out: u64,
    /// `ok` or `failed`.
    pub outcome: String,
    pub error: Option<String>,
}

/// One job's state.
#[derive(Debug, Clone, Serialize)]
pub struct JobStatus {
    pub job: String,
    /// The last input partition done (in partition order), if any.
    pub watermark: Option<String>,
    pub partitions_done: usize,
    /// Input partitions that are new or changed since they were done; `None` where the lake
    /// cannot say (ingest's source and the git stages' repositories are outside it).
    pub partitions_pending: Option<Vec<String>>,
    pub last_run: Option<LastRun>,
}

/// The whole lake's state.
#[derive(Debug, Clone, Serialize)]
pub struct LakeStatus {
    pub lake: String,
    pub jobs: Vec<JobStatus>,
    pub tables: Vec<TableStatus>,
    /// Leases held now (expired and released ones are left out).
    pub leases: Vec<Entry>,
    /// Whether the ingested hours are complete (`None`: no hour ingested yet).
    pub hours: Option<crate::archive::Completeness>,
    /// Per repository, what `ingest --github` read from GitHub's REST API (empty when it never ran).
    pub github_api: Vec<crate::archive::ApiSource>,
}

fn time_of(us: i64) -> String {
    chrono::DateTime::from_timestamp_micros(us).map_or_else(|| us.to_string(), |t| t.to_rfc3339())
}

fn last_run(r: &RunRecord) -> LastRun {
    LastRun {
        finished_at: time_of(r.finished_at),
        seconds: (r.finished_at - r.started_at) as f64 / 1e6,
        partition: r.partition_key.clone(),
        rows_out: r.rows_out,
        outcome: r.status.clone(),
        error: r.detail.get("error").and_then(|e| e.as_str()).map(crate::lake::store::redact),
    }
}

/// The status of every job of `registry` and every table of the lake.
pub async fn status(lake: &Lake, registry: &Registry, opts: &RunOptions) -> Result<LakeStatus> {
    let history = runs::history(lake, None).await?;
    let mut jobs = Vec::new();
    for job in registry.jobs.values() {
        let mine: Vec<&RunRecord> = history.iter().filter(|r| r.job == job.name).collect();
        let done = runs::latest_ok(lake, &job.name).await?;
        let real = |k: &String| !k.starts_with("__");
        let watermark = done.keys().filter(|k| real(k)).max().cloned();
        let pending = match (&job.step, &job.partitioning) {
            (Step::Sql(step), Partitioning::Column(pk)) => {
                if lake.has_table(&step.driving_input).await? {
                    let t = lake.open_table(&step.driving_input).await?;
                    let parts = sql_job::partition_fingerprints(&t, pk)?;
                    Some(
                        parts
                            .into_iter()
                            .filter(|(p, fp)| {
                                done.get(p).and_then(|r| r.detail.get("fingerprint")).and_then(|v| v.as_str())
                                    != Some(fp.as_str())
                            })
                            .map(|(p, _)| p)
                            .collect(),
                    )
                } else {
                    Some(Vec::new())
                }
            }
            (_, Partitioning::Whole) => {
                let fp = whole_fingerprint(lake, job, opts).await?;
                let is_done = done.get(WHOLE).and_then(|r| r.detail.get("fingerprint")).and_then(|v| v.as_str())
                    == Some(fp.as_str());
                Some(if is_done { Vec::new() } else { vec![WHOLE.to_string()] })
            }
            _ => None,
        };
        jobs.push(JobStatus {
            job: job.name.clone(),
            watermark,
            partitions_done: done.keys().filter(|k| real(k)).count(),
            partitions_pending: pending,
            last_run: mine.last().map(|r| last_run(r)),
        });
    }
    let mut tables = Vec::new();
    for name in lake.tables().await? {
        tables.push(lake.table_status(&name).await?);
    }
    let now = chrono::Utc::now().timestamp_millis();
    let leases = lake.leases(None).await?.into_iter().filter(|e| !e.released && e.expires_at > now).collect();
    let hours = crate::archive::assess(lake, &opts.curation.completeness).await?;
    let github_api = crate::archive::api_sources(lake).await?;
    Ok(LakeStatus { lake: lake.location(), jobs, tables, leases, hours, github_api })
}

impl LakeStatus {
    pub fn render(&self) -> String {
        let mut s = format!("lake {}\n\njobs\n", self.lake);
        let _ = writeln!(s, "  {:<18} {:<14} {:>5} {:>8}  last run", "job", "watermark", "done", "pending");
        for j in &self.jobs {
            let pending = j.partitions_pending.as_ref().map_or("-".to_string(), |p| p.len().to_string());
            let last = j.last_run.as_ref().map_or("never".to_string(), |r| {
                let err = r.error.as_ref().map(|e| format!(": {e}")).unwrap_or_default();
                format!("{} {} ({:.1}s, {} rows){err}", r.finished_at, r.outcome, r.seconds, r.rows_out)
            });
            let _ = writeln!(
                s,
                "  {:<18} {:<14} {:>5} {:>8}  {last}",
                j.job,
                j.watermark.as_deref().unwrap_or("-"),
                j.partitions_done,
                pending
            );
        }
        let _ = writeln!(s, "\ntables");
        let _ = writeln!(
            s,
            "  {:<20} {:>7} {:>6} {:>12} {:>6} {:>10}  last optimize",
            "table", "version", "files", "bytes", "small", "checkpoint"
        );
        for t in &self.tables {
            let opt = t
                .last_optimize_ms
                .and_then(chrono::DateTime::from_timestamp_millis)
                .map_or("never".to_string(), |d| d.to_rfc3339());
            let cp = t.last_checkpoint_version.map_or("-".to_string(), |v| format!("v{v}"));
            let _ = writeln!(
                s,
                "  {:<20} {:>7} {:>6} {:>12} {:>6} {:>10}  {opt}",
                t.table, t.version, t.files, t.bytes, t.small_files, cp
            );
        }
        if let Some(h) = &self.hours {
            let _ = writeln!(
                s,
                "\nhours {} .. {}: {} ingested, {} complete, {} without a baseline yet, {} flagged",
                h.first_hour.as_deref().unwrap_or("-"),
                h.last_hour.as_deref().unwrap_or("-"),
                h.hours_ingested,
                h.complete,
                h.no_baseline,
                h.flagged.len()
            );
            let _ = writeln!(s, "  expected hours: {} ({})", h.expected.mode, h.expected.reason);
            for f in h.flagged.iter().take(24) {
                let base = f.baseline.map_or(String::new(), |b| format!(" (baseline {b:.0})"));
                let _ = writeln!(s, "  {:<16} {:<8} {} events{base}", f.hour, f.reason, f.events);
            }
            if h.flagged.len() > 24 {
                let _ = writeln!(s, "  ... {} more (--json lists all)", h.flagged.len() - 24);
            }
        }
        if !self.github_api.is_empty() {
            render_github_api(&mut s, &self.github_api);
        }
        if !self.leases.is_empty() {
            let _ = writeln!(s, "\nleases held");
            for l in &self.leases {
                let until =
                    chrono::DateTime::from_timestamp_millis(l.expires_at).map_or(String::new(), |d| d.to_rfc3339());
                let _ = writeln!(s, "  {:<16} {:<24} by {} until {until}", l.job, l.key, l.holder);
            }
        }
        s
    }
}

/// The repositories read through GitHub's REST API: what the last run made and read, in all,
/// where each stands (watermark) and the quota its last call left.
fn render_github_api(s: &mut String, repos: &[crate::archive::ApiSource]) {
    let total = |f: fn(&crate::archive::ApiSource) -> i64| repos.iter().map(f).sum::<i64>();
    let _ = writeln!(
        s,
        "\ngithub api (ingest --github): {} repositories, {} calls in all; {} PRs, {} issues, {} comments, {} reviews read",
        repos.len(),
        total(|r| r.calls_total),
        total(|r| r.prs_total),
        total(|r| r.issues_total),
        total(|r| r.comments_total),
        total(|r| r.reviews_total.unwrap_or(0))
    );
    let _ = writeln!(
        s,
        "  {:<32} {:<9} {:>6} {:>5} {:>5} {:>6} {:>8} {:<20} {:>6}  last run",
        "repository", "status", "calls", "304s", "PRs", "issues", "comments", "watermark", "quota"
    );
    for r in repos {
        let quota = r.quota_remaining.map_or("-".to_string(), |q| q.to_string());
        let mut name = r.repo_name.clone();
        if !r.current_name.is_empty() && r.current_name != r.repo_name {
            name = format!("{name} (now {})", r.current_name);
        }
        let _ = writeln!(
            s,
            "  {:<32} {:<9} {:>6} {:>5} {:>5} {:>6} {:>8} {:<20} {:>6}  {}",
            name,
            r.status,
            r.calls_last_run,
            r.not_modified_last_run,
            r.prs_last_run,
            r.issues_last_run,
            r.comments_last_run,
            if r.watermark.is_empty() { "-" } else { r.watermark.as_str() },
            quota,
            r.last_run_at
        );
        if !r.reason.is_empty() {
            let _ = writeln!(s, "    {}", r.reason);
        }
    }
}
