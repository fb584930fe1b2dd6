//! Scheduled, incremental jobs: declared in `jobs/*.toml`, run by `swelake run JOB` (with the
//! jobs it depends on) or `swelake run --all`, in dependency order.
//!
//! An SQL job reads the partitions of its *driving input* that it has not processed yet — or
//! whose files changed since (a re-ingested hour) — as the view `{input}_new`, runs its SQL
//! file over the lake, and writes the result in one of three ways (see [`sql_job::WriteMode`]).
//! Each processed partition is recorded in `_job_runs` with a fingerprint of its input files:
//! that is the watermark, and rerunning with nothing new changes nothing.
//!
//! The job and SQL files are compiled in (so the binary works anywhere) and can be overridden
//! from a directory with `--jobs-dir`/`--sql-dir`.

pub mod runs;
pub mod sql_job;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::lake::Lake;

/// A job declaration (`jobs/NAME.toml`).
#[derive(Debug, Clone, Deserialize)]
pub struct JobSpec {
    pub name: String,
    pub description: String,
    /// `sql`, or `rust:<step>` for jobs implemented in Rust.
    pub step: String,
    #[serde(default)]
    pub sql: Option<String>,
    #[serde(default)]
    pub inputs: Vec<String>,
    #[serde(default)]
    pub driving_input: Option<String>,
    pub partition_key: String,
    #[serde(default)]
    pub outputs: Vec<String>,
    #[serde(default)]
    pub depends_on: Vec<String>,
    /// Inputs that may not exist yet (registered empty, with their known schema).
    #[serde(default)]
    pub optional_inputs: Vec<String>,
    /// A count query; when it is positive the job runs even without new partitions (e.g.
    /// PRs snapshotted since the job's last run). It can read `job_last_run(last_run_at)`.
    #[serde(default)]
    pub also_due_when: Option<String>,
    #[serde(default)]
    pub write: Option<sql_job::WriteSpec>,
}

const EMBEDDED_JOBS: &[(&str, &str)] = &[
    ("ingest", include_str!("../../jobs/ingest.toml")),
    ("pr_timeline", include_str!("../../jobs/pr_timeline.toml")),
    ("issues", include_str!("../../jobs/issues.toml")),
    ("pull_requests", include_str!("../../jobs/pull_requests.toml")),
    ("pr_issue_links", include_str!("../../jobs/pr_issue_links.toml")),
    ("snapshots", include_str!("../../jobs/snapshots.toml")),
    ("filters", include_str!("../../jobs/filters.toml")),
    ("relevance", include_str!("../../jobs/relevance.toml")),
    ("seed", include_str!("../../jobs/seed.toml")),
];

const EMBEDDED_SQL: &[(&str, &str)] = &[
    ("pr_timeline.sql", include_str!("../../sql/pr_timeline.sql")),
    ("issues.sql", include_str!("../../sql/issues.sql")),
    ("pull_requests.sql", include_str!("../../sql/pull_requests.sql")),
    ("pr_issue_links.sql", include_str!("../../sql/pr_issue_links.sql")),
    ("pr_quality.sql", include_str!("../../sql/pr_quality.sql")),
];

/// The declared jobs and their SQL.
#[derive(Debug, Clone)]
pub struct Registry {
    pub jobs: BTreeMap<String, JobSpec>,
    sql: BTreeMap<String, String>,
}

impl Registry {
    /// The built-in jobs, with files in `jobs_dir`/`sql_dir` (if given) taking precedence.
    pub fn load(jobs_dir: Option<&Path>, sql_dir: Option<&Path>) -> Result<Registry> {
        let mut jobs = BTreeMap::new();
        for (name, text) in EMBEDDED_JOBS {
            let spec: JobSpec = toml::from_str(text).with_context(|| format!("jobs/{name}.toml"))?;
            jobs.insert(spec.name.clone(), spec);
        }
        if let Some(dir) = jobs_dir {
            for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
                let path = entry?.path();
                if path.extension().is_some_and(|e| e == "toml") {
                    let text = std::fs::read_to_string(&path)?;
                    let spec: JobSpec = toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
                    jobs.insert(spec.name.clone(), spec);
                }
            }
        }
        let mut sql: BTreeMap<String, String> =
            EMBEDDED_SQL.iter().map(|(n, t)| (n.to_string(), t.to_string())).collect();
        if let Some(dir) = sql_dir {
            for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
                let path: PathBuf = entry?.path();
                if path.extension().is_some_and(|e| e == "sql") {
                    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
                    sql.insert(name, std::fs::read_to_string(&path)?);
                }
            }
        }
        let r = Registry { jobs, sql };
        r.validate()?;
        Ok(r)
    }

    fn validate(&self) -> Result<()> {
        for j in self.jobs.values() {
            for d in &j.depends_on {
                if !self.jobs.contains_key(d) {
                    bail!("job `{}` depends on unknown job `{d}`", j.name);
                }
            }
            if j.step == "sql" {
                let file =
                    j.sql.as_deref().with_context(|| format!("job `{}` has step sql but no `sql` file", j.name))?;
                if !self.sql.contains_key(file) {
                    bail!("job `{}`: no SQL file `{file}`", j.name);
                }
                if j.driving_input.is_none() || j.write.is_none() {
                    bail!("job `{}` needs `driving_input` and a [write] section", j.name);
                }
            }
        }
        self.order(&self.jobs.keys().cloned().collect::<Vec<_>>()).map(|_| ())
    }

    pub fn sql(&self, file: &str) -> Option<&str> {
        self.sql.get(file).map(|s| s.as_str())
    }

    /// `wanted` and everything they depend on, dependencies first.
    pub fn order(&self, wanted: &[String]) -> Result<Vec<String>> {
        let mut out = Vec::new();
        let mut state: BTreeMap<String, u8> = BTreeMap::new();
        fn visit(r: &Registry, name: &str, state: &mut BTreeMap<String, u8>, out: &mut Vec<String>) -> Result<()> {
            match state.get(name) {
                Some(2) => return Ok(()),
                Some(1) => bail!("jobs depend on each other in a cycle through `{name}`"),
                _ => {}
            }
            let Some(job) = r.jobs.get(name) else {
                bail!("no job `{name}` (known: {})", r.jobs.keys().cloned().collect::<Vec<_>>().join(", "));
            };
            state.insert(name.to_string(), 1);
            for d in &job.depends_on {
                visit(r, d, state, out)?;
            }
            state.insert(name.to_string(), 2);
            out.push(name.to_string());
            Ok(())
        }
        for w in wanted {
            visit(self, w, &mut state, &mut out)?;
        }
        Ok(out)
    }
}

/// Options of `swelake run`.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Only input partitions at or after this partition value (e.g. a date `2025-01-06`).
    pub since: Option<String>,
    /// Only input partitions at or before this partition value.
    pub until: Option<String>,
    /// Source for the ingest job; without it ingest is skipped.
    pub ingest: Option<crate::ingest::IngestOptions>,
    /// Where the git repositories are, for the snapshots job; without it snapshots is skipped.
    pub snapshots: Option<crate::snapshots::SnapshotOptions>,
    /// Running every job (`--all`): jobs that cannot run (ingest without a source) are
    /// skipped instead of being an error.
    pub all: bool,
    /// Curation settings (filters, relevance, seed); the built-in config when `None`.
    pub curation: Option<crate::config::CurationConfig>,
}

/// What one job did, as printed by the CLI and recorded in `_job_runs`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct JobSummary {
    pub job: String,
    /// Input partitions processed in this run.
    pub partitions: Vec<String>,
    pub rows_out: u64,
    /// Extra figures a job reports (e.g. PRs with unknown merge state).
    pub notes: BTreeMap<String, i64>,
    pub skipped_reason: Option<String>,
    pub seconds: f64,
}

impl JobSummary {
    pub fn render(&self) -> String {
        if let Some(r) = &self.skipped_reason {
            return format!("{:<16} skipped: {r}\n", self.job);
        }
        let mut s = if self.partitions.is_empty() {
            format!("{:<16} up to date\n", self.job)
        } else {
            format!(
                "{:<16} {} partition(s) [{}] -> {} row(s) in {:.2}s\n",
                self.job,
                self.partitions.len(),
                abbreviate(&self.partitions),
                self.rows_out,
                self.seconds
            )
        };
        for (k, v) in &self.notes {
            s.push_str(&format!("{:<16}   {k}: {v}\n", ""));
        }
        s
    }
}

fn abbreviate(parts: &[String]) -> String {
    match parts.len() {
        0 => String::new(),
        1..=3 => parts.join(", "),
        n => format!("{} .. {} ({n})", parts[0], parts[n - 1]),
    }
}

/// Runs `wanted` jobs (and their dependencies) in order.
pub async fn run(lake: &Lake, registry: &Registry, wanted: &[String], opts: &RunOptions) -> Result<Vec<JobSummary>> {
    let order = registry.order(wanted)?;
    let mut out = Vec::new();
    let explicitly: BTreeSet<&String> = if opts.all { BTreeSet::new() } else { wanted.iter().collect() };
    for name in order {
        let job = &registry.jobs[&name];
        let started = std::time::Instant::now();
        let mut summary = match job.step.as_str() {
            "sql" => sql_job::run(lake, registry, job, opts).await.with_context(|| format!("job `{name}`"))?,
            "rust:ingest" => match &opts.ingest {
                Some(io) => {
                    let s = crate::ingest::ingest(lake, io).await?;
                    if !s.ok() {
                        bail!("ingest had {} failed file(s); see the summary above", s.files_failed);
                    }
                    JobSummary {
                        job: name.clone(),
                        partitions: s.files.iter().filter(|f| !f.skipped).map(|f| f.key.clone()).collect(),
                        rows_out: s.events_written,
                        notes: BTreeMap::from([("rejected_lines".to_string(), s.rejected as i64)]),
                        ..Default::default()
                    }
                }
                None if explicitly.contains(&name) => bail!("the ingest job needs --source"),
                None => JobSummary {
                    job: name.clone(),
                    skipped_reason: Some("no --source given (the lake's events are used as they are)".into()),
                    ..Default::default()
                },
            },
            "rust:snapshots" => match &opts.snapshots {
                Some(so) => {
                    let s = crate::snapshots::run(lake, so).await?;
                    let mut notes = BTreeMap::from([
                        ("prs_snapshotted".to_string(), s.prs_snapshotted as i64),
                        ("prs_already_done".to_string(), s.prs_already_done as i64),
                        ("prs_failed".to_string(), s.prs_failed as i64),
                        ("files".to_string(), s.files as i64),
                        ("new_blobs".to_string(), s.new_blobs as i64),
                    ]);
                    for (reason, n) in &s.failures_by_reason {
                        notes.insert(format!("failed:{reason}"), *n as i64);
                    }
                    let mut partitions = s.repos_processed.clone();
                    partitions.sort();
                    JobSummary { job: name.clone(), partitions, rows_out: s.files as u64, notes, ..Default::default() }
                }
                None if explicitly.contains(&name) => bail!("the snapshots job needs --repo-url"),
                None => JobSummary {
                    job: name.clone(),
                    skipped_reason: Some("no --repo-url given (where the git repositories are)".into()),
                    ..Default::default()
                },
            },
            "rust:relevance" => match &opts.snapshots {
                Some(so) => {
                    let config = opts.curation.clone().map_or_else(|| crate::config::CurationConfig::load(None), Ok)?;
                    let ro = crate::relevance::RelevanceOptions {
                        repo_url: so.repo_url.clone(),
                        cache_dir: so.cache_dir.clone(),
                        config: config.relevance,
                        force: so.force,
                        threads: so.jobs,
                        show_progress: so.show_progress,
                    };
                    let s = crate::relevance::run(lake, &ro).await?;
                    let mut notes = BTreeMap::from([
                        ("prs_ranked".to_string(), s.prs as i64),
                        ("prs_already_done".to_string(), s.prs_already_done as i64),
                        ("candidates".to_string(), s.candidates as i64),
                        ("chunks_embedded".to_string(), s.embedded_chunks as i64),
                    ]);
                    for (k, v) in &s.failures {
                        notes.insert(format!("failed:{k}"), *v as i64);
                    }
                    let partitions = if s.prs > 0 { vec![format!("{} PR(s)", s.prs)] } else { Vec::new() };
                    JobSummary { job: name.clone(), partitions, rows_out: s.rows as u64, notes, ..Default::default() }
                }
                None if explicitly.contains(&name) => {
                    bail!("the relevance job needs --repo-url (it reads the repositories)")
                }
                None => JobSummary {
                    job: name.clone(),
                    skipped_reason: Some("no --repo-url given (where the git repositories are)".into()),
                    ..Default::default()
                },
            },
            "rust:seed" => {
                let config = opts.curation.clone().map_or_else(|| crate::config::CurationConfig::load(None), Ok)?;
                let fingerprint = sql_job::inputs_fingerprint(lake, &job.inputs, &format!("{:?}", config.seed)).await?;
                let done = runs::latest_ok(lake, &name).await?;
                let same = done.get("__all__").and_then(|r| r.detail.get("fingerprint")).and_then(|v| v.as_str())
                    == Some(fingerprint.as_str());
                let missing = ["pr_quality", "pull_requests", "pr_snapshots", "pr_files"]
                    .into_iter()
                    .find(|t| !lake.has_table(t));
                if let Some(t) = missing {
                    JobSummary {
                        job: name.clone(),
                        skipped_reason: Some(format!("no `{t}` table yet (the snapshots job needs --repo-url)")),
                        ..Default::default()
                    }
                } else if same {
                    JobSummary { job: name.clone(), ..Default::default() }
                } else {
                    let s = crate::seed::run(lake, &config.seed).await?;
                    let mut notes = BTreeMap::from([
                        ("instances".to_string(), s.instances as i64),
                        ("train".to_string(), s.train as i64),
                        ("test".to_string(), s.test as i64),
                        ("excluded_by_split".to_string(), s.excluded as i64),
                        ("shards".to_string(), s.shards.len() as i64),
                        ("relevant_files_dropped_for_budget".to_string(), s.relevant_files_dropped_for_budget as i64),
                        ("mean_prompt_tokens".to_string(), s.mean_prompt_tokens.round() as i64),
                    ]);
                    for (k, v) in &s.rejected {
                        notes.insert(format!("rejected:{k}"), *v as i64);
                    }
                    let rec = runs::RunRecord::ok(
                        &name,
                        "__all__",
                        0,
                        s.instances as u64,
                        s.rejected.values().sum::<usize>() as u64,
                        None,
                        serde_json::json!({"fingerprint": fingerprint, "shards": s.shards}),
                    );
                    runs::record(lake, rec).await?;
                    JobSummary {
                        job: name.clone(),
                        partitions: vec!["__all__".into()],
                        rows_out: s.instances as u64,
                        notes,
                        ..Default::default()
                    }
                }
            }
            other => bail!("job `{name}`: unknown step `{other}`"),
        };
        summary.seconds = started.elapsed().as_secs_f64();
        tracing::info!(job = %name, partitions = summary.partitions.len(), rows = summary.rows_out, "job done");
        out.push(summary);
    }
    Ok(out)
}
