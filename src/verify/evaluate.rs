//! `swelake evaluate`: SWE-bench predictions (`instance_id`, `model_name_or_path`,
//! `model_patch`) graded on the lake's verified instances in the same sandbox and environment
//! the verify stage used, by SWE-bench's rule: an instance is resolved when every one of its
//! FAIL_TO_PASS and PASS_TO_PASS tests passes after the model's patch and the PR's test
//! changes are applied. The report has SWE-bench's shape (`resolved_ids`, `unresolved_ids`,
//! `error_ids`, `empty_patch_ids`, counts); each instance's patch, test log and verdict are
//! written under `logs/<instance_id>/` beside it. A model's patch is untrusted: it is applied
//! and run inside the sandbox only.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::judge::Grade;
use super::toolchain::{one_line, RunCtx, Tools};
use super::{sandbox, PrRef, VerifyConfig};
use crate::git::Mirrors;
use crate::lake::Lake;

/// One prediction, as SWE-bench's harness reads it.
#[derive(Debug, Clone, Deserialize)]
pub struct Prediction {
    pub instance_id: String,
    #[serde(default)]
    pub model_name_or_path: Option<String>,
    #[serde(default)]
    pub model_patch: Option<String>,
}

/// What `evaluate` needs.
#[derive(Debug, Clone)]
pub struct EvaluateOptions {
    pub predictions: PathBuf,
    /// The report; the logs go to `logs/` beside it.
    pub out: PathBuf,
    pub mirrors: Mirrors,
    pub cfg: VerifyConfig,
    pub show_progress: bool,
}

/// SWE-bench's run report (`swebench.harness.reporting.make_run_report`), and each
/// instance's reason for where it landed.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Report {
    pub total_instances: usize,
    pub submitted_instances: usize,
    pub completed_instances: usize,
    pub resolved_instances: usize,
    pub unresolved_instances: usize,
    pub empty_patch_instances: usize,
    pub error_instances: usize,
    pub completed_ids: Vec<String>,
    pub incomplete_ids: Vec<String>,
    pub empty_patch_ids: Vec<String>,
    pub submitted_ids: Vec<String>,
    pub resolved_ids: Vec<String>,
    pub unresolved_ids: Vec<String>,
    pub error_ids: Vec<String>,
    pub schema_version: u32,
    /// swelake's own: per instance, one line on why it landed where it did.
    pub reasons: BTreeMap<String, String>,
}

/// A verified instance of the lake.
#[derive(Debug, Clone, Deserialize)]
struct Verified {
    repo_name: String,
    pr_number: i64,
    merge_base: String,
    head_sha: String,
    merged_at: String,
    fail_to_pass: Vec<String>,
    pass_to_pass: Vec<String>,
    test_files: Vec<String>,
}

const VERIFIED_SQL: &str = "SELECT v.repo_name, v.pr_number, v.merge_base, v.head_sha, \
     to_char(p.merged_at, '%Y-%m-%dT%H:%M:%SZ') AS merged_at, v.fail_to_pass, v.pass_to_pass, v.test_files \
     FROM pr_verification v JOIN pull_requests p ON p.repo_name = v.repo_name AND p.number = v.pr_number \
     WHERE v.status = 'verified' ORDER BY v.repo_name, v.pr_number";

/// SWE-bench's id of a PR: `owner__name-N`.
pub fn swebench_id(repo_name: &str, pr_number: i64) -> String {
    let (owner, name) = repo_name.split_once('/').unwrap_or(("", repo_name));
    format!("{owner}__{name}-{pr_number}")
}

/// Reads predictions: JSON lines, or one JSON list (both are what SWE-bench's harness takes).
pub fn read_predictions(path: &Path) -> Result<Vec<Prediction>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    if text.trim_start().starts_with('[') {
        return serde_json::from_str(&text)
            .with_context(|| format!("{}: not a JSON list of predictions", path.display()));
    }
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l)
                .with_context(|| format!("{} line {}: not a prediction object", path.display(), i + 1))
        })
        .collect()
}

/// Grades `opts.predictions` against the lake's verified instances.
pub async fn evaluate(lake: &Lake, opts: &EvaluateOptions) -> Result<Report> {
    let predictions = read_predictions(&opts.predictions)?;
    if !lake.has_table(super::PR_VERIFICATION).await? {
        bail!("no pr_verification table in this lake: run `swelake run verify` first");
    }
    let ctx = lake.session().await?;
    let verified: Vec<Verified> = crate::query::rows(&ctx, VERIFIED_SQL).await?;
    let mut by_id: BTreeMap<String, Verified> = BTreeMap::new();
    for v in verified {
        by_id.insert(swebench_id(&v.repo_name, v.pr_number), v.clone());
        by_id.insert(format!("{}#{}", v.repo_name, v.pr_number), v);
    }
    let mut report = Report {
        total_instances: by_id.len() / 2,
        submitted_instances: predictions.len(),
        schema_version: 2,
        ..Default::default()
    };
    let logs = opts.out.parent().unwrap_or(Path::new(".")).join("logs");
    std::fs::create_dir_all(&logs)?;
    let mut seen = BTreeSet::new();
    let mut tools: Option<(Tools, sandbox::Sandbox)> = None;
    for p in &predictions {
        let id = p.instance_id.clone();
        if !seen.insert(id.clone()) {
            bail!("{}: the instance {id} is predicted twice", opts.predictions.display());
        }
        report.submitted_ids.push(id.clone());
        let patch = p.model_patch.clone().unwrap_or_default();
        let Some(inst) = by_id.get(&id) else {
            report.error_ids.push(id.clone());
            report.reasons.insert(id, "not a verified instance of this lake".into());
            continue;
        };
        if patch.trim().is_empty() {
            report.empty_patch_ids.push(id.clone());
            report.reasons.insert(id, "empty patch".into());
            continue;
        }
        if tools.is_none() {
            let sb = sandbox::Sandbox::new(&opts.cfg.sandbox, opts.cfg.memory_mb, opts.cfg.max_processes)?
                .with_run_memory(opts.cfg.run_memory_mb);
            eprintln!("evaluate: sandbox: {}", sb.bounds());
            tools = Some((Tools::prepare(&opts.cfg, &opts.mirrors.cache_dir)?, sb));
        }
        let (t, sb) = tools.as_ref().expect("prepared above");
        let dir = logs.join(crate::files::path_segment(&id));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("patch.diff"), &patch)?;
        let job = Grading {
            mirrors: opts.mirrors.clone(),
            inst: inst.clone(),
            patch,
            cfg: opts.cfg.clone(),
            tools: t.clone(),
            sandbox: sb.clone(),
            dir: dir.clone(),
        };
        let (status, reason, tests) = tokio::task::spawn_blocking(move || job.run()).await?;
        let status = status.as_str();
        let record = serde_json::json!({
            "instance_id": id,
            "model_name_or_path": p.model_name_or_path,
            "status": status,
            "reason": reason,
            "tests_status": tests,
        });
        std::fs::write(dir.join("report.json"), serde_json::to_string_pretty(&record)? + "\n")?;
        if opts.show_progress {
            eprintln!("evaluate {id}: {status} — {reason}");
        }
        match status {
            "resolved" => report.resolved_ids.push(id.clone()),
            "unresolved" => report.unresolved_ids.push(id.clone()),
            _ => report.error_ids.push(id.clone()),
        }
        if status != "error" {
            report.completed_ids.push(id.clone());
        }
        report.reasons.insert(id, reason);
    }
    report.completed_instances = report.completed_ids.len();
    report.resolved_instances = report.resolved_ids.len();
    report.unresolved_instances = report.unresolved_ids.len();
    report.empty_patch_instances = report.empty_patch_ids.len();
    report.error_instances = report.error_ids.len();
    for ids in [
        &mut report.completed_ids,
        &mut report.empty_patch_ids,
        &mut report.submitted_ids,
        &mut report.resolved_ids,
        &mut report.unresolved_ids,
        &mut report.error_ids,
    ] {
        ids.sort();
    }
    std::fs::write(&opts.out, serde_json::to_string_pretty(&report)? + "\n")
        .with_context(|| format!("writing {}", opts.out.display()))?;
    Ok(report)
}

/// One prediction graded on a blocking thread.
struct Grading {
    mirrors: Mirrors,
    inst: Verified,
    patch: String,
    cfg: VerifyConfig,
    tools: Tools,
    sandbox: sandbox::Sandbox,
    dir: PathBuf,
}

impl Grading {
    /// (resolved | unresolved | error, why, per test: its outcome).
    fn run(self) -> (Grade, String, BTreeMap<String, String>) {
        match self.grade() {
            Ok(x) => x,
            Err(e) => (Grade::Error, one_line(&format!("{e:#}")), BTreeMap::new()),
        }
    }

    /// The verify stage's path: the plan, the toolchain's environment, the side's build steps
    /// and run, and the verdict of [`super::judge`].
    fn grade(&self) -> Result<(Grade, String, BTreeMap<String, String>)> {
        let i = &self.inst;
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
        // The environment the instance's after side ran in: a prediction is graded where the
        // fix was verified.
        let envs = super::prepare_sides(&repo, &plan, toolchain, &pr, &self.tools, &self.sandbox)
            .map_err(|stop| anyhow::anyhow!("environment ({}): {}", stop.status, stop.reason))?;
        let env = envs.after();
        let side = self.dir.join("run");
        let tree = side.join("tree");
        let _ = std::fs::remove_dir_all(&side);
        super::runner::materialize(&repo, plan.base, plan.head, &[], &tree, "base")?;
        std::fs::write(side.join("model.patch"), &self.patch)?;
        // The model's patch is applied inside the sandbox (git apply, else patch with fuzz, as
        // SWE-bench's harness tries), then the PR's test files are put as they were after it.
        let mounts = sandbox::Mounts { writable: vec![side.clone()], ..Default::default() };
        let envs = vec![("PATH".to_string(), "/usr/bin:/bin".to_string()), ("HOME".to_string(), "/tmp".to_string())];
        let patch_file = side.join("model.patch").to_string_lossy().to_string();
        let attempts: [Vec<String>; 2] = [
            vec!["git".into(), "apply".into(), "--verbose".into(), "--reject".into(), patch_file.clone()],
            vec!["patch".into(), "--batch".into(), "--fuzz=5".into(), "-p1".into(), "-i".into(), patch_file],
        ];
        let mut applied = false;
        for (k, argv) in attempts.iter().enumerate() {
            let log = self.dir.join(format!("apply-{}.log", k + 1));
            let exit = self.sandbox.run(argv, &tree, &envs, &mounts, &log, std::time::Duration::from_secs(60))?;
            if exit.code == Some(0) {
                applied = true;
                break;
            }
            // A failed `git apply --reject` may leave part of the patch: start again.
            let _ = std::fs::remove_dir_all(&tree);
            super::runner::materialize(&repo, plan.base, plan.head, &[], &tree, "base")?;
        }
        if !applied {
            return Ok((
                Grade::Error,
                format!("the patch does not apply (patch_failed): {}", sandbox::tail(&self.dir.join("apply-2.log"), 3)),
                BTreeMap::new(),
            ));
        }
        for p in &plan.test_paths {
            super::tree::overlay(&repo, &tree, plan.head, p)?;
        }
        let modules = if i.test_files.is_empty() { super::modules_for(toolchain, &plan) } else { i.test_files.clone() };
        let ctx = RunCtx {
            tree: &tree,
            side_dir: &side,
            label: "eval",
            tools: &self.tools,
            sandbox: &self.sandbox,
            cfg: &self.cfg,
        };
        let out =
            env.runner.before_runs(&ctx).map_err(anyhow::Error::msg).and_then(|()| env.runner.run(&ctx, &modules));
        // The log sits in the run's writable tree: a link the patch left there is not followed.
        if let Ok(text) = sandbox::read_output(&side.join("out/eval.log"), &side, 64 << 20) {
            let _ = std::fs::write(self.dir.join("test_output.txt"), text);
        }
        if !self.cfg.keep_trees {
            let _ = std::fs::remove_dir_all(&side);
        }
        Ok(super::judge::grade(env.runner.as_ref(), out?, &i.fail_to_pass, &i.pass_to_pass, self.cfg.timeout_secs))
    }
}
