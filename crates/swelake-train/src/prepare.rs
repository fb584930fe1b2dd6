//! Turning rollout tables into training groups: which groups may be trained on (one instance,
//! the wanted split), decided from the projected id and reward columns before any completion
//! text is decoded; then the rows of those groups, with missing rewards scored from the seed
//! shards' context and oracle, tokenised with the policy's tokenizer.

use std::collections::{HashMap, HashSet};

use anyhow::{bail, Result};

use crate::data::{self, SeedInstance};
use crate::trainer::{groups_from_rollouts, Group};
use crate::Policy;

/// The groups of the rollouts matching `glob` to train on. `seed_shards` (the glob `seed` was
/// read from) gives splits, prompts and the context/oracle to score rows without a reward;
/// without it every row must carry its prompt and reward, and splits are not checked.
pub fn offline_groups(
    glob: &str,
    seed_shards: Option<&str>,
    seed: &HashMap<String, SeedInstance>,
    split: &str,
    policy: &Policy,
) -> Result<Vec<Group>> {
    let t0 = std::time::Instant::now();
    let stats = crate::group_stats::group_stats(glob, seed_shards)?;
    let t = crate::group_stats::totals(&stats);
    match seed_shards {
        Some(_) => eprintln!(
            "rollouts ⋈ seed: {} groups, {} rollouts ({} with a reward), {} rows of instances not in the seed, \
             {} groups mixing instances, {} groups already flat; groups per split {:?}",
            t.groups, t.rollouts, t.scored, t.unknown_rows, t.mixed_groups, t.zero_std_groups, t.per_split
        ),
        None => eprintln!(
            "rollouts: {} groups, {} rollouts ({} with a reward), {} groups mixing instances, {} groups already flat; \
             no seed shards given, so splits are not checked (every group counts as split {split:?})",
            t.groups, t.rollouts, t.scored, t.mixed_groups, t.zero_std_groups
        ),
    }
    let split_ok = |g: &crate::group_stats::GroupStat| {
        split.is_empty() || seed_shards.is_none() || g.split.as_deref() == Some(split)
    };
    let keep: HashSet<&str> =
        stats.iter().filter(|g| g.instances == 1 && split_ok(g)).map(|g| g.group_id.as_str()).collect();
    if keep.is_empty() {
        bail!("no groups of split {split:?} in {glob} (groups per split: {:?}; --split '' trains on all)", t.per_split);
    }
    let mut rows = data::read_rollouts(glob)?;
    rows.retain(|r| keep.contains(r.group_id.as_str()));
    if seed_shards.is_none() {
        let unscored = rows.iter().filter(|r| r.reward.is_none()).count();
        let no_prompt = rows.iter().filter(|r| r.prompt.is_none()).count();
        if unscored + no_prompt > 0 {
            bail!(
                "{glob}: {unscored} rollout(s) without a reward and {no_prompt} without a prompt; \
                 give the seed shards to score and prompt them"
            );
        }
    }
    let lookup: HashMap<String, (data::Files, data::Files)> =
        seed.iter().map(|(k, v)| (k.clone(), (v.context.clone(), v.oracle.clone()))).collect();
    let missing = rows.iter().filter(|r| r.reward.is_none()).count();
    let unscored = data::fill_rewards(&mut rows, &lookup);
    let prompts: HashMap<String, String> =
        seed.iter().map(|(k, v)| (k.clone(), policy.tokenizer.render_chat(&v.messages, true))).collect();
    let (groups, skipped) = groups_from_rollouts(&rows, policy, &prompts)?;
    eprintln!(
        "{} rollouts in {} groups read in {:.2}s; {missing} scored here, {unscored} could not be scored ({skipped} rows left out)",
        rows.len(),
        groups.len(),
        t0.elapsed().as_secs_f64()
    );
    if groups.is_empty() {
        bail!("no groups to train on in {glob}");
    }
    Ok(groups)
}
