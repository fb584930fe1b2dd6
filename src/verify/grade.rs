//! The grader: a patch run against a verified instance's tests, the one path `evaluate`,
//! `reward --rollouts`, `train --online`, `eval` and the grading service share.
//!
//! A patch is applied to the instance's merge base inside the sandbox (git apply, else patch
//! with fuzz, as SWE-bench's harness tries), the PR's test files are put as the PR left them,
//! and the instance's test files run once in the environment its after side was verified in.
//! Resolved: every FAIL_TO_PASS and PASS_TO_PASS test passes (SWE-bench's rule, [`judge`]).
//!
//! What is reused: the environment and a pristine tree of the merge base are prepared once per
//! instance (the first grading of an instance does it; the others wait for it), and an
//! (instance, patch) pair already graded is answered from memory. Gradings run on `jobs`
//! threads, each in a sandbox of its own.
//!
//! [`judge`]: super::judge

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use swelake_reward::modes::TestOutcome;

use super::judge::Grade;
use super::toolchain::{one_line, Env, RunCtx, Tools};
use super::{sandbox, Plan, PrRef, VerifyConfig};
use crate::git::Mirrors;
use crate::lake::Lake;

/// A verified instance of the lake.
#[derive(Debug, Clone, Deserialize)]
pub struct Instance {
    pub repo_name: String,
    pub pr_number: i64,
    pub merge_base: String,
    pub head_sha: String,
    pub merged_at: String,
    pub fail_to_pass: Vec<String>,
    pub pass_to_pass: Vec<String>,
    pub test_files: Vec<String>,
    /// The environment its merge base was verified in.
    pub env_key: String,
}

impl Instance {
    /// The seed's id of the instance: `owner/name#N`.
    pub fn seed_id(&self) -> String {
        format!("{}#{}", self.repo_name, self.pr_number)
    }
}

const VERIFIED_SQL: &str = "SELECT v.repo_name, v.pr_number, v.merge_base, v.head_sha, \
     to_char(p.merged_at, '%Y-%m-%dT%H:%M:%SZ') AS merged_at, v.fail_to_pass, v.pass_to_pass, v.test_files, v.env_key \
     FROM pr_verification v JOIN pull_requests p ON p.repo_name = v.repo_name AND p.number = v.pr_number \
     WHERE v.status = 'verified' ORDER BY v.repo_name, v.pr_number";

/// SWE-bench's id of a PR: `owner__name-N`.
pub fn swebench_id(repo_name: &str, pr_number: i64) -> String {
    let (owner, name) = repo_name.split_once('/').unwrap_or(("", repo_name));
    format!("{owner}__{name}-{pr_number}")
}

/// The lake's verified instances by both ids (`owner__name-N` and `owner/name#N`).
pub async fn verified_instances(lake: &Lake) -> Result<BTreeMap<String, Arc<Instance>>> {
    if !lake.has_table(super::PR_VERIFICATION).await? {
        bail!("no pr_verification table in this lake: run `swelake run verify` first");
    }
    let ctx = lake.session().await?;
    let rows: Vec<Instance> = crate::query::rows(&ctx, VERIFIED_SQL).await?;
    let mut by_id = BTreeMap::new();
    for v in rows {
        let v = Arc::new(v);
        by_id.insert(swebench_id(&v.repo_name, v.pr_number), v.clone());
        by_id.insert(v.seed_id(), v);
    }
    Ok(by_id)
}

/// A grading with its per-test outcomes.
#[derive(Debug, Clone)]
pub struct Graded {
    pub outcome: TestOutcome,
    /// Test id → outcome of the run after the patch.
    pub tests: BTreeMap<String, String>,
    /// Answered from the cache of graded patches.
    pub cached: bool,
}

impl Graded {
    fn error(reason: impl Into<String>) -> Graded {
        Graded { outcome: TestOutcome::error(reason), tests: BTreeMap::new(), cached: false }
    }

    /// The same grade, answered without a run (0 seconds).
    fn as_cached(&self) -> Graded {
        Graded {
            outcome: TestOutcome { seconds: 0.0, ..self.outcome.clone() },
            tests: self.tests.clone(),
            cached: true,
        }
    }
}

/// An instance made ready once: its plan, environment and a tree of its merge base.
struct Ready {
    plan: Plan,
    env: Env,
    /// The merge base, written once; each grading copies it.
    base_tree: PathBuf,
    modules: Vec<String>,
}

type Slot = Arc<Mutex<Option<Result<Arc<Ready>, String>>>>;

/// Grades patches against a lake's verified instances.
pub struct Grader {
    instances: BTreeMap<String, Arc<Instance>>,
    mirrors: Mirrors,
    cfg: VerifyConfig,
    tools: Tools,
    sandbox: sandbox::Sandbox,
    /// Where instances' base trees and the gradings' scratch trees go.
    work: PathBuf,
    ready: Mutex<HashMap<String, Slot>>,
    done: Mutex<HashMap<(String, String), Graded>>,
    seq: AtomicU64,
    jobs: usize,
    /// Patches larger than this are refused without running (bytes).
    pub max_patch_bytes: usize,
}

impl Grader {
    /// A grader over `lake`'s verified instances; `jobs` gradings at once (0: `[verify] jobs`).
    pub async fn open(lake: &Lake, mirrors: Mirrors, cfg: VerifyConfig, jobs: usize) -> Result<Grader> {
        let instances = verified_instances(lake).await?;
        Self::new(instances, mirrors, cfg, jobs)
    }

    pub fn new(
        instances: BTreeMap<String, Arc<Instance>>,
        mirrors: Mirrors,
        cfg: VerifyConfig,
        jobs: usize,
    ) -> Result<Grader> {
        let sandbox =
            sandbox::Sandbox::new(&cfg.sandbox, cfg.memory_mb, cfg.max_processes)?.with_run_memory(cfg.run_memory_mb);
        let tools = Tools::prepare(&cfg, &mirrors.cache_dir)?;
        let work = tools.root.join("grade").join(format!("{}-{}", std::process::id(), uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
        let jobs = if jobs > 0 { jobs } else { cfg.workers() };
        Ok(Grader {
            instances,
            mirrors,
            cfg,
            tools,
            sandbox,
            work,
            ready: Mutex::default(),
            done: Mutex::default(),
            seq: AtomicU64::new(0),
            jobs,
            max_patch_bytes: 1 << 20,
        })
    }

    /// What bounds each run, for a log line.
    pub fn sandbox_bounds(&self) -> String {
        self.sandbox.bounds()
    }

    /// The verified instance `id` names (`owner__name-N` or `owner/name#N`).
    pub fn instance(&self, id: &str) -> Option<&Arc<Instance>> {
        self.instances.get(id)
    }

    /// Verified instances (each once).
    pub fn instance_count(&self) -> usize {
        self.instances.len() / 2
    }

    /// Gradings at once.
    pub fn jobs(&self) -> usize {
        self.jobs
    }

    /// Grades `patch` against instance `id`; with `logs`, the patch, the apply logs and the
    /// test output are kept there. Never fails: what stops a grading is its outcome.
    pub fn grade(&self, id: &str, patch: &str, logs: Option<&Path>) -> Graded {
        let Some(inst) = self.instances.get(id).cloned() else {
            return Graded::error(format!("{id} is not a verified instance of this lake"));
        };
        if patch.trim().is_empty() {
            return Graded::error("empty patch");
        }
        if patch.len() > self.max_patch_bytes {
            return Graded::error(format!(
                "the patch has {} bytes, over the limit of {}: not run",
                patch.len(),
                self.max_patch_bytes
            ));
        }
        // Keyed by the whole patch: a hash collision would hand one patch another's grade.
        let key = (inst.seed_id(), patch.to_string());
        if logs.is_none() {
            if let Some(g) = self.done.lock().expect("cache lock").get(&key) {
                return g.as_cached();
            }
        }
        let t0 = Instant::now();
        let mut g = match self.ready(&inst) {
            Ok(ready) => match self.run(&inst, &ready, patch, logs) {
                Ok(g) => g,
                Err(e) => Graded::error(one_line(&format!("{e:#}"))),
            },
            Err(why) => Graded::error(why),
        };
        g.outcome.seconds = t0.elapsed().as_secs_f64();
        if g.outcome.graded() {
            self.done.lock().expect("cache lock").insert(key, g.clone());
        }
        g
    }

    /// Grades many (instance, patch) pairs on `jobs` threads; results in input order. A pair
    /// that occurs twice is run once.
    pub fn grade_many(&self, items: &[(String, String)]) -> Vec<Graded> {
        self.grade_many_logged(items, None)
    }

    /// [`Grader::grade_many`], each grading's logs kept in `logs(i)` when given (pairs are
    /// then each run, however often they occur).
    pub fn grade_many_logged(
        &self,
        items: &[(String, String)],
        logs: Option<&(dyn Fn(usize) -> PathBuf + Sync)>,
    ) -> Vec<Graded> {
        let mut unique: Vec<usize> = Vec::new();
        let mut first: HashMap<(&str, &str), usize> = HashMap::new();
        let of: Vec<usize> = items
            .iter()
            .enumerate()
            .map(|(i, (id, p))| {
                if logs.is_some() {
                    unique.push(i);
                    return i;
                }
                *first.entry((id.as_str(), p.as_str())).or_insert_with(|| {
                    unique.push(i);
                    i
                })
            })
            .collect();
        let next = AtomicU64::new(0);
        let results: Mutex<HashMap<usize, Graded>> = Mutex::default();
        std::thread::scope(|s| {
            for _ in 0..self.jobs.min(unique.len()).max(1) {
                s.spawn(|| loop {
                    let k = next.fetch_add(1, Ordering::SeqCst) as usize;
                    let Some(&i) = unique.get(k) else { break };
                    let (id, patch) = &items[i];
                    let dir = logs.map(|f| f(i));
                    let g = self.grade(id, patch, dir.as_deref());
                    results.lock().expect("results lock").insert(i, g);
                });
            }
        });
        let results = results.into_inner().expect("results lock");
        of.iter()
            .enumerate()
            .map(|(i, &f)| {
                let g = &results[&f];
                if i != f {
                    g.as_cached()
                } else {
                    g.clone()
                }
            })
            .collect()
    }

    /// [`Grader::grade_many`]'s outcomes alone: what a reward needs.
    pub fn outcomes(&self, items: &[(String, String)]) -> Vec<TestOutcome> {
        self.grade_many(items).into_iter().map(|g| g.outcome).collect()
    }

    /// The instance's plan, environment and base tree, made by the first grading that asks.
    fn ready(&self, inst: &Instance) -> Result<Arc<Ready>, String> {
        let slot = self.ready.lock().expect("ready lock").entry(inst.seed_id()).or_default().clone();
        let mut slot = slot.lock().expect("slot lock");
        if let Some(r) = slot.as_ref() {
            return r.clone();
        }
        let r = self.prepare(inst).map(Arc::new).map_err(|e| one_line(&format!("{e:#}")));
        *slot = Some(r.clone());
        r
    }

    fn prepare(&self, i: &Instance) -> Result<Ready> {
        let repo = self.mirrors.open(&i.repo_name).map_err(|f| anyhow::anyhow!("{}: {}", f.reason, f.message))?;
        let pr = PrRef {
            repo_name: i.repo_name.clone(),
            pr_number: i.pr_number,
            merge_base: i.merge_base.clone(),
            head_sha: i.head_sha.clone(),
            merged_at: i.merged_at.clone(),
        };
        let plan = super::plan(&repo, &pr)?;
        let toolchain = super::toolchain_at(&repo, plan.base).map_err(anyhow::Error::msg)?;
        // The environment the instance's after side ran in: a patch is graded where the fix
        // was verified.
        let envs = super::prepare_sides(&repo, &plan, toolchain, &pr, &self.tools, &self.sandbox)
            .map_err(|stop| anyhow::anyhow!("environment ({}): {}", stop.status, stop.reason))?;
        // An environment resolved differently today (a newer swelake's rules, a cache
        // emptied) is not where the instance was verified: its verdicts would not be the
        // instance's.
        if !i.env_key.is_empty() && envs.before.env.key != i.env_key {
            bail!(
                "the environment built today ({}) is not the one {} was verified in ({}): verify it again (`swelake run verify --force`)",
                envs.before.env.key,
                i.seed_id(),
                i.env_key
            );
        }
        let env = envs.after().clone();
        let base_tree = self.work.join(format!("base-{}", crate::files::path_segment(&i.seed_id()))).join("tree");
        let _ = std::fs::remove_dir_all(&base_tree);
        super::runner::materialize(&repo, plan.base, plan.head, &[], &base_tree, "base")?;
        let modules = if i.test_files.is_empty() { super::modules_for(toolchain, &plan) } else { i.test_files.clone() };
        Ok(Ready { plan, env, base_tree, modules })
    }

    /// One grading: a copy of the base tree, the patch applied in the sandbox, the PR's test
    /// files overlaid, the tests run.
    fn run(&self, i: &Instance, ready: &Ready, patch: &str, logs: Option<&Path>) -> Result<Graded> {
        // With logs the run's tree sits beside them ([verify] keep_trees keeps it for a look).
        let side = match logs {
            Some(l) => l.join("run"),
            None => self.work.join(format!("run-{}", self.seq.fetch_add(1, Ordering::SeqCst))),
        };
        let _ = std::fs::remove_dir_all(&side);
        std::fs::create_dir_all(&side)?;
        let logs_dir = logs.map(Path::to_path_buf).unwrap_or_else(|| side.join("logs"));
        std::fs::create_dir_all(&logs_dir)?;
        let result = self.run_in(i, ready, patch, &side, &logs_dir);
        if !self.cfg.keep_trees {
            let _ = std::fs::remove_dir_all(&side);
        }
        result
    }

    fn run_in(&self, i: &Instance, ready: &Ready, patch: &str, side: &Path, logs: &Path) -> Result<Graded> {
        let tree = side.join("tree");
        copy_tree(&ready.base_tree, &tree)?;
        std::fs::write(logs.join("patch.diff"), patch)?;
        std::fs::write(side.join("model.patch"), patch)?;
        let mounts = sandbox::Mounts { writable: vec![side.to_path_buf()], ..Default::default() };
        let envs = vec![("PATH".to_string(), "/usr/bin:/bin".to_string()), ("HOME".to_string(), "/tmp".to_string())];
        let patch_file = side.join("model.patch").to_string_lossy().to_string();
        let attempts: [Vec<String>; 2] = [
            vec!["git".into(), "apply".into(), "--verbose".into(), "--reject".into(), patch_file.clone()],
            vec!["patch".into(), "--batch".into(), "--fuzz=5".into(), "-p1".into(), "-i".into(), patch_file],
        ];
        let mut applied = false;
        for (k, argv) in attempts.iter().enumerate() {
            let log = logs.join(format!("apply-{}.log", k + 1));
            let exit = self.sandbox.run(argv, &tree, &envs, &mounts, &log, std::time::Duration::from_secs(60))?;
            if exit.code == Some(0) {
                applied = true;
                break;
            }
            // A failed `git apply --reject` may leave part of the patch: start again.
            copy_tree(&ready.base_tree, &tree)?;
        }
        if !applied {
            let outcome = TestOutcome {
                status: "patch_failed".into(),
                f2p_total: i.fail_to_pass.len() as u32,
                p2p_total: i.pass_to_pass.len() as u32,
                reason: one_line(&format!("the patch does not apply: {}", sandbox::tail(&logs.join("apply-2.log"), 3))),
                ..Default::default()
            };
            return Ok(Graded { outcome, tests: BTreeMap::new(), cached: false });
        }
        let repo = self.mirrors.open(&i.repo_name).map_err(|f| anyhow::anyhow!("{}: {}", f.reason, f.message))?;
        for p in &ready.plan.test_paths {
            super::tree::overlay(&repo, &tree, ready.plan.head, p)?;
        }
        drop(repo);
        let ctx = RunCtx {
            tree: &tree,
            side_dir: side,
            label: "eval",
            tools: &self.tools,
            sandbox: &self.sandbox,
            cfg: &self.cfg,
        };
        let runner = ready.env.runner.as_ref();
        let out = runner.before_runs(&ctx).map_err(anyhow::Error::msg).and_then(|()| runner.run(&ctx, &ready.modules));
        // The log sits in the run's writable tree: a link the patch left there is not followed.
        if let Ok(text) = sandbox::read_output(&side.join("out/eval.log"), side, 64 << 20) {
            let _ = std::fs::write(logs.join("test_output.txt"), text);
        }
        let (grade, reason, tests) =
            super::judge::grade(runner, out?, &i.fail_to_pass, &i.pass_to_pass, self.cfg.timeout_secs);
        let passes = |t: &String| tests.get(t).map(String::as_str) == Some("passed");
        let outcome = TestOutcome {
            status: grade.as_str().to_string(),
            resolved: grade == Grade::Resolved,
            f2p_passed: i.fail_to_pass.iter().filter(|t| passes(t)).count() as u32,
            f2p_total: i.fail_to_pass.len() as u32,
            p2p_passed: i.pass_to_pass.iter().filter(|t| passes(t)).count() as u32,
            p2p_total: i.pass_to_pass.len() as u32,
            seconds: 0.0,
            reason,
        };
        Ok(Graded { outcome, tests, cached: false })
    }
}

impl Drop for Grader {
    fn drop(&mut self) {
        if !self.cfg.keep_trees {
            let _ = std::fs::remove_dir_all(&self.work);
        }
    }
}

/// `dst` made a copy of `src` (modes and links kept), replacing what was there.
fn copy_tree(src: &Path, dst: &Path) -> Result<()> {
    let _ = std::fs::remove_dir_all(dst);
    let out = std::process::Command::new("cp")
        .arg("-a")
        .arg("--reflink=auto")
        .arg(src)
        .arg(dst)
        .output()
        .context("running cp")?;
    if !out.status.success() {
        bail!("copying {} to {}: {}", src.display(), dst.display(), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}
