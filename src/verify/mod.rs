//! Instances that run: for every kept, snapshotted PR that changes a test file, the PR's own
//! tests run as SWE-bench defines it — (a) the merge base with the PR's test changes, (b) with
//! its code changes too, each side `repeat` times — in a sandbox without Docker
//! ([`sandbox`]: bubblewrap) and in an environment of the PR's own day ([`mod@env`]: uv against
//! the registries as they were then). `FAIL_TO_PASS` fails in every run of (a) and passes in
//! every run of (b); `PASS_TO_PASS` passes in all; a test whose outcome changes between
//! repeats is flaky and in neither. Every PR gets a status and a one-line reason.
//!
//! Input: `pr_quality`, `pull_requests`, `pr_snapshots`, the git mirrors. Output:
//! `environments`, `pr_tests`, `pr_verification` (the watermark: a rerun does the PRs without
//! a verdict for their current merge base and head). Not part of `run --all` unless `--verify`
//! or `[verify] enabled = true`: it runs untrusted code.
//!
//! Python ([`mod@env`]) and JavaScript/TypeScript ([`node`]: npm, jest, vitest, mocha); a tree of
//! another language gets `toolchain_unavailable`.

pub mod env;
pub mod evaluate;
pub mod node;
pub mod outcomes;
mod runner;
pub mod sandbox;
pub mod spec;
pub mod tree;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use git2::{Oid, Repository};
use serde::{Deserialize, Serialize};

use crate::git::Mirrors;
use crate::lake::rows::to_batch;
use crate::lake::runs::{self, RunRecord};
use crate::lake::Lake;
use crate::stage::{JobSummary, Need, Stage, StageCtx, Unit};
use outcomes::Verdict;
use runner::{last_error_line, run_sides};

pub const ENVIRONMENTS: &str = "environments";
pub const PR_TESTS: &str = "pr_tests";
pub const PR_VERIFICATION: &str = "pr_verification";

/// Every status a PR can get, in the order the card lists them.
pub const STATUSES: &[&str] = &[
    "verified",
    "no_fail_to_pass",
    "flaky",
    "env_failed",
    "tests_not_found",
    "patch_failed",
    "timeout",
    "toolchain_unavailable",
    "no_test_change",
];

/// The `[verify]` section of the curation config.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifyConfig {
    pub enabled: bool,
    pub repeat: u32,
    pub timeout_secs: u64,
    pub python: String,
    pub uv_version: String,
    pub sandbox: String,
    pub memory_mb: u64,
    pub max_processes: u64,
    /// Memory of one run, all its processes together (a cgroup's, where one can be made).
    pub run_memory_mb: u64,
    pub relax_tooling: bool,
    pub whole_suite: bool,
    pub keep_trees: bool,
    /// At most this many PRs per run (0: all); the next run goes on where it stopped.
    pub max_prs_per_run: usize,
    /// Where locks, environments and scratch trees go ("" : CACHE/.verify beside the mirrors).
    pub dir: String,
}

impl Default for VerifyConfig {
    fn default() -> Self {
        crate::config::default_section("verify")
    }
}

/// SWE-bench's rule for test files (`swebench.collect.utils.extract_patches`): the path
/// contains `test` (so also `tests`, `testing`) or `e2e`.
pub fn is_test_path(path: &str) -> bool {
    path.contains("test") || path.contains("e2e")
}

/// The verify stage.
pub struct Verify;

#[async_trait::async_trait(?Send)]
impl Stage for Verify {
    fn name(&self) -> &'static str {
        "verify"
    }

    fn description(&self) -> &'static str {
        "FAIL_TO_PASS and PASS_TO_PASS of every kept PR that changes a test, run in a sandbox in an environment of \
         the PR's day (runs untrusted code: only with --verify or [verify] enabled = true)."
    }

    fn inputs(&self) -> &'static [&'static str] {
        &["pr_quality", "pull_requests", "pr_snapshots"]
    }

    fn outputs(&self) -> &'static [&'static str] {
        &[ENVIRONMENTS, PR_TESTS, PR_VERIFICATION]
    }

    fn unit(&self) -> Unit {
        Unit::Column("repo_name")
    }

    fn depends_on(&self) -> &'static [&'static str] {
        &["filters"]
    }

    fn config_section(&self) -> Option<&'static str> {
        Some("verify")
    }

    fn needs(&self) -> &'static [Need] {
        &[Need::Repositories]
    }

    fn skip(&self, ctx: &StageCtx<'_>) -> Option<String> {
        let cfg = ctx.config::<VerifyConfig>();
        (!ctx.named && !cfg.enabled)
            .then(|| "it runs the PRs' own tests (untrusted code): pass --verify or set [verify] enabled = true".into())
    }

    async fn run(&self, lake: &Lake, ctx: &StageCtx<'_>) -> Result<JobSummary> {
        let cfg = ctx.config::<VerifyConfig>();
        Ok(run(lake, &ctx.scope()?, &cfg).await?.into())
    }
}

/// What a run did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct VerifySummary {
    pub repos_processed: Vec<String>,
    pub prs_in_scope: usize,
    pub prs_already_done: usize,
    /// Due, but past `max_prs_per_run`.
    pub prs_left_for_later: usize,
    pub by_status: BTreeMap<String, usize>,
    pub environments_built: usize,
    pub environments_reused: usize,
    pub tests: usize,
    pub seconds_running: f64,
}

impl From<VerifySummary> for JobSummary {
    fn from(s: VerifySummary) -> JobSummary {
        let mut notes = BTreeMap::from([
            ("prs_verified_now".to_string(), s.by_status.values().sum::<usize>() as i64),
            ("prs_already_done".to_string(), s.prs_already_done as i64),
            ("prs_left_for_later".to_string(), s.prs_left_for_later as i64),
            ("environments_built".to_string(), s.environments_built as i64),
            ("environments_reused".to_string(), s.environments_reused as i64),
        ]);
        for (k, v) in &s.by_status {
            notes.insert(format!("status:{k}"), *v as i64);
        }
        let mut partitions = s.repos_processed.clone();
        partitions.sort();
        JobSummary { partitions, rows_out: s.by_status.values().sum::<usize>() as u64, notes, ..Default::default() }
    }
}

/// A kept, snapshotted PR.
#[derive(Debug, Clone, Deserialize)]
pub struct PrRef {
    pub repo_name: String,
    pub pr_number: i64,
    pub merge_base: String,
    pub head_sha: String,
    /// RFC 3339, UTC.
    pub merged_at: String,
}

/// A row of `pr_verification`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct VerificationRow {
    pub repo_name: String,
    pub pr_number: i64,
    pub status: String,
    pub reason: String,
    pub fail_to_pass: Vec<String>,
    pub pass_to_pass: Vec<String>,
    pub flaky: Vec<String>,
    pub test_files: Vec<String>,
    pub env_key: String,
    pub merge_base: String,
    pub head_sha: String,
    pub package_version: String,
    pub log_tail: String,
    pub seconds: f64,
}

/// A row of `pr_tests`.
#[derive(Debug, Clone, Serialize)]
pub struct TestRow {
    pub repo_name: String,
    pub pr_number: i64,
    pub test_id: String,
    pub side: String,
    pub run: i64,
    pub outcome: String,
    pub seconds: f64,
}

/// Everything one PR produced.
pub struct PrResult {
    pub verification: VerificationRow,
    pub tests: Vec<TestRow>,
    pub env: Option<env::EnvRow>,
}

const PRS_SQL: &str = include_str!("../../sql/verify_prs.sql");

/// Verifies every kept PR in scope without a verdict for its current SHAs.
pub async fn run(lake: &Lake, scope: &crate::git::Scope, cfg: &VerifyConfig) -> Result<VerifySummary> {
    let mut summary = VerifySummary::default();
    let ctx = lake.session().await?;
    let prs: Vec<PrRef> = crate::query::rows(&ctx, PRS_SQL).await.context("sql/verify_prs.sql")?;
    let prs: Vec<PrRef> = prs
        .into_iter()
        .filter(|p| scope.includes(&p.repo_name) && scope.shard.as_ref().is_none_or(|s| s.owns(&p.repo_name)))
        .collect();
    summary.prs_in_scope = prs.len();
    let done: BTreeSet<(String, i64, String, String)> = if lake.has_table(PR_VERIFICATION).await? && !scope.force {
        crate::query::rows::<(String, i64, String, String)>(
            &ctx,
            "SELECT repo_name, pr_number, merge_base, head_sha FROM pr_verification",
        )
        .await?
        .into_iter()
        .collect()
    } else {
        BTreeSet::new()
    };
    let mut by_repo: BTreeMap<String, Vec<PrRef>> = BTreeMap::new();
    let mut due = 0;
    for p in prs {
        if done.contains(&(p.repo_name.clone(), p.pr_number, p.merge_base.clone(), p.head_sha.clone())) {
            summary.prs_already_done += 1;
        } else if cfg.max_prs_per_run == 0 || due < cfg.max_prs_per_run {
            due += 1;
            by_repo.entry(p.repo_name.clone()).or_default().push(p);
        } else {
            summary.prs_left_for_later += 1;
        }
    }
    if by_repo.is_empty() {
        return Ok(summary);
    }
    let sandbox =
        sandbox::Sandbox::new(&cfg.sandbox, cfg.memory_mb, cfg.max_processes)?.with_run_memory(cfg.run_memory_mb);
    eprintln!("verify: sandbox: {}", sandbox.bounds());
    let tools = env::Tools::prepare(cfg, &scope.mirrors.cache_dir)?;
    let known_envs: BTreeSet<String> = if lake.has_table(ENVIRONMENTS).await? {
        crate::query::rows::<(String,)>(&lake.session().await?, "SELECT env_key FROM environments")
            .await?
            .into_iter()
            .map(|(k,)| k)
            .collect()
    } else {
        BTreeSet::new()
    };
    let mut seen_envs = known_envs;
    for (repo_name, prs) in by_repo {
        let started = Instant::now();
        let total = prs.len();
        let mut results: Vec<PrResult> = Vec::new();
        for (k, chunk) in prs.chunks(8).enumerate() {
            let job = Job {
                mirrors: scope.mirrors.clone(),
                repo_name: repo_name.clone(),
                prs: chunk.to_vec(),
                cfg: cfg.clone(),
                tools: tools.clone(),
                sandbox: sandbox.clone(),
            };
            let show = scope.show_progress;
            let offset = k * 8;
            let chunk_results = tokio::task::spawn_blocking(move || job.run(show, offset, total)).await??;
            write(lake, &repo_name, &chunk_results, &mut seen_envs, &mut summary).await?;
            results.extend(chunk_results);
        }
        summary.repos_processed.push(repo_name.clone());
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for r in &results {
            *counts.entry(r.verification.status.as_str()).or_default() += 1;
        }
        let rec = RunRecord::ok(
            "verify",
            &repo_name,
            results.len() as u64,
            counts.get("verified").copied().unwrap_or(0) as u64,
            0,
            None,
            serde_json::json!({ "by_status": counts }),
        )
        .timed(started.elapsed().as_secs_f64());
        runs::record(lake, rec).await?;
    }
    Ok(summary)
}

/// One repository's PRs, worked on a blocking thread (libgit2 and child processes).
struct Job {
    mirrors: Mirrors,
    repo_name: String,
    prs: Vec<PrRef>,
    cfg: VerifyConfig,
    tools: env::Tools,
    sandbox: sandbox::Sandbox,
}

impl Job {
    fn run(self, show_progress: bool, offset: usize, total: usize) -> Result<Vec<PrResult>> {
        let repo = self.mirrors.open(&self.repo_name).map_err(|f| anyhow::anyhow!("{}: {}", f.reason, f.message))?;
        let mut out = Vec::new();
        for (i, pr) in self.prs.iter().enumerate() {
            let r = verify_pr(&repo, pr, &self.cfg, &self.tools, &self.sandbox);
            if show_progress {
                eprintln!(
                    "verify {}#{} ({}/{total}): {} — {} ({:.1}s)",
                    pr.repo_name,
                    pr.pr_number,
                    offset + i + 1,
                    r.verification.status,
                    r.verification.reason,
                    r.verification.seconds
                );
            }
            out.push(r);
        }
        Ok(out)
    }
}

/// Writes one chunk of a repository's verdicts: its PRs' test rows replace their old ones, the
/// verdicts are upserted, new environments added.
async fn write(
    lake: &Lake,
    repo_name: &str,
    results: &[PrResult],
    seen_envs: &mut BTreeSet<String>,
    summary: &mut VerifySummary,
) -> Result<()> {
    let numbers: Vec<String> = results.iter().map(|r| r.verification.pr_number.to_string()).collect();
    if numbers.is_empty() {
        return Ok(());
    }
    let pred = format!("repo_name = '{}' AND pr_number IN ({})", repo_name.replace('\'', "''"), numbers.join(", "));
    lake.delete_where(PR_TESTS, &pred).await?;
    let tests: Vec<&TestRow> = results.iter().flat_map(|r| &r.tests).collect();
    summary.tests += tests.len();
    if !tests.is_empty() {
        lake.append_staged(PR_TESTS, &to_batch(PR_TESTS, &tests)?, &["test_id"]).await?;
    }
    let mut new_envs = Vec::new();
    for r in results {
        *summary.by_status.entry(r.verification.status.clone()).or_default() += 1;
        summary.seconds_running += r.verification.seconds;
        if let Some(e) = &r.env {
            if seen_envs.insert(e.env_key.clone()) {
                summary.environments_built += 1;
                new_envs.push(e.clone());
            } else {
                summary.environments_reused += 1;
            }
        }
    }
    if !new_envs.is_empty() {
        let batch = to_batch(ENVIRONMENTS, &new_envs)?;
        lake.insert_absent(ENVIRONMENTS, &batch, &["repo_name", "env_key"], None, &[]).await?;
    }
    let rows: Vec<&VerificationRow> = results.iter().map(|r| &r.verification).collect();
    let batch = to_batch(PR_VERIFICATION, &rows)?;
    let keys = ["repo_name".to_string(), "pr_number".to_string()];
    let file_key = format!("verify-{}", crate::verify::env::key_of(repo_name));
    lake.upsert_rows(PR_VERIFICATION, &batch.schema(), &[batch], &keys, None, &file_key).await?;
    Ok(())
}

/// The language of a tree, by the files that declare a project.
fn language_of(has: &dyn Fn(&str) -> bool) -> &'static str {
    if ["pyproject.toml", "setup.py", "setup.cfg"].iter().any(|f| has(f)) {
        "python"
    } else if has("package.json") {
        "javascript"
    } else if has("Cargo.toml") {
        "rust"
    } else if has("go.mod") {
        "go"
    } else {
        "unknown"
    }
}

/// The language of the tree at `commit` (TypeScript counts as JavaScript: one toolchain).
pub(crate) fn language_at(repo: &Repository, commit: Oid) -> &'static str {
    language_of(&|p: &str| read_at(repo, commit, p).is_some())
}

/// The PR's test files a runner of `language` is pointed at.
pub(crate) fn modules_for(language: &str, plan: &Plan) -> Vec<String> {
    plan.test_modules
        .iter()
        .filter(|m| if language == "javascript" { node::is_test_file(m) } else { is_test_module(m) })
        .cloned()
        .collect()
}

/// Why a PR's environment could not be had.
pub(crate) struct EnvStop {
    pub status: &'static str,
    pub reason: String,
    /// The environment's row, when one was tried.
    pub row: Option<Box<env::EnvRow>>,
    /// The project's version as the tree states it.
    pub version: String,
}

/// The environment a PR's tests run in, as of its merge date, for the language of its tree
/// at `base`; with the project's version as the tree states it.
pub(crate) fn prepare_env(
    repo: &Repository,
    base: Oid,
    language: &str,
    pr: &PrRef,
    cfg: &VerifyConfig,
    tools: &env::Tools,
    sandbox: &sandbox::Sandbox,
) -> std::result::Result<(env::Env, String), EnvStop> {
    let read = |p: &str| read_at(repo, base, p);
    let stop = |status, reason: String, version: &Option<String>| EnvStop {
        status,
        reason,
        row: None,
        version: version.clone().unwrap_or_default(),
    };
    let failed = |row: Box<env::EnvRow>, version: Option<String>| EnvStop {
        status: "env_failed",
        reason: format!("environment as of {}: {}", pr.merged_at, row.reason),
        row: Some(row),
        version: version.unwrap_or_default(),
    };
    match language {
        "python" => {
            let spec = spec::read_spec(&read);
            if let Some(why) = &tools.python_missing {
                return Err(stop("toolchain_unavailable", why.clone(), &spec.version));
            }
            if let Err(why) = tools.uv_path() {
                let why = why.trim_start_matches("toolchain_unavailable: ").to_string();
                return Err(stop("toolchain_unavailable", why, &spec.version));
            }
            if let Some(rp) = &spec.requires_python {
                if !spec::python_meets(&tools.python_version, rp) {
                    let why = format!("requires-python {rp} is not met by python {}", tools.python_version);
                    return Err(stop("env_failed", why, &spec.version));
                }
            }
            match env::prepare(&pr.repo_name, &spec, &pr.merged_at, tools, sandbox, cfg.relax_tooling) {
                Ok(e) => Ok((e, spec.version.unwrap_or_default())),
                Err(row) => Err(failed(row, spec.version)),
            }
        }
        "javascript" => {
            let spec = node::read_spec(&read).map_err(|why| stop("toolchain_unavailable", why, &None))?;
            if let Err(why) = &tools.node {
                return Err(stop("toolchain_unavailable", why.clone(), &spec.version));
            }
            match node::prepare(&pr.repo_name, &spec, &pr.merged_at, tools, sandbox) {
                Ok(e) => Ok((e, spec.version.unwrap_or_default())),
                Err(row) => Err(failed(row, spec.version)),
            }
        }
        "unknown" => Err(stop(
            "toolchain_unavailable",
            "no project file (pyproject.toml, setup.py, package.json, Cargo.toml, go.mod) at the merge base".into(),
            &None,
        )),
        l => Err(stop(
            "toolchain_unavailable",
            format!("{l} environments are not built yet (Python, JavaScript and TypeScript so far)"),
            &None,
        )),
    }
}

/// A Python file of a test path that pytest can be pointed at: named on the command line,
/// any module is collected (old suites such as `jinja2/testsuite/core_tags.py` are not named
/// `test_*.py`); `conftest.py` and `__init__.py` hold fixtures, not tests.
fn is_test_module(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.ends_with(".py") && name != "conftest.py" && name != "__init__.py"
}

/// A file's text at a commit.
fn read_at(repo: &Repository, commit: Oid, path: &str) -> Option<String> {
    let tree = repo.find_commit(commit).ok()?.tree().ok()?;
    let entry = tree.get_path(Path::new(path)).ok()?;
    let blob = repo.find_blob(entry.id()).ok()?;
    Some(String::from_utf8_lossy(blob.content()).to_string())
}

/// Verifies one PR: never an error, always a verdict.
pub fn verify_pr(
    repo: &Repository,
    pr: &PrRef,
    cfg: &VerifyConfig,
    tools: &env::Tools,
    sandbox: &sandbox::Sandbox,
) -> PrResult {
    let started = Instant::now();
    let mut v = VerificationRow {
        repo_name: pr.repo_name.clone(),
        pr_number: pr.pr_number,
        status: String::new(),
        reason: String::new(),
        fail_to_pass: Vec::new(),
        pass_to_pass: Vec::new(),
        flaky: Vec::new(),
        test_files: Vec::new(),
        env_key: String::new(),
        merge_base: pr.merge_base.clone(),
        head_sha: pr.head_sha.clone(),
        package_version: String::new(),
        log_tail: String::new(),
        seconds: 0.0,
    };
    let mut result = PrResult { verification: v.clone(), tests: Vec::new(), env: None };
    // Ok: the runs' verdict; Err: what stopped the PR before a verdict.
    let outcome = (|| -> std::result::Result<(&'static str, String), (&'static str, String)> {
        let plan = plan(repo, pr).map_err(|e| ("patch_failed", format!("{e:#}")))?;
        v.test_files = plan.test_modules.clone();
        if plan.test_paths.is_empty() {
            return Err((
                "no_test_change",
                "the PR changes no test file (SWE-bench's rule: a path with test or e2e)".into(),
            ));
        }
        let language = language_at(repo, plan.base);
        let modules = modules_for(language, &plan);
        v.test_files = modules.clone();
        if modules.is_empty() && !cfg.whole_suite && ["python", "javascript"].contains(&language) {
            let kind = if language == "python" { "test_*.py, *_test.py" } else { "*.js, *.ts outside fixtures" };
            return Err((
                "tests_not_found",
                format!("the PR's test changes hold no test module ({kind}): {}", plan.test_paths.join(", ")),
            ));
        }
        let env = match prepare_env(repo, plan.base, language, pr, cfg, tools, sandbox) {
            Ok((env, version)) => {
                v.package_version = version;
                env
            }
            Err(stop) => {
                v.package_version = stop.version;
                if let Some(row) = stop.row {
                    v.env_key = row.env_key.clone();
                    result.env = Some(*row);
                }
                return Err((stop.status, stop.reason));
            }
        };
        v.env_key = env.key.clone();
        result.env = Some(env.row.clone());
        let work = work_dir(tools, pr);
        let _ = std::fs::remove_dir_all(&work);
        let sides = run_sides(repo, &plan, &modules, &env, tools, sandbox, cfg, &work, &pr.repo_name, pr.pr_number);
        if !cfg.keep_trees {
            let _ = std::fs::remove_dir_all(&work);
        }
        let sides = sides?;
        for (side, runs) in [("before", &sides.before), ("after", &sides.after)] {
            for (k, run) in runs.iter().enumerate() {
                for t in run {
                    result.tests.push(TestRow {
                        repo_name: pr.repo_name.clone(),
                        pr_number: pr.pr_number,
                        test_id: t.test_id.clone(),
                        side: side.to_string(),
                        run: k as i64 + 1,
                        outcome: t.outcome.clone(),
                        seconds: t.seconds,
                    });
                }
            }
        }
        let verdict = outcomes::verdict(&sides.before, &sides.after);
        let Verdict { fail_to_pass, pass_to_pass, flaky, fail_after } = verdict;
        v.fail_to_pass = fail_to_pass;
        v.pass_to_pass = pass_to_pass;
        v.flaky = flaky;
        v.log_tail = sides.after_tail;
        let n_after = sides.after.first().map_or(0, |r| r.len());
        if !v.fail_to_pass.is_empty() {
            v.log_tail.clear();
            let flaky = if v.flaky.is_empty() { String::new() } else { format!(", {} flaky left out", v.flaky.len()) };
            return Ok((
                "verified",
                format!(
                    "{} fail before and pass after, {} pass on both sides{flaky} ({} runs a side)",
                    v.fail_to_pass.len(),
                    v.pass_to_pass.len(),
                    cfg.repeat
                ),
            ));
        }
        if !v.flaky.is_empty() {
            return Ok(("flaky", format!("no stable test fails before and passes after; {} flaky", v.flaky.len())));
        }
        if n_after == 0 {
            return Err(("tests_not_found", "the runner collected no test in the PR's test files".into()));
        }
        // Nothing passes even with the fix: the PR's tests cannot run here (code of another
        // interpreter, a dependency of its day that does not import on this one), which is
        // the environment's failure, not a verdict on the PR.
        let passed_after = sides.after.iter().flatten().any(|t| t.outcome == "passed");
        let errored_after = sides.after.iter().flatten().any(|t| t.outcome == "error");
        if !passed_after && errored_after {
            return Err((
                "env_failed",
                format!("no test passes even after the change: {}", last_error_line(&v.log_tail)),
            ));
        }
        let why = if fail_after.is_empty() {
            format!("every test that passes after the change also passes before it ({} tests)", v.pass_to_pass.len())
        } else {
            format!(
                "{} test(s) do not pass after the change (first: {}); none fails before and passes after",
                fail_after.len(),
                fail_after[0]
            )
        };
        Ok(("no_fail_to_pass", why))
    })();
    let (Ok((status, reason)) | Err((status, reason))) = outcome;
    v.status = status.to_string();
    v.reason = env::one_line(&reason);
    v.seconds = started.elapsed().as_secs_f64();
    result.verification = v;
    result
}

/// What to run for a PR: its merge base and head, the changed paths that are tests (the
/// SWE-bench rule) and the rest, and the test modules among the tests that exist after it.
pub struct Plan {
    pub base: Oid,
    pub head: Oid,
    /// Test paths changed (new and old paths of renames).
    pub test_paths: Vec<String>,
    /// Every changed path.
    pub all_paths: Vec<String>,
    pub test_modules: Vec<String>,
}

pub fn plan(repo: &Repository, pr: &PrRef) -> Result<Plan> {
    let base = crate::git::oid(&pr.merge_base).map_err(|f| anyhow::anyhow!("{}", f.message))?;
    let head = crate::git::oid(&pr.head_sha).map_err(|f| anyhow::anyhow!("{}", f.message))?;
    let (_, changes) =
        crate::git::pr_changes(repo, base, head).map_err(|f| anyhow::anyhow!("{}: {}", f.reason, f.message))?;
    let mut test_paths = BTreeSet::new();
    let mut all_paths = BTreeSet::new();
    let mut modules = BTreeSet::new();
    for c in &changes {
        let path = String::from_utf8_lossy(&c.path).to_string();
        let old = c.old_path.as_ref().map(|p| String::from_utf8_lossy(p).to_string());
        let is_test = is_test_path(&path) || old.as_deref().is_some_and(is_test_path);
        for p in std::iter::once(path.clone()).chain(old.clone()) {
            all_paths.insert(p.clone());
            if is_test {
                test_paths.insert(p);
            }
        }
        if is_test && c.status != 'D' && (is_test_module(&path) || node::is_test_file(&path)) {
            modules.insert(path);
        }
    }
    Ok(Plan {
        base,
        head,
        test_paths: test_paths.into_iter().collect(),
        all_paths: all_paths.into_iter().collect(),
        test_modules: modules.into_iter().collect(),
    })
}

fn work_dir(tools: &env::Tools, pr: &PrRef) -> PathBuf {
    let safe = crate::files::path_segment(&pr.repo_name);
    tools.root.join("work").join(format!("{safe}-{}", pr.pr_number))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_modules_and_test_paths() {
        assert!(
            is_test_path("tests/test_api.py") && is_test_path("src/e2e/a.js") && !is_test_path("src/jinja2/lexer.py")
        );
        assert!(is_test_module("tests/test_api.py") && is_test_module("pkg/api_test.py"));
        assert!(is_test_module("jinja2/testsuite/core_tags.py"));
        assert!(!is_test_module("tests/conftest.py") && !is_test_module("tests/res/test.txt"));
    }
}
