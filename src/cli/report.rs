//! `swelake report`: the dataset card of a lake's seed dataset.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;

use super::Ctx;

#[derive(Args, Debug)]
pub(crate) struct ReportArgs {
    /// Lake: a directory or s3://bucket/prefix, gs://…, az://…, file://…
    #[arg(long)]
    lake: String,
    /// Directory for card.md and the charts.
    #[arg(long)]
    out: PathBuf,
    /// Curation config whose [completeness] section judges the archive's hours.
    #[arg(long)]
    config: Option<PathBuf>,
}

impl ReportArgs {
    pub(crate) async fn run(self, ctx: &Ctx) -> Result<ExitCode> {
        let lake = ctx.open(&self.lake)?;
        let completeness = crate::jobs::CurationConfig::load(self.config.as_deref())?.completeness;
        let s = crate::report::run(&lake, &crate::report::ReportOptions { out: self.out, completeness }).await?;
        println!("wrote {}", s.card.display());
        Ok(ExitCode::SUCCESS)
    }
}
