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
#[cfg(feature = "arrow")]
pub mod columns;
pub mod detailed;
pub mod modes;
#[cfg(feature = "arrow")]
pub mod rollouts;
#[cfg(feature = "sql")]
pub mod udf;
pub(crate) mod unidiff;

use serde::Serialize;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

pub use pydifflib::{difflib, pystr};

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

pub(crate) fn ratio(a: &str, b: &str) -> f64 {
    RATIO.with(|r| r.borrow_mut().ratio(a, b))
}

/// The reference's `generate_unified_diff(old, new)`: difflib's unified diff of the
/// `splitlines()` of both, with 3 lines of context and without the two header lines.
pub fn generate_unified_diff(old: &str, new: &str) -> String {
    let a = py_splitlines(old);
    let b = py_splitlines(new);
    difflib::unified_diff_text(&a, &b, 3)
}

/// `get_normalized_patch` for the oracle and the prediction together: each file's context is
/// split into lines once and diffed against both new versions; empty diffs are dropped.
pub(crate) fn normalized_patches(
    context: &BTreeMap<String, String>,
    oracle_new: &BTreeMap<String, String>,
    pred_new: &BTreeMap<String, String>,
) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let (mut oracle, mut pred) = (BTreeMap::new(), BTreeMap::new());
    let paths: BTreeSet<&String> = oracle_new.keys().chain(pred_new.keys()).collect();
    for path in paths {
        let old = py_splitlines(context.get(path).map_or("", |s| s.as_str()));
        let oracle_patch = oracle_new.get(path).map(|new| difflib::unified_diff_text(&old, &py_splitlines(new), 3));
        // A prediction equal to the oracle has the oracle's patch (the diff is a function of
        // the two texts): common for good answers, and it halves their diff work.
        let pred_patch = match pred_new.get(path) {
            Some(new) if oracle_new.get(path) == Some(new) => oracle_patch.clone(),
            Some(new) => Some(difflib::unified_diff_text(&old, &py_splitlines(new), 3)),
            None => None,
        };
        for (patch, out) in [(oracle_patch, &mut oracle), (pred_patch, &mut pred)] {
            if let Some(patch) = patch.filter(|p| !p.is_empty()) {
                out.insert(path.clone(), patch);
            }
        }
    }
    (oracle, pred)
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
    let (oracle, pred) = normalized_patches(context, oracle_new, pred_new);
    let similarities = change_similarities(&pred, &oracle);
    if similarities.is_empty() {
        return Err(RewardError::NoChanges);
    }
    Ok(Reward { reward: mean(&similarities), similarities, format_error: None })
}

/// A SIMD substring searcher for a constant needle, built once: building one costs more
/// than most of the short searches an answer needs.
macro_rules! finder {
    ($needle:expr) => {{
        static F: std::sync::OnceLock<memchr::memmem::Finder<'static>> = std::sync::OnceLock::new();
        F.get_or_init(|| memchr::memmem::Finder::new($needle.as_bytes()))
    }};
}

/// First occurrence of the searcher's needle.
fn find(haystack: &str, needle: &memchr::memmem::Finder<'_>) -> Option<usize> {
    needle.find(haystack.as_bytes())
}

const TAGS: [&str; 4] = ["<think>", "</think>", "<solution>", "</solution>"];

fn tag_finders() -> &'static [memchr::memmem::Finder<'static>; 4] {
    static F: std::sync::OnceLock<[memchr::memmem::Finder<'static>; 4]> = std::sync::OnceLock::new();
    F.get_or_init(|| TAGS.map(|t| memchr::memmem::Finder::new(t.as_bytes())))
}

/// `extract_thought_solution`: exactly one of each tag, a non-empty thought; returns the
/// stripped answer. Mirrors `output.split(open)[1].split(close)[0]` literally, including
/// its behaviour when a closing tag comes before its opening tag.
pub fn extract_answer(output: &str) -> Result<&str, String> {
    extract_thought_answer(output).map(|(_, answer)| answer)
}

/// [`extract_answer`] with the thought too: the reference's `extract_thought_solution`.
pub fn extract_thought_answer(output: &str) -> Result<(&str, &str), String> {
    let finders = tag_finders();
    for (tag, finder) in TAGS.iter().zip(finders) {
        // Python's str.count: non-overlapping occurrences.
        if finder.find_iter(output.as_bytes()).take(2).count() != 1 {
            return Err(format!("count of {tag} is not 1"));
        }
    }
    let between = |open: usize, close: usize| -> &str {
        let after = find(output, &finders[open]).map_or("", |at| &output[at + TAGS[open].len()..]);
        find(after, &finders[close]).map_or(after, |at| &after[..at])
    };
    let thought = py_strip(between(0, 1));
    let answer = py_strip(between(2, 3));
    if thought.is_empty() {
        return Err("Thought is empty".to_string());
    }
    Ok((thought, answer))
}

/// A search/replace edit list per path, in order of first appearance.
pub type Edits<'a> = Vec<(&'a str, Vec<(&'a str, &'a str)>)>;

/// The reference's SEARCH_REPLACE_REGEX, kept as the specification that
/// [`parse_search_replace`] is tested against.
#[cfg(test)]
const SEARCH_REPLACE_REGEX: &str =
    r"```.*?\n### (.*)\n<<<<<<< SEARCH\n([\s\S]*?)\n=======\n([\s\S]*?)\n>>>>>>> REPLACE\n```";

const SEARCH_OPEN: &str = "\n<<<<<<< SEARCH\n";
const DIVIDER: &str = "\n=======\n";
const REPLACE_CLOSE: &str = "\n>>>>>>> REPLACE\n```";

/// Tries the reference regex at a "```" that starts at `start`; returns the three groups and
/// the end of the match. With this pattern the regex's backtracking has exactly one way to
/// succeed: `.*?` cannot cross a newline, so the fence's line must be followed by a `### `
/// line; `(.*)` is that whole line; each lazy group ends at the first occurrence of its
/// terminator, and if the replace terminator is missing after the first divider it is
/// missing after every later one too.
fn block_at(text: &str, start: usize) -> Option<(&str, &str, &str, usize)> {
    let p = start + 3;
    let line_end = p + memchr::memchr(b'\n', &text.as_bytes()[p..])?;
    let path_start = line_end + "\n### ".len();
    if !text[line_end..].starts_with("\n### ") {
        return None;
    }
    let path_end = path_start + memchr::memchr(b'\n', &text.as_bytes()[path_start..])?;
    if !text[path_end..].starts_with(SEARCH_OPEN) {
        return None;
    }
    let s_start = path_end + SEARCH_OPEN.len();
    let s_end = s_start + find(&text[s_start..], finder!(DIVIDER))?;
    let r_start = s_end + DIVIDER.len();
    let r_end = r_start + find(&text[r_start..], finder!(REPLACE_CLOSE))?;
    Some((&text[path_start..path_end], &text[s_start..s_end], &text[r_start..r_end], r_end + REPLACE_CLOSE.len()))
}

/// `parse_search_replace`: every fenced edit block of the answer (what `re.findall` of the
/// reference regex returns), grouped by path in order of first appearance.
pub fn parse_search_replace(answer: &str) -> Edits<'_> {
    let mut edits: Edits = Vec::new();
    let mut pos = 0;
    while let Some(off) = find(&answer[pos..], finder!("```")) {
        let start = pos + off;
        let Some((path, search, replace, end)) = block_at(answer, start) else {
            // The next attempt starts one byte on (fences may overlap, as in "````").
            pos = start + 1;
            continue;
        };
        match edits.iter_mut().find(|(p, _)| *p == path) {
            Some((_, list)) => list.push((search, replace)),
            None => edits.push((path, vec![(search, replace)])),
        }
        pos = end;
    }
    edits
}

/// `apply_code_change`: applies each edit to `"\n" + content`, replacing every occurrence.
pub fn apply_edits(context: &BTreeMap<String, String>, edits: &Edits) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for (path, pairs) in edits {
        let mut content = newline_then(context.get(*path).map_or("", |s| s.as_str()));
        for (search, replace) in pairs {
            if search == replace {
                return Err("Search and replace blocks are identical".to_string());
            }
            let search = newline_then(search);
            let replace = newline_then(replace);
            content = replace_all(&content, &search, &replace)
                .ok_or_else(|| format!("Search block not found in the code: {search}"))?;
        }
        out.insert(path.to_string(), content[1..].to_string());
    }
    Ok(out)
}

/// `"\n" + s`.
fn newline_then(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 1);
    out.push('\n');
    out.push_str(s);
    out
}

/// Python's `str.replace(needle, with)` (every non-overlapping occurrence, left to right), or
/// `None` when `needle` does not occur (the reference checks `in` first).
fn replace_all(haystack: &str, needle: &str, with: &str) -> Option<String> {
    let finder = memchr::memmem::Finder::new(needle.as_bytes());
    let mut hits = finder.find_iter(haystack.as_bytes()).peekable();
    hits.peek()?;
    let mut out = String::with_capacity(haystack.len() + with.len());
    let mut last = 0;
    for at in hits {
        out.push_str(&haystack[last..at]);
        out.push_str(with);
        last = at + needle.len();
    }
    out.push_str(&haystack[last..]);
    Some(out)
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

    /// The scanner must return exactly what the reference regex finds, on texts built to
    /// stress it: overlapping fences, missing terminators, empty groups, nested markers.
    #[test]
    fn scanner_matches_the_reference_regex() {
        let re = regex::Regex::new(SEARCH_REPLACE_REGEX).unwrap();
        let pieces = [
            "```",
            "````",
            "```python",
            "\n",
            "### ",
            "a.py",
            "b/c.rs",
            "\n<<<<<<< SEARCH\n",
            "x = 1",
            "",
            "\n=======\n",
            "y",
            "\n>>>>>>> REPLACE\n```",
            "\n>>>>>>> REPLACE\n",
            " ",
            "=======",
            "é\r",
        ];
        let mut rng = swelake_core::rng::Rng::new(0x9e3779b97f4a7c15);
        let mut next = || rng.next_u64();
        let well_formed = "```python\n### a.py\n<<<<<<< SEARCH\nx = 1\n=======\ny\n>>>>>>> REPLACE\n```";
        for round in 0..20_000 {
            let mut text = String::new();
            let n = 1 + next() % 14;
            for _ in 0..n {
                if next().is_multiple_of(5) {
                    text.push_str(well_formed);
                } else {
                    text.push_str(pieces[(next() % pieces.len() as u64) as usize]);
                }
            }
            let want: Vec<(&str, &str, &str)> = re
                .captures_iter(&text)
                .map(|c| (c.get(1).unwrap().as_str(), c.get(2).unwrap().as_str(), c.get(3).unwrap().as_str()))
                .collect();
            let mut got = Vec::new();
            let mut pos = 0;
            while let Some(off) = text[pos..].find("```") {
                match block_at(&text, pos + off) {
                    Some((p, s, r, end)) => {
                        got.push((p, s, r));
                        pos = end;
                    }
                    None => pos = pos + off + 1,
                }
            }
            assert_eq!(got, want, "round {round}: {text:?}");
        }
    }

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
    fn replace_all_is_python_str_replace() {
        // 'aaaa'.replace('aa', 'b') == 'bb'; 'xaxa'.replace('xa', '') == ''
        assert_eq!(replace_all("aaaa", "aa", "b").as_deref(), Some("bb"));
        assert_eq!(replace_all("xaxa", "xa", "").as_deref(), Some(""));
        assert_eq!(replace_all("abc", "z", "y"), None);
        assert_eq!(replace_all("\nél\nél", "\nél", "\nel").as_deref(), Some("\nel\nel"));
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
