//! Scheduled, incremental jobs: declared in `jobs/*.toml`, run by `swelake run JOB` (with the
//! jobs it depends on) or `swelake run --all`, in dependency order.
//!
//! A job is a typed [`Step`]: an SQL file ([`sql_job`]) or one of the Rust stages. Each job
//! processes only what is new, and records it in `_job_runs` with a fingerprint of its input
//! files and of the config section it reads, which is the watermark: rerunning with nothing
//! new changes nothing, and changing the seed's settings reruns the seed, not the filters.
//! - A job partitioned by a column (`partition_key = "event_date"`) does the partitions of its
//!   driving input that it has not done yet or whose files changed (a re-ingested hour).
//! - A job over its inputs as a whole (`partition_key = "*"`) runs again when any input's
//!   files or its config section changed.
//! - The git stages and ingest keep their own finer watermark (an hour file, a PR) and are
//!   called every time.
//!
//! The job and SQL files are compiled in (so the binary works anywhere) and can be overridden
//! from a directory with `--jobs-dir`/`--sql-dir`. This is the layer that puts the curation
//! config's sections together ([`CurationConfig`]) and converts every stage's summary into a
//! [`JobSummary`].

pub mod sql_job;
pub mod status;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::filters::FilterConfig;
use crate::git::Mirrors;
use crate::lake::runs::{self, RunRecord};
use crate::lake::Lake;
use crate::relevance::RelevanceConfig;
use crate::seed::SeedConfig;

/// The curation config: the sections of the stages that read one.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CurationConfig {
    pub filters: FilterConfig,
    pub relevance: RelevanceConfig,
    pub seed: SeedConfig,
    /// How `status` and `report` judge whether the archive's hours are complete.
    pub completeness: crate::lake::hours::CompletenessConfig,
    /// Where merged PRs are found.
    pub discovery: DiscoveryConfig,
}

/// The `[discovery]` section: where merged PRs are found besides the archive.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DiscoveryConfig {
    /// Read merged PRs from git too (the prs_from_git job) for a lake fed by the archive.
    pub from_git: bool,
}

impl CurationConfig {
    /// The built-in config, or the file at `path` layered over it (a file names only what it
    /// changes; an unknown key is an error that names it).
    pub fn load(path: Option<&Path>) -> Result<CurationConfig> {
        let merged = crate::config::load(path)?;
        let origin = path.map_or("the built-in config".to_string(), |p| p.display().to_string());
        Ok(CurationConfig {
            filters: crate::config::section(&merged, "filters").with_context(|| origin.clone())?,
            relevance: crate::config::section(&merged, "relevance").with_context(|| origin.clone())?,
            seed: crate::config::section(&merged, "seed").with_context(|| origin.clone())?,
            completeness: crate::config::section(&merged, "completeness").with_context(|| origin.clone())?,
            discovery: crate::config::section(&merged, "discovery").with_context(|| origin.clone())?,
        })
    }

    /// A stable text of one section, for fingerprints.
    fn section_text(&self, section: Section) -> String {
        let v = match section {
            Section::Filters => serde_json::to_string(&self.filters),
            Section::Relevance => serde_json::to_string(&self.relevance),
            Section::Seed => serde_json::to_string(&self.seed),
        };
        v.expect("config sections serialise")
    }
}

/// A section of the curation config that a job reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Section {
    Filters,
    Relevance,
    Seed,
}

/// What a job does.
#[derive(Debug, Clone)]
pub enum Step {
    /// Runs an SQL file over the lake and writes its result.
    Sql(sql_job::SqlStep),
    /// GH Archive hour files into `events` (needs a source).
    Ingest,
    /// File snapshots from git (needs the repositories).
    Snapshots,
    /// Relevant-but-unchanged files (needs the repositories).
    Relevance,
    /// The seed dataset.
    Seed,
    /// Merged PRs read from git (needs the repositories, and discovery on).
    PrsFromGit,
}

impl Step {
    /// What `step =` says in a job file.
    pub fn name(&self) -> &'static str {
        match self {
            Step::Sql(_) => "sql",
            Step::Ingest => "ingest",
            Step::Snapshots => "snapshots",
            Step::Relevance => "relevance",
            Step::Seed => "seed",
            Step::PrsFromGit => "prs_from_git",
        }
    }

    /// For the Rust stages: the tables they write, their unit of work and their config section.
    fn contract(&self) -> Option<(Vec<&'static str>, Partitioning, Option<Section>)> {
        let col = |c: &str| Partitioning::Column(c.to_string());
        Some(match self {
            Step::Sql(_) => return None,
            Step::Ingest => (crate::ingest::OUTPUTS.to_vec(), col(crate::ingest::PARTITION_KEY), None),
            Step::Snapshots => (crate::snapshots::OUTPUTS.to_vec(), col(crate::snapshots::PARTITION_KEY), None),
            Step::Relevance => {
                (crate::relevance::OUTPUTS.to_vec(), col(crate::relevance::PARTITION_KEY), Some(Section::Relevance))
            }
            Step::Seed => (crate::seed::OUTPUTS.to_vec(), Partitioning::Whole, Some(Section::Seed)),
            Step::PrsFromGit => {
                (crate::prs::from_git::OUTPUTS.to_vec(), col(crate::prs::from_git::PARTITION_KEY), None)
            }
        })
    }
}

/// How a job divides its work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Partitioning {
    /// By the values of a column of its driving input (or the stage's own unit of work).
    Column(String),
    /// Its inputs as a whole (`partition_key = "*"`).
    Whole,
}

impl Partitioning {
    fn key(&self) -> &str {
        match self {
            Partitioning::Column(c) => c,
            Partitioning::Whole => "*",
        }
    }
}

/// A job declaration (`jobs/NAME.toml`), checked.
#[derive(Debug, Clone)]
pub struct JobSpec {
    pub name: String,
    pub description: String,
    pub step: Step,
    /// Tables the job reads.
    pub inputs: Vec<String>,
    /// Inputs that may not exist yet (read as empty tables of their schema file).
    pub optional_inputs: Vec<String>,
    /// Tables the job writes (an SQL job writes the first).
    pub outputs: Vec<String>,
    pub partitioning: Partitioning,
    pub depends_on: Vec<String>,
    /// The config section the job reads (and is fingerprinted by).
    pub config: Option<Section>,
}

/// A job file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JobFile {
    name: String,
    description: String,
    step: String,
    #[serde(default)]
    sql: Option<String>,
    #[serde(default)]
    inputs: Vec<String>,
    #[serde(default)]
    driving_input: Option<String>,
    partition_key: String,
    #[serde(default)]
    outputs: Vec<String>,
    #[serde(default)]
    depends_on: Vec<String>,
    #[serde(default)]
    optional_inputs: Vec<String>,
    #[serde(default)]
    also_due_when: Option<String>,
    #[serde(default)]
    write: Option<sql_job::WriteSpec>,
    #[serde(default)]
    config: Option<Section>,
    #[serde(default)]
    local_settings: BTreeMap<String, String>,
}

impl JobFile {
    fn into_spec(self) -> Result<JobSpec> {
        let name = self.name.clone();
        let partitioning = match self.partition_key.as_str() {
            "*" => Partitioning::Whole,
            c => Partitioning::Column(c.to_string()),
        };
        let step = match self.step.as_str() {
            "sql" => {
                let file = self.sql.clone().context("step `sql` needs `sql = \"FILE.sql\"`")?;
                let driving_input = self.driving_input.clone().context("step `sql` needs `driving_input`")?;
                let write = self.write.clone().context("step `sql` needs a [write] section")?;
                if self.outputs.is_empty() {
                    bail!("step `sql` needs `outputs` (it writes the first)");
                }
                if !self.inputs.contains(&driving_input) {
                    bail!("the driving input `{driving_input}` is not among `inputs`");
                }
                // A misspelt key or value fails when the file is read, not when the job runs.
                let mut probe = datafusion::config::ConfigOptions::new();
                for (key, value) in &self.local_settings {
                    probe.set(key, value).with_context(|| format!("local_settings: {key} = {value:?}"))?;
                }
                Step::Sql(sql_job::SqlStep {
                    file,
                    driving_input,
                    write,
                    also_due_when: self.also_due_when.clone(),
                    local_settings: self.local_settings.clone(),
                })
            }
            "ingest" => Step::Ingest,
            "snapshots" => Step::Snapshots,
            "relevance" => Step::Relevance,
            "seed" => Step::Seed,
            "prs_from_git" => Step::PrsFromGit,
            other => bail!("unknown step `{other}` (known: sql, ingest, prs_from_git, snapshots, relevance, seed)"),
        };
        let mut config = self.config;
        if let Some((outputs, unit, section)) = step.contract() {
            for (field, given) in [
                ("sql", self.sql.is_some()),
                ("driving_input", self.driving_input.is_some()),
                ("write", self.write.is_some()),
                ("also_due_when", self.also_due_when.is_some()),
                ("local_settings", !self.local_settings.is_empty()),
            ] {
                if given {
                    bail!("`{field}` is for SQL jobs; the {} step does not read it", step.name());
                }
            }
            let (have, want): (BTreeSet<&str>, BTreeSet<&str>) =
                (self.outputs.iter().map(String::as_str).collect(), outputs.iter().copied().collect());
            if have != want {
                bail!("`outputs` says {have:?}, but the {} step writes {want:?}", step.name());
            }
            if partitioning != unit {
                bail!(
                    "`partition_key` says {:?}, but the {} step works by {:?}",
                    self.partition_key,
                    step.name(),
                    unit.key()
                );
            }
            if config.is_some() && config != section {
                bail!("the {} step reads config section {section:?}, not {config:?}", step.name());
            }
            config = section;
        }
        for o in &self.optional_inputs {
            if !self.inputs.contains(o) {
                bail!("optional input `{o}` is not among `inputs`");
            }
        }
        Ok(JobSpec {
            name,
            description: self.description,
            step,
            inputs: self.inputs,
            optional_inputs: self.optional_inputs,
            outputs: self.outputs,
            partitioning,
            depends_on: self.depends_on,
            config,
        })
    }
}

const EMBEDDED_JOBS: &[(&str, &str)] = &[
    ("ingest", include_str!("../../jobs/ingest.toml")),
    ("pr_timeline", include_str!("../../jobs/pr_timeline.toml")),
    ("issues", include_str!("../../jobs/issues.toml")),
    ("prs_from_git", include_str!("../../jobs/prs_from_git.toml")),
    ("pull_requests", include_str!("../../jobs/pull_requests.toml")),
    ("pr_issue_links", include_str!("../../jobs/pr_issue_links.toml")),
    ("snapshots", include_str!("../../jobs/snapshots.toml")),
    ("filters", include_str!("../../jobs/filters.toml")),
    ("relevance", include_str!("../../jobs/relevance.toml")),
    ("seed", include_str!("../../jobs/seed.toml")),
];

const EMBEDDED_SQL: &[(&str, &str)] = &[
    ("pr_timeline.sql", include_str!("../../sql/pr_timeline.sql")),
    ("issues.sql", include_str!("../../sql/issues.sql")),
    ("pull_requests.sql", include_str!("../../sql/pull_requests.sql")),
    ("pr_issue_links.sql", include_str!("../../sql/pr_issue_links.sql")),
    ("pr_quality.sql", include_str!("../../sql/pr_quality.sql")),
];

fn parse_job(text: &str, origin: &str) -> Result<JobSpec> {
    let file: JobFile = toml::from_str(text).with_context(|| format!("parsing {origin}"))?;
    file.into_spec().with_context(|| format!("in {origin}"))
}

/// The declared jobs and their SQL.
#[derive(Debug, Clone)]
pub struct Registry {
    pub jobs: BTreeMap<String, JobSpec>,
    sql: BTreeMap<String, String>,
}

impl Registry {
    /// The built-in jobs, with files in `jobs_dir`/`sql_dir` (if given) taking precedence.
    pub fn load(jobs_dir: Option<&Path>, sql_dir: Option<&Path>) -> Result<Registry> {
        let mut jobs = BTreeMap::new();
        for (name, text) in EMBEDDED_JOBS {
            let spec = parse_job(text, &format!("jobs/{name}.toml"))?;
            jobs.insert(spec.name.clone(), spec);
        }
        if let Some(dir) = jobs_dir {
            for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
                let path = entry?.path();
                if path.extension().is_some_and(|e| e == "toml") {
                    let text = std::fs::read_to_string(&path)?;
                    let spec = parse_job(&text, &path.display().to_string())?;
                    jobs.insert(spec.name.clone(), spec);
                }
            }
        }
        let mut sql: BTreeMap<String, String> =
            EMBEDDED_SQL.iter().map(|(n, t)| (n.to_string(), t.to_string())).collect();
        if let Some(dir) = sql_dir {
            for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
                let path: PathBuf = entry?.path();
                if path.extension().is_some_and(|e| e == "sql") {
                    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
                    sql.insert(name, std::fs::read_to_string(&path)?);
                }
            }
        }
        let r = Registry { jobs, sql };
        r.validate()?;
        Ok(r)
    }

    fn validate(&self) -> Result<()> {
        for j in self.jobs.values() {
            for d in &j.depends_on {
                if !self.jobs.contains_key(d) {
                    bail!("job `{}` depends on unknown job `{d}`", j.name);
                }
            }
            if let Step::Sql(s) = &j.step {
                if !self.sql.contains_key(&s.file) {
                    bail!("job `{}`: no SQL file `{}`", j.name, s.file);
                }
            }
        }
        self.order(&self.jobs.keys().cloned().collect::<Vec<_>>()).map(|_| ())
    }

    pub fn sql(&self, file: &str) -> Option<&str> {
        self.sql.get(file).map(|s| s.as_str())
    }

    /// `wanted` and everything they depend on, dependencies first.
    pub fn order(&self, wanted: &[String]) -> Result<Vec<String>> {
        let mut out = Vec::new();
        let mut state: BTreeMap<String, u8> = BTreeMap::new();
        fn visit(r: &Registry, name: &str, state: &mut BTreeMap<String, u8>, out: &mut Vec<String>) -> Result<()> {
            match state.get(name) {
                Some(2) => return Ok(()),
                Some(1) => bail!("jobs depend on each other in a cycle through `{name}`"),
                _ => {}
            }
            let Some(job) = r.jobs.get(name) else {
                bail!("no job `{name}` (known: {})", r.jobs.keys().cloned().collect::<Vec<_>>().join(", "));
            };
            state.insert(name.to_string(), 1);
            for d in &job.depends_on {
                visit(r, d, state, out)?;
            }
            state.insert(name.to_string(), 2);
            out.push(name.to_string());
            Ok(())
        }
        for w in wanted {
            visit(self, w, &mut state, &mut out)?;
        }
        Ok(out)
    }

    /// The job that writes `table`, if any.
    pub fn writer_of(&self, table: &str) -> Option<&JobSpec> {
        self.jobs.values().find(|j| j.outputs.iter().any(|o| o == table))
    }
}

/// How the git stages reach the repositories.
#[derive(Debug, Clone)]
pub struct GitOptions {
    pub mirrors: Mirrors,
    /// Snapshot only these repositories.
    pub repos: Option<Vec<String>>,
    /// Blobs larger than this are recorded without their content.
    pub max_blob_bytes: usize,
    /// Redo work that is already done (snapshots, relevance).
    pub force: bool,
    /// Repositories (snapshots) or encoder threads (relevance) at once.
    pub threads: usize,
    /// Find merged PRs in git too (the prs_from_git job): `--discover-from-git`, the
    /// `[discovery]` config, or always with `--repos-file`.
    pub discover_prs: bool,
    /// Only the repositories of this shard (`--shard I/N`): N workers together cover every
    /// repository exactly once.
    pub shard: Option<crate::git::Shard>,
}

impl GitOptions {
    pub fn new(mirrors: Mirrors) -> GitOptions {
        GitOptions {
            mirrors,
            repos: None,
            max_blob_bytes: 1 << 20,
            force: false,
            threads: 2,
            discover_prs: false,
            shard: None,
        }
    }

    /// What a git stage's run holds a lease on: its repositories, its shard, or everything.
    fn lease_keys(&self) -> Vec<String> {
        match (&self.repos, &self.shard) {
            (Some(r), _) => r.clone(),
            (None, Some(s)) => vec![s.lease_key()],
            (None, None) => vec!["__all__".to_string()],
        }
    }
}

/// Options of `swelake run`.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Only input partitions at or after this partition value (e.g. a date `2025-01-06`).
    pub since: Option<String>,
    /// Only input partitions at or before this partition value.
    pub until: Option<String>,
    /// Source for the ingest job; without it ingest is skipped.
    pub ingest: Option<crate::ingest::IngestOptions>,
    /// Where the git repositories are, for snapshots and relevance; without it they are
    /// skipped.
    pub git: Option<GitOptions>,
    /// Running every job (`--all`): jobs that cannot run (ingest without a source) are
    /// skipped instead of being an error.
    pub all: bool,
    /// Curation settings (filters, relevance, seed).
    pub curation: CurationConfig,
    /// How long to wait for inputs another run of the same job holds (`None`: fail at once
    /// with [`crate::lake::lease::Busy`]).
    pub lease_wait: Option<std::time::Duration>,
    pub show_progress: bool,
    /// Where the SQL jobs run: here, or on a Ballista cluster.
    pub engine: crate::distributed::Engine,
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
    fn named(job: &str) -> JobSummary {
        JobSummary { job: job.to_string(), ..Default::default() }
    }

    fn skipped(job: &str, reason: impl Into<String>) -> JobSummary {
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

fn abbreviate(parts: &[String]) -> String {
    match parts.len() {
        0 => String::new(),
        1..=3 => parts.join(", "),
        n => format!("{} .. {} ({n})", parts[0], parts[n - 1]),
    }
}

impl From<crate::ingest::IngestSummary> for JobSummary {
    fn from(s: crate::ingest::IngestSummary) -> JobSummary {
        JobSummary {
            partitions: s.files.iter().filter(|f| !f.skipped).map(|f| f.key.clone()).collect(),
            rows_out: s.events_written,
            notes: BTreeMap::from([("rejected_lines".to_string(), s.rejected as i64)]),
            ..Default::default()
        }
    }
}

impl From<crate::snapshots::SnapshotSummary> for JobSummary {
    fn from(s: crate::snapshots::SnapshotSummary) -> JobSummary {
        let mut notes = BTreeMap::from([
            ("prs_snapshotted".to_string(), s.prs_snapshotted as i64),
            ("prs_already_done".to_string(), s.prs_already_done as i64),
            ("prs_failed".to_string(), s.prs_failed as i64),
            ("files".to_string(), s.files as i64),
            ("new_blobs".to_string(), s.new_blobs as i64),
        ]);
        for (reason, n) in &s.failures_by_reason {
            notes.insert(format!("failed:{reason}"), *n as i64);
        }
        let mut partitions = s.repos_processed.clone();
        partitions.sort();
        JobSummary { partitions, rows_out: s.files as u64, notes, ..Default::default() }
    }
}

impl From<crate::prs::from_git::GitPrSummary> for JobSummary {
    fn from(s: crate::prs::from_git::GitPrSummary) -> JobSummary {
        let mut notes = BTreeMap::from([
            ("repos_unchanged".to_string(), s.repos_unchanged as i64),
            ("commits_read".to_string(), s.commits as i64),
            ("prs_found".to_string(), s.prs as i64),
            ("prs_new_or_changed".to_string(), s.prs_new_or_changed as i64),
            ("numbers_claimed_twice".to_string(), s.ambiguous as i64),
        ]);
        for (k, v) in &s.prs_by_kind {
            notes.insert(format!("kind:{k}"), *v as i64);
        }
        for (k, v) in &s.failures_by_reason {
            notes.insert(format!("failed:{k}"), *v as i64);
        }
        if s.commits > 0 {
            notes.insert("ms_per_1000_commits".to_string(), (s.scan_seconds * 1e6 / s.commits as f64).round() as i64);
        }
        JobSummary { partitions: s.repos_scanned, rows_out: s.prs as u64, notes, ..Default::default() }
    }
}

impl From<crate::relevance::RelevanceSummary> for JobSummary {
    fn from(s: crate::relevance::RelevanceSummary) -> JobSummary {
        let mut notes = BTreeMap::from([
            ("prs_ranked".to_string(), s.prs as i64),
            ("prs_already_done".to_string(), s.prs_already_done as i64),
            ("candidates".to_string(), s.candidates as i64),
            ("chunks_embedded".to_string(), s.embedded_chunks as i64),
            ("embedding_cache_hit_percent".to_string(), (100.0 * s.embedding_cache_hit_rate).round() as i64),
            ("training_cases".to_string(), s.training_cases as i64),
            ("fit_ms".to_string(), (1000.0 * s.fit_seconds).round() as i64),
            ("fits_reused".to_string(), s.fits_reused as i64),
            ("rank_ms".to_string(), (1000.0 * s.rank_seconds).round() as i64),
        ]);
        for (k, v) in &s.failures {
            notes.insert(format!("failed:{k}"), *v as i64);
        }
        let partitions = if s.prs > 0 { vec![format!("{} PR(s)", s.prs)] } else { Vec::new() };
        JobSummary { partitions, rows_out: s.rows as u64, notes, ..Default::default() }
    }
}

impl From<crate::seed::SeedSummary> for JobSummary {
    fn from(s: crate::seed::SeedSummary) -> JobSummary {
        let mut notes = BTreeMap::from([
            ("instances".to_string(), s.instances as i64),
            ("train".to_string(), s.train as i64),
            ("test".to_string(), s.test as i64),
            ("excluded_by_split".to_string(), s.excluded as i64),
            ("shards".to_string(), s.shards.len() as i64),
            ("relevant_files_dropped_for_budget".to_string(), s.relevant_files_dropped_for_budget as i64),
            ("mean_prompt_tokens".to_string(), s.mean_prompt_tokens.round() as i64),
        ]);
        for (k, v) in &s.rejected {
            notes.insert(format!("rejected:{k}"), *v as i64);
        }
        JobSummary { rows_out: s.instances as u64, notes, files: s.shards, ..Default::default() }
    }
}

/// Runs `wanted` jobs (and their dependencies) in order; the first job that fails ends the
/// run with its error.
pub async fn run(lake: &Lake, registry: &Registry, wanted: &[String], opts: &RunOptions) -> Result<Vec<JobSummary>> {
    let report = run_report(lake, registry, wanted, opts).await?;
    match report.failure {
        Some(e) => Err(e),
        None => Ok(report.jobs),
    }
}

/// What a run did: the summaries of the jobs that ran or were skipped, and the error of the
/// job that failed (the run stops there).
#[derive(Debug)]
pub struct RunReport {
    pub jobs: Vec<JobSummary>,
    /// The failed job's name and error.
    pub failed_job: Option<String>,
    pub failure: Option<anyhow::Error>,
    /// Jobs that were due but did not run because an earlier one failed.
    pub not_run: Vec<String>,
}

/// [`run`], keeping the summaries of the jobs done before a failure: what a scheduler reports.
/// Only an invalid request (an unknown job) is an `Err`.
pub async fn run_report(lake: &Lake, registry: &Registry, wanted: &[String], opts: &RunOptions) -> Result<RunReport> {
    let order = registry.order(wanted)?;
    let mut out: Vec<JobSummary> = Vec::new();
    let explicitly: BTreeSet<&String> = if opts.all { BTreeSet::new() } else { wanted.iter().collect() };
    for (i, name) in order.iter().enumerate() {
        let job = &registry.jobs[name];
        let started = std::time::Instant::now();
        match run_one(lake, registry, job, opts, &explicitly, &out).await {
            Ok(mut summary) => {
                summary.job = name.clone();
                summary.seconds = started.elapsed().as_secs_f64();
                tracing::info!(job = %name, partitions = summary.partitions.len(), rows = summary.rows_out, "job done");
                out.push(summary);
            }
            Err(e) => {
                let message = crate::lake::store::redact(&format!("{e:#}"));
                if e.downcast_ref::<crate::lake::lease::Busy>().is_none() {
                    let mut rec = RunRecord::ok(name, "__run", 0, 0, 0, None, serde_json::json!({"error": message}))
                        .timed(started.elapsed().as_secs_f64());
                    rec.status = "failed".to_string();
                    if let Err(re) = runs::record(lake, rec).await {
                        tracing::warn!(job = %name, error = %format!("{re:#}"), "could not record the failure");
                    }
                }
                return Ok(RunReport {
                    jobs: out,
                    failed_job: Some(name.clone()),
                    failure: Some(e),
                    not_run: order[i + 1..].to_vec(),
                });
            }
        }
    }
    Ok(RunReport { jobs: out, failed_job: None, failure: None, not_run: Vec::new() })
}

async fn run_one(
    lake: &Lake,
    registry: &Registry,
    job: &JobSpec,
    opts: &RunOptions,
    explicitly: &BTreeSet<&String>,
    out: &[JobSummary],
) -> Result<JobSummary> {
    let name = job.name.clone();
    {
        let needs = |flag: &str, why: &str| -> Result<JobSummary> {
            if explicitly.contains(&name) {
                bail!("the {name} job needs {flag} ({why})");
            }
            Ok(JobSummary::skipped(&name, format!("no {flag} given ({why})")))
        };
        let summary = match missing_input(lake, registry, job, out).await? {
            Some(reason) if !matches!(job.step, Step::Sql(_)) => JobSummary::skipped(&name, reason),
            _ => match &job.step {
                Step::Sql(step) => {
                    sql_job::run(lake, registry, job, step, opts).await.with_context(|| format!("job `{name}`"))?
                }
                Step::Ingest => match &opts.ingest {
                    Some(io) => {
                        let s = crate::ingest::run(lake, io).await?;
                        if !s.ok() {
                            bail!("ingest had {} failed file(s); see the summary above", s.files_failed);
                        }
                        JobSummary::from(s)
                    }
                    None => needs("--source", "the lake's events are used as they are")?,
                },
                Step::Snapshots => match &opts.git {
                    Some(g) => {
                        let so = crate::snapshots::SnapshotOptions {
                            mirrors: g.mirrors.clone(),
                            repos: g.repos.clone(),
                            max_blob_bytes: g.max_blob_bytes,
                            jobs: g.threads,
                            force: g.force,
                            show_progress: opts.show_progress,
                            shard: g.shard,
                        };
                        let keys = g.lease_keys();
                        let work = crate::snapshots::run(lake, &so);
                        JobSummary::from(lake.with_leases(&name, &keys, opts.lease_wait, work).await?)
                    }
                    None => needs("--repo-url", "where the git repositories are")?,
                },
                Step::Relevance => match &opts.git {
                    Some(g) => {
                        let ro = crate::relevance::RelevanceOptions {
                            mirrors: g.mirrors.clone(),
                            config: opts.curation.relevance.clone(),
                            force: g.force,
                            threads: g.threads,
                            show_progress: opts.show_progress,
                            shard: g.shard,
                        };
                        let keys = g.lease_keys();
                        let work = crate::relevance::run(lake, &ro);
                        JobSummary::from(lake.with_leases(&name, &keys, opts.lease_wait, work).await?)
                    }
                    None => needs("--repo-url", "where the git repositories are")?,
                },
                Step::PrsFromGit => match &opts.git {
                    Some(g) if g.discover_prs || explicitly.contains(&name) => {
                        let o = crate::prs::from_git::GitPrOptions {
                            mirrors: g.mirrors.clone(),
                            repos: g.repos.clone(),
                            force: g.force,
                            threads: g.threads,
                            show_progress: opts.show_progress,
                            shard: g.shard,
                        };
                        let keys = g.lease_keys();
                        let work = crate::prs::from_git::run(lake, &o);
                        JobSummary::from(lake.with_leases(&name, &keys, opts.lease_wait, work).await?)
                    }
                    Some(_) => JobSummary::skipped(
                        &name,
                        "finding PRs in git is off for lakes fed by the archive (--discover-from-git or \
                         [discovery] from_git = true; always on with --repos-file)",
                    ),
                    None => needs("--repo-url", "where the git repositories are")?,
                },
                Step::Seed => {
                    let so = crate::seed::SeedOptions { config: opts.curation.seed.clone() };
                    whole(lake, job, opts, || async { Ok(JobSummary::from(crate::seed::run(lake, &so).await?)) })
                        .await?
                }
            },
        };
        Ok(summary)
    }
}

/// The first required input of `job` that does not exist, with why (the job that writes it
/// was skipped in this run, when it was).
async fn missing_input(lake: &Lake, registry: &Registry, job: &JobSpec, done: &[JobSummary]) -> Result<Option<String>> {
    let mut missing = None;
    for t in &job.inputs {
        if !job.optional_inputs.contains(t) && is_table(t) && !lake.has_table(t).await? {
            missing = Some(t);
            break;
        }
    }
    let Some(t) = missing else { return Ok(None) };
    let why = registry
        .writer_of(t)
        .and_then(|w| done.iter().find(|s| s.job == w.name))
        .and_then(|s| s.skipped_reason.as_ref().map(|r| format!(" (the {} job was skipped: {r})", s.job)));
    Ok(Some(format!("no `{t}` table yet{}", why.unwrap_or_default())))
}

/// Whether an input names a lake table (ingest's `gharchive` names the source).
fn is_table(name: &str) -> bool {
    crate::schema::arrow(name).is_ok()
}

/// One fingerprint of the current files of `inputs` (those that exist) and of `extra`.
pub async fn inputs_fingerprint(lake: &Lake, inputs: &[String], extra: &str) -> Result<String> {
    let mut h = crate::hash::fnv1a(extra.bytes(), crate::hash::OFFSET);
    for name in inputs {
        if lake.has_table(name).await? {
            let t = lake.open_table(name).await?;
            for (_, fp) in sql_job::partition_fingerprints(&t, "__none__")? {
                h = crate::hash::fnv1a(name.bytes().chain(fp.bytes()), h);
            }
        }
    }
    Ok(format!("{h:016x}"))
}

/// The watermark of a job over its inputs as a whole: the fingerprint of their files and of
/// the config section the job reads.
async fn whole_fingerprint(lake: &Lake, job: &JobSpec, opts: &RunOptions) -> Result<String> {
    let section = job.config.map(|s| opts.curation.section_text(s)).unwrap_or_default();
    inputs_fingerprint(lake, &job.inputs, &section).await
}

/// Runs a Rust step over its inputs as a whole, unless nothing it reads changed since its last
/// successful run; records the run.
async fn whole<F, Fut>(lake: &Lake, job: &JobSpec, opts: &RunOptions, step: F) -> Result<JobSummary>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<JobSummary>>,
{
    const ALL: &str = "__all__";
    let fingerprint = whole_fingerprint(lake, job, opts).await?;
    let is_done = |done: &HashMap<String, RunRecord>| {
        done.get(ALL).and_then(|r| r.detail.get("fingerprint")).and_then(|v| v.as_str()) == Some(fingerprint.as_str())
    };
    if is_done(&runs::latest_ok(lake, &job.name).await?) {
        return Ok(JobSummary::named(&job.name));
    }
    lake.with_leases(&job.name, &[ALL.to_string()], opts.lease_wait, async {
        if is_done(&runs::latest_ok(lake, &job.name).await?) {
            return Ok(JobSummary::named(&job.name));
        }
        whole_held(lake, job, fingerprint.clone(), step).await
    })
    .await
}

async fn whole_held<F, Fut>(lake: &Lake, job: &JobSpec, fingerprint: String, step: F) -> Result<JobSummary>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<JobSummary>>,
{
    const ALL: &str = "__all__";
    let mut s = step().await?;
    let detail = serde_json::json!({"fingerprint": fingerprint, "files": s.files});
    let rejected = s.notes.iter().filter(|(k, _)| k.starts_with("rejected:")).map(|(_, v)| *v as u64).sum();
    runs::record(lake, RunRecord::ok(&job.name, ALL, 0, s.rows_out, rejected, None, detail)).await?;
    s.partitions = vec![ALL.to_string()];
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(text: &str) -> Result<JobSpec> {
        parse_job(text, "test.toml")
    }

    #[test]
    fn built_in_jobs_parse_into_typed_steps() {
        let r = Registry::load(None, None).unwrap();
        assert!(matches!(r.jobs["ingest"].step, Step::Ingest));
        assert!(matches!(r.jobs["seed"].step, Step::Seed));
        assert_eq!(r.jobs["seed"].partitioning, Partitioning::Whole);
        assert_eq!(r.jobs["seed"].config, Some(Section::Seed));
        assert_eq!(r.jobs["filters"].config, Some(Section::Filters));
        assert_eq!(r.jobs["pr_timeline"].config, None);
        match &r.jobs["pr_timeline"].step {
            Step::Sql(s) => assert_eq!(s.driving_input, "events"),
            other => panic!("{other:?}"),
        }
        assert_eq!(r.writer_of("pr_files").unwrap().name, "snapshots");
    }

    #[test]
    fn a_job_file_must_agree_with_its_step() {
        let base = "name = \"x\"\ndescription = \"d\"\n";
        let e = job(&format!("{base}step = \"rust:seed\"\npartition_key = \"*\"\n")).unwrap_err();
        assert!(format!("{e:#}").contains("unknown step `rust:seed`"), "{e:#}");
        let e = job(&format!("{base}step = \"seed\"\npartition_key = \"*\"\noutputs = [\"rl_seed\"]\n")).unwrap_err();
        assert!(format!("{e:#}").contains("the seed step writes"), "{e:#}");
        let e = job(&format!(
            "{base}step = \"seed\"\npartition_key = \"pr\"\noutputs = [\"rl_seed\", \"seed_rejections\"]\n"
        ))
        .unwrap_err();
        assert!(format!("{e:#}").contains("works by \"*\""), "{e:#}");
        let e = job(&format!("{base}step = \"ingest\"\npartition_key = \"hour\"\noutputs = [\"events\", \"events_rejected\", \"source_hours\"]\nsql = \"a.sql\"\n")).unwrap_err();
        assert!(format!("{e:#}").contains("`sql` is for SQL jobs"), "{e:#}");
        let e = job(&format!("{base}step = \"ingest\"\npartition_key = \"hour\"\nouputs = []\n")).unwrap_err();
        assert!(format!("{e:#}").contains("unknown field `ouputs`"), "{e:#}");
        let ok = job(&format!(
            "{base}step = \"ingest\"\npartition_key = \"hour\"\noutputs = [\"source_hours\", \"events_rejected\", \"events\"]\n"
        ));
        assert!(ok.is_ok(), "{ok:?}");
        let e = job(&format!("{base}step = \"ingest\"\npartition_key = \"hour\"\noutputs = [\"source_hours\", \"events_rejected\", \"events\"]\n[local_settings]\n\"datafusion.optimizer.repartition_joins\" = \"false\"\n")).unwrap_err();
        assert!(format!("{e:#}").contains("`local_settings` is for SQL jobs"), "{e:#}");
        let sql = format!("{base}step = \"sql\"\nsql = \"a.sql\"\ninputs = [\"events\"]\ndriving_input = \"events\"\npartition_key = \"event_date\"\noutputs = [\"t\"]\n[write]\nmode = \"replace_partitions\"\n[local_settings]\n");
        let e = job(&format!("{sql}\"datafusion.optimizer.repartition_join\" = \"false\"\n")).unwrap_err();
        assert!(format!("{e:#}").contains("local_settings: datafusion.optimizer.repartition_join"), "{e:#}");
        let e = job(&format!("{sql}\"datafusion.optimizer.repartition_joins\" = \"no\"\n")).unwrap_err();
        assert!(format!("{e:#}").contains("local_settings"), "{e:#}");
        let ok = job(&format!("{sql}\"datafusion.optimizer.repartition_joins\" = \"false\"\n")).unwrap();
        match ok.step {
            Step::Sql(s) => assert_eq!(s.local_settings["datafusion.optimizer.repartition_joins"], "false"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn fingerprints_read_only_their_own_config_section() {
        let mut a = CurationConfig::default();
        let before = (a.section_text(Section::Filters), a.section_text(Section::Seed));
        a.seed.max_prompt_tokens += 1;
        assert_eq!(a.section_text(Section::Filters), before.0, "a seed setting does not touch the filters");
        assert_ne!(a.section_text(Section::Seed), before.1);
    }

    #[test]
    fn a_user_config_is_layered_over_the_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("mine.toml");
        std::fs::write(&p, "[seed]\nmax_prompt_tokens = 9000\n").unwrap();
        let c = CurationConfig::load(Some(&p)).unwrap();
        assert_eq!(c.seed.max_prompt_tokens, 9000);
        assert_eq!(c.filters.max_files, CurationConfig::default().filters.max_files);
        std::fs::write(&p, "[filters]\nmax_file = 3\n").unwrap();
        let e = CurationConfig::load(Some(&p)).unwrap_err();
        assert!(format!("{e:#}").contains("unknown key `filters.max_file`"), "{e:#}");
    }
}
