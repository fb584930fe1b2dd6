//! The reference's entry points with the metadata they return beside the reward, for callers
//! that switch from `swerl.core.reward` (the Python package) and read it: each changed file's
//! predicted and oracle change (the per-file unified diffs that were compared), the thought
//! and the answer of a search/replace output, or the format error.
//!
//! The scores are those of [`crate::search_replace_reward`] and [`crate::unidiff_reward`];
//! these functions keep the compared texts, which the plain ones drop to stay lean in bulk
//! scoring. Two choices follow the reference's current version (swe-rl `12f8d90`) where the
//! plain functions follow its first one: when neither side changes any file the reward is
//! 1.0 with no similarities (the first version failed an `assert` there, which
//! [`crate::RewardError::NoChanges`] reports).

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::{apply_edits, extract_thought_answer, normalized_patches, parse_search_replace, ratio, unidiff};

/// The reference's `ChangeSimilarity`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChangeSimilarity {
    pub path: String,
    pub pred_change: String,
    pub oracle_change: String,
    pub similarity: f64,
}

/// A reward and the reference's metadata dict.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Detailed {
    pub reward: f64,
    /// One entry per path of either side, sorted by path (the reference iterates a `set`,
    /// whose order changes with Python's hash seed). Empty on a format error.
    pub similarities: Vec<ChangeSimilarity>,
    /// The stripped thought and answer of a well-formed search/replace output.
    pub thought: Option<String>,
    pub answer: Option<String>,
    /// The `FormatError` message when the output is malformed (reward −1).
    pub error: Option<String>,
}

impl Detailed {
    fn format_error(msg: String) -> Self {
        Detailed { reward: -1.0, similarities: Vec::new(), thought: None, answer: None, error: Some(msg) }
    }
}

/// `compute_change_similarities` and the mean, keeping the compared changes.
fn scored(mut pred: BTreeMap<String, String>, mut oracle: BTreeMap<String, String>) -> (f64, Vec<ChangeSimilarity>) {
    let paths: BTreeSet<String> = pred.keys().chain(oracle.keys()).cloned().collect();
    let similarities: Vec<ChangeSimilarity> = paths
        .into_iter()
        .map(|path| {
            let pred_change = pred.remove(&path).unwrap_or_default();
            let oracle_change = oracle.remove(&path).unwrap_or_default();
            let similarity = if pred_change.is_empty() || oracle_change.is_empty() {
                0.0
            } else {
                ratio(&pred_change, &oracle_change)
            };
            ChangeSimilarity { path, pred_change, oracle_change, similarity }
        })
        .collect();
    if similarities.is_empty() {
        return (1.0, similarities);
    }
    // Summed in path order, as crate::mean does, so both report the same value.
    let reward = similarities.iter().map(|s| s.similarity).sum::<f64>() / similarities.len() as f64;
    (reward, similarities)
}

/// The reference's `calculate_reward(code_context, oracle_new_content, pred_new_content)`.
pub fn reward(
    context: &BTreeMap<String, String>,
    oracle_new: &BTreeMap<String, String>,
    pred_new: &BTreeMap<String, String>,
) -> Detailed {
    let (oracle, pred) = normalized_patches(context, oracle_new, pred_new);
    let (reward, similarities) = scored(pred, oracle);
    Detailed { reward, similarities, thought: None, answer: None, error: None }
}

/// The reference's `calculate_search_replace_reward(code_context, oracle_new_content, output)`.
pub fn search_replace_reward(
    context: &BTreeMap<String, String>,
    oracle_new: &BTreeMap<String, String>,
    output: &str,
) -> Detailed {
    let (thought, answer) = match extract_thought_answer(output) {
        Ok(x) => x,
        Err(e) => return Detailed::format_error(e),
    };
    let edits = parse_search_replace(answer);
    if edits.is_empty() {
        return Detailed::format_error("No valid search blocks found".to_string());
    }
    match apply_edits(context, &edits) {
        Ok(pred) => Detailed {
            thought: Some(thought.to_string()),
            answer: Some(answer.to_string()),
            ..reward(context, oracle_new, &pred)
        },
        Err(e) => Detailed::format_error(e),
    }
}

/// The reference's `calculate_reward_unidiff(oracle_patches, pred_patches)`.
pub fn unidiff_reward(oracle_patches: &[String], pred_patches: &[String]) -> Detailed {
    let mut oracle = BTreeMap::new();
    let mut pred = BTreeMap::new();
    for p in oracle_patches {
        oracle.extend(unidiff::filelevel_diff(p));
    }
    for p in pred_patches {
        pred.extend(unidiff::filelevel_diff(p));
    }
    let (reward, similarities) = scored(pred, oracle);
    Detailed { reward, similarities, thought: None, answer: None, error: None }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn same_rewards_as_the_plain_functions_with_the_compared_changes() {
        let ctx = map(&[("a.py", "x = 1\ny = 2\n"), ("b.py", "z = 3\n")]);
        let oracle = map(&[("a.py", "x = 1\ny = 20\n"), ("b.py", "z = 30\n")]);
        let out = "<think>\n fix \n</think>\n<solution>\n```python\n### a.py\n<<<<<<< SEARCH\ny = 2\n=======\ny = 20\n>>>>>>> REPLACE\n```\n</solution>";
        let d = search_replace_reward(&ctx, &oracle, out);
        let plain = crate::search_replace_reward(&ctx, &oracle, out).unwrap();
        assert_eq!(d.reward, plain.reward);
        assert_eq!(d.reward, 0.5);
        assert_eq!((d.thought.as_deref(), d.error.as_deref()), (Some("fix"), None));
        assert!(d.answer.unwrap().starts_with("```python\n### a.py"));
        let a = &d.similarities[0];
        assert_eq!((a.path.as_str(), a.similarity), ("a.py", 1.0));
        assert_eq!(a.pred_change, a.oracle_change);
        assert_eq!(a.pred_change, "@@ -1,2 +1,2 @@\n x = 1\n-y = 2\n+y = 20");
        let b = &d.similarities[1];
        assert_eq!((b.pred_change.as_str(), b.similarity), ("", 0.0));
    }

    #[test]
    fn format_errors_and_no_changes() {
        let ctx = map(&[("a.py", "x\n")]);
        let d = search_replace_reward(&ctx, &ctx, "no tags");
        assert_eq!((d.reward, d.error.as_deref()), (-1.0, Some("count of <think> is not 1")));
        // Neither side changes a file: 1.0, as the reference's current version returns.
        let d = reward(&ctx, &ctx, &ctx);
        assert_eq!((d.reward, d.similarities.len()), (1.0, 0));
        let d = unidiff_reward(&[], &[]);
        assert_eq!((d.reward, d.similarities.len()), (1.0, 0));
    }
}
