//! One PR's runs: each side's scratch tree (the merge base with the PR's test files, then with
//! all its changes) and pytest (or a JavaScript runner, [`super::node`]) in the sandbox, `repeat` times, its JUnit report read per test.

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use git2::{Oid, Repository};

use super::outcomes::{self, TestResult};
use super::{env, sandbox, tree, Plan, VerifyConfig};

/// The runs of both sides.
pub(super) struct Sides {
    pub before: Vec<Vec<TestResult>>,
    pub after: Vec<Vec<TestResult>>,
    pub after_tail: String,
}

/// Materializes and runs each side `repeat` times; a side that cannot run ends the PR with
/// its status.
#[allow(clippy::too_many_arguments)]
pub(super) fn run_sides(
    repo: &Repository,
    plan: &Plan,
    modules: &[String],
    env: &env::Env,
    tools: &env::Tools,
    sandbox: &sandbox::Sandbox,
    cfg: &VerifyConfig,
    work: &Path,
    repo_name: &str,
    pr_number: i64,
) -> std::result::Result<Sides, (&'static str, String)> {
    let mut sides = Sides { before: Vec::new(), after: Vec::new(), after_tail: String::new() };
    for side in ["before", "after"] {
        let dir = work.join(side);
        let tree = dir.join("tree");
        let overlay: &[String] = if side == "before" { &plan.test_paths } else { &plan.all_paths };
        materialize(
            repo,
            plan.base,
            plan.head,
            overlay,
            &tree,
            &format!("{repo_name} at the merge base of #{pr_number}"),
        )
        .map_err(|e| ("patch_failed", format!("{side}: {e:#}")))?;
        for run in 1..=cfg.repeat.max(1) {
            let r = run_tests(&tree, &dir, &format!("{side}-{run}"), modules, env, tools, sandbox, cfg)
                .map_err(|e| ("env_failed", format!("{side} run {run}: {e:#}")))?;
            match r {
                RunOutcome::Report(tests, tail) => {
                    if side == "after" {
                        sides.after_tail = tail;
                        sides.after.push(tests);
                    } else {
                        sides.before.push(tests);
                    }
                }
                RunOutcome::TimedOut(tail) => {
                    return Err((
                        "timeout",
                        format!("{side} run {run} passed the {} s limit: {tail}", cfg.timeout_secs),
                    ))
                }
                // A test file that does not load before the fix (it requires what the fix
                // adds) stops mocha before any report, with its exit status 1: its tests are
                // absent there, as pytest reports a module it cannot collect. A crash (a
                // signal, V8 out of memory) is not that.
                RunOutcome::NoReport(Some(1), _)
                    if side == "before"
                        && env.node.as_ref().is_some_and(|n| n.runner == super::node::Runner::Mocha) =>
                {
                    sides.before.push(Vec::new())
                }
                RunOutcome::NoReport(Some(5), tail) => {
                    return Err(("tests_not_found", format!("{side} run {run}: no test collected: {tail}")))
                }
                RunOutcome::NoReport(code, tail) => {
                    return Err((
                        "env_failed",
                        format!("{side} run {run}: the runner wrote no report (exit {code:?}): {tail}"),
                    ))
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

/// How one run of the runner ended.
pub enum RunOutcome {
    Report(Vec<TestResult>, String),
    TimedOut(String),
    NoReport(Option<i32>, String),
}

/// Runs pytest on `modules` (the whole suite when empty) in `tree`, in the sandbox: only
/// `side_dir` (the tree and its reports) is writable.
#[allow(clippy::too_many_arguments)]
pub fn run_tests(
    tree: &Path,
    side_dir: &Path,
    label: &str,
    modules: &[String],
    env: &env::Env,
    tools: &env::Tools,
    sandbox: &sandbox::Sandbox,
    cfg: &VerifyConfig,
) -> Result<RunOutcome> {
    if let Some(run) = &env.node {
        return super::node::run_tests(tree, side_dir, label, modules, env, run, tools, sandbox, cfg);
    }
    let out = side_dir.join("out");
    std::fs::create_dir_all(&out)?;
    let junit = out.join(format!("{label}.xml"));
    let log = out.join(format!("{label}.log"));
    let _ = std::fs::remove_file(&junit);
    let mut argv: Vec<String> = vec![
        env.venv.join("bin/python").to_string_lossy().to_string(),
        "-m".into(),
        "pytest".into(),
        "-p".into(),
        "no:cacheprovider".into(),
        "-o".into(),
        "junit_family=xunit1".into(),
        format!("--junitxml={}", junit.display()),
        "-q".into(),
        "--color=no".into(),
        "-rN".into(),
    ];
    if !cfg.whole_suite {
        argv.extend(modules.iter().cloned());
    }
    let src = tree.join("src");
    let pythonpath = if src.is_dir() { src } else { tree.to_path_buf() };
    let envs = vec![
        ("PATH".to_string(), format!("{}:/usr/bin:/bin", env.venv.join("bin").display())),
        ("HOME".to_string(), "/tmp".to_string()),
        ("PYTHONPATH".to_string(), pythonpath.to_string_lossy().to_string()),
        ("PYTHONDONTWRITEBYTECODE".to_string(), "1".to_string()),
        ("PYTHONHASHSEED".to_string(), "0".to_string()),
        ("LANG".to_string(), "C.UTF-8".to_string()),
        ("TZ".to_string(), "UTC".to_string()),
    ];
    let mounts = sandbox::Mounts {
        read_only: vec![tools.python_prefix.clone(), env.venv.clone()],
        writable: vec![side_dir.to_path_buf()],
        ..Default::default()
    };
    let exit = sandbox.run(&argv, tree, &envs, &mounts, &log, Duration::from_secs(cfg.timeout_secs))?;
    let tail = without_durations(&sandbox::tail(&log, 15));
    if exit.timed_out {
        return Ok(RunOutcome::TimedOut(tail));
    }
    // The report is the run's own file: read without following a link it may have left.
    match sandbox::read_output(&junit, side_dir, 256 << 20) {
        Ok(xml) => Ok(RunOutcome::Report(outcomes::parse_junit(&xml)?, tail)),
        Err(_) => Ok(RunOutcome::NoReport(exit.code, tail)),
    }
}

/// The line of a runner's output that says what went wrong (pytest's `E   ` lines, else the
/// last line).
pub(super) fn last_error_line(tail: &str) -> String {
    let lines: Vec<&str> = tail.lines().collect();
    lines
        .iter()
        .rev()
        .find(|l| l.starts_with("E ") && l.trim().len() > 2)
        .or(lines.last())
        .map(|l| l.trim_start_matches('E').trim().to_string())
        .unwrap_or_default()
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
        assert_eq!(last_error_line("x\nE   ImportError: no\n- generated"), "ImportError: no");
    }
}
