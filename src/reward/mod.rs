//! The SWE-RL reward, with the values of the public reference implementation
//! (facebookresearch/swe-rl, `src/swerl/core/reward.py`) for every input.
//!
//! Three entry points, as in the reference: [`search_replace_reward`] scores a model answer
//! made of `<think>`/`<solution>` with fenced SEARCH/REPLACE edits, [`unidiff_reward`] scores
//! two lists of unified diffs, and [`general_reward`] scores predicted new file contents.
//! A malformed answer is worth −1; otherwise the reward is the mean, over the union of the
//! changed paths, of `difflib.SequenceMatcher(None, pred, oracle, autojunk=False).ratio()`
//! between the per-file unified diffs.
//!
//! Not here: reading cases or rollouts (see [`batch`]) and SQL (see [`udf`]).

pub mod batch;
pub mod columns;
pub mod difflib;
pub mod pystr;
pub mod rollouts;
pub mod udf;
pub mod unidiff;

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

use regex::Regex;
use serde::Serialize;

use difflib::RatioCtx;
use pystr::{py_splitlines, py_strip};

/// Similarity of one changed file.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FileSimilarity {
    pub path: String,
    pub similarity: f64,
}

/// A reward with the reasons behind it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Reward {
    pub reward: f64,
    /// Per-file similarities (sorted by path); empty when the answer was malformed.
    pub similarities: Vec<FileSimilarity>,
    /// Why the answer scored −1 (the reference's `FormatError` message), if it did.
    pub format_error: Option<String>,
}

impl Reward {
    fn format_error(msg: impl Into<String>) -> Self {
        Reward { reward: -1.0, similarities: Vec::new(), format_error: Some(msg.into()) }
    }
}

/// A case the reference itself cannot score: it fails an `assert` rather than returning.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum RewardError {
    #[error("neither the prediction nor the oracle changes any file (the reference raises AssertionError here)")]
    NoChanges,
}

thread_local! {
    static RATIO: RefCell<RatioCtx> = RefCell::new(RatioCtx::default());
}

fn ratio(a: &str, b: &str) -> f64 {
    RATIO.with(|r| r.borrow_mut().ratio(a, b))
}

/// The reference's `generate_unified_diff(old, new)`: difflib's unified diff of the
/// `splitlines()` of both, with 3 lines of context and without the two header lines.
pub fn generate_unified_diff(old: &str, new: &str) -> String {
    let a = py_splitlines(old);
    let b = py_splitlines(new);
    difflib::unified_diff_body(&a, &b, 3).join("\n")
}

/// `get_normalized_patch`: the non-empty unified diff of each file against its context.
fn normalized_patches(context: &BTreeMap<String, String>, new: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    new.iter()
        .filter_map(|(path, content)| {
            let old = context.get(path).map_or("", |s| s.as_str());
            let patch = generate_unified_diff(old, content);
            (!patch.is_empty()).then(|| (path.clone(), patch))
        })
        .collect()
}

/// `compute_change_similarities`: one entry per path in either dict; a path missing (or
/// empty) on one side scores 0.0 so that empty edits cannot earn reward.
fn change_similarities(pred: &BTreeMap<String, String>, oracle: &BTreeMap<String, String>) -> Vec<FileSimilarity> {
    let paths: BTreeSet<&String> = pred.keys().chain(oracle.keys()).collect();
    paths
        .into_iter()
        .map(|path| {
            let p = pred.get(path).map_or("", |s| s.as_str());
            let o = oracle.get(path).map_or("", |s| s.as_str());
            let similarity = if p.is_empty() || o.is_empty() { 0.0 } else { ratio(p, o) };
            FileSimilarity { path: path.clone(), similarity }
        })
        .collect()
}

/// Mean similarity. The reference sums in the iteration order of a Python `set`, which
/// depends on the per-process string hash seed; summing in path order differs from any one
/// Python run by at most a few ulps, and only for multi-file changes.
fn mean(similarities: &[FileSimilarity]) -> f64 {
    similarities.iter().map(|s| s.similarity).sum::<f64>() / similarities.len() as f64
}

/// The reference's `calculate_reward(code_context, oracle_new_content, pred_new_content)`.
pub fn general_reward(
    context: &BTreeMap<String, String>,
    oracle_new: &BTreeMap<String, String>,
    pred_new: &BTreeMap<String, String>,
) -> Result<Reward, RewardError> {
    let oracle = normalized_patches(context, oracle_new);
    let pred = normalized_patches(context, pred_new);
    let similarities = change_similarities(&pred, &oracle);
    if similarities.is_empty() {
        return Err(RewardError::NoChanges);
    }
    Ok(Reward { reward: mean(&similarities), similarities, format_error: None })
}

const TAGS: [&str; 4] = ["<think>", "</think>", "<solution>", "</solution>"];

/// `extract_thought_solution`: exactly one of each tag, a non-empty thought; returns the
/// stripped answer. Mirrors `output.split(open)[1].split(close)[0]` literally, including
/// its behaviour when a closing tag comes before its opening tag.
pub fn extract_answer(output: &str) -> Result<&str, String> {
    for tag in TAGS {
        if output.matches(tag).count() != 1 {
            return Err(format!("count of {tag} is not 1"));
        }
    }
    let between = |open: &str, close: &str| -> &str {
        let after = output.split_once(open).map_or("", |(_, rest)| rest);
        after.split(close).next().unwrap_or("")
    };
    let thought = py_strip(between("<think>", "</think>"));
    let answer = py_strip(between("<solution>", "</solution>"));
    if thought.is_empty() {
        return Err("Thought is empty".to_string());
    }
    Ok(answer)
}

/// A search/replace edit list per path, in order of first appearance.
pub type Edits<'a> = Vec<(&'a str, Vec<(&'a str, &'a str)>)>;

fn search_replace_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    // The reference's SEARCH_REPLACE_REGEX; Rust's leftmost-first semantics give the same
    // matches and groups as Python's backtracking `re.findall` for this pattern.
    RE.get_or_init(|| {
        Regex::new(r"```.*?\n### (.*)\n<<<<<<< SEARCH\n([\s\S]*?)\n=======\n([\s\S]*?)\n>>>>>>> REPLACE\n```")
            .expect("static regex")
    })
}

/// `parse_search_replace`: every fenced edit block of the answer, grouped by path.
pub fn parse_search_replace(answer: &str) -> Edits<'_> {
    let mut edits: Edits = Vec::new();
    for c in search_replace_regex().captures_iter(answer) {
        let (path, search, replace) = (
            c.get(1).map_or("", |m| m.as_str()),
            c.get(2).map_or("", |m| m.as_str()),
            c.get(3).map_or("", |m| m.as_str()),
        );
        match edits.iter_mut().find(|(p, _)| *p == path) {
            Some((_, list)) => list.push((search, replace)),
            None => edits.push((path, vec![(search, replace)])),
        }
    }
    edits
}

/// `apply_code_change`: applies each edit to `"\n" + content`, replacing every occurrence.
pub fn apply_edits(context: &BTreeMap<String, String>, edits: &Edits) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for (path, pairs) in edits {
        let mut content = format!("\n{}", context.get(*path).map_or("", |s| s.as_str()));
        for (search, replace) in pairs {
            if search == replace {
                return Err("Search and replace blocks are identical".to_string());
            }
            let search = format!("\n{search}");
            let replace = format!("\n{replace}");
            if !content.contains(&search) {
                return Err(format!("Search block not found in the code: {search}"));
            }
            content = content.replace(&search, &replace);
        }
        out.insert(path.to_string(), content[1..].to_string());
    }
    Ok(out)
}

/// The reference's `calculate_search_replace_reward(code_context, oracle_new_content, output)`.
pub fn search_replace_reward(
    context: &BTreeMap<String, String>,
    oracle_new: &BTreeMap<String, String>,
    output: &str,
) -> Result<Reward, RewardError> {
    let answer = match extract_answer(output) {
        Ok(a) => a,
        Err(e) => return Ok(Reward::format_error(e)),
    };
    let edits = parse_search_replace(answer);
    if edits.is_empty() {
        return Ok(Reward::format_error("No valid search blocks found"));
    }
    match apply_edits(context, &edits) {
        Ok(pred) => general_reward(context, oracle_new, &pred),
        Err(e) => Ok(Reward::format_error(e)),
    }
}

/// The reference's `calculate_reward_unidiff(oracle_patches, pred_patches)`; always in [0, 1].
pub fn unidiff_reward(oracle_patches: &[String], pred_patches: &[String]) -> Reward {
    let mut oracle = BTreeMap::new();
    let mut pred = BTreeMap::new();
    for p in oracle_patches {
        oracle.extend(unidiff::filelevel_diff(p));
    }
    for p in pred_patches {
        pred.extend(unidiff::filelevel_diff(p));
    }
    let similarities = change_similarities(&pred, &oracle);
    if similarities.is_empty() {
        return Reward { reward: 1.0, similarities, format_error: None };
    }
    Reward { reward: mean(&similarities), similarities, format_error: None }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn answer(body: &str) -> String {
        format!("<think>\nlooked\n</think>\n<solution>\n{body}\n</solution>")
    }

    const EDIT: &str = "```python\n### a.py\n<<<<<<< SEARCH\ndef f():\n    return 1\n=======\ndef f():\n    return 2\n>>>>>>> REPLACE\n```";

    #[test]
    fn exact_oracle_scores_one() {
        let ctx = map(&[("a.py", "import os\n\ndef f():\n    return 1\n")]);
        let oracle = map(&[("a.py", "import os\n\ndef f():\n    return 2\n")]);
        let r = search_replace_reward(&ctx, &oracle, &answer(EDIT)).unwrap();
        assert_eq!(r.reward, 1.0);
        assert_eq!(r.format_error, None);
    }

    #[test]
    fn tag_counts_must_be_exactly_one() {
        let ctx = map(&[("a.py", "def f():\n    return 1\n")]);
        let twice = format!("<think>x</think><think>y</think><solution>{EDIT}</solution>");
        let r = search_replace_reward(&ctx, &ctx, &twice).unwrap();
        assert_eq!(r.reward, -1.0);
        assert_eq!(r.format_error.as_deref(), Some("count of <think> is not 1"));
        let none = format!("<think>x</think>{EDIT}");
        assert_eq!(
            search_replace_reward(&ctx, &ctx, &none).unwrap().format_error.as_deref(),
            Some("count of <solution> is not 1")
        );
    }

    #[test]
    fn thought_of_only_python_whitespace_is_empty() {
        // \x1f is whitespace to Python's strip() but not to Rust's trim().
        let out = format!("<think>\u{1f} \n</think><solution>{EDIT}</solution>");
        let r = search_replace_reward(&map(&[]), &map(&[]), &out).unwrap();
        assert_eq!(r.format_error.as_deref(), Some("Thought is empty"));
    }

    #[test]
    fn closing_tag_before_opening_tag() {
        // split("<think>")[1] has no "</think>" after it, so the thought runs to the end
        // and is non-empty: the answer is then parsed normally (here: no blocks).
        let out = "</think> <solution> </solution> <think> t";
        let r = search_replace_reward(&map(&[]), &map(&[]), out).unwrap();
        assert_eq!(r.format_error.as_deref(), Some("No valid search blocks found"));
    }

    #[test]
    fn identical_search_replace_and_missing_search() {
        let ctx = map(&[("a.py", "x = 1\n")]);
        let same = "```\n### a.py\n<<<<<<< SEARCH\nx = 1\n=======\nx = 1\n>>>>>>> REPLACE\n```";
        let r = search_replace_reward(&ctx, &ctx, &answer(same)).unwrap();
        assert_eq!(r.format_error.as_deref(), Some("Search and replace blocks are identical"));
        let missing = "```\n### a.py\n<<<<<<< SEARCH\ny = 1\n=======\nx = 1\n>>>>>>> REPLACE\n```";
        let r = search_replace_reward(&ctx, &ctx, &answer(missing)).unwrap();
        assert_eq!(r.format_error.as_deref(), Some("Search block not found in the code: \ny = 1"));
    }

    #[test]
    fn replace_hits_every_occurrence() {
        let ctx = map(&[("a.py", "v = 0\nv = 0\n")]);
        let oracle = map(&[("a.py", "v = 1\nv = 1\n")]);
        let edit = "```\n### a.py\n<<<<<<< SEARCH\nv = 0\n=======\nv = 1\n>>>>>>> REPLACE\n```";
        assert_eq!(search_replace_reward(&ctx, &oracle, &answer(edit)).unwrap().reward, 1.0);
    }

    #[test]
    fn search_must_start_at_a_line() {
        // "\n" + search: a match in the middle of a line does not count.
        let ctx = map(&[("a.py", "xv = 0\n")]);
        let edit = "```\n### a.py\n<<<<<<< SEARCH\nv = 0\n=======\nv = 1\n>>>>>>> REPLACE\n```";
        let r = search_replace_reward(&ctx, &ctx, &answer(edit)).unwrap();
        assert_eq!(r.reward, -1.0);
    }

    #[test]
    fn wrong_file_scores_zero_on_both_paths() {
        let ctx = map(&[("a.py", "x = 1\n"), ("b.py", "y = 1\n")]);
        let oracle = map(&[("a.py", "x = 2\n")]);
        let edit = "```\n### b.py\n<<<<<<< SEARCH\ny = 1\n=======\ny = 2\n>>>>>>> REPLACE\n```";
        let r = search_replace_reward(&ctx, &oracle, &answer(edit)).unwrap();
        assert_eq!(r.reward, 0.0);
        assert_eq!(r.similarities.len(), 2);
    }

    #[test]
    fn edits_that_cancel_out_are_the_reference_assertion_case() {
        let ctx = map(&[("a.py", "x = 1\n")]);
        let there = "```\n### a.py\n<<<<<<< SEARCH\nx = 1\n=======\nx = 2\n>>>>>>> REPLACE\n```";
        let back = "```\n### a.py\n<<<<<<< SEARCH\nx = 2\n=======\nx = 1\n>>>>>>> REPLACE\n```";
        let out = answer(&format!("{there}\n{back}"));
        assert_eq!(search_replace_reward(&ctx, &ctx, &out), Err(RewardError::NoChanges));
    }

    #[test]
    fn unidiff_empty_both_is_one_and_garbage_is_zero() {
        assert_eq!(unidiff_reward(&[], &[]).reward, 1.0);
        let oracle = vec!["--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n".to_string()];
        assert_eq!(unidiff_reward(&oracle, &["not a diff".to_string()]).reward, 0.0);
        assert_eq!(unidiff_reward(&oracle, &oracle).reward, 1.0);
    }
}
