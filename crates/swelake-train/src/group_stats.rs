//! Rollout group statistics: the rollout ⋈ seed join and per-group reward statistics as a
//! polars lazy Parquet scan.
//!
//! Only `instance_id`, `group_id` and `reward` of the rollouts and `instance_id`, `split` of the
//! seed shards are read (projection pushdown), so a trainer can look over millions of rollouts —
//! which groups are usable, which instances are unknown, which groups have no reward spread —
//! before it decodes any completion text.

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use polars::prelude::{
    col, len, lit, DataType, Float64Chunked, JoinArgs, JoinType, LazyFrame, PlRefPath, ScanArgsParquet,
    SortMultipleOptions, StringChunked, UInt32Chunked, NULL,
};
use serde::Serialize;

use super::data::expand_glob;

/// Statistics of one GRPO group, joined with its seed instance.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupStat {
    pub group_id: String,
    /// The group's instance (the least id when a malformed group mixes several).
    pub instance_id: String,
    pub instances: u32,
    pub rollouts: u32,
    /// Rows whose instance is not in the seed shards.
    pub unknown: u32,
    /// Rows that already carry a reward.
    pub scored: u32,
    /// Split of the instance (the least split when a malformed group mixes several).
    pub split: Option<String>,
    pub reward_mean: Option<f64>,
    pub reward_std: Option<f64>,
    pub reward_min: Option<f64>,
    pub reward_max: Option<f64>,
}

impl GroupStat {
    /// All rewards known and equal: no advantage signal, GRPO drops the group.
    pub fn zero_std(&self) -> bool {
        self.scored == self.rollouts && self.reward_min == self.reward_max
    }
}

/// Totals over all groups.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RolloutStats {
    pub groups: usize,
    pub rollouts: usize,
    pub scored: usize,
    pub unknown_rows: usize,
    pub mixed_groups: usize,
    pub zero_std_groups: usize,
    pub per_split: BTreeMap<String, usize>,
}

fn scan(glob: &str) -> Result<LazyFrame> {
    // Expanded here too, so an empty glob gets the same message as everywhere else.
    expand_glob(glob)?;
    LazyFrame::scan_parquet(PlRefPath::new(glob), ScanArgsParquet::default())
        .with_context(|| format!("scanning {glob}"))
}

fn has_column(lf: &mut LazyFrame, name: &str) -> Result<bool> {
    Ok(lf.collect_schema()?.contains(name))
}

/// The lazy plan: rollouts left-joined to the seed by instance id (when there is one),
/// aggregated per group.
pub fn group_stats_plan(rollouts_glob: &str, seed_glob: Option<&str>) -> Result<LazyFrame> {
    let mut r = scan(rollouts_glob)?;
    for need in ["instance_id", "group_id"] {
        if !has_column(&mut r, need)? {
            bail!("{rollouts_glob}: rollouts need a `{need}` column (see schemas/rollouts.toml)");
        }
    }
    let reward = if has_column(&mut r, "reward")? {
        col("reward").cast(DataType::Float64)
    } else {
        lit(NULL).cast(DataType::Float64)
    };
    let r = r.select([
        col("instance_id").cast(DataType::String),
        col("group_id").cast(DataType::String),
        reward.alias("reward"),
    ]);
    let j = match seed_glob {
        Some(seed_glob) => {
            let mut s = scan(seed_glob)?;
            if !has_column(&mut s, "instance_id")? {
                bail!("{seed_glob}: seed shards without `instance_id`");
            }
            let split = if has_column(&mut s, "split")? {
                col("split").cast(DataType::String)
            } else {
                lit(NULL).cast(DataType::String)
            };
            let s =
                s.select([col("instance_id").cast(DataType::String), split.alias("split"), lit(true).alias("known")]);
            r.join(s, [col("instance_id")], [col("instance_id")], JoinArgs::new(JoinType::Left))
        }
        // Without a seed nothing is known about splits, and no instance counts as unknown.
        None => r.with_columns([lit(NULL).cast(DataType::String).alias("split"), lit(true).alias("known")]),
    };
    Ok(j.group_by([col("group_id")])
        .agg([
            col("instance_id").min().alias("instance_id"),
            col("instance_id").n_unique().cast(DataType::UInt32).alias("instances"),
            len().cast(DataType::UInt32).alias("rollouts"),
            col("known").is_null().sum().cast(DataType::UInt32).alias("unknown"),
            col("reward").count().cast(DataType::UInt32).alias("scored"),
            col("split").min().alias("split"),
            col("reward").mean().alias("reward_mean"),
            col("reward").std(1).alias("reward_std"),
            col("reward").min().alias("reward_min"),
            col("reward").max().alias("reward_max"),
        ])
        .sort(["group_id"], SortMultipleOptions::default()))
}

/// Per-group statistics of the rollouts matching `rollouts_glob` against the seed shards.
pub fn group_stats(rollouts_glob: &str, seed_glob: Option<&str>) -> Result<Vec<GroupStat>> {
    let df = group_stats_plan(rollouts_glob, seed_glob)?.collect().context("running the rollout ⋈ seed plan")?;
    let s = |n: &str| -> Result<StringChunked> { Ok(df.column(n)?.str()?.clone()) };
    let u = |n: &str| -> Result<UInt32Chunked> { Ok(df.column(n)?.u32()?.clone()) };
    let f = |n: &str| -> Result<Float64Chunked> { Ok(df.column(n)?.cast(&DataType::Float64)?.f64()?.clone()) };
    let (gid, iid, split) = (s("group_id")?, s("instance_id")?, s("split")?);
    let (instances, rollouts, unknown, scored) = (u("instances")?, u("rollouts")?, u("unknown")?, u("scored")?);
    let (mean, std, min, max) = (f("reward_mean")?, f("reward_std")?, f("reward_min")?, f("reward_max")?);
    let mut out = Vec::with_capacity(df.height());
    for i in 0..df.height() {
        out.push(GroupStat {
            group_id: gid.get(i).context("NULL group_id in rollouts")?.to_string(),
            instance_id: iid.get(i).context("NULL instance_id in rollouts")?.to_string(),
            instances: instances.get(i).unwrap_or(0),
            rollouts: rollouts.get(i).unwrap_or(0),
            unknown: unknown.get(i).unwrap_or(0),
            scored: scored.get(i).unwrap_or(0),
            split: split.get(i).map(str::to_string),
            reward_mean: mean.get(i),
            reward_std: std.get(i),
            reward_min: min.get(i),
            reward_max: max.get(i),
        });
    }
    Ok(out)
}

pub fn totals(groups: &[GroupStat]) -> RolloutStats {
    let mut t = RolloutStats { groups: groups.len(), ..Default::default() };
    for g in groups {
        t.rollouts += g.rollouts as usize;
        t.scored += g.scored as usize;
        t.unknown_rows += g.unknown as usize;
        t.mixed_groups += usize::from(g.instances > 1);
        t.zero_std_groups += usize::from(g.zero_std());
        *t.per_split.entry(g.split.clone().unwrap_or_else(|| "(unknown)".into())).or_default() += 1;
    }
    t
}

/// The same statistics with the `parquet` crate's reader and a hash join: the baseline that
/// `swelake bench rollouts` measures the polars plan against, and a cross-check in tests.
pub fn group_stats_arrow(rollouts_glob: &str, seed_glob: &str) -> Result<Vec<GroupStat>> {
    use super::data::{read_columns, string_col};
    use arrow::array::{Array, AsArray};
    use std::collections::HashMap;

    let mut split_of: HashMap<String, Option<String>> = HashMap::new();
    for path in expand_glob(seed_glob)? {
        for b in read_columns(&path, &["instance_id", "split"])? {
            let ids = string_col(&b, "instance_id")?
                .with_context(|| format!("{}: seed shard without `instance_id`", path.display()))?;
            let splits = string_col(&b, "split")?;
            for r in 0..b.num_rows() {
                let sp = splits.as_ref().and_then(|a| (!a.is_null(r)).then(|| a.value(r).to_string()));
                split_of.entry(ids.value(r).to_string()).or_insert(sp);
            }
        }
    }
    struct Acc {
        ids: std::collections::BTreeSet<String>,
        n: u32,
        unknown: u32,
        splits: std::collections::BTreeSet<String>,
        rewards: Vec<f64>,
    }
    let mut groups: BTreeMap<String, Acc> = BTreeMap::new();
    for path in expand_glob(rollouts_glob)? {
        for b in read_columns(&path, &["instance_id", "group_id", "reward"])? {
            let (Some(ids), Some(gids)) = (string_col(&b, "instance_id")?, string_col(&b, "group_id")?) else {
                bail!("{}: rollouts need `instance_id` and `group_id` columns", path.display());
            };
            let rewards = b
                .column_by_name("reward")
                .map(|c| arrow::compute::cast(c, &arrow::datatypes::DataType::Float64))
                .transpose()?;
            let rewards = rewards.as_ref().map(|a| a.as_primitive::<arrow::datatypes::Float64Type>());
            for r in 0..b.num_rows() {
                if gids.is_null(r) || ids.is_null(r) {
                    bail!("{}: row {r} has a NULL instance_id or group_id", path.display());
                }
                let id = ids.value(r);
                let seed = split_of.get(id);
                let acc = groups.entry(gids.value(r).to_string()).or_insert_with(|| Acc {
                    ids: Default::default(),
                    n: 0,
                    unknown: 0,
                    splits: Default::default(),
                    rewards: Vec::new(),
                });
                acc.ids.insert(id.to_string());
                if let Some(Some(sp)) = seed {
                    acc.splits.insert(sp.clone());
                }
                acc.n += 1;
                acc.unknown += u32::from(seed.is_none());
                if let Some(v) = rewards.filter(|a| !a.is_null(r)).map(|a| a.value(r)) {
                    acc.rewards.push(v);
                }
            }
        }
    }
    Ok(groups
        .into_iter()
        .map(|(group_id, a)| {
            let k = a.rewards.len();
            let mean = (k > 0).then(|| a.rewards.iter().sum::<f64>() / k as f64);
            let std = mean
                .filter(|_| k > 1)
                .map(|m| (a.rewards.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / (k - 1) as f64).sqrt());
            GroupStat {
                group_id,
                instance_id: a.ids.first().cloned().unwrap_or_default(),
                instances: a.ids.len() as u32,
                rollouts: a.n,
                unknown: a.unknown,
                scored: k as u32,
                split: a.splits.first().cloned(),
                reward_mean: mean,
                reward_std: std,
                reward_min: a.rewards.iter().copied().reduce(f64::min),
                reward_max: a.rewards.iter().copied().reduce(f64::max),
            }
        })
        .collect())
}
