//! `swelake run`: jobs in dependency order, incrementally, locally or on Ballista.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};

use super::{default_jobs, parse_duration, Ctx, EXIT_BUSY};
use crate::ingest::IngestOptions;
use crate::lake::Lake;

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EngineArg {
    Local,
    Ballista,
}

#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    /// Jobs to run (with their dependencies).
    #[arg(required_unless_present_any = ["all", "list"])]
    jobs: Vec<String>,
    /// Run every job.
    #[arg(long, conflicts_with = "jobs")]
    all: bool,
    /// List the jobs and exit.
    #[arg(long)]
    list: bool,
    /// Lake: a directory or s3://bucket/prefix, gs://…, az://…, file://…
    #[arg(long, required_unless_present = "list")]
    lake: Option<String>,
    /// Only input partitions at or after this value (a date for event partitions).
    #[arg(long)]
    since: Option<String>,
    /// Only input partitions at or before this value.
    #[arg(long)]
    until: Option<String>,
    /// GH Archive source for the ingest job (else ingest is skipped).
    #[arg(long)]
    source: Option<String>,
    /// Where the git repositories are, for the snapshots job, with {repo} for owner/name:
    /// file:///mirrors/{repo}.git, /srv/git/{repo}, https://github.com/{repo}.git
    #[arg(long)]
    repo_url: Option<String>,
    /// Snapshot only these repositories (comma-separated owner/name).
    #[arg(long, value_delimiter = ',')]
    repos: Vec<String>,
    /// The lake's repositories, one owner/name per line (# comments): they are mirrored and
    /// their merged PRs found in git (prs_from_git), with or without GH Archive. Needs
    /// --repo-url.
    #[arg(long, value_name = "FILE", requires = "repo_url")]
    repos_file: Option<PathBuf>,
    /// Also find merged PRs in git for a lake fed by GH Archive (merge commits, squash merges,
    /// refs/pull/N/head), which misses most of them since 2025-05. Also `[discovery] from_git`.
    #[arg(long)]
    discover_from_git: bool,
    /// Directory of the bare git mirrors kept between runs [default: ~/.cache/swelake/mirrors].
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Blobs larger than this are recorded without their content.
    #[arg(long, default_value_t = 1 << 20)]
    max_blob_bytes: usize,
    /// Git stages (prs_from_git, snapshots, relevance) on this shard's repositories only:
    /// I/N with 0 <= I < N. N workers with 0/N … N-1/N cover every repository exactly once
    /// (by a stable hash of owner/name) and commit to the same tables; blobs that several
    /// repositories share are stored once. E.g. a Kubernetes indexed Job:
    /// --shard $JOB_COMPLETION_INDEX/N.
    #[arg(long, value_name = "I/N")]
    shard: Option<crate::git::Shard>,
    /// Curation config (filters, relevance, seed) [default: the built-in config/curation.toml].
    #[arg(long)]
    config: Option<PathBuf>,
    /// Redo work that is already done (snapshots, relevance).
    #[arg(long)]
    force: bool,
    /// Read job declarations from this directory (overrides the built-in jobs/).
    #[arg(long)]
    jobs_dir: Option<PathBuf>,
    /// Read SQL files from this directory (overrides the built-in sql/).
    #[arg(long)]
    sql_dir: Option<PathBuf>,
    /// Print one JSON line: {"ok", "failed_job", "error", "jobs": [{job, outcome, ...}]}
    /// (outcome: done, up_to_date, skipped, failed, not_run). The exit status is 0 only when
    /// every due job succeeded; skipped jobs (no --source, nothing due) are not failures.
    #[arg(long)]
    json: bool,
    /// When another run of a job holds some of its inputs, wait up to this long (30s, 10m, 2h)
    /// instead of exiting with status 75.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    wait_for_lease: Option<std::time::Duration>,
    /// Where the SQL jobs run: in this process (local) or on a Ballista cluster (ballista,
    /// with --scheduler). The git stages always run here.
    #[arg(long, value_enum, default_value_t = EngineArg::Local)]
    engine: EngineArg,
    /// The Ballista scheduler, df://HOST:PORT (started with `swelake ballista scheduler`).
    #[arg(long, value_name = "df://HOST:PORT")]
    scheduler: Option<String>,
}

impl RunArgs {
    pub(crate) async fn run(self, ctx: &Ctx) -> Result<ExitCode> {
        let a = self;
        let registry = crate::jobs::Registry::load(a.jobs_dir.as_deref(), a.sql_dir.as_deref())?;
        if a.list {
            for j in registry.jobs.values() {
                let after = if j.depends_on.is_empty() { "nothing".to_string() } else { j.depends_on.join(", ") };
                println!(
                    "{:<16} {} step, by {}: {} -> {} (after: {after})\n{:<16} {}",
                    j.name,
                    j.step.name(),
                    match &j.partitioning {
                        crate::jobs::Partitioning::Column(c) => c.as_str(),
                        crate::jobs::Partitioning::Whole => "its inputs as a whole",
                    },
                    j.inputs.join(", "),
                    j.outputs.join(", "),
                    "",
                    j.description
                );
            }
            return Ok(ExitCode::SUCCESS);
        }
        let engine = match (a.engine, &a.scheduler) {
            (EngineArg::Local, None) => crate::distributed::Engine::Local,
            (EngineArg::Local, Some(_)) => bail!("--scheduler is for --engine ballista"),
            (EngineArg::Ballista, None) => bail!("--engine ballista needs --scheduler df://HOST:PORT"),
            (EngineArg::Ballista, Some(s)) => {
                crate::distributed::Engine::Ballista { scheduler: crate::distributed::scheduler_url(s)? }
            }
        };
        let lake = ctx.open(a.lake.as_deref().expect("clap requires --lake"))?;
        let wanted: Vec<String> = if a.all { registry.jobs.keys().cloned().collect() } else { a.jobs.clone() };
        let curation = crate::jobs::CurationConfig::load(a.config.as_deref())?;
        let mut repos = a.repos.clone();
        if let Some(f) = &a.repos_file {
            repos.extend(read_repos_file(f)?);
            repos.sort();
            repos.dedup();
        }
        let discover_prs = a.repos_file.is_some() || a.discover_from_git || curation.discovery.from_git;
        let opts = crate::jobs::RunOptions {
            since: a.since,
            until: a.until,
            ingest: a.source.map(|source| IngestOptions {
                source,
                storage_options: ctx.given.clone(),
                lease_wait: a.wait_for_lease,
                show_progress: !ctx.quiet && !a.json,
                ..Default::default()
            }),
            git: a.repo_url.map(|url| crate::jobs::GitOptions {
                scope: crate::git::Scope {
                    mirrors: crate::git::Mirrors::new(url, a.cache_dir.unwrap_or_else(crate::git::default_cache_dir)),
                    repos: (!repos.is_empty()).then_some(repos),
                    shard: a.shard,
                    force: a.force,
                    threads: default_jobs(),
                    show_progress: !ctx.quiet && !a.json,
                },
                max_blob_bytes: a.max_blob_bytes,
                discover_prs,
            }),
            all: a.all,
            curation,
            lease_wait: a.wait_for_lease,
            show_progress: !ctx.quiet && !a.json,
            engine,
        };
        let mut report = crate::jobs::run_report(&lake, &registry, &wanted, &opts).await?;
        if a.json {
            println!("{}", run_json(&lake, &report));
        } else {
            for s in &report.jobs {
                print!("{}", s.render());
            }
        }
        match report.failure.take() {
            None => Ok(ExitCode::SUCCESS),
            Some(e) if a.json => {
                if let Some(busy) = e.downcast_ref::<crate::lake::lease::Busy>() {
                    eprintln!("busy: {}", crate::lake::store::redact(&busy.to_string()));
                    return Ok(ExitCode::from(EXIT_BUSY));
                }
                eprintln!("error: {}", crate::lake::store::redact(&format!("{e:#}")));
                Ok(ExitCode::FAILURE)
            }
            Some(e) => Err(e),
        }
    }
}

/// The repositories of a `--repos-file`: one `owner/name` per line; blank lines and `#`
/// comments are skipped; anything else is an error that names the line.
fn read_repos_file(path: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading --repos-file {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let l = line.split('#').next().unwrap_or("").trim();
        if l.is_empty() {
            continue;
        }
        let ok = l.split('/').count() == 2
            && l.split('/').all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)));
        if !ok {
            bail!("{}:{}: {l:?} is not a repository (owner/name)", path.display(), i + 1);
        }
        out.push(l.to_string());
    }
    if out.is_empty() {
        bail!("--repos-file {} names no repository", path.display());
    }
    Ok(out)
}

/// One line for a scheduler: what each job did, and the error that ended the run.
fn run_json(lake: &Lake, report: &crate::jobs::RunReport) -> serde_json::Value {
    let mut jobs: Vec<serde_json::Value> = report
        .jobs
        .iter()
        .map(|s| {
            let outcome = if s.skipped_reason.is_some() {
                "skipped"
            } else if s.partitions.is_empty() {
                "up_to_date"
            } else {
                "done"
            };
            serde_json::json!({
                "job": s.job,
                "outcome": outcome,
                "partitions": s.partitions.len(),
                "rows_out": s.rows_out,
                "seconds": (s.seconds * 1000.0).round() / 1000.0,
                "skipped_reason": s.skipped_reason,
                "notes": s.notes,
            })
        })
        .collect();
    let error = report.failure.as_ref().map(|e| crate::lake::store::redact(&format!("{e:#}")));
    if let Some(j) = &report.failed_job {
        jobs.push(serde_json::json!({"job": j, "outcome": "failed", "error": error}));
    }
    for j in &report.not_run {
        jobs.push(serde_json::json!({"job": j, "outcome": "not_run"}));
    }
    serde_json::json!({
        "ok": report.failure.is_none(),
        "lake": lake.location(),
        "failed_job": report.failed_job,
        "error": error,
        "jobs": jobs,
    })
}
