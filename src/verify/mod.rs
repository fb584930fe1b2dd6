//! Instances that run: for every kept, snapshotted PR that changes a test file, the PR's own
//! tests run as SWE-bench defines it — (a) the merge base with the PR's test changes, (b) with
//! its code changes too, each side `repeat` times — in a sandbox without Docker
//! ([`sandbox`]: bubblewrap) and in an environment of the PR's own day ([`mod@python::env`]: uv against
//! the registries as they were then). `FAIL_TO_PASS` fails in every run of (a) and passes in
//! every run of (b); `PASS_TO_PASS` passes in all; a test whose outcome changes between
//! repeats is flaky and in neither. Every PR gets a status and a one-line reason.
//!
//! Input: `pr_quality`, `pull_requests`, `pr_snapshots`, the git mirrors. Output:
//! `environments`, `pr_tests`, `pr_verification` (the watermark: a rerun does the PRs without
//! a verdict for their current merge base and head). Not part of `run --all` unless `--verify`
//! or `[verify] enabled = true`: it runs untrusted code.
//!
//! A language is a [`Toolchain`] ([`toolchain`]) in the table [`TOOLCHAINS`]: Python
//! ([`python`]: uv, pytest) and JavaScript/TypeScript ([`javascript`]: npm; jest, vitest, mocha,
//! ava, `node --test`, tap, tape, jasmine) and Rust ([`rust`]: cargo, libtest). A tree no toolchain claims gets
//! `toolchain_unavailable`. The verdict is decided in one place ([`judge`]) for `verify` and
//! `evaluate` alike.

pub mod evaluate;
pub mod grade;
pub mod javascript;
pub mod judge;
pub mod outcomes;
pub mod python;
mod runner;
pub mod rust;
pub mod sandbox;
pub mod toolchain;
pub mod tree;

pub use toolchain::{Status, Toolchain};

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
use crate::testfiles::is_test_path;
use outcomes::Verdict;
use runner::run_sides;
use toolchain::{Env, EnvRow, EnvStop, Prepared, Tools};

/// The toolchains, in the order they are asked whether a tree is theirs. A language is a
/// module and a line here.
pub static TOOLCHAINS: &[&dyn Toolchain] = &[&python::Python, &javascript::JavaScript, &rust::Rust];

/// Project files of languages that have no toolchain yet, for the reason their PRs get.
const WITHOUT_TOOLCHAIN: &[(&str, &str)] = &[("go.mod", "Go")];

pub const ENVIRONMENTS: &str = "environments";
pub const PR_TESTS: &str = "pr_tests";
pub const PR_VERIFICATION: &str = "pr_verification";

/// The `[verify]` section of the curation config.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifyConfig {
    pub enabled: bool,
    pub repeat: u32,
    pub timeout_secs: u64,
    pub python: String,
    /// Interpreters to choose from per PR (the newest its tree accepts that was out by its
    /// day); empty: `python` alone.
    pub pythons: Vec<String>,
    pub uv_version: String,
    /// A uv that still reads `.tar.bz2`/`.tar.xz` sdists (uv of 2026 refuses them by name, and
    /// every Twisted before 21.2 is one), for a resolution `uv_version` refuses; "": none.
    pub uv_legacy_version: String,
    /// Past this size (MiB) after a run, a Rust environment's target directory is emptied.
    pub rust_target_mb: u64,
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
    /// PRs worked on at once, each side in a sandbox of its own (0: the cores).
    pub jobs: usize,
    /// Only PRs merged on or after this date (YYYY-MM-DD, or RFC 3339; "": no bound).
    pub since: String,
    /// Only PRs merged on or before this date ("": no bound).
    pub until: String,
}

impl VerifyConfig {
    /// PRs at once: `jobs`, or the machine's cores.
    pub fn workers(&self) -> usize {
        if self.jobs > 0 {
            self.jobs
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        }
    }

    /// Whether a PR merged at `merged_at` (RFC 3339) is within `since`/`until`.
    pub fn in_window(&self, merged_at: &str) -> bool {
        let day = merged_at.get(..10).unwrap_or(merged_at);
        let since = self.since.get(..10).unwrap_or(&self.since);
        let until = self.until.get(..10).unwrap_or(&self.until);
        (since.is_empty() || day >= since) && (until.is_empty() || day <= until)
    }
}

impl Default for VerifyConfig {
    fn default() -> Self {
        crate::config::default_section("verify")
    }
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
    /// The environments it used or tried: the merge base's, and the after side's own.
    pub envs: Vec<EnvRow>,
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
        .filter(|p| cfg.in_window(&p.merged_at))
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
    let tools = Tools::prepare(cfg, &scope.mirrors.cache_dir)?;
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
    tools: Tools,
    sandbox: sandbox::Sandbox,
}

impl Job {
    /// The chunk's PRs on `cfg.workers()` threads at once, each with a repository handle of
    /// its own (libgit2's are not shared across threads); the results in the chunk's order,
    /// so the tables are the same whatever the number of workers.
    fn run(self, show_progress: bool, offset: usize, total: usize) -> Result<Vec<PrResult>> {
        let workers = self.cfg.workers().clamp(1, self.prs.len().max(1));
        let next = std::sync::atomic::AtomicUsize::new(0);
        let results: std::sync::Mutex<Vec<Option<PrResult>>> =
            std::sync::Mutex::new((0..self.prs.len()).map(|_| None).collect());
        std::thread::scope(|s| -> Result<()> {
            let handles: Vec<_> = (0..workers)
                .map(|_| {
                    s.spawn(|| -> Result<()> {
                        let repo = self
                            .mirrors
                            .open(&self.repo_name)
                            .map_err(|f| anyhow::anyhow!("{}: {}", f.reason, f.message))?;
                        loop {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            let Some(pr) = self.prs.get(i) else { return Ok(()) };
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
                            results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(r);
                        }
                    })
                })
                .collect();
            for h in handles {
                h.join().map_err(|_| anyhow::anyhow!("a verify worker panicked"))??;
            }
            Ok(())
        })?;
        Ok(results.into_inner().unwrap_or_else(|e| e.into_inner()).into_iter().flatten().collect())
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
        for e in &r.envs {
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
    let file_key = format!("verify-{}", toolchain::key_of(repo_name));
    lake.upsert_rows(PR_VERIFICATION, &batch.schema(), &[batch], &keys, None, &file_key).await?;
    Ok(())
}

/// The toolchain that claims the tree at `commit`, or why none does.
pub fn toolchain_at(repo: &Repository, commit: Oid) -> std::result::Result<&'static dyn Toolchain, String> {
    let has = |p: &str| read_at(repo, commit, p).is_some();
    if let Some(t) = TOOLCHAINS.iter().find(|t| t.project_files().iter().any(|f| has(f))) {
        return Ok(*t);
    }
    if let Some((_, language)) = WITHOUT_TOOLCHAIN.iter().find(|(f, _)| has(f)) {
        let built: Vec<&str> = TOOLCHAINS.iter().map(|t| t.name()).collect();
        return Err(format!("{language} environments are not built yet (toolchains: {})", built.join(", ")));
    }
    let files: Vec<&str> = TOOLCHAINS.iter().flat_map(|t| t.project_files().iter().copied()).collect();
    Err(format!("no project file ({}) at the merge base", files.join(", ")))
}

/// The PR's test files `toolchain`'s runner is pointed at.
pub fn modules_for(toolchain: &dyn Toolchain, plan: &Plan) -> Vec<String> {
    plan.test_modules.iter().filter(|m| toolchain.is_test_file(m)).cloned().collect()
}

/// The environments of a PR's two sides. The before side's is the merge base's. When the PR
/// changes a file the toolchain read to prepare that one (a `package.json`'s dependencies, a
/// requirements file, a lockfile), the after side gets the environment its own files ask for:
/// a fix that needs a newer dependency cannot pass on the old one. That environment is
/// prepared from the after side's tree (the merge base with every change of the PR) — what
/// SWE-bench does when it builds an instance's environment at a later commit of its version.
pub(crate) struct SideEnvs {
    pub before: Prepared,
    /// `None`: the after side runs in the before side's environment.
    pub after: Option<Env>,
    /// The after side's own environment when it could not be prepared: its row, and why
    /// (the after side then runs in the merge base's, and the verdict's reason says so).
    pub after_failed: Option<(Option<Box<EnvRow>>, String)>,
}

impl SideEnvs {
    pub fn after(&self) -> &Env {
        self.after.as_ref().unwrap_or(&self.before.env)
    }
}

pub(crate) fn prepare_sides(
    repo: &Repository,
    plan: &Plan,
    toolchain: &dyn Toolchain,
    pr: &PrRef,
    tools: &Tools,
    sandbox: &sandbox::Sandbox,
) -> std::result::Result<SideEnvs, EnvStop> {
    let asked = std::cell::RefCell::new(BTreeSet::new());
    let read_base = |p: &str| {
        asked.borrow_mut().insert(p.to_string());
        read_at(repo, plan.base, p)
    };
    let before = toolchain.prepare(&read_base, pr, tools, sandbox)?;
    let changed: Vec<String> = asked.into_inner().into_iter().filter(|p| plan.all_paths.contains(p)).collect();
    if changed.is_empty() {
        return Ok(SideEnvs { before, after: None, after_failed: None });
    }
    let read_after = |p: &str| {
        if p.is_empty() || p.ends_with('/') || plan.all_paths.iter().any(|c| c == p) {
            read_at(repo, plan.head, p)
        } else {
            read_at(repo, plan.base, p)
        }
    };
    match toolchain.prepare(&read_after, pr, tools, sandbox) {
        Ok(after) if after.env.key == before.env.key => Ok(SideEnvs { before, after: None, after_failed: None }),
        Ok(after) => Ok(SideEnvs { before, after: Some(after.env), after_failed: None }),
        Err(stop) => {
            let why =
                format!("the PR changes {}, yet its own environment failed ({})", changed.join(", "), stop.reason);
            Ok(SideEnvs { before, after: None, after_failed: Some((stop.row, why)) })
        }
    }
}

/// A file's text at a commit; for a path ending in `/` (`""`: the root), the directory's
/// entries, one a line, subdirectories ending in `/` (a workspace's `crates/*`).
fn read_at(repo: &Repository, commit: Oid, path: &str) -> Option<String> {
    let tree = repo.find_commit(commit).ok()?.tree().ok()?;
    if path.is_empty() || path.ends_with('/') {
        let dir = if path.is_empty() {
            tree
        } else {
            let entry = tree.get_path(Path::new(path.trim_end_matches('/'))).ok()?;
            repo.find_tree(entry.id()).ok()?
        };
        let names: Vec<String> = dir
            .iter()
            .map(|e| {
                let name = String::from_utf8_lossy(e.name_bytes()).to_string();
                if e.kind() == Some(git2::ObjectType::Tree) {
                    format!("{name}/")
                } else {
                    name
                }
            })
            .collect();
        return Some(names.join("\n"));
    }
    let entry = tree.get_path(Path::new(path)).ok()?;
    let blob = repo.find_blob(entry.id()).ok()?;
    Some(String::from_utf8_lossy(blob.content()).to_string())
}

/// Verifies one PR: never an error, always a verdict.
pub fn verify_pr(
    repo: &Repository,
    pr: &PrRef,
    cfg: &VerifyConfig,
    tools: &Tools,
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
    let mut result = PrResult { verification: v.clone(), tests: Vec::new(), envs: Vec::new() };
    // Ok: the runs' verdict; Err: what stopped the PR before a verdict.
    let outcome = (|| -> std::result::Result<(Status, String), (Status, String)> {
        let plan = plan(repo, pr).map_err(|e| (Status::PatchFailed, format!("{e:#}")))?;
        v.test_files = plan.test_modules.clone();
        if plan.test_paths.is_empty() {
            return Err((
                Status::NoTestChange,
                "the PR changes no test file (SWE-bench's rule: a path with test or e2e)".into(),
            ));
        }
        if !plan.test_paths.iter().any(|p| crate::testfiles::is_test_change(p)) {
            return Err((
                Status::NoTestChange,
                format!(
                    "the PR changes no test file: its paths with test in them are neither code nor in a test \
                     directory ({})",
                    plan.test_paths.join(", ")
                ),
            ));
        }
        let toolchain = toolchain_at(repo, plan.base).map_err(|why| (Status::ToolchainUnavailable, why))?;
        let modules = modules_for(toolchain, &plan);
        v.test_files = modules.clone();
        if modules.is_empty() && !cfg.whole_suite {
            return Err((
                Status::TestsNotFound,
                format!(
                    "the PR's test changes hold no test module ({}): {}",
                    toolchain.test_file_kinds(),
                    plan.test_paths.join(", ")
                ),
            ));
        }
        let envs = match prepare_sides(repo, &plan, toolchain, pr, tools, sandbox) {
            Ok(envs) => envs,
            Err(stop) => {
                v.package_version = stop.version;
                if let Some(row) = stop.row {
                    v.env_key = row.env_key.clone();
                    result.envs.push(*row);
                }
                return Err((stop.status, stop.reason));
            }
        };
        let env = &envs.before.env;
        v.package_version = envs.before.version.clone();
        v.env_key = env.key.clone();
        result.envs.push(env.row.clone());
        if let Some(after) = &envs.after {
            result.envs.push(after.row.clone());
        }
        if let Some((Some(row), _)) = &envs.after_failed {
            result.envs.push((**row).clone());
        }
        let work = work_dir(tools, pr);
        let _ = std::fs::remove_dir_all(&work);
        let sides = run_sides(
            repo,
            &plan,
            &modules,
            [env, envs.after()],
            tools,
            sandbox,
            cfg,
            &work,
            &pr.repo_name,
            pr.pr_number,
        );
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
                        outcome: t.outcome.as_str().to_string(),
                        seconds: t.seconds,
                    });
                }
            }
        }
        let (status, mut why, verdict) =
            judge::pr_verdict(env.runner.as_ref(), &sides.before, &sides.after, &sides.after_tail, cfg.repeat);
        if let Some((_, note)) = &envs.after_failed {
            why = format!("{why}; the after side ran in the merge base's environment: {note}");
        }
        let Verdict { fail_to_pass, pass_to_pass, flaky, .. } = verdict;
        v.fail_to_pass = fail_to_pass;
        v.pass_to_pass = pass_to_pass;
        v.flaky = flaky;
        v.log_tail = if status == Status::Verified { String::new() } else { sides.after_tail };
        match status {
            Status::TestsNotFound | Status::EnvFailed => Err((status, why)),
            _ => Ok((status, why)),
        }
    })();
    let (Ok((status, reason)) | Err((status, reason))) = outcome;
    v.status = status.as_str().to_string();
    v.reason = toolchain::one_line(&reason);
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
        if is_test && c.status != 'D' && TOOLCHAINS.iter().any(|t| t.is_test_file(&path)) {
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

fn work_dir(tools: &Tools, pr: &PrRef) -> PathBuf {
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
        let py = &python::Python as &dyn Toolchain;
        assert!(py.is_test_file("tests/test_api.py") && py.is_test_file("pkg/api_test.py"));
        assert!(py.is_test_file("jinja2/testsuite/core_tags.py"));
        assert!(!py.is_test_file("tests/conftest.py") && !py.is_test_file("tests/res/test.txt"));
    }

    /// Adding a language is a module and a line of [`TOOLCHAINS`]: each toolchain has a name
    /// of its own, claims trees by project files no other claims, takes test files no other
    /// takes, and has a rule in the test-file table.
    #[test]
    fn the_toolchain_table_walks() {
        let mut names = BTreeSet::new();
        let mut files = BTreeSet::new();
        for t in TOOLCHAINS {
            assert!(names.insert(t.name()), "{} twice", t.name());
            assert!(!t.project_files().is_empty(), "{} claims nothing", t.name());
            for f in t.project_files() {
                assert!(files.insert(*f), "{f} claimed twice");
            }
            assert!(
                crate::testfiles::RULES.iter().any(|r| r.toolchain == t.name()),
                "{} has no test-file rule",
                t.name()
            );
            assert!(!t.test_file_kinds().is_empty());
        }
        let samples = ["tests/test_a.py", "test/a.test.js", "test/a.spec.ts", "tests/it/main.rs"];
        for s in samples {
            let takers: Vec<&str> = TOOLCHAINS.iter().filter(|t| t.is_test_file(s)).map(|t| t.name()).collect();
            assert!(takers.len() <= 1, "{s} is taken by {takers:?}");
        }
        for (f, _) in WITHOUT_TOOLCHAIN {
            assert!(!files.contains(f), "{f} has a toolchain and is listed without one");
        }
        assert_eq!(Status::ALL.len(), Status::ALL.iter().map(|s| s.as_str()).collect::<BTreeSet<_>>().len());
    }

    #[test]
    fn the_window_of_merge_dates() {
        let cfg = VerifyConfig { since: "2024-01-01".into(), until: "2024-12-31".into(), ..Default::default() };
        assert!(cfg.in_window("2024-06-01T10:00:00Z") && cfg.in_window("2024-12-31T23:59:59Z"));
        assert!(!cfg.in_window("2023-12-31T23:59:59Z") && !cfg.in_window("2025-01-01T00:00:00Z"));
        assert!(VerifyConfig::default().in_window("2001-01-01T00:00:00Z"));
    }
}
