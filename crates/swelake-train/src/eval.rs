//! Held-out evaluation, the paper's repair-with-oracle-files measure: for each test instance,
//! sample answers, score them with the SWE-RL reward, and report per repository the share of
//! well-formed answers, the mean reward and the exact-match rate (reward 1.0). The same report
//! is made for rollouts produced by any other engine.

use std::collections::{BTreeMap, HashMap};

use anyhow::Result;

use super::data::{Files, Rollout, SeedInstance};
use super::generate::{sample_group, Rng, Sampling};
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
    }
}

pub fn report(rows: &[Scored]) -> Report {
    let mut repos: BTreeMap<String, Vec<&Scored>> = BTreeMap::new();
    for r in rows {
        repos.entry(r.repo_name.clone()).or_default().push(r);
    }
    Report {
        overall: summarise(rows.iter()),
        per_repository: repos.into_iter().map(|(k, v)| (k, summarise(v.into_iter()))).collect(),
    }
}

fn score(context: &Files, oracle: &Files, completion: &str) -> (Option<f64>, bool) {
    match swelake_reward::search_replace_reward(context, oracle, completion) {
        Ok(r) => (Some(r.reward), r.format_error.is_none()),
        Err(_) => (None, true),
    }
}

/// Generates `samples` answers per instance with `policy` and scores them.
pub fn evaluate_policy(
    policy: &Policy,
    instances: &[SeedInstance],
    samples: usize,
    sampling: &Sampling,
    seed: u64,
    progress: &dyn Fn(usize, usize),
) -> Result<(Report, Vec<Rollout>)> {
    let mut rng = Rng::new(seed);
    let tok = &policy.tokenizer;
    let mut scored = Vec::new();
    let mut rows = Vec::new();
    for (i, inst) in instances.iter().enumerate() {
        let text = tok.render_chat(&inst.messages, true);
        let prompt = tok.encode(&text)?;
        let out = sample_group(&policy.model, &prompt, samples, tok.eos_id(), sampling, &mut rng)?;
        for (k, s) in out.into_iter().enumerate() {
            let completion = tok.decode(&s.ids)?;
            let (reward, well_formed) = score(&inst.context, &inst.oracle, &completion);
            scored.push(Scored {
                instance_id: inst.instance_id.clone(),
                repo_name: inst.repo_name.clone(),
                reward,
                well_formed,
            });
            rows.push(Rollout {
                instance_id: inst.instance_id.clone(),
                group_id: format!("{}@eval", inst.instance_id),
                sample_index: k as i64,
                prompt: Some(text.clone()),
                completion,
                completion_ids: Some(s.ids),
                behavior_logprobs: Some(s.logprobs),
                reward,
                format_error: (!well_formed).then(|| "malformed".to_string()),
            });
        }
        progress(i + 1, instances.len());
    }
    Ok((report(&scored), rows))
}

/// Scores rollouts from another engine against the seed instances (by instance_id).
/// Rollouts of instances not in `seed` are unscored.
pub fn evaluate_rollouts(rows: &[Rollout], seed: &HashMap<String, &SeedInstance>) -> Report {
    let scored: Vec<Scored> = rows
        .iter()
        .map(|r| {
            let inst = seed.get(&r.instance_id);
            let (reward, well_formed) = match inst {
                Some(i) => score(&i.context, &i.oracle, &r.completion),
                None => (None, swelake_reward::extract_answer(&r.completion).is_ok()),
            };
            Scored {
                instance_id: r.instance_id.clone(),
                repo_name: inst
                    .map_or_else(|| r.instance_id.split('#').next().unwrap_or("").to_string(), |i| i.repo_name.clone()),
                reward,
                well_formed,
            }
        })
        .collect();
    report(&scored)
}

/// A plain-text table of a report.
pub fn render_table(r: &Report) -> String {
    let mut s = format!(
        "{:<40} {:>9} {:>7} {:>11} {:>11} {:>11}\n",
        "repository", "instances", "samples", "well-formed", "mean reward", "exact match"
    );
    let mut line = |name: &str, st: &Stats| {
        s.push_str(&format!(
            "{:<40} {:>9} {:>7} {:>10.1}% {:>11.4} {:>10.1}%\n",
            name,
            st.instances,
            st.samples,
            st.well_formed_rate * 100.0,
            st.mean_reward,
            st.exact_match_rate * 100.0
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
        };
        let rows = vec![
            row("a/x#1", "a/x", Some(1.0), true),
            row("a/x#1", "a/x", Some(-1.0), false),
            row("a/x#2", "a/x", Some(0.5), true),
            row("b/y#1", "b/y", None, true),
        ];
        let r = report(&rows);
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
