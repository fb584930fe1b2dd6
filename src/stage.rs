//! What a Rust stage is to the scheduler: a [`Stage`] says what it reads and writes, how it
//! divides its work, which section of the curation config it reads, what it needs besides the
//! lake, and runs; it answers a [`JobSummary`]. The scheduler (`jobs`) does the rest once for
//! every stage: the order, leases, skipping a stage whose inputs or repositories are missing,
//! the watermark of a stage over its inputs as a whole, progress and the run's record.
//!
//! A new stage is a module that implements [`Stage`] and one line in `jobs::stages::STAGES`.

use std::any::{Any, TypeId};
use std::collections::{BTreeMap, HashMap};

use anyhow::{bail, Result};
use async_trait::async_trait;
use serde::Serialize;

use crate::lake::Lake;

/// How a stage divides its work: what `_job_runs` records a row for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// By the values of a column (an hour file, a repository, a PR): the stage keeps its own
    /// watermark per unit and is called on every run.
    Column(&'static str),
    /// Its inputs as a whole: run again when any input's files or its config section changed.
    Whole,
}

/// What a stage needs besides the lake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// The git repositories (`--repo-url`): without them the stage is skipped (an error when
    /// it was asked for by name); with them the run holds a lease per repository it covers.
    Repositories,
}

/// A Rust stage of the pipeline. Its run need not be `Send`: the git stages hold libgit2
/// handles across awaits, and the scheduler awaits one job at a time.
#[async_trait(?Send)]
pub trait Stage: Send + Sync {
    /// Its name: the job's, and what `step =` says in a job file that declares it.
    fn name(&self) -> &'static str;
    /// One sentence for `swelake run --help` and `status`.
    fn description(&self) -> &'static str;
    /// Tables it reads (`gharchive` for ingest's hour files, which are not a table).
    fn inputs(&self) -> &'static [&'static str];
    /// Inputs that may not exist yet (read as empty tables of their schema file).
    fn optional_inputs(&self) -> &'static [&'static str] {
        &[]
    }
    /// Tables it writes; each has a schema file in `schemas/`.
    fn outputs(&self) -> &'static [&'static str];
    fn unit(&self) -> Unit;
    /// Jobs that run before it.
    fn depends_on(&self) -> &'static [&'static str] {
        &[]
    }
    /// The section of the curation config it reads (and a whole-input stage is fingerprinted
    /// by), read with [`StageCtx::config`].
    fn config_section(&self) -> Option<&'static str> {
        None
    }
    fn needs(&self) -> &'static [Need] {
        &[]
    }
    /// Why the stage does not run this time though it could (before any lease is taken).
    fn skip(&self, _ctx: &StageCtx<'_>) -> Option<String> {
        None
    }
    async fn run(&self, lake: &Lake, ctx: &StageCtx<'_>) -> Result<JobSummary>;
}

/// How the git stages reach the repositories.
#[derive(Debug, Clone)]
pub struct GitOptions {
    /// The repositories of prs_from_git, snapshots and relevance (its `show_progress` is
    /// the run's).
    pub scope: crate::git::Scope,
    /// Blobs larger than this are recorded without their content.
    pub max_blob_bytes: usize,
    /// Find merged PRs in git too (the prs_from_git job): `--discover-from-git`, the
    /// `[discovery]` config, or always with `--repos-file`.
    pub discover_prs: bool,
}

impl GitOptions {
    pub fn new(mirrors: crate::git::Mirrors) -> GitOptions {
        GitOptions { scope: crate::git::Scope::new(mirrors), max_blob_bytes: 1 << 20, discover_prs: false }
    }
}

/// Values by their type: a stage's options (ingest's source) and the curation config's
/// sections, each stage taking out what it reads without the scheduler knowing its types.
#[derive(Default)]
pub struct Extras(HashMap<TypeId, Box<dyn Any + Send + Sync>>);

impl Extras {
    pub fn insert<T: Any + Send + Sync>(&mut self, value: T) {
        self.0.insert(TypeId::of::<T>(), Box::new(value));
    }

    pub fn get<T: Any>(&self) -> Option<&T> {
        self.0.get(&TypeId::of::<T>()).and_then(|b| b.downcast_ref())
    }
}

/// What a stage's run is given besides the lake.
pub struct StageCtx<'a> {
    /// The job's name.
    pub job: &'a str,
    /// It was asked for by name (not as one of `--all`): what it needs and lacks is an error,
    /// not a reason to skip.
    pub named: bool,
    pub show_progress: bool,
    /// The repositories, for a stage that [`Need::Repositories`] (its scope shows progress
    /// when the run does).
    pub git: Option<&'a GitOptions>,
    pub extras: &'a Extras,
}

impl StageCtx<'_> {
    /// The stage's section of the curation config (its defaults when the run has none).
    pub fn config<T: Any + Default + Clone>(&self) -> T {
        match self.extras.get::<T>() {
            Some(c) => c.clone(),
            None => {
                // A section missing from `jobs::curation_sections!` would read as its defaults
                // whatever the file says: the test builds say so loudly.
                debug_assert!(
                    false,
                    "{}: its config section {} is not registered",
                    self.job,
                    std::any::type_name::<T>()
                );
                T::default()
            }
        }
    }

    /// The git scope with the run's progress bars.
    pub fn scope(&self) -> Result<crate::git::Scope> {
        match self.git {
            Some(g) => Ok(crate::git::Scope { show_progress: self.show_progress, ..g.scope.clone() }),
            None => bail!("the {} job needs --repo-url (where the git repositories are)", self.job),
        }
    }

    /// What a stage answers when a run lacks what it needs (`flag`): skipped with `why`, or
    /// an error when the stage was asked for by name.
    pub fn missing(&self, flag: &str, why: &str) -> Result<JobSummary> {
        if self.named {
            bail!("the {} job needs {flag} ({why})", self.job);
        }
        Ok(JobSummary::skipped(self.job, format!("no {flag} given ({why})")))
    }
}

/// What one job did, as printed by the CLI and recorded in `_job_runs`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct JobSummary {
    pub job: String,
    /// Input partitions processed in this run.
    pub partitions: Vec<String>,
    pub rows_out: u64,
    /// Extra figures a job reports (e.g. PRs with unknown merge state).
    pub notes: BTreeMap<String, i64>,
    /// Files written outside the lake's tables (the seed shards).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<String>,
    pub skipped_reason: Option<String>,
    pub seconds: f64,
}

impl JobSummary {
    pub fn named(job: &str) -> JobSummary {
        JobSummary { job: job.to_string(), ..Default::default() }
    }

    pub fn skipped(job: &str, reason: impl Into<String>) -> JobSummary {
        JobSummary { job: job.to_string(), skipped_reason: Some(reason.into()), ..Default::default() }
    }

    pub fn render(&self) -> String {
        if let Some(r) = &self.skipped_reason {
            return format!("{:<16} skipped: {r}\n", self.job);
        }
        let mut s = if self.partitions.is_empty() {
            format!("{:<16} up to date\n", self.job)
        } else {
            format!(
                "{:<16} {} partition(s) [{}] -> {} row(s) in {:.2}s\n",
                self.job,
                self.partitions.len(),
                abbreviate(&self.partitions),
                self.rows_out,
                self.seconds
            )
        };
        for (k, v) in &self.notes {
            s.push_str(&format!("{:<16}   {k}: {v}\n", ""));
        }
        s
    }
}

/// A list of partitions on one line: all of up to three, else the first and the last.
pub fn abbreviate(parts: &[String]) -> String {
    match parts.len() {
        0 => String::new(),
        1..=3 => parts.join(", "),
        n => format!("{} .. {} ({n})", parts[0], parts[n - 1]),
    }
}
