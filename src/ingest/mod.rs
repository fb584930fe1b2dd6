//! GH Archive ingest: hour files → the Delta tables `events` and `events_rejected`.
//!
//! Each file is streamed (decompress → split lines → parse → Arrow batches → Parquet) with
//! bounded memory — decompressed on a thread of its own, parsed on as many threads as the
//! file has cores (`parallel`: the same files whatever their number) — then committed per
//! file: the file's previous rows, if any,
//! are replaced in the same transaction that adds the new ones, so re-ingesting an hour is
//! idempotent and an interrupted run that is restarted ends with the same tables. Every line
//! either becomes an event or a rejection row; the summary reconciles
//! `lines_read = events_written + rejected` per file.
//!
//! Not here: turning events into pull requests (`prs`), scheduling (`jobs`).

pub(crate) mod batch;
pub mod completeness;
pub(crate) mod event;
pub mod github;
mod parallel;
pub(crate) mod reader;
pub(crate) mod scan;
pub mod source;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use futures::StreamExt;
use indicatif::ProgressBar;
use serde::Serialize;
use serde_json::json;

use crate::lake::runs::{self, RunRecord};
use crate::lake::{writer_properties, Lake, StagedFile, TableWriter};
use crate::progress;
use crate::stage::{JobSummary, Stage, StageCtx, Unit};
use batch::{
    RejectedBuilder, EVENTS, EVENTS_REJECTED, EVENTS_SCHEMA, EVENT_DATE, LONG_TEXT_COLUMNS, REJECTED_SCHEMA,
    REPEATED_TEXT_COLUMNS,
};
use event::Rejection;
use reader::{Compression, Line, LineReader};
use source::{Hour, SourceFile};

/// The ingest stage: GH Archive hour files into `events`, `events_rejected` and
/// `source_hours`, an hour file at a time; it needs a source (`--source`, [`IngestOptions`]).
pub struct Ingest;

#[async_trait::async_trait(?Send)]
impl Stage for Ingest {
    fn name(&self) -> &'static str {
        "ingest"
    }

    fn description(&self) -> &'static str {
        "Stream GH Archive hour files into the events table; every unparseable line goes to events_rejected."
    }

    /// The GH Archive source, not a table.
    fn inputs(&self) -> &'static [&'static str] {
        &["gharchive"]
    }

    fn outputs(&self) -> &'static [&'static str] {
        &[EVENTS, EVENTS_REJECTED, completeness::SOURCE_HOURS]
    }

    fn unit(&self) -> Unit {
        Unit::Column("hour")
    }

    async fn run(&self, lake: &Lake, ctx: &StageCtx<'_>) -> Result<JobSummary> {
        let Some(opts) = ctx.extras.get::<IngestOptions>() else {
            return ctx.missing("--source", "the lake's events are used as they are");
        };
        let s = run(lake, opts).await?;
        if !s.ok() {
            anyhow::bail!("ingest had {} failed file(s); see the summary above", s.files_failed);
        }
        Ok(JobSummary::from(s))
    }
}

impl From<IngestSummary> for JobSummary {
    fn from(s: IngestSummary) -> JobSummary {
        JobSummary {
            partitions: s.files.iter().filter(|f| !f.skipped).map(|f| f.key.clone()).collect(),
            rows_out: s.events_written,
            notes: BTreeMap::from([("rejected_lines".to_string(), s.rejected as i64)]),
            ..Default::default()
        }
    }
}

/// Settings of one ingest run.
#[derive(Debug, Clone)]
pub struct IngestOptions {
    pub source: String,
    pub from: Option<Hour>,
    pub to: Option<Hour>,
    /// Re-ingest files already recorded as done (same key and size).
    pub force: bool,
    /// Lines longer than this are rejected (`line_too_long`).
    pub max_line_bytes: usize,
    /// How much of a rejected line is kept in `events_rejected.raw`.
    pub raw_keep_bytes: usize,
    /// Files processed at once (each on its own thread).
    pub jobs: usize,
    /// Rows per Arrow batch before it is handed to the Parquet writer.
    pub batch_rows: usize,
    /// Codec of the Parquet files written.
    pub compression: crate::lake::Codec,
    /// Object-store options for URL sources; empty means "from the environment".
    pub storage_options: Vec<(String, String)>,
    /// How long to wait for hours another run is ingesting (`None`: fail at once with
    /// [`crate::lake::lease::Busy`]).
    pub lease_wait: Option<std::time::Duration>,
    pub show_progress: bool,
}

impl Default for IngestOptions {
    fn default() -> Self {
        IngestOptions {
            source: String::new(),
            from: None,
            to: None,
            force: false,
            max_line_bytes: 8 << 20,
            raw_keep_bytes: 64 << 10,
            jobs: 2,
            batch_rows: 32768,
            compression: crate::lake::Codec::Zstd,
            storage_options: Vec::new(),
            lease_wait: None,
            show_progress: true,
        }
    }
}

/// What happened to one source file.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FileSummary {
    pub key: String,
    pub source_file: String,
    /// Already ingested with the same size; nothing was read.
    pub skipped: bool,
    /// The file could not be read at all (missing, unreachable, unreadable); the run went on
    /// with the other files and records this one as failed in `_job_runs`.
    pub error: Option<String>,
    pub lines_read: u64,
    pub events_written: u64,
    pub rejected: u64,
    pub rejected_by_reason: BTreeMap<String, u64>,
    pub events_by_type: BTreeMap<String, u64>,
    pub compressed_bytes: u64,
    pub json_bytes: u64,
    /// Distinct repositories among the events.
    pub distinct_repos: u64,
    pub seconds: f64,
    pub events_version: Option<i64>,
}

/// What a whole run did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct IngestSummary {
    pub files: Vec<FileSummary>,
    pub files_ingested: u64,
    pub files_skipped: u64,
    pub files_failed: u64,
    pub lines_read: u64,
    pub events_written: u64,
    pub rejected: u64,
    pub seconds: f64,
}

impl IngestSummary {
    /// Every ingested file satisfies `lines_read == events_written + rejected`.
    pub fn reconciles(&self) -> bool {
        self.files.iter().all(|f| f.skipped || f.error.is_some() || f.lines_read == f.events_written + f.rejected)
    }

    /// Every file was ingested (or skipped as already done) and reconciles.
    pub fn ok(&self) -> bool {
        self.files_failed == 0 && self.reconciles()
    }

    pub fn render_text(&self) -> String {
        let mut s = String::new();
        s.push_str(&format!(
            "{:<24} {:>10} {:>10} {:>9}  {}\n",
            "source", "lines", "events", "rejected", "rejections by reason"
        ));
        for f in &self.files {
            if f.skipped {
                s.push_str(&format!(
                    "{:<24} {:>10} {:>10} {:>9}  already ingested (use --force to redo)\n",
                    f.source_file, "-", "-", "-"
                ));
                continue;
            }
            let reasons: Vec<String> = f.rejected_by_reason.iter().map(|(k, v)| format!("{k}={v}")).collect();
            s.push_str(&format!(
                "{:<24} {:>10} {:>10} {:>9}  {}\n",
                f.source_file,
                f.lines_read,
                f.events_written,
                f.rejected,
                reasons.join(", ")
            ));
        }
        s.push_str(&format!(
            "{} file(s) ingested, {} skipped, {} failed: {} lines = {} events + {} rejected, in {:.1}s{}\n",
            self.files_ingested,
            self.files_skipped,
            self.files_failed,
            self.lines_read,
            self.events_written,
            self.rejected,
            self.seconds,
            if self.reconciles() { "" } else { "  (DOES NOT RECONCILE)" }
        ));
        s
    }
}

/// The result of streaming one file into staged Parquet files.
struct Parsed {
    summary: FileSummary,
    events: Vec<StagedFile>,
    rejected: Vec<StagedFile>,
}

/// Ingests every file of `opts.source` into the lake.
pub async fn run(lake: &Lake, opts: &IngestOptions) -> Result<IngestSummary> {
    let started = Instant::now();
    let sources = source::list_sources(&opts.source, opts.from, opts.to, &opts.storage_options).await?;
    let mut events_table = lake.ensure_table(EVENTS, &EVENTS_SCHEMA, &[EVENT_DATE]).await?;
    let mut rejected_table = lake.ensure_table(EVENTS_REJECTED, &REJECTED_SCHEMA, &[]).await?;
    let done: HashMap<String, RunRecord> =
        if opts.force { HashMap::new() } else { runs::latest_ok(lake, "ingest").await? };

    let mut summary = IngestSummary::default();
    let candidates: Vec<String> = sources.iter().map(|s| s.key.clone()).collect();
    // Hours another run is ingesting are not ours to redo: hold a lease on each hour (not yet
    // done) for the whole run, then look again at what is done — a run this one waited for
    // may have finished some of them.
    let pending: Vec<String> = candidates.iter().filter(|k| opts.force || !done.contains_key(*k)).cloned().collect();
    lake.with_leases("ingest", &pending, opts.lease_wait, async {
        let done: HashMap<String, RunRecord> =
            if opts.force || pending.is_empty() { done } else { runs::latest_ok(lake, "ingest").await? };
        ingest_sources(lake, opts, sources, &done, &mut summary, &mut events_table, &mut rejected_table).await
    })
    .await?;
    summary.files.sort_by(|a, b| a.key.cmp(&b.key));
    summary.seconds = started.elapsed().as_secs_f64();
    Ok(summary)
}

async fn ingest_sources(
    lake: &Lake,
    opts: &IngestOptions,
    sources: Vec<SourceFile>,
    done: &HashMap<String, RunRecord>,
    summary: &mut IngestSummary,
    events_table: &mut deltalake::DeltaTable,
    rejected_table: &mut deltalake::DeltaTable,
) -> Result<()> {
    let mut todo = Vec::new();
    for s in sources {
        let already = done.get(&s.key).is_some_and(|r| {
            let recorded = r.detail.get("size").and_then(|v| v.as_u64());
            s.size.is_none() || recorded == s.size
        });
        if already {
            summary.files.push(FileSummary {
                key: s.key.clone(),
                source_file: s.name.clone(),
                skipped: true,
                ..Default::default()
            });
            summary.files_skipped += 1;
        } else {
            todo.push(s);
        }
    }

    let mp = progress::multi(opts.show_progress);
    let overall = mp.add(progress::count_bar(todo.len() as u64, "files"));
    let download_dir = tempfile::tempdir().context("creating a download directory")?;
    let jobs = opts.jobs.max(1);
    let mut stream = futures::stream::iter(todo.into_iter().map(|s| {
        let lake = lake.clone();
        let opts = opts.clone();
        let mp = mp.clone();
        let dir = download_dir.path().to_path_buf();
        async move {
            let result = async {
                let local = source::fetch(&s, &dir).await?;
                let size = s.size.unwrap_or_else(|| std::fs::metadata(&local).map(|m| m.len()).unwrap_or(0));
                let bar = mp.add(progress::bytes_bar(size, &s.name));
                let parsed = {
                    let s = s.clone();
                    let local = local.clone();
                    let bar = bar.clone();
                    tokio::task::spawn_blocking(move || parse_file(&lake, &s, &local, &opts, &bar)).await?
                };
                bar.finish_and_clear();
                mp.remove(&bar);
                if matches!(s.location, source::Location::Remote { .. }) {
                    // Downloads are transient; a failed removal only leaves a temp file behind.
                    let _ = std::fs::remove_file(&local);
                }
                parsed
            }
            .await;
            (s, result)
        }
    }))
    .buffer_unordered(jobs);

    while let Some((s, result)) = stream.next().await {
        let parsed = match result {
            Ok(p) => p,
            Err(e) => {
                let message = format!("{e:#}");
                tracing::error!(source = %s.location, error = %message, "could not ingest");
                let detail = json!({"source": s.location.to_string(), "size": s.size, "error": message});
                let mut rec = RunRecord::ok("ingest", &s.key, 0, 0, 0, None, detail);
                rec.status = "failed".to_string();
                runs::record(lake, rec).await?;
                summary.files.push(FileSummary {
                    key: s.key.clone(),
                    source_file: s.name.clone(),
                    error: Some(message),
                    ..Default::default()
                });
                summary.files_failed += 1;
                overall.inc(1);
                continue;
            }
        };
        let Parsed { summary: mut file, events, rejected } = parsed;
        let predicate = format!("source_file = '{}'", s.name.replace('\'', "''"));
        let meta = HashMap::from([
            ("swelake.job".to_string(), json!("ingest")),
            ("swelake.source_key".to_string(), json!(s.key)),
        ]);
        file.events_version = lake.replace_key(events_table, &s.key, events, predicate.clone(), meta.clone()).await?;
        lake.replace_key(rejected_table, &s.key, rejected, predicate, meta).await?;
        completeness::record_hour(lake, &s, &file).await?;
        let detail = json!({
            "source": s.location.to_string(),
            "size": s.size,
            "rejected_by_reason": file.rejected_by_reason,
        });
        runs::record(
            lake,
            RunRecord::ok(
                "ingest",
                &s.key,
                file.lines_read,
                file.events_written,
                file.rejected,
                file.events_version,
                detail,
            )
            .timed(file.seconds),
        )
        .await?;
        tracing::info!(
            source = %s.name,
            lines = file.lines_read,
            events = file.events_written,
            rejected = file.rejected,
            "ingested"
        );
        summary.files_ingested += 1;
        summary.lines_read += file.lines_read;
        summary.events_written += file.events_written;
        summary.rejected += file.rejected;
        summary.files.push(file);
        overall.inc(1);
    }
    overall.finish_and_clear();
    Ok(())
}

/// Streams one local file into staged Parquet files of both tables: decompressed on one
/// thread, split into lines on this one, parsed on `workers` threads, merged back in file
/// order and written on another ([`parallel`]).
fn parse_file(lake: &Lake, s: &SourceFile, local: &Path, opts: &IngestOptions, bar: &ProgressBar) -> Result<Parsed> {
    let t0 = Instant::now();
    let counter = Arc::new(AtomicU64::new(0));
    let decoded = reader::open_decoded(local, Compression::from_name(&s.name), counter.clone())
        .with_context(|| format!("opening {}", local.display()))?;
    let mut lines = LineReader::new(decoded, opts.max_line_bytes);
    // The file's share of the cores: parsing threads, and as many encoding the columns.
    let workers = (std::thread::available_parallelism().map_or(1, |n| n.get()) / opts.jobs.max(1)).max(1);
    let events = TableWriter::new(
        lake,
        EVENTS,
        &s.key,
        &EVENTS_SCHEMA,
        Some(EVENT_DATE),
        writer_properties(LONG_TEXT_COLUMNS, REPEATED_TEXT_COLUMNS, opts.compression),
    )?
    .encode_threads(workers);
    let mut rejected_writer = TableWriter::new(
        lake,
        EVENTS_REJECTED,
        &s.key,
        &REJECTED_SCHEMA,
        None,
        writer_properties(&["raw"], &[], opts.compression),
    )?;
    let mut summary = FileSummary { key: s.key.clone(), source_file: s.name.clone(), ..Default::default() };
    let now = chrono::Utc::now().timestamp_micros();
    let raw_keep = opts.raw_keep_bytes;
    let max_line = opts.max_line_bytes;
    let gzip = Compression::from_name(&s.name) == Compression::Gzip;
    // The reader's own rejections: a line over the limit, a stream that broke inside a line.
    let on_line = |line_no: u64, line: &Line<'_>| -> Option<parallel::Rejected> {
        if line_no.is_multiple_of(4096) {
            bar.set_position(counter.load(Ordering::Relaxed));
        }
        match line {
            Line::Complete(_) => None,
            Line::TooLong { prefix, total } => Some(parallel::Rejected {
                line: line_no,
                rejection: Rejection::new(
                    "line_too_long",
                    format!("{total} bytes, over the {max_line} byte limit (--max-line-bytes)"),
                ),
                raw: parallel::lossy_prefix(prefix, raw_keep),
                total: *total,
            }),
            Line::StreamError { partial, total, error } => {
                let code = match (gzip, error.kind()) {
                    (true, std::io::ErrorKind::UnexpectedEof) => "truncated_gzip",
                    (true, _) => "corrupt_gzip",
                    _ => "read_error",
                };
                Some(parallel::Rejected {
                    line: line_no,
                    rejection: Rejection::new(
                        code,
                        format!("the stream ended in error after {} good lines: {error}", line_no - 1),
                    ),
                    raw: parallel::lossy_prefix(partial, raw_keep),
                    total: *total,
                })
            }
        }
    };
    let (merged, reader_rejected, lines_read) =
        parallel::parse_lines(&mut lines, events, &s.name, workers, opts.batch_rows, raw_keep, on_line)?;

    // Rejections in file order, as a single-threaded reading would have found them.
    let mut all = merged.rejected;
    all.extend(reader_rejected);
    all.sort_by_key(|r| r.line);
    let mut rejected = RejectedBuilder::default();
    for r in &all {
        *summary.rejected_by_reason.entry(r.rejection.code.clone()).or_default() += 1;
        rejected.push(&s.name, r.line, &r.rejection, &r.raw, r.total, now);
    }
    summary.rejected = all.len() as u64;
    if !rejected.is_empty() {
        rejected_writer.write(&rejected.finish()?)?;
    }
    summary.events_written = merged.events_written;
    summary.events_by_type = merged.by_type.into_iter().map(|(k, n)| (k.into_string(), n)).collect();
    summary.lines_read = lines_read;
    summary.distinct_repos = merged.distinct_repos;
    summary.compressed_bytes = counter.load(Ordering::Relaxed);
    summary.json_bytes = lines.bytes_read();
    let rejected = rejected_writer.finish()?;
    summary.seconds = t0.elapsed().as_secs_f64();
    Ok(Parsed { summary, events: merged.events, rejected })
}
