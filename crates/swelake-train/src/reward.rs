//! The rewards training and evaluation give completions: the SWE-RL similarity, or a mode
//! that runs the instance's tests through a grader the caller brings (this crate does not know
//! the lake or the sandbox; `swelake` passes its grader in).

use std::collections::HashMap;

use swelake_reward::modes::{self, Mode, TestOutcome};
use swelake_reward::rollouts::GradeFn;

use super::data::SeedInstance;

/// A completion's score and what a rollout table keeps of it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scored {
    /// `None`: the completion cannot be scored (unknown instance, not graded).
    pub reward: Option<f64>,
    /// No patch could be read from it (for `similarity`: the reference's format error).
    pub malformed: bool,
    /// The reference's format error message.
    pub format_error: Option<String>,
    pub reward_similarity: Option<f64>,
    pub patch: Option<String>,
    /// The test grading, in the test modes.
    pub tests: Option<TestOutcome>,
    /// Why it could not be scored.
    pub error: Option<String>,
}

/// Scores completions of seed instances in one mode.
pub struct Rewarder<'a> {
    pub mode: Mode,
    pub seed: &'a HashMap<String, SeedInstance>,
    /// Runs patches against their instances' tests; required by `tests` and `hybrid`.
    pub grade: Option<&'a GradeFn<'a>>,
}

impl Rewarder<'_> {
    /// Scores (instance_id, completion) pairs; every patch of the batch goes to the grader in
    /// one call (it runs them N at once). Results in input order.
    pub fn score(&self, items: &[(String, String)]) -> Vec<Scored> {
        let mut out: Vec<Scored> = Vec::with_capacity(items.len());
        let mut answers = Vec::with_capacity(items.len());
        for (id, completion) in items {
            let Some(inst) = self.seed.get(id) else {
                answers.push(None);
                out.push(Scored { error: Some(format!("{id} is not a seed instance")), ..Default::default() });
                continue;
            };
            match modes::answer(&inst.context, &inst.oracle, completion) {
                Ok(a) => {
                    out.push(Scored {
                        malformed: if self.mode.runs_tests() { a.malformed() } else { a.format_error.is_some() },
                        format_error: a.format_error.clone(),
                        reward_similarity: Some(a.reward_similarity),
                        patch: a.patch.clone(),
                        ..Default::default()
                    });
                    answers.push(Some(a));
                }
                Err(e) => {
                    answers.push(None);
                    out.push(Scored { error: Some(e.to_string()), ..Default::default() });
                }
            }
        }
        if let (true, Some(grade)) = (self.mode.runs_tests(), self.grade) {
            let asked: Vec<(usize, (String, String))> = answers
                .iter()
                .enumerate()
                .filter_map(|(i, a)| Some((i, (items[i].0.clone(), a.as_ref()?.patch.clone()?))))
                .collect();
            let pairs: Vec<(String, String)> = asked.iter().map(|(_, p)| p.clone()).collect();
            let got = if pairs.is_empty() { Vec::new() } else { grade(&pairs) };
            for ((i, _), o) in asked.iter().zip(got) {
                out[*i].tests = Some(o);
            }
        }
        for (s, a) in out.iter_mut().zip(&answers) {
            let Some(a) = a else { continue };
            s.reward = a.reward(self.mode, s.tests.as_ref());
            if s.reward.is_none() {
                s.error = Some(
                    s.tests.as_ref().map_or_else(|| "no grader for the test modes".to_string(), |t| t.reason.clone()),
                );
            }
        }
        out
    }
}
