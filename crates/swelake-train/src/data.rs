//! Reading seed shards and rollout tables, writing rollout tables (`schemas/rollouts.toml`).
//! Row group by row group, projecting only the needed columns.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Float32Builder, Float64Array, Int64Array, ListBuilder, RecordBatch,
    StringArray, UInt32Builder,
};
use arrow::datatypes::{DataType, Field, Schema};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::{ArrowWriter, ProjectionMask};

use super::tokenizer::Message;
use swelake_reward::columns::MapColumn;

pub type Files = BTreeMap<String, String>;

/// One seed instance, as a trainer needs it.
#[derive(Debug, Clone)]
pub struct SeedInstance {
    pub instance_id: String,
    pub repo_name: String,
    pub split: String,
    pub messages: Vec<Message>,
    pub context: Files,
    pub oracle: Files,
}

/// One row of a rollout table.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rollout {
    pub instance_id: String,
    pub group_id: String,
    pub sample_index: i64,
    pub prompt: Option<String>,
    pub completion: String,
    pub completion_ids: Option<Vec<u32>>,
    pub behavior_logprobs: Option<Vec<f32>>,
    pub reward: Option<f64>,
    pub format_error: Option<String>,
    /// Which mode chose `reward` (similarity, tests, hybrid).
    pub reward_mode: Option<String>,
    /// The SWE-RL reward, whatever the mode.
    pub reward_similarity: Option<f64>,
    /// The patch graded (test modes).
    pub predicted_patch: Option<String>,
    /// The test grading (test modes): resolved, FAIL_TO_PASS and PASS_TO_PASS passed of total.
    pub resolved: Option<bool>,
    pub f2p_passed: Option<i64>,
    pub f2p_total: Option<i64>,
    pub p2p_passed: Option<i64>,
    pub p2p_total: Option<i64>,
    pub grade_status: Option<String>,
    pub grade_reason: Option<String>,
}

impl Rollout {
    /// Whether the answer was malformed for the mode that rewarded it: no patch for the test
    /// modes (a diff answer is well-formed there), the reference's format error otherwise.
    pub fn malformed(&self) -> bool {
        match self.reward_mode.as_deref() {
            Some("tests" | "hybrid") => self.predicted_patch.is_none(),
            _ => self.format_error.is_some(),
        }
    }

    /// The columns of a score.
    pub fn set_score(&mut self, mode: &str, s: &super::reward::Scored) {
        self.reward = s.reward;
        self.format_error = s.format_error.clone();
        self.reward_mode = Some(mode.to_string());
        self.reward_similarity = s.reward_similarity;
        self.predicted_patch = s.patch.clone();
        if let Some(t) = s.tests.as_ref() {
            let graded = t.graded();
            self.resolved = graded.then_some(t.resolved);
            self.f2p_passed = graded.then_some(i64::from(t.f2p_passed));
            self.f2p_total = graded.then_some(i64::from(t.f2p_total));
            self.p2p_passed = graded.then_some(i64::from(t.p2p_passed));
            self.p2p_total = graded.then_some(i64::from(t.p2p_total));
            self.grade_status = Some(t.status.clone());
            self.grade_reason = Some(t.reason.clone());
        }
    }
}

pub fn expand_glob(glob: &str) -> Result<Vec<PathBuf>> {
    let mut paths: Vec<PathBuf> =
        glob::glob(glob).with_context(|| format!("invalid glob {glob:?}"))?.collect::<Result<_, _>>()?;
    paths.sort();
    if paths.is_empty() {
        bail!("no files match {glob:?}");
    }
    Ok(paths)
}

/// Batches of `path` restricted to the columns of `want` that exist.
pub(crate) fn read_columns(path: &Path, want: &[&str]) -> Result<Vec<RecordBatch>> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let builder =
        ParquetRecordBatchReaderBuilder::try_new(file).with_context(|| format!("reading {}", path.display()))?;
    let schema = builder.schema().clone();
    let roots: Vec<usize> = want.iter().filter_map(|w| schema.index_of(w).ok()).collect();
    let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
    let mut out = Vec::new();
    for b in builder.with_projection(mask).build()? {
        out.push(b.with_context(|| format!("reading {}", path.display()))?);
    }
    Ok(out)
}

pub(crate) fn string_col(b: &RecordBatch, name: &str) -> Result<Option<StringArray>> {
    match b.column_by_name(name) {
        None => Ok(None),
        Some(c) => Ok(Some(arrow::compute::cast(c, &DataType::Utf8)?.as_string::<i32>().clone())),
    }
}

fn opt_str(a: &Option<StringArray>, r: usize) -> Option<String> {
    a.as_ref().and_then(|a| (!a.is_null(r)).then(|| a.value(r).to_string()))
}

/// Seed instances from shards matching `glob`, optionally of one split.
pub fn read_seed(glob: &str, split: Option<&str>) -> Result<Vec<SeedInstance>> {
    read_seed_columns(glob, split, true)
}

/// instance_id → (context, oracle) of the seed shards matching `glob`: what scoring a rollout
/// needs (the shards may lack the prompt).
pub fn seed_lookup(glob: &str) -> Result<HashMap<String, (Files, Files)>> {
    Ok(read_seed_columns(glob, None, false)?.into_iter().map(|i| (i.instance_id, (i.context, i.oracle))).collect())
}

/// The one reader of seed shards; `with_prompt` requires the chat messages.
fn read_seed_columns(glob: &str, split: Option<&str>, with_prompt: bool) -> Result<Vec<SeedInstance>> {
    let mut out = Vec::new();
    let want: &[&str] = if with_prompt {
        &["instance_id", "repo_name", "split", "prompt", "context", "oracle"]
    } else {
        &["instance_id", "repo_name", "split", "context", "oracle"]
    };
    for path in expand_glob(glob)? {
        for b in read_columns(&path, want)? {
            for need in ["instance_id", "prompt", "context", "oracle"] {
                if b.column_by_name(need).is_none() && (with_prompt || need != "prompt") {
                    bail!("{}: seed shard without `{need}`", path.display());
                }
            }
            let ids = string_col(&b, "instance_id")?.expect("checked");
            let repos = string_col(&b, "repo_name")?;
            let splits = string_col(&b, "split")?;
            let ctx = MapColumn::new(b.column_by_name("context").expect("checked"))?;
            let ora = MapColumn::new(b.column_by_name("oracle").expect("checked"))?;
            let prompts =
                match b.column_by_name("prompt") {
                    Some(p) => Some(p.as_list_opt::<i32>().cloned().with_context(|| {
                        format!("{}: `prompt` must be a list of {{role, content}}", path.display())
                    })?),
                    None => None,
                };
            for r in 0..b.num_rows() {
                let s = opt_str(&splits, r).unwrap_or_default();
                if split.is_some_and(|want| want != s) {
                    continue;
                }
                let messages = match &prompts {
                    Some(prompts) => {
                        let msgs = prompts.value(r);
                        let msgs = msgs.as_struct_opt().context("`prompt` items must be structs")?;
                        let roles = arrow::compute::cast(
                            msgs.column_by_name("role").context("message without role")?,
                            &DataType::Utf8,
                        )?;
                        let contents = arrow::compute::cast(
                            msgs.column_by_name("content").context("message without content")?,
                            &DataType::Utf8,
                        )?;
                        let (roles, contents) = (roles.as_string::<i32>(), contents.as_string::<i32>());
                        (0..msgs.len()).map(|i| Message::new(roles.value(i), contents.value(i))).collect()
                    }
                    None => Vec::new(),
                };
                let id = ids.value(r).to_string();
                out.push(SeedInstance {
                    repo_name: opt_str(&repos, r).unwrap_or_else(|| id.split('#').next().unwrap_or("").to_string()),
                    instance_id: id,
                    split: s,
                    messages,
                    context: ctx.get(r).unwrap_or_default(),
                    oracle: ora.get(r).unwrap_or_default(),
                });
            }
        }
    }
    Ok(out)
}

fn list_u32(a: &ArrayRef, r: usize) -> Result<Option<Vec<u32>>> {
    let l = a.as_list_opt::<i32>().context("completion_ids must be a list of integers")?;
    if l.is_null(r) {
        return Ok(None);
    }
    let v = arrow::compute::cast(&l.value(r), &DataType::UInt32)?;
    Ok(Some(v.as_primitive::<arrow::datatypes::UInt32Type>().values().to_vec()))
}

fn list_f32(a: &ArrayRef, r: usize) -> Result<Option<Vec<f32>>> {
    let l = a.as_list_opt::<i32>().context("behavior_logprobs must be a list of floats")?;
    if l.is_null(r) {
        return Ok(None);
    }
    let v = arrow::compute::cast(&l.value(r), &DataType::Float32)?;
    Ok(Some(v.as_primitive::<arrow::datatypes::Float32Type>().values().to_vec()))
}

/// Rollouts from files matching `glob`.
pub fn read_rollouts(glob: &str) -> Result<Vec<Rollout>> {
    let want = [
        "instance_id",
        "group_id",
        "sample_index",
        "prompt",
        "completion",
        "completion_ids",
        "behavior_logprobs",
        "reward",
        "format_error",
        "resolved",
        "reward_mode",
        "predicted_patch",
    ];
    let mut out = Vec::new();
    for path in expand_glob(glob)? {
        for b in read_columns(&path, &want)? {
            for need in ["instance_id", "group_id", "completion"] {
                if b.column_by_name(need).is_none() {
                    bail!("{}: rollouts need a `{need}` column (see schemas/rollouts.toml)", path.display());
                }
            }
            let ids = string_col(&b, "instance_id")?.expect("checked");
            let groups = string_col(&b, "group_id")?.expect("checked");
            let completions = string_col(&b, "completion")?.expect("checked");
            let prompts = string_col(&b, "prompt")?;
            let errors = string_col(&b, "format_error")?;
            let idx =
                b.column_by_name("sample_index").map(|c| arrow::compute::cast(c, &DataType::Int64)).transpose()?;
            let rewards =
                b.column_by_name("reward").map(|c| arrow::compute::cast(c, &DataType::Float64)).transpose()?;
            let resolved = b.column_by_name("resolved").and_then(|c| c.as_boolean_opt());
            let modes = string_col(&b, "reward_mode")?;
            let patches = string_col(&b, "predicted_patch")?;
            for r in 0..b.num_rows() {
                if ids.is_null(r) || groups.is_null(r) || completions.is_null(r) {
                    bail!("{}: row {r} has a NULL instance_id, group_id or completion", path.display());
                }
                out.push(Rollout {
                    instance_id: ids.value(r).to_string(),
                    group_id: groups.value(r).to_string(),
                    sample_index: idx
                        .as_ref()
                        .map(|a| a.as_primitive::<arrow::datatypes::Int64Type>())
                        .filter(|a| !a.is_null(r))
                        .map_or(r as i64, |a| a.value(r)),
                    prompt: opt_str(&prompts, r),
                    completion: completions.value(r).to_string(),
                    completion_ids: b.column_by_name("completion_ids").map(|c| list_u32(c, r)).transpose()?.flatten(),
                    behavior_logprobs: b
                        .column_by_name("behavior_logprobs")
                        .map(|c| list_f32(c, r))
                        .transpose()?
                        .flatten(),
                    reward: rewards
                        .as_ref()
                        .map(|a| a.as_primitive::<arrow::datatypes::Float64Type>())
                        .filter(|a| !a.is_null(r))
                        .map(|a| a.value(r)),
                    format_error: opt_str(&errors, r),
                    resolved: resolved.filter(|a| !a.is_null(r)).map(|a| a.value(r)),
                    reward_mode: opt_str(&modes, r),
                    predicted_patch: opt_str(&patches, r),
                    ..Default::default()
                });
            }
        }
    }
    Ok(out)
}

/// The Arrow schema of the rollouts swelake writes.
pub fn rollout_schema() -> Arc<Schema> {
    let list = |n: &str, t: DataType| Field::new(n, DataType::List(Arc::new(Field::new("item", t, true))), true);
    Arc::new(Schema::new(vec![
        Field::new("instance_id", DataType::Utf8, false),
        Field::new("group_id", DataType::Utf8, false),
        Field::new("sample_index", DataType::Int64, true),
        Field::new("prompt", DataType::Utf8, true),
        Field::new("completion", DataType::Utf8, false),
        list("completion_ids", DataType::UInt32),
        list("behavior_logprobs", DataType::Float32),
        Field::new("reward", DataType::Float64, true),
        Field::new("format_error", DataType::Utf8, true),
        Field::new("reward_mode", DataType::Utf8, true),
        Field::new("reward_similarity", DataType::Float64, true),
        Field::new("predicted_patch", DataType::Utf8, true),
        Field::new("resolved", DataType::Boolean, true),
        Field::new("f2p_passed", DataType::Int64, true),
        Field::new("f2p_total", DataType::Int64, true),
        Field::new("p2p_passed", DataType::Int64, true),
        Field::new("p2p_total", DataType::Int64, true),
        Field::new("grade_status", DataType::Utf8, true),
        Field::new("grade_reason", DataType::Utf8, true),
    ]))
}

/// Writes rollouts as a Parquet file with the columns of `schemas/rollouts.toml`. The columns are
/// built here rather than through swelake's `lake::rows::to_batch`: this crate does not depend on
/// the swelake crate (the lake, its schema files), and other engines write the same file.
pub fn write_rollouts(path: &Path, rows: &[Rollout]) -> Result<()> {
    let s =
        |f: &dyn Fn(&Rollout) -> Option<&str>| -> ArrayRef { Arc::new(rows.iter().map(f).collect::<StringArray>()) };
    let mut ids = ListBuilder::new(UInt32Builder::new());
    let mut lps = ListBuilder::new(Float32Builder::new());
    for r in rows {
        match &r.completion_ids {
            Some(v) => {
                ids.values().append_slice(v);
                ids.append(true);
            }
            None => ids.append(false),
        }
        match &r.behavior_logprobs {
            Some(v) => {
                lps.values().append_slice(v);
                lps.append(true);
            }
            None => lps.append(false),
        }
    }
    let batch = RecordBatch::try_new(
        rollout_schema(),
        vec![
            s(&|r| Some(r.instance_id.as_str())),
            s(&|r| Some(r.group_id.as_str())),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.sample_index))),
            s(&|r| r.prompt.as_deref()),
            s(&|r| Some(r.completion.as_str())),
            Arc::new(ids.finish()),
            Arc::new(lps.finish()),
            Arc::new(rows.iter().map(|r| r.reward).collect::<Float64Array>()),
            s(&|r| r.format_error.as_deref()),
            s(&|r| r.reward_mode.as_deref()),
            Arc::new(rows.iter().map(|r| r.reward_similarity).collect::<Float64Array>()),
            s(&|r| r.predicted_patch.as_deref()),
            Arc::new(rows.iter().map(|r| r.resolved).collect::<BooleanArray>()),
            Arc::new(rows.iter().map(|r| r.f2p_passed).collect::<Int64Array>()),
            Arc::new(rows.iter().map(|r| r.f2p_total).collect::<Int64Array>()),
            Arc::new(rows.iter().map(|r| r.p2p_passed).collect::<Int64Array>()),
            Arc::new(rows.iter().map(|r| r.p2p_total).collect::<Int64Array>()),
            s(&|r| r.grade_status.as_deref()),
            s(&|r| r.grade_reason.as_deref()),
        ],
    )?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("parquet.tmp");
    let mut w = ArrowWriter::try_new(File::create(&tmp)?, batch.schema(), None)?;
    w.write(&batch)?;
    w.close()?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// Rewards of rollouts that have none, with the reward module: the SEARCH/REPLACE reward against
/// the instance's context and oracle. Returns how many could not be scored (unknown instance, or
/// the reference's no-change case); those keep `reward: None` and are left out of training.
pub fn fill_rewards(rows: &mut [Rollout], seed: &HashMap<String, (Files, Files)>) -> usize {
    let mut unscored = 0;
    for r in rows.iter_mut().filter(|r| r.reward.is_none()) {
        let Some((context, oracle)) = seed.get(&r.instance_id) else {
            unscored += 1;
            continue;
        };
        match swelake_reward::search_replace_reward(context, oracle, &r.completion) {
            Ok(rw) => {
                r.reward = Some(rw.reward);
                r.format_error = rw.format_error.clone();
            }
            Err(_) => unscored += 1,
        }
    }
    unscored
}
