//! Per-test outcomes, read from the runner's machine format — pytest's JUnit XML (the `xunit1`
//! family, which names each test's file), jest's and vitest's JSON reports, the records of
//! swelake's reporters for mocha, jasmine and `node --test`, TAP (ava, tap, tape) — and
//! SWE-bench's verdict over the repeats of both sides.

use std::collections::{BTreeMap, BTreeSet};

use std::path::Path;

use anyhow::{Context, Result};
use quick_xml::events::Event;
use serde_json::Value;

/// How one test ended in one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    Passed,
    Skipped,
    Failed,
    Error,
}

impl Outcome {
    /// Its name in `pr_tests.outcome`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Passed => "passed",
            Outcome::Skipped => "skipped",
            Outcome::Failed => "failed",
            Outcome::Error => "error",
        }
    }

    /// The worse of two outcomes of one test (error, then failed, then skipped, then passed).
    fn worst(self, other: Outcome) -> Outcome {
        self.max(other)
    }
}

/// One test's result in one run.
#[derive(Debug, Clone, PartialEq)]
pub struct TestResult {
    /// `path::Class::name[param]`, as pytest names it.
    pub test_id: String,
    pub outcome: Outcome,
    pub seconds: f64,
}

/// The tests of a JUnit XML report, in the report's order (a test reported twice, as pytest
/// does for an error in teardown after a pass, keeps its worst outcome).
pub fn parse_junit(xml: &str) -> Result<Vec<TestResult>> {
    let mut reader = quick_xml::Reader::from_str(xml);
    let mut out: Vec<TestResult> = Vec::new();
    let mut index: BTreeMap<String, usize> = BTreeMap::new();
    let mut current: Option<TestResult> = None;
    loop {
        let ev = reader.read_event().context("reading the JUnit XML report")?;
        let empty = matches!(ev, Event::Empty(_));
        match ev {
            Event::Start(e) | Event::Empty(e) if e.name().as_ref() == b"testcase" => {
                let mut attrs: BTreeMap<String, String> = BTreeMap::new();
                for a in e.attributes().flatten() {
                    let v = a.unescape_value().map(|v| v.to_string()).unwrap_or_default();
                    attrs.insert(String::from_utf8_lossy(a.key.as_ref()).to_string(), v);
                }
                let t = TestResult {
                    test_id: test_id(&attrs),
                    outcome: Outcome::Passed,
                    seconds: attrs.get("time").and_then(|t| t.parse().ok()).unwrap_or(0.0),
                };
                if empty {
                    push(&mut out, &mut index, t);
                } else {
                    current = Some(t);
                }
            }
            Event::Start(e) | Event::Empty(e) => {
                if let Some(t) = current.as_mut() {
                    let o = match e.name().as_ref() {
                        b"failure" => Some(Outcome::Failed),
                        b"error" => Some(Outcome::Error),
                        b"skipped" => Some(Outcome::Skipped),
                        _ => None,
                    };
                    if let Some(o) = o {
                        t.outcome = t.outcome.worst(o);
                    }
                }
            }
            Event::End(e) if e.name().as_ref() == b"testcase" => {
                if let Some(t) = current.take() {
                    push(&mut out, &mut index, t);
                }
            }
            Event::Eof => break,
            _ => {}
        }
    }
    Ok(out)
}

fn push(out: &mut Vec<TestResult>, index: &mut BTreeMap<String, usize>, t: TestResult) {
    match index.get(&t.test_id) {
        Some(&i) => {
            out[i].outcome = out[i].outcome.worst(t.outcome);
            out[i].seconds += t.seconds;
        }
        None => {
            index.insert(t.test_id.clone(), out.len());
            out.push(t);
        }
    }
}

/// pytest's node id from a testcase's attributes: the file, the classes, the name. With
/// `file="tests/test_x.py" classname="tests.test_x.TestA" name="test_b[1]"` it is
/// `tests/test_x.py::TestA::test_b[1]`; a collection error (no file) is named by its module.
fn test_id(attrs: &BTreeMap<String, String>) -> String {
    let name = attrs.get("name").cloned().unwrap_or_default();
    let classname = attrs.get("classname").cloned().unwrap_or_default();
    let Some(file) = attrs.get("file").filter(|f| !f.is_empty()) else {
        return if classname.is_empty() { name } else { format!("{classname}::{name}") };
    };
    let module = file.trim_end_matches(".py").replace('/', ".");
    let classes = classname.strip_prefix(&module).map(|r| r.trim_start_matches('.')).unwrap_or("");
    if classes.is_empty() {
        format!("{file}::{name}")
    } else {
        format!("{file}::{}::{name}", classes.replace('.', "::"))
    }
}

/// What the repeats of both sides say.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Verdict {
    pub fail_to_pass: Vec<String>,
    pub pass_to_pass: Vec<String>,
    pub flaky: Vec<String>,
    /// Tests that do not pass in every run after the change (and are not flaky).
    pub fail_after: Vec<String>,
}

/// SWE-bench's rule over repeated runs: FAIL_TO_PASS fails or errors in every run before
/// (absent counts as failing: the test files are the same on both sides, so a test missing
/// before is one that could not be collected) and passes in every run after; PASS_TO_PASS
/// passes in every run of both; a test whose outcome differs between the runs of one side is
/// flaky and in neither list.
pub fn verdict(before: &[Vec<TestResult>], after: &[Vec<TestResult>]) -> Verdict {
    // None: absent from a run.
    fn by_test(runs: &[Vec<TestResult>]) -> BTreeMap<&str, Vec<Option<Outcome>>> {
        let mut m: BTreeMap<&str, Vec<Option<Outcome>>> = BTreeMap::new();
        let all: BTreeSet<&str> = runs.iter().flatten().map(|t| t.test_id.as_str()).collect();
        for id in all {
            let outcomes = runs.iter().map(|run| run.iter().find(|t| t.test_id == id).map(|t| t.outcome)).collect();
            m.insert(id, outcomes);
        }
        m
    }
    let (b, a) = (by_test(before), by_test(after));
    let stable = |v: &Vec<Option<Outcome>>| v.windows(2).all(|w| w[0] == w[1]);
    let mut out = Verdict::default();
    let ids: BTreeSet<&str> = b.keys().chain(a.keys()).copied().collect();
    for id in ids {
        let bo = b.get(id);
        let ao = a.get(id);
        if bo.is_some_and(|v| !stable(v)) || ao.is_some_and(|v| !stable(v)) {
            out.flaky.push(id.to_string());
            continue;
        }
        let Some(ao) = ao else { continue };
        if ao[0] != Some(Outcome::Passed) {
            if matches!(ao[0], Some(Outcome::Failed | Outcome::Error)) {
                out.fail_after.push(id.to_string());
            }
            continue;
        }
        match bo.and_then(|v| v[0]) {
            Some(Outcome::Passed) => out.pass_to_pass.push(id.to_string()),
            Some(Outcome::Failed | Outcome::Error) | None => out.fail_to_pass.push(id.to_string()),
            Some(Outcome::Skipped) => {}
        }
    }
    out
}

/// A test's id: its file relative to the tree, then its describe blocks and title joined by
/// ` > ` (`test/calc.test.js::calc > mean > of nothing`).
fn js_test_id(file: &str, tree: &Path, titles: &[&str]) -> String {
    let root = format!("{}/", tree.display());
    let rel = file.strip_prefix(&root).unwrap_or(file);
    let titles: Vec<&str> = titles.iter().copied().filter(|t| !t.is_empty() && *t != rel).collect();
    format!("{rel}::{}", titles.join(" > "))
}

/// jest's `--json` report, and vitest's (the same shape): a file that fails to load has no
/// assertion results, so its tests are absent (not collectable) in that run.
pub fn parse_jest(text: &str, tree: &Path) -> Result<Vec<TestResult>> {
    let doc: Value = serde_json::from_str(text).context("reading the runner's JSON report")?;
    let mut out: Vec<TestResult> = Vec::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for file in doc.get("testResults").and_then(Value::as_array).into_iter().flatten() {
        let name = file.get("name").or(file.get("testFilePath")).and_then(Value::as_str).unwrap_or("");
        for a in
            file.get("assertionResults").or(file.get("testResults")).and_then(Value::as_array).into_iter().flatten()
        {
            let mut titles: Vec<&str> = a
                .get("ancestorTitles")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            titles.push(a.get("title").and_then(Value::as_str).unwrap_or(""));
            let outcome = match a.get("status").and_then(Value::as_str).unwrap_or("") {
                "passed" => Outcome::Passed,
                "failed" => Outcome::Failed,
                _ => Outcome::Skipped,
            };
            let seconds = a.get("duration").and_then(Value::as_f64).unwrap_or(0.0) / 1000.0;
            push_named(&mut out, &mut seen, js_test_id(name, tree, &titles), outcome, seconds);
        }
    }
    Ok(out)
}

/// The records of swelake's reporters (mocha, jasmine, `node --test`).
pub fn parse_mocha(text: &str, tree: &Path) -> Result<Vec<TestResult>> {
    let doc: Value = serde_json::from_str(text).context("reading the mocha reporter's records")?;
    let mut out: Vec<TestResult> = Vec::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for t in doc.get("tests").and_then(Value::as_array).into_iter().flatten() {
        let titles: Vec<&str> =
            t.get("titles").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
        let file = t.get("file").and_then(Value::as_str).unwrap_or("");
        let outcome = match t.get("state").and_then(Value::as_str).unwrap_or("failed") {
            "passed" => Outcome::Passed,
            "skipped" => Outcome::Skipped,
            _ => Outcome::Failed,
        };
        let seconds = t.get("duration").and_then(Value::as_f64).unwrap_or(0.0) / 1000.0;
        push_named(&mut out, &mut seen, js_test_id(file, tree, &titles), outcome, seconds);
    }
    Ok(out)
}

/// Adds a result; a name reported twice (two tests of the same title) keeps the worse outcome.
fn push_named(
    out: &mut Vec<TestResult>,
    seen: &mut BTreeMap<String, usize>,
    id: String,
    outcome: Outcome,
    seconds: f64,
) {
    match seen.get(&id) {
        Some(&i) => {
            if out[i].outcome == Outcome::Passed || outcome == Outcome::Failed {
                out[i].outcome = outcome;
            }
        }
        None => {
            seen.insert(id.clone(), out.len());
            out.push(TestResult { test_id: id, outcome, seconds });
        }
    }
}

/// The tests of a TAP stream (versions 12–14, subtests by indentation) from one test file,
/// named `file::outer > inner > test`. A test is a point with no subtests of its own: a
/// subtest whose children are assertions (tap's `t.test`, its closing `ok` line), a point at
/// the file's own level (ava's tests, tap's top-level assertions), or, for tape, the `# name`
/// comment that heads a test's assertions (failed if any of them fails). Assertions inside a
/// subtest are parts of it, not tests. `# SKIP` and `# TODO` are skipped. ava's reports of a
/// file that did not load or exited early are not tests.
pub fn parse_tap(text: &str, file: &str) -> Vec<TestResult> {
    struct Frame {
        name: String,
        indent: usize,
        has_subtests: bool,
    }
    let point = regex::Regex::new(r"^(not ok|ok)\b\s*\d*\s*(?:-\s*)?(.*)$").expect("a valid pattern");
    let time = regex::Regex::new(r"\s*#\s*time=\S+\s*$").expect("a valid pattern");
    let not_a_test = regex::Regex::new(
        r"exited with a non-zero exit code|^Uncaught exception|^Unhandled rejection|^Timed out while running tests|^No tests found|^(?:[A-Z][A-Za-z]*)?Error(?: \[[A-Z_]+\])?: ",
    )
    .expect("a valid pattern");
    let mut frames: Vec<Frame> = Vec::new();
    let mut out: Vec<TestResult> = Vec::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut in_yaml: Option<usize> = None;
    // tape: the test whose assertions follow at the top level.
    let mut group: Option<String> = None;
    for line in text.lines() {
        let indent = line.len() - line.trim_start().len();
        let t = line.trim();
        if let Some(y) = in_yaml {
            if indent >= y && t == "..." {
                in_yaml = None;
            }
            continue;
        }
        if t == "---" {
            in_yaml = Some(indent);
            continue;
        }
        if let Some(name) = t.strip_prefix("# Subtest:") {
            if let Some(parent) = frames.last_mut() {
                parent.has_subtests = true;
            }
            frames.push(Frame { name: name.trim().to_string(), indent, has_subtests: false });
            continue;
        }
        if let Some(comment) = t.strip_prefix('#').filter(|_| frames.is_empty() && indent == 0) {
            group = Some(comment.trim().to_string()).filter(|c| !c.is_empty());
            continue;
        }
        let Some(c) = point.captures(t) else { continue };
        let ok = &c[1] == "ok";
        let rest = time.replace(&c[2], "").to_string();
        let (desc, directive) = match rest.split_once(" # ") {
            Some((d, dir)) => (d.trim().to_string(), dir.trim().to_ascii_uppercase()),
            None => (rest.trim().to_string(), String::new()),
        };
        let skipped = directive.starts_with("SKIP") || directive.starts_with("TODO");
        let outcome = if skipped {
            Outcome::Skipped
        } else if ok {
            Outcome::Passed
        } else {
            Outcome::Failed
        };
        // The closing point of the innermost open subtest sits at its `# Subtest:` indent.
        let closes = frames.last().is_some_and(|f| f.indent == indent);
        let is_test = if closes {
            let f = frames.pop().expect("checked above");
            !f.has_subtests
        } else {
            // An assertion: a test only at the file's own level.
            frames.iter().all(|f| f.indent >= indent)
        };
        if !is_test || not_a_test.is_match(&desc) {
            continue;
        }
        let mut titles: Vec<String> = frames.iter().filter(|f| f.indent < indent).map(|f| f.name.clone()).collect();
        match (&group, frames.is_empty()) {
            (Some(g), true) => titles.push(g.clone()),
            _ => titles.push(desc),
        }
        // A tap run of the file names its top subtest by the file itself.
        if titles.first().is_some_and(|t| t == file) && titles.len() > 1 {
            titles.remove(0);
        }
        push_named(&mut out, &mut seen, format!("{file}::{}", titles.join(" > ")), outcome, 0.0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape pytest 7 writes with `-o junit_family=xunit1`.
    const REPORT: &str = r#"<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="0" failures="1" skipped="1" tests="4" time="0.1">
<testcase classname="tests.test_termui" file="tests/test_termui.py" line="10" name="test_edit_pathlib[single]" time="0.010"><failure message="AssertionError">assert 1 == 2</failure></testcase>
<testcase classname="tests.test_termui.TestBar" file="tests/test_termui.py" line="20" name="test_a" time="0.002" />
<testcase classname="tests.test_termui" file="tests/test_termui.py" line="30" name="test_skip" time="0.000"><skipped type="pytest.skip" message="no">x</skipped></testcase>
<testcase classname="" name="tests.test_broken" time="0.000"><error message="collection failure">ImportError</error></testcase>
</testsuite></testsuites>"#;

    #[test]
    fn junit_reports_read_as_pytest_node_ids() {
        let r = parse_junit(REPORT).unwrap();
        let got: Vec<(&str, &str)> = r.iter().map(|t| (t.test_id.as_str(), t.outcome.as_str())).collect();
        assert_eq!(
            got,
            [
                ("tests/test_termui.py::test_edit_pathlib[single]", "failed"),
                ("tests/test_termui.py::TestBar::test_a", "passed"),
                ("tests/test_termui.py::test_skip", "skipped"),
                ("tests.test_broken", "error"),
            ]
        );
    }

    fn run(items: &[(&str, &str)]) -> Vec<TestResult> {
        let outcome = |o: &str| match o {
            "passed" => Outcome::Passed,
            "failed" => Outcome::Failed,
            "error" => Outcome::Error,
            _ => Outcome::Skipped,
        };
        items.iter().map(|(i, o)| TestResult { test_id: i.to_string(), outcome: outcome(o), seconds: 0.0 }).collect()
    }

    #[test]
    fn fail_to_pass_pass_to_pass_and_flaky_over_repeats() {
        let before = vec![
            run(&[("t::a", "failed"), ("t::b", "passed"), ("t::c", "passed"), ("t::e", "error")]),
            run(&[("t::a", "failed"), ("t::b", "passed"), ("t::c", "failed"), ("t::e", "error")]),
        ];
        let after = vec![
            run(&[("t::a", "passed"), ("t::b", "passed"), ("t::c", "passed"), ("t::d", "passed"), ("t::e", "failed")]),
            run(&[("t::a", "passed"), ("t::b", "passed"), ("t::c", "passed"), ("t::d", "passed"), ("t::e", "failed")]),
        ];
        let v = verdict(&before, &after);
        assert_eq!(v.fail_to_pass, ["t::a", "t::d"]);
        assert_eq!(v.pass_to_pass, ["t::b"]);
        assert_eq!(v.flaky, ["t::c"]);
        assert_eq!(v.fail_after, ["t::e"]);
    }

    /// Reports written by jest 29.7 and vitest 1.6.1 on the same file (tests/data/verify).
    #[test]
    fn jest_and_vitest_reports_name_the_same_tests() {
        let tree = Path::new("/tmp/jsprobe");
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/verify");
        let want = [
            ("test/calc.test.js::calc > adds", "passed"),
            ("test/calc.test.js::calc > nested > fails", "failed"),
            ("test/calc.test.js::calc > nested > skipped", "skipped"),
            ("test/calc.test.js::top level", "passed"),
        ];
        for f in ["jest-29.7.json", "vitest-1.6.1.json", "mocha-10.8.json"] {
            let text = std::fs::read_to_string(dir.join(f)).unwrap();
            let got = if f.starts_with("mocha") { parse_mocha(&text, tree) } else { parse_jest(&text, tree) }.unwrap();
            let mut got: Vec<(String, String)> =
                got.into_iter().map(|t| (t.test_id, t.outcome.as_str().to_string())).collect();
            got.sort();
            let want: Vec<(String, String)> = want.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
            assert_eq!(got, want, "{f}");
        }
    }

    /// ava 6.4 (`--tap`, one file), tap 21 and tape as node runs their files.
    #[test]
    fn tap_streams_name_their_tests() {
        let ava = "TAP version 13\nok 1 - skipped # SKIP\nok 2 - adds\nnot ok 3 - fails\n  ---\n    name: AssertionError\n    message: ''\n  ...\n\n1..3\n# tests 3\n# pass 1\n# skip 1\n# fail 1\n";
        let got: Vec<(String, &str)> =
            parse_tap(ava, "test/a.test.js").into_iter().map(|t| (t.test_id, t.outcome.as_str())).collect();
        assert_eq!(
            got,
            [
                ("test/a.test.js::skipped".to_string(), "skipped"),
                ("test/a.test.js::adds".to_string(), "passed"),
                ("test/a.test.js::fails".to_string(), "failed"),
            ]
        );
        // A file that does not load: ava's reports of it are not tests.
        let broken = "TAP version 13\nnot ok 1 - Error: Cannot find module '../lib/missing'\n  ---\n    name: Error\n  ...\nnot ok 2 - test/b.test.js exited with a non-zero exit code: 1\n";
        assert!(parse_tap(broken, "test/b.test.js").is_empty());
        let tap = "TAP version 14\n# Subtest: group\n    # Subtest: adds\n        ok 1 - should be equal\n        1..1\n    ok 1 - adds # time=14.756ms\n    \n    # Subtest: fails\n        not ok 1 - should be equal\n          ---\n          compare: ===\n          ...\n        1..1\n    not ok 2 - fails # time=61.559ms\n    1..2\nnot ok 1 - group # time=97.798ms\n# Subtest: top\n    ok 1 - yes\n    ok 2 - two\n    1..2\nok 2 - top # time=1.431ms\nok 3 - skipped # SKIP\n1..3\n";
        let got: Vec<(String, &str)> =
            parse_tap(tap, "t/a.js").into_iter().map(|t| (t.test_id, t.outcome.as_str())).collect();
        assert_eq!(
            got,
            [
                ("t/a.js::group > adds".to_string(), "passed"),
                ("t/a.js::group > fails".to_string(), "failed"),
                ("t/a.js::top".to_string(), "passed"),
                ("t/a.js::skipped".to_string(), "skipped"),
            ]
        );
        let tape = "TAP version 13\n# adds\nok 1 should be equal\nok 2 should be equal\n# fails\nok 3 should be equal\nnot ok 4 should be equal\n  ---\n    operator: equal\n  ...\n\n1..4\n";
        let got: Vec<(String, &str)> =
            parse_tap(tape, "test/t.js").into_iter().map(|t| (t.test_id, t.outcome.as_str())).collect();
        assert_eq!(got, [("test/t.js::adds".to_string(), "passed"), ("test/t.js::fails".to_string(), "failed")]);
    }
}
