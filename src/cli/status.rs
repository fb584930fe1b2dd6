//! `swelake status` and `swelake maintain`: the state of a lake, and its upkeep.

use std::process::ExitCode;

use anyhow::Result;
use std::path::PathBuf;

use clap::Args;

use super::{parse_duration, Ctx};

#[derive(Args, Debug)]
pub(crate) struct StatusArgs {
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

impl StatusArgs {
    pub(crate) async fn run(self, ctx: &Ctx) -> Result<ExitCode> {
        let a = self;
        let lake = ctx.open(&a.lake)?;
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
}

#[derive(Args, Debug)]
pub(crate) struct MaintainArgs {
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

impl MaintainArgs {
    pub(crate) async fn run(self, ctx: &Ctx) -> Result<ExitCode> {
        let a = self;
        let lake = ctx.open(&a.lake)?;
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
}
