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

use super::grade::Grader;
use super::VerifyConfig;
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

pub use super::grade::swebench_id;

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

/// Grades `opts.predictions` against the lake's verified instances, `[verify] jobs` at once.
pub async fn evaluate(lake: &Lake, opts: &EvaluateOptions) -> Result<Report> {
    let predictions = read_predictions(&opts.predictions)?;
    let grader = Grader::open(lake, opts.mirrors.clone(), opts.cfg.clone(), 0).await?;
    let mut report = Report {
        total_instances: grader.instance_count(),
        submitted_instances: predictions.len(),
        schema_version: 2,
        ..Default::default()
    };
    let logs = opts.out.parent().unwrap_or(Path::new(".")).join("logs");
    std::fs::create_dir_all(&logs)?;
    let mut seen = BTreeSet::new();
    let mut to_grade: Vec<(String, String)> = Vec::new();
    let mut models: Vec<Option<String>> = Vec::new();
    for p in &predictions {
        let id = p.instance_id.clone();
        if !seen.insert(id.clone()) {
            bail!("{}: the instance {id} is predicted twice", opts.predictions.display());
        }
        report.submitted_ids.push(id.clone());
        let patch = p.model_patch.clone().unwrap_or_default();
        if grader.instance(&id).is_none() {
            report.error_ids.push(id.clone());
            report.reasons.insert(id, "not a verified instance of this lake".into());
            continue;
        }
        if patch.trim().is_empty() {
            report.empty_patch_ids.push(id.clone());
            report.reasons.insert(id, "empty patch".into());
            continue;
        }
        let dir = logs.join(crate::files::path_segment(&id));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        to_grade.push((id, patch));
        models.push(p.model_name_or_path.clone());
    }
    if !to_grade.is_empty() {
        eprintln!(
            "evaluate: {} patch(es), {} at once; sandbox: {}",
            to_grade.len(),
            grader.jobs(),
            grader.sandbox_bounds()
        );
    }
    let grader = std::sync::Arc::new(grader);
    let (g, items, logs2) = (grader.clone(), to_grade.clone(), logs.clone());
    let graded = tokio::task::spawn_blocking(move || {
        let dir_of = |i: usize| logs2.join(crate::files::path_segment(&items[i].0));
        g.grade_many_logged(&items, Some(&dir_of))
    })
    .await?;
    for (((id, _), g), model) in to_grade.iter().zip(&graded).zip(&models) {
        let o = &g.outcome;
        // SWE-bench counts a patch that does not apply as an error.
        let status = if o.status == "patch_failed" { "error" } else { o.status.as_str() };
        let reason = if o.status == "patch_failed" { format!("{} (patch_failed)", o.reason) } else { o.reason.clone() };
        let record = serde_json::json!({
            "instance_id": id,
            "model_name_or_path": model,
            "status": status,
            "reason": reason,
            "f2p_passed": o.f2p_passed,
            "f2p_total": o.f2p_total,
            "p2p_passed": o.p2p_passed,
            "p2p_total": o.p2p_total,
            "seconds": o.seconds,
            "tests_status": g.tests,
        });
        let dir = logs.join(crate::files::path_segment(id));
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
        report.reasons.insert(id.clone(), reason);
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
