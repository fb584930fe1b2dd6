//! `swelake status` and `swelake maintain`: the state of a lake, and its upkeep.

use std::process::ExitCode;

use anyhow::Result;

use clap::Args;

use super::args::{ConfigArg, JobsArgs, LakeArg, OutputArg};
use super::{parse_duration, Ctx};

#[derive(Args, Debug)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    lake: LakeArg,
    #[command(flatten)]
    output: OutputArg,
    #[command(flatten)]
    jobs: JobsArgs,
    #[command(flatten)]
    config: ConfigArg,
}

impl StatusArgs {
    pub(crate) async fn run(self, ctx: &Ctx) -> Result<ExitCode> {
        let a = self;
        let lake = a.lake.open(ctx)?;
        let registry = a.jobs.registry()?;
        let opts = crate::jobs::RunOptions { curation: a.config.load()?, ..Default::default() };
        let status = crate::jobs::status::status(&lake, &registry, &opts).await?;
        if a.output.json {
            println!("{}", serde_json::to_string(&status)?);
        } else {
            print!("{}", status.render());
        }
        Ok(ExitCode::SUCCESS)
    }
}

#[derive(Args, Debug)]
pub(crate) struct MaintainArgs {
    #[command(flatten)]
    lake: LakeArg,
    /// Only this table.
    #[arg(long)]
    table: Option<String>,
    /// Also delete files that left the table longer ago than this (at least 1h): 7d, 36h.
    /// Readers of versions younger than it can always finish their scans.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    vacuum_retention: Option<std::time::Duration>,
    #[command(flatten)]
    output: OutputArg,
}

impl MaintainArgs {
    pub(crate) async fn run(self, ctx: &Ctx) -> Result<ExitCode> {
        let a = self;
        let lake = a.lake.open(ctx)?;
        let opts = crate::lake::maintain::MaintainOptions {
            table: a.table,
            vacuum_retention: a.vacuum_retention,
            ..Default::default()
        };
        let done = lake.maintain(&opts).await?;
        if a.output.json {
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
