//! `swelake eval-relevance`: relevant-file rankers measured leave-one-out.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Args;

use super::args::{ConfigArg, LakeArg, OutputArg, RepoArgs};
use super::{default_jobs, Ctx};

#[derive(Args, Debug)]
pub(crate) struct EvalRelevanceArgs {
    /// A git repository whose history is the evaluation set.
    #[arg(long, conflicts_with = "lake")]
    git: Option<PathBuf>,
    /// Commits of --git to read (first-parent, oldest first).
    #[arg(long, default_value_t = 2000)]
    max_commits: usize,
    /// A lake whose PRs are the evaluation set (`--lake` with --repo-name and --repo-url).
    #[command(flatten)]
    lake: LakeArg,
    /// Repository of the lake to evaluate on.
    #[arg(long)]
    repo_name: Option<String>,
    #[command(flatten)]
    repo: RepoArgs,
    /// The ranker's weights are its [relevance] section.
    #[command(flatten)]
    config: ConfigArg,
    /// Without the encoder (no ONNX model needed): BM25 and the hybrid on its first stage alone.
    #[arg(long)]
    bm25_only: bool,
    /// Write every case's scaled features (learned rankers, JSON lines: variant, change,
    /// target, reranked, x) to this file, to fit or inspect rankers outside swelake.
    #[arg(long, value_name = "FILE")]
    features_out: Option<PathBuf>,
    #[command(flatten)]
    output: OutputArg,
}

impl EvalRelevanceArgs {
    pub(crate) async fn run(self, ctx: &Ctx) -> Result<ExitCode> {
        let a = self;
        let config = a.config.load()?;
        // `encoder = false` in the config ranks without the encoder here as in the job.
        let encoder = if a.bm25_only || !config.relevance.encoder {
            None
        } else {
            Some(crate::relevance::encoder::Encoder::load(default_jobs())?)
        };
        let mut dump = match &a.features_out {
            Some(p) => Some(std::io::BufWriter::new(
                std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
            )),
            None => None,
        };
        let report = tokio::task::block_in_place(|| -> Result<crate::relevance::EvalReport> {
            let out = dump.as_mut().map(|w| w as &mut dyn std::io::Write);
            match (&a.git, a.lake.given()) {
                (Some(path), _) => {
                    let repo = git2::Repository::open(path).with_context(|| format!("opening {}", path.display()))?;
                    let changes = crate::relevance::cases_from_repo(&repo, a.max_commits)?;
                    crate::relevance::evaluate(&repo, &changes, &config.relevance, encoder.as_ref(), out)
                }
                (None, true) => {
                    let lake = a.lake.open(ctx)?;
                    let name = a.repo_name.clone().expect("clap requires --repo-name");
                    let mirrors = crate::git::Mirrors::new(a.repo.required_url()?, a.repo.cache_dir());
                    let repo = mirrors.open(&name).map_err(|f| anyhow::anyhow!("{}: {}", f.reason, f.message))?;
                    let changes = tokio::runtime::Handle::current()
                        .block_on(crate::relevance::changes_from_lake(&lake, &name))?;
                    crate::relevance::evaluate(&repo, &changes, &config.relevance, encoder.as_ref(), out)
                }
                _ => bail!("give --git PATH or --lake LAKE --repo-name NAME --repo-url TEMPLATE"),
            }
        })?;
        if a.output.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print!("{}", report.render());
        }
        Ok(ExitCode::SUCCESS)
    }
}
