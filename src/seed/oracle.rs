//! The oracle change written as an answer in the SWE-RL format, used to check every seed
//! instance: applied with the reward's own SEARCH/REPLACE semantics it must score 1.0.
//!
//! Each changed file is one edit whose SEARCH is the whole original file and whose REPLACE
//! is the whole new file (an empty SEARCH creates a file, an empty REPLACE empties one), which
//! is exact as long as the file has no line `=======` (a SEARCH block would end there).

use std::collections::BTreeMap;

/// An answer `<think>…</think><solution>…</solution>` that turns `context` into `oracle`.
pub fn oracle_answer(context: &BTreeMap<String, String>, oracle: &BTreeMap<String, String>) -> String {
    let mut blocks = Vec::new();
    for (path, new) in oracle {
        let old = context.get(path).map_or("", |s| s.as_str());
        if old == new {
            continue;
        }
        blocks.push(format!("```\n### {path}\n<<<<<<< SEARCH\n{old}\n=======\n{new}\n>>>>>>> REPLACE\n```"));
    }
    format!(
        "<think>\nApply the change of the merged pull request.\n</think>\n<solution>\n{}\n</solution>",
        blocks.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oracle_answer_scores_one() {
        let map =
            |p: &[(&str, &str)]| p.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>();
        let context = map(&[("a.py", "def f():\n    return 1\n"), ("gone.py", "x = 1\n"), ("shown.py", "y = 2\n")]);
        let oracle = map(&[("a.py", "def f():\n    return 2\n"), ("gone.py", ""), ("new.py", "z = 3\n")]);
        let answer = oracle_answer(&context, &oracle);
        let r = crate::reward::search_replace_reward(&context, &oracle, &answer).unwrap();
        assert_eq!(r.reward, 1.0, "{answer}\n{r:?}");
        assert_eq!(r.similarities.len(), 3);
    }
}
