//! The command line. Flags are parsed here into the library's plain option structs; nothing
//! else in the crate sees clap. Every subcommand is a thin call into a library function that
//! tests call too.

mod bench;
mod train;

use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::ingest::source::Hour;
use crate::ingest::IngestOptions;
use crate::lake::{Codec, Lake};

const AFTER_HELP: &str = "\
Typical use:
  swelake demo                                   # the whole pipeline on data-samples/, offline
  swelake ingest --source ~/gharchive --lake lake --from 2025-01-01-0 --to 2025-01-01-23
  swelake sql --lake lake \"SELECT type, count(*) FROM events GROUP BY type\"
  swelake reward --input cases.jsonl --output scored.jsonl

Logs go to stderr (RUST_LOG=debug for more); results go to stdout.";

#[derive(Parser, Debug)]
#[command(
    name = "swelake",
    version,
    about = "Turn GH Archive events and git history into SWE-RL training data, as Delta tables.",
    after_help = AFTER_HELP
)]
struct Cli {
    /// Only print errors (no progress bars, no info logs).
    #[arg(short, long, global = true)]
    quiet: bool,
    /// More log output (-v debug, -vv trace).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    /// An object-store option for lakes and sources on s3://, gs://, az:// (repeatable), over
    /// the AWS_*, GOOGLE_*, AZURE_* environment variables: aws_endpoint=http://127.0.0.1:9000,
    /// aws_allow_http=true, aws_region=eu-west-1, ... Secret values never appear in output.
    #[arg(long = "storage-option", global = true, value_name = "KEY=VALUE", value_parser = parse_key_value)]
    storage_options: Vec<(String, String)>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Load GH Archive hour files into the `events` and `events_rejected` Delta tables.
    #[command(after_help = "\
Every line becomes an `events` row or an `events_rejected` row (with reason and raw text);
the summary reconciles lines_read = events_written + rejected per file. Files already ingested
with the same size are skipped; re-ingesting an hour (--force) replaces its rows atomically.

Examples:
  swelake ingest --source data-samples/gharchive --lake lake
  swelake ingest --source 'archive/2025-01-0*.json.gz' --lake lake --json
  swelake ingest --source https://data.gharchive.org/ --from 2025-01-01-0 --to 2025-01-01-2 --lake lake
  swelake ingest --source s3://bucket/gharchive/ --lake lake   (credentials from AWS_* variables)")]
    Ingest(IngestArgs),
    /// Run jobs (and the jobs they depend on) incrementally: only new or changed input
    /// partitions are processed.
    #[command(after_help = "\
Jobs are declared in jobs/*.toml (inputs, outputs, SQL file, partition key, dependencies) and
run in dependency order. Each records the input partitions it processed, with a fingerprint
of their files, in the _job_runs table; a rerun with nothing new does nothing, and an input
partition that changed (a re-ingested hour) is processed again.

Examples:
  swelake run --all --lake lake                        # bring every table up to date
  swelake run pull_requests --lake lake                # and pr_timeline before it
  swelake run --all --lake lake --source data/gharchive   # ingest new hours first
  swelake run pr_timeline --lake lake --since 2025-01-01 --until 2025-01-31
  swelake run snapshots --lake lake --repo-url 'file:///srv/mirrors/{repo}.git' --repos o/a,o/b
  swelake run --all --lake lake --repos-file repos.txt --repo-url 'https://github.com/{repo}.git'
                                                       # PRs from git alone, no archive
  swelake run --all --lake lake --source data/gharchive --repo-url ... --discover-from-git")]
    Run(RunArgs),
    /// What state a lake is in: per job its watermark, pending partitions and last run; per
    /// table its version, files, bytes, small files, last compaction and checkpoint; leases held.
    #[command(after_help = "\
Examples:
  swelake status --lake lake
  swelake status --lake s3://bucket/lake --json | jq '.jobs[] | select(.last_outcome == \"failed\")'")]
    Status(StatusArgs),
    /// Compact small files (keeping each file's key), write checkpoints, and vacuum.
    #[command(after_help = "\
Compaction merges small files of the same input key (and unkeyed appends such as _job_runs),
so reruns still replace exactly their rows. A checkpoint is written for every table, so a
table with thousands of commits is not replayed from JSON. Vacuum deletes only files that
left the table longer ago than the retention.

Examples:
  swelake maintain --lake lake
  swelake maintain --lake s3://bucket/lake --table events --vacuum-retention 7d")]
    Maintain(MaintainArgs),
    /// Run a read-only SQL query over every table of a lake.
    #[command(after_help = "\
Every Delta table in the lake is registered under its directory name, along with the swelake
SQL functions (swerl_reward, swerl_format_error, ...).

Examples:
  swelake sql --lake lake \"SELECT type, count(*) AS n FROM events GROUP BY type ORDER BY n DESC\"
  swelake sql --lake lake --format json \"SELECT reason, count(*) FROM events_rejected GROUP BY reason\"
  swelake sql --lake lake \"SHOW TABLES\"")]
    Sql(SqlArgs),
    /// Score model answers with the SWE-RL reward (bit-compatible with the reference).
    #[command(after_help = "\
Input lines (JSON):
  {\"id\":..,\"kind\":\"search_replace\",\"context\":{path:text},\"oracle\":{path:new_text},\"output\":\"<think>..</think><solution>..</solution>\"}
  {\"id\":..,\"kind\":\"unidiff\",\"oracle_patches\":[diff,..],\"pred_patches\":[diff,..]}
  {\"id\":..,\"kind\":\"general\",\"context\":{..},\"oracle\":{..},\"pred\":{path:new_text}}
Output lines: {\"id\",\"reward\",\"format_error\",\"similarities\"}; a line that cannot be scored
gets \"reward\": null and an \"error\", the batch continues, and the exit status is 1.

Rollout tables (Parquet, see schemas/rollouts.toml): `--rollouts IN --out OUT` adds reward,
format_error and reward_error columns; context/oracle come from inline columns or, when absent,
from --seed-shards joined on instance_id.

Examples:
  swelake reward --input cases.jsonl --output scored.jsonl --threads 8
  zcat cases.jsonl.gz | swelake reward > scored.jsonl
  swelake reward --rollouts rollouts/part-0.parquet --out scored.parquet --seed-shards 'lake/shards/seed/*.parquet'")]
    Reward(RewardArgs),
    /// Write a dataset card (Markdown + PNG charts) of a lake's seed dataset.
    Report {
        /// Lake: a directory or s3://bucket/prefix, gs://…, az://…, file://…
        #[arg(long)]
        lake: String,
        /// Directory for card.md and the charts.
        #[arg(long)]
        out: PathBuf,
        /// Curation config whose [completeness] section judges the archive's hours.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Measure relevant-file rankers leave-one-out: hide one changed file, rank it among the
    /// repository's files from the change's text and its other changed paths.
    #[command(
        name = "eval-relevance",
        after_help = "\
On a lake (merged, snapshotted PRs of one repository):
  swelake eval-relevance --lake lake --repo-name owner/name --repo-url '/srv/git/{repo}.git'
On any git repository's first-parent history (commits as changes, messages as text):
  swelake eval-relevance --git path/to/repo --max-commits 2000
Prints recall@1/5/10 for BM25 and the hybrid ranker, with and without the changed paths."
    )]
    EvalRelevance(EvalRelevanceArgs),
    /// Train a policy with GRPO on rollouts (Parquet) or online, in Candle.
    Train(train::TrainArgs),
    /// Sample G completions per seed prompt with a policy and write them as rollouts.
    Generate(train::GenerateArgs),
    /// Evaluate a policy (or another engine's rollouts) on held-out seed instances.
    Eval(train::EvalArgs),
    /// Run the whole pipeline on the bundled samples (offline) and summarise what it built.
    Demo(DemoArgs),
    /// Benchmarks that print throughput next to a baseline measured in the same run.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// A Ballista cluster for the SQL jobs: a scheduler and executors that know swelake's SQL
    /// functions. Jobs run on it with `swelake run … --engine ballista --scheduler df://HOST:PORT`.
    #[command(
        subcommand,
        after_help = "\
A cluster is one scheduler and any number of executors, all started from this binary:
  swelake ballista scheduler --bind 0.0.0.0:50050
  swelake ballista executor --scheduler sched-host:50050 --bind 0.0.0.0:50051 --concurrent-tasks 4
  swelake run --all --lake s3://bucket/lake --engine ballista --scheduler df://sched-host:50050

The job's client plans its SQL with its own sql/ files and --config, ships the plan, and
commits the result to the lake; executors read the lake's Parquet files themselves, so they
need the same object-store credentials (AWS_* variables or --storage-option). The git stages
(snapshots, relevance) do not run on the cluster: shard them with --shard I/N instead."
    )]
    Ballista(BallistaCommand),
    /// Regenerate the sample hour files (and optionally the sample git repositories).
    #[command(hide = true)]
    Samples {
        /// Where to write the hour files (data-samples/gharchive to refresh the committed ones).
        #[arg(long)]
        hours: PathBuf,
        /// Where to create the sample repositories (default: a temporary directory).
        #[arg(long)]
        repos: Option<PathBuf>,
    },
    /// Internal: decompress a file and count its lines (the floor of `bench ingest`); with
    /// `--zstd-pages`, also compress the text in 1 MiB zstd-1 pages (its lower bound).
    #[command(hide = true, name = "bench-floor")]
    BenchFloor {
        path: PathBuf,
        #[arg(long)]
        zstd_pages: bool,
    },
}

#[derive(Args, Debug)]
struct IngestArgs {
    /// Hour files: a directory, a file, a glob, or a URL prefix (s3://, gs://, az://, http(s)://).
    #[arg(long)]
    source: String,
    /// Lake: a directory (created if missing) or s3://bucket/prefix, gs://…, az://…, file://…
    #[arg(long)]
    lake: String,
    /// First hour to ingest, YYYY-MM-DD-H (inclusive).
    #[arg(long, value_parser = parse_hour)]
    from: Option<Hour>,
    /// Last hour to ingest, YYYY-MM-DD-H (inclusive).
    #[arg(long, value_parser = parse_hour)]
    to: Option<Hour>,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
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

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum EngineArg {
    Local,
    Ballista,
}

#[derive(Args, Debug)]
struct RunArgs {
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

#[derive(Args, Debug)]
struct StatusArgs {
    /// Lake: a directory or s3://bucket/prefix, gs://…, az://…, file://…
    #[arg(long)]
    lake: String,
    /// Print the status as one JSON object.
    #[arg(long)]
    json: bool,
    /// Read job declarations from this directory (overrides the built-in jobs/).
    #[arg(long)]
    jobs_dir: Option<PathBuf>,
    /// The curation config the jobs run with (what makes filters and seed due).
    #[arg(long)]
    config: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct MaintainArgs {
    /// Lake: a directory or s3://bucket/prefix, gs://…, az://…, file://…
    #[arg(long)]
    lake: String,
    /// Only this table.
    #[arg(long)]
    table: Option<String>,
    /// Also delete files that left the table longer ago than this (at least 1h): 7d, 36h.
    /// Readers of versions younger than it can always finish their scans.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    vacuum_retention: Option<std::time::Duration>,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct EvalRelevanceArgs {
    /// A git repository whose history is the evaluation set.
    #[arg(long, conflicts_with = "lake")]
    git: Option<PathBuf>,
    /// Commits of --git to read (first-parent, oldest first).
    #[arg(long, default_value_t = 2000)]
    max_commits: usize,
    /// A lake whose PRs are the evaluation set (with --repo-name and --repo-url).
    #[arg(long, requires_all = ["repo_name", "repo_url"])]
    lake: Option<String>,
    /// Repository of the lake to evaluate on.
    #[arg(long)]
    repo_name: Option<String>,
    /// Where the lake's repositories are ({repo} = owner/name).
    #[arg(long)]
    repo_url: Option<String>,
    /// Mirror cache [default: ~/.cache/swelake/mirrors].
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Curation config (ranker weights).
    #[arg(long)]
    config: Option<PathBuf>,
    /// BM25 only (no ONNX model needed).
    #[arg(long)]
    bm25_only: bool,
    /// Write every case's scaled features (learned rankers, JSON lines: variant, change,
    /// target, reranked, x) to this file, to fit or inspect rankers outside swelake.
    #[arg(long, value_name = "FILE")]
    features_out: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct SqlArgs {
    /// Lake: a directory or s3://bucket/prefix, gs://…, az://…, file://…
    #[arg(long)]
    lake: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t = FormatArg::Table)]
    format: FormatArg,
    /// Run the query on a Ballista cluster (`swelake ballista …`) instead of here.
    #[arg(long, value_name = "df://HOST:PORT")]
    scheduler: Option<String>,
    /// The query (SELECT/WITH/SHOW/DESCRIBE/EXPLAIN).
    query: String,
}

#[derive(Args, Debug)]
struct RewardArgs {
    /// JSONL cases (default: stdin; `.gz` is decompressed).
    #[arg(long)]
    input: Option<PathBuf>,
    /// Where to write scored lines (default: stdout).
    #[arg(long)]
    output: Option<PathBuf>,
    /// Worker threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Score a rollout Parquet file instead of JSONL cases (schema: schemas/rollouts.toml).
    #[arg(long, conflicts_with_all = ["input", "output"], requires = "out")]
    rollouts: Option<PathBuf>,
    /// Where to write the scored rollouts (the input columns plus reward, format_error, reward_error).
    #[arg(long, requires = "rollouts")]
    out: Option<PathBuf>,
    /// Seed shards (glob) to look up context/oracle by instance_id when rollouts do not carry them.
    #[arg(long, requires = "rollouts")]
    seed_shards: Option<String>,
}

#[derive(Args, Debug)]
struct DemoArgs {
    /// Lake directory for the demo (replaced if it holds an earlier demo).
    #[arg(long, default_value = "demo-lake")]
    lake: PathBuf,
    /// Directory with the sample inputs.
    #[arg(long, default_value = "data-samples")]
    samples: PathBuf,
}

#[derive(Subcommand, Debug)]
enum BallistaCommand {
    /// Run a scheduler until killed.
    Scheduler {
        /// Address to listen on for clients and executors.
        #[arg(long, default_value = "127.0.0.1:50050", value_name = "HOST:PORT")]
        bind: String,
    },
    /// Run an executor until killed: it registers with the scheduler and runs tasks.
    Executor {
        /// The scheduler's address.
        #[arg(long, value_name = "HOST:PORT")]
        scheduler: String,
        /// Address of this executor's data (Arrow Flight) port.
        #[arg(long, default_value = "127.0.0.1:50051", value_name = "HOST:PORT")]
        bind: String,
        /// Its gRPC port [default: the data port + 1].
        #[arg(long, value_name = "P")]
        grpc_port: Option<u16>,
        /// Tasks it runs at once [default: the number of cores].
        #[arg(long, value_name = "N")]
        concurrent_tasks: Option<usize>,
        /// Where it keeps shuffle files [default: a temporary directory].
        #[arg(long, value_name = "D")]
        work_dir: Option<PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Ingest throughput on one core vs plain gunzip and (if installed) DuckDB.
    Ingest(bench::IngestBenchArgs),
    /// Reward throughput vs python3's difflib on the same cases.
    Reward(bench::RewardBenchArgs),
    /// Ingest of generated hours into a local lake vs an S3-compatible store (moto on
    /// loopback), with --jobs 1 vs --jobs 2.
    Lake(bench::LakeBenchArgs),
    /// Blob extraction (the snapshot job's reads) vs `git cat-file --batch`.
    Blobs(bench::BlobsBenchArgs),
    /// GRPO train-step tokens/s (tiny and SmolLM2-135M shapes) vs the same step in PyTorch.
    Train(bench::TrainBenchArgs),
    /// Rollout ⋈ seed join and group statistics: polars lazy scan vs the parquet crate's reader.
    Rollouts(bench::RolloutsBenchArgs),
    /// Relevance per PR before re-ranking vs now (PRs/s, chunks/s, cache hit rate, recall on
    /// the same PRs), and Python onnxruntime encoding the same chunks (when python3 has it).
    Relevance(bench::RelevanceBenchArgs),
    /// A generated day of GH Archive through ingest and the SQL jobs: events/s, rows/s and
    /// peak RSS per step on the local engine, the same jobs on Ballista with 1 and 2
    /// executors on loopback, and DuckDB on the PR jobs over the same files.
    Jobs(bench::JobsBenchArgs),
    /// Days of generated GH Archive through `run --all`, one day at a time into one growing
    /// lake (generate, run, delete the day's input): seconds and peak RSS per day, the last
    /// day's next to the first's.
    Backfill(bench::BackfillBenchArgs),
}

/// Parquet codec of the files a job writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum CodecArg {
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

/// How `swelake sql` prints its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum FormatArg {
    /// Aligned text table.
    Table,
    /// CSV with a header row.
    Csv,
    /// One JSON array of row objects (every column a key, null when NULL).
    Json,
    /// One JSON object per line (every column a key, null when NULL).
    Jsonl,
}

impl From<FormatArg> for crate::sql::Format {
    fn from(f: FormatArg) -> crate::sql::Format {
        use crate::sql::Format;
        match f {
            FormatArg::Table => Format::Table,
            FormatArg::Csv => Format::Csv,
            FormatArg::Json => Format::Json,
            FormatArg::Jsonl => Format::Jsonl,
        }
    }
}

fn default_jobs() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
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

fn parse_key_value(s: &str) -> std::result::Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{:?} is not KEY=VALUE", crate::lake::store::redact(s))),
    }
}

/// `30s`, `10m`, `36h`, `7d` (a bare number is seconds).
fn parse_duration(s: &str) -> std::result::Result<std::time::Duration, String> {
    let t = s.trim();
    let (num, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let n: u64 = num.parse().map_err(|_| format!("{s:?} is not a duration like 30s, 10m, 36h or 7d"))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86400,
        _ => return Err(format!("{s:?}: the unit must be s, m, h or d")),
    };
    Ok(std::time::Duration::from_secs(secs))
}

fn parse_hour(s: &str) -> std::result::Result<Hour, String> {
    Hour::parse(s).ok_or_else(|| format!("{s:?} is not an hour of the form YYYY-MM-DD-H (e.g. 2025-01-01-15)"))
}

fn init_logging(quiet: bool, verbose: u8) {
    let default = match (quiet, verbose) {
        // Lost commit races are retried here: deltalake's error about them is not the user's.
        (true, _) => "error,deltalake_core::kernel::transaction=off",
        // deltalake's MERGE warns about metrics it derives itself, and its commit loop about
        // races this crate retries itself: neither is the user's concern.
        (false, 0) => {
            "warn,swelake=info,deltalake_core::operations::merge=error,deltalake_core::kernel::transaction=off"
        }
        (false, 1) => "info,swelake=debug",
        _ => "debug,swelake=trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| default.into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| Redacting(std::io::stderr()))
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}

/// stderr with every known secret blanked: a library's debug log may print a request or an
/// option map.
struct Redacting<W: Write>(W);

impl<W: Write> Write for Redacting<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        self.0.write_all(crate::lake::store::redact(&text).as_bytes())?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// The exit status of a run that found its inputs held by another run (EX_TEMPFAIL).
const EXIT_BUSY: u8 = 75;

/// Entry point of the binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // The trainer's commands keep glibc's default arenas (their figures were measured with
    // them); every other command builds and frees Arrow batches on many threads.
    if !matches!(
        cli.command,
        Command::Train(_) | Command::Generate(_) | Command::Eval(_) | Command::Bench(BenchCommand::Train(_))
    ) {
        crate::memory::cap_arenas();
    }
    // Known before anything logs: secrets of the environment and of --storage-option.
    let _ = crate::lake::store::options(&cli.storage_options);
    init_logging(cli.quiet, cli.verbose);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            if let Some(busy) = e.downcast_ref::<crate::lake::lease::Busy>() {
                eprintln!("busy: {}", crate::lake::store::redact(&busy.to_string()));
                return ExitCode::from(EXIT_BUSY);
            }
            eprintln!("error: {}", crate::lake::store::redact(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}

/// Copies of store-held shards or rollouts, for readers that take local globs; the directory
/// lives as long as the value.
async fn local_glob(
    pattern: Option<String>,
    given: &[(String, String)],
    keep: &mut Vec<tempfile::TempDir>,
) -> Result<Option<String>> {
    let Some(p) = pattern else { return Ok(None) };
    if !p.contains("://") {
        return Ok(Some(p));
    }
    let dir = tempfile::Builder::new().prefix("swelake-fetch-").tempdir()?;
    let local = crate::lake::store::fetch_glob(&p, given, dir.path()).await?;
    keep.push(dir);
    Ok(Some(local))
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

async fn run(cli: Cli) -> Result<ExitCode> {
    let quiet = cli.quiet;
    let given = cli.storage_options.clone();
    let open = |location: &str| Lake::open_with(location, &given);
    match cli.command {
        Command::Ingest(a) => {
            if let (Some(f), Some(t)) = (a.from, a.to) {
                if f > t {
                    bail!("--from {} is after --to {}", f.key(), t.key());
                }
            }
            let lake = open(&a.lake)?;
            crate::memory::keep_freed_memory();
            let opts = IngestOptions {
                source: a.source,
                from: a.from,
                to: a.to,
                force: a.force,
                max_line_bytes: a.max_line_bytes,
                jobs: a.jobs,
                compression: a.compression.into(),
                storage_options: given.clone(),
                lease_wait: a.wait_for_lease,
                show_progress: !quiet,
                ..Default::default()
            };
            let summary = crate::ingest::run(&lake, &opts).await?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&summary)?);
            } else {
                print!("{}", summary.render_text());
            }
            Ok(if summary.ok() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        Command::Run(a) => {
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
            let lake = open(a.lake.as_deref().expect("clap requires --lake"))?;
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
                    storage_options: given.clone(),
                    lease_wait: a.wait_for_lease,
                    show_progress: !quiet && !a.json,
                    ..Default::default()
                }),
                git: a.repo_url.map(|url| crate::jobs::GitOptions {
                    mirrors: crate::git::Mirrors::new(url, a.cache_dir.unwrap_or_else(crate::git::default_cache_dir)),
                    repos: (!repos.is_empty()).then_some(repos),
                    max_blob_bytes: a.max_blob_bytes,
                    force: a.force,
                    threads: default_jobs(),
                    discover_prs,
                    shard: a.shard,
                }),
                all: a.all,
                curation,
                lease_wait: a.wait_for_lease,
                show_progress: !quiet && !a.json,
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
        Command::Status(a) => {
            let lake = open(&a.lake)?;
            let registry = crate::jobs::Registry::load(a.jobs_dir.as_deref(), None)?;
            let opts = crate::jobs::RunOptions {
                curation: crate::jobs::CurationConfig::load(a.config.as_deref())?,
                ..Default::default()
            };
            let status = crate::jobs::status::status(&lake, &registry, &opts).await?;
            if a.json {
                println!("{}", serde_json::to_string(&status)?);
            } else {
                print!("{}", status.render());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Maintain(a) => {
            let lake = open(&a.lake)?;
            let opts = crate::lake::maintain::MaintainOptions {
                table: a.table,
                vacuum_retention: a.vacuum_retention,
                ..Default::default()
            };
            let done = lake.maintain(&opts).await?;
            if a.json {
                println!("{}", serde_json::to_string(&done)?);
            } else {
                for m in &done {
                    println!(
                        "{:<20} files {:>5} -> {:<5} (compacted {}, skipped groups {}), checkpoint at v{}, vacuumed {}",
                        m.table,
                        m.files_before,
                        m.files_after,
                        m.files_compacted,
                        m.groups_skipped,
                        m.checkpoint_version.unwrap_or(m.version),
                        m.files_vacuumed
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Sql(a) => {
            let lake = open(&a.lake)?;
            let batches = match &a.scheduler {
                None => crate::sql::query(&lake, &a.query).await?,
                Some(s) => {
                    crate::sql::query_on_cluster(&lake, &crate::distributed::scheduler_url(s)?, &a.query).await?
                }
            };
            let stdout = std::io::stdout();
            crate::sql::write(&batches, a.format.into(), BufWriter::new(stdout.lock()))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Reward(a) => {
            let threads = a.threads.unwrap_or_else(default_jobs).max(1);
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build()?;
            if let (Some(rollouts), Some(out)) = (&a.rollouts, &a.out) {
                let mut keep = Vec::new();
                let shards = local_glob(a.seed_shards.clone(), &given, &mut keep).await?;
                let seed = match &shards {
                    Some(glob) => Some(crate::train::data::seed_lookup(glob)?),
                    None => None,
                };
                let s = tokio::task::block_in_place(|| {
                    crate::reward::rollouts::score_rollouts(rollouts, out, seed.as_ref(), &pool)
                })?;
                println!("{}", serde_json::to_string(&s)?);
                if s.unscoreable > 0 {
                    eprintln!(
                        "error: {} of {} rollout(s) could not be scored (see reward_error)",
                        s.unscoreable, s.rows
                    );
                    return Ok(ExitCode::FAILURE);
                }
                return Ok(ExitCode::SUCCESS);
            }
            let input: Box<dyn BufRead> = match &a.input {
                Some(p) => crate::files::open_maybe_gz(p)?,
                None => Box::new(BufReader::new(std::io::stdin())),
            };
            let output: Box<dyn Write> = match &a.output {
                Some(p) => Box::new(BufWriter::new(
                    std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
                )),
                None => Box::new(BufWriter::new(std::io::stdout())),
            };
            let s = tokio::task::block_in_place(|| crate::reward::batch::score_stream(input, output, &pool))?;
            if s.errors > 0 {
                eprintln!(
                    "error: {} of {} line(s) could not be scored (see their \"error\" fields)",
                    s.errors, s.lines
                );
                return Ok(ExitCode::FAILURE);
            }
            tracing::info!(lines = s.lines, "scored");
            Ok(ExitCode::SUCCESS)
        }
        Command::Report { lake, out, config } => {
            let lake = open(&lake)?;
            let completeness = crate::jobs::CurationConfig::load(config.as_deref())?.completeness;
            let s = crate::report::run(&lake, &crate::report::ReportOptions { out, completeness }).await?;
            println!("wrote {}", s.card.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::EvalRelevance(a) => {
            let config = crate::jobs::CurationConfig::load(a.config.as_deref())?;
            let encoder =
                if a.bm25_only { None } else { Some(crate::relevance::encoder::Encoder::load(default_jobs())?) };
            let mut dump = match &a.features_out {
                Some(p) => Some(std::io::BufWriter::new(
                    std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
                )),
                None => None,
            };
            let report = tokio::task::block_in_place(|| -> Result<crate::relevance::EvalReport> {
                let out = dump.as_mut().map(|w| w as &mut dyn std::io::Write);
                match (&a.git, &a.lake) {
                    (Some(path), _) => {
                        let repo =
                            git2::Repository::open(path).with_context(|| format!("opening {}", path.display()))?;
                        let changes = crate::relevance::cases_from_repo(&repo, a.max_commits)?;
                        crate::relevance::evaluate(&repo, &changes, &config.relevance, encoder.as_ref(), out)
                    }
                    (None, Some(lake)) => {
                        let lake = open(lake)?;
                        let name = a.repo_name.clone().expect("clap requires --repo-name");
                        let mirrors = crate::git::Mirrors::new(
                            a.repo_url.clone().expect("clap requires --repo-url"),
                            a.cache_dir.clone().unwrap_or_else(crate::git::default_cache_dir),
                        );
                        let repo = mirrors.open(&name).map_err(|f| anyhow::anyhow!("{}: {}", f.reason, f.message))?;
                        let changes = tokio::runtime::Handle::current()
                            .block_on(crate::relevance::changes_from_lake(&lake, &name))?;
                        crate::relevance::evaluate(&repo, &changes, &config.relevance, encoder.as_ref(), out)
                    }
                    _ => bail!("give --git PATH or --lake LAKE --repo-name NAME --repo-url TEMPLATE"),
                }
            })?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.render());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Train(a) => {
            let mut keep = Vec::new();
            let mut opts = a.into_options();
            opts.rollouts = local_glob(opts.rollouts.take(), &given, &mut keep).await?;
            opts.seed_shards = local_glob(opts.seed_shards.take(), &given, &mut keep).await?;
            tokio::task::block_in_place(|| crate::train::run::train(&opts))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Generate(a) => {
            let mut keep = Vec::new();
            let mut opts = a.into_options();
            opts.seed_shards = local_glob(Some(opts.seed_shards), &given, &mut keep).await?.unwrap_or_default();
            tokio::task::block_in_place(|| crate::train::run::generate(&opts))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Eval(a) => {
            let mut keep = Vec::new();
            let mut opts = a.into_options();
            opts.seed_shards = local_glob(Some(opts.seed_shards), &given, &mut keep).await?.unwrap_or_default();
            opts.rollouts = local_glob(opts.rollouts.take(), &given, &mut keep).await?;
            tokio::task::block_in_place(|| crate::train::run::eval(&opts))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Demo(a) => {
            let report = crate::demo::run(&a.samples, &a.lake, !quiet).await?;
            print!("{report}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(BenchCommand::Ingest(a)) => {
            crate::bench::ingest(&a.into_options()).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Samples { hours, repos } => {
            let tmp = tempfile::tempdir()?;
            let dir = repos.unwrap_or_else(|| tmp.path().to_path_buf());
            let made = crate::samples::create_repos(&dir)?;
            for p in crate::samples::write_hours(&hours, &made)? {
                println!("wrote {}", p.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Ballista(BallistaCommand::Scheduler { bind }) => {
            crate::distributed::scheduler(&bind, &crate::lake::store::options(&given)).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Ballista(BallistaCommand::Executor { scheduler, bind, grpc_port, concurrent_tasks, work_dir }) => {
            let o = crate::distributed::ExecutorOptions {
                scheduler,
                bind,
                grpc_port,
                concurrent_tasks: concurrent_tasks.unwrap_or_else(default_jobs),
                work_dir,
            };
            crate::distributed::executor(&o, &crate::lake::store::options(&given)).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::BenchFloor { path, zstd_pages } => {
            let (lines, packed) = crate::bench::gunzip_pages(&path, zstd_pages)?;
            println!("{lines} {packed}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(BenchCommand::Lake(a)) => {
            let opts = a.into_options();
            tokio::task::block_in_place(|| crate::bench::lake(&opts))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(BenchCommand::Blobs(a)) => {
            crate::bench::blobs(&a.into_options())?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(BenchCommand::Rollouts(a)) => {
            let opts = a.into_options();
            tokio::task::block_in_place(|| crate::train::bench::rollouts(&opts))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(BenchCommand::Train(a)) => {
            let opts = a.into_options();
            tokio::task::block_in_place(|| crate::train::bench::run(&opts))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(BenchCommand::Jobs(a)) => {
            crate::bench::jobs(&a.into_options()).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(BenchCommand::Backfill(a)) => {
            let opts = a.into_options();
            tokio::task::block_in_place(|| crate::bench::backfill(&opts))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(BenchCommand::Relevance(a)) => {
            let opts = a.into_options(default_jobs());
            crate::bench::relevance(&opts).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(BenchCommand::Reward(a)) => {
            crate::bench::reward(&a.into_options())?;
            Ok(ExitCode::SUCCESS)
        }
    }
}
