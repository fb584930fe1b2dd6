//! Where a verdict is decided, for `verify` and `evaluate` alike: what one run of a side gives
//! (its tests, or what stops the PR — a timeout, no test collected, a runner that failed, as
//! its toolchain reads a missing report), a PR's status from both sides' runs, and a
//! prediction's grade from the run after its patch.

use std::collections::BTreeMap;

use super::outcomes::{self, Outcome, TestResult, Verdict};
use super::toolchain::{Missing, RunOutcome, Side, Status, TestRunner};

/// The tests one run on `side` reported (with its log's last lines), or the status and reason
/// that end the PR.
pub fn side_run(
    runner: &dyn TestRunner,
    side: Side,
    out: RunOutcome,
    timeout_secs: u64,
) -> Result<(Vec<TestResult>, String), (Status, String)> {
    match out {
        RunOutcome::Report(tests, tail) => Ok((tests, tail)),
        RunOutcome::TimedOut(tail) => Err((Status::Timeout, format!("passed the {timeout_secs} s limit: {tail}"))),
        RunOutcome::NoReport(code, tail) => match runner.missing_report(side, code) {
            Missing::Absent => Ok((Vec::new(), tail)),
            Missing::NoTests => Err((Status::TestsNotFound, format!("no test collected: {tail}"))),
            Missing::Failed => Err((Status::EnvFailed, format!("the runner wrote no report (exit {code:?}): {tail}"))),
        },
    }
}

/// A PR's status and reason from the runs of both sides, with SWE-bench's lists.
pub fn pr_verdict(
    runner: &dyn TestRunner,
    before: &[Vec<TestResult>],
    after: &[Vec<TestResult>],
    after_tail: &str,
    repeat: u32,
) -> (Status, String, Verdict) {
    let verdict = outcomes::verdict(before, after);
    let n_after = after.first().map_or(0, |r| r.len());
    if !verdict.fail_to_pass.is_empty() {
        let flaky =
            if verdict.flaky.is_empty() { String::new() } else { format!(", {} flaky left out", verdict.flaky.len()) };
        let why = format!(
            "{} fail before and pass after, {} pass on both sides{flaky} ({repeat} runs a side)",
            verdict.fail_to_pass.len(),
            verdict.pass_to_pass.len(),
        );
        return (Status::Verified, why, verdict);
    }
    if !verdict.flaky.is_empty() {
        let why = format!("no stable test fails before and passes after; {} flaky", verdict.flaky.len());
        return (Status::Flaky, why, verdict);
    }
    if n_after == 0 {
        return (Status::TestsNotFound, "the runner collected no test in the PR's test files".into(), verdict);
    }
    // Nothing passes even with the fix: the PR's tests cannot run here (code of another
    // interpreter, a dependency of its day that does not import on this one), which is the
    // environment's failure, not a verdict on the PR.
    let passed_after = after.iter().flatten().any(|t| t.outcome == Outcome::Passed);
    let errored_after = after.iter().flatten().any(|t| t.outcome == Outcome::Error);
    if !passed_after && errored_after {
        let why = format!("no test passes even after the change: {}", runner.error_line(after_tail));
        return (Status::EnvFailed, why, verdict);
    }
    let why = if verdict.fail_after.is_empty() {
        format!("every test that passes after the change also passes before it ({} tests)", verdict.pass_to_pass.len())
    } else {
        format!(
            "{} test(s) do not pass after the change (first: {}); none fails before and passes after",
            verdict.fail_after.len(),
            verdict.fail_after[0]
        )
    };
    (Status::NoFailToPass, why, verdict)
}

/// How a prediction landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grade {
    Resolved,
    Unresolved,
    Error,
}

impl Grade {
    pub fn as_str(self) -> &'static str {
        match self {
            Grade::Resolved => "resolved",
            Grade::Unresolved => "unresolved",
            Grade::Error => "error",
        }
    }
}

/// SWE-bench's rule on the run after a model's patch: resolved when every FAIL_TO_PASS and
/// PASS_TO_PASS test passes. A run that ends the way a PR's after side would be stopped
/// (timeout, no report) is unresolved, with that reason. Answers the grade, why, and each
/// test's outcome.
pub fn grade(
    runner: &dyn TestRunner,
    out: RunOutcome,
    fail_to_pass: &[String],
    pass_to_pass: &[String],
    timeout_secs: u64,
) -> (Grade, String, BTreeMap<String, String>) {
    let tests = match side_run(runner, Side::After, out, timeout_secs) {
        Ok((tests, _)) => tests,
        Err((status, why)) => return (Grade::Unresolved, format!("{status}: {why}"), BTreeMap::new()),
    };
    let status: BTreeMap<String, String> =
        tests.iter().map(|t| (t.test_id.clone(), t.outcome.as_str().to_string())).collect();
    let passes = |id: &String| status.get(id).map(String::as_str) == Some("passed");
    let f2p_failing: Vec<&String> = fail_to_pass.iter().filter(|t| !passes(t)).collect();
    let p2p_failing: Vec<&String> = pass_to_pass.iter().filter(|t| !passes(t)).collect();
    if f2p_failing.is_empty() && p2p_failing.is_empty() {
        let why = format!("{} FAIL_TO_PASS and {} PASS_TO_PASS pass", fail_to_pass.len(), pass_to_pass.len());
        return (Grade::Resolved, why, status);
    }
    let first = f2p_failing.first().or(p2p_failing.first()).map(|s| s.as_str()).unwrap_or("");
    let why = format!(
        "{} of {} FAIL_TO_PASS and {} of {} PASS_TO_PASS do not pass (first: {first})",
        f2p_failing.len(),
        fail_to_pass.len(),
        p2p_failing.len(),
        pass_to_pass.len()
    );
    (Grade::Unresolved, why, status)
}
