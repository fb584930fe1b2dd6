//! The job declarations: the SQL jobs (`jobs/*.toml`, compiled in or read from `--jobs-dir`,
//! with their SQL files) and the Rust stages of [`super::stages::STAGES`]; what each job reads,
//! writes and runs, and the order they run in.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use super::{sql_job, stages, CurationConfig};
use crate::stage::{Stage, Unit};

/// What a job does.
#[derive(Clone)]
pub enum Step {
    /// Runs an SQL file over the lake and writes its result.
    Sql(sql_job::SqlStep),
    /// One of the Rust stages.
    Stage(&'static dyn Stage),
}

impl std::fmt::Debug for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::Sql(s) => f.debug_tuple("Sql").field(s).finish(),
            Step::Stage(s) => f.debug_tuple("Stage").field(&s.name()).finish(),
        }
    }
}

impl Step {
    /// What `step =` says in a job file.
    pub fn name(&self) -> &'static str {
        match self {
            Step::Sql(_) => "sql",
            Step::Stage(s) => s.name(),
        }
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
    pub(crate) fn of(unit: Unit) -> Partitioning {
        match unit {
            Unit::Column(c) => Partitioning::Column(c.to_string()),
            Unit::Whole => Partitioning::Whole,
        }
    }

    fn key(&self) -> &str {
        match self {
            Partitioning::Column(c) => c,
            Partitioning::Whole => "*",
        }
    }
}

/// A job declaration (`jobs/NAME.toml`, or a stage's own), checked.
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
    /// The section of the curation config the job reads (and is fingerprinted by).
    pub config: Option<String>,
}

impl JobSpec {
    /// A Rust stage's declaration of itself.
    pub fn of_stage(stage: &'static dyn Stage) -> JobSpec {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        JobSpec {
            name: stage.name().to_string(),
            description: stage.description().to_string(),
            step: Step::Stage(stage),
            inputs: names(stage.inputs()),
            optional_inputs: names(stage.optional_inputs()),
            outputs: names(stage.outputs()),
            partitioning: Partitioning::of(stage.unit()),
            depends_on: names(stage.depends_on()),
            config: stage.config_section().map(str::to_string),
        }
    }
}

/// A job file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct JobFile {
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
    config: Option<String>,
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
            other => match stages::find(other) {
                Some(stage) => Step::Stage(stage),
                None => bail!("unknown step `{other}` (known: sql, {})", stages::names().join(", ")),
            },
        };
        let mut config = self.config;
        if let Some(c) = &config {
            if !CurationConfig::SECTIONS.contains(&c.as_str()) {
                bail!("no config section `{c}` (known: {})", CurationConfig::SECTIONS.join(", "));
            }
        }
        if let Step::Stage(stage) = &step {
            let (outputs, unit, section) =
                (stage.outputs(), Partitioning::of(stage.unit()), stage.config_section().map(str::to_string));
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

/// The SQL jobs' declarations (the Rust stages declare themselves).
pub(crate) const EMBEDDED_JOBS: &[(&str, &str)] = &[
    ("pr_timeline", include_str!("../../jobs/pr_timeline.toml")),
    ("issues", include_str!("../../jobs/issues.toml")),
    ("pull_requests", include_str!("../../jobs/pull_requests.toml")),
    ("pr_issue_links", include_str!("../../jobs/pr_issue_links.toml")),
    ("filters", include_str!("../../jobs/filters.toml")),
];

pub(crate) const EMBEDDED_SQL: &[(&str, &str)] = &[
    ("pr_timeline.sql", include_str!("../../sql/pr_timeline.sql")),
    ("issues.sql", include_str!("../../sql/issues.sql")),
    ("pull_requests.sql", include_str!("../../sql/pull_requests.sql")),
    ("pr_issue_links.sql", include_str!("../../sql/pr_issue_links.sql")),
    ("pr_quality.sql", include_str!("../../sql/pr_quality.sql")),
];

pub(crate) fn parse_job(text: &str, origin: &str) -> Result<JobSpec> {
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
        for stage in stages::STAGES {
            jobs.insert(stage.name().to_string(), JobSpec::of_stage(*stage));
        }
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

    /// These jobs and `stage` (a stage outside the built-in table: an extension's, a test's).
    pub fn with_stage(mut self, stage: &'static dyn Stage) -> Result<Registry> {
        self.jobs.insert(stage.name().to_string(), JobSpec::of_stage(stage));
        self.validate()?;
        Ok(self)
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

    /// The jobs a run of `ran` leaves due and runs after them in the same invocation: the Rust
    /// stages over their inputs as a whole (the seed dataset) that depend on a job of `ran`,
    /// and those that depend on them. `swelake run verify` is followed by `seed`, so the shards
    /// and the exports carry the verdicts it wrote.
    pub fn followers(&self, ran: &[String]) -> Vec<String> {
        let mut done: BTreeSet<String> = ran.iter().cloned().collect();
        let mut out = Vec::new();
        loop {
            let next: Vec<String> = self
                .jobs
                .values()
                .filter(|j| {
                    matches!(j.step, Step::Stage(_))
                        && j.partitioning == Partitioning::Whole
                        && !done.contains(&j.name)
                        && j.depends_on.iter().any(|d| done.contains(d))
                })
                .map(|j| j.name.clone())
                .collect();
            if next.is_empty() {
                return out;
            }
            for n in next {
                done.insert(n.clone());
                out.push(n);
            }
        }
    }

    /// The job that writes `table`, if any.
    pub fn writer_of(&self, table: &str) -> Option<&JobSpec> {
        self.jobs.values().find(|j| j.outputs.iter().any(|o| o == table))
    }
}
