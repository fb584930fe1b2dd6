//! `swelake reward`: answers scored with the SWE-RL reward, as JSON lines or rollout tables.

use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Args;
use swelake_reward::modes::{Mode, TestOutcome};

use super::args::GradeArgs;
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
    /// Score rollout Parquet files (a file or a glob) instead of JSONL cases (schema:
    /// schemas/rollouts.toml).
    #[arg(long, value_name = "GLOB", conflicts_with_all = ["input", "output"], requires = "out")]
    rollouts: Option<String>,
    /// Where the scored rollouts go: a directory (each input file under its own name), or a
    /// .parquet file for one input file.
    #[arg(long, requires = "rollouts")]
    out: Option<PathBuf>,
    /// Seed shards (glob) to look up context/oracle by instance_id when rollouts do not carry
    /// them [default with --lake: LAKE/shards/seed/part-*.parquet].
    #[arg(long, requires = "rollouts")]
    seed_shards: Option<String>,
    /// The reward in `reward`: similarity, tests or hybrid (see below).
    #[arg(long, default_value = "similarity", value_parser = parse_mode, requires = "rollouts")]
    mode: Mode,
    #[command(flatten)]
    grade: GradeArgs,
}

pub(crate) fn parse_mode(s: &str) -> Result<Mode, String> {
    s.parse()
}

impl RewardArgs {
    pub(crate) async fn run(self, ctx: &Ctx) -> Result<ExitCode> {
        let a = self;
        let threads = a.threads.unwrap_or_else(default_jobs).max(1);
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build()?;
        if let (Some(rollouts), Some(out)) = (&a.rollouts, &a.out) {
            let inputs = crate::train::data::expand_glob(rollouts)?;
            let to_file = out.extension().is_some_and(|e| e == "parquet");
            if to_file && inputs.len() > 1 {
                bail!("--out {}: {} rollout files match; give a directory", out.display(), inputs.len());
            }
            let grader = a.grade.open(ctx).await?;
            if grader.is_none() && a.mode.runs_tests() {
                bail!("--mode {} runs the instances' tests: give --lake and --repo-url", a.mode);
            }
            let default_shards = a.grade.seed_shards();
            let mut keep = Vec::new();
            let shards = local_glob(a.seed_shards.clone().or(default_shards), &ctx.given, &mut keep).await?;
            let seed = match &shards {
                Some(glob) => match crate::train::data::seed_lookup(glob) {
                    Ok(s) => Some(s),
                    Err(e) if a.seed_shards.is_none() => {
                        tracing::debug!("no seed shards in the lake ({e:#}): rollouts must carry context/oracle");
                        None
                    }
                    Err(e) => return Err(e),
                },
                None => None,
            };
            if !to_file {
                std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
            }
            let grade_fn = |items: &[(String, String)]| -> Vec<TestOutcome> {
                grader.as_ref().expect("given with a grader").outcomes(items)
            };
            let scoring = crate::reward::rollouts::Scoring {
                mode: a.mode,
                grader: grader.as_ref().map(|_| &grade_fn as &crate::reward::rollouts::GradeFn<'_>),
            };
            let mut failed = 0;
            for input in &inputs {
                let dest = if to_file {
                    out.clone()
                } else {
                    out.join(input.file_name().context("a rollout file has no name")?)
                };
                if std::path::absolute(&dest)? == std::path::absolute(input)? {
                    bail!("--out {}: would overwrite the input {}", out.display(), input.display());
                }
                let s = tokio::task::block_in_place(|| {
                    crate::reward::rollouts::score_rollouts_with(input, &dest, seed.as_ref(), &pool, &scoring)
                })?;
                let mut line = serde_json::to_value(&s)?;
                line["input"] = serde_json::json!(input.display().to_string());
                line["output"] = serde_json::json!(dest.display().to_string());
                println!("{line}");
                if s.unscoreable > 0 {
                    eprintln!(
                        "error: {}: {} of {} rollout(s) could not be scored (see reward_error)",
                        input.display(),
                        s.unscoreable,
                        s.rows
                    );
                    failed += 1;
                }
            }
            return Ok(if failed > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS });
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
