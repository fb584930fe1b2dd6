//! Held-out evaluation, the paper's repair-with-oracle-files measure: for each test instance,
//! sample answers, score them with the SWE-RL reward, and report per repository the share of
//! well-formed answers, the mean reward and the exact-match rate (reward 1.0). The same report
//! is made for rollouts produced by any other engine. Given a grader, each answer's patch also
//! runs against its instance's tests, and the report has the resolved rate beside.

use std::collections::{BTreeMap, HashMap};

use anyhow::Result;

use swelake_reward::modes::Mode;
use swelake_reward::rollouts::GradeFn;

use super::data::{Rollout, SeedInstance};
use super::generate::{sample_group, Rng, Sampling};
use super::reward::Rewarder;
use super::Policy;

#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Stats {
    pub instances: usize,
    pub samples: usize,
    /// Samples the reward could not score (unknown instance, or the reference's no-change case).
    pub unscored: usize,
    pub well_formed_rate: f64,
    pub mean_reward: f64,
    pub exact_match_rate: f64,
    /// Samples whose patch ran against the tests (0 without a grader).
    pub graded: usize,
    /// Share of the samples that resolved their instance (every FAIL_TO_PASS and PASS_TO_PASS
    /// test passes); `None` without a grader.
    pub resolved_rate: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Report {
    pub overall: Stats,
    pub per_repository: BTreeMap<String, Stats>,
}

/// One scored answer.
#[derive(Debug, Clone)]
pub struct Scored {
    pub instance_id: String,
    pub repo_name: String,
    pub reward: Option<f64>,
    pub well_formed: bool,
    /// `None`: not graded by running tests.
    pub resolved: Option<bool>,
}

fn summarise<'a>(rows: impl Iterator<Item = &'a Scored>) -> Stats {
    let rows: Vec<&Scored> = rows.collect();
    let scored: Vec<f64> = rows.iter().filter_map(|r| r.reward).collect();
    let n = rows.len().max(1) as f64;
    let mut ids: Vec<&str> = rows.iter().map(|r| r.instance_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    Stats {
        instances: ids.len(),
        samples: rows.len(),
        unscored: rows.len() - scored.len(),
        well_formed_rate: rows.iter().filter(|r| r.well_formed).count() as f64 / n,
        // Unscored answers count as −1, as a malformed one would.
        mean_reward: (scored.iter().sum::<f64>() - (rows.len() - scored.len()) as f64) / n,
        exact_match_rate: scored.iter().filter(|&&r| r == 1.0).count() as f64 / n,
        graded: rows.iter().filter(|r| r.resolved.is_some()).count(),
        resolved_rate: None,
    }
}

pub fn report(rows: &[Scored], tested: bool) -> Report {
    let mut repos: BTreeMap<String, Vec<&Scored>> = BTreeMap::new();
    for r in rows {
        repos.entry(r.repo_name.clone()).or_default().push(r);
    }
    let with_rate = |rows: Vec<&Scored>| {
        let mut st = summarise(rows.iter().copied());
        if tested {
            st.resolved_rate =
                Some(rows.iter().filter(|r| r.resolved == Some(true)).count() as f64 / rows.len().max(1) as f64);
        }
        st
    };
    Report {
        overall: with_rate(rows.iter().collect()),
        per_repository: repos.into_iter().map(|(k, v)| (k, with_rate(v))).collect(),
    }
}

/// An answer's SWE-RL reward, whether it is well-formed, whether it resolved (with a grader)
/// and its patch.
type AnswerScore = (Option<f64>, bool, Option<bool>, Option<String>);

/// Scores answers: the SWE-RL similarity, and with a grader the tests.
fn score_all(
    items: &[(String, String)],
    seed: &HashMap<String, SeedInstance>,
    grade: Option<&GradeFn<'_>>,
) -> Vec<AnswerScore> {
    let mode = if grade.is_some() { Mode::Tests } else { Mode::Similarity };
    let rewarder = Rewarder { mode, seed, grade };
    rewarder
        .score(items)
        .into_iter()
        .map(|s| {
            let well_formed = s.format_error.is_none();
            let resolved = s.tests.as_ref().filter(|t| t.graded()).map(|t| t.resolved);
            (s.reward_similarity, well_formed, resolved, s.patch)
        })
        .collect()
}

/// Generates `samples` answers per instance with `policy` and scores them (all answers are
/// graded together at the end, N at once, when a grader is given).
pub fn evaluate_policy(
    policy: &Policy,
    instances: &[SeedInstance],
    samples: usize,
    sampling: &Sampling,
    seed: u64,
    grade: Option<&GradeFn<'_>>,
    progress: &dyn Fn(usize, usize),
) -> Result<(Report, Vec<Rollout>)> {
    let mut rng = Rng::new(seed);
    let tok = &policy.tokenizer;
    let mut rows = Vec::new();
    for (i, inst) in instances.iter().enumerate() {
        let text = tok.render_chat(&inst.messages, true);
        let prompt = tok.encode(&text)?;
        let out = sample_group(&policy.model, &prompt, samples, tok.eos_id(), sampling, &mut rng)?;
        for (k, s) in out.into_iter().enumerate() {
            let completion = tok.decode(&s.ids)?;
            rows.push(Rollout {
                instance_id: inst.instance_id.clone(),
                group_id: format!("{}@eval", inst.instance_id),
                sample_index: k as i64,
                prompt: Some(text.clone()),
                completion,
                completion_ids: Some(s.ids),
                behavior_logprobs: Some(s.logprobs),
                ..Default::default()
            });
        }
        progress(i + 1, instances.len());
    }
    let by: HashMap<String, SeedInstance> = instances.iter().map(|i| (i.instance_id.clone(), i.clone())).collect();
    let items: Vec<(String, String)> = rows.iter().map(|r| (r.instance_id.clone(), r.completion.clone())).collect();
    let mut scored = Vec::new();
    for (r, (reward, well_formed, resolved, patch)) in rows.iter_mut().zip(score_all(&items, &by, grade)) {
        r.reward = reward;
        r.format_error = (!well_formed).then(|| "malformed".to_string());
        r.resolved = resolved;
        r.predicted_patch = patch;
        let repo_name = by.get(&r.instance_id).map(|i| i.repo_name.clone()).unwrap_or_default();
        scored.push(Scored { instance_id: r.instance_id.clone(), repo_name, reward, well_formed, resolved });
    }
    Ok((report(&scored, grade.is_some()), rows))
}

/// Scores rollouts from another engine against the seed instances (by instance_id).
/// Rollouts of instances not in `seed` are unscored.
pub fn evaluate_rollouts(
    rows: &[Rollout],
    seed: &HashMap<String, &SeedInstance>,
    grade: Option<&GradeFn<'_>>,
) -> Report {
    let owned: HashMap<String, SeedInstance> = seed.iter().map(|(k, v)| (k.clone(), (*v).clone())).collect();
    let items: Vec<(String, String)> = rows.iter().map(|r| (r.instance_id.clone(), r.completion.clone())).collect();
    let scored: Vec<Scored> = rows
        .iter()
        .zip(score_all(&items, &owned, grade))
        .map(|(r, (reward, well_formed, resolved, _))| {
            let inst = seed.get(&r.instance_id);
            let well_formed =
                if inst.is_some() { well_formed } else { swelake_reward::extract_answer(&r.completion).is_ok() };
            Scored {
                instance_id: r.instance_id.clone(),
                repo_name: inst
                    .map_or_else(|| r.instance_id.split('#').next().unwrap_or("").to_string(), |i| i.repo_name.clone()),
                reward,
                well_formed,
                resolved,
            }
        })
        .collect();
    report(&scored, grade.is_some())
}

/// A plain-text table of a report.
pub fn render_table(r: &Report) -> String {
    let tested = r.overall.resolved_rate.is_some();
    let mut s = format!(
        "{:<40} {:>9} {:>7} {:>11} {:>11} {:>11}{}\n",
        "repository",
        "instances",
        "samples",
        "well-formed",
        "mean reward",
        "exact match",
        if tested { "    resolved" } else { "" }
    );
    let mut line = |name: &str, st: &Stats| {
        s.push_str(&format!(
            "{:<40} {:>9} {:>7} {:>10.1}% {:>11.4} {:>10.1}%{}\n",
            name,
            st.instances,
            st.samples,
            st.well_formed_rate * 100.0,
            st.mean_reward,
            st.exact_match_rate * 100.0,
            st.resolved_rate.map_or(String::new(), |x| format!(" {:>10.1}%", x * 100.0))
        ));
    };
    for (k, v) in &r.per_repository {
        line(k, v);
    }
    line("(all)", &r.overall);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_counts_per_repository() {
        let row = |id: &str, repo: &str, reward: Option<f64>, wf: bool| Scored {
            instance_id: id.into(),
            repo_name: repo.into(),
            reward,
            well_formed: wf,
            resolved: None,
        };
        let rows = vec![
            row("a/x#1", "a/x", Some(1.0), true),
            row("a/x#1", "a/x", Some(-1.0), false),
            row("a/x#2", "a/x", Some(0.5), true),
            row("b/y#1", "b/y", None, true),
        ];
        let r = report(&rows, false);
        let ax = &r.per_repository["a/x"];
        assert_eq!((ax.instances, ax.samples, ax.unscored), (2, 3, 0));
        assert!((ax.mean_reward - 0.5 / 3.0).abs() < 1e-12);
        assert!((ax.well_formed_rate - 2.0 / 3.0).abs() < 1e-12);
        assert!((ax.exact_match_rate - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(r.per_repository["b/y"].mean_reward, -1.0);
        assert_eq!(r.overall.samples, 4);
        assert!(render_table(&r).contains("(all)"));
    }
}
