//! The command line: the only module that knows clap. Each command's flags and its arm live
//! in a file of their own (`ingest.rs`, `run.rs`, …), parsed into the library's plain option
//! structs and handed to a library function that tests call too; this file holds the global
//! flags, the list of commands and the dispatcher.

mod args;
mod ballista;
mod bench;
mod demo;
mod evaluate;
mod export;
mod grader;
mod ingest;
mod relevance;
mod report;
mod reward;
mod run;
mod serve;
mod sql;
mod status;
mod train;

use std::io::Write;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

use crate::lake::Lake;

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
    Ingest(ingest::IngestArgs),
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
  swelake run --all --lake lake --source data/gharchive --repo-url ... --discover-from-git
  swelake run verify --lake lake --repo-url ... --repeat 3 --timeout 300s
                                                       # FAIL_TO_PASS/PASS_TO_PASS, in a sandbox

With --json: one line {\"ok\", \"failed_job\", \"error\", \"jobs\": [{job, outcome, ...}]} (outcome:
done, up_to_date, skipped, failed, not_run). The exit status is 0 only when every due job
succeeded; skipped jobs (no --source, nothing due) are not failures.",
        mut_arg("lake", |a| a.required(false).required_unless_present("list"))
    )]
    Run(run::RunArgs),
    /// What state a lake is in: per job its watermark, pending partitions and last run; per
    /// table its version, files, bytes, small files, last compaction and checkpoint; leases held.
    #[command(after_help = "\
Examples:
  swelake status --lake lake
  swelake status --lake s3://bucket/lake --json | jq '.jobs[] | select(.last_outcome == \"failed\")'")]
    Status(status::StatusArgs),
    /// Compact small files (keeping each file's key), write checkpoints, and vacuum.
    #[command(after_help = "\
Compaction merges small files of the same input key (and unkeyed appends such as _job_runs),
so reruns still replace exactly their rows. A checkpoint is written for every table, so a
table with thousands of commits is not replayed from JSON. Vacuum deletes only files that
left the table longer ago than the retention.

Examples:
  swelake maintain --lake lake
  swelake maintain --lake s3://bucket/lake --table events --vacuum-retention 7d")]
    Maintain(status::MaintainArgs),
    /// Run a read-only SQL query over every table of a lake.
    #[command(after_help = "\
Every Delta table in the lake is registered under its directory name, along with the swelake
SQL functions (swerl_reward, swerl_format_error, ...).

Examples:
  swelake sql --lake lake \"SELECT type, count(*) AS n FROM events GROUP BY type ORDER BY n DESC\"
  swelake sql --lake lake --format json \"SELECT reason, count(*) FROM events_rejected GROUP BY reason\"
  swelake sql --lake lake \"SHOW TABLES\"
  swelake sql --lake lake                     # an interactive shell: \\d, \\d TABLE, \\q
  printf 'SELECT 1;\\n\\\\d events\\n' | swelake sql --lake lake   # a scripted session")]
    Sql(sql::SqlArgs),
    /// A read-only web console over a lake (status, the archive's hours, SQL, the dataset and
    /// its instances), its JSON API, and optionally the PostgreSQL wire protocol.
    #[command(after_help = "\
Pages: /status, /sources (a heatmap of GH Archive hours), /sql (?q=… runs a query on load, so
a link shares it), /dataset (the card and an instance browser), /instances/ID. Each is drawn
from an endpoint scripts can call: GET /api/status, GET /api/hours, POST /api/sql with
{\"sql\": \"…\"} (→ {\"columns\": [{\"name\", \"type\"}], \"rows\": [[…]]}; \"format\": csv, json or
parquet for a file), GET /api/tables, GET /api/card, GET /api/instances?repo=&language=&split=,
GET /api/instances/ID, POST /api/instances/ID/score with {\"answer\": \"…\"}. POST bodies are
JSON, sent with Content-Type: application/json (anything else: 415).

Read-only on every path: a statement runs only if its plan reads (no INSERT, UPDATE, DELETE,
COPY … TO, CREATE, DROP, not even under EXPLAIN ANALYZE); anything else is refused with
SQLSTATE 25006. Every query, over HTTP or PostgreSQL (simple or extended protocol, cursors),
runs under --timeout, --row-limit and --memory-limit, at most --max-queries at once. A
PostgreSQL connection's SET changes only that connection, and only the settings drivers send
(DateStyle, search_path, application_name, statement_timeout lowered, …); datafusion.* is
the server's. On loopback (the default) no token is needed; any other address needs --token.
The console answers only to its own address as Host (and --allow-host names). Text from
GitHub is shown as text, never as markup.

Examples:
  swelake serve --lake lake                                  # http://127.0.0.1:8080/
  swelake serve --lake lake --pg-bind 127.0.0.1:5433         # psql -h 127.0.0.1 -p 5433
  curl -s localhost:8080/api/sql -H 'Content-Type: application/json' -d '{\"sql\": \"SELECT count(*) FROM rl_seed\"}'
  swelake serve --lake lake --row-limit 1000 --timeout 10s --memory-limit 512MiB --max-queries 4
  SWELAKE_TOKEN=s3cret swelake serve --lake s3://bucket/lake --bind 0.0.0.0:8080")]
    Serve(serve::ServeArgs),
    /// Score model answers with the SWE-RL reward (bit-compatible with the reference).
    #[command(after_help = "\
Input lines (JSON):
  {\"id\":..,\"kind\":\"search_replace\",\"context\":{path:text},\"oracle\":{path:new_text},\"output\":\"<think>..</think><solution>..</solution>\"}
  {\"id\":..,\"kind\":\"unidiff\",\"oracle_patches\":[diff,..],\"pred_patches\":[diff,..]}
  {\"id\":..,\"kind\":\"general\",\"context\":{..},\"oracle\":{..},\"pred\":{path:new_text}}
Output lines: {\"id\",\"reward\",\"format_error\",\"similarities\"}; a line that cannot be scored
gets \"reward\": null and an \"error\", the batch continues, and the exit status is 1.

Rollout tables (Parquet, see schemas/rollouts.toml): `--rollouts GLOB --out DIR` adds reward,
format_error, reward_error, the graded predicted_patch and every mode's reward; context/oracle
come from inline columns or, when absent, from --seed-shards joined on instance_id.

Modes (--mode; each mode's value is also a column of its own, `reward` is the chosen one):
  similarity  SWE-RL's reward, bit for bit the reference's: -1 malformed, else patch similarity
  tests       -1 malformed, 0 unresolved (or the patch does not apply), 1 resolved
  hybrid      -1 malformed, 1 resolved, 0 the patch does not apply, else
              (similarity + share of FAIL_TO_PASS passed) / 4, at most 0.5
tests and hybrid run each completion's patch against its instance's FAIL_TO_PASS and
PASS_TO_PASS tests in the sandbox, in the environment the verify stage built (--lake,
--repo-url): only instances `swelake run verify` verified are graded (others: reward NULL and
the reason). A completion is a SWE-RL answer (its edits applied to the context files give the
patch) or carries a unified diff; a distinct patch of an instance is run once.

Examples:
  swelake reward --input cases.jsonl --output scored.jsonl --threads 8
  zcat cases.jsonl.gz | swelake reward > scored.jsonl
  swelake reward --rollouts 'rollouts/*.parquet' --out scored/ --seed-shards 'lake/shards/seed/*.parquet'
  swelake reward --rollouts 'rollouts/*.parquet' --lake lake --repo-url 'file:///srv/git/{repo}.git' --mode hybrid --out scored/")]
    Reward(reward::RewardArgs),
    /// Export the seed dataset for other tools: a Hugging Face dataset or SWE-bench instances.
    Export(export::ExportArgs),
    /// Grade SWE-bench predictions on the lake's verified instances, in the verify stage's
    /// sandbox and environments; a report in SWE-bench's shape.
    Evaluate(evaluate::EvaluateArgs),
    /// Serve the grader over HTTP (loopback, a token): completions or patches of the lake's
    /// verified instances graded by their tests, for verl, TRL and OpenRLHF.
    #[command(name = "grade-server")]
    GradeServer(grader::GraderArgs),
    /// Write a dataset card (Markdown + PNG charts) of a lake's seed dataset.
    Report(report::ReportArgs),
    /// Measure relevant-file rankers leave-one-out: hide one changed file, rank it among the
    /// repository's files from the change's text and its other changed paths.
    #[command(
        name = "eval-relevance",
        after_help = "\
On a lake (merged, snapshotted PRs of one repository):
  swelake eval-relevance --lake lake --repo-name owner/name --repo-url '/srv/git/{repo}.git'
On any git repository's first-parent history (commits as changes, messages as text):
  swelake eval-relevance --git path/to/repo --max-commits 2000
Prints recall@1/5/10 for BM25 and the hybrid ranker, with and without the changed paths.",
        mut_arg("lake", |a| a.required(false).requires("repo_name").requires("repo_url"))
    )]
    EvalRelevance(relevance::EvalRelevanceArgs),
    /// Train a policy with GRPO on rollouts (Parquet) or online, in Candle.
    Train(train::TrainArgs),
    /// Sample G completions per seed prompt with a policy and write them as rollouts.
    Generate(train::GenerateArgs),
    /// Evaluate a policy (or another engine's rollouts) on held-out seed instances.
    Eval(train::EvalArgs),
    /// Run the whole pipeline on the bundled samples (offline) and summarise what it built.
    Demo(demo::DemoArgs),
    /// Benchmarks that print throughput next to a baseline measured in the same run.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
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
    Ballista(ballista::BallistaCommand),
    /// Regenerate the sample hour files (and optionally the sample git repositories).
    #[command(hide = true)]
    Samples(demo::SamplesArgs),
    /// Internal: decompress a file and count its lines (the floor of `bench ingest`); with
    /// `--zstd-pages`, also compress the text in 1 MiB zstd-1 pages (its lower bound).
    #[command(hide = true, name = "bench-floor")]
    BenchFloor(bench::BenchFloorArgs),
}

fn default_jobs() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
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

/// A size in bytes: `1GiB`, `512MiB`, `64KiB`, `2G`, `500M`, `1048576`.
fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let (num, unit) = t.split_at(t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len()));
    let n: f64 = num.parse().map_err(|_| format!("{s:?} is not a size like 512MiB or 2GiB"))?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(format!("{s:?}: the unit must be KiB, MiB, GiB or TiB")),
    };
    Ok((n * scale as f64) as u64)
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

/// The command line's definition: what `--help` shows (the docs' tests check their commands
/// against it).
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // The trainer's commands keep glibc's default arenas (their figures were measured with
    // them); every other command builds and frees Arrow batches on many threads.
    if !matches!(
        cli.command,
        Command::Train(_) | Command::Generate(_) | Command::Eval(_) | Command::Bench(bench::BenchCommand::Train(_))
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

/// What every command gets besides its own flags.
pub(crate) struct Ctx {
    /// `--quiet`: no progress bars.
    pub(crate) quiet: bool,
    /// `--storage-option KEY=VALUE`s.
    pub(crate) given: Vec<(String, String)>,
}

impl Ctx {
    /// The lake at `location`, with the command line's store options.
    pub(crate) fn open(&self, location: &str) -> Result<Lake> {
        Lake::open_with(location, &self.given)
    }
}

/// Each command's arm lives beside its flags, in its own file.
async fn run(cli: Cli) -> Result<ExitCode> {
    let ctx = Ctx { quiet: cli.quiet, given: cli.storage_options.clone() };
    match cli.command {
        Command::Ingest(a) => a.run(&ctx).await,
        Command::Run(a) => a.run(&ctx).await,
        Command::Status(a) => a.run(&ctx).await,
        Command::Maintain(a) => a.run(&ctx).await,
        Command::Sql(a) => a.run(&ctx).await,
        Command::Serve(a) => a.run(&ctx).await,
        Command::Reward(a) => a.run(&ctx).await,
        Command::Export(a) => a.run(&ctx).await,
        Command::Evaluate(a) => a.run(&ctx).await,
        Command::GradeServer(a) => a.run(&ctx).await,
        Command::Report(a) => a.run(&ctx).await,
        Command::EvalRelevance(a) => a.run(&ctx).await,
        Command::Train(a) => a.run(&ctx).await,
        Command::Generate(a) => a.run(&ctx).await,
        Command::Eval(a) => a.run(&ctx).await,
        Command::Demo(a) => a.run(&ctx).await,
        Command::Bench(b) => b.run().await,
        Command::Ballista(b) => b.run(&ctx).await,
        Command::Samples(a) => a.run(),
        Command::BenchFloor(a) => a.run(),
    }
}
