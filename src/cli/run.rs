//! `swelake run`: jobs in dependency order, incrementally, locally or on Ballista.

use std::process::ExitCode;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};

use super::args::{ConfigArg, JobsArgs, LakeArg, OutputArg, RepoArgs, ScopeArgs};
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
    #[command(flatten)]
    lake: LakeArg,
    /// Only input partitions at or after this value (a date for event partitions); for
    /// verify, only PRs merged on or after this date (the recent ones first).
    #[arg(long)]
    since: Option<String>,
    /// Only input partitions at or before this value; for verify, PRs merged on or before it.
    #[arg(long)]
    until: Option<String>,
    /// GH Archive source for the ingest job (else ingest is skipped).
    #[arg(long)]
    source: Option<String>,
    /// The git stages (prs_from_git, snapshots, relevance) run only with --repo-url.
    #[command(flatten)]
    repo: RepoArgs,
    #[command(flatten)]
    scope: ScopeArgs,
    /// Also find merged PRs in git for a lake fed by GH Archive (merge commits, squash merges,
    /// refs/pull/N/head), which misses most of them since 2025-05. Also `[discovery] from_git`.
    #[arg(long)]
    discover_from_git: bool,
    /// Blobs larger than this are recorded without their content.
    #[arg(long, default_value_t = 1 << 20)]
    max_blob_bytes: usize,
    #[command(flatten)]
    config: ConfigArg,
    /// Redo work that is already done (snapshots, relevance, verify).
    #[arg(long)]
    force: bool,
    /// Include the verify stage in this run (it runs each PR's own tests, untrusted code, in a
    /// sandbox); also `[verify] enabled = true`. Naming `verify` runs it too.
    #[arg(long)]
    verify: bool,
    /// verify: runs of each side; a test whose outcome differs between them is flaky
    /// [default: [verify] repeat].
    #[arg(long, value_name = "N")]
    repeat: Option<u32>,
    /// verify: time limit of one test run (300s, 10m) [default: [verify] timeout_secs].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    timeout: Option<std::time::Duration>,
    /// verify: bwrap (bubblewrap, the default) or none (no sandbox: tests run with your rights).
    #[arg(long, value_name = "bwrap|none")]
    sandbox: Option<String>,
    /// verify: PRs worked on at once, each in sandboxes of its own [default: [verify] jobs;
    /// 0: the cores].
    #[arg(long = "jobs", value_name = "N")]
    verify_jobs: Option<usize>,
    #[command(flatten)]
    jobs_dirs: JobsArgs,
    #[command(flatten)]
    output: OutputArg,
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
        let registry = a.jobs_dirs.registry()?;
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
        let lake = a.lake.open(ctx)?;
        let wanted: Vec<String> = if a.all { registry.jobs.keys().cloned().collect() } else { a.jobs.clone() };
        let mut curation = a.config.load()?;
        curation.verify.enabled |= a.verify;
        if let Some(n) = a.repeat {
            curation.verify.repeat = n.max(1);
        }
        if let Some(t) = a.timeout {
            curation.verify.timeout_secs = t.as_secs().max(1);
        }
        if let Some(s) = a.sandbox {
            curation.verify.sandbox = s;
        }
        if let Some(n) = a.verify_jobs {
            curation.verify.jobs = n;
        }
        if let Some(d) = &a.since {
            curation.verify.since = d.clone();
        }
        if let Some(d) = &a.until {
            curation.verify.until = d.clone();
        }
        let repos = a.scope.repos()?;
        let discover_prs = a.scope.has_repos_file() || a.discover_from_git || curation.discovery.from_git;
        let opts = crate::jobs::RunOptions {
            since: a.since,
            until: a.until,
            ingest: a.source.map(|source| IngestOptions {
                source,
                storage_options: ctx.given.clone(),
                lease_wait: a.wait_for_lease,
                show_progress: !ctx.quiet && !a.output.json,
                ..Default::default()
            }),
            git: a.repo.mirrors().map(|mirrors| crate::jobs::GitOptions {
                scope: crate::git::Scope {
                    mirrors,
                    repos,
                    shard: a.scope.shard(),
                    force: a.force,
                    threads: default_jobs(),
                    show_progress: !ctx.quiet && !a.output.json,
                },
                max_blob_bytes: a.max_blob_bytes,
                discover_prs,
            }),
            all: a.all,
            curation,
            lease_wait: a.wait_for_lease,
            show_progress: !ctx.quiet && !a.output.json,
            engine,
        };
        let mut report = crate::jobs::run_report(&lake, &registry, &wanted, &opts).await?;
        if a.output.json {
            println!("{}", run_json(&lake, &report));
        } else {
            for s in &report.jobs {
                print!("{}", s.render());
            }
        }
        match report.failure.take() {
            None => Ok(ExitCode::SUCCESS),
            Some(e) if a.output.json => {
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
