//! Per-test outcomes, read from the runner's machine format — pytest's JUnit XML (the `xunit1`
//! family, which names each test's file), jest's and vitest's JSON reports, swelake's mocha
//! reporter's records — and SWE-bench's verdict over the repeats of both sides.

use std::collections::{BTreeMap, BTreeSet};

use std::path::Path;

use anyhow::{Context, Result};
use quick_xml::events::Event;
use serde_json::Value;

/// One test's result in one run.
#[derive(Debug, Clone, PartialEq)]
pub struct TestResult {
    /// `path::Class::name[param]`, as pytest names it.
    pub test_id: String,
    /// passed, failed, error or skipped.
    pub outcome: String,
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
                    outcome: "passed".into(),
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
                        b"failure" => Some("failed"),
                        b"error" => Some("error"),
                        b"skipped" => Some("skipped"),
                        _ => None,
                    };
                    if let Some(o) = o {
                        t.outcome = worst(&t.outcome, o).to_string();
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
            out[i].outcome = worst(&out[i].outcome, &t.outcome).to_string();
            out[i].seconds += t.seconds;
        }
        None => {
            index.insert(t.test_id.clone(), out.len());
            out.push(t);
        }
    }
}

fn rank(o: &str) -> u8 {
    match o {
        "error" => 3,
        "failed" => 2,
        "skipped" => 1,
        _ => 0,
    }
}

fn worst<'a>(a: &'a str, b: &'a str) -> &'a str {
    if rank(b) > rank(a) {
        b
    } else {
        a
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
    fn by_test(runs: &[Vec<TestResult>]) -> BTreeMap<&str, Vec<&str>> {
        let mut m: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        let all: BTreeSet<&str> = runs.iter().flatten().map(|t| t.test_id.as_str()).collect();
        for id in all {
            let outcomes = runs
                .iter()
                .map(|run| run.iter().find(|t| t.test_id == id).map_or("missing", |t| t.outcome.as_str()))
                .collect();
            m.insert(id, outcomes);
        }
        m
    }
    let (b, a) = (by_test(before), by_test(after));
    let stable = |v: &Vec<&str>| v.windows(2).all(|w| w[0] == w[1]);
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
        if ao[0] != "passed" {
            if ao[0] != "skipped" && ao[0] != "missing" {
                out.fail_after.push(id.to_string());
            }
            continue;
        }
        match bo.map(|v| v[0]).unwrap_or("missing") {
            "passed" => out.pass_to_pass.push(id.to_string()),
            "failed" | "error" | "missing" => out.fail_to_pass.push(id.to_string()),
            _ => {}
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
                "passed" => "passed",
                "failed" => "failed",
                _ => "skipped",
            };
            let seconds = a.get("duration").and_then(Value::as_f64).unwrap_or(0.0) / 1000.0;
            push_named(&mut out, &mut seen, js_test_id(name, tree, &titles), outcome, seconds);
        }
    }
    Ok(out)
}

/// The records of swelake's mocha reporter.
pub fn parse_mocha(text: &str, tree: &Path) -> Result<Vec<TestResult>> {
    let doc: Value = serde_json::from_str(text).context("reading the mocha reporter's records")?;
    let mut out: Vec<TestResult> = Vec::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for t in doc.get("tests").and_then(Value::as_array).into_iter().flatten() {
        let titles: Vec<&str> =
            t.get("titles").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
        let file = t.get("file").and_then(Value::as_str).unwrap_or("");
        let outcome = t.get("state").and_then(Value::as_str).unwrap_or("failed");
        let seconds = t.get("duration").and_then(Value::as_f64).unwrap_or(0.0) / 1000.0;
        push_named(&mut out, &mut seen, js_test_id(file, tree, &titles), outcome, seconds);
    }
    Ok(out)
}

/// Adds a result; a name reported twice (two tests of the same title) keeps the worse outcome.
fn push_named(out: &mut Vec<TestResult>, seen: &mut BTreeMap<String, usize>, id: String, outcome: &str, seconds: f64) {
    match seen.get(&id) {
        Some(&i) => {
            if out[i].outcome == "passed" || outcome == "failed" {
                out[i].outcome = outcome.to_string();
            }
        }
        None => {
            seen.insert(id.clone(), out.len());
            out.push(TestResult { test_id: id, outcome: outcome.to_string(), seconds });
        }
    }
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
        items.iter().map(|(i, o)| TestResult { test_id: i.to_string(), outcome: o.to_string(), seconds: 0.0 }).collect()
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
            let mut got: Vec<(String, String)> = got.into_iter().map(|t| (t.test_id, t.outcome)).collect();
            got.sort();
            let want: Vec<(String, String)> = want.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
            assert_eq!(got, want, "{f}");
        }
    }
}
