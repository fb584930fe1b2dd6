//! The seed's rows: `rl_seed` (verl's columns beside the instance's own) and the Parquet
//! shards trainers read, with the table's maps as lists of `{path, content}`.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Context, Result};
use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{DataType, SchemaRef};
use serde::Serialize;

use super::{Instance, DATA_SOURCE, RL_SEED, SEED_SHARDS};
use crate::lake::{rows, Lake};

/// The columns of `rl_seed` and of the shards (its schema file).
pub fn seed_schema() -> SchemaRef {
    crate::schema::builtin(RL_SEED)
}

/// A row of `rl_seed`: verl's columns (`data_source`, `prompt`, `ability`, `reward_model`,
/// `extra_info`) beside the instance's own.
#[derive(Serialize)]
struct SeedRow<'a> {
    instance_id: &'a str,
    repo_name: &'a str,
    split: &'a str,
    problem_statement: &'a str,
    context: &'a BTreeMap<String, String>,
    oracle: &'a BTreeMap<String, String>,
    oracle_patch: &'a str,
    data_source: &'static str,
    prompt: [Message<'a>; 2],
    ability: &'static str,
    reward_model: RewardModel,
    extra_info: ExtraInfo<'a>,
    problem_source: &'a str,
    prompt_context: &'a BTreeMap<String, String>,
    verified: bool,
    fail_to_pass: &'a [String],
    pass_to_pass: &'a [String],
    env_key: &'a str,
}

#[derive(Serialize)]
struct Message<'a> {
    role: &'static str,
    content: &'a str,
}

#[derive(Serialize)]
struct RewardModel {
    style: &'static str,
    ground_truth: String,
}

#[derive(Serialize)]
struct ExtraInfo<'a> {
    repo_name: &'a str,
    pr_number: i64,
    split: &'a str,
    base_sha: &'a str,
    merge_base: &'a str,
    head_sha: &'a str,
    merged_at: &'a str,
    language: &'a str,
    changed_files: &'a [String],
    relevant_files: &'a [String],
    issue_numbers: &'a [i64],
    prompt_tokens: usize,
    oracle_reward: f64,
}

/// The instances as one record batch of [`seed_schema`].
pub fn to_batch(instances: &[Instance]) -> Result<RecordBatch> {
    let rows: Vec<SeedRow> = instances
        .iter()
        .map(|i| SeedRow {
            instance_id: &i.instance_id,
            repo_name: &i.repo_name,
            split: &i.split,
            problem_statement: &i.problem_statement,
            context: &i.context,
            oracle: &i.oracle,
            oracle_patch: &i.oracle_patch,
            data_source: DATA_SOURCE,
            prompt: [Message { role: "system", content: &i.system }, Message { role: "user", content: &i.user }],
            ability: "software_engineering",
            reward_model: RewardModel {
                style: "rule",
                ground_truth: serde_json::json!({"kind": "search_replace", "context": i.context, "oracle": i.oracle})
                    .to_string(),
            },
            extra_info: ExtraInfo {
                repo_name: &i.repo_name,
                pr_number: i.pr_number,
                split: &i.split,
                base_sha: &i.base_sha,
                merge_base: &i.merge_base,
                head_sha: &i.head_sha,
                merged_at: &i.merged_at,
                language: &i.language,
                changed_files: &i.changed_files,
                relevant_files: &i.relevant_files,
                issue_numbers: &i.issue_numbers,
                prompt_tokens: i.prompt_tokens,
                oracle_reward: i.oracle_reward,
            },
            problem_source: &i.problem_source,
            prompt_context: &i.prompt_context,
            verified: i.verified,
            fail_to_pass: &i.fail_to_pass,
            pass_to_pass: &i.pass_to_pass,
            env_key: &i.env_key,
        })
        .collect();
    rows::to_batch(RL_SEED, &rows)
}

/// The columns of the seed shards (`schemas/seed_shards.toml`): `rl_seed`'s, with lists of
/// `{path, content}` where the table has maps.
pub fn shard_schema() -> SchemaRef {
    crate::schema::builtin(SEED_SHARDS)
}

/// The shards' form of an `rl_seed` batch: each map column becomes a list of `{path,
/// content}` structs over the same keys and values (no copy), in the map's (path) order.
/// Hugging Face `datasets` has no type for an Arrow map, so a map in a shard stops every
/// trainer that loads it through `datasets` (verl, TRL, OpenRLHF).
pub fn shard_batch(batch: &RecordBatch) -> Result<RecordBatch> {
    let schema = shard_schema();
    let columns = schema
        .fields()
        .iter()
        .map(|f| {
            let col = batch.column_by_name(f.name()).with_context(|| format!("rl_seed has no `{}`", f.name()))?;
            match (col.data_type(), f.data_type()) {
                (DataType::Map(..), DataType::List(item)) => {
                    let DataType::Struct(fields) = item.data_type() else {
                        anyhow::bail!("seed_shards.{} is not a list of structs", f.name())
                    };
                    let m = col.as_map();
                    let entries = arrow::array::StructArray::try_new(
                        fields.clone(),
                        vec![m.keys().clone(), m.values().clone()],
                        None,
                    )?;
                    let list = arrow::array::ListArray::try_new(
                        item.clone(),
                        m.offsets().clone(),
                        Arc::new(entries),
                        m.nulls().cloned(),
                    )?;
                    Ok(Arc::new(list) as ArrayRef)
                }
                _ => Ok(col.clone()),
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// Writes `batch` as Parquet shards of `rows_per_shard` rows, `part-00000.parquet`, … under
/// `shards/seed/` of the lake (its directory or its store), and removes older parts beyond the
/// new ones, so the shard set is always the last run's. Returns where each shard is.
pub async fn write_shards(lake: &Lake, batch: &RecordBatch, rows_per_shard: usize) -> Result<Vec<String>> {
    use object_store::ObjectStoreExt;
    let props = parquet::file::properties::WriterProperties::builder()
        .set_compression(parquet::basic::Compression::ZSTD(parquet::basic::ZstdLevel::try_new(3)?))
        .build();
    let per = rows_per_shard.max(1);
    let mut out = Vec::new();
    let mut start = 0;
    loop {
        let len = per.min(batch.num_rows() - start);
        let rel = format!("{SHARDS_DIR}/part-{:05}.parquet", out.len());
        let mut bytes = Vec::new();
        let mut w = parquet::arrow::ArrowWriter::try_new(&mut bytes, batch.schema(), Some(props.clone()))?;
        w.write(&batch.slice(start, len))?;
        w.close()?;
        // A single put replaces a shard whole: a reader sees the old file or the new one.
        let (store, path) = lake.object(&rel);
        store.put(&path, bytes.into()).await.with_context(|| format!("writing {rel}"))?;
        out.push(lake.display_of(&rel));
        start += len;
        if start >= batch.num_rows() {
            break;
        }
    }
    // Parts of an earlier, larger shard set.
    let (store, dir) = lake.object(SHARDS_DIR);
    let listed: Vec<object_store::ObjectMeta> = futures::TryStreamExt::try_collect(store.list(Some(&dir))).await?;
    for meta in listed {
        let name = meta.location.filename().unwrap_or_default().to_string();
        let n =
            name.strip_prefix("part-").and_then(|r| r.strip_suffix(".parquet")).and_then(|n| n.parse::<usize>().ok());
        if n.is_some_and(|n| n >= out.len()) {
            store.delete(&meta.location).await.with_context(|| format!("removing the stale shard {name}"))?;
        }
    }
    Ok(out)
}

/// Where the seed shards live, under the lake's root.
pub const SHARDS_DIR: &str = "shards/seed";
