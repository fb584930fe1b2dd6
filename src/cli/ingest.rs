//! `swelake ingest`: GH Archive hour files into `events`; with `--github`, the same events
//! read from GitHub's REST API for the repositories of a repos file.

use std::process::ExitCode;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};

use super::args::{LakeArg, OutputArg};
use super::{default_jobs, parse_duration, Ctx};
use crate::ingest::source::Hour;
use crate::ingest::IngestOptions;
use crate::lake::Codec;

#[derive(Args, Debug)]
#[command(after_help = "Examples:
  swelake ingest --source data-samples/gharchive --lake lake
  swelake ingest --source https://data.gharchive.org --from 2025-01-01-0 --to 2025-01-01-23 --lake lake
  GITHUB_TOKEN=… swelake ingest --github --repos-file repos.txt --lake lake --since 2025-10-01T00:00:00Z

With --github, each repository's pull requests, issues, comments and review comments (with --reviews
also each changed PR's reviews) are read from GitHub's REST API
(GitHub Enterprise Server: --api-url https://HOST/api/v3) and written as events of GH Archive's shape
(events.source = 'github_api'); a rerun asks only for what changed (github_api_repos).")]
pub(crate) struct IngestArgs {
    /// Hour files: a directory, a file, a glob, or a URL prefix (s3://, gs://, az://, http(s)://).
    #[arg(long, required_unless_present = "github", conflicts_with = "github")]
    source: Option<String>,
    /// Read the repositories of --repos-file through GitHub's REST API instead of hour files.
    #[arg(long, requires = "repos_file")]
    github: bool,
    /// With --github: one owner/name per line (# comments).
    #[arg(long, value_name = "FILE")]
    repos_file: Option<std::path::PathBuf>,
    /// With --github: the API's base URL (GitHub Enterprise Server: https://HOST/api/v3).
    #[arg(long, default_value = "https://api.github.com")]
    api_url: String,
    /// With --github: the environment variable holding the token (never logged or stored).
    #[arg(long, default_value = "GITHUB_TOKEN", value_name = "NAME")]
    token_env: String,
    /// With --github: read objects updated at or after this time (RFC 3339 or YYYY-MM-DD) for a
    /// repository read for the first time; later runs go on from the watermark.
    #[arg(long)]
    since: Option<String>,
    /// With --github: leave out events after this time (RFC 3339 or YYYY-MM-DD).
    #[arg(long)]
    until: Option<String>,
    /// With --github: the most HTTP calls this run makes (a rerun goes on where it stopped).
    #[arg(long, default_value_t = 4000)]
    max_calls: u64,
    /// With --github: also read each changed PR's reviews (one call per PR; review comments are
    /// read anyway, a call per 100 for the whole repository).
    #[arg(long, requires = "github")]
    reviews: bool,
    #[command(flatten)]
    lake: LakeArg,
    /// First hour to ingest, YYYY-MM-DD-H (inclusive).
    #[arg(long, value_parser = parse_hour)]
    from: Option<Hour>,
    /// Last hour to ingest, YYYY-MM-DD-H (inclusive).
    #[arg(long, value_parser = parse_hour)]
    to: Option<Hour>,
    #[command(flatten)]
    output: OutputArg,
    /// Re-ingest files that were already ingested.
    #[arg(long)]
    force: bool,
    /// Reject lines longer than this many bytes.
    #[arg(long, default_value_t = 8 << 20)]
    max_line_bytes: usize,
    /// Files ingested in parallel (each uses one core).
    #[arg(long, default_value_t = default_jobs())]
    jobs: usize,
    /// Parquet codec of the event files.
    #[arg(long, value_enum, default_value_t = CodecArg::Zstd)]
    compression: CodecArg,
    /// When another run is ingesting some of these hours, wait up to this long (30s, 10m, 2h)
    /// instead of exiting with status 75.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    wait_for_lease: Option<std::time::Duration>,
}

impl IngestArgs {
    pub(crate) async fn run(self, ctx: &Ctx) -> Result<ExitCode> {
        let a = self;
        if a.github {
            return a.run_github(ctx).await;
        }
        if let (Some(f), Some(t)) = (a.from, a.to) {
            if f > t {
                bail!("--from {} is after --to {}", f.key(), t.key());
            }
        }
        let lake = a.lake.open(ctx)?;
        crate::memory::keep_freed_memory();
        let opts = IngestOptions {
            source: a.source.unwrap_or_default(),
            from: a.from,
            to: a.to,
            force: a.force,
            max_line_bytes: a.max_line_bytes,
            jobs: a.jobs,
            compression: a.compression.into(),
            storage_options: ctx.given.clone(),
            lease_wait: a.wait_for_lease,
            show_progress: !ctx.quiet,
            ..Default::default()
        };
        let summary = crate::ingest::run(&lake, &opts).await?;
        if a.output.json {
            println!("{}", serde_json::to_string_pretty(&summary)?);
        } else {
            print!("{}", summary.render_text());
        }
        Ok(if summary.ok() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
    }
}

impl IngestArgs {
    async fn run_github(self, ctx: &Ctx) -> Result<ExitCode> {
        let file = self.repos_file.as_ref().expect("clap requires --repos-file with --github");
        let text = std::fs::read_to_string(file).map_err(|e| anyhow::anyhow!("reading {}: {e}", file.display()))?;
        let mut repos = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let l = line.split('#').next().unwrap_or("").trim();
            if l.is_empty() {
                continue;
            }
            let ok = l.split('/').count() == 2 && l.split('/').all(|p| !p.is_empty());
            if !ok {
                bail!("{}:{}: `{l}` is not owner/name", file.display(), i + 1);
            }
            repos.push(l.to_string());
        }
        let lake = self.lake.open(ctx)?;
        let opts = crate::ingest::github::GithubOptions {
            repos,
            api_url: self.api_url,
            token_env: self.token_env,
            since: self.since.as_deref().map(rfc3339).transpose()?,
            until: self.until.as_deref().map(rfc3339).transpose()?,
            max_calls: self.max_calls,
            reviews: self.reviews,
            show_progress: !ctx.quiet,
        };
        let summary = crate::ingest::github::run(&lake, &opts).await?;
        if self.output.json {
            println!("{}", serde_json::to_string_pretty(&summary)?);
        } else {
            print!("{}", summary.render_text());
        }
        let failed = summary.repos.iter().any(|r| r.status == "failed");
        Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
    }
}

/// A time as GitHub writes it (`2025-10-01T00:00:00Z`), from RFC 3339 or a date.
fn rfc3339(s: &str) -> Result<String> {
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&chrono::Utc).to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
    }
    if let Ok(d) = chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        return Ok(format!("{d}T00:00:00Z"));
    }
    bail!("`{s}` is not a time (2025-10-01T00:00:00Z) or a date (2025-10-01)")
}

/// Parquet codec of the files a job writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum CodecArg {
    /// zstd level 1: small files, fast enough for most lakes (default).
    Zstd,
    /// LZ4 (raw): faster to write, ~1.5x larger files.
    Lz4,
    /// Snappy: the most widely readable.
    Snappy,
    /// Uncompressed.
    None,
}

impl From<CodecArg> for Codec {
    fn from(c: CodecArg) -> Codec {
        match c {
            CodecArg::Zstd => Codec::Zstd,
            CodecArg::Lz4 => Codec::Lz4,
            CodecArg::Snappy => Codec::Snappy,
            CodecArg::None => Codec::None,
        }
    }
}

fn parse_hour(s: &str) -> std::result::Result<Hour, String> {
    Hour::parse(s).ok_or_else(|| format!("{s:?} is not an hour of the form YYYY-MM-DD-H (e.g. 2025-01-01-15)"))
}
