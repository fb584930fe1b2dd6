//! The flags of `swelake bench …`, parsed into the benchmarks' plain option structs.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};

use super::args::{ConfigArg, LakeArg, RepoArgs};
use super::default_jobs;

#[derive(Subcommand, Debug)]
pub(crate) enum BenchCommand {
    /// Ingest throughput on one core vs plain gunzip and (if installed) DuckDB.
    Ingest(IngestBenchArgs),
    /// Reward throughput vs python3's difflib on the same cases.
    Reward(RewardBenchArgs),
    /// Ingest of generated hours into a local lake vs an S3-compatible store (moto on
    /// loopback), with --jobs 1 vs --jobs 2.
    Lake(LakeBenchArgs),
    /// Blob extraction (the snapshot job's reads) vs `git cat-file --batch`.
    Blobs(BlobsBenchArgs),
    /// GRPO train-step tokens/s (tiny and SmolLM2-135M shapes) vs the same step in PyTorch.
    Train(TrainBenchArgs),
    /// Rollout ⋈ seed join and group statistics: polars lazy scan vs the parquet crate's reader.
    Rollouts(RolloutsBenchArgs),
    /// Relevance per PR before re-ranking vs now (PRs/s, chunks/s, cache hit rate, recall on
    /// the same PRs), and Python onnxruntime encoding the same chunks (when python3 has it).
    Relevance(RelevanceBenchArgs),
    /// A generated day of GH Archive through ingest and the SQL jobs: events/s, rows/s and
    /// peak RSS per step on the local engine, the same jobs on Ballista with 1 and 2
    /// executors on loopback, and DuckDB on the PR jobs over the same files.
    Jobs(JobsBenchArgs),
    /// Days of generated GH Archive through `run --all`, one day at a time into one growing
    /// lake (generate, run, delete the day's input): seconds and peak RSS per day, the last
    /// day's next to the first's.
    Backfill(BackfillBenchArgs),
    /// Each stage's unit cost on this machine (ingest events/s, the SQL jobs per million
    /// events, snapshots PRs/s, relevance from a cold lake and seed per kept PR) multiplied by
    /// SWE-RL's counts: machine-hours per stage and the wall time on N machines.
    Project(ProjectBenchArgs),
    /// The verify stage on a copy of a real history's lake: seconds per instance with every
    /// environment built, then with every environment reused; the share reused, the cores
    /// used, the verdicts by status.
    Verify(VerifyBenchArgs),
}

impl BenchCommand {
    pub(crate) async fn run(self) -> Result<ExitCode> {
        match self {
            BenchCommand::Ingest(a) => crate::bench::ingest(&a.into_options()).await?,
            BenchCommand::Reward(a) if a.execute => {
                let opts = crate::bench::GradeBenchOptions {
                    lake: a.grade.lake.clone().context("--execute needs --lake")?,
                    mirrors: crate::git::Mirrors::new(a.grade.repo.required_url()?, a.grade.repo.cache_dir()),
                    cfg: a.grade.config.load()?.verify,
                    jobs: a.grade.grade_jobs.unwrap_or(0),
                };
                crate::bench::grade(&opts).await?
            }
            BenchCommand::Reward(a) => crate::bench::reward(&a.into_options())?,
            BenchCommand::Lake(a) => {
                let opts = a.into_options();
                tokio::task::block_in_place(|| crate::bench::lake(&opts))?
            }
            BenchCommand::Blobs(a) => crate::bench::blobs(&a.into_options())?,
            BenchCommand::Train(a) => {
                let opts = a.into_options();
                tokio::task::block_in_place(|| crate::train::bench::run(&opts))?
            }
            BenchCommand::Rollouts(a) => {
                let opts = a.into_options();
                tokio::task::block_in_place(|| crate::train::bench::rollouts(&opts))?
            }
            BenchCommand::Relevance(a) => crate::bench::relevance(&a.into_options(default_jobs())?).await?,
            BenchCommand::Jobs(a) => crate::bench::jobs(&a.into_options()).await?,
            BenchCommand::Project(a) => {
                let opts = a.into_options()?;
                tokio::task::block_in_place(|| crate::bench::project(&opts))?
            }
            BenchCommand::Verify(a) => {
                let opts = a.into_options()?;
                tokio::task::block_in_place(|| crate::bench::verify(&opts))?
            }
            BenchCommand::Backfill(a) => {
                let opts = a.into_options();
                tokio::task::block_in_place(|| crate::bench::backfill(&opts))?
            }
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// Internal: decompress a file and count its lines (the floor of `bench ingest`); with
/// `--zstd-pages`, also compress the text in 1 MiB zstd-1 pages (its lower bound).
#[derive(Args, Debug)]
pub(crate) struct BenchFloorArgs {
    path: PathBuf,
    #[arg(long)]
    zstd_pages: bool,
}

impl BenchFloorArgs {
    pub(crate) fn run(self) -> Result<ExitCode> {
        let (lines, packed) = crate::bench::gunzip_pages(&self.path, self.zstd_pages)?;
        println!("{lines} {packed}");
        Ok(ExitCode::SUCCESS)
    }
}

#[derive(Args, Debug)]
pub(crate) struct TrainBenchArgs {
    /// Sequences per step.
    #[arg(long, default_value_t = 4)]
    batch: usize,
    /// Tokens per sequence (half prompt, half completion).
    #[arg(long, default_value_t = 256)]
    seq_len: usize,
    /// Timed steps (after one warm-up step), at least.
    #[arg(long, default_value_t = 3)]
    steps: usize,
    /// Keep stepping until this many seconds have passed (both sides): the tiny model's step
    /// takes milliseconds, and a few of them are too short to time on a shared machine.
    #[arg(long, default_value_t = 3.0)]
    min_seconds: f64,
    /// Timing windows per side, alternating swelake and PyTorch; the best of each side is
    /// reported (this machine is shared: a window can land in a slow spell of either side).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Model shapes to measure: tiny, smollm2 (random weights of SmolLM2-135M's shape).
    #[arg(long, value_delimiter = ',', default_value = "tiny,smollm2")]
    models: Vec<String>,
    /// Python interpreter for the PyTorch baseline.
    #[arg(long, default_value = "python3")]
    python: String,
}

impl TrainBenchArgs {
    pub(crate) fn into_options(self) -> crate::train::bench::TrainBenchOptions {
        crate::train::bench::TrainBenchOptions {
            batch: self.batch,
            seq_len: self.seq_len,
            steps: self.steps,
            min_seconds: self.min_seconds,
            runs: self.runs,
            models: self.models,
            python: self.python,
        }
    }
}

#[derive(Args, Debug)]
pub(crate) struct RolloutsBenchArgs {
    /// Rollout rows to synthesise.
    #[arg(long, default_value_t = 400_000)]
    rows: usize,
    /// Completions per group.
    #[arg(long, default_value_t = 8)]
    group_size: usize,
    /// Bytes of completion text per rollout (read by neither plan: projection skips it).
    #[arg(long, default_value_t = 1024)]
    completion_bytes: usize,
    /// Timed repetitions of each plan (the best is reported).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Where to write the synthetic files (a temporary directory when omitted).
    #[arg(long)]
    dir: Option<PathBuf>,
}

impl RolloutsBenchArgs {
    pub(crate) fn into_options(self) -> crate::train::bench::RolloutsBenchOptions {
        crate::train::bench::RolloutsBenchOptions {
            rows: self.rows,
            group_size: self.group_size,
            completion_bytes: self.completion_bytes,
            repeat: self.repeat,
            dir: self.dir,
        }
    }
}

#[derive(Args, Debug)]
pub(crate) struct IngestBenchArgs {
    /// Real GH Archive hour files whose events are replicated.
    #[arg(long, num_args = 1.., default_values = ["tests/data/gharchive/2015-01-01-15.json.gz", "tests/data/gharchive/2025-01-01-15.json.gz"])]
    seed: Vec<PathBuf>,
    /// Minimum number of events in the generated hour.
    #[arg(long, default_value_t = 150_000)]
    events: usize,
    /// Minimum size of the generated hour as JSON, in MB.
    #[arg(long, default_value_t = 350)]
    mb: usize,
    /// Working directory (generated hour, lakes, Parquet output).
    #[arg(long, default_value = "target/bench-ingest")]
    work: PathBuf,
    /// Core counts to compare on: each pins both sides (swelake ingest of the one file, DuckDB
    /// with as many threads) to that many CPUs.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    cores: Vec<usize>,
    /// Runs of each side per core count (the medians are compared).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
}

impl IngestBenchArgs {
    pub(crate) fn into_options(self) -> crate::bench::IngestBenchOptions {
        crate::bench::IngestBenchOptions {
            seed: self.seed,
            events: self.events,
            mb: self.mb,
            work: self.work,
            cores: self.cores.into_iter().filter(|c| *c > 0).collect(),
            repeat: self.repeat.max(1),
        }
    }
}

#[derive(Args, Debug)]
pub(crate) struct LakeBenchArgs {
    /// Real GH Archive hour files whose events are replicated.
    #[arg(long, num_args = 1.., default_values = ["tests/data/gharchive/2015-01-01-15.json.gz", "tests/data/gharchive/2025-01-01-15.json.gz"])]
    seed: Vec<PathBuf>,
    /// Hours generated and ingested.
    #[arg(long, default_value_t = 4)]
    hours: usize,
    /// Events per generated hour.
    #[arg(long, default_value_t = 60_000)]
    events: usize,
    /// An S3-compatible endpoint (default: a moto_server started on loopback, if installed).
    #[arg(long)]
    s3_endpoint: Option<String>,
    /// Working directory.
    #[arg(long, default_value = "target/bench-lake")]
    work: PathBuf,
}

impl LakeBenchArgs {
    pub(crate) fn into_options(self) -> crate::bench::LakeBenchOptions {
        crate::bench::LakeBenchOptions {
            seed: self.seed,
            hours: self.hours,
            events: self.events,
            s3_endpoint: self.s3_endpoint,
            work: self.work,
        }
    }
}

#[derive(Args, Debug)]
pub(crate) struct BlobsBenchArgs {
    /// A bare or normal git repository to read every blob of. Without it, one is made from
    /// the source files under --corpus.
    #[arg(long)]
    repo: Option<PathBuf>,
    /// Directory of real files committed into the benchmark repository (default: the
    /// datafusion sources in the cargo registry, else this project's src/).
    #[arg(long)]
    corpus: Option<PathBuf>,
    /// Working directory.
    #[arg(long, default_value = "target/bench-blobs")]
    work: PathBuf,
}

impl BlobsBenchArgs {
    pub(crate) fn into_options(self) -> crate::bench::BlobsBenchOptions {
        crate::bench::BlobsBenchOptions { repo: self.repo, corpus: self.corpus, work: self.work }
    }
}

#[derive(Args, Debug)]
pub(crate) struct RewardBenchArgs {
    /// Reward cases (JSONL, optionally gzipped).
    #[arg(long, default_value = "tests/data/parity/reward_cases.jsonl.gz")]
    cases: PathBuf,
    /// Copies of the cases scored by swelake per timing (Python runs them once).
    #[arg(long, default_value_t = 20)]
    repeat: usize,
    /// Timings of each side; the best is reported (this machine is shared and noisy, and the
    /// best run is the one least disturbed, for Python and swelake alike).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Working directory.
    #[arg(long, default_value = "target/bench-reward")]
    work: PathBuf,
    /// Time the test reward instead: gradings per second on a lake's verified instances, cold
    /// and warm, a GRPO group of 8 and a batch of 64 over 16 instances (--lake, --repo-url).
    #[arg(long, requires = "lake")]
    execute: bool,
    #[command(flatten)]
    grade: super::args::GradeArgs,
}

impl RewardBenchArgs {
    pub(crate) fn into_options(self) -> crate::bench::RewardBenchOptions {
        crate::bench::RewardBenchOptions { cases: self.cases, repeat: self.repeat, runs: self.runs, work: self.work }
    }
}

#[derive(Args, Debug)]
pub(crate) struct RelevanceBenchArgs {
    /// A lake with kept, snapshotted PRs (after `swelake run filters`).
    #[command(flatten)]
    lake: LakeArg,
    /// Repository of the lake to rank the PRs of.
    #[arg(long)]
    repo_name: String,
    #[command(flatten)]
    repo: RepoArgs,
    /// Kept PRs to rank, spread over the repository's history.
    #[arg(long, default_value_t = 30)]
    prs: usize,
    /// Encoder threads (both sides, and Python's) [default: the CPUs].
    #[arg(long)]
    threads: Option<usize>,
    #[command(flatten)]
    config: ConfigArg,
    /// Also rank, on both sides, every leave-one-out case of the repository's merged PRs in
    /// the lake (as eval-relevance does; the kept PRs give a few dozen cases).
    #[arg(long)]
    every_case: bool,
    /// Working directory (the Python baseline's script and token ids).
    #[arg(long, default_value = "target/bench-relevance")]
    work: PathBuf,
}

impl RelevanceBenchArgs {
    pub(crate) fn into_options(self, default_threads: usize) -> Result<crate::bench::RelevanceBenchOptions> {
        Ok(crate::bench::RelevanceBenchOptions {
            lake: self.lake.location()?.to_string(),
            repo_name: self.repo_name,
            repo_url: self.repo.required_url()?,
            cache_dir: self.repo.cache_dir(),
            prs: self.prs.max(1),
            threads: self.threads.unwrap_or(default_threads).max(1),
            config: self.config.path().map(Path::to_path_buf),
            every_case: self.every_case,
            work: self.work,
        })
    }
}

#[derive(Args, Debug)]
pub(crate) struct JobsBenchArgs {
    /// Hours of GH Archive to generate.
    #[arg(long, default_value_t = 24)]
    hours: usize,
    /// Copies of every source event per hour (repositories renamed per copy).
    #[arg(long, default_value_t = 80)]
    copies: usize,
    /// Real hour files to copy [default: ../shared/gharchive, else tests/data/gharchive].
    #[arg(long)]
    sources: Option<PathBuf>,
    /// The first generated hour.
    #[arg(long, default_value = "2025-03-01-0")]
    first_hour: String,
    /// Working directory (hours, lakes, executors' shuffle files); emptied first.
    #[arg(long, default_value = "target/bench-jobs")]
    work: PathBuf,
    /// Skip the Ballista runs (1 and 2 executors on loopback).
    #[arg(long)]
    no_ballista: bool,
    /// Python interpreter for the DuckDB baseline (skipped when it has no duckdb).
    #[arg(long, default_value = "python3")]
    python: String,
    /// Runs of pr_timeline and pull_requests on each side of the DuckDB comparison, and of
    /// the four jobs on each Ballista cluster size (the medians count).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Pin every step, ours and DuckDB's (with as many threads), to this many CPUs [default:
    /// not pinned, all of them].
    #[arg(long)]
    cores: Option<usize>,
}

impl JobsBenchArgs {
    pub(crate) fn into_options(self) -> crate::bench::JobsBenchOptions {
        crate::bench::JobsBenchOptions {
            hours: self.hours.max(1),
            copies: self.copies.max(1),
            sources: self.sources,
            first_hour: self.first_hour,
            work: self.work,
            ballista: !self.no_ballista,
            python: self.python,
            repeat: self.repeat.max(1),
            cores: self.cores.filter(|c| *c > 0),
        }
    }
}

#[derive(Args, Debug)]
#[command(after_help = "Example (a lake of pallets/jinja after `swelake run filters`):\n  \
    swelake bench project --lake lake --repo-url '/srv/git/{repo}.git' --machines 32\n\n\
    The defaults are SWE-RL's corpus: GH Archive 2015-01 to 2025-05 (3,800 days), ~11M merged PRs, \
    ~500k kept PRs. Events per day is an assumption (2015 days hold ~0.5M, 2024 days ~5M): set \
    --events-per-day to your range's.")]
pub(crate) struct ProjectBenchArgs {
    /// A local lake of a real history after `swelake run filters` (kept, snapshotted PRs).
    #[command(flatten)]
    lake: LakeArg,
    #[command(flatten)]
    repo: RepoArgs,
    /// Hours of GH Archive to generate for ingest and the SQL jobs.
    #[arg(long, default_value_t = 24)]
    hours: usize,
    /// Copies of every source event per generated hour.
    #[arg(long, default_value_t = 8)]
    copies: usize,
    /// Real hour files to copy [default: ../shared/gharchive, else tests/data/gharchive].
    #[arg(long)]
    sources: Option<PathBuf>,
    /// Machines the work is spread over.
    #[arg(long, default_value_t = 32)]
    machines: usize,
    /// Days of GH Archive at scale.
    #[arg(long, default_value_t = 3800.0)]
    days: f64,
    /// Events per day at scale (the range's average).
    #[arg(long, default_value_t = 2_000_000.0)]
    events_per_day: f64,
    /// Merged PRs at scale (snapshots).
    #[arg(long, default_value_t = 11_000_000.0)]
    merged_prs: f64,
    /// Kept PRs at scale (relevance, seed).
    #[arg(long, default_value_t = 500_000.0)]
    kept_prs: f64,
    /// Working directory; emptied first.
    #[arg(long, default_value = "target/bench-project")]
    work: PathBuf,
    /// Kept PRs to measure the verify stage on (it runs their tests in a sandbox; 0 leaves it out).
    #[arg(long, default_value_t = 20)]
    verify_prs: usize,
}

#[derive(Args, Debug)]
#[command(after_help = "\
Example, on the jinja history (after `swelake run filters` on a lake of it):
  swelake bench verify --lake lake-jinja --repo-url 'file:///srv/mirrors/{repo}.git' --max-prs 40")]
pub(crate) struct VerifyBenchArgs {
    /// A local lake of a real history after `swelake run filters` (kept, snapshotted PRs).
    #[command(flatten)]
    lake: LakeArg,
    #[command(flatten)]
    repo: RepoArgs,
    /// PRs to verify, the first in (repository, number) order (0: every kept PR).
    #[arg(long, default_value_t = 0)]
    max_prs: usize,
    /// Runs of each side.
    #[arg(long, default_value_t = 3)]
    repeat: u32,
    /// Working directory (the lake's copy, environments, trees); emptied first.
    #[arg(long, default_value = "target/bench-verify")]
    work: PathBuf,
    /// Also run with N PRs at once (a cache of their own) and compare with one at a time:
    /// time, cores used, and whether pr_verification is identical.
    #[arg(long, default_value_t = 1, value_name = "N")]
    jobs: usize,
}

impl VerifyBenchArgs {
    pub(crate) fn into_options(self) -> Result<crate::bench::VerifyBenchOptions> {
        let lake = self.lake.location()?;
        if lake.contains("://") && !lake.starts_with("file://") {
            anyhow::bail!("bench verify reads a local lake; {lake} is a store URL");
        }
        Ok(crate::bench::VerifyBenchOptions {
            lake: PathBuf::from(lake.strip_prefix("file://").unwrap_or(lake)),
            repo_url: self.repo.required_url()?,
            cache_dir: self.repo.cache_dir(),
            max_prs: self.max_prs,
            repeat: self.repeat,
            work: self.work,
            jobs: self.jobs,
        })
    }
}

impl ProjectBenchArgs {
    pub(crate) fn into_options(self) -> Result<crate::bench::ProjectBenchOptions> {
        let lake = self.lake.location()?;
        if lake.contains("://") && !lake.starts_with("file://") {
            anyhow::bail!("bench project reads a local lake; {lake} is a store URL");
        }
        Ok(crate::bench::ProjectBenchOptions {
            lake: PathBuf::from(lake.strip_prefix("file://").unwrap_or(lake)),
            repo_url: self.repo.required_url()?,
            cache_dir: self.repo.cache_dir(),
            hours: self.hours.max(1),
            copies: self.copies.max(1),
            sources: self.sources,
            machines: self.machines.max(1),
            scale: crate::bench::Scale {
                days: self.days,
                events_per_day: self.events_per_day,
                merged_prs: self.merged_prs,
                kept_prs: self.kept_prs,
            },
            work: self.work,
            verify_prs: self.verify_prs,
        })
    }
}

#[derive(Args, Debug)]
pub(crate) struct BackfillBenchArgs {
    /// Days to generate and run, one at a time, into one lake.
    #[arg(long, default_value_t = 30)]
    days: usize,
    /// Copies of every source event per hour (53 copies of the two real excerpts: 3.9M events
    /// a day).
    #[arg(long, default_value_t = 53)]
    copies: usize,
    /// Hours per day.
    #[arg(long, default_value_t = 24)]
    hours_per_day: usize,
    /// Real hour files to copy [default: ../shared/gharchive, else tests/data/gharchive].
    #[arg(long)]
    sources: Option<PathBuf>,
    /// The first day generated.
    #[arg(long, default_value = "2025-03-01")]
    first_day: chrono::NaiveDate,
    /// Working directory (the day's hour files and the lake); emptied first.
    #[arg(long, default_value = "target/bench-backfill")]
    work: PathBuf,
    /// Keep the lake at the end (30 days of 3.9M events take ~33 GB).
    #[arg(long)]
    keep_lake: bool,
}

impl BackfillBenchArgs {
    pub(crate) fn into_options(self) -> crate::bench::BackfillBenchOptions {
        crate::bench::BackfillBenchOptions {
            days: self.days.max(1),
            copies: self.copies.max(1),
            hours_per_day: self.hours_per_day.clamp(1, 24),
            sources: self.sources,
            first_day: self.first_day,
            work: self.work,
            keep_lake: self.keep_lake,
        }
    }
}
