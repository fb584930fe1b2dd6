//! One PR's runs: each side's scratch tree (the merge base with the PR's test files, then with
//! all its changes) and its environment's runner in the sandbox, `repeat` times.

use std::path::Path;

use anyhow::Result;
use git2::{Oid, Repository};

use super::outcomes::TestResult;
use super::sandbox::Sandbox;
use super::toolchain::{Env, RunCtx, Side, Status, Tools};
use super::{tree, Plan, VerifyConfig};

/// The runs of both sides.
pub(super) struct Sides {
    pub before: Vec<Vec<TestResult>>,
    pub after: Vec<Vec<TestResult>>,
    pub after_tail: String,
}

/// Materializes each side, runs its build steps in its environment (`envs`: before, after), and runs its tests `repeat` times; a side
/// that cannot run ends the PR with its status ([`super::judge::side_run`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn run_sides(
    repo: &Repository,
    plan: &Plan,
    modules: &[String],
    envs: [&Env; 2],
    tools: &Tools,
    sandbox: &Sandbox,
    cfg: &VerifyConfig,
    work: &Path,
    repo_name: &str,
    pr_number: i64,
) -> std::result::Result<Sides, (Status, String)> {
    let mut sides = Sides { before: Vec::new(), after: Vec::new(), after_tail: String::new() };
    for (side, env) in [Side::Before, Side::After].into_iter().zip(envs) {
        let name = side.as_str();
        let dir = work.join(name);
        let tree = dir.join("tree");
        let overlay: &[String] = if side == Side::Before { &plan.test_paths } else { &plan.all_paths };
        materialize(
            repo,
            plan.base,
            plan.head,
            overlay,
            &tree,
            &format!("{repo_name} at the merge base of #{pr_number}"),
        )
        .map_err(|e| (Status::PatchFailed, format!("{name}: {e:#}")))?;
        let ctx = RunCtx { tree: &tree, side_dir: &dir, label: name, tools, sandbox, cfg };
        env.runner.before_runs(&ctx).map_err(|e| (Status::EnvFailed, format!("{name}: {e}")))?;
        for run in 1..=cfg.repeat.max(1) {
            let label = format!("{name}-{run}");
            let ctx = RunCtx { label: &label, ..ctx };
            let out =
                env.runner.run(&ctx, modules).map_err(|e| (Status::EnvFailed, format!("{name} run {run}: {e:#}")))?;
            let (tests, tail) = super::judge::side_run(env.runner.as_ref(), side, out, cfg.timeout_secs)
                .map_err(|(status, why)| (status, format!("{name} run {run}: {why}")))?;
            match side {
                Side::Before => sides.before.push(tests),
                Side::After => {
                    sides.after_tail = tail;
                    sides.after.push(tests);
                }
            }
        }
    }
    Ok(sides)
}

/// The tree of `base` with `paths` as they are at `head`, and a `.git` holding the base alone.
pub fn materialize(
    repo: &Repository,
    base: Oid,
    head: Oid,
    paths: &[String],
    tree: &Path,
    message: &str,
) -> Result<()> {
    tree::write_commit(repo, base, tree)?;
    tree::init_git(tree, message)?;
    for p in paths {
        tree::overlay(repo, tree, head, p)?;
    }
    modern_pytest_section(tree)
}

/// pytest 4 and later refuse a `[pytest]` section in setup.cfg (it became `[tool:pytest]`);
/// the scratch tree says it the new way, the same on both sides, so a PR of 2015 runs under
/// a pytest that starts on today's interpreter with the options its authors set.
fn modern_pytest_section(tree: &Path) -> Result<()> {
    let cfg = tree.join("setup.cfg");
    let Ok(text) = std::fs::read_to_string(&cfg) else { return Ok(()) };
    if text.lines().any(|l| l.trim() == "[pytest]") {
        let fixed: Vec<&str> = text.lines().map(|l| if l.trim() == "[pytest]" { "[tool:pytest]" } else { l }).collect();
        std::fs::write(&cfg, fixed.join("\n") + "\n")?;
    }
    Ok(())
}

/// A log tail without what differs between two runs of the same tests — the runner's timings
/// (`in 2.31s`) and object addresses (`0x7f3a…`) — so two runs give the same text.
pub(super) fn without_durations(text: &str) -> String {
    let timing = regex::Regex::new(r"\bin \d+(\.\d+)?s\b").expect("a valid pattern");
    let address = regex::Regex::new(r"\b0x[0-9a-fA-F]{6,}\b").expect("a valid pattern");
    address.replace_all(&timing.replace_all(text, "in …s"), "0x…").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_tails_lose_what_differs_between_runs() {
        assert_eq!(without_durations("1 failed, 2 passed in 0.31s"), "1 failed, 2 passed in …s");
        assert_eq!(without_durations("<function f at 0x7f3a2b4c5d60>"), "<function f at 0x…>");
    }
}
