//! `swelake reward`: answers scored with the SWE-RL reward, as JSON lines or rollout tables.

use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;

use super::{default_jobs, local_glob, Ctx};

#[derive(Args, Debug)]
pub(crate) struct RewardArgs {
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

impl RewardArgs {
    pub(crate) async fn run(self, ctx: &Ctx) -> Result<ExitCode> {
        let a = self;
        let threads = a.threads.unwrap_or_else(default_jobs).max(1);
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build()?;
        if let (Some(rollouts), Some(out)) = (&a.rollouts, &a.out) {
            let mut keep = Vec::new();
            let shards = local_glob(a.seed_shards.clone(), &ctx.given, &mut keep).await?;
            let seed = match &shards {
                Some(glob) => Some(crate::train::data::seed_lookup(glob)?),
                None => None,
            };
            let s = tokio::task::block_in_place(|| {
                crate::reward::rollouts::score_rollouts(rollouts, out, seed.as_ref(), &pool)
            })?;
            println!("{}", serde_json::to_string(&s)?);
            if s.unscoreable > 0 {
                eprintln!("error: {} of {} rollout(s) could not be scored (see reward_error)", s.unscoreable, s.rows);
                return Ok(ExitCode::FAILURE);
            }
            return Ok(ExitCode::SUCCESS);
        }
        let input: Box<dyn BufRead> = match &a.input {
            Some(p) => crate::files::open_maybe_gz(p)?,
            None => Box::new(BufReader::new(std::io::stdin())),
        };
        let output: Box<dyn Write> = match &a.output {
            Some(p) => {
                Box::new(BufWriter::new(std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?))
            }
            None => Box::new(BufWriter::new(std::io::stdout())),
        };
        let s = tokio::task::block_in_place(|| crate::reward::batch::score_stream(input, output, &pool))?;
        if s.errors > 0 {
            eprintln!("error: {} of {} line(s) could not be scored (see their \"error\" fields)", s.errors, s.lines);
            return Ok(ExitCode::FAILURE);
        }
        tracing::info!(lines = s.lines, "scored");
        Ok(ExitCode::SUCCESS)
    }
}
