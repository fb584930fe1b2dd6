//! The flags several commands share, each defined once here and flattened into the commands
//! that take it (`#[command(flatten)]`), so a flag has one spelling, one help text and one
//! parser everywhere (ripgrep keeps its flags in one place the same way). A command that needs
//! a shared flag required or optional where it is not by default says so with `mut_arg` on its
//! own variant in `cli/mod.rs`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;

use super::Ctx;
use crate::lake::Lake;

/// `--lake`: where the tables are.
#[derive(Args, Debug, Clone)]
pub(crate) struct LakeArg {
    /// Lake: a directory (created if missing) or s3://bucket/prefix, gs://…, az://…, file://…
    #[arg(long, value_name = "LAKE", required = true)]
    lake: Option<String>,
}

impl LakeArg {
    /// The location given (clap makes it present wherever it is required).
    pub(crate) fn location(&self) -> Result<&str> {
        self.lake.as_deref().context("--lake LAKE is needed")
    }

    /// The lake, opened with the command line's store options.
    pub(crate) fn open(&self, ctx: &Ctx) -> Result<Lake> {
        ctx.open(self.location()?)
    }

    /// Whether one was given (where it is optional).
    pub(crate) fn given(&self) -> bool {
        self.lake.is_some()
    }
}

/// `--config`: the curation config.
#[derive(Args, Debug, Clone, Default)]
pub(crate) struct ConfigArg {
    /// The curation config (TOML): filters, discovery, relevance, seed, and how archive hours are
    /// judged ([completeness]); what makes jobs due [default: the built-in config/curation.toml].
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

impl ConfigArg {
    pub(crate) fn path(&self) -> Option<&Path> {
        self.config.as_deref()
    }

    pub(crate) fn load(&self) -> Result<crate::jobs::CurationConfig> {
        crate::jobs::CurationConfig::load(self.path())
    }
}

/// `--jobs-dir`, `--sql-dir`: where the job declarations and their SQL are.
#[derive(Args, Debug, Clone, Default)]
pub(crate) struct JobsArgs {
    /// Read job declarations from this directory (overrides the built-in jobs/).
    #[arg(long, value_name = "DIR")]
    jobs_dir: Option<PathBuf>,
    /// Read SQL files from this directory (overrides the built-in sql/).
    #[arg(long, value_name = "DIR")]
    sql_dir: Option<PathBuf>,
}

impl JobsArgs {
    pub(crate) fn registry(&self) -> Result<crate::jobs::Registry> {
        crate::jobs::Registry::load(self.jobs_dir.as_deref(), self.sql_dir.as_deref())
    }
}

/// `--json`: the output for scripts.
#[derive(Args, Debug, Clone, Copy, Default)]
pub(crate) struct OutputArg {
    /// Print the result as JSON (one object, on one line where a scheduler reads it) instead of
    /// text; its shape is in the command's help below.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `--repo-url`, `--cache-dir`: where the git repositories are.
#[derive(Args, Debug, Clone, Default)]
pub(crate) struct RepoArgs {
    /// Where the git repositories are, with {repo} for owner/name: file:///mirrors/{repo}.git,
    /// /srv/git/{repo}, https://github.com/{repo}.git
    #[arg(long, value_name = "URL")]
    repo_url: Option<String>,
    /// Directory of the bare git mirrors kept between runs [default: ~/.cache/swelake/mirrors].
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
}

impl RepoArgs {
    /// The URL, where the command needs one (clap makes it present where it is required).
    pub(crate) fn required_url(&self) -> Result<String> {
        self.repo_url.clone().context("--repo-url URL is needed")
    }

    pub(crate) fn cache_dir(&self) -> PathBuf {
        self.cache_dir.clone().unwrap_or_else(crate::git::default_cache_dir)
    }

    /// The mirrors of the repositories, if `--repo-url` was given.
    pub(crate) fn mirrors(&self) -> Option<crate::git::Mirrors> {
        self.repo_url.clone().map(|url| crate::git::Mirrors::new(url, self.cache_dir()))
    }
}

/// `--repos`, `--repos-file`, `--shard`: which repositories the git stages work on.
#[derive(Args, Debug, Clone, Default)]
pub(crate) struct ScopeArgs {
    /// Only these repositories (comma-separated owner/name).
    #[arg(long, value_delimiter = ',', value_name = "OWNER/NAME,…")]
    repos: Vec<String>,
    /// The lake's repositories, one owner/name per line (# comments): they are mirrored and
    /// their merged PRs found in git (prs_from_git), with or without GH Archive. Needs
    /// --repo-url.
    #[arg(long, value_name = "FILE", requires = "repo_url")]
    repos_file: Option<PathBuf>,
    /// Git stages (prs_from_git, snapshots, relevance) on this shard's repositories only:
    /// I/N with 0 <= I < N. N workers with 0/N … N-1/N cover every repository exactly once
    /// (by a stable hash of owner/name) and commit to the same tables; blobs that several
    /// repositories share are stored once. E.g. a Kubernetes indexed Job:
    /// --shard $JOB_COMPLETION_INDEX/N.
    #[arg(long, value_name = "I/N")]
    shard: Option<crate::git::Shard>,
}

impl ScopeArgs {
    /// `--repos` and the repositories of `--repos-file`, sorted and once each; `None` for
    /// every repository of the lake.
    pub(crate) fn repos(&self) -> Result<Option<Vec<String>>> {
        let mut repos = self.repos.clone();
        if let Some(f) = &self.repos_file {
            repos.extend(read_repos_file(f)?);
            repos.sort();
            repos.dedup();
        }
        Ok((!repos.is_empty()).then_some(repos))
    }

    /// Whether the lake's repositories were listed in a file (then their PRs come from git).
    pub(crate) fn has_repos_file(&self) -> bool {
        self.repos_file.is_some()
    }

    pub(crate) fn shard(&self) -> Option<crate::git::Shard> {
        self.shard
    }
}

/// The repositories of a `--repos-file`: one `owner/name` per line; blank lines and `#`
/// comments are skipped; anything else is an error that names the line.
fn read_repos_file(path: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading --repos-file {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let l = line.split('#').next().unwrap_or("").trim();
        if l.is_empty() {
            continue;
        }
        let ok = l.split('/').count() == 2
            && l.split('/').all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)));
        if !ok {
            bail!("{}:{}: {l:?} is not a repository (owner/name)", path.display(), i + 1);
        }
        out.push(l.to_string());
    }
    if out.is_empty() {
        bail!("--repos-file {} names no repository", path.display());
    }
    Ok(out)
}

/// `--lake`, `--repo-url`, `--grade-jobs`: a grader of completions by their instances' tests.
#[derive(Args, Debug, Clone, Default)]
pub(crate) struct GradeArgs {
    /// A lake whose verified instances grade completions by running their tests (with
    /// --repo-url); its seed shards are the default --seed-shards.
    #[arg(long, value_name = "LAKE")]
    pub(crate) lake: Option<String>,
    #[command(flatten)]
    pub(crate) repo: RepoArgs,
    /// Gradings at once, each in a sandbox of its own [default: [verify] jobs, else the cores].
    #[arg(long, value_name = "N")]
    pub(crate) grade_jobs: Option<usize>,
    #[command(flatten)]
    pub(crate) config: ConfigArg,
}

impl GradeArgs {
    /// The grader, when a lake was given.
    pub(crate) async fn open(&self, ctx: &Ctx) -> Result<Option<crate::verify::grade::Grader>> {
        let Some(location) = &self.lake else { return Ok(None) };
        let lake = ctx.open(location)?;
        let cfg = self.config.load()?.verify;
        let mirrors = crate::git::Mirrors::new(self.repo.required_url()?, self.repo.cache_dir());
        let g = crate::verify::grade::Grader::open(&lake, mirrors, cfg, self.grade_jobs.unwrap_or(0)).await?;
        eprintln!(
            "grading against {} verified instance(s) of {location}, {} at once; sandbox: {}",
            g.instance_count(),
            g.jobs(),
            g.sandbox_bounds()
        );
        Ok(Some(g))
    }

    /// The lake's seed shards, where they are by default.
    pub(crate) fn seed_shards(&self) -> Option<String> {
        self.lake.as_ref().map(|l| format!("{}/shards/seed/part-*.parquet", l.trim_end_matches('/')))
    }
}
