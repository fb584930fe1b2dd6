//! Scheduled, incremental jobs: declared in `jobs/*.toml`, run by `swelake run JOB` (with the
//! jobs it depends on) or `swelake run --all`, in dependency order.
//!
//! A job is a typed [`Step`]: an SQL file ([`sql_job`]) or one of the Rust stages
//! ([`stages::STAGES`], each a [`Stage`](crate::stage::Stage)). Each job
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
//! The SQL job files are compiled in (so the binary works anywhere) and can be overridden
//! from a directory with `--jobs-dir`/`--sql-dir`. This is the layer that puts the curation
//! config's sections together ([`CurationConfig`]) and does for every stage what stages share:
//! leases, skipping, the watermark of a whole-input stage, the run's record.

mod registry;
pub mod sql_job;
pub mod stages;
pub mod status;

pub use crate::stage::{GitOptions, JobSummary};
pub use registry::{JobSpec, Partitioning, Registry, Step};

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::filters::FilterConfig;
use crate::lake::runs::{self, RunRecord, WHOLE};
use crate::lake::Lake;
use crate::relevance::RelevanceConfig;
use crate::seed::SeedConfig;
use crate::stage::{Extras, Need, StageCtx, Unit};

/// Declares the curation config's sections in one place: the struct, its loading (a file
/// names only what it changes; an unknown key is an error that names it), the names a job may
/// read (`config = "…"` in a job file, a stage's `config_section`), their fingerprint text,
/// and the extras every stage takes its section from ([`StageCtx::config`]). A new section is
/// one line of the list below.
macro_rules! curation_sections {
    ($($(#[$doc:meta])* $field:ident: $ty:ty,)*) => {
        /// The curation config: the sections of the stages that read one.
        #[derive(Debug, Clone, Default, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct CurationConfig {
            $($(#[$doc])* pub $field: $ty,)*
        }

        impl CurationConfig {
            /// The built-in config, or the file at `path` layered over it.
            pub fn load(path: Option<&Path>) -> Result<CurationConfig> {
                let merged = crate::config::load(path)?;
                let origin = path.map_or("the built-in config".to_string(), |p| p.display().to_string());
                Ok(CurationConfig {
                    $($field: crate::config::section(&merged, stringify!($field)).with_context(|| origin.clone())?,)*
                })
            }

            /// The sections, by name.
            pub const SECTIONS: &'static [&'static str] = &[$(stringify!($field)),*];

            /// A stable text of one section, for fingerprints.
            fn section_text(&self, section: &str) -> String {
                match section {
                    $(stringify!($field) => serde_json::to_string(&self.$field).expect("config sections serialise"),)*
                    _ => String::new(),
                }
            }

            /// The sections, by type, for the stages to take theirs ([`StageCtx::config`]).
            fn add_to(&self, extras: &mut Extras) {
                $(extras.insert(self.$field.clone());)*
            }
        }
    };
}

curation_sections! {
    filters: FilterConfig,
    relevance: RelevanceConfig,
    seed: SeedConfig,
    /// How `status` and `report` judge whether the archive's hours are complete.
    completeness: crate::archive::CompletenessConfig,
    /// Where merged PRs are found.
    discovery: DiscoveryConfig,
    /// How PRs' own tests are run (the verify stage).
    verify: crate::verify::VerifyConfig,
}

/// The `[discovery]` section: where merged PRs are found besides the archive.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DiscoveryConfig {
    /// Read merged PRs from git too (the prs_from_git job) for a lake fed by the archive.
    pub from_git: bool,
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
    let mut order = registry.order(wanted)?;
    if !opts.all {
        let followers = registry.followers(&order);
        order.extend(followers);
    }
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
                    let mut rec = RunRecord::ok(name, runs::RUN, 0, 0, 0, None, serde_json::json!({"error": message}))
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
    let name = &job.name;
    let stage = match &job.step {
        Step::Sql(step) => {
            return sql_job::run(lake, registry, job, step, opts).await.with_context(|| format!("job `{name}`"))
        }
        Step::Stage(stage) => *stage,
    };
    if let Some(reason) = missing_input(lake, registry, job, out).await? {
        return Ok(JobSummary::skipped(name, reason));
    }
    let mut extras = Extras::default();
    opts.curation.add_to(&mut extras);
    if let Some(io) = &opts.ingest {
        extras.insert(io.clone());
    }
    let ctx = StageCtx {
        job: name,
        named: explicitly.contains(name),
        show_progress: opts.show_progress,
        git: opts.git.as_ref(),
        extras: &extras,
    };
    let repositories = stage.needs().contains(&Need::Repositories);
    if repositories && opts.git.is_none() {
        return ctx.missing("--repo-url", "where the git repositories are");
    }
    if let Some(reason) = stage.skip(&ctx) {
        return Ok(JobSummary::skipped(name, reason));
    }
    match (stage.unit(), &opts.git) {
        (Unit::Whole, _) => whole(lake, job, opts, || stage.run(lake, &ctx)).await,
        (Unit::Column(_), Some(g)) if repositories => {
            lake.with_leases(name, &g.scope.lease_keys(), opts.lease_wait, stage.run(lake, &ctx)).await
        }
        (Unit::Column(_), _) => stage.run(lake, &ctx).await,
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
            for (_, fp) in sql_job::partition_fingerprints(&t, runs::NO_COLUMN)? {
                h = crate::hash::fnv1a(name.bytes().chain(fp.bytes()), h);
            }
        }
    }
    Ok(format!("{h:016x}"))
}

/// The watermark of a job over its inputs as a whole: the fingerprint of their files and of
/// the config section the job reads.
async fn whole_fingerprint(lake: &Lake, job: &JobSpec, opts: &RunOptions) -> Result<String> {
    let section = job.config.as_deref().map(|s| opts.curation.section_text(s)).unwrap_or_default();
    inputs_fingerprint(lake, &job.inputs, &section).await
}

/// Runs a Rust step over its inputs as a whole, unless nothing it reads changed since its last
/// successful run; records the run.
async fn whole<F, Fut>(lake: &Lake, job: &JobSpec, opts: &RunOptions, step: F) -> Result<JobSummary>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<JobSummary>>,
{
    let fingerprint = whole_fingerprint(lake, job, opts).await?;
    let is_done = |done: &HashMap<String, RunRecord>| {
        done.get(WHOLE).and_then(|r| r.detail.get("fingerprint")).and_then(|v| v.as_str()) == Some(fingerprint.as_str())
    };
    if is_done(&runs::latest_ok(lake, &job.name).await?) {
        return Ok(JobSummary::named(&job.name));
    }
    lake.with_leases(&job.name, &[WHOLE.to_string()], opts.lease_wait, async {
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
    let mut s = step().await?;
    let detail = serde_json::json!({"fingerprint": fingerprint, "files": s.files});
    let rejected = s.notes.iter().filter(|(k, _)| k.starts_with("rejected:")).map(|(_, v)| *v as u64).sum();
    runs::record(lake, RunRecord::ok(&job.name, WHOLE, 0, s.rows_out, rejected, None, detail)).await?;
    s.partitions = vec![WHOLE.to_string()];
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::registry::parse_job;

    fn job(text: &str) -> Result<JobSpec> {
        parse_job(text, "test.toml")
    }

    #[test]
    fn built_in_jobs_parse_into_typed_steps() {
        let r = Registry::load(None, None).unwrap();
        assert_eq!(r.jobs["ingest"].step.name(), "ingest");
        assert_eq!(r.jobs["seed"].step.name(), "seed");
        assert_eq!(r.jobs["seed"].partitioning, Partitioning::Whole);
        assert_eq!(r.jobs["seed"].config.as_deref(), Some("seed"));
        assert_eq!(r.jobs["filters"].config.as_deref(), Some("filters"));
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
        let before = (a.section_text("filters"), a.section_text("seed"));
        a.seed.max_prompt_tokens += 1;
        assert_eq!(a.section_text("filters"), before.0, "a seed setting does not touch the filters");
        assert_ne!(a.section_text("seed"), before.1);
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
