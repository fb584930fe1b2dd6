//! `swelake demo`: the whole pipeline on the bundled samples; and the hidden `swelake samples`
//! that regenerates them.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;

use super::Ctx;

#[derive(Args, Debug)]
pub(crate) struct DemoArgs {
    /// Lake directory for the demo (replaced if it holds an earlier demo).
    #[arg(long, default_value = "demo-lake")]
    lake: PathBuf,
    /// Directory with the sample inputs.
    #[arg(long, default_value = "data-samples")]
    samples: PathBuf,
}

impl DemoArgs {
    pub(crate) async fn run(self, ctx: &Ctx) -> Result<ExitCode> {
        let report = crate::demo::run(&self.samples, &self.lake, !ctx.quiet).await?;
        print!("{report}");
        Ok(ExitCode::SUCCESS)
    }
}

#[derive(Args, Debug)]
pub(crate) struct SamplesArgs {
    /// Where to write the hour files (data-samples/gharchive to refresh the committed ones).
    #[arg(long)]
    hours: PathBuf,
    /// Where to create the sample repositories (default: a temporary directory).
    #[arg(long)]
    repos: Option<PathBuf>,
}

impl SamplesArgs {
    pub(crate) fn run(self) -> Result<ExitCode> {
        let tmp = tempfile::tempdir()?;
        let dir = self.repos.unwrap_or_else(|| tmp.path().to_path_buf());
        let made = crate::samples::create_repos(&dir)?;
        for p in crate::samples::write_hours(&self.hours, &made)? {
            println!("wrote {}", p.display());
        }
        Ok(ExitCode::SUCCESS)
    }
}
