//! Rewards that run the tests: what a completion's patch is, and the three reward modes.
//!
//! SWE-RL rewards patch similarity because it could not run tests at its scale. An instance
//! the verify stage verified has FAIL_TO_PASS and PASS_TO_PASS tests that run in seconds, so a
//! completion can also be graded by running them (the grader lives in the pipeline, not here:
//! this crate only says what patch to run and how the outcome turns into a reward).
//!
//! - `similarity`: the SWE-RL reward, bit for bit the reference's (−1 malformed, else the mean
//!   patch similarity).
//! - `tests`: −1 malformed; 0 when the patch does not apply or the instance stays unresolved;
//!   1 when every FAIL_TO_PASS and PASS_TO_PASS test passes.
//! - `hybrid`: −1 malformed; 1 resolved; 0 when the patch does not apply; otherwise
//!   `(similarity + f2p_passed / f2p_total) / 4`, at most 0.5: resolved outranks any
//!   similarity, and among unresolved answers the closer patch and the one that fixes more of
//!   the failing tests rank higher.
//!
//! A completion is well-formed for `tests` and `hybrid` when it is a SWE-RL answer (its
//! search/replace edits, applied to the context files, give the patch) or carries a unified
//! diff (in its `<solution>` or as its whole text, fenced or not). The reference's similarity
//! scores only the first kind; for a diff answer `hybrid`'s similarity term is the reference's
//! `calculate_reward_unidiff` of the diff against the oracle's patch, and `similarity` stays
//! the reference's −1.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::{apply_edits, extract_answer, parse_search_replace, search_replace_reward, unidiff_reward, RewardError};

/// Which reward a trainer gets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// SWE-RL's patch similarity.
    #[default]
    Similarity,
    /// Whether the instance's tests pass after the patch.
    Tests,
    /// Tests first, similarity and the share of FAIL_TO_PASS passed among the unresolved.
    Hybrid,
}

impl Mode {
    pub const ALL: [Mode; 3] = [Mode::Similarity, Mode::Tests, Mode::Hybrid];

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Similarity => "similarity",
            Mode::Tests => "tests",
            Mode::Hybrid => "hybrid",
        }
    }

    /// Whether the mode runs tests.
    pub fn runs_tests(self) -> bool {
        self != Mode::Similarity
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        Mode::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| format!("unknown reward mode {s:?}: similarity, tests or hybrid"))
    }
}

/// What running an instance's tests after a patch gave.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TestOutcome {
    /// `resolved`, `unresolved`, `patch_failed` (the patch does not apply) or `error` (the
    /// instance could not be graded: not a verified instance, its environment failed).
    pub status: String,
    pub resolved: bool,
    pub f2p_passed: u32,
    pub f2p_total: u32,
    pub p2p_passed: u32,
    pub p2p_total: u32,
    /// Wall seconds of the grading (0 when answered from the cache of graded patches).
    pub seconds: f64,
    pub reason: String,
}

impl TestOutcome {
    /// An outcome that is no verdict on the patch.
    pub fn error(reason: impl Into<String>) -> TestOutcome {
        TestOutcome { status: "error".into(), reason: reason.into(), ..Default::default() }
    }

    /// Whether the patch was graded at all (applied or refused by `git apply`/`patch`).
    pub fn graded(&self) -> bool {
        self.status != "error"
    }

    /// Share of FAIL_TO_PASS tests that pass (0 when there are none).
    pub fn f2p_share(&self) -> f64 {
        if self.f2p_total == 0 {
            0.0
        } else {
            self.f2p_passed as f64 / self.f2p_total as f64
        }
    }
}

/// A completion read as a patch.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    /// The reference's reward (−1 for anything but a well-formed search/replace answer).
    pub reward_similarity: f64,
    /// The reference's format error, if the reward is −1.
    pub format_error: Option<String>,
    /// The patch to grade (git's unified diff format); `None` when the completion is neither
    /// a SWE-RL answer nor a diff.
    pub patch: Option<String>,
    /// `hybrid`'s similarity term in [0, 1].
    pub similarity: f64,
}

impl Answer {
    /// Malformed for every mode: no patch could be read from it.
    pub fn malformed(&self) -> bool {
        self.patch.is_none()
    }

    /// The reward of `mode` given the test outcome (`None` for `similarity`, or when the
    /// tests were not run). `None` back: the row cannot be scored in that mode.
    pub fn reward(&self, mode: Mode, tests: Option<&TestOutcome>) -> Option<f64> {
        match mode {
            Mode::Similarity => Some(self.reward_similarity),
            Mode::Tests | Mode::Hybrid if self.malformed() => Some(-1.0),
            Mode::Tests => {
                let t = tests.filter(|t| t.graded())?;
                Some(if t.resolved { 1.0 } else { 0.0 })
            }
            Mode::Hybrid => {
                let t = tests.filter(|t| t.graded())?;
                Some(if t.resolved {
                    1.0
                } else if t.status == "patch_failed" {
                    0.0
                } else {
                    (self.similarity + t.f2p_share()) / 4.0
                })
            }
        }
    }
}

/// Reads `completion` as a patch against `context` (path → content at the merge base) and
/// scores its similarity to `oracle` (path → content after the PR).
pub fn answer(
    context: &BTreeMap<String, String>,
    oracle: &BTreeMap<String, String>,
    completion: &str,
) -> Result<Answer, RewardError> {
    let r = search_replace_reward(context, oracle, completion)?;
    if r.format_error.is_none() {
        let answer = extract_answer(completion).expect("scored as well-formed");
        let edits = parse_search_replace(answer);
        let new = apply_edits(context, &edits).expect("scored as well-formed");
        return Ok(Answer {
            reward_similarity: r.reward,
            format_error: None,
            patch: Some(git_diff(context, &new)),
            similarity: r.reward,
        });
    }
    let patch = extract_diff(completion).map(str::to_string);
    let similarity = match &patch {
        Some(p) => unidiff_reward(&[git_diff(context, oracle)], std::slice::from_ref(p)).reward,
        None => 0.0,
    };
    Ok(Answer { reward_similarity: r.reward, format_error: r.format_error, patch, similarity })
}

/// The unified diff, as `git diff` writes it (a/ and b/ prefixes, 3 lines of context, new
/// files from /dev/null, a missing final newline marked), that turns `old` into `new` for the
/// paths of `new`.
pub fn git_diff(old: &BTreeMap<String, String>, new: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    for (path, after) in new {
        let before = old.get(path);
        if before == Some(after) {
            continue;
        }
        let before_text = before.map_or("", |s| s.as_str());
        let diff = similar::TextDiff::from_lines(before_text, after.as_str());
        let from = if before.is_some() { format!("a/{path}") } else { "/dev/null".to_string() };
        out.push_str(&format!("diff --git a/{path} b/{path}\n"));
        if before.is_none() {
            out.push_str("new file mode 100644\n");
        }
        out.push_str(&diff.unified_diff().context_radius(3).header(&from, &format!("b/{path}")).to_string());
    }
    out
}

/// The unified diff a completion carries: in its `<solution>` when it has one, else its whole
/// text; inside a ``` fence or bare; from its first `diff --git` or `--- ` line that a
/// `+++ ` line follows. `None` unless it has a hunk header too.
pub fn extract_diff(completion: &str) -> Option<&str> {
    let text = match (completion.find("<solution>"), completion.rfind("</solution>")) {
        (Some(a), Some(b)) if a + "<solution>".len() <= b => &completion[a + "<solution>".len()..b],
        _ => completion,
    };
    let mut start = None;
    let mut offset = 0;
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    for (i, line) in lines.iter().enumerate() {
        if line.starts_with("diff --git ")
            || (line.starts_with("--- ") && lines.get(i + 1).is_some_and(|n| n.starts_with("+++ ")))
        {
            start = Some(offset);
            break;
        }
        offset += line.len();
    }
    let start = start?;
    let rest = &text[start..];
    // A fence closes the diff.
    let end = rest.find("\n```").map_or(rest.len(), |e| e + 1);
    let diff = &rest[..end];
    (diff.contains("\n@@ ") && diff.contains("\n+++ ")).then_some(diff)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(p, c)| (p.to_string(), c.to_string())).collect()
    }

    const CONTEXT: &str = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n";
    const FIXED: &str = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n";

    fn edit_answer(search: &str, replace: &str) -> String {
        format!("<think>fix it</think>\n<solution>\n```python\n### calc.py\n<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n```\n</solution>")
    }

    #[test]
    fn an_edit_answer_becomes_the_patch_git_applies() {
        let ctx = files(&[("calc.py", CONTEXT)]);
        let oracle = files(&[("calc.py", FIXED)]);
        let a =
            answer(&ctx, &oracle, &edit_answer("def add(a, b):\n    return a - b", "def add(a, b):\n    return a + b"))
                .unwrap();
        assert_eq!(a.reward_similarity, 1.0);
        assert_eq!(a.similarity, 1.0);
        // Written out by hand, as git diff writes it.
        let want = "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,5 +1,5 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n \n \n def sub(a, b):\n";
        assert_eq!(a.patch.as_deref(), Some(want));
    }

    #[test]
    fn new_files_and_missing_final_newlines_are_marked() {
        let old = files(&[("a.txt", "x\ny")]);
        let new = files(&[("a.txt", "x\nz"), ("new.txt", "hello\n")]);
        let d = git_diff(&old, &new);
        assert!(d.contains("-y\n\\ No newline at end of file\n+z\n\\ No newline at end of file\n"), "{d}");
        assert!(d.contains("diff --git a/new.txt b/new.txt\nnew file mode 100644\n--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1 @@\n+hello\n"), "{d}");
    }

    #[test]
    fn a_diff_answer_is_well_formed_for_the_test_modes_only() {
        let ctx = files(&[("calc.py", CONTEXT)]);
        let oracle = files(&[("calc.py", FIXED)]);
        let diff = git_diff(&ctx, &oracle);
        for completion in [
            diff.clone(),
            format!("Here is the fix:\n```diff\n{diff}```\nDone."),
            format!("<think>x</think><solution>\n{diff}</solution>"),
        ] {
            let a = answer(&ctx, &oracle, &completion).unwrap();
            assert_eq!(a.reward_similarity, -1.0, "the reference scores only search/replace answers");
            assert_eq!(a.patch.as_deref(), Some(diff.as_str()), "{completion}");
            assert_eq!(a.similarity, 1.0);
        }
        let a = answer(&ctx, &oracle, "<think>x</think><solution>no idea</solution>").unwrap();
        assert!(a.malformed() && a.format_error.is_some());
        for mode in Mode::ALL {
            assert_eq!(a.reward(mode, None), Some(-1.0), "{mode}");
        }
    }

    #[test]
    fn modes_rank_resolved_over_any_similarity() {
        let a = Answer { reward_similarity: 0.9, format_error: None, patch: Some("p".into()), similarity: 0.9 };
        let resolved = TestOutcome {
            status: "resolved".into(),
            resolved: true,
            f2p_passed: 2,
            f2p_total: 2,
            ..Default::default()
        };
        let half = TestOutcome { status: "unresolved".into(), f2p_passed: 1, f2p_total: 2, ..Default::default() };
        let refused = TestOutcome { status: "patch_failed".into(), ..Default::default() };
        let error = TestOutcome::error("environment failed");
        assert_eq!(a.reward(Mode::Similarity, Some(&half)), Some(0.9));
        assert_eq!(a.reward(Mode::Tests, Some(&resolved)), Some(1.0));
        assert_eq!(a.reward(Mode::Tests, Some(&half)), Some(0.0));
        assert_eq!(a.reward(Mode::Tests, Some(&refused)), Some(0.0));
        assert_eq!(a.reward(Mode::Tests, Some(&error)), None);
        assert_eq!(a.reward(Mode::Tests, None), None);
        assert_eq!(a.reward(Mode::Hybrid, Some(&resolved)), Some(1.0));
        assert_eq!(a.reward(Mode::Hybrid, Some(&half)), Some((0.9 + 0.5) / 4.0));
        assert_eq!(a.reward(Mode::Hybrid, Some(&refused)), Some(0.0));
        let best_unresolved = TestOutcome { f2p_passed: 2, f2p_total: 2, ..half.clone() };
        let perfect = Answer { similarity: 1.0, ..a.clone() };
        assert!(perfect.reward(Mode::Hybrid, Some(&best_unresolved)).unwrap() < 1.0);
        assert_eq!("hybrid".parse::<Mode>(), Ok(Mode::Hybrid));
        assert!("exec".parse::<Mode>().is_err());
    }
}
