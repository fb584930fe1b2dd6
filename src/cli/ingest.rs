//! `swelake ingest`: GH Archive hour files into `events`.

use std::process::ExitCode;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};

use super::args::{LakeArg, OutputArg};
use super::{default_jobs, parse_duration, Ctx};
use crate::ingest::source::Hour;
use crate::ingest::IngestOptions;
use crate::lake::Codec;

#[derive(Args, Debug)]
pub(crate) struct IngestArgs {
    /// Hour files: a directory, a file, a glob, or a URL prefix (s3://, gs://, az://, http(s)://).
    #[arg(long)]
    source: String,
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
        if let (Some(f), Some(t)) = (a.from, a.to) {
            if f > t {
                bail!("--from {} is after --to {}", f.key(), t.key());
            }
        }
        let lake = a.lake.open(ctx)?;
        crate::memory::keep_freed_memory();
        let opts = IngestOptions {
            source: a.source,
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
