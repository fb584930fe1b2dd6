//! `swelake report`: the dataset card of a lake's seed dataset.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;

use super::args::{ConfigArg, LakeArg};
use super::Ctx;

#[derive(Args, Debug)]
pub(crate) struct ReportArgs {
    #[command(flatten)]
    lake: LakeArg,
    /// Directory for card.md and the charts.
    #[arg(long)]
    out: PathBuf,
    #[command(flatten)]
    config: ConfigArg,
}

impl ReportArgs {
    pub(crate) async fn run(self, ctx: &Ctx) -> Result<ExitCode> {
        let lake = self.lake.open(ctx)?;
        let completeness = self.config.load()?.completeness;
        let s = crate::report::run(&lake, &crate::report::ReportOptions { out: self.out, completeness }).await?;
        println!("wrote {}", s.card.display());
        Ok(ExitCode::SUCCESS)
    }
}
